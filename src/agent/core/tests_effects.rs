//! The core's effects as a table (run by `tests.rs`'s `check`): what a reported state, a
//! reboot request and the end of a staging transaction lead to.

use super::tests::{Row, check, ended, in_staging, row, secs, with};
use super::*;
use crate::backend::KernelVariant;

fn reported(state: State, reason: &str, entered: bool, notice: Option<Notice>) -> Event {
    Event::Reported {
        state,
        reason: reason.into(),
        entered,
        notice,
    }
}

fn post(notice: Notice) -> Effect {
    Effect::PostEvent(notice)
}

/// What a set state or reboot request means for the outside: Events, publishing, flushing.
fn report_rows() -> Vec<Row> {
    [report_rows_1(), report_rows_2()]
        .into_iter()
        .flatten()
        .collect()
}

/// Rows of [`report_rows`], part 1 of 2.
fn report_rows_1() -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "entering Staged posts Staged and publishes",
            vec![(
                reported(State::Staged, "staged A", true, None),
                vec![
                    post(Notice::normal("Staged", "staged A".into())),
                    Effect::Publish,
                ],
            )],
            idle.clone(),
        ),
        row(
            "entering Staging posts StagingStarted",
            vec![(
                reported(State::Staging, "staging A", true, None),
                vec![
                    post(Notice::normal("StagingStarted", "staging A".into())),
                    Effect::Publish,
                ],
            )],
            idle.clone(),
        ),
        row(
            "entering Degraded posts a Failed warning",
            vec![(
                reported(State::Degraded, "staging failed: boom", true, None),
                vec![
                    post(Notice::warning("Failed", "staging failed: boom".into())),
                    Effect::Publish,
                ],
            )],
            idle.clone(),
        ),
        row(
            "entering Refused posts a PreflightFailed warning",
            vec![(
                reported(State::Refused, "preflight check x failed", true, None),
                vec![
                    post(Notice::warning(
                        "PreflightFailed",
                        "preflight check x failed".into(),
                    )),
                    Effect::Publish,
                ],
            )],
            idle.clone(),
        ),
        row(
            "a new reason in the same state is only published",
            vec![(
                reported(State::Staging, "staging A: 40%", false, None),
                vec![Effect::Publish],
            )],
            idle.clone(),
        ),
        row(
            "entering a state that has no Event only publishes",
            vec![(
                reported(State::Preflight, "running preflight checks", true, None),
                vec![Effect::Publish],
            )],
            idle.clone(),
        ),
        row(
            "an Event given replaces the state's own",
            vec![(
                reported(
                    State::Degraded,
                    "rolled back",
                    true,
                    Some(rollback_notice()),
                ),
                vec![post(rollback_notice()), Effect::Publish],
            )],
            idle.clone(),
        ),
        row(
            "an Event given is posted though the state stays",
            vec![(
                reported(
                    State::Degraded,
                    "rolled back",
                    false,
                    Some(rollback_notice()),
                ),
                vec![post(rollback_notice()), Effect::Publish],
            )],
            idle.clone(),
        ),
    ]
}

/// Rows of [`report_rows`], part 2 of 2.
fn report_rows_2() -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "finalizing: Rebooting is posted, published and patched at once",
            vec![(
                reported(
                    State::Rebooting,
                    "applying A",
                    true,
                    Some(Notice::normal("Rebooting", "applying A".into())),
                ),
                vec![
                    post(Notice::normal("Rebooting", "applying A".into())),
                    Effect::Publish,
                    Effect::Flush,
                ],
            )],
            idle.clone(),
        ),
        row(
            "a new reason while Rebooting is patched at once too",
            vec![(
                reported(State::Rebooting, "applying A again", false, None),
                vec![Effect::Publish, Effect::Flush],
            )],
            idle.clone(),
        ),
        row(
            "a new reboot token is asked for with RebootRequested",
            vec![(
                Event::RebootToken {
                    token: Some("t1".into()),
                    changed: true,
                },
                vec![
                    post(Notice::normal(
                        "RebootRequested",
                        "set reboot-approved to t1 to let the node reboot into the staged OS"
                            .into(),
                    )),
                    Effect::Publish,
                ],
            )],
            idle.clone(),
        ),
        row(
            "a withdrawn reboot request is only published",
            vec![(
                Event::RebootToken {
                    token: None,
                    changed: true,
                },
                vec![Effect::Publish],
            )],
            idle.clone(),
        ),
        row(
            "an unchanged reboot request does nothing",
            vec![(
                Event::RebootToken {
                    token: Some("t1".into()),
                    changed: false,
                },
                vec![],
            )],
            idle,
        ),
    ]
}

