//! Fault injection: the knobs behind `{"cmd":"fault","kind":…}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::bail;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::clock::unix_ms;
use super::status::ApiError;
use crate::control::Fault;

/// At most this many injected faults are remembered (a runaway client must not grow memory).
const MAX_INJECTED: usize = 10_000;

/// Which requests a fault applies to: `user` and `verb`, each any when absent. Scoping lets a
/// test fail only streamd's requests while `kubectl` (another user) keeps working.
#[derive(Debug, Clone, Default)]
struct Scope {
    user: Option<String>,
    verb: Option<String>,
}

impl Scope {
    fn new(user: &Option<String>, verb: &Option<String>) -> Self {
        Scope {
            user: user.clone(),
            verb: verb.clone(),
        }
    }

    fn matches(&self, user: &str, verb: &str) -> bool {
        self.user.as_deref().is_none_or(|u| u == user)
            && self.verb.as_deref().is_none_or(|v| v == verb)
    }

    fn to_json(&self) -> Value {
        json!({ "user": self.user, "verb": self.verb })
    }
}

/// A fault that hits the next `left` matching requests.
#[derive(Debug, Default)]
struct Counted {
    left: u64,
    scope: Scope,
}

impl Counted {
    /// Consumes one if `user`/`verb` match and some are left.
    fn take(&mut self, user: &str, verb: &str) -> bool {
        if self.left > 0 && self.scope.matches(user, verb) {
            self.left -= 1;
            true
        } else {
            false
        }
    }
}

/// The scoped knobs (one lock: a request reads them together).
#[derive(Debug, Default)]
struct Knobs {
    throttle: Counted,
    retry_after: u64,
    errors: Counted,
    error_code: u16,
    delay: Option<(Duration, Scope)>,
}

/// Pending and standing faults. Counted faults are consumed one request at a time.
pub(crate) struct Faults {
    gone: AtomicU64,
    knobs: Mutex<Knobs>,
    /// Every 429/5xx actually answered, so tests can check what the client did next.
    injected: Mutex<Vec<Value>>,
    /// While true the port is closed (connections are refused) and open connections are cut.
    refuse: watch::Sender<bool>,
    /// Bumped to end every open watch stream.
    drop_watches: watch::Sender<u64>,
}

