//! Gathering for preflight: host facts, CRI-O, disk, the images over the registry.
//!
//! The I/O half of preflight; the checks themselves are the pure [`crate::agent::preflight::run`], and
//! the plan is completed by the pure [`StagePlan::carry`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{debug, info, warn};

use futures::StreamExt;

use crate::agent::preflight::{
    self, Cause, CheckResult, DiskFree, FactError, FromExtensions, Input, LayeringConfig, Mover,
    RPM_OSTREED_CONF, Repo, YUM_REPOS_D, repos,
};
use crate::backend::Deployment;
use crate::backend::KernelVariant;
use crate::backend::StagePlan;
use crate::cluster::policy::Verdict;
use crate::cluster::protocol::Desired;
use crate::config::{ImagePolicy, Policy};
use crate::host::facts::machineconfig::AppliedConfig;
use crate::host::facts::{self, HostFacts, HostRoot};
use crate::host::ospull::OsPull;
use crate::image::extensions;
use crate::image::pullsecret::PullSecret;
use crate::image::reference::ImageRef;
use crate::image::registry::{Access, InspectError, Inspector};
use crate::image::registry::{ExtensionsInfo, OsImageInfo};
use crate::image::rpm::{Closure, RpmHeader, close, el_major, package_name};

/// Repositories probed side by side.
const PROBES_AT_ONCE: usize = 8;

/// What the gatherer needs from the configuration.
#[derive(Debug, Clone)]
pub struct Gatherer {
    /// Host root.
    pub host: HostRoot,
    /// Pull secret path.
    pub pull_secret: PathBuf,
    /// Plain-HTTP registries and trusted hosts from streamd's configuration.
    pub registries: Access,
    /// Runtime directory for extracted RPMs.
    pub runtime_dir: PathBuf,
    /// Preflight policy.
    pub policy: Policy,
    /// Which images the node takes.
    pub images: ImagePolicy,
    /// The registry client of the last preflight and the pull secret it was made for: kept
    /// while the secret is unchanged, so its connections and tokens serve the next preflight.
    pub inspector: std::sync::Arc<std::sync::Mutex<Option<(PullSecret, Inspector)>>>,
    /// The extractions the daemon's own request and its staging still use: a preflight never
    /// prunes them.
    pub in_use: InUse,
    /// What readiness read of extensions images, in memory.
    pub read: ReadinessReads,
}

/// One readiness answer: the image (by digest), the architecture and the packages wanted.
type ReadKey = (String, String, Vec<String>);

/// The extensions images readiness read, newest last, at most [`ReadinessReads::KEPT`]: one
/// per stream it checks, so a pass after the first reads no layer again. A layer read is
/// spread over `resolve-spread-seconds` like staging, by this node's share of it.
#[derive(Debug, Clone, Default)]
pub struct ReadinessReads {
    held: Arc<Mutex<Vec<(ReadKey, ExtensionsInfo)>>>,
    node: String,
    spread: Duration,
}

impl ReadinessReads {
    /// As many as readiness checks streams at most.
    const KEPT: usize = crate::cluster::protocol::MAX_READINESS_STREAMS;

    /// Nothing read yet, for `node`, spreading layer reads over `spread`.
    pub fn new(node: &str, spread: Duration) -> Self {
        ReadinessReads {
            node: node.to_string(),
            spread,
            ..ReadinessReads::default()
        }
    }

    /// How long this node waits before it reads the layers of `image`: nothing for its first
    /// read since streamd started (nodes start as they boot, and the machine-config operator
    /// reboots a pool a few at a time), else its share of the spread for that image, so after
    /// a digest change, which every node sees at once, the fleet's reads do not come at once.
    fn delay(&self, image: &ImageRef) -> Duration {
        if self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
        {
            return Duration::ZERO;
        }
        crate::cluster::streams::share_of(self.spread, &[&self.node, image.digest()])
    }

    fn get(&self, key: &ReadKey) -> Option<ExtensionsInfo> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter().find(|(k, _)| k == key).map(|(_, i)| i.clone())
    }

    fn put(&self, key: ReadKey, info: ExtensionsInfo) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|(k, _)| *k != key);
        if held.len() == Self::KEPT {
            held.remove(0);
        }
        held.push((key, info));
    }
}

