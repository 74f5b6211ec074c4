//! The typed status object: one truth for the annotations, the D-Bus API and `streamctl status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::protocol::{self, State};
use crate::host::facts::HostFacts;

/// Version of the JSON shape printed by `streamctl status --json` (docs/protocol.md).
pub const SCHEMA_VERSION: u32 = 1;

/// What streamd knows and reports about its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The Node object's name.
    pub node: String,
    /// The agent's state.
    pub state: State,
    /// One line for a human; empty in `Idle`/`Done`.
    pub reason: String,
    /// `0`..`100` while `Staging`.
    pub progress: Option<u8>,
    /// Stream of the booted deployment.
    pub current_stream: String,
    /// Image of the booted deployment.
    pub current_os_image: String,
    /// Image staged for the next boot.
    pub staged_os_image: Option<String>,
    /// Requested stream (as annotated, even if invalid).
    pub desired_stream: Option<String>,
    /// Requested OS image.
    pub desired_os_image: Option<String>,
    /// Requested extensions image.
    pub desired_extensions_image: Option<String>,
    /// Hash of the valid request the state refers to.
    pub observed_desired: Option<String>,
    /// Host facts.
    pub host: Option<HostFacts>,
    /// Unix time (seconds) of the last state change.
    pub last_change: u64,
    /// The last failure or refusal, kept after the state moves on (cleared by `Done`).
    #[serde(default)]
    pub last_error: Option<String>,
    /// The token of the pending reboot request (`reboot-requested`).
    #[serde(default)]
    pub reboot_requested: Option<String>,
    /// Whether the cluster approved that token (`reboot-approved` equals it).
    #[serde(default)]
    pub reboot_approved: bool,
    /// Reboots into the current request so far (from the attempt record).
    #[serde(default)]
    pub attempts: u32,
    /// Whether streamd manages the OS or only reports readiness.
    #[serde(default)]
    pub mode: protocol::Mode,
    /// The readiness of each checked stream, by stream name.
    #[serde(default)]
    pub readiness: BTreeMap<String, protocol::Readiness>,
    /// The checks whose failure the state is for (`Refused` by preflight); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_checks: Vec<protocol::CheckId>,
}

impl Status {
    /// Progress as the D-Bus API shows it: `0` unless staging.
    pub fn progress_value(&self) -> u32 {
        self.progress.map_or(0, u32::from)
    }

    /// The `host` JSON, empty when the facts are not known yet.
    pub fn host_json(&self) -> String {
        self.host
            .as_ref()
            .map(HostFacts::to_json)
            .unwrap_or_default()
    }

    /// The staging backend's name, empty when the facts are not known yet.
    pub fn backend_name(&self) -> &'static str {
        self.host.as_ref().map_or("", |h| h.backend.as_str())
    }

    /// The output annotations this status corresponds to; `None` removes a key.
    pub fn annotations(&self) -> BTreeMap<&'static str, Option<String>> {
        let reason = if self.state.clears_reason() {
            String::new()
        } else {
            crate::text::one_line_reason(&self.reason)
        };
        let progress = match self.state {
            State::Staging => self.progress.map(|p| p.min(100).to_string()),
            _ => None,
        };
        BTreeMap::from([
            (protocol::STATE, Some(self.state.to_string())),
            (protocol::REASON, Some(reason)),
            (protocol::PROGRESS, progress),
            (protocol::CURRENT_STREAM, Some(self.current_stream.clone())),
            (
                protocol::CURRENT_OS_IMAGE,
                Some(self.current_os_image.clone()),
            ),
            (protocol::STAGED_OS_IMAGE, self.staged_os_image.clone()),
            (protocol::OBSERVED_DESIRED, self.observed_desired.clone()),
            (protocol::HOST, self.host.as_ref().map(HostFacts::to_json)),
            (protocol::REBOOT_REQUESTED, self.reboot_requested.clone()),
            (protocol::MODE, Some(self.mode.to_string())),
            (
                protocol::READINESS,
                protocol::readiness_json(&self.readiness),
            ),
            (protocol::FAILED_CHECKS, self.failed_checks_value()),
        ])
    }

    /// The `failed-checks` value: the failed checks while the state is one they explain.
    fn failed_checks_value(&self) -> Option<String> {
        match self.state {
            State::Refused | State::Degraded => protocol::failed_checks_value(&self.failed_checks),
            _ => None,
        }
    }
}

/// The JSON document `streamctl status --json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The status.
    #[serde(flatten)]
    pub status: Status,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_follow_the_rules() {
        let mut s = Status {
            state: State::Staging,
            reason: "pulling\nlayers".into(),
            progress: Some(140),
            ..Status::default()
        };
        let a = s.annotations();
        assert_eq!(a[protocol::PROGRESS].as_deref(), Some("100"));
        assert_eq!(a[protocol::REASON].as_deref(), Some("pulling; layers"));
        assert_eq!(a[protocol::STAGED_OS_IMAGE], None);
        s.state = State::Done;
        let a = s.annotations();
        assert_eq!(a[protocol::PROGRESS], None, "progress only while Staging");
        assert_eq!(
            a[protocol::REASON].as_deref(),
            Some(""),
            "reason empty in Done"
        );
        assert!(a.keys().all(|k| protocol::OUTPUT_KEYS.contains(k)));
    }

    #[test]
    fn failed_checks_are_published_only_with_the_refusal() {
        let mut s = Status {
            state: State::Refused,
            reason: "preflight check fips failed: mismatch".into(),
            failed_checks: vec![protocol::CheckId::Fips, protocol::CheckId::CpuLevel],
            ..Status::default()
        };
        assert_eq!(
            s.annotations()[protocol::FAILED_CHECKS].as_deref(),
            Some("cpu-level,fips")
        );
        s.state = State::Idle;
        assert_eq!(s.annotations()[protocol::FAILED_CHECKS], None);
        s.state = State::Refused;
        s.failed_checks.clear();
        assert_eq!(
            s.annotations()[protocol::FAILED_CHECKS],
            None,
            "a refusal that is no check's (a bad annotation) names none"
        );
    }

    #[test]
    fn document_is_flat_camel_case() {
        let doc = StatusDocument {
            schema_version: SCHEMA_VERSION,
            status: Status {
                node: "n".into(),
                ..Status::default()
            },
        };
        let v = serde_json::to_value(&doc).expect("json");
        assert_eq!(v["schemaVersion"], 1);
        assert_eq!(v["node"], "n");
        assert_eq!(v["state"], "Idle");
        assert!(v.get("currentOsImage").is_some());
    }
}
