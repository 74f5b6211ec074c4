//! The real `docker-registry` (distribution 2.8) process: its config, its htpasswd file, and
//! starting it on a free loopback port.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hyper::StatusCode;
use tokio::process::{Child, Command};
use tracing::{debug, info, warn};

use super::client::Client;

/// How long the registry may take to answer `/v2/` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a stopped registry may take to exit after SIGKILL.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// bcrypt cost of the htpasswd entry: the minimum, because distribution checks the password on
/// every request and this registry only ever listens on loopback.
const BCRYPT_COST: u32 = 4;
/// Attempts at finding a port nobody grabs between our probe and the registry's bind.
const PORT_ATTEMPTS: usize = 5;

/// A running registry; killed when dropped.
pub struct RegistryProcess {
    child: Child,
    host: String,
    log: PathBuf,
}

impl std::fmt::Debug for RegistryProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryProcess")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// `n` random bytes from the kernel, hex-encoded.
pub fn random_hex(n: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes an htpasswd file with one bcrypt entry (distribution accepts nothing else).
pub fn write_htpasswd(path: &Path, user: &str, password: &str) -> anyhow::Result<()> {
    let hash = bcrypt::hash(password, BCRYPT_COST)
        .map_err(|e| anyhow::anyhow!("hashing the registry password: {e}"))?;
    std::fs::write(path, format!("{user}:{hash}\n"))
        .with_context(|| format!("writing {}", path.display()))
}

/// The files of a registry that speaks TLS (distribution's `http.tls`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The server certificate (PEM).
    pub certificate: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
    /// CAs a client certificate must be signed by (`clientcas`: one is then required).
    pub client_ca: Option<PathBuf>,
}

fn config(
    storage: &Path,
    htpasswd: Option<&Path>,
    port: u16,
    secret: &str,
    tls: Option<&TlsFiles>,
) -> String {
    // JSON strings are valid YAML scalars, which keeps odd paths safe.
    let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
    // Without an auth section distribution serves everyone (an anonymous registry).
    let auth = htpasswd.map_or_else(String::new, |h| {
        format!(
            "auth:\n  htpasswd:\n    realm: testbed-registry\n    path: {}\n",
            q(h)
        )
    });
    let tls = tls.map_or_else(String::new, |t| {
        let cas = t.client_ca.as_ref().map_or_else(String::new, |ca| {
            format!("    clientcas:\n      - {}\n", q(ca))
        });
        format!(
            "  tls:\n    certificate: {}\n    key: {}\n{cas}",
            q(&t.certificate),
            q(&t.key)
        )
    });
    format!(
        "version: 0.1\n\
         log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
         \x20 maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: {secret}\n\
         {tls}\
         {auth}\
         health:\n  storagedriver:\n    enabled: false\n",
        storage = q(storage),
    )
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("probing for a free port")?;
    Ok(l.local_addr().context("probing for a free port")?.port())
}

impl RegistryProcess {
    /// Starts `docker-registry serve` with its config, storage and log in `dir`, and waits until
    /// an anonymous `GET /v2/` is answered: 401 with a `Basic` challenge when `htpasswd` is
    /// given, 200 without it (an anonymous registry).
    pub async fn start(dir: &Path, htpasswd: Option<&Path>) -> anyhow::Result<RegistryProcess> {
        Self::start_with_tls(dir, htpasswd, None).await
    }

