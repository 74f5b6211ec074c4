//! The node's heartbeat: a `coordination.k8s.io/v1` Lease named after the node, in its own
//! namespace (`heartbeat-namespace`, [`crate::config::DEFAULT_HEARTBEAT_NAMESPACE`]), renewed every [`INTERVAL`] by a task beside the agent loop (a wedged loop is killed by the
//! systemd watchdog within a minute, which ends the renewals too). A node
//! whose streamd died, hangs or cannot reach the API server lets it run out: the cluster (the
//! pool controller, `kubectl get leases`) sees that without asking the node.
//!
//! A Lease, not a Node annotation, for the kubelet's reason (KEP-589): a Node write wakes every
//! watcher of Nodes in the cluster, a Lease write only those of Leases.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::node::{FIELD_MANAGER, PATCH_TIMEOUT};

/// The namespace of the Leases unless `heartbeat-namespace` says otherwise.
pub use crate::config::DEFAULT_HEARTBEAT_NAMESPACE as DEFAULT_NAMESPACE;

/// How often the loop renews the Lease: one request per node every two minutes when idle.
pub const INTERVAL: Duration = Duration::from_secs(120);

/// How often to look for loaded credentials before the first renewal.
const CREDENTIALS_POLL: Duration = Duration::from_secs(2);

/// How long a renewal counts: three intervals, so one or two lost renewals (an API server
/// restart) do not make a live node look dead.
pub const DURATION_SECONDS: i32 = 360;

/// Why a renewal failed; the next interval tries again either way.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// The API server answered with an error (403: the RBAC of docs/deploy/rbac.yaml is not
    /// applied; 404 on create: the namespace does not exist).
    #[error("the API server refused the heartbeat Lease {namespace}/{name}: {code} {message}")]
    Refused {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name (the node's).
        name: String,
        /// HTTP status.
        code: u16,
        /// The API server's message, bounded.
        message: String,
    },
    /// No answer, or the connection failed.
    #[error("the heartbeat Lease could not be written: {0}")]
    Unreachable(String),
}

impl HeartbeatError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            HeartbeatError::Refused { code: 403, .. } => "heartbeat-forbidden",
            HeartbeatError::Refused { .. } => "heartbeat-refused",
            HeartbeatError::Unreachable(_) => "heartbeat-unreachable",
        }
    }
}

/// The Lease's spec as of `renew_time` (RFC 3339 with microseconds, the MicroTime format).
pub fn spec(node: &str, renew_time: &str) -> Value {
    json!({
        "holderIdentity": node,
        "leaseDurationSeconds": DURATION_SECONDS,
        "renewTime": renew_time,
    })
}

/// Whether a Lease's holder renewed it within its duration, at `now` (seconds since the epoch).
/// A Lease without a renew time or a duration has never been renewed.
pub fn alive(lease: &Lease, now: i64) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(t), Some(d)) => t.0.as_second() + i64::from(d) >= now,
        _ => false,
    }
}

/// Renews (or first creates) the Lease for `node` in `namespace`, each request bounded by
/// [`PATCH_TIMEOUT`].
pub async fn renew(
    client: kube::Client,
    namespace: &str,
    node: &str,
) -> Result<(), HeartbeatError> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let body = json!({ "spec": spec(node, &now) });
    let params = PatchParams::default();
    let patched = bounded(api.patch(node, &params, &Patch::Merge(&body))).await;
    match patched {
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        other => return other.map(drop).map_err(|e| refused(namespace, node, e)),
    }
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": node, "namespace": namespace },
        "spec": spec(node, &now),
    }))
    .map_err(|e| HeartbeatError::Unreachable(format!("building the Lease: {e}")))?;
    let post = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    bounded(api.create(&post, &lease))
        .await
        .map(drop)
        .map_err(|e| refused(namespace, node, e))
}

