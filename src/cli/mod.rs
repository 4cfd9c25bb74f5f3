//! Command line: `agentry serve` and the client commands, which talk to the
//! public gRPC API like any other client.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use serde_json::Value;
use tonic::transport::Channel;

use crate::api::error::detail_of;
use crate::config::Config;
use crate::convert::{metadata_from_json, record_pb_to_json, status_to_pb};
use crate::domain::AgentStatus;
use crate::pb::{self, discovery_client::DiscoveryClient, registry_client::RegistryClient};

/// Prints a line to stdout. A closed pipe (`agentry agents list | head`)
/// ends the program quietly instead of panicking, as Unix tools do.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            std::process::exit(if e.kind() == std::io::ErrorKind::BrokenPipe { 141 } else { 1 });
        }
    }};
}

mod cluster;
mod eval;
mod health;
mod keys;
mod snapshot;

pub use cluster::{run_cluster, ClusterArgs};
pub use eval::{run_eval, EvalArgs};
pub use health::{run_health, HealthArgs};
pub use keys::{run_keys, run_verify, KeysArgs, VerifyArgs};
pub use snapshot::{run_snapshot, SnapshotArgs};

#[derive(Debug, Parser)]
#[command(
    name = "agentry",
    version,
    about = "A federated registry cluster for AI agents"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "agentry=debug".
    /// openraft's own info lines (its whole state on start) are left out
    /// unless asked for, e.g. "info,openraft=info".
    #[arg(
        long,
        env = "AGENTRY_LOG",
        default_value = DEFAULT_LOG,
        global = true
    )]
    pub log: String,
    /// Log format: text or json.
    #[arg(
        long,
        env = "AGENTRY_LOG_FORMAT",
        default_value = "text",
        value_parser = ["text", "json"],
        global = true
    )]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

/// The default log filter: Agentry's info lines, openraft's warnings.
pub const DEFAULT_LOG: &str = "info,openraft=warn,rmcp=warn";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a registry node.
    Serve(Box<ServeArgs>),
    /// Manage agent records on a running registry.
    Agents(AgentsArgs),
    /// Cluster status, bootstrap and membership.
    Cluster(ClusterArgs),
    /// Benchmarks that print their figures.
    Bench(BenchArgs),
    /// Retrieval quality of a running registry on a labelled set.
    Eval(EvalArgs),
    /// The registry's signing keys: make a key file, list, rotate, retire,
    /// revoke.
    Keys(KeysArgs),
    /// Check a record's registry signature offline.
    Verify(VerifyArgs),
    /// Import agents from a Web of Agents host, an A2A Agent Card, an
    /// Agent Protocol agent's describe URL or a host's AI Catalog.
    Import(ImportArgs),
    /// The audit trail: who tried which write or admin action (admins).
    Audit(AuditArgs),
    /// Backups: save one online from any node, check one, restore one
    /// into a new node's data directory.
    Snapshot(SnapshotArgs),
    /// Probe this node's /healthz (or /readyz): exit 0 when it answers 200
    /// (a container HEALTHCHECK without curl).
    Health(HealthArgs),
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only this principal (NAME or TENANT/NAME).
    #[arg(long)]
    pub principal: Option<String>,
    /// Only this agent id, key id or node id.
    #[arg(long = "id")]
    pub target: Option<String>,
    /// Only this operation (register, delete, cluster.promote, ...).
    #[arg(long)]
    pub operation: Option<String>,
    /// Only this outcome (ok, forbidden, unauthorized, ...).
    #[arg(long)]
    pub outcome: Option<String>,
    /// RFC 3339: entries at or after this time.
    #[arg(long)]
    pub since: Option<String>,
    /// RFC 3339: entries before this time.
    #[arg(long)]
    pub until: Option<String>,
    /// Stop after this many entries (all pages are read up to it).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

/// Prints the audit trail, oldest first, one entry per line (`--json`:
/// one JSON object per line).
pub async fn run_audit(args: AuditArgs) -> Result<(), CliError> {
    let (_, channel) = args.client.connect(0).await?;
    let mut client = crate::pb::cluster_client::ClusterClient::new(channel);
    let text = |o: &Option<String>| o.clone().unwrap_or_default();
    let (mut token, mut printed) = (String::new(), 0usize);
    loop {
        let page = client
            .list_audit(args.client.request(pb::ListAuditRequest {
                principal: text(&args.principal),
                target: text(&args.target),
                operation: text(&args.operation),
                outcome: text(&args.outcome),
                since: text(&args.since),
                until: text(&args.until),
                page_size: u32::try_from(args.limit.min(1000)).unwrap_or(1000),
                page_token: token.clone(),
            })?)
            .await?
            .into_inner();
        for e in &page.entries {
            if printed >= args.limit {
                return Ok(());
            }
            printed += 1;
            if args.client.json {
                out!("{}", crate::convert::audit_pb_to_json(e));
            } else {
                let who = if e.principal.is_empty() {
                    "-"
                } else {
                    &e.principal
                };
                let revision = e.revision.map(|r| format!(" rev {r}")).unwrap_or_default();
                let node = e.node.map(|n| format!(" (node {n})")).unwrap_or_default();
                out!(
                    "{} {who} {} {} {} {}{revision}{node} [{}]",
                    e.at,
                    e.address,
                    e.operation,
                    if e.target.is_empty() { "-" } else { &e.target },
                    e.outcome,
                    e.correlation_id
                );
            }
        }
        if page.next_page_token.is_empty() {
            return Ok(());
        }
        token = page.next_page_token;
    }
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// woa, a2a, agent-protocol or ai-catalog.
    pub format: String,
    /// The host (its well-known document is read), the document's URL, or
    /// the AP agent's describe URL.
    pub url: String,
}

