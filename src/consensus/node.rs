//! The Raft node: starts openraft over the RocksDB stores, bootstraps a new
//! cluster once, and executes writes, read-index requests and membership
//! changes on the leader — passing them there from any follower.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{
    ChangeMembershipError, CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError,
};
use openraft::{BasicNode, ChangeMembers, Config, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tracing::{info, instrument, warn};

use super::batcher::Batcher;
use super::command::REFUSAL_RULES;
use super::faults::Faults;
use super::forward::{ForwardReply, Forwarded};
use super::membership_check::MembershipCheck;
use super::network::TransportError;
use super::{Command, CommandResult, LogId, Network, NodeId, Proposal, Raft};
use crate::storage::{
    DigestUnavailable, DiskSpace, LogStore, NoSpace, Reader, SnapshotStats, SnapshotWeight,
    SpaceStats, StateDigest, StateMachine,
};

/// Why a request could not be carried out. Crosses the internal transport
/// when a follower passes a request to the leader.
#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize)]
pub enum WriteError {
    /// This node is not the leader and could not pass the request on.
    #[error("not the leader{}", .leader.as_deref().map(|l| format!("; the leader is {l}")).unwrap_or_default())]
    NotLeader {
        leader_id: Option<NodeId>,
        leader: Option<String>,
    },
    /// No leader could be reached in time; nothing was done.
    #[error("{0}")]
    Unavailable(String),
    /// The request was sent but its outcome is unknown (the leader stopped
    /// answering); it may or may not have been applied.
    #[error("{0}")]
    Indeterminate(String),
    /// A membership change that the current membership does not allow.
    #[error("{0}")]
    Membership(String),
    /// Raft stopped or failed.
    #[error("consensus failure: {0}")]
    Fatal(String),
    /// The leader's disk is short of space; nothing was done.
    #[error("{0}")]
    NoSpace(String),
    /// A member runs an older release that could not apply the write as
    /// asked (`consensus::APPLY_RULES`); nothing was done.
    #[error("{0}")]
    Upgrading(String),
}

/// How long a leader tries to hand leadership over, before it stops or
/// when asked to.
pub const HAND_OFF_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the leader waits for a learner added with `wait` to catch up
/// (a snapshot and the log tail). A follower passing the request on, and
/// the public listeners' deadline (`api::gate::deadline`), each allow one
/// request timeout more, so the leader's own answer arrives first.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(300);

/// How many log entries a learner may be behind the leader and still be
/// promoted. etcd refuses to promote a learner that is not in sync, for
/// the same reason: a voter that cannot acknowledge yet enlarges the
/// quorum without adding to availability (a three-voter cluster that
/// promotes a stopped learner loses its quorum at the next failure).
const PROMOTE_LAG: u64 = 1_000;

/// How recently a member must have answered the leader to count as up in
/// a membership change's checks (etcd's health interval: 5 s).
pub const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

/// A learner's progress in words: "it has received nothing yet" or "it
/// holds N of M entries".
fn progress(matched: Option<u64>, last: u64) -> String {
    match matched {
        None => "it has received nothing yet".into(),
        Some(i) => format!("it holds {i} of {last} entries"),
    }
}

/// Why a write needing newer apply rules than the cluster follows is
/// refused rather than applied by rules a member would read differently.
fn upgrading(needed: u32, follows: u32) -> WriteError {
    WriteError::Upgrading(format!(
        "this write needs apply rules {needed}, and a member of the cluster follows only \
         {follows} (it runs an older release): nothing was done; retry once every member \
         runs this release"
    ))
}

/// A new cluster id: 16 random bytes, hex. None (and founding waits for
/// the next try) if the system has no randomness to give.
fn new_cluster_id() -> Option<String> {
    let mut bytes = [0u8; 16];
    match getrandom::fill(&mut bytes) {
        Ok(()) => Some(crate::crypto::hex(&bytes)),
        Err(e) => {
            warn!(error = %e, "no randomness for the cluster id");
            None
        }
    }
}

fn fatal(e: impl std::fmt::Display) -> WriteError {
    WriteError::Fatal(e.to_string())
}

fn not_leader(f: ForwardToLeader<NodeId, BasicNode>) -> WriteError {
    WriteError::NotLeader {
        leader_id: f.leader_id,
        leader: f.leader_node.map(|n| n.addr),
    }
}

/// The Raft role of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    #[default]
    Learner,
    Shutdown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }
}

/// A plain view of this node's Raft state for status APIs and metrics, so
/// the API layer needs no openraft types.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub raft_addr: String,
    pub role: Role,
    pub initialized: bool,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub is_leader: bool,
    pub last_log_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub snapshots_built: u64,
    pub snapshots_installed: u64,
    /// Record signatures computed on this node, and signatures it took
    /// from its leader instead (signing once), since it started.
    pub signatures_made: u64,
    pub signatures_taken: u64,
    /// Unix seconds of the last snapshot built or installed.
    pub last_snapshot_unix: Option<u64>,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// Every member's Raft address.
    pub addresses: BTreeMap<NodeId, String>,
    /// Leader only: per follower, the highest log index known to match.
    pub follower_matched: Vec<(NodeId, u64)>,
    /// The cluster id this node has applied (none until founded).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// Members refused for losing log entries they had acknowledged.
    #[serde(default)]
    pub refused: Vec<NodeId>,
    /// Leader only: members that have not answered it within
    /// `ANSWERED_WITHIN`.
    #[serde(default)]
    pub unreachable: Vec<NodeId>,
}

impl NodeStatus {
    /// The leader's Raft address, when known.
    pub fn leader_addr(&self) -> Option<&str> {
        self.leader
            .and_then(|l| self.addresses.get(&l))
            .map(String::as_str)
    }
}

/// How a node joins a cluster on its first start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// Become a single-voter cluster of itself.
    Single,
    /// A static member list (id → Raft address): the member with the lowest
    /// id initialises the cluster with all of them as voters; the others
    /// wait to hear from it. A StatefulSet's pods agree on this without
    /// talking to each other.
    Members(BTreeMap<NodeId, String>),
    /// Wait for `agentry cluster init` or to be added to a cluster.
    Manual,
}

