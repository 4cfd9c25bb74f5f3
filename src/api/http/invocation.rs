//! Gateway routes of the facade: `POST /agents/{id}/invoke` (JSON, batch
//! arrays, server-sent events), `GET /.well-known/woa.json` and
//! `POST /import/{format}`. Invocation and import call the same
//! `agentry.v1.Gateway` handlers as gRPC; the WoA document is an HTTP
//! resource only and is read from the gateway's host cache.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};

use super::{
    grpc_request, invalid, json_body, json_bytes, json_response, parse_bool, query_params, single,
    values, ApiError, ApiResult, Caller, HttpState,
};
use crate::pb::{self, gateway_server::Gateway};
use crate::service::{http_date, not_modified};

/// The caller's credential for the agent (never the registry's own key,
/// which travels in `Authorization`).
pub const AGENT_AUTHORIZATION: &str = "agent-authorization";

fn header_text(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Whether the body asks to stream: a top-level `"stream": true`. The
/// byte search spares parsing bodies that cannot say so.
fn body_streams(body: &[u8]) -> bool {
    body.windows(8).any(|w| w == b"\"stream\"")
        && serde_json::from_slice::<Value>(body)
            .ok()
            .is_some_and(|v| v.get("stream") == Some(&Value::Bool(true)))
}

/// Header-safe text: visible ASCII only, at most 200 characters.
fn header_safe(s: &str) -> HeaderValue {
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect();
    HeaderValue::from_str(&clean).unwrap_or_else(|_| HeaderValue::from_static("?"))
}

fn check_json(c: Option<&pb::OutputCheck>) -> Value {
    match c {
        Some(c) if c.state == "invalid" => {
            json!({"state": c.state, "pointer": c.pointer, "message": c.message})
        }
        Some(c) => json!({"state": c.state}),
        None => json!({"state": "unchecked"}),
    }
}

/// Marks a response whose body is the agent's answer, passed on exactly
/// as it was sent: the facade's finishing of its own errors
/// (`set_problem_instance`) leaves it alone, even when it is a problem.
#[derive(Clone, Copy)]
pub(super) struct AgentAnswer;

/// The header that carries an agent's challenge to the caller, beside the
/// `Agent-Authorization` the caller answers it in (as `Proxy-Authenticate`
/// is to `Proxy-Authorization`).
const AGENT_AUTHENTICATE: &str = "agent-authenticate";

/// One answer as the agent gave it, with the gateway's findings in headers.
/// An agent's 401 is about the call's credential for it, not the caller's
/// registry key: its `WWW-Authenticate` says so (`agent_challenge`), so an
/// OAuth client keeps its good registry token, and what the agent asked
/// for is in `Agent-Authenticate`.
fn single_response(
    agent: &str,
    r: &pb::InvokeResult,
    replayed: bool,
    retry_after: Option<u32>,
) -> Response {
    let status = u16::try_from(r.status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = (status, r.body.clone()).into_response();
    resp.extensions_mut().insert(AgentAnswer);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header_safe(if r.content_type.is_empty() {
            "application/json"
        } else {
            &r.content_type
        }),
    );
    if let Some(c) = &r.output_check {
        h.insert("x-agentry-output-check", header_safe(&c.state));
        if c.state == "invalid" {
            h.insert(
                "x-agentry-output-error",
                header_safe(&format!("{}: {}", c.pointer, c.message)),
            );
        }
    }
    if !r.protocol.is_empty() {
        h.insert("x-agentry-binding", header_safe(&r.protocol));
    }
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if let Some(s) = retry_after {
        h.insert(header::RETRY_AFTER, s.into());
    }
    if status == StatusCode::UNAUTHORIZED {
        if let Ok(v) = HeaderValue::from_str(&crate::api::error::agent_challenge(agent)) {
            h.insert(header::WWW_AUTHENTICATE, v);
        }
    }
    if !r.agent_challenge.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&r.agent_challenge) {
            h.insert(AGENT_AUTHENTICATE, v);
        }
    }
    resp
}

/// A batch: one element per call, each with its own status.
fn batch_response(items: &[pb::InvokeResult], replayed: bool) -> Response {
    let out: Vec<Value> = items
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body)
                .unwrap_or_else(|_| json!(String::from_utf8_lossy(&r.body)));
            let mut item =
                json!({"status": r.status, "output_check": check_json(r.output_check.as_ref())});
            if r.error.is_some() || r.status >= 400 {
                item["error"] = body;
            } else {
                item["output"] = body;
            }
            if !r.protocol.is_empty() {
                item["binding"] = json!({"protocol": r.protocol, "endpoint": r.endpoint});
            }
            if !r.agent_challenge.is_empty() {
                item["agent_challenge"] = json!(r.agent_challenge);
            }
            item
        })
        .collect();
    let mut resp = json_response(StatusCode::OK, &Value::Array(out));
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}