/// Who still needs an extraction directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// The daemon's current request (its last own preflight read this image).
    Request,
    /// The running staging: its plan opens the RPMs in this directory, possibly only after
    /// waiting minutes for rpm-ostreed.
    Staging,
}

/// The extraction directories the daemon itself still needs, by holder. A preflight for another
/// request (`streamctl preflight`, `streamctl plan`: the `Preflight` D-Bus method) shares the
/// cache and prunes everything else only.
#[derive(Debug, Clone, Default)]
pub struct InUse(Arc<Mutex<BTreeMap<Holder, PathBuf>>>);

impl InUse {
    /// Records that `holder` needs `dir` (replacing what it needed before), or nothing.
    pub fn hold(&self, holder: Holder, dir: Option<&Path>) {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match dir {
            Some(d) => held.insert(holder, d.to_path_buf()),
            None => held.remove(&holder),
        };
    }

    /// Every directory held, plus `also`.
    fn keep(&self, also: Option<PathBuf>) -> Vec<PathBuf> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.values().cloned().chain(also).collect()
    }
}

/// Whose preflight runs: only the daemon's own request moves what [`Holder::Request`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The daemon's current request, which it stages when every check passes.
    Request,
    /// Any request, only to show the checks and the plan.
    DryRun,
    /// The readiness of a node the machine-config daemon manages: the move would be the
    /// machine-config operator's once an admin sets the pool's stream, so it is judged as the
    /// operator makes it ([`Mover::MachineConfigOperator`]). No plan: streamd stages nothing.
    MachineConfigReadiness,
}

impl Purpose {
    /// Who would make the move.
    pub fn mover(self) -> Mover {
        match self {
            Purpose::Request | Purpose::DryRun => Mover::Streamd,
            Purpose::MachineConfigReadiness => Mover::MachineConfigOperator,
        }
    }
}

/// The outcome of a preflight run.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Every check's result.
    pub checks: Vec<CheckResult>,
    /// The complete plan, when no check failed and streamd makes the move.
    pub plan: Option<StagePlan>,
    /// What the staged deployment must look like (with `plan`).
    pub expect: Option<crate::host::verify::Expectation>,
}

impl Prepared {
    /// A request the image policy refused for `reason`: that check alone, nothing read.
    pub fn refused_by_image_policy(reason: String) -> Prepared {
        Prepared {
            checks: preflight::refused_by_image_policy(reason),
            plan: None,
            expect: None,
        }
    }
}

/// A preflight that could not finish and will be retried.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Transient(pub String);

/// Transient inspection errors of the extensions image end the preflight (it is retried);
/// others become check failures.
fn split<T>(e: InspectError) -> Result<Result<T, FactError>, Transient> {
    if e.is_transient() {
        Err(Transient(e.to_string()))
    } else {
        Ok(Err(FactError::ExtensionsImage(e)))
    }
}

