//! The record streamd keeps across restarts and reboots (`state-dir/attempt.json`).
//!
//! rpm-ostree's deployments and the node's annotations hold most of the truth; this file holds
//! the two facts neither can: which staged deployment streamd itself created (so a foreign one
//! is never mistaken for ours, and a stale one of ours is cleaned up), and how often the node
//! was rebooted into the current request (so a rollback cannot become a reboot loop). Writes are
//! atomic (temporary file, fsync, rename, fsync of the directory): after a crash or a power cut
//! the file is either the old or the new record, never a torn one. [`after_boot`] checks the new
//! boot against what the attempt recorded before the reboot.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::facts::HostFacts;

/// File name below the state directory.
pub const FILE_NAME: &str = "attempt.json";
/// Version of the record's shape this streamd writes.
///
/// The record crosses OS versions (the old OS writes it before the reboot, the new one reads it
/// after), so the shape only grows: fields are added with a default, never renamed or given a new
/// meaning, and unknown fields are ignored. A record of any version is read: an older one lacks
/// the newer fields (they take their defaults), a newer one has fields this streamd ignores (and
/// drops when it writes the record again).
/// Version 1 had no `id`, `expect`, `pinned` or `verified` in `staged`.
pub const VERSION: u32 = 2;

/// What streamd remembers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// [`VERSION`].
    pub version: u32,
    /// The last staging streamd started; a staged deployment carrying this image is ours.
    pub staged: Option<Staged>,
    /// The reboot attempts into one request.
    pub attempt: Option<Attempt>,
    /// On a backend that cannot lock a stage (bootc) the approval comes before the staging:
    /// the request it is asked for and the random id of that ask, part of the token.
    #[serde(default)]
    pub approval: Option<ApprovalAsk>,
    /// What went wrong staging one request, so a restart does not forget it.
    #[serde(default)]
    pub failure: Option<Failure>,
}

/// What went wrong staging one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// Hash of the request (`observed-desired`).
    pub request: String,
    /// Its transactions that failed on the network so far (counted against `pull-retries`).
    #[serde(default)]
    pub pull_failures: u32,
    /// The reason its staging failed for good: it is not staged again until the request
    /// changes or `streamctl reconcile` asks for it.
    #[serde(default)]
    pub gave_up: Option<String>,
}

/// An approval asked for before staging (bootc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalAsk {
    /// Hash of the request (`observed-desired`).
    pub request: String,
    /// Random id, part of the token.
    pub id: String,
}

/// A new random id for a staging or an approval ask (12 hex digits).
pub fn new_id() -> String {
    let mut bytes = [0u8; 6];
    // The id only has to differ from earlier ones; the clock is the fallback.
    if rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .is_err()
    {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes.copy_from_slice(&nanos.to_le_bytes()[..6]);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A staging streamd started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Staged {
    /// Hash of the request (`observed-desired`).
    pub request: String,
    /// The digest-pinned OS image asked for.
    pub os_image: String,
    /// Random id of this staging, part of the `reboot-requested` token, so an approval of an
    /// earlier staging of the same request (A → B → A) is not one of this staging's; absent in
    /// records of version 1.
    #[serde(default)]
    pub id: Option<String>,
    /// What the staged deployment must look like (from preflight), for the on-disk check; absent
    /// in records of version 1.
    #[serde(default)]
    pub expect: Option<crate::host::verify::Expectation>,
    /// The digest the request pins (an index digest may stand for the platform manifest's).
    #[serde(default)]
    pub pinned: Option<String>,
    /// The checksum of the staged deployment that passed the on-disk check. No approval is
    /// asked for and nothing is finalized unless the staged deployment has this checksum.
    #[serde(default)]
    pub verified: Option<String>,
}

/// Reboots into one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// Hash of the request (`observed-desired`).
    pub request: String,
    /// The OS image of the request.
    pub os_image: String,
    /// The staged manifest digest passed to `FinalizeDeployment`.
    pub digest: String,
    /// The boot in which the last finalization was started.
    pub boot_id: String,
    /// Finalizations started for this request (one per boot at most).
    pub attempts: u32,
    /// The boot in which the outcome of the last attempt was reported (event posted).
    pub reported_boot: Option<String>,
    /// The kernel variant the node ran when the reboot was approved; the new boot must run it.
    #[serde(default)]
    pub kernel: Option<crate::backend::KernelVariant>,
    /// Whether the node was in FIPS mode then; the new boot must be too (never toggled).
    #[serde(default)]
    pub fips: Option<bool>,
}

/// One thing the node was before the reboot and is not after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootChange {
    /// The kernel variant changed (`now` is `None` when the running kernel does not match
    /// the overrides).
    #[error(
        "the node ran the {} kernel before the reboot but now runs {}",
        was.as_str(),
        now.map_or("a kernel that does not match its overrides", |k| k.as_str())
    )]
    Kernel {
        /// The variant before.
        was: crate::backend::KernelVariant,
        /// The variant now, if known.
        now: Option<crate::backend::KernelVariant>,
    },
    /// The FIPS mode changed (`now` is `None` when kernel and command line disagree).
    #[error(
        "FIPS mode was {} before the reboot and is {} now",
        if *was { "on" } else { "off" },
        match now {
            Some(true) => "on",
            Some(false) => "off",
            None => "inconsistent (kernel and command line disagree)",
        }
    )]
    Fips {
        /// The mode before.
        was: bool,
        /// The mode now, if consistent.
        now: Option<bool>,
    },
}