fn expect() -> (Expectation, String) {
    let e = Expectation {
        image_digest: "sha256:aa".into(),
        target_major: 10,
        kernel: KernelVariant::Default,
        fips: false,
    };
    (e, "sha256:bb".into())
}

/// A record whose failure is of `request`, with `pull_failures` and maybe given up.
fn failing(request: &str, pull_failures: u32, gave_up: Option<&str>) -> Record {
    Record {
        failure: Some(Failure {
            request: request.into(),
            pull_failures,
            gave_up: gave_up.map(String::from),
        }),
        ..Record::default()
    }
}

/// The staging transaction for "A" ended with `end`; the record read then is `record`.
fn staged(t0: Instant, end: StagingEnd, record: Option<Record>, verify: bool) -> Event {
    Event::StagingEnded(Box::new(StagingEnded {
        now: t0,
        request: "A".into(),
        current: true,
        end,
        record,
        expect: verify.then(expect),
        pull_retries: 2,
    }))
}

fn save(record: Record, failed: &'static str) -> Effect {
    Effect::SaveAttempt {
        record: Box::new(record),
        on_error: OnSaveError::Log(failed),
    }
}

fn remembered(record: Record) -> Effect {
    save(record, "remembering the staging failure failed")
}

fn degraded(reason: &str) -> Effect {
    Effect::SetState {
        state: State::Degraded,
        reason: reason.into(),
        notice: None,
    }
}

/// A transaction for "A" that ran and ended.
fn transaction(t0: Instant, more: Vec<(Event, Vec<Effect>)>) -> Vec<(Event, Vec<Effect>)> {
    with(with(in_staging(t0, "A"), vec![(ended(t0), vec![])]), more)
}

fn staging_rows(t0: Instant) -> Vec<Row> {
    [staging_rows_1(t0), staging_rows_2(t0), staging_rows_3(t0)]
        .into_iter()
        .flatten()
        .collect()
}

/// Rows of [`staging_rows`], part 1 of 3.
fn staging_rows_1(t0: Instant) -> Vec<Row> {
    let settling = Activity::Settling { again: false };
    vec![
        row(
            "staging finished: the earlier failure is forgotten and the stage checked on disk",
            transaction(
                t0,
                vec![(
                    staged(t0, StagingEnd::Staged, Some(failing("A", 1, None)), true),
                    vec![
                        save(Record::default(), "forgetting the staging failure failed"),
                        Effect::Verify {
                            request: "A".into(),
                            expect: Box::new(expect()),
                        },
                    ],
                )],
            ),
            settling.clone(),
        ),
        row(
            "staging finished with nothing to check or forget: decided again",
            transaction(
                t0,
                vec![(
                    staged(t0, StagingEnd::Staged, Some(Record::default()), false),
                    vec![Effect::Reconcile],
                )],
            ),
            settling.clone(),
        ),
        row(
            "a transaction for a request no longer wanted is history: decided again",
            transaction(
                t0,
                vec![(
                    Event::StagingEnded(Box::new(StagingEnded {
                        now: t0,
                        request: "A".into(),
                        current: false,
                        end: StagingEnd::Failed("boom".into()),
                        record: Some(Record::default()),
                        expect: None,
                        pull_retries: 2,
                    })),
                    vec![Effect::Reconcile],
                )],
            ),
            settling.clone(),
        ),
        Row {
            retry_in: Some(secs(1)),
            ..row(
                "staging that could not run now is retried on the transient back-off",
                transaction(
                    t0,
                    vec![(
                        staged(t0, StagingEnd::Transient("busy".into()), None, false),
                        vec![Effect::Retry {
                            retry: Retry::Transient,
                            reason: "busy".into(),
                            delay: secs(1),
                        }],
                    )],
                ),
                settling.clone(),
            )
        },
    ]
}

