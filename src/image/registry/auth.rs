//! The registry's auth challenge: a bearer token from the realm it names (cached per
//! repository), or basic auth, with the pull secret's credentials for the repository.

use std::time::Duration;

use reqwest::header::HeaderValue;

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
    /// Gets a bearer token for `image`'s repository from `realm`, which must be one of the
    /// registry's hosts. The credentials sent are those of the host contacted: the registry's
    /// own for its own name, [`super::TRUSTED_HOSTS`] and `registry-trusted-hosts` (its token
    /// service), and another
    /// endpoint's own (or none) when the realm is at another endpoint of its registries.conf
    /// entry, so a mirror never receives the primary's credentials or the reverse.
    async fn token(
        &self,
        image: &ImageRef,
        client: &reqwest::Client,
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
        self.check(image, &url)?;
        let authority = super::hosts::authority(&url);
        let credentials = if self.is_peer(&url) && !authority.eq_ignore_ascii_case(image.registry())
        {
            self.secret.for_repository(&authority, image.repository())
        } else {
            self.credentials(image)
        };
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(Credentials::Basic { username, password }) = credentials {
            headers.insert(reqwest::header::AUTHORIZATION, basic(username, password)?);
        }
        let resp = self
            .send(image, client, url, headers, REQUEST_DEADLINE)
            .await?;
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
        let (scheme, client) = self.endpoint(image).await?;
        let url = Self::url(image, scheme, path)?;
        let send = |auth: Option<HeaderValue>| {
            let mut headers = reqwest::header::HeaderMap::new();
            if let Ok(a) = HeaderValue::from_str(&accept.join(", "))
                && !accept.is_empty()
            {
                headers.insert(reqwest::header::ACCEPT, a);
            }
            if let Some(a) = auth {
                headers.insert(reqwest::header::AUTHORIZATION, a);
            }
            self.send(image, &client, url.clone(), headers, timeout)
        };
        let cached = self
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(&Self::token_key(image)).cloned());
        let first = match (cached, self.credentials(image)) {
            (Some(token), _) => Some(bearer(&token)?),
            (None, Some(Credentials::Bearer(token))) => Some(bearer(token)?),
            _ => None,
        };
        let mut resp = send(first.clone()).await?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            let header = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|h| h.to_str().ok())
                .and_then(challenge);
            let auth = match (header, self.credentials(image)) {
                (Some(Challenge::Bearer { realm, service }), _) => {
                    let token = self
                        .token(image, &client, &realm, service.as_deref())
                        .await?;
                    if let Ok(mut t) = self.tokens.lock() {
                        t.insert(Self::token_key(image), token.clone());
                    }
                    bearer(&token)?
                }
                (Some(Challenge::Basic), Some(Credentials::Basic { username, password })) => {
                    basic(username, password)?
                }
                _ => return Err(InspectError::Unauthorized(image.registry().to_string())),
            };
            if Some(&auth) != first.as_ref() {
                resp = send(Some(auth)).await?;
            }
        }
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.status_error(image, path, resp).await)
        }
    }
}

/// `Bearer <token>`, marked sensitive; a token that is no header value is refused.
fn bearer(token: &str) -> Result<HeaderValue, InspectError> {
    sensitive(format!("Bearer {token}"))
}

/// `Basic <base64(user:password)>`, marked sensitive.
fn basic(username: &str, password: &str) -> Result<HeaderValue, InspectError> {
    use base64::Engine as _;
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    sensitive(format!("Basic {pair}"))
}

fn sensitive(value: String) -> Result<HeaderValue, InspectError> {
    let mut v = HeaderValue::from_str(&value).map_err(|_| {
        InspectError::Invalid("a credential or token is not a valid header value".into())
    })?;
    v.set_sensitive(true);
    Ok(v)
}
