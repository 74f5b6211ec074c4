//! Property tests for every parser of untrusted input.
//!
//! Each parser gets arbitrary input (it must never panic) and properties that would catch real
//! bugs, checked against small reference matchers written from the grammars (not from the
//! parsers) or against the model a generated input was rendered from. Case counts keep the whole
//! file well under 30 s in the debug profile on a 2-core machine; failure persistence is off so
//! nothing is written into the repository. `STREAMD_FUZZ_SCALE=N` multiplies every case count
//! for a longer local soak (`STREAMD_FUZZ_SCALE=50 cargo test --test fuzz_parsers`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use testbed::scratch::ScratchDir;
use zbus::zvariant::{Array, Dict, ObjectPath, OwnedValue, Signature, StructureBuilder, Value};

use streamd::agent::preflight::stream_major;
use streamd::backend::Deployment;
use streamd::backend::kernel::{KernelVariant, checked_variant};
use streamd::cluster::protocol::{self, INPUT_KEYS, Inputs, MAX_REASON_CHARS, validate_stream};
use streamd::config::{ConfigError, parse_fragment};
use streamd::host::facts::fips::{Fips, fips};
use streamd::host::facts::{OsRelease, cpu, crio};
use streamd::image::pullsecret::{Credentials, PullSecret};
use streamd::image::reference::{ImageRef, MAX_LEN};
use streamd::image::registry::{EXTENSIONS_DIR, EXTRACT_LIMITS, ExtractBudget, rpms_in_layer};
use streamd::image::rpm::{el_major, names_package, package_name};
use streamd::text::{one_line_reason, quote};

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

// ---------------------------------------------------------------------------------------------
// protocol + imageref
// ---------------------------------------------------------------------------------------------

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

/// Every key whose value (or absence) is a reason to refuse: any one of them may be reported.
fn bad_keys(i: &Inputs) -> Vec<&'static str> {
    let mut bad = Vec::new();
    if i.reboot_approved.as_deref().is_some_and(|t| !ref_token(t)) {
        bad.push(protocol::REBOOT_APPROVED);
    }
    let (s, o, e) = (&i.stream, &i.os_image, &i.extensions_image);
    if s.as_deref().is_some_and(|s| !ref_subdomain(s)) || (s.is_none() && o.is_some()) {
        bad.push(protocol::DESIRED_STREAM);
    }
    if o.as_deref().is_some_and(|o| !ref_image(o)) || (o.is_none() && s.is_some()) {
        bad.push(protocol::DESIRED_OS_IMAGE);
    }
    if e.as_deref().is_some_and(|e| !ref_image(e)) || (e.is_some() && s.is_none() && o.is_none()) {
        bad.push(protocol::DESIRED_EXTENSIONS_IMAGE);
    }
    bad
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn imageref_accepts_exactly_the_grammar(s in image_like()) {
        let parsed = s.parse::<ImageRef>();
        prop_assert_eq!(parsed.is_ok(), ref_image(&s), "{:?} -> {:?}", s, parsed);
        match parsed {
            Ok(r) => {
                prop_assert_eq!(r.to_string(), s.clone(), "Display must round-trip");
                prop_assert!(!s.chars().any(|c| c.is_whitespace() || c.is_control()));
                prop_assert!(!s.starts_with('-'));
                prop_assert!(s.len() <= MAX_LEN);
                let (_, hex) = s.rsplit_once("@sha256:").ok_or_else(|| fail(s.clone()))?;
                prop_assert!(hex.len() == 64);
                prop_assert!(hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
                prop_assert_eq!(
                    format!("{}/{}@{}", r.registry(), r.repository(), r.digest()),
                    s.clone()
                );
                prop_assert_eq!(r.to_string().parse::<ImageRef>(), Ok(r.clone()));
                prop_assert_eq!(r.ostree_refspec(), format!("ostree-unverified-registry:{s}"));
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(one_line(&msg), "{:?}", msg);
                prop_assert!(msg.chars().count() <= MAX_REASON_CHARS);
            }
        }
    }

    #[test]
    fn imageref_generated_valid_refs_are_accepted(s in valid_image()) {
        let r = s.parse::<ImageRef>();
        prop_assert!(r.is_ok(), "{:?}: {:?}", s, r);
    }

    #[test]
    fn imageref_uppercase_digest_char_is_rejected(s in valid_image(), i in any::<Index>()) {
        let at = s.find("@sha256:").ok_or_else(|| fail(s.clone()))? + "@sha256:".len();
        let letters: Vec<usize> = s[at..]
            .char_indices()
            .filter(|(_, c)| c.is_ascii_lowercase())
            .map(|(j, _)| at + j)
            .collect();
        prop_assume!(!letters.is_empty());
        let j = letters[i.index(letters.len())];
        let mut m = s.clone();
        m.replace_range(j..=j, &s[j..=j].to_ascii_uppercase());
        prop_assert!(s.parse::<ImageRef>().is_ok());
        prop_assert!(m.parse::<ImageRef>().is_err(), "accepted {:?}", m);
    }

    #[test]
    fn stream_names_are_rfc1123_subdomains(s in stream_like()) {
        let got = validate_stream(&s);
        prop_assert_eq!(got.is_ok(), ref_subdomain(&s), "{:?}: {:?}", s, got);
        if let Err(msg) = got.map_err(|e| e.to_string()) {
            prop_assert!(one_line(&msg), "{:?}", msg);
        }
    }

    #[test]
    fn desired_errors_name_a_bad_input_key(i in inputs()) {
        let bad = bad_keys(&i);
        match i.desired() {
            Ok(None) => {
                prop_assert!(bad.is_empty(), "accepted {:?}, bad: {:?}", i, bad);
                prop_assert!(i.stream.is_none() && i.os_image.is_none() && i.extensions_image.is_none());
            }
            Ok(Some(d)) => {
                prop_assert!(bad.is_empty(), "accepted {:?}, bad: {:?}", i, bad);
                prop_assert_eq!(Some(&d.stream), i.stream.as_ref());
                prop_assert_eq!(Some(d.os_image.to_string()), i.os_image.clone());
                prop_assert_eq!(d.extensions_image.as_ref().map(ImageRef::to_string), i.extensions_image.clone());
                let h = d.observed_hash();
                prop_assert!(h.len() == 16 && h.bytes().all(|c| c.is_ascii_hexdigit()));
            }
            Err(e) => {
                prop_assert!(INPUT_KEYS.contains(&e.key));
                prop_assert!(bad.contains(&e.key), "{:?} named {} but the bad keys are {:?}", i, e.key, bad);
                let msg = e.to_string();
                prop_assert!(msg.starts_with("annotation osstream.openshift.io/"), "{:?}", msg);
                prop_assert!(msg.starts_with(&format!("annotation {}: ", e.key)), "{:?}", msg);
                prop_assert!(one_line(&msg), "{:?}", msg);
                prop_assert!(msg.chars().count() <= MAX_REASON_CHARS, "{} chars", msg.chars().count());
                prop_assert_eq!(one_line_reason(&msg), msg.clone(), "the reason is the error, unabridged");
            }
        }
    }

    #[test]
    fn one_line_reason_is_one_bounded_line(
        s in prop_oneof![
            any::<String>(),
            "[a-z \n\r\t]{0,40}",
            "[a-z \n\r\t]{1000,2100}",
            "[é€a \n]{1000,1100}",
        ]
    ) {
        let r = one_line_reason(&s);
        prop_assert!(one_line(&r), "{:?}", r);
        prop_assert!(!r.chars().any(char::is_control), "{:?}", r);
        prop_assert!(r.chars().count() <= MAX_REASON_CHARS);
        prop_assert_eq!(one_line_reason(&r), r.clone(), "idempotent");
        // Text without control characters (tabs become spaces) is kept, line by line.
        let plain = !s.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
            && !s.chars().any(|c| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}'));
        let spaced = s.replace('\t', " ");
        if plain && one_line(&s) && spaced.trim() == spaced && s.chars().count() <= MAX_REASON_CHARS {
            prop_assert_eq!(&r, &spaced, "a short single line is kept as is");
        }
        if plain && r.chars().count() < MAX_REASON_CHARS {
            for line in spaced.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()) {
                prop_assert!(r.contains(line), "{:?} lost {:?}", r, line);
            }
        }
    }

    #[test]
    fn quote_is_one_bounded_debug_string(s in prop_oneof![any::<String>(), "[a-z\n\"\\\\]{70,90}"]) {
        let q = quote(&s);
        prop_assert!(one_line(&q), "{:?}", q);
        prop_assert!(!q.chars().any(char::is_control), "{:?}", q);
        if s.chars().count() <= 80 {
            prop_assert_eq!(q, format!("{s:?}"));
        } else {
            let head: String = s.chars().take(80).collect();
            prop_assert_eq!(q, format!("{head:?}…"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// pullsecret
// ---------------------------------------------------------------------------------------------

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("string to JSON")
}

/// The first 8-character window of `secret` found in `text`: every substring of length >= 8
/// contains one, so this checks them all.
fn leaked(text: &str, secret: &str) -> Option<String> {
    let cs: Vec<char> = secret.chars().collect();
    cs.windows(8)
        .map(|w| w.iter().collect::<String>())
        .find(|w| text.contains(w.as_str()))
}

/// Passwords from an alphabet that never occurs in error texts, registries or user names.
fn password() -> impl Strategy<Value = String> {
    "[A-Z0-9!#%&*+=?^~ÄÖ€]{8,32}"
}

fn registry_key() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "quay.io",
            "registry.example.com:5000",
            "https://quay.io/v1/",
            "localhost:5000",
        ])
        .prop_map(String::from),
        "[a-z][a-z0-9-]{0,8}\\.(io|com)(:[0-9]{2,4})?",
    ]
}

