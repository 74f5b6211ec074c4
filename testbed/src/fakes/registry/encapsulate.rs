//! OS images built the way RHCOS's are: the tree committed with real ostree (`--bootable`), then
//! encapsulated by ostree-ext (`ostree_ext::container::encapsulate`, what `rpm-ostree compose
//! container-encapsulate` runs), so the layers hold the ostree commit and the config carries
//! ostree-ext's own labels (`ostree.commit`, `ostree.final-diffid`). ostree-ext's importer
//! (0.15) refuses an image without them ("not an ostree encapsulated container").
//!
//! ostree-ext writes the config for the machine it runs on (`amd64`); the arm64 image's config
//! gets its platform afterwards, as a cross build's would have it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context as _, bail};
use ostree_ext::container::{self as ext, ImageReference, Transport};
use ostree_ext::ostree;
use serde_json::{Value, json};

use super::oci::{Arch, Blob, Entry, Image, MEDIA_CONFIG, MEDIA_LAYER_GZIP, canonical_json};

/// A package of the image and the paths it owns (prefixes of the tree's relative paths), for
/// ostree-ext's chunking: its files go to a content layer annotated with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Component {
    /// The package name (what `ostree.components` lists).
    pub(crate) name: String,
    /// Its NEVRA (ostree-ext's content identifier, as rpm-ostree makes it).
    pub(crate) nevra: String,
    /// Path prefixes it owns (`usr/share/licenses/bash/`).
    pub(crate) owns: Vec<String>,
}

/// Runs `ostree ARGS`; errors carry its stderr.
async fn run_ostree(args: &[String]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("ostree")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running ostree {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ostree {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes `files` below `tree` as an ostree tree: `etc/` goes to `usr/etc/`, where ostree keeps
/// the default configuration (ostree-ext exports it as `etc/` again).
fn write_tree(tree: &Path, files: &[Entry]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for entry in files {
        let (rel, file) = match entry {
            Entry::File { path, .. } | Entry::Symlink { path, .. } => (path, entry),
        };
        let rel = match rel.strip_prefix("etc/") {
            Some(rest) => format!("usr/etc/{rest}"),
            None => rel.clone(),
        };
        let p = tree.join(&rel);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        match file {
            Entry::File { mode, data, .. } => {
                std::fs::write(&p, data).with_context(|| format!("writing {}", p.display()))?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))
                    .with_context(|| format!("setting the mode of {}", p.display()))?;
            }
            Entry::Symlink { target, .. } => std::os::unix::fs::symlink(target, &p)
                .with_context(|| format!("linking {}", p.display()))?,
        }
    }
    Ok(())
}

/// Reads `sha256:<hex>` from the OCI layout at `dir`.
fn read_blob(dir: &Path, digest: &str) -> anyhow::Result<Vec<u8>> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("odd digest {digest}"))?;
    let p = dir.join("blobs/sha256").join(hex);
    std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
}

/// Builds the OS image for `arch` from `files` and `labels`, created at `created` (RFC 3339,
/// also the commit's timestamp at `created_unix`), in the work directory `work` (a build
/// repository kept there between calls; the tree and the OCI directory are made afresh).
///
/// libostree's objects are not `Sync`: the build runs on a thread of its own
/// ([`crate::fakes::local_thread`]).
pub(crate) async fn os_image(
    work: &Path,
    name: &str,
    arch: Arch,
    (created, created_unix): (&str, u64),
    labels: BTreeMap<String, String>,
    files: &[Entry],
    components: &[Component],
) -> anyhow::Result<Image> {
    let (work, name, created) = (work.to_path_buf(), name.to_string(), created.to_string());
    let (files, components) = (files.to_vec(), components.to_vec());
    crate::fakes::local_thread::run("the image build", move || async move {
        build(
            &work,
            &name,
            arch,
            (&created, created_unix),
            labels,
            &files,
            &components,
        )
        .await
    })
    .await
}

async fn build(
    work: &Path,
    name: &str,
    arch: Arch,
    (created, created_unix): (&str, u64),
    labels: BTreeMap<String, String>,
    files: &[Entry],
    components: &[Component],
) -> anyhow::Result<Image> {
    let repo_dir = work.join("repo");
    if !repo_dir.join("config").is_file() {
        std::fs::create_dir_all(&repo_dir)
            .with_context(|| format!("creating {}", repo_dir.display()))?;
        run_ostree(&[
            "init".into(),
            format!("--repo={}", repo_dir.display()),
            "--mode=archive".into(),
        ])
        .await?;
    }
    let tag = format!("{name}-{}", arch.oci());
    let tree = work.join(format!("tree-{tag}"));
    let _ = std::fs::remove_dir_all(&tree);
    write_tree(&tree, files)?;
    let branch = format!("testbed/{tag}");
    let mut args = vec![
        "commit".to_string(),
        format!("--repo={}", repo_dir.display()),
        format!("--branch={branch}"),
        // No parent: the branch's previous build would change the commit's checksum.
        "--parent=none".into(),
        format!("--tree=dir={}", tree.display()),
        "--consume".into(),
        "--no-xattrs".into(),
        "--owner-uid=0".into(),
        "--owner-gid=0".into(),
        "--bootable".into(),
        format!("--timestamp=@{created_unix}"),
        format!("--subject={name} {}", arch.oci()),
    ];
    if let Some(v) = labels.get("version") {
        args.push(format!("--add-metadata-string=version={v}"));
    }
    run_ostree(&args).await?;

    let oci_dir = work.join(format!("oci-{tag}"));
    let _ = std::fs::remove_dir_all(&oci_dir);
    let repo = ostree::Repo::new_for_path(&repo_dir);
    repo.open(ostree::gio::Cancellable::NONE)
        .with_context(|| format!("opening {}", repo_dir.display()))?;
    let contentmeta = content_meta(&repo, &repo_dir, &branch, components).await?;
    let mut opts = ext::ExportOpts::default();
    opts.created = Some(created.to_string());
    opts.contentmeta = Some(&contentmeta);
    let config = ext::Config {
        labels: Some(labels.into_iter().collect()),
        cmd: None,
    };
    let dest = ImageReference {
        transport: Transport::OciDir,
        name: oci_dir.display().to_string(),
    };
    ext::encapsulate(&repo, &branch, &config, Some(opts), &dest)
        .await
        .with_context(|| format!("encapsulating {branch}"))?;
    read_image(&oci_dir, arch)
}

