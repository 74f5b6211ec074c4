//! The fake systemd, logind and bootc of a bootc testbed host against real clients: `busctl`,
//! `dbus-send` (inside the fake bootc script), `setpriv` and zbus.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::json;
use testbed::control::{BootcCmd, InhibitMode, Inhibitor, LogindCmd, SystemdCmd, TestbedCmd};
use testbed::scratch::ScratchDir;
use testbed::{Backend, Options, Testbed};
use zbus::zvariant::{OwnedObjectPath, Value};

const WAIT: Duration = Duration::from_secs(30);
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// The members the fakes export, with the signatures of real systemd and logind
/// (org.freedesktop.systemd1(5), org.freedesktop.login1(5)): (member, kind, signature, result).
const SYSTEMD_REFERENCE: &[(&str, &str, &str, &str)] = &[
    (
        "org.freedesktop.systemd1.Manager.StartTransientUnit",
        "method",
        "ssa(sv)a(sa(sv))",
        "o",
    ),
    // bootloader-update.service is started with StartUnit.
    (
        "org.freedesktop.systemd1.Manager.StartUnit",
        "method",
        "ss",
        "o",
    ),
    (
        "org.freedesktop.systemd1.Manager.Subscribe",
        "method",
        "-",
        "-",
    ),
    (
        "org.freedesktop.systemd1.Manager.Unsubscribe",
        "method",
        "-",
        "-",
    ),
    (
        "org.freedesktop.systemd1.Manager.GetUnit",
        "method",
        "s",
        "o",
    ),
    (
        "org.freedesktop.systemd1.Manager.JobNew",
        "signal",
        "uos",
        "-",
    ),
    (
        "org.freedesktop.systemd1.Manager.JobRemoved",
        "signal",
        "uoss",
        "-",
    ),
    ("org.freedesktop.systemd1.Unit.Unref", "method", "-", "-"),
    ("org.freedesktop.systemd1.Unit.Id", "property", "s", ""),
    (
        "org.freedesktop.systemd1.Unit.Description",
        "property",
        "s",
        "",
    ),
    (
        "org.freedesktop.systemd1.Unit.LoadState",
        "property",
        "s",
        "",
    ),
    (
        "org.freedesktop.systemd1.Unit.ActiveState",
        "property",
        "s",
        "",
    ),
    (
        "org.freedesktop.systemd1.Unit.SubState",
        "property",
        "s",
        "",
    ),
    ("org.freedesktop.systemd1.Service.Type", "property", "s", ""),
    (
        "org.freedesktop.systemd1.Service.Result",
        "property",
        "s",
        "",
    ),
    (
        "org.freedesktop.systemd1.Service.ExecMainCode",
        "property",
        "i",
        "",
    ),
    (
        "org.freedesktop.systemd1.Service.ExecMainStatus",
        "property",
        "i",
        "",
    ),
    (
        "org.freedesktop.systemd1.Service.ExecMainPID",
        "property",
        "u",
        "",
    ),
    (
        "org.freedesktop.login1.Manager.ListInhibitors",
        "method",
        "-",
        "a(ssssuu)",
    ),
    ("org.freedesktop.login1.Manager.Reboot", "method", "b", "-"),
];

struct Env {
    tb: Testbed,
    conn: zbus::Connection,
    /// Last: removed once the testbed stopped.
    dir: ScratchDir,
}

impl Env {
    async fn new(name: &str) -> Env {
        let dir = ScratchDir::new(&format!("fake-bootc-{name}")).expect("scratch dir");
        let tb = Testbed::start(Options {
            backend: Backend::Bootc,
            ..Options::new(dir.to_path_buf())
        })
        .await
        .expect("testbed starts");
        let conn = zbus::connection::Builder::address(tb.bus().address())
            .expect("address")
            .build()
            .await
            .expect("connect");
        Env { tb, conn, dir }
    }

