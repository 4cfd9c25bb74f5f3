//! A2A 1.0 over gRPC (`transport: GRPC`): `SendMessage`,
//! `SendStreamingMessage` and `CancelTask` of `lf.a2a.v1.A2AService`
//! (`proto/a2a/v1/a2a.proto`), for agents whose card offers no JSON
//! interface or prefers gRPC.
//!
//! A2A 1.0's JSON is the protobuf JSON mapping of the same messages, so an
//! answer is turned into that JSON here and judged by the `a2a` module
//! exactly as a JSON-RPC answer is: one reading of tasks, states, refusals
//! and streams for every wire. The caller therefore gets the same JSON
//! from a gRPC agent as from a JSON-RPC one (encoded by the gateway, as
//! gRPC sends no JSON).
//!
//! Connections go through the outbound guard as the HTTP client's do: the
//! connector resolves the name with the gateway's lookup and keeps only
//! the addresses the policy permits, so the address checked is the one
//! dialled, and TLS trusts and presents what `gateway.outbound` says.
//! Channels are kept per origin and dropped when the TLS files change.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::StreamExt;
use http::uri::PathAndQuery;
use http::Uri;
use serde_json::{json, Map, Value};
use tonic::transport::Channel;
use url::Url;

use super::{redacted, Answer, Event, GatewayError, Outbound, OutboundError};
use crate::a2a_pb as pb;
use crate::gateway::outbound::{refusal_in, Lookup, OutboundPolicy};

/// The service's methods, under the interface URL's path (a gateway in
/// front of the agent may route by a prefix).
const SERVICE: &str = "lf.a2a.v1.A2AService";

/// An answer for the caller instead of a result: the agent refused the
/// call's credentials or its content, as an HTTP agent's 4xx does.
type Refused = Answer;

/// `SendMessage` of `request`, a `SendMessageRequest` in 1.0's JSON, with
/// `headers` as metadata: the result in 1.0's JSON (`{"task": …}` or
/// `{"message": …}`), or the agent's refusal.
pub(super) async fn send_message(
    out: &Outbound,
    base: &Url,
    headers: &[(String, String)],
    request: &Value,
) -> Result<Result<Value, Refused>, GatewayError> {
    let codec =
        tonic_prost::ProstCodec::<pb::SendMessageRequest, pb::SendMessageResponse>::default();
    let req = with_metadata(send_message_request(request), headers, out)?;
    let (mut grpc, path) = (client(out, base)?, path(base, "SendMessage")?);
    let sent = within(out, base, async {
        grpc.ready().await.map_err(|e| unreachable(base, &e))?;
        Ok(grpc.unary(req, path, codec).await)
    })
    .await?;
    Ok(match sent {
        Ok(resp) => Ok(send_response_json(resp.into_inner())),
        Err(status) => Err(refused(&status, base)?),
    })
}

/// `SendStreamingMessage` of `request`, as `send_message`: the stream's
/// events, each one `StreamResponse` as JSON and each within the policy's
/// timeout, or the agent's refusal.
pub(super) async fn stream_message(
    out: &Outbound,
    base: &Url,
    headers: &[(String, String)],
    request: &Value,
) -> Result<Result<BoxStream<'static, Result<Event, GatewayError>>, Refused>, GatewayError> {
    let codec = tonic_prost::ProstCodec::<pb::SendMessageRequest, pb::StreamResponse>::default();
    let req = with_metadata(send_message_request(request), headers, out)?;
    let (mut grpc, path) = (client(out, base)?, path(base, "SendStreamingMessage")?);
    let sent = within(out, base, async {
        grpc.ready().await.map_err(|e| unreachable(base, &e))?;
        Ok(grpc.server_streaming(req, path, codec).await)
    })
    .await?;
    let messages = match sent {
        Ok(resp) => resp.into_inner(),
        Err(status) => return Ok(Err(refused(&status, base)?)),
    };
    let (out, url) = (out.clone(), base.clone());
    let events = futures::stream::unfold(Some(messages), move |messages| {
        let (out, url) = (out.clone(), url.clone());
        async move {
            let mut messages = messages?;
            let next = within(&out, &url, async {
                messages
                    .message()
                    .await
                    .map_err(|status| failure(&status, &url))
            })
            .await;
            let item = match next {
                Ok(Some(m)) => Ok(Event {
                    event: "message".into(),
                    data: stream_response_json(m).to_string(),
                    id: None,
                }),
                Ok(None) => return None,
                Err(e) => Err(e),
            };
            let more = item.is_ok().then_some(messages);
            Some((item, more))
        }
    })
    .boxed();
    Ok(Ok(events))
}

