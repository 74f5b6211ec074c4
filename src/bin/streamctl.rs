//! `streamctl`: the admin's view of streamd on the host.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use streamd::dbus_api::BUS_NAME;
use streamd::status::{Status, StatusDocument};

/// Shows and steers streamd on this host.
///
/// Exit codes: 0 success; 1 the request failed; 2 streamd could not be reached (not running, or
/// no system bus).
#[derive(Debug, Parser)]
#[command(version)]
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
}

/// Exit code when the daemon is unreachable.
const EXIT_UNREACHABLE: u8 = 2;

#[zbus::proxy(
    interface = "io.openshift.OSStream1",
    default_service = "io.openshift.OSStream1",
    default_path = "/io/openshift/OSStream1"
)]
trait OSStream1 {
    fn reconcile(&self) -> zbus::Result<()>;
    #[zbus(property)]
    fn status(&self) -> zbus::Result<String>;
}

fn main() -> ExitCode {
    let args = Args::parse();
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
            eprintln!("streamctl: {msg}");
            ExitCode::from(EXIT_UNREACHABLE)
        }
        Err(Failure::Failed(msg)) => {
            eprintln!("streamctl: {msg}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Unreachable(String),
    Failed(String),
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
                println!("{raw}");
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
    }
    Ok(ExitCode::SUCCESS)
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
    let mut line = |k: &str, v: &str| out.push_str(&format!("{k:<14}{v}\n"));
    line("Node:", &s.node);
    line("State:", &state);
    line("Reason:", if s.reason.is_empty() { "-" } else { &s.reason });
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
    line("Backend:", &format!("{backend} ({arch})"));
    line("Last change:", &changed);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamd::protocol::State;

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
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
