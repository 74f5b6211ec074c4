//! RPM names: a package name or a NEVRA (`name-version-release.arch`), as rpm-ostree reports
//! layered packages and as extensions images name their files.

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

/// The `el<N>` major of a kernel release or NEVRA (`…el10_1.x86_64` → 10).
pub fn el_major(release: &str) -> Option<u32> {
    release.split(['.', '-', '_', '+']).find_map(|part| {
        let digits = part.strip_prefix("el")?;
        digits.parse().ok()
    })
}

/// The largest RPM header (signature or main) that is read: kernel module packages carry a few
/// MiB of file lists and `kmod(…)` provides; anything near this is not a real package.
pub const MAX_HEADER: u64 = 64 << 20;

/// How a versioned dependency compares (`RPMSENSE_LESS|GREATER|EQUAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// Requires (`rpmlib(…)` ones dropped: rpm itself satisfies them).
    pub requires: Vec<Dep>,
}

/// Why an RPM header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// Reading failed (short file, I/O error).
    #[error("reading the RPM header: {0}")]
    Io(#[from] std::io::Error),
    /// Not an RPM, or a header too large to be one.
    #[error("not an RPM package: {0}")]
    Invalid(String),
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
    /// the payload unread. `file` is the name recorded for it.
    pub fn read(reader: impl std::io::Read, file: &str) -> Result<Self, HeaderError> {
        let bytes = header_bytes(reader)?;
        let meta = ::rpm::PackageMetadata::parse(&mut std::io::Cursor::new(bytes))
            .map_err(|e| HeaderError::Invalid(e.to_string()))?;
        let bad = |e: ::rpm::Error| HeaderError::Invalid(e.to_string());
        let deps = |list: Vec<::rpm::Dependency>| -> Vec<Dep> {
            list.into_iter()
                .filter(|d| !d.name.starts_with("rpmlib("))
                .map(|d| {
                    let f = d.flags;
                    let op = match (
                        f.contains(::rpm::DependencyFlags::LESS),
                        f.contains(::rpm::DependencyFlags::GREATER),
                        f.contains(::rpm::DependencyFlags::EQUAL),
                    ) {
                        (true, false, false) => Some(Op::Lt),
                        (true, false, true) => Some(Op::Le),
                        (false, false, true) => Some(Op::Eq),
                        (false, true, true) => Some(Op::Ge),
                        (false, true, false) => Some(Op::Gt),
                        _ => None,
                    };
                    Dep {
                        name: d.name,
                        version: op.filter(|_| !d.version.is_empty()).map(|o| (o, d.version)),
                    }
                })
                .collect()
        };
        Ok(RpmHeader {
            file: file.to_string(),
            name: meta.get_name().map_err(bad)?.to_string(),
            epoch: meta.get_epoch().unwrap_or(0),
            version: meta.get_version().map_err(bad)?.to_string(),
            release: meta.get_release().map_err(bad)?.to_string(),
            arch: meta.get_arch().map_err(bad)?.to_string(),
            provides: deps(meta.get_provides().map_err(bad)?),
            requires: deps(meta.get_requires().map_err(bad)?),
        })
    }

    /// Reads the header of the RPM file at `path`.
    pub fn read_file(path: &std::path::Path) -> Result<Self, HeaderError> {
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        Self::read(std::fs::File::open(path)?, &file)
    }
}

