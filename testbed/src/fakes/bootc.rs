//! Fake `bootc`: the program `DIR/bin/bootc`, a small shell script that hands its arguments to
//! the testbed process over the private bus (with `dbus-send`), which runs the command against
//! the testbed host and answers with the output and exit status the script then reproduces.
//!
//! Modelled: `bootc status --format=json` and the hidden legacy `--json` (the
//! `org.containers.bootc/v1` `BootcHost` document of bootc-dev/bootc:crates/lib/src/spec.rs
//! `Host`, in the shape of the configured bootc version: see [`Version`]) and `bootc switch [--transport T]
//! [--enforce-container-sigpolicy] [--retain] [--quiet] TARGET`, which stages through the fake
//! rpm-ostreed's host model (one sysroot, one `state.json`) without a finalization lock, and
//! `bootc upgrade [--download-only | --from-downloaded]` (since v1.12.0), which locks or unlocks
//! the staged deployment of the spec's digest. All need uid 0, as the real commands do. Unknown commands and flags fail the way clap reports
//! them (exit 2); real but unmodelled ones say so (exit 2).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value as Json, json};
use tracing::info;
use zbus::fdo::DBusProxy;
use zbus::message::Header;
use zbus::{Connection, interface};

use crate::control::BootcCmd;
use crate::fakes::apiserver::clock::format_rfc3339;
use crate::fakes::bus::Bus;
use crate::fakes::registry::oci::Arch;
use crate::fakes::rpmostreed::FakeRpmOstreed;
use crate::fakes::rpmostreed::host::{
    Host, HostDeployment, ImageRef, SigVerify, StageError, Transport,
};

/// The testbed-private name the script calls.
pub const BUS_NAME: &str = "org.streamd.Testbed1.Bootc";
const PATH: &str = "/org/streamd/Testbed1/Bootc";
const INTERFACE: &str = "org.streamd.Testbed1.Bootc";
/// How long the script waits for a reply (a staging takes seconds on the testbed).
const REPLY_TIMEOUT_MS: u32 = 600_000;

