//! Configuration: TOML drop-ins, later directories win per key.
//!
//! Directories are read in order (`/usr/lib/streamd/config.d`, then `/etc/streamd/config.d` by
//! default; not `/run/streamd/config.d`: `/run/streamd` is streamd's own writable runtime
//! directory, and what streamd may write must not decide what it may boot); a file in a later directory masks a file of the same name
//! in an earlier one, and a symlink to `/dev/null` masks without adding anything. Unknown keys,
//! wrong types and files that are not `*.toml` are errors naming `file:line:column`: a key that is
//! silently ignored is a setting the admin believes in and does not have.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod scope;

pub use scope::RepositoryScope;

/// The default drop-in directories, lowest priority first.
pub const DEFAULT_DIRS: [&str; 2] = ["/usr/lib/streamd/config.d", "/etc/streamd/config.d"];

/// The longest `resolve-spread-seconds`: a day. A longer spread holds a fleet's moves for longer
/// than any cluster waits, and an unbounded one overflows the timer it arms.
pub const MAX_RESOLVE_SPREAD_SECONDS: u64 = 86_400;

/// Default kubeconfig: the kubelet's own.
pub const DEFAULT_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";
/// Default pull secret: the kubelet's own.
pub const DEFAULT_PULL_SECRET: &str = "/var/lib/kubelet/config.json";
/// Default runtime directory (systemd's `RuntimeDirectory=streamd`).
pub const DEFAULT_RUNTIME_DIR: &str = "/run/streamd";
/// Default state directory (systemd's `StateDirectory=streamd`): the reboot attempt record.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/streamd";
/// Default path of the bootc program (run inside a transient unit, never by streamd itself).
pub const DEFAULT_BOOTC_PATH: &str = "/usr/bin/bootc";
/// Default number of reboots into the same request before streamd gives up on it.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 2;
/// Default number of new stagings after a transaction failed on the network.
pub const DEFAULT_PULL_RETRIES: u32 = 3;
/// Default spread, in seconds, of the staging that follows a digest change of the node's
/// stream in the cluster's OSImageStream.
pub const DEFAULT_RESOLVE_SPREAD_SECONDS: u64 = 600;
/// Default `heartbeat-namespace` (docs/deploy/rbac.yaml creates it).
pub const DEFAULT_HEARTBEAT_NAMESPACE: &str = "streamd-node-lease";

/// Which OS update backend to drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// rpm-ostree when its D-Bus name is owned or activatable, else bootc.
    #[default]
    Auto,
    /// rpm-ostreed over D-Bus.
    RpmOstree,
    /// bootc in transient systemd units.
    Bootc,
}

/// Who manages the node's OS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeChoice {
    /// Readiness mode when the machine-config daemon manages the node (its node annotations
    /// or its files on the host), else manage mode.
    #[default]
    Auto,
    /// streamd stages and reboots, also on a node the machine-config daemon manages.
    Manage,
    /// streamd never stages or reboots; it only runs readiness checks.
    Readiness,
}

/// When the staged OS is applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootPolicy {
    /// Request a reboot and wait until the cluster approves that exact request.
    #[default]
    OnApproval,
    /// Stage only; someone else reboots (streamd still verifies the result after boot).
    Never,
    /// Reboot as soon as the staged deployment is verified.
    Immediate,
}

/// Admin policy that changes what passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Allow moving to an older major.
    pub allow_downgrade: bool,
    /// Extra free bytes required on the sysroot beyond the image size.
    pub min_free_sysroot: u64,
    /// Free bytes required on `/boot` (a kernel and initramfs).
    pub min_free_boot: u64,
    /// Replace a staged deployment streamd did not create instead of refusing.
    pub replace_foreign_staged: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allow_downgrade: false,
            min_free_sysroot: 1 << 30,
            min_free_boot: 150 << 20,
            replace_foreign_staged: false,
        }
    }
}

/// Which images the node takes from its annotations (docs/config.md "Image policy").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImagePolicy {
    /// `allowed-repositories`; `None`: the default, the booted image's repository and those of
    /// the cluster's OSImageStream.
    pub allowed_repositories: Option<Vec<RepositoryScope>>,
    /// `resolved-only`: only the images the cluster's OSImageStream gives the requested stream.
    pub resolved_only: bool,
}

