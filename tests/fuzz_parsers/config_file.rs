//! Property tests of the configuration file parser and its error positions.

use std::path::{Path, PathBuf};

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;

use streamd::config::{ConfigError, parse_fragment};

use super::{config, fail};

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