/// `CancelTask` of `task`.
pub(super) async fn cancel(
    out: &Outbound,
    base: &Url,
    headers: &[(String, String)],
    task: &str,
) -> Result<(), GatewayError> {
    let request = pb::CancelTaskRequest {
        id: task.to_string(),
        ..Default::default()
    };
    let codec = tonic_prost::ProstCodec::<pb::CancelTaskRequest, pb::Task>::default();
    let req = with_metadata(request, headers, out)?;
    let (mut grpc, path) = (client(out, base)?, path(base, "CancelTask")?);
    within(out, base, async {
        grpc.ready().await.map_err(|e| unreachable(base, &e))?;
        grpc.unary(req, path, codec)
            .await
            .map_err(|status| failure(&status, base))
    })
    .await
    .map(drop)
}

/// `work` (an exchange with the agent at `base`) within the policy's
/// timeout.
async fn within<T>(
    out: &Outbound,
    base: &Url,
    work: impl Future<Output = Result<T, GatewayError>>,
) -> Result<T, GatewayError> {
    let timeout = out.policy.timeout;
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| OutboundError::Timeout {
            target: redacted(base),
            ms: timeout.as_millis(),
        })?
}

fn send_message_request(request: &Value) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        message: Some(message_from_json(&request["message"])),
        ..Default::default()
    }
}

/// A gRPC client on the kept channel to `base`'s origin, its answers held
/// to the policy's size.
fn client(out: &Outbound, base: &Url) -> Result<tonic::client::Grpc<Channel>, GatewayError> {
    let channel = out.grpc_channel(base)?;
    Ok(tonic::client::Grpc::new(channel).max_decoding_message_size(out.policy.max_response_bytes))
}

/// The method's path under the interface URL's.
fn path(base: &Url, method: &str) -> Result<PathAndQuery, GatewayError> {
    let prefix = base.path().trim_end_matches('/');
    PathAndQuery::try_from(format!("{prefix}/{SERVICE}/{method}")).map_err(|e| {
        GatewayError::Unsupported(format!(
            "the A2A gRPC interface {} has no usable path: {e}",
            redacted(base)
        ))
    })
}

/// `message` with the call's headers as metadata (lower-case names, as
/// HTTP/2 sends them) and its deadline.
fn with_metadata<T>(
    message: T,
    headers: &[(String, String)],
    out: &Outbound,
) -> Result<tonic::Request<T>, GatewayError> {
    use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
    let mut req = tonic::Request::new(message);
    for (name, value) in headers {
        let key =
            AsciiMetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                GatewayError::Unsupported(format!(
                    "the credential header '{name}' is not a gRPC metadata key"
                ))
            })?;
        let value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| {
            GatewayError::Unsupported(format!(
                "the value of '{name}' cannot be sent as gRPC metadata"
            ))
        })?;
        req.metadata_mut().append(key, value);
    }
    req.set_timeout(out.policy.timeout);
    Ok(req)
}