impl Gatherer {
    fn secret(&self) -> Result<PullSecret, FactError> {
        let path = || self.pull_secret.clone();
        match std::fs::read_to_string(&self.pull_secret) {
            Ok(text) => PullSecret::parse(&text).map_err(|source| FactError::PullSecretInvalid {
                path: path(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                warn!(path = %self.pull_secret.display(), "no pull secret; pulling anonymously");
                Ok(PullSecret::default())
            }
            Err(e) => Err(FactError::PullSecretUnreadable {
                path: path(),
                source: Arc::new(e),
            }),
        }
    }

    /// The registry client for `secret`, reused while the secret stays the same.
    fn inspector(&self, secret: &PullSecret) -> Result<Inspector, FactError> {
        let mut cached = self
            .inspector
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*cached {
            Some((s, i)) if s == secret => Ok(i.clone()),
            _ => {
                let i =
                    Inspector::configured(secret.clone(), &self.registries, &self.host.path("/"))
                        .map_err(FactError::RegistryClient)?;
                *cached = Some((secret.clone(), i.clone()));
                Ok(i)
            }
        }
    }

    fn cache(&self) -> extensions::Cache {
        extensions::Cache::new(self.runtime_dir.join("extensions"))
    }

    /// The extensions image's RPM list and the `wanted` RPMs from it: from the last
    /// extraction of the same image and packages when there is one, else pulled. Only this
    /// image's extraction is kept. Readiness extracts nothing ([`Self::readiness_headers`]).
    async fn extensions(
        &self,
        inspector: &Inspector,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        purpose: Purpose,
    ) -> Result<(ExtensionsInfo, Vec<PathBuf>), InspectError> {
        if purpose == Purpose::MachineConfigReadiness {
            let info = self
                .readiness_headers(inspector, image, arch, wanted)
                .await?;
            return Ok((info, Vec::new()));
        }
        let cache = self.cache();
        if purpose == Purpose::Request {
            self.in_use.hold(Holder::Request, Some(&cache.dir(image)));
        }
        cache.prune(&self.in_use.keep(Some(cache.dir(image))));
        if let Some(hit) = cache.get(image, arch, wanted) {
            return Ok(hit);
        }
        let found = self
            .pull_extensions(inspector, image, arch, wanted, Some(&cache))
            .await?;
        cache.put(image, arch, wanted, &found.0, &found.1);
        Ok(found)
    }

    /// What readiness needs of the extensions image: its labels and, with packages wanted, the
    /// RPM list and headers, read from the stream and kept in memory only (`/run` is RAM on
    /// every node of the fleet, and readiness stages nothing). The image is digest-pinned, so
    /// an answer stays true: the next pass for the same image and packages reads nothing.
    async fn readiness_headers(
        &self,
        inspector: &Inspector,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
    ) -> Result<ExtensionsInfo, InspectError> {
        let key = (image.to_string(), arch.to_string(), wanted.to_vec());
        if let Some(hit) = self.read.get(&key) {
            return Ok(hit);
        }
        if !wanted.is_empty() {
            let delay = self.read.delay(image);
            info!(image = %image, delay_s = delay.as_secs(), "reading the extensions image's rpm headers after this node's share of resolve-spread-seconds");
            tokio::time::sleep(delay).await;
        }
        let (info, _) = self
            .pull_extensions(inspector, image, arch, wanted, None)
            .await?;
        self.read.put(key, info.clone());
        Ok(info)
    }

    /// The extensions image `image` read from the first place it can be had from, the
    /// `wanted` RPMs extracted into `extract`'s directory for it when there is one. Pulled where
    /// podman pulls it for the machine-config daemon: through the host's registries.conf
    /// (mirrors first, blocked locations never), with streamd's pull secret.
    async fn pull_extensions(
        &self,
        inspector: &Inspector,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        extract: Option<&extensions::Cache>,
    ) -> Result<(ExtensionsInfo, Vec<PathBuf>), InspectError> {
        let sources = crate::host::ospull::registries_conf(&self.host)
            .and_then(|c| Ok(c.pull_sources(image)?))
            .map_err(|e| InspectError::Invalid(e.to_string()))?;
        let mut failure = None;
        for s in &sources {
            let source = format!("{}/{}", s.image.registry(), s.image.repository());
            if let Some(prefix) = &s.blocked_by {
                failure.get_or_insert(InspectError::Invalid(format!(
                    "{source}: blocked by the registries.conf entry for {prefix}"
                )));
                continue;
            }
            let from = inspector.for_source(s, &sources);
            let read = match extract {
                Some(cache) => {
                    let dest = cache.fresh(image).map_err(|e| {
                        InspectError::Invalid(format!("{}: {e}", cache.root().display()))
                    })?;
                    from.extensions(&s.image, arch, wanted, &dest).await
                }
                None => (from.extension_headers(&s.image, arch, wanted).await)
                    .map(|info| (info, Vec::new())),
            };
            match read {
                Ok(found) => return Ok(found),
                Err(e) => {
                    debug!(%source, mirror = s.mirror, error = %e, "extensions image not read from this source");
                    // A transient failure anywhere is retried; else the last source's error.
                    if !failure.as_ref().is_some_and(InspectError::is_transient) {
                        failure = Some(e);
                    }
                }
            }
        }
        Err(failure
            .unwrap_or_else(|| InspectError::Invalid(format!("no place to pull {image} from"))))
    }

    /// Which of `desired`'s images are pinned in the node's CRI-O storage, for the
    /// machine-config operator's move only (streamd's own pulls from the registry).
    fn pinned(&self, desired: &Desired, purpose: Purpose) -> Pinned {
        if purpose != Purpose::MachineConfigReadiness {
            return Pinned::default();
        }
        let images = facts::pinned_images(&self.host).unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the pinned images; taking none as pinned");
            Vec::new()
        });
        let has = |image: &ImageRef| images.iter().any(|p| *p == image.to_string());
        Pinned {
            os: has(&desired.os_image),
            extensions: desired.extensions_image.as_ref().is_some_and(has),
        }
    }

