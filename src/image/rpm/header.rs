//! The lead and headers of an RPM file, read from an extensions layer while it streams, before
//! the layer's digest is checked: whoever controls the registry or the request chooses every
//! byte.
//!
//! Every structure is validated as librpm's `hdrblobInit` does (lib/header.cc: the intro's
//! counts, the region tag and its trailer, each entry's tag, type, count, alignment and offset
//! against the data store, entries in offset order without overlap, strings terminated) before
//! any of it is used. Each header's store is read once, front to back, and only the tags the
//! dependency closure needs are kept, so what one RPM holds is its index and those tags, within
//! [`HeaderLimits`] per image. No third-party parser sees the bytes: with every entry located and
//! checked, reading the few tags kept is a split on NUL, whereas the `rpm` crate (used before)
//! indexed its store at unchecked offsets, reserved what counts claimed, and copied whole headers.

use std::io::{BufRead, Read};

use super::{Dep, Op, ReaderNeeds, RpmHeader};

/// Limits on what the RPM headers of one image may make streamd read and keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderLimits {
    /// Largest signature header data store, bytes. Streamed, never held.
    pub max_signature: u32,
    /// Largest main header data store, bytes. Streamed; only the kept tags are held.
    pub max_main: u32,
    /// Most index entries of a main header (a signature header has at most 32, librpm's limit).
    pub max_tags: u32,
    /// Most header bytes read over all the RPMs of one image (leads and padding included).
    pub max_read: u64,
    /// Most bytes of kept tag data (NEVRA, Provides, Requires) over all the RPMs of one image.
    pub max_kept: u64,
    /// Most Provides and Requires kept over all the RPMs of one image.
    pub max_deps: u64,
}

/// The limits streamd reads with. The header sizes are librpm's for the signature header (IMA
/// file signatures live there) and the limit streamd had for both; the tag count is librpm's.
/// An extensions image has a few hundred RPMs; the most Provides are the kernel packages'
/// (a `kernel(symbol)` per exported symbol on RHEL), tens of thousands by estimate, a few MiB
/// kept: the image limits leave several times that. What one image keeps is then at most
/// `max_kept` bytes of strings and `max_deps` [`Dep`]s (56 bytes each on 64-bit hosts), about 30 MiB.
pub const HEADER_LIMITS: HeaderLimits = HeaderLimits {
    max_signature: 64 << 20,
    max_main: 64 << 20,
    max_tags: 0xffff,
    max_read: 512 << 20,
    max_kept: 16 << 20,
    max_deps: 1 << 18,
};

/// What is left of [`HeaderLimits`] while the RPMs of one image are read.
#[derive(Debug, Clone)]
pub struct HeaderBudget {
    limits: HeaderLimits,
    read: u64,
    kept: u64,
    deps: u64,
}

impl HeaderBudget {
    /// A full budget.
    pub fn new(limits: HeaderLimits) -> Self {
        HeaderBudget {
            limits,
            read: 0,
            kept: 0,
            deps: 0,
        }
    }

    fn take_read(&mut self, n: u64) -> Result<(), HeaderError> {
        self.read = self.read.saturating_add(n);
        if self.read > self.limits.max_read {
            return Err(invalid(format!(
                "the RPM headers of the image exceed {} bytes",
                self.limits.max_read
            )));
        }
        Ok(())
    }

    fn take_deps(&mut self, n: u32) -> Result<(), HeaderError> {
        self.deps = self.deps.saturating_add(u64::from(n));
        if self.deps > self.limits.max_deps {
            return Err(invalid(format!(
                "the RPMs of the image have more than {} Provides and Requires",
                self.limits.max_deps
            )));
        }
        Ok(())
    }
}

/// Why an RPM header could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The source failed (not the file's fault: a short file is [`HeaderError::Invalid`]).
    #[error("reading the RPM header: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with an RPM lead: it is no package at all.
    #[error("not an RPM package")]
    NotRpm,
    /// An RPM whose lead or headers are malformed, truncated or over a limit.
    #[error("malformed RPM header: {0}")]
    Invalid(String),
}

impl HeaderError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            HeaderError::Io(_) => "rpm-header-unreadable",
            HeaderError::NotRpm => "rpm-not-a-package",
            HeaderError::Invalid(_) => "rpm-header-malformed",
        }
    }
}

