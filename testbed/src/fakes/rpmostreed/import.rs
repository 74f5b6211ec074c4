//! The real container import: ostree-ext's `ImageImporter` (over skopeo's image proxy) pulls
//! the image from the testbed registry into the sysroot's repository, as rpm-ostree's
//! `rpmostree_sysroot_upgrader_pull_base` does for a container refspec. The commit it writes
//! (the merge commit, under the image reference's `ostree/container/image/…` ref) carries
//! ostree-ext's own metadata: `ostree.manifest-digest` (the platform manifest's digest),
//! `ostree.manifest`, `ostree.container.image-config`, `ostree.importer.version`, and the
//! encapsulated commit's `version`, `ostree.bootable`, `ostree.linux`.

use std::path::Path;

use anyhow::Context as _;
use ostree_ext::container::store::{ImageImporter, PrepareResult};
use ostree_ext::container::{ImageReference, OstreeImageReference, SignatureSource, Transport};
use ostree_ext::containers_image_proxy::ImageProxyConfig;
use ostree_ext::ostree;
use tracing::info;

/// What an import wrote.
#[derive(Debug, Clone)]
pub(crate) struct Imported {
    /// The merge commit, which a deployment of the image checks out.
    pub(crate) commit: String,
    /// `ostree.container.image-config` of the commit, as stored.
    pub(crate) image_config: String,
}

/// Imports `source` (`host/repo@digest`, where the node's registries configuration sends the
/// pull, [`crate::fakes::registry::node::pull_source`]) into the repository of `sysroot`,
/// recorded under `refspec`'s image reference, with the node's auth file text `auth` (written
/// to `scratch`); already present images are not fetched again.
///
/// libostree's objects are not `Sync`: the import runs on a thread of its own
/// ([`crate::fakes::local_thread`]).
pub(crate) async fn import(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    source: &str,
    auth: Option<&str>,
) -> anyhow::Result<Imported> {
    let (sysroot, scratch) = (sysroot.to_path_buf(), scratch.to_path_buf());
    let (refspec, source) = (refspec.to_string(), source.to_string());
    let auth = auth.map(str::to_string);
    crate::fakes::local_thread::run("the import", move || async move {
        import_here(&sysroot, &scratch, &refspec, &source, auth.as_deref()).await
    })
    .await
}

async fn import_here(
    sysroot: &Path,
    scratch: &Path,
    refspec: &str,
    source: &str,
    auth: Option<&str>,
) -> anyhow::Result<Imported> {
    let repo_path = super::ostree::repo(sysroot);
    let repo = ostree::Repo::new_for_path(&repo_path);
    repo.open(ostree::gio::Cancellable::NONE)
        .with_context(|| format!("opening {}", repo_path.display()))?;
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
    let began = std::time::Instant::now();
    let mut importer = ImageImporter::new(&repo, &from, config).await?;
    importer.set_target(&target);
    importer.require_bootable();
    let state = match importer.prepare().await? {
        PrepareResult::AlreadyPresent(state) => state,
        PrepareResult::Ready(prepared) => importer.import(prepared).await?,
    };
    let commit = state.merge_commit.clone();
    let image_config = image_config(&repo, &commit)?;
    let elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    info!(%source, %commit, manifest_digest = %state.manifest_digest, elapsed_ms, "imported the image with ostree-ext");
    Ok(Imported {
        commit,
        image_config,
    })
}

/// `ostree.container.image-config` of `commit`, as streamd's reader finds it.
fn image_config(repo: &ostree::Repo, commit: &str) -> anyhow::Result<String> {
    let variant = repo
        .load_variant(ostree::ObjectType::Commit, commit)
        .with_context(|| format!("loading commit {commit}"))?;
    let meta = ostree::glib::VariantDict::new(Some(&variant.child_value(0)));
    meta.lookup::<String>("ostree.container.image-config")?
        .context("the imported commit has no ostree.container.image-config")
}
