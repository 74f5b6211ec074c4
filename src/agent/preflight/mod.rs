//! Preflight: every check that runs before anything on the node changes.
//!
//! A pure function from gathered facts to check results. Each check has a stable id (used in
//! `reason`, Events, the journal's `STREAMD_CHECK` field and `streamctl preflight`), a result and a
//! message that says what is wrong and what to do.
//!
//! One file per family of checks: `image.rs` (the image policy, the OS image and its pull), `kernel.rs` (CPU,
//! FIPS, kernel variant), `packages.rs` (the extensions image and what it re-provides),
//! `host.rs` (backend, runtime, disk, NICs, a pending deployment), `layering.rs` (what else
//! rpm-ostree reads for a layered deployment, its repositories read by `repos.rs` and probed
//! by `probe.rs`, the one part that does I/O, for the gatherer); `needs.rs` is what a move
//! needs from the extensions image, which several of them judge; `errors.rs` why a fact could
//! not be had.

use serde::Serialize;

use crate::backend::{BackendKind, Deployment, KernelVariant};
use crate::cluster::policy::Verdict;
use crate::cluster::protocol::{CheckId, Desired};
use crate::config::Policy;
use crate::host::facts::machineconfig::AppliedConfig;
use crate::host::facts::{Fips, FipsSources};
use crate::host::ospull::OsPull;
use crate::image::registry::{ExtensionsInfo, OsImageInfo};
use crate::image::rpm::{Closure, el_major};

mod advice;
mod boot;
mod errors;
mod host;
mod image;
mod kernel;
mod layering;
mod needs;
mod packages;
pub mod probe;
#[cfg(test)]
mod release_tests;
pub mod repos;
mod signature;

pub use errors::{Cause, FactError};
pub use layering::{
    LayeringConfig, Place, RPM_OSTREED_CONF, Reach, Repo, YUM_REPOS_D, lock_layering,
    reads_repositories,
};
pub use needs::{FromExtensions, from_extensions, layered_packages_of, variant_from_extensions};

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Fine.
    Pass,
    /// Worth knowing; does not block.
    Warn,
    /// Blocks the migration.
    Fail,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Which check.
    pub id: CheckId,
    /// Outcome.
    pub result: Outcome,
    /// What was found.
    pub message: String,
}

/// Free space, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskFree {
    /// Free on the sysroot (`/sysroot`).
    pub sysroot: u64,
    /// Free on `/boot`.
    pub boot: u64,
}

/// Everything the checks look at: the request, the node and what was gathered for it. Built
/// where it is gathered (`crate::agent::gather`) and, for the tests, by `fixtures::base`;
/// adding a fact is a field here, its value there and its default in the fixture.
#[derive(Debug, Clone)]
pub struct Input {
    /// The request.
    pub desired: Desired,
    /// The image policy's verdict on the request: why it is allowed, or why refused.
    pub image_policy: Verdict,
    /// The booted deployment.
    pub booted: Deployment,
    /// Booted OS major (os-release).
    pub booted_major: Option<u32>,
    /// Host architecture.
    pub arch: String,
    /// x86-64 level (x86_64 only).
    pub x86_64_level: Option<u8>,
    /// FIPS state.
    pub fips: Fips,
    /// Whether UEFI Secure Boot is on; `None`: the variable could not be read.
    pub secure_boot: Option<bool>,
    /// Whether bootupd's `bootloader-update.service` ran and succeeded this boot; `None`: not
    /// known.
    pub bootloader_updated: Option<bool>,
    /// The two values it was read from.
    pub fips_sources: FipsSources,
    /// Kernel variant, or why it is inconsistent.
    pub kernel: Result<KernelVariant, FactError>,
    /// CRI-O's default runtime, or why it could not be read.
    pub crio_runtime: Result<String, FactError>,
    /// The OS image as the OS daemon would read it (its credentials, mirrors), or why not.
    pub os_image: Result<OsImageInfo, FactError>,
    /// How the OS daemon's pull of the OS image went, endpoint by endpoint.
    pub os_pull: OsPull,
    /// The OS image's signature as the host's policy requires it (`crate::host::sigpolicy`):
    /// why it is fine, or why the move is refused.
    pub signature: Result<String, crate::host::sigpolicy::Refused>,
    /// The extensions image, if requested, or why it could not be inspected.
    pub extensions: Option<Result<ExtensionsInfo, FactError>>,
    /// The RPMs to pass, closed under Requires over the extensions image's RPMs (when there
    /// are RPMs to pass and the image was read).
    pub closure: Option<Closure>,
    /// `LockLayering` and the enabled repositories rpm-ostree reads for a layered
    /// deployment, or why they cannot be read.
    pub layering: Result<LayeringConfig, FactError>,
    /// Free disk space.
    pub disk: DiskFree,
    /// Whether NIC names are persisted (`/etc/systemd/network/*.link` written by nmstate).
    pub nic_names_persisted: bool,
    /// A staged deployment streamd did not create, if any.
    pub foreign_staged: Option<Deployment>,
    /// The update backend that would stage.
    pub backend: BackendKind,
    /// Policy.
    pub policy: Policy,
    /// Who makes the move: streamd, or the machine-config operator (readiness of a node the
    /// machine-config daemon manages).
    pub mover: Mover,
    /// The MachineConfig the machine-config daemon applied, or why it cannot be read; `None`
    /// when not known (no such file). Only the machine-config operator's move looks at it.
    pub machine_config: Option<Result<AppliedConfig, FactError>>,
}

