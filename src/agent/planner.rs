//! The planner: a pure function from what the node has and what the cluster asks to what to do.
//!
//! No I/O happens here; the agent gathers an [`Observation`], asks [`decide`], and carries out the
//! [`Decision`]. Every rule is covered by the table tests below.

use crate::backend::StagePlan;
use crate::backend::{BackendKind, Deployment};
use crate::cluster::protocol::{Desired, ProtocolError, State};
use crate::config::RebootPolicy;
use crate::host::attempt::Record;

/// What the agent knows when it decides.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The validated request (or why it is invalid).
    pub desired: &'a Result<Option<Desired>, ProtocolError>,
    /// The deployments, boot order.
    pub deployments: &'a [Deployment],
    /// The admin allows moving to an older major (`allow-downgrade`).
    pub allow_downgrade: bool,
    /// The backend that stages.
    pub backend: BackendKind,
    /// The reboot side of the request.
    pub lifecycle: Lifecycle<'a>,
}

/// The reboot handshake's inputs.
#[derive(Debug, Clone, Copy)]
pub struct Lifecycle<'a> {
    /// When the staged OS is applied.
    pub policy: RebootPolicy,
    /// Reboots into one request before it is refused.
    pub max_attempts: u32,
    /// This boot's id.
    pub boot_id: &'a str,
    /// What streamd remembers across reboots.
    pub record: &'a Record,
    /// `reboot-approved`, if set.
    pub approved: Option<&'a str>,
    /// Whether a stage for this request is finalization-locked from the moment it exists
    /// (`Backend::locks_for`): on rpm-ostree always; on bootc only from v1.12 and when nothing
    /// else is staged. Without it a stage waits for the approval, as any reboot applies it.
    pub locks: bool,
}

impl Observation<'_> {
    /// The booted deployment.
    pub fn booted(&self) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.booted)
    }

    /// The staged deployment, if any.
    pub fn staged(&self) -> Option<&Deployment> {
        self.deployments.iter().find(|d| d.staged)
    }

    /// Whether the staged deployment is one streamd created.
    pub fn staged_is_ours(&self) -> bool {
        self.staged()
            .is_some_and(|s| is_ours(s, self.lifecycle.record))
    }

    /// A staged deployment streamd did not create (for the `pending-deployment` check).
    pub fn foreign_staged(&self) -> Option<&Deployment> {
        foreign_staged(self.deployments, self.lifecycle.record, self.backend)
    }
}

/// Whether `staged` is the deployment streamd recorded it was staging.
fn is_ours(staged: &Deployment, record: &Record) -> bool {
    record
        .staged
        .as_ref()
        .is_some_and(|ours| staged.pullspec() == Some(ours.os_image.as_str()))
}

/// The pending deployment among `deployments` if streamd did not create it: a staged one of
/// someone else's, or any written by `ostree admin deploy` (streamd only stages). rpm-ostree
/// would edit its origin instead of the booted one's, so it must go before streamd stages.
/// On bootc a stage of the booted image is not foreign: the next boot runs what runs now,
/// streamd's own cleanup leaves one (bootc cannot remove a stage; the booted image is staged
/// again in its place) and `bootc switch` replaces it.
pub fn foreign_staged<'a>(
    deployments: &'a [Deployment],
    record: &Record,
    backend: BackendKind,
) -> Option<&'a Deployment> {
    let booted = deployments.iter().find(|d| d.booted);
    crate::backend::pending(deployments)
        .filter(|p| !p.staged || !is_ours(p, record))
        .filter(|p| {
            !(backend == BackendKind::Bootc
                && p.staged
                && booted.is_some_and(|b| p.carries_image_of(b)))
        })
}

