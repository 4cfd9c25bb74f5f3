//! `agentry bench discover`: discovery latency and throughput at N agents.
//!
//! The corpus is recombined from the MetaTool agents compiled in for the
//! demo: agent i takes its name, description and three examples from one
//! MetaTool agent and a sentence and two examples from another, plus a tag
//! `cat-(i mod 50)` (2 % of agents each) for the filtered queries. Queries
//! are the MetaTool example texts; every other one adds a required tag.
//!
//! Agentry is measured twice: server-side (the service called in-process,
//! no transport) and over gRPC on loopback with 1 and 16 clients.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use serde_json::{json, Value};

use super::peers;
use crate::config::Config;
use crate::convert::metadata_from_json;
use crate::domain::discovery::DiscoveryRequest;
use crate::pb::{self, discovery_client::DiscoveryClient, registry_client::RegistryClient};

const TAG_CLASSES: usize = 50;
/// Publishers the corpus's agents are spread over: one organisation's
/// agents are 0.2 % of the directory.
const PUBLISHERS: usize = 500;
const SUFFIXES: [&str; 8] = [
    "",
    "Pro",
    "Lite",
    "Plus",
    "Hub",
    "Express",
    "Assistant",
    "Studio",
];

/// The MetaTool agents the corpus is recombined from.
pub fn sources() -> Vec<Value> {
    crate::demo::AGENTS
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Agent `i` of the corpus, as metadata JSON.
pub fn corpus_agent(src: &[Value], i: usize) -> Value {
    let a = &src[i % src.len()];
    let b = &src[(i * 7 + 3) % src.len()];
    let (ea, eb) = (strings(a, "examples"), strings(b, "examples"));
    let other = b["long_description"]
        .as_str()
        .or(b["description"].as_str())
        .unwrap_or("")
        .split(". ")
        .next()
        .unwrap_or("")
        .to_string();
    let mut examples: Vec<Value> = (0..3)
        .filter_map(|k| ea.get((i / src.len() + k) % ea.len().max(1)))
        .map(|t| json!({"text": t}))
        .collect();
    examples.extend(eb.iter().take(2).map(|t| json!({"text": t})));
    let suffix = SUFFIXES[(i / src.len()) % SUFFIXES.len()];
    json!({
        "id": format!("{}-{i}", crate::convert::dataset_id(a["id"].as_str().unwrap_or("agent"))),
        "name": format!("{} {suffix}", a["name"].as_str().unwrap_or("Agent")).trim(),
        "description": format!("{} {}", a["description"].as_str().unwrap_or(""), other),
        "tags": [format!("cat-{}", i % TAG_CLASSES)],
        "publisher": format!("org-{}", i % PUBLISHERS),
        "examples": examples,
        "bindings": [{"protocol": "https", "endpoint": format!("https://a{i}.bench.invalid/invoke")}],
    })
}

/// The benchmark's queries: (text, required tag).
pub fn queries(n: usize) -> Vec<(String, Option<String>)> {
    let all: Vec<String> = sources()
        .iter()
        .flat_map(|a| strings(a, "examples"))
        .collect();
    (0..n)
        .map(|k| {
            let text = all[(k * 31) % all.len()].clone();
            let tag = (k % 2 == 1).then(|| format!("cat-{}", k % TAG_CLASSES));
            (text, tag)
        })
        .collect()
}

/// Latency percentiles and throughput of one measured run.
#[derive(Debug, Clone)]
pub struct Measured {
    pub what: String,
    pub p50_us: f64,
    pub p99_us: f64,
    pub per_second: f64,
}

pub(crate) fn measured(what: String, mut lat: Vec<Duration>, wall: Duration) -> Measured {
    lat.sort();
    let pct = |p: f64| {
        let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
        lat.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Measured {
        what,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        per_second: lat.len() as f64 / wall.as_secs_f64().max(1e-9),
    }
}

/// `measured` of requests sent one after another: the wall time is the sum
/// of their latencies.
pub(crate) fn measured_serial(what: &str, lat: Vec<Duration>) -> Measured {
    let wall = lat.iter().sum();
    measured(what.into(), lat, wall)
}

impl Measured {
    /// The row of a `| request | p50 µs | p99 µs | per second |` table.
    pub(crate) fn row(&self) -> String {
        format!(
            "| {} | {:.0} | {:.0} | {:.0} |\n",
            self.what, self.p50_us, self.p99_us, self.per_second
        )
    }
}

/// Times two requests for each query text, `a` then `b` for even ones and
/// `b` then `a` for odd ones, so neither always runs on the other's warm
/// caches. A first pass warms both (connections, caches); the second pass
/// is returned, one latency per text for each.
pub(crate) async fn paired<A, FA, B, FB>(
    texts: &[(String, Option<String>)],
    a: A,
    b: B,
) -> Result<(Vec<Duration>, Vec<Duration>), String>
where
    A: Fn(usize, &str) -> FA,
    FA: std::future::Future<Output = Result<Duration, String>>,
    B: Fn(usize, &str) -> FB,
    FB: std::future::Future<Output = Result<Duration, String>>,
{
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _pass in 0..2 {
        xs.clear();
        ys.clear();
        for (i, (text, _)) in texts.iter().enumerate() {
            let (x, y) = if i % 2 == 0 {
                let x = a(i, text).await?;
                (x, b(i, text).await?)
            } else {
                let y = b(i, text).await?;
                (a(i, text).await?, y)
            };
            xs.push(x);
            ys.push(y);
        }
    }
    Ok((xs, ys))
}

/// A node on the benchmark configuration under `dir` holding corpus agents
/// `0..agents`, all indexed; with the base URL of its HTTP listener.
pub(crate) async fn corpus_node(
    dir: &Path,
    agents: usize,
) -> Result<(crate::server::RunningServer, String), String> {
    let server = crate::server::start(config(dir))
        .await
        .map_err(|e| e.to_string())?;
    let base = format!("http://{}", server.http_addr);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc_addr))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    register_corpus(&channel, &sources(), 0..agents, 64).await?;
    wait_indexed(server.service()).await;
    Ok((server, base))
}

