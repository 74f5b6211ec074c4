//! Read-only verification of a staged deployment through libostree, before the node reboots
//! into it.
//!
//! rpm-ostree's D-Bus view says *what* was staged; this module opens the sysroot and checks
//! the deployment that will actually boot: its kernel arguments (from its boot config), its
//! kernel (`/usr/lib/modules/<release>` in the deployment checkout), its OS release and, on a
//! FIPS node, what FIPS mode needs. Every difference is collected, so one report names them
//! all.
//!
//! libostree is blocking and brings glib, gio and some sixty shared libraries along. The daemon
//! therefore never links it: [`in_helper`] runs [`verify_staged`] in the `streamd-verify`
//! helper (installed next to `streamd`), one short-lived process per check, with a timeout
//! (`crate::backend::helper`). The helper also answers [`image_configs`], the bootc backend's
//! question for the image labels `bootc status` does not print.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use ostree::gio;
use ostree::gio::prelude::FileExt as _;

use crate::backend::Deployment;
use crate::backend::KernelVariant;
use crate::backend::helper::{ImageConfigs, ImageConfigsAnswer, META_CONFIG, RemoteError};
use crate::host::facts::OsRelease;

/// What the staged deployment must look like.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Expectation {
    /// `sha256:…` manifest digest of the desired OS image, compared with the staged
    /// deployment's `container-image-reference-digest` (the caller resolves index vs manifest).
    pub image_digest: String,
    /// Major of the staged tree's os-release (`RHEL_VERSION`, else `VERSION_ID`), e.g. 10.
    pub target_major: u32,
    /// The kernel variant the node must keep.
    pub kernel: KernelVariant,
    /// The node is FIPS: the kernel arguments keep `fips=1` and the tree has the FIPS crypto
    /// policy and the dracut fips module.
    pub fips: bool,
}

/// Why verification did not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum VerifyError {
    /// The staged deployment differs from the expectation; every difference, as a sentence.
    #[error("the staged deployment does not match: {}", .0.join("; "))]
    Mismatch(Vec<String>),
    /// The sysroot or a deployment in it could not be opened or read.
    #[error("cannot verify the staged deployment: {0}")]
    Sysroot(String),
}

impl VerifyError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            VerifyError::Mismatch(_) => "verify-mismatch",
            VerifyError::Sysroot(_) => "verify-sysroot",
        }
    }
}

/// One check for the helper: what [`verify_staged`] takes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// The ostree sysroot (`/` on a host).
    pub sysroot: PathBuf,
    /// The staged deployment.
    pub staged: Deployment,
    /// The booted deployment.
    pub booted: Deployment,
    /// What the staged deployment must look like.
    pub expect: Expectation,
}

/// File name of the helper, next to the `streamd` executable.
pub use crate::backend::helper::HELPER;
/// Longest a check may take (it reads a few files of two deployments).
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs [`verify_staged`] for `req` in the helper `helper` and returns its verdict.
pub async fn in_helper(helper: &Path, req: &Request) -> Result<(), VerifyError> {
    crate::backend::helper::run::<Result<(), VerifyError>>(helper, &[], req, HELPER_TIMEOUT)
        .await
        .map_err(|e| VerifyError::Sysroot(e.to_string()))?
}

/// Reads the ostree-ext image configuration of each of `req.commits` from the repository
/// `req.repo`, read-only, as ostree-ext itself does (bootc-dev/bootc:crates/ostree-ext/src/
/// container/store.rs `query_image_commit`: the commit object, whose metadata `a{sv}` is its
/// first child, the key [`META_CONFIG`] holds a string). A commit without the key (an import
/// by an ostree-ext that did not store it) is `None`; the string is returned as stored (also
/// format v0's `"null"`), for the daemon to parse. A commit that cannot be read, or whose key
/// is not a string, is an error of its own; the whole answer is an error when the repository
/// cannot be opened.
pub fn image_configs(req: &ImageConfigs) -> ImageConfigsAnswer {
    let repo = ostree::Repo::new(&gio::File::for_path(&req.repo));
    // `open` only reads the configuration; nothing here locks or writes the repository.
    repo.open(gio::Cancellable::NONE).map_err(|e| {
        RemoteError(format!(
            "opening the ostree repository {}: {e}",
            req.repo.display()
        ))
    })?;
    Ok(req
        .commits
        .iter()
        .map(|c| (c.clone(), image_config(&repo, c).map_err(RemoteError)))
        .collect())
}

