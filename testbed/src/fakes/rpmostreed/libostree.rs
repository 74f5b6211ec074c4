//! Real libostree 2025.x on a testbed sysroot: Debian trixie's `ostree` (2025.2), run from the
//! root `scripts/setup.sh` makes, stages, locks and finalizes a deployment, so the
//! `/run/ostree/staged-deployment` record and its `locked` key are libostree's own (bookworm's
//! 2022.7, which the rest of the fake links, predates both).
//!
//! Staging needs a *booted* sysroot. What libostree v2025.2 checks (ostreedev/ostree
//! src/libostree/ostree-sysroot.c `ostree_sysroot_initialize`, `parse_deployment`) and how
//! [`BootedHost`] gives it that, inside a private mount namespace, chrooted into the trixie root:
//! - `/run/ostree-booted` exists and is an `a{sv}` GVariant: a tmpfs at `/run` holds it;
//! - the sysroot path is `/` (device and inode of `/` equal the sysroot's): the sysroot's
//!   `ostree/` and `boot/` are bound at `/ostree` and `/boot` of the trixie root and the
//!   commands run without `--sysroot`;
//! - the booted deployment is the one whose directory's (device, inode) is the
//!   `backing-root-device-inode` (`(tt)`) of `/run/ostree-booted` (what ostree-prepare-root
//!   records), else that of `/`: the record names the deployment directory, so `/` need not be
//!   it. `/proc/cmdline`'s `ostree=` is not read for this in 2025.2.
//! - `ostree_sysroot_initialize_with_mount_namespace` (every `ostree admin` command) reads
//!   `/proc/1/ns/mnt`, which this machine's pid 1 does not let a root in another namespace read
//!   ("Permission denied"): the command runs in a PID namespace of its own with a fresh `/proc`,
//!   where `ostree` is pid 1 (libostree then unshares once more, harmlessly);
//! - `ostree_sysroot_stage_tree_with_options` runs `systemctl start
//!   ostree-finalize-staged.service` and fails if that fails: a stub `systemctl` comes first in
//!   `PATH` and says what it was asked on stderr.
//!
//! `/run/ostree` is the host root's own `run/ostree`, bound, so the record is where streamd
//! reads it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ostree::glib::{self, prelude::ToVariant};

use super::ostree::{self as cli, Commit};
use crate::fixtures::images::TestImage;

/// The trixie root `scripts/setup.sh` makes (the same path is spelled there).
pub const TRIXIE_ROOT: &str = "/var/cache/streamd-testbed/trixie-1";
/// Written last by `scripts/setup.sh`: the root is whole; it holds the ostree version.
const STAMP: &str = ".streamd-complete";
/// Every real `ostree` invocation is bounded by this.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The most of a failed command's stderr an error carries.
const MAX_STDERR: usize = 2000;

/// `ostree admin deploy --lock-finalization` also touches this legacy file
/// (src/ostree/ot-admin-builtin-deploy.c "Writing legacy finalization lockfile"); rpm-ostree,
/// staging through `ostree_sysroot_stage_tree_with_options(.locked = TRUE)`, never does.
const LEGACY_LOCK: &str = "staged-deployment-locked";
/// libostree's record of the staged deployment, in `/run/ostree`.
pub(crate) const RECORD: &str = "staged-deployment";

/// The script run in the private mount namespace: `$1` trixie root, `$2` sysroot, `$3` the host
/// root's `run/ostree`, `$4` the work directory (`ostree-booted`, `systemctl`, origin files),
/// then `ostree`'s arguments.
const NAMESPACE_SCRIPT: &str = r#"set -eu
R=$1 SYS=$2 RUNO=$3 WORK=$4
shift 4
mount --bind "$SYS/ostree" "$R/ostree"
mount --bind "$SYS/boot" "$R/boot"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=0755 tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
mount -t tmpfs tmpfs "$R/var/tmp"
mkdir "$R/run/ostree" "$R/run/work"
mount --bind "$RUNO" "$R/run/ostree"
mount --bind "$WORK" "$R/run/work"
cp "$WORK/ostree-booted" "$R/run/ostree-booted"
exec chroot "$R" /usr/bin/env -i PATH=/run/work/bin:/usr/sbin:/usr/bin \
    OSTREE_SYSROOT_DEBUG=mutable-deployments ostree "$@"
