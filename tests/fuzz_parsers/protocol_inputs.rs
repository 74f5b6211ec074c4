//! Property tests of the cluster protocol inputs and image references.

use proptest::prelude::*;
use proptest::sample::Index;

use streamd::cluster::protocol::{self, INPUT_KEYS, Inputs, MAX_REASON_CHARS, validate_stream};
use streamd::image::reference::{ImageRef, MAX_LEN};
use streamd::text::{one_line_reason, quote};

use super::{
    config, fail, image_like, inputs, one_line, ref_image, ref_subdomain, ref_token, stream_like,
    valid_image,
};

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
