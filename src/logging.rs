//! Logging setup: human-readable lines on stderr, filtered by `STREAMD_LOG`.
//!
//! `STREAMD_LOG` takes `level` or `target=level` items separated by commas (e.g.
//! `debug,kube=info`); an invalid value falls back to `info` and says so.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// The filter used when `STREAMD_LOG` is unset or invalid.
const DEFAULT_FILTER: &str = "info";

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

/// Installs the global subscriber.
pub fn init() {
    let spec = std::env::var("STREAMD_LOG").ok();
    let (targets, problem) = filter(spec.as_deref());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(targets),
        )
        .init();
    if let Some(p) = problem {
        tracing::warn!("{p}");
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
}