/// The bootc release the fake behaves as (default 1.16.9). What changed, from bootc-dev/bootc's
/// tags (`git log -S` on lib/src/spec.rs, crates/lib/src/spec.rs and cli.rs):
/// `--format` since v0.1.13 (the hidden `--json` since v0.1), `store` since v0.1.14,
/// `apiVersion` `org.containers.bootc/v1` since v0.1.15 (5b5b5721; `v1alpha1` before), `architecture`
/// since v1.2.0, `ostree.stateroot` and `otherDeployments` since v1.3.0, `softRebootCapable`
/// since v1.7.0, `composefs` since v1.9.0, `downloadOnly` since v1.12.0, `usrOverlay` since
/// v1.14.0, `readOnly` since v1.16.7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// The newest release the fake models.
    pub const CURRENT: Version = Version(1, 16, 9);

    fn parse(s: &str) -> Option<Version> {
        let mut it = s.trim_start_matches('v').split('.').map(|p| p.parse().ok());
        let v = Version(it.next()??, it.next()??, it.next()??);
        it.next().is_none().then_some(v)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// What one command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Outcome {
    fn ok(stdout: impl Into<String>) -> Self {
        Outcome {
            stdout: stdout.into(),
            stderr: String::new(),
            code: 0,
        }
    }

    /// bootc's own errors: `error: <context chain>` and exit 1.
    fn error(chain: impl std::fmt::Display) -> Self {
        Outcome {
            stdout: String::new(),
            stderr: format!("error: {chain}\n"),
            code: 1,
        }
    }

    /// The outcome as `version` prints it: before v1.4.0 bootc's own errors went through
    /// `tracing::error!("{:#}", e)` to a `tracing_subscriber` compact formatter with ANSI on
    /// whatever stderr is (`ERROR` in red, no `error:` prefix); since v1.4.0 `run_main` writes
    /// `error: ` through anstream, which drops the colour when stderr is no terminal
    /// (bootc-dev/bootc v1.1.6 cli/src/main.rs and utils/src/tracing_util.rs; v1.4.0 cli/src/main.rs).
    fn printed_by(mut self, version: Version) -> Self {
        if version < Version(1, 4, 0)
            && self.code == 1
            && let Some(chain) = self.stderr.strip_prefix("error: ")
        {
            self.stderr = format!("\u{1b}[31mERROR\u{1b}[0m {chain}");
        }
        self
    }

    /// A command-line error as clap prints it (exit 2).
    fn usage(message: &str, usage: &str) -> Self {
        Outcome {
            stdout: String::new(),
            stderr: format!(
                "error: {message}\n\nUsage: {usage}\n\nFor more information, try '--help'.\n"
            ),
            code: 2,
        }
    }

    /// A real command or flag the fake does not model.
    fn unmodelled(what: &str) -> Self {
        Outcome {
            stdout: String::new(),
            stderr: format!("error: testbed: {what} is not modelled by the fake bootc\n"),
            code: 2,
        }
    }

    /// Shell code that reproduces the outcome.
    fn to_shell(&self) -> String {
        format!(
            "printf '%s' {}; printf '%s' {} >&2; exit {}\n",
            shell_quote(&self.stdout),
            shell_quote(&self.stderr),
            self.code
        )
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Decodes the script's arguments: each one as a netstring (`<bytes>:<arg>,`).
fn decode_args(mut s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (len, rest) = s
            .split_once(':')
            .ok_or_else(|| "malformed argument list".to_string())?;
        let len: usize = len
            .parse()
            .map_err(|_| "malformed argument length".to_string())?;
        let arg = rest
            .get(..len)
            .ok_or_else(|| "argument shorter than its length".to_string())?;
        s = rest[len..]
            .strip_prefix(',')
            .ok_or_else(|| "argument not terminated".to_string())?;
        out.push(arg.to_string());
    }
    Ok(out)
}

/// One command-line word as clap splits it: `--flag=value` is the flag and an inline value.
fn split_flag(arg: &str) -> (&str, Option<&str>) {
    match arg.split_once('=') {
        Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
        _ => (arg, None),
    }
}

/// The value of the option `name` (`--flag <VALUE>`): the inline one, else the next word; clap's
/// usage error when there is none.
fn flag_value<'a>(
    inline: Option<&str>,
    rest: &mut impl Iterator<Item = &'a String>,
    name: &str,
    usage: &str,
) -> Result<String, Outcome> {
    inline
        .map(str::to_string)
        .or_else(|| rest.next().cloned())
        .ok_or_else(|| {
            Outcome::usage(
                &format!("a value is required for '{name}' but none was supplied"),
                usage,
            )
        })
}

/// Lets any user call the fake (the script runs as its caller).
const POLICY: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <policy context="default">
    <allow send_destination="org.streamd.Testbed1.Bootc"/>
  </policy>
</busconfig>
"#;

/// The script the testbed writes to `DIR/bin/bootc`.
fn script(bus_address: &str) -> String {
    format!(
        r#"#!/bin/sh
# The testbed's fake bootc (written by the testbed; see docs/testbed.md). It hands its arguments
# to the testbed over the private bus and reproduces the output and exit status it gets back.
LC_ALL=C
export LC_ALL
args=
for a in "$@"; do
    args="$args${{#a}}:$a,"
done
reply=$(dbus-send --bus={bus} --print-reply=literal --reply-timeout={timeout} \
    --dest={name} {path} {iface}.Run string:"$args") || {{
    echo "error: the testbed behind this fake bootc is not reachable" >&2
    exit 1
}}
eval "$reply"
"#,
        bus = shell_quote(bus_address),
        timeout = REPLY_TIMEOUT_MS,
        name = BUS_NAME,
        path = PATH,
        iface = INTERFACE,
    )
}