"#;

/// The stub `systemctl`: libostree only needs `systemctl start ostree-finalize-staged.service`
/// to succeed; what it asked is on stderr.
const SYSTEMCTL_STUB: &str = "#!/bin/sh\necho \"systemctl stub: $*\" >&2\n";

/// The trixie root is not there (or not whole).
#[derive(Debug, thiserror::Error)]
#[error("no trixie root with ostree 2025.x at {path} ({STAMP} missing): run scripts/setup.sh")]
pub struct TrixieMissing {
    /// Where it was looked for.
    pub path: PathBuf,
}

/// Debian trixie's `ostree`, in the root `scripts/setup.sh` made.
#[derive(Debug, Clone)]
pub struct Trixie {
    root: PathBuf,
    version: String,
}

impl Trixie {
    /// The root at [`TRIXIE_ROOT`], if its stamp says it is whole.
    pub fn locate() -> Result<Trixie, TrixieMissing> {
        let root = PathBuf::from(TRIXIE_ROOT);
        let version = std::fs::read_to_string(root.join(STAMP))
            .map_err(|_| TrixieMissing { path: root.clone() })?;
        Ok(Trixie {
            version: version.trim().to_string(),
            root,
        })
    }

    /// For a test: the root, or, outside CI, `None` after printing why `test` skips; on CI
    /// (`CI=true`) a missing root is an error, so no run passes without real libostree.
    pub fn for_test(test: &str) -> Result<Option<Trixie>, TrixieMissing> {
        match Trixie::locate() {
            Ok(t) => Ok(Some(t)),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => Err(e),
            Err(e) => {
                eprintln!("skipping {test}: {e}");
                Ok(None)
            }
        }
    }

    /// libostree's version (`ostree --version`), e.g. `2025.2`.
    pub fn version(&self) -> &str {
        &self.version
    }
}

/// What a real `ostree` command printed.
#[derive(Debug, Clone)]
pub struct Output {
    /// Its stdout.
    pub stdout: String,
    /// Its stderr (the `systemctl` stub's lines among them).
    pub stderr: String,
}

/// A deployment's name on disk, `<checksum>.<serial>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentName {
    /// The commit.
    pub checksum: String,
    /// The deploy serial.
    pub serial: i32,
}

impl std::fmt::Display for DeploymentName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.checksum, self.serial)
    }
}

/// Where a [`BootedHost::attach`]ed host keeps what real libostree works on.
#[derive(Debug, Clone)]
pub(crate) struct HostPaths {
    /// The sysroot (`ostree/`, `boot/`).
    pub(crate) sysroot: PathBuf,
    /// The host root's `run/ostree`, where libostree writes its record.
    pub(crate) run_ostree: PathBuf,
    /// The caller's scratch directory.
    pub(crate) work: PathBuf,
}

/// libostree's record of the staged deployment (`/run/ostree/staged-deployment`), as far as
/// the fake reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StagedRecord {
    /// `target.name`.
    pub(crate) name: DeploymentName,
    /// `target.osname`.
    pub(crate) osname: String,
    /// `target.bootcsum`.
    pub(crate) bootcsum: String,
    /// `kargs`, as staged (empty when the key is absent).
    pub(crate) kargs: Vec<String>,
    /// `locked`, when the key is there (`ostree_sysroot_change_finalization` keeps it, false,
    /// after an unlock; a stage never locked has none).
    pub(crate) locked: Option<bool>,
}

