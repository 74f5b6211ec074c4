//! The object store: JSON objects keyed by resource, namespace and name, one global
//! resourceVersion counter bumped on every write, and a bounded event history that
//! watches resume from (older resourceVersions are "compacted" and answered with 410).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use super::clock;
use super::discovery::{CUSTOMRESOURCEDEFINITIONS, NAMESPACES, NODES, ResourceDef};
use super::status::ApiError;
use super::validate;

/// How many events watches can resume from.
const HISTORY: usize = 1000;
/// Live events a watcher may fall behind by before it is expired.
const BROADCAST_CAPACITY: usize = 4096;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) kind: EventType,
    pub(crate) def: &'static ResourceDef,
    pub(crate) object: Arc<Value>,
}

impl Event {
    pub(crate) fn is_for(&self, def: &ResourceDef) -> bool {
        self.def.group == def.group && self.def.plural == def.plural
    }
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource: everything but `status` (for types with a status subresource).
    Main,
    /// The `status` subresource: only `status`.
    Status,
    /// The server itself (graceful deletion, controllers it stands in for): the whole object,
    /// including the system-owned metadata clients cannot write.
    System,
}

/// Metadata only the server writes: a client's value is replaced by the stored one.
const SYSTEM_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// The object without `metadata` and `status`: what a generation counts changes of.
fn spec_part(obj: &Value) -> Value {
    let mut rest = obj.clone();
    if let Some(map) = rest.as_object_mut() {
        for field in ["metadata", "status", "kind", "apiVersion"] {
            map.remove(field);
        }
    }
    rest
}

/// `metadata.finalizers` of `obj`.
pub(crate) fn finalizers(obj: &Value) -> &[Value] {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// An object being deleted may lose finalizers but gain none
/// (kubernetes/apiserver:pkg/registry/rest/update.go `BeforeUpdate`: "no new finalizers can be
/// added if the object is being deleted").
fn finalizers_on_update(
    def: &ResourceDef,
    name: &str,
    current: &Value,
    next: &Value,
) -> Result<(), ApiError> {
    let added: Vec<&Value> = finalizers(next)
        .iter()
        .filter(|f| !finalizers(current).contains(f))
        .collect();
    if added.is_empty() {
        return Ok(());
    }
    let added: Vec<&str> = added.iter().filter_map(|f| f.as_str()).collect();
    Err(ApiError::invalid(
        def,
        name,
        &[(
            "metadata.finalizers".into(),
            format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{}]",
                added.join(" ")
            ),
        )],
    ))
}

/// An update that removes the last finalizer of an object deleted without grace period deletes
/// it (kubernetes/apiserver:pkg/registry/generic/registry/store.go `ShouldDeleteDuringUpdate`).
fn deleted_by_update(next: &Value) -> bool {
    finalizers(next).is_empty()
        && next.pointer("/metadata/deletionGracePeriodSeconds") == Some(&json!(0))
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    group: &'static str,
    plural: &'static str,
    namespace: String,
    name: String,
}

impl Key {
    fn new(def: &'static ResourceDef, namespace: Option<&str>, name: &str) -> Self {
        Key {
            group: def.group,
            plural: def.plural,
            namespace: namespace.unwrap_or_default().to_string(),
            name: name.to_string(),
        }
    }
}

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a resourceVersion below this get 410 Expired.
    compacted: u64,
    uids: u64,
}

/// Where a watch starts.
pub(crate) enum WatchStart {
    /// The requested resourceVersion is older than the history.
    Expired(ApiError),
    /// Events to send first, then live events newer than `rv`.
    Ready {
        backlog: VecDeque<Arc<Event>>,
        rx: broadcast::Receiver<Arc<Event>>,
        rv: u64,
    },
}

/// The object store shared by all requests.
pub(crate) struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    uid_seed: [u8; 16],
}

fn rv_of(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(field.to_string(), value);
    }
}

