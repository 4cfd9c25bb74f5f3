//! Composition root: open storage, start Raft, build the services, bind the
//! listeners, and shut down gracefully.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

use crate::api::auth::{key_digest, Authenticator};
use crate::api::cluster::ClusterApi;
use crate::api::federation::FederationApi;
use crate::api::gate::{Gate, GateLayer, GateService};
use crate::api::grpc::RegistryApi;
use crate::api::http::{router, HttpServices, HttpState};
use crate::api::invocation::InvocationApi;
use crate::config::Config;
use crate::consensus::cluster_auth::SecretSource;
use crate::consensus::{Bootstrap, ClusterAuth, Faults, NodeSettings, RaftNode, RaftService};
use crate::domain::{Principal, Role};
use crate::index::{Embedder, SearchIndex};
use crate::listener::{accept, serve_grpc, serve_http, ClientAuth, ReloadingTls};
use crate::pb::agent_protocol_server::AgentProtocolServer;
use crate::pb::ard_server::ArdServer;
use crate::pb::cluster_server::ClusterServer;
use crate::pb::discovery_server::DiscoveryServer;
use crate::pb::federation_server::FederationServer;
use crate::pb::gateway_server::GatewayServer;
use crate::pb::peering_server::PeeringServer;
use crate::pb::raft_transport_server::RaftTransportServer;
use crate::pb::registry_server::RegistryServer;
use crate::service::{ClusterService, IdentitySettings, RegistryService};
use crate::storage::{self, LogStore, StateMachine};

/// Errors that stop the server from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("storage: {0}")]
    Storage(#[from] storage::StorageError),
    #[error("raft: {0}")]
    Raft(#[from] crate::consensus::WriteError),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("gRPC: {0}")]
    Grpc(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(transparent)]
    ClusterAuth(#[from] crate::consensus::cluster_auth::ClusterAuthError),
    /// The Raft core stopped; the process exits so its supervisor starts
    /// it afresh (once the data directory has room again).
    #[error("the Raft core stopped ({0}); exiting so the supervisor restarts this node")]
    CoreStopped(String),
}

/// A started server.
pub struct RunningServer {
    pub node_id: u64,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The internal Raft listener as bound.
    pub raft_addr: SocketAddr,
    /// The peer listener (registry-to-registry federation) as bound.
    pub peer_addr: SocketAddr,
    /// The bootstrap admin key when this start generated it (printed once).
    pub generated_admin_key: Option<String>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    node: RaftNode,
    service: RegistryService,
    /// Held to the end, so the database is closed on the thread that shuts
    /// down, before the process exits (closing it on whichever thread let
    /// go last could still be running when `main` returns, and RocksDB
    /// aborts when its globals go away under it).
    db: Arc<rocksdb::DB>,
}

impl RunningServer {
    /// The service layer, for in-process callers (benchmarks).
    pub fn service(&self) -> &RegistryService {
        &self.service
    }

    /// Builds a snapshot now and waits for it (benchmarks).
    pub async fn snapshot_now(&self) -> Result<(), ServerError> {
        self.node
            .snapshot_now(Duration::from_secs(600))
            .await
            .map_err(ServerError::Raft)
    }

    /// Stops the listeners (letting in-flight requests finish) and Raft.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for mut t in self.tasks {
            // In-flight requests get a grace period; a listener still busy
            // after it is stopped rather than holding the process open.
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await.is_err() {
                tracing::warn!("a listener did not drain within {SHUTDOWN_GRACE:?}; aborting it");
                t.abort();
            }
        }
        self.node.shutdown().await;
        // The node holds the database too (its storage, its free-space
        // check): kept here, it would hold the wait below to its end.
        drop(self.node);
        drop(self.service);
        // Background users (the log's sync thread, the indexer) let go of
        // the database shortly after; a restart in the same process must
        // not find it still locked.
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while Arc::strong_count(&self.db) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if Arc::strong_count(&self.db) > 1 {
            tracing::warn!("the database was still in use when shutdown finished");
        }
        // The last reference: the database closes here.
        drop(self.db);
    }
}

const ADMIN_DIGEST_FILE: &str = "admin-key.sha256";
/// How long shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Largest snapshot a node accepts from a leader.
const MAX_SNAPSHOT_BYTES: usize = 8 << 30;

