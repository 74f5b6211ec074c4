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

/// A host root (`ROOT/sysroot`, `ROOT/run/ostree`) whose sysroot has one deployment, written by
/// the testbed's ostree, that real libostree takes as booted.
#[derive(Debug)]
pub struct BootedHost {
    root: PathBuf,
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
        self.root.join("sysroot")
    }

    fn run_ostree(&self) -> PathBuf {
        self.root.join("run/ostree")
    }

    fn work(&self) -> PathBuf {
        self.root.join("real-ostree")
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
    /// locked when `locked`; returns the staged deployment's name.
    ///
    /// rpm-ostree stages through `ostree_sysroot_stage_tree_with_options` and writes only the
    /// record's `locked` key; `ostree admin deploy` also touches the legacy
    /// `staged-deployment-locked` file, which is removed here so the host looks as rpm-ostree
    /// leaves it. rpm-ostree also passes an empty `overlay_initrds`, which the CLI cannot (it
    /// passes none), so the record lacks that key.
    pub async fn stage(
        &self,
        trixie: &Trixie,
        checksum: &str,
        kargs: &[String],
        locked: bool,
    ) -> anyhow::Result<(DeploymentName, Output)> {
        let work = self.work();
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let origin = work.join(format!("{checksum}.origin"));
        std::fs::write(&origin, format!("[origin]\nrefspec={checksum}\n"))
            .with_context(|| format!("writing {}", origin.display()))?;
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
        let _ = std::fs::remove_file(&origin);
        let out = out?;
        let legacy = self.run_ostree().join(LEGACY_LOCK);
        match std::fs::remove_file(&legacy) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", legacy.display())),
        }
        Ok((self.newest_deployment_of(checksum)?, out))
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
