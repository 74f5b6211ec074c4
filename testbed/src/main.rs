//! `testbed`: runs the streamd testbed (see docs/testbed.md).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt as _;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

use testbed::bench::strategy::{Simulated, Strategy};
use testbed::control::{Request, TestbedCmd};
use testbed::harness::control_socket::control_client;
use testbed::{
    Backend, FeatureSet, Fleet, FleetOptions, OpenShift, Options, RpmOstreeVersion, Testbed,
};

/// The streamd testbed: a private dbus-daemon, a fake rpm-ostreed and a fake Kubernetes API
/// server, for the demo and the end-to-end tests.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a testbed in the background and wait until it answers; prints the env file's path.
    Up {
        /// Directory for all state, sockets and the env file.
        #[arg(long)]
        dir: PathBuf,
        /// Host fixture: default, fips, realtime, fips-realtime, 64k-aarch64, old-cpu, runc,
        /// low-disk, layered, realtime-image, mcd, secureboot, layered-image,
        /// realtime-layered-image, mcd-layered-usbguard, mcd-realtime, mcd-wasm,
        /// mcd-osimageurl-override, mcd-streamd-rpm, mcd-kata, mcd-secureboot.
        #[arg(long, default_value = "default")]
        host: String,
        /// The host's OS update tool: rpm-ostree (rpm-ostreed on the bus) or bootc (no
        /// rpm-ostreed; bootc through systemd).
        #[arg(long, value_enum, default_value = "rpm-ostree")]
        backend: Backend,
        /// The rpm-ostree release the fake rpm-ostreed plays: 2025.5 (RHEL 10.0's; finalizes by
        /// base commit, counts layers from 0) to 2026.2 (finalizes by image digest).
        #[arg(long = "rpm-ostree", default_value_t = RpmOstreeVersion::NEWEST)]
        rpm_ostree: RpmOstreeVersion,
        /// The OpenShift release played: 4.21, 4.22 or 4.23 (the machine-config operator whose
        /// release annotation the node's rendered MachineConfig carries, and the OSImageStream
        /// version its API server serves).
        #[arg(long, default_value_t = OpenShift::default())]
        openshift: OpenShift,
        /// The cluster's feature set: Default (4.21 and 4.22 then serve no OSImageStream) or
        /// TechPreviewNoUpgrade [default: TechPreviewNoUpgrade on 4.21 and 4.22, Default on
        /// 4.23].
        #[arg(long = "feature-set")]
        feature_set: Option<FeatureSet>,
        /// Stage, lock, finalize and clean up through real libostree 2025.x, Debian trixie's
        /// `ostree` in the root scripts/setup.sh makes (root only; single node, rpm-ostree
        /// backend).
        #[arg(long = "real-libostree")]
        real_libostree: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Run a testbed in the foreground until SIGTERM (what `up` starts).
    Serve {
        /// Directory for all state, sockets and the env file.
        #[arg(long)]
        dir: PathBuf,
        /// Host fixture (see `up`).
        #[arg(long, default_value = "default")]
        host: String,
        /// The host's OS update tool (see `up`).
        #[arg(long, value_enum, default_value = "rpm-ostree")]
        backend: Backend,
        /// The rpm-ostree release played (see `up`).
        #[arg(long = "rpm-ostree", default_value_t = RpmOstreeVersion::NEWEST)]
        rpm_ostree: RpmOstreeVersion,
        /// The OpenShift release played (see `up`).
        #[arg(long, default_value_t = OpenShift::default())]
        openshift: OpenShift,
        /// The cluster's feature set (see `up`).
        #[arg(long = "feature-set")]
        feature_set: Option<FeatureSet>,
        /// Stage through real libostree (see `up`).
        #[arg(long = "real-libostree")]
        real_libostree: bool,
        #[command(flatten)]
        fleet: FleetArgs,
    },
    /// Stop the testbed started by `up`.
    Down {
        /// The testbed's directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Run the benchmark on a fresh testbed in DIR; prints the figures and writes DIR/bench.json.
    Bench {
        /// Directory for the testbed (must not hold a running one).
        #[arg(long)]
        dir: PathBuf,
        /// The streamd binary (default: next to this testbed binary).
        #[arg(long)]
        streamd: Option<PathBuf>,
        /// Node patches for the reaction-time figure.
        #[arg(long, default_value_t = 200)]
        patches: usize,
        /// Seconds of idleness for RSS, CPU and API request figures.
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        /// Seconds of 1000 progress signals per second.
        #[arg(long, default_value_t = 30)]
        storm_secs: u64,
        /// Instead: the fleet bench — N nodes, each with its own streamd, moved from rhel-9 to
        /// rhel-10 by the real rollout controller (see docs/performance.md, "Fleet").
        #[arg(long)]
        fleet: Option<usize>,
        /// Fleet bench: the StreamPool's maxUnavailable.
        #[arg(long, default_value_t = 1, requires = "fleet")]
        max_unavailable: usize,
        /// Fleet bench: the StreamPool's maxConcurrentStaging.
        #[arg(long, default_value_t = 10, requires = "fleet")]
        max_staging: usize,
        /// Fleet bench: the streamd-rollout binary, run as two replicas under the shipped RBAC
        /// (default: next to this testbed binary).
        #[arg(long, requires = "fleet")]
        controller: Option<PathBuf>,
        /// Fleet bench: the order in which a node is moved: `stage-first`, the rollout
        /// controller's (stage while the node serves, then cordon, drain, reboot), or
        /// `drain-first`, the machine-config operator's (cordon, drain, stage, reboot), played
        /// by the bench itself (see docs/performance.md, "Stage-first against drain-first").
        #[arg(long, value_enum, default_value_t = Strategy::StageFirst, requires = "fleet")]
        strategy: Strategy,
        /// Fleet bench: seconds each node's staging takes beyond the fake's own work (a pull).
        #[arg(long, default_value_t = 0.0, requires = "fleet")]
        pull_seconds: f64,
        /// Fleet bench: seconds each node's one pod takes to stop once evicted (0: no pod).
        #[arg(long, default_value_t = 0.0, requires = "fleet")]
        drain_seconds: f64,
        /// Fleet bench: seconds a rebooting node stays down.
        #[arg(long, default_value_t = 0.5, requires = "fleet")]
        reboot_seconds: f64,
    },
    /// Reboot the testbed host: an unlocked staged deployment is applied, a locked one is
    /// discarded (as ostree-finalize-staged does), the boot id changes. Stop streamd first and
    /// start it again after, as a real reboot would.
    Reboot {
        /// The testbed's directory.
        #[arg(long)]
        dir: PathBuf,
        /// Make finalization fail at "shutdown": the node boots the old deployment again
        /// (single-node testbed only).
        #[arg(long, conflicts_with = "node")]
        fail_finalize: bool,
        /// The fleet node to reboot (a fleet testbed): it goes NotReady, its streamd stops,
        /// the host boots, the node is Ready again and its streamd restarts.
        #[arg(long)]
        node: Option<String>,
    },
    /// Send one control command (JSON) and print the reply.
    Ctl {
        /// The testbed's directory.
        #[arg(long)]
        dir: PathBuf,
        /// The command, e.g. '{"target":"rpmostreed","cmd":"transactions"}'.
        json: String,
    },
}

/// A fleet instead of a single node (`up`, `serve`).
#[derive(Debug, clap::Args)]
struct FleetArgs {
    /// Run a fleet of N node hosts (`worker-0` …), each with its own bus, fake rpm-ostreed,
    /// host root under DIR/nodes/<node> and its own streamd, against one API server and registry.
    #[arg(long)]
    nodes: Option<usize>,
    /// The streamd binary the fleet's nodes run (default: next to this testbed binary).
    #[arg(long, requires = "nodes")]
    streamd: Option<PathBuf>,
}

/// `--streamd`, or the streamd binary next to this one.
fn streamd_or_default(streamd: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    path_or_sibling(streamd, "streamd")
}

/// `path`, or the binary `name` next to this one.
/// A simulated duration from a command-line flag: finite, not negative, at most a day.
fn seconds(value: f64, flag: &str) -> anyhow::Result<Duration> {
    if !(0.0..=86_400.0).contains(&value) {
        bail!("{flag} must be between 0 and 86400 seconds, not {value}");
    }
    Ok(Duration::from_secs_f64(value))
}

fn path_or_sibling(path: Option<PathBuf>, name: &str) -> anyhow::Result<PathBuf> {
    match path {
        Some(p) => Ok(p),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("no directory for the testbed binary")?
            .join(name)),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESTBED_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("testbed: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testbed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Up {
            dir,
            host,
            backend,
            rpm_ostree,
            openshift,
            feature_set,
            real_libostree,
            fleet,
        } => {
            up(
                &dir,
                &host,
                (backend, rpm_ostree, openshift, feature_set, real_libostree),
                &fleet,
            )
            .await
        }
        Command::Serve {
            dir,
            host,
            backend,
            rpm_ostree,
            openshift,
            feature_set,
            real_libostree,
            fleet,
        } => {
            serve(
                dir,
                host,
                (backend, rpm_ostree, openshift, feature_set, real_libostree),
                fleet,
            )
            .await
        }
        Command::Down { dir } => down(&dir).await,
        Command::Bench {
            dir,
            streamd,
            patches,
            idle_secs,
            storm_secs,
            fleet,
            max_unavailable,
            max_staging,
            controller,
            strategy,
            pull_seconds,
            drain_seconds,
            reboot_seconds,
        } => {
            let streamd = streamd_or_default(streamd)?;
            if let Some(nodes) = fleet {
                let figures =
                    testbed::bench::fleet::run(&testbed::bench::fleet::FleetBenchOptions {
                        dir: dir.clone(),
                        nodes,
                        streamd,
                        controller: path_or_sibling(controller, "streamd-rollout")?,
                        max_unavailable,
                        max_staging,
                        strategy,
                        simulated: Simulated {
                            pull: seconds(pull_seconds, "--pull-seconds")?,
                            drain: seconds(drain_seconds, "--drain-seconds")?,
                            reboot: seconds(reboot_seconds, "--reboot-seconds")?,
                        },
                    })
                    .await?;
                let text = serde_json::to_string_pretty(&figures)?;
                std::fs::write(dir.join("bench-fleet.json"), &text)?;
                println!("{text}");
                return Ok(());
            }
            let figures = testbed::bench::run(&testbed::bench::BenchOptions {
                dir: dir.clone(),
                streamd,
                patches,
                idle: Duration::from_secs(idle_secs),
                storm: Duration::from_secs(storm_secs),
            })
            .await?;
            let text = serde_json::to_string_pretty(&figures)?;
            std::fs::write(dir.join("bench.json"), &text)?;
            println!("{text}");
            Ok(())
        }
        Command::Reboot {
            dir,
            fail_finalize,
            node,
        } => {
            let cmd = Request {
                command: TestbedCmd::Reboot { fail_finalize }.into(),
                node,
            };
            let reply = control_client(&dir, &cmd).await?;
            println!("{}", serde_json::to_string_pretty(&reply)?);
            Ok(())
        }
        Command::Ctl { dir, json } => {
            let cmd: serde_json::Value =
                serde_json::from_str(&json).context("the command is not JSON")?;
            let cmd: Request = serde_json::from_value(cmd).context("not a control command")?;
            let reply = control_client(&dir, &cmd).await?;
            println!("{}", serde_json::to_string_pretty(&reply)?);
            Ok(())
        }
    }
}

