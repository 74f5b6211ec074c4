//! A real OCI registry with real images: RPMs built with `rpmbuild`, deterministic OCI images
//! built here, pushed over the registry API into a real `docker-registry` (distribution 2.8)
//! that wants basic auth (htpasswd), or no auth at all ([`Auth::Anonymous`]).
//!
//! Layout of [`RegistryConfig::dir`]:
//!
//! | path | what |
//! | --- | --- |
//! | `cache/rpms/<stream>-<spec>-<hash>/` | built RPMs, keyed by spec content, rpmbuild version and options |
//! | `cache/os-build/` | the ostree repository and trees the OS images are committed and encapsulated from |
//! | `oci/` | OCI image layout of every image pushed at start (`index.json` names them by tag) |
//! | `registry/config.yml`, `registry/htpasswd`, `registry/storage/`, `registry/registry.log` | the registry |
//!
//! Every image lives in the repository [`REPOSITORY`]: OS images tagged with their stream
//! (`rhel-9`, `rhel-10`), extensions images tagged `<stream>-extensions`, as in a release
//! payload where both sit in one repository. Each is an OCI image index over an amd64 and an
//! arm64 image; pullspecs pin the index digest.

pub mod client;
pub mod content;
mod encapsulate;
pub mod hostile;
pub mod mirror;
pub mod node;
pub mod oci;
mod process;
pub mod rpm;
pub mod sigstore;
pub mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hyper::StatusCode;
use serde_json::json;
use tracing::info;

pub use client::Client;
pub use oci::{Arch, Entry};
pub use rpm::Rpm;

use crate::fixtures::images::{self, TestImage};
use oci::{Image, Index};
pub use process::{RegistryProcess, TlsFiles};

/// The repository every testbed image is pushed to.
pub const REPOSITORY: &str = "openshift/rhcos";
/// The registry's only user.
pub const USERNAME: &str = "testbed";

/// Where a [`Registry`] keeps its state.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Work dir: registry storage and config, htpasswd, the OCI layout and the RPM build cache
    /// (created if missing; reusing it reuses the cache and the stored blobs).
    pub dir: PathBuf,
}

/// What the registry asks of its clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Auth {
    /// Basic auth against an htpasswd file with one user ([`USERNAME`]), as a real
    /// `docker-registry` configured with `auth.htpasswd`.
    #[default]
    Htpasswd,
    /// No auth section: every client may pull.
    Anonymous,
}

/// One platform's image inside an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformImage {
    /// Its platform.
    pub arch: Arch,
    /// `sha256:…` of its manifest.
    pub digest: String,
    /// `host/repo@<manifest digest>`.
    pub pullspec: String,
    /// `sha256:…` of its config.
    pub config_digest: String,
    /// The labels in its config.
    pub labels: BTreeMap<String, String>,
}

/// An OS image as pushed: the catalog entry (with the real index digest and pullspec) and its
/// per-platform images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsImage {
    /// Catalog entry; `digest` / `pullspec` name the image index.
    pub image: TestImage,
    /// Its tag in [`REPOSITORY`].
    pub tag: String,
    /// amd64 first, then arm64.
    pub platforms: Vec<PlatformImage>,
}

/// An extensions image as pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionsImage {
    /// Stream class (`rhel-9`).
    pub stream: String,
    /// Repository without host.
    pub repository: String,
    /// Tag (`rhel-9-extensions`).
    pub tag: String,
    /// `sha256:…` of the image index.
    pub digest: String,
    /// `host/repo@<index digest>`.
    pub pullspec: String,
    /// amd64 (the x86_64 RPMs) first, then arm64 (the aarch64 RPMs).
    pub platforms: Vec<PlatformImage>,
    /// Every RPM in the image, over all platforms.
    pub rpms: Vec<Rpm>,
}

/// An image to push for a negative test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomImage {
    /// Tag in [`REPOSITORY`].
    pub tag: String,
    /// Config labels, exactly these.
    pub labels: BTreeMap<String, String>,
    /// The one layer's entries.
    pub files: Vec<Entry>,
    /// One platform: a plain manifest; several: an index over them.
    pub arches: Vec<Arch>,
}

/// A pushed custom image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedImage {
    /// `host/repo@digest`.
    pub pullspec: String,
    /// Digest of the manifest (one platform) or index.
    pub digest: String,
}

