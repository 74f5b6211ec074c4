//! `streamctl`: the admin's view of streamd on the host.

#![forbid(unsafe_code)]
// Functions fit on a screen (threshold 100 in clippy.toml); the tests' crates are not held to it.
#![warn(clippy::too_many_lines)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[path = "streamctl/man.rs"]
mod man;

use streamd::cluster::protocol::{CheckId, Mode};
use streamd::cluster::status::{Status, StatusDocument};
use streamd::dbus_api::BUS_NAME;
use streamd::text::printable;

/// Shows and steers streamd on this host.
///
/// Exit codes: 0 success; 1 the request failed (or, for preflight and plan, a check failed); 2 a
/// usage error (an unknown command or flag); 3 streamd could not be reached (not running, or no
/// system bus); 4 the checks could not run (preflight and plan: an invalid request, or a fact
/// the daemon could not read).
#[derive(Debug, Parser)]
#[command(name = "streamctl", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the node's streams, images, state and reason.
    Status {
        /// Print the stable JSON document (docs/protocol.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Ask the daemon to re-evaluate the node now.
    Reconcile,
    /// Run the preflight checks for a request (default: the node's current one) and print a
    /// table. Exit code 0: all pass; 1: a check fails; 4: the checks could not run.
    Preflight {
        #[command(flatten)]
        request: RequestArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Generate man pages or shell completions.
    #[command(subcommand, hide = true)]
    Generate(GenerateCommand),
    /// Print the exact rpm-ostree `UpdateDeployment` call the daemon would make for a request,
    /// without making it. Exit code 1 when preflight refuses the request.
    Plan {
        #[command(flatten)]
        request: RequestArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `streamctl config …`.
#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate config fragments: the given files or directories, else the daemon's default
    /// directories. Errors carry file:line:column. Exit code 0 valid, 1 invalid.
    Check {
        /// Files or directories to check.
        paths: Vec<std::path::PathBuf>,
    },
}

/// `streamctl generate …` (used by packaging).
#[derive(Debug, Subcommand)]
enum GenerateCommand {
    /// Write man pages (streamctl.8, one per subcommand, and streamd.conf.5) into DIR.
    Man {
        /// Output directory.
        dir: std::path::PathBuf,
    },
    /// Write the completion script for SHELL into DIR.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
        /// Output directory.
        dir: std::path::PathBuf,
    },
}

/// A request to check instead of the node's current one.
#[derive(Debug, clap::Args)]
struct RequestArgs {
    /// Stream name, e.g. rhel-10.
    #[arg(long)]
    stream: Option<String>,
    /// Digest-pinned OS image.
    #[arg(long)]
    os_image: Option<String>,
    /// Digest-pinned extensions image.
    #[arg(long)]
    extensions_image: Option<String>,
}

impl RequestArgs {
    fn to_map(&self) -> std::collections::HashMap<String, String> {
        [
            ("stream", &self.stream),
            ("os-image", &self.os_image),
            ("extensions-image", &self.extensions_image),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
        .collect()
    }
}

/// Exit code when the daemon is unreachable (2 is clap's usage error).
const EXIT_UNREACHABLE: u8 = 3;
/// Exit code when preflight or plan could not run its checks.
const EXIT_CANNOT_CHECK: u8 = 4;

#[zbus::proxy(
    interface = "io.openshift.OSStream1",
    default_service = "io.openshift.OSStream1",
    default_path = "/io/openshift/OSStream1"
)]
trait OSStream1 {
    fn reconcile(&self) -> zbus::Result<()>;
    fn preflight(&self, inputs: std::collections::HashMap<String, String>) -> zbus::Result<String>;
    #[zbus(property)]
    fn status(&self) -> zbus::Result<String>;
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Local commands need no daemon.
    match &args.command {
        Command::Config(ConfigCommand::Check { paths }) => return config_check(paths),
        Command::Generate(g) => {
            return match generate(g) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("streamctl: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("streamctl: cannot start: {e}");
            return ExitCode::from(EXIT_UNREACHABLE);
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(Failure::Unreachable(msg)) => {
            eprintln!("streamctl: {}", printable(&msg));
            ExitCode::from(EXIT_UNREACHABLE)
        }
        Err(Failure::Failed(msg)) => {
            eprintln!("streamctl: {}", printable(&msg));
            ExitCode::FAILURE
        }
        Err(Failure::CannotCheck(msg)) => {
            eprintln!("streamctl: {}", printable(&msg));
            ExitCode::from(EXIT_CANNOT_CHECK)
        }
    }
}

/// Why a command did not succeed; each has its own exit code.
enum Failure {
    /// The daemon or the bus could not be reached.
    Unreachable(String),
    /// The daemon refused or the request failed.
    Failed(String),
    /// Preflight or plan could not run its checks.
    CannotCheck(String),
}

async fn proxy() -> Result<OSStream1Proxy<'static>, Failure> {
    let conn = zbus::Connection::system().await.map_err(|e| {
        Failure::Unreachable(format!(
            "cannot connect to the system bus ({e}); is dbus running and DBUS_SYSTEM_BUS_ADDRESS right?"
        ))
    })?;
    let dbus = zbus::fdo::DBusProxy::new(&conn)
        .await
        .map_err(|e| Failure::Unreachable(format!("cannot talk to the system bus: {e}")))?;
    let name = zbus::names::BusName::try_from(BUS_NAME)
        .map_err(|e| Failure::Failed(format!("internal: bad bus name: {e}")))?;
    if !dbus.name_has_owner(name).await.unwrap_or(false) {
        return Err(Failure::Unreachable(
            "streamd is not running (nobody owns io.openshift.OSStream1 on the system bus); \
             start it with `systemctl start streamd` and check `journalctl -u streamd`"
                .into(),
        ));
    }
    OSStream1Proxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(|e| Failure::Unreachable(format!("cannot reach streamd: {e}")))
}

async fn run(args: Args) -> Result<ExitCode, Failure> {
    let p = proxy().await?;
    match args.command {
        Command::Status { json } => {
            let raw = p
                .status()
                .await
                .map_err(|e| explain("reading the status", &e))?;
            let doc: StatusDocument = serde_json::from_str(&raw).map_err(|e| {
                Failure::Failed(format!("streamd sent a status this streamctl cannot read ({e}); are both the same version?"))
            })?;
            if json {
                println!("{}", printable(&raw));
            } else {
                print!("{}", render(&doc.status));
            }
        }
        Command::Reconcile => {
            p.reconcile()
                .await
                .map_err(|e| explain("asking for a reconcile", &e))?;
            println!("streamd will re-evaluate the node now");
        }
        Command::Preflight { request, json } => {
            let answer = dry_run(&p, &request).await?;
            if json {
                println!("{}", printable(&answer.to_string()));
            } else {
                print!("{}", render_checks(&answer));
            }
            let failed = answer["checks"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["result"] == "fail"));
            return Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        Command::Config(_) | Command::Generate(_) => {}
        Command::Plan { request, json } => {
            let answer = dry_run(&p, &request).await?;
            let plan = &answer["plan"];
            if plan.is_null() {
                eprint!("{}", render_checks(&answer));
                eprintln!("streamctl: preflight refuses this request; there is no plan");
                return Ok(ExitCode::FAILURE);
            }
            if json {
                println!("{}", printable(&plan.to_string()));
            } else if answer["backend"] == "bootc" {
                let image = printable(
                    plan["modifiers"]["set-refspec"]
                        .as_str()
                        .and_then(streamd::backend::deployment::pullspec_of_refspec)
                        .unwrap_or_default(),
                );
                if answer["locks"] == true {
                    println!(
                        "bootc switch --transport registry {image}, then bootc upgrade --download-only (held), in transient units; once the reboot is approved bootc upgrade --from-downloaded, then logind Reboot"
                    );
                } else {
                    println!(
                        "bootc switch --transport registry {image} in a transient unit, once the reboot is approved (then logind Reboot)"
                    );
                }
            } else {
                println!(
                    "UpdateDeployment on the booted OS object (then FinalizeDeployment once the reboot is approved)"
                );
                for (section, v) in [
                    ("modifiers", &plan["modifiers"]),
                    ("options", &plan["options"]),
                ] {
                    println!("{section}:");
                    for (k, val) in v.as_object().into_iter().flatten() {
                        println!("  {:<26} {}", printable(k), printable(&val.to_string()));
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates config fragments the way the daemon loads them.
fn config_check(paths: &[std::path::PathBuf]) -> ExitCode {
    use streamd::config;
    let mut bad = 0;
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    for p in paths {
        if p.is_file() {
            files.push(p.clone());
        } else if p.is_dir() {
            dirs.push(p.clone());
        } else {
            // Neither a file nor a directory is a mistake, not an empty configuration.
            bad += 1;
            eprintln!("{}: no such file or directory", p.display());
        }
    }
    let dirs = if paths.is_empty() {
        config::DEFAULT_DIRS
            .iter()
            .map(std::path::PathBuf::from)
            .collect()
    } else {
        dirs
    };
    let mut checked = 0;
    for f in &files {
        checked += 1;
        let result = std::fs::read_to_string(f)
            .map_err(|e| format!("{}: {e}", f.display()))
            .and_then(|t| config::parse_fragment(f, &t).map_err(|e| e.to_string()));
        if let Err(e) = result {
            bad += 1;
            eprintln!("{e}");
        }
    }
    if !dirs.is_empty() {
        match config::load(&dirs) {
            Ok(cfg) => checked += cfg.sources.len(),
            Err(e) => {
                bad += 1;
                eprintln!("{e}");
            }
        }
    }
    if bad == 0 {
        println!("configuration is valid ({checked} file(s) checked)");
        ExitCode::SUCCESS
    } else {
        eprintln!("streamctl: the configuration is invalid; streamd would refuse to start");
        ExitCode::FAILURE
    }
}

/// Writes man pages or completions.
fn generate(g: &GenerateCommand) -> std::io::Result<()> {
    use clap::CommandFactory;
    let cmd = Args::command();
    match g {
        GenerateCommand::Man { dir } => man::write_all(cmd, dir),
        GenerateCommand::Completions { shell, dir } => {
            std::fs::create_dir_all(dir)?;
            let mut cmd = cmd;
            clap_complete::generate_to(*shell, &mut cmd, "streamctl", dir).map(|_| ())
        }
    }
}

/// Asks the daemon for preflight results and the plan; a daemon-side error means the checks
/// could not run.
async fn dry_run(
    p: &OSStream1Proxy<'_>,
    request: &RequestArgs,
) -> Result<serde_json::Value, Failure> {
    let raw = p
        .preflight(request.to_map())
        .await
        .map_err(|e| explain("running preflight", &e))?;
    let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| {
        Failure::CannotCheck(format!(
            "streamd sent an answer this streamctl cannot read ({e})"
        ))
    })?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(Failure::CannotCheck(format!(
            "preflight could not run: {e}"
        ))),
        None => Ok(v),
    }
}

/// The preflight table.
fn render_checks(answer: &serde_json::Value) -> String {
    let mut out = format!("{:<19} {:<6} {}\n", "CHECK", "RESULT", "MESSAGE");
    for c in answer["checks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<19} {:<6} {}\n",
            printable(c["id"].as_str().unwrap_or("?")),
            printable(c["result"].as_str().unwrap_or("?")),
            printable(c["message"].as_str().unwrap_or(""))
        ));
    }
    out
}

fn explain(what: &str, e: &zbus::Error) -> Failure {
    match e {
        zbus::Error::MethodError(name, msg, _)
            if name.as_str() == "org.freedesktop.DBus.Error.AccessDenied" =>
        {
            Failure::Failed(format!(
                "{what}: permission denied ({}); run streamctl as root",
                msg.clone().unwrap_or_default()
            ))
        }
        zbus::Error::MethodError(_, msg, _) => Failure::Failed(format!(
            "{what}: streamd refused: {}",
            msg.clone().unwrap_or_default()
        )),
        other => Failure::Unreachable(format!("{what}: {other}")),
    }
}

fn ids(checks: &[CheckId]) -> String {
    checks
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn or_none(v: &Option<String>) -> &str {
    v.as_deref().filter(|s| !s.is_empty()).unwrap_or("(none)")
}

/// The text `streamctl status` prints.
fn render(s: &Status) -> String {
    let state = match s.progress {
        Some(p) => format!("{} ({p}%)", s.state),
        None => s.state.to_string(),
    };
    let (arch, backend) = s
        .host
        .as_ref()
        .map_or(("?".into(), "?"), |h| (h.arch.clone(), h.backend.as_str()));
    let changed = i64::try_from(s.last_change)
        .ok()
        .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t).ok())
        .map_or_else(
            || "unknown".into(),
            |t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string(),
        );
    let mut out = String::new();
    // Every value may come from outside (annotations, registries): shown, never acted on.
    let mut line = |k: &str, v: &str| out.push_str(&format!("{k:<14}{}\n", printable(v)));
    line("Node:", &s.node);
    line("State:", &state);
    line(
        "Mode:",
        match s.mode {
            Mode::Manage => "manage (streamd stages and reboots on requests)",
            Mode::Readiness => "readiness (streamd never stages or reboots here; it reports)",
        },
    );
    line("Reason:", if s.reason.is_empty() { "-" } else { &s.reason });
    if !s.failed_checks.is_empty() {
        line("Failed:", &ids(&s.failed_checks));
    }
    for (stream, r) in &s.readiness {
        let verdict = if r.ready {
            "ready".to_string()
        } else if r.failed.is_empty() {
            format!("unknown: {}", r.reason)
        } else {
            format!("not ready ({}): {}", ids(&r.failed), r.reason)
        };
        line("Readiness:", &format!("{stream}  {verdict}"));
    }
    line(
        "Booted:",
        &format!("{}  {}", s.current_stream, s.current_os_image),
    );
    line("Staged:", or_none(&s.staged_os_image));
    line(
        "Desired:",
        &format!(
            "{}  {}",
            or_none(&s.desired_stream),
            or_none(&s.desired_os_image)
        ),
    );
    line("Extensions:", or_none(&s.desired_extensions_image));
    let reboot = match (&s.reboot_requested, s.reboot_approved) {
        (Some(t), true) => format!("approved ({t})"),
        (Some(t), false) => format!("requested, waiting for approval: reboot-approved={t}"),
        (None, _) => "not requested".into(),
    };
    let attempts = if s.attempts > 0 {
        format!(", attempt {}", s.attempts)
    } else {
        String::new()
    };
    line("Reboot:", &format!("{reboot}{attempts}"));
    line("Backend:", &format!("{backend} ({arch})"));
    if let Some(h) = &s.host {
        let fips = match h.fips {
            streamd::host::facts::Fips::Enabled => "enabled",
            streamd::host::facts::Fips::Disabled => "disabled",
            streamd::host::facts::Fips::Inconsistent => "INCONSISTENT",
        };
        let kernel = h
            .kernel
            .map_or("unknown (overrides and running kernel disagree)", |k| {
                k.as_str()
            });
        let level = h
            .x86_64_level
            .map(|l| format!(", x86-64-v{l}"))
            .unwrap_or_default();
        line("Host:", &format!("FIPS {fips}, kernel {kernel}{level}"));
    }
    line("Last change:", &changed);
    if let Some(e) = &s.last_error {
        line("Last error:", e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamd::cluster::protocol::State;

    #[test]
    fn render_shows_every_field() {
        let s = Status {
            node: "worker-0".into(),
            state: State::Staging,
            progress: Some(42),
            current_stream: "rhel-9".into(),
            current_os_image: "r/a@sha256:1".into(),
            desired_stream: Some("rhel-10".into()),
            desired_os_image: Some("r/a@sha256:2".into()),
            last_change: 0,
            host: Some(streamd::host::facts::HostFacts {
                arch: "x86_64".into(),
                backend: streamd::backend::BackendKind::RpmOstree,
                fips: streamd::host::facts::Fips::Enabled,
                fips_sources: Default::default(),
                kernel: Some(streamd::backend::KernelVariant::Realtime),
                x86_64_level: Some(3),
                secure_boot: Some(false),
                bootloader_updated: None,
            }),
            last_error: Some("preflight check cpu-level failed: old".into()),
            reboot_requested: Some("abc.123".into()),
            attempts: 1,
            ..Status::default()
        };
        let text = render(&s);
        for want in [
            "Node:         worker-0",
            "State:        Staging (42%)",
            "Booted:       rhel-9  r/a@sha256:1",
            "Staged:       (none)",
            "Desired:      rhel-10  r/a@sha256:2",
            "Last change:  1970-01-01 00:00:00 UTC",
            "Host:         FIPS enabled, kernel realtime, x86-64-v3",
            "Last error:   preflight check cpu-level failed: old",
            "Reboot:       requested, waiting for approval: reboot-approved=abc.123, attempt 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(text.contains("Mode:         manage"), "{text}");
        assert!(!text.contains("Failed:"), "{text}");
        let refused = Status {
            mode: Mode::Readiness,
            failed_checks: vec![CheckId::CpuLevel, CheckId::Fips],
            readiness: [
                (
                    "rhel-10".to_string(),
                    streamd::cluster::protocol::Readiness {
                        ready: false,
                        failed: vec![CheckId::CpuLevel],
                        reason: "x86-64-v2".into(),
                        os_image: String::new(),
                        checked: String::new(),
                    },
                ),
                (
                    "rhel-9".to_string(),
                    streamd::cluster::protocol::Readiness {
                        ready: true,
                        failed: Vec::new(),
                        reason: String::new(),
                        os_image: String::new(),
                        checked: String::new(),
                    },
                ),
            ]
            .into(),
            ..s.clone()
        };
        let text = render(&refused);
        for want in [
            "Mode:         readiness",
            "Failed:       cpu-level, fips",
            "Readiness:    rhel-10  not ready (cpu-level): x86-64-v2",
            "Readiness:    rhel-9  ready",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let approved = Status {
            reboot_approved: true,
            ..s
        };
        assert!(render(&approved).contains("Reboot:       approved (abc.123), attempt 1"));
    }

    #[test]
    fn what_comes_from_outside_is_shown_escaped() {
        let s = Status {
            reason: "refused\nWATCHDOG=trigger \u{1b}[2J\u{1b}]0;owned\u{07}".into(),
            desired_stream: Some("rhel-10\u{1b}[8m".into()),
            last_error: Some("\u{9b}31mred".into()),
            ..Status::default()
        };
        let text = render(&s);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{9b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(
            text.contains(r"Reason:       refused\nWATCHDOG=trigger \u{1b}[2J\u{1b}]0;owned\u{7}"),
            "{text}"
        );
        assert!(text.contains(r"rhel-10\u{1b}[8m"), "{text}");
        assert!(text.contains(r"Last error:   \u{9b}31mred"), "{text}");
        // One printed line per field: a newline inside a value does not add a line.
        assert_eq!(
            text.lines().count(),
            render(&Status::default()).lines().count() + 1
        );
        let table = render_checks(&serde_json::json!({"checks": [
            {"id": "os-image", "result": "fail", "message": "HTTP 400: \u{1b}[31mno\nX"}
        ]}));
        assert!(table.contains(r"HTTP 400: \u{1b}[31mno\nX"), "{table}");
        assert_eq!(table.lines().count(), 2);
    }
}