    fn disk(&self) -> DiskFree {
        let free = |p: &str| {
            rustix::fs::statvfs(self.host.path(p))
                .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
                .unwrap_or_else(|e| {
                    warn!(path = p, error = %e, "cannot read free space; counting it as none");
                    0
                })
        };
        DiskFree {
            sysroot: free("/sysroot"),
            boot: free("/boot"),
        }
    }

    /// `LockLayering` in `/etc/rpm-ostreed.conf` and, when `probe` (the move makes
    /// rpm-ostree read them: [`preflight::reads_repositories`]), the enabled repositories of
    /// `/etc/yum.repos.d`, each probed with the variables of a move to EL `target` on `arch`:
    /// the merge deployment's `/etc` is the booted one's, since streamd stages only when
    /// nothing else is pending.
    async fn layering(
        &self,
        probe: bool,
        target: Option<u32>,
        arch: &str,
    ) -> Result<LayeringConfig, FactError> {
        let read = |file: &str| match std::fs::read_to_string(self.host.path(file)) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FactError::HostFile {
                path: PathBuf::from(file),
                source: Arc::new(e),
            }),
        };
        let lock_layering =
            read(RPM_OSTREED_CONF)?.and_then(|t| preflight::lock_layering(RPM_OSTREED_CONF, &t));
        if !probe {
            return Ok(LayeringConfig {
                lock_layering,
                repos: Vec::new(),
            });
        }
        let listed = |dir: &str, keep: fn(&str) -> bool| {
            let mut names: Vec<String> = std::fs::read_dir(self.host.path(dir))
                .map(|rd| {
                    rd.filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| keep(n))
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            names
        };
        let mut var_files = Vec::new();
        for dir in repos::VARS_DIRS {
            for name in listed(dir, |n| !n.starts_with('.')) {
                if let Some(text) = read(&format!("{dir}/{name}"))? {
                    var_files.push((name, text));
                }
            }
        }
        let vars = repos::Vars::new(
            target.map(|m| m.to_string()).as_deref(),
            arch,
            var_files.iter().map(|(n, t)| (n.as_str(), t.as_str())),
        );
        let daemon = read(repos::MCO_PROXY_ENV)?
            .map(|t| repos::DaemonProxy::from_env_file(&t))
            .unwrap_or_default();
        let main = read(repos::DNF_CONF)?
            .map(|t| repos::main_connection(&t))
            .unwrap_or_default();
        let mut defs = Vec::new();
        for name in listed(YUM_REPOS_D, |n| n.ends_with(".repo")) {
            let file = format!("{YUM_REPOS_D}/{name}");
            let Some(text) = read(&file)? else { continue };
            defs.extend(repos::enabled_repos(&file, &text, &vars, &main));
        }
        let repos = futures::stream::iter(defs)
            .map(|def| async {
                let deadline = preflight::probe::REQUEST_DEADLINE;
                let reach = preflight::probe::probe(&def, &daemon, &self.host, deadline).await;
                Repo {
                    id: def.id,
                    at: def.at,
                    reach,
                }
            })
            .buffered(PROBES_AT_ONCE)
            .collect()
            .await;
        Ok(LayeringConfig {
            lock_layering,
            repos,
        })
    }

    fn nic_names_persisted(&self) -> bool {
        std::fs::read_dir(self.host.path("/etc/systemd/network"))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().ends_with(".link"))
            })
            .unwrap_or(false)
    }

    /// Runs every check for `desired` on top of `booted`, completing `base` when all pass.
    /// `machine_config`: the MachineConfig the machine-config daemon applied (or why it cannot
    /// be read, as the error of whoever read it), which decides what the machine-config
    /// operator's move installs; `None` for streamd's own moves. `allowed`: why the image
    /// policy (`crate::cluster::policy`) takes `desired`, judged by the caller before anything
    /// is read.
    #[allow(clippy::too_many_arguments)]
    pub async fn prepare(
        &self,
        facts: &HostFacts,
        desired: &Desired,
        booted: &Deployment,
        foreign_staged: Option<&Deployment>,
        base: StagePlan,
        purpose: Purpose,
        machine_config: Option<Result<AppliedConfig, FactError>>,
        allowed: String,
    ) -> Result<Prepared, Transient> {
        let kernel =
            facts::kernel_variant(&self.host, booted).map_err(|e| FactError::Kernel(Cause::new(e)));
        let running = kernel.as_ref().copied().unwrap_or(KernelVariant::Default);
        // What the extensions image must provide (and streamd's rebase carries as packages):
        // nothing when the image itself provides the variant (the kernel-variant check then
        // wants the target to provide it too), unless the machine-config operator rebuilds a
        // layered image and swaps the kernel from the extensions image; for the operator's
        // move, what the applied MachineConfig asks for when it is known.
        let booted_major = self.host.os_release().ok().and_then(|r| r.major());
        let needed = preflight::from_extensions(
            booted,
            &kernel,
            purpose.mover(),
            machine_config.as_ref(),
            booted_major,
        );
        let probes = preflight::reads_repositories(facts.backend, purpose.mover(), booted, &needed);
        let crio = facts::crio_default_runtime(&self.host).map_err(FactError::from);
        let inspector = self.secret().and_then(|s| self.inspector(&s));
        let (layered, wanted) = wanted_packages(&needed);
        let images = self
            .read_images(desired, &facts.arch, &inspector, &wanted, purpose)
            .await;
        let (os_pull, os_image, extensions) =
            unknown_if_pinned(self.pinned(desired, purpose), images)?;
        let signature = self.signature(desired, booted, &os_pull, &os_image).await?;
        // One answer for the checks, the verification and the RPM choice.
        let target = preflight::target_major(desired, &os_image);
        let (mut extensions, mut extracted) = match extensions {
            None => (None, Vec::new()),
            Some(Ok((info, files))) => (Some(Ok(info)), files),
            Some(Err(e)) => (Some(Err(e)), Vec::new()),
        };
        let closure = closure_of(&extensions, &facts.arch, target, &wanted, needed.variant).await;
        // Providers the closure added are extracted now; the cache then serves the wanted
        // packages from the larger extraction.
        if let (Some(c), Some(img), Ok(i)) = (&closure, &desired.extensions_image, &inspector)
            && purpose.mover() == Mover::Streamd
            && !c
                .files()
                .all(|file| extracted.iter().any(|p| file_name(p) == Some(file)))
        {
            match self
                .extract_closure(i, img, &facts.arch, &wanted, c, purpose)
                .await?
            {
                Ok(files) => extracted = files,
                Err(e) => extensions = Some(Err(e)),
            }
        }
        let input = Input {
            desired: desired.clone(),
            image_policy: Verdict::Allowed(allowed),
            booted: booted.clone(),
            booted_major,
            arch: facts.arch.clone(),
            x86_64_level: facts.x86_64_level,
            fips: facts.fips,
            secure_boot: facts.secure_boot,
            bootloader_updated: facts.bootloader_updated,
            fips_sources: facts.fips_sources.clone(),
            kernel,
            crio_runtime: crio,
            os_image,
            os_pull,
            signature: signature.verdict,
            extensions,
            closure,
            layering: self.layering(probes, target, &facts.arch).await,
            disk: self.disk(),
            nic_names_persisted: self.nic_names_persisted(),
            foreign_staged: foreign_staged.cloned(),
            backend: facts.backend,
            policy: self.policy.clone(),
            mover: purpose.mover(),
            machine_config,
        };
        for e in input.fact_errors() {
            debug!(fact = e.label(), error = %e, "a fact preflight looks at could not be had");
        }
        let checks = preflight::run(&input);
        let expect = expectation(&input, target, running);
        let ours = purpose.mover() == Mover::Streamd;
        let plan = (ours && preflight::first_failure(&checks).is_none()).then(|| {
            // Exactly the closure is passed: preflight made sure it is complete.
            let rpms = closure_files(extracted, input.closure.as_ref());
            StagePlan {
                signed: signature.verifying,
                ..base.carry(
                    booted,
                    needed.variant,
                    &layered,
                    &rpms,
                    input
                        .os_image
                        .as_ref()
                        .ok()
                        .and_then(|i| i.base_packages.as_ref()),
                )
            }
        });
        Ok(Prepared {
            checks,
            plan,
            expect,
        })
    }

    /// The OS image (how its pull went, and what it is) and the extensions image of `desired`
    /// with the `wanted` RPMs from it ([`Self::read_extensions`]). The two are independent, so
    /// they are read side by side. The OS image is read where and as the OS daemon will pull it
    /// (its auth file, mirrors, policy), not with streamd's pull secret, which only reads the
    /// extensions image.
    async fn read_images(
        &self,
        desired: &Desired,
        arch: &str,
        inspector: &Result<Inspector, FactError>,
        wanted: &[String],
        purpose: Purpose,
    ) -> Result<Images, Transient> {
        let os_image =
            crate::host::ospull::inspect(&self.host, &desired.os_image, arch, &self.registries);
        let extensions = self.read_extensions(
            desired.extensions_image.as_ref(),
            inspector,
            arch,
            wanted,
            purpose,
        );
        let (os_image, extensions) = tokio::join!(os_image, extensions);
        let (os_pull, os_image) = os_image.map_err(|e| Transient(e.to_string()))?;
        let os_image = os_image.map_err(|e| FactError::OsImage(Cause::new(e)));
        Ok((os_pull, os_image, extensions?))
    }

    /// The OS image's signature as the host's policy requires it, verified where the daemon
    /// pulls from (`crate::host::sigpolicy`); a transient registry failure is retried.
    async fn signature(
        &self,
        desired: &Desired,
        booted: &Deployment,
        os_pull: &crate::host::ospull::OsPull,
        os_image: &Result<OsImageInfo, FactError>,
    ) -> Result<crate::host::sigpolicy::Judgement, Transient> {
        crate::host::sigpolicy::judge(
            &self.host,
            &desired.os_image,
            booted.container_image_reference.as_deref(),
            os_pull,
            os_image.as_ref().ok().map(|i| i.manifest_digest.as_str()),
            &self.registries,
        )
        .await
        .map_err(|e| Transient(e.to_string()))
    }

    /// The extensions image `image` asks for and the `wanted` RPMs from it ([`Self::extensions`]),
    /// or why it cannot be read; `None` without an image, when only the extractions others
    /// hold are kept.
    async fn read_extensions(
        &self,
        image: Option<&ImageRef>,
        inspector: &Result<Inspector, FactError>,
        arch: &str,
        wanted: &[String],
        purpose: Purpose,
    ) -> Result<Option<Result<(ExtensionsInfo, Vec<PathBuf>), FactError>>, Transient> {
        match (image, inspector) {
            (None, _) => {
                if purpose == Purpose::Request {
                    self.in_use.hold(Holder::Request, None);
                }
                self.cache().prune(&self.in_use.keep(None));
                Ok(None)
            }
            (Some(_), Err(e)) => Ok(Some(Err(e.clone()))),
            (Some(img), Ok(i)) => match self.extensions(i, img, arch, wanted, purpose).await {
                Ok(found) => Ok(Some(Ok(found))),
                Err(e) => split(e).map(Some),
            },
        }
    }

    /// Extracts the `wanted` RPMs and the providers `closure` added from `image`: the files
    /// then extracted, or why the image could not be read again.
    async fn extract_closure(
        &self,
        inspector: &Inspector,
        image: &ImageRef,
        arch: &str,
        wanted: &[String],
        closure: &Closure,
        purpose: Purpose,
    ) -> Result<Result<Vec<PathBuf>, FactError>, Transient> {
        let mut more = wanted.to_vec();
        for p in &closure.packages {
            if !more.contains(&p.name) {
                more.push(p.name.clone());
            }
        }
        match self
            .extensions(inspector, image, arch, &more, purpose)
            .await
        {
            Ok((_, files)) => Ok(Ok(files)),
            Err(e) => split(e),
        }
    }
}

