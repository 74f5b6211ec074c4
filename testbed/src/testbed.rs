//! Starting, describing and controlling a whole testbed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::warn;

use crate::apiserver::{ApiServer, ApiServerConfig, StreamImages};
use crate::bootc::FakeBootc;
use crate::bus::Bus;
use crate::images::TestImage;
use crate::logind::FakeLogind;
use crate::registry::{Registry, RegistryConfig};
use crate::rpmostreed::{FakeRpmOstreed, RpmOstreedConfig};
use crate::systemd::FakeSystemd;

/// The error a failed finalization logs (what a bootloader failure at shutdown looks like).
const FINALIZE_FAILURE: &str =
    "error: Bootloader write config: grub2-mkconfig: Child process exited with code 1";

/// Node name of the testbed's node.
pub const NODE_NAME: &str = "worker-0";

/// How to start a testbed.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory holding everything (created if missing).
    pub dir: PathBuf,
    /// Host fixture name (`crate::fixtures::NAMES`), e.g. `default` or `realtime`.
    pub host: String,
    /// Which OS update tool the host has.
    pub backend: Backend,
}

/// The OS update tool of the testbed host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// rpm-ostreed owns its name on the bus (and `bootc` is installed too, as on RHCOS).
    #[default]
    RpmOstree,
    /// No rpm-ostreed on the bus: `bootc`, run through the fake systemd.
    Bootc,
}

impl Options {
    /// A testbed in `dir` on the `default` host.
    pub fn new(dir: impl Into<PathBuf>) -> Options {
        Options {
            dir: dir.into(),
            host: "default".into(),
            backend: Backend::default(),
        }
    }
}

/// A running testbed. Dropping it stops the bus; the fakes live in this process's runtime.
pub struct Testbed {
    dir: PathBuf,
    bus: Bus,
    inner: Arc<Components>,
    env: BTreeMap<String, String>,
    images: Vec<TestImage>,
    registry: Registry,
}

struct Components {
    rpmostreed: FakeRpmOstreed,
    apiserver: ApiServer,
    /// systemd, logind and bootc; bootc acts on the fake rpm-ostreed's host model.
    systemd: FakeSystemd,
    logind: FakeLogind,
    bootc: FakeBootc,
    /// The host root and fixture, rewritten by a simulated reboot.
    host: HostModel,
}

/// What a simulated reboot rewrites below the host root.
struct HostModel {
    root: PathBuf,
    fixture: crate::fixtures::Fixture,
    images: Vec<TestImage>,
}

