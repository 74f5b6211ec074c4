//! The probe of an enabled repository, the I/O half of the layering check: what librepo would
//! fetch first for rpm-ostree (`<baseurl>/repodata/repomd.xml`, or the mirror list or
//! metalink and then a mirror's `repomd.xml`), with a short deadline per request and bounded
//! reads. Called by the gatherer (`crate::agent::gather`); the check judges its [`Reach`].

use std::time::Duration;

use futures::StreamExt;

use super::layering::Reach;
use super::repos::{
    DaemonProxy, RepoDef, Source, SourceKind, metalink_urls, mirrors, repomd_url, shown,
};
use crate::host::facts::HostRoot;

/// The deadline of one request (connect, answer and the bounded read).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Mirrors tried from one mirror list or metalink (librepo tries them in turn; a few tell).
const MIRRORS_TRIED: usize = 3;

/// Longest mirror list or metalink read.
const MAX_LIST_BYTES: usize = 256 << 10;

/// Bytes of `repomd.xml` read to see it is one.
const REPOMD_HEAD_BYTES: usize = 64 << 10;

/// The client of one repository and its deadline.
struct Client {
    http: reqwest::Client,
    deadline: Duration,
}

/// Why one source failed: a real failure, or one streamd cannot judge.
enum Failed {
    Unreachable(String),
    NotProbed(String),
}

/// Whether `repo`'s metadata can be read from any of its sources, each request bounded by
/// `deadline`, through its proxy or else the daemon's (`daemon`); local (`file://`) sources
/// are looked up below `host`.
pub async fn probe(
    repo: &RepoDef,
    daemon: &DaemonProxy,
    host: &HostRoot,
    deadline: Duration,
) -> Reach {
    if repo.sources.is_empty() {
        return Reach::Unreachable {
            at: repo.at.clone(),
            why: "no baseurl, mirrorlist or metalink".into(),
        };
    }
    let mut failures: Vec<(&Source, Failed)> = Vec::new();
    let mut client = None;
    for source in &repo.sources {
        if let Some(path) = local_path(source) {
            if host.path(path).join("repodata/repomd.xml").is_file() {
                return Reach::Present;
            }
            failures.push((
                source,
                Failed::Unreachable(format!("{} has no repodata/repomd.xml", source.url)),
            ));
            continue;
        }
        if !(source.url.starts_with("http://") || source.url.starts_with("https://")) {
            failures.push((
                source,
                Failed::NotProbed(format!("{}: not HTTP", shown(&source.url))),
            ));
            continue;
        }
        if let Some(why) = &repo.connection.unsupported {
            return Reach::NotProbed(why.clone());
        }
        let c = match &client {
            Some(c) => c,
            None => match build(repo, daemon, host, deadline) {
                Ok(c) => client.insert(c),
                Err(why) => return Reach::NotProbed(why),
            },
        };
        match probe_source(c, source).await {
            Ok(()) => return Reach::Present,
            Err(f) => failures.push((source, f)),
        }
    }
    judge(repo, failures)
}

/// The verdict once no source answered: unreachable when every source failed for certain,
/// else not probed.
fn judge(repo: &RepoDef, failures: Vec<(&Source, Failed)>) -> Reach {
    if let Some(why) = failures.iter().find_map(|(_, f)| match f {
        Failed::NotProbed(w) => Some(w.clone()),
        Failed::Unreachable(_) => None,
    }) {
        return Reach::NotProbed(why);
    }
    let more = failures.len().saturating_sub(1);
    let Some((source, Failed::Unreachable(why))) = failures.into_iter().next() else {
        return Reach::NotProbed("nothing was probed".into());
    };
    let why = match more {
        0 => why,
        n => format!("{why} (and its {n} other sources failed too)"),
    };
    let why = if repo.skip_if_unavailable {
        format!(
            "{why}; skip_if_unavailable does not help, rpm-ostree requires every enabled repository"
        )
    } else {
        why
    };
    Reach::Unreachable {
        at: source.at.clone(),
        why,
    }
}

/// The directory of a `file://` source.
fn local_path(source: &Source) -> Option<&str> {
    source.url.strip_prefix("file://")
}

