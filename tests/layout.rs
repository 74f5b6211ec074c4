//! The source tree shows the architecture: `src/` is grouped by concern, and a group uses only
//! the groups before it in [`ORDER`] (docs/architecture.md, `src/lib.rs`). A `crate::<group>` path that
//! points the other way fails here with the file and line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod source;

use source::{PathUse, Tok, code_only, path_uses, rust_files, tokens};

/// The groups, each allowed to use only those of a lower rank; `dbus_api` and `logging` share
/// a rank, so neither uses the other.
const ORDER: [(&str, u8); 11] = [
    ("text", 0),
    ("backoff", 0),
    ("config", 1),
    ("notify", 1),
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
            "{}: group {group:?} is not in the layout (tests/layout.rs ORDER, docs/architecture.md)",
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

// ---- Module cycles and crate boundaries -------------------------------------------------------

/// One crate's files by module path (`[]` is the root, `["agent", "gather"]` is
/// `crate::agent::gather`).
type Modules = BTreeMap<Vec<String>, PathBuf>;

/// The module path of `file` below the crate root directory `root`.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let last = parts.pop().unwrap_or_default();
    match last.trim_end_matches(".rs") {
        "mod" | "lib" | "main" if parts.is_empty() || last == "mod.rs" => {}
        name => parts.push(name.to_string()),
    }
    parts
}

/// The library crate under `src` (every file but `main.rs` and `bin/`), by module path.
fn library_modules(src: &Path) -> Modules {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .filter(|f| f.file_name().is_none_or(|n| n != "main.rs") || f.parent() != Some(src))
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|f| (module_of(src, &f), f))
        .collect()
}

/// The file module a `crate::`/`super::` path used in module `from` (with its inline modules)
/// lands in: the longest module path of `modules` it starts with, and the segments after it.
fn resolve(modules: &Modules, from: &[String], u: &PathUse) -> Option<(Vec<String>, Vec<String>)> {
    let mut here: Vec<String> = from.iter().chain(&u.inline).cloned().collect();
    let mut segs = u.segments.iter().peekable();
    match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            here.clear();
        }
        Some("super") => {
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                here.pop()?;
            }
        }
        _ => return None,
    }
    here.extend(segs.cloned());
    (0..=here.len())
        .rev()
        .find(|n| modules.contains_key(&here[..*n]))
        .map(|n| (here[..n].to_vec(), here[n..].to_vec()))
}

/// The names module `m` (text `text`) imports from its own submodules with a `use`
/// (`use work::Outcome;`, `pub use decide::{decide, reboot_token};`), each with the file module
/// it comes from: another module's `super::Outcome` uses `work`, not `m`, and a cycle through
/// such a re-export is a cycle too.
fn imports_from_children(
    modules: &Modules,
    m: &[String],
    text: &str,
) -> BTreeMap<String, Vec<String>> {
    let children: Vec<String> = modules
        .keys()
        .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
        .map(|k| k[m.len()].clone())
        .collect();
    let roots: Vec<&str> = children.iter().map(String::as_str).collect();
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let on_use_line = |line: usize| {
        let l = lines.get(line - 1).map_or("", |l| l.trim_start());
        let l = l.strip_prefix("pub").map_or(l, |rest| {
            rest.trim_start()
                .strip_prefix('(')
                .and_then(|r| r.split_once(')'))
                .map_or(rest, |(_, after)| after)
                .trim_start()
        });
        l.starts_with("use ")
    };
    let mut out = BTreeMap::new();
    for u in path_uses(text, &roots) {
        if !u.inline.is_empty() || !on_use_line(u.line) {
            continue;
        }
        let full: Vec<String> = m.iter().chain(&u.segments).cloned().collect();
        let Some(name) = u.segments.last() else {
            continue;
        };
        if let Some(n) = (m.len() + 1..=full.len())
            .rev()
            .find(|n| modules.contains_key(&full[..*n]))
        {
            out.insert(name.clone(), full[..n].to_vec());
        }
    }
    out
}

