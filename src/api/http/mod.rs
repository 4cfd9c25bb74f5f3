//! The JSON/HTTP facade. Each route translates JSON to the protobuf request,
//! authenticates with the same `Authenticator`, calls the same gRPC handler
//! in-process, and translates the answer (or the error's `ErrorDetail`) back.
//! Validation, authorisation and error codes therefore exist once.

use crate::domain::filter::{self, Surface};
use std::sync::Arc;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodRouter};
use axum::Router;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use tonic::Status;

use super::auth::Identity;
use super::error::{detail_of, problem_body, transport_refusal};
use super::gate::OpClass;
use super::grpc::RegistryApi;
use crate::convert::discovery::{
    discover_request_from_json, discover_response_to_json, resolve_request_from_json,
    resolve_response_to_json,
};
use crate::convert::{record_pb_to_json, status_to_pb};
use crate::domain::{AgentStatus, Visibility};
use crate::listener::Peer;
use crate::pb::{self, registry_server::Registry};
use crate::service::ServiceError;
use std::collections::HashMap;

mod agent_protocol;
mod ard;
mod changes;
mod cluster;
mod cors;
mod encoding;
mod federation;
mod invocation;
mod leases;
mod mcp_registry;
mod metrics;
mod oauth;
mod openapi;
mod request_head;
mod ui;

pub use cors::{CorsConfig, CorsPolicy};
pub(crate) use encoding::decoded_body;
pub use encoding::DocumentCodings;
pub use oauth::ResourceServer;
pub use openapi::OPENAPI_JSON;

/// Shared state of the facade, one handle to it: axum clones the state for
/// every request (and every middleware that reads it), and a clone of the
/// services themselves took tens of reference counts each time (every
/// service holds the registry, which holds the Raft node's handles).
#[derive(Clone)]
pub struct HttpState(Arc<HttpServices>);

impl HttpState {
    pub fn new(services: HttpServices) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for HttpState {
    type Target = HttpServices;

    fn deref(&self) -> &HttpServices {
        &self.0
    }
}

/// What the facade's handlers use.
pub struct HttpServices {
    pub api: RegistryApi,
    pub ard: super::ard::ArdApi,
    pub mcp: crate::service::McpService,
    /// The names and origins `/mcp` answers (DNS-rebinding protection).
    pub mcp_origins: super::mcp_origin::OriginPolicy,
    /// The browser pages of other origins that may call the facade.
    pub cors: CorsPolicy,
    /// The authorization server 401s point clients to (`[jwt]`), if any.
    pub oauth: Option<ResourceServer>,
    pub cluster: super::cluster::ClusterApi,
    pub federation: super::federation::FederationApi,
    pub invocation: super::invocation::InvocationApi,
    pub gate: Arc<super::gate::Gate>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// Compressed copies of the documents crawlers fetch.
    pub documents: DocumentCodings,
}

/// An error answer: the gRPC status plus the path it answers for.
struct ApiError(Status);

impl From<Status> for ApiError {
    fn from(s: Status) -> Self {
        Self(s)
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        Self(e.into())
    }
}

fn invalid(field: Option<&str>, message: impl Into<String>) -> ApiError {
    ServiceError::InvalidRequest {
        field: field.map(String::from),
        message: message.into(),
    }
    .into()
}

type ApiResult = Result<Response, ApiError>;

/// Renders an error as problem+json. The instance is filled in by the
/// middleware that knows the request path.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let d = detail_of(&self.0);
        let status = StatusCode::from_u16(u16::try_from(d.http_status).unwrap_or(500))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            problem_body(&d, "").to_string(),
        )
            .into_response();
        if let Some(r) = d.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, r.into());
        }
        let metadata = self.0.metadata();
        let carried = |key| metadata.get(key).and_then(|v| v.to_str().ok());
        if let Some(v) = carried(super::error::LEADER_METADATA).and_then(|l| l.parse().ok()) {
            resp.headers_mut().insert(super::error::LEADER_METADATA, v);
        }
        // The error's own challenge (a refusal about an agent's credential)
        // stands instead of the registry's, which `set_problem_instance`
        // only adds to a 401 without one.
        if let Some(v) = carried(super::error::CHALLENGE_METADATA).and_then(|c| c.parse().ok()) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        resp
    }
}

/// The message of a problem body with the member it blames in front, for
/// the standards whose error bodies have no member of their own for it
/// (ARD, the MCP registry).
fn problem_message(problem: &Value) -> String {
    let message = problem
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("error");
    match problem.get("field").and_then(Value::as_str) {
        Some(field) if !field.is_empty() && !message.starts_with(field) => {
            format!("{field}: {message}")
        }
        _ => message.to_string(),
    }
}

