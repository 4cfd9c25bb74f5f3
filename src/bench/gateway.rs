//! What the invocation gateway adds: the same local echo agent called
//! directly and through `POST /agents/{id}/invoke` (HTTP facade → gRPC
//! handler → record, schema checks, outbound guard → agent), alternating
//! run by run, with one keep-alive HTTP client each way.

use std::path::Path;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use futures::{stream, StreamExt};
use serde_json::{json, Value};

use super::discover::{config, measured, Measured};

const ADMIN: &str = "bench-admin-key-0000001";

/// The figures of one run: (clients, direct, through the gateway).
pub struct GatewayReport {
    pub calls: usize,
    pub runs: Vec<(usize, Measured, Measured)>,
}

/// The echo agent: answers `{"echo": <input>}`.
async fn start_echo() -> Result<String, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let app = Router::new().route(
        "/echo",
        post(|Json(v): Json<Value>| async move { Json(json!({"echo": v})) }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "echo agent stopped");
        }
    });
    Ok(format!("http://{addr}/echo"))
}

/// Runs `calls` calls at each concurrency, direct and through the gateway.
pub async fn run(
    dir: &Path,
    calls: usize,
    concurrencies: &[usize],
) -> Result<GatewayReport, String> {
    let echo = start_echo().await?;
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
    let agent = json!({
        "id": "echo",
        "name": "Echo",
        "description": "Answers with its input.",
        "bindings": [{"protocol": "http", "endpoint": echo}],
        "operations": [{
            "name": "echo",
            "inputs": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text"]},
            "outputs": {"type": "object", "properties": {"echo": {"type": "object"}}, "required": ["echo"]}
        }]
    });
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
    let call = |through_gateway: bool, k: usize| {
        let req = if through_gateway {
            client.post(&invoke).bearer_auth(ADMIN)
        } else {
            client.post(&echo)
        };
        async move {
            let started = Instant::now();
            let resp = req
                .json(&json!({"text": "measure me", "n": k}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp.bytes().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
            }
            Ok::<_, String>(started.elapsed())
        }
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
    Ok(GatewayReport { calls, runs })
}

pub fn report(r: &GatewayReport) -> String {
    let mut out = format!(
        "Invocation gateway overhead: a local echo agent called directly and through POST /agents/{{id}}/invoke (input and output schema checked), HTTP/1.1 keep-alive on loopback, {} calls per run\n\n",
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