/// Imports agents through the registry (which fetches the source through
/// its outbound guard) and prints what happened to each.
pub async fn run_import(args: ImportArgs) -> Result<(), CliError> {
    let (_, channel) = args.client.connect(0).await?;
    let mut client = crate::pb::gateway_client::GatewayClient::new(channel);
    let r = client
        .import(args.client.request(pb::ImportRequest {
            format: args.format.clone(),
            url: args.url.clone(),
        })?)
        .await?
        .into_inner();
    if args.client.json {
        let problem = |p: &pb::ImportProblem| serde_json::json!({"agent_id": p.agent_id, "transport": p.transport, "reason": p.reason});
        out!(
            "{}",
            serde_json::json!({
                "url": r.url,
                "not_modified": r.not_modified,
                "agents": r.agents.iter().map(|a| serde_json::json!({"id": a.id, "outcome": a.outcome})).collect::<Vec<_>>(),
                "skipped": r.skipped.iter().map(problem).collect::<Vec<_>>(),
                "unsupported_transports": r.unsupported_transports.iter().map(problem).collect::<Vec<_>>(),
                "registries": r.registries.iter().map(|g| serde_json::json!({"identifier": g.identifier, "display_name": g.display_name, "url": g.url})).collect::<Vec<_>>(),
            })
        );
        return Ok(());
    }
    out!("{}", r.url);
    for a in &r.agents {
        out!("  {:<10} {}", a.outcome, a.id);
    }
    for p in &r.skipped {
        out!("  {:<10} {}: {}", "skipped", p.agent_id, p.reason);
    }
    for p in &r.unsupported_transports {
        out!(
            "  {:<10} {} {}: {}",
            "unsupported",
            p.agent_id,
            p.transport,
            p.reason
        );
    }
    for g in &r.registries {
        out!("  {:<10} {} {}", "registry", g.identifier, g.url);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Committed writes per second and commit latency of a 3-node cluster,
    /// side by side with a 3-node etcd cluster, both on loopback.
    Writes {
        /// Client concurrencies, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 128])]
        clients: Vec<usize>,
        /// Writes measured per concurrency (at least 20 per client).
        #[arg(long, default_value_t = 2000)]
        writes: usize,
        /// Record / value size in bytes.
        #[arg(long, default_value_t = 2048)]
        value_bytes: usize,
        /// etcd binary (Debian: apt-get install etcd-server).
        #[arg(long, default_value = "etcd")]
        etcd: String,
        /// Measure Agentry only.
        #[arg(long)]
        no_etcd: bool,
        /// Measure refreshes (`POST /agents/{id}/refresh`) of registered
        /// agents instead of registrations: at full speed per concurrency,
        /// then at a steady --rate (Agentry only).
        #[arg(long)]
        refresh: bool,
        /// Refresh run: agents registered first and refreshed round-robin.
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// Refresh run: refreshes per second of the steady part (100k
        /// agents every 30 s).
        #[arg(long, default_value_t = 3334.0)]
        rate: f64,
        /// Refresh run: seconds of the steady part.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Working directory for the clusters' data (default: a temporary
        /// directory, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Discovery latency and throughput at 10k and 100k agents (server-side
    /// and over gRPC with 1 and 16 clients), index build time and memory.
    Discover {
        /// Corpus sizes, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 100_000])]
        agents: Vec<usize>,
        /// Queries per measured run.
        #[arg(long, default_value_t = 2000)]
        queries: usize,
        /// Client concurrencies over gRPC, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
        clients: Vec<usize>,
        /// Working directory (default: a temporary directory, removed).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Measure Agentry only (no peers).
        #[arg(long)]
        no_peers: bool,
        /// The peers to time beside Agentry, comma-separated: postgres,
        /// lancedb, expert (tantivy + usearch + RRF).
        #[arg(
            long,
            value_delimiter = ',',
            value_parser = ["postgres", "lancedb", "expert"],
            default_values_t = ["postgres".to_string(), "lancedb".into(), "expert".into()]
        )]
        peers: Vec<String>,
    },
    /// The discovery standards over HTTP: ARD search against ADP discover
    /// on the same queries, the AI Catalog document (build, cached, 304,
    /// after a change), MCP registry pages of 100.
    Standards {
        /// Agents in the directory.
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// Query texts (each asked of both routes, twice).
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// MCP servers published for the paging figures.
        #[arg(long, default_value_t = 100_000)]
        servers: usize,
    },
    /// The MCP server's `discover_agents` against `POST /discover` on the
    /// same queries (the cost of `/mcp` over the JSON route).
    Mcp {
        /// Agents in the directory.
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// Query texts (each asked of both, twice; the second pass counts).
        #[arg(long, default_value_t = 500)]
        queries: usize,
    },
    /// The latency federated discovery adds over local discovery (three
    /// registries in one process, peers on loopback).
    Federation {
        /// Agents in each registry.
        #[arg(long, default_value_t = 2000)]
        agents: usize,
        /// Queries per measured run.
        #[arg(long, default_value_t = 1000)]
        queries: usize,
        /// Client concurrencies over gRPC, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8])]
        clients: Vec<usize>,
    },
    /// What the invocation gateway adds: a local echo agent called directly
    /// and through `POST /agents/{id}/invoke`, side by side.
    Gateway {
        /// Calls per measured run.
        #[arg(long, default_value_t = 5000)]
        calls: usize,
        /// Client concurrencies, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
        clients: Vec<usize>,
        /// Call an A2A 1.0 (JSON-RPC) echo agent instead of a REST one.
        #[arg(long)]
        a2a: bool,
        /// With --a2a: the agent serves A2A 1.0 over gRPC instead.
        #[arg(long, requires = "a2a")]
        grpc: bool,
    },
    /// What TLS and token checks cost: discover and register over plain
    /// text and TLS, with an API key and with a JWT, side by side.
    Trust {
        /// Requests per figure.
        #[arg(long, default_value_t = 5000)]
        requests: usize,
        /// Concurrent keep-alive clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
    },
    /// Record signing and verification throughput, one at a time and in
    /// Ed25519 batches.
    Signatures {
        /// Records signed and verified.
        #[arg(long, default_value_t = 20_000)]
        records: usize,
    },
}

