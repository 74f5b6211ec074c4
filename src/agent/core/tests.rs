//! The core as a table: named rows, each a sequence of events with the exact effects each
//! returns, and the activity and timers at the end.

use super::*;

/// One scenario.
pub(super) struct Row {
    pub(super) name: &'static str,
    /// Each event and the effects it must return.
    pub(super) steps: Vec<(Event, Vec<Effect>)>,
    /// The activity after the last event.
    pub(super) activity: Activity,
    /// The retry timer after the last event, from `t0`.
    pub(super) retry_in: Option<Duration>,
    /// The readiness timer after the last event, from `t0`.
    pub(super) readiness_in: Option<Duration>,
    /// The status patch's retry timer after the last event, from `t0`.
    pub(super) patch_in: Option<Duration>,
    /// The credentials timer after the last event, from `t0` (`None`: at once).
    pub(super) credentials_in: Option<Duration>,
}

pub(super) fn row(name: &'static str, steps: Vec<(Event, Vec<Effect>)>, activity: Activity) -> Row {
    Row {
        name,
        steps,
        activity,
        retry_in: None,
        readiness_in: None,
        patch_in: None,
        credentials_in: None,
    }
}

/// A failed status patch: `status` 0 for one that may succeed later (no `Retry-After`), else
/// the status the API server rejected it with.
fn patch_failed(t0: Instant, status: u16) -> Event {
    Event::PatchFailed {
        now: t0,
        failure: PatchFailure {
            transient: status == 0,
            retry_after: None,
            unauthorized: status == 401,
        },
        jitter: 0.0,
    }
}

fn credentials(t0: Instant, client: bool, new: bool) -> Event {
    Event::CredentialsLoaded {
        now: t0,
        client,
        new,
    }
}

pub(super) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(super) fn reconcile(t0: Instant, request: &str) -> Event {
    Event::Reconcile {
        now: t0,
        request: Some(request.into()),
    }
}

pub(super) fn ended(t0: Instant) -> Event {
    Event::Ended {
        now: t0,
        failed: None,
    }
}

fn preflight(request: &str) -> Step {
    Step::Preflight {
        request: request.into(),
    }
}

fn staging(request: &str) -> Step {
    Step::Staging {
        request: request.into(),
    }
}

pub(super) fn running(step: Step, again: bool) -> Activity {
    Activity::Running { step, again }
}

fn failed(t0: Instant, retry: Retry, jitter: f64) -> Event {
    Event::Failed {
        now: t0,
        retry,
        reason: "reading deployments: boom".into(),
        jitter,
    }
}

fn retry(retry: Retry, delay: Duration) -> Vec<Effect> {
    vec![Effect::Retry {
        retry,
        reason: "reading deployments: boom".into(),
        delay,
    }]
}

/// A request whose deployments were read and whose preflight now runs.
fn in_preflight(t0: Instant, request: &str) -> Vec<(Event, Vec<Effect>)> {
    vec![
        (reconcile(t0, request), vec![Effect::Observe]),
        (ended(t0), vec![]),
        (Event::Started(preflight(request)), vec![]),
        (Event::Settled, vec![]),
    ]
}

/// `in_preflight`, then the preflight passed and the transaction runs.
pub(super) fn in_staging(t0: Instant, request: &str) -> Vec<(Event, Vec<Effect>)> {
    let mut steps = in_preflight(t0, request);
    steps.extend([
        (ended(t0), vec![]),
        (Event::Started(staging(request)), vec![]),
        (Event::Settled, vec![]),
    ]);
    steps
}

pub(super) fn with(
    mut steps: Vec<(Event, Vec<Effect>)>,
    more: Vec<(Event, Vec<Effect>)>,
) -> Vec<(Event, Vec<Effect>)> {
    steps.extend(more);
    steps
}

fn rows(t0: Instant) -> Vec<Row> {
    [rows_1(t0), rows_2(t0), rows_3(t0), rows_4(t0)]
        .into_iter()
        .flatten()
        .collect()
}

