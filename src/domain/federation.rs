//! Records kept from a peer registry's change feed: the rules that decide
//! whether a peer's change may replace what is stored. The follower checks
//! signatures and trust policy before proposing; these rules are what every
//! node applies identically.

use serde::{Deserialize, Serialize};

use super::record::{AgentMetadata, AgentRecord, ChangeKind, Envelope, Provenance, Visibility};
use super::write::Rejection;

/// One change from a peer's feed, as proposed to Raft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FederatedChange {
    /// The peer's record (or tombstone) as the peer signed it.
    Copy {
        metadata: Box<AgentMetadata>,
        /// The origin's envelope, parsed (its raw form is in `provenance`).
        origin: Box<Envelope>,
        provenance: Box<Provenance>,
    },
    /// The peer no longer shares the record (it became private there).
    Withdraw { id: String, origin_revision: u64 },
    /// Nothing to store (a change the follower refused); only the cursor
    /// moves.
    Skip,
}

impl FederatedChange {
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Copy { metadata, .. } => Some(&metadata.id),
            Self::Withdraw { id, .. } => Some(id),
            Self::Skip => None,
        }
    }
}

/// The owner recorded on a peer's records (no local principal has it).
pub fn peer_owner(authority: &str) -> String {
    format!("peer:{authority}")
}

