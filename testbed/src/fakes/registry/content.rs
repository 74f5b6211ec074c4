//! What the testbed's OS and extensions images contain, derived from the image catalog
//! ([`crate::fixtures::images::catalog`]) so every part of the testbed agrees on versions and kernels.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::json;

use super::oci::{Arch, Entry, Image, Index, canonical_json};
use super::rpm::{Rpm, StreamRpms};
use crate::fixtures::images::TestImage;
use crate::fixtures::packages;

/// Where extensions images keep their package repository (what `rpm-ostree compose extensions`
/// writes and the machine-config daemon mounts as a yum repo).
pub const EXTENSIONS_DIR: &str = "usr/share/rpm-ostree/extensions";
/// The marker that stands in for `repodata/` (no createrepo here): it lists the packages.
pub const EXTENSIONS_MARKER: &str = "usr/share/rpm-ostree/extensions/testbed-repo.json";

/// usbguard `VERSION-RELEASE` per stream.
const USBGUARD: &[(&str, &str)] = &[("rhel-9", "1.1.3-1.el9"), ("rhel-10", "1.1.3-3.el10")];
/// kata-containers `VERSION-RELEASE`: the same el9 build in both streams, as RHCOS's rhel-10
/// extensions take it from an el9 repository (openshift/os `extensions/rhel-10.2.yaml`:
/// `rhel-9.6-server-ose-4.21` on 4.21, `rhel-9.8-server-ose-4.22`/`-5.0` on 4.22 and 4.23;
/// the version is the testbed's own).
const KATA: &str = "3.21.0-1.el9";

/// The image's default kernel release for `arch` (`ostree.linux`), e.g.
/// `5.14.0-570.60.1.el9_6.aarch64`.
pub fn kernel_release(img: &TestImage, arch: Arch) -> anyhow::Result<String> {
    let base = img
        .kernel
        .strip_suffix(".x86_64")
        .with_context(|| format!("catalog kernel {:?} is not an x86_64 release", img.kernel))?;
    Ok(format!("{base}.{}", arch.rpm()))
}

/// What to build RPMs for, one entry per catalog stream.
pub fn stream_rpms(catalog: &[TestImage]) -> anyhow::Result<Vec<StreamRpms>> {
    catalog
        .iter()
        .map(|img| {
            let kernel = kernel_release(img, Arch::Amd64)?;
            let usbguard = USBGUARD
                .iter()
                .find(|(s, _)| *s == img.stream)
                .with_context(|| format!("no usbguard version for stream {}", img.stream))?
                .1;
            Ok(StreamRpms {
                stream: img.stream.clone(),
                kernel: kernel.trim_end_matches(".x86_64").to_string(),
                usbguard: usbguard.to_string(),
                kata: KATA.to_string(),
            })
        })
        .collect()
}

/// Labels of an OS image: what the release payload's stream discovery and bootc look at.
pub fn os_labels(img: &TestImage, arch: Arch) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(BTreeMap::from([
        ("containers.bootc".into(), "1".into()),
        ("ostree.bootable".into(), "true".into()),
        ("io.openshift.os.streamclass".into(), img.stream.clone()),
        (
            "ostree.linux".into(),
            format!(
                "{}{}",
                kernel_release(img, arch)?,
                img.variant.release_suffix()
            ),
        ),
        ("version".into(), img.version.clone()),
        (
            "org.opencontainers.image.version".into(),
            img.version.clone(),
        ),
    ]))
}

