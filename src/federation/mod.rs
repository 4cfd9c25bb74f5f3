//! Peer registries of other organisations: who they are, which of their
//! keys this registry trusts (pinned), what of theirs it accepts (trust
//! policy), and the gRPC channel to each peer's listener. Everything a peer
//! sends is checked here before it is ranked or stored.

pub mod discover;
mod pin;
pub mod sync;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity as TlsIdentity};

use crate::config::{FederationConfig, PeerConfig};
use crate::crypto::keys::{decode_public, key_id};
use crate::crypto::signature::{signature_of, verify_served_with, Verified};
use crate::crypto::CryptoError;
use crate::domain::{AgentMetadata, AgentRecord, Envelope, Visibility, ENVELOPE_MEMBER};
use crate::pb::peering_client::PeeringClient;

pub use pin::pin_keys;

/// Largest peer answer accepted (a discovery answer or one feed event).
pub const MAX_PEER_MESSAGE: usize = 16 * 1024 * 1024;

/// Why something a peer sent was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no keys are pinned for {0} yet")]
    NoPinnedKeys(String),
    #[error("signed by key {key_id}, which is not pinned for {authority}")]
    UnpinnedKey { authority: String, key_id: String },
    #[error("signed by key {key_id} of {authority}, which {authority} has revoked")]
    RevokedKey { authority: String, key_id: String },
    #[error("{0}")]
    Signature(CryptoError),
    #[error("not a record: {0}")]
    Malformed(String),
    #[error("a private record")]
    Private,
    /// More relays, or more records of one origin, than the request
    /// allowed.
    #[error("{0}")]
    OutOfBounds(String),
    #[error("a record of {0} bytes, over this registry's limit of {1}")]
    TooLarge(usize, usize),
    #[error("outside the trust policy for {authority}: {why}")]
    Policy { authority: String, why: String },
}

impl Refusal {
    /// A metric label for the kind of refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoPinnedKeys(_)
            | Self::UnpinnedKey { .. }
            | Self::RevokedKey { .. }
            | Self::Signature(_) => "signature",
            Self::Malformed(_) => "malformed",
            Self::Private => "private",
            Self::OutOfBounds(_) => "out_of_bounds",
            Self::TooLarge(..) => "too_large",
            Self::Policy { .. } => "policy",
        }
    }
}

/// What a peer's records must satisfy besides their signature.
#[derive(Debug, Clone, Default)]
pub struct TrustPolicy {
    pub accept_tags: Vec<String>,
    pub accept_namespaces: Vec<String>,
}

impl TrustPolicy {
    fn check(&self, m: &AgentMetadata) -> Result<(), String> {
        if !self.accept_namespaces.is_empty()
            && !self
                .accept_namespaces
                .iter()
                .any(|n| m.id.starts_with(n.as_str()))
        {
            return Err(format!("id '{}' is outside the accepted namespaces", m.id));
        }
        if !self.accept_tags.is_empty()
            && !m
                .tags
                .iter()
                .any(|t| self.accept_tags.iter().any(|a| a.eq_ignore_ascii_case(t)))
        {
            return Err(format!("agent '{}' has none of the accepted tags", m.id));
        }
        Ok(())
    }
}

/// One peer registry.
pub struct Peer {
    pub authority: String,
    pub endpoint: String,
    /// Pinned keys by key id; set once pinning succeeded.
    keys: RwLock<HashMap<String, VerifyingKey>>,
    /// Key ids the peer has told us it revoked; never trusted again.
    revoked: RwLock<HashSet<String>>,
    /// Counts the revocations learned, so the sync can withdraw at once
    /// the copies a newly revoked key signed (`sync::follow_once`).
    revocations: tokio::sync::watch::Sender<u64>,
    policy: TrustPolicy,
    pub fan_out: bool,
    pub sync: bool,
    /// Further hops this peer may take our requests.
    pub hops: u32,
    /// Live copies of its records kept here at most (none: no limit).
    pub max_records: Option<u64>,
    channel: Channel,
    config: PeerConfig,
    /// Records of this peer whose signatures already verified.
    verified: Verified,
}

