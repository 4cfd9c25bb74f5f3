//! Identity routes of the facade: `GET /.well-known/agentry.json` and key
//! management under `/admin/keys`, each calling the same
//! `agentry.v1.Federation` handler as gRPC.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::{grpc_request, json_response, optional_body, typed_body, ApiResult, Caller, HttpState};
use crate::api::federation::{publisher_key_to_json, registry_info_to_json};
use crate::pb::{self, federation_server::Federation};

fn changed(resp: tonic::Response<pb::KeyChangeResponse>) -> ApiResult {
    let r = resp.into_inner();
    let info = r.info.map(|i| registry_info_to_json(&i));
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"registry": info, "resigned": r.resigned}),
    ))
}

pub(super) async fn registry_info(State(s): State<HttpState>, caller: Caller) -> ApiResult {
    let req = grpc_request(&caller, pb::GetRegistryInfoRequest {});
    let info = s.federation.get_registry_info(req).await?.into_inner();
    Ok(json_response(StatusCode::OK, &registry_info_to_json(&info)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RotateBody {
    #[serde(default)]
    not_after: Option<String>,
}

pub(super) async fn rotate_key(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let body: RotateBody = optional_body(&s, &headers, body).await?;
    let msg = pb::RotateKeyRequest {
        not_after: body.not_after,
    };
    changed(s.federation.rotate_key(grpc_request(&caller, msg)).await?)
}

async fn end_key(s: HttpState, key_id: String, caller: Caller, revoke: bool) -> ApiResult {
    let req = grpc_request(&caller, pb::EndKeyRequest { key_id });
    changed(if revoke {
        s.federation.revoke_key(req).await?
    } else {
        s.federation.retire_key(req).await?
    })
}

pub(super) async fn retire_key(
    State(s): State<HttpState>,
    Path(key_id): Path<String>,
    caller: Caller,
) -> ApiResult {
    end_key(s, key_id, caller, false).await
}

pub(super) async fn revoke_key(
    State(s): State<HttpState>,
    Path(key_id): Path<String>,
    caller: Caller,
) -> ApiResult {
    end_key(s, key_id, caller, true).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublisherKeyBody {
    public_key: String,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    principal: Option<String>,
}

pub(super) async fn add_publisher_key(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let b: PublisherKeyBody = typed_body(&s, &headers, body).await?;
    let msg = pb::AddPublisherKeyRequest {
        public_key: b.public_key,
        namespaces: b.namespaces,
        principal: b.principal,
    };
    let key = s
        .federation
        .add_publisher_key(grpc_request(&caller, msg))
        .await?
        .into_inner();
    Ok(json_response(
        StatusCode::CREATED,
        &publisher_key_to_json(&key),
    ))
}

pub(super) async fn list_publisher_keys(State(s): State<HttpState>, caller: Caller) -> ApiResult {
    let req = grpc_request(&caller, pb::ListPublisherKeysRequest {});
    let keys = s
        .federation
        .list_publisher_keys(req)
        .await?
        .into_inner()
        .keys;
    let keys: Vec<serde_json::Value> = keys.iter().map(publisher_key_to_json).collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "keys": keys }),
    ))
}

pub(super) async fn remove_publisher_key(
    State(s): State<HttpState>,
    caller: Caller,
    Path(key_id): Path<String>,
) -> ApiResult {
    let msg = pb::RemovePublisherKeyRequest { key_id };
    let r = s
        .federation
        .remove_publisher_key(grpc_request(&caller, msg))
        .await?
        .into_inner();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "downgraded": r.downgraded }),
    ))
}
