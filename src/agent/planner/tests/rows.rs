//! The decision table's rows, one named row per case, grouped by what they exercise.

use super::*;

/// Every row, in the order the groups list them.
pub(super) fn rows() -> Vec<Case> {
    [
        request_rows(),
        approval_rows(),
        finalization_rows(),
        rollback_rows(),
        cleanup_rows(),
        bootc_and_foreign_rows(),
        verification_rows(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Nothing requested, an invalid request, a fresh one, one the node already runs.
fn request_rows() -> Vec<Case> {
    vec![
        case("nothing requested", Ok(None), base(), Decision::Idle),
        case(
            "invalid request",
            Err(invalid_error()),
            base(),
            Decision::Refuse(Refusal::Request(invalid_error())),
        ),
        case("fresh request", want(D10), base(), stage(D10, true)),
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
    ]
}

/// A stage waiting for its approval, and the reboot policies.
fn approval_rows() -> Vec<Case> {
    vec![
        Case {
            record: ours(D10),
            ..case(
                "staged, waiting for approval",
                want(D10),
                staged10(),
                Decision::AwaitApproval { token: token(D10) },
            )
        },
        Case {
            record: ours(D10),
            approved: Some(token(D10)),
            ..case("approved", want(D10), staged10(), reboot(1))
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
                staged10(),
                Decision::AwaitApproval { token: token(D10) },
            )
        },
        Case {
            record: ours(D10),
            approved: Some(token(DX)),
            ..case(
                "token of another request never reboots",
                want(D10),
                staged10(),
                Decision::AwaitApproval { token: token(D10) },
            )
        },
        Case {
            record: ours(D10),
            policy: RebootPolicy::Immediate,
            ..case("immediate policy", want(D10), staged10(), reboot(1))
        },
        Case {
            policy: RebootPolicy::Never,
            ..case(
                "never policy stages unlocked",
                want(D10),
                base(),
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
    ]
}

/// A finalization started in this boot: failed, interrupted or done.
fn finalization_rows() -> Vec<Case> {
    vec![
        Case {
            record: tried(D10, 1, BOOT, None),
            approved: Some(token(D10)),
            ..case(
                "finalize failed in this boot, approval stands: same attempt again",
                want(D10),
                staged10(),
                reboot(1),
            )
        },
        Case {
            record: tried(D10, 1, BOOT, None),
            ..case(
                "finalize interrupted in this boot, approval withdrawn: ask again",
                want(D10),
                staged10(),
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
                staged10(),
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
    ]
}

/// Reboots that came up on another deployment, and the attempt limit.
fn rollback_rows() -> Vec<Case> {
    vec![
        Case {
            record: tried(D10, 1, OLD_BOOT, None),
            ..case(
                "rolled back once",
                want(D10),
                base(),
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
                base(),
                stage(D10, true),
            )
        },
        Case {
            record: tried(D10, 1, OLD_BOOT, Some(BOOT)),
            ..case(
                "second attempt needs a new approval",
                want(D10),
                staged10(),
                Decision::AwaitApproval { token: token(D10) },
            )
        },
        Case {
            record: tried(D10, 1, OLD_BOOT, Some(BOOT)),
            approved: Some(token(D10)),
            ..case("second attempt approved", want(D10), staged10(), reboot(2))
        },
        Case {
            record: tried(D10, 2, OLD_BOOT, None),
            ..case(
                "rolled back at the limit",
                want(D10),
                base(),
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
                base(),
                stage(D10, true),
            )
        },
    ]
}

/// A stage of ours that no longer fits the request, and one of someone else's.
fn cleanup_rows() -> Vec<Case> {
    vec![
        Case {
            record: ours(D10),
            ..case(
                "request removed after staging: clean up",
                Ok(None),
                staged10(),
                Decision::CleanupStale,
            )
        },
        Case {
            record: ours(D10),
            ..case(
                "re-targeted to the booted image: our stage goes first",
                want(D9),
                staged10(),
                Decision::CleanupStale,
            )
        },
        case(
            "request removed, foreign staged: leave it",
            Ok(None),
            staged10(),
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
    ]
}

/// bootc, whose stage is not locked, and foreign stages, which preflight judges.
fn bootc_and_foreign_rows() -> Vec<Case> {
    vec![
        Case {
            locks: false,
            ..case(
                "bootc: stage unlocked",
                want(D10),
                base(),
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
            staged10(),
            stage(D10, true),
        ),
    ]
}

/// A stage of ours not (or not yet) checked on disk.
fn verification_rows() -> Vec<Case> {
    vec![
        Case {
            record: unverified(D10),
            ..case(
                "ours, never checked on disk (restart before the check ended, refs equal): check it",
                want(D10),
                staged10(),
                Decision::Verify,
            )
        },
        Case {
            record: unverified(D10),
            approved: Some(token(D10)),
            ..case(
                "ours, approved, never checked on disk: check before finalizing",
                want(D10),
                staged10(),
                Decision::Verify,
            )
        },
        Case {
            record: unverified(D10),
            policy: RebootPolicy::Immediate,
            ..case(
                "ours, reboot immediate, never checked on disk: check before finalizing",
                want(D10),
                staged10(),
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
                staged10(),
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
                staged10(),
                Decision::CleanupStale,
            )
        },
    ]
}
