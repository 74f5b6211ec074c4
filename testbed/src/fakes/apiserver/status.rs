//! API errors, rendered as `Status` objects the way kube-apiserver does.

use serde_json::{Value, json};

use super::discovery::ResourceDef;

/// An error answered with a `Status` body.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    /// Empty for a `Status` without a reason (Go omits it).
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_object(mut self, def: &ResourceDef, name: &str) -> Self {
        let mut details = json!({ "name": name, "kind": def.plural });
        if !def.group.is_empty() {
            details["group"] = json!(def.group);
        }
        self.details = Some(details);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422 for invalid request options (no object details).
    pub(crate) fn invalid_options(message: &str) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub(crate) fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.qualified()),
        )
        .with_object(def, name)
    }

    /// 403 as the authorizer words it: `message` is the part after "is forbidden: ".
    pub(crate) fn forbidden(def: &ResourceDef, name: Option<&str>, message: &str) -> Self {
        let target = match name {
            Some(name) => format!("{} \"{name}\"", def.qualified()),
            None => def.qualified(),
        };
        Self::new(
            403,
            "Forbidden",
            format!("{target} is forbidden: {message}"),
        )
        .with_object(def, name.unwrap_or_default())
    }

    pub(crate) fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn conflict(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                def.qualified()
            ),
        )
        .with_object(def, name)
    }

    /// 409 Conflict with the storage layer's own explanation (a failed precondition).
    pub(crate) fn conflict_because(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.qualified()
            ),
        )
        .with_object(def, name)
    }

    /// 409 Conflict with a message and causes of its own (a conflicting apply).
    pub(crate) fn conflict_with_causes(
        def: &ResourceDef,
        name: &str,
        message: String,
        causes: Vec<Value>,
    ) -> Self {
        let mut err = Self::new(409, "Conflict", message).with_object(def, name);
        if let Some(details) = err.details.as_mut() {
            details["causes"] = Value::Array(causes);
        }
        err
    }

    pub(crate) fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", def.qualified()),
        )
        .with_object(def, name)
    }

    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", "request entity too large")
    }

    pub(crate) fn unsupported_media_type(got: &str, accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({got:?}) - accepted media types include: {accepted}"
            ),
        )
    }

    /// 422 with one cause per field error, like a failed validation.
    pub(crate) fn invalid(def: &ResourceDef, name: &str, causes: &[(String, String)]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|(field, msg)| format!("{field}: {msg}"))
            .collect();
        let kind = if def.custom {
            format!("{}.{}", def.kind, def.group)
        } else {
            def.kind.to_string()
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", summary.join(", ")),
        );
        let causes: Vec<Value> = causes
            .iter()
            .map(
                |(field, msg)| json!({ "reason": cause_type(msg), "message": msg, "field": field }),
            )
            .collect();
        err.details = Some(json!({
            "name": name,
            "kind": def.kind,
            "group": def.group,
            "causes": causes,
        }));
        err
    }

    /// 422 for a patch that cannot be applied (failed `test`, missing path, …).
    pub(crate) fn patch_failed(message: &str) -> Self {
        let mut err = Self::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {message}"),
        );
        err.details = Some(json!({ "causes": [{ "message": message }] }));
        err
    }

    pub(crate) fn too_many_requests() -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        )
    }

    /// 429 with one cause, as `errors.NewTooManyRequests(message, retry_after)` plus a cause
    /// builds it; `retry_after` > 0 also becomes the `Retry-After` header.
    pub(crate) fn too_many_requests_because(
        message: &str,
        cause_reason: &str,
        cause: &str,
        retry_after: u32,
    ) -> Self {
        let mut err = Self::new(429, "TooManyRequests", message);
        let mut details = json!({ "causes": [{ "reason": cause_reason, "message": cause }] });
        if retry_after > 0 {
            details["retryAfterSeconds"] = json!(retry_after);
        }
        err.details = Some(details);
        err
    }

    /// A `Status` a handler returns as its result rather than as an error: a code and a message,
    /// no reason.
    pub(crate) fn status_failure(code: u16, message: &str) -> Self {
        Self::new(code, "", message)
    }

    /// The `Retry-After` seconds the response carries, if any.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.details
            .as_ref()?
            .get("retryAfterSeconds")?
            .as_u64()
            .filter(|s| *s > 0)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub(crate) fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object.
    pub(crate) fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if self.reason.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            map.remove("reason");
        }
        status
    }
}

/// The `field.ErrorType` of a field error from the body it starts with (apimachinery
/// pkg/util/validation/field/errors.go: `ErrorType.String()`), as a cause's `reason`.
fn cause_type(body: &str) -> &'static str {
    const TYPES: &[(&str, &str)] = &[
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Forbidden", "FieldValueForbidden"),
        ("Not found", "FieldValueNotFound"),
        ("Internal error", "InternalError"),
    ];
    TYPES
        .iter()
        .find(|(prefix, _)| body.starts_with(prefix))
        .map_or("FieldValueInvalid", |(_, t)| t)
}
