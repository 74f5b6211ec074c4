//! Preflight: every check that runs before anything on the node changes.
//!
//! A pure function from gathered facts to check results. Each check has a stable id (used in
//! `reason`, Events, the journal's `STREAMD_CHECK` field and `streamctl preflight`), a result and a
//! message that says what is wrong and what to do.

use serde::Serialize;

use crate::backend::Deployment;
use crate::backend::KernelVariant;
use crate::cluster::protocol::{CheckId, Desired};
use crate::config::Policy;
use crate::host::facts::Fips;
use crate::host::facts::machineconfig::{self, AppliedConfig};
use crate::host::ospull::{AttemptOutcome, OsPull, PolicyVerdict};
use crate::image::registry::{ExtensionsInfo, LAYERED_FROM, OsImageInfo};
use crate::image::rpm::{Closure, el_major, names_package, package_name};

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

/// Everything the checks look at.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The request.
    pub desired: &'a Desired,
    /// The booted deployment.
    pub booted: &'a Deployment,
    /// Booted OS major (os-release).
    pub booted_major: Option<u32>,
    /// Host architecture.
    pub arch: &'a str,
    /// x86-64 level (x86_64 only).
    pub x86_64_level: Option<u8>,
    /// FIPS state.
    pub fips: Fips,
    /// Kernel variant, or why it is inconsistent.
    pub kernel: &'a Result<KernelVariant, String>,
    /// CRI-O's default runtime, or why it could not be read.
    pub crio_runtime: &'a Result<String, String>,
    /// The OS image as the OS daemon would read it (its credentials, mirrors), or why not.
    pub os_image: &'a Result<OsImageInfo, String>,
    /// How the OS daemon's pull of the OS image went, endpoint by endpoint.
    pub os_pull: &'a OsPull,
    /// The extensions image, if requested, or why it could not be inspected.
    pub extensions: Option<&'a Result<ExtensionsInfo, String>>,
    /// The RPMs to pass, closed under Requires over the extensions image's RPMs (when there
    /// are RPMs to pass and the image was read).
    pub closure: Option<&'a Closure>,
    /// Free disk space.
    pub disk: DiskFree,
    /// Whether NIC names are persisted (`/etc/systemd/network/*.link` written by nmstate).
    pub nic_names_persisted: bool,
    /// A staged deployment streamd did not create, if any.
    pub foreign_staged: Option<&'a Deployment>,
    /// The update backend that would stage.
    pub backend: crate::backend::BackendKind,
    /// Policy.
    pub policy: &'a Policy,
    /// Who makes the move: streamd, or the machine-config operator (readiness of a node the
    /// machine-config daemon manages).
    pub mover: Mover,
    /// The MachineConfig the machine-config daemon applied, or why it cannot be read; `None`
    /// when not known (no such file). Only the machine-config operator's move looks at it.
    pub machine_config: Option<&'a Result<AppliedConfig, String>>,
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

/// Whether the move rebuilds the booted on-cluster-layered image from the target's base image
/// (the machine-config operator's move on a node running such an image).
fn rebuilt_by_mco(booted: &Deployment, mover: Mover) -> bool {
    mover == Mover::MachineConfigOperator && booted.image_labels.contains_key(LAYERED_FROM)
}

/// The kernel variant the target's extensions image must provide for a node running
/// `running` on `booted`: the variant its package overrides carry; none when the variant comes
/// from the booted image (the target image must then carry it itself), except where the
/// machine-config operator rebuilds an on-cluster-layered image: its build swaps the kernel
/// for the `KernelType` packages from the extensions image (Containerfile.on-cluster-build-
/// template), so that image must provide them exactly as for an override-carried kernel.
pub fn variant_from_extensions(
    booted: &Deployment,
    running: KernelVariant,
    mover: Mover,
) -> KernelVariant {
    if crate::backend::kernel::from_image(booted, running) && !rebuilt_by_mco(booted, mover) {
        KernelVariant::Default
    } else {
        running
    }
}

/// What the target's extensions image must provide for a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromExtensions {
    /// The kernel variant installed from it (`Default`: none).
    pub variant: KernelVariant,
    /// That variant's packages, as the mover installs them.
    pub kernel: &'static [&'static str],
    /// Every other package (names or NEVRAs, as the origin has them).
    pub layered: Vec<String>,
    /// Whether this is what the applied MachineConfig asks for (else it is read off the node).
    pub from_machine_config: bool,
    /// With the MachineConfig: the packages layered on the node beyond what it asks for (by
    /// hand, `rpm-ostree install`), which the daemon's rebase keeps in the origin
    /// ([`kept_by_mcd_rebase`]), so rpm-ostree must find them again (pkg/daemon/update.go
    /// `applyLayeredOSChanges`, OCPBUGS-2269). Without the MachineConfig they are in `layered`.
    pub by_hand: Vec<String>,
    /// With the MachineConfig: the local RPMs on the node (NEVRAs). The daemon's rebase keeps
    /// them as built, whatever the target, so they must fit its major. Without the
    /// MachineConfig they are in `layered` (streamd's own move passes new ones).
    pub local: Vec<String>,
}

impl FromExtensions {
    /// Every package besides the kernel's: `layered`, then `by_hand`.
    pub fn all_layered(&self) -> impl Iterator<Item = &String> {
        self.layered.iter().chain(&self.by_hand)
    }

    /// Whether anything is needed from the extensions image.
    fn needed(&self) -> bool {
        self.variant != KernelVariant::Default || self.all_layered().next().is_some()
    }
}

/// What the target's extensions image must provide. For the machine-config operator's move,
/// when the MachineConfig the machine-config daemon applied is known, what it asks for: its
/// `spec.kernelType` packages and its `spec.extensions` packages, which the operator installs
/// from the stream's extensions image whatever runs now (the on-cluster build's `rpm-ostree
/// install` and kernel swap: Containerfile.on-cluster-build-template; the daemon's own
/// pkg/daemon/update.go `applyExtensions`, `switchKernel`). Otherwise it is read off the node:
/// the variant [`variant_from_extensions`] gives and the booted deployment's other package
/// overrides.
pub fn from_extensions(
    booted: &Deployment,
    kernel: &Result<KernelVariant, String>,
    mover: Mover,
    machine_config: Option<&Result<AppliedConfig, String>>,
) -> FromExtensions {
    if mover == Mover::MachineConfigOperator
        && let Some(Ok(mc)) = machine_config
    {
        let variant = mc.kernel_type.clone().unwrap_or(KernelVariant::Default);
        let asked = mc.extension_packages();
        let by_hand = kept_by_mcd_rebase(booted)
            .filter(|p| !asked.contains(&package_name(p)))
            .cloned()
            .collect();
        let local = booted.requested_local_packages.clone();
        return FromExtensions {
            variant,
            kernel: machineconfig::kernel_packages(variant, rebuilt_by_mco(booted, mover)),
            layered: asked.into_iter().map(str::to_string).collect(),
            from_machine_config: true,
            by_hand,
            local,
        };
    }
    let running = kernel.as_ref().copied().unwrap_or(KernelVariant::Default);
    let variant = variant_from_extensions(booted, running, mover);
    FromExtensions {
        variant,
        kernel: variant.packages(),
        layered: layered_packages_of(booted, variant),
        from_machine_config: false,
        by_hand: Vec::new(),
        local: Vec::new(),
    }
}

/// The major a stream name targets (`rhel-10` → 10), if it ends in one.
pub fn stream_major(stream: &str) -> Option<u32> {
    stream.rsplit('-').next()?.split('.').next()?.parse().ok()
}

