//! RPM names: a package name or a NEVRA (`name-version-release.arch`), as rpm-ostree reports
//! layered packages and as extensions images name their files; their headers (src/image/rpm/header.rs);
//! what they need of the rpm that reads them (src/image/rpm/reader.rs); and the dependency closure
//! over them.

mod header;
mod reader;

pub use header::{HEADER_LIMITS, HeaderBudget, HeaderError, HeaderLimits};
#[cfg(test)]
pub(crate) use reader::el10_rt_core;
pub use reader::{ReaderNeeds, RpmRelease, Unreadable, unreadable};

use std::collections::{HashMap, HashSet};

/// Whether `spec` (a name or a NEVRA) names package `name`.
pub fn names_package(spec: &str, name: &str) -> bool {
    match spec.strip_prefix(name) {
        Some("") => true,
        // NEVRA: name-version-release.arch. Neither version nor release holds a '-', so what
        // follows the name has exactly one, and the version starts with a digit (or an epoch);
        // `kernel-64k-core-…` therefore does not name `kernel`.
        Some(rest) => rest.strip_prefix('-').is_some_and(|vr| {
            vr.matches('-').count() == 1 && vr.starts_with(|c: char| c.is_ascii_digit())
        }),
        None => false,
    }
}

/// The package name of a name-or-NEVRA (`name-version-release.arch`).
pub fn package_name(spec: &str) -> &str {
    let mut parts = spec.rsplitn(3, '-');
    match (parts.next(), parts.next(), parts.next()) {
        // A NEVRA's release carries the arch after a dot and its version starts with a digit;
        // a plain name such as `kernel-64k-core` has neither.
        (Some(release), Some(version), Some(name))
            if release.contains('.') && version.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            name
        }
        _ => spec,
    }
}

/// The `el<N>` major of a kernel release or NEVRA (`…el10_1.x86_64` → 10), also where the dist
/// tag carries a product suffix of letters (Fast Datapath's `el9fdp`, `el10fdp`).
pub fn el_major(release: &str) -> Option<u32> {
    release.split(['.', '-', '_', '+']).find_map(|part| {
        let tag = part.strip_prefix("el")?;
        let digits = tag.trim_end_matches(|c: char| c.is_ascii_lowercase());
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse().ok())
            .flatten()
    })
}

/// How a versioned dependency compares (`RPMSENSE_LESS|GREATER|EQUAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `=`
    Eq,
    /// `>=`
    Ge,
    /// `>`
    Gt,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Eq => "=",
            Op::Ge => ">=",
            Op::Gt => ">",
        }
    }
}

/// One Requires or Provides entry of an RPM header.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Dep {
    /// Capability name (`kernel-rt-modules-core-uname-r`, `/bin/sh`, `libc.so.6()(64bit)`).
    pub name: String,
    /// Comparison and `[epoch:]version[-release]`, when versioned.
    pub version: Option<(Op, String)>,
}

impl std::fmt::Display for Dep {
    /// As rpm and libsolv print it: `name op evr`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some((op, evr)) => write!(f, "{} {} {evr}", self.name, op.as_str()),
            None => f.write_str(&self.name),
        }
    }
}

impl Dep {
    /// An unversioned dependency.
    pub fn any(name: impl Into<String>) -> Self {
        Dep {
            name: name.into(),
            version: None,
        }
    }

    /// A versioned dependency.
    pub fn versioned(name: impl Into<String>, op: Op, evr: impl Into<String>) -> Self {
        Dep {
            name: name.into(),
            version: Some((op, evr.into())),
        }
    }