/// Renews the Lease every [`INTERVAL`] (jittered, so a fleet started together spreads out) for
/// as long as the daemon runs. Nothing here affects the agent: a failure is logged (once per
/// kind, and when it clears) and the next interval tries again; before the credentials are
/// loaded there is nothing to renew with.
pub async fn run(node: super::node::NodeClient, namespace: String) {
    let mut last: Option<&'static str> = None;
    loop {
        let Some(client) = node.client() else {
            // The agent loop loads the credentials; look again soon.
            tokio::time::sleep(CREDENTIALS_POLL).await;
            continue;
        };
        {
            match renew(client, &namespace, node.name()).await {
                Ok(()) if last.is_some() => {
                    tracing::info!(namespace, "heartbeat lease renewed again");
                    last = None;
                }
                Ok(()) => tracing::debug!(namespace, "heartbeat lease renewed"),
                Err(e) if last == Some(e.label()) => {
                    tracing::debug!(label = e.label(), error = %e, "heartbeat still failing");
                }
                Err(e) => {
                    tracing::warn!(label = e.label(), error = %e, "heartbeat lease not renewed");
                    last = Some(e.label());
                }
            }
        }
        tokio::time::sleep(crate::backoff::jittered(INTERVAL)).await;
    }
}

async fn bounded<T>(f: impl Future<Output = kube::Result<T>>) -> kube::Result<T> {
    tokio::time::timeout(PATCH_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                format!("no answer within {} s", PATCH_TIMEOUT.as_secs()).into(),
            ))
        })
}

fn refused(namespace: &str, node: &str, e: kube::Error) -> HeartbeatError {
    match e {
        kube::Error::Api(s) => HeartbeatError::Refused {
            namespace: namespace.to_string(),
            name: node.to_string(),
            code: s.code,
            message: crate::text::one_line_reason(&s.message),
        },
        other => HeartbeatError::Unreachable(crate::text::one_line_reason(&other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renew: Option<&str>, duration: Option<i32>) -> Lease {
        serde_json::from_value(json!({
            "metadata": { "name": "worker-0" },
            "spec": {
                "holderIdentity": "worker-0",
                "renewTime": renew,
                "leaseDurationSeconds": duration,
            },
        }))
        .expect("lease")
    }

    #[test]
    fn the_spec_is_what_the_lease_api_takes() {
        let l: Lease = serde_json::from_value(json!({
            "metadata": { "name": "worker-0" },
            "spec": spec("worker-0", "2026-12-04T10:00:00.123456Z"),
        }))
        .expect("a valid Lease spec");
        let s = l.spec.expect("spec");
        assert_eq!(s.holder_identity.as_deref(), Some("worker-0"));
        assert_eq!(s.lease_duration_seconds, Some(DURATION_SECONDS));
        assert!(i64::from(DURATION_SECONDS) >= 2 * INTERVAL.as_secs() as i64);
    }

    #[test]
    fn a_lease_is_alive_until_its_duration_runs_out() {
        // 2026-12-04T10:00:00Z
        let renewed = 1_796_378_400;
        let l = lease(Some("2026-12-04T10:00:00.000000Z"), Some(360));
        assert!(alive(&l, renewed));
        assert!(alive(&l, renewed + 360));
        assert!(!alive(&l, renewed + 361));
        assert!(!alive(&lease(None, Some(360)), renewed));
        assert!(!alive(&lease(Some("2026-12-04T10:00:00Z"), None), renewed));
    }

    #[test]
    fn errors_have_labels() {
        let e = |code| HeartbeatError::Refused {
            namespace: crate::config::DEFAULT_HEARTBEAT_NAMESPACE.into(),
            name: "w".into(),
            code,
            message: "no".into(),
        };
        assert_eq!(e(403).label(), "heartbeat-forbidden");
        assert_eq!(e(404).label(), "heartbeat-refused");
        assert_eq!(
            HeartbeatError::Unreachable("x".into()).label(),
            "heartbeat-unreachable"
        );
        assert!(e(403).to_string().contains("streamd-node-lease/w: 403 no"));
    }
}