/// The stored CustomResourceDefinition that defines `def`, if it is a custom resource.
fn crd_of<'a>(inner: &'a Inner, def: &ResourceDef) -> Option<&'a Value> {
    if !def.custom {
        return None;
    }
    let name = format!("{}.{}", def.plural, def.group);
    inner
        .objects
        .get(&Key::new(&CUSTOMRESOURCEDEFINITIONS, None, &name))
        .map(|crd| crd.as_ref())
}

impl Store {
    pub(crate) fn new(uid_seed: [u8; 16]) -> Self {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                uids: 0,
            }),
            tx,
            uid_seed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves the store consistent, so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh random-looking (version 4 layout) UID and 5-character name suffix.
    fn next_uid(&self, inner: &mut Inner) -> (String, String) {
        inner.uids += 1;
        let mut h = Sha256::new();
        h.update(self.uid_seed);
        h.update(inner.uids.to_be_bytes());
        let mut b: [u8; 32] = h.finalize().into();
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let hex: String = b[..16].iter().map(|x| format!("{x:02x}")).collect();
        let uid = format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        );
        // The alphabet apiserver's generateName uses (no vowels, no confusable digits).
        const SUFFIX: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let suffix = b[16..21]
            .iter()
            .map(|x| char::from(SUFFIX[usize::from(*x) % SUFFIX.len()]))
            .collect();
        (uid, suffix)
    }

    fn commit(
        &self,
        inner: &mut Inner,
        def: &'static ResourceDef,
        key: Key,
        mut obj: Value,
        kind: EventType,
    ) -> Arc<Value> {
        inner.rv += 1;
        set_meta(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
        let obj = Arc::new(obj);
        if kind == EventType::Deleted {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key, obj.clone());
        }
        let event = Arc::new(Event {
            rv: inner.rv,
            kind,
            def,
            object: obj.clone(),
        });
        inner.history.push_back(event.clone());
        while inner.history.len() > HISTORY {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        // No receivers just means nobody is watching.
        let _ = self.tx.send(event);
        obj
    }

    /// The object, or 404.
    pub(crate) fn get(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.lock()
            .objects
            .get(&Key::new(def, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))
    }

    /// Objects of `def` (in `namespace`, or all) accepted by `keep`, and the current resourceVersion.
    pub(crate) fn list(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        keep: impl Fn(&Value) -> bool,
    ) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let start = Key::new(def, namespace, "");
        let items = inner
            .objects
            .range(start..)
            .take_while(|(k, _)| {
                k.group == def.group
                    && k.plural == def.plural
                    && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .filter(|(_, v)| keep(v))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Creates an object: fills kind, namespace, name (from `generateName`), uid and
    /// creationTimestamp; 409 if it exists.
    pub(crate) fn create(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let Some(map) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        };
        if let Some(kind) = map.get("kind").and_then(Value::as_str)
            && kind != def.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the object ({kind}) does not match the resource ({})",
                def.kind
            )));
        }
        map.insert("kind".into(), json!(def.kind));
        map.insert("apiVersion".into(), json!(def.api_version()));
        if def.custom && def.status_subresource {
            // As for custom resources in a cluster: only the status subresource writes status.
            map.remove("status");
        }
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        if def.namespaced {
            let ns = namespace.unwrap_or_default();
            match meta.get("namespace").and_then(Value::as_str) {
                Some(given) if !given.is_empty() && given != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
            meta.insert("namespace".into(), json!(ns));
        } else {
            meta.remove("namespace");
        }
        let mut inner = self.lock();
        let (uid, suffix) = self.next_uid(&mut inner);
        let name = match (
            meta.get("name").and_then(Value::as_str),
            meta.get("generateName").and_then(Value::as_str),
        ) {
            (Some(name), _) if !name.is_empty() => name.to_string(),
            (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{suffix}"),
            _ => {
                return Err(ApiError::invalid(
                    def,
                    "",
                    &[(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        };
        meta.insert("name".into(), json!(name));
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), json!(clock::now_rfc3339()));
        for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(field);
        }
        if def.generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        validate::object(def, &name, &obj)?;
        validate::custom_resource(crd_of(&inner, def), def, &name, &obj, None)?;
        let key = Key::new(def, namespace.filter(|_| def.namespaced), &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(def, &name));
        }
        Ok(self.commit(&mut inner, def, key, obj, EventType::Added))
    }

    /// Replaces an object with `mutate(current)` under the store lock.
    ///
    /// A `metadata.resourceVersion` in the result that differs from the stored one is a
    /// conflict (409); identity fields (`name`, `namespace`, `uid`, `creationTimestamp`)
    /// always keep their stored values; a write that changes nothing commits nothing.
    pub(crate) fn update(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        name: &str,
        scope: Scope,
        mutate: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let key = Key::new(def, namespace, name);
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let mut next = mutate(&current)?;
        if !next.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        match next.pointer("/metadata/name") {
            None | Some(Value::Null) => {}
            Some(Value::String(n)) if n == name => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    other.as_str().unwrap_or_default()
                )));
            }
        }
        let current_rv = rv_of(&current).to_string();
        match next.pointer("/metadata/resourceVersion") {
            None | Some(Value::Null) => {}
            Some(Value::String(rv)) if rv.is_empty() || *rv == current_rv => {}
            Some(_) => return Err(ApiError::conflict(def, name)),
        }
        match next.get("metadata") {
            None | Some(Value::Null) => next["metadata"] = json!({}),
            Some(Value::Object(_)) => {}
            Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
        }
        next = match scope {
            Scope::Main if def.status_subresource => {
                let mut next = next;
                match current.get("status") {
                    Some(status) => next["status"] = status.clone(),
                    None => {
                        if let Some(map) = next.as_object_mut() {
                            map.remove("status");
                        }
                    }
                }
                next
            }
            Scope::Main | Scope::System => next,
            Scope::Status => {
                let mut only_status = (*current).clone();
                only_status["status"] = next.get("status").cloned().unwrap_or(json!({}));
                only_status
            }
        };
        next["kind"] = json!(def.kind);
        next["apiVersion"] = json!(def.api_version());
        let kept = if scope == Scope::System {
            &SYSTEM_META[..4]
        } else {
            SYSTEM_META
        };
        for field in kept {
            match current.pointer(&format!("/metadata/{field}")) {
                Some(v) => set_meta(&mut next, field, v.clone()),
                None => {
                    if let Some(meta) = next["metadata"].as_object_mut() {
                        meta.remove(*field);
                    }
                }
            }
        }
        if def.generation && spec_part(&next) != spec_part(&current) {
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            set_meta(&mut next, "generation", json!(generation + 1));
        }
        validate::object(def, name, &next)?;
        validate::custom_resource(crd_of(&inner, def), def, name, &next, Some(&current))?;
        set_meta(&mut next, "resourceVersion", json!(current_rv));
        if next == *current {
            return Ok(current);
        }
        if current.pointer("/metadata/deletionTimestamp").is_some() {
            finalizers_on_update(def, name, &current, &next)?;
            if deleted_by_update(&next) {
                return Ok(self.commit(&mut inner, def, key, next, EventType::Deleted));
            }
        }
        Ok(self.commit(&mut inner, def, key, next, EventType::Modified))
    }

    /// Deletes an object and returns it as of the deletion.
    pub(crate) fn delete(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.delete_if(def, namespace, name, |_| Ok(()))
    }

    /// Deletes an object if `check` accepts it as stored (under the store lock, so nothing
    /// changes in between), and returns it as of the deletion.
    pub(crate) fn delete_if(
        &self,
        def: &'static ResourceDef,
        namespace: Option<&str>,
        name: &str,
        check: impl FnOnce(&Value) -> Result<(), ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let key = Key::new(def, namespace, name);
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        check(&current)?;
        Ok(self.commit(&mut inner, def, key, (*current).clone(), EventType::Deleted))
    }

    /// Deletes every object of `def` (all namespaces), as the removal of its CRD does.
    pub(crate) fn delete_all(&self, def: &'static ResourceDef) {
        let (objects, _) = self.list(def, None, |_| true);
        for obj in objects {
            let meta = |f: &str| {
                obj.pointer(&format!("/metadata/{f}"))
                    .and_then(Value::as_str)
            };
            if let Some(name) = meta("name") {
                // Gone already is what we want.
                let _ = self.delete(def, meta("namespace"), name);
            }
        }
    }

    /// Starts a watch on `def` from resourceVersion `from` (`None`: the current state as
    /// ADDED events, like the real server for `resourceVersion` unset or "0").
    pub(crate) fn watch(&self, def: &'static ResourceDef, from: Option<u64>) -> WatchStart {
        let inner = self.lock();
        // Subscribing under the lock: every later commit reaches `rx`, none is missed.
        let rx = self.tx.subscribe();
        let backlog = match from {
            None => inner
                .objects
                .range(Key::new(def, None, "")..)
                .take_while(|(k, _)| k.group == def.group && k.plural == def.plural)
                .map(|(_, obj)| {
                    Arc::new(Event {
                        rv: rv_of(obj).parse().unwrap_or(0),
                        kind: EventType::Added,
                        def,
                        object: obj.clone(),
                    })
                })
                .collect(),
            Some(rv) if rv < inner.compacted => {
                return WatchStart::Expired(ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    inner.compacted
                )));
            }
            Some(rv) => inner
                .history
                .iter()
                .filter(|e| e.rv > rv && e.is_for(def))
                .cloned()
                .collect(),
        };
        WatchStart::Ready {
            backlog,
            rx,
            rv: inner.rv,
        }
    }

    /// Every later committed change.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Forgets the event history: resuming a watch from any older resourceVersion gets 410.
    pub(crate) fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    /// Creates the initial namespaces and the Node `node_name`.
    pub(crate) fn seed(&self, node_name: &str) -> Result<(), ApiError> {
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            self.create(
                &NAMESPACES,
                None,
                json!({
                    "metadata": { "name": ns, "labels": { "kubernetes.io/metadata.name": ns } },
                    "spec": { "finalizers": ["kubernetes"] },
                    "status": { "phase": "Active" },
                }),
            )?;
        }
        self.create_node(node_name)?;
        Ok(())
    }

    /// Creates the Node `name` as a freshly registered worker's kubelet does.
    pub(crate) fn create_node(&self, name: &str) -> Result<Arc<Value>, ApiError> {
        self.create(&NODES, None, initial_node(name))
    }
}

