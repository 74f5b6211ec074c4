//! The RPMs of an extensions layer: a tar (gzip'd or not) read entry by entry within
//! [`ExtractLimits`], the wanted RPMs written out, every RPM's header read.

use std::io::{BufRead as _, Read};
use std::path::{Path, PathBuf};

use super::EXTENSIONS_DIR;
use crate::image::rpm::{HEADER_LIMITS, HeaderBudget, HeaderError, HeaderLimits, RpmHeader};

/// Caps on what one extensions image may make streamd read into memory and write into `/run`
/// (a tmpfs: memory too). An extensions layer is the only thing streamd unpacks, and it comes
/// from whoever controls the registry or the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Largest RPM written, bytes (the declared size is checked before a byte is written).
    pub max_file: u64,
    /// Largest sum of the RPMs written over all layers, bytes.
    pub max_total: u64,
    /// Most tar entries read over all layers (headers included).
    pub max_entries: u64,
    /// Largest GNU long name/link or PAX extension record, bytes. tar reads these whole into
    /// memory; a path is at most `PATH_MAX` (4096), the rest is generous room for xattrs.
    pub max_header: u64,
    /// What the RPMs' own headers may make streamd read and keep over all layers.
    pub rpm_headers: HeaderLimits,
}

/// The limits streamd extracts with. A real extensions image (openshift/os
/// `extensions/Containerfile`) is a UBI 9 base layer of tens of thousands of entries plus a
/// repository of hundreds to thousands of RPMs; its largest RPMs (kernel modules) are tens of
/// MiB. Skipping an entry costs its bytes only, which the layer's size and deadline bound, so
/// the entry cap leaves room for the base (tests/extensions_shape.rs).
pub const EXTRACT_LIMITS: ExtractLimits = ExtractLimits {
    max_file: 256 << 20,
    max_total: 512 << 20,
    max_entries: 100_000,
    max_header: 64 << 10,
    rpm_headers: HEADER_LIMITS,
};

/// What is left of [`ExtractLimits`] while an image's layers are read one after the other.
#[derive(Debug)]
pub struct ExtractBudget {
    limits: ExtractLimits,
    written: u64,
    entries: u64,
    headers: HeaderBudget,
}

impl ExtractBudget {
    /// A full budget.
    pub fn new(limits: ExtractLimits) -> Self {
        ExtractBudget {
            limits,
            written: 0,
            entries: 0,
            headers: HeaderBudget::new(limits.rpm_headers),
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }
}

fn too_big(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// What one layer holds under [`EXTENSIONS_DIR`]: the RPM names, the extracted files and the
/// headers of the files that are RPMs.
pub type LayerRpms = (Vec<String>, Vec<PathBuf>, Vec<RpmHeader>);

/// Lists the RPMs under [`EXTENSIONS_DIR`] in a (gzip'd or plain) tar layer, reads every RPM's header and writes the
/// wanted ones into `dest` (without one, their headers are read from the stream like the rest). Names are `name-version-release.arch` (the file name without `.rpm`).
///
/// Entries are read raw, so GNU long names and PAX records are read here, each at most
/// [`ExtractLimits::max_header`] bytes, instead of whole by the tar reader; the files written,
/// their sum, the entries and the RPM headers are counted against `budget`. A file that is no
/// RPM at all (no lead) is listed but offers nothing to the closure; an RPM whose header is
/// malformed or over a limit refuses the layer, naming the file. On an error, files already
/// written stay: the caller extracts into a directory it removes.
pub fn rpms_in_layer<R: Read>(
    layer: R,
    media_type: &str,
    wanted: &[String],
    dest: Option<&Path>,
    budget: &mut ExtractBudget,
) -> std::io::Result<LayerRpms> {
    let mut layer = std::io::BufReader::new(layer);
    let gzip = media_type.contains("gzip") || layer.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(layer))
    } else {
        Box::new(layer)
    };
    let mut archive = tar::Archive::new(reader);
    let mut names = Vec::new();
    let mut files = Vec::new();
    let mut headers = Vec::new();
    let limits = budget.limits;
    // The path a GNU long name or PAX record gave the next entry.
    let mut long_path: Option<Vec<u8>> = None;
    for entry in archive.entries()?.raw(true) {
        let mut entry = entry?;
        budget.entries += 1;
        if budget.entries > limits.max_entries {
            return Err(too_big(format!(
                "more than {} tar entries",
                limits.max_entries
            )));
        }
        let kind = entry.header().entry_type();
        let size = entry.header().entry_size()?;
        if kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            if let Some(path) = path_record(&mut entry, kind, size, limits.max_header)? {
                long_path = Some(path);
            }
            continue;
        }
        let raw_path = long_path
            .take()
            .unwrap_or_else(|| entry.path_bytes().into_owned());
        let path = String::from_utf8_lossy(&raw_path);
        let Some(rest) = path.trim_start_matches("./").strip_prefix(EXTENSIONS_DIR) else {
            continue;
        };
        let Some(file) = rest.rsplit('/').next().filter(|f| f.ends_with(".rpm")) else {
            continue;
        };
        // No file system takes a longer name; refusing it also bounds the list kept in memory.
        if file.len() > 255 {
            return Err(too_big(format!(
                "a file name of {} bytes under {EXTENSIONS_DIR}",
                file.len()
            )));
        }
        let nevra = file.trim_end_matches(".rpm").to_string();
        let want = wanted
            .iter()
            .any(|w| crate::image::rpm::names_package(&nevra, w));
        let header = if let Some(dest) = dest.filter(|_| want) {
            if size > limits.max_file {
                return Err(too_big(format!(
                    "{file} is {size} bytes (at most {} per RPM)",
                    limits.max_file
                )));
            }
            let total = budget.written.saturating_add(size);
            if total > limits.max_total {
                return Err(too_big(format!(
                    "the wanted RPMs exceed {} bytes",
                    limits.max_total
                )));
            }
            // Only the file name is used: a path in the archive can never escape `dest`.
            let out = dest.join(file);
            std::io::copy(&mut entry, &mut std::fs::File::create(&out)?)?;
            budget.written = total;
            let header = RpmHeader::read_file(&out, &mut budget.headers);
            files.push(out);
            header
        } else {
            // The header is the first few KiB of the file: read from the stream for every RPM,
            // as the dependency closure needs all of them (readiness extracts none).
            RpmHeader::read(&mut entry, file, &mut budget.headers)
        };
        if let Some(h) = header_of(header, file)? {
            headers.push(h);
        }
        names.push(nevra);
    }
    Ok((names, files, headers))
}

