//! Transactions of the fake rpm-ostreed: staging, joining, failures, crashes, finalization, progress.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use testbed::control::{InhibitMode, Inhibitor, LogindCmd, RpmOstreedCmd};
use testbed::fakes::rpmostreed::FakeRpmOstreed;
use testbed::fixtures::images::DEFAULT_REGISTRY;
use zbus::MessageStream;
use zbus::message::Message;
use zbus::zvariant::{self, Value};

use super::{
    BUS_NAME, Dict, Env, GIO_BUSY, GIO_FAILED, GIO_NOT_FOUND, OS, OS_PATH, Peer, SYSROOT,
    SYSROOT_PATH, WAIT, bool_of, connect, dbus_error, dict, handles, os_call, prop, rebase_to,
    registry_ref, sig_of, string_of, update_deployment,
};

#[tokio::test]
async fn rebase_transaction_stages_a_locked_deployment() {
    let env = Env::new().await;
    os_call(&env.client, "GetDeploymentBootConfig", &("", false))
        .await
        .expect("boot config");
    env.client
        .call_method(
            Some(BUS_NAME),
            SYSROOT_PATH,
            Some(SYSROOT),
            "RegisterClient",
            &(dict(&[("id", Value::from("streamd-test"))]),),
        )
        .await
        .expect("RegisterClient");

    // The booted deployment has the real keys and types.
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1);
    let booted = &deployments[0];
    for (key, sig) in [
        ("id", "s"),
        ("osname", "s"),
        ("serial", "i"),
        ("checksum", "s"),
        ("booted", "b"),
        ("staged", "b"),
        ("pinned", "b"),
        ("unlocked", "s"),
        ("base-commit-meta", "a{sv}"),
        ("packages", "as"),
        ("base-removals", "av"),
        ("base-local-replacements", "a(vv)"),
        ("base-remote-replacements", "a{sv}"),
        ("requested-packages", "as"),
        ("requested-local-packages", "as"),
        ("requested-local-fileoverride-packages", "as"),
        ("requested-base-removals", "as"),
        ("requested-base-local-replacements", "as"),
        ("regenerate-initramfs", "b"),
        ("version", "s"),
        ("timestamp", "t"),
        ("container-image-reference", "s"),
        ("container-image-reference-digest", "s"),
    ] {
        assert_eq!(sig_of(booted, key), sig, "type of {key}");
    }
    assert!(
        !booted.contains_key("origin"),
        "container deployments have no origin"
    );
    assert!(!booted.contains_key("finalization-locked"));
    assert!(bool_of(booted, "booted"));
    assert_eq!(string_of(booted, "osname"), "rhcos");
    assert_eq!(string_of(booted, "unlocked"), "none");
    let checksum = string_of(booted, "checksum");
    assert_eq!(checksum.len(), 64);
    assert_eq!(string_of(booted, "id"), format!("rhcos-{checksum}.0"));
    assert_eq!(
        string_of(booted, "container-image-reference"),
        registry_ref(env.rhel9())
    );
    assert_eq!(
        string_of(booted, "container-image-reference-digest"),
        env.rhel9().digest
    );
    let meta = Dict::try_from(booted["base-commit-meta"].clone()).expect("a{sv}");
    assert_eq!(
        string_of(&meta, "ostree.manifest-digest"),
        env.rhel9().digest
    );
    let config: serde_json::Value =
        serde_json::from_str(&string_of(&meta, "ostree.container.image-config")).expect("json");
    assert_eq!(
        config["config"]["Labels"]["io.openshift.os.streamclass"],
        "rhel-9"
    );

    let booted_path = prop(&env.client, SYSROOT_PATH, SYSROOT, "Booted").await;
    assert_eq!(
        &*booted_path,
        &Value::from(zvariant::ObjectPath::from_static_str_unchecked(OS_PATH))
    );

    // Watch property changes the way a caching proxy would.
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.freedesktop.DBus.Properties")
        .expect("interface")
        .member("PropertiesChanged")
        .expect("member")
        .path(SYSROOT_PATH)
        .expect("path")
        .build();
    let mut changes = MessageStream::for_match_rule(rule, &env.client, Some(64))
        .await
        .expect("match rule");

    // Create the transaction.
    let modifiers = rebase_to(env.rhel10());
    let options = dict(&[
        ("lock-finalization", Value::from(true)),
        ("initiating-command-line", Value::from("streamd rebase")),
    ]);
    let addr = update_deployment(&env.client, &modifiers, &options)
        .await
        .expect("UpdateDeployment");
    assert_eq!(addr, format!("unix:path={}", env.socket().display()));
    let unique = env.client.unique_name().expect("unique name").to_string();
    assert_eq!(
        env.active_transaction().await,
        ("UpdateDeployment".to_string(), unique, OS_PATH.to_string())
    );
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    assert_eq!(&*path, &Value::from(addr.as_str()));

    let mut peer = Peer::connect(&addr).await;
    assert_eq!(&*peer.prop("Title").await, &Value::from("new-deployment"));
    let who = String::try_from(peer.prop("InitiatingClientDescription").await).expect("s");
    assert!(who.starts_with("client(id:streamd-test dbus:1."), "{who}");
    assert!(who.ends_with(" uid:0)"), "{who}");
    assert!(peer.start().await);
    assert!(
        !peer.start().await,
        "a second Start() does not start it again"
    );
    let signals = peer.until_finished().await;
    assert_eq!(signals.finished, Some((true, String::new())));

    let messages = signals.strings("Message");
    let imgref = registry_ref(env.rhel10());
    assert_eq!(messages[0], format!("Pulling manifest: {imgref}"));
    assert_eq!(
        messages[1],
        format!("Importing: {imgref} (digest: {})", env.rhel10().digest)
    );
    assert_eq!(messages[2], "ostree chunk layers needed: 12 (1.2 GB)");
    let tasks = signals.strings("TaskBegin");
    assert_eq!(tasks.len(), 13, "{tasks:?}");
    // As rpm-ostree v2026.2 printed it beside the project: from 1, 19 hex digits, no `sha256:`.
    let chunk = tasks[0]
        .strip_prefix("[1/12] Fetching ostree chunk ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_default();
    assert!(
        chunk.len() == 19 && chunk.bytes().all(|b| b.is_ascii_hexdigit()),
        "{tasks:?}"
    );
    assert!(tasks[0].ends_with(" (100.0 MB)"), "{tasks:?}");
    assert_eq!(tasks[12], "Staging deployment");
    assert!(
        signals.percents().is_empty(),
        "a container pull reports layer tasks only"
    );
    assert_eq!(signals.count("ProgressEnd"), 1);
    assert_eq!(
        signals.all.last().map(|(m, _)| m.as_str()),
        Some("Finished")
    );
    assert_eq!(&*peer.prop("Title").await, &Value::from("streamd rebase"));

    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    let staged = &deployments[0];
    assert!(bool_of(staged, "staged"));
    assert!(!bool_of(staged, "booted"));
    assert_eq!(
        string_of(staged, "container-image-reference-digest"),
        env.rhel10().digest
    );
    assert_eq!(string_of(staged, "container-image-reference"), imgref);
    assert_eq!(string_of(staged, "version"), env.rhel10().version);
    // rpm-ostree >= v2024.6 reports no `finalization-locked`: the lock is only libostree's
    // `locked` key in /run/ostree/staged-deployment, and no legacy lock file exists.
    assert!(!staged.contains_key("finalization-locked"), "{staged:?}");
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked").map(|v| &**v), Some(&Value::Bool(true)));
    let target = Dict::try_from(record["target"].try_clone().expect("clone")).expect("a{sv}");
    assert_eq!(
        string_of(&target, "name"),
        format!(
            "{}.{}",
            string_of(staged, "checksum"),
            i32::try_from(&*staged["serial"]).expect("i")
        )
    );
    assert_eq!(string_of(&target, "osname"), "rhcos");
    // What rpm-ostree v2025.5 passes besides the lock: the booted deployment as the merge
    // deployment, its kernel arguments, and an empty `overlay-initrds`.
    let merge =
        Dict::try_from(record["merge-deployment"].try_clone().expect("clone")).expect("a{sv}");
    assert_eq!(
        string_of(&merge, "name"),
        format!(
            "{}.{}",
            string_of(&deployments[1], "checksum"),
            i32::try_from(&*deployments[1]["serial"]).expect("i")
        )
    );
    let strs = |key: &str| -> Vec<String> {
        record[key]
            .try_clone()
            .expect("clone")
            .try_into()
            .expect("as")
    };
    assert!(
        strs("kargs").iter().any(|a| a.starts_with("ostree=")),
        "{:?}",
        strs("kargs")
    );
    assert!(strs("overlay-initrds").is_empty());
    assert!(!env.legacy_lock_file().exists());
    assert!(bool_of(&deployments[1], "booted"));
    let default =
        Dict::try_from(prop(&env.client, OS_PATH, OS, "DefaultDeployment").await).expect("a{sv}");
    assert_eq!(string_of(&default, "id"), string_of(staged, "id"));

    let changed = tokio::time::timeout(WAIT, async {
        while let Some(Ok(msg)) = changes.next().await {
            let (_, props, _): (String, Dict, Vec<String>) =
                msg.body().deserialize().expect("(sa{sv}as)");
            if let Some(v) = props.get("Deployments") {
                return Vec::<Dict>::try_from(v.clone()).expect("aa{sv}").len();
            }
        }
        0
    })
    .await
    .expect("PropertiesChanged for Deployments");
    assert_eq!(changed, 2);

    // A client that starts a finished transaction is told how it ended, on its own connection.
    let mut late = Peer::connect(&addr).await;
    assert!(!late.start().await);
    assert_eq!(
        late.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop(late);
    assert_eq!(env.active_transaction().await.0, "UpdateDeployment");

    // Dropping the last peer releases the transaction at once.
    drop(peer);
    env.wait_idle().await;
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    assert_eq!(&*path, &Value::from(""));

    let records = env.control(RpmOstreedCmd::Transactions).await;
    let record = &records[0];
    assert_eq!(record["method"], "UpdateDeployment");
    assert_eq!(record["modifiers"]["set-refspec"], imgref);
    assert_eq!(record["options"]["lock-finalization"], true);
    assert_eq!(record["title"], "streamd rebase");
    assert_eq!(record["fds"], 0);
    assert_eq!(record["started"], true);
    assert_eq!(record["result"], json!({"ok": true, "message": ""}));
    assert_eq!(record["cancelled"], false);

    let json = env.control(RpmOstreedCmd::Deployments).await;
    assert_eq!(
        json[0]["container-image-reference-digest"],
        env.rhel10().digest
    );
    assert_eq!(json[0].get("finalization-locked"), None);
    let on_disk = env.state_on_disk();
    assert_eq!(on_disk["deployments"][0]["staged"], true);
}

#[tokio::test]
async fn busy_error_and_joining() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::HoldForeign { on: true }).await;
    assert_eq!(env.active_transaction().await.0, "Upgrade");
    let modifiers = rebase_to(env.rhel10());
    let options = Dict::new();
    let (name, message) = dbus_error(update_deployment(&env.client, &modifiers, &options).await);
    assert_eq!(name, GIO_BUSY);
    assert_eq!(
        message,
        "Transaction in progress: upgrade\n You can cancel the current transaction with `rpm-ostree cancel`"
    );
    let (name, _) = dbus_error(os_call(&env.client, "Cleanup", &(vec!["pending-deploy"],)).await);
    assert_eq!(name, GIO_BUSY);
    // The foreign transaction can be watched like `rpm-ostree` does: attach, Start, wait.
    let path = prop(&env.client, SYSROOT_PATH, SYSROOT, "ActiveTransactionPath").await;
    let mut watcher = Peer::connect(&String::try_from(path).expect("s")).await;
    assert!(!watcher.start().await, "someone else started it");
    env.control(RpmOstreedCmd::HoldForeign { on: false }).await;
    assert_eq!(
        watcher.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop(watcher);
    env.wait_idle().await;

    // An identical request joins the running transaction.
    env.control(RpmOstreedCmd::Slow { ms: 400 }).await;
    let addr = update_deployment(&env.client, &modifiers, &options)
        .await
        .expect("UpdateDeployment");
    let mut first = Peer::connect(&addr).await;
    assert!(first.start().await);
    let other = connect(&env.bus.address).await;
    let joined = update_deployment(&other, &modifiers, &options)
        .await
        .expect("join");
    assert_eq!(joined, addr);
    let mut second = Peer::connect(&joined).await;
    assert!(!second.start().await, "joining does not start it again");
    // A different request is refused, naming the running transaction.
    let different = dict(&[("reboot", Value::from(false))]);
    let (name, message) = dbus_error(update_deployment(&other, &modifiers, &different).await);
    assert_eq!(name, GIO_BUSY);
    assert!(
        message.starts_with("Transaction in progress: rebase\n"),
        "{message}"
    );

    assert_eq!(
        first.until_finished().await.finished,
        Some((true, String::new()))
    );
    assert_eq!(
        second.until_finished().await.finished,
        Some((true, String::new()))
    );
    drop((first, second));
    env.wait_idle().await;
    let records = env.control(RpmOstreedCmd::Transactions).await;
    let ok: Vec<_> = records
        .as_array()
        .expect("array")
        .iter()
        .filter(|r| r["error"].is_null())
        .collect();
    assert_eq!(ok.len(), 1, "{records:#}");
    assert_eq!(ok[0]["joined"], 1);
}

