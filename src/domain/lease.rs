//! Leases: keep-alives for agent records, as etcd's leases are for keys.
//!
//! An owner keeps an agent fresh by refreshing it (`POST /agents/{id}/refresh`)
//! instead of registering its metadata again. A refresh moves the agent's
//! expiry to now + TTL and touches nothing else: the record, its revision and
//! the registry's signature stay as they are, so a refresh is a few bytes in
//! the log instead of a re-signed 2 KiB record. Many agents may share one
//! named lease; refreshing the lease keeps all of them alive at once.
//!
//! How the lease and the record's own `expires_at` relate: the signed
//! `expires_at` is what the publisher declared when it registered. While an
//! agent holds a lease, the lease's expiry governs instead (discovery hides
//! the agent once it passes, and `freshness.expires_at` reports it). A new
//! registration of the agent (ADP's re-send, itself a refresh) ends the
//! hold, so its own `expires_at` governs again; so does deleting it. Leases
//! are state of this cluster only: peers that federate the record see its
//! signed `expires_at`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::record::{Envelope, Principal};
use super::write::Rejection;

/// TTL of a first refresh that names none.
pub const DEFAULT_TTL_SECONDS: u32 = 60;
/// The longest TTL a refresh may ask for (30 days).
pub const MAX_TTL_SECONDS: u32 = 30 * 86_400;

/// What one refresh asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refresh {
    pub target: RefreshTarget,
    /// None: the TTL the agent or lease had, else the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u32>,
    pub principal: Principal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefreshTarget {
    /// One agent: on its own expiry, or joined to the named lease.
    Agent {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<String>,
    },
    /// A shared lease (made by its first refresh).
    Lease { name: String },
}

/// How an agent's freshness is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Hold {
    Own { ttl_seconds: u32, expires_unix: i64 },
    Shared { lease: String },
}

/// A shared lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_tenant: Option<String>,
    pub ttl_seconds: u32,
    pub expires_unix: i64,
}

/// One stored lease value; it names its own key, so snapshots carry the
/// values alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseEntry {
    Hold { agent: String, hold: Hold },
    Lease { name: String, lease: Lease },
}

impl LeaseEntry {
    /// The storage key: holds and leases live in separate key ranges.
    pub fn key(&self) -> Vec<u8> {
        match self {
            Self::Hold { agent, .. } => hold_key(agent),
            Self::Lease { name, .. } => lease_key(name),
        }
    }
}

pub fn hold_key(agent: &str) -> Vec<u8> {
    [b"h/".as_slice(), agent.as_bytes()].concat()
}

pub fn lease_key(name: &str) -> Vec<u8> {
    [b"l/".as_slice(), name.as_bytes()].concat()
}

/// What a refresh or a revocation answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// The agent refreshed (absent for a lease refreshed by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The shared lease that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    pub ttl_seconds: u32,
    pub expires_unix: i64,
    /// Agents the lease holds (1 for an agent on its own expiry).
    pub agents: u64,
}

/// A change to the lease state: set or remove one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseWrite {
    Hold(String, Option<Hold>),
    Lease(String, Option<Lease>),
}

impl LeaseWrite {
    pub fn key(&self) -> Vec<u8> {
        match self {
            Self::Hold(agent, _) => hold_key(agent),
            Self::Lease(name, _) => lease_key(name),
        }
    }

    /// The stored value; None removes the key.
    pub fn entry(&self) -> Option<LeaseEntry> {
        match self {
            Self::Hold(agent, hold) => hold.clone().map(|hold| LeaseEntry::Hold {
                agent: agent.clone(),
                hold,
            }),
            Self::Lease(name, lease) => lease.clone().map(|lease| LeaseEntry::Lease {
                name: name.clone(),
                lease,
            }),
        }
    }
}

/// Every hold and lease of the applied state, kept in memory so discovery
/// checks an agent's expiry without reading storage.
#[derive(Debug, Default, Clone)]
pub struct LeaseTable {
    /// Read for every candidate a discovery admits: a fast seeded hasher.
    holds: HashMap<String, Hold, foldhash::fast::RandomState>,
    leases: HashMap<String, Lease>,
    /// Agents joined to each shared lease, kept with `holds` so a refresh
    /// does not count them by scanning every hold.
    shared: HashMap<String, u64>,
}

