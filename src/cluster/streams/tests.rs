use super::watch::{Failure, Tracker, classify, classify_watch, listed_versions};
use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroupList, APIResourceList};
use kube::runtime::watcher;

const D9: &str = "sha256:9999999999999999999999999999999999999999999999999999999999999999";
const D10: &str = "sha256:1010101010101010101010101010101010101010101010101010101010101010";
const DX: &str = "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

fn img(d: &str) -> String {
    format!("quay.io/openshift-release-dev/rhcos@{d}")
}

fn entry(name: &str, os: &str, ext: &str) -> StreamImages {
    StreamImages {
        name: name.into(),
        os_image: os.into(),
        os_extensions_image: ext.into(),
        written_by: None,
    }
}

fn catalog() -> Catalog {
    Catalog::Available(vec![
        entry("rhel-9", &img(D9), &img(DX)),
        entry("rhel-10", &img(D10), ""),
        entry("tagged", "quay.io/x/rhcos:latest", ""),
        entry("bad-ext", &img(D10), "not an image"),
    ])
}

fn inputs(stream: Option<&str>, os: Option<&str>, ext: Option<&str>) -> Inputs {
    Inputs {
        stream: stream.map(String::from),
        os_image: os.map(String::from),
        extensions_image: ext.map(String::from),
        reboot_approved: Some("token-1".into()),
    }
}

/// (case, inputs, catalog, the expected inputs or a fragment of the expected error).
type Case = (
    &'static str,
    Inputs,
    Option<Catalog>,
    Result<Inputs, &'static str>,
);

/// Requests that resolve, or are left as they are.
fn resolving_rows() -> Vec<Case> {
    let explicit = img(DX);
    vec![
        (
            "stream only: both images filled in",
            inputs(Some("rhel-9"), None, None),
            Some(catalog()),
            Ok(inputs(Some("rhel-9"), Some(&img(D9)), Some(&img(DX)))),
        ),
        (
            "stream without extensions image",
            inputs(Some("rhel-10"), None, None),
            Some(catalog()),
            Ok(inputs(Some("rhel-10"), Some(&img(D10)), None)),
        ),
        (
            "explicit os image wins, catalog unread",
            inputs(Some("rhel-10"), Some(&explicit), None),
            None,
            Ok(inputs(Some("rhel-10"), Some(&explicit), None)),
        ),
        (
            "explicit os image wins over the catalog",
            inputs(Some("rhel-9"), Some(&explicit), None),
            Some(catalog()),
            Ok(inputs(Some("rhel-9"), Some(&explicit), None)),
        ),
        (
            "no request stays no request",
            inputs(None, None, None),
            Some(Catalog::Missing),
            Ok(inputs(None, None, None)),
        ),
        (
            "stream plus extensions only is not resolved",
            inputs(Some("rhel-9"), None, Some(&explicit)),
            Some(catalog()),
            Ok(inputs(Some("rhel-9"), None, Some(&explicit))),
        ),
    ]
}

/// Requests the catalog refuses, each with the reason's fragment.
fn refusing_rows() -> Vec<Case> {
    let newline = Catalog::Available(vec![entry("a\nb", &img(D9), "")]);
    vec![
        (
            "unknown stream lists the available ones",
            inputs(Some("rhel-11"), None, None),
            Some(catalog()),
            Err(
                "stream \"rhel-11\" is not available; available streams: \"rhel-9\", \"rhel-10\", \"tagged\", \"bad-ext\"",
            ),
        ),
        (
            "a cluster stream name with a newline stays on one line",
            inputs(Some("rhel-11"), None, None),
            Some(newline),
            Err("available streams: \"a\\nb\""),
        ),
        (
            "an empty catalog says so",
            inputs(Some("rhel-11"), None, None),
            Some(Catalog::Available(vec![])),
            Err("available streams: none"),
        ),
        (
            "malformed stream name",
            inputs(Some("RHEL 10"), None, None),
            Some(catalog()),
            Err("annotation osstream.openshift.io/desired-stream: \"RHEL 10\" is not an RFC 1123"),
        ),
        (
            "tagged image in the catalog",
            inputs(Some("tagged"), None, None),
            Some(catalog()),
            Err(
                "OSImageStream \"cluster\" stream \"tagged\" osImage: image reference \"quay.io/x/rhcos:latest\" is not pinned",
            ),
        ),
        (
            "bad extensions image in the catalog",
            inputs(Some("bad-ext"), None, None),
            Some(catalog()),
            Err("stream \"bad-ext\" osExtensionsImage: image reference contains whitespace"),
        ),
    ]
}