fn major(img: &TestImage) -> u32 {
    img.rhel_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Files of an OS image: os-release, its kernel (the variant's for a variant image) and the FIPS bits (RHEL 10 no longer
/// ships `fips-mode-setup`, so only RHEL 9 images have it).
pub fn os_files(img: &TestImage, arch: Arch) -> anyhow::Result<Vec<Entry>> {
    let kernel = format!(
        "{}{}",
        kernel_release(img, arch)?,
        img.variant.release_suffix()
    );
    let mut files = vec![
        Entry::file("usr/lib/os-release", img.os_release()),
        Entry::Symlink {
            path: "etc/os-release".into(),
            target: "../usr/lib/os-release".into(),
        },
        Entry::executable(
            format!("usr/lib/modules/{kernel}/vmlinuz"),
            format!("testbed placeholder vmlinuz {kernel}\n"),
        ),
        Entry::file(
            format!("usr/lib/modules/{kernel}/config"),
            format!(
                "# Linux/{} Kernel Configuration\nCONFIG_CRYPTO_FIPS=y\n",
                arch.rpm()
            ),
        ),
        Entry::file(
            "usr/share/crypto-policies/policies/FIPS.pol",
            "# testbed stand-in for the FIPS crypto policy: FIPS-approved algorithms only.\n\
             mac = AEAD HMAC-SHA2-256 HMAC-SHA1 HMAC-SHA2-384 HMAC-SHA2-512\n\
             hash = SHA2-256 SHA2-384 SHA2-512 SHA3-256 SHA3-384 SHA3-512\n\
             min_rsa_size = 2048\n",
        ),
        Entry::executable(
            "usr/lib/dracut/modules.d/01fips/module-setup.sh",
            "#!/bin/bash\n# testbed stand-in for dracut's fips module.\n\
             check() { return 255; }\ndepends() { return 0; }\ninstall() { :; }\n",
        ),
    ];
    // What `ostree admin deploy` and a booted system need from the tree: the initramfs beside
    // the kernel and the default configuration (ostree keeps `etc/` in `usr/etc/`).
    files.extend([
        Entry::file(
            format!("usr/lib/modules/{kernel}/initramfs.img"),
            format!("testbed placeholder initramfs {kernel}\n"),
        ),
        Entry::file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/var/home/core:/bin/bash\n",
        ),
        Entry::file("etc/group", "root:x:0:\ncore:x:1000:\n"),
        Entry::file("etc/hostname", "localhost\n"),
        Entry::file("etc/machine-id", ""),
    ]);
    if major(img) < 10 {
        files.push(Entry::executable(
            "usr/bin/fips-mode-setup",
            "#!/bin/sh\necho 'fips-mode-setup: testbed placeholder' >&2\nexit 1\n",
        ));
    }
    Ok(files)
}

/// The OS image of `img`: an index over an amd64 and an arm64 image, each an ostree commit
/// encapsulated by ostree-ext ([`super::encapsulate`]) in the build directory `work`, chunked by
/// package as `rpm-ostree compose image` chunks RHEL CoreOS: every base package owns a file
/// (`usr/share/licenses/NAME/`, the kernel also its modules directory), so each content layer
/// carries ostree-ext's `ostree.components` annotation naming its packages — except the `kernel`
/// meta-package, which owns no file in RHEL 9 and 10 (kernel.spec's empty `%files` for it), so no
/// layer names it, as on RHEL CoreOS.
pub async fn os_index(img: &TestImage, work: &Path) -> anyhow::Result<Index> {
    let mut images = Vec::new();
    for arch in Arch::ALL {
        let base = packages::base_packages(img, arch.rpm());
        let mut files = os_files(img, arch)?;
        let mut owners = Vec::new();
        for p in base.iter().filter(|p| p.name != "kernel") {
            let dir = format!("usr/share/licenses/{}/", p.name);
            files.push(Entry::file(format!("{dir}COPYING"), format!("{p}\n")));
            let mut owns = vec![dir];
            if p.name == "kernel-core" {
                owns.push("usr/lib/modules/".to_string());
            }
            owners.push(super::encapsulate::Component {
                name: p.name.clone(),
                nevra: p.to_string(),
                owns,
            });
        }
        images.push(
            super::encapsulate::os_image(
                work,
                &img.tag(),
                arch,
                (&img.created(), img.created_unix()),
                os_labels(img, arch)?,
                &files,
                &owners,
            )
            .await
            .with_context(|| format!("building the {} image for {}", img.tag(), arch.oci()))?,
        );
    }
    Ok(Index::build(images))
}

/// Labels of an extensions image.
pub fn extensions_labels(img: &TestImage) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("io.openshift.os.extensions".into(), "true".into()),
        ("io.openshift.os.streamclass".into(), img.stream.clone()),
        ("version".into(), img.version.clone()),
    ])
}

/// The extensions layer: `rpms` (read from the build cache) in [`EXTENSIONS_DIR`] plus the
/// marker listing them.
pub fn extensions_files(stream: &str, arch: Arch, rpms: &[&Rpm]) -> anyhow::Result<Vec<Entry>> {
    let mut files = Vec::new();
    let mut listed = Vec::new();
    for rpm in rpms {
        let data =
            std::fs::read(&rpm.path).with_context(|| format!("reading {}", rpm.path.display()))?;
        listed.push(json!({
            "name": rpm.name,
            "evr": format!("{}-{}", rpm.version, rpm.release),
            "arch": rpm.arch,
            "file": rpm.file_name(),
            "digest": rpm.digest,
        }));
        files.push(Entry::file(
            format!("{EXTENSIONS_DIR}/{}", rpm.file_name()),
            data,
        ));
    }
    let marker = json!({
        "repo": "coreos-extensions",
        "stream": stream,
        "arch": arch.rpm(),
        "note": "testbed stand-in for repodata/: the packages in this directory",
        "packages": listed,
    });
    let mut marker = canonical_json(&marker);
    marker.push(b'\n');
    files.push(Entry::file(EXTENSIONS_MARKER, marker));
    Ok(files)
}

/// The extensions image of `img`: an index whose amd64 image carries the stream's x86_64 RPMs
/// and whose arm64 image carries its aarch64 RPMs.
pub fn extensions_index(img: &TestImage, rpms: &[Rpm]) -> anyhow::Result<Index> {
    let mut images = Vec::new();
    for arch in Arch::ALL {
        let mine: Vec<&Rpm> = rpms
            .iter()
            .filter(|r| r.stream == img.stream && r.arch == arch.rpm())
            .collect();
        if mine.is_empty() {
            bail!("no {} rpms for stream {}", arch.rpm(), img.stream);
        }
        let files = extensions_files(&img.stream, arch, &mine)?;
        images.push(Image::build(
            arch,
            &img.created(),
            extensions_labels(img),
            vec![files],
        )?);
    }
    Ok(Index::build(images))
}