/// One network source: its `repomd.xml`, or its list and then up to [`MIRRORS_TRIED`] mirrors.
async fn probe_source(c: &Client, source: &Source) -> Result<(), Failed> {
    let candidates = match source.kind {
        SourceKind::BaseUrl => return repomd(c, &repomd_url(&source.url)).await,
        SourceKind::MirrorList => {
            let text = fetch(c, &source.url, MAX_LIST_BYTES).await?;
            mirrors(&text).iter().map(|m| repomd_url(m)).collect()
        }
        SourceKind::Metalink => metalink_urls(&fetch(c, &source.url, MAX_LIST_BYTES).await?),
    };
    let mut first = None;
    for url in candidates.iter().take(MIRRORS_TRIED) {
        match repomd(c, url).await {
            Ok(()) => return Ok(()),
            Err(f) => {
                first.get_or_insert(f);
            }
        }
    }
    Err(first
        .unwrap_or_else(|| Failed::Unreachable(format!("{} lists no mirror", shown(&source.url)))))
}

/// Whether `url` serves a `repomd.xml` (librepo parses it, so an HTML page does not pass).
async fn repomd(c: &Client, url: &str) -> Result<(), Failed> {
    let head = fetch(c, url, REPOMD_HEAD_BYTES).await?;
    if head.contains("<repomd") {
        Ok(())
    } else {
        Err(Failed::Unreachable(format!(
            "{} is not a repomd.xml",
            shown(url)
        )))
    }
}

/// The first `max` bytes of `url` (lossily as text), or why not.
async fn fetch(c: &Client, url: &str, max: usize) -> Result<String, Failed> {
    let at = shown(url);
    let resp = c
        .http
        .get(url)
        .send()
        .await
        .map_err(|e| Failed::Unreachable(format!("{at}: {}", cause(&e, c.deadline))))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(Failed::Unreachable(format!("{at}: HTTP {status}")));
    }
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while body.len() < max {
        match stream.next().await {
            Some(Ok(chunk)) => body.extend_from_slice(&chunk),
            Some(Err(e)) => {
                return Err(Failed::Unreachable(format!(
                    "{at}: {}",
                    cause(&e, c.deadline)
                )));
            }
            None => break,
        }
    }
    body.truncate(max);
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// A request's failure without its URL (which may hold credentials): its deepest cause.
fn cause(e: &reqwest::Error, deadline: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {} s", deadline.as_secs());
    }
    let mut deepest = std::error::Error::source(e);
    while let Some(next) = deepest.and_then(std::error::Error::source) {
        deepest = Some(next);
    }
    let text = deepest.map_or_else(|| "the request failed".to_string(), ToString::to_string);
    let kind = if e.is_connect() {
        "cannot connect: "
    } else {
        ""
    };
    crate::text::one_line(&format!("{kind}{text}"), 200)
}