/// A running fake bootc: its bus object and the script.
pub struct FakeBootc {
    conn: Connection,
    program: PathBuf,
    version: Arc<Mutex<Version>>,
    fail_next_switch: Arc<Mutex<Option<String>>>,
    delay_next_switch: Arc<Mutex<Option<Duration>>>,
    pause_after_next_switch: Arc<Mutex<Option<Duration>>>,
    fail_next_upgrade: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for FakeBootc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBootc").finish_non_exhaustive()
    }
}

impl FakeBootc {
    /// Owns [`BUS_NAME`] on `bus` and writes the script to `program` (mode 0755); commands
    /// act on `host`'s model. A bus policy lets every user call it, so that bootc's own root
    /// check is what refuses other users.
    pub async fn start(
        bus: &Bus,
        host: &FakeRpmOstreed,
        program: &Path,
    ) -> anyhow::Result<FakeBootc> {
        let policy = bus.policy_dir().join("testbed-bootc.conf");
        std::fs::write(&policy, POLICY).with_context(|| format!("writing {}", policy.display()))?;
        bus.reload()?;
        let bus_address = bus.address();
        let version = Arc::new(Mutex::new(Version::CURRENT));
        let fail_next_switch = Arc::new(Mutex::new(None));
        let delay_next_switch = Arc::new(Mutex::new(None));
        let pause_after_next_switch = Arc::new(Mutex::new(None));
        let fail_next_upgrade = Arc::new(Mutex::new(None));
        let iface = BootcIface {
            host: host.host(),
            version: version.clone(),
            fail_next_switch: fail_next_switch.clone(),
            delay_next_switch: delay_next_switch.clone(),
            pause_after_next_switch: pause_after_next_switch.clone(),
            fail_next_upgrade: fail_next_upgrade.clone(),
        };
        let conn = zbus::connection::Builder::address(bus_address)?
            .serve_at(PATH, iface)?
            .name(BUS_NAME)?
            .build()
            .await
            .with_context(|| format!("connecting to {bus_address} as {BUS_NAME}"))?;
        if let Some(dir) = program.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(program, script(bus_address))
            .with_context(|| format!("writing {}", program.display()))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(program, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", program.display()))?;
        info!(program = %program.display(), "fake bootc is ready");
        Ok(FakeBootc {
            conn,
            program: program.to_path_buf(),
            version,
            fail_next_switch,
            delay_next_switch,
            pause_after_next_switch,
            fail_next_upgrade,
        })
    }

    /// The script's path.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Runs one control command (see `docs/testbed.md`): `version` makes the fake behave as
    /// that release (flags and JSON shape), or only reads it, → `{"version":…}`; the others
    /// arm a one-shot knob for the next `bootc switch` or `bootc upgrade` → `{}`.
    pub fn control(&self, cmd: BootcCmd) -> anyhow::Result<Json> {
        match cmd {
            BootcCmd::Version { version } => {
                let mut current = self.version.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(text) = version {
                    *current = Version::parse(&text)
                        .with_context(|| format!("bootc version {text:?} is not X.Y.Z"))?;
                }
                return Ok(json!({ "version": current.to_string() }));
            }
            BootcCmd::FailNextSwitch { message } => arm(&self.fail_next_switch, message),
            BootcCmd::FailNextUpgrade { message } => arm(&self.fail_next_upgrade, message),
            BootcCmd::DelayNextSwitch { ms } => {
                arm(&self.delay_next_switch, Duration::from_millis(ms))
            }
            BootcCmd::PauseAfterNextSwitch { ms } => {
                arm(&self.pause_after_next_switch, Duration::from_millis(ms))
            }
        }
        Ok(json!({}))
    }
}

/// Arms a one-shot knob with `value`.
fn arm<T>(knob: &Mutex<Option<T>>, value: T) {
    *knob.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
}

impl Drop for FakeBootc {
    fn drop(&mut self) {
        let conn = self.conn.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = conn.close().await;
            });
        }
    }
}

