//! End-to-end: the fake rpm-ostreed imports the registry's images with ostree-ext, as
//! rpm-ostree does, so the commits streamd reads carry ostree-ext's own keys
//! (docs/fidelity.md, rpm-ostreed: "a container refspec is imported by ostree-ext's
//! `ImageImporter`").

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use serde_json::Value;
use streamd::backend::helper::ImageConfigs;
use streamd::host::verify::image_configs;
use zbus::zvariant::OwnedValue;

/// The `ostree/container/image/…` refs of the repository at `repo` and the string metadata of
/// each ref's commit that ostree-ext writes.
fn image_commits(repo: &std::path::Path) -> BTreeMap<String, (String, BTreeMap<String, String>)> {
    let r = ostree::Repo::new(&ostree::gio::File::for_path(repo));
    r.open(ostree::gio::Cancellable::NONE).expect("open repo");
    let refs = r
        .list_refs(
            Some("ostree/container/image"),
            ostree::gio::Cancellable::NONE,
        )
        .expect("refs");
    refs.into_iter()
        .map(|(name, commit)| {
            let v = r
                .load_variant(ostree::ObjectType::Commit, &commit)
                .expect("commit");
            let meta = ostree::glib::VariantDict::new(Some(&v.child_value(0)));
            let keys = [
                "ostree.manifest-digest",
                "ostree.manifest",
                "ostree.importer.version",
                "version",
            ];
            let found = keys
                .iter()
                .filter_map(|k| {
                    let s = meta.lookup::<String>(k).ok().flatten()?;
                    Some((k.to_string(), s))
                })
                .collect();
            (name.to_string(), (commit.to_string(), found))
        })
        .collect()
}

/// `Sysroot.Deployments` as a D-Bus client reads it.
async fn dbus_deployments(env: &Env) -> Vec<HashMap<String, OwnedValue>> {
    let conn = bus_connection(&env.tb).await;
    zbus::Proxy::new(
        &conn,
        "org.projectatomic.rpmostree1",
        "/org/projectatomic/rpmostree1/Sysroot",
        "org.projectatomic.rpmostree1.Sysroot",
    )
    .await
    .expect("sysroot proxy")
    .get_property("Deployments")
    .await
    .expect("Deployments")
}

fn string_of(v: &OwnedValue) -> String {
    String::try_from(v.clone()).unwrap_or_else(|e| panic!("{v:?} is no string: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_and_booted_images_are_imported_by_ostree_ext() {
    let mut env = Env::new("import").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_reboot_request().await;

    let repo = env.tb.dir().join("sysroot/ostree/repo");
    let commits = image_commits(&repo);
    let reg = env.tb.registry();
    // The platform manifests the importer resolved the pinned indexes to (amd64).
    let rhel9 = &reg.os_images()[0].platforms[0];
    let rhel10 = &reg.os_images()[1].platforms[0];
    for (want, what) in [(rhel9, "booted rhel-9"), (rhel10, "staged rhel-10")] {
        let (name, (commit, meta)) = commits
            .iter()
            .find(|(_, (_, m))| m.get("ostree.manifest-digest") == Some(&want.digest))
            .unwrap_or_else(|| {
                panic!("no {what} image commit by its manifest digest: {commits:#?}")
            });
        assert_eq!(
            meta.get("ostree.importer.version").map(String::as_str),
            Some("0.15.3"),
            "{name}"
        );
        let manifest: Value =
            serde_json::from_str(meta.get("ostree.manifest").expect("manifest")).expect("json");
        assert_eq!(manifest["config"]["digest"], want.config_digest.as_str());

        // streamd's own reader of the image configuration finds the labels encapsulation added.
        let answer = image_configs(&ImageConfigs {
            repo: repo.clone(),
            commits: vec![commit.clone()],
        })
        .expect("image configs");
        let config = answer[commit].clone().expect("read").expect("a config");
        let config: Value = serde_json::from_str(&config).expect("json");
        let labels = &config["config"]["Labels"];
        assert_eq!(
            labels["ostree.commit"].as_str().map(str::len),
            Some(64),
            "{config}"
        );
        assert!(labels["ostree.final-diffid"].is_string(), "{config}");
        assert_eq!(labels["ostree.linux"], want.labels["ostree.linux"].as_str());
    }

    // Over D-Bus the daemon reports what the import stored, as rpm-ostree v2025.5 did when run
    // beside the project: the platform manifest's digest (the refspec pins the index) and the
    // image commit's whole metadata as `base-commit-meta`.
    let pinned = env.rhel10();
    let deployments = dbus_deployments(&env).await;
    let staged = deployments
        .iter()
        .find(|d| d.get("staged").and_then(|v| bool::try_from(v).ok()) == Some(true))
        .expect("a staged deployment");
    let reported = string_of(&staged["container-image-reference-digest"]);
    assert_eq!(reported, rhel10.digest);
    assert!(!pinned.contains(&reported), "{pinned} pins the index");
    let meta: HashMap<String, OwnedValue> =
        HashMap::try_from(staged["base-commit-meta"].clone()).expect("a{sv}");
    let (_, (_, stored)) = commits
        .iter()
        .find(|(_, (_, m))| m.get("ostree.manifest-digest") == Some(&rhel10.digest))
        .expect("the staged image's commit");
    for (key, value) in stored {
        assert_eq!(meta.get(key).map(string_of).as_ref(), Some(value), "{key}");
    }
    assert!(
        !meta.contains_key("version"),
        "ostree-ext's commit has no version: {meta:?}"
    );
}

/// Whether one of `commits` is the image of platform manifest `digest`.
fn has_image(commits: &BTreeMap<String, (String, BTreeMap<String, String>)>, digest: &str) -> bool {
    commits
        .values()
        .any(|(_, meta)| meta.get("ostree.manifest-digest").map(String::as_str) == Some(digest))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_prunes_the_image_no_deployment_uses() {
    let mut env = Env::new("import-prune").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    env.request_rhel10();
    env.wait_state("Staged").await;
    let repo = env.tb.dir().join("sysroot/ostree/repo");
    let reg = env.tb.registry();
    let rhel9 = reg.os_images()[0].platforms[0].digest.clone();
    let rhel10 = reg.os_images()[1].platforms[0].digest.clone();
    assert!(has_image(&image_commits(&repo), &rhel10));

    // Withdrawn, the stage is cleaned up; as rpm-ostree v2025.5 did when run beside the
    // project, the image no deployment uses goes with it (the booted one stays).
    env.withdraw_request();
    env.wait_state("Idle").await;
    let commits = image_commits(&repo);
    assert!(!has_image(&commits, &rhel10), "{commits:#?}");
    assert!(has_image(&commits, &rhel9), "{commits:#?}");

    // Asked again, it is imported again.
    env.request_rhel10();
    env.wait_state("Staged").await;
    assert!(has_image(&image_commits(&repo), &rhel10));
}
