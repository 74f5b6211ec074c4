//! `bootc status --json`, parsed in every shape bootc has printed.

use std::path::Path;

use serde::Deserialize;

use super::BootcError;
use crate::backend::Deployment;

pub(super) fn read_output(path: &Path) -> Result<String, BootcError> {
    std::fs::read_to_string(path).map_err(|e| BootcError::Output {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `bootc status --json` (`BootcHost` of `org.containers.bootc/v1`, or `v1alpha1` before
/// bootc v1.1.0).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Host {
    api_version: String,
    kind: String,
    status: HostStatus,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostStatus {
    staged: Option<BootEntry>,
    booted: Option<BootEntry>,
    rollback: Option<BootEntry>,
    #[serde(default)]
    other_deployments: Vec<BootEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootEntry {
    image: Option<ImageStatus>,
    incompatible: bool,
    pinned: bool,
    /// Printed since v1.12.0 (`upgrade --download-only`): its presence says this bootc can
    /// hold a stage.
    #[serde(default)]
    download_only: Option<bool>,
    ostree: Option<BootEntryOstree>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageStatus {
    image: ImageReference,
    version: Option<String>,
    image_digest: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageReference {
    image: String,
    transport: String,
    signature: Option<Signature>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Signature {
    OstreeRemote(String),
    ContainerPolicy,
    Insecure,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootEntryOstree {
    /// Printed since bootc v1.3.0.
    #[serde(default)]
    stateroot: Option<String>,
    checksum: String,
    deploy_serial: u32,
}

impl ImageReference {
    /// The ostree-ext image reference bootc writes into the origin, which rpm-ostree shows as
    /// `container-image-reference`.
    fn ostree_refspec(&self) -> String {
        let registry = self.transport == "registry";
        let imgref = if registry {
            format!("docker://{}", self.image)
        } else {
            format!("{}:{}", self.transport, self.image)
        };
        match &self.signature {
            None | Some(Signature::Insecure) if registry => {
                format!("ostree-unverified-registry:{}", self.image)
            }
            None | Some(Signature::Insecure) => format!("ostree-unverified-image:{imgref}"),
            Some(Signature::ContainerPolicy) => format!("ostree-image-signed:{imgref}"),
            Some(Signature::OstreeRemote(r)) if registry => {
                format!("ostree-remote-registry:{r}:{}", self.image)
            }
            Some(Signature::OstreeRemote(r)) => format!("ostree-remote-image:{r}:{imgref}"),
        }
    }
}

impl BootEntry {
    fn to_deployment(&self, booted: bool, staged: bool) -> Result<Deployment, BootcError> {
        let ostree = self.ostree.as_ref().ok_or_else(|| {
            BootcError::Status(
                "a deployment without ostree data (composefs-backed hosts are not supported)"
                    .into(),
            )
        })?;
        let serial = i32::try_from(ostree.deploy_serial).map_err(|_| {
            BootcError::Status(format!(
                "deploySerial {} is out of range",
                ostree.deploy_serial
            ))
        })?;
        // Before v1.3.0 bootc does not say the stateroot: the deployment is then known by its
        // checksum and serial (unique within a stateroot) and `osname` stays empty.
        let osname = ostree.stateroot.clone().unwrap_or_default();
        let id = if osname.is_empty() {
            format!("{}.{}", ostree.checksum, serial)
        } else {
            format!("{osname}-{}.{}", ostree.checksum, serial)
        };
        Ok(Deployment {
            id,
            osname,
            serial,
            checksum: ostree.checksum.clone(),
            booted,
            staged,
            pinned: self.pinned,
            finalization_locked: staged && self.download_only == Some(true),
            version: self.image.as_ref().and_then(|i| i.version.clone()),
            container_image_reference: self.image.as_ref().map(|i| i.image.ostree_refspec()),
            container_image_reference_digest: self.image.as_ref().map(|i| i.image_digest.clone()),
            incompatible: self.incompatible,
            ..Deployment::default()
        })
    }
}

/// Parses `bootc status --json` into deployments: staged, booted, rollback, others.
pub fn parse_status(json: &str) -> Result<Vec<Deployment>, BootcError> {
    parse_host(json).map(|(deployments, _)| deployments)
}

/// [`parse_status`], and whether this bootc can hold a stage: it prints `downloadOnly` (since
/// v1.12.0, with `upgrade --download-only` and `--from-downloaded`: bootc-dev/bootc commits
/// c325582f and a5784832).
pub(super) fn parse_host(json: &str) -> Result<(Vec<Deployment>, bool), BootcError> {
    let host: Host = serde_json::from_str(json)
        .map_err(|e| BootcError::Status(format!("not a bootc host document: {e}")))?;
    if host.kind != "BootcHost" || !host.api_version.starts_with("org.containers.bootc/") {
        return Err(BootcError::Status(format!(
            "kind {:?} of {:?}, expected BootcHost of org.containers.bootc",
            host.kind, host.api_version
        )));
    }
    let s = &host.status;
    let mut out = Vec::new();
    if let Some(e) = &s.staged {
        out.push(e.to_deployment(false, true)?);
    }
    match &s.booted {
        Some(e) => out.push(e.to_deployment(true, false)?),
        None => {
            return Err(BootcError::Status(
                "the host is not booted through ostree (status.booted is null)".into(),
            ));
        }
    }
    for e in s.rollback.iter().chain(&s.other_deployments) {
        out.push(e.to_deployment(false, false)?);
    }
    let holds = s.booted.as_ref().is_some_and(|b| b.download_only.is_some());
    Ok((out, holds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refspecs_follow_ostree_ext() {
        let r = |transport: &str, signature: Option<Signature>| ImageReference {
            image: "q.io/a/b@sha256:00".into(),
            transport: transport.into(),
            signature,
        };
        let cases = [
            (
                r("registry", None),
                "ostree-unverified-registry:q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::Insecure)),
                "ostree-unverified-registry:q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::ContainerPolicy)),
                "ostree-image-signed:docker://q.io/a/b@sha256:00",
            ),
            (
                r("registry", Some(Signature::OstreeRemote("rh".into()))),
                "ostree-remote-registry:rh:q.io/a/b@sha256:00",
            ),
            (
                r("oci", None),
                "ostree-unverified-image:oci:q.io/a/b@sha256:00",
            ),
            (
                r("oci", Some(Signature::OstreeRemote("rh".into()))),
                "ostree-remote-image:rh:oci:q.io/a/b@sha256:00",
            ),
        ];
        for (reference, want) in cases {
            assert_eq!(reference.ostree_refspec(), want);
            if reference.transport == "registry" {
                assert_eq!(
                    crate::backend::deployment::pullspec_of_refspec(want),
                    Some("q.io/a/b@sha256:00"),
                    "{want}"
                );
            }
        }
    }
}
