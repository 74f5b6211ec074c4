//! Reading Rust source without a parser, for the tests that hold the tree to its rules
//! (tests/layout.rs, tests/house_rules.rs): comments and literals blanked, tokens, the paths a
//! file uses.

#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, into `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Rust source reduced to its code: comments and the insides of string and char literals become
/// spaces (newlines kept, so line numbers still hold), so a path in a doc comment or a message
/// is no dependency.
pub fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&c, i) {
            // r"…", r#"…"#, br"…": no escapes; ends at the quote and as many #.
            let open = c[i..].iter().position(|&ch| ch == '"').unwrap_or(0) + 1;
            for _ in 0..open {
                out.push(' ');
            }
            i += open;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' || (c[i] == '\'' && is_char_literal(&c, i)) {
            let quote = c[i];
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != quote {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The number of `#` of a raw string literal starting at `i`, if one does.
pub fn raw_string_start(c: &[char], i: usize) -> Option<usize> {
    let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
    if ident_before {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    (c.get(j + hashes) == Some(&'"')).then_some(hashes)
}

/// Whether the `'` at `i` opens a char literal (`'a'`, `'\n'`), not a lifetime (`'a`).
pub fn is_char_literal(c: &[char], i: usize) -> bool {
    match c.get(i + 1) {
        Some('\\') => true,
        Some(_) => c.get(i + 2) == Some(&'\''),
        None => false,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `code` (from [`code_only`]) that paths are made of, with their line numbers.
pub fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let c: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < c.len() {
            if c[i].is_alphabetic() || c[i] == '_' {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                out.push((n + 1, Tok::Ident(c[start..i].iter().collect())));
            } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
                out.push((n + 1, Tok::Sep));
                i += 2;
            } else {
                if !c[i].is_whitespace() {
                    out.push((n + 1, Tok::Punct(c[i])));
                }
                i += 1;
            }
        }
    }
    out
}

/// One path a file uses: where, the inline modules it sits in, and its segments with use trees
/// expanded (`a::{b, c::d}` is `a::b` and `a::c::d`; `self` in a tree is dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathUse {
    pub line: usize,
    pub inline: Vec<String>,
    pub segments: Vec<String>,
}

/// Every path in `text` that starts with one of `roots` (`crate`, `super`, an extern crate).
pub fn path_uses(text: &str, roots: &[&str]) -> Vec<PathUse> {
    let toks = tokens(&code_only(text));
    let is = |i: usize, t: &Tok| toks.get(i).is_some_and(|(_, x)| x == t);
    let mut out = Vec::new();
    // Inline modules (`mod tests { … }`) with the brace depth their body opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].1 {
            Tok::Ident(m) if m == "mod" => {
                if let (Some((_, Tok::Ident(name))), true) =
                    (toks.get(i + 1), is(i + 2, &Tok::Punct('{')))
                {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(root)
                if roots.contains(&root.as_str())
                    && is(i + 1, &Tok::Sep)
                    && !continues(&toks, i) =>
            {
                let mut found = Vec::new();
                let line = toks[i].0;
                i = use_tree(&toks, i, Vec::new(), &mut found);
                let names: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                out.extend(found.into_iter().map(|segments| PathUse {
                    line,
                    inline: names.clone(),
                    segments,
                }));
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether the token at `i` continues a longer path (`a::crate`), rather than starting one
/// (`use ::streamd::x` starts one).
pub fn continues(toks: &[(usize, Tok)], i: usize) -> bool {
    if i == 0 || toks[i - 1].1 != Tok::Sep {
        return false;
    }
    match i.checked_sub(2).map(|j| &toks[j].1) {
        Some(Tok::Ident(s)) => s != "use",
        Some(Tok::Punct(c)) => matches!(c, '>' | ')'),
        _ => false,
    }
}

/// Reads the path or use tree at `i` below `prefix` into `out`; the index after it.
pub fn use_tree(
    toks: &[(usize, Tok)],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match toks.get(i).map(|(_, t)| t) {
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < toks.len() && toks[i].1 != Tok::Punct('}') {
                    i = use_tree(toks, i, prefix.clone(), out);
                    if toks.get(i).is_some_and(|(_, t)| *t == Tok::Punct(',')) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            Some(Tok::Ident(s)) => {
                if s != "self" {
                    prefix.push(s.clone());
                }
                i += 1;
                if toks.get(i).is_some_and(|(_, t)| *t == Tok::Sep) {
                    i += 1;
                    continue;
                }
                if toks
                    .get(i)
                    .is_some_and(|(_, t)| *t == Tok::Ident("as".into()))
                {
                    i += 2;
                }
                out.push(prefix);
                return i;
            }
            // `*`, or the `<` of a turbofish: the path so far.
            _ => {
                out.push(prefix);
                return i;
            }
        }
    }
}
