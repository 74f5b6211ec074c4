//! Request counts by user and Kubernetes verb.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::{Value, json};

#[derive(Default)]
struct Counts {
    total: u64,
    by_user: BTreeMap<String, BTreeMap<&'static str, u64>>,
}

/// Counters for `{"cmd":"stats"}`.
#[derive(Default)]
pub(crate) struct Stats(Mutex<Counts>);

impl Stats {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Counters stay meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, user: &str, verb: &'static str) {
        let mut counts = self.lock();
        counts.total += 1;
        *counts
            .by_user
            .entry(user.to_string())
            .or_default()
            .entry(verb)
            .or_default() += 1;
    }

    /// `{"total": N, "by_user": {user: {verb: n}}}`.
    pub(crate) fn snapshot(&self) -> Value {
        let counts = self.lock();
        json!({ "total": counts.total, "by_user": counts.by_user })
    }

    pub(crate) fn reset(&self) {
        *self.lock() = Counts::default();
    }
}
