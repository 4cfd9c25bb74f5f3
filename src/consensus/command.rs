//! The registry's Raft commands. Everything `apply` needs travels inside the
//! command (the caller, the leader's clock), so applying it is deterministic
//! on every node.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::NodeId;

use crate::crypto::{IdentityChange, IdentityRefusal};
use crate::domain::audit::AuditContext;
use crate::domain::federation::FederatedChange;
use crate::domain::lease::{LeaseState, Refresh};
use crate::domain::write::{Quota, RecordLimit, Rejection, WriteMode};
use crate::domain::{
    AgentMetadata, AgentStatus, Change, Principal, PublisherKey, PublisherVerification, ReadGrant,
    Visibility,
};

/// The rules by which this binary applies commands. A change to what
/// applying an existing command does would make nodes of two versions
/// disagree during a rolling upgrade, so the new behaviour is asked for in
/// the command (`rules`), and a leader asks for it only once every member
/// says it follows it (`RaftMessage.rules`); entries of older versions,
/// and those proposed while any member is older, keep the old behaviour.
///
/// 1. A registration that leaves out `status` keeps the stored one; a copy
///    from a peer's full listing replaces the kept copy unless it is that
///    very version (older after the peer was restored from a backup; a
///    copy withdrawn here comes back); a federation skip sets the peer's
///    cursor (back, after a restore) instead of only moving it on.
/// 2. A deletion or status change may carry a precondition
///    (`expected_revision`, HTTP `If-Match`); an older node would ignore it
///    and apply what the others refuse, so such a command is proposed only
///    once every member follows rules 2 ([`Command::rules_needed`]).
/// 3. A registration or update is also stale when it is older than what
///    earlier metadata of the id carried and the current metadata leaves
///    out (`Envelope::freshness_floor`, `domain::write::hold_freshness`);
///    an older node keeps no floor and would accept it.
/// 4. The cluster record may refuse a member that lost log entries it had
///    acknowledged (`Command::Cluster::refused`); an older node would drop
///    the refusal and, as leader, feed the member the log again.
/// 5. A copy from a peer's feed is held to the live copies kept of that
///    peer (`Command::Federate::quota`); an older node keeps no such count
///    and would keep the copy the others refuse, so the quota is applied
///    only by these rules and ignored in entries asking for older ones.
/// 6. A consistency check (`Command::Check`) makes every node hash its
///    state as of that entry; an older node cannot read the command at
///    all, so it is proposed only once every member follows rules 6.
///
/// The newest rules an applied entry asked for are kept in the replicated
/// state (`ClusterRecord::apply_rules`), as etcd keeps its cluster
/// version: a new leader assumes them of members it has not heard from
/// yet, and a node whose binary follows older rules than an entry asks for
/// stops rather than apply it differently from the others.
pub const APPLY_RULES: u32 = 6;

/// The apply rules a refusal in the cluster record takes ([`APPLY_RULES`]).
pub const REFUSAL_RULES: u32 = 4;

