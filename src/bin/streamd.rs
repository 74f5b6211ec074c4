//! `streamd`: the node agent daemon.

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tracing::{error, info, warn};

use streamd::agent::Agent;
use streamd::backend::Backend;
use streamd::backoff::Backoff;
use streamd::cluster::node::NodeClient;
use streamd::config::{self, Config};
use streamd::host::facts::HostRoot;
use streamd::notify;

/// Moves this node between OS image streams as its Node annotations request.
///
/// Watches its own Node object, stages the requested OS image through rpm-ostreed's D-Bus API
/// (or bootc in transient systemd units where there is no rpm-ostreed) and reports on the node and on the system bus (`io.openshift.OSStream1`). Exit codes: 0 clean
/// stop, 1 runtime failure, 2 invalid configuration (the unit does not restart it then).
///
/// The configuration is TOML drop-ins in /usr/lib/streamd/config.d and /etc/streamd/config.d
/// (streamd.conf(5)); `streamctl status` shows what it is doing.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Config drop-in directory; repeat (or separate with ':') to give several, lowest priority
    /// first. Default: /usr/lib/streamd/config.d, /etc/streamd/config.d.
    #[arg(long = "config-dir", env = "STREAMD_CONFIG_DIR", value_delimiter = ':')]
    config_dirs: Vec<PathBuf>,
    /// Node name (overrides the config; default: the host name).
    #[arg(long, env = "STREAMD_NODE_NAME")]
    node_name: Option<String>,
    /// Kubeconfig path (overrides the config).
    #[arg(long, env = "STREAMD_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Root directory host facts are read below (overrides the config).
    #[arg(long, env = "STREAMD_HOST_ROOT")]
    host_root: Option<PathBuf>,
    /// Write the streamd(8) man page into DIR and exit (used by packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,
}