/// Requests that wait for a catalog that cannot be used yet.
fn waiting_rows() -> Vec<Case> {
    vec![
        (
            "catalog not read yet",
            inputs(Some("rhel-9"), None, None),
            None,
            Err("waiting for the first read"),
        ),
        (
            "object missing",
            inputs(Some("rhel-9"), None, None),
            Some(Catalog::Missing),
            Err("OSImageStream \"cluster\" does not exist"),
        ),
        (
            "object without status",
            inputs(Some("rhel-9"), None, None),
            Some(Catalog::Unreconciled),
            Err("has no status.availableStreams yet"),
        ),
    ]
}

/// Every row of [`resolving_rows`], [`refusing_rows`] and [`waiting_rows`] resolves as it says.
#[test]
fn resolution_table() {
    let rows = [resolving_rows(), refusing_rows(), waiting_rows()];
    for (case, given, catalog, expected) in rows.into_iter().flatten() {
        let got = resolve(&given, catalog.as_ref());
        match (&got, expected) {
            (Ok(got), Ok(want)) => assert_eq!(got, &want, "{case}"),
            (Err(err), Err(fragment)) => {
                let msg = err.to_string();
                assert!(msg.contains(fragment), "{case}: {msg:?} lacks {fragment:?}");
            }
            (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn resolved_inputs_pass_the_protocol_validation() {
    let resolved =
        resolve(&inputs(Some("rhel-9"), None, None), Some(&catalog())).expect("resolves");
    let desired = resolved.desired().expect("valid").expect("a request");
    assert_eq!(desired.os_image.to_string(), img(D9));
    assert_eq!(
        desired.extensions_image.map(|i| i.to_string()),
        Some(img(DX))
    );
}

#[test]
fn refusal_versus_waiting() {
    let refused = [
        resolve(&inputs(Some("nope"), None, None), Some(&catalog())),
        resolve(&inputs(Some("tagged"), None, None), Some(&catalog())),
        resolve(&inputs(Some("-x"), None, None), Some(&catalog())),
    ];
    for r in refused {
        assert!(r.as_ref().is_err_and(ResolveError::refuses), "{r:?}");
    }
    for c in [None, Some(&Catalog::Missing), Some(&Catalog::Unreconciled)] {
        let r = resolve(&inputs(Some("rhel-9"), None, None), c);
        assert!(r.as_ref().is_err_and(|e| !e.refuses()), "{r:?}");
    }
}

#[test]
fn objects_parse_tolerating_unknown_fields() {
    let json = serde_json::json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "OSImageStream",
        "metadata": {"name": "cluster", "labels": {"openshift.io/operator-managed": ""}},
        "spec": {"defaultStream": "rhel-9"},
        "status": {
            "defaultStream": "rhel-9",
            "someFutureField": [1, 2],
            "availableStreams": [
                {"name": "rhel-9", "osImage": img(D9), "osExtensionsImage": img(DX), "extra": true},
                {"name": "rhel-10", "osImage": img(D10)},
            ],
        },
    });
    let obj: OsImageStream = serde_json::from_value(json).expect("parses");
    assert_eq!(
        Catalog::from_object(Some(&obj)),
        Catalog::Available(vec![
            entry("rhel-9", &img(D9), &img(DX)),
            entry("rhel-10", &img(D10), ""),
        ])
    );
    let bare: OsImageStream =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "cluster"}}))
            .expect("parses");
    assert_eq!(Catalog::from_object(Some(&bare)), Catalog::Unreconciled);
    let empty: OsImageStream = serde_json::from_value(
        serde_json::json!({"metadata": {"name": "cluster"}, "status": {"availableStreams": []}}),
    )
    .expect("parses");
    assert_eq!(Catalog::from_object(Some(&empty)), Catalog::Unreconciled);
    assert_eq!(Catalog::from_object(None), Catalog::Missing);
    // The operator's build annotation is the object's, carried by every entry.
    let mut written: OsImageStream = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cluster", "annotations": {VERSION_ANNOTATION: "0a1b2c"}},
        "status": {"availableStreams": [{"name": "rhel-10", "osImage": img(D10)}]},
    }))
    .expect("parses");
    let Catalog::Available(e) = Catalog::from_object(Some(&written)) else {
        panic!("available");
    };
    assert_eq!(e[0].written_by.as_deref(), Some("0a1b2c"));
    written.metadata.annotations = None;
    assert_eq!(
        Catalog::from_object(Some(&written)),
        Catalog::Available(vec![entry("rhel-10", &img(D10), "")])
    );
}

