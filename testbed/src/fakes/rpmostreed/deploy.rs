//! What a deploy transaction writes: the origin changes a request makes, the checks the real
//! daemon's depsolve and sanity check would fail, and the real ostree deployment.

use std::path::Path;

use anyhow::Context as _;

use super::import::BaseMeta;
use super::model::{Deployment, Layering, State};
use super::ostree::{self, Commit};
use crate::fixtures::images::TestImage;
use crate::fixtures::packages::{self, EXTENSION_PACKAGES, Nevra};
use crate::fixtures::{self, Fixture, Kernel};

/// A local RPM passed by descriptor: its NEVRA, or why it could not be read.
pub(crate) type LocalRpm = Result<Nevra, String>;

/// The package modifiers and options of a deploy request.
#[derive(Debug, Default)]
pub(crate) struct PackageChanges {
    pub(crate) install_packages: Vec<String>,
    pub(crate) uninstall_packages: Vec<String>,
    pub(crate) install_local: Vec<LocalRpm>,
    pub(crate) override_remove: Vec<String>,
    pub(crate) override_reset: Vec<String>,
    pub(crate) replace_local: Vec<LocalRpm>,
    pub(crate) no_layering: bool,
    pub(crate) no_overrides: bool,
    pub(crate) idempotent: bool,
}

/// Whether `spec` (a name or a NEVRA) names package `name`.
pub(crate) fn names_package(spec: &str, name: &str) -> bool {
    spec == name || Nevra::parse(spec).is_some_and(|n| n.name == name)
}

fn package_name(spec: &str) -> String {
    Nevra::parse(spec).map_or_else(|| spec.to_string(), |n| n.name)
}

/// How the origin records a local RPM: `<sha256>:<nevra>` (`import_many_local_rpms`; the
/// real digest is the RPM header's, the fake's is the NEVRA's).
pub(crate) fn local_id(nevra: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}:{nevra}", Sha256::digest(nevra.as_bytes()))
}

/// The origin edits `deploy_transaction_execute` makes before the base is pulled, in its order,
/// applied to the origin merge deployment's layering (coreos/rpm-ostree:rust/src/treefile.rs
/// `remove_packages`, `filter_package_requests`, `add_packages_override_replace_local`; the
/// error texts are theirs). `override-remove-packages` is applied after the pull
/// ([`add_removals`]).
pub(crate) fn apply_changes(base: &Layering, c: &PackageChanges) -> Result<Layering, String> {
    let mut l = base.clone();
    if c.no_layering {
        l.requested_packages.clear();
        l.requested_local_packages.clear();
    } else {
        // One entry per request: the exact repo request, else the exact local NEVRA, else the
        // local package of that name (`remove_packages`).
        for pkg in &c.uninstall_packages {
            if let Some(i) = l.requested_packages.iter().position(|r| r == pkg) {
                l.requested_packages.remove(i);
            } else if let Some(i) = l.requested_local_packages.iter().position(|r| r == pkg) {
                l.requested_local_packages.remove(i);
            } else if let Some(i) = l
                .requested_local_packages
                .iter()
                .enumerate()
                .filter(|(_, r)| names_package(r, pkg))
                .max_by(|a, b| a.1.cmp(b.1))
                .map(|(i, _)| i)
            {
                l.requested_local_packages.remove(i);
            } else if !c.idempotent {
                return Err(format!(
                    "Package/capability '{pkg}' is not currently requested"
                ));
            }
        }
    }
    // `filter_package_requests`: a repo request or local NEVRA already present fails unless
    // the request is idempotent.
    let present = |l: &Layering, spec: &str, shown: &str| -> Result<bool, String> {
        if l.requested_packages.iter().any(|r| r == spec) {
            return match c.idempotent {
                true => Ok(true),
                false => Err(format!("Package/capability '{shown}' is already requested")),
            };
        }
        if l.requested_local_packages.iter().any(|r| r == spec) {
            return match c.idempotent {
                true => Ok(true),
                false => Err(format!("Package '{shown}' is already layered")),
            };
        }
        Ok(false)
    };
    for pkg in &c.install_packages {
        if !present(&l, pkg, pkg)? {
            l.requested_packages.push(pkg.clone());
        }
    }
    for rpm in &c.install_local {
        let nevra = rpm
            .as_ref()
            .map_err(|e| format!("Importing local package: {e}"))?
            .to_string();
        if !present(&l, &nevra, &local_id(&nevra))? {
            l.requested_local_packages.push(nevra);
        }
    }
    if c.no_overrides {
        l.requested_base_removals.clear();
        l.requested_base_local_replacements.clear();
    }
    for pkg in &c.override_reset {
        let before = l.requested_base_removals.len() + l.requested_base_local_replacements.len();
        l.requested_base_removals
            .retain(|r| r != pkg && !names_package(r, pkg) && package_name(r) != *pkg);
        l.requested_base_local_replacements
            .retain(|r| r != pkg && !names_package(r, pkg));
        if before == l.requested_base_removals.len() + l.requested_base_local_replacements.len() {
            return Err(format!("No overrides for package '{pkg}'"));
        }
    }
    for rpm in &c.replace_local {
        let nevra = rpm
            .as_ref()
            .map_err(|e| format!("Importing local package: {e}"))?
            .to_string();
        // A replacement of the same name is swapped, not refused.
        let name = package_name(&nevra);
        l.requested_base_local_replacements
            .retain(|r| package_name(r) != name);
        if l.requested_base_removals.contains(&nevra) {
            return Err(format!(
                "Override already exists for package '{}'",
                local_id(&nevra)
            ));
        }
        l.requested_base_local_replacements.push(nevra);
    }
    Ok(l)
}

