//! The documentation holds together: the README is the entry page (short, linking every
//! document), and every relative link in the Markdown files, anchors included, points at
//! something that exists.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's budget: an entry page, the manual lives in docs/.
const README_MAX_CHARS: usize = 8_000;

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != ".git" && name != "node_modules" {
                markdown_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// `[text](target)` targets, with the line they are on; code spans and fenced blocks skipped.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code is not a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push((n + 1, rest[..end].to_string()));
                rest = &rest[end..];
            }
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// What is wrong with one link from `file`, if anything.
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent()?.join(path)
    };
    if !dest.exists() {
        return Some(format!("{target}: no such file"));
    }
    let anchor = anchor?;
    if dest.extension().is_some_and(|x| x == "md") {
        let text = std::fs::read_to_string(&dest).ok()?;
        if !anchors(&text).iter().any(|a| a == anchor) {
            return Some(format!("{target}: no heading with anchor #{anchor}"));
        }
    }
    None
}

#[test]
fn every_relative_link_resolves() {
    let mut files = Vec::new();
    markdown_files(Path::new(ROOT), &mut files);
    assert!(files.len() > 10, "found the Markdown files: {files:?}");
    let mut wrong = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        for (line, target) in links(&text) {
            if let Some(why) = broken(f, &target) {
                let shown = f.strip_prefix(ROOT).unwrap_or(f).display().to_string();
                wrong.push(format!("{shown}:{line}: {why}"));
            }
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn the_readme_is_an_entry_page_that_links_every_document() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let chars = readme.chars().count();
    assert!(
        chars <= README_MAX_CHARS,
        "README.md has {chars} characters; the manual belongs in docs/ (at most {README_MAX_CHARS})"
    );
    let linked: Vec<String> = links(&readme).into_iter().map(|(_, t)| t).collect();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && !linked.iter().any(|l| l == &format!("docs/{name}")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "documents the README does not link: {missing:?}"
    );
}

#[test]
fn the_link_checker_sees_a_broken_link_and_anchor() {
    let text = "see [a](x.md) and `[b](code.md)`\n```\n[c](fenced.md)\n```\n[d](y.md#two-words)";
    assert_eq!(
        links(text),
        [(1, "x.md".to_string()), (5, "y.md#two-words".to_string())]
    );
    assert_eq!(
        slug(" The rollout controller (streamd-rollout)"),
        "the-rollout-controller-streamd-rollout"
    );
    let readme = Path::new(ROOT).join("README.md");
    assert!(broken(&readme, "docs/nonexistent.md").is_some());
    assert!(broken(&readme, "docs/protocol.md#no-such-heading").is_some());
    assert!(broken(&readme, "docs/protocol.md").is_none());
    assert!(broken(&readme, "https://example.com/x").is_none());
}

/// Every text file an admin reads about the node: the Markdown files, the journal catalog and
/// the unit.
fn admin_texts() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    markdown_files(Path::new(ROOT), &mut files);
    files.push(Path::new(ROOT).join("systemd/streamd.catalog"));
    files.push(Path::new(ROOT).join("systemd/streamd.service"));
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("read");
            (f, text)
        })
        .collect()
}

/// The names `streamd-bootc-…` the texts give for streamd's bootc units are the units the code
/// starts: the one writing unit, the read units' prefix, or a glob over them.
#[test]
fn the_bootc_unit_names_in_the_docs_are_the_code_s() {
    let write = streamd::backend::bootc::WRITE_UNIT;
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (file, text) in admin_texts() {
        for (at, _) in text.match_indices("streamd-bootc-") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '*' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            seen += 1;
            // `bootc status` runs in `streamd-bootc-status-<pid>-<n>.service`.
            let known = name == write
                || name == "streamd-bootc-*"
                || name == "streamd-bootc-*.service"
                || name.starts_with("streamd-bootc-status-");
            if !known {
                let shown = file
                    .strip_prefix(ROOT)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                wrong.push(format!("{shown}: {name}"));
            }
        }
    }
    assert!(seen >= 4, "found {seen} unit names");
    assert!(
        wrong.is_empty(),
        "unit names the code never starts:\n{}",
        wrong.join("\n")
    );
}

