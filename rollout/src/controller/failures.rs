//! Failed reconciles: each pool backs off exponentially on its own (one pool's failing API call
//! does not slow the others), and each new cause is told once as a Warning Event, not at every
//! retry.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::Error;

/// The first retry after a failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest wait between retries.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// The wait after the `n`th failure in a row (1-based): 5 s, doubling, at most 5 min.
pub fn backoff(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(MAX_RETRY)
}

/// What a failure is "the same" by: the request that failed and how (the status code, or no
/// answer), not the message, which may carry changing details.
pub fn cause(error: &Error) -> String {
    match error {
        Error::Api { what, source } => match source {
            kube::Error::Api(s) => format!("{what}: {}", s.code),
            _ => format!("{what}: no answer"),
        },
        Error::NotLeader(_) => "not leader".into(),
        Error::NodesNotRead(_) => "the node watch: not listed yet".into(),
        Error::PodsNotRead(_) => "the pod watch: not listed yet".into(),
    }
}

/// Per pool: failures in a row, and the last cause told.
#[derive(Debug, Default)]
pub struct Failures {
    pools: Mutex<BTreeMap<String, (u32, String)>>,
}

impl Failures {
    /// Records a failure of `pool` for `cause`: the wait before the next attempt, and whether the
    /// cause differs from the last one told (to be told now).
    pub fn failed(&self, pool: &str, cause: &str) -> (Duration, bool) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let entry = pools.entry(pool.to_string()).or_default();
        entry.0 = entry.0.saturating_add(1);
        let new = entry.1 != cause;
        if new {
            entry.1 = cause.to_string();
        }
        (backoff(entry.0), new)
    }

    /// `pool` reconciled: the next failure starts from [`FIRST_RETRY`] and is told again.
    pub fn succeeded(&self, pool: &str) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(u32::MAX), MAX_RETRY);
        assert_eq!(backoff(0), FIRST_RETRY);
    }

    #[test]
    fn each_pool_backs_off_alone_and_each_cause_is_told_once() {
        let f = Failures::default();
        assert_eq!(f.failed("a", "listing the nodes: 500"), (backoff(1), true));
        assert_eq!(f.failed("a", "listing the nodes: 500"), (backoff(2), false));
        assert_eq!(f.failed("b", "listing the nodes: 500"), (backoff(1), true));
        assert_eq!(f.failed("a", "patching node w1: 403"), (backoff(3), true));
        f.succeeded("a");
        assert_eq!(f.failed("a", "patching node w1: 403"), (backoff(1), true));
    }

    #[test]
    fn the_cause_is_the_request_and_its_status_not_the_message() {
        let api = |code: u16, message: &str| Error::Api {
            what: "listing the nodes".into(),
            source: kube::Error::Api(
                kube::core::Status::failure(message, "InternalError")
                    .with_code(code)
                    .boxed(),
            ),
        };
        assert_eq!(cause(&api(500, "etcd slow")), cause(&api(500, "etcd busy")));
        assert_ne!(cause(&api(500, "x")), cause(&api(403, "x")));
        assert_eq!(cause(&api(429, "x")), "listing the nodes: 429");
    }
}
