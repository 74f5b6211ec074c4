//! The node's pull secret: docker config JSON (`{"auths": {"<registry>": {"auth": "<base64 user:pass>"}}}`).
//!
//! Credentials never leave this module in printable form: [`Credentials`] has a redacting `Debug`
//! and no `Display`, and errors name the file and the registry, never a value.
//!
//! Keys may name a namespace or repository (`mirror:5000/ns`): an image takes the entry with the
//! longest matching path prefix, then the host's, as containers/image does
//! (containers/image:pkg/docker/config/config.go `findCredentialsInFile`, `authKeysForKey`).

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::Deserialize;

/// Credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// User name and password (or token as password).
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
    /// An identity token used as a bearer token.
    Bearer(String),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username:?}, <redacted>)"),
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

/// A malformed pull secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullSecretError {
    /// Not JSON, or not the docker config shape.
    #[error("pull secret is not a docker config JSON document: {0}")]
    Format(String),
    /// An entry's `auth` is not base64 of `user:password`.
    #[error("pull secret entry for {registry}: {problem}")]
    Entry {
        /// The registry key.
        registry: String,
        /// What is wrong (never the value).
        problem: &'static str,
    },
}

impl PullSecretError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            PullSecretError::Format(_) => "pull-secret-malformed",
            PullSecretError::Entry { .. } => "pull-secret-entry-invalid",
        }
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
}

/// Parsed pull secret: key (`host[:port]` or `host[:port]/namespace…`) → credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullSecret(BTreeMap<String, Credentials>);

