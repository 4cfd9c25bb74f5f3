//! What the invocation gateway adds: the same local echo agent called
//! directly and through `POST /agents/{id}/invoke` (HTTP facade → gRPC
//! handler → record, schema checks, outbound guard → agent), alternating
//! run by run, with one keep-alive HTTP client each way. With `a2a` the
//! agent is an A2A 1.0 JSON-RPC agent: the direct call is the same
//! `SendMessage` the gateway sends, so the difference is what the gateway
//! adds (building the message, the version header, reading the result).
//! With `a2a-grpc` the agent serves A2A 1.0 over gRPC, and the direct
//! call is the same `SendMessage` from a tonic client.

use std::path::Path;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use futures::future::BoxFuture;
use futures::{stream, FutureExt, StreamExt};
use serde_json::{json, Value};

use super::discover::{config, measured, Measured};

const ADMIN: &str = "bench-admin-key-0000001";
/// The A2A 1.0 gRPC method the gateway calls, at the root of the agent's URL.
const A2A_GRPC_SEND: &str = "/lf.a2a.v1.A2AService/SendMessage";

/// The figures of one run: (clients, direct, through the gateway).
pub struct GatewayReport {
    pub calls: usize,
    pub runs: Vec<(usize, Measured, Measured)>,
    pub kind: Agent,
}

/// Serves `app` (the agent called `what`) on a loopback port: its address.
async fn serve(app: Router, what: &'static str) -> Result<std::net::SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "{what} stopped");
        }
    });
    Ok(addr)
}

/// The echo agent: answers `{"echo": <input>}`.
async fn start_echo() -> Result<String, String> {
    let app = Router::new().route(
        "/echo",
        post(|Json(v): Json<Value>| async move { Json(json!({"echo": v})) }),
    );
    Ok(format!("http://{}/echo", serve(app, "echo agent").await?))
}

/// An A2A 1.0 JSON-RPC agent: `SendMessage` answers a completed task whose
/// artifact echoes the message's parts.
async fn start_a2a_echo() -> Result<String, String> {
    let app = Router::new().route(
        "/jsonrpc",
        post(|Json(v): Json<Value>| async move {
            let parts = v["params"]["message"]["parts"].clone();
            Json(json!({"jsonrpc": "2.0", "id": v["id"], "result": {"task": {
                "id": "t", "contextId": "c",
                "status": {"state": "TASK_STATE_COMPLETED"},
                "artifacts": [{"artifactId": "a", "name": "echo", "parts": parts}],
            }}}))
        }),
    );
    Ok(format!(
        "http://{}/jsonrpc",
        serve(app, "A2A echo agent").await?
    ))
}

/// An A2A 1.0 gRPC agent: `lf.a2a.v1.A2AService/SendMessage` answers a
/// completed task whose artifact echoes the message's parts, served over
/// HTTP/2 without TLS as the SDKs' gRPC servers are.
async fn start_a2a_grpc_echo() -> Result<String, String> {
    use crate::a2a_pb as pb;

    #[derive(Clone)]
    struct Echo;
    impl tonic::server::UnaryService<pb::SendMessageRequest> for Echo {
        type Response = pb::SendMessageResponse;
        type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;
        fn call(&mut self, req: tonic::Request<pb::SendMessageRequest>) -> Self::Future {
            let parts = req
                .into_inner()
                .message
                .map(|m| m.parts)
                .unwrap_or_default();
            let task = pb::Task {
                id: "t".into(),
                context_id: "c".into(),
                status: Some(pb::TaskStatus {
                    state: pb::TaskState::Completed as i32,
                    ..Default::default()
                }),
                artifacts: vec![pb::Artifact {
                    artifact_id: "a".into(),
                    name: "echo".into(),
                    parts,
                    ..Default::default()
                }],
                ..Default::default()
            };
            std::future::ready(Ok(tonic::Response::new(pb::SendMessageResponse {
                payload: Some(pb::send_message_response::Payload::Task(task)),
            })))
        }
    }

    let app = Router::new().route(
        A2A_GRPC_SEND,
        post(|req: axum::extract::Request| async move {
            let codec =
                tonic_prost::ProstCodec::<pb::SendMessageResponse, pb::SendMessageRequest>::default(
                );
            tonic::server::Grpc::new(codec)
                .unary(Echo, req)
                .await
                .map(axum::body::Body::new)
        }),
    );
    Ok(format!(
        "http://{}",
        serve(app, "A2A gRPC echo agent").await?
    ))
}

/// Which echo agent the run calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// AIDIP REST (`http`), input and output schemas checked.
    Rest,
    /// A2A 1.0 over JSON-RPC.
    A2a,
    /// A2A 1.0 over gRPC.
    A2aGrpc,
}