/// Runs every check, in a fixed order.
pub fn run(i: &Input<'_>) -> Vec<CheckResult> {
    vec![
        image_reference(i),
        // Early: on bootc the overrides are hidden, so later checks would give a misleading
        // reason for the same refusal.
        backend(i),
        direction(i),
        // Before os-image: a pull the daemon cannot make is refused under this id.
        os_pull_credentials(i),
        os_image(i),
        extensions_image(i),
        cpu_level(i),
        fips(i),
        kernel_variant(i),
        container_runtime(i),
        disk_space(i),
        layered_packages(i),
        rpm_dependencies(i),
        nic_names(i),
        pending_deployment(i),
    ]
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

/// The major a request moves to: the stream's, else the OS image's `ostree.linux` kernel's.
pub fn target_major(desired: &Desired, os_image: &Result<OsImageInfo, String>) -> Option<u32> {
    stream_major(&desired.stream).or_else(|| {
        os_image
            .as_ref()
            .ok()
            .and_then(|o| o.kernel_release.as_deref())
            .and_then(el_major)
    })
}

fn pending_deployment(i: &Input<'_>) -> CheckResult {
    let id = CheckId::PendingDeployment;
    let Some(staged) = i.foreign_staged else {
        return pass(id, "nothing else is staged");
    };
    let what = staged.pullspec().map_or_else(
        || format!("deployment {}", staged.id),
        |p| format!("{p} ({})", staged.id),
    );
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
                "{what} is {how}; remove it (rpm-ostree cleanup -p) or set \
                 replace-foreign-staged = true to let streamd replace it"
            ),
        )
    }
}

fn backend(i: &Input<'_>) -> CheckResult {
    let id = CheckId::Backend;
    match i.backend {
        crate::backend::BackendKind::RpmOstree => pass(id, "rpm-ostree"),
        crate::backend::BackendKind::Bootc => {
            match crate::backend::bootc::refusal(carried(i), i.booted) {
                Some(reason) => fail(id, reason),
                None => pass(
                    id,
                    "bootc (a stage is held with upgrade --download-only from bootc 1.12 on, else staged only after the reboot is approved)",
                ),
            }
        }
    }
}

fn image_reference(i: &Input<'_>) -> CheckResult {
    // The annotation parser already refused anything unpinned; this records what is used.
    pass(
        CheckId::ImageReference,
        format!("{} (pinned by digest)", i.desired.os_image),
    )
}

fn direction(i: &Input<'_>) -> CheckResult {
    let id = CheckId::Direction;
    match (i.booted_major, target_major(i.desired, i.os_image)) {
        (Some(from), Some(to)) if to < from && !i.policy.allow_downgrade => fail(
            id,
            format!(
                "moving from major {from} to {to} is a downgrade, which is not supported; set allow-downgrade = true in the config to force it"
            ),
        ),
        (Some(from), Some(to)) if to < from => warn(
            id,
            format!("downgrade from major {from} to {to} allowed by config"),
        ),
        (Some(from), Some(to)) => pass(id, format!("major {from} -> {to}")),
        (None, _) => fail(
            id,
            "cannot tell the booted OS major from os-release; refusing to guess",
        ),
        (_, None) => fail(
            id,
            format!(
                "cannot tell the target major from stream {:?} or the image's ostree.linux label",
                i.desired.stream
            ),
        ),
    }
}

/// The daemon that pulls the OS image, as the reasons name it.
fn os_daemon(i: &Input<'_>) -> &'static str {
    match i.backend {
        crate::backend::BackendKind::RpmOstree => "rpm-ostreed",
        crate::backend::BackendKind::Bootc => "bootc",
    }
}

/// The OS daemon pulls with the host's ostree auth file, registries.conf and policy.json
/// (crate::host::ospull), not with streamd's pull secret: refused when that pull cannot
/// succeed for a reason of credentials or configuration. streamd never writes the auth file.
fn os_pull_credentials(i: &Input<'_>) -> CheckResult {
    let id = CheckId::OsPullCredentials;
    let daemon = os_daemon(i);
    let p = i.os_pull;
    let auth = p.auth_file.map_or_else(
        || "anonymously (none of /run/ostree/auth.json, /etc/ostree/auth.json, /usr/lib/ostree/auth.json exists)".to_string(),
        |f| format!("with the credentials in {f}"),
    );
    if let Some(problem) = &p.problem {
        return fail(id, format!("{daemon} cannot pull the OS image: {problem}"));
    }
    if let Some(a) = p.pulled() {
        let from = if a.mirror {
            format!("the mirror {}", a.source)
        } else {
            a.source.clone()
        };
        let msg = format!("{daemon} pulls from {from} {auth}");
        return match p.policy {
            Some((file, PolicyVerdict::NeedsSignature)) => warn(
                id,
                format!("{msg}; {file} requires a signature for this image"),
            ),
            _ => pass(id, msg),
        };
    }
    let refused: Vec<String> = p
        .attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            AttemptOutcome::Blocked(prefix) => Some(format!(
                "{} is blocked (registries.conf entry {})",
                a.source,
                crate::text::quote(prefix)
            )),
            AttemptOutcome::Unauthorized => Some(format!(
                "{} answered unauthorized ({})",
                a.source,
                match (p.auth_file, a.credential) {
                    (None, _) => "no auth file".to_string(),
                    (Some(f), false) => format!("{f} has no credential for it"),
                    (Some(f), true) => format!("it rejected the credential in {f}"),
                }
            )),
            _ => None,
        })
        .collect();
    if refused.is_empty() {
        // Not a matter of credentials or configuration: os-image says what is wrong.
        return pass(id, format!("{daemon} would pull {auth}"));
    }
    let unauthorized = p
        .attempts
        .iter()
        .any(|a| a.outcome == AttemptOutcome::Unauthorized);
    let remedy = if unauthorized {
        "give the node a credential for the registry or mirror it pulls from in \
         /run/ostree/auth.json or /etc/ostree/auth.json (the machine-config daemon links the \
         kubelet's pull secret there; streamd does not write it)"
    } else {
        "mirror the image (ImageDigestMirrorSet) or unblock the registry in \
         /etc/containers/registries.conf(.d)"
    };
    fail(
        id,
        format!(
            "{daemon} would pull {auth} and fail: {}; {remedy}",
            refused.join("; ")
        ),
    )
}

fn os_image(i: &Input<'_>) -> CheckResult {
    let id = CheckId::OsImage;
    let info = match i.os_image {
        Ok(info) => info,
        Err(e) => return fail(id, e.clone()),
    };
    if !info.bootable {
        return fail(
            id,
            format!(
                "{} is not a bootable OS image (label containers.bootc is not 1/true)",
                i.desired.os_image
            ),
        );
    }
    if let Some(class) = &info.stream_class
        && class != &i.desired.stream
    {
        return fail(
            id,
            format!(
                "the image's stream class is {class:?} but the node was asked for stream {:?}",
                i.desired.stream
            ),
        );
    }
    if info.arch != i.arch {
        return fail(
            id,
            format!("the image is for {} but this node is {}", info.arch, i.arch),
        );
    }
    // The booted image's labels could not be read (bootc: from its commit), so it may be
    // on-cluster-layered; a base image does not replace it unseen.
    if let Some(why) = &i.booted.image_labels_error
        && info.layered_from.is_none()
    {
        return fail(
            id,
            format!(
                "the booted image's labels could not be read ({why}), so streamd cannot tell whether the node runs an on-cluster-layered image; {} is a base image, which would drop anything layered",
                i.desired.os_image
            ),
        );
    }
    // A base image in place of an on-cluster-layered one would drop whatever was layered (in
    // resolve mode the stream's image always is a base image), unless the machine-config
    // operator makes the move: it builds the new layered image from that base.
    if let Some(base) = i.booted.image_labels.get(LAYERED_FROM)
        && info.layered_from.is_none()
    {
        if rebuilt_by_mco(i.booted, i.mover) {
            return pass(
                id,
                format!(
                    "the node runs an on-cluster-layered image (built from {base}); the machine-config operator rebuilds it from this base image (stream {}, {})",
                    info.stream_class.as_deref().unwrap_or("(unlabelled)"),
                    info.arch
                ),
            );
        }
        return fail(
            id,
            format!(
                "the node runs an on-cluster-layered image (built from {base}); {} is a base image, which would drop what was layered: request the layered image built for the target stream",
                i.desired.os_image
            ),
        );
    }
    pass(
        id,
        format!(
            "bootable, stream {}, {}, version {}",
            info.stream_class.as_deref().unwrap_or("(unlabelled)"),
            info.arch,
            info.version.as_deref().unwrap_or("?")
        ),
    )
}

