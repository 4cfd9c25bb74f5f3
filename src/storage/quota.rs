//! Live record counts per owner, per tenant and per peer, for the record
//! quotas that `apply` enforces. Derived state: counted from the records
//! when the state machine opens or installs a snapshot, then kept up to
//! date by `apply`.

use std::collections::HashMap;

use crate::domain::write::{Quota, QuotaScope, RecordLimit, Rejection};
use crate::domain::AgentRecord;

/// An owner: its name and tenant.
type OwnerKey = (String, Option<String>);

#[derive(Debug, Default)]
pub(super) struct RecordCounts {
    owners: HashMap<OwnerKey, u64>,
    tenants: HashMap<String, u64>,
    /// Live copies kept from each peer, by its authority.
    peers: HashMap<String, u64>,
}

/// Whom a live record counts against.
#[derive(Debug, PartialEq, Eq)]
enum Counted {
    /// A record of this registry: its owner (and tenant).
    Owner(OwnerKey),
    /// A copy kept from a peer: the peer's authority.
    Peer(String),
}

impl Counted {
    /// Whom a live record counts against: the peer it was copied from
    /// (`origin`), else its owner.
    fn of(origin: Option<String>, owner: String, tenant: Option<String>) -> Self {
        match origin {
            Some(authority) => Self::Peer(authority),
            None => Self::Owner((owner, tenant)),
        }
    }
}

/// Tombstones count for nobody.
fn counted(record: Option<&AgentRecord>) -> Option<Counted> {
    let e = &record?.envelope;
    if e.deleted {
        return None;
    }
    let origin = e.provenance.as_ref().map(|p| p.origin_authority.clone());
    Some(Counted::of(origin, e.owner.clone(), e.owner_tenant.clone()))
}

/// What counting needs of a stored record: its envelope's owner facts,
/// decoded without building the metadata (start-up counts every record).
#[derive(serde::Deserialize)]
struct Stored {
    envelope: StoredEnvelope,
}

#[derive(serde::Deserialize)]
struct StoredEnvelope {
    owner: String,
    #[serde(default)]
    owner_tenant: Option<String>,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    provenance: Option<StoredProvenance>,
}

#[derive(serde::Deserialize)]
struct StoredProvenance {
    origin_authority: String,
}

impl RecordCounts {
    /// The live copies kept from the peer `authority`.
    pub(super) fn of_peer(&self, authority: &str) -> u64 {
        self.peers.get(authority).copied().unwrap_or(0)
    }

    /// Counts one record as stored (its JSON).
    pub(super) fn add_stored(&mut self, json: &[u8]) -> Result<(), serde_json::Error> {
        let e = serde_json::from_slice::<Stored>(json)?.envelope;
        if !e.deleted {
            let origin = e.provenance.map(|p| p.origin_authority);
            self.shift(Counted::of(origin, e.owner, e.owner_tenant), true);
        }
        Ok(())
    }

    fn shift(&mut self, who: Counted, up: bool) {
        let step = |n: &mut u64| *n = if up { *n + 1 } else { n.saturating_sub(1) };
        match who {
            Counted::Owner((owner, tenant)) => {
                if let Some(t) = &tenant {
                    step(self.tenants.entry(t.clone()).or_default());
                }
                step(self.owners.entry((owner, tenant)).or_default());
            }
            Counted::Peer(authority) => step(self.peers.entry(authority).or_default()),
        }
    }

