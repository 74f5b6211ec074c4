//! The controller's patches and target resolution.

use super::*;
use crate::planner::Action;

fn target() -> Desired {
    Inputs {
        stream: Some("rhel-10".into()),
        os_image: Some(
            "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010"
                .into(),
        ),
        extensions_image: None,
        reboot_approved: None,
    }
    .desired()
    .expect("valid")
    .expect("some")
}

#[test]
fn patches_write_only_the_controllers_keys() {
    let t = target();
    let node = || "w1".to_string();
    let p = |a: Action| action_patch("worker", &a, &t, None, 1234);
    assert_eq!(
        p(Action::Target { node: node() }),
        Some(json!({"metadata": {"annotations": {
            "osstream.openshift.io/desired-stream": "rhel-10",
            "osstream.openshift.io/desired-os-image": "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010",
            "osstream.openshift.io/desired-extensions-image": null,
            "osstream.openshift.io/rollout-pool": "worker",
            "osstream.openshift.io/rollout-targeted": "1234",
            "osstream.openshift.io/rollout-updated": null,
        }}}))
    );
    assert_eq!(
        p(Action::Cordon {
            node: node(),
            token: "abc.def.1".into()
        }),
        Some(json!({
            "metadata": {"annotations": {"osstream.openshift.io/rollout-step": "draining:1234:abc.def.1"}},
            "spec": {"unschedulable": true},
        }))
    );
    assert_eq!(
        p(Action::Uncordon { node: node() }),
        Some(json!({
            "metadata": {"annotations": {
                "osstream.openshift.io/rollout-step": null,
                "osstream.openshift.io/reboot-approved": null,
                "osstream.openshift.io/rollout-set-aside": null,
                "osstream.openshift.io/rollout-updated": "1234",
            }},
            "spec": {"unschedulable": false},
        }))
    );
    assert_eq!(
        p(Action::SetAside {
            node: node(),
            token: "abc.def.1".into()
        }),
        Some(json!({
            "metadata": {"annotations": {
                "osstream.openshift.io/rollout-step": null,
                "osstream.openshift.io/rollout-set-aside": "abc.def.1",
            }},
            "spec": {"unschedulable": false},
        }))
    );
    assert_eq!(
        p(Action::Drain {
            node: node(),
            token: "x".into()
        }),
        None
    );
    assert_eq!(
        p(Action::Recordon { node: node() }),
        Some(json!({"spec": {"unschedulable": true}}))
    );
    assert_eq!(
        approval_patch("abc.def.1", 1234, "77"),
        json!({"metadata": {
            "annotations": {
                "osstream.openshift.io/reboot-approved": "abc.def.1",
                "osstream.openshift.io/rollout-step": "approved:1234:abc.def.1",
            },
            "resourceVersion": "77",
        }})
    );
}

#[test]
fn a_release_removes_the_controllers_keys_only_if_the_node_is_as_listed() {
    assert_eq!(
        release_patch(true, true, "42"),
        json!({
            "metadata": {
                "annotations": {
                    "osstream.openshift.io/rollout-pool": null,
                    "osstream.openshift.io/check-stream": null,
                    "osstream.openshift.io/check-os-image": null,
                    "osstream.openshift.io/check-extensions-image": null,
                    "osstream.openshift.io/rollout-set-aside": null,
                    "osstream.openshift.io/rollout-updated": null,
                    "osstream.openshift.io/desired-stream": null,
                    "osstream.openshift.io/desired-os-image": null,
                    "osstream.openshift.io/desired-extensions-image": null,
                    "osstream.openshift.io/rollout-targeted": null,
                    "osstream.openshift.io/rollout-step": null,
                    "osstream.openshift.io/reboot-approved": null,
                },
                "resourceVersion": "42",
            },
            "spec": {"unschedulable": false},
        })
    );
    let keep = release_patch(false, false, "7");
    assert_eq!(
        keep["metadata"]["annotations"].as_object().map(|m| m.len()),
        Some(6)
    );
    assert!(keep.get("spec").is_none());
}

#[test]
fn targets_resolve_from_the_spec_or_the_catalog() {
    use streamd::cluster::streams::StreamImages;
    let os = "quay.io/openshift/rhcos@sha256:1010101010101010101010101010101010101010101010101010101010101010";
    let explicit = Target {
        stream: "rhel-10".into(),
        os_image: Some(os.into()),
        extensions_image: None,
    };
    let (d, check) = resolve_target(&explicit, None);
    assert_eq!(d, Ok(target()));
    assert_eq!(check.expect("check").os_image.as_deref(), Some(os));

    let by_name = Target {
        stream: "rhel-10".into(),
        os_image: None,
        extensions_image: None,
    };
    let catalog = Catalog::Available(vec![StreamImages {
        name: "rhel-10".into(),
        os_image: os.into(),
        os_extensions_image: String::new(),
        written_by: None,
    }]);
    assert_eq!(resolve_target(&by_name, Some(&catalog)).0, Ok(target()));
    let (d, check) = resolve_target(&by_name, Some(&Catalog::Missing));
    assert!(
        d.expect_err("missing")
            .starts_with("spec.target: OSImageStream")
    );
    assert_eq!(check.expect("check").os_image, None);

    let tag = Target {
        os_image: Some("quay.io/openshift/rhcos:4.20".into()),
        ..explicit
    };
    assert!(
        resolve_target(&tag, None)
            .0
            .expect_err("tag")
            .contains("not pinned by digest")
    );
    let bad = Target {
        stream: "RHEL 10".into(),
        os_image: None,
        extensions_image: None,
    };
    let (d, check) = resolve_target(&bad, Some(&catalog));
    assert!(d.is_err());
    assert!(check.is_none());
}
