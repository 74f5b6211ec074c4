//! The checks of the host around the OS: the update backend, the container runtime, disk
//! space, NIC names and a deployment someone else left pending.

use super::advice::{self, Situation};
use super::needs::carried;
use super::{CheckResult, Input, fail, pass, target_major, warn};
use crate::backend::BackendKind;
use crate::cluster::protocol::CheckId;

/// Whether `staged` is the machine-config daemon's own update in flight, for its move: the
/// daemon stages the rebase onto the new MachineConfig's `osImageURL` (or its package changes
/// on the booted image), then records that MachineConfig on disk before it reboots
/// (pkg/daemon/update.go `update`: `applyOSChanges`, then `storeCurrentConfigOnDisk`; on
/// 4.21, 4.22 and 4.23), so its stage is the image of the MachineConfig it recorded.
fn mcd_own(i: &Input, staged: &crate::backend::Deployment) -> bool {
    let Some(Ok(mc)) = &i.machine_config else {
        return false;
    };
    let url = mc.pins.os_image_url.as_str();
    // Its rebase from a registry (`RebaseLayered`) or from local storage
    // (`RebaseLayeredFromContainerStorage`): both name the image by its pullspec.
    let image = staged.pullspec();
    i.mover == super::Mover::MachineConfigOperator
        && staged.staged
        && !url.is_empty()
        && image == Some(url)
}

pub(super) fn pending_deployment(i: &Input) -> CheckResult {
    let id = CheckId::PendingDeployment;
    let Some(staged) = &i.foreign_staged else {
        return pass(id, "nothing else is staged");
    };
    let what = staged.pullspec().map_or_else(
        || format!("deployment {}", staged.id),
        |p| format!("{p} ({})", staged.id),
    );
    if mcd_own(i, staged) {
        return pass(
            id,
            format!(
                "{what} is the machine-config daemon's own update (the image of the MachineConfig it recorded): it reboots into it, and removes any pending deployment (rpm-ostree cleanup -p) before it applies the next"
            ),
        );
    }
    // A pending deployment written at once (`ostree admin deploy`, a rollback) is not staged.
    let how = if staged.staged {
        "staged by someone else"
    } else {
        "pending for the next boot (deployed by someone else, not staged)"
    };
    if i.policy.replace_foreign_staged {
        warn(
            id,
            format!("{what} is {how} and will be replaced (replace-foreign-staged = true)"),
        )
    } else {
        fail(
            id,
            format!(
                "{what} is {how}; {}",
                advice::remedy(Situation::ForeignStaged, i.mover)
            ),
        )
    }
}

pub(super) fn backend(i: &Input) -> CheckResult {
    let id = CheckId::Backend;
    match i.backend {
        BackendKind::RpmOstree => pass(id, "rpm-ostree"),
        BackendKind::Bootc => match crate::backend::bootc::refusal(carried(i), &i.booted) {
            Some(reason) => fail(id, reason),
            None => pass(
                id,
                "bootc (a stage is held with upgrade --download-only from bootc 1.12 on, else staged only after the reboot is approved)",
            ),
        },
    }
}

pub(super) fn container_runtime(i: &Input) -> CheckResult {
    let id = CheckId::ContainerRuntime;
    match &i.crio_runtime {
        Err(e) => fail(id, format!("cannot read the CRI-O configuration: {e}")),
        Ok(r) if r == "runc" && target_major(&i.desired, &i.os_image).is_some_and(|m| m >= 10) => {
            fail(
                id,
                "CRI-O's default runtime is runc, which RHEL 10 does not ship: migrate to crun first",
            )
        }
        Ok(r) => pass(id, format!("CRI-O default runtime {r}")),
    }
}

pub(super) fn disk_space(i: &Input) -> CheckResult {
    let id = CheckId::DiskSpace;
    let image = i.os_image.as_ref().map(|o| o.size).unwrap_or(0);
    let need_sysroot = image.saturating_add(i.policy.min_free_sysroot);
    let mib = |b: u64| b >> 20;
    if i.disk.sysroot < need_sysroot {
        return fail(
            id,
            format!(
                "the sysroot has {} MiB free; staging needs {} MiB (image {} MiB + minimum {} MiB); {}",
                mib(i.disk.sysroot),
                mib(need_sysroot),
                mib(image),
                mib(i.policy.min_free_sysroot),
                advice::remedy(Situation::SysrootFull, i.mover)
            ),
        );
    }
    if i.disk.boot < i.policy.min_free_boot {
        return fail(
            id,
            format!(
                "/boot has {} MiB free; a new kernel and initramfs need {} MiB; {}",
                mib(i.disk.boot),
                mib(i.policy.min_free_boot),
                advice::remedy(Situation::BootFull, i.mover)
            ),
        );
    }
    pass(
        id,
        format!(
            "sysroot {} MiB free, /boot {} MiB free",
            mib(i.disk.sysroot),
            mib(i.disk.boot)
        ),
    )
}

