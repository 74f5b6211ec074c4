//! Malformed, truncated and oversized RPM headers, thrown at the function preflight reads an
//! extensions layer's RPMs with (`rpms_in_layer`). None may panic, abort or allocate past a small
//! bound, and each is refused with an error naming the file.
//!
//! The property test runs 1024 cases: 0.4 s in the debug profile on an idle 2-core machine, about
//! 3 s on a busy one; `STREAMD_FUZZ_SCALE=N` multiplies them for a longer local soak, as in
//! `tests/fuzz_parsers/`.

// The one place unsafe code is allowed: a counting GlobalAlloc over System, to bound what a
// header read allocates.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};

use streamd::image::registry::{
    EXTENSIONS_DIR, EXTRACT_LIMITS, ExtractBudget, ExtractLimits, LayerRpms, rpms_in_layer,
};
use streamd::image::rpm::{HEADER_LIMITS, HeaderLimits};

// ---- what one call allocates -----------------------------------------------------------------

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting per thread what is live, its peak and the largest request, so
/// a test can bound what one call holds while other tests run beside it.
struct Counting;

fn counted(grown: usize, freed: usize) {
    // `try_with`: a thread being torn down has no counters left, and what it frees is not ours.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_sub(freed).saturating_add(grown);
        live.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        let _ = LARGEST.try_with(|l| l.set(l.get().max(grown)));
    });
}

// SAFETY: every call goes to `System` unchanged; the counters are `Cell<usize>` thread-locals
// with const initialisers, which neither allocate nor register destructors.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size(), 0);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(layout.size(), 0);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        counted(0, layout.size());
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(new_size, layout.size());
        // SAFETY: as for `dealloc`; the caller upholds `realloc`'s contract on `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returned, the most it held at once beyond what was live before, and its largest
/// single request, in bytes.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(before));
    LARGEST.with(|l| l.set(0));
    let out = f();
    let peak = PEAK.with(Cell::get).saturating_sub(before);
    (out, peak, LARGEST.with(Cell::get))
}

// ---- RPMs built from their parts -------------------------------------------------------------

// Tag types and numbers from rpm's rpmtag.h.
const INT16: u32 = 3;
const INT32: u32 = 4;
const INT64: u32 = 5;
const STRING: u32 = 6;
const BIN: u32 = 7;
const STRING_ARRAY: u32 = 8;
const SIGNATURES: u32 = 62;
const IMMUTABLE: u32 = 63;

/// One header as its parts, so a test can break any of them: the counts its intro claims, the
/// index entries (tag, type, offset, count; the region entry first) and the data store.
#[derive(Debug, Clone)]
struct Header {
    magic: [u8; 8],
    il: u32,
    dl: u32,
    index: Vec<[u32; 4]>,
    store: Vec<u8>,
}

