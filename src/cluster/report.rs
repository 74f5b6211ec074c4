//! Reporting: turns status changes into node annotation patches, throttled and coalesced.
//!
//! State changes are written at once; everything else (progress, reason) at most once per
//! [`PROGRESS_INTERVAL`]. Whatever is pending when a patch goes out is merged into it, so the
//! latest status always wins and nothing is written twice. A failed patch is retried after
//! [`patch_retry_delay`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::cluster::node::PatchError;
use crate::cluster::protocol;
use crate::cluster::status::Status;

/// Minimum time between two patches that only move progress.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);
/// Longest wait between two attempts at a failed patch. Below the agent's general 60 s: the
/// cluster waits on this status, and an attempt is one small request.
pub const PATCH_MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server's `Retry-After` longer than this is cut to it, so a bogus value cannot hold the
/// status back for long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What a failed patch says about sending it again: the part of a [`PatchError`] the retry
/// timer needs, without the error's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchFailure {
    /// The same patch may succeed later ([`PatchError::is_transient`]).
    pub transient: bool,
    /// The server's `Retry-After`, if it named one.
    pub retry_after: Option<Duration>,
    /// The server answered 401: the credentials may have been rotated.
    pub unauthorized: bool,
}

impl From<&PatchError> for PatchFailure {
    fn from(e: &PatchError) -> Self {
        PatchFailure {
            transient: e.is_transient(),
            retry_after: e.retry_after(),
            unauthorized: matches!(e, PatchError::Rejected { status: 401, .. }),
        }
    }
}

/// How long to wait before sending a failed patch again.
///
/// `backoff` is the current step (the caller doubles it after each failure, up to
/// [`PATCH_MAX_BACKOFF`]) and `jitter` a uniform sample from `[0, 1)` (see [`crate::backoff::jitter`]).
///
/// - Transient failures wait a uniform time in `[backoff/2, backoff]` ("equal jitter": nodes that
///   failed together spread out, and the cap is never exceeded), but never less than the
///   server's `Retry-After` (at most [`MAX_RETRY_AFTER`]).
/// - A rejected patch would fail the same way at once, so it waits the cap: only a slow retry
///   can notice that someone fixed the cause (RBAC, credentials).
pub fn patch_retry_delay(backoff: Duration, failure: PatchFailure, jitter: f64) -> Duration {
    if !failure.transient {
        return PATCH_MAX_BACKOFF;
    }
    let step = backoff.min(PATCH_MAX_BACKOFF);
    let spread = step.mul_f64(jitter.clamp(0.0, 1.0) / 2.0);
    let own = step / 2 + spread;
    match failure.retry_after {
        Some(server) => own.max(server.min(MAX_RETRY_AFTER)),
        None => own,
    }
}

/// Keeps a flapping node from flooding the cluster with Events: a token bucket (a burst of
/// [`EVENT_BURST`], then one per [`EVENT_REFILL`]) and no repeat of the same reason and message
/// within [`EVENT_REPEAT`]. The annotations carry the truth; Events are the story of it.
#[derive(Debug)]
pub struct EventLimiter {
    tokens: f64,
    at: Option<Instant>,
    recent: Vec<(Instant, String)>,
}

/// Events that may be posted at once.
pub const EVENT_BURST: f64 = 10.0;
/// Time for one more Event to be allowed.
pub const EVENT_REFILL: Duration = Duration::from_secs(6);
/// Window in which an identical Event is dropped.
pub const EVENT_REPEAT: Duration = Duration::from_secs(60);

impl Default for EventLimiter {
    fn default() -> Self {
        EventLimiter {
            tokens: EVENT_BURST,
            at: None,
            recent: Vec::new(),
        }
    }
}

