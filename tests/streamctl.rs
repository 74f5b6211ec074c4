//! streamctl as an admin meets it: on a terminal, with config files, and as packaged (man pages,
//! completions).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use testbed::scratch::ScratchDir;

fn tmp(name: &str) -> ScratchDir {
    scratch_dir("streamctl", name)
}

fn streamctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_streamctl"))
        .args(args)
        .output()
        .expect("streamctl runs")
}

#[test]
fn config_check_reports_file_line_column() {
    let d = tmp("config");
    std::fs::write(d.join("10-ok.toml"), "node-name = \"worker-0\"\n").expect("write");
    let out = streamctl(&["config", "check", d.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 file(s)"));
    let bad = d.join("20-bad.toml");
    std::fs::write(
        &bad,
        "allow-downgrade = true\nreboot-window = \"sometimes\"\n",
    )
    .expect("write");
    let out = streamctl(&["config", "check", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("20-bad.toml:2:1"), "{err}");
    assert!(err.contains("reboot-window"), "{err}");
    // A known key with a value it does not take points at the value.
    std::fs::write(&bad, "reboot = \"sometimes\"\n").expect("write");
    let out = streamctl(&["config", "check", bad.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("20-bad.toml:1:10") && err.contains("on-approval"),
        "{err}"
    );
    // A path that does not exist is an error, not an empty configuration.
    let out = streamctl(&["config", "check", "/nonexistent/streamd.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/streamd.toml: no such file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The directory form finds it too.
    let out = streamctl(&["config", "check", d.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn a_usage_error_has_its_own_exit_code() {
    // 2 is clap's usage error; streamd unreachable (3) and checks that could not run (4) are
    // asserted where a daemon is at hand (tests/e2e.rs, tests/variants.rs).
    let out = streamctl(&["statuss"]);
    assert_eq!(out.status.code(), Some(2));
    let out = streamctl(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for code in [
        "2 a usage error",
        "3 streamd could not be reached",
        "4 the checks could not run",
    ] {
        assert!(help.contains(code), "{code:?} in --help: {help}");
    }
}

#[test]
fn man_pages_and_completions_are_generated() {
    let d = tmp("generate");
    let man = d.join("man");
    let out = streamctl(&["generate", "man", man.to_str().expect("utf-8")]);
    assert!(out.status.success());
    let page = std::fs::read_to_string(man.join("streamctl.8")).expect("streamctl.8");
    assert!(page.contains(".TH streamctl 8"), "section 8:\n{page}");
    assert!(
        page.contains("Exit codes"),
        "exit codes are in the man page"
    );
    for sub in ["status", "preflight", "plan", "reconcile", "config"] {
        assert!(man.join(format!("streamctl-{sub}.8")).exists(), "{sub}");
    }
    for hidden in ["generate", "help"] {
        assert!(
            !man.join(format!("streamctl-{hidden}.8")).exists(),
            "{hidden}"
        );
    }
    let conf = std::fs::read_to_string(man.join("streamd.conf.5")).expect("streamd.conf.5");
    for key in [
        "node-name",
        "allowed-repositories",
        "heartbeat-namespace",
        "max-attempts",
    ] {
        assert!(
            conf.contains(&format!("\\fB{key}\\fR")),
            "{key} in streamd.conf(5)"
        );
    }
    // The daemon's own page, from its --help definitions.
    let out = Command::new(env!("CARGO_BIN_EXE_streamd"))
        .args(["--generate-man", man.to_str().expect("utf-8")])
        .output()
        .expect("streamd runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let daemon = std::fs::read_to_string(man.join("streamd.8")).expect("streamd.8");
    for want in [
        "streamd",
        "invalid configuration",
        "streamd.conf(5)",
        "\\-\\-node\\-name",
    ] {
        assert!(daemon.contains(want), "{want:?} in streamd(8):\n{daemon}");
    }
    let comp = d.join("completions");
    for shell in ["bash", "zsh", "fish"] {
        let out = streamctl(&[
            "generate",
            "completions",
            shell,
            comp.to_str().expect("utf-8"),
        ]);
        assert!(out.status.success(), "{shell}");
    }
    let bash = comp.join("streamctl.bash");
    assert!(
        std::fs::read_to_string(&bash)
            .expect("bash")
            .contains("preflight")
    );
    // The real bash parses it.
    let out = Command::new("bash")
        .arg("-n")
        .arg(&bash)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(comp.join("_streamctl").exists() && comp.join("streamctl.fish").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_a_terminal_under_tmux() {
    let mut env = Env::new("tmux").await;
    env.start_streamd();
    env.wait_state("Idle").await;
    let socket = format!("streamd-test-{}", std::process::id());
    let mut cmd = Command::new("tmux");
    cmd.args(["-L", &socket, "new-session", "-d", "-x", "120", "-y", "30"]);
    for (k, v) in env.vars() {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    cmd.arg(format!(
        "{} status; sleep 60",
        env!("CARGO_BIN_EXE_streamctl")
    ));
    assert!(cmd.status().expect("tmux").success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let screen = loop {
        let out = Command::new("tmux")
            .args(["-L", &socket, "capture-pane", "-p"])
            .output()
            .expect("capture");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains("Last change:") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = Command::new("tmux")
        .args(["-L", &socket, "kill-server"])
        .status();
    let node_line = format!("Node:         {}", testbed::NODE_NAME);
    assert!(screen.contains(&node_line), "{screen}");
    assert!(screen.contains("State:        Idle"), "{screen}");
    assert!(screen.contains("Booted:       rhel-9"), "{screen}");
    assert!(
        screen.contains("Backend:      rpm-ostree (x86_64)"),
        "{screen}"
    );
    assert!(!screen.contains("Error"), "{screen}");
}