impl Header {
    /// A well-formed header: one immutable region `region` holding `tags` (tag, type, count,
    /// data), in the order given, each aligned for its type; the region trailer ends the store.
    fn new(region: u32, tags: &[(u32, u32, u32, Vec<u8>)]) -> Header {
        let mut index = vec![[region, BIN, 0, 16]];
        let mut store = Vec::new();
        for (tag, ty, count, data) in tags {
            let align = match *ty {
                INT16 => 2,
                INT32 => 4,
                INT64 => 8,
                _ => 1,
            };
            store.resize(store.len().next_multiple_of(align), 0);
            index.push([*tag, *ty, store.len() as u32, *count]);
            store.extend_from_slice(data);
        }
        index[0][2] = store.len() as u32;
        // The trailer's offset is minus the region's index size.
        let back = 0u32.wrapping_sub(index.len() as u32 * 16);
        for v in [region, BIN, back, 16] {
            store.extend_from_slice(&v.to_be_bytes());
        }
        Header {
            magic: [0x8e, 0xad, 0xe8, 1, 0, 0, 0, 0],
            il: index.len() as u32,
            dl: store.len() as u32,
            index,
            store,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend(self.il.to_be_bytes());
        out.extend(self.dl.to_be_bytes());
        for v in self.index.iter().flatten() {
            out.extend(v.to_be_bytes());
        }
        out.extend(&self.store);
        out
    }

    /// The index entry of `tag`.
    fn entry_ref(&self, tag: u32) -> &[u32; 4] {
        self.index
            .iter()
            .skip(1)
            .find(|e| e[0] == tag)
            .expect("tag in the header")
    }

    /// The index entry of `tag`, to change.
    fn entry(&mut self, tag: u32) -> &mut [u32; 4] {
        self.index
            .iter_mut()
            .skip(1)
            .find(|e| e[0] == tag)
            .expect("tag in the header")
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn cstrs(list: &[&str]) -> Vec<u8> {
    list.iter().flat_map(|s| cstr(s)).collect()
}

fn be32s(list: &[u32]) -> Vec<u8> {
    list.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// The package every test starts from, and its file in the layer.
const NAME: &str = "foo";
const FILE: &str = "foo-1.0-1.el10.x86_64.rpm";

/// A main header as rpmbuild writes one: NEVRA, Provides, Requires (with the `rpmlib(…)`
/// features it needs of rpm), the payload compressor, the encoding.
fn main_header() -> Header {
    Header::new(
        IMMUTABLE,
        &[
            (1000, STRING, 1, cstr(NAME)),
            (1001, STRING, 1, cstr("1.0")),
            (1002, STRING, 1, cstr("1.el10")),
            (1022, STRING, 1, cstr("x86_64")),
            (
                1047,
                STRING_ARRAY,
                2,
                cstrs(&[NAME, "libfoo.so.1()(64bit)"]),
            ),
            // RPMSENSE_RPMLIB|LESS|EQUAL for rpmlib(…), as rpmbuild's `rpmlibNeedsFeature`.
            (1048, INT32, 3, be32s(&[0, 12, (1 << 24) | 10])),
            (
                1049,
                STRING_ARRAY,
                3,
                cstrs(&["/bin/sh", "bar", "rpmlib(PayloadIsZstd)"]),
            ),
            (1050, STRING_ARRAY, 3, cstrs(&["", "2.0", "5.4.18-1"])),
            (1112, INT32, 2, be32s(&[8, 0])),
            (1113, STRING_ARRAY, 2, cstrs(&["1.0-1.el10", ""])),
            (1125, STRING, 1, cstr("zstd")),
            (5062, STRING, 1, cstr("utf-8")),
        ],
    )
}

/// A signature header: SHA256 of the main header, and the header-plus-payload size.
fn signature_header() -> Header {
    Header::new(
        SIGNATURES,
        &[
            (273, STRING, 1, cstr(&"a".repeat(64))),
            (1000, INT32, 1, be32s(&[4096])),
        ],
    )
}

/// Lead, signature header padded to 8 bytes (by the size it claims), main header; no payload.
fn rpm(sig: &Header, main: &Header) -> Vec<u8> {
    // Magic, version 3.0, binary, archnum 1, a 66-byte name, osnum 1, signature type 5.
    let mut out = vec![0xed, 0xab, 0xee, 0xdb, 3, 0, 0, 0, 0, 1];
    out.resize(76, 0);
    out.extend([0, 1, 0, 5]);
    out.resize(96, 0);
    out.extend(sig.bytes());
    out.resize(out.len() + (8 - sig.dl as usize % 8) % 8, 0);
    out.extend(main.bytes());
    out
}

/// An uncompressed layer holding `files` (name, data) in the extensions directory.
fn layer_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("{EXTENSIONS_DIR}{name}"), &data[..])
            .expect("append");
    }
    b.into_inner().expect("tar")
}

/// A layer holding `data` as [`FILE`].
fn layer(data: &[u8]) -> Vec<u8> {
    layer_of(&[(FILE.to_string(), data.to_vec())])
}

/// Reads `layer` as preflight does, in a scratch directory; `wanted` extracts the RPMs first
/// (their headers are then read from the files), else their headers are read from the stream.
fn read(layer: &[u8], wanted: bool, limits: ExtractLimits) -> std::io::Result<LayerRpms> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dest = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "rpm-headers-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dest).expect("mkdir");
    let wanted: Vec<String> = if wanted { vec![NAME.into()] } else { vec![] };
    let out = rpms_in_layer(
        layer,
        "application/vnd.oci.image.layer.v1.tar",
        &wanted,
        Some(&dest),
        &mut ExtractBudget::new(limits),
    );
    let _ = std::fs::remove_dir_all(&dest);
    out
}

/// Most that reading one small layer may hold at once, and ask for at once: the 64 KiB read
/// buffer, the tar reader's, an RPM's index and kept tags.
const MAX_PEAK: usize = 512 << 10;
const MAX_REQUEST: usize = 80 << 10;

