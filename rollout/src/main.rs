//! `streamd-rollout`: the StreamPool controller (docs in README "Pools").

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
    /// Lease when it holds it.
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
        /// Lease validity in seconds: how long a new leader waits after the old one stopped.
        #[arg(long, default_value_t = leader::LEASE_SECONDS, value_parser = clap::value_parser!(u64).range(2..=3600))]
        lease_seconds: u64,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", rollout::crd::crd_yaml().context("rendering the CRD")?);
            Ok(())
        }
        Command::Run {
            lease_name,
            lease_namespace,
            identity,
            lease_seconds,
        } => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .init();
            let client = kube::Client::try_default()
                .await
                .context("connecting to the API server")?;
            let lease = Lease {
                name: lease_name,
                namespace: lease_namespace,
                identity,
                seconds: lease_seconds,
            };
            let mut held = leader::elect(client.clone(), &lease)
                .await
                .context("joining the leader election")?;
            tracing::info!(identity = %lease.identity, lease = %lease.name, "waiting for the lease");
            loop {
                tokio::select! {
                    ok = leader::acquired(&mut held) => {
                        if !ok {
                            anyhow::bail!("the leader election ended");
                        }
                    }
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
                tracing::info!(identity = %lease.identity, "leading");
                let lost = leader::lost(held.clone());
                rollout::controller::run(client.clone(), lost).await;
                tracing::warn!(identity = %lease.identity, "lost the lease; stopped");
            }
        }
    }
}