fn read_lock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Splits a served record into the stored form (metadata and envelope).
pub fn record_from_served(served: &Value) -> Result<AgentRecord, Refusal> {
    let Value::Object(obj) = served else {
        return Err(Refusal::Malformed("not a JSON object".into()));
    };
    let mut obj = obj.clone();
    let envelope = obj
        .remove(ENVELOPE_MEMBER)
        .ok_or_else(|| Refusal::Malformed("no registry envelope".into()))?;
    let envelope: Envelope =
        serde_json::from_value(envelope).map_err(|e| Refusal::Malformed(e.to_string()))?;
    let metadata: AgentMetadata = serde_json::from_value(Value::Object(obj))
        .map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(AgentRecord { metadata, envelope })
}

impl Peer {
    fn new(config: &PeerConfig, max_hops: u32) -> Result<Self, String> {
        let mut keys = HashMap::new();
        for k in &config.keys {
            let key = decode_public(k).map_err(|e| e.to_string())?;
            keys.insert(key_id(&key), key);
        }
        Ok(Self {
            authority: config.authority.clone(),
            endpoint: config.endpoint.clone(),
            keys: RwLock::new(keys),
            revoked: RwLock::default(),
            revocations: tokio::sync::watch::Sender::new(0),
            policy: TrustPolicy {
                accept_tags: config.accept_tags.clone(),
                accept_namespaces: config.accept_namespaces.clone(),
            },
            fan_out: config.fan_out,
            sync: config.sync,
            hops: config.max_hops.unwrap_or(max_hops.saturating_sub(1)),
            max_records: (config.max_records > 0).then_some(config.max_records),
            channel: channel(config)?,
            config: config.clone(),
            verified: Verified::default(),
        })
    }

    /// The peer's ARD API: as configured, else `/ard` beside its
    /// well-known document.
    pub fn ard_url(&self) -> Option<String> {
        if let Some(u) = &self.config.ard_url {
            return Some(u.trim_end_matches('/').to_string());
        }
        let well_known = self.config.well_known.as_deref()?;
        let base = well_known.strip_suffix("/.well-known/agentry.json")?;
        Some(format!("{base}/ard"))
    }

    /// The peer's client; with `compress`, requests go out gzip-compressed
    /// and gzip answers are read (inflated within the same message limit).
    pub fn client(&self) -> PeeringClient<Channel> {
        let client =
            PeeringClient::new(self.channel.clone()).max_decoding_message_size(MAX_PEER_MESSAGE);
        if self.config.compress {
            let gzip = tonic::codec::CompressionEncoding::Gzip;
            client.send_compressed(gzip).accept_compressed(gzip)
        } else {
            client
        }
    }

    /// Whether keys are pinned (pinning from a well-known URL may still be
    /// pending).
    pub fn pinned(&self) -> bool {
        !read_lock(&self.keys).is_empty()
    }

    fn pin(&self, keys: Vec<VerifyingKey>) {
        let mut pinned = write_lock(&self.keys);
        for k in keys {
            pinned.insert(key_id(&k), k);
        }
    }

