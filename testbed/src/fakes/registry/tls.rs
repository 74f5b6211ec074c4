//! Certificates for registries that speak TLS ([`super::hostile::start_with_head`]): a CA, a
//! server certificate for `127.0.0.1` and `localhost` signed by it, and a client certificate
//! signed by a second CA, for a registry that asks for one (mutual TLS, as certs.d's
//! `*.cert`/`*.key` pairs answer).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A fresh PKI, in PEM where a client reads it from files.
pub struct Pki {
    /// The CA that signed the server certificate (what `certs.d/<host>/ca.crt` holds).
    pub ca_pem: String,
    /// The client certificate (`certs.d/<host>/client.cert`).
    pub client_cert_pem: String,
    /// Its key (`certs.d/<host>/client.key`).
    pub client_key_pem: String,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: Vec<u8>,
    client_ca: CertificateDer<'static>,
    server_pem: String,
    server_key_pem: String,
    client_ca_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn ca(name: &str) -> anyhow::Result<(Issuer<'static, KeyPair>, rcgen::Certificate)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((Issuer::new(params, key), cert))
}

impl Pki {
    /// Generates the CAs and certificates.
    pub fn generate() -> anyhow::Result<Pki> {
        let (server_issuer, server_ca) = ca("testbed-registry-ca")?;
        let server_key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "testbed-registry");
        params.subject_alt_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::DnsName("localhost".try_into()?),
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let server = params.signed_by(&server_key, &server_issuer)?;

        let (client_issuer, client_ca) = ca("testbed-registry-client-ca")?;
        let client_key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "streamd-node");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let client = params.signed_by(&client_key, &client_issuer)?;
        Ok(Pki {
            ca_pem: server_ca.pem(),
            client_cert_pem: client.pem(),
            client_key_pem: client_key.serialize_pem(),
            server_chain: vec![server.der().clone()],
            server_key: server_key.serialize_der(),
            client_ca: client_ca.der().clone(),
            server_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_ca_pem: client_ca.pem(),
        })
    }

    /// Writes the server certificate, its key and the client CA into `dir`, for a real
    /// `docker-registry` ([`super::RegistryProcess::start_with_tls`]); with
    /// `require_client_cert` the registry asks for a client certificate.
    pub fn write_server_files(
        &self,
        dir: &std::path::Path,
        require_client_cert: bool,
    ) -> anyhow::Result<super::TlsFiles> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: &str| -> anyhow::Result<std::path::PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
            Ok(p)
        };
        Ok(super::TlsFiles {
            certificate: write("server.crt", &self.server_pem)?,
            key: write("server.key", &self.server_key_pem)?,
            client_ca: if require_client_cert {
                Some(write("client-ca.crt", &self.client_ca_pem)?)
            } else {
                None
            },
        })
    }

    /// A rustls server configuration presenting the server certificate; with
    /// `require_client_cert`, a handshake without a client certificate signed by the client CA
    /// fails.
    pub fn server(&self, require_client_cert: bool) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS versions")?;
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.client_ca.clone())?;
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key.clone()));
        let mut config = builder.with_single_cert(self.server_chain.clone(), key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
