//! Fault injection: the knobs behind `{"cmd":"fault","kind":…}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Pending and standing faults. Counted faults are consumed one request at a time.
pub(crate) struct Faults {
    gone: AtomicU64,
    throttle: AtomicU64,
    retry_after: AtomicU64,
    errors: AtomicU64,
    delay_ms: AtomicU64,
    /// While true the port is closed (connections are refused) and open connections are cut.
    refuse: watch::Sender<bool>,
    /// Bumped to end every open watch stream.
    drop_watches: watch::Sender<u64>,
}

/// Decrements `counter` if it is positive; true if it was.
fn take(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn count(cmd: &Value, field: &str, default: u64) -> anyhow::Result<u64> {
    match cmd.get(field) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .with_context(|| format!("{field:?} must be a non-negative integer")),
    }
}

impl Faults {
    pub(crate) fn new() -> Self {
        Faults {
            gone: AtomicU64::new(0),
            throttle: AtomicU64::new(0),
            retry_after: AtomicU64::new(1),
            errors: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
            refuse: watch::Sender::new(false),
            drop_watches: watch::Sender::new(0),
        }
    }

    /// Applies one `fault` command and returns the resulting fault state.
    pub(crate) fn apply(&self, cmd: &Value) -> anyhow::Result<Value> {
        let kind = cmd
            .get("kind")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("fault needs a \"kind\""))?;
        match kind {
            "drop-watches" => {
                self.drop_watches.send_modify(|n| *n += 1);
            }
            "gone" => self.gone.store(count(cmd, "count", 1)?, Ordering::SeqCst),
            "throttle" => {
                self.retry_after
                    .store(count(cmd, "retry_after", 1)?, Ordering::SeqCst);
                self.throttle
                    .store(count(cmd, "count", 1)?, Ordering::SeqCst);
            }
            "error" => self.errors.store(count(cmd, "count", 1)?, Ordering::SeqCst),
            "delay" => {
                let ms = cmd
                    .get("ms")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| anyhow!("delay needs \"ms\""))?;
                self.delay_ms.store(ms, Ordering::SeqCst);
            }
            "refuse" => {
                let on = cmd
                    .get("on")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| anyhow!("refuse needs \"on\": true|false"))?;
                self.refuse.send_replace(on);
            }
            "clear" => {
                for counter in [&self.gone, &self.throttle, &self.errors, &self.delay_ms] {
                    counter.store(0, Ordering::SeqCst);
                }
                self.refuse.send_replace(false);
            }
            other => bail!("unknown fault kind {other:?}"),
        }
        tracing::info!(kind, state = %self.state(), "apiserver fault set");
        Ok(self.state())
    }

    fn state(&self) -> Value {
        json!({
            "gone": self.gone.load(Ordering::SeqCst),
            "throttle": self.throttle.load(Ordering::SeqCst),
            "retry_after": self.retry_after.load(Ordering::SeqCst),
            "error": self.errors.load(Ordering::SeqCst),
            "delay_ms": self.delay_ms.load(Ordering::SeqCst),
            "refuse": *self.refuse.borrow(),
        })
    }

    /// Whether this watch request should get a 410 instead of events.
    pub(crate) fn take_gone(&self) -> bool {
        take(&self.gone)
    }

    /// `Some(retry_after_seconds)` if this request should get a 429.
    pub(crate) fn take_throttle(&self) -> Option<u64> {
        take(&self.throttle).then(|| self.retry_after.load(Ordering::SeqCst))
    }

    /// Whether this request should get a 500.
    pub(crate) fn take_error(&self) -> bool {
        take(&self.errors)
    }

    /// The standing response delay, if any.
    pub(crate) fn delay(&self) -> Option<Duration> {
        let ms = self.delay_ms.load(Ordering::SeqCst);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Changes when every open watch must end.
    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// The `refuse` switch: the listener closes while it is on, and an outage also
    /// takes down established (keep-alive and watch) connections.
    pub(crate) fn refusals(&self) -> watch::Receiver<bool> {
        self.refuse.subscribe()
    }
}
