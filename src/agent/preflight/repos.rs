//! The enabled repositories of the merge deployment's `/etc/yum.repos.d` as libdnf reads them
//! for rpm-ostree, and how librepo would reach each: pure parsing and variable substitution;
//! the probe itself is [`super::probe`].
//!
//! Upstream (rpm-ostree v2025.5 with its libdnf submodule 998efa8f, librepo):
//! - the repository files are the merge deployment's (`rpmostree_context_configure_from_deployment`);
//! - `$releasever` is the `system-release(releasever)` the *target* base's rpmdb provides
//!   (source root = the new tree, libdnf `dnf_context_set_os_release`), `$basearch` the
//!   host's; then every file of `/etc/yum/vars` and `/etc/dnf/vars` (the host's, rpm-ostree's
//!   `rpmostree_dnfcontext_fix_vars_dir`) defines a variable named after it, valued its first
//!   line, overriding the two (libdnf `dnf_repo_setup`, `ConfigMain::addVarsFromDir`);
//! - librepo substitutes `$name` and `${name}` (letters, digits, `_` before a letter or digit)
//!   and leaves an unknown name as written (`lr_url_substitute`);
//! - a `mirrorlist` whose URL contains `metalink` is a metalink, and `metalink` wins over it
//!   (`dnf_repo_setup`);
//! - `skip_if_unavailable` does not help: rpm-ostree marks every enabled repository required
//!   (`rpmostree_context_setup`: `dnf_repo_set_required (repo, TRUE)`).

use std::collections::BTreeMap;

use super::layering::Place;

/// The directories whose files define dnf variables, later ones overriding earlier ones
/// (libdnf `VARS_DIRS`).
pub const VARS_DIRS: [&str; 2] = ["/etc/yum/vars", "/etc/dnf/vars"];

/// dnf's main configuration, whose `[main]` gives every repository its defaults.
pub const DNF_CONF: &str = "/etc/dnf/dnf.conf";

/// The environment file the machine-config operator gives rpm-ostreed when the cluster has a
/// proxy (templates/common/_base/units/rpm-ostreed-proxy.service.yaml, `EnvironmentFile=`).
pub const MCO_PROXY_ENV: &str = "/etc/mco/proxy.env";

/// The proxies rpm-ostreed's environment gives a repository without `proxy`: rpm-ostree passes
/// `http_proxy` to libdnf for every scheme (`dnf_context_set_http_proxy`); without it curl
/// reads `https_proxy`/`HTTPS_PROXY` for HTTPS only (never an upper-case `HTTP_PROXY`), and
/// `no_proxy`/`NO_PROXY`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonProxy {
    /// For `http://` URLs.
    pub http: Option<String>,
    /// For `https://` URLs.
    pub https: Option<String>,
    /// Hosts reached directly.
    pub no_proxy: Option<String>,
}

impl DaemonProxy {
    /// The proxies of an environment file (`KEY=VALUE` lines, values optionally quoted).
    pub fn from_env_file(text: &str) -> DaemonProxy {
        let vars: BTreeMap<&str, &str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim(), v.trim().trim_matches(['"', '\''])))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let get = |k: &str| vars.get(k).map(|v| (*v).to_string());
        let all = get("http_proxy");
        DaemonProxy {
            http: all.clone(),
            https: all
                .or_else(|| get("https_proxy"))
                .or_else(|| get("HTTPS_PROXY")),
            no_proxy: get("no_proxy").or_else(|| get("NO_PROXY")),
        }
    }
}

/// How a repository names where its metadata is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// `baseurl`: the metadata is `<url>/repodata/repomd.xml`.
    BaseUrl,
    /// `mirrorlist`: a list of base URLs, one a line.
    MirrorList,
    /// `metalink`: an XML document whose `<url>`s name `repomd.xml` on each mirror.
    Metalink,
}