    /// Whether the provide `self` satisfies the requirement `req`, as rpm's `rpmdsCompare`
    /// decides: same name, and the ranges overlap; a side without a release compares
    /// versions only.
    pub fn satisfies(&self, req: &Dep) -> bool {
        if self.name != req.name {
            return false;
        }
        let (Some((pop, pevr)), Some((rop, revr))) = (&self.version, &req.version) else {
            // An unversioned side matches any version of the other.
            return true;
        };
        let parse = |evr: &str| {
            let (e, v, r) = rpm_version::Evr::parse_values(evr);
            (e.to_string(), v.to_string(), r.to_string())
        };
        let (pe, pv, mut pr) = parse(pevr);
        let (re, rv, mut rr) = parse(revr);
        if pr.is_empty() || rr.is_empty() {
            pr.clear();
            rr.clear();
        }
        let ord = rpm_version::Evr::new(pe.as_str(), pv.as_str(), pr.as_str()).cmp(
            &rpm_version::Evr::new(re.as_str(), rv.as_str(), rr.as_str()),
        );
        use std::cmp::Ordering::{Equal, Greater, Less};
        let low = |op: Op| matches!(op, Op::Lt | Op::Le);
        let high = |op: Op| matches!(op, Op::Gt | Op::Ge);
        let eq = |op: Op| matches!(op, Op::Le | Op::Eq | Op::Ge);
        match ord {
            // provide < require: overlap if the provide reaches up or the require reaches down.
            Less => high(*pop) || low(*rop),
            Greater => low(*pop) || high(*rop),
            Equal => {
                (eq(*pop) && eq(*rop)) || (low(*pop) && low(*rop)) || (high(*pop) && high(*rop))
            }
        }
    }
}

/// What the closure needs from one RPM: identity, Provides and Requires.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RpmHeader {
    /// The file's name in the image (`kernel-rt-core-….x86_64.rpm`).
    pub file: String,
    /// `%{NAME}`.
    pub name: String,
    /// `%{EPOCH}` (0 when absent).
    pub epoch: u32,
    /// `%{VERSION}`.
    pub version: String,
    /// `%{RELEASE}`.
    pub release: String,
    /// `%{ARCH}`.
    pub arch: String,
    /// Provides, including the package's own `name = [epoch:]version-release`.
    pub provides: Vec<Dep>,
    /// Requires, but for the `rpmlib(…)` ones, which are in `needs`.
    pub requires: Vec<Dep>,
    /// What it needs of the rpm that reads it (src/image/rpm/reader.rs). Required in a
    /// recorded extraction (src/image/extensions.rs): a record from before it was read fails
    /// to parse, and the image is extracted again rather than judged without it.
    pub needs: ReaderNeeds,
}

impl RpmHeader {
    /// `name-[epoch:]version-release.arch`, as rpm-ostree prints a package.
    pub fn nevra(&self) -> String {
        let epoch = if self.epoch == 0 {
            String::new()
        } else {
            format!("{}:", self.epoch)
        };
        format!(
            "{}-{epoch}{}-{}.{}",
            self.name, self.version, self.release, self.arch
        )
    }

    /// `[epoch:]version-release`.
    pub fn evr(&self) -> String {
        if self.epoch == 0 {
            format!("{}-{}", self.version, self.release)
        } else {
            format!("{}:{}-{}", self.epoch, self.version, self.release)
        }
    }

    /// Reads the header at the start of `reader` (an RPM file or a stream of one), leaving
    /// the payload unread, within what is left of `budget` (src/image/rpm/header.rs). `file` is the
    /// name recorded for it.
    pub fn read(
        reader: impl std::io::Read,
        file: &str,
        budget: &mut HeaderBudget,
    ) -> Result<Self, HeaderError> {
        header::read(reader, file, budget)
    }

    /// Reads the header of the RPM file at `path`.
    pub fn read_file(
        path: &std::path::Path,
        budget: &mut HeaderBudget,
    ) -> Result<Self, HeaderError> {
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        Self::read(std::fs::File::open(path)?, &file, budget)
    }
}

/// A requirement of a chosen package that nothing chosen or offered provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The requiring package's NEVRA.
    pub package: String,
    /// The requirement.
    pub requirement: Dep,
}

impl std::fmt::Display for Unresolved {
    /// libsolv's wording: `<requirement> needed by <package>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} needed by {}", self.requirement, self.package)
    }
}

/// A package set closed under Requires over the offered RPMs (see [`close`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Closure {
    /// The chosen packages: the wanted ones, then their providers in the order needed.
    pub packages: Vec<RpmHeader>,
    /// Wanted package names that no offered RPM has.
    pub absent: Vec<String>,
    /// Requirements nothing offered provides that [`close`]'s `own` predicate claims: no base
    /// can provide them, so the set cannot be installed.
    pub missing: Vec<Unresolved>,
    /// Requirements nothing offered provides, left to the target's base image.
    pub from_base: Vec<Unresolved>,
}

