//! The test knobs the control commands set, and the control commands themselves.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tracing::info;

use super::{Daemon, lock, os};

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
            legacy_lock_file: false,
            deny_calls: false,
            drop_after_unlock: false,
            drop_peer_next: false,
        }
    }
}

fn u32_field(cmd: &Value, key: &str) -> anyhow::Result<u32> {
    let n = cmd
        .get(key)
        .and_then(Value::as_u64)
        .with_context(|| format!("\"{key}\" must be a non-negative integer"))?;
    u32::try_from(n).with_context(|| format!("\"{key}\" is too large"))
}

impl Daemon {
    /// Run one control command; see `docs/testbed.md`.
    pub(crate) async fn control(self: &Arc<Self>, cmd: &Value) -> anyhow::Result<Value> {
        let name = cmd
            .get("cmd")
            .and_then(Value::as_str)
            .context("control command without \"cmd\"")?;
        info!(cmd = name, "rpmostreed control command");
        match name {
            "fail-next" => {
                let message = cmd
                    .get("message")
                    .and_then(Value::as_str)
                    .context("\"message\" must be a string")?;
                lock(&self.knobs).fail_next = Some(message.to_string());
                Ok(json!({}))
            }
            "hold-foreign" => {
                let on = cmd
                    .get("on")
                    .and_then(Value::as_bool)
                    .context("\"on\" must be a boolean")?;
                self.hold_foreign(on).await?;
                Ok(json!({}))
            }
            "progress" => {
                let signals = u32_field(cmd, "signals")?;
                let per_second = u32_field(cmd, "per-second")?;
                anyhow::ensure!(per_second > 0, "\"per-second\" must be positive");
                let mut knobs = lock(&self.knobs);
                knobs.progress_signals = signals;
                knobs.progress_per_second = per_second;
                Ok(json!({}))
            }
            "slow" => {
                let ms = cmd
                    .get("ms")
                    .and_then(Value::as_u64)
                    .context("\"ms\" must be a non-negative integer")?;
                lock(&self.knobs).slow = Duration::from_millis(ms);
                Ok(json!({}))
            }
            "drop-variant-next" => {
                lock(&self.knobs).drop_variant_next = true;
                Ok(serde_json::json!({}))
            }
            "legacy-lock-file" => {
                let on = cmd
                    .get("on")
                    .and_then(Value::as_bool)
                    .context("\"on\" must be a boolean")?;
                lock(&self.knobs).legacy_lock_file = on;
                Ok(json!({}))
            }
            "deny-calls" => {
                let on = cmd
                    .get("on")
                    .and_then(Value::as_bool)
                    .context("\"on\" must be a boolean")?;
                lock(&self.knobs).deny_calls = on;
                Ok(json!({}))
            }
            "drop-peer-next" => {
                lock(&self.knobs).drop_peer_next = true;
                Ok(json!({}))
            }
            "drop-after-unlock" => {
                lock(&self.knobs).drop_after_unlock = true;
                Ok(json!({}))
            }
            "admin-deploy" => {
                let image = cmd
                    .get("image")
                    .and_then(Value::as_str)
                    .context("\"image\" must be a pullspec string")?;
                self.admin_deploy(image).await?;
                Ok(json!({}))
            }
            "lose-image-metadata" => {
                let index = cmd
                    .get("index")
                    .and_then(Value::as_u64)
                    .and_then(|i| usize::try_from(i).ok())
                    .context("\"index\" must be a deployment index")?;
                self.lose_image_metadata(index).await?;
                Ok(json!({}))
            }
            "exit-mid-transaction" => {
                lock(&self.knobs).exit_mid_transaction = true;
                Ok(json!({}))
            }
            "transactions" => Ok(serde_json::to_value(&*lock(&self.records))?),
            "clients" => {
                let clients = lock(&self.clients);
                let mut ids: Vec<&str> = clients
                    .values()
                    .map(|id| id.as_deref().unwrap_or(""))
                    .collect();
                ids.sort_unstable();
                Ok(json!(ids))
            }
            "deployments" => os::deployments_json(self),
            "reset-transactions" => {
                lock(&self.records).clear();
                Ok(json!({}))
            }
            other => Err(anyhow::anyhow!("unknown rpmostreed command \"{other}\"")),
        }
    }
}
