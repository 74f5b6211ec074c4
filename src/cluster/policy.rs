//! The node's image policy: which images a `desired-*` or `check-*` request may name, judged
//! before any registry is read (docs/reliability.md "Image policy"). Whoever can annotate the
//! Node must not thereby choose what the node boots.
//!
//! `allowed-repositories` lists [`RepositoryScope`]s; unset, the node takes images from the
//! booted image's repository and from the repositories of the cluster's OSImageStream (once it
//! has been read). `resolved-only` takes only the images the OSImageStream gives the requested
//! stream, so an explicit image cannot bypass it. [`judge`] is pure; the table tests below cover
//! it.

use std::fmt;

use crate::cluster::protocol::Desired;
use crate::cluster::streams::{self, Catalog, ResolveError, StreamImages};
use crate::config::{ImagePolicy, RepositoryScope};
use crate::image::reference::ImageRef;
use crate::text::quote;

/// Most items a reason lists (scopes, repositories, streams) before it says how many more.
const MAX_LISTED: usize = 8;

/// What the policy says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The request may be read and staged; the text says by which rules.
    Allowed(String),
    /// The request is refused; the text names the rule and the repository or image.
    Refused(String),
    /// The decision needs the cluster's OSImageStream, which cannot be used yet.
    Wait(Wait),
}

/// Why the cluster's OSImageStream cannot decide yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// It has not been read yet (the watch is on its way).
    NotRead,
    /// It was read and says nothing usable yet: not reconciled, or forbidden.
    Unusable(String),
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::NotRead => write!(
                f,
                "waiting for the first read of OSImageStream {:?}, which the image policy needs to judge the request",
                streams::NAME
            ),
            Wait::Unusable(reason) => write!(
                f,
                "the image policy needs the cluster's OSImageStream to judge the request: {reason}"
            ),
        }
    }
}

/// The policy's verdict on `desired`: its OS and extensions images must be in an allowed
/// repository (`allowed-repositories`, or by default the repository of `booted`, the booted
/// image's pullspec, and those of `catalog`), and with `resolved-only` they must be the ones
/// `catalog` gives the stream. `catalog` is `None` until the cluster's streams were read; it
/// is consulted only when the rules need it.
pub fn judge(
    policy: &ImagePolicy,
    desired: &Desired,
    booted: Option<&str>,
    catalog: Option<&Catalog>,
) -> Verdict {
    let images = std::iter::once(("OS image", &desired.os_image)).chain(
        desired
            .extensions_image
            .as_ref()
            .map(|e| ("extensions image", e)),
    );
    let mut allowed = Vec::new();
    for (what, image) in images {
        let rule = match &policy.allowed_repositories {
            Some(scopes) => listed(what, image, scopes),
            None => by_default(what, image, booted, catalog),
        };
        match rule {
            Ok(why) => allowed.push(why),
            Err(v) => return v,
        }
    }
    if policy.resolved_only {
        match resolved(desired, catalog) {
            Ok(why) => allowed.push(why),
            Err(v) => return v,
        }
    }
    Verdict::Allowed(allowed.join("; "))
}

/// Whether judging `desired` needs the cluster's OSImageStream (the node then watches it).
pub fn needs_catalog(policy: &ImagePolicy, desired: &Desired, booted: Option<&str>) -> bool {
    matches!(judge(policy, desired, booted, None), Verdict::Wait(_))
}

/// `host[:port]/repository` of `image`.
fn repository(image: &ImageRef) -> String {
    format!("{}/{}", image.registry(), image.repository())
}

/// `image` for a reason: its repository quoted (so cut to a bounded length) and its whole
/// digest, which tells two images of one repository apart.
fn shown(image: &ImageRef) -> String {
    format!("{}@{}", quote(&repository(image)), image.digest())
}

fn allows(scope: &RepositoryScope, image: &ImageRef) -> bool {
    scope.allows(image.registry(), image.repository())
}

/// `allowed-repositories`: the first scope that allows `image`.
fn listed(what: &str, image: &ImageRef, scopes: &[RepositoryScope]) -> Result<String, Verdict> {
    let repo = quote(&repository(image));
    match scopes.iter().find(|s| allows(s, image)) {
        Some(s) => Ok(format!(
            "the {what}'s repository {repo} is allowed by {} in allowed-repositories",
            quote(&s.to_string())
        )),
        None => Err(Verdict::Refused(format!(
            "allowed-repositories: the {what}'s repository {repo} is not in streamd's allowed-repositories ({})",
            list(scopes.iter().map(ToString::to_string))
        ))),
    }
}