impl Closure {
    /// The chosen packages' file names.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.packages.iter().map(|p| p.file.as_str())
    }
}

/// Closes the `wanted` packages (names) under Requires over `offered` (the extensions RPMs
/// that fit the target: its architecture or noarch, its EL major), the way rpm-ostree's
/// depsolve sees local packages: each requirement must be met by a chosen package, else a
/// provider is taken from `offered` (the highest EVR; by name on a tie), else it is left to
/// the base, unless `own(requirement)` says no base can have it (the variant kernel's own
/// packages), which makes it missing. File and rich (`(… if …)`) requirements are always left
/// to the base: no file lists are read and their conditions are about the base.
///
/// Runs on a blocking thread: an image may offer thousands of headers with tens of thousands
/// of Provides, and the async loop keeps serving the node watch and D-Bus meanwhile.
pub async fn close(
    offered: Vec<RpmHeader>,
    wanted: &[String],
    own: impl Fn(&Dep) -> bool + Send + 'static,
) -> Closure {
    let owned = wanted.to_vec();
    match tokio::task::spawn_blocking(move || resolve(&offered, &owned, &own)).await {
        Ok(closure) => closure,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled, which happens only as the runtime shuts down: nothing counts as found.
        Err(_) => Closure {
            absent: wanted.to_vec(),
            ..Closure::default()
        },
    }
}

/// The chosen packages (indices into the offered ones), in the order chosen, with what they
/// provide by capability name.
struct Chosen<'a> {
    order: Vec<usize>,
    names: HashSet<&'a str>,
    by_capability: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Chosen<'a> {
    /// Chooses offered package `i`, named `name`, whose Provides are `provides`.
    fn add(&mut self, i: usize, name: &'a str, provides: impl Iterator<Item = &'a Dep>) {
        self.order.push(i);
        self.names.insert(name);
        for p in provides {
            self.by_capability
                .entry(p.name.as_str())
                .or_default()
                .push(i);
        }
    }
}

/// The highest EVR of the candidates (by name on a tie; the last of equal ones).
fn best(offered: &[RpmHeader], candidates: impl Iterator<Item = usize>) -> Option<usize> {
    let evr = |h: &RpmHeader| {
        rpm_version::Evr::new(h.epoch.to_string(), h.version.clone(), h.release.clone())
    };
    candidates.max_by(|&a, &b| {
        let (a, b) = (&offered[a], &offered[b]);
        evr(a).cmp(&evr(b)).then_with(|| b.name.cmp(&a.name))
    })
}