/// What [`Gatherer::read_images`] reads: how the OS image's pull went, the OS image, and the
/// extensions image (if asked for) with the files extracted from it.
type Images = (
    OsPull,
    Result<OsImageInfo, FactError>,
    Option<Result<(ExtensionsInfo, Vec<PathBuf>), FactError>>,
);

/// Which of a request's images a PinnedImageSet put in the node's CRI-O storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Pinned {
    /// The OS image.
    os: bool,
    /// The extensions image.
    extensions: bool,
}

/// The images as read from the registry, unless the machine-config daemon takes one that
/// failed from local storage (`pinned`): then the registry's answer decides nothing, and
/// readiness is unknown (a check that could not run, retried) rather than not ready. The
/// daemon rebases onto a pinned OS image from CRI-O's storage (pkg/daemon/update.go
/// `updateLayeredOS`: `GetPodmanImageInfoByReference`, `RebaseLayeredFromContainerStorage`;
/// on 4.21 and 4.22 when the node's pool has PinnedImageSets, on 4.23 whenever the image is
/// there) and looks for the extensions image there first (`pullExtensionsImage`).
fn unknown_if_pinned(
    pinned: Pinned,
    images: Result<Images, Transient>,
) -> Result<Images, Transient> {
    let unknown = |which: &str, e: &dyn std::fmt::Display| {
        Transient(format!(
            "readiness unknown: {which} is pinned in this node's CRI-O storage by a PinnedImageSet ({}), where the machine-config daemon takes it from, but streamd reads it from the registry, which did not serve it: {e}",
            facts::crio::PINNED_IMAGES
        ))
    };
    let which = match pinned {
        Pinned { os: true, .. } => "the OS image",
        Pinned {
            extensions: true, ..
        } => "the extensions image",
        Pinned {
            os: false,
            extensions: false,
        } => return images,
    };
    match images {
        Err(Transient(e)) => Err(unknown(which, &e)),
        Ok((_, Err(e), _)) if pinned.os => Err(unknown("the OS image", &e)),
        Ok((_, _, Some(Err(e)))) if pinned.extensions => Err(unknown("the extensions image", &e)),
        ok => ok,
    }
}