/// The `host` annotation's row in docs/protocol.md names every field streamd writes and every
/// value of `backend`, `fips` and `kernel`.
#[test]
fn the_host_json_fields_and_values_are_documented() {
    use streamd::backend::{BackendKind, KernelVariant};
    use streamd::host::facts::{Fips, HostFacts};

    let protocol = std::fs::read_to_string(Path::new(ROOT).join("docs/protocol.md")).expect("read");
    let row = protocol
        .lines()
        .find(|l| l.starts_with("| `host` | compact JSON"))
        .expect("the host annotation's row");
    let quoted: Vec<&str> = row.split('`').skip(1).step_by(2).collect();
    let facts = HostFacts {
        arch: "x86_64".into(),
        backend: BackendKind::RpmOstree,
        fips: Fips::Disabled,
        fips_sources: Default::default(),
        kernel: Some(KernelVariant::Default),
        x86_64_level: Some(3),
        secure_boot: Some(true),
        bootloader_updated: Some(false),
    };
    let json = serde_json::to_value(&facts).expect("json");
    let mut names: Vec<String> = json.as_object().expect("object").keys().cloned().collect();
    for value in [
        serde_json::to_value(BackendKind::Bootc),
        serde_json::to_value(Fips::Enabled),
        serde_json::to_value(Fips::Inconsistent),
        serde_json::to_value(KernelVariant::Realtime),
        serde_json::to_value(KernelVariant::SixtyFourK),
    ] {
        names.extend(value.expect("json").as_str().map(String::from));
    }
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !quoted.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/protocol.md's host row lacks {missing:?}: {row}"
    );
}

/// The OSImageStream feature sets the texts name are the ones the code's reasons name, and the
/// protocol names all of them (issue 23 §3). A wrong name (`TechPreview` for the set) fails it.
#[test]
fn the_feature_sets_in_the_docs_are_the_code_s() {
    use streamd::cluster::streams::NO_UPGRADE_FEATURE_SETS;
    let mut seen = std::collections::BTreeSet::new();
    for (file, text) in admin_texts() {
        for (i, _) in text.match_indices("NoUpgrade") {
            let start = text[..i]
                .rfind(|c: char| !c.is_ascii_alphanumeric())
                .map_or(0, |p| p + 1);
            let end = i + "NoUpgrade".len();
            let name = &text[start..end];
            // Upstream Go and fields quoted in the ledgers (`inTechPreviewNoUpgrade()`,
            // `spec.customNoUpgrade`) are no feature set's name.
            if text[end..].starts_with('(') || name.starts_with(|c: char| c.is_ascii_lowercase()) {
                continue;
            }
            assert!(
                NO_UPGRADE_FEATURE_SETS.contains(&name),
                "{}: {name} is not among {NO_UPGRADE_FEATURE_SETS:?}",
                file.display()
            );
            seen.insert(name.to_string());
        }
    }
    let protocol = std::fs::read_to_string(Path::new(ROOT).join("docs/protocol.md")).expect("read");
    for set in NO_UPGRADE_FEATURE_SETS {
        assert!(
            protocol.contains(&format!("`{set}`")),
            "docs/protocol.md lacks {set}"
        );
    }
    let reason = streamd::cluster::streams::not_served();
    for set in NO_UPGRADE_FEATURE_SETS {
        assert!(reason.contains(set), "{reason}");
    }
    assert_eq!(seen.len(), NO_UPGRADE_FEATURE_SETS.len(), "{seen:?}");
}

/// Every `streamctl <command>` the docs, the journal catalog, the unit and the reasons that
/// give up tell an admin to run is a command `streamctl --help` lists (issue 23 §2, §3).
#[test]
fn the_streamctl_commands_the_texts_name_exist() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_streamctl"))
        .arg("--help")
        .output()
        .expect("streamctl runs");
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .and_then(|c| c.split("\n\n").next())
        .expect("a command list")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // `generate` is hidden from the list (man pages and completions, for packaging).
    let known = |c: &str| commands.contains(&c) || c == "generate";
    let mut texts = admin_texts();
    texts.push((
        PathBuf::from("planner::TRY_AGAIN"),
        streamd::agent::planner::TRY_AGAIN.to_string(),
    ));
    let mut named = 0;
    for (file, text) in texts {
        // As code: `streamctl reconcile`, `streamctl status --json`.
        for (i, _) in text.match_indices("`streamctl ") {
            let word: String = text[i + "`streamctl ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase())
                .collect();
            assert!(
                known(&word),
                "{}: streamctl {word} is not a command: {commands:?}",
                file.display()
            );
            named += 1;
        }
    }
    assert!(named > 10, "{named}");
}
