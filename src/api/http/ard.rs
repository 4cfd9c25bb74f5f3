//! ARD routes of the facade: `GET /.well-known/ai-catalog.json` (read from
//! the catalog cache, like woa.json) and the registry API under `/ard`,
//! which calls the `agentry.v1.Ard` handlers. Errors on these routes take
//! ARD's shape, `{errorCode, message}` (`ard_error`).

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::{
    grpc_request, invalid, json_body, json_response, query_params, single, ApiResult, Caller,
    HttpState,
};
use crate::convert::{map_to_struct, struct_to_map};
use crate::domain::catalog::SearchPlan;
use crate::pb::{self, ard_server::Ard};
use crate::service::{http_date, not_modified, SearchHit, ServiceError};

/// Paths whose errors are ARD's.
pub(super) fn is_ard_path(path: &str) -> bool {
    path == "/ard" || path.starts_with("/ard/") || path == "/.well-known/ai-catalog.json"
}

/// ARD's error code (Appendix B, and the gRPC names for statuses it does
/// not list) for an HTTP status.
fn error_code(status: u16) -> &'static str {
    match status {
        400 | 413 | 415 | 431 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 | 410 => "NOT_FOUND",
        405 | 501 => "UNIMPLEMENTED",
        409 => "ALREADY_EXISTS",
        429 => "RATE_LIMIT_EXCEEDED",
        503 | 507 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL_ERROR",
    }
}

/// ARD's error body for a problem body of the one error mapping.
pub(super) fn ard_error(problem: &Value) -> Value {
    let status = problem.get("status").and_then(Value::as_u64).unwrap_or(500);
    json!({"errorCode": error_code(status as u16), "message": super::problem_message(problem)})
}

/// A string member; absent or null is empty.
fn text_member(
    o: &Map<String, Value>,
    key: &str,
    pointer: &str,
) -> Result<String, super::ApiError> {
    Ok(super::string_member(o, key, pointer)?.unwrap_or_default())
}

fn count_member(
    o: &Map<String, Value>,
    key: &str,
    pointer: &str,
) -> Result<Option<u32>, super::ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                invalid(
                    Some(pointer),
                    format!("{pointer}: must be a non-negative integer"),
                )
            }),
    }
}

/// `query` of a search or explore: `text` and `filter`.
fn query_model(body: &Map<String, Value>) -> Result<(String, Map<String, Value>), super::ApiError> {
    let Some(q) = body.get("query") else {
        return Ok((String::new(), Map::new()));
    };
    let q = super::json_object(q, "/query", &["text", "filter"])?;
    let text = text_member(q, "text", "/query/text")?;
    let filter = match q.get("filter") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(f)) => f.clone(),
        Some(_) => {
            return Err(invalid(
                Some("/query/filter"),
                "/query/filter: must be an object",
            ))
        }
    };
    Ok((text, filter))
}

/// `POST /ard/search`. The plan and the search are the gRPC handler's
/// (`SearchPlan::new`, `ArdService::search`); the answer is written here
/// from the cached entries' bytes, since a round trip through
/// `google.protobuf.Struct` would cost more than the ranking itself.
pub(super) async fn search(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let o = super::json_object(&v, "", &["query", "federation", "pageSize", "pageToken"])?;
    if !o.contains_key("query") {
        return Err(invalid(Some("/query"), "/query: is required"));
    }
    let (text, filter) = query_model(o)?;
    let page_size = match count_member(o, "pageSize", "/pageSize")? {
        Some(0) => {
            return Err(invalid(
                Some("/pageSize"),
                "/pageSize: must be from 1 to 100",
            ))
        }
        n => n.unwrap_or(0),
    };
    let plan = SearchPlan::new(
        &text,
        &filter,
        &text_member(o, "federation", "/federation")?,
        page_size,
        &text_member(o, "pageToken", "/pageToken")?,
    )
    .map_err(ServiceError::from)?;
    let page = s
        .ard
        .service()
        .search(caller.principal().as_ref(), plan)
        .await?;
    let mut out = Vec::with_capacity(2048 * (page.results.len() + 1));
    out.extend_from_slice(b"{\"results\":[");
    write_hits(&mut out, &page.results);
    out.push(b']');
    if !page.referrals.is_empty() {
        out.extend_from_slice(b",\"referrals\":");
        // Serialising JSON values into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &page.referrals);
    }
    if !page.page_token.is_empty() {
        out.extend_from_slice(b",\"pageToken\":");
        let _ = serde_json::to_writer(&mut out, &page.page_token);
    }
    out.push(b'}');
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        out,
    )
        .into_response())
}

fn write_hits(out: &mut Vec<u8>, hits: &[SearchHit]) {
    for (i, hit) in hits.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        hit.write_json(out);
    }
}