/// [`META_CONFIG`] of commit `checksum` in `repo`.
fn image_config(repo: &ostree::Repo, checksum: &str) -> Result<Option<String>, String> {
    if checksum.len() != 64 || !checksum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{checksum:?} is not an ostree commit checksum"));
    }
    // What `ostree_repo_load_commit` reads, without its version feature (the crate is built
    // with none: every libostree has this).
    let commit = repo
        .load_variant(ostree::ObjectType::Commit, checksum)
        .map_err(|e| format!("loading commit {checksum}: {e}"))?;
    let meta = ostree::glib::VariantDict::new(Some(&commit.child_value(0)));
    meta.lookup::<String>(META_CONFIG)
        .map_err(|e| format!("commit {checksum}: {META_CONFIG} is not a string: {e}"))
}

/// Kernel arguments that differ per deployment by construction.
const PER_DEPLOYMENT_KARGS: [&str; 2] = ["ostree=", "BOOT_IMAGE="];

/// Verifies the staged deployment against `exp`.
///
/// Opens the ostree sysroot at `sysroot_path` read-only (no lock), finds the on-disk
/// deployments matching `staged` and `booted` (stateroot, checksum and deploy serial), and
/// checks: the image digest; that the staged kernel arguments contain every argument of the
/// booted deployment (as multisets, ignoring `ostree=` and `BOOT_IMAGE=`) and `fips=1` on a
/// FIPS node; that the staged tree has exactly one kernel, `/usr/lib/modules/<release>/vmlinuz`,
/// whose release suffix matches `exp.kernel` (a directory without `vmlinuz`, e.g. what a removed
/// kernel's unowned files leave, is no kernel: rpm-ostree's `find_dir_with_vmlinuz`); that its
/// os-release major is `exp.target_major`; and on a FIPS node that it has `/usr/share/crypto-policies/policies/FIPS.pol` and a dracut module directory
/// named `*fips*` (RHEL 10 has no `fips-mode-setup`, so that is not required).
///
/// libostree lists a staged deployment (kept in `/run/ostree/staged-deployment` until
/// shutdown) only when the sysroot it opens is the running root (`/` on a host). Below a host
/// root (`ROOT/sysroot`, e.g. the testbed's) the staged deployment is read from that record,
/// `ROOT/run/ostree/staged-deployment`, instead; the testbed's fake without real libostree
/// makes it the not-booted deployment at index 0, which libostree lists.
pub fn verify_staged(
    sysroot_path: &Path,
    staged: &Deployment,
    booted: &Deployment,
    exp: &Expectation,
) -> Result<(), VerifyError> {
    let sysroot = ostree::Sysroot::new(Some(&gio::File::for_path(sysroot_path)));
    // `load` only reads; without `lock` this never waits for, or blocks, rpm-ostreed.
    sysroot.load(gio::Cancellable::NONE).map_err(|e| {
        VerifyError::Sysroot(format!(
            "loading the ostree sysroot {}: {e}",
            sysroot_path.display()
        ))
    })?;
    let on_disk = sysroot.deployments();
    let find = |d: &Deployment, role: &str| {
        on_disk
            .iter()
            .find(|o| {
                // An empty osname: bootc before v1.3.0 does not say the stateroot.
                (d.osname.is_empty() || o.osname() == d.osname.as_str())
                    && o.csum() == d.checksum.as_str()
                    && o.deployserial() == d.serial
            })
            .ok_or_else(|| {
                let present: Vec<String> = on_disk
                    .iter()
                    .map(|o| format!("{}-{}.{}", o.osname(), o.csum(), o.deployserial()))
                    .collect();
                VerifyError::Sysroot(format!(
                    "the {role} deployment {} is not in the ostree sysroot {} (it has: {})",
                    d.id,
                    sysroot_path.display(),
                    if present.is_empty() {
                        "no deployments".to_string()
                    } else {
                        present.join(", ")
                    }
                ))
            })
    };
    let booted_disk = find(booted, "booted")?;
    let (staged_kargs, root) = match find(staged, "staged") {
        Ok(staged_disk) => {
            let root = sysroot
                .deployment_directory(staged_disk)
                .path()
                .ok_or_else(|| {
                    VerifyError::Sysroot(format!(
                        "the directory of deployment {} in {} has no local path",
                        staged.id,
                        sysroot_path.display()
                    ))
                })?;
            (kargs_of(staged_disk, staged, sysroot_path)?, root)
        }
        // Below a host root libostree does not list the staged deployment: its record does.
        Err(e) => staged_from_record(sysroot_path, staged)?.ok_or(e)?,
    };

    let mut problems = Vec::new();
    problems.extend(check_digest(staged, &exp.image_digest));

    let booted_kargs = kargs_of(booted_disk, booted, sysroot_path)?;
    problems.extend(check_kargs(&booted_kargs, &staged_kargs, exp.fips));

    problems.extend(check_tree(&root, exp)?);

    if problems.is_empty() {
        Ok(())
    } else {
        Err(VerifyError::Mismatch(problems))
    }
}

