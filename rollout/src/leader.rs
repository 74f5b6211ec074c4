//! Leader election on a `coordination.k8s.io/v1` Lease with `kube-lease-manager` (made for
//! kube 5 / k8s-openapi 0.29): of the Deployment's replicas only the holder runs the
//! controller; it stops at once when the lease is lost, and a new holder continues from the
//! cluster's state (the planner keeps no memory).
//!
//! The crate takes a free lease with a server-side apply of `holderIdentity`, so two replicas
//! cannot both take it (the second apply conflicts on the field the first one owns), and renews
//! with a strategic-merge patch; the Lease duration (default 15 s) bounds the time a stopped leader's
//! replica keeps the lease.
//!
//! The crate keeps saying "held" while its renewals fail or hang (its watch loop logs the error
//! and backs off; kube-lease-manager 0.13.1 `LeaseManager::watch`), so holding is not proven by
//! it: a [`Fence`] follows the Lease as the API server stores it and lets this replica act only
//! until a little before its last stored renewal expires — the renew deadline of client-go's
//! leader election (k8s.io/client-go tools/leaderelection `RenewDeadline`). A replica cut off
//! from the API server stops acting before a standby may take over, whatever the crate says.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
// The runtime's clock, so tests can pause it.
use tokio::time::Instant;

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

impl Lease {
    /// How long before the lease expires the holder renews: half its validity, so a renewal has
    /// until [`Lease::act_for`] to reach the API server and be seen there.
    fn grace(&self) -> u64 {
        self.seconds.div_ceil(2).max(1)
    }

    /// How long after a stored renewal this replica acts: the validity less a sixth, the margin
    /// for clock skew between this replica and a standby (which takes over only once the
    /// validity has passed on its own clock).
    pub fn act_for(&self) -> Duration {
        let ms = self.seconds.saturating_mul(1000);
        Duration::from_millis(ms - ms / 6)
    }
}

/// Until when the Lease as stored proves this replica the holder: `None` when another holds
/// it, it has no renewal, or the proof already ran out. `wall` and `now` are the same moment on
/// the wall clock (which the renewal time was written by) and the monotonic one.
pub fn proven_until(
    stored: &LeaseObject,
    lease: &Lease,
    wall: k8s_openapi::jiff::Timestamp,
    now: Instant,
) -> Option<Instant> {
    let spec = stored.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(lease.identity.as_str()) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    // A renewal "in the future" (a clock step back) proves no more than one made now.
    let age = Duration::try_from(wall.duration_since(renewed)).unwrap_or(Duration::ZERO);
    lease.act_for().checked_sub(age).map(|left| now + left)
}

/// Whether this replica may act now. Cheap to clone; every clone sees the same proof.
#[derive(Debug, Clone)]
pub struct Fence(Option<watch::Receiver<Option<Instant>>>);

/// Why a write was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this replica cannot prove it holds the leader lease; not acting")]
pub struct NotLeader;

impl Fence {
    /// No fence: a single replica run without leader election acts always.
    pub fn none() -> Fence {
        Fence(None)
    }

    /// Proof that lasts until the instants `until` sends (for tests and [`follow`]).
    pub fn from_channel(until: watch::Receiver<Option<Instant>>) -> Fence {
        Fence(Some(until))
    }

    /// `Ok` while this replica may act; checked before every write.
    pub fn check(&self) -> Result<(), NotLeader> {
        match &self.0 {
            None => Ok(()),
            Some(rx) => match *rx.borrow() {
                Some(until) if Instant::now() < until => Ok(()),
                _ => Err(NotLeader),
            },
        }
    }

