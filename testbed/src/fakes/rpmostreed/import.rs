//! The real container import: ostree-ext's `ImageImporter` (over skopeo's image proxy) pulls
//! the image from the testbed registry into the sysroot's repository, as rpm-ostree's
//! `rpmostree_sysroot_upgrader_pull_base` does for a container refspec. The commit it writes
//! (the merge commit, under the image reference's `ostree/container/image/…` ref) carries
//! ostree-ext's own metadata: `ostree.manifest-digest` (the platform manifest's digest),
//! `ostree.manifest`, `ostree.container.image-config`, `ostree.importer.version`,
//! `ostree.tar-filtered` (no `version`: rpm-ostree v2025.5 run beside the project reported the
//! same keys), which the fake reports as rpm-ostree does ([`base_meta`]).

use std::path::Path;

use anyhow::Context as _;
use ostree_ext::container::store::{ImageImporter, PrepareResult};
use ostree_ext::container::{ImageReference, OstreeImageReference, SignatureSource, Transport};
use ostree_ext::containers_image_proxy::ImageProxyConfig;
use ostree_ext::ostree;
use tracing::info;

use crate::fakes::registry::oci::Arch;

/// What rpm-ostree reads back from an image's commit for its `Deployments`.
#[derive(Debug, Clone)]
pub(crate) struct BaseMeta {
    /// The commit's whole metadata as stored (an `a{sv}` GVariant, base64): `base-commit-meta`.
    pub(crate) variant: String,
    /// `ostree.manifest-digest`: the platform manifest's digest when an index was pulled
    /// (`container-image-reference-digest`).
    pub(crate) manifest_digest: String,
    /// `ostree.container.image-config`, as stored.
    pub(crate) image_config: String,
}

/// Imports `source` (`host/repo@digest`, where the node's registries configuration sends the
/// pull, [`crate::fakes::registry::node::pull_source`]) into the repository of `sysroot`,
/// recorded under `refspec`'s image reference, with the node's auth file text `auth` (written
/// to `scratch`), choosing from an index the image of the host's RPM architecture `arch` as the
/// node's skopeo does; already present images are not fetched again.
///
/// libostree's objects are not `Sync`: the import runs on a thread of its own
/// ([`crate::fakes::local_thread`]).
pub(crate) async fn import(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    source: &str,
    auth: Option<&str>,
    arch: &str,
) -> anyhow::Result<String> {
    let (sysroot, scratch) = (sysroot.to_path_buf(), scratch.to_path_buf());
    let (refspec, source) = (refspec.to_string(), source.to_string());
    let auth = auth.map(str::to_string);
    let arch = Arch::from_rpm(arch).with_context(|| format!("no OCI architecture for {arch}"))?;
    crate::fakes::local_thread::run("the import", move || async move {
        import_here(&sysroot, &scratch, &refspec, &source, auth.as_deref(), arch).await
    })
    .await
}

/// The repository of `sysroot`, opened.
fn open_repo(sysroot: &Path) -> anyhow::Result<ostree::Repo> {
    let path = super::ostree::repo(sysroot);
    let repo = ostree::Repo::new_for_path(&path);
    repo.open(ostree::gio::Cancellable::NONE)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok(repo)
}