/// Raft timing and limits.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub id: NodeId,
    pub advertise_addr: String,
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    pub snapshot_logs: u64,
    pub snapshot_keep_logs: u64,
    pub max_message_bytes: usize,
    /// How long a request may wait for a leader and its answer.
    pub request_timeout: Duration,
    /// How this node proves cluster membership to its peers.
    pub auth: super::ClusterAuth,
    /// The data directory's free-space check.
    pub space: DiskSpace,
    /// How the log is written and AppendEntries sent.
    pub encoding: super::codec::Encoding,
}

/// A running Raft node. Cheap to clone.
#[derive(Clone)]
pub struct RaftNode {
    pub id: NodeId,
    pub raft: Raft,
    advertise_addr: String,
    network: Network,
    committed: Arc<AtomicU64>,
    snapshots: Arc<SnapshotStats>,
    request_timeout: Duration,
    space: DiskSpace,
    /// Set while this leader hands leadership over (before it stops, or
    /// asked to): new writes wait for the next leader instead of growing
    /// the log the successor must match. One hand-off at a time.
    handing_off: Arc<AtomicBool>,
    /// Client writes proposed on this node and not answered yet.
    writes_in_flight: Arc<AtomicUsize>,
    /// The cluster id and members' incarnations every Raft RPC is checked
    /// against.
    check: MembershipCheck,
    /// Gathers client writes into batch entries when every member applies
    /// them.
    batcher: Batcher,
    /// How long a leader may go without a quorum answering it before it
    /// stops vouching for itself as the leader (the longest election
    /// timeout: by then the others may have elected another).
    quorum_lease: Duration,
    /// This node's applied state, which a write answered through it waits
    /// for (`settle`).
    applied: Reader,
}

/// How long a write answered through a follower waits for that follower to
/// apply it. The leader sends the commit at once (`consensus::transport`),
/// so a healthy follower takes about a millisecond; the bound only keeps a
/// follower cut off from the leader from holding the answer near its
/// deadline.
const SETTLE_WAIT: Duration = Duration::from_millis(250);

/// The revision a write result made, or the highest of a batch's.
fn revision_of(result: &CommandResult) -> Option<u64> {
    match result {
        CommandResult::Applied(change) => Some(change.revision),
        CommandResult::Batch(results) => results.iter().filter_map(revision_of).max(),
        _ => None,
    }
}

/// How long a node waits to have applied a check entry and hashed its
/// state: hashing reads every record (seconds at a million agents).
pub const DIGEST_WAIT: Duration = Duration::from_secs(60);

/// One member's answer to a consistency check.
#[derive(Debug, Clone)]
pub struct MemberDigest {
    pub id: NodeId,
    pub raft_addr: String,
    pub voter: bool,
    /// Its digest, or why it has none to give.
    pub digest: Result<StateDigest, String>,
}

