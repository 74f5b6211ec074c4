//! What an RPM needs of the software that reads it, and whether the booted OS's rpm-ostree can.
//!
//! rpm-ostree imports the local RPMs streamd passes with the *booted* OS's libraries, before it
//! pulls the target (coreos/rpm-ostree v2025.5 `src/libpriv/rpmostree-importer.cxx`
//! `rpmostree_importer_read_metainfo`: librpm's `rpmReadPackageFile` reads the headers;
//! `src/libpriv/rpmostree-unpacker-core.cxx` `rpmostree_unpack_rpm2cpio`: libarchive reads the
//! payload with the gzip, bzip2, xz, lzma and zstd filters and the cpio format only). Neither
//! libsolv (it makes the system solvable provide every unknown `rpmlib(…)`) nor rpm-ostree (no
//! `rpmtsCheck`) checks the `rpmlib(…)` Requires: a payload the importer cannot decode fails the
//! transaction while it is imported, and a feature the booted rpm lacks is imported without its
//! meaning. These are the checks rpm's own `rpmtsCheck` would make (`rpm -i` refuses "rpmlib(X)
//! is needed by"), plus the payload the importer can decode.

use super::{Dep, RpmHeader};

/// What an RPM's header says it needs of its reader.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReaderNeeds {
    /// Its `rpmlib(…)` Requires: features of rpm itself, with the version rpmbuild asked for.
    pub rpmlib: Vec<Dep>,
    /// `RPMTAG_PAYLOADCOMPRESSOR` (1125): `gzip`, `bzip2`, `xz`, `lzma`, `zstd`; `None` for an
    /// uncompressed payload (rpmbuild writes no tag for `ufdio`).
    pub payload_compressor: Option<String>,
    /// `RPMTAG_RPMFORMAT` (5114), which rpm 6.0 writes into v6 packages only.
    pub format: Option<u32>,
}

/// An rpm release a booted OS runs, by what it can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpmRelease {
    /// Its version (`4.16.1.3`).
    pub version: &'static str,
    /// The RHEL major shipping it.
    pub el: u32,
}

impl RpmRelease {
    /// RHEL 9's rpm (rpm-4.16.1.3-*.el9).
    pub const EL9: RpmRelease = RpmRelease {
        version: "4.16.1.3",
        el: 9,
    };
    /// RHEL 10's rpm (rpm-4.19.1.1-*.el10).
    pub const EL10: RpmRelease = RpmRelease {
        version: "4.19.1.1",
        el: 10,
    };

    /// The rpm a booted OS of `major` runs; an unknown major is judged as the oldest (el9),
    /// which reads least.
    pub fn of_major(major: Option<u32>) -> RpmRelease {
        match major {
            Some(m) if m >= 10 => RpmRelease::EL10,
            _ => RpmRelease::EL9,
        }
    }

    /// The `rpmlib(…)` features it provides (lib/rpmds.c `rpmlibProvides`, each `= EVR`, as
    /// built for RHEL: with bzip2, xz/lzma, Lua, libcap and zstd). The table is the same 21
    /// entries at rpm-4.16.1.3, rpm-4.19.1.1-release and rpm-6.0.0-release (lib/rpmds.cc).
    pub fn rpmlib_provides(self) -> impl Iterator<Item = Dep> {
        RPMLIB_PROVIDES
            .iter()
            .map(|(name, evr)| Dep::versioned(*name, super::Op::Eq, *evr))
    }
}

impl std::fmt::Display for RpmRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rpm {} (el{})", self.version, self.el)
    }
}

