//! The server's own record of unavailable nodes over time: a node is unavailable while it is
//! cordoned (`spec.unschedulable`) or its `Ready` condition is not `True`. A rollout bench reads
//! the maximum at any moment from here rather than trusting the controller's own account.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::Shared;
use super::clock::unix_ms;
use super::discovery::NODES;
use super::store::Store;

/// At most this many changes are kept (the maximum keeps counting).
const MAX_TIMELINE: usize = 100_000;

#[derive(Default)]
struct Record {
    /// `(at_ms, unavailable nodes)` whenever the set changed.
    timeline: Vec<(u64, Vec<String>)>,
    max: usize,
    max_at_ms: u64,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Availability(Mutex<Record>);

/// Whether a Node counts as unavailable.
fn unavailable(node: &Value) -> bool {
    let cordoned = node.pointer("/spec/unschedulable") == Some(&Value::Bool(true));
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    cordoned || !ready
}

fn current(store: &Store) -> Vec<String> {
    let (nodes, _) = store.list(&NODES, None, unavailable);
    nodes
        .iter()
        .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str))
        .map(String::from)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

impl Availability {
    fn lock(&self) -> MutexGuard<'_, Record> {
        // The record stays meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the current set if it changed.
    fn observe(&self, store: &Store) {
        let now = current(store);
        let mut rec = self.lock();
        if rec.timeline.last().is_some_and(|(_, last)| *last == now) {
            return;
        }
        if now.len() > rec.max || rec.timeline.is_empty() {
            rec.max = rec.max.max(now.len());
            rec.max_at_ms = unix_ms();
        }
        if rec.timeline.len() < MAX_TIMELINE {
            rec.timeline.push((unix_ms(), now));
        }
    }

    /// Starts a new record from the current state.
    pub(crate) fn reset(&self, store: &Store) {
        *self.lock() = Record::default();
        self.observe(store);
    }

    /// `{"max", "max_at_ms", "now": [names], "timeline": [{"at_ms", "nodes"}]}`.
    pub(crate) fn snapshot(&self) -> Value {
        let rec = self.lock();
        let timeline: Vec<Value> = rec
            .timeline
            .iter()
            .map(|(at, nodes)| json!({ "at_ms": at, "nodes": nodes }))
            .collect();
        json!({
            "max": rec.max,
            "max_at_ms": rec.max_at_ms,
            "now": rec.timeline.last().map(|(_, n)| n.clone()).unwrap_or_default(),
            "timeline": timeline,
        })
    }
}

/// Follows every Node write for the life of the server.
pub(crate) fn spawn(shared: Arc<Shared>) {
    let mut rx = shared.store.subscribe();
    shared.availability.observe(&shared.store);
    let weak = Arc::downgrade(&shared);
    drop(shared);
    tokio::spawn(async move {
        loop {
            let event = rx.recv().await;
            let Some(shared) = weak.upgrade() else {
                return;
            };
            match event {
                Ok(e) if !e.is_for(&NODES) => continue,
                // A missed event only means the set is read again now.
                Ok(_) | Err(RecvError::Lagged(_)) => shared.availability.observe(&shared.store),
                Err(RecvError::Closed) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cordoned_or_not_ready_nodes_count() {
        let ready =
            json!({"spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(!unavailable(&ready));
        let mut cordoned = ready.clone();
        cordoned["spec"]["unschedulable"] = json!(true);
        assert!(unavailable(&cordoned));
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        assert!(unavailable(&not_ready));
    }
}