/// Asserts that `data` as the layer's RPM is refused naming the file, both from the stream and
/// from the extracted file, within [`MAX_PEAK`] and [`MAX_REQUEST`]; `what` names the case.
fn assert_refused(what: &str, data: &[u8]) {
    for wanted in [false, true] {
        let (res, peak, largest) = measured(|| read(&layer(data), wanted, EXTRACT_LIMITS));
        match res {
            Err(e) => assert!(e.to_string().contains(FILE), "{what}: {e}"),
            Ok((_, _, headers)) => panic!("{what}: accepted, read {headers:?}"),
        }
        assert!(peak < MAX_PEAK, "{what}: held {peak} bytes at once");
        assert!(
            largest < MAX_REQUEST,
            "{what}: asked for {largest} bytes at once"
        );
    }
}

#[test]
fn a_well_formed_rpm_is_read() {
    let (_, _, headers) = read(
        &layer(&rpm(&signature_header(), &main_header())),
        false,
        EXTRACT_LIMITS,
    )
    .expect("read");
    let [h] = &headers[..] else {
        panic!("{headers:?}")
    };
    assert_eq!(h.nevra(), "foo-1.0-1.el10.x86_64");
    let deps = |d: &[streamd::image::rpm::Dep]| d.iter().map(|d| d.to_string()).collect::<Vec<_>>();
    assert_eq!(
        deps(&h.provides),
        ["foo = 1.0-1.el10", "libfoo.so.1()(64bit)"]
    );
    assert_eq!(deps(&h.requires), ["/bin/sh", "bar >= 2.0"]);
    assert_eq!(deps(&h.needs.rpmlib), ["rpmlib(PayloadIsZstd) <= 5.4.18-1"]);
    assert_eq!(h.needs.payload_compressor.as_deref(), Some("zstd"));
    assert_eq!(h.needs.format, None);
}

#[test]
fn an_entry_pointing_outside_its_store_is_refused() {
    // The `rpm` crate slices its store at every entry's offset unchecked: these panicked.
    for (what, offset) in [
        ("offset past the store", 1 << 20),
        ("negative offset", (-16i32) as u32),
    ] {
        let mut main = main_header();
        main.entry(1002)[2] = offset;
        assert_refused(what, &rpm(&signature_header(), &main));
    }
}

#[test]
fn an_entry_claiming_gigabytes_is_refused_without_allocating_them() {
    // The `rpm` crate reserves an integer entry's count before reading it: 4G 64-bit integers
    // are 32 GiB, and failing to allocate them aborted the process.
    let mut main = main_header();
    *main.entry(1048) = [1048, INT64, main.entry(1048)[2], u32::MAX];
    assert_refused("INT64 entry of 4G items", &rpm(&signature_header(), &main));
}