#[tokio::test]
async fn caller_leaving_before_start_drops_the_transaction() {
    let env = Env::new().await;
    let caller = connect(&env.bus.address).await;
    let modifiers = rebase_to(env.rhel10());
    update_deployment(&caller, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    assert_eq!(env.active_transaction().await.0, "UpdateDeployment");
    caller.close().await.expect("close");
    env.wait_idle().await;

    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
    let records = env.control(RpmOstreedCmd::Transactions).await;
    assert_eq!(records[0]["dropped"], true);
    assert_eq!(records[0]["started"], false);
    assert_eq!(records[1]["result"]["ok"], true);
}

#[tokio::test]
async fn failures_inside_transactions() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::FailNext {
        message: "injected failure".into(),
    })
    .await;
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(
        signals.finished,
        Some((false, "injected failure".to_string()))
    );

    let unknown = format!(
        "ostree-unverified-registry:{DEFAULT_REGISTRY}/openshift/rhcos@sha256:{}",
        "0".repeat(64)
    );
    let signals = env.rebase(&unknown, &Dict::new()).await;
    let (ok, message) = signals.finished.expect("finished");
    assert!(!ok);
    assert!(
        message.ends_with(&format!(
            "reading manifest sha256:{} in 127.0.0.1:5000/openshift/rhcos: manifest unknown",
            "0".repeat(64)
        )),
        "{message}"
    );

    let signals = env.rebase(&registry_ref(env.rhel9()), &Dict::new()).await;
    assert_eq!(
        signals.finished,
        Some((
            false,
            format!("Old and new refs are equal: {}", registry_ref(env.rhel9()))
        ))
    );

    let signals = env
        .rebase("fedora:fedora/x86_64/coreos/stable", &Dict::new())
        .await;
    assert_eq!(
        signals.finished,
        Some((false, "Remote \"fedora\" not found".to_string()))
    );
    assert_eq!(env.deployments().await.len(), 1, "nothing was staged");
}

