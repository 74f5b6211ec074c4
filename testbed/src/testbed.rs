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
    inner: Arc<Components>,
    env: BTreeMap<String, String>,
    images: Vec<TestImage>,
    registry: Registry,
}

struct Components {
    apiserver: ApiServer,
    host: NodeHost,
}

/// One node's host: its private system bus, the fake rpm-ostreed (with systemd, logind and bootc
/// on the same bus), the host root streamd reads and streamd's config, all below one directory.
/// The single-node testbed has one, a fleet one per node.
pub(crate) struct NodeHost {
    node: String,
    dir: PathBuf,
    bus: Bus,
    rpmostreed: FakeRpmOstreed,
    /// systemd, logind and bootc; bootc acts on the fake rpm-ostreed's host model.
    systemd: FakeSystemd,
    logind: FakeLogind,
    bootc: FakeBootc,
    /// The host fixture, rewritten for what boots by a simulated reboot.
    fixture: crate::fixtures::Fixture,
    images: Vec<TestImage>,
}

/// What a node host needs from the cluster around it.
pub(crate) struct HostSetup<'a> {
    /// The node's name (its Node object and `system:node:<name>` identity).
    pub(crate) node: &'a str,
    /// Host fixture name.
    pub(crate) host: &'a str,
    pub(crate) backend: Backend,
    pub(crate) registry: &'a Registry,
    /// The node identity's kubeconfig (it may be written after the host starts).
    pub(crate) kubeconfig: &'a Path,
    pub(crate) pull_secret: &'a Path,
}

