//! Logging setup: human-readable lines on stderr, or structured entries in the systemd journal
//! when running under systemd. Both are filtered by `STREAMD_LOG`.
//!
//! `STREAMD_LOG` takes `level` or `target=level` items separated by commas (e.g.
//! `debug,kube=info`); an invalid value falls back to `info` and says so.
//!
//! The journal is used when `JOURNAL_STREAM` is set (systemd connected stdout/stderr to the
//! journal) or `STREAMD_LOG_FORMAT=journal`; `STREAMD_LOG_FORMAT=stderr` forces stderr. If the
//! journal socket cannot be reached, streamd logs to stderr and warns once.
//!
//! In the journal, state changes and preflight refusals carry a fixed `MESSAGE_ID` (see
//! `systemd/streamd.catalog`) and the fields `STREAMD_STATE`, `STREAMD_REASON`, `STREAMD_STREAM`,
//! `STREAMD_IMAGE`, `STREAMD_CHECK` and `STREAMD_NODE`. Other events' fields arrive with their
//! names upper-cased and no prefix (`error` → `ERROR`).

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

use crate::cluster::protocol::State;

/// The filter used when `STREAMD_LOG` is unset or invalid.
const DEFAULT_FILTER: &str = "info";

/// `SYSLOG_IDENTIFIER` of journal entries.
const SYSLOG_IDENTIFIER: &str = "streamd";

/// `MESSAGE_ID` of "preflight check failed" entries.
pub const PREFLIGHT_FAILED_MESSAGE_ID: &str = "2a112241026c42db81625fa7b057ad16";

/// Whether the installed subscriber writes to the journal (then events carry journal fields).
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// The journal `MESSAGE_ID` of the entry logged when streamd enters `state`.
pub fn message_id(state: State) -> &'static str {
    match state {
        State::Idle => "f7bcb00c925e4a0c9943482617af1787",
        State::Preflight => "d45016d4a4da4105a434f738eb4b0c7f",
        State::Staging => "d5cca62458344f21afd07f3e1873f4e5",
        State::Staged => "788d47dc36164036885cebe8a5e951b1",
        State::Rebooting => "b8fed307798f4342b80fd97c0de5742d",
        State::Done => "56ea3490fe404ef5a4952792ba4da120",
        State::Degraded => "94f683ff270c4077b190bd09069b1767",
        State::Refused => "e0e3cc530e8f442582d19ef6d6b8e8dd",
    }
}

/// Parses a `STREAMD_LOG` value.
pub fn filter(spec: Option<&str>) -> (Targets, Option<String>) {
    let default = || {
        DEFAULT_FILTER
            .parse::<Targets>()
            .unwrap_or_else(|_| Targets::new())
    };
    match spec {
        None => (default(), None),
        Some(s) => match s.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (default(), Some(format!("ignoring STREAMD_LOG={s:?}: {e}"))),
        },
    }
}

/// Whether to log to the journal, given `STREAMD_LOG_FORMAT` and whether `JOURNAL_STREAM` is set.
pub fn wants_journal(format: Option<&str>, journal_stream: bool) -> bool {
    match format {
        Some("journal") => true,
        Some("stderr") => false,
        _ => journal_stream,
    }
}

/// Installs the global subscriber: the journal under systemd, stderr otherwise.
pub fn init() {
    let format = std::env::var("STREAMD_LOG_FORMAT").ok();
    let journal_stream = std::env::var_os("JOURNAL_STREAM").is_some();
    if wants_journal(format.as_deref(), journal_stream) {
        init_journal();
    } else {
        init_stderr(None);
    }
}

