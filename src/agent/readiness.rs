//! The modes and the readiness checks (docs/protocol.md "Modes and readiness").
//!
//! In readiness mode (the machine-config daemon manages the node, or the config says so)
//! streamd never stages or reboots: `desired-*` requests are `Refused`, and the preflight runs
//! for each stream the cluster offers (or the one `check-stream` names) to report whether a move
//! would pass; on a node the machine-config daemon manages that move is the machine-config
//! operator's ([`Purpose::MachineConfigReadiness`]: it rebuilds an on-cluster-layered image from
//! the stream's base image). In manage mode `check-stream` is served beside the normal request.
//! Checks are read-only (registry reads, host files, the deployments list), run as work off the
//! loop (`work.rs`) and only while no other work or transaction runs.

use std::collections::BTreeMap;
use std::time::Instant;

use tracing::{debug, info, warn};

use super::Agent;
use super::core::{Event, Step};
use super::work::{Outcome, ReadinessRun};
use crate::agent::gather::{Gatherer, Prepared, Purpose, Transient};
use crate::agent::planner;
use crate::agent::preflight;
use crate::backend::{Deployment, StagePlan};
use crate::cluster::mco;
use crate::cluster::node::EventType;
use crate::cluster::policy::{self, Verdict};
use crate::cluster::protocol::{
    self, CheckRequest, Desired, Inputs, MAX_READINESS_REASON_CHARS, MAX_READINESS_STREAMS, Mode,
    Readiness, State,
};
use crate::cluster::streams::{self, Catalog, ResolveError};
use crate::config::ModeChoice;
use crate::host::attempt::Record;
use crate::host::facts::machineconfig::{self, AppliedConfig, AppliedError};
use crate::host::facts::{HostFacts, HostRoot, mcd};

/// One stream to check, or why it cannot be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// The stream and its images.
    Check(Desired),
    /// The stream's images could not be resolved.
    Unresolved {
        /// The stream name.
        stream: String,
        /// Why.
        reason: String,
    },
}

impl Target {
    fn stream(&self) -> &str {
        match self {
            Target::Check(d) => &d.stream,
            Target::Unresolved { stream, .. } => stream,
        }
    }

    /// What identifies this target's input: a change re-runs the checks.
    fn key(&self) -> String {
        match self {
            Target::Check(d) => d.observed_hash(),
            Target::Unresolved { stream, reason } => format!("{stream}:{reason}"),
        }
    }
}

/// The streams the checks should cover now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    targets: Vec<Target>,
    /// Leave out the booted stream (every available stream is checked, not a named one).
    exclude_booted: bool,
    /// Whose move is checked: the machine-config operator's on a node its daemon manages in
    /// readiness mode, else streamd's.
    purpose: Purpose,
    /// For the operator's move: the MachineConfig its daemon applied (or why it cannot be
    /// read), which decides what the move installs; `None` when not known or not asked.
    machine_config: Option<Result<AppliedConfig, AppliedError>>,
}

impl Plan {
    /// The requests of the streams to check.
    fn checked(&self) -> impl Iterator<Item = &Desired> {
        self.targets.iter().filter_map(|t| match t {
            Target::Check(d) => Some(d),
            Target::Unresolved { .. } => None,
        })
    }

    fn key(&self) -> String {
        let mut k: Vec<String> = self.targets.iter().map(Target::key).collect();
        k.push(self.exclude_booted.to_string());
        k.push(format!("{:?}", self.purpose));
        k.push(format!("{:?}", self.machine_config));
        k.join("\n")
    }
}

/// What the readiness checks can do now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Planned {
    /// Nothing to check (manage mode without `check-stream`).
    Nothing,
    /// The cluster's streams have not been read yet.
    Wait,
    /// A `check-*` value is malformed.
    Invalid(String),
    /// No stream can be checked (the cluster's OSImageStream is missing, not reconciled or
    /// unreadable); the reason says why.
    Cannot(String),
    /// The cluster offers no OS image streams at all (it serves no OSImageStream API): nothing
    /// is wrong with the node; the reason says how to check a stream anyway.
    NoStreams(String),
    /// Check these.
    Run(Plan),
}

