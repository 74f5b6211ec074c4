//! Whether UEFI Secure Boot is on, from the `SecureBoot` EFI variable.
//!
//! efivarfs shows each variable as a file of 4 bytes of attributes (little-endian) followed by
//! its data; `SecureBoot` (EFI global variable GUID `8be4df61-93ca-11d2-aa0d-00e098032b8c`) is
//! one byte, `1` when Secure Boot is enforced (UEFI spec 2.10 §3.3, "Globally Defined
//! Variables"). A host without `/sys/firmware/efi` booted through BIOS; an EFI host without the
//! variable has no Secure Boot. The machine-config daemon asks `mokutil --sb-state`, which reads
//! the same variable, and takes a failure as "enabled"
//! (openshift/machine-config-operator:pkg/daemon/bootupd.go `isSecureBootEnabled`); streamd
//! does the same with a variable it cannot read.

use super::HostRoot;

/// The `SecureBoot` variable below efivarfs.
pub const SECURE_BOOT_VAR: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// Why the `SecureBoot` variable gives no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecureBootError {
    /// The variable holds fewer than 5 bytes (how many).
    #[error("{SECURE_BOOT_VAR} holds {0} bytes, expected 5")]
    Short(usize),
    /// The variable exists but cannot be read (the system's words).
    #[error("{SECURE_BOOT_VAR}: {0}")]
    Unreadable(String),
}

impl SecureBootError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            SecureBootError::Short(_) => "secure-boot-variable-short",
            SecureBootError::Unreadable(_) => "secure-boot-variable-unreadable",
        }
    }
}

/// `Ok(true)` when Secure Boot is on, `Ok(false)` when off or not an EFI boot; `Err` with what
/// is wrong when the variable exists but cannot be read (callers take that as on).
pub fn secure_boot(root: &HostRoot) -> Result<bool, SecureBootError> {
    if !root.path("/sys/firmware/efi").exists() {
        return Ok(false);
    }
    match std::fs::read(root.path(SECURE_BOOT_VAR)) {
        Ok(bytes) => match bytes.get(4) {
            Some(v) => Ok(*v == 1),
            None => Err(SecureBootError::Short(bytes.len())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(SecureBootError::Unreadable(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_efi_variable_decides() {
        let d = testbed::scratch::ScratchDir::new("sb").expect("scratch dir");
        let root = HostRoot::new(d.path());
        assert_eq!(secure_boot(&root), Ok(false), "BIOS boot");
        let var = root.path(SECURE_BOOT_VAR);
        std::fs::create_dir_all(var.parent().expect("parent")).expect("mkdir");
        assert_eq!(secure_boot(&root), Ok(false), "EFI without the variable");
        std::fs::write(&var, [6, 0, 0, 0, 1]).expect("write");
        assert_eq!(secure_boot(&root), Ok(true));
        std::fs::write(&var, [6, 0, 0, 0, 0]).expect("write");
        assert_eq!(secure_boot(&root), Ok(false));
        std::fs::write(&var, [6, 0]).expect("write");
        assert!(secure_boot(&root).is_err(), "a short variable is no answer");
        let _ = std::fs::remove_dir_all(&d);
    }
}
