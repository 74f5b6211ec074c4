//! The fake's real ostree sysroot (`DIR/sysroot`), driven by the `ostree` CLI.
//!
//! Deployments are real: committed trees, `ostree admin deploy`, bootloader entries. The list
//! is read back the way libostree reads it (the entries of `boot/loader`, each `ostree=`
//! argument resolved through the `ostree/boot.N` links), so what the fake reports over D-Bus is
//! what a libostree client finds on disk.
//!
//! This `ostree` (Debian bookworm's 2022.7) never sees a test sysroot as booted, so its staging
//! (`/run/ostree/staged-deployment`) cannot be used; the fake's "staged" deployment is the
//! not-booted deployment at index 0, unless real libostree 2025 stages (`super::realstage`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tracing::debug;

use crate::fixtures::images::TestImage;

/// Every `ostree` invocation is bounded by this.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `ostree ARGS` and returns its stdout; errors name the command.
pub(crate) async fn ostree(args: &[String]) -> anyhow::Result<String> {
    let shown = format!("ostree {}", args.join(" "));
    let child = tokio::process::Command::new("ostree")
        .args(args)
        // Real deployments get the immutable flag, which would make a testbed directory
        // impossible to delete without chattr.
        .env("OSTREE_SYSROOT_DEBUG", "mutable-deployments")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running `{shown}` (is the ostree package installed?)"))?;
    let out = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
        Ok(out) => out.with_context(|| format!("waiting for `{shown}`"))?,
        Err(_) => bail!("`{shown}` did not finish within {} s", TIMEOUT.as_secs()),
    };
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    debug!(command = %shown, "ostree command done");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn arg(s: impl Into<String>) -> String {
    s.into()
}

fn sysroot_arg(sysroot: &Path) -> String {
    format!("--sysroot={}", sysroot.display())
}

/// The repository of `sysroot`.
pub(crate) fn repo(sysroot: &Path) -> PathBuf {
    sysroot.join("ostree/repo")
}

/// One deployment as found on disk, in boot order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskDeployment {
    pub(crate) osname: String,
    pub(crate) checksum: String,
    pub(crate) serial: i32,
    /// The bootloader entry's `options` (kernel arguments, including `ostree=`).
    pub(crate) options: String,
    pub(crate) title: String,
    pub(crate) linux: String,
    pub(crate) initrd: String,
    /// The entry's `version` (the highest boots first).
    pub(crate) version: String,
    /// `Some(locked)`: no bootloader entry but libostree's record of the staged deployment
    /// (real libostree staging, `libostree::read_record`) and its `locked` key.
    pub(crate) staged_locked: Option<bool>,
}

impl DiskDeployment {
    /// The kernel arguments without the ones ostree manages (`ostree=`, `init=`), i.e. what
    /// is carried to the next deployment.
    pub(crate) fn user_kargs(&self) -> Vec<String> {
        self.options
            .split_whitespace()
            .filter(|a| !a.starts_with("ostree=") && !a.starts_with("init="))
            .map(str::to_string)
            .collect()
    }

    /// `/proc/cmdline` when this entry is booted: GRUB's `BOOT_IMAGE=` then the options.
    pub(crate) fn proc_cmdline(&self) -> String {
        format!("BOOT_IMAGE=(hd0,gpt3){} {}", self.linux, self.options)
    }

    /// The boot checksum: ostree's kernel directory is `/ostree/<osname>-<bootcsum>/`.
    pub(crate) fn bootcsum(&self) -> &str {
        self.linux
            .strip_prefix("/ostree/")
            .and_then(|rest| rest.strip_prefix(self.osname.as_str()))
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.split_once('/'))
            .map_or("", |(csum, _)| csum)
    }

    /// The kernel release the entry boots (from `vmlinuz-<release>`).
    pub(crate) fn kernel_release(&self) -> String {
        self.linux
            .rsplit_once("/vmlinuz-")
            .map(|(_, r)| r.to_string())
            .unwrap_or_default()
    }
}