fn object(digest: &str) -> OsImageStream {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cluster"},
        "status": {"availableStreams": [{"name": "rhel-10", "osImage": img(digest)}]},
    }))
    .expect("parses")
}

#[test]
fn tracker_reports_complete_lists_and_only_changes() {
    let mut t = Tracker::default();
    let avail =
        |d: &str| StreamsUpdate::Catalog(Catalog::Available(vec![entry("rhel-10", &img(d), "")]));
    // A list with the object: reported once the list is complete.
    assert_eq!(t.on_event(watcher::Event::Init), None);
    assert_eq!(t.on_event(watcher::Event::InitApply(object(D9))), None);
    assert_eq!(t.on_event(watcher::Event::InitDone), Some(avail(D9)));
    // The same status again (a relist, a metadata-only change): nothing.
    assert_eq!(t.on_event(watcher::Event::Apply(object(D9))), None);
    assert_eq!(
        t.on_event(watcher::Event::Apply(object(D10))),
        Some(avail(D10))
    );
    assert_eq!(
        t.on_event(watcher::Event::Delete(object(D10))),
        Some(StreamsUpdate::Catalog(Catalog::Missing))
    );
    // A relist that finds nothing after the object came back: missing again.
    assert_eq!(
        t.on_event(watcher::Event::Apply(object(D9))),
        Some(avail(D9))
    );
    assert_eq!(t.on_event(watcher::Event::Init), None);
    assert_eq!(
        t.on_event(watcher::Event::InitDone),
        Some(StreamsUpdate::Catalog(Catalog::Missing))
    );
    // A 403 is reported once as a catalog the node shows; a 404 asks for discovery; the
    // rest is retried.
    let forbidden = t.on_failure("v1alpha1", Failure::Forbidden("nope".into()));
    match &forbidden {
        Some(StreamsUpdate::Catalog(Catalog::Unreadable(r))) => assert!(
            r.starts_with("reading OSImageStream \"cluster\" (machineconfiguration.openshift.io/v1alpha1) is forbidden (nope); "),
            "{r}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        t.on_failure("v1alpha1", Failure::Forbidden("nope".into())),
        None
    );
    assert_eq!(t.on_failure("v1", Failure::NotServed), None);
    assert_eq!(
        t.on_failure("v1", Failure::Other("reset".into())),
        Some(StreamsUpdate::Error("reset".into()))
    );
    // Readable again: the same catalog as before the refusal is news.
    assert_eq!(t.on_event(watcher::Event::Init), None);
    assert_eq!(t.on_event(watcher::Event::InitApply(object(D9))), None);
    assert_eq!(t.on_event(watcher::Event::InitDone), Some(avail(D9)));
}

#[test]
fn failures_are_classified_by_status_code() {
    let api = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    };
    assert_eq!(classify(&api(404)), Failure::NotServed);
    assert_eq!(classify(&api(403)), Failure::Forbidden("m".into()));
    assert!(matches!(classify(&api(500)), Failure::Other(_)));
    assert_eq!(
        classify_watch(&watcher::Error::InitialListFailed(api(404))),
        Failure::NotServed
    );
    assert!(matches!(
        classify_watch(&watcher::Error::NoResourceVersion),
        Failure::Other(_)
    ));
}

fn resource_list(group_version: &str, plurals: &[&str]) -> APIResourceList {
    serde_json::from_value(serde_json::json!({
        "groupVersion": group_version,
        "resources": plurals.iter().map(|p| serde_json::json!({
            "name": p, "singularName": "", "namespaced": false, "kind": "K", "verbs": ["get"],
        })).collect::<Vec<_>>(),
    }))
    .expect("parses")
}