/// Fills the problem body's `instance` with the request path, so every
/// error names the resource it concerns; on ARD and MCP registry routes
/// the error takes that standard's shape instead (`ard::ard_error`,
/// `mcp_registry::mcp_error`), whoever refused the request.
async fn set_problem_instance(
    State(state): State<HttpState>,
    uri: Uri,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let presented = req.headers().contains_key(header::AUTHORIZATION);
    // Kept for a 401's challenge, which is only built then.
    let host = state
        .oauth
        .as_ref()
        .and_then(|_| req.headers().get(header::HOST).cloned());
    let mut resp = next.run(req).await;
    if resp.extensions().get::<invocation::AgentAnswer>().is_some() {
        return resp;
    }
    if resp.status() == StatusCode::UNAUTHORIZED
        && !resp.headers().contains_key(header::WWW_AUTHENTICATE)
    {
        // RFC 6750: how to authenticate, and whether the token sent was
        // the problem.
        let mut challenge = String::from("Bearer realm=\"agentry\"");
        if presented {
            challenge.push_str(", error=\"invalid_token\"");
        }
        // RFC 9728: where an OAuth client finds the authorization server.
        if let Some(o) = &state.oauth {
            challenge.push_str(", ");
            challenge.push_str(&o.challenge_parameter(host.as_ref(), &uri));
        }
        if let Ok(v) = header::HeaderValue::from_str(&challenge) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
    if resp.status().is_client_error() && is_plain_text(&resp) {
        resp = plain_refusal(resp).await;
    }
    let is_problem = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "application/problem+json");
    if !is_problem {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let mut v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let own_shape = if ard::is_ard_path(uri.path()) {
        Some(ard::ard_error(&v))
    } else if mcp_registry::is_mcp_path(uri.path()) {
        Some(mcp_registry::mcp_error(&v))
    } else {
        None
    };
    if let Some(body) = own_shape {
        let mut parts = parts;
        parts.headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(body.to_string()));
    }
    v["instance"] = json!(uri.path());
    Response::from_parts(parts, Body::from(v.to_string()))
}

fn is_plain_text(resp: &Response) -> bool {
    resp.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"))
}

/// The error body for a refusal axum's own extractors wrote as plain text
/// (a path parameter that is not UTF-8, say): the same status, its text as
/// the message.
async fn plain_refusal(resp: Response) -> Response {
    let status = resp.status();
    let text = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_string()
    } else {
        text
    };
    ApiError(transport_refusal(status.as_u16(), message)).into_response()
}

/// Builds a tonic request carrying the caller's identity and connection,
/// as the gRPC gate layer would.
fn grpc_request<T>(caller: &Caller, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.extensions_mut().insert(caller.0.clone());
    if let Some(peer) = &caller.1 {
        req.extensions_mut().insert(peer.clone());
    }
    req
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn record_json(r: Option<&pb::AgentRecord>) -> Result<Value, ApiError> {
    let r = r.ok_or_else(|| ServiceError::Internal("handler returned no record".into()))?;
    record_pb_to_json(r).map_err(|e| ServiceError::Internal(e.to_string()).into())
}

/// The revision an `If-Match` header names (the record's ETag, strong
/// comparison, RFC 9110 13.1.1): the write (update, deletion, status
/// change) applies only while the record still has it (whether it is
/// served as expired does not matter to a write). `*` asks only that the
/// record exists, as each of these writes does anyway.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text == "*" {
        return Ok(None);
    }
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .and_then(|t| t.split('.').next())
        .and_then(|t| t.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            ServiceError::PreconditionFailed(format!(
                "If-Match {text:?} names no revision of this record (its ETag is the revision in quotes, e.g. \"12\")"
            ))
            .into()
        })
}

/// A record's ETag: its revision, and whether it is served as expired,
/// which changes with time (or a lease's refresh) at the same revision,
/// so a 304 never keeps a client on a stale `expired`.
fn etag(r: &pb::AgentRecord) -> String {
    let (revision, expired) = r
        .envelope
        .as_ref()
        .map_or((0, false), |e| (e.revision, e.expired));
    if expired {
        format!("\"{revision}.expired\"")
    } else {
        format!("\"{revision}\"")
    }
}

/// Reads a JSON body: the media type must be JSON, the size within the
/// limit, and the text well-formed.
async fn json_body(state: &HttpState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let bytes = json_bytes(state, headers, body).await?;
    crate::domain::json::parse_json(&bytes)
        .map_err(|e| invalid(None, format!("request body is not valid JSON: {e}")))
}

/// `v` as `T`, a member that does not fit named in the error (its field,
/// and the start of its message, as every field error's).
fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    crate::convert::from_json(v).map_err(|e| ServiceError::from(e).into())
}

/// Reads a JSON body (as `json_body` does) as `T`.
async fn typed_body<T: serde::de::DeserializeOwned>(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    typed(json_body(state, headers, body).await?)
}

/// Reads the JSON body of a route whose body may be left out (no
/// `Content-Type`): `T`'s default then, else the body as `T`.
async fn optional_body<T: serde::de::DeserializeOwned + Default>(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    if !headers.contains_key(header::CONTENT_TYPE) {
        return Ok(T::default());
    }
    typed_body(state, headers, body).await
}

/// Reads a body declared as JSON, within the size limit, unparsed.
async fn json_bytes(state: &HttpState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ctype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !(essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json")))
    {
        return Err(ApiError(transport_refusal(
            415,
            format!("Content-Type must be application/json, not '{ctype}'"),
        )));
    }
    decoded_body(headers, body, state.max_body)
        .await
        .map(without_bom)
        .map_err(ApiError)
}

/// `bytes` without a leading UTF-8 byte order mark. RFC 8259 (8.1) lets a
/// parser ignore one, and editors on Windows write one into JSON files
/// that `curl --data-binary @file` then sends; the record is stored
/// without it.
fn without_bom(bytes: Bytes) -> Bytes {
    match bytes.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) => bytes.slice(bytes.len() - rest.len()..),
        None => bytes,
    }
}

