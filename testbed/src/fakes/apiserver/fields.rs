//! Field ownership for server-side apply: which field manager last set which field, by `Apply` or
//! by an ordinary write (`Update`), and the conflicts an apply meets
//! (kubernetes/apimachinery: pkg/util/managedfields, `FieldManager`; sigs.k8s.io/structured-merge-diff:
//! merge/update.go, `Updater.Apply` and `Updater.Update`).
//!
//! Kept beside the store, not in `metadata.managedFields`: fields are dotted paths to leaves
//! (maps are walked, lists are atomic), and a manager that stops applying a field does not remove
//! it. What it keeps true is what leader election relies on: an apply that would change a field
//! another manager owns is a 409 Conflict unless forced, an update takes ownership of what it
//! changes, and a removed field is owned by no one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use serde_json::{Value, json};

use super::discovery::ResourceDef;
use super::status::ApiError;

/// One manager's fields, by operation.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    apply: bool,
    fields: BTreeSet<String>,
}

type ObjectKey = (String, String, String);

/// Who applies: the field manager, and whether it forces conflicts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applier<'a> {
    pub(crate) manager: &'a str,
    pub(crate) force: bool,
}

/// Every object's owners.
#[derive(Default)]
pub(crate) struct ManagedFields(Mutex<HashMap<ObjectKey, Vec<Entry>>>);

fn key(def: &ResourceDef, ns: Option<&str>, name: &str) -> ObjectKey {
    (
        def.qualified(),
        ns.unwrap_or_default().to_string(),
        name.to_string(),
    )
}

/// The leaf fields of an object and their values (`metadata` only for labels and annotations).
pub(crate) fn leaves(obj: &Value) -> BTreeMap<String, Value> {
    fn walk(prefix: String, v: &Value, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, child) in map {
                    walk(format!("{prefix}.{k}"), child, out);
                }
            }
            _ => {
                out.insert(prefix, v.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    for (k, v) in obj.as_object().into_iter().flatten() {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for part in ["labels", "annotations"] {
                    if let Some(map) = v.get(part).and_then(Value::as_object) {
                        for (lk, lv) in map {
                            out.insert(format!(".metadata.{part}.{lk}"), lv.clone());
                        }
                    }
                }
            }
            _ => walk(format!(".{k}"), v, &mut out),
        }
    }
    out
}

