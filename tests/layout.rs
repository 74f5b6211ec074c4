//! The source tree shows the architecture: `src/` is grouped by concern, and a group uses only
//! the groups before it in [`ORDER`] (README "Layout", `src/lib.rs`). A `crate::<group>` path that
//! points the other way fails here with the file and line.

use std::path::{Path, PathBuf};

/// The groups, each allowed to use only those of a lower rank; `dbus_api` and `logging` share
/// a rank, so neither uses the other.
const ORDER: [(&str, u8); 10] = [
    ("text", 0),
    ("backoff", 0),
    ("config", 1),
    ("image", 2),
    ("backend", 3),
    ("host", 4),
    ("cluster", 5),
    ("dbus_api", 6),
    ("logging", 6),
    ("agent", 7),
];

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

/// The group a file under `src/` belongs to (`None` for `lib.rs` and the binaries).
fn group_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Every `crate::<name>` in `text`, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let tail = &rest[i + "crate::".len()..];
            let name: String = tail
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = tail;
        }
    }
    found
}

#[test]
fn groups_depend_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "read the tree: {files:?}");
    let mut groups_seen = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for f in &files {
        let Some(group) = group_of(&src, f) else {
            continue;
        };
        assert!(
            rank(&group).is_some(),
            "{}: group {group:?} is not in the layout (tests/layout.rs ORDER, README)",
            f.display()
        );
        groups_seen.insert(group.clone());
        let text = std::fs::read_to_string(f).expect("read source");
        for (line, to) in crate_paths(&text) {
            if !allowed(&group, &to) {
                wrong.push(format!("{}:{line}: {group} uses {to}", f.display()));
            }
        }
    }
    assert_eq!(
        groups_seen.len(),
        ORDER.len(),
        "every group of the layout exists: {groups_seen:?}"
    );
    assert!(
        wrong.is_empty(),
        "dependencies must point to lower ranks ({ORDER:?}):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_rule_catches_a_backward_use() {
    assert!(allowed("agent", "backend"));
    assert!(allowed("host", "host"));
    assert!(!allowed("backend", "agent"));
    assert!(!allowed("logging", "dbus_api"));
    assert!(!allowed("image", "nowhere"));
    assert_eq!(
        crate_paths("use crate::agent::planner; x(crate::text::quote(a))"),
        [(1, "agent".to_string()), (1, "text".to_string())]
    );
}
