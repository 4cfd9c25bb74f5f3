//! Server configuration: defaults, then a TOML file, then environment
//! variables and flags (flags and env are merged by clap in `cli`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::{Limits, Role};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8470";
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8471";
pub const DEFAULT_RAFT_ADDR: &str = "127.0.0.1:8472";
pub const DEFAULT_PEER_ADDR: &str = "127.0.0.1:8473";
pub const DEFAULT_DATA_DIR: &str = "agentry-data";

/// An API key from the config file. Give the SHA-256 digest
/// (`key_sha256`, preferred: the file then holds no secret) or the key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    pub name: String,
    /// `admin`, `publisher` or `reader`.
    pub role: Role,
    #[serde(default)]
    pub key_sha256: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    /// The tenant the key's principal belongs to.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// The registry's signing identity (docs/federation.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConfig {
    /// The operator's DNS name, which every record signature names.
    /// Default: the key file's `authority`, else this host's name. Fixed
    /// when the cluster first establishes its identity.
    pub authority: Option<String>,
    /// A key file (`agentry keys generate`), for example a mounted
    /// Kubernetes secret; its keys are added to the cluster's and the last
    /// one signs. Without it the cluster generates its first key itself.
    pub key_file: Option<PathBuf>,
    /// Where peers reach this registry's peer listener, as published in
    /// `/.well-known/agentry.json` (e.g. `https://registry.example:8473`).
    /// Default: the peer listener as bound.
    pub federation_endpoint: Option<String>,
}

/// Federation with peer registries of other organisations
/// (docs/federation.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FederationConfig {
    /// How long a federated discovery waits for peers before answering
    /// with what it has (and a warning for each peer that did not answer).
    pub deadline_ms: u64,
    /// Hops a federated discovery may take: 1 asks direct peers only, 2
    /// lets them ask their peers, and so on.
    pub max_hops: u32,
    /// TLS for the peer listener; without it peer traffic is plain text
    /// (for development and private networks only).
    pub tls: Option<TlsConfig>,
    /// The registries this one federates with.
    pub peers: Vec<PeerConfig>,
}

impl Default for FederationConfig {
    fn default() -> Self {
        Self {
            deadline_ms: 1500,
            max_hops: 2,
            tls: None,
            peers: Vec::new(),
        }
    }
}

/// The invocation gateway (docs/invocation.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Allow invocation without an API key (off: invoking an agent is more
    /// than reading its record).
    pub anonymous_invoke: bool,
    /// Calls in flight per agent on one node; more are refused with 503.
    pub max_concurrent_per_agent: usize,
    /// How long a repeated `Idempotency-Key` returns the first answer.
    pub idempotency_window_secs: u64,
    /// Bytes of first answers kept for repeated keys on one node; the
    /// oldest are forgotten past it, and one answer over an eighth of it
    /// is not kept (a repeat is refused instead of calling again).
    pub idempotency_max_bytes: usize,
    /// How long an Agent Protocol run waits for input it asked for before
    /// it completes with an error (a waiting run holds node memory).
    pub run_input_wait_secs: u64,
    /// Bytes the Agent Protocol runs' events (their outputs) may hold on
    /// one node; the oldest completed runs are forgotten past it.
    pub runs_max_bytes: usize,
    /// Where clients reach this registry's HTTP API, for the `rest`
    /// transport of `/.well-known/woa.json` (default: the HTTP listener as
    /// bound, plain http: set the public https URL in production).
    pub public_url: Option<String>,
    /// `Cache-Control: max-age` of `/.well-known/woa.json`, seconds.
    pub woa_max_age_secs: u64,
    /// What the gateway and the WoA crawler may contact.
    pub outbound: OutboundConfig,
    /// Credentials the gateway injects for agents that require them.
    pub credentials: Vec<CredentialConfig>,
    /// Web of Agents hosts the leader re-imports periodically.
    pub woa_sources: Vec<WoaSourceConfig>,
}

/// A WoA host crawled periodically (conditional GETs with the stored
/// ETag / Last-Modified; never more often than its Cache-Control allows).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WoaSourceConfig {
    /// The host's origin or the document's URL.
    pub url: String,
    /// Seconds between crawls (at least the document's max-age).
    #[serde(default = "default_crawl_interval")]
    pub interval_secs: u64,
    /// The principal that owns the imported records.
    #[serde(default = "default_crawler")]
    pub owner: String,
    /// What the source publishes: `woa` (default) or `ai-catalog` (an AI
    /// Catalog manifest, its entries' documents and nested catalogs).
    #[serde(default)]
    pub format: SourceFormat,
}

/// The document a crawled source publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceFormat {
    #[default]
    Woa,
    AiCatalog,
}

fn default_crawl_interval() -> u64 {
    300
}

fn default_crawler() -> String {
    "woa-crawler".into()
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            anonymous_invoke: false,
            max_concurrent_per_agent: 64,
            idempotency_window_secs: 600,
            idempotency_max_bytes: 64 * 1024 * 1024,
            run_input_wait_secs: 600,
            runs_max_bytes: 256 * 1024 * 1024,
            public_url: None,
            woa_max_age_secs: 60,
            outbound: OutboundConfig::default(),
            credentials: Vec::new(),
            woa_sources: Vec::new(),
        }
    }
}

