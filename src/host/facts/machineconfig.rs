//! The MachineConfig the machine-config daemon (MCD) applied: its `spec.kernelType` and
//! `spec.extensions` decide which packages the machine-config operator installs from a
//! stream's extensions image when it moves the node (readiness of an MCD-managed node,
//! docs/protocol.md "Modes and readiness").
//!
//! The MCD stores the whole MachineConfig as JSON at [`CURRENT_CONFIG`]
//! (openshift/machine-config-operator:pkg/daemon/daemon.go `currentConfigPath`, written by
//! `storeCurrentConfigOnDisk`, read back by `getCurrentConfigOnDisk`; the on-cluster build
//! writes the same file into the image: pkg/controller/build/buildrequest/assets/
//! Containerfile.on-cluster-build-template). On HyperShift that file exists but is empty; the
//! MCD there keeps its record at [`HYPERSHIFT_CURRENT_CONFIG`] and, before it first applied a
//! change, reads what the machine-config server served at provisioning,
//! [`MCS_SERVED_CONFIG`] (pkg/daemon/daemon.go `syncNodeHypershift`, pkg/server/server.go
//! `machineConfigContentPath`). [`applied`] reads them in that way. The file's text is
//! outside text: what streamd keeps of it is a kernel variant, names from the operator's own
//! table, and quoted, bounded values.

use std::io::Read;

use super::HostRoot;
use super::mco_release::{RELEASE_ANNOTATION, ReleaseOf};
use crate::backend::KernelVariant;
use crate::text;

/// Where the MCD stores the MachineConfig it applied.
pub const CURRENT_CONFIG: &str = super::mcd::HOST_FILES[0];

/// Where a HyperShift-mode MCD stores it (`hypershiftCurrentConfigPath`).
pub const HYPERSHIFT_CURRENT_CONFIG: &str = super::mcd::HOST_FILES[1];

/// The MachineConfig the machine-config server served when the node was provisioned
/// (`mcsServedConfigPath`): the applied one until an MCD first records its own.
pub const MCS_SERVED_CONFIG: &str = "/etc/mcs-machine-config-content.json";

/// The largest file read. The operator refuses to render a MachineConfig over 1.5 MiB
/// (pkg/controller/common/constants.go `MaxMachineConfigSize`, checked on its JSON); the MCD
/// writes the same JSON, so a larger file is not one it wrote.
pub const MAX_BYTES: u64 = 2 << 20;

/// The most extensions kept; the operator supports at most eight
/// ([`McoRelease::extensions`]).
pub const MAX_EXTENSIONS: usize = 64;

/// What streamd keeps of the applied MachineConfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedConfig {
    /// `spec.kernelType` (empty or absent is `default`, as the operator's
    /// pkg/helpers/helpers.go `CanonicalizeKernelType` takes it), or the value, quoted, when
    /// it is none the operator accepts (pkg/controller/common/helpers.go
    /// `ValidateMachineConfig`: "kernelType=… is invalid").
    pub kernel_type: Result<KernelVariant, InvalidKernelType>,
    /// `spec.extensions` the operator supports, in order, as named in its release's table.
    pub extensions: Vec<&'static str>,
    /// `spec.extensions` it does not support, quoted: it rejects the MachineConfig
    /// (`validateExtensions`: "invalid extensions found").
    pub unsupported: Vec<String>,
    /// The release that rendered it (`metadata.annotations`' [`RELEASE_ANNOTATION`]), whose
    /// tables say what the operator installs.
    pub release: ReleaseOf,
    /// What pins the node's OS image, from the rendered MachineConfig.
    pub pins: Pins,
}

/// What the rendered MachineConfig says about the images the operator puts on the node: its
/// `spec.osImageURL` and `spec.baseOSExtensionsContainerImage` (a user MachineConfig setting
/// either wins over the stream's, pkg/controller/common/helpers.go `MergeMachineConfigs`), whether
/// the render controller marked the OS image as overridden ([`OS_IMAGE_URL_OVERRIDDEN`]) and
/// which controller build rendered it ([`CONTROLLER_VERSION`]). Values are kept raw but bounded
/// ([`MAX_VALUE_CHARS`]): they are compared with images and quoted where shown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    /// `spec.osImageURL` ("" when absent).
    pub os_image_url: String,
    /// `spec.baseOSExtensionsContainerImage` ("" when absent).
    pub extensions_image: String,
    /// The [`OS_IMAGE_URL_OVERRIDDEN`] annotation is `"true"`.
    pub os_image_url_overridden: bool,
    /// The [`CONTROLLER_VERSION`] annotation, if any.
    pub controller_version: Option<String>,
}

