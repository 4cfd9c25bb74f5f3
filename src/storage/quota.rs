//! Live record counts per owner and per tenant, for the record quotas that
//! `apply` enforces. Derived state: counted from the records when the state
//! machine opens or installs a snapshot, then kept up to date by `apply`.

use std::collections::HashMap;

use crate::domain::write::{Quota, QuotaScope, Rejection};
use crate::domain::AgentRecord;

/// An owner: its name and tenant.
type OwnerKey = (String, Option<String>);

#[derive(Debug, Default)]
pub(super) struct RecordCounts {
    owners: HashMap<OwnerKey, u64>,
    tenants: HashMap<String, u64>,
}

/// The owner a record counts against: live records of this registry only
/// (tombstones and records kept from peers count for nobody).
fn counted(record: Option<&AgentRecord>) -> Option<OwnerKey> {
    let e = &record?.envelope;
    live_here(e.deleted, e.provenance.is_some()).then(|| (e.owner.clone(), e.owner_tenant.clone()))
}

fn live_here(deleted: bool, federated: bool) -> bool {
    !deleted && !federated
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
    provenance: Option<serde::de::IgnoredAny>,
}

impl RecordCounts {
    /// Counts one record as stored (its JSON).
    pub(super) fn add_stored(&mut self, json: &[u8]) -> Result<(), serde_json::Error> {
        let e = serde_json::from_slice::<Stored>(json)?.envelope;
        if live_here(e.deleted, e.provenance.is_some()) {
            self.shift((e.owner, e.owner_tenant), true);
        }
        Ok(())
    }

    fn shift(&mut self, (owner, tenant): OwnerKey, up: bool) {
        let step = |n: &mut u64| *n = if up { *n + 1 } else { n.saturating_sub(1) };
        if let Some(t) = &tenant {
            step(self.tenants.entry(t.clone()).or_default());
        }
        step(self.owners.entry((owner, tenant)).or_default());
    }

    /// Refuses a new live record that would take its owner or tenant past
    /// `quota`.
    pub(super) fn admit(&self, record: &AgentRecord, quota: Quota) -> Result<(), Rejection> {
        let Some(key) = counted(Some(record)) else {
            return Ok(());
        };
        let refuse = |scope, limit| Rejection::QuotaExceeded {
            id: record.metadata.id.clone(),
            scope,
            limit,
        };
        if self.owners.get(&key).copied().unwrap_or(0) >= quota.per_owner {
            return Err(refuse(QuotaScope::Owner, quota.per_owner));
        }
        if let (Some(limit), Some(t)) = (quota.per_tenant, &key.1) {
            if self.tenants.get(t).copied().unwrap_or(0) >= limit {
                return Err(refuse(QuotaScope::Tenant, limit));
            }
        }
        Ok(())
    }

    /// Follows one applied change from `before` to `after`.
    pub(super) fn change(&mut self, before: Option<&AgentRecord>, after: &AgentRecord) {
        match (counted(before), counted(Some(after))) {
            (None, Some(owner)) => self.shift(owner, true),
            (Some(owner), None) => self.shift(owner, false),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentMetadata, Envelope};

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
            counts.admit(&third, quota),
            Err(Rejection::QuotaExceeded {
                scope: QuotaScope::Owner,
                limit: 2,
                ..
            })
        ));
        // Alice of another tenant is another owner.
        assert!(counts.admit(&record("x", "alice", None), quota).is_ok());
        let b1 = serde_json::to_vec(&record("b1", "bob", Some("acme"))).unwrap();
        counts.add_stored(&b1).unwrap();
        assert!(matches!(
            counts.admit(&record("b2", "bob", Some("acme")), quota),
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
        assert!(counts.admit(&third, quota).is_ok());
    }
}