/// A case of the table: what it breaks, and how.
type Breaking = (&'static str, fn(&mut Header, &mut Header));

#[test]
fn malformed_headers_are_refused_naming_the_file() {
    let cases: &[Breaking] = &[
        ("intro claims 4G entries", |_, m| m.il = u32::MAX),
        ("intro claims no entries", |_, m| m.il = 0),
        ("intro claims 4 GiB of data", |_, m| m.dl = u32::MAX),
        ("intro claims more data than there is", |_, m| m.dl += 64),
        ("signature header of 33 entries", |s, _| s.il = 33),
        ("signature data past 64 MiB", |s, _| s.dl = (64 << 20) + 8),
        ("bad header magic", |_, m| m.magic[2] = 0xe9),
        ("header version 2", |s, _| s.magic[3] = 2),
        ("reserved bytes set", |_, m| m.magic[7] = 1),
        ("type 0", |_, m| m.entry(1001)[1] = 0),
        ("type 10", |_, m| m.entry(1001)[1] = 10),
        ("type u32::MAX", |s, _| s.entry(1000)[1] = u32::MAX),
        ("count 0", |_, m| m.entry(1049)[3] = 0),
        ("count past the store", |_, m| m.entry(1049)[3] = 1 << 20),
        ("string of two strings", |_, m| m.entry(1000)[3] = 2),
        ("more strings than there are", |_, m| m.entry(1047)[3] = 3),
        ("int32 entry past its region", |_, m| m.entry(1112)[3] = 20),
        ("misaligned int32", |_, m| m.entry(1048)[2] -= 1),
        ("entries overlapping", |_, m| {
            m.entry(1002)[2] = m.entry(1001)[2]
        }),
        ("entries out of order", |_, m| m.index.swap(1, 2)),
        ("array of 2^20 items", |_, m| m.entry(1047)[3] = 1 << 20),
        ("NAME typed INT32", |_, m| m.entry(1000)[1] = INT32),
        ("REQUIREFLAGS typed INT16", |_, m| m.entry(1048)[1] = INT16),
        ("tag number of a region", |_, m| m.entry(1022)[0] = 62),
        ("unterminated string", |_, m| {
            let at = m.entry(5062)[2] as usize;
            m.store[at + 5] = b'x';
        }),
        ("no region tag", |_, m| m.index[0][0] = 1000),
        ("region tag of the signature header", |_, m| {
            m.index[0][0] = 62
        }),
        ("region tag not BIN", |s, _| s.index[0][1] = STRING),
        ("region tag count 15", |_, m| m.index[0][3] = 15),
        ("region trailer past the store", |_, m| m.index[0][2] = m.dl),
        ("region trailer of another tag", |_, m| {
            let at = m.store.len() - 13;
            m.store[at] = 62;
        }),
        ("region smaller than the main header", |_, m| {
            let at = m.store.len() - 8;
            m.store[at..at + 4].copy_from_slice(&(-32i32).to_be_bytes());
        }),
        ("region claiming more entries than there are", |s, _| {
            let at = s.store.len() - 8;
            s.store[at..at + 4].copy_from_slice(&(-64i32 * 16).to_be_bytes());
        }),
        ("NAME not UTF-8", |_, m| {
            let at = m.entry(1000)[2] as usize;
            m.store[at] = 0xff;
        }),
        ("no NAME", |_, m| m.entry(1000)[0] = 999_999),
        ("Provides without flags", |_, m| m.entry(1112)[0] = 1111),
        ("Provides flags of another count", |_, m| {
            m.entry(1112)[3] = 1
        }),
    ];
    for (what, breaks) in cases {
        let (mut sig, mut main) = (signature_header(), main_header());
        breaks(&mut sig, &mut main);
        assert_refused(what, &rpm(&sig, &main));
    }
    let whole = rpm(&signature_header(), &main_header());
    for cut in [4, 95, 96, 100, 112, 200, whole.len() - 17, whole.len() - 1] {
        assert_refused(&format!("cut at {cut}"), &whole[..cut]);
    }
}

#[test]
fn the_headers_of_an_image_are_counted_across_its_rpms() {
    let one = rpm(&signature_header(), &main_header());
    let copies: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|k| (format!("foo-1.0-{k}.el10.x86_64.rpm"), one.clone()))
        .collect();
    // Room for two RPMs' headers, not three: the third is refused, by name.
    let limits = |headers: HeaderLimits| ExtractLimits {
        rpm_headers: headers,
        ..EXTRACT_LIMITS
    };
    let read_bytes = 2 * one.len() as u64;
    for (what, headers) in [
        (
            "bytes read",
            HeaderLimits {
                max_read: read_bytes,
                ..HEADER_LIMITS
            },
        ),
        (
            "dependencies",
            HeaderLimits {
                // Two Provides and three Requires each.
                max_deps: 10,
                ..HEADER_LIMITS
            },
        ),
        (
            "bytes kept",
            HeaderLimits {
                max_kept: 2 * kept(&main_header()),
                ..HEADER_LIMITS
            },
        ),
    ] {
        let e = read(&layer_of(&copies), false, limits(headers)).expect_err(what);
        assert!(e.to_string().contains("foo-1.0-3.el10"), "{what}: {e}");
        let two = read(&layer_of(&copies[..2]), false, limits(headers)).expect(what);
        assert_eq!(two.2.len(), 2, "{what}");
    }
}

/// The main header's tags that are kept: NEVRA, Provides and Requires, the payload compressor
/// and rpm 6's package format.
const KEPT: [u32; 13] = [
    1000, 1001, 1002, 1003, 1022, 1047, 1048, 1049, 1050, 1112, 1113, 1125, 5114,
];