    /// Runs a program with a time limit: (exit code, stdout, stderr).
    async fn run(&self, program: &str, args: &[&str]) -> (i32, String, String) {
        let child = tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(WAIT, child)
            .await
            .unwrap_or_else(|_| panic!("{program} {args:?} timed out"))
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn busctl(&self, args: &[&str]) -> (i32, String, String) {
        let address = format!("--address={}", self.tb.bus().address());
        let mut all = vec![address.as_str()];
        all.extend_from_slice(args);
        self.run("busctl", &all).await
    }

    async fn bootc(&self, args: &[&str]) -> (i32, String, String) {
        let program = self.tb.env()["TESTBED_BOOTC"].clone();
        self.run(&program, args).await
    }
}

/// `busctl introspect` rows of the non-standard interfaces: member → (kind, signature, result).
fn introspected(table: &str) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    let mut iface = String::new();
    for line in table.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        match cols.as_slice() {
            [name, "interface", ..] => iface = name.to_string(),
            [member, kind, sig, rest @ ..] if member.starts_with('.') => {
                if iface.starts_with("org.freedesktop.DBus.") {
                    continue;
                }
                let result = if *kind == "method" {
                    rest.first().copied().unwrap_or_default().to_string()
                } else if *kind == "signal" {
                    "-".to_string()
                } else {
                    String::new()
                };
                out.push((
                    format!("{iface}{member}"),
                    kind.to_string(),
                    sig.to_string(),
                    result,
                ));
            }
            _ => {}
        }
    }
    out
}

fn mismatches(
    exported: &[(String, String, String, String)],
    reference: &[(&str, &str, &str, &str)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, kind, sig, result) in exported {
        match reference.iter().find(|r| r.0 == name) {
            None => problems.push(format!("{name} is not in the reference")),
            Some(r) if (r.1, r.2, r.3) != (kind.as_str(), sig.as_str(), result.as_str()) => {
                problems.push(format!("{name}: {kind} {sig} {result} differs from {r:?}"))
            }
            Some(_) => {}
        }
    }
    for r in reference {
        if !exported.iter().any(|e| e.0 == r.0) {
            problems.push(format!("{} is not exported", r.0));
        }
    }
    problems
}

/// A transient oneshot running `sh -c script`, referenced by the caller.
fn sh_unit(script: &str) -> Vec<(&'static str, Value<'static>)> {
    vec![
        ("Type", Value::from("oneshot")),
        (
            "ExecStart",
            Value::from(vec![(
                "/bin/sh".to_string(),
                vec!["sh".to_string(), "-c".to_string(), script.to_string()],
                false,
            )]),
        ),
        ("AddRef", Value::from(true)),
    ]
}

