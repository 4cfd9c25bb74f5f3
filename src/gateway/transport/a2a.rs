//! A2A (`a2a`): an invocation is one `SendMessage` (a stream is
//! `SendStreamingMessage`) to the interface the binding names, over the
//! binding's wire (`transport`: JSON-RPC, HTTP+JSON, or gRPC in 1.0, sent
//! by `a2a_grpc`) in the binding's protocol version (`protocolVersion`:
//! 1.0, or 0.3 for the cards before interfaces declared one).
//!
//! Version 1.0 calls carry `A2A-Version: 1.0` (a 1.0 server takes a call
//! without it for 0.3 and refuses it). 0.3 uses the method names
//! `message/send`, `message/stream`, `tasks/cancel` and `kind`-tagged
//! messages and parts; its results are normalised to 1.0's `{task}` /
//! `{message}` wrapping, so callers see one shape whatever the agent
//! speaks.
//!
//! The caller's input becomes the message: a JSON string, or an object
//! whose only member is the string `text` (or `input`, what the Agent
//! Protocol surface makes of a chat to an agent without an input schema),
//! is one text part; any other JSON value is one data part. A task that ends failed becomes a bad
//! answer (502), a rejected one the agent's own refusal (422); a JSON-RPC
//! error the agent's refusal when it is about the request (invalid params,
//! unsupported content) and a bad answer otherwise.

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use url::Url;

use super::a2a_grpc;
use super::{
    endpoint, events_or_answer, exchange, redacted, whole_answer, Answer, CallSpec, Event,
    GatewayError, Outbound, Started,
};
use crate::domain::Binding;

/// The header every 1.0 call carries.
pub const VERSION_HEADER: &str = "A2A-Version";

/// How the binding's interface is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    JsonRpc,
    HttpJson,
    Grpc,
}

/// The protocol version the interface speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V03,
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    wire: Wire,
    version: Version,
}

/// The binding's wire and version; a gRPC interface of 0.3 (another
/// service, `a2a.v1`) is not callable.
fn interface(b: &Binding) -> Result<Interface, GatewayError> {
    let text = |k: &str| b.extra.get(k).and_then(Value::as_str).map(str::trim);
    let wire = match text("transport").map(str::to_ascii_uppercase).as_deref() {
        None | Some("JSONRPC") | Some("JSON-RPC") => Wire::JsonRpc,
        Some("HTTP+JSON") | Some("REST") => Wire::HttpJson,
        Some("GRPC") => Wire::Grpc,
        Some(other) => {
            return Err(GatewayError::Unsupported(format!(
                "the gateway calls A2A agents over JSONRPC, HTTP+JSON or GRPC, not {other}"
            )))
        }
    };
    let version = match text("protocolVersion") {
        Some(v) if v.starts_with("0.") => Version::V03,
        Some(_) => Version::V1,
        None => Version::V03,
    };
    if wire == Wire::Grpc && version == Version::V03 {
        return Err(GatewayError::Unsupported(
            "the gateway calls A2A over gRPC in protocol version 1.0; this interface declares 0.3"
                .into(),
        ));
    }
    Ok(Interface { wire, version })
}

/// Whether the gateway can call this A2A binding.
pub fn callable(b: &Binding) -> bool {
    interface(b).is_ok()
}

/// The caller's input as the parts of one user message.
fn parts(input: &Value, version: Version) -> Vec<Value> {
    let text = match input {
        Value::String(s) => Some(s.as_str()),
        Value::Object(m) if m.len() == 1 => m
            .get("text")
            .or_else(|| m.get("input"))
            .and_then(Value::as_str),
        _ => None,
    };
    match (text, version) {
        (Some(t), Version::V1) => vec![json!({"text": t})],
        (Some(t), Version::V03) => vec![json!({"kind": "text", "text": t})],
        (None, Version::V1) => vec![json!({"data": input})],
        (None, Version::V03) => vec![json!({"kind": "data", "data": input})],
    }
}

/// The task a message continues: A2A's follow-up to a task that asked for
/// input names the task and its context (the same members in 0.3 and 1.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    pub task_id: String,
    pub context_id: Option<String>,
}

/// A task that stopped to ask its caller something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRequest {
    pub continuation: Continuation,
    /// The text of the task's status message (empty when it gave none).
    pub question: String,
}