/// Who makes the move the checks are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mover {
    /// streamd rebases the node onto the requested image itself: a request, `streamctl
    /// preflight`, `check-stream` in manage mode, readiness without the machine-config daemon.
    Streamd,
    /// The machine-config operator, once an admin sets the pool's `spec.osImageStream.name`
    /// (readiness of a node the machine-config daemon manages). On a node running an
    /// on-cluster-layered image it builds a new layered image FROM the stream's base image and
    /// swaps the kernel from the stream's extensions image (the rendered MachineConfig's
    /// `osImageURL` and `baseOSExtensionsContainerImage`, which come from the OSImageStream:
    /// openshift/machine-config-operator:pkg/controller/common/helpers.go
    /// `GetBaseImageContainer`, `GetBaseExtensionsImageContainer`; pkg/controller/build/
    /// buildrequest/buildrequest.go and assets/Containerfile.on-cluster-build-template).
    MachineConfigOperator,
}

/// The major a stream name targets (`rhel-10` → 10), if it ends in one.
pub fn stream_major(stream: &str) -> Option<u32> {
    stream.rsplit('-').next()?.split('.').next()?.parse().ok()
}

/// The major a request moves to: the stream's, else the OS image's `ostree.linux` kernel's.
pub fn target_major(desired: &Desired, os_image: &Result<OsImageInfo, FactError>) -> Option<u32> {
    stream_major(&desired.stream).or_else(|| {
        os_image
            .as_ref()
            .ok()
            .and_then(|o| o.kernel_release.as_deref())
            .and_then(el_major)
    })
}

/// Runs every check, in a fixed order.
pub fn run(i: &Input) -> Vec<CheckResult> {
    vec![
        image::image_policy(&i.image_policy),
        image::image_reference(i),
        // Early: on bootc the overrides are hidden, so later checks would give a misleading
        // reason for the same refusal.
        host::backend(i),
        image::direction(i),
        // Before os-image: a pull the daemon cannot make is refused under this id.
        image::os_pull_credentials(i),
        image::os_image(i),
        signature::signature(i),
        packages::extensions_image(i),
        kernel::cpu_level(i),
        kernel::fips(i),
        kernel::kernel_variant(i),
        boot::secure_boot(i),
        host::container_runtime(i),
        host::disk_space(i),
        packages::layered_packages(i),
        packages::rpm_dependencies(i),
        layering::layering_config(i),
        host::nic_names(i),
        host::pending_deployment(i),
    ]
}

/// The checks of a request the image policy refused for `reason`: that check alone, since
/// nothing was read for it.
pub fn refused_by_image_policy(reason: String) -> Vec<CheckResult> {
    vec![image::image_policy(&Verdict::Refused(reason))]
}

/// The ids of the failing checks, in run order.
pub fn failed_ids(results: &[CheckResult]) -> Vec<CheckId> {
    results
        .iter()
        .filter(|c| c.result == Outcome::Fail)
        .map(|c| c.id)
        .collect()
}

/// The first failing check, if any.
pub fn first_failure(results: &[CheckResult]) -> Option<&CheckResult> {
    results.iter().find(|c| c.result == Outcome::Fail)
}

fn pass(id: CheckId, message: impl Into<String>) -> CheckResult {
    CheckResult {
        id,
        result: Outcome::Pass,
        message: message.into(),
    }
}

fn warn(id: CheckId, message: impl Into<String>) -> CheckResult {
    CheckResult {
        id,
        result: Outcome::Warn,
        message: message.into(),
    }
}

