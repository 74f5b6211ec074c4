//! `a{sv}` arguments kept in wire order, typed lookups, and JSON views of variants.

use std::collections::HashMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zbus::zvariant::{OwnedValue, Signature, Type, Value};

use super::errors::DaemonError;

/// An `a{sv}` argument in the order the caller sent it.
///
/// The real daemon joins a running transaction only when the parameters are
/// `g_variant_equal`, which is order-sensitive; a `HashMap` would lose the order.
#[derive(Debug, Default)]
pub(crate) struct VarDict(pub(crate) Vec<(String, OwnedValue)>);

impl Type for VarDict {
    const SIGNATURE: &'static Signature = <HashMap<String, OwnedValue> as Type>::SIGNATURE;
}

impl Serialize for VarDict {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for VarDict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VarDict;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a{sv} dictionary")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<VarDict, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = access.next_entry::<String, OwnedValue>()? {
                    entries.push((k, v));
                }
                Ok(VarDict(entries))
            }
        }
        deserializer.deserialize_map(V)
    }
}

impl VarDict {
    /// The last value for `key`, like `g_variant_dict_lookup` (later entries win). The typed
    /// lookups below treat a value of another type as absent, as `g_variant_dict_lookup` and
    /// `g_variant_dict_lookup_value` with an expected type do: the real daemon silently
    /// ignores a mistyped option.
    fn get(&self, key: &str) -> Option<&Value<'static>> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| &**v)
    }

    /// A string value, `None` when absent.
    pub(crate) fn str(&self, key: &str) -> Result<Option<String>, DaemonError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s.to_string())),
            Some(_) => Ok(None),
        }
    }

    /// A boolean value, `default` when absent.
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, DaemonError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Ok(default),
        }
    }

    /// Whether a string-array value is present and non-empty (`vardict_lookup_strv_canonical`).
    pub(crate) fn has_strv(&self, key: &str) -> Result<bool, DaemonError> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Array(a)) if a.element_signature() == &Signature::Str => Ok(!a.is_empty()),
            Some(_) => Ok(false),
        }
    }

    /// A string-array value (empty when absent).
    pub(crate) fn strv(&self, key: &str) -> Result<Vec<String>, DaemonError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) if a.element_signature() == &Signature::Str => Ok(a
                .iter()
                .filter_map(|v| match v {
                    Value::Str(s) => Some(s.to_string()),
                    _ => None,
                })
                .collect()),
            Some(_) => Ok(Vec::new()),
        }
    }

    /// Apply `f` to every descriptor of an `ah` value (nothing when absent).
    pub(crate) fn map_handles<T>(
        &self,
        key: &str,
        f: impl Fn(std::os::fd::BorrowedFd<'_>) -> T,
    ) -> Result<Vec<T>, DaemonError> {
        use std::os::fd::AsFd;
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) if a.element_signature() == &Signature::Fd => Ok(a
                .iter()
                .filter_map(|v| match v {
                    Value::Fd(fd) => Some(f(fd.as_fd())),
                    _ => None,
                })
                .collect()),
            Some(_) => Ok(Vec::new()),
        }
    }

    /// The number of handles in an `ah` value (0 when absent).
    pub(crate) fn handle_count(&self, key: &str) -> Result<u32, DaemonError> {
        match self.get(key) {
            None => Ok(0),
            Some(Value::Array(a)) if a.element_signature() == &Signature::Fd => {
                u32::try_from(a.len()).map_err(|_| {
                    DaemonError::InvalidArgs(format!("key \"{key}\" has too many handles"))
                })
            }
            Some(_) => Ok(0),
        }
    }

    /// Whether an `h` value is present.
    pub(crate) fn has_handle(&self, key: &str) -> Result<bool, DaemonError> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Fd(_)) => Ok(true),
            Some(_) => Ok(false),
        }
    }

    /// The dictionary as a JSON object (later duplicate keys win).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let map = self
            .0
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect::<serde_json::Map<_, _>>();
        serde_json::Value::Object(map)
    }
}

/// A variant as JSON, the way `rpm-ostree status --json` renders one: numbers as numbers,
/// tuples and arrays as arrays, `a{sv}` as objects; file descriptors as `"<fd>"`.
pub(crate) fn value_to_json(v: &Value<'_>) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::U8(n) => J::from(*n),
        Value::Bool(b) => J::from(*b),
        Value::I16(n) => J::from(*n),
        Value::U16(n) => J::from(*n),
        Value::I32(n) => J::from(*n),
        Value::U32(n) => J::from(*n),
        Value::I64(n) => J::from(*n),
        Value::U64(n) => J::from(*n),
        Value::F64(n) => J::from(*n),
        Value::Str(s) => J::from(s.as_str()),
        Value::Signature(s) => J::from(s.to_string()),
        Value::ObjectPath(p) => J::from(p.as_str()),
        Value::Value(inner) => value_to_json(inner),
        Value::Array(a) => J::Array(a.iter().map(value_to_json).collect()),
        Value::Dict(d) => J::Object(
            d.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::Str(s) => s.to_string(),
                        other => value_to_json(other).to_string(),
                    };
                    (key, value_to_json(v))
                })
                .collect(),
        ),
        Value::Structure(s) => J::Array(s.fields().iter().map(value_to_json).collect()),
        Value::Fd(_) => J::from("<fd>"),
        // GVariant only (never on D-Bus; deprecated with zvariant's GVariant support, which the
        // workspace enables for libostree's /run/ostree/staged-deployment): value or null.
        #[allow(deprecated)]
        Value::Maybe(m) => m.inner().as_ref().map_or(J::Null, value_to_json),
    }
}
