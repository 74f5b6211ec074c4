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

/// The two values [`fips`] compares, as read, for a reason that must show them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FipsSources {
    /// `/proc/sys/crypto/fips_enabled`, trimmed; `None`: absent (no FIPS support).
    pub fips_enabled: Option<String>,
    /// The last `fips=` argument on the kernel command line; `None`: there is none.
    pub cmdline: Option<String>,
}

impl FipsSources {
    /// Reads the two values from the same inputs as [`fips`].
    pub fn read(fips_enabled: Option<&str>, cmdline: &str) -> FipsSources {
        let value = |v: &str| crate::text::one_line(v.trim(), 32);
        FipsSources {
            fips_enabled: fips_enabled.map(value),
            cmdline: cmdline
                .split_whitespace()
                .rev()
                .find(|a| a.starts_with("fips="))
                .map(value),
        }
    }
}

impl std::fmt::Display for FipsSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.fips_enabled {
            Some(v) => write!(f, "/proc/sys/crypto/fips_enabled is {v}")?,
            None => write!(f, "/proc/sys/crypto/fips_enabled is absent")?,
        }
        match &self.cmdline {
            Some(a) => write!(f, " and the kernel command line has {a}"),
            None => write!(f, " and the kernel command line has no fips= argument"),
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

    #[test]
    fn the_sources_say_both_values() {
        let cases = [
            (
                Some("1\n"),
                "BOOT_IMAGE=x rw",
                "/proc/sys/crypto/fips_enabled is 1 and the kernel command line has no fips= argument",
            ),
            (
                None,
                "fips=0 fips=1",
                "/proc/sys/crypto/fips_enabled is absent and the kernel command line has fips=1",
            ),
            (
                Some("0"),
                "fips=yes",
                "/proc/sys/crypto/fips_enabled is 0 and the kernel command line has fips=yes",
            ),
        ];
        for (enabled, cmdline, want) in cases {
            assert_eq!(FipsSources::read(enabled, cmdline).to_string(), want);
        }
    }
}