/// A worker Node as a freshly installed RHEL CoreOS 9.6 host's kubelet registers it.
fn initial_node(name: &str) -> Value {
    let now = clock::now_rfc3339();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": kind,
            "status": status,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
            "reason": reason,
            "message": message,
        })
    };
    let resources = json!({
        "cpu": "2",
        "ephemeral-storage": "125293548Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "8137660Ki",
        "pods": "250",
    });
    json!({
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node-role.kubernetes.io/worker": "",
                "node.openshift.io/os_id": "rhcos",
            },
            "annotations": {
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                { "type": "InternalIP", "address": "10.0.0.10" },
                { "type": "Hostname", "address": name },
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": "4f1c0a52e8b54cf7a4b1f3c1b1a0d2e9",
                "systemUUID": "4f1c0a52-e8b5-4cf7-a4b1-f3c1b1a0d2e9",
                "bootID": "9b6e1c3d-2f4a-4b8e-9c7d-1a2b3c4d5e6f",
                "kernelVersion": "5.14.0-570.60.1.el9_6.x86_64",
                "osImage": "Red Hat Enterprise Linux CoreOS 9.6",
                "containerRuntimeVersion": "cri-o://1.32.4",
                "kubeletVersion": super::discovery::KUBE_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::EVENTS;

    fn store() -> Store {
        let store = Store::new([7; 16]);
        store.seed("worker-0").expect("seed");
        store
    }

    #[test]
    fn writes_bump_the_resource_version_and_noops_do_not() {
        let store = store();
        let node = store.get(&NODES, None, "worker-0").expect("node");
        let rv: u64 = rv_of(&node).parse().expect("numeric rv");
        let same = store
            .update(&NODES, None, "worker-0", Scope::Main, |cur| Ok(cur.clone()))
            .expect("noop");
        assert_eq!(rv_of(&same), rv.to_string());
        let changed = store
            .update(&NODES, None, "worker-0", Scope::Main, |cur| {
                let mut next = cur.clone();
                next["metadata"]["annotations"]["a"] = json!("b");
                next["metadata"]["uid"] = json!("forged");
                next["status"] = json!({});
                Ok(next)
            })
            .expect("update");
        assert_eq!(rv_of(&changed), (rv + 1).to_string());
        assert_eq!(changed["metadata"]["uid"], node["metadata"]["uid"]);
        assert_eq!(changed["status"], node["status"], "status kept on main");
        let stale = store.update(&NODES, None, "worker-0", Scope::Main, |cur| {
            let mut next = cur.clone();
            next["metadata"]["resourceVersion"] = json!(rv.to_string());
            Ok(next)
        });
        assert_eq!(stale.map_err(|e| e.code).err(), Some(409));
    }

    #[test]
    fn an_object_being_deleted_goes_with_its_last_finalizer_and_gains_none() {
        let store = store();
        let set = |f: Value| {
            store.update(&NODES, None, "worker-0", Scope::Main, |cur| {
                let mut next = cur.clone();
                next["metadata"]["finalizers"] = f;
                Ok(next)
            })
        };
        set(json!(["a/one", "a/two"])).expect("finalizers");
        // What a DELETE with finalizers pending does (pods::delete).
        store
            .update(&NODES, None, "worker-0", Scope::System, |cur| {
                let mut next = cur.clone();
                next["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:00:00Z");
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                Ok(next)
            })
            .expect("marked");
        assert_eq!(
            set(json!(["a/one", "a/two", "a/three"]))
                .map_err(|e| e.code)
                .err(),
            Some(422)
        );
        set(json!(["a/two"])).expect("one removed");
        assert!(store.get(&NODES, None, "worker-0").is_ok());
        set(json!([])).expect("last removed");
        assert_eq!(
            store
                .get(&NODES, None, "worker-0")
                .map_err(|e| e.code)
                .err(),
            Some(404)
        );
    }

    #[test]
    fn watch_resumes_from_history_and_expires_after_compaction() {
        let store = store();
        let (_, rv) = store.list(&NODES, None, |_| true);
        store
            .create(
                &EVENTS,
                Some("default"),
                json!({"metadata": {"generateName": "worker-0."}}),
            )
            .expect("create");
        store
            .update(&NODES, None, "worker-0", Scope::Main, |cur| {
                let mut next = cur.clone();
                next["metadata"]["labels"]["x"] = json!("y");
                Ok(next)
            })
            .expect("update");
        match store.watch(&NODES, Some(rv)) {
            WatchStart::Ready { backlog, .. } => {
                assert_eq!(backlog.len(), 1);
                assert_eq!(backlog[0].kind, EventType::Modified);
            }
            WatchStart::Expired(_) => panic!("history should cover {rv}"),
        }
        store.compact();
        assert!(matches!(
            store.watch(&NODES, Some(rv)),
            WatchStart::Expired(e) if e.code == 410
        ));
        match store.watch(&NODES, None) {
            WatchStart::Ready { backlog, .. } => assert_eq!(backlog.len(), 1),
            WatchStart::Expired(_) => panic!("a watch from now never expires"),
        }
    }
}
