//! The planner's tests: the decision table (its rows in `rows.rs`) and the rules around it.

mod rows;

use std::path::PathBuf;

use super::*;
use crate::backend::kernel::DEFAULT_KERNEL_PACKAGES;
use crate::backend::{BackendKind, Deployment, KernelVariant, StagePlan};
use crate::cluster::protocol::{DESIRED_OS_IMAGE, Desired, Inputs, ProtocolError, State};
use crate::config::RebootPolicy;
use crate::host::attempt::{Attempt, Record, Staged};

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

/// An annotation error: what an invalid request is refused with.
fn invalid_error() -> ProtocolError {
    ProtocolError {
        key: DESIRED_OS_IMAGE,
        problem: "bad".into(),
    }
}

/// The node on rhel-9, nothing staged.
fn base() -> Vec<Deployment> {
    vec![dep(D9, true, false)]
}

/// The node on rhel-9 with rhel-10 staged (and locked).
fn staged10() -> Vec<Deployment> {
    vec![dep(D10, false, true), dep(D9, true, false)]
}

/// Finalize the rhel-10 stage and reboot, as attempt `attempt`.
fn reboot(attempt: u32) -> Decision {
    Decision::Reboot {
        digest: D10.into(),
        attempt,
    }
}

#[test]
fn a_refused_request_reports_the_annotation_error_as_it_is() {
    assert_eq!(
        Refusal::Request(invalid_error()).to_string(),
        "annotation osstream.openshift.io/desired-os-image: bad"
    );
}

/// Every row of the decision table ([`rows::rows`]) decides as it says; no two share a name.
#[test]
fn decisions_by_table() {
    let rows = rows::rows();
    let names: std::collections::BTreeSet<&str> = rows.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), rows.len(), "row names are unique");
    for c in &rows {
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
        None,
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
        None,
    );
    assert_eq!(plan.override_remove.len(), 5);
    // A target base known to lack kernel-modules-extra (its layers list its packages): the
    // removal of a name it lacks would fail the transaction after the pull.
    let base: std::collections::BTreeSet<String> = [
        "kernel",
        "kernel-core",
        "kernel-modules",
        "kernel-modules-core",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let plan = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
        &fresh,
        KernelVariant::SixtyFourK,
        &[],
        &[],
        Some(&base),
    );
    assert!(
        !plan
            .override_remove
            .contains(&"kernel-modules-extra".to_string()),
        "{:?}",
        plan.override_remove
    );
    assert_eq!(plan.override_remove.len(), 4);
    let plain = StagePlan::rebase(&w.stream, &w.os_image, false).carry(
        &fresh,
        KernelVariant::Default,
        &[],
        &[],
        None,
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
