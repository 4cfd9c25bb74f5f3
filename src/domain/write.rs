//! The write rules of SPECS.md "Freshness and idempotence", as a pure decision
//! over the stored record. The state machine calls this inside `apply`, so the
//! checks and the write happen atomically in log order on every node.

use super::record::{
    AgentMetadata, AgentRecord, AgentStatus, ChangeKind, Envelope, FreshnessFloor, Principal,
    PublisherKey, PublisherVerification, Sharing, VerificationState,
};

/// Why a write was refused. These are values, not storage errors: a refused
/// write is a normal outcome of a committed log entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("agent '{id}' not found")]
    NotFound { id: String },
    #[error("agent '{id}' was deleted at revision {revision}")]
    Deleted { id: String, revision: u64 },
    #[error("agent '{id}' is owned by another principal")]
    OwnedByOther { id: String },
    #[error("principal '{principal}' may not change agent '{id}' owned by another principal")]
    Forbidden { id: String, principal: String },
    #[error("agent '{id}' is registered with other endpoints ({stored}); update it with PUT to change its bindings")]
    IncompatibleBindings { id: String, stored: String },
    #[error("stale metadata for agent '{id}': {detail}")]
    Stale { id: String, detail: String },
    #[error("publisher key '{key_id}' not found")]
    KeyNotFound { key_id: String },
    #[error("publisher key '{key_id}' belongs to another principal")]
    KeyForbidden { key_id: String },
    #[error("publisher key '{key_id}' is already registered by another principal")]
    KeyConflict { key_id: String },
    #[error("agent '{id}' needs no re-judging")]
    Unchanged { id: String },
    #[error("agent '{id}' is a read-only record federated from '{authority}'; it changes only at its origin")]
    Federated { id: String, authority: String },
    #[error("agent '{id}' changed meanwhile (revision {actual}, expected {expected})")]
    RevisionChanged {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("lease '{lease}' not found")]
    LeaseNotFound { lease: String },
    #[error("principal '{principal}' may not use lease '{lease}' owned by another principal")]
    LeaseForbidden { lease: String, principal: String },
    #[error("agent '{id}' would exceed the quota of {limit} live records per {scope}")]
    QuotaExceeded {
        id: String,
        scope: QuotaScope,
        limit: u64,
    },
}

/// What a record quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuotaScope {
    Owner,
    Tenant,
    /// Copies kept from one peer registry's feed.
    Peer,
}

impl std::fmt::Display for QuotaScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Owner => "owner",
            Self::Tenant => "tenant",
            Self::Peer => "peer",
        })
    }
}

/// The quota a registration is held to, decided by the node that took the
/// request and checked in `apply` against the counts of that moment, so
/// two writers racing for the last free place cannot both win.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quota {
    pub per_owner: u64,
    /// Absent for principals of no tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_tenant: Option<u64>,
}

/// What a new live record a command stores is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLimit {
    /// A registration: its owner's and tenant's quota.
    Records(Quota),
    /// A copy from a peer's feed: the live copies kept of that peer
    /// (`[[federation.peers]] max_records`).
    Copies(u64),
}

/// Refuses a local change to a live federated record.
fn not_federated(current: Option<&AgentRecord>, id: &str) -> Result<(), Rejection> {
    match current.and_then(AgentRecord::federated_from) {
        Some(authority) => Err(Rejection::Federated {
            id: id.to_string(),
            authority: authority.to_string(),
        }),
        None => Ok(()),
    }
}

/// How a metadata write treats an existing record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriteMode {
    /// POST: create, or refresh when id and a binding endpoint match.
    Register,
    /// PUT: replace an existing record; bindings may change.
    Update,
}

/// Says why `new` is older than `old`, if it is. `updated_at` decides when
/// both have it and they differ; otherwise dotted numeric versions do.
fn is_stale(new: &AgentMetadata, old: &AgentMetadata) -> Option<String> {
    older(Freshness::of(new), Freshness::of(old), "the stored")
}

