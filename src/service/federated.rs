//! Federation use cases: discovery across peer registries (ADP federation
//! with provenance), answering peers' discovery and feed requests, and
//! keeping the records a peer's feed brings.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, instrument};

use super::discovery::{candidate, ranking_query};
use super::registry::{hung_up_or_shut_down, Consistency, RegistryService, STREAM_BUFFER};
use super::ServiceError;
use crate::consensus::{Command, CommandResult, Role};
use crate::domain::discovery::{DiscoveryRequest, DiscoveryResult, Scope};
use crate::domain::federation::{decide_federated, FederatedChange};
use crate::domain::write::Rejection;
use crate::domain::{AgentRecord, Change, Principal, Provenance, Visibility};
use crate::federation::discover::{fan_out, Outbound, Remote};
use crate::index::Query;
use crate::storage::FollowEnd;

type Result<T> = std::result::Result<T, ServiceError>;

/// What this registry answers a peer's discovery: its own public records
/// and, hops permitting, its peers' verified ones.
pub struct PeerAnswer {
    pub own: Vec<AgentRecord>,
    pub relayed: Vec<Remote>,
    pub warnings: Vec<String>,
}

/// One event of the public feed peers follow.
#[derive(Debug)]
pub enum FeedEvent {
    /// A public record of this registry (a tombstone for a deletion).
    Record {
        record: Box<AgentRecord>,
        listing: bool,
    },
    /// A record that stopped being public.
    Withdrawn { id: String, revision: u64 },
    /// A full listing is complete as of `revision`.
    ListingDone { revision: u64 },
}

pub type FeedStream = Pin<Box<dyn Stream<Item = Result<FeedEvent>> + Send>>;

/// A pool member of a federated discovery.
struct Pooled {
    record: Arc<AgentRecord>,
    provenance: Option<Provenance>,
}

impl Pooled {
    /// A peer's answer in discovery: the record as its origin signed it
    /// (a synced copy carries the origin's envelope instead).
    fn is_remote(&self) -> bool {
        self.provenance
            .as_ref()
            .is_some_and(|p| p.origin_envelope.is_null())
    }

    fn origin_revision(&self) -> u64 {
        self.provenance
            .as_ref()
            .filter(|p| !p.origin_envelope.is_null())
            .map_or(self.record.envelope.revision, |p| p.origin_revision)
    }
}

/// The pool key a record is ranked under (unique within one pool).
fn pool_key(i: usize) -> String {
    format!("{POOL_KEY}{i}")
}

/// The pool member a key names.
fn pool_index(key: &str) -> Option<usize> {
    key.strip_prefix(POOL_KEY)?.parse().ok()
}

const POOL_KEY: &str = "\u{1}pool-";

impl RegistryService {
    /// This registry's authority ("" until the identity is established).
    pub fn own_authority(&self) -> String {
        self.reader()
            .identity()
            .map(|i| i.authority)
            .unwrap_or_default()
    }

    pub fn is_leader(&self) -> bool {
        self.node().status().role == Role::Leader
    }

    /// Keeps one change of `peer`'s feed; the inner error says why the
    /// registry's rules refused it (older than the copy, id held by
    /// someone else, the peer's copies at `quota`), which is no failure of
    /// the follower.
    #[instrument(skip_all, fields(peer, agent_id = change.id()))]
    pub async fn keep_federated(
        &self,
        peer: &str,
        change: FederatedChange,
        cursor: Option<u64>,
        quota: Option<u64>,
    ) -> Result<std::result::Result<Change, Rejection>> {
        let command = Command::Federate {
            peer: peer.to_string(),
            change,
            cursor,
            quota,
            now: crate::domain::time::now(),
            rules: 0,
        };
        match self.node().write(command).await? {
            CommandResult::Applied(c) => Ok(Ok(Arc::unwrap_or_clone(c))),
            CommandResult::Rejected(r) => Ok(Err(r)),
            other => Err(ServiceError::Internal(format!(
                "a federation command produced {other:?}"
            ))),
        }
    }

    /// Moves the replicated cursor `name` (a peer's authority, or an
    /// upstream the MCP mirror reads) forward to `value`; it never moves
    /// back, so a late or repeated call is harmless.
    #[instrument(skip(self))]
    pub async fn advance_cursor(&self, name: &str, value: u64) -> Result<()> {
        let command = Command::Cursor {
            name: name.to_string(),
            value,
            now: crate::domain::time::now(),
        };
        match self.node().write(command).await? {
            CommandResult::Internal => Ok(()),
            other => Err(ServiceError::Internal(format!(
                "a cursor command produced {other:?}"
            ))),
        }
    }