/// Outbound safety (WoA 8.2).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboundConfig {
    /// Internal targets the operator allows: CIDR ranges or addresses
    /// (`10.0.0.0/8`, `127.0.0.1`) and host names (`agents.internal`,
    /// `*.svc.cluster.local`). Everything that resolves to loopback,
    /// private, link-local or other internal ranges is refused otherwise.
    pub allow: Vec<String>,
    /// Allow plain `http://` agents (WoA 8.1: never on the open Internet).
    pub allow_http: bool,
    pub connect_timeout_ms: u64,
    /// Deadline for an agent's whole answer (between events when it
    /// streams).
    pub timeout_ms: u64,
    /// Largest agent answer (or streamed event) accepted.
    pub max_response_bytes: usize,
    pub max_redirects: usize,
    /// PEM CA certificates trusted for agents besides the bundled web PKI
    /// roots: agents (and documents) behind an organisation's own CA.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate and key the gateway presents to every agent that
    /// asks for one (mutual TLS), unless a credential names its own.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            allow_http: false,
            connect_timeout_ms: 3_000,
            timeout_ms: 30_000,
            max_response_bytes: 4 * 1024 * 1024,
            max_redirects: 5,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
        }
    }
}

/// A credential the gateway adds to calls of matching agents.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// An agent id, or a prefix ending in `*`.
    pub agent: String,
    /// The header to send (default `Authorization`).
    #[serde(default)]
    pub header: Option<String>,
    /// The header's value, or the environment variable holding it (keeps
    /// the secret out of the file).
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub value_env: Option<String>,
    /// PEM certificate and key presented to matching agents instead of
    /// `gateway.outbound`'s (mutual TLS); with them the header is optional.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// The header's value is a bearer token the gateway gets itself
    /// (OAuth 2.0 client credentials) instead of a fixed value.
    #[serde(default)]
    pub oauth2: Option<ClientCredentialsConfig>,
}

/// OAuth 2.0 client credentials (RFC 6749 4.4) the gateway exchanges at
/// the organisation's token endpoint for the tokens agents accept.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCredentialsConfig {
    pub token_url: String,
    pub client_id: String,
    /// The client secret, or the environment variable holding it.
    #[serde(default)]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub client_secret_env: Option<String>,
    /// Scopes asked for (`scope`, space-separated on the wire).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// `audience` (Auth0, Okta) and `resource` (RFC 8707) members, for
    /// providers that want the agent named.
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub resource: Option<String>,
    /// How the gateway proves itself: `basic` (default, RFC 6749 2.3.1)
    /// or `post` (where the secret goes), or `private_key_jwt` (RFC 7523
    /// 2.2: an assertion signed with `private_key_file`, no secret).
    #[serde(default)]
    pub client_auth: Option<String>,
    /// `private_key_jwt`: the client's private key (PEM), whose public
    /// key is registered at the provider.
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// `private_key_jwt`: the assertion's `kid`, as the provider knows the
    /// key (some pick the key by it).
    #[serde(default)]
    pub key_id: Option<String>,
    /// `private_key_jwt`: the signing algorithm, when not the key's usual
    /// one (RS256 for RSA, ES256 for EC, EdDSA for Ed25519).
    #[serde(default)]
    pub signing_alg: Option<String>,
    /// `private_key_jwt`: the assertion's `aud`, when the provider wants
    /// another than the token endpoint (Auth0 wants its domain's URL).
    #[serde(default)]
    pub assertion_audience: Option<String>,
}