/// A request body read whole: 413 when it is longer than `limit`, 400 when
/// it cannot be read at all (a malformed chunked encoding, say), each with
/// the error body. A `Content-Length` over the limit is refused before any
/// of the body is read: waiting for bytes that will be refused anyway would
/// hold the connection until the body deadline (408) instead of answering.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, tonic::Status> {
    let too_large = || {
        transport_refusal(
            413,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    };
    if usize::try_from(http_body::Body::size_hint(&body).lower()).map_or(true, |n| n > limit) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        // The limit's error sits under one or two of axum's own wrappers.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(c) = cause {
            if c.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            cause = c.source();
        }
        transport_refusal(400, format!("the request body could not be read: {e}"))
    })
}

/// Parses agent metadata JSON, naming the member with the wrong type.
/// A JSON object (the body, at pointer "", or a member of it) whose
/// members are all among `allowed`.
fn json_object<'a>(
    v: &'a Value,
    pointer: &str,
    allowed: &[&str],
) -> Result<&'a serde_json::Map<String, Value>, ApiError> {
    let Value::Object(o) = v else {
        let message = if pointer.is_empty() {
            "the body must be a JSON object".to_string()
        } else {
            format!("{pointer}: must be an object")
        };
        return Err(invalid(Some(pointer), message));
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(invalid(
            Some(&format!("{pointer}/{k}")),
            format!("unknown member '{k}' (allowed: {})", allowed.join(", ")),
        ));
    }
    Ok(o)
}

/// An optional string member; null counts as absent.
fn string_member(
    o: &serde_json::Map<String, Value>,
    key: &str,
    pointer: &str,
) -> Result<Option<String>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(
            Some(pointer),
            format!("{pointer}: must be a string"),
        )),
    }
}

fn parse_metadata(v: Value) -> Result<pb::AgentMetadata, ApiError> {
    crate::convert::metadata_from_json(v).map_err(|e| ServiceError::from(e).into())
}

/// Query parameters that may be repeated, each occurrence adding values
/// (`?tags=a&tags=b` is `?tags=a,b`). Any other may be given once:
/// `?publisher=a&publisher=b` is refused, not read as whichever one a
/// proxy in front did not read.
const REPEATABLE_PARAMS: &[&str] = &[
    "capabilities",
    "tags",
    "language",
    "status",
    "protocol",
    "reader",
];

/// Query parameters, all values of repeated or comma-separated keys, with
/// unknown keys refused so typos do not silently widen a query, and keys
/// outside `REPEATABLE_PARAMS` refused when given twice.
fn query_params(raw: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    for (i, (k, _)) in pairs.iter().enumerate() {
        if !allowed.contains(&k.as_str()) {
            return Err(invalid(
                None,
                format!(
                    "unknown query parameter '{k}' (allowed: {})",
                    allowed.join(", ")
                ),
            ));
        }
        if !REPEATABLE_PARAMS.contains(&k.as_str()) && pairs[..i].iter().any(|(p, _)| p == k) {
            return Err(invalid(
                Some(&format!("/{k}")),
                format!("/{k}: query parameter '{k}' may be given once"),
            ));
        }
    }
    Ok(pairs)
}

fn values(pairs: &[(String, String)], key: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .flat_map(|(_, v)| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The value of a parameter `query_params` let through once at most.
fn single(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

fn consistency_param(pairs: &[(String, String)]) -> Result<i32, ApiError> {
    Ok(match single(pairs, "consistency").as_deref() {
        None | Some("local") => pb::ReadConsistency::Local as i32,
        Some("linearizable") => pb::ReadConsistency::Linearizable as i32,
        Some(other) => {
            return Err(invalid(
                Some("/consistency"),
                format!("consistency must be 'local' or 'linearizable', not '{other}'"),
            ))
        }
    })
}

/// Every value of a repeated query parameter.
fn all(pairs: &[(String, String)], name: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .collect()
}

fn visibility_param(pairs: &[(String, String)]) -> Result<i32, ApiError> {
    Ok(match single(pairs, "visibility").as_deref() {
        None => pb::Visibility::Unspecified as i32,
        Some(v) => match Visibility::parse(v) {
            Some(Visibility::Public) => pb::Visibility::Public as i32,
            Some(Visibility::Private) => pb::Visibility::Private as i32,
            None => {
                return Err(invalid(
                    Some("/visibility"),
                    format!("visibility must be 'public' or 'private', not '{v}'"),
                ))
            }
        },
    })
}

fn status_list(raw: &[String], pointer: &str) -> Result<Vec<i32>, ApiError> {
    raw.iter()
        .map(|s| {
            AgentStatus::parse(s)
                .map(|st| status_to_pb(Some(st)) as i32)
                .ok_or_else(|| {
                    invalid(
                        Some(pointer),
                        format!(
                            "unknown status '{s}' (use active, deprecated, inactive or deleted)"
                        ),
                    )
                })
        })
        .collect()
}

/// A non-negative integer parameter; absent, the type's default (0).
fn parse_uint<T: std::str::FromStr + Default>(
    v: Option<String>,
    pointer: &str,
) -> Result<T, ApiError> {
    v.map(|s| {
        s.parse::<T>().map_err(|_| {
            invalid(
                Some(pointer),
                format!("{pointer}: '{s}' is not a non-negative integer"),
            )
        })
    })
    .transpose()
    .map(Option::unwrap_or_default)
}

fn parse_bool(v: Option<String>, pointer: &str) -> Result<bool, ApiError> {
    match v.as_deref() {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(o) => Err(invalid(
            Some(pointer),
            format!("{pointer}: '{o}' is not a boolean"),
        )),
    }
}

async fn register(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["visibility", "reader"])?;
    let metadata = parse_metadata(json_body(&s, &headers, body).await?)?;
    let req = grpc_request(
        &caller,
        pb::RegisterRequest {
            metadata: Some(metadata),
            visibility: visibility_param(&pairs)?,
            readers: all(&pairs, "reader"),
        },
    );
    let resp = s.api.register(req).await?.into_inner();
    let record = resp.record.as_ref();
    let body = record_json(record)?;
    let mut out = json_response(
        if resp.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &body,
    );
    if let Some(r) = record {
        if let Ok(v) = etag(r).parse() {
            out.headers_mut().insert(header::ETAG, v);
        }
        if resp.created {
            let id = r
                .metadata
                .as_ref()
                .map(|m| m.id.as_str())
                .unwrap_or_default();
            let loc = format!(
                "/agents/{}",
                url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
            );
            if let Ok(v) = loc.parse() {
                out.headers_mut().insert(header::LOCATION, v);
            }
        }
    }
    Ok(out)
}

async fn get_agent(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["consistency"])?;
    let req = grpc_request(
        &caller,
        pb::GetRequest {
            id,
            consistency: consistency_param(&pairs)?,
        },
    );
    let resp = s.api.get(req).await?.into_inner();
    let tag = resp.record.as_ref().map(etag);
    let unchanged = match (tag.as_deref(), headers.get(header::IF_NONE_MATCH)) {
        (Some(tag), Some(inm)) => inm
            .to_str()
            .is_ok_and(|inm| crate::service::none_match_fails(inm, tag)),
        _ => false,
    };
    let mut out = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        json_response(StatusCode::OK, &record_json(resp.record.as_ref())?)
    };
    if let Some(v) = tag.and_then(|t| t.parse().ok()) {
        out.headers_mut().insert(header::ETAG, v);
    }
    out.headers_mut()
        .insert("x-agentry-applied-revision", resp.applied_revision.into());
    Ok(out)
}

