//! RPMs built with the real `rpmbuild`: the kernel-rt / kernel-64k subpackages and an extension
//! (`usbguard`) for each stream, with RHEL's names, versions and file layout and placeholder
//! contents. Builds are reproducible and cached by the hash of what goes into them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};
use tokio::process::Command;
use tracing::{debug, info};

use super::oci::SOURCE_DATE_EPOCH;

/// How long one `rpmbuild` may take before it is killed.
const RPMBUILD_TIMEOUT: Duration = Duration::from_secs(120);
/// Bumped when the way specs are turned into RPMs changes, to invalidate old caches.
const CACHE_SCHEMA: &str = "testbed-rpms-v3";

/// One built RPM file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rpm {
    /// Stream it belongs to (`rhel-9`, `rhel-10`).
    pub stream: String,
    /// `%{NAME}`, e.g. `kernel-rt-core`.
    pub name: String,
    /// `%{VERSION}`, e.g. `5.14.0`.
    pub version: String,
    /// `%{RELEASE}`, e.g. `570.60.1.el9_6`.
    pub release: String,
    /// `%{ARCH}`: `x86_64` or `aarch64`.
    pub arch: String,
    /// The file in the build cache.
    pub path: PathBuf,
    /// `sha256:<hex>` of the file.
    pub digest: String,
}

impl Rpm {
    /// `name-version-release.arch`.
    pub fn nevra(&self) -> String {
        format!(
            "{}-{}-{}.{}",
            self.name, self.version, self.release, self.arch
        )
    }

    /// `name-version-release.arch.rpm`, the file name rpmbuild gives it.
    pub fn file_name(&self) -> String {
        format!("{}.rpm", self.nevra())
    }
}

/// What one stream's packages are versioned as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRpms {
    /// Stream name (`rhel-9`).
    pub stream: String,
    /// Kernel `VERSION-RELEASE` without arch, e.g. `5.14.0-570.60.1.el9_6`.
    pub kernel: String,
    /// usbguard `VERSION-RELEASE`, e.g. `1.1.3-1.el9`.
    pub usbguard: String,
    /// kata-containers `VERSION-RELEASE` (an el9 build in every stream).
    pub kata: String,
}

/// One spec file and the binary packages it produces.
#[derive(Debug, Clone)]
struct Spec {
    stream: String,
    name: String,
    target: &'static str,
    text: String,
    packages: Vec<(String, String, String)>,
}

fn split_evr(evr: &str) -> anyhow::Result<(&str, &str)> {
    evr.split_once('-')
        .with_context(|| format!("{evr:?} is not VERSION-RELEASE"))
}

/// The spec lines of subpackage `sub` of `kernel-<flavor>`: kernel.spec's dependencies
/// ([`crate::fixtures::packages::kernel_subpackage_deps`]) and, as there, `AutoReq: no`.
fn kernel_deps(flavor: &str, sub: &str, kver: &str) -> String {
    let mut out: String = crate::fixtures::packages::kernel_subpackage_deps(flavor, sub, kver)
        .iter()
        .map(|(kind, dep)| format!("{kind}: {dep}\n"))
        .collect();
    out.push_str("AutoReq: no\n");
    out
}

