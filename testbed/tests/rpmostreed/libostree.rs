//! The fake over real libostree 2025.x (`real_libostree`): what is staged, locked, unlocked,
//! finalized and cleaned up is libostree's own, and the model is read back from it.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;

use testbed::fakes::rpmostreed::libostree::Trixie;
use zbus::zvariant::{OwnedValue, Value};

use super::{Dict, Env, bool_of, dict, os_call, registry_ref, string_of};

/// Whether this run can stage through real libostree (the trixie root, root); on CI either
/// missing fails.
fn real_libostree(test: &str) -> bool {
    let trixie = Trixie::for_test(test).expect("the trixie root (CI=true)");
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI runs as root"
        );
        eprintln!("skipping {test}: not root");
    }
    trixie.is_some() && root
}

fn name_of(record: &HashMap<String, OwnedValue>, key: &str) -> String {
    match record.get(key).map(|v| &**v) {
        Some(Value::Dict(d)) => d
            .get::<&str, String>(&"name")
            .expect("name")
            .expect("a name"),
        other => panic!("{key}: {other:?}"),
    }
}

fn strv(record: &HashMap<String, OwnedValue>, key: &str) -> Vec<String> {
    record[key]
        .try_clone()
        .expect("clone")
        .try_into()
        .unwrap_or_else(|e| panic!("{key} is not as: {e}"))
}

fn locked(record: &HashMap<String, OwnedValue>) -> Option<bool> {
    match record.get("locked").map(|v| &**v) {
        Some(Value::Bool(b)) => Some(*b),
        None => None,
        other => panic!("locked: {other:?}"),
    }
}

fn entries(env: &Env) -> usize {
    std::fs::read_dir(env.dir.join("sysroot/boot/loader/entries"))
        .expect("entries")
        .count()
}

#[tokio::test]
async fn stage_unlock_finalize_and_cleanup_are_real_libostrees() {
    if !real_libostree("stage_unlock_finalize_and_cleanup_are_real_libostrees") {
        return;
    }
    let env = Env::over_libostree().await;
    let booted = env.deployments().await.remove(0);
    let booted_name = format!("{}.0", string_of(&booted, "checksum"));
    let booted_options: Vec<String> = string_of(&env.boot_config("0").await, "options")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let before = entries(&env);

    // A locked rebase: libostree stages it, the record is what rpm-ostree leaves.
    let lock = dict(&[("lock-finalization", Value::from(true))]);
    let signals = env.rebase(&registry_ref(env.rhel10()), &lock).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    let staged = &deployments[0];
    assert!(bool_of(staged, "staged") && !bool_of(staged, "booted"));
    assert_eq!(
        string_of(staged, "container-image-reference-digest"),
        env.rhel10().digest
    );
    assert!(
        !staged.contains_key("finalization-locked"),
        "no legacy file"
    );
    let serial = match staged.get("serial").map(|v| &**v) {
        Some(Value::I32(s)) => *s,
        other => panic!("serial: {other:?}"),
    };
    let name = format!("{}.{serial}", string_of(staged, "checksum"));
    let record = env.staged_record().expect("libostree's record");
    assert_eq!(name_of(&record, "target"), name);
    assert_eq!(name_of(&record, "merge-deployment"), booted_name);
    assert_eq!(locked(&record), Some(true));
    assert_eq!(
        strv(&record, "kargs"),
        booted_options,
        "the merge deployment's"
    );
    assert_eq!(strv(&record, "overlay-initrds"), Vec::<String>::new());
    assert!(
        !env.legacy_lock_file().exists(),
        "the CLI's legacy file is gone"
    );
    assert_eq!(
        entries(&env),
        before,
        "a staged deployment has no bootloader entry"
    );
    assert!(
        env.dir
            .join(format!("sysroot/ostree/deploy/rhcos/deploy/{name}"))
            .is_dir()
    );

    // FinalizeDeployment unlocks through libostree; the model reads the key back.
    let _logind = testbed::fakes::logind::FakeLogind::start(&env.bus.address, Box::new(|| Ok(())))
        .await
        .expect("fake logind");
    let addr = os_call(
        &env.client,
        "FinalizeDeployment",
        &(dict(&[(
            "checksum",
            Value::from(env.rhel10().digest.as_str()),
        )]),),
    )
    .await
    .expect("FinalizeDeployment")
    .body()
    .deserialize::<String>()
    .expect("address");
    env.run_to_success(&addr).await;
    assert_eq!(locked(&env.staged_record().expect("record")), Some(false));

    // The shutdown's finalization is libostree's: it writes the entry that boots.
    let fake = env.fake.as_ref().expect("fake");
    let out = fake.simulate_reboot(false).await.expect("reboot");
    assert!(out.applied, "{out:?}");
    assert_eq!(out.booted_digest, env.rhel10().digest);
    assert!(env.staged_record().is_none());
    assert_eq!(entries(&env), before + 1);
    let deployments = env.deployments().await;
    assert!(bool_of(&deployments[0], "booted"));
    assert_eq!(
        format!("{}.{serial}", string_of(&deployments[0], "checksum")),
        name
    );

    // The legacy file as libostree's staging alone leaves it: a first stage keeps someone
    // else's, a stage over a previous one unlinks it.
    std::fs::write(env.legacy_lock_file(), b"").expect("legacy file");
    let signals = env.rebase(&registry_ref(env.rhel9()), &lock).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    assert!(env.legacy_lock_file().exists(), "a first stage keeps it");
    let docker_ref = format!("ostree-unverified-image:docker://{}", env.rhel9().pullspec);
    let signals = env.rebase(&docker_ref, &lock).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    assert!(
        !env.legacy_lock_file().exists(),
        "a stage over one unlinks it"
    );
    let record = env.staged_record().expect("record");
    let restaged = name_of(&record, "target");
    assert_eq!(env.deployments().await.len(), 3, "staged, booted, rollback");

    // Cleanup removes it through libostree: the record and the deployment go.
    env.cleanup_pending().await;
    assert!(env.staged_record().is_none());
    assert!(
        !env.dir
            .join(format!("sysroot/ostree/deploy/rhcos/deploy/{restaged}"))
            .exists()
    );
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    assert!(deployments.iter().all(|d| !bool_of(d, "staged")));

    // An unlocked stage boots: libostree finalizes it and the old rollback is pruned through
    // libostree, the new deployment taken as booted.
    let signals = env.rebase(&registry_ref(env.rhel9()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let out = fake.simulate_reboot(false).await.expect("reboot");
    assert!(out.applied, "{out:?}");
    assert_eq!(out.booted_digest, env.rhel9().digest);
    assert_eq!(env.deployments().await.len(), 2, "booted and one rollback");

    // A locked stage is skipped by libostree's own finalization, and goes with `/run`.
    let signals = env.rebase(&registry_ref(env.rhel10()), &lock).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let out = fake.simulate_reboot(false).await.expect("reboot");
    assert!(!out.applied && out.discarded, "{out:?}");
    assert_eq!(out.booted_digest, env.rhel9().digest);
    assert!(env.staged_record().is_none());
    assert_eq!(env.deployments().await.len(), 2);
}
