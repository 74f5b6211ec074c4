//! Fault injection: the knobs behind `{"cmd":"fault","kind":…}`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    refuse: AtomicBool,
    /// Bumped to end every open watch stream.
    drop_watches: watch::Sender<u64>,
    /// Bumped to abort every open connection.
    kill_connections: watch::Sender<u64>,
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
            refuse: AtomicBool::new(false),
            drop_watches: watch::Sender::new(0),
            kill_connections: watch::Sender::new(0),
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
                self.refuse.store(on, Ordering::SeqCst);
                if on {
                    // An outage also takes down established (keep-alive and watch) connections.
                    self.kill_connections.send_modify(|n| *n += 1);
                }
            }
            "clear" => {
                for counter in [&self.gone, &self.throttle, &self.errors, &self.delay_ms] {
                    counter.store(0, Ordering::SeqCst);
                }
                self.refuse.store(false, Ordering::SeqCst);
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
            "refuse": self.refuse.load(Ordering::SeqCst),
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

    /// Whether new connections are dropped.
    pub(crate) fn refusing(&self) -> bool {
        self.refuse.load(Ordering::SeqCst)
    }

    /// Changes when every open watch must end.
    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// Changes when every open connection must be aborted.
    pub(crate) fn connection_kills(&self) -> watch::Receiver<u64> {
        self.kill_connections.subscribe()
    }
}