impl PullSecret {
    /// Parses docker config JSON.
    pub fn parse(json: &str) -> Result<Self, PullSecretError> {
        // serde_json's error would quote the offending input; report only where it is.
        let cfg: DockerConfig = serde_json::from_str(json).map_err(|e| {
            PullSecretError::Format(format!("line {} column {}", e.line(), e.column()))
        })?;
        let mut out = BTreeMap::new();
        // A key written as the plain name beats a URL that normalizes to the same one, as in
        // containers/image (exact keys are looked up before normalized URLs).
        let mut auths: Vec<_> = cfg.auths.into_iter().collect();
        auths.sort_by_key(|(k, _)| !k.contains("://"));
        for (key, entry) in auths {
            let host = normalize(&key);
            let creds = if let Some(tok) = entry.identitytoken.filter(|t| !t.is_empty()) {
                Credentials::Bearer(tok)
            } else if let Some(auth) = entry.auth.filter(|a| !a.is_empty()) {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|_| PullSecretError::Entry {
                        registry: host.clone(),
                        problem: "auth is not valid base64",
                    })?;
                let text = String::from_utf8(raw).map_err(|_| PullSecretError::Entry {
                    registry: host.clone(),
                    problem: "auth is not UTF-8",
                })?;
                let (u, p) = text.split_once(':').ok_or(PullSecretError::Entry {
                    registry: host.clone(),
                    problem: "auth is not user:password",
                })?;
                Credentials::Basic {
                    username: u.to_string(),
                    password: p.to_string(),
                }
            } else if let (Some(u), Some(p)) = (entry.username, entry.password) {
                Credentials::Basic {
                    username: u,
                    password: p,
                }
            } else {
                return Err(PullSecretError::Entry {
                    registry: host,
                    problem: "no auth, username/password or identitytoken",
                });
            };
            out.insert(host, creds);
        }
        Ok(PullSecret(out))
    }

    /// Credentials for the whole of `registry` (`host[:port]`), if any: only a key naming the
    /// host alone, never one that names a namespace in it.
    pub fn for_registry(&self, registry: &str) -> Option<&Credentials> {
        self.0.get(&normalize(registry))
    }

    /// Credentials for `repository` on `registry`: the key with the longest matching path
    /// (`host/a/b`, then `host/a`, then `host`), as containers/image's `authKeysForKey` orders
    /// them. Path segments match whole (`host/ns` never covers `host/nsx`).
    pub fn for_repository(&self, registry: &str, repository: &str) -> Option<&Credentials> {
        let mut key = normalize(&format!("{registry}/{repository}"));
        loop {
            if let Some(c) = self.0.get(&key) {
                return Some(c);
            }
            let cut = key.rfind('/')?;
            key.truncate(cut);
        }
    }

    /// Registries with credentials.
    pub fn registries(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// The lookup form of a key: `https://quay.io/v1/` (a URL: the host only, as containers/image's
/// `normalizeAuthFileKey`) and `quay.io` name the same registry, `quay.io/ns/` the namespace
/// `quay.io/ns`. Host names are case-insensitive, paths are not.
fn normalize(key: &str) -> String {
    let k = key.trim();
    let (url, rest) = match k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
    {
        Some(rest) => (true, rest),
        None => (false, k),
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = match host.to_ascii_lowercase().as_str() {
        // Docker Hub's historical keys.
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        h => h.to_string(),
    };
    let path = path.trim_matches('/');
    if url || path.is_empty() {
        host
    } else {
        format!("{host}/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn parses_the_usual_shapes() {
        let json = format!(
            r#"{{"auths":{{
              "quay.io":{{"auth":"{}","email":""}},
              "https://registry.example.com:5000/v1/":{{"auth":"{}"}},
              "ghcr.io":{{"username":"u","password":"p"}},
              "cloud.example":{{"auth":"","identitytoken":"tok"}}
            }}}}"#,
            b64("user:pa:ss"),
            b64("a:b"),
        );
        let s = PullSecret::parse(&json).expect("parse");
        assert_eq!(
            s.for_registry("quay.io"),
            Some(&Credentials::Basic {
                username: "user".into(),
                password: "pa:ss".into()
            })
        );
        assert!(s.for_registry("registry.example.com:5000").is_some());
        assert!(s.for_registry("ghcr.io").is_some());
        assert_eq!(
            s.for_registry("cloud.example"),
            Some(&Credentials::Bearer("tok".into()))
        );
        assert_eq!(s.for_registry("docker.io"), None);
    }

    #[test]
    fn namespaced_keys_match_by_longest_prefix() {
        let json = format!(
            r#"{{"auths":{{
              "mirror:5000":{{"auth":"{}"}},
              "mirror:5000/ns":{{"auth":"{}"}},
              "mirror:5000/ns/team/":{{"auth":"{}"}},
              "https://other.example/v1/":{{"auth":"{}"}},
              "other.example":{{"auth":"{}"}}
            }}}}"#,
            b64("host:h"),
            b64("ns:n"),
            b64("team:t"),
            b64("url:u"),
            b64("plain:p"),
        );
        let s = PullSecret::parse(&json).expect("parse");
        let user = |c: Option<&Credentials>| match c {
            Some(Credentials::Basic { username, .. }) => username.clone(),
            other => format!("{other:?}"),
        };
        // (registry, repository, the entry containers/image picks)
        let table = [
            ("mirror:5000", "ns/app", "ns"),
            ("mirror:5000", "ns/team/app", "team"),
            ("mirror:5000", "ns/team", "team"),
            ("mirror:5000", "ns", "ns"),
            ("mirror:5000", "nsx/app", "host"),
            ("mirror:5000", "other/app", "host"),
            ("MIRROR:5000", "ns/app", "ns"),
            ("mirror:5000", "NS/app", "host"),
            ("other.example", "x/y", "plain"),
        ];
        for (registry, repository, want) in table {
            assert_eq!(
                user(s.for_repository(registry, repository)),
                want,
                "{registry}/{repository}"
            );
        }
        assert_eq!(user(s.for_registry("mirror:5000")), "host");
        assert_eq!(s.for_repository("elsewhere.example", "ns/app"), None);
        let only_ns = PullSecret::parse(&format!(
            r#"{{"auths":{{"mirror:5000/ns":{{"auth":"{}"}}}}}}"#,
            b64("ns:n")
        ))
        .expect("parse");
        assert_eq!(only_ns.for_repository("mirror:5000", "other/app"), None);
        assert_eq!(only_ns.for_registry("mirror:5000"), None);
    }

    #[test]
    fn errors_never_show_secrets() {
        let secret = "hunter2-very-secret";
        let cases = [
            format!(r#"{{"auths":{{"q.io":{{"auth":"{secret}!!"}}}}}}"#),
            format!(r#"{{"auths":{{"q.io":{{"auth":"{}"}}}}}}"#, b64(secret)),
            format!(r#"{{"auths":{{"q.io":{{"auth":{secret}}}}}}}"#),
            format!(r#"{{"auths":{{"q.io":{{}}}}, "x": "{secret}"}}"#),
        ];
        for json in cases {
            let e = PullSecret::parse(&json).expect_err("invalid");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let ok = PullSecret::parse(&format!(
            r#"{{"auths":{{"q.io":{{"auth":"{}"}}}}}}"#,
            b64(&format!("u:{secret}"))
        ))
        .expect("valid");
        assert!(!format!("{ok:?}").contains("hunter2"));
    }
}
