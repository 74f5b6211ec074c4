//! The depsolve of local packages, as rpm-ostree runs it on a node without enabled
//! repositories: each local RPM is an `@commandline` package added to a sack holding the new
//! base's packages (less the base removals) and the other local packages
//! (coreos/rpm-ostree:src/daemon/rpmostree-sysroot-upgrader.cxx `add_local_pkgset_to_sack`,
//! headers read back from the pkgcache with `rpmostree_pkgcache_find_pkg_header`), and every
//! Requires must be met there. A failure is libdnf's "Could not depsolve transaction; N
//! problem(s) detected:" with libsolv's "nothing provides … needed by … from @commandline"
//! (as rpm-ostree reports it, e.g. crc-org/snc#602, coreos/rpm-ostree#5195).
//!
//! Modelled: versioned Requires against Provides (rpm's range overlap, rpmvercmp via
//! `rpm-version`), the base packages' own `name = evr` and the few files local packages
//! require by path, and of the base packages' own Requires those of the `kernel` meta-package
//! (kernel.spec: `kernel-core-uname-r`, `kernel-modules-uname-r`, `kernel-modules-core-uname-r`
//! `= %{KVERREL}`), so a removal of `kernel-core` that keeps `kernel` fails as libsolv words it
//! for an installed package ("package kernel-… from @System requires …, but none of the
//! providers can be installed", seen on rpm-ostree v2025.5 run beside the project). Not
//! modelled: rich (`(… if …)`) dependencies, conflicts and obsoletes, and the packages of a
//! fixture's booted deployment, whose headers the fake never read (they were depsolved when
//! they were layered). libsolv may group problems differently;
//! here each local package with unmet Requires is one problem.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::model::Layering;
use crate::fixtures::images::TestImage;
use crate::fixtures::packages::{self, Nevra};

/// `RPMSENSE_LESS`.
const LESS: u32 = 1 << 1;
/// `RPMSENSE_GREATER`.
const GREATER: u32 = 1 << 2;
/// `RPMSENSE_EQUAL`.
const EQUAL: u32 = 1 << 3;

/// One Provides or Requires entry, as the RPM header stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dep {
    pub(crate) name: String,
    pub(crate) flags: u32,
    pub(crate) version: String,
}

impl std::fmt::Display for Dep {
    /// As libsolv prints a dependency: `name op evr`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = match self.flags & (LESS | GREATER | EQUAL) {
            LESS => "<",
            x if x == LESS | EQUAL => "<=",
            EQUAL => "=",
            x if x == GREATER | EQUAL => ">=",
            GREATER => ">",
            _ => return f.write_str(&self.name),
        };
        if self.version.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{} {op} {}", self.name, self.version)
        }
    }
}

impl Dep {
    fn equal(name: &str, evr: String) -> Self {
        Dep {
            name: name.to_string(),
            flags: EQUAL,
            version: evr,
        }
    }

    /// Whether provide `self` meets requirement `req` (rpm's `rpmdsCompare`: same name and
    /// overlapping ranges; without a release on either side only versions are compared).
    fn meets(&self, req: &Dep) -> bool {
        if self.name != req.name {
            return false;
        }
        let (p, r) = (
            self.flags & (LESS | GREATER | EQUAL),
            req.flags & (LESS | GREATER | EQUAL),
        );
        if p == 0 || r == 0 || self.version.is_empty() || req.version.is_empty() {
            return true;
        }
        let (pe, pv, pr) = rpm_version::Evr::parse_values(&self.version);
        let (re, rv, rr) = rpm_version::Evr::parse_values(&req.version);
        let (pr, rr) = if pr.is_empty() || rr.is_empty() {
            ("", "")
        } else {
            (pr, rr)
        };
        let ord = rpm_version::Evr::new(pe, pv, pr).cmp(&rpm_version::Evr::new(re, rv, rr));
        match ord {
            std::cmp::Ordering::Less => p & GREATER != 0 || r & LESS != 0,
            std::cmp::Ordering::Greater => p & LESS != 0 || r & GREATER != 0,
            std::cmp::Ordering::Equal => {
                (p & EQUAL != 0 && r & EQUAL != 0)
                    || (p & LESS != 0 && r & LESS != 0)
                    || (p & GREATER != 0 && r & GREATER != 0)
            }
        }
    }
}