struct BootcIface {
    host: Host,
    version: Arc<Mutex<Version>>,
    fail_next_switch: Arc<Mutex<Option<String>>>,
    delay_next_switch: Arc<Mutex<Option<Duration>>>,
    pause_after_next_switch: Arc<Mutex<Option<Duration>>>,
    fail_next_upgrade: Arc<Mutex<Option<String>>>,
}

#[interface(name = "org.streamd.Testbed1.Bootc")]
impl BootcIface {
    /// Runs one command line (netstring-encoded arguments) and returns shell code that prints
    /// its output and exits with its status.
    async fn run(
        &self,
        args: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> String {
        let outcome = match decode_args(&args) {
            Ok(argv) => {
                let uid = caller_uid(conn, &hdr).await;
                self.dispatch(&argv, uid).await
            }
            Err(e) => Outcome::error(format!("testbed: {e}")),
        };
        outcome.printed_by(self.version()).to_shell()
    }
}

async fn caller_uid(conn: &Connection, hdr: &Header<'_>) -> Option<u32> {
    let sender = hdr.sender()?.to_owned();
    let proxy = DBusProxy::new(conn).await.ok()?;
    proxy.get_connection_unix_user(sender.into()).await.ok()
}

const KNOWN_COMMANDS: [&str; 12] = [
    "upgrade",
    "switch",
    "rollback",
    "edit",
    "status",
    "usr-overlay",
    "install",
    "container",
    "image",
    "state",
    "internals",
    "help",
];

impl BootcIface {
    fn version(&self) -> Version {
        *self.version.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn dispatch(&self, argv: &[String], uid: Option<u32>) -> Outcome {
        let Some(command) = argv.first() else {
            return Outcome::usage(
                "'bootc' requires a subcommand but one was not provided",
                "bootc <COMMAND>",
            );
        };
        let rest = &argv[1..];
        let context = match command.as_str() {
            "status" => "Status",
            "switch" => "Switching",
            "upgrade" => "Upgrading",
            "--version" | "-V" => return Outcome::ok(format!("bootc {}\n", self.version())),
            other if KNOWN_COMMANDS.contains(&other) || other.starts_with('-') => {
                return Outcome::unmodelled(&format!("`bootc {other}`"));
            }
            other => {
                return Outcome::usage(
                    &format!("unrecognized subcommand '{other}'"),
                    "bootc <COMMAND>",
                );
            }
        };
        // prepare_for_write() → require_root(): uid 0 (and CAP_SYS_ADMIN).
        if uid != Some(0) {
            return Outcome::error(format!(
                "{context}: Preparing for write: Querying root privilege: This command must be \
                 executed as the root user"
            ));
        }
        match command.as_str() {
            "status" => self.status(rest),
            "upgrade" => self.upgrade(rest).await,
            _ => self.switch(rest).await,
        }
    }

    fn status(&self, args: &[String]) -> Outcome {
        const USAGE: &str = "bootc status [OPTIONS]";
        let version = self.version();
        let mut format = None;
        let mut booted_only = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = split_flag(a);
            match flag {
                // Before v0.1.13 clap knows only the (now hidden) `--json`.
                "--format" | "--format-version" if version < Version(0, 1, 13) => {
                    return Outcome::usage(&format!("unexpected argument '{flag}' found"), USAGE);
                }
                "--format" => match flag_value(inline, &mut it, "--format <FORMAT>", USAGE) {
                    Ok(v) => format = Some(v),
                    Err(usage) => return usage,
                },
                "--json" => format = Some("json".into()),
                "--format-version" => {
                    let v = match flag_value(
                        inline,
                        &mut it,
                        "--format-version <FORMAT_VERSION>",
                        USAGE,
                    ) {
                        Ok(v) => v,
                        Err(usage) => return usage,
                    };
                    if v != "0" && v != "1" {
                        return Outcome::error(format!("Status: Unsupported format version: {v}"));
                    }
                }
                "--booted" => booted_only = true,
                "-v" | "--verbose" => {}
                other => {
                    return Outcome::usage(&format!("unexpected argument '{other}' found"), USAGE);
                }
            }
        }
        match format.as_deref() {
            Some("json") => {}
            Some(f @ ("yaml" | "humanreadable")) => {
                return Outcome::unmodelled(&format!("`bootc status --format={f}`"));
            }
            // Without --format, stdout is not a terminal here, and bootc prints YAML.
            None => return Outcome::unmodelled("`bootc status` without --format=json (YAML)"),
            Some(other) => {
                return Outcome::usage(
                    &format!(
                        "invalid value '{other}' for '--format <FORMAT>'\n  [possible values: \
                         humanreadable, yaml, json]"
                    ),
                    USAGE,
                );
            }
        }
        let read = self
            .host
            .deployments()
            .and_then(|deps| Ok((deps, self.host.arch()?)));
        match read {
            Ok((deps, arch)) => {
                let doc = host_document(&deps, &arch, booted_only, version);
                Outcome::ok(format!("{doc}\n"))
            }
            Err(e) => Outcome::error(format!("Status: {e}")),
        }
    }

