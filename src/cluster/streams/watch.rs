//! The `OSImageStream` watch: which version the cluster serves (discovery), following the
//! object through API faults, and the [`Catalog`] each change of it gives.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use super::{Catalog, GROUP, NAME, NO_UPGRADE_FEATURE_SETS, OsImageStream, PLURAL, VERSIONS};
use crate::backoff::Backoff;

/// The first of [`VERSIONS`] whose discovery document (`GET /apis/<group>/<version>`) lists
/// `osimagestreams`. A group can be served without it (the machine-config operator's other
/// types on OpenShift before 4.21, or without the feature set).
pub fn served_version(lists: &[APIResourceList]) -> Option<&'static str> {
    VERSIONS.into_iter().find(|v| {
        lists.iter().any(|l| {
            l.group_version == format!("{GROUP}/{v}")
                && l.resources.iter().any(|r| r.name == PLURAL)
        })
    })
}

/// The versions of [`GROUP`] the group list names, among [`VERSIONS`].
pub(super) fn listed_versions(groups: &APIGroupList) -> Vec<&'static str> {
    let Some(group) = groups.groups.iter().find(|g| g.name == GROUP) else {
        return Vec::new();
    };
    VERSIONS
        .into_iter()
        .filter(|v| group.versions.iter().any(|gv| gv.version == *v))
        .collect()
}

/// The reason reported when no version is served.
/// Why a cluster offers no streams: the `OSStreams` feature gate of openshift/api, per release
/// (docs/fidelity.md "OSImageStream per release").
pub fn not_served() -> String {
    format!(
        "the cluster serves no OSImageStream API ({PLURAL}.{GROUP} in {}): OpenShift serves v1 from 4.23 (on HyperShift only with a no-upgrade feature set) and v1alpha1 on 4.21 and 4.22 only with the {} or {} (OSStreams gate) feature set",
        VERSIONS.join(" or "),
        NO_UPGRADE_FEATURE_SETS[..2].join(", "),
        NO_UPGRADE_FEATURE_SETS[2],
    )
}

/// How a request to the API failed, as far as the stream watch cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// 404: the version (or the whole CRD) is not served (any more).
    NotServed,
    /// 403: the node's identity may not read the object.
    Forbidden(String),
    /// Anything else (connection, 5xx, 410): retried, the last catalog holds.
    Other(String),
}

pub(super) fn classify(err: &kube::Error) -> Failure {
    match err {
        kube::Error::Api(s) if s.code == 404 => Failure::NotServed,
        kube::Error::Api(s) if s.code == 403 => Failure::Forbidden(s.message.clone()),
        other => Failure::Other(other.to_string()),
    }
}

pub(super) fn classify_watch(err: &watcher::Error) -> Failure {
    match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => classify(e),
        other => Failure::Other(other.to_string()),
    }
}

fn forbidden(version: &str, message: &str) -> String {
    format!(
        "reading OSImageStream {NAME:?} ({GROUP}/{version}) is forbidden ({}); the node's identity needs get, list and watch on {PLURAL} (docs/deploy/rbac.yaml)",
        // The server's own words, kept to one bounded line.
        crate::text::one_line(message, 400)
    )
}

/// What the stream watch yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamsUpdate {
    /// The catalog changed (the first one after start is always delivered).
    Catalog(Catalog),
    /// A transient failure; it is retried with backoff and the last catalog still holds.
    Error(String),
}

/// Turns watcher events into catalog changes: a (re)list is reported once it is complete
/// (an empty list means the object is missing), and an unchanged catalog is not repeated.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    /// During a (re)list: the object listed so far.
    listing: Option<Option<OsImageStream>>,
    last: Option<Catalog>,
}

impl Tracker {
    pub(super) fn on_event(&mut self, ev: watcher::Event<OsImageStream>) -> Option<StreamsUpdate> {
        let catalog = match ev {
            watcher::Event::Init => {
                self.listing = Some(None);
                return None;
            }
            watcher::Event::InitApply(o) => {
                self.listing = Some(Some(o));
                return None;
            }
            watcher::Event::InitDone => {
                Catalog::from_object(self.listing.take().flatten().as_ref())
            }
            watcher::Event::Apply(o) => Catalog::from_object(Some(&o)),
            watcher::Event::Delete(_) => Catalog::Missing,
        };
        self.report(catalog)
    }

