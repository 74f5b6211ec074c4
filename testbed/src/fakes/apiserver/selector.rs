//! Field and label selectors for list and watch requests.

use std::collections::BTreeSet;

use serde_json::Value;

/// `fieldSelector`: comma-separated `path=value`, `path==value` or `path!=value` terms on
/// dotted JSON paths (`metadata.name`, `involvedObject.kind`, …); a missing field is "".
#[derive(Debug, Default, Clone)]
pub(crate) struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                ));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("invalid selector: '{s}'; empty field name"));
            }
            terms.push((
                field.split('.').map(str::to_string).collect(),
                equal,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    /// Adds `metadata.name=<name>`, as a watch on a single object path implies.
    pub(crate) fn with_name(mut self, name: &str) -> Self {
        self.0
            .push((vec!["metadata".into(), "name".into()], true, name.into()));
        self
    }

    /// The dotted field names the selector tests.
    pub(crate) fn fields(&self) -> impl Iterator<Item = String> + '_ {
        self.0.iter().map(|(path, _, _)| path.join("."))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, equal, want)| {
            let have = path
                .iter()
                .try_fold(obj, |v, key| v.get(key.as_str()))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (have == *want) == *equal
        })
    }
}

#[derive(Debug, Clone)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// `labelSelector` with the equality- and set-based syntax.
#[derive(Debug, Default, Clone)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let invalid = |term: &str| format!("unable to parse requirement: {term:?}");
        let mut reqs = Vec::new();
        for term in split_outside_parens(s)
            .iter()
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
        {
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((head, set)) = term.split_once('(') {
                let set = set.strip_suffix(')').ok_or_else(|| invalid(term))?;
                let set: BTreeSet<String> = set
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                let mut words = head.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some(k), Some("in"), None) => Requirement::In(k.to_string(), set),
                    (Some(k), Some("notin"), None) => Requirement::NotIn(k.to_string(), set),
                    _ => return Err(invalid(term)),
                }
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Equals(k.trim().to_string(), v.trim().to_string())
            } else if term.contains(char::is_whitespace) {
                return Err(invalid(term));
            } else {
                Requirement::Exists(term.to_string())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, set) => label(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => label(k).is_none_or(|v| !set.contains(v)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
        })
    }
}

fn split_outside_parens(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_selector_matches_dotted_paths() {
        let ev = json!({"metadata":{"name":"e1"},"involvedObject":{"kind":"Node","name":"w0"},"count":3});
        let sel = FieldSelector::parse("involvedObject.kind=Node,metadata.name!=e2,count==3")
            .expect("valid");
        assert!(sel.matches(&ev));
        assert!(
            !FieldSelector::parse("involvedObject.name=w1")
                .expect("valid")
                .matches(&ev)
        );
        assert!(
            FieldSelector::parse("involvedObject.namespace=")
                .expect("valid")
                .matches(&ev)
        );
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    #[test]
    fn label_selector_supports_equality_and_sets() {
        let node = json!({"metadata":{"labels":{"kubernetes.io/os":"linux","node-role.kubernetes.io/worker":""}}});
        for (sel, want) in [
            ("", true),
            ("kubernetes.io/os=linux", true),
            ("kubernetes.io/os==windows", false),
            ("kubernetes.io/os!=windows", true),
            ("node-role.kubernetes.io/worker", true),
            ("!node-role.kubernetes.io/master", true),
            (
                "kubernetes.io/os in (linux, windows),node-role.kubernetes.io/worker",
                true,
            ),
            ("kubernetes.io/os notin (linux)", false),
            ("missing notin (x)", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).expect("valid").matches(&node),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("a in (x").is_err());
    }
}
