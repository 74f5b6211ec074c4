//! The nodes' streamd heartbeats, as the controller reads them: one Lease per node, named after
//! it, in the namespace streamd renews them in (`streamd::cluster::heartbeat`). A pool's node
//! whose Lease ran out while the node is Ready has no working streamd: the planner reports it and
//! never takes it for a reboot (see `planner::plan`).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use streamd::cluster::heartbeat;

use crate::node::Heartbeat;

pub use streamd::cluster::heartbeat::DEFAULT_NAMESPACE;

/// The earliest and latest re-check of a pool whose nodes have live heartbeats.
const RECHECK: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(360));

/// Every heartbeat Lease in the store (fed by a watch of the namespace, so a reconcile makes no
/// request for them), by name; empty until the watch has listed them (or when it cannot: it
/// logs and retries), and then every node's heartbeat is [`Heartbeat::Unknown`] and nothing
/// changes for the pool.
pub fn read(store: &Store<Lease>) -> BTreeMap<String, Lease> {
    store
        .state()
        .iter()
        .filter_map(|l| Some((l.metadata.name.clone()?, l.as_ref().clone())))
        .collect()
}

/// The store [`read`] reads, and the task that keeps it (a watch of the Leases in `namespace`;
/// no trigger: a pool looks again when a heartbeat would run out).
pub fn watch(client: kube::Client, namespace: &str) -> (Store<Lease>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store();
    let api = Api::<Lease>::namespaced(client, namespace);
    let events = reflector(writer, watcher::watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(|event| async move {
            if let Err(e) = event {
                tracing::debug!(error = %e, "watching the heartbeat leases; retrying");
            }
        });
    (reader, tokio::spawn(events))
}

/// What `lease` (the node's, if any) says at `now` (Unix seconds).
pub fn of(lease: Option<&Lease>, now: i64) -> Heartbeat {
    let Some(lease) = lease else {
        return Heartbeat::Unknown;
    };
    if heartbeat::alive(lease, now) {
        return Heartbeat::Alive;
    }
    let renewed = lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map_or_else(|| "never".to_string(), |t| t.0.to_string());
    Heartbeat::Stale { renewed }
}

/// When to look again so a live heartbeat that runs out is seen soon after: just after the
/// earliest expiry among `leases`, within [`RECHECK`]; `None` when no heartbeat is alive.
pub fn recheck_after<'a>(
    leases: impl IntoIterator<Item = &'a Lease>,
    now: i64,
) -> Option<Duration> {
    leases
        .into_iter()
        .filter(|l| heartbeat::alive(l, now))
        .filter_map(|l| {
            let s = l.spec.as_ref()?;
            Some(s.renew_time.as_ref()?.0.as_second() + i64::from(s.lease_duration_seconds?))
        })
        .min()
        .map(|expiry| {
            let secs = u64::try_from(expiry - now + 1).unwrap_or(0);
            Duration::from_secs(secs).clamp(RECHECK.0, RECHECK.1)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(renew: &str, duration: i32) -> Lease {
        serde_json::from_value(json!({
            "metadata": { "name": "w1" },
            "spec": { "holderIdentity": "w1", "renewTime": renew, "leaseDurationSeconds": duration },
        }))
        .expect("lease")
    }

    // 2026-12-04T10:00:00Z
    const T: i64 = 1_796_378_400;

    #[test]
    fn a_lease_is_alive_stale_or_absent() {
        let l = lease("2026-12-04T10:00:00.000000Z", 360);
        assert_eq!(of(Some(&l), T + 100), Heartbeat::Alive);
        assert_eq!(
            of(Some(&l), T + 361),
            Heartbeat::Stale {
                renewed: "2026-12-04T10:00:00Z".into()
            }
        );
        assert_eq!(of(None, T), Heartbeat::Unknown);
    }

    #[test]
    fn the_pool_is_looked_at_again_when_the_first_live_heartbeat_would_run_out() {
        let soon = lease("2026-12-04T10:00:00.000000Z", 360);
        let later = lease("2026-12-04T10:02:00.000000Z", 360);
        let stale = lease("2026-12-04T09:00:00.000000Z", 360);
        assert_eq!(
            recheck_after([&later, &soon, &stale], T + 200),
            Some(Duration::from_secs(161))
        );
        // Bounded below and above; none alive: no re-check for heartbeats.
        assert_eq!(recheck_after([&soon], T + 355), Some(RECHECK.0));
        assert_eq!(recheck_after([&stale], T), None);
    }
}