/// Rows of [`staging_rows`], part 2 of 3.
fn staging_rows_2(t0: Instant) -> Vec<Row> {
    let settling = Activity::Settling { again: false };
    let boom = &format!("staging failed: boom; {TRY_AGAIN}");
    vec![
        row(
            "staging failed: remembered, not retried, Degraded with a Failed warning, decided again (a stage it left is removed)",
            transaction(
                t0,
                vec![
                    (
                        staged(t0, StagingEnd::Failed("boom".into()), None, false),
                        vec![
                            remembered(failing("A", 0, Some(boom))),
                            degraded(boom),
                            Effect::Reconcile,
                        ],
                    ),
                    (
                        Event::Reported {
                            state: State::Degraded,
                            reason: boom.into(),
                            entered: true,
                            notice: None,
                        },
                        vec![
                            Effect::PostEvent(Notice::warning("Failed", boom.into())),
                            Effect::Publish,
                        ],
                    ),
                ],
            ),
            settling.clone(),
        ),
        row(
            "refs equal is taken as staged meanwhile once per request, then as a failure",
            vec![
                (
                    staged(t0, StagingEnd::RefsEqual("boom".into()), None, false),
                    vec![Effect::Reconcile],
                ),
                (
                    staged(t0, StagingEnd::RefsEqual("boom".into()), None, false),
                    vec![remembered(failing("A", 0, Some(boom))), degraded(boom)],
                ),
            ],
            Activity::Idle,
        ),
        Row {
            retry_in: Some(secs(20)),
            ..row(
                "a network failure is retried, spaced, while pull-retries last",
                vec![(
                    staged(
                        t0,
                        StagingEnd::Network("net".into()),
                        Some(failing("A", 1, None)),
                        false,
                    ),
                    vec![
                        remembered(failing("A", 2, None)),
                        Effect::Retry {
                            retry: Retry::Transient,
                            reason: "staging failed on the network (retry 2 of 2): net".into(),
                            delay: secs(20),
                        },
                    ],
                )],
                Activity::Idle,
            )
        },
        row(
            "past pull-retries a network failure gives up",
            vec![(
                staged(
                    t0,
                    StagingEnd::Network("net".into()),
                    Some(failing("A", 2, None)),
                    false,
                ),
                vec![
                    remembered(failing(
                        "A",
                        3,
                        Some(&format!(
                            "staging failed on the network 3 time(s), no retries left: net; {TRY_AGAIN}"
                        )),
                    )),
                    degraded(&format!(
                        "staging failed on the network 3 time(s), no retries left: net; {TRY_AGAIN}"
                    )),
                ],
            )],
            Activity::Idle,
        ),
    ]
}

/// Rows of [`staging_rows`], part 3 of 3.
fn staging_rows_3(t0: Instant) -> Vec<Row> {
    let boom = &format!("staging failed: boom; {TRY_AGAIN}");
    vec![
        Row {
            retry_in: Some(secs(10)),
            ..row(
                "another request's failure is started afresh",
                vec![(
                    staged(
                        t0,
                        StagingEnd::Network("net".into()),
                        Some(failing("B", 5, Some("gone"))),
                        false,
                    ),
                    vec![
                        remembered(failing("A", 1, None)),
                        Effect::Retry {
                            retry: Retry::Transient,
                            reason: "staging failed on the network (retry 1 of 2): net".into(),
                            delay: secs(10),
                        },
                    ],
                )],
                Activity::Idle,
            )
        },
        row(
            "an unreadable record: nothing is forgotten after a staging that finished",
            vec![(
                staged(t0, StagingEnd::Staged, None, false),
                vec![Effect::Reconcile],
            )],
            Activity::Idle,
        ),
        row(
            "a record that keeps the other fields keeps them when a failure is remembered",
            vec![(
                staged(
                    t0,
                    StagingEnd::Failed("boom".into()),
                    Some(Record {
                        version: 2,
                        ..Record::default()
                    }),
                    false,
                ),
                vec![
                    remembered(Record {
                        version: 2,
                        ..failing("A", 0, Some(boom))
                    }),
                    degraded(boom),
                    Effect::Reconcile,
                ],
            )],
            Activity::Idle,
        ),
    ]
}