/// The stream the booted deployment runs: its image's `io.openshift.os.streamclass` label,
/// else the host's os-release; empty when unknown.
pub(super) fn booted_stream(host: &HostRoot, deployments: &[Deployment]) -> String {
    let booted = deployments.iter().find(|d| d.booted);
    let label = booted.and_then(|d| d.image_labels.get("io.openshift.os.streamclass").cloned());
    label
        .or_else(|| host.os_release().ok().and_then(|r| r.stream()))
        .unwrap_or_default()
}

/// Preflight for `desired` on the node as it is, changing nothing: what `streamctl preflight`
/// runs (streamd's own move). `catalog`: the cluster's streams, for the image policy.
pub(super) async fn check_only(
    gatherer: &Gatherer,
    facts: &HostFacts,
    deployments: &[Deployment],
    record: &Record,
    desired: &Desired,
    catalog: Option<&Catalog>,
) -> Result<Prepared, Transient> {
    check_for(
        gatherer,
        facts,
        deployments,
        record,
        desired,
        Purpose::DryRun,
        None,
        catalog,
    )
    .await
}

/// Preflight for `desired` on the node as it is, changing nothing, for the move `purpose`
/// names (a dry run of streamd's, or the machine-config operator's, given the MachineConfig
/// its daemon applied). The image policy judges `desired` first, with the cluster's streams
/// `catalog`; one that needs them before they can be used is retried like a registry failure.
#[allow(clippy::too_many_arguments)]
async fn check_for(
    gatherer: &Gatherer,
    facts: &HostFacts,
    deployments: &[Deployment],
    record: &Record,
    desired: &Desired,
    purpose: Purpose,
    machine_config: Option<&Result<AppliedConfig, AppliedError>>,
    catalog: Option<&Catalog>,
) -> Result<Prepared, Transient> {
    let Some(booted) = deployments.iter().find(|d| d.booted) else {
        return Err(Transient(
            "the update backend reports no booted deployment".into(),
        ));
    };
    let allowed = match policy::judge(&gatherer.images, desired, booted.pullspec(), catalog) {
        Verdict::Allowed(why) => why,
        Verdict::Refused(why) => return Ok(Prepared::refused_by_image_policy(why)),
        Verdict::Wait(wait) => return Err(Transient(wait.to_string())),
    };
    let base = StagePlan::rebase(
        &desired.stream,
        &desired.os_image,
        gatherer.policy.allow_downgrade,
    );
    let foreign = planner::foreign_staged(deployments, record, facts.backend);
    gatherer
        .prepare(
            facts,
            desired,
            booted,
            foreign,
            base,
            purpose,
            machine_config.map(preflight::FactError::of_machine_config),
            allowed,
        )
        .await
}

/// The readiness of a stream whose images could not be resolved, for `reason`.
fn unresolved(stream: &str, reason: &str) -> Readiness {
    Readiness {
        ready: false,
        failed: Vec::new(),
        reason: reason.to_string(),
        os_image: String::new(),
        checked: protocol::short_hash(stream, "", None),
    }
}

/// One stream's readiness from its preflight.
fn entry(desired: &Desired, result: Result<Prepared, Transient>) -> (Readiness, bool) {
    let mut r = Readiness {
        ready: false,
        failed: Vec::new(),
        reason: String::new(),
        os_image: desired.os_image.to_string(),
        checked: desired.observed_hash(),
    };
    match result {
        Ok(p) => {
            r.failed = preflight::failed_ids(&p.checks);
            r.ready = r.failed.is_empty();
            if let Some(c) = preflight::first_failure(&p.checks) {
                r.reason = c.id.failure_reason(&c.message);
            }
            (r, false)
        }
        Err(Transient(e)) => {
            r.reason = format!("the checks could not run: {e}");
            (r, true)
        }
    }
}

