//! The packages an OS image's base holds, read from its manifest before anything is pulled.
//!
//! A chunked ostree container image (`rpm-ostree compose image` / `container-encapsulate` /
//! `build-chunked-oci`, which is how RHEL CoreOS is built) puts the ostree commit in its first
//! layer and the packages' content in the layers after it, each annotated
//! `ostree.components` with the sorted names of the packages it holds, joined by `,`
//! (ostree-ext `container/encapsulate.rs` `export_chunked`, names from rpm-ostree
//! `rust/src/container.rs`; the same in ostree-ext 0.15 and rpm-ostree v2025.5). The union is
//! the base's package list, without reading the rpmdb inside the image.
//!
//! It is complete only when every layer but one (the commit's, first in ostree-ext's format 1;
//! its place is not relied on) carries the annotation: a layer added on top (a Containerfile's
//! `RUN dnf install`, on-cluster layering) is not annotated and may hold packages no annotation
//! names. Then the list is unknown, not partial.

use std::collections::BTreeSet;

/// At most this many names are kept: a real base has about a thousand packages. A manifest
/// that lists more is not believed (the list is then unknown).
const MAX_NAMES: usize = 20_000;

/// The longest package name believed (RPM has no limit; real names are far shorter).
const MAX_NAME: usize = 256;

/// The package names the layers' `ostree.components` annotations list, when they describe the
/// whole image (see the module doc); `None` when they do not, or when a name is not a package
/// name (the annotation is registry text: it is never passed on, only compared).
pub fn base_packages<'a>(
    layer_annotations: impl IntoIterator<Item = Option<&'a str>>,
) -> Option<BTreeSet<String>> {
    let layers: Vec<Option<&str>> = layer_annotations.into_iter().collect();
    let annotated: Vec<&str> = layers.iter().flatten().copied().collect();
    // One layer (the ostree commit's) may go without; at least one content layer must be there.
    if annotated.is_empty() || layers.len() - annotated.len() > 1 {
        return None;
    }
    let mut names = BTreeSet::new();
    for layer in annotated {
        for name in layer.split(',').filter(|n| !n.is_empty()) {
            if !is_package_name(name) || names.len() >= MAX_NAMES {
                return None;
            }
            names.insert(name.to_string());
        }
    }
    (!names.is_empty()).then_some(names)
}

/// RPM package names as distributions spell them: ASCII letters, digits and `-._+`.
fn is_package_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._+".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row: what it shows, the layers' annotations, the list expected.
    type Row<'a> = (&'a str, &'a [Option<&'a str>], Option<BTreeSet<String>>);

    fn names(list: &[&str]) -> Option<BTreeSet<String>> {
        Some(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn the_list_is_read_only_from_a_wholly_annotated_image() {
        let table: &[Row] = &[
            (
                "chunked: commit layer, then annotated content layers",
                &[
                    None,
                    Some("bash,kernel-core"),
                    Some("kernel,kernel-modules"),
                ],
                names(&["bash", "kernel", "kernel-core", "kernel-modules"]),
            ),
            (
                "the unannotated commit layer may be anywhere",
                &[Some("kernel-core"), None],
                names(&["kernel-core"]),
            ),
            (
                "every layer annotated",
                &[Some("bash"), Some("kernel-core")],
                names(&["bash", "kernel-core"]),
            ),
            ("one layer: no content layer", &[None], None),
            ("no layers", &[], None),
            (
                "a derived layer without the annotation",
                &[None, Some("kernel-core"), None],
                None,
            ),
            (
                "a name that is not a package name",
                &[None, Some("kernel-core,bad name")],
                None,
            ),
            ("empty annotations list nothing", &[None, Some("")], None),
            (
                "empty items are skipped",
                &[None, Some("kernel-core,,bash,")],
                names(&["bash", "kernel-core"]),
            ),
        ];
        for (what, layers, want) in table {
            assert_eq!(&base_packages(layers.iter().copied()), want, "{what}");
        }
    }

    #[test]
    fn an_oversized_list_is_not_believed() {
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("p{i}")).collect();
        let joined = many.join(",");
        assert_eq!(base_packages([None, Some(joined.as_str())]), None);
        let long = "a".repeat(MAX_NAME + 1);
        assert_eq!(base_packages([None, Some(long.as_str())]), None);
    }
}