/// The deployments of `sysroot` in boot order; empty if it has no bootloader entries.
pub(crate) fn read_deployments(sysroot: &Path) -> anyhow::Result<Vec<DiskDeployment>> {
    let entries_dir = sysroot.join("boot/loader/entries");
    let dir = match std::fs::read_dir(&entries_dir) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", entries_dir.display())),
    };
    let mut out = Vec::new();
    for entry in dir {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "conf") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let options = field("options");
        let ostree_arg = options
            .split_whitespace()
            .find_map(|a| a.strip_prefix("ostree="))
            .with_context(|| format!("{} has no ostree= argument", path.display()))?;
        // `/ostree/boot.N/<os>/<bootcsum>/<bootserial>` links to `…/deploy/<csum>.<serial>`.
        let link = sysroot.join(ostree_arg.trim_start_matches('/'));
        let target =
            std::fs::read_link(&link).with_context(|| format!("resolving {}", link.display()))?;
        let name = target
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("odd deployment link {}", target.display()))?;
        let (checksum, serial) = name
            .rsplit_once('.')
            .with_context(|| format!("odd deployment name {name}"))?;
        let osname = ostree_arg
            .split('/')
            .nth(3)
            .with_context(|| format!("odd ostree= argument {ostree_arg}"))?;
        out.push(DiskDeployment {
            osname: osname.to_string(),
            checksum: checksum.to_string(),
            serial: serial
                .parse()
                .with_context(|| format!("odd deployment serial in {name}"))?,
            options: options.clone(),
            title: field("title"),
            linux: field("linux"),
            initrd: field("initrd"),
            version: field("version"),
            staged_locked: None,
        });
    }
    out.sort_by_key(|d| std::cmp::Reverse(d.version.parse::<u64>().unwrap_or(0)));
    Ok(out)
}

/// Creates an empty sysroot with stateroot `osname`.
pub(crate) async fn init(sysroot: &Path, osname: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(sysroot).with_context(|| format!("creating {}", sysroot.display()))?;
    ostree(&[
        arg("admin"),
        arg("init-fs"),
        arg("--modern"),
        sysroot.display().to_string(),
    ])
    .await?;
    ostree(&[
        arg("admin"),
        arg("os-init"),
        arg(osname),
        sysroot_arg(sysroot),
    ])
    .await?;
    // A test sysroot does not need durability; fsync dominates commit time otherwise.
    let config = repo(sysroot).join("config");
    let mut text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    if !text.contains("fsync=") {
        text = text.replacen("[core]\n", "[core]\nfsync=false\n", 1);
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
    }
    Ok(())
}

/// Writes the files of `image`, booting `kernel_release`, below `dir`.
pub(crate) fn write_tree(
    dir: &Path,
    image: &TestImage,
    kernel_release: &str,
) -> anyhow::Result<()> {
    let put = |rel: &str, text: &str| -> anyhow::Result<()> {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    put("usr/lib/os-release", &image.os_release())?;
    let modules = format!("usr/lib/modules/{kernel_release}");
    put(
        &format!("{modules}/vmlinuz"),
        &format!("fake kernel {kernel_release}\n"),
    )?;
    put(
        &format!("{modules}/initramfs.img"),
        &format!("fake initramfs {kernel_release}\n"),
    )?;
    // Both rhel-9 and rhel-10 images can boot in FIPS mode.
    put(
        "usr/share/crypto-policies/policies/FIPS.pol",
        "# FIPS crypto policy (testbed fixture)\nmin_rsa_size = 2048\n",
    )?;
    put(
        "usr/lib/dracut/modules.d/01fips/module-setup.sh",
        "#!/bin/bash\n# dracut fips module (testbed fixture)\ncheck() { return 255; }\n",
    )?;
    // ostree wants the default configuration in /usr/etc.
    put(
        "usr/etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/var/home/core:/bin/bash\n",
    )?;
    put("usr/etc/group", "root:x:0:\ncore:x:1000:\n")?;
    put("usr/etc/hostname", "localhost\n")?;
    put("usr/etc/machine-id", "")?;
    let link = dir.join("usr/etc/os-release");
    std::os::unix::fs::symlink("../usr/lib/os-release", &link)
        .with_context(|| format!("linking {}", link.display()))?;
    Ok(())
}

/// The ref ostree-ext keeps an imported image under: `ostree/container/image/` and the image
/// reference without its signature policy (`ostree-unverified-registry:NAME` is stored as
/// `docker://NAME`), escaped for a ref name.
pub(crate) fn image_ref(refspec: &str) -> String {
    let imgref = super::refspec::ImageRef::parse(refspec)
        .map(|r| r.image_reference())
        .unwrap_or_else(|| refspec.to_string());
    format!("ostree/container/image/{}", escape_for_ref(&imgref))
}

/// ostree-ext's ref escaping: ASCII letters, digits and `-` stay; `/` stays between an
/// alphanumeric and something more (so no empty path component appears); `_` doubles; every
/// other character becomes `_<hex code point>_`.
fn escape_for_ref(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    let mut after_alnum = false;
    while let Some(c) = chars.next() {
        let more = chars.peek().is_some();
        match c {
            c if c.is_ascii_alphanumeric() => out.push(c),
            '/' if after_alnum && more => out.push(c),
            '-' => out.push(c),
            '_' => out.push_str("__"),
            other => out.push_str(&format!("_{:02X}_", u32::from(other))),
        }
        after_alnum = c.is_ascii_alphanumeric();
    }
    out
}

/// A commit to make.
pub(crate) struct Commit<'a> {
    /// Directory with the tree; consumed (deleted) by the commit.
    pub(crate) tree: &'a Path,
    pub(crate) branch: Option<&'a str>,
    pub(crate) parent: Option<&'a str>,
    pub(crate) subject: &'a str,
    /// Seconds since the epoch.
    pub(crate) timestamp: u64,
    /// String metadata.
    pub(crate) metadata: Vec<(String, String)>,
    /// Metadata in GVariant text format (`true`, `@as ['a']`).
    pub(crate) variant_metadata: Vec<(String, String)>,
}

