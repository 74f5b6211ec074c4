//! The controller's own last writes, so that no decision rests on a cached object that has not
//! yet seen them: the node store and the pool cache are fed by watches, which bring a write back
//! a moment after the write returned. Per object it keeps the `resourceVersion` its last write
//! returned until the cache holds that version or a later one.
//!
//! The API server's resourceVersions are etcd revisions, integers that grow with every write to
//! the cluster; one the cache holds that is at least the written one has seen the write. One
//! that is not an integer (another API server) counts as seen only once equal, and an entry is
//! forgotten after [`FORGET_AFTER`], so that an object a third party wrote again meanwhile, with a
//! version of that kind, is not waited for forever.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A write the cache has not shown after this long is not waited for any more.
pub const FORGET_AFTER: Duration = Duration::from_secs(30);

/// Per object name: the version the controller's last write of it returned, and when.
#[derive(Debug, Default)]
pub struct Written {
    objects: Mutex<BTreeMap<String, (String, Instant)>>,
}

impl Written {
    /// Records that the controller's write of `name` returned `version`.
    pub fn wrote(&self, name: &str, version: String) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.insert(name.to_string(), (version, Instant::now()));
    }

    /// Whether the cache's copy of `name` at `cached` (its resourceVersion) predates the
    /// controller's last write of it; an object found caught up is forgotten.
    pub fn stale(&self, name: &str, cached: Option<&str>) -> bool {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        let Some((written, at)) = objects.get(name) else {
            return false;
        };
        let seen = cached.is_some_and(|c| newer_or_same(c, written));
        if seen || at.elapsed() > FORGET_AFTER {
            objects.remove(name);
            return false;
        }
        true
    }

    /// Forgets `name` (it is gone).
    pub fn forget(&self, name: &str) {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.remove(name);
    }
}

/// `cached` is `written` or a later version.
fn newer_or_same(cached: &str, written: &str) -> bool {
    match (cached.parse::<u64>(), written.parse::<u64>()) {
        (Ok(c), Ok(w)) => c >= w,
        _ => cached == written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_older_than_the_write_is_stale_until_the_cache_catches_up() {
        let w = Written::default();
        assert!(!w.stale("w1", Some("5")), "never written");
        w.wrote("w1", "12".into());
        assert!(w.stale("w1", Some("11")));
        assert!(w.stale("w1", None));
        assert!(!w.stale("w1", Some("13")), "a later version saw the write");
        // Forgotten once seen: an older copy (another object's numbering) is no news.
        assert!(!w.stale("w1", Some("11")));
        w.wrote("w2", "abc".into());
        assert!(
            w.stale("w2", Some("abd")),
            "not integers: only equal counts"
        );
        assert!(!w.stale("w2", Some("abc")));
    }
}
