//! The image labels of the deployments' commits, which `bootc status` does not print: read
//! from the ostree-ext image configuration by the `streamd-verify` helper, once per commit.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::Client;
use crate::backend::Deployment;
use crate::backend::deployment::ImageConfigError;
use crate::backend::helper::{ConfigsByCommit, HelperError, RemoteError};

/// How long the helper may take to read the image configuration of two commits.
const LABELS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit whose labels could not be read waits before the next read: every
/// status reads the deployments, and a read that keeps failing (a damaged repository, a
/// missing helper) should neither run the helper nor warn each time.
const LABELS_RETRY: Duration = Duration::from_secs(300);

/// Why the labels of a commit are unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum LabelsError {
    /// The helper is not there or gave no answer.
    #[error(transparent)]
    Helper(#[from] HelperError),
    /// The helper could not open the repository (its words).
    #[error(transparent)]
    Repository(RemoteError),
    /// The helper's answer leaves this commit out.
    #[error("the helper did not answer for this commit")]
    Unanswered,
    /// The helper could not read this commit (its words).
    #[error(transparent)]
    Commit(RemoteError),
    /// The stored configuration is malformed.
    #[error(transparent)]
    Config(#[from] ImageConfigError),
    /// Not read yet.
    #[error("not read")]
    NotRead,
}

impl LabelsError {
    /// A short stable id for logs and metrics.
    fn label(&self) -> &'static str {
        match self {
            LabelsError::Helper(e) => e.label(),
            LabelsError::Repository(_) => "labels-repository-unreadable",
            LabelsError::Unanswered => "labels-unanswered",
            LabelsError::Commit(_) => "labels-commit-unreadable",
            LabelsError::Config(e) => e.label(),
            LabelsError::NotRead => "labels-not-read",
        }
    }
}

/// The image labels read per commit (commits are immutable) and the reads that failed (tried
/// again after [`LABELS_RETRY`]); only the current deployments' commits are kept.
#[derive(Debug, Default)]
pub(super) struct LabelCache {
    read: HashMap<String, BTreeMap<String, String>>,
    /// Per commit: why its labels are unknown, and when that was found.
    failed: HashMap<String, (LabelsError, Instant)>,
}

