//! Draining a node through the Eviction API, as `kubectl drain` does
//! (kubernetes/kubectl:pkg/drain/filters.go `mirrorPodFilter`, `daemonSetFilter`,
//! `localStorageFilter`, `skipDeletedFilter`; pkg/drain/drain.go `evictPods`): mirror pods stay,
//! pods `drain.podSelector` does not select stay, DaemonSet pods stay when their DaemonSet exists
//! (looked up, as `daemonSetFilter` does: a pod whose DaemonSet is gone is an orphan and is
//! evicted, as with `--force`), a pod terminating for longer than
//! `drain.skipWaitForDeleteTimeoutSeconds` is not waited for, a pod using emptyDir blocks unless
//! its data may be deleted, every other pod is evicted (pods without a controller too, as the
//! machine-config operator's drain with `Force: true`,
//! openshift/machine-config-operator:pkg/controller/drain/drain_controller.go), and an eviction
//! a PodDisruptionBudget refuses (429) is tried again [`RETRY_SECONDS`] later.
//!
//! One [`pass`] evicts what may go among the node's pods and reports what is left; the caller
//! runs passes until nothing is left, so a controller restart simply continues with the next
//! pass. The pods come from one pod store shared by every drain ([`watch`]), whose events wake
//! the next pass as soon as a pod goes: a drain is approved when its last pod is deleted, not at the next tick of
//! a timer. What no pod event announces has its own deadline ([`Pass::retry_after`]): an
//! eviction refused (429, nothing changes on the pod) or failed is tried again after
//! [`RETRY_SECONDS`], kubectl's cadence; a pod terminating is skipped when
//! `skipWaitForDeleteTimeoutSeconds` runs out. A slow backstop ([`BACKSTOP_SECONDS`]) covers a
//! wake lost from a full queue or a watch event lost to a broken connection.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::core::{Selector, SelectorExt};
use serde_json::{Value, json};

use crate::crd::DrainSpec;

pub mod watch;

/// How long after a refused or failed eviction it is tried again: `kubectl drain`'s wait after
/// a 429 (kubernetes/kubectl:pkg/drain/drain.go `evictPods`, "will retry after 5s").
pub const RETRY_SECONDS: u64 = 5;

/// How long an unfinished drain waits at most for its next pass when nothing else is due: only
/// a pod event lost with its watch's connection waits this long.
pub const BACKSTOP_SECONDS: u64 = 30;

/// Overrides [`BACKSTOP_SECONDS`] (whole seconds, at least 1): the end-to-end test of pod-driven
/// drains sets it long to show that the pod event, not the backstop, lets the drain finish.
pub const BACKSTOP_ENV: &str = "STREAMD_ROLLOUT_DRAIN_BACKSTOP_SECONDS";

/// The backstop in effect: [`BACKSTOP_ENV`] when it holds a number, else [`BACKSTOP_SECONDS`].
pub fn backstop_seconds() -> u64 {
    std::env::var(BACKSTOP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(BACKSTOP_SECONDS)
}

/// The annotation the kubelet puts on the API copy of a static pod
/// (kubernetes/kubernetes:pkg/kubelet/types/pod_update.go `ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The pool's drain settings.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Grace period for each evicted pod; `None`: the pod's own.
    pub grace_period_seconds: Option<i64>,
    /// Evict pods that use emptyDir volumes.
    pub delete_empty_dir_data: bool,
    /// A pod whose deletion is due more than this many seconds ago is not waited for (kubectl's
    /// `--skip-wait-for-delete-timeout`); `None`: every terminating pod is waited for.
    pub skip_wait_for_delete_timeout_seconds: Option<u64>,
    /// Only the pods it selects are drained; `None`: every pod.
    pub pod_selector: Option<Selector>,
}

