//! libostree's runtime record of the staged deployment, under the testbed host root:
//! `run/ostree/staged-deployment` and the legacy `run/ostree/staged-deployment-locked`.
//!
//! On a real host libostree writes `/run/ostree/staged-deployment` when it stages
//! (ostreedev/ostree:src/libostree/ostree-sysroot-deploy.c
//! `ostree_sysroot_stage_tree_with_options`): an `a{sv}` GVariant with `target` (`name`,
//! `osname`, `bootcsum`), for a locked stage `locked: true`, and what rpm-ostree passes:
//! `merge-deployment` (as `target`), `kargs` (`as`) and an empty `overlay-initrds` (`as`). Since rpm-ostree v2024.6
//! (coreos/rpm-ostree commit 37c7228d, "daemon: use new finalization APIs") that key is the only
//! record of the lock: no `staged-deployment-locked` file is created, and rpm-ostreed's
//! `Deployments` (rust/src/daemon.rs `deployment_populate_variant`) reports
//! `finalization-locked` only when that legacy file exists. Older rpm-ostree touched the
//! legacy file before staging (and libostree wrote no key); the `legacy-lock-file` knob
//! selects that behaviour. The fake's own truth stays in `state.json`; this module writes
//! what a real host shows from it. Over real libostree (`super::realstage`) libostree writes
//! the record and this module's [`write`] is not used.
//!
//! The legacy file is also a lock of its own, whoever creates it: libostree skips finalization
//! while it exists (`_ostree_sysroot_finalize_impl_staged_deployment`, "Not finalizing;
//! deployment is locked for finalization"), so it is part of the host's truth and only these
//! events touch it, as in libostree: staging over a previous staged deployment unlinks it
//! (`ostree_sysroot_stage_tree_with_options`, "If we have a previous one, clean it up", xref
//! ostreedev/ostree#3025), a first stage leaves it alone; `ostree_sysroot_change_finalization`
//! creates it when it locks and unlinks it when it unlocks; removing the staged deployment
//! (`ostree_sysroot_write_deployments`, cleanup or the finalization at shutdown) unlinks it; and
//! a reboot empties `/run` ([`boot`]). What happened is told from the record the previous
//! write left, which is where libostree itself reads its previous staged deployment from.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ostree::glib::{self, prelude::ToVariant};

use super::model::{Deployment, State};

/// `/run/ostree/staged-deployment`, relative to the host root.
const STAGED: &str = "run/ostree/staged-deployment";
/// `/run/ostree/staged-deployment-locked`, relative to the host root.
const STAGED_LOCKED: &str = "run/ostree/staged-deployment-locked";

fn path(root: &Path, rel: &str) -> PathBuf {
    root.join(rel)
}

/// [`legacy_lock_exists_at`] for a fake that may have no host root.
pub(crate) fn legacy_lock_exists(root: Option<&Path>) -> bool {
    root.is_some_and(legacy_lock_exists_at)
}

/// Whether the legacy lock file exists: the only thing rpm-ostreed's `Deployments` looks at, and
/// one of the two locks libostree's finalization honours.
pub(crate) fn legacy_lock_exists_at(root: &Path) -> bool {
    path(root, STAGED_LOCKED).exists()
}

/// What a reboot does to `/run/ostree` (a tmpfs): the legacy file goes, whoever made it (the
/// record follows the state the reboot saves).
pub(crate) fn boot(root: &Path) -> anyhow::Result<()> {
    remove(&path(root, STAGED_LOCKED))
}

/// libostree's `serialize_deployment_to_variant`: `name` (`<checksum>.<serial>`), `osname` and
/// `bootcsum`.
fn deployment_variant(d: &Deployment) -> glib::Variant {
    let bootcsum = d
        .disk
        .as_ref()
        .map(|d| d.bootcsum().to_string())
        .unwrap_or_default();
    let v = glib::VariantDict::new(None);
    v.insert_value("name", &format!("{}.{}", d.checksum, d.serial).to_variant());
    v.insert_value("osname", &d.osname.to_variant());
    v.insert_value("bootcsum", &bootcsum.to_variant());
    v.end()
}