/// The shared lease a hold names, if any.
fn shared_lease(hold: Option<&Hold>) -> Option<&str> {
    match hold {
        Some(Hold::Shared { lease }) => Some(lease),
        _ => None,
    }
}

impl LeaseTable {
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
    }

    /// The expiry a hold gives `agent` (unix seconds); None when it holds no
    /// lease and its own `expires_at` governs. An agent whose shared lease
    /// was revoked is expired.
    pub fn expiry_unix(&self, agent: &str) -> Option<i64> {
        Some(match self.holds.get(agent)? {
            Hold::Own { expires_unix, .. } => *expires_unix,
            Hold::Shared { lease } => self.leases.get(lease).map_or(i64::MIN, |l| l.expires_unix),
        })
    }

    pub fn hold(&self, agent: &str) -> Option<&Hold> {
        self.holds.get(agent)
    }

    pub fn lease(&self, name: &str) -> Option<&Lease> {
        self.leases.get(name)
    }

    /// How many agents share `name`.
    pub fn holders(&self, name: &str) -> u64 {
        self.shared.get(name).copied().unwrap_or(0)
    }

    pub fn load(&mut self, entry: LeaseEntry) {
        match entry {
            LeaseEntry::Hold { agent, hold } => self.set_hold(agent, Some(hold)),
            LeaseEntry::Lease { name, lease } => {
                self.leases.insert(name, lease);
            }
        }
    }

    pub fn apply(&mut self, write: &LeaseWrite) {
        match write {
            LeaseWrite::Hold(agent, hold) => self.set_hold(agent.clone(), hold.clone()),
            LeaseWrite::Lease(name, Some(l)) => {
                self.leases.insert(name.clone(), l.clone());
            }
            LeaseWrite::Lease(name, None) => {
                self.leases.remove(name);
            }
        }
    }

    fn set_hold(&mut self, agent: String, hold: Option<Hold>) {
        if let Some(lease) = shared_lease(hold.as_ref()) {
            *self.shared.entry(lease.to_string()).or_insert(0) += 1;
        }
        let old = match hold {
            Some(h) => self.holds.insert(agent, h),
            None => self.holds.remove(&agent),
        };
        if let Some(lease) = shared_lease(old.as_ref()) {
            if let Some(n) = self.shared.get_mut(lease) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.shared.remove(lease);
                }
            }
        }
    }
}

/// The lease table as one batch of entries sees it: the applied table with
/// the writes of the entries before laid over it, so each decision sees
/// all of them.
pub struct Staged<'a> {
    base: &'a LeaseTable,
    /// Holds and leases written in this batch (None: removed).
    holds: HashMap<String, Option<Hold>>,
    leases: HashMap<String, Option<Lease>>,
    /// Change of each shared lease's holder count in this batch.
    shared: HashMap<String, i64>,
    writes: Vec<LeaseWrite>,
}

impl<'a> Staged<'a> {
    pub fn new(base: &'a LeaseTable) -> Self {
        Self {
            base,
            holds: HashMap::new(),
            leases: HashMap::new(),
            shared: HashMap::new(),
            writes: Vec::new(),
        }
    }

    /// The writes made, in order.
    pub fn into_writes(self) -> Vec<LeaseWrite> {
        self.writes
    }

    fn hold(&self, agent: &str) -> Option<&Hold> {
        match self.holds.get(agent) {
            Some(h) => h.as_ref(),
            None => self.base.hold(agent),
        }
    }

    fn lease(&self, name: &str) -> Option<&Lease> {
        match self.leases.get(name) {
            Some(l) => l.as_ref(),
            None => self.base.lease(name),
        }
    }

    fn holder_count(&self, name: &str) -> u64 {
        let change = self.shared.get(name).copied().unwrap_or(0);
        self.base.holders(name).saturating_add_signed(change)
    }

