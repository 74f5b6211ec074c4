//! The runs of the transactions: what `UpdateDeployment`/`Rebase` (deploy), `Cleanup` and
//! `FinalizeDeployment` do once started, in the real daemon's order
//! (coreos/rpm-ostree:src/daemon/rpmostreed-transaction-types.cxx). The transaction machinery
//! (creation, peers, signals, release) is in [`super::transaction`].

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::deploy::{
    NewDeployment, add_removals, apply_changes, commit_image, depsolve, drop_inactive_removals,
    kernel_of, low_disk, resolve_removals, sanity_check, write_deployment,
};
use super::model::{CHUNK_BYTES, CHUNK_COUNT};
use super::realstage::RealOp;
use super::refspec::Refspec;
use super::transaction::{DeployPlan, FinalizePlan, STEP, Signal, Txn};
use super::{Daemon, lock};
use crate::fixtures::images::TestImage;

impl Daemon {
    /// The fail-next knob makes the run fail right after it begins.
    async fn injected_failure(&self, txn: &Txn) -> Result<(), String> {
        txn.pause(STEP).await?;
        match &txn.fail {
            Some(message) => Err(message.clone()),
            None => Ok(()),
        }
    }

    pub(super) async fn run_deploy(&self, txn: &Txn, plan: &DeployPlan) -> Result<(), String> {
        let title = plan.command_line.clone().unwrap_or_else(|| {
            if plan.refspec.is_some() {
                "rebase"
            } else if plan.revision.is_some() {
                "deploy"
            } else {
                "upgrade"
            }
            .to_string()
        });
        self.update_record(txn.id, |r| r.title = title.clone());
        txn.set_title(title).await;
        self.injected_failure(txn).await?;

        let (current_ref, current_digest, merge_layering, kargs) = {
            let state = lock(&self.state);
            let merge = state.default_for(&self.osname);
            (
                merge.map(|d| d.container_image_reference.clone()),
                merge.map(|d| d.image_digest.clone()),
                merge.map(|d| d.layering.clone()).unwrap_or_default(),
                state.booted().map(|d| d.kargs()).unwrap_or_default(),
            )
        };
        let requested = plan
            .refspec
            .as_deref()
            .map(|r| r.strip_prefix("ostree://").unwrap_or(r).to_string());
        let refspec = match (&requested, &current_ref) {
            (Some(new), Some(old)) if new == old => {
                return Err(format!("Old and new refs are equal: {new}"));
            }
            (Some(new), _) => new.clone(),
            (None, Some(old)) => old.clone(),
            (None, None) => return Err("No booted deployment".into()),
        };
        // The origin is edited before anything is pulled, as in `deploy_transaction_execute`.
        let mut layering = apply_changes(&merge_layering, &plan.changes)?;
        let imgref = match Refspec::classify(&refspec) {
            Refspec::Container(imgref) => imgref,
            Refspec::Checksum(csum) => {
                return Err(format!("No such metadata object {csum}.commit"));
            }
            Refspec::Ostree {
                remote: Some(remote),
                ..
            } => return Err(format!("Remote \"{remote}\" not found")),
            Refspec::Ostree {
                remote: None,
                branch,
            } => return Err(format!("Refspec '{branch}' not found")),
        };

        txn.emit(Signal::Message(&format!("Pulling manifest: {imgref}")))
            .await;
        txn.pause(STEP).await?;
        let image = imgref.resolve(&self.images, plan.revision.as_deref())?;
        // The manifest is read from the registry as the node's
        // container stack reads it (the host root's ostree auth file, registries.conf mirrors
        // and blocks), so a missing credential fails here as on a node.
        if let Some(root) = self.host_root.as_deref() {
            if imgref.sig == super::refspec::SigVerify::Signed {
                crate::fakes::registry::node::verifying_origin_check(root)?;
            }
            crate::fakes::registry::node::pull_check(root, &image.pullspec).await?;
        }
        // New removals are checked against the pulled base (before the "No upgrade
        // available" shortcut the fake takes in place of the real pull).
        add_removals(
            &mut layering,
            &plan.changes.override_remove,
            image,
            &self.arch,
        )?;
        if requested.is_none()
            && current_digest.as_deref() == Some(image.digest.as_str())
            && layering == merge_layering
        {
            txn.emit(Signal::Message("No upgrade available.")).await;
            return Ok(());
        }
        let already_pulled = lock(&self.state)
            .deployments
            .iter()
            .any(|d| d.image_digest == image.digest);
        if !already_pulled {
            self.update_record(txn.id, |r| r.pulled = true);
            self.pull_layers(txn, &imgref.to_string(), &image.digest)
                .await?;
        }
        if !plan.allow_downgrade {
            self.check_timestamps(&refspec, image).await?;
        }
        self.report_progress(txn).await?;
        let slow = lock(&self.knobs).slow;
        txn.pause(slow).await?;

        if layering.is_layered() {
            // `finalize_removal_overrides`: inherited removals the new base lacks are
            // dropped from the new origin, not failed.
            let inactive = drop_inactive_removals(&mut layering, image, &self.arch);
            if !inactive.is_empty() {
                txn.emit(Signal::Message("Inactive base removals:")).await;
                for name in &inactive {
                    txn.emit(Signal::Message(&format!("  {name}"))).await;
                }
            }
        }
        let base_removals = resolve_removals(&layering, image, &self.arch);
        if layering.is_layered() {
            let short: String = image
                .digest
                .trim_start_matches("sha256:")
                .chars()
                .take(7)
                .collect();
            txn.emit(Signal::TaskBegin(&format!("Checking out tree {short}")))
                .await;
            txn.emit(Signal::TaskEnd("done")).await;
            // The assembly's signals as rpm-ostree v2025.5 and v2026.2 sent them beside the
            // project (src/libpriv/rpmostree-core.cxx): percentages of their own, from 0, after
            // the pull's layer tasks.
            txn.emit(Signal::Message("No enabled rpm-md repositories."))
                .await;
            txn.emit(Signal::Percent("Importing rpm-md", 0)).await;
            txn.emit(Signal::ProgressEnd).await;
            txn.emit(Signal::TaskBegin("Resolving dependencies")).await;
            depsolve(&layering, image, &self.arch)?;
            txn.emit(Signal::TaskEnd("done")).await;
            let overrides = layering.requested_base_removals.len()
                + layering.requested_base_local_replacements.len();
            let overlays =
                layering.requested_packages.len() + layering.requested_local_packages.len();
            txn.emit(Signal::Message(&format!(
                "Applying {overrides} overrides and {overlays} overlays"
            )))
            .await;
            let items = overrides + overlays;
            txn.emit(Signal::Percent("Processing packages", 0)).await;
            for k in 1..=items {
                let pct = if k == items { 100 } else { 0 };
                txn.emit(Signal::Percent(
                    &format!("Processing packages ({k}/{items})"),
                    pct,
                ))
                .await;
            }
            txn.emit(Signal::ProgressEnd).await;
            txn.pause(STEP).await?;
            let kernel_changed = kernel_of(&layering, image, &self.arch).1 != image.kernel;
            let tasks = [
                ("Running systemd-sysusers", self.version.runs_sysusers()),
                ("Running pre scripts", true),
                ("Running post scripts", true),
                ("Running posttrans scripts", true),
                ("Writing rpmdb", true),
                ("Generating initramfs", kernel_changed),
            ];
            for (task, _) in tasks.iter().filter(|(_, runs)| *runs) {
                txn.emit(Signal::TaskBegin(task)).await;
                txn.emit(Signal::TaskEnd("done")).await;
            }
        }
        // rpm-ostree runs `/usr/bin/true` in the new root: a layered one while it is assembled,
        // before anything is staged (src/libpriv/rpmostree-core.cxx `rpmostree_context_assemble`),
        // a plain one only after it is staged, which a failure leaves staged and locked as asked
        // (src/daemon/rpmostree-sysroot-upgrader.cxx `rpmostree_sysroot_upgrader_deploy`, v2025.5;
        // seen on the real daemon).
        let broken_root = std::mem::take(&mut lock(&self.knobs).broken_root_next);
        let sanity = if broken_root {
            Err([
                "bwrap: execvp /usr/bin/true: No such file or directory".to_string(),
                "Sanity-checking final rootfs: bwrap(/usr/bin/true): Child process exited with code 1"
                    .to_string(),
            ])
        } else {
            sanity_check(self.host_root.as_deref(), image)
        };
        let failed_sanity = |[journal, message]: [String; 2]| {
            // The bwrap child's stderr reaches the journal, not the client.
            warn!(txn = txn.id, "{journal}");
            self.update_record(txn.id, |r| r.journal.push(journal));
            message
        };
        let (before_staging, after_staging) = if layering.is_layered() {
            (sanity, Ok(()))
        } else {
            (Ok(()), sanity)
        };
        before_staging.map_err(failed_sanity)?;
        if layering.is_layered() {
            txn.emit(Signal::TaskBegin("Writing OSTree commit")).await;
            txn.emit(Signal::TaskEnd("done")).await;
        }

        txn.emit(Signal::TaskBegin("Staging deployment")).await;
        let drop_variant = std::mem::take(&mut lock(&self.knobs).drop_variant_next);
        let new = NewDeployment {
            osname: &self.osname,
            refspec: &refspec,
            image,
            arch: &self.arch,
            layering,
            base_removals,
            kargs,
            drop_variant,
            image_kernel: image.variant,
            host_root: self.host_root.as_deref(),
        };
        let mut dep = if self.real.is_some() {
            // libostree's staging replaces a previous staged deployment itself.
            self.stage_real(new, plan.lock_finalization).await?
        } else {
            // A new staged deployment replaces the previous one.
            let staged = lock(&self.state).staged_index(&self.osname);
            if let Some(index) = staged {
                self.undeploy(index).await?;
                self.resync(None)?;
            }
            write_deployment(&self.sysroot, &self.state_dir.join("scratch"), new)
                .await
                .map_err(|e| format!("{e:#}"))?
        };
        dep.finalization_locked = plan.lock_finalization;
        let (checksum, serial) = (dep.checksum.clone(), dep.serial);
        self.resync(Some(dep))?;
        info!(txn = txn.id, digest = %image.digest, checksum = %checksum, serial, locked = plan.lock_finalization, "staged a deployment");
        self.notify_deployments().await;
        txn.emit(Signal::TaskEnd("done")).await;
        after_staging.map_err(failed_sanity)?;
        if plan.reboot {
            // As the real daemon: block-mode shutdown inhibitors stop the reboot (the
            // deployment stays staged and the transaction fails).
            self.check_inhibitors().await?;
            self.request_reboot()?;
            self.update_record(txn.id, |r| r.reboot_requested = true);
        }
        Ok(())
    }

