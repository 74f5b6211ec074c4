//! What the machine-config operator makes of the cluster's OSImageStream for this node's pool,
//! judged from the rendered MachineConfig its daemon applied (docs/protocol.md "Modes and
//! readiness"): readiness does not promise a move the operator will not make.
//!
//! - A user MachineConfig that sets `osImageURL` pins the pool: the render controller marks the
//!   rendered MachineConfig [`OS_IMAGE_URL_OVERRIDDEN`]; on 4.21 that image wins over any
//!   stream's, from 4.22 a pool that sets both fails to render (`RenderDegraded`:
//!   "cannot override MachineConfig osImageURL and set MachineConfigPool spec.osImageStream.name
//!   simultaneously"). Either way no stream applies ([`pinned`]).
//! - A user MachineConfig that sets `baseOSExtensionsContainerImage` wins over the stream's on
//!   every release, unannotated (pkg/controller/common/helpers.go `MergeMachineConfigs`): the
//!   move installs from that image ([`extensions_override`]).
//! - From 4.22 the render controller ignores an OSImageStream another operator build wrote, or
//!   one without the build annotation (pkg/controller/render/render_controller.go
//!   `getOSImageStreamForPool`: "ignoring OSImageStream with version %s (my version: %s)");
//!   4.21 has no such guard ([`ignored`]).
//!
//! Read from openshift/machine-config-operator `release-4.21` (db84d8368), `release-4.22`
//! (9027c94cd) and `release-4.23` (d20efd9b9); docs/upstream/mco-releases.md §4.

use crate::cluster::streams::{self, StreamImages};
use crate::host::facts::machineconfig::{AppliedConfig, OS_IMAGE_URL_OVERRIDDEN};
use crate::host::facts::mco_release::McoRelease;
use crate::image::reference::{ImageRef, ImageRefError};
use crate::text;

/// Why no stream applies to the pool of a node whose applied MachineConfig is `mc`: its
/// `osImageURL` is a user's override. `None` when the operator takes the stream's image.
pub fn pinned(mc: &AppliedConfig) -> Option<String> {
    if !mc.pins.os_image_url_overridden {
        return None;
    }
    let what = if mc.release.release == McoRelease::V4_21 {
        "release 4.21's machine-config operator keeps that image over any stream's"
    } else {
        "from release 4.22 the machine-config operator will not render a pool that also sets spec.osImageStream.name (RenderDegraded)"
    };
    Some(format!(
        "stream not applicable: the pool overrides osImageURL ({OS_IMAGE_URL_OVERRIDDEN}); {what}: remove that osImageURL first; it is {}",
        text::quote(&mc.pins.os_image_url)
    ))
}

/// Why the operator ignores the OSImageStream whose build annotation is `written_by`
/// ([`streams::VERSION_ANNOTATION`]) for a node whose applied MachineConfig is `mc`: from 4.22
/// its render controller takes only one its own build wrote. The node cannot ask the
/// controller its build; the build that rendered the node's MachineConfig
/// (`generated-by-controller-version`) stands for it, so the two disagree while an upgrade
/// rolls out. `None` when the operator reads the stream (or the node cannot tell).
pub fn ignored(mc: &AppliedConfig, written_by: Option<&str>) -> Option<String> {
    if mc.release.release == McoRelease::V4_21 {
        return None;
    }
    let by = mc.release.release.as_str();
    match (written_by, mc.pins.controller_version.as_deref()) {
        (None, _) => Some(format!(
            "the machine-config operator ignores OSImageStream {:?}: it has no {} annotation (from release 4.22 the operator renders only from one its own build wrote; judged as release {by})",
            streams::NAME,
            streams::VERSION_ANNOTATION
        )),
        (Some(stream), Some(mine)) if stream != mine => Some(format!(
            "the machine-config operator ignores OSImageStream {:?}: operator build {} wrote it, build {} rendered this node's MachineConfig (an upgrade under way?); checked again once they agree (judged as release {by})",
            streams::NAME,
            text::quote(stream),
            text::quote(mine)
        )),
        _ => None,
    }
}

/// The extensions image a user MachineConfig put in place of the stream's, when `mc` carries
/// one: a `baseOSExtensionsContainerImage` that is none of the `entries`' (the operator's own
/// value is the pool's stream's, or the default stream's when it has none). Told only when
/// the operator build that wrote the OSImageStream rendered the MachineConfig too (else the
/// stream's images may be another release's). `Err`: the override is no digest-pinned
/// reference, which streamd does not read.
pub fn extensions_override(
    mc: &AppliedConfig,
    entries: &[StreamImages],
) -> Option<Result<ImageRef, UnpinnedOverride>> {
    let image = mc.pins.extensions_image.as_str();
    let same_build = entries.first().is_some_and(|e| {
        e.written_by.is_some() && e.written_by.as_deref() == mc.pins.controller_version.as_deref()
    });
    if image.is_empty() || !same_build || entries.iter().any(|e| e.os_extensions_image == image) {
        return None;
    }
    Some(image.parse().map_err(UnpinnedOverride))
}

/// A user MachineConfig's `baseOSExtensionsContainerImage` that streamd cannot check: no
/// digest-pinned reference. The message is the node's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pool overrides baseOSExtensionsContainerImage, which the machine-config operator installs from instead of the stream's, with an image streamd cannot check ({0}); pin it by digest"
)]
pub struct UnpinnedOverride(pub ImageRefError);