impl NodeHost {
    /// Starts the bus and the fakes in `dir` and writes the host root (booted on the first
    /// image, `rhel-9`) and streamd's config.
    pub(crate) async fn start(dir: &Path, setup: &HostSetup<'_>) -> anyhow::Result<NodeHost> {
        let fixture = crate::fixtures::fixture(setup.host)?;
        for sub in ["bus", "host", "config.d", "state", "rpmostreed", "run"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let registry = setup.registry;
        // The variant images and the later rhel-10 build can be pulled too, after the catalog's.
        let images: Vec<_> = registry
            .images()
            .iter()
            .chain(registry.variant_images())
            .chain(std::iter::once(registry.update_image()))
            .cloned()
            .collect();
        let booted = images.first().context("empty image catalog")?.clone();
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
        if setup.backend == Backend::Bootc {
            // The host model stays; only the daemon's name goes.
            rpmostreed.leave_bus().await?;
        }
        let systemd = FakeSystemd::start(bus.address())
            .await
            .context("starting the fake systemd")?;
        // StartUnit finds bootloader-update.service below the host root.
        systemd.set_host_root(dir.join("host"));
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
        crate::host::write(&dir.join("host"), setup.node, &booted, &fixture, &cmdline)?;
        crate::host::keep_boot_id(&dir.join("host"))?;
        // The node's container stack configuration; the OS daemons
        // pull with the ostree auth file the machine-config daemon would link there.
        crate::registry::node::write_node_config(&dir.join("host"), &registry.pull_secret_json())?;
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
        let mut config = format!(
            "# written by the testbed\nnode-name = {node:?}\nkubeconfig = {kc:?}\nhost-root = {hr:?}\n\
             pull-secret = {ps:?}\nruntime-dir = {rd:?}\nstate-dir = {sd:?}\nbootc-path = {bc:?}\n\
             insecure-registries = [{reg:?}]\n",
            node = setup.node,
            kc = setup.kubeconfig.display().to_string(),
            hr = dir.join("host").display().to_string(),
            ps = setup.pull_secret.display().to_string(),
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
        std::fs::write(dir.join("config.d/50-testbed.toml"), config)
            .context("writing the streamd config")?;
        Ok(NodeHost {
            node: setup.node.to_string(),
            dir: dir.to_path_buf(),
            bus,
            rpmostreed,
            systemd,
            logind,
            bootc,
            fixture,
            images,
        })
    }

    /// The environment streamd (and `streamctl`) run with on this host.
    pub(crate) fn streamd_env(&self, kubeconfig: &Path) -> BTreeMap<String, String> {
        let path = |p: &str| self.dir.join(p).display().to_string();
        BTreeMap::from([
            (
                "DBUS_SYSTEM_BUS_ADDRESS".to_string(),
                self.bus.address().to_string(),
            ),
            ("STREAMD_NODE_NAME".into(), self.node.clone()),
            ("STREAMD_CONFIG_DIR".into(), path("config.d")),
            ("STREAMD_HOST_ROOT".into(), path("host")),
            ("STREAMD_STATE_DIR".into(), path("state")),
            (
                "STREAMD_KUBECONFIG".into(),
                kubeconfig.display().to_string(),
            ),
            (
                "TESTBED_BOOTC".into(),
                self.bootc.program().display().to_string(),
            ),
        ])
    }

    /// The private system bus.
    pub(crate) fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Whether a reboot was asked for (`FinalizeDeployment` with reboot, or logind's `Reboot`)
    /// and not yet performed: the fake's `reboot_requested`, read from its state file.
    pub(crate) fn reboot_requested(&self) -> bool {
        std::fs::read_to_string(self.dir.join("rpmostreed/state.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .is_some_and(|state| state["reboot_requested"] == Value::Bool(true))
    }

    /// Reboots the host: the fake rpm-ostreed applies an unlocked staged deployment (a locked
    /// one is discarded), then the host root is rewritten for what booted, with a new boot id.
    /// streamd is not touched: whoever started it stops it before and starts it after.
    pub(crate) async fn reboot(&self, fail_finalize: bool) -> anyhow::Result<Value> {
        let out = self.rpmostreed.simulate_reboot(fail_finalize).await?;
        let root = self.dir.join("host");
        let image = self
            .images
            .iter()
            .find(|i| i.digest == out.booted_digest)
            .with_context(|| format!("booted image {} is not in the catalog", out.booted_digest))?;
        let previous_boot = crate::host::boot_id(&root)?;
        crate::host::write(&root, &self.node, image, &self.fixture, &out.cmdline)?;
        crate::host::boot(&root, &out.booted_kernel)?;
        if out.finalize_failed {
            // What ostree-finalize-staged.service leaves in the journal of the boot it failed in.
            crate::host::journal_finalize_failure(
                &root,
                &previous_boot,
                &crate::host::boot_id(&root)?,
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

    /// The host's current boot id and booted kernel (what its kubelet reports).
    pub(crate) fn boot_facts(&self) -> anyhow::Result<(String, String)> {
        let root = self.dir.join("host");
        let kernel = std::fs::read_to_string(root.join("proc/sys/kernel/osrelease"))
            .context("reading the host's kernel release")?;
        Ok((crate::host::boot_id(&root)?, kernel.trim().to_string()))
    }

    /// Runs a control command for one of the host's fakes (`target` rpmostreed, systemd,
    /// logind or bootc); `None` for other targets.
    pub(crate) async fn control(&self, cmd: &Value) -> Option<anyhow::Result<Value>> {
        Some(match cmd.get("target").and_then(Value::as_str) {
            Some("rpmostreed") => self.rpmostreed.control(cmd).await,
            Some("systemd") => self.systemd.control(cmd).await,
            Some("logind") => self.logind.control(cmd).await,
            Some("bootc") => self.bootc.control(cmd),
            _ => return None,
        })
    }
}

/// Applies what a cluster with streamd deployed has: its RBAC and the OSImageStream `cluster`
/// publishing `rhel-9` (the default) and `rhel-10` with the registry's images.
pub(crate) fn prepare_cluster(apiserver: &ApiServer, registry: &Registry) -> anyhow::Result<()> {
    apiserver.create_manifests(include_str!("../../docs/deploy/rbac.yaml"))?;
    let images = registry.images();
    let stream_images = |i: usize, stream: &str| StreamImages {
        name: stream.into(),
        os_image: images
            .get(i)
            .map(|i| i.pullspec.clone())
            .unwrap_or_default(),
        extensions_image: extensions_of(registry, stream),
    };
    apiserver.create_os_image_stream(
        "rhel-9",
        &[stream_images(0, "rhel-9"), stream_images(1, "rhel-10")],
    )
}

/// The extensions image of `stream`, or "".
fn extensions_of(registry: &Registry, stream: &str) -> String {
    registry
        .extensions()
        .iter()
        .find(|e| e.stream == stream)
        .map(|e| e.pullspec.clone())
        .unwrap_or_default()
}

/// Starts the registry in `dir/registry` and writes `dir/pull-secret.json` for it.
pub(crate) async fn start_registry(dir: &Path) -> anyhow::Result<(Registry, PathBuf)> {
    let registry = Registry::start(RegistryConfig {
        dir: dir.join("registry"),
    })
    .await
    .context("starting the registry")?;
    let pull_secret = dir.join("pull-secret.json");
    std::fs::write(&pull_secret, registry.pull_secret_json()).context("writing the pull secret")?;
    Ok((registry, pull_secret))
}

/// The `TESTBED_*` image and registry variables of `DIR/env`.
pub(crate) fn image_env(registry: &Registry, pull_secret: &Path) -> BTreeMap<String, String> {
    let image = |i: usize| {
        registry
            .images()
            .get(i)
            .map(|i| i.pullspec.clone())
            .unwrap_or_default()
    };
    BTreeMap::from([
        ("TESTBED_RHEL9_IMAGE".to_string(), image(0)),
        ("TESTBED_RHEL10_IMAGE".into(), image(1)),
        (
            "TESTBED_RHEL9_EXTENSIONS_IMAGE".into(),
            extensions_of(registry, "rhel-9"),
        ),
        (
            "TESTBED_RHEL10_EXTENSIONS_IMAGE".into(),
            extensions_of(registry, "rhel-10"),
        ),
        ("TESTBED_REGISTRY".into(), registry.host().to_string()),
        (
            "TESTBED_PULL_SECRET".into(),
            pull_secret.display().to_string(),
        ),
    ])
}

impl Testbed {
    /// Starts the bus, the fakes and the control socket, then writes `DIR/env` (last, so its
    /// presence means the testbed is up).
    pub async fn start(opts: Options) -> anyhow::Result<Testbed> {
        let dir = std::path::absolute(&opts.dir)
            .with_context(|| format!("resolving {}", opts.dir.display()))?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = std::fs::remove_file(dir.join("env"));
        // A real registry holding the OS and extensions images the node is asked to move to.
        let (registry, pull_secret) = start_registry(&dir).await?;
        let images = registry.images().to_vec();
        let kubeconfig = dir.join("kubeconfig");
        let host = NodeHost::start(
            &dir,
            &HostSetup {
                node: NODE_NAME,
                host: &opts.host,
                backend: opts.backend,
                registry: &registry,
                kubeconfig: &kubeconfig,
                pull_secret: &pull_secret,
            },
        )
        .await?;
        let apiserver = ApiServer::start(ApiServerConfig {
            dir: dir.clone(),
            node_name: NODE_NAME.into(),
        })
        .await
        .context("starting the fake API server")?;
        // A cluster with streamd deployed: its RBAC applied and the two streams published.
        prepare_cluster(&apiserver, &registry)?;

        let mut env = host.streamd_env(&kubeconfig);
        env.extend(image_env(&registry, &pull_secret));
        env.extend([
            (
                "KUBECONFIG".to_string(),
                dir.join("kubeconfig-admin").display().to_string(),
            ),
            ("TESTBED_DIR".into(), dir.display().to_string()),
            ("TESTBED_API_URL".into(), apiserver.url().to_string()),
        ]);
        let inner = Arc::new(Components { apiserver, host });
        // Weak: dropping the testbed stops its bus and fakes even though the socket task lives on.
        let control = Arc::downgrade(&inner);
        serve_control(&dir.join("control.sock"), move |cmd| {
            let c = control.upgrade();
            async move {
                let c = c.context("the testbed has stopped")?;
                dispatch(&c, &cmd).await
            }
        })?;
        write_env(&dir, &env)?;
        Ok(Testbed {
            dir,
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
        self.inner.host.bus()
    }

    /// Simulates a reboot of the host (see [`NodeHost::reboot`]).
    pub async fn reboot(&self, fail_finalize: bool) -> anyhow::Result<Value> {
        self.inner.host.reboot(fail_finalize).await
    }

    /// Runs one control command (the same JSON as on `DIR/control.sock`).
    pub async fn control(&self, cmd: &Value) -> anyhow::Result<Value> {
        dispatch(&self.inner, cmd).await
    }
}

/// Reads the `"fail-finalize"` flag of a reboot command.
pub(crate) fn fail_finalize_flag(cmd: &Value) -> anyhow::Result<bool> {
    Ok(cmd
        .get("fail-finalize")
        .map(|v| v.as_bool().context("\"fail-finalize\" must be a boolean"))
        .transpose()?
        .unwrap_or(false))
}

async fn dispatch(c: &Components, cmd: &Value) -> anyhow::Result<Value> {
    match cmd.get("target").and_then(Value::as_str) {
        Some("testbed") => match cmd.get("cmd").and_then(Value::as_str) {
            Some("reboot") => c.host.reboot(fail_finalize_flag(cmd)?).await,
            other => bail!("unknown testbed command {other:?} (reboot)"),
        },
        Some("apiserver") => c.apiserver.control(cmd).await,
        Some(other) => match c.host.control(cmd).await {
            Some(result) => result,
            None => bail!(
                "unknown control target {other:?} (testbed, rpmostreed, apiserver, systemd, logind, bootc)"
            ),
        },
        None => bail!("control command without \"target\""),
    }
}

pub(crate) fn write_env(dir: &Path, env: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let mut text = String::from("# written by `testbed up`; source it: . DIR/env\n");
    for (k, v) in env {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("env")).context("publishing DIR/env")?;
    Ok(())
}

/// Serves `DIR/control.sock`: one JSON command per line, answered by `handle`.
pub(crate) fn serve_control<F, Fut>(path: &Path, handle: F) -> anyhow::Result<()>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<Value>> + Send + 'static,
{
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    let handle = Arc::new(handle);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                if let Err(e) = control_session(stream, &*handle).await {
                    warn!(error = %e, "control session failed");
                }
            });
        }
    });
    Ok(())
}

async fn control_session<F, Fut>(stream: UnixStream, handle: &F) -> anyhow::Result<()>
where
    F: Fn(Value) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Value>>,
{
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(cmd) => match handle(cmd).await {
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
