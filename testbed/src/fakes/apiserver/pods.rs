//! Pods and what a drain meets: graceful deletion (the kubelet's part played by a timer),
//! PodDisruptionBudget status (the disruption controller's part, recomputed after every pod or
//! budget write) and the `pods/eviction` subresource with its budget checks.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::Shared;
use super::clock;
use super::discovery::{PODDISRUPTIONBUDGETS, PODS, ResourceDef};
use super::status::ApiError;
use super::store::{Scope, Store};

/// The default `spec.terminationGracePeriodSeconds` (kubernetes/kubernetes:
/// pkg/apis/core/v1/defaults.go, `SetDefaults_PodSpec`).
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// How long an eviction the disruption controller has not yet seen keeps a pod out of the
/// healthy count (kubernetes/kubernetes: pkg/controller/disruption/disruption.go,
/// `DeletionTimeout`).
const DISRUPTED_POD_TIMEOUT_SECS: i64 = 2 * 60;

/// The 429 message of a blocked eviction (kubernetes/kubernetes:
/// pkg/registry/core/pod/storage/eviction.go, `checkAndDecrement`).
pub(crate) const EVICTION_BLOCKED: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

/// The parts of `metav1.DeleteOptions` the fake honours.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOptions {
    grace_period_seconds: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

impl DeleteOptions {
    /// Reads a DeleteOptions object (`null` or absent: the defaults).
    pub(crate) fn from_value(v: &Value) -> Result<DeleteOptions, ApiError> {
        if v.is_null() {
            return Ok(DeleteOptions::default());
        }
        if !v.is_object() {
            return Err(ApiError::bad_request("DeleteOptions must be an object"));
        }
        let grace =
            match &v["gracePeriodSeconds"] {
                Value::Null => None,
                g => Some(g.as_i64().ok_or_else(|| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {g}"))
                })?),
            };
        let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(String::from);
        let dry_run = match &v["dryRun"] {
            Value::Null => false,
            Value::Array(a) if a.is_empty() => false,
            Value::Array(a) if a.len() == 1 && a[0] == "All" => true,
            other => {
                return Err(ApiError::bad_request(format!(
                    "Invalid value: {other}: supported values: \"All\""
                )));
            }
        };
        Ok(DeleteOptions {
            grace_period_seconds: grace,
            uid: text("/preconditions/uid"),
            resource_version: text("/preconditions/resourceVersion"),
            dry_run,
        })
    }

    /// Whether nothing is to be written (`dryRun: ["All"]`).
    pub(crate) fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// Reads the body of a DELETE request (empty: the defaults).
    pub(crate) fn from_body(body: &[u8]) -> Result<DeleteOptions, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(DeleteOptions::default());
        }
        let v: Value = serde_json::from_slice(body).map_err(|err| {
            ApiError::bad_request(format!("the request body is not valid JSON: {err}"))
        })?;
        Self::from_value(&v)
    }

    /// The preconditions, as the storage layer checks them
    /// (kubernetes/apiserver: pkg/storage/interfaces.go, `Preconditions.Check`).
    fn check(&self, def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
        let meta = |f: &str| {
            obj.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        if let Some(uid) = &self.uid
            && *uid != meta("uid")
        {
            return Err(ApiError::conflict_because(
                def,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta("uid")
                ),
            ));
        }
        if let Some(rv) = &self.resource_version
            && *rv != meta("resourceVersion")
        {
            return Err(ApiError::conflict_because(
                def,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta("resourceVersion")
                ),
            ));
        }
        Ok(())
    }
}

/// Pod defaulting and the create strategy (kubernetes/kubernetes: pkg/registry/core/pod/strategy.go,
/// `PrepareForCreate`): the status starts as `Pending` whatever the client sent.
pub(crate) fn prepare_create(pod: &mut Value) {
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("terminationGracePeriodSeconds")
            .or_insert(json!(DEFAULT_GRACE_SECONDS));
    }
    if let Some(map) = pod.as_object_mut() {
        map.insert("status".into(), json!({ "phase": "Pending" }));
    }
}