fn invalid(message: String) -> HeaderError {
    HeaderError::Invalid(message)
}

const LEAD: usize = 96;
const LEAD_MAGIC: [u8; 4] = [0xed, 0xab, 0xee, 0xdb];
/// Magic, version 1 and four reserved zero bytes, all compared as librpm does.
const HEADER_MAGIC: [u8; 8] = [0x8e, 0xad, 0xe8, 0x01, 0, 0, 0, 0];
/// An index entry, and a region trailer, which is one.
const ENTRY: u64 = 16;
/// librpm's `hdrblobVerifyLengths` for signature headers.
const SIGNATURE_TAGS: u32 = 32;
/// librpm's `HEADER_ARRAY_MAX`: most items of an entry other than `BIN`.
const ARRAY_MAX: u32 = 0xfffff;
/// Tags below this are region tags (only the first entry may be one) or invalid.
const FIRST_TAG: u32 = 100;
const HEADERIMAGE: u32 = 61;
const HEADERSIGNATURES: u32 = 62;
const HEADERIMMUTABLE: u32 = 63;

// The main header's tags that are kept (rpmtag.h).
const NAME: u32 = 1000;
const VERSION: u32 = 1001;
const RELEASE: u32 = 1002;
const EPOCH: u32 = 1003;
const ARCH: u32 = 1022;
const PROVIDENAME: u32 = 1047;
const REQUIREFLAGS: u32 = 1048;
const REQUIRENAME: u32 = 1049;
const REQUIREVERSION: u32 = 1050;
const PROVIDEFLAGS: u32 = 1112;
const PROVIDEVERSION: u32 = 1113;
const PAYLOADCOMPRESSOR: u32 = 1125;
/// rpm 6.0's package format version (rpm-6.0.0-release include/rpm/rpmtag.h).
const RPMFORMAT: u32 = 5114;
const KEPT_STRINGS: [u32; 9] = [
    NAME,
    VERSION,
    RELEASE,
    ARCH,
    PROVIDENAME,
    REQUIRENAME,
    REQUIREVERSION,
    PROVIDEVERSION,
    PAYLOADCOMPRESSOR,
];
const KEPT_INTS: [u32; 4] = [EPOCH, REQUIREFLAGS, PROVIDEFLAGS, RPMFORMAT];

/// Tag data types (rpmtag.h `rpmTagType_e`); `NULL` (0) is never valid on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Char = 1,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    Bin,
    StringArray,
    I18nString,
}

impl Type {
    fn new(raw: u32) -> Option<Type> {
        Some(match raw {
            1 => Type::Char,
            2 => Type::Int8,
            3 => Type::Int16,
            4 => Type::Int32,
            5 => Type::Int64,
            6 => Type::String,
            7 => Type::Bin,
            8 => Type::StringArray,
            9 => Type::I18nString,
            _ => return None,
        })
    }

    /// The size of one item; `None` for strings, whose length is found by their NULs.
    fn size(self) -> Option<u64> {
        match self {
            Type::Char | Type::Int8 | Type::Bin => Some(1),
            Type::Int16 => Some(2),
            Type::Int32 => Some(4),
            Type::Int64 => Some(8),
            Type::String | Type::StringArray | Type::I18nString => None,
        }
    }
}

/// One index entry, in host order.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tag: u32,
    ty: u32,
    offset: i32,
    count: u32,
}

/// The big-endian word at `i` (zero past the end of `b`, which callers never reach).
fn word(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(i..i + 4) {
        w.copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

impl Entry {
    fn parse(b: &[u8]) -> Entry {
        Entry {
            tag: word(b, 0),
            ty: word(b, 4),
            offset: i32::from_be_bytes(word(b, 8).to_be_bytes()),
            count: word(b, 12),
        }
    }
}

/// Which of an RPM's two headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Signature,
    Main,
}

impl Which {
    fn region(self) -> u32 {
        match self {
            Which::Signature => HEADERSIGNATURES,
            Which::Main => HEADERIMMUTABLE,
        }
    }
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Which::Signature => "signature header",
            Which::Main => "main header",
        })
    }
}

/// A kept entry: tag, type, count and its data.
type Kept = (u32, Type, u32, Vec<u8>);