/// The staged deployment `staged` as libostree's record names it, for a sysroot that is not
/// the running root (a `host-root` below `/`, the testbed): its kernel arguments as staged
/// (what libostree gives the staged deployment's boot config, `_ostree_sysroot_reload_staged`)
/// and its directory. The record is the host root's `run/ostree/staged-deployment`, next to
/// its `sysroot`; `None` when there is none or it names another deployment.
fn staged_from_record(
    sysroot_path: &Path,
    staged: &Deployment,
) -> Result<Option<(String, PathBuf)>, VerifyError> {
    if sysroot_path == Path::new("/") {
        return Ok(None);
    }
    let Some(host_root) = sysroot_path.parent() else {
        return Ok(None);
    };
    // An unreadable record is as good as none: the caller reports the deployment as missing.
    let Ok(Some(record)) = crate::backend::rpmostree::runstate::read(host_root) else {
        return Ok(None);
    };
    let name = format!("{}.{}", staged.checksum, staged.serial);
    let osname = record.osname.unwrap_or_default();
    // The osname becomes a path component: one plain name only.
    let plain = !osname.is_empty() && !osname.contains('/') && osname != "." && osname != "..";
    if record.name.as_deref() != Some(name.as_str())
        || !plain
        || !(staged.osname.is_empty() || staged.osname == osname)
    {
        return Ok(None);
    }
    let kargs = record.kargs.ok_or_else(|| {
        VerifyError::Sysroot(format!(
            "{} names deployment {} but has no kargs",
            host_root.join("run/ostree/staged-deployment").display(),
            staged.id
        ))
    })?;
    let dir = sysroot_path.join(format!("ostree/deploy/{osname}/deploy/{name}"));
    Ok(Some((kargs.join(" "), dir)))
}

/// The `options` line of a deployment's boot config.
fn kargs_of(
    disk: &ostree::Deployment,
    d: &Deployment,
    sysroot_path: &Path,
) -> Result<String, VerifyError> {
    disk.bootconfig()
        .and_then(|b| b.get("options"))
        .map(|o| o.to_string())
        .ok_or_else(|| {
            VerifyError::Sysroot(format!(
                "deployment {} in {} has no boot config options",
                d.id,
                sysroot_path.display()
            ))
        })
}

fn check_digest(staged: &Deployment, want: &str) -> Option<String> {
    match staged.container_image_reference_digest.as_deref() {
        Some(got) if got == want => None,
        Some(got) => Some(format!(
            "the staged deployment is image {got}, expected {want}"
        )),
        None => Some(format!(
            "the staged deployment reports no image digest, expected {want}"
        )),
    }
}

