//! Request handling: authenticate, count, inject faults, then serve discovery documents
//! or resources.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::Shared;
use super::auth;
use super::authz::{self, Attributes};
use super::crd;
use super::discovery::{self, CUSTOMRESOURCEDEFINITIONS, PODDISRUPTIONBUDGETS, PODS, ResourceDef};
use super::fields::Applier;
use super::patch::{self, PatchError};
use super::pods::{self, DeleteOptions};
use super::selector::{FieldSelector, LabelSelector};
use super::stats;
use super::status::ApiError;
use super::store::Scope;
use super::table::{self, TableOptions};
use super::watch::{self, WatchRequest};

/// Response body: a whole document or a watch stream.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// kube-apiserver's request body limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A path that is not a resource.
enum NonResource {
    Version,
    Health,
    ApiVersions,
    GroupList,
    Group(String),
    ResourceList(String, String),
    OpenApiRoot,
    OpenApiGroupVersion(String, String),
}

struct ResourcePath {
    def: &'static ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

enum Target {
    NonResource(NonResource),
    Resource(ResourcePath),
    Unknown,
}

impl Target {
    fn parse(served: &discovery::Served, path: &str) -> Target {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let own = |s: &str| s.to_string();
        match segs.as_slice() {
            ["version"] => Target::NonResource(NonResource::Version),
            ["healthz" | "livez" | "readyz"] => Target::NonResource(NonResource::Health),
            ["api"] => Target::NonResource(NonResource::ApiVersions),
            ["apis"] => Target::NonResource(NonResource::GroupList),
            ["api", v] => Target::NonResource(NonResource::ResourceList(String::new(), own(v))),
            ["apis", g] => Target::NonResource(NonResource::Group(own(g))),
            ["apis", g, v] => Target::NonResource(NonResource::ResourceList(own(g), own(v))),
            ["openapi", "v3"] => Target::NonResource(NonResource::OpenApiRoot),
            ["openapi", "v3", "api", v] => {
                Target::NonResource(NonResource::OpenApiGroupVersion(String::new(), own(v)))
            }
            ["openapi", "v3", "apis", g, v] => {
                Target::NonResource(NonResource::OpenApiGroupVersion(own(g), own(v)))
            }
            ["api", v, rest @ ..] => Self::resource(served, "", v, rest),
            ["apis", g, v, rest @ ..] => Self::resource(served, g, v, rest),
            _ => Target::Unknown,
        }
    }

    fn resource(served: &discovery::Served, group: &str, version: &str, rest: &[&str]) -> Target {
        let (def, namespace, tail) = match rest {
            ["namespaces", ns, plural, tail @ ..]
                if discovery::find(served, group, version, plural)
                    .is_some_and(|d| d.namespaced) =>
            {
                (
                    discovery::find(served, group, version, plural),
                    Some(ns.to_string()),
                    tail,
                )
            }
            [plural, tail @ ..] => (discovery::find(served, group, version, plural), None, tail),
            [] => (None, None, rest),
        };
        let Some(def) = def else {
            return Target::Unknown;
        };
        let (name, subresource) = match tail {
            [] => (None, None),
            [name] => (Some(name.to_string()), None),
            [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
            _ => return Target::Unknown,
        };
        Target::Resource(ResourcePath {
            def,
            namespace,
            name,
            subresource,
        })
    }

    /// The Kubernetes verb: resource verbs for resources, the lower-cased method otherwise.
    fn verb(&self, method: &Method, watch: bool) -> &'static str {
        match (self, method) {
            (Target::Resource(r), &Method::GET) if watch || r.name.is_none() => {
                if watch {
                    "watch"
                } else {
                    "list"
                }
            }
            (Target::Resource(_), &Method::GET) => "get",
            (Target::Resource(_), &Method::POST) => "create",
            (Target::Resource(_), &Method::PUT) => "update",
            (Target::Resource(_), &Method::PATCH) => "patch",
            (Target::Resource(r), &Method::DELETE) if r.name.is_none() => "deletecollection",
            (Target::Resource(_), &Method::DELETE) => "delete",
            (_, &Method::GET | &Method::HEAD) => "get",
            (_, &Method::POST) => "post",
            (_, &Method::PUT) => "put",
            (_, &Method::PATCH) => "patch",
            (_, &Method::DELETE) => "delete",
            _ => "other",
        }
    }
}

#[derive(Default)]
struct Query {
    watch: bool,
    resource_version: Option<String>,
    timeout: Option<Duration>,
    bookmarks: bool,
    field_selector: String,
    label_selector: String,
    include_object: Option<String>,
    field_manager: Option<String>,
    force: bool,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Go's `strconv.ParseBool`, which the real server uses for boolean parameters.
fn parse_bool(key: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "" | "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "invalid value {value:?} for boolean parameter {key}"
        ))),
    }
}

