//! Request counts by user and Kubernetes verb, and a timeline to count them per time window.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use super::clock::unix_ms;

/// At most this many requests are kept in the timeline (the totals keep counting).
const MAX_TIMELINE: usize = 100_000;

/// One request as received.
struct Seen {
    at_ms: u64,
    user: String,
    verb: &'static str,
    /// `plural` or `plural/subresource`; empty for discovery and other non-resource paths.
    resource: String,
}

type ByUser = BTreeMap<String, BTreeMap<&'static str, u64>>;
/// user → resource → verb → count.
type ByResource = BTreeMap<String, BTreeMap<String, BTreeMap<&'static str, u64>>>;

#[derive(Default)]
struct Counts {
    total: u64,
    by_user: ByUser,
    by_resource: ByResource,
    timeline: Vec<Seen>,
    /// Watches open now, by user (not reset: they are still open).
    watches_open: BTreeMap<String, u64>,
    /// The most watches each user had open at once since the last reset.
    watches_max: BTreeMap<String, u64>,
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

fn add_resource(by: &mut ByResource, user: &str, resource: &str, verb: &'static str) {
    let resource = if resource.is_empty() {
        "(non-resource)"
    } else {
        resource
    };
    *by.entry(user.to_string())
        .or_default()
        .entry(resource.to_string())
        .or_default()
        .entry(verb)
        .or_default() += 1;
}

/// A watch counted open for its user until dropped (with the response stream).
pub(crate) struct OpenWatch {
    shared: Arc<super::Shared>,
    user: String,
}

impl OpenWatch {
    pub(crate) fn new(shared: Arc<super::Shared>, user: &str) -> OpenWatch {
        {
            let mut counts = shared.stats.lock();
            let open = counts.watches_open.entry(user.to_string()).or_default();
            *open += 1;
            let open = *open;
            let max = counts.watches_max.entry(user.to_string()).or_default();
            *max = (*max).max(open);
        }
        OpenWatch {
            shared,
            user: user.to_string(),
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let mut counts = self.shared.stats.lock();
        if let Some(open) = counts.watches_open.get_mut(&self.user) {
            *open = open.saturating_sub(1);
        }
    }
}

impl Stats {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Counters stay meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, user: &str, verb: &'static str, resource: &str) {
        let mut counts = self.lock();
        counts.total += 1;
        add(&mut counts.by_user, user, verb);
        add_resource(&mut counts.by_resource, user, resource, verb);
        if counts.timeline.len() < MAX_TIMELINE {
            counts.timeline.push(Seen {
                at_ms: unix_ms(),
                user: user.to_string(),
                verb,
                resource: resource.to_string(),
            });
        }
    }

    /// `{"total": N, "by_user": {user: {verb: n}}, "by_resource": {user: {resource: {verb: n}}},
    /// "watches_open": {user: n}, "watches_max": {user: n}}`. With `since_ms` and/or `until_ms`
    /// (Unix milliseconds, `since <= t < until`) only the requests received in that window
    /// count (the watch gauges are always the current ones).
    pub(crate) fn snapshot(&self, since: Option<u64>, until: Option<u64>) -> Value {
        let counts = self.lock();
        let watches = |doc: &mut Value| {
            doc["watches_open"] = json!(counts.watches_open);
            doc["watches_max"] = json!(counts.watches_max);
        };
        if since.is_none() && until.is_none() {
            let mut doc = json!({
                "total": counts.total,
                "by_user": counts.by_user,
                "by_resource": counts.by_resource,
            });
            watches(&mut doc);
            return doc;
        }
        let mut by_user = ByUser::new();
        let mut by_resource = ByResource::new();
        let mut total = 0u64;
        for seen in counts
            .timeline
            .iter()
            .filter(|s| since.is_none_or(|t| s.at_ms >= t) && until.is_none_or(|t| s.at_ms < t))
        {
            total += 1;
            add(&mut by_user, &seen.user, seen.verb);
            add_resource(&mut by_resource, &seen.user, &seen.resource, seen.verb);
        }
        let mut doc = json!({ "total": total, "by_user": by_user, "by_resource": by_resource });
        watches(&mut doc);
        doc
    }

    /// Every request since the last reset, oldest first: `[{"at_ms", "user", "verb"}]`.
    pub(crate) fn requests(&self) -> Value {
        let counts = self.lock();
        counts
            .timeline
            .iter()
            .map(|s| json!({ "at_ms": s.at_ms, "user": s.user, "verb": s.verb, "resource": s.resource }))
            .collect()
    }

    /// Forgets the counts; watches still open stay counted open.
    pub(crate) fn reset(&self) {
        let mut counts = self.lock();
        let open = std::mem::take(&mut counts.watches_open);
        *counts = Counts {
            watches_max: open.clone(),
            watches_open: open,
            ..Counts::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_only_their_requests() {
        let stats = Stats::default();
        stats.record("a", "patch", "nodes");
        let mid = unix_ms() + 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
        stats.record("a", "watch", "nodes");
        stats.record("b", "patch", "nodes");
        let all = stats.snapshot(None, None);
        assert_eq!(all["total"], 3);
        let late = stats.snapshot(Some(mid), None);
        assert_eq!(late["total"], 2, "{late}");
        assert_eq!(late["by_user"]["a"]["watch"], 1);
        assert!(late["by_user"]["a"].get("patch").is_none(), "{late}");
        let early = stats.snapshot(None, Some(mid));
        assert_eq!(early["total"], 1, "{early}");
        assert_eq!(stats.requests().as_array().map(Vec::len), Some(3));
        stats.reset();
        assert_eq!(stats.snapshot(None, None)["total"], 0);
    }
}