/// One place a repository's metadata may come from, its variables substituted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// What the URL is.
    pub kind: SourceKind,
    /// The URL.
    pub url: String,
    /// The line that names it.
    pub at: Place,
}

/// How librepo would connect for a repository: its TLS and proxy settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `sslverify` (default true).
    pub verify: bool,
    /// `sslcacert`: the only CAs trusted, as curl's `CAINFO` (host path).
    pub ca: Option<String>,
    /// `proxy`, when one is set (`_none_` and empty mean none).
    pub proxy: Option<String>,
    /// Why streamd cannot connect as librepo would (client certificates, credentials), if so.
    pub unsupported: Option<String>,
}

impl Default for Connection {
    fn default() -> Self {
        Connection {
            verify: true,
            ca: None,
            proxy: None,
            unsupported: None,
        }
    }
}

/// An enabled repository as libdnf reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoDef {
    /// Its id (the section name).
    pub id: String,
    /// Its section header.
    pub at: Place,
    /// Where its metadata comes from, in the file's order.
    pub sources: Vec<Source>,
    /// How to connect.
    pub connection: Connection,
    /// Whether `skip_if_unavailable` is set (rpm-ostree ignores it).
    pub skip_if_unavailable: bool,
}

/// The dnf variables of a move: `$releasever` (the target's), `$basearch` and the files of
/// [`VARS_DIRS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(BTreeMap<String, String>);

impl Vars {
    /// `releasever` (when known) and `basearch`, then `files` (name, contents) in
    /// [`VARS_DIRS`] order, each valued its first line.
    pub fn new<'a>(
        releasever: Option<&str>,
        basearch: &str,
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vars {
        let mut m = BTreeMap::new();
        if let Some(r) = releasever {
            m.insert("releasever".to_string(), r.to_string());
        }
        m.insert("basearch".to_string(), basearch.to_string());
        for (name, text) in files {
            let first = text.split('\n').next().unwrap_or_default();
            m.insert(name.to_string(), first.to_string());
        }
        Vars(m)
    }

    /// `url` with every known `$name`/`${name}` replaced, as librepo's `lr_url_substitute`.
    pub fn substitute(&self, url: &str) -> String {
        let b = url.as_bytes();
        let mut out = String::with_capacity(url.len());
        let mut i = 0;
        let mut copied = 0;
        while i < b.len() {
            if b[i] != b'$' {
                i += 1;
                continue;
            }
            let start = i;
            i += 1;
            let bracket = b.get(i) == Some(&b'{');
            if bracket {
                i += 1;
            }
            let name_start = i;
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || (b[i] == b'_' && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric)))
            {
                i += 1;
            }
            let name = &url[name_start..i];
            let closed = !bracket || b.get(i) == Some(&b'}');
            if let (false, true, Some(v)) = (name.is_empty(), closed, self.0.get(name)) {
                if bracket {
                    i += 1;
                }
                out.push_str(&url[copied..start]);
                out.push_str(v);
                copied = i;
            }
        }
        out.push_str(&url[copied..]);
        out
    }
}

/// `[main]` of `/etc/dnf/dnf.conf`: the connection every repository starts from.
pub fn main_connection(text: &str) -> Connection {
    let mut c = Connection::default();
    for (section, _, key, value) in entries(text) {
        if section == "main" {
            apply(&mut c, &key, &value);
        }
    }
    c
}