    /// The agents joined to `name`: a scan of every hold, for revocation
    /// only.
    fn holders(&self, name: &str) -> Vec<String> {
        let shares = |h: &Hold| matches!(h, Hold::Shared { lease } if lease == name);
        let mut agents: Vec<String> = self
            .base
            .holds
            .keys()
            .chain(self.holds.keys())
            .filter(|a| self.hold(a).is_some_and(shares))
            .cloned()
            .collect();
        agents.sort();
        agents.dedup();
        agents
    }

    fn write(&mut self, w: LeaseWrite) {
        match &w {
            LeaseWrite::Hold(agent, hold) => {
                if let Some(lease) = shared_lease(self.hold(agent)) {
                    *self.shared.entry(lease.to_string()).or_insert(0) -= 1;
                }
                if let Some(lease) = shared_lease(hold.as_ref()) {
                    *self.shared.entry(lease.to_string()).or_insert(0) += 1;
                }
                self.holds.insert(agent.clone(), hold.clone());
            }
            LeaseWrite::Lease(name, lease) => {
                self.leases.insert(name.clone(), lease.clone());
            }
        }
        self.writes.push(w);
    }

    /// A record was registered again or deleted: its own `expires_at`
    /// governs from now on.
    pub fn release(&mut self, agent: &str) {
        if self.hold(agent).is_some() {
            self.write(LeaseWrite::Hold(agent.to_string(), None));
        }
    }

    /// Decides one refresh at `now_unix`; `record` is the envelope of the
    /// agent's stored record for an agent refresh.
    pub fn refresh(
        &mut self,
        r: &Refresh,
        record: Option<&Envelope>,
        now_unix: i64,
    ) -> Result<LeaseState, Rejection> {
        let ttl_of = |had: Option<u32>| r.ttl_seconds.or(had).unwrap_or(DEFAULT_TTL_SECONDS);
        match &r.target {
            RefreshTarget::Agent { id, lease } => {
                let rec = record.ok_or_else(|| Rejection::NotFound { id: id.clone() })?;
                if let Some(p) = &rec.provenance {
                    return Err(Rejection::Federated {
                        id: id.clone(),
                        authority: p.origin_authority.clone(),
                    });
                }
                if rec.deleted {
                    return Err(Rejection::Deleted {
                        id: id.clone(),
                        revision: rec.revision,
                    });
                }
                if !r
                    .principal
                    .may_manage(&rec.owner, rec.owner_tenant.as_deref())
                {
                    return Err(Rejection::Forbidden {
                        id: id.clone(),
                        principal: r.principal.name.clone(),
                    });
                }
                match lease {
                    Some(name) => {
                        let l = self.lease_of(name, &r.principal)?.clone();
                        self.write(LeaseWrite::Hold(
                            id.clone(),
                            Some(Hold::Shared {
                                lease: name.clone(),
                            }),
                        ));
                        Ok(LeaseState {
                            agent: Some(id.clone()),
                            lease: Some(name.clone()),
                            ttl_seconds: l.ttl_seconds,
                            expires_unix: l.expires_unix,
                            agents: self.holder_count(name),
                        })
                    }
                    None => {
                        let had = match self.hold(id) {
                            Some(Hold::Own { ttl_seconds, .. }) => Some(*ttl_seconds),
                            _ => None,
                        };
                        let ttl_seconds = ttl_of(had);
                        let expires_unix = now_unix.saturating_add(i64::from(ttl_seconds));
                        self.write(LeaseWrite::Hold(
                            id.clone(),
                            Some(Hold::Own {
                                ttl_seconds,
                                expires_unix,
                            }),
                        ));
                        Ok(LeaseState {
                            agent: Some(id.clone()),
                            lease: None,
                            ttl_seconds,
                            expires_unix,
                            agents: 1,
                        })
                    }
                }
            }
            RefreshTarget::Lease { name } => {
                let had = match self.lease(name) {
                    Some(l) if !may_manage(l, &r.principal) => {
                        return Err(Rejection::LeaseForbidden {
                            lease: name.clone(),
                            principal: r.principal.name.clone(),
                        })
                    }
                    Some(l) => Some(l.clone()),
                    None => None,
                };
                let ttl_seconds = ttl_of(had.as_ref().map(|l| l.ttl_seconds));
                let (owner, owner_tenant) = match had {
                    Some(l) => (l.owner, l.owner_tenant),
                    None => (r.principal.name.clone(), r.principal.tenant.clone()),
                };
                let lease = Lease {
                    owner,
                    owner_tenant,
                    ttl_seconds,
                    expires_unix: now_unix.saturating_add(i64::from(ttl_seconds)),
                };
                let expires_unix = lease.expires_unix;
                self.write(LeaseWrite::Lease(name.clone(), Some(lease)));
                Ok(LeaseState {
                    agent: None,
                    lease: Some(name.clone()),
                    ttl_seconds,
                    expires_unix,
                    agents: self.holder_count(name),
                })
            }
        }
    }

