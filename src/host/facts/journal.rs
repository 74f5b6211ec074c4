//! The previous boot's `ostree-finalize-staged.service` errors, from the journal.
//!
//! When finalization fails at shutdown the node boots the old deployment and the only trace is
//! in the journal of the boot that failed (field failure mode 8); streamd quotes it in the
//! `RolledBack` reason.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use super::HostRoot;

/// `journalctl` may be slow on a large journal; the reason is a nicety, never worth a hang.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Longest quote taken into a reason.
const MAX_CHARS: usize = 300;

/// The error lines `ostree-finalize-staged.service` logged in the previous boot, if any.
pub async fn finalize_failure(root: &HostRoot) -> Option<String> {
    // By absolute path: the unit's PATH is not part of the contract.
    let mut cmd = tokio::process::Command::new("/usr/bin/journalctl");
    if root.root() != Path::new("/") {
        cmd.arg(format!("--root={}", root.root().display()));
    }
    cmd.args([
        "--boot=-1",
        "--unit=ostree-finalize-staged.service",
        "--priority=err",
        "--output=cat",
        "--no-pager",
        "--quiet",
        "--lines=5",
    ])
    .stdin(Stdio::null())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    let out = tokio::time::timeout(TIMEOUT, cmd.output())
        .await
        .ok()?
        .ok()?;
    if !out.status.success() {
        return None;
    }
    summarize(&String::from_utf8_lossy(&out.stdout))
}

/// One line from journal output: non-empty lines joined with `; `, shortened; `None` when
/// there are none.
fn summarize(text: &str) -> Option<String> {
    let line = crate::text::one_line(text, MAX_CHARS);
    (!line.is_empty()).then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        assert_eq!(summarize(""), None);
        assert_eq!(summarize("\n  \n"), None);
        assert_eq!(
            summarize("error: Bootloader write config: grub2-mkconfig: Child process exited with code 1\nFailed with result 'exit-code'.\n")
                .as_deref(),
            Some("error: Bootloader write config: grub2-mkconfig: Child process exited with code 1; Failed with result 'exit-code'.")
        );
        let long = "x".repeat(1000);
        let s = summarize(&long).expect("some");
        assert_eq!(s.chars().count(), MAX_CHARS);
        assert!(s.ends_with('…'));
    }

    #[tokio::test]
    async fn a_root_without_a_journal_gives_nothing() {
        let d = testbed::scratch::ScratchDir::new("journal").expect("scratch dir");
        assert_eq!(finalize_failure(&HostRoot::new(d.path())).await, None);
    }
}
