//! The `StreamPool` resource (`streampools.osstream.openshift.io/v1alpha1`, cluster-scoped),
//! modelled on the machine-config operator's `MachineConfigPool`
//! (openshift/api:machineconfiguration/v1/types.go `MachineConfigPoolSpec`, `MachineConfigPoolStatus`):
//! a node selector, a target, `maxUnavailable`, `paused`, and a status with machine counts and
//! conditions. The CRD's schema is generated from these types (`streamd-rollout crd`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group, shared with the node protocol's annotation prefix.
pub const GROUP: &str = "osstream.openshift.io";
/// The served version.
pub const VERSION: &str = "v1alpha1";

/// Default of `spec.maxConcurrentStaging`: how many nodes may pull and stage at once.
pub const DEFAULT_MAX_CONCURRENT_STAGING: u32 = 10;
/// Default of `spec.drain.timeoutSeconds`.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u64 = 600;
/// Default of `spec.agentTimeoutSeconds`.
pub const DEFAULT_AGENT_TIMEOUT_SECONDS: u64 = 600;
/// Default of `spec.rebootTimeoutSeconds`.
pub const DEFAULT_REBOOT_TIMEOUT_SECONDS: u64 = 1800;

/// `spec.target.stream`: an RFC 1123 subdomain, as streamd's `validate_stream` requires.
pub const STREAM_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// `spec.target.osImage`, `extensionsImage`: a reference pinned by a sha256 digest, without a tag
/// (streamd refuses both); the controller's parse decides the rest (`TargetUnresolved`).
pub const DIGEST_PINNED_PATTERN: &str = r"^([^@\s/]+/)*[^@\s/:]+@sha256:[0-9a-f]{64}$";
/// The CEL rule of `spec.maxUnavailable` (an int-or-string is `int` or `string` in CEL).
pub const MAX_UNAVAILABLE_RULE: &str =
    "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')";
/// The CEL rule of `spec.target`.
pub const EXTENSIONS_NEED_OS_IMAGE_RULE: &str = "!has(self.extensionsImage) || has(self.osImage)";

/// A pool of nodes that runs one OS image stream; the controller moves its nodes there a few at
/// a time.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "osstream.openshift.io",
    version = "v1alpha1",
    kind = "StreamPool",
    plural = "streampools",
    shortname = "spool",
    status = "StreamPoolStatus",
    printcolumn = r#"{"name":"Stream","type":"string","jsonPath":".spec.target.stream"}"#,
    printcolumn = r#"{"name":"Updated","type":"string","jsonPath":".status.conditions[?(@.type==\"Updated\")].status"}"#,
    printcolumn = r#"{"name":"Updating","type":"string","jsonPath":".status.conditions[?(@.type==\"Updating\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Paused","type":"boolean","jsonPath":".spec.paused"}"#,
    printcolumn = r#"{"name":"Machines","type":"integer","jsonPath":".status.machineCount"}"#,
    printcolumn = r#"{"name":"Ready Machines","type":"integer","jsonPath":".status.readyMachineCount"}"#,
    printcolumn = r#"{"name":"Updated Machines","type":"integer","jsonPath":".status.updatedMachineCount"}"#,
    printcolumn = r#"{"name":"Degraded Machines","type":"integer","jsonPath":".status.degradedMachineCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"No Heartbeat","type":"integer","jsonPath":".status.noHeartbeatMachineCount","priority":1}"#,
    printcolumn = r#"{"name":"Readiness","type":"string","jsonPath":".status.readiness","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct StreamPoolSpec {
    /// The pool's nodes (Kubernetes label-selector semantics). An empty selector selects nothing
    /// and the pool is Degraded `InvalidSpec`, as the machine-config operator treats an empty
    /// MachineConfigPool selector; control-plane nodes only when the selector names that role; a
    /// custom pool wins over `worker`, and a node of two custom pools is left to neither.
    pub node_selector: LabelSelector,
    /// The stream the pool's nodes run.
    pub target: Target,
    /// How many nodes may be unavailable at once (count, or percent of the pool rounded down;
    /// 0 means 1), counting nodes unavailable for any reason. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": MAX_UNAVAILABLE_RULE,
        "message": "maxUnavailable must be a count >= 0 or a percentage from 0% to 100%",
    }]))]
    pub max_unavailable: Option<IntOrString>,
    /// How many nodes may pull and stage the target at once (staging runs ahead of the
    /// reboots). Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent_staging: Option<u32>,
    /// Stops new work at once: no new node is given the target, cordoned, drained or approved.
    /// Readiness checks of the target continue, so a paused pool shows what the move would meet.
    #[serde(default)]
    pub paused: bool,
    /// How nodes are drained before their reboot.
    #[serde(default)]
    pub drain: DrainSpec,
    /// How long a node given the target may take to acknowledge it (`observed-desired`) before
    /// it is reported `AgentNotResponding` and its staging slot goes to another node. Default
    /// 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub agent_timeout_seconds: Option<u64>,
    /// How long a node approved for its reboot may take to be back, `Done` and Ready, before it
    /// is reported `NodeNotReturning` (it still counts as unavailable). Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub reboot_timeout_seconds: Option<u64>,
    /// How long a node back on the target, `Done`, Ready and uncordoned, still counts as
    /// unavailable before the slot it frees goes to the next node (a Deployment's
    /// `minReadySeconds`). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub min_ready_seconds: Option<u64>,
    /// Move this many nodes, then pause the pool (`spec.paused: true`, condition `Paused`
    /// reason `CanaryComplete`) until an admin sets `paused: false`; once per target. Absent:
    /// no canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub canary: Option<u32>,
    /// Maintenance windows: outside all of them no new node is cordoned (staging runs ahead,
    /// a node already cordoned finishes). Empty: always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<MaintenanceWindow>,
}