/// Counts a proposal as in flight for as long as it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl RaftNode {
    /// The signatures this node offers as leader and takes as follower.
    pub fn signatures(&self) -> &Arc<crate::crypto::signature_book::SignatureBook> {
        self.network.signatures()
    }

    /// Starts the node and bootstraps a cluster if this node has never been
    /// part of one. A node restarting with existing data never
    /// re-initialises.
    pub async fn start(
        settings: NodeSettings,
        bootstrap: Bootstrap,
        log_store: LogStore,
        state_machine: StateMachine,
        faults: Faults,
    ) -> Result<Self, WriteError> {
        let config = Config {
            cluster_name: "agentry".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_timeout_ms,
            election_timeout_max: settings.election_timeout_ms * 2,
            // Snapshots are triggered by the state machine's log weight
            // (`SnapshotWeight`): refresh entries count less than others.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: settings.snapshot_keep_logs,
            // Purge in batches, but never so large that a small snapshot
            // interval keeps the whole log.
            purge_batch_size: (settings.snapshot_logs / 4).clamp(1, 256),
            // Bounded so one AppendEntries stays well below the message limit
            // even with records at the size limit.
            max_payload_entries: 64,
            install_snapshot_timeout: 60_000,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(fatal)?);
        let committed = log_store.committed_index();
        let snapshots = state_machine.snapshot_stats();
        let weight = state_machine.snapshot_weight();
        let applied = state_machine.reader();
        let check = MembershipCheck::new(
            settings.id,
            log_store.incarnation(),
            state_machine.cluster_record(),
        );
        let network = Network::new(
            settings.id,
            faults,
            settings.max_message_bytes,
            settings.auth.clone(),
            check.clone(),
            settings.encoding,
        )
        .with_signatures(state_machine.signature_book());
        let raft = Raft::new(
            settings.id,
            config,
            network.clone(),
            log_store.with_encoding(settings.encoding),
            state_machine,
        )
        .await
        .map_err(fatal)?;
        // With up to `max_payload_entries` entries per AppendEntries, a
        // batch of at most 1/128 of the message limit keeps a full one
        // within half of it.
        let batcher = Batcher::start(raft.clone(), settings.max_message_bytes / 128);
        let node = Self {
            id: settings.id,
            raft,
            advertise_addr: settings.advertise_addr,
            network,
            committed,
            snapshots,
            request_timeout: settings.request_timeout,
            quorum_lease: Duration::from_millis(settings.election_timeout_ms * 2),
            space: settings.space,
            handing_off: Arc::default(),
            writes_in_flight: Arc::default(),
            check,
            batcher,
            applied,
        };
        node.bootstrap(bootstrap).await?;
        tokio::spawn(node.clone().record_members());
        tokio::spawn(node.clone().take_snapshots(weight, settings.snapshot_logs));
        Ok(node)
    }

    /// Builds a snapshot whenever the state machine says one is due; ends
    /// when the Raft core stops.
    async fn take_snapshots(self, weight: Arc<SnapshotWeight>, every: u64) {
        let metrics = self.raft.metrics();
        let since = {
            let m = metrics.borrow();
            let applied = m.last_applied.map_or(0, |l| l.index);
            applied.saturating_sub(m.snapshot.map_or(0, |l| l.index))
        };
        weight.start(every, since);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = weight.due() => {
                    if let Err(e) = self.raft.trigger().snapshot().await {
                        tracing::warn!(error = %e, "a due snapshot could not be started");
                        return;
                    }
                }
                _ = tick.tick() => {
                    if metrics.has_changed().is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// This node's membership check (`membership_check`).
    pub fn membership_check(&self) -> &MembershipCheck {
        &self.check
    }

    /// While this node leads: founds the cluster id if there is none,
    /// records the incarnation of each member that has none on record (its
    /// own, and those members answered with), and the refusal of members it
    /// found had lost acknowledged log entries. Checked every second, which
    /// costs a lock and a map lookup, and at once when a refusal is decided
    /// (a leader that died before recording it would take it along); ends
    /// when the Raft core stops.
    async fn record_members(self) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let metrics = self.raft.metrics();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.network.refusal_decided() => {}
            }
            if metrics.has_changed().is_err() {
                return;
            }
            let members: Vec<NodeId> = {
                let m = metrics.borrow();
                if m.state != ServerState::Leader || m.running_state.is_err() {
                    continue;
                }
                m.membership_config
                    .membership()
                    .nodes()
                    .map(|(id, _)| *id)
                    .collect()
            };
            // Once every member has said it follows newer apply rules than
            // the cluster has on record, they are recorded, so a leader
            // elected later assumes them before it hears from everyone.
            let rules = self.network.rules_of_all(members.iter().copied());
            let raise = rules > self.check.cluster_rules();
            // A member that follows older rules would drop the refusal;
            // until all follow them it stays this leader's own.
            let refused = if rules >= REFUSAL_RULES {
                self.network.refusals_to_record()
            } else {
                BTreeMap::new()
            };
            let (cluster_id, incarnations) = match self.check.missing(&members, new_cluster_id) {
                Some(missing) => missing,
                None if raise || !refused.is_empty() => (None, BTreeMap::new()),
                None => continue,
            };
            if let Some(id) = &cluster_id {
                info!(node_id = self.id, cluster_id = %id, "founding the cluster id");
            }
            let nodes: Vec<NodeId> = incarnations.keys().copied().collect();
            let refusing: Vec<NodeId> = refused.keys().copied().collect();
            let command = Command::Cluster {
                cluster_id,
                incarnations,
                now: crate::domain::time::now(),
                rules: if raise { rules } else { 0 },
                refused,
            };
            // Bounded: a leader cut off from its quorum would otherwise wait
            // for this commit for as long as the partition lasts.
            let proposal = match Proposal::new(&command) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(node_id = self.id, error = %e, "cannot encode the members' record");
                    continue;
                }
            };
            let written =
                tokio::time::timeout(self.request_timeout, self.raft.client_write(proposal)).await;
            match written {
                Ok(Ok(_)) => {
                    if raise {
                        info!(
                            node_id = self.id,
                            rules, "the cluster follows apply rules {rules}"
                        );
                    }
                    if !nodes.is_empty() {
                        info!(node_id = self.id, members = ?nodes, "recorded members' data directories");
                    }
                    if !refusing.is_empty() {
                        tracing::warn!(
                            node_id = self.id,
                            members = ?refusing,
                            "recorded the refusal of members that lost acknowledged log entries; \
                             every leader refuses them until they are removed"
                        );
                    }
                }
                // Seen again on the next answer; whoever leads then records.
                Ok(Err(e)) => {
                    tracing::debug!(node_id = self.id, error = %e, "could not record members yet")
                }
                Err(_) => tracing::debug!(node_id = self.id, "recording members timed out"),
            }
        }
    }

    async fn bootstrap(&self, bootstrap: Bootstrap) -> Result<(), WriteError> {
        if self.raft.is_initialized().await.map_err(fatal)? {
            info!(node_id = self.id, "resuming existing cluster state");
            return Ok(());
        }
        match bootstrap {
            Bootstrap::Single => {
                self.initialize(BTreeMap::from([(self.id, self.advertise_addr.clone())]))
                    .await
            }
            Bootstrap::Members(members) => {
                if members.keys().next() != Some(&self.id) {
                    info!(
                        node_id = self.id,
                        "waiting for the member with the lowest id to initialise the cluster"
                    );
                    return Ok(());
                }
                // A first node that lost its data must not found a second
                // cluster next to the one its peers still form.
                for (id, addr) in members.iter().filter(|(id, _)| **id != self.id) {
                    let probe = self
                        .network
                        .forward(*id, addr, &Forwarded::Probe, Duration::from_secs(2))
                        .await;
                    if let Ok(Ok(ForwardReply::Probe { initialized: true })) = probe {
                        warn!(
                            node_id = self.id,
                            peer = id,
                            "this node has no Raft state but its peers already form a cluster; \
                             not initialising. Remove this node and add it back \
                             (agentry cluster remove / add / promote)"
                        );
                        return Ok(());
                    }
                }
                self.initialize(members).await
            }
            Bootstrap::Manual => {
                info!(
                    node_id = self.id,
                    "not initialised; waiting for `agentry cluster init` or to be added"
                );
                Ok(())
            }
        }
    }

    /// Initialises a new cluster with these voters (this node among them).
    #[instrument(skip(self), fields(node_id = self.id))]
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> Result<(), WriteError> {
        if !members.contains_key(&self.id) {
            return Err(WriteError::Membership(format!(
                "the initial members must include this node ({})",
                self.id
            )));
        }
        // Asked first so that a repeated `cluster init` is a plain conflict
        // for its caller, not an ERROR line from openraft in the node's log
        // and a message in openraft's internal notation.
        if self.raft.is_initialized().await.map_err(fatal)? {
            let m = self.raft.metrics().borrow().clone();
            return Err(WriteError::Membership(format!(
                "this node is already part of a cluster (term {}, last log index {}); \
                 `agentry cluster status` shows its members",
                m.current_term,
                m.last_log_index.unwrap_or_default()
            )));
        }
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .into_iter()
            .map(|(id, addr)| (id, BasicNode { addr }))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => {
                info!(node_id = self.id, "initialised a new cluster");
                Ok(())
            }
            Err(RaftError::APIError(e)) => Err(WriteError::Membership(format!(
                "this node is already part of a cluster: {e}"
            ))),
            Err(e) => Err(fatal(e)),
        }
    }

    /// The Raft address this node knows for member `id`.
    pub fn member_addr(&self, id: NodeId) -> Option<String> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
    }

    /// A leader no quorum has answered for longer than the quorum lease:
    /// cut off from the others, or removed from the voters. openraft keeps
    /// it leader until it hears of a newer term, so its readiness and
    /// `has_leader` would otherwise keep saying all is well while every
    /// write to it times out. A lone voter is its own quorum.
    fn isolated_leader(
        &self,
        m: &openraft::RaftMetrics<NodeId, BasicNode>,
        voters: &[NodeId],
    ) -> bool {
        if m.state != ServerState::Leader || voters == [m.id] {
            return false;
        }
        !voters.contains(&m.id)
            || m.millis_since_quorum_ack
                .is_none_or(|ms| Duration::from_millis(ms) > self.quorum_lease)
    }

    /// This node's Raft state as openraft last reported it.
    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let learners: Vec<NodeId> = membership.learner_ids().collect();
        let role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Candidate => Role::Candidate,
            ServerState::Shutdown => Role::Shutdown,
            ServerState::Follower if voters.contains(&m.id) => Role::Follower,
            _ => Role::Learner,
        };
        let (built, installed, last_at) = self.snapshots.read();
        let (signatures_made, signatures_taken) = self.signatures().counts();
        let unreachable = if m.state == ServerState::Leader {
            membership
                .nodes()
                .map(|(id, _)| *id)
                .filter(|&id| id != m.id && !self.network.heard_within(id, ANSWERED_WITHIN))
                .collect()
        } else {
            Vec::new()
        };
        NodeStatus {
            node_id: m.id,
            raft_addr: self.advertise_addr.clone(),
            role,
            initialized: m.last_log_index.is_some() || m.vote.leader_id.term > 0,
            term: m.current_term,
            leader: if self.isolated_leader(&m, &voters) {
                None
            } else {
                m.current_leader
            },
            is_leader: m.state == ServerState::Leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: self.committed.load(Ordering::Acquire),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            snapshots_built: built,
            snapshots_installed: installed,
            signatures_made,
            signatures_taken,
            last_snapshot_unix: last_at,
            voters,
            learners,
            addresses: membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
            follower_matched: m
                .replication
                .iter()
                .flatten()
                .filter(|(id, _)| **id != m.id)
                .map(|(id, l)| (*id, l.map(|l| l.index).unwrap_or(0)))
                .collect(),
            cluster_id: self.check.cluster_id(),
            refused: self.network.refused(),
            unreachable,
        }
    }

    /// The leader's status: this node's when it leads, else asked of the
    /// leader. `None` when no leader answers in time.
    pub async fn leader_status(&self) -> Option<NodeStatus> {
        let local = self.status();
        if local.is_leader {
            return Some(local);
        }
        match self
            .route(
                Forwarded::Status,
                Duration::from_secs(2).min(self.request_timeout),
            )
            .await
        {
            Ok(ForwardReply::Status(s)) => Some(*s),
            _ => None,
        }
    }

    /// Proposes a command and waits until it is committed and applied, on
    /// whichever node leads.
    #[instrument(level = "debug", skip_all, fields(agent_id = command.id()))]
    pub async fn write(&self, command: Command) -> Result<CommandResult, WriteError> {
        // Checked here too, not only by the leader: a leader of an older
        // release would drop what it cannot read (a precondition) and
        // apply the rest. The cluster's recorded rules say every member,
        // the leader included, followed them when they were recorded.
        let cluster = self.check.cluster_rules();
        if command.rules_needed() > cluster {
            return Err(upgrading(command.rules_needed(), cluster));
        }
        match self
            .route(Forwarded::Write(command), self.request_timeout)
            .await?
        {
            ForwardReply::Written(r) => {
                self.settle(&r).await;
                Ok(r)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Waits until this node has applied the change `result` made, up to
    /// `SETTLE_WAIT`: a client that wrote through a follower then reads its
    /// write there (a local read, discovery) as it would on the leader,
    /// which answers only once applied. Past the bound the write is
    /// answered all the same: it is committed.
    async fn settle(&self, result: &CommandResult) {
        let Some(revision) = revision_of(result) else {
            return;
        };
        // Subscribed before the check, so no change slips between them; the
        // revision is stored before its change is published.
        let mut changes = self.applied.subscribe();
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        while self.applied.applied_revision() < revision {
            match tokio::time::timeout_at(deadline, changes.recv()).await {
                Ok(Ok(_)) | Ok(Err(RecvError::Lagged(_))) => {}
                Ok(Err(RecvError::Closed)) | Err(_) => {
                    tracing::debug!(
                        revision,
                        applied = self.applied.applied_revision(),
                        "answering a write this node has not applied yet"
                    );
                    return;
                }
            }
        }
    }

    /// This node's digest of its state at the consistency check entry
    /// `index`, waiting up to [`DIGEST_WAIT`] for it to apply and hash it.
    async fn local_digest(&self, index: u64) -> Result<StateDigest, DigestUnavailable> {
        let metrics = self.raft.metrics();
        let applied = || metrics.borrow().last_applied.map_or(0, |l| l.index);
        self.applied.state_digest(index, applied, DIGEST_WAIT).await
    }

    /// Every member's digest of its state at the consistency check entry
    /// `index`, asked of all of them at once: this node's own, and the
    /// others' over the internal transport.
    #[instrument(level = "info", skip(self), fields(node_id = self.id))]
    pub async fn member_digests(&self, index: u64) -> Vec<MemberDigest> {
        let status = self.status();
        let asks = status.addresses.iter().map(|(&id, addr)| {
            let voter = status.voters.contains(&id);
            async move {
                let digest = if id == self.id {
                    self.local_digest(index).await.map_err(|e| e.to_string())
                } else {
                    let ask = Forwarded::Digest { index };
                    // The bound covers the asked node's own wait.
                    let within = DIGEST_WAIT + Duration::from_secs(5);
                    match self.network.forward(id, addr, &ask, within).await {
                        Ok(Ok(ForwardReply::Digest(d))) => Ok(d),
                        Ok(Ok(other)) => Err(unexpected(&other).to_string()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(e) => Err(format!("not reachable: {e}")),
                    }
                };
                MemberDigest {
                    id,
                    raft_addr: addr.clone(),
                    voter,
                    digest,
                }
            }
        });
        futures::future::join_all(asks).await
    }

    /// Read index: after this returns, this node has applied everything
    /// committed before the call, so a local read is linearizable. The leader
    /// confirms its leadership with a quorum; a follower asks the leader and
    /// then waits for its own state machine to catch up.
    #[instrument(level = "debug", skip_all, fields(node_id = self.id))]
    pub async fn read_barrier(&self) -> Result<u64, WriteError> {
        let index = match self
            .route(Forwarded::ReadIndex, self.request_timeout)
            .await?
        {
            ForwardReply::ReadIndex(i) => i,
            other => return Err(unexpected(&other)),
        };
        self.raft
            .wait(Some(self.request_timeout))
            .applied_index_at_least(Some(index), "read index")
            .await
            .map_err(|e| WriteError::Unavailable(format!("not caught up with the leader: {e}")))?;
        Ok(index)
    }

    /// Adds a learner.
    pub async fn add_learner(
        &self,
        id: NodeId,
        addr: String,
        wait: bool,
    ) -> Result<(), WriteError> {
        let timeout = if wait {
            CATCH_UP_TIMEOUT + self.request_timeout
        } else {
            self.request_timeout
        };
        self.route(Forwarded::AddLearner { id, addr, wait }, timeout)
            .await
            .map(|_| ())
    }

    /// Makes a learner a voter.
    pub async fn promote(&self, id: NodeId) -> Result<(), WriteError> {
        self.route(Forwarded::Promote { id }, self.request_timeout)
            .await
            .map(|_| ())
    }

    /// Hands leadership to the voter `to` (`None`: the most caught-up
    /// voter), wherever the leader is, and answers the new leader once
    /// this node knows it too.
    pub async fn transfer_leadership(&self, to: Option<NodeId>) -> Result<NodeId, WriteError> {
        let reply = self
            .route(Forwarded::TransferLeader { to }, self.request_timeout)
            .await?;
        let ForwardReply::Leader(leader) = reply else {
            return Err(WriteError::Fatal(format!(
                "a leadership transfer was answered {reply:?}"
            )));
        };
        // So the status read right after names the new leader.
        let _ = self
            .raft
            .wait(Some(Duration::from_secs(2)))
            .metrics(|m| m.current_leader == Some(leader), "the new leader")
            .await;
        Ok(leader)
    }

    /// Removes a member.
    pub async fn remove(&self, id: NodeId) -> Result<(), WriteError> {
        self.route(Forwarded::Remove { id }, self.request_timeout)
            .await
            .map(|_| ())
    }

    /// Executes `request` here if this node leads, else on the leader. Waits
    /// for an election when no leader is known, and follows leadership
    /// changes, until `timeout`.
    #[instrument(level = "debug", skip_all, fields(node_id = self.id, request = request.name()))]
    async fn route(
        &self,
        request: Forwarded,
        timeout: Duration,
    ) -> Result<ForwardReply, WriteError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let err = match self.execute(request.clone()).await {
                Err(WriteError::NotLeader {
                    leader_id: Some(leader),
                    leader: Some(addr),
                }) if leader != self.id => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    match self
                        .network
                        .forward(leader, &addr, &request, remaining)
                        .await
                    {
                        // Nothing was done: try again (leadership moved, or
                        // a membership change is still settling).
                        Ok(Err(e @ (WriteError::NotLeader { .. } | WriteError::Unavailable(_)))) => e,
                        Ok(answer) => return answer,
                        Err(e @ (TransportError::NotSent { .. } | TransportError::Refused { .. })) => {
                            WriteError::Unavailable(e.to_string())
                        }
                        Err(e) if request.idempotent() => WriteError::Unavailable(e.to_string()),
                        Err(e) => {
                            return Err(WriteError::Indeterminate(format!(
                                "the leader did not answer; the write may or may not have been applied: {e}"
                            )))
                        }
                    }
                }
                Err(e @ WriteError::NotLeader { .. }) | Err(e @ WriteError::Unavailable(_)) => e,
                answer => return answer,
            };
            if Instant::now() + pause >= deadline {
                return Err(match err {
                    WriteError::NotLeader { .. } => WriteError::Unavailable(format!(
                        "no leader reachable within {timeout:?}: {err}"
                    )),
                    e => e,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Whether every member applies batch entries, so client writes may be
    /// gathered into them (a member of an older version could not apply
    /// one).
    fn batches_applied(&self) -> bool {
        self.network.all_apply_batches(self.members())
    }

    fn members(&self) -> Vec<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    }

    /// Refuses to add a node that runs an older release than the cluster
    /// has moved to (as etcd refuses such a join): it would apply entries
    /// by rules the others do not follow. A node that cannot be asked yet
    /// is added; once it answers, the leader asks only for rules it follows.
    async fn refuse_older_release(&self, id: NodeId, addr: &str) -> Result<(), WriteError> {
        let cluster = self.check.cluster_rules();
        if cluster == 0 || id == self.id {
            return Ok(());
        }
        let probe = Forwarded::Probe;
        if let Err(e) = self
            .network
            .forward(id, addr, &probe, Duration::from_secs(2))
            .await
        {
            warn!(node_id = id, error = %e, "cannot ask the node which release it runs; adding it");
            return Ok(());
        }
        let theirs = self.network.answered_rules(id);
        if theirs < cluster {
            return Err(WriteError::Membership(format!(
                "node {id} runs an older release than the cluster: it follows apply rules \
                 {theirs}, the cluster {cluster}; run this release on it, then add it"
            )));
        }
        Ok(())
    }

    /// Executes a request on this node; `NotLeader` when it does not lead.
    pub async fn execute(&self, request: Forwarded) -> Result<ForwardReply, WriteError> {
        match request {
            Forwarded::Write(_) if self.handing_off.load(Ordering::Acquire) => {
                // The route loop retries, and forwards once the successor
                // leads.
                let next = self.status().leader.filter(|l| *l != self.id);
                Err(WriteError::NotLeader {
                    leader_id: next,
                    leader: next.and_then(|l| self.member_addr(l)),
                })
            }
            Forwarded::Write(mut command) => {
                // Refused before it reaches the log: a write RocksDB cannot
                // store would stop the Raft core. Only the leader's disk
                // counts; a follower short of space passes the write on.
                if self.raft.metrics().borrow().state == ServerState::Leader {
                    self.space
                        .check()
                        .map_err(|e| WriteError::NoSpace(e.to_string()))?;
                }
                // The rules it is applied by: the newest every member
                // follows.
                let rules = self.network.rules_of_all(self.members());
                command.set_rules(rules);
                if command.rules_needed() > rules {
                    return Err(upgrading(command.rules_needed(), rules));
                }
                // Encoded here, once: the log and every follower carry
                // these bytes.
                let proposal = Proposal::new(&command)
                    .map_err(|e| WriteError::Fatal(format!("cannot encode the command: {e}")))?;
                let started = Instant::now();
                let _in_flight = InFlight::new(&self.writes_in_flight);
                let written = if self.batches_applied() {
                    self.batcher.write(proposal).await
                } else {
                    self.raft
                        .client_write(proposal)
                        .await
                        .map(|r| r.data)
                        .map_err(write_error)
                };
                let result = written?;
                crate::metrics::observe_commit(started.elapsed());
                Ok(ForwardReply::Written(result))
            }
            Forwarded::ReadIndex => match self.raft.get_read_log_id().await {
                Ok((read, _)) => Ok(ForwardReply::ReadIndex(read.map(|l| l.index).unwrap_or(0))),
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                    Err(not_leader(f))
                }
                Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q))) => Err(
                    WriteError::Unavailable(format!("leadership not confirmed by a quorum: {q}")),
                ),
                Err(e) => Err(fatal(e)),
            },
            Forwarded::AddLearner { id, addr, wait } => {
                self.refuse_older_release(id, &addr).await?;
                self.network.forget_acknowledged(id);
                // openraft's own wait counts a learner as caught up while
                // it is within 5,000 entries, so a learner that never
                // answered passed it in any cluster with a shorter log.
                let added = self
                    .raft
                    .add_learner(id, BasicNode { addr }, false)
                    .await
                    .map_err(write_error)?;
                if wait && id != self.id {
                    self.wait_caught_up(id, added.log_id).await?;
                }
                Ok(ForwardReply::Done)
            }
            Forwarded::Promote { id } => {
                self.refuse_lagging_learner(id)?;
                self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                    .await
                    .map(|_| ForwardReply::Done)
            }
            Forwarded::Remove { id } => {
                let status = self.status();
                let change = if status.voters.contains(&id) {
                    if status.voters.len() == 1 {
                        return Err(WriteError::Membership(
                            "cannot remove the last voter".into(),
                        ));
                    }
                    if status.is_leader {
                        let remaining = status.voters.iter().copied().filter(|&v| v != id);
                        self.refuse_quorum_loss(
                            remaining.collect(),
                            &format!("removing node {id}"),
                        )?;
                    }
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                } else if status.learners.contains(&id) {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                } else {
                    return Err(WriteError::Membership(format!(
                        "node {id} is not a member of the cluster"
                    )));
                };
                self.change(change).await?;
                self.network.forget_acknowledged(id);
                Ok(ForwardReply::Done)
            }
            Forwarded::Campaign => {
                info!(
                    node_id = self.id,
                    "the leader is stopping and chose this node; campaigning"
                );
                self.raft.trigger().elect().await.map_err(fatal)?;
                Ok(ForwardReply::Done)
            }
            Forwarded::Probe => Ok(ForwardReply::Probe {
                initialized: self.status().initialized,
            }),
            Forwarded::TransferLeader { to } => self
                .hand_off(to, HAND_OFF_TIMEOUT)
                .await
                .map(ForwardReply::Leader),
            Forwarded::Digest { index } => self
                .local_digest(index)
                .await
                .map(ForwardReply::Digest)
                .map_err(|e| WriteError::Unavailable(e.to_string())),
            Forwarded::Status => {
                let status = self.status();
                if status.is_leader {
                    Ok(ForwardReply::Status(Box::new(status)))
                } else {
                    Err(WriteError::NotLeader {
                        leader_id: status.leader,
                        leader: status.leader_addr().map(String::from),
                    })
                }
            }
        }
    }

    /// Waits until learner `id` holds the log up to the entry that added
    /// it (`added`): everything committed before it joined, whether sent
    /// entry by entry or as a snapshot.
    async fn wait_caught_up(&self, id: NodeId, added: LogId) -> Result<(), WriteError> {
        let mut metrics = self.raft.metrics();
        let caught_up = async {
            loop {
                let matched = {
                    let m = metrics.borrow_and_update();
                    if m.membership_config.log_id() >= &Some(added)
                        && m.membership_config.membership().get_node(&id).is_none()
                    {
                        return Err(WriteError::Membership(format!(
                            "node {id} was removed while it was catching up"
                        )));
                    }
                    let Some(replication) = m.replication.as_ref() else {
                        // Asking again re-adds it and waits on the new leader.
                        return Err(WriteError::Unavailable(format!(
                            "leadership moved while node {id} was catching up"
                        )));
                    };
                    replication.get(&id).copied().flatten()
                };
                if matched.is_some_and(|l| l.index >= added.index) {
                    return Ok(());
                }
                if metrics.changed().await.is_err() {
                    return Err(WriteError::Fatal("Raft stopped".into()));
                }
            }
        };
        match tokio::time::timeout(CATCH_UP_TIMEOUT, caught_up).await {
            Ok(done) => done,
            Err(_) => Err(WriteError::Indeterminate(format!(
                "node {id} was added as a learner but has not caught up within {} s ({}); \
                 the leader keeps sending it the log: check that it runs and that its Raft \
                 address is right",
                CATCH_UP_TIMEOUT.as_secs(),
                self.learner_progress(id)
            ))),
        }
    }

    /// How far learner `id` has come, for an operator: "has received
    /// nothing yet" or "holds N of M entries".
    fn learner_progress(&self, id: NodeId) -> String {
        let m = self.raft.metrics().borrow().clone();
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).copied().flatten());
        progress(matched.map(|l| l.index), m.last_log_index.unwrap_or(0))
    }

    /// Refuses to promote a learner that is more than `PROMOTE_LAG` entries
    /// behind this leader (or has received nothing). Ids that are no
    /// learner are left to the membership change to judge, and so is
    /// everything on a follower (which passes the change to the leader).
    fn refuse_lagging_learner(&self, id: NodeId) -> Result<(), WriteError> {
        let m = self.raft.metrics().borrow().clone();
        let Some(replication) = m.replication.as_ref() else {
            return Ok(());
        };
        if !m
            .membership_config
            .membership()
            .learner_ids()
            .any(|l| l == id)
        {
            return Ok(());
        }
        let last = m.last_log_index.unwrap_or(0);
        let matched = replication.get(&id).copied().flatten().map(|l| l.index);
        if matched.is_some() && !self.network.heard_within(id, ANSWERED_WITHIN) {
            return Err(WriteError::Membership(format!(
                "node {id} has not answered the leader for {} s; promote it once it is up and \
                 has caught up",
                ANSWERED_WITHIN.as_secs()
            )));
        }
        if matched.is_none_or(|i| last.saturating_sub(i) > PROMOTE_LAG) {
            return Err(WriteError::Membership(format!(
                "node {id} is not in step with the leader ({}); promote it once it has \
                 caught up (`agentry cluster add --wait` waits for that)",
                progress(matched, last)
            )));
        }
        let voters = m.membership_config.membership().voter_ids().chain([id]);
        self.refuse_quorum_loss(voters.collect(), &format!("promoting node {id}"))
    }

    /// etcd's strict reconfiguration check: refuses a change after which
    /// fewer than a majority of `voters` answer this leader (itself, and
    /// those heard from within `ANSWERED_WITHIN`). Such a change could not
    /// commit without members that are down, and the cluster, caught
    /// between the old and the new membership, would take no writes until
    /// they came back. Leader only.
    fn refuse_quorum_loss(&self, voters: Vec<NodeId>, what: &str) -> Result<(), WriteError> {
        let (up, down): (Vec<NodeId>, Vec<NodeId>) = voters
            .iter()
            .partition(|&&v| v == self.id || self.network.heard_within(v, ANSWERED_WITHIN));
        let majority = voters.len() / 2 + 1;
        if up.len() >= majority {
            return Ok(());
        }
        Err(WriteError::Membership(format!(
            "{what} would leave voters {voters:?}, of which {down:?} have not answered the \
             leader for {} s: without a majority of {majority} up, the cluster would stop taking \
             writes. Bring those nodes back (or remove the ones that are gone for good) first",
            ANSWERED_WITHIN.as_secs()
        )))
    }

    async fn change(&self, change: ChangeMembers<NodeId, BasicNode>) -> Result<(), WriteError> {
        // `retain = false`: a removed voter leaves the cluster rather than
        // staying on as a learner.
        self.raft
            .change_membership(change, false)
            .await
            .map(|_| ())
            .map_err(write_error)
    }

    /// Waits until this node knows a leader, so the first request after start
    /// does not race the election.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<(), WriteError> {
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "leader elected")
            .await
            .map(|_| ())
            .map_err(|e| WriteError::Unavailable(e.to_string()))
    }

    /// Builds a snapshot of everything applied and waits for it, so a
    /// measurement that follows is not sharing the CPU with one the log
    /// policy would start on its own. A trigger while a snapshot is being
    /// built is ignored, so it is repeated until one covers `applied`.
    pub async fn snapshot_now(&self, timeout: Duration) -> Result<(), WriteError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let applied = self.raft.metrics().borrow().last_applied;
        loop {
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| WriteError::Unavailable(e.to_string()))?;
            let round = self
                .raft
                .wait(Some(Duration::from_secs(2)))
                .metrics(|m| m.snapshot >= applied, "snapshot built")
                .await;
            if round.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WriteError::Unavailable(format!(
                    "no snapshot covering {applied:?} within {timeout:?}"
                )));
            }
        }
    }

    /// Whether the data directory has room for more writes.
    pub fn space(&self) -> Result<(), NoSpace> {
        self.space.check()
    }

    /// The data directory's free space and what is kept free.
    pub fn space_stats(&self) -> SpaceStats {
        self.space.stats()
    }

    /// Why the Raft core stopped, when it has (a storage failure it could
    /// not get past): the node then answers reads only until restarted.
    pub fn core_stopped(&self) -> Option<String> {
        match &self.raft.metrics().borrow().running_state {
            Ok(()) => None,
            Err(fatal) => Some(fatal.to_string()),
        }
    }

    /// Resolves when the Raft core stops, with the reason. It watches the
    /// server metrics (role, vote, leader, membership), not the full ones:
    /// those change several times per write, and each change woke this
    /// waiter (on the main thread, a context switch per wake). A core that
    /// stops drops its metrics' senders, which ends the watch.
    pub async fn core_stop(&self) -> String {
        let mut server = self.raft.server_metrics();
        loop {
            if let Some(why) = self.core_stopped() {
                return why;
            }
            if server.changed().await.is_err() {
                return self
                    .core_stopped()
                    .unwrap_or_else(|| "the Raft core is gone".to_string());
            }
        }
    }

    /// Resolves once the Raft core has stopped and the data directory has
    /// room again: the moment a restart brings the node back. A core that
    /// stopped for another reason resolves at once.
    pub async fn wait_until_restart_helps(&self) -> String {
        let why = self.core_stop().await;
        tracing::error!(node_id = self.id, reason = %why, "the Raft core stopped; this node answers reads only, and exits for a restart once its data directory has room");
        while !self.space.has_room_to_restart() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        why
    }

    /// Before this node stops: if it leads, hands leadership to the most
    /// caught-up voter so the cluster does not wait an election timeout.
    /// Gives up after `timeout`; the cluster then elects a leader by itself
    /// once this node is gone.
    pub async fn hand_off_leadership(&self, timeout: Duration) -> Option<NodeId> {
        let status = self.status();
        if !status.is_leader || status.voters.len() < 2 {
            return None;
        }
        match self.hand_off(None, timeout).await {
            Ok(new) => {
                info!(new_leader = new, "handed leadership over before stopping");
                Some(new)
            }
            Err(e) => {
                warn!(error = %e, "leadership hand-off did not complete; stopping anyway");
                None
            }
        }
    }

    /// Hands this leader's leadership to the voter `to`, or to the most
    /// caught-up voter. openraft 0.9 has no transfer call; instead new
    /// writes wait here, the successor is waited for until it holds the
    /// whole log, and then asked to campaign (this leader grants its vote,
    /// as its own lease has run out, and steps down). Answers the new
    /// leader, or why there is none after `timeout`.
    #[instrument(skip(self), fields(node_id = self.id))]
    async fn hand_off(&self, to: Option<NodeId>, timeout: Duration) -> Result<NodeId, WriteError> {
        let status = self.status();
        if !status.is_leader {
            return Err(WriteError::NotLeader {
                leader_id: status.leader,
                leader: status.leader_addr().map(String::from),
            });
        }
        match to {
            Some(id) if id == self.id => return Ok(id),
            Some(id) if !status.voters.contains(&id) => {
                return Err(WriteError::Membership(format!(
                    "node {id} is not a voter of the cluster; only a voter can lead"
                )));
            }
            _ if status.voters.len() < 2 => {
                return Err(WriteError::Membership(
                    "the cluster has one voter; there is no other to hand leadership to".into(),
                ));
            }
            _ => {}
        }
        if self.handing_off.swap(true, Ordering::AcqRel) {
            return Err(WriteError::Membership(
                "a leadership hand-off is already in progress".into(),
            ));
        }
        // This node stays out of the elections it asks a successor to win.
        // Once the successor's campaign makes it step down, its own
        // election timer would otherwise fire and it could win the next
        // term again with a voter that still holds its lease. Under load it
        // won every term for 20 s while the successor was asked again and
        // again, in one CI run.
        self.raft.runtime_config().elect(false);
        let handed = self.hand_off_to(to, timeout).await;
        self.raft.runtime_config().elect(true);
        // Writes waiting meanwhile now find the new leader, or, when none
        // took over, this one again.
        self.handing_off.store(false, Ordering::Release);
        handed.ok_or_else(|| {
            let what = match to {
                Some(id) => format!("node {id} did not take over leadership"),
                None => "no voter took over leadership".into(),
            };
            WriteError::Unavailable(format!(
                "{what} within {} s (a successor must hold the whole log and win an election); this node still leads",
                timeout.as_secs()
            ))
        })
    }

    /// The hand-off's work, with new writes already held back.
    async fn hand_off_to(&self, to: Option<NodeId>, timeout: Duration) -> Option<NodeId> {
        let deadline = Instant::now() + timeout;
        // Proposals already made finish first, so the log's end is known
        // (the metrics' last index can trail entries just appended).
        while self.writes_in_flight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut handed = None;
        let mut asked = BTreeSet::new();
        while handed.is_none() && Instant::now() < deadline {
            let s = self.status();
            if !s.is_leader {
                // Another node won meanwhile (a campaign asked earlier).
                handed = s.leader.filter(|l| *l != self.id);
                if handed.is_none() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                continue;
            }
            // A voter holding the whole log (the one asked for, if any);
            // one not asked yet first.
            let mut caught_up: Vec<NodeId> = s
                .follower_matched
                .iter()
                .filter(|(id, matched)| {
                    s.voters.contains(id)
                        && to.is_none_or(|t| t == *id)
                        && *matched >= s.last_log_index
                })
                .map(|(id, _)| *id)
                .collect();
            caught_up.sort_by_key(|id| asked.contains(id));
            let Some((id, addr)) = caught_up
                .first()
                .and_then(|id| Some((*id, self.member_addr(*id)?)))
            else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            asked.insert(id);
            let answer = self
                .network
                .forward(id, &addr, &Forwarded::Campaign, Duration::from_secs(1))
                .await;
            if !matches!(answer, Ok(Ok(_))) {
                warn!(
                    successor = id,
                    ?answer,
                    "could not ask a successor to campaign"
                );
            }
            // An election takes a round trip; a refused one (the others
            // still follow this leader's lease) is asked again.
            let _ = self
                .raft
                .wait(Some(Duration::from_millis(500)))
                .metrics(
                    |m| m.current_leader.is_some_and(|l| l != self.id),
                    "another leader",
                )
                .await;
            handed = self.status().leader.filter(|l| *l != self.id);
        }
        handed
    }

    /// Stops Raft.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            warn!(error = %e, "Raft did not shut down cleanly");
        }
    }
}

pub(super) fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(f),
        // The previous change is not committed yet; it will be shortly.
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(p),
        )) => WriteError::Unavailable(format!("another membership change is in progress: {p}")),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(m)) => {
            WriteError::Membership(match m {
                ChangeMembershipError::LearnerNotFound(l) => format!(
                    "node {} must be added as a learner before it can be promoted",
                    l.node_id
                ),
                other => other.to_string(),
            })
        }
        RaftError::Fatal(f) => fatal(f),
    }
}

fn unexpected(reply: &ForwardReply) -> WriteError {
    WriteError::Fatal(format!("unexpected answer from the leader: {reply:?}"))
}