/// `up` and `serve`'s host tools: the backend, the rpm-ostree release, the OpenShift release
/// played, its feature set, and whether real libostree stages.
type Tools = (
    Backend,
    RpmOstreeVersion,
    OpenShift,
    Option<FeatureSet>,
    bool,
);

async fn up(dir: &Path, host: &str, tools: Tools, fleet: &FleetArgs) -> anyhow::Result<()> {
    let (backend, rpm_ostree, openshift, feature_set, real_libostree) = tools;
    if real_libostree && fleet.nodes.is_some() {
        bail!("--real-libostree is played on a single-node testbed only");
    }
    // Refuse an unknown fixture here rather than in the background process.
    testbed::fixtures::fixture(host)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let env = dir.join("env");
    let _ = std::fs::remove_file(&env);
    let log = std::fs::File::create(dir.join("serve.log")).context("creating serve.log")?;
    let exe = std::env::current_exe().context("finding the testbed binary")?;
    let mut serve = std::process::Command::new(exe);
    serve
        .args(["serve", "--dir"])
        .arg(dir)
        .args(["--host", host])
        .args(["--backend", backend_arg(backend)])
        .args(["--rpm-ostree", &rpm_ostree.to_string()])
        .args(["--openshift", &openshift.to_string()]);
    if let Some(set) = feature_set {
        serve.args(["--feature-set", &set.to_string()]);
    }
    if real_libostree {
        serve.arg("--real-libostree");
    }
    if let Some(nodes) = fleet.nodes {
        serve
            .args(["--nodes", &nodes.to_string(), "--streamd"])
            .arg(streamd_or_default(fleet.streamd.clone())?);
    }
    let mut child = serve
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: the testbed outlives the shell that ran `up`.
        .process_group(0)
        .spawn()
        .context("starting `testbed serve`")?;
    std::fs::write(dir.join("serve.pid"), format!("{}\n", child.id()))?;
    // Each fleet node sets up its own sysroot.
    let limit = Duration::from_secs(60 + 10 * fleet.nodes.unwrap_or(0) as u64);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if env.exists() {
            println!("{}", env.display());
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            bail!("`testbed serve` exited ({status}) before it was up:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "the testbed did not come up within {} s; see {}",
        limit.as_secs(),
        dir.join("serve.log").display()
    )
}

/// The `--backend` value naming `backend`.
fn backend_arg(backend: Backend) -> &'static str {
    match backend {
        Backend::RpmOstree => "rpm-ostree",
        Backend::Bootc => "bootc",
    }
}