    /// Refuses a new live record that would take its owner, tenant or
    /// peer past `limit`.
    pub(super) fn admit(&self, record: &AgentRecord, limit: RecordLimit) -> Result<(), Rejection> {
        let refuse = |scope, limit| Rejection::QuotaExceeded {
            id: record.metadata.id.clone(),
            scope,
            limit,
        };
        match (counted(Some(record)), limit) {
            (Some(Counted::Owner(key)), RecordLimit::Records(quota)) => {
                let Quota {
                    per_owner,
                    per_tenant,
                } = quota;
                if self.owners.get(&key).copied().unwrap_or(0) >= per_owner {
                    return Err(refuse(QuotaScope::Owner, per_owner));
                }
                if let (Some(limit), Some(t)) = (per_tenant, &key.1) {
                    if self.tenants.get(t).copied().unwrap_or(0) >= limit {
                        return Err(refuse(QuotaScope::Tenant, limit));
                    }
                }
                Ok(())
            }
            (Some(Counted::Peer(authority)), RecordLimit::Copies(limit)) => {
                if self.peers.get(&authority).copied().unwrap_or(0) >= limit {
                    return Err(refuse(QuotaScope::Peer, limit));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Follows one applied change from `before` to `after`.
    pub(super) fn change(&mut self, before: Option<&AgentRecord>, after: &AgentRecord) {
        let (before, after) = (counted(before), counted(Some(after)));
        if before == after {
            return;
        }
        if let Some(b) = before {
            self.shift(b, false);
        }
        if let Some(a) = after {
            self.shift(a, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentMetadata, Envelope, Provenance};

    fn record(id: &str, owner: &str, tenant: Option<&str>) -> AgentRecord {
        AgentRecord {
            metadata: AgentMetadata {
                id: id.into(),
                ..Default::default()
            },
            envelope: Envelope {
                owner: owner.into(),
                owner_tenant: tenant.map(String::from),
                ..Default::default()
            },
        }
    }

    #[test]
    fn quotas_count_live_records_per_owner_and_tenant() {
        let mut counts = RecordCounts::default();
        let quota = Quota {
            per_owner: 2,
            per_tenant: Some(3),
        };
        let a1 = record("a1", "alice", Some("acme"));
        counts.change(None, &a1);
        let a2 = serde_json::to_vec(&record("a2", "alice", Some("acme"))).unwrap();
        counts.add_stored(&a2).unwrap();
        let third = record("a3", "alice", Some("acme"));
        assert!(matches!(
            counts.admit(&third, RecordLimit::Records(quota)),
            Err(Rejection::QuotaExceeded {
                scope: QuotaScope::Owner,
                limit: 2,
                ..
            })
        ));
        // Alice of another tenant is another owner.
        assert!(counts
            .admit(&record("x", "alice", None), RecordLimit::Records(quota))
            .is_ok());
        let b1 = serde_json::to_vec(&record("b1", "bob", Some("acme"))).unwrap();
        counts.add_stored(&b1).unwrap();
        assert!(matches!(
            counts.admit(
                &record("b2", "bob", Some("acme")),
                RecordLimit::Records(quota)
            ),
            Err(Rejection::QuotaExceeded {
                scope: QuotaScope::Tenant,
                limit: 3,
                ..
            })
        ));
        // A deletion frees a place.
        let mut tomb = a1.clone();
        tomb.envelope.deleted = true;
        counts.change(Some(&a1), &tomb);
        assert!(counts.admit(&third, RecordLimit::Records(quota)).is_ok());
    }

    fn copy(id: &str, authority: &str) -> AgentRecord {
        let mut r = record(id, &format!("peer:{authority}"), None);
        r.envelope.provenance = Some(Provenance {
            origin_service: format!("https://{authority}:8473"),
            origin_authority: authority.into(),
            origin_signature: Default::default(),
            received_at: String::new(),
            origin_revision: 1,
            origin_envelope: serde_json::Value::Null,
            via: Vec::new(),
        });
        r
    }

    #[test]
    fn copies_count_per_peer_and_only_against_the_peer_limit() {
        let mut counts = RecordCounts::default();
        let limit = RecordLimit::Copies(2);
        let b1 = copy("b1", "b.example");
        counts.change(None, &b1);
        counts
            .add_stored(&serde_json::to_vec(&copy("b2", "b.example")).unwrap())
            .unwrap();
        let third = copy("b3", "b.example");
        assert!(matches!(
            counts.admit(&third, limit),
            Err(Rejection::QuotaExceeded {
                scope: QuotaScope::Peer,
                limit: 2,
                ..
            })
        ));
        // Another peer's copies, and this registry's own records, are
        // counted apart; an owner quota does not hold a copy back.
        assert!(counts.admit(&copy("c1", "c.example"), limit).is_ok());
        let quota = RecordLimit::Records(Quota {
            per_owner: 0,
            per_tenant: None,
        });
        assert!(counts.admit(&third, quota).is_ok());
        counts.change(None, &record("a1", "alice", None));
        assert!(counts.admit(&copy("c1", "c.example"), limit).is_ok());
        // A withdrawn copy frees a place; a tombstone counts for nobody.
        let mut withdrawn = b1.clone();
        withdrawn.envelope.deleted = true;
        counts.change(Some(&b1), &withdrawn);
        counts
            .add_stored(&serde_json::to_vec(&withdrawn).unwrap())
            .unwrap();
        assert!(counts.admit(&third, limit).is_ok());
        // A local tombstone taken over by a copy counts for the peer.
        let mut gone = record("a2", "alice", None);
        gone.envelope.deleted = true;
        counts.change(Some(&gone), &copy("a2", "b.example"));
        assert!(counts.admit(&third, limit).is_err());
    }
}
