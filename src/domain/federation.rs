//! Records kept from a peer registry's change feed: the rules that decide
//! whether a peer's change may replace what is stored. The follower checks
//! signatures and trust policy before proposing; these rules are what every
//! node applies identically.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
        /// Part of the peer's full listing: the peer's state now rather
        /// than a change (older than the copy after the peer was restored
        /// from a backup). Absent in entries of older versions.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        listed: bool,
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
    rules: u32,
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
        let listed = rules >= 1 && matches!(&change, FederatedChange::Copy { listed: true, .. });
        let stale = if listed {
            // A listing replaces the copy unless it is that very version;
            // a copy withdrawn here (the peer stopped sharing it, or this
            // registry stopped trusting it) comes back.
            let withdrawn = current.is_some_and(|r| r.envelope.deleted)
                && stored.origin_envelope.get("deleted") != Some(&Value::Bool(true));
            !withdrawn && incoming_revision == stored.origin_revision
        } else {
            incoming_revision <= stored.origin_revision
        };
        if stale {
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
            ..
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
                freshness_floor: None,
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
            listed: false,
        }
    }

    /// `copy` as a full listing brings it.
    fn listed(id: &str, origin_revision: u64, deleted: bool) -> FederatedChange {
        let mut c = copy(id, origin_revision, deleted);
        if let FederatedChange::Copy { listed, .. } = &mut c {
            *listed = true;
        }
        c
    }

    fn apply(
        current: Option<&AgentRecord>,
        c: FederatedChange,
        rev: u64,
    ) -> Result<AgentRecord, Rejection> {
        decide_federated(current, "b.example", c, rev, "now", 1).map(|(r, _)| r)
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
            decide_federated(None, "c.example", copy("x", 1, false), 2, "now", 1),
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
                "now",
                1
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

    /// A copy as the sync keeps it: the origin's envelope beside it.
    fn kept(origin_revision: u64, origin_deleted: bool) -> AgentRecord {
        let mut c = copy("x", origin_revision, origin_deleted);
        if let FederatedChange::Copy { provenance, .. } = &mut c {
            provenance.origin_envelope =
                serde_json::json!({"revision": origin_revision, "deleted": origin_deleted});
        }
        apply(None, c, 10).unwrap()
    }

    #[test]
    fn a_listing_is_the_peers_state_now_a_change_must_be_newer() {
        let withdraw = |origin_revision| FederatedChange::Withdraw {
            id: "x".into(),
            origin_revision,
        };
        // Withdrawn at the peer's listing revision 9 (not listed, or no
        // longer trusted here): only a listing brings revision 5 back.
        let gone = apply(Some(&kept(5, false)), withdraw(9), 11).unwrap();
        assert!(matches!(
            apply(Some(&gone), copy("x", 5, false), 12),
            Err(Rejection::Stale { .. })
        ));
        let back = apply(Some(&gone), listed("x", 5, false), 12).unwrap();
        assert!(!back.envelope.deleted);
        assert_eq!(back.envelope.created_revision, 10);
        // The very version kept is no change, listed or not.
        for c in [copy("x", 5, false), listed("x", 5, false)] {
            assert!(matches!(
                apply(Some(&kept(5, false)), c, 12),
                Err(Rejection::Stale { .. })
            ));
        }
        // A peer restored from a backup lists an older version: it
        // replaces the copy; the same as a change is refused.
        assert!(matches!(
            apply(Some(&kept(8, false)), copy("x", 6, false), 12),
            Err(Rejection::Stale { .. })
        ));
        let restored = apply(Some(&kept(8, false)), listed("x", 6, false), 12).unwrap();
        assert_eq!(
            restored.envelope.provenance.map(|p| p.origin_revision),
            Some(6)
        );
        // The origin's deletion is kept until a listing says otherwise.
        assert!(matches!(
            apply(Some(&kept(6, true)), listed("x", 6, true), 12),
            Err(Rejection::Stale { .. })
        ));
        // Entries of older versions (rules 0) know no listings.
        assert!(matches!(
            decide_federated(
                Some(&gone),
                "b.example",
                listed("x", 5, false),
                12,
                "now",
                0
            ),
            Err(Rejection::Stale { .. })
        ));
    }
}
