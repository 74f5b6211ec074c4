//! Property tests for every parser of untrusted input.
//!
//! Each parser gets arbitrary input (it must never panic) and properties that would catch real
//! bugs, checked against small reference matchers written from the grammars (not from the
//! parsers) or against the model a generated input was rendered from. Case counts keep the whole
//! binary well under 30 s in the debug profile on a 2-core machine; failure persistence is off so
//! nothing is written into the repository. `STREAMD_FUZZ_SCALE=N` multiplies every case count
//! for a longer local soak (`STREAMD_FUZZ_SCALE=50 cargo test --test fuzz_parsers`).

mod config_file;
mod deployment;
mod extensions_layer;
mod host_facts;
mod kernel;
mod protocol_inputs;
mod pullsecret;
mod status;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;

use streamd::cluster::protocol::Inputs;

fn config(cases: u32) -> ProptestConfig {
    let scale = std::env::var("STREAMD_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1);
    ProptestConfig {
        cases: cases.saturating_mul(scale.max(1)),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

fn one_line(s: &str) -> bool {
    !s.contains('\n') && !s.contains('\r')
}

// ---------------------------------------------------------------------------------------------
// Reference matchers, written from the grammars.
// ---------------------------------------------------------------------------------------------

/// Kubernetes' RFC 1123 subdomain: `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`,
/// at most 253 characters.
fn ref_subdomain(s: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum St {
        LabelStart,
        Alnum,
        Dash,
    }
    let mut st = St::LabelStart;
    for b in s.bytes() {
        let alnum = b.is_ascii_lowercase() || b.is_ascii_digit();
        st = match (st, b) {
            _ if alnum => St::Alnum,
            (St::Alnum | St::Dash, b'-') => St::Dash,
            (St::Alnum, b'.') => St::LabelStart,
            _ => return false,
        };
    }
    st == St::Alnum && s.len() <= 253
}

/// Docker distribution path component: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn ref_path_component(c: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum St {
        Start,
        Alnum,
        Dot,
        Under1,
        Under2,
        Dash,
    }
    let mut st = St::Start;
    for b in c.bytes() {
        let alnum = b.is_ascii_lowercase() || b.is_ascii_digit();
        st = match (st, b) {
            _ if alnum => St::Alnum,
            (St::Alnum, b'.') => St::Dot,
            (St::Alnum, b'_') => St::Under1,
            (St::Under1, b'_') => St::Under2,
            (St::Alnum | St::Dash, b'-') => St::Dash,
            _ => return false,
        };
    }
    st == St::Alnum
}

/// `hostname[:port]`: DNS labels of letters, digits and inner '-' (1..=63 each), port 1..=65535.
fn ref_host(host: &str) -> bool {
    let (name, port) = match host.rfind(':') {
        Some(i) => (&host[..i], Some(&host[i + 1..])),
        None => (host, None),
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.bytes().all(|c| c.is_ascii_digit())
            && p.parse::<u64>().is_ok_and(|n| (1..=65535).contains(&n))
    });
    port_ok
        && !name.is_empty()
        && name.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

/// `host[:port]/component(/component)*@sha256:<64 lower-case hex>`, at most 447 bytes.
fn ref_image(s: &str) -> bool {
    if s.len() > 447 {
        return false;
    }
    let Some((name, digest)) = s.split_once('@') else {
        return false;
    };
    let digest_ok = digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    });
    let Some((host, repo)) = name.split_once('/') else {
        return false;
    };
    digest_ok && ref_host(host) && repo.split('/').all(ref_path_component)
}

/// Reboot tokens: 1..=253 of letters, digits, '-', '_', '.', ':'.
fn ref_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(&c))
}

// ---------------------------------------------------------------------------------------------
// Generic string strategies: valid values, and values a few edits away from valid.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Edit {
    Insert(Index, char),
    Delete(Index),
    Replace(Index, char),
}

fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => select(vec![
            '@', ':', '/', '.', '-', '_', ' ', '\t', '\n', '\r', 'A', 'Z', 'a', 'z', '0', '9',
            'é', '\u{0}', '\u{85}', '\u{2028}', '\u{200b}', '+', '%', '"',
        ]),
        1 => any::<char>(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), interesting_char()).prop_map(|(i, c)| Edit::Insert(i, c)),
        any::<Index>().prop_map(Edit::Delete),
        (any::<Index>(), interesting_char()).prop_map(|(i, c)| Edit::Replace(i, c)),
    ]
}

