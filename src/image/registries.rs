//! The host's containers registries configuration (containers-registries.conf(5)) as
//! containers/image reads it for the OS daemons' pulls: `[[registry]]` tables with `prefix`,
//! `location`, `insecure`, `blocked`, `mirror-by-digest-only` and `[[registry.mirror]]`
//! (`location`, `insecure`, `pull-from-mirror`), the V1 `[registries.block]` /
//! `[registries.insecure]` lists, and drop-ins that replace a table with the same prefix.
//!
//! Every reference streamd passes is pinned by digest, so `mirror-by-digest-only` never keeps
//! a mirror out and is not modelled.
//!
//! Pure: the caller (the host side's `ospull`) reads the files. Modelled on
//! containers/image:pkg/sysregistriesv2/system_registries_v2.go (`FindRegistry`,
//! `refMatchingPrefix`, `PullSourcesFromReference`, `updateWithConfigurationFrom`) and
//! docker/docker_image_src.go (`newImageSource`: mirrors first, the primary location last;
//! docker_client.go `newDockerClient`: an endpoint whose own entry is `blocked` is refused).

use serde::Deserialize;

use crate::image::reference::ImageRef;

/// Where containers/image reads the configuration and its drop-ins (the error text names both).
pub const CONF: &str = "/etc/containers/registries.conf";
/// The drop-in directory (`*.conf`, read in lexical order after [`CONF`]).
pub const CONF_D: &str = "/etc/containers/registries.conf.d";

/// One endpoint (the primary location or a mirror).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorToml {
    #[serde(default)]
    location: String,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    pull_from_mirror: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RegistryToml {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    location: String,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror: Vec<MirrorToml>,
}

#[derive(Debug, Default, Deserialize)]
struct V1List {
    #[serde(default)]
    registries: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct V1Tables {
    #[serde(default)]
    block: V1List,
    #[serde(default)]
    insecure: V1List,
}

#[derive(Debug, Default, Deserialize)]
struct FileToml {
    #[serde(default)]
    registry: Vec<RegistryToml>,
    registries: Option<V1Tables>,
}

/// A `[[registry]]` entry after defaults (prefix = location when unset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// What references it applies to (`host[/path]` or `*.domain`).
    pub prefix: String,
    /// Where the primary endpoint is (`host[/path]`); empty for a wildcard prefix.
    pub location: String,
    /// TLS verification skipped / plain HTTP allowed for the primary.
    pub insecure: bool,
    /// Pulls from this endpoint are refused.
    pub blocked: bool,
    /// Mirrors, in the order they are tried.
    pub mirrors: Vec<Mirror>,
}

/// A `[[registry.mirror]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// `host[/path]`.
    pub location: String,
    /// TLS verification skipped / plain HTTP allowed.
    pub insecure: bool,
    /// `tag-only` mirrors are never used for a digest reference.
    pub tag_only: bool,
}

/// The merged configuration: the main file, then each drop-in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistriesConf {
    registries: Vec<Registry>,
}

/// One place the daemon would try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    /// The reference at this endpoint (same digest).
    pub image: ImageRef,
    /// A mirror (else the primary location).
    pub mirror: bool,
    /// TLS verification skipped / plain HTTP allowed.
    pub insecure: bool,
    /// The `[[registry]]` prefix that blocks this endpoint, if one does.
    pub blocked_by: Option<String>,
}

/// A configuration file that cannot be used (containers/image refuses every pull then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct ConfError {
    /// The file (host path).
    pub file: String,
    /// What is wrong (bounded, one line).
    pub problem: String,
}

impl ConfError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "registries-conf"
    }
}

/// A `[[registry]]` entry maps an image to something that is no image reference
/// (containers/image refuses the pull then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{CONF}: {prefix} maps {image} to an invalid reference: {source}")]
pub struct MappingError {
    /// The entry's prefix, quoted.
    pub prefix: String,
    /// The image that was mapped.
    pub image: String,
    /// Why the result is no reference.
    pub source: crate::image::reference::ImageRefError,
}

impl MappingError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "registries-mapping"
    }
}

fn err(file: &str, problem: impl Into<String>) -> ConfError {
    ConfError {
        file: file.to_string(),
        problem: crate::text::one_line(&problem.into(), 200),
    }
}