/// The two members ADP judges staleness by.
#[derive(Clone, Copy)]
struct Freshness<'a> {
    updated_at: Option<&'a str>,
    version: Option<&'a str>,
}

impl<'a> Freshness<'a> {
    fn of(m: &'a AgentMetadata) -> Self {
        Self {
            updated_at: m.updated_at.as_deref(),
            version: m.version.as_deref(),
        }
    }

    /// What `record` is held to: its metadata's members, and where they
    /// are left out, its floor's.
    fn held_by(record: &'a AgentRecord) -> Self {
        let floor = record.envelope.freshness_floor.as_ref();
        Self {
            updated_at: record
                .metadata
                .updated_at
                .as_deref()
                .or_else(|| floor.and_then(|f| f.updated_at.as_deref())),
            version: record
                .metadata
                .version
                .as_deref()
                .or_else(|| floor.and_then(|f| f.version.as_deref())),
        }
    }
}

/// [`is_stale`] over freshness from wherever it was kept; `stored` names
/// where `old` came from in the refusal.
fn older(new: Freshness<'_>, old: Freshness<'_>, stored: &str) -> Option<String> {
    if let (Some(n), Some(o)) = (new.updated_at, old.updated_at) {
        if let (Some(nt), Some(ot)) = (super::time::parse(n), super::time::parse(o)) {
            if nt != ot {
                return (nt < ot).then(|| format!("updated_at {n} is older than {stored} {o}"));
            }
        }
    }
    if let (Some(n), Some(o)) = (new.version, old.version) {
        if let (Some(nv), Some(ov)) = (numeric_version(n), numeric_version(o)) {
            return (nv < ov).then(|| format!("version {n} is older than {stored} {o}"));
        }
    }
    None
}

/// Apply rules 3. ADP: "a stale update MUST NOT replace a newer record",
/// but `updated_at` and `version` are optional, so a write that leaves one
/// out used to wipe the only evidence of how new the record was, and a
/// delayed older write after it went through. `record` (just decided to
/// replace `replaced`, which may be a tombstone) is refused as stale if it
/// is older than what `replaced` was held to, and otherwise keeps, for
/// each member its metadata leaves out, what `replaced` was held to.
pub fn hold_freshness(
    mut record: AgentRecord,
    replaced: Option<&AgentRecord>,
) -> Result<AgentRecord, Rejection> {
    let held = replaced.map(Freshness::held_by);
    if let Some(held) = held {
        if let Some(detail) = older(Freshness::of(&record.metadata), held, "what this id held") {
            return Err(Rejection::Stale {
                id: record.metadata.id.clone(),
                detail,
            });
        }
    }
    let kept = |own: &Option<String>, held: Option<&str>| match own {
        None => held.map(str::to_string),
        Some(_) => None,
    };
    let floor = FreshnessFloor {
        updated_at: kept(&record.metadata.updated_at, held.and_then(|h| h.updated_at)),
        version: kept(&record.metadata.version, held.and_then(|h| h.version)),
    };
    record.envelope.freshness_floor =
        (floor.updated_at.is_some() || floor.version.is_some()).then_some(floor);
    Ok(record)
}

/// Parses "1.2.3" (an optional leading 'v', and anything after '-' or '+'
/// ignored) into comparable parts; other version schemes are not ordered.
fn numeric_version(v: &str) -> Option<Vec<u64>> {
    let core = v.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    core.split('.').map(|p| p.parse().ok()).collect()
}