/// Rows of [`rows`], part 1 of 4.
fn rows_1(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "a request arrives: the deployments are read",
            vec![(reconcile(t0, "A"), vec![Effect::Observe])],
            running(Step::Observe, false),
        ),
        row(
            "the decision starts preflight",
            in_preflight(t0, "A"),
            running(preflight("A"), false),
        ),
        row(
            "preflight passes: the transaction starts",
            in_staging(t0, "A"),
            running(staging("A"), false),
        ),
        row(
            "a second request while the deployments are read: decided again once done",
            vec![
                (reconcile(t0, "A"), vec![Effect::Observe]),
                (reconcile(t0, "B"), vec![]),
                (ended(t0), vec![]),
                (Event::Settled, vec![Effect::Reconcile]),
                (reconcile(t0, "B"), vec![Effect::Observe]),
            ],
            running(Step::Observe, false),
        ),
        row(
            "a reconcile asked for during a step is carried through the next one",
            with(
                in_preflight(t0, "A"),
                vec![
                    (reconcile(t0, "A"), vec![]),
                    (ended(t0), vec![]),
                    (
                        Event::Started(Step::Verify {
                            request: "A".into(),
                        }),
                        vec![],
                    ),
                    (Event::Settled, vec![]),
                    (ended(t0), vec![]),
                    (Event::Settled, vec![Effect::Reconcile]),
                ],
            ),
            idle.clone(),
        ),
        row(
            "a new request drops the preflight of the old one",
            with(
                in_preflight(t0, "A"),
                vec![(reconcile(t0, "B"), vec![Effect::Abort, Effect::Observe])],
            ),
            running(Step::Observe, false),
        ),
        row(
            "any request drops the readiness checks",
            vec![
                (Event::Started(Step::Readiness), vec![]),
                (reconcile(t0, "A"), vec![Effect::Abort, Effect::Observe]),
            ],
            running(Step::Observe, false),
        ),
        row(
            "the same request during its transaction changes nothing",
            with(in_staging(t0, "A"), vec![(reconcile(t0, "A"), vec![])]),
            running(staging("A"), false),
        ),
        row(
            "another request during a transaction cancels it",
            with(
                in_staging(t0, "A"),
                vec![(
                    reconcile(t0, "B"),
                    vec![Effect::CancelStaging, Effect::Publish],
                )],
            ),
            running(staging("A"), false),
        ),
    ]
}