/// Bytes of kept tag data in `main`: integers by their count, strings to their last NUL.
fn kept(main: &Header) -> u64 {
    main.index[1..]
        .iter()
        .filter(|e| KEPT.contains(&e[0]))
        .map(|e| match e[1] {
            INT32 => 4 * u64::from(e[3]),
            _ => {
                let data = &main.store[e[2] as usize..];
                let mut nuls = data.iter().enumerate().filter(|(_, b)| **b == 0);
                nuls.nth(e[3] as usize - 1).map_or(0, |(i, _)| i as u64 + 1)
            }
        })
        .sum()
}

// ---- the property test -----------------------------------------------------------------------

/// Limits small enough for generated RPMs to reach, and above what they need otherwise.
const SMALL: HeaderLimits = HeaderLimits {
    max_signature: 1024,
    max_main: 2048,
    max_tags: 32,
    max_read: 8 << 10,
    max_kept: 1024,
    max_deps: 32,
};

/// A value for a header field: as is, or relative to its header's data length.
#[derive(Debug, Clone, Copy)]
enum Val {
    Abs(u32),
    Dl(i8),
}

impl Val {
    fn of(self, h: &Header) -> u32 {
        match self {
            Val::Abs(v) => v,
            Val::Dl(k) => h.dl.wrapping_add_signed(i32::from(k)),
        }
    }
}

fn val() -> impl Strategy<Value = Val> {
    prop_oneof![
        select(vec![
            0,
            1,
            2,
            7,
            9,
            10,
            16,
            62,
            63,
            99,
            100,
            0xfffff,
            0x10_0000,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_fff0,
            u32::MAX,
        ])
        .prop_map(Val::Abs),
        any::<u32>().prop_map(Val::Abs),
        (-17i8..=17).prop_map(Val::Dl),
    ]
}

/// One way to break a generated RPM (`main`: in its main header, else its signature header).
#[derive(Debug, Clone)]
enum Break {
    /// Sets the entry count, or the data length, its intro claims.
    Intro { main: bool, dl: bool, value: Val },
    /// Sets field `field` (tag, type, offset, count) of an index entry.
    Field {
        main: bool,
        entry: Index,
        field: usize,
        value: Val,
    },
    /// Replaces every NUL from an entry's data to the region trailer.
    Unterminate { main: bool, entry: Index },
    /// Sets a byte of the data store.
    Store { main: bool, at: Index, byte: u8 },
    /// Cuts the file short.
    Cut(Index),
    /// Sets any byte of the file.
    Flip(Index, u8),
}

fn breaking() -> impl Strategy<Value = Break> {
    prop_oneof![
        1 => (any::<bool>(), any::<bool>(), val())
            .prop_map(|(main, dl, value)| Break::Intro { main, dl, value }),
        4 => (any::<bool>(), any::<Index>(), 0..4usize, val()).prop_map(
            |(main, entry, field, value)| Break::Field { main, entry, field, value }
        ),
        1 => (any::<bool>(), any::<Index>())
            .prop_map(|(main, entry)| Break::Unterminate { main, entry }),
        1 => (any::<bool>(), any::<Index>(), any::<u8>())
            .prop_map(|(main, at, byte)| Break::Store { main, at, byte }),
        1 => any::<Index>().prop_map(Break::Cut),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(at, b)| Break::Flip(at, b)),
    ]
}

/// A limit to set at, or just past, what a generated RPM needs.
#[derive(Debug, Clone, Copy)]
enum Limit {
    Signature,
    Main,
    Tags,
    Read,
    Kept,
    Deps,
}

/// A generated RPM: a well-formed one grown by extra entries, fillers and Provides, read with
/// one limit at or past what it needs, and broken in up to two ways.
#[derive(Debug, Clone)]
struct Case {
    tags: usize,
    sig_filler: usize,
    main_filler: usize,
    provides: usize,
    /// A limit set to what the RPM needs plus `slack` (-1: one short).
    limit: Option<(Limit, i8)>,
    breaks: Vec<Break>,
    wanted: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..16usize,
        0..600usize,
        0..1500usize,
        0..8usize,
        proptest::option::of((
            select(vec![
                Limit::Signature,
                Limit::Main,
                Limit::Tags,
                Limit::Read,
                Limit::Kept,
                Limit::Deps,
            ]),
            -1i8..=1,
        )),
        vec(breaking(), 0..3),
        any::<bool>(),
    )
        .prop_map(
            |(tags, sig_filler, main_filler, provides, limit, breaks, wanted)| Case {
                tags,
                sig_filler,
                main_filler,
                provides,
                limit,
                breaks,
                wanted,
            },
        )
}