/// lib/rpmds.c `rpmlibProvides` at rpm-4.16.1.3 and rpm-4.19.1.1-release (unchanged in
/// rpm-6.0.0-release lib/rpmds.cc).
const RPMLIB_PROVIDES: [(&str, &str); 21] = [
    ("rpmlib(VersionedDependencies)", "3.0.3-1"),
    ("rpmlib(CompressedFileNames)", "3.0.4-1"),
    ("rpmlib(PayloadIsBzip2)", "3.0.5-1"),
    ("rpmlib(PayloadIsXz)", "5.2-1"),
    ("rpmlib(PayloadIsLzma)", "4.4.2-1"),
    ("rpmlib(PayloadFilesHavePrefix)", "4.0-1"),
    ("rpmlib(ExplicitPackageProvide)", "4.0-1"),
    ("rpmlib(HeaderLoadSortsTags)", "4.0.1-1"),
    ("rpmlib(ScriptletInterpreterArgs)", "4.0.3-1"),
    ("rpmlib(PartialHardlinkSets)", "4.0.4-1"),
    ("rpmlib(ConcurrentAccess)", "4.1-1"),
    ("rpmlib(BuiltinLuaScripts)", "4.2.2-1"),
    ("rpmlib(FileDigests)", "4.6.0-1"),
    ("rpmlib(FileCaps)", "4.6.1-1"),
    ("rpmlib(ScriptletExpansion)", "4.9.0-1"),
    ("rpmlib(TildeInVersions)", "4.10.0-1"),
    ("rpmlib(CaretInVersions)", "4.15.0-1"),
    ("rpmlib(LargeFiles)", "4.12.0-1"),
    ("rpmlib(RichDependencies)", "4.12.0-1"),
    ("rpmlib(DynamicBuildRequires)", "4.15.0-1"),
    ("rpmlib(PayloadIsZstd)", "5.4.18-1"),
];

/// The payload compressors rpm-ostree's importer decodes (libarchive's filters in
/// `rpmostree_unpack_rpm2cpio`), by the names rpmbuild writes (build/pack.c `getIOFlags`).
const IMPORTER_COMPRESSORS: [&str; 5] = ["gzip", "bzip2", "xz", "lzma", "zstd"];

/// An RPM the booted OS cannot import, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The file's name.
    pub file: String,
    /// Each reason, in header order.
    pub why: Vec<String>,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.why.join(", "))
    }
}

/// Why the booted OS's `rpm` (and the rpm-ostree importer beside it) cannot import `h`; `None`
/// when it can.
pub fn unreadable(h: &RpmHeader, rpm: RpmRelease) -> Option<Unreadable> {
    let needs = &h.needs;
    let mut why = Vec::new();
    if let Some(format) = needs.format.filter(|f| *f >= 6) {
        why.push(format!(
            "it is an rpm v{format} package (RPMTAG_RPMFORMAT), a format rpm 6.0 introduced and {rpm} does not know"
        ));
    }
    for req in &needs.rpmlib {
        if !rpm.rpmlib_provides().any(|p| p.satisfies(req)) {
            why.push(format!("it needs {req}, which {rpm} does not provide"));
        }
    }
    // rpm writes a payload of 64-bit file sizes (and so every v6 payload) in its stripped cpio
    // format (lib/rpmfi.c `rpmfiArchiveWriteHeader`, magic 07070X), which libarchive's cpio
    // reader does not know (libarchive/libarchive#1765).
    if needs.rpmlib.iter().any(|d| d.name == "rpmlib(LargeFiles)")
        || needs.format.is_some_and(|f| f >= 6)
    {
        why.push(
            "its payload is rpm's stripped cpio (07070X), which rpm-ostree's importer (libarchive) cannot read"
                .to_string(),
        );
    }
    if let Some(c) = needs
        .payload_compressor
        .as_deref()
        .filter(|c| !IMPORTER_COMPRESSORS.contains(c))
    {
        why.push(format!(
            "its payload is compressed with {c:?}, which rpm-ostree's importer on {rpm} cannot decompress (it reads {})",
            IMPORTER_COMPRESSORS.join(", ")
        ));
    }
    (!why.is_empty()).then(|| Unreadable {
        file: h.file.clone(),
        why,
    })
}