/// `buf.len()` bytes, or [`HeaderError::Invalid`] naming `what` if the file ends first.
fn exact(
    r: &mut impl Read,
    buf: &mut [u8],
    what: impl std::fmt::Display,
) -> Result<(), HeaderError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => invalid(format!("{what} is truncated")),
        _ => HeaderError::Io(e),
    })
}

/// The data store of one header, read once from front to back: librpm requires the entries in
/// offset order, so each is read (and dropped, unless kept) as the stream reaches it.
struct Store<'r, R> {
    r: &'r mut R,
    which: Which,
    pos: u64,
}

impl<R: BufRead> Store<'_, R> {
    fn truncated(&self) -> HeaderError {
        invalid(format!("the {} is truncated", self.which))
    }

    /// Reads on to `at`, keeping what it read in `out` when given.
    fn to(&mut self, at: u64, out: Option<&mut Vec<u8>>) -> Result<(), HeaderError> {
        // Checked for every entry before; a stream cannot go back, so never read from elsewhere.
        let Some(n) = at.checked_sub(self.pos) else {
            return Err(invalid(format!("the {} overlaps itself", self.which)));
        };
        let mut part = self.r.by_ref().take(n);
        let got = match out {
            Some(v) => part.read_to_end(v)? as u64,
            None => std::io::copy(&mut part, &mut std::io::sink())?,
        };
        if got < n {
            return Err(self.truncated());
        }
        self.pos = at;
        Ok(())
    }

    /// Reads `count` NUL-terminated strings ending at `limit` at the latest, keeping them in
    /// `out` when given; whether they ended by then.
    fn strings(
        &mut self,
        mut count: u32,
        limit: u64,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<bool, HeaderError> {
        while count > 0 {
            let room = usize::try_from(limit.saturating_sub(self.pos)).unwrap_or(usize::MAX);
            if room == 0 {
                return Ok(false);
            }
            let buf = self.r.fill_buf()?;
            if buf.is_empty() {
                return Err(self.truncated());
            }
            let buf = &buf[..buf.len().min(room)];
            let mut used = buf.len();
            for (i, _) in buf.iter().enumerate().filter(|(_, b)| **b == 0) {
                count -= 1;
                if count == 0 {
                    used = i + 1;
                    break;
                }
            }
            if let Some(v) = out.as_deref_mut() {
                v.extend_from_slice(&buf[..used]);
            }
            self.r.consume(used);
            self.pos += used as u64;
        }
        Ok(true)
    }
}

