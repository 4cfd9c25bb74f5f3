//! `agentry bench writes`: committed registrations per second and commit
//! latency of a 3-node Agentry cluster next to a 3-node etcd cluster, both
//! on loopback, same value size, same client concurrency, same gRPC client
//! stack, in one run. A benchmark prints figures; it asserts nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tonic::transport::Channel;

use crate::convert::metadata_from_json;
use crate::etcd_pb::{
    kv_client::KvClient, maintenance_client::MaintenanceClient, PutRequest, StatusRequest,
};
use crate::pb::{registry_client::RegistryClient, RefreshRequest, RegisterRequest};

use super::write_stages::{self, NodeStages, Sample};

/// Benchmark failures (setup problems; slow results are figures, not errors).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Setup(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

fn setup(e: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(e.to_string())
}

/// Local calls timed per system (`WriteBench::local_calls`).
const LOCAL_CALLS: usize = 2000;

/// What to run.
#[derive(Debug, Clone)]
pub struct WriteBench {
    /// Where the clusters keep their data (deleted afterwards).
    pub dir: PathBuf,
    /// Client concurrencies to measure.
    pub concurrencies: Vec<usize>,
    /// Writes measured per concurrency (at least 20 per client).
    pub writes: usize,
    /// Size of each record / value.
    pub value_bytes: usize,
    /// etcd binary; `None` skips etcd.
    pub etcd: Option<PathBuf>,
    /// Measure refreshes of registered agents instead of registrations.
    pub refresh: Option<RefreshLoad>,
}

/// The refresh run (`--refresh`): `agents` registered first, then refreshed
/// round-robin, at full speed per concurrency and at a steady `rate`.
#[derive(Debug, Clone)]
pub struct RefreshLoad {
    pub agents: usize,
    /// Refreshes per second of the steady run (100k agents every 30 s:
    /// 3,334).
    pub rate: f64,
    pub seconds: u64,
}

/// One measured level.
#[derive(Debug, Clone)]
pub struct Row {
    pub system: &'static str,
    pub clients: usize,
    pub writes: usize,
    pub errors: usize,
    pub per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU the benchmark's own process (the load generator) spent per
    /// write: it shares the machine's cores with the nodes, so a client
    /// that costs more leaves the servers less.
    pub client_cpu_us: f64,
    /// The leader's and one follower's figures over the level. For a
    /// system without metrics (etcd) only CPU and disk writes are known.
    pub nodes: (NodeStages, NodeStages),
    /// The nodes' figures include the stages read from their metrics.
    pub staged: bool,
}

/// A cluster member the benchmark watches: its process and, for Agentry,
/// its HTTP address (for `/metrics`).
struct Member {
    pid: u32,
    http: Option<String>,
}

/// The leader and one follower, read before and after each level.
struct Watched {
    leader: Member,
    follower: Member,
    key: String,
}

impl Watched {
    async fn read(&self, m: &Member) -> Sample {
        match &m.http {
            Some(http) => write_stages::sample(http, &self.key, m.pid).await,
            None => write_stages::cpu_sample(m.pid),
        }
    }

    /// The leader's and the follower's samples, and the CPU time this
    /// process (the clients) has used so far.
    async fn take(&self) -> (Sample, Sample, Duration) {
        (
            self.read(&self.leader).await,
            self.read(&self.follower).await,
            write_stages::cpu_time(std::process::id()).unwrap_or_default(),
        )
    }
}

/// Child processes killed when dropped.
pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn free_port() -> Result<u16, BenchError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, BenchError> {
    Ok(std::fs::File::create(dir.join(format!("{name}.log")))?)
}

