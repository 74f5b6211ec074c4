//! Introspection of the fake rpm-ostreed against the reference XML.

use std::collections::{BTreeMap, HashMap};

use zbus::Connection;

use super::{BUS_NAME, Env, OS, OS_PATH, Peer, SYSROOT, SYSROOT_PATH, TXN};

/// A member of an interface: kind, name, and its typed shape.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Member {
    kind: String,
    name: String,
    /// (type, direction) of each argument; signal arguments are always "out".
    args: Vec<(String, String)>,
    /// (type, access) of a property.
    property: Option<(String, String)>,
}

type Interfaces = BTreeMap<String, BTreeMap<(String, String), Member>>;

/// The tags of an XML document: (name, attributes, self-closing, closing).
fn xml_tags(xml: &str) -> Vec<(String, HashMap<String, String>, bool, bool)> {
    let mut tags = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find('<') {
        rest = &rest[start..];
        if let Some(body) = rest.strip_prefix("<!--") {
            let end = body.find("-->").expect("unterminated comment");
            rest = &body[end + 3..];
            continue;
        }
        // Find the closing '>' outside quotes (attribute values may contain '>').
        let mut quoted = false;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                '"' => quoted = !quoted,
                '>' if !quoted => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.expect("unterminated tag");
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') || tag.starts_with('?') {
            continue;
        }
        let closing = tag.starts_with('/');
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_start_matches('/').trim_end_matches('/');
        let name = tag
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let mut attrs = HashMap::new();
        let mut a = &tag[name.len()..];
        while let Some(eq) = a.find('=') {
            let key = a[..eq].trim().to_string();
            let after = &a[eq + 1..];
            let open = after.find('"').expect("quoted attribute");
            let close = after[open + 1..].find('"').expect("closing quote") + open + 1;
            attrs.insert(key, after[open + 1..close].to_string());
            a = &after[close + 1..];
        }
        tags.push((name, attrs, self_closing, closing));
    }
    tags
}

fn parse_interfaces(xml: &str) -> Interfaces {
    let mut out = Interfaces::new();
    let mut iface: Option<String> = None;
    let mut member: Option<Member> = None;
    for (name, attrs, self_closing, closing) in xml_tags(xml) {
        let attr = |k: &str| attrs.get(k).cloned().unwrap_or_default();
        match (name.as_str(), closing) {
            ("interface", false) => iface = Some(attr("name")),
            ("interface", true) => iface = None,
            ("method" | "signal", false) => {
                let m = Member {
                    kind: name.clone(),
                    name: attr("name"),
                    args: Vec::new(),
                    property: None,
                };
                if self_closing {
                    let i = iface.clone().expect("member outside interface");
                    out.entry(i)
                        .or_default()
                        .insert((m.kind.clone(), m.name.clone()), m);
                } else {
                    member = Some(m);
                }
            }
            ("method" | "signal", true) => {
                let m = member.take().expect("closing member");
                let i = iface.clone().expect("member outside interface");
                out.entry(i)
                    .or_default()
                    .insert((m.kind.clone(), m.name.clone()), m);
            }
            ("arg", false) => {
                let m = member.as_mut().expect("arg outside member");
                let direction = if m.kind == "signal" {
                    "out".to_string()
                } else {
                    attrs
                        .get("direction")
                        .cloned()
                        .unwrap_or_else(|| "in".into())
                };
                m.args.push((attr("type"), direction));
            }
            ("property", false) => {
                let i = iface.clone().expect("property outside interface");
                let m = Member {
                    kind: "property".into(),
                    name: attr("name"),
                    args: Vec::new(),
                    property: Some((attr("type"), attr("access"))),
                };
                out.entry(i)
                    .or_default()
                    .insert((m.kind.clone(), m.name.clone()), m);
            }
            _ => {}
        }
    }
    out
}

/// Every exported member that is missing from the reference or differs from it.
fn mismatches(exported: &Interfaces, reference: &Interfaces) -> Vec<String> {
    let mut out = Vec::new();
    for (iface, members) in exported {
        if iface.starts_with("org.freedesktop.DBus.") {
            continue;
        }
        let Some(ref_members) = reference.get(iface) else {
            out.push(format!("interface {iface} is not in the reference"));
            continue;
        };
        for (key, m) in members {
            match ref_members.get(key) {
                None => out.push(format!(
                    "{iface}: {} {} is not in the reference",
                    m.kind, m.name
                )),
                Some(r) if r != m => out.push(format!("{iface}: {m:?} differs from {r:?}")),
                Some(_) => {}
            }
        }
    }
    out
}

fn reference_xml() -> String {
    let path = std::env::var("RPMOSTREE_REFERENCE_XML").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/rpm-ostree/org.projectatomic.rpmostree1.xml"
        )
        .to_string()
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

async fn introspect(conn: &Connection, destination: Option<&str>, path: &str) -> String {
    conn.call_method(
        destination,
        path,
        Some("org.freedesktop.DBus.Introspectable"),
        "Introspect",
        &(),
    )
    .await
    .unwrap_or_else(|e| panic!("Introspect {path}: {e}"))
    .body()
    .deserialize::<String>()
    .expect("xml")
}

#[tokio::test]
async fn introspection_matches_the_reference_interface() {
    let env = Env::new().await;
    let reference_text = reference_xml();
    let reference = parse_interfaces(&reference_text);

    let mut exported = Interfaces::new();
    for path in [SYSROOT_PATH, OS_PATH] {
        exported.extend(parse_interfaces(
            &introspect(&env.client, Some(BUS_NAME), path).await,
        ));
    }
    let addr = env.cleanup_address(&[]).await;
    let peer = Peer::connect(&addr).await;
    exported.extend(parse_interfaces(&introspect(&peer.conn, None, "/").await));

    // Not vacuous: the members the agent relies on are all exported.
    for (iface, kind, name) in [
        (SYSROOT, "property", "Deployments"),
        (SYSROOT, "property", "ActiveTransaction"),
        (SYSROOT, "method", "RegisterClient"),
        (SYSROOT, "method", "GetOS"),
        (OS, "method", "UpdateDeployment"),
        (OS, "method", "Rebase"),
        (OS, "method", "Cleanup"),
        (OS, "method", "FinalizeDeployment"),
        (OS, "method", "GetDeploymentBootConfig"),
        (OS, "property", "DefaultDeployment"),
        (TXN, "method", "Start"),
        (TXN, "method", "Cancel"),
        (TXN, "signal", "Finished"),
        (TXN, "signal", "PercentProgress"),
        (TXN, "property", "Title"),
    ] {
        assert!(
            exported
                .get(iface)
                .is_some_and(|m| m.contains_key(&(kind.to_string(), name.to_string()))),
            "{iface} {kind} {name} is not exported"
        );
    }
    let problems = mismatches(&exported, &reference);
    assert!(problems.is_empty(), "{problems:#?}");

    // The comparison catches a changed signature.
    let mutated = reference_text.replace(
        r#"<arg type="a{sv}" name="modifiers" direction="in"/>"#,
        r#"<arg type="a{ss}" name="modifiers" direction="in"/>"#,
    );
    assert_ne!(mutated, reference_text);
    let problems = mismatches(&exported, &parse_interfaces(&mutated));
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("UpdateDeployment"), "{problems:#?}");
}