/// Locks `m`; the data stays meaningful even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Faults {
    pub(crate) fn new() -> Self {
        Faults {
            gone: AtomicU64::new(0),
            knobs: Mutex::new(Knobs {
                retry_after: 1,
                error_code: 500,
                ..Knobs::default()
            }),
            injected: Mutex::default(),
            refuse: watch::Sender::new(false),
            drop_watches: watch::Sender::new(0),
        }
    }

    /// Applies one `fault` command and returns the resulting fault state. Bad input is an error
    /// and changes nothing.
    pub(crate) fn apply(&self, fault: &Fault) -> anyhow::Result<Value> {
        match fault {
            Fault::DropWatches => {
                self.drop_watches.send_modify(|n| *n += 1);
            }
            Fault::Gone { count } => self.gone.store(*count, Ordering::SeqCst),
            Fault::Throttle {
                count,
                retry_after,
                user,
                verb,
            } => {
                let mut knobs = lock(&self.knobs);
                knobs.retry_after = *retry_after;
                knobs.throttle = Counted {
                    left: *count,
                    scope: Scope::new(user, verb),
                };
            }
            Fault::Error {
                count,
                code,
                user,
                verb,
            } => {
                if *code != 500 && *code != 503 {
                    bail!("\"code\" must be 500 or 503, not {code}");
                }
                let mut knobs = lock(&self.knobs);
                knobs.error_code = *code;
                knobs.errors = Counted {
                    left: *count,
                    scope: Scope::new(user, verb),
                };
            }
            Fault::Delay { ms, user, verb } => {
                let scope = Scope::new(user, verb);
                lock(&self.knobs).delay = (*ms > 0).then(|| (Duration::from_millis(*ms), scope));
            }
            Fault::Refuse { on } => {
                self.refuse.send_replace(*on);
            }
            Fault::Clear => {
                self.gone.store(0, Ordering::SeqCst);
                *lock(&self.knobs) = Knobs {
                    retry_after: 1,
                    error_code: 500,
                    ..Knobs::default()
                };
                self.refuse.send_replace(false);
            }
        }
        tracing::info!(fault = ?fault, state = %self.state(), "apiserver fault set");
        Ok(self.state())
    }

    fn state(&self) -> Value {
        let knobs = lock(&self.knobs);
        json!({
            "gone": self.gone.load(Ordering::SeqCst),
            "throttle": knobs.throttle.left,
            "throttle_scope": knobs.throttle.scope.to_json(),
            "retry_after": knobs.retry_after,
            "error": knobs.errors.left,
            "error_code": knobs.error_code,
            "error_scope": knobs.errors.scope.to_json(),
            "delay_ms": knobs.delay.as_ref().map_or(0, |(d, _)| d.as_millis() as u64),
            "delay_scope": knobs.delay.as_ref().map(|(_, s)| s.to_json()),
            "refuse": *self.refuse.borrow(),
        })
    }

    fn log_injected(&self, kind: &str, user: &str, verb: &str, code: u16) {
        let mut injected = lock(&self.injected);
        if injected.len() < MAX_INJECTED {
            injected.push(json!({
                "at_ms": unix_ms(),
                "kind": kind,
                "user": user,
                "verb": verb,
                "code": code,
            }));
        }
    }

    /// Every 429 and 5xx injected so far (oldest first, at most [`MAX_INJECTED`]):
    /// `[{"at_ms", "kind", "user", "verb", "code"}]`, `at_ms` in Unix milliseconds when answered.
    pub(crate) fn injected(&self) -> Value {
        Value::Array(lock(&self.injected).clone())
    }

    /// Whether this watch request should get a 410 instead of events.
    pub(crate) fn take_gone(&self) -> bool {
        self.gone
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// `Some(retry_after_seconds)` if this request should get a 429.
    pub(crate) fn take_throttle(&self, user: &str, verb: &str) -> Option<u64> {
        let secs = {
            let mut knobs = lock(&self.knobs);
            let secs = knobs.retry_after;
            knobs.throttle.take(user, verb).then_some(secs)?
        };
        self.log_injected("throttle", user, verb, 429);
        Some(secs)
    }

    /// The error this request should get instead of an answer: 500, or 503 as from an
    /// apiserver that is shutting down or not ready.
    pub(crate) fn take_error(&self, user: &str, verb: &str) -> Option<ApiError> {
        let code = {
            let mut knobs = lock(&self.knobs);
            let code = knobs.error_code;
            knobs.errors.take(user, verb).then_some(code)?
        };
        self.log_injected("error", user, verb, code);
        Some(if code == 503 {
            ApiError::service_unavailable("the server is currently unable to handle the request")
        } else {
            ApiError::internal(
                "an error on the server (\"injected fault\") has prevented the request from succeeding",
            )
        })
    }

    /// The standing response delay for this request, if any.
    pub(crate) fn delay(&self, user: &str, verb: &str) -> Option<Duration> {
        lock(&self.knobs)
            .delay
            .as_ref()
            .filter(|(_, scope)| scope.matches(user, verb))
            .map(|(d, _)| *d)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `cmd` as the control socket does, then applies it.
    fn apply(f: &Faults, cmd: Value) -> anyhow::Result<Value> {
        f.apply(&serde_json::from_value(cmd)?)
    }

    #[test]
    fn scoped_counted_faults_hit_only_matching_requests() {
        let f = Faults::new();
        apply(
            &f,
            json!({"kind": "error", "count": 2, "code": 503, "user": "u", "verb": "patch"}),
        )
        .unwrap();
        assert!(f.take_error("admin", "patch").is_none(), "other user");
        assert!(f.take_error("u", "get").is_none(), "other verb");
        assert_eq!(f.take_error("u", "patch").map(|e| e.code), Some(503));
        assert_eq!(f.take_error("u", "patch").map(|e| e.code), Some(503));
        assert!(f.take_error("u", "patch").is_none(), "count used up");
        let injected = f.injected();
        assert_eq!(injected.as_array().map(Vec::len), Some(2), "{injected}");
        assert_eq!(injected[0]["verb"], "patch");
    }

    #[test]
    fn throttle_and_delay_scopes() {
        let f = Faults::new();
        apply(
            &f,
            json!({"kind": "throttle", "count": 1, "retry_after": 3, "verb": "watch"}),
        )
        .unwrap();
        assert_eq!(f.take_throttle("u", "list"), None);
        assert_eq!(f.take_throttle("u", "watch"), Some(3));
        assert_eq!(f.take_throttle("u", "watch"), None);
        apply(&f, json!({"kind": "delay", "ms": 5, "user": "u"})).unwrap();
        assert_eq!(f.delay("u", "get"), Some(Duration::from_millis(5)));
        assert_eq!(f.delay("v", "get"), None);
        apply(&f, json!({"kind": "clear"})).unwrap();
        assert_eq!(f.delay("u", "get"), None);
    }

    #[test]
    fn bad_fault_commands_change_nothing() {
        let f = Faults::new();
        let before = f.state();
        for bad in [
            json!({"kind": "error", "count": 1, "code": 404}),
            json!({"kind": "error", "count": 1, "user": 7}),
            json!({"kind": "throttle", "count": -1}),
            json!({"kind": "delay", "ms": 5, "verb": ["patch"]}),
            json!({"kind": "nonsense"}),
        ] {
            assert!(apply(&f, bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(f.state(), before);
    }
}