/// A ~`bytes`-byte agent record as JSON text.
fn record(id: &str, bytes: usize) -> String {
    let base = json!({
        "id": id,
        "name": "Benchmark agent",
        "description": "",
        "tags": ["benchmark", "writes"],
        "bindings": [{"protocol": "https", "endpoint": format!("https://bench.example/{id}")}],
    })
    .to_string();
    let pad = bytes.saturating_sub(base.len());
    let mut v: serde_json::Value = serde_json::from_str(&base).unwrap_or_default();
    v["description"] = json!("d".repeat(pad));
    v.to_string()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// Runs `total` operations from `clients` concurrent tasks; each operation
/// is timed from send to committed answer.
async fn drive<F, Fut>(clients: usize, total: usize, op: F) -> (Duration, Vec<Duration>, usize)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let t = Instant::now();
                    match op(i).await {
                        Ok(()) => lat.push(t.elapsed()),
                        Err(e) => {
                            if errors == 0 {
                                tracing::warn!(error = %e, "a benchmark write failed");
                            }
                            errors += 1;
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(total);
    let mut errors = 0;
    for t in tasks {
        if let Ok((lat, e)) = t.await {
            all.extend(lat);
            errors += e;
        }
    }
    (start.elapsed(), all, errors)
}

/// The row of a level: its run, and the watched nodes sampled before and
/// after it (`staged`: their samples hold metrics).
fn row(
    system: &'static str,
    clients: usize,
    run: (Duration, Vec<Duration>, usize),
    before: &(Sample, Sample, Duration),
    after: &(Sample, Sample, Duration),
    staged: bool,
) -> Row {
    let (elapsed, mut lat, errors) = run;
    lat.sort();
    let writes = lat.len();
    Row {
        system,
        clients,
        writes,
        errors,
        per_sec: writes as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.50),
        p99_ms: percentile(&lat, 0.99),
        client_cpu_us: after.2.saturating_sub(before.2).as_secs_f64() * 1e6 / writes.max(1) as f64,
        nodes: (
            write_stages::stages(&before.0, &after.0, writes),
            write_stages::stages(&before.1, &after.1, writes),
        ),
        staged,
    }
}

async fn channels(urls: &[String], n: usize) -> Result<Vec<Channel>, BenchError> {
    let mut out = Vec::new();
    for i in 0..n {
        let url = &urls[i % urls.len()];
        out.push(
            Channel::from_shared(url.clone())
                .map_err(setup)?
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| setup(format!("cannot connect to {url}: {e}")))?,
        );
    }
    Ok(out)
}

/// Sends operations at a steady `rate` for `seconds`, each timed from when
/// it was due (so a slow answer delays none of the later ones, and queueing
/// shows in the latency); at most `MAX_OPEN` are outstanding.
async fn paced<F, Fut>(rate: f64, seconds: u64, op: F) -> (Duration, Vec<Duration>, usize)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    const MAX_OPEN: usize = 4096;
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_OPEN));
    let total = (rate * seconds as f64) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        let Ok(permit) = open.clone().acquire_owned().await else {
            break;
        };
        let fut = op(i);
        tasks.push(tokio::spawn(async move {
            let r = fut.await;
            drop(permit);
            r.map(|()| due.elapsed())
        }));
    }
    let mut lat = Vec::with_capacity(total);
    let mut errors = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(d)) => lat.push(d),
            Ok(Err(e)) => {
                if errors == 0 {
                    tracing::warn!(error = %e, "a paced benchmark operation failed");
                }
                errors += 1;
            }
            Err(_) => errors += 1,
        }
    }
    (start.elapsed(), lat, errors)
}

/// Retries `probe` until it succeeds or `timeout` passes.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, probe: F) -> Result<(), BenchError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if probe().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(setup(format!("{what} not ready within {timeout:?}")))
}

impl WriteBench {
    /// Warms up, then measures every concurrency level; `put(prefix)` makes
    /// the operation writing record `i` under a key prefix. The watched
    /// members are read before and after each level.
    async fn measure<P, F, Fut>(&self, system: &'static str, put: P, watched: &Watched) -> Vec<Row>
    where
        P: Fn(String) -> F,
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        drive(8, 200, put("warmup".into())).await;
        let mut rows = Vec::new();
        for &clients in &self.concurrencies {
            let total = self.writes.max(clients * 20);
            let before = watched.take().await;
            let run = drive(clients, total, put(format!("c{clients}"))).await;
            let after = watched.take().await;
            let staged = watched.leader.http.is_some();
            rows.push(row(system, clients, run, &before, &after, staged));
        }
        rows
    }