/// Splits a kernel command line into arguments the way the kernel does: at whitespace outside
/// double quotes (quotes are kept, so arguments compare verbatim).
fn split_kargs(cmdline: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    let mut quoted = false;
    for (i, c) in cmdline.char_indices() {
        if c == '"' {
            quoted = !quoted;
        }
        if c.is_whitespace() && !quoted {
            if let Some(s) = start.take() {
                out.push(&cmdline[s..i]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        out.push(&cmdline[s..]);
    }
    out
}

fn per_deployment(arg: &str) -> bool {
    PER_DEPLOYMENT_KARGS.iter().any(|p| arg.starts_with(p))
}

/// The booted arguments the staged ones lack, counted as multisets: `(arg, booted count,
/// staged count)` in booted order.
fn missing_kargs<'a>(booted: &'a str, staged: &str) -> Vec<(&'a str, usize, usize)> {
    let mut have: HashMap<&str, usize> = HashMap::new();
    for a in split_kargs(staged)
        .into_iter()
        .filter(|a| !per_deployment(a))
    {
        *have.entry(a).or_default() += 1;
    }
    let mut want: Vec<(&str, usize)> = Vec::new();
    for a in split_kargs(booted)
        .into_iter()
        .filter(|a| !per_deployment(a))
    {
        match want.iter_mut().find(|(w, _)| *w == a) {
            Some((_, n)) => *n += 1,
            None => want.push((a, 1)),
        }
    }
    want.into_iter()
        .filter_map(|(a, n)| {
            let got = have.get(a).copied().unwrap_or(0);
            (got < n).then_some((a, n, got))
        })
        .collect()
}

fn check_kargs(booted: &str, staged: &str, fips: bool) -> Vec<String> {
    let mut out: Vec<String> = missing_kargs(booted, staged)
        .into_iter()
        .map(|(a, n, got)| {
            if got == 0 {
                format!(
                    "kernel argument {a:?} of the booted deployment is missing from the staged one"
                )
            } else {
                format!(
                    "kernel argument {a:?} appears {n} times in the booted deployment but {got} in the staged one"
                )
            }
        })
        .collect();
    if fips && !split_kargs(staged).contains(&"fips=1") {
        out.push("the node is FIPS but the staged kernel arguments lack fips=1".to_string());
    }
    out
}

/// The kernel variant a kernel release (`uname -r`, a `/usr/lib/modules` name) belongs to.
fn variant_of_release(release: &str) -> KernelVariant {
    if release.ends_with(KernelVariant::Realtime.release_suffix()) {
        KernelVariant::Realtime
    } else if release.ends_with(KernelVariant::SixtyFourK.release_suffix()) {
        KernelVariant::SixtyFourK
    } else {
        KernelVariant::Default
    }
}

/// The kernel problem of a tree whose `/usr/lib/modules` holds kernels `releases`.
fn check_modules(releases: &[String], want: KernelVariant) -> Option<String> {
    match releases {
        [] => Some("the staged tree has no kernel (vmlinuz) in /usr/lib/modules".to_string()),
        [release] => {
            let got = variant_of_release(release);
            (got != want).then(|| {
                format!(
                    "the staged kernel {release} is a {} kernel, expected {} (release suffix {:?})",
                    got.as_str(),
                    want.as_str(),
                    want.release_suffix()
                )
            })
        }
        many => Some(format!(
            "the staged tree has {} kernels (vmlinuz) in /usr/lib/modules ({}), expected exactly one",
            many.len(),
            many.join(", ")
        )),
    }
}

/// Checks the files of the deployment checkout at `root`.
fn check_tree(root: &Path, exp: &Expectation) -> Result<Vec<String>, VerifyError> {
    let mut out = Vec::new();
    let mut releases = kernel_dirs(root)?;
    releases.sort();
    out.extend(check_modules(&releases, exp.kernel));

    let os_release = match read_in_root(root, "usr/lib/os-release")? {
        Some(t) => Some(t),
        None => read_in_root(root, "etc/os-release")?,
    };
    match os_release.map(|t| OsRelease::parse(&t)) {
        None => out.push("the staged tree has no os-release".to_string()),
        Some(r) => match r.major() {
            Some(m) if m == exp.target_major => {}
            Some(m) => out.push(format!(
                "the staged tree is release {} (major {m}), expected major {}",
                r.version().unwrap_or_default(),
                exp.target_major
            )),
            None => out.push(format!(
                "the staged tree's os-release has no numeric RHEL_VERSION or VERSION_ID, expected major {}",
                exp.target_major
            )),
        },
    }

    if exp.fips {
        const POLICY: &str = "usr/share/crypto-policies/policies/FIPS.pol";
        if !resolve_in_root(root, POLICY)?.is_some_and(|p| p.is_file()) {
            out.push(format!(
                "the node is FIPS but the staged tree has no /{POLICY}"
            ));
        }
        if !subdirs(root, "usr/lib/dracut/modules.d")?
            .iter()
            .any(|m| m.contains("fips"))
        {
            out.push(
                "the node is FIPS but the staged tree has no dracut fips module in /usr/lib/dracut/modules.d"
                    .to_string(),
            );
        }
    }
    Ok(out)
}

fn io_error(path: &Path, e: std::io::Error) -> VerifyError {
    VerifyError::Sysroot(format!("reading {}: {e}", path.display()))
}

/// `rel` below `root` with every symlink resolved inside `root`, as the booted system sees
/// it (an absolute link must not escape to the host running the check); `None` if missing.
fn resolve_in_root(root: &Path, rel: &str) -> Result<Option<PathBuf>, VerifyError> {
    // Components still to walk, last first; ".." is kept as a name and applied when popped.
    fn push_components(stack: &mut Vec<OsString>, p: &Path) {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => stack.push(n.to_os_string()),
                Component::ParentDir => stack.push("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
    }
    let mut pending = Vec::new();
    push_components(&mut pending, Path::new(rel));
    let mut done = PathBuf::new();
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            done.pop();
            continue;
        }
        let candidate = done.join(&name);
        let full = root.join(&candidate);
        match std::fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => {
                // The kernel's limit on nested links (ELOOP).
                links += 1;
                if links > 40 {
                    return Err(VerifyError::Sysroot(format!(
                        "too many levels of symbolic links below {} at {rel}",
                        root.display()
                    )));
                }
                let target = std::fs::read_link(&full).map_err(|e| io_error(&full, e))?;
                if target.is_absolute() {
                    done = PathBuf::new();
                }
                push_components(&mut pending, &target);
            }
            Ok(_) => done = candidate,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(io_error(&full, e)),
        }
    }
    Ok(Some(root.join(done)))
}