/// An agent's event as SSE. Names and ids lose line breaks and NULs (an
/// agent's text never shapes the stream's framing).
fn sse_event(e: pb::InvokeEvent) -> Event {
    let clean = |s: &str| s.replace(['\r', '\n', '\0'], "");
    let mut ev = Event::default()
        .event(clean(&e.event))
        .data(e.data.replace("\r\n", "\n").replace('\r', "\n"));
    if !e.id.is_empty() {
        ev = ev.id(clean(&e.id));
    }
    ev
}

pub(super) async fn invoke(
    State(s): State<HttpState>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let pairs = query_params(q.as_deref(), &["operation", "protocol", "stream"])?;
    let body: Bytes = json_bytes(&s, &headers, body).await?;
    let wants_sse = header_text(&headers, header::ACCEPT.as_str()).contains("text/event-stream");
    let stream =
        parse_bool(single(&pairs, "stream"), "/stream")? || wants_sse || body_streams(&body);
    let msg = pb::InvokeRequest {
        agent_id: id.clone(),
        body: body.to_vec(),
        operation: single(&pairs, "operation").unwrap_or_default(),
        protocols: values(&pairs, "protocol"),
        idempotency_key: header_text(&headers, "idempotency-key"),
        agent_authorization: header_text(&headers, AGENT_AUTHORIZATION),
    };
    let req = grpc_request(&caller, msg);
    if stream {
        let answer = async {
            let events = s.invocation.invoke_stream(req).await?.into_inner();
            Ok(sse_answer(events))
        };
        return caller.hold_stream(&s.gate, answer).await;
    }
    let resp = s.invocation.invoke(req).await?.into_inner();
    if resp.is_batch {
        return Ok(batch_response(&resp.batch, resp.replayed));
    }
    let r = resp.result.ok_or_else(|| {
        ApiError::from(crate::service::ServiceError::Internal("no result".into()))
    })?;
    Ok(single_response(&id, &r, resp.replayed, resp.retry_after))
}

/// A streamed invocation as server-sent events; a failure in the stream
/// ends it with an `error` event holding the problem body.
fn sse_answer(
    events: impl futures::Stream<Item = Result<pb::InvokeEvent, tonic::Status>> + Send + 'static,
) -> Response {
    let sse = events.map(|e| {
        Ok::<_, Infallible>(match e {
            Ok(e) => sse_event(e),
            Err(status) => super::error_event(&status),
        })
    });
    Sse::new(sse)
        .keep_alive(KeepAlive::default())
        .into_response()
}

pub(super) async fn woa_document(
    State(s): State<HttpState>,
    caller: Caller,
    headers: HeaderMap,
) -> ApiResult {
    let who = caller.principal();
    let service = s.invocation.service();
    service.registry().require_reader(who.as_ref())?;
    let doc = service.woa().document(service.registry()).await?;
    let inm = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok());
    let ims = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok());
    let fresh = not_modified(&doc.etag, doc.last_modified, inm, ims);
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        s.documents
            .answer(&headers, &doc.etag, "application/woa+json", &doc.body)
            .await
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, header_safe(&doc.etag));
    h.insert(
        header::LAST_MODIFIED,
        header_safe(&http_date(doc.last_modified)),
    );
    h.insert(
        header::CACHE_CONTROL,
        header_safe(&format!(
            "public, max-age={}",
            service.woa().max_age.as_secs()
        )),
    );
    Ok(resp)
}

pub(super) async fn import(
    State(s): State<HttpState>,
    caller: Caller,
    Path(format): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let v = json_body(&s, &headers, body).await?;
    let url = match v.get("url") {
        Some(Value::String(u)) => u.clone(),
        _ => {
            return Err(invalid(
                Some("/url"),
                "/url: is required (the document to import)",
            ))
        }
    };
    if let Some(k) = v.as_object().and_then(|m| m.keys().find(|k| *k != "url")) {
        return Err(invalid(
            Some(&format!("/{k}")),
            format!("/{k}: unknown member"),
        ));
    }
    let req = grpc_request(&caller, pb::ImportRequest { format, url });
    let r = s.invocation.import(req).await?.into_inner();
    let problem = |p: &pb::ImportProblem| {
        let mut v = json!({"agent_id": p.agent_id, "reason": p.reason});
        if !p.transport.is_empty() {
            v["transport"] = json!(p.transport);
        }
        v
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "url": r.url,
            "not_modified": r.not_modified,
            "agents": r.agents.iter().map(|a| json!({"id": a.id, "outcome": a.outcome})).collect::<Vec<_>>(),
            "skipped": r.skipped.iter().map(problem).collect::<Vec<_>>(),
            "unsupported_transports": r.unsupported_transports.iter().map(problem).collect::<Vec<_>>(),
            "registries": r.registries.iter().map(|g| json!({"identifier": g.identifier, "displayName": g.display_name, "url": g.url})).collect::<Vec<_>>(),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_top_level_stream_flag_streams() {
        assert!(body_streams(br#"{"agent":"a","input":{},"stream":true}"#));
        assert!(!body_streams(br#"{"input":{"stream":true},"agent":"a"}"#));
        assert!(!body_streams(br#"{"text":"stream"}"#));
        assert!(!body_streams(br#"{"stream":false}"#));
    }
}
