//! Proof that a Raft RPC comes from a member of this cluster. Nothing on the
//! internal listener — AppendEntries, Vote, InstallSnapshot, Forward — is
//! served to a caller without it: a snapshot carries the registry's signing
//! keys, and a forwarded write is executed as the principal the forwarding
//! node authenticated, so the forwarding node must be one of ours.
//!
//! Two ways to prove it:
//! - **Mutual TLS** with a cluster CA: the listener refuses handshakes
//!   without a certificate from the CA, and the sender's node id is checked
//!   against its certificate (the certificate must be valid for the host of
//!   that member's Raft address, the check a TLS client makes of a server).
//! - **A cluster secret**, where cluster TLS is not configured: every RPC
//!   carries an HMAC-SHA256, keyed by the secret, over the method, the
//!   sender's id, a timestamp and the message. The secret itself never
//!   crosses the network, a proof is bound to its message and expires after
//!   `MAX_SKEW`, and the MAC is compared in constant time. On a network where
//!   someone can read or alter traffic, use mutual TLS: the secret proves
//!   membership but does not encrypt.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::NodeId;
use crate::listener::{ClientAuth, FileStamps, Peer, ReloadingTls, TlsConfig};

/// The metadata key carrying a secret-mode proof.
pub const PROOF_METADATA: &str = "x-agentry-cluster-proof";
/// How far a proof's timestamp may be from the receiver's clock.
const MAX_SKEW: Duration = Duration::from_secs(300);
/// The file in the data directory holding a generated cluster secret.
pub const SECRET_FILE: &str = "cluster-secret";
/// Shortest secret accepted from an operator.
const MIN_SECRET_LEN: usize = 16;

/// Cluster authentication settings (`[cluster]` in the config file).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterAuthConfig {
    /// A file holding the cluster secret (e.g. a mounted Kubernetes
    /// secret). Joining nodes need the secret the cluster was created with.
    pub secret_file: Option<PathBuf>,
    /// The secret itself, from `AGENTRY_CLUSTER_SECRET` only (never the
    /// config file or a flag, which other users can read).
    #[serde(skip)]
    pub secret: Option<String>,
    /// Mutual TLS on the Raft listener; replaces the secret.
    pub tls: Option<ClusterTlsConfig>,
}

/// This node's certificate and the cluster CA, PEM files.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA every node's certificate comes from.
    pub ca_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterAuthError {
    #[error("cluster secret: {0}")]
    Secret(String),
    #[error("cluster TLS: {0}")]
    Tls(#[from] crate::listener::TlsError),
    #[error("cluster secret file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

type HmacSha256 = Hmac<Sha256>;

/// How this node proves itself and checks others. Cheap to clone.
#[derive(Clone)]
pub enum ClusterAuth {
    Tls(Arc<ClusterTls>),
    Secret(Arc<ClusterSecret>),
}

impl std::fmt::Debug for ClusterAuth {
    /// Names the kind only: the secret stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterAuth::Tls(_) => "ClusterAuth::Tls",
            ClusterAuth::Secret(_) => "ClusterAuth::Secret",
        })
    }
}

/// The shared secret, as a MAC keyed by it.
pub struct ClusterSecret {
    keyed: HmacSha256,
}

/// Cluster TLS: the server side (re-read from disk when the files change)
/// and the client side, rebuilt the same way; `generation` tells the
/// network to reconnect with the new client certificate.
pub struct ClusterTls {
    files: ClusterTlsConfig,
    server: Arc<ReloadingTls>,
    client: Mutex<ClientSide>,
}

struct ClientSide {
    config: tonic::transport::ClientTlsConfig,
    stamps: FileStamps,
    generation: u64,
}