impl GatewayConfig {
    /// The outbound policy this configuration describes.
    pub fn outbound_policy(&self) -> Result<crate::gateway::outbound::OutboundPolicy, ConfigError> {
        let o = &self.outbound;
        crate::gateway::outbound::OutboundPolicy {
            allow_http: o.allow_http,
            connect_timeout: std::time::Duration::from_millis(o.connect_timeout_ms),
            timeout: std::time::Duration::from_millis(o.timeout_ms),
            max_response_bytes: o.max_response_bytes,
            max_redirects: o.max_redirects,
            ..Default::default()
        }
        .allow(&o.allow)
        .map_err(|e| ConfigError::Invalid(format!("gateway.outbound.allow: {e}")))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(format!("gateway.{m}")));
        let o = &self.outbound;
        if !(1..=600_000).contains(&o.timeout_ms) || !(1..=60_000).contains(&o.connect_timeout_ms) {
            return bad("outbound: timeout_ms must be 1..=600000 and connect_timeout_ms 1..=60000");
        }
        if o.max_response_bytes < 1024 {
            return bad("outbound.max_response_bytes must be at least 1024");
        }
        if self.max_concurrent_per_agent == 0 {
            return bad("max_concurrent_per_agent must be at least 1");
        }
        if self.idempotency_max_bytes < 1024 * 1024 || self.runs_max_bytes < 1024 * 1024 {
            return bad(
                "idempotency_max_bytes and runs_max_bytes must be at least 1048576 (1 MiB)",
            );
        }
        if let Some(u) = &self.public_url {
            match url::Url::parse(u) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => return bad("public_url must be an absolute http(s) URL"),
            }
        }
        for w in &self.woa_sources {
            if w.interval_secs == 0 || w.owner.trim().is_empty() {
                return bad("woa_sources: interval_secs must be at least 1 and owner not empty");
            }
            crate::service::document_url(crate::service::ImportFormat::Woa, &w.url)
                .map_err(|e| ConfigError::Invalid(format!("gateway.woa_sources: {e}")))?;
        }
        for c in &self.credentials {
            if c.agent.trim().is_empty() {
                return bad("credentials: agent must name an id or a prefix ending in '*'");
            }
            let certificate = pair(
                &format!("gateway.credentials for '{}'", c.agent),
                &c.client_cert_file,
                &c.client_key_file,
            )?;
            let values = [c.value.is_some(), c.value_env.is_some(), c.oauth2.is_some()]
                .into_iter()
                .filter(|v| *v)
                .count();
            if values > 1 || values == 0 && !certificate {
                return Err(ConfigError::Invalid(format!(
                    "gateway.credentials for '{}': give exactly one of value, value_env and oauth2, or client_cert_file and client_key_file, or both",
                    c.agent
                )));
            }
            if let Some(o) = &c.oauth2 {
                let url_ok = url::Url::parse(&o.token_url)
                    .is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
                let secrets = [o.client_secret.is_some(), o.client_secret_env.is_some()];
                let signed = o.private_key_file.is_some()
                    || o.key_id.is_some()
                    || o.signing_alg.is_some()
                    || o.assertion_audience.is_some();
                let method_ok = match o.client_auth.as_deref() {
                    None | Some("basic" | "post") => secrets[0] != secrets[1] && !signed,
                    Some("private_key_jwt") => {
                        o.private_key_file.is_some() && secrets == [false, false]
                    }
                    Some(_) => false,
                };
                if !url_ok || !method_ok {
                    return Err(ConfigError::Invalid(format!(
                        "gateway.credentials for '{}': oauth2 needs an http(s) token_url, and client_auth basic or post (the default basic) with exactly one of client_secret and client_secret_env, or client_auth private_key_jwt with private_key_file (and key_id, signing_alg, assertion_audience if needed) and no secret",
                        c.agent
                    )));
                }
            }
        }
        pair("gateway.outbound", &o.client_cert_file, &o.client_key_file)?;
        self.outbound_policy().map(|_| ())
    }

    /// The guarded client this configuration describes, its TLS files
    /// read now (a file that does not load stops the start, named).
    pub fn outbound(&self) -> Result<crate::gateway::transport::Outbound, ConfigError> {
        let o = &self.outbound;
        let tls = crate::gateway::tls::TlsFiles {
            ca_file: o.ca_file.clone(),
            client_cert_file: o.client_cert_file.clone(),
            client_key_file: o.client_key_file.clone(),
        };
        crate::gateway::transport::Outbound::new(
            self.outbound_policy()?,
            crate::gateway::outbound::system_lookup(),
            tls,
        )
        .map_err(|e| ConfigError::Invalid(format!("gateway.outbound: {e}")))
    }
}

/// Whether a certificate and its key are both given; one without the
/// other is a configuration error.
fn pair(section: &str, cert: &Option<PathBuf>, key: &Option<PathBuf>) -> Result<bool, ConfigError> {
    match (cert, key) {
        (Some(_), Some(_)) => Ok(true),
        (None, None) => Ok(false),
        _ => Err(ConfigError::Invalid(format!(
            "{section}: client_cert_file and client_key_file go together"
        ))),
    }
}

pub use crate::consensus::cluster_auth::{ClusterAuthConfig, ClusterTlsConfig};
pub use crate::index::config::{DiscoveryConfig, EndpointConfig};
pub use crate::listener::{ConnectionLimits, TlsConfig};

/// One peer registry and how far it is trusted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// The peer's authority: every record it signs must name it.
    pub authority: String,
    /// The peer listener, `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// Pinned Ed25519 public keys (base64url), the only keys whose
    /// signatures are accepted from this peer.
    #[serde(default)]
    pub keys: Vec<String>,
    /// The peer's ARD API (e.g. `https://peer.example/ard`), named in ARD
    /// `referrals`; default: beside its `well_known` document.
    #[serde(default)]
    pub ard_url: Option<String>,
    /// Or: the peer's `/.well-known/agentry.json`, fetched on first start
    /// and pinned in the data directory (`peers/<authority>.json`); never
    /// fetched again while that file exists.
    #[serde(default)]
    pub well_known: Option<String>,
    /// Accept only agents with at least one of these tags (empty: any).
    #[serde(default)]
    pub accept_tags: Vec<String>,
    /// Accept only agent ids starting with one of these (empty: any).
    #[serde(default)]
    pub accept_namespaces: Vec<String>,
    /// Ask this peer in federated discovery.
    #[serde(default = "yes")]
    pub fan_out: bool,
    /// Follow this peer's change feed and keep its public records here.
    #[serde(default)]
    pub sync: bool,
    /// Hops this peer may take our requests further (0: it answers for
    /// itself only); at most `federation.max_hops - 1`.
    #[serde(default)]
    pub max_hops: Option<u32>,
    /// Live copies of this peer's records kept here at most (`sync`); a
    /// new record past it is refused until copies are withdrawn. Bounds
    /// what one peer can make every node store and index. 0: no limit.
    #[serde(default = "default_peer_records")]
    pub max_records: u64,
    /// PEM CA certificate that signed the peer's listener certificate
    /// (https endpoints; default: the bundled web PKI roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key for peers that require mutual TLS.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// Send this peer gzip-compressed requests, which asks it for
    /// compressed answers (an Agentry peer answers a compressed request
    /// compressed): for a peer across a WAN, where the records of
    /// discovery and the change feed cost more to carry than to compress.
    #[serde(default)]
    pub compress: bool,
}