    /// `bootc upgrade [--quiet] [--download-only | --from-downloaded]` as
    /// bootc-dev/bootc:crates/lib/src/cli.rs `upgrade` runs it for a digest-pinned image: the
    /// image is the spec's (staged, else booted: crates/lib/src/status.rs `get_status`); when
    /// the staged deployment already has its digest, `--download-only` locks its finalization
    /// and a plain upgrade unlocks it; `--from-downloaded` unlocks without pulling. Both flags
    /// exist since v1.12.0. Staging a newer image of a tag is not modelled.
    async fn upgrade(&self, args: &[String]) -> Outcome {
        const USAGE: &str = "bootc upgrade [OPTIONS]";
        let version = self.version();
        let (mut download_only, mut from_downloaded) = (false, false);
        for a in args {
            let (flag, _) = split_flag(a);
            match flag {
                "--download-only" | "--from-downloaded" if version < Version(1, 12, 0) => {
                    return Outcome::usage(&format!("unexpected argument '{flag}' found"), USAGE);
                }
                "--download-only" => download_only = true,
                "--from-downloaded" => from_downloaded = true,
                "--quiet" => {}
                "--check" | "--apply" | "--soft-reboot" | "--tag" | "--progress-fd" => {
                    return Outcome::unmodelled(&format!("`bootc upgrade {flag}`"));
                }
                other => {
                    return Outcome::usage(&format!("unexpected argument '{other}' found"), USAGE);
                }
            }
        }
        if download_only && from_downloaded {
            return Outcome::usage(
                "the argument '--download-only' cannot be used with '--from-downloaded'",
                USAGE,
            );
        }
        let deps = match self.host.deployments() {
            Ok(d) => d,
            Err(e) => return Outcome::error(format!("Upgrading: {e}")),
        };
        let staged = deps.iter().find(|d| d.staged);
        let lock = |locked: bool, changed: &'static str| async move {
            match self.host.set_finalization_lock(locked).await {
                Ok(true) => Outcome::ok(changed),
                Ok(false) => Outcome::ok("Staged update present, not changed\n"),
                Err(e) => Outcome::error(format!("Upgrading: {e}")),
            }
        };
        if from_downloaded {
            if staged.is_none() {
                return Outcome::error("Upgrading: No staged deployment found");
            }
            return match self.host.set_finalization_lock(false).await {
                Ok(true) => Outcome::ok("Staged deployment will now be applied on reboot\n"),
                Ok(false) => Outcome::ok("Staged deployment is already set to apply on reboot\n"),
                Err(e) => Outcome::error(format!("Upgrading: {e}")),
            };
        }
        let Some(spec) = spec_image(&deps) else {
            return Outcome::error(if deps.iter().any(|d| d.layered) {
                "Upgrading: Deployment contains local rpm-ostree modifications; cannot upgrade \
                 via bootc. You can run `rpm-ostree reset` to undo the modifications."
            } else {
                "Upgrading: No image source specified"
            });
        };
        let Some((_, digest)) = spec.name.rsplit_once('@') else {
            return Outcome::unmodelled("`bootc upgrade` of an image by tag");
        };
        let injected = self
            .fail_next_upgrade
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(message) = injected {
            return Outcome::error(format!("Upgrading: Pulling: {message}"));
        }
        match staged {
            Some(s) if s.image_digest == digest && download_only => {
                lock(
                    true,
                    "Image downloaded, but will not be applied on reboot\n",
                )
                .await
            }
            Some(s) if s.image_digest == digest => {
                lock(false, "Staged deployment will now be applied on reboot\n").await
            }
            _ if deps.iter().any(|d| d.booted && d.image_digest == digest) => {
                Outcome::ok("No update available.\n")
            }
            _ => Outcome::unmodelled("`bootc upgrade` staging another image than the staged one"),
        }
    }

