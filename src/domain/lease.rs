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
    holds: HashMap<String, Hold, foldhash::fast::RandomState>,
    leases: HashMap<String, Lease>,
    /// Each shared lease that exists or holds an agent: its number in
    /// `expiries` and its holder count (kept with `holds`, so a refresh
    /// does not count them by scanning every hold).
    named: HashMap<String, Named>,
    /// The expiry of each numbered lease (`i64::MIN` while it does not
    /// exist). A hold cell names its lease by number, so discovery reads a
    /// shared lease's expiry by position instead of by name.
    expiries: Vec<i64>,
    /// Numbers no lease has, for the next one.
    free: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Named {
    number: u32,
    holders: u64,
}

/// The hold cell's tags (see [`LeaseTable::cell`]): an own expiry in the
/// low bits, or a shared lease's number.
const CELL_OWN: u64 = 1 << 62;
const CELL_SHARED: u64 = 1 << 63;
const CELL_VALUE: u64 = CELL_OWN - 1;

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

    /// `agent`'s hold as one word the discovery index keeps beside the
    /// agent: 0 without a hold, an own expiry, or a shared lease's number.
    /// [`Self::cell_expiry`] reads it back without looking the agent up by
    /// name, which at a hundred candidates a query was a third of a
    /// discovery's time. A shared lease's refresh changes no cell, only
    /// the expiry its number leads to.
    pub fn cell(&self, agent: &str) -> u64 {
        match self.holds.get(agent) {
            None => 0,
            // Expiries before 1970 read as 1970: expired all the same.
            Some(Hold::Own { expires_unix, .. }) => {
                CELL_OWN | (*expires_unix).clamp(0, CELL_VALUE as i64) as u64
            }
            Some(Hold::Shared { lease }) => self
                .named
                .get(lease)
                .map_or(CELL_OWN, |n| CELL_SHARED | u64::from(n.number)),
        }
    }

    /// The expiry a [`Self::cell`] stands for; the same as
    /// [`Self::expiry_unix`] of its agent while the cell is current.
    pub fn cell_expiry(&self, cell: u64) -> Option<i64> {
        if cell & CELL_SHARED != 0 {
            let at = (cell & CELL_VALUE) as usize;
            Some(self.expiries.get(at).copied().unwrap_or(i64::MIN))
        } else if cell & CELL_OWN != 0 {
            Some((cell & CELL_VALUE) as i64)
        } else {
            None
        }
    }

    pub fn hold(&self, agent: &str) -> Option<&Hold> {
        self.holds.get(agent)
    }

    pub fn lease(&self, name: &str) -> Option<&Lease> {
        self.leases.get(name)
    }

    /// How many agents share `name`.
    pub fn holders(&self, name: &str) -> u64 {
        self.named.get(name).map_or(0, |n| n.holders)
    }

    pub fn load(&mut self, entry: LeaseEntry) {
        match entry {
            LeaseEntry::Hold { agent, hold } => self.set_hold(agent, Some(hold)),
            LeaseEntry::Lease { name, lease } => self.set_lease(&name, Some(lease)),
        }
    }

    pub fn apply(&mut self, write: &LeaseWrite) {
        match write {
            LeaseWrite::Hold(agent, hold) => self.set_hold(agent.clone(), hold.clone()),
            LeaseWrite::Lease(name, lease) => self.set_lease(name, lease.clone()),
        }
    }

    fn set_lease(&mut self, name: &str, lease: Option<Lease>) {
        let expiry = lease.as_ref().map_or(i64::MIN, |l| l.expires_unix);
        match lease {
            Some(l) => {
                self.leases.insert(name.to_string(), l);
            }
            None => {
                self.leases.remove(name);
            }
        }
        let number = self.named(name).number as usize;
        if let Some(e) = self.expiries.get_mut(number) {
            *e = expiry;
        }
        self.forget_if_unused(name);
    }

    fn set_hold(&mut self, agent: String, hold: Option<Hold>) {
        if let Some(lease) = shared_lease(hold.as_ref()) {
            self.named(lease).holders += 1;
        }
        let old = match hold {
            Some(h) => self.holds.insert(agent, h),
            None => self.holds.remove(&agent),
        };
        if let Some(lease) = shared_lease(old.as_ref()) {
            if let Some(n) = self.named.get_mut(lease) {
                n.holders = n.holders.saturating_sub(1);
            }
            self.forget_if_unused(lease);
        }
    }

    /// `name`'s number and holders, numbered now if it had none.
    fn named(&mut self, name: &str) -> &mut Named {
        let (free, expiries, leases) = (&mut self.free, &mut self.expiries, &self.leases);
        self.named.entry(name.to_string()).or_insert_with(|| {
            let number = free.pop().unwrap_or(expiries.len() as u32);
            let expiry = leases.get(name).map_or(i64::MIN, |l| l.expires_unix);
            match expiries.get_mut(number as usize) {
                Some(e) => *e = expiry,
                None => expiries.push(expiry),
            }
            Named { number, holders: 0 }
        })
    }

    /// Frees `name`'s number once no lease has the name and no agent names
    /// it: no cell can lead to the number any more.
    fn forget_if_unused(&mut self, name: &str) {
        if self.leases.contains_key(name) {
            return;
        }
        if let Some(n) = self.named.get(name).filter(|n| n.holders == 0).copied() {
            self.named.remove(name);
            if let Some(e) = self.expiries.get_mut(n.number as usize) {
                *e = i64::MIN;
            }
            self.free.push(n.number);
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

    /// The cell discovery keeps of an agent reads back as the expiry the
    /// table gives it, through any order of hold and lease changes; a
    /// shared lease's refresh moves its agents without changing their
    /// cells; and lease numbers are reused rather than growing.
    #[test]
    fn hold_cells_read_back_as_the_agents_expiry() {
        let agents: Vec<String> = (0..8).map(|i| format!("agent-{i}")).collect();
        let names: Vec<String> = (0..3).map(|i| format!("lease-{i}")).collect();
        let lease = |expires_unix| Lease {
            owner: "alice".into(),
            owner_tenant: None,
            ttl_seconds: 30,
            expires_unix,
        };
        let mut table = LeaseTable::default();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut kinds = [0usize; 5];
        for _ in 0..5_000 {
            let agent = agents[next(8) as usize].clone();
            let name = names[next(3) as usize].clone();
            let kind = next(5) as usize;
            kinds[kind] += 1;
            table.apply(&match kind {
                0 => LeaseWrite::Hold(
                    agent,
                    Some(Hold::Own {
                        ttl_seconds: 30,
                        expires_unix: 1_000 + next(1_000) as i64,
                    }),
                ),
                1 => LeaseWrite::Hold(agent, Some(Hold::Shared { lease: name })),
                2 => LeaseWrite::Hold(agent, None),
                3 => LeaseWrite::Lease(name, Some(lease(5_000 + next(1_000) as i64))),
                _ => LeaseWrite::Lease(name, None),
            });
            for a in &agents {
                assert_eq!(
                    table.cell_expiry(table.cell(a)),
                    table.expiry_unix(a),
                    "{a}"
                );
            }
            for n in &names {
                let holding = agents
                    .iter()
                    .filter(|a| matches!(table.hold(a), Some(Hold::Shared { lease }) if lease == n))
                    .count();
                assert_eq!(table.holders(n), holding as u64, "{n}");
            }
            assert!(table.expiries.len() <= names.len(), "numbers are reused");
        }
        assert!(
            kinds.iter().all(|&k| k > 500),
            "every kind of change ran: {kinds:?}"
        );

        // A refresh of the shared lease leaves its agents' cells as they
        // were and moves what they read.
        table.apply(&LeaseWrite::Lease("fleet".into(), Some(lease(7_000))));
        table.apply(&LeaseWrite::Hold(
            "a".into(),
            Some(Hold::Shared {
                lease: "fleet".into(),
            }),
        ));
        let cell = table.cell("a");
        table.apply(&LeaseWrite::Lease("fleet".into(), Some(lease(9_000))));
        assert_eq!(table.cell("a"), cell);
        assert_eq!(table.cell_expiry(cell), Some(9_000));
        // Revoked: what the cell leads to is expired.
        table.apply(&LeaseWrite::Lease("fleet".into(), None));
        assert_eq!(table.cell_expiry(cell), Some(i64::MIN));
        assert_eq!(table.cell_expiry(table.cell("nobody")), None);
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
