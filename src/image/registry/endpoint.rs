//! How a registry is spoken to: the TLS client for its host (certs.d CAs and client
//! certificate; no verification for a registries.conf `insecure` endpoint), the scheme
//! (containers/image v5.36.1 docker/docker_client.go `detectPropertiesHelper`: an insecure
//! endpoint is pinged over HTTPS first and over plain HTTP when that fails), and every request
//! sent with its redirects followed here, each checked against the registry's hosts.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, LOCATION};

use super::hosts::{self, GuardedResolver, Refused, TRUSTED_HOSTS};
use super::{InspectError, Inspector, REQUEST_DEADLINE};
use crate::image::reference::ImageRef;

/// Redirects followed for one request (reqwest's and Go's default is 10; registries need one).
const MAX_REDIRECTS: usize = 5;

/// The host the API of `registry` is served from.
pub(super) fn api_host(registry: &str) -> &str {
    match registry {
        // Docker Hub's API lives on another host than its name.
        "docker.io" => "registry-1.docker.io",
        h => h,
    }
}

impl Inspector {
    /// The HTTP client for `registry` (`host[:port]`), verifying certificates or not: built
    /// again when its certs.d files changed, so a CA an admin adds is used at the next request.
    /// A bad file there is an error and leaves the cached client as it was.
    pub(super) fn client(
        &self,
        registry: &str,
        verify: bool,
    ) -> Result<reqwest::Client, InspectError> {
        let tls = match &self.cert_root {
            Some(root) => {
                super::trust::load(root, registry).map_err(|source| InspectError::Trust {
                    registry: registry.to_string(),
                    source,
                })?
            }
            None => super::trust::HostTls::default(),
        };
        let key = (registry.to_string(), verify);
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((fingerprint, client)) = clients.get(&key)
            && *fingerprint == tls.fingerprint
        {
            return Ok(client.clone());
        }
        let fingerprint = tls.fingerprint.clone();
        let client = build(tls, verify)?;
        clients.insert(key, (fingerprint, client.clone()));
        Ok(client)
    }