#[derive(Debug, Clone)]
enum BadSecret {
    AuthNoColon,
    AuthNotBase64,
    AuthNotUtf8,
    AuthUnquoted,
    AuthsIsString,
    AuthWrongType,
    OnlyPassword,
    Truncated(Index),
}

fn bad_secret() -> impl Strategy<Value = BadSecret> {
    prop_oneof![
        Just(BadSecret::AuthNoColon),
        Just(BadSecret::AuthNotBase64),
        Just(BadSecret::AuthNotUtf8),
        Just(BadSecret::AuthUnquoted),
        Just(BadSecret::AuthsIsString),
        Just(BadSecret::AuthWrongType),
        Just(BadSecret::OnlyPassword),
        any::<Index>().prop_map(BadSecret::Truncated),
    ]
}

/// A malformed pull secret around `pw`, and the auth value it carries (if any).
fn render_bad_secret(shape: &BadSecret, reg: &str, user: &str, pw: &str) -> (String, String) {
    let r = json_str(reg);
    let entry = |auth: &str| {
        format!(
            r#"{{"auths":{{{r}:{{"auth":{},"email":""}}}}}}"#,
            json_str(auth)
        )
    };
    match shape {
        BadSecret::AuthNoColon => {
            let a = b64(pw.as_bytes());
            (entry(&a), a)
        }
        BadSecret::AuthNotBase64 => {
            let a = format!("{pw}!!");
            (entry(&a), a)
        }
        BadSecret::AuthNotUtf8 => {
            let mut raw = vec![0xff, 0xfe];
            raw.extend_from_slice(format!("{user}:{pw}").as_bytes());
            let a = b64(&raw);
            (entry(&a), a)
        }
        BadSecret::AuthUnquoted => (format!(r#"{{"auths":{{{r}:{{"auth":{pw}}}}}}}"#), pw.into()),
        BadSecret::AuthsIsString => (format!(r#"{{"auths":{}}}"#, json_str(pw)), pw.into()),
        BadSecret::AuthWrongType => (
            format!(
                r#"{{"auths":{{{r}:{{"auth":5,"password":{}}}}}}}"#,
                json_str(pw)
            ),
            String::new(),
        ),
        BadSecret::OnlyPassword => (
            format!(r#"{{"auths":{{{r}:{{"password":{}}}}}}}"#, json_str(pw)),
            String::new(),
        ),
        BadSecret::Truncated(i) => {
            let a = b64(format!("{user}:{pw}").as_bytes());
            let full: Vec<char> = format!(
                r#"{{"auths":{{{r}:{{"auth":{},"password":{}}}}}}}"#,
                json_str(&a),
                json_str(pw)
            )
            .chars()
            .collect();
            let cut = i.index(full.len());
            (full[..cut].iter().collect(), a)
        }
    }
}

#[derive(Debug, Clone)]
enum GoodSecret {
    Auth,
    Fields,
    Token,
}

fn normalized(key: &str) -> &str {
    let k = key.trim_start_matches("https://");
    k.split('/').next().unwrap_or(k)
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn pullsecret_arbitrary_text_never_panics(s in prop_oneof![
        any::<String>(),
        "\\{\"auths\":\\{\"[a-z.]{0,6}\":\\{\"(auth|username|password|identitytoken)\":(\"[A-Za-z0-9+/=:]{0,12}\"|[0-9]|null|\\{\\}|\\[\\])\\}\\}\\}",
    ]) {
        if let Ok(p) = PullSecret::parse(&s) {
            let _ = format!("{p:?}");
        }
    }

    #[test]
    fn pullsecret_errors_never_show_the_secret(
        shape in bad_secret(),
        reg in registry_key(),
        user in "[a-z]{1,10}",
        pw in password(),
    ) {
        let (json, auth) = render_bad_secret(&shape, &reg, &user, &pw);
        let e = PullSecret::parse(&json).err().ok_or_else(|| fail(format!("accepted {json}")))?;
        for text in [e.to_string(), format!("{e:?}")] {
            for secret in [&pw, &auth] {
                if let Some(w) = leaked(&text, secret) {
                    return Err(fail(format!("{text:?} shows {w:?} of the secret, from {json}")));
                }
            }
        }
    }

    #[test]
    fn pullsecret_parsed_credentials_are_redacted_and_found(
        shape in prop_oneof![Just(GoodSecret::Auth), Just(GoodSecret::Fields), Just(GoodSecret::Token)],
        reg in registry_key(),
        user in "[a-z]{0,10}",
        pw in "[A-Z0-9!#%&*+=?^~:ÄÖ€]{8,32}",
    ) {
        let r = json_str(&reg);
        let (json, want) = match shape {
            GoodSecret::Auth => (
                format!(r#"{{"auths":{{{r}:{{"auth":{},"email":"x@y"}}}}}}"#, json_str(&b64(format!("{user}:{pw}").as_bytes()))),
                Credentials::Basic { username: user.clone(), password: pw.clone() },
            ),
            GoodSecret::Fields => (
                format!(r#"{{"auths":{{{r}:{{"username":{},"password":{}}}}}}}"#, json_str(&user), json_str(&pw)),
                Credentials::Basic { username: user.clone(), password: pw.clone() },
            ),
            GoodSecret::Token => (
                format!(r#"{{"auths":{{{r}:{{"auth":"","identitytoken":{}}}}}}}"#, json_str(&pw)),
                Credentials::Bearer(pw.clone()),
            ),
        };
        let p = PullSecret::parse(&json).map_err(|e| fail(format!("{json}: {e}")))?;
        prop_assert_eq!(p.for_registry(normalized(&reg)), Some(&want));
        let dbg = format!("{p:?} {:?}", p.for_registry(normalized(&reg)));
        prop_assert!(leaked(&dbg, &pw).is_none(), "{:?} shows the secret", dbg);
    }

    #[test]
    fn pullsecret_lookup_ignores_scheme_and_path(
        host in prop_oneof![
            select(vec!["quay.io", "registry.example.com:5000", "index.docker.io", "registry-1.docker.io", "docker.io", "localhost:5000"]).prop_map(String::from),
            "[a-z][a-z0-9-]{0,8}\\.[a-z]{2,3}",
        ],
        scheme in select(vec!["", "https://", "http://"]),
        path in select(vec!["", "/", "/v1/", "/v2/"]),
    ) {
        let json = format!(r#"{{"auths":{{{}:{{"username":"u","password":"p"}}}}}}"#, json_str(&format!("{scheme}{host}{path}")));
        let p = PullSecret::parse(&json).map_err(|e| fail(format!("{json}: {e}")))?;
        // A URL names its host; a plain key with a path names a namespace, which covers only
        // the repositories below it (containers/image's normalizeAuthFileKey, authKeysForKey).
        if scheme.is_empty() && path.len() > 1 {
            let ns = path.trim_matches('/');
            prop_assert!(p.for_registry(&host).is_none(), "{} matched {}", host, json);
            prop_assert!(p.for_repository(&host, &format!("{ns}/app")).is_some(), "{}/{}/app not found in {}", host, ns, json);
        } else {
            prop_assert!(p.for_registry(&host).is_some(), "{} not found in {}", host, json);
            prop_assert!(p.for_repository(&host, "any/app").is_some(), "{} not found in {}", host, json);
        }
    }

    #[test]
    fn pullsecret_lookup_is_ascii_case_insensitive(
        host in prop_oneof![
            select(vec!["quay.io", "index.docker.io", "registry-1.docker.io", "docker.io"]).prop_map(String::from),
            "[a-z][a-z0-9-]{0,8}\\.[a-z]{2,3}",
        ],
        key_upper in any::<bool>(),
    ) {
        let key = if key_upper { host.to_ascii_uppercase() } else { host.clone() };
        let json = format!(r#"{{"auths":{{{}:{{"username":"u","password":"p"}}}}}}"#, json_str(&key));
        let p = PullSecret::parse(&json).map_err(|e| fail(format!("{json}: {e}")))?;
        prop_assert!(p.for_registry(&host).is_some(), "{} not found in {}", host, json);
        prop_assert!(p.for_registry(&host.to_ascii_uppercase()).is_some(), "{} not found in {}", host.to_ascii_uppercase(), json);
    }
}

// ---------------------------------------------------------------------------------------------
// os-release
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum OsLine {
    Kv {
        key: String,
        value: String,
        style: u8,
        indent: &'static str,
    },
    Comment(String),
    Blank,
    Junk(&'static str),
}

fn os_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "rhcos", "scos", "rhel", "centos", "fedora", "RHCOS", "rhcos ", ""
        ])
        .prop_map(String::from),
        select(vec!["coreos", "CoreOS", "server", "coreos "]).prop_map(String::from),
        "[0-9]{1,3}(\\.[0-9]{1,2}){0,2}",
        select(vec!["abc", "9.x", ".9", "99999999999", "4.20"]).prop_map(String::from),
        "[ -~é€]{0,12}",
    ]
}

fn os_line() -> impl Strategy<Value = OsLine> {
    let key = prop_oneof![
        4 => select(vec!["ID", "VARIANT_ID", "VERSION_ID", "RHEL_VERSION"]).prop_map(String::from),
        1 => "[A-Z_][A-Z0-9_]{0,8}",
    ];
    prop_oneof![
        8 => (key, os_value(), 0u8..3, select(vec!["", " ", "\t "])).prop_map(
            |(key, value, style, indent)| OsLine::Kv { key, value, style, indent }
        ),
        1 => "[ -~]{0,10}".prop_map(OsLine::Comment),
        1 => Just(OsLine::Blank),
        1 => select(vec!["no-eq", "=bad", "C D=1", "-X=1", "ID =rhcos", "ID.X=1"]).prop_map(OsLine::Junk),
    ]
}

fn render_os_line(l: &OsLine) -> String {
    match l {
        OsLine::Kv {
            key,
            value,
            style,
            indent,
        } => {
            let bare = value
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
            let single = !value.contains(['\'', '\\']);
            let v = match style {
                0 if bare => value.clone(),
                2 if single => format!("'{value}'"),
                _ => {
                    let mut o = String::from("\"");
                    for c in value.chars() {
                        if matches!(c, '"' | '\\' | '$' | '`') {
                            o.push('\\');
                        }
                        o.push(c);
                    }
                    o.push('"');
                    o
                }
            };
            format!("{indent}{key}={v}")
        }
        OsLine::Comment(c) => format!("#{c}"),
        OsLine::Blank => "  ".into(),
        OsLine::Junk(j) => (*j).into(),
    }
}

fn os_major(m: &BTreeMap<String, String>) -> Option<u32> {
    m.get("RHEL_VERSION")
        .or(m.get("VERSION_ID"))?
        .split('.')
        .next()?
        .parse()
        .ok()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn osrelease_parses_what_was_written(
        lines in vec(os_line(), 0..8),
        eol in select(vec!["\n", "\r\n"]),
    ) {
        let text = lines.iter().map(render_os_line).collect::<Vec<_>>().join(eol);
        let mut want = BTreeMap::new();
        for l in &lines {
            if let OsLine::Kv { key, value, .. } = l {
                want.insert(key.clone(), value.clone());
            }
        }
        let os = OsRelease::parse(&text);
        for (k, v) in &want {
            prop_assert_eq!(os.get(k), Some(v.as_str()), "key {} of {:?}", k, text);
        }
        let coreos = want.get("VARIANT_ID").map(String::as_str) == Some("coreos");
        let family = match want.get("ID").map(String::as_str) {
            Some("rhcos") => Some("rhel"),
            Some("scos") => Some("centos"),
            Some("rhel") if coreos => Some("rhel"),
            Some("centos") if coreos => Some("centos"),
            _ => None,
        };
        let expected = family.zip(os_major(&want)).map(|(f, m)| format!("{f}-{m}"));
        let stream = os.stream();
        prop_assert_eq!(&stream, &expected, "{:?}", text);
        if let Some(s) = stream {
            prop_assert!(validate_stream(&s).is_ok(), "{:?} is not a valid stream", s);
            prop_assert_eq!(stream_major(&s), os.major());
        }
    }

    #[test]
    fn osrelease_arbitrary_text_names_only_documented_streams(
        text in prop_oneof![
            any::<String>(),
            "((ID|VARIANT_ID|VERSION_ID|RHEL_VERSION)=[\"']?(rhcos|scos|rhel|centos|coreos|[0-9.]{1,4}|\\\\|\")[\"']?\n){0,4}",
        ]
    ) {
        let os = OsRelease::parse(&text);
        if let Some(s) = os.stream() {
            let id = os.get("ID").unwrap_or_default();
            let documented = matches!(id, "rhcos" | "scos")
                || (matches!(id, "rhel" | "centos") && os.get("VARIANT_ID") == Some("coreos"));
            prop_assert!(documented, "stream {:?} for ID {:?}", s, id);
            prop_assert!(validate_stream(&s).is_ok(), "{:?}", s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// cpuinfo
// ---------------------------------------------------------------------------------------------

/// The x86-64 psABI micro-architecture levels as Linux names the flags (`abm` is LZCNT; SSE3,
/// `pni`, is not required by streamd: every CPU with SSSE3 has it).
const REF_V2: [&str; 6] = ["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"];
const REF_V3: [&str; 9] = [
    "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
];
const REF_V4: [&str; 5] = ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];
const NOISE_FLAGS: [&str; 6] = ["pni", "avx512_vnni", "sse4a", "avx2x", "xsaveopt", "avx512"];
const BASELINE: &str = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm";

fn all_level_flags() -> Vec<&'static str> {
    REF_V2
        .iter()
        .chain(&REF_V3)
        .chain(&REF_V4)
        .chain(&NOISE_FLAGS)
        .copied()
        .collect()
}

fn ref_required(level: u8) -> Vec<&'static str> {
    [(2, &REF_V2[..]), (3, &REF_V3[..]), (4, &REF_V4[..])]
        .into_iter()
        .filter(|(n, _)| *n <= level)
        .flat_map(|(_, s)| s.iter().copied())
        .collect()
}

fn ref_level(flags: &BTreeSet<&str>) -> u8 {
    (2..=4)
        .take_while(|l| ref_required(*l).iter().all(|f| flags.contains(f)))
        .last()
        .unwrap_or(1)
}

fn flag_set() -> impl Strategy<Value = BTreeSet<&'static str>> {
    let all = all_level_flags();
    vec(prop::bool::weighted(0.9), all.len()).prop_map(move |mask| {
        all.iter()
            .zip(mask)
            .filter(|(_, m)| *m)
            .map(|(f, _)| *f)
            .collect()
    })
}

fn cpuinfo_text(
    first: &BTreeSet<&str>,
    vmx: &BTreeSet<&str>,
    second: &BTreeSet<&str>,
    sep: &str,
) -> String {
    let j = |s: &BTreeSet<&str>| s.iter().copied().collect::<Vec<_>>().join(" ");
    format!(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Fuzz CPU @ 2.00GHz\nflags{sep}: {BASELINE} {}\nvmx flags\t: {}\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: {BASELINE} {}\n",
        j(first),
        j(vmx),
        j(second)
    )
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn cpu_arbitrary_text_never_panics(text in prop_oneof![
        any::<String>(),
        "((flags|vmx flags|Features|processor)[ \t]*:[ a-z0-9_]{0,30}\n){0,4}",
    ]) {
        let level = cpu::x86_64_level(&text);
        prop_assert_eq!(level.is_some(), cpu::flags(&text).is_some());
        prop_assert!(level.is_none_or(|l| (1..=4).contains(&l)));
        for l in 0..=4 {
            let _ = cpu::missing_for(&text, l);
        }
    }

    #[test]
    fn cpu_level_is_the_first_cpus_and_monotone(
        first in flag_set(),
        extra in flag_set(),
        vmx in flag_set(),
        second in flag_set(),
        sep in select(vec!["\t\t", "\t", " ", ""]),
    ) {
        let text = cpuinfo_text(&first, &vmx, &second, sep);
        let level = cpu::x86_64_level(&text).ok_or_else(|| fail(text.clone()))?;
        prop_assert_eq!(level, ref_level(&first), "{}", text);

        let more: BTreeSet<&str> = first.union(&extra).copied().collect();
        let more_level = cpu::x86_64_level(&cpuinfo_text(&more, &vmx, &second, sep));
        prop_assert!(more_level >= Some(level), "adding {:?} lowered {} to {:?}", extra, level, more_level);

        for l in 0..=4u8 {
            let missing = cpu::missing_for(&text, l);
            prop_assert_eq!(missing.is_empty(), level >= l, "level {} missing_for({}) = {:?}", level, l, missing);
            let want: Vec<&str> = ref_required(l).into_iter().filter(|f| !first.contains(f)).collect();
            prop_assert_eq!(
                missing.iter().copied().collect::<BTreeSet<_>>(),
                want.into_iter().collect::<BTreeSet<_>>()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// crio
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum CrioFile {
    Sets(String, u8),
    Unrelated(u8),
    Bad(u8),
}

const CRIO_UNRELATED: [&str; 5] = [
    "",
    "# default_runtime = \"runc\"\n",
    "[crio]\nlog_level = \"debug\"\n",
    "[crio.runtime]\nconmon = \"/usr/bin/conmon\"\n",
    "[crio.runtime.runtimes.runc]\nruntime_path = \"\"\n",
];

const CRIO_BAD: [&str; 5] = [
    "[crio.runtime\n",
    "[crio.runtime]\ndefault_runtime = 1\n",
    "[crio.runtime]\ndefault_runtime = [\"crun\"]\n",
    "[crio.runtime]\ndefault_runtime = \"a\"\ndefault_runtime = \"b\"\n",
    "[crio.runtime]\ndefault_runtime = { name = \"crun\" }\n",
];

fn render_crio(f: &CrioFile) -> String {
    match f {
        CrioFile::Sets(r, style) => match style % 5 {
            0 => format!("[crio.runtime]\ndefault_runtime = \"{r}\"\n"),
            1 => format!("[crio]\nlog_level = \"info\"\n[crio.runtime]\ndefault_runtime = '{r}'\n"),
            2 => format!("crio.runtime.default_runtime = \"{r}\"\n"),
            3 => format!("[crio]\nruntime = {{ default_runtime = \"{r}\" }}\n"),
            _ => format!(
                "[crio.runtime]\n# default_runtime = \"x\"\ndefault_runtime = \"{r}\"\n\n[crio.runtime.runtimes.{r}]\nruntime_path = \"/usr/bin/{r}\"\n"
            ),
        },
        CrioFile::Unrelated(i) => CRIO_UNRELATED[*i as usize % CRIO_UNRELATED.len()].into(),
        CrioFile::Bad(i) => CRIO_BAD[*i as usize % CRIO_BAD.len()].into(),
    }
}

fn crio_good_file() -> impl Strategy<Value = CrioFile> {
    prop_oneof![
        ("[a-z][a-z0-9_-]{0,10}", any::<u8>()).prop_map(|(r, s)| CrioFile::Sets(r, s)),
        any::<u8>().prop_map(CrioFile::Unrelated),
    ]
}

fn crio_files(files: &[CrioFile]) -> Vec<(String, String)> {
    files
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("crio.conf.d/{i:02}.conf"), render_crio(f)))
        .collect()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn crio_arbitrary_files_never_panic(files in vec(("[a-z]{1,6}\\.conf", prop_oneof![
        any::<String>(),
        "(\\[crio(\\.runtime)?\\]\n|default_runtime = (\"[a-z]{0,4}\"|[0-9]|true|\\[\\])\n|[a-z_]{1,6} = \"x\"\n){0,4}",
    ]), 0..4)) {
        match crio::default_runtime(&files) {
            Ok(r) => prop_assert!(!r.is_empty() || files.iter().any(|(_, t)| t.contains("default_runtime"))),
            Err(e) => prop_assert!(files.iter().any(|(f, _)| *f == e.file), "{:?} names no given file", e),
        }
    }

    #[test]
    fn crio_last_file_wins(files in vec(crio_good_file(), 0..6)) {
        let want = files
            .iter()
            .rev()
            .find_map(|f| match f {
                CrioFile::Sets(r, _) => Some(r.clone()),
                _ => None,
            })
            .unwrap_or_else(|| crio::CRIO_DEFAULT_RUNTIME.to_string());
        let rendered = crio_files(&files);
        prop_assert_eq!(crio::default_runtime(&rendered), Ok(want), "{:?}", rendered);
    }

    #[test]
    fn crio_first_bad_file_is_named(
        mut files in vec(crio_good_file(), 0..5),
        at in any::<Index>(),
        bad in any::<u8>(),
        later_bad in option::of(any::<u8>()),
    ) {
        let at = at.index(files.len() + 1);
        files.insert(at, CrioFile::Bad(bad));
        if let Some(b) = later_bad {
            files.push(CrioFile::Bad(b));
        }
        let rendered = crio_files(&files);
        let e = crio::default_runtime(&rendered).err().ok_or_else(|| fail(format!("{rendered:?} accepted")))?;
        prop_assert_eq!(&e.file, &rendered[at].0);
        prop_assert!(!e.message.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// fips
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn fips_arbitrary_input_never_panics(enabled in option::of(any::<String>()), cmdline in any::<String>()) {
        let _ = fips(enabled.as_deref(), &cmdline);
    }

    #[test]
    fn fips_last_fips_arg_and_kernel_must_agree(
        enabled in option::of(select(vec!["1", "1\n", " 1 ", "0", "0\n", "2", "", "10"])),
        tokens in vec(prop_oneof![
            select(vec!["fips=1", "fips=0", "fips=", "fips=yes", "nofips=1", "FIPS=1", "fips=1x", "BOOT_IMAGE=/vmlinuz", "rw", "quiet"]).prop_map(String::from),
            "[a-z_]{1,8}(=[a-z0-9]{0,4})?",
        ], 0..6),
        sep in select(vec![" ", "  ", "\t", "\n"]),
    ) {
        let cmdline = tokens.join(sep);
        let kernel = enabled.is_some_and(|v| v.trim() == "1");
        let cmd = tokens.iter().rev().find(|t| t.starts_with("fips=")).is_some_and(|t| t == "fips=1");
        let want = match (kernel, cmd) {
            (true, true) => Fips::Enabled,
            (false, false) => Fips::Disabled,
            _ => Fips::Inconsistent,
        };
        prop_assert_eq!(fips(enabled, &cmdline), want, "{:?} {:?}", enabled, cmdline);
    }
}

// ---------------------------------------------------------------------------------------------
// kernel + preflight name parsing
// ---------------------------------------------------------------------------------------------

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

fn arch() -> impl Strategy<Value = &'static str> {
    select(vec!["x86_64", "aarch64", "ppc64le", "s390x", "noarch"])
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

fn has_el_tag(s: &str) -> bool {
    s.split(['.', '-', '_', '+']).any(|p| {
        p.strip_prefix("el")
            .is_some_and(|d| d.parse::<u32>().is_ok())
    })
}

fn deployment_with(pkgs: &[String], local: &[String], repl: &[String]) -> Deployment {
    Deployment {
        requested_packages: pkgs.to_vec(),
        requested_local_packages: local.to_vec(),
        requested_base_local_replacements: repl.to_vec(),
        ..Deployment::default()
    }
}

/// Specs for the variant properties, with the variant each one makes the deployment.
const VARIANT_SPECS: [(&str, Option<KernelVariant>); 10] = [
    ("kernel-rt-core", Some(KernelVariant::Realtime)),
    (
        "kernel-rt-core-5.14.0-570.el9_6.x86_64",
        Some(KernelVariant::Realtime),
    ),
    ("kernel-rt-core-debuginfo", None),
    ("kernel-rt-core-debuginfo-5.14.0-1.el9.x86_64", None),
    ("kernel-rt-modules-5.14.0-1.el9.x86_64", None),
    ("kernel-64k-core", Some(KernelVariant::SixtyFourK)),
    (
        "kernel-64k-core-6.12.0-55.el10.aarch64",
        Some(KernelVariant::SixtyFourK),
    ),
    ("kernel-64k-core-debuginfo", None),
    ("usbguard-1.1.3-3.el10.x86_64", None),
    ("usbguard", None),
];

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn names_package_arbitrary(spec in any::<String>(), name in any::<String>()) {
        if names_package(&spec, &name) {
            prop_assert!(spec.starts_with(&name));
        }
    }

    #[test]
    fn names_package_matches_name_and_nevra(name in pkg_name(), evr in evr(), suffix in "[a-z][a-z0-9]{0,8}") {
        prop_assert!(names_package(&name, &name));
        let nevra = format!("{name}-{evr}");
        prop_assert!(names_package(&nevra, &name), "{} does not name {}", nevra, name);
        // `-debuginfo`, `-devel`: a different package.
        let sub = format!("{name}-{suffix}");
        prop_assert!(!names_package(&sub, &name), "{} names {}", sub, name);
        prop_assert!(!names_package(&format!("{sub}-{evr}"), &name), "{}-{} names {}", sub, evr, name);
    }

    #[test]
    fn names_package_never_names_another_package(a in pkg_name(), b in pkg_name(), evr in evr()) {
        prop_assume!(a != b);
        let nevra = format!("{b}-{evr}");
        prop_assert!(!names_package(&nevra, &a), "{} names {}", nevra, a);
    }

    #[test]
    fn package_name_of_nevra_is_the_name(name in pkg_name(), evr in evr()) {
        let nevra = format!("{name}-{evr}");
        prop_assert_eq!(package_name(&nevra), name.as_str());
    }

    #[test]
    fn package_name_of_a_plain_name_is_the_name(name in pkg_name()) {
        prop_assert_eq!(package_name(&name), name.as_str());
    }

    #[test]
    fn preflight_name_parsers_never_panic(s in any::<String>()) {
        let _ = package_name(&s);
        let _ = el_major(&s);
        let _ = stream_major(&s);
        // The name is the spec itself or its leading part.
        prop_assert!(s.starts_with(package_name(&s)));
    }

    #[test]
    fn el_major_reads_the_dist_tag(
        name in pkg_name().prop_filter("no el<N> component", |n| !has_el_tag(n)),
        v in "[0-9]{1,2}(\\.[0-9]{1,3}){0,2}",
        r in "[0-9]{1,4}(\\.[0-9]{1,3})?",
        n in any::<u32>(),
        minor in option::of(0u8..10),
        arch in arch(),
        kernel_suffix in select(vec!["", "+rt", "+64k", "+debug"]),
    ) {
        let minor = minor.map(|m| format!("_{m}")).unwrap_or_default();
        let release = format!("{v}-{r}.el{n}{minor}.{arch}{kernel_suffix}");
        prop_assert_eq!(el_major(&release), Some(n), "{}", release);
        let nevra = format!("{name}-{v}-{r}.el{n}{minor}.{arch}");
        prop_assert_eq!(el_major(&nevra), Some(n), "{}", nevra);
        let untagged = format!("{name}-{v}-{r}.fc41.{arch}");
        prop_assert_eq!(el_major(&untagged), None, "{}", untagged);
    }

    #[test]
    fn stream_major_reads_the_last_component(family in "[a-z]{1,8}(-[a-z]{1,8}){0,2}", n in any::<u32>(), m in any::<u16>()) {
        prop_assert_eq!(stream_major(&format!("{family}-{n}")), Some(n));
        prop_assert_eq!(stream_major(&format!("{family}-{n}.{m}")), Some(n));
        prop_assert_eq!(stream_major(&family), None);
    }

    #[test]
    fn checked_variant_agrees_with_overrides_and_running_kernel(
        pkgs in vec(select(VARIANT_SPECS.to_vec()), 0..3),
        local in vec(select(VARIANT_SPECS.to_vec()), 0..2),
        repl in vec(select(VARIANT_SPECS.to_vec()), 0..2),
        base in "[0-9]\\.[0-9]{1,2}\\.[0-9]-[0-9]{1,3}\\.el(9|10)(_[0-9])?\\.(x86_64|aarch64)",
        suffix in select(vec!["", "+rt", "+64k", "+debug", "+rt\n", " "]),
        sys in option::of(select(vec!["1", "1\n", "0", "", "2"])),
    ) {
        let specs = |v: &[(&str, Option<KernelVariant>)]| v.iter().map(|(s, _)| s.to_string()).collect::<Vec<_>>();
        let dep = deployment_with(&specs(&pkgs), &specs(&local), &specs(&repl));
        let all: Vec<Option<KernelVariant>> = pkgs.iter().chain(&local).chain(&repl).map(|(_, v)| *v).collect();
        let from_overrides = if all.contains(&Some(KernelVariant::Realtime)) {
            KernelVariant::Realtime
        } else if all.contains(&Some(KernelVariant::SixtyFourK)) {
            KernelVariant::SixtyFourK
        } else {
            KernelVariant::Default
        };
        let release = format!("{base}{suffix}");
        let r = release.trim();
        let running = if r.ends_with("+rt") || sys.is_some_and(|s| s.trim() == "1") {
            KernelVariant::Realtime
        } else if r.ends_with("+64k") {
            KernelVariant::SixtyFourK
        } else {
            KernelVariant::Default
        };
        match checked_variant(&dep, &release, sys).map_err(|e| e.to_string()) {
            Ok(v) => {
                // Without variant overrides a running variant comes from the image.
                prop_assert!(v == from_overrides || from_overrides == KernelVariant::Default, "{:?}", v);
                prop_assert_eq!(v, running);
            }
            Err(msg) => {
                prop_assert!(from_overrides != running && from_overrides != KernelVariant::Default, "{}", msg);
                prop_assert!(one_line(&msg), "{:?}", msg);
                prop_assert!(msg.contains(from_overrides.as_str()) && msg.contains(running.as_str()), "{}", msg);
            }
        }
    }

    #[test]
    fn checked_variant_arbitrary_never_panics(
        pkgs in vec(any::<String>(), 0..3),
        release in any::<String>(),
        sys in option::of(any::<String>()),
    ) {
        let dep = deployment_with(&pkgs, &[], &[]);
        if let Err(msg) = checked_variant(&dep, &release, sys.as_deref()).map_err(|e| e.to_string()) {
            prop_assert!(one_line(&msg), "{:?}", msg);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rpm-ostree deployment dictionaries
// ---------------------------------------------------------------------------------------------

const CONFIG_KEY: &str = "ostree.container.image-config";

/// A model of a D-Bus value, turned into a real `zvariant::Value` per case.
#[derive(Debug, Clone)]
enum V {
    U8(u8),
    Bool(bool),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Path(String),
    Sig,
    Variant(Box<V>),
    StrArray(Vec<String>),
    I32Array(Vec<i32>),
    VarArray(Vec<V>),
    Dict(Vec<(String, V)>),
    IntDict(Vec<(i32, String)>),
    Struct(Vec<V>),
}

fn to_value(v: &V) -> Value<'static> {
    match v {
        V::U8(x) => Value::U8(*x),
        V::Bool(x) => Value::Bool(*x),
        V::I16(x) => Value::I16(*x),
        V::U16(x) => Value::U16(*x),
        V::I32(x) => Value::I32(*x),
        V::U32(x) => Value::U32(*x),
        V::I64(x) => Value::I64(*x),
        V::U64(x) => Value::U64(*x),
        V::F64(x) => Value::F64(*x),
        V::Str(s) => Value::from(s.clone()),
        V::Path(p) => Value::ObjectPath(ObjectPath::try_from(p.clone()).expect("object path")),
        V::Sig => Value::Signature(Signature::Str),
        V::Variant(b) => Value::Value(Box::new(to_value(b))),
        V::StrArray(xs) => {
            let mut a = Array::new(&Signature::Str);
            for x in xs {
                a.append(Value::from(x.clone())).expect("append s");
            }
            Value::Array(a)
        }
        V::I32Array(xs) => {
            let mut a = Array::new(&Signature::I32);
            for x in xs {
                a.append(Value::I32(*x)).expect("append i");
            }
            Value::Array(a)
        }
        V::VarArray(xs) => {
            let mut a = Array::new(&Signature::Variant);
            for x in xs {
                a.append(Value::Value(Box::new(to_value(x))))
                    .expect("append v");
            }
            Value::Array(a)
        }
        V::Dict(entries) => {
            let mut d = Dict::new(&Signature::Str, &Signature::Variant);
            for (k, x) in entries {
                d.append(Value::from(k.clone()), Value::Value(Box::new(to_value(x))))
                    .expect("append {sv}");
            }
            Value::Dict(d)
        }
        V::IntDict(entries) => {
            let mut d = Dict::new(&Signature::I32, &Signature::Str);
            for (k, s) in entries {
                d.append(Value::I32(*k), Value::from(s.clone()))
                    .expect("append {is}");
            }
            Value::Dict(d)
        }
        V::Struct(xs) => {
            let mut b = StructureBuilder::new();
            for x in xs {
                b = b.append_field(to_value(x));
            }
            Value::Structure(b.build().expect("structure"))
        }
    }
}

fn to_dict(m: &HashMap<String, V>) -> HashMap<String, OwnedValue> {
    m.iter()
        .map(|(k, v)| (k.clone(), to_value(v).try_to_owned().expect("owned")))
        .collect()
}

fn v_str() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z0-9.:/@-]{0,16}", 1 => any::<String>()]
}

fn labels_json() -> impl Strategy<Value = (String, BTreeMap<String, String>)> {
    let value = prop_oneof![
        v_str().prop_map(serde_json::Value::String),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<bool>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
    ];
    btree_map("[a-z.]{1,10}", value, 0..4).prop_map(|m| {
        let strings = m
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let labels: serde_json::Map<String, serde_json::Value> = m.into_iter().collect();
        let doc = serde_json::json!({ "architecture": "amd64", "config": { "Labels": labels } });
        (doc.to_string(), strings)
    })
}

fn config_json() -> impl Strategy<Value = String> {
    prop_oneof![
        labels_json().prop_map(|(j, _)| j),
        select(vec![
            "{}",
            "null",
            "[1]",
            r#"{"config":{"Labels":null}}"#,
            "{not json",
            r#"{"config":{"Labels":{"x":"y"}}"#,
            "",
        ])
        .prop_map(String::from),
    ]
}

fn arb_v() -> impl Strategy<Value = V> {
    let scalars = prop_oneof![
        any::<u8>().prop_map(V::U8),
        any::<bool>().prop_map(V::Bool),
        any::<i16>().prop_map(V::I16),
        any::<u16>().prop_map(V::U16),
        any::<i32>().prop_map(V::I32),
        any::<u32>().prop_map(V::U32),
        any::<i64>().prop_map(V::I64),
        any::<u64>().prop_map(V::U64),
        any::<f64>().prop_map(V::F64),
    ];
    let others = prop_oneof![
        3 => v_str().prop_map(V::Str),
        1 => config_json().prop_map(V::Str),
        1 => "(/[a-z0-9_]{1,6}){1,3}".prop_map(V::Path),
        1 => Just(V::Sig),
        2 => vec(v_str(), 0..4).prop_map(V::StrArray),
        1 => vec(any::<i32>(), 0..4).prop_map(V::I32Array),
        1 => vec((any::<i32>(), v_str()), 0..3).prop_map(V::IntDict),
    ];
    let leaf = prop_oneof![scalars, others];
    leaf.prop_recursive(3, 16, 4, |inner| {
        let key = prop_oneof![Just(CONFIG_KEY.to_string()), "[a-z.-]{1,12}"];
        prop_oneof![
            inner.clone().prop_map(|v| V::Variant(Box::new(v))),
            vec(inner.clone(), 0..4).prop_map(V::VarArray),
            vec((key, inner.clone()), 0..4).prop_map(V::Dict),
            vec(inner, 1..4).prop_map(V::Struct),
        ]
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    S,
    B,
    I,
    As,
    Meta,
}

/// The documented keys: name, type, required.
const FIELDS: [(&str, Kind, bool); 16] = [
    ("base-commit-meta", Kind::Meta, false),
    ("id", Kind::S, true),
    ("osname", Kind::S, true),
    ("serial", Kind::I, true),
    ("checksum", Kind::S, true),
    ("booted", Kind::B, false),
    ("staged", Kind::B, false),
    ("pinned", Kind::B, false),
    ("finalization-locked", Kind::B, false),
    ("version", Kind::S, false),
    ("container-image-reference", Kind::S, false),
    ("container-image-reference-digest", Kind::S, false),
    ("requested-packages", Kind::As, false),
    ("requested-base-removals", Kind::As, false),
    ("requested-local-packages", Kind::As, false),
    ("requested-base-local-replacements", Kind::As, false),
];

fn unwrap_v(v: &V) -> &V {
    match v {
        V::Variant(b) => unwrap_v(b),
        other => other,
    }
}

/// Whether `v` is acceptable for a key of `kind`: variants are looked through; an empty array
/// of any element type is an empty list; metadata of other types is skipped, and an image
/// config that is not JSON leaves the labels unknown ([`bad_image_config`]), not the
/// deployment unreadable.
fn conforms(kind: Kind, v: &V) -> bool {
    match (kind, unwrap_v(v)) {
        (Kind::S, V::Str(_)) | (Kind::B, V::Bool(_)) | (Kind::I, V::I32(_)) => true,
        (Kind::As, V::StrArray(_)) => true,
        (Kind::As, V::VarArray(xs)) => xs.iter().all(|x| matches!(unwrap_v(x), V::Str(_))),
        (Kind::As, V::I32Array(xs)) => xs.is_empty(),
        (Kind::Meta, V::IntDict(_) | V::Dict(_)) => true,
        _ => false,
    }
}

/// Whether the model's commit metadata holds an image config string that is not JSON (the
/// last entry of the key wins, as in a dictionary).
fn bad_image_config(model: &HashMap<String, V>) -> bool {
    match model.get("base-commit-meta").map(unwrap_v) {
        Some(V::Dict(entries)) => entries
            .iter()
            .rev()
            .find(|(k, _)| k == CONFIG_KEY)
            .is_some_and(|(_, x)| match unwrap_v(x) {
                V::Str(s) => serde_json::from_str::<serde_json::Value>(s).is_err(),
                _ => false,
            }),
        _ => false,
    }
}

fn conforming(kind: Kind) -> BoxedStrategy<V> {
    let base: BoxedStrategy<V> = match kind {
        Kind::S => v_str().prop_map(V::Str).boxed(),
        Kind::B => any::<bool>().prop_map(V::Bool).boxed(),
        Kind::I => any::<i32>().prop_map(V::I32).boxed(),
        Kind::As => prop_oneof![
            vec(v_str(), 0..3).prop_map(V::StrArray),
            vec(v_str().prop_map(V::Str), 0..3).prop_map(V::VarArray),
        ]
        .boxed(),
        Kind::Meta => {
            let key = prop_oneof![Just(CONFIG_KEY.to_string()), "[a-z.-]{1,12}"];
            let value = prop_oneof![
                labels_json().prop_map(|(j, _)| V::Str(j)),
                v_str().prop_map(V::Str),
                any::<i32>().prop_map(V::I32),
            ];
            vec((key, value), 0..3).prop_map(V::Dict).boxed()
        }
    };
    prop_oneof![3 => base.clone(), 1 => base.prop_map(|v| V::Variant(Box::new(v)))]
        .prop_filter("conforming", move |v| conforms(kind, v))
        .boxed()
}

/// A valid deployment dictionary: every required key, some optional ones.
fn valid_base() -> impl Strategy<Value = HashMap<String, V>> {
    let per_field: Vec<BoxedStrategy<Option<(String, V)>>> = FIELDS
        .iter()
        .map(|&(k, kind, required)| {
            let s = conforming(kind).prop_map(move |v| (k.to_string(), v));
            if required {
                s.prop_map(Some).boxed()
            } else {
                option::of(s).boxed()
            }
        })
        .collect();
    per_field.prop_map(|fs| fs.into_iter().flatten().collect())
}

fn field_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(FIELDS.iter().map(|f| f.0).collect::<Vec<_>>()).prop_map(String::from),
        1 => "[a-z-]{1,12}",
    ]
}

fn v_as_string(v: &V) -> Option<String> {
    match unwrap_v(v) {
        V::Str(s) => Some(s.clone()),
        _ => None,
    }
}

fn v_as_strings(v: &V) -> Vec<String> {
    match unwrap_v(v) {
        V::StrArray(xs) => xs.clone(),
        V::VarArray(xs) => xs.iter().filter_map(v_as_string).collect(),
        _ => Vec::new(),
    }
}

fn check_deployment(model: &HashMap<String, V>) -> Result<(), TestCaseError> {
    let failing: Vec<&str> = FIELDS
        .iter()
        .filter(|(k, kind, required)| match model.get(*k) {
            None => *required,
            Some(v) => !conforms(*kind, v),
        })
        .map(|f| f.0)
        .collect();
    match Deployment::from_dict(&to_dict(model)) {
        Ok(d) => {
            prop_assert!(
                failing.is_empty(),
                "accepted with bad {:?}: {:?}",
                failing,
                model
            );
            prop_assert_eq!(Some(d.id), model.get("id").and_then(v_as_string));
            prop_assert_eq!(Some(d.osname), model.get("osname").and_then(v_as_string));
            prop_assert_eq!(d.version, model.get("version").and_then(v_as_string));
            let serial = match model.get("serial").map(unwrap_v) {
                Some(V::I32(i)) => Some(*i),
                _ => None,
            };
            prop_assert_eq!(Some(d.serial), serial);
            let booted = match model.get("booted").map(unwrap_v) {
                Some(V::Bool(b)) => *b,
                _ => false,
            };
            prop_assert_eq!(d.booted, booted);
            prop_assert_eq!(d.image_labels_error.is_some(), bad_image_config(model));
            prop_assert_eq!(
                d.requested_packages,
                model
                    .get("requested-packages")
                    .map(v_as_strings)
                    .unwrap_or_default()
            );
        }
        Err(e) => {
            prop_assert!(
                failing.contains(&e.key.as_str()),
                "{} named, bad keys {:?}",
                e,
                failing
            );
            if e.problem == "missing" {
                prop_assert!(!model.contains_key(&e.key));
            }
            let prefix = format!("rpm-ostree deployment {}: ", e.key);
            prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn deployment_arbitrary_dicts_never_panic(entries in vec((field_key(), arb_v()), 0..8)) {
        let model: HashMap<String, V> = entries.into_iter().collect();
        check_deployment(&model)?;
    }

    #[test]
    fn deployment_valid_base_with_arbitrary_overrides(
        base in valid_base(),
        overrides in vec((field_key(), arb_v()), 0..3),
    ) {
        let mut model = base;
        model.extend(overrides);
        check_deployment(&model)?;
    }

    #[test]
    fn deployment_wrong_type_names_the_key(
        (base, i, v) in (valid_base(), 0..FIELDS.len(), arb_v())
            .prop_filter("a wrong-typed value", |(_, i, v)| !conforms(FIELDS[*i].1, v)),
    ) {
        let mut model = base;
        model.insert(FIELDS[i].0.to_string(), v);
        let e = Deployment::from_dict(&to_dict(&model))
            .err()
            .ok_or_else(|| fail(format!("accepted {model:?}")))?;
        prop_assert_eq!(e.key, FIELDS[i].0);
    }

    #[test]
    fn deployment_missing_required_key_is_named(base in valid_base(), i in 1usize..5) {
        let mut model = base;
        model.remove(FIELDS[i].0);
        let e = Deployment::from_dict(&to_dict(&model))
            .err()
            .ok_or_else(|| fail(format!("accepted {model:?}")))?;
        prop_assert_eq!(e.key, FIELDS[i].0);
        prop_assert_eq!(e.problem, "missing");
    }

    #[test]
    fn deployment_labels_are_the_string_labels(base in valid_base(), (json, want) in labels_json(), wrap in any::<bool>()) {
        let mut model = base;
        let cfg = if wrap { V::Variant(Box::new(V::Str(json))) } else { V::Str(json) };
        model.insert("base-commit-meta".into(), V::Dict(vec![(CONFIG_KEY.into(), cfg), ("version".into(), V::Str("x".into()))]));
        let d = Deployment::from_dict(&to_dict(&model)).map_err(|e| fail(e.to_string()))?;
        prop_assert_eq!(d.image_labels, want);
    }
}

// ---------------------------------------------------------------------------------------------
// config
// ---------------------------------------------------------------------------------------------

fn toml_basic(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if c.is_control() => o.push_str(&format!("\\u{:04X}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn toml_line() -> impl Strategy<Value = String> {
    let key = select(vec![
        "node-name",
        "kubeconfig",
        "host-root",
        "foo",
        "node_name",
        "\"node-name\"",
        "a.b",
        "",
        "é",
    ]);
    let eq = select(vec![" = ", "=", " ", " == "]);
    let val = select(vec![
        "\"a\"",
        "'b'",
        "1",
        "true",
        "[1, 2]",
        "{ a = 1 }",
        "\"unterminated",
        "\"\\x\"",
        "é€",
        "\"é€\"",
        "1979-05-27",
        "\"\"\"\nmulti\n\"\"\"",
        "inf",
        "",
    ]);
    prop_oneof![
        4 => (key, eq, val).prop_map(|(k, e, v)| format!("{k}{e}{v}")),
        1 => "[ -~é€\t]{0,20}",
        1 => select(vec!["[table]", "# comment", "[[x]]", "[node-name]"]).prop_map(String::from),
    ]
}

fn toml_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (vec(toml_line(), 0..6), select(vec!["\n", "\r\n"])).prop_map(|(l, e)| l.join(e)),
        1 => any::<String>(),
    ]
}

fn check_position(path: &Path, text: &str, e: &ConfigError) -> Result<(), TestCaseError> {
    let ConfigError::Invalid {
        path: p,
        line,
        column,
        message,
    } = e
    else {
        return Err(fail(format!("not an Invalid error: {e:?}")));
    };
    prop_assert_eq!(p.as_path(), path);
    let lines: Vec<&str> = text.split('\n').collect();
    prop_assert!(
        *line >= 1 && *line <= lines.len(),
        "line {} of {}",
        line,
        lines.len()
    );
    let width = lines[line - 1].chars().count();
    prop_assert!(
        *column >= 1 && *column <= width + 1,
        "column {} of {}",
        column,
        width
    );
    let msg = e.to_string();
    let prefix = format!("{}:{line}:{column}: ", path.display());
    prop_assert!(
        msg.starts_with(&prefix),
        "{:?} does not start with {:?}",
        msg,
        prefix
    );
    prop_assert!(!message.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn config_errors_point_inside_the_text(
        path in prop_oneof![Just("/etc/streamd/config.d/10-a.toml".to_string()), "[a-z/é ]{1,20}\\.toml"],
        text in toml_text(),
    ) {
        let path = PathBuf::from(path);
        if let Err(e) = parse_fragment(&path, &text) {
            check_position(&path, &text, &e)?;
        }
    }

    #[test]
    fn config_valid_fragments_round_trip(
        node in option::of(any::<String>()),
        kube in option::of("[ -~é]{0,30}"),
        root in option::of("/[a-z/]{0,10}"),
        order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        comment in any::<bool>(),
        eol in select(vec!["\n", "\r\n"]),
    ) {
        let mut lines = Vec::new();
        if comment {
            lines.push("# streamd drop-in".to_string());
        }
        for i in order {
            match i {
                0 => lines.extend(node.as_deref().map(|v| format!("node-name = {}", toml_basic(v)))),
                1 => lines.extend(kube.as_deref().map(|v| format!("kubeconfig = {}", toml_basic(v)))),
                _ => lines.extend(root.as_deref().map(|v| format!("host-root={}", toml_basic(v)))),
            }
        }
        let text = lines.join(eol);
        let got = parse_fragment(Path::new("a.toml"), &text).map_err(|e| fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(got.node_name, node);
        prop_assert_eq!(got.kubeconfig, kube.map(PathBuf::from));
        prop_assert_eq!(got.host_root, root.map(PathBuf::from));
    }

    #[test]
    fn config_unknown_key_is_named_at_its_line(
        known in vec(select(vec!["node-name = \"n\"", "kubeconfig = \"/k\"", "host-root = \"/\"", "# c", ""]), 0..4),
        // Keys are kebab-case: one with '_' is never a known key.
        unknown in "[a-z][a-z0-9]{0,5}_[a-z0-9_-]{0,5}",
        at in any::<Index>(),
    ) {
        let mut lines: Vec<String> = Vec::new();
        for l in known {
            // Each known key at most once: a duplicate would be the error instead.
            if l.contains('=') && lines.iter().any(|x| x == l) {
                continue;
            }
            lines.push(l.to_string());
        }
        let at = at.index(lines.len() + 1);
        lines.insert(at, format!("{unknown} = 1"));
        let text = lines.join("\n");
        let path = Path::new("/etc/streamd/config.d/50-x.toml");
        let e = parse_fragment(path, &text).err().ok_or_else(|| fail(format!("accepted {text:?}")))?;
        check_position(path, &text, &e)?;
        let ConfigError::Invalid { line, message, .. } = &e else { unreachable!() };
        prop_assert_eq!(*line, at + 1, "{}", e);
        prop_assert!(message.contains(&unknown), "{}", e);
    }
}

// ---------------------------------------------------------------------------------------------
// registry: extensions layer
// ---------------------------------------------------------------------------------------------

/// A scratch directory with an empty `dest` in it.
fn scratch() -> ScratchDir {
    let d = ScratchDir::new("fuzz-layer").expect("scratch dir");
    std::fs::create_dir_all(d.join("dest")).expect("scratch dir");
    d
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).expect("gzip");
    e.finish().expect("gzip")
}

#[derive(Debug, Clone)]
enum LayerItem {
    Rpm {
        dot: bool,
        sub: &'static str,
        nevra: String,
        data: Vec<u8>,
    },
    Other(&'static str),
}

fn layer_item() -> impl Strategy<Value = LayerItem> {
    prop_oneof![
        3 => (
            any::<bool>(),
            select(vec!["", "Packages/", "x86_64/"]),
            (pkg_name(), evr()).prop_map(|(n, e)| format!("{n}-{e}")),
            vec(any::<u8>(), 0..64),
        )
            .prop_map(|(dot, sub, nevra, data)| LayerItem::Rpm { dot, sub, nevra, data }),
        1 => select(vec![
            "usr/bin/true",
            "etc/pki/x.rpm",
            "usr/share/rpm-ostree/extensions/repodata/repomd.xml",
            "usr/share/rpm-ostree/extensionsX/a-1-1.x86_64.rpm",
            "usr/lib/a-1-1.x86_64.rpm",
        ])
        .prop_map(LayerItem::Other),
    ]
}

fn layer_tar(items: &[LayerItem]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for it in items {
        let (path, data): (String, &[u8]) = match it {
            LayerItem::Rpm {
                dot,
                sub,
                nevra,
                data,
            } => (
                format!(
                    "{}{EXTENSIONS_DIR}{sub}{nevra}.rpm",
                    if *dot { "./" } else { "" }
                ),
                data,
            ),
            LayerItem::Other(p) => (p.to_string(), b"x"),
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, data).expect("append");
    }
    b.into_inner().expect("tar")
}

#[derive(Debug, Clone)]
struct RawEntry {
    name: Vec<u8>,
    kind: u8,
    link: Vec<u8>,
    data: Vec<u8>,
}

/// A tar archive written byte by byte, so names may hold `..`, absolute paths or anything.
fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_gnu();
        {
            let g = h.as_gnu_mut().expect("gnu header");
            let n = e.name.len().min(100);
            g.name[..n].copy_from_slice(&e.name[..n]);
            let l = e.link.len().min(100);
            g.linkname[..l].copy_from_slice(&e.link[..l]);
        }
        h.set_entry_type(tar::EntryType::new(e.kind));
        h.set_size(e.data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&e.data);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn pax_path(path: &[u8]) -> Vec<u8> {
    // "<len> path=<value>\n" where <len> counts the whole record, itself included.
    let body_len = " path=".len() + path.len() + 1;
    let mut len = body_len + 1;
    while len.to_string().len() + body_len != len {
        len = len.to_string().len() + body_len;
    }
    let mut r = format!("{len} path=").into_bytes();
    r.extend_from_slice(path);
    r.push(b'\n');
    r
}

fn hostile_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (
            select(vec!["", "./", "/", "../", "././"]),
            select(vec!["", "../", "../../", "x/../../", "./", "..//", "/", "../../../../../"]),
            "[a-z0-9.-]{0,12}",
        )
            .prop_map(|(p, s, f)| format!("{p}{EXTENSIONS_DIR}{s}{f}.rpm").into_bytes()),
        1 => select(vec![
            "../escape.rpm",
            "/tmp/escape.rpm",
            "usr/share/rpm-ostree/extensions/..",
            "usr/share/rpm-ostree/extensions/../../../../../../escape.rpm",
            "usr/share/rpm-ostree/extensions/.rpm",
            "usr/share/rpm-ostree/extensions/..rpm",
            "usr/share/rpm-ostree/extensions/",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => vec(any::<u8>(), 0..100),
        1 => vec(any::<u8>(), 0..60).prop_map(|tail| {
            let mut n = EXTENSIONS_DIR.as_bytes().to_vec();
            n.extend(tail);
            n
        }),
    ]
}

fn hostile_entry() -> impl Strategy<Value = RawEntry> {
    (
        hostile_name(),
        select(vec![
            b'0', b'0', b'0', b'5', b'2', b'1', b'L', b'x', b'g', b'7',
        ]),
        prop_oneof![
            Just(b"/etc/passwd".to_vec()),
            "[a-z./]{0,20}".prop_map(String::into_bytes)
        ],
        vec(any::<u8>(), 0..64),
    )
        .prop_map(|(name, kind, link, data)| {
            let data = match kind {
                // GNU long name / pax record: the hostile name is the payload.
                b'L' => name.clone(),
                b'x' => pax_path(&name),
                b'5' | b'2' | b'1' => Vec::new(),
                _ => data,
            };
            let name = if kind == b'L' {
                b"././@LongLink".to_vec()
            } else {
                name
            };
            RawEntry {
                name,
                kind,
                link,
                data,
            }
        })
}

/// The RPM name a layer path would yield, so it can be listed as wanted.
fn candidate_nevra(name: &[u8]) -> String {
    let s = String::from_utf8_lossy(name);
    let file = s.rsplit('/').next().unwrap_or_default();
    file.trim_end_matches(".rpm").to_string()
}

type LayerResult = std::io::Result<streamd::image::registry::LayerRpms>;

/// Runs `rpms_in_layer` in a scratch directory and checks that nothing landed outside `dest`
/// and that `dest` holds only the regular `*.rpm` files it reported; returns the result and what
/// `dest` held (file name → content).
fn run_layer(
    blob: &[u8],
    media_type: &str,
    wanted: &[String],
) -> Result<(LayerResult, BTreeMap<String, Vec<u8>>), TestCaseError> {
    let root = scratch();
    let dest = root.join("dest");
    let res = rpms_in_layer(
        blob,
        media_type,
        wanted,
        Some(&dest),
        &mut ExtractBudget::new(EXTRACT_LIMITS),
    );
    let outside: Vec<_> = std::fs::read_dir(&root)
        .expect("read root")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != "dest")
        .collect();
    let mut in_dest = BTreeMap::new();
    let mut bad = Vec::new();
    for e in std::fs::read_dir(&dest).expect("read dest") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        let meta = std::fs::symlink_metadata(e.path()).expect("metadata");
        if !meta.file_type().is_file() || !name.ends_with(".rpm") {
            bad.push(e.path());
        } else {
            in_dest.insert(name, std::fs::read(e.path()).expect("read extracted file"));
        }
    }
    prop_assert!(outside.is_empty(), "escaped dest: {:?}", outside);
    prop_assert!(bad.is_empty(), "not regular *.rpm files: {:?}", bad);
    if let Ok((_, files, _)) = &res {
        for f in files {
            prop_assert_eq!(f.parent(), Some(dest.as_path()));
        }
        let reported: BTreeSet<String> = files
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        prop_assert_eq!(&reported, &in_dest.keys().cloned().collect::<BTreeSet<_>>());
    }
    Ok((res, in_dest))
}

const MEDIA_TYPES: [&str; 4] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
];

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn layer_lists_and_extracts_the_extensions_rpms(
        items in vec(layer_item(), 0..6),
        extra_wanted in vec(pkg_name(), 0..2),
        pick in vec(any::<bool>(), 6),
        gz in any::<bool>(),
    ) {
        let tar = layer_tar(&items);
        let (blob, media) = if gz { (gzip(&tar), MEDIA_TYPES[1]) } else { (tar, MEDIA_TYPES[0]) };
        let rpms: Vec<(&String, &Vec<u8>)> = items
            .iter()
            .filter_map(|i| match i {
                LayerItem::Rpm { nevra, data, .. } => Some((nevra, data)),
                LayerItem::Other(_) => None,
            })
            .collect();
        let mut wanted = extra_wanted;
        for ((nevra, _), p) in rpms.iter().zip(&pick) {
            if *p {
                wanted.push(package_name(nevra).to_string());
            }
        }
        let (res, extracted) = run_layer(&blob, media, &wanted)?;
        let (names, _, _) = res.map_err(|e| fail(e.to_string()))?;
        prop_assert_eq!(names, rpms.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>());
        // Last one of a name wins, as a later layer entry overwrites an earlier one.
        let mut want_files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (nevra, data) in &rpms {
            if wanted.iter().any(|w| names_package(nevra, w)) {
                want_files.insert(format!("{nevra}.rpm"), data.to_vec());
            }
        }
        prop_assert_eq!(extracted, want_files);
    }

    #[test]
    fn layer_hostile_archives_never_escape(
        entries in vec(hostile_entry(), 0..6),
        extra_wanted in vec(prop_oneof![pkg_name(), Just(String::new())], 0..2),
        media in select(MEDIA_TYPES.to_vec()),
        gz in any::<bool>(),
    ) {
        let tar = raw_tar(&entries);
        let blob = if gz { gzip(&tar) } else { tar };
        let mut wanted = extra_wanted;
        wanted.extend(entries.iter().map(|e| candidate_nevra(&e.name)));
        let _ = run_layer(&blob, media, &wanted)?;
    }

    #[test]
    fn layer_corrupted_archives_never_panic(
        items in vec(layer_item(), 1..5),
        flips in vec((any::<Index>(), any::<u8>()), 1..8),
        fix_checksum in any::<bool>(),
        gz_before in any::<bool>(),
        media in select(MEDIA_TYPES.to_vec()),
    ) {
        let tar = layer_tar(&items);
        let mut blob = if gz_before { gzip(&tar) } else { tar };
        for (i, b) in &flips {
            let at = i.index(blob.len());
            blob[at] = *b;
        }
        if fix_checksum && !gz_before && blob.len() >= 512 {
            let mut h = tar::Header::new_old();
            h.as_mut_bytes().copy_from_slice(&blob[..512]);
            h.set_cksum();
            blob[..512].copy_from_slice(h.as_bytes());
        }
        let wanted: Vec<String> = items
            .iter()
            .filter_map(|i| match i {
                LayerItem::Rpm { nevra, .. } => Some(package_name(nevra).to_string()),
                LayerItem::Other(_) => None,
            })
            .collect();
        let _ = run_layer(&blob, media, &wanted)?;
    }

    #[test]
    fn layer_arbitrary_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..2048),
        gzip_magic in any::<bool>(),
        media in select(MEDIA_TYPES.to_vec()),
    ) {
        let mut blob = bytes;
        if gzip_magic {
            blob.splice(0..0, [0x1f, 0x8b, 0x08, 0x00]);
        }
        let _ = run_layer(&blob, media, &["kernel-rt-core".to_string()])?;
    }
}

// ---- bootc status, the attempt record, stream resolution -------------------------------------

/// A well-formed `bootc status --format=json` document (the shape of bootc-dev/bootc:crates/lib/src/spec.rs `Host`)
/// with the given entries (`None`: null).
fn bootc_doc(staged: Option<&str>, booted: Option<&str>) -> String {
    let entry = |digest: &str| {
        format!(
            r#"{{"image":{{"image":{{"image":"q.io/a/b@{digest}","transport":"registry"}},"version":"1","timestamp":null,"imageDigest":"{digest}","architecture":"amd64"}},"cachedUpdate":null,"incompatible":false,"pinned":false,"softRebootCapable":false,"downloadOnly":false,"store":"ostreeContainer","ostree":{{"stateroot":"rhcos","checksum":"{}","deploySerial":0}}}}"#,
            "c".repeat(64)
        )
    };
    let or_null = |d: Option<&str>| d.map_or_else(|| "null".to_string(), entry);
    format!(
        r#"{{"apiVersion":"org.containers.bootc/v1","kind":"BootcHost","metadata":{{"name":"host"}},"spec":{{"image":null,"bootOrder":"default"}},"status":{{"staged":{},"booted":{},"rollback":null,"rollbackQueued":false,"type":"bootcHost"}}}}"#,
        or_null(staged),
        or_null(booted)
    )
}

fn sha() -> impl Strategy<Value = String> {
    hex64().prop_map(|h| format!("sha256:{h}"))
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn bootc_status_never_panics_and_keeps_one_booted(
        staged in option::of(sha()),
        booted in option::of(sha()),
        edits in vec(edit(), 0..4),
    ) {
        let doc = bootc_doc(staged.as_deref(), booted.as_deref());
        // A host not booted through ostree (booted: null) is refused, never guessed at.
        if booted.is_none() {
            prop_assert!(streamd::backend::bootc::parse_status(&doc).is_err());
            return Ok(());
        }
        // Unmutated: parsed exactly as the model says.
        match streamd::backend::bootc::parse_status(&doc) {
            Ok(deps) => {
                prop_assert_eq!(deps.iter().filter(|d| d.booted).count(), usize::from(booted.is_some()));
                prop_assert_eq!(deps.iter().filter(|d| d.staged).count(), usize::from(staged.is_some()));
                if let Some(b) = &booted {
                    let d = deps.iter().find(|d| d.booted).ok_or_else(|| fail("no booted".into()))?;
                    prop_assert_eq!(d.container_image_reference_digest.as_deref(), Some(b.as_str()));
                }
            }
            Err(e) => return Err(fail(format!("a well-formed document was refused: {e}\n{doc}"))),
        }
        // Mutated: any answer but a panic; an error is one clear line.
        if let Err(e) = streamd::backend::bootc::parse_status(&apply_edits(&doc, &edits)) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn attempt_record_never_panics_and_names_its_file(
        text in prop_oneof![
            any::<String>(),
            mutated(Just(r#"{"version":1,"staged":null,"attempt":{"request":"r","osImage":"i","digest":"d","bootId":"b","attempts":1,"reportedBoot":null}}"#.to_string())),
        ],
    ) {
        let dir = ScratchDir::new("fuzz-attempt").map_err(|e| fail(e.to_string()))?;
        let store = streamd::host::attempt::Store::new(dir.path());
        std::fs::write(store.path(), &text).map_err(|e| fail(e.to_string()))?;
        let loaded = store.load();
        match loaded {
            // Read forward-compatibly: any layout from version 1 on loads as it was written.
            Ok(r) => prop_assert!(r.version >= 1, "version {}", r.version),
            Err(e) => prop_assert!(e.to_string().contains(streamd::host::attempt::FILE_NAME), "{}", e),
        }
    }

    #[test]
    fn stream_resolution_fills_in_only_a_stream_only_request(
        i in inputs(),
        names in vec(stream_like(), 0..4),
        images in vec(image_like(), 0..4),
    ) {
        use streamd::cluster::streams::{Catalog, StreamImages, resolve};
        let entries: Vec<StreamImages> = names
            .iter()
            .zip(images.iter().chain(std::iter::repeat(&String::new())))
            .map(|(n, img)| StreamImages {
                name: n.clone(),
                os_image: img.clone(),
                os_extensions_image: String::new(),
                written_by: None,
            })
            .collect();
        let catalog = Catalog::Available(entries.clone());
        let stream_only = i.stream.is_some() && i.os_image.is_none() && i.extensions_image.is_none();
        match resolve(&i, Some(&catalog)) {
            Ok(out) if !stream_only => prop_assert_eq!(out, i),
            Ok(out) => {
                let entry = entries
                    .iter()
                    .find(|e| Some(&e.name) == i.stream.as_ref())
                    .ok_or_else(|| fail("resolved a stream the catalog lacks".into()))?;
                prop_assert_eq!(out.os_image.as_ref(), Some(&entry.os_image));
                prop_assert!(ref_image(&entry.os_image), "only valid images are taken");
                prop_assert_eq!(out.reboot_approved, i.reboot_approved);
            }
            Err(e) => {
                prop_assert!(stream_only, "only stream-only requests are resolved");
                prop_assert!(one_line(&e.to_string()));
            }
        }
    }
}