/// The variant streamd's own rebase carries as packages: the running one, unless it comes from
/// the image (then none).
fn carried(i: &Input<'_>) -> KernelVariant {
    match i.kernel {
        Ok(v) => variant_from_extensions(i.booted, *v, Mover::Streamd),
        Err(_) => KernelVariant::Default,
    }
}

/// What the target's extensions image must provide ([`from_extensions`]).
fn provided(i: &Input<'_>) -> FromExtensions {
    from_extensions(i.booted, i.kernel, i.mover, i.machine_config)
}

/// The applied MachineConfig, where the move is the machine-config operator's.
fn machine_config<'a>(i: &Input<'a>) -> Option<&'a Result<AppliedConfig, String>> {
    i.machine_config
        .filter(|_| i.mover == Mover::MachineConfigOperator)
}

/// What the applied MachineConfig asks the extensions image for, for a reason.
fn machine_config_asks(p: &FromExtensions, mc: &AppliedConfig) -> String {
    let mut asks = Vec::new();
    if p.variant != KernelVariant::Default {
        asks.push(format!("spec.kernelType {}", p.variant.as_str()));
    }
    if !mc.extensions.is_empty() {
        asks.push(format!("spec.extensions {}", mc.extensions.join(", ")));
    }
    asks.join(" and ")
}

fn extensions_image(i: &Input<'_>) -> CheckResult {
    let id = CheckId::ExtensionsImage;
    let provided = provided(i);
    match i.extensions {
        None if provided.needed()
            && let Some(Ok(mc)) = machine_config(i) =>
        {
            fail(
                id,
                format!(
                    "the MachineConfig the machine-config daemon applied asks for {}, which the machine-config operator installs from the stream's extensions image, and the target has none (the OSImageStream's osExtensionsImage, or check-extensions-image)",
                    machine_config_asks(&provided, mc)
                ),
            )
        }
        None if provided.needed() && rebuilt_by_mco(i.booted, i.mover) => fail(
            id,
            format!(
                "the machine-config operator's on-cluster build takes the {} kernel from the stream's extensions image, and the target has none (the OSImageStream's osExtensionsImage, or check-extensions-image)",
                provided.variant.as_str()
            ),
        ),
        None if provided.needed() => fail(
            id,
            "this node has a non-default kernel or layered packages, which must be re-provided for the target: set desired-extensions-image",
        ),
        None => pass(id, "not needed"),
        Some(Err(e)) => fail(id, e.clone()),
        Some(Ok(ext)) if !ext.is_extensions => fail(
            id,
            "the extensions image lacks the label io.openshift.os.extensions=true",
        ),
        Some(Ok(ext)) => match &ext.stream_class {
            Some(c) if c != &i.desired.stream => fail(
                id,
                format!(
                    "the extensions image's stream class is {c:?}, not {:?}",
                    i.desired.stream
                ),
            ),
            _ => pass(id, format!("{} RPMs", ext.rpms.len())),
        },
    }
}

fn cpu_level(i: &Input<'_>) -> CheckResult {
    let id = CheckId::CpuLevel;
    let needs_v3 =
        i.arch == "x86_64" && target_major(i.desired, i.os_image).is_some_and(|m| m >= 10);
    if !needs_v3 {
        return pass(id, "no CPU level requirement for this target");
    }
    match i.x86_64_level {
        Some(l) if l >= 3 => pass(id, format!("x86-64-v{l}")),
        Some(l) => fail(
            id,
            format!(
                "this CPU is x86-64-v{l}; RHEL 10 needs x86-64-v3 (AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE, XSAVE) and would not boot"
            ),
        ),
        None => fail(id, "cannot read the CPU flags from /proc/cpuinfo"),
    }
}

fn fips(i: &Input<'_>) -> CheckResult {
    let id = CheckId::Fips;
    match i.fips {
        Fips::Inconsistent => fail(
            id,
            "FIPS state is inconsistent: /proc/sys/crypto/fips_enabled and fips= on the kernel command line disagree; fix the host first",
        ),
        Fips::Enabled => pass(
            id,
            "FIPS enabled; it is carried in the kernel arguments and verified on the staged tree",
        ),
        Fips::Disabled => pass(id, "FIPS disabled"),
    }
}

fn variant_rpms<'e>(ext: &'e ExtensionsInfo, packages: &[&str]) -> Vec<&'e str> {
    packages
        .iter()
        .filter_map(|p| {
            ext.rpms
                .iter()
                .find(|r| names_package(r, p))
                .map(String::as_str)
        })
        .collect()
}

fn kernel_variant(i: &Input<'_>) -> CheckResult {
    let id = CheckId::KernelVariant;
    let running = match i.kernel {
        Ok(v) => *v,
        Err(e) => return fail(id, e.clone()),
    };
    let provided = provided(i);
    let want = provided.variant;
    // The operator's own checks (pkg/controller/common/helpers.go `ValidateMachineConfig`;
    // `switchKernel` and the build's `getKernelPackages` for 64k-pages off aarch64).
    if let Some(Ok(mc)) = machine_config(i) {
        if let Err(t) = &mc.kernel_type {
            return fail(
                id,
                format!(
                    "the MachineConfig's spec.kernelType {t} is none of default, realtime, 64k-pages: the machine-config operator rejects it (kernelType=… is invalid)"
                ),
            );
        }
        // The daemon's `switchKernel` removes the default kernel again (`override remove`);
        // removals its revert left in place (a kernel carried as local RPMs, streamd's own
        // way) make that fail with "Override already exists".
        let removals = kernel_removals(i.booted);
        if want != KernelVariant::Default
            && !rebuilt_by_mco(i.booted, i.mover)
            && !removals.is_empty()
            && !mcd_reverts_kernel_swap(i.booted)
        {
            return fail(
                id,
                format!(
                    "the machine-config daemon's switch to the {} kernel would fail (Override already exists): its rebase keeps the node's kernel base removals, which it reverts only with kernel-rt or kernel-64k packages from a repository; reset them (rpm-ostree override reset) before the move: {}",
                    want.as_str(),
                    removals.join(", ")
                ),
            );
        }
        // A variant the booted image carries (no override, no on-cluster build) is kept only
        // by the target image itself, whatever the MachineConfig says.
        let image_keeps = crate::backend::kernel::from_image(i.booted, running)
            && !rebuilt_by_mco(i.booted, i.mover);
        if want == KernelVariant::Default && !image_keeps {
            return pass(
                id,
                "the MachineConfig's spec.kernelType is default: the machine-config operator installs no kernel from the extensions image",
            );
        }
    }
    if want == KernelVariant::Default {
        return if running == KernelVariant::Default {
            pass(id, "default kernel")
        } else if running == KernelVariant::SixtyFourK && i.arch != "aarch64" {
            fail(id, "a 64k-pages kernel exists only on aarch64")
        } else {
            kernel_from_image(i, running)
        };
    }
    let asked = if provided.from_machine_config {
        format!(
            " the MachineConfig's spec.kernelType asks for (as {})",
            provided.kernel.join(", ")
        )
    } else {
        String::new()
    };
    if want == KernelVariant::SixtyFourK && i.arch != "aarch64" {
        return fail(
            id,
            format!("a 64k-pages kernel{asked} exists only on aarch64"),
        );
    }
    // Where the machine-config operator rebuilds the layered image, its build installs the
    // variant from the extensions image (Containerfile.on-cluster-build-template).
    let by = if rebuilt_by_mco(i.booted, i.mover) {
        "; the machine-config operator's on-cluster build installs it from there"
    } else if provided.from_machine_config {
        "; the machine-config daemon installs it from there"
    } else {
        ""
    };
    let Some(Ok(ext)) = i.extensions else {
        return fail(
            id,
            format!(
                "the {} kernel{asked} must come from the target's extensions image, which is missing or unreadable{by}",
                want.as_str()
            ),
        );
    };
    let target = target_major(i.desired, i.os_image);
    let found = variant_rpms(ext, provided.kernel);
    let missing: Vec<&str> = provided
        .kernel
        .iter()
        .copied()
        .filter(|p| !found.iter().any(|r| names_package(r, p)))
        .collect();
    if !missing.is_empty() {
        return fail(
            id,
            format!(
                "the extensions image lacks {} for the {} kernel{asked}{by}",
                missing.join(", "),
                want.as_str()
            ),
        );
    }
    let wrong: Vec<&str> = found
        .iter()
        .copied()
        .filter(|r| el_major(r) != target)
        .collect();
    if !wrong.is_empty() {
        return fail(
            id,
            format!(
                "the extensions image's {} packages are not built for the target major: {}{by}",
                want.as_str(),
                wrong.join(", ")
            ),
        );
    }
    pass(
        id,
        format!("{} kernel: {}", want.as_str(), found.join(", ")),
    )
}