/// The `kernel-<flavor>` spec: only subpackages have `%files`, so rpmbuild produces no
/// `kernel-<flavor>` meta-package (nothing should install it).
fn kernel_spec(
    s: &StreamRpms,
    flavor: &str,
    target: &'static str,
    subs: &[&str],
) -> anyhow::Result<Spec> {
    let (version, release) = split_evr(&s.kernel)?;
    let name = format!("kernel-{flavor}");
    let kver = format!("{version}-{release}.{target}+{flavor}");
    let config_line = match flavor {
        "rt" => "CONFIG_PREEMPT_RT=y",
        _ => "CONFIG_ARM64_64K_PAGES=y",
    };
    let mut text = format!(
        "Name: {name}\nVersion: {version}\nRelease: {release}\n\
         Summary: The Linux kernel, {flavor} variant (streamd testbed placeholder)\n\
         License: GPL-2.0-only\nURL: https://www.kernel.org/\nExclusiveArch: {target}\n\n\
         %description\nPlaceholder with the package names, versions and file layout of RHEL's \
         {name}; the files are not a kernel.\n"
    );
    let mut install = format!("mkdir -p %{{buildroot}}/usr/lib/modules/{kver}\n");
    let mut files = String::new();
    let mut packages = Vec::new();
    for sub in subs {
        let pkg = format!("{name}-{sub}");
        text.push_str(&format!("\n%package {sub}\nSummary: {pkg} (placeholder)\n"));
        text.push_str(&kernel_deps(flavor, sub, &kver));
        text.push_str(&format!(
            "\n%description {sub}\nPlaceholder {pkg} for {kver}.\n"
        ));
        let owned: &[(&str, String)] = &match *sub {
            "core" => vec![
                ("vmlinuz", format!("testbed placeholder vmlinuz {kver}\n")),
                (
                    "config",
                    format!("# Linux/{target} {version} Kernel Configuration\n{config_line}\n"),
                ),
            ],
            "modules-core" => vec![("modules.builtin", "kernel/testbed/placeholder.ko\n".into())],
            "modules" => vec![("modules.order", "kernel/testbed/placeholder.ko\n".into())],
            _ => vec![("modules.extra", "kernel/testbed/extra.ko\n".into())],
        };
        files.push_str(&format!("\n%files {sub}\n"));
        for (file, content) in owned {
            install.push_str(&format!(
                "printf '%%s' '{content}' > %{{buildroot}}/usr/lib/modules/{kver}/{file}\n"
            ));
            files.push_str(&format!("/usr/lib/modules/{kver}/{file}\n"));
        }
        packages.push((pkg, version.to_string(), release.to_string()));
    }
    text.push_str(&format!("\n%install\n{install}{files}"));
    Ok(Spec {
        stream: s.stream.clone(),
        name,
        target,
        text,
        packages,
    })
}

/// A one-package x86_64 spec of `stream`: `name` at `evr` (`VERSION-RELEASE`), with the
/// `%install` and `%files` sections `body` gives `version`.
fn one_package_spec(
    stream: &str,
    (name, evr, summary, license, url): (&str, &str, &str, &str, &str),
    body: impl FnOnce(&str) -> String,
) -> anyhow::Result<Spec> {
    let (version, release) = split_evr(evr)?;
    let text = format!(
        "Name: {name}\nVersion: {version}\nRelease: {release}\n\
         Summary: {summary} (streamd testbed placeholder)\n\
         License: {license}\nURL: {url}\nExclusiveArch: x86_64\n\n\
         %description\nPlaceholder with the name, version and file layout of RHEL's {name}.\n\n{}",
        body(version)
    );
    Ok(Spec {
        stream: stream.into(),
        name: name.into(),
        target: "x86_64",
        text,
        packages: vec![(name.into(), version.into(), release.into())],
    })
}

fn usbguard_spec(s: &StreamRpms) -> anyhow::Result<Spec> {
    let about = (
        "usbguard",
        s.usbguard.as_str(),
        "A tool for implementing USB device usage policy",
        "GPL-2.0-or-later",
        "https://usbguard.github.io/",
    );
    one_package_spec(&s.stream, about, |version| {
        format!(
            "%install\n\
         mkdir -p %{{buildroot}}/usr/sbin %{{buildroot}}/etc/usbguard %{{buildroot}}/usr/lib/systemd/system\n\
         printf '#!/bin/sh\\necho usbguard-daemon {version}\\n' > %{{buildroot}}/usr/sbin/usbguard-daemon\n\
         chmod 0755 %{{buildroot}}/usr/sbin/usbguard-daemon\n\
         printf 'RuleFile=/etc/usbguard/rules.conf\\n' > %{{buildroot}}/etc/usbguard/usbguard-daemon.conf\n\
         printf '[Service]\\nExecStart=/usr/sbin/usbguard-daemon\\n' > %{{buildroot}}/usr/lib/systemd/system/usbguard.service\n\n\
         %files\n/usr/sbin/usbguard-daemon\n%config(noreplace) /etc/usbguard/usbguard-daemon.conf\n\
         /usr/lib/systemd/system/usbguard.service\n"
        )
    })
}