/// The apply rules a consistency check takes ([`APPLY_RULES`]).
pub const CHECK_RULES: u32 = 6;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One replicated write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    /// Register or update metadata.
    Put {
        /// Boxed: records are large next to the other commands.
        metadata: Box<AgentMetadata>,
        visibility: Option<Visibility>,
        /// Readers of a private record; replaces the stored list whenever
        /// `visibility` is set (absent in entries from older versions).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        readers: Vec<ReadGrant>,
        principal: Principal,
        mode: WriteMode,
        now: String,
        /// The verdict on the publisher's signature, judged by the node
        /// that took the request (absent in entries from older versions).
        #[serde(default)]
        publisher: Option<PublisherVerification>,
        /// Record quota a new record is held to (none: admins, and entries
        /// from older versions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quota: Option<Quota>,
        /// Applied only if the stored record (or its tombstone) still has
        /// this revision, 0 meaning none: a read-modify-write such as an
        /// MCP publish merging a version into the record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_revision: Option<u64>,
        /// The apply rules the leader asked for ([`APPLY_RULES`]).
        #[serde(default, skip_serializing_if = "is_zero")]
        rules: u32,
    },
    /// Delete, leaving a tombstone.
    Delete {
        id: String,
        principal: Principal,
        now: String,
        /// Applied only if the stored record still has this revision
        /// (apply rules 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_revision: Option<u64>,
    },
    /// Set the lifecycle status.
    SetStatus {
        id: String,
        status: AgentStatus,
        reason: Option<String>,
        principal: Principal,
        now: String,
        /// Applied only if the stored record still has this revision
        /// (apply rules 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_revision: Option<u64>,
    },
    /// Register or remove a publisher's key.
    PublisherKey {
        change: PublisherKeyChange,
        principal: Principal,
        now: String,
    },
    /// Re-judge a record's publisher verdict against the keys registered
    /// now (after a key it relied on was removed).
    Reverify { id: String, now: String },
    /// Change the registry's signing identity (keys are made before the
    /// command is proposed, so applying it is deterministic).
    Identity { change: IdentityChange, now: String },
    /// Keep a change from a peer registry's feed. `cursor`: the peer
    /// revision consumed through this change, stored with it so a follower
    /// resumes exactly after a restart (None while a full listing is read).
    Federate {
        peer: String,
        change: FederatedChange,
        cursor: Option<u64>,
        now: String,
        /// Live copies of this peer a new copy is held to (apply rules 5;
        /// none: no limit, and entries from older versions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quota: Option<u64>,
        /// The apply rules the leader asked for ([`APPLY_RULES`]).
        #[serde(default, skip_serializing_if = "is_zero")]
        rules: u32,
    },
    /// A client's command with who asked: applying it also appends the
    /// audit entry of its outcome to the replicated trail.
    Audited {
        command: Box<Command>,
        audit: AuditContext,
    },
    /// Changes nothing but the audit trail: records an admin action that
    /// took effect outside the state machine (a membership change).
    Note { now: String },
    /// Changes nothing: marks the entry at which every node digests its
    /// replicated state for the replica consistency check
    /// (`storage::digest`).
    Check { now: String },
    /// Moves a named cursor of a follower of another registry forward (the
    /// MCP registry mirror's `updatedAt`, `mcp-upstream:<url>`): kept with
    /// the federation cursors, so snapshots and backups carry it and a new
    /// leader resumes where the last one stopped. Never moves back.
    Cursor {
        name: String,
        value: u64,
        now: String,
    },
    /// Refreshes agents' and shared leases' expiry (`domain::lease`): the
    /// refreshes of many clients, gathered by the proposing node into one
    /// small entry. Records are not touched.
    Refresh {
        refreshes: Vec<Refresh>,
        now: String,
    },
    /// Revokes a shared lease; the agents it held expire.
    RevokeLease {
        name: String,
        principal: Principal,
        now: String,
    },
    /// Founds the cluster id (when there is none) and records members' data
    /// directory incarnations (those without one); `membership_check`.
    Cluster {
        cluster_id: Option<String>,
        incarnations: BTreeMap<NodeId, String>,
        now: String,
        /// Apply rules every member has said it follows, to record
        /// (`ClusterRecord::apply_rules`); proposed only once all have.
        #[serde(default, skip_serializing_if = "is_zero")]
        rules: u32,
        /// Members to refuse, with why: each lost log entries it had
        /// acknowledged (`ClusterRecord::refused`).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        refused: BTreeMap<NodeId, String>,
    },
    /// Commands of many clients that reached the leader together, in one
    /// log entry (`consensus::batcher`): applied one after another exactly
    /// as consecutive entries would be, each with its own revision and
    /// outcome (`CommandResult::Batch`). Never nested; proposed only once
    /// every member has said it applies batches.
    Batch(Vec<Command>),
}