    /// Everything this registry's acceptance of the peer's records
    /// depends on: pinned and revoked key ids, the trust policy and the
    /// record limit. When it differs from the one the copies were last
    /// listed under, the sync lists the peer again, so records signed by a
    /// newly pinned key (or refused under a lower limit) arrive and copies
    /// no longer accepted are withdrawn.
    pub fn trust_fingerprint(&self) -> String {
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v.dedup();
            v.join(",")
        };
        let keys = sorted(read_lock(&self.keys).keys().cloned().collect());
        let revoked = sorted(read_lock(&self.revoked).iter().cloned().collect());
        let tags = sorted(
            self.policy
                .accept_tags
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
        );
        let namespaces = sorted(self.policy.accept_namespaces.clone());
        let limit = self.max_records.unwrap_or(0);
        format!(
            "keys={keys}\nrevoked={revoked}\naccept_tags={tags}\naccept_namespaces={namespaces}\nmax_records={limit}\n"
        )
    }

    /// Takes note of the keys the peer says it revoked. Only revocations
    /// are learned this way: a peer can lower the trust in its keys, never
    /// raise it.
    pub fn learn(&self, info: &crate::pb::RegistryInfo) {
        if info.authority != self.authority {
            return;
        }
        let mut revoked = write_lock(&self.revoked);
        for k in info.keys.iter().filter(|k| k.state == "revoked") {
            if revoked.insert(k.key_id.clone()) {
                tracing::warn!(peer = %self.authority, key_id = %k.key_id, "peer revoked a key; its signatures are no longer accepted");
                self.revocations.send_modify(|n| *n += 1);
            }
        }
    }

    /// Changes whenever a revocation is learned (from any answer of the
    /// peer, a discovery one included).
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revocations.subscribe()
    }

    /// Checks a record the peer signed: its authority, a pinned key that
    /// is not revoked, the signature, public visibility and the trust
    /// policy. Returns the stored form.
    pub fn verify(&self, served: &Value) -> Result<AgentRecord, Refusal> {
        let sig = signature_of(served).map_err(Refusal::Signature)?;
        if sig.authority != self.authority {
            return Err(Refusal::Signature(CryptoError::WrongAuthority {
                claimed: sig.authority,
                expected: self.authority.clone(),
            }));
        }
        if read_lock(&self.revoked).contains(&sig.key_id) {
            return Err(Refusal::RevokedKey {
                authority: self.authority.clone(),
                key_id: sig.key_id,
            });
        }
        let key = {
            let keys = read_lock(&self.keys);
            if keys.is_empty() {
                return Err(Refusal::NoPinnedKeys(self.authority.clone()));
            }
            keys.get(&sig.key_id).copied()
        };
        let Some(key) = key else {
            return Err(Refusal::UnpinnedKey {
                authority: self.authority.clone(),
                key_id: sig.key_id,
            });
        };
        verify_served_with(served, &key, Some(&self.verified)).map_err(Refusal::Signature)?;
        let record = record_from_served(served)?;
        if record.envelope.visibility != Visibility::Public {
            return Err(Refusal::Private);
        }
        if !record.envelope.deleted {
            self.policy
                .check(&record.metadata)
                .map_err(|why| Refusal::Policy {
                    authority: self.authority.clone(),
                    why,
                })?;
        }
        Ok(record)
    }
}

/// A lazily connected channel to a peer's listener, with TLS for https
/// endpoints (the peer's CA, else the web PKI roots; a client certificate
/// when the peer requires mutual TLS).
fn channel(config: &PeerConfig) -> Result<Channel, String> {
    // HTTP/2 pings find a connection that died without a word (a NAT
    // entry dropped, a peer's host gone): the feed reconnects instead of
    // waiting on it for ever.
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone())
        .map_err(|e| format!("endpoint '{}': {e}", config.endpoint))?
        .connect_timeout(Duration::from_secs(3))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if config.endpoint.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &config.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read_file(ca)?));
        }
        if let (Some(cert), Some(key)) = (&config.client_cert_file, &config.client_key_file) {
            tls = tls.identity(TlsIdentity::from_pem(read_file(cert)?, read_file(key)?));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS for '{}': {e}", config.endpoint))?;
    }
    Ok(endpoint.connect_lazy())
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The configured peers and federation settings. Cheap to clone.
#[derive(Clone, Default)]
pub struct Peers {
    list: Arc<Vec<Arc<Peer>>>,
    pub deadline: Duration,
    pub max_hops: u32,
    /// Largest served record accepted from a peer: what this registry
    /// takes from its own clients, with room for the envelope.
    pub max_record_bytes: usize,
}

impl Peers {
    /// Builds the peers of `config`; keys from well-known URLs are pinned
    /// by [`pin_keys`] once the server runs. Records over
    /// `max_record_bytes` (as served) are refused from peers.
    pub fn new(config: &FederationConfig, max_record_bytes: usize) -> Result<Self, String> {
        let list = config
            .peers
            .iter()
            .map(|p| {
                Peer::new(p, config.max_hops)
                    .map(Arc::new)
                    .map_err(|e| format!("federation peer '{}': {e}", p.authority))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            list: Arc::new(list),
            deadline: Duration::from_millis(config.deadline_ms),
            max_hops: config.max_hops,
            max_record_bytes,
        })
    }