/// The record in `run_ostree`, if there is one; an unreadable one is an error naming it.
pub(crate) fn read_record(run_ostree: &Path) -> anyhow::Result<Option<StagedRecord>> {
    let path = run_ostree.join(RECORD);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let record = glib::VariantDict::new(Some(&glib::Variant::from_data_with_type(
        bytes,
        glib::VariantTy::VARDICT,
    )));
    let bad = |what: &str| format!("{}: {what}", path.display());
    let target = record
        .lookup_value("target", Some(glib::VariantTy::VARDICT))
        .with_context(|| bad("no target"))?;
    let target = glib::VariantDict::new(Some(&target));
    let field = |key: &str| -> anyhow::Result<String> {
        target
            .lookup::<String>(key)
            .ok()
            .flatten()
            .with_context(|| bad(&format!("no target.{key}")))
    };
    let name = field("name")?;
    let (checksum, serial) = name
        .rsplit_once('.')
        .and_then(|(c, s)| Some((c.to_string(), s.parse::<i32>().ok()?)))
        .with_context(|| bad(&format!("odd target.name {name}")))?;
    Ok(Some(StagedRecord {
        name: DeploymentName { checksum, serial },
        osname: field("osname")?,
        bootcsum: field("bootcsum")?,
        kargs: record
            .lookup::<Vec<String>>("kargs")
            .ok()
            .flatten()
            .unwrap_or_default(),
        locked: record.lookup::<bool>("locked").ok().flatten(),
    }))
}

/// Adds rpm-ostree's empty `overlay-initrds` to the record at `path` (if there is one and it
/// lacks the key), serialized by GLib as libostree does.
fn add_empty_overlay_initrds(path: &Path) -> anyhow::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let record = glib::VariantDict::new(Some(&glib::Variant::from_data_with_type(
        bytes,
        glib::VariantTy::VARDICT,
    )));
    if record.contains("overlay-initrds") {
        return Ok(());
    }
    record.insert_value("overlay-initrds", &Vec::<String>::new().to_variant());
    let tmp = path.with_extension("rpm-ostree.tmp");
    std::fs::write(&tmp, record.end().data())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// A host root (`ROOT/sysroot`, `ROOT/run/ostree`) whose sysroot has one deployment, written by
/// the testbed's ostree, that real libostree takes as booted.
#[derive(Debug)]
pub struct BootedHost {
    root: PathBuf,
    sysroot: PathBuf,
    run_ostree: PathBuf,
    work: PathBuf,
    osname: String,
    booted: DeploymentName,
    booted_options: Vec<String>,
}

impl BootedHost {
    /// Makes the sysroot below `root` with stateroot `osname` and `image` deployed with `kargs`
    /// (ostree adds `ostree=`).
    pub async fn create(
        root: &Path,
        osname: &str,
        image: &TestImage,
        kargs: &[String],
    ) -> anyhow::Result<BootedHost> {
        let host = BootedHost {
            root: root.to_path_buf(),
            sysroot: root.join("sysroot"),
            run_ostree: root.join("run/ostree"),
            work: root.join("real-ostree"),
            osname: osname.to_string(),
            booted: DeploymentName {
                checksum: String::new(),
                serial: 0,
            },
            booted_options: Vec::new(),
        };
        let sysroot = host.sysroot();
        cli::init(&sysroot, osname).await?;
        let checksum = host.commit(image).await?;
        let origin = format!("[origin]\nrefspec={checksum}\n");
        cli::deploy(&sysroot, osname, &checksum, kargs, &origin, &host.work()).await?;
        let booted = cli::read_deployments(&sysroot)?
            .into_iter()
            .next()
            .context("ostree admin deploy left no deployment")?;
        std::fs::create_dir_all(host.run_ostree())
            .with_context(|| format!("creating {}", host.run_ostree().display()))?;
        Ok(BootedHost {
            booted: DeploymentName {
                checksum: booted.checksum.clone(),
                serial: booted.serial,
            },
            booted_options: booted
                .options
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            ..host
        })
    }

    /// An existing sysroot whose deployment `booted` real libostree is to take as booted;
    /// `run_ostree` is the host root's `run/ostree`, `work` a directory of the caller's for
    /// the marker, the `systemctl` stub and origin files.
    pub(crate) fn attach(paths: HostPaths, osname: &str, booted: DeploymentName) -> BootedHost {
        BootedHost {
            // `ROOT/run/ostree`'s root.
            root: paths
                .run_ostree
                .ancestors()
                .nth(2)
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            sysroot: paths.sysroot,
            run_ostree: paths.run_ostree,
            work: paths.work,
            osname: osname.to_string(),
            booted,
            booted_options: Vec::new(),
        }
    }

    /// The host root: streamd's `host_root`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The booted deployment.
    pub fn booted(&self) -> &DeploymentName {
        &self.booted
    }

    /// The booted deployment's bootloader `options`, in order (with its `ostree=`).
    pub fn booted_options(&self) -> &[String] {
        &self.booted_options
    }

