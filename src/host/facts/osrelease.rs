//! `os-release(5)` parsing and the stream a release belongs to.

use std::collections::BTreeMap;

/// Parsed `os-release` key/value pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OsRelease(BTreeMap<String, String>);

impl OsRelease {
    /// Parses the shell-like `KEY=value` format; malformed lines are skipped, as systemd does.
    pub fn parse(text: &str) -> Self {
        let mut map = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            if k.is_empty() || !k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                continue;
            }
            map.insert(k.to_string(), unquote(v));
        }
        OsRelease(map)
    }

    /// A value by key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `RHEL_VERSION`, else `VERSION_ID` (how the machine-config daemon reads the OS version).
    pub fn version(&self) -> Option<&str> {
        self.get("RHEL_VERSION").or_else(|| self.get("VERSION_ID"))
    }

    /// Major of [`Self::version`].
    pub fn major(&self) -> Option<u32> {
        self.version()?.split('.').next()?.parse().ok()
    }

    /// The stream this release belongs to: `rhel-<major>` for RHEL CoreOS, `centos-<major>` for
    /// CentOS Stream CoreOS; `None` for anything else, which streamd does not manage.
    pub fn stream(&self) -> Option<String> {
        let id = self.get("ID")?;
        let coreos = self.get("VARIANT_ID") == Some("coreos");
        let family = match id {
            "rhcos" => "rhel",
            "scos" => "centos",
            "rhel" if coreos => "rhel",
            "centos" if coreos => "centos",
            _ => return None,
        };
        Some(format!("{family}-{}", self.major()?))
    }
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    let inner = match (v.chars().next(), v.chars().last()) {
        (Some(q @ ('"' | '\'')), Some(e)) if q == e && v.len() >= 2 => &v[1..v.len() - 1],
        _ => v,
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_by_table() {
        let cases = [
            (
                "ID=rhcos\nRHEL_VERSION=9.6\nVERSION_ID=\"4.20\"",
                Some("rhel-9"),
            ),
            ("ID=\"rhcos\"\nVERSION_ID=10.1", Some("rhel-10")),
            ("ID=scos\nVERSION_ID=10", Some("centos-10")),
            ("ID=rhel\nVARIANT_ID=coreos\nVERSION_ID=9.4", Some("rhel-9")),
            (
                "ID=centos\nVARIANT_ID=coreos\nVERSION_ID='10'",
                Some("centos-10"),
            ),
            ("ID=rhel\nVERSION_ID=9.4", None),
            ("ID=fedora\nVARIANT_ID=coreos\nVERSION_ID=41", None),
            ("ID=rhcos", None),
            ("ID=rhcos\nVERSION_ID=abc", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(OsRelease::parse(text).stream().as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn quoting_and_junk() {
        let r = OsRelease::parse("# c\nA=\"x \\\"y\\\"\"\nB='z'\n=bad\nno-eq\nC D=1\n");
        assert_eq!(r.get("A"), Some("x \"y\""));
        assert_eq!(r.get("B"), Some("z"));
        assert_eq!(r.get("C D"), None);
    }
}
