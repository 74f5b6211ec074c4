//! CRI-O's default OCI runtime (`[crio.runtime] default_runtime`), and the images pinned in
//! its storage (`[crio.image] pinned_images`).
//!
//! RHEL 10 ships no runc: a node whose CRI-O still defaults to runc must move to crun first.

/// The drop-in where the machine-config daemon lists the images of the node's pools'
/// PinnedImageSets, written only once every one of them is in CRI-O's storage and removed when
/// none is left (openshift/machine-config-operator:pkg/daemon/pinned_image_set.go
/// `crioPinnedImagesDropInFilePath`, `syncMachineConfigPools`, `ensureCrioPinnedImagesConfigFile`;
/// on 4.21, 4.22 and 4.23).
pub const PINNED_IMAGES: &str = "/etc/crio/crio.conf.d/50-pinned-images";

/// The most images kept of [`PINNED_IMAGES`] (a PinnedImageSet pins a release's images:
/// hundreds).
pub const MAX_PINNED_IMAGES: usize = 4096;

/// The runtime CRI-O uses when `default_runtime` is not set: crun since CRI-O 1.31, which is
/// older than every CRI-O that runs on RHEL 10.
pub const CRIO_DEFAULT_RUNTIME: &str = "crun";

/// A CRI-O config file that is not valid TOML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct CrioConfigError {
    /// The file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

impl CrioConfigError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "crio-config-invalid"
    }
}

/// The effective default runtime of `files` (path, text) applied in order, last one wins.
pub fn default_runtime(files: &[(String, String)]) -> Result<String, CrioConfigError> {
    let mut runtime = None;
    for (file, text) in files {
        let doc: toml::Table = toml::from_str(text).map_err(|e| CrioConfigError {
            file: file.clone(),
            message: e.message().to_string(),
        })?;
        let value = doc
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("default_runtime"));
        match value {
            Some(toml::Value::String(s)) => runtime = Some(s.clone()),
            Some(other) => {
                return Err(CrioConfigError {
                    file: file.clone(),
                    message: format!("default_runtime must be a string, not {}", other.type_str()),
                });
            }
            None => {}
        }
    }
    Ok(runtime.unwrap_or_else(|| CRIO_DEFAULT_RUNTIME.to_string()))
}

/// The images the pinned-images drop-in `text` (of `file`) lists, at most
/// [`MAX_PINNED_IMAGES`]; an absent list is none.
pub fn pinned_images(file: &str, text: &str) -> Result<Vec<String>, CrioConfigError> {
    let error = |message: String| CrioConfigError {
        file: file.to_string(),
        message,
    };
    let doc: toml::Table = toml::from_str(text).map_err(|e| error(e.message().to_string()))?;
    let value = doc
        .get("crio")
        .and_then(|c| c.get("image"))
        .and_then(|i| i.get("pinned_images"));
    match value {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(a)) => a
            .iter()
            .take(MAX_PINNED_IMAGES)
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .ok_or_else(|| error("pinned_images must be a list of strings".into()))
            })
            .collect(),
        Some(other) => Err(error(format!(
            "pinned_images must be a list, not {}",
            other.type_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, text: &str) -> (String, String) {
        (name.to_string(), text.to_string())
    }

    #[test]
    fn last_file_wins() {
        let files = [
            f("crio.conf", "[crio.runtime]\ndefault_runtime = \"runc\"\n"),
            f(
                "crio.conf.d/00-default.conf",
                "[crio]\nlog_level = \"info\"\n",
            ),
            f(
                "crio.conf.d/99-crun.conf",
                "[crio.runtime]\ndefault_runtime = \"crun\"\n",
            ),
        ];
        assert_eq!(default_runtime(&files).as_deref(), Ok("crun"));
        assert_eq!(default_runtime(&files[..2]).as_deref(), Ok("runc"));
        assert_eq!(default_runtime(&[]).as_deref(), Ok(CRIO_DEFAULT_RUNTIME));
    }

    /// The drop-in as `createCrioConfigFileBytes` encodes it.
    #[test]
    fn pinned_images_are_read_from_the_mcds_drop_in() {
        let text = "[crio]\n  [crio.image]\n    pinned_images = [\"quay.io/a/b@sha256:1\", \"quay.io/c/d@sha256:2\"]\n";
        assert_eq!(
            pinned_images(PINNED_IMAGES, text),
            Ok(vec![
                "quay.io/a/b@sha256:1".into(),
                "quay.io/c/d@sha256:2".into()
            ])
        );
        assert_eq!(pinned_images(PINNED_IMAGES, ""), Ok(Vec::new()));
        for bad in [
            "[crio.image\n",
            "[crio.image]\npinned_images = 1\n",
            "[crio.image]\npinned_images = [1]\n",
        ] {
            let e = pinned_images(PINNED_IMAGES, bad).expect_err(bad);
            assert_eq!(e.file, PINNED_IMAGES);
        }
    }

    #[test]
    fn bad_files_are_errors() {
        let e = default_runtime(&[f("x.conf", "[crio.runtime\n")]).expect_err("syntax");
        assert_eq!(e.file, "x.conf");
        let e = default_runtime(&[f("y.conf", "[crio.runtime]\ndefault_runtime = 1\n")])
            .expect_err("type");
        assert!(e.message.contains("string"), "{e}");
    }
}
