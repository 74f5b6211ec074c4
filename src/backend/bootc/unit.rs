//! Running bootc commands in transient systemd units: `StartTransientUnit`, then `JobRemoved`,
//! then the unit's `Result`, with its stderr in a file; commands that write the sysroot share
//! one unit ([`WRITE_UNIT`]) and join a run that is still going.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tracing::{debug, info, warn};
use zbus::zvariant::Value;

use super::{BootcError, Client, WRITE_UNIT};
// The systemd proxies are shared with the Secure Boot bootloader update.
use crate::backend::systemd::{
    JobEnd, JobRemovedStream, ManagerProxy, ServiceProxy, UnitProxy, job_watch, wait_job,
};

/// Its stderr file, in the runtime directory (a joined run's error chain is read from it too).
const WRITE_STDERR: &str = "bootc-deploy.stderr";
/// The pause before starting again after another command's unit ended (systemd unloads it on
/// its next garbage collection).
const REJOIN_PAUSE: Duration = Duration::from_millis(200);

/// Which unit a bootc command runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// A unit of its own (`bootc status`).
    Read,
    /// [`WRITE_UNIT`].
    Write,
}

fn closed(unit: &str) -> BootcError {
    BootcError::Call {
        service: "systemd",
        call: "JobRemoved",
        message: format!("the bus connection closed while {unit} ran"),
    }
}

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";

pub(super) fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