/// `override-remove-packages`, once the new base is pulled: each must match one package of
/// `target` ("Package \"X\" not found") and is recorded by name; an override already in the
/// origin fails (`add_packages_override_remove`).
pub(crate) fn add_removals(
    l: &mut Layering,
    removals: &[String],
    target: &TestImage,
    arch: &str,
) -> Result<(), String> {
    let base = packages::base_packages(target, arch);
    for pkg in removals {
        let found = base
            .iter()
            .find(|n| n.name == *pkg || n.to_string() == *pkg)
            .ok_or_else(|| format!("Package \"{pkg}\" not found"))?;
        // Canonicalized to the package name before the origin is asked to add it.
        let name = found.name.clone();
        if l.requested_base_removals.contains(&name) {
            return Err(format!("Override already exists for package '{name}'"));
        }
        l.requested_base_removals.push(name);
    }
    Ok(())
}

/// `finalize_removal_overrides`: removals the new base does not have are dropped from the
/// origin ("Inactive base removals:"); returns them.
pub(crate) fn drop_inactive_removals(
    l: &mut Layering,
    target: &TestImage,
    arch: &str,
) -> Vec<String> {
    let base = packages::base_packages(target, arch);
    let (active, inactive) = l
        .requested_base_removals
        .drain(..)
        .partition(|r| base.iter().any(|n| n.name == *r));
    l.requested_base_removals = active;
    inactive
}