/// A package as the depsolve sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Package {
    pub(crate) nevra: Nevra,
    pub(crate) provides: Vec<Dep>,
    pub(crate) requires: Vec<Dep>,
}

impl Package {
    fn evr(n: &Nevra) -> String {
        if n.epoch == 0 {
            format!("{}-{}", n.version, n.release)
        } else {
            format!("{}:{}-{}", n.epoch, n.version, n.release)
        }
    }

    fn provides(&self, req: &Dep) -> bool {
        Dep::equal(&self.nevra.name, Self::evr(&self.nevra)).meets(req)
            || self.provides.iter().any(|p| p.meets(req))
    }
}

/// The pkgcache: the header of every local package imported, by NEVRA. Shared by every fake
/// daemon of the process; a NEVRA always names the same testbed-built RPM.
static PKGCACHE: Mutex<BTreeMap<String, Package>> = Mutex::new(BTreeMap::new());

/// Records an imported local package's header.
pub(crate) fn import(package: Package) {
    PKGCACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(package.nevra.to_string(), package);
}

/// Paths the base packages own that packages require by file (libsolv resolves them from the
/// base rpmdb's file lists): the shell scripts' interpreter and the kernel's `%post` tool.
const BASE_FILES: [(&str, &str); 4] = [
    ("/bin/sh", "bash"),
    ("/usr/bin/sh", "bash"),
    ("/bin/bash", "bash"),
    ("/usr/bin/kernel-install", "systemd"),
];

/// The default-kernel subpackages whose `<name>-uname-r` the `kernel` meta-package requires.
const KERNEL_META_REQUIRES: [&str; 3] = ["kernel-core", "kernel-modules", "kernel-modules-core"];

/// The base packages of `target` for `arch` left after the layering's removals.
fn base(l: &Layering, target: &TestImage, arch: &str) -> Vec<Package> {
    packages::base_packages(target, arch)
        .into_iter()
        .filter(|n| {
            !l.requested_base_removals
                .iter()
                .any(|r| *r == n.name || *r == n.to_string())
        })
        .map(|n| {
            let kver = format!("{}-{}.{}", n.version, n.release, n.arch);
            let uname = |name: &str| Dep {
                name: format!("{name}-uname-r"),
                flags: EQUAL,
                version: kver.clone(),
            };
            let mut provides: Vec<Dep> = BASE_FILES
                .iter()
                .filter(|(_, owner)| *owner == n.name)
                .map(|(file, _)| Dep {
                    name: file.to_string(),
                    flags: 0,
                    version: String::new(),
                })
                .collect();
            if KERNEL_META_REQUIRES.contains(&n.name.as_str()) {
                provides.push(uname(&n.name));
            }
            let requires = if n.name == "kernel" {
                KERNEL_META_REQUIRES.iter().map(|s| uname(s)).collect()
            } else {
                Vec::new()
            };
            Package {
                provides,
                requires,
                nevra: n,
            }
        })
        .collect()
}