/// The annotation the render controller sets to `"true"` on a rendered MachineConfig whose
/// `osImageURL` is not the base image it would have used (the ControllerConfig's or the pool's
/// stream's): a user MachineConfig overrides it (pkg/controller/common/constants.go
/// `OSImageURLOverriddenKey`; pkg/controller/render/render_controller.go
/// `generateRenderedMachineConfig`, on 4.21, 4.22 and 4.23).
pub const OS_IMAGE_URL_OVERRIDDEN: &str =
    "machineconfiguration.openshift.io/os-image-url-overridden";

/// The annotation naming the controller build (`version.Hash`) that rendered a MachineConfig
/// (pkg/controller/common/constants.go `GeneratedByControllerVersionAnnotationKey`, set in
/// `generateRenderedMachineConfig` on every release). The operator writes the same hash into
/// the OSImageStream's [`RELEASE_ANNOTATION`] (pkg/osimagestream/osimagestream.go).
pub const CONTROLLER_VERSION: &str =
    "machineconfiguration.openshift.io/generated-by-controller-version";

/// The longest value kept of an image or version field: longer ones are no image the operator
/// renders, and are kept cut (they then match nothing).
pub const MAX_VALUE_CHARS: usize = 1024;

/// A `spec.kernelType` the operator does not accept: the value, quoted and bounded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidKernelType(pub String);

impl InvalidKernelType {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "kernel-type-invalid"
    }
}

/// Why a stored MachineConfig is none streamd can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not JSON (serde's message, bounded).
    #[error("not JSON: {0}")]
    NotJson(String),
    /// A JSON value of the wrong shape: what is wrong.
    #[error("not a MachineConfig: {0}")]
    Shape(&'static str),
    /// More `spec.extensions` than [`MAX_EXTENSIONS`] (how many).
    #[error("spec.extensions has {0} entries, more than {MAX_EXTENSIONS}")]
    TooManyExtensions(usize),
}

impl ParseError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ParseError::NotJson(_) => "machineconfig-not-json",
            ParseError::Shape(_) => "machineconfig-shape",
            ParseError::TooManyExtensions(_) => "machineconfig-too-many-extensions",
        }
    }
}

/// Why the stored file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Opening or reading failed (the system's words).
    #[error("{0}")]
    Io(String),
    /// Larger than [`MAX_BYTES`].
    #[error("larger than {MAX_BYTES} bytes, more than any MachineConfig the operator renders")]
    TooLarge,
    /// Not UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
}

/// The applied MachineConfig could not be read: the file and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppliedError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// The host path.
        file: &'static str,
        /// Why.
        source: ReadError,
    },
    /// The file holds no MachineConfig.
    #[error("{file}: {source}")]
    Parse {
        /// The host path.
        file: &'static str,
        /// Why.
        source: ParseError,
    },
}

impl AppliedError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            AppliedError::Read {
                source: ReadError::Io(_),
                ..
            } => "machineconfig-unreadable",
            AppliedError::Read {
                source: ReadError::TooLarge,
                ..
            } => "machineconfig-too-large",
            AppliedError::Read {
                source: ReadError::NotUtf8,
                ..
            } => "machineconfig-not-utf8",
            AppliedError::Parse { source, .. } => source.label(),
        }
    }
}

impl AppliedConfig {
    /// The packages the operator installs for `spec.extensions`, without repeats
    /// (`GetPackagesForSupportedExtensions`).
    pub fn extension_packages(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for name in &self.extensions {
            let packages = self
                .release
                .release
                .extension(name)
                .map_or(&[][..], |(_, p)| p);
            for p in packages {
                if !out.contains(p) {
                    out.push(p);
                }
            }
        }
        out
    }
}

