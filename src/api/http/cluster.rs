//! Cluster routes of the facade: `GET /cluster` and the admin operations,
//! each calling the same `agentry.v1.Cluster` handler as gRPC.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::{
    grpc_request, invalid, json_response, optional_body, typed_body, ApiError, ApiResult, Caller,
    HttpState,
};
use crate::convert::{cluster_check_to_json, cluster_status_to_json};
use crate::pb::{self, cluster_server::Cluster};

fn ok(resp: tonic::Response<pb::ClusterStatus>) -> ApiResult {
    Ok(json_response(
        StatusCode::OK,
        &cluster_status_to_json(resp.get_ref()),
    ))
}

fn node_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse()
        .map_err(|_| invalid(Some("/id"), format!("'{raw}' is not a node id")))
}

pub(super) async fn status(State(s): State<HttpState>, caller: Caller) -> ApiResult {
    let req = grpc_request(&caller, pb::ClusterStatusRequest {});
    ok(s.cluster.status(req).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberBody {
    id: u64,
    raft_addr: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct InitBody {
    #[serde(default)]
    members: Vec<MemberBody>,
}

pub(super) async fn initialize(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let body: InitBody = optional_body(&s, &headers, body).await?;
    let msg = pb::InitializeRequest {
        members: body
            .members
            .into_iter()
            .map(|m| pb::Member {
                id: m.id,
                raft_addr: m.raft_addr,
            })
            .collect(),
    };
    ok(s.cluster.initialize(grpc_request(&caller, msg)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LearnerBody {
    id: u64,
    raft_addr: String,
    #[serde(default)]
    wait_caught_up: bool,
}

pub(super) async fn add_learner(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let b: LearnerBody = typed_body(&s, &headers, body).await?;
    let msg = pb::AddLearnerRequest {
        id: b.id,
        raft_addr: b.raft_addr,
        wait_caught_up: b.wait_caught_up,
    };
    ok(s.cluster.add_learner(grpc_request(&caller, msg)).await?)
}

pub(super) async fn promote(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let msg = pb::PromoteRequest { id: node_id(&id)? };
    ok(s.cluster.promote(grpc_request(&caller, msg)).await?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    #[serde(default)]
    id: Option<u64>,
}

/// `POST /cluster/transfer-leader`, with `{"id": N}` for a chosen voter or
/// no body for the most caught-up one.
pub(super) async fn transfer_leader(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let body: TransferBody = optional_body(&s, &headers, body).await?;
    if body.id == Some(0) {
        return Err(invalid(Some("/id"), "/id: node ids start at 1"));
    }
    let msg = pb::TransferLeaderRequest {
        id: body.id.unwrap_or(0),
    };
    ok(s.cluster
        .transfer_leader(grpc_request(&caller, msg))
        .await?)
}

/// `POST /cluster/check`: a replica consistency check, answered with
/// every member's digest (200 whatever the outcome: the report says it).
pub(super) async fn check(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let _: NoBody = optional_body(&s, &headers, body).await?;
    let resp = s
        .cluster
        .check(grpc_request(&caller, pb::ClusterCheckRequest {}))
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &cluster_check_to_json(resp.get_ref()),
    ))
}

/// A request that takes no members (an empty JSON object, or no body).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NoBody {}

pub(super) async fn remove(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let msg = pb::RemoveRequest { id: node_id(&id)? };
    ok(s.cluster.remove(grpc_request(&caller, msg)).await?)
}

/// `GET /audit`: one page of the audit trail (admins only).
pub(super) async fn audit(
    State(s): State<HttpState>,
    caller: Caller,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
) -> ApiResult {
    let names = [
        "principal",
        "target",
        "operation",
        "outcome",
        "since",
        "until",
        "page_size",
        "page_token",
    ];
    let pairs = super::query_params(q.as_deref(), &names)?;
    let get = |k: &str| super::single(&pairs, k).unwrap_or_default();
    let page_size = match super::single(&pairs, "page_size") {
        None => 0,
        Some(v) => v.parse().map_err(|_| {
            invalid(
                Some("/page_size"),
                format!("page_size must be a number, not '{v}'"),
            )
        })?,
    };
    let req = grpc_request(
        &caller,
        pb::ListAuditRequest {
            principal: get("principal"),
            target: get("target"),
            operation: get("operation"),
            outcome: get("outcome"),
            since: get("since"),
            until: get("until"),
            page_size,
            page_token: get("page_token"),
        },
    );
    let resp = s.cluster.list_audit(req).await?.into_inner();
    let body = serde_json::json!({
        "entries": resp.entries.iter().map(crate::convert::audit_pb_to_json).collect::<Vec<_>>(),
        "next_page_token": resp.next_page_token,
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// `GET /cluster/backup`: the backup file, streamed as the gRPC method
/// streams it (admins).
pub(super) async fn backup(State(s): State<HttpState>, caller: Caller) -> ApiResult {
    use futures::StreamExt;
    let chunks = s
        .cluster
        .backup(grpc_request(&caller, pb::BackupRequest {}))
        .await?
        .into_inner()
        .map(|chunk| {
            chunk
                .map(|c| axum::body::Bytes::from(c.data))
                .map_err(|status| std::io::Error::other(status.message().to_string()))
        });
    axum::response::Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/x-ndjson")
        .header(
            axum::http::header::CONTENT_DISPOSITION,
            "attachment; filename=\"agentry.backup\"",
        )
        .body(Body::from_stream(chunks))
        .map_err(|e| ApiError::from(crate::service::ServiceError::Internal(e.to_string())))
}
