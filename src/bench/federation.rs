//! What federated discovery costs over local discovery: three registries in
//! one process (a.example asks b.example and c.example over their peer
//! listeners on loopback), the same queries at scope local and federated,
//! alternating, over gRPC.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};

use super::discover::{
    config, measured, queries, register_corpus, request, sources, wait_indexed, Measured,
};
use crate::config::PeerConfig;
use crate::pb::{self, discovery_client::DiscoveryClient};
use crate::server::RunningServer;

/// The figures of one run.
pub struct FederationReport {
    pub agents_per_registry: usize,
    /// Federated queries whose peer records were not seen before.
    pub cold: Measured,
    pub runs: Vec<(usize, Measured, Measured)>,
}

async fn channel(addr: std::net::SocketAddr) -> Result<tonic::transport::Channel, String> {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// Registers `n` corpus agents (starting at `offset`) and waits until the
/// registry has indexed them and published its keys.
async fn load(server: &RunningServer, n: usize, offset: usize) -> Result<String, String> {
    register_corpus(
        &channel(server.grpc_addr).await?,
        &sources(),
        offset..offset + n,
        32,
    )
    .await?;
    wait_indexed(server.service()).await;
    server.snapshot_now().await.map_err(|e| e.to_string())?;
    for _ in 0..200 {
        if let Some(identity) = server.service().reader().identity() {
            let key = identity
                .keys
                .iter()
                .find(|k| k.key_id == identity.signing_key)
                .map(|k| k.public_key.clone())
                .ok_or("no signing key")?;
            return Ok(key);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the registry never established its identity".into())
}

/// Runs the benchmark with `n` agents in each of the three registries.
pub async fn run(
    dir: &Path,
    n: usize,
    query_count: usize,
    concurrencies: &[usize],
) -> Result<FederationReport, String> {
    let start = |name: &str, peers: Vec<PeerConfig>| {
        let mut c = config(&dir.join(name));
        c.identity.authority = Some(name.to_string());
        c.federation.peers = peers;
        crate::server::start(c)
    };
    let b = start("b.example", Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let c = start("c.example", Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let b_key = load(&b, n, n).await?;
    let c_key = load(&c, n, 2 * n).await?;
    let peer = |authority: &str, server: &RunningServer, key: String| PeerConfig {
        keys: vec![key],
        ..PeerConfig::new(authority, &format!("http://{}", server.peer_addr))
    };
    let a = start(
        "a.example",
        vec![peer("b.example", &b, b_key), peer("c.example", &c, c_key)],
    )
    .await
    .map_err(|e| e.to_string())?;
    load(&a, n, 0).await?;
    let discovery = DiscoveryClient::new(channel(a.grpc_addr).await?);
    let qs = queries(query_count);
    let ask = |scope: &'static str, k: usize| {
        let mut client = discovery.clone();
        let (text, tag) = qs[k % qs.len()].clone();
        async move {
            let started = Instant::now();
            let resp = client
                .discover(request(pb::DiscoverRequest {
                    query: text,
                    required_tags: tag.into_iter().collect(),
                    limit: 10,
                    scope: scope.into(),
                    ..Default::default()
                }))
                .await
                .map_err(|e| e.message().to_string())?
                .into_inner();
            if scope == "federated" && !resp.warnings.iter().all(|w| !w.starts_with("peer ")) {
                return Err(format!("a peer failed: {:?}", resp.warnings));
            }
            Ok::<_, String>(started.elapsed())
        }
    };
    // Connections up, then a first federated pass over queries not asked
    // before: every peer record in it is new to the pool's vector cache.
    ask("local", 0).await?;
    ask("federated", 0).await?;
    let cold_n = qs.len().min(200);
    let started = Instant::now();
    let mut cold = Vec::with_capacity(cold_n);
    for k in 1..=cold_n {
        cold.push(ask("federated", k).await?);
    }
    let cold = measured(
        "federated, first pass, 1 client".into(),
        cold,
        started.elapsed(),
    );
    // One untimed pass of each scope warms caches.
    for k in 0..qs.len() {
        ask("local", k).await?;
        ask("federated", k).await?;
    }
    let mut runs = Vec::new();
    for &clients in concurrencies {
        let mut out = Vec::new();
        for scope in ["local", "federated"] {
            let started = Instant::now();
            let lat: Vec<Result<Duration, String>> = stream::iter(0..qs.len())
                .map(|k| ask(scope, k))
                .buffer_unordered(clients.max(1))
                .collect()
                .await;
            let lat = lat.into_iter().collect::<Result<Vec<_>, _>>()?;
            out.push(measured(
                format!("{scope}, {clients} client(s)"),
                lat,
                started.elapsed(),
            ));
        }
        let federated = out.pop().ok_or("no run")?;
        let local = out.pop().ok_or("no run")?;
        runs.push((clients, local, federated));
    }
    for s in [a, b, c] {
        s.shutdown().await;
    }
    Ok(FederationReport {
        agents_per_registry: n,
        cold,
        runs,
    })
}

pub fn report(r: &FederationReport) -> String {
    let mut out = format!(
        "Federated discovery overhead: a.example asks b.example and c.example (peer listeners on loopback, one process, {} agents each), gRPC Discover at a.example, limit 10\n\n",
        r.agents_per_registry
    );
    out.push_str("| clients | local p50 | local p99 | federated p50 | federated p99 | added p50 | added p99 | federated q/s |\n|---|---|---|---|---|---|---|---|\n");
    let ms = |us: f64| format!("{:.2} ms", us / 1000.0);
    for (clients, local, fed) in &r.runs {
        out.push_str(&format!(
            "| {clients} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            ms(local.p50_us),
            ms(local.p99_us),
            ms(fed.p50_us),
            ms(fed.p99_us),
            ms(fed.p50_us - local.p50_us),
            ms(fed.p99_us - local.p99_us),
            fed.per_second
        ));
    }
    out.push_str(&format!(
        "\nFirst pass (peer records not yet in the pool's vector cache), 1 client: federated p50 {}, p99 {}\n",
        ms(r.cold.p50_us),
        ms(r.cold.p99_us)
    ));
    out
}
