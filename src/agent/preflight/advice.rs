//! What to do about a failed check, in the terms of the platform the node is on: where the
//! machine-config operator renders the node's files (its daemon manages the node), the remedy
//! is the cluster object it renders them from; elsewhere, the file itself.

use super::Mover;

/// A failure whose remedy depends on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Situation {
    /// The registry (or mirror) the OS daemon pulls from wants a credential it lacks.
    PullUnauthorized,
    /// registries.conf blocks the registry.
    PullBlocked,
    /// A deployment someone else staged or left pending.
    ForeignStaged,
    /// The sysroot has too little free space.
    SysrootFull,
    /// `/boot` has too little free space.
    BootFull,
    /// The move goes to an older major.
    Downgrade,
}

/// The remedy for `s` when `mover` makes the move (the machine-config operator's move is
/// checked only on a node its daemon manages).
pub(super) fn remedy(s: Situation, mover: Mover) -> &'static str {
    let mco = mover == Mover::MachineConfigOperator;
    match (s, mco) {
        (Situation::PullUnauthorized, true) => {
            "the machine-config daemon writes the node's pull secret from the cluster's global pull secret: add a credential for that registry to it (secret pull-secret in openshift-config); do not edit the node's auth file"
        }
        (Situation::PullUnauthorized, false) => {
            "give the node a credential for the registry or mirror it pulls from in /etc/ostree/auth.json (or /run/ostree/auth.json); streamd does not write it"
        }
        (Situation::PullBlocked, true) => {
            "registries.conf is rendered by the machine-config operator: allow the registry in image.config.openshift.io/cluster or mirror the image with an ImageDigestMirrorSet; do not edit the file"
        }
        (Situation::PullBlocked, false) => {
            "mirror the image or unblock the registry in /etc/containers/registries.conf(.d)"
        }
        (Situation::ForeignStaged, true) => {
            "streamd could not match it to the image of the MachineConfig the machine-config daemon recorded, as the daemon's own update in progress would be; the daemon deletes any other stage (rpm-ostree cleanup -p) before it applies the move: find who staged it"
        }
        (Situation::ForeignStaged, false) => {
            "remove it (rpm-ostree cleanup -p) or set replace-foreign-staged = true to let streamd replace it"
        }
        (Situation::SysrootFull, _) => {
            "free space in /sysroot: rpm-ostree cleanup -r removes the rollback deployment, and unused container images can be pruned (crictl rmi --prune)"
        }
        (Situation::Downgrade, true) => {
            "the machine-config operator makes this move and streamd's config does not govern it: leave the pool's spec.osImageStream.name on its current stream"
        }
        (Situation::Downgrade, false) => "set allow-downgrade = true in the config to force it",
        (Situation::BootFull, _) => {
            "free space in /boot: rpm-ostree cleanup -r removes the rollback deployment's kernel and initramfs"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (situation, mover, a phrase the remedy must have, a phrase it must not have)
    const ROWS: [(Situation, Mover, &str, &str); 10] = [
        (
            Situation::PullUnauthorized,
            Mover::MachineConfigOperator,
            "global pull secret",
            "in /etc/ostree/auth.json",
        ),
        (
            Situation::PullUnauthorized,
            Mover::Streamd,
            "/etc/ostree/auth.json",
            "global pull secret",
        ),
        (
            Situation::PullBlocked,
            Mover::MachineConfigOperator,
            "ImageDigestMirrorSet",
            "in /etc/containers",
        ),
        (
            Situation::PullBlocked,
            Mover::Streamd,
            "/etc/containers/registries.conf",
            "image.config.openshift.io",
        ),
        (
            Situation::ForeignStaged,
            Mover::MachineConfigOperator,
            "deletes any other stage",
            "replace-foreign-staged",
        ),
        (
            Situation::ForeignStaged,
            Mover::Streamd,
            "cleanup -p",
            "deletes any other stage",
        ),
        (
            Situation::Downgrade,
            Mover::MachineConfigOperator,
            "spec.osImageStream.name",
            "allow-downgrade",
        ),
        (
            Situation::Downgrade,
            Mover::Streamd,
            "allow-downgrade = true",
            "osImageStream",
        ),
        (
            Situation::SysrootFull,
            Mover::Streamd,
            "cleanup -r",
            "auth.json",
        ),
        (
            Situation::BootFull,
            Mover::MachineConfigOperator,
            "cleanup -r",
            "auth.json",
        ),
    ];

    #[test]
    fn each_remedy_is_in_the_terms_of_the_platform() {
        for (s, mover, has, lacks) in ROWS {
            let r = remedy(s, mover);
            assert!(r.contains(has), "{s:?} {mover:?}: {r:?} lacks {has:?}");
            assert!(!r.contains(lacks), "{s:?} {mover:?}: {r:?} has {lacks:?}");
        }
    }
}