/// Finds a program on PATH (or takes a path as given).
fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Runs a benchmark and prints its table.
pub async fn run_bench(args: BenchArgs) -> Result<(), CliError> {
    let (clients, writes, value_bytes, etcd, no_etcd, refresh, dir) = match args.command {
        BenchCommand::Writes {
            clients,
            writes,
            value_bytes,
            etcd,
            no_etcd,
            refresh,
            agents,
            rate,
            seconds,
            dir,
        } => {
            let refresh = refresh.then(|| crate::bench::RefreshLoad {
                agents,
                rate: rate.max(1.0),
                seconds: seconds.max(1),
            });
            (
                clients,
                writes,
                value_bytes,
                etcd,
                no_etcd || refresh.is_some(),
                refresh,
                dir,
            )
        }
        BenchCommand::Discover {
            agents,
            queries,
            clients,
            dir,
            no_peers,
            peers,
        } => {
            let temp = tempfile_dir(dir)?;
            let peers = if no_peers { Vec::new() } else { peers };
            let sizes =
                crate::bench::discover::run(temp.path(), &agents, queries, &clients, &peers)
                    .await
                    .map_err(local)?;
            out!("{}", crate::bench::discover::report(&sizes));
            return Ok(());
        }
        BenchCommand::Federation {
            agents,
            queries,
            clients,
        } => {
            let temp = tempfile_dir(None)?;
            let r =
                crate::bench::federation::run(temp.path(), agents.max(1), queries.max(1), &clients)
                    .await
                    .map_err(local)?;
            out!("{}", crate::bench::federation::report(&r));
            return Ok(());
        }
        BenchCommand::Standards {
            agents,
            queries,
            servers,
        } => {
            let temp = tempfile_dir(None)?;
            let r =
                crate::bench::standards::run(temp.path(), agents.max(1), queries.max(1), servers)
                    .await
                    .map_err(local)?;
            out!("{}", crate::bench::standards::report(&r));
            return Ok(());
        }
        BenchCommand::Mcp { agents, queries } => {
            let temp = tempfile_dir(None)?;
            let r = crate::bench::mcp::run(temp.path(), agents.max(1), queries.max(1))
                .await
                .map_err(local)?;
            out!("{}", crate::bench::mcp::report(&r));
            return Ok(());
        }
        BenchCommand::Gateway {
            calls,
            clients,
            a2a,
            grpc,
        } => {
            let temp = tempfile_dir(None)?;
            let kind = match (a2a, grpc) {
                (true, true) => crate::bench::gateway::Agent::A2aGrpc,
                (true, false) => crate::bench::gateway::Agent::A2a,
                _ => crate::bench::gateway::Agent::Rest,
            };
            let r = crate::bench::gateway::run(temp.path(), calls.max(1), &clients, kind)
                .await
                .map_err(local)?;
            out!("{}", crate::bench::gateway::report(&r));
            return Ok(());
        }
        BenchCommand::Trust { requests, clients } => {
            let temp = tempfile_dir(None)?;
            let r = crate::bench::trust::run(temp.path(), requests.max(1), clients)
                .await
                .map_err(local)?;
            out!("{}", crate::bench::trust::report(&r));
            return Ok(());
        }
        BenchCommand::Signatures { records } => {
            let rates = crate::bench::signatures::run(records.max(1)).map_err(local)?;
            out!("{}", crate::bench::signatures::report(&rates, records));
            return Ok(());
        }
    };
    let etcd = if no_etcd {
        None
    } else {
        Some(which(&etcd).ok_or_else(|| {
            local(format!(
                "no '{etcd}' binary found; install etcd (Debian: apt-get install etcd-server), pass --etcd PATH, or --no-etcd"
            ))
        })?)
    };
    let temp = tempfile_dir(dir)?;
    let bench = crate::bench::WriteBench {
        dir: temp.path().to_path_buf(),
        concurrencies: clients,
        writes,
        value_bytes,
        etcd,
        refresh,
    };
    let rows = bench.run().await.map_err(local)?;
    out!("{}", crate::bench::report(&rows, value_bytes));
    Ok(())
}

/// A refresh's or lease's answer: one line, or JSON with `--json`.
fn print_lease(args: &ClientArgs, r: &pb::LeaseResponse) {
    let what = match (&r.id, &r.lease) {
        (Some(id), Some(lease)) => format!("{id} (lease {lease})"),
        (Some(id), None) => id.clone(),
        (None, Some(lease)) => format!("lease {lease} ({} agents)", r.agents),
        (None, None) => String::new(),
    };
    if args.json {
        out!(
            "{}",
            serde_json::json!({"id": r.id, "lease": r.lease, "ttl_seconds": r.ttl_seconds,
                "expires_at": r.expires_at, "agents": r.agents})
        );
    } else {
        out!(
            "{what} expires at {} (TTL {} s)",
            r.expires_at,
            r.ttl_seconds
        );
    }
}