/// The question of an answer whose task waits for input (`{task}` in
/// either version's state spelling), or None.
pub fn input_request(answer: &Value) -> Option<InputRequest> {
    let task = answer.get("task")?;
    if state(task) != "TASK_STATE_INPUT_REQUIRED" {
        return None;
    }
    let text = |k: &str| task.get(k).and_then(Value::as_str).map(String::from);
    Some(InputRequest {
        continuation: Continuation {
            task_id: text("id")?,
            context_id: text("contextId"),
        },
        question: status_text(task),
    })
}

/// `SendMessageRequest` (the JSON-RPC params, or the HTTP+JSON body).
fn send_request(input: &Value, version: Version, continues: Option<&Continuation>) -> Value {
    let id = uuid::Uuid::new_v4().to_string();
    let mut message = match version {
        Version::V1 => json!({
            "messageId": id,
            "role": "ROLE_USER",
            "parts": parts(input, version),
        }),
        Version::V03 => json!({
            "kind": "message",
            "messageId": id,
            "role": "user",
            "parts": parts(input, version),
        }),
    };
    if let Some(c) = continues {
        message["taskId"] = json!(c.task_id);
        if let Some(ctx) = &c.context_id {
            message["contextId"] = json!(ctx);
        }
    }
    json!({ "message": message })
}

fn method(version: Version, stream: bool) -> &'static str {
    match (version, stream) {
        (Version::V1, false) => "SendMessage",
        (Version::V1, true) => "SendStreamingMessage",
        (Version::V03, false) => "message/send",
        (Version::V03, true) => "message/stream",
    }
}

fn rpc(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": uuid::Uuid::new_v4().to_string(), "method": method, "params": params})
}

/// The request's headers: the caller's (credentials, idempotency key) and
/// the version header for 1.0.
fn headers(spec_headers: &[(String, String)], version: Version) -> Vec<(String, String)> {
    let mut h = spec_headers.to_vec();
    if version == Version::V1 {
        h.push((VERSION_HEADER.into(), "1.0".into()));
    }
    h
}

/// An HTTP+JSON route under the interface URL.
fn route(base: &Url, path: &str) -> Result<Url, GatewayError> {
    Url::parse(&format!("{}/{path}", base.as_str().trim_end_matches('/'))).map_err(|e| {
        GatewayError::Unsupported(format!("the A2A interface URL {base} is not a URL: {e}"))
    })
}

/// Sends the message and waits for the response head.
async fn send(
    out: &Outbound,
    spec: &CallSpec<'_>,
    iface: Interface,
    stream: bool,
) -> Result<(reqwest::Response, Url), GatewayError> {
    let base = endpoint(spec.binding)?;
    let request = send_request(spec.input, iface.version, spec.continues);
    let accept = if stream {
        "text/event-stream, application/json"
    } else {
        "application/json"
    };
    let (url, body) = match iface.wire {
        Wire::JsonRpc => (base, rpc(method(iface.version, stream), request)),
        // Sent by `send_grpc`; never over HTTP.
        Wire::Grpc => {
            return Err(GatewayError::Unsupported(
                "an A2A gRPC interface is not called over HTTP".into(),
            ))
        }
        Wire::HttpJson => {
            let path = match (iface.version, stream) {
                (Version::V1, false) => "message:send",
                (Version::V1, true) => "message:stream",
                (Version::V03, false) => "v1/message:send",
                (Version::V03, true) => "v1/message:stream",
            };
            (route(&base, path)?, request)
        }
    };
    let h = headers(&spec.headers, iface.version);
    let resp = exchange(out, reqwest::Method::POST, &url, Some(&body), &h, accept).await?;
    Ok((resp, url))
}

/// What a gRPC call sends: the interface URL, the message, the metadata.
struct GrpcCall {
    base: Url,
    request: Value,
    headers: Vec<(String, String)>,
}

fn grpc_call(spec: &CallSpec<'_>, iface: Interface) -> Result<GrpcCall, GatewayError> {
    Ok(GrpcCall {
        base: endpoint(spec.binding)?,
        request: send_request(spec.input, iface.version, spec.continues),
        headers: headers(&spec.headers, iface.version),
    })
}