/// This machine's host name (`HOSTNAME`, else /etc/hostname), for
/// `node_id_from_hostname`.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Builds the authenticator: configured keys plus the bootstrap admin key,
/// which comes from `AGENTRY_ADMIN_KEY`, else from the digest stored on a
/// previous start, else is generated now (and returned to be shown once;
/// its digest is stored by [`keep_admin_key`] once the node serves).
fn authenticator(config: &Config) -> Result<(Authenticator, Option<String>), ServerError> {
    let mut auth = Authenticator::default();
    for k in &config.api_keys {
        let role = k.role;
        let digest = match (&k.key_sha256, &k.key) {
            (Some(d), _) => d.clone(),
            (None, Some(key)) => key_digest(key),
            (None, None) => continue,
        };
        auth.add_digest(
            &digest,
            Principal::new(k.name.clone(), role).in_tenant(k.tenant.clone()),
        );
    }
    let admin = Principal::new("admin", Role::Admin);
    if let Some(key) = &config.admin_key {
        auth.add_digest(&key_digest(key), admin);
        return Ok((auth, None));
    }
    let path = config.data_dir.join(ADMIN_DIGEST_FILE);
    if let Ok(digest) = std::fs::read_to_string(&path) {
        auth.add_digest(digest.trim(), admin);
        return Ok((auth, None));
    }
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let key = format!("agk_{}", crate::crypto::hex(&bytes));
    auth.add_digest(&key_digest(&key), admin);
    Ok((auth, Some(key)))
}

/// The other members reach this node at the address its cluster's
/// membership records, not at the one it listens on: a directory restored
/// with the default `--raft-addr`, or moved, would leave them calling the
/// wrong place with nothing said. Said once at start.
fn warn_of_another_address(status: &crate::consensus::NodeStatus, advertised: &str) {
    if let Some(recorded) = status.addresses.get(&status.node_id) {
        if recorded != advertised {
            tracing::warn!(
                node_id = status.node_id,
                recorded = %recorded,
                advertised,
                "the cluster's membership records this node at {recorded}, but it advertises {advertised}: other members will call {recorded}. Serve it there (--raft-addr {recorded}), or restore its backup again with --raft-addr {advertised}"
            );
        }
    }
}