/// Parses the MCD's stored MachineConfig: only `spec.kernelType`, `spec.extensions`,
/// `spec.osImageURL`, `spec.baseOSExtensionsContainerImage` and the annotations [`Pins`] and
/// [`ReleaseOf`] name are read, everything else ignored, and JSON `null` reads as the field's zero value, as with the
/// MCD's `json.Decoder` into its Go type.
pub fn parse(json: &str) -> Result<AppliedConfig, ParseError> {
    use serde_json::Value;
    let mc: Value = serde_json::from_str(json)
        .map_err(|e| ParseError::NotJson(text::one_line(&e.to_string(), 160)))?;
    let Value::Object(mc) = mc else {
        return Err(ParseError::Shape("not a JSON object"));
    };
    let empty = serde_json::Map::new();
    let release = ReleaseOf::from_annotation(annotation(
        &mc,
        RELEASE_ANNOTATION,
        "the machineconfiguration.openshift.io/release-image-version annotation is not a string",
    )?);
    let controller_version = annotation(
        &mc,
        CONTROLLER_VERSION,
        "the machineconfiguration.openshift.io/generated-by-controller-version annotation is not a string",
    )?
    .map(bounded);
    let os_image_url_overridden = annotation(
        &mc,
        OS_IMAGE_URL_OVERRIDDEN,
        "the machineconfiguration.openshift.io/os-image-url-overridden annotation is not a string",
    )? == Some("true");
    let spec = match mc.get("spec") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(s)) => s,
        Some(_) => return Err(ParseError::Shape("spec is not an object")),
    };
    let kernel_type = string(spec, "kernelType", "spec.kernelType is not a string")?;
    let pins = Pins {
        os_image_url: bounded(string(
            spec,
            "osImageURL",
            "spec.osImageURL is not a string",
        )?),
        extensions_image: bounded(string(
            spec,
            "baseOSExtensionsContainerImage",
            "spec.baseOSExtensionsContainerImage is not a string",
        )?),
        os_image_url_overridden,
        controller_version,
    };
    let names: Vec<&str> = match spec.get("extensions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            a.iter()
                .map(Value::as_str)
                .collect::<Option<_>>()
                .ok_or(ParseError::Shape(
                    "spec.extensions is not a list of strings",
                ))?
        }
        Some(_) => return Err(ParseError::Shape("spec.extensions is not a list")),
    };
    let kernel_type = match kernel_type {
        "" | "default" => Ok(KernelVariant::Default),
        "realtime" => Ok(KernelVariant::Realtime),
        "64k-pages" => Ok(KernelVariant::SixtyFourK),
        other => Err(InvalidKernelType(text::quote(other))),
    };
    if names.len() > MAX_EXTENSIONS {
        return Err(ParseError::TooManyExtensions(names.len()));
    }
    let mut extensions = Vec::new();
    let mut unsupported = Vec::new();
    for name in names {
        match release.release.extension(name) {
            Some((n, _)) => extensions.push(n),
            None => unsupported.push(text::quote(name)),
        }
    }
    Ok(AppliedConfig {
        kernel_type,
        extensions,
        unsupported,
        release,
        pins,
    })
}

/// The string field `key` of `object` ("" when absent or null), or `shape` as the error.
fn string<'a>(
    object: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
    shape: &'static str,
) -> Result<&'a str, ParseError> {
    use serde_json::Value;
    match object.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(v)) => Ok(v.as_str()),
        Some(_) => Err(ParseError::Shape(shape)),
    }
}

/// `value`, cut to [`MAX_VALUE_CHARS`].
fn bounded(value: &str) -> String {
    value.chars().take(MAX_VALUE_CHARS).collect()
}

/// `metadata.annotations`' `key`, if there is one (`shape`: the error when it is no string).
fn annotation<'a>(
    mc: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
    shape: &'static str,
) -> Result<Option<&'a str>, ParseError> {
    use serde_json::Value;
    let annotations = match mc.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m.get("annotations"),
        Some(_) => return Err(ParseError::Shape("metadata is not an object")),
    };
    match annotations {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(a)) => match a.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(v)) => Ok(Some(v.as_str())),
            Some(_) => Err(ParseError::Shape(shape)),
        },
        Some(_) => Err(ParseError::Shape("metadata.annotations is not an object")),
    }
}