/// A variant kernel that comes from the booted image: the target image must be of the same
/// variant, as its `ostree.linux` label (the kernel release ostree-ext copies from the commit:
/// bootc-dev/bootc:crates/ostree-ext/src/container/encapsulate.rs) shows. A base stream image
/// carries the default kernel and is refused: it would silently drop the variant.
fn kernel_from_image(i: &Input<'_>, variant: KernelVariant) -> CheckResult {
    let id = CheckId::KernelVariant;
    let what = format!(
        "the node's {} kernel comes from the booted image (no package override)",
        variant.as_str()
    );
    match i.os_image {
        Ok(info) => match (&info.kernel_release, &info.layered_from) {
            (Some(r), _) if r.ends_with(variant.release_suffix()) => pass(
                id,
                format!("{what}; the target image's kernel {r} is one too"),
            ),
            // A layered image keeps its base's labels: a kernel swapped in by its build is
            // invisible there, and streamd does not guess it from the layers.
            (Some(r), Some(base)) => fail(
                id,
                format!(
                    "{what}, but the target is a layered image (built from {base}) whose ostree.linux label ({r}) is its base's, so it cannot be shown to carry a {} kernel: build it from the {} variant of the base image",
                    variant.as_str(),
                    variant.as_str()
                ),
            ),
            (Some(r), None) => fail(
                id,
                format!(
                    "{what}, but the target image's kernel {r} (ostree.linux) is not {}: request the {} variant of the target image",
                    variant.as_str(),
                    variant.as_str()
                ),
            ),
            (None, _) => fail(
                id,
                format!(
                    "{what}; the target image does not say which kernel it carries (no ostree.linux label), so it cannot be shown to keep it"
                ),
            ),
        },
        Err(_) => fail(
            id,
            format!("{what}; the target image is unreadable, so it cannot be shown to keep it"),
        ),
    }
}

fn container_runtime(i: &Input<'_>) -> CheckResult {
    let id = CheckId::ContainerRuntime;
    match i.crio_runtime {
        Err(e) => fail(id, format!("cannot read the CRI-O configuration: {e}")),
        Ok(r) if r == "runc" && target_major(i.desired, i.os_image).is_some_and(|m| m >= 10) => {
            fail(
                id,
                "CRI-O's default runtime is runc, which RHEL 10 does not ship: migrate to crun first",
            )
        }
        Ok(r) => pass(id, format!("CRI-O default runtime {r}")),
    }
}

