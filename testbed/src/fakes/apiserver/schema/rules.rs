//! The `x-kubernetes-validations` CEL rules of a structural schema, compiled and evaluated as
//! kubernetes/apiextensions-apiserver: pkg/apiserver/schema/cel/validation.go does: `self` is
//! the value the rule sits on, `oldSelf` its stored value (a transition rule runs on updates
//! only), a rule that is not `true` fails with its `message` or "failed rule: <rule>".

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// Functions a rule may call: the CEL standard library that kube-apiserver's environment
/// (kubernetes/apiserver: pkg/cel/environment/base.go) and the `cel` crate both provide, plus
/// the operators and the comprehensions the macros (`has`, `all`, `exists`, …) expand to.
/// Kubernetes' own libraries (`isSorted`, `quantity`, `url`, `ip`, `format`, the strings and
/// sets extensions) are not here: a rule that calls one fails to compile, so that a schema
/// cannot depend on what this evaluator does not implement.
const FUNCTIONS: &[&str] = &[
    "size",
    "matches",
    "contains",
    "startsWith",
    "endsWith",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "dyn",
];

/// Why a rule does not compile.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Not CEL.
    #[error("compilation failed: {0}")]
    Syntax(String),
    /// A call to a function this evaluator does not provide.
    #[error("compilation failed: undeclared reference to '{0}'")]
    UnknownFunction(String),
    /// A variable other than `self` and `oldSelf`.
    #[error("compilation failed: undeclared reference to '{0}'")]
    UnknownVariable(String),
}

/// One `x-kubernetes-validations` entry and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The field path of the schema node (`spec.target`; list items as `[*]`).
    pub path: String,
    /// The CEL expression.
    pub rule: String,
    /// `message`, if given.
    pub message: Option<String>,
}

impl Rule {
    pub(crate) fn from_entry(path: &str, entry: &Value) -> Self {
        Rule {
            path: path.to_string(),
            rule: entry["rule"].as_str().unwrap_or_default().to_string(),
            message: entry["message"]
                .as_str()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from),
        }
    }

    /// The message of a failed evaluation (`ruleMessageOrDefault`).
    pub fn failure_message(&self) -> String {
        match &self.message {
            Some(m) => m.clone(),
            None => format!("failed rule: {}", self.rule.trim()),
        }
    }

    /// The rule as an evaluation error names it (`ruleErrorString`): its message, or itself.
    pub fn error_string(&self) -> String {
        self.message
            .clone()
            .unwrap_or_else(|| self.rule.trim().to_string())
    }

    /// Whether the rule reads `oldSelf` (a transition rule, evaluated on updates only).
    pub fn is_transition(&self) -> Result<bool, CompileError> {
        Ok(compile(&self.rule)?.references().has_variable("oldSelf"))
    }
}

/// Every rule in `schema`, depth first.
pub fn collect(schema: &Value) -> Vec<Rule> {
    fn walk(schema: &Value, path: &str, out: &mut Vec<Rule>) {
        for entry in schema["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            out.push(Rule::from_entry(path, entry));
        }
        if let Some(props) = schema["properties"].as_object() {
            for (name, child) in props {
                let child_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                walk(child, &child_path, out);
            }
        }
        if schema["items"].is_object() {
            walk(&schema["items"], &format!("{path}[*]"), out);
        }
        if schema["additionalProperties"].is_object() {
            walk(&schema["additionalProperties"], &format!("{path}[*]"), out);
        }
    }
    let mut out = Vec::new();
    walk(schema, "", &mut out);
    out
}

fn env() -> &'static Arc<cel::Env> {
    static ENV: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(cel::Env::stdlib()))
}

/// Compiles `rule`, refusing what kube-apiserver's type check would refuse here: a variable
/// other than `self`/`oldSelf`, a function outside [`FUNCTIONS`].
pub fn compile(rule: &str) -> Result<cel::Program, CompileError> {
    let program = env()
        .compile(rule)
        .map_err(|e| CompileError::Syntax(e.to_string().replace('\n', " ")))?;
    let refs = program.references();
    let mut functions = refs.functions();
    functions.sort_unstable();
    for f in functions {
        // Operators (`_&&_`, `!_`, `_[_]`, `@in`, …) and what the macros expand to.
        let operator = f.starts_with('_') || f.starts_with('!') || f.starts_with('@');
        if !operator && !FUNCTIONS.contains(&f) {
            return Err(CompileError::UnknownFunction(f.to_string()));
        }
    }
    let mut bound = Vec::new();
    bound_variables(program.expression(), &mut bound);
    let mut variables = refs.variables();
    variables.sort_unstable();
    for v in variables.into_iter().filter(|v| !bound.contains(v)) {
        // Type names are identifiers too (`type(self) == int`).
        let type_name = matches!(
            v,
            "int"
                | "uint"
                | "double"
                | "string"
                | "bool"
                | "bytes"
                | "list"
                | "map"
                | "null_type"
                | "type"
        );
        if !type_name && v != "self" && v != "oldSelf" {
            return Err(CompileError::UnknownVariable(v.to_string()));
        }
    }
    Ok(program)
}

