//! The Raft node: starts openraft over the RocksDB stores, initialises a
//! single-voter cluster on first start, and turns client writes into
//! committed, applied commands.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, SnapshotPolicy};
use tracing::{info, instrument};

use super::{Command, CommandResult, Network, NodeId, Raft};
use crate::storage::{LogStore, StateMachine};

/// Why a write could not be committed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// This node is not the leader; the leader's address, when known.
    #[error("not the leader{}", .leader.as_deref().map(|l| format!("; the leader is {l}")).unwrap_or_default())]
    NotLeader { leader: Option<String> },
    /// Raft stopped or failed.
    #[error("consensus failure: {0}")]
    Fatal(String),
}

/// A plain view of this node's Raft state for status APIs and metrics, so
/// the API layer needs no openraft types.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub is_leader: bool,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub voters: Vec<NodeId>,
    /// Leader only: per follower, the highest log index known to match.
    pub follower_matched: Vec<(NodeId, u64)>,
}

/// A running Raft node.
#[derive(Clone)]
pub struct RaftNode {
    pub id: NodeId,
    pub raft: Raft,
}

impl RaftNode {
    /// Starts the node. A node whose log is empty and which has never been
    /// initialised becomes a single-voter cluster of itself; a node restarting
    /// with existing data never re-initialises.
    pub async fn start(
        id: NodeId,
        advertise_addr: String,
        log_store: LogStore,
        state_machine: StateMachine,
        snapshot_logs: u64,
    ) -> Result<Self, WriteError> {
        let config = Config {
            cluster_name: "agentry".into(),
            heartbeat_interval: 250,
            election_timeout_min: 1000,
            election_timeout_max: 2000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_logs),
            max_in_snapshot_log_to_keep: 1000,
            purge_batch_size: 256,
            ..Default::default()
        };
        let config = Arc::new(
            config
                .validate()
                .map_err(|e| WriteError::Fatal(e.to_string()))?,
        );
        let raft = Raft::new(id, config, Network, log_store, state_machine)
            .await
            .map_err(|e| WriteError::Fatal(e.to_string()))?;
        if !raft
            .is_initialized()
            .await
            .map_err(|e| WriteError::Fatal(e.to_string()))?
        {
            let members = BTreeMap::from([(
                id,
                BasicNode {
                    addr: advertise_addr,
                },
            )]);
            raft.initialize(members)
                .await
                .map_err(|e| WriteError::Fatal(e.to_string()))?;
            info!(node_id = id, "initialised a new single-voter cluster");
        } else {
            info!(node_id = id, "resuming existing cluster state");
        }
        Ok(Self { id, raft })
    }

    /// This node's Raft state as openraft last reported it.
    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow().clone();
        NodeStatus {
            node_id: m.id,
            term: m.current_term,
            leader: m.current_leader,
            is_leader: m.state == openraft::ServerState::Leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            voters: m.membership_config.voter_ids().collect(),
            follower_matched: m
                .replication
                .iter()
                .flatten()
                .filter(|(id, _)| **id != m.id)
                .map(|(id, l)| (*id, l.map(|l| l.index).unwrap_or(0)))
                .collect(),
        }
    }

    /// Proposes a command and waits until it is committed and applied.
    #[instrument(level = "debug", skip_all, fields(agent_id = command.id()))]
    pub async fn write(&self, command: Command) -> Result<CommandResult, WriteError> {
        match self.raft.client_write(command).await {
            Ok(resp) => Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Err(e) => Err(WriteError::Fatal(e.to_string())),
        }
    }

    /// Waits until this node knows a leader, so the first request after start
    /// does not race the election.
    pub async fn wait_for_leader(&self, timeout: std::time::Duration) -> Result<(), WriteError> {
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "leader elected")
            .await
            .map(|_| ())
            .map_err(|e| WriteError::Fatal(e.to_string()))
    }

    /// Confirms leadership with a quorum before a linearizable read.
    pub async fn read_barrier(&self) -> Result<(), WriteError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Err(e) => Err(WriteError::Fatal(e.to_string())),
        }
    }
}