#[test]
fn served_version_table() {
    let v1 = resource_list(
        "machineconfiguration.openshift.io/v1",
        &["machineconfigs", "osimagestreams", "osimagestreams/status"],
    );
    let v1_without = resource_list(
        "machineconfiguration.openshift.io/v1",
        &["machineconfigs", "machineconfigpools"],
    );
    let alpha = resource_list(
        "machineconfiguration.openshift.io/v1alpha1",
        &["osimagestreams"],
    );
    let other_group = resource_list("example.com/v1", &["osimagestreams"]);
    let cases: Vec<(&str, Vec<APIResourceList>, Option<&str>)> = vec![
        ("4.23: v1", vec![v1.clone()], Some("v1")),
        (
            "4.21/4.22 with the feature set: v1alpha1 beside v1's other types",
            vec![v1_without.clone(), alpha.clone()],
            Some("v1alpha1"),
        ),
        (
            "both (not shipped): the stable one",
            vec![alpha, v1],
            Some("v1"),
        ),
        (
            "4.20, or 4.22 without the feature set",
            vec![v1_without],
            None,
        ),
        ("no group", vec![], None),
        ("another group's osimagestreams", vec![other_group], None),
    ];
    for (case, lists, want) in cases {
        assert_eq!(served_version(&lists), want, "{case}");
    }
    let groups: APIGroupList = serde_json::from_value(serde_json::json!({"groups": [
        {"name": "machineconfiguration.openshift.io", "versions": [
            {"groupVersion": "machineconfiguration.openshift.io/v1", "version": "v1"},
            {"groupVersion": "machineconfiguration.openshift.io/v1alpha1", "version": "v1alpha1"},
            {"groupVersion": "machineconfiguration.openshift.io/v2", "version": "v2"},
        ]},
    ]}))
    .expect("parses");
    assert_eq!(listed_versions(&groups), vec!["v1", "v1alpha1"]);
    assert!(listed_versions(&APIGroupList::default()).is_empty());
}

#[test]
fn unserved_catalog_waits_with_its_reason() {
    let reason = not_served();
    let err = resolve(
        &inputs(Some("rhel-9"), None, None),
        Some(&Catalog::NotServed),
    )
    .expect_err("not served");
    assert!(!err.refuses());
    assert_eq!(
        err.to_string(),
        format!("{reason}; set desired-os-image on the node instead")
    );
    for set in [
        "TechPreviewNoUpgrade",
        "DevPreviewNoUpgrade",
        "CustomNoUpgrade",
    ] {
        assert!(reason.contains(set), "names {set}: {reason}");
    }
    assert!(
        reason.contains("osimagestreams.machineconfiguration.openshift.io in v1 or v1alpha1"),
        "{reason}"
    );
}

#[test]
fn a_refresh_is_a_changed_resolution_of_unchanged_annotations() {
    let raw = inputs(Some("rhel-10"), None, None);
    let old = inputs(Some("rhel-10"), Some(&img(D9)), None);
    let new = inputs(Some("rhel-10"), Some(&img(D10)), None);
    let other_raw = inputs(Some("rhel-9"), None, None);
    assert!(catalog_refresh(Some((&raw, &old)), &raw, &new));
    assert!(
        !catalog_refresh(Some((&raw, &old)), &raw, &old),
        "nothing changed"
    );
    assert!(
        !catalog_refresh(Some((&other_raw, &old)), &raw, &new),
        "the admin changed the node"
    );
    assert!(!catalog_refresh(None, &raw, &new), "the first resolution");
}

#[test]
fn spread_delays_are_stable_per_node_and_cover_the_spread() {
    let spread = Duration::from_secs(600);
    let req = inputs(Some("rhel-10"), Some(&img(D10)), None);
    assert_eq!(
        spread_delay(spread, "worker-0", &req),
        spread_delay(spread, "worker-0", &req)
    );
    assert_eq!(
        spread_delay(Duration::ZERO, "worker-0", &req),
        Duration::ZERO
    );
    let delays: Vec<Duration> = (0..200)
        .map(|i| spread_delay(spread, &format!("worker-{i}"), &req))
        .collect();
    assert!(delays.iter().all(|d| *d < spread));
    // Spread over the whole window, not bunched: each tenth of it gets some nodes.
    for tenth in 0..10u32 {
        let (lo, hi) = (spread * tenth / 10, spread * (tenth + 1) / 10);
        assert!(
            delays.iter().any(|d| *d >= lo && *d < hi),
            "nothing in tenth {tenth}"
        );
    }
    let other = inputs(Some("rhel-10"), Some(&img(D9)), None);
    assert_ne!(
        spread_delay(spread, "worker-0", &req),
        spread_delay(spread, "worker-0", &other)
    );
}
