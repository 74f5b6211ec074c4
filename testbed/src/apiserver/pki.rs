//! The testbed PKI: a CA, the server certificate, the node's client certificate,
//! the admin bearer token, and the two kubeconfigs that use them.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

/// Everything the server and the kubeconfigs need from the PKI.
pub(crate) struct Pki {
    pub(crate) ca_der: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    pub(crate) server_cert: CertificateDer<'static>,
    pub(crate) server_key: PrivateKeyDer<'static>,
    pub(crate) client_cert_pem: String,
    pub(crate) client_key_pem: String,
    pub(crate) admin_token: String,
}

/// Fills `buf` from the system CSPRNG.
pub(crate) fn random_bytes(buf: &mut [u8]) -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(buf)
        .map_err(|_| anyhow!("system random number generator failed"))
}

/// Generates a fresh PKI and writes it to `pki_dir` (keys and token with mode 0600).
pub(crate) fn generate(pki_dir: &Path, node_name: &str) -> anyhow::Result<Pki> {
    fs::create_dir_all(pki_dir).with_context(|| format!("creating {}", pki_dir.display()))?;

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "streamd-testbed-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate()?;
    let mut server_params = CertificateParams::default();
    server_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    server_params.subject_alt_names = vec![
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::DnsName("localhost".try_into()?),
    ];
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let server_cert = server_params.signed_by(&server_key, &issuer)?;

    let client_key = KeyPair::generate()?;
    let mut client_params = CertificateParams::default();
    client_params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node_name}"));
    client_params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let client_cert = client_params.signed_by(&client_key, &issuer)?;

    let mut token = [0u8; 24];
    random_bytes(&mut token)?;
    let admin_token = hex(&token);

    let pki = Pki {
        ca_der: ca_cert.der().clone(),
        ca_pem: ca_cert.pem(),
        server_cert: server_cert.der().clone(),
        server_key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        client_cert_pem: client_cert.pem(),
        client_key_pem: client_key.serialize_pem(),
        admin_token,
    };
    write_file(&pki_dir.join("ca.crt"), &pki.ca_pem, false)?;
    write_file(&pki_dir.join("ca.key"), &ca_key_pem, true)?;
    write_file(&pki_dir.join("server.crt"), &server_cert.pem(), false)?;
    write_file(
        &pki_dir.join("server.key"),
        &server_key.serialize_pem(),
        true,
    )?;
    write_file(&pki_dir.join("node.crt"), &pki.client_cert_pem, false)?;
    write_file(&pki_dir.join("node.key"), &pki.client_key_pem, true)?;
    write_file(&pki_dir.join("admin-token"), &pki.admin_token, true)?;
    Ok(pki)
}

/// The server's TLS configuration: its certificate, and client certificates verified
/// against the CA but optional, so that bearer-token clients can connect too.
pub(crate) fn server_config(pki: &Pki) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca_der.clone())?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![pki.server_cert.clone()], pki.server_key.clone_key())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Writes `dir/kubeconfig` (node client certificate) and `dir/kubeconfig-admin` (bearer token).
pub(crate) fn write_kubeconfigs(
    dir: &Path,
    url: &str,
    pki: &Pki,
    node_name: &str,
) -> anyhow::Result<()> {
    let ca = base64(pki.ca_pem.as_bytes());
    let node_user = format!("system:node:{node_name}");
    let node = kubeconfig(
        url,
        &ca,
        &node_user,
        &format!(
            "client-certificate-data: {}\n    client-key-data: {}",
            base64(pki.client_cert_pem.as_bytes()),
            base64(pki.client_key_pem.as_bytes())
        ),
    );
    write_file(&dir.join("kubeconfig"), &node, true)?;
    let admin = kubeconfig(
        url,
        &ca,
        "admin",
        &format!("token: {}", quote(&pki.admin_token)),
    );
    write_file(&dir.join("kubeconfig-admin"), &admin, true)
}

fn kubeconfig(url: &str, ca_b64: &str, user: &str, credentials: &str) -> String {
    let (url, user) = (quote(url), quote(user));
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {url}\n    \
         certificate-authority-data: {ca_b64}\nusers:\n- name: {user}\n  user:\n    {credentials}\n\
         contexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\n\
         current-context: testbed\n"
    )
}

/// A YAML double-quoted scalar; JSON string syntax is a subset of it.
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn write_file(path: &Path, contents: &str, private: bool) -> anyhow::Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if private {
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard base64 with padding (RFC 4648 §4), as kubeconfig `*-data` fields expect.
pub(crate) fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