/// Commits a tree into the sysroot's repository; returns the checksum.
pub(crate) async fn commit(sysroot: &Path, c: &Commit<'_>) -> anyhow::Result<String> {
    let mut args = vec![
        arg("commit"),
        format!("--repo={}", repo(sysroot).display()),
        format!("--tree=dir={}", c.tree.display()),
        arg("--consume"),
        arg("--no-xattrs"),
        arg("--owner-uid=0"),
        arg("--owner-gid=0"),
        format!("--subject={}", c.subject),
        format!("--timestamp=@{}", c.timestamp),
    ];
    match c.branch {
        Some(b) => args.push(format!("--branch={b}")),
        None => args.push(arg("--orphan")),
    }
    if let Some(p) = c.parent {
        args.push(format!("--parent={p}"));
    }
    for (k, v) in &c.metadata {
        args.push(format!("--add-metadata-string={k}={v}"));
    }
    for (k, v) in &c.variant_metadata {
        args.push(format!("--add-metadata={k}={v}"));
    }
    let out = ostree(&args).await?;
    let csum = out.trim().to_string();
    if csum.len() != 64 {
        bail!("`ostree commit` printed {out:?}, not a checksum");
    }
    Ok(csum)
}

/// Deploys `checksum` as the first (next boot) deployment with exactly `kargs`, keeping
/// every other deployment; `origin` is the origin file's contents.
pub(crate) async fn deploy(
    sysroot: &Path,
    osname: &str,
    checksum: &str,
    kargs: &[String],
    origin: &str,
    scratch: &Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let origin_file = scratch.join(format!("{checksum}.origin"));
    std::fs::write(&origin_file, origin)
        .with_context(|| format!("writing {}", origin_file.display()))?;
    let mut args = vec![
        arg("admin"),
        arg("deploy"),
        sysroot_arg(sysroot),
        format!("--os={osname}"),
        arg("--retain"),
        format!("--origin-file={}", origin_file.display()),
    ];
    // The booted deployment's arguments, passed explicitly: `--karg-proc-cmdline` would read
    // the machine running the testbed.
    args.extend(kargs.iter().map(|k| format!("--karg={k}")));
    args.push(checksum.to_string());
    let result = ostree(&args).await;
    let _ = std::fs::remove_file(&origin_file);
    result.map(drop)
}

/// `ostree admin undeploy INDEX`.
pub(crate) async fn undeploy(sysroot: &Path, index: usize) -> anyhow::Result<()> {
    ostree(&[
        arg("admin"),
        arg("undeploy"),
        sysroot_arg(sysroot),
        index.to_string(),
    ])
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_refs_are_escaped_like_ostree_ext() {
        // ostree-ext's own examples.
        assert_eq!(
            escape_for_ref("localhost:5000/foo:latest"),
            "localhost_3A_5000/foo_3A_latest"
        );
        assert_eq!(
            escape_for_ref("registry:quay.io/coreos/fedora:latest"),
            "registry_3A_quay_2E_io/coreos/fedora_3A_latest"
        );
        for unchanged in ["foo", "foo/bar/baz-blah/foo"] {
            assert_eq!(escape_for_ref(unchanged), unchanged);
        }
        // `//`, a leading and a trailing `/`, `_` and a non-ASCII character.
        assert_eq!(escape_for_ref("/a//b/"), "_2F_a/_2F_b_2F_");
        assert_eq!(escape_for_ref("a_b\u{e9}"), "a__b_E9_");
        // The signature policy is not part of the ref; the registry transport prints as docker://.
        assert_eq!(
            image_ref("ostree-unverified-registry:quay.io/x/os@sha256:ab"),
            "ostree/container/image/docker_3A__2F__2F_quay_2E_io/x/os_40_sha256_3A_ab"
        );
        assert_eq!(
            image_ref("ostree-remote-image:fedora:docker://quay.io/x/os:1"),
            "ostree/container/image/docker_3A__2F__2F_quay_2E_io/x/os_3A_1"
        );
    }
}