impl Query {
    fn parse(query: Option<&str>) -> Result<Query, ApiError> {
        let mut q = Query::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            match percent_decode(key).as_str() {
                "watch" => q.watch = parse_bool("watch", &value)?,
                "allowWatchBookmarks" => q.bookmarks = parse_bool("allowWatchBookmarks", &value)?,
                "resourceVersion" => q.resource_version = Some(value),
                "timeoutSeconds" => {
                    let secs: u64 = value.parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid timeoutSeconds {value:?}"))
                    })?;
                    q.timeout = Some(Duration::from_secs(secs));
                }
                "fieldSelector" => q.field_selector = value,
                "labelSelector" => q.label_selector = value,
                "includeObject" => q.include_object = Some(value),
                "fieldManager" => q.field_manager = Some(value),
                "force" => q.force = parse_bool("force", &value)?,
                // limit/continue (everything fits in one page), fieldValidation, dryRun, pretty, …
                _ => {}
            }
        }
        Ok(q)
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

fn respond(status: StatusCode, body: Body, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

fn json_response(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    // Serializing JSON values and plain structs cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    respond(status, full(bytes), "application/json")
}

fn error_response(err: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = json_response(status, &err.status());
    if let Some(secs) = err.retry_after() {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Serves one request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    cert_user: Option<Arc<str>>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query());
    let served = shared.served.borrow().clone();
    let target = Target::parse(&served, &path);
    let verb = target.verb(&method, query.as_ref().is_ok_and(|q| q.watch));
    let user = auth::authenticate(cert_user.as_deref(), req.headers(), &shared.admin_token)
        .or_else(|| auth::bearer(req.headers()).and_then(|t| shared.token_user(t)));
    let user_name = user.as_deref().unwrap_or(auth::ANONYMOUS);
    let resource = match &target {
        Target::Resource(r) => match &r.subresource {
            Some(sub) => format!("{}/{sub}", r.def.plural),
            None => r.def.plural.to_string(),
        },
        _ => String::new(),
    };
    shared.stats.record(user_name, verb, &resource);

    let response = if user.is_none() {
        error_response(&ApiError::unauthorized())
    } else {
        if let Some(delay) = shared.faults.delay(user_name, verb) {
            tokio::time::sleep(delay).await;
        }
        if let Some(secs) = shared.faults.take_throttle(user_name, verb) {
            let mut resp = error_response(&ApiError::too_many_requests());
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
            resp
        } else if let Some(err) = shared.faults.take_error(user_name, verb) {
            error_response(&err)
        } else {
            match serve(&shared, req, target, query, verb, user_name).await {
                Ok(resp) => resp,
                Err(err) => error_response(&err),
            }
        }
    };
    tracing::debug!(
        %method,
        path,
        user = user_name,
        verb,
        status = response.status().as_u16(),
        "apiserver request"
    );
    response
}

async fn serve(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    target: Target,
    query: Result<Query, ApiError>,
    verb: &'static str,
    user: &str,
) -> Result<Response<Body>, ApiError> {
    let query = query?;
    match target {
        Target::Unknown => Err(ApiError::path_not_found()),
        Target::NonResource(_) if !matches!(*req.method(), Method::GET | Method::HEAD) => {
            Err(ApiError::method_not_allowed())
        }
        Target::NonResource(doc) => non_resource(shared, doc),
        Target::Resource(path) => resource(shared, req, path, query, verb, user).await,
    }
}

fn non_resource(shared: &Shared, doc: NonResource) -> Result<Response<Body>, ApiError> {
    let served = shared.served.borrow().clone();
    let served = &served;
    let doc = match doc {
        NonResource::Health => {
            return Ok(respond(
                StatusCode::OK,
                full("ok"),
                "text/plain; charset=utf-8",
            ));
        }
        NonResource::Version => Some(discovery::version()),
        NonResource::ApiVersions => Some(discovery::api_versions(&shared.server_addr)),
        NonResource::GroupList => Some(discovery::api_group_list(served)),
        NonResource::Group(g) => discovery::api_group_doc(served, &g),
        NonResource::ResourceList(g, v) => discovery::api_resource_list(served, &g, &v),
        NonResource::OpenApiRoot => Some(discovery::openapi_root(served)),
        NonResource::OpenApiGroupVersion(g, v) => discovery::openapi_group_version(served, &g, &v),
    };
    // Legacy documents with a plain `application/json` content type: clients that asked
    // for aggregated discovery (kubectl does) fall back to these.
    doc.map(|d| json_response(StatusCode::OK, &d))
        .ok_or_else(ApiError::path_not_found)
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large()),
        Err(err) => Err(ApiError::bad_request(format!(
            "reading the request body: {err}"
        ))),
    }
}

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|err| ApiError::bad_request(format!("the request body is not valid JSON: {err}")))
}