/// Deletes an object as `DELETE` does, honouring the options' preconditions and dry run. A pod
/// bound to a node and not terminal is deleted gracefully (kubernetes/kubernetes:
/// pkg/registry/core/pod/strategy.go, `CheckGracefulDelete`; kubernetes/apiserver:
/// pkg/registry/rest/delete.go, `BeforeDelete`): it gets `deletionTimestamp` and
/// `deletionGracePeriodSeconds` and stays until its kubelet removes it, which the fake does
/// after the `pod-removal` delay (at most the grace period).
pub(crate) fn delete(
    shared: &Arc<Shared>,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Arc<Value>, ApiError> {
    let store = &shared.store;
    let current = store.get(def, ns, name)?;
    opts.check(def, name, &current)?;
    let grace = if std::ptr::eq(def, &PODS) {
        grace_period(&current, opts)
    } else {
        0
    };
    if opts.dry_run {
        return Ok(current);
    }
    let result = if grace > 0 {
        let marked = store.update(def, ns, name, Scope::System, |cur| {
            opts.check(def, name, cur)?;
            let mut next = cur.clone();
            let existing = cur
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64);
            // A second delete may only shorten the grace period.
            if existing.is_none_or(|e| grace < e) {
                next["metadata"]["deletionTimestamp"] =
                    json!(clock::format_rfc3339(clock::now_secs() + grace));
                next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            }
            Ok(next)
        })?;
        schedule_removal(shared, ns, name, &marked, grace);
        marked
    } else if !super::store::finalizers(&current).is_empty() {
        // Finalizers pending: the object is only marked, and goes when an update removes the
        // last one (kubernetes/apiserver:pkg/registry/generic/registry/store.go `Delete`,
        // `updateForGracefulDeletionAndFinalizers`: deletionTimestamp now, grace period 0).
        store.update(def, ns, name, Scope::System, |cur| {
            opts.check(def, name, cur)?;
            let mut next = cur.clone();
            if cur.pointer("/metadata/deletionTimestamp").is_none() {
                next["metadata"]["deletionTimestamp"] =
                    json!(clock::format_rfc3339(clock::now_secs()));
                next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            Ok(next)
        })?
    } else {
        store.delete_if(def, ns, name, |cur| opts.check(def, name, cur))?
    };
    if std::ptr::eq(def, &PODS)
        && let Some(ns) = ns
    {
        sync_budgets(store, ns);
    }
    Ok(result)
}

fn grace_period(pod: &Value, opts: &DeleteOptions) -> i64 {
    let mut period = opts.grace_period_seconds.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
    });
    if pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        period = 0;
    }
    if matches!(phase(pod), "Failed" | "Succeeded") {
        period = 0;
    }
    if period < 0 {
        period = 1;
    }
    period
}

/// The kubelet's part: once the containers are stopped (the `pod-removal` delay, at most the
/// grace period) it deletes the pod with grace period 0, if it is still the same pod.
fn schedule_removal(shared: &Arc<Shared>, ns: Option<&str>, name: &str, pod: &Value, grace: i64) {
    let delay = shared
        .pod_removal_delay()
        .min(Duration::from_secs(grace.unsigned_abs()));
    let uid = pod.pointer("/metadata/uid").cloned().unwrap_or_default();
    let (shared, ns, name) = (shared.clone(), ns.map(String::from), name.to_string());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let removed = shared.store.delete_if(&PODS, ns.as_deref(), &name, |cur| {
            if cur.pointer("/metadata/uid") == Some(&uid) {
                Ok(())
            } else {
                Err(ApiError::conflict(&PODS, &name))
            }
        });
        if removed.is_ok()
            && let Some(ns) = &ns
        {
            sync_budgets(&shared.store, ns);
        }
    });
}

fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `podutil.IsPodReady`: the `Ready` condition is `True`.
fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn terminating(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// Whether a `metav1.LabelSelector` object selects `labels`; `None` if the selector is invalid.
fn selects(selector: &Value, labels: &Value) -> Option<bool> {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
        if label(k) != Some(v.as_str()?) {
            return Some(false);
        }
    }
    for expr in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expr["key"].as_str()?;
        let values: Vec<&str> = expr["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let have = label(key);
        let ok = match expr["operator"].as_str()? {
            "In" => have.is_some_and(|h| values.contains(&h)),
            "NotIn" => have.is_none_or(|h| !values.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => return None,
        };
        if !ok {
            return Some(false);
        }
    }
    Some(true)
}

fn selector_is_empty(selector: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .is_none_or(Map::is_empty)
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(Vec::is_empty)
}

/// An int-or-percent against `total`, rounded up (`intstr.GetScaledValueFromIntOrPercent(…, true)`).
fn scaled(v: &Value, total: i64) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    let pct: i64 = v.as_str()?.strip_suffix('%')?.parse().ok()?;
    Some((pct * total + 99) / 100)
}

/// The disruption controller's status for `pdb` given the namespace's pods
/// (kubernetes/kubernetes: pkg/controller/disruption/disruption.go, `trySync`,
/// `getExpectedPodCount`, `countHealthyPods`, `buildDisruptedPodMap`, `updatePdbStatus`).
/// The fake has no workload controllers, so the expected count is the number of selected pods
/// (the real controller asks the pods' owners for their scale for percentages and
/// `maxUnavailable`).
fn budget_status(pdb: &Value, pods: &[Arc<Value>], now: i64) -> Value {
    let selector = &pdb["spec"]["selector"];
    let selected: Vec<&Value> = if selector.is_null() {
        Vec::new()
    } else {
        pods.iter()
            .map(|p| &**p)
            .filter(|p| selects(selector, &p["metadata"]["labels"]) == Some(true))
            .collect()
    };
    let expected = selected.len() as i64;
    let spec = &pdb["spec"];
    let desired = if !spec["maxUnavailable"].is_null() {
        (expected - scaled(&spec["maxUnavailable"], expected).unwrap_or(0)).max(0)
    } else if !spec["minAvailable"].is_null() {
        scaled(&spec["minAvailable"], expected).unwrap_or(0)
    } else {
        0
    };
    // Evictions the controller has not seen complete: dropped once the pod is going or gone.
    let mut disrupted = Map::new();
    for (pod_name, at) in pdb
        .pointer("/status/disruptedPods")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let pod = selected
            .iter()
            .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(pod_name));
        let fresh = at
            .as_str()
            .and_then(clock::parse_rfc3339)
            .is_some_and(|t| t + DISRUPTED_POD_TIMEOUT_SECS > now);
        if pod.is_some_and(|p| !terminating(p)) && fresh {
            disrupted.insert(pod_name.clone(), at.clone());
        }
    }
    let healthy = selected
        .iter()
        .filter(|p| {
            !terminating(p)
                && !disrupted.contains_key(
                    p.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                )
                && is_ready(p)
        })
        .count() as i64;
    let allowed = if expected <= 0 || healthy - desired <= 0 {
        0
    } else {
        healthy - desired
    };
    let generation = pdb
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(0));
    let mut status = json!({
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [allowed_condition(pdb, allowed, &generation)],
    });
    if !disrupted.is_empty() {
        status["disruptedPods"] = Value::Object(disrupted);
    }
    status
}