impl ManagedFields {
    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectKey, Vec<Entry>>> {
        // Ownership stays meaningful even if a holder panicked.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An ordinary write by `manager` changed `before` into `after`: it owns what it changed,
    /// nobody owns what it removed.
    pub(crate) fn updated(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        before: Option<&Value>,
        after: &Value,
        manager: &str,
    ) {
        let old = before.map(leaves).unwrap_or_default();
        let new = leaves(after);
        let changed: BTreeSet<String> = new
            .iter()
            .filter(|(p, v)| old.get(*p) != Some(v))
            .map(|(p, _)| p.clone())
            .collect();
        let removed: BTreeSet<String> = old
            .keys()
            .filter(|p| !new.contains_key(*p))
            .cloned()
            .collect();
        let mut all = self.lock();
        let entries = all.entry(key(def, ns, name)).or_default();
        for e in entries.iter_mut() {
            e.fields
                .retain(|f| !changed.contains(f) && !removed.contains(f));
        }
        match entries
            .iter_mut()
            .find(|e| e.manager == manager && !e.apply)
        {
            Some(e) => e.fields.extend(changed),
            None => entries.push(Entry {
                manager: manager.to_string(),
                apply: false,
                fields: changed,
            }),
        }
        entries.retain(|e| !e.fields.is_empty());
    }

    /// Checks an apply of `applied` by `manager` onto `current` (`None`: it creates the object):
    /// a field it would change that another manager owns is a conflict, a 409 unless `force`.
    pub(crate) fn check_apply(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        current: Option<&Value>,
        applied: &Value,
        by: Applier<'_>,
    ) -> Result<(), ApiError> {
        let Applier { manager, force } = by;
        let Some(current) = current else {
            return Ok(());
        };
        let have = leaves(current);
        let want = leaves(applied);
        let all = self.lock();
        let mut conflicts: Vec<(String, String)> = Vec::new();
        for e in all.get(&key(def, ns, name)).into_iter().flatten() {
            if e.manager == manager && e.apply {
                continue;
            }
            for f in &e.fields {
                if let Some(v) = want.get(f)
                    && have.get(f) != Some(v)
                {
                    conflicts.push((e.manager.clone(), f.clone()));
                }
            }
        }
        if conflicts.is_empty() || force {
            return Ok(());
        }
        Err(conflict(def, name, &conflicts))
    }

    /// After a successful apply: `manager` owns exactly the applied fields by `Apply`; a forced
    /// apply took them from everyone else, and what it changed is no one else's either.
    pub(crate) fn applied(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        before: Option<&Value>,
        applied: &Value,
        by: Applier<'_>,
    ) {
        let Applier { manager, force } = by;
        let old = before.map(leaves).unwrap_or_default();
        let want = leaves(applied);
        let taken: BTreeSet<String> = want
            .iter()
            .filter(|(p, v)| force || old.get(*p) != Some(v))
            .map(|(p, _)| p.clone())
            .collect();
        let mut all = self.lock();
        let entries = all.entry(key(def, ns, name)).or_default();
        for e in entries
            .iter_mut()
            .filter(|e| !(e.manager == manager && e.apply))
        {
            e.fields.retain(|f| !taken.contains(f));
        }
        entries.retain(|e| e.manager != manager || !e.apply);
        entries.push(Entry {
            manager: manager.to_string(),
            apply: true,
            fields: want.into_keys().collect(),
        });
        entries.retain(|e| !e.fields.is_empty());
    }

    /// The object is gone.
    pub(crate) fn forget(&self, def: &ResourceDef, ns: Option<&str>, name: &str) {
        self.lock().remove(&key(def, ns, name));
    }
}

/// The 409 of a conflicting apply, worded as the field manager words it.
fn conflict(def: &ResourceDef, name: &str, conflicts: &[(String, String)]) -> ApiError {
    let api_version = def.api_version();
    let lines: Vec<String> = conflicts
        .iter()
        .map(|(m, f)| format!("conflict with {m:?} using {api_version}: {f}"))
        .collect();
    let message = if lines.len() == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!(
            "Apply failed with {} conflicts: {}",
            lines.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, f)| {
            json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with {m:?} using {api_version}"),
                "field": f,
            })
        })
        .collect();
    ApiError::conflict_with_causes(def, name, message, causes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::LEASES;

    fn lease(holder: &str) -> Value {
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
    }

    #[test]
    fn an_apply_conflicts_with_another_managers_field_until_it_is_removed() {
        let m = ManagedFields::default();
        let ns = Some("default");
        let by = |manager, force| Applier { manager, force };
        m.applied(&LEASES, ns, "l", None, &lease("a"), by("a", false));
        let current = lease("a");
        let err = m
            .check_apply(
                &LEASES,
                ns,
                "l",
                Some(&current),
                &lease("b"),
                by("b", false),
            )
            .expect_err("conflict");
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"a\" using coordination.k8s.io/v1: .spec.holderIdentity"
        );
        assert!(
            m.check_apply(&LEASES, ns, "l", Some(&current), &lease("b"), by("b", true))
                .is_ok()
        );
        // The same value is shared ownership, not a conflict.
        assert!(
            m.check_apply(
                &LEASES,
                ns,
                "l",
                Some(&current),
                &lease("a"),
                by("b", false)
            )
            .is_ok()
        );
        // b removes the holder with an ordinary patch: nobody owns it, b's apply goes through.
        let released = json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 15}});
        m.updated(&LEASES, ns, "l", Some(&current), &released, "b");
        assert!(
            m.check_apply(
                &LEASES,
                ns,
                "l",
                Some(&released),
                &lease("b"),
                by("b", false)
            )
            .is_ok()
        );
    }
}