/// The default: the booted image's repository, else one of the cluster's OSImageStream.
fn by_default(
    what: &str,
    image: &ImageRef,
    booted: Option<&str>,
    catalog: Option<&Catalog>,
) -> Result<String, Verdict> {
    let repo = quote(&repository(image));
    let booted = booted.and_then(RepositoryScope::of_pullspec);
    if booted.as_ref().is_some_and(|b| allows(b, image)) {
        return Ok(format!(
            "the {what}'s repository {repo} is the booted image's"
        ));
    }
    // The streams, and why there are none.
    let (entries, none) = match known(catalog)? {
        Known::Streams(entries) => (entries, None),
        Known::Missing => (&[][..], Some("none: it does not exist")),
        Known::NotServed => (
            &[][..],
            Some("none: the cluster serves no OSImageStream API"),
        ),
    };
    let offered = catalog_repositories(entries);
    if offered.iter().any(|s| allows(s, image)) {
        return Ok(format!(
            "the {what}'s repository {repo} is one of the cluster's OSImageStream"
        ));
    }
    let booted = booted.map_or_else(
        || "unknown: the booted deployment names no container image".to_string(),
        |b| quote(&b.to_string()),
    );
    let offered = none.map_or_else(
        || list(offered.iter().map(ToString::to_string)),
        String::from,
    );
    Err(Verdict::Refused(format!(
        "default image policy (allowed-repositories unset): the {what}'s repository {repo} is neither the booted image's ({booted}) nor one of the cluster's OSImageStream {:?} ({offered}); to take it, list it in allowed-repositories in streamd's config",
        streams::NAME
    )))
}

/// What the cluster's OSImageStream says, once the policy can use it.
enum Known<'a> {
    /// These streams.
    Streams(&'a [StreamImages]),
    /// There is no OSImageStream `cluster`.
    Missing,
    /// The cluster serves no OSImageStream API.
    NotServed,
}

/// `catalog` as the policy can use it, or the verdict to wait: not read yet, not reconciled,
/// or forbidden.
fn known(catalog: Option<&Catalog>) -> Result<Known<'_>, Verdict> {
    let unusable = |why: String| Err(Verdict::Wait(Wait::Unusable(why)));
    match catalog {
        None => Err(Verdict::Wait(Wait::NotRead)),
        Some(Catalog::Unreconciled) => unusable(ResolveError::Unreconciled.to_string()),
        Some(Catalog::Unreadable(reason)) => unusable(reason.clone()),
        Some(Catalog::Available(entries)) => Ok(Known::Streams(entries)),
        Some(Catalog::Missing) => Ok(Known::Missing),
        Some(Catalog::NotServed) => Ok(Known::NotServed),
    }
}

/// The repositories of every image the cluster's streams name, each once, in their order.
fn catalog_repositories(entries: &[StreamImages]) -> Vec<RepositoryScope> {
    let mut out: Vec<RepositoryScope> = Vec::new();
    for pullspec in entries
        .iter()
        .flat_map(|e| [&e.os_image, &e.os_extensions_image])
    {
        if let Some(s) = RepositoryScope::of_pullspec(pullspec)
            && !out.contains(&s)
        {
            out.push(s);
        }
    }
    out
}

/// `resolved-only`: the images must be the ones the cluster's OSImageStream gives the stream
/// (a request without an extensions image takes none).
fn resolved(desired: &Desired, catalog: Option<&Catalog>) -> Result<String, Verdict> {
    let refuse = |why: String| Err(Verdict::Refused(format!("resolved-only: {why}")));
    let entries = match known(catalog)? {
        Known::Missing => {
            return refuse(format!(
                "OSImageStream {:?} does not exist, so no image is the cluster's",
                streams::NAME
            ));
        }
        Known::NotServed => {
            return refuse(
                "the cluster serves no OSImageStream API, so no image is the cluster's".into(),
            );
        }
        Known::Streams(entries) => entries,
    };
    let stream = quote(&desired.stream);
    let Some(entry) = entries.iter().find(|e| e.name == desired.stream) else {
        return refuse(format!(
            "stream {stream} is not in the cluster's OSImageStream {:?} (available: {})",
            streams::NAME,
            list(entries.iter().map(|e| e.name.clone()))
        ));
    };
    let given = [
        ("OS image", Some(&desired.os_image), &entry.os_image),
        (
            "extensions image",
            desired.extensions_image.as_ref(),
            &entry.os_extensions_image,
        ),
    ];
    for (what, image, theirs) in given {
        if let Some(image) = image
            && image.to_string() != *theirs
        {
            let theirs = match theirs.as_str() {
                "" => "none".to_string(),
                t => t.parse().map_or_else(|_| quote(t), |t| shown(&t)),
            };
            return refuse(format!(
                "the {what} {} is not the one the cluster's OSImageStream gives stream {stream} ({theirs})",
                shown(image)
            ));
        }
    }
    Ok(format!(
        "resolved-only: the images are those the cluster's OSImageStream gives stream {stream}"
    ))
}

