//! What the trust boundary costs: discover and register through the HTTP
//! facade over plain text and TLS, with an API key and with a JWT (EdDSA,
//! checked against a JWKS file), all in one run, each with one keep-alive
//! client. Certificates and the token key are made with the `openssl`
//! command (scripts/setup.sh installs it).

use std::path::Path;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use serde_json::json;

use super::discover::{config, measured, Measured};

const ADMIN: &str = "bench-admin-key-0000001";
const ISSUER: &str = "https://id.bench.test";

/// One (transport, credential) pair's figures, with the CPU time this
/// process (server and clients together) spent per request: unlike
/// throughput on a shared 2-core machine, it does not depend on how the
/// scheduler interleaved them.
pub struct TrustRow {
    pub transport: &'static str,
    pub credential: &'static str,
    pub discover: Measured,
    pub discover_cpu_us: f64,
    pub register: Measured,
    pub register_cpu_us: f64,
}

/// Waits until the node has indexed everything it applied, then returns
/// the CPU the process burns idle (timers, Raft heartbeats), in µs per
/// second of wall time, to subtract from each measured phase.
async fn settle(server: &crate::server::RunningServer) -> f64 {
    crate::bench::discover::wait_indexed(server.service()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (start, cpu) = (std::time::Instant::now(), cpu_us());
    tokio::time::sleep(Duration::from_secs(1)).await;
    (cpu_us() - cpu) / start.elapsed().as_secs_f64()
}

/// CPU µs per request since (`start`, `cpu`), less the idle rate.
fn per_request(start: std::time::Instant, cpu: f64, idle: f64, requests: usize) -> f64 {
    let busy = cpu_us() - cpu - idle * start.elapsed().as_secs_f64();
    busy.max(0.0) / requests as f64
}

/// This process's user + system CPU time, in microseconds (Linux).
fn cpu_us() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The fields after the command name (which may hold spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 here.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // 100 clock ticks per second on Linux.
    (ticks(11) + ticks(12)) * 10_000.0
}

pub struct TrustReport {
    pub requests: usize,
    pub clients: usize,
    pub rows: Vec<TrustRow>,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("openssl (scripts/setup.sh installs it): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// A CA, a server certificate for 127.0.0.1, an Ed25519 token key and its
/// JWKS file.
fn material(d: &Path) -> Result<String, String> {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=bench-ca",
    ]);
    openssl(d, &ca)?;
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(d, &csr)?;
    std::fs::write(d.join("server.ext"), "subjectAltName=IP:127.0.0.1\n")
        .map_err(|e| e.to_string())?;
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
    )?;
    openssl(
        d,
        &["genpkey", "-algorithm", "ed25519", "-out", "token.pem"],
    )?;
    openssl(
        d,
        &[
            "pkey",
            "-in",
            "token.pem",
            "-pubout",
            "-outform",
            "DER",
            "-out",
            "token.der",
        ],
    )?;
    let der = std::fs::read(d.join("token.der")).map_err(|e| e.to_string())?;
    let public = der.get(der.len().saturating_sub(32)..).unwrap_or_default();
    use base64::Engine;
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public);
    let jwks = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "bench", "x": x}]});
    std::fs::write(d.join("jwks.json"), jwks.to_string()).map_err(|e| e.to_string())?;
    let key = jsonwebtoken::EncodingKey::from_ed_pem(
        &std::fs::read(d.join("token.pem")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    header.kid = Some("bench".into());
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &header,
        &json!({"iss": ISSUER, "aud": "agentry", "sub": "bench-publisher", "exp": exp,
                "role": "admin"}),
        &key,
    )
    .map_err(|e| e.to_string())
}

