//! Per-registry TLS material from `certs.d`, as containers/image reads it for the OS daemons'
//! pulls (containers/image v5.36.1: docker/docker_client.go `dockerCertDir`,
//! pkg/tlsclientconfig/tlsclientconfig.go `SetupCertificates`):
//!
//! - the directory is the first of [`CERT_DIRS`]`/<host[:port]>` that exists (a directory the
//!   daemon may not read is skipped); the host is the reference's, `docker.io` for Docker Hub;
//! - every `*.crt` in it adds CAs to the system's roots;
//! - every `*.cert` is a client certificate whose key is the `*.key` of the same name; a
//!   `*.cert` without its `*.key`, or a `*.key` without its `*.cert`, is an error.
//!
//! Where containers/image skips a `*.crt` with no certificate in it, streamd refuses the host
//! naming the file: such a file is a mistake, and the pull it was meant for fails anyway.

use std::io::Read as _;
use std::path::Path;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};

/// The per-host certificate directories, in the order containers/image looks (for uid 0; the
/// home directory's `.config/containers/certs.d` is not read: the OS daemons run as system
/// services).
pub const CERT_DIRS: [&str; 2] = ["/etc/containers/certs.d", "/etc/docker/certs.d"];

/// Largest certs.d file read (a CA bundle is a few hundred KiB at most).
const MAX_FILE: u64 = 4 << 20;

/// A file in a certs.d directory that cannot be used: the registry is not contacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// A file or the directory could not be read.
    #[error("{path}: unreadable: {message}")]
    Unreadable {
        /// Host path.
        path: String,
        /// Why.
        message: String,
    },
    /// A `*.crt` holds no usable PEM certificate.
    #[error("{path}: no usable PEM certificate in it ({message})")]
    Certificate {
        /// Host path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A `*.cert` has no `*.key` beside it.
    #[error(
        "{path}: missing key {key} for this client certificate (CA certificates use the extension .crt)"
    )]
    MissingKey {
        /// Host path of the certificate.
        path: String,
        /// The key's file name.
        key: String,
    },
    /// A `*.key` has no `*.cert` beside it.
    #[error("{path}: missing client certificate {cert} for this key")]
    MissingCertificate {
        /// Host path of the key.
        path: String,
        /// The certificate's file name.
        cert: String,
    },
    /// A `*.cert` / `*.key` pair that is not a certificate and its key.
    #[error("{path}: not a usable client certificate and key: {message}")]
    KeyPair {
        /// Host path of the certificate.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl TrustError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "registry-certs-invalid"
    }
}

/// What one host's certs.d directory adds to the TLS client.
#[derive(Default)]
pub(super) struct HostTls {
    /// CAs, besides the system's.
    pub(super) cas: Vec<reqwest::Certificate>,
    /// The client certificate (the first pair by file name, as Go's TLS client offers the
    /// first certificate a server does not rule out).
    pub(super) identity: Option<reqwest::Identity>,
    /// A digest of every file read: the client is built again when it changes.
    pub(super) fingerprint: Vec<u8>,
}

fn unreadable(path: &str, e: impl std::fmt::Display) -> TrustError {
    TrustError::Unreadable {
        path: path.to_string(),
        message: crate::text::one_line(&e.to_string(), 200),
    }
}

/// The host path of the directory for `host` below `root`, if one exists.
fn host_dir(root: &Path, host: &str) -> Option<String> {
    CERT_DIRS.iter().find_map(|d| {
        let path = format!("{d}/{host}");
        let full = root.join(path.trim_start_matches('/'));
        match std::fs::metadata(&full) {
            Ok(_) => Some(path),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    tracing::warn!(path = %full.display(), "certificate directory not readable; skipped");
                }
                None
            }
        }
    })
}

