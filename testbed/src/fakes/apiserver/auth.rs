//! Authentication: a verified client certificate names the user by its CN; otherwise a
//! bearer token equal to the admin token is the user `admin`; otherwise anonymous.

use hyper::header::{AUTHORIZATION, HeaderMap};
use rustls::pki_types::CertificateDer;

/// The user name recorded for unauthenticated requests.
pub(crate) const ANONYMOUS: &str = "system:anonymous";

/// The user a request acts as, or `None` if it is unauthenticated.
pub(crate) fn authenticate(
    cert_user: Option<&str>,
    headers: &HeaderMap,
    admin_token: &str,
) -> Option<String> {
    if let Some(user) = cert_user {
        return Some(user.to_string());
    }
    let token = bearer(headers)?;
    constant_time_eq(token.as_bytes(), admin_token.as_bytes()).then(|| "admin".to_string())
}

/// The bearer token of a request, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    Some(
        headers
            .get(AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?
            .trim(),
    )
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The subject CN of the leaf of a chain rustls has already verified against the CA.
pub(crate) fn cert_user(chain: Option<&[CertificateDer<'_>]>) -> Option<String> {
    common_name(chain?.first()?.as_ref())
}

/// One DER TLV: (tag, contents, rest).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// Certificate → tbsCertificate → subject → the CommonName attribute.
fn common_name(der: &[u8]) -> Option<String> {
    let (SEQUENCE, cert, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = tlv(cert)? else {
        return None;
    };
    let mut rest = tbs;
    // The explicit [0] version is optional; then serial, signature, issuer, validity.
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (SEQUENCE, mut rdns, _) = tlv(rest)? else {
        return None;
    };
    while !rdns.is_empty() {
        let (SET, mut set, next) = tlv(rdns)? else {
            return None;
        };
        rdns = next;
        while !set.is_empty() {
            let (SEQUENCE, attr, next) = tlv(set)? else {
                return None;
            };
            set = next;
            let (OID, oid, value) = tlv(attr)? else {
                return None;
            };
            if oid == OID_COMMON_NAME {
                let (_, value, _) = tlv(value)?;
                return String::from_utf8(value.to_vec()).ok();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    #[test]
    fn reads_the_common_name_of_a_certificate() {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        // Organization first, so the walk has to skip an attribute to find the CN.
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(DnType::CommonName, "system:node:worker-0");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            cert_user(Some(std::slice::from_ref(cert.der()))).as_deref(),
            Some("system:node:worker-0")
        );
        assert_eq!(common_name(b"\x30\x03\x02\x01"), None);
        assert_eq!(cert_user(None), None);
    }

    #[test]
    fn bearer_token_must_match() {
        let mut headers = HeaderMap::new();
        assert_eq!(authenticate(None, &headers, "s3cret"), None);
        headers.insert(AUTHORIZATION, "Bearer wrong".parse().expect("header"));
        assert_eq!(authenticate(None, &headers, "s3cret"), None);
        headers.insert(AUTHORIZATION, "Bearer s3cret".parse().expect("header"));
        assert_eq!(
            authenticate(None, &headers, "s3cret").as_deref(),
            Some("admin")
        );
        assert_eq!(
            authenticate(Some("system:node:a"), &headers, "s3cret").as_deref(),
            Some("system:node:a")
        );
    }
}