/// The names of the directories in `rel` below `root` (empty if it does not exist).
fn subdirs(root: &Path, rel: &str) -> Result<Vec<String>, VerifyError> {
    let Some(dir) = resolve_in_root(root, rel)? else {
        return Ok(Vec::new());
    };
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| io_error(&dir, e))? {
        let entry = entry.map_err(|e| io_error(&dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = resolve_in_root(root, &format!("{rel}/{name}"))?.is_some_and(|p| p.is_dir());
        if is_dir {
            out.push(name);
        }
    }
    Ok(out)
}

/// The directories of `usr/lib/modules` below `root` that hold a kernel: as rpm-ostree and
/// libostree find the kernel (coreos/rpm-ostree v2025.5 src/libpriv/rpmostree-kernel.cxx
/// `find_dir_with_vmlinuz`: "Ignore directories without vmlinuz"), a directory with anything
/// else only (a removed kernel's unowned `extra/`, a kmod's `weak-updates/`) is not one.
fn kernel_dirs(root: &Path) -> Result<Vec<String>, VerifyError> {
    let mut out = Vec::new();
    for name in subdirs(root, "usr/lib/modules")? {
        let Some(dir) = resolve_in_root(root, &format!("usr/lib/modules/{name}"))? else {
            continue;
        };
        let vmlinuz = dir.join("vmlinuz");
        match std::fs::symlink_metadata(&vmlinuz) {
            Ok(_) => out.push(name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&vmlinuz, e)),
        }
    }
    Ok(out)
}

