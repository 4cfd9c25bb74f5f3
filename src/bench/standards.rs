//! `agentry bench standards`: what the discovery standards' surfaces cost
//! over HTTP on loopback against one node.
//!
//! - ARD search against ADP discover: the same query texts, alternating
//!   which goes first, both asking for 10 results from this registry only;
//!   the ratio of their latencies is the cost of the ARD view.
//! - The AI Catalog document: its first build, a cached answer, a
//!   conditional (304) answer, and the answer after one registration
//!   (the incremental rebuild), with the document's size.
//! - MCP Registry API `GET /v0.1/servers`: pages of 100 at `servers`
//!   published servers, from the start and from cursors spread over the
//!   list.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use serde_json::{json, Value};

use super::discover::{
    corpus_agent, corpus_node, measured_serial, paired, queries, sources, Measured,
};

/// The figures of one run.
#[derive(Debug)]
pub struct StandardsReport {
    pub agents: usize,
    pub discover: Measured,
    pub ard_search: Measured,
    pub catalog_bytes: usize,
    pub catalog_first: Duration,
    pub catalog_cached: Measured,
    pub catalog_not_modified: Measured,
    pub catalog_after_change: Duration,
    pub servers: usize,
    pub publish_secs: f64,
    pub mcp_page: Measured,
}

const KEY: &str = "Bearer bench-admin-key-0000001";

async fn timed_post(http: &reqwest::Client, url: &str, body: &Value) -> Result<Duration, String> {
    let t = Instant::now();
    let resp = http
        .post(url)
        .header("authorization", KEY)
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{url} answered {status}"));
    }
    Ok(t.elapsed())
}