/// The headers of `c`, unbroken.
fn grown(c: &Case) -> (Header, Header) {
    let mut sig_tags = vec![
        (273, STRING, 1, cstr(&"a".repeat(64))),
        (1000, INT32, 1, be32s(&[4096])),
    ];
    if c.sig_filler > 0 {
        sig_tags.push((1008, BIN, c.sig_filler as u32, vec![0; c.sig_filler]));
    }
    let caps: Vec<String> = (0..c.provides).map(|k| format!("cap{k}")).collect();
    let mut names = vec![NAME, "libfoo.so.1()(64bit)"];
    names.extend(caps.iter().map(String::as_str));
    let n = names.len();
    let mut flags = vec![8, 0];
    flags.resize(n, 0);
    let mut versions = vec!["1.0-1.el10", ""];
    versions.resize(n, "");
    let mut main_tags = vec![
        (1000, STRING, 1, cstr(NAME)),
        (1001, STRING, 1, cstr("1.0")),
        (1002, STRING, 1, cstr("1.el10")),
        (1022, STRING, 1, cstr("x86_64")),
        (1047, STRING_ARRAY, n as u32, cstrs(&names)),
        (1048, INT32, 2, be32s(&[0, 12])),
        (1049, STRING_ARRAY, 2, cstrs(&["/bin/sh", "bar"])),
        (1050, STRING_ARRAY, 2, cstrs(&["", "2.0"])),
        (1112, INT32, n as u32, be32s(&flags)),
        (1113, STRING_ARRAY, n as u32, cstrs(&versions)),
        (1125, STRING, 1, cstr("zstd")),
        (5062, STRING, 1, cstr("utf-8")),
    ];
    if c.main_filler > 0 {
        main_tags.push((5099, BIN, c.main_filler as u32, vec![7; c.main_filler]));
    }
    main_tags.push((5114, INT32, 1, be32s(&[4])));
    // Tag numbers rpm does not define (5114 is rpm 6's RPMTAG_RPMFORMAT, kept).
    for k in 0..c.tags {
        main_tags.push((6000 + k as u32, BIN, 1, vec![k as u8]));
    }
    (
        Header::new(SIGNATURES, &sig_tags),
        Header::new(IMMUTABLE, &main_tags),
    )
}

/// [`SMALL`], with `c`'s limit set against what its headers need.
fn limits_for(c: &Case, sig: &Header, main: &Header) -> HeaderLimits {
    let mut l = SMALL;
    if let Some((limit, slack)) = c.limit {
        let at = |need: u64| need.saturating_add_signed(i64::from(slack));
        let deps = u64::from(main.entry_ref(1047)[3] + main.entry_ref(1049)[3]);
        match limit {
            Limit::Signature => l.max_signature = at(sig.dl.into()) as u32,
            Limit::Main => l.max_main = at(main.dl.into()) as u32,
            Limit::Tags => l.max_tags = at(main.il.into()) as u32,
            Limit::Read => l.max_read = at(rpm(sig, main).len() as u64),
            Limit::Kept => l.max_kept = at(kept(main)),
            Limit::Deps => l.max_deps = at(deps),
        }
    }
    l
}

