//! House rules the compiler does not see on its own (issue 22 §3, §5, §6): every crate root opts
//! in to the lints, no error that is only text crosses a module boundary in `src/`, and scratch
//! directories come from one helper.

use std::path::{Path, PathBuf};

mod source;

use source::{Tok, code_only, rust_files, tokens};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---- Lints as policy ------------------------------------------------------------------------

/// The crate roots below `dir` (`src`, `rollout/src`, `testbed/src`): `lib.rs`, `main.rs`,
/// `bin/*.rs` and `bin/*/main.rs`.
fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.is_file())
        .collect();
    if let Ok(bins) = std::fs::read_dir(dir.join("bin")) {
        for e in bins.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") {
                roots.push(p);
            } else if p.join("main.rs").is_file() {
                roots.push(p.join("main.rs"));
            }
        }
    }
    roots.sort();
    roots
}

/// The inner attributes of a crate root, without spaces (`#![forbid(unsafe_code)]`).
fn inner_attributes(text: &str) -> Vec<String> {
    code_only(text)
        .lines()
        .map(|l| l.split_whitespace().collect::<String>())
        .filter(|l| l.starts_with("#!["))
        .collect()
}

/// What a crate root must say: every root forbids `unsafe`; the product's roots (`src/`,
/// `rollout/src`) hold functions to clippy.toml's threshold. A root that lacks one is named.
fn missing_attributes(name: &str, text: &str, product: bool) -> Vec<String> {
    let attrs = inner_attributes(text);
    let mut wanted = vec!["#![forbid(unsafe_code)]"];
    if product {
        wanted.push("#![warn(clippy::too_many_lines)]");
    }
    wanted
        .into_iter()
        .filter(|w| {
            let deny = w.replace("warn(", "deny(");
            !attrs.iter().any(|a| a == w || *a == deny)
        })
        .map(|w| format!("{name}: no {w}"))
        .collect()
}

#[test]
fn every_crate_root_opts_in_to_the_lints() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (dir, product) in [("src", true), ("rollout/src", true), ("testbed/src", false)] {
        for f in crate_roots(&root().join(dir)) {
            let text = std::fs::read_to_string(&f).expect("read crate root");
            let name = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            wrong.extend(missing_attributes(&name, &text, product));
            seen += 1;
        }
    }
    assert!(seen >= 7, "read the crate roots: {seen}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_workspace_lints_are_the_house_rules() {
    let read = |f: &str| std::fs::read_to_string(root().join(f)).expect("read manifest");
    let manifest: toml::Table = read("Cargo.toml").parse().expect("Cargo.toml");
    let lints = &manifest["workspace"]["lints"];
    for (table, lint, level) in [
        ("rust", "unsafe_code", "deny"),
        ("rust", "unused_must_use", "forbid"),
        ("rust", "missing_docs", "warn"),
        ("rust", "missing_debug_implementations", "warn"),
        ("clippy", "dbg_macro", "deny"),
        ("clippy", "todo", "deny"),
    ] {
        assert_eq!(
            lints[table].get(lint).and_then(|v| v.as_str()),
            Some(level),
            "[workspace.lints.{table}] {lint}"
        );
    }
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("members");
    for m in members {
        let dir = m.as_str().expect("member");
        let member: toml::Table = read(&format!("{dir}/Cargo.toml")).parse().expect("member");
        assert_eq!(
            member
                .get("lints")
                .and_then(|l| l.get("workspace"))
                .and_then(|w| w.as_bool()),
            Some(true),
            "{dir}/Cargo.toml: [lints] workspace = true"
        );
    }
    let clippy: toml::Table = read("clippy.toml").parse().expect("clippy.toml");
    assert_eq!(
        clippy
            .get("too-many-lines-threshold")
            .and_then(|v| v.as_integer()),
        Some(100)
    );
}

/// Where `text` lets a function off clippy's line limit (`allow`/`expect` of
/// `too_many_lines`, alone or among other lints), by line.
fn let_off_the_line_limit(text: &str) -> Vec<usize> {
    code_only(text)
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            let l: String = l.split_whitespace().collect();
            (l.starts_with("#[allow(") || l.starts_with("#[expect(") || l.starts_with("#![allow("))
                && l.contains("too_many_lines")
        })
        .map(|(n, _)| n + 1)
        .collect()
}

