//! Watch streams: one `{"type":…,"object":…}` JSON line per event, as the real server
//! writes them on a chunked response.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use futures::stream::{self, BoxStream, StreamExt};
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, sleep_until};

use super::discovery::{ResourceDef, Served};
use super::faults::Faults;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{Event, Store, WatchStart};
use super::table::{self, TableOptions};

/// Idle time after which a watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

/// What a watch request asked for.
pub(crate) struct WatchRequest {
    pub(crate) def: &'static ResourceDef,
    pub(crate) namespace: Option<String>,
    pub(crate) fields: FieldSelector,
    pub(crate) labels: LabelSelector,
    /// `None` for resourceVersion unset or "0": start with the current objects.
    pub(crate) from: Option<u64>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) bookmarks: bool,
    pub(crate) table: Option<TableOptions>,
}

impl WatchRequest {
    fn selects(&self, event: &Event) -> bool {
        let obj = &*event.object;
        event.is_for(self.def)
            && self.namespace.as_deref().is_none_or(|ns| {
                obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
            })
            && self.fields.matches(obj)
            && self.labels.matches(obj)
    }

    fn line(&self, event: &Event) -> Bytes {
        let object = match self.table {
            Some(opts) => table::table(
                self.def,
                std::slice::from_ref(&event.object),
                Some(event.rv),
                opts,
            )
            .to_string(),
            None => as_version(self.def, &event.object).to_string(),
        };
        Bytes::from(format!(
            "{{\"type\":\"{}\",\"object\":{object}}}\n",
            event.kind.as_str()
        ))
    }

    fn bookmark(&self, rv: u64) -> Bytes {
        let object = json!({
            "kind": self.def.kind,
            "apiVersion": self.def.api_version(),
            "metadata": { "resourceVersion": rv.to_string() },
        });
        Bytes::from(format!("{{\"type\":\"BOOKMARK\",\"object\":{object}}}\n"))
    }
}

/// `obj` as `def`'s version serves it. A CRD's stored object is the same in every version
/// (the OSImageStream CRD has one served version at a time and no conversion webhook), so
/// only `apiVersion` differs, as with the API server's `None` conversion strategy.
pub(crate) fn as_version<'a>(def: &ResourceDef, obj: &'a Value) -> std::borrow::Cow<'a, Value> {
    let api_version = def.api_version();
    if !def.custom || obj.get("apiVersion").and_then(Value::as_str) == Some(&api_version) {
        return std::borrow::Cow::Borrowed(obj);
    }
    let mut converted = obj.clone();
    converted["apiVersion"] = json!(api_version);
    std::borrow::Cow::Owned(converted)
}

fn error_line(err: &ApiError) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"ERROR\",\"object\":{}}}\n",
        err.status()
    ))
}

