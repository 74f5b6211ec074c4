//! The host root streamd reads: `/proc` and `/sys` facts, CRI-O's configuration and the
//! booted OS's os-release, written from a host fixture (`crate::fixtures`).
//!
//! Layout below the root (all plain files):
//!
//! | path | content |
//! | --- | --- |
//! | `proc/sys/kernel/hostname` | node name |
//! | `proc/sys/kernel/arch` | `x86_64` / `aarch64` |
//! | `proc/sys/kernel/osrelease` | running kernel release (`…el9_6.x86_64`, `…+rt`, `…aarch64+64k`) |
//! | `proc/cpuinfo` | x86-64-v3 flags; v2 only on `old-cpu`; an aarch64 `Features` line on 64k |
//! | `proc/cmdline` | `BOOT_IMAGE=…` plus the booted deployment's bootloader options (`fips=1` on FIPS hosts) |
//! | `proc/sys/crypto/fips_enabled` | `1` on FIPS hosts, else `0` |
//! | `sys/kernel/realtime` | `1`, only on real-time kernels (absent otherwise, as on a real host) |
//! | `etc/crio/crio.conf`, `etc/crio/crio.conf.d/00-default` | `[crio.runtime] default_runtime` = `runc` or `crun` |
//! | `usr/lib/os-release`, `etc/os-release` (link) | the booted image's os-release |
//! | `usr/local` (link to `../var/usrlocal`) | as rpm-ostree composes RHCOS: `/usr/local` is writable, shared state in `/var` |
//! | `etc/machine-config-daemon/currentconfig` | only on `mcd`: the machine-config daemon's record of the MachineConfig it applied (a JSON MachineConfig, as `storeCurrentConfigOnDisk` writes it); the fixture's `machine_config` when it has one, with the `release-image-version` annotation of the release played (`--openshift`) |
//! | `sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c` | only on `secureboot`: the EFI variable, 4 bytes of attributes (`BS|RT`, little-endian) and the value `1` |
//! | `usr/lib/systemd/system/bootloader-update.service` | bootupd's unit (RHEL >= 9.6), which the fake systemd starts (`crate::fakes::systemd`) |
//! | `usr/lib/systemd/system/streamd-bootloader-update.target` | streamd's unit that pulls bootupd's in, from the repository's `systemd/` |
//! | `run/testbed/low-disk` | only on `low-disk`: the fake rpm-ostreed fails imports on free space |
//! | `proc/sys/kernel/random/boot_id` | this boot's id; a simulated reboot writes a new one |
//! | `var/log/journal/<machine-id>/`, `etc/machine-id` | only after a reboot whose finalization failed: a real journal with the failure in the previous boot |

use std::path::Path;

use anyhow::Context as _;

use crate::fixtures::images::TestImage;
use crate::fixtures::{Fixture, Kernel};