/// The EL major of an image (`10.1` → 10).
pub(crate) fn image_major(image: &TestImage) -> u32 {
    image
        .rhel_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// The base removals as NEVRAs of `target`'s packages (after [`drop_inactive_removals`],
/// every removal names one).
pub(crate) fn resolve_removals(l: &Layering, target: &TestImage, arch: &str) -> Vec<String> {
    let base = packages::base_packages(target, arch);
    l.requested_base_removals
        .iter()
        .filter_map(|pkg| {
            base.iter()
                .find(|n| n.name == *pkg || n.to_string() == *pkg)
        })
        .map(ToString::to_string)
        .collect()
}

/// The depsolve of the new base plus the layering. Repo packages resolve against the target's
/// extensions repository ("Packages not found: …", `rpmostree-core`); a local RPM built for
/// another EL major cannot be installed on the target base.
pub(crate) fn depsolve(l: &Layering, target: &TestImage, arch: &str) -> Result<(), String> {
    let missing: Vec<&str> = l
        .requested_packages
        .iter()
        .filter(|p| !EXTENSION_PACKAGES.contains(&p.as_str()))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(format!("Packages not found: {}", missing.join(", ")));
    }
    let major = image_major(target);
    let foreign = l
        .requested_local_packages
        .iter()
        .chain(&l.requested_base_local_replacements)
        .find(|p| {
            Nevra::parse(p)
                .and_then(|n| n.el_major())
                .is_some_and(|m| m != major)
        });
    if let Some(nevra) = foreign {
        let other = Nevra::parse(nevra).and_then(|n| n.el_major()).unwrap_or(0);
        // The frame is libdnf's `dnf_goal_depsolve` text and libsolv's problem wording, as
        // rpm-ostree reports them. The missing capability is illustrative: an el9 build
        // misses el9-only capabilities on an el10 base, and which one libsolv names first
        // varies per package; we name the release the package was built for.
        return Err(format!(
            "Could not depsolve transaction; 1 problem detected:\n \
             Problem: conflicting requests\n  \
             - nothing provides system-release(releasever) = {other} needed by {nevra} from @commandline"
        ));
    }
    // The local packages' Requires against the new base plus themselves (rpms engineer).
    super::depsolve::solve(l, target, arch)
}

/// The kernel a deployment with layering `l` of `target` boots: the variant whose `-core`
/// package is layered (its release taken from the local RPM, else the target's own), else the
/// image's kernel.
pub(crate) fn kernel_of(l: &Layering, target: &TestImage, arch: &str) -> (Kernel, String) {
    let all = l
        .requested_local_packages
        .iter()
        .chain(&l.requested_packages)
        .chain(&l.requested_base_local_replacements);
    for (variant, core) in [
        (Kernel::Realtime, "kernel-rt-core"),
        (Kernel::SixtyFourK, "kernel-64k-core"),
    ] {
        if let Some(spec) = all.clone().find(|p| names_package(p, core)) {
            let release = match Nevra::parse(spec) {
                Some(n) if n.name == core => {
                    format!(
                        "{}-{}.{}{}",
                        n.version,
                        n.release,
                        n.arch,
                        variant.release_suffix()
                    )
                }
                _ => fixtures::kernel_release(target, arch, variant),
            };
            return (variant, release);
        }
    }
    (
        Kernel::Default,
        fixtures::kernel_release(target, arch, Kernel::Default),
    )
}

/// The CPU check the real rebase fails late: RHEL 10's glibc refuses to start on a CPU below
/// x86-64-v3 when rpm-ostree runs `/usr/bin/true` in the new root. The texts are from
/// okd-project/okd#2275: the glibc line goes to the journal (the child's stderr), the
/// transaction fails with the sanity-check error.
pub(crate) fn sanity_check(
    host_root: Option<&Path>,
    target: &TestImage,
) -> Result<(), [String; 2]> {
    const V3: [&str; 9] = [
        "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
    ];
    if image_major(target) < 10 {
        return Ok(());
    }
    let Some(root) = host_root else { return Ok(()) };
    let Ok(cpuinfo) = std::fs::read_to_string(root.join("proc/cpuinfo")) else {
        return Ok(());
    };
    let flags: Option<Vec<&str>> = cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "flags").then(|| value.split_whitespace().collect())
    });
    // No flags line: not x86 (aarch64 has Features), nothing to check.
    let Some(flags) = flags else { return Ok(()) };
    if V3.iter().all(|f| flags.contains(f)) {
        return Ok(());
    }
    Err([
        "Fatal glibc error: CPU does not support x86-64-v3".to_string(),
        "Sanity-checking final rootfs: bwrap(/usr/bin/true): Child process exited with code 127"
            .to_string(),
    ])
}