/// Corpus agent `i` as a record, and what the index makes of it (with
/// its f32 profile vector).
fn corpus_prepared(
    src: &[Value],
    i: usize,
    embedder: &crate::index::Embedder,
    analyzer: &crate::index::text::Analyzer,
    weights: &crate::index::Weights,
) -> Result<(crate::domain::AgentRecord, crate::index::search::Prepared), String> {
    let metadata: crate::domain::AgentMetadata =
        serde_json::from_value(corpus_agent(src, i)).map_err(|e| e.to_string())?;
    let record = crate::domain::AgentRecord {
        metadata,
        envelope: Default::default(),
    };
    let vectors = embedder
        .embed_blocking(&crate::index::search::vector_texts(&record))
        .map_err(|e| e.to_string())?;
    let prepared = crate::index::search::prepare(&record, 1, Some(vectors), analyzer, weights, "");
    Ok((record, prepared))
}

/// Writes the corpus and queries for `scripts/bench-peers.py`: LanceDB
/// gets the very profile vectors Agentry uses, the expert peer its own
/// vector per agent from the same model (`bench::peers`).
fn export(
    dir: &Path,
    n: usize,
    qs: &[(String, Option<String>)],
    index: &crate::index::SearchIndex,
) -> Result<(), String> {
    let embedder = index
        .embedder()
        .ok_or("the peers need the embedding model")?;
    let analyzer = crate::index::text::Analyzer::default();
    let src = sources();
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut corpus = Vec::with_capacity(n);
    for i in 0..n {
        let (record, prepared) = corpus_prepared(&src, i, embedder, &analyzer, index.weights())?;
        let mut extra = serde_json::Map::new();
        extra.insert("tags".into(), json!(record.metadata.tags));
        extra.insert("vector".into(), json!(prepared.profile()));
        corpus.push(peers::corpus_line(&record, embedder, extra)?);
    }
    peers::write_lines(&dir.join("corpus.jsonl"), corpus)?;
    let queries = qs
        .iter()
        .map(|(text, tag)| peers::query_line(None, text, tag.as_deref(), embedder))
        .collect::<Result<Vec<_>, _>>()?;
    peers::write_lines(&dir.join("queries.jsonl"), queries)
}