/// Which file modules each file module uses, each with the first line that does.
type Graph = BTreeMap<Vec<String>, BTreeMap<Vec<String>, usize>>;

/// The graph of `modules`, each file's text given by `read`. A module's use of its own
/// submodules is no edge: it declares them (`mod x;`) and uses them by relative paths, which
/// are not read here either; what a submodule uses of its parent is. A name the target imports
/// from one of its submodules ([`imports_from_children`]) is a use of that submodule.
fn module_graph(modules: &Modules, read: impl Fn(&Path) -> String) -> Graph {
    let texts: BTreeMap<&Vec<String>, String> = modules.iter().map(|(m, f)| (m, read(f))).collect();
    let imports: BTreeMap<&Vec<String>, BTreeMap<String, Vec<String>>> = texts
        .iter()
        .map(|(m, text)| (*m, imports_from_children(modules, m, text)))
        .collect();
    let mut graph = Graph::new();
    for (m, text) in &texts {
        let edges = graph.entry((*m).clone()).or_default();
        for u in path_uses(text, &["crate", "super"]) {
            let Some((mut to, rest)) = resolve(modules, m, &u) else {
                continue;
            };
            if let Some(child) = rest.first().and_then(|name| imports[&to].get(name)) {
                to = child.clone();
            }
            if !to.starts_with(m) {
                edges.entry(to).or_insert(u.line);
            }
        }
    }
    graph
}

/// The groups of modules that use each other, directly or not (strongly connected components
/// of more than one module), each sorted; sorted.
fn cycles(graph: &Graph) -> Vec<Vec<Vec<String>>> {
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for to in graph.get(&m).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(to.clone()) {
                    todo.push(to.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<Vec<Vec<String>>> = Vec::new();
    for (m, r) in &reaches {
        if !r.contains(*m) || out.iter().any(|c| c.contains(m)) {
            continue;
        }
        let group: Vec<Vec<String>> = reaches
            .iter()
            .filter(|(o, ro)| r.contains(**o) && ro.contains(*m))
            .map(|(o, _)| (*o).clone())
            .collect();
        out.push(group);
    }
    out
}

/// A cycle as its files, and the uses that close it (`file:line uses module`).
fn describe(modules: &Modules, graph: &Graph, cycle: &[Vec<String>], root: &Path) -> String {
    let file = |m: &Vec<String>| {
        let f = &modules[m];
        f.strip_prefix(root).unwrap_or(f).display().to_string()
    };
    let mut lines = vec![format!(
        "cycle: {}",
        cycle.iter().map(file).collect::<Vec<_>>().join(" <-> ")
    )];
    for m in cycle {
        for (to, line) in &graph[m] {
            if cycle.contains(to) {
                lines.push(format!("  {}:{line} uses {}", file(m), file(to)));
            }
        }
    }
    lines.join("\n")
}

#[test]
fn modules_do_not_import_each_other_in_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["src", "rollout/src", "testbed/src"] {
        let modules = library_modules(&root.join(dir));
        assert!(modules.len() > 5, "read {dir}: {modules:?}");
        let graph = module_graph(&modules, |f| {
            std::fs::read_to_string(f).expect("read source")
        });
        for c in cycles(&graph) {
            found.push(describe(&modules, &graph, &c, root));
        }
    }
    assert!(
        found.is_empty(),
        "modules import each other in a cycle; move what they share to the lower one or a third module:\n{}",
        found.join("\n")
    );
}

/// What of the `streamd` crate each other crate may use: the paths below these. rollout reads
/// and writes the annotation protocol, resolves streams as the agent does, and bounds its texts
/// as the protocol's fields are bounded (`text`, which depends on nothing); testbed only speaks
/// the protocol.
const STREAMD_USES: [(&str, &[&str]); 2] = [
    (
        "rollout/src",
        &[
            "streamd::cluster::protocol",
            "streamd::cluster::streams",
            // The heartbeat Lease's shape and expiry, shared like the annotations.
            "streamd::cluster::heartbeat",
            "streamd::text",
        ],
    ),
    ("testbed/src", &["streamd::cluster::protocol"]),
];

/// Every use of crate `krate` in `text` (of `file`) that is below none of `allowed`, as
/// `file:line: uses path`.
fn forbidden_uses(file: &str, text: &str, krate: &str, allowed: &[&str]) -> Vec<String> {
    let mut wrong = Vec::new();
    for u in path_uses(text, &[krate]) {
        let path = u.segments.join("::");
        let below = |a: &&str| path == *a || path.starts_with(&format!("{a}::"));
        if !allowed.iter().any(below) {
            wrong.push(format!("{file}:{}: uses {path}", u.line));
        }
    }
    // `use streamd;`, `use streamd as s;`, `extern crate streamd`: the whole crate.
    let toks = tokens(&code_only(text));
    for (i, (line, t)) in toks.iter().enumerate() {
        let whole = *t == Tok::Ident(krate.into())
            && i > 0
            && matches!(&toks[i - 1].1, Tok::Ident(k) if k == "use" || k == "crate")
            && toks.get(i + 1).is_none_or(|(_, n)| *n != Tok::Sep);
        if whole {
            wrong.push(format!("{file}:{line}: uses all of {krate}"));
        }
    }
    wrong
}

#[test]
fn other_crates_use_only_what_streamd_shares() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (dir, allowed) in STREAMD_USES {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        files.sort();
        assert!(files.len() > 5, "read {dir}: {files:?}");
        for f in &files {
            let text = std::fs::read_to_string(f).expect("read source");
            let name = f.strip_prefix(root).unwrap_or(f).display().to_string();
            wrong.extend(forbidden_uses(&name, &text, "streamd", allowed));
        }
    }
    assert!(
        wrong.is_empty(),
        "uses of streamd beyond {STREAMD_USES:?}:\n{}",
        wrong.join("\n")
    );
}