async fn timed_get(
    http: &reqwest::Client,
    url: &str,
    etag: Option<&str>,
) -> Result<(Duration, u16, usize, Option<String>), String> {
    let t = Instant::now();
    let mut req = http.get(url).header("authorization", KEY);
    if let Some(e) = etag {
        req = req.header("if-none-match", e);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let tag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if status >= 400 {
        return Err(format!("{url} answered {status}"));
    }
    Ok((t.elapsed(), status, body.len(), tag))
}

/// A server.json of the benchmark's MCP registry.
fn server_json(i: usize) -> Value {
    json!({
        "name": format!("io.bench/server-{i:06}"),
        "description": format!("Benchmark MCP server number {i}."),
        "version": format!("1.{}.0", i % 7),
        "remotes": [{"type": "streamable-http", "url": format!("https://s{i}.bench.invalid/mcp")}],
    })
}

pub async fn run(
    dir: &Path,
    agents: usize,
    query_count: usize,
    servers: usize,
) -> Result<StandardsReport, String> {
    let (server, base) = corpus_node(dir, agents).await?;
    let http = reqwest::Client::new();

    // ARD search against ADP discover, the same texts, alternating.
    let (discover_url, ard_url) = (format!("{base}/discover"), format!("{base}/ard/search"));
    let (d, a) = paired(
        &queries(query_count),
        |_, text| {
            let body = json!({"query": text, "limit": 10});
            let (http, url) = (&http, &discover_url);
            async move { timed_post(http, url, &body).await }
        },
        |_, text| {
            let body = json!({"query": {"text": text}, "federation": "none", "pageSize": 10});
            let (http, url) = (&http, &ard_url);
            async move { timed_post(http, url, &body).await }
        },
    )
    .await?;
    let discover = measured_serial("POST /discover", d);
    let ard_search = measured_serial("POST /ard/search", a);

    // The AI Catalog document.
    let catalog = format!("{base}/.well-known/ai-catalog.json");
    let (catalog_first, _, catalog_bytes, etag) = timed_get(&http, &catalog, None).await?;
    let (mut cached, mut not_modified) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        cached.push(timed_get(&http, &catalog, None).await?.0);
        not_modified.push(timed_get(&http, &catalog, etag.as_deref()).await?.0);
    }
    let catalog_cached = measured_serial("catalog, cached", cached);
    let catalog_not_modified = measured_serial("catalog, 304", not_modified);
    let mut extra = corpus_agent(&sources(), agents + 1);
    extra["id"] = json!("bench-catalog-change");
    timed_post(&http, &format!("{base}/agents"), &extra).await?;
    // At most one build a second while the registry changes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (catalog_after_change, ..) = timed_get(&http, &catalog, None).await?;

    // The MCP registry: publish, then page.
    let started = Instant::now();
    let published: Vec<Result<Duration, String>> = stream::iter(0..servers)
        .map(|i| {
            let http = http.clone();
            let url = format!("{base}/v0.1/publish");
            async move { timed_post(&http, &url, &server_json(i)).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    published.into_iter().collect::<Result<Vec<_>, _>>()?;
    let publish_secs = started.elapsed().as_secs_f64();
    let mut cursors = vec![None];
    let mut next: Option<String> = None;
    // Cursors spread over the list, collected by walking it.
    let step = (servers / 100 / 20).max(1);
    for page in 0.. {
        let url = match &next {
            None => format!("{base}/v0.1/servers?limit=100"),
            Some(c) => format!("{base}/v0.1/servers?limit=100&cursor={c}"),
        };
        let resp: Value = http
            .get(&url)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        next = resp["metadata"]["nextCursor"].as_str().map(String::from);
        match &next {
            Some(c) if page % step == 0 => cursors.push(Some(c.clone())),
            Some(_) => {}
            None => break,
        }
    }
    let mut pages = Vec::new();
    for _ in 0..5 {
        for c in &cursors {
            let url = match c {
                None => format!("{base}/v0.1/servers?limit=100"),
                Some(c) => format!("{base}/v0.1/servers?limit=100&cursor={c}"),
            };
            pages.push(timed_get(&http, &url, None).await?.0);
        }
    }
    let mcp_page = measured_serial("GET /v0.1/servers, 100 a page", pages);
    server.shutdown().await;
    Ok(StandardsReport {
        agents,
        discover,
        ard_search,
        catalog_bytes,
        catalog_first,
        catalog_cached,
        catalog_not_modified,
        catalog_after_change,
        servers,
        publish_secs,
        mcp_page,
    })
}

pub fn report(r: &StandardsReport) -> String {
    let mut out = format!(
        "Discovery standards over HTTP on loopback, one node, {} agents\n\n| request | p50 µs | p99 µs | per second (1 client) |\n|---|---:|---:|---:|\n",
        r.agents
    );
    out.push_str(&r.discover.row());
    out.push_str(&r.ard_search.row());
    out.push_str(&format!(
        "\nARD search / discover: p50 {:.2}×, p99 {:.2}×\n",
        r.ard_search.p50_us / r.discover.p50_us.max(1.0),
        r.ard_search.p99_us / r.discover.p99_us.max(1.0)
    ));
    out.push_str(&format!(
        "\nAI Catalog: {:.1} MiB; first build {:.0} ms; after one registration {:.0} ms\n",
        r.catalog_bytes as f64 / (1024.0 * 1024.0),
        r.catalog_first.as_secs_f64() * 1e3,
        r.catalog_after_change.as_secs_f64() * 1e3
    ));
    out.push_str("\n| request | p50 µs | p99 µs | per second |\n|---|---:|---:|---:|\n");
    out.push_str(&r.catalog_cached.row());
    out.push_str(&r.catalog_not_modified.row());
    out.push_str(&format!(
        "\nMCP registry: {} servers published in {:.1} s ({:.0}/s)\n\n| request | p50 µs | p99 µs | per second |\n|---|---:|---:|---:|\n",
        r.servers,
        r.publish_secs,
        r.servers as f64 / r.publish_secs.max(1e-9)
    ));
    out.push_str(&r.mcp_page.row());
    out
}