impl Agent {
    /// The mode the node is in and, in readiness mode, why.
    pub(super) fn mode(&self) -> (Mode, Option<String>) {
        match (self.reboot.mode, self.mcd) {
            (ModeChoice::Manage, _) | (ModeChoice::Auto, None) => (Mode::Manage, None),
            (ModeChoice::Readiness, _) => (
                Mode::Readiness,
                Some("streamd's config sets mode = \"readiness\"".into()),
            ),
            (ModeChoice::Auto, Some(signal)) => (
                Mode::Readiness,
                Some(format!(
                    "the machine-config daemon manages this node ({signal})"
                )),
            ),
        }
    }

    /// Takes the mode signals and the `check-*` keys from a node update.
    pub(super) fn observe_mode(&mut self, annotations: &BTreeMap<String, String>) {
        self.checks = protocol::CheckInputs::from_annotations(annotations);
        self.mcd = mcd::detect(&self.host, annotations);
        let mode = self.mode().0;
        if mode != self.report.status().mode {
            info!(%mode, signal = ?self.mcd.map(|s| s.to_string()), "mode");
            self.report.set_mode(mode);
        }
        // Read on every node update, and only where the operator's move is checked
        // (`readiness_plan`): the daemon rewrites the file before it reboots into a new config
        // and updates the node's currentConfig annotation after.
        let machine_config = if mode == Mode::Readiness && self.mcd.is_some() {
            machineconfig::applied(&self.host)
        } else {
            Ok(None)
        };
        if machine_config != self.machine_config {
            match &machine_config {
                Ok(Some(mc)) => info!(
                    kernel_type = ?mc.kernel_type,
                    extensions = ?mc.extensions,
                    unsupported = ?mc.unsupported,
                    os_image_url_overridden = mc.pins.os_image_url_overridden,
                    controller_version = ?mc.pins.controller_version,
                    "applied MachineConfig"
                ),
                Ok(None) => debug!("no applied MachineConfig on the host"),
                Err(e) => warn!(error = %e, "cannot read the applied MachineConfig"),
            }
            self.machine_config = machine_config;
        }
    }

    /// Whether the cluster's streams must be watched for the checks.
    pub(super) fn wants_catalog(&self) -> bool {
        self.report.status().mode == Mode::Readiness
            || (self.checks.stream.is_some() && self.checks.os_image.is_none())
            || self.images_watch
    }

    /// The readiness-mode answer to every request: stage nothing, report why, cancel a
    /// transaction started before the mode changed.
    pub(super) async fn hold_readiness(&mut self) {
        self.hold().await;
        // A request acted on before is acted on afresh once the node is handed back.
        self.inputs = None;
        let raw = self.raw_inputs.clone();
        self.report.set_desired(&raw, None);
        self.request_reboot(None, None).await;
        let why = self.mode().1.unwrap_or_default();
        let mut refused = Vec::new();
        if raw.stream.is_some() || raw.os_image.is_some() || raw.extensions_image.is_some() {
            // The way to move the node is the platform's: the pool's stream where the MCD
            // manages it (handing such a node to streamd breaks the MCD, docs/modes.md).
            let how = if self.mcd.is_some() {
                "to move this node, set its MachineConfigPool's spec.osImageStream.name: the machine-config operator moves it, and the readiness annotation says whether it would pass"
            } else {
                "to let streamd move this node, remove mode = \"readiness\" from streamd's config"
            };
            refused.push(format!(
                "{why}: streamd runs in readiness mode, never stages or reboots, and refuses desired-stream/desired-os-image; {how}"
            ));
        }
        let planned = self.readiness_plan();
        if let Planned::Invalid(e) = &planned {
            refused.push(e.clone());
        }
        let (state, reason) = match planned {
            _ if !refused.is_empty() => (State::Refused, refused.join("; ")),
            Planned::Cannot(reason) => (State::Degraded, reason),
            Planned::NoStreams(reason) => (State::Idle, reason),
            _ => (State::Idle, String::new()),
        };
        self.set_state(state, reason).await;
    }

