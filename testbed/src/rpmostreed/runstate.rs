//! libostree's runtime record of the staged deployment, under the testbed host root:
//! `run/ostree/staged-deployment` and the legacy `run/ostree/staged-deployment-locked`.
//!
//! On a real host libostree writes `/run/ostree/staged-deployment` when it stages
//! (ostreedev/ostree:src/libostree/ostree-sysroot-deploy.c
//! `ostree_sysroot_stage_tree_with_options`): an `a{sv}` GVariant with `target` (`name`,
//! `osname`, `bootcsum`) and, for a locked stage, `locked: true`. Since rpm-ostree v2024.6
//! (coreos/rpm-ostree commit 37c7228d, "daemon: use new finalization APIs") that key is the only
//! record of the lock: no `staged-deployment-locked` file is created, and rpm-ostreed's
//! `Deployments` (rust/src/daemon.rs `deployment_populate_variant`) reports
//! `finalization-locked` only when that legacy file exists. Older rpm-ostree touched the
//! legacy file before staging (and libostree wrote no key); the `legacy-lock-file` knob
//! selects that behaviour. The fake's own truth stays in `state.json`; this module writes
//! what a real host shows from it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use zvariant::Value;
use zvariant::serialized::{Context as Encoding, Format};

use super::model::State;

/// `/run/ostree/staged-deployment`, relative to the host root.
const STAGED: &str = "run/ostree/staged-deployment";
/// `/run/ostree/staged-deployment-locked`, relative to the host root.
const STAGED_LOCKED: &str = "run/ostree/staged-deployment-locked";

fn path(root: &Path, rel: &str) -> PathBuf {
    root.join(rel)
}

/// Whether the legacy lock file exists: the only thing rpm-ostreed's `Deployments` looks at.
pub(crate) fn legacy_lock_exists(root: Option<&Path>) -> bool {
    root.is_some_and(|r| path(r, STAGED_LOCKED).exists())
}

/// Writes the runtime record of `state`'s staged deployment (or removes it when none is
/// staged), the way current rpm-ostree leaves it, or with `legacy` the way rpm-ostree before
/// v2024.6 did.
pub(crate) fn write(root: &Path, state: &State, legacy: bool) -> anyhow::Result<()> {
    let staged_path = path(root, STAGED);
    let lock_path = path(root, STAGED_LOCKED);
    let Some(staged) = state.deployments.iter().find(|d| d.staged) else {
        // Cleaned up, finalized by a reboot, or never staged: libostree unlinks both.
        remove(&staged_path)?;
        return remove(&lock_path);
    };
    let mut target: HashMap<&str, Value<'_>> = HashMap::new();
    let name = format!("{}.{}", staged.checksum, staged.serial);
    let bootcsum = staged
        .disk
        .as_ref()
        .map(|d| d.bootcsum().to_string())
        .unwrap_or_default();
    target.insert("name", Value::from(name.as_str()));
    target.insert("osname", Value::from(staged.osname.as_str()));
    target.insert("bootcsum", Value::from(bootcsum.as_str()));
    let mut record: HashMap<&str, Value<'_>> = HashMap::new();
    record.insert("target", Value::from(target));
    if staged.finalization_locked && !legacy {
        record.insert("locked", Value::from(true));
    }
    // zvariant's GVariant format (its successor crate is `zgvariant`); libostree writes the
    // bytes in the host's order.
    let ctxt = Encoding::new(Format::GVariant, zvariant::NATIVE_ENDIAN, 0);
    let bytes =
        zvariant::to_bytes(ctxt, &record).context("serializing the staged-deployment record")?;
    let dir = staged_path.parent().unwrap_or(root);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(".staged-deployment.tmp");
    std::fs::write(&tmp, bytes.bytes()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &staged_path)
        .with_context(|| format!("renaming to {}", staged_path.display()))?;
    if staged.finalization_locked && legacy {
        std::fs::write(&lock_path, b"").with_context(|| format!("writing {}", lock_path.display()))
    } else {
        // An unlocked stage and `ostree_sysroot_change_finalization` (unlock) remove it.
        remove(&lock_path)
    }
}

fn remove(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}