impl Testbed {
    /// Starts the bus, the fakes and the control socket, then writes `DIR/env` (last, so its
    /// presence means the testbed is up).
    pub async fn start(opts: Options) -> anyhow::Result<Testbed> {
        let dir = std::path::absolute(&opts.dir)
            .with_context(|| format!("resolving {}", opts.dir.display()))?;
        let fixture = crate::fixtures::fixture(&opts.host)?;
        for sub in ["bus", "host", "config.d", "state", "rpmostreed", "run"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let _ = std::fs::remove_file(dir.join("env"));
        // A real registry holding the OS and extensions images the node is asked to move to.
        let registry = Registry::start(RegistryConfig {
            dir: dir.join("registry"),
        })
        .await
        .context("starting the registry")?;
        let images = registry.images().to_vec();
        let booted = images.first().context("empty image catalog")?.clone();
        let extensions = |stream: &str| {
            registry
                .extensions()
                .iter()
                .find(|e| e.stream == stream)
                .map(|e| e.pullspec.clone())
                .unwrap_or_default()
        };
        let pull_secret = dir.join("pull-secret.json");
        std::fs::write(&pull_secret, registry.pull_secret_json())
            .context("writing the pull secret")?;

        let bus = Bus::start(&dir.join("bus")).await?;
        let rpmostreed = FakeRpmOstreed::start(RpmOstreedConfig {
            bus_address: bus.address().to_string(),
            txn_socket: dir.join("rpm-ostree-transaction.sock"),
            state_dir: dir.join("rpmostreed"),
            sysroot: dir.join("sysroot"),
            host_root: Some(dir.join("host")),
            fixture,
            osname: "rhcos".into(),
            images: images.clone(),
            booted: 0,
        })
        .await
        .context("starting the fake rpm-ostreed")?;
        if opts.backend == Backend::Bootc {
            // The host model stays; only the daemon's name goes.
            rpmostreed.leave_bus().await?;
        }
        let systemd = FakeSystemd::start(bus.address())
            .await
            .context("starting the fake systemd")?;
        let host = rpmostreed.host();
        let logind = FakeLogind::start(bus.address(), Box::new(move || host.record_reboot()))
            .await
            .context("starting the fake logind")?;
        let bootc = FakeBootc::start(&bus, &rpmostreed, &dir.join("bin/bootc"))
            .await
            .context("starting the fake bootc")?;
        // After the sysroot exists: /proc/cmdline is the booted deployment's entry.
        let cmdline = rpmostreed
            .booted_cmdline()
            .context("the fake rpm-ostreed has no booted deployment")?;
        crate::host::write(&dir.join("host"), NODE_NAME, &booted, &fixture, &cmdline)?;
        crate::host::keep_boot_id(&dir.join("host"))?;
        // Hook (creds, issue 11 §3): the node's container stack configuration; the OS daemons
        // pull with the ostree auth file the machine-config daemon would link there.
        crate::registry::node::write_node_config(&dir.join("host"), &registry.pull_secret_json())?;
        let apiserver = ApiServer::start(ApiServerConfig {
            dir: dir.clone(),
            node_name: NODE_NAME.into(),
        })
        .await
        .context("starting the fake API server")?;
        // A cluster with streamd deployed: its RBAC applied and the two streams published.
        apiserver.create_manifests(include_str!("../../docs/deploy/rbac.yaml"))?;
        let stream_images = |i: usize, stream: &str| StreamImages {
            name: stream.into(),
            os_image: images
                .get(i)
                .map(|i| i.pullspec.clone())
                .unwrap_or_default(),
            extensions_image: extensions(stream),
        };
        apiserver.create_os_image_stream(
            "rhel-9",
            &[stream_images(0, "rhel-9"), stream_images(1, "rhel-10")],
        )?;

        // streamd reads the sysroot and /boot below the host root, as on a node.
        for (link, target) in [
            ("sysroot", dir.join("sysroot")),
            ("boot", dir.join("sysroot/boot")),
        ] {
            let l = dir.join("host").join(link);
            let _ = std::fs::remove_file(&l);
            std::os::unix::fs::symlink(&target, &l)
                .with_context(|| format!("linking {}", l.display()))?;
        }
        let config_dir = dir.join("config.d");
        let mut config = format!(
            "# written by the testbed\nnode-name = {node:?}\nkubeconfig = {kc:?}\nhost-root = {hr:?}\n\
             pull-secret = {ps:?}\nruntime-dir = {rd:?}\nstate-dir = {sd:?}\nbootc-path = {bc:?}\n\
             insecure-registries = [{reg:?}]\n",
            node = NODE_NAME,
            kc = dir.join("kubeconfig").display().to_string(),
            hr = dir.join("host").display().to_string(),
            ps = pull_secret.display().to_string(),
            rd = dir.join("run").display().to_string(),
            sd = dir.join("state").display().to_string(),
            bc = dir.join("bin/bootc").display().to_string(),
            reg = registry.host(),
        );
        if fixture.low_disk {
            // The sysroot here lives on the build machine's disk; asking for more free space than
            // any disk has makes streamd's disk-space check see a "full" sysroot for real.
            config.push_str("min-free-sysroot-mib = 1073741824\n");
        }
        std::fs::write(config_dir.join("50-testbed.toml"), config)
            .context("writing the streamd config")?;

        let env = BTreeMap::from([
            (
                "KUBECONFIG".to_string(),
                dir.join("kubeconfig-admin").display().to_string(),
            ),
            ("DBUS_SYSTEM_BUS_ADDRESS".into(), bus.address().to_string()),
            ("STREAMD_NODE_NAME".into(), NODE_NAME.into()),
            (
                "STREAMD_CONFIG_DIR".into(),
                config_dir.display().to_string(),
            ),
            (
                "STREAMD_HOST_ROOT".into(),
                dir.join("host").display().to_string(),
            ),
            (
                "STREAMD_STATE_DIR".into(),
                dir.join("state").display().to_string(),
            ),
            (
                "STREAMD_KUBECONFIG".into(),
                dir.join("kubeconfig").display().to_string(),
            ),
            ("TESTBED_DIR".into(), dir.display().to_string()),
            (
                "TESTBED_BOOTC".into(),
                bootc.program().display().to_string(),
            ),
            ("TESTBED_API_URL".into(), apiserver.url().to_string()),
            ("TESTBED_RHEL9_IMAGE".into(), images[0].pullspec.clone()),
            (
                "TESTBED_RHEL9_EXTENSIONS_IMAGE".into(),
                extensions("rhel-9"),
            ),
            (
                "TESTBED_RHEL10_EXTENSIONS_IMAGE".into(),
                extensions("rhel-10"),
            ),
            ("TESTBED_REGISTRY".into(), registry.host().to_string()),
            (
                "TESTBED_PULL_SECRET".into(),
                pull_secret.display().to_string(),
            ),
            (
                "TESTBED_RHEL10_IMAGE".into(),
                images
                    .get(1)
                    .map(|i| i.pullspec.clone())
                    .unwrap_or_default(),
            ),
        ]);
        let inner = Arc::new(Components {
            rpmostreed,
            apiserver,
            systemd,
            logind,
            bootc,
            host: HostModel {
                root: dir.join("host"),
                fixture,
                images: images.clone(),
            },
        });
        serve_control(&dir.join("control.sock"), inner.clone())?;
        write_env(&dir, &env)?;
        Ok(Testbed {
            dir,
            bus,
            inner,
            env,
            images,
            registry,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The variables of `DIR/env`.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The images the testbed serves (`rhel-9` first).
    pub fn images(&self) -> &[TestImage] {
        &self.images
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The private system bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Simulates a reboot of the host (see [`Components::reboot`]).
    pub async fn reboot(&self, fail_finalize: bool) -> anyhow::Result<Value> {
        self.inner.reboot(fail_finalize).await
    }

    /// Runs one control command (the same JSON as on `DIR/control.sock`).
    pub async fn control(&self, cmd: &Value) -> anyhow::Result<Value> {
        dispatch(&self.inner, cmd).await
    }
}

impl Components {
    /// Reboots the host: the fake rpm-ostreed applies an unlocked staged deployment (a locked
    /// one is discarded), then the host root is rewritten for what booted, with a new boot id.
    /// streamd is not touched: whoever started it stops it before and starts it after.
    async fn reboot(&self, fail_finalize: bool) -> anyhow::Result<Value> {
        let out = self.rpmostreed.simulate_reboot(fail_finalize).await?;
        let h = &self.host;
        let image = h
            .images
            .iter()
            .find(|i| i.digest == out.booted_digest)
            .with_context(|| format!("booted image {} is not in the catalog", out.booted_digest))?;
        let previous_boot = crate::host::boot_id(&h.root)?;
        crate::host::write(&h.root, NODE_NAME, image, &h.fixture, &out.cmdline)?;
        crate::host::boot(&h.root, &out.booted_kernel)?;
        if out.finalize_failed {
            // What ostree-finalize-staged.service leaves in the journal of the boot it failed in.
            crate::host::journal_finalize_failure(
                &h.root,
                &previous_boot,
                &crate::host::boot_id(&h.root)?,
                FINALIZE_FAILURE,
            )
            .await?;
        }
        Ok(json!({
            "applied": out.applied,
            "discarded": out.discarded,
            "finalize_failed": out.finalize_failed,
            "booted": out.booted_digest,
            "kernel": out.booted_kernel,
        }))
    }
}

async fn dispatch(c: &Components, cmd: &Value) -> anyhow::Result<Value> {
    match cmd.get("target").and_then(Value::as_str) {
        Some("testbed") => match cmd.get("cmd").and_then(Value::as_str) {
            Some("reboot") => {
                let fail = cmd
                    .get("fail-finalize")
                    .map(|v| v.as_bool().context("\"fail-finalize\" must be a boolean"))
                    .transpose()?
                    .unwrap_or(false);
                c.reboot(fail).await
            }
            other => bail!("unknown testbed command {other:?} (reboot)"),
        },
        Some("rpmostreed") => c.rpmostreed.control(cmd).await,
        Some("apiserver") => c.apiserver.control(cmd).await,
        Some("systemd") => c.systemd.control(cmd).await,
        Some("logind") => c.logind.control(cmd).await,
        Some("bootc") => c.bootc.control(cmd),
        Some(other) => bail!(
            "unknown control target {other:?} (testbed, rpmostreed, apiserver, systemd, logind, bootc)"
        ),
        None => bail!("control command without \"target\""),
    }
}

fn write_env(dir: &Path, env: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let mut text = String::from("# written by `testbed up`; source it: . DIR/env\n");
    for (k, v) in env {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("env")).context("publishing DIR/env")?;
    Ok(())
}

fn serve_control(path: &Path, c: Arc<Components>) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let c = c.clone();
            tokio::spawn(async move {
                if let Err(e) = control_session(stream, &c).await {
                    warn!(error = %e, "control session failed");
                }
            });
        }
    });
    Ok(())
}

async fn control_session(stream: UnixStream, c: &Components) -> anyhow::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(cmd) => match dispatch(c, &cmd).await {
                Ok(result) => json!({ "ok": true, "result": result }),
                Err(e) => json!({ "ok": false, "error": format!("{e:#}") }),
            },
            Err(e) => json!({ "ok": false, "error": format!("not JSON: {e}") }),
        };
        w.write_all(format!("{reply}\n").as_bytes()).await?;
    }
    Ok(())
}

/// Sends one command to a testbed's control socket (what `testbed ctl` does).
pub async fn control_client(dir: &Path, cmd: &Value) -> anyhow::Result<Value> {
    let path = dir.join("control.sock");
    let stream = UnixStream::connect(&path)
        .await
        .with_context(|| format!("connecting to {} (is the testbed up?)", path.display()))?;
    let (r, mut w) = stream.into_split();
    w.write_all(format!("{cmd}\n").as_bytes()).await?;
    let mut lines = BufReader::new(r).lines();
    let line = lines
        .next_line()
        .await?
        .context("the testbed closed the control socket")?;
    let reply: Value = serde_json::from_str(&line).context("bad reply from the testbed")?;
    if reply["ok"] == Value::Bool(true) {
        Ok(reply["result"].clone())
    } else {
        bail!("{}", reply["error"].as_str().unwrap_or("unknown error"))
    }
}