/// The benchmark's working directory: the one given (kept), or a fresh one
/// under the system temp dir (removed on drop).
enum WorkDir {
    Kept(PathBuf),
    Temp(PathBuf),
}

impl WorkDir {
    fn path(&self) -> &std::path::Path {
        match self {
            WorkDir::Kept(p) | WorkDir::Temp(p) => p,
        }
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let WorkDir::Temp(p) = self {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn tempfile_dir(dir: Option<PathBuf>) -> Result<WorkDir, CliError> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(&d).map_err(local)?;
            Ok(WorkDir::Kept(d))
        }
        None => {
            let d = std::env::temp_dir().join(format!("agentry-bench-{}", std::process::id()));
            std::fs::create_dir_all(&d).map_err(local)?;
            Ok(WorkDir::Temp(d))
        }
    }
}

/// Flags and environment variables override the config file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, env = "AGENTRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the configuration and exit (0 when it would serve): read the
    /// files it names (TLS, keys, secrets, credentials) and say what the
    /// node would run, without creating the data directory or binding a
    /// port.
    #[arg(long)]
    pub check_config: bool,
    /// Data directory (RocksDB, snapshots, admin key digest).
    #[arg(long, env = "AGENTRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Public gRPC listener address.
    #[arg(long, env = "AGENTRY_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// HTTP/JSON facade listener address.
    #[arg(long, env = "AGENTRY_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Internal Raft listener address (node-to-node traffic only).
    #[arg(long, env = "AGENTRY_RAFT_ADDR")]
    pub raft_addr: Option<SocketAddr>,
    /// Internal peer listener address (registry-to-registry federation).
    #[arg(long, env = "AGENTRY_PEER_ADDR")]
    pub peer_addr: Option<SocketAddr>,
    /// host:port other nodes use to reach the Raft listener.
    #[arg(long, env = "AGENTRY_RAFT_ADVERTISE_ADDR")]
    pub raft_advertise_addr: Option<String>,
    /// Raft node id.
    #[arg(long, env = "AGENTRY_NODE_ID")]
    pub node_id: Option<u64>,
    /// Take the node id from the hostname's trailing ordinal (StatefulSet).
    #[arg(long, env = "AGENTRY_NODE_ID_FROM_HOSTNAME")]
    pub node_id_from_hostname: bool,
    /// auto (single node, or the lowest id of --initial-members initialises)
    /// or manual (wait for `agentry cluster init` or to be added).
    #[arg(long, env = "AGENTRY_BOOTSTRAP")]
    pub bootstrap: Option<String>,
    /// Static members of a new cluster: id=host:port, comma-separated.
    #[arg(long, env = "AGENTRY_INITIAL_MEMBERS", value_delimiter = ',')]
    pub initial_members: Vec<String>,
    /// Log entries between snapshots (a refresh counts an eighth; 0: never).
    #[arg(long, env = "AGENTRY_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// Testing only: allow network fault injection through the admin API.
    #[arg(long, env = "AGENTRY_FAULT_INJECTION")]
    pub fault_injection: bool,
    /// Require an API key for reads too.
    #[arg(long, env = "AGENTRY_NO_ANONYMOUS_READS")]
    pub no_anonymous_reads: bool,
    /// Folder of the embedding model (overrides the config file).
    #[arg(long, env = "AGENTRY_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Embedder: model2vec, minilm, openai (needs [discovery.endpoint] in
    /// the config file) or none (overrides the config file).
    #[arg(long, env = "AGENTRY_EMBEDDER")]
    pub embedder: Option<String>,
    /// Rank without an embedding model (lexical and tag matches only);
    /// the same as `--embedder none`.
    #[arg(long)]
    pub no_embedder: bool,
    /// The operator's DNS name that record signatures name (used when the
    /// cluster first establishes its identity).
    #[arg(long, env = "AGENTRY_AUTHORITY")]
    pub authority: Option<String>,
    /// Signing key file from `agentry keys generate` (e.g. a mounted
    /// Kubernetes secret); its keys are added and the last signs.
    #[arg(long, env = "AGENTRY_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Host names `/mcp` answers besides loopback, IP addresses and this
    /// node's public URL (`name`, `name:port`, `*.domain`, `*`),
    /// comma-separated; replaces `[mcp] allowed_hosts`.
    #[arg(long, env = "AGENTRY_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub mcp_allowed_hosts: Vec<String>,
    /// Browser origins whose pages may call `/mcp`
    /// (`https://app.example.com`, `*`), comma-separated; replaces
    /// `[mcp] allowed_origins`.
    #[arg(long, env = "AGENTRY_MCP_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub mcp_allowed_origins: Vec<String>,
    /// Browser origins whose pages may call the HTTP API from another
    /// origin (`https://console.example.com`, `*`), comma-separated;
    /// replaces `[cors] allowed_origins`. `/mcp` follows
    /// `--mcp-allowed-origins` instead.
    #[arg(long, env = "AGENTRY_CORS_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub cors_allowed_origins: Vec<String>,
    /// Register the demo directory (199 MetaTool agents) on start.
    #[arg(long, env = "AGENTRY_DEMO")]
    pub demo: bool,
    #[arg(long = "admin-key", env = "AGENTRY_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// PEM certificate of the public gRPC and HTTP listeners (TLS); re-read
    /// when it changes on disk.
    #[arg(long, env = "AGENTRY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "AGENTRY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA whose client certificates the public listeners accept (mutual
    /// TLS; clients without one still use keys or tokens).
    #[arg(long, env = "AGENTRY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// File holding the cluster secret every Raft RPC proves (the same on
    /// every node; `AGENTRY_CLUSTER_SECRET` gives the secret itself).
    #[arg(long, env = "AGENTRY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Mutual TLS on the Raft listener instead of the secret: this node's
    /// certificate, its key, and the cluster CA.
    #[arg(long, env = "AGENTRY_CLUSTER_TLS_CERT", requires_all = ["cluster_tls_key", "cluster_tls_ca"])]
    pub cluster_tls_cert: Option<PathBuf>,
    #[arg(long, env = "AGENTRY_CLUSTER_TLS_KEY", requires = "cluster_tls_cert")]
    pub cluster_tls_key: Option<PathBuf>,
    #[arg(long, env = "AGENTRY_CLUSTER_TLS_CA", requires = "cluster_tls_cert")]
    pub cluster_tls_ca: Option<PathBuf>,
}