/// The media type without parameters, lower-cased.
fn media_type(req: &Request<Incoming>) -> Option<String> {
    let ct = req.headers().get(CONTENT_TYPE)?.to_str().ok()?;
    Some(
        ct.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase(),
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    kind: String,
    api_version: String,
    metadata: Value,
    items: Vec<std::borrow::Cow<'a, Value>>,
}

/// The name a field selector requires exactly (`metadata.name=x` or `==x` among its terms).
fn exact_name(selector: &str) -> Option<&str> {
    selector.split(',').find_map(|term| {
        let value = term.trim().strip_prefix("metadata.name")?;
        value.strip_prefix("==").or_else(|| value.strip_prefix('='))
    })
}

async fn resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    path: ResourcePath,
    query: Query,
    verb: &'static str,
    user: &str,
) -> Result<Response<Body>, ApiError> {
    let ResourcePath {
        def,
        namespace,
        name,
        subresource,
    } = path;
    if def.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::path_not_found());
    }
    // Authorization comes before the handler, as in kube-apiserver's filter chain. A list or
    // watch that selects one name by `metadata.name` is authorized as a request naming it, so a
    // role's resourceNames can allow it (kubernetes/apiserver pkg/endpoints/request/
    // requestinfo.go: `RequiresExactMatch("metadata.name")`, since Kubernetes 1.10).
    let selected = matches!(verb, "list" | "watch")
        .then(|| exact_name(&query.field_selector))
        .flatten();
    authz::authorize(
        &shared.store,
        &Attributes {
            user,
            verb,
            def,
            namespace: namespace.as_deref(),
            name: name.as_deref().or(selected),
            subresource: subresource.as_deref(),
        },
    )?;
    let scope = match subresource.as_deref() {
        None if def.allows(verb) => Scope::Main,
        None => return Err(ApiError::method_not_allowed()),
        Some("status") if def.status_subresource => match verb {
            "get" | "patch" | "update" => Scope::Status,
            _ => return Err(ApiError::method_not_allowed()),
        },
        Some("eviction") if std::ptr::eq(def, &PODS) => {
            let (Some(ns), Some(name), "create") = (namespace.as_deref(), name.as_deref(), verb)
            else {
                return Err(ApiError::method_not_allowed());
            };
            check_json_content(&req)?;
            let body = parse_json(&read_body(req).await?)?;
            let status = pods::evict(shared, ns, name, &body)?;
            return Ok(json_response(StatusCode::CREATED, &status));
        }
        Some(_) => return Err(ApiError::path_not_found()),
    };
    let ns = namespace.as_deref();
    let store = &shared.store;
    // The field manager of a write: `fieldManager`, else the client's user agent up to the first
    // '/' (kubernetes/apiserver: pkg/endpoints/handlers/rest.go, `prefixFromUserAgent`).
    let manager = query.field_manager.clone().unwrap_or_else(|| {
        req.headers()
            .get(hyper::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|m| !m.is_empty())
            .unwrap_or("unknown")
            .to_string()
    });
    let accept = req
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let table_opts = TableOptions::from_request(accept, query.include_object.as_deref());
    let one = |obj: &Arc<Value>, status: StatusCode| match table_opts {
        Some(opts) => json_response(
            status,
            &table::table(def, std::slice::from_ref(obj), None, opts),
        ),
        None => json_response(status, &*watch::as_version(def, obj)),
    };
    let name_or_405 = || name.as_deref().ok_or_else(ApiError::method_not_allowed);

    match verb {
        "get" => Ok(one(&store.get(def, ns, name_or_405()?)?, StatusCode::OK)),
        "list" => {
            let fields = field_selector(def, &query.field_selector)?;
            let labels =
                LabelSelector::parse(&query.label_selector).map_err(ApiError::bad_request)?;
            let (items, rv) = store.list(def, ns, |o| fields.matches(o) && labels.matches(o));
            if let Some(opts) = table_opts {
                return Ok(json_response(
                    StatusCode::OK,
                    &table::table(def, &items, Some(rv), opts),
                ));
            }
            Ok(json_response(
                StatusCode::OK,
                &List {
                    kind: format!("{}List", def.kind),
                    api_version: def.api_version(),
                    metadata: serde_json::json!({ "resourceVersion": rv.to_string() }),
                    items: items.iter().map(|o| watch::as_version(def, o)).collect(),
                },
            ))
        }
        "watch" => {
            let mut fields = field_selector(def, &query.field_selector)?;
            if let Some(name) = &name {
                fields = fields.with_name(name);
            }
            let from = match query.resource_version.as_deref() {
                None | Some("" | "0") => None,
                Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resourceVersion {rv:?}"))
                })?),
            };
            let request = WatchRequest {
                def,
                namespace,
                fields,
                labels: LabelSelector::parse(&query.label_selector)
                    .map_err(ApiError::bad_request)?,
                from,
                timeout: query.timeout,
                bookmarks: query.bookmarks,
                table: table_opts,
            };
            // Counted open until the client goes away or the watch ends.
            let open = stats::OpenWatch::new(shared.clone(), user);
            let lines = watch::lines(store, &shared.faults, shared.served.subscribe(), request)
                .map(move |line| {
                    let _ = &open;
                    Ok::<_, Infallible>(Frame::data(line))
                });
            Ok(respond(
                StatusCode::OK,
                StreamBody::new(lines).boxed_unsync(),
                "application/json",
            ))
        }
        "create" => {
            if def.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            check_json_content(&req)?;
            let body = parse_json(&read_body(req).await?)?;
            let created = create_object(shared, def, ns, body)?;
            if let Some(created_name) = created.pointer("/metadata/name").and_then(Value::as_str) {
                shared
                    .fields
                    .updated(def, ns, created_name, None, &created, &manager);
            }
            let created_name = created
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            tracing::debug!(
                resource = def.plural,
                name = created_name,
                "apiserver object created"
            );
            Ok(one(&created, StatusCode::CREATED))
        }
        "update" => {
            let name = name_or_405()?;
            check_json_content(&req)?;
            let mut body = parse_json(&read_body(req).await?)?;
            if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) {
                crd::default(&mut body);
            }
            let mut before = None;
            let updated = store.update(def, ns, name, scope, |cur| {
                before = Some(cur.clone());
                Ok(body)
            })?;
            shared
                .fields
                .updated(def, ns, name, before.as_ref(), &updated, &manager);
            after_write(shared, def, ns);
            Ok(one(&updated, StatusCode::OK))
        }
        "patch" => {
            let name = name_or_405()?;
            let media = media_type(&req).unwrap_or_default();
            if media == "application/apply-patch+yaml" {
                let body = read_body(req).await?;
                let (obj, status) = apply(shared, def, ns, name, scope, &body, &query, &manager)?;
                return Ok(one(&obj, status));
            }
            let apply: fn(&Value, &Value) -> Result<Value, PatchError> = match media.as_str() {
                "application/merge-patch+json" => |cur, p| {
                    let mut next = cur.clone();
                    patch::merge_patch(&mut next, p);
                    Ok(next)
                },
                "application/strategic-merge-patch+json" => |cur, p| {
                    let mut next = cur.clone();
                    patch::strategic_merge_patch(&mut next, p)?;
                    Ok(next)
                },
                "application/json-patch+json" => |cur, p| patch::json_patch(cur.clone(), p),
                _ => {
                    return Err(ApiError::unsupported_media_type(
                        &media,
                        "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml",
                    ));
                }
            };
            let body = parse_json(&read_body(req).await?)?;
            let mut before = None;
            let patched = store.update(def, ns, name, scope, |cur| {
                before = Some(cur.clone());
                let mut next = apply(cur, &body).map_err(|err| match err {
                    PatchError::Malformed(msg) => ApiError::bad_request(msg),
                    PatchError::Failed(msg) => ApiError::patch_failed(&msg),
                })?;
                if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) {
                    crd::default(&mut next);
                }
                Ok(next)
            })?;
            shared
                .fields
                .updated(def, ns, name, before.as_ref(), &patched, &manager);
            after_write(shared, def, ns);
            Ok(one(&patched, StatusCode::OK))
        }
        "delete" => {
            let name = name_or_405()?;
            let opts = DeleteOptions::from_body(&read_body(req).await?)?;
            let deleted = pods::delete(shared, def, ns, name, &opts)?;
            if !opts.is_dry_run() {
                shared.fields.forget(def, ns, name);
            }
            if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) && !opts.is_dry_run() {
                // Deleting a CRD deletes its objects (the real server's
                // `customresourcecleanup` finalizer), then it is no longer served.
                if let Some(first) = crd::served_defs(&deleted).first() {
                    store.delete_all(first);
                }
            }
            after_write(shared, def, ns);
            Ok(one(&deleted, StatusCode::OK))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// Server-side apply (`PATCH` with `application/apply-patch+yaml`): creates the object if it is