/// `items`, each quoted, at most [`MAX_LISTED`] of them; `none` for no item.
fn list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        return "none".into();
    }
    let mut shown: Vec<String> = items.iter().take(MAX_LISTED).map(|i| quote(i)).collect();
    if items.len() > MAX_LISTED {
        shown.push(format!("and {} more", items.len() - MAX_LISTED));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::Inputs;

    fn pin(repo: &str, c: char) -> String {
        format!("{repo}@sha256:{}", c.to_string().repeat(64))
    }

    const BOOTED: &str = "quay.io/openshift-release-dev/ocp-v4.0-art-dev";
    /// A repository the cluster's OSImageStream names, and the node did not boot from.
    const MIRROR: &str = "mirror.example:5000/ocp/release";

    fn desired(os: &str, ext: Option<&str>) -> Desired {
        Inputs {
            stream: Some("rhel-10".into()),
            os_image: Some(os.into()),
            extensions_image: ext.map(String::from),
            reboot_approved: None,
        }
        .desired()
        .expect("valid")
        .expect("present")
    }

    fn catalog(entries: &[(&str, &str, &str)]) -> Catalog {
        Catalog::Available(
            entries
                .iter()
                .map(|(name, os, ext)| StreamImages {
                    name: name.to_string(),
                    os_image: os.to_string(),
                    os_extensions_image: ext.to_string(),
                    written_by: None,
                })
                .collect(),
        )
    }

    /// The cluster offers rhel-10 from [`MIRROR`], its extensions from `quay.io/ext/os`.
    fn mirror_catalog() -> Catalog {
        catalog(&[("rhel-10", &pin(MIRROR, '1'), &pin("quay.io/ext/os", '2'))])
    }

    fn scopes(s: &[&str]) -> ImagePolicy {
        ImagePolicy {
            allowed_repositories: Some(s.iter().map(|s| s.parse().expect("scope")).collect()),
            resolved_only: false,
        }
    }

    /// What is judged, on which request, booted image and catalog; the verdict's kind and
    /// words in its text.
    type Case<'a> = (
        &'a str,
        Desired,
        Option<&'a str>,
        Option<&'a Catalog>,
        &'a str,
        &'a str,
    );

    /// `Allowed`, `Refused` or `Wait`, and the text.
    fn kind(v: &Verdict) -> (&'static str, String) {
        match v {
            Verdict::Allowed(m) => ("Allowed", m.clone()),
            Verdict::Refused(m) => ("Refused", m.clone()),
            Verdict::Wait(w) => ("Wait", w.to_string()),
        }
    }

    /// Judges every case under `policy`.
    fn judged(policy: &ImagePolicy, cases: Vec<Case>) {
        for (what, d, booted, cat, want, words) in cases {
            let (got, text) = kind(&judge(policy, &d, booted, cat));
            assert_eq!(got, want, "{what}: {text}");
            assert!(text.contains(words), "{what}: {text}");
        }
    }

    #[test]
    fn the_default_takes_the_booted_repository_without_reading_the_catalog() {
        let booted = pin(BOOTED, 'b');
        let cat = mirror_catalog();
        let by_tag = format!("{BOOTED}:4.19");
        let below = format!("{BOOTED}x");
        // (what, desired, booted, catalog, verdict, words in the text)
        let cases: Vec<Case> = vec![
            (
                "booted repository, catalog unread",
                desired(&pin(BOOTED, 'a'), None),
                Some(&booted),
                None,
                "Allowed",
                "booted image's",
            ),
            (
                "booted by tag",
                desired(&pin(BOOTED, 'a'), None),
                Some(&by_tag),
                None,
                "Allowed",
                "booted image's",
            ),
            (
                "a longer last component is another repository",
                desired(&pin(&below, 'a'), None),
                Some(&booted),
                Some(&cat),
                "Refused",
                "default image policy",
            ),
            (
                "elsewhere, catalog unread: wait",
                desired(&pin("evil.example/os", 'a'), None),
                Some(&booted),
                None,
                "Wait",
                "first read of OSImageStream",
            ),
            (
                "elsewhere, not in the catalog",
                desired(&pin("evil.example/os", 'a'), None),
                Some(&booted),
                Some(&cat),
                "Refused",
                "\"evil.example/os\"",
            ),
            (
                "extensions image elsewhere",
                desired(&pin(BOOTED, 'a'), Some(&pin("evil.example/ext", '7'))),
                Some(&booted),
                Some(&cat),
                "Refused",
                "the extensions image's repository \"evil.example/ext\"",
            ),
        ];
        judged(&ImagePolicy::default(), cases);
        // The OSImageStream is watched only for what the booted repository does not cover.
        let default = ImagePolicy::default();
        let inside = desired(&pin(BOOTED, 'a'), Some(&pin(BOOTED, 'e')));
        let outside_ext = desired(&pin(BOOTED, 'a'), Some(&pin(MIRROR, 'e')));
        assert!(!needs_catalog(&default, &inside, Some(&booted)));
        assert!(needs_catalog(&default, &outside_ext, Some(&booted)));
        assert!(needs_catalog(&default, &inside, None));
    }

    #[test]
    fn the_default_takes_the_clusters_repositories_once_it_knows_them() {
        let booted = pin(BOOTED, 'b');
        let cat = mirror_catalog();
        let forbidden = Catalog::Unreadable("forbidden".into());
        let cases: Vec<Case> = vec![
            (
                "the catalog's repository, another digest",
                desired(&pin(MIRROR, '9'), None),
                Some(&booted),
                Some(&cat),
                "Allowed",
                "one of the cluster's",
            ),
            (
                "the catalog's extensions repository",
                desired(&pin(BOOTED, 'a'), Some(&pin("quay.io/ext/os", '7'))),
                Some(&booted),
                Some(&cat),
                "Allowed",
                "extensions image's repository",
            ),
            (
                "no booted image: only the catalog",
                desired(&pin(BOOTED, 'a'), None),
                None,
                Some(&cat),
                "Refused",
                "unknown: the booted deployment names no container image",
            ),
            (
                "no booted image, catalog repository",
                desired(&pin(MIRROR, 'a'), None),
                None,
                Some(&cat),
                "Allowed",
                "one of the cluster's",
            ),
            (
                "no OSImageStream",
                desired(&pin(MIRROR, 'a'), None),
                Some(&booted),
                Some(&Catalog::Missing),
                "Refused",
                "none: it does not exist",
            ),
            (
                "no OSImageStream API",
                desired(&pin(MIRROR, 'a'), None),
                Some(&booted),
                Some(&Catalog::NotServed),
                "Refused",
                "serves no OSImageStream API",
            ),
            (
                "not reconciled: wait",
                desired(&pin(MIRROR, 'a'), None),
                Some(&booted),
                Some(&Catalog::Unreconciled),
                "Wait",
                "not reconciled",
            ),
            (
                "forbidden: wait",
                desired(&pin(MIRROR, 'a'), None),
                Some(&booted),
                Some(&forbidden),
                "Wait",
                "forbidden",
            ),
        ];
        judged(&ImagePolicy::default(), cases);
    }

    #[test]
    fn listed_scopes_decide_alone() {
        let cat = catalog(&[("rhel-10", &pin("quay.io/cat/os", '1'), "")]);
        let booted = pin(BOOTED, 'b');
        // (scopes, OS image, verdict, words)
        let cases = [
            (
                vec!["quay.io/openshift"],
                pin("quay.io/openshift/rhcos", 'a'),
                "Allowed",
                "\"quay.io/openshift\" in allowed-repositories",
            ),
            (
                vec!["quay.io/openshift"],
                pin("quay.io/openshiftx/rhcos", 'a'),
                "Refused",
                "allowed-repositories: the OS image's repository \"quay.io/openshiftx/rhcos\"",
            ),
            (
                vec!["quay.io/openshift"],
                pin("quay.io:443/openshift/rhcos", 'a'),
                "Refused",
                "(\"quay.io/openshift\")",
            ),
            (
                vec!["r.example:5000"],
                pin("r.example:5000/any/repo", 'a'),
                "Allowed",
                "\"r.example:5000\"",
            ),
            (
                vec!["r.example:5000"],
                pin("r.example:5001/any/repo", 'a'),
                "Refused",
                "not in streamd's allowed-repositories",
            ),
            (vec!["*"], pin("evil.example/os", 'a'), "Allowed", "\"*\""),
            // A list replaces the default: neither the booted nor the catalog's repository.
            (
                vec!["r.example"],
                pin(BOOTED, 'a'),
                "Refused",
                "allowed-repositories",
            ),
            (
                vec!["r.example"],
                pin("quay.io/cat/os", 'a'),
                "Refused",
                "allowed-repositories",
            ),
        ];
        for (s, os, want, words) in cases {
            let policy = scopes(&s);
            let d = desired(&os, None);
            for cat in [None, Some(&cat)] {
                let (got, text) = kind(&judge(&policy, &d, Some(&booted), cat));
                assert_eq!(got, want, "{s:?} {os}: {text}");
                assert!(text.contains(words), "{s:?} {os}: {text}");
            }
            assert!(!needs_catalog(&policy, &d, Some(&booted)), "{s:?} {os}");
        }
        let many: Vec<String> = (0..20).map(|i| format!("r{i}.example")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let (_, text) = kind(&judge(
            &scopes(&many),
            &desired(&pin(BOOTED, 'a'), None),
            None,
            None,
        ));
        assert!(text.contains("and 12 more") && text.len() < 400, "{text}");
    }

    /// With `resolved-only`, rhel-10's images in the catalog: `1` and `2` of [`BOOTED`].
    fn resolved_only() -> (ImagePolicy, Catalog) {
        let (os, ext) = (pin(BOOTED, '1'), pin(BOOTED, '2'));
        let policy = ImagePolicy {
            allowed_repositories: None,
            resolved_only: true,
        };
        (
            policy,
            catalog(&[("rhel-9", &pin(BOOTED, '8'), ""), ("rhel-10", &os, &ext)]),
        )
    }

    #[test]
    fn resolved_only_takes_only_the_streams_images() {
        let (policy, cat) = resolved_only();
        let (os, ext, other) = (pin(BOOTED, '1'), pin(BOOTED, '2'), pin(BOOTED, '3'));
        let booted = pin(BOOTED, 'b');
        let only_rhel9 = catalog(&[("rhel-9", &os, "")]);
        let cases: Vec<Case> = vec![
            (
                "the stream's images",
                desired(&os, Some(&ext)),
                Some(&booted),
                Some(&cat),
                "Allowed",
                "resolved-only: the images are those",
            ),
            (
                "without the extensions image",
                desired(&os, None),
                Some(&booted),
                Some(&cat),
                "Allowed",
                "resolved-only",
            ),
            (
                "another OS image of the same repository",
                desired(&other, Some(&ext)),
                Some(&booted),
                Some(&cat),
                "Refused",
                "resolved-only: the OS image",
            ),
            (
                "another extensions image",
                desired(&os, Some(&other)),
                Some(&booted),
                Some(&cat),
                "Refused",
                "resolved-only: the extensions image",
            ),
            (
                "another stream's image",
                desired(&pin(BOOTED, '8'), None),
                Some(&booted),
                Some(&cat),
                "Refused",
                "gives stream \"rhel-10\"",
            ),
            (
                "not read yet",
                desired(&os, None),
                Some(&booted),
                None,
                "Wait",
                "first read",
            ),
            (
                "no OSImageStream",
                desired(&os, None),
                Some(&booted),
                Some(&Catalog::Missing),
                "Refused",
                "does not exist",
            ),
            (
                "no such stream",
                desired(&os, None),
                Some(&booted),
                Some(&only_rhel9),
                "Refused",
                "stream \"rhel-10\" is not in the cluster's OSImageStream \"cluster\" (available: \"rhel-9\")",
            ),
            (
                "no API",
                desired(&os, None),
                Some(&booted),
                Some(&Catalog::NotServed),
                "Refused",
                "serves no OSImageStream API",
            ),
        ];
        judged(&policy, cases);
        assert!(needs_catalog(&policy, &desired(&os, None), Some(&booted)));
    }

    #[test]
    fn a_resolved_only_refusal_shows_both_digests_after_the_repository_rule() {
        let (policy, cat) = resolved_only();
        let booted = pin(BOOTED, 'b');
        let other = desired(&pin(BOOTED, '3'), None);
        let (_, text) = kind(&judge(&policy, &other, Some(&booted), Some(&cat)));
        // Two images of one repository differ in the digest: both are shown whole.
        let digest = |c: char| format!("@sha256:{}", c.to_string().repeat(64));
        assert!(
            text.contains(&digest('3')) && text.contains(&digest('1')),
            "{text}"
        );
        // The repository rule is judged first and names itself.
        let listed = ImagePolicy {
            resolved_only: true,
            ..scopes(&["r.example"])
        };
        let (got, text) = kind(&judge(&listed, &other, Some(&booted), Some(&cat)));
        assert_eq!(
            (got, text.starts_with("allowed-repositories:")),
            ("Refused", true),
            "{text}"
        );
    }
}