/// Reads one header (intro, index, data store, and the signature header's padding) and returns
/// the kept entries (of the main header only), checking each structure before reading past it.
fn read_header(
    r: &mut impl BufRead,
    which: Which,
    budget: &mut HeaderBudget,
) -> Result<Vec<Kept>, HeaderError> {
    let mut intro = [0u8; 16];
    exact(r, &mut intro, format_args!("the {which}"))?;
    if intro[..8] != HEADER_MAGIC {
        return Err(invalid(format!("bad {which} magic")));
    }
    let (il, dl) = (word(&intro, 8), word(&intro, 12));
    let limits = budget.limits;
    let (max_il, max_dl) = match which {
        Which::Signature => (SIGNATURE_TAGS, limits.max_signature),
        Which::Main => (limits.max_tags, limits.max_main),
    };
    if il == 0 || il > max_il {
        return Err(invalid(format!(
            "the {which} claims {il} index entries (1 to {max_il})"
        )));
    }
    if dl > max_dl {
        return Err(invalid(format!(
            "the {which} claims {dl} bytes of data (at most {max_dl})"
        )));
    }
    let pad = match which {
        Which::Signature => (8 - u64::from(dl) % 8) % 8,
        Which::Main => 0,
    };
    budget.take_read(16 + ENTRY * u64::from(il) + u64::from(dl) + pad)?;
    // Grown as the bytes arrive: a claim alone allocates nothing.
    let mut index = Vec::new();
    r.by_ref()
        .take(ENTRY * u64::from(il))
        .read_to_end(&mut index)?;
    if index.len() as u64 != ENTRY * u64::from(il) {
        return Err(invalid(format!("the {which} index is truncated")));
    }
    let rdl = region(&Entry::parse(&index), which, dl)?;
    let mut store = Store { r, which, pos: 0 };
    let mut kept = Vec::new();
    let mut trailer_read = false;
    for (i, e) in index.chunks_exact(16).map(Entry::parse).enumerate().skip(1) {
        let bad = |why: &str| {
            invalid(format!(
                "{which} entry {i} (tag {} type {} offset {} count {}): {why}",
                e.tag, e.ty, e.offset, e.count
            ))
        };
        let (ty, offset) = check_entry(&e, which, dl, store.pos).map_err(bad)?;
        if !trailer_read && offset >= rdl {
            trailer(&mut store, il, which, dl, rdl)?;
            trailer_read = true;
        }
        // Data before the trailer ends before it; after it, by the end of the store.
        let limit = if offset < rdl {
            rdl - ENTRY
        } else {
            u64::from(dl)
        };
        let keep = which == Which::Main && is_kept(e.tag);
        if keep && matches!(e.tag, PROVIDENAME | REQUIRENAME) {
            budget.take_deps(e.count)?;
        }
        let kept_left = limits.max_kept.saturating_sub(budget.kept);
        let mut data = Vec::new();
        store.to(offset, None)?;
        match ty.size() {
            Some(size) => {
                let end = offset + size * u64::from(e.count);
                if end > limit {
                    return Err(bad("data past the end of its region"));
                }
                if keep && end - offset > kept_left {
                    return Err(over_kept(limits));
                }
                store.to(end, keep.then_some(&mut data))?;
            }
            None => {
                let kept_limit = if keep {
                    limit.min(offset.saturating_add(kept_left))
                } else {
                    limit
                };
                if !store.strings(e.count, kept_limit, keep.then_some(&mut data))? {
                    return Err(if kept_limit < limit {
                        over_kept(limits)
                    } else {
                        bad("strings not terminated within its region")
                    });
                }
            }
        }
        if keep {
            budget.kept += data.len() as u64;
            kept.push((e.tag, ty, e.count, data));
        }
    }
    if !trailer_read {
        trailer(&mut store, il, which, dl, rdl)?;
    }
    store.to(u64::from(dl) + pad, None)?;
    Ok(kept)
}

fn over_kept(limits: HeaderLimits) -> HeaderError {
    invalid(format!(
        "the RPMs of the image have more than {} bytes of names and dependencies",
        limits.max_kept
    ))
}

fn is_kept(tag: u32) -> bool {
    KEPT_STRINGS.contains(&tag) || KEPT_INTS.contains(&tag)
}

/// Checks an entry other than the region tag against the store as librpm's `hdrblobVerifyInfo`
/// does, given where the previous entry's data ended; its type and offset.
fn check_entry(e: &Entry, which: Which, dl: u32, end: u64) -> Result<(Type, u64), &'static str> {
    let ty = Type::new(e.ty).ok_or("unknown type")?;
    if e.tag < FIRST_TAG {
        return Err("a region tag or reserved tag number");
    }
    if e.count == 0 || e.count > dl {
        return Err("count out of range");
    }
    if ty != Type::Bin && e.count > ARRAY_MAX {
        return Err("more items than an array may have");
    }
    if ty == Type::String && e.count != 1 {
        return Err("a string entry of more than one string");
    }
    let offset = u64::try_from(e.offset).map_err(|_| "negative offset")?;
    if offset > u64::from(dl) {
        return Err("offset past the data store");
    }
    if offset < end {
        return Err("data overlapping the previous entry's");
    }
    let align = ty.size().filter(|_| ty != Type::Bin).unwrap_or(1);
    if offset % align != 0 {
        return Err("misaligned data");
    }
    // librpm checks the types of the tags it knows in the main header; these are the ones read.
    let type_ok = if KEPT_INTS.contains(&e.tag) {
        ty == Type::Int32
    } else if KEPT_STRINGS.contains(&e.tag) {
        ty.size().is_none()
    } else {
        true
    };
    if which == Which::Main && !type_ok {
        return Err("the wrong type for its tag");
    }
    Ok((ty, offset))
}

