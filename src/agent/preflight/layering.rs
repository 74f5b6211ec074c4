//! The check of what else rpm-ostree reads for a layered deployment: `LockLayering` in
//! `/etc/rpm-ostreed.conf` and the enabled repositories of the merge deployment's
//! `/etc/yum.repos.d` (coreos/rpm-ostree v2025.5: src/daemon/rpmostree-sysroot-upgrader.cxx
//! `rpmostree_sysroot_upgrader_prep_layering`, src/libpriv/rpmostree-core.cxx
//! `rpmostree_context_prepare`, which marks every enabled repository required). The
//! repositories are read by [`super::repos`] and probed by [`super::probe`].

use super::needs::{FromExtensions, provided};
use super::{CheckResult, Input, Mover, fail, pass, warn};
use crate::backend::{BackendKind, Deployment};
use crate::cluster::protocol::CheckId;

/// The daemon's configuration file.
pub const RPM_OSTREED_CONF: &str = "/etc/rpm-ostreed.conf";

/// The repository directory rpm-ostree reads in the merge deployment's `/etc`.
pub const YUM_REPOS_D: &str = "/etc/yum.repos.d";

/// A line of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The file (host path).
    pub file: String,
    /// Its line, from 1.
    pub line: usize,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Whether rpm-ostree can read an enabled repository's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// A source answered with a `repomd.xml` (or a local repository's is there).
    Present,
    /// No source could be read: the line of the first one, and why it failed.
    Unreachable {
        /// The line naming the source (its section's when it has none).
        at: Place,
        /// Why (one line, no credentials).
        why: String,
    },
    /// streamd cannot reach it as librepo would (client certificates, credentials, a scheme
    /// other than HTTP), or the move layers nothing: why.
    NotProbed(String),
}

/// An enabled repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    /// Its id (the section name).
    pub id: String,
    /// Where its section starts.
    pub at: Place,
    /// Whether its metadata can be read.
    pub reach: Reach,
}

/// What rpm-ostree reads for a layered deployment besides the packages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayeringConfig {
    /// Where `LockLayering=true` is set, if it is.
    pub lock_layering: Option<Place>,
    /// The enabled repositories, by file and line.
    pub repos: Vec<Repo>,
}

/// The line of `[Daemon]`'s `LockLayering` in `text` (`file`) when it is true, as GLib's key
/// file reads it: the last assignment wins, `true`/`1` are true.
pub fn lock_layering(file: &str, text: &str) -> Option<Place> {
    let mut group = "";
    let mut found = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(g) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            group = g;
            continue;
        }
        if let Some((k, v)) = line.split_once('=')
            && group == "Daemon"
            && k.trim() == "LockLayering"
        {
            found = matches!(v.trim(), "true" | "1").then(|| Place {
                file: file.to_string(),
                line: n + 1,
            });
        }
    }
    found
}

/// Whether streamd's move makes rpm-ostree read the repositories: a layered deployment (a
/// variant kernel or packages from the extensions image, or base removals the origin keeps)
/// staged by rpm-ostree. The machine-config daemon's move writes the repository it layers
/// from itself; the gatherer probes the repositories only when this holds.
pub fn reads_repositories(
    backend: BackendKind,
    mover: Mover,
    booted: &Deployment,
    needed: &FromExtensions,
) -> bool {
    backend == BackendKind::RpmOstree && mover == Mover::Streamd && layered(booted, needed)
}

/// Whether the move's deployment is layered (rpm-ostree assembles it from packages).
fn layered(booted: &Deployment, needed: &FromExtensions) -> bool {
    needed.needed() || !booted.requested_base_removals.is_empty()
}