    /// The task that starts layer `i` (from 0) of a pull: rpm-ostree's `layer_progress_print`
    /// counts the layers done, from 0, and prints 19 hex digits of the digest (v2024.9 to
    /// v2026.1), or the layer starting, from 1, with `sha256:` (v2026.2, da4b4fa0).
    fn layer_task(&self, i: u32, layer: &str) -> String {
        let size = format_size(CHUNK_BYTES);
        // ostree-ext's `layer_progress_format` takes 12 + 7 characters of the digest's hex
        // part (its comment means `sha256:`; oci-spec's `digest()` has none), in every release.
        let k = if self.version.layers_from_one() {
            i + 1
        } else {
            i
        };
        format!(
            "[{k}/{CHUNK_COUNT}] Fetching ostree chunk {} ({size})",
            &layer[..19]
        )
    }

    /// The messages and tasks of an ostree-ext container import. On a `low-disk` host the
    /// first layer's write fails with ostree's min-free-space error, chained the way
    /// ostree-ext reports it (ublue-os/cosmic#40 shows the chain; C-locale size format).
    async fn pull_layers(&self, txn: &Txn, imgref: &str, digest: &str) -> Result<(), String> {
        txn.emit(Signal::Message(&format!(
            "Importing: {imgref} (digest: {digest})"
        )))
        .await;
        txn.emit(Signal::Message(&format!(
            "ostree chunk layers needed: {CHUNK_COUNT} ({})",
            format_size(u64::from(CHUNK_COUNT) * CHUNK_BYTES)
        )))
        .await;
        for i in 0..CHUNK_COUNT {
            let layer = format!("{:x}", Sha256::digest(format!("{digest}/chunk/{i}")));
            txn.emit(Signal::TaskBegin(&self.layer_task(i, &layer)))
                .await;
            txn.pause(STEP).await?;
            if low_disk(self.host_root.as_deref()) {
                let object = format!("{:x}", Sha256::digest(format!("{layer}/object")));
                return Err(format!(
                    "Importing: Unencapsulating base: Layer sha256:{layer}: Importing objects: \
                     Importing object {}/{}.file: Processing content object {object}: \
                     Importing regfile small: Writing content object: \
                     min-free-space-percent '3%' would be exceeded, at least 20.5 kB requested",
                    &object[..2],
                    &object[2..]
                ));
            }
            txn.emit(Signal::TaskEnd("done")).await;
        }
        Ok(())
    }

