//! `secure-boot`: with UEFI Secure Boot on, a RHEL 10 kernel is signed with keys an old shim
//! does not trust, so the bootloader must be updated before a move to another RHEL major.
//!
//! streamd does that itself before it finalizes (`crate::host::bootloader`). The
//! machine-config daemon does it from 4.22 on, before every rebase on Secure Boot
//! x86_64/aarch64 nodes (openshift/machine-config-operator:pkg/daemon/bootupd.go
//! `runBootloaderUpdate`, called first in pkg/daemon/update.go `updateLayeredOS`, on
//! `release-4.22` and `release-4.23`; on RHEL >= 9.6 it starts bootupd's
//! `bootloader-update.service`, the booted image's update). 4.21's does no bootloader update at
//! all (no pkg/daemon/bootupd.go on `release-4.21`): its move is only safe when that unit already
//! ran this boot, which leaves the bootloader where 4.22's daemon would put it.

use super::{CheckResult, Input, Mover, fail, pass, target_major};
use crate::cluster::protocol::CheckId;
use crate::host::facts::mco_release::{McoRelease, ReleaseOf};

/// The check.
pub(super) fn secure_boot(i: &Input) -> CheckResult {
    let id = CheckId::SecureBoot;
    if !matches!(i.arch.as_str(), "x86_64" | "aarch64") {
        return pass(
            id,
            format!("no Secure Boot bootloader update on {}", i.arch),
        );
    }
    let on = match i.secure_boot {
        Some(false) => return pass(id, "Secure Boot is off"),
        Some(true) => "Secure Boot is on",
        // As the machine-config daemon's `isSecureBootEnabled` (mokutil failing) fails open.
        None => "the Secure Boot state cannot be read (taken as on)",
    };
    let target = target_major(&i.desired, &i.os_image);
    if matches!((i.booted_major, target), (Some(b), Some(t)) if b == t) {
        return pass(id, format!("{on}; the move stays on RHEL {}", t_or(target)));
    }
    let ran = match i.bootloader_updated {
        Some(true) => "bootloader-update.service ran this boot",
        Some(false) => "bootloader-update.service has not run this boot",
        None => "whether bootloader-update.service ran this boot is not known",
    };
    let release = match (&i.mover, &i.machine_config) {
        (Mover::Streamd, _) => {
            return pass(
                id,
                format!("{on}; {ran}; streamd updates the bootloader before it reboots"),
            );
        }
        (Mover::MachineConfigOperator, Some(Ok(mc))) => mc.release.clone(),
        (Mover::MachineConfigOperator, _) => ReleaseOf::from_annotation(None),
    };
    if release.release != McoRelease::V4_21 || i.bootloader_updated == Some(true) {
        let who = if release.release == McoRelease::V4_21 {
            "the bootloader is this boot's"
        } else {
            "the machine-config daemon updates the bootloader before the rebase"
        };
        return pass(id, format!("{on}; {ran}; {who} ({})", release.by()));
    }
    fail(
        id,
        format!(
            "{on} and {ran}, and the machine-config daemon does no bootloader update before the rebase ({}): the old shim may not trust the RHEL {} kernel's signing keys; run `systemctl start bootloader-update.service` first (RHEL 9.6 and later)",
            release.by(),
            t_or(target)
        ),
    )
}

/// The target major for a message.
fn t_or(target: Option<u32>) -> String {
    target.map_or_else(|| "target".to_string(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::host::facts::mco_release::McoRelease;

    /// The machine-config operator's move, by a MachineConfig `release` rendered.
    fn on_mcd(c: &mut Input, release: McoRelease) {
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied(&format!(
            r#"{{"metadata":{{"name":"rendered-worker-1","annotations":{{"machineconfiguration.openshift.io/release-image-version":"{}.0"}}}},"spec":{{}}}}"#,
            release.as_str()
        ));
    }

    /// Release × Secure Boot × bootloader update this boot → outcome, for a move to rhel-10.
    #[test]
    fn the_bootloader_update_by_release() {
        use McoRelease::{V4_21, V4_22, V4_23};
        for (mover, sb, updated, pass_, says) in [
            (
                None,
                Some(true),
                Some(false),
                true,
                "streamd updates the bootloader",
            ),
            (
                Some(V4_21),
                Some(false),
                Some(false),
                true,
                "Secure Boot is off",
            ),
            (
                Some(V4_21),
                Some(true),
                Some(false),
                false,
                "does no bootloader update",
            ),
            (
                Some(V4_21),
                None,
                None,
                false,
                "cannot be read (taken as on)",
            ),
            (
                Some(V4_21),
                Some(true),
                Some(true),
                true,
                "the bootloader is this boot's",
            ),
            (
                Some(V4_22),
                Some(true),
                Some(false),
                true,
                "updates the bootloader before",
            ),
            (
                Some(V4_23),
                Some(true),
                None,
                true,
                "updates the bootloader before",
            ),
        ] {
            let mut c = base();
            c.secure_boot = sb;
            c.bootloader_updated = updated;
            if let Some(r) = mover {
                on_mcd(&mut c, r);
            }
            let r = secure_boot(&c);
            assert_eq!(
                r.result == Outcome::Pass,
                pass_,
                "{mover:?} {sb:?} {updated:?}: {}",
                r.message
            );
            assert!(r.message.contains(says), "{}", r.message);
        }
        // Another architecture or the same major: nothing to update for.
        let mut c = base();
        c.secure_boot = Some(true);
        on_mcd(&mut c, V4_21);
        c.arch = "s390x".into();
        assert_eq!(secure_boot(&c).result, Outcome::Pass);
        let mut c = base();
        c.secure_boot = Some(true);
        on_mcd(&mut c, V4_21);
        c.booted_major = Some(10);
        assert_eq!(secure_boot(&c).result, Outcome::Pass);
    }
}
