//! Property tests of the pull-secret parser: malformed secrets never leak a password.

use base64::Engine as _;
use proptest::prelude::*;
use proptest::sample::{Index, select};

use streamd::image::pullsecret::{Credentials, PullSecret};

use super::{config, fail};

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