/// The `DisruptionAllowed` condition (kubernetes/component-helpers:
/// apps/poddisruptionbudget/helpers.go, `UpdateDisruptionAllowedCondition`); its transition time
/// moves only when its status does.
fn allowed_condition(pdb: &Value, allowed: i64, generation: &Value) -> Value {
    let (status, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let previous = pdb
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionAllowed"));
    let since = match previous {
        Some(p) if p["status"] == status => p["lastTransitionTime"].clone(),
        _ => json!(clock::now_rfc3339()),
    };
    json!({
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": "",
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

/// Recomputes the status of every PodDisruptionBudget in `ns` (the disruption controller).
pub(crate) fn sync_budgets(store: &Store, ns: &str) {
    let (pods, _) = store.list(&PODS, Some(ns), |_| true);
    let (pdbs, _) = store.list(&PODDISRUPTIONBUDGETS, Some(ns), |_| true);
    let now = clock::now_secs();
    for pdb in pdbs {
        let Some(name) = pdb.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        let result = store.update(
            &PODDISRUPTIONBUDGETS,
            Some(ns),
            name,
            Scope::Status,
            |cur| {
                let mut next = cur.clone();
                next["status"] = budget_status(cur, &pods, now);
                Ok(next)
            },
        );
        if let Err(err) = result {
            tracing::debug!(
                pdb = name,
                error = err.message,
                "apiserver pdb status not updated"
            );
        }
    }
}

/// The 429 with a `DisruptionBudget` cause the eviction handler answers.
fn blocked(message: &str, cause: String, retry_after: u32) -> ApiError {
    ApiError::too_many_requests_because(message, "DisruptionBudget", &cause, retry_after)
}

/// `POST …/pods/<name>/eviction` (kubernetes/kubernetes: pkg/registry/core/pod/storage/eviction.go,
/// `EvictionREST.Create`): a pod that is pending, terminal or already terminating is deleted
/// without a budget check; one covered by more than one budget is a 500; a covered one is
/// deleted only if its budget allows a disruption, which the eviction takes (decrement and
/// `disruptedPods`), else 429 TooManyRequests. Returns the `Status` of a successful eviction.
pub(crate) fn evict(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    eviction: &Value,
) -> Result<Value, ApiError> {
    if eviction.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let mut opts = DeleteOptions::from_value(&eviction["deleteOptions"])?;
    let store = &shared.store;
    let pod = store.get(&PODS, Some(ns), name)?;
    let success =
        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" });
    let rv = pod
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(String::from);
    let pinned = |opts: &DeleteOptions| {
        let mut pinned = opts.clone();
        if pinned.resource_version.is_none() {
            pinned.resource_version = rv.clone();
        }
        pinned
    };
    if matches!(phase(&pod), "Succeeded" | "Failed" | "Pending") || terminating(&pod) {
        let terminal = matches!(phase(&pod), "Succeeded" | "Failed") || terminating(&pod);
        let opts = if terminal { opts } else { pinned(&opts) };
        delete(shared, &PODS, Some(ns), name, &opts)?;
        return Ok(success);
    }
    let labels = &pod["metadata"]["labels"];
    let (budgets, _) = store.list(&PODDISRUPTIONBUDGETS, Some(ns), |pdb| {
        let sel = &pdb["spec"]["selector"];
        // A nil or empty selector matches nothing here, whatever the controller counts.
        !sel.is_null() && !selector_is_empty(sel) && selects(sel, labels) == Some(true)
    });
    match budgets.as_slice() {
        [] => {}
        [pdb] => {
            let pdb_name = pdb["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let status = &pdb["status"];
            let num = |f: &str| status[f].as_i64().unwrap_or(0);
            if !is_ready(&pod)
                && num("currentHealthy") >= num("desiredHealthy")
                && num("desiredHealthy") > 0
            {
                // An unready pod does not count as healthy: evict it without taking a
                // disruption, unless it became ready meanwhile.
                opts = pinned(&opts);
                return match delete(shared, &PODS, Some(ns), name, &opts) {
                    Ok(_) => Ok(success),
                    Err(err) if err.code == 409 => Err(blocked(
                        EVICTION_BLOCKED,
                        format!(
                            "The disruption budget {pdb_name} is still being processed by the server."
                        ),
                        10,
                    )),
                    Err(err) => Err(err),
                };
            }
            let dry_run = opts.dry_run;
            let pod_name = name.to_string();
            let update = |cur: &Value| -> Result<Value, ApiError> {
                take_disruption(cur, &pod_name, dry_run)
            };
            if dry_run {
                update(pdb)?;
            } else {
                store.update(
                    &PODDISRUPTIONBUDGETS,
                    Some(ns),
                    &pdb_name,
                    Scope::Status,
                    update,
                )?;
            }
        }
        _ => {
            return Err(ApiError::status_failure(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    }
    delete(shared, &PODS, Some(ns), name, &opts)?;
    Ok(success)
}

/// `checkAndDecrement`: the budget's status after the eviction of `pod`, or why it is refused.
fn take_disruption(pdb: &Value, pod: &str, dry_run: bool) -> Result<Value, ApiError> {
    let name = pdb["metadata"]["name"].as_str().unwrap_or_default();
    let status = &pdb["status"];
    let num = |f: &str| status[f].as_i64().unwrap_or(0);
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(0);
    if num("observedGeneration") < generation {
        return Err(blocked(
            EVICTION_BLOCKED,
            format!("The disruption budget {name} is still being processed by the server."),
            10,
        ));
    }
    let allowed = num("disruptionsAllowed");
    if allowed < 0 {
        return Err(ApiError::forbidden(
            &PODDISRUPTIONBUDGETS,
            Some(name),
            "pdb disruptions allowed is negative",
        ));
    }
    if allowed == 0 {
        return Err(blocked(
            EVICTION_BLOCKED,
            format!(
                "The disruption budget {name} needs {} healthy pods and has {} currently",
                num("desiredHealthy"),
                num("currentHealthy")
            ),
            0,
        ));
    }
    let mut next = pdb.clone();
    next["status"]["disruptionsAllowed"] = json!(allowed - 1);
    if allowed - 1 == 0 {
        let generation = next["status"]["observedGeneration"].clone();
        next["status"]["conditions"] = json!([allowed_condition(pdb, 0, &generation)]);
    }
    if !dry_run {
        next["status"]["disruptedPods"][pod] = json!(clock::now_rfc3339());
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool, labels: Value) -> Arc<Value> {
        Arc::new(json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "nodeName": "worker-0" },
            "status": { "phase": "Running", "conditions": [
                { "type": "Ready", "status": if ready { "True" } else { "False" } },
            ]},
        }))
    }

    #[test]
    fn budget_status_counts_ready_selected_pods() {
        let pods = vec![
            pod("a", true, json!({"app": "web"})),
            pod("b", true, json!({"app": "web"})),
            pod("c", false, json!({"app": "web"})),
            pod("d", true, json!({"app": "db"})),
        ];
        let pdb = |spec: Value| json!({"metadata": {"name": "p", "generation": 2}, "spec": spec});
        let s = budget_status(
            &pdb(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}})),
            &pods,
            0,
        );
        assert_eq!(
            (
                s["expectedPods"].clone(),
                s["currentHealthy"].clone(),
                s["desiredHealthy"].clone(),
                s["disruptionsAllowed"].clone()
            ),
            (json!(3), json!(2), json!(1), json!(1))
        );
        assert_eq!(s["observedGeneration"], 2);
        assert_eq!(s["conditions"][0]["reason"], "SufficientPods");
        let s = budget_status(
            &pdb(
                json!({"maxUnavailable": "50%", "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}),
            ),
            &pods,
            0,
        );
        // 50% of 3 rounds up to 2 unavailable: 1 must stay healthy.
        assert_eq!(
            (s["desiredHealthy"].clone(), s["disruptionsAllowed"].clone()),
            (json!(1), json!(1))
        );
        let s = budget_status(&pdb(json!({"minAvailable": 2, "selector": {}})), &pods, 0);
        assert_eq!(
            s["expectedPods"], 4,
            "an empty policy/v1 selector selects every pod"
        );
        let s = budget_status(
            &pdb(json!({"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}})),
            &pods,
            0,
        );
        assert_eq!(s["disruptionsAllowed"], 0);
        assert_eq!(s["conditions"][0]["status"], "False");
    }

    #[test]
    fn a_budget_without_disruptions_refuses_with_the_real_message() {
        let pdb = json!({"metadata": {"name": "web", "generation": 1}, "status": {
            "observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 2, "currentHealthy": 2}});
        let err = take_disruption(&pdb, "a", false).expect_err("blocked");
        assert_eq!(err.code, 429);
        assert_eq!(err.message, EVICTION_BLOCKED);
        assert_eq!(
            err.status()["details"]["causes"][0],
            json!({"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"})
        );
        let mut ok = pdb.clone();
        ok["status"]["disruptionsAllowed"] = json!(1);
        let next = take_disruption(&ok, "a", false).expect("allowed");
        assert_eq!(next["status"]["disruptionsAllowed"], 0);
        assert!(next["status"]["disruptedPods"]["a"].is_string());
        let mut stale = ok.clone();
        stale["metadata"]["generation"] = json!(2);
        let err = take_disruption(&stale, "a", false).expect_err("unobserved generation");
        assert_eq!(err.status()["details"]["retryAfterSeconds"], 10);
    }
}