    fn sysroot(&self) -> PathBuf {
        self.sysroot.clone()
    }

    fn run_ostree(&self) -> PathBuf {
        self.run_ostree.clone()
    }

    fn work(&self) -> PathBuf {
        self.work.clone()
    }

    /// Commits `image`'s tree (as the fake's imports do) and returns the checksum.
    pub async fn commit(&self, image: &TestImage) -> anyhow::Result<String> {
        let tree = self.work().join("tree");
        let _ = std::fs::remove_dir_all(&tree);
        let release =
            crate::fixtures::kernel_release(image, "x86_64", crate::fixtures::Kernel::Default);
        cli::write_tree(&tree, image, &release)?;
        cli::commit(
            &self.sysroot(),
            &Commit {
                tree: &tree,
                branch: None,
                parent: None,
                subject: &image.tag(),
                timestamp: image.created_unix(),
                metadata: Vec::new(),
                variant_metadata: Vec::new(),
            },
        )
        .await
    }

    /// Stages `checksum` over the booted deployment with real libostree, the kernel arguments
    /// `kargs` (replacing the merge deployment's, in its order, as `--karg` does), finalization
    /// locked when `locked`; returns the staged deployment's name. The origin names the
    /// checksum; [`BootedHost::stage_as_rpm_ostree`] takes one.
    pub async fn stage(
        &self,
        trixie: &Trixie,
        checksum: &str,
        kargs: &[String],
        locked: bool,
    ) -> anyhow::Result<(DeploymentName, Output)> {
        let origin = format!("[origin]\nrefspec={checksum}\n");
        self.stage_as_rpm_ostree(trixie, checksum, &origin, kargs, locked)
            .await
    }