pub(super) async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    let iface = interface(spec.binding)?;
    if iface.wire == Wire::Grpc {
        let c = grpc_call(spec, iface)?;
        return match a2a_grpc::send_message(out, &c.base, &c.headers, &c.request).await? {
            Ok(result) => outcome(result, &c.base),
            Err(refused) => Ok(refused),
        };
    }
    let (resp, url) = send(out, spec, iface, false).await?;
    let answer = whole_answer(out, resp, &url).await?;
    if answer.status >= 400 {
        return Ok(answer);
    }
    if let Some(refused) = answer.json.get("error").and_then(refusal) {
        return Ok(refused);
    }
    let result = match iface.wire {
        Wire::JsonRpc | Wire::Grpc => rpc_result(&answer.json, &url)?,
        Wire::HttpJson => answer.json.clone(),
    };
    outcome(normalised(result), &url)
}

pub(super) async fn open_stream(
    out: &Outbound,
    spec: &CallSpec<'_>,
) -> Result<Started, GatewayError> {
    let iface = interface(spec.binding)?;
    let cancel = Canceller {
        out: out.clone(),
        base: endpoint(spec.binding)?,
        iface,
        headers: headers(&spec.headers, iface.version),
        task: None,
        finished: false,
    };
    if iface.wire == Wire::Grpc {
        let c = grpc_call(spec, iface)?;
        return match a2a_grpc::stream_message(out, &c.base, &c.headers, &c.request).await? {
            Ok(events) => Ok(Started::Events(relay(events, cancel, c.base))),
            Err(refused) => Ok(Started::Whole(refused)),
        };
    }
    let (resp, url) = send(out, spec, iface, true).await?;
    match events_or_answer(out, resp, &url).await? {
        Started::Whole(answer) if answer.status >= 400 => Ok(Started::Whole(answer)),
        // An agent that answered the stream with one JSON body.
        Started::Whole(answer) => {
            if let Some(refused) = answer.json.get("error").and_then(refusal) {
                return Ok(Started::Whole(refused));
            }
            let result = match iface.wire {
                Wire::JsonRpc | Wire::Grpc => rpc_result(&answer.json, &url)?,
                Wire::HttpJson => answer.json.clone(),
            };
            outcome(normalised(result), &url).map(Started::Whole)
        }
        Started::Events(events) => Ok(Started::Events(relay(events, cancel, url))),
    }
}

/// A JSON-RPC response's `result`, or the error it carries.
fn rpc_result(body: &Value, url: &Url) -> Result<Value, GatewayError> {
    if let Some(e) = body.get("error") {
        return Err(rpc_error(e, url));
    }
    body.get("result").cloned().ok_or_else(|| {
        GatewayError::BadAnswer(format!(
            "the A2A agent at {} answered JSON-RPC with neither result nor error",
            redacted(url)
        ))
    })
}

fn rpc_error(e: &Value, url: &Url) -> GatewayError {
    let code = e.get("code").and_then(Value::as_i64).unwrap_or_default();
    let message = e.get("message").and_then(Value::as_str).unwrap_or_default();
    GatewayError::BadAnswer(format!(
        "the A2A agent at {} answered with JSON-RPC error {code}: {message}",
        redacted(url)
    ))
}

/// A JSON-RPC error that is about the caller's request, passed on as the
/// agent's own refusal (422) rather than a failure of the agent.
fn refusal(e: &Value) -> Option<Answer> {
    let code = e.get("code").and_then(Value::as_i64)?;
    // Invalid params, content type not supported.
    if !matches!(code, -32602 | -32005) {
        return None;
    }
    let body = json!({
        "type": "about:blank",
        "title": "The A2A agent refused the request",
        "status": 422,
        "detail": e.get("message").and_then(Value::as_str).unwrap_or_default(),
        "a2a_error": e,
    });
    Some(problem(422, body))
}

pub(super) fn problem(status: u16, body: Value) -> Answer {
    Answer {
        status,
        body: Bytes::from(body.to_string()),
        json: body,
        content_type: "application/problem+json".into(),
        retry_after: None,
        challenge: None,
    }
}

/// A 0.3 result (a bare Task or Message tagged with `kind`) in 1.0's
/// wrapping; 1.0 results pass unchanged.
fn normalised(result: Value) -> Value {
    match result.get("kind").and_then(Value::as_str) {
        Some("task") => json!({"task": result}),
        Some("message") => json!({"message": result}),
        Some("status-update") => json!({"statusUpdate": result}),
        Some("artifact-update") => json!({"artifactUpdate": result}),
        _ => result,
    }
}

