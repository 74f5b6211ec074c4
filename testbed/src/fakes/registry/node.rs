//! A node's container stack as the OS daemons use it: the pull the fake rpm-ostreed and the
//! fake bootc make before they stage, and the files a node has for it.
//!
//! The real daemons pull through ostree-ext and containers-image-proxy (skopeo, i.e.
//! containers/image) with:
//! - the first of `/run/ostree/auth.json`, `/etc/ostree/auth.json`, `/usr/lib/ostree/auth.json`
//!   (bootc-dev/bootc:crates/ostree-ext/src/globals.rs `ConfigPaths::open_file`), anonymous
//!   when there is none (crates/ostree-ext/src/container/mod.rs
//!   `merge_default_container_proxy_opts`);
//! - `/etc/containers/registries.conf` and its `registries.conf.d/*.conf` drop-ins: mirrors
//!   first, the primary location last, an endpoint whose own entry is `blocked` refused
//!   (containers/image:docker/docker_image_src.go `newImageSource`, docker_client.go
//!   `newDockerClient`).
//!
//! Errors are worded as containers/image words them, behind the proxy's prefix as rpm-ostree
//! prints it ("Creating importer: failed to invoke method OpenImage: failed to invoke method
//! OpenImage: reading manifest … in …: unauthorized: authentication required", the registry's
//! own error code and message; ostreedev/ostree#3433 shows the chain on a real node). Text from
//! the registry is cut and made one line.
//!
//! - `/etc/containers/policy.json` (containers/image ≤ v5.36 has no `/usr/share` fallback), evaluated once
//!   an endpoint served the image, as skopeo's proxy does in `OpenImage`
//!   (containers/skopeo:cmd/skopeo/proxy.go `openImageImpl` → `IsRunningImageAllowed`): a
//!   `reject` requirement fails "Running image docker://… is rejected by policy."
//!   (containers/image:signature/policy_eval_simple.go `prReject.isRunningImageAllowed`).
//!
//! - A pull from the verifying origin (`ostree-image-signed:`, bootc's
//!   `--enforce-container-sigpolicy`) is refused while the policy's `default` is exactly
//!   `[insecureAcceptAnything]`, as ostree-ext refuses it ([`verifying_origin_check`]).
//!
//! Not modelled: TLS (the testbed registry speaks plain HTTP, so `insecure` is not needed),
//! bearer-token challenges (the testbed registry wants basic auth), the daemons' own check of
//! signature requirements (`signedBy`, `sigstoreSigned` are taken as satisfied: streamd
//! verifies sigstore signatures before it stages, see `tests/signatures.rs`).

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use hyper::{Method, StatusCode};
use serde::Deserialize;

use super::client::Client;

/// The prefix rpm-ostree and bootc print before a containers-image-proxy `OpenImage` error.
pub const OPEN_IMAGE: &str =
    "Creating importer: failed to invoke method OpenImage: failed to invoke method OpenImage";
/// The ostree auth files, in ostree-ext's order.
pub const AUTH_FILES: [&str; 3] = [
    "run/ostree/auth.json",
    "etc/ostree/auth.json",
    "usr/lib/ostree/auth.json",
];
/// The registries configuration, relative to the host root.
pub const REGISTRIES_CONF: &str = "etc/containers/registries.conf";
/// Its drop-in directory.
pub const REGISTRIES_CONF_D: &str = "etc/containers/registries.conf.d";
/// The User-Agent containers/image sends (the testbed's mirror records it).
pub const USER_AGENT: &str = "containers/5.36.0 (github.com/containers/image)";
/// Longest registry text kept in an error.
const MAX_TEXT: usize = 200;

/// Whether the node at `root` pulls from the network: it has a containers registries
/// configuration, as every real node does. Hosts without one (the fake rpm-ostreed's own tests,
/// whose catalog images no registry serves) resolve images from the catalog alone.
pub fn pulls_from_network(root: &Path) -> bool {
    root.join(REGISTRIES_CONF).is_file()
}

