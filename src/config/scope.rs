//! Repository scopes of `allowed-repositories` (`host[:port]`, `host[:port]/path…`, `*`), and
//! the distribution reference grammar of registry hosts and repository path components they
//! share with image references (`image::reference`). The grammar is here, below both,
//! so a scope is checked when the configuration is read and the error names `file:line:column`.

use std::fmt;
use std::str::FromStr;

use crate::text::quote;

/// Longest scope accepted: the longest image reference (the OSImageStream API limit).
pub const MAX_LEN: usize = 447;

/// Whether `host` is a registry host: DNS labels or an IPv4 address, with an optional port
/// (`1..=65535`, digits only).
pub fn valid_registry(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    if let Some(p) = port
        && !(p.parse::<u16>().is_ok_and(|p| p > 0) && p.bytes().all(|c| c.is_ascii_digit()))
    {
        return false;
    }
    !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Docker distribution grammar of a repository path component:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
pub fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(&b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(&b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Which repositories a scope allows, as a containers `registries.conf` prefix does: the
/// registry (`host[:port]`, matched exactly) and, when given, a repository path that is a
/// prefix of whole path components (`quay.io/openshift` allows `quay.io/openshift` and
/// `quay.io/openshift/rhcos`, not `quay.io/openshiftx/rhcos`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepositoryScope {
    /// `*`: every repository.
    Any,
    /// A registry, or a repository path below it.
    Prefix {
        /// `host[:port]`.
        registry: String,
        /// Path components joined by `/`; empty for the whole registry.
        path: String,
    },
}

/// What is wrong with a scope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// An empty string.
    #[error("empty repository scope (give host[:port], host[:port]/path or \"*\")")]
    Empty,
    /// Longer than [`MAX_LEN`].
    #[error("repository scope is {0} characters, the limit is {MAX_LEN}")]
    TooLong(usize),
    /// Whitespace or control characters.
    #[error("repository scope {0} contains whitespace or control characters")]
    Whitespace(String),
    /// A `*` that is not the whole scope.
    #[error(
        "repository scope {0}: only \"*\" on its own is a wildcard (it allows every repository)"
    )]
    Wildcard(String),
    /// A tag or a digest: a scope names repositories, not an image.
    #[error("repository scope {0} names an image (a tag or a digest); give the repository only")]
    Image(String),
    /// The first component is no registry host.
    #[error(
        "repository scope {0} does not start with a registry host (a name with a '.', a host:port, or localhost)"
    )]
    Registry(String),
    /// A path component is invalid (also an empty one: `//`, a trailing `/`).
    #[error(
        "repository scope {scope}: path component {component} is invalid (lower-case letters, digits, '.', '_', '-')"
    )]
    Component {
        /// The scope, quoted.
        scope: String,
        /// The component, quoted.
        component: String,
    },
}

impl ScopeError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ScopeError::Empty => "scope-empty",
            ScopeError::TooLong(_) => "scope-too-long",
            ScopeError::Whitespace(_) => "scope-whitespace",
            ScopeError::Wildcard(_) => "scope-wildcard",
            ScopeError::Image(_) => "scope-names-an-image",
            ScopeError::Registry(_) => "scope-no-registry",
            ScopeError::Component { .. } => "scope-bad-component",
        }
    }
}

impl RepositoryScope {
    /// The scope of exactly the repository of `pullspec` (`host[:port]/path[:tag][@digest]`),
    /// e.g. of the booted image; `None` when it names no registry and repository.
    pub fn of_pullspec(pullspec: &str) -> Option<RepositoryScope> {
        let name = pullspec.split_once('@').map_or(pullspec, |(n, _)| n);
        // A tag follows the last `/`; a `:` before it is the registry's port.
        let name = match name.rsplit_once(':') {
            Some((n, tag)) if !tag.contains('/') && n.contains('/') => n,
            _ => name,
        };
        match name.parse() {
            Ok(s @ RepositoryScope::Prefix { .. }) if name.contains('/') => Some(s),
            _ => None,
        }
    }

    /// Whether this scope allows the repository `repository` of registry `registry`.
    pub fn allows(&self, registry: &str, repository: &str) -> bool {
        match self {
            RepositoryScope::Any => true,
            RepositoryScope::Prefix { registry: r, path } => {
                r == registry
                    && (path.is_empty()
                        || repository
                            .strip_prefix(path.as_str())
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
            }
        }
    }
}

impl FromStr for RepositoryScope {
    type Err = ScopeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ScopeError::Empty);
        }
        if s.len() > MAX_LEN {
            return Err(ScopeError::TooLong(s.len()));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ScopeError::Whitespace(quote(s)));
        }
        if s == "*" {
            return Ok(RepositoryScope::Any);
        }
        if s.contains('*') {
            return Err(ScopeError::Wildcard(quote(s)));
        }
        if s.contains('@') {
            return Err(ScopeError::Image(quote(s)));
        }
        let (registry, path) = s.split_once('/').unwrap_or((s, ""));
        // Docker's rule for telling a registry host from a first path component.
        let looks_like_host =
            registry.contains('.') || registry.contains(':') || registry == "localhost";
        if !looks_like_host || !valid_registry(registry) {
            return Err(ScopeError::Registry(quote(s)));
        }
        if s.contains('/') {
            for c in path.split('/') {
                if c.contains(':') {
                    return Err(ScopeError::Image(quote(s)));
                }
                if !valid_path_component(c) {
                    return Err(ScopeError::Component {
                        scope: quote(s),
                        component: quote(c),
                    });
                }
            }
        }
        Ok(RepositoryScope::Prefix {
            registry: registry.to_string(),
            path: path.to_string(),
        })
    }
}