    /// The live copies kept from peers: (origin authority, id, the
    /// origin's revision of the copy).
    pub fn federated_copies(&self) -> Result<Vec<(String, String, u64)>> {
        Ok(self.reader().federated_copies()?)
    }

    /// Whether `change` from `peer` would change what is stored, by the
    /// rules every node applies (the stored state may move on before it
    /// is applied; then the rules decide again).
    pub fn federated_change_applies(&self, peer: &str, change: &FederatedChange) -> Result<bool> {
        let Some(id) = change.id() else {
            return Ok(false);
        };
        let current = self.reader().get(id)?;
        Ok(decide_federated(
            current.as_ref(),
            peer,
            change.clone(),
            0,
            "",
            crate::consensus::APPLY_RULES,
        )
        .is_ok())
    }

    /// ADP discovery over this registry and its peers: local candidates
    /// and verified remote ones, ranked together by this registry's ranker
    /// (scores of other services are never compared), the same agent seen
    /// several ways merged, and every peer problem a warning.
    #[instrument(skip_all, fields(principal = principal.map(|p| p.name.as_str())))]
    pub(super) async fn discover_federated(
        &self,
        principal: Option<&Principal>,
        request: DiscoveryRequest,
    ) -> Result<DiscoveryResult> {
        self.require_reader(principal)?;
        let plan = request.clone().plan()?;
        let mut warnings = self.discovery_warnings(&plan).await?;
        let vector = self.query_vector(&plan.query, &mut warnings).await;
        let now = time::OffsetDateTime::now_utc();
        let query = |vector| ranking_query(&plan, principal, now, vector);
        let own = self.own_authority();
        let peers = self.peers();
        let (local, asked) = tokio::join!(
            async { self.index().search(query(vector.clone())) },
            fan_out(
                peers,
                Outbound {
                    request: &request,
                    hops_left: peers.max_hops.saturating_sub(1),
                    visited: &[],
                    own_authority: &own,
                    deadline: peers.deadline,
                },
            )
        );
        if peers.all().iter().all(|p| !p.fan_out) {
            warnings.push(
                "no peer registry is configured for fan-out; only this registry was searched"
                    .into(),
            );
        }
        warnings.extend(asked.warnings);

        // One pool member per (origin authority, id): the freshest copy,
        // with every route it came by.
        let mut pool: Vec<Pooled> = Vec::new();
        let mut by_origin: HashMap<(String, String), usize> = HashMap::new();
        let mut add = |p: Pooled| {
            let origin = p
                .provenance
                .as_ref()
                .map_or_else(|| own.clone(), |v| v.origin_authority.clone());
            let key = (origin, p.record.metadata.id.clone());
            match by_origin.get(&key) {
                Some(&i) => {
                    let kept = &mut pool[i];
                    let via: Vec<String> = p
                        .provenance
                        .as_ref()
                        .map(|v| v.via.clone())
                        .unwrap_or_default();
                    // On a tie the origin's own form wins over a copy: its
                    // record verifies with the origin's key as it is.
                    let newer = p.origin_revision() > kept.origin_revision();
                    let same = p.origin_revision() == kept.origin_revision();
                    if newer || (same && p.is_remote() && !kept.is_remote()) {
                        *kept = p;
                    }
                    if let Some(k) = kept.provenance.as_mut() {
                        for v in via {
                            if !k.via.contains(&v) {
                                k.via.push(v);
                            }
                        }
                    }
                }
                None => {
                    by_origin.insert(key, pool.len());
                    pool.push(p);
                }
            }
        };
        for hit in &local {
            if let Some(r) = self.reader().get(&hit.id)?.filter(|r| !r.envelope.deleted) {
                add(Pooled {
                    provenance: r.envelope.provenance.clone(),
                    record: Arc::new(r),
                });
            }
        }
        for remote in asked.remotes {
            if self.withdrawn_here(&remote)? {
                continue;
            }
            add(Pooled {
                record: Arc::new(remote.record),
                provenance: Some(remote.provenance),
            });
        }
        // This registry's agents are ranked by the expiry their lease gives
        // them, as in a local search (the copy is the pool's alone).
        let lease_of = |p: &Pooled| -> Option<i64> {
            match p.provenance {
                None => self.reader().leases().expiry_unix(&p.record.metadata.id),
                Some(_) => None,
            }
        };
        let keyed: Vec<AgentRecord> = pool
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut r = AgentRecord::clone(&p.record);
                r.metadata.id = pool_key(i);
                if let Some(t) = lease_of(p) {
                    r.metadata.expires_at = time::OffsetDateTime::from_unix_timestamp(t)
                        .ok()
                        .map(crate::domain::time::format);
                }
                r
            })
            .collect();
        let hits = self.index().rank_pool(&keyed, query(vector)).await;
        let real_id = |key: &str| -> Option<String> {
            pool_index(key)
                .and_then(|i| pool.get(i))
                .map(|p| p.record.metadata.id.clone())
        };
        let mut candidates = Vec::with_capacity(hits.len());
        for mut hit in hits {
            let Some(member) = pool_index(&hit.id).and_then(|i| pool.get(i)) else {
                continue;
            };
            if let Some(d) = hit.duplicate_of.take() {
                let original = real_id(&d).unwrap_or(d.clone());
                for n in &mut hit.notes {
                    *n = n.replace(&d, &original);
                }
                hit.duplicate_of = Some(original);
            }
            hit.id = member.record.metadata.id.clone();
            hit.lease_expires_unix = lease_of(member);
            for note in &hit.notes {
                warnings.push(format!("candidate '{}': {note}", hit.id));
            }
            // A remote record's owner is a principal of another registry;
            // a local one of the same name owns nothing of it.
            let viewer = if member.is_remote() {
                principal.filter(|p| p.role == crate::domain::Role::Admin)
            } else {
                principal
            };
            let mut c = candidate(hit, &member.record, plan.detail, viewer);
            c.provenance = member.provenance.clone();
            candidates.push(c);
        }
        debug!(
            candidates = candidates.len(),
            pool = pool.len(),
            "discovered across peers"
        );
        Ok(self.discovery_result(plan, now, candidates, warnings, Scope::Federated))
    }

    /// Whether the sync holds a withdrawal or the origin's deletion of
    /// `remote`, as new as it or newer: a peer answering with an older
    /// copy does not bring it back.
    fn withdrawn_here(&self, remote: &Remote) -> Result<bool> {
        let Some(stored) = self.reader().get(&remote.record.metadata.id)? else {
            return Ok(false);
        };
        Ok(stored.envelope.deleted
            && stored.envelope.provenance.as_ref().is_some_and(|p| {
                p.origin_authority == remote.provenance.origin_authority
                    && p.origin_revision >= remote.provenance.origin_revision
            }))
    }

    /// Discovery on behalf of a peer: public records only, this registry's
    /// own, plus (while hops are left) what its peers return, verified.
    #[instrument(skip_all, fields(hops_left, visited = visited.len()))]
    pub async fn answer_peer(
        &self,
        request: DiscoveryRequest,
        hops_left: u32,
        visited: Vec<String>,
        deadline: Duration,
    ) -> Result<PeerAnswer> {
        let plan = request.clone().plan()?;
        self.read_barrier(Consistency::Local).await?;
        let mut warnings = Vec::new();
        let vector = self.query_vector(&plan.query, &mut warnings).await;
        let hits = self.index().search(Query {
            text: &plan.query,
            vector,
            filters: &plan.filters,
            preferred_tags: &plan.preferred_tags,
            limit: plan.limit as usize,
            evidence: false,
            principal: None,
            now_unix: time::OffsetDateTime::now_utc().unix_timestamp(),
            leases: None,
        });
        let mut own = Vec::with_capacity(hits.len());
        for hit in hits {
            if let Some(r) = self.reader().get(&hit.id)? {
                if r.shared_with_peers() && !r.envelope.deleted {
                    own.push(r);
                }
            }
        }
        let mut relayed = Vec::new();
        if hops_left > 0 {
            let authority = self.own_authority();
            // Leave the asker time to receive what this registry relays.
            let deadline = self.peers().deadline.min(deadline * 3 / 4);
            let asked = fan_out(
                self.peers(),
                Outbound {
                    request: &request,
                    hops_left: hops_left - 1,
                    visited: &visited,
                    own_authority: &authority,
                    deadline,
                },
            )
            .await;
            for remote in asked.remotes {
                if !self.withdrawn_here(&remote)? {
                    relayed.push(remote);
                }
            }
            warnings.extend(asked.warnings);
        }
        Ok(PeerAnswer {
            own,
            relayed,
            warnings,
        })
    }

    /// The public change feed for peers, from `from` on. When history no
    /// longer reaches back that far, or forward (or `from` is 0), it
    /// starts with a full listing of the shared records.
    pub async fn public_feed(&self, from: u64) -> Result<FeedStream> {
        let reader = self.reader().clone();
        // A follower asking from beyond this node's revision has seen a
        // history this node has not: either this node lags its cluster
        // (caught up here, with a quorum-confirmed read), or the history
        // is gone, the registry restored from a backup. Then the follower
        // gets a full listing, and what it kept that the listing lacks is
        // withdrawn.
        if from > reader.applied_revision() + 1 {
            self.read_barrier(Consistency::Linearizable).await?;
        }
        let live = reader.subscribe();
        let listing =
            from == 0 || from < reader.oldest_revision() || from > reader.applied_revision() + 1;
        let (tx, rx) = mpsc::channel::<Result<FeedEvent>>(STREAM_BUFFER);
        let shutdown = self.shutdown_signal();
        tokio::spawn(async move {
            let stop = hung_up_or_shut_down(&tx, shutdown);
            let mut stop = std::pin::pin!(stop);
            let mut next = from;
            if listing {
                let at = reader.applied_revision();
                match send_listing(&reader, &tx, stop.as_mut()).await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                if tx
                    .send(Ok(FeedEvent::ListingDone { revision: at }))
                    .await
                    .is_err()
                {
                    return;
                }
                next = at + 1;
            }
            let sink = |c: Arc<Change>| {
                let tx = tx.clone();
                async move {
                    let event = if c.record.envelope.provenance.is_some() {
                        return true;
                    } else if c.record.envelope.visibility == Visibility::Public {
                        FeedEvent::Record {
                            record: Box::new(Arc::unwrap_or_clone(c).record),
                            listing: false,
                        }
                    } else if c.unshared != Some(false) {
                        FeedEvent::Withdrawn {
                            id: c.record.metadata.id.clone(),
                            revision: c.revision,
                        }
                    } else {
                        // Private before and after: peers never saw it.
                        return true;
                    };
                    tx.send(Ok(event)).await.is_ok()
                }
            };
            let error = match reader.follow(live, next, stop, sink).await {
                FollowEnd::Stopped => return,
                FollowEnd::Compacted { requested, oldest } => {
                    ServiceError::RevisionCompacted { requested, oldest }
                }
                FollowEnd::Failed(e) => e.into(),
            };
            let _ = tx.send(Err(error)).await;
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// Records read from storage per step of a listing.
const LISTING_PAGE: usize = 128;

/// Sends every record shared with peers, in id order, a page at a time:
/// a page is read on a blocking thread and sent from here, so a peer that
/// reads slowly (or not at all) holds no thread and no RocksDB iterator,
/// only the page and its stream's buffer. Pages are read as storage is
/// then, so a record may come at a revision past the one the listing
/// reports; the feed that follows repeats changes from that revision on,
/// which the follower finds stale, so it never goes back to an older
/// version. False when the follower hung up or the server shuts down.
async fn send_listing(
    reader: &crate::storage::Reader,
    tx: &mpsc::Sender<Result<FeedEvent>>,
    mut stop: Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<bool> {
    let mut start = Some(String::new());
    while let Some(from) = start.take() {
        let page_reader = reader.clone();
        let (shared, rest) = tokio::task::spawn_blocking(move || {
            let mut shared = Vec::new();
            let mut visited = 0;
            let mut rest = None;
            page_reader.scan_from(&from, |r| {
                if visited == LISTING_PAGE {
                    rest = Some(r.metadata.id);
                    return false;
                }
                visited += 1;
                if r.shared_with_peers() {
                    shared.push(r);
                }
                true
            })?;
            Ok::<_, ServiceError>((shared, rest))
        })
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))??;
        for record in shared {
            let event = Ok(FeedEvent::Record {
                record: Box::new(record),
                listing: true,
            });
            let sent = tokio::select! {
                sent = tx.send(event) => sent.is_ok(),
                _ = stop.as_mut() => false,
            };
            if !sent {
                return Ok(false);
            }
        }
        start = rest;
    }
    Ok(true)
}