/// `allowed-repositories` as written: at least one scope (an empty list would refuse every
/// image, which is what `mode = "readiness"` says plainly).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<RepositoryScope>")]
pub struct AllowedRepositories(pub Vec<RepositoryScope>);

impl TryFrom<Vec<RepositoryScope>> for AllowedRepositories {
    type Error = &'static str;

    fn try_from(scopes: Vec<RepositoryScope>) -> Result<Self, Self::Error> {
        if scopes.is_empty() {
            return Err(
                "allowed-repositories is empty, which would refuse every image; leave it unset for the default (the booted image's repository and the cluster's OSImageStream's), or set mode = \"readiness\"",
            );
        }
        Ok(AllowedRepositories(scopes))
    }
}

/// `heartbeat-namespace` as written: a namespace name (an RFC 1123 label), or `""` for no
/// heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct HeartbeatNamespace(pub Option<String>);

impl TryFrom<String> for HeartbeatNamespace {
    type Error = &'static str;

    fn try_from(ns: String) -> Result<Self, Self::Error> {
        if ns.is_empty() {
            return Ok(HeartbeatNamespace(None));
        }
        let label = ns.len() <= 63
            && ns
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !label {
            return Err(
                "heartbeat-namespace must be a namespace name (at most 63 lower-case letters, digits and '-', not starting or ending with '-'), or \"\" for no heartbeat",
            );
        }
        Ok(HeartbeatNamespace(Some(ns)))
    }
}

/// `resolve-spread-seconds`: at most [`MAX_RESOLVE_SPREAD_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct SpreadSeconds(pub u64);

impl TryFrom<u64> for SpreadSeconds {
    type Error = &'static str;

    fn try_from(secs: u64) -> Result<Self, Self::Error> {
        if secs > MAX_RESOLVE_SPREAD_SECONDS {
            return Err("resolve-spread-seconds must be at most 86400 (a day)");
        }
        Ok(SpreadSeconds(secs))
    }
}

/// A `registry-trusted-hosts` entry as written: a host name or `*.domain`, without a port
/// (a trusted host covers every port) or scheme.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct TrustedHost(pub String);

impl TryFrom<String> for TrustedHost {
    type Error = &'static str;

    fn try_from(host: String) -> Result<Self, Self::Error> {
        let name = host.strip_prefix("*.").unwrap_or(&host);
        let ok = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !ok {
            return Err(
                "registry-trusted-hosts entries are host names or \"*.domain\" (letters, digits, '-' and '.'; no scheme, port or path)",
            );
        }
        Ok(TrustedHost(host.to_ascii_lowercase()))
    }
}

/// An invalid configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file in a config directory that is not `*.toml`.
    #[error("{0}: not a .toml file; config directories may hold only *.toml drop-ins")]
    NotToml(PathBuf),
    /// Parse error, unknown key or wrong type.
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
}

impl ConfigError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ConfigError::Io { .. } => "config-unreadable",
            ConfigError::NotToml(_) => "config-not-toml",
            ConfigError::Invalid { .. } => "config-invalid",
        }
    }
}

/// Where a key was set: `file:line:column`, and the file's place in the application order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    order: usize,
    path: PathBuf,
    line: usize,
    column: usize,
}

impl Location {
    fn of<T>(order: usize, path: &Path, text: &str, value: &toml::Spanned<T>) -> Location {
        let (line, column) = line_col(text, value.span().start);
        Location {
            order,
            path: path.to_path_buf(),
            line,
            column,
        }
    }

    /// Sort key: later files, then later positions, were applied later.
    fn applied(&self) -> (usize, usize, usize) {
        (self.order, self.line, self.column)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.path.display(), self.line, self.column)
    }
}