impl Command {
    /// Asks for the apply rules `rules` (the newest every member follows).
    pub fn set_rules(&mut self, rules: u32) {
        match self {
            Self::Put { rules: r, .. } | Self::Federate { rules: r, .. } => *r = rules,
            Self::Audited { command, .. } => command.set_rules(rules),
            Self::Batch(commands) => commands.iter_mut().for_each(|c| c.set_rules(rules)),
            _ => {}
        }
    }

    /// The apply rules applying this command takes: those its leader asked
    /// for, or what a field only newer nodes read requires.
    pub fn rules_needed(&self) -> u32 {
        match self {
            Self::Put { rules, .. } | Self::Federate { rules, .. } => *rules,
            Self::Cluster { rules, refused, .. } if !refused.is_empty() => {
                (*rules).max(REFUSAL_RULES)
            }
            Self::Cluster { rules, .. } => *rules,
            Self::Delete {
                expected_revision: Some(_),
                ..
            }
            | Self::SetStatus {
                expected_revision: Some(_),
                ..
            } => 2,
            Self::Check { .. } => CHECK_RULES,
            Self::Audited { command, .. } => command.rules_needed(),
            Self::Batch(commands) => commands.iter().map(Self::rules_needed).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// What a new live record this command stores is held to, by the
    /// rules the entry asked for.
    pub fn record_limit(&self) -> Option<RecordLimit> {
        match self {
            Self::Put { quota, .. } => quota.map(RecordLimit::Records),
            Self::Federate {
                quota: Some(n),
                rules,
                ..
            } if *rules >= 5 => Some(RecordLimit::Copies(*n)),
            _ => None,
        }
    }

    /// The revision the stored record must still have for the command to
    /// apply (a client's precondition).
    pub fn expected_revision(&self) -> Option<u64> {
        match self {
            Self::Put {
                expected_revision, ..
            }
            | Self::Delete {
                expected_revision, ..
            }
            | Self::SetStatus {
                expected_revision, ..
            } => *expected_revision,
            Self::Audited { command, .. } => command.expected_revision(),
            _ => None,
        }
    }

    /// The agent id the command writes, if it writes one record.
    pub fn id(&self) -> Option<&str> {
        match self {
            Self::Put { metadata, .. } => Some(&metadata.id),
            Self::Delete { id, .. } | Self::SetStatus { id, .. } | Self::Reverify { id, .. } => {
                Some(id)
            }
            Self::Federate { change, .. } => change.id(),
            Self::Audited { command, .. } => command.id(),
            Self::Identity { .. }
            | Self::PublisherKey { .. }
            | Self::Note { .. }
            | Self::Check { .. }
            | Self::Cursor { .. }
            | Self::Refresh { .. }
            | Self::RevokeLease { .. }
            | Self::Cluster { .. }
            | Self::Batch(_) => None,
        }
    }

    /// The leader's clock when the command was made.
    pub fn now(&self) -> &str {
        match self {
            Self::Put { now, .. }
            | Self::Delete { now, .. }
            | Self::SetStatus { now, .. }
            | Self::PublisherKey { now, .. }
            | Self::Reverify { now, .. }
            | Self::Identity { now, .. }
            | Self::Federate { now, .. }
            | Self::Note { now }
            | Self::Check { now }
            | Self::Cursor { now, .. }
            | Self::Refresh { now, .. }
            | Self::RevokeLease { now, .. }
            | Self::Cluster { now, .. } => now,
            Self::Audited { command, .. } => command.now(),
            Self::Batch(commands) => commands.first().map_or("", Command::now),
        }
    }
}

impl Command {
    /// The first unknown member named like a defined one in the record
    /// this command would store (`AgentMetadata::clashing_member`).
    fn clashing_member(&self) -> Option<String> {
        match self {
            Self::Put { metadata, .. } => metadata.clashing_member(),
            Self::Federate {
                change: FederatedChange::Copy { metadata, .. },
                ..
            } => metadata.clashing_member(),
            Self::Audited { command, .. } => command.clashing_member(),
            Self::Batch(commands) => commands.iter().find_map(Command::clashing_member),
            _ => None,
        }
    }
}

/// A command as the log stores it and followers receive it: its JSON,
/// encoded once by the node that proposes it and carried as bytes from
/// then on (`consensus::codec`), so a record is never encoded again per
/// follower or per log append. Each node decodes it once, to apply it.
///
/// Its serde form is the command's own JSON, which is how log entries were
/// written before the binary encoding: those still load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal(Bytes);

impl Proposal {
    /// Refuses a command whose record has an unknown member named like a
    /// defined one: its JSON would hold that member twice, and no node
    /// could decode the entry to apply it. (The API refuses such records
    /// by field first; this holds for every path that proposes.)
    pub fn new(command: &Command) -> Result<Self, serde_json::Error> {
        if let Some(pointer) = command.clashing_member() {
            return Err(serde::ser::Error::custom(format!(
                "{pointer}: an unknown member may not reuse the name of a member the record defines"
            )));
        }
        serde_json::to_vec(command).map(|json| Self(json.into()))
    }

    /// A command's bytes as another node encoded them.
    pub fn from_bytes(json: Bytes) -> Self {
        Self(json)
    }

    /// The `Command::Batch` of `parts`, made from their bytes as they are
    /// (each was encoded once, when it was proposed).
    pub fn batch(parts: &[Proposal]) -> Self {
        let len = parts.iter().map(|p| p.0.len() + 1).sum::<usize>() + 12;
        let mut json = Vec::with_capacity(len);
        json.extend_from_slice(b"{\"Batch\":[");
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            json.extend_from_slice(&part.0);
        }
        json.extend_from_slice(b"]}");
        Self(json.into())
    }

    /// The size of the command's encoding.
    pub fn encoded_len(&self) -> usize {
        self.0.len()
    }

    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The command. An entry written before `new` refused clashing
    /// members holds such a member twice and fails the strict decode; it is
    /// decoded through a JSON value instead (the later copy wins), the same
    /// way on every node, so the log replays instead of stopping the node.
    pub fn command(&self) -> Result<Command, serde_json::Error> {
        serde_json::from_slice(&self.0).or_else(|strict| {
            serde_json::from_slice::<serde_json::Value>(&self.0)
                .and_then(serde_json::from_value)
                .map_err(|_| strict)
        })
    }
}

impl Serialize for Proposal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.command()
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Proposal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Proposal::new(&Command::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// A change to the registered publisher keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PublisherKeyChange {
    /// `key_id` is computed from `public_key` by the proposer (checked).
    Add {
        key_id: String,
        public_key: String,
        namespaces: Vec<String>,
        /// The principal the key belongs to.
        owner: String,
        /// That principal's tenant.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner_tenant: Option<String>,
    },
    Remove {
        key_id: String,
    },
}

/// The outcome of applying one log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The write happened; this is the change it made. Shared: the same
    /// change goes to the caller and onto the live channel the discovery
    /// index reads, and a record is too large to copy for each.
    Applied(Arc<Change>),
    /// The write was refused by the registry's rules; nothing changed.
    Rejected(Rejection),
    /// An identity change took effect (`changed` false: it was already so);
    /// `resigned` records were signed again because their key left service.
    IdentityChanged { changed: bool, resigned: u64 },
    /// The publisher keys after a change, and the records that relied on
    /// a removed key (to be re-judged).
    PublisherKeys {
        keys: Vec<PublisherKey>,
        affected: Vec<String>,
    },
    /// The identity change was refused; nothing changed.
    IdentityRefused(IdentityRefusal),
    /// Each refresh's outcome, in order, or a revocation's.
    Leases(Vec<Result<LeaseState, Rejection>>),
    /// A blank or membership entry; there is no client to answer.
    Internal,
    /// A consistency check entry was applied at this log index and
    /// revision; each node's digest is kept under the index.
    Checked { index: u64, revision: u64 },
    /// The outcome of each command of a `Command::Batch`, in order.
    Batch(Vec<CommandResult>),
}