/// What did not come along through the reboot: one sentence per change, joined by `; `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterBootError(pub Vec<BootChange>);

impl std::fmt::Display for AfterBootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, change) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{change}")?;
        }
        Ok(())
    }
}

impl std::error::Error for AfterBootError {}

impl AfterBootError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self.0.as_slice() {
            [BootChange::Kernel { .. }] => "boot-kernel-changed",
            [BootChange::Fips { .. }] => "boot-fips-changed",
            _ => "boot-kernel-and-fips-changed",
        }
    }
}

/// Checks the node after it booted the target of `attempt`: the kernel variant and the FIPS
/// mode it had when the reboot was approved must have come along (`facts` are this boot's).
/// Every difference is one [`BootChange`].
pub fn after_boot(attempt: &Attempt, facts: &HostFacts) -> Result<(), AfterBootError> {
    let mut changes = Vec::new();
    if let Some(was) = attempt.kernel
        && facts.kernel != Some(was)
    {
        changes.push(BootChange::Kernel {
            was,
            now: facts.kernel,
        });
    }
    if let Some(was) = attempt.fips {
        let now = facts.fips.enabled();
        if now != Some(was) {
            changes.push(BootChange::Fips { was, now });
        }
    }
    if changes.is_empty() {
        Ok(())
    } else {
        Err(AfterBootError(changes))
    }
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file holds something else than a record of this version.
    #[error(
        "{path}: not a streamd attempt record ({message}); move it away to let streamd start over"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl RecordError {
    /// A short stable id for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            RecordError::Io { .. } => "attempt-record-io",
            RecordError::Corrupt { .. } => "attempt-record-corrupt",
        }
    }
}

