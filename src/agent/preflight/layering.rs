//! The check of what else rpm-ostree reads for a layered deployment: `LockLayering` in
//! `/etc/rpm-ostreed.conf` and the enabled repositories of the merge deployment's
//! `/etc/yum.repos.d` (coreos/rpm-ostree v2025.5: src/daemon/rpmostree-sysroot-upgrader.cxx
//! `rpmostree_sysroot_upgrader_prep_layering`, src/libpriv/rpmostree-core.cxx
//! `rpmostree_context_prepare`, which marks every enabled repository required).

use super::needs::provided;
use super::{CheckResult, Input, Mover, fail, pass, warn};
use crate::backend::BackendKind;
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
    /// A local repository whose metadata is there.
    Present,
    /// It cannot be read; why.
    Unreachable(String),
    /// Over the network: not probed.
    Remote(String),
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

/// The enabled repositories of a `.repo` file: each section, its line and its `baseurl`s
/// (`mirrorlist`/`metalink` as a remote source); dnf enables a section without `enabled`.
pub fn enabled_repos(file: &str, text: &str) -> Vec<(String, Place, Vec<String>)> {
    struct Section {
        id: String,
        line: usize,
        enabled: bool,
        urls: Vec<String>,
    }
    let mut sections: Vec<Section> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(id) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push(Section {
                id: id.trim().to_string(),
                line: n + 1,
                enabled: true,
                urls: Vec::new(),
            });
            continue;
        }
        let (Some(s), Some((k, v))) = (sections.last_mut(), line.split_once('=')) else {
            continue;
        };
        match k.trim() {
            "enabled" => {
                s.enabled = !matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "0" | "false" | "no" | "off"
                );
            }
            "baseurl" => s.urls.extend(
                v.split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|u| !u.is_empty())
                    .map(str::to_string),
            ),
            "mirrorlist" | "metalink" => s.urls.push(v.trim().to_string()),
            _ => {}
        }
    }
    sections
        .into_iter()
        .filter(|s| s.enabled && s.id != "main")
        .map(|s| {
            let at = Place {
                file: file.to_string(),
                line: s.line,
            };
            (s.id, at, s.urls)
        })
        .collect()
}

/// Whether a repository with sources `urls` can be read, `local(path)` saying whether a local
/// repository's metadata (`repodata/repomd.xml` below `path`) exists.
pub fn reach(urls: &[String], local: impl Fn(&str) -> bool) -> Reach {
    let Some(first) = urls.first() else {
        return Reach::Unreachable("no baseurl, mirrorlist or metalink".into());
    };
    if let Some(remote) = urls.iter().find(|u| !u.starts_with("file://")) {
        return Reach::Remote(remote.clone());
    }
    match urls
        .iter()
        .filter_map(|u| u.strip_prefix("file://"))
        .find(|p| local(p))
    {
        Some(_) => Reach::Present,
        None => Reach::Unreachable(format!("{first} has no repodata/repomd.xml")),
    }
}

/// Whether the move's deployment is layered (rpm-ostree assembles it from packages): a
/// variant kernel or packages from the extensions image, or base removals the origin keeps.
fn layered(i: &Input) -> bool {
    provided(i).needed() || !i.booted.requested_base_removals.is_empty()
}

/// `LockLayering=true` refuses every layered deployment; an enabled repository rpm-ostree
/// cannot read fails the transaction after the pull, one not probed is worth knowing.
pub(super) fn layering_config(i: &Input) -> CheckResult {
    let id = CheckId::LayeringConfig;
    if i.backend == BackendKind::Bootc || !layered(i) {
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
            Reach::Unreachable(why) => Some(format!("{} [{}]: {why}", r.at, r.id)),
            _ => None,
        })
        .collect();
    if !unreachable.is_empty() {
        return fail(
            id,
            format!(
                "rpm-ostree reads every enabled repository for a layered deployment and fails the transaction if one cannot be read: {}; disable them (enabled=0) or make them readable",
                unreachable.join("; ")
            ),
        );
    }
    let remote: Vec<String> = cfg
        .repos
        .iter()
        .filter_map(|r| match &r.reach {
            Reach::Remote(url) => Some(format!("{} [{}] ({url})", r.at, r.id)),
            _ => None,
        })
        .collect();
    if !remote.is_empty() {
        return warn(
            id,
            format!(
                "rpm-ostree will download the metadata of these enabled repositories, which streamd does not probe, and fail the transaction if one is unreachable: {}",
                remote.join("; ")
            ),
        );
    }
    pass(
        id,
        "LockLayering is not set; every enabled repository is readable",
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
                Reach::Unreachable("file:///var/mnt/ext has no repodata/repomd.xml".into()),
            )],
            ..LayeringConfig::default()
        };
        let remote = LayeringConfig {
            repos: vec![repo(7, Reach::Remote("https://r.example/el10".into()))],
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
                "/etc/yum.repos.d/coreos-extensions.repo:1 [coreos-extensions]: file:///var/mnt/ext has no repodata/repomd.xml",
            ),
            (
                "a leftover repository, not layered",
                gone,
                false,
                Outcome::Pass,
                "not a layered deployment",
            ),
            (
                "a remote repository",
                remote,
                true,
                Outcome::Warn,
                "/etc/yum.repos.d/coreos-extensions.repo:7 [coreos-extensions] (https://r.example/el10)",
            ),
            (
                "a readable local repository",
                LayeringConfig {
                    repos: vec![repo(1, Reach::Present)],
                    ..LayeringConfig::default()
                },
                true,
                Outcome::Pass,
                "every enabled repository is readable",
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
        let repos = "[main]\n\n[a]\nbaseurl=file:///srv/a\n[b]\nenabled=0\nbaseurl=https://b\n[c]\nmirrorlist=https://m\n";
        let got = enabled_repos("/etc/yum.repos.d/x.repo", repos);
        let ids: Vec<(&str, usize)> = got
            .iter()
            .map(|(id, at, _)| (id.as_str(), at.line))
            .collect();
        assert_eq!(ids, [("a", 3), ("c", 8)]);
        assert_eq!(reach(&got[0].2, |p| p == "/srv/a"), Reach::Present);
        assert!(matches!(reach(&got[0].2, |_| false), Reach::Unreachable(_)));
        assert_eq!(
            reach(&got[1].2, |_| true),
            Reach::Remote("https://m".into())
        );
        assert!(matches!(reach(&[], |_| true), Reach::Unreachable(_)));
    }
}
