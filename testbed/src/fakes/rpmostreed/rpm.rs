//! Reading an RPM passed as a file descriptor (`install-local-packages`): its NEVRA, and its
//! Provides/Requires, which are kept in the fake's pkgcache for the depsolve
//! ([`super::depsolve`]), as rpm-ostree imports the package and reads its header back.
//!
//! A small header parse instead of `rpm -qp`, so the fake needs no rpm tools, and independent
//! of streamd's own reader (src/image/rpm.rs), so one cannot hide the other's mistake: the
//! lead (96 bytes), the signature header (padded to 8 bytes), then the main header's NAME,
//! EPOCH, VERSION, RELEASE, ARCH and the PROVIDE*/REQUIRE* arrays. Every offset is
//! bounds-checked: the descriptor comes from a D-Bus caller.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;

use super::depsolve::{self, Dep, Package};
use crate::fixtures::packages::Nevra;

const LEAD_LEN: u64 = 96;
const LEAD_MAGIC: [u8; 4] = [0xed, 0xab, 0xee, 0xdb];
const HEADER_MAGIC: [u8; 4] = [0x8e, 0xad, 0xe8, 0x01];
/// Headers larger than this are refused rather than read into memory.
const MAX_HEADER: u64 = 64 << 20;

/// The NEVRA in the RPM header of `fd` (read with `pread`, so the caller's offset is kept);
/// the package's dependencies go to the pkgcache.
pub(crate) fn read_nevra(fd: BorrowedFd<'_>) -> Result<Nevra, String> {
    let package = read_package(fd)?;
    let nevra = package.nevra.clone();
    depsolve::import(package);
    Ok(nevra)
}

/// The NEVRA and dependencies in the RPM header of `fd`.
fn read_package(fd: BorrowedFd<'_>) -> Result<Package, String> {
    let file = File::from(
        fd.try_clone_to_owned()
            .map_err(|e| format!("duplicating the descriptor: {e}"))?,
    );
    // Only a regular file can be read without blocking (a pipe or a tty could hang the call).
    let is_file = file
        .metadata()
        .map_err(|e| format!("inspecting the descriptor: {e}"))?
        .is_file();
    if !is_file {
        return Err("not a regular file".into());
    }
    let read = |offset: u64, len: u64| -> Result<Vec<u8>, String> {
        let len = usize::try_from(len).map_err(|_| "header too large".to_string())?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| format!("reading the RPM at offset {offset}: {e}"))?;
        Ok(buf)
    };
    let lead = read(0, LEAD_LEN)?;
    if lead[..4] != LEAD_MAGIC {
        return Err("not an RPM package (bad lead magic)".into());
    }
    let (sig_len, _) = header_at(&read, LEAD_LEN)?;
    // The signature header is padded to a multiple of 8 bytes.
    let main_at = LEAD_LEN + sig_len.div_ceil(8) * 8;
    let (_, main) = header_at(&read, main_at)?;
    let name = main.string(1000).ok_or("the RPM header has no NAME")?;
    let version = main.string(1001).ok_or("the RPM header has no VERSION")?;
    let release = main.string(1002).ok_or("the RPM header has no RELEASE")?;
    let arch = main.string(1022).ok_or("the RPM header has no ARCH")?;
    let epoch = main.int32(1003).unwrap_or(0);
    Ok(Package {
        nevra: Nevra {
            name,
            epoch: u64::from(epoch),
            version,
            release,
            arch,
        },
        // PROVIDENAME/FLAGS/VERSION and REQUIRENAME/FLAGS/VERSION.
        provides: main.deps(1047, 1112, 1113)?,
        requires: main.deps(1049, 1048, 1050)?,
    })
}

/// One parsed header: index entries (tag, type, offset, count) and the data store.
struct Header {
    entries: Vec<(u32, u32, usize, u32)>,
    data: Vec<u8>,
}

impl Header {
    fn entry(&self, tag: u32) -> Option<(u32, usize)> {
        self.entries
            .iter()
            .find(|e| e.0 == tag)
            .map(|&(_, ty, off, _)| (ty, off))
    }