async fn start(
    conn: &zbus::Connection,
    name: &str,
    props: &[(&str, Value<'_>)],
) -> zbus::Result<OwnedObjectPath> {
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    conn.call_method(
        Some("org.freedesktop.systemd1"),
        "/org/freedesktop/systemd1",
        Some(MANAGER),
        "StartTransientUnit",
        &(name, "fail", props, aux),
    )
    .await?
    .body()
    .deserialize::<OwnedObjectPath>()
}

#[tokio::test]
async fn fakes_match_the_real_interfaces_and_run_units() {
    let env = Env::new("systemd").await;
    // A unit that stays loaded (referenced), so its object can be introspected.
    start(&env.conn, "hold.service", &sh_unit("exit 0"))
        .await
        .expect("start hold.service");
    let mut exported = Vec::new();
    for (service, path) in [
        ("org.freedesktop.systemd1", "/org/freedesktop/systemd1"),
        (
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1/unit/hold_2eservice",
        ),
        ("org.freedesktop.login1", "/org/freedesktop/login1"),
    ] {
        let (code, table, err) = env.busctl(&["introspect", service, path]).await;
        assert_eq!(code, 0, "{err}");
        exported.extend(introspected(&table));
    }
    let problems = mismatches(&exported, SYSTEMD_REFERENCE);
    assert!(problems.is_empty(), "{problems:#?}");
    // The comparison catches a changed signature.
    let mut mutated = SYSTEMD_REFERENCE.to_vec();
    mutated[0].2 = "ssa(sv)";
    assert_eq!(mismatches(&exported, &mutated).len(), 1);

    // No Subscribe: no JobRemoved. Then subscribed: JobRemoved "failed" for exit 3.
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface(MANAGER)
        .expect("iface")
        .build();
    let mut signals = zbus::MessageStream::for_match_rule(rule, &env.conn, None)
        .await
        .expect("match");
    start(&env.conn, "quiet.service", &sh_unit("exit 0"))
        .await
        .expect("start");
    let none = tokio::time::timeout(Duration::from_millis(500), signals.next()).await;
    assert!(none.is_err(), "a signal without Subscribe: {none:?}");
    let (code, _, err) = env
        .busctl(&[
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            MANAGER,
            "Subscribe",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    // busctl's own connection left, so subscribe this one.
    let subscribe = || {
        env.conn.call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some(MANAGER),
            "Subscribe",
            &(),
        )
    };
    subscribe().await.expect("Subscribe");
    let again = subscribe().await.expect_err("second Subscribe");
    assert!(again.to_string().contains("AlreadySubscribed"), "{again}");
    let out = env.dir.join("out.txt");
    let mut props = sh_unit("echo to-file; echo to-journal >&2; exit 3");
    props.push((
        "StandardOutputFileToTruncate",
        Value::from(out.display().to_string()),
    ));
    let job = start(&env.conn, "fails.service", &props)
        .await
        .expect("start");
    let removed = tokio::time::timeout(WAIT, async {
        while let Some(Ok(msg)) = signals.next().await {
            if msg
                .header()
                .member()
                .is_some_and(|m| m.as_str() == "JobRemoved")
            {
                let (id, path, unit, result): (u32, OwnedObjectPath, String, String) =
                    msg.body().deserialize().expect("JobRemoved args");
                if path == job {
                    return (id, unit, result);
                }
            }
        }
        panic!("signal stream ended");
    })
    .await
    .expect("JobRemoved in time");
    assert_eq!(
        (removed.1.as_str(), removed.2.as_str()),
        ("fails.service", "failed")
    );
    assert_eq!(
        std::fs::read_to_string(&out).expect("stdout file"),
        "to-file\n"
    );
    let unit_path = "/org/freedesktop/systemd1/unit/fails_2eservice";
    for (prop, want) in [
        ("Result", "s \"exit-code\""),
        ("ExecMainStatus", "i 3"),
        ("ExecMainCode", "i 1"),
        ("ActiveState", "s \"failed\""),
    ] {
        let iface = if prop == "ActiveState" {
            "org.freedesktop.systemd1.Unit"
        } else {
            "org.freedesktop.systemd1.Service"
        };
        let (code, value, err) = env
            .busctl(&[
                "get-property",
                "org.freedesktop.systemd1",
                unit_path,
                iface,
                prop,
            ])
            .await;
        assert_eq!((code, value.trim()), (0, want), "{prop}: {err}");
    }
    let units = env.tb.control(SystemdCmd::Units).await.expect("units");
    let rec = units
        .as_array()
        .expect("list")
        .iter()
        .find(|u| u["unit"] == "fails.service")
        .expect("record");
    assert_eq!(rec["journal"], "to-journal\n");

    // Real errors for what systemd refuses.
    for (name, props, want) in [
        (
            "bad name",
            sh_unit("true"),
            "org.freedesktop.DBus.Error.InvalidArgs",
        ),
        (
            "fails.service",
            sh_unit("true"),
            "org.freedesktop.systemd1.UnitExists",
        ),
        (
            "x.service",
            vec![("Bogus", Value::from(true))],
            "Cannot set property Bogus, or unknown property.",
        ),
        (
            "y.service",
            vec![("AddRef", Value::from("yes"))],
            "System.Error.ENXIO",
        ),
    ] {
        let e = start(&env.conn, name, &props).await.expect_err(name);
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
    let e = env
        .conn
        .call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some(MANAGER),
            "GetUnit",
            &("nothing.service",),
        )
        .await
        .expect_err("GetUnit");
    assert!(
        e.to_string()
            .contains("org.freedesktop.systemd1.NoSuchUnit"),
        "{e}"
    );

    // logind: a block inhibitor refuses Reboot with logind's error, and nothing is recorded.
    env.tb
        .control(LogindCmd::Inhibit(Inhibitor {
            what: "shutdown".into(),
            who: "t".into(),
            why: "w".into(),
            mode: InhibitMode::Block,
            uid: 0,
            pid: 0,
        }))
        .await
        .expect("inhibit");
    let (code, list, _) = env
        .busctl(&[
            "call",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "ListInhibitors",
        ])
        .await;
    assert_eq!(
        (code, list.trim()),
        (0, "a(ssssuu) 1 \"shutdown\" \"t\" \"w\" \"block\" 0 0")
    );
    let (code, _, err) = env
        .busctl(&[
            "call",
            "org.freedesktop.login1",
            "/org/freedesktop/login1",
            "org.freedesktop.login1.Manager",
            "Reboot",
            "b",
            "false",
        ])
        .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("Operation denied due to active block inhibitor"),
        "{err}"
    );
    let state = std::fs::read_to_string(env.dir.join("rpmostreed/state.json")).expect("state");
    assert!(state.contains("\"reboot_requested\": false"), "{state}");
}

#[tokio::test]
async fn fake_bootc_prints_the_real_shape_and_stages() {
    let env = Env::new("bootc").await;
    let rhel10 = env.tb.images()[1].clone();
    // No rpm-ostreed on a bootc host.
    let (code, owner, _) = env
        .busctl(&[
            "call",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "NameHasOwner",
            "s",
            "org.projectatomic.rpmostree1",
        ])
        .await;
    assert_eq!((code, owner.trim()), (0, "b false"));

    let (code, out, err) = env.bootc(&["status", "--format=json"]).await;
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["apiVersion"], "org.containers.bootc/v1");
    assert_eq!(doc["kind"], "BootcHost");
    assert_eq!(doc["status"]["type"], "bootcHost");
    assert_eq!(doc["status"]["staged"], json!(null));
    let booted = &doc["status"]["booted"];
    assert_eq!(booted["image"]["image"]["transport"], "registry");
    assert!(
        booted["image"]["image"].get("signature").is_none(),
        "unverified: no signature key"
    );
    assert_eq!(booted["image"]["architecture"], "amd64");
    assert_eq!(booted["ostree"]["stateroot"], "rhcos");
    for key in [
        "cachedUpdate",
        "incompatible",
        "pinned",
        "softRebootCapable",
        "downloadOnly",
        "store",
        "composefs",
    ] {
        assert!(booted.get(key).is_some(), "{key} missing: {booted}");
    }

    let (code, out, err) = env
        .bootc(&["switch", "--transport", "registry", &rhel10.pullspec])
        .await;
    // The digest ostree-ext stored: the amd64 manifest's, where the pullspec pins the index.
    let platform = env.tb.registry().os_images()[1].platforms[0].digest.clone();
    assert_ne!(platform, rhel10.digest);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "Queued for next boot: {}\n  Version: {}\n  Digest: {platform}\n",
            rhel10.pullspec, rhel10.version
        )
    );
    let (_, out, _) = env.bootc(&["status", "--json"]).await;
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let staged = &doc["status"]["staged"];
    assert_eq!(staged["image"]["imageDigest"], platform.as_str());
    assert_eq!(staged["downloadOnly"], false);
    assert_eq!(doc["spec"]["image"]["image"], rhel10.pullspec.as_str());
    assert_eq!(doc["status"]["rollback"], json!(null));
    // The same target again is a no-op, like bootc's.
    let (code, out, _) = env.bootc(&["switch", &rhel10.pullspec]).await;
    assert_eq!(
        (code, out.as_str()),
        (0, "Image specification is unchanged.\n")
    );

    let missing = format!(
        "{}/openshift/rhcos@sha256:{}",
        env.tb.registry().host(),
        "1".repeat(64)
    );
    let failures: [(&[&str], i32, &str); 6] = [
        (&["switch", &missing], 1, "error: Switching: Pulling: "),
        (
            &["switch", "--bogus", "x"],
            2,
            "unexpected argument '--bogus' found",
        ),
        (&["switch"], 2, "<TARGET>"),
        (&["frobnicate"], 2, "unrecognized subcommand 'frobnicate'"),
        (&["status", "--format", "toml"], 2, "invalid value 'toml'"),
        (
            &["switch", "--transport", "tape", "x"],
            1,
            "Unknown transport 'tape'",
        ),
    ];
    for (args, want_code, want) in failures {
        let (code, _, err) = env.bootc(args).await;
        assert_eq!(code, want_code, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (_, _, err) = env.bootc(&["switch", &missing]).await;
    assert!(err.contains("manifest unknown"), "{err}");

    // Like bootc, it needs root.
    let program = env.tb.env()["TESTBED_BOOTC"].clone();
    let (code, _, err) = env
        .run(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                &program,
                "status",
                "--format=json",
            ],
        )
        .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("This command must be executed as the root user"),
        "{err}"
    );
}