fn yes() -> bool {
    true
}

fn default_peer_records() -> u64 {
    100_000
}

impl PeerConfig {
    /// A peer at `endpoint` with the defaults of the config file: no keys
    /// yet, no policy limits, in fan-out, not synced, no TLS files.
    pub fn new(authority: &str, endpoint: &str) -> Self {
        Self {
            authority: authority.into(),
            endpoint: endpoint.into(),
            keys: Vec::new(),
            ard_url: None,
            well_known: None,
            accept_tags: Vec::new(),
            accept_namespaces: Vec::new(),
            fan_out: true,
            sync: false,
            max_hops: None,
            max_records: default_peer_records(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            compress: false,
        }
    }
}

/// A host name as DNS writes it, in lowercase (RFC 1123): labels of 1–63
/// letters, digits and inner hyphens, at most 253 characters in all.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

impl FederationConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !(10..=60_000).contains(&self.deadline_ms) {
            return bad("federation.deadline_ms must be 10..=60000".into());
        }
        if !(1..=8).contains(&self.max_hops) {
            return bad("federation.max_hops must be 1..=8".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.peers {
            let name = &p.authority;
            if !is_dns_name(name) {
                return bad(format!(
                    "federation peer authority '{name}' must be a DNS name in lowercase \
                     (labels of a-z, 0-9 and '-', joined by dots): it names the peer's files in \
                     the data directory, and every record the peer signs must name it exactly"
                ));
            }
            if !seen.insert(name.clone()) {
                return bad(format!("federation peer '{name}' is listed twice"));
            }
            match url::Url::parse(&p.endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                _ => {
                    return bad(format!(
                        "federation peer '{name}': endpoint must be http(s)://host:port, not '{}'",
                        p.endpoint
                    ))
                }
            }
            match (&p.well_known, p.keys.is_empty()) {
                (None, true) => {
                    return bad(format!(
                        "federation peer '{name}': give pinned `keys` or a `well_known` URL"
                    ))
                }
                (Some(u), _) if url::Url::parse(u).is_err() => {
                    return bad(format!(
                        "federation peer '{name}': well_known '{u}' is not a URL"
                    ))
                }
                _ => {}
            }
            for k in &p.keys {
                if crate::crypto::keys::decode_public(k).is_err() {
                    return bad(format!(
                        "federation peer '{name}': '{k}' is not a base64url Ed25519 public key"
                    ));
                }
            }
            if p.max_hops.is_some_and(|h| h >= self.max_hops) {
                return bad(format!(
                    "federation peer '{name}': max_hops must be below federation.max_hops ({})",
                    self.max_hops
                ));
            }
            if p.client_cert_file.is_some() != p.client_key_file.is_some() {
                return bad(format!(
                    "federation peer '{name}': give both client_cert_file and client_key_file"
                ));
            }
        }
        Ok(())
    }
}

/// A list given either as an array of strings or as one string of
/// comma-separated items, so a value copied from the command line works.
fn list_or_commas<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Items;
    impl<'de> serde::de::Visitor<'de> for Items {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of strings or one comma-separated string")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(text
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_string)
                .collect())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<String>()? {
                items.push(item);
            }
            Ok(items)
        }
    }
    d.deserialize_any(Items)
}