impl Settings {
    /// The settings of `spec`; an error names a malformed `podSelector`.
    pub fn from_spec(spec: &DrainSpec) -> Result<Settings, String> {
        let pod_selector = spec
            .pod_selector
            .clone()
            .map(Selector::try_from)
            .transpose()
            .map_err(|e| format!("spec.drain.podSelector: {}", e.0))?;
        Ok(Settings {
            grace_period_seconds: spec.grace_period_seconds,
            delete_empty_dir_data: spec.delete_empty_dir_data,
            skip_wait_for_delete_timeout_seconds: spec.skip_wait_for_delete_timeout_seconds,
            pod_selector,
        })
    }
}

/// What a drain does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Left running (it is not the drain's to move).
    Skip(&'static str),
    /// Already terminating: wait for it to go.
    Wait,
    /// Evict it.
    Evict,
    /// It blocks the drain until the settings or the pod change.
    Block(String),
    /// Controlled by the DaemonSet of this name (in the pod's namespace): skipped if it exists
    /// ([`daemon_set_verdict`]).
    DaemonSet(String),
}

/// Decides what happens to `pod` at `now` (Unix seconds).
pub fn verdict(pod: &Pod, settings: &Settings, now: i64) -> Verdict {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Verdict::Skip("mirror pod");
    }
    let empty = BTreeMap::new();
    if let Some(selector) = &settings.pod_selector
        && !selector.matches(meta.labels.as_ref().unwrap_or(&empty))
    {
        return Verdict::Skip("not selected by spec.drain.podSelector");
    }
    // kubectl's skipDeletedFilter: the deletion was due (deletionTimestamp) longer ago than
    // the timeout.
    if let (Some(deleted), Some(timeout)) = (
        &meta.deletion_timestamp,
        settings.skip_wait_for_delete_timeout_seconds,
    ) && deleted.0.as_second().saturating_add_unsigned(timeout) < now
    {
        return Verdict::Skip(
            "terminating for longer than spec.drain.skipWaitForDeleteTimeoutSeconds",
        );
    }
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    // Any finished pod may go; a running one of a DaemonSet is the DaemonSet's.
    let daemon_set = meta.owner_references.as_ref().and_then(|os| {
        os.iter()
            .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    });
    if let Some(owner) = daemon_set
        && !finished
    {
        return Verdict::DaemonSet(owner.name.clone());
    }
    if meta.deletion_timestamp.is_some() {
        return Verdict::Wait;
    }
    let empty_dir = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()));
    if empty_dir && !finished && !settings.delete_empty_dir_data {
        return Verdict::Block(
            "uses emptyDir data, which an eviction deletes (set spec.drain.deleteEmptyDirData)"
                .into(),
        );
    }
    Verdict::Evict
}

/// What a drain does with a pod whose controller is a DaemonSet, from the lookup of the
/// DaemonSet: kept when it exists; evicted when it is gone (an orphan the DaemonSet will not
/// replace, as `kubectl drain --force` and the machine-config operator's drain); blocked, and
/// looked up again on the next pass, when the lookup failed otherwise.
pub fn daemon_set_verdict(lookup: &Result<(), kube::Error>) -> Verdict {
    match lookup {
        Ok(()) => Verdict::Skip("DaemonSet pod"),
        Err(kube::Error::Api(s)) if s.code == 404 => Verdict::Evict,
        Err(e) => Verdict::Block(format!("looking up its DaemonSet failed: {e}")),
    }
}

/// The `policy/v1` Eviction of pod `namespace/name`, as `kubectl drain` posts it
/// (kubernetes/kubectl:pkg/drain/drain.go `EvictPod`): with `deleteOptions.gracePeriodSeconds`
/// when a grace period is given. kube-core 5's `Request::evict` names the options
/// `delete_options`, a key the API server does not read, so a grace period sent through it is
/// lost; the controller posts this body itself.
pub fn eviction(namespace: &str, name: &str, grace_period_seconds: Option<i64>) -> Value {
    let mut body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": name, "namespace": namespace },
    });
    if let Some(g) = grace_period_seconds {
        body["deleteOptions"] = json!({ "gracePeriodSeconds": g });
    }
    body
}