/// A record with a staging of "A", checked on disk (`verified`) or not.
fn with_stage(verified: Option<&str>) -> Record {
    Record {
        staged: Some(crate::host::attempt::Staged {
            request: "A".into(),
            os_image: "quay.io/os@sha256:aa".into(),
            id: Some("id".into()),
            expect: Some(expect().0),
            pinned: None,
            verified: verified.map(String::from),
        }),
        ..Record::default()
    }
}

fn verify_rows() -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "a passed check is written to the record before deciding again",
            vec![(
                Event::Verified(Verified::Passed {
                    checksum: "c1".into(),
                    record: Box::new(with_stage(None)),
                }),
                vec![
                    Effect::SaveAttempt {
                        record: Box::new(with_stage(Some("c1"))),
                        on_error: OnSaveError::Degrade,
                    },
                    Effect::Reconcile,
                ],
            )],
            idle.clone(),
        ),
        row(
            "a check that did not pass is remembered like a failed staging and reported Degraded (issue 20 §7)",
            vec![(
                Event::Verified(Verified::Failed {
                    reason: "mismatch".into(),
                    record: Some(Box::new(with_stage(None))),
                }),
                vec![
                    Effect::SaveAttempt {
                        record: Box::new(Record {
                            failure: Some(crate::host::attempt::Failure {
                                request: "A".into(),
                                pull_failures: 0,
                                gave_up: Some(format!("mismatch; {TRY_AGAIN}")),
                            }),
                            ..with_stage(None)
                        }),
                        on_error: OnSaveError::Log("remembering the staging failure failed"),
                    },
                    degraded(&format!("mismatch; {TRY_AGAIN}")),
                ],
            )],
            idle.clone(),
        ),
        row(
            "a check that did not pass, with a record that cannot be read, is reported Degraded",
            vec![(
                Event::Verified(Verified::Failed {
                    reason: "mismatch".into(),
                    record: None,
                }),
                vec![degraded("mismatch")],
            )],
            idle.clone(),
        ),
        row(
            "a record that cannot be read after a passed check is reported Degraded",
            vec![(
                Event::Verified(Verified::Unrecorded("unreadable".into())),
                vec![degraded("unreadable")],
            )],
            idle,
        ),
    ]
}

/// A record of one finalization of "A" in boot `b0`, reported in `reported`.
fn attempted(reported: Option<&str>) -> Record {
    Record {
        attempt: Some(crate::host::attempt::Attempt {
            request: "A".into(),
            os_image: "quay.io/os@sha256:aa".into(),
            digest: "sha256:aa".into(),
            boot_id: "b0".into(),
            attempts: 1,
            reported_boot: reported.map(String::from),
            kernel: None,
            fips: None,
        }),
        ..with_stage(Some("c1"))
    }
}

fn rolled_back(t0: Instant, retry: bool) -> Event {
    Event::RolledBack(Box::new(RolledBack {
        now: t0,
        record: attempted(None),
        boot_id: "b1".into(),
        reason: "came up on the old image".into(),
        retry,
    }))
}

/// A finalization refused by rpm-ostreed (an inhibitor), and what follows: the record is
/// restored and the finalization asked again after `delay`.
fn refused(t0: Instant, delay: Duration) -> (Event, Vec<Effect>) {
    (
        Event::FinalizeFailed {
            now: t0,
            record: Box::new(with_stage(Some("c1"))),
            recheck: false,
            transient: false,
            reason: "the reboot is blocked: inhibited".into(),
        },
        vec![
            Effect::SaveAttempt {
                record: Box::new(with_stage(Some("c1"))),
                on_error: OnSaveError::Log("restoring the attempt record failed"),
            },
            Effect::Retry {
                retry: Retry::Finalize,
                reason: "the reboot is blocked: inhibited".into(),
                delay,
            },
        ],
    )
}

/// The Event of a rollback.
fn rollback_notice() -> Notice {
    Notice::warning("RolledBack", "came up on the old image".into())
}

/// Writes `record`; a failed write reports `Degraded`.
fn saved(record: Record) -> Effect {
    Effect::SaveAttempt {
        record: Box::new(record),
        on_error: OnSaveError::Degrade,
    }
}

