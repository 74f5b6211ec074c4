//! Leader election on a `coordination.k8s.io/v1` Lease with `kube-lease-manager` (made for
//! kube 5 / k8s-openapi 0.29): of the Deployment's replicas only the holder runs the
//! controller; it stops at once when the lease is lost, and a new holder continues from the
//! cluster's state (the planner keeps no memory).
//!
//! The crate takes a free lease with a server-side apply of `holderIdentity`, so two replicas
//! cannot both take it (the second apply conflicts on the field the first one owns), and renews
//! with a strategic-merge patch; the Lease duration (default 15 s) bounds the time a stopped leader's
//! replica keeps the lease.

use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

/// Default lease validity after the last renewal.
pub const LEASE_SECONDS: u64 = 15;

/// Where the lease is and who we are.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Lease name.
    pub name: String,
    /// Lease namespace (the controller's own).
    pub namespace: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// Validity after the last renewal (the holder renews in the last third); a new leader
    /// takes over at most this long after the old one stopped renewing.
    pub seconds: u64,
}

/// The running election: it ends (releasing the lease if held) once every receiver of its
/// channel is dropped.
pub type Election = tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>;

/// Starts competing for the lease; the receiver says whether this replica holds it.
pub async fn elect(
    client: kube::Client,
    lease: &Lease,
) -> Result<(watch::Receiver<bool>, Election), LeaseManagerError> {
    let manager = LeaseManagerBuilder::new(client, &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(lease.seconds)
        .with_grace((lease.seconds / 3).max(1))
        .with_field_manager(format!("streamd-rollout-{}", lease.identity))
        .build()
        .await?;
    Ok(manager.watch().await)
}

/// Completes when `rx` says the lease is held.
pub async fn acquired(rx: &mut watch::Receiver<bool>) -> bool {
    rx.wait_for(|held| *held).await.is_ok()
}

/// Completes when the lease is lost (or the election ended).
pub async fn lost(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|held| !*held).await;
}