fn disk_space(i: &Input<'_>) -> CheckResult {
    let id = CheckId::DiskSpace;
    let image = i.os_image.as_ref().map(|o| o.size).unwrap_or(0);
    let need_sysroot = image.saturating_add(i.policy.min_free_sysroot);
    let mib = |b: u64| b >> 20;
    if i.disk.sysroot < need_sysroot {
        return fail(
            id,
            format!(
                "the sysroot has {} MiB free; staging needs {} MiB (image {} MiB + minimum {} MiB)",
                mib(i.disk.sysroot),
                mib(need_sysroot),
                mib(image),
                mib(i.policy.min_free_sysroot)
            ),
        );
    }
    if i.disk.boot < i.policy.min_free_boot {
        return fail(
            id,
            format!(
                "/boot has {} MiB free; a new kernel and initramfs need {} MiB",
                mib(i.disk.boot),
                mib(i.policy.min_free_boot)
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

/// The layered (repository) packages of the booted deployment that the machine-config
/// daemon's rebase keeps: all of them but the `kernel-rt-*`/`kernel-64k-*` packages its
/// kernel-swap revert uninstalls first, which it does only for a node with both such
/// packages and a `kernel*` base removal (pkg/daemon/update.go `queueRevertKernelSwap`, run
/// before an OS update). Local RPMs it never reverts: [`FromExtensions::local`].
fn kept_by_mcd_rebase(booted: &Deployment) -> impl Iterator<Item = &String> {
    let reverted = mcd_reverts_kernel_swap(booted);
    booted
        .requested_packages
        .iter()
        .filter(move |p| !(reverted && is_swap_layer(p)))
}

/// A `kernel-rt-*`/`kernel-64k-*` package, as `queueRevertKernelSwap` matches them.
fn is_swap_layer(p: &str) -> bool {
    p.starts_with("kernel-rt-") || p.starts_with("kernel-64k-")
}

/// The booted deployment's `kernel`/`kernel-*` base removals, as `queueRevertKernelSwap`
/// matches them.
fn kernel_removals(booted: &Deployment) -> Vec<&str> {
    booted
        .requested_base_removals
        .iter()
        .map(String::as_str)
        .filter(|r| *r == "kernel" || r.starts_with("kernel-"))
        .collect()
}

/// Whether the machine-config daemon's kernel-swap revert runs before its OS update: only with
/// both kernel base removals and `kernel-rt-*`/`kernel-64k-*` repository layers (pkg/daemon/
/// update.go `queueRevertKernelSwap`; with one of them alone it logs a notice and leaves both).
fn mcd_reverts_kernel_swap(booted: &Deployment) -> bool {
    !kernel_removals(booted).is_empty()
        && booted.requested_packages.iter().any(|p| is_swap_layer(p))
}

/// Layered packages of the booted deployment that are not part of the kernel variant
/// (names or NEVRAs, as the origin has them).
pub fn layered_packages_of(booted: &Deployment, variant: KernelVariant) -> Vec<String> {
    booted
        .requested_packages
        .iter()
        .chain(&booted.requested_local_packages)
        .filter(|p| !variant.owns(p))
        .cloned()
        .collect()
}

fn layered_packages(i: &Input<'_>) -> CheckResult {
    let id = CheckId::LayeredPackages;
    match machine_config(i) {
        Some(Err(e)) => {
            return fail(
                id,
                format!(
                    "cannot read the MachineConfig the machine-config daemon applied ({e}), so what the machine-config operator installs from the extensions image is unknown"
                ),
            );
        }
        // The operator resolves the names before it installs anything
        // (pkg/controller/common/helpers.go `GetPackagesForSupportedExtensions`).
        Some(Ok(mc)) if !mc.unsupported.is_empty() => {
            return fail(
                id,
                format!(
                    "the MachineConfig's spec.extensions names extensions the machine-config operator does not support: {}; it rejects them (invalid extensions found)",
                    mc.unsupported.join(", ")
                ),
            );
        }
        _ => {}
    }
    let provided_by = provided(i);
    let target = target_major(i.desired, i.os_image);
    let stale: Vec<&str> = provided_by
        .local
        .iter()
        .filter(|p| el_major(p) != target)
        .map(String::as_str)
        .collect();
    if !stale.is_empty() {
        let target = target.map_or_else(|| "unknown".to_string(), |t| format!("el{t}"));
        return fail(
            id,
            format!(
                "local RPMs stay in the origin as built through the machine-config daemon's rebase, and these are not built for the target ({target}); remove them (rpm-ostree uninstall): {}",
                stale.join(", ")
            ),
        );
    }
    if provided_by.all_layered().next().is_none() {
        return pass(id, "no layered packages");
    }
    // The daemon mounts the extensions image as a repository only for a MachineConfig with
    // extensions or a kernel type (`applyLayeredOSChanges`); without one, packages layered by
    // hand must come from the target image alone, whose package list streamd cannot read.
    if provided_by.from_machine_config
        && !provided_by.by_hand.is_empty()
        && provided_by.layered.is_empty()
        && provided_by.variant == KernelVariant::Default
    {
        return fail(
            id,
            format!(
                "no repository provides the packages layered outside the MachineConfig, which the machine-config daemon's rebase keeps (it adds the extensions image only for spec.extensions or spec.kernelType, and streamd cannot list the target image's own); remove them (rpm-ostree uninstall): {}",
                provided_by.by_hand.join(", ")
            ),
        );
    }
    let provided: Vec<&String> = match i.extensions {
        Some(Ok(ext)) => ext.rpms.iter().collect(),
        _ => Vec::new(),
    };
    let missing_of = |wanted: &[String]| -> Vec<String> {
        wanted
            .iter()
            .map(|p| package_name(p))
            .filter(|name| {
                !provided
                    .iter()
                    .any(|r| names_package(r, name) && el_major(r) == target)
            })
            .map(str::to_string)
            .collect()
    };
    let (missing, missing_by_hand) = (
        missing_of(&provided_by.layered),
        missing_of(&provided_by.by_hand),
    );
    if missing.is_empty() && missing_by_hand.is_empty() {
        let all: Vec<&str> = provided_by.all_layered().map(String::as_str).collect();
        return pass(
            id,
            format!("re-provided from the extensions image: {}", all.join(", ")),
        );
    }
    let mut why = Vec::new();
    match machine_config(i) {
        Some(Ok(mc)) if provided_by.from_machine_config => {
            if !missing.is_empty() {
                why.push(format!(
                    "the MachineConfig's spec.extensions ({}) needs packages the extensions image does not provide for the target: {}",
                    mc.extensions.join(", "),
                    missing.join(", ")
                ));
            }
            if !missing_by_hand.is_empty() {
                why.push(format!(
                    "packages layered on the node outside the MachineConfig stay in its origin through the move, and the extensions image does not provide them for the target: {}",
                    missing_by_hand.join(", ")
                ));
            }
        }
        _ => why.push(format!(
            "layered packages not provided for the target by the extensions image: {}",
            missing.join(", ")
        )),
    }
    fail(id, why.join("; "))
}

/// The RPMs passed must be closed under Requires: rpm-ostree adds them to the sack as
/// `@commandline` packages and depsolves against the new base plus them alone (RHCOS enables
/// no repositories), so a dependency the image lacks fails the transaction after the image
/// is pulled. A requirement of the variant kernel's own family is missing for certain (no
/// base carries it); anything else the image does not provide is left to the new base,
/// whose package list cannot be read before it is pulled.
fn rpm_dependencies(i: &Input<'_>) -> CheckResult {
    let id = CheckId::RpmDependencies;
    let Some(closure) = i.closure else {
        return pass(id, "no RPMs to pass");
    };
    if !closure.missing.is_empty() {
        let what: Vec<String> = closure
            .missing
            .iter()
            .map(|u| format!("nothing provides {u}"))
            .collect();
        return fail(
            id,
            format!(
                "the extensions image's RPMs are not dependency-closed: {}; rpm-ostree would fail the depsolve",
                what.join("; ")
            ),
        );
    }
    let left = if closure.from_base.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = closure
            .from_base
            .iter()
            .map(|u| u.requirement.to_string())
            .collect();
        format!("; left to the base: {}", names.join(", "))
    };
    pass(
        id,
        format!(
            "{} RPMs closed under Requires{left}",
            closure.packages.len()
        ),
    )
}

fn nic_names(i: &Input<'_>) -> CheckResult {
    let id = CheckId::NicNames;
    let crosses = matches!((i.booted_major, target_major(i.desired, i.os_image)), (Some(a), Some(b)) if a != b);
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
    use super::*;
    use crate::cluster::protocol::Inputs;

    fn desired(stream: &str) -> Desired {
        Inputs {
            stream: Some(stream.into()),
            os_image: Some(format!("quay.io/o/r@sha256:{}", "a".repeat(64))),
            ..Inputs::default()
        }
        .desired()
        .expect("valid")
        .expect("present")
    }

    struct Case {
        stream: &'static str,
        booted: Deployment,
        booted_major: Option<u32>,
        arch: &'static str,
        level: Option<u8>,
        fips: Fips,
        kernel: Result<KernelVariant, String>,
        crio: Result<String, String>,
        os: Result<OsImageInfo, String>,
        pull: OsPull,
        ext: Option<Result<ExtensionsInfo, String>>,
        closure: Option<Closure>,
        disk: DiskFree,
        foreign: Option<Deployment>,
        backend: crate::backend::BackendKind,
        policy: Policy,
        nic_persisted: bool,
        mover: Mover,
        machine_config: Option<Result<AppliedConfig, String>>,
    }

    fn base() -> Case {
        Case {
            stream: "rhel-10",
            booted: Deployment::default(),
            booted_major: Some(9),
            arch: "x86_64",
            level: Some(3),
            fips: Fips::Disabled,
            kernel: Ok(KernelVariant::Default),
            crio: Ok("crun".into()),
            os: Ok(OsImageInfo {
                bootable: true,
                stream_class: Some("rhel-10".into()),
                arch: "x86_64".into(),
                kernel_release: Some("6.12.0-124.8.1.el10_1.x86_64".into()),
                version: Some("10.1".into()),
                size: 2 << 30,
                manifest_digest: format!("sha256:{}", "b".repeat(64)),
                layered_from: None,
            }),
            pull: OsPull {
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
            ext: None,
            closure: None,
            disk: DiskFree {
                sysroot: 20 << 30,
                boot: 500 << 20,
            },
            foreign: None,
            backend: crate::backend::BackendKind::RpmOstree,
            policy: Policy::default(),
            nic_persisted: true,
            mover: Mover::Streamd,
            machine_config: None,
        }
    }

    /// A node whose `variant` kernel is layered as package overrides (as the MCO does).
    fn layer_kernel(c: &mut Case, variant: KernelVariant) {
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

    fn rt_ext(el: u32) -> ExtensionsInfo {
        let rel = if el == 10 {
            "6.12.0-124.8.1.el10_1"
        } else {
            "5.14.0-570.60.1.el9_6"
        };
        ExtensionsInfo {
            is_extensions: true,
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

    fn check(c: &Case) -> Vec<CheckResult> {
        let d = desired(c.stream);
        run(&Input {
            desired: &d,
            booted: &c.booted,
            booted_major: c.booted_major,
            arch: c.arch,
            x86_64_level: c.level,
            fips: c.fips,
            kernel: &c.kernel,
            crio_runtime: &c.crio,
            os_image: &c.os,
            os_pull: &c.pull,
            extensions: c.ext.as_ref(),
            closure: c.closure.as_ref(),
            disk: c.disk,
            nic_names_persisted: c.nic_persisted,
            foreign_staged: c.foreign.as_ref(),
            backend: c.backend,
            policy: &c.policy,
            mover: c.mover,
            machine_config: c.machine_config.as_ref(),
        })
    }

    fn failed(c: &Case) -> Vec<&'static str> {
        check(c)
            .into_iter()
            .filter(|r| r.result == Outcome::Fail)
            .map(|r| r.id.as_str())
            .collect()
    }

    /// Field failure: NIC names change between majors unless persisted first. A warning, not a
    /// refusal (the admin may know the names are stable), and only when the major changes.
    #[test]
    fn unpersisted_nic_names_warn_only_across_a_major() {
        let nic = |c: &Case| {
            check(c)
                .into_iter()
                .find(|r| r.id == CheckId::NicNames)
                .map(|r| r.result)
        };
        let mut c = base();
        assert_eq!(nic(&c), Some(Outcome::Pass));
        c.nic_persisted = false;
        assert_eq!(nic(&c), Some(Outcome::Warn));
        assert_eq!(failed(&c), Vec::<&str>::new(), "a warning does not refuse");
        c.booted_major = Some(10);
        assert_eq!(
            nic(&c),
            Some(Outcome::Pass),
            "same major: nothing to persist"
        );
    }

    /// A variant kernel from the image needs the same variant in the target and nothing from
    /// an extensions image; a layered image may move to a layered image.
    #[test]
    fn variants_and_layers_from_the_image_pass_onto_the_same() {
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        if let Ok(o) = &mut c.os {
            o.kernel_release = Some("6.12.0-124.8.1.el10_1.x86_64+rt".into());
        }
        assert_eq!(failed(&c), Vec::<&str>::new());
        let mut c = base();
        c.booted.image_labels.insert(
            LAYERED_FROM.into(),
            "quay.io/openshift/rhcos@sha256:9".into(),
        );
        if let Ok(o) = &mut c.os {
            o.layered_from = Some("quay.io/openshift/rhcos@sha256:10".into());
        }
        assert_eq!(failed(&c), Vec::<&str>::new());
    }

    #[test]
    fn default_host_passes() {
        assert_eq!(failed(&base()), Vec::<&str>::new());
        let ids: Vec<_> = check(&base()).into_iter().map(|c| c.id).collect();
        assert_eq!(
            ids,
            CheckId::ALL,
            "every check runs, in the order CheckId::ALL lists"
        );
    }

    #[test]
    fn refusals_by_table() {
        let mut cases: Vec<(&str, Case)> = Vec::new();
        // A base image for a node on an on-cluster-layered image.
        let mut c = base();
        c.booted.image_labels.insert(
            LAYERED_FROM.into(),
            "quay.io/openshift/rhcos@sha256:9".into(),
        );
        cases.push(("os-image", c));
        // A real-time kernel from the booted image, and a target with the default kernel.
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        cases.push(("kernel-variant", c));
        // … or a target that does not say its kernel.
        let mut c = base();
        c.kernel = Ok(KernelVariant::Realtime);
        if let Ok(o) = &mut c.os {
            o.kernel_release = None;
        }
        cases.push(("kernel-variant", c));
        let mut c = base();
        c.level = Some(2);
        cases.push(("cpu-level", c));
        let mut c = base();
        c.crio = Ok("runc".into());
        cases.push(("container-runtime", c));
        let mut c = base();
        c.stream = "rhel-9";
        c.booted_major = Some(10);
        if let Ok(o) = &mut c.os {
            o.stream_class = Some("rhel-9".into());
        }
        cases.push(("direction", c));
        let mut c = base();
        c.fips = Fips::Inconsistent;
        cases.push(("fips", c));
        let mut c = base();
        c.disk.sysroot = 1 << 30;
        cases.push(("disk-space", c));
        let mut c = base();
        c.disk.boot = 10 << 20;
        cases.push(("disk-space", c));
        let mut c = base();
        if let Ok(o) = &mut c.os {
            o.bootable = false;
        }
        cases.push(("os-image", c));
        let mut c = base();
        if let Ok(o) = &mut c.os {
            o.stream_class = Some("rhel-9".into());
        }
        cases.push(("os-image", c));
        for outcome in [
            AttemptOutcome::Unauthorized,
            AttemptOutcome::Blocked("quay.io".into()),
        ] {
            let mut c = base();
            c.pull.attempts[0].outcome = outcome;
            c.os = Err("refused".into());
            cases.push(("os-pull-credentials", c));
        }
        let mut c = base();
        c.pull.problem = Some("/etc/containers/policy.json rejects it".into());
        c.pull.attempts.clear();
        cases.push(("os-pull-credentials", c));
        let mut c = base();
        c.os = Err("pull secret rejected by quay.io".into());
        cases.push(("os-image", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        cases.push(("extensions-image", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.ext = Some(Ok(ExtensionsInfo {
            rpms: vec!["usbguard-1.1.3-3.el10.x86_64".into()],
            ..rt_ext(10)
        }));
        cases.push(("kernel-variant", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.ext = Some(Ok(ExtensionsInfo {
            stream_class: Some("rhel-10".into()),
            ..rt_ext(9)
        }));
        cases.push(("kernel-variant", c));
        let mut c = base();
        c.kernel = Err("overrides and running kernel disagree".into());
        cases.push(("kernel-variant", c));
        let mut c = base();
        c.booted.requested_packages = vec!["usbguard".into()];
        c.ext = Some(Ok(ExtensionsInfo {
            is_extensions: true,
            stream_class: Some("rhel-10".into()),
            rpms: vec![],
            headers: Vec::new(),
        }));
        cases.push(("layered-packages", c));
        let mut c = base();
        c.ext = Some(Ok(ExtensionsInfo {
            is_extensions: false,
            ..rt_ext(10)
        }));
        cases.push(("extensions-image", c));
        let mut c = base();
        c.foreign = Some(Deployment {
            id: "rhcos-abc.1".into(),
            staged: true,
            ..Deployment::default()
        });
        cases.push(("pending-deployment", c));
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.ext = Some(Ok(rt_ext(10)));
        c.closure = Some(Closure {
            missing: vec![crate::image::rpm::Unresolved {
                package: "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64".into(),
                requirement: crate::image::rpm::Dep::versioned(
                    "kernel-rt-modules-core-uname-r",
                    crate::image::rpm::Op::Eq,
                    "6.12.0-124.8.1.el10_1.x86_64+rt",
                ),
            }],
            ..Closure::default()
        });
        cases.push(("rpm-dependencies", c));
        let mut c = base();
        c.backend = crate::backend::BackendKind::Bootc;
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.ext = Some(Ok(rt_ext(10)));
        cases.push(("backend", c));
        let mut c = base();
        c.backend = crate::backend::BackendKind::Bootc;
        c.booted.requested_packages = vec!["usbguard".into()];
        cases.push(("backend", c));
        for (want, case) in cases {
            let f = failed(&case);
            assert!(f.contains(&want), "expected {want} to fail, failed: {f:?}");
        }
    }

    #[test]
    fn variants_pass_with_the_right_extensions() {
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.fips = Fips::Enabled;
        c.booted.requested_packages = vec!["usbguard".into()];
        c.booted.requested_local_packages =
            vec!["kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64".into()];
        c.ext = Some(Ok(rt_ext(10)));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
    }

    #[test]
    fn downgrade_allowed_by_policy_warns() {
        let mut c = base();
        c.stream = "rhel-9";
        c.booted_major = Some(10);
        if let Ok(o) = &mut c.os {
            o.stream_class = Some("rhel-9".into());
        }
        c.policy.allow_downgrade = true;
        let r = check(&c);
        assert_eq!(r[2].id, CheckId::Direction);
        assert_eq!(r[2].result, Outcome::Warn);
    }

    #[test]
    fn foreign_staged_is_named_and_replaceable_by_policy() {
        let mut c = base();
        c.foreign = Some(Deployment {
            id: "rhcos-abc.1".into(),
            staged: true,
            container_image_reference: Some("ostree-unverified-registry:quay.io/x/y:latest".into()),
            ..Deployment::default()
        });
        let r = check(&c);
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
        let r = check(&c);
        let pending = r
            .iter()
            .find(|r| r.id == CheckId::PendingDeployment)
            .expect("check");
        assert_eq!(pending.result, Outcome::Warn);
        // `ostree admin deploy` writes the pending deployment at once: not "staged".
        if let Some(d) = c.foreign.as_mut() {
            d.staged = false;
        }
        let r = check(&c);
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

    /// A real-time node whose kernel comes from its image, asked for a layered target: the
    /// label is the base's, so only a layered image built from the real-time variant passes.
    #[test]
    fn a_layered_target_keeps_a_variant_only_when_built_from_the_variant() {
        let layered_target = |release: &str| {
            let mut c = base();
            c.kernel = Ok(KernelVariant::Realtime);
            if let Ok(o) = &mut c.os {
                o.layered_from = Some("quay.io/openshift/rhcos@sha256:10".into());
                o.kernel_release = Some(release.into());
            }
            c
        };
        let c = layered_target("6.12.0-124.8.1.el10_1.x86_64");
        assert_eq!(failed(&c), vec!["kernel-variant"], "{:#?}", check(&c));
        let r = check(&c);
        let k = result(&r, "kernel-variant");
        assert!(
            k.message.contains("is its base's")
                && k.message.contains("build it from the realtime variant"),
            "{}",
            k.message
        );
        let c = layered_target("6.12.0-124.8.1.el10_1.x86_64+rt");
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
    }

    /// A node on an on-cluster-layered image: its booted image names its base.
    fn ocl(c: &mut Case) {
        c.booted.image_labels.insert(
            LAYERED_FROM.into(),
            "quay.io/openshift/rhcos@sha256:9".into(),
        );
    }

    fn result<'c>(r: &'c [CheckResult], id: &str) -> &'c CheckResult {
        r.iter().find(|c| c.id.as_str() == id).expect("check")
    }

    /// The message of check `id` for `c`.
    fn message(c: &Case, id: &str) -> String {
        result(&check(c), id).message.clone()
    }

    /// Readiness of a node the machine-config daemon manages: the machine-config operator
    /// rebuilds an on-cluster-layered image from the stream's base image, so the base image
    /// passes there, and only there (a request for a base image is still refused).
    #[test]
    fn a_base_image_for_a_layered_node_passes_only_for_the_mco() {
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
        let r = check(&c);
        let os = result(&r, "os-image");
        assert!(
            os.message.contains("machine-config operator rebuilds"),
            "{}",
            os.message
        );
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"]);
        // The other reasons of os-image still refuse the machine-config operator's move.
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        if let Ok(o) = &mut c.os {
            o.stream_class = Some("rhel-9".into());
        }
        assert_eq!(failed(&c), vec!["os-image"]);
        let mut c = base();
        ocl(&mut c);
        c.mover = Mover::MachineConfigOperator;
        c.arch = "aarch64";
        assert!(failed(&c).contains(&"os-image"));
    }

    /// An on-cluster-layered real-time node (kernel from the image, no override): the machine-
    /// config operator's build swaps the kernel from the target stream's extensions image, so
    /// that image must provide kernel-rt for the target major, as for an override-carried one.
    #[test]
    fn a_layered_realtime_node_needs_kernel_rt_in_the_extensions_image_for_the_mco() {
        let rt_ocl = |ext: Option<ExtensionsInfo>| {
            let mut c = base();
            ocl(&mut c);
            c.mover = Mover::MachineConfigOperator;
            c.kernel = Ok(KernelVariant::Realtime);
            c.ext = ext.map(Ok);
            c
        };
        let c = rt_ocl(Some(rt_ext(10)));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
        // Without kernel-rt in the extensions image.
        let c = rt_ocl(Some(ExtensionsInfo {
            rpms: vec!["usbguard-1.1.3-3.el10.x86_64".into()],
            ..rt_ext(10)
        }));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let r = check(&c);
        let k = result(&r, "kernel-variant");
        assert!(
            k.message.contains("lacks kernel-rt-core")
                && k.message.contains("machine-config operator"),
            "{}",
            k.message
        );
        // kernel-rt built for the booted major only.
        let c = rt_ocl(Some(ExtensionsInfo {
            stream_class: Some("rhel-10".into()),
            ..rt_ext(9)
        }));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        // No extensions image at all: the build would keep the base's default kernel.
        let c = rt_ocl(None);
        assert_eq!(failed(&c), vec!["extensions-image", "kernel-variant"]);
        let r = check(&c);
        let e = result(&r, "extensions-image");
        assert!(
            e.message.contains("osExtensionsImage") && !e.message.contains("desired-"),
            "{}",
            e.message
        );
        // A request (streamd's own move) for the base image is still refused.
        let mut c = rt_ocl(Some(rt_ext(10)));
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image", "kernel-variant"]);
    }

    /// Where no layered image is rebuilt, the machine-config operator's move is judged as
    /// streamd's: a variant image's real-time kernel still needs a real-time target image.
    #[test]
    fn a_variant_image_node_is_judged_the_same_for_the_mco() {
        let mut c = base();
        c.mover = Mover::MachineConfigOperator;
        c.kernel = Ok(KernelVariant::Realtime);
        c.ext = Some(Ok(rt_ext(10)));
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["kernel-variant"]);
    }

    /// A MachineConfig the machine-config daemon applied, from its JSON.
    fn applied(json: &str) -> Option<Result<AppliedConfig, String>> {
        Some(machineconfig::parse(json))
    }

    /// An extensions image for rhel-10 holding `names` (x86_64, el10).
    fn ext_with(names: &[&str]) -> ExtensionsInfo {
        ExtensionsInfo {
            rpms: names
                .iter()
                .map(|n| format!("{n}-6.12.0-124.8.1.el10_1.x86_64"))
                .collect(),
            ..rt_ext(10)
        }
    }

    /// The machine-config operator's move installs what the applied MachineConfig asks for
    /// from the extensions image, whatever the node runs now: its extensions on an
    /// on-cluster-layered node (baked into the image, no override) and its kernel type.
    #[test]
    fn the_mco_move_needs_what_the_applied_machine_config_asks_for() {
        let rt = [
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-extra",
        ];
        let ocl_mc = |json: &str, ext: &[&str]| {
            let mut c = base();
            ocl(&mut c);
            c.mover = Mover::MachineConfigOperator;
            c.machine_config = applied(json);
            c.ext = Some(Ok(ext_with(ext)));
            c
        };
        let usbguard = r#"{"spec":{"kernelType":"default","extensions":["usbguard"]}}"#;
        let c = ocl_mc(usbguard, &rt);
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", check(&c));
        let m = &message(&c, "layered-packages");
        assert!(
            m.contains("MachineConfig's spec.extensions (usbguard)")
                && m.ends_with("does not provide for the target: usbguard"),
            "{m}"
        );
        assert_eq!(failed(&ocl_mc(usbguard, &["usbguard"])), Vec::<&str>::new());
        // streamd's own move ignores the MachineConfig (and refuses the base image).
        let mut c = ocl_mc(usbguard, &rt);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"]);
        // No extensions image: the operator would have nothing to install usbguard from.
        let mut c = ocl_mc(usbguard, &[]);
        c.ext = None;
        assert_eq!(failed(&c), vec!["extensions-image", "layered-packages"]);
        let m = &message(&c, "extensions-image");
        assert!(m.contains("asks for spec.extensions usbguard"), "{m}");

        // spec.kernelType realtime on a node running the default kernel: the on-cluster build
        // installs GetPackagesForSupportedKernelType's list, kernel-rt-kvm included.
        let realtime = r#"{"spec":{"kernelType":"realtime"}}"#;
        let c = ocl_mc(realtime, &rt);
        assert_eq!(failed(&c), vec!["kernel-variant"], "{:#?}", check(&c));
        let m = &message(&c, "kernel-variant");
        assert!(
            m.contains("lacks kernel-rt-kvm for the realtime kernel the MachineConfig's spec.kernelType asks for")
                && m.contains("on-cluster build"),
            "{m}"
        );
        let all = [
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-extra",
            "kernel-rt-kvm",
        ];
        assert_eq!(failed(&ocl_mc(realtime, &all)), Vec::<&str>::new());
        // The daemon's own switchKernel (no on-cluster build) installs no kernel-rt-kvm.
        let mut c = ocl_mc(realtime, &rt);
        c.booted.image_labels.clear();
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
        c.ext = Some(Ok(ext_with(&["usbguard"])));
        assert_eq!(failed(&c), vec!["kernel-variant"]);

        // spec.kernelType default on a node whose real-time kernel the daemon layered from
        // the extensions repository (`switchKernel`: override remove, --install): the revert
        // before the OS update uninstalls it and the operator installs no kernel, so none is
        // needed from the image.
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.booted.requested_packages = std::mem::take(&mut c.booted.requested_local_packages);
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied("{}");
        c.ext = Some(Ok(ext_with(&[])));
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
        c.machine_config = None;
        assert_eq!(
            failed(&c),
            vec!["kernel-variant"],
            "unknown: read off the node"
        );
        // As local RPMs (streamd's own carry) the revert leaves them: the el9 kernel would
        // stay in the origin through the move.
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.mover = Mover::MachineConfigOperator;
        c.machine_config = applied("{}");
        c.ext = Some(Ok(ext_with(&[])));
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", check(&c));
        let m = &message(&c, "layered-packages");
        assert!(
            m.starts_with("local RPMs stay in the origin as built")
                && m.contains("(el10)")
                && m.ends_with("kernel-rt-modules-extra-5.14.0-570.60.1.el9_6.x86_64"),
            "{m}"
        );
        // The MachineConfig asks for realtime: the daemon's override remove meets the
        // removals its revert left (the issue's "Override already exists").
        c.machine_config = applied(realtime);
        c.ext = Some(Ok(ext_with(&all)));
        assert_eq!(
            failed(&c),
            vec!["kernel-variant", "layered-packages"],
            "{:#?}",
            check(&c)
        );
        let m = &message(&c, "kernel-variant");
        assert!(
            m.starts_with("the machine-config daemon's switch to the realtime kernel would fail (Override already exists)")
                && m.ends_with("before the move: kernel, kernel-core, kernel-modules, kernel-modules-core, kernel-modules-extra"),
            "{m}"
        );
        // Its own layering from the repository is reverted first: nothing to fail.
        c.booted.requested_packages = std::mem::take(&mut c.booted.requested_local_packages);
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
    }

    /// On a classic node the daemon's rebase keeps packages layered by hand in the origin: they
    /// are needed from the extensions image beside the MachineConfig's, and without a
    /// MachineConfig that makes the daemon add that repository they cannot be shown to resolve.
    #[test]
    fn packages_layered_by_hand_are_needed_through_the_mco_move() {
        let classic = |json: &str, ext: &[&str]| {
            let mut c = base();
            c.booted.requested_packages = vec!["usbguard".into(), "htop".into()];
            c.mover = Mover::MachineConfigOperator;
            c.machine_config = applied(json);
            c.ext = Some(Ok(ext_with(ext)));
            c
        };
        let usbguard = r#"{"spec":{"extensions":["usbguard"]}}"#;
        let c = classic(usbguard, &["usbguard"]);
        assert_eq!(failed(&c), vec!["layered-packages"], "{:#?}", check(&c));
        let m = message(&c, "layered-packages");
        assert!(
            m.starts_with(
                "packages layered on the node outside the MachineConfig stay in its origin"
            ) && m.ends_with("does not provide them for the target: htop"),
            "{m}"
        );
        let c = classic(usbguard, &["htop"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.contains("spec.extensions (usbguard) needs packages the extensions image does not provide for the target: usbguard")
                && !m.contains("outside the MachineConfig"),
            "{m}"
        );
        assert_eq!(
            failed(&classic(usbguard, &["usbguard", "htop"])),
            Vec::<&str>::new()
        );
        // Nothing in the MachineConfig: the daemon adds no repository for the rebase.
        let c = classic("{}", &["usbguard", "htop"]);
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.starts_with("no repository provides the packages layered outside the MachineConfig")
                && m.ends_with(": usbguard, htop"),
            "{m}"
        );
        // Local RPMs are kept as built: only those of the target's major pass.
        let mut c = classic(usbguard, &["usbguard", "htop"]);
        c.booted.requested_local_packages = vec!["tool-1.0-1.el9.x86_64".into()];
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(
            m.contains("not built for the target (el10)") && m.ends_with(": tool-1.0-1.el9.x86_64"),
            "{m}"
        );
        c.booted.requested_local_packages = vec!["tool-1.0-1.el10.x86_64".into()];
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
        // streamd's own move carries them as before.
        let mut c = classic("{}", &["usbguard", "htop"]);
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), Vec::<&str>::new(), "{:#?}", check(&c));
    }

    /// What the operator itself rejects is refused with the MachineConfig's field; an
    /// unreadable MachineConfig leaves what the operator installs unknown.
    #[test]
    fn an_applied_machine_config_the_operator_rejects_is_refused() {
        let mc = |json: &str| {
            let mut c = base();
            ocl(&mut c);
            c.mover = Mover::MachineConfigOperator;
            c.machine_config = applied(json);
            c.ext = Some(Ok(ext_with(&["usbguard"])));
            c
        };
        let c = mc(r#"{"spec":{"kernelType":"rt"}}"#);
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let m = message(&c, "kernel-variant");
        assert!(m.contains(r#"spec.kernelType "rt" is none of"#), "{m}");
        let c = mc(r#"{"spec":{"extensions":["usbguard","bogus"]}}"#);
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(m.contains(r#"does not support: "bogus""#), "{m}");
        let c = mc(r#"{"spec":{"kernelType":"64k-pages"}}"#);
        assert_eq!(failed(&c), vec!["kernel-variant"]);
        let m = message(&c, "kernel-variant");
        assert!(m.contains("exists only on aarch64"), "{m}");
        let mut c = mc("{}");
        c.machine_config = Some(Err(
            "/etc/machine-config-daemon/currentconfig: not JSON".into()
        ));
        assert_eq!(failed(&c), vec!["layered-packages"]);
        let m = message(&c, "layered-packages");
        assert!(m.starts_with("cannot read the MachineConfig"), "{m}");
        c.mover = Mover::Streamd;
        assert_eq!(failed(&c), vec!["os-image"], "streamd's move ignores it");
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
