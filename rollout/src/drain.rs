//! Draining a node through the Eviction API, as `kubectl drain` does
//! (kubernetes/kubectl:pkg/drain/filters.go `mirrorPodFilter`, `daemonSetFilter`,
//! `localStorageFilter`, `skipDeletedFilter`; pkg/drain/drain.go `evictPods`): mirror pods and
//! DaemonSet pods stay, a pod using emptyDir blocks unless its data may be deleted, every other
//! pod is evicted (pods without a controller too, as the machine-config operator's drain with
//! `Force: true`, openshift/machine-config-operator:pkg/controller/drain/drain_controller.go),
//! and an eviction a PodDisruptionBudget refuses (429) is tried again on the next pass.
//!
//! One [`pass`] lists the node's pods and evicts what may go; the caller runs passes until
//! nothing is left, so a controller restart simply continues with the next pass.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, ListParams};

/// The annotation the kubelet puts on the API copy of a static pod
/// (kubernetes/kubernetes:pkg/kubelet/types/pod_update.go `ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The pool's drain settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// Grace period for each evicted pod; `None`: the pod's own.
    pub grace_period_seconds: Option<i64>,
    /// Evict pods that use emptyDir volumes.
    pub delete_empty_dir_data: bool,
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
}

/// Decides what happens to `pod`.
pub fn verdict(pod: &Pod, settings: Settings) -> Verdict {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Verdict::Skip("mirror pod");
    }
    if meta.owner_references.as_ref().is_some_and(|os| {
        os.iter()
            .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    }) {
        return Verdict::Skip("DaemonSet pod");
    }
    if meta.deletion_timestamp.is_some() {
        return Verdict::Wait;
    }
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
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
}

impl Pass {
    /// Nothing is left to move.
    pub fn complete(&self) -> bool {
        self.remaining.is_empty()
    }
}

/// One drain pass over `node`: lists its pods (field selector `spec.nodeName`), evicts those
/// that may go (only when `evict`; otherwise it only reports, as after a drain timed out), and
/// reports what is left.
pub async fn pass(
    client: &kube::Client,
    node: &str,
    settings: Settings,
    evict: bool,
) -> kube::Result<Pass> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut out = Pass::default();
    for pod in list.items {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let id = format!("{ns}/{name}");
        match verdict(&pod, settings) {
            Verdict::Skip(why) => tracing::debug!(node, pod = %id, why, "drain skips pod"),
            Verdict::Wait => out.remaining.push(format!("{id}: terminating")),
            Verdict::Block(why) => out.remaining.push(format!("{id}: {why}")),
            Verdict::Evict if !evict => out.remaining.push(format!("{id}: not evicted")),
            Verdict::Evict => {
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let params = EvictParams {
                    delete_options: Some(DeleteParams {
                        grace_period_seconds: settings
                            .grace_period_seconds
                            .and_then(|g| u32::try_from(g).ok()),
                        ..DeleteParams::default()
                    }),
                    ..EvictParams::default()
                };
                match eviction_outcome(api.evict(&name, &params).await.map(|_| ())) {
                    Eviction::Accepted => {
                        tracing::info!(node, pod = %id, "evicted pod");
                        out.evicted += 1;
                        out.remaining.push(format!("{id}: terminating"));
                    }
                    Eviction::Gone => {}
                    Eviction::Refused(m) => {
                        tracing::info!(node, pod = %id, message = %m, "eviction refused; retrying");
                        out.remaining
                            .push(format!("{id}: eviction refused (429): {m}"));
                    }
                    Eviction::Failed(m) => {
                        tracing::warn!(node, pod = %id, error = %m, "eviction failed; retrying");
                        out.remaining.push(format!("{id}: eviction failed: {m}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

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

    #[test]
    fn verdicts_follow_kubectl_drain() {
        let keep = Settings::default();
        let delete = Settings {
            delete_empty_dir_data: true,
            ..Settings::default()
        };
        let mut mirror = pod();
        mirror.metadata.annotations =
            Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        let mut terminating = owned_by("ReplicaSet", true);
        terminating.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut finished = with_empty_dir(pod());
        finished.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        let table: Vec<(&str, Pod, Settings, Verdict)> = vec![
            ("mirror", mirror, keep, Verdict::Skip("mirror pod")),
            (
                "daemonset",
                owned_by("DaemonSet", true),
                keep,
                Verdict::Skip("DaemonSet pod"),
            ),
            // Owned by a DaemonSet but not as its controller: an ordinary pod.
            (
                "daemonset not controller",
                owned_by("DaemonSet", false),
                keep,
                Verdict::Evict,
            ),
            ("replicaset", owned_by("ReplicaSet", true), keep, Verdict::Evict),
            ("bare pod", pod(), keep, Verdict::Evict),
            ("terminating", terminating, keep, Verdict::Wait),
            (
                "emptyDir kept",
                with_empty_dir(owned_by("ReplicaSet", true)),
                keep,
                Verdict::Block(
                    "uses emptyDir data, which an eviction deletes (set spec.drain.deleteEmptyDirData)"
                        .into(),
                ),
            ),
            (
                "emptyDir deleted",
                with_empty_dir(owned_by("ReplicaSet", true)),
                delete,
                Verdict::Evict,
            ),
            ("finished emptyDir", finished, keep, Verdict::Evict),
        ];
        for (name, p, s, want) in table {
            assert_eq!(verdict(&p, s), want, "{name}");
        }
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