/// Decides a metadata write (register or update).
pub fn decide_put(
    current: Option<&AgentRecord>,
    metadata: AgentMetadata,
    sharing: Option<Sharing>,
    principal: &Principal,
    mode: WriteMode,
    revision: u64,
    now: &str,
) -> Result<(AgentRecord, ChangeKind), Rejection> {
    let id = metadata.id.clone();
    not_federated(current, &id)?;
    let live = current.filter(|r| !r.envelope.deleted);
    let Some(old) = live else {
        if mode == WriteMode::Update {
            return Err(match current {
                Some(t) => Rejection::Deleted {
                    id,
                    revision: t.envelope.revision,
                },
                None => Rejection::NotFound { id },
            });
        }
        // A tombstone keeps the freshness of the deleted record, so a delayed
        // re-registration of older metadata cannot resurrect it.
        if let Some(tomb) = current {
            if let Some(detail) = is_stale(&metadata, &tomb.metadata) {
                return Err(Rejection::Stale { id, detail });
            }
        }
        let envelope = Envelope {
            owner: principal.name.clone(),
            owner_tenant: principal.tenant.clone(),
            revision,
            created_revision: revision,
            registered_at: now.to_string(),
            modified_at: now.to_string(),
            status_reason: None,
            visibility: sharing.as_ref().map(|s| s.visibility).unwrap_or_default(),
            readers: sharing.map(|s| s.readers).unwrap_or_default(),
            deleted: false,
            publisher: None,
            signature: None,
            provenance: None,
            freshness_floor: None,
        };
        return Ok((AgentRecord { metadata, envelope }, ChangeKind::Created));
    };

    if !old.managed_by(principal) {
        return Err(match mode {
            WriteMode::Register => Rejection::OwnedByOther { id },
            WriteMode::Update => Rejection::Forbidden {
                id,
                principal: principal.name.clone(),
            },
        });
    }
    if mode == WriteMode::Register
        && !metadata.bindings.iter().any(|n| {
            old.metadata
                .bindings
                .iter()
                .any(|o| o.endpoint == n.endpoint)
        })
    {
        let stored = old
            .metadata
            .bindings
            .iter()
            .map(|b| b.endpoint.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Rejection::IncompatibleBindings { id, stored });
    }
    if let Some(detail) = is_stale(&metadata, &old.metadata) {
        return Err(Rejection::Stale { id, detail });
    }
    let mut envelope = old.envelope.clone();
    envelope.revision = revision;
    envelope.modified_at = now.to_string();
    if let Some(s) = sharing {
        envelope.visibility = s.visibility;
        envelope.readers = s.readers;
    }
    Ok((AgentRecord { metadata, envelope }, ChangeKind::Updated))
}

/// Keeps the lifecycle status of the live record `record` replaces when
/// its metadata leaves `status` out: a status set with `SetStatus`
/// (retired, say) is not undone by the owner's next re-registration. A
/// status the metadata changes drops the reason given for the old one.
pub fn carry_status(current: Option<&AgentRecord>, record: &mut AgentRecord) {
    let Some(old) = current.filter(|r| !r.envelope.deleted) else {
        return;
    };
    match &record.metadata.status {
        None => record.metadata.status = old.metadata.status,
        Some(s) if old.metadata.status.as_ref() != Some(s) => {
            record.envelope.status_reason = None;
        }
        Some(_) => {}
    }
}

fn live_managed<'a>(
    current: Option<&'a AgentRecord>,
    id: &str,
    principal: &Principal,
) -> Result<&'a AgentRecord, Rejection> {
    let rec = current.ok_or_else(|| Rejection::NotFound { id: id.to_string() })?;
    not_federated(current, id)?;
    if rec.envelope.deleted {
        return Err(Rejection::Deleted {
            id: id.to_string(),
            revision: rec.envelope.revision,
        });
    }
    if !rec.managed_by(principal) {
        return Err(Rejection::Forbidden {
            id: id.to_string(),
            principal: principal.name.clone(),
        });
    }
    Ok(rec)
}

/// Decides a deletion: the record becomes a tombstone at `revision`.
pub fn decide_delete(
    current: Option<&AgentRecord>,
    id: &str,
    principal: &Principal,
    revision: u64,
    now: &str,
) -> Result<AgentRecord, Rejection> {
    let mut rec = live_managed(current, id, principal)?.clone();
    rec.envelope.deleted = true;
    rec.envelope.revision = revision;
    rec.envelope.modified_at = now.to_string();
    Ok(rec)
}

