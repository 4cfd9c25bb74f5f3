//! Agent Protocol routes of the facade: AP's REST surface at each agent's
//! path (`/agents/{id}/describe`, `run`, `get_events/{run_id}`,
//! `stream_request`, `runs/{run_id}`, `threads`) and AP's discovery list
//! at `GET /ap`, each calling the same `agentry.v1.AgentProtocol` handler
//! as gRPC. Event streams are server-sent events named by event type.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;

use super::invocation::AGENT_AUTHORIZATION;
use super::{
    grpc_request, invalid, json_body, parse_bool, query_params, single, ApiResult, Caller,
    HttpState,
};
use crate::pb::{self, agent_protocol_server::AgentProtocol};

fn status_of(s: u32) -> StatusCode {
    u16::try_from(s)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY)
}

/// A JSON document with its status; an AP agent's own 4xx keeps its
/// problem media type.
fn document(d: pb::ApDocument) -> Response {
    let status = status_of(d.status);
    let ctype = if status.is_client_error() {
        "application/problem+json"
    } else {
        "application/json"
    };
    (status, [("content-type", ctype)], d.json).into_response()
}

/// AP events as server-sent events named by their type.
fn events(stream: crate::api::agent_protocol::ApEventStream) -> Response {
    let out = stream.map(|e| {
        Ok::<_, Infallible>(match e {
            Ok(e) => {
                let clean = |s: &str| s.replace(['\r', '\n', '\0'], "");
                let mut ev = Event::default().event(clean(&e.r#type)).data(e.json);
                if !e.id.is_empty() {
                    ev = ev.id(clean(&e.id));
                }
                ev
            }
            Err(status) => super::error_event(&status),
        })
    });
    Sse::new(out)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn since(pairs: &[(String, String)]) -> Result<Option<i64>, super::ApiError> {
    single(pairs, "since")
        .map(|s| {
            s.parse::<i64>()
                .map_err(|_| invalid(Some("/since"), format!("/since: '{s}' is not an event id")))
        })
        .transpose()
}

fn agent_auth(headers: &HeaderMap) -> String {
    headers
        .get(AGENT_AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

pub(super) async fn list(
    State(s): State<HttpState>,
    caller: Caller,
    RawQuery(q): RawQuery,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let req = grpc_request(&caller, pb::ApListRequest {});
    Ok(document(s.invocation.list_agents(req).await?.into_inner()))
}

pub(super) async fn describe(
    State(s): State<HttpState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let req = grpc_request(&caller, pb::ApAgentRef { agent_id });
    Ok(document(s.invocation.describe(req).await?.into_inner()))
}

pub(super) async fn run(
    State(s): State<HttpState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["wait"])?;
    let wait = parse_bool(single(&pairs, "wait"), "/wait")?;
    let request: Value = json_body(&s, &headers, body).await?;
    let msg = pb::ApRunRequest {
        agent_id,
        request: request.to_string(),
        wait,
        agent_authorization: agent_auth(&headers),
    };
    let r = s
        .invocation
        .run(grpc_request(&caller, msg))
        .await?
        .into_inner();
    if r.json.is_empty() {
        return Ok(status_of(r.status).into_response());
    }
    Ok(document(pb::ApDocument {
        json: r.json,
        status: r.status,
    }))
}

pub(super) async fn get_events(
    State(s): State<HttpState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["stream", "since"])?;
    let msg = pb::ApEventsRequest {
        agent_id,
        run_id,
        since: since(&pairs)?,
    };
    let req = grpc_request(&caller, msg);
    if parse_bool(single(&pairs, "stream"), "/stream")? {
        let stream = async { Ok(events(s.invocation.stream_events(req).await?.into_inner())) };
        return caller.hold_stream(&s.gate, stream).await;
    }
    Ok(document(s.invocation.get_events(req).await?.into_inner()))
}

pub(super) async fn stream_request(
    State(s): State<HttpState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let request: Value = json_body(&s, &headers, body).await?;
    let msg = pb::ApRunRequest {
        agent_id,
        request: request.to_string(),
        wait: false,
        agent_authorization: agent_auth(&headers),
    };
    let req = grpc_request(&caller, msg);
    Ok(events(s.invocation.stream_request(req).await?.into_inner()))
}

pub(super) async fn run_status(
    State(s): State<HttpState>,
    caller: Caller,
    Path((agent_id, run_id)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let req = grpc_request(&caller, pb::ApRunRef { agent_id, run_id });
    Ok(document(s.invocation.get_run(req).await?.into_inner()))
}

pub(super) async fn threads(
    State(s): State<HttpState>,
    caller: Caller,
    Path(agent_id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult {
    query_params(q.as_deref(), &[])?;
    let req = grpc_request(&caller, pb::ApAgentRef { agent_id });
    Ok(document(s.invocation.list_threads(req).await?.into_inner()))
}
