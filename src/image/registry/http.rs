//! What every request shares: the URL, bodies read within a limit, and the errors made of
//! a registry's answer (its own text only quoted and cut).

use super::{ERROR_TEXT_CHARS, InspectError, Inspector, MAX_ERROR_BODY};
use crate::image::reference::ImageRef;

/// Reads at most `max` bytes of a body; more (or a `Content-Length` saying so) is an error.
pub(super) async fn read_limited(
    mut resp: reqwest::Response,
    max: u64,
) -> Result<Vec<u8>, Result<u64, reqwest::Error>> {
    if let Some(len) = resp.content_length().filter(|l| *l > max) {
        return Err(Ok(len));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Err)? {
        if (out.len() + chunk.len()) as u64 > max {
            return Err(Ok((out.len() + chunk.len()) as u64));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The first `max` bytes of a body (an error's: the rest is not read).
async fn read_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(max);
    out
}

/// A registry's error text, fit for a reason: the OCI error envelope's codes and messages (or
/// the start of the body), one line, quoted and cut.
fn error_text(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let text = match serde_json::from_slice::<Envelope>(body) {
        Ok(e) if !e.errors.is_empty() => e
            .errors
            .iter()
            .map(|x| format!("{} {}", x.code, x.message))
            .collect::<Vec<_>>()
            .join("; "),
        _ => String::from_utf8_lossy(body).into_owned(),
    };
    crate::text::quote(&crate::text::one_line(&text, ERROR_TEXT_CHARS))
}

impl Inspector {
    /// The URL of `path` below `image`'s repository, over `scheme`.
    pub(super) fn url(
        image: &ImageRef,
        scheme: &str,
        path: &str,
    ) -> Result<reqwest::Url, InspectError> {
        let host = super::endpoint::api_host(image.registry());
        let url = format!("{scheme}://{host}/v2/{}/{path}", image.repository());
        reqwest::Url::parse(&url).map_err(|e| InspectError::Invalid(format!("{image}: {e}")))
    }

    /// The error for a non-2xx answer; only the first [`MAX_ERROR_BODY`] bytes of its body are
    /// read and only its quoted, cut start reaches the message.
    pub(super) async fn status_error(
        &self,
        image: &ImageRef,
        what: &str,
        resp: reqwest::Response,
    ) -> InspectError {
        let code = resp.status().as_u16();
        let registry = image.registry().to_string();
        if code == 401 || code == 403 {
            return InspectError::Unauthorized(registry);
        }
        let text = error_text(&read_prefix(resp, MAX_ERROR_BODY).await);
        if code >= 500 || code == 429 {
            InspectError::Transient {
                registry,
                message: format!("HTTP {code} for {what}: {text}"),
            }
        } else if code == 404 {
            InspectError::Invalid(format!("{image}: {what} unknown to {registry} ({text})"))
        } else {
            InspectError::Invalid(format!("{image}: HTTP {code} for {what}: {text}"))
        }
    }

    pub(super) fn body_error(
        &self,
        image: &ImageRef,
        what: &str,
        max: u64,
        e: Result<u64, reqwest::Error>,
    ) -> InspectError {
        match e {
            Ok(size) => InspectError::Invalid(format!(
                "{image}: the {what} is larger than {max} bytes ({size} or more)"
            )),
            Err(e) => Self::request_error(image, &e),
        }
    }
}