/// One drop-in as written: every key optional, nothing unknown.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Fragment {
    /// Name of this node's Node object.
    pub node_name: Option<String>,
    /// Path of the kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// Root under which host facts are read.
    pub host_root: Option<PathBuf>,
    /// Pull secret (docker config JSON).
    pub pull_secret: Option<PathBuf>,
    /// Private runtime directory (extracted RPMs).
    pub runtime_dir: Option<PathBuf>,
    /// Registries spoken to over plain HTTP.
    pub insecure_registries: Option<Vec<String>>,
    /// Further hosts a registry's token realm and redirects may lead to.
    pub registry_trusted_hosts: Option<Vec<TrustedHost>>,
    /// Allow moving to an older major.
    pub allow_downgrade: Option<bool>,
    /// Free space the sysroot must keep beyond the image, MiB.
    pub min_free_sysroot_mib: Option<u64>,
    /// Free space `/boot` must have, MiB.
    pub min_free_boot_mib: Option<u64>,
    /// State directory (the reboot attempt record).
    pub state_dir: Option<PathBuf>,
    /// Update backend.
    pub backend: Option<BackendChoice>,
    /// Path of bootc on the host.
    pub bootc_path: Option<PathBuf>,
    /// Reboot policy (with its position, for errors that involve another key).
    pub reboot: Option<toml::Spanned<RebootPolicy>>,
    /// Reboots into one request before it is refused.
    pub max_attempts: Option<std::num::NonZeroU32>,
    /// New stagings after a transaction failed on the network.
    pub pull_retries: Option<u32>,
    /// Replace a staged deployment streamd did not create.
    pub replace_foreign_staged: Option<bool>,
    /// Resolve `desired-stream` through the cluster's OSImageStream (with its position).
    pub resolve_streams: Option<toml::Spanned<bool>>,
    /// Longest delay, in seconds, before staging a digest change of the node's stream.
    pub resolve_spread_seconds: Option<SpreadSeconds>,
    /// Who manages the node's OS.
    pub mode: Option<ModeChoice>,
    /// Repositories the node takes images from.
    pub allowed_repositories: Option<AllowedRepositories>,
    /// Take only the images the cluster's OSImageStream gives the requested stream.
    pub resolved_only: Option<bool>,
    /// Namespace of the node's heartbeat Lease (`""`: none).
    pub heartbeat_namespace: Option<HeartbeatNamespace>,
}

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Node name; `None` means the host name.
    pub node_name: Option<String>,
    /// Kubeconfig path (client certificates and bearer tokens both work).
    pub kubeconfig: PathBuf,
    /// Host root for `/proc`, `/etc/os-release`, the sysroot.
    pub host_root: PathBuf,
    /// Pull secret path.
    pub pull_secret: PathBuf,
    /// Runtime directory.
    pub runtime_dir: PathBuf,
    /// Registries spoken to over plain HTTP (`host:port`).
    pub insecure_registries: Vec<String>,
    /// `registry-trusted-hosts`: hosts (`host` or `*.domain`) besides a registry's own that its
    /// token realm and redirects may lead to.
    pub registry_trusted_hosts: Vec<String>,
    /// Preflight policy (downgrades, disk minimums).
    pub policy: Policy,
    /// State directory (the reboot attempt record).
    pub state_dir: PathBuf,
    /// Update backend.
    pub backend: BackendChoice,
    /// Path of bootc on the host.
    pub bootc_path: PathBuf,
    /// When the staged OS is applied.
    pub reboot: RebootPolicy,
    /// Reboots into one request before it is refused (at least 1).
    pub max_attempts: u32,
    /// New stagings of one request after its transaction failed on the network (0: none).
    pub pull_retries: u32,
    /// Resolve `desired-stream` through the cluster's OSImageStream when no image is given.
    pub resolve_streams: bool,
    /// Longest delay before staging a digest change of the node's stream (each node waits its
    /// own share of it, so a fleet does not pull at once).
    pub resolve_spread: std::time::Duration,
    /// Who manages the node's OS.
    pub mode: ModeChoice,
    /// Which images the node takes.
    pub images: ImagePolicy,
    /// Namespace of the node's heartbeat Lease; `None`: no heartbeat.
    pub heartbeat_namespace: Option<String>,
    /// The files that were read, in order (for `streamctl config check` and logs).
    pub sources: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: None,
            kubeconfig: PathBuf::from(DEFAULT_KUBECONFIG),
            host_root: PathBuf::from("/"),
            pull_secret: PathBuf::from(DEFAULT_PULL_SECRET),
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            insecure_registries: Vec::new(),
            registry_trusted_hosts: Vec::new(),
            policy: Policy::default(),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            backend: BackendChoice::default(),
            bootc_path: PathBuf::from(DEFAULT_BOOTC_PATH),
            reboot: RebootPolicy::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            pull_retries: DEFAULT_PULL_RETRIES,
            resolve_streams: false,
            resolve_spread: std::time::Duration::from_secs(DEFAULT_RESOLVE_SPREAD_SECONDS),
            mode: ModeChoice::default(),
            images: ImagePolicy::default(),
            heartbeat_namespace: Some(DEFAULT_HEARTBEAT_NAMESPACE.to_string()),
            sources: Vec::new(),
        }
    }
}