async fn import_here(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    source: &str,
    auth: Option<&str>,
    arch: Arch,
) -> anyhow::Result<String> {
    let repo = open_repo(sysroot)?;
    let target: OstreeImageReference = refspec
        .parse()
        .with_context(|| format!("parsing the refspec {refspec}"))?;
    let from = OstreeImageReference {
        sigverify: SignatureSource::ContainerPolicyAllowInsecure,
        imgref: ImageReference {
            transport: Transport::Registry,
            name: source.to_string(),
        },
    };
    let mut config = ImageProxyConfig::default();
    match auth {
        Some(text) => {
            std::fs::create_dir_all(scratch)
                .with_context(|| format!("creating {}", scratch.display()))?;
            let file = scratch.join("auth.json");
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
            config.authfile = Some(file);
        }
        None => config.auth_anonymous = true,
    }
    // The testbed registry speaks plain HTTP on the loopback (TLS is not modelled).
    config.insecure_skip_tls_verification = Some(true);
    // The node's skopeo picks its own platform from an index; this machine may be another.
    let mut skopeo = std::process::Command::new("skopeo");
    skopeo.args(["--override-arch", arch.oci()]);
    config.skopeo_cmd = Some(skopeo);
    let began = std::time::Instant::now();
    let mut importer = ImageImporter::new(&repo, &from, config).await?;
    importer.set_target(&target);
    // ostree-ext's bootable check compares the image's architecture with this machine's, which
    // a host played for another architecture cannot pass (a node runs its own).
    if Arch::from_rpm(std::env::consts::ARCH) == Some(arch) {
        importer.require_bootable();
    }
    let state = match importer.prepare().await? {
        PrepareResult::AlreadyPresent(state) => state,
        PrepareResult::Ready(prepared) => importer.import(prepared).await?,
    };
    let commit = state.merge_commit.clone();
    let elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    info!(%source, %commit, manifest_digest = %state.manifest_digest, elapsed_ms, "imported the image with ostree-ext");
    Ok(commit)
}

/// Removes the container images of the repository of `sysroot` that none of `origins` (the
/// deployments' `container-image-reference`s) names, then the layers no image uses: ostree-ext's
/// `remove_undeployed_images` and `gc_image_layers`, as rpm-ostree's `container_prune` runs them
/// (coreos/rpm-ostree v2025.5 rust/src/sysroot_upgrade.rs), over the fake's own deployment list
/// (libostree 2022.7 does not list a staged deployment on this unbooted sysroot). Returns the
/// images and layers removed; objects stay until a repository prune.
pub(crate) async fn prune(sysroot: &Path, origins: Vec<String>) -> anyhow::Result<(u32, u32)> {
    let sysroot = sysroot.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let repo = open_repo(&sysroot)?;
        let used: std::collections::HashSet<ImageReference> = origins
            .iter()
            .filter_map(|o| o.parse::<OstreeImageReference>().ok())
            .map(|o| o.imgref)
            .collect();
        let mut images = 0;
        for name in ostree_ext::container::store::list_images(&repo)? {
            let Ok(image) = ImageReference::try_from(name.as_str()) else {
                continue;
            };
            if !used.contains(&image) {
                ostree_ext::container::store::remove_image(&repo, &image)?;
                images += 1;
            }
        }
        let layers = ostree_ext::container::store::gc_image_layers(&repo)?;
        Ok((images, layers))
    })
    .await
    .context("the prune thread")?
}

/// The metadata of image commit `commit` in the repository of `sysroot`, read as rpm-ostree
/// reads it for `base-commit-meta` and `container-image-reference-digest`
/// (rpmostreed-deployment-utils.cxx `rpmostreed_deployment_generate_variant`).
pub(crate) fn base_meta(sysroot: &Path, commit: &str) -> anyhow::Result<BaseMeta> {
    use base64::Engine as _;
    let variant = open_repo(sysroot)?
        .load_variant(ostree::ObjectType::Commit, commit)
        .with_context(|| format!("loading commit {commit}"))?;
    let stored = variant.child_value(0);
    let meta = ostree::glib::VariantDict::new(Some(&stored));
    let string = |key: &str| -> anyhow::Result<String> {
        meta.lookup::<String>(key)?
            .with_context(|| format!("commit {commit} has no {key}"))
    };
    Ok(BaseMeta {
        variant: base64::engine::general_purpose::STANDARD.encode(stored.data_as_bytes()),
        manifest_digest: string("ostree.manifest-digest")?,
        image_config: string("ostree.container.image-config")?,
    })
}