/// Writes a host root for `node` booted on `booted` as `fixture` describes, with `cmdline` as
/// `/proc/cmdline` (the booted deployment's, see `FakeRpmOstreed::booted_cmdline`).
pub fn write(
    root: &Path,
    node: &str,
    booted: &TestImage,
    fixture: &Fixture,
    cmdline: &str,
) -> anyhow::Result<()> {
    let put = |rel: &str, text: &str| -> anyhow::Result<()> {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    let remove = |rel: &str| {
        let _ = std::fs::remove_file(root.join(rel));
    };
    put("proc/sys/kernel/hostname", &format!("{node}\n"))?;
    put("proc/sys/kernel/arch", &format!("{}\n", fixture.arch()))?;
    put(
        "proc/sys/kernel/osrelease",
        &format!("{}\n", fixture.kernel_release(booted)),
    )?;
    put("proc/cpuinfo", &fixture.cpuinfo())?;
    put("proc/cmdline", &format!("{cmdline}\n"))?;
    put(
        "proc/sys/crypto/fips_enabled",
        if fixture.fips { "1\n" } else { "0\n" },
    )?;
    if fixture.kernel == Kernel::Realtime {
        put("sys/kernel/realtime", "1\n")?;
    } else {
        remove("sys/kernel/realtime");
    }
    let runtime = fixture.default_runtime;
    put(
        "etc/crio/crio.conf",
        &format!("[crio]\n\n[crio.runtime]\ndefault_runtime = \"{runtime}\"\n"),
    )?;
    put(
        "etc/crio/crio.conf.d/00-default",
        &format!(
            "[crio.runtime]\ndefault_runtime = \"{runtime}\"\n\n\
             [crio.runtime.runtimes.{runtime}]\nruntime_path = \"/usr/bin/{runtime}\"\n"
        ),
    )?;
    if fixture.low_disk {
        put(
            "run/testbed/low-disk",
            "sysroot free space below min-free-space-percent 3%\n",
        )?;
    } else {
        remove("run/testbed/low-disk");
    }
    if fixture.mcd {
        // openshift/machine-config-operator:pkg/daemon/daemon.go `storeCurrentConfigOnDisk`
        // writes the whole MachineConfig as JSON: the fixture's, else one without kernel type
        // or extensions, annotated with the release played.
        let mc = fixture.machine_config.unwrap_or(
            r#"{"kind":"MachineConfig","apiVersion":"machineconfiguration.openshift.io/v1","metadata":{"name":"rendered-worker-0123456789abcdef0123456789abcdef"},"spec":{"osImageURL":""}}"#,
        );
        put(
            "etc/machine-config-daemon/currentconfig",
            &fixture.openshift.rendered(mc)?,
        )?;
    } else {
        remove("etc/machine-config-daemon/currentconfig");
    }
    let secure_boot = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";
    if fixture.secure_boot {
        let p = root.join(secure_boot);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        // efivarfs: the variable's attributes (u32, little-endian), then its data.
        std::fs::write(&p, [0x06, 0, 0, 0, 1])
            .with_context(|| format!("writing {}", p.display()))?;
    } else {
        remove(secure_boot);
    }
    // As bootupd ships it (coreos/bootupd:contrib/packaging/bootloader-update.service).
    put(
        "usr/lib/systemd/system/bootloader-update.service",
        "[Unit]\nDescription=Update bootloader on boot\nDocumentation=https://github.com/coreos/bootupd\n\n\
         [Service]\nType=oneshot\nExecStart=/usr/bin/bootupctl update\nRemainAfterExit=yes\nMountFlags=slave\n\n\
         [Install]\nWantedBy=multi-user.target\n",
    )?;
    // As the streamd package installs it.
    put(
        "usr/lib/systemd/system/streamd-bootloader-update.target",
        include_str!("../../../systemd/streamd-bootloader-update.target"),
    )?;
    put("usr/lib/os-release", &booted.os_release())?;
    // As on RHCOS, /etc/os-release is a relative link into /usr, and /usr/local one into /var
    // (coreos/rpm-ostree rust/src/composepost.rs: `ensure_symlink(rootfs, "../var/usrlocal",
    // "usr/local")`).
    link(root, "etc/os-release", "../usr/lib/os-release")?;
    std::fs::create_dir_all(root.join("var/usrlocal")).context("creating var/usrlocal")?;
    link(root, "usr/local", "../var/usrlocal")
}

/// Makes `rel` below `root` a symbolic link to `target`, replacing a link that is there.
fn link(root: &Path, rel: &str, target: &str) -> anyhow::Result<()> {
    let link = root.join(rel);
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(target, &link).with_context(|| format!("linking {}", link.display()))
}

/// What a reboot into another deployment does to the host root: its `/usr` is the new
/// deployment's (written again by [`write`]), while `/etc` (ostree's merge carries the local
/// changes into the new deployment) and `/var` (one per stateroot, shared by its deployments)
/// stay as they were.
pub fn boot_new_deployment(root: &Path) -> anyhow::Result<()> {
    let usr = root.join("usr");
    match std::fs::remove_dir_all(&usr) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", usr.display()))
        }
        _ => Ok(()),
    }
}

const BOOT_ID: &str = "proc/sys/kernel/random/boot_id";

/// Gives the host a boot id unless it has one (a restarted testbed keeps its boot).
pub fn keep_boot_id(root: &Path) -> anyhow::Result<()> {
    if root.join(BOOT_ID).exists() {
        return Ok(());
    }
    new_boot_id(root)
}

/// A new boot: a fresh boot id, and the running kernel of what booted (`kernel`, which may
/// differ from the fixture's when an update changed the variant).
pub fn boot(root: &Path, kernel: &str) -> anyhow::Result<()> {
    new_boot_id(root)?;
    if kernel.is_empty() {
        return Ok(());
    }
    let p = root.join("proc/sys/kernel/osrelease");
    std::fs::write(&p, format!("{kernel}\n"))
        .with_context(|| format!("writing {}", p.display()))?;
    let rt = root.join("sys/kernel/realtime");
    if kernel.ends_with("+rt") {
        std::fs::create_dir_all(root.join("sys/kernel")).context("creating sys/kernel")?;
        std::fs::write(&rt, "1\n").with_context(|| format!("writing {}", rt.display()))?;
    } else {
        let _ = std::fs::remove_file(&rt);
    }
    Ok(())
}