/// Runs `requests` discover and register calls per pair at `clients`
/// concurrency.
pub async fn run(dir: &Path, requests: usize, clients: usize) -> Result<TrustReport, String> {
    let token = material(dir)?;
    let mut rows = Vec::new();
    for tls in [false, true] {
        let data = dir.join(if tls { "tls" } else { "plain" });
        let mut c = config(&data);
        c.jwt = Some(crate::api::jwt::JwtConfig {
            issuer: ISSUER.into(),
            audiences: vec!["agentry".into()],
            jwks_file: Some(dir.join("jwks.json")),
            jwks_url: None,
            principal_claim: "sub".into(),
            role_claim: Some("role".into()),
            default_role: crate::domain::Role::Reader,
            tenant_claim: None,
            leeway_secs: 30,
            jwks_min_refresh_secs: 30,
        });
        if tls {
            c.tls = Some(crate::listener::TlsConfig {
                cert_file: dir.join("server.pem"),
                key_file: dir.join("server.key"),
                client_ca_file: None,
            });
        }
        let server = crate::server::start(c).await.map_err(|e| e.to_string())?;
        crate::demo::load(server.service().clone()).await;
        let scheme = if tls { "https" } else { "http" };
        let base = format!("{scheme}://{}", server.http_addr);
        let ca = reqwest::Certificate::from_pem(
            &std::fs::read(dir.join("ca.pem")).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        // One keep-alive client per credential: connections are set up
        // once. Every discover run comes before any register run, so all
        // search the same corpus.
        let credentials = [("API key", ADMIN), ("JWT (EdDSA)", token.as_str())];
        let clients_for = credentials
            .iter()
            .map(|_| {
                reqwest::Client::builder()
                    .tcp_nodelay(true)
                    .pool_max_idle_per_host(1024)
                    .add_root_certificate(ca.clone())
                    .build()
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut discovers = Vec::new();
        for ((credential, secret), client) in credentials.iter().zip(&clients_for) {
            let discover = |k: usize| {
                let req = client
                    .post(format!("{base}/discover"))
                    .bearer_auth(secret)
                    .json(&json!({"query": format!("find the weather forecast for city {}", k % 50), "limit": 5}));
                timed(req)
            };
            for k in 0..100 {
                discover(k).await?;
            }
            let idle = settle(&server).await;
            let (start, cpu) = (std::time::Instant::now(), cpu_us());
            let d = measure(
                format!("discover {scheme} {credential}"),
                requests,
                clients,
                discover,
            )
            .await?;
            discovers.push((d, per_request(start, cpu, idle, requests)));
        }
        for (i, (((credential, secret), client), (d, d_cpu))) in credentials
            .iter()
            .zip(&clients_for)
            .zip(discovers)
            .enumerate()
        {
            let register = |k: usize| {
                let req = client.post(format!("{base}/agents")).bearer_auth(secret).json(&json!({
                    "id": format!("bench-{scheme}-{i}-{k}"),
                    "name": "Bench agent",
                    "description": "Registered by the trust benchmark.",
                    "bindings": [{"protocol": "https", "endpoint": format!("https://bench.example/{k}")}]
                }));
                timed(req)
            };
            let idle = settle(&server).await;
            let (start, cpu) = (std::time::Instant::now(), cpu_us());
            let r = measure(
                format!("register {scheme} {credential}"),
                requests,
                clients,
                register,
            )
            .await?;
            // Indexing follows the writes asynchronously: its CPU is part
            // of what a write costs.
            crate::bench::discover::wait_indexed(server.service()).await;
            let register_cpu_us = per_request(start, cpu, idle, requests);
            rows.push(TrustRow {
                transport: if tls { "TLS 1.3" } else { "plain" },
                credential,
                discover: d,
                discover_cpu_us: d_cpu,
                register: r,
                register_cpu_us,
            });
        }
        server.shutdown().await;
    }
    Ok(TrustReport {
        requests,
        clients,
        rows,
    })
}

async fn timed(req: reqwest::RequestBuilder) -> Result<Duration, String> {
    let started = Instant::now();
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    Ok(started.elapsed())
}

async fn measure<F, Fut>(
    what: String,
    n: usize,
    clients: usize,
    call: F,
) -> Result<Measured, String>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, String>>,
{
    let started = Instant::now();
    let lat: Vec<Result<Duration, String>> = stream::iter(0..n)
        .map(call)
        .buffer_unordered(clients.max(1))
        .collect()
        .await;
    let lat = lat.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(measured(what, lat, started.elapsed()))
}

pub fn report(r: &TrustReport) -> String {
    let mut out = format!(
        "Cost of TLS and token checks: {} requests per figure, {} concurrent keep-alive clients, HTTP facade on loopback\n\n",
        r.requests, r.clients
    );
    out.push_str("| transport | credential | discover p50 | discover p99 | discover/s | discover CPU/req | register p50 | register p99 | register/s | register CPU/req | discover CPU vs plain+key | register CPU vs plain+key |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let ms = |us: f64| format!("{:.3} ms", us / 1000.0);
    let base = r.rows.first();
    let rel = |x: f64, b: f64| format!("{:+.1} %", (x / b.max(1e-9) - 1.0) * 100.0);
    for row in &r.rows {
        let (d_rel, r_rel) = base.map_or((String::new(), String::new()), |b| {
            (
                rel(row.discover_cpu_us, b.discover_cpu_us),
                rel(row.register_cpu_us, b.register_cpu_us),
            )
        });
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.0} | {:.0} µs | {} | {} | {:.0} | {:.0} µs | {d_rel} | {r_rel} |\n",
            row.transport,
            row.credential,
            ms(row.discover.p50_us),
            ms(row.discover.p99_us),
            row.discover.per_second,
            row.discover_cpu_us,
            ms(row.register.p50_us),
            ms(row.register.p99_us),
            row.register.per_second,
            row.register_cpu_us,
        ));
    }
    out
}