async fn serve(dir: PathBuf, host: String, tools: Tools, fleet: FleetArgs) -> anyhow::Result<()> {
    let (backend, rpm_ostree, openshift, feature_set, real_libostree) = tools;
    if real_libostree && fleet.nodes.is_some() {
        bail!("--real-libostree is played on a single-node testbed only");
    }
    // Either runs until the signal; dropping it stops everything.
    let running: (PathBuf, Box<dyn std::any::Any>) = match fleet.nodes {
        Some(nodes) => {
            let fleet = Fleet::start(FleetOptions {
                host,
                backend,
                rpm_ostree,
                openshift,
                feature_set,
                streamd: Some(streamd_or_default(fleet.streamd)?),
                ..FleetOptions::new(dir, nodes)
            })
            .await?;
            tracing::info!(dir = %fleet.dir().display(), nodes, "fleet up");
            (fleet.dir().to_path_buf(), Box::new(fleet))
        }
        None => {
            let tb = Testbed::start(Options {
                dir,
                host,
                backend,
                rpm_ostree,
                openshift,
                feature_set,
                real_libostree,
            })
            .await?;
            tracing::info!(dir = %tb.dir().display(), "testbed up");
            (tb.dir().to_path_buf(), Box::new(tb))
        }
    };
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("testbed stopping");
    let _ = std::fs::remove_file(running.0.join("env"));
    drop(running.1);
    Ok(())
}

async fn down(dir: &Path) -> anyhow::Result<()> {
    let pid_file = dir.join("serve.pid");
    let text = std::fs::read_to_string(&pid_file).with_context(|| {
        format!(
            "reading {} (was the testbed started with `up`?)",
            pid_file.display()
        )
    })?;
    let raw: i32 = text.trim().parse().context("bad pid file")?;
    let pid = rustix::process::Pid::from_raw(raw).context("bad pid")?;
    // The whole process group: the bus daemon and anything else serve started.
    let signal_group = |sig| rustix::process::kill_process_group(pid, sig);
    if signal_group(rustix::process::Signal::TERM).is_err() {
        let _ = std::fs::remove_file(&pid_file);
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if rustix::process::test_kill_process(pid).is_err() {
            let _ = std::fs::remove_file(&pid_file);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = signal_group(rustix::process::Signal::KILL);
    let _ = std::fs::remove_file(&pid_file);
    Ok(())
}
