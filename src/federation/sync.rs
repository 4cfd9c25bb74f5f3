//! Federation sync: following a peer's public change feed and keeping its
//! records here, read-only and with provenance. Runs on every node but acts
//! only on the leader; the cursor is replicated with each record, so a new
//! leader, or the same one after a restart, resumes exactly where the
//! feed was left.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

use super::{Peer, Refusal};
use crate::domain::federation::FederatedChange;
use crate::domain::write::Rejection;
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
    mut shutdown: watch::Receiver<bool>,
) {
    let span = info_span!("federation_sync", peer = %peer.authority);
    async move {
        let mut backoff = MIN_BACKOFF;
        loop {
            if *shutdown.borrow() {
                return;
            }
            if !service.is_leader() || !peer.pinned() {
                tokio::select! {
                    _ = tokio::time::sleep(LEADER_POLL) => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            match follow_once(&service, &peer, &mut shutdown).await {
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

/// One connection: from the replicated cursor on, until the stream ends.
async fn follow_once(
    service: &RegistryService,
    peer: &Peer,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), FeedError> {
    let cursor = service
        .reader()
        .federation_cursor(&peer.authority)
        .map_err(ServiceError::from)?;
    let from = if cursor == 0 { 0 } else { cursor + 1 };
    let mut stream = peer
        .client()
        .follow(pb::FollowRequest {
            from_revision: from,
        })
        .await?
        .into_inner();
    if let Ok(info) = peer
        .client()
        .get_registry_info(pb::GetRegistryInfoRequest {})
        .await
    {
        peer.learn(info.get_ref());
    }
    info!(from, "following the peer's feed");
    // Ids seen during a full listing; what the listing lacks is gone.
    let mut listed: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            e = stream.message() => e?,
            _ = shutdown.changed() => return Err(FeedError::Shutdown),
        };
        let Some(event) = event else {
            return Ok(());
        };
        if !service.is_leader() {
            return Err(FeedError::NotLeader);
        }
        if event.listing_done {
            let seen = listed.take().unwrap_or_default();
            for id in service.federated_ids(&peer.authority)? {
                if !seen.contains(&id) {
                    let change = FederatedChange::Withdraw {
                        id,
                        origin_revision: event.revision,
                    };
                    keep(service, peer, change, None).await?;
                }
            }
            keep(service, peer, FederatedChange::Skip, Some(event.revision)).await?;
            continue;
        }
        let (change, id) = to_change(peer, &event);
        if event.listing {
            listed.get_or_insert_with(HashSet::new).extend(id);
        }
        let cursor = (!event.listing).then_some(event.revision);
        keep(service, peer, change, cursor).await?;
    }
}

/// The change an event asks for, checked: a record the peer did not sign
/// with a pinned key, or that claims another authority, becomes a skip.
fn to_change(peer: &Peer, event: &pb::FollowEvent) -> (FederatedChange, Option<String>) {
    if !event.withdrawn_id.is_empty() {
        let id = event.withdrawn_id.clone();
        let change = FederatedChange::Withdraw {
            id: id.clone(),
            origin_revision: event.revision,
        };
        return (change, Some(id));
    }
    let checked = serde_json::from_str::<Value>(&event.record_json)
        .map_err(|e| Refusal::Malformed(e.to_string()))
        .and_then(|served| peer.verify(&served).map(|r| (r, served)));
    let (record, served) = match checked {
        Ok(ok) => ok,
        Err(why) => {
            warn!(revision = event.revision, %why, "refused a record from the peer's feed");
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
    };
    (change, Some(id))
}

async fn keep(
    service: &RegistryService,
    peer: &Peer,
    change: FederatedChange,
    cursor: Option<u64>,
) -> Result<(), FeedError> {
    match service
        .keep_federated(&peer.authority, change, cursor)
        .await?
    {
        Ok(c) => {
            debug!(agent_id = %c.record.metadata.id, revision = c.revision, "kept a peer's change")
        }
        Err(Rejection::Unchanged { .. }) => {}
        Err(Rejection::Stale { id, .. }) => {
            debug!(agent_id = %id, "peer change older than the copy; ignored")
        }
        Err(r) => warn!(reason = %r, "peer change refused"),
    }
    Ok(())
}