    async fn switch(&self, args: &[String]) -> Outcome {
        const USAGE: &str = "bootc switch [OPTIONS] <TARGET>";
        let mut transport = "registry".to_string();
        let mut signed = false;
        let mut target = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = split_flag(a);
            match flag {
                "--transport" => {
                    match flag_value(inline, &mut it, "--transport <TRANSPORT>", USAGE) {
                        Ok(t) => transport = t,
                        Err(usage) => return usage,
                    }
                }
                "--enforce-container-sigpolicy" => signed = true,
                // Accepted and without effect here: no ostree refspec origin to prune, no
                // progress bars to hide, and the deprecated no-op.
                "--retain" | "--quiet" | "--no-signature-verification" => {}
                "--apply"
                | "--soft-reboot"
                | "--mutate-in-place"
                | "--progress-fd"
                | "--experimental-unified-storage" => {
                    return Outcome::unmodelled(&format!("`bootc switch {flag}`"));
                }
                f if f.starts_with('-') && f.len() > 1 => {
                    return Outcome::usage(&format!("unexpected argument '{f}' found"), USAGE);
                }
                _ if target.is_some() => {
                    return Outcome::usage(&format!("unexpected argument '{a}' found"), USAGE);
                }
                _ => target = Some(a.clone()),
            }
        }
        let Some(target) = target else {
            return Outcome::usage(
                "the following required arguments were not provided:\n  <TARGET>",
                "bootc switch <TARGET>",
            );
        };
        let Some(transport) = Transport::parse(&transport) else {
            return Outcome::error(format!("Switching: Unknown transport '{transport}'"));
        };
        let wanted = ImageRef {
            sig: if signed {
                SigVerify::Signed
            } else {
                SigVerify::Unverified
            },
            transport,
            name: target,
        };
        let deps = match self.host.deployments() {
            Ok(d) => d,
            Err(e) => return Outcome::error(format!("Switching: {e}")),
        };
        if spec_image(&deps).as_ref() == Some(&wanted) {
            return Outcome::ok("Image specification is unchanged.\n");
        }
        let injected = self
            .fail_next_switch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(message) = injected {
            return Outcome::error(format!("Switching: Pulling: {message}"));
        }
        let delay = self
            .delay_next_switch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(delay) = delay {
            info!(?delay, "bootc switch pulls slowly");
            tokio::time::sleep(delay).await;
        }
        let staged = self.host.stage_unlocked(&wanted.to_string()).await;
        if staged.is_ok() {
            let pause = self
                .pause_after_next_switch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(pause) = pause {
                info!(?pause, "bootc switch staged; pausing before it exits");
                tokio::time::sleep(pause).await;
            }
        }
        match staged {
            Ok(staged) => Outcome::ok(format!(
                "Queued for next boot: {}\n  Version: {}\n  Digest: {}\n",
                spec_display(&wanted),
                staged.version,
                staged.digest
            )),
            Err(StageError::Pull(e)) => Outcome::error(format!("Switching: Pulling: {e}")),
            Err(StageError::Deploy(e)) => Outcome::error(format!("Switching: Staging: {e}")),
        }
    }
}