async fn update_agent(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["visibility", "reader"])?;
    let expected_revision = if_match(&headers)?;
    let metadata = parse_metadata(json_body(&s, &headers, body).await?)?;
    let req = grpc_request(
        &caller,
        pb::UpdateRequest {
            id,
            metadata: Some(metadata),
            visibility: visibility_param(&pairs)?,
            readers: all(&pairs, "reader"),
            expected_revision,
        },
    );
    let resp = s.api.update(req).await?.into_inner();
    Ok(json_response(
        StatusCode::OK,
        &record_json(resp.record.as_ref())?,
    ))
}

async fn delete_agent(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let expected_revision = if_match(&headers)?;
    let req = grpc_request(
        &caller,
        pb::DeleteRequest {
            id,
            expected_revision,
        },
    );
    let resp = s.api.delete(req).await?.into_inner();
    Ok(json_response(
        StatusCode::OK,
        &json!({"id": resp.id, "revision": resp.revision, "deleted": true}),
    ))
}

async fn set_status(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let expected_revision = if_match(&headers)?;
    let v = json_body(&s, &headers, body).await?;
    let status = match v.get("status") {
        Some(Value::String(st)) => status_list(std::slice::from_ref(st), "/status")?[0],
        Some(_) => return Err(invalid(Some("/status"), "/status: must be a string")),
        None => {
            return Err(invalid(
                Some("/status"),
                "/status: is required (active, deprecated, inactive or deleted)",
            ))
        }
    };
    let reason = match v.get("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) => Some(r.clone()),
        Some(_) => return Err(invalid(Some("/reason"), "/reason: must be a string")),
    };
    let req = grpc_request(
        &caller,
        pb::SetStatusRequest {
            id,
            status,
            reason,
            expected_revision,
        },
    );
    let resp = s.api.set_status(req).await?.into_inner();
    Ok(json_response(
        StatusCode::OK,
        &record_json(resp.record.as_ref())?,
    ))
}

async fn list_agents(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(q): RawQuery,
) -> ApiResult {
    let pairs = query_params(
        q.as_deref(),
        &[
            "capabilities",
            "tags",
            "language",
            "status",
            "publisher",
            "owner",
            "include_expired",
            "page_size",
            "page_token",
            "consistency",
        ],
    )?;
    let req = pb::ListRequest {
        capabilities: values(&pairs, "capabilities"),
        tags: values(&pairs, "tags"),
        languages: values(&pairs, "language"),
        statuses: status_list(&values(&pairs, "status"), "/status")?,
        publisher: single(&pairs, "publisher"),
        owner: single(&pairs, "owner"),
        include_expired: parse_bool(single(&pairs, "include_expired"), "/include_expired")?,
        page_size: parse_uint(single(&pairs, "page_size"), "/page_size")?,
        page_token: single(&pairs, "page_token").unwrap_or_default(),
        consistency: consistency_param(&pairs)?,
        query: String::new(),
    };
    let resp = s.api.list(grpc_request(&caller, req)).await?.into_inner();
    let agents = resp
        .records
        .iter()
        .map(|r| record_json(Some(r)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "agents": agents,
            "next_page_token": resp.next_page_token,
            "total_count": resp.total_count,
            "applied_revision": resp.applied_revision,
        }),
    ))
}