/// `POST /ard/explore`.
pub(super) async fn explore(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let o = super::json_object(&v, "", &["query", "resultType"])?;
    let (text, filter) = query_model(o)?;
    let Some(result_type) = o.get("resultType") else {
        return Err(invalid(Some("/resultType"), "/resultType: is required"));
    };
    let rt = super::json_object(result_type, "/resultType", &["facets"])?;
    let Some(Value::Array(list)) = rt.get("facets") else {
        return Err(invalid(
            Some("/resultType/facets"),
            "/resultType/facets: must be an array of {field, limit, minCount}",
        ));
    };
    let mut facets = Vec::with_capacity(list.len());
    for (i, f) in list.iter().enumerate() {
        let at = format!("/resultType/facets/{i}");
        let f = super::json_object(f, &at, &["field", "limit", "minCount"])?;
        let field = text_member(f, "field", &format!("{at}/field"))?;
        if field.is_empty() {
            return Err(invalid(
                Some(&format!("{at}/field")),
                format!("{at}/field: is required"),
            ));
        }
        facets.push(pb::ArdFacetRequest {
            field,
            limit: count_member(f, "limit", &format!("{at}/limit"))?,
            min_count: count_member(f, "minCount", &format!("{at}/minCount"))?,
        });
    }
    let req = pb::ArdExploreRequest {
        text,
        filter: (!filter.is_empty()).then(|| map_to_struct(&filter)),
        facets,
    };
    let resp = s
        .ard
        .explore(grpc_request(&caller, req))
        .await?
        .into_inner();
    let mut facets = Map::new();
    for f in resp.facets {
        let buckets: Vec<Value> = f
            .buckets
            .iter()
            .map(|b| json!({"value": b.value, "count": b.count}))
            .collect();
        facets.insert(
            f.field,
            json!({"buckets": buckets, "otherCount": f.other_count}),
        );
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"resultType": "facets", "facets": facets}),
    ))
}

/// `GET /ard/agents?filter=&orderBy=&pageSize=&pageToken=`.
pub(super) async fn list(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let pairs = query_params(
        raw.as_deref(),
        &["filter", "orderBy", "pageSize", "pageToken"],
    )?;
    let page_size = match single(&pairs, "pageSize") {
        None => 0,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| invalid(Some("/pageSize"), "/pageSize: must be from 1 to 100"))?,
    };
    let req = pb::ArdListRequest {
        filter: single(&pairs, "filter").unwrap_or_default(),
        order_by: single(&pairs, "orderBy").unwrap_or_default(),
        page_size,
        page_token: single(&pairs, "pageToken").unwrap_or_default(),
    };
    let resp = s
        .ard
        .list_agents(grpc_request(&caller, req))
        .await?
        .into_inner();
    let mut out = json!({
        "items": resp.items.iter().map(|e| Value::Object(struct_to_map(e))).collect::<Vec<_>>(),
        "total": resp.total,
    });
    if !resp.page_token.is_empty() {
        out["pageToken"] = json!(resp.page_token);
    }
    Ok(json_response(StatusCode::OK, &out))
}

fn cache_headers(resp: &mut Response, etag: &str, max_age: u64) {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("public, max-age={max_age}")) {
        h.insert(header::CACHE_CONTROL, v);
    }
}

fn if_none_match(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
}

/// `GET /ard/agents/{identifier}` (the URN, percent-encoded or not).
pub(super) async fn get(
    State(s): State<HttpState>,
    caller: Caller,
    Path(identifier): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let req = pb::ArdGetRequest { identifier };
    let resp = s
        .ard
        .get_agent(grpc_request(&caller, req))
        .await?
        .into_inner();
    let fresh = not_modified(
        &resp.etag,
        time::OffsetDateTime::UNIX_EPOCH,
        if_none_match(&headers),
        None,
    );
    let mut out = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let entry = resp.entry.as_ref().map(struct_to_map).unwrap_or_default();
        json_response(StatusCode::OK, &Value::Object(entry))
    };
    cache_headers(&mut out, &resp.etag, s.ard.service().max_age.as_secs());
    Ok(out)
}

/// `GET /.well-known/ai-catalog.json`: the AI Catalog document, with ETag,
/// Last-Modified and Cache-Control; 304 for a matching conditional GET.
pub(super) async fn catalog(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
) -> ApiResult {
    let who = caller.principal();
    let service = s.ard.service();
    let doc = service.catalog(who.as_ref()).await?;
    let ims = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok());
    let fresh = not_modified(&doc.etag, doc.last_modified, if_none_match(&headers), ims);
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        s.documents
            .answer(
                &headers,
                &doc.etag,
                "application/ai-catalog+json",
                &doc.body,
            )
            .await
    };
    cache_headers(&mut resp, &doc.etag, service.max_age.as_secs());
    if let Ok(v) = HeaderValue::from_str(&http_date(doc.last_modified)) {
        resp.headers_mut().insert(header::LAST_MODIFIED, v);
    }
    Ok(resp)
}