/// The image reference a deployment's origin names, when bootc can represent it (a container
/// origin without rpm-ostree layering).
fn image_of(d: &HostDeployment) -> Option<ImageRef> {
    if d.layered {
        return None;
    }
    ImageRef::parse(&d.refspec)
}

/// `spec.image`: the staged image, else the booted one.
fn spec_image(deps: &[HostDeployment]) -> Option<ImageRef> {
    deps.iter()
        .find(|d| d.staged)
        .or_else(|| deps.iter().find(|d| d.booted))
        .and_then(image_of)
}

/// bootc's `Display` of an `ImageReference`: the bare name for an unverified registry image,
/// else the ostree image reference.
fn spec_display(r: &ImageRef) -> String {
    match (&r.sig, r.transport) {
        (SigVerify::Unverified, Transport::Registry) => r.name.clone(),
        _ => r.to_string(),
    }
}

/// `ImageReference` as JSON: `signature` is omitted for an unverified image.
fn image_reference_json(r: &ImageRef) -> Json {
    let mut v = json!({ "image": r.name, "transport": r.transport.as_str() });
    match &r.sig {
        SigVerify::Unverified => {}
        SigVerify::Signed => v["signature"] = json!("containerPolicy"),
        SigVerify::Remote(remote) => v["signature"] = json!({ "ostreeRemote": remote }),
    }
    v
}

/// The OCI architecture name of an RPM architecture.
fn oci_arch(rpm_arch: &str) -> &str {
    Arch::from_rpm(rpm_arch).map_or(rpm_arch, |a| a.oci())
}

/// RFC 3339 UTC time of `secs` since the epoch.
fn rfc3339(secs: u64) -> String {
    format_rfc3339(i64::try_from(secs).unwrap_or(i64::MAX))
}

/// Removes the keys `version` does not print yet.
fn since(v: &mut Json, version: Version, fields: &[(&str, Version)]) {
    if let Some(map) = v.as_object_mut() {
        for (key, first) in fields {
            if version < *first {
                map.remove(*key);
            }
        }
    }
}

fn boot_entry(d: &HostDeployment, arch: &str, version: Version) -> Json {
    let image = image_of(d).map(|r| {
        let mut image = json!({
            "image": image_reference_json(&r),
            "version": d.version,
            "timestamp": rfc3339(d.timestamp),
            "imageDigest": d.digest,
            "architecture": oci_arch(arch),
        });
        since(&mut image, version, &[("architecture", Version(1, 2, 0))]);
        image
    });
    let mut ostree = json!({
        "stateroot": d.osname,
        "checksum": d.checksum,
        "deploySerial": d.serial,
    });
    since(&mut ostree, version, &[("stateroot", Version(1, 3, 0))]);
    let mut entry = json!({
        "image": image,
        "cachedUpdate": null,
        "incompatible": d.layered,
        "pinned": d.pinned,
        "softRebootCapable": false,
        "downloadOnly": d.staged && d.finalization_locked,
        "store": "ostreeContainer",
        "ostree": ostree,
        "composefs": null,
    });
    since(
        &mut entry,
        version,
        &[
            ("store", Version(0, 1, 14)),
            ("softRebootCapable", Version(1, 7, 0)),
            ("composefs", Version(1, 9, 0)),
            ("downloadOnly", Version(1, 12, 0)),
        ],
    );
    entry
}