/// A connection that could not be made or used: the outbound policy's
/// refusal as such, anything else as an unreachable agent.
fn unreachable(base: &Url, e: &(dyn std::error::Error + 'static)) -> GatewayError {
    refusal_in(e)
        .unwrap_or_else(|| OutboundError::Unreachable {
            target: redacted(base),
            reason: crate::error_chain(e),
        })
        .into()
}

/// A status that is an answer for the caller: the agent refused the
/// credentials (401, 403, its `www-authenticate` beside) or the request
/// (422, as a JSON-RPC agent's invalid params are). Anything else is a
/// failure.
fn refused(status: &tonic::Status, base: &Url) -> Result<Answer, GatewayError> {
    use tonic::Code;
    let http = match status.code() {
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::InvalidArgument => 422,
        _ => return Err(failure(status, base)),
    };
    let title = if http == 422 {
        "The A2A agent refused the request"
    } else {
        "The A2A agent refused the credentials"
    };
    let mut answer = super::a2a::problem(
        http,
        json!({
            "type": "about:blank",
            "title": title,
            "status": http,
            "detail": status.message(),
            "grpc_status": status.code() as i32,
        }),
    );
    answer.challenge = (http != 422)
        .then(|| status.metadata().get("www-authenticate"))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok(answer)
}

/// A failed exchange as the gateway's error: a connection that failed (or
/// that the guard refused), the agent's own deadline, its overload, or
/// its failure.
fn failure(status: &tonic::Status, base: &Url) -> GatewayError {
    use tonic::Code;
    let target = redacted(base);
    // A status with a cause was made by the client from a failed
    // connection (refused, a TLS handshake the agent ended), not sent by
    // the agent.
    if let Some(source) = std::error::Error::source(status) {
        return unreachable(base, source);
    }
    match status.code() {
        Code::DeadlineExceeded => GatewayError::Timeout(format!(
            "the A2A agent at {target} timed out ({})",
            status.message()
        )),
        Code::Unavailable | Code::ResourceExhausted => GatewayError::Overloaded {
            message: format!(
                "the A2A agent at {target} is overloaded (gRPC {:?}: {})",
                status.code(),
                status.message()
            ),
            retry_after: None,
        },
        code => GatewayError::BadAnswer(format!(
            "the A2A agent at {target} answered gRPC status {code:?}: {}",
            status.message()
        )),
    }
}

/// Opens channels through the outbound guard: the name resolved by the
/// gateway's lookup, only permitted addresses dialled.
#[derive(Clone)]
pub(super) struct GuardedConnector {
    pub policy: Arc<OutboundPolicy>,
    pub lookup: Lookup,
}

type Connecting = Pin<
    Box<
        dyn Future<
                Output = Result<
                    hyper_util::rt::TokioIo<tokio::net::TcpStream>,
                    Box<dyn std::error::Error + Send + Sync>,
                >,
            > + Send,
    >,
>;

impl tower::Service<Uri> for GuardedConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (policy, lookup) = (self.policy.clone(), self.lookup.clone());
        Box::pin(async move {
            let host = uri.host().unwrap_or_default();
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let tls = uri.scheme_str() == Some("https");
            let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
            let found = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, port)],
                Err(_) => lookup(host.clone()).await?,
            };
            let addrs = policy.filter_resolved(&host, found)?;
            let mut last = None;
            for mut addr in addrs {
                addr.set_port(port);
                match tokio::time::timeout(
                    policy.connect_timeout,
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                {
                    Ok(Ok(stream)) => {
                        stream.set_nodelay(true)?;
                        return Ok(hyper_util::rt::TokioIo::new(stream));
                    }
                    Ok(Err(e)) => last = Some(e),
                    Err(_) => {
                        last = Some(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("connecting to {addr} timed out"),
                        ))
                    }
                }
            }
            Err(last
                .unwrap_or_else(|| std::io::Error::other("no address to connect to"))
                .into())
        })
    }
}

// --- protobuf ⇄ A2A 1.0 JSON (the protobuf JSON mapping) ------------------

/// A message the gateway built in 1.0's JSON (`a2a::send_request`).
fn message_from_json(m: &Value) -> pb::Message {
    let text = |k: &str| {
        m.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    pb::Message {
        message_id: text("messageId"),
        context_id: text("contextId"),
        task_id: text("taskId"),
        role: pb::Role::User as i32,
        parts: m
            .get("parts")
            .and_then(Value::as_array)
            .map(|parts| parts.iter().map(part_from_json).collect())
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn part_from_json(p: &Value) -> pb::Part {
    use pb::part::Content;
    let content = match (p.get("text").and_then(Value::as_str), p.get("data")) {
        (Some(t), _) => Some(Content::Text(t.to_string())),
        (None, Some(d)) => Some(Content::Data(value_from_json(d))),
        (None, None) => None,
    };
    pb::Part {
        content,
        ..Default::default()
    }
}

fn value_from_json(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(value_from_json).collect(),
        }),
        Value::Object(o) => Kind::StructValue(struct_from_json(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn struct_from_json(o: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: o
            .iter()
            .map(|(k, v)| (k.clone(), value_from_json(v)))
            .collect(),
    }
}

fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        // Whole numbers as integers, as the JSON a JSON-RPC agent sends.
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
            json!(*n as i64)
        }
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}

fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

/// Inserts `value` under `key` unless it is the member's default (the
/// mapping leaves those out).
fn put(o: &mut Map<String, Value>, key: &str, value: Value) {
    let empty = match &value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Bool(b) => !b,
        _ => false,
    };
    if !empty {
        o.insert(key.into(), value);
    }
}

fn metadata_json(m: &Option<prost_types::Struct>) -> Value {
    m.as_ref().map_or(Value::Null, struct_json)
}