/// The marker a `low-disk` host root has: `HOST/run/testbed/low-disk`.
pub(crate) fn low_disk(host_root: Option<&Path>) -> bool {
    host_root.is_some_and(|r| r.join("run/testbed/low-disk").exists())
}

/// The origin file of a container deployment with `l` (rpm-ostree's keys).
pub(crate) fn origin_file(refspec: &str, l: &Layering) -> String {
    let mut s = format!("[origin]\ncontainer-image-reference={refspec}\n");
    let list = |v: &[String], f: &dyn Fn(&String) -> String| {
        v.iter().map(|x| format!("{};", f(x))).collect::<String>()
    };
    let local = |n: &String| local_id(n);
    if !l.requested_packages.is_empty() || !l.requested_local_packages.is_empty() {
        s.push_str("\n[packages]\n");
        if !l.requested_packages.is_empty() {
            s.push_str(&format!(
                "requested={}\n",
                list(&l.requested_packages, &|x| x.clone())
            ));
        }
        if !l.requested_local_packages.is_empty() {
            s.push_str(&format!(
                "requested-local={}\n",
                list(&l.requested_local_packages, &local)
            ));
        }
    }
    if !l.requested_base_removals.is_empty() || !l.requested_base_local_replacements.is_empty() {
        s.push_str("\n[overrides]\n");
        if !l.requested_base_removals.is_empty() {
            s.push_str(&format!(
                "remove={}\n",
                list(&l.requested_base_removals, &|x| x.clone())
            ));
        }
        if !l.requested_base_local_replacements.is_empty() {
            s.push_str(&format!(
                "replace-local={}\n",
                list(&l.requested_base_local_replacements, &local)
            ));
        }
    }
    s
}

/// Everything needed to write one deployment.
pub(crate) struct NewDeployment<'a> {
    pub(crate) osname: &'a str,
    pub(crate) refspec: &'a str,
    pub(crate) image: &'a TestImage,
    pub(crate) arch: &'a str,
    pub(crate) layering: Layering,
    pub(crate) base_removals: Vec<String>,
    pub(crate) kargs: Vec<String>,
    /// Write the default kernel whatever is layered (the `drop-variant-next` knob).
    pub(crate) drop_variant: bool,
    /// The kernel the image itself carries: the image's own ([`TestImage::variant`]), or a
    /// variant for a host booted from a variant image (the `realtime-image` fixture).
    pub(crate) image_kernel: Kernel,
    /// The node's host root, when the image is imported from its registry (see
    /// [`commit_image`]).
    pub(crate) host_root: Option<&'a Path>,
}

/// The image's commit (the import result), under its ostree-ext ref. A node that pulls from
/// the network (`host_root` has a registries configuration) imports the image for real, with
/// ostree-ext from the endpoint its configuration chooses ([`super::import`]); the catalog
/// images of a host without one (no registry serves them) are committed from their description,
/// with the keys ostree-ext would write.
pub(crate) async fn commit_image(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    image: &TestImage,
    arch: &str,
    kernel: Kernel,
    host_root: Option<&Path>,
) -> anyhow::Result<String> {
    Ok(
        import_or_commit(sysroot, scratch, refspec, image, arch, kernel, host_root)
            .await?
            .0,
    )
}

