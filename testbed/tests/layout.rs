//! The testbed's source tree shows its architecture (docs/testbed.md, "Where things are"): a
//! group uses only the groups before it in [`ORDER`], and of streamd only the node annotation
//! protocol. A `crate::<group>` or `streamd::` path that breaks this fails here with the file
//! and line; comments may name anything.

use std::path::{Path, PathBuf};

/// The groups of `testbed/src`, each allowed to use only those of a lower rank (and itself).
const ORDER: [(&str, u8); 7] = [
    ("control", 0),
    ("scratch", 0),
    ("loopback", 0),
    ("fixtures", 1),
    ("fakes", 2),
    ("harness", 3),
    ("bench", 4),
];

/// The one module of the product the testbed may use.
const STREAMD_ALLOWED: &str = "streamd::cluster::protocol";

fn rank(group: &str) -> Option<u8> {
    ORDER.iter().find(|(g, _)| *g == group).map(|(_, r)| *r)
}

fn allowed(from: &str, to: &str) -> bool {
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) => t < f || from == to,
        _ => false,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the tree").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The group a file under `src/` belongs to (`None` for `lib.rs` and `main.rs`).
fn group_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    match first.as_os_str().to_str()? {
        "lib.rs" | "main.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// What each line of `text` outside comments uses: `crate::<name>` as `("crate", name)` and
/// each `streamd::…` path as `("streamd", path)`, with the line number.
fn uses(text: &str) -> Vec<(usize, &'static str, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // Comments may name anything (a string holding `//` only hides what follows it).
        let line = line.split("//").next().unwrap_or_default();
        for (kind, prefix) in [("crate", "crate::"), ("streamd", "streamd::")] {
            for (i, _) in line.match_indices(prefix) {
                // `streamd::` must be the path's start, not the tail of another name.
                let before = line[..i].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let tail = &line[i + prefix.len()..];
                let name: String = match kind {
                    "crate" => tail
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect(),
                    _ => format!(
                        "streamd::{}",
                        tail.chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                            .collect::<String>()
                    ),
                };
                found.push((n + 1, kind, name));
            }
        }
    }
    found
}

#[test]
fn groups_depend_one_way_and_on_streamd_only_through_its_protocol() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 40, "read the tree: {files:?}");
    let mut groups_seen = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for f in &files {
        let group = group_of(&src, f);
        if let Some(g) = &group {
            assert!(
                rank(g).is_some(),
                "{}: {g:?} is not a group of the layout",
                f.display()
            );
            groups_seen.insert(g.clone());
        }
        let text = std::fs::read_to_string(f).expect("read source");
        for (line, kind, to) in uses(&text) {
            let ok = match (kind, &group) {
                ("streamd", _) => to.starts_with(STREAMD_ALLOWED),
                (_, Some(g)) => allowed(g, &to),
                (_, None) => true,
            };
            if !ok {
                let from = group.as_deref().unwrap_or("the crate root");
                wrong.push(format!("{}:{line}: {from} uses {to}", f.display()));
            }
        }
    }
    assert_eq!(
        groups_seen.len(),
        ORDER.len(),
        "every group exists: {groups_seen:?}"
    );
    assert!(
        wrong.is_empty(),
        "uses must point to lower ranks ({ORDER:?}) or to {STREAMD_ALLOWED}:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rules_catch_a_backward_use_and_the_rest_of_streamd() {
    assert!(allowed("harness", "fakes"));
    assert!(allowed("fakes", "fakes"));
    assert!(!allowed("fakes", "harness"));
    assert!(!allowed("control", "scratch"));
    assert!(!allowed("fixtures", "nowhere"));
    assert_eq!(
        uses("use crate::fakes::bus; // crate::bench\nstreamd::agent::run(); my_streamd::y"),
        [
            (1, "crate", "fakes".to_string()),
            (2, "streamd", "streamd::agent::run".to_string()),
        ]
    );
    assert!(uses("    /// [`crate::harness`]").is_empty());
}