/// Decides a lifecycle status change.
pub fn decide_status(
    current: Option<&AgentRecord>,
    id: &str,
    status: AgentStatus,
    reason: Option<String>,
    principal: &Principal,
    revision: u64,
    now: &str,
) -> Result<AgentRecord, Rejection> {
    let mut rec = live_managed(current, id, principal)?.clone();
    rec.metadata.status = Some(status);
    rec.envelope.status_reason = reason;
    rec.envelope.revision = revision;
    rec.envelope.modified_at = now.to_string();
    Ok(rec)
}

/// The verdict to store with `record`: the proposer's, unless the key it
/// relied on is no longer registered for this owner and id (the keys may
/// have changed between the check and the apply).
pub fn settle_verdict(
    verdict: PublisherVerification,
    record: &AgentRecord,
    keys: &[PublisherKey],
) -> PublisherVerification {
    if verdict.state != VerificationState::Verified {
        return verdict;
    }
    let still = verdict.key_id.as_deref().is_some_and(|id| {
        keys.iter().any(|k| {
            k.key_id == id
                && k.belongs_to(
                    &record.envelope.owner,
                    record.envelope.owner_tenant.as_deref(),
                )
                && k.covers(&record.metadata.id)
        })
    });
    if still {
        verdict
    } else {
        PublisherVerification::self_asserted(format!(
            "key {} is no longer registered for this publisher and id",
            verdict.key_id.unwrap_or_default()
        ))
    }
}

/// Decides a re-judging of `current`'s publisher verdict (after a key was
/// removed): a change only when the verdict no longer holds.
pub fn decide_reverify(
    current: Option<&AgentRecord>,
    id: &str,
    keys: &[PublisherKey],
    revision: u64,
    now: &str,
) -> Result<AgentRecord, Rejection> {
    let current = current
        .filter(|r| !r.envelope.deleted)
        .ok_or_else(|| Rejection::NotFound { id: id.into() })?;
    // A federated record carries its origin's verdict, judged against the
    // origin's publisher keys, not ours.
    if current.envelope.provenance.is_some() {
        return Err(Rejection::Unchanged { id: id.into() });
    }
    let Some(verdict) = current.envelope.publisher.clone() else {
        return Err(Rejection::Unchanged { id: id.into() });
    };
    let settled = settle_verdict(verdict.clone(), current, keys);
    if settled == verdict {
        return Err(Rejection::Unchanged { id: id.into() });
    }
    let mut rec = current.clone();
    rec.envelope.publisher = Some(settled);
    rec.envelope.revision = revision;
    rec.envelope.modified_at = now.to_string();
    Ok(rec)
}