/// What [`Registry::start`] did, for timing and cache checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartStats {
    /// Specs rpmbuild ran for (0 when every RPM came from the cache).
    pub rpm_specs_built: usize,
    /// Specs in total.
    pub rpm_specs_total: usize,
    /// Blobs uploaded (0 when the storage already had them all).
    pub blobs_uploaded: usize,
    /// Time spent building RPMs (or checking the cache).
    pub rpm_time: Duration,
    /// Time spent committing and encapsulating the OS images.
    pub os_time: Duration,
    /// Time from the call until everything was pullable.
    pub total_time: Duration,
}

/// A running registry holding the testbed's images. The registry process is killed on drop.
pub struct Registry {
    dir: PathBuf,
    process: RegistryProcess,
    client: Client,
    password: String,
    images: Vec<TestImage>,
    /// The variant images ([`images::variants`]), pinned like `images`.
    variants: Vec<TestImage>,
    /// The later `rhel-10` build ([`images::update`]), pinned like `images`.
    update: TestImage,
    os_images: Vec<OsImage>,
    extensions: Vec<ExtensionsImage>,
    rpms: Vec<Rpm>,
    stats: StartStats,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

/// Where the registry started with work directory `dir` ([`RegistryConfig::dir`]) keeps blob
/// `digest` (`sha256:…`) in its filesystem storage, if it has it: tests remove or alter it to
/// see what a client does when the registry no longer serves it or serves other bytes.
pub fn stored_blob(dir: &Path, digest: &str) -> Option<PathBuf> {
    let hex = digest.strip_prefix("sha256:")?;
    let path = dir
        .join("registry/storage/docker/registry/v2/blobs/sha256")
        .join(hex.get(..2)?)
        .join(hex)
        .join("data");
    path.is_file().then_some(path)
}

fn platforms(host: &str, index: &Index) -> Vec<PlatformImage> {
    index
        .images
        .iter()
        .map(|img| PlatformImage {
            arch: img.arch,
            digest: img.manifest.digest.clone(),
            pullspec: format!("{host}/{REPOSITORY}@{}", img.manifest.digest),
            config_digest: img.config.digest.clone(),
            labels: img.labels.clone(),
        })
        .collect()
}

impl Registry {
    /// Builds (or takes from the cache) the RPMs and images, starts `docker-registry` on
    /// 127.0.0.1:<free port> with htpasswd auth, pushes every image and returns once each is
    /// pullable by digest.
    pub async fn start(cfg: RegistryConfig) -> anyhow::Result<Registry> {
        Registry::start_with(cfg, Auth::Htpasswd).await
    }