fn fail(id: CheckId, message: impl Into<String>) -> CheckResult {
    CheckResult {
        id,
        result: Outcome::Fail,
        message: message.into(),
    }
}

/// The tests' node and request: a default host on rhel-9 whose every check passes for
/// rhel-10, and helpers that change it.
#[cfg(test)]
mod fixtures {
    pub(super) use super::{Cause, CheckResult, FactError, Input, Mover, Outcome, run};
    pub(super) use crate::backend::KernelVariant;
    pub(super) use crate::image::registry::ExtensionsInfo;

    use super::*;
    use crate::cluster::protocol::Inputs;
    use crate::host::facts::machineconfig;
    use crate::host::facts::mco_release::{McoRelease, Named, ReleaseOf};
    use crate::host::ospull::{AttemptOutcome, PolicyVerdict};
    use crate::image::registry::LAYERED_FROM;

    /// A request for `stream` (digest-pinned OS image, no extensions image).
    pub(super) fn desired(stream: &str) -> Desired {
        Inputs {
            stream: Some(stream.into()),
            os_image: Some(format!("quay.io/o/r@sha256:{}", "a".repeat(64))),
            ..Inputs::default()
        }
        .desired()
        .expect("valid")
        .expect("present")
    }

    /// Every fact's default: what a new fact of [`Input`] gets here.
    pub(super) fn base() -> Input {
        Input {
            desired: desired("rhel-10"),
            image_policy: Verdict::Allowed(
                "the OS image's repository \"quay.io/o/r\" is the booted image's".into(),
            ),
            booted: Deployment::default(),
            booted_major: Some(9),
            arch: "x86_64".into(),
            x86_64_level: Some(3),
            fips: Fips::Disabled,
            secure_boot: Some(false),
            bootloader_updated: None,
            fips_sources: FipsSources::default(),
            kernel: Ok(KernelVariant::Default),
            crio_runtime: Ok("crun".into()),
            os_image: Ok(OsImageInfo {
                bootable: true,
                stream_class: Some("rhel-10".into()),
                arch: "x86_64".into(),
                kernel_release: Some("6.12.0-124.8.1.el10_1.x86_64".into()),
                version: Some("10.1".into()),
                size: 2 << 30,
                manifest_digest: format!("sha256:{}", "b".repeat(64)),
                layered_from: None,
                base_packages: None,
            }),
            os_pull: OsPull {
                auth_file: Some("/run/ostree/auth.json"),
                problem: None,
                policy: Some(("/etc/containers/policy.json", PolicyVerdict::Accept)),
                attempts: vec![crate::host::ospull::Attempt {
                    source: "quay.io/o/r".into(),
                    mirror: false,
                    credential: true,
                    outcome: AttemptOutcome::Pulled,
                }],
            },
            signature: Ok("/etc/containers/policy.json requires no signature".into()),
            extensions: None,
            closure: None,
            layering: Ok(LayeringConfig::default()),
            disk: DiskFree {
                sysroot: 20 << 30,
                boot: 500 << 20,
            },
            nic_names_persisted: true,
            foreign_staged: None,
            backend: BackendKind::RpmOstree,
            policy: Policy::default(),
            mover: Mover::Streamd,
            machine_config: None,
        }
    }

    /// A node whose `variant` kernel is layered as package overrides (as the MCO does).
    pub(super) fn layer_kernel(c: &mut Input, variant: KernelVariant) {
        c.kernel = Ok(variant);
        c.booted.requested_base_removals = crate::backend::kernel::DEFAULT_KERNEL_PACKAGES
            .iter()
            .map(|p| p.to_string())
            .collect();
        c.booted.requested_local_packages = variant
            .packages()
            .iter()
            .map(|p| format!("{p}-5.14.0-570.60.1.el9_6.x86_64"))
            .collect();
    }

    /// An extensions image for rhel-`el` with the real-time kernel and usbguard.
    pub(super) fn rt_ext(el: u32) -> ExtensionsInfo {
        let rel = if el == 10 {
            "6.12.0-124.8.1.el10_1"
        } else {
            "5.14.0-570.60.1.el9_6"
        };
        ExtensionsInfo {
            is_extensions: true,
            listed: true,
            stream_class: Some(format!("rhel-{el}")),
            rpms: vec![
                format!("kernel-rt-core-{rel}.x86_64"),
                format!("kernel-rt-modules-{rel}.x86_64"),
                format!("kernel-rt-modules-extra-{rel}.x86_64"),
                format!("usbguard-1.1.3-3.el{el}.x86_64"),
            ],
            headers: Vec::new(),
        }
    }