/// Everything `agentry serve` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Raft node id of this node.
    pub node_id: u64,
    /// Where RocksDB, snapshots and the bootstrap admin key digest live.
    pub data_dir: PathBuf,
    /// Public gRPC listener.
    pub grpc_addr: SocketAddr,
    /// JSON/HTTP facade listener.
    pub http_addr: SocketAddr,
    /// Internal Raft listener (node-to-node traffic only).
    pub raft_addr: SocketAddr,
    /// Internal peer listener: registry-to-registry federation traffic
    /// (never Raft, which must not be reachable from another organisation).
    pub peer_addr: SocketAddr,
    /// host:port other nodes use to reach `raft_addr`. Default: this node's
    /// entry in `initial_members`, else `raft_addr` as bound.
    pub raft_advertise_addr: Option<String>,
    /// How a new cluster forms: "auto" (a single-node cluster, or the
    /// lowest id of `initial_members` initialises) or "manual" (wait for
    /// `agentry cluster init` or to be added).
    pub bootstrap: String,
    /// Static member list of a new cluster, "id=host:port" each: a TOML
    /// array, or one comma-separated string as `--initial-members` takes it.
    #[serde(deserialize_with = "list_or_commas")]
    pub initial_members: Vec<String>,
    /// Take the node id from the hostname's trailing ordinal ("agentry-2" is
    /// node 3), as in a Kubernetes StatefulSet.
    pub node_id_from_hostname: bool,
    /// Raft heartbeat interval, milliseconds.
    pub heartbeat_ms: u64,
    /// Minimum election timeout, milliseconds (the maximum is twice this).
    pub election_timeout_ms: u64,
    /// Log entries kept after a snapshot, for followers behind: one
    /// snapshot interval by default. Each costs about its record on disk,
    /// compressed, where a follower missing one more needs the whole state
    /// sent (at a million agents a 1.5 GB document and a re-index).
    pub snapshot_keep_logs: u64,
    /// Largest message on the internal Raft listener.
    pub raft_max_message_bytes: usize,
    /// How this node writes its Raft log and sends AppendEntries: "binary"
    /// (default), or "json", the encoding of versions before data format 3
    /// (for testing logs and clusters of both; either is always read).
    pub raft_encoding: crate::consensus::codec::Encoding,
    /// Testing only: allow `Cluster.SetFaults` to inject network faults.
    pub fault_injection: bool,
    /// Whether reads without an API key are allowed.
    pub anonymous_reads: bool,
    /// Largest accepted record (canonical JSON bytes).
    pub max_record_bytes: usize,
    /// URL schemes accepted for endpoints.
    pub allowed_schemes: Vec<String>,
    /// Revisions of change history kept for Watch.
    pub watch_history: u64,
    /// Log entries between snapshots (a refresh counts an eighth; 0: never).
    pub snapshot_logs: u64,
    /// Seconds between replica consistency checks, run by the leader
    /// (`service::consistency`); 0: only on demand.
    pub consistency_check_secs: u64,
    /// Seconds a unary request may take before it fails with a timeout.
    pub request_timeout_secs: u64,
    /// API keys besides the bootstrap admin key.
    pub api_keys: Vec<ApiKeyConfig>,
    /// TLS on the public listeners (gRPC and HTTP); `client_ca_file` lets
    /// clients present certificates. Without it they speak plain text (for
    /// development and loopback only).
    pub tls: Option<TlsConfig>,
    /// How nodes prove to each other that they belong to this cluster.
    pub cluster: ClusterAuthConfig,
    /// Connection limits of every listener.
    pub connections: ConnectionLimits,
    /// Token buckets per principal and per client address.
    pub rate_limits: crate::api::gate::RateLimitConfig,
    /// OIDC / JWT bearer tokens of one issuer.
    pub jwt: Option<crate::api::jwt::JwtConfig>,
    /// Client certificates (public listeners' mutual TLS) that name
    /// principals.
    pub client_certificates: Vec<crate::api::auth::CertPrincipal>,
    /// Tenants: the id namespaces their publishers may register.
    pub tenants: Vec<crate::service::TenantConfig>,
    /// Record quotas per owner, per tenant and per record.
    pub quotas: crate::service::QuotaConfig,
    /// The audit trail: retention and the JSON-lines copy.
    pub audit: crate::service::AuditConfig,
    /// The data directory's free-space reserve.
    pub storage: StorageConfig,
    /// Discovery: embedder and ranking weights.
    pub discovery: DiscoveryConfig,
    /// Signing identity: authority and key file.
    pub identity: IdentityConfig,
    /// Peer registries, trust policy and the peer listener's TLS.
    pub federation: FederationConfig,
    /// The invocation gateway and its outbound policy.
    pub gateway: GatewayConfig,
    /// The MCP Registry API: upstream registries mirrored
    /// (`[[mcp_registry.upstreams]]`).
    pub mcp_registry: crate::service::McpRegistryConfig,
    /// The MCP server at `/mcp`: the host names and browser origins it
    /// answers besides its defaults (DNS-rebinding protection).
    pub mcp: crate::api::mcp_origin::McpConfig,
    /// Browser pages of other origins that may call the HTTP API (CORS).
    pub cors: crate::api::http::CorsConfig,
    /// Register the demo directory (the MetaTool agents) on start.
    pub demo: bool,
    /// Bootstrap admin key (normally from `AGENTRY_ADMIN_KEY`).
    #[serde(skip)]
    pub admin_key: Option<String>,
}

/// `[storage]`: writes are refused (507) while the data directory's
/// filesystem has less than `reserve_bytes` free on top of the room a
/// compaction of the largest column family may take, so a full disk never
/// stops the Raft core (0 turns the check off); RocksDB's WAL is kept
/// below `max_wal_bytes`, which bounds what a restart writes before the
/// node serves. Keep the reserve above the WAL bound. Up to
/// `record_cache_bytes` of parsed records are kept for discovery's answers
/// (0: none).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub reserve_bytes: u64,
    pub max_wal_bytes: u64,
    pub record_cache_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            reserve_bytes: crate::storage::DEFAULT_RESERVE_BYTES,
            max_wal_bytes: crate::storage::DEFAULT_MAX_WAL_BYTES,
            record_cache_bytes: crate::storage::DEFAULT_RECORD_CACHE_BYTES,
        }
    }
}