/// Rows of [`rows`], part 2 of 4.
fn rows_2(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "a transaction does not carry a reconcile asked for before it",
            with(
                in_preflight(t0, "A"),
                vec![
                    (reconcile(t0, "A"), vec![]),
                    (ended(t0), vec![]),
                    (Event::Started(staging("A")), vec![]),
                    (Event::Settled, vec![]),
                    (ended(t0), vec![]),
                    (Event::Settled, vec![]),
                ],
            ),
            idle.clone(),
        ),
        Row {
            retry_in: Some(secs(1)),
            ..row(
                "a task that failed is retried after the transient back-off",
                vec![
                    (reconcile(t0, "A"), vec![Effect::Observe]),
                    (
                        Event::Ended {
                            now: t0,
                            failed: Some("reading deployments: boom".into()),
                        },
                        retry(Retry::Transient, secs(1)),
                    ),
                    (Event::Settled, vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(secs(1)),
            ..row(
                "transient failures double the wait until one succeeds",
                vec![
                    (
                        failed(t0, Retry::Transient, 0.0),
                        retry(Retry::Transient, secs(1)),
                    ),
                    (
                        failed(t0, Retry::Transient, 0.0),
                        retry(Retry::Transient, secs(2)),
                    ),
                    (
                        failed(t0, Retry::Transient, 0.0),
                        retry(Retry::Transient, secs(4)),
                    ),
                    (Event::Recovered(Retry::Transient), vec![]),
                    (
                        failed(t0, Retry::Transient, 0.0),
                        retry(Retry::Transient, secs(1)),
                    ),
                ],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(Duration::from_millis(22_500)),
            ..row(
                "a registry failure waits 10 s doubling, jittered, apart from the transient back-off",
                vec![
                    (
                        failed(t0, Retry::Registry, 0.5),
                        retry(Retry::Registry, Duration::from_millis(11_250)),
                    ),
                    (
                        failed(t0, Retry::Registry, 0.5),
                        retry(Retry::Registry, Duration::from_millis(22_500)),
                    ),
                ],
                idle.clone(),
            )
        },
        row(
            "the retry timer reconciles",
            vec![
                (Event::RetryAt(t0 + secs(1)), vec![]),
                (Event::RetryDue, vec![Effect::Reconcile]),
            ],
            idle.clone(),
        ),
    ]
}

/// Rows of [`rows`], part 3 of 4.
fn rows_3(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        row(
            "approval: finalizing, a reconcile meanwhile runs after it",
            vec![
                (reconcile(t0, "A"), vec![Effect::Observe]),
                (ended(t0), vec![]),
                (
                    Event::Started(Step::Apply {
                        request: "A".into(),
                    }),
                    vec![],
                ),
                (Event::Settled, vec![]),
                (reconcile(t0, "A"), vec![]),
            ],
            running(
                Step::Apply {
                    request: "A".into(),
                },
                true,
            ),
        ),
        row(
            "readiness mode holds the request: its transaction is cancelled",
            with(
                in_staging(t0, "A"),
                vec![(Event::Hold, vec![Effect::CancelStaging])],
            ),
            running(staging("A"), false),
        ),
        row(
            "a step whose request changed meanwhile decides again once settled",
            vec![
                (
                    Event::Started(Step::Cleanup {
                        request: Some("A".into()),
                    }),
                    vec![],
                ),
                (ended(t0), vec![]),
                (Event::DecideAgain, vec![]),
                (Event::Settled, vec![Effect::Reconcile]),
            ],
            idle.clone(),
        ),
        row(
            "holding with nothing staging does nothing",
            vec![(Event::Hold, vec![])],
            idle.clone(),
        ),
        Row {
            retry_in: Some(secs(0)),
            ..row(
                "a removed stale stage is decided on at once",
                vec![
                    (Event::Started(Step::Cleanup { request: None }), vec![]),
                    (ended(t0), vec![]),
                    (Event::Recovered(Retry::Transient), vec![]),
                    (Event::RetryAt(t0), vec![]),
                    (Event::Settled, vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            retry_in: Some(secs(30)),
            ..row(
                "a digest refresh waits for the node's share of the spread",
                vec![
                    (
                        Event::Spread(Some((t0 + secs(30), "spreading".into()))),
                        vec![],
                    ),
                    (
                        reconcile(t0, "A"),
                        vec![Effect::Spreading {
                            reason: "spreading".into(),
                        }],
                    ),
                ],
                idle.clone(),
            )
        },
    ]
}

/// Rows of [`rows`], part 4 of 4.
fn rows_4(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    vec![
        Row {
            retry_in: Some(secs(30)),
            ..row(
                "after the spread the request is acted on",
                vec![
                    (
                        Event::Spread(Some((t0 + secs(30), "spreading".into()))),
                        vec![],
                    ),
                    (
                        reconcile(t0, "A"),
                        vec![Effect::Spreading {
                            reason: "spreading".into(),
                        }],
                    ),
                    (
                        Event::Reconcile {
                            now: t0 + secs(30),
                            request: Some("A".into()),
                        },
                        vec![Effect::Observe],
                    ),
                ],
                running(Step::Observe, false),
            )
        },
        Row {
            readiness_in: Some(READINESS_INTERVAL),
            ..row(
                "readiness checks that ran are due again in an hour",
                vec![
                    (Event::Started(Step::Readiness), vec![]),
                    (ended(t0), vec![]),
                    (
                        Event::Checked {
                            now: t0,
                            transient: false,
                            jitter: 0.0,
                        },
                        vec![],
                    ),
                    (Event::Settled, vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            readiness_in: Some(secs(20)),
            ..row(
                "readiness checks that could not run are retried on the registry back-off",
                vec![
                    (
                        Event::Checked {
                            now: t0,
                            transient: true,
                            jitter: 0.0,
                        },
                        vec![],
                    ),
                    (
                        Event::Checked {
                            now: t0,
                            transient: true,
                            jitter: 0.0,
                        },
                        vec![],
                    ),
                ],
                idle.clone(),
            )
        },
    ]
}

/// The status patch's and the credentials' timers.
fn timer_rows(t0: Instant) -> Vec<Row> {
    let idle = Activity::Idle;
    let ms = Duration::from_millis;
    vec![
        Row {
            patch_in: Some(ms(1000)),
            ..row(
                "a failed patch is retried after half its back-off step, the step doubling",
                vec![(patch_failed(t0, 0), vec![]), (patch_failed(t0, 0), vec![])],
                idle.clone(),
            )
        },
        Row {
            patch_in: Some(ms(500)),
            ..row(
                "a patch that went out starts the patch back-off from the floor again",
                vec![
                    (patch_failed(t0, 0), vec![]),
                    (patch_failed(t0, 0), vec![]),
                    (Event::Patched, vec![]),
                    (patch_failed(t0, 0), vec![]),
                ],
                idle.clone(),
            )
        },
        row(
            "a patch that went out clears the retry",
            vec![(patch_failed(t0, 0), vec![]), (Event::Patched, vec![])],
            idle.clone(),
        ),
        Row {
            patch_in: Some(PATCH_MAX_BACKOFF),
            credentials_in: Some(CREDENTIALS_CHECK),
            ..row(
                "a rejected patch waits the cap",
                vec![
                    (credentials(t0, true, true), vec![]),
                    (patch_failed(t0, 403), vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            patch_in: Some(PATCH_MAX_BACKOFF),
            ..row(
                "a patch answered 401 has the credential files looked at at once",
                vec![
                    (credentials(t0, true, true), vec![]),
                    (patch_failed(t0, 401), vec![]),
                ],
                idle.clone(),
            )
        },
        row(
            "a watch answered 401 has the credential files looked at at once",
            vec![
                (credentials(t0, true, true), vec![]),
                (Event::Unauthorized, vec![]),
            ],
            idle.clone(),
        ),
        Row {
            credentials_in: Some(CREDENTIALS_WAIT),
            ..row(
                "without a client the credential files are looked for again soon",
                vec![(credentials(t0, false, false), vec![])],
                idle.clone(),
            )
        },
        Row {
            credentials_in: Some(CREDENTIALS_CHECK),
            ..row(
                "new credentials let a refused patch go out without its slow retry",
                vec![
                    (patch_failed(t0, 403), vec![]),
                    (credentials(t0, true, true), vec![]),
                ],
                idle.clone(),
            )
        },
        Row {
            patch_in: Some(PATCH_MAX_BACKOFF),
            credentials_in: Some(CREDENTIALS_CHECK),
            ..row(
                "a look that keeps the loaded client keeps the patch's retry",
                vec![
                    (patch_failed(t0, 403), vec![]),
                    (credentials(t0, true, false), vec![]),
                ],
                idle,
            )
        },
    ]
}

#[test]
fn the_core_by_table() {
    let t0 = Instant::now();
    check(t0, rows(t0).into_iter().chain(timer_rows(t0)));
}

/// Runs each row on a fresh core; `t0` is the instant the rows' timers count from.
pub(super) fn check(t0: Instant, rows: impl IntoIterator<Item = Row>) {
    for r in rows {
        let mut core = Core::default();
        for (i, (event, want)) in r.steps.into_iter().enumerate() {
            let shown = format!("{event:?}");
            assert_eq!(core.handle(event), want, "{}: step {i} ({shown})", r.name);
        }
        assert_eq!(core.activity(), &r.activity, "{}: activity", r.name);
        assert_eq!(
            core.retry_at(),
            r.retry_in.map(|d| t0 + d),
            "{}: retry timer",
            r.name
        );
        assert_eq!(
            core.readiness_at(),
            r.readiness_in.map(|d| t0 + d),
            "{}: readiness timer",
            r.name
        );
        assert_eq!(
            core.patch_retry_at(),
            r.patch_in.map(|d| t0 + d),
            "{}: patch retry timer",
            r.name
        );
        assert_eq!(
            core.credentials_at(),
            r.credentials_in.map(|d| t0 + d),
            "{}: credentials timer",
            r.name
        );
    }
}

#[test]
fn the_status_patch_waits_for_a_failed_patchs_retry() {
    let t0 = Instant::now();
    let mut core = Core::default();
    assert_eq!(core.flush_at(None), None, "nothing pending");
    assert_eq!(core.flush_at(Some(t0)), Some(t0), "no retry: when due");
    core.handle(patch_failed(t0, 403));
    let retry = t0 + PATCH_MAX_BACKOFF;
    assert_eq!(core.flush_at(Some(t0)), Some(retry), "not before the retry");
    let later = retry + Duration::from_secs(1);
    assert_eq!(
        core.flush_at(Some(later)),
        Some(later),
        "nor before it is due"
    );
    assert_eq!(
        core.flush_at(None),
        None,
        "a retry sends only what is pending"
    );
}

#[test]
fn the_readiness_checks_run_again_when_marked_stale() {
    let t0 = Instant::now();
    let mut core = Core::default();
    core.handle(Event::Checked {
        now: t0,
        transient: false,
        jitter: 0.0,
    });
    assert!(!core.readiness_stale());
    assert_eq!(core.handle(Event::ReadinessStale), vec![]);
    assert!(core.readiness_stale());
    assert_eq!(
        core.readiness_at(),
        Some(t0 + READINESS_INTERVAL),
        "the timer stays"
    );
    core.handle(Event::ReadinessDue);
    assert_eq!(core.readiness_at(), None, "the timer is spent");
}

/// The request a step's span carries (the event loop's `work_done`).
#[test]
fn a_step_names_the_request_it_runs_for() {
    let a = || "A".to_string();
    for (step, want) in [
        (Step::Observe, None),
        (Step::Preflight { request: a() }, Some("A")),
        (Step::Cleanup { request: Some(a()) }, Some("A")),
        (Step::Cleanup { request: None }, None),
        (Step::Staging { request: a() }, Some("A")),
        (Step::Verify { request: a() }, Some("A")),
        (Step::Bootloader, None),
        (Step::Apply { request: a() }, Some("A")),
        (Step::Readiness, None),
    ] {
        assert_eq!(step.request(), want, "{step:?}");
    }
}

#[test]
fn only_a_settled_idle_core_is_idle() {
    let t0 = Instant::now();
    let mut core = Core::default();
    assert!(core.idle());
    core.handle(reconcile(t0, "A"));
    assert!(!core.idle());
    core.handle(ended(t0));
    assert!(!core.idle(), "the result is still acted on");
    core.handle(Event::Settled);
    assert!(core.idle());
}

#[test]
fn pull_retries_are_spaced_and_capped() {
    let secs: Vec<u64> = (1..=7).map(|n| pull_retry_delay(n).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(pull_retry_delay(u32::MAX), Duration::from_secs(300));
}