    /// [`BootedHost::stage`] with the origin file `origin`, leaving `/run/ostree` as
    /// rpm-ostree's staging through the API leaves it.
    ///
    /// rpm-ostree stages through `ostree_sysroot_stage_tree_with_options` with `.locked` and an
    /// empty (non-NULL) `overlay_initrds`; `ostree admin deploy --stage` differs twice: with
    /// `--lock-finalization` it also touches the legacy `staged-deployment-locked` file, and it
    /// passes no `overlay_initrds`, so its record lacks that key. Both are undone here: the
    /// legacy file ends as libostree's staging alone leaves it (kept by a first stage,
    /// unlinked by a stage over a previous one, ostreedev/ostree#3025), and the record gains
    /// `overlay-initrds: @as []`, serialized by GLib over libostree's own keys.
    pub async fn stage_as_rpm_ostree(
        &self,
        trixie: &Trixie,
        checksum: &str,
        origin: &str,
        kargs: &[String],
        locked: bool,
    ) -> anyhow::Result<(DeploymentName, Output)> {
        let work = self.work();
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let origin_path = work.join(format!("{checksum}.origin"));
        std::fs::write(&origin_path, origin)
            .with_context(|| format!("writing {}", origin_path.display()))?;
        let legacy = self.run_ostree().join(LEGACY_LOCK);
        let record = self.run_ostree().join(RECORD);
        // What libostree's staging alone leaves of the legacy file.
        let keep_legacy = legacy.exists() && !record.exists();
        let mut args = vec![
            "admin".to_string(),
            "deploy".into(),
            "--stage".into(),
            format!("--os={}", self.osname),
            format!("--origin-file=/run/work/{checksum}.origin"),
        ];
        if locked {
            args.push("--lock-finalization".into());
        }
        args.extend(kargs.iter().map(|k| format!("--karg={k}")));
        args.push(checksum.to_string());
        let out = self.run(trixie, &args).await;
        let _ = std::fs::remove_file(&origin_path);
        let out = out?;
        if !keep_legacy {
            match std::fs::remove_file(&legacy) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", legacy.display())),
            }
        }
        add_empty_overlay_initrds(&record)?;
        Ok((self.newest_deployment_of(checksum)?, out))
    }

    /// `ostree admin undeploy INDEX`: index 0 is the staged deployment when there is one, and
    /// removing it unlinks libostree's record and the legacy file
    /// (`ostree_sysroot_write_deployments_with_options`), as rpm-ostree's `Cleanup` does.
    pub async fn undeploy(&self, trixie: &Trixie, index: usize) -> anyhow::Result<Output> {
        self.run(
            trixie,
            &["admin".to_string(), "undeploy".into(), index.to_string()],
        )
        .await
    }

    /// `ostree admin lock-finalization [--unlock]`: `ostree_sysroot_change_finalization`,
    /// what rpm-ostree's `FinalizeDeployment` calls to unlock.
    pub async fn change_finalization(
        &self,
        trixie: &Trixie,
        unlock: bool,
    ) -> anyhow::Result<Output> {
        let mut args = vec!["admin".to_string(), "lock-finalization".into()];
        if unlock {
            args.push("--unlock".into());
        }
        self.run(trixie, &args).await
    }

    /// `ostree admin finalize-staged`: what `ostree-finalize-staged.service` runs at shutdown.
    pub async fn finalize_staged(&self, trixie: &Trixie) -> anyhow::Result<Output> {
        self.run(trixie, &["admin".to_string(), "finalize-staged".into()])
            .await
    }

    /// `ostree admin status` as real libostree sees the host.
    pub async fn status(&self, trixie: &Trixie) -> anyhow::Result<Output> {
        self.run(trixie, &["admin".to_string(), "status".into()])
            .await
    }

    /// The deployment of `checksum` with the highest serial.
    fn newest_deployment_of(&self, checksum: &str) -> anyhow::Result<DeploymentName> {
        let dir = self
            .sysroot()
            .join(format!("ostree/deploy/{}/deploy", self.osname));
        let mut serials = Vec::new();
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let name = entry?.file_name();
            let Some((csum, serial)) = name.to_str().and_then(|n| n.rsplit_once('.')) else {
                continue;
            };
            if csum == checksum
                && let Ok(s) = serial.parse::<i32>()
            {
                serials.push(s);
            }
        }
        let serial = serials
            .into_iter()
            .max()
            .with_context(|| format!("no deployment of {checksum} in {}", dir.display()))?;
        Ok(DeploymentName {
            checksum: checksum.to_string(),
            serial,
        })
    }

    /// `/run/ostree-booted` naming the booted deployment's directory by (device, inode), as
    /// ostree-prepare-root records it (`backing-root-device-inode`).
    fn write_booted_marker(&self, work: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = self.sysroot().join(format!(
            "ostree/deploy/{}/deploy/{}",
            self.osname, self.booted
        ));
        let meta = std::fs::metadata(&dir).with_context(|| format!("reading {}", dir.display()))?;
        let record = glib::VariantDict::new(None);
        record.insert_value(
            "backing-root-device-inode",
            &(meta.dev(), meta.ino()).to_variant(),
        );
        let path = work.join("ostree-booted");
        std::fs::write(&path, record.end().data())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Runs trixie's `ostree ARGS` in a private mount namespace where this host looks booted.
    async fn run(&self, trixie: &Trixie, args: &[String]) -> anyhow::Result<Output> {
        let work = self.work();
        let bin = work.join("bin");
        std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
        self.write_booted_marker(&work)?;
        let stub = bin.join("systemctl");
        std::fs::write(&stub, SYSTEMCTL_STUB)
            .with_context(|| format!("writing {}", stub.display()))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("making {} executable", stub.display()))?;
        }
        let shown = format!("ostree {} (trixie {})", args.join(" "), trixie.version);
        let child = tokio::process::Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--fork",
                // A timed-out command's kill reaches the namespace's processes too.
                "--kill-child",
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(NAMESPACE_SCRIPT)
            .arg("sh")
            .arg(&trixie.root)
            .arg(self.sysroot())
            .arg(self.run_ostree())
            .arg(&work)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running `{shown}` through unshare"))?;
        let out = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
            Ok(out) => out.with_context(|| format!("waiting for `{shown}`"))?,
            Err(_) => bail!("`{shown}` did not finish within {} s", TIMEOUT.as_secs()),
        };
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            let line: String = stderr
                .trim()
                .replace('\n', "; ")
                .chars()
                .take(MAX_STDERR)
                .collect();
            bail!("`{shown}` failed ({}): {line}", out.status);
        }
        Ok(Output {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr,
        })
    }
}