impl StorageConfig {
    /// The free-space check of `data_dir` under these settings.
    pub fn space(&self, data_dir: &std::path::Path) -> crate::storage::DiskSpace {
        crate::storage::DiskSpace::new(data_dir, self.reserve_bytes, self.max_wal_bytes)
    }
}

impl Default for Config {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            node_id: 1,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            grpc_addr: DEFAULT_GRPC_ADDR.parse().expect("constant address parses"),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("constant address parses"),
            raft_addr: DEFAULT_RAFT_ADDR.parse().expect("constant address parses"),
            peer_addr: DEFAULT_PEER_ADDR.parse().expect("constant address parses"),
            raft_advertise_addr: None,
            bootstrap: "auto".into(),
            initial_members: Vec::new(),
            node_id_from_hostname: false,
            heartbeat_ms: 100,
            election_timeout_ms: 500,
            snapshot_keep_logs: 10_000,
            raft_max_message_bytes: 64 * 1024 * 1024,
            raft_encoding: Default::default(),
            fault_injection: false,
            anonymous_reads: true,
            max_record_bytes: limits.max_record_bytes,
            allowed_schemes: limits.allowed_schemes,
            watch_history: 100_000,
            snapshot_logs: 10_000,
            // Each check reads every record on every node: a few times a
            // day finds a corrupted member long before a failover relies
            // on it, at a cost that stays small at a million agents.
            consistency_check_secs: 6 * 3600,
            request_timeout_secs: 30,
            api_keys: Vec::new(),
            tls: None,
            cluster: ClusterAuthConfig::default(),
            connections: ConnectionLimits::default(),
            rate_limits: Default::default(),
            jwt: None,
            client_certificates: Vec::new(),
            tenants: Vec::new(),
            quotas: Default::default(),
            audit: Default::default(),
            storage: Default::default(),
            discovery: DiscoveryConfig::default(),
            identity: IdentityConfig::default(),
            federation: FederationConfig::default(),
            gateway: GatewayConfig::default(),
            mcp_registry: Default::default(),
            mcp: Default::default(),
            cors: Default::default(),
            demo: false,
            admin_key: None,
        }
    }
}