/// The `wanted` packages closed under Requires over the RPMs of the extensions image that fit
/// the target: built for `arch` (or noarch) and for the `target` major (or for none); the
/// requirements of `variant`'s own kernel are its own. None when nothing is wanted or the image
/// was not read. Off the async loop: thousands of headers.
async fn closure_of(
    extensions: &Option<Result<ExtensionsInfo, FactError>>,
    arch: &str,
    target: Option<u32>,
    wanted: &[String],
    variant: KernelVariant,
) -> Option<Closure> {
    let Some(Ok(info)) = extensions else {
        return None;
    };
    if wanted.is_empty() {
        return None;
    }
    let fitting: Vec<RpmHeader> = info
        .headers
        .iter()
        .filter(|h| h.arch == arch || h.arch == "noarch")
        .filter(|h| el_major(&h.release).is_none_or(|m| Some(m) == target))
        .cloned()
        .collect();
    Some(close(fitting, wanted, move |d| variant.owns_requirement(d)).await)
}

/// The names of the layered packages `needed` from the extensions image, and every package
/// wanted from it: the kernel's, then those.
fn wanted_packages(needed: &FromExtensions) -> (Vec<String>, Vec<String>) {
    let layered: Vec<String> = needed
        .all_layered()
        .map(|p| package_name(p).to_string())
        .collect();
    let mut wanted: Vec<String> = needed.kernel.iter().map(|p| p.to_string()).collect();
    wanted.extend(layered.iter().cloned());
    (layered, wanted)
}

