//! `agentry bench mcp`: what the MCP server (`/mcp`) adds to discovery.
//! The same query texts go to `POST /discover` and, as `discover_agents`
//! calls, to `/mcp` (one JSON-RPC request per call, as a stateless MCP
//! client sends it; the answer is read whole from its event stream),
//! alternating which goes first, over HTTP on loopback against one node.
//! The figure to hold is the difference of the two at p50 (issue 19:
//! at most 1 ms).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::discover::{
    config, measured, queries, register_corpus, sources, wait_indexed, Measured,
};

/// The figures of one run.
#[derive(Debug)]
pub struct McpReport {
    pub agents: usize,
    pub discover: Measured,
    pub mcp: Measured,
}

const KEY: &str = "Bearer bench-admin-key-0000001";

async fn timed(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    mcp: bool,
) -> Result<Duration, String> {
    let t = Instant::now();
    let mut req = http.post(url).header("authorization", KEY).json(body);
    if mcp {
        req = req.header("accept", "application/json, text/event-stream");
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{url} answered {status}: {text}"));
    }
    if mcp && (!text.contains("\"candidates\"") || text.contains("\"isError\":true")) {
        return Err(format!("discover_agents failed: {text}"));
    }
    Ok(t.elapsed())
}

pub async fn run(dir: &Path, agents: usize, query_count: usize) -> Result<McpReport, String> {
    let server = crate::server::start(config(dir))
        .await
        .map_err(|e| e.to_string())?;
    let base = format!("http://{}", server.http_addr);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc_addr))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let src = sources();
    register_corpus(&channel, &src, 0..agents, 64).await?;
    wait_indexed(server.service()).await;
    let http = reqwest::Client::new();
    let qs = queries(query_count);
    let (mut d, mut m) = (Vec::new(), Vec::new());
    let (mut d_wall, mut m_wall) = (Duration::ZERO, Duration::ZERO);
    // The first pass warms both paths (connections, caches); the second
    // is measured.
    for pass in 0..2 {
        if pass == 1 {
            d.clear();
            m.clear();
            d_wall = Duration::ZERO;
            m_wall = Duration::ZERO;
        }
        for (i, (text, _)) in qs.iter().enumerate() {
            let discover = json!({"query": text, "limit": 10, "include_evidence": true});
            let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "discover_agents", "arguments": {"task": text, "limit": 10}}});
            let direct = format!("{base}/discover");
            let mcp = format!("{base}/mcp");
            let (x, y) = if i % 2 == 0 {
                let x = timed(&http, &direct, &discover, false).await?;
                (x, timed(&http, &mcp, &call, true).await?)
            } else {
                let y = timed(&http, &mcp, &call, true).await?;
                (timed(&http, &direct, &discover, false).await?, y)
            };
            d.push(x);
            m.push(y);
            d_wall += x;
            m_wall += y;
        }
    }
    server.shutdown().await;
    Ok(McpReport {
        agents,
        discover: measured("POST /discover".into(), d, d_wall),
        mcp: measured("MCP tools/call discover_agents".into(), m, m_wall),
    })
}

pub fn report(r: &McpReport) -> String {
    let row = |m: &Measured| {
        format!(
            "| {} | {:.0} | {:.0} | {:.0} |\n",
            m.what, m.p50_us, m.p99_us, m.per_second
        )
    };
    let mut out = format!(
        "MCP discover_agents against POST /discover, HTTP on loopback, one node, {} agents\n\n| request | p50 µs | p99 µs | per second (1 client) |\n|---|---:|---:|---:|\n",
        r.agents
    );
    out.push_str(&row(&r.discover));
    out.push_str(&row(&r.mcp));
    out.push_str(&format!(
        "\nMCP - discover: p50 {:+.0} µs, p99 {:+.0} µs\n",
        r.mcp.p50_us - r.discover.p50_us,
        r.mcp.p99_us - r.discover.p99_us
    ));
    out
}
