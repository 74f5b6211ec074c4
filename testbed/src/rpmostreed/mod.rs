//! Fake `rpm-ostreed`: `org.projectatomic.rpmostree1` on a private bus.
