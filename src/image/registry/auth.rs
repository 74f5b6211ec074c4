//! The registry's auth challenge: a bearer token from the realm it names (cached per
//! repository), or basic auth, with the pull secret's credentials for the repository.

use std::time::Duration;

use super::http::read_limited;
use super::{InspectError, Inspector, MAX_TOKEN, REQUEST_DEADLINE};
use crate::image::pullsecret::Credentials;
use crate::image::reference::ImageRef;

/// A `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// Parses `Bearer realm="…",service="…",scope="…"` or `Basic realm="…"`.
fn challenge(header: &str) -> Option<Challenge> {
    let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    let mut rest = params;
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        match key {
            "realm" => realm = Some(value.to_string()),
            "service" => service = Some(value.to_string()),
            _ => {}
        }
        rest = next;
    }
    Some(Challenge::Bearer {
        realm: realm?,
        service,
    })
}

impl Inspector {
    /// Gets a bearer token for `image`'s repository from `realm`.
    async fn token(
        &self,
        image: &ImageRef,
        realm: &str,
        service: Option<&str>,
    ) -> Result<String, InspectError> {
        let mut url = reqwest::Url::parse(realm).map_err(|_| {
            InspectError::Invalid(format!(
                "{}: the token realm {} is not a URL",
                image.registry(),
                crate::text::quote(realm)
            ))
        })?;
        url.query_pairs_mut()
            .append_pair("scope", &format!("repository:{}:pull", image.repository()));
        if let Some(s) = service {
            url.query_pairs_mut().append_pair("service", s);
        }
        let mut req = self.http.get(url).timeout(REQUEST_DEADLINE);
        if let Some(Credentials::Basic { username, password }) = self.credentials(image) {
            req = req.basic_auth(username, Some(password));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Self::request_error(image, &e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(InspectError::Unauthorized(image.registry().to_string()));
        }
        if !status.is_success() {
            return Err(self.status_error(image, "token", resp).await);
        }
        let body = read_limited(resp, MAX_TOKEN)
            .await
            .map_err(|e| self.body_error(image, "token answer", MAX_TOKEN, e))?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|_| {
            InspectError::Invalid(format!(
                "{}: the token answer is not JSON",
                image.registry()
            ))
        })?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| InspectError::Unauthorized(image.registry().to_string()))
    }

    fn credentials(&self, image: &ImageRef) -> Option<&Credentials> {
        self.secret
            .for_repository(image.registry(), image.repository())
    }

    fn token_key(image: &ImageRef) -> String {
        format!("{}/{}", image.registry(), image.repository())
    }

    /// GETs `path` under the image's repository, following the registry's auth challenge once.
    /// A non-2xx answer becomes a classified error.
    pub(super) async fn get(
        &self,
        image: &ImageRef,
        path: &str,
        accept: &[&str],
        timeout: Duration,
    ) -> Result<reqwest::Response, InspectError> {
        let url = self.url(image, path);
        let send = |auth: Option<String>| {
            let mut req = self.http.get(&url).timeout(timeout);
            if !accept.is_empty() {
                req = req.header(reqwest::header::ACCEPT, accept.join(", "));
            }
            if let Some(a) = auth {
                req = req.header(reqwest::header::AUTHORIZATION, a);
            }
            req.send()
        };
        let cached = self
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(&Self::token_key(image)).cloned());
        let first = match (cached, self.credentials(image)) {
            (Some(token), _) => Some(format!("Bearer {token}")),
            (None, Some(Credentials::Bearer(token))) => Some(format!("Bearer {token}")),
            _ => None,
        };
        let mut resp = send(first.clone())
            .await
            .map_err(|e| Self::request_error(image, &e))?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            let header = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .and_then(challenge);
            let auth = match (header, self.credentials(image)) {
                (Some(Challenge::Bearer { realm, service }), _) => {
                    let token = self.token(image, &realm, service.as_deref()).await?;
                    if let Ok(mut t) = self.tokens.lock() {
                        t.insert(Self::token_key(image), token.clone());
                    }
                    format!("Bearer {token}")
                }
                (Some(Challenge::Basic), Some(Credentials::Basic { username, password })) => {
                    use base64::Engine as _;
                    let pair = base64::engine::general_purpose::STANDARD
                        .encode(format!("{username}:{password}"));
                    format!("Basic {pair}")
                }
                _ => return Err(InspectError::Unauthorized(image.registry().to_string())),
            };
            if Some(&auth) != first.as_ref() {
                resp = send(Some(auth))
                    .await
                    .map_err(|e| Self::request_error(image, &e))?;
            }
        }
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.status_error(image, path, resp).await)
        }
    }
}
