//! Server-side printing: the `meta.k8s.io/v1` `Table` kubectl asks for when it prints
//! human-readable output, with the columns the real server uses for each type.

use std::sync::Arc;

use serde_json::{Value, json};

use super::clock;
use super::discovery::ResourceDef;

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// A request's wish for a Table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableOptions {
    include: IncludeObject,
}

impl TableOptions {
    /// `Some` if `accept` asks for a Table (`application/json;as=Table;v=v1;g=meta.k8s.io`).
    pub(crate) fn from_request(accept: &str, include_object: Option<&str>) -> Option<Self> {
        let wants = accept.split(',').any(|media| {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            params.contains(&"as=Table") && params.contains(&"g=meta.k8s.io")
        });
        let include = match include_object {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        };
        wants.then_some(TableOptions { include })
    }
}

struct Column {
    name: &'static str,
    format: &'static str,
    priority: u8,
    description: &'static str,
}

const fn col(name: &'static str, priority: u8, description: &'static str) -> Column {
    Column {
        name,
        format: "",
        priority,
        description,
    }
}

const NAME: Column = Column {
    name: "Name",
    format: "name",
    priority: 0,
    description: "Name must be unique within a namespace.",
};

const NODE_COLUMNS: &[Column] = &[
    NAME,
    col("Status", 0, "The status of the node"),
    col("Roles", 0, "The roles of the node"),
    col("Age", 0, "CreationTimestamp of the node"),
    col("Version", 0, "Kubelet Version reported by the node."),
    col("Internal-IP", 1, "List of internal IPs."),
    col("External-IP", 1, "List of external IPs."),
    col("OS-Image", 1, "OS Image reported by the node."),
    col("Kernel-Version", 1, "Kernel Version reported by the node."),
    col(
        "Container-Runtime",
        1,
        "Container Runtime Version reported by the node.",
    ),
];

const EVENT_COLUMNS: &[Column] = &[
    col(
        "Last Seen",
        0,
        "The time at which the most recent occurrence of this event was recorded.",
    ),
    col("Type", 0, "Type of this event (Normal, Warning)."),
    col(
        "Reason",
        0,
        "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.",
    ),
    col("Object", 0, "The object that this event is about."),
    col(
        "Subobject",
        1,
        "The field of the object the event is about.",
    ),
    col("Source", 1, "The component reporting this event."),
    col(
        "Message",
        0,
        "A human-readable description of the status of this operation.",
    ),
    col(
        "First Seen",
        1,
        "The time at which the event was first recorded.",
    ),
    col("Count", 1, "The number of times this event has occurred."),
    Column {
        priority: 1,
        ..NAME
    },
];

const NAMESPACE_COLUMNS: &[Column] = &[
    NAME,
    col("Status", 0, "The status of the namespace"),
    col("Age", 0, "CreationTimestamp of the namespace"),
];

const DEFAULT_COLUMNS: &[Column] = &[NAME, col("Age", 0, "CreationTimestamp of the object")];

fn columns(def: &ResourceDef) -> &'static [Column] {
    match (def.group, def.plural) {
        ("", "nodes") => NODE_COLUMNS,
        ("", "events") => EVENT_COLUMNS,
        ("", "namespaces") => NAMESPACE_COLUMNS,
        _ => DEFAULT_COLUMNS,
    }
}

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn or_none(s: String) -> String {
    if s.is_empty() { "<none>".into() } else { s }
}

fn age(obj: &Value, pointer: &str, now: i64) -> String {
    clock::parse_rfc3339(text(obj, pointer))
        .map(|t| clock::human_duration(now - t))
        .unwrap_or_else(|| "<unknown>".into())
}