/// missing (201), else merges the applied fields into it (200) unless they would change fields
/// other managers own (409, unless `force`). `fieldManager` is required.
#[allow(clippy::too_many_arguments)]
fn apply(
    shared: &Shared,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    scope: Scope,
    body: &[u8],
    query: &Query,
    manager: &str,
) -> Result<(Arc<Value>, StatusCode), ApiError> {
    if query.field_manager.is_none() {
        return Err(ApiError::invalid_options(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the apply patch is not UTF-8"))?;
    let applied: Value = serde_saphyr::from_str(text)
        .map_err(|err| ApiError::bad_request(format!("error decoding YAML: {err}")))?;
    if !applied.is_object() {
        return Err(ApiError::bad_request("the apply patch must be an object"));
    }
    let current = shared.store.get(def, ns, name).ok();
    let by = Applier {
        manager,
        force: query.force,
    };
    shared
        .fields
        .check_apply(def, ns, name, current.as_deref(), &applied, by)?;
    let (result, status) = match &current {
        None => {
            let mut obj = applied.clone();
            obj["metadata"]["name"] = Value::from(name);
            (create_object(shared, def, ns, obj)?, StatusCode::CREATED)
        }
        Some(_) => {
            let updated = shared.store.update(def, ns, name, scope, |cur| {
                let mut next = cur.clone();
                let mut patch = applied.clone();
                if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    // Identity is the URL's; the stored resourceVersion stands unless given.
                    meta.remove("name");
                }
                patch::merge_patch(&mut next, &patch);
                Ok(next)
            })?;
            after_write(shared, def, ns);
            (updated, StatusCode::OK)
        }
    };
    shared
        .fields
        .applied(def, ns, name, current.as_deref(), &applied, by);
    Ok((result, status))
}

/// Creates an object as a `POST` does: the type's create strategy, the store, then the
/// server's own controllers.
pub(crate) fn create_object(
    shared: &Shared,
    def: &'static ResourceDef,
    ns: Option<&str>,
    mut body: Value,
) -> Result<Arc<Value>, ApiError> {
    if std::ptr::eq(def, &PODS) {
        pods::prepare_create(&mut body);
    } else if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) {
        crd::default(&mut body);
    }
    let created = shared.store.create(def, ns, body)?;
    after_write(shared, def, ns);
    Ok(created)
}

/// A `fieldSelector`, checked against the fields `def` supports.
fn field_selector(def: &ResourceDef, text: &str) -> Result<FieldSelector, ApiError> {
    let fields = FieldSelector::parse(text).map_err(ApiError::bad_request)?;
    if let Some(supported) = def.field_labels
        && let Some(bad) = fields.fields().find(|f| !supported.contains(&f.as_str()))
    {
        // kubernetes/apimachinery: the field-label conversion of built-in types answers
        // "field label not supported"; a custom resource's names the selectable fields.
        let why = if def.custom {
            format!(
                "{bad:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )
        } else {
            format!("field label not supported: {bad}")
        };
        return Err(ApiError::bad_request(why));
    }
    Ok(fields)
}

/// What the server's own controllers do after a write: serve a changed CRD, recompute the
/// disruption budgets of a namespace whose pods or budgets changed.
pub(crate) fn after_write(shared: &Shared, def: &ResourceDef, ns: Option<&str>) {
    if std::ptr::eq(def, &CUSTOMRESOURCEDEFINITIONS) {
        shared.sync_crds();
    } else if (std::ptr::eq(def, &PODS) || std::ptr::eq(def, &PODDISRUPTIONBUDGETS))
        && let Some(ns) = ns
    {
        pods::sync_budgets(&shared.store, ns);
    }
}

fn check_json_content(req: &Request<Incoming>) -> Result<(), ApiError> {
    match media_type(req).as_deref() {
        None | Some("application/json") => Ok(()),
        Some(other) => Err(ApiError::unsupported_media_type(other, "application/json")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_field_selector_names_one_object_only_by_exact_metadata_name() {
        let rows = [
            ("metadata.name=streamd-rollout", Some("streamd-rollout")),
            ("metadata.name==x", Some("x")),
            ("spec.nodeName=w1,metadata.name=x", Some("x")),
            ("metadata.name!=x", None),
            ("metadata.namespace=x", None),
            ("", None),
        ];
        for (selector, want) in rows {
            assert_eq!(super::exact_name(selector), want, "{selector}");
        }
    }

    use super::*;

    #[test]
    fn paths_resolve_to_resources() {
        let Target::Resource(r) = Target::parse(
            &discovery::Served::default(),
            "/api/v1/namespaces/default/events/e1",
        ) else {
            panic!("events path");
        };
        assert_eq!(
            (r.def.plural, r.namespace.as_deref(), r.name.as_deref()),
            ("events", Some("default"), Some("e1"))
        );
        let Target::Resource(r) =
            Target::parse(&discovery::Served::default(), "/api/v1/namespaces/default")
        else {
            panic!("namespace path");
        };
        assert_eq!(
            (r.def.plural, r.name.as_deref()),
            ("namespaces", Some("default"))
        );
        let Target::Resource(r) =
            Target::parse(&discovery::Served::default(), "/api/v1/nodes/w0/status")
        else {
            panic!("status path");
        };
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert!(matches!(
            Target::parse(&discovery::Served::default(), "/api/v1/secrets"),
            Target::Unknown
        ));
        assert!(matches!(
            Target::parse(&discovery::Served::default(), "/api/v1/nodes/a/b/c"),
            Target::Unknown
        ));
        assert!(matches!(
            Target::parse(&discovery::Served::default(), "/apis"),
            Target::NonResource(NonResource::GroupList)
        ));
        let watch =
            Target::parse(&discovery::Served::default(), "/api/v1/nodes").verb(&Method::GET, true);
        assert_eq!(watch, "watch");
    }

    #[test]
    fn query_strings_decode_and_reject_garbage() {
        let q = Query::parse(Some("watch=1&fieldSelector=metadata.name%3Dw0&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion=12"))
            .expect("valid query");
        assert!(q.watch && q.bookmarks);
        assert_eq!(q.field_selector, "metadata.name=w0");
        assert_eq!(q.timeout, Some(Duration::from_secs(5)));
        assert_eq!(q.resource_version.as_deref(), Some("12"));
        assert!(Query::parse(Some("watch=maybe")).is_err());
        assert!(Query::parse(Some("timeoutSeconds=-1")).is_err());
        assert_eq!(percent_decode("a%2Fb+c%zz%4"), "a/b c%zz%4");
    }
}