/// A maintenance window: starts on each of `days` at `start` in `timeZone` and lasts
/// `durationMinutes`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct MaintenanceWindow {
    /// The days it starts on; empty: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days: Vec<Weekday>,
    /// Start, local time, `HH:MM` (24-hour).
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// Length in minutes, 1 to 10080 (a week); it may run past midnight.
    #[schemars(range(min = 1, max = 10080))]
    pub duration_minutes: u32,
    /// IANA time zone of `start`, e.g. `Europe/Berlin`. Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
}

/// A day of the week.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Weekday {
    /// Monday.
    Mon,
    /// Tuesday.
    Tue,
    /// Wednesday.
    Wed,
    /// Thursday.
    Thu,
    /// Friday.
    Fri,
    /// Saturday.
    Sat,
    /// Sunday.
    Sun,
}

/// The target of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": EXTENSIONS_NEED_OS_IMAGE_RULE,
    "message": "extensionsImage requires osImage",
}]))]
pub struct Target {
    /// Stream name, e.g. `rhel-10` (the node protocol's `desired-stream`).
    #[schemars(length(min = 1, max = 253), regex(pattern = STREAM_PATTERN))]
    pub stream: String,
    /// Digest-pinned OS image. Absent: the stream's `osImage` from the cluster's OSImageStream
    /// `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = DIGEST_PINNED_PATTERN))]
    pub os_image: Option<String>,
    /// Digest-pinned extensions image; only with `osImage` (absent then: no extensions image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = DIGEST_PINNED_PATTERN))]
    pub extensions_image: Option<String>,
}

/// Drain settings (the knobs of `kubectl drain`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct DrainSpec {
    /// How long a node's drain may take before it is reported `DrainTimeout` (Warning Event,
    /// the `Updating` condition's reason, `status.nodes`) and `onTimeout` applies. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 604800))]
    pub timeout_seconds: Option<u64>,
    /// Grace period given to each evicted pod; absent: the pod's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub grace_period_seconds: Option<i64>,
    /// Evict pods that use emptyDir volumes (their data is lost). Default false: such a pod
    /// blocks the drain.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
    /// A pod whose deletion was due (`deletionTimestamp`) longer ago than this is not waited
    /// for (kubectl drain's `--skip-wait-for-delete-timeout`); absent: every terminating pod is
    /// waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub skip_wait_for_delete_timeout_seconds: Option<u64>,
    /// Only the pods this selects are evicted (kubectl drain's `--pod-selector`); the others
    /// stay on the node through its reboot. Absent: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// What happens to a drain past `timeoutSeconds`. Default `retry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

