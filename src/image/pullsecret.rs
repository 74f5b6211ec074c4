//! The node's pull secret: docker config JSON (`{"auths": {"<registry>": {"auth": "<base64 user:pass>"}}}`).
//!
//! Credentials never leave this module in printable form: [`Credentials`] has a redacting `Debug`
//! and no `Display`, and errors name the file and the registry, never a value.

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

/// Parsed pull secret: registry host → credentials.
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
        for (key, entry) in cfg.auths {
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

    /// Credentials for `registry` (`host[:port]`), if any.
    pub fn for_registry(&self, registry: &str) -> Option<&Credentials> {
        self.0.get(&normalize(registry))
    }

    /// Registries with credentials.
    pub fn registries(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// `https://quay.io/v1/` and `quay.io` name the same registry.
fn normalize(key: &str) -> String {
    let k = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match host.as_str() {
        // Docker Hub's historical keys.
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        _ => host,
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