/// Reads a GNU long name or link, or a PAX record, of `size` bytes (at most `max`); the path it
/// gives the next entry, if it gives one.
fn path_record(
    entry: &mut impl Read,
    kind: tar::EntryType,
    size: u64,
    max: u64,
) -> std::io::Result<Option<Vec<u8>>> {
    if size > max {
        return Err(too_big(format!(
            "a tar header record of {size} bytes (at most {max})"
        )));
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data)?;
    let mut path = None;
    if kind.is_gnu_longname() {
        let end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        data.truncate(end);
        path = Some(data);
    } else if kind.is_pax_local_extensions() {
        for ext in tar::PaxExtensions::new(&data) {
            let ext = ext?;
            if ext.key_bytes() == b"path" {
                path = Some(ext.value_bytes().to_vec());
            }
        }
    }
    Ok(path)
}

/// The header read from `file`: none for a file that is no RPM at all (listed, but no candidate
/// for the closure; a wanted one missing from it is refused there), an error naming the file for
/// a malformed one.
fn header_of(
    read: Result<RpmHeader, HeaderError>,
    file: &str,
) -> std::io::Result<Option<RpmHeader>> {
    match read {
        Ok(h) => Ok(Some(h)),
        Err(HeaderError::NotRpm) => {
            tracing::debug!(file, "not an rpm package");
            Ok(None)
        }
        Err(HeaderError::Io(e)) => Err(std::io::Error::new(e.kind(), format!("{file}: {e}"))),
        Err(e @ HeaderError::Invalid(_)) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{file}: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads an uncompressed `layer` wanting `kernel-rt-core`, with the shipped limits.
    fn rt_core_from(layer: &[u8], dest: &Path) -> LayerRpms {
        rpms_in_layer(
            layer,
            "application/vnd.oci.image.layer.v1.tar",
            &["kernel-rt-core".to_string()],
            Some(dest),
            &mut ExtractBudget::new(EXTRACT_LIMITS),
        )
        .expect("read")
    }

    fn tar_with(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, *data).expect("append");
        }
        b.into_inner().expect("tar")
    }

    #[test]
    fn finds_and_extracts_rpms() {
        let layer = tar_with(&[
            (
                "usr/share/rpm-ostree/extensions/kernel-rt-core-6.12.0-1.el10.x86_64.rpm",
                b"rt",
            ),
            (
                "usr/share/rpm-ostree/extensions/usbguard-1.1.3-3.el10.x86_64.rpm",
                b"ug",
            ),
            ("usr/share/rpm-ostree/extensions/repodata/repomd.xml", b"x"),
            ("usr/bin/true", b"t"),
        ]);
        let dest = testbed::scratch::ScratchDir::new("rpms").expect("scratch dir");
        let (names, files, _) = rt_core_from(&layer, &dest);
        assert_eq!(
            names,
            vec![
                "kernel-rt-core-6.12.0-1.el10.x86_64".to_string(),
                "usbguard-1.1.3-3.el10.x86_64".to_string()
            ]
        );
        assert_eq!(files.len(), 1);
        assert_eq!(std::fs::read(&files[0]).expect("read"), b"rt");
    }

    fn gzip(raw: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(raw).expect("gzip");
        z.finish().expect("gzip")
    }

    /// A tar header block for `name` of `kind` declaring `size` bytes (the data is not there).
    fn header(name: &str, kind: tar::EntryType, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).expect("name");
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn scratch(name: &str) -> testbed::scratch::ScratchDir {
        testbed::scratch::ScratchDir::new(&format!("hostile-{name}")).expect("scratch dir")
    }

    fn read(layer: &[u8], wanted: &[&str], dest: &Path, limits: ExtractLimits) -> String {
        let wanted: Vec<String> = wanted.iter().map(|w| w.to_string()).collect();
        rpms_in_layer(
            layer,
            "application/vnd.oci.image.layer.v1.tar+gzip",
            &wanted,
            Some(dest),
            &mut ExtractBudget::new(limits),
        )
        .expect_err("a hostile layer is refused")
        .to_string()
    }

    #[test]
    fn header_records_are_capped_before_they_are_read() {
        // A GNU long name of 256 MiB of zeros: 254 KiB of gzip. tar's own reader would hold
        // all of it in memory; the cap refuses it from the header alone.
        let mut raw = header("././@LongLink", tar::EntryType::GNULongName, 256 << 20);
        raw.resize(raw.len() + (256 << 20), 0);
        let bomb = gzip(&raw);
        drop(raw);
        assert!(bomb.len() < 300 << 10, "{}", bomb.len());
        let dest = scratch("longname");
        let e = read(&bomb, &[], &dest, EXTRACT_LIMITS);
        assert!(e.contains("tar header record of 268435456 bytes"), "{e}");
        let pax = gzip(&header("pax", tar::EntryType::XHeader, 1 << 30));
        let e = read(&pax, &[], &dest, EXTRACT_LIMITS);
        assert!(e.contains("tar header record"), "{e}");
    }

    #[test]
    fn files_total_and_entries_are_capped() {
        let dest = scratch("caps");
        let rpm = |n: &str| format!("{EXTENSIONS_DIR}{n}-1-1.el10.x86_64.rpm");
        // One wanted RPM declaring 8 GiB: refused before a byte is written.
        let huge = gzip(&header(
            &rpm("kernel-rt-core"),
            tar::EntryType::Regular,
            8 << 30,
        ));
        let e = read(&huge, &["kernel-rt-core"], &dest, EXTRACT_LIMITS);
        assert!(e.contains("at most 268435456 per RPM"), "{e}");
        assert_eq!(std::fs::read_dir(&dest).expect("dest").count(), 0);
        // Each under the per-file cap, together over the total.
        let small = ExtractLimits {
            max_file: 10,
            max_total: 15,
            ..EXTRACT_LIMITS
        };
        let two = tar_with(&[(&rpm("a"), &[1u8; 10][..]), (&rpm("b"), &[2u8; 10][..])]);
        let e = read(&gzip(&two), &["a", "b"], &dest, small);
        assert!(e.contains("exceed 15 bytes"), "{e}");
        // Many empty entries.
        let files: Vec<(String, Vec<u8>)> =
            (0..30).map(|i| (format!("f{i}"), Vec::new())).collect();
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (n.as_str(), &d[..])).collect();
        let many = ExtractLimits {
            max_entries: 20,
            ..EXTRACT_LIMITS
        };
        let e = read(&gzip(&tar_with(&refs)), &[], &dest, many);
        assert!(e.contains("more than 20 tar entries"), "{e}");
    }

    #[test]
    fn long_names_still_name_rpms() {
        // Real layers use PAX or GNU long names for long paths: within the cap they still work.
        let long = format!(
            "{EXTENSIONS_DIR}{}/kernel-rt-core-6.12.0-1.el10.x86_64.rpm",
            "d".repeat(150)
        );
        let layer = tar_with(&[(&long, b"rt")]);
        let dest = scratch("long");
        let (names, files, _) = rt_core_from(&layer, &dest);
        assert_eq!(
            names,
            vec!["kernel-rt-core-6.12.0-1.el10.x86_64".to_string()]
        );
        assert_eq!(std::fs::read(&files[0]).expect("read"), b"rt");
    }

    #[test]
    fn bad_layers_are_errors_not_panics() {
        let dest = testbed::scratch::ScratchDir::new("bad-layers").expect("scratch dir");
        for blob in [&b"\x1f\x8bnot gzip"[..], &[0u8; 10][..], &b"garbage"[..]] {
            let _ = rpms_in_layer(
                blob,
                "application/vnd.oci.image.layer.v1.tar+gzip",
                &[],
                Some(&dest),
                &mut ExtractBudget::new(EXTRACT_LIMITS),
            );
        }
    }
}