/// What rpm-ostree names the content no package owns (coreos/rpm-ostree v2025.5
/// rust/src/container.rs `MappingBuilder::UNPACKAGED_ID`): a component like the others.
pub(crate) const UNPACKAGED: &str = "rpmostree-unpackaged-content";

/// Which package each content object of `branch` belongs to, as rpm-ostree hands it to
/// ostree-ext's chunking (`ObjectMeta`: object checksum → NEVRA; the NEVRA → package name);
/// objects no package owns go to [`UNPACKAGED`] (ostree-ext asserts that every object is
/// mapped).
async fn content_meta(
    repo: &ostree::Repo,
    repo_dir: &Path,
    branch: &str,
    components: &[Component],
) -> anyhow::Result<ostree_ext::chunking::ObjectMetaSized> {
    use ostree_ext::objectsource::{ObjectMeta, ObjectSourceMeta};
    use std::rc::Rc;
    // `ostree ls -R -C`: `-00644 0 0 SIZE CHECKSUM /PATH` for a regular file, `l00777 … CHECKSUM
    // /PATH -> TARGET` for a symbolic link; both are content objects.
    let listing = run_ostree(&[
        "ls".into(),
        format!("--repo={}", repo_dir.display()),
        "-R".into(),
        "-C".into(),
        branch.to_string(),
        "/".into(),
    ])
    .await?;
    let mut meta = ObjectMeta::default();
    let ids: Vec<Rc<str>> = components
        .iter()
        .map(|c| Rc::from(c.nevra.as_str()))
        .collect();
    let unpackaged: Rc<str> = Rc::from(UNPACKAGED);
    let named = components
        .iter()
        .zip(&ids)
        .map(|(c, id)| (id, Rc::from(c.name.as_str())))
        .chain(std::iter::once((&unpackaged, Rc::clone(&unpackaged))));
    for (id, name) in named {
        meta.set.insert(ObjectSourceMeta {
            identifier: Rc::clone(id),
            srcid: Rc::clone(&name),
            name,
            change_time_offset: 0,
            change_frequency: 0,
        });
    }
    for line in listing
        .lines()
        .filter(|l| l.starts_with('-') || l.starts_with('l'))
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(checksum), Some(path)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let owner = components
            .iter()
            .zip(&ids)
            .find(|(c, _)| c.owns.iter().any(|o| rel.starts_with(o.as_str())));
        let id = owner.map_or(&unpackaged, |(_, id)| id);
        meta.map.insert((*checksum).to_string(), Rc::clone(id));
    }
    ostree_ext::chunking::ObjectMetaSized::compute_sizes(repo, meta)
        .context("sizing the image's components")
}

/// The single image of the OCI layout at `dir`, its config set to `arch`'s platform.
fn read_image(dir: &Path, arch: Arch) -> anyhow::Result<Image> {
    let index: Value = serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)
        .context("parsing index.json")?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?;
    let mut manifest: Value = serde_json::from_slice(&read_blob(dir, digest)?)?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .context("manifest without config")?
        .to_string();
    let mut config: Value = serde_json::from_slice(&read_blob(dir, &config_digest)?)?;
    // ocidir dates each history entry with the time of the build; the image's own `created`
    // keeps the digests the same from run to run.
    let created = config["created"].clone();
    for entry in config["history"].as_array_mut().into_iter().flatten() {
        entry["created"] = created.clone();
    }
    config["architecture"] = json!(arch.oci());
    if arch == Arch::Arm64 {
        config["variant"] = json!("v8");
    }
    let labels: BTreeMap<String, String> =
        serde_json::from_value(config["config"]["Labels"].clone()).context("config labels")?;
    let config = Blob::new(MEDIA_CONFIG, canonical_json(&config));
    // ostree-ext leaves the manifest's optional `mediaType` out; registries and clients that
    // branch on it want it.
    manifest["mediaType"] = json!(super::oci::MEDIA_MANIFEST);
    manifest["config"]["digest"] = json!(config.digest);
    manifest["config"]["size"] = json!(config.data.len());
    let mut layers = Vec::new();
    for l in manifest["layers"]
        .as_array()
        .context("manifest without layers")?
    {
        if l["mediaType"] != MEDIA_LAYER_GZIP {
            bail!("unexpected layer media type {}", l["mediaType"]);
        }
        let d = l["digest"].as_str().context("layer without digest")?;
        layers.push(Blob::new(MEDIA_LAYER_GZIP, read_blob(dir, d)?));
    }
    Ok(Image {
        arch,
        labels,
        config,
        layers,
        manifest: Blob::new(super::oci::MEDIA_MANIFEST, canonical_json(&manifest)),
    })
}
