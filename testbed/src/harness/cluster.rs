//! What a testbed directory holds besides its hosts: the registry and its pull secret, the
//! cluster objects a cluster with streamd deployed has, and `DIR/env`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::fakes::apiserver::{ApiServer, StreamImages};
use crate::fakes::registry::{Registry, RegistryConfig};
use crate::fixtures::openshift::{FeatureSet, OpenShift};

/// Applies what a cluster with streamd deployed has: its RBAC and, when `openshift` serves the
/// OSImageStream on `feature_set` (in the version it serves), the OSImageStream `cluster`
/// publishing `rhel-9` (the default) and `rhel-10` with the registry's images, written by the
/// operator build of `openshift`.
pub(crate) fn prepare_cluster(
    apiserver: &ApiServer,
    registry: &Registry,
    openshift: OpenShift,
    feature_set: FeatureSet,
) -> anyhow::Result<()> {
    apiserver.create_manifests(include_str!("../../../docs/deploy/rbac.yaml"))?;
    let served = openshift.osimagestream_version(feature_set);
    apiserver.serve_os_image_streams(served)?;
    if served.is_none() {
        return Ok(());
    }
    let images = registry.images();
    let stream_images = |i: usize, stream: &str| StreamImages {
        name: stream.into(),
        os_image: images
            .get(i)
            .map(|i| i.pullspec.clone())
            .unwrap_or_default(),
        extensions_image: extensions_of(registry, stream),
    };
    apiserver.create_os_image_stream_by(
        Some(openshift.controller_version()),
        "rhel-9",
        &[stream_images(0, "rhel-9"), stream_images(1, "rhel-10")],
    )
}

/// The extensions image of `stream`, or "".
fn extensions_of(registry: &Registry, stream: &str) -> String {
    registry
        .extensions()
        .iter()
        .find(|e| e.stream == stream)
        .map(|e| e.pullspec.clone())
        .unwrap_or_default()
}

/// The variables of `DIR/env` that point a client at the cluster as its admin: `KUBECONFIG`,
/// `TESTBED_DIR`, `TESTBED_API_URL` and `KUBECACHEDIR`. kubectl keeps its discovery per
/// `host_port` under `~/.kube/cache` for hours, and fake API servers reuse ephemeral ports: a
/// testbed serving OSImageStream as `v1alpha1` on a port where an earlier one served `v1` had
/// kubectl ask for the `v1` path and get a 404 (seen in a test run). Each testbed keeps its own.
pub(crate) fn admin_env(dir: &Path, api_url: &str) -> [(String, String); 4] {
    [
        (
            "KUBECONFIG".to_string(),
            dir.join("kubeconfig-admin").display().to_string(),
        ),
        ("TESTBED_DIR".into(), dir.display().to_string()),
        ("TESTBED_API_URL".into(), api_url.to_string()),
        (
            "KUBECACHEDIR".into(),
            dir.join("kube-cache").display().to_string(),
        ),
    ]
}

/// Starts the registry in `dir/registry` and writes `dir/pull-secret.json` for it.
pub(crate) async fn start_registry(dir: &Path) -> anyhow::Result<(Registry, PathBuf)> {
    let registry = Registry::start(RegistryConfig {
        dir: dir.join("registry"),
    })
    .await
    .context("starting the registry")?;
    let pull_secret = dir.join("pull-secret.json");
    std::fs::write(&pull_secret, registry.pull_secret_json()).context("writing the pull secret")?;
    Ok((registry, pull_secret))
}

/// The `TESTBED_*` image and registry variables of `DIR/env`.
pub(crate) fn image_env(registry: &Registry, pull_secret: &Path) -> BTreeMap<String, String> {
    let image = |i: usize| {
        registry
            .images()
            .get(i)
            .map(|i| i.pullspec.clone())
            .unwrap_or_default()
    };
    BTreeMap::from([
        ("TESTBED_RHEL9_IMAGE".to_string(), image(0)),
        ("TESTBED_RHEL10_IMAGE".into(), image(1)),
        (
            "TESTBED_RHEL9_EXTENSIONS_IMAGE".into(),
            extensions_of(registry, "rhel-9"),
        ),
        (
            "TESTBED_RHEL10_EXTENSIONS_IMAGE".into(),
            extensions_of(registry, "rhel-10"),
        ),
        ("TESTBED_REGISTRY".into(), registry.host().to_string()),
        (
            "TESTBED_PULL_SECRET".into(),
            pull_secret.display().to_string(),
        ),
    ])
}

/// Writes `DIR/env` (shell-sourceable `export K='V'` lines) through a rename, so a reader
/// never sees half of it.
pub(crate) fn write_env(dir: &Path, env: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let mut text = String::from("# written by `testbed up`; source it: . DIR/env\n");
    for (k, v) in env {
        text.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
    }
    let tmp = dir.join("env.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("env")).context("publishing DIR/env")?;
    Ok(())
}