/// What a removed stale stage, a rollback, a booted target and a refused finalization lead
/// to: the record first, what follows only once it is written (or, logged, whatever happens).
fn record_first_rows(t0: Instant) -> Vec<Row> {
    [
        record_first_rows_1(t0),
        record_first_rows_2(),
        record_first_rows_3(t0),
        record_first_rows_4(t0),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Rows of [`record_first_rows`], part 1 of 4.
fn record_first_rows_1(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        Row {
            retry_in: Some(secs(0)),
            ..row(
                "a removed stale stage leaves the record, then is decided on at once",
                vec![
                    (
                        Event::StaleRemoved {
                            now: t0,
                            record: Box::new(with_stage(Some("c1"))),
                        },
                        vec![
                            saved(Record::default()),
                            Effect::Then(Box::new(Event::Recovered(Retry::Transient))),
                            Effect::Then(Box::new(Event::RetryAt(t0))),
                        ],
                    ),
                    (Event::Recovered(Retry::Transient), vec![]),
                    (Event::RetryAt(t0), vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(MIN_BACKOFF),
            ..row(
                "a rollback within the bound is recorded for this boot, reported, tried again soon",
                vec![
                    (
                        rolled_back(t0, true),
                        vec![
                            saved(attempted(Some("b1"))),
                            Effect::SetState {
                                state: State::Degraded,
                                reason: "came up on the old image; trying again".into(),
                                notice: Some(rollback_notice()),
                            },
                            Effect::Then(Box::new(Event::RetryAt(t0 + MIN_BACKOFF))),
                        ],
                    ),
                    (
                        Event::Reported {
                            state: State::Degraded,
                            reason: "came up on the old image; trying again".into(),
                            entered: true,
                            notice: Some(rollback_notice()),
                        },
                        vec![Effect::PostEvent(rollback_notice()), Effect::Publish],
                    ),
                    (Event::RetryAt(t0 + MIN_BACKOFF), vec![]),
                ],
                idle.clone(),
            )
        },
    ]
}

/// Rows of [`record_first_rows`], part 2 of 4.
fn record_first_rows_2() -> Vec<Row> {
    vec![row(
        "finalizing: the attempt is written, counted, Rebooting patched at once, then applied",
        vec![
            (
                Event::Finalizing(Box::new(Finalizing {
                    request: "A".into(),
                    before: with_stage(Some("c1")),
                    attempted: attempted(None),
                    digest: "sha256:aa".into(),
                    attempt: 1,
                    reason: "applying A".into(),
                })),
                vec![
                    saved(attempted(None)),
                    Effect::SetAttempts(1),
                    Effect::SetState {
                        state: State::Rebooting,
                        reason: "applying A".into(),
                        notice: Some(Notice::normal("Rebooting", "applying A".into())),
                    },
                    Effect::Apply {
                        request: "A".into(),
                        digest: "sha256:aa".into(),
                        attempt: 1,
                        before: Box::new(with_stage(Some("c1"))),
                    },
                ],
            ),
            (
                Event::Reported {
                    state: State::Rebooting,
                    reason: "applying A".into(),
                    entered: true,
                    notice: Some(Notice::normal("Rebooting", "applying A".into())),
                },
                vec![
                    Effect::PostEvent(Notice::normal("Rebooting", "applying A".into())),
                    Effect::Publish,
                    Effect::Flush,
                ],
            ),
            (
                Event::Started(Step::Apply {
                    request: "A".into(),
                }),
                vec![],
            ),
        ],
        Activity::Running {
            step: Step::Apply {
                request: "A".into(),
            },
            again: false,
        },
    )]
}

/// Rows of [`record_first_rows`], part 3 of 4.
fn record_first_rows_3(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "the target booted: the record forgets the attempt, Done with Applied",
            vec![(
                Event::Booted {
                    record: Box::new(Record {
                        version: 2,
                        ..attempted(Some("b1"))
                    }),
                    image: "quay.io/os@sha256:aa".into(),
                },
                vec![
                    Effect::SaveAttempt {
                        record: Box::new(Record {
                            version: 2,
                            ..Record::default()
                        }),
                        on_error: OnSaveError::Log("clearing the attempt record failed"),
                    },
                    Effect::SetState {
                        state: State::Done,
                        reason: String::new(),
                        notice: Some(Notice::normal(
                            "Applied",
                            "booted quay.io/os@sha256:aa".into(),
                        )),
                    },
                ],
            )],
            idle.clone(),
        ),
        Row {
            retry_in: Some(secs(120)),
            ..row(
                "a refused finalization restores the record and is asked again after minutes, doubling (issue 20 §7: not every minute)",
                vec![refused(t0, secs(60)), refused(t0, secs(120))],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(secs(60)),
            ..row(
                "a finalization that went through resets its back-off",
                vec![
                    refused(t0, secs(60)),
                    (Event::Recovered(Retry::Finalize), vec![]),
                    refused(t0, secs(60)),
                ],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(secs(1)),
            ..row(
                "a finalization the daemon could not be asked for (busy) is tried again soon",
                vec![(
                    Event::FinalizeFailed {
                        now: t0,
                        record: Box::new(with_stage(Some("c1"))),
                        recheck: false,
                        transient: true,
                        reason: "Transaction in progress".into(),
                    },
                    vec![
                        Effect::SaveAttempt {
                            record: Box::new(with_stage(Some("c1"))),
                            on_error: OnSaveError::Log("restoring the attempt record failed"),
                        },
                        Effect::Retry {
                            retry: Retry::Transient,
                            reason: "Transaction in progress".into(),
                            delay: secs(1),
                        },
                    ],
                )],
                idle.clone(),
            )
        },
    ]
}

/// Rows of [`record_first_rows`], part 4 of 4.
fn record_first_rows_4(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        Row {
            retry_in: Some(secs(1)),
            ..row(
                "finalization refused for another staged deployment: the stage is checked again",
                vec![(
                    Event::FinalizeFailed {
                        now: t0,
                        record: Box::new(with_stage(Some("c1"))),
                        recheck: true,
                        transient: false,
                        reason: "mismatch".into(),
                    },
                    vec![
                        Effect::SaveAttempt {
                            record: Box::new(with_stage(None)),
                            on_error: OnSaveError::Log("restoring the attempt record failed"),
                        },
                        Effect::Retry {
                            retry: Retry::Transient,
                            reason: "mismatch".into(),
                            delay: secs(1),
                        },
                    ],
                )],
                idle.clone(),
            )
        },
        row(
            "a rollback past the bound is recorded and refused until the request changes",
            vec![(
                rolled_back(t0, false),
                vec![
                    saved(attempted(Some("b1"))),
                    Effect::SetState {
                        state: State::Refused,
                        reason: format!(
                            "came up on the old image; giving up until the request changes; {TRY_AGAIN}"
                        ),
                        notice: Some(rollback_notice()),
                    },
                ],
            )],
            idle,
        ),
    ]
}

/// Staging a plan that passed preflight: the record names it first, then the transaction starts.
fn staging_ready_rows() -> Vec<Row> {
    let image = format!("quay.io/os@sha256:{}", "a".repeat(64));
    let image: crate::image::reference::ImageRef = image.parse().expect("a valid reference");
    let plan = StagePlan::rebase("rhel-10", &image, false);
    vec![row(
        "a plan that passed preflight is remembered, then staged",
        vec![(
            Event::StagingReady(Box::new(StagingReady {
                request: "A".into(),
                plan: plan.clone(),
                expect: Some(expect()),
                record: with_stage(None),
            })),
            vec![
                Effect::SaveAttempt {
                    record: Box::new(with_stage(None)),
                    on_error: OnSaveError::Degrade,
                },
                Effect::Stage {
                    request: "A".into(),
                    plan: Box::new(plan),
                    expect: Some(Box::new(expect())),
                },
            ],
        )],
        Activity::Idle,
    )]
}

#[test]
fn staging_ready_by_table() {
    check(Instant::now(), staging_ready_rows());
}

#[test]
fn record_first_by_table() {
    let t0 = Instant::now();
    check(t0, record_first_rows(t0));
}

#[test]
fn verify_ends_by_table() {
    check(Instant::now(), verify_rows());
}

#[test]
fn staging_ends_by_table() {
    let t0 = Instant::now();
    check(t0, staging_rows(t0));
}

#[test]
fn reporting_by_table() {
    check(Instant::now(), report_rows());
}