/// The tests' el10 `kernel-rt-core`, needing the `rpmlib` features (`<= EVR`, as rpmbuild
/// asks), the payload `compressor` and the package `format` of its reader.
#[cfg(test)]
pub(crate) fn el10_rt_core(
    rpmlib: &[(&str, &str)],
    compressor: Option<&str>,
    format: Option<u32>,
) -> RpmHeader {
    RpmHeader {
        file: "kernel-rt-core-6.12.0-124.8.1.el10_1.x86_64.rpm".into(),
        name: "kernel-rt-core".into(),
        epoch: 0,
        version: "6.12.0".into(),
        release: "124.8.1.el10_1".into(),
        arch: "x86_64".into(),
        provides: Vec::new(),
        requires: Vec::new(),
        needs: ReaderNeeds {
            rpmlib: rpmlib
                .iter()
                .map(|(n, evr)| Dep::versioned(*n, super::Op::Le, *evr))
                .collect(),
            payload_compressor: compressor.map(str::to_string),
            format,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use el10_rt_core as header;

    /// What RHEL 10's rpmbuild (4.19.1.1) writes into a binary package: build/files.c and
    /// build/pack.c `rpmlibNeedsFeature` calls for a zstd payload with SHA-256 file digests
    /// and dirname/basename file lists (PayloadIsLzma is asked at 4.4.6-1, provided at 4.4.2-1:
    /// rpm's range overlap still holds).
    const EL10_REQUIRES: [(&str, &str); 4] = [
        ("rpmlib(CompressedFileNames)", "3.0.4-1"),
        ("rpmlib(FileDigests)", "4.6.0-1"),
        ("rpmlib(PayloadFilesHavePrefix)", "4.0-1"),
        ("rpmlib(PayloadIsZstd)", "5.4.18-1"),
    ];

    #[test]
    fn what_the_booted_rpm_cannot_read_by_table() {
        let rows: Vec<(&str, RpmHeader, RpmRelease, Option<&str>)> = vec![
            (
                "el10 RPM readable by el9",
                header(&EL10_REQUIRES, Some("zstd"), None),
                RpmRelease::EL9,
                None,
            ),
            (
                "lzma asked at a newer version than provided",
                header(&[("rpmlib(PayloadIsLzma)", "4.4.6-1")], Some("lzma"), None),
                RpmRelease::EL9,
                None,
            ),
            (
                "uncompressed payload",
                header(&EL10_REQUIRES[..3], None, None),
                RpmRelease::EL10,
                None,
            ),
            (
                "an RPM requiring a feature newer than the booted rpm refused",
                header(&[("rpmlib(PayloadIsZstd2)", "6.1.0-1")], Some("zstd"), None),
                RpmRelease::EL9,
                Some(
                    "it needs rpmlib(PayloadIsZstd2) <= 6.1.0-1, which rpm 4.16.1.3 (el9) does not provide",
                ),
            ),
            (
                "an rpm 6 (v6 format) RPM refused",
                header(&[("rpmlib(LargeFiles)", "4.12.0-1")], Some("zstd"), Some(6)),
                RpmRelease::EL10,
                Some(
                    "it is an rpm v6 package (RPMTAG_RPMFORMAT), a format rpm 6.0 introduced and rpm 4.19.1.1 (el10) does not know, its payload is rpm's stripped cpio (07070X)",
                ),
            ),
            (
                "unknown compressor refused",
                header(&EL10_REQUIRES, Some("lzip"), None),
                RpmRelease::EL9,
                Some(
                    "its payload is compressed with \"lzip\", which rpm-ostree's importer on rpm 4.16.1.3 (el9) cannot decompress",
                ),
            ),
        ];
        for (row, h, rpm, want) in rows {
            let got = unreadable(&h, rpm).map(|u| u.to_string());
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => {
                    assert!(g.starts_with(&format!("{}: {w}", h.file)), "{row}: {g}")
                }
                _ => panic!("{row}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn the_booted_major_names_the_rpm() {
        assert_eq!(RpmRelease::of_major(Some(9)), RpmRelease::EL9);
        assert_eq!(RpmRelease::of_major(Some(10)), RpmRelease::EL10);
        assert_eq!(RpmRelease::of_major(None), RpmRelease::EL9);
        assert_eq!(RpmRelease::EL9.rpmlib_provides().count(), 21);
    }
}