    /// The ids of the checks that fail for `c`, in run order.
    pub(super) fn failed(c: &Input) -> Vec<&'static str> {
        run(c)
            .into_iter()
            .filter(|r| r.result == Outcome::Fail)
            .map(|r| r.id.as_str())
            .collect()
    }

    /// A node on an on-cluster-layered image: its booted image names its base.
    pub(super) fn ocl(c: &mut Input) {
        c.booted.image_labels.insert(
            LAYERED_FROM.into(),
            "quay.io/openshift/rhcos@sha256:9".into(),
        );
    }

    /// The result of check `id` in `r`.
    pub(super) fn result<'c>(r: &'c [CheckResult], id: &str) -> &'c CheckResult {
        r.iter().find(|c| c.id.as_str() == id).expect("check")
    }

    /// The message of check `id` for `c`.
    pub(super) fn message(c: &Input, id: &str) -> String {
        result(&run(c), id).message.clone()
    }

    /// A MachineConfig the machine-config daemon applied, from its JSON.
    /// Rendered by the newest release streamd knows, unless `json` names one.
    pub(super) fn applied(json: &str) -> Option<Result<AppliedConfig, FactError>> {
        Some(FactError::of_machine_config(
            &machineconfig::parse(json).map(|mut mc| {
                if mc.release.named == Named::Absent {
                    mc.release = ReleaseOf::known(McoRelease::NEWEST);
                }
                mc
            }),
        ))
    }

    /// An extensions image for rhel-10 holding `names` (x86_64, el10).
    pub(super) fn ext_with(names: &[&str]) -> ExtensionsInfo {
        ExtensionsInfo {
            rpms: names
                .iter()
                .map(|n| format!("{n}-6.12.0-124.8.1.el10_1.x86_64"))
                .collect(),
            ..rt_ext(10)
        }
    }

    /// A node on an on-cluster-layered image, judged for the machine-config operator's move
    /// with the applied MachineConfig `json` and an extensions image holding `ext`.
    pub(super) fn ocl_mc(json: &str, ext: &[&str]) -> Input {
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied(json);
        c.extensions = Some(Ok(ext_with(ext)));
        c
    }

    /// The real-time kernel's packages as a node carries them.
    pub(super) const RT: [&str; 3] = [
        "kernel-rt-core",
        "kernel-rt-modules",
        "kernel-rt-modules-extra",
    ];

    /// The real-time kernel's packages as the on-cluster build installs them
    /// (`GetPackagesForSupportedKernelType`: kernel-rt-kvm too).
    pub(super) const RT_BUILD: [&str; 4] = [RT[0], RT[1], RT[2], "kernel-rt-kvm"];

    /// Every case refuses with (at least) its check.
    pub(super) fn assert_refused(cases: Vec<(&str, Input)>) {
        for (want, case) in cases {
            let f = failed(&case);
            assert!(f.contains(&want), "expected {want} to fail, failed: {f:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::image::rpm::package_name;

    #[test]
    fn default_host_passes() {
        assert_eq!(failed(&base()), Vec::<&str>::new());
        let ids: Vec<_> = run(&base()).into_iter().map(|c| c.id).collect();
        assert_eq!(
            ids,
            CheckId::ALL,
            "every check runs, in the order CheckId::ALL lists"
        );
    }

    #[test]
    fn majors_and_names() {
        assert_eq!(stream_major("rhel-10"), Some(10));
        assert_eq!(stream_major("centos-10"), Some(10));
        assert_eq!(stream_major("rhel"), None);
        assert_eq!(el_major("6.12.0-124.8.1.el10_1.x86_64"), Some(10));
        assert_eq!(el_major("kernel-rt-core-5.14.0-570.el9_6.x86_64"), Some(9));
        assert_eq!(el_major("usbguard-1.1.3-3.el10.x86_64"), Some(10));
        assert_eq!(el_major("foo-1-1.fc41"), None);
        assert_eq!(package_name("usbguard-1.1.3-3.el10.x86_64"), "usbguard");
        assert_eq!(
            package_name("kernel-rt-core-5.14.0-570.el9_6.x86_64"),
            "kernel-rt-core"
        );
        assert_eq!(package_name("usbguard"), "usbguard");
        assert_eq!(package_name("kernel-64k-core"), "kernel-64k-core");
        assert_eq!(package_name("a-0-a"), "a-0-a");
    }
}