/// The host's current boot id.
pub fn boot_id(root: &Path) -> anyhow::Result<String> {
    let p = root.join(BOOT_ID);
    Ok(std::fs::read_to_string(&p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

/// Machine id of the testbed host (`etc/machine-id`, the journal's directory name).
const MACHINE_ID: &str = "5e7ea3dd0f1e4c8d9a2b6c3d4e5f6a7b";

/// Writes a real journal below the host root (`var/log/journal/<machine-id>/`, read by
/// `journalctl --root`) with `message` logged at priority err by
/// `ostree-finalize-staged.service` in boot `failed_boot`, and one entry of boot `now_boot`,
/// so that boot is the previous one (`--boot=-1`). Uses systemd-journal-remote, which turns
/// the journal export format into journal files.
pub async fn journal_finalize_failure(
    root: &Path,
    failed_boot: &str,
    now_boot: &str,
    message: &str,
) -> anyhow::Result<()> {
    const TOOL: &str = "/lib/systemd/systemd-journal-remote";
    let dir = root.join("var/log/journal").join(MACHINE_ID);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(root.join("etc/machine-id"), format!("{MACHINE_ID}\n"))
        .context("writing etc/machine-id")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let entry = |realtime: u128, boot: &str, unit: &str, priority: u8, msg: &str| {
        format!(
            "__REALTIME_TIMESTAMP={realtime}\n__MONOTONIC_TIMESTAMP=1000000\n_BOOT_ID={}\n\
             _MACHINE_ID={MACHINE_ID}\n_HOSTNAME=worker-0\nPRIORITY={priority}\n\
             _SYSTEMD_UNIT={unit}\nSYSLOG_IDENTIFIER=ostree\nMESSAGE={msg}\n\n",
            boot.replace('-', "")
        )
    };
    let export = entry(
        now - 2_000_000,
        failed_boot,
        "ostree-finalize-staged.service",
        3,
        message,
    ) + &entry(
        now,
        now_boot,
        "systemd-journald.service",
        6,
        "journal started",
    );
    let input = dir.join("export.txt");
    std::fs::write(&input, export).context("writing the journal export")?;
    let output = dir.join(format!("boot-{}.journal", now_boot.replace('-', "")));
    let run = tokio::process::Command::new(TOOL)
        .arg(format!("--output={}", output.display()))
        .arg(&input)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .with_context(|| format!("{TOOL} did not finish within 30 s"))?
        .with_context(|| format!("running {TOOL} (Debian package systemd-journal-remote)"))?;
    let _ = std::fs::remove_file(&input);
    anyhow::ensure!(
        out.status.success(),
        "{TOOL} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn new_boot_id(root: &Path) -> anyhow::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    // Random enough for a test host: two std hashers with random keys, formatted as a UUID.
    let mut bits = [0u64; 2];
    for b in &mut bits {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        *b = h.finish();
    }
    let hex = format!("{:016x}{:016x}", bits[0], bits[1]);
    let id = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    let p = root.join(BOOT_ID);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&p, format!("{id}\n")).with_context(|| format!("writing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::fixture;
    use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};
    use crate::scratch::ScratchDir;

    #[test]
    fn writes_a_readable_root() {
        let d = ScratchDir::new("host-root").expect("scratch dir");
        let img = &catalog(DEFAULT_REGISTRY)[0];
        let rt = fixture("fips-realtime").expect("fixture");
        write(&d, "worker-0", img, &rt, "BOOT_IMAGE=x rw fips=1").expect("write");
        let os = std::fs::read_to_string(d.join("etc/os-release")).expect("read via link");
        assert!(os.contains("RHEL_VERSION=9.6"));
        let read = |rel: &str| std::fs::read_to_string(d.join(rel)).expect(rel);
        assert_eq!(read("proc/sys/kernel/hostname"), "worker-0\n");
        assert_eq!(read("sys/kernel/realtime"), "1\n");
        assert_eq!(read("proc/sys/crypto/fips_enabled"), "1\n");
        // Rewriting as another fixture removes what that one lacks.
        let def = fixture("default").expect("fixture");
        write(&d, "worker-0", img, &def, "BOOT_IMAGE=x rw").expect("write");
        assert!(!d.join("sys/kernel/realtime").exists());
        assert_eq!(read("proc/sys/crypto/fips_enabled"), "0\n");
        keep_boot_id(&d).expect("boot id");
        let first = read(BOOT_ID);
        keep_boot_id(&d).expect("boot id");
        assert_eq!(read(BOOT_ID), first, "a restart keeps the boot");
        boot(&d, "6.12.0-124.8.1.el10_1.x86_64+rt").expect("boot");
        assert_ne!(read(BOOT_ID), first, "a reboot is a new boot");
        assert_eq!(read(BOOT_ID).len(), 37);
        assert_eq!(read("sys/kernel/realtime"), "1\n");
        // A new deployment's /usr replaces the old one; /usr/local is /var's, and stays.
        std::fs::create_dir_all(d.join("usr/local/bin")).expect("usr/local/bin");
        std::fs::write(d.join("usr/local/bin/tool"), "kept").expect("tool");
        std::fs::write(d.join("usr/lib/from-the-old-tree"), "gone").expect("usr file");
        boot_new_deployment(&d).expect("new deployment");
        write(&d, "worker-0", img, &def, "BOOT_IMAGE=x rw").expect("write");
        assert!(!d.join("usr/lib/from-the-old-tree").exists());
        assert_eq!(read("usr/local/bin/tool"), "kept");
        assert_eq!(read("var/usrlocal/bin/tool"), "kept");
    }
}