    /// Completes once this replica may act.
    pub async fn proven(&mut self) {
        while self.check().is_err() {
            let Some(rx) = &mut self.0 else { return };
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Completes once the proof runs out (never without a fence).
    pub async fn broken(mut self) {
        let Some(rx) = &mut self.0 else {
            return std::future::pending().await;
        };
        loop {
            let until = *rx.borrow_and_update();
            match until {
                Some(t) if Instant::now() < t => {
                    tokio::select! {
                        () = tokio::time::sleep_until(t) => {}
                        changed = rx.changed() => if changed.is_err() { return },
                    }
                }
                _ => return,
            }
        }
    }
}

/// Follows the Lease as stored (one watch) and proves holding from it; the task ends with the
/// returned fence's last clone.
pub fn follow(client: kube::Client, lease: &Lease) -> Fence {
    let (tx, rx) = watch::channel(None);
    let api: Api<LeaseObject> = Api::namespaced(client, &lease.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let lease = lease.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        loop {
            let event = tokio::select! {
                () = tx.closed() => return,
                e = events.next() => e,
            };
            match event {
                Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)))
                    if l.name_any() == lease.name =>
                {
                    let until = proven_until(
                        &l,
                        &lease,
                        k8s_openapi::jiff::Timestamp::now(),
                        Instant::now(),
                    );
                    tx.send_replace(until);
                }
                Some(Ok(watcher::Event::Delete(_))) => {
                    tx.send_replace(None);
                }
                Some(Ok(_)) => {}
                // The proof runs out by itself while the watch cannot be read.
                Some(Err(e)) => tracing::debug!(error = %e, "leader lease watch failed; retrying"),
                None => return,
            }
        }
    });
    Fence::from_channel(rx)
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
        .with_grace(lease.grace())
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;

    fn lease() -> Lease {
        Lease {
            name: "streamd-rollout".into(),
            namespace: "streamd-rollout".into(),
            identity: "a".into(),
            seconds: 15,
        }
    }

    fn stored(holder: Option<&str>, renewed: Option<Timestamp>) -> LeaseObject {
        LeaseObject {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                renew_time: renewed.map(MicroTime),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
            ..LeaseObject::default()
        }
    }

    #[test]
    fn a_replica_acts_until_a_sixth_before_its_stored_renewal_expires() {
        let wall = Timestamp::from_second(1_000_000).unwrap();
        let now = Instant::now();
        let ago = |s: i64| Some(wall - SignedDuration::from_secs(s));
        // Name, holder, renewed, how long the replica may act from now.
        type Row<'a> = (
            &'a str,
            Option<&'a str>,
            Option<Timestamp>,
            Option<Duration>,
        );
        let rows: &[Row] = &[
            (
                "renewed now: 12.5 s",
                Some("a"),
                ago(0),
                Some(Duration::from_millis(12_500)),
            ),
            (
                "renewed 10 s ago: 2.5 s",
                Some("a"),
                ago(10),
                Some(Duration::from_millis(2_500)),
            ),
            ("renewed 13 s ago: no longer", Some("a"), ago(13), None),
            ("another holds it", Some("b"), ago(0), None),
            ("nobody holds it", None, ago(0), None),
            ("no renewal stored", Some("a"), None, None),
            (
                "renewed in the future: as if now",
                Some("a"),
                ago(-30),
                Some(Duration::from_millis(12_500)),
            ),
        ];
        for (name, holder, renewed, left) in rows {
            let got = proven_until(&stored(*holder, *renewed), &lease(), wall, now);
            assert_eq!(got, left.map(|l| now + l), "{name}");
        }
    }

    #[test]
    fn the_holder_renews_before_the_fence_and_the_fence_is_shorter_than_the_lease() {
        for seconds in [2, 3, 15, 60, 3600] {
            let l = Lease { seconds, ..lease() };
            let renew_at = Duration::from_secs(seconds - l.grace());
            assert!(renew_at < l.act_for(), "{seconds}");
            assert!(l.act_for() < Duration::from_secs(seconds), "{seconds}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_fence_breaks_when_the_proof_runs_out_and_holds_again_when_renewed() {
        assert_eq!(Fence::none().check(), Ok(()));
        let (tx, rx) = watch::channel(None);
        let mut fence = Fence::from_channel(rx);
        assert_eq!(fence.check(), Err(NotLeader));
        tx.send_replace(Some(Instant::now() + Duration::from_secs(5)));
        fence.proven().await;
        assert_eq!(fence.check(), Ok(()));
        let started = Instant::now();
        fence.clone().broken().await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(fence.check(), Err(NotLeader));
        tx.send_replace(None);
        assert_eq!(fence.check(), Err(NotLeader));
    }
}
