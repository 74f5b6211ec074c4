//! FIPS mode: the kernel's view and the boot command line must agree.

/// FIPS state of the running host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fips {
    /// FIPS mode is on (kernel and command line agree).
    Enabled,
    /// FIPS mode is off.
    Disabled,
    /// The kernel and the command line disagree: streamd refuses to touch such a host.
    Inconsistent,
}

impl Fips {
    /// `Some(on)` when the state is known, `None` when it is inconsistent.
    pub fn enabled(self) -> Option<bool> {
        match self {
            Fips::Enabled => Some(true),
            Fips::Disabled => Some(false),
            Fips::Inconsistent => None,
        }
    }
}

/// Combines `/proc/sys/crypto/fips_enabled` (absent: the kernel has no FIPS support, i.e. off)
/// and `/proc/cmdline`.
pub fn fips(fips_enabled: Option<&str>, cmdline: &str) -> Fips {
    let kernel = fips_enabled.is_some_and(|v| v.trim() == "1");
    // The last fips= wins, as in the kernel's own parsing.
    let cmd = cmdline
        .split_whitespace()
        .rev()
        .find_map(|a| a.strip_prefix("fips="))
        .is_some_and(|v| v == "1");
    match (kernel, cmd) {
        (true, true) => Fips::Enabled,
        (false, false) => Fips::Disabled,
        _ => Fips::Inconsistent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_table() {
        let cases = [
            (Some("1\n"), "BOOT_IMAGE=x fips=1 rw", Fips::Enabled),
            (Some("0\n"), "BOOT_IMAGE=x rw", Fips::Disabled),
            (None, "rw", Fips::Disabled),
            (Some("1"), "rw", Fips::Inconsistent),
            (Some("0"), "fips=1", Fips::Inconsistent),
            (None, "fips=1", Fips::Inconsistent),
            (Some("1"), "fips=0 fips=1", Fips::Enabled),
            (Some("0"), "fips=1 fips=0", Fips::Disabled),
            (Some("0"), "nofips=1", Fips::Disabled),
        ];
        for (enabled, cmdline, want) in cases {
            assert_eq!(fips(enabled, cmdline), want, "{enabled:?} {cmdline}");
        }
    }
}