/// The modules of a made-up crate, its files' texts by path.
fn made_up(texts: &BTreeMap<&str, &str>) -> Modules {
    texts
        .keys()
        .map(|f| (module_of(Path::new(""), Path::new(f)), PathBuf::from(f)))
        .collect()
}

/// The cycle detector on a made-up crate: `a::b` and `c` use each other (through `crate::`);
/// `a::b` and `c` use `a` one way (through `super::` and `crate::`), and `a`'s use of its own
/// submodule is no edge; paths in comments and strings, and an inline module's `super`, are no
/// uses.
#[test]
fn the_cycle_detector_finds_a_cycle_and_only_that() {
    let texts: BTreeMap<&str, &str> = [
        ("lib.rs", "pub mod a;\npub mod c;\n"),
        (
            "a.rs",
            "pub mod b;\nuse crate::a::b::Thing;\npub fn g() {}\n",
        ),
        (
            "a/b.rs",
            "use crate::c::y;\npub struct Thing;\n\npub fn f() {\n    super::g()\n}\n",
        ),
        (
            "c.rs",
            "use crate::a::{self, b::Thing};\n// crate::lib in a comment\n\
             fn y() -> &'static str { \"crate::lib\" }\n\
             mod tests {\n    use super::y;\n}\n",
        ),
    ]
    .into_iter()
    .collect();
    let modules = made_up(&texts);
    let graph = module_graph(&modules, |f| texts[f.to_str().expect("name")].to_string());
    let m = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let uses = |from: &[&str]| graph[&m(from)].keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        uses(&["c"]),
        [m(&["a"]), m(&["a", "b"])],
        "not itself, not the root"
    );
    assert_eq!(uses(&["a", "b"]), [m(&["a"]), m(&["c"])]);
    assert!(uses(&["a"]).is_empty(), "a parent's use of its submodule");
    let found = cycles(&graph);
    assert_eq!(found, [vec![m(&["a", "b"]), m(&["c"])]]);
    let told = describe(&modules, &graph, &found[0], Path::new(""));
    assert_eq!(
        told,
        "cycle: a/b.rs <-> c.rs\n  a/b.rs:1 uses c.rs\n  c.rs:1 uses a/b.rs"
    );
}