/// kata-containers, the `sandboxed-containers` extension's package: an el9 build in both
/// streams' extensions images (openshift/os `extensions/rhel-10.2.yaml` takes it from an el9
/// `server-ose` repository on 4.21, 4.22 and 4.23).
fn kata_spec(s: &StreamRpms) -> anyhow::Result<Spec> {
    let about = (
        "kata-containers",
        s.kata.as_str(),
        "Kata Containers runtime",
        "Apache-2.0",
        "https://katacontainers.io/",
    );
    one_package_spec(&s.stream, about, |version| {
        format!(
            "%install\n\
         mkdir -p %{{buildroot}}/usr/bin\n\
         printf '#!/bin/sh\\necho kata-runtime {version}\\n' > %{{buildroot}}/usr/bin/kata-runtime\n\
         chmod 0755 %{{buildroot}}/usr/bin/kata-runtime\n\n\
         %files\n/usr/bin/kata-runtime\n"
        )
    })
}

fn specs(streams: &[StreamRpms]) -> anyhow::Result<Vec<Spec>> {
    let mut out = Vec::new();
    for s in streams {
        out.push(kernel_spec(
            s,
            "rt",
            "x86_64",
            &["core", "modules", "modules-core", "modules-extra"],
        )?);
        out.push(kernel_spec(
            s,
            "64k",
            "aarch64",
            &["core", "modules", "modules-core", "modules-extra"],
        )?);
        out.push(usbguard_spec(s)?);
        out.push(kata_spec(s)?);
    }
    Ok(out)
}

/// rpm's reproducibility switches plus what keeps the build hermetic and fast (no debuginfo,
/// no brp scripts, a pinned payload compressor and digest).
fn defines(topdir: &Path) -> Vec<String> {
    let mut d = vec![
        format!("_topdir {}", topdir.display()),
        format!("_tmppath {}/tmp", topdir.display()),
    ];
    d.extend(
        [
            "_buildhost testbed",
            "use_source_date_epoch_as_buildtime 1",
            "clamp_mtime_to_source_date_epoch 1",
            "debug_package %{nil}",
            "__os_install_post %{nil}",
            // What RHEL 9 and 10 build with (redhat-rpm-config `_binary_payload w19.zstdio`,
            // SHA-256 file digests): the packages then need rpmlib(PayloadIsZstd) of their
            // reader, as RHEL's do.
            "_binary_payload w19.zstdio",
            "_binary_filedigest_algorithm 8",
        ]
        .map(String::from),
    );
    d
}

/// Builds (or takes from `cache`) one x86_64 package `name` at `evr` (`VERSION-RELEASE`) of
/// `stream` with one placeholder file and no Requires but `requires` (a spec's `Requires:`
/// value, e.g. an `rpmlib(…)` feature the booted rpm lacks) and those rpmbuild adds.
pub async fn build_requiring(
    cache: &Path,
    stream: &str,
    name: &str,
    evr: &str,
    requires: &str,
) -> anyhow::Result<Rpm> {
    let about = (
        name,
        evr,
        "A package needing more of its reader",
        "MIT",
        "https://example.com/",
    );
    let spec = one_package_spec(stream, about, |version| {
        format!(
            "%install\nmkdir -p %{{buildroot}}/usr/share/testbed\n\
             printf '{name} {version}\\n' > %{{buildroot}}/usr/share/testbed/{name}\n\n\
             %files\n/usr/share/testbed/{name}\n"
        )
    })?;
    let spec = Spec {
        text: spec.text.replacen(
            "\n\n%description",
            &format!("\nAutoReq: no\nRequires: {requires}\n\n%description"),
            1,
        ),
        ..spec
    };
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let mut h = Sha256::new();
    let defined = defines(Path::new("TOPDIR"));
    for part in [CACHE_SCHEMA, &toolchain_id().await?, &spec.text]
        .into_iter()
        .chain(defined.iter().map(String::as_str))
    {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let dir = cache.join(format!(
        "custom-{name}-{}",
        &format!("{:x}", h.finalize())[..16]
    ));
    if !complete(&dir, &spec) {
        build_one(cache, &dir, &spec).await?;
    }
    collect(&dir, &spec)?
        .pop()
        .context("rpmbuild produced no package")
}

/// Runs `cmd` to completion within `timeout`, returning stdout; a non-zero exit is an error
/// carrying stderr.
async fn run(mut cmd: Command, timeout: Duration, what: &str) -> anyhow::Result<Vec<u8>> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .with_context(|| format!("{what} did not finish within {timeout:?}"))?
        .with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("{what} failed ({}):\n{}", out.status, tail.join("\n"));
    }
    Ok(out.stdout)
}