impl Client {
    /// Runs `commands` one after the other (while they succeed) as a transient oneshot service,
    /// then `stop_post` whatever happened, and waits for its start job to end; an error unless
    /// every command exited 0. A command that writes the sysroot (`slot` [`Slot::Write`]) runs
    /// in the one unit [`WRITE_UNIT`]: while that unit is loaded (a run that outlived an earlier
    /// caller's limit, or an earlier streamd's) it is joined, never started beside; a joined
    /// run of the same commands is this call's result, another one runs once it ended.
    pub(super) async fn run_unit(
        &self,
        verb: &str,
        commands: &[Vec<String>],
        stop_post: Option<&[String]>,
        extra: &[(&str, Value<'_>)],
        limit: Duration,
        slot: Slot,
    ) -> Result<(), BootcError> {
        let call = |c: &'static str| move |e: zbus::Error| BootcError::call("systemd", c, e);
        let deadline = tokio::time::Instant::now() + limit;
        let timeout = |unit: &str| BootcError::Timeout {
            unit: unit.to_string(),
            secs: limit.as_secs(),
        };
        let manager = ManagerProxy::new(&self.conn).await.map_err(call("proxy"))?;
        // The match rule exists before the unit does, so its JobRemoved cannot be missed.
        let mut removed = job_watch(&manager).await.map_err(|(c, e)| call(c)(e))?;
        // The bootc commands in the description tell a joined run's commands from another's.
        let bootc = self.bootc.to_string_lossy();
        let shown: Vec<String> = commands
            .iter()
            .filter(|c| c.first().is_some_and(|p| *p == bootc))
            .map(|c| format!("bootc {}", c[1..].join(" ")))
            .collect();
        let shown = shown.join(" && ");
        let description = format!("streamd: {shown}");
        let stderr_file = match slot {
            Slot::Write => self.runtime_dir.join(WRITE_STDERR),
            Slot::Read => self
                .runtime_dir
                .join(format!("bootc-{verb}-{}.stderr", self.next())),
        };
        let stderr_path = stderr_file.to_string_lossy().into_owned();
        let started = Instant::now();
        let props = unit_properties(&description, commands, stop_post, extra, &stderr_path);
        let (unit, job_result) = loop {
            let unit = match slot {
                Slot::Write => WRITE_UNIT.to_string(),
                Slot::Read => format!(
                    "streamd-bootc-{verb}-{}-{}.service",
                    std::process::id(),
                    self.next()
                ),
            };
            let job = match manager
                .start_transient_unit(&unit, "fail", &props, &[])
                .await
            {
                Ok(job) => job,
                // A unit of an earlier streamd with the same pid is still loaded.
                Err(e) if error_name(&e) == Some(UNIT_EXISTS) && slot == Slot::Read => continue,
                Err(e) if error_name(&e) == Some(UNIT_EXISTS) => {
                    let joined = tokio::time::timeout_at(
                        deadline,
                        self.join(&manager, &mut removed, &unit, &description),
                    )
                    .await
                    .map_err(|_| timeout(&unit))??;
                    match joined {
                        Some(result) => break (unit, result),
                        None if tokio::time::Instant::now() >= deadline => {
                            return Err(timeout(&unit));
                        }
                        // Another command ended (or is being collected): start ours.
                        None => {
                            tokio::time::sleep(REJOIN_PAUSE).await;
                            continue;
                        }
                    }
                }
                Err(e) => return Err(call("StartTransientUnit")(e)),
            };
            info!(unit = %unit, job = %job.as_str(), command = %shown, "started bootc unit");
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match wait_job(&mut removed, &job, left).await {
                // Left running: a retry joins it (see above).
                JobEnd::TimedOut => return Err(timeout(&unit)),
                JobEnd::Closed => return Err(closed(&unit)),
                JobEnd::Removed(r) => break (unit, r),
            }
        };
        let (result, status) = self.unit_result(&unit).await;
        let stderr = read_stderr(&stderr_file);
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        debug!(unit = %unit, job_result = %job_result, result = ?result, status = ?status, elapsed_ms, "bootc unit finished");
        match (job_result.as_str(), result.as_deref()) {
            ("done", Some("success") | None) => Ok(()),
            (_, Some(r)) if r != "success" => Err(BootcError::UnitFailed {
                unit,
                result: r.to_string(),
                status: status.unwrap_or(-1),
                stderr,
            }),
            (job, _) => Err(BootcError::UnitFailed {
                unit,
                result: job.to_string(),
                status: status.unwrap_or(-1),
                stderr,
            }),
        }
    }

    /// Waits for the loaded unit `unit` to end. Returns its start job's result when it ran
    /// `description`'s command (that run is the caller's); `None` when it ran another command
    /// (our reference to it, if any, is dropped so that it goes) or is gone already.
    async fn join(
        &self,
        manager: &ManagerProxy<'_>,
        removed: &mut JobRemovedStream,
        unit: &str,
        description: &str,
    ) -> Result<Option<String>, BootcError> {
        let call = |c: &'static str| move |e: zbus::Error| BootcError::call("systemd", c, e);
        let path = match manager.get_unit(unit).await {
            Ok(p) => p,
            Err(e) if error_name(&e) == Some(NO_SUCH_UNIT) => return Ok(None),
            Err(e) => return Err(call("GetUnit")(e)),
        };
        let proxy = UnitProxy::builder(&self.conn)
            .path(path)
            .map_err(call("proxy"))?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(call("proxy"))?;
        // Read after the JobRemoved match exists: a run that ends meanwhile is not missed.
        let (Ok(state), Ok(running)) = (proxy.active_state().await, proxy.description().await)
        else {
            // Unloaded between the calls.
            return Ok(None);
        };
        let same = running == description;
        let job_result = if matches!(state.as_str(), "inactive" | "failed") {
            // Ended, kept loaded by a reference (ours, from a call that gave up waiting).
            if state == "failed" { "failed" } else { "done" }.to_string()
        } else {
            info!(unit, running = %running, "a bootc unit is still running; waiting for it instead of starting another");
            loop {
                let Some(signal) = removed.next().await else {
                    return Err(closed(unit));
                };
                let Ok(args) = signal.args() else { continue };
                if args.unit == unit {
                    break args.result;
                }
            }
        };
        if same {
            return Ok(Some(job_result));
        }
        if let Err(e) = proxy.unref().await {
            debug!(unit, error = %e, "no reference of ours to drop");
        }
        Ok(None)
    }

    /// The unit's `Result` and `ExecMainStatus`, then our reference goes; `None` when the
    /// unit is already gone.
    async fn unit_result(&self, unit: &str) -> (Option<String>, Option<i32>) {
        let read = async {
            let manager = ManagerProxy::new(&self.conn).await?;
            let path = manager.get_unit(unit).await?;
            let service = ServiceProxy::builder(&self.conn)
                .path(path.clone())?
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            let result = service.result().await?;
            let status = service.exec_main_status().await?;
            let unit_proxy = UnitProxy::builder(&self.conn).path(path)?.build().await?;
            if let Err(e) = unit_proxy.unref().await {
                debug!(unit, error = %e, "unit reference not dropped");
            }
            Ok::<_, zbus::Error>((result, status))
        };
        match read.await {
            Ok((r, s)) => (Some(r), Some(s)),
            Err(e) => {
                warn!(unit, error = %e, "could not read the unit's result");
                (None, None)
            }
        }
    }
}

/// Longest part of bootc's stderr kept for a reason (its last lines: the error chain).
const STDERR_KEEP: usize = 8 * 1024;

/// What a unit wrote to stderr, on one line (the file then goes); empty when there is none.
fn read_stderr(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    // Progress output comes first; the `error: …` chain is at the end.
    let tail = &text[text.len().saturating_sub(STDERR_KEEP)..];
    crate::text::one_line(&String::from_utf8_lossy(tail), 600)
}

/// The transient oneshot unit's properties: `commands`, then `stop_post` whatever happened,
/// bootc's stderr appended to `stderr_path`, and `extra`.
fn unit_properties<'a>(
    description: &'a str,
    commands: &[Vec<String>],
    stop_post: Option<&[String]>,
    extra: &[(&'a str, Value<'a>)],
    stderr_path: &'a str,
) -> Vec<(&'a str, Value<'a>)> {
    let exec = |cmds: &[Vec<String>]| {
        Value::from(
            cmds.iter()
                .map(|c| (c[0].clone(), c.clone(), false))
                .collect::<Vec<_>>(),
        )
    };
    let mut props: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from(description)),
        ("Type", Value::from("oneshot")),
        ("ExecStart", exec(commands)),
        // Keep the unit loaded until its result is read, then let it go even if failed (the
        // journal keeps its output).
        ("AddRef", Value::from(true)),
        ("CollectMode", Value::from("inactive-or-failed")),
        // bootc's error chain, for the reason; the journal keeps a copy only when stderr goes
        // there, so the file is the one place it is read from. Appended to: systemd opens it
        // anew for each command, and truncating would leave only the last one's
        // (`ExecStopPost`'s) words.
        ("StandardErrorFileToAppend", Value::from(stderr_path)),
    ];
    if let Some(post) = stop_post {
        props.push(("ExecStopPost", exec(std::slice::from_ref(&post.to_vec()))));
    }
    props.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    props
}
