//! End-to-end: readiness on every OpenShift release and feature set the testbed plays, for
//! every host fixture the machine-config daemon manages, against the table in
//! docs/protocol.md "Readiness by release" (issue 19, "Done when"). One fleet per release and
//! feature set, one node per fixture, so each cluster is set up once.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::scratch::ScratchDir;
use testbed::{FeatureSet, Fleet, FleetOptions, OpenShift};

const STATE: &str = "osstream.openshift.io/state";
const MODE: &str = "osstream.openshift.io/mode";
const READINESS: &str = "osstream.openshift.io/readiness";

/// The testbed's host fixtures the machine-config daemon manages (each needs its rows).
fn mcd_fixtures() -> Vec<&'static str> {
    testbed::fixtures::FIXTURES
        .iter()
        .filter(|f| f.mcd)
        .map(|f| f.name)
        .collect()
}

/// One row of the table, for one release, feature set and fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected {
    verdict: String,
    failed: String,
    reason: String,
}

/// docs/protocol.md's "Readiness by release" table, expanded: release and feature-set cells may
/// list several (`4.22, 4.23`), a fixture cell may be `every`; each cell of the product must be
/// given once.
fn documented() -> BTreeMap<(String, String, String), Expected> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocol.md"))
            .expect("docs/protocol.md");
    let section = doc
        .split_once("\n### Readiness by release\n")
        .expect("docs/protocol.md has \"### Readiness by release\"")
        .1;
    let mut table = BTreeMap::new();
    let rows = section
        .lines()
        .skip_while(|l| !l.starts_with("| release"))
        .skip(2);
    for line in rows.take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let [releases, sets, fixtures, verdict, failed, reason] = cells[..] else {
            panic!("a row of 6 cells: {line}");
        };
        let list = |c: &str| -> Vec<String> {
            c.split(", ")
                .map(|s| s.trim_matches('`').to_string())
                .collect()
        };
        let fixtures = match fixtures {
            "every" => mcd_fixtures().into_iter().map(String::from).collect(),
            f => list(f),
        };
        let e = Expected {
            verdict: verdict.into(),
            failed: failed.trim_matches('`').into(),
            reason: reason.trim_matches('`').into(),
        };
        for r in list(releases) {
            for s in list(sets) {
                for f in &fixtures {
                    let key = (r.clone(), s.clone(), f.clone());
                    assert!(
                        table.insert(key.clone(), e.clone()).is_none(),
                        "{key:?} twice"
                    );
                }
            }
        }
    }
    table
}

/// What a node's rhel-10 readiness entry (or, with no entry, its status) says, as a row.
fn observed(entry: Option<&Value>, status_reason: &str) -> Expected {
    let Some(e) = entry else {
        return Expected {
            verdict: "Idle, nothing checked".into(),
            failed: String::new(),
            reason: status_reason.into(),
        };
    };
    let failed: Vec<&str> = e["failed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let reason = e["reason"].as_str().unwrap_or_default().to_string();
    let verdict = match (e["ready"].as_bool(), failed.is_empty()) {
        (Some(true), _) => "ready",
        (_, false) => "not ready",
        _ if reason.starts_with("stream not applicable") => "not applicable",
        _ => "unknown",
    };
    Expected {
        verdict: verdict.into(),
        failed: failed.join(", "),
        reason,
    }
}

/// `streamctl status --json`'s reason on `node` ("" when it cannot be read).
fn status_reason(fleet: &Fleet, node: &str) -> String {
    let Ok(env) = fleet.node_env(node) else {
        return String::new();
    };
    let out = Command::new(env!("CARGO_BIN_EXE_streamctl"))
        .args(["status", "--json"])
        .envs(env)
        .output()
        .expect("streamctl runs");
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|v| v["reason"].as_str().map(String::from))
        .unwrap_or_default()
}

/// Waits until every node has a rhel-10 readiness entry, or (where the cluster serves no
/// OSImageStream) a status saying there is nothing to check; returns each node's row.
async fn rows(fleet: &Fleet, streams_served: bool) -> BTreeMap<String, Expected> {
    let fixtures = mcd_fixtures();
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut done = BTreeMap::new();
    while done.len() < fixtures.len() {
        for (i, fixture) in fixtures.iter().enumerate() {
            let node = testbed::harness::fleet::node_name(i);
            if done.contains_key(*fixture) {
                continue;
            }
            let a = fleet.annotations(&node).unwrap_or_default();
            let entry = a[READINESS]
                .as_str()
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .and_then(|r| r.get("rhel-10").cloned());
            if streams_served && entry.is_some() {
                done.insert(fixture.to_string(), observed(entry.as_ref(), ""));
            } else if !streams_served {
                let reason = status_reason(fleet, &node);
                if reason.contains("offers no OS image streams") {
                    done.insert(fixture.to_string(), observed(entry.as_ref(), &reason));
                }
            }
        }
        let last = fixtures.iter().find(|f| !done.contains_key(**f));
        assert!(
            Instant::now() < deadline || last.is_none(),
            "no verdict within 240 s for {last:?}; so far {done:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    done
}

/// Every MCD-managed fixture on OpenShift 4.21, 4.22 and 4.23, Default and
/// TechPreviewNoUpgrade: the verdict and failed checks agree with docs/protocol.md, and the
/// reason holds the text the table quotes. Every node stays `Idle` in readiness mode and no
/// Warning Event is posted on any cluster; a Default cluster that serves no OSImageStream
/// leaves no `readiness` annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_on_each_release_and_feature_set_agrees_with_the_protocol_table() {
    let table = documented();
    let fixtures = mcd_fixtures();
    for release in OpenShift::ALL {
        for set in FeatureSet::ALL {
            let scratch = ScratchDir::new(&format!("rel-{release}-{set}")).expect("scratch");
            let fleet = Fleet::start(FleetOptions {
                host: "mcd".into(),
                host_overrides: fixtures
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (testbed::harness::fleet::node_name(i), f.to_string()))
                    .collect(),
                openshift: release,
                feature_set: Some(set),
                streamd: Some(env!("CARGO_BIN_EXE_streamd").into()),
                ..FleetOptions::new(scratch.to_path_buf(), fixtures.len())
            })
            .await
            .expect("fleet starts");
            let served = release.osimagestream_version(set).is_some();
            let got = rows(&fleet, served).await;
            for (fixture, row) in &got {
                let key = (release.to_string(), set.to_string(), fixture.clone());
                let want = table
                    .get(&key)
                    .unwrap_or_else(|| panic!("docs/protocol.md has no row for {key:?}"));
                assert!(
                    row.verdict == want.verdict
                        && row.failed == want.failed
                        && row.reason.contains(&want.reason),
                    "{key:?}: observed {row:#?}, documented {want:#?}"
                );
            }
            for i in 0..fixtures.len() {
                let a = fleet
                    .annotations(&testbed::harness::fleet::node_name(i))
                    .expect("annotations");
                assert_eq!(a[MODE], "readiness", "{a}");
                assert_eq!(a[STATE], "Idle", "{a}");
            }
            let warnings: Vec<Value> = fleet
                .apiserver()
                .list("v1", "Event", None)
                .expect("events")
                .into_iter()
                .filter(|e| e["type"] == "Warning")
                .collect();
            assert!(warnings.is_empty(), "{release} {set}: {warnings:#?}");
        }
    }
}
