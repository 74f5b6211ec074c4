//! The core as a table: named rows, each a sequence of events with the exact effects each
//! returns, and the activity and timers at the end.

use super::*;

/// One scenario.
struct Row {
    name: &'static str,
    /// Each event and the effects it must return.
    steps: Vec<(Event, Vec<Effect>)>,
    /// The activity after the last event.
    activity: Activity,
    /// The retry timer after the last event, from [`T0`]'s instant.
    retry_in: Option<Duration>,
    /// The readiness timer after the last event, from [`T0`]'s instant.
    readiness_in: Option<Duration>,
}

fn row(name: &'static str, steps: Vec<(Event, Vec<Effect>)>, activity: Activity) -> Row {
    Row {
        name,
        steps,
        activity,
        retry_in: None,
        readiness_in: None,
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn reconcile(t0: Instant, request: &str) -> Event {
    Event::Reconcile {
        now: t0,
        request: Some(request.into()),
    }
}

fn ended(t0: Instant) -> Event {
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

fn running(step: Step, again: bool) -> Activity {
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
fn in_staging(t0: Instant, request: &str) -> Vec<(Event, Vec<Effect>)> {
    let mut steps = in_preflight(t0, request);
    steps.extend([
        (ended(t0), vec![]),
        (Event::Started(staging(request)), vec![]),
        (Event::Settled, vec![]),
    ]);
    steps
}

fn with(
    mut steps: Vec<(Event, Vec<Effect>)>,
    more: Vec<(Event, Vec<Effect>)>,
) -> Vec<(Event, Vec<Effect>)> {
    steps.extend(more);
    steps
}

#[allow(clippy::too_many_lines)]
fn rows(t0: Instant) -> Vec<Row> {
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

#[test]
fn the_core_by_table() {
    let t0 = Instant::now();
    for r in rows(t0) {
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
    }
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