pub(super) fn nic_names(i: &Input) -> CheckResult {
    let id = CheckId::NicNames;
    let crosses = matches!((i.booted_major, target_major(&i.desired, &i.os_image)), (Some(a), Some(b)) if a != b);
    if crosses && !i.nic_names_persisted {
        warn(
            id,
            "NIC names are not persisted and may change across the major; run nmstatectl persist-nic-names first",
        )
    } else {
        pass(id, "ok")
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::backend::{BackendKind, Deployment};
    use crate::cluster::protocol::CheckId;

    /// Each reason container-runtime, disk-space, pending-deployment and backend refuse for.
    #[test]
    fn refusals_by_table() {
        let mut cases: Vec<(&str, Input)> = Vec::new();
        let mut c = base();
        c.crio_runtime = Ok("runc".into());
        cases.push(("container-runtime", c));
        let mut c = base();
        c.disk.sysroot = 1 << 30;
        cases.push(("disk-space", c));
        let mut c = base();
        c.disk.boot = 10 << 20;
        cases.push(("disk-space", c));
        let mut c = base();
        c.foreign_staged = Some(Deployment {
            id: "rhcos-abc.1".into(),
            staged: true,
            ..Deployment::default()
        });
        cases.push(("pending-deployment", c));
        let mut c = base();
        c.backend = BackendKind::Bootc;
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.extensions = Some(Ok(rt_ext(10)));
        cases.push(("backend", c));
        let mut c = base();
        c.backend = BackendKind::Bootc;
        c.booted.requested_packages = vec!["usbguard".into()];
        cases.push(("backend", c));
        assert_refused(cases);
    }

    /// Field failure: NIC names change between majors unless persisted first. A warning, not a
    /// refusal (the admin may know the names are stable), and only when the major changes.
    #[test]
    fn unpersisted_nic_names_warn_only_across_a_major() {
        let nic = |c: &Input| {
            run(c)
                .into_iter()
                .find(|r| r.id == CheckId::NicNames)
                .map(|r| r.result)
        };
        let mut c = base();
        assert_eq!(nic(&c), Some(Outcome::Pass));
        c.nic_names_persisted = false;
        assert_eq!(nic(&c), Some(Outcome::Warn));
        assert_eq!(failed(&c), Vec::<&str>::new(), "a warning does not refuse");
        c.booted_major = Some(10);
        assert_eq!(
            nic(&c),
            Some(Outcome::Pass),
            "same major: nothing to persist"
        );
    }

    /// The machine-config daemon's own stage (the image of the MachineConfig it recorded,
    /// staged from a registry or from local storage) passes for the operator's move; another
    /// stage still fails, and for streamd's own move every stage is foreign (on the old code
    /// the daemon's own stage failed pending-deployment).
    #[test]
    fn the_mcds_own_stage_is_not_foreign_for_its_move() {
        let image = format!("quay.io/o/r@sha256:{}", "c".repeat(64));
        let mut c = base();
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied(&format!(r#"{{"spec":{{"osImageURL":"{image}"}}}}"#));
        for reference in [
            format!("ostree-unverified-registry:{image}"),
            format!("ostree-unverified-image:containers-storage:{image}"),
        ] {
            c.foreign_staged = Some(Deployment {
                id: "rhcos-abc.1".into(),
                staged: true,
                container_image_reference: Some(reference.clone()),
                ..Deployment::default()
            });
            let r = run(&c);
            let p = result(&r, "pending-deployment");
            assert_eq!(p.result, Outcome::Pass, "{reference}: {}", p.message);
            assert!(
                p.message.contains("machine-config daemon's own update"),
                "{}",
                p.message
            );
        }
        let other = format!(
            "ostree-unverified-registry:quay.io/x/y@sha256:{}",
            "d".repeat(64)
        );
        if let Some(d) = c.foreign_staged.as_mut() {
            d.container_image_reference = Some(other);
        }
        let r = run(&c);
        let p = result(&r, "pending-deployment");
        assert_eq!(p.result, Outcome::Fail);
        assert!(
            p.message
                .contains("deletes any other stage (rpm-ostree cleanup -p)"),
            "{}",
            p.message
        );
        if let Some(d) = c.foreign_staged.as_mut() {
            d.container_image_reference = Some(format!("ostree-unverified-registry:{image}"));
        }
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["pending-deployment"]);
    }

    #[test]
    fn foreign_staged_is_named_and_replaceable_by_policy() {
        let mut c = base();
        c.foreign_staged = Some(Deployment {
            id: "rhcos-abc.1".into(),
            staged: true,
            container_image_reference: Some("ostree-unverified-registry:quay.io/x/y:latest".into()),
            ..Deployment::default()
        });
        let r = run(&c);
        let pending = r
            .iter()
            .find(|r| r.id == CheckId::PendingDeployment)
            .expect("check");
        assert_eq!(pending.result, Outcome::Fail);
        assert!(
            pending.message.contains("quay.io/x/y:latest (rhcos-abc.1)"),
            "{}",
            pending.message
        );
        assert!(
            pending.message.contains("staged by someone else"),
            "{}",
            pending.message
        );
        c.policy.replace_foreign_staged = true;
        let r = run(&c);
        let pending = r
            .iter()
            .find(|r| r.id == CheckId::PendingDeployment)
            .expect("check");
        assert_eq!(pending.result, Outcome::Warn);
        // `ostree admin deploy` writes the pending deployment at once: not "staged".
        if let Some(d) = c.foreign_staged.as_mut() {
            d.staged = false;
        }
        let r = run(&c);
        let pending = r
            .iter()
            .find(|r| r.id == CheckId::PendingDeployment)
            .expect("check");
        assert!(
            pending.message.contains("pending for the next boot")
                && !pending.message.contains("staged by"),
            "{}",
            pending.message
        );
    }
}