/// A task state in 1.0's spelling (0.3 spells `input-required`).
fn state(task: &Value) -> String {
    let raw = task
        .pointer("/status/state")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if raw.starts_with("TASK_STATE_") {
        raw.to_string()
    } else {
        format!("TASK_STATE_{}", raw.replace('-', "_").to_ascii_uppercase())
    }
}

/// The text of a task's status message, for error messages.
fn status_text(task: &Value) -> String {
    task.pointer("/status/message/parts")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The answer for a final result: the task or message as JSON, or the
/// error a failed or rejected task means.
fn outcome(result: Value, url: &Url) -> Result<Answer, GatewayError> {
    if let Some(task) = result.get("task") {
        let state = state(task);
        let why = status_text(task);
        match state.as_str() {
            "TASK_STATE_FAILED" => {
                return Err(GatewayError::BadAnswer(format!(
                    "the A2A agent at {}: the task failed{}",
                    redacted(url),
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {why}")
                    }
                )))
            }
            "TASK_STATE_REJECTED" => {
                return Ok(problem(
                    422,
                    json!({
                        "type": "about:blank",
                        "title": "The A2A agent rejected the task",
                        "status": 422,
                        "detail": why,
                        "task": task,
                    }),
                ))
            }
            _ => {}
        }
    } else if result.get("message").is_none() {
        return Err(GatewayError::BadAnswer(format!(
            "the A2A agent at {} answered with neither a task nor a message",
            redacted(url)
        )));
    }
    Ok(Answer {
        status: 200,
        body: Bytes::from(result.to_string()),
        json: result,
        content_type: "application/json".into(),
        retry_after: None,
        challenge: None,
    })
}

/// Cancels the upstream task when the relay is dropped before the task
/// reached a final state (the caller went away).
struct Canceller {
    out: Outbound,
    base: Url,
    iface: Interface,
    headers: Vec<(String, String)>,
    task: Option<String>,
    finished: bool,
}

impl Canceller {
    /// The task needs no cancelling (it ended, or its stream did).
    fn disarm(&mut self) {
        self.finished = true;
    }
}

impl Drop for Canceller {
    fn drop(&mut self) {
        let Some(task) = self.task.take().filter(|_| !self.finished) else {
            return;
        };
        let (out, base, iface, headers) = (
            self.out.clone(),
            self.base.clone(),
            self.iface,
            std::mem::take(&mut self.headers),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let result = cancel(&out, &base, iface, &headers, &task).await;
            match result {
                Ok(()) => tracing::debug!(%task, "cancelled the A2A task its caller left"),
                Err(e) => tracing::info!(%task, error = %e, "cancelling the A2A task failed"),
            }
        });
    }
}

/// `CancelTask` (`tasks/cancel` in 0.3, `POST tasks/{id}:cancel` over
/// HTTP+JSON, the gRPC method over gRPC).
async fn cancel(
    out: &Outbound,
    base: &Url,
    iface: Interface,
    headers: &[(String, String)],
    task: &str,
) -> Result<(), GatewayError> {
    let (url, body) = match (iface.wire, iface.version) {
        (Wire::Grpc, _) => return a2a_grpc::cancel(out, base, headers, task).await,
        (Wire::JsonRpc, Version::V1) => (base.clone(), rpc("CancelTask", json!({"id": task}))),
        (Wire::JsonRpc, Version::V03) => (base.clone(), rpc("tasks/cancel", json!({"id": task}))),
        (Wire::HttpJson, Version::V1) => (route(base, &format!("tasks/{task}:cancel"))?, json!({})),
        (Wire::HttpJson, Version::V03) => {
            (route(base, &format!("v1/tasks/{task}:cancel"))?, json!({}))
        }
    };
    let resp = exchange(
        out,
        reqwest::Method::POST,
        &url,
        Some(&body),
        headers,
        "application/json",
    )
    .await?;
    let answer = whole_answer(out, resp, &url).await?;
    if iface.wire == Wire::JsonRpc {
        rpc_result(&answer.json, &url)?;
    }
    Ok(())
}