    /// The update for `catalog`, unless it is the one reported last.
    fn report(&mut self, catalog: Catalog) -> Option<StreamsUpdate> {
        if self.last.as_ref() == Some(&catalog) {
            return None;
        }
        self.last = Some(catalog.clone());
        Some(StreamsUpdate::Catalog(catalog))
    }

    /// What a failure means: not served (`None`: discover again), forbidden (a catalog the
    /// node reports), anything else (retried).
    pub(super) fn on_failure(&mut self, version: &str, failure: Failure) -> Option<StreamsUpdate> {
        match failure {
            Failure::NotServed => None,
            Failure::Forbidden(m) => self.report(Catalog::Unreadable(forbidden(version, &m))),
            Failure::Other(m) => Some(StreamsUpdate::Error(m)),
        }
    }
}

/// First delay before discovering the served version again; doubles up to [`REDISCOVER_MAX`].
const REDISCOVER_MIN: Duration = Duration::from_secs(1);
/// Longest delay between discoveries.
const REDISCOVER_MAX: Duration = Duration::from_secs(300);

/// Discovers which version of `OSImageStream` the cluster serves (`None`: none).
async fn discover(client: &kube::Client) -> Result<Option<&'static str>, kube::Error> {
    let groups = client.list_api_groups().await?;
    let mut lists = Vec::new();
    for v in listed_versions(&groups) {
        match client
            .list_api_group_resources(&format!("{GROUP}/{v}"))
            .await
        {
            Ok(list) => lists.push(list),
            // Removed between the two requests: as if not listed.
            Err(e) if classify(&e) == Failure::NotServed => {}
            Err(e) => return Err(e),
        }
    }
    Ok(served_version(&lists))
}

/// Watches the `OSImageStream` named `cluster` (field selector) in the version the cluster
/// serves, found by API discovery, resuming from resourceVersion and relisting on 410 Gone
/// like the node watch. A 404 (the version is no longer served, e.g. after an upgrade from
/// 4.22 to 4.23) discovers again; no served version is [`Catalog::NotServed`] and 403
/// [`Catalog::Unreadable`], so the node says why it cannot resolve.
///
/// The node identity needs `get`, `list` and `watch` on `osimagestreams` (docs/deploy/).
pub fn watch(client: kube::Client) -> impl Stream<Item = StreamsUpdate> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let closed = tx.clone();
    // Ends with the stream, also while the watch is quiet.
    tokio::spawn(async move {
        tokio::select! {
            () = follow(client, tx) => {}
            () = closed.closed() => {}
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|u| (u, rx)) })
}

/// The task behind [`watch`]; ends when the stream is dropped.
async fn follow(client: kube::Client, tx: tokio::sync::mpsc::Sender<StreamsUpdate>) {
    let mut tracker = Tracker::default();
    let mut backoff = Backoff::new(REDISCOVER_MIN, REDISCOVER_MAX);
    loop {
        let update = match discover(&client).await {
            Ok(Some(version)) => {
                info!(version, "reading osimagestreams");
                let api: Api<OsImageStream> = Api::all_with(client.clone(), &version);
                let cfg = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
                let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
                while let Some(ev) = events.next().await {
                    let update = match ev {
                        Ok(ev) => {
                            backoff.reset();
                            tracker.on_event(ev)
                        }
                        Err(e) => match classify_watch(&e) {
                            Failure::NotServed => {
                                warn!(
                                    version,
                                    "osimagestreams no longer served in this version; discovering again"
                                );
                                break;
                            }
                            failure => tracker.on_failure(version, failure),
                        },
                    };
                    if let Some(u) = update
                        && tx.send(u).await.is_err()
                    {
                        return;
                    }
                }
                None
            }
            Ok(None) => tracker.report(Catalog::NotServed),
            Err(e) => tracker.on_failure(VERSIONS[0], classify(&e)),
        };
        if let Some(u) = update
            && tx.send(u).await.is_err()
        {
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