/// The `BootcHost` document `bootc status --format=json` prints.
fn host_document(deps: &[HostDeployment], arch: &str, booted_only: bool, version: Version) -> Json {
    let booted_at = deps.iter().position(|d| d.booted);
    let booted = booted_at.map(|i| &deps[i]);
    let staged = deps.iter().find(|d| d.staged);
    let rollback = booted_at.and_then(|b| {
        deps.iter()
            .skip(b + 1)
            .find(|d| Some(&d.osname) == booted.map(|x| &x.osname))
    });
    let listed = [staged, booted, rollback];
    let others: Vec<Json> = deps
        .iter()
        .filter(|d| {
            !listed
                .iter()
                .any(|l| l.is_some_and(|l| std::ptr::eq(l, *d)))
        })
        .map(|d| boot_entry(d, arch, version))
        .collect();
    // `--booted` is `filter_to_slot(Slot::Booted)`: it drops staged and rollback only.
    let (staged, rollback) = if booted_only {
        (None, None)
    } else {
        (staged, rollback)
    };
    let booted_entry = booted.map(|d| boot_entry(d, arch, version));
    let booted_has_image = booted.and_then(image_of).is_some();
    let mut status = json!({
        "staged": staged.map(|d| boot_entry(d, arch, version)),
        "booted": booted_entry,
        "rollback": rollback.map(|d| boot_entry(d, arch, version)),
        "rollbackQueued": false,
        "type": if booted_has_image { json!("bootcHost") } else { Json::Null },
        "usrOverlay": null,
        "readOnly": false,
    });
    if !others.is_empty() && version >= Version(1, 3, 0) {
        status["otherDeployments"] = Json::Array(others);
    }
    since(
        &mut status,
        version,
        &[
            ("usrOverlay", Version(1, 14, 0)),
            ("readOnly", Version(1, 16, 7)),
        ],
    );
    json!({
        "apiVersion": if version >= Version(0, 1, 15) {
            "org.containers.bootc/v1"
        } else {
            "org.containers.bootc/v1alpha1"
        },
        "kind": "BootcHost",
        "metadata": { "name": "host" },
        "spec": {
            "image": spec_image(deps).map(|r| image_reference_json(&r)),
            "bootOrder": "default",
        },
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip_through_netstrings() {
        let args = ["switch", "a,b:c", "", "ünï"];
        let encoded: String = args.iter().map(|a| format!("{}:{a},", a.len())).collect();
        assert_eq!(decode_args(&encoded).expect("decode"), args);
        for bad in ["3:ab,", "x:ab,", "2:abc", "2"] {
            assert!(decode_args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn errors_are_printed_as_each_version_prints_them() {
        let e = || Outcome::error("Switching: Pulling: x");
        assert_eq!(
            e().printed_by(Version(1, 3, 0)).stderr,
            "\u{1b}[31mERROR\u{1b}[0m Switching: Pulling: x\n"
        );
        assert_eq!(
            e().printed_by(Version(1, 4, 0)).stderr,
            "error: Switching: Pulling: x\n"
        );
        // clap's usage errors (exit 2) never went through tracing.
        let usage = Outcome::usage("bad", "bootc <COMMAND>").printed_by(Version(1, 1, 6));
        assert!(usage.stderr.starts_with("error: bad"), "{}", usage.stderr);
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_793_491_200), "2026-11-01T00:00:00Z");
        assert_eq!(rfc3339(951_827_696), "2000-02-29T12:34:56Z");
    }

    #[test]
    fn shell_reply_quotes_everything() {
        let o = Outcome {
            stdout: "it's $HOME `x`\n".into(),
            stderr: String::new(),
            code: 3,
        };
        assert_eq!(
            o.to_shell(),
            "printf '%s' 'it'\\''s $HOME `x`\n'; printf '%s' '' >&2; exit 3\n"
        );
    }
}