/// The lint holds for every function of `src/` and `rollout/src`, their tests included: a
/// long table is split into groups, not let off.
#[test]
fn no_function_is_let_off_the_line_limit() {
    let mut found = Vec::new();
    for dir in ["src", "rollout/src"] {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        files.sort();
        assert!(files.len() > 10, "read {dir}");
        for f in &files {
            let text = std::fs::read_to_string(f).expect("read source");
            for line in let_off_the_line_limit(&text) {
                found.push(format!(
                    "{}:{line}",
                    f.strip_prefix(root()).unwrap_or(f).display()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "functions over clippy.toml's threshold are split, not allowed:\n{}",
        found.join("\n")
    );
    assert_eq!(
        let_off_the_line_limit(
            "// #[allow(clippy::too_many_lines)]\n#[allow(dead_code, clippy::too_many_lines)] // a table\n\
             #[expect( clippy::too_many_lines )]\nfn f() {}\n"
        ),
        [2, 3]
    );
}

#[test]
fn a_root_without_the_attributes_is_named() {
    let full =
        "//! x\n\n#![forbid( unsafe_code )]\n#![deny(clippy::too_many_lines)]\nfn main() {}\n";
    assert!(missing_attributes("a.rs", full, true).is_empty());
    let commented = "// #![forbid(unsafe_code)]\n#![warn(clippy::too_many_lines)]\n";
    assert_eq!(
        missing_attributes("b.rs", commented, true),
        ["b.rs: no #![forbid(unsafe_code)]"]
    );
    assert!(missing_attributes("c.rs", "#![forbid(unsafe_code)]\n", false).is_empty());
    assert_eq!(
        missing_attributes("c.rs", "#![forbid(unsafe_code)]\n", true),
        ["c.rs: no #![warn(clippy::too_many_lines)]"]
    );
}

// ---- No text for an error across a module boundary -----------------------------------------

/// Whether `toks` spell a text type: `String`, `&str`, `&'static str`, `Box<str>`.
fn is_text(toks: &[Tok]) -> bool {
    let s: String = toks
        .iter()
        .map(|t| match t {
            Tok::Ident(i) => i.clone(),
            Tok::Sep => "::".into(),
            Tok::Punct(c) => c.to_string(),
        })
        .collect();
    matches!(
        s.trim_start_matches("std::string::"),
        "String" | "&str" | "&'staticstr" | "Box<str>"
    )
}

/// The index of the token closing the bracket opened at `open` (`(`, `[`, `{` or `<`).
fn closing(toks: &[(usize, Tok)], open: usize) -> usize {
    let mut depth = 0i32;
    for (i, (_, t)) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('(' | '[' | '{' | '<') => depth += 1,
            // `->` is no closing angle bracket.
            Tok::Punct('>') if i > 0 && toks[i - 1].1 == Tok::Punct('-') => {}
            Tok::Punct(')' | ']' | '}' | '>') => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return i;
        }
    }
    toks.len()
}

/// The index after the item starting at `i`: its `;`, or the `}` closing its body.
fn item_end(toks: &[(usize, Tok)], mut i: usize) -> usize {
    while i < toks.len() {
        match toks[i].1 {
            Tok::Punct(';') => return i + 1,
            Tok::Punct('{') => return closing(toks, i) + 1,
            Tok::Punct('(' | '[') => i = closing(toks, i) + 1,
            _ => i += 1,
        }
    }
    i
}

/// The `Result<_, E>` in `toks[from..to]` whose `E` is text, by line.
fn text_results(toks: &[(usize, Tok)], from: usize, to: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = from;
    while i + 1 < to {
        if toks[i].1 == Tok::Ident("Result".into()) && toks[i + 1].1 == Tok::Punct('<') {
            let close = closing(toks, i + 1);
            // The arguments, split at the commas of this level.
            let mut args: Vec<Vec<Tok>> = vec![Vec::new()];
            let mut depth = 0;
            for (j, (_, t)) in toks.iter().enumerate().take(close).skip(i + 2) {
                match t {
                    Tok::Punct('>') if toks[j - 1].1 == Tok::Punct('-') => {}
                    Tok::Punct('(' | '[' | '<') => depth += 1,
                    Tok::Punct(')' | ']' | '>') => depth -= 1,
                    Tok::Punct(',') if depth == 0 => {
                        args.push(Vec::new());
                        continue;
                    }
                    _ => {}
                }
                if let Some(a) = args.last_mut() {
                    a.push(t.clone());
                }
            }
            if args.len() == 2 && is_text(&args[1]) {
                out.push(toks[i].0);
            }
        }
        i += 1;
    }
    out
}

/// Whether the tokens at `i` are `#[cfg(test)]`.
fn is_cfg_test(toks: &[(usize, Tok)], i: usize) -> bool {
    let want = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    toks.len() >= i + want.len() && toks[i..i + want.len()].iter().map(|(_, t)| t).eq(&want)
}

/// The names of the types in `toks` that serde builds with `#[serde(try_from = …)]`: their
/// `TryFrom` error is text made for serde's message, which is where it is reported.
fn serde_try_from_types(toks: &[(usize, Tok)]) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..toks.len().saturating_sub(2) {
        let attr = toks[i].1 == Tok::Ident("serde".into())
            && toks[i + 1].1 == Tok::Punct('(')
            && toks[i + 2].1 == Tok::Ident("try_from".into());
        if !attr {
            continue;
        }
        let kind = toks[i..]
            .iter()
            .position(|(_, t)| matches!(t, Tok::Ident(k) if k == "struct" || k == "enum"));
        if let Some(Tok::Ident(name)) = kind.and_then(|k| toks.get(i + k + 1)).map(|(_, t)| t) {
            out.push(name.clone());
        }
    }
    out
}

/// Where `text` lets an error that is only text out of its module: a `Result<_, String>` (or
/// `&str`) in a visible (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`) function's signature,
/// struct, enum, trait, type alias, const or static; a `type Err`/`type Error` that is text in
/// an impl (`FromStr`, `TryFrom`: another module calls `parse`), unless serde is the caller.
/// `#[cfg(test)]` items are not read.
fn text_errors(text: &str) -> Vec<(usize, String)> {
    let toks = tokens(&code_only(text));
    let serde_types = serde_try_from_types(&toks);
    let ident = |i: usize| match toks.get(i).map(|(_, t)| t) {
        Some(Tok::Ident(s)) => s.as_str(),
        _ => "",
    };
    let mut out = Vec::new();
    let mut impl_for = String::new();
    let mut i = 0;
    while i < toks.len() {
        if is_cfg_test(&toks, i) {
            i = item_end(&toks, i + 7);
            continue;
        }
        match ident(i) {
            "impl" => {
                let body = (i..toks.len())
                    .find(|&j| toks[j].1 == Tok::Punct('{'))
                    .unwrap_or(toks.len());
                let header: Vec<&str> = (i..body).map(ident).collect();
                let try_from = header.contains(&"TryFrom");
                impl_for = match header.iter().position(|h| *h == "for") {
                    Some(f) if try_from => header.get(f + 1).unwrap_or(&"").to_string(),
                    _ => String::new(),
                };
            }
            "type" if matches!(ident(i + 1), "Err" | "Error") => {
                let end = item_end(&toks, i);
                let value: Vec<Tok> = toks[i + 3..end - 1]
                    .iter()
                    .map(|(_, t)| t.clone())
                    .collect();
                if is_text(&value) && !serde_types.contains(&impl_for) {
                    out.push((toks[i].0, format!("type {} is text", ident(i + 1))));
                }
                i = end;
                continue;
            }
            "pub" => {
                let mut k = i + 1;
                if toks.get(k).is_some_and(|(_, t)| *t == Tok::Punct('(')) {
                    k = closing(&toks, k) + 1;
                }
                loop {
                    match ident(k) {
                        "async" | "unsafe" | "extern" => k += 1,
                        "const" if matches!(ident(k + 1), "fn" | "async" | "unsafe") => k += 1,
                        _ => break,
                    }
                }
                let kind = ident(k);
                let end = match kind {
                    "fn" => (k..toks.len())
                        .find(|&j| matches!(toks[j].1, Tok::Punct('{' | ';')))
                        .unwrap_or(toks.len()),
                    "struct" | "enum" | "union" | "trait" | "type" | "const" | "static" => {
                        item_end(&toks, k)
                    }
                    _ => k,
                };
                for line in text_results(&toks, k, end) {
                    out.push((line, format!("{kind} {}", ident(k + 1))));
                }
                if kind != "fn" {
                    i = end.max(i + 1);
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A file of tests or test fixtures (declared `#[cfg(test)]` by its parent): `tests.rs`,
/// `tests_*.rs`, `*_tests.rs`, and whatever is below a `tests` or `fixtures` directory or is
/// a `fixtures.rs`.
fn is_test_file(rel: &Path) -> bool {
    let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    stem.starts_with("tests")
        || stem.ends_with("_tests")
        || stem == "fixtures"
        || rel.parent().is_some_and(|p| {
            p.components()
                .any(|c| matches!(c.as_os_str().to_str(), Some("tests" | "fixtures")))
        })
}

#[test]
fn no_error_that_is_only_text_leaves_its_module() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 50, "read src: {}", files.len());
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root()).unwrap_or(f);
        if is_test_file(rel) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read source");
        for (line, what) in text_errors(&text) {
            found.push(format!("{}:{line}: {what}", rel.display()));
        }
    }
    assert!(
        found.is_empty(),
        "an error another module gets is a typed one (thiserror; text is made where it is reported):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_text_error_rule_on_made_up_source() {
    let text = "\
pub fn a() -> Result<(), String> { let x: Result<(), String> = Ok(()); x }
fn private() -> Result<u8, String> { Ok(1) }
pub(crate) fn b(f: impl Fn() -> Result<u8, &'static str>) {}
pub(in crate::agent) enum E {
    V { r: Option<Result<Box<u8>, String>> },
    W(Result<u8, Error>),
}
pub struct S(pub Result<Vec<String>, std::string::String>);
pub type T = std::io::Result<String>;
pub async fn c() -> Result<String, Error> { todo() }
// pub fn d() -> Result<(), String>
pub fn e() -> &'static str { \"Result<(), String>\" }
impl FromStr for State { type Err = String; fn from_str(s: &str) -> Result<Self, Self::Err> {} }
#[serde(try_from = \"String\")]
pub struct Host(String);
impl TryFrom<String> for Host { type Error = &'static str; }
impl TryFrom<u8> for Other { type Error = String; }
#[cfg(test)]
pub fn helper() -> Result<(), String> { Ok(()) }
#[cfg(test)]
mod tests { pub fn g() -> Result<(), String> {} }
";
    assert_eq!(
        text_errors(text),
        [
            (1, "fn a".to_string()),
            (3, "fn b".to_string()),
            (5, "enum E".to_string()),
            (8, "struct S".to_string()),
            (13, "type Err is text".to_string()),
            (17, "type Error is text".to_string()),
        ]
    );
    assert!(is_test_file(Path::new("src/agent/core/tests_effects.rs")));
    assert!(is_test_file(Path::new("src/agent/planner/tests/rows.rs")));
    assert!(is_test_file(Path::new(
        "src/agent/preflight/release_tests.rs"
    )));
    assert!(!is_test_file(Path::new("src/agent/core.rs")));
}

// ---- One scratch-directory helper -----------------------------------------------------------

/// Every test's scratch directory is a `testbed::scratch::ScratchDir`: short enough for the
/// sockets put in it, fresh, removed after a passing test and kept after a failing one. No other
/// file of the workspace's crates or tests asks for the temporary directory itself.
#[test]
fn scratch_directories_come_from_one_helper() {
    let helper = Path::new("testbed/src/scratch.rs");
    let mut found = Vec::new();
    for dir in [
        "src",
        "tests",
        "rollout/src",
        "rollout/tests",
        "testbed/src",
        "testbed/tests",
    ] {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for f in &files {
            let rel = f.strip_prefix(root()).unwrap_or(f);
            if rel == helper {
                continue;
            }
            let code = code_only(&std::fs::read_to_string(f).expect("read source"));
            for (n, line) in code.lines().enumerate() {
                let asks = line.contains("env::temp_dir")
                    || (line.contains("env::{") && line.contains("temp_dir"))
                    || line.contains("tempfile::");
                if asks {
                    found.push(format!("{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "use testbed::scratch::ScratchDir for a scratch directory:\n{}",
        found.join("\n")
    );
}