/// Decides a change to the publisher keys; returns the new key list.
pub fn decide_publisher_key(
    keys: &[PublisherKey],
    key_id: &str,
    added: Option<PublisherKey>,
    principal: &Principal,
) -> Result<Vec<PublisherKey>, Rejection> {
    let mut next: Vec<PublisherKey> = keys.to_vec();
    let existing = next.iter().position(|k| k.key_id == key_id);
    match (added, existing) {
        (Some(key), Some(at)) => {
            if !next[at].belongs_to(&key.principal, key.tenant.as_deref()) {
                return Err(Rejection::KeyConflict {
                    key_id: key_id.into(),
                });
            }
            if !principal.may_manage(&key.principal, key.tenant.as_deref()) {
                return Err(Rejection::KeyForbidden {
                    key_id: key_id.into(),
                });
            }
            // Same key, same owner: its namespaces are replaced.
            next[at].namespaces = key.namespaces;
        }
        (Some(key), None) => {
            if !principal.may_manage(&key.principal, key.tenant.as_deref()) {
                return Err(Rejection::KeyForbidden {
                    key_id: key_id.into(),
                });
            }
            next.push(key);
        }
        (None, Some(at)) => {
            if !principal.may_manage(&next[at].principal, next[at].tenant.as_deref()) {
                return Err(Rejection::KeyForbidden {
                    key_id: key_id.into(),
                });
            }
            next.remove(at);
        }
        (None, None) => {
            return Err(Rejection::KeyNotFound {
                key_id: key_id.into(),
            })
        }
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::record::{Binding, Role};

    fn p(name: &str, role: Role) -> Principal {
        Principal::new(name, role)
    }

    fn meta(endpoint: &str, updated_at: Option<&str>, version: Option<&str>) -> AgentMetadata {
        AgentMetadata {
            id: "a".into(),
            name: "A".into(),
            description: "d".into(),
            bindings: vec![Binding {
                protocol: "https".into(),
                endpoint: endpoint.into(),
                ..Default::default()
            }],
            updated_at: updated_at.map(String::from),
            version: version.map(String::from),
            ..Default::default()
        }
    }

    fn create(m: AgentMetadata) -> AgentRecord {
        decide_put(
            None,
            m,
            None,
            &p("alice", Role::Publisher),
            WriteMode::Register,
            1,
            "t0",
        )
        .unwrap()
        .0
    }

    #[test]
    fn refresh_with_same_endpoint_and_newer_time() {
        let old = create(meta("https://x/", Some("2026-01-01T00:00:00Z"), None));
        let (rec, kind) = decide_put(
            Some(&old),
            meta("https://x/", Some("2026-02-01T00:00:00Z"), None),
            None,
            &p("alice", Role::Publisher),
            WriteMode::Register,
            2,
            "t1",
        )
        .unwrap();
        assert_eq!(kind, ChangeKind::Updated);
        assert_eq!(rec.envelope.created_revision, 1);
        assert_eq!(rec.envelope.revision, 2);
    }

    /// One write as apply rules 3 decide it: the write rules, then the
    /// floor.
    fn put_held(old: &AgentRecord, m: AgentMetadata) -> Result<AgentRecord, Rejection> {
        let (record, _) = decide_put(
            Some(old),
            m,
            None,
            &p("alice", Role::Publisher),
            WriteMode::Update,
            old.envelope.revision + 1,
            "t",
        )?;
        hold_freshness(record, Some(old))
    }

    #[test]
    fn leaving_freshness_out_does_not_lower_the_bar() {
        const T1: &str = "2026-01-01T00:00:00Z";
        const T2: &str = "2026-02-01T00:00:00Z";
        const T3: &str = "2026-03-01T00:00:00Z";
        let first =
            hold_freshness(create(meta("https://x/", Some(T2), Some("2.0"))), None).unwrap();
        assert_eq!(first.envelope.freshness_floor, None, "nothing to hold yet");

        // Both left out: the record is held to what the first carried.
        let bare = put_held(&first, meta("https://x/", None, None)).unwrap();
        let floor = bare.envelope.freshness_floor.clone().unwrap();
        assert_eq!(floor.updated_at.as_deref(), Some(T2));
        assert_eq!(floor.version.as_deref(), Some("2.0"));
        // A delayed older write after it is stale, by time or by version.
        assert!(matches!(
            put_held(&bare, meta("https://x/", Some(T1), None)),
            Err(Rejection::Stale { .. })
        ));
        assert!(matches!(
            put_held(&bare, meta("https://x/", None, Some("1.9"))),
            Err(Rejection::Stale { .. })
        ));
        // The floor carries across further writes that leave them out.
        let again = put_held(&bare, meta("https://x/", None, None)).unwrap();
        assert_eq!(
            again.envelope.freshness_floor,
            bare.envelope.freshness_floor
        );

        // A newer time replaces that part of the floor; the version part stays.
        let timed = put_held(&again, meta("https://x/", Some(T3), None)).unwrap();
        let floor = timed.envelope.freshness_floor.clone().unwrap();
        assert_eq!(floor.updated_at, None);
        assert_eq!(floor.version.as_deref(), Some("2.0"));
        // With both back in the metadata the floor is gone.
        let full = put_held(&timed, meta("https://x/", Some(T3), Some("2.1"))).unwrap();
        assert_eq!(full.envelope.freshness_floor, None);

        // A tombstone keeps its floor, so an older re-registration cannot
        // resurrect the id.
        let tomb = decide_delete(Some(&bare), "a", &p("alice", Role::Publisher), 9, "t").unwrap();
        let (back, _) = decide_put(
            Some(&tomb),
            meta("https://x/", Some(T1), None),
            None,
            &p("alice", Role::Publisher),
            WriteMode::Register,
            10,
            "t",
        )
        .unwrap();
        assert!(matches!(
            hold_freshness(back, Some(&tomb)),
            Err(Rejection::Stale { .. })
        ));
    }

    #[test]
    fn stale_time_or_version_is_refused() {
        let old = create(meta(
            "https://x/",
            Some("2026-02-01T00:00:00Z"),
            Some("1.2.0"),
        ));
        let alice = p("alice", Role::Publisher);
        let r = decide_put(
            Some(&old),
            meta("https://x/", Some("2026-01-01T00:00:00Z"), None),
            None,
            &alice,
            WriteMode::Update,
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::Stale { .. })));
        let r = decide_put(
            Some(&old),
            meta("https://x/", None, Some("1.10.0")),
            None,
            &alice,
            WriteMode::Update,
            2,
            "t",
        );
        assert!(r.is_ok(), "1.10.0 is newer than 1.2.0");
        let r = decide_put(
            Some(&old),
            meta("https://x/", None, Some("1.1.9")),
            None,
            &alice,
            WriteMode::Update,
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::Stale { .. })));
    }

    #[test]
    fn other_owner_conflicts_and_admin_may_manage() {
        let old = create(meta("https://x/", None, None));
        let r = decide_put(
            Some(&old),
            meta("https://x/", None, None),
            None,
            &p("bob", Role::Publisher),
            WriteMode::Register,
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::OwnedByOther { .. })));
        let r = decide_put(
            Some(&old),
            meta("https://x/", None, None),
            None,
            &p("bob", Role::Publisher),
            WriteMode::Update,
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::Forbidden { .. })));
        let r = decide_put(
            Some(&old),
            meta("https://y/", None, None),
            None,
            &p("root", Role::Admin),
            WriteMode::Update,
            2,
            "t",
        );
        assert_eq!(
            r.unwrap().0.envelope.owner,
            "alice",
            "an admin's update keeps the owner"
        );
    }

    #[test]
    fn register_with_other_endpoints_conflicts_but_update_may_change_them() {
        let old = create(meta("https://x/", None, None));
        let alice = p("alice", Role::Publisher);
        let r = decide_put(
            Some(&old),
            meta("https://y/", None, None),
            None,
            &alice,
            WriteMode::Register,
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::IncompatibleBindings { .. })));
        assert!(decide_put(
            Some(&old),
            meta("https://y/", None, None),
            None,
            &alice,
            WriteMode::Update,
            2,
            "t"
        )
        .is_ok());
    }

    #[test]
    fn tombstone_blocks_update_and_stale_resurrection() {
        let old = create(meta("https://x/", Some("2026-02-01T00:00:00Z"), None));
        let alice = p("alice", Role::Publisher);
        let tomb = decide_delete(Some(&old), "a", &alice, 2, "t").unwrap();
        assert!(tomb.envelope.deleted);
        assert!(matches!(
            decide_delete(Some(&tomb), "a", &alice, 3, "t"),
            Err(Rejection::Deleted { revision: 2, .. })
        ));
        let r = decide_put(
            Some(&tomb),
            meta("https://x/", Some("2026-01-01T00:00:00Z"), None),
            None,
            &alice,
            WriteMode::Register,
            3,
            "t",
        );
        assert!(matches!(r, Err(Rejection::Stale { .. })));
        let (rec, kind) = decide_put(
            Some(&tomb),
            meta("https://x/", Some("2026-03-01T00:00:00Z"), None),
            None,
            &p("bob", Role::Publisher),
            WriteMode::Register,
            3,
            "t",
        )
        .unwrap();
        assert_eq!(
            (
                kind,
                rec.envelope.owner.as_str(),
                rec.envelope.created_revision
            ),
            (ChangeKind::Created, "bob", 3)
        );
    }

    #[test]
    fn status_change_needs_ownership() {
        let old = create(meta("https://x/", None, None));
        let r = decide_status(
            Some(&old),
            "a",
            AgentStatus::Deprecated,
            Some("moved".into()),
            &p("bob", Role::Publisher),
            2,
            "t",
        );
        assert!(matches!(r, Err(Rejection::Forbidden { .. })));
        let rec = decide_status(
            Some(&old),
            "a",
            AgentStatus::Deprecated,
            Some("moved".into()),
            &p("alice", Role::Publisher),
            2,
            "t",
        )
        .unwrap();
        assert_eq!(rec.metadata.status, Some(AgentStatus::Deprecated));
        assert_eq!(rec.envelope.status_reason.as_deref(), Some("moved"));
    }

    #[test]
    fn a_re_registration_without_status_keeps_the_stored_one() {
        let alice = p("alice", Role::Publisher);
        let old = create(meta("https://x/", None, None));
        let retired = decide_status(
            Some(&old),
            "a",
            AgentStatus::Inactive,
            Some("replaced by b".into()),
            &alice,
            2,
            "t",
        )
        .unwrap();
        let put = |m: AgentMetadata| {
            let (mut r, _) =
                decide_put(Some(&retired), m, None, &alice, WriteMode::Register, 3, "t").unwrap();
            carry_status(Some(&retired), &mut r);
            r
        };
        let again = put(meta("https://x/", None, None));
        assert_eq!(again.metadata.status, Some(AgentStatus::Inactive));
        assert_eq!(
            again.envelope.status_reason.as_deref(),
            Some("replaced by b")
        );
        // Setting it in the metadata still works, and drops the old reason.
        let mut active = meta("https://x/", None, None);
        active.status = Some(AgentStatus::Active);
        let back = put(active);
        assert_eq!(back.metadata.status, Some(AgentStatus::Active));
        assert_eq!(back.envelope.status_reason, None);
        // A deleted record's status is not carried into a new one.
        let mut tomb = retired.clone();
        tomb.envelope.deleted = true;
        let mut fresh = decide_put(
            Some(&tomb),
            meta("https://x/", None, None),
            None,
            &alice,
            WriteMode::Register,
            4,
            "t",
        )
        .unwrap()
        .0;
        carry_status(Some(&tomb), &mut fresh);
        assert_eq!(fresh.metadata.status, None);
    }

    #[test]
    fn equal_timestamps_fall_back_to_versions() {
        let old = create(meta(
            "https://x/",
            Some("2026-02-01T00:00:00Z"),
            Some("1.2.0"),
        ));
        let alice = p("alice", Role::Publisher);
        let older = meta("https://x/", Some("2026-02-01T00:00:00Z"), Some("1.0.0"));
        assert!(matches!(
            decide_put(Some(&old), older, None, &alice, WriteMode::Update, 2, "t"),
            Err(Rejection::Stale { .. })
        ));
        let newer_time = meta("https://x/", Some("2026-03-01T00:00:00Z"), Some("1.0.0"));
        assert!(
            decide_put(
                Some(&old),
                newer_time,
                None,
                &alice,
                WriteMode::Update,
                2,
                "t"
            )
            .is_ok(),
            "a newer timestamp wins"
        );
    }
}
