//! What an administrator (or another tool) does to the sysroot behind rpm-ostreed's back:
//! `ostree admin deploy` without `--stage`, and an image whose metadata is lost.

use std::sync::Arc;

use anyhow::Context;
use tracing::info;

use super::deploy::{NewDeployment, write_deployment};
use super::model::Layering;
use super::{Daemon, lock};

impl Daemon {
    /// `ostree admin deploy --retain-rollback` of the image `pullspec` with a fresh origin
    /// (just its reference, no packages: `ostree_sysroot_origin_new_from_refspec`) and the
    /// booted deployment's kernel arguments. The deployment is pending, not staged: rpm-ostree
    /// takes it as the origin of the next deploy (`rpmostree_syscore_get_origin_merge_deployment`
    /// picks the first deployment of the stateroot) and `FinalizeDeployment` finds nothing to
    /// finalize. An earlier pending deployment is replaced, as without `--retain-pending`.
    pub(crate) async fn admin_deploy(self: &Arc<Self>, pullspec: &str) -> anyhow::Result<()> {
        // Given as `ostree-image-signed:docker://PULLSPEC`: a signed install's origin.
        let (refspec, pullspec) = match pullspec.strip_prefix("ostree-image-signed:docker://") {
            Some(p) => (pullspec.to_string(), p),
            None => (format!("ostree-unverified-registry:{pullspec}"), pullspec),
        };
        if self.real.is_some() {
            // The testbed's `ostree` (2022.7) knows nothing of libostree 2025's staged
            // deployment and its cleanup would delete it.
            anyhow::bail!("admin-deploy is not played over real libostree");
        }
        let _gate = self.txn_gate.lock().await;
        let image = self
            .images
            .iter()
            .find(|i| i.pullspec == pullspec)
            .with_context(|| format!("no test image {pullspec}"))?;
        loop {
            let index = lock(&self.state).cleanup_index(&self.osname, true);
            let Some(index) = index else { break };
            self.undeploy(index).await.map_err(anyhow::Error::msg)?;
            self.resync(None).map_err(anyhow::Error::msg)?;
        }
        let kargs = lock(&self.state)
            .booted()
            .map(|d| d.kargs())
            .unwrap_or_default();
        let mut dep = write_deployment(
            &self.sysroot,
            &self.state_dir.join("scratch"),
            NewDeployment {
                osname: &self.osname,
                refspec: &refspec,
                image,
                arch: &self.arch,
                layering: Layering::default(),
                base_removals: Vec::new(),
                kargs,
                drop_variant: false,
                image_kernel: image.variant,
                host_root: self.host_root.as_deref(),
            },
        )
        .await?;
        dep.unstaged = true;
        info!(digest = %image.digest, checksum = %dep.checksum, "ostree admin deploy");
        self.resync(Some(dep)).map_err(anyhow::Error::msg)?;
        self.notify_deployments().await;
        Ok(())
    }

    /// The image metadata of deployment `index` can no longer be read (its ostree-ext ref was
    /// pruned): `Deployments` leaves out `container-image-reference-digest` for it, as
    /// rpm-ostree does when `query_container_image_commit` fails (coreos/rpm-ostree#4185).
    pub(crate) async fn lose_image_metadata(self: &Arc<Self>, index: usize) -> anyhow::Result<()> {
        {
            let _gate = self.txn_gate.lock().await;
            let mut state = lock(&self.state);
            let dep = state
                .deployments
                .get_mut(index)
                .with_context(|| format!("no deployment {index}"))?;
            dep.container_image_reference_digest.clear();
            self.save_state(&state).map_err(anyhow::Error::msg)?;
        }
        self.notify_deployments().await;
        Ok(())
    }
}