impl EventLimiter {
    /// Whether an Event `reason: message` may be posted at `now` (and counts it if so).
    pub fn allow(&mut self, now: Instant, reason: &str, message: &str) -> bool {
        if let Some(at) = self.at {
            let refill =
                now.saturating_duration_since(at).as_secs_f64() / EVENT_REFILL.as_secs_f64();
            self.tokens = (self.tokens + refill).min(EVENT_BURST);
        }
        self.at = Some(now);
        self.recent
            .retain(|(t, _)| now.saturating_duration_since(*t) < EVENT_REPEAT);
        let key = format!("{reason}\0{message}");
        if self.tokens < 1.0 || self.recent.iter().any(|(_, k)| *k == key) {
            return false;
        }
        self.tokens -= 1.0;
        self.recent.push((now, key));
        true
    }
}

/// Decides when and what to patch.
#[derive(Debug, Default)]
pub struct Reporter {
    /// Output annotations as last seen on the node (from the watch or our own patch reply).
    on_node: BTreeMap<String, String>,
    /// What the node should show.
    wanted: BTreeMap<&'static str, Option<String>>,
    last_patch: Option<Instant>,
}

impl Reporter {
    /// Records the node's current annotations (only output keys are kept).
    pub fn observe_node(&mut self, annotations: &BTreeMap<String, String>) {
        self.on_node = annotations
            .iter()
            .filter(|(k, _)| protocol::OUTPUT_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }

    /// Sets what the node should show.
    pub fn set(&mut self, status: &Status) {
        self.wanted = status.annotations();
    }

    /// The merge patch (`{"metadata":{"annotations":{…}}}`) that brings the node to the wanted
    /// annotations, or `None` if it already shows them.
    pub fn pending_patch(&self) -> Option<Value> {
        let mut ann = Map::new();
        for (k, want) in &self.wanted {
            let have = self.on_node.get(*k);
            match (want, have) {
                (Some(w), Some(h)) if w == h => {}
                (None, None) => {}
                (Some(w), _) => {
                    ann.insert((*k).to_string(), Value::String(w.clone()));
                }
                (None, Some(_)) => {
                    ann.insert((*k).to_string(), Value::Null);
                }
            }
        }
        if ann.is_empty() {
            return None;
        }
        Some(serde_json::json!({ "metadata": { "annotations": ann } }))
    }

    /// When the pending patch may be sent: now if it changes `state` (or nothing was patched
    /// yet), else no sooner than [`PROGRESS_INTERVAL`] after the last patch, so a transaction's
    /// flood of progress and messages becomes one patch per interval.
    pub fn due_at(&self, now: Instant) -> Option<Instant> {
        let patch = self.pending_patch()?;
        let changes_state = patch["metadata"]["annotations"]
            .get(protocol::STATE)
            .is_some();
        match self.last_patch {
            Some(last) if !changes_state && now < last + PROGRESS_INTERVAL => {
                Some(last + PROGRESS_INTERVAL)
            }
            _ => Some(now),
        }
    }

    /// Records a successful patch and the annotations the server returned.
    pub fn patched(&mut self, now: Instant, annotations: &BTreeMap<String, String>) {
        self.last_patch = Some(now);
        self.observe_node(annotations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::State;

    fn status(state: State, progress: Option<u8>) -> Status {
        Status {
            state,
            progress,
            current_stream: "rhel-9".into(),
            ..Status::default()
        }
    }

    fn apply(r: &mut Reporter, now: Instant) {
        let patch = r.pending_patch().expect("patch");
        let mut on: BTreeMap<String, String> = r.on_node.clone();
        for (k, v) in patch["metadata"]["annotations"].as_object().expect("obj") {
            match v.as_str() {
                Some(s) => on.insert(k.clone(), s.to_string()),
                None => on.remove(k),
            };
        }
        r.patched(now, &on);
    }

    #[test]
    fn state_changes_go_out_at_once_progress_and_reason_are_throttled() {
        let t0 = Instant::now();
        let mut r = Reporter::default();
        r.set(&status(State::Staging, Some(1)));
        assert_eq!(r.due_at(t0), Some(t0));
        apply(&mut r, t0);
        assert_eq!(r.pending_patch(), None);
        let mut s = status(State::Staging, Some(50));
        s.reason = "Importing: layer 3 of 12".into();
        r.set(&s);
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(r.due_at(t1), Some(t0 + PROGRESS_INTERVAL));
        r.set(&status(State::Staged, None));
        assert_eq!(r.due_at(t1), Some(t1), "state change is not throttled");
        let p = r.pending_patch().expect("patch");
        assert_eq!(
            p["metadata"]["annotations"][protocol::PROGRESS],
            Value::Null
        );
        assert_eq!(p["metadata"]["annotations"][protocol::STATE], "Staged");
    }

    #[test]
    fn nothing_to_do_when_node_matches() {
        let mut r = Reporter::default();
        let s = status(State::Idle, None);
        r.set(&s);
        let on: BTreeMap<String, String> = s
            .annotations()
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect();
        r.observe_node(&on);
        assert_eq!(r.pending_patch(), None);
        assert_eq!(r.due_at(Instant::now()), None);
    }

    #[test]
    fn patch_retry_delays_are_jittered_capped_and_honour_retry_after() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let transient = |retry_after: Option<Duration>| PatchError::Transient {
            message: "m".into(),
            status: Some(503),
            retry_after,
        };
        let rejected = PatchError::Rejected {
            status: 403,
            message: "m".into(),
        };
        // (backoff, error, jitter, expected delay)
        let cases = [
            (s(1), transient(None), 0.0, ms(500)),
            (s(1), transient(None), 0.5, ms(750)),
            (s(1), transient(None), 0.999_999, ms(999)),
            (s(8), transient(None), 0.25, s(5)),
            (s(30), transient(None), 1.0, s(30)),
            (s(600), transient(None), 1.0, s(30)),
            (s(600), transient(None), 0.0, s(15)),
            (s(1), transient(Some(s(2))), 0.9, s(2)),
            (s(16), transient(Some(s(2))), 0.0, s(8)),
            (s(1), transient(Some(s(3600))), 0.0, MAX_RETRY_AFTER),
            (s(1), rejected, 0.0, PATCH_MAX_BACKOFF),
        ];
        for (backoff, error, jitter, want) in cases {
            let got = patch_retry_delay(backoff, PatchFailure::from(&error), jitter);
            // Within a millisecond: f64 scaling of durations rounds.
            assert!(
                got.abs_diff(want) <= ms(1),
                "backoff {backoff:?}, {error:?}, jitter {jitter}: got {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn input_keys_are_never_written() {
        let mut r = Reporter::default();
        r.set(&status(State::Refused, None));
        let p = r.pending_patch().expect("patch");
        for k in protocol::INPUT_KEYS {
            assert!(p["metadata"]["annotations"].get(k).is_none());
        }
    }

    #[test]
    fn events_are_rate_limited_and_deduplicated() {
        let t0 = Instant::now();
        let mut l = EventLimiter::default();
        assert!(l.allow(t0, "Staged", "a"));
        assert!(
            !l.allow(t0, "Staged", "a"),
            "the same event twice within a minute"
        );
        assert!(
            l.allow(t0, "Staged", "b"),
            "another message is another event"
        );
        let allowed = (0..20)
            .filter(|i| l.allow(t0, "Failed", &i.to_string()))
            .count();
        assert_eq!(allowed, 8, "the burst is 10 in all");
        assert!(!l.allow(t0 + Duration::from_secs(3), "Failed", "x"));
        assert!(
            l.allow(t0 + EVENT_REFILL, "Failed", "x"),
            "one more after the refill"
        );
        assert!(
            l.allow(t0 + EVENT_REPEAT + EVENT_REFILL * 2, "Staged", "a"),
            "repeats allowed after the window"
        );
    }
}