/// Recall of the vector candidates against an exact scan, over (up to)
/// the first thousand queries: of the vector index's, and of a required
/// tag's scan (the queries with a tag).
fn vector_recall(
    index: &crate::index::SearchIndex,
    qs: &[(String, Option<String>)],
    n: usize,
) -> Result<(Vec<crate::index::ProbeRecall>, Vec<crate::index::TagRecall>), String> {
    let Some(embedder) = index.embedder() else {
        return Ok((Vec::new(), Vec::new()));
    };
    let texts: Vec<String> = qs.iter().take(1000).map(|(t, _)| t.clone()).collect();
    let vectors = embedder.embed_blocking(&texts).map_err(|e| e.to_string())?;
    // The truth: every agent's profile in f32, as the index would build it
    // before keeping only its i8 codes.
    let src = sources();
    let analyzer = crate::index::text::Analyzer::default();
    let mut exact = std::collections::HashMap::with_capacity(n);
    for i in 0..n {
        let (record, prepared) = corpus_prepared(&src, i, embedder, &analyzer, index.weights())?;
        if let Some(p) = prepared.profile() {
            exact.insert(record.metadata.id.clone(), p.to_vec());
        }
    }
    let tagged: Vec<(Vec<f32>, String)> = vectors
        .iter()
        .zip(qs)
        .filter_map(|(v, (_, tag))| Some((v.clone(), tag.clone()?)))
        .collect();
    Ok((
        index.vector_recall(&vectors, 10, &exact),
        index.tag_recall(&tagged, 10, &exact),
    ))
}

/// The server-side rows the in-process peers are compared with.
const SERVER_SIDE: &str = "server-side, 1 client";
const SERVER_SIDE_NO_EMBED: &str = "server-side, 1 client, without embedding the query";
/// Queries timed with a filter that admits nothing: each reads every
/// agent's facts, so fewer suffice (and a million agents stay quick).
const NOTHING_ADMITTED_QUERIES: usize = 200;

/// Figures of one corpus size.
pub struct SizeReport {
    pub agents: usize,
    pub load_secs: f64,
    /// A replica consistency check of the loaded node: the whole check,
    /// and the node's hashing of its state within it.
    pub check_ms: u64,
    pub hash_ms: u64,
    pub restart: Restart,
    pub vector_bytes_per_agent: f64,
    pub postings_per_agent: f64,
    pub rss_bytes_per_agent: Option<f64>,
    pub partitions: usize,
    /// Vector candidate recall per probe count (empty when unpartitioned).
    pub recall: Vec<crate::index::ProbeRecall>,
    /// A required tag's scan: recall per rows read.
    pub tag_recall: Vec<crate::index::TagRecall>,
    pub runs: Vec<Measured>,
    /// What `scripts/bench-peers.py` printed (empty without peers).
    pub peers: Vec<Value>,
}

fn rss_bytes() -> Option<u64> {
    rss_of("self")
}

pub(crate) fn config(dir: &Path) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        grpc_addr: "127.0.0.1:0".parse().expect("loopback parses"),
        http_addr: "127.0.0.1:0".parse().expect("loopback parses"),
        raft_addr: "127.0.0.1:0".parse().expect("loopback parses"),
        peer_addr: "127.0.0.1:0".parse().expect("loopback parses"),
        admin_key: Some("bench-admin-key-0000001".into()),
        // Benchmarks measure the engine at full load, not the limiter.
        rate_limits: crate::api::gate::RateLimitConfig {
            enabled: false,
            ..Default::default()
        },
        ..Config::default()
    }
}