/// What happens to a drain past its timeout.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnTimeout {
    /// Keep the node cordoned and keep evicting, less often (every minute, every five after
    /// ten minutes past the timeout), as the machine-config operator's drain controller does.
    #[default]
    Retry,
    /// Uncordon the node and set it aside (`rollout-set-aside`); the pool moves on with the
    /// other nodes and takes it again last.
    Release,
}

/// What the controller last saw of the pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamPoolStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The resolved target: `<stream> <os image>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Nodes the selector selects.
    pub machine_count: i32,
    /// Nodes that run the target and are uncordoned by the controller.
    pub updated_machine_count: i32,
    /// Updated nodes that are Ready and schedulable.
    pub ready_machine_count: i32,
    /// Nodes not Ready, cordoned, or being moved.
    pub unavailable_machine_count: i32,
    /// Nodes whose streamd reports `Degraded` or `Refused` for the pool's request.
    pub degraded_machine_count: i32,
    /// Ready nodes whose streamd heartbeat Lease ran out (streamd not running, or cut off from
    /// the API server); each is in `nodes` with state `NoHeartbeat`.
    #[serde(default)]
    pub no_heartbeat_machine_count: i32,
    /// `Updating`, `Updated`, `Degraded`, `Paused`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    #[schemars(length(max = 8))]
    pub conditions: Vec<Condition>,
    /// Why nodes are Degraded or Refused, or where a drain is stuck.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub nodes: Vec<NodeIssue>,
    /// The nodes still to move, in the order the rollout takes them (zone by zone, oldest
    /// first, the controller's own node last; held and failed nodes are not listed); at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub planned_order: Vec<String>,
    /// Where each node on its way stands (in the planned order; at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub progress: Vec<NodeProgress>,
    /// Readiness of the nodes not yet moved for the target stream, e.g.
    /// `12 of 14 ready; 2 refuse: cpu-level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<String>,
}

/// A condition, as MachineConfigPool's (`type`, `status`, `lastTransitionTime`, `reason`,
/// `message`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Updating`, `Updated`, `Degraded` or `Paused`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// The `metadata.generation` the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// CamelCase cause.
    #[serde(default)]
    pub reason: String,
    /// One line for a human.
    #[serde(default)]
    pub message: String,
}

/// Where one node on its way stands.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    /// Node name.
    pub name: String,
    /// `Staging` (given the target; streamd pulls and stages), `WaitingForReboot` (staged, waits
    /// for a slot), `Draining`, `Rebooting` (approved, until back `Done` and Ready) or `Soaking`
    /// (back, within `minReadySeconds`).
    pub step: String,
    /// When the step started (absent where the controller did not write it down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// streamd's last reason on the node (one line, capped).
    #[serde(default)]
    pub reason: String,
}

/// A node that needs an admin's look.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeIssue {
    /// Node name.
    pub name: String,
    /// The node's streamd state (`Degraded`, `Refused`), or the controller's: `Draining`,
    /// `EvictionBlocked`, a stall (`AgentNotResponding`, `DrainTimeout`, `NodeNotReturning`),
    /// `Conflict`, `NoHeartbeat` or `Held`.
    pub state: String,
    /// The node's reason, or what blocks the drain.
    pub reason: String,
}

/// Kubernetes knows the integer formats `int32` and `int64` only (the API server drops others
/// with a warning): an unsigned field's `uint32`/`uint64` becomes its signed twin (schemars
/// already gives it `minimum: 0`, and every such field has a maximum).
fn kubernetes_formats(schema: &mut schemars::Schema) {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(f) = map.get_mut("format") {
                    match f.as_str() {
                        Some("uint32") => *f = "int32".into(),
                        Some("uint64") => *f = "int64".into(),
                        _ => {}
                    }
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        map.values_mut().for_each(walk);
    }
}

/// The generated CustomResourceDefinition, as YAML.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(&StreamPool::crd())
}