/// The variables comprehensions (`all`, `exists`, `map`, …) bind in `expr`.
fn bound_variables<'e>(expr: &'e cel::IdedExpr, out: &mut Vec<&'e str>) {
    use cel::common::ast::{EntryExpr, Expr};
    let entry = |e: &'e EntryExpr, out: &mut Vec<&'e str>| match e {
        EntryExpr::StructField(f) => bound_variables(&f.value, out),
        EntryExpr::MapEntry(m) => {
            bound_variables(&m.key, out);
            bound_variables(&m.value, out);
        }
    };
    match &expr.expr {
        Expr::Call(call) => {
            call.target.iter().for_each(|t| bound_variables(t, out));
            call.args.iter().for_each(|a| bound_variables(a, out));
        }
        Expr::Comprehension(c) => {
            out.push(&c.iter_var);
            out.extend(c.iter_var2.as_deref());
            out.push(&c.accu_var);
            for e in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                bound_variables(e, out);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| bound_variables(e, out)),
        Expr::Map(map) => map.entries.iter().for_each(|e| entry(&e.expr, out)),
        Expr::Struct(st) => st.entries.iter().for_each(|e| entry(&e.expr, out)),
        Expr::Select(select) => bound_variables(&select.operand, out),
        _ => {}
    }
}

/// The CEL value of `value` under `schema` (kubernetes/apiserver: pkg/cel/common/values.go):
/// `integer` is `int`, `number` is `double` (even when integral), an int-or-string is `int` or
/// `string`, objects are maps.
pub fn to_cel(schema: &Value, value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            let want_double = schema["type"] == "number";
            match n.as_i64() {
                Some(i) if !want_double => cel::Value::Int(i),
                _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(
            items.iter().map(|i| to_cel(&schema["items"], i)).collect(),
        )),
        Value::Object(map) => {
            let mut out: HashMap<cel::objects::Key, cel::Value> = HashMap::new();
            for (k, v) in map {
                let child = schema["properties"]
                    .get(k)
                    .unwrap_or(&schema["additionalProperties"]);
                out.insert(cel::objects::Key::from(k.clone()), to_cel(child, v));
            }
            cel::Value::Map(cel::objects::Map::from(out))
        }
    }
}

/// Evaluates one rule with `self` (and `oldSelf`, given for transition rules on update).
/// `Ok(true)`: it holds; `Err`: why it could not be evaluated.
pub fn evaluate(
    program: &cel::Program,
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
) -> Result<bool, String> {
    let mut ctx = cel::Context::with_env(Arc::clone(env()));
    ctx.add_variable_from_value("self", to_cel(schema, value));
    if let Some(old) = old {
        ctx.add_variable_from_value("oldSelf", to_cel(schema, old));
    }
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("rule did not evaluate to a bool: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubernetes_only_functions_do_not_compile() {
        assert!(compile("self.matches('^a$') && size(self) < 3").is_ok());
        assert!(compile("has(self.a) || self.all(x, x > 0)").is_ok());
        for rule in [
            "self.isSorted()",
            "quantity(self).isGreaterThan(quantity('1'))",
            "self.lowerAscii() == self",
            "url(self).getHost() != ''",
            "self == other",
            "self ==",
        ] {
            assert!(
                compile(rule).is_err(),
                "{rule}: {:?}",
                compile(rule).map(|_| ())
            );
        }
    }

    #[test]
    fn int_or_string_is_int_or_string_in_cel() {
        let rule =
            compile("type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')").expect("compile");
        let s = json!({"x-kubernetes-int-or-string": true});
        assert_eq!(evaluate(&rule, &s, &json!(3), None), Ok(true));
        assert_eq!(evaluate(&rule, &s, &json!(-3), None), Ok(false));
        assert_eq!(evaluate(&rule, &s, &json!("30%"), None), Ok(true));
        assert_eq!(evaluate(&rule, &s, &json!("3"), None), Ok(false));
    }

    #[test]
    fn transition_rules_see_old_self() {
        let rule = Rule {
            path: "spec".into(),
            rule: "self >= oldSelf".into(),
            message: None,
        };
        assert!(rule.is_transition().expect("compile"));
        let program = compile(&rule.rule).expect("compile");
        let s = json!({"type": "integer"});
        assert_eq!(evaluate(&program, &s, &json!(2), Some(&json!(1))), Ok(true));
        assert_eq!(
            evaluate(&program, &s, &json!(0), Some(&json!(1))),
            Ok(false)
        );
        assert_eq!(rule.failure_message(), "failed rule: self >= oldSelf");
    }
}