/// The task id an event belongs to.
fn task_id(event: &Value) -> Option<String> {
    event
        .pointer("/task/id")
        .or_else(|| event.pointer("/statusUpdate/taskId"))
        .or_else(|| event.pointer("/artifactUpdate/taskId"))
        .or_else(|| event.pointer("/message/taskId"))
        .and_then(Value::as_str)
        .map(String::from)
}

/// Whether an event ends the task (a final state, or a message answer).
fn is_final(event: &Value) -> bool {
    if event.get("message").is_some() {
        return true;
    }
    let task = event.get("task").or_else(|| event.get("statusUpdate"));
    task.is_some_and(|t| {
        matches!(
            state(t).as_str(),
            "TASK_STATE_COMPLETED"
                | "TASK_STATE_FAILED"
                | "TASK_STATE_CANCELED"
                | "TASK_STATE_CANCELLED"
                | "TASK_STATE_REJECTED"
                | "TASK_STATE_INPUT_REQUIRED"
                | "TASK_STATE_AUTH_REQUIRED"
        )
    })
}

/// The agent's stream relayed event by event: each upstream event's
/// result (unwrapped from JSON-RPC, in 1.0's shape) becomes one event named
/// after its kind (`task`, `message`, `statusUpdate`, `artifactUpdate`).
/// A JSON-RPC error ends the stream with an `error` event.
fn relay(
    events: BoxStream<'static, Result<Event, GatewayError>>,
    cancel: Canceller,
    url: Url,
) -> BoxStream<'static, Result<Event, GatewayError>> {
    futures::stream::unfold(
        (events, cancel, url, false),
        |(mut events, mut cancel, url, done)| async move {
            if done {
                return None;
            }
            let upstream = match events.next().await {
                Some(Ok(e)) => e,
                Some(Err(e)) => return Some((Err(e), (events, cancel, url, true))),
                // The agent closed the stream itself: nothing to cancel.
                None => {
                    cancel.disarm();
                    return None;
                }
            };
            let parsed: Value = match serde_json::from_str(&upstream.data) {
                Ok(v) => v,
                Err(e) => {
                    let e = GatewayError::BadAnswer(format!(
                        "the A2A agent at {} sent an event that is not JSON ({e})",
                        redacted(&url)
                    ));
                    return Some((Err(e), (events, cancel, url, true)));
                }
            };
            let result = if parsed.get("jsonrpc").is_some() {
                if let Some(e) = parsed.get("error") {
                    cancel.finished = true;
                    let event = Event {
                        event: "error".into(),
                        data: refusal(e)
                            .map(|a| a.json)
                            .unwrap_or_else(|| json!({"a2a_error": e}))
                            .to_string(),
                        id: None,
                    };
                    return Some((Ok(event), (events, cancel, url, true)));
                }
                parsed.get("result").cloned().unwrap_or(Value::Null)
            } else {
                parsed
            };
            let result = normalised(result);
            if cancel.task.is_none() {
                cancel.task = task_id(&result);
            }
            if is_final(&result) {
                cancel.finished = true;
            }
            let kind = match &result {
                Value::Object(m) => m.keys().next().cloned().unwrap_or_default(),
                _ => String::new(),
            };
            let inner = match result {
                Value::Object(mut m) if m.len() == 1 => m.remove(&kind).unwrap_or(Value::Null),
                other => other,
            };
            let event = Event {
                event: if kind.is_empty() {
                    "message".into()
                } else {
                    kind
                },
                data: inner.to_string(),
                id: upstream.id,
            };
            Some((Ok(event), (events, cancel, url, false)))
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn a2a_binding(endpoint: &str, transport: &str, version: &str) -> Binding {
        Binding {
            protocol: "a2a".into(),
            endpoint: endpoint.into(),
            extra: Map::from_iter([
                ("transport".to_string(), json!(transport)),
                ("protocolVersion".to_string(), json!(version)),
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn the_binding_says_the_wire_and_version() {
        let b = a2a_binding("https://a.example/rpc", "JSONRPC", "1.0");
        let i = interface(&b).unwrap();
        assert_eq!((i.wire, i.version), (Wire::JsonRpc, Version::V1));
        let b = a2a_binding("https://a.example/rest", "HTTP+JSON", "0.3.0");
        let i = interface(&b).unwrap();
        assert_eq!((i.wire, i.version), (Wire::HttpJson, Version::V03));
        // gRPC in 1.0 only: 0.3's is another service.
        let i = interface(&a2a_binding("https://a.example/g", "GRPC", "1.0")).unwrap();
        assert_eq!((i.wire, i.version), (Wire::Grpc, Version::V1));
        assert!(!callable(&a2a_binding(
            "https://a.example/g",
            "GRPC",
            "0.3.0"
        )));
        assert!(!callable(&a2a_binding(
            "https://a.example/w",
            "WEBSOCKET",
            "1.0"
        )));
        let mut legacy = a2a_binding("https://a.example/rpc", "JSONRPC", "");
        legacy.extra.remove("protocolVersion");
        assert_eq!(interface(&legacy).unwrap().version, Version::V03);
    }

    #[test]
    fn inputs_become_text_or_data_parts_in_each_version() {
        assert_eq!(
            parts(&json!("hi"), Version::V1),
            vec![json!({"text": "hi"})]
        );
        assert_eq!(
            parts(&json!({"text": "hi"}), Version::V03),
            vec![json!({"kind": "text", "text": "hi"})]
        );
        assert_eq!(
            parts(&json!({"input": "hi"}), Version::V1),
            vec![json!({"text": "hi"})]
        );
        let data = json!({"city": "Oslo", "days": 3});
        assert_eq!(parts(&data, Version::V1), vec![json!({"data": data})]);
        let r = send_request(&json!("hi"), Version::V1, None);
        assert_eq!(r["message"]["role"], "ROLE_USER");
        assert!(r["message"].get("taskId").is_none());
        assert!(r["message"]["messageId"]
            .as_str()
            .is_some_and(|s| !s.is_empty()));
        assert_eq!(method(Version::V03, true), "message/stream");
        assert_eq!(
            headers(&[], Version::V1),
            vec![(VERSION_HEADER.to_string(), "1.0".to_string())]
        );
        assert!(headers(&[], Version::V03).is_empty());
    }

    #[test]
    fn results_are_one_shape_and_failed_tasks_are_errors() {
        let url = Url::parse("https://a.example/rpc").unwrap();
        let legacy = json!({"kind": "task", "id": "t1", "status": {"state": "completed"}});
        let ok = outcome(normalised(legacy), &url).unwrap();
        assert_eq!(ok.json["task"]["id"], "t1");
        let failed = json!({"task": {"id": "t2", "status": {"state": "TASK_STATE_FAILED",
            "message": {"parts": [{"text": "the backend is down"}]}}}});
        let e = outcome(failed, &url).unwrap_err();
        assert!(e.to_string().contains("the backend is down"), "{e}");
        let rejected = json!({"task": {"id": "t3", "status": {"state": "TASK_STATE_REJECTED"}}});
        assert_eq!(outcome(rejected, &url).unwrap().status, 422);
        assert!(outcome(json!({"nothing": 1}), &url).is_err());
        let e = rpc_result(
            &json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32009, "message": "version"}}),
            &url,
        )
        .unwrap_err();
        assert!(e.to_string().contains("-32009"), "{e}");
    }

    #[test]
    fn a_task_waiting_for_input_is_continued_by_its_ids() {
        let asking = json!({"task": {"id": "t1", "contextId": "c1", "status": {
            "state": "input-required", "message": {"parts": [{"kind": "text", "text": "Which date?"}]}}}});
        let ask = input_request(&asking).unwrap();
        assert_eq!(ask.question, "Which date?");
        assert_eq!(ask.continuation.task_id, "t1");
        let r = send_request(&json!("Friday"), Version::V03, Some(&ask.continuation));
        assert_eq!(r["message"]["taskId"], "t1");
        assert_eq!(r["message"]["contextId"], "c1");
        let done = json!({"task": {"id": "t1", "status": {"state": "TASK_STATE_COMPLETED"}}});
        assert!(input_request(&done).is_none());
        assert!(input_request(&json!({"message": {"parts": []}})).is_none());
    }

    #[test]
    fn stream_events_name_their_task_and_end_on_a_final_state() {
        let update =
            json!({"statusUpdate": {"taskId": "t9", "status": {"state": "TASK_STATE_WORKING"}}});
        assert_eq!(task_id(&update).as_deref(), Some("t9"));
        assert!(!is_final(&update));
        let done = json!({"statusUpdate": {"taskId": "t9", "status": {"state": "completed"}}});
        assert!(is_final(&done));
    }
}
