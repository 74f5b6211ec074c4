//! The bootloader update before a move to another RHEL major on a Secure Boot host.
//!
//! A RHEL 10 kernel is signed with keys an old shim does not trust: with Secure Boot on, the
//! node would not boot the new deployment. The machine-config daemon therefore updates the
//! bootloader before every rebase on Secure Boot x86_64/aarch64 nodes
//! (openshift/machine-config-operator:pkg/daemon/bootupd.go `runBootloaderUpdate`): on RHEL >=
//! 9.6 it starts bootupd's `bootloader-update.service` (`systemctl start`, which waits for the
//! oneshot `bootupctl update` and returns its result), else, or when that fails, it runs
//! `bootupctl update` from the target image in a privileged podman container and at last copies
//! the EFI files onto the ESPs by hand. streamd does the first step over systemd's D-Bus API,
//! and does not do the container fallback (it would need podman, the pull secret, `/dev` and the
//! ESPs inside streamd's sandbox): when the unit is missing or fails, the move is not finalized
//! and the reason says what to do.
//!
//! streamd starts its own [`TARGET`] (`StartUnit` mode `replace`, then the job's `JobRemoved`),
//! which `Requires=` and is ordered `After=` bootupd's unit: systemd pulls the update in, a
//! missing unit fails the call (`NoSuchUnit` "Unit bootloader-update.service not found.",
//! systemd:src/core/transaction.c `transaction_add_job_and_dependencies`) and a failed update
//! ends the target's job `dependency`. SELinux checks a start only on the unit named in the
//! call (systemd:src/core/dbus-unit.c `bus_unit_method_start_generic`), so the policy lets
//! streamd start this one target and no packaged unit of anyone else (selinux/streamd.te).

use std::time::Duration;

use tracing::info;

use crate::backend::systemd::{JobEnd, ManagerProxy, ServiceProxy, UnitProxy, job_watch, wait_job};

/// bootupd's unit (coreos/bootupd:contrib/packaging/bootloader-update.service).
pub const UNIT: &str = "bootloader-update.service";
/// streamd's own unit that pulls [`UNIT`] in (systemd/streamd-bootloader-update.target).
pub const TARGET: &str = "streamd-bootloader-update.target";
/// Longest wait for `bootupctl update`.
const TIMEOUT: Duration = Duration::from_secs(600);

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// Why the bootloader was not updated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootloaderError {
    /// The host has no `bootloader-update.service` (RHEL before 9.6).
    #[error(
        "systemd has no {UNIT} ({0}); on RHEL before 9.6 the machine-config daemon runs `bootupctl update` from the target image in a privileged container, which streamd does not: update the bootloader that way, then run `streamctl reconcile`"
    )]
    NotInstalled(String),
    /// streamd's own target is missing: the package is broken.
    #[error(
        "systemd has no {TARGET} ({0}), which the streamd package installs: reinstall streamd, then run `streamctl reconcile`"
    )]
    TargetMissing(String),
    /// The unit ran and failed.
    #[error(
        "{UNIT} failed (result {result}, exit status {status}): see `journalctl -u {UNIT}`, then run `streamctl reconcile`"
    )]
    Failed {
        /// The job's or the service's result (`exit-code`, `timeout`, `canceled`, …).
        result: String,
        /// `ExecMainStatus`.
        status: i32,
    },
    /// The unit did not finish in time.
    #[error("{UNIT} did not finish within {0} s")]
    Timeout(u64),
    /// A D-Bus call to systemd failed.
    #[error("asking systemd to start {UNIT}: {0}")]
    Call(String),
}

impl BootloaderError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            BootloaderError::NotInstalled(_) => "bootloader-not-installed",
            BootloaderError::TargetMissing(_) => "bootloader-target-missing",
            BootloaderError::Failed { .. } => "bootloader-failed",
            BootloaderError::Timeout(_) => "bootloader-timeout",
            BootloaderError::Call(_) => "bootloader-call",
        }
    }
}

/// Starts [`TARGET`], and so `bootloader-update.service`, and waits for its start job to end.
pub async fn update(conn: &zbus::Connection) -> Result<(), BootloaderError> {
    let call = |e: zbus::Error| BootloaderError::Call(crate::text::one_line_reason(&e.to_string()));
    let manager = ManagerProxy::new(conn).await.map_err(call)?;
    let mut removed = job_watch(&manager).await.map_err(|(_, e)| call(e))?;
    let job = match manager.start_unit(TARGET, "replace").await {
        Ok(job) => job,
        Err(zbus::Error::MethodError(name, msg, _)) if name.as_str() == NO_SUCH_UNIT => {
            let msg = crate::text::one_line_reason(msg.as_deref().unwrap_or("no such unit"));
            // systemd names the unit it could not load: ours, or the dependency.
            return Err(if msg.contains(TARGET) {
                BootloaderError::TargetMissing(msg)
            } else {
                BootloaderError::NotInstalled(msg)
            });
        }
        Err(e) => return Err(call(e)),
    };
    info!(unit = TARGET, job = %job.as_str(), "updating the bootloader");
    let job_result = match wait_job(&mut removed, &job, TIMEOUT).await {
        JobEnd::TimedOut => return Err(BootloaderError::Timeout(TIMEOUT.as_secs())),
        JobEnd::Closed => {
            return Err(BootloaderError::Call(format!(
                "the bus connection closed while {UNIT} ran"
            )));
        }
        JobEnd::Removed(r) => r,
    };
    if job_result == "done" {
        info!(unit = UNIT, "bootloader updated");
        return Ok(());
    }
    // The target's job ends `dependency` when the update failed; the service's own result says
    // what happened.
    let (result, status) = match unit_result(conn, &manager).await {
        Some((r, s)) if r != "success" => (r, s),
        _ => (job_result, -1),
    };
    Err(BootloaderError::Failed {
        result: crate::text::one_line(&result, 64),
        status,
    })
}

/// Whether [`UNIT`] ran and succeeded this boot: systemd keeps the oneshot (`RemainAfterExit=yes`)
/// `active` from its success until the next boot. `Some(false)` when systemd has it in
/// another state or has not loaded it (it did not run this boot, or is not installed);
/// `None` when systemd could not be asked.
pub async fn ran_this_boot(conn: &zbus::Connection) -> Option<bool> {
    let manager = ManagerProxy::new(conn).await.ok()?;
    let path = match manager.get_unit(UNIT).await {
        Ok(path) => path,
        Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == NO_SUCH_UNIT => {
            return Some(false);
        }
        Err(_) => return None,
    };
    let unit = UnitProxy::builder(conn)
        .path(path)
        .ok()?
        .build()
        .await
        .ok()?;
    Some(unit.active_state().await.ok()? == "active")
}

async fn unit_result(conn: &zbus::Connection, manager: &ManagerProxy<'_>) -> Option<(String, i32)> {
    let path = manager.get_unit(UNIT).await.ok()?;
    let service = ServiceProxy::builder(conn)
        .path(path)
        .ok()?
        .build()
        .await
        .ok()?;
    let result = service.result().await.ok()?;
    let status = service.exec_main_status().await.unwrap_or(-1);
    Some((result, status))
}