#[tokio::test]
async fn method_argument_errors() {
    let env = Env::new().await;
    // Two `ah` indices, one descriptor attached. zvariant gives every handle a descriptor of
    // its own, so serialize two and point the second index at the first descriptor.
    let files = [
        std::fs::File::open("/dev/null").expect("/dev/null"),
        std::fs::File::open("/dev/null").expect("/dev/null"),
    ];
    let handles = handles(&files);
    let modifiers: HashMap<&str, Value<'_>> =
        HashMap::from([("install-local-packages", Value::from(handles))]);
    let body = (modifiers, HashMap::<&str, Value<'_>>::new());
    let ctxt = zvariant::serialized::Context::new_dbus(zvariant::LE, 0);
    let data = zvariant::to_bytes(ctxt, &body).expect("serialize");
    assert_eq!(data.fds().len(), 2);
    let mut bytes = data.bytes().to_vec();
    // Layout: array length, padding, key, "ah" signature, array length 8, then the indices.
    assert_eq!(&bytes[40..52], &[8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    bytes[48] = 0;
    let fd = data.fds()[0].as_fd().try_clone_to_owned().expect("dup");
    let msg = Message::method_call(OS_PATH, "UpdateDeployment")
        .expect("call")
        .destination(BUS_NAME)
        .expect("destination")
        .interface(OS)
        .expect("interface")
        .endian(zvariant::LE);
    // SAFETY: the body was serialized for exactly this signature, endianness and descriptor.
    // A raw, malformed body is what this test sends: the one unsafe call of the testbed's tests.
    #[allow(unsafe_code)]
    let msg =
        unsafe { msg.build_raw_body(&bytes, "(a{sv}a{sv})", vec![fd.into()]) }.expect("build");
    let serial = msg.primary_header().serial_num();
    let mut replies = MessageStream::from(&env.client);
    env.client.send(&msg).await.expect("send");
    let reply = tokio::time::timeout(WAIT, async {
        while let Some(Ok(m)) = replies.next().await {
            if m.header().reply_serial() == Some(serial) {
                return m;
            }
        }
        panic!("no reply");
    })
    .await
    .expect("reply in time");
    // The real daemon validates in `deploy_transaction_execute`, after Start().
    assert_eq!(reply.header().error_name(), None, "{reply:?}");
    let addr = reply.body().deserialize::<String>().expect("address");
    let mut peer = Peer::connect(&addr).await;
    assert!(peer.start().await);
    assert_eq!(
        peer.until_finished().await.finished,
        Some((false, "Expected 2 fds but received 1".to_string()))
    );
    drop(peer);
    env.wait_idle().await;

    // A wrongly typed option is ignored (g_variant_dict_lookup with a mismatched type): a
    // `lock-finalization` sent as a string stages unlocked.
    let options = dict(&[("lock-finalization", Value::from("true"))]);
    assert_eq!(
        env.update(&rebase_to(env.rhel10()), &options)
            .await
            .finished,
        Some((true, String::new()))
    );
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(record.get("locked"), None, "staged unlocked");
    env.cleanup_pending().await;

    let (name, message) = dbus_error(os_call(&env.client, "Cleanup", &(vec!["bogus"],)).await);
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_FAILED, "Invalid cleanup type: bogus")
    );

    let (name, message) = dbus_error(
        env.client
            .call_method(
                Some(BUS_NAME),
                SYSROOT_PATH,
                Some(SYSROOT),
                "GetOS",
                &("nope",),
            )
            .await,
    );
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_NOT_FOUND, "OS name \"nope\" not found")
    );
    // `GetOS("")` kills the real daemon (seen on v2025.5): the caller is told no reply came.
    let (name, _) = dbus_error(
        env.client
            .call_method(Some(BUS_NAME), SYSROOT_PATH, Some(SYSROOT), "GetOS", &("",))
            .await,
    );
    assert_eq!(name, "org.freedesktop.DBus.Error.NoReply");
    let path = env
        .client
        .call_method(
            Some(BUS_NAME),
            SYSROOT_PATH,
            Some(SYSROOT),
            "GetOS",
            &("rhcos",),
        )
        .await
        .expect("GetOS")
        .body()
        .deserialize::<zvariant::OwnedObjectPath>()
        .expect("o");
    assert_eq!(path.as_str(), OS_PATH);

    let (name, message) =
        dbus_error(os_call(&env.client, "GetDeploymentBootConfig", &("7", false)).await);
    assert_eq!(name, "org.projectatomic.rpmostreed.Error.Failed");
    assert_eq!(message, "Out of range deployment index 7, expected < 1");
    let records = env.control(RpmOstreedCmd::Transactions).await;
    let refused: Vec<&str> = records
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["error"].as_str())
        .collect();
    assert!(
        refused.iter().any(|e| e.starts_with(GIO_FAILED)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn daemon_crash_mid_transaction() {
    let env = Env::new().await;
    let dbus = zbus::fdo::DBusProxy::new(&env.client).await.expect("proxy");
    let owner = dbus
        .get_name_owner(BUS_NAME.try_into().expect("name"))
        .await
        .expect("owner");
    env.control(RpmOstreedCmd::ExitMidTransaction).await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    let started = Instant::now();
    assert!(peer.start().await);
    let signals = peer.until_finished().await;
    assert_eq!(
        signals.finished, None,
        "the peer connection closes without Finished"
    );
    loop {
        let now = dbus
            .get_name_owner(BUS_NAME.try_into().expect("name"))
            .await;
        if now.as_ref().is_ok_and(|o| *o != owner) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "name never re-owned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(env.deployments().await.len(), 1, "nothing was staged");
    assert_eq!(env.active_transaction().await.0, "");
    assert_eq!(
        env.control(RpmOstreedCmd::Transactions).await[0]["crashed"],
        true
    );
    // The restarted daemon works.
    let signals = env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(signals.finished, Some((true, String::new())));
}

#[tokio::test]
async fn cleanup_cancel_and_restart() {
    let mut env = Env::new().await;
    env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(env.deployments().await.len(), 2);

    // The staged deployment survives a restart of the daemon.
    drop(env.fake.take());
    env.fake = Some(FakeRpmOstreed::start(env.config()).await.expect("restart"));
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 2);
    assert!(bool_of(&deployments[0], "staged"));

    env.cleanup_pending().await;
    let deployments = env.deployments().await;
    assert_eq!(deployments.len(), 1);
    assert!(bool_of(&deployments[0], "booted"));

    // Reload() picks up an edit of state.json made behind the daemon's back.
    let state_file = env.dir.join("state/state.json");
    let mut on_disk = env.state_on_disk();
    on_disk["deployments"][0]["pinned"] = json!(true);
    std::fs::write(&state_file, on_disk.to_string()).expect("write");
    assert!(!bool_of(&env.deployments().await[0], "pinned"));
    env.client
        .call_method(Some(BUS_NAME), SYSROOT_PATH, Some(SYSROOT), "Reload", &())
        .await
        .expect("Reload");
    assert!(bool_of(&env.deployments().await[0], "pinned"));

    // Cancel stops a running transaction before it stages anything.
    env.control(RpmOstreedCmd::Slow { ms: 5000 }).await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    assert!(peer.start().await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled_at = Instant::now();
    peer.call("Cancel").await.expect("Cancel");
    let signals = peer.until_finished().await;
    assert_eq!(
        signals.finished,
        Some((false, "Operation was cancelled".to_string()))
    );
    assert!(cancelled_at.elapsed() < Duration::from_secs(2));
    assert_eq!(env.deployments().await.len(), 1);
}

#[tokio::test]
async fn finalize_deployment_checks_and_reboots() {
    let env = Env::new().await;
    let finalize = |options: Dict| {
        let client = env.client.clone();
        async move {
            let addr = os_call(&client, "FinalizeDeployment", &(options,))
                .await?
                .body()
                .deserialize::<String>()?;
            let mut peer = Peer::connect(&addr).await;
            assert!(peer.start().await);
            let finished = peer.until_finished().await.finished;
            drop(peer);
            Ok::<_, zbus::Error>(finished.expect("finished"))
        }
    };
    // FinalizeDeployment's options: the base checksum the caller expects to be staged.
    let expect_checksum = |checksum: &str| dict(&[("checksum", Value::from(checksum))]);
    let digest = env.rhel10().digest.clone();
    // rpm-ostreed asks logind for inhibitors before it reboots.
    let logind = testbed::fakes::logind::FakeLogind::start(&env.bus.address, Box::new(|| Ok(())))
        .await
        .expect("fake logind");

    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (false, "No pending staged deployment found".to_string())
    );
    env.wait_idle().await;
    env.rebase(&registry_ref(env.rhel10()), &Dict::new()).await;
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (false, "Staged deployment already unlocked".to_string())
    );
    env.wait_idle().await;
    // Checksum, then inhibitors, then the lock (finalize_deployment_transaction_execute):
    // a block inhibitor is reported even for an unlocked deployment.
    logind
        .control(LogindCmd::Inhibit(Inhibitor {
            what: "shutdown".into(),
            who: "early".into(),
            why: "first".into(),
            mode: InhibitMode::Block,
            uid: 0,
            pid: 0,
        }))
        .await
        .expect("inhibit");
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (
            false,
            "Reboot blocked by a systemd inhibitor lock in `block` mode\nHeld by: early\nReason: first"
                .to_string()
        )
    );
    env.wait_idle().await;
    logind
        .control(LogindCmd::Release {
            who: "early".into(),
        })
        .await
        .expect("release");

    // Another spelling of the same image is a different ref, so it can be staged (locked).
    let docker_ref = format!("ostree-unverified-image:docker://{}", env.rhel10().pullspec);
    let locked = dict(&[("lock-finalization", Value::from(true))]);
    assert_eq!(
        env.rebase(&docker_ref, &locked).await.finished,
        Some((true, String::new()))
    );
    assert_eq!(
        finalize(expect_checksum("sha256:wrong"))
            .await
            .expect("finalize"),
        (
            false,
            format!("Expected staged base checksum sha256:wrong, but found {digest}")
        )
    );
    env.wait_idle().await;
    assert_eq!(
        finalize(Dict::new()).await.expect("finalize"),
        (false, "Missing expected checksum".to_string())
    );
    env.wait_idle().await;
    // `vardict_lookup_ptr (options, "checksum", "&s")` finds nothing of another type: the
    // checksum must be a string (`s`), as streamd sends it; bytes count as missing.
    assert_eq!(
        finalize(dict(&[("checksum", Value::from(digest.as_bytes()))]))
            .await
            .expect("finalize"),
        (false, "Missing expected checksum".to_string())
    );
    env.wait_idle().await;
    // A block-mode shutdown inhibitor stops it with rpm-ostree's message; a delay one does not.
    for (who, mode) in [
        ("backup", InhibitMode::Block),
        ("updater", InhibitMode::Delay),
    ] {
        logind
            .control(LogindCmd::Inhibit(Inhibitor {
                what: "shutdown".into(),
                who: who.to_string(),
                why: "busy".into(),
                mode,
                uid: 0,
                pid: 0,
            }))
            .await
            .expect("inhibit");
    }
    assert_eq!(
        finalize(expect_checksum(&digest))
            .await
            .expect("finalize"),
        (
            false,
            "Reboot blocked by a systemd inhibitor lock in `block` mode\nHeld by: backup\nReason: busy"
                .to_string()
        )
    );
    env.wait_idle().await;
    logind
        .control(LogindCmd::Release {
            who: "backup".into(),
        })
        .await
        .expect("release");
    assert_eq!(
        finalize(expect_checksum(&digest)).await.expect("finalize"),
        (true, String::new())
    );
    env.wait_idle().await;

    let staged = &env.deployments().await[0];
    assert!(bool_of(staged, "staged"));
    assert!(!staged.contains_key("finalization-locked"), "unlocked");
    // ostree_sysroot_change_finalization rewrote the record unlocked: `locked` false, kept
    // (seen on real rpm-ostree v2025.5 / libostree 2025.2), not dropped.
    let record = env.staged_record().expect("/run/ostree/staged-deployment");
    assert_eq!(
        record.get("locked").map(|v| &**v),
        Some(&Value::Bool(false))
    );
    let on_disk = env.state_on_disk();
    assert_eq!(on_disk["reboot_requested"], true);
    let last = env.last_record().await;
    assert_eq!(last["method"], "FinalizeDeployment");
    assert_eq!(last["reboot_requested"], true);
    // A reboot is pending: the daemon takes no new transactions.
    let (name, message) =
        dbus_error(os_call(&env.client, "Cleanup", &(vec!["pending-deploy"],)).await);
    assert_eq!(
        (name.as_str(), message.as_str()),
        (GIO_FAILED, "Reboot initiated, cannot start new transaction")
    );
}

#[tokio::test]
async fn progress_at_a_thousand_signals_per_second() {
    let env = Env::new().await;
    env.control(RpmOstreedCmd::Progress {
        signals: 1000,
        per_second: 1000,
    })
    .await;
    let modifiers = rebase_to(env.rhel10());
    let addr = update_deployment(&env.client, &modifiers, &Dict::new())
        .await
        .expect("UpdateDeployment");
    let mut peer = Peer::connect(&addr).await;
    let started = Instant::now();
    assert!(peer.start().await);
    let signals = peer.until_finished().await;
    let elapsed = started.elapsed();
    assert_eq!(signals.finished, Some((true, String::new())));
    let percents = signals.percents();
    assert_eq!(percents.len(), 1000);
    assert!(percents.windows(2).all(|w| w[0] <= w[1]), "monotonic");
    assert_eq!(percents.last(), Some(&100));
    assert!(
        elapsed >= Duration::from_millis(900),
        "{elapsed:?}: paced at 1000/s"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}