impl RegistriesConf {
    /// Merges one file's text (`file` names it in errors) into the configuration, as a drop-in:
    /// a `[[registry]]` with a prefix already present replaces it, others are appended.
    pub fn merge(&mut self, file: &str, text: &str) -> Result<(), ConfError> {
        // toml's message quotes the offending line, which is configuration, not a secret.
        let parsed: FileToml = toml::from_str(text).map_err(|e| err(file, e.message()))?;
        let v1 = parsed.registries.unwrap_or_default();
        let has_v1 = !v1.block.registries.is_empty() || !v1.insecure.registries.is_empty();
        if has_v1 && !parsed.registry.is_empty() {
            return Err(err(
                file,
                "mixes the V1 [registries.*] tables with V2 [[registry]] tables",
            ));
        }
        let mut entries = Vec::new();
        for r in parsed.registry {
            entries.push(validate(file, r)?);
        }
        for (list, blocked) in [(v1.block.registries, true), (v1.insecure.registries, false)] {
            for location in list {
                let r = validate(
                    file,
                    RegistryToml {
                        location,
                        blocked,
                        insecure: !blocked,
                        ..Default::default()
                    },
                )?;
                match entries
                    .iter_mut()
                    .find(|e: &&mut Registry| e.prefix == r.prefix)
                {
                    Some(e) => {
                        e.blocked |= r.blocked;
                        e.insecure |= r.insecure;
                    }
                    None => entries.push(r),
                }
            }
        }
        for r in entries {
            match self.registries.iter_mut().find(|e| e.prefix == r.prefix) {
                Some(e) => *e = r,
                None => self.registries.push(r),
            }
        }
        Ok(())
    }

    /// The entry whose prefix matches `name` (`host/repo`) longest, if any.
    pub fn find(&self, name: &str) -> Option<&Registry> {
        self.registries
            .iter()
            .filter_map(|r| prefix_match(name, &r.prefix).map(|len| (len, r)))
            .max_by_key(|(len, _)| *len)
            .map(|(_, r)| r)
    }

    /// Where a pull of `image` goes, in order: the usable mirrors, then the primary location.
    pub fn pull_sources(&self, image: &ImageRef) -> Result<Vec<PullSource>, MappingError> {
        let name = format!("{}/{}", image.registry(), image.repository());
        let Some(reg) = self.find(&name) else {
            return Ok(vec![PullSource {
                image: image.clone(),
                mirror: false,
                insecure: false,
                blocked_by: None,
            }]);
        };
        let mut out = Vec::new();
        for m in reg.mirrors.iter().filter(|m| !m.tag_only) {
            let physical = rewrite(image, &name, &reg.prefix, &m.location)?;
            let blocked_by = self.blocked_by(&physical);
            out.push(PullSource {
                image: physical,
                mirror: true,
                insecure: m.insecure,
                blocked_by,
            });
        }
        let location = if reg.location.is_empty() {
            // A wildcard entry has no location of its own: the reference is kept.
            image.clone()
        } else {
            rewrite(image, &name, &reg.prefix, &reg.location)?
        };
        let blocked_by = self.blocked_by(&location);
        out.push(PullSource {
            image: location,
            mirror: false,
            insecure: reg.insecure,
            blocked_by,
        });
        Ok(out)
    }

    fn blocked_by(&self, image: &ImageRef) -> Option<String> {
        self.find(&format!("{}/{}", image.registry(), image.repository()))
            .filter(|r| r.blocked)
            .map(|r| r.prefix.clone())
    }
}

fn validate(file: &str, r: RegistryToml) -> Result<Registry, ConfError> {
    let prefix = if r.prefix.is_empty() {
        r.location.clone()
    } else {
        r.prefix.clone()
    };
    if prefix.is_empty() {
        return Err(err(file, "a [[registry]] has neither prefix nor location"));
    }
    for loc in std::iter::once(&r.location).chain(r.mirror.iter().map(|m| &m.location)) {
        if loc.contains("://") {
            return Err(err(
                file,
                format!(
                    "location {} must not carry a URI scheme",
                    crate::text::quote(loc)
                ),
            ));
        }
    }
    if prefix.starts_with("*.") && !r.location.is_empty() {
        return Err(err(
            file,
            format!("the wildcard prefix {prefix} cannot have a location"),
        ));
    }
    let mut mirrors = Vec::new();
    for m in r.mirror {
        let tag_only = match m.pull_from_mirror.as_deref() {
            None | Some("" | "all" | "digest-only") => false,
            Some("tag-only") => true,
            Some(other) => {
                return Err(err(
                    file,
                    format!(
                        "pull-from-mirror {} is not all, digest-only or tag-only",
                        crate::text::quote(other)
                    ),
                ));
            }
        };
        if m.location.is_empty() {
            return Err(err(file, "a [[registry.mirror]] has no location"));
        }
        mirrors.push(Mirror {
            location: m.location,
            insecure: m.insecure,
            tag_only,
        });
    }
    Ok(Registry {
        location: if prefix.starts_with("*.") {
            String::new()
        } else if r.location.is_empty() {
            prefix.clone()
        } else {
            r.location
        },
        prefix,
        insecure: r.insecure,
        blocked: r.blocked,
        mirrors,
    })
}

/// How many characters of `name` a prefix covers, if it matches: whole path components, or
/// `*.domain` matching any host below `domain` (containers/image `refMatchingPrefix`).
fn prefix_match(name: &str, prefix: &str) -> Option<usize> {
    if let Some(domain) = prefix.strip_prefix("*.") {
        let host = name.split('/').next().unwrap_or(name);
        let host_name = host.split(':').next().unwrap_or(host);
        return host_name
            .strip_suffix(domain)
            .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1)
            .then_some(prefix.len());
    }
    if name == prefix {
        return Some(prefix.len());
    }
    let rest = name.strip_prefix(prefix)?;
    matches!(rest.as_bytes().first(), Some(b'/' | b':' | b'@')).then_some(prefix.len())
}

