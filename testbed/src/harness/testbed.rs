//! The single-node testbed: one node host, the registry and the fake API server, with the
//! control socket in front of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::cluster::{admin_env, image_env, prepare_cluster, start_registry, write_env};
use super::control_socket::serve_control;
pub use super::node_host::Backend;
use super::node_host::{HostSetup, NodeHost};
use crate::control::{Command, Request, TestbedCmd};
use crate::fakes::apiserver::{ApiServer, ApiServerConfig};
use crate::fakes::bus::Bus;
use crate::fakes::registry::Registry;
pub use crate::fakes::rpmostreed::RpmOstreeVersion;
use crate::fixtures::images::TestImage;
pub use crate::fixtures::openshift::{FeatureSet, OpenShift};

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
    /// The rpm-ostree release the fake rpm-ostreed plays (default: the newest).
    pub rpm_ostree: RpmOstreeVersion,
    /// The OpenShift release played (default: the newest).
    pub openshift: OpenShift,
    /// Its feature set (default: [`OpenShift::default_feature_set`]).
    pub feature_set: Option<FeatureSet>,
    /// The fake rpm-ostreed stages, locks, finalizes and cleans up through real libostree
    /// 2025.x (the trixie root `scripts/setup.sh` makes; root only, rpm-ostree backend only;
    /// default off). See docs/testbed.md, "Real libostree 2025".
    pub real_libostree: bool,
}

impl Options {
    /// A testbed in `dir` on the `default` host.
    pub fn new(dir: impl Into<PathBuf>) -> Options {
        Options {
            dir: dir.into(),
            host: "default".into(),
            backend: Backend::default(),
            rpm_ostree: RpmOstreeVersion::default(),
            openshift: OpenShift::default(),
            feature_set: None,
            real_libostree: false,
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

impl std::fmt::Debug for Testbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbed").finish_non_exhaustive()
    }
}

struct Components {
    apiserver: ApiServer,
    host: NodeHost,
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
                rpm_ostree: opts.rpm_ostree,
                real_libostree: opts.real_libostree,
                openshift: opts.openshift,
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
        let feature_set = opts
            .feature_set
            .unwrap_or(opts.openshift.default_feature_set());
        prepare_cluster(&apiserver, &registry, opts.openshift, feature_set)?;

        let mut env = host.streamd_env(&kubeconfig);
        env.extend(image_env(&registry, &pull_secret));
        env.extend(admin_env(&dir, apiserver.url()));
        let inner = Arc::new(Components { apiserver, host });
        // Weak: dropping the testbed stops its bus and fakes even though the socket task lives on.
        let control = Arc::downgrade(&inner);
        serve_control(&dir.join("control.sock"), move |cmd| {
            let c = control.upgrade();
            async move {
                let c = c.context("the testbed has stopped")?;
                dispatch(&c, cmd).await
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

    /// Runs one control command (what `DIR/control.sock` takes as JSON).
    pub async fn control(&self, cmd: impl Into<Request>) -> anyhow::Result<Value> {
        dispatch(&self.inner, cmd.into()).await
    }
}

/// Runs `request` on the single node; its `node` is ignored.
async fn dispatch(c: &Components, request: Request) -> anyhow::Result<Value> {
    match request.command {
        Command::Testbed(TestbedCmd::Reboot { fail_finalize }) => {
            c.host.reboot(fail_finalize).await
        }
        Command::Testbed(other) => {
            bail!("{other:?} is a fleet command (the single-node testbed has reboot)")
        }
        Command::Apiserver(cmd) => c.apiserver.control(cmd).await,
        host => c.host.control(host).await,
    }
}
