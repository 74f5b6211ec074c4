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
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// Everything the server and the kubeconfigs need from the PKI.
pub(crate) struct Pki {
    pub(crate) ca_der: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    pub(crate) server_cert: CertificateDer<'static>,
    pub(crate) server_key: PrivateKeyDer<'static>,
    pub(crate) client_cert_pem: String,
    pub(crate) client_key_pem: String,
    pub(crate) admin_token: String,
    /// Signs the client certificates of further nodes.
    pub(crate) issuer: Issuer<'static, KeyPair>,
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

    let (client_cert_pem, client_key_pem) = node_client_cert(&issuer, node_name)?;

    let mut token = [0u8; 24];
    random_bytes(&mut token)?;
    let admin_token = hex(&token);

    let pki = Pki {
        ca_der: ca_cert.der().clone(),
        ca_pem: ca_cert.pem(),
        server_cert: server_cert.der().clone(),
        server_key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        client_cert_pem,
        client_key_pem,
        admin_token,
        issuer,
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
    install_client_pem(pki_dir, 0, &pki.client_cert_pem, &pki.client_key_pem)?;
    write_file(&pki_dir.join("admin-token"), &pki.admin_token, true)?;
    Ok(pki)
}

/// A node client certificate (`system:node:<name>`, group `system:nodes`) signed by `issuer`:
/// its PEM and its key's PEM.
fn node_client_cert(
    issuer: &Issuer<'_, KeyPair>,
    node_name: &str,
) -> anyhow::Result<(String, String)> {
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
    let client_cert = client_params.signed_by(&client_key, issuer)?;
    Ok((client_cert.pem(), client_key.serialize_pem()))
}

/// The kubelet's file: `pki/kubelet-client-current.pem` (certificate and key in one file, as
/// the kubelet's certificate manager writes it) is a symlink to `kubelet-client-<generation>.pem`,
/// replaced atomically on rotation (kubernetes/client-go: util/certificate/certificate_store.go,
/// `fileStore.Update`).
fn install_client_pem(
    pki_dir: &Path,
    generation: u64,
    cert_pem: &str,
    key_pem: &str,
) -> anyhow::Result<()> {
    let name = format!("kubelet-client-{generation}.pem");
    write_file(&pki_dir.join(&name), &format!("{cert_pem}{key_pem}"), true)?;
    let tmp = pki_dir.join(".kubelet-client-current.pem.tmp");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp)
        .with_context(|| format!("linking {}", tmp.display()))?;
    fs::rename(&tmp, pki_dir.join(CLIENT_PEM)).with_context(|| format!("replacing {CLIENT_PEM}"))
}

/// The node's client certificate and key file below `pki/`.
pub(crate) const CLIENT_PEM: &str = "kubelet-client-current.pem";

/// Rotates the node's client credentials onto a new client CA: writes
/// `kubelet-client-<generation>.pem` signed by a fresh CA, points `kubelet-client-current.pem`
/// at it, and returns a verifier that accepts only certificates of the new CA.
pub(crate) fn rotate_client_ca(
    pki_dir: &Path,
    node_name: &str,
    generation: u64,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("streamd-testbed-client-ca-{generation}"),
    );
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let (cert_pem, key_pem) = node_client_cert(&issuer, node_name)?;
    install_client_pem(pki_dir, generation, &cert_pem, &key_pem)?;
    client_verifier(ca_cert.der().clone())
}

/// Verifies client certificate chains against `ca`.
pub(crate) fn client_verifier(
    ca: CertificateDer<'static>,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    roots.add(ca)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()?,
    )
}

/// The server's TLS configuration: its certificate, and client certificates requested but not
/// checked against a CA during the handshake. kube-apiserver does the same (`tls.RequestClientCert`)
/// and verifies the chain per request in its x509 authenticator, so a certificate of an unknown
/// or rotated-away CA gets `401 Unauthorized`, not a failed handshake
/// (kubernetes/apiserver: pkg/authentication/request/x509/x509.go, `AuthenticateRequest`).
pub(crate) fn server_config(pki: &Pki) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(RequestClientCert {
        provider: provider.clone(),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![pki.server_cert.clone()], pki.server_key.clone_key())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Asks for a client certificate and checks only that the client holds its key; the chain is
/// verified per request (see [`server_config`]).
#[derive(Debug)]
struct RequestClientCert {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Writes `dir/kubeconfig` (node client certificate) and `dir/kubeconfig-admin` (bearer token).
pub(crate) fn write_kubeconfigs(
    dir: &Path,
    url: &str,
    pki: &Pki,
    node_name: &str,
) -> anyhow::Result<()> {
    let ca = base64(pki.ca_pem.as_bytes());
    write_node_kubeconfig(dir, url, &ca, node_name)?;
    write_token_config(
        &dir.join("kubeconfig-admin"),
        url,
        &ca,
        "admin",
        &pki.admin_token,
    )
}

/// Writes `dir/kubeconfig` for the node identity `system:node:<node_name>`. As the kubelet
/// writes it: the CA inline, the client certificate and key by path to the file its certificate
/// manager rotates, `dir/pki/kubelet-client-current.pem` (kubernetes/kubernetes:
/// pkg/kubelet/certificate/bootstrap/bootstrap.go, `writeKubeconfigFromBootstrapping`).
fn write_node_kubeconfig(
    dir: &Path,
    url: &str,
    ca_b64: &str,
    node_name: &str,
) -> anyhow::Result<()> {
    let node_user = format!("system:node:{node_name}");
    let pem = quote(&dir.join("pki").join(CLIENT_PEM).to_string_lossy());
    let node = kubeconfig(
        url,
        ca_b64,
        &node_user,
        &format!("client-certificate: {pem}\n    client-key: {pem}"),
    );
    write_file(&dir.join("kubeconfig"), &node, true)
}

/// Issues a client certificate for another node, signed by the testbed CA, into
/// `dir/pki/kubelet-client-current.pem`, and writes `dir/kubeconfig` for it.
pub(crate) fn write_other_node(
    dir: &Path,
    url: &str,
    ca_pem: &str,
    issuer: &Issuer<'static, KeyPair>,
    node_name: &str,
) -> anyhow::Result<()> {
    let pki_dir = dir.join("pki");
    fs::create_dir_all(&pki_dir).with_context(|| format!("creating {}", pki_dir.display()))?;
    let (cert_pem, key_pem) = node_client_cert(issuer, node_name)?;
    install_client_pem(&pki_dir, 0, &cert_pem, &key_pem)?;
    write_node_kubeconfig(dir, url, &base64(ca_pem.as_bytes()), node_name)
}

/// Writes a bearer-token kubeconfig for `user` at `path`, trusting the CA in `ca_file`.
pub(crate) fn write_token_kubeconfig(
    path: &Path,
    url: &str,
    ca_file: &Path,
    user: &str,
    token: &str,
) -> anyhow::Result<()> {
    let ca_pem =
        fs::read_to_string(ca_file).with_context(|| format!("reading {}", ca_file.display()))?;
    write_token_config(path, url, &base64(ca_pem.as_bytes()), user, token)
}

fn write_token_config(
    path: &Path,
    url: &str,
    ca_b64: &str,
    user: &str,
    token: &str,
) -> anyhow::Result<()> {
    let config = kubeconfig(url, ca_b64, user, &format!("token: {}", quote(token)));
    write_file(path, &config, true)
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
