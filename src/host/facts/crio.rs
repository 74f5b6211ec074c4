//! CRI-O's default OCI runtime (`[crio.runtime] default_runtime`).
//!
//! RHEL 10 ships no runc: a node whose CRI-O still defaults to runc must move to crun first.

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

    #[test]
    fn bad_files_are_errors() {
        let e = default_runtime(&[f("x.conf", "[crio.runtime\n")]).expect_err("syntax");
        assert_eq!(e.file, "x.conf");
        let e = default_runtime(&[f("y.conf", "[crio.runtime]\ndefault_runtime = 1\n")])
            .expect_err("type");
        assert!(e.message.contains("string"), "{e}");
    }
}