/// [`commit_image`], and whether the import was real.
async fn import_or_commit(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    image: &TestImage,
    arch: &str,
    kernel: Kernel,
    host_root: Option<&Path>,
) -> anyhow::Result<(String, bool)> {
    if let Some(root) = host_root.filter(|r| crate::fakes::registry::node::pulls_from_network(r)) {
        let (source, auth) = crate::fakes::registry::node::pull_source(root, &image.pullspec)
            .await
            .map_err(anyhow::Error::msg)?;
        let commit =
            super::import::import(sysroot, scratch, refspec, &source, auth.as_deref(), arch)
                .await?;
        return Ok((commit, true));
    }
    let tree = scratch.join("tree-base");
    let _ = std::fs::remove_dir_all(&tree);
    ostree::write_tree(&tree, image, &fixtures::kernel_release(image, arch, kernel))?;
    let branch = ostree::image_ref(refspec);
    let checksum = ostree::commit(
        sysroot,
        &Commit {
            tree: &tree,
            branch: Some(&branch),
            parent: None,
            subject: &format!("import {}", image.pullspec),
            timestamp: image.created_unix(),
            metadata: vec![
                ("ostree.manifest-digest".into(), image.digest.clone()),
                // ostree-ext reads every deployment's manifest when it prunes image layers
                // after an import; an image commit without one fails the import.
                ("ostree.manifest".into(), synthetic_manifest(image)),
                ("ostree.container.image-config".into(), image.config_json()),
                ("version".into(), image.version.clone()),
            ],
            variant_metadata: vec![("ostree.bootable".into(), "true".into())],
        },
    )
    .await?;
    Ok((checksum, false))
}

/// An OCI manifest for a commit made from the catalog: no layers, a config descriptor named
/// after the image's config.
fn synthetic_manifest(image: &TestImage) -> String {
    use sha2::{Digest, Sha256};
    let config = image.config_json();
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{:x}", Sha256::digest(config.as_bytes())),
            "size": config.len(),
        },
        "layers": [],
    })
    .to_string()
}