/// Writes the files a node's container stack reads, as a node the machine-config daemon
/// manages has them: `etc/ostree/auth.json` with `docker_config_json` (what the MCD links for
/// the OS daemons), a `registries.conf` like containers-common's with no mirrors, and
/// containers-common's `policy.json` (accept anything).
pub fn write_node_config(root: &Path, docker_config_json: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let files = [
        ("etc/ostree/auth.json", docker_config_json.to_string()),
        (
            REGISTRIES_CONF,
            "unqualified-search-registries = [\"registry.access.redhat.com\", \"docker.io\"]\n\
             short-name-mode = \"enforcing\"\n"
                .to_string(),
        ),
        (
            "etc/containers/policy.json",
            "{\"default\":[{\"type\":\"insecureAcceptAnything\"}],\
             \"transports\":{\"docker-daemon\":{\"\":[{\"type\":\"insecureAcceptAnything\"}]}}}\n"
                .to_string(),
        ),
    ];
    for (path, text) in files {
        let p = root.join(path);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Reads `rel` below `root`, absolute symlink targets resolved below `root` too.
fn read_below(root: &Path, rel: &str) -> std::io::Result<Option<String>> {
    let mut path = root.join(rel);
    for _ in 0..8 {
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = match target.strip_prefix("/") {
                    Ok(abs) => root.join(abs),
                    Err(_) => path.parent().map_or(target.clone(), |p| p.join(&target)),
                };
            }
            Ok(_) => return std::fs::read_to_string(&path).map(Some),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

/// The credentials of the first auth file, by key (`host[/path]`).
fn credentials(root: &Path) -> Result<BTreeMap<String, (String, String)>, String> {
    for rel in AUTH_FILES {
        let text = match read_below(root, rel) {
            Ok(None) => continue,
            Ok(Some(t)) => t,
            Err(e) => return Err(format!("reading /{rel}: {e}")),
        };
        let file: AuthFile = serde_json::from_str(&text)
            .map_err(|e| format!("reading JSON file \"/{rel}\": line {}", e.line()))?;
        let mut out = BTreeMap::new();
        for (key, entry) in file.auths {
            let pair = match (entry.auth, entry.username, entry.password) {
                (Some(a), _, _) if !a.is_empty() => base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .ok()
                    .and_then(|raw| String::from_utf8(raw).ok())
                    .and_then(|t| {
                        t.split_once(':')
                            .map(|(u, p)| (u.to_string(), p.to_string()))
                    }),
                (_, Some(u), Some(p)) => Some((u, p)),
                _ => None,
            };
            let Some(pair) = pair else {
                return Err(format!("/{rel}: decoding docker auth for {key}: invalid"));
            };
            let key = key
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
            out.insert(key, pair);
        }
        return Ok(out);
    }
    Ok(BTreeMap::new())
}

/// The credential for `name` (`host/repo`): the longest key that is `name` or a path prefix.
fn credential_for<'a>(
    creds: &'a BTreeMap<String, (String, String)>,
    name: &str,
) -> Option<&'a (String, String)> {
    let mut key = name.to_string();
    loop {
        if let Some(c) = creds.get(&key) {
            return Some(c);
        }
        key.truncate(key.rfind('/')?);
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorEntry {
    #[serde(default)]
    location: String,
    #[serde(default)]
    pull_from_mirror: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RegistryEntry {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    location: String,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror: Vec<MirrorEntry>,
}

#[derive(Debug, Default, Deserialize)]
struct RegistriesFile {
    #[serde(default)]
    registry: Vec<RegistryEntry>,
}

/// `registries.conf` and its drop-ins, a later table replacing one with the same prefix.
fn registries(root: &Path) -> Result<Vec<RegistryEntry>, String> {
    let mut files: Vec<PathBuf> = vec![root.join(REGISTRIES_CONF)];
    if let Ok(rd) = std::fs::read_dir(root.join(REGISTRIES_CONF_D)) {
        let mut d: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        d.sort();
        files.extend(d);
    }
    let mut out: Vec<RegistryEntry> = Vec::new();
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("loading registries configuration: {e}")),
        };
        let parsed: RegistriesFile = toml::from_str(&text).map_err(|e| {
            format!(
                "loading registries configuration \"{}\": {}",
                f.display(),
                e.message()
            )
        })?;
        for mut r in parsed.registry {
            if r.prefix.is_empty() {
                r.prefix = r.location.clone();
            }
            if r.location.is_empty() {
                r.location = r.prefix.clone();
            }
            match out.iter_mut().find(|e| e.prefix == r.prefix) {
                Some(e) => *e = r,
                None => out.push(r),
            }
        }
    }
    Ok(out)
}

/// The entry whose prefix covers `name` (whole components) longest.
fn find<'a>(regs: &'a [RegistryEntry], name: &str) -> Option<&'a RegistryEntry> {
    regs.iter()
        .filter(|r| {
            name == r.prefix
                || name
                    .strip_prefix(&r.prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .max_by_key(|r| r.prefix.len())
}

/// The policy files, in the order containers/image looks for root.
const POLICY_FILES: [&str; 1] = ["etc/containers/policy.json"];

/// `Err` when the first policy file rejects `image` (`host/repo@digest`): the most specific
/// `docker` scope (the reference, its repository, each namespace, the host, `*.` parents of
/// the host), else the transport's `""`, else `default`.
fn policy_allows(root: &Path, image: &str) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Req {
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(Deserialize)]
    struct Policy {
        #[serde(default)]
        default: Vec<Req>,
        #[serde(default)]
        transports: BTreeMap<String, BTreeMap<String, Vec<Req>>>,
    }
    let Some((rel, text)) = POLICY_FILES
        .iter()
        .find_map(|rel| read_below(root, rel).ok().flatten().map(|t| (*rel, t)))
    else {
        return Err(format!(
            "open /{}: no such file or directory",
            POLICY_FILES[0]
        ));
    };
    let policy: Policy = serde_json::from_str(&text)
        .map_err(|e| format!("invalid policy in \"/{rel}\": line {}", e.line()))?;
    let name = image.split('@').next().unwrap_or(image);
    let mut scopes = vec![image.to_string()];
    let mut n = name.to_string();
    loop {
        scopes.push(n.clone());
        match n.rfind('/') {
            Some(i) => n.truncate(i),
            None => break,
        }
    }
    let host = n.split(':').next().unwrap_or_default().to_string();
    let mut rest = host.as_str();
    while let Some((_, parent)) = rest.split_once('.') {
        scopes.push(format!("*.{parent}"));
        rest = parent;
    }
    scopes.push(String::new());
    let docker = policy.transports.get("docker");
    let reqs = scopes
        .iter()
        .find_map(|s| docker.and_then(|d| d.get(s)))
        .unwrap_or(&policy.default);
    if reqs.is_empty() || reqs.iter().any(|r| r.kind == "reject") {
        return Err(format!(
            "Running image docker://{image} is rejected by policy."
        ));
    }
    Ok(())
}

/// ostree-ext's check before a pull from the verifying origin (`ostree-image-signed:`,
/// `SignatureSource::ContainerPolicy`): a policy whose `default` is exactly
/// `[insecureAcceptAnything]` is refused (bootc-dev/bootc: crates/ostree-ext/src/container/
/// skopeo.rs `container_policy_is_default_insecure`, store.rs `prepare_internal`).
pub fn verifying_origin_check(root: &Path) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(Deserialize)]
    struct Policy {
        default: Option<Vec<Entry>>,
    }
    let text = POLICY_FILES
        .iter()
        .find_map(|rel| read_below(root, rel).ok().flatten())
        .ok_or_else(|| format!("open /{}: no such file or directory", POLICY_FILES[0]))?;
    let policy: Policy = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    match policy.default.as_deref() {
        Some([only]) if only.kind == "insecureAcceptAnything" => Err(
            "containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// Registry text fit for an error: one line, cut.
fn inert(text: &str) -> String {
    let one: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_TEXT)
        .collect();
    one.trim().to_string()
}

/// containers/image's text for a failed manifest read: the registry's error envelope as
/// `<code in lower case, '_' as ' '>: <message>`.
fn manifest_error(reference: &str, name: &str, status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let what = match serde_json::from_slice::<Envelope>(body) {
        Ok(e) if !e.errors.is_empty() => e
            .errors
            .iter()
            .map(|x| {
                format!(
                    "{}: {}",
                    x.code.to_ascii_lowercase().replace('_', " "),
                    x.message
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        _ => format!("received unexpected HTTP status: {status}"),
    };
    format!("reading manifest {reference} in {name}: {}", inert(&what))
}

/// Reads the manifest of `name` at `reference` from its registry as containers/image does.
async fn fetch(name: &str, reference: &str, cred: Option<&(String, String)>) -> Result<(), String> {
    let (host, repo) = name.split_once('/').unwrap_or((name, ""));
    let client = Client::new(host, cred.map(|(u, p)| (u.as_str(), p.as_str())));
    let accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
                  application/vnd.docker.distribution.manifest.list.v2+json, \
                  application/vnd.docker.distribution.manifest.v2+json";
    let resp = client
        .request(
            Method::GET,
            &format!("/v2/{repo}/manifests/{reference}"),
            &[("accept", accept), ("user-agent", USER_AGENT)],
            Vec::new(),
        )
        .await
        .map_err(|e| {
            format!(
                "pinging container registry {host}: {}",
                inert(&format!("{e:#}"))
            )
        })?;
    if resp.status == StatusCode::OK {
        Ok(())
    } else {
        Err(manifest_error(reference, name, resp.status, &resp.body))
    }
}

/// Opens `image` (`host/repo@digest` or `host/repo:tag`) as the OS daemon's pull does on the
/// node at `root`, when that node pulls from the network ([`pulls_from_network`]); `Err` is the
/// daemon's error text.
pub async fn pull_check(root: &Path, image: &str) -> Result<(), String> {
    if !pulls_from_network(root) {
        return Ok(());
    }
    let source = open(root, image)
        .await
        .map_err(|e| format!("{OPEN_IMAGE}: {e}"))?;
    tracing::info!(%image, %source, "read the manifest where the node's container stack would");
    Ok(())
}

/// Where the node at `root` pulls `image` from, as `host/repo@digest` (or `:tag`): the first
/// endpoint of its registries configuration that serves the image, a mirror or the image's
/// own registry; and the text of its auth file, if it has one. The fake rpm-ostreed hands both
/// to ostree-ext's importer: skopeo would read the testbed machine's containers configuration,
/// not the node's, so the node's choice is made here. `Err` is the daemon's error text.
pub async fn pull_source(root: &Path, image: &str) -> Result<(String, Option<String>), String> {
    let source = open(root, image)
        .await
        .map_err(|e| format!("{OPEN_IMAGE}: {e}"))?;
    let (_, reference) = split_reference(image);
    let sep = if image.contains('@') { '@' } else { ':' };
    let mut auth = None;
    for rel in AUTH_FILES {
        if let Some(text) = read_below(root, rel).map_err(|e| format!("reading /{rel}: {e}"))? {
            auth = Some(text);
            break;
        }
    }
    Ok((format!("{source}{sep}{reference}"), auth))
}

/// `host/repo@digest` or `host/repo:tag` split into the name and the reference.
fn split_reference(image: &str) -> (&str, &str) {
    match image.split_once('@') {
        Some((n, d)) => (n, d),
        None => {
            let slash = image.rfind('/').map_or(0, |i| i + 1);
            match image[slash..].rfind(':') {
                Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
                None => (image, "latest"),
            }
        }
    }
}

async fn open(root: &Path, image: &str) -> Result<String, String> {
    let (name, reference) = split_reference(image);
    let creds = credentials(root).map_err(|e| format!("getting username and password: {e}"))?;
    let regs = registries(root)?;
    let mut sources: Vec<String> = Vec::new();
    let primary = match find(&regs, name) {
        Some(r) => {
            let rest = &name[r.prefix.len()..];
            for m in &r.mirror {
                // A digest reference never goes to a tag-only mirror.
                if image.contains('@') && m.pull_from_mirror.as_deref() == Some("tag-only") {
                    continue;
                }
                sources.push(format!("{}{rest}", m.location));
            }
            format!("{}{rest}", r.location)
        }
        None => name.to_string(),
    };
    sources.push(primary);
    let sep = if image.contains('@') { '@' } else { ':' };
    let mut attempts: Vec<(String, String)> = Vec::new();
    for source in &sources {
        let outcome = match find(&regs, source).filter(|r| r.blocked) {
            Some(r) => Err(format!(
                "registry {} is blocked in /etc/containers/registries.conf or \
                 /etc/containers/registries.conf.d",
                r.prefix
            )),
            None => fetch(source, reference, credential_for(&creds, source)).await,
        };
        match outcome {
            // The policy judges the image as named, not the endpoint that served it.
            Ok(()) => return policy_allows(root, image).map(|()| source.clone()),
            Err(e) => attempts.push((format!("{source}{sep}{reference}"), e)),
        }
    }
    let Some((primary_ref, primary_err)) = attempts.pop() else {
        return Err("Internal error: newImageSource returned without trying any endpoint".into());
    };
    if attempts.is_empty() {
        return Err(primary_err);
    }
    let extras: Vec<String> = attempts
        .iter()
        .map(|(r, e)| format!("[{r}: {e}]"))
        .collect();
    Err(format!(
        "(Mirrors also failed: {}): {primary_ref}: {primary_err}",
        extras.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_errors_read_as_containers_image_words_them() {
        let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#;
        assert_eq!(
            manifest_error(
                "sha256:ab",
                "r:5000/openshift/rhcos",
                StatusCode::UNAUTHORIZED,
                body
            ),
            "reading manifest sha256:ab in r:5000/openshift/rhcos: unauthorized: authentication required"
        );
        let hostile = format!(
            "{{\"errors\":[{{\"code\":\"X\",\"message\":\"a\\nb{}\"}}]}}",
            "z".repeat(500)
        );
        let e = manifest_error("t", "r/x", StatusCode::BAD_REQUEST, hostile.as_bytes());
        assert!(!e.contains('\n') && e.len() < 300, "{e}");
    }

    #[test]
    fn longest_prefix_and_drop_ins() {
        let dir = crate::scratch::ScratchDir::new("node-config").expect("scratch dir");
        std::fs::create_dir_all(dir.join(REGISTRIES_CONF_D)).unwrap();
        std::fs::write(
            dir.join(REGISTRIES_CONF),
            "[[registry]]\nlocation = \"r\"\nblocked = true\n",
        )
        .unwrap();
        std::fs::write(
            dir.join(REGISTRIES_CONF_D).join("a.conf"),
            "[[registry]]\nlocation = \"r\"\n[[registry.mirror]]\nlocation = \"m/x\"\n",
        )
        .unwrap();
        let regs = registries(&dir).unwrap();
        let r = find(&regs, "r/os").unwrap();
        assert!(!r.blocked);
        assert_eq!(r.mirror[0].location, "m/x");
        assert!(find(&regs, "rx/os").is_none());
    }
}