impl ServeArgs {
    /// The effective configuration: defaults < file < env/flags.
    pub fn config(&self) -> Result<Config, crate::config::ConfigError> {
        let mut c = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = self.grpc_addr {
            c.grpc_addr = v;
        }
        if let Some(v) = self.http_addr {
            c.http_addr = v;
        }
        if let Some(v) = self.raft_addr {
            c.raft_addr = v;
        }
        if let Some(v) = self.peer_addr {
            c.peer_addr = v;
        }
        if let Some(v) = &self.raft_advertise_addr {
            c.raft_advertise_addr = Some(v.clone());
        }
        if let Some(v) = self.node_id {
            c.node_id = v;
        }
        if self.node_id_from_hostname {
            c.node_id_from_hostname = true;
        }
        if let Some(v) = &self.bootstrap {
            c.bootstrap = v.clone();
        }
        if !self.initial_members.is_empty() {
            c.initial_members = self.initial_members.clone();
        }
        if let Some(v) = self.snapshot_logs {
            c.snapshot_logs = v;
        }
        if self.fault_injection {
            c.fault_injection = true;
        }
        if self.no_anonymous_reads {
            c.anonymous_reads = false;
        }
        if let Some(v) = &self.authority {
            c.identity.authority = Some(v.clone());
        }
        if let Some(v) = &self.key_file {
            c.identity.key_file = Some(v.clone());
        }
        if let Some(v) = &self.model_dir {
            c.discovery.model_dir = Some(v.clone());
        }
        if let Some(e) = &self.embedder {
            c.discovery.embedder = e.clone();
        }
        if self.no_embedder {
            c.discovery.embedder = "none".into();
        }
        if !self.mcp_allowed_hosts.is_empty() {
            c.mcp.allowed_hosts = self.mcp_allowed_hosts.clone();
        }
        if !self.mcp_allowed_origins.is_empty() {
            c.mcp.allowed_origins = self.mcp_allowed_origins.clone();
        }
        if !self.cors_allowed_origins.is_empty() {
            c.cors.allowed_origins = self.cors_allowed_origins.clone();
        }
        if self.demo {
            c.demo = true;
        }
        c.admin_key = self.admin_key.clone().filter(|k| !k.is_empty());
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            c.tls = Some(crate::config::TlsConfig {
                cert_file: cert.clone(),
                key_file: key.clone(),
                client_ca_file: self.tls_client_ca.clone(),
            });
        }
        if let Some(f) = &self.cluster_secret_file {
            c.cluster.secret_file = Some(f.clone());
        }
        // The secret itself only from the environment: a flag would show
        // in the process list.
        c.cluster.secret = std::env::var("AGENTRY_CLUSTER_SECRET")
            .ok()
            .filter(|s| !s.trim().is_empty());
        if let (Some(cert), Some(key), Some(ca)) = (
            &self.cluster_tls_cert,
            &self.cluster_tls_key,
            &self.cluster_tls_ca,
        ) {
            c.cluster.tls = Some(crate::config::ClusterTlsConfig {
                cert_file: cert.clone(),
                key_file: key.clone(),
                ca_file: ca.clone(),
            });
        }
        Ok(c)
    }
}

/// How client commands reach the registry.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// gRPC address of a registry node; several, comma-separated, are tried
    /// in turn (and a watch moves to the next when its node goes away).
    #[arg(
        long,
        env = "AGENTRY_SERVER",
        default_value = "http://127.0.0.1:8471",
        value_delimiter = ',',
        global = true
    )]
    pub server: Vec<String>,
    /// API key sent as a bearer token.
    #[arg(long, env = "AGENTRY_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// PEM CA certificate that signed an https server's certificate
    /// (default: the bundled web PKI roots).
    #[arg(long, env = "AGENTRY_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that ask for one.
    #[arg(
        long,
        env = "AGENTRY_CLIENT_CERT",
        global = true,
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    #[arg(
        long,
        env = "AGENTRY_CLIENT_KEY",
        global = true,
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
}