/// Configuration problems, reported before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("api key '{name}': {message}")]
    ApiKey { name: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Loads a TOML config file over the defaults.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source: Box::new(source),
        })
    }

    /// The static member list as id → address.
    pub fn members(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        let mut out = BTreeMap::new();
        for m in &self.initial_members {
            let bad =
                || ConfigError::Invalid(format!("initial_members entry '{m}' is not id=host:port"));
            let (id, addr) = m.split_once('=').ok_or_else(bad)?;
            let id: u64 = id.trim().parse().map_err(|_| bad())?;
            let addr = addr.trim();
            if id == 0 || !addr.contains(':') {
                return Err(bad());
            }
            if out.insert(id, addr.to_string()).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "initial_members lists node {id} twice"
                )));
            }
        }
        Ok(out)
    }

    /// Applies `node_id_from_hostname`: the trailing "-N" of `hostname`
    /// becomes node id N + 1 (ordinals start at 0, node ids at 1).
    pub fn resolve_node_id(&mut self, hostname: &str) -> Result<(), ConfigError> {
        if !self.node_id_from_hostname {
            return Ok(());
        }
        let ordinal = hostname
            .rsplit_once('-')
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "node_id_from_hostname: hostname '{hostname}' does not end in -<ordinal>"
                ))
            })?;
        self.node_id = ordinal + 1;
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_record_bytes: self.max_record_bytes,
            allowed_schemes: self.allowed_schemes.clone(),
            max_examples: self.quotas.max_examples_per_record,
        }
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_record_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "max_record_bytes must be at least 1024".into(),
            ));
        }
        // History is trimmed in steps of 1,024 revisions (`storage`), so a
        // smaller bound would not be what is kept.
        if self.watch_history < 1024 {
            return Err(ConfigError::Invalid(
                "watch_history must be at least 1024 (history is trimmed in steps of 1,024 revisions)"
                    .into(),
            ));
        }
        if self.node_id == 0 {
            return Err(ConfigError::Invalid("node_id must be at least 1".into()));
        }
        if !matches!(self.bootstrap.as_str(), "auto" | "manual") {
            return Err(ConfigError::Invalid(format!(
                "bootstrap must be 'auto' or 'manual', not '{}'",
                self.bootstrap
            )));
        }
        self.members()?;
        if self.heartbeat_ms == 0 || self.election_timeout_ms <= self.heartbeat_ms * 2 {
            return Err(ConfigError::Invalid(
                "election_timeout_ms must be more than twice heartbeat_ms (and heartbeat_ms > 0)"
                    .into(),
            ));
        }
        if self.raft_max_message_bytes < 4 * self.max_record_bytes {
            return Err(ConfigError::Invalid(
                "raft_max_message_bytes must be at least 4 × max_record_bytes".into(),
            ));
        }
        self.connections.validate().map_err(ConfigError::Invalid)?;
        self.rate_limits.validate().map_err(ConfigError::Invalid)?;
        if let Some(j) = &self.jwt {
            j.validate().map_err(ConfigError::Invalid)?;
        }
        if !self.client_certificates.is_empty()
            && self.tls.as_ref().is_none_or(|t| t.client_ca_file.is_none())
        {
            return Err(ConfigError::Invalid(
                "client_certificates need [tls] with client_ca_file".into(),
            ));
        }
        crate::service::Tenancy::validate(&self.tenants, &self.quotas)
            .map_err(ConfigError::Invalid)?;
        self.audit.validate().map_err(ConfigError::Invalid)?;
        self.discovery.validate().map_err(ConfigError::Invalid)?;
        self.federation.validate()?;
        self.gateway.validate()?;
        self.mcp_registry.validate().map_err(ConfigError::Invalid)?;
        self.mcp.validate().map_err(ConfigError::Invalid)?;
        self.cors.validate().map_err(ConfigError::Invalid)?;
        for k in &self.api_keys {
            let err = |m: &str| ConfigError::ApiKey {
                name: k.name.clone(),
                message: m.into(),
            };
            match (&k.key_sha256, &k.key) {
                (Some(d), None) if d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()) => {}
                (Some(_), None) => return Err(err("key_sha256 must be 64 hex digits")),
                (None, Some(key)) if key.len() >= 16 => {}
                (None, Some(_)) => return Err(err("key must be at least 16 characters")),
                _ => return Err(err("give exactly one of key_sha256 and key")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_overrides_defaults_and_rejects_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.toml");
        std::fs::write(&p, "anonymous_reads = false\n[[api_keys]]\nname = \"ci\"\nrole = \"publisher\"\nkey = \"0123456789abcdef\"\n").unwrap();
        let c = Config::from_file(&p).unwrap();
        assert!(!c.anonymous_reads);
        assert_eq!(c.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
        c.validate().unwrap();
        std::fs::write(&p, "anonymous_read = false\n").unwrap();
        assert!(Config::from_file(&p).is_err());
    }

    /// The keep-alive is set in `[connections]`, and a PING that could never
    /// be answered in time is refused naming the section operators write.
    #[test]
    fn keep_alive_settings_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.toml");
        std::fs::write(
            &p,
            "[connections]\nkeep_alive_interval_secs = 60\nkeep_alive_timeout_secs = 5\n",
        )
        .unwrap();
        let c = Config::from_file(&p).unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.connections.keep_alive_interval(),
            Some(std::time::Duration::from_secs(60))
        );
        assert_eq!(
            c.connections.keep_alive_timeout(),
            std::time::Duration::from_secs(5)
        );
        std::fs::write(&p, "[connections]\nkeep_alive_interval_secs = 0\n").unwrap();
        let c = Config::from_file(&p).unwrap();
        c.validate().unwrap();
        assert_eq!(c.connections.keep_alive_interval(), None, "0 turns it off");
        std::fs::write(&p, "[connections]\nkeep_alive_timeout_secs = 0\n").unwrap();
        let e = Config::from_file(&p).unwrap().validate().unwrap_err();
        assert!(
            e.to_string()
                .contains("[connections] keep_alive_timeout_secs"),
            "{e}"
        );
    }

    /// The gateway's TLS files: a certificate without its key is refused
    /// by name, a credential may be a certificate alone, and a file that
    /// does not load stops the start naming the file.
    #[test]
    fn gateway_tls_files_are_checked_together_and_loaded_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g.toml");
        let check = |text: &str| {
            std::fs::write(&p, text).unwrap();
            Config::from_file(&p).unwrap().validate()
        };
        let e = check("[gateway.outbound]\nclient_cert_file = \"c.pem\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("gateway.outbound: client_cert_file and client_key_file go together"),
            "{e}"
        );
        let e = check("[[gateway.credentials]]\nagent = \"a\"\nclient_key_file = \"k.pem\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("credentials for 'a'"), "{e}");
        let e = check("[[gateway.credentials]]\nagent = \"a\"\n").unwrap_err();
        assert!(e.to_string().contains("or client_cert_file"), "{e}");
        check("[[gateway.credentials]]\nagent = \"a\"\nclient_cert_file = \"c.pem\"\nclient_key_file = \"k.pem\"\n")
            .unwrap();

        let missing = dir.path().join("missing-ca.pem");
        let mut g = GatewayConfig::default();
        g.outbound.ca_file = Some(missing.clone());
        let e = g.outbound().err().expect("a missing CA file is refused");
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        g.outbound.ca_file = Some(garbage.clone());
        let e = g
            .outbound()
            .err()
            .expect("a CA file without certificates is refused");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        g.outbound.ca_file = None;
        g.outbound.client_cert_file = Some(garbage.clone());
        g.outbound.client_key_file = Some(garbage);
        assert!(
            g.outbound().is_err(),
            "a client certificate that is not PEM is refused"
        );
        g.outbound.client_cert_file = None;
        g.outbound.client_key_file = None;
        assert!(!g.outbound().unwrap().presents_certificate());
    }

    /// A credential's token source: one secret, a known client
    /// authentication, and no second value beside it.
    #[test]
    fn gateway_oauth2_credentials_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.toml");
        let check = |oauth2: &str, extra: &str| {
            let text = format!(
                "[[gateway.credentials]]\nagent = \"a*\"\n{extra}[gateway.credentials.oauth2]\ntoken_url = \"https://id.example/token\"\nclient_id = \"gw\"\n{oauth2}"
            );
            std::fs::write(&p, text).unwrap();
            Config::from_file(&p).unwrap().validate()
        };
        check("client_secret_env = \"S\"\nscopes = [\"a\", \"b\"]\n", "").unwrap();
        check("client_secret = \"s\"\nclient_auth = \"post\"\n", "").unwrap();
        let signed = "client_auth = \"private_key_jwt\"\nprivate_key_file = \"/k.pem\"\n";
        check(signed, "").unwrap();
        check(
            &format!("{signed}key_id = \"k1\"\nsigning_alg = \"PS256\"\n"),
            "",
        )
        .unwrap();
        for (oauth2, extra) in [
            ("client_secret = \"s\"\nclient_secret_env = \"S\"\n", ""),
            ("", ""),
            (
                "client_secret = \"s\"\nclient_auth = \"private_key_jwt\"\n",
                "",
            ),
            (
                "client_secret = \"s\"\nclient_auth = \"private_key_jwt\"\nprivate_key_file = \"/k.pem\"\n",
                "",
            ),
            ("client_secret = \"s\"\nprivate_key_file = \"/k.pem\"\n", ""),
            ("client_auth = \"tls_client_auth\"\n", ""),
            ("client_secret = \"s\"\n", "value = \"Bearer x\"\n"),
        ] {
            let e = check(oauth2, extra).unwrap_err();
            assert!(
                e.to_string().contains("credentials for 'a*'"),
                "{oauth2} {extra}: {e}"
            );
        }
    }

    #[test]
    fn mcp_upstreams_take_defaults_and_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.toml");
        std::fs::write(
            &p,
            "[[mcp_registry.upstreams]]\nurl = \"https://registry.modelcontextprotocol.io\"\n",
        )
        .unwrap();
        let c = Config::from_file(&p).unwrap();
        let u = &c.mcp_registry.upstreams[0];
        assert_eq!(
            (u.poll_interval_secs, u.owner.as_str(), u.page_limit),
            (300, "mcp-mirror", 100)
        );
        assert!(u.namespaces.is_empty());
        c.validate().unwrap();
        std::fs::write(
            &p,
            "[[mcp_registry.upstreams]]\nurl = \"https://up.example\"\npoll_interval_secs = 0\n",
        )
        .unwrap();
        assert!(Config::from_file(&p).unwrap().validate().is_err());
    }

    #[test]
    fn peer_authorities_are_lowercase_dns_names() {
        for good in ["b.example", "registry-2.corp.example", "localhost", "x1"] {
            assert!(is_dns_name(good), "{good}");
        }
        for bad in [
            "",
            "B.example",
            "../../etc",
            "b.example/",
            "b..example",
            "-b.example",
            "b-.example",
            "b example",
            "b_example",
            "b.example:8443",
        ] {
            assert!(!is_dns_name(bad), "{bad}");
        }
        assert!(!is_dns_name(&format!("{}.example", "a".repeat(64))));
        let mut c = Config::default();
        c.federation.peers = vec![PeerConfig::new("B.example", "http://127.0.0.1:1")];
        c.federation.peers[0].keys = vec!["key".into()];
        let e = c.validate().expect_err("an uppercase authority");
        assert!(e.to_string().contains("lowercase"), "{e}");
    }

    #[test]
    fn watch_history_below_the_trim_step_is_refused() {
        let mut c = Config {
            watch_history: 100,
            ..Default::default()
        };
        let e = c.validate().expect_err("below 1024");
        assert!(e.to_string().contains("watch_history"), "{e}");
        c.watch_history = 1024;
        c.validate().unwrap();
    }

    #[test]
    fn members_and_hostname_ordinals() {
        let mut c = Config {
            initial_members: vec!["1=a:1".into(), "2 = b:2".into(), "3=c:3".into()],
            node_id_from_hostname: true,
            ..Config::default()
        };
        c.resolve_node_id("agentry-2").unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(
            c.members().unwrap().get(&2).map(String::as_str),
            Some("b:2")
        );
        c.validate().unwrap();
        assert!(c.resolve_node_id("agentry").is_err());
        for bad in ["x=a:1", "0=a:1", "1=nohost", "1"] {
            c.initial_members = vec![bad.into()];
            assert!(c.members().is_err(), "{bad}");
        }
        c.initial_members = vec!["1=a:1".into(), "1=b:2".into()];
        assert!(c.members().is_err());
    }

    #[test]
    fn members_in_a_file_as_array_or_commas() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agentry.toml");
        for text in [
            "initial_members = [\"1=a:1\", \"2=b:2\"]\n",
            "initial_members = \"1=a:1, 2=b:2\"\n",
        ] {
            std::fs::write(&p, text).unwrap();
            let c = Config::from_file(&p).unwrap();
            assert_eq!(c.initial_members, ["1=a:1", "2=b:2"], "{text}");
            c.validate().unwrap();
        }
        std::fs::write(&p, "initial_members = 3\n").unwrap();
        assert!(Config::from_file(&p).is_err());
    }
}