/// The record's file.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The record in `dir` (the state directory).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Store { dir: dir.into() }
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// The saved record; an empty one when there is none.
    pub fn load(&self) -> Result<Record, RecordError> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::default()),
            Err(source) => return Err(RecordError::Io { path, source }),
        };
        let record: Record = serde_json::from_slice(&bytes).map_err(|e| RecordError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if record.version == 0 {
            return Err(RecordError::Corrupt {
                path,
                message: "version 0".into(),
            });
        }
        Ok(record)
    }

    /// Replaces the saved record atomically.
    pub fn save(&self, record: &Record) -> Result<(), RecordError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io { path, source }
        };
        let path = self.path();
        let tmp = self.dir.join(format!(".{FILE_NAME}.tmp"));
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let record = Record {
            version: VERSION,
            ..record.clone()
        };
        let bytes = serde_json::to_vec_pretty(&record).map_err(|e| RecordError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        // The rename is durable only once the directory entry is.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> testbed::scratch::ScratchDir {
        testbed::scratch::ScratchDir::new(&format!("attempt-{name}")).expect("scratch dir")
    }

    #[test]
    fn missing_is_empty_and_saved_round_trips() {
        let d = dir("rt");
        let store = Store::new(d.path());
        assert_eq!(store.load().expect("load"), Record::default());
        let rec = Record {
            version: 0,
            staged: Some(Staged {
                request: "abc".into(),
                os_image: "r/x@sha256:1".into(),
                id: Some(new_id()),
                expect: None,
                pinned: Some("sha256:1".into()),
                verified: Some("c0ffee".into()),
            }),
            attempt: Some(Attempt {
                request: "abc".into(),
                os_image: "r/x@sha256:1".into(),
                digest: "sha256:2".into(),
                boot_id: "b1".into(),
                attempts: 1,
                reported_boot: None,
                kernel: Some(crate::backend::KernelVariant::Realtime),
                fips: Some(true),
            }),
            approval: None,
            failure: Some(Failure {
                request: "abc".into(),
                pull_failures: 2,
                gave_up: None,
            }),
        };
        store.save(&rec).expect("save");
        let back = store.load().expect("load");
        assert_eq!(back.version, VERSION, "save stamps the version");
        assert_eq!(back.attempt, rec.attempt);
        assert_eq!(back.staged, rec.staged);
        assert_eq!(back.failure, rec.failure);
        assert!(
            !store.dir.join(format!(".{FILE_NAME}.tmp")).exists(),
            "no temporary file is left behind"
        );
    }

    #[test]
    fn corrupt_or_foreign_files_are_errors_naming_the_file() {
        let d = dir("corrupt");
        let store = Store::new(d.path());
        for text in [
            "{",
            "[]",
            r#"{"version": 0}"#,
            r#"{"version": 1, "staged": 5}"#,
        ] {
            std::fs::write(store.path(), text).expect("write");
            let err = store.load().expect_err(text).to_string();
            assert!(err.contains(FILE_NAME), "{text}: {err}");
        }
    }

    /// A record as streamd 1 wrote it (version 1: no expectation or verification in `staged`)
    /// is read, and one of a newer streamd with fields this one does not know is too.
    #[test]
    fn records_of_other_versions_are_read() {
        let d = dir("versions");
        let store = Store::new(d.path());
        let v1 = r#"{
  "version": 1,
  "staged": { "request": "abc", "osImage": "r/x@sha256:1" },
  "attempt": {
    "request": "abc", "osImage": "r/x@sha256:1", "digest": "sha256:2",
    "bootId": "b1", "attempts": 1, "reportedBoot": null
  }
}"#;
        std::fs::write(store.path(), v1).expect("write");
        let rec = store.load().expect("a version 1 record is read");
        let staged = rec.staged.expect("staged");
        assert_eq!(staged.os_image, "r/x@sha256:1");
        assert_eq!(
            staged.verified, None,
            "never verified by a version 1 streamd"
        );
        let attempt = rec.attempt.expect("attempt");
        assert_eq!(
            (attempt.attempts, attempt.kernel, attempt.fips),
            (1, None, None)
        );
        let newer = r#"{
  "version": 9,
  "staged": { "request": "abc", "osImage": "r/x@sha256:1", "verified": "c1", "laterField": [1] },
  "somethingNew": { "a": 1 }
}"#;
        std::fs::write(store.path(), newer).expect("write");
        let rec = store.load().expect("a newer record is read");
        assert_eq!(rec.staged.and_then(|s| s.verified).as_deref(), Some("c1"));
    }

    #[test]
    fn after_boot_checks_kernel_and_fips() {
        use crate::backend::BackendKind as Backend;
        use crate::backend::KernelVariant;
        use crate::host::facts::Fips;
        let attempt = Attempt {
            request: "r".into(),
            os_image: "i".into(),
            digest: "d".into(),
            boot_id: "b".into(),
            attempts: 1,
            reported_boot: None,
            kernel: Some(KernelVariant::Realtime),
            fips: Some(true),
        };
        let facts = |kernel, fips| HostFacts {
            arch: "x86_64".into(),
            backend: Backend::RpmOstree,
            fips,
            fips_sources: Default::default(),
            kernel,
            x86_64_level: Some(3),
            secure_boot: None,
            bootloader_updated: None,
        };
        assert_eq!(
            after_boot(
                &attempt,
                &facts(Some(KernelVariant::Realtime), Fips::Enabled)
            ),
            Ok(())
        );
        let err = after_boot(
            &attempt,
            &facts(Some(KernelVariant::Default), Fips::Disabled),
        )
        .expect_err("both lost")
        .to_string();
        assert!(
            err.contains("realtime kernel before the reboot but now runs default"),
            "{err}"
        );
        assert!(
            err.contains("FIPS mode was on before the reboot and is off now"),
            "{err}"
        );
        assert_eq!(
            after_boot(
                &attempt,
                &facts(Some(KernelVariant::Default), Fips::Disabled)
            )
            .map_err(|e| e.label()),
            Err("boot-kernel-and-fips-changed")
        );
        assert_eq!(
            after_boot(
                &attempt,
                &facts(Some(KernelVariant::Realtime), Fips::Disabled)
            ),
            Err(AfterBootError(vec![BootChange::Fips {
                was: true,
                now: Some(false)
            }]))
        );
        let err = after_boot(&attempt, &facts(None, Fips::Inconsistent))
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("does not match its overrides") && err.contains("inconsistent"),
            "{err}"
        );
        let unknown = Attempt {
            kernel: None,
            fips: None,
            ..attempt
        };
        assert_eq!(
            after_boot(&unknown, &facts(None, Fips::Disabled)),
            Ok(()),
            "nothing recorded, nothing checked"
        );
    }
}