/// Installs a global subscriber that writes to the journal; if the journal socket is
/// unreachable, one that writes to stderr, with a warning. Returns whether the journal is used.
pub fn init_journal() -> bool {
    match tracing_journald::layer() {
        Ok(layer) => {
            let spec = std::env::var("STREAMD_LOG").ok();
            let (targets, problem) = filter(spec.as_deref());
            let layer = layer
                .with_field_prefix(None)
                .with_syslog_identifier(SYSLOG_IDENTIFIER.into())
                // Syslog's meanings: info → 6, debug and trace → 7 (the crate's default shifts
                // info to notice).
                .with_priority_mappings(PriorityMappings {
                    info: Priority::Informational,
                    debug: Priority::Debug,
                    ..PriorityMappings::new()
                });
            JOURNAL.store(true, Ordering::Relaxed);
            tracing_subscriber::registry()
                .with(layer.with_filter(targets))
                .init();
            if let Some(p) = problem {
                tracing::warn!("{p}");
            }
            true
        }
        Err(e) => {
            init_stderr(Some(format!(
                "cannot log to the journal ({e}); logging to stderr"
            )));
            false
        }
    }
}

fn init_stderr(extra_warning: Option<String>) {
    let spec = std::env::var("STREAMD_LOG").ok();
    let (targets, problem) = filter(spec.as_deref());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(targets),
        )
        .init();
    for p in extra_warning.into_iter().chain(problem) {
        tracing::warn!("{p}");
    }
}

/// Logs a state change (target `streamd::agent`, level info). `stream` and `image` are the
/// requested stream and image, or the booted ones when nothing is requested.
pub fn log_state(state: State, reason: &str, stream: &str, image: &str, node: &str) {
    if JOURNAL.load(Ordering::Relaxed) {
        tracing::info!(
            target: "streamd::agent",
            message_id = message_id(state),
            streamd_state = %state,
            streamd_reason = reason,
            streamd_stream = stream,
            streamd_image = image,
            streamd_node = node,
            "state changed to {state}: {reason}"
        );
    } else {
        tracing::info!(target: "streamd::agent", state = %state, %reason, "state changed");
    }
}

/// Logs a failed preflight check (target `streamd::agent`, level warn).
pub fn log_preflight_failed(
    check: crate::cluster::protocol::CheckId,
    message: &str,
    stream: &str,
    image: &str,
    node: &str,
) {
    if JOURNAL.load(Ordering::Relaxed) {
        tracing::warn!(
            target: "streamd::agent",
            message_id = PREFLIGHT_FAILED_MESSAGE_ID,
            streamd_check = %check,
            streamd_reason = message,
            streamd_stream = stream,
            streamd_image = image,
            streamd_node = node,
            "preflight check {check} failed: {message}"
        );
    } else {
        tracing::warn!(target: "streamd::agent", check = %check, message = %message, "preflight check failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn filters() {
        let (t, p) = filter(Some("debug,kube=warn"));
        assert!(p.is_none());
        assert!(t.would_enable("streamd::agent", &Level::DEBUG));
        assert!(!t.would_enable("kube::client", &Level::INFO));
        let (t, p) = filter(Some("=nonsense=="));
        assert!(p.is_some());
        assert!(t.would_enable("streamd", &Level::INFO));
        assert!(!t.would_enable("streamd", &Level::DEBUG));
    }

    #[test]
    fn message_ids_are_in_the_catalog() {
        let catalog = include_str!("../systemd/streamd.catalog");
        let headers: Vec<&str> = catalog
            .lines()
            .filter_map(|l| l.strip_prefix("-- "))
            .map(str::trim)
            .collect();
        let mut ids: Vec<&str> = State::ALL.iter().map(|&s| message_id(s)).collect();
        ids.push(PREFLIGHT_FAILED_MESSAGE_ID);
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
            assert!(
                headers.contains(id),
                "{id} is not in systemd/streamd.catalog"
            );
        }
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "duplicate MESSAGE_ID");
    }

    #[test]
    fn journal_selection() {
        assert!(wants_journal(None, true));
        assert!(!wants_journal(None, false));
        assert!(wants_journal(Some("journal"), false));
        assert!(!wants_journal(Some("stderr"), true));
        assert!(!wants_journal(Some("other"), false));
    }
}