impl ClientArgs {
    /// TLS settings for `https://` servers.
    fn tls(&self) -> Result<tonic::transport::ClientTlsConfig, CliError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| local(format!("cannot read {}: {e}", p.display())))
        };
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_file {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
            None => tls.with_webpki_roots(),
        };
        if let (Some(c), Some(k)) = (&self.client_cert, &self.client_key) {
            tls = tls.identity(Identity::from_pem(read(c)?, read(k)?));
        }
        Ok(tls)
    }

    /// Connects to the first server that answers, starting at `start`.
    pub async fn connect(&self, start: usize) -> Result<(usize, Channel), CliError> {
        let mut last = String::from("no --server given");
        for i in 0..self.server.len() {
            let k = (start + i) % self.server.len();
            let addr = &self.server[k];
            let addr = if addr.contains("://") {
                addr.clone()
            } else {
                format!("http://{addr}")
            };
            let mut endpoint = Channel::from_shared(addr.clone()).map_err(local)?;
            if addr.starts_with("https://") {
                endpoint = endpoint.tls_config(self.tls()?).map_err(local)?;
            }
            match endpoint.connect().await {
                Ok(c) => return Ok((k, c)),
                Err(e) => last = format!("cannot reach {addr}: {}", crate::error_chain(&e)),
            }
        }
        Err(local(last))
    }

    /// Wraps a message with the API key.
    pub fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, CliError> {
        let mut req = tonic::Request::new(msg);
        // An empty key (AGENTRY_API_KEY= in a shell) means none: sent as
        // "Bearer " it would turn an anonymous read into a 401.
        if let Some(key) = self.api_key.as_deref().filter(|k| !k.is_empty()) {
            let value = format!("Bearer {key}")
                .parse()
                .map_err(|_| local("the API key is not valid header text"))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

#[derive(Debug, Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: AgentsCommand,
}

#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// Register (or refresh) an agent from a JSON file, or '-' for stdin.
    Register {
        file: String,
        /// Only the owner and admins may read it.
        #[arg(long)]
        private: bool,
        /// Also readable by (implies --private): principal:NAME,
        /// tenant:NAME or role:ROLE; repeatable.
        #[arg(long = "reader")]
        readers: Vec<String>,
    },
    /// Show one agent.
    Get { id: String },
    /// List agents; filters combine with AND.
    List {
        #[arg(long = "capability")]
        capabilities: Vec<String>,
        #[arg(long = "tag")]
        tags: Vec<String>,
        #[arg(long = "language")]
        languages: Vec<String>,
        #[arg(long = "status")]
        statuses: Vec<String>,
        #[arg(long)]
        publisher: Option<String>,
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        include_expired: bool,
        #[arg(long, default_value_t = 50)]
        page_size: u32,
        /// Follow page tokens to the end.
        #[arg(long)]
        all: bool,
    },
    /// Delete an agent (leaves a tombstone).
    Delete { id: String },
    /// Set an agent's lifecycle status: active, deprecated, inactive, deleted.
    Status {
        id: String,
        status: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Keep an agent fresh without sending its metadata: its expiry moves
    /// to now + TTL, or it joins a shared lease.
    Refresh {
        id: String,
        /// Seconds until it expires (default: its last TTL, else 60).
        #[arg(long)]
        ttl: Option<u32>,
        /// Join this shared lease instead (see `agents lease`).
        #[arg(long, conflicts_with = "ttl")]
        lease: Option<String>,
    },
    /// Keep a shared lease alive (made on first use), show it, or revoke it
    /// (its agents expire at once).
    Lease {
        name: String,
        /// Seconds until it expires (default: its last TTL, else 60).
        #[arg(long, conflicts_with_all = ["show", "revoke"])]
        ttl: Option<u32>,
        #[arg(long, conflicts_with = "revoke")]
        show: bool,
        #[arg(long)]
        revoke: bool,
    },
    /// Find agents for a task in plain language (ADP discovery), best first.
    Discover {
        query: String,
        /// A tag every candidate must have (repeatable).
        #[arg(long = "require-tag")]
        required_tags: Vec<String>,
        /// A tag that ranks a candidate higher (repeatable).
        #[arg(long = "prefer-tag")]
        preferred_tags: Vec<String>,
        /// A tag no candidate may have (repeatable).
        #[arg(long = "exclude-tag")]
        excluded_tags: Vec<String>,
        /// An acceptable protocol, in order of preference (repeatable).
        #[arg(long = "protocol")]
        protocols: Vec<String>,
        #[arg(long, default_value_t = 10)]
        limit: u32,
        /// Show why each candidate matched (tags, examples, snippet).
        #[arg(long)]
        evidence: bool,
    },
    /// Stream changes, from a revision or from now.
    Watch {
        #[arg(long = "from", default_value_t = 0)]
        from: u64,
    },
}

/// A client-side failure, printed with the server's code when it has one.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{code}: {message}")]
    Server { code: String, message: String },
    #[error("{0}")]
    Local(String),
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        let d = detail_of(&s);
        let mut message = d.message;
        // A call that failed in transport carries why underneath.
        if let Some(cause) = std::error::Error::source(&s) {
            let cause = crate::error_chain(cause);
            if !message.ends_with(&cause) {
                message = format!("{message}: {cause}");
            }
        }
        if not_grpc(&s) {
            message.push_str(
                " (the server answered in plain HTTP, not gRPC: --server takes a node's \
                 gRPC address, port 8471 by default, not its HTTP port 8470)",
            );
        }
        Self::Server {
            code: d.code,
            message,
        }
    }
}

/// Whether tonic's error says the answer was no gRPC answer at all, as
/// when `--server` names the HTTP facade: its JSON body read as a gRPC
/// frame, or an HTTP status without a gRPC status.
fn not_grpc(s: &tonic::Status) -> bool {
    let m = s.message();
    m.contains("invalid compression flag") || m.contains("mapped from HTTP status code")
}

fn local(e: impl std::fmt::Display) -> CliError {
    CliError::Local(e.to_string())
}

