//! The rollout controller on a fleet, as docs/deploy/rollout/ deploys it: the StreamPool CRD and
//! the controller's RBAC applied to the fake API server, and `streamd-rollout run` replicas that
//! authenticate as its service account and compete for its Lease (leader election on), each
//! with the pod identity the Deployment's `POD_NAME`/`POD_NAMESPACE` would give it.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::fakes::apiserver::ApiServer;

/// The service account the Deployment runs as (docs/deploy/rollout/rbac.yaml), as the API server
/// names its user.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:streamd-rollout:streamd-rollout";
/// The Deployment's namespace, where its Lease lives.
pub const NAMESPACE: &str = "streamd-rollout";
/// The Lease the replicas compete for (`streamd-rollout run`'s default `--lease-name`).
pub const LEASE: &str = "streamd-rollout";

/// The shipped manifests, as an admin applies them.
const CRD_YAML: &str = include_str!("../../../../docs/deploy/rollout/crd.yaml");
const RBAC_YAML: &str = include_str!("../../../../docs/deploy/rollout/rbac.yaml");

/// Applies the shipped CRD and RBAC and returns a kubeconfig of the service account. The fake
/// serves no ServiceAccount objects: the account is a token user that the bindings name, so it
/// gets exactly what rbac.yaml grants.
pub fn install(api: &ApiServer) -> anyhow::Result<PathBuf> {
    api.create_manifests(CRD_YAML)
        .context("creating the StreamPool CRD (docs/deploy/rollout/crd.yaml)")?;
    let rbac: Vec<Value> =
        serde_saphyr::from_multiple(RBAC_YAML).context("parsing docs/deploy/rollout/rbac.yaml")?;
    for doc in rbac
        .into_iter()
        .filter(|d| !d.is_null() && d["kind"] != "ServiceAccount")
    {
        api.create(doc)
            .context("applying docs/deploy/rollout/rbac.yaml")?;
    }
    api.add_user(SERVICE_ACCOUNT)
}

/// A second service account `account` in the Deployment's namespace, bound to exactly what
/// rbac.yaml grants the first (its bindings copied, the subject renamed), and its kubeconfig:
/// a replica of its own that a fault scoped to one user can cut off from the API server while
/// the other keeps working.
pub fn install_account(api: &ApiServer, account: &str) -> anyhow::Result<PathBuf> {
    let rbac: Vec<Value> =
        serde_saphyr::from_multiple(RBAC_YAML).context("parsing docs/deploy/rollout/rbac.yaml")?;
    for mut doc in rbac.into_iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("RoleBinding" | "ClusterRoleBinding")
        )
    }) {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        doc["metadata"]["name"] = Value::String(format!("{name}-{account}"));
        if let Some(subjects) = doc["subjects"].as_array_mut() {
            for s in subjects {
                s["name"] = Value::String(account.to_string());
            }
        }
        api.create(doc)
            .with_context(|| format!("binding service account {account}"))?;
    }
    api.add_user(&format!("system:serviceaccount:{NAMESPACE}:{account}"))
}

/// The identity holding the Lease, if any.
pub fn leader(api: &ApiServer) -> Option<String> {
    let lease = api
        .get("coordination.k8s.io/v1", "Lease", Some(NAMESPACE), LEASE)
        .ok()?;
    lease
        .pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .map(String::from)
}

/// One replica of the Deployment: `streamd-rollout run` with the service account's kubeconfig,
/// killed when dropped (as its pod would be).
pub struct Replica {
    identity: String,
    child: Child,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").finish_non_exhaustive()
    }
}

impl Replica {
    /// Starts replica `identity` of `bin`, its output in `log`.
    pub fn start(
        bin: &Path,
        kubeconfig: &Path,
        identity: &str,
        log: &Path,
    ) -> anyhow::Result<Replica> {
        let log =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", NAMESPACE);
        Ok(Replica {
            identity: identity.to_string(),
            child: super::spawn_logged(cmd, bin, log)?,
        })
    }

    /// Its identity in the Lease (its pod name).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Its process id while it runs; an error once it has exited.
    pub fn pid(&mut self) -> anyhow::Result<u32> {
        if let Some(status) = self.child.try_wait()? {
            bail!("streamd-rollout {} exited ({status})", self.identity);
        }
        self.child
            .id()
            .with_context(|| format!("streamd-rollout {} has no pid", self.identity))
    }
}