    fn string(&self, tag: u32) -> Option<String> {
        let (ty, off) = self.entry(tag)?;
        // STRING (6) or I18NSTRING (9), NUL-terminated in the data store.
        if ty != 6 && ty != 9 {
            return None;
        }
        let rest = self.data.get(off..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        String::from_utf8(rest[..end].to_vec()).ok()
    }

    fn int32(&self, tag: u32) -> Option<u32> {
        self.int32s(tag)?.first().copied()
    }

    /// An INT32 (4) entry's values.
    fn int32s(&self, tag: u32) -> Option<Vec<u32>> {
        let &(_, ty, off, count) = self.entries.iter().find(|e| e.0 == tag)?;
        if ty != 4 {
            return None;
        }
        let len = usize::try_from(count).ok()?.checked_mul(4)?;
        let b = self.data.get(off..off.checked_add(len)?)?;
        Some(
            b.chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    /// A STRING_ARRAY (8) entry's strings, NUL-terminated one after the other.
    fn strings(&self, tag: u32) -> Option<Vec<String>> {
        let &(_, ty, off, count) = self.entries.iter().find(|e| e.0 == tag)?;
        if ty != 8 {
            return None;
        }
        let mut rest = self.data.get(off..)?;
        let mut out = Vec::new();
        for _ in 0..count {
            let end = rest.iter().position(|b| *b == 0)?;
            out.push(String::from_utf8(rest[..end].to_vec()).ok()?);
            rest = &rest[end + 1..];
        }
        Some(out)
    }

    /// The dependencies in the name/flags/version arrays `names`, `flags`, `versions` (none
    /// when the header has no such entry); `rpmlib(…)` ones are rpm's own and dropped.
    fn deps(&self, names: u32, flags: u32, versions: u32) -> Result<Vec<Dep>, String> {
        let Some(n) = self.strings(names) else {
            return Ok(Vec::new());
        };
        let f = self.int32s(flags).unwrap_or_default();
        let v = self.strings(versions).unwrap_or_default();
        if f.len() != n.len() || v.len() != n.len() {
            return Err("the RPM header's dependency arrays disagree in length".into());
        }
        Ok(n.into_iter()
            .zip(f)
            .zip(v)
            .filter(|((name, _), _)| !name.starts_with("rpmlib("))
            .map(|((name, flags), version)| Dep {
                name,
                flags,
                version,
            })
            .collect())
    }
}

/// The header at `offset`: its total length in bytes and its contents.
fn header_at(
    read: &impl Fn(u64, u64) -> Result<Vec<u8>, String>,
    offset: u64,
) -> Result<(u64, Header), String> {
    let intro = read(offset, 16)?;
    if intro[..4] != HEADER_MAGIC {
        return Err(format!("not an RPM package (bad header magic at {offset})"));
    }
    let be = |i: usize| u32::from_be_bytes([intro[i], intro[i + 1], intro[i + 2], intro[i + 3]]);
    let (count, size) = (u64::from(be(8)), u64::from(be(12)));
    let index_len = count * 16;
    if index_len + size > MAX_HEADER {
        return Err("the RPM header is too large".into());
    }
    let body = read(offset + 16, index_len + size)?;
    let index_len = usize::try_from(index_len).map_err(|_| "header too large".to_string())?;
    let mut entries = Vec::new();
    for chunk in body[..index_len].chunks_exact(16) {
        let w = |i: usize| u32::from_be_bytes([chunk[i], chunk[i + 1], chunk[i + 2], chunk[i + 3]]);
        let off = usize::try_from(w(8)).map_err(|_| "bad offset".to_string())?;
        entries.push((w(0), w(4), off, w(12)));
    }
    let data = body[index_len..].to_vec();
    Ok((16 + body.len() as u64, Header { entries, data }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::packages::fake_rpm;
    use crate::scratch::ScratchDir;
    use std::os::fd::AsFd;

    #[test]
    fn reads_the_nevra_of_a_fixture_rpm() {
        let dir = ScratchDir::new("rpm-header").expect("scratch dir");
        let nevra = Nevra::parse("usbguard-1:1.1.3-1.el10.x86_64").expect("nevra");
        let path = dir.join("u.rpm");
        std::fs::write(&path, fake_rpm(&nevra)).expect("write");
        let f = File::open(&path).expect("open");
        assert_eq!(read_nevra(f.as_fd()), Ok(nevra));
        let rt = Nevra::parse("kernel-rt-modules-6.12.0-1.el10.x86_64").expect("nevra");
        std::fs::write(&path, fake_rpm(&rt)).expect("write");
        let f = File::open(&path).expect("open");
        let pkg = read_package(f.as_fd()).expect("package");
        let shown: Vec<String> = pkg.requires.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            shown,
            [
                "kernel-uname-r = 6.12.0-1.el10.x86_64+rt",
                "kernel-rt-modules-core-uname-r = 6.12.0-1.el10.x86_64+rt"
            ]
        );
        assert_eq!(
            pkg.provides[0].to_string(),
            "kernel-rt-modules-uname-r = 6.12.0-1.el10.x86_64+rt"
        );
        std::fs::write(&path, b"not an rpm at all, but long enough to hold a lead of 96 bytes ......................................").expect("write");
        let f = File::open(&path).expect("open");
        assert!(read_nevra(f.as_fd()).is_err());
        let null = File::open("/dev/null").expect("null");
        assert!(read_nevra(null.as_fd()).is_err());
    }
}