/// The answer to one eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted: the pod is being deleted.
    Accepted,
    /// The pod is already gone.
    Gone,
    /// Refused for now (429: a PodDisruptionBudget allows no disruption); retried.
    Refused(String),
    /// Any other failure (e.g. 500 for a pod matched by several PodDisruptionBudgets); retried.
    Failed(String),
}

/// Classifies the API server's answer to `POST …/pods/<name>/eviction`.
pub fn eviction_outcome(result: Result<(), kube::Error>) -> Eviction {
    match result {
        Ok(()) => Eviction::Accepted,
        Err(kube::Error::Api(s)) if s.code == 404 => Eviction::Gone,
        Err(kube::Error::Api(s)) if s.code == 429 => Eviction::Refused(s.message),
        Err(e) => Eviction::Failed(e.to_string()),
    }
}

/// What one pass found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pass {
    /// Pods still on the node that must go before the reboot (`namespace/name: why`).
    pub remaining: Vec<String>,
    /// Evictions accepted in this pass.
    pub evicted: usize,
    /// A PodDisruptionBudget refused an eviction (429) in this pass.
    pub refused: bool,
    /// Seconds until a pass is due although no pod changes (an eviction to try again, a
    /// terminating pod no longer waited for); `None`: only a pod event is.
    pub retry_after: Option<u64>,
}

impl Pass {
    /// Nothing is left to move.
    pub fn complete(&self) -> bool {
        self.remaining.is_empty()
    }

    /// A pass is due within `secs` whatever the pods do.
    fn retry_within(&mut self, secs: u64) {
        self.retry_after = Some(self.retry_after.map_or(secs, |s| s.min(secs)));
    }
}

/// Seconds from `now` until `pod`, terminating, is no longer waited for
/// (`skipWaitForDeleteTimeoutSeconds` past its deletionTimestamp; [`verdict`]); `None`: it is
/// waited for until it goes.
fn skip_due(pod: &Pod, settings: &Settings, now: i64) -> Option<u64> {
    let deleted = pod.metadata.deletion_timestamp.as_ref()?;
    let timeout = settings.skip_wait_for_delete_timeout_seconds?;
    let due = deleted.0.as_second().saturating_add_unsigned(timeout) + 1;
    Some(
        u64::try_from(due.saturating_sub(now))
            .unwrap_or_default()
            .max(1),
    )
}

/// One drain pass over `node`'s `pods` at `now` (Unix seconds): looks up the DaemonSets of
/// DaemonSet pods (once each), evicts the pods that may go, and reports what is left.
pub async fn pass(
    client: &kube::Client,
    node: &str,
    pods: Vec<Pod>,
    settings: &Settings,
    now: i64,
) -> Pass {
    let mut out = Pass::default();
    let mut daemon_sets: BTreeMap<(String, String), Verdict> = BTreeMap::new();
    for pod in pods {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let id = format!("{ns}/{name}");
        let mut v = verdict(&pod, settings, now);
        let looked_up = matches!(v, Verdict::DaemonSet(_));
        if let Verdict::DaemonSet(owner) = &v {
            let key = (ns.clone(), owner.clone());
            if !daemon_sets.contains_key(&key) {
                let api: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
                let lookup = api.get(owner).await.map(|_| ());
                daemon_sets.insert(key.clone(), daemon_set_verdict(&lookup));
            }
            v = daemon_sets[&key].clone();
        }
        match v {
            Verdict::Skip(why) => tracing::debug!(node, pod = %id, why, "drain skips pod"),
            Verdict::Wait => {
                if let Some(due) = skip_due(&pod, settings, now) {
                    out.retry_within(due);
                }
                out.remaining.push(format!("{id}: terminating"));
            }
            Verdict::Block(why) => {
                // A failed DaemonSet lookup is tried again; an emptyDir pod waits for the
                // pool's settings to change (a pool event).
                if looked_up {
                    out.retry_within(RETRY_SECONDS);
                }
                out.remaining.push(format!("{id}: {why}"));
            }
            // Looked up above.
            Verdict::DaemonSet(_) => {}
            Verdict::Evict => {
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let body = eviction(&ns, &name, settings.grace_period_seconds);
                let result = api
                    .create_subresource::<Value, Value>(
                        "eviction",
                        &name,
                        &PostParams::default(),
                        &body,
                    )
                    .await
                    .map(|_| ());
                record(&mut out, node, &id, eviction_outcome(result));
            }
        }
    }
    out
}