/// Depsolves the layering's local packages against `target`'s base (less its removals) plus
/// themselves, and the kept base packages' own Requires; `Err` is rpm-ostree's message
/// (`arch`: the host's).
pub(crate) fn solve(l: &Layering, target: &TestImage, arch: &str) -> Result<(), String> {
    let local: Vec<Package> = {
        let cache = PKGCACHE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        l.requested_local_packages
            .iter()
            .chain(&l.requested_base_local_replacements)
            .filter_map(|n| cache.get(n).cloned())
            .collect()
    };
    let kept = base(l, target, arch);
    let mut sack = kept.clone();
    sack.extend(local.iter().cloned());
    let unmet = |pkg: &Package| -> Vec<Dep> {
        pkg.requires
            .iter()
            // Rich dependencies are not modelled (see the module documentation).
            .filter(|r| !r.name.starts_with('('))
            .filter(|r| !sack.iter().any(|p| p.provides(r)))
            .cloned()
            .collect()
    };
    // An installed package whose Requires the removals broke: libsolv's "none of the providers
    // can be installed" (one problem per requirement).
    let mut problems: Vec<(String, Vec<String>)> = kept
        .iter()
        .flat_map(|pkg| {
            unmet(pkg).into_iter().map(|r| {
                (
                    format!(
                        "package {} from @System requires {r}, but none of the providers can be installed",
                        pkg.nevra
                    ),
                    vec!["conflicting requests".to_string()],
                )
            })
        })
        .collect();
    problems.extend(local.iter().filter_map(|pkg| {
        let rules: Vec<String> = unmet(pkg)
            .iter()
            .map(|r| {
                format!(
                    "nothing provides {r} needed by {} from @commandline",
                    pkg.nevra
                )
            })
            .collect();
        (!rules.is_empty()).then(|| ("conflicting requests".to_string(), rules))
    }));
    if problems.is_empty() {
        return Ok(());
    }
    Err(problems_message(&problems))
}