/// `LockLayering=true` refuses every layered deployment; an enabled repository rpm-ostree
/// cannot read fails the transaction after the pull, one not probed is worth knowing.
pub(super) fn layering_config(i: &Input) -> CheckResult {
    let id = CheckId::LayeringConfig;
    if i.backend == BackendKind::Bootc || !layered(&i.booted, &provided(i)) {
        return pass(
            id,
            "not a layered deployment: rpm-ostree reads no repository",
        );
    }
    let cfg = match &i.layering {
        Ok(c) => c,
        Err(e) => return fail(id, format!("cannot read the layering configuration: {e}")),
    };
    if let Some(at) = &cfg.lock_layering {
        return fail(
            id,
            format!(
                "{at} sets LockLayering=true, so rpm-ostree refuses the layered deployment this move needs (\"Cannot operate; `LockLayering=true` in configuration.\"); remove it and run rpm-ostree reload first"
            ),
        );
    }
    // The machine-config daemon writes the repository it layers from itself.
    if i.mover == Mover::MachineConfigOperator {
        return pass(id, "LockLayering is not set");
    }
    let unreachable: Vec<String> = cfg
        .repos
        .iter()
        .filter_map(|r| match &r.reach {
            Reach::Unreachable { at, why } => Some(format!("{at} [{}]: {why}", r.id)),
            _ => None,
        })
        .collect();
    if !unreachable.is_empty() {
        return fail(
            id,
            format!(
                "rpm-ostree downloads the metadata of every enabled repository for a layered deployment and fails the transaction, after pulling the image, if one cannot be read: {}; disable it (enabled=0) or make it reachable",
                unreachable.join("; ")
            ),
        );
    }
    let unprobed: Vec<String> = cfg
        .repos
        .iter()
        .filter_map(|r| match &r.reach {
            Reach::NotProbed(why) => Some(format!("{} [{}]: {why}", r.at, r.id)),
            _ => None,
        })
        .collect();
    if !unprobed.is_empty() {
        return warn(
            id,
            format!(
                "rpm-ostree will download the metadata of these enabled repositories, which streamd could not probe, and fail the transaction if one is unreachable: {}",
                unprobed.join("; ")
            ),
        );
    }
    pass(
        id,
        "LockLayering is not set; every enabled repository answered",
    )
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    const CONF: &str = RPM_OSTREED_CONF;

    /// A real-time node carrying its kernel as overrides, with `cfg`.
    fn layered_with(cfg: LayeringConfig) -> Input {
        let mut c = base();
        layer_kernel(&mut c, KernelVariant::Realtime);
        c.extensions = Some(Ok(rt_ext(10)));
        c.layering = Ok(cfg);
        c
    }

    fn repo(line: usize, reach: Reach) -> Repo {
        Repo {
            id: "coreos-extensions".into(),
            at: Place {
                file: "/etc/yum.repos.d/coreos-extensions.repo".into(),
                line,
            },
            reach,
        }
    }

    /// (case, configuration, layered, outcome, a fragment of the message).
    fn rows() -> Vec<(&'static str, LayeringConfig, bool, Outcome, &'static str)> {
        let locked = LayeringConfig {
            lock_layering: Some(Place {
                file: CONF.into(),
                line: 3,
            }),
            repos: Vec::new(),
        };
        let gone = LayeringConfig {
            repos: vec![repo(
                1,
                Reach::Unreachable {
                    at: Place {
                        file: "/etc/yum.repos.d/coreos-extensions.repo".into(),
                        line: 3,
                    },
                    why: "file:///var/mnt/ext has no repodata/repomd.xml".into(),
                },
            )],
            ..LayeringConfig::default()
        };
        let unprobed = LayeringConfig {
            repos: vec![repo(
                7,
                Reach::NotProbed("it sets sslclientcert, which streamd does not use".into()),
            )],
            ..LayeringConfig::default()
        };
        vec![
            (
                "nothing set",
                LayeringConfig::default(),
                true,
                Outcome::Pass,
                "not set",
            ),
            (
                "locked, layered",
                locked.clone(),
                true,
                Outcome::Fail,
                "/etc/rpm-ostreed.conf:3 sets LockLayering=true",
            ),
            (
                "locked, not layered",
                locked,
                false,
                Outcome::Pass,
                "not a layered deployment",
            ),
            (
                "a leftover local repository",
                gone.clone(),
                true,
                Outcome::Fail,
                "/etc/yum.repos.d/coreos-extensions.repo:3 [coreos-extensions]: file:///var/mnt/ext has no repodata/repomd.xml",
            ),
            (
                "a leftover repository, not layered",
                gone,
                false,
                Outcome::Pass,
                "not a layered deployment",
            ),
            (
                "a repository streamd cannot probe",
                unprobed,
                true,
                Outcome::Warn,
                "/etc/yum.repos.d/coreos-extensions.repo:7 [coreos-extensions]: it sets sslclientcert",
            ),
            (
                "a readable repository",
                LayeringConfig {
                    repos: vec![repo(1, Reach::Present)],
                    ..LayeringConfig::default()
                },
                true,
                Outcome::Pass,
                "every enabled repository answered",
            ),
        ]
    }

    /// Every row judges as it says.
    #[test]
    fn layering_config_by_table() {
        for (case, cfg, is_layered, outcome, fragment) in rows() {
            let c = if is_layered {
                layered_with(cfg)
            } else {
                Input {
                    layering: Ok(cfg),
                    ..base()
                }
            };
            let r = run(&c);
            let got = result(&r, "layering-config");
            assert_eq!(got.result, outcome, "{case}: {}", got.message);
            assert!(got.message.contains(fragment), "{case}: {}", got.message);
        }
    }

    #[test]
    fn the_files_are_read_as_glib_and_dnf_read_them() {
        let conf = "[Daemon]\n#LockLayering=false\nLockLayering=true\n";
        assert_eq!(
            lock_layering(CONF, conf),
            Some(Place {
                file: CONF.into(),
                line: 3
            })
        );
        assert_eq!(
            lock_layering(CONF, "[Daemon]\nLockLayering=true\nLockLayering=false\n"),
            None
        );
        assert_eq!(
            lock_layering(CONF, "[Experimental]\nLockLayering=true\n"),
            None
        );
    }
}