fn part_json(p: &pb::Part) -> Value {
    use base64::Engine;
    use pb::part::Content;
    let mut o = Map::new();
    match &p.content {
        Some(Content::Text(t)) => {
            o.insert("text".into(), json!(t));
        }
        Some(Content::Raw(b)) => {
            o.insert(
                "raw".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(b)),
            );
        }
        Some(Content::Url(u)) => {
            o.insert("url".into(), json!(u));
        }
        Some(Content::Data(d)) => {
            o.insert("data".into(), value_json(d));
        }
        None => {}
    }
    put(&mut o, "metadata", metadata_json(&p.metadata));
    put(&mut o, "filename", json!(p.filename));
    put(&mut o, "mediaType", json!(p.media_type));
    Value::Object(o)
}

fn parts_json(parts: &[pb::Part]) -> Value {
    Value::Array(parts.iter().map(part_json).collect())
}

fn message_json(m: &pb::Message) -> Value {
    let mut o = Map::new();
    put(&mut o, "messageId", json!(m.message_id));
    put(&mut o, "contextId", json!(m.context_id));
    put(&mut o, "taskId", json!(m.task_id));
    if m.role != 0 {
        let role =
            pb::Role::try_from(m.role).map_or_else(|_| json!(m.role), |r| json!(r.as_str_name()));
        o.insert("role".into(), role);
    }
    put(&mut o, "parts", parts_json(&m.parts));
    put(&mut o, "metadata", metadata_json(&m.metadata));
    put(&mut o, "extensions", json!(m.extensions));
    put(&mut o, "referenceTaskIds", json!(m.reference_task_ids));
    Value::Object(o)
}

fn status_json(s: &pb::TaskStatus) -> Value {
    let mut o = Map::new();
    if s.state != 0 {
        let state = pb::TaskState::try_from(s.state)
            .map_or_else(|_| json!(s.state), |t| json!(t.as_str_name()));
        o.insert("state".into(), state);
    }
    if let Some(m) = &s.message {
        o.insert("message".into(), message_json(m));
    }
    if let Some(t) = &s.timestamp {
        let nanos = i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos);
        if let Ok(at) = time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            if let Ok(text) = at.format(&time::format_description::well_known::Rfc3339) {
                o.insert("timestamp".into(), json!(text));
            }
        }
    }
    Value::Object(o)
}

fn artifact_json(a: &pb::Artifact) -> Value {
    let mut o = Map::new();
    put(&mut o, "artifactId", json!(a.artifact_id));
    put(&mut o, "name", json!(a.name));
    put(&mut o, "description", json!(a.description));
    put(&mut o, "parts", parts_json(&a.parts));
    put(&mut o, "metadata", metadata_json(&a.metadata));
    put(&mut o, "extensions", json!(a.extensions));
    Value::Object(o)
}

fn task_json(t: &pb::Task) -> Value {
    let mut o = Map::new();
    put(&mut o, "id", json!(t.id));
    put(&mut o, "contextId", json!(t.context_id));
    if let Some(s) = &t.status {
        o.insert("status".into(), status_json(s));
    }
    put(
        &mut o,
        "artifacts",
        Value::Array(t.artifacts.iter().map(artifact_json).collect()),
    );
    put(
        &mut o,
        "history",
        Value::Array(t.history.iter().map(message_json).collect()),
    );
    put(&mut o, "metadata", metadata_json(&t.metadata));
    Value::Object(o)
}

fn send_response_json(r: pb::SendMessageResponse) -> Value {
    use pb::send_message_response::Payload;
    match r.payload {
        Some(Payload::Task(t)) => json!({"task": task_json(&t)}),
        Some(Payload::Message(m)) => json!({"message": message_json(&m)}),
        None => json!({}),
    }
}