/// A cycle through a parent's re-export: `p` imports `Thing` from `p::x` (and, in a test
/// module, `f` from `p::y`), `p::y` uses `super::Thing` (that is `p::x`) and `p::x` uses
/// `super::y::f`. Without the re-export, `p::y`'s use is one of `p` and no cycle.
#[test]
fn the_cycle_detector_sees_through_a_parents_use() {
    let texts: BTreeMap<&str, &str> = [
        ("lib.rs", "pub mod p;\n"),
        (
            "p/mod.rs",
            "mod x;\nmod y;\npub(crate) use x::Thing;\n\
             mod tests {\n    use y::f;\n}\n",
        ),
        ("p/x.rs", "pub struct Thing;\nfn g() { super::y::f() }\n"),
        ("p/y.rs", "pub fn f() {}\nfn h(_: super::Thing) {}\n"),
    ]
    .into_iter()
    .collect();
    let modules = made_up(&texts);
    let m = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let imports = imports_from_children(&modules, &m(&["p"]), texts["p/mod.rs"]);
    assert_eq!(
        imports.into_iter().collect::<Vec<_>>(),
        [("Thing".to_string(), m(&["p", "x"]))],
        "a use line's names, not a test module's"
    );
    let graph = module_graph(&modules, |f| texts[f.to_str().expect("name")].to_string());
    assert_eq!(cycles(&graph), [vec![m(&["p", "x"]), m(&["p", "y"])]]);
    let plain: BTreeMap<&str, &str> = texts
        .iter()
        .map(|(f, t)| {
            (
                *f,
                if *f == "p/mod.rs" {
                    "mod x;\nmod y;\npub struct Thing;\n"
                } else {
                    t
                },
            )
        })
        .collect();
    let graph = module_graph(&modules, |f| plain[f.to_str().expect("name")].to_string());
    assert!(cycles(&graph).is_empty(), "{graph:?}");
}

/// The crate rule on made-up text: a use tree is split into its paths, each judged; comments
/// and strings are no uses; the whole crate is no exception.
#[test]
fn the_crate_rule_names_the_file_and_line_of_a_forbidden_use() {
    let text = "use streamd::cluster::{protocol::Desired, streams};\n\
                use streamd::agent::gather;\n\
                fn f() { streamd::host::facts::x(); let _ = \"streamd::agent\"; } // streamd::agent\n\
                use ::streamd::backend::{self};\n\
                use streamd as s;\n";
    let allowed = ["streamd::cluster::protocol", "streamd::cluster::streams"];
    assert_eq!(
        forbidden_uses("x.rs", text, "streamd", &allowed),
        [
            "x.rs:2: uses streamd::agent::gather",
            "x.rs:3: uses streamd::host::facts::x",
            "x.rs:4: uses streamd::backend",
            "x.rs:5: uses all of streamd",
        ]
    );
    assert!(forbidden_uses("x.rs", "use streamd_rollout::node;", "streamd", &allowed).is_empty());
}

#[test]
fn code_only_blanks_comments_and_literals_and_keeps_lines() {
    let text = "a /* crate::x\n */ b // crate::y\nfn f<'a>(s: &'a str) -> char { r#\"crate::\"z\"#; '\"' }\nc::d";
    let code = code_only(text);
    assert_eq!(code.lines().count(), text.lines().count());
    assert!(!code.contains("crate"), "{code}");
    assert!(code.contains("fn f<'a>(s: &'a str)"), "{code}");
    assert!(code.ends_with("c::d"), "{code}");
}
