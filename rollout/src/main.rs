//! `streamd-rollout`: the StreamPool controller (docs/pools.md).

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rollout::leader::{self, Lease};

/// Moves StreamPools' nodes between OS image streams, a few at a time.
#[derive(Parser, Debug)]
#[command(name = "streamd-rollout", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the StreamPool CustomResourceDefinition (YAML), generated from the Rust types.
    Crd,
    /// Run the controller (with the in-cluster or KUBECONFIG credentials), as leader of the
    /// Lease when it holds it. Logs go to stderr at the level `RUST_LOG` names (`error`, `warn`,
    /// `info`, `debug`, `trace`, `off`; default `info`).
    Run {
        /// Lease name.
        #[arg(long, default_value = "streamd-rollout", env = "LEASE_NAME")]
        lease_name: String,
        /// Lease namespace.
        #[arg(long, env = "POD_NAMESPACE", default_value = "streamd-rollout")]
        lease_namespace: String,
        /// This replica's identity in the Lease.
        #[arg(long, env = "POD_NAME")]
        identity: String,
        /// Compete for the Lease and run only while holding it (as kube-controller-manager's
        /// `--leader-elect`); `false` runs at once, for a single replica.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        leader_elect: bool,
        /// Lease validity in seconds: how long a new leader waits after the old one stopped.
        #[arg(long, default_value_t = leader::LEASE_SECONDS, value_parser = clap::value_parser!(u64).range(2..=3600))]
        lease_seconds: u64,
        /// Namespace of the nodes' streamd heartbeat Leases (streamd's `heartbeat-namespace`);
        /// "" reads none. A Ready node whose Lease ran out is reported and not taken for a reboot.
        #[arg(long, env = "HEARTBEAT_NAMESPACE", default_value = rollout::heartbeat::DEFAULT_NAMESPACE)]
        heartbeat_namespace: String,
        /// The node this replica runs on (the downward API's `spec.nodeName`): the pool that
        /// has it takes it last. "": unknown.
        #[arg(long, env = "NODE_NAME", default_value = "")]
        node_name: String,
        /// Where `/metrics` (OpenMetrics text, for Prometheus), `/healthz` (the process serves)
        /// and `/readyz` (it joined the leader election) are served, e.g. `0.0.0.0:8080` (the
        /// shipped Deployment's); "" serves none.
        #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "")]
        metrics_bind_address: String,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => print_crd(),
        Command::Run {
            lease_name,
            lease_namespace,
            identity,
            leader_elect,
            lease_seconds,
            heartbeat_namespace,
            node_name,
            metrics_bind_address,
        } => {
            init_logging();
            let heartbeats = Some(heartbeat_namespace.as_str()).filter(|ns| !ns.is_empty());
            let node_name = Some(node_name.as_str()).filter(|n| !n.is_empty());
            let metrics = serve_metrics(&metrics_bind_address).await?;
            let config = kube::Config::infer()
                .await
                .context("reading the API server's configuration")?;
            let clients =
                rollout::controller::Clients::new(config).context("building the API clients")?;
            let stop = stop_on_signal();
            let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if !leader_elect {
                tracing::info!("running without leader election");
                metrics.set_leader(true);
                rollout::controller::run(
                    clients,
                    &identity,
                    heartbeats,
                    node_name,
                    metrics.clone(),
                    leader::Fence::none(),
                    stopped(stop.clone()),
                )
                .await;
                return Ok(());
            }
            let lease = Lease {
                name: lease_name,
                namespace: lease_namespace,
                identity,
                seconds: lease_seconds,
            };
            let (mut held, election) = leader::elect(clients.main.clone(), &lease)
                .await
                .context("joining the leader election")?;
            let fence = leader::follow(clients.watch.clone(), &lease);
            metrics.set_ready();
            tracing::info!(identity = %lease.identity, lease = %lease.name, "waiting for the lease");
            loop {
                tokio::select! {
                    ok = leader::acquired(&mut held) => {
                        if !ok {
                            anyhow::bail!("the leader election ended");
                        }
                    }
                    () = stopped(stop.clone()) => break,
                }
                // Held by the election's account; acting waits until the API server shows it.
                let mut proving = fence.clone();
                tokio::select! {
                    () = proving.proven() => {}
                    () = leader::lost(held.clone()) => continue,
                    () = stopped(stop.clone()) => break,
                }
                tracing::info!(identity = %lease.identity, "leading");
                metrics.set_leader(true);
                let lost = leader::lost(held.clone());
                let broken = fence.clone().broken();
                let stopping = stopped(stop.clone());
                rollout::controller::run(
                    clients.clone(),
                    &lease.identity,
                    heartbeats,
                    node_name,
                    metrics.clone(),
                    fence.clone(),
                    async move {
                        tokio::select! { () = lost => {}, () = broken => {}, () = stopping => {} }
                    },
                )
                .await;
                metrics.set_leader(false);
                if *stop.borrow() {
                    break;
                }
                tracing::warn!(
                    identity = %lease.identity,
                    "lost the lease, or could not prove holding it in time; stopped acting"
                );
            }
            // Hand the lease over at once rather than after it expires.
            drop(held);
            hand_over(election).await;
            Ok(())
        }
    }
}

/// Logs to stderr at the level `RUST_LOG` names (`error`, `warn`, `info`, `debug`, `trace`,
/// `off`; default and unreadable: `info`, the latter said in a warning).
fn init_logging() {
    let given = std::env::var("RUST_LOG").ok();
    let level = given
        .as_deref()
        .map(str::parse::<tracing::level_filters::LevelFilter>);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(match level {
            Some(Ok(l)) => l,
            _ => tracing::level_filters::LevelFilter::INFO,
        })
        .init();
    if let Some(Err(_)) = level {
        tracing::warn!(
            rust_log = %streamd::text::one_line(given.as_deref().unwrap_or_default(), 64),
            "RUST_LOG is not a level (error, warn, info, debug, trace, off); logging at info"
        );
    }
}

/// Prints the CRD.
fn print_crd() -> anyhow::Result<()> {
    print!("{}", rollout::crd::crd_yaml().context("rendering the CRD")?);
    Ok(())
}

/// The metrics, served on `addr` unless it is "".
async fn serve_metrics(addr: &str) -> anyhow::Result<std::sync::Arc<rollout::metrics::Metrics>> {
    let metrics = std::sync::Arc::new(rollout::metrics::Metrics::default());
    if !addr.is_empty() {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("serving metrics on {addr}"))?;
        tokio::spawn(metrics.clone().serve(listener));
    }
    Ok(metrics)
}

/// Turns `true` on SIGTERM or SIGINT.
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        signal().await;
        let _ = stop_tx.send(true);
    });
    stop
}

/// Waits a little for the election to release the lease.
async fn hand_over(election: leader::Election) {
    match tokio::time::timeout(std::time::Duration::from_secs(3), election).await {
        Ok(Ok(Ok(_))) => tracing::info!("released the lease"),
        _ => tracing::warn!("could not release the lease; it expires by itself"),
    }
}

/// Completes on SIGTERM (the kubelet stopping the pod) or SIGINT.
async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