    /// Revokes a shared lease: it is gone, and the agents it held are
    /// expired from `now_unix` until they are refreshed or registered again.
    pub fn revoke(
        &mut self,
        name: &str,
        principal: &Principal,
        now_unix: i64,
    ) -> Result<LeaseState, Rejection> {
        let lease = self.lease_of(name, principal)?.clone();
        let holders = self.holders(name);
        for agent in &holders {
            self.write(LeaseWrite::Hold(
                agent.clone(),
                Some(Hold::Own {
                    ttl_seconds: lease.ttl_seconds,
                    expires_unix: now_unix,
                }),
            ));
        }
        self.write(LeaseWrite::Lease(name.to_string(), None));
        Ok(LeaseState {
            agent: None,
            lease: Some(name.to_string()),
            ttl_seconds: lease.ttl_seconds,
            expires_unix: now_unix,
            agents: holders.len() as u64,
        })
    }

    /// The lease `name`, if `principal` may use it.
    fn lease_of(&self, name: &str, principal: &Principal) -> Result<&Lease, Rejection> {
        match self.lease(name) {
            None => Err(Rejection::LeaseNotFound {
                lease: name.to_string(),
            }),
            Some(l) if !may_manage(l, principal) => Err(Rejection::LeaseForbidden {
                lease: name.to_string(),
                principal: principal.name.clone(),
            }),
            Some(l) => Ok(l),
        }
    }
}

fn may_manage(lease: &Lease, principal: &Principal) -> bool {
    principal.may_manage(&lease.owner, lease.owner_tenant.as_deref())
}

/// The state of lease `name` as `principal` may see it (owner or admin).
pub fn describe(table: &LeaseTable, name: &str, principal: &Principal) -> Option<LeaseState> {
    let l = table.lease(name).filter(|l| may_manage(l, principal))?;
    Some(LeaseState {
        agent: None,
        lease: Some(name.to_string()),
        ttl_seconds: l.ttl_seconds,
        expires_unix: l.expires_unix,
        agents: table.holders(name),
    })
}

/// Checks a lease name: it is a path segment and a storage key.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err("must be 1 to 128 characters of letters, digits, '-', '_', '.' or ':'".into())
    }
}

