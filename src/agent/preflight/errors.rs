//! Why a fact the checks look at could not be had. The gatherer keeps the error as it came;
//! its text is made only where a check reports it (the check's message, the node's reason).

use std::error::Error;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::Input;
use crate::host::facts::crio::CrioConfigError;
use crate::host::facts::machineconfig::AppliedConfig;
use crate::image::pullsecret::PullSecretError;
use crate::image::registry::InspectError;

/// A fact of [`Input`] that could not be had, by where it comes from.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FactError {
    /// The running kernel's variant: its release cannot be read, or it disagrees with the
    /// booted deployment's overrides (`crate::host::facts::kernel_variant`).
    #[error(transparent)]
    Kernel(Cause),
    /// CRI-O's configuration is not valid TOML, or its default runtime is not a string.
    #[error(transparent)]
    CrioConfig(#[from] CrioConfigError),
    /// The OS image, inspected where and as the OS daemon pulls it
    /// (`crate::host::ospull::inspect`): the pull cannot be made, or no source served it.
    #[error(transparent)]
    OsImage(Cause),
    /// streamd's pull secret exists but cannot be read.
    #[error("{}: {source}", path.display())]
    PullSecretUnreadable {
        /// The pull secret's path.
        path: PathBuf,
        /// Why it cannot be read.
        source: Arc<std::io::Error>,
    },
    /// streamd's pull secret is not a docker config.
    #[error("{}: {source}", path.display())]
    PullSecretInvalid {
        /// The pull secret's path.
        path: PathBuf,
        /// What is wrong with it.
        source: PullSecretError,
    },
    /// The registry client for the extensions image cannot be made.
    #[error(transparent)]
    RegistryClient(InspectError),
    /// The extensions image cannot be read (a failure a retry would not mend).
    #[error(transparent)]
    ExtensionsImage(InspectError),
    /// The MachineConfig the machine-config daemon applied cannot be read or is not one.
    #[error(transparent)]
    MachineConfig(Cause),
    /// A host file the checks read exists but cannot be read.
    #[error("{}: {source}", path.display())]
    HostFile {
        /// The file (host path).
        path: PathBuf,
        /// Why it cannot be read.
        source: Arc<std::io::Error>,
    },
}

impl FactError {
    /// The applied MachineConfig as the checks take it, from what its reader gave.
    pub fn of_machine_config<E>(read: &Result<AppliedConfig, E>) -> Result<AppliedConfig, Self>
    where
        E: Clone + Into<Box<dyn Error + Send + Sync>>,
    {
        read.clone()
            .map_err(|e| FactError::MachineConfig(Cause::new(e)))
    }

    /// A short, stable name of the source, for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FactError::Kernel(_) => "kernel",
            FactError::CrioConfig(_) => "crio-config",
            FactError::OsImage(_) => "os-image",
            FactError::PullSecretUnreadable { .. } => "pull-secret-unreadable",
            FactError::PullSecretInvalid { .. } => "pull-secret-invalid",
            FactError::RegistryClient(_) => "registry-client",
            FactError::ExtensionsImage(_) => "extensions-image",
            FactError::MachineConfig(_) => "machine-config",
            FactError::HostFile { .. } => "host-file",
        }
    }
}

/// The error another module gave for a fact, kept as that error: whatever type it has there
/// (a `String` where it has none yet), its text is its own.
#[derive(Debug, Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync>);

impl Cause {
    /// Keeps `e`.
    pub fn new(e: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Cause(Arc::from(e.into()))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

impl Input {
    /// Every fact that could not be had, in field order.
    pub fn fact_errors(&self) -> impl Iterator<Item = &FactError> {
        let kernel = self.kernel.as_ref().err();
        let crio = self.crio_runtime.as_ref().err();
        let os_image = self.os_image.as_ref().err();
        let extensions = self.extensions.as_ref().and_then(|e| e.as_ref().err());
        let layering = self.layering.as_ref().err();
        let machine_config = self.machine_config.as_ref().and_then(|m| m.as_ref().err());
        [kernel, crio, os_image, extensions, layering, machine_config]
            .into_iter()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text is the source's own, byte for byte, whatever its type; the label names the
    /// source.
    #[test]
    fn the_text_is_the_sources_and_the_label_names_it() {
        let kernel = FactError::Kernel(Cause::new("overrides and running kernel disagree"));
        assert_eq!(kernel.to_string(), "overrides and running kernel disagree");
        assert_eq!(kernel.label(), "kernel");
        let crio = FactError::from(CrioConfigError {
            file: "/etc/crio/crio.conf".into(),
            message: "expected `=`".into(),
        });
        assert_eq!(crio.to_string(), "/etc/crio/crio.conf: expected `=`");
        assert_eq!(crio.label(), "crio-config");
        let secret = FactError::PullSecretInvalid {
            path: "/var/lib/kubelet/config.json".into(),
            source: PullSecretError::Format("line 1 column 2".into()),
        };
        assert_eq!(
            secret.to_string(),
            "/var/lib/kubelet/config.json: pull secret is not a docker config JSON document: line 1 column 2"
        );
        assert!(secret.source().is_some(), "the parse error is its source");
        let unreadable = FactError::PullSecretUnreadable {
            path: "/p".into(),
            source: Arc::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
        assert_eq!(unreadable.to_string(), "/p: permission denied");
        assert_eq!(unreadable.label(), "pull-secret-unreadable");
        let ext = FactError::ExtensionsImage(InspectError::Unauthorized("quay.io".into()));
        assert_eq!(ext.to_string(), "pull secret rejected by quay.io");
        assert_eq!(ext.label(), "extensions-image");
    }
}