/// libdnf's `dnf_goal_depsolve` text for `problems` (each libsolv's problem and its rules).
fn problems_message(problems: &[(String, Vec<String>)]) -> String {
    let n = problems.len();
    let mut out = format!(
        "Could not depsolve transaction; {n} problem{} detected:",
        if n == 1 { "" } else { "s" }
    );
    for (i, (problem, rules)) in problems.iter().enumerate() {
        let label = if n == 1 {
            "Problem".to_string()
        } else {
            format!("Problem {}", i + 1)
        };
        out.push_str(&format!("\n {label}: {problem}"));
        for rule in rules {
            out.push_str(&format!("\n  - {rule}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::images::{DEFAULT_REGISTRY, catalog};

    fn dep(name: &str, flags: u32, version: &str) -> Dep {
        Dep {
            name: name.into(),
            flags,
            version: version.into(),
        }
    }

    /// el10 kernel-rt subpackages with kernel.spec's inter-package dependencies.
    fn rt(kver: &str, release: &str, subs: &[&str]) -> Vec<Package> {
        let uname = |s: &str| dep(&format!("kernel-rt-{s}-uname-r"), EQUAL, kver);
        subs.iter()
            .map(|sub| {
                let nevra = Nevra::parse(&format!("kernel-rt-{sub}-6.12.0-{release}.x86_64"))
                    .expect("nevra");
                let (provides, requires) = match *sub {
                    "core" => (
                        vec![uname("core"), dep("kernel-uname-r", EQUAL, kver)],
                        vec![
                            uname("modules-core"),
                            dep("systemd", GREATER | EQUAL, "203-2"),
                            dep("/usr/bin/kernel-install", 0, ""),
                        ],
                    ),
                    "modules-core" => (
                        vec![uname("modules-core")],
                        vec![dep("kernel-uname-r", EQUAL, kver)],
                    ),
                    _ => (
                        vec![uname(sub)],
                        vec![dep("kernel-uname-r", EQUAL, kver), uname("modules-core")],
                    ),
                };
                Package {
                    nevra,
                    provides,
                    requires,
                }
            })
            .collect()
    }

    fn layering(pkgs: &[Package]) -> Layering {
        for p in pkgs {
            import(p.clone());
        }
        Layering {
            requested_local_packages: pkgs.iter().map(|p| p.nevra.to_string()).collect(),
            requested_base_removals: crate::fixtures::DEFAULT_KERNEL_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..Layering::default()
        }
    }

    #[test]
    fn local_packages_depsolve_against_the_base_and_each_other() {
        let images = catalog(DEFAULT_REGISTRY);
        let el10 = &images[1];
        let (kver, release) = ("6.12.0-124.8.1.el10_1.x86_64+rt", "124.8.1.el10_1");
        let full = rt(kver, release, &["core", "modules", "modules-core"]);
        assert_eq!(solve(&layering(&full), el10, "x86_64"), Ok(()));

        // Another build's modules-core does not provide this build's uname-r.
        let mut stale = rt(kver, release, &["core", "modules"]);
        stale.extend(rt("6.12.0-1.el10.x86_64+rt", "1.el10", &["modules-core"]));
        let err = solve(&layering(&stale), el10, "x86_64").expect_err("stale modules-core");
        assert_eq!(
            err,
            "Could not depsolve transaction; 3 problems detected:\n \
             Problem 1: conflicting requests\n  \
             - nothing provides kernel-rt-modules-core-uname-r = 6.12.0-124.8.1.el10_1.x86_64+rt needed by kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64 from @commandline\n \
             Problem 2: conflicting requests\n  \
             - nothing provides kernel-rt-modules-core-uname-r = 6.12.0-124.8.1.el10_1.x86_64+rt needed by kernel-rt-modules-6.12.0-124.8.1.el10_1.x86_64 from @commandline\n \
             Problem 3: conflicting requests\n  \
             - nothing provides kernel-uname-r = 6.12.0-1.el10.x86_64+rt needed by kernel-rt-modules-core-6.12.0-1.el10.x86_64 from @commandline"
        );

        let missing = rt(kver, release, &["core"]);
        let err = solve(&layering(&missing), el10, "x86_64").expect_err("no modules-core");
        assert!(
            err.starts_with("Could not depsolve transaction; 1 problem detected:\n Problem: conflicting requests\n  - nothing provides kernel-rt-modules-core-uname-r"),
            "{err}"
        );
    }

    #[test]
    fn the_kernel_meta_package_kept_without_kernel_core_fails_as_libsolv_says() {
        let images = catalog(DEFAULT_REGISTRY);
        let el10 = &images[1];
        let core = packages::base_packages(el10, "x86_64")
            .into_iter()
            .find(|n| n.name == "kernel-core")
            .expect("kernel-core in the base");
        let kver = format!("{}-{}.{}", core.version, core.release, core.arch);
        let mut l = Layering {
            requested_base_removals: vec!["kernel-core".into()],
            ..Layering::default()
        };
        // The frame rpm-ostree v2025.5 printed for `override reset kernel` on a realtime host
        // (its stub `kernel` required `kernel-core = EVR`; RHEL's requires the `-uname-r`).
        assert_eq!(
            solve(&l, el10, "x86_64"),
            Err(format!(
                "Could not depsolve transaction; 1 problem detected:\n \
                 Problem: package kernel-{}-{}.x86_64 from @System requires kernel-core-uname-r = {kver}, but none of the providers can be installed\n  \
                 - conflicting requests",
                core.version, core.release
            ))
        );
        // Removing the meta-package too (the machine-config daemon's five) is solvable.
        l.requested_base_removals = crate::fixtures::DEFAULT_KERNEL_PACKAGES
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(solve(&l, el10, "x86_64"), Ok(()));
    }

    #[test]
    fn removed_base_packages_provide_nothing_and_files_come_from_the_base() {
        let images = catalog(DEFAULT_REGISTRY);
        let el10 = &images[1];
        let needs = |req: Dep| Package {
            nevra: Nevra::parse("x-1-1.el10.x86_64").expect("nevra"),
            provides: Vec::new(),
            requires: vec![req],
        };
        let pkg = needs(dep("kernel-core", 0, ""));
        let mut l = layering(std::slice::from_ref(&pkg));
        assert!(solve(&l, el10, "x86_64").is_err(), "kernel-core is removed");
        l.requested_base_removals.clear();
        assert_eq!(
            solve(&l, el10, "x86_64"),
            Ok(()),
            "kept: the base provides it"
        );
        let sh = needs(dep("/bin/sh", 0, ""));
        assert_eq!(solve(&layering(&[sh]), el10, "x86_64"), Ok(()));
        let newer = needs(dep("systemd", GREATER | EQUAL, "999"));
        let err = solve(&layering(&[newer]), el10, "x86_64").expect_err("too old");
        assert!(
            err.contains(
                "nothing provides systemd >= 999 needed by x-1-1.el10.x86_64 from @commandline"
            ),
            "{err}"
        );
    }
}