/// What went into a cache entry besides the spec: the rpmbuild version and its options.
async fn toolchain_id() -> anyhow::Result<String> {
    let mut cmd = Command::new("rpmbuild");
    cmd.arg("--version");
    let v = run(
        cmd,
        Duration::from_secs(10),
        "rpmbuild --version (is the rpm package installed?)",
    )
    .await?;
    Ok(String::from_utf8_lossy(&v).trim().to_string())
}

/// The outcome of [`build_all`].
#[derive(Debug, Clone)]
pub struct Built {
    /// Every RPM, in spec order.
    pub rpms: Vec<Rpm>,
    /// How many specs were built now (0 when everything came from the cache).
    pub built_specs: usize,
    /// How many specs there are.
    pub total_specs: usize,
}

/// Builds (or takes from `cache`) every RPM of `streams`.
pub async fn build_all(cache: &Path, streams: &[StreamRpms]) -> anyhow::Result<Built> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let toolchain = toolchain_id().await?;
    let specs = specs(streams)?;
    let jobs = specs.iter().map(|spec| {
        let mut h = Sha256::new();
        for part in [
            CACHE_SCHEMA,
            &toolchain,
            spec.target,
            &SOURCE_DATE_EPOCH.to_string(),
            &spec.text,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        for d in defines(Path::new("TOPDIR")) {
            h.update(d.as_bytes());
            h.update([0]);
        }
        let hash = format!("{:x}", h.finalize());
        let dir = cache.join(format!("{}-{}-{}", spec.stream, spec.name, &hash[..16]));
        async move {
            let fresh = !complete(&dir, spec);
            if fresh {
                build_one(cache, &dir, spec).await?;
            } else {
                debug!(spec = %spec.name, stream = %spec.stream, "rpms taken from the cache");
            }
            anyhow::Ok((fresh, collect(&dir, spec)?))
        }
    });
    let results = futures::future::try_join_all(jobs).await?;
    let built_specs = results.iter().filter(|(fresh, _)| *fresh).count();
    let rpms: Vec<Rpm> = results.into_iter().flat_map(|(_, r)| r).collect();
    info!(
        rpms = rpms.len(),
        built_specs,
        total_specs = specs.len(),
        "rpms ready"
    );
    Ok(Built {
        rpms,
        built_specs,
        total_specs: specs.len(),
    })
}

fn expected<'a>(
    dir: &Path,
    spec: &'a Spec,
) -> impl Iterator<Item = (PathBuf, &'a (String, String, String))> {
    spec.packages.iter().map(move |p| {
        (
            dir.join(format!("{}-{}-{}.{}.rpm", p.0, p.1, p.2, spec.target)),
            p,
        )
    })
}

fn complete(dir: &Path, spec: &Spec) -> bool {
    dir.join("spec").is_file() && expected(dir, spec).all(|(p, _)| p.is_file())
}

fn collect(dir: &Path, spec: &Spec) -> anyhow::Result<Vec<Rpm>> {
    expected(dir, spec)
        .map(|(path, (name, version, release))| {
            let data =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(Rpm {
                stream: spec.stream.clone(),
                name: name.clone(),
                version: version.clone(),
                release: release.clone(),
                arch: spec.target.to_string(),
                digest: super::oci::sha256_digest(&data),
                path,
            })
        })
        .collect()
}