/// Applies `b` to the headers; whether it surely makes them malformed, as librpm would say
/// (given no other break).
fn apply(b: &Break, sig: &mut Header, main: &mut Header, limits: &HeaderLimits) -> bool {
    let (is_main, h) = match b {
        Break::Intro { main: m, .. }
        | Break::Field { main: m, .. }
        | Break::Unterminate { main: m, .. }
        | Break::Store { main: m, .. } => (*m, if *m { &mut *main } else { &mut *sig }),
        Break::Cut(_) | Break::Flip(..) => return false,
    };
    let (max_il, max_dl) = if is_main {
        (limits.max_tags, limits.max_main)
    } else {
        (32, limits.max_signature)
    };
    match *b {
        Break::Intro {
            dl: false, value, ..
        } => {
            h.il = value.of(h);
            h.il == 0 || h.il > max_il
        }
        Break::Intro { value, .. } => {
            h.dl = value.of(h);
            h.dl > max_dl
        }
        Break::Field {
            entry,
            field,
            value,
            ..
        } => {
            let e = entry.index(h.index.len());
            let v = value.of(h);
            let (tag, dl) = (h.index[e][0], h.dl);
            h.index[e][field] = v;
            let region = if is_main { IMMUTABLE } else { SIGNATURES };
            let kept_type = |ok: &[u32]| is_main && KEPT.contains(&tag) && !ok.contains(&v);
            match field {
                0 if e == 0 => v != region,
                0 => v < 100,
                1 if e == 0 => v != BIN,
                1 => {
                    v == 0
                        || v > 9
                        || kept_type(&[INT32]) && tag_is_int(tag)
                        || kept_type(&[STRING, STRING_ARRAY, 9]) && !tag_is_int(tag)
                }
                2 => {
                    let align = match h.index[e][1] {
                        INT16 => 2,
                        INT32 => 4,
                        INT64 => 8,
                        _ => 1,
                    };
                    // Past the store, before the previous entry's data, or misaligned.
                    (v as i32) < 0
                        || v > dl
                        || (e > 1 && v < h.index[e - 1][2])
                        || (e > 0 && v % align != 0)
                }
                _ => v == 0 || e == 0 && v != 16,
            }
        }
        Break::Unterminate { entry, .. } => {
            let e = entry.index(h.index.len());
            // Earlier breaks may have moved the offsets anywhere.
            let to = (h.index[0][2] as usize).min(h.store.len());
            let from = (h.index[e][2] as usize).min(to);
            for b in &mut h.store[from..to] {
                if *b == 0 {
                    *b = b'x';
                }
            }
            e > 0
                && h.index[1..]
                    .iter()
                    .any(|x| x[2] as usize >= from && matches!(x[1], STRING | STRING_ARRAY))
        }
        Break::Store { at, byte, .. } => {
            let i = at.index(h.store.len());
            h.store[i] = byte;
            false
        }
        Break::Cut(_) | Break::Flip(..) => false,
    }
}

fn tag_is_int(tag: u32) -> bool {
    matches!(tag, 1003 | 1048 | 1112 | 5114)
}

fn scale() -> u32 {
    std::env::var("STREAMD_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024 * scale(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_headers_are_read_or_refused_within_bounds(c in case()) {
        let (mut sig, mut main) = grown(&c);
        let limits = limits_for(&c, &sig, &main);
        let mut surely_bad = false;
        for b in &c.breaks {
            surely_bad |= apply(b, &mut sig, &mut main, &limits) && c.breaks.len() == 1;
        }
        let mut bytes = rpm(&sig, &main);
        let mut not_rpm = false;
        for b in &c.breaks {
            match *b {
                Break::Cut(at) => {
                    let keep = at.index(bytes.len());
                    bytes.truncate(keep);
                    not_rpm |= keep < 4;
                    surely_bad |= keep >= 4 && c.breaks.len() == 1;
                }
                Break::Flip(at, v) => {
                    let i = at.index(bytes.len().max(1));
                    if let Some(b) = bytes.get_mut(i) {
                        *b = v;
                    }
                }
                _ => {}
            }
        }
        let extract = ExtractLimits { rpm_headers: limits, ..EXTRACT_LIMITS };
        let (res, peak, largest) = measured(|| read(&layer(&bytes), c.wanted, extract));
        prop_assert!(peak < MAX_PEAK, "held {} bytes at once", peak);
        prop_assert!(largest < MAX_REQUEST, "asked for {} bytes at once", largest);
        let unbroken = c.breaks.is_empty();
        let within = c.limit.is_none_or(|(_, slack)| slack >= 0);
        match res {
            Err(e) => {
                prop_assert!(e.to_string().contains(FILE), "{}", e);
                prop_assert!(!unbroken || !within, "a well-formed RPM within the limits: {}", e);
            }
            Ok((names, _, headers)) => {
                prop_assert!(!surely_bad, "accepted {:?}", headers);
                prop_assert!(unbroken || !c.breaks.is_empty());
                prop_assert_eq!(names, vec![FILE.trim_end_matches(".rpm").to_string()]);
                if unbroken {
                    prop_assert!(within, "accepted past a limit");
                    prop_assert_eq!(headers.len(), 1);
                    prop_assert_eq!(headers[0].nevra(), "foo-1.0-1.el10.x86_64");
                    prop_assert_eq!(headers[0].provides.len(), 2 + c.provides);
                } else if not_rpm {
                    prop_assert!(headers.is_empty());
                }
            }
        }
    }
}