/// The lead, signature header (padded to 8 bytes) and main header at the start of `reader`,
/// with both headers' sizes checked against [`MAX_HEADER`] before anything is allocated for
/// them (the `rpm` crate allocates what a header's intro claims).
fn header_bytes(mut reader: impl std::io::Read) -> Result<Vec<u8>, HeaderError> {
    const LEAD: usize = 96;
    const LEAD_MAGIC: [u8; 4] = [0xed, 0xab, 0xee, 0xdb];
    const HEADER_MAGIC: [u8; 3] = [0x8e, 0xad, 0xe8];
    let mut out = vec![0u8; LEAD];
    reader.read_exact(&mut out)?;
    if out[..4] != LEAD_MAGIC {
        return Err(HeaderError::Invalid("bad lead magic".into()));
    }
    for (which, pad) in [("signature", true), ("main", false)] {
        let mut intro = [0u8; 16];
        reader.read_exact(&mut intro)?;
        if intro[..3] != HEADER_MAGIC {
            return Err(HeaderError::Invalid(format!("bad {which} header magic")));
        }
        let be = |i: usize| {
            u64::from(u32::from_be_bytes([
                intro[i],
                intro[i + 1],
                intro[i + 2],
                intro[i + 3],
            ]))
        };
        let size = be(8) * 16 + be(12);
        if size > MAX_HEADER {
            return Err(HeaderError::Invalid(format!(
                "the {which} header claims {size} bytes"
            )));
        }
        let padding = if pad { (8 - size % 8) % 8 } else { 0 };
        out.extend_from_slice(&intro);
        let start = out.len();
        // Bounded by MAX_HEADER above, so the conversion cannot truncate on 64-bit hosts.
        let body = usize::try_from(size + padding)
            .map_err(|_| HeaderError::Invalid(format!("the {which} header is too large")))?;
        out.resize(start + body, 0);
        reader.read_exact(&mut out[start..])?;
    }
    Ok(out)
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
pub fn close(offered: &[RpmHeader], wanted: &[String], own: &dyn Fn(&Dep) -> bool) -> Closure {
    let mut out = Closure::default();
    let best = |cands: Vec<&RpmHeader>| -> Option<RpmHeader> {
        cands
            .into_iter()
            .max_by(|a, b| {
                let evr = |h: &RpmHeader| {
                    rpm_version::Evr::new(h.epoch.to_string(), h.version.clone(), h.release.clone())
                };
                evr(a).cmp(&evr(b)).then_with(|| b.name.cmp(&a.name))
            })
            .cloned()
    };
    let self_provide = |h: &RpmHeader| Dep::versioned(h.name.clone(), Op::Eq, h.evr());
    let provides = |h: &RpmHeader, req: &Dep| {
        self_provide(h).satisfies(req) || h.provides.iter().any(|p| p.satisfies(req))
    };
    for name in wanted {
        if out.packages.iter().any(|p| &p.name == name) {
            continue;
        }
        match best(offered.iter().filter(|h| &h.name == name).collect()) {
            Some(h) => out.packages.push(h),
            None => out.absent.push(name.clone()),
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
                None => {
                    if !out.from_base.iter().any(|u| u.requirement == *req) {
                        out.from_base.push(unresolved);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn closures_by_table() {
        let el10 = "6.12.0-124.8.1.el10_1";
        let el9 = "5.14.0-570.60.1.el9_6";
        let rt_own = own("kernel-rt-", "+rt");
        let k64_own = own("kernel-64k-", "+64k");
        let usbguard = pkg(
            "usbguard",
            "1.1.3-3.el10",
            "x86_64",
            &[],
            &["/bin/sh".into(), "libqb.so.100()(64bit)".into()],
        );
        let libqb = pkg(
            "libqb",
            "2.0.8-1.el10",
            "x86_64",
            &["libqb.so.100()(64bit)".into()],
            &[],
        );
        struct Case {
            what: &'static str,
            offered: Vec<RpmHeader>,
            wanted: Vec<String>,
            own: Box<dyn Fn(&Dep) -> bool>,
            chosen: Vec<String>,
            missing: Vec<String>,
        }
        // What each of core, modules and modules-extra misses without their modules-core.
        let no_modules_core: Vec<String> = ["core", "modules", "modules-extra"]
            .iter()
            .map(|s| {
                format!(
                    "kernel-rt-modules-core-uname-r = {el10}.x86_64+rt needed by kernel-rt-{s}-{el10}.x86_64"
                )
            })
            .collect();
        let v = |names: &[&str]| -> Vec<String> { names.iter().map(|n| n.to_string()).collect() };
        let mut with_usbguard = kernel("rt", el10, "x86_64", &ALL);
        with_usbguard.extend([usbguard.clone(), libqb.clone()]);
        let mut rt_wanted = seeds("rt");
        rt_wanted.push("usbguard".into());
        let mut stale_core = kernel("rt", el10, "x86_64", &["core", "modules", "modules-extra"]);
        stale_core.extend(kernel(
            "rt",
            "6.12.0-55.9.1.el10_0",
            "x86_64",
            &["modules-core"],
        ));
        let cases = vec![
            Case {
                what: "el10 kernel-rt: modules-core comes from the headers",
                offered: kernel("rt", el10, "x86_64", &ALL),
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
                offered: kernel("64k", el9, "aarch64", &ALL),
                wanted: seeds("64k"),
                own: Box::new(k64_own.clone()),
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
                offered: kernel("rt", el10, "x86_64", &["core", "modules", "modules-extra"]),
                wanted: seeds("rt"),
                own: Box::new(rt_own.clone()),
                chosen: seeds("rt"),
                missing: no_modules_core.clone(),
            },
            Case {
                what: "a modules-core of another build does not satisfy `=`",
                offered: stale_core,
                wanted: seeds("rt"),
                own: Box::new(rt_own.clone()),
                chosen: seeds("rt"),
                missing: no_modules_core.clone(),
            },
            Case {
                what: "a layered package pulls its library from the image; /bin/sh is the base's",
                offered: with_usbguard,
                wanted: rt_wanted,
                own: Box::new(rt_own.clone()),
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
                offered: vec![usbguard.clone()],
                wanted: vec!["usbguard".into()],
                own: Box::new(|_: &Dep| false),
                chosen: v(&["usbguard"]),
                missing: Vec::new(),
            },
        ];
        for c in cases {
            let got = close(&c.offered, &c.wanted, &c.own);
            assert_eq!(names(&got), c.chosen, "{}", c.what);
            let missing: Vec<String> = got.missing.iter().map(|u| u.to_string()).collect();
            assert_eq!(missing, c.missing, "{}", c.what);
        }
        let base = close(&kernel("rt", el10, "x86_64", &ALL), &seeds("rt"), &rt_own);
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
        let absent = close(&[], &seeds("rt"), &rt_own);
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

    #[test]
    fn bad_headers_are_errors_without_allocating_what_they_claim() {
        assert!(matches!(
            RpmHeader::read(&b"not an rpm"[..], "x.rpm"),
            Err(HeaderError::Io(_))
        ));
        let mut lead = vec![0u8; 96];
        lead[..4].copy_from_slice(&[0xed, 0xab, 0xee, 0xdb]);
        let mut huge = lead.clone();
        huge.extend_from_slice(&[0x8e, 0xad, 0xe8, 1, 0, 0, 0, 0]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        match RpmHeader::read(&huge[..], "x.rpm") {
            Err(HeaderError::Invalid(m)) => assert!(m.contains("claims"), "{m}"),
            other => panic!("{other:?}"),
        }
        lead.extend_from_slice(&[0u8; 16]);
        assert!(matches!(
            RpmHeader::read(&lead[..], "x.rpm"),
            Err(HeaderError::Invalid(_))
        ));
    }
}