/// The enabled repositories of a `.repo` file (`file` its host path) with `vars`
/// substituted, each starting from `main`'s connection; dnf enables a section without
/// `enabled`, and a `[main]` section in a repository file is not a repository.
pub fn enabled_repos(file: &str, text: &str, vars: &Vars, main: &Connection) -> Vec<RepoDef> {
    let mut repos: Vec<(RepoDef, bool, Option<Source>)> = Vec::new();
    let place = |line: usize| Place {
        file: file.to_string(),
        line,
    };
    for (section, line, key, value) in entries(text) {
        if key.is_empty() {
            repos.push((
                RepoDef {
                    id: section,
                    at: place(line),
                    sources: Vec::new(),
                    connection: main.clone(),
                    skip_if_unavailable: false,
                },
                true,
                None,
            ));
            continue;
        }
        let Some((r, enabled, mirrorlist)) = repos.last_mut() else {
            continue;
        };
        let source = |kind, url: &str| Source {
            kind,
            url: vars.substitute(url),
            at: place(line),
        };
        match key.as_str() {
            "enabled" => *enabled = truth(&value),
            "skip_if_unavailable" => r.skip_if_unavailable = truth(&value),
            "baseurl" => r.sources.extend(
                value
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|u| !u.is_empty())
                    .map(|u| source(SourceKind::BaseUrl, u)),
            ),
            "mirrorlist" if !value.is_empty() => {
                let kind = if value.contains("metalink") {
                    SourceKind::Metalink
                } else {
                    SourceKind::MirrorList
                };
                *mirrorlist = Some(source(kind, &value));
            }
            "metalink" if !value.is_empty() => {
                r.sources.push(source(SourceKind::Metalink, &value));
            }
            _ => apply(&mut r.connection, &key, &value),
        }
    }
    repos
        .into_iter()
        .filter(|(r, enabled, _)| *enabled && r.id != "main")
        .map(|(mut r, _, mirrorlist)| {
            // `metalink` wins over a metalink given as `mirrorlist`.
            let has_metalink = r.sources.iter().any(|s| s.kind == SourceKind::Metalink);
            if let Some(m) =
                mirrorlist.filter(|m| m.kind == SourceKind::MirrorList || !has_metalink)
            {
                r.sources.push(m);
            }
            r
        })
        .collect()
}

/// A connection key of a repository or of `[main]`.
fn apply(c: &mut Connection, key: &str, value: &str) {
    match key {
        "sslverify" => c.verify = truth(value),
        "sslcacert" => c.ca = Some(value.to_string()).filter(|v| !v.is_empty()),
        "proxy" => {
            c.proxy = Some(value.to_string()).filter(|v| !v.is_empty() && v != "_none_");
        }
        "sslclientcert" | "sslclientkey" | "username" | "password" | "proxy_username"
        | "proxy_password"
            if !value.is_empty() =>
        {
            c.unsupported = Some(format!("it sets {key}, which streamd does not use"));
        }
        _ => {}
    }
}

/// libdnf's `OptionBool` (`1`/`yes`/`true`/`on`); anything else is false.
fn truth(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "1" | "yes" | "true" | "on"
    )
}

/// The entries of an INI file as libdnf's `IniParser` reads it: (section, line, key, value),
/// a section header as an entry with an empty key; a line that starts with white space
/// continues the previous value; `#` and `;` start comments.
fn entries(text: &str) -> Vec<(String, usize, String, String)> {
    let mut out: Vec<(String, usize, String, String)> = Vec::new();
    let mut section = String::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if raw.starts_with([' ', '\t'])
            && let Some(last) = out.last_mut().filter(|e| !e.2.is_empty())
        {
            last.3.push(' ');
            last.3.push_str(line);
            continue;
        }
        if let Some(id) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = id.trim().to_string();
            out.push((section.clone(), n + 1, String::new(), String::new()));
            continue;
        }
        if let Some((k, v)) = line.split_once('=')
            && !section.is_empty()
        {
            out.push((
                section.clone(),
                n + 1,
                k.trim().to_string(),
                v.trim().to_string(),
            ));
        }
    }
    out
}