/// Parsed in the visitor, so the deserializer puts the position of the value itself (not of
/// the list around it) on the error.
impl<'de> serde::Deserialize<'de> for RepositoryScope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RepositoryScope;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a repository scope: host[:port], host[:port]/path or \"*\"")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RepositoryScope, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl fmt::Display for RepositoryScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RepositoryScope::Any => f.write_str("*"),
            RepositoryScope::Prefix { registry, path } if path.is_empty() => f.write_str(registry),
            RepositoryScope::Prefix { registry, path } => write!(f, "{registry}/{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(s: &str) -> RepositoryScope {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn scopes_match_whole_components_and_exact_hosts() {
        // (scope, registry, repository, allowed)
        let cases = [
            ("quay.io/openshift", "quay.io", "openshift/rhcos", true),
            ("quay.io/openshift", "quay.io", "openshift", true),
            ("quay.io/openshift", "quay.io", "openshiftx/rhcos", false),
            ("quay.io/openshift", "quay.io", "openshif", false),
            ("quay.io/openshift/rhcos", "quay.io", "openshift", false),
            ("quay.io/openshift", "quay.io:443", "openshift/rhcos", false),
            ("quay.io/openshift", "quay.iox", "openshift/rhcos", false),
            (
                "quay.io/openshift",
                "registry.quay.io",
                "openshift/rhcos",
                false,
            ),
            ("quay.io", "quay.io", "anything/at/all", true),
            ("quay.io", "quay.io:443", "anything", false),
            ("r.example:5000/a", "r.example:5000", "a/b/c", true),
            ("r.example:5000/a", "r.example:5001", "a/b/c", false),
            ("r.example:5000/a", "r.example", "a/b/c", false),
            ("localhost/os", "localhost", "os", true),
            ("127.0.0.1:5000", "127.0.0.1:5000", "openshift/rhcos", true),
            ("*", "evil.example", "x", true),
        ];
        for (s, registry, repository, want) in cases {
            assert_eq!(
                scope(s).allows(registry, repository),
                want,
                "{s} allows {registry}/{repository}"
            );
        }
    }

    #[test]
    fn scopes_round_trip_and_bad_ones_are_named() {
        for s in [
            "*",
            "quay.io",
            "quay.io/a/b-c.d__e",
            "127.0.0.1:5000/x",
            "localhost",
        ] {
            assert_eq!(scope(s).to_string(), s);
        }
        // (scope, the error's variant)
        let cases = [
            ("", "Empty"),
            (" quay.io", "Whitespace"),
            ("quay.io/a\nb", "Whitespace"),
            ("*.example.com", "Wildcard"),
            ("quay.io/*", "Wildcard"),
            ("quay.io/a@sha256:00", "Image"),
            ("quay.io/a:latest", "Image"),
            ("openshift/rhcos", "Registry"),
            ("quay.io:0/a", "Registry"),
            ("docker://quay.io/a", "Registry"),
            ("quay.io/", "Component"),
            ("quay.io//a", "Component"),
            ("quay.io/Openshift", "Component"),
            ("quay.io/a--", "Component"),
        ];
        for (s, variant) in cases {
            let e = s.parse::<RepositoryScope>().expect_err(s);
            assert!(format!("{e:?}").starts_with(variant), "{s:?}: {e:?}");
            assert!(!e.to_string().chars().any(char::is_control), "{e}");
        }
        let long = format!("quay.io/{}", "a".repeat(MAX_LEN));
        assert!(matches!(
            long.parse::<RepositoryScope>(),
            Err(ScopeError::TooLong(_))
        ));
    }

    #[test]
    fn the_repository_of_a_pullspec_is_its_scope() {
        let d = format!("sha256:{}", "a".repeat(64));
        let cases = [
            (format!("quay.io/o/rhcos@{d}"), Some("quay.io/o/rhcos")),
            (
                format!("127.0.0.1:5000/openshift/rhcos@{d}"),
                Some("127.0.0.1:5000/openshift/rhcos"),
            ),
            ("quay.io/o/rhcos:4.19".to_string(), Some("quay.io/o/rhcos")),
            (
                "r.example:5000/rhcos:4.19".to_string(),
                Some("r.example:5000/rhcos"),
            ),
            (
                "r.example:5000/rhcos".to_string(),
                Some("r.example:5000/rhcos"),
            ),
            ("quay.io".to_string(), None),
            ("rhcos:4.19".to_string(), None),
            ("".to_string(), None),
        ];
        for (pullspec, want) in cases {
            assert_eq!(
                RepositoryScope::of_pullspec(&pullspec).map(|s| s.to_string()),
                want.map(String::from),
                "{pullspec}"
            );
        }
    }
}