/// Why the planner refuses a request; its text is the reported reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An input annotation is malformed.
    #[error(transparent)]
    Request(#[from] ProtocolError),
    /// The backend lists no booted deployment.
    #[error("rpm-ostree reports no booted deployment; refusing to stage on an unknown host")]
    NoBootedDeployment,
    /// Every allowed reboot into the request came up on another deployment.
    #[error(
        "the node was rebooted into {image} {attempts} time(s) and came up on another deployment \
         each time; not trying again until the request changes"
    )]
    AttemptsExhausted {
        /// The requested OS image.
        image: String,
        /// Reboots into it so far.
        attempts: u32,
    },
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is requested.
    Idle,
    /// The request is invalid or unsafe: report and change nothing.
    Refuse(Refusal),
    /// The booted deployment runs the desired image.
    Done {
        /// A reboot of streamd's got it there: clear the attempt record, post `Applied`.
        applied: bool,
    },
    /// A finalization was started in an earlier boot, but the node came up on something else:
    /// finalization failed or the node rolled back.
    RolledBack {
        /// Reboots into this request so far.
        attempts: u32,
        /// Whether another attempt is allowed.
        retry: bool,
    },
    /// A staged deployment of streamd's no longer matches the request: remove it first.
    CleanupStale,
    /// A staged deployment of streamd's that was never checked on disk (streamd or rpm-ostreed
    /// restarted before the check ended, the check failed and so did the removal, or rpm-ostree
    /// said the target was already staged): check it before anything else.
    Verify,
    /// Staged and locked; waiting for the cluster to approve `token`.
    AwaitApproval {
        /// The `reboot-requested` token.
        token: String,
    },
    /// Approved (or policy `immediate`): finalize the staged deployment and reboot.
    Reboot {
        /// The staged deployment's manifest digest (`FinalizeDeployment`'s checksum).
        digest: String,
        /// The attempt this reboot is (1-based).
        attempt: u32,
    },
    /// Finalization succeeded in this boot; the reboot is on its way.
    RebootPending,
    /// Staged under policy `never`: the next reboot, by whoever, applies it.
    AlreadyStaged,
    /// Stage this.
    Stage(StagePlan),
}

impl Decision {
    /// The state and reason to report for a decision that needs no action (`None` for one
    /// that acts); `staged` is the staged image the reason names.
    pub fn settled(&self, staged: &str) -> Option<(State, String)> {
        match self {
            Decision::Idle => Some((State::Idle, String::new())),
            Decision::Refuse(refusal) => Some((State::Refused, refusal.to_string())),
            Decision::Done { .. } => Some((State::Done, String::new())),
            // Only a locked stage waits for the approval (the planner removes an unlocked one).
            Decision::AwaitApproval { token } => Some((
                State::Staged,
                format!(
                    "staged {staged} (finalization-locked); waiting for reboot approval: set \
                     reboot-approved to {token}"
                ),
            )),
            Decision::AlreadyStaged => Some((
                State::Staged,
                "staged without a finalization lock (reboot = never): the next reboot applies it"
                    .into(),
            )),
            Decision::RebootPending => Some((
                State::Rebooting,
                "the staged deployment is finalized; waiting for the reboot".into(),
            )),
            Decision::RolledBack { .. }
            | Decision::Verify
            | Decision::CleanupStale
            | Decision::Reboot { .. }
            | Decision::Stage(_) => None,
        }
    }
}

/// The `reboot-requested` token for `desired` in the boot `boot_id`: the request, the boot and
/// the staging it is for (or, before a bootc staging, the approval ask), so an approval is never
/// replayed onto another boot, request or staging — not even after A → B → A in one boot. A
/// record of version 1 has no id: the token is then the request's and the boot's only.
pub fn reboot_token(desired: &Desired, boot_id: &str, record: &Record) -> String {
    let base = desired.reboot_token(boot_id);
    let hash = desired.observed_hash();
    let id = record
        .staged
        .as_ref()
        .filter(|s| s.request == hash)
        .and_then(|s| s.id.as_deref())
        .or_else(|| {
            record
                .approval
                .as_ref()
                .filter(|a| a.request == hash)
                .map(|a| a.id.as_str())
        });
    match id {
        Some(id) => format!("{base}.{id}"),
        None => base,
    }
}

