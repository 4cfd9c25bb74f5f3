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

use super::discover::{corpus_node, measured_serial, paired, queries, Measured};

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
    let (server, base) = corpus_node(dir, agents).await?;
    let http = reqwest::Client::new();
    let (direct, mcp) = (format!("{base}/discover"), format!("{base}/mcp"));
    let (d, m) = paired(
        &queries(query_count),
        |_, text| {
            let body = json!({"query": text, "limit": 10, "include_evidence": true});
            let (http, url) = (&http, &direct);
            async move { timed(http, url, &body, false).await }
        },
        |i, text| {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "discover_agents", "arguments": {"task": text, "limit": 10}}});
            let (http, url) = (&http, &mcp);
            async move { timed(http, url, &body, true).await }
        },
    )
    .await?;
    server.shutdown().await;
    Ok(McpReport {
        agents,
        discover: measured_serial("POST /discover", d),
        mcp: measured_serial("MCP tools/call discover_agents", m),
    })
}

pub fn report(r: &McpReport) -> String {
    let mut out = format!(
        "MCP discover_agents against POST /discover, HTTP on loopback, one node, {} agents\n\n| request | p50 µs | p99 µs | per second (1 client) |\n|---|---:|---:|---:|\n",
        r.agents
    );
    out.push_str(&r.discover.row());
    out.push_str(&r.mcp.row());
    out.push_str(&format!(
        "\nMCP - discover: p50 {:+.0} µs, p99 {:+.0} µs\n",
        r.mcp.p50_us - r.discover.p50_us,
        r.mcp.p99_us - r.discover.p99_us
    ));
    out
}