/// The files of `extracted` that are `closure`'s (none without one).
fn closure_files(extracted: Vec<PathBuf>, closure: Option<&Closure>) -> Vec<PathBuf> {
    extracted
        .into_iter()
        .filter(|p| closure.is_some_and(|c| c.files().any(|f| Some(f) == file_name(p))))
        .collect()
}

/// The file name of `p`, where it is UTF-8.
fn file_name(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str())
}

/// What the staged deployment must look like, when the OS image was read and the target major
/// is known: the image's digest, that major, and the node's kernel variant and FIPS mode.
fn expectation(
    input: &Input,
    target: Option<u32>,
    running: KernelVariant,
) -> Option<crate::host::verify::Expectation> {
    match (&input.os_image, target) {
        (Ok(info), Some(major)) => Some(crate::host::verify::Expectation {
            image_digest: info.manifest_digest.clone(),
            target_major: major,
            kernel: running,
            fips: input.fips == crate::host::facts::Fips::Enabled,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pinned image the registry did not serve leaves readiness unknown (retried), whatever
    /// the registry said; an unpinned one is judged by the checks as before.
    #[test]
    fn a_pinned_image_the_registry_does_not_serve_is_unknown() {
        let pull = OsPull {
            auth_file: None,
            problem: None,
            policy: None,
            attempts: Vec::new(),
        };
        let not_served = || FactError::OsImage(Cause::new("manifest unknown"));
        let os = Pinned {
            os: true,
            extensions: false,
        };
        let e = unknown_if_pinned(os, Ok((pull.clone(), Err(not_served()), None)))
            .expect_err("unknown");
        assert!(
            e.0.starts_with("readiness unknown: the OS image is pinned")
                && e.0.contains("/etc/crio/crio.conf.d/50-pinned-images")
                && e.0.ends_with("manifest unknown"),
            "{e}"
        );
        let e = unknown_if_pinned(os, Err(Transient("connection refused".into())))
            .expect_err("unknown");
        assert!(e.0.ends_with("did not serve it: connection refused"), "{e}");
        let ext = Pinned {
            os: false,
            extensions: true,
        };
        let e = unknown_if_pinned(
            ext,
            Ok((
                pull.clone(),
                Err(not_served()),
                Some(Err(FactError::ExtensionsImage(InspectError::Unauthorized(
                    "q".into(),
                )))),
            )),
        )
        .expect_err("unknown");
        assert!(e.0.contains("the extensions image is pinned"), "{e}");
        let unpinned = unknown_if_pinned(Pinned::default(), Ok((pull, Err(not_served()), None)));
        assert!(matches!(unpinned, Ok((_, Err(_), None))));
    }

    #[test]
    fn readiness_reads_are_spread_by_node_and_kept_in_memory() {
        let image: ImageRef = format!("r.example/ext@sha256:{}", "a".repeat(64))
            .parse()
            .expect("image");
        let spread = Duration::from_secs(600);
        let key = |i: &ImageRef| {
            (
                i.to_string(),
                "x86_64".to_string(),
                vec!["usbguard".to_string()],
            )
        };
        let seen = |node: &str| {
            let r = ReadinessReads::new(node, spread);
            r.put(key(&image), ExtensionsInfo::default());
            r
        };
        let first = ReadinessReads::new("worker-0", spread);
        assert_eq!(
            first.delay(&image),
            Duration::ZERO,
            "the first read since start"
        );
        assert_eq!(first.get(&key(&image)), None);
        let delays: Vec<Duration> = (0..20)
            .map(|n| seen(&format!("worker-{n}")).delay(&image))
            .collect();
        assert!(delays.iter().all(|d| *d < spread), "{delays:?}");
        assert!(delays.iter().any(|d| *d != delays[0]), "{delays:?}");
        assert_eq!(
            seen("worker-0").delay(&image),
            delays[0],
            "the same share every time"
        );
        assert_eq!(
            seen("worker-0").get(&key(&image)),
            Some(ExtensionsInfo::default())
        );
        assert_eq!(
            ReadinessReads::default().delay(&image),
            Duration::ZERO,
            "no spread"
        );
    }

    #[test]
    fn the_registry_client_is_kept_while_the_pull_secret_is_unchanged() {
        let g = Gatherer {
            host: HostRoot::new("/nonexistent"),
            pull_secret: PathBuf::from("/nonexistent/pull-secret.json"),
            registries: Access::default(),
            runtime_dir: PathBuf::from("/nonexistent/run"),
            policy: Policy::default(),
            images: ImagePolicy::default(),
            inspector: Default::default(),
            in_use: InUse::default(),
            read: ReadinessReads::default(),
        };
        let cached = |g: &Gatherer| {
            g.inspector
                .lock()
                .map(|c| c.as_ref().map(|(s, _)| s.clone()))
                .unwrap_or_default()
        };
        let a = PullSecret::default();
        let b = PullSecret::parse(r#"{"auths":{"r.example":{"auth":"dTpw"}}}"#).expect("secret");
        g.inspector(&a).expect("client");
        assert_eq!(cached(&g), Some(a.clone()));
        g.inspector(&a).expect("client");
        assert_eq!(cached(&g), Some(a), "same secret: kept");
        g.inspector(&b).expect("client");
        assert_eq!(cached(&g), Some(b), "another secret: a new client");
    }
}