impl UnpinnedOverride {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        "extensions-override-unpinned"
    }
}

#[cfg(test)]
/// Fixtures shared with the agent's readiness tests, which judge the same MachineConfigs.
pub(crate) mod tests {
    use super::*;
    use crate::host::facts::machineconfig::parse;

    pub(crate) const OS: &str =
        "quay.io/o/os@sha256:0000000000000000000000000000000000000000000000000000000000000001";
    pub(crate) const EXT: &str =
        "quay.io/o/ext@sha256:0000000000000000000000000000000000000000000000000000000000000002";
    pub(crate) const MINE: &str =
        "quay.io/o/mine@sha256:0000000000000000000000000000000000000000000000000000000000000003";

    /// A rendered MachineConfig of `release` by controller build `build`, with `annotations`
    /// and `spec` (JSON object bodies).
    pub(crate) fn mc(release: &str, build: &str, annotations: &str, spec: &str) -> AppliedConfig {
        let comma = if annotations.is_empty() { "" } else { "," };
        parse(&format!(
            r#"{{"metadata":{{"annotations":{{"machineconfiguration.openshift.io/release-image-version":"{release}","machineconfiguration.openshift.io/generated-by-controller-version":"{build}"{comma}{annotations}}}}},"spec":{{{spec}}}}}"#
        ))
        .expect("parse")
    }

    fn entry(name: &str, ext: &str, written_by: Option<&str>) -> StreamImages {
        StreamImages {
            name: name.into(),
            os_image: OS.into(),
            os_extensions_image: ext.into(),
            written_by: written_by.map(String::from),
        }
    }

    /// On the old code a pinned pool was checked as if the stream applied.
    #[test]
    fn an_overridden_os_image_url_pins_the_pool_on_every_release() {
        let overridden = r#""machineconfiguration.openshift.io/os-image-url-overridden":"true""#;
        let spec = format!(r#""osImageURL":"{MINE}""#);
        let r = pinned(&mc("4.21.3", "b", overridden, &spec)).expect("pinned");
        assert!(
            r.starts_with("stream not applicable: the pool overrides osImageURL")
                && r.contains("keeps that image over any stream's")
                && r.contains("it is \"quay.io/o/mine@sha256:"),
            "{r}"
        );
        let r = pinned(&mc("4.22.0", "b", overridden, &spec)).expect("pinned");
        assert!(r.contains("RenderDegraded"), "{r}");
        assert_eq!(pinned(&mc("4.23.0", "b", "", &spec)), None);
    }

    #[test]
    fn the_version_guard_holds_from_4_22() {
        let m = mc("4.22.1", "abc", "", "");
        assert_eq!(ignored(&m, Some("abc")), None);
        let r = ignored(&m, Some("def")).expect("ignored");
        assert!(
            r.contains(r#"build "def" wrote it, build "abc" rendered"#),
            "{r}"
        );
        let r = ignored(&m, None).expect("ignored");
        assert!(
            r.contains("has no machineconfiguration.openshift.io/release-image-version annotation"),
            "{r}"
        );
        assert!(ignored(&mc("4.23.0", "abc", "", ""), Some("def")).is_some());
        // Another release than streamd knows: judged as the newest, which guards.
        assert!(ignored(&mc("4.30.0", "abc", "", ""), None).is_some());
        // 4.21's render controller reads any OSImageStream.
        assert_eq!(ignored(&mc("4.21.0", "abc", "", ""), Some("def")), None);
        assert_eq!(ignored(&mc("4.21.0", "abc", "", ""), None), None);
        // No build on the MachineConfig: nothing to compare with.
        let bare = parse(r#"{"metadata":{"annotations":{"machineconfiguration.openshift.io/release-image-version":"4.22.0"}}}"#).expect("parse");
        assert_eq!(ignored(&bare, Some("def")), None);
    }

    #[test]
    fn an_extensions_image_none_of_the_streams_has_is_a_users() {
        let spec = format!(r#""baseOSExtensionsContainerImage":"{MINE}""#);
        let m = mc("4.22.0", "abc", "", &spec);
        let streams = [
            entry("rhel-9", EXT, Some("abc")),
            entry("rhel-10", EXT, Some("abc")),
        ];
        assert_eq!(
            extensions_override(&m, &streams).map(|i| i.map(|i| i.to_string())),
            Some(Ok(MINE.to_string()))
        );
        let ours = mc(
            "4.22.0",
            "abc",
            "",
            &format!(r#""baseOSExtensionsContainerImage":"{EXT}""#),
        );
        assert_eq!(
            extensions_override(&ours, &streams),
            None,
            "the stream's own"
        );
        let other_build = [entry("rhel-10", EXT, Some("def"))];
        assert_eq!(extensions_override(&m, &other_build), None, "cannot tell");
        assert_eq!(
            extensions_override(&m, &[entry("rhel-10", EXT, None)]),
            None
        );
        assert_eq!(
            extensions_override(&mc("4.22.0", "abc", "", ""), &streams),
            None
        );
        let tag = mc(
            "4.22.0",
            "abc",
            "",
            r#""baseOSExtensionsContainerImage":"quay.io/o/ext:latest""#,
        );
        let e = extensions_override(&tag, &streams)
            .expect("overridden")
            .expect_err("not pinned");
        assert!(e.to_string().contains("pin it by digest"), "{e}");
        assert_eq!(e.label(), "extensions-override-unpinned");
    }
}