    pub fn all(&self) -> &[Arc<Peer>] {
        &self.list
    }

    pub fn get(&self, authority: &str) -> Option<&Arc<Peer>> {
        self.list.iter().find(|p| p.authority == authority)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::crypto::keys::{Identity, NewKey};
    use crate::crypto::signature::{served_form, sign_record};
    use crate::crypto::IdentityChange;

    pub(crate) fn identity(authority: &str) -> Identity {
        let key = NewKey::generate().unwrap();
        Identity::apply(
            None,
            &IdentityChange::Establish {
                authority: authority.into(),
                keys: vec![key],
                imported: false,
            },
            "2026-01-01T00:00:00Z",
        )
        .unwrap()
        .0
        .unwrap()
    }

    pub(crate) fn peer(authority: &str, keys: &Identity, policy: TrustPolicy) -> Peer {
        let config = PeerConfig {
            keys: keys.keys.iter().map(|k| k.public_key.clone()).collect(),
            accept_tags: policy.accept_tags,
            accept_namespaces: policy.accept_namespaces,
            ..PeerConfig::new(authority, "http://127.0.0.1:1")
        };
        Peer::new(&config, 2).unwrap()
    }

    pub(crate) fn signed(by: &Identity, id: &str, tags: &[&str]) -> Value {
        let mut r = AgentRecord {
            metadata: AgentMetadata {
                id: id.into(),
                name: "Weather".into(),
                description: "Forecasts".into(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
                ..Default::default()
            },
            envelope: Envelope {
                owner: "alice".into(),
                revision: 3,
                ..Default::default()
            },
        };
        sign_record(&by.signer().unwrap(), &mut r, "2026-01-02T00:00:00Z");
        served_form(&r)
    }

    #[tokio::test]
    async fn only_records_signed_by_a_pinned_unrevoked_key_of_the_peer_pass() {
        let b = identity("b.example");
        let other = identity("b.example");
        let c = identity("c.example");
        let p = peer("b.example", &b, TrustPolicy::default());
        let good = signed(&b, "urn:b:1", &["weather"]);
        assert_eq!(p.verify(&good).unwrap().metadata.id, "urn:b:1");

        let mut tampered = good.clone();
        tampered["description"] = "Steals data".into();
        assert!(matches!(
            p.verify(&tampered),
            Err(Refusal::Signature(CryptoError::BadSignature))
        ));
        assert!(matches!(
            p.verify(&signed(&other, "urn:b:1", &[])),
            Err(Refusal::UnpinnedKey { .. })
        ));
        assert!(matches!(
            p.verify(&signed(&c, "urn:b:1", &[])),
            Err(Refusal::Signature(CryptoError::WrongAuthority { .. }))
        ));

        let mut info = crate::pb::RegistryInfo {
            authority: "b.example".into(),
            ..Default::default()
        };
        info.keys.push(crate::pb::AuthorityKey {
            key_id: b.signing_key.clone(),
            state: "revoked".into(),
            ..Default::default()
        });
        p.learn(&info);
        assert!(matches!(p.verify(&good), Err(Refusal::RevokedKey { .. })));
    }

    #[tokio::test]
    async fn the_trust_policy_limits_namespaces_and_tags() {
        let b = identity("b.example");
        let p = peer(
            "b.example",
            &b,
            TrustPolicy {
                accept_tags: vec!["weather".into()],
                accept_namespaces: vec!["urn:b:".into()],
            },
        );
        assert!(p.verify(&signed(&b, "urn:b:1", &["weather"])).is_ok());
        assert!(matches!(
            p.verify(&signed(&b, "urn:x:1", &["weather"])),
            Err(Refusal::Policy { .. })
        ));
        assert!(matches!(
            p.verify(&signed(&b, "urn:b:2", &["finance"])),
            Err(Refusal::Policy { .. })
        ));
    }
}
