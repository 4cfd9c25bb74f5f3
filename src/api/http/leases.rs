//! Refresh and lease routes of the facade (`domain::lease`), each calling
//! the same `agentry.v1.Registry` handler as gRPC:
//! `POST /agents/{id}/refresh`, `POST /leases/{lease}/refresh`,
//! `GET /leases/{lease}`, `DELETE /leases/{lease}`.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    consistency_param, grpc_request, invalid, json_bytes, json_response, query_params, typed,
    ApiError, ApiResult, Caller, HttpState,
};
use crate::pb::{self, registry_server::Registry};

/// What a refresh may say; every member is optional, and so is the body.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RefreshBody {
    ttl_seconds: Option<u32>,
    lease: Option<String>,
}

/// The body, or the defaults when there is none (a keep-alive loop may
/// send nothing at all).
async fn refresh_body(
    s: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> Result<RefreshBody, ApiError> {
    let declared = headers.contains_key(header::CONTENT_TYPE);
    let bytes = if declared {
        json_bytes(s, headers, body).await?
    } else {
        super::decoded_body(headers, body, s.max_body)
            .await
            .map_err(ApiError)?
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(RefreshBody::default());
    }
    if !declared {
        return Err(invalid(
            None,
            "a refresh body must be JSON (Content-Type: application/json) or empty",
        ));
    }
    let v = crate::domain::json::parse_json(&bytes)
        .map_err(|e| invalid(None, format!("request body is not valid JSON: {e}")))?;
    typed(v)
}

fn state_json(r: &pb::LeaseResponse) -> Value {
    let mut v = json!({
        "ttl_seconds": r.ttl_seconds,
        "expires_at": r.expires_at,
        "agents": r.agents,
    });
    if let Some(id) = &r.id {
        v["id"] = id.clone().into();
    }
    if let Some(lease) = &r.lease {
        v["lease"] = lease.clone().into();
    }
    v
}

pub(super) async fn refresh_agent(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let b = refresh_body(&s, &headers, body).await?;
    let req = grpc_request(
        &caller,
        pb::RefreshRequest {
            id,
            ttl_seconds: b.ttl_seconds,
            lease: b.lease,
        },
    );
    let resp = s.api.refresh(req).await?.into_inner();
    Ok(json_response(StatusCode::OK, &state_json(&resp)))
}

pub(super) async fn refresh_lease(
    State(s): State<HttpState>,
    caller: Caller,
    Path(lease): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let b = refresh_body(&s, &headers, body).await?;
    if b.lease.is_some() {
        return Err(invalid(
            Some("/lease"),
            "/lease: the lease is named by the path",
        ));
    }
    let req = grpc_request(
        &caller,
        pb::RefreshLeaseRequest {
            lease,
            ttl_seconds: b.ttl_seconds,
        },
    );
    let resp = s.api.refresh_lease(req).await?.into_inner();
    Ok(json_response(StatusCode::OK, &state_json(&resp)))
}

pub(super) async fn get_lease(
    State(s): State<HttpState>,
    caller: Caller,
    Path(lease): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["consistency"])?;
    let req = grpc_request(
        &caller,
        pb::GetLeaseRequest {
            lease,
            consistency: consistency_param(&pairs)?,
        },
    );
    let resp = s.api.get_lease(req).await?.into_inner();
    Ok(json_response(StatusCode::OK, &state_json(&resp)))
}

pub(super) async fn revoke_lease(
    State(s): State<HttpState>,
    caller: Caller,
    Path(lease): Path<String>,
) -> ApiResult {
    let req = grpc_request(&caller, pb::RevokeLeaseRequest { lease });
    let resp = s.api.revoke_lease(req).await?.into_inner();
    let mut v = state_json(&resp);
    v["revoked"] = true.into();
    Ok(json_response(StatusCode::OK, &v))
}