    /// [`Registry::start`] with the given client authentication.
    pub async fn start_with(cfg: RegistryConfig, auth: Auth) -> anyhow::Result<Registry> {
        let t0 = Instant::now();
        let dir = std::path::absolute(&cfg.dir)
            .with_context(|| format!("resolving {}", cfg.dir.display()))?;
        let reg_dir = dir.join("registry");
        std::fs::create_dir_all(&reg_dir)
            .with_context(|| format!("creating {}", reg_dir.display()))?;

        // Content does not depend on the host; pullspecs are filled in once the port is known.
        let catalog = images::catalog(images::DEFAULT_REGISTRY);
        let built = rpm::build_all(
            &dir.join("cache").join("rpms"),
            &content::stream_rpms(&catalog)?,
        )
        .await?;
        let rpm_time = t0.elapsed();
        let t_os = Instant::now();
        let work = dir.join("cache").join("os-build");
        let mut os = Vec::new();
        let mut ext = Vec::new();
        for img in &catalog {
            os.push((img.clone(), content::os_index(img, &work).await?));
            ext.push((img.clone(), content::extensions_index(img, &built.rpms)?));
        }
        let mut variant_os = Vec::new();
        for img in images::variants(images::DEFAULT_REGISTRY) {
            variant_os.push((content::os_index(&img, &work).await?, img));
        }
        let update = images::update(images::DEFAULT_REGISTRY);
        let update_os = (content::os_index(&update, &work).await?, update);
        let os_time = t_os.elapsed();
        let tagged: Vec<(String, &Index)> = os
            .iter()
            .map(|(img, idx)| (img.tag(), idx))
            .chain(variant_os.iter().map(|(idx, img)| (img.tag(), idx)))
            .chain(std::iter::once((
                format!("{}-update", update_os.1.stream),
                &update_os.0,
            )))
            .chain(
                ext.iter()
                    .map(|(img, idx)| (format!("{}-extensions", img.stream), idx)),
            )
            .collect();
        write_layout(&dir.join("oci"), &tagged)?;

        let password = process::random_hex(16)?;
        let htpasswd = reg_dir.join("htpasswd");
        process::write_htpasswd(&htpasswd, USERNAME, &password)?;
        let process = RegistryProcess::start(
            &reg_dir,
            (auth == Auth::Htpasswd).then_some(htpasswd.as_path()),
        )
        .await?;
        let host = process.host().to_string();
        let client = Client::new(&host, Some((USERNAME, &password)));

        let mut blobs_uploaded = 0;
        for (tag, index) in &tagged {
            blobs_uploaded += push_index(&client, tag, index)
                .await
                .with_context(|| format!("pushing {tag}\nregistry log:\n{}", process.log_tail()))?;
        }
        for (_, index) in &tagged {
            check_pullable(&client, &index.index.digest).await?;
        }

        let pinned = |img: &TestImage, idx: &Index| TestImage {
            digest: idx.index.digest.clone(),
            pullspec: format!("{host}/{REPOSITORY}@{}", idx.index.digest),
            repository: REPOSITORY.to_string(),
            ..img.clone()
        };
        let variants = variant_os
            .iter()
            .map(|(idx, img)| pinned(img, idx))
            .collect();
        let update = pinned(&update_os.1, &update_os.0);
        let os_images: Vec<OsImage> = os
            .iter()
            .map(|(img, idx)| OsImage {
                image: pinned(img, idx),
                tag: img.stream.clone(),
                platforms: platforms(&host, idx),
            })
            .collect();
        let extensions = ext
            .iter()
            .map(|(img, idx)| ExtensionsImage {
                stream: img.stream.clone(),
                repository: REPOSITORY.to_string(),
                tag: format!("{}-extensions", img.stream),
                digest: idx.index.digest.clone(),
                pullspec: format!("{host}/{REPOSITORY}@{}", idx.index.digest),
                platforms: platforms(&host, idx),
                rpms: built
                    .rpms
                    .iter()
                    .filter(|r| r.stream == img.stream)
                    .cloned()
                    .collect(),
            })
            .collect();
        let stats = StartStats {
            rpm_specs_built: built.built_specs,
            rpm_specs_total: built.total_specs,
            blobs_uploaded,
            rpm_time,
            os_time,
            total_time: t0.elapsed(),
        };
        info!(%host, ?stats, "registry ready");
        Ok(Registry {
            dir,
            process,
            client,
            password,
            images: os_images.iter().map(|o| o.image.clone()).collect(),
            variants,
            update,
            os_images,
            extensions,
            rpms: built.rpms,
            stats,
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> &str {
        self.process.host()
    }

    /// The OS images (`rhel-9` first), pullspecs pinned to their index digests.
    pub fn images(&self) -> &[TestImage] {
        &self.images
    }

    /// The real-time variant images (`rhel-9-rt`, `rhel-10-rt`), pullspecs pinned to their
    /// index digests; the fake rpm-ostreed and fake bootc can stage them too.
    pub fn variant_images(&self) -> &[TestImage] {
        &self.variants
    }

    /// The later `rhel-10` build (tag `rhel-10-update`), pinned like [`Registry::images`]; the
    /// fake rpm-ostreed and fake bootc can stage it too.
    pub fn update_image(&self) -> &TestImage {
        &self.update
    }

    /// The OS images with their per-platform manifests.
    pub fn os_images(&self) -> &[OsImage] {
        &self.os_images
    }

    /// The extensions images (`rhel-9` first).
    pub fn extensions(&self) -> &[ExtensionsImage] {
        &self.extensions
    }

    /// Every built RPM (files in the build cache), for custom images.
    pub fn rpms(&self) -> &[Rpm] {
        &self.rpms
    }

    /// The registry user.
    pub fn username(&self) -> &str {
        USERNAME
    }

    /// The registry password (random per start).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Docker config JSON with the credentials for [`Registry::host`]: the node's pull secret.
    pub fn pull_secret_json(&self) -> String {
        let auth = client::base64(format!("{USERNAME}:{}", self.password).as_bytes());
        json!({ "auths": { self.host(): { "auth": auth } } }).to_string()
    }

    /// A client authenticated as [`USERNAME`].
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The work dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What start did and how long it took.
    pub fn stats(&self) -> &StartStats {
        &self.stats
    }

    /// Pushes a single-platform (amd64) image with exactly `labels` and one layer of `files`
    /// (relative paths, mode 0644) as `REPOSITORY:name`; returns its pullspec and manifest digest.
    pub async fn push_custom(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
        files: Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<(String, String)> {
        let pushed = self
            .push_custom_image(CustomImage {
                tag: name.to_string(),
                labels,
                files: files.into_iter().map(|(p, d)| Entry::file(p, d)).collect(),
                arches: vec![Arch::Amd64],
            })
            .await?;
        Ok((pushed.pullspec, pushed.digest))
    }

    /// Pushes `image`: a plain manifest for one platform, an index for several.
    pub async fn push_custom_image(&self, image: CustomImage) -> anyhow::Result<PushedImage> {
        if !valid_tag(&image.tag) {
            bail!("invalid tag {:?}", image.tag);
        }
        let build = |arch| {
            Image::build(
                arch,
                oci::CREATED,
                image.labels.clone(),
                vec![image.files.clone()],
            )
        };
        let top = match image.arches.as_slice() {
            [] => bail!("a custom image needs at least one platform"),
            [arch] => {
                let img = build(*arch)?;
                push_image(&self.client, &img).await?;
                self.client
                    .push_manifest(REPOSITORY, &image.tag, &img.manifest)
                    .await?;
                img.manifest.digest
            }
            arches => {
                let index = Index::build(
                    arches
                        .iter()
                        .map(|&a| build(a))
                        .collect::<anyhow::Result<_>>()?,
                );
                push_index(&self.client, &image.tag, &index).await?;
                index.index.digest
            }
        };
        check_pullable(&self.client, &top).await?;
        info!(tag = %image.tag, digest = %top, "pushed custom image");
        Ok(PushedImage {
            pullspec: format!("{}/{REPOSITORY}@{top}", self.host()),
            digest: top,
        })
    }

    /// Layer files of a stream's extensions image for `arch`, keeping only the RPMs `keep`
    /// accepts (e.g. an extensions image without kernel-rt), ready for [`Registry::push_custom`].
    pub fn extensions_files(
        &self,
        stream: &str,
        arch: Arch,
        keep: impl Fn(&Rpm) -> bool,
    ) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let rpms: Vec<&Rpm> = self
            .rpms
            .iter()
            .filter(|r| r.stream == stream && r.arch == arch.rpm() && keep(r))
            .collect();
        Ok(content::extensions_files(stream, arch, &rpms)?
            .into_iter()
            .filter_map(|e| match e {
                Entry::File { path, data, .. } => Some((path, data)),
                Entry::Symlink { .. } => None,
            })
            .collect())
    }

    /// Kills the registry and waits until it has exited.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.process.stop().await
    }
}

fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
}

fn write_layout(dir: &Path, tagged: &[(String, &Index)]) -> anyhow::Result<()> {
    let refs: Vec<(&str, &oci::Blob)> =
        tagged.iter().map(|(t, i)| (t.as_str(), &i.index)).collect();
    let blobs: Vec<&oci::Blob> = tagged
        .iter()
        .flat_map(|(_, i)| i.images.iter())
        .flat_map(|img| img.blobs().chain(std::iter::once(&img.manifest)))
        .collect();
    oci::write_layout(dir, &refs, &blobs)
}

/// Pushes an image's blobs; returns how many were uploaded.
async fn push_image(client: &Client, img: &Image) -> anyhow::Result<usize> {
    let mut uploaded = 0;
    for blob in img.blobs() {
        if client.push_blob(REPOSITORY, blob).await? {
            uploaded += 1;
        }
    }
    Ok(uploaded)
}

/// Pushes every image of `index` (blobs, then manifests by digest), then the index as `tag`:
/// distribution refuses an index whose manifests it does not have.
async fn push_index(client: &Client, tag: &str, index: &Index) -> anyhow::Result<usize> {
    let mut uploaded = 0;
    for img in &index.images {
        uploaded += push_image(client, img).await?;
        client
            .push_manifest(REPOSITORY, &img.manifest.digest, &img.manifest)
            .await?;
    }
    client.push_manifest(REPOSITORY, tag, &index.index).await?;
    Ok(uploaded)
}

/// Confirms the registry serves `digest` with exactly that digest.
async fn check_pullable(client: &Client, digest: &str) -> anyhow::Result<()> {
    let accept = format!("{},{}", oci::MEDIA_INDEX, oci::MEDIA_MANIFEST);
    let r = client
        .get(
            &format!("/v2/{REPOSITORY}/manifests/{digest}"),
            Some(&accept),
        )
        .await?;
    if r.status != StatusCode::OK || oci::sha256_digest(&r.body) != digest {
        bail!("{REPOSITORY}@{digest} is not pullable: {}", r.status);
    }
    Ok(())
}