/// Builds one spec in a private scratch dir and renames the result into place, so a crash or
/// a concurrent builder never leaves a half-filled cache entry.
async fn build_one(cache: &Path, dir: &Path, spec: &Spec) -> anyhow::Result<()> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let scratch = cache.join(format!(
        ".build-{}-{}-{}",
        spec.name,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    let top = scratch.join("top");
    std::fs::create_dir_all(top.join("tmp"))
        .with_context(|| format!("creating {}", top.display()))?;
    let spec_path = scratch.join(format!("{}.spec", spec.name));
    std::fs::write(&spec_path, &spec.text)
        .with_context(|| format!("writing {}", spec_path.display()))?;
    let mut cmd = Command::new("rpmbuild");
    cmd.arg("-bb")
        .arg("--quiet")
        .arg("--target")
        .arg(spec.target);
    for d in defines(&top) {
        cmd.arg("--define").arg(d);
    }
    cmd.arg(&spec_path)
        // HOME keeps the user's ~/.rpmmacros out of the build.
        .env("HOME", &scratch)
        .env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH.to_string())
        .env("TZ", "UTC")
        .env("LC_ALL", "C");
    let what = format!("rpmbuild {} ({})", spec.name, spec.stream);
    let result = async {
        run(cmd, RPMBUILD_TIMEOUT, &what).await?;
        let out = scratch.join("out");
        std::fs::create_dir_all(&out)?;
        for (path, _) in expected(&out, spec) {
            let Some(file) = path.file_name() else {
                continue;
            };
            let built = top.join("RPMS").join(spec.target).join(file);
            std::fs::rename(&built, &path)
                .with_context(|| format!("{what} did not produce {}", built.display()))?;
        }
        std::fs::write(out.join("spec"), &spec.text)?;
        match std::fs::rename(&out, dir) {
            Ok(()) => Ok(()),
            // Someone else finished the same entry first; theirs is identical.
            Err(_) if complete(dir, spec) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("moving {} into place", dir.display())),
        }
    }
    .await;
    let _ = std::fs::remove_dir_all(&scratch);
    result?;
    info!(spec = %spec.name, stream = %spec.stream, "built rpms");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams() -> Vec<StreamRpms> {
        vec![StreamRpms {
            stream: "rhel-9".into(),
            kernel: "5.14.0-570.60.1.el9_6".into(),
            usbguard: "1.1.3-1.el9".into(),
            kata: "3.21.0-1.el9".into(),
        }]
    }

    #[test]
    fn specs_name_the_rhel_packages_and_no_meta_package() {
        let specs = specs(&streams()).unwrap();
        let names: Vec<String> = specs
            .iter()
            .flat_map(|s| s.packages.iter().map(|p| format!("{}.{}", p.0, s.target)))
            .collect();
        assert_eq!(
            names,
            [
                "kernel-rt-core.x86_64",
                "kernel-rt-modules.x86_64",
                "kernel-rt-modules-core.x86_64",
                "kernel-rt-modules-extra.x86_64",
                "kernel-64k-core.aarch64",
                "kernel-64k-modules.aarch64",
                "kernel-64k-modules-core.aarch64",
                "kernel-64k-modules-extra.aarch64",
                "usbguard.x86_64",
                "kata-containers.x86_64",
            ]
        );
        let rt = &specs[0].text;
        assert!(rt.contains("/usr/lib/modules/5.14.0-570.60.1.el9_6.x86_64+rt/vmlinuz"));
        assert!(!rt.contains("\n%files\n"), "no files for the meta-package");
        assert!(!rt.contains("kernel-rt-kvm"));
        let kver = "5.14.0-570.60.1.el9_6.x86_64+rt";
        for line in [
            format!("Provides: kernel-uname-r = {kver}"),
            format!("Requires: kernel-rt-modules-core-uname-r = {kver}"),
            format!("Provides: kernel-rt-modules-core-uname-r = {kver}"),
            format!("Requires: kernel-rt-modules-uname-r = {kver}"),
            "Requires(pre): /usr/bin/kernel-install".to_string(),
        ] {
            assert!(rt.contains(&line), "{line} in\n{rt}");
        }
    }
}