/// The text of the file `rel` below `root`, if it exists.
fn read_in_root(root: &Path, rel: &str) -> Result<Option<String>, VerifyError> {
    match resolve_in_root(root, rel)? {
        Some(p) if p.is_file() => std::fs::read_to_string(&p)
            .map(Some)
            .map_err(|e| io_error(&p, e)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kargs_split_like_the_kernel() {
        assert_eq!(
            split_kargs("  rw  foo=\"a b\" quiet\tx=\"\" "),
            ["rw", "foo=\"a b\"", "quiet", "x=\"\""]
        );
        assert!(split_kargs(" \t").is_empty());
    }

    #[test]
    fn kargs_compare_as_multisets() {
        let booted =
            "BOOT_IMAGE=(hd0,gpt3)/a ostree=/ostree/boot.1/x rw console=tty0 console=ttyS0 fips=1";
        // Reordered, other ostree=, extra arguments: nothing missing.
        let staged = "ostree=/ostree/boot.0/y fips=1 console=ttyS0 rw console=tty0 nosmt";
        assert!(missing_kargs(booted, staged).is_empty());
        assert!(check_kargs(booted, staged, true).is_empty());
        // A repeated argument counts; a lost one is named.
        let staged = "rw console=tty0 nosmt";
        assert_eq!(
            missing_kargs(booted, staged),
            [("console=ttyS0", 1, 0), ("fips=1", 1, 0)]
        );
        let twice = "rw console=tty0 console=tty0";
        assert_eq!(
            missing_kargs(twice, "rw console=tty0"),
            [("console=tty0", 2, 1)]
        );
        let problems = check_kargs(booted, staged, true);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems[1].contains("\"fips=1\""), "{problems:#?}");
        assert!(problems[2].contains("lack fips=1"), "{problems:#?}");
        // A FIPS node needs fips=1 even when the booted deployment somehow lacks it.
        assert_eq!(check_kargs("rw", "rw", true).len(), 1);
        assert!(check_kargs("rw", "rw", false).is_empty());
    }

    #[test]
    fn module_dir_suffix_names_the_variant() {
        let cases = [
            ("6.12.0-124.8.1.el10_1.x86_64", KernelVariant::Default),
            ("6.12.0-124.8.1.el10_1.x86_64+rt", KernelVariant::Realtime),
            (
                "6.12.0-124.8.1.el10_1.aarch64+64k",
                KernelVariant::SixtyFourK,
            ),
            ("5.14.0-570.60.1.el9_6.x86_64+rt", KernelVariant::Realtime),
        ];
        for (release, want) in cases {
            assert_eq!(variant_of_release(release), want, "{release}");
        }
        let one = |r: &str| vec![r.to_string()];
        assert_eq!(
            check_modules(&one("6.12.0-1.el10.x86_64+rt"), KernelVariant::Realtime),
            None
        );
        let wrong = check_modules(&one("6.12.0-1.el10.x86_64"), KernelVariant::Realtime)
            .expect("default is not realtime");
        assert!(
            wrong.contains("is a default kernel, expected realtime"),
            "{wrong}"
        );
        assert!(check_modules(&[], KernelVariant::Default).is_some());
        let two = [
            "6.12.0-1.el10.x86_64".to_string(),
            "6.12.0-1.el10.x86_64+rt".to_string(),
        ];
        let many = check_modules(&two, KernelVariant::Realtime).expect("two kernels");
        assert!(many.contains("2 kernels (vmlinuz)"), "{many}");
    }

    /// A scratch directory (removed on drop) to put files in.
    struct Scratch(testbed::scratch::ScratchDir);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            Scratch(
                testbed::scratch::ScratchDir::new(&format!("verify-{name}")).expect("scratch dir"),
            )
        }

        fn put(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
    }

    fn expectation(kernel: KernelVariant, fips: bool) -> Expectation {
        Expectation {
            image_digest: "sha256:00".into(),
            target_major: 10,
            kernel,
            fips,
        }
    }

    #[test]
    fn tree_checks_resolve_links_inside_the_tree() {
        let t = Scratch::new("tree");
        t.put("usr/lib/modules/6.12.0-1.el10.x86_64+rt/vmlinuz", "k");
        t.put("usr/lib/os-release", "ID=rhcos\nRHEL_VERSION=10.1\n");
        // What FIPS needs, reached through absolute links that point inside the tree; the
        // same absolute paths on the machine running the test must not count.
        t.put("usr/share/crypto-policies/back/FIPS.pol", "p");
        t.put("usr/lib/dracut/real/01fips/module-setup.sh", "m");
        std::fs::create_dir_all(t.0.join("usr/share/crypto-policies/policies")).expect("mkdir");
        std::os::unix::fs::symlink(
            "/usr/share/crypto-policies/back/FIPS.pol",
            t.0.join("usr/share/crypto-policies/policies/FIPS.pol"),
        )
        .expect("link");
        std::fs::create_dir_all(t.0.join("usr/lib/dracut/modules.d")).expect("mkdir");
        std::os::unix::fs::symlink(
            "../real/01fips",
            t.0.join("usr/lib/dracut/modules.d/01fips"),
        )
        .expect("link");
        let rt_fips = expectation(KernelVariant::Realtime, true);
        assert_eq!(check_tree(&t.0, &rt_fips), Ok(Vec::new()));
        // What a removed default kernel's unowned files leave is no second kernel (seen on real
        // rpm-ostree v2025.5: it staged such a tree, and streamd had refused it).
        t.put("usr/lib/modules/6.12.0-1.el10.x86_64/extra/kmod.ko", "m");
        assert_eq!(check_tree(&t.0, &rt_fips), Ok(Vec::new()));
        t.put("usr/lib/modules/6.12.0-1.el10.x86_64/vmlinuz", "k");
        let two = check_tree(&t.0, &rt_fips).expect("readable");
        assert!(two[0].contains("2 kernels (vmlinuz)"), "{two:#?}");
        std::fs::remove_dir_all(t.0.join("usr/lib/modules/6.12.0-1.el10.x86_64")).expect("rm");

        // Every difference at once.
        let wrong = Expectation {
            target_major: 9,
            ..expectation(KernelVariant::Default, true)
        };
        std::fs::remove_file(t.0.join("usr/share/crypto-policies/back/FIPS.pol")).expect("rm");
        std::fs::remove_dir_all(t.0.join("usr/lib/dracut/real")).expect("rm");
        let problems = check_tree(&t.0, &wrong).expect("readable");
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(
            problems[0].contains("realtime kernel, expected default"),
            "{problems:#?}"
        );
        assert!(
            problems[1].contains("(major 10), expected major 9"),
            "{problems:#?}"
        );
        assert!(problems[2].contains("FIPS.pol"), "{problems:#?}");
        assert!(problems[3].contains("dracut fips module"), "{problems:#?}");

        // A dangling chain of links and a loop are handled, not followed forever.
        std::os::unix::fs::symlink("loop-b", t.0.join("loop-a")).expect("link");
        std::os::unix::fs::symlink("loop-a", t.0.join("loop-b")).expect("link");
        assert!(matches!(
            resolve_in_root(&t.0, "loop-a/x"),
            Err(VerifyError::Sysroot(_))
        ));
        assert_eq!(resolve_in_root(&t.0, "usr/lib/os-release/x"), Ok(None));
        assert_eq!(
            resolve_in_root(&t.0, "/usr/../usr/lib/./os-release"),
            Ok(Some(t.0.join("usr/lib/os-release")))
        );
    }

    #[test]
    fn empty_tree_is_a_mismatch_not_an_error() {
        let t = Scratch::new("empty");
        let problems =
            check_tree(&t.0, &expectation(KernelVariant::Default, false)).expect("readable");
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].contains("no kernel (vmlinuz)"), "{problems:#?}");
        assert!(problems[1].contains("no os-release"), "{problems:#?}");
    }

    /// The real `ostree` CLI (as the testbed uses it); its trimmed stdout.
    fn ostree_cli(args: &[String]) -> String {
        let out = std::process::Command::new("ostree")
            .args(args)
            .output()
            .expect("run ostree");
        assert!(
            out.status.success(),
            "ostree {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[test]
    fn image_configs_are_read_from_commit_metadata_through_libostree() {
        let t = Scratch::new("image-configs");
        let repo = t.0.join("repo");
        let r = format!("--repo={}", repo.display());
        ostree_cli(&["init".into(), r.clone(), "--mode=archive".into()]);
        t.put("tree/usr/lib/os-release", "ID=rhcos\n");
        let commit = |n: u32, meta: Option<&str>| {
            let mut args = vec![
                "commit".to_string(),
                r.clone(),
                format!("--tree=dir={}", t.0.join("tree").display()),
                "--orphan".into(),
                "--subject=import".into(),
                format!("--add-metadata-string=n={n}"),
            ];
            args.extend(meta.map(|m| format!("--add-metadata={META_CONFIG}={m}")));
            ostree_cli(&args)
        };
        let config = r#"{"config":{"Labels":{"baseOSContainerImage":"q.io/a@sha256:00"}}}"#;
        // GVariant text: a quoted string, and one that is not a string at all.
        let labelled = commit(1, Some(&format!("'{config}'")));
        let null = commit(2, Some("'null'"));
        let broken = commit(3, Some("'{not json'"));
        let absent = commit(4, None);
        let number = commit(5, Some("42"));
        let missing = "0".repeat(64);
        let all = [&labelled, &null, &broken, &absent, &number, &missing];
        let got = image_configs(&ImageConfigs {
            repo: repo.clone(),
            commits: all.iter().map(|c| c.to_string()).collect(),
        })
        .expect("the repository opens");
        assert_eq!(got.len(), all.len(), "{got:#?}");
        assert_eq!(got[&labelled], Ok(Some(config.to_string())));
        assert_eq!(got[&null], Ok(Some("null".to_string())), "stored as is");
        assert_eq!(got[&broken], Ok(Some("{not json".to_string())));
        assert_eq!(got[&absent], Ok(None));
        let e = got[&number].clone().expect_err("not a string").0;
        assert!(e.contains(META_CONFIG) && e.contains(&number), "{e}");
        let e = got[&missing].clone().expect_err("not in the repository").0;
        assert!(e.contains(&missing), "{e}");
        // Not a checksum: never handed to libostree as a path.
        let odd = image_configs(&ImageConfigs {
            repo: repo.clone(),
            commits: vec!["../../etc/passwd".into()],
        })
        .expect("the repository opens");
        let e = odd["../../etc/passwd"]
            .clone()
            .expect_err("not a checksum")
            .0;
        assert!(e.contains("not an ostree commit checksum"), "{e}");
        // No repository there.
        let e = image_configs(&ImageConfigs {
            repo: t.0.join("nowhere"),
            commits: vec![labelled],
        })
        .expect_err("no repository")
        .0;
        assert!(e.contains("nowhere"), "{e}");
    }

    /// Below a host root libostree lists no staged deployment; its record names it. Staged by
    /// real libostree 2025.x (the trixie root), checked as on a node, and refused when the
    /// record names another deployment.
    #[tokio::test]
    async fn a_staged_deployment_below_a_host_root_is_read_from_libostrees_record() {
        use testbed::fakes::rpmostreed::libostree::{BootedHost, Trixie};
        use testbed::fixtures::images::{DEFAULT_REGISTRY, catalog};
        let test = "a_staged_deployment_below_a_host_root_is_read_from_libostrees_record";
        let Some(trixie) = Trixie::for_test(test).expect("the trixie root scripts/setup.sh makes")
        else {
            return;
        };
        let root = testbed::scratch::ScratchDir::new("verify-rec").expect("scratch dir");
        let images = catalog(DEFAULT_REGISTRY);
        let kargs: Vec<String> = ["rw", "root=UUID=91b1b4fd", "fips=1"]
            .map(String::from)
            .to_vec();
        let host = BootedHost::create(&root, "rhcos", &images[0], &kargs)
            .await
            .expect("booted sysroot");
        let target = host.commit(&images[1]).await.expect("commit");
        let (name, _) = host
            .stage(&trixie, &target, host.booted_options(), true)
            .await
            .expect("real libostree stages");
        let deployment = |checksum: &str, serial: i32, staged: bool| Deployment {
            id: format!("rhcos-{checksum}.{serial}"),
            osname: "rhcos".into(),
            checksum: checksum.to_string(),
            serial,
            staged,
            booted: !staged,
            container_image_reference_digest: Some("sha256:00".into()),
            ..Deployment::default()
        };
        let staged = deployment(&name.checksum, name.serial, true);
        let booted = deployment(&host.booted().checksum, host.booted().serial, false);
        let sysroot = root.join("sysroot");
        verify_staged(
            &sysroot,
            &staged,
            &booted,
            &expectation(KernelVariant::Default, true),
        )
        .expect("the staged deployment passes");
        let other = deployment(&name.checksum, name.serial + 1, true);
        let err = verify_staged(
            &sysroot,
            &other,
            &booted,
            &expectation(KernelVariant::Default, false),
        )
        .expect_err("the record names another deployment");
        assert!(
            err.to_string().contains("is not in the ostree sysroot"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_or_broken_helper_is_a_clear_error() {
        let req = Request {
            sysroot: PathBuf::from("/nonexistent"),
            staged: Deployment::default(),
            booted: Deployment::default(),
            expect: Expectation {
                image_digest: String::new(),
                target_major: 10,
                kernel: KernelVariant::Default,
                fips: false,
            },
        };
        let err = in_helper(Path::new("/nonexistent/streamd-verify"), &req)
            .await
            .expect_err("no helper");
        assert!(
            err.to_string()
                .contains("cannot run the verification helper"),
            "{err}"
        );
        // A program that answers nothing is not a verdict.
        let err = in_helper(Path::new("/bin/true"), &req)
            .await
            .expect_err("no verdict");
        assert!(err.to_string().contains("/bin/true"), "{err}");
    }
}