    /// The scheme and client `image`'s registry is spoken to with.
    pub(super) async fn endpoint(
        &self,
        image: &ImageRef,
    ) -> Result<(&'static str, reqwest::Client), InspectError> {
        let registry = image.registry();
        if self.plain.iter().any(|h| h == registry) {
            return Ok(("http", self.client(registry, true)?));
        }
        if !self.insecure.iter().any(|h| h == registry) {
            return Ok(("https", self.client(registry, true)?));
        }
        let client = self.client(registry, false)?;
        let known = self
            .schemes
            .lock()
            .ok()
            .and_then(|s| s.get(registry).copied());
        if let Some(scheme) = known {
            return Ok((scheme, client));
        }
        let scheme = match self.ping(image, &client, "https").await {
            Ok(()) => "https",
            Err(e @ InspectError::Untrusted { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(%registry, error = %e, "insecure registry not served over https; trying http");
                self.ping(image, &client, "http").await?;
                "http"
            }
        };
        if let Ok(mut s) = self.schemes.lock() {
            s.insert(registry.to_string(), scheme);
        }
        Ok((scheme, client))
    }

    /// `GET /v2/` without credentials: 200 or 401 is a registry.
    async fn ping(
        &self,
        image: &ImageRef,
        client: &reqwest::Client,
        scheme: &str,
    ) -> Result<(), InspectError> {
        let url = format!("{scheme}://{}/v2/", api_host(image.registry()));
        let url = reqwest::Url::parse(&url)
            .map_err(|e| InspectError::Invalid(format!("{image}: {url}: {e}")))?;
        let resp = self
            .send(image, client, url, HeaderMap::new(), REQUEST_DEADLINE)
            .await?;
        let code = resp.status().as_u16();
        if code == 200 || code == 401 {
            Ok(())
        } else {
            Err(self.status_error(image, "/v2/", resp).await)
        }
    }

    /// Whether `url`'s host is one of `image`'s registry's hosts: the registry's own name (any
    /// port), another endpoint of its registries.conf entry (exactly), [`TRUSTED_HOSTS`] or
    /// `registry-trusted-hosts`.
    fn within_hosts(&self, image: &ImageRef, url: &reqwest::Url) -> bool {
        let name = url.host_str().unwrap_or_default();
        let own = hosts::host_name(image.registry());
        hosts::matches(own, name)
            || hosts::matches(hosts::host_name(api_host(image.registry())), name)
            || self.is_peer(url)
            || self.is_trusted(name)
    }

    /// Whether `name` is one of [`TRUSTED_HOSTS`] or `registry-trusted-hosts`.
    fn is_trusted(&self, name: &str) -> bool {
        TRUSTED_HOSTS
            .iter()
            .copied()
            .chain(self.trusted.iter().map(String::as_str))
            .any(|p| hosts::matches(p, name))
    }

    /// Whether `url` is at another endpoint of the registries.conf entry being read.
    pub(super) fn is_peer(&self, url: &reqwest::Url) -> bool {
        let authority = hosts::authority(url);
        self.peers
            .iter()
            .any(|p| p.eq_ignore_ascii_case(&authority))
    }

    /// Refuses `url` unless streamd may contact it for `image` ([`Self::within_hosts`], and no
    /// forbidden address).
    pub(super) fn check(&self, image: &ImageRef, url: &reqwest::Url) -> Result<(), InspectError> {
        let untrusted = |r: Refused| InspectError::Untrusted {
            registry: image.registry().to_string(),
            host: r.host,
            why: r.why,
        };
        if let Some(r) = hosts::forbidden_literal(url) {
            return Err(untrusted(r));
        }
        if !self.within_hosts(image, url) {
            return Err(untrusted(Refused {
                host: url.host_str().unwrap_or_default().to_string(),
                why: format!(
                    "not one of {}'s hosts (the registry, the other endpoints of its registries.conf entry, the public registries' token and blob hosts, registry-trusted-hosts)",
                    image.registry()
                ),
            }));
        }
        Ok(())
    }

    /// GETs `url` with `headers`, following redirects that stay within the registry's hosts;
    /// credentials are dropped when a redirect leaves the URL's origin (as reqwest and Go do).
    pub(super) async fn send(
        &self,
        image: &ImageRef,
        client: &reqwest::Client,
        mut url: reqwest::Url,
        mut headers: HeaderMap,
        timeout: Duration,
    ) -> Result<reqwest::Response, InspectError> {
        self.check(image, &url)?;
        for _ in 0..=MAX_REDIRECTS {
            let resp = client
                .get(url.clone())
                .headers(headers.clone())
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| Self::request_error(image, &e))?;
            let location = resp
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            let Some(location) = location.filter(|_| resp.status().is_redirection()) else {
                return Ok(resp);
            };
            let next = url.join(&location).map_err(|e| {
                InspectError::Invalid(format!(
                    "{image}: the redirect to {} is no URL: {e}",
                    crate::text::quote(&crate::text::one_line(&location, 200))
                ))
            })?;
            self.check(image, &next)?;
            if next.origin() != url.origin() {
                headers.remove(AUTHORIZATION);
            }
            url = next;
        }
        Err(InspectError::Invalid(format!(
            "{image}: more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// A client with `tls` added to the system's roots (or no verification at all).
fn build(tls: super::trust::HostTls, verify: bool) -> Result<reqwest::Client, InspectError> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("streamd/", env!("CARGO_PKG_VERSION")))
        // Redirects are followed by `send`, which checks each.
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(std::sync::Arc::new(GuardedResolver))
        .tls_danger_accept_invalid_certs(!verify);
    if !tls.cas.is_empty() {
        b = b.tls_certs_merge(tls.cas);
    }
    if let Some(identity) = tls.identity {
        b = b.identity(identity);
    }
    b.build().map_err(|e| {
        InspectError::Invalid(format!(
            "the HTTP client cannot be built: {}",
            crate::text::one_line_reason(&e.to_string())
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::pullsecret::PullSecret;
    use crate::image::registries::PullSource;
    use crate::image::registry::Access;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    fn img(name: &str) -> ImageRef {
        format!("{name}@{D}").parse().expect("ref")
    }

    fn url(u: &str) -> reqwest::Url {
        reqwest::Url::parse(u).expect("url")
    }

    fn source(name: &str) -> PullSource {
        PullSource {
            image: img(name),
            mirror: false,
            insecure: false,
            blocked_by: None,
        }
    }

    /// Pure: nothing here opens a connection.
    #[test]
    fn the_host_set_is_the_registry_its_entry_and_the_trusted_hosts() {
        let access = Access {
            plain: Vec::new(),
            trusted_hosts: vec!["*.blobs.example".into()],
        };
        let root = testbed::scratch::ScratchDir::new("endpoint").expect("scratch dir");
        let base = Inspector::configured(PullSecret::default(), &access, &root).expect("inspector");
        let sources = [source("mirror.example:5000/os"), source("r.example/os")];
        let i = base.for_source(&sources[1], &sources);
        let image = img("r.example/os");
        let ok = |u: &str| i.check(&image, &url(u)).is_ok();
        assert!(ok("https://r.example/v2/"));
        assert!(ok("https://r.example:8443/token"), "its own name, any port");
        assert!(
            ok("https://mirror.example:5000/token"),
            "an endpoint of the entry"
        );
        assert!(
            !ok("https://mirror.example:5001/token"),
            "endpoints match exactly"
        );
        assert!(ok("https://cdn03.quay.io/blob"));
        assert!(ok("https://eu.blobs.example/b"), "registry-trusted-hosts");
        assert!(!ok("https://blobs.example.evil/b"));
        assert!(!ok("http://localhost/"));
        // A forbidden address is refused even where a name would be trusted.
        let e = i
            .check(
                &img("169.254.169.254/os"),
                &url("http://169.254.169.254/v2/"),
            )
            .expect_err("metadata");
        assert!(
            matches!(&e, InspectError::Untrusted { host, .. } if host == "169.254.169.254"),
            "{e:?}"
        );
        assert_eq!(e.label(), "registry-untrusted-host");
        // Without the entry, another registry's host is not this one's.
        assert!(
            base.check(&image, &url("https://mirror.example:5000/"))
                .is_err()
        );
    }
}
