//! The test knobs the control commands set, and the control commands themselves.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tracing::info;

use super::{Daemon, lock, os};
use crate::control::RpmOstreedCmd;

/// Behaviour switches for the coming transactions.
#[derive(Debug, Clone)]
pub(crate) struct Knobs {
    /// The next transaction ends with `Finished(false, message)`.
    pub(crate) fail_next: Option<String>,
    /// The next transaction "crashes" the daemon right after `Start()`.
    pub(crate) exit_mid_transaction: bool,
    /// `PercentProgress` signals per deploy transaction.
    pub(crate) progress_signals: u32,
    /// Rate of those signals.
    pub(crate) progress_per_second: u32,
    /// Extra time a deploy transaction takes before it stages and finishes.
    pub(crate) slow: Duration,
    /// The next staged tree gets the default kernel even when a variant kernel was layered:
    /// a broken daemon, for testing that clients verify what was staged.
    pub(crate) drop_variant_next: bool,
    /// The next deploy's new root fails rpm-ostree's sanity check (`/usr/bin/true`).
    pub(crate) broken_root_next: bool,
    /// Record a finalization lock the way rpm-ostree before v2024.6 did: the legacy
    /// `/run/ostree/staged-deployment-locked` file, which makes `Deployments` report
    /// `finalization-locked` (see `runstate`). Off: as current rpm-ostree, no key at all.
    pub(crate) legacy_lock_file: bool,
    /// The next `FinalizeDeployment` closes its peers right after unlocking and queueing the
    /// reboot, without `Finished`.
    pub(crate) drop_after_unlock: bool,
    /// The next peer connecting to a transaction socket is closed before authentication.
    pub(crate) drop_peer_next: bool,
    /// polkit denies every transaction method (`AccessDenied`), e.g. a broken policy.
    pub(crate) deny_calls: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: None,
            exit_mid_transaction: false,
            // A container pull reports layer tasks, not PercentProgress
            // (coreos/rpm-ostree:rust/src/sysroot_upgrade.rs `layer_progress_print`).
            progress_signals: 0,
            progress_per_second: 500,
            slow: Duration::ZERO,
            drop_variant_next: false,
            broken_root_next: false,
            legacy_lock_file: false,
            deny_calls: false,
            drop_after_unlock: false,
            drop_peer_next: false,
        }
    }
}

impl Daemon {
    /// Runs one control command; see `docs/testbed.md`.
    pub(crate) async fn control(self: &Arc<Self>, cmd: RpmOstreedCmd) -> anyhow::Result<Value> {
        info!(cmd = ?cmd, "rpmostreed control command");
        match cmd {
            RpmOstreedCmd::FailNext { message } => lock(&self.knobs).fail_next = Some(message),
            RpmOstreedCmd::HoldForeign { on } => self.hold_foreign(on).await?,
            RpmOstreedCmd::Progress {
                signals,
                per_second,
            } => {
                anyhow::ensure!(per_second > 0, "\"per-second\" must be positive");
                let mut knobs = lock(&self.knobs);
                knobs.progress_signals = signals;
                knobs.progress_per_second = per_second;
            }
            RpmOstreedCmd::Slow { ms } => lock(&self.knobs).slow = Duration::from_millis(ms),
            RpmOstreedCmd::DropVariantNext => lock(&self.knobs).drop_variant_next = true,
            RpmOstreedCmd::BrokenRootNext => lock(&self.knobs).broken_root_next = true,
            RpmOstreedCmd::LegacyLockFile { on } => lock(&self.knobs).legacy_lock_file = on,
            RpmOstreedCmd::DenyCalls { on } => lock(&self.knobs).deny_calls = on,
            RpmOstreedCmd::DropPeerNext => lock(&self.knobs).drop_peer_next = true,
            RpmOstreedCmd::DropAfterUnlock => lock(&self.knobs).drop_after_unlock = true,
            RpmOstreedCmd::AdminDeploy { image } => self.admin_deploy(&image).await?,
            RpmOstreedCmd::LoseImageMetadata { index } => self.lose_image_metadata(index).await?,
            RpmOstreedCmd::ExitMidTransaction => lock(&self.knobs).exit_mid_transaction = true,
            RpmOstreedCmd::Bus { on } => self.set_on_bus(on).await?,
            RpmOstreedCmd::Transactions => return Ok(serde_json::to_value(&*lock(&self.records))?),
            RpmOstreedCmd::Clients => {
                let clients = lock(&self.clients);
                let mut ids: Vec<&str> = clients
                    .values()
                    .map(|id| id.as_deref().unwrap_or(""))
                    .collect();
                ids.sort_unstable();
                return Ok(json!(ids));
            }
            RpmOstreedCmd::Deployments => return os::deployments_json(self),
            RpmOstreedCmd::ResetTransactions => lock(&self.records).clear(),
        }
        Ok(json!({}))
    }
}