    /// What the checks should cover now.
    fn readiness_plan(&self) -> Planned {
        let request = match self.checks.request() {
            Err(e) => return Planned::Invalid(e.to_string()),
            Ok(r) => r,
        };
        let catalog = self.catalog.as_ref();
        // In readiness mode on a node the machine-config daemon manages, the move an admin
        // asks about is the machine-config operator's (the pool's spec.osImageStream.name).
        let purpose = if self.report.status().mode == Mode::Readiness && self.mcd.is_some() {
            Purpose::MachineConfigReadiness
        } else {
            Purpose::DryRun
        };
        let machine_config = match purpose {
            Purpose::MachineConfigReadiness => self.machine_config.clone().transpose(),
            _ => None,
        };
        // What the operator makes of each stream for this node's pool (`crate::cluster::mco`).
        let applied = machine_config
            .as_ref()
            .and_then(|m| m.as_ref().ok())
            .cloned();
        let operator = |t: Target, from_catalog: bool| match &applied {
            Some(mc) => operator_view(t, mc, catalog, from_catalog),
            None => t,
        };
        match request {
            Some(CheckRequest {
                stream,
                os_image: Some(os_image),
                extensions_image,
            }) => {
                let target = Target::Check(Desired {
                    stream,
                    os_image,
                    extensions_image,
                });
                Planned::Run(Plan {
                    targets: vec![operator(target, false)],
                    exclude_booted: false,
                    purpose,
                    machine_config,
                })
            }
            Some(CheckRequest { stream, .. }) => match resolve_target(&stream, catalog) {
                None => Planned::Wait,
                Some(t) => Planned::Run(Plan {
                    targets: vec![operator(t, true)],
                    exclude_booted: false,
                    purpose,
                    machine_config,
                }),
            },
            None if self.report.status().mode == Mode::Manage => Planned::Nothing,
            None => match catalog {
                None => Planned::Wait,
                Some(Catalog::Available(entries)) => Planned::Run(Plan {
                    // A name that is no stream name is not checked (nor written as a key).
                    targets: entries
                        .iter()
                        .filter(|e| protocol::validate_stream(&e.name).is_ok())
                        .filter_map(|e| resolve_target(&e.name, catalog))
                        .map(|t| operator(t, true))
                        .collect(),
                    exclude_booted: true,
                    purpose,
                    machine_config,
                }),
                Some(Catalog::Missing) => Planned::Cannot(format!(
                    "readiness checks: {}; no stream to check (set check-stream and check-os-image to check one)",
                    ResolveError::Missing
                )),
                Some(Catalog::Unreconciled) => {
                    Planned::Cannot(format!("readiness checks: {}", ResolveError::Unreconciled))
                }
                Some(Catalog::Unreadable(reason)) => {
                    Planned::Cannot(format!("readiness checks: {reason}"))
                }
                Some(Catalog::NotServed) => Planned::NoStreams(format!(
                    "the cluster offers no OS image streams, so there is nothing to check: {}; to check one anyway, set check-stream and check-os-image (and check-extensions-image) on the node",
                    streams::not_served()
                )),
            },
        }
    }