#[tokio::test]
async fn fake_bootc_prints_the_shape_of_older_releases() {
    let env = Env::new("bootc-versions").await;
    let set = |v: &str| BootcCmd::Version {
        version: Some(v.to_string()),
    };
    // v0.1.12: `--format` did not exist yet (clap's error, exit 2); `--json` did.
    env.tb.control(set("0.1.12")).await.expect("version");
    let (code, _, err) = env.bootc(&["status", "--format=json"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("error: unexpected argument '--format' found"),
        "{err}"
    );
    let (code, out, err) = env.bootc(&["status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["apiVersion"], "org.containers.bootc/v1alpha1");
    let booted = &doc["status"]["booted"];
    assert!(booted["ostree"].get("stateroot").is_none(), "{booted}");
    assert!(booted["ostree"]["checksum"].is_string(), "{booted}");
    for key in ["store", "softRebootCapable", "downloadOnly", "composefs"] {
        assert!(booted.get(key).is_none(), "{key} in {booted}");
    }
    assert!(booted["image"].get("architecture").is_none(), "{booted}");
    // v1.3.0: v1, stateroot, architecture; not yet downloadOnly.
    env.tb.control(set("1.3.0")).await.expect("version");
    let (_, out, _) = env.bootc(&["status", "--format=json"]).await;
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["apiVersion"], "org.containers.bootc/v1");
    let booted = &doc["status"]["booted"];
    assert_eq!(booted["ostree"]["stateroot"], "rhcos");
    assert_eq!(booted["image"]["architecture"], "amd64");
    assert!(booted.get("downloadOnly").is_none(), "{booted}");
    let (_, version, _) = env.bootc(&["--version"]).await;
    assert_eq!(version, "bootc 1.3.0\n");
    assert!(env.tb.control(set("1.x")).await.is_err());
}

/// libostree's legacy lock file, whoever made it: the finalization at shutdown honours it, a
/// first stage leaves it alone, staging over a previous stage unlinks it (ostree#3025), and
/// `ostree_sysroot_change_finalization` (`upgrade --download-only` / `--from-downloaded`)
/// creates and unlinks it.
#[tokio::test]
async fn the_legacy_lock_file_is_kept_dropped_and_honoured_as_libostree_does() {
    let env = Env::new("legacy-lock").await;
    let (rhel9, rhel10) = (env.tb.images()[0].clone(), env.tb.images()[1].clone());
    let run = env.dir.join("host/run/ostree");
    let lock = run.join("staged-deployment-locked");
    std::fs::create_dir_all(&run).expect("mkdir");
    std::fs::write(&lock, b"").expect("touch");
    let (code, _, err) = env.bootc(&["switch", &rhel10.pullspec]).await;
    assert_eq!(code, 0, "{err}");
    assert!(lock.exists(), "a first stage leaves the file alone");
    let (_, out, _) = env.bootc(&["status", "--json"]).await;
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        doc["status"]["staged"]["downloadOnly"],
        json!(false),
        "bootc reports the record's key only"
    );
    let rebooted = env
        .tb
        .control(TestbedCmd::Reboot {
            fail_finalize: false,
        })
        .await
        .expect("reboot");
    assert_eq!(rebooted["applied"], json!(false), "{rebooted}");
    assert_eq!(rebooted["booted"], json!(rhel9.digest), "{rebooted}");
    assert!(!lock.exists(), "/run is emptied by the reboot");

    // Staging over a previous stage unlinks it.
    let (code, _, err) = env.bootc(&["switch", &rhel10.pullspec]).await;
    assert_eq!(code, 0, "{err}");
    std::fs::write(&lock, b"").expect("touch");
    // A signed switch is another spec (so a new stage): ostree-ext takes it only under a
    // policy whose default is not insecureAcceptAnything.
    let repo = rhel10.pullspec.split('@').next().unwrap_or_default();
    std::fs::write(
        env.dir.join("host/etc/containers/policy.json"),
        json!({"default": [{"type": "reject"}],
            "transports": {"docker": {repo: [{"type": "insecureAcceptAnything"}]}}})
        .to_string(),
    )
    .expect("policy");
    let (code, _, err) = env
        .bootc(&["switch", "--enforce-container-sigpolicy", &rhel10.pullspec])
        .await;
    assert_eq!(code, 0, "{err}");
    assert!(!lock.exists(), "the previous stage's lock goes with it");

    // change_finalization: locking creates it, unlocking removes it.
    let (code, _, err) = env.bootc(&["upgrade", "--download-only"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(lock.exists());
    let (code, _, err) = env.bootc(&["upgrade", "--from-downloaded"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!lock.exists());
    let rebooted = env
        .tb
        .control(TestbedCmd::Reboot {
            fail_finalize: false,
        })
        .await
        .expect("reboot");
    assert_eq!(rebooted["applied"], json!(true), "{rebooted}");
}