/// Stores the digest of a generated admin key. Only a start that serves
/// does this (and then prints the key): a start that fails earlier (a port
/// taken, a TLS file missing) leaves no digest, so the next start makes and
/// prints a key again instead of keeping one nobody saw.
fn keep_admin_key(data_dir: &std::path::Path, key: &str) -> std::io::Result<()> {
    let path = data_dir.join(ADMIN_DIGEST_FILE);
    std::fs::write(&path, key_digest(key))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// A listener's TLS, re-read from its files when they change.
fn listener_tls(
    what: &str,
    tls: Option<&crate::config::TlsConfig>,
    client_auth: ClientAuth,
) -> Result<Option<Arc<ReloadingTls>>, ServerError> {
    tls.map(|t| ReloadingTls::load(t.clone(), client_auth))
        .transpose()
        .map_err(|e| ServerError::Tls(format!("{what}: {e}")))
}

/// A listener's gRPC services behind the gate, which also holds requests
/// to their deadline; `listener::serve_grpc` adds the connection limits.
fn gated(
    config: &Config,
    gate: &Arc<Gate>,
    routes: tonic::service::Routes,
) -> GateService<tonic::service::Routes> {
    use tower::Layer;
    GateLayer {
        gate: gate.clone(),
        request_timeout: Duration::from_secs(config.request_timeout_secs),
    }
    .layer(routes.prepare())
}

/// The descriptors reflection serves: the public services only. The Raft
/// transport and the peer service live on other listeners, and listing
/// them here would invite callers to the wrong door.
fn public_descriptor_set() -> Result<Vec<u8>, ServerError> {
    use prost::Message;
    let mut set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET)
        .map_err(|e| ServerError::Grpc(e.to_string()))?;
    for file in &mut set.file {
        file.service
            .retain(|s| !matches!(s.name(), "RaftTransport" | "Peering"));
    }
    Ok(set.encode_to_vec())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// What a start reads and builds from its configuration beyond
/// `Config::validate`: files (TLS certificates and keys, the signing key
/// file, the gateway's credentials, a JWKS file), the cluster's
/// credentials, the admin key, and the clients of peers and the gateway.
/// Made before a start creates its data directory or binds a port, so a
/// configuration that cannot serve fails before the node initialises a
/// cluster or joins one; `agentry serve --check-config` stops here. It only
/// reads: a cluster secret or admin key still to be made is made by the
/// start that serves.
pub struct Prepared {
    config: Config,
    auth: Authenticator,
    generated_admin_key: Option<String>,
    bootstrap: Bootstrap,
    /// This node's Raft address in `initial_members`, if listed.
    listed_addr: Option<String>,
    /// `None`: this node founds a cluster and generates its secret.
    cluster_auth: Option<(ClusterAuth, SecretSource)>,
    public_tls: Option<Arc<ReloadingTls>>,
    peer_tls: Option<Arc<ReloadingTls>>,
    outbound: crate::gateway::transport::Outbound,
    credentials: crate::service::ConfiguredCredentials,
    peers: crate::federation::Peers,
    key_file: Option<crate::crypto::KeyFile>,
}

impl Prepared {
    pub fn new(mut config: Config) -> Result<Self, ServerError> {
        use crate::config::ConfigError::Invalid;
        config.resolve_node_id(&hostname())?;
        config.validate()?;
        // The issuer's keys and the gateway's calls go out under one guard.
        let outbound = config.gateway.outbound()?;
        let (mut auth, generated_admin_key) = authenticator(&config)?;
        if let Some(jwt) = &config.jwt {
            let verifier = crate::api::jwt::JwtVerifier::new(jwt.clone(), Some(outbound.clone()))
                .map_err(Invalid)?;
            auth = auth.with_jwt(verifier);
        }
        let auth = auth.with_client_certificates(config.client_certificates.clone());
        let members = config.members()?;
        let listed_addr = members.get(&config.node_id).cloned();
        // A node missing from the static list (a StatefulSet scaled up after
        // the cluster formed) waits to be added, like a manual one.
        let bootstrap = if config.bootstrap == "manual"
            || (!members.is_empty() && !members.contains_key(&config.node_id))
        {
            Bootstrap::Manual
        } else if members.is_empty() {
            Bootstrap::Single
        } else {
            Bootstrap::Members(members)
        };
        // Nobody but a member of this cluster is served on the Raft
        // listener. A node founding a cluster alone may create its secret;
        // members of a static multi-node list must be given the same one.
        let may_generate = !matches!(&bootstrap, Bootstrap::Members(m) if m.len() > 1);
        let cluster_auth = ClusterAuth::resolve(&config.cluster, &config.data_dir, may_generate)?;
        let public_tls = listener_tls("tls", config.tls.as_ref(), ClientAuth::Optional)?;
        let peer_tls = listener_tls(
            "federation.tls",
            config.federation.tls.as_ref(),
            ClientAuth::Required,
        )?;
        let credentials = crate::service::ConfiguredCredentials::load(&config.gateway, &outbound)
            .map_err(Invalid)?;
        // A served record is the metadata and its envelope (signatures,
        // provenance): the same room the HTTP facade gives a request body.
        let peers =
            crate::federation::Peers::new(&config.federation, config.max_record_bytes + 64 * 1024)
                .map_err(Invalid)?;
        let key_file = config
            .identity
            .key_file
            .as_deref()
            .map(crate::crypto::KeyFile::read)
            .transpose()
            .map_err(|e| Invalid(format!("identity.key_file: {e}")))?;
        config
            .audit
            .check_sink()
            .map_err(|e| Invalid(format!("audit.file: {e}")))?;
        Ok(Self {
            config,
            auth,
            generated_admin_key,
            bootstrap,
            listed_addr,
            cluster_auth,
            public_tls,
            peer_tls,
            outbound,
            credentials,
            peers,
            key_file,
        })
    }

    /// What a node started on this configuration would run, one line per
    /// part, for the operator checking it (`--check-config`). Loads the
    /// embedding model, which a start loads too but survives without.
    pub async fn describe(&self) -> Vec<String> {
        let c = &self.config;
        let mut lines = Vec::new();
        let dir = if c.data_dir.join("db").exists() {
            "holds a node's database"
        } else if c.data_dir.exists() {
            "exists, no database yet"
        } else {
            "will be created"
        };
        lines.push(format!(
            "node {}, data directory {} ({dir})",
            c.node_id,
            c.data_dir.display()
        ));
        lines.push(match &self.bootstrap {
            Bootstrap::Single => "cluster: a single node, initialised on its first start".into(),
            Bootstrap::Manual => {
                "cluster: waits for `agentry cluster init` or to be added by a member".into()
            }
            Bootstrap::Members(m) => format!(
                "cluster: static members {} (the lowest id initialises)",
                m.iter()
                    .map(|(id, a)| format!("{id}={a}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
        let tls = |t: &Option<Arc<ReloadingTls>>| if t.is_some() { " (TLS)" } else { "" };
        lines.push(format!(
            "listeners: gRPC {}{}, HTTP {}{}, Raft {}, peers {}{}",
            c.grpc_addr,
            tls(&self.public_tls),
            c.http_addr,
            tls(&self.public_tls),
            c.raft_addr,
            c.peer_addr,
            tls(&self.peer_tls),
        ));
        lines.push(format!(
            "Raft traffic: {}",
            match &self.cluster_auth {
                Some((_, SecretSource::Tls)) => "mutual TLS (cluster certificates)".to_string(),
                Some((_, SecretSource::Configured)) => "the configured cluster secret".into(),
                Some((_, SecretSource::Stored)) => {
                    "the cluster secret stored in the data directory".into()
                }
                Some((_, SecretSource::Generated(_))) | None => {
                    "a cluster secret generated on the first start (in the data directory)".into()
                }
            }
        ));
        let admin = match (&c.admin_key, &self.generated_admin_key) {
            (Some(_), _) => "configured",
            (None, Some(_)) => "generated and printed on the first start that serves",
            (None, None) => "stored in the data directory",
        };
        lines.push(format!(
            "access: admin key {admin}; {} API key(s){}{}; reads {}",
            c.api_keys.len(),
            c.jwt
                .as_ref()
                .map(|j| format!("; tokens of {}", j.issuer))
                .unwrap_or_default(),
            if c.client_certificates.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} client certificate name(s)",
                    c.client_certificates.len()
                )
            },
            if c.anonymous_reads {
                "anonymous"
            } else {
                "need a key"
            },
        ));
        lines.push(match &self.key_file {
            Some(f) => format!("signing: {} key(s) from the key file", f.keys.len()),
            None => "signing: the cluster's own key (generated once)".into(),
        });
        lines.push(format!(
            "federation: {} peer(s); gateway: {} credential(s)",
            self.peers.all().len(),
            c.gateway.credentials.len()
        ));
        if let Some(f) = &c.audit.file {
            lines.push(format!("audit file: {}", f.display()));
        }
        lines.push(match load_embedder(&c.discovery).await {
            Ok(e) => format!("discovery: {} ({} dimensions)", e.name(), e.dim()),
            Err(why) => format!(
                "warning: discovery without an embedding model ({why}); it ranks by lexical and tag matches"
            ),
        });
        lines
    }
}

/// Starts a node: storage, Raft (bootstrapping a new cluster as configured),
/// the internal Raft listener, the public gRPC listener and the HTTP facade.
pub async fn start(config: Config) -> Result<RunningServer, ServerError> {
    let Prepared {
        config,
        auth,
        generated_admin_key,
        bootstrap,
        listed_addr,
        cluster_auth,
        public_tls,
        peer_tls,
        outbound,
        credentials,
        peers,
        key_file,
    } = Prepared::new(config)?;
    // Every listener bound before the data directory is touched: a port
    // taken fails the start before it initialises a cluster or joins one.
    // The Raft listener's real port (with port 0) is the one to advertise;
    // the HTTP one's names the WoA host. Connections wait in the backlog
    // until each is served.
    let raft_listener = bind(config.raft_addr).await?;
    let raft_addr = raft_listener.local_addr()?;
    let http_listener = bind(config.http_addr).await?;
    let http_addr = http_listener.local_addr()?;
    let grpc_listener = bind(config.grpc_addr).await?;
    let grpc_addr = grpc_listener.local_addr()?;
    // Peers get their own listener: never the Raft one, which must not be
    // reachable from another organisation.
    let peer_listener = bind(config.peer_addr).await?;
    let peer_addr = peer_listener.local_addr()?;
    std::fs::create_dir_all(&config.data_dir)?;
    let advertise_addr = config
        .raft_advertise_addr
        .clone()
        .or(listed_addr)
        .unwrap_or_else(|| raft_addr.to_string());
    let (cluster_auth, secret_source) = match cluster_auth {
        Some(found) => found,
        None => ClusterAuth::generate(&config.data_dir)?,
    };
    if let SecretSource::Generated(path) = &secret_source {
        info!(path = %path.display(), "generated the cluster secret; nodes that join this cluster need it (AGENTRY_CLUSTER_SECRET_FILE)");
    }

    let db = storage::open_bounded(
        &config.data_dir,
        config.storage.max_wal_bytes,
        config.storage.reserve_bytes,
    )?;
    let db_handle = db.clone();
    // Every node keeps the committed trail (written by apply) and its own
    // refusals; the gate records through this log.
    let audit_sink = config.audit.sink()?;
    let space = config
        .storage
        .space(&config.data_dir)
        .with_database(db.clone());
    let audit = Arc::new(crate::service::AuditLog::new(
        storage::AuditStore::open(
            db.clone(),
            config.node_id,
            config.audit.retention(),
            audit_sink.clone(),
        )?
        .with_space(space.clone()),
    ));
    let gate = Gate::with_audit(Arc::new(auth), &config.rate_limits, Some(audit.clone()));
    let state_machine = StateMachine::open(
        db.clone(),
        config.data_dir.join("snapshots"),
        config.watch_history,
    )?
    .with_audit(config.audit.retention(), audit_sink)
    .with_record_cache(config.storage.record_cache_bytes);
    let reader = state_machine.reader();
    audit.watch_installs(reader.clone());
    let faults = Faults::default();
    let node = RaftNode::start(
        NodeSettings {
            id: config.node_id,
            advertise_addr: advertise_addr.clone(),
            heartbeat_ms: config.heartbeat_ms,
            election_timeout_ms: config.election_timeout_ms,
            snapshot_logs: config.snapshot_logs,
            snapshot_keep_logs: config.snapshot_keep_logs,
            max_message_bytes: config.raft_max_message_bytes,
            request_timeout: Duration::from_secs(config.request_timeout_secs),
            auth: cluster_auth.clone(),
            space,
            encoding: config.raft_encoding,
        },
        bootstrap,
        LogStore::new(db)?,
        state_machine,
        faults.clone(),
    )
    .await?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // Node-to-node traffic only, on its own listener.
    let raft_service = RaftTransportServer::new(RaftService::new(
        node.clone(),
        faults.clone(),
        MAX_SNAPSHOT_BYTES,
        cluster_auth.clone(),
        config.raft_encoding,
    ))
    .max_decoding_message_size(config.raft_max_message_bytes)
    .max_encoding_message_size(config.raft_max_message_bytes);
    let raft_incoming = accept(
        "raft",
        raft_listener,
        cluster_auth.server_tls(),
        config.connections.for_members(),
        shutdown_rx.clone(),
    );
    // tonic's own server, so the public listeners' HTTP/2 limits are set
    // here too: without the keep-alive, a connection that sent the preface
    // and then nothing held one of the listener's slots for ever.
    let raft_server = tonic::transport::Server::builder()
        .initial_connection_window_size(crate::consensus::WINDOW * 4)
        .initial_stream_window_size(crate::consensus::WINDOW)
        .http2_keepalive_interval(config.connections.keep_alive_interval())
        .http2_keepalive_timeout(Some(config.connections.keep_alive_timeout()))
        .http2_max_header_list_size(config.connections.max_header_list_size())
        .add_service(raft_service)
        .serve_with_incoming_shutdown(raft_incoming, stopped(shutdown_rx.clone()));
    let raft_task = tokio::spawn(async move {
        if let Err(e) = raft_server.await {
            tracing::error!(error = %e, "Raft listener failed");
        }
    });

    // A single-voter cluster elects itself at once; waiting for it keeps the
    // first request from racing the election. Members of a larger cluster
    // start serving right away and report readiness once a leader is known.
    let status = node.status();
    warn_of_another_address(&status, &advertise_addr);
    if status.voters == [config.node_id] {
        node.wait_for_leader(Duration::from_secs(30)).await?;
    }

    // Built once Raft has started: after a kill -9 Raft first applies
    // again what the state machine had applied but not yet made durable,
    // and a build before that would find those records missing and embed
    // them again from the change feed instead of reusing their vectors.
    let index = SearchIndex::new(
        load_embedder(&config.discovery).await,
        config.discovery.weights.clone(),
    );
    let indexer = index.spawn(reader.clone(), shutdown_rx.clone());
    let service = RegistryService::new(
        node.clone(),
        reader.clone(),
        index,
        config.limits(),
        config.anonymous_reads,
        shutdown_rx.clone(),
    )
    .with_peers(peers.clone())
    .with_tenancy(crate::service::Tenancy::new(
        &config.tenants,
        config.quotas.clone(),
    ));
    tokio::spawn(crate::federation::pin_keys(
        peers.clone(),
        config.data_dir.clone(),
    ));
    for peer in peers.all().iter().filter(|p| p.sync) {
        tokio::spawn(crate::federation::sync::follow(
            service.clone(),
            peer.clone(),
            config.data_dir.clone(),
            shutdown_rx.clone(),
        ));
    }
    tokio::spawn(crate::federation::sync::forget_unsynced(
        service.clone(),
        peers.clone(),
        shutdown_rx.clone(),
    ));
    tokio::spawn(
        service.clone().establish_identity(IdentitySettings {
            authority: config.identity.authority.clone(),
            fallback_authority: Some(hostname())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into()),
            key_file,
        }),
    );
    if config.consistency_check_secs > 0 {
        tokio::spawn(crate::service::consistency::run_periodically(
            node.clone(),
            Duration::from_secs(config.consistency_check_secs),
            shutdown_rx.clone(),
        ));
    }
    if config.demo {
        tokio::spawn(crate::demo::load(service.clone()));
    }
    let service_handle = service.clone();
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let gateway = gateway(
        &config,
        service.clone(),
        outbound,
        credentials,
        &format!("{scheme}://{http_addr}"),
    );
    for source in &config.gateway.woa_sources {
        tokio::spawn(crate::service::crawl(
            gateway.clone(),
            source.clone(),
            shutdown_rx.clone(),
        ));
    }
    // The MCP registry mirrors read upstreams through the gateway's
    // outbound guard.
    let mirror_gateway = gateway.clone();
    let invocation = InvocationApi::new(gateway);
    // The AI Catalog, ARD and MCP registry APIs name the same public base
    // as woa.json.
    let public_base = config
        .gateway
        .public_url
        .clone()
        .unwrap_or_else(|| format!("{scheme}://{http_addr}"));
    let ard = crate::api::ard::ArdApi::new(crate::service::ArdService::new(
        service.clone(),
        public_base.clone(),
        Duration::from_secs(config.gateway.woa_max_age_secs),
    ));
    let mcp = crate::service::McpService::new(service.clone(), public_base);
    for upstream in &config.mcp_registry.upstreams {
        tokio::spawn(crate::service::mcp_mirror(
            mirror_gateway.clone(),
            mcp.clone(),
            audit.clone(),
            upstream.clone(),
            shutdown_rx.clone(),
        ));
    }
    let api = RegistryApi::new(service);
    let cluster = ClusterApi::new(
        ClusterService::new(
            node.clone(),
            reader.clone(),
            faults,
            config.fault_injection,
            config.anonymous_reads,
        ),
        audit.clone(),
    );

    // gRPC: health and reflection next to the registry, on one listener.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RegistryServer<RegistryApi>>().await;
    health.set_serving::<DiscoveryServer<RegistryApi>>().await;
    health
        .set_serving::<ArdServer<crate::api::ard::ArdApi>>()
        .await;
    health
        .set_serving::<FederationServer<FederationApi>>()
        .await;
    health.set_serving::<GatewayServer<InvocationApi>>().await;
    health
        .set_serving::<AgentProtocolServer<InvocationApi>>()
        .await;
    // gRPC health follows /healthz: NOT_SERVING once the Raft core stops.
    let watched = node.clone();
    tokio::spawn(async move {
        watched.core_stop().await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        health
            .set_not_serving::<RegistryServer<RegistryApi>>()
            .await;
        health
            .set_not_serving::<DiscoveryServer<RegistryApi>>()
            .await;
    });
    let public_descriptors = public_descriptor_set()?;
    // Every public service reads gzip-compressed requests (a client's
    // channel compression covers every call, reflection and health too),
    // and answers a compressed request compressed (the gate's
    // `answer_compression_as_asked`). Decompression is bounded by each
    // service's message limit (4 MiB where none is set).
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    let health_service = health_service.accept_compressed(gzip).send_compressed(gzip);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(&public_descriptors)
        .build_v1()
        .map_err(|e| ServerError::Grpc(e.to_string()))?
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(&public_descriptors)
        .build_v1alpha()
        .map_err(|e| ServerError::Grpc(e.to_string()))?
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let max_message = config.max_record_bytes * 2 + 64 * 1024;
    let registry = RegistryServer::new(api.clone())
        .max_decoding_message_size(max_message)
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let discovery = DiscoveryServer::new(api.clone())
        .max_decoding_message_size(max_message)
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let ard_service = ArdServer::new(ard.clone())
        .max_decoding_message_size(max_message)
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let scheme = if peer_tls.is_some() { "https" } else { "http" };
    let federation = FederationApi::new(
        service_handle.clone(),
        config
            .identity
            .federation_endpoint
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{peer_addr}")),
    );
    let peer_incoming = accept(
        "peer",
        peer_listener,
        peer_tls,
        config.connections,
        shutdown_rx.clone(),
    );
    let peer_services = gated(
        &config,
        &gate,
        tonic::service::Routes::new(
            PeeringServer::new(federation.clone())
                .max_encoding_message_size(crate::federation::MAX_PEER_MESSAGE)
                .accept_compressed(gzip)
                .send_compressed(gzip),
        ),
    );
    let peer_task = tokio::spawn(serve_grpc(
        peer_services,
        peer_incoming,
        config.connections,
        shutdown_rx.clone(),
    ));
    let federation_service = FederationServer::new(federation.clone())
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let agent_protocol_service = AgentProtocolServer::new(invocation.clone())
        .max_decoding_message_size(max_message)
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let invocation_service = GatewayServer::new(invocation.clone())
        .max_decoding_message_size(max_message)
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let cluster_service = ClusterServer::new(cluster.clone())
        .accept_compressed(gzip)
        .send_compressed(gzip);
    let grpc_incoming = accept(
        "grpc",
        grpc_listener,
        public_tls.clone(),
        config.connections,
        shutdown_rx.clone(),
    );
    // Every service behind one gate: a service added here is gated (and
    // a method the gate cannot classify is refused) without more code.
    let grpc_services = gated(
        &config,
        &gate,
        tonic::service::Routes::new(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .add_service(registry)
            .add_service(discovery)
            .add_service(ard_service)
            .add_service(cluster_service)
            .add_service(federation_service)
            .add_service(invocation_service)
            .add_service(agent_protocol_service),
    );
    let grpc_task = tokio::spawn(serve_grpc(
        grpc_services,
        grpc_incoming,
        config.connections,
        shutdown_rx.clone(),
    ));

    let state = HttpState::new(HttpServices {
        api,
        ard,
        mcp,
        mcp_origins: mcp_origins(&config)?,
        cors: cors_policy(&config)?,
        oauth: config
            .jwt
            .as_ref()
            .map(|jwt| crate::api::http::ResourceServer {
                issuer: jwt.issuer.clone(),
                public_url: config
                    .gateway
                    .public_url
                    .as_ref()
                    .map(|u| u.trim_end_matches('/').to_string()),
                scheme: if config.tls.is_some() {
                    "https"
                } else {
                    "http"
                },
            }),
        cluster,
        federation,
        invocation,
        gate,
        max_body: config.max_record_bytes + 64 * 1024,
        documents: Default::default(),
    });
    let app = router(state, Duration::from_secs(config.request_timeout_secs));
    let http_incoming = accept(
        "http",
        http_listener,
        public_tls,
        config.connections,
        shutdown_rx.clone(),
    );
    let http_task = tokio::spawn(serve_http(
        app,
        http_incoming,
        config.connections,
        shutdown_rx.clone(),
    ));

    if let Some(key) = &generated_admin_key {
        keep_admin_key(&config.data_dir, key)?;
    }
    info!(%grpc_addr, %http_addr, %raft_addr, %peer_addr, data_dir = %config.data_dir.display(), node_id = config.node_id, "agentry is serving");
    Ok(RunningServer {
        node_id: config.node_id,
        grpc_addr,
        http_addr,
        raft_addr,
        peer_addr,
        generated_admin_key,
        shutdown,
        tasks: vec![grpc_task, http_task, raft_task, peer_task, indexer],
        node,
        service: service_handle,
        db: db_handle,
    })
}

/// The names `/mcp` answers to: `[mcp]` plus the hosts of the URLs this
/// node's configuration gives for itself and its authority, names the
/// operator controls (so no attacker can rebind them).
fn mcp_origins(config: &Config) -> Result<crate::api::mcp_origin::OriginPolicy, ServerError> {
    let urls = [
        config.gateway.public_url.as_deref(),
        config.identity.federation_endpoint.as_deref(),
    ];
    let own = urls
        .into_iter()
        .flatten()
        .filter_map(|u| url::Url::parse(u).ok()?.host_str().map(String::from))
        .chain(config.identity.authority.clone())
        .collect();
    let policy = crate::api::mcp_origin::OriginPolicy::new(&config.mcp, own)
        .map_err(crate::config::ConfigError::Invalid)?;
    tracing::info!(hosts = %policy.describe(), "/mcp answers requests addressed to these names");
    Ok(policy)
}

/// The browser pages of other origins that may call the facade (`[cors]`).
fn cors_policy(config: &Config) -> Result<crate::api::http::CorsPolicy, ServerError> {
    let policy = crate::api::http::CorsPolicy::new(&config.cors)
        .map_err(crate::config::ConfigError::Invalid)?;
    if let Some(origins) = policy.describe() {
        tracing::info!(%origins, "pages of these origins may call the HTTP API (CORS)");
    }
    Ok(policy)
}

/// The invocation gateway: its outbound guard, the WoA host served at
/// `base` (the public URL, else the HTTP listener), and its use cases.
fn gateway(
    config: &Config,
    registry: RegistryService,
    outbound: crate::gateway::transport::Outbound,
    credentials: crate::service::ConfiguredCredentials,
    http_base: &str,
) -> crate::service::InvocationService {
    let g = &config.gateway;
    let base = g
        .public_url
        .clone()
        .unwrap_or_else(|| http_base.to_string());
    let woa = crate::service::WoaHost::new(base, Duration::from_secs(g.woa_max_age_secs));
    crate::service::InvocationService::new(registry, g, outbound, credentials, woa)
}

/// Loads the configured embedder, or says why there is none (discovery
/// then ranks by lexical and tag matches, and says so in its warnings).
async fn load_embedder(config: &crate::config::DiscoveryConfig) -> Result<Embedder, String> {
    if config.embedder == "none" {
        return Err("discovery.embedder is \"none\"".into());
    }
    let config = config.clone();
    let loaded = tokio::task::spawn_blocking(move || Embedder::load(&config))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    match &loaded {
        Ok(e) => tracing::info!(model = e.name(), dim = e.dim(), "embedding model loaded"),
        Err(why) => {
            tracing::warn!(%why, "no embedding model; discovery runs on lexical and tag matches (run scripts/setup.sh to fetch the default model)")
        }
    }
    loaded
}

/// Runs until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(config: Config) -> Result<(), ServerError> {
    let data_dir = config.data_dir.clone();
    let server = start(config).await?;
    let stop = stop_signal()?;
    if let Some(key) = &server.generated_admin_key {
        eprintln!("Generated the bootstrap admin API key (shown only this once; its digest is in {}):\n  {key}", data_dir.join(ADMIN_DIGEST_FILE).display());
    }
    // One line for people and scripts (tests parse it) to know where to go.
    println!(
        "agentry ready node_id={} grpc={} http={} raft={} peer={} data_dir={}",
        server.node_id,
        server.grpc_addr,
        server.http_addr,
        server.raft_addr,
        server.peer_addr,
        data_dir.display()
    );
    // Borrowed, not cloned: shutdown waits for every holder of the node
    // (and so of the database) to let go.
    let core_stopped = tokio::select! {
        signal = stop => {
            signal?;
            None
        }
        why = server.node.wait_until_restart_helps() => Some(why),
    };
    if let Some(why) = core_stopped {
        server.shutdown().await;
        return Err(ServerError::CoreStopped(why));
    }
    info!("shutting down");
    server
        .node
        .hand_off_leadership(crate::consensus::HAND_OFF_TIMEOUT)
        .await;
    server.shutdown().await;
    Ok(())
}

/// Listens for the signals that stop the node, and for SIGHUP, which it
/// ignores. The handlers are installed when this is called, before the
/// ready line, so a signal sent once that line is out is never one whose
/// default action (ending the process) still applies.
fn stop_signal() -> Result<impl std::future::Future<Output = std::io::Result<()>>, ServerError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        // SIGHUP's default action ends the process, without the leader's
        // hand-off; a logrotate `postrotate` or a habit of "reload" sends
        // it. Nothing needs it: certificates and the audit file are
        // followed as they change.
        let mut hangup = signal(SignalKind::hangup())?;
        Ok(async move {
            loop {
                tokio::select! {
                    _ = interrupt.recv() => break,
                    _ = term.recv() => break,
                    _ = hangup.recv() => info!(
                        "SIGHUP ignored: TLS certificates and the audit file are followed as they change; other settings take a restart"
                    ),
                }
            }
            Ok(())
        })
    }
    #[cfg(not(unix))]
    Ok(tokio::signal::ctrl_c())
}