/// One `SendMessage` straight to the gRPC echo agent, as the gateway sends it.
async fn grpc_direct(channel: tonic::transport::Channel, k: usize) -> Result<Duration, String> {
    use crate::a2a_pb as pb;
    let started = Instant::now();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let message = pb::Message {
        message_id: format!("m{k}"),
        role: pb::Role::User as i32,
        parts: vec![pb::Part {
            content: Some(pb::part::Content::Text(format!("measure me {k}"))),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut req = tonic::Request::new(pb::SendMessageRequest {
        message: Some(message),
        ..Default::default()
    });
    req.metadata_mut().insert(
        "a2a-version",
        tonic::metadata::AsciiMetadataValue::from_static("1.0"),
    );
    let codec =
        tonic_prost::ProstCodec::<pb::SendMessageRequest, pb::SendMessageResponse>::default();
    let path = http::uri::PathAndQuery::from_static(A2A_GRPC_SEND);
    grpc.unary(req, path, codec)
        .await
        .map_err(|e| e.to_string())?;
    Ok(started.elapsed())
}

/// Runs `calls` calls at each concurrency, direct and through the gateway.
pub async fn run(
    dir: &Path,
    calls: usize,
    concurrencies: &[usize],
    kind: Agent,
) -> Result<GatewayReport, String> {
    let echo = match kind {
        Agent::Rest => start_echo().await?,
        Agent::A2a => start_a2a_echo().await?,
        Agent::A2aGrpc => start_a2a_grpc_echo().await?,
    };
    let channel = match kind {
        Agent::A2aGrpc => Some(
            tonic::transport::Endpoint::from_shared(echo.clone())
                .map_err(|e| e.to_string())?
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let mut c = config(dir);
    c.gateway.outbound.allow = vec!["127.0.0.1".into()];
    c.gateway.outbound.allow_http = true;
    c.gateway.max_concurrent_per_agent = concurrencies.iter().copied().max().unwrap_or(1).max(64);
    let server = crate::server::start(c).await.map_err(|e| e.to_string())?;
    let base = format!("http://{}", server.http_addr);
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| e.to_string())?;
    let agent = match kind {
        Agent::Rest => json!({
            "id": "echo",
            "name": "Echo",
            "description": "Answers with its input.",
            "bindings": [{"protocol": "http", "endpoint": echo}],
            "operations": [{
                "name": "echo",
                "inputs": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text"]},
                "outputs": {"type": "object", "properties": {"echo": {"type": "object"}}, "required": ["echo"]}
            }]
        }),
        Agent::A2a | Agent::A2aGrpc => json!({
            "id": "echo",
            "name": "Echo",
            "description": "Answers with its input, over A2A.",
            "bindings": [{"protocol": "a2a", "endpoint": echo,
                "transport": if kind == Agent::A2a { "JSONRPC" } else { "GRPC" },
                "protocolVersion": "1.0"}],
        }),
    };
    let resp = client
        .post(format!("{base}/agents"))
        .bearer_auth(ADMIN)
        .json(&agent)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("registering the echo agent: {}", resp.status()));
    }
    let invoke = format!("{base}/agents/echo/invoke");
    let call = |through_gateway: bool, k: usize| -> BoxFuture<'static, Result<Duration, String>> {
        if let (false, Some(channel)) = (through_gateway, &channel) {
            return grpc_direct(channel.clone(), k).boxed();
        }
        let (req, body) = match (through_gateway, kind) {
            (true, Agent::Rest) => (
                client.post(&invoke).bearer_auth(ADMIN),
                json!({"text": "measure me", "n": k}),
            ),
            (true, Agent::A2a | Agent::A2aGrpc) => (
                client.post(&invoke).bearer_auth(ADMIN),
                json!({"text": format!("measure me {k}")}),
            ),
            (false, Agent::Rest) => (client.post(&echo), json!({"text": "measure me", "n": k})),
            (false, Agent::A2a | Agent::A2aGrpc) => (
                client.post(&echo).header("A2A-Version", "1.0"),
                json!({"jsonrpc": "2.0", "id": k, "method": "SendMessage", "params": {"message": {
                    "messageId": format!("m{k}"), "role": "ROLE_USER",
                    "parts": [{"text": format!("measure me {k}")}]}}}),
            ),
        };
        async move {
            let started = Instant::now();
            let resp = req.json(&body).send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp.bytes().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
            }
            Ok::<_, String>(started.elapsed())
        }
        .boxed()
    };
    // Connections up and caches warm, both ways.
    for k in 0..200 {
        call(false, k).await?;
        call(true, k).await?;
    }
    let mut runs = Vec::new();
    for &clients in concurrencies {
        let mut out = Vec::new();
        for through_gateway in [false, true] {
            let started = Instant::now();
            let lat: Vec<Result<Duration, String>> = stream::iter(0..calls)
                .map(|k| call(through_gateway, k))
                .buffer_unordered(clients.max(1))
                .collect()
                .await;
            let lat = lat.into_iter().collect::<Result<Vec<_>, _>>()?;
            let what = if through_gateway { "gateway" } else { "direct" };
            out.push(measured(
                format!("{what}, {clients} client(s)"),
                lat,
                started.elapsed(),
            ));
        }
        let gateway = out.pop().ok_or("no run")?;
        let direct = out.pop().ok_or("no run")?;
        runs.push((clients, direct, gateway));
    }
    server.shutdown().await;
    Ok(GatewayReport { calls, runs, kind })
}

pub fn report(r: &GatewayReport) -> String {
    let agent = match r.kind {
        Agent::Rest => "a local echo agent (AIDIP REST, input and output schema checked)",
        Agent::A2a => "a local A2A 1.0 echo agent (JSON-RPC SendMessage)",
        Agent::A2aGrpc => {
            "a local A2A 1.0 echo agent (gRPC SendMessage; called directly with tonic)"
        }
    };
    let mut out = format!(
        "Invocation gateway overhead: {agent} called directly and through POST /agents/{{id}}/invoke, HTTP/1.1 keep-alive on loopback, {} calls per run\n\n",
        r.calls
    );
    out.push_str("| clients | direct p50 | direct p99 | gateway p50 | gateway p99 | added p50 | added p99 | direct calls/s | gateway calls/s |\n|---|---|---|---|---|---|---|---|---|\n");
    let ms = |us: f64| format!("{:.3} ms", us / 1000.0);
    for (clients, direct, gateway) in &r.runs {
        out.push_str(&format!(
            "| {clients} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} |\n",
            ms(direct.p50_us),
            ms(direct.p99_us),
            ms(gateway.p50_us),
            ms(gateway.p99_us),
            ms(gateway.p50_us - direct.p50_us),
            ms(gateway.p99_us - direct.p99_us),
            direct.per_second,
            gateway.per_second
        ));
    }
    out
}