    /// [`Self::start`], over TLS when `tls` is given: then it is ready once a plain HTTP
    /// `GET /v2/` gets the 400 Go's TLS server answers plain HTTP with.
    pub async fn start_with_tls(
        dir: &Path,
        htpasswd: Option<&Path>,
        tls: Option<&TlsFiles>,
    ) -> anyhow::Result<RegistryProcess> {
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)
            .with_context(|| format!("creating {}", storage.display()))?;
        let secret = random_hex(16)?;
        let log = dir.join("registry.log");
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_port()?;
            let conf = dir.join("config.yml");
            std::fs::write(&conf, config(&storage, htpasswd, port, &secret, tls))
                .with_context(|| format!("writing {}", conf.display()))?;
            let out = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            let err = out.try_clone().context("duplicating the log handle")?;
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .kill_on_drop(true)
                .spawn()
                .context("starting docker-registry (is the docker-registry package installed?)")?;
            let mut proc = RegistryProcess {
                child,
                host: format!("127.0.0.1:{port}"),
                log: log.clone(),
            };
            match proc.wait_ready(htpasswd.is_some(), tls.is_some()).await {
                Ok(()) => {
                    info!(host = %proc.host, "registry is up");
                    return Ok(proc);
                }
                Err(e) if proc.log_tail().contains("address already in use") => {
                    warn!(port, attempt, "registry port was taken, retrying: {e:#}");
                }
                Err(e) => return Err(e),
            }
        }
        bail!("no free port for the registry after {PORT_ATTEMPTS} attempts")
    }

    async fn wait_ready(&mut self, auth: bool, tls: bool) -> anyhow::Result<()> {
        let anon = Client::new(&self.host, None);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("polling docker-registry")? {
                bail!("docker-registry exited ({status}):\n{}", self.log_tail());
            }
            let probe = tokio::time::timeout(Duration::from_secs(2), anon.get("/v2/", None)).await;
            match probe {
                Ok(Ok(r)) if tls && r.status == StatusCode::BAD_REQUEST => return Ok(()),
                Ok(Ok(r)) if !auth && r.status == StatusCode::OK => return Ok(()),
                Ok(Ok(r)) if auth && r.status == StatusCode::UNAUTHORIZED => {
                    let challenge = r.header("www-authenticate").unwrap_or_default();
                    if !challenge.starts_with("Basic ") {
                        bail!("registry challenged with {challenge:?}, expected basic auth");
                    }
                    return Ok(());
                }
                Ok(Ok(r)) => bail!("registry answered /v2/ with {}", r.status),
                Ok(Err(e)) => debug!("registry not ready yet: {e:#}"),
                Err(_) => debug!("registry probe timed out"),
            }
            if Instant::now() > deadline {
                let _ = self.child.start_kill();
                bail!(
                    "registry did not answer within {READY_TIMEOUT:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The last lines of the registry's log, for error messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the registry and waits for it to exit, so its port is free afterwards.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.child.start_kill();
        tokio::time::timeout(EXIT_TIMEOUT, self.child.wait())
            .await
            .context("docker-registry did not exit after SIGKILL")?
            .context("waiting for docker-registry")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_quotes_paths_and_binds_loopback() {
        let c = config(
            Path::new("/tmp/a b"),
            Some(Path::new("/tmp/h")),
            5555,
            "s",
            None,
        );
        assert!(c.contains("rootdirectory: \"/tmp/a b\"\n"));
        assert!(c.contains("addr: 127.0.0.1:5555\n"));
        assert!(c.contains("  htpasswd:\n    realm: testbed-registry\n    path: \"/tmp/h\"\n"));
        let anonymous = config(Path::new("/tmp/a b"), None, 5555, "s", None);
        assert!(!anonymous.contains("auth:"), "{anonymous}");
        assert!(!anonymous.contains("tls:"), "{anonymous}");
        let tls = TlsFiles {
            certificate: "/t/c.pem".into(),
            key: "/t/k.pem".into(),
            client_ca: Some("/t/ca.pem".into()),
        };
        let t = config(Path::new("/s"), None, 5555, "s", Some(&tls));
        assert!(
            t.contains("  tls:\n    certificate: \"/t/c.pem\"\n    key: \"/t/k.pem\"\n    clientcas:\n      - \"/t/ca.pem\"\n"),
            "{t}"
        );
        assert!(anonymous.contains("health:"), "{anonymous}");
    }

    #[test]
    fn random_hex_has_the_asked_length() {
        let a = random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_hex(16).unwrap());
    }
}