    /// One client's calls that the leader answers by itself, with no write
    /// and no Raft (Agentry: gRPC health `Check`; etcd: `Maintenance.Status`):
    /// what a round trip through each system's gRPC stack costs here, the
    /// floor under every write's latency. Shown as the `call` row.
    async fn local_calls<F, Fut>(&self, system: &'static str, call: F, watched: &Watched) -> Row
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), String>> + Send,
    {
        let before = watched.take().await;
        let run = drive(1, LOCAL_CALLS, call).await;
        let after = watched.take().await;
        row(system, 0, run, &before, &after, false)
    }

    /// Starts three Agentry nodes (this executable) and measures them.
    async fn agentry(&self) -> Result<Vec<Row>, BenchError> {
        let exe = std::env::current_exe()?;
        let dir = self.dir.join("agentry");
        std::fs::create_dir_all(&dir)?;
        let key = "bench-admin-key-0123456789";
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect::<Result<_, BenchError>>()?;
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{}", i + 1, p.2))
            .collect::<Vec<_>>()
            .join(",");
        // The benchmark measures the write path at full load, not the
        // limiter.
        let config = dir.join("bench.toml");
        std::fs::write(&config, "rate_limits = { enabled = false }\n")?;
        let mut procs = Procs(Vec::new());
        for (i, (grpc, http, raft)) in ports.iter().enumerate() {
            let id = i + 1;
            procs.0.push(
                Command::new(&exe)
                    .arg("serve")
                    .args(["--node-id", &id.to_string()])
                    .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
                    .args(["--http-addr", &format!("127.0.0.1:{http}")])
                    .args(["--raft-addr", &format!("127.0.0.1:{raft}")])
                    .args(["--peer-addr", "127.0.0.1:0"])
                    .args(["--initial-members", &members])
                    .arg("--data-dir")
                    .arg(dir.join(format!("node-{id}")))
                    .env("AGENTRY_ADMIN_KEY", key)
                    .env("AGENTRY_CLUSTER_SECRET", "bench-cluster-secret-0123456789")
                    .arg("--config")
                    .arg(&config)
                    .env(
                        "AGENTRY_LOG",
                        std::env::var("AGENTRY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
                    )
                    .env_remove("AGENTRY_CONFIG")
                    .stdout(Stdio::null())
                    .stderr(log_file(&dir, &format!("node-{id}"))?)
                    .spawn()?,
            );
        }
        // Clients talk to the leader, as etcd clients effectively do.
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{}", p.0))
            .collect();
        let mut leader_url = String::new();
        let mut leader = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while leader_url.is_empty() {
            if Instant::now() > deadline {
                return Err(setup("the Agentry cluster elected no leader in 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Ok(mut c) =
                crate::pb::cluster_client::ClusterClient::connect(urls[0].clone()).await
            {
                if let Ok(s) = c.status(crate::pb::ClusterStatusRequest {}).await {
                    let l = s.into_inner().leader_id;
                    if l != 0 {
                        leader = (l - 1) as usize;
                        leader_url = urls[leader].clone();
                    }
                }
            }
        }
        let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {key}")
            .parse()
            .map_err(|_| setup("bad key"))?;
        let pool = Arc::new(channels(&[leader_url], 16).await?);
        let bytes = self.value_bytes;
        let (put_pool, put_auth) = (pool.clone(), auth.clone());
        let put = move |prefix: String| {
            let (pool, auth) = (put_pool.clone(), put_auth.clone());
            move |i: usize| {
                let channel = pool[i % pool.len()].clone();
                let auth = auth.clone();
                let text = record(&format!("{prefix}-{i}"), bytes);
                async move {
                    let v: serde_json::Value =
                        serde_json::from_str(&text).map_err(|e| e.to_string())?;
                    let metadata = metadata_from_json(v).map_err(|e| e.to_string())?;
                    let mut req = tonic::Request::new(RegisterRequest {
                        metadata: Some(metadata),
                        visibility: 0,
                        readers: Vec::new(),
                    });
                    req.metadata_mut().insert("authorization", auth);
                    RegistryClient::new(channel)
                        .register(req)
                        .await
                        .map(|_| ())
                        .map_err(|s| s.message().to_string())
                }
            }
        };
        let member = |i: usize| Member {
            pid: procs.0[i].id(),
            http: Some(format!("http://127.0.0.1:{}", ports[i].1)),
        };
        let watched = Watched {
            leader: member(leader),
            follower: member((leader + 1) % ports.len()),
            key: key.to_string(),
        };
        let Some(load) = &self.refresh else {
            let mut rows = self.measure("agentry", put, &watched).await;
            let channel = pool[0].clone();
            let check = move |_| {
                let mut health =
                    tonic_health::pb::health_client::HealthClient::new(channel.clone());
                async move {
                    health
                        .check(tonic_health::pb::HealthCheckRequest::default())
                        .await
                        .map(|_| ())
                        .map_err(|s| s.message().to_string())
                }
            };
            rows.push(self.local_calls("agentry", check, &watched).await);
            drop(procs);
            return Ok(rows);
        };
        let agents = load.agents.max(1);
        let (_, registered, errors) = drive(64, agents, put("agent".into())).await;
        if errors > 0 || registered.len() < agents {
            return Err(setup(format!(
                "registering the {agents} agents to refresh failed {errors} times"
            )));
        }
        // Each agent is refreshed on its own (no shared lease): the load of
        // `agents` publishers keeping their records alive.
        let refresh = move |_prefix: String| {
            let (pool, auth) = (pool.clone(), auth.clone());
            move |i: usize| {
                let channel = pool[i % pool.len()].clone();
                let mut req = tonic::Request::new(RefreshRequest {
                    id: format!("agent-{}", i % agents),
                    ttl_seconds: Some(30),
                    lease: None,
                });
                req.metadata_mut().insert("authorization", auth.clone());
                async move {
                    RegistryClient::new(channel)
                        .refresh(req)
                        .await
                        .map(|_| ())
                        .map_err(|s| s.message().to_string())
                }
            }
        };
        let mut rows = self.measure("refresh", &refresh, &watched).await;
        let before = watched.take().await;
        let run = paced(load.rate, load.seconds, refresh("paced".into())).await;
        let after = watched.take().await;
        rows.push(row("paced", 0, run, &before, &after, true));
        drop(procs);
        Ok(rows)
    }

    /// Starts three etcd members and measures them.
    async fn etcd(&self, bin: &Path) -> Result<Vec<Row>, BenchError> {
        let dir = self.dir.join("etcd");
        std::fs::create_dir_all(&dir)?;
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, BenchError>>()?;
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("e{}=http://127.0.0.1:{}", i + 1, p.1))
            .collect::<Vec<_>>()
            .join(",");
        let mut procs = Procs(Vec::new());
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("e{}", i + 1);
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            procs.0.push(
                Command::new(bin)
                    .args(["--name", &name])
                    .arg("--data-dir")
                    .arg(dir.join(&name))
                    .args(["--listen-client-urls", &client_url])
                    .args(["--advertise-client-urls", &client_url])
                    .args(["--listen-peer-urls", &peer_url])
                    .args(["--initial-advertise-peer-urls", &peer_url])
                    .args(["--initial-cluster", &cluster])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", "agentry-bench"])
                    .args(["--log-level", "warn"])
                    .stdout(Stdio::null())
                    .stderr(log_file(&dir, &name)?)
                    .spawn()
                    .map_err(|e| setup(format!("cannot start {}: {e}", bin.display())))?,
            );
        }
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{}", p.0))
            .collect();
        let probe_url = urls[0].clone();
        wait_until("etcd", Duration::from_secs(30), || {
            let url = probe_url.clone();
            async move {
                match KvClient::connect(url).await {
                    Ok(mut c) => c
                        .put(PutRequest {
                            key: b"probe".to_vec(),
                            value: b"1".to_vec(),
                        })
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await?;
        // Talk to the leader, like the Agentry clients.
        let leader = self.etcd_leader(&urls).await.unwrap_or(0);
        let pool = Arc::new(channels(&[urls[leader].clone()], 16).await?);
        let bytes = self.value_bytes;
        let put_pool = pool.clone();
        let put = move |prefix: String| {
            let pool = put_pool.clone();
            move |i: usize| {
                let channel = pool[i % pool.len()].clone();
                let id = format!("{prefix}-{i}");
                let value = record(&id, bytes).into_bytes();
                async move {
                    KvClient::new(channel)
                        .put(PutRequest {
                            key: id.into_bytes(),
                            value,
                        })
                        .await
                        .map(|_| ())
                        .map_err(|s| s.message().to_string())
                }
            }
        };
        let member = |i: usize| Member {
            pid: procs.0[i].id(),
            http: None,
        };
        let watched = Watched {
            leader: member(leader),
            follower: member((leader + 1) % ports.len()),
            key: String::new(),
        };
        let channel = pool[0].clone();
        let mut rows = self.measure("etcd", put, &watched).await;
        let status = move |_| {
            let mut maintenance = MaintenanceClient::new(channel.clone());
            async move {
                maintenance
                    .status(StatusRequest {})
                    .await
                    .map(|_| ())
                    .map_err(|s| s.message().to_string())
            }
        };
        rows.push(self.local_calls("etcd", status, &watched).await);
        drop(procs);
        Ok(rows)
    }

    /// The index of the etcd member that leads (etcd's Maintenance.Status).
    async fn etcd_leader(&self, urls: &[String]) -> Option<usize> {
        for (i, url) in urls.iter().enumerate() {
            let mut c = MaintenanceClient::connect(url.clone()).await.ok()?;
            let s = c.status(StatusRequest {}).await.ok()?.into_inner();
            if s.header.is_some_and(|h| h.member_id == s.leader) {
                return Some(i);
            }
        }
        None
    }

    /// Runs both systems and returns every row.
    pub async fn run(&self) -> Result<Vec<Row>, BenchError> {
        let mut rows = self.agentry().await?;
        if let (Some(bin), None) = (&self.etcd, &self.refresh) {
            rows.extend(self.etcd(bin).await?);
        }
        Ok(rows)
    }
}

/// Whether `r` is a system's `call` row (`WriteBench::local_calls`), not a
/// level of writes; the paced refresh row has no concurrency either.
fn is_local_call(r: &Row) -> bool {
    r.clients == 0 && r.system != "paced"
}

/// The table the command prints.
pub fn report(rows: &[Row], value_bytes: usize) -> String {
    let mut out = format!(
        "3-node clusters on loopback, {value_bytes}-byte records, fsync on, gRPC clients talking to the leader\n\
         {:<8} {:>7} {:>7} {:>6} {:>10} {:>8} {:>8} {:>12} {:>12} {:>12} {:>14} {:>12}\n",
        "system",
        "clients",
        "writes",
        "errors",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "leader CPU",
        "follower CPU",
        "leader disk",
        "follower disk",
        "client CPU"
    );
    for r in rows {
        let clients = match r.system {
            "paced" => "steady".to_string(),
            _ if is_local_call(r) => "call".to_string(),
            _ => r.clients.to_string(),
        };
        out.push_str(&format!(
            "{:<8} {:>7} {:>7} {:>6} {:>10.1} {:>8.2} {:>8.2} {:>9.0} µs {:>9.0} µs {:>9.1} KB {:>11.1} KB {:>9.0} µs\n",
            r.system,
            clients,
            r.writes,
            r.errors,
            r.per_sec,
            r.p50_ms,
            r.p99_ms,
            r.nodes.0.cpu_us,
            r.nodes.1.cpu_us,
            r.nodes.0.disk_bytes / 1e3,
            r.nodes.1.disk_bytes / 1e3,
            r.client_cpu_us
        ));
    }
    for a in rows.iter().filter(|r| r.system == "agentry") {
        if let Some(e) = rows
            .iter()
            .find(|r| r.system == "etcd" && r.clients == a.clients)
        {
            if is_local_call(a) {
                out.push_str(&format!(
                    "local call (no write, no Raft): agentry p50 {:.0} µs, etcd p50 {:.0} µs\n",
                    a.p50_ms * 1e3,
                    e.p50_ms * 1e3,
                ));
                continue;
            }
            out.push_str(&format!(
                "clients {:>3}: agentry/etcd throughput {:.2}x, p50 latency {:.2}x, p99 latency {:.2}x\n",
                a.clients,
                a.per_sec / e.per_sec.max(f64::MIN_POSITIVE),
                a.p50_ms / e.p50_ms.max(f64::MIN_POSITIVE),
                a.p99_ms / e.p99_ms.max(f64::MIN_POSITIVE),
            ));
        }
    }
    if rows.iter().any(is_local_call) {
        out.push_str(&format!(
            "call: {LOCAL_CALLS} calls one after another that the leader answers by itself \
             (Agentry: gRPC health Check; etcd: Maintenance.Status), the gRPC round trip under every write\n"
        ));
    }
    if rows.iter().any(|r| r.system == "refresh") {
        out.push_str(
            "refresh: registered agents each refreshed on its own (TTL 30 s), no record sent; \
             steady: a fixed rate, each refresh timed from when it was due\n",
        );
    }
    for r in rows {
        if r.staged {
            out.push_str(&write_stages::render(r.clients, &r.nodes.0, &r.nodes.1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(system: &'static str, clients: usize, per_sec: f64, p50_ms: f64) -> Row {
        Row {
            system,
            clients,
            writes: 100,
            errors: 0,
            per_sec,
            p50_ms,
            p99_ms: p50_ms * 2.0,
            client_cpu_us: 0.0,
            nodes: Default::default(),
            staged: false,
        }
    }

    #[test]
    fn local_calls_are_their_own_row_and_get_no_throughput_ratio() {
        let rows = [
            level("agentry", 1, 600.0, 1.6),
            level("agentry", 0, 6000.0, 0.157),
            level("etcd", 1, 1000.0, 1.0),
            level("etcd", 0, 4000.0, 0.212),
        ];
        let out = report(&rows, 2048);
        assert!(
            out.contains("clients   1: agentry/etcd throughput 0.60x"),
            "{out}"
        );
        assert!(!out.contains("clients   0"), "{out}");
        assert!(
            out.contains("local call (no write, no Raft): agentry p50 157 µs, etcd p50 212 µs"),
            "{out}"
        );
        let calls: Vec<&str> = out
            .lines()
            .filter(|l| {
                let mut cells = l.split_whitespace();
                matches!(cells.next(), Some("agentry" | "etcd")) && cells.next() == Some("call")
            })
            .collect();
        assert_eq!(calls.len(), 2, "{out}");
    }

    #[test]
    fn records_have_the_requested_size_and_percentiles_pick_ranks() {
        let r = record("bench-1", 2048);
        assert_eq!(r.len(), 2048);
        assert!(metadata_from_json(serde_json::from_str(&r).unwrap()).is_ok());
        let lat: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&lat, 0.5), 51.0);
        assert_eq!(percentile(&lat, 0.99), 99.0);
    }
}
