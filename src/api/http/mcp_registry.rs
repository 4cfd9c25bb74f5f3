//! MCP Registry API v0.1 routes (`/v0.1/...`). This API is HTTP by
//! definition, so these routes call the MCP use cases (`service::mcp`)
//! directly, as woa.json does; the records they read and write are the
//! Registry's own, served over gRPC by `agentry.v1.Registry`. Errors on
//! these routes take the API's shape, `{"error": "<message>"}`
//! (`mcp_error`).

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use super::{
    invalid, json_body, json_response, parse_bool, query_params, single, ApiResult, Caller,
    HttpState,
};
use crate::domain::mcp::{self, ListFilter, McpStatus};
use crate::service::ServiceError;

/// Paths whose errors are the MCP registry's.
pub(super) fn is_mcp_path(path: &str) -> bool {
    path.starts_with("/v0.1/")
}

/// The MCP registry's error body for a problem body of the one mapping.
pub(super) fn mcp_error(problem: &Value) -> Value {
    json!({ "error": super::problem_message(problem) })
}

/// `GET /v0.1/servers`.
pub(super) async fn list(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let pairs = query_params(
        raw.as_deref(),
        &[
            "cursor",
            "limit",
            "search",
            "updated_since",
            "version",
            "include_deleted",
        ],
    )?;
    let limit = match single(&pairs, "limit") {
        None => 0,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=mcp::MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                invalid(
                    Some("/limit"),
                    format!("/limit: must be from 1 to {}", mcp::MAX_LIMIT),
                )
            })?,
    };
    let filter = ListFilter::new(
        single(&pairs, "search").as_deref(),
        single(&pairs, "version").as_deref(),
        single(&pairs, "updated_since").as_deref(),
        parse_bool(single(&pairs, "include_deleted"), "/include_deleted")?,
    )
    .map_err(ServiceError::from)?;
    let page = s
        .mcp
        .list(
            caller.principal().as_ref(),
            filter,
            single(&pairs, "cursor").as_deref(),
            limit,
        )
        .await?;
    let mut metadata = json!({"count": page.servers.len()});
    if let Some(c) = page.next_cursor {
        metadata["nextCursor"] = json!(c);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"servers": page.servers, "metadata": metadata}),
    ))
}

/// `GET /v0.1/servers/{serverName}/versions`.
pub(super) async fn versions(
    State(s): State<HttpState>,
    caller: Caller,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let pairs = query_params(raw.as_deref(), &["include_deleted"])?;
    let include_deleted = parse_bool(single(&pairs, "include_deleted"), "/include_deleted")?;
    let servers = s
        .mcp
        .versions(caller.principal().as_ref(), &name, include_deleted)
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"servers": servers, "metadata": {"count": servers.len()}}),
    ))
}

/// `GET /v0.1/servers/{serverName}/versions/{version}`.
pub(super) async fn version(
    State(s): State<HttpState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult {
    let server = s
        .mcp
        .version(caller.principal().as_ref(), &name, &version)
        .await?;
    Ok(json_response(StatusCode::OK, &server))
}

/// `POST /v0.1/publish`: a `server.json` in, its `ServerResponse` out.
pub(super) async fn publish(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let server = json_body(&s, &headers, body).await?;
    let published = s.mcp.publish(caller.principal().as_ref(), server).await?;
    Ok(json_response(StatusCode::OK, &published))
}

/// The body of both status routes.
fn status_body(v: &Value) -> Result<(McpStatus, Option<String>), super::ApiError> {
    let o = super::json_object(v, "", &["status", "statusMessage"])?;
    let status = o
        .get("status")
        .and_then(Value::as_str)
        .and_then(McpStatus::parse)
        .ok_or_else(|| {
            invalid(
                Some("/status"),
                "/status: must be active, deprecated or deleted",
            )
        })?;
    let message = super::string_member(o, "statusMessage", "/statusMessage")?;
    Ok((status, message))
}

/// `PATCH /v0.1/servers/{serverName}/versions/{version}/status`.
pub(super) async fn version_status(
    State(s): State<HttpState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let (status, message) = status_body(&json_body(&s, &headers, body).await?)?;
    let mut changed = s
        .mcp
        .set_status(
            caller.principal().as_ref(),
            &name,
            Some(&version),
            status,
            message,
        )
        .await?;
    let server = changed
        .pop()
        .ok_or_else(|| ServiceError::Internal("no version changed".into()))?;
    Ok(json_response(StatusCode::OK, &server))
}

/// `PATCH /v0.1/servers/{serverName}/status`: every version, all or none.
pub(super) async fn server_status(
    State(s): State<HttpState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let (status, message) = status_body(&json_body(&s, &headers, body).await?)?;
    let servers = s
        .mcp
        .set_status(caller.principal().as_ref(), &name, None, status, message)
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"updatedCount": servers.len(), "servers": servers}),
    ))
}

/// `PUT` and `DELETE` of a version: versions are immutable here (publish
/// a new one, or set a status).
pub(super) async fn not_offered() -> ApiResult {
    Err(ServiceError::Unsupported(
        "replacing or deleting a published version is not supported by this registry; publish a new version or set the version's status".into(),
    )
    .into())
}