/// `image` with the part `prefix` matched replaced by `location`.
fn rewrite(
    image: &ImageRef,
    name: &str,
    prefix: &str,
    location: &str,
) -> Result<ImageRef, MappingError> {
    let rest = if prefix.starts_with("*.") {
        // The matched part is the host.
        name.find('/').map_or("", |i| &name[i..])
    } else {
        name.get(prefix.len()..).unwrap_or("")
    };
    let text = format!("{location}{rest}@{}", image.digest());
    text.parse().map_err(|source| MappingError {
        prefix: crate::text::quote(prefix),
        image: image.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn img(name: &str) -> ImageRef {
        format!("{name}@{D}").parse().expect("ref")
    }

    fn conf(files: &[&str]) -> RegistriesConf {
        let mut c = RegistriesConf::default();
        for (i, f) in files.iter().enumerate() {
            c.merge(&format!("f{i}"), f).expect("valid");
        }
        c
    }

    fn places(c: &RegistriesConf, name: &str) -> Vec<String> {
        c.pull_sources(&img(name))
            .expect("sources")
            .iter()
            .map(|s| {
                format!(
                    "{}/{}{}{}",
                    s.image.registry(),
                    s.image.repository(),
                    if s.mirror { " mirror" } else { "" },
                    s.blocked_by
                        .as_ref()
                        .map(|p| format!(" blocked by {p}"))
                        .unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn mirrors_come_first_and_the_primary_last() {
        // What the MCO writes for an ImageDigestMirrorSet (NeverContactSource blocks the source).
        let c = conf(&[r#"
            unqualified-search-registries = ["registry.access.redhat.com"]
            [[registry]]
              prefix = ""
              location = "quay.io/openshift-release-dev/ocp-v4.0-art-dev"
              mirror-by-digest-only = true
              blocked = true
              [[registry.mirror]]
                location = "mirror.example:5000/ocp/art"
                pull-from-mirror = "digest-only"
              [[registry.mirror]]
                location = "tags.example/art"
                pull-from-mirror = "tag-only"
        "#]);
        assert_eq!(
            places(&c, "quay.io/openshift-release-dev/ocp-v4.0-art-dev/rhcos"),
            [
                "mirror.example:5000/ocp/art/rhcos mirror",
                "quay.io/openshift-release-dev/ocp-v4.0-art-dev/rhcos blocked by quay.io/openshift-release-dev/ocp-v4.0-art-dev",
            ]
        );
        // Whole path components only.
        assert_eq!(
            places(&c, "quay.io/openshift-release-dev/ocp-v4.0-art-devx"),
            ["quay.io/openshift-release-dev/ocp-v4.0-art-devx"]
        );
    }

    #[test]
    fn longest_prefix_wins_and_drop_ins_replace_by_prefix() {
        let c = conf(&[
            r#"
            [[registry]]
              location = "r.example"
              blocked = true
            [[registry]]
              prefix = "r.example/team"
              location = "r.example/team"
            "#,
            r#"
            [[registry]]
              location = "r.example"
              [[registry.mirror]]
                location = "m.example"
            "#,
        ]);
        assert_eq!(places(&c, "r.example/team/os"), ["r.example/team/os"]);
        assert_eq!(
            places(&c, "r.example/other/os"),
            ["m.example/other/os mirror", "r.example/other/os"]
        );
    }

    #[test]
    fn wildcards_and_v1_lists() {
        let c = conf(&[r#"
            [registries.block]
            registries = ["bad.example"]
            [registries.insecure]
            registries = ["plain.example:5000"]
        "#]);
        assert_eq!(
            places(&c, "bad.example/os"),
            ["bad.example/os blocked by bad.example"]
        );
        let s = c.pull_sources(&img("plain.example:5000/os")).expect("s");
        assert!(s[0].insecure);
        let w = conf(&[r#"
            [[registry]]
              prefix = "*.corp.example"
              blocked = true
        "#]);
        assert_eq!(
            places(&w, "a.corp.example/os"),
            ["a.corp.example/os blocked by *.corp.example"]
        );
        assert_eq!(places(&w, "corp.example/os"), ["corp.example/os"]);
    }

    #[test]
    fn bad_files_are_errors_that_name_the_file() {
        let cases = [
            "[[registry]]\nlocation = \"https://x.example\"\n",
            "[[registry]]\ninsecure = true\n",
            "[[registry]]\nlocation = \"x\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"sometimes\"\n",
            "[registries.block]\nregistries = [\"a\"]\n[[registry]]\nlocation = \"b\"\n",
            "not toml at all [",
        ];
        for text in cases {
            let e = RegistriesConf::default()
                .merge("/etc/containers/registries.conf.d/99.conf", text)
                .expect_err(text);
            assert!(
                e.to_string()
                    .starts_with("/etc/containers/registries.conf.d/99.conf: "),
                "{e}"
            );
        }
    }
}
