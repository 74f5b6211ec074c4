//! A simulated reboot of the testbed host, as `ostree-finalize-staged.service` and the next
//! boot would do it.
//!
//! A staged deployment is applied only when it is not finalization-locked; a locked one is
//! discarded, as on a real host, where the staged deployment lives in `/run` (tmpfs) and the
//! finalize service skips it while its record says `locked` or
//! `/run/ostree/staged-deployment-locked` exists (whoever created that file). After an
//! applied update the previous booted deployment becomes the rollback and the older rollback is
//! pruned, as ostree does when it writes the new boot order.
//!
//! Over real libostree (`real_libostree`) the finalization is libostree's own
//! (`ostree admin finalize-staged`, [`super::realstage`]): it writes the bootloader entries
//! that boot, and it alone decides whether a locked deployment is skipped.

use std::sync::atomic::Ordering;

use anyhow::Context as _;
use tracing::info;

use super::realstage::RealOp;
use super::{FakeRpmOstreed, lock, ostree, runstate};

/// What the reboot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootOutcome {
    /// A staged deployment was applied (it was unlocked).
    pub applied: bool,
    /// A staged deployment was discarded (locked, or its finalization failed).
    pub discarded: bool,
    /// An unlocked staged deployment's finalization failed (`fail_finalize`).
    pub finalize_failed: bool,
    /// The catalog digest of the image booted now (what the refspec pinned).
    pub booted_digest: String,
    /// Its kernel release.
    pub booted_kernel: String,
    /// Its `/proc/cmdline`.
    pub cmdline: String,
}

impl FakeRpmOstreed {
    /// Reboots the host model: waits for a running transaction to end (a real shutdown waits
    /// for rpm-ostreed too), applies or discards the staged deployment, and lets the daemon
    /// accept transactions again. `fail_finalize` makes the shutdown's finalization fail (as
    /// `ostree-finalize-staged.service` does on a full `/boot` or a bootloader error): the
    /// unlocked deployment is lost and the old one boots again.
    pub async fn simulate_reboot(&self, fail_finalize: bool) -> anyhow::Result<RebootOutcome> {
        let d = &self.daemon;
        let _gate = d.txn_gate.lock().await;
        d.reload_state()?;
        let (staged, locked, admin_pending) = {
            let state = lock(&d.state);
            let admin = state.deployments.first().is_some_and(|f| f.unstaged);
            // Either lock stops the finalization: the record's `locked` key or the legacy
            // file, whoever made it (`_ostree_sysroot_finalize_impl_staged_deployment`).
            let legacy = runstate::legacy_lock_exists(d.host_root.as_deref());
            match state.staged() {
                Some(s) => (true, s.finalization_locked || legacy, admin),
                None => (false, false, admin),
            }
        };
        // A deployment `ostree admin deploy` wrote is already in the bootloader: it boots.
        let applied = match d.real.as_ref() {
            Some(real) => {
                // `ostree-finalize-staged.service` runs real libostree's finalization, which
                // skips a locked deployment itself; what it did decides what boots.
                let finalized = if staged && !fail_finalize {
                    d.real_op(RealOp::FinalizeStaged)
                        .await
                        .map_err(anyhow::Error::msg)
                        .context("finalizing the staged deployment")?;
                    !real.has_record()
                } else {
                    false
                };
                // `/run` is a tmpfs: an unfinalized deployment's record goes with the boot
                // (its directory stays until libostree's next cleanup, as on a host).
                real.boot()?;
                d.resync(None).map_err(anyhow::Error::msg)?;
                finalized || (!staged && admin_pending)
            }
            None => {
                let applied = (staged && !locked && !fail_finalize) || (!staged && admin_pending);
                if staged && !applied {
                    ostree::undeploy(&d.sysroot, 0)
                        .await
                        .context("discarding the locked staged deployment")?;
                    d.resync(None).map_err(anyhow::Error::msg)?;
                }
                applied
            }
        };
        if applied {
            if staged {
                // Finalizing writes the staged deployment without `RETAIN_PENDING`
                // (`_ostree_sysroot_finalize_staged_inner`): an admin's pending one goes.
                loop {
                    let index = {
                        let state = lock(&d.state);
                        state
                            .deployments
                            .iter()
                            .skip(1)
                            .position(|x| x.unstaged && !x.booted)
                            .map(|i| i + 1)
                    };
                    let Some(index) = index else { break };
                    d.undeploy(index)
                        .await
                        .map_err(anyhow::Error::msg)
                        .context("dropping a pending deployment")?;
                    d.resync(None).map_err(anyhow::Error::msg)?;
                }
            }
            {
                let mut state = lock(&d.state);
                for (i, dep) in state.deployments.iter_mut().enumerate() {
                    dep.booted = i == 0;
                    dep.staged = false;
                    dep.unstaged = false;
                    dep.finalization_locked = false;
                }
                d.save_state(&state).map_err(anyhow::Error::msg)?;
            }
            // Keep the new booted and one rollback of this stateroot.
            loop {
                let extra = {
                    let state = lock(&d.state);
                    state.deployments.len().checked_sub(1).filter(|&i| i >= 2)
                };
                let Some(index) = extra else { break };
                d.undeploy(index)
                    .await
                    .map_err(anyhow::Error::msg)
                    .context("pruning the old rollback deployment")?;
                d.resync(None).map_err(anyhow::Error::msg)?;
            }
        }
        // `/run` is a tmpfs: what is left of `/run/ostree` goes with the boot.
        if let Some(root) = d.host_root.as_deref() {
            runstate::boot(root)?;
        }
        let outcome = {
            let mut state = lock(&d.state);
            state.reboot_requested = false;
            d.save_state(&state).map_err(anyhow::Error::msg)?;
            let booted = state
                .booted()
                .context("no booted deployment after the reboot")?;
            RebootOutcome {
                applied,
                discarded: staged && !applied,
                finalize_failed: staged && !locked && fail_finalize,
                booted_digest: booted.image_digest.clone(),
                booted_kernel: booted.kernel.clone(),
                cmdline: booted
                    .disk
                    .as_ref()
                    .map(|disk| disk.proc_cmdline())
                    .unwrap_or_default(),
            }
        };
        d.rebooting.store(false, Ordering::SeqCst);
        d.notify_deployments().await;
        info!(
            applied = outcome.applied,
            discarded = outcome.discarded,
            booted = %outcome.booted_digest,
            "simulated reboot"
        );
        Ok(outcome)
    }
}