/// The ADP response as JSON, or one line per candidate (rank, score, id,
/// name) with its evidence, then the warnings.
fn print_discovery(args: &ClientArgs, r: &pb::DiscoverResponse) -> Result<(), CliError> {
    if args.json {
        let v = crate::convert::discovery::discover_response_to_json(r.clone()).map_err(local)?;
        out!("{}", serde_json::to_string_pretty(&v).map_err(local)?);
        return Ok(());
    }
    if r.candidates.is_empty() {
        out!("no candidates");
    }
    for (i, c) in r.candidates.iter().enumerate() {
        out!("{:>3}  {:.3}  {}  {}", i + 1, c.score, c.id, c.name);
        if !c.matched_tags.is_empty() {
            out!("        tags: {}", c.matched_tags.join(", "));
        }
        for e in &c.matched_examples {
            out!("        example ({:.3}): {}", e.score, e.text);
        }
        if !c.snippet.is_empty() {
            out!("        \"{}\"", c.snippet);
        }
    }
    for w in &r.warnings {
        out!("warning: {w}");
    }
    Ok(())
}

fn print_record(args: &ClientArgs, r: &pb::AgentRecord) -> Result<(), CliError> {
    let v = record_pb_to_json(r).map_err(local)?;
    if args.json {
        out!("{}", serde_json::to_string_pretty(&v).map_err(local)?);
        return Ok(());
    }
    let env = &v["registry"];
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let endpoints: Vec<String> = v["bindings"]
        .as_array()
        .map(|b| {
            b.iter()
                .map(|b| format!("{} {}", s(&b["protocol"]), s(&b["endpoint"])))
                .collect()
        })
        .unwrap_or_default();
    for (k, val) in [
        ("ID", s(&v["id"])),
        ("NAME", s(&v["name"])),
        ("DESCRIPTION", s(&v["description"])),
        ("VERSION", s(&v["version"])),
        ("STATUS", s(&v["status"])),
        (
            "TAGS",
            v["tags"]
                .as_array()
                .map(|t| t.iter().map(&s).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
        ),
        ("BINDINGS", endpoints.join("; ")),
        ("OWNER", s(&env["owner"])),
        ("REVISION", s(&env["revision"])),
        ("VISIBILITY", s(&env["visibility"])),
        ("EXPIRED", s(&env["expired"])),
    ] {
        out!("{k:<12} {val}");
    }
    Ok(())
}

fn status_name(v: i32) -> &'static str {
    match pb::AgentStatus::try_from(v) {
        Ok(pb::AgentStatus::Deprecated) => "deprecated",
        Ok(pb::AgentStatus::Inactive) => "inactive",
        Ok(pb::AgentStatus::Deleted) => "deleted",
        _ => "active",
    }
}

fn parse_status(s: &str) -> Result<i32, CliError> {
    AgentStatus::parse(s)
        .map(|st| status_to_pb(Some(st)) as i32)
        .ok_or_else(|| {
            local(format!(
                "unknown status '{s}' (use active, deprecated, inactive or deleted)"
            ))
        })
}