fn node_cells(node: &Value, now: i64) -> Vec<Value> {
    let conditions = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut status = match conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        .and_then(|c| c.get("status").and_then(Value::as_str))
    {
        Some("True") => "Ready".to_string(),
        Some("False") => "NotReady".to_string(),
        _ => "Unknown".to_string(),
    };
    if node.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = node
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) => Some(role),
            None if k == "kubernetes.io/role" => v.as_str(),
            None => None,
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    let addresses = |kind: &str| -> String {
        node.pointer("/status/addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|a| a.get("type").and_then(Value::as_str) == Some(kind))
            .filter_map(|a| a.get("address").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        json!(text(node, "/metadata/name")),
        json!(status),
        json!(or_none(roles.join(","))),
        json!(age(node, "/metadata/creationTimestamp", now)),
        json!(text(node, "/status/nodeInfo/kubeletVersion")),
        json!(or_none(addresses("InternalIP"))),
        json!(or_none(addresses("ExternalIP"))),
        json!(or_none(text(node, "/status/nodeInfo/osImage").into())),
        json!(or_none(text(node, "/status/nodeInfo/kernelVersion").into())),
        json!(or_none(
            text(node, "/status/nodeInfo/containerRuntimeVersion").into()
        )),
    ]
}

fn event_cells(ev: &Value, now: i64) -> Vec<Value> {
    let seen = |pointers: &[&str]| -> String {
        pointers
            .iter()
            .find(|p| !text(ev, p).is_empty())
            .map(|p| age(ev, p, now))
            .unwrap_or_else(|| "<unknown>".into())
    };
    let source = [text(ev, "/source/component"), text(ev, "/source/host")]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        json!(seen(&[
            "/series/lastObservedTime",
            "/lastTimestamp",
            "/eventTime",
            "/metadata/creationTimestamp"
        ])),
        json!(text(ev, "/type")),
        json!(text(ev, "/reason")),
        json!(format!(
            "{}/{}",
            text(ev, "/involvedObject/kind").to_lowercase(),
            text(ev, "/involvedObject/name")
        )),
        json!(text(ev, "/involvedObject/fieldPath")),
        json!(source),
        json!(text(ev, "/message")),
        json!(seen(&[
            "/firstTimestamp",
            "/eventTime",
            "/metadata/creationTimestamp"
        ])),
        json!(ev.get("count").and_then(Value::as_u64).unwrap_or(1)),
        json!(text(ev, "/metadata/name")),
    ]
}

fn cells(def: &ResourceDef, obj: &Value, now: i64) -> Vec<Value> {
    match (def.group, def.plural) {
        ("", "nodes") => node_cells(obj, now),
        ("", "events") => event_cells(obj, now),
        ("", "namespaces") => vec![
            json!(text(obj, "/metadata/name")),
            json!(text(obj, "/status/phase")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ],
        _ => vec![
            json!(text(obj, "/metadata/name")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ],
    }
}

/// A Table of `objects`.
pub(crate) fn table(
    def: &ResourceDef,
    objects: &[Arc<Value>],
    resource_version: Option<u64>,
    opts: TableOptions,
) -> Value {
    let now = clock::now_secs();
    let column_definitions: Vec<Value> = columns(def)
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "type": "string",
                "format": c.format,
                "description": c.description,
                "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut row = json!({ "cells": cells(def, obj, now) });
            match opts.include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
                    });
                }
                IncludeObject::Object => row["object"] = (**obj).clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv.to_string());
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": column_definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::apiserver::discovery::NODES;

    #[test]
    fn only_meta_k8s_io_tables_are_recognised() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(TableOptions::from_request(kubectl, None).is_some());
        assert!(TableOptions::from_request("application/json", None).is_none());
    }

    #[test]
    fn node_rows_show_status_roles_and_version() {
        let node = Arc::new(json!({
            "metadata": {"name": "w0", "creationTimestamp": clock::now_rfc3339(),
                         "labels": {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/infra": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v1.32.4"}},
        }));
        let opts = TableOptions::from_request("application/json;as=Table;g=meta.k8s.io", None)
            .expect("table");
        let t = table(&NODES, &[node], Some(7), opts);
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "w0");
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "infra,worker");
        assert_eq!(cells[4], "v1.32.4");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