    /// `ostree_sysroot_upgrader_check_timestamps` as `rpmostree_sysroot_upgrader_pull_base`
    /// runs it for a container refspec without `ALLOW_OLDER`: the imported image commit (whose
    /// timestamp is the image's `created`) against the merge deployment's base commit, when
    /// they differ (ostreedev/ostree:src/libostree/ostree-core.c `_ostree_compare_timestamps`).
    async fn check_timestamps(&self, refspec: &str, image: &TestImage) -> Result<(), String> {
        let current = lock(&self.state).default_for(&self.osname).map(|d| {
            (
                d.base_checksum
                    .clone()
                    .unwrap_or_else(|| d.checksum.clone()),
                d.timestamp,
            )
        });
        let Some((current_rev, current_ts)) = current else {
            return Ok(());
        };
        // The import is what gives the new base commit its checksum.
        let new_rev = commit_image(
            &self.sysroot,
            &self.state_dir.join("scratch"),
            refspec,
            image,
            &self.arch,
            crate::fixtures::Kernel::Default,
            self.host_root.as_deref(),
        )
        .await
        .map_err(|e| format!("{e:#}"))?;
        let new_ts = image.created_unix();
        if new_rev == current_rev || new_ts >= current_ts {
            return Ok(());
        }
        Err(format!(
            "While checking against deployment timestamp: Upgrade target revision '{new_rev}' \
             with timestamp '{}' is chronologically older than current revision \
             '{current_rev}' with timestamp '{}'; use --allow-downgrade to permit",
            c_locale_time(new_ts),
            c_locale_time(current_ts)
        ))
    }