fn client_tls(
    files: &ClusterTlsConfig,
) -> Result<tonic::transport::ClientTlsConfig, ClusterAuthError> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| crate::listener::TlsError::Read {
            path: p.into(),
            source,
        })
    };
    // Checked here so a bad file fails at start, not at the first RPC.
    crate::listener::roots(&files.ca_file)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&files.ca_file)?))
        .identity(Identity::from_pem(
            read(&files.cert_file)?,
            read(&files.key_file)?,
        )))
}

impl ClusterTls {
    fn load(files: ClusterTlsConfig) -> Result<Self, ClusterAuthError> {
        let server = ReloadingTls::load(
            TlsConfig {
                cert_file: files.cert_file.clone(),
                key_file: files.key_file.clone(),
                client_ca_file: Some(files.ca_file.clone()),
            },
            ClientAuth::Required,
        )?;
        let client = ClientSide {
            config: client_tls(&files)?,
            stamps: FileStamps::new(vec![
                files.cert_file.clone(),
                files.key_file.clone(),
                files.ca_file.clone(),
            ]),
            generation: 0,
        };
        Ok(Self {
            files,
            server,
            client: Mutex::new(client),
        })
    }

    /// The client configuration and its generation, re-read when the files
    /// changed (looked at no more than once a second).
    pub fn client(&self) -> (tonic::transport::ClientTlsConfig, u64) {
        let mut c = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stamps) = c.stamps.changed() {
            match client_tls(&self.files) {
                Ok(config) => {
                    tracing::info!(
                        "cluster TLS files changed; reconnecting with the new certificate"
                    );
                    c.config = config;
                    c.stamps.settle(stamps);
                    c.generation += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cluster TLS files changed but cannot be loaded; keeping the previous ones")
                }
            }
        }
        (c.config.clone(), c.generation)
    }
}