/// Reads a string-or-array member of the AIDIP search filters.
fn string_list(v: Option<&Value>, pointer: &str) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(String::from).ok_or_else(|| {
                    invalid(
                        Some(&format!("{pointer}/{i}")),
                        format!("{pointer}/{i}: must be a string"),
                    )
                })
            })
            .collect(),
        Some(_) => Err(invalid(
            Some(pointer),
            format!("{pointer}: must be a string or an array of strings"),
        )),
    }
}

/// AIDIP summary of a record: the fields a client needs to choose.
fn summary(r: &Value) -> Value {
    let endpoint = r
        .get("endpoint")
        .cloned()
        .or_else(|| r.pointer("/bindings/0/endpoint").cloned());
    let mut out = json!({"id": r["id"], "name": r["name"], "description": r["description"]});
    for (k, v) in [
        ("endpoint", endpoint),
        ("capabilities", r.get("capabilities").cloned()),
        ("tags", r.get("tags").cloned()),
        ("status", r.get("status").cloned()),
        ("version", r.get("version").cloned()),
    ] {
        if let Some(v) = v {
            out[k] = v;
        }
    }
    out
}

/// `POST /agents/search`, AIDIP shape. With a natural-language `query`
/// the matching agents come ranked, best first, each with its `score`;
/// without one it is the plain filter search.
async fn search_agents(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let obj = json_object(&v, "", &["filters", "query", "top"])?;
    let query = string_member(obj, "query", "/query")?.unwrap_or_default();
    let top = match obj.get("top") {
        None | Some(Value::Null) => 10,
        Some(t) => t
            .as_u64()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| invalid(Some("/top"), "/top: must be an integer from 1 to 1000"))?
            as u32,
    };
    let empty = serde_json::Map::new();
    let filters = match obj.get("filters") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(f)) => f,
        Some(_) => return Err(invalid(Some("/filters"), "/filters: must be an object")),
    };
    for k in filters.keys() {
        if filter::key(Surface::AidipSearch, k).is_none() {
            return Err(invalid(
                Some(&format!("/filters/{k}")),
                format!(
                    "unsupported filter '{k}' (supported: {})",
                    filter::names(Surface::AidipSearch)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let mut languages = string_list(
        filters.get("supported_languages"),
        "/filters/supported_languages",
    )?;
    languages.extend(string_list(
        filters.get("supported_language"),
        "/filters/supported_language",
    )?);
    languages.extend(string_list(filters.get("language"), "/filters/language")?);
    let mut req = pb::ListRequest {
        capabilities: string_list(filters.get("capabilities"), "/filters/capabilities")?,
        tags: string_list(filters.get("tags"), "/filters/tags")?,
        languages,
        statuses: status_list(
            &string_list(filters.get("status"), "/filters/status")?,
            "/filters/status",
        )?,
        publisher: string_list(filters.get("publisher"), "/filters/publisher")?
            .into_iter()
            .next(),
        page_size: top,
        query,
        ..Default::default()
    };
    // The answer is summaries, so it stays small however large the records
    // are; the records come a page (at most about 2 MiB) at a time.
    let mut out = Vec::new();
    loop {
        let resp = s
            .api
            .list(grpc_request(&caller, req.clone()))
            .await?
            .into_inner();
        for (i, r) in resp.records.iter().enumerate() {
            let mut item = summary(&record_json(Some(r))?);
            if let Some(score) = resp.scores.get(i) {
                item["score"] = json!((score * 10_000.0).round() / 10_000.0);
            }
            out.push(item);
        }
        if resp.next_page_token.is_empty() || out.len() >= top as usize {
            break;
        }
        req.page_token = resp.next_page_token;
    }
    out.truncate(top as usize);
    Ok(json_response(StatusCode::OK, &Value::Array(out)))
}

/// `POST /discover`: an ADP Discovery Request in, an ADP Discovery Response
/// out, through the gRPC `Discovery.Discover` handler.
async fn discover(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let req = discover_request_from_json(v).map_err(ServiceError::from)?;
    let resp = pb::discovery_server::Discovery::discover(&s.api, grpc_request(&caller, req))
        .await?
        .into_inner();
    let body = discover_response_to_json(resp).map_err(ServiceError::from)?;
    Ok(json_response(StatusCode::OK, &body))
}

/// `POST /resolve`: AIDIP Agent Semantic Resolution, through the gRPC
/// `Discovery.Resolve` handler.
async fn resolve(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let req = resolve_request_from_json(v).map_err(ServiceError::from)?;
    let resp = pb::discovery_server::Discovery::resolve(&s.api, grpc_request(&caller, req))
        .await?
        .into_inner();
    let body = resolve_response_to_json(&resp).map_err(ServiceError::from)?;
    Ok(json_response(StatusCode::OK, &body))
}

async fn healthz(State(s): State<HttpState>) -> Response {
    match s.api.service().live() {
        Ok(()) => json_response(StatusCode::OK, &json!({"status": "ok"})),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn readyz(State(s): State<HttpState>) -> Response {
    match s.api.service().ready() {
        Ok(revision) => json_response(
            StatusCode::OK,
            &json!({"status": "ready", "applied_revision": revision}),
        ),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn metrics_page(State(s): State<HttpState>) -> Response {
    let service = s.api.service();
    let reader = service.reader();
    let peers: Vec<metrics::PeerSync> = service
        .peers()
        .all()
        .iter()
        .filter(|p| p.sync)
        // A cursor that cannot be read leaves the peer out rather than
        // showing 0.
        .filter_map(|p| {
            Some(metrics::PeerSync {
                cursor: reader.federation_cursor(&p.authority).ok()?,
                copies: reader.peer_copies(&p.authority),
                max_records: p.max_records.unwrap_or(0),
                authority: p.authority.clone(),
            })
        })
        .collect();
    let body = metrics::render(
        &service.node_status(),
        reader.applied_revision(),
        reader.oldest_revision(),
        &service.index().stats(),
        s.gate.open_streams(),
        &peers,
        service.space_stats(),
    );
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn no_route(method: Method, uri: Uri) -> Response {
    let response = ApiError::from(ServiceError::NotFound(format!(
        "no route for {method} {}",
        uri.path()
    )))
    .into_response();
    crate::metrics::observe_unrouted("http", "404".into(), std::time::Duration::ZERO);
    response
}

async fn wrong_method(method: Method, uri: Uri) -> Response {
    let message = format!("method {method} is not allowed on {}", uri.path());
    crate::metrics::observe_unrouted("http", "405".into(), std::time::Duration::ZERO);
    ApiError(transport_refusal(405, message)).into_response()
}

/// The facade's routes, collected as (class, method, path) while the
/// router is built, so the OpenAPI document can be checked against exactly
/// these and the gate knows what each one costs.
pub struct Routes {
    router: Router<HttpState>,
    pub table: Vec<(&'static str, &'static str)>,
    classes: RouteClasses,
}

impl Routes {
    fn add(
        mut self,
        class: OpClass,
        method: &'static str,
        path: &'static str,
        handler: MethodRouter<HttpState>,
    ) -> Self {
        self.router = self.router.route(path, handler);
        self.table.push((method, path));
        self.classes.insert(format!("{method} {path}"), class);
        self
    }
}

/// Builds the facade's routes.
pub fn routes() -> Routes {
    Routes {
        router: Router::new(),
        table: Vec::new(),
        classes: HashMap::new(),
    }
    .add(OpClass::Write, "POST", "/agents", routing::post(register))
    .add(OpClass::Read, "GET", "/agents", routing::get(list_agents))
    .add(
        OpClass::Read,
        "GET",
        "/changes",
        routing::get(changes::follow),
    )
    .add(
        OpClass::Discover,
        "POST",
        "/agents/search",
        routing::post(search_agents),
    )
    .add(
        OpClass::Discover,
        "POST",
        "/discover",
        routing::post(discover),
    )
    .add(
        OpClass::Discover,
        "POST",
        "/resolve",
        routing::post(resolve),
    )
    .add(
        OpClass::Read,
        "GET",
        "/agents/{id}",
        routing::get(get_agent),
    )
    .add(
        OpClass::Write,
        "PUT",
        "/agents/{id}",
        routing::put(update_agent),
    )
    .add(
        OpClass::Write,
        "DELETE",
        "/agents/{id}",
        routing::delete(delete_agent),
    )
    .add(
        OpClass::Write,
        "POST",
        "/agents/{id}/status",
        routing::post(set_status),
    )
    .add(
        OpClass::Write,
        "POST",
        "/agents/{id}/refresh",
        routing::post(leases::refresh_agent),
    )
    .add(
        OpClass::Write,
        "POST",
        "/leases/{lease}/refresh",
        routing::post(leases::refresh_lease),
    )
    .add(
        OpClass::Read,
        "GET",
        "/leases/{lease}",
        routing::get(leases::get_lease),
    )
    .add(
        OpClass::Write,
        "DELETE",
        "/leases/{lease}",
        routing::delete(leases::revoke_lease),
    )
    .add(
        OpClass::Invoke,
        "POST",
        "/agents/{id}/invoke",
        routing::post(invocation::invoke),
    )
    .add(
        OpClass::Read,
        "GET",
        "/.well-known/woa.json",
        routing::get(invocation::woa_document),
    )
    .add(
        OpClass::Read,
        "GET",
        "/.well-known/ai-catalog.json",
        routing::get(ard::catalog),
    )
    .add(
        OpClass::Discover,
        "POST",
        "/ard/search",
        routing::post(ard::search),
    )
    .add(
        OpClass::Discover,
        "POST",
        "/ard/explore",
        routing::post(ard::explore),
    )
    .add(OpClass::Read, "GET", "/ard/agents", routing::get(ard::list))
    .add(
        OpClass::Read,
        "GET",
        "/v0.1/servers",
        routing::get(mcp_registry::list),
    )
    .add(
        OpClass::Read,
        "GET",
        "/v0.1/servers/{serverName}/versions",
        routing::get(mcp_registry::versions),
    )
    .add(
        OpClass::Read,
        "GET",
        "/v0.1/servers/{serverName}/versions/{version}",
        routing::get(mcp_registry::version),
    )
    .add(
        OpClass::Write,
        "PUT",
        "/v0.1/servers/{serverName}/versions/{version}",
        routing::put(mcp_registry::not_offered),
    )
    .add(
        OpClass::Write,
        "DELETE",
        "/v0.1/servers/{serverName}/versions/{version}",
        routing::delete(mcp_registry::not_offered),
    )
    .add(
        OpClass::Write,
        "POST",
        "/v0.1/publish",
        routing::post(mcp_registry::publish),
    )
    .add(
        OpClass::Write,
        "PATCH",
        "/v0.1/servers/{serverName}/versions/{version}/status",
        routing::patch(mcp_registry::version_status),
    )
    .add(
        OpClass::Write,
        "PATCH",
        "/v0.1/servers/{serverName}/status",
        routing::patch(mcp_registry::server_status),
    )
    .add(
        OpClass::Read,
        "GET",
        "/ard/agents/{identifier}",
        routing::get(ard::get),
    )
    .add(
        OpClass::Invoke,
        "POST",
        "/import/{format}",
        routing::post(invocation::import),
    )
    .add(
        OpClass::Read,
        "GET",
        "/ap",
        routing::get(agent_protocol::list),
    )
    .add(
        OpClass::Read,
        "GET",
        "/agents/{id}/describe",
        routing::get(agent_protocol::describe),
    )
    .add(
        OpClass::Invoke,
        "POST",
        "/agents/{id}/run",
        routing::post(agent_protocol::run),
    )
    .add(
        OpClass::Invoke,
        "GET",
        "/agents/{id}/get_events/{run_id}",
        routing::get(agent_protocol::get_events),
    )
    .add(
        OpClass::Invoke,
        "POST",
        "/agents/{id}/stream_request",
        routing::post(agent_protocol::stream_request),
    )
    .add(
        OpClass::Read,
        "GET",
        "/agents/{id}/runs/{run_id}",
        routing::get(agent_protocol::run_status),
    )
    .add(
        OpClass::Read,
        "GET",
        "/agents/{id}/threads",
        routing::get(agent_protocol::threads),
    )
    .add(
        OpClass::Read,
        "GET",
        "/cluster",
        routing::get(cluster::status),
    )
    .add(OpClass::Read, "GET", "/audit", routing::get(cluster::audit))
    .add(
        OpClass::Admin,
        "GET",
        "/cluster/backup",
        routing::get(cluster::backup),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/cluster/init",
        routing::post(cluster::initialize),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/cluster/learners",
        routing::post(cluster::add_learner),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/cluster/members/{id}/promote",
        routing::post(cluster::promote),
    )
    .add(
        OpClass::Admin,
        "DELETE",
        "/cluster/members/{id}",
        routing::delete(cluster::remove),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/cluster/transfer-leader",
        routing::post(cluster::transfer_leader),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/cluster/check",
        routing::post(cluster::check),
    )
    .add(
        OpClass::Read,
        "GET",
        "/.well-known/agentry.json",
        routing::get(federation::registry_info),
    )
    .add(
        OpClass::Read,
        "GET",
        "/.well-known/oauth-protected-resource",
        routing::get(oauth::registry),
    )
    .add(
        OpClass::Read,
        "GET",
        "/.well-known/oauth-protected-resource/mcp",
        routing::get(oauth::mcp),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/admin/keys",
        routing::post(federation::rotate_key),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/admin/keys/{key_id}/retire",
        routing::post(federation::retire_key),
    )
    .add(
        OpClass::Admin,
        "POST",
        "/admin/keys/{key_id}/revoke",
        routing::post(federation::revoke_key),
    )
    .add(
        OpClass::Write,
        "POST",
        "/publisher-keys",
        routing::post(federation::add_publisher_key),
    )
    .add(
        OpClass::Read,
        "GET",
        "/publisher-keys",
        routing::get(federation::list_publisher_keys),
    )
    .add(
        OpClass::Write,
        "DELETE",
        "/publisher-keys/{key_id}",
        routing::delete(federation::remove_publisher_key),
    )
    .add(OpClass::Read, "GET", "/healthz", routing::get(healthz))
    .add(OpClass::Read, "GET", "/readyz", routing::get(readyz))
    .add(OpClass::Read, "GET", "/metrics", routing::get(metrics_page))
    .add(OpClass::Read, "GET", "/openapi.json", routing::get(openapi))
    // The directory page: static, so a Read route any caller may load (its
    // script then calls the API with the caller's own token).
    .add(OpClass::Read, "GET", "/ui", routing::get(ui::page))
    .add(
        OpClass::Read,
        "GET",
        "/ui/assets/{name}",
        routing::get(ui::asset),
    )
    // The registry as an MCP server. Every message is charged as a read
    // here; a tool call adds its tool's class (`mcp_server`).
    .add(
        OpClass::Read,
        "POST",
        super::mcp_server::MCP_PATH,
        routing::post(super::mcp_server::serve),
    )
}

/// The answer to a request still unanswered at its deadline `limit`: the
/// client's fault (408) if its body had not all arrived, else the server's
/// (504).
fn late_answer(limit: std::time::Duration, body_received: bool) -> Response {
    if body_received {
        return ApiError::from(crate::api::gate::late(limit)).into_response();
    }
    let message = format!(
        "the request body did not arrive within {} s",
        limit.as_secs()
    );
    ApiError(transport_refusal(408, message)).into_response()
}

/// A request body that notes when its last byte has been read.
struct Received {
    inner: Body,
    received: Arc<AtomicBool>,
}

impl HttpBody for Received {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.received.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Passes every routed request through the gate (the same `Gate::admit`
/// the gRPC layer calls) with its route's class, and hands the identity on
/// in the request's extensions. An admitted request that runs past its
/// deadline (`gate::deadline`) is answered inside its audit scope, so the
/// trail records why: 408 when its body had not all arrived by then (the
/// client stalled), else 504.
async fn gate_http(
    State((state, classes, request_timeout)): State<(
        HttpState,
        Arc<RouteClasses>,
        std::time::Duration,
    )>,
    matched: Option<axum::extract::MatchedPath>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().as_str();
    let route = matched.as_ref().map_or("", |m| m.as_str());
    let operation = format!("{method} {route}");
    // axum answers HEAD through the GET route (the same answer without its
    // body, RFC 9110 9.3.2), so it passes the gate as that GET.
    let class = classes.get(&operation).copied().or_else(|| {
        (req.method() == axum::http::Method::HEAD)
            .then(|| classes.get(&format!("GET {route}")).copied())
            .flatten()
    });
    let Some(class) = class else {
        return ApiError::from(ServiceError::Internal(format!(
            "route {method} {} has no gate class",
            req.uri().path()
        )))
        .into_response();
    };
    let peer = req.extensions().get::<Peer>().cloned();
    let started = std::time::Instant::now();
    let limit = crate::api::gate::deadline(&operation, request_timeout);
    let due = tokio::time::Instant::now() + limit;
    let (admitted, audited) = state
        .gate
        .admit_audited(req.headers(), peer.as_ref(), class, &operation, limit)
        .await;
    let streams = crate::api::gate::http_streams(&operation);
    let response = audited
        .run(async move {
            match admitted {
                Ok(identity) => {
                    let slot = if streams {
                        match state.gate.open_stream(identity.0.as_ref(), peer.as_ref()) {
                            Ok(slot) => slot,
                            Err(e) => return ApiError::from(e).into_response(),
                        }
                    } else {
                        None
                    };
                    req.extensions_mut().insert(identity);
                    let received = Arc::new(AtomicBool::new(false));
                    let req = req.map(|inner| {
                        received.store(HttpBody::is_end_stream(&inner), Ordering::Relaxed);
                        Body::new(Received {
                            inner,
                            received: received.clone(),
                        })
                    });
                    let Ok(response) = tokio::time::timeout_at(due, next.run(req)).await else {
                        return late_answer(limit, received.load(Ordering::Relaxed));
                    };
                    match slot {
                        Some(slot) => response
                            .map(|b| axum::body::Body::new(crate::api::gate::holding(b, slot))),
                        None => response,
                    }
                }
                Err(e) => ApiError::from(e).into_response(),
            }
        })
        .await;
    crate::metrics::observe_request(
        crate::metrics::RequestLabels {
            transport: "http",
            route: operation,
            code: response.status().as_u16().to_string(),
        },
        started.elapsed(),
    );
    response
}

/// The `error` event that ends a stream of server-sent events: the
/// failure's problem body, as a request that failed at once would get.
fn error_event(status: &tonic::Status) -> axum::response::sse::Event {
    let d = crate::api::error::detail_of(status);
    axum::response::sse::Event::default()
        .event("error")
        .data(crate::api::error::problem_body(&d, "").to_string())
}

/// Gate class by "METHOD /route/{param}".
type RouteClasses = HashMap<String, OpClass>;

/// The caller as the gate identified it, and its connection. A handler
/// reached without passing the gate fails here instead of running as
/// anonymous.
struct Caller(Identity, Option<Peer>);

impl Caller {
    /// For the routes that call a use case directly (documents, the MCP
    /// registry) rather than a gRPC handler.
    fn principal(&self) -> Option<crate::domain::Principal> {
        self.0 .0.clone()
    }

    /// `answer`, a stream, holding one of the caller's stream slots for as
    /// long as it is open; 429 when the caller holds its most. For the
    /// routes that stream only when asked to (`invoke`, `get_events`), so
    /// their plain answers take none; the routes that always stream take
    /// theirs in the gate (`gate::http_streams`).
    fn hold_stream(
        &self,
        gate: &crate::api::gate::Gate,
        answer: impl std::future::Future<Output = ApiResult>,
    ) -> impl std::future::Future<Output = ApiResult> {
        let slot = gate.open_stream(self.0 .0.as_ref(), self.1.as_ref());
        async move {
            let Some(slot) = slot? else {
                return answer.await;
            };
            Ok(answer
                .await?
                .map(|b| axum::body::Body::new(crate::api::gate::holding(b, slot))))
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, ApiError> {
        let peer = parts.extensions.get::<Peer>().cloned();
        parts
            .extensions
            .get::<Identity>()
            .cloned()
            .map(|identity| Caller(identity, peer))
            .ok_or_else(|| {
                ServiceError::Internal("the request did not pass the gate".into()).into()
            })
    }
}

/// The facade as a ready router; requests fail after `request_timeout`.
pub fn router(state: HttpState, request_timeout: std::time::Duration) -> Router {
    let routes = routes();
    let classes = Arc::new(routes.classes);
    routes
        .router
        .route_layer(axum::middleware::from_fn_with_state(
            (state.clone(), classes, request_timeout),
            gate_http,
        ))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        // Every request, routed or not, after CORS's preflights (which
        // carry nothing to read) and inside it, so a browser can read the
        // refusal.
        .layer(axum::middleware::from_fn(request_head::check_request_head))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            cors::cors,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            set_problem_instance,
        ))
        // Failed answers are logged once, with their correlation id, where
        // the error is mapped (api::error); not a second time here.
        .layer(
            tower_http::trace::TraceLayer::new_for_http().on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ),
        )
        // Outermost, so what it compresses is the answer as finished
        // (problem bodies given their instance, CORS headers set).
        .layer(encoding::compression())
        .with_state(state)
}