    /// `PercentProgress` as the `progress` knob asks, then `ProgressEnd`.
    async fn report_progress(&self, txn: &Txn) -> Result<(), String> {
        let (count, per_second) = {
            let knobs = lock(&self.knobs);
            (knobs.progress_signals, knobs.progress_per_second.max(1))
        };
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / per_second);
        // Catch up after a late tick so the average rate is the one asked for.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for i in 1..=count {
            tokio::select! {
                _ = ticks.tick() => {}
                () = txn.cancel.notified() => {}
            }
            txn.cancelled()?;
            let pct = u32::try_from(u64::from(i) * 100 / u64::from(count)).unwrap_or(100);
            txn.emit(Signal::Percent("Writing objects", pct)).await;
        }
        txn.emit(Signal::ProgressEnd).await;
        Ok(())
    }

    /// `cleanup_transaction_execute`: the deployments asked for go; when one went (or `base`
    /// was asked), `rpmostree_syscore_cleanup` prunes the container images no deployment's
    /// origin names and their layers (`container_prune`), so staging the same image again pulls
    /// it again.
    pub(super) async fn run_cleanup(
        &self,
        txn: &Txn,
        pending: bool,
        rollback: bool,
        base: bool,
    ) -> Result<(), String> {
        self.injected_failure(txn).await?;
        let mut changed = false;
        // Rollback first: it sits after the staged deployment, so the staged index holds.
        // Every deployment of the kind goes, a pending one also when `ostree admin deploy`
        // wrote it (`rpmostree_syscore_filter_deployments`).
        for (wanted, which) in [(rollback, "rollback"), (pending, "pending")] {
            if !wanted {
                continue;
            }
            loop {
                let index = lock(&self.state).cleanup_index(&self.osname, which == "pending");
                let Some(index) = index else { break };
                self.undeploy(index).await?;
                self.resync(None)?;
                changed = true;
            }
        }
        if changed {
            info!(txn = txn.id, pending, rollback, "cleaned up deployments");
            self.notify_deployments().await;
        } else if pending || rollback {
            txn.emit(Signal::Message("Deployments unchanged.")).await;
        }
        if changed || base {
            let origins: Vec<String> = lock(&self.state)
                .deployments
                .iter()
                .map(|d| d.container_image_reference.clone())
                .collect();
            let (images, layers) = super::import::prune(&self.sysroot, origins)
                .await
                .map_err(|e| format!("syscore cleanup: {e:#}"))?;
            if images > 0 || layers > 0 {
                info!(txn = txn.id, images, layers, "pruned container images");
                txn.emit(Signal::Message(&format!(
                    "Pruned images: {images} (layers: {layers})"
                )))
                .await;
            }
        }
        Ok(())
    }

    /// The checks of the real `finalize_deployment_transaction_execute`, in its order.
    pub(super) async fn run_finalize(
        self: &Arc<Self>,
        txn: &Arc<Txn>,
        plan: &FinalizePlan,
    ) -> Result<(), String> {
        self.injected_failure(txn).await?;
        {
            let state = lock(&self.state);
            let Some(first) = state.deployments.first() else {
                return Err("No deployments found".into());
            };
            if !first.staged {
                return Err("No pending staged deployment found".into());
            }
            if first.osname != self.osname {
                return Err(format!(
                    "Staged deployment is not for osname '{}'",
                    self.osname
                ));
            }
            // From v2025.7 (e47214b7) the image digest, or the base commit when the image's
            // metadata cannot be read (the `query_container_image_commit` fallback); before,
            // always the base commit (`layeredmeta.base_commit`).
            let base = first
                .base_checksum
                .clone()
                .unwrap_or_else(|| first.checksum.clone());
            let found = match first.container_image_reference_digest.as_str() {
                "" => base,
                _ if !self.version.finalizes_by_digest() => base,
                digest => digest.to_string(),
            };
            match &plan.checksum {
                None if !plan.allow_missing_checksum => {
                    return Err("Missing expected checksum".into());
                }
                Some(expected) if *expected != found => {
                    return Err(format!(
                        "Expected staged base checksum {expected}, but found {found}"
                    ));
                }
                _ => {}
            }
        }
        // Inhibitors before the lock, as upstream: "Check for inhibitor locks before unlocking
        // staged deployment" comes first in `finalize_deployment_transaction_execute`.
        self.check_inhibitors().await?;
        let (found, locked) = {
            let state = lock(&self.state);
            let Some(staged) = state.staged() else {
                return Err("No pending staged deployment found".into());
            };
            if !staged.finalization_locked && !plan.allow_unlocked {
                return Err("Staged deployment already unlocked".into());
            }
            (
                staged.container_image_reference_digest.clone(),
                staged.finalization_locked,
            )
        };
        if self.real.is_some() {
            // `ostree_sysroot_change_finalization`, only on a locked deployment; the model
            // then reads libostree's record back.
            if locked {
                self.real_op(RealOp::Unlock).await?;
            }
            self.resync(None)?;
        } else {
            let mut state = lock(&self.state);
            let Some(staged) = state.staged_mut() else {
                return Err("No pending staged deployment found".into());
            };
            staged.finalization_locked = false;
            self.save_state(&state)?;
        }
        info!(txn = txn.id, digest = %found, "finalized deployment; rebooting");
        self.request_reboot()?;
        self.update_record(txn.id, |r| r.reboot_requested = true);
        if std::mem::take(&mut lock(&self.knobs).drop_after_unlock) {
            // The reboot is queued and the host goes down (rpm-ostreed with it) before the
            // client reads `Finished`: its peer connection just closes.
            warn!(
                txn = txn.id,
                "dropping the finalize transaction's peers after unlocking"
            );
            self.update_record(txn.id, |r| r.crashed = true);
            let peers = self.detach(txn);
            let daemon = self.clone();
            tokio::spawn(async move {
                for peer in peers {
                    let _ = peer.close().await;
                }
                daemon.notify_deployments().await;
                daemon.notify_active_txn().await;
            });
            // Detaching aborted this run's task, which ends here: no `Finished`, no result.
            std::future::pending::<()>().await;
        }
        self.notify_deployments().await;
        Ok(())
    }

    /// The real daemon's `check_sd_inhibitor_locks`: logind's `ListInhibitors`, and an error
    /// naming the first `block`-mode lock that covers `shutdown`.
    async fn check_inhibitors(&self) -> Result<(), String> {
        let conn = self
            .bus_conn()
            .ok_or_else(|| "not connected to the system bus".to_string())?;
        let reply = conn
            .call_method(
                Some("org.freedesktop.login1"),
                "/org/freedesktop/login1",
                Some("org.freedesktop.login1.Manager"),
                "ListInhibitors",
                &(),
            )
            .await
            .map_err(|e| format!("ListInhibitors: {e}"))?;
        let list: Vec<(String, String, String, String, u32, u32)> = reply
            .body()
            .deserialize()
            .map_err(|e| format!("ListInhibitors returned an unexpected reply: {e}"))?;
        let blocking: Vec<_> = list
            .iter()
            .filter(|(what, _, _, mode, _, _)| what.contains("shutdown") && mode == "block")
            .collect();
        let Some((_, who, why, _, _, _)) = blocking.first() else {
            return Ok(());
        };
        let mut msg = format!(
            "Reboot blocked by a systemd inhibitor lock in `block` mode\nHeld by: {who}\nReason: {why}"
        );
        if blocking.len() > 1 {
            msg.push_str(&format!(
                "\nand {} other blocking inhibitor lock(s)\nUse `systemd-inhibit --list` to see details",
                blocking.len() - 1
            ));
        }
        Err(msg)
    }
}

