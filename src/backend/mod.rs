//! The OS update backend the agent drives: rpm-ostreed over D-Bus, or bootc in transient
//! systemd units (hosts without rpm-ostreed).
//!
//! The two differ in one way that matters for safety: rpm-ostree stages a deployment
//! finalization-locked, so nothing but an approved `FinalizeDeployment` applies it; bootc before
//! v1.12 has no such lock, so any reboot applies what it staged. The agent therefore stages on
//! such a bootc only after the reboot is approved, right before it reboots through logind; a
//! newer bootc holds the stage with `upgrade --download-only` ([`Backend::locks`]).

pub mod bootc;
pub mod deployment;
// The libostree helper's protocol; the bootc backend reads image labels through it.
pub mod helper;
pub mod kernel;
pub mod plan;
pub mod rpmostree;
pub mod systemd;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

pub use deployment::{Deployment, DeploymentError, pending};
pub use kernel::KernelVariant;
pub use plan::StagePlan;

use crate::config::BackendChoice;
use bootc::BootcError;
use rpmostree::{RpmOstreeError, TxnEvent, UpdateDeploymentCall};

/// Which service stages deployments on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// rpm-ostreed over D-Bus.
    RpmOstree,
    /// bootc in transient systemd units.
    Bootc,
}

impl BackendKind {
    /// The name used in annotations and status.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::RpmOstree => "rpm-ostree",
            BackendKind::Bootc => "bootc",
        }
    }
}

/// The backend in use.
#[derive(Clone, Debug)]
pub enum Backend {
    /// rpm-ostreed.
    RpmOstree(rpmostree::Client),
    /// bootc.
    Bootc(bootc::Client),
}

/// A backend's failure.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// From rpm-ostreed.
    #[error(transparent)]
    RpmOstree(#[from] RpmOstreeError),
    /// From bootc, systemd or logind.
    #[error(transparent)]
    Bootc(#[from] BootcError),
}

impl BackendError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            BackendError::RpmOstree(e) => e.label(),
            BackendError::Bootc(e) => e.label(),
        }
    }

    /// Transient errors are retried with backoff instead of ending in `Degraded`.
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::RpmOstree(e) => e.is_transient(),
            BackendError::Bootc(e) => e.is_transient(),
        }
    }

    /// An `apply` that may have taken effect although it reported an error: the
    /// `FinalizeDeployment` connection closed without a result after `Start()`, or no result
    /// came within its limit (the daemon may have unlocked and queued the reboot first).
    pub fn possibly_applied(&self) -> bool {
        // A finalization that stalled took the call: it may have unlocked the stage too.
        matches!(
            self,
            BackendError::RpmOstree(RpmOstreeError::Interrupted | RpmOstreeError::Stalled { .. })
        )
    }

    /// A staging that failed on the network (see [`RpmOstreeError::is_network_failure`] and
    /// [`BootcError::is_network_failure`]).
    pub fn is_network_failure(&self) -> bool {
        match self {
            BackendError::RpmOstree(e) => e.is_network_failure(),
            BackendError::Bootc(e) => e.is_network_failure(),
        }
    }
}

/// Whether the booted deployment was deployed from a signed image (`containerPolicy`, the
/// `ostree-image-signed:` origin): every switch away from it then enforces the host's
/// signature policy too.
async fn booted_signed(c: &bootc::Client) -> Result<bool, BootcError> {
    Ok(signed(&c.deployments().await?))
}

/// [`booted_signed`] of deployments already read.
fn signed(deployments: &[Deployment]) -> bool {
    deployments.iter().any(|d| {
        d.booted
            && d.container_image_reference
                .as_deref()
                .is_some_and(|r| r.starts_with("ostree-image-signed:"))
    })
}