pub(crate) fn request<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = "Bearer bench-admin-key-0000001".parse() {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

/// Registers corpus agents `range` over gRPC, `concurrency` at a time.
pub(crate) async fn register_corpus(
    channel: &tonic::transport::Channel,
    src: &[Value],
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<(), String> {
    let registry = RegistryClient::new(channel.clone());
    let results: Vec<Result<(), String>> = stream::iter(range)
        .map(|i| {
            let mut registry = registry.clone();
            async move {
                let metadata =
                    metadata_from_json(corpus_agent(src, i)).map_err(|e| e.to_string())?;
                registry
                    .register(request(pb::RegisterRequest {
                        metadata: Some(metadata),
                        visibility: 0,
                        readers: Vec::new(),
                    }))
                    .await
                    .map_err(|e| e.message().to_string())?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Waits until the node's index holds everything it has applied, and the
/// vector partitions that loading it made due are trained and saved:
/// queries are timed on the index as it then stays, not while a training
/// or a save runs, and a restart finds the partitions on disk.
pub(crate) async fn wait_indexed(service: &crate::service::RegistryService) {
    let reader = service.reader();
    let index = service.index();
    index
        .caught_up(reader, reader.applied_revision(), Duration::from_secs(600))
        .await;
    // The indexer begins a due training or save before it marks the change
    // that made it due indexed, so one is running by now if any is.
    let deadline = Instant::now() + Duration::from_secs(600);
    while index.settling() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The queries sent over gRPC by `clients` concurrent clients.
async fn over_grpc(
    discovery: &DiscoveryClient<tonic::transport::Channel>,
    qs: &[(String, Option<String>)],
    clients: usize,
) -> Result<Measured, String> {
    let wall = Instant::now();
    let lat: Vec<Result<Duration, String>> = stream::iter(qs.iter())
        .map(|(text, tag)| {
            let mut d = discovery.clone();
            async move {
                let t = Instant::now();
                d.discover(request(pb::DiscoverRequest {
                    query: text.clone(),
                    required_tags: tag.iter().cloned().collect(),
                    limit: 10,
                    ..Default::default()
                }))
                .await
                .map_err(|e| e.message().to_string())?;
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(clients.max(1))
        .collect()
        .await;
    let lat = lat.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(measured(
        format!("gRPC loopback, {clients} client(s)"),
        lat,
        wall.elapsed(),
    ))
}

/// A restart of the node in a process of its own (this executable's
/// `serve`), which holds nothing but the node: so its memory is the
/// node's alone, not the load generator's.
pub struct Restart {
    /// From the process's start until its index holds every agent and
    /// it answers discovery.
    pub serving_ms: u64,
    /// The index build from storage within that, as the node reports it.
    pub rebuild_ms: u64,
    /// Resident memory once serving, and after the queries below.
    pub rss_serving: u64,
    pub rss_after_queries: u64,
    /// The queries over gRPC from this process, one client.
    pub grpc: Measured,
}

/// Resident memory of process `pid` (or "self").
fn rss_of(pid: impl std::fmt::Display) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A gauge of the node's `/metrics` page (its first sample).
fn gauge(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// Starts the node stored under `dir` (holding `n` agents) in its own
/// process, times it to serving, and measures it.
async fn restart_in_own_process(
    dir: &Path,
    n: usize,
    qs: &[(String, Option<String>)],
) -> Result<Restart, String> {
    use super::writes::{free_port, Procs};
    let port = || free_port().map_err(|e| e.to_string());
    let (grpc, http, raft) = (port()?, port()?, port()?);
    let config = dir.join("bench-node.toml");
    std::fs::write(&config, "rate_limits = { enabled = false }\n").map_err(|e| e.to_string())?;
    let log = dir.join("bench-node.log");
    let stderr = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let child = std::process::Command::new(exe)
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--raft-addr", &format!("127.0.0.1:{raft}")])
        .args(["--peer-addr", "127.0.0.1:0"])
        .arg("--config")
        .arg(&config)
        .env("AGENTRY_ADMIN_KEY", "bench-admin-key-0000001")
        .env("AGENTRY_LOG", "warn")
        .env_remove("AGENTRY_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id();
    let mut procs = Procs(vec![child]);
    let http_client = reqwest::Client::new();
    let metrics = format!("http://127.0.0.1:{http}/metrics");
    let deadline = started + Duration::from_secs(1800);
    let rebuild_ms = loop {
        if let Some(status) = procs.0[0].try_wait().map_err(|e| e.to_string())? {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the node exited ({status}): {tail}"));
        }
        if Instant::now() > deadline {
            return Err("the restarted node did not index its agents in 30 minutes".into());
        }
        if let Ok(r) = http_client.get(&metrics).send().await {
            let page = r.text().await.unwrap_or_default();
            if gauge(&page, "agentry_discovery_indexed_agents").is_some_and(|a| a as usize >= n) {
                break gauge(&page, "agentry_discovery_last_rebuild_milliseconds").unwrap_or(0.0)
                    as u64;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let discovery = DiscoveryClient::new(channel);
    // Serving: the first discovery is answered.
    over_grpc(&discovery, &qs[..1], 1).await?;
    let serving_ms = started.elapsed().as_millis() as u64;
    let rss_serving = rss_of(pid).unwrap_or(0);
    over_grpc(&discovery, qs, 1).await?;
    let grpc = over_grpc(&discovery, qs, 1).await?;
    let rss_after_queries = rss_of(pid).unwrap_or(0);
    drop(procs);
    Ok(Restart {
        serving_ms,
        rebuild_ms,
        rss_serving,
        rss_after_queries,
        grpc,
    })
}

/// What the server-side queries ask for besides their text and tag.
#[derive(Clone, Copy)]
enum Narrowing<'a> {
    /// ADP discover with these `protocols` (none: any).
    Protocols(&'a [String]),
    /// AIDIP semantic search for one publisher's agents (query `k`: the
    /// corpus's publisher `k`), without the tag.
    Publisher,
}

/// Loads `n` agents into a fresh node under `dir`, then measures.
/// Server-side discovery: the service in-process, one request at a time,
/// after one untimed pass (caches warm, the bulk load's compactions done).
/// The timed pass's latencies, the time each query's embedding took (the
/// query embedded once more on its own, just before the request), and the
/// wall time.
async fn server_side(
    service: &crate::service::RegistryService,
    qs: &[(String, Option<String>)],
    narrowing: Narrowing<'_>,
) -> Result<(Vec<Duration>, Vec<Duration>, Duration), String> {
    let mut lat = Vec::with_capacity(qs.len());
    let mut embed = Vec::with_capacity(qs.len());
    let mut wall = Instant::now();
    let mut wall_embedding = Duration::ZERO;
    for (pass, (text, tag)) in qs.iter().cycle().take(2 * qs.len()).enumerate() {
        if pass == qs.len() {
            lat.clear();
            embed.clear();
            wall = Instant::now();
            wall_embedding = Duration::ZERO;
        }
        let t = Instant::now();
        service.index().query_vector(text).await?;
        let embedding = t.elapsed();
        embed.push(embedding);
        wall_embedding += embedding;
        let t = Instant::now();
        match narrowing {
            Narrowing::Publisher => {
                let filters = crate::domain::filter::HardFilters {
                    publisher: Some(format!("org-{}", (pass % qs.len()) % PUBLISHERS)),
                    ..Default::default()
                };
                let local = crate::service::Consistency::Local;
                service
                    .ranked_search(None, text, filters, 10, 0, local)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Narrowing::Protocols(protocols) => {
                let req = DiscoveryRequest {
                    query: text.clone(),
                    required_tags: tag.iter().cloned().collect(),
                    protocols: protocols.to_vec(),
                    limit: 10,
                    ..Default::default()
                };
                service
                    .discover(None, req)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        lat.push(t.elapsed());
    }
    Ok((lat, embed, wall.elapsed().saturating_sub(wall_embedding)))
}

pub async fn run_size(
    dir: &Path,
    n: usize,
    query_count: usize,
    concurrencies: &[usize],
    peers: &[String],
) -> Result<SizeReport, String> {
    let src = sources();
    let rss_before = rss_bytes();
    let server = crate::server::start(config(dir))
        .await
        .map_err(|e| e.to_string())?;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc_addr))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    register_corpus(&channel, &src, 0..n, 64).await?;
    let service = server.service().clone();
    let reader = service.reader().clone();
    wait_indexed(&service).await;
    // The bulk load leaves a snapshot due; take it now rather than in the
    // middle of the measured queries (a read-only steady state has none).
    server.snapshot_now().await.map_err(|e| e.to_string())?;
    let load_secs = started.elapsed().as_secs_f64();
    let stats = service.index().stats();
    let rss_after = rss_bytes();
    let qs = queries(query_count);
    tracing::info!(agents = n, load_secs, "corpus indexed; measuring queries");

    let mut runs = Vec::new();
    let (lat, embed, wall) = server_side(&service, &qs, Narrowing::Protocols(&[])).await?;
    let without: Vec<Duration> = lat
        .iter()
        .zip(&embed)
        .map(|(l, e)| l.saturating_sub(*e))
        .collect();
    let embedding: Duration = embed.iter().sum();
    runs.push(measured(SERVER_SIDE.into(), lat, wall));
    runs.push(measured(
        SERVER_SIDE_NO_EMBED.into(),
        without,
        wall.saturating_sub(embedding),
    ));
    // Over gRPC on loopback.
    let discovery = DiscoveryClient::new(channel.clone());
    for &c in concurrencies {
        runs.push(over_grpc(&discovery, &qs, c).await?);
    }
    // The same with every agent kept alive by its own lease: what looking
    // up each admitted candidate's lease adds.
    let admin = crate::domain::Principal::new("bench", crate::domain::Role::Admin);
    let mut ids = Vec::with_capacity(n);
    reader
        .scan(|r| ids.push(r.metadata.id))
        .map_err(|e| e.to_string())?;
    let refreshed: Vec<Result<_, String>> = stream::iter(ids.iter())
        .map(|id| {
            let (service, admin) = (service.clone(), admin.clone());
            async move {
                service
                    .refresh_agent(Some(&admin), id, Some(86_400), None)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    refreshed.into_iter().collect::<Result<Vec<_>, _>>()?;
    // As after the load: the refreshes leave a snapshot due, which would
    // otherwise be built during the measured queries.
    server.snapshot_now().await.map_err(|e| e.to_string())?;
    // What a replica consistency check costs at this size (one node: the
    // hashing is what grows with the directory; each member hashes its
    // own at the same time).
    let checked = Instant::now();
    let report = crate::pb::cluster_client::ClusterClient::new(channel)
        .check(request(crate::pb::ClusterCheckRequest {}))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let check_ms = checked.elapsed().as_millis() as u64;
    let hash_ms = report.members.first().map_or(0, |m| m.took_ms);
    if report.outcome != "consistent" {
        return Err(format!("the consistency check said {}", report.outcome));
    }
    let (lat, _, wall) = server_side(&service, &qs, Narrowing::Protocols(&[])).await?;
    runs.push(measured(
        "server-side, 1 client, every agent on a lease".into(),
        lat,
        wall,
    ));
    // A filter that admits no agent (no corpus agent speaks A2A).
    let few = &qs[..qs.len().min(NOTHING_ADMITTED_QUERIES)];
    let a2a = ["a2a".to_string()];
    let (lat, _, wall) = server_side(&service, few, Narrowing::Protocols(&a2a)).await?;
    runs.push(measured(
        "server-side, 1 client, a filter admitting no agent".into(),
        lat,
        wall,
    ));
    // One organisation's agents (AIDIP search by `publisher`): a filter
    // 0.2 % of the directory passes.
    let (lat, _, wall) = server_side(&service, &qs, Narrowing::Publisher).await?;
    runs.push(measured(
        "server-side, 1 client, one publisher's agents (AIDIP search)".into(),
        lat,
        wall,
    ));
    let (recall, tag_recall) = vector_recall(service.index(), &qs, n)?;
    let peer_dir = dir.join("peers");
    let peer_figures = if !peers.is_empty() {
        export(&peer_dir, n, &qs, service.index())?;
        peers::run(&peer_dir, concurrencies, peers::Mode::Time(peers))?
    } else {
        Vec::new()
    };
    let _ = std::fs::remove_dir_all(&peer_dir);
    // Every handle on the database goes before the restart reopens it.
    drop((service, reader, discovery));
    server.shutdown().await;

    // Index build from storage, restart and memory: a restart in a
    // process of its own rebuilds the index from a scan.
    let restart = restart_in_own_process(dir, n, &qs).await?;
    Ok(SizeReport {
        agents: n,
        load_secs,
        check_ms,
        hash_ms,
        restart,
        vector_bytes_per_agent: stats.vector_bytes as f64 / n.max(1) as f64,
        postings_per_agent: stats.postings as f64 / n.max(1) as f64,
        rss_bytes_per_agent: rss_before
            .zip(rss_after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / n.max(1) as f64),
        partitions: stats.partitions,
        recall,
        tag_recall,
        runs,
        peers: peer_figures,
    })
}

/// The printed table.
pub fn report(sizes: &[SizeReport]) -> String {
    let mut out = String::new();
    for s in sizes {
        let r = &s.restart;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        out.push_str(&format!(
            "\n{} agents: loaded through the API in {:.1} s; {} vector partitions\n",
            s.agents, s.load_secs, s.partitions
        ));
        out.push_str(&format!(
            "  restarted in a process of its own: serving after {:.1} s (index built from storage in {:.1} s); RSS {:.0} MiB serving, {:.0} MiB after the queries = {:.0} B per agent\n",
            r.serving_ms as f64 / 1000.0,
            r.rebuild_ms as f64 / 1000.0,
            mib(r.rss_serving),
            mib(r.rss_after_queries),
            r.rss_after_queries as f64 / s.agents.max(1) as f64,
        ));
        out.push_str(&format!(
            "  replica consistency check: {} ms, of which hashing the state {} ms\n",
            s.check_ms, s.hash_ms
        ));
        out.push_str(&format!(
            "  index per agent: vectors {:.0} B, {:.1} postings; RSS growth of the loading process (node and load generator) {}\n",
            s.vector_bytes_per_agent,
            s.postings_per_agent,
            s.rss_bytes_per_agent
                .map_or("n/a".to_string(), |b| format!("{b:.0} B"))
        ));
        for r in &s.recall {
            out.push_str(&format!(
                "  vector candidates probing {} of {} partitions: recall@10 in the top {} {:.3}, scan {:.0} µs\n",
                r.nprobe, r.partitions, r.pool, r.recall, r.scan_us
            ));
        }
        for r in &s.tag_recall {
            let rows = r
                .rows_per_candidate
                .map_or("every row of the tag".to_string(), |p| {
                    format!("the nearest partitions' rows, {p} per candidate")
                });
            out.push_str(&format!(
                "  required tag scanning {rows}: recall@10 in the top {} {:.3}, {:.0} % of the rows read, scan {:.0} µs\n",
                r.pool,
                r.recall,
                100.0 * r.read_share,
                r.scan_us
            ));
        }
        out.push_str("  | run | p50 µs | p99 µs | queries/s |\n  |---|---|---|---|\n");
        for r in &s.runs {
            out.push_str(&format!(
                "  | Agentry {} | {:.0} | {:.0} | {:.0} |\n",
                r.what, r.p50_us, r.p99_us, r.per_second
            ));
        }
        let g = &r.grpc;
        out.push_str(&format!(
            "  | Agentry {}, the node restarted in its own process | {:.0} | {:.0} | {:.0} |\n",
            g.what, g.p50_us, g.p99_us, g.per_second
        ));
        for p in &s.peers {
            if let Some(e) = p.get("error") {
                out.push_str(&format!(
                    "  | {} failed: {e} | | | |\n",
                    p["system"].as_str().unwrap_or("?")
                ));
            } else if let Some(b) = p.get("build_secs") {
                out.push_str(&format!(
                    "  | {} index build {:.1} s | | | |\n",
                    p["system"].as_str().unwrap_or("?"),
                    b.as_f64().unwrap_or(0.0)
                ));
            } else {
                let clients = p["clients"].as_u64().unwrap_or(0);
                let system = p["system"].as_str().unwrap_or("?");
                let times = |ours: Option<&Measured>, against: &str| {
                    ours.map_or(String::new(), |o| {
                        format!(
                            "; Agentry {against} {:.1}× faster at p50, {:.1}× at p99",
                            p["p50_us"].as_f64().unwrap_or(0.0) / o.p50_us.max(1.0),
                            p["p99_us"].as_f64().unwrap_or(0.0) / o.p99_us.max(1.0)
                        )
                    })
                };
                let run = |what: &str| s.runs.iter().find(|r| r.what == what);
                let grpc = format!("gRPC loopback, {clients} client(s)");
                let mut ratio = times(run(&grpc), "over gRPC");
                // The expert peer runs in-process: it is compared with
                // Agentry in-process, with and without the query's embedding
                // (the peer is handed the query's vector).
                if system.starts_with("expert") && clients == 1 {
                    ratio = times(run(SERVER_SIDE), "server-side");
                    ratio.push_str(&times(run(SERVER_SIDE_NO_EMBED), "without embedding"));
                }
                let ratio = if ratio.is_empty() {
                    ratio
                } else {
                    format!(" ({})", ratio.trim_start_matches("; "))
                };
                out.push_str(&format!(
                    "  | {system}, {clients} client(s){ratio} | {:.0} | {:.0} | {:.0} |\n",
                    p["p50_us"].as_f64().unwrap_or(0.0),
                    p["p99_us"].as_f64().unwrap_or(0.0),
                    p["per_second"].as_f64().unwrap_or(0.0)
                ));
            }
        }
    }
    out
}

/// Runs every size in its own directory under `dir`.
pub async fn run(
    dir: &Path,
    sizes: &[usize],
    query_count: usize,
    concurrencies: &[usize],
    peers: &[String],
) -> Result<Vec<SizeReport>, String> {
    let mut out = Vec::new();
    for &n in sizes {
        let d: PathBuf = dir.join(format!("agentry-{n}"));
        out.push(run_size(&d, n, query_count, concurrencies, peers).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_agents_are_valid_distinct_and_deterministic() {
        let src = sources();
        assert_eq!(src.len(), 199);
        let a = corpus_agent(&src, 5);
        assert_eq!(a, corpus_agent(&src, 5));
        assert_ne!(a["id"], corpus_agent(&src, 204)["id"]);
        let m = metadata_from_json(a).unwrap();
        assert_eq!(m.examples.len(), 5);
        let q = queries(4);
        assert!(q[0].1.is_none() && q[1].1.is_some());
    }
}
