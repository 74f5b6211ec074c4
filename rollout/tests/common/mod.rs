//! What the end-to-end tests share: the shipped manifests applied to a testbed API server, and
//! streamd-rollout started as its service account.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;
use testbed::apiserver::ApiServer;

/// The service account the Deployment runs as (docs/deploy/rollout/rbac.yaml).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:streamd-rollout:streamd-rollout";

/// A file of docs/deploy/rollout/.
pub fn manifest(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/deploy/rollout")
        .join(name);
    std::fs::read_to_string(path).expect("manifest")
}

/// Applies the CRD and the RBAC and returns a kubeconfig of the service account (the fake
/// serves no ServiceAccount objects: the account is a token user the bindings name).
pub fn install(api: &ApiServer) -> PathBuf {
    api.create_manifests(&manifest("crd.yaml")).expect("crd");
    let rbac: Vec<Value> = serde_saphyr::from_multiple(&manifest("rbac.yaml")).expect("rbac");
    for doc in rbac.into_iter().filter(|d| d["kind"] != "ServiceAccount") {
        api.create(doc).expect("rbac object");
    }
    api.add_user(SERVICE_ACCOUNT).expect("service account")
}

/// Starts `streamd-rollout run --identity <identity> <extra…>` with `kubeconfig`, its log in
/// `log`; the process is SIGKILLed when the handle is dropped.
pub fn controller(
    kubeconfig: &Path,
    identity: &str,
    extra: &[&str],
    log: &Path,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_streamd-rollout"))
        .args([
            "run",
            "--identity",
            identity,
            "--lease-namespace",
            "streamd-rollout",
        ])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("streamd-rollout")
}