impl Backend {
    /// Connects to the backend `choice` names; `auto` takes rpm-ostree when rpm-ostreed is on
    /// the bus (owned or activatable), else bootc. `host_root` is the host's `/`.
    pub async fn connect(
        choice: BackendChoice,
        bootc_path: &std::path::Path,
        runtime_dir: &std::path::Path,
        host_root: &std::path::Path,
    ) -> anyhow::Result<Backend> {
        use anyhow::Context as _;
        let conn = rpmostree::system_bus()
            .await
            .context("connecting to the system bus")?;
        let use_rpm = match choice {
            BackendChoice::RpmOstree => true,
            BackendChoice::Bootc => false,
            BackendChoice::Auto => bootc::rpm_ostreed_available(&conn)
                .await
                .context("asking the bus whether rpm-ostreed is available")?,
        };
        Ok(if use_rpm {
            Backend::RpmOstree(
                rpmostree::Client::with_connection(conn, host_root)
                    .await
                    .context("connecting to rpm-ostreed")?,
            )
        } else {
            Backend::Bootc(bootc::Client::new(conn, bootc_path, runtime_dir, host_root))
        })
    }

    /// Which backend this is, for host facts and status.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::RpmOstree(_) => BackendKind::RpmOstree,
            Backend::Bootc(_) => BackendKind::Bootc,
        }
    }

    /// Whether a staged deployment can be finalization-locked (then it is staged before the
    /// reboot is approved; otherwise only after): rpm-ostree always, bootc from v1.12.0 on
    /// (known from its last status).
    pub fn locks(&self) -> bool {
        match self {
            Backend::RpmOstree(_) => true,
            Backend::Bootc(c) => c.can_hold(),
        }
    }

    /// Whether a stage of the image `digest` is finalization-locked from the moment it exists,
    /// given the host's `deployments`: always on rpm-ostree; on a bootc that can hold only when
    /// nothing is staged or a held stage of `digest` is. Replacing another stage unlinks the
    /// lock (libostree's `ostree_sysroot_stage_tree_with_options` unlinks the legacy lock file with the
    /// stage it replaces) and bootc cannot remove a stage: such a move is staged after the
    /// approval instead, as on a bootc that cannot hold.
    pub fn locks_for(&self, deployments: &[Deployment], digest: &str) -> bool {
        match self {
            Backend::RpmOstree(_) => true,
            Backend::Bootc(c) => {
                c.can_hold()
                    && deployments
                        .iter()
                        .find(|d| d.staged)
                        .is_none_or(|s| s.finalization_locked && s.carries_digest(digest))
            }
        }
    }

    /// The system bus connection (shared with streamd's own D-Bus API).
    pub fn connection(&self) -> &zbus::Connection {
        match self {
            Backend::RpmOstree(c) => c.connection(),
            Backend::Bootc(c) => c.connection(),
        }
    }

    /// Every deployment, boot order (staged first).
    pub async fn deployments(&self) -> Result<Vec<Deployment>, BackendError> {
        Ok(match self {
            Backend::RpmOstree(c) => c.deployments().await?,
            Backend::Bootc(c) => c.deployments().await?,
        })
    }

    /// Removes the staged deployment. bootc has no command for that, so there the booted image
    /// (`booted`, its pullspec as the caller last read it) is staged again in its place: what
    /// the next boot applies is then what runs now.
    pub async fn cleanup_pending(&self, booted: &str) -> Result<(), BackendError> {
        match self {
            Backend::RpmOstree(c) => Ok(c.cleanup_pending().await?),
            Backend::Bootc(_) if booted.is_empty() => {
                Err(BootcError::Status("no booted container image to return to".into()).into())
            }
            Backend::Bootc(c) => Ok(c.switch(booted, booted_signed(c).await?).await?),
        }
    }

    /// Stages `plan` (one transaction on rpm-ostree, `bootc switch` on bootc), sending
    /// progress to `events`; rpm-ostree transactions stop when `cancel` turns true.
    pub async fn stage(
        &self,
        plan: &StagePlan,
        events: &mpsc::Sender<TxnEvent>,
        cancel: watch::Receiver<bool>,
    ) -> Result<(), BackendError> {
        match self {
            Backend::RpmOstree(c) => {
                // Never from a signed origin to an unverified one, whatever the plan says.
                let mut plan = plan.clone();
                plan.signed |= signed(&c.deployments().await?);
                let call = UpdateDeploymentCall::for_plan(&plan);
                Ok(c.update_deployment(&call, events, Some(cancel)).await?)
            }
            Backend::Bootc(c) => {
                let deployments = c.deployments().await?;
                let signed = plan.signed || signed(&deployments);
                let hold = plan.lock_finalization && c.can_hold();
                let staged = deployments.iter().find(|d| d.staged);
                let target = plan.os_image.to_string();
                let _ = events.try_send(TxnEvent::Message(format!(
                    "bootc switch --transport registry {}{}{}",
                    if signed {
                        "--enforce-container-sigpolicy "
                    } else {
                        ""
                    },
                    plan.os_image,
                    if hold {
                        ", locked before it stages, then bootc upgrade --download-only"
                    } else {
                        ""
                    }
                )));
                if !hold {
                    return Ok(c.switch(&target, signed).await?);
                }
                let held = match staged {
                    None => c.switch_held(&target, signed).await,
                    // `bootc switch` would say "Image specification is unchanged": only the
                    // hold is missing (an earlier run was cut short).
                    Some(s) if s.carries_digest(plan.os_image.digest()) => c.hold().await,
                    // libostree unlinks the legacy lock when it replaces a staged deployment,
                    // and bootc cannot remove one: the new stage would be unlocked until held.
                    Some(s) => {
                        return Err(BootcError::StagedAlready {
                            staged: s.pullspec().map_or_else(|| s.id.clone(), String::from),
                        }
                        .into());
                    }
                };
                if let Err(e) = held {
                    // A stage the failed hold left is still locked by the legacy file, but bootc
                    // reports it unheld: the booted image goes back in its place.
                    let now = c.deployments().await?;
                    if now
                        .iter()
                        .any(|d| d.staged && d.carries_digest(plan.os_image.digest()))
                    {
                        let booted = now
                            .iter()
                            .find(|d| d.booted)
                            .and_then(|d| d.pullspec().map(String::from))
                            .unwrap_or_default();
                        if let Err(c2) = self.cleanup_pending(&booted).await {
                            tracing::warn!(error = %c2, "removing the unheld stage failed");
                        }
                    }
                    return Err(e.into());
                }
                Ok(())
            }
        }
    }

    /// Applies the staged deployment whose manifest digest is `digest` by rebooting:
    /// `FinalizeDeployment` on rpm-ostree, logind's `Reboot` on bootc.
    pub async fn apply(&self, digest: &str) -> Result<(), BackendError> {
        match self {
            Backend::RpmOstree(c) => {
                // Up to v2025.6 rpm-ostreed compares the checksum with the base commit.
                let staged = c.deployments().await?.into_iter().find(|d| d.staged);
                let base = staged
                    .filter(|s| s.carries_digest(digest))
                    .map(|s| s.base_commit().to_string())
                    .unwrap_or_default();
                Ok(c.finalize_deployment(digest, &base).await?)
            }
            Backend::Bootc(c) => {
                // A held stage (bootc >= 1.12) is let go first, after the inhibitor check, as
                // rpm-ostreed checks inhibitors before unlocking.
                let held = c.deployments().await?.into_iter().find(|d| d.staged);
                if let Some(s) = held.filter(|s| s.finalization_locked) {
                    if !s.carries_digest(digest) {
                        return Err(BootcError::Status(format!(
                            "the held stage is {}, not {digest}",
                            s.container_image_reference_digest.unwrap_or_default()
                        ))
                        .into());
                    }
                    c.check_inhibitors().await?;
                    c.release().await?;
                }
                Ok(c.reboot().await?)
            }
        }
    }
}