impl Config {
    /// Applies one fragment on top: keys it sets win.
    fn apply(&mut self, f: Fragment) {
        if let Some(v) = f.node_name {
            self.node_name = Some(v);
        }
        if let Some(v) = f.kubeconfig {
            self.kubeconfig = v;
        }
        if let Some(v) = f.host_root {
            self.host_root = v;
        }
        if let Some(v) = f.pull_secret {
            self.pull_secret = v;
        }
        if let Some(v) = f.runtime_dir {
            self.runtime_dir = v;
        }
        if let Some(v) = f.insecure_registries {
            self.insecure_registries = v;
        }
        if let Some(v) = f.registry_trusted_hosts {
            self.registry_trusted_hosts = v.into_iter().map(|h| h.0).collect();
        }
        if let Some(v) = f.allow_downgrade {
            self.policy.allow_downgrade = v;
        }
        if let Some(v) = f.min_free_sysroot_mib {
            self.policy.min_free_sysroot = v.saturating_mul(1 << 20);
        }
        if let Some(v) = f.min_free_boot_mib {
            self.policy.min_free_boot = v.saturating_mul(1 << 20);
        }
        if let Some(v) = f.state_dir {
            self.state_dir = v;
        }
        if let Some(v) = f.backend {
            self.backend = v;
        }
        if let Some(v) = f.bootc_path {
            self.bootc_path = v;
        }
        if let Some(v) = f.reboot {
            self.reboot = v.into_inner();
        }
        if let Some(v) = f.max_attempts {
            self.max_attempts = v.get();
        }
        if let Some(v) = f.pull_retries {
            self.pull_retries = v;
        }
        if let Some(v) = f.replace_foreign_staged {
            self.policy.replace_foreign_staged = v;
        }
        if let Some(v) = f.resolve_streams {
            self.resolve_streams = v.into_inner();
        }
        if let Some(v) = f.resolve_spread_seconds {
            self.resolve_spread = std::time::Duration::from_secs(v.0);
        }
        if let Some(v) = f.mode {
            self.mode = v;
        }
        if let Some(v) = f.allowed_repositories {
            self.images.allowed_repositories = Some(v.0);
        }
        if let Some(v) = f.resolved_only {
            self.images.resolved_only = v;
        }
        if let Some(v) = f.heartbeat_namespace {
            self.heartbeat_namespace = v.0;
        }
    }
}

/// Parses one fragment; errors carry `path:line:column`.
pub fn parse_fragment(path: &Path, text: &str) -> Result<Fragment, ConfigError> {
    toml::from_str::<Fragment>(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The drop-ins to read from `dirs`, after masking, in application order.
pub fn effective_files(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    // Name → winning path; a later directory replaces an earlier entry of the same name.
    let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(ConfigError::Io {
                    path: dir.clone(),
                    source,
                });
            }
        };
        for entry in entries {
            let entry = entry.map_err(|source| ConfigError::Io {
                path: dir.clone(),
                source,
            })?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if !name.ends_with(".toml") {
                return Err(ConfigError::NotToml(path));
            }
            by_name.insert(name, path);
        }
    }
    // Names sort the application order, as systemd does for drop-ins.
    Ok(by_name.into_values().filter(|p| !is_masked(p)).collect())
}

fn is_masked(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|t| t == Path::new("/dev/null"))
}

/// Loads the configuration from `dirs`.
pub fn load(dirs: &[PathBuf]) -> Result<Config, ConfigError> {
    let mut cfg = Config::default();
    // Where the effective `reboot` and `resolve-streams` were set, for the error that
    // involves both.
    let (mut reboot_at, mut resolve_at) = (None, None);
    for (order, path) in effective_files(dirs)?.into_iter().enumerate() {
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
            path: path.clone(),
            source,
        })?;
        let fragment = parse_fragment(&path, &text)?;
        if let Some(v) = &fragment.reboot {
            reboot_at = Some(Location::of(order, &path, &text, v));
        }
        if let Some(v) = &fragment.resolve_streams {
            resolve_at = Some(Location::of(order, &path, &text, v));
        }
        cfg.apply(fragment);
        cfg.sources.push(path);
    }
    check_combination(&cfg, reboot_at, resolve_at)?;
    Ok(cfg)
}