/// `url` fit for a message: no user information, no query (either may hold a credential).
pub fn shown(url: &str) -> String {
    let no_query = url.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = no_query.split_once("://") else {
        return no_query.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{host}{path}")
}

/// The `repomd.xml` URL below a base URL (librepo joins with one `/`).
pub fn repomd_url(base: &str) -> String {
    format!("{}/repodata/repomd.xml", base.trim_end_matches('/'))
}

/// The base URLs of a mirror list: one a line, `#` comments and blank lines skipped
/// (librepo `lr_mirrorlist_parse_file`).
pub fn mirrors(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The `repomd.xml` URLs of a metalink: the text of each `<url …>` element (librepo
/// `lr_metalink_parse_file`); one that does not end in `repodata/repomd.xml` is taken as a
/// base URL.
pub fn metalink_urls(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("<url") {
        rest = &rest[at + 4..];
        let Some(open_end) = rest.find('>') else {
            break;
        };
        // `<urls>` is not a `<url>`.
        let attrs = &rest[..open_end];
        rest = &rest[open_end + 1..];
        if !(attrs.is_empty() || attrs.starts_with(char::is_whitespace)) {
            continue;
        }
        let Some(close) = rest.find("</url>") else {
            break;
        };
        let url = rest[..close].trim().to_string();
        rest = &rest[close..];
        if url.ends_with("/repodata/repomd.xml") {
            out.push(url);
        } else if !url.is_empty() {
            out.push(repomd_url(&url));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: &str = "/etc/yum.repos.d/x.repo";

    fn vars() -> Vars {
        Vars::new(
            Some("10"),
            "x86_64",
            [("stream", "10-stream\nignored"), ("releasever", "10.1")],
        )
    }

    #[test]
    fn variables_are_substituted_as_librepo_does() {
        let v = Vars::new(Some("10"), "x86_64", [("stream", "10-stream\nx")]);
        for (url, want) in [
            (
                "https://m/$releasever/$basearch/os",
                "https://m/10/x86_64/os",
            ),
            ("https://m/${releasever}x/", "https://m/10x/"),
            ("https://m/$stream/", "https://m/10-stream/"),
            // Unknown names, an unclosed brace and a lone `$` stay as written.
            ("https://m/$nope/$", "https://m/$nope/$"),
            ("https://m/${basearch", "https://m/${basearch"),
            // `_` is part of a name only before a letter or digit.
            ("https://m/$basearch_/", "https://m/x86_64_/"),
            ("https://m/$$basearch", "https://m/$x86_64"),
        ] {
            assert_eq!(v.substitute(url), want, "{url}");
        }
        // A vars file overrides releasever.
        assert_eq!(vars().substitute("$releasever"), "10.1");
        assert_eq!(
            Vars::new(None, "aarch64", []).substitute("$releasever/$basearch"),
            "$releasever/aarch64"
        );
    }

    #[test]
    fn repository_files_are_read_as_libdnf_reads_them() {
        let text = "\
[main]
gpgcheck=1

[a]
name=A
baseurl=file:///srv/a
[b]
enabled=0
baseurl=https://b
[c]
mirrorlist=https://m/?repo=$stream&arch=$basearch
skip_if_unavailable=True
[d]
enabled = yes
baseurl=https://user:pw@d/$releasever/
        https://d2/$basearch/
sslverify=0
sslcacert=/etc/pki/d.pem
proxy=http://proxy:3128
[e]
mirrorlist=https://m/metalink?repo=e
metalink=https://ml/e
[f]
mirrorlist=https://m/metalink?repo=f
sslclientcert=/etc/pki/f.pem
proxy=_none_
";
        let got = enabled_repos(F, text, &vars(), &Connection::default());
        let ids: Vec<(&str, usize)> = got.iter().map(|r| (r.id.as_str(), r.at.line)).collect();
        assert_eq!(ids, [("a", 4), ("c", 10), ("d", 13), ("e", 20), ("f", 23)]);
        let urls = |i: usize| -> Vec<(SourceKind, &str, usize)> {
            got[i]
                .sources
                .iter()
                .map(|s| (s.kind, s.url.as_str(), s.at.line))
                .collect()
        };
        assert_eq!(urls(0), [(SourceKind::BaseUrl, "file:///srv/a", 6)]);
        assert_eq!(
            urls(1),
            [(
                SourceKind::MirrorList,
                "https://m/?repo=10-stream&arch=x86_64",
                11
            )]
        );
        assert!(got[1].skip_if_unavailable);
        assert_eq!(
            urls(2),
            [
                (SourceKind::BaseUrl, "https://user:pw@d/10.1/", 15),
                (SourceKind::BaseUrl, "https://d2/x86_64/", 15)
            ]
        );
        assert_eq!(
            got[2].connection,
            Connection {
                verify: false,
                ca: Some("/etc/pki/d.pem".into()),
                proxy: Some("http://proxy:3128".into()),
                unsupported: None,
            }
        );
        // `metalink` wins over a metalink given as `mirrorlist`.
        assert_eq!(urls(3), [(SourceKind::Metalink, "https://ml/e", 22)]);
        assert_eq!(
            urls(4),
            [(SourceKind::Metalink, "https://m/metalink?repo=f", 24)]
        );
        assert_eq!(got[4].connection.proxy, None);
        assert!(got[4].connection.unsupported.is_some());
        // [main] of dnf.conf is every repository's default.
        let main = main_connection("[main]\nsslverify=false\nproxy=http://p\n[x]\nsslverify=1\n");
        assert!(!main.verify);
        let r = enabled_repos(F, "[g]\nbaseurl=https://g\n", &vars(), &main);
        assert_eq!(r[0].connection.proxy.as_deref(), Some("http://p"));
    }

    #[test]
    fn the_daemons_proxy_is_read_as_rpm_ostree_and_curl_read_it() {
        // What the machine-config operator writes: upper case only.
        let mco = "# comment\nHTTP_PROXY=http://p:3128\nHTTPS_PROXY=\"http://u:pw@p:3129\"\nNO_PROXY=.cluster.local,10.0.0.0/8\n";
        assert_eq!(
            DaemonProxy::from_env_file(mco),
            DaemonProxy {
                http: None,
                https: Some("http://u:pw@p:3129".into()),
                no_proxy: Some(".cluster.local,10.0.0.0/8".into()),
            }
        );
        // rpm-ostree hands `http_proxy` to libdnf for every scheme.
        let lower = "http_proxy=http://q:1\nhttps_proxy=http://r:2\n";
        let p = DaemonProxy::from_env_file(lower);
        assert_eq!(
            (p.http.as_deref(), p.https.as_deref()),
            (Some("http://q:1"), Some("http://q:1"))
        );
        assert_eq!(DaemonProxy::from_env_file(""), DaemonProxy::default());
    }

    #[test]
    fn urls_are_shown_without_credentials() {
        for (url, want) in [
            (
                "https://user:secret@h:8443/p/x?token=abc",
                "https://h:8443/p/x",
            ),
            ("https://h/p#frag", "https://h/p"),
            ("https://a@b@h", "https://h"),
            ("file:///srv/a", "file:///srv/a"),
            ("no-scheme?x", "no-scheme"),
        ] {
            assert_eq!(shown(url), want, "{url}");
        }
    }

    #[test]
    fn mirror_lists_and_metalinks_are_read() {
        assert_eq!(
            mirrors("# c\n\nhttps://a/x/\n  https://b/y  \n"),
            ["https://a/x/", "https://b/y"]
        );
        let ml = r#"<?xml version="1.0"?><metalink><files><file name="repomd.xml"><resources maxconnections="1">
<url protocol="https" type="https" preference="100">https://a/10/repodata/repomd.xml</url>
<url protocol="http">http://b/x/</url>
</resources></file></files></metalink>"#;
        assert_eq!(
            metalink_urls(ml),
            [
                "https://a/10/repodata/repomd.xml",
                "http://b/x/repodata/repomd.xml"
            ]
        );
        assert_eq!(
            repomd_url("https://a/b/"),
            "https://a/b/repodata/repomd.xml"
        );
    }
}