fn apply_edits(s: &str, edits: &[Edit]) -> String {
    let mut cs: Vec<char> = s.chars().collect();
    for e in edits {
        match e {
            Edit::Insert(i, c) => {
                let at = i.index(cs.len() + 1);
                cs.insert(at, *c);
            }
            Edit::Delete(i) if !cs.is_empty() => {
                let at = i.index(cs.len());
                cs.remove(at);
            }
            Edit::Replace(i, c) if !cs.is_empty() => {
                let at = i.index(cs.len());
                cs[at] = *c;
            }
            _ => {}
        }
    }
    cs.into_iter().collect()
}

fn mutated(base: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (base, vec(edit(), 1..3)).prop_map(|(s, e)| apply_edits(&s, &e))
}

fn hex64() -> impl Strategy<Value = String> {
    "[0-9a-f]{64}"
}

fn valid_image() -> impl Strategy<Value = String> {
    let label = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?";
    let host = (vec(label, 1..4), option::of(1u32..=65535)).prop_map(|(labels, port)| {
        let name = labels.join(".");
        match port {
            Some(p) => format!("{name}:{p}"),
            None => name,
        }
    });
    let component = "[a-z0-9]{1,6}((\\.|_|__|-{1,3})[a-z0-9]{1,6}){0,2}";
    (host, vec(component, 1..4), hex64())
        .prop_map(|(h, path, hex)| format!("{h}/{}@sha256:{hex}", path.join("/")))
}

/// Valid-looking references whose length straddles the 447 limit.
fn long_image() -> impl Strategy<Value = String> {
    (300usize..400, hex64())
        .prop_map(|(n, hex)| format!("quay.io/{}/rhcos@sha256:{hex}", "a".repeat(n)))
}

fn image_like() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => valid_image(),
        4 => mutated(valid_image()),
        1 => long_image(),
        1 => "[a-zA-Z0-9@:/._ -]{0,40}",
        1 => any::<String>(),
    ]
}

fn valid_stream() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?){0,3}",
        // Long names around the 253 limit.
        vec("[a-z0-9]([a-z0-9-]{0,12}[a-z0-9])?", 15..40).prop_map(|l| l.join(".")),
    ]
}

fn stream_like() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => valid_stream(),
        4 => mutated(valid_stream()),
        1 => "[a-z0-9.-]{0,12}",
        1 => "[a-zA-Z0-9._ -]{0,12}",
        1 => any::<String>(),
    ]
}

// ---- Strategies more than one module draws from ---------------------------------------------

/// RPM names: components of letters and digits; later ones may start with a digit
/// (`kernel-64k-core`).
fn pkg_name() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "kernel",
            "kernel-core",
            "kernel-rt",
            "kernel-rt-core",
            "kernel-rt-modules",
            "kernel-64k",
            "kernel-64k-core",
            "usbguard",
        ])
        .prop_map(String::from),
        ("[a-z][a-z0-9_+]{0,6}", vec("[a-z0-9][a-z0-9_+]{0,5}", 0..3))
            .prop_map(|(h, t)| { std::iter::once(h).chain(t).collect::<Vec<_>>().join("-") }),
    ]
}

/// `version-release.arch`, the release carrying an `el<N>` dist tag or not.
fn evr() -> impl Strategy<Value = String> {
    (
        "[0-9]{1,2}(\\.[0-9]{1,3}){0,2}",
        "[0-9]{1,3}(\\.[0-9]{1,2})?",
        option::of((0u32..20, option::of(0u8..10))),
        arch(),
    )
        .prop_map(|(v, r, el, a)| match el {
            Some((n, Some(m))) => format!("{v}-{r}.el{n}_{m}.{a}"),
            Some((n, None)) => format!("{v}-{r}.el{n}.{a}"),
            None => format!("{v}-{r}.{a}"),
        })
}

fn inputs() -> impl Strategy<Value = Inputs> {
    let token = prop_oneof![
        3 => "[A-Za-z0-9_.:-]{1,20}",
        1 => "[A-Za-z0-9_.:-]{250,256}",
        1 => "[ -~]{0,10}",
        1 => any::<String>(),
    ];
    (
        option::weighted(0.8, stream_like()),
        option::weighted(0.8, image_like()),
        option::of(image_like()),
        option::of(token),
    )
        .prop_map(
            |(stream, os_image, extensions_image, reboot_approved)| Inputs {
                stream,
                os_image,
                extensions_image,
                reboot_approved,
            },
        )
}

fn arch() -> impl Strategy<Value = &'static str> {
    select(vec!["x86_64", "aarch64", "ppc64le", "s390x", "noarch"])
}