/// Decides what a peer's change does to `current`. A peer may only write
/// ids that are free here or already its own, and never goes back to an
/// older revision of its record.
pub fn decide_federated(
    current: Option<&AgentRecord>,
    peer: &str,
    change: FederatedChange,
    revision: u64,
    now: &str,
) -> Result<(AgentRecord, ChangeKind), Rejection> {
    let id = change.id().unwrap_or_default().to_string();
    if let FederatedChange::Copy { provenance, .. } = &change {
        // A peer keeps only its own records here, never one it says
        // another authority signed.
        if provenance.origin_authority != peer {
            return Err(Rejection::Forbidden {
                id,
                principal: peer_owner(peer),
            });
        }
    }
    let ours = current.and_then(|r| {
        r.envelope
            .provenance
            .as_ref()
            .filter(|p| p.origin_authority == peer)
    });
    let held_by_other = current.is_some_and(|r| !r.envelope.deleted) && ours.is_none();
    if held_by_other {
        return Err(Rejection::OwnedByOther { id });
    }
    let incoming_revision = match &change {
        FederatedChange::Copy { provenance, .. } => provenance.origin_revision,
        FederatedChange::Withdraw {
            origin_revision, ..
        } => *origin_revision,
        FederatedChange::Skip => return Err(Rejection::Unchanged { id }),
    };
    if let Some(stored) = ours {
        if incoming_revision <= stored.origin_revision {
            return Err(Rejection::Stale {
                id,
                detail: format!(
                    "revision {incoming_revision} at {peer} is not newer than the copy of revision {}",
                    stored.origin_revision
                ),
            });
        }
    }
    match change {
        FederatedChange::Copy {
            metadata,
            origin,
            provenance,
        } => {
            let kept = current.filter(|_| ours.is_some());
            let kind = if origin.deleted {
                ChangeKind::Deleted
            } else if kept.is_some_and(|r| !r.envelope.deleted) {
                ChangeKind::Updated
            } else {
                ChangeKind::Created
            };
            let envelope = Envelope {
                owner: peer_owner(peer),
                owner_tenant: None,
                revision,
                created_revision: kept.map_or(revision, |r| r.envelope.created_revision),
                registered_at: kept
                    .map_or_else(|| now.to_string(), |r| r.envelope.registered_at.clone()),
                modified_at: now.to_string(),
                status_reason: origin.status_reason,
                visibility: Visibility::Public,
                readers: Vec::new(),
                deleted: origin.deleted,
                publisher: origin.publisher,
                signature: None,
                provenance: Some(*provenance),
            };
            Ok((
                AgentRecord {
                    metadata: *metadata,
                    envelope,
                },
                kind,
            ))
        }
        FederatedChange::Withdraw {
            origin_revision, ..
        } => {
            let Some(mut record) = current.filter(|_| ours.is_some()).cloned() else {
                return Err(Rejection::NotFound { id });
            };
            if record.envelope.deleted {
                return Err(Rejection::Unchanged { id });
            }
            record.envelope.deleted = true;
            record.envelope.revision = revision;
            record.envelope.modified_at = now.to_string();
            if let Some(p) = record.envelope.provenance.as_mut() {
                p.origin_revision = origin_revision;
                p.received_at = now.to_string();
            }
            Ok((record, ChangeKind::Deleted))
        }
        FederatedChange::Skip => Err(Rejection::Unchanged { id }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RegistrySignature;

    fn copy(id: &str, origin_revision: u64, deleted: bool) -> FederatedChange {
        FederatedChange::Copy {
            metadata: Box::new(AgentMetadata {
                id: id.into(),
                name: "n".into(),
                description: "d".into(),
                ..Default::default()
            }),
            origin: Box::new(Envelope {
                owner: "alice".into(),
                revision: origin_revision,
                deleted,
                ..Default::default()
            }),
            provenance: Box::new(Provenance {
                origin_service: "b:1".into(),
                origin_authority: "b.example".into(),
                origin_signature: RegistrySignature::default(),
                received_at: "t".into(),
                origin_revision,
                origin_envelope: serde_json::json!({}),
                via: Vec::new(),
            }),
        }
    }

    fn apply(
        current: Option<&AgentRecord>,
        c: FederatedChange,
        rev: u64,
    ) -> Result<AgentRecord, Rejection> {
        decide_federated(current, "b.example", c, rev, "now").map(|(r, _)| r)
    }

    #[test]
    fn newer_copies_replace_older_never_the_reverse() {
        let first = apply(None, copy("x", 5, false), 10).unwrap();
        assert_eq!(first.envelope.owner, "peer:b.example");
        assert_eq!(first.federated_from(), Some("b.example"));
        let newer = apply(Some(&first), copy("x", 7, false), 11).unwrap();
        assert_eq!(newer.envelope.created_revision, 10);
        assert!(matches!(
            apply(Some(&newer), copy("x", 6, false), 12),
            Err(Rejection::Stale { .. })
        ));
        assert!(matches!(
            apply(Some(&newer), copy("x", 7, false), 12),
            Err(Rejection::Stale { .. })
        ));
        let gone = apply(Some(&newer), copy("x", 8, true), 13).unwrap();
        assert!(gone.envelope.deleted);
        assert_eq!(gone.federated_from(), None);
    }

    #[test]
    fn a_peer_cannot_take_an_id_held_by_someone_else() {
        let local = AgentRecord {
            metadata: AgentMetadata {
                id: "x".into(),
                ..Default::default()
            },
            envelope: Envelope {
                owner: "alice".into(),
                ..Default::default()
            },
        };
        assert!(matches!(
            apply(Some(&local), copy("x", 1, false), 2),
            Err(Rejection::OwnedByOther { .. })
        ));
        // c.example cannot pass off a record as b.example's.
        assert!(matches!(
            decide_federated(None, "c.example", copy("x", 1, false), 2, "now"),
            Err(Rejection::Forbidden { .. })
        ));
        // Nor take over b.example's copy.
        let from_b = apply(None, copy("x", 1, false), 2).unwrap();
        assert!(matches!(
            decide_federated(
                Some(&from_b),
                "c.example",
                FederatedChange::Withdraw {
                    id: "x".into(),
                    origin_revision: 9
                },
                3,
                "now"
            ),
            Err(Rejection::OwnedByOther { .. })
        ));
    }

    #[test]
    fn withdrawal_leaves_a_tombstone_of_the_peers_copy_only() {
        let first = apply(None, copy("x", 5, false), 10).unwrap();
        let w = FederatedChange::Withdraw {
            id: "x".into(),
            origin_revision: 6,
        };
        let gone = apply(Some(&first), w.clone(), 11).unwrap();
        assert!(gone.envelope.deleted);
        assert!(matches!(
            apply(None, w, 11),
            Err(Rejection::NotFound { .. })
        ));
    }
}