/// [`close`] on the calling thread. Providers are looked up by capability name, so the cost is
/// that of indexing the offered Provides, plus for each requirement the Provides of its name.
fn resolve(offered: &[RpmHeader], wanted: &[String], own: &dyn Fn(&Dep) -> bool) -> Closure {
    // Each header's Provides, its own `name = [epoch:]version-release` first.
    let own_provides: Vec<Dep> = offered
        .iter()
        .map(|h| Dep::versioned(h.name.clone(), Op::Eq, h.evr()))
        .collect();
    let provides_of = |i: usize| std::iter::once(&own_provides[i]).chain(&offered[i].provides);
    let provides = |i: usize, req: &Dep| provides_of(i).any(|p| p.satisfies(req));
    // The offered headers providing each capability name, in offered order, each once.
    let mut providers: HashMap<&str, Vec<usize>> = HashMap::new();
    for i in 0..offered.len() {
        for p in provides_of(i) {
            let list = providers.entry(p.name.as_str()).or_default();
            if list.last() != Some(&i) {
                list.push(i);
            }
        }
    }
    let candidates = |name: &str| providers.get(name).into_iter().flatten().copied();
    let mut chosen = Chosen {
        order: Vec::new(),
        names: HashSet::new(),
        by_capability: HashMap::new(),
    };
    let mut out = Closure::default();
    for name in wanted {
        if chosen.names.contains(name.as_str()) {
            continue;
        }
        match best(
            offered,
            candidates(name).filter(|&i| offered[i].name == *name),
        ) {
            Some(i) => chosen.add(i, &offered[i].name, provides_of(i)),
            None => out.absent.push(name.clone()),
        }
    }
    let mut left_to_base: HashSet<&Dep> = HashSet::new();
    let mut next = 0;
    while let Some(&i) = chosen.order.get(next) {
        next += 1;
        for req in &offered[i].requires {
            let met = chosen
                .by_capability
                .get(req.name.as_str())
                .is_some_and(|list| list.iter().any(|&j| provides(j, req)));
            if met {
                continue;
            }
            let checkable = !req.name.starts_with('/') && !req.name.starts_with('(');
            let provider = checkable
                .then(|| best(offered, candidates(&req.name).filter(|&j| provides(j, req))))
                .flatten();
            let unresolved = || Unresolved {
                package: offered[i].nevra(),
                requirement: req.clone(),
            };
            match provider {
                Some(j) => chosen.add(j, &offered[j].name, provides_of(j)),
                None if checkable && own(req) => out.missing.push(unresolved()),
                None => {
                    if left_to_base.insert(req) {
                        out.from_base.push(unresolved());
                    }
                }
            }
        }
    }
    out.packages = chosen.order.iter().map(|&i| offered[i].clone()).collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    fn dep(spec: &str) -> Dep {
        let parts: Vec<&str> = spec.split(' ').collect();
        match parts[..] {
            [name, op, evr] => {
                let op = match op {
                    "<" => Op::Lt,
                    "<=" => Op::Le,
                    "=" => Op::Eq,
                    ">=" => Op::Ge,
                    _ => Op::Gt,
                };
                Dep::versioned(name, op, evr)
            }
            _ => Dep::any(spec),
        }
    }

    fn pkg(
        name: &str,
        vr: &str,
        arch: &str,
        provides: &[String],
        requires: &[String],
    ) -> RpmHeader {
        let (version, release) = vr.split_once('-').expect("version-release");
        RpmHeader {
            file: format!("{name}-{vr}.{arch}.rpm"),
            name: name.into(),
            epoch: 0,
            version: version.into(),
            release: release.into(),
            arch: arch.into(),
            provides: provides.iter().map(|p| dep(p)).collect(),
            requires: requires.iter().map(|r| dep(r)).collect(),
            needs: ReaderNeeds::default(),
        }
    }

    /// A variant's subpackages with the Requires/Provides of RHEL's kernel.spec
    /// (`kernel_variant_package`, `kernel_reqprovconf`, `kernel_modules_core_package`,
    /// `kernel_modules_package`, `kernel_modules_extra_package`), as built for el9.2+ and el10.
    fn kernel(flavor: &str, vr: &str, arch: &str, subs: &[&str]) -> Vec<RpmHeader> {
        let k = format!("{vr}.{arch}+{flavor}");
        let p = format!("kernel-{flavor}");
        let uname = |sub: &str| format!("{p}-{sub}-uname-r = {k}");
        subs.iter()
            .map(|sub| {
                let (provides, requires) = match *sub {
                    "core" => (
                        vec![uname("core"), format!("kernel-uname-r = {k}")],
                        vec![
                            uname("modules-core"),
                            "coreutils".into(),
                            "systemd >= 203-2".into(),
                            "/usr/bin/kernel-install".into(),
                            "dracut >= 027".into(),
                            "((linux-firmware >= 20150904-56.git6ebf5d57) if linux-firmware)"
                                .into(),
                        ],
                    ),
                    "modules-core" => (
                        vec![uname("modules-core")],
                        vec![format!("kernel-uname-r = {k}")],
                    ),
                    "modules" => (
                        vec![uname("modules")],
                        vec![format!("kernel-uname-r = {k}"), uname("modules-core")],
                    ),
                    _ => (
                        vec![uname("modules-extra")],
                        vec![
                            format!("kernel-uname-r = {k}"),
                            uname("modules"),
                            uname("modules-core"),
                        ],
                    ),
                };
                pkg(&format!("{p}-{sub}"), vr, arch, &provides, &requires)
            })
            .collect()
    }

    const ALL: [&str; 4] = ["core", "modules-core", "modules", "modules-extra"];

    fn seeds(flavor: &str) -> Vec<String> {
        ["core", "modules", "modules-extra"]
            .iter()
            .map(|s| format!("kernel-{flavor}-{s}"))
            .collect()
    }

    fn own(prefix: &'static str, suffix: &'static str) -> impl Fn(&Dep) -> bool + Clone + 'static {
        move |d: &Dep| {
            d.name.starts_with(prefix)
                || d.version.as_ref().is_some_and(|(_, v)| v.ends_with(suffix))
        }
    }

    fn names(c: &Closure) -> Vec<&str> {
        c.packages.iter().map(|p| p.name.as_str()).collect()
    }

    const EL10: &str = "6.12.0-124.8.1.el10_1";
    const EL9: &str = "5.14.0-570.60.1.el9_6";

    fn usbguard() -> RpmHeader {
        pkg(
            "usbguard",
            "1.1.3-3.el10",
            "x86_64",
            &[],
            &["/bin/sh".into(), "libqb.so.100()(64bit)".into()],
        )
    }

    fn libqb() -> RpmHeader {
        pkg(
            "libqb",
            "2.0.8-1.el10",
            "x86_64",
            &["libqb.so.100()(64bit)".into()],
            &[],
        )
    }

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// What each of core, modules and modules-extra misses without their modules-core.
    fn no_modules_core() -> Vec<String> {
        ["core", "modules", "modules-extra"]
            .iter()
            .map(|s| {
                format!(
                    "kernel-rt-modules-core-uname-r = {EL10}.x86_64+rt needed by kernel-rt-{s}-{EL10}.x86_64"
                )
            })
            .collect()
    }

    /// One closure case: what is offered and wanted, what is the variant's own, and what the
    /// closure chooses and misses.
    struct Case {
        what: &'static str,
        offered: Vec<RpmHeader>,
        wanted: Vec<String>,
        own: Box<dyn Fn(&Dep) -> bool>,
        chosen: Vec<String>,
        missing: Vec<String>,
    }

    /// A variant kernel's subpackages, complete or not.
    fn kernel_rows() -> Vec<Case> {
        let rt_own = own("kernel-rt-", "+rt");
        let mut stale_core = kernel("rt", EL10, "x86_64", &["core", "modules", "modules-extra"]);
        stale_core.extend(kernel(
            "rt",
            "6.12.0-55.9.1.el10_0",
            "x86_64",
            &["modules-core"],
        ));
        vec![
            Case {
                what: "el10 kernel-rt: modules-core comes from the headers",
                offered: kernel("rt", EL10, "x86_64", &ALL),
                wanted: seeds("rt"),
                own: Box::new(rt_own.clone()),
                chosen: v(&[
                    "kernel-rt-core",
                    "kernel-rt-modules",
                    "kernel-rt-modules-extra",
                    "kernel-rt-modules-core",
                ]),
                missing: Vec::new(),
            },
            Case {
                what: "el9.6 kernel-64k",
                offered: kernel("64k", EL9, "aarch64", &ALL),
                wanted: seeds("64k"),
                own: Box::new(own("kernel-64k-", "+64k")),
                chosen: v(&[
                    "kernel-64k-core",
                    "kernel-64k-modules",
                    "kernel-64k-modules-extra",
                    "kernel-64k-modules-core",
                ]),
                missing: Vec::new(),
            },
            Case {
                what: "no modules-core in the image: every subpackage misses it",
                offered: kernel("rt", EL10, "x86_64", &["core", "modules", "modules-extra"]),
                wanted: seeds("rt"),
                own: Box::new(rt_own.clone()),
                chosen: seeds("rt"),
                missing: no_modules_core(),
            },
            Case {
                what: "a modules-core of another build does not satisfy `=`",
                offered: stale_core,
                wanted: seeds("rt"),
                own: Box::new(rt_own),
                chosen: seeds("rt"),
                missing: no_modules_core(),
            },
        ]
    }

    /// Packages layered beside the kernel.
    fn layered_rows() -> Vec<Case> {
        let mut with_usbguard = kernel("rt", EL10, "x86_64", &ALL);
        with_usbguard.extend([usbguard(), libqb()]);
        let mut rt_wanted = seeds("rt");
        rt_wanted.push("usbguard".into());
        vec![
            Case {
                what: "a layered package pulls its library from the image; /bin/sh is the base's",
                offered: with_usbguard,
                wanted: rt_wanted,
                own: Box::new(own("kernel-rt-", "+rt")),
                chosen: v(&[
                    "kernel-rt-core",
                    "kernel-rt-modules",
                    "kernel-rt-modules-extra",
                    "usbguard",
                    "kernel-rt-modules-core",
                    "libqb",
                ]),
                missing: Vec::new(),
            },
            Case {
                what: "default kernel: nothing is the variant's own, all else is the base's",
                offered: vec![usbguard()],
                wanted: vec!["usbguard".into()],
                own: Box::new(|_: &Dep| false),
                chosen: v(&["usbguard"]),
                missing: Vec::new(),
            },
        ]
    }

    /// Every row of [`kernel_rows`] and [`layered_rows`] chooses and misses what it says.
    #[test]
    fn closures_by_table() {
        for c in kernel_rows().into_iter().chain(layered_rows()) {
            let got = resolve(&c.offered, &c.wanted, &c.own);
            assert_eq!(names(&got), c.chosen, "{}", c.what);
            let missing: Vec<String> = got.missing.iter().map(|u| u.to_string()).collect();
            assert_eq!(missing, c.missing, "{}", c.what);
        }
    }

    /// What no offered package provides and is not the variant's own is left to the base, each
    /// requirement once; a wanted package the image lacks is absent.
    #[test]
    fn the_rest_is_left_to_the_base_and_the_lacking_are_absent() {
        let rt_own = own("kernel-rt-", "+rt");
        let base = resolve(&kernel("rt", EL10, "x86_64", &ALL), &seeds("rt"), &rt_own);
        let left: Vec<String> = base
            .from_base
            .iter()
            .map(|u| u.requirement.to_string())
            .collect();
        assert_eq!(
            left,
            [
                "coreutils",
                "systemd >= 203-2",
                "/usr/bin/kernel-install",
                "dracut >= 027",
                "((linux-firmware >= 20150904-56.git6ebf5d57) if linux-firmware)"
            ],
            "left to the base, each once"
        );
        let absent = resolve(&[], &seeds("rt"), &rt_own);
        assert_eq!(absent.absent, seeds("rt"));
    }

    #[test]
    fn versioned_provides_match_as_rpm_compares() {
        for (provide, require, want) in [
            ("a = 1.0-1", "a = 1.0-1", true),
            ("a = 1.0-1", "a = 1.0-2", false),
            ("a = 1.0-1", "a = 1.0", true),
            ("a = 1.0-1", "a >= 0.9", true),
            ("a = 1.0-1", "a < 1.0-1", false),
            ("a = 1.0-1", "a <= 1.0-1", true),
            ("a = 2:0.1-1", "a >= 1.0", true),
            ("a = 1.0-1", "a > 1.0-1", false),
            ("a", "a >= 5", true),
            ("a = 1", "b", false),
            ("a >= 2", "a < 3", true),
            ("a >= 3", "a < 3", false),
        ] {
            assert_eq!(
                dep(provide).satisfies(&dep(require)),
                want,
                "{provide} / {require}"
            );
        }
    }

    /// The closure as first written, scanning every chosen and offered package for each
    /// requirement: the reference the indexed one must agree with.
    fn scanning(offered: &[RpmHeader], wanted: &[String], own: &dyn Fn(&Dep) -> bool) -> Closure {
        let mut out = Closure::default();
        let best = |cands: Vec<&RpmHeader>| -> Option<RpmHeader> {
            let evr = |h: &RpmHeader| {
                rpm_version::Evr::new(h.epoch.to_string(), h.version.clone(), h.release.clone())
            };
            cands
                .into_iter()
                .max_by(|a, b| evr(a).cmp(&evr(b)).then_with(|| b.name.cmp(&a.name)))
                .cloned()
        };
        let provides = |h: &RpmHeader, req: &Dep| {
            Dep::versioned(h.name.clone(), Op::Eq, h.evr()).satisfies(req)
                || h.provides.iter().any(|p| p.satisfies(req))
        };
        for name in wanted {
            if !out.packages.iter().any(|p| &p.name == name) {
                match best(offered.iter().filter(|h| &h.name == name).collect()) {
                    Some(h) => out.packages.push(h),
                    None => out.absent.push(name.clone()),
                }
            }
        }
        let mut next = 0;
        while let Some(pkg) = out.packages.get(next).cloned() {
            next += 1;
            for req in &pkg.requires {
                if out.packages.iter().any(|p| provides(p, req)) {
                    continue;
                }
                let unresolved = Unresolved {
                    package: pkg.nevra(),
                    requirement: req.clone(),
                };
                let checkable = !req.name.starts_with('/') && !req.name.starts_with('(');
                let provider = checkable
                    .then(|| best(offered.iter().filter(|h| provides(h, req)).collect()))
                    .flatten();
                match provider {
                    Some(h) => out.packages.push(h),
                    None if checkable && own(req) => out.missing.push(unresolved),
                    None if out.from_base.iter().any(|u| u.requirement == *req) => {}
                    None => out.from_base.push(unresolved),
                }
            }
        }
        out
    }

    fn any_dep() -> impl Strategy<Value = Dep> {
        let names = vec!["a", "b", "c", "d", "x", "/bin/sh", "(a if b)"];
        let evrs = vec!["1.0", "2.0", "1.0-1", "1.0-2", "1:0.5-1"];
        let ops = vec![Op::Lt, Op::Le, Op::Eq, Op::Ge, Op::Gt];
        (
            select(names),
            proptest::option::of((select(ops), select(evrs))),
        )
            .prop_map(|(name, version)| Dep {
                name: name.into(),
                version: version.map(|(op, evr)| (op, evr.to_string())),
            })
    }

    fn any_header() -> impl Strategy<Value = RpmHeader> {
        (
            select(vec!["a", "b", "c", "d"]),
            0..2u32,
            select(vec!["1.0", "2.0"]),
            select(vec!["1", "2"]),
            vec(any_dep(), 0..3),
            vec(any_dep(), 0..4),
        )
            .prop_map(
                |(name, epoch, version, release, provides, requires)| RpmHeader {
                    file: format!("{name}-{version}-{release}.noarch.rpm"),
                    name: name.into(),
                    epoch,
                    version: version.into(),
                    release: release.into(),
                    arch: "noarch".into(),
                    provides,
                    requires,
                    needs: ReaderNeeds::default(),
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_indexed_closure_is_the_scanning_one(
            offered in vec(any_header(), 0..10),
            wanted in vec(select(vec!["a", "b", "c", "e"]).prop_map(String::from), 0..4),
        ) {
            let own = |d: &Dep| d.name.starts_with('a');
            prop_assert_eq!(resolve(&offered, &wanted, &own), scanning(&offered, &wanted, &own));
        }
    }

    #[tokio::test]
    async fn close_gives_what_resolving_on_the_thread_gives() {
        let offered = kernel("rt", "6.12.0-124.8.1.el10_1", "x86_64", &ALL);
        let own = own("kernel-rt-", "+rt");
        let here = resolve(&offered, &seeds("rt"), &own);
        assert_eq!(here.packages.len(), 4);
        assert_eq!(close(offered, &seeds("rt"), own).await, here);
    }

    /// Fast Datapath's dist tags (openvswitch, which 4.23's ipsec extension installs) name
    /// their major too; a letter suffix does not make a name part a dist tag.
    #[test]
    fn product_dist_tags_name_their_major() {
        assert_eq!(el_major("openvswitch3.5-3.5.0-71.el9fdp.x86_64"), Some(9));
        assert_eq!(
            el_major("openvswitch3.5-ipsec-3.5.0-71.el10fdp.x86_64"),
            Some(10)
        );
        assert_eq!(el_major("leapp-el8toel9-1-1.noarch"), None);
        assert_eq!(el_major("elfutils-0.192-5.el10.x86_64"), Some(10));
        assert_eq!(el_major("foo-1-1.fc41"), None);
    }
}