/// The client librepo's settings for `repo` amount to: its proxy, else the daemon's (never
/// streamd's own environment), its TLS verification and CA file.
fn build(
    repo: &RepoDef,
    daemon: &DaemonProxy,
    host: &HostRoot,
    deadline: Duration,
) -> Result<Client, String> {
    // reqwest is built without a default TLS provider (see the registry client).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let conn = &repo.connection;
    let mut b = reqwest::Client::builder()
        .connect_timeout(deadline)
        .timeout(deadline)
        .user_agent(concat!("streamd/", env!("CARGO_PKG_VERSION")))
        .no_proxy()
        .tls_danger_accept_invalid_certs(!conn.verify);
    if let Some(proxy) = &conn.proxy {
        let p = reqwest::Proxy::all(proxy.as_str())
            .map_err(|_| format!("its proxy {} is not a URL", shown(proxy)))?;
        b = b.proxy(p);
    } else {
        let no_proxy = || {
            daemon
                .no_proxy
                .as_deref()
                .and_then(reqwest::NoProxy::from_string)
        };
        let bad = |p: &str| format!("the daemon's proxy {} is not a URL", shown(p));
        if let Some(p) = &daemon.http {
            b = b.proxy(
                reqwest::Proxy::http(p.as_str())
                    .map_err(|_| bad(p))?
                    .no_proxy(no_proxy()),
            );
        }
        if let Some(p) = &daemon.https {
            b = b.proxy(
                reqwest::Proxy::https(p.as_str())
                    .map_err(|_| bad(p))?
                    .no_proxy(no_proxy()),
            );
        }
    }
    if let Some(ca) = &conn.ca {
        let pem = std::fs::read(host.path(ca))
            .map_err(|e| format!("its sslcacert {ca} cannot be read: {e}"))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|_| format!("its sslcacert {ca} holds no PEM certificate"))?;
        b = b.tls_certs_only(certs);
    }
    b.build()
        .map(|http| Client { http, deadline })
        .map_err(|e| format!("the HTTP client cannot be built: {}", cause(&e, deadline)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use testbed::loopback::Answer;

    use super::super::layering::Place;
    use super::super::repos::{Connection, Vars, enabled_repos};
    use super::*;

    const REPOMD: &str =
        "<?xml version=\"1.0\"?><repomd xmlns=\"http://linux.duke.edu/metadata/repo\"></repomd>";

    /// [`testbed::loopback::serve`] answering `routes`, 404 elsewhere; its address.
    async fn serve(routes: BTreeMap<&'static str, Answer>) -> String {
        let routes = routes
            .into_iter()
            .map(|(p, a)| (p.to_string(), a))
            .collect();
        testbed::loopback::serve(routes, Answer::Status(404))
            .await
            .expect("loopback server")
    }

    /// The one repository of `text` (`/etc/yum.repos.d/t.repo`), probed within `deadline`.
    async fn reach_of(text: &str, deadline: Duration) -> Reach {
        reach_through(text, &DaemonProxy::default(), deadline).await
    }

    /// [`reach_of`] with the daemon's proxies `daemon`.
    async fn reach_through(text: &str, daemon: &DaemonProxy, deadline: Duration) -> Reach {
        let vars = Vars::new(Some("10"), "x86_64", [("stream", "10-stream")]);
        let repos = enabled_repos(
            "/etc/yum.repos.d/t.repo",
            text,
            &vars,
            &Connection::default(),
        );
        assert_eq!(repos.len(), 1, "{text}");
        let host = HostRoot::new("/nonexistent-host-root");
        probe(&repos[0], daemon, &host, deadline).await
    }

    /// The address of a port nothing listens on.
    async fn refused_address() -> String {
        testbed::loopback::closed_port()
            .await
            .expect("a closed port")
    }

    fn at(line: usize) -> Place {
        Place {
            file: "/etc/yum.repos.d/t.repo".into(),
            line,
        }
    }

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_repository_that_answers_passes() {
        let url = serve(BTreeMap::from([(
            "/el/10/x86_64/repodata/repomd.xml",
            Answer::Ok(REPOMD.into()),
        )]))
        .await;
        let text = format!("[ok]\nbaseurl={url}/el/$releasever/$basearch/\n");
        assert_eq!(reach_of(&text, LONG).await, Reach::Present);
        // A first source that fails is skipped for the next, as librepo tries its mirrors.
        let text = format!("[ok]\nbaseurl={url}/gone/ {url}/el/10/x86_64\n");
        assert_eq!(reach_of(&text, LONG).await, Reach::Present);
        // A mirror list whose mirrors answer; a metalink naming repomd.xml.
        let list = serve(BTreeMap::from([
            ("/list", Answer::Ok(format!("{url}/el/10/x86_64\n"))),
            (
                "/metalink",
                Answer::Ok(format!(
                    "<metalink><url protocol=\"http\">{url}/el/10/x86_64/repodata/repomd.xml</url></metalink>"
                )),
            ),
        ]))
        .await;
        assert_eq!(
            reach_of(&format!("[m]\nmirrorlist={list}/list\n"), LONG).await,
            Reach::Present
        );
        assert_eq!(
            reach_of(&format!("[m]\nmetalink={list}/metalink\n"), LONG).await,
            Reach::Present
        );
    }

    #[tokio::test]
    async fn a_missing_repomd_refuses_with_the_line_and_no_credentials() {
        let url = serve(BTreeMap::from([(
            "/html/repodata/repomd.xml",
            Answer::Ok("<html>login</html>".into()),
        )]))
        .await;
        let with_user = url.replace("http://", "http://admin:s3cret@");
        let text = format!("[gone]\nname=x\nbaseurl={with_user}/el/10/?token=t0k\n");
        let Reach::Unreachable { at: place, why } = reach_of(&text, LONG).await else {
            panic!("a 404 repomd.xml is unreachable");
        };
        assert_eq!(place, at(3));
        assert!(why.contains("HTTP 404"), "{why}");
        assert!(why.contains(&format!("{url}/el/10/")), "{why}");
        assert!(
            !why.contains("s3cret") && !why.contains("admin") && !why.contains("t0k"),
            "{why}"
        );
        // A page that is not a repomd.xml, as librepo parses it.
        let text = format!("[html]\nbaseurl={url}/html\n");
        let Reach::Unreachable { why, .. } = reach_of(&text, LONG).await else {
            panic!("an HTML page is not metadata");
        };
        assert!(why.contains("is not a repomd.xml"), "{why}");
        // A mirror list that is missing; skip_if_unavailable is named as no help.
        let text = format!("[ml]\nskip_if_unavailable=1\nmirrorlist={url}/list\n");
        let Reach::Unreachable { at: place, why } = reach_of(&text, LONG).await else {
            panic!("a missing mirror list is unreachable");
        };
        assert_eq!(place, at(3));
        assert!(
            why.contains("HTTP 404") && why.contains("skip_if_unavailable does not help"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_refuses() {
        let url = refused_address().await;
        let text = format!("[closed]\nbaseurl={url}/el/\n");
        let Reach::Unreachable { at: place, why } = reach_of(&text, LONG).await else {
            panic!("a closed port is unreachable");
        };
        assert_eq!(place, at(2));
        assert!(why.contains("cannot connect"), "{why}");
    }

    #[tokio::test]
    async fn a_stalled_server_refuses_within_the_deadline() {
        let url = serve(BTreeMap::from([("/el/repodata/repomd.xml", Answer::Stall)])).await;
        let text = format!("[stalled]\nbaseurl={url}/el\n");
        let Reach::Unreachable { at: place, why } = reach_of(&text, Duration::from_secs(2)).await
        else {
            panic!("a server that never answers is unreachable");
        };
        assert_eq!(place, at(2));
        assert!(why.contains("no answer within 2 s"), "{why}");
    }

    /// The cluster proxy the machine-config operator gives rpm-ostreed is the way out.
    #[tokio::test]
    async fn the_daemons_proxy_is_used_unless_no_proxy_names_the_host() {
        let proxy = serve(BTreeMap::from([(
            "http://repo.invalid/el/repodata/repomd.xml",
            Answer::Ok(REPOMD.into()),
        )]))
        .await;
        let text = "[p]\nbaseurl=http://repo.invalid/el\n";
        let daemon = DaemonProxy::from_env_file(&format!("http_proxy={proxy}\n"));
        assert_eq!(reach_through(text, &daemon, LONG).await, Reach::Present);
        // The repository's own `proxy` wins; `_none_` means none.
        let own = format!("{text}proxy={proxy}\n");
        assert_eq!(reach_of(&own, LONG).await, Reach::Present);
        let none = format!("{text}proxy=_none_\n");
        assert!(matches!(
            reach_through(&none, &DaemonProxy::default(), LONG).await,
            Reach::Unreachable { .. }
        ));
        let direct =
            DaemonProxy::from_env_file(&format!("http_proxy={proxy}\nNO_PROXY=.invalid\n"));
        assert!(matches!(
            reach_through(text, &direct, LONG).await,
            Reach::Unreachable { .. }
        ));
    }

    #[tokio::test]
    async fn what_streamd_cannot_probe_is_named() {
        let text = "[cert]\nbaseurl=https://cdn.example/el\nsslclientcert=/etc/pki/c.pem\n";
        assert!(
            matches!(reach_of(text, LONG).await, Reach::NotProbed(w) if w.contains("sslclientcert"))
        );
        let text = "[ftp]\nbaseurl=ftp://ftp.example/el\n";
        assert!(
            matches!(reach_of(text, LONG).await, Reach::NotProbed(w) if w.contains("not HTTP"))
        );
        let text = "[ca]\nbaseurl=https://cdn.example/el\nsslcacert=/etc/pki/none.pem\n";
        assert!(
            matches!(reach_of(text, LONG).await, Reach::NotProbed(w) if w.contains("sslcacert"))
        );
        let Reach::Unreachable { at: place, why } = reach_of("[empty]\nname=x\n", LONG).await
        else {
            panic!("a repository without a source fails");
        };
        assert_eq!(
            (place, why.as_str()),
            (at(1), "no baseurl, mirrorlist or metalink")
        );
    }
}