/// Runs a client command against `args.server`.
pub async fn run_agents(all: AgentsArgs) -> Result<(), CliError> {
    let args = &all.client;
    let (_, channel) = args.connect(0).await?;
    let mut client = RegistryClient::new(channel);
    match &all.command {
        AgentsCommand::Register {
            file,
            private,
            readers,
        } => {
            let mut text = String::new();
            if file == "-" {
                std::io::stdin().read_to_string(&mut text).map_err(local)?;
            } else {
                text = std::fs::read_to_string(file).map_err(|e| local(format!("{file}: {e}")))?;
            }
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| local(format!("{file} is not valid JSON: {e}")))?;
            let metadata = metadata_from_json(v).map_err(|e| CliError::Server {
                code: "invalid_request".into(),
                message: e.to_string(),
            })?;
            let visibility = if *private || !readers.is_empty() {
                pb::Visibility::Private
            } else {
                pb::Visibility::Unspecified
            } as i32;
            let resp = client
                .register(args.request(pb::RegisterRequest {
                    metadata: Some(metadata),
                    visibility,
                    readers: readers.clone(),
                })?)
                .await?
                .into_inner();
            if !args.json {
                out!("{}", if resp.created { "created" } else { "updated" });
            }
            if let Some(r) = &resp.record {
                print_record(args, r)?;
            }
        }
        AgentsCommand::Get { id } => {
            let resp = client
                .get(args.request(pb::GetRequest {
                    id: id.clone(),
                    consistency: 0,
                })?)
                .await?
                .into_inner();
            if let Some(r) = &resp.record {
                print_record(args, r)?;
            }
        }
        AgentsCommand::List {
            capabilities,
            tags,
            languages,
            statuses,
            publisher,
            owner,
            include_expired,
            page_size,
            all,
        } => {
            let statuses = statuses
                .iter()
                .map(|s| parse_status(s))
                .collect::<Result<Vec<_>, _>>()?;
            let mut token = String::new();
            let mut rows = Vec::new();
            let mut total: u64;
            loop {
                let req = pb::ListRequest {
                    capabilities: capabilities.clone(),
                    tags: tags.clone(),
                    languages: languages.clone(),
                    statuses: statuses.clone(),
                    publisher: publisher.clone(),
                    owner: owner.clone(),
                    include_expired: *include_expired,
                    page_size: *page_size,
                    page_token: token.clone(),
                    consistency: 0,
                    query: String::new(),
                };
                let resp = client.list(args.request(req)?).await?.into_inner();
                total = resp.total_count;
                rows.extend(resp.records);
                token = resp.next_page_token;
                if token.is_empty() || !*all {
                    break;
                }
            }
            if args.json {
                let agents = rows
                    .iter()
                    .map(record_pb_to_json)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(local)?;
                out!("{}", serde_json::to_string_pretty(&serde_json::json!({"agents": agents, "total_count": total, "next_page_token": token})).map_err(local)?);
            } else {
                out!(
                    "{:<40} {:<28} {:<11} {:>8} OWNER",
                    "ID",
                    "NAME",
                    "STATUS",
                    "REVISION"
                );
                for r in &rows {
                    let (m, e) = (
                        r.metadata.clone().unwrap_or_default(),
                        r.envelope.clone().unwrap_or_default(),
                    );
                    out!(
                        "{:<40} {:<28} {:<11} {:>8} {}",
                        m.id,
                        m.name,
                        status_name(m.status),
                        e.revision,
                        e.owner
                    );
                }
                out!(
                    "{} of {} shown{}",
                    rows.len(),
                    total,
                    if token.is_empty() {
                        ""
                    } else {
                        " (more: --all)"
                    }
                );
            }
        }
        AgentsCommand::Delete { id } => {
            let resp = client
                .delete(args.request(pb::DeleteRequest {
                    id: id.clone(),
                    expected_revision: None,
                })?)
                .await?
                .into_inner();
            if args.json {
                out!(
                    "{}",
                    serde_json::json!({"id": resp.id, "revision": resp.revision, "deleted": true})
                );
            } else {
                out!("deleted {} at revision {}", resp.id, resp.revision);
            }
        }
        AgentsCommand::Status { id, status, reason } => {
            let req = pb::SetStatusRequest {
                id: id.clone(),
                status: parse_status(status)?,
                reason: reason.clone(),
                expected_revision: None,
            };
            let resp = client.set_status(args.request(req)?).await?.into_inner();
            if let Some(r) = &resp.record {
                print_record(args, r)?;
            }
        }
        AgentsCommand::Refresh { id, ttl, lease } => {
            let req = pb::RefreshRequest {
                id: id.clone(),
                ttl_seconds: *ttl,
                lease: lease.clone(),
            };
            print_lease(
                args,
                &client.refresh(args.request(req)?).await?.into_inner(),
            );
        }
        AgentsCommand::Lease {
            name,
            ttl,
            show,
            revoke,
        } => {
            let lease = name.clone();
            let resp = if *revoke {
                client
                    .revoke_lease(args.request(pb::RevokeLeaseRequest { lease })?)
                    .await?
            } else if *show {
                client
                    .get_lease(args.request(pb::GetLeaseRequest {
                        lease,
                        consistency: pb::ReadConsistency::Linearizable as i32,
                    })?)
                    .await?
            } else {
                client
                    .refresh_lease(args.request(pb::RefreshLeaseRequest {
                        lease,
                        ttl_seconds: *ttl,
                    })?)
                    .await?
            };
            print_lease(args, &resp.into_inner());
        }
        AgentsCommand::Watch { from } => watch(args, client, *from).await?,
        AgentsCommand::Discover {
            query,
            required_tags,
            preferred_tags,
            excluded_tags,
            protocols,
            limit,
            evidence,
        } => {
            let (_, channel) = args.connect(0).await?;
            let resp = DiscoveryClient::new(channel)
                .discover(args.request(pb::DiscoverRequest {
                    query: query.clone(),
                    required_tags: required_tags.clone(),
                    preferred_tags: preferred_tags.clone(),
                    excluded_tags: excluded_tags.clone(),
                    protocols: protocols.clone(),
                    limit: *limit,
                    include_evidence: *evidence,
                    ..Default::default()
                })?)
                .await?
                .into_inner();
            print_discovery(args, &resp)?;
        }
    }
    Ok(())
}

fn print_change(args: &ClientArgs, change: pb::WatchResponse) -> Result<(), CliError> {
    let kind = pb::ChangeKind::try_from(change.kind)
        .map(|k| k.as_str_name())
        .unwrap_or("UNKNOWN")
        .trim_start_matches("CHANGE_KIND_");
    if args.json {
        let record = change
            .record
            .as_ref()
            .map(record_pb_to_json)
            .transpose()
            .map_err(local)?;
        out!(
            "{}",
            serde_json::json!({"revision": change.revision, "kind": kind.to_lowercase(), "record": record})
        );
    } else {
        let id = change
            .record
            .and_then(|r| r.metadata)
            .map(|m| m.id)
            .unwrap_or_default();
        out!("{:>8} {:<15} {}", change.revision, kind, id);
    }
    Ok(())
}

/// Follows the change feed. When the node goes away the watch resumes on
/// the next server from the revision after the last one printed, so no
/// change is missed or shown twice.
async fn watch(
    args: &ClientArgs,
    mut client: RegistryClient<Channel>,
    from: u64,
) -> Result<(), CliError> {
    let mut next = if from == 0 {
        // "From now" must survive a reconnect too: pin "now" to a revision.
        let list = pb::ListRequest {
            page_size: 1,
            ..Default::default()
        };
        client
            .list(args.request(list)?)
            .await?
            .into_inner()
            .applied_revision
            + 1
    } else {
        from
    };
    let mut server = 0;
    loop {
        let req = args.request(pb::WatchRequest {
            from_revision: next,
        })?;
        let ended = match client.watch(req).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.next().await {
                        Some(Ok(change)) => {
                            next = change.revision + 1;
                            print_change(args, change)?;
                        }
                        Some(Err(s)) => break s,
                        None => break tonic::Status::unavailable("the server ended the stream"),
                    }
                }
            }
            Err(s) => s,
        };
        if !matches!(
            ended.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
        ) {
            return Err(ended.into());
        }
        eprintln!(
            "watch interrupted ({}); resuming from revision {next}",
            ended.message()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (k, channel) = loop {
            match args.connect(server + 1).await {
                Ok(found) => break found,
                Err(e) => {
                    eprintln!("{e}; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        };
        server = k;
        client = RegistryClient::new(channel);
    }
}