/// Records the answer to the eviction of pod `id` in `out`.
fn record(out: &mut Pass, node: &str, id: &str, outcome: Eviction) {
    match outcome {
        Eviction::Accepted => {
            tracing::info!(node, pod = %id, "evicted pod");
            out.evicted += 1;
            out.remaining.push(format!("{id}: terminating"));
        }
        Eviction::Gone => {}
        Eviction::Refused(m) => {
            tracing::info!(node, pod = %id, message = %m, "eviction refused; retrying");
            out.refused = true;
            out.retry_within(RETRY_SECONDS);
            out.remaining
                .push(format!("{id}: eviction refused (429): {m}"));
        }
        Eviction::Failed(m) => {
            tracing::warn!(node, pod = %id, error = %m, "eviction failed; retrying");
            out.retry_within(RETRY_SECONDS);
            out.remaining.push(format!("{id}: eviction failed: {m}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
    };

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            }),
        }
    }

    fn owned_by(kind: &str, controller: bool) -> Pod {
        let mut p = pod();
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "o".into(),
            uid: "u".into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }]);
        p
    }

    fn with_empty_dir(mut p: Pod) -> Pod {
        p.spec = Some(PodSpec {
            volumes: Some(vec![Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        });
        p
    }

    fn labelled(mut p: Pod, app: &str) -> Pod {
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        p
    }

    const NOW: i64 = 10_000;

    fn terminating_since(mut p: Pod, due: i64) -> Pod {
        let at = k8s_openapi::jiff::Timestamp::from_second(due).expect("time");
        p.metadata.deletion_timestamp = Some(Time(at));
        p
    }

    #[test]
    fn verdicts_follow_kubectl_drain() {
        let keep = Settings::default();
        let delete = Settings {
            delete_empty_dir_data: true,
            ..Settings::default()
        };
        let skip_after_60 = Settings {
            skip_wait_for_delete_timeout_seconds: Some(60),
            ..Settings::default()
        };
        let web_only = Settings::from_spec(&DrainSpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                ..LabelSelector::default()
            }),
            ..DrainSpec::default()
        })
        .expect("selector");
        let mut mirror = pod();
        mirror.metadata.annotations =
            Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        let terminating = terminating_since(owned_by("ReplicaSet", true), NOW - 30);
        let stuck = terminating_since(owned_by("ReplicaSet", true), NOW - 61);
        let mut finished = with_empty_dir(pod());
        finished.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        let mut finished_daemon = owned_by("DaemonSet", true);
        finished_daemon.status = finished.status.clone();
        let block = Verdict::Block(
            "uses emptyDir data, which an eviction deletes (set spec.drain.deleteEmptyDirData)"
                .into(),
        );
        #[rustfmt::skip]
        let table: Vec<(&str, Pod, &Settings, Verdict)> = vec![
            ("mirror", mirror, &keep, Verdict::Skip("mirror pod")),
            // Looked up before it is skipped (daemon_set_verdict).
            ("daemonset", owned_by("DaemonSet", true), &keep, Verdict::DaemonSet("o".into())),
            ("finished daemonset pod", finished_daemon, &keep, Verdict::Evict),
            // Owned by a DaemonSet but not as its controller: an ordinary pod.
            ("daemonset not controller", owned_by("DaemonSet", false), &keep, Verdict::Evict),
            ("replicaset", owned_by("ReplicaSet", true), &keep, Verdict::Evict),
            ("bare pod", pod(), &keep, Verdict::Evict),
            ("terminating", terminating.clone(), &keep, Verdict::Wait),
            ("terminating, within skipWaitForDeleteTimeoutSeconds", terminating, &skip_after_60, Verdict::Wait),
            ("terminating past skipWaitForDeleteTimeoutSeconds", stuck.clone(), &skip_after_60,
             Verdict::Skip("terminating for longer than spec.drain.skipWaitForDeleteTimeoutSeconds")),
            ("terminating long, no skip timeout", stuck, &keep, Verdict::Wait),
            ("emptyDir kept", with_empty_dir(owned_by("ReplicaSet", true)), &keep, block),
            ("emptyDir deleted", with_empty_dir(owned_by("ReplicaSet", true)), &delete, Verdict::Evict),
            ("finished emptyDir", finished, &keep, Verdict::Evict),
            ("selected by podSelector", labelled(pod(), "web"), &web_only, Verdict::Evict),
            ("not selected by podSelector", labelled(pod(), "cache"), &web_only,
             Verdict::Skip("not selected by spec.drain.podSelector")),
            ("no labels, podSelector", pod(), &web_only, Verdict::Skip("not selected by spec.drain.podSelector")),
        ];
        for (name, p, s, want) in table {
            assert_eq!(verdict(&p, s, NOW), want, "{name}");
        }
    }

    #[test]
    fn a_terminating_pod_is_let_go_when_its_skip_timeout_runs_out() {
        let skip_after_60 = Settings {
            skip_wait_for_delete_timeout_seconds: Some(60),
            ..Settings::default()
        };
        let terminating = terminating_since(pod(), NOW - 30);
        // Due 60 s after its deletion: the pass after that one skips it (`verdict`).
        assert_eq!(skip_due(&terminating, &skip_after_60, NOW), Some(31));
        assert_eq!(
            verdict(&terminating, &skip_after_60, NOW + 31),
            Verdict::Skip("terminating for longer than spec.drain.skipWaitForDeleteTimeoutSeconds")
        );
        assert_eq!(skip_due(&terminating, &skip_after_60, NOW + 40), Some(1));
        assert_eq!(skip_due(&terminating, &Settings::default(), NOW), None);
        assert_eq!(skip_due(&pod(), &skip_after_60, NOW), None);
    }

    #[test]
    fn a_malformed_pod_selector_is_named() {
        let bad = DrainSpec {
            pod_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "Near".into(),
                    values: None,
                }]),
                ..LabelSelector::default()
            }),
            ..DrainSpec::default()
        };
        let e = Settings::from_spec(&bad).expect_err("bad operator");
        assert!(e.starts_with("spec.drain.podSelector: "), "{e}");
    }

    #[test]
    fn a_daemon_set_pod_stays_only_while_its_daemon_set_exists() {
        assert_eq!(daemon_set_verdict(&Ok(())), Verdict::Skip("DaemonSet pod"));
        assert_eq!(
            daemon_set_verdict(&Err(api_error(404, "daemonsets.apps \"o\" not found"))),
            Verdict::Evict
        );
        assert!(matches!(
            daemon_set_verdict(&Err(api_error(403, "forbidden"))),
            Verdict::Block(why) if why.starts_with("looking up its DaemonSet failed")
        ));
    }

    #[test]
    fn the_eviction_carries_the_grace_period_as_the_api_names_it() {
        assert_eq!(
            eviction("shop", "web-a", Some(30)),
            json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": { "name": "web-a", "namespace": "shop" },
                "deleteOptions": { "gracePeriodSeconds": 30 },
            })
        );
        assert!(
            eviction("shop", "web-a", None)
                .get("deleteOptions")
                .is_none()
        );
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "TooManyRequests")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn eviction_answers() {
        assert_eq!(eviction_outcome(Ok(())), Eviction::Accepted);
        assert_eq!(
            eviction_outcome(Err(api_error(404, "gone"))),
            Eviction::Gone
        );
        assert_eq!(
            eviction_outcome(Err(api_error(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget."
            ))),
            Eviction::Refused(
                "Cannot evict pod as it would violate the pod's disruption budget.".into()
            )
        );
        assert!(matches!(
            eviction_outcome(Err(api_error(
                500,
                "This pod has more than one PodDisruptionBudget"
            ))),
            Eviction::Failed(_)
        ));
    }
}