/// The tree of a layered commit on `base`: the imported commit checked out (copies, not links
/// into the repository) with its kernel replaced by `kernel` when that differs, as the
/// layering of a kernel package replaces `/usr/lib/modules/<release>`.
async fn layered_tree_on(
    sysroot: &Path,
    tree: &Path,
    base: &str,
    image: &TestImage,
    kernel: &str,
) -> anyhow::Result<()> {
    ostree::ostree(&[
        "checkout".into(),
        format!("--repo={}", ostree::repo(sysroot).display()),
        "--force-copy".into(),
        base.to_string(),
        tree.display().to_string(),
    ])
    .await?;
    let modules = tree.join("usr/lib/modules");
    if modules.join(kernel).is_dir() {
        return Ok(());
    }
    let old =
        std::fs::read_dir(&modules).with_context(|| format!("reading {}", modules.display()))?;
    for entry in old {
        let p = entry?.path();
        std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    // The fake's kernel files, as [`ostree::write_tree`] writes them for `kernel`.
    let scratch = tree.with_extension("kernel");
    let _ = std::fs::remove_dir_all(&scratch);
    ostree::write_tree(&scratch, image, kernel)?;
    let from = scratch.join("usr/lib/modules").join(kernel);
    std::fs::rename(&from, modules.join(kernel))
        .with_context(|| format!("moving {}", from.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Commits (the image, plus a layered commit if `d.layering` asks for one) and deploys it as
/// the first deployment; returns the deployment as recorded in the side file (not yet joined
/// with its bootloader entry).
pub(crate) async fn write_deployment(
    sysroot: &Path,
    scratch: &Path,
    d: NewDeployment<'_>,
) -> anyhow::Result<Deployment> {
    let commit = commit_deployment(sysroot, scratch, &d).await?;
    ostree::deploy(
        sysroot,
        d.osname,
        &commit.checksum,
        &d.kargs,
        &origin_file(d.refspec, &d.layering),
        scratch,
    )
    .await?;
    let disk = ostree::read_deployments(sysroot)?;
    let first = disk
        .first()
        .filter(|f| f.checksum == commit.checksum)
        .context("the new deployment is not first on disk")?;
    Ok(new_deployment(d, first.serial, commit))
}

/// What [`commit_deployment`] made: the commit a deployment checks out, its base when layered,
/// and what the image's commit stores (ostree-ext's keys after a real import).
pub(crate) struct DeploymentCommit {
    /// The commit checked out.
    pub(crate) checksum: String,
    /// The image's commit under a client layer.
    pub(crate) base_checksum: Option<String>,
    /// The image commit's metadata.
    pub(crate) base_meta: BaseMeta,
}

/// The model of deployment `commit`.`serial` written for `d`.
pub(crate) fn new_deployment(
    d: NewDeployment<'_>,
    serial: i32,
    commit: DeploymentCommit,
) -> Deployment {
    let mut dep = Deployment::new(d.osname, d.refspec, d.image, &commit.checksum, serial);
    dep.base_checksum = commit.base_checksum;
    // What the real daemon reports is read back from the image's commit: after a real import,
    // the platform manifest's digest (not the index the refspec pins) and ostree-ext's keys.
    dep.container_image_reference_digest = commit.base_meta.manifest_digest;
    dep.image_config = commit.base_meta.image_config;
    dep.base_commit_meta = Some(commit.base_meta.variant);
    dep.base_removals = d.base_removals;
    dep.layering = d.layering;
    dep
}

/// The commit a deployment of `d` checks out: the image's (imported), or the client layer
/// over it; with the base commit when layered.
pub(crate) async fn commit_deployment(
    sysroot: &Path,
    scratch: &Path,
    d: &NewDeployment<'_>,
) -> anyhow::Result<DeploymentCommit> {
    let (base, imported) = import_or_commit(
        sysroot,
        scratch,
        d.refspec,
        d.image,
        d.arch,
        d.image_kernel,
        d.host_root,
    )
    .await?;
    let (checksum, base_checksum) = if d.layering.is_layered() {
        let (_, mut kernel) = kernel_of(&d.layering, d.image, d.arch);
        if d.drop_variant {
            kernel = fixtures::kernel_release(d.image, d.arch, Kernel::Default);
        }
        let tree = scratch.join("tree-layered");
        let _ = std::fs::remove_dir_all(&tree);
        if imported {
            layered_tree_on(sysroot, &tree, &base, d.image, &kernel).await?;
        } else {
            ostree::write_tree(&tree, d.image, &kernel)?;
        }
        let packages = format!(
            "[{}]",
            d.layering
                .requested_packages
                .iter()
                .map(|p| format!("'{p}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let layered = ostree::commit(
            sysroot,
            &Commit {
                tree: &tree,
                branch: None,
                parent: Some(&base),
                subject: "rpm-ostree client layer",
                timestamp: d.image.created_unix(),
                metadata: vec![("version".into(), d.image.version.clone())],
                variant_metadata: vec![
                    ("rpmostree.clientlayer".into(), "true".into()),
                    ("rpmostree.packages".into(), format!("@as {packages}")),
                ],
            },
        )
        .await?;
        (layered, Some(base))
    } else {
        (base, None)
    };
    let base_meta =
        super::import::base_meta(sysroot, base_checksum.as_deref().unwrap_or(&checksum))?;
    Ok(DeploymentCommit {
        checksum,
        base_checksum,
        base_meta,
    })
}

/// A fresh sysroot booted into `image` the way `fixture` describes.
pub(crate) async fn create_initial(
    sysroot: &Path,
    scratch: &Path,
    osname: &str,
    image: &TestImage,
    fixture: &Fixture,
    host_root: Option<&Path>,
) -> anyhow::Result<State> {
    ostree::init(sysroot, osname).await?;
    // An on-cluster-layered image carries the base's labels and the layering's own.
    let layered;
    let image = if fixture.layered_image {
        layered = image.layered();
        &layered
    } else {
        image
    };
    let layering = Layering {
        requested_packages: fixture.requested_packages(),
        requested_local_packages: fixture.local_packages(image),
        requested_base_removals: fixture.base_removals(),
        requested_base_local_replacements: Vec::new(),
    };
    let base_removals = resolve_removals(&layering, image, fixture.arch());
    let refspec = format!("ostree-unverified-registry:{}", image.pullspec);
    let mut dep = write_deployment(
        sysroot,
        scratch,
        NewDeployment {
            osname,
            refspec: &refspec,
            image,
            arch: fixture.arch(),
            layering,
            base_removals,
            kargs: fixture.kargs(),
            drop_variant: false,
            image_kernel: if fixture.kernel_from_image {
                fixture.kernel
            } else {
                image.variant
            },
            // Imported as any other image, unless the booted kernel is a variant the image does
            // not carry (a host booted from a variant image the catalog entry stands for), or
            // it is an on-cluster build of the image no registry serves.
            host_root: host_root.filter(|_| {
                !fixture.layered_image
                    && (!fixture.kernel_from_image || fixture.kernel == image.variant)
            }),
        },
    )
    .await?;
    dep.booted = true;
    let side = State {
        deployments: vec![dep],
        reboot_requested: false,
    };
    Ok(State::join(&ostree::read_deployments(sysroot)?, side))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};

    fn rt_booted() -> Layering {
        let images = catalog(DEFAULT_REGISTRY);
        let f = fixtures::fixture("realtime").expect("rt");
        Layering {
            requested_packages: Vec::new(),
            requested_local_packages: f.local_packages(&images[0]),
            requested_base_removals: f.base_removals(),
            requested_base_local_replacements: Vec::new(),
        }
    }

    #[test]
    fn carried_el9_kernel_overrides_fail_the_el10_depsolve() {
        let images = catalog(DEFAULT_REGISTRY);
        let carried = apply_changes(&rt_booted(), &PackageChanges::default()).expect("apply");
        let err = depsolve(&carried, &images[1], "x86_64").expect_err("el9 kernel-rt on el10");
        assert!(
            err.starts_with("Could not depsolve transaction; 1 problem detected:\n Problem: "),
            "{err}"
        );
        assert!(
            err.contains("kernel-rt-core-5.14.0-570.60.1.el9_6.x86_64"),
            "{err}"
        );
        assert_eq!(depsolve(&carried, &images[0], "x86_64"), Ok(()));

        // Resetting the overrides and swapping in el10 kernel-rt RPMs solves.
        let el10: Vec<LocalRpm> = [
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-rt-modules-core",
            "kernel-rt-modules-extra",
        ]
        .iter()
        .map(|n| Ok(Nevra::parse(&format!("{n}-6.12.0-124.8.1.el10_1.x86_64")).expect("n")))
        .collect();
        let changes = PackageChanges {
            uninstall_packages: vec![
                "kernel-rt-core".into(),
                "kernel-rt-modules".into(),
                "kernel-rt-modules-core".into(),
                "kernel-rt-modules-extra".into(),
            ],
            install_local: el10,
            ..PackageChanges::default()
        };
        let swapped = apply_changes(&rt_booted(), &changes).expect("apply");
        assert_eq!(depsolve(&swapped, &images[1], "x86_64"), Ok(()));
        assert_eq!(
            kernel_of(&swapped, &images[1], "x86_64"),
            (
                Kernel::Realtime,
                "6.12.0-124.8.1.el10_1.x86_64+rt".to_string()
            )
        );
        assert_eq!(
            resolve_removals(&swapped, &images[1], "x86_64")[0],
            "kernel-6.12.0-124.8.1.el10_1.x86_64"
        );
    }

    #[test]
    fn origin_edit_errors() {
        let reset = PackageChanges {
            override_reset: vec!["glibc".into()],
            ..PackageChanges::default()
        };
        assert_eq!(
            apply_changes(&rt_booted(), &reset),
            Err("No overrides for package 'glibc'".to_string())
        );
        let uninstall = PackageChanges {
            uninstall_packages: vec!["usbguard".into()],
            ..PackageChanges::default()
        };
        assert_eq!(
            apply_changes(&Layering::default(), &uninstall),
            Err("Package/capability 'usbguard' is not currently requested".to_string())
        );
        let images = catalog(DEFAULT_REGISTRY);
        assert_eq!(
            add_removals(
                &mut Layering::default(),
                &["nano".into()],
                &images[1],
                "x86_64"
            ),
            Err("Package \"nano\" not found".to_string())
        );
        let l = Layering {
            requested_packages: vec!["usbguard".into(), "htop".into()],
            ..Layering::default()
        };
        assert_eq!(
            depsolve(&l, &images[1], "x86_64"),
            Err("Packages not found: htop".to_string())
        );
    }

    /// coreos/rpm-ostree:rust/src/treefile.rs `remove_packages`, `filter_package_requests`,
    /// `add_packages_override_remove`; rpmostree-sysroot-upgrader.cxx
    /// `finalize_removal_overrides`.
    #[test]
    fn origin_edits_as_rpm_ostree_makes_them() {
        let images = catalog(DEFAULT_REGISTRY);
        let el9 = "usbguard-1.1.3-1.el9.x86_64";
        let el9_newer = "usbguard-1.1.4-1.el9.x86_64";
        let nevra = |s: &str| Ok(Nevra::parse(s).expect("nevra"));
        let both = Layering {
            requested_packages: vec!["usbguard".into()],
            requested_local_packages: vec![el9.into(), el9_newer.into()],
            ..Layering::default()
        };
        // One entry per request: the repo request first, then one local package by name.
        let once = PackageChanges {
            uninstall_packages: vec!["usbguard".into()],
            ..PackageChanges::default()
        };
        let l = apply_changes(&both, &once).expect("uninstall");
        assert_eq!(l.requested_packages, Vec::<String>::new());
        assert_eq!(l.requested_local_packages, [el9, el9_newer]);
        let twice = PackageChanges {
            uninstall_packages: vec!["usbguard".into(), "usbguard".into()],
            ..PackageChanges::default()
        };
        let l = apply_changes(&both, &twice).expect("uninstall");
        assert_eq!(l.requested_local_packages, [el9]);

        // A local RPM already layered, exactly: refused unless idempotent.
        let again = PackageChanges {
            install_local: vec![nevra(el9)],
            ..PackageChanges::default()
        };
        assert_eq!(
            apply_changes(&both, &again),
            Err(format!("Package '{}' is already layered", local_id(el9)))
        );
        let idempotent = PackageChanges {
            idempotent: true,
            ..again
        };
        assert_eq!(apply_changes(&both, &idempotent), Ok(both.clone()));
        // Uninstalled and installed again in one request is fine (removals come first).
        let swap = PackageChanges {
            uninstall_packages: vec![el9.into()],
            install_local: vec![nevra(el9)],
            ..PackageChanges::default()
        };
        assert!(apply_changes(&both, &swap).is_ok());

        // An override already in the origin cannot be added again.
        let mut removed = Layering {
            requested_base_removals: vec!["kernel".into()],
            ..Layering::default()
        };
        assert_eq!(
            add_removals(
                &mut removed.clone(),
                &["kernel".into()],
                &images[1],
                "x86_64"
            ),
            Err("Override already exists for package 'kernel'".to_string())
        );
        add_removals(&mut removed, &["dracut".into()], &images[1], "x86_64").expect("new");
        assert_eq!(removed.requested_base_removals, ["kernel", "dracut"]);

        // Inherited removals the new base lacks are dropped, the others kept.
        let mut inherited = Layering {
            requested_base_removals: vec!["kernel".into(), "dhcp-client".into()],
            ..Layering::default()
        };
        assert_eq!(
            drop_inactive_removals(&mut inherited, &images[1], "x86_64"),
            ["dhcp-client"]
        );
        assert_eq!(inherited.requested_base_removals, ["kernel"]);
    }
}