    /// Starts the readiness checks when they are due and nothing else runs; called after
    /// every event of the loop.
    pub(super) async fn readiness_tick(&mut self) {
        if !self.node_seen || !self.core.idle() {
            return;
        }
        let plan = match self.readiness_plan() {
            Planned::Run(plan) => plan,
            Planned::Invalid(e) if self.report.status().mode == Mode::Manage => {
                // The state belongs to the request; a bad check is an Event and a log line.
                if self.check_error.as_deref() != Some(e.as_str()) {
                    warn!(error = %e, "check request refused");
                    let _ = self
                        .events
                        .try_send((EventType::Warning, "CheckRefused", e.clone()));
                    self.check_error = Some(e);
                }
                return;
            }
            Planned::Nothing | Planned::NoStreams(_) => {
                self.check_error = None;
                if !self.report.status().readiness.is_empty() {
                    self.report.set_readiness(BTreeMap::new());
                    self.readiness_key = None;
                    self.publish().await;
                }
                return;
            }
            Planned::Invalid(_) | Planned::Wait | Planned::Cannot(_) => return,
        };
        self.check_error = None;
        let key = plan.key();
        if self.readiness_key.as_deref() == Some(key.as_str()) && !self.core.readiness_stale() {
            return;
        }
        let Some(mut facts) = self.report.status().host.clone() else {
            return;
        };
        self.watch_streams_for(plan.checked());
        debug!(?plan, "running readiness checks");
        let backend = self.backend.clone();
        let gatherer = self.gatherer.clone();
        let store = self.store.clone();
        let lock = self.preflight_lock.clone();
        let catalog = self.catalog.clone();
        self.start(Step::Readiness, async move {
            let _one_at_a_time = lock.lock().await;
            // Whether the bootloader is this boot's: the secure-boot check's fact.
            facts.bootloader_updated =
                crate::host::bootloader::ran_this_boot(backend.connection()).await;
            let deployments = backend.deployments().await;
            let record = store.load().unwrap_or_default();
            let booted = deployments
                .as_ref()
                .ok()
                .map(|d| booted_stream(&gatherer.host, d));
            let mut entries = BTreeMap::new();
            let mut transient = false;
            for target in &plan.targets {
                if entries.len() == MAX_READINESS_STREAMS {
                    break;
                }
                if plan.exclude_booted && booted.as_deref() == Some(target.stream()) {
                    continue;
                }
                let (e, again) = match (target, &deployments) {
                    (Target::Unresolved { stream, reason }, _) => {
                        (unresolved(stream, reason), false)
                    }
                    (Target::Check(d), Err(e)) => {
                        entry(d, Err(Transient(format!("reading deployments: {e}"))))
                    }
                    (Target::Check(d), Ok(deps)) => {
                        let p = check_for(
                            &gatherer,
                            &facts,
                            deps,
                            &record,
                            d,
                            plan.purpose,
                            plan.machine_config.as_ref(),
                            catalog.as_ref(),
                        );
                        entry(d, p.await)
                    }
                };
                transient |= again;
                // Registry and daemon text: one inert, bounded line wherever it is shown (the
                // annotation, `streamctl status`).
                let e = Readiness {
                    reason: crate::text::one_line(&e.reason, MAX_READINESS_REASON_CHARS),
                    ..e
                };
                entries.insert(target.stream().to_string(), e);
            }
            Outcome::Checked(Box::new(ReadinessRun {
                key: plan.key(),
                deployments,
                entries,
                transient,
                bootloader_updated: facts.bootloader_updated,
            }))
        });
    }

    /// Publishes what a readiness run found and schedules the next one.
    pub(super) async fn on_checked(&mut self, run: ReadinessRun) {
        if let Ok(d) = &run.deployments {
            self.observe_deployments(d);
        }
        let current = match self.readiness_plan() {
            Planned::Run(plan) => Some(plan.key()),
            _ => None,
        };
        if current.as_deref() != Some(run.key.as_str()) {
            // The input changed meanwhile: these results answer a question no longer asked.
            debug!("readiness input changed during the checks; running them again");
            self.publish().await;
            return;
        }
        self.core.handle(Event::Checked {
            now: Instant::now(),
            transient: run.transient,
            jitter: crate::backoff::jitter(),
        });
        for (stream, r) in &run.entries {
            info!(stream = %stream, ready = r.ready, failed = ?r.failed, "readiness");
        }
        self.readiness_key = Some(run.key);
        self.report.set_readiness(run.entries);
        self.report.set_bootloader_updated(run.bootloader_updated);
        if self.report.status().mode == Mode::Readiness {
            // The current stream may have become known: the state follows the same rules.
            self.hold_readiness().await;
        } else {
            self.publish().await;
        }
    }
}