/// The MachineConfig the MCD applied on the host below `root`, read where the MCD reads it:
/// [`HYPERSHIFT_CURRENT_CONFIG`] (only a HyperShift-mode MCD writes it), else a non-empty
/// [`CURRENT_CONFIG`], else [`MCS_SERVED_CONFIG`]. `Ok(None)` when none of them has one (not
/// known, not an error); `Err` with the file and the reason when the one read cannot be read
/// or is not a MachineConfig (too large, not UTF-8, not JSON, fields of the wrong type).
pub fn applied(root: &HostRoot) -> Result<Option<AppliedConfig>, AppliedError> {
    for name in [HYPERSHIFT_CURRENT_CONFIG, CURRENT_CONFIG, MCS_SERVED_CONFIG] {
        let read = read(root, name).map_err(|source| AppliedError::Read { file: name, source })?;
        // HyperShift nodes carry an empty `currentconfig` (the MCD's own comment in
        // `syncNodeHypershift`): it is no record, so the next file is read.
        if let Some(json) = read.filter(|j| !j.is_empty()) {
            return parse(&json)
                .map(Some)
                .map_err(|source| AppliedError::Parse { file: name, source });
        }
    }
    Ok(None)
}

/// The text of `name` below `root`, `None` if it does not exist; at most [`MAX_BYTES`].
fn read(root: &HostRoot, name: &str) -> Result<Option<String>, ReadError> {
    let file = match std::fs::File::open(root.path(name)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReadError::Io(e.to_string())),
    };
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Io(e.to_string()))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(ReadError::TooLarge);
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| ReadError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(name: &str) -> (testbed::scratch::ScratchDir, HostRoot) {
        let d = testbed::scratch::ScratchDir::new(&format!("mc-{name}")).expect("scratch dir");
        std::fs::create_dir_all(d.join("etc/machine-config-daemon")).expect("mkdir");
        let r = HostRoot::new(d.path());
        (d, r)
    }

    fn write(d: &std::path::Path, content: &[u8]) {
        std::fs::write(d.join("etc/machine-config-daemon/currentconfig"), content).expect("w");
    }

    #[test]
    fn an_absent_file_is_unknown() {
        let (d, r) = root("absent");
        assert_eq!(applied(&r), Ok(None));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_empty_object_is_the_default_kernel_without_extensions() {
        let want = AppliedConfig {
            kernel_type: Ok(KernelVariant::Default),
            extensions: Vec::new(),
            unsupported: Vec::new(),
            release: ReleaseOf::from_annotation(None),
            pins: Pins::default(),
        };
        assert_eq!(parse("{}"), Ok(want.clone()));
        assert_eq!(parse(r#"{"spec":null}"#), Ok(want.clone()));
        assert_eq!(
            parse(r#"{"spec":{"kernelType":"","extensions":null}}"#),
            Ok(want)
        );
    }

    #[test]
    fn kernel_type_and_extensions_as_the_operator_reads_them() {
        let mc = parse(
            r#"{"kind":"MachineConfig","metadata":{"name":"rendered-worker-1"},"spec":{"osImageURL":"q/r@sha256:0","kernelType":"realtime","extensions":["usbguard","ipsec","usbguard"],"config":{"ignition":{"version":"3.5.0"}}}}"#,
        )
        .expect("parse");
        assert_eq!(mc.kernel_type, Ok(KernelVariant::Realtime));
        assert_eq!(mc.extensions, vec!["usbguard", "ipsec", "usbguard"]);
        assert_eq!(
            mc.extension_packages(),
            vec![
                "usbguard",
                "NetworkManager-libreswan",
                "libreswan",
                "openvswitch3.5-ipsec"
            ]
        );
        assert_eq!(
            parse(r#"{"spec":{"kernelType":"64k-pages"}}"#).map(|m| m.kernel_type),
            Ok(Ok(KernelVariant::SixtyFourK))
        );
    }

    /// The release annotation picks the table: `wasm` is an extension on 4.21 only, and
    /// `ipsec` installs openvswitch3.5-ipsec only from 4.23.
    #[test]
    fn the_release_annotation_picks_the_operators_table() {
        use super::super::mco_release::{McoRelease, Named};
        let of = |release: &str| {
            parse(&format!(
                r#"{{"metadata":{{"name":"rendered-worker-1","annotations":{{"machineconfiguration.openshift.io/release-image-version":"{release}"}}}},"spec":{{"extensions":["wasm","ipsec"]}}}}"#
            ))
            .expect("parse")
        };
        let mc = of("4.21.7");
        assert_eq!(mc.release.release, McoRelease::V4_21);
        assert_eq!(mc.extensions, vec!["wasm", "ipsec"]);
        assert!(mc.unsupported.is_empty());
        assert_eq!(
            mc.extension_packages(),
            vec!["crun-wasm", "NetworkManager-libreswan", "libreswan"]
        );
        let mc = of("4.22.1");
        assert_eq!(mc.unsupported, vec![r#""wasm""#.to_string()]);
        assert_eq!(
            mc.extension_packages(),
            vec!["NetworkManager-libreswan", "libreswan"]
        );
        let mc = of("4.23.0");
        assert_eq!(mc.extension_packages().len(), 3);
        let mc = of("4.19.3");
        assert_eq!(mc.release.release, McoRelease::NEWEST);
        assert_eq!(mc.release.named, Named::Unknown(r#""4.19.3""#.into()));
        assert_eq!(
            parse(r#"{"metadata":{"annotations":null}}"#).map(|m| m.release.named),
            Ok(Named::Absent)
        );
        for (json, want) in [
            (r#"{"metadata":[]}"#, "metadata is not an object"),
            (
                r#"{"metadata":{"annotations":[]}}"#,
                "metadata.annotations is not an object",
            ),
            (
                r#"{"metadata":{"annotations":{"machineconfiguration.openshift.io/release-image-version":4}}}"#,
                "annotation is not a string",
            ),
        ] {
            let e = parse(json).expect_err(json);
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    /// The images the rendered MachineConfig pins and the render controller's annotations, as
    /// pkg/controller/render/render_controller.go `generateRenderedMachineConfig` writes them.
    #[test]
    fn the_images_and_the_render_annotations_are_read() {
        let mc = parse(
            r#"{"metadata":{"annotations":{"machineconfiguration.openshift.io/os-image-url-overridden":"true","machineconfiguration.openshift.io/generated-by-controller-version":"a1b2c3"}},"spec":{"osImageURL":"q/os@sha256:1","baseOSExtensionsContainerImage":"q/ext@sha256:2"}}"#,
        )
        .expect("parse");
        assert_eq!(
            mc.pins,
            Pins {
                os_image_url: "q/os@sha256:1".into(),
                extensions_image: "q/ext@sha256:2".into(),
                os_image_url_overridden: true,
                controller_version: Some("a1b2c3".into()),
            }
        );
        let mc = parse(
            r#"{"metadata":{"annotations":{"machineconfiguration.openshift.io/os-image-url-overridden":"false"}},"spec":{"osImageURL":null}}"#,
        )
        .expect("parse");
        assert_eq!(mc.pins, Pins::default());
        let long = "x".repeat(5000);
        let mc = parse(&format!(r#"{{"spec":{{"osImageURL":"{long}"}}}}"#)).expect("parse");
        assert_eq!(mc.pins.os_image_url.chars().count(), MAX_VALUE_CHARS);
        for (json, want) in [
            (
                r#"{"spec":{"osImageURL":1}}"#,
                "spec.osImageURL is not a string",
            ),
            (
                r#"{"spec":{"baseOSExtensionsContainerImage":[]}}"#,
                "spec.baseOSExtensionsContainerImage is not a string",
            ),
            (
                r#"{"metadata":{"annotations":{"machineconfiguration.openshift.io/os-image-url-overridden":true}}}"#,
                "os-image-url-overridden annotation is not a string",
            ),
        ] {
            let e = parse(json).expect_err(json);
            assert!(e.to_string().contains(want), "{e}");
        }
    }

    #[test]
    fn an_unknown_kernel_type_or_extension_is_kept_quoted_and_bounded() {
        let long = "x".repeat(5000);
        let mc = parse(&format!(
            r#"{{"spec":{{"kernelType":"rt\u001b[31m{long}","extensions":["usbguard","bogus\n"]}}}}"#
        ))
        .expect("parse");
        let k = mc.kernel_type.expect_err("invalid kernel type").0;
        assert!(
            k.starts_with("\"rt\\u{1b}[31mxx") && k.chars().count() < 100,
            "{k}"
        );
        assert_eq!(mc.extensions, vec!["usbguard"]);
        assert_eq!(mc.unsupported, vec![r#""bogus\n""#.to_string()]);
    }

    #[test]
    fn a_malformed_file_is_a_clear_reason() {
        let (d, r) = root("malformed");
        for (content, want) in [
            (&b"{\"spec\":"[..], "not JSON: EOF while parsing"),
            (b"[]", "not a MachineConfig: not a JSON object"),
            (br#"{"spec":[]}"#, "spec is not an object"),
            (
                br#"{"spec":{"kernelType":7}}"#,
                "spec.kernelType is not a string",
            ),
            (
                br#"{"spec":{"extensions":"usbguard"}}"#,
                "spec.extensions is not a list",
            ),
            (
                br#"{"spec":{"extensions":[1]}}"#,
                "spec.extensions is not a list of strings",
            ),
            (b"\xff\xfe", "not UTF-8"),
        ] {
            write(&d, content);
            let e = applied(&r).expect_err("malformed").to_string();
            assert!(
                e.starts_with("/etc/machine-config-daemon/currentconfig: ") && e.contains(want),
                "{e}"
            );
        }
        let many: Vec<String> = (0..65).map(|i| format!("\"e{i}\"")).collect();
        write(
            &d,
            format!(r#"{{"spec":{{"extensions":[{}]}}}}"#, many.join(",")).as_bytes(),
        );
        assert!(
            applied(&r)
                .expect_err("too many")
                .to_string()
                .contains("65 entries")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// HyperShift: `currentconfig` is empty, the MCD's record is `/etc/mcd-currentconfig.json`,
    /// and before the MCD first applied a change the MCS-served config is the applied one.
    #[test]
    fn hypershift_nodes_are_read_where_their_mcd_keeps_the_record() {
        let (d, r) = root("hypershift");
        let put = |name: &str, content: &str| {
            std::fs::write(d.join(name.trim_start_matches('/')), content).expect("w");
        };
        let kernel = |r: &HostRoot| applied(r).map(|m| m.map(|m| m.kernel_type));
        write(&d, b"");
        assert_eq!(kernel(&r), Ok(None), "an empty currentconfig is no record");
        put(MCS_SERVED_CONFIG, r#"{"spec":{"kernelType":"64k-pages"}}"#);
        assert_eq!(kernel(&r), Ok(Some(Ok(KernelVariant::SixtyFourK))));
        put(
            HYPERSHIFT_CURRENT_CONFIG,
            r#"{"spec":{"kernelType":"realtime"}}"#,
        );
        assert_eq!(kernel(&r), Ok(Some(Ok(KernelVariant::Realtime))));
        put(HYPERSHIFT_CURRENT_CONFIG, "{");
        let e = applied(&r).expect_err("malformed").to_string();
        assert!(
            e.starts_with("/etc/mcd-currentconfig.json: not JSON"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A classic node: the MCD's `currentconfig` wins over what the MCS served at install.
    #[test]
    fn the_mcds_record_wins_over_the_config_served_at_install() {
        let (d, r) = root("classic");
        std::fs::write(
            d.join(MCS_SERVED_CONFIG.trim_start_matches('/')),
            r#"{"spec":{"kernelType":"realtime"}}"#,
        )
        .expect("w");
        write(&d, br#"{"spec":{"extensions":["usbguard"]}}"#);
        let mc = applied(&r).expect("read").expect("known");
        assert_eq!(mc.kernel_type, Ok(KernelVariant::Default));
        assert_eq!(mc.extensions, vec!["usbguard"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_huge_file_is_refused_unread() {
        let (d, r) = root("huge");
        let mut big = br#"{"spec":{"kernelType":"realtime"},"pad":""#.to_vec();
        big.resize(MAX_BYTES as usize + 10, b'a');
        big.extend_from_slice(br#""}"#);
        write(&d, &big);
        let e = applied(&r).expect_err("huge").to_string();
        assert!(e.contains("larger than 2097152 bytes"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
