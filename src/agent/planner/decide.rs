//! The decision: from what the agent observed to what to do.

use super::{Decision, Lifecycle, Observation, Refusal};
use crate::backend::{Deployment, StagePlan};
use crate::cluster::protocol::Desired;
use crate::config::RebootPolicy;
use crate::host::attempt::{Attempt, Record};

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
    with_stage(life, desired, staged, attempt, this_boot)
}

/// What to do with the stage of ours that carries the request, `staged`: nothing is applied
/// before it is checked on disk, then the reboot policy says. `attempt` is the request's
/// attempt record, `this_boot` the same when it was finalized in this boot.
fn with_stage(
    life: &Lifecycle<'_>,
    desired: &Desired,
    staged: &Deployment,
    attempt: Option<&Attempt>,
    this_boot: Option<&Attempt>,
) -> Decision {
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
        .unwrap_or_else(|| desired.os_image.digest().to_string());
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