/// Refuses `resolve-streams = true` with `reboot = "immediate"`: a digest refresh of a stream
/// in the OSImageStream re-targets every node of that stream at once, and with immediate
/// reboots the whole fleet would reboot together, where the machine-config operator rolls
/// a pool out `maxUnavailable` nodes at a time. The error names the key set last.
fn check_combination(
    cfg: &Config,
    reboot_at: Option<Location>,
    resolve_at: Option<Location>,
) -> Result<(), ConfigError> {
    if !(cfg.resolve_streams && cfg.reboot == RebootPolicy::Immediate) {
        return Ok(());
    }
    let (at, other) = match (reboot_at, resolve_at) {
        (Some(r), Some(s)) if r.applied() >= s.applied() => (r, Some(s)),
        (r, Some(s)) => (s, r),
        (Some(r), None) => (r, None),
        // Both set means both were read from a file.
        (None, None) => return Ok(()),
    };
    let other = other.map_or(String::new(), |o| format!(" (the other key is set at {o})"));
    Err(ConfigError::Invalid {
        path: at.path,
        line: at.line,
        column: at.column,
        message: format!(
            "resolve-streams = true cannot be combined with reboot = \"immediate\"{other}: a digest change of a stream in the cluster's OSImageStream would reboot every node of that stream at once; use reboot = \"on-approval\" or \"never\""
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> testbed::scratch::ScratchDir {
        testbed::scratch::ScratchDir::new(&format!("config-{name}")).expect("scratch dir")
    }

    #[test]
    fn unknown_key_names_file_line_column() {
        let err = parse_fragment(Path::new("/x/10-a.toml"), "node-name = \"a\"\nfoo = 1\n")
            .expect_err("unknown key");
        let msg = err.to_string();
        assert!(msg.starts_with("/x/10-a.toml:2:1: "), "{msg}");
        assert!(msg.contains("foo"), "{msg}");
    }

    #[test]
    fn wrong_type_is_an_error() {
        let err = parse_fragment(Path::new("a.toml"), "kubeconfig = 3").expect_err("type");
        assert!(err.to_string().starts_with("a.toml:1:14"), "{err}");
    }

    #[test]
    fn later_dirs_win_and_mask() {
        let base = tmpdir("mask");
        let (usr, etc) = (base.join("usr"), base.join("etc"));
        std::fs::create_dir_all(&usr).expect("mkdir");
        std::fs::create_dir_all(&etc).expect("mkdir");
        std::fs::write(usr.join("10-a.toml"), "node-name = \"usr\"\n").expect("write");
        std::fs::write(usr.join("20-b.toml"), "kubeconfig = \"/usr/kc\"\n").expect("write");
        std::fs::write(etc.join("10-a.toml"), "host-root = \"/h\"\n").expect("write");
        std::os::unix::fs::symlink("/dev/null", etc.join("20-b.toml")).expect("symlink");
        let cfg = load(&[usr, etc.clone()]).expect("load");
        assert_eq!(
            cfg.node_name, None,
            "usr/10-a.toml is masked by etc/10-a.toml"
        );
        assert_eq!(cfg.host_root, PathBuf::from("/h"));
        assert_eq!(cfg.kubeconfig, PathBuf::from(DEFAULT_KUBECONFIG));
        assert_eq!(cfg.sources, vec![etc.join("10-a.toml")]);
    }

    #[test]
    fn non_toml_file_is_an_error() {
        let d = tmpdir("nontoml");
        std::fs::write(d.join("a.conf"), "").expect("write");
        assert!(matches!(
            load(&[d.to_path_buf()]),
            Err(ConfigError::NotToml(_))
        ));
    }

    #[test]
    fn lifecycle_keys_parse_and_reject_bad_values() {
        let f = parse_fragment(
            Path::new("a.toml"),
            "reboot = \"never\"\nbackend = \"bootc\"\nmax-attempts = 3\npull-retries = 0\nreplace-foreign-staged = true\nresolve-streams = true\nstate-dir = \"/s\"\nbootc-path = \"/b\"\nmode = \"manage\"\n",
        )
        .expect("parses");
        let mut cfg = Config::default();
        cfg.apply(f);
        assert_eq!(cfg.reboot, RebootPolicy::Never);
        assert_eq!(cfg.backend, BackendChoice::Bootc);
        assert_eq!(cfg.max_attempts, 3);
        assert_eq!(cfg.pull_retries, 0);
        assert!(cfg.policy.replace_foreign_staged && cfg.resolve_streams);
        assert_eq!(cfg.state_dir, PathBuf::from("/s"));
        assert_eq!(cfg.bootc_path, PathBuf::from("/b"));
        assert_eq!(cfg.mode, ModeChoice::Manage);
        assert_eq!(Config::default().mode, ModeChoice::Auto);
        for (text, col) in [
            ("mode = \"mcd\"", 8),
            ("max-attempts = 0", 16),
            ("pull-retries = -1", 16),
            ("reboot = \"sometimes\"", 10),
            ("backend = \"dnf\"", 11),
        ] {
            let err = parse_fragment(Path::new("a.toml"), text).expect_err(text);
            assert!(
                err.to_string().starts_with(&format!("a.toml:1:{col}")),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn resolving_streams_with_immediate_reboots_is_an_error_at_the_later_key() {
        let base = tmpdir("immediate");
        let (usr, etc) = (base.join("usr"), base.join("etc"));
        std::fs::create_dir_all(&usr).expect("mkdir");
        std::fs::create_dir_all(&etc).expect("mkdir");
        std::fs::write(usr.join("10-reboot.toml"), "reboot = \"immediate\"\n").expect("write");
        std::fs::write(etc.join("50-resolve.toml"), "\nresolve-streams = true\n").expect("write");
        let err = load(&[usr.clone(), etc.clone()]).expect_err("conflict");
        let msg = err.to_string();
        let want = format!(
            "{}:2:19: resolve-streams = true cannot be combined",
            etc.join("50-resolve.toml").display()
        );
        assert!(msg.starts_with(&want), "{msg}");
        assert!(
            msg.contains(&format!("{}:1:10", usr.join("10-reboot.toml").display())),
            "{msg}"
        );
        // The later key is the one named: here `reboot`, in the later file.
        std::fs::write(usr.join("10-reboot.toml"), "resolve-streams = true\n").expect("write");
        std::fs::write(etc.join("50-resolve.toml"), "reboot = \"immediate\"\n").expect("write");
        let msg = load(&[usr.clone(), etc.clone()])
            .expect_err("conflict")
            .to_string();
        assert!(
            msg.starts_with(&format!("{}:1:10: ", etc.join("50-resolve.toml").display())),
            "{msg}"
        );
        // Either key alone, or resolving with approved reboots, is fine.
        std::fs::write(
            etc.join("50-resolve.toml"),
            "reboot = \"on-approval\"\nresolve-spread-seconds = 0\n",
        )
        .expect("write");
        let cfg = load(&[usr, etc]).expect("valid");
        assert!(cfg.resolve_streams);
        assert_eq!(cfg.resolve_spread, std::time::Duration::ZERO);
        assert_eq!(
            Config::default().resolve_spread,
            std::time::Duration::from_secs(DEFAULT_RESOLVE_SPREAD_SECONDS)
        );
    }

    #[test]
    fn resolve_spread_is_bounded_at_a_day() {
        let mut cfg = Config::default();
        let f = parse_fragment(Path::new("s.toml"), "resolve-spread-seconds = 86400\n");
        cfg.apply(f.expect("a day parses"));
        assert_eq!(cfg.resolve_spread, std::time::Duration::from_secs(86_400));
        for bad in ["86401", "18446744073709551615"] {
            let text = format!("resolve-spread-seconds = {bad}\n");
            let e = parse_fragment(Path::new("s.toml"), &text).expect_err(bad);
            let shown = e.to_string();
            assert!(shown.starts_with("s.toml:1:"), "{shown}");
            assert!(shown.contains("at most 86400"), "{shown}");
        }
    }

    #[test]
    fn the_runtime_directory_is_not_a_config_directory() {
        assert!(
            !DEFAULT_DIRS
                .iter()
                .any(|d| d.starts_with(DEFAULT_RUNTIME_DIR)),
            "{DEFAULT_DIRS:?}"
        );
    }

    #[test]
    fn heartbeat_namespace_defaults_turns_off_and_refuses_bad_names() {
        assert_eq!(
            Config::default().heartbeat_namespace.as_deref(),
            Some(DEFAULT_HEARTBEAT_NAMESPACE)
        );
        for (text, want) in [
            ("heartbeat-namespace = \"\"\n", None),
            ("heartbeat-namespace = \"ops-1\"\n", Some("ops-1")),
        ] {
            let mut cfg = Config::default();
            cfg.apply(parse_fragment(Path::new("h.toml"), text).expect("parses"));
            assert_eq!(cfg.heartbeat_namespace.as_deref(), want, "{text}");
        }
        for bad in ["Ops", "-ops", "a.b", &"n".repeat(64)] {
            let text = format!("heartbeat-namespace = \"{bad}\"\n");
            let e = parse_fragment(Path::new("h.toml"), &text).expect_err(bad);
            let shown = e.to_string();
            assert!(shown.starts_with("h.toml:1:"), "{shown}");
            assert!(shown.contains("namespace name"), "{shown}");
        }
    }

    #[test]
    fn image_policy_keys_parse_and_bad_scopes_name_their_place() {
        let f = parse_fragment(
            Path::new("a.toml"),
            "allowed-repositories = [\"quay.io/openshift-release-dev\", \"r.example:5000\", \"*\"]\nresolved-only = true\n",
        )
        .expect("parses");
        let mut cfg = Config::default();
        cfg.apply(f);
        let scopes: Vec<String> = cfg
            .images
            .allowed_repositories
            .iter()
            .flatten()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            scopes,
            ["quay.io/openshift-release-dev", "r.example:5000", "*"]
        );
        assert!(cfg.images.resolved_only);
        assert_eq!(Config::default().images, ImagePolicy::default());
        assert_eq!(Config::default().images.allowed_repositories, None);
        // (text, the value the error points at, words it names)
        for (text, at, names) in [
            (
                r#"allowed-repositories = ["quay.io/a", ""]"#,
                r#""""#,
                "empty repository scope",
            ),
            (
                r#"allowed-repositories = ["quay.io/a", "openshift/rhcos"]"#,
                r#""openshift/rhcos""#,
                "registry host",
            ),
            (
                r#"allowed-repositories = ["*.example.com"]"#,
                r#""*.example.com""#,
                "wildcard",
            ),
            (
                r#"allowed-repositories = ["quay.io/a:latest"]"#,
                r#""quay.io/a:latest""#,
                "names an image",
            ),
            (
                r#"allowed-repositories = ["quay.io/A"]"#,
                r#""quay.io/A""#,
                "path component",
            ),
            (
                "allowed-repositories = []",
                "[]",
                "allowed-repositories is empty",
            ),
            (
                r#"allowed-repositories = "quay.io""#,
                r#""quay.io""#,
                "sequence",
            ),
            (r#"resolved-only = "yes""#, r#""yes""#, "bool"),
        ] {
            let col = text.find(at).expect("in the text") + 1;
            let msg = parse_fragment(Path::new("a.toml"), text)
                .expect_err(text)
                .to_string();
            assert!(
                msg.starts_with(&format!("a.toml:1:{col}: ")),
                "{text}: {msg}"
            );
            assert!(msg.contains(names), "{text}: {msg}");
        }
    }

    #[test]
    fn trusted_hosts_are_host_names_or_wildcards() {
        let f = parse_fragment(
            Path::new("t.toml"),
            r#"registry-trusted-hosts = ["S3.Example.com", "*.blobs.example", "10.0.0.5"]"#,
        )
        .expect("valid");
        assert_eq!(
            f.registry_trusted_hosts
                .unwrap_or_default()
                .into_iter()
                .map(|h| h.0)
                .collect::<Vec<_>>(),
            ["s3.example.com", "*.blobs.example", "10.0.0.5"]
        );
        for bad in [
            "\"\"",
            "\"https://s3.example.com\"",
            "\"s3.example.com:443\"",
            "\"s3.example.com/bucket\"",
            "\"*\"",
            "\"a..b\"",
        ] {
            let text = format!("registry-trusted-hosts = [{bad}]");
            let msg = parse_fragment(Path::new("t.toml"), &text)
                .expect_err(bad)
                .to_string();
            assert!(msg.starts_with("t.toml:1:"), "{bad}: {msg}");
            assert!(msg.contains("host names"), "{bad}: {msg}");
        }
    }

    #[test]
    fn missing_dirs_give_defaults() {
        let cfg = load(&[PathBuf::from("/nonexistent/streamd")]).expect("load");
        assert_eq!(cfg, Config::default());
    }
}