/// Reads a secret file: the first line, trimmed.
fn read_secret(path: &Path) -> Result<String, ClusterAuthError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterAuthError::Io {
        path: path.into(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// What `resolve` decided, for the operator's log.
#[derive(Debug, PartialEq, Eq)]
pub enum SecretSource {
    Tls,
    Configured,
    Stored,
    /// Generated now and stored at this path.
    Generated(PathBuf),
}

impl ClusterAuth {
    /// Cluster TLS if configured; else the configured secret
    /// (`AGENTRY_CLUSTER_SECRET`, else `secret_file`); else the one stored
    /// in the data directory. `None` when there is none and this node may
    /// found a cluster on its own (`may_generate`): [`Self::generate`] makes
    /// one once the node starts. Only reads, so a configuration can be
    /// checked without touching the data directory.
    pub fn resolve(
        config: &ClusterAuthConfig,
        data_dir: &Path,
        may_generate: bool,
    ) -> Result<Option<(Self, SecretSource)>, ClusterAuthError> {
        if let Some(tls) = &config.tls {
            return Ok(Some((
                ClusterAuth::Tls(Arc::new(ClusterTls::load(tls.clone())?)),
                SecretSource::Tls,
            )));
        }
        let configured = match (&config.secret, &config.secret_file) {
            (Some(s), _) => Some(s.trim().to_string()),
            (None, Some(p)) => Some(read_secret(p)?),
            (None, None) => None,
        };
        if let Some(secret) = configured {
            if secret.len() < MIN_SECRET_LEN {
                return Err(ClusterAuthError::Secret(format!(
                    "must be at least {MIN_SECRET_LEN} characters"
                )));
            }
            return Ok(Some((
                Self::from_secret(&secret)?,
                SecretSource::Configured,
            )));
        }
        let stored = data_dir.join(SECRET_FILE);
        if stored.exists() {
            let secret = read_secret(&stored)?;
            if secret.len() >= MIN_SECRET_LEN {
                return Ok(Some((Self::from_secret(&secret)?, SecretSource::Stored)));
            }
        }
        if !may_generate {
            return Err(ClusterAuthError::Secret(
                "a node of a multi-node cluster needs the cluster's secret \
                 (AGENTRY_CLUSTER_SECRET or --cluster-secret-file, the same on every node) \
                 or cluster TLS (--cluster-tls-cert/--cluster-tls-key/--cluster-tls-ca)"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// A new secret, stored in the data directory for the next start.
    pub fn generate(data_dir: &Path) -> Result<(Self, SecretSource), ClusterAuthError> {
        let stored = data_dir.join(SECRET_FILE);
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| ClusterAuthError::Secret(e.to_string()))?;
        let secret = crate::crypto::hex(&bytes);
        write_private(&stored, &secret).map_err(|source| ClusterAuthError::Io {
            path: stored.clone(),
            source,
        })?;
        Ok((Self::from_secret(&secret)?, SecretSource::Generated(stored)))
    }

    pub fn from_secret(secret: &str) -> Result<Self, ClusterAuthError> {
        let keyed = HmacSha256::new_from_slice(secret.as_bytes())
            .map_err(|e| ClusterAuthError::Secret(e.to_string()))?;
        Ok(ClusterAuth::Secret(Arc::new(ClusterSecret { keyed })))
    }

    /// The server side of the Raft listener's TLS, if any.
    pub fn server_tls(&self) -> Option<Arc<ReloadingTls>> {
        match self {
            ClusterAuth::Tls(t) => Some(t.server.clone()),
            ClusterAuth::Secret(_) => None,
        }
    }

    /// Adds this node's proof to an outgoing RPC (secret mode; with TLS the
    /// connection itself is the proof).
    pub fn prove(&self, metadata: &mut MetadataMap, method: &str, from: NodeId, payload: &[u8]) {
        if let ClusterAuth::Secret(s) = self {
            let ts = unix_now();
            let mac = s.mac(method, from, ts, payload).finalize().into_bytes();
            let proof = format!("{ts}.{}", crate::crypto::hex(&mac));
            if let Ok(v) = proof.parse() {
                metadata.insert(PROOF_METADATA, v);
            }
        }
    }

    /// Checks an incoming RPC. `member_addr` is the Raft address the
    /// receiver knows for `from`, if it knows one. Refusals are
    /// UNAUTHENTICATED and say why without revealing anything secret.
    pub fn check(
        &self,
        metadata: &MetadataMap,
        peer: Option<&Peer>,
        method: &str,
        from: NodeId,
        payload: &[u8],
        member_addr: Option<&str>,
    ) -> Result<(), Status> {
        match self {
            ClusterAuth::Secret(s) => s.check(metadata, method, from, payload),
            ClusterAuth::Tls(_) => {
                let Some(cert) = peer.and_then(|p| p.client_cert.as_ref()) else {
                    return Err(Status::unauthenticated(
                        "the Raft listener requires a client certificate from the cluster CA",
                    ));
                };
                let Some(addr) = member_addr else {
                    // Not (yet) a member here: the CA-issued certificate is
                    // the proof, as for a node being added.
                    return Ok(());
                };
                let host = host_of(addr);
                let name =
                    rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|_| {
                        Status::unauthenticated(format!(
                            "node {from}'s address {addr} has no usable host name"
                        ))
                    })?;
                let parsed = rustls::server::ParsedCertificate::try_from(cert)
                    .map_err(|e| Status::unauthenticated(format!("bad client certificate: {e}")))?;
                rustls::client::verify_server_name(&parsed, &name).map_err(|_| {
                    Status::unauthenticated(format!(
                        "the client certificate is not valid for {host}, node {from}'s address"
                    ))
                })
            }
        }
    }
}

impl ClusterSecret {
    fn mac(&self, method: &str, from: NodeId, ts: u64, payload: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(b"agentry-raft-v1\0");
        mac.update(method.as_bytes());
        mac.update(b"\0");
        mac.update(&from.to_be_bytes());
        mac.update(&ts.to_be_bytes());
        mac.update(payload);
        mac
    }

    fn check(
        &self,
        metadata: &MetadataMap,
        method: &str,
        from: NodeId,
        payload: &[u8],
    ) -> Result<(), Status> {
        let proof = metadata
            .get(PROOF_METADATA)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "no cluster proof: this listener serves cluster members only",
                )
            })?;
        let bad = || Status::unauthenticated("invalid cluster proof");
        let (ts, mac) = proof.split_once('.').ok_or_else(bad)?;
        let ts: u64 = ts.parse().map_err(|_| bad())?;
        let mac = crate::crypto::unhex(mac).ok_or_else(bad)?;
        if unix_now().abs_diff(ts) > MAX_SKEW.as_secs() {
            return Err(Status::unauthenticated(format!(
                "cluster proof expired or from the future (more than {}s apart; are the nodes' clocks synchronised?)",
                MAX_SKEW.as_secs()
            )));
        }
        self.mac(method, from, ts, payload)
            .verify_slice(&mac)
            .map_err(|_| bad())
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The host part of `host:port` (IPv6 in brackets allowed).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Writes a secret readable by the owner only.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_proof(auth: &ClusterAuth, method: &str, from: NodeId, payload: &[u8]) -> MetadataMap {
        let mut m = MetadataMap::new();
        auth.prove(&mut m, method, from, payload);
        m
    }

    #[test]
    fn secret_proofs_bind_method_sender_and_message() {
        let a = ClusterAuth::from_secret("0123456789abcdef-cluster").unwrap();
        let m = with_proof(&a, "forward", 2, b"{\"Write\":1}");
        a.check(&m, None, "forward", 2, b"{\"Write\":1}", None)
            .unwrap();
        for (method, from, payload) in [
            ("vote", 2, &b"{\"Write\":1}"[..]),
            ("forward", 3, &b"{\"Write\":1}"[..]),
            ("forward", 2, &b"{\"Write\":2}"[..]),
        ] {
            let e = a.check(&m, None, method, from, payload, None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        let other = ClusterAuth::from_secret("another-cluster-secret-xyz").unwrap();
        let e = other
            .check(&m, None, "forward", 2, b"{\"Write\":1}", None)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = a
            .check(&MetadataMap::new(), None, "forward", 2, b"", None)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn stale_proofs_are_refused() {
        let a = ClusterAuth::from_secret("0123456789abcdef-cluster").unwrap();
        let ClusterAuth::Secret(s) = &a else {
            unreachable!()
        };
        let ts = unix_now() - MAX_SKEW.as_secs() - 5;
        let mac = s.mac("vote", 1, ts, b"x").finalize().into_bytes();
        let mut m = MetadataMap::new();
        m.insert(
            PROOF_METADATA,
            format!("{ts}.{}", crate::crypto::hex(&mac))
                .parse()
                .unwrap(),
        );
        assert!(a.check(&m, None, "vote", 1, b"x", None).is_err());
    }

    #[test]
    fn resolve_prefers_configuration_then_the_stored_secret() {
        let dir = tempfile::tempdir().unwrap();
        let none = ClusterAuthConfig::default();
        assert!(ClusterAuth::resolve(&none, dir.path(), false).is_err());
        assert!(ClusterAuth::resolve(&none, dir.path(), true)
            .unwrap()
            .is_none());
        assert!(
            !dir.path().join(SECRET_FILE).exists(),
            "resolving only reads"
        );
        let (_, src) = ClusterAuth::generate(dir.path()).unwrap();
        assert_eq!(src, SecretSource::Generated(dir.path().join(SECRET_FILE)));
        let (_, src) = ClusterAuth::resolve(&none, dir.path(), false)
            .unwrap()
            .unwrap();
        assert_eq!(src, SecretSource::Stored);
        let short = ClusterAuthConfig {
            secret: Some("short".into()),
            ..Default::default()
        };
        assert!(ClusterAuth::resolve(&short, dir.path(), true).is_err());
        assert_eq!(host_of("[::1]:9000"), "::1");
        assert_eq!(host_of("agentry-0.agentry:8472"), "agentry-0.agentry");
    }
}