fn stream_response_json(r: pb::StreamResponse) -> Value {
    use pb::stream_response::Payload;
    match r.payload {
        Some(Payload::Task(t)) => json!({"task": task_json(&t)}),
        Some(Payload::Message(m)) => json!({"message": message_json(&m)}),
        Some(Payload::StatusUpdate(u)) => {
            let mut o = Map::new();
            put(&mut o, "taskId", json!(u.task_id));
            put(&mut o, "contextId", json!(u.context_id));
            if let Some(s) = &u.status {
                o.insert("status".into(), status_json(s));
            }
            put(&mut o, "metadata", metadata_json(&u.metadata));
            json!({"statusUpdate": o})
        }
        Some(Payload::ArtifactUpdate(u)) => {
            let mut o = Map::new();
            put(&mut o, "taskId", json!(u.task_id));
            put(&mut o, "contextId", json!(u.context_id));
            if let Some(a) = &u.artifact {
                o.insert("artifact".into(), artifact_json(a));
            }
            put(&mut o, "append", json!(u.append));
            put(&mut o, "lastChunk", json!(u.last_chunk));
            put(&mut o, "metadata", metadata_json(&u.metadata));
            json!({"artifactUpdate": o})
        }
        None => json!({}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_a2a_json_as_json_rpc_agents_send_it() {
        use pb::part::Content;
        let data = value_from_json(&json!({"n": 3, "x": 1.5, "ok": true, "list": ["a", null]}));
        let task = pb::Task {
            id: "t1".into(),
            context_id: "c1".into(),
            status: Some(pb::TaskStatus {
                state: pb::TaskState::InputRequired as i32,
                message: Some(pb::Message {
                    message_id: "m2".into(),
                    role: pb::Role::Agent as i32,
                    parts: vec![pb::Part {
                        content: Some(Content::Text("Which date?".into())),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                timestamp: Some(prost_types::Timestamp {
                    seconds: 1_796_000_000,
                    nanos: 0,
                }),
            }),
            artifacts: vec![pb::Artifact {
                artifact_id: "a1".into(),
                parts: vec![
                    pb::Part {
                        content: Some(Content::Data(data)),
                        ..Default::default()
                    },
                    pb::Part {
                        content: Some(Content::Raw(vec![0, 255])),
                        media_type: "application/octet-stream".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let got = send_response_json(pb::SendMessageResponse {
            payload: Some(pb::send_message_response::Payload::Task(task)),
        });
        assert_eq!(
            got,
            json!({"task": {
                "id": "t1", "contextId": "c1",
                "status": {"state": "TASK_STATE_INPUT_REQUIRED",
                    "message": {"messageId": "m2", "role": "ROLE_AGENT", "parts": [{"text": "Which date?"}]},
                    "timestamp": "2026-11-30T00:53:20Z"},
                "artifacts": [{"artifactId": "a1", "parts": [
                    {"data": {"n": 3, "x": 1.5, "ok": true, "list": ["a", null]}},
                    {"raw": "AP8=", "mediaType": "application/octet-stream"}
                ]}]
            }})
        );
        // The a2a module reads it as it reads a JSON-RPC result.
        let question = super::super::a2a::input_request(&got).unwrap();
        assert_eq!(question.question, "Which date?");
        assert_eq!(question.continuation.task_id, "t1");
    }

    #[test]
    fn the_gateways_message_becomes_protobuf() {
        use pb::part::Content;
        let m = message_from_json(&json!({
            "messageId": "m1", "role": "ROLE_USER", "taskId": "t1", "contextId": "c1",
            "parts": [{"text": "hi"}, {"data": {"a": [1, "b"]}}]
        }));
        assert_eq!(
            (
                m.message_id.as_str(),
                m.task_id.as_str(),
                m.context_id.as_str()
            ),
            ("m1", "t1", "c1")
        );
        assert_eq!(m.role, pb::Role::User as i32);
        assert_eq!(m.parts[0].content, Some(Content::Text("hi".into())));
        let Some(Content::Data(d)) = &m.parts[1].content else {
            panic!("a data part: {:?}", m.parts[1]);
        };
        assert_eq!(value_json(d), json!({"a": [1, "b"]}));
    }

    #[test]
    fn statuses_are_refusals_or_failures() {
        let base = Url::parse("https://agent.example/a2a").unwrap();
        let mut status = tonic::Status::unauthenticated("token expired");
        status.metadata_mut().insert(
            "www-authenticate",
            "Bearer error=\"invalid_token\"".parse().unwrap(),
        );
        let a = refused(&status, &base).unwrap();
        assert_eq!(a.status, 401);
        assert_eq!(
            a.challenge.as_deref(),
            Some("Bearer error=\"invalid_token\"")
        );
        assert_eq!(a.json["detail"], "token expired");
        assert_eq!(
            refused(&tonic::Status::invalid_argument("no parts"), &base)
                .unwrap()
                .status,
            422
        );
        assert!(matches!(
            refused(&tonic::Status::internal("boom"), &base),
            Err(GatewayError::BadAnswer(_))
        ));
        assert!(matches!(
            refused(&tonic::Status::unavailable("busy"), &base),
            Err(GatewayError::Overloaded { .. })
        ));
        assert_eq!(
            path(&base, "SendMessage").unwrap().as_str(),
            "/a2a/lf.a2a.v1.A2AService/SendMessage"
        );
        let root = Url::parse("http://127.0.0.1:5000").unwrap();
        assert_eq!(
            path(&root, "CancelTask").unwrap().as_str(),
            "/lf.a2a.v1.A2AService/CancelTask"
        );
    }
}