/// Reads `host`'s certs.d directory below `root`: nothing when there is none.
pub(super) fn load(root: &Path, host: &str) -> Result<HostTls, TrustError> {
    let Some(dir) = host_dir(root, host) else {
        return Ok(HostTls::default());
    };
    let full = root.join(dir.trim_start_matches('/'));
    let mut names: Vec<String> = std::fs::read_dir(&full)
        .map_err(|e| unreadable(&dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // Go's os.ReadDir lists by name.
    names.sort();
    let mut out = HostTls::default();
    let mut digest = Sha256::new();
    let read = |name: &str| {
        let path = format!("{dir}/{name}");
        let mut bytes = Vec::new();
        std::fs::File::open(full.join(name))
            .and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut bytes))
            .map_err(|e| unreadable(&path, e))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(unreadable(&path, format!("larger than {MAX_FILE} bytes")));
        }
        Ok((path, bytes))
    };
    for name in &names {
        if name.ends_with(".crt") {
            let (path, pem) = read(name)?;
            digest.update(name.as_bytes());
            digest.update(&pem);
            out.cas.extend(cas(&path, &pem)?);
        } else if let Some(base) = name.strip_suffix(".cert") {
            let key = format!("{base}.key");
            let (path, cert_pem) = read(name)?;
            if !names.contains(&key) {
                return Err(TrustError::MissingKey { path, key });
            }
            let (_, key_pem) = read(&key)?;
            digest.update(name.as_bytes());
            digest.update(&cert_pem);
            digest.update(&key_pem);
            let identity = identity(&path, &cert_pem, &key_pem)?;
            out.identity.get_or_insert(identity);
        } else if let Some(base) = name.strip_suffix(".key") {
            let cert = format!("{base}.cert");
            if !names.contains(&cert) {
                return Err(TrustError::MissingCertificate {
                    path: format!("{dir}/{name}"),
                    cert,
                });
            }
        }
    }
    out.fingerprint = digest.finalize().to_vec();
    Ok(out)
}

/// The certificates of one `*.crt`, each checked to be one a root store takes.
fn cas(path: &str, pem: &[u8]) -> Result<Vec<reqwest::Certificate>, TrustError> {
    let bad = |message: String| TrustError::Certificate {
        path: path.to_string(),
        message,
    };
    let mut out = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem) {
        let der = der.map_err(|e| bad(e.to_string()))?;
        rustls::RootCertStore::empty()
            .add(der.clone())
            .map_err(|e| bad(e.to_string()))?;
        out.push(reqwest::Certificate::from_der(&der).map_err(|e| bad(e.to_string()))?);
    }
    if out.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    Ok(out)
}

/// A client certificate and its key, checked to belong together.
fn identity(path: &str, cert: &[u8], key: &[u8]) -> Result<reqwest::Identity, TrustError> {
    let bad = |message: String| TrustError::KeyPair {
        path: path.to_string(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if chain.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    let der = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad(format!("the key: {e}")))?;
    rustls::sign::CertifiedKey::from_der(chain, der, &rustls::crypto::ring::default_provider())
        .map_err(|e| bad(e.to_string()))?;
    let mut both = cert.to_vec();
    both.push(b'\n');
    both.extend_from_slice(key);
    reqwest::Identity::from_pem(&both).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(name: &str) -> testbed::scratch::ScratchDir {
        testbed::scratch::ScratchDir::new(&format!("trust-{name}")).expect("scratch dir")
    }

    fn put(root: &Path, path: &str, text: &str) {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn no_directory_is_no_material() {
        let r = root("none");
        let tls = load(&r, "r.example:5000").expect("nothing to read");
        assert!(tls.cas.is_empty() && tls.identity.is_none());
    }

    #[test]
    fn bad_files_are_typed_errors_naming_the_file() {
        let r = root("bad");
        let dir = "/etc/docker/certs.d/r.example";
        put(&r, &format!("{dir}/ca.crt"), "junk\n");
        assert!(matches!(
            load(&r, "r.example"),
            Err(TrustError::Certificate { path, .. }) if path == format!("{dir}/ca.crt")
        ));
        put(
            &r,
            &format!("{dir}/ca.crt"),
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        assert!(matches!(
            load(&r, "r.example"),
            Err(TrustError::Certificate { .. })
        ));
        std::fs::remove_file(r.join(&dir[1..]).join("ca.crt")).expect("rm");
        put(&r, &format!("{dir}/a.key"), "k");
        assert!(matches!(
            load(&r, "r.example"),
            Err(TrustError::MissingCertificate { cert, .. }) if cert == "a.cert"
        ));
        put(&r, &format!("{dir}/a.cert"), "c");
        assert!(matches!(
            load(&r, "r.example"),
            Err(TrustError::KeyPair { .. })
        ));
        std::fs::remove_file(r.join(&dir[1..]).join("a.key")).expect("rm");
        let e = load(&r, "r.example").err().expect("missing key");
        assert_eq!(
            e.to_string(),
            format!(
                "{dir}/a.cert: missing key a.key for this client certificate (CA certificates use the extension .crt)"
            )
        );
        assert_eq!(e.label(), "registry-certs-invalid");
        std::fs::remove_file(r.join(&dir[1..]).join("a.cert")).expect("rm");
        put(
            &r,
            &format!("{dir}/big.crt"),
            &"x".repeat((MAX_FILE + 1) as usize),
        );
        assert!(matches!(
            load(&r, "r.example"),
            Err(TrustError::Unreadable { message, .. }) if message.contains("larger than")
        ));
    }
}