fn main() -> ExitCode {
    streamd::logging::init();
    let args = Args::parse();
    if let Some(dir) = &args.generate_man {
        return match man_page(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("streamd: writing the man page into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            error!("invalid configuration: {e}");
            eprintln!("streamd: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("streamd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "exiting");
            eprintln!("streamd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `streamd.8`, from the same definitions as `--help`.
fn man_page(dir: &std::path::Path) -> std::io::Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    clap_mangen::Man::new(Args::command().name("streamd"))
        .section("8")
        .render(&mut out)?;
    std::fs::write(dir.join("streamd.8"), out)
}

fn load_config(args: &Args) -> Result<Config, config::ConfigError> {
    let dirs: Vec<PathBuf> = if args.config_dirs.is_empty() {
        config::DEFAULT_DIRS.iter().map(PathBuf::from).collect()
    } else {
        args.config_dirs.clone()
    };
    let mut cfg = config::load(&dirs)?;
    if let Some(n) = &args.node_name {
        cfg.node_name = Some(n.clone());
    }
    if let Some(k) = &args.kubeconfig {
        cfg.kubeconfig = k.clone();
    }
    if let Some(h) = &args.host_root {
        cfg.host_root = h.clone();
    }
    Ok(cfg)
}

/// How long `READY=1` and `STOPPING=1` are sent again while the notify socket's queue is full:
/// beyond systemd's default start timeout (90 s), it has stopped waiting.
const NOTIFY_WITHIN: Duration = Duration::from_secs(120);
/// The longest one start-up attempt (the bus, rpm-ostreed's `RegisterClient`, streamd's own
/// bus name) may take before it counts as failed and is tried again.
const START_ATTEMPT: Duration = Duration::from_secs(60);
/// Between start-up attempts: 1 s doubling to 30 s.
const START_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

async fn run(cfg: Config) -> anyhow::Result<()> {
    let host = HostRoot::new(&cfg.host_root);
    let node_name = match &cfg.node_name {
        Some(n) => n.clone(),
        None => host
            .hostname()
            .context("no node-name configured and the host name is unreadable")?,
    };
    info!(node = %node_name, sources = ?cfg.sources, "starting");
    // The local set-up is done: what comes next (the system bus, the update backend, the
    // cluster) is waited for and reported, never a reason to fail the start.
    tokio::spawn(async {
        notify::send_until_sent(&[sd_notify::NotifyState::Ready], NOTIFY_WITHIN).await
    });
    let node = NodeClient::unloaded(&cfg.kubeconfig, &node_name);
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let pinger = tokio::spawn(ping_watchdog());
    let started = tokio::select! {
        agent = start(&cfg, &host, &node) => Some(agent),
        () = &mut shutdown => None,
    };
    pinger.abort();
    let Some(agent) = started else {
        info!("stopping before the update backend was reached");
        notify::send_until_sent(&[sd_notify::NotifyState::Stopping], Duration::from_secs(5)).await;
        return Ok(());
    };
    if let Some(ns) = cfg.heartbeat_namespace.clone() {
        tokio::spawn(streamd::cluster::heartbeat::run(node, ns));
    }
    agent.run(shutdown).await
}

/// Builds the agent, trying again with [`START_BACKOFF`] while the system bus, the update
/// backend or streamd's own bus name cannot be had: a host whose rpm-ostreed is broken or not
/// yet up keeps a running, reporting streamd (journal and `STATUS=`), not a unit that used up
/// its start limit.
async fn start(cfg: &Config, host: &HostRoot, node: &NodeClient) -> Agent {
    let mut backoff = START_BACKOFF;
    loop {
        let attempt = tokio::time::timeout(START_ATTEMPT, try_start(cfg, host, node)).await;
        let error = match attempt {
            Ok(Ok(agent)) => return agent,
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => format!(
                "the system bus or the update backend did not answer within {} s",
                START_ATTEMPT.as_secs()
            ),
        };
        let delay = backoff.next_delay();
        warn!(error = %error, retry_in_s = delay.as_secs(), "cannot start yet; retrying");
        notify::status(&format!(
            "Waiting: {error}; retrying in {} s",
            delay.as_secs()
        ));
        tokio::time::sleep(delay).await;
    }
}

/// One attempt of [`start`].
async fn try_start(cfg: &Config, host: &HostRoot, node: &NodeClient) -> anyhow::Result<Agent> {
    let backend = Backend::connect(
        cfg.backend,
        &cfg.bootc_path,
        &cfg.runtime_dir,
        &cfg.host_root,
    )
    .await?;
    info!(backend = backend.kind().as_str(), "update backend");
    let gatherer = streamd::agent::gather::Gatherer {
        host: host.clone(),
        pull_secret: cfg.pull_secret.clone(),
        registries: streamd::image::registry::Access {
            plain: cfg.insecure_registries.clone(),
            trusted_hosts: cfg.registry_trusted_hosts.clone(),
        },
        runtime_dir: cfg.runtime_dir.clone(),
        policy: cfg.policy.clone(),
        images: cfg.images.clone(),
        inspector: Default::default(),
        in_use: Default::default(),
        read: streamd::agent::gather::ReadinessReads::new(node.name(), cfg.resolve_spread),
    };
    let reboot = streamd::agent::Settings {
        policy: cfg.reboot,
        max_attempts: cfg.max_attempts,
        pull_retries: cfg.pull_retries,
        state_dir: cfg.state_dir.clone(),
        resolve_streams: cfg.resolve_streams,
        resolve_spread: cfg.resolve_spread,
        mode: cfg.mode,
    };
    Agent::new(node.clone(), backend, gatherer, reboot).await
}

/// `WATCHDOG=1` at half the watchdog interval while the agent's loop, which pings on its own,
/// is not running yet.
async fn ping_watchdog() {
    let Some(every) = notify::watchdog_interval() else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        notify::send(&[sd_notify::NotifyState::Watchdog]);
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers the default action (exit) still stops the daemon.
        _ => std::future::pending().await,
    }
}
