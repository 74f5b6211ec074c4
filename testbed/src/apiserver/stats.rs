//! Request counts by user and Kubernetes verb, and a timeline to count them per time window.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{Value, json};

/// At most this many requests are kept in the timeline (the totals keep counting).
const MAX_TIMELINE: usize = 100_000;

/// Unix time in milliseconds: the clock tests compare request times against.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One request as received.
struct Seen {
    at_ms: u64,
    user: String,
    verb: &'static str,
}

type ByUser = BTreeMap<String, BTreeMap<&'static str, u64>>;

#[derive(Default)]
struct Counts {
    total: u64,
    by_user: ByUser,
    timeline: Vec<Seen>,
}

/// Counters for `{"cmd":"stats"}`.
#[derive(Default)]
pub(crate) struct Stats(Mutex<Counts>);

fn add(by_user: &mut ByUser, user: &str, verb: &'static str) {
    *by_user
        .entry(user.to_string())
        .or_default()
        .entry(verb)
        .or_default() += 1;
}

fn window_bound(cmd: &Value, field: &str) -> anyhow::Result<Option<u64>> {
    cmd.get(field)
        .map(|v| {
            v.as_u64()
                .with_context(|| format!("{field:?} must be Unix milliseconds"))
        })
        .transpose()
}

impl Stats {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Counters stay meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, user: &str, verb: &'static str) {
        let mut counts = self.lock();
        counts.total += 1;
        add(&mut counts.by_user, user, verb);
        if counts.timeline.len() < MAX_TIMELINE {
            counts.timeline.push(Seen {
                at_ms: unix_ms(),
                user: user.to_string(),
                verb,
            });
        }
    }

    /// `{"total": N, "by_user": {user: {verb: n}}}`. With `since_ms` and/or `until_ms` (Unix
    /// milliseconds, `since <= t < until`) only the requests received in that window count.
    pub(crate) fn snapshot(&self, cmd: &Value) -> anyhow::Result<Value> {
        let since = window_bound(cmd, "since_ms")?;
        let until = window_bound(cmd, "until_ms")?;
        let counts = self.lock();
        if since.is_none() && until.is_none() {
            return Ok(json!({ "total": counts.total, "by_user": counts.by_user }));
        }
        let mut by_user = ByUser::new();
        let mut total = 0u64;
        for seen in counts
            .timeline
            .iter()
            .filter(|s| since.is_none_or(|t| s.at_ms >= t) && until.is_none_or(|t| s.at_ms < t))
        {
            total += 1;
            add(&mut by_user, &seen.user, seen.verb);
        }
        Ok(json!({ "total": total, "by_user": by_user }))
    }

    /// Every request since the last reset, oldest first: `[{"at_ms", "user", "verb"}]`.
    pub(crate) fn requests(&self) -> Value {
        let counts = self.lock();
        counts
            .timeline
            .iter()
            .map(|s| json!({ "at_ms": s.at_ms, "user": s.user, "verb": s.verb }))
            .collect()
    }

    pub(crate) fn reset(&self) {
        *self.lock() = Counts::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_only_their_requests() {
        let stats = Stats::default();
        stats.record("a", "patch");
        let mid = unix_ms() + 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
        stats.record("a", "watch");
        stats.record("b", "patch");
        let all = stats.snapshot(&json!({})).unwrap();
        assert_eq!(all["total"], 3);
        let late = stats.snapshot(&json!({ "since_ms": mid })).unwrap();
        assert_eq!(late["total"], 2, "{late}");
        assert_eq!(late["by_user"]["a"]["watch"], 1);
        assert!(late["by_user"]["a"].get("patch").is_none(), "{late}");
        let early = stats.snapshot(&json!({ "until_ms": mid })).unwrap();
        assert_eq!(early["total"], 1, "{early}");
        assert_eq!(stats.requests().as_array().map(Vec::len), Some(3));
        assert!(stats.snapshot(&json!({ "since_ms": "now" })).is_err());
        stats.reset();
        assert_eq!(stats.snapshot(&json!({})).unwrap()["total"], 0);
    }
}