/// Writes the runtime record of `state`'s staged deployment (or removes it when none is
/// staged), the way current rpm-ostree leaves it, or with `legacy` the way rpm-ostree before
/// v2024.6 did; the legacy file changes only as libostree changes it (see the module comment).
pub(crate) fn write(root: &Path, state: &State, legacy: bool) -> anyhow::Result<()> {
    let staged_path = path(root, STAGED);
    let lock_path = path(root, STAGED_LOCKED);
    // An unreadable record (a test may put anything there) is as good as none.
    let run_ostree = staged_path.parent().unwrap_or(root);
    let before = super::libostree::read_record(run_ostree)
        .ok()
        .flatten()
        .map(|r| (format!("{}.{}", r.name.checksum, r.name.serial), r.locked));
    let Some(staged) = state.deployments.iter().find(|d| d.staged) else {
        // Cleaned up, or finalized by a reboot: libostree unlinks both. Never staged: the
        // legacy file (made by someone about to stage) stays.
        remove(&staged_path)?;
        return match before {
            Some(_) => remove(&lock_path),
            None => Ok(()),
        };
    };
    let name = format!("{}.{}", staged.checksum, staged.serial);
    // Serialized by GLib, as libostree does (`g_variant_get_data`): zvariant's GVariant
    // encoder frames some containers wrongly (an `as` of RHCOS's kernel arguments whose
    // dictionary entry comes to about 255 bytes is read back by GLib as `'': <()>`), while
    // its decoder, which streamd uses, reads GLib's bytes of every size.
    let record = glib::VariantDict::new(None);
    record.insert_value("target", &deployment_variant(staged));
    // `ostree_sysroot_change_finalization` rewrites the record with the key flipped, so an
    // unlocked stage that was locked keeps `locked: false` (seen on real libostree 2025.2);
    // a stage never locked has no key.
    let had_key = matches!(&before, Some((prev, Some(_))) if *prev == name);
    if !legacy && (staged.finalization_locked || had_key) {
        record.insert_value("locked", &staged.finalization_locked.to_variant());
    }
    // What rpm-ostree passes besides the lock (coreos/rpm-ostree v2025.5
    // src/daemon/rpmostree-sysroot-upgrader.cxx `rpmostree_sysroot_upgrader_deploy`): the
    // merge deployment, the kernel arguments (the merge deployment's `options` unless the
    // transaction changed them: the staged entry's), and `overlay_initrds`, a non-NULL vector
    // that is empty without `initramfs-etc` files, so libostree writes the key as `[]`.
    if let Some(merge) = state.deployments.iter().find(|d| d.booted) {
        record.insert_value("merge-deployment", &deployment_variant(merge));
    }
    let kargs: Vec<&str> = staged
        .disk
        .as_ref()
        .map(|d| d.options.split_whitespace().collect())
        .unwrap_or_default();
    record.insert_value("kargs", &kargs.to_variant());
    record.insert_value("overlay-initrds", &Vec::<&str>::new().to_variant());
    let record = record.end();
    std::fs::create_dir_all(run_ostree)
        .with_context(|| format!("creating {}", run_ostree.display()))?;
    let tmp = run_ostree.join(".staged-deployment.tmp");
    std::fs::write(&tmp, record.data()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &staged_path)
        .with_context(|| format!("renaming to {}", staged_path.display()))?;
    let create = || {
        std::fs::write(&lock_path, b"").with_context(|| format!("writing {}", lock_path.display()))
    };
    if legacy {
        // Older rpm-ostree: the file is the lock, touched before staging, gone when unlocked.
        return if staged.finalization_locked {
            create()
        } else {
            remove(&lock_path)
        };
    }
    match before {
        // A first stage leaves the file alone.
        None => Ok(()),
        // Staged over a previous one: libostree unlinks it (ostreedev/ostree#3025).
        Some((prev, _)) if prev != name => remove(&lock_path),
        // `ostree_sysroot_change_finalization`.
        Some((_, was)) if was.unwrap_or(false) != staged.finalization_locked => {
            if staged.finalization_locked {
                create()
            } else {
                remove(&lock_path)
            }
        }
        Some(_) => Ok(()),
    }
}

fn remove(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}