/// `target` as the machine-config operator would move the pool of a node whose applied
/// MachineConfig is `mc` (`crate::cluster::mco`): not at all when the pool overrides
/// `osImageURL`; not from an OSImageStream its render controller ignores (`from_catalog`: the
/// target's images are the OSImageStream's); with the pool's own extensions image when a
/// MachineConfig overrides the stream's.
fn operator_view(
    target: Target,
    mc: &AppliedConfig,
    catalog: Option<&Catalog>,
    from_catalog: bool,
) -> Target {
    let Target::Check(mut desired) = target else {
        return target;
    };
    let entries = match catalog {
        Some(Catalog::Available(entries)) => entries.as_slice(),
        _ => &[],
    };
    let written_by = entries.first().and_then(|e| e.written_by.as_deref());
    let not_applicable =
        mco::pinned(mc).or_else(|| from_catalog.then(|| mco::ignored(mc, written_by)).flatten());
    let reason = match (not_applicable, mco::extensions_override(mc, entries)) {
        (Some(reason), _) => reason,
        (None, Some(Err(unpinned))) => unpinned.to_string(),
        (None, Some(Ok(image))) => {
            desired.extensions_image = Some(image);
            return Target::Check(desired);
        }
        (None, None) => return Target::Check(desired),
    };
    Target::Unresolved {
        stream: desired.stream,
        reason,
    }
}

/// The target for `stream` from the cluster's OSImageStream; `None` until it has been read.
fn resolve_target(stream: &str, catalog: Option<&Catalog>) -> Option<Target> {
    let only_stream = Inputs {
        stream: Some(stream.to_string()),
        ..Inputs::default()
    };
    let unresolved = |reason: String| Target::Unresolved {
        stream: stream.to_string(),
        reason,
    };
    match streams::resolve(&only_stream, catalog) {
        Err(ResolveError::Pending) => None,
        Err(ResolveError::Missing) => Some(unresolved(format!(
            "OSImageStream {:?} does not exist; set check-os-image to check an image anyway (on OpenShift the machine-config operator creates it once the cluster offers OS streams: do not create it yourself)",
            streams::NAME
        ))),
        Err(e) => Some(unresolved(e.to_string())),
        Ok(inputs) => Some(match inputs.desired() {
            Ok(Some(d)) => Target::Check(d),
            Ok(None) => unresolved("no image".into()),
            Err(e) => unresolved(e.to_string()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::mco::tests::{EXT, MINE, OS};
    use crate::cluster::streams::StreamImages;

    fn target() -> Target {
        Target::Check(Desired {
            stream: "rhel-10".into(),
            os_image: OS.parse().expect("image"),
            extensions_image: Some(EXT.parse().expect("image")),
        })
    }

    fn catalog(written_by: &str) -> Catalog {
        Catalog::Available(vec![StreamImages {
            name: "rhel-10".into(),
            os_image: OS.into(),
            os_extensions_image: EXT.into(),
            written_by: Some(written_by.into()),
        }])
    }

    /// A 4.22 MachineConfig rendered by build `abc`, with `spec`.
    fn mc(spec: &str) -> AppliedConfig {
        mco::tests::mc("4.22.0", "abc", "", spec)
    }

    /// The operator installs from the pool's own extensions image, so that one is checked.
    #[test]
    fn an_overriding_extensions_image_is_the_one_checked() {
        let m = mc(&format!(r#""baseOSExtensionsContainerImage":"{MINE}""#));
        let Target::Check(d) = operator_view(target(), &m, Some(&catalog("abc")), true) else {
            panic!("checked");
        };
        assert_eq!(d.extensions_image.map(|i| i.to_string()), Some(MINE.into()));
        assert_eq!(d.os_image.to_string(), OS, "the stream's OS image");
        let m = mc(&format!(r#""baseOSExtensionsContainerImage":"{EXT}""#));
        assert_eq!(
            operator_view(target(), &m, Some(&catalog("abc")), true),
            target()
        );
    }

    /// The version guard judges the OSImageStream, so only targets it gave.
    #[test]
    fn the_version_guard_ignores_only_the_streams_images() {
        let m = mc("");
        let other = catalog("def");
        let ignored = operator_view(target(), &m, Some(&other), true);
        assert!(
            matches!(&ignored, Target::Unresolved { stream, reason } if stream == "rhel-10" && reason.contains("ignores OSImageStream")),
            "{ignored:?}"
        );
        assert_eq!(operator_view(target(), &m, Some(&other), false), target());
        assert_eq!(
            operator_view(target(), &m, Some(&catalog("abc")), true),
            target()
        );
    }
}