/// GLib's `g_format_size` (SI units, one decimal).
fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("kB", 1_000),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            // Tenths, rounded; integer math keeps clippy's cast lints quiet.
            let tenths = (bytes * 10 + size / 2) / size;
            return format!("{}.{} {unit}", tenths / 10, tenths % 10);
        }
    }
    format!("{bytes} bytes")
}

/// `g_date_time_format (dt, "%c")` in the C locale, as the daemon formats it:
/// `Sun Nov 15 00:00:00 2026`.
fn c_locale_time(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = i64::try_from(secs).unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let t = secs.rem_euclid(86_400);
    let (y, m, d) = crate::fixtures::images::civil_from_days(days);
    // 1970-01-01 was a Thursday.
    let weekday = DAYS[usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0)];
    let month = MONTHS[usize::try_from(m - 1).unwrap_or(0).min(11)];
    format!(
        "{weekday} {month} {d:>2} {:02}:{:02}:{:02} {y}",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

#[cfg(test)]
mod tests {
    use super::format_size;

    #[test]
    fn sizes_print_like_glib() {
        assert_eq!(format_size(1_200_000_000), "1.2 GB");
        assert_eq!(format_size(100_000_000), "100.0 MB");
        assert_eq!(format_size(999), "999 bytes");
    }
}
