//! Reporting: turns status changes into node annotation patches, throttled and coalesced.
//!
//! State changes are written at once; everything else (progress, reason) at most once per
//! [`PROGRESS_INTERVAL`]. Whatever is pending when a patch goes out is merged into it, so the
//! latest status always wins and nothing is written twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::protocol;
use crate::status::Status;

/// Minimum time between two patches that only move progress.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

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
    use crate::protocol::State;

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
    fn input_keys_are_never_written() {
        let mut r = Reporter::default();
        r.set(&status(State::Refused, None));
        let p = r.pending_patch().expect("patch");
        for k in protocol::INPUT_KEYS {
            assert!(p["metadata"]["annotations"].get(k).is_none());
        }
    }
}
