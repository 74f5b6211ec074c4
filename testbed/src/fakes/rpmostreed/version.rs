//! The rpm-ostree release the fake plays: what changed between the oldest release an RHCOS
//! 9.6/10.x node can run and the newest (docs/fidelity.md, "since" column).

use std::fmt;
use std::str::FromStr;

/// An rpm-ostree release, `YEAR.MINOR` as its tags (`v2025.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RpmOstreeVersion {
    year: u16,
    minor: u16,
}

impl RpmOstreeVersion {
    /// The oldest release played: RHEL 10.0's (AlmaLinux 10.0 rebuilds rpm-ostree 2025.5).
    pub const OLDEST: RpmOstreeVersion = RpmOstreeVersion::new(2025, 5);
    /// The newest release played, upstream's latest read.
    pub const NEWEST: RpmOstreeVersion = RpmOstreeVersion::new(2026, 2);
    /// The releases the migration tests run on.
    pub const SUPPORTED: [RpmOstreeVersion; 2] = [Self::OLDEST, Self::NEWEST];
    /// `FinalizeDeployment` compares its checksum with the image digest, not the base commit
    /// (e47214b7, v2025.7).
    const FINALIZE_BY_DIGEST: RpmOstreeVersion = RpmOstreeVersion::new(2025, 7);
    /// Layer tasks count the layer starting, from 1 (da4b4fa0, v2026.2); from v2024.9 to
    /// v2026.1 they count the layers done, from 0. Both print 19 hex digits of the digest.
    const LAYERS_FROM_ONE: RpmOstreeVersion = RpmOstreeVersion::new(2026, 2);
    /// A layered assembly runs the new root's `systemd-sysusers` ("Running systemd-sysusers",
    /// a346d5f3, v2025.7).
    const SYSUSERS: RpmOstreeVersion = RpmOstreeVersion::new(2025, 7);

    const fn new(year: u16, minor: u16) -> Self {
        RpmOstreeVersion { year, minor }
    }

    /// Whether `FinalizeDeployment` compares with the image's manifest digest.
    pub fn finalizes_by_digest(self) -> bool {
        self >= Self::FINALIZE_BY_DIGEST
    }

    /// Whether a layered assembly runs `systemd-sysusers` in the new root.
    pub fn runs_sysusers(self) -> bool {
        self >= Self::SYSUSERS
    }

    /// Whether a pull's layer tasks count from 1 (`[1/N]` first).
    pub fn layers_from_one(self) -> bool {
        self >= Self::LAYERS_FROM_ONE
    }
}

impl Default for RpmOstreeVersion {
    fn default() -> Self {
        Self::NEWEST
    }
}

impl fmt::Display for RpmOstreeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.year, self.minor)
    }
}

impl FromStr for RpmOstreeVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .trim_start_matches('v')
            .split_once('.')
            .and_then(|(y, m)| Some(RpmOstreeVersion::new(y.parse().ok()?, m.parse().ok()?)));
        match parsed {
            Some(v) if (Self::OLDEST..=Self::NEWEST).contains(&v) => Ok(v),
            Some(v) => Err(format!(
                "rpm-ostree {v} is not played: {} to {}",
                Self::OLDEST,
                Self::NEWEST
            )),
            None => Err(format!("{s:?} is not an rpm-ostree version (YEAR.MINOR)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_order_and_gate_their_behaviours() {
        let v = |s: &str| s.parse::<RpmOstreeVersion>();
        assert_eq!(v("2025.5"), Ok(RpmOstreeVersion::OLDEST));
        assert_eq!(v("v2026.2"), Ok(RpmOstreeVersion::NEWEST));
        assert!(v("2025.4").is_err(), "older than RHCOS ships");
        assert!(v("2026.3").is_err(), "newer than read");
        assert!(v("2025").is_err() && v("x.y").is_err());
        assert!(!RpmOstreeVersion::OLDEST.finalizes_by_digest());
        assert!(v("2025.7").is_ok_and(|v| v.finalizes_by_digest()));
        assert!(v("2026.1").is_ok_and(|v| !v.layers_from_one()));
        assert!(RpmOstreeVersion::NEWEST.layers_from_one());
        assert_eq!(RpmOstreeVersion::NEWEST.to_string(), "2026.2");
    }
}