struct State {
    req: WatchRequest,
    backlog: VecDeque<Arc<Event>>,
    rx: broadcast::Receiver<Arc<Event>>,
    /// Newest event seen (matching or not): bookmarks and duplicate suppression use it.
    last_rv: u64,
    deadline: Option<Instant>,
    next_bookmark: Instant,
    drops: watch::Receiver<u64>,
    /// Which CRD versions are served: a watch on a version that stops being served ends.
    served: watch::Receiver<Served>,
    done: bool,
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_line(mut st: State) -> Option<(Bytes, State)> {
    loop {
        if st.done {
            return None;
        }
        if let Some(event) = st.backlog.pop_front() {
            if st.req.selects(&event) {
                let line = st.req.line(&event);
                return Some((line, st));
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = st.drops.changed() => {
                tracing::debug!(resource = st.req.def.plural, "apiserver watch dropped by fault");
                return None;
            }
            changed = st.served.changed() => {
                if changed.is_err() || !st.served.borrow_and_update().serves(st.req.def) {
                    tracing::debug!(resource = st.req.def.plural, "apiserver watch ended: version no longer served");
                    return None;
                }
            }
            received = st.rx.recv() => match received {
                Ok(event) => {
                    if event.rv <= st.last_rv {
                        continue;
                    }
                    st.last_rv = event.rv;
                    if st.req.selects(&event) {
                        st.next_bookmark = Instant::now() + BOOKMARK_EVERY;
                        let line = st.req.line(&event);
                        return Some((line, st));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "apiserver watcher fell behind, expiring it");
                    st.done = true;
                    let err = ApiError::expired("too old resource version: the watcher fell behind");
                    return Some((error_line(&err), st));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            },
            () = until(st.deadline) => return None,
            () = sleep_until(st.next_bookmark), if st.req.bookmarks => {
                st.next_bookmark = Instant::now() + BOOKMARK_EVERY;
                let line = st.req.bookmark(st.last_rv);
                return Some((line, st));
            }
        }
    }
}

/// The lines of a watch. A pending `gone` fault or a resourceVersion older than the
/// history yields a single 410 `ERROR` event, as kube-apiserver sends it.
pub(crate) fn lines(
    store: &Store,
    faults: &Faults,
    mut served: watch::Receiver<Served>,
    req: WatchRequest,
) -> impl Stream<Item = Bytes> + Send + 'static {
    // The version may have stopped being served between routing the request and
    // subscribing; subscribing marked that change seen, so without this check the watch
    // would stay open on an unserved version until its timeout.
    if !served.borrow_and_update().serves(req.def) {
        return stream::empty().boxed();
    }
    let expired = |err: ApiError| -> BoxStream<'static, Bytes> {
        stream::once(std::future::ready(error_line(&err))).boxed()
    };
    if faults.take_gone() {
        return expired(ApiError::expired(format!(
            "too old resource version: {} (injected fault)",
            req.from.unwrap_or(0)
        )));
    }
    match store.watch(req.def, req.from) {
        WatchStart::Expired(err) => expired(err),
        WatchStart::Ready { backlog, rx, rv } => {
            let now = Instant::now();
            let state = State {
                // An absurd timeoutSeconds overflows Instant: treat it as no timeout.
                deadline: req.timeout.and_then(|t| now.checked_add(t)),
                next_bookmark: now + BOOKMARK_EVERY,
                req,
                backlog,
                rx,
                last_rv: rv,
                drops: faults.watch_drops(),
                served,
                done: false,
            };
            stream::unfold(state, next_line).boxed()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::OSIMAGESTREAMS;

    fn request() -> WatchRequest {
        WatchRequest {
            def: &OSIMAGESTREAMS,
            namespace: None,
            fields: FieldSelector::default(),
            labels: LabelSelector::default(),
            from: None,
            timeout: None,
            bookmarks: false,
            table: None,
        }
    }

    /// A watch routed while its version was served but started after the version went away
    /// ends at once, as a removed CRD version's handler does; it must not wait for a change
    /// its receiver has already seen.
    #[tokio::test]
    async fn a_watch_started_after_its_version_went_away_ends() {
        let store = Store::new([7; 16]);
        let served = watch::Sender::new(Served::default());
        served.send_modify(|s| *s = Served::new(None).expect("no version is valid"));
        let faults = Faults::new();
        let lines = lines(&store, &faults, served.subscribe(), request());
        let all = tokio::time::timeout(Duration::from_secs(5), lines.collect::<Vec<_>>())
            .await
            .expect("the watch ended");
        assert!(all.is_empty(), "{all:?}");
    }

    /// While the version is served the same watch stays open, and ends when it goes away.
    #[tokio::test]
    async fn a_served_watch_ends_when_its_version_goes_away() {
        let store = Store::new([7; 16]);
        // Kept alive: a dropped fault sender ends every watch.
        let faults = Faults::new();
        let served = watch::Sender::new(Served::default());
        let mut lines = Box::pin(lines(&store, &faults, served.subscribe(), request()));
        let open = tokio::time::timeout(Duration::from_millis(200), lines.next()).await;
        assert!(open.is_err(), "still open while served: {open:?}");
        served.send_modify(|s| *s = Served::new(None).expect("no version is valid"));
        let next = tokio::time::timeout(Duration::from_secs(5), lines.next())
            .await
            .expect("the watch ended");
        assert!(next.is_none(), "{next:?}");
    }
}