impl LabelCache {
    /// Forgets the commits not in `deployed`, and says which of `wanted` to read at `now`:
    /// those neither read nor failed within [`LABELS_RETRY`], sorted, without repeats.
    fn due(&mut self, deployed: &[&str], wanted: &[&str], now: Instant) -> Vec<String> {
        self.read.retain(|c, _| deployed.contains(&c.as_str()));
        self.failed.retain(|c, _| deployed.contains(&c.as_str()));
        let mut out: Vec<String> = wanted
            .iter()
            .filter(|c| !self.read.contains_key(**c))
            .filter(|c| {
                self.failed
                    .get(**c)
                    .is_none_or(|(_, at)| now.duration_since(*at) >= LABELS_RETRY)
            })
            .map(|c| c.to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Records what a read of `commit` found at `now`; true for a failure worth a warning (the
    /// first one, or a reason that changed).
    fn record(
        &mut self,
        commit: &str,
        found: Result<BTreeMap<String, String>, LabelsError>,
        now: Instant,
    ) -> bool {
        match found {
            Ok(labels) => {
                self.failed.remove(commit);
                self.read.insert(commit.to_string(), labels);
                false
            }
            Err(e) => {
                let new = self.failed.get(commit).is_none_or(|(was, _)| *was != e);
                self.failed.insert(commit.to_string(), (e, now));
                new
            }
        }
    }

    /// The labels of `commit`, or why they are unknown.
    fn get(&self, commit: &str) -> Result<&BTreeMap<String, String>, LabelsError> {
        match (self.read.get(commit), self.failed.get(commit)) {
            (Some(labels), _) => Ok(labels),
            (None, Some((why, _))) => Err(why.clone()),
            (None, None) => Err(LabelsError::NotRead),
        }
    }
}

impl Client {
    /// Fills the image labels of the booted and staged deployments from their commits' stored
    /// image configuration: known ones at once, the others in one helper run. A failure
    /// leaves [`Deployment::image_labels_error`] set, is warned about once, and is tried again
    /// after [`LABELS_RETRY`].
    pub(super) async fn fill_labels(&self, deployments: &mut [Deployment]) {
        let deployed: Vec<&str> = deployments.iter().map(|d| d.checksum.as_str()).collect();
        let wanted: Vec<&str> = deployments
            .iter()
            .filter(|d| d.booted || d.staged)
            .map(|d| d.checksum.as_str())
            .collect();
        let missing = self.labels.lock().unwrap_or_else(|p| p.into_inner()).due(
            &deployed,
            &wanted,
            Instant::now(),
        );
        if !missing.is_empty() {
            let read = self.read_configs(&missing).await;
            let now = Instant::now();
            let mut cache = self.labels.lock().unwrap_or_else(|p| p.into_inner());
            for commit in &missing {
                let labels = match &read {
                    Err(e) => Err(e.clone()),
                    Ok(answer) => match answer.get(commit) {
                        None => Err(LabelsError::Unanswered),
                        Some(Err(e)) => Err(LabelsError::Commit(e.clone())),
                        Some(Ok(config)) => labels_of_config(config.as_deref()),
                    },
                };
                match labels {
                    Ok(l) => {
                        debug!(%commit, labels = l.len(), "read the image labels of a deployment commit");
                        cache.record(commit, Ok(l), now);
                    }
                    Err(e) => {
                        if cache.record(commit, Err(e.clone()), now) {
                            warn!(%commit, error = %e, label = e.label(), retry_in = ?LABELS_RETRY, "the image labels of a deployment commit could not be read");
                        }
                    }
                }
            }
        }
        let cache = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        for d in deployments.iter_mut().filter(|d| d.booted || d.staged) {
            match cache.get(&d.checksum) {
                Ok(l) => d.image_labels = l.clone(),
                Err(why) => d.image_labels_error = Some(why.to_string()),
            }
        }
    }

    /// The helper's answer for `commits`: per commit, its configuration or why it is unknown.
    async fn read_configs(&self, commits: &[String]) -> Result<ConfigsByCommit, LabelsError> {
        use crate::backend::helper::{IMAGE_CONFIGS, ImageConfigs, run};
        let helper = self.helper.as_ref().map_err(Clone::clone)?;
        let req = ImageConfigs {
            repo: self.repo.clone(),
            commits: commits.to_vec(),
        };
        run::<crate::backend::helper::ImageConfigsAnswer>(
            helper,
            &[IMAGE_CONFIGS],
            &req,
            LABELS_TIMEOUT,
        )
        .await?
        .map_err(LabelsError::Repository)
    }
}

/// The labels of an image configuration as ostree-ext stored it on the merge commit (`config`
/// is the value of `ostree.container.image-config`): none when the key is absent or holds
/// format v0's `"null"` (bootc-dev/bootc:crates/ostree-ext/src/container/store.rs
/// `image_config_from_commitmeta` takes both as the default configuration); an error when it is
/// not JSON.
fn labels_of_config(config: Option<&str>) -> Result<BTreeMap<String, String>, LabelsError> {
    match config {
        None | Some("null") => Ok(BTreeMap::new()),
        Some(json) => Ok(crate::backend::deployment::labels_of(json)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed read is retried only after [`LABELS_RETRY`] and warned about once per reason;
    /// a read is kept; commits no longer deployed are forgotten.
    #[test]
    fn label_reads_are_kept_and_failures_retried_later() {
        let t0 = Instant::now();
        let mut c = LabelCache::default();
        let (a, b) = ("aaaa", "bbbb");
        assert_eq!(c.due(&[a, b], &[b, a, a], t0), vec!["aaaa", "bbbb"]);
        assert_eq!(c.get(a), Err(LabelsError::NotRead));
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert!(!c.record(a, Ok(labels.clone()), t0));
        assert!(
            c.record(
                b,
                Err(LabelsError::Commit(RemoteError("damaged".into()))),
                t0
            ),
            "first failure warns"
        );
        assert_eq!(c.get(a), Ok(&labels));
        assert_eq!(
            c.get(b),
            Err(LabelsError::Commit(RemoteError("damaged".into())))
        );
        let soon = t0 + LABELS_RETRY / 2;
        assert!(
            c.due(&[a, b], &[a, b], soon).is_empty(),
            "nothing before the retry"
        );
        let later = t0 + LABELS_RETRY;
        assert_eq!(c.due(&[a, b], &[a, b], later), vec!["bbbb"]);
        assert!(
            !c.record(
                b,
                Err(LabelsError::Commit(RemoteError("damaged".into()))),
                later
            ),
            "same reason: no warning"
        );
        assert!(
            c.record(
                b,
                Err(LabelsError::Commit(RemoteError("gone".into()))),
                later + LABELS_RETRY
            ),
            "new reason warns"
        );
        assert!(!c.record(b, Ok(BTreeMap::new()), later + LABELS_RETRY));
        assert_eq!(c.get(b), Ok(&BTreeMap::new()));
        // `a` is no longer deployed: forgotten, and read again if it comes back.
        assert!(c.due(&[b], &[b], later).is_empty());
        assert_eq!(c.get(a), Err(LabelsError::NotRead));
        assert_eq!(c.due(&[a, b], &[a], later), vec!["aaaa"]);
    }

    #[test]
    fn labels_come_from_the_stored_image_config() {
        let labels = labels_of_config(Some(
            r#"{"config":{"Labels":{"baseOSContainerImage":"q.io/a@sha256:00","io.openshift.os.streamclass":"rhel-9","n":1}}}"#,
        ))
        .expect("a configuration");
        assert_eq!(
            labels.get("baseOSContainerImage").map(String::as_str),
            Some("q.io/a@sha256:00")
        );
        assert_eq!(labels.len(), 2, "non-string labels are skipped: {labels:?}");
        // No key (an older ostree-ext), format v0's "null", a configuration without labels:
        // none, as ostree-ext takes them.
        for config in [None, Some("null"), Some(r#"{"config":{}}"#)] {
            assert_eq!(labels_of_config(config), Ok(BTreeMap::new()), "{config:?}");
        }
        // Malformed: unknown, not empty.
        let e = labels_of_config(Some("{not json"))
            .expect_err("malformed")
            .to_string();
        assert!(e.contains("ostree.container.image-config"), "{e}");
    }
}