/// Checks a requested TTL.
pub fn validate_ttl(ttl: u32) -> Result<(), String> {
    if (1..=MAX_TTL_SECONDS).contains(&ttl) {
        Ok(())
    } else {
        Err(format!("must be between 1 and {MAX_TTL_SECONDS} seconds"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn envelope(owner: &str) -> Envelope {
        Envelope {
            owner: owner.into(),
            revision: 3,
            ..Default::default()
        }
    }

    fn refresh(target: RefreshTarget, ttl: Option<u32>, who: &Principal) -> Refresh {
        Refresh {
            target,
            ttl_seconds: ttl,
            principal: who.clone(),
        }
    }

    fn agent(id: &str, lease: Option<&str>) -> RefreshTarget {
        RefreshTarget::Agent {
            id: id.into(),
            lease: lease.map(String::from),
        }
    }

    fn apply(table: &mut LeaseTable, writes: Vec<LeaseWrite>) {
        for w in &writes {
            table.apply(w);
        }
    }

    #[test]
    fn only_owners_and_admins_refresh_and_a_revocation_expires_the_holders() {
        let alice = Principal::new("alice", Role::Publisher);
        let bob = Principal::new("bob", Role::Publisher);
        let root = Principal::new("root", Role::Admin);
        let lease = || RefreshTarget::Lease {
            name: "fleet".into(),
        };
        let mut table = LeaseTable::default();
        let mut staged = Staged::new(&table);
        let env = envelope("alice");
        assert!(matches!(
            staged.refresh(&refresh(agent("a", None), None, &bob), Some(&env), 100),
            Err(Rejection::Forbidden { .. })
        ));
        let own = staged
            .refresh(&refresh(agent("a", None), None, &alice), Some(&env), 100)
            .unwrap();
        assert_eq!(
            (own.ttl_seconds, own.expires_unix),
            (DEFAULT_TTL_SECONDS, 100 + i64::from(DEFAULT_TTL_SECONDS))
        );
        staged
            .refresh(&refresh(lease(), Some(10), &alice), None, 100)
            .unwrap();
        assert!(matches!(
            staged.refresh(&refresh(lease(), None, &bob), None, 100),
            Err(Rejection::LeaseForbidden { .. })
        ));
        // An admin may refresh it; the owner stays alice.
        staged
            .refresh(&refresh(lease(), None, &root), None, 105)
            .unwrap();
        let joined = staged
            .refresh(
                &refresh(agent("b", Some("fleet")), None, &alice),
                Some(&env),
                106,
            )
            .unwrap();
        assert_eq!((joined.expires_unix, joined.agents), (115, 1));
        let writes = staged.into_writes();
        apply(&mut table, writes);
        assert_eq!(table.expiry_unix("a"), Some(160));
        assert_eq!(table.expiry_unix("b"), Some(115));
        assert_eq!(table.lease("fleet").unwrap().owner, "alice");
        assert_eq!(table.holders("fleet"), 1);

        // Joining again counts once; leaving for an expiry of its own
        // leaves the lease without holders.
        let mut staged = Staged::new(&table);
        let again = staged
            .refresh(
                &refresh(agent("b", Some("fleet")), None, &alice),
                Some(&env),
                107,
            )
            .unwrap();
        assert_eq!(again.agents, 1);
        staged
            .refresh(&refresh(agent("b", None), Some(5), &alice), Some(&env), 107)
            .unwrap();
        let lease_state = staged
            .refresh(&refresh(lease(), None, &alice), None, 107)
            .unwrap();
        assert_eq!(lease_state.agents, 0);
        let mut left = table.clone();
        let writes = staged.into_writes();
        apply(&mut left, writes);
        assert_eq!(left.holders("fleet"), 0);
        assert_eq!(left.expiry_unix("b"), Some(112));

        // A deleted or federated record is not refreshed.
        let mut staged = Staged::new(&table);
        let mut gone = envelope("alice");
        gone.deleted = true;
        assert!(matches!(
            staged.refresh(&refresh(agent("a", None), None, &alice), Some(&gone), 120),
            Err(Rejection::Deleted { .. })
        ));
        assert!(staged.into_writes().is_empty());

        let mut staged = Staged::new(&table);
        assert!(matches!(
            staged.revoke("fleet", &bob, 120),
            Err(Rejection::LeaseForbidden { .. })
        ));
        let revoked = staged.revoke("fleet", &alice, 120).unwrap();
        assert_eq!(revoked.agents, 1);
        // Within the same batch the lease is gone already.
        assert!(matches!(
            staged.revoke("fleet", &alice, 120),
            Err(Rejection::LeaseNotFound { .. })
        ));
        let writes = staged.into_writes();
        apply(&mut table, writes);
        assert_eq!(table.expiry_unix("b"), Some(120));
        assert!(table.lease("fleet").is_none());
    }

    #[test]
    fn names_and_ttls_are_checked() {
        assert!(validate_name("fleet-a.eu:1_x").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(129)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert!(validate_ttl(1).is_ok() && validate_ttl(MAX_TTL_SECONDS).is_ok());
        assert!(validate_ttl(0).is_err() && validate_ttl(MAX_TTL_SECONDS + 1).is_err());
    }
}
