//! Federation sync: following a peer's public change feed and keeping its
//! records here, read-only and with provenance. Runs on every node but acts
//! only on the leader; the cursor is replicated with each record, so a new
//! leader, or the same one after a restart, resumes exactly where the
//! feed was left.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

use super::pin::{listed_file, write_file};
use super::{Peer, Peers, Refusal};
use crate::domain::federation::FederatedChange;
use crate::domain::write::Rejection;
use crate::domain::ChangeKind;
use crate::domain::Provenance;
use crate::pb;
use crate::service::{RegistryService, ServiceError};

/// Pause before reconnecting, doubling up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How often a node that is not the leader checks again.
const LEADER_POLL: Duration = Duration::from_millis(500);

/// Why one connection to the feed ended.
#[derive(Debug, thiserror::Error)]
enum FeedError {
    #[error("peer: {0}")]
    Peer(#[from] tonic::Status),
    #[error("{0}")]
    Local(#[from] ServiceError),
    #[error("this node is no longer the leader")]
    NotLeader,
    #[error("the server is shutting down")]
    Shutdown,
}

/// Follows `peer`'s feed for as long as the server runs.
pub async fn follow(
    service: RegistryService,
    peer: Arc<Peer>,
    data_dir: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) {
    let span = info_span!("federation_sync", peer = %peer.authority);
    async move {
        let listed = Listed {
            path: listed_file(&data_dir, &peer.authority),
        };
        let mut noted = false;
        let mut backoff = MIN_BACKOFF;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if peer.pinned() && !noted {
                listed.note_first(&peer);
                noted = true;
            }
            if !service.is_leader() || !peer.pinned() {
                tokio::select! {
                    _ = tokio::time::sleep(LEADER_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            match follow_once(&service, &peer, &listed, &mut shutdown).await {
                Err(FeedError::Shutdown) => return,
                Err(FeedError::NotLeader) => continue,
                Err(e) => warn!(error = %e, retry_ms = backoff.as_millis() as u64, "federation feed interrupted"),
                Ok(()) => backoff = MIN_BACKOFF,
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.changed() => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
    .instrument(span)
    .await
}

/// The note while a listing under a new trust is under way.
const LISTING: &str = "listing\n";

/// This node's note of the trust (`Peer::trust_fingerprint`) under which
/// the peer's records were last listed here. Local, like the trust
/// settings themselves: each node checks the copies against its own
/// configuration when it leads.
struct Listed {
    path: PathBuf,
}

impl Listed {
    fn read(&self) -> Option<String> {
        std::fs::read_to_string(&self.path).ok()
    }

    fn write(&self, fingerprint: &str) {
        if let Err(e) = write_file(&self.path, fingerprint) {
            warn!(error = %e, "cannot note the trust the peer was listed under; it is listed again at the next connection");
        }
    }

    /// At a node's first start with this note (a new peer, or an upgrade
    /// from a release without it): the copies are taken to match the
    /// trust as configured now, and later changes are measured from here.
    fn note_first(&self, peer: &Peer) {
        if self.read().is_none() {
            self.write(&peer.trust_fingerprint());
        }
    }
}

/// Changes refused at a peer's record limit after which the cursor is
/// moved past them, and the quiet in the feed after which it is moved past
/// fewer.
const CURSOR_EVERY: usize = 1024;
const CURSOR_QUIET: Duration = Duration::from_secs(1);

/// One connection: from the replicated cursor on, until the stream ends;
/// from the start, with a full listing, when the trust in the peer changed
/// since its records were last listed.
async fn follow_once(
    service: &RegistryService,
    peer: &Peer,
    listed: &Listed,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), FeedError> {
    // Revocations first: they are part of the trust compared below. One
    // learned later, while the feed is followed, ends this connection, so
    // the next lists the peer again and withdraws what that key signed.
    let mut revocations = peer.revocations();
    if let Ok(info) = peer
        .client()
        .get_registry_info(pb::GetRegistryInfoRequest {})
        .await
    {
        peer.learn(info.get_ref());
    }
    revocations.borrow_and_update();
    let trust = peer.trust_fingerprint();
    let cursor = service
        .reader()
        .federation_cursor(&peer.authority)
        .map_err(ServiceError::from)?;
    let relist = cursor > 0 && listed.read().as_deref() != Some(trust.as_str());
    let from = if cursor == 0 || relist { 0 } else { cursor + 1 };
    let mut stream = peer
        .client()
        .follow(pb::FollowRequest {
            from_revision: from,
        })
        .await?
        .into_inner();
    if relist {
        info!("the trust in the peer changed since its records were listed; listing them again");
        // Until the listing is done, the note matches no trust: a listing
        // cut short (a crash after some withdrawals) is done again at the
        // next connection, whatever the trust is then.
        listed.write(LISTING);
    }
    info!(from, "following the peer's feed");
    // Ids accepted during a full listing, with their place in it; copies
    // of any other are withdrawn, and so are those past the peer's record
    // limit.
    let mut accepted: Option<HashMap<String, usize>> = None;
    // Set once a new copy was refused at the peer's record limit: later
    // ones are refused here, without a write through Raft each, until a
    // copy of the peer is withdrawn.
    let mut at_limit = false;
    // The latest change of the live feed refused here at the limit and
    // not yet behind the replicated cursor: the cursor moves past such
    // changes once the feed is quiet or many have gathered, not with a
    // Raft write each, so a reconnection does not read them all again.
    let mut refused_past: Option<(u64, usize)> = None;
    loop {
        if refused_past.is_some_and(|(_, n)| n >= CURSOR_EVERY) {
            move_past(service, &peer.authority, &mut refused_past).await?;
        }
        let event = tokio::select! {
            e = stream.message() => e?,
            () = tokio::time::sleep(CURSOR_QUIET), if refused_past.is_some() => {
                move_past(service, &peer.authority, &mut refused_past).await?;
                continue;
            }
            _ = shutdown.changed() => return Err(FeedError::Shutdown),
            Ok(()) = revocations.changed() => {
                info!("the peer revoked a key; reconnecting to list its records again");
                return Ok(());
            }
        };
        let Some(event) = event else {
            return Ok(());
        };
        if !service.is_leader() {
            return Err(FeedError::NotLeader);
        }
        if event.listing_done {
            let seen = accepted.take().unwrap_or_default();
            let mut kept = Vec::new();
            let mut withdrawn = 0;
            for (authority, id, copied) in service.federated_copies()? {
                if authority != peer.authority {
                    continue;
                }
                match seen.get(&id) {
                    Some(place) => kept.push((*place, id, copied)),
                    None => {
                        let change = withdrawal(id, copied, event.revision);
                        keep(service, &peer.authority, change, None, None).await?;
                        withdrawn += 1;
                        at_limit = false;
                    }
                }
            }
            // A limit lowered since the copies were taken (it is part of
            // the trust, so lowering it brings this listing): the copies
            // past it go, those the listing brought first staying, so the
            // choice is the peer's order and the same on every leader.
            if let Some(max) = peer.max_records {
                let max = usize::try_from(max).unwrap_or(usize::MAX);
                if kept.len() > max {
                    warn!(
                        max_records = max,
                        copies = kept.len(),
                        "more live copies of the peer than its max_records: withdrawing those past it"
                    );
                }
                kept.sort_unstable();
                for (_, id, copied) in kept.drain(max.min(kept.len())..) {
                    let change = withdrawal(id, copied, event.revision);
                    keep(service, &peer.authority, change, None, None).await?;
                    withdrawn += 1;
                }
            }
            info!(
                noted = seen.len(),
                copies = kept.len(),
                withdrawn,
                "the peer's listing is done"
            );
            let skip = FederatedChange::Skip;
            keep(service, &peer.authority, skip, Some(event.revision), None).await?;
            listed.write(&trust);
            continue;
        }
        let (change, id) = to_change(peer, &event, service.peers().max_record_bytes);
        // A listed id is noted unless the limit refuses its copy: only
        // noted ids can be kept copies, so a peer that lists far more
        // than its limit costs no memory past it.
        let listed = if event.listing {
            accepted.get_or_insert_with(HashMap::new);
            id
        } else {
            None
        };
        // A listing repeats mostly what is kept already; only what would
        // change anything goes through Raft.
        if event.listing && !service.federated_change_applies(&peer.authority, &change)? {
            note(&mut accepted, listed);
            continue;
        }
        if at_limit && is_new_copy(service, &peer.authority, &change)? {
            crate::metrics::observe_federation_refusal(&peer.authority, "quota");
            if !event.listing {
                let n = refused_past.map_or(0, |(_, n)| n);
                refused_past = Some((event.revision, n + 1));
            }
            continue;
        }
        let cursor = (!event.listing).then_some(event.revision);
        if cursor.is_some() {
            // This change carries the cursor past any refused before it.
            refused_past = None;
        }
        match keep(service, &peer.authority, change, cursor, peer.max_records).await? {
            Kept::OverLimit => {
                if !at_limit {
                    warn!(
                        max_records = peer.max_records.unwrap_or(0),
                        "the peer's live copies are at its max_records: its new records are refused until copies are withdrawn or the limit is raised"
                    );
                }
                at_limit = true;
            }
            Kept::Changed(ChangeKind::Deleted) => {
                note(&mut accepted, listed);
                at_limit = false;
            }
            Kept::Changed(_) | Kept::Unchanged => note(&mut accepted, listed),
        }
    }
}

/// Notes `id` as brought by the listing, in its order.
fn note(accepted: &mut Option<HashMap<String, usize>>, id: Option<String>) {
    if let (Some(accepted), Some(id)) = (accepted.as_mut(), id) {
        let place = accepted.len();
        accepted.entry(id).or_insert(place);
    }
}

/// Moves `peer`'s cursor past the changes refused at its limit so far.
async fn move_past(
    service: &RegistryService,
    peer: &str,
    refused_past: &mut Option<(u64, usize)>,
) -> Result<(), FeedError> {
    if let Some((revision, refused)) = refused_past.take() {
        service.advance_cursor(peer, revision).await?;
        debug!(
            revision,
            refused, "the cursor moved past changes refused at the limit"
        );
    }
    Ok(())
}

/// Withdraws, once this node leads, the copies of every authority it does
/// not sync from (a peer removed from the configuration, or its `sync`
/// turned off): nothing would keep them current, and the operator who
/// removed the peer no longer vouches for them.
pub async fn forget_unsynced(
    service: RegistryService,
    peers: Peers,
    mut shutdown: watch::Receiver<bool>,
) {
    let span = info_span!("federation_forget");
    async move {
        loop {
            if service.is_leader() {
                match forget_once(&service, &peers).await {
                    Ok(0) => return,
                    Ok(n) => {
                        info!(copies = n, "withdrew the copies of peers no longer synced from");
                        return;
                    }
                    Err(FeedError::NotLeader) => {}
                    Err(e) => warn!(error = %e, "cannot withdraw the copies of peers no longer synced from yet"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(LEADER_POLL) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
    .instrument(span)
    .await
}

async fn forget_once(service: &RegistryService, peers: &Peers) -> Result<usize, FeedError> {
    let synced: HashSet<&str> = peers
        .all()
        .iter()
        .filter(|p| p.sync)
        .map(|p| p.authority.as_str())
        .collect();
    let mut withdrawn = 0;
    for (authority, id, copied) in service.federated_copies()? {
        if synced.contains(authority.as_str()) {
            continue;
        }
        if !service.is_leader() {
            return Err(FeedError::NotLeader);
        }
        keep(service, &authority, withdrawal(id, copied, 0), None, None).await?;
        withdrawn += 1;
    }
    Ok(withdrawn)
}

/// Whether `change` would add a live copy of `peer`'s that is not kept
/// here yet (one a record limit holds back).
fn is_new_copy(
    service: &RegistryService,
    peer: &str,
    change: &FederatedChange,
) -> Result<bool, FeedError> {
    let FederatedChange::Copy {
        metadata, origin, ..
    } = change
    else {
        return Ok(false);
    };
    if origin.deleted {
        return Ok(false);
    }
    let kept = service
        .reader()
        .get(&metadata.id)
        .map_err(ServiceError::from)?;
    Ok(kept.is_none_or(|r| r.federated_from() != Some(peer)))
}

/// Withdraws a copy the peer's listing no longer brings (the peer stopped
/// sharing it, or this registry stopped accepting it). Ordered after the
/// listing and after the copy itself, whichever is later.
fn withdrawal(id: String, copied_revision: u64, listed_at: u64) -> FederatedChange {
    FederatedChange::Withdraw {
        id,
        origin_revision: listed_at.max(copied_revision.saturating_add(1)),
    }
}

/// The change an event asks for, checked: a record the peer did not sign
/// with a pinned key, or that claims another authority, becomes a skip.
fn to_change(
    peer: &Peer,
    event: &pb::FollowEvent,
    max_record_bytes: usize,
) -> (FederatedChange, Option<String>) {
    if !event.withdrawn_id.is_empty() {
        let id = event.withdrawn_id.clone();
        let change = FederatedChange::Withdraw {
            id: id.clone(),
            origin_revision: event.revision,
        };
        return (change, Some(id));
    }
    let size = event.record_json.len();
    let checked = if size > max_record_bytes {
        Err(Refusal::TooLarge(size, max_record_bytes))
    } else {
        crate::domain::json::parse_json(event.record_json.as_bytes())
            .map_err(|e| Refusal::Malformed(e.to_string()))
            .and_then(|served| peer.verify(&served).map(|r| (r, served)))
    };
    let (record, served) = match checked {
        Ok(ok) => ok,
        Err(why) => {
            warn!(revision = event.revision, %why, "refused a record from the peer's feed");
            crate::metrics::observe_federation_refusal(&peer.authority, why.reason());
            return (FederatedChange::Skip, None);
        }
    };
    let Some(signature) = record.envelope.signature.clone() else {
        return (FederatedChange::Skip, None);
    };
    let id = record.metadata.id.clone();
    let change = FederatedChange::Copy {
        provenance: Box::new(Provenance {
            origin_service: peer.endpoint.clone(),
            origin_authority: peer.authority.clone(),
            origin_signature: signature,
            received_at: crate::domain::time::now(),
            origin_revision: record.envelope.revision,
            origin_envelope: served
                .get(crate::domain::ENVELOPE_MEMBER)
                .cloned()
                .unwrap_or(Value::Null),
            via: Vec::new(),
        }),
        metadata: Box::new(record.metadata),
        origin: Box::new(record.envelope),
        listed: event.listing,
    };
    (change, Some(id))
}

/// Sends one change through Raft. `quota`: the peer's record limit, for
/// a copy; the answer says whether the limit refused it.
async fn keep(
    service: &RegistryService,
    authority: &str,
    change: FederatedChange,
    cursor: Option<u64>,
    quota: Option<u64>,
) -> Result<Kept, FeedError> {
    Ok(
        match service
            .keep_federated(authority, change, cursor, quota)
            .await?
        {
            Ok(c) => {
                debug!(agent_id = %c.record.metadata.id, revision = c.revision, "kept a peer's change");
                Kept::Changed(c.kind)
            }
            Err(Rejection::Unchanged { .. }) => Kept::Unchanged,
            Err(Rejection::Stale { id, .. }) => {
                debug!(agent_id = %id, "peer change older than the copy; ignored");
                Kept::Unchanged
            }
            Err(Rejection::QuotaExceeded { id, .. }) => {
                debug!(agent_id = %id, "peer copy refused: the peer's record limit is reached");
                crate::metrics::observe_federation_refusal(authority, "quota");
                Kept::OverLimit
            }
            Err(r) => {
                warn!(reason = %r, "peer change refused");
                Kept::Unchanged
            }
        },
    )
}

/// What became of one change of the feed.
enum Kept {
    Changed(ChangeKind),
    /// Not applied: stale, the same, or refused by the registry's rules.
    Unchanged,
    /// A new copy refused: the peer's live copies are at its limit.
    OverLimit,
}