/// Checks the region tag (the first entry: `BIN`, 16 bytes, pointing at the trailer within the
/// store); where the region's data ends.
fn region(first: &Entry, which: Which, dl: u32) -> Result<u64, HeaderError> {
    let trailer_at = u64::try_from(first.offset).ok();
    match trailer_at {
        Some(at)
            if first.tag == which.region()
                && first.ty == Type::Bin as u32
                && u64::from(first.count) == ENTRY
                && at + ENTRY <= u64::from(dl) =>
        {
            Ok(at + ENTRY)
        }
        _ => Err(invalid(format!(
            "bad {which} region tag (tag {} type {} offset {} count {})",
            first.tag, first.ty, first.offset, first.count
        ))),
    }
}

/// Reads and checks the region trailer, which ends the region's data at `rdl`: the region's tag,
/// `BIN`, 16 bytes, and minus the size of the region's index entries. The main header's region
/// is the whole header, as librpm requires of package files.
fn trailer<R: BufRead>(
    store: &mut Store<'_, R>,
    il: u32,
    which: Which,
    dl: u32,
    rdl: u64,
) -> Result<(), HeaderError> {
    store.to(rdl - ENTRY, None)?;
    let mut raw = [0u8; 16];
    exact(store.r, &mut raw, format_args!("the {which}"))?;
    store.pos = rdl;
    let t = Entry::parse(&raw);
    // Some old packages have HEADERIMAGE in the signature trailer; librpm accepts it.
    let tag = match (which, t.tag) {
        (Which::Signature, HEADERIMAGE) => HEADERSIGNATURES,
        (_, tag) => tag,
    };
    let back = -i64::from(t.offset);
    let ril = back / ENTRY as i64;
    let fits = back > 0 && back % ENTRY as i64 == 0 && ril <= i64::from(il);
    let whole = which == Which::Signature || (ril == i64::from(il) && rdl == u64::from(dl));
    if tag != which.region()
        || t.ty != Type::Bin as u32
        || u64::from(t.count) != ENTRY
        || !fits
        || !whole
    {
        return Err(invalid(format!(
            "bad {which} region trailer (tag {} type {} offset {} count {})",
            t.tag, t.ty, t.offset, t.count
        )));
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes; how many there were.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, HeaderError> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

/// Reads the lead and both headers at the start of `reader`, leaving the payload unread, and
/// returns what the closure needs from the main header.
pub(super) fn read(
    reader: impl Read,
    file: &str,
    budget: &mut HeaderBudget,
) -> Result<RpmHeader, HeaderError> {
    let mut r = std::io::BufReader::with_capacity(64 << 10, reader);
    let mut lead = [0u8; LEAD];
    let n = read_up_to(&mut r, &mut lead)?;
    if n < LEAD_MAGIC.len() || lead[..LEAD_MAGIC.len()] != LEAD_MAGIC {
        return Err(HeaderError::NotRpm);
    }
    if n < LEAD {
        return Err(invalid("the lead is truncated".into()));
    }
    budget.take_read(LEAD as u64)?;
    read_header(&mut r, Which::Signature, budget)?;
    let kept = read_header(&mut r, Which::Main, budget)?;
    decode(&kept, file)
}

/// The strings of a kept string entry (all of them NUL-terminated, as checked).
fn strings(kept: &[Kept], tag: u32) -> Result<Option<Vec<String>>, HeaderError> {
    let Some((_, _, count, data)) = kept.iter().find(|k| k.0 == tag) else {
        return Ok(None);
    };
    data.split(|b| *b == 0)
        .take(*count as usize)
        .map(|s| {
            String::from_utf8(s.to_vec())
                .map_err(|_| invalid(format!("tag {tag} holds a string that is not UTF-8")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The integers of a kept `INT32` entry.
fn ints(kept: &[Kept], tag: u32) -> Option<Vec<u32>> {
    let (_, ty, _, data) = kept.iter().find(|k| k.0 == tag)?;
    (*ty == Type::Int32).then(|| {
        data.chunks_exact(4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    })
}

/// One dependency list from its names, flags (`RPMSENSE_LESS|GREATER|EQUAL`) and versions tags.
fn deps(kept: &[Kept], [names, flags, versions]: [u32; 3]) -> Result<Vec<Dep>, HeaderError> {
    match (
        strings(kept, names)?,
        ints(kept, flags),
        strings(kept, versions)?,
    ) {
        (None, None, None) => Ok(Vec::new()),
        (Some(n), Some(f), Some(v)) if n.len() == f.len() && f.len() == v.len() => Ok(n
            .into_iter()
            .zip(f)
            .zip(v)
            .map(|((name, f), evr)| {
                let op = match (f & 2 != 0, f & 4 != 0, f & 8 != 0) {
                    (true, false, false) => Some(Op::Lt),
                    (true, false, true) => Some(Op::Le),
                    (false, false, true) => Some(Op::Eq),
                    (false, true, true) => Some(Op::Ge),
                    (false, true, false) => Some(Op::Gt),
                    _ => None,
                };
                Dep {
                    name,
                    version: op.filter(|_| !evr.is_empty()).map(|o| (o, evr)),
                }
            })
            .collect()),
        _ => Err(invalid(format!(
            "tags {names}, {flags} and {versions} do not list the same dependencies"
        ))),
    }
}

fn decode(kept: &[Kept], file: &str) -> Result<RpmHeader, HeaderError> {
    let one = |tag: u32| -> Result<String, HeaderError> {
        strings(kept, tag)?
            .and_then(|v| v.into_iter().next())
            .ok_or_else(|| invalid(format!("no tag {tag}")))
    };
    // `rpmlib(…)` Requires are what the package needs of rpm itself, not of other packages.
    let (rpmlib, requires) = deps(kept, [REQUIRENAME, REQUIREFLAGS, REQUIREVERSION])?
        .into_iter()
        .partition(|d| d.name.starts_with("rpmlib("));
    Ok(RpmHeader {
        file: file.to_string(),
        name: one(NAME)?,
        epoch: ints(kept, EPOCH)
            .and_then(|v| v.first().copied())
            .unwrap_or(0),
        version: one(VERSION)?,
        release: one(RELEASE)?,
        arch: one(ARCH)?,
        provides: deps(kept, [PROVIDENAME, PROVIDEFLAGS, PROVIDEVERSION])?,
        requires,
        needs: ReaderNeeds {
            rpmlib,
            payload_compressor: strings(kept, PAYLOADCOMPRESSOR)?
                .and_then(|v| v.into_iter().next()),
            format: ints(kept, RPMFORMAT).and_then(|v| v.first().copied()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_bytes(bytes: &[u8]) -> Result<RpmHeader, HeaderError> {
        read(bytes, "x.rpm", &mut HeaderBudget::new(HEADER_LIMITS))
    }

    fn lead() -> Vec<u8> {
        let mut lead = vec![0u8; LEAD];
        lead[..4].copy_from_slice(&LEAD_MAGIC);
        lead
    }

    fn intro(il: u32, dl: u32) -> Vec<u8> {
        let mut out = HEADER_MAGIC.to_vec();
        out.extend(il.to_be_bytes());
        out.extend(dl.to_be_bytes());
        out
    }

    #[test]
    fn files_without_a_lead_are_no_rpms() {
        for bytes in [&b""[..], b"ed", b"not an rpm", &[0u8; 200]] {
            assert!(
                matches!(read_bytes(bytes), Err(HeaderError::NotRpm)),
                "{bytes:?}"
            );
        }
        let short = &lead()[..50];
        match read_bytes(short) {
            Err(HeaderError::Invalid(m)) => assert!(m.contains("lead is truncated"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn claims_past_the_limits_are_refused_before_reading_on() {
        for (il, dl, says) in [
            (u32::MAX, 0, "claims 4294967295 index entries"),
            (33, 0, "claims 33 index entries (1 to 32)"),
            (0, 0, "claims 0 index entries"),
            (1, u32::MAX, "claims 4294967295 bytes of data"),
            (1, (64 << 20) + 1, "at most 67108864"),
        ] {
            let mut bytes = lead();
            bytes.extend(intro(il, dl));
            match read_bytes(&bytes) {
                Err(HeaderError::Invalid(m)) => assert!(m.contains(says), "{m}"),
                other => panic!("{il} {dl}: {other:?}"),
            }
        }
        let mut limits = HEADER_LIMITS;
        limits.max_read = 1000;
        let mut bytes = lead();
        bytes.extend(intro(1, 1000));
        match read(&bytes[..], "x.rpm", &mut HeaderBudget::new(limits)) {
            Err(HeaderError::Invalid(m)) => assert!(m.contains("exceed 1000 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