/// Decides what to do.
pub fn decide(obs: &Observation<'_>) -> Decision {
    let life = &obs.lifecycle;
    let desired = match obs.desired {
        Err(e) => return Decision::Refuse(e.clone().into()),
        Ok(None) if obs.staged_is_ours() => return Decision::CleanupStale,
        Ok(None) => return Decision::Idle,
        Ok(Some(d)) => d,
    };
    let digest = desired.os_image.digest();
    let hash = desired.observed_hash();
    let Some(booted) = obs.booted() else {
        return Decision::Refuse(Refusal::NoBootedDeployment);
    };
    let attempt = life.record.attempt.as_ref().filter(|a| a.request == hash);
    if booted.carries_digest(digest) {
        // A stage of ours left from an earlier request must not wait for the next reboot.
        if obs.staged_is_ours() {
            return Decision::CleanupStale;
        }
        return Decision::Done {
            applied: attempt.is_some(),
        };
    }
    // An attempt finalized in an earlier boot that did not end on the target.
    if let Some(a) = attempt.filter(|a| a.boot_id != life.boot_id) {
        let retry = a.attempts < life.max_attempts;
        if a.reported_boot.as_deref() != Some(life.boot_id) {
            return Decision::RolledBack {
                attempts: a.attempts,
                retry,
            };
        }
        if !retry {
            return Decision::Refuse(Refusal::AttemptsExhausted {
                image: desired.os_image.to_string(),
                attempts: a.attempts,
            });
        }
    }
    let want_lock = life.policy != RebootPolicy::Never && life.locks;
    let this_boot = attempt.filter(|a| a.boot_id == life.boot_id);
    if this_boot.is_some()
        && want_lock
        && obs
            .staged()
            .is_some_and(|s| s.carries_digest(digest) && !s.finalization_locked)
    {
        return Decision::RebootPending;
    }
    let staged = match obs.staged() {
        Some(s)
            if s.carries_digest(digest)
                && s.finalization_locked == want_lock
                && obs.staged_is_ours() =>
        {
            s
        }
        // Ours, but for another request (or unlocked by hand while a lock is wanted): it must
        // not wait for a reboot that would apply the wrong thing.
        Some(_) if obs.staged_is_ours() => return Decision::CleanupStale,
        // Nothing staged, or a foreign deployment — even one carrying the desired image is
        // not adopted unchecked: the preflight's pending-deployment check decides whether it
        // may be replaced.
        _ => {
            let mut plan =
                StagePlan::rebase(&desired.stream, &desired.os_image, obs.allow_downgrade);
            plan.lock_finalization = want_lock;
            return Decision::Stage(plan);
        }
    };
    // Nothing is approved or finalized that was not checked on disk; without what to check it
    // against (a record of an older streamd) it is staged again.
    let ours = life.record.staged.as_ref();
    if ours.and_then(|o| o.verified.as_deref()) != Some(staged.checksum.as_str()) {
        return if ours.is_some_and(|o| o.expect.is_some()) {
            Decision::Verify
        } else {
            Decision::CleanupStale
        };
    }
    let staged_digest = staged
        .container_image_reference_digest
        .clone()
        .unwrap_or_else(|| digest.to_string());
    // A finalization started in this boot that left the deployment locked failed or was
    // interrupted: start it again as the same attempt, without a new approval.
    let next_attempt = match (this_boot, attempt) {
        (Some(a), _) => a.attempts,
        (None, Some(a)) => a.attempts + 1,
        (None, None) => 1,
    };
    match life.policy {
        RebootPolicy::Never => Decision::AlreadyStaged,
        RebootPolicy::Immediate => Decision::Reboot {
            digest: staged_digest,
            attempt: next_attempt,
        },
        RebootPolicy::OnApproval => {
            // Also a finalization interrupted in this boot is started again only on the
            // approval that still stands.
            let token = reboot_token(desired, life.boot_id, life.record);
            if life.approved == Some(token.as_str()) {
                Decision::Reboot {
                    digest: staged_digest,
                    attempt: next_attempt,
                }
            } else if !life.locks {
                // Unlocked (bootc): any reboot would apply it, so without the approval (it was
                // withdrawn) it must not stay.
                Decision::CleanupStale
            } else {
                Decision::AwaitApproval { token }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::backend::KernelVariant;
    use crate::backend::kernel::DEFAULT_KERNEL_PACKAGES;
    use crate::cluster::protocol::{DESIRED_OS_IMAGE, Inputs};
    use crate::host::attempt::{Attempt, Staged};

    const D9: &str = "sha256:9999999999999999999999999999999999999999999999999999999999999999";
    const D10: &str = "sha256:1010101010101010101010101010101010101010101010101010101010101010";
    const DX: &str = "sha256:abababababababababababababababababababababababababababababababab";

    fn dep(digest: &str, booted: bool, staged: bool) -> Deployment {
        Deployment {
            id: format!("rhcos-{digest}.0"),
            osname: "rhcos".into(),
            checksum: commit(digest),
            booted,
            staged,
            finalization_locked: staged,
            container_image_reference: Some(format!(
                "ostree-unverified-registry:quay.io/openshift/rhcos@{digest}"
            )),
            ..Deployment::default()
        }
    }

    /// The ostree commit of `digest`'s deployment.
    fn commit(digest: &str) -> String {
        format!("commit-{}", &digest[7..])
    }

    fn unlocked(mut d: Deployment) -> Deployment {
        d.finalization_locked = false;
        d
    }

    fn want(digest: &str) -> Result<Option<Desired>, ProtocolError> {
        Inputs {
            stream: Some("rhel-10".into()),
            os_image: Some(format!("quay.io/openshift/rhcos@{digest}")),
            ..Inputs::default()
        }
        .desired()
    }

    fn hash(digest: &str) -> String {
        match want(digest) {
            Ok(Some(d)) => d.observed_hash(),
            _ => panic!("valid"),
        }
    }

    /// The token of the staging `ours(digest)` records.
    fn token(digest: &str) -> String {
        match want(digest) {
            Ok(Some(d)) => reboot_token(&d, BOOT, &ours(digest)),
            _ => panic!("valid"),
        }
    }

    const BOOT: &str = "0123456789abcdef0123456789abcdef";
    const OLD_BOOT: &str = "fedcba9876543210fedcba9876543210";

    /// The record after staging `digest`.
    fn ours(digest: &str) -> Record {
        let mut r = unverified(digest);
        if let Some(s) = r.staged.as_mut() {
            s.verified = Some(commit(digest));
        }
        r
    }

    /// The record after staging `digest`, before the on-disk check passed.
    fn unverified(digest: &str) -> Record {
        Record {
            staged: Some(Staged {
                request: hash(digest),
                os_image: format!("quay.io/openshift/rhcos@{digest}"),
                id: Some(format!("id{}", &digest[7..17])),
                expect: Some(crate::host::verify::Expectation {
                    image_digest: digest.into(),
                    target_major: 10,
                    kernel: KernelVariant::Default,
                    fips: false,
                }),
                pinned: Some(digest.into()),
                verified: None,
            }),
            ..Record::default()
        }
    }

    /// The record after `attempts` finalizations of `digest`, the last one in `boot`.
    fn tried(digest: &str, attempts: u32, boot: &str, reported: Option<&str>) -> Record {
        Record {
            attempt: Some(Attempt {
                request: hash(digest),
                os_image: format!("quay.io/openshift/rhcos@{digest}"),
                digest: digest.into(),
                boot_id: boot.into(),
                attempts,
                reported_boot: reported.map(String::from),
                kernel: None,
                fips: None,
            }),
            ..ours(digest)
        }
    }

    struct Case {
        name: &'static str,
        desired: Result<Option<Desired>, ProtocolError>,
        deps: Vec<Deployment>,
        policy: RebootPolicy,
        record: Record,
        approved: Option<String>,
        locks: bool,
        expected: Decision,
    }

    fn case(
        name: &'static str,
        desired: Result<Option<Desired>, ProtocolError>,
        deps: Vec<Deployment>,
        expected: Decision,
    ) -> Case {
        Case {
            name,
            desired,
            deps,
            policy: RebootPolicy::OnApproval,
            record: Record::default(),
            approved: None,
            locks: true,
            expected,
        }
    }

    fn stage(d: &str, lock: bool) -> Decision {
        let Ok(Some(w)) = want(d) else {
            panic!("valid")
        };
        let mut plan = StagePlan::rebase(&w.stream, &w.os_image, false);
        plan.lock_finalization = lock;
        Decision::Stage(plan)
    }

    /// The reboot side the tests share: on-approval, two attempts, this boot, nothing approved.
    fn life(record: &Record) -> Lifecycle<'_> {
        Lifecycle {
            policy: RebootPolicy::OnApproval,
            max_attempts: 2,
            boot_id: BOOT,
            record,
            approved: None,
            locks: true,
        }
    }

    // a table test: one named row per decision case
    #[allow(clippy::too_many_lines)]
    #[test]
    fn decisions_by_table() {
        let invalid_error = ProtocolError {
            key: DESIRED_OS_IMAGE,
            problem: "bad".into(),
        };
        assert_eq!(
            Refusal::Request(invalid_error.clone()).to_string(),
            "annotation osstream.openshift.io/desired-os-image: bad",
            "a refused request reports the annotation error as it is"
        );
        let invalid: Result<Option<Desired>, ProtocolError> = Err(invalid_error.clone());
        let base = vec![dep(D9, true, false)];
        let staged10 = vec![dep(D10, false, true), dep(D9, true, false)];
        let reboot = |attempt| Decision::Reboot {
            digest: D10.into(),
            attempt,
        };
        let cases = vec![
            case("nothing requested", Ok(None), base.clone(), Decision::Idle),
            case(
                "invalid request",
                invalid,
                base.clone(),
                Decision::Refuse(Refusal::Request(invalid_error.clone())),
            ),
            case("fresh request", want(D10), base.clone(), stage(D10, true)),
            case(
                "booted already, never rebooted by us",
                want(D10),
                vec![dep(D10, true, false)],
                Decision::Done { applied: false },
            ),
            Case {
                record: tried(D10, 1, OLD_BOOT, None),
                ..case(
                    "booted after our reboot",
                    want(D10),
                    vec![dep(D10, true, false), dep(D9, false, false)],
                    Decision::Done { applied: true },
                )
            },
            Case {
                record: ours(D10),
                ..case(
                    "staged, waiting for approval",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: ours(D10),
                approved: Some(token(D10)),
                ..case("approved", want(D10), staged10.clone(), reboot(1))
            },
            Case {
                record: ours(D10),
                approved: Some(
                    want(D10)
                        .ok()
                        .flatten()
                        .map_or_else(String::new, |d| d.reboot_token(OLD_BOOT)),
                ),
                ..case(
                    "token of another boot never reboots",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: ours(D10),
                approved: Some(token(DX)),
                ..case(
                    "token of another request never reboots",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: ours(D10),
                policy: RebootPolicy::Immediate,
                ..case("immediate policy", want(D10), staged10.clone(), reboot(1))
            },
            Case {
                policy: RebootPolicy::Never,
                ..case(
                    "never policy stages unlocked",
                    want(D10),
                    base.clone(),
                    stage(D10, false),
                )
            },
            Case {
                record: ours(D10),
                policy: RebootPolicy::Never,
                ..case(
                    "never policy: staged is enough",
                    want(D10),
                    vec![unlocked(dep(D10, false, true)), dep(D9, true, false)],
                    Decision::AlreadyStaged,
                )
            },
            Case {
                record: tried(D10, 1, BOOT, None),
                approved: Some(token(D10)),
                ..case(
                    "finalize failed in this boot, approval stands: same attempt again",
                    want(D10),
                    staged10.clone(),
                    reboot(1),
                )
            },
            Case {
                record: tried(D10, 1, BOOT, None),
                ..case(
                    "finalize interrupted in this boot, approval withdrawn: ask again",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: ours(D10),
                approved: Some(format!(
                    "{}.0123456789ab",
                    match want(D10) {
                        Ok(Some(d)) => d.reboot_token(BOOT),
                        _ => panic!("valid"),
                    }
                )),
                ..case(
                    "approval of an earlier staging of the same request (A, B, A): ask again",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: tried(D10, 1, BOOT, None),
                ..case(
                    "finalized in this boot: the reboot is coming",
                    want(D10),
                    vec![unlocked(dep(D10, false, true)), dep(D9, true, false)],
                    Decision::RebootPending,
                )
            },
            Case {
                record: tried(D10, 1, OLD_BOOT, None),
                ..case(
                    "rolled back once",
                    want(D10),
                    base.clone(),
                    Decision::RolledBack {
                        attempts: 1,
                        retry: true,
                    },
                )
            },
            Case {
                record: tried(D10, 1, OLD_BOOT, Some(BOOT)),
                ..case(
                    "rollback reported: stage again",
                    want(D10),
                    base.clone(),
                    stage(D10, true),
                )
            },
            Case {
                record: tried(D10, 1, OLD_BOOT, Some(BOOT)),
                ..case(
                    "second attempt needs a new approval",
                    want(D10),
                    staged10.clone(),
                    Decision::AwaitApproval { token: token(D10) },
                )
            },
            Case {
                record: tried(D10, 1, OLD_BOOT, Some(BOOT)),
                approved: Some(token(D10)),
                ..case(
                    "second attempt approved",
                    want(D10),
                    staged10.clone(),
                    reboot(2),
                )
            },
            Case {
                record: tried(D10, 2, OLD_BOOT, None),
                ..case(
                    "rolled back at the limit",
                    want(D10),
                    base.clone(),
                    Decision::RolledBack {
                        attempts: 2,
                        retry: false,
                    },
                )
            },
            Case {
                record: tried(DX, 2, OLD_BOOT, Some(BOOT)),
                ..case(
                    "a new request starts from zero",
                    want(D10),
                    base.clone(),
                    stage(D10, true),
                )
            },
            Case {
                record: ours(D10),
                ..case(
                    "request removed after staging: clean up",
                    Ok(None),
                    staged10.clone(),
                    Decision::CleanupStale,
                )
            },
            Case {
                record: ours(D10),
                ..case(
                    "re-targeted to the booted image: our stage goes first",
                    want(D9),
                    staged10.clone(),
                    Decision::CleanupStale,
                )
            },
            case(
                "request removed, foreign staged: leave it",
                Ok(None),
                staged10.clone(),
                Decision::Idle,
            ),
            Case {
                record: ours(DX),
                ..case(
                    "ours for an older request: clean up first",
                    want(D10),
                    vec![dep(DX, false, true), dep(D9, true, false)],
                    Decision::CleanupStale,
                )
            },
            Case {
                record: ours(D10),
                ..case(
                    "ours but unlocked by hand: clean up, then restage locked",
                    want(D10),
                    vec![unlocked(dep(D10, false, true)), dep(D9, true, false)],
                    Decision::CleanupStale,
                )
            },
            Case {
                locks: false,
                ..case(
                    "bootc: stage unlocked",
                    want(D10),
                    base.clone(),
                    stage(D10, false),
                )
            },
            Case {
                locks: false,
                record: ours(D10),
                approved: Some(token(D10)),
                ..case(
                    "bootc: staged after approval, reboot",
                    want(D10),
                    vec![unlocked(dep(D10, false, true)), dep(D9, true, false)],
                    reboot(1),
                )
            },
            Case {
                locks: false,
                record: ours(D10),
                ..case(
                    "bootc: staged but the approval was withdrawn: an unlocked stage must not stay",
                    want(D10),
                    vec![unlocked(dep(D10, false, true)), dep(D9, true, false)],
                    Decision::CleanupStale,
                )
            },
            case(
                "foreign staged: preflight decides",
                want(D10),
                vec![dep(DX, false, true), dep(D9, true, false)],
                stage(D10, true),
            ),
            case(
                "foreign locked stage carrying the desired image: not adopted, preflight decides",
                want(D10),
                staged10.clone(),
                stage(D10, true),
            ),
            Case {
                record: unverified(D10),
                ..case(
                    "ours, never checked on disk (restart before the check ended, refs equal): check it",
                    want(D10),
                    staged10.clone(),
                    Decision::Verify,
                )
            },
            Case {
                record: unverified(D10),
                approved: Some(token(D10)),
                ..case(
                    "ours, approved, never checked on disk: check before finalizing",
                    want(D10),
                    staged10.clone(),
                    Decision::Verify,
                )
            },
            Case {
                record: unverified(D10),
                policy: RebootPolicy::Immediate,
                ..case(
                    "ours, reboot immediate, never checked on disk: check before finalizing",
                    want(D10),
                    staged10.clone(),
                    Decision::Verify,
                )
            },
            Case {
                record: {
                    let mut r = ours(D10);
                    if let Some(s) = r.staged.as_mut() {
                        s.verified = Some(commit(DX));
                    }
                    r
                },
                ..case(
                    "ours, but the check passed for another deployment: check this one",
                    want(D10),
                    staged10.clone(),
                    Decision::Verify,
                )
            },
            Case {
                record: {
                    let mut r = unverified(D10);
                    if let Some(s) = r.staged.as_mut() {
                        s.expect = None;
                    }
                    r
                },
                ..case(
                    "ours from an older streamd, nothing to check against: stage again",
                    want(D10),
                    staged10.clone(),
                    Decision::CleanupStale,
                )
            },
        ];
        for c in cases {
            let obs = Observation {
                desired: &c.desired,
                deployments: &c.deps,
                allow_downgrade: false,
                backend: BackendKind::RpmOstree,
                lifecycle: Lifecycle {
                    policy: c.policy,
                    approved: c.approved.as_deref(),
                    locks: c.locks,
                    ..life(&c.record)
                },
            };
            assert_eq!(decide(&obs), c.expected, "{}", c.name);
        }
    }

    /// On bootc, the booted image staged again (what streamd's cleanup leaves) is no one's
    /// stage to protect: a new request stages over it, after the approval since the stage
    /// cannot be held over it. On rpm-ostree it stays foreign; another image stays foreign.
    #[test]
    fn on_bootc_a_stage_of_the_booted_image_is_not_foreign() {
        let again = Deployment {
            id: format!("rhcos-{D9}.1"),
            ..unlocked(dep(D9, false, true))
        };
        let deps = vec![again, dep(D9, true, false)];
        let record = Record::default();
        assert!(foreign_staged(&deps, &record, BackendKind::Bootc).is_none());
        assert!(foreign_staged(&deps, &record, BackendKind::RpmOstree).is_some());
        let other = vec![unlocked(dep(DX, false, true)), dep(D9, true, false)];
        assert!(foreign_staged(&other, &record, BackendKind::Bootc).is_some());

        let desired = want(D10);
        let obs = Observation {
            desired: &desired,
            deployments: &deps,
            allow_downgrade: false,
            backend: BackendKind::Bootc,
            lifecycle: Lifecycle {
                locks: false,
                ..life(&record)
            },
        };
        assert!(obs.foreign_staged().is_none());
        assert!(
            matches!(decide(&obs), Decision::Stage(p) if !p.lock_finalization),
            "{:?}",
            decide(&obs)
        );
    }

    #[test]
    fn exhausted_attempts_are_refused_until_the_request_changes() {
        let desired = want(D10);
        let deps = vec![dep(D9, true, false)];
        let record = tried(D10, 2, OLD_BOOT, Some(BOOT));
        let obs = Observation {
            desired: &desired,
            deployments: &deps,
            allow_downgrade: false,
            backend: BackendKind::RpmOstree,
            lifecycle: life(&record),
        };
        assert!(matches!(
            decide(&obs),
            Decision::Refuse(r @ Refusal::AttemptsExhausted { attempts: 2, .. })
                if r.to_string().contains("2 time(s)")
        ));
    }

    #[test]
    fn the_downgrade_policy_reaches_the_plan() {
        let desired = want(D10);
        let deps = vec![dep(D9, true, false)];
        let record = Record::default();
        for allow in [false, true] {
            let obs = Observation {
                desired: &desired,
                deployments: &deps,
                allow_downgrade: allow,
                backend: BackendKind::RpmOstree,
                lifecycle: life(&record),
            };
            assert!(matches!(decide(&obs), Decision::Stage(p) if p.allow_downgrade == allow));
        }
    }

    #[test]
    fn no_booted_deployment_is_refused() {
        let desired = want(D10);
        let deps = vec![dep(D9, false, false)];
        let record = Record::default();
        let obs = Observation {
            desired: &desired,
            deployments: &deps,
            allow_downgrade: false,
            backend: BackendKind::RpmOstree,
            lifecycle: life(&record),
        };
        assert_eq!(decide(&obs), Decision::Refuse(Refusal::NoBootedDeployment));
    }

    #[test]
    fn carry_replaces_old_variant_and_layers() {
        let Ok(Some(w)) = want(D10) else {
            panic!("valid")
        };
        let rt_booted = Deployment {
            requested_base_removals: DEFAULT_KERNEL_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            requested_local_packages: vec![
                "kernel-rt-core-5.14.0-570.el9_6.x86_64".into(),
                "kernel-rt-modules-5.14.0-570.el9_6.x86_64".into(),
                "kernel-rt-modules-extra-5.14.0-570.el9_6.x86_64".into(),
            ],
            requested_packages: vec!["usbguard".into(), "other".into()],
            ..dep(D9, true, false)
        };
        let rpms = vec![
            PathBuf::from("/run/x/usbguard.rpm"),
            PathBuf::from("/run/x/kernel-rt-core.rpm"),
        ];
        let plan = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &rt_booted,
            KernelVariant::Realtime,
            &["usbguard".to_string()],
            &rpms,
        );
        assert_eq!(plan.uninstall.len(), 4, "{:?}", plan.uninstall);
        assert!(!plan.uninstall.contains(&"other".to_string()));
        assert!(
            plan.override_remove.is_empty(),
            "already removed in the origin"
        );
        assert_eq!(
            plan.local_rpms[0],
            PathBuf::from("/run/x/kernel-rt-core.rpm")
        );

        let fresh = Deployment {
            ..dep(D9, true, false)
        };
        let plan = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &fresh,
            KernelVariant::SixtyFourK,
            &[],
            &[],
        );
        assert_eq!(plan.override_remove.len(), 5);
        let plain = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
            &fresh,
            KernelVariant::Default,
            &[],
            &[],
        );
        assert!(plain.override_remove.is_empty() && plain.uninstall.is_empty());
    }

    #[test]
    fn settled_states() {
        let staged = "quay.io/o/r@sha256:10";
        let cases = [
            (Decision::Idle, Some((State::Idle, ""))),
            (Decision::Done { applied: true }, Some((State::Done, ""))),
            (
                Decision::AlreadyStaged,
                Some((
                    State::Staged,
                    "staged without a finalization lock (reboot = never): the next reboot applies it",
                )),
            ),
            (
                Decision::RebootPending,
                Some((
                    State::Rebooting,
                    "the staged deployment is finalized; waiting for the reboot",
                )),
            ),
            (
                Decision::AwaitApproval {
                    token: "t.1".into(),
                },
                Some((
                    State::Staged,
                    "staged quay.io/o/r@sha256:10 (finalization-locked); waiting for reboot \
                     approval: set reboot-approved to t.1",
                )),
            ),
            (
                Decision::Refuse(Refusal::NoBootedDeployment),
                Some((
                    State::Refused,
                    "rpm-ostree reports no booted deployment; refusing to stage on an unknown host",
                )),
            ),
            (Decision::Verify, None),
            (Decision::CleanupStale, None),
        ];
        for (decision, want) in cases {
            let want = want.map(|(s, r)| (s, r.to_string()));
            assert_eq!(decision.settled(staged), want, "{decision:?}");
        }
    }
}
