//! Requests that only the leader can execute. Any node accepts them from a
//! client; a follower sends them to the leader over the internal transport
//! (`RaftTransport.Forward`), so clients never need to know who leads.

use serde::{Deserialize, Serialize};

use super::{Command, CommandResult, NodeId, NodeStatus};
use crate::storage::StateDigest;

/// A request executed on the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Forwarded {
    /// A client write.
    Write(Command),
    /// Read index: the leader confirms its leadership with a quorum and
    /// answers the log index a linearizable read must wait for.
    ReadIndex,
    /// Add a learner (optionally waiting until it caught up).
    AddLearner {
        id: NodeId,
        addr: String,
        wait: bool,
    },
    /// Make a learner a voter.
    Promote { id: NodeId },
    /// Remove a voter or learner.
    Remove { id: NodeId },
    /// The leader's view of the cluster (replication progress).
    Status,
    /// Whether the receiving node belongs to a cluster already (answered by
    /// any node, leader or not).
    Probe,
    /// From a leader about to stop, to the follower it chose: start an
    /// election now (answered by that node, not forwarded).
    Campaign,
    /// Hand leadership to the voter `to` (`None`: the most caught-up one),
    /// as a stopping leader does; answered with the new leader.
    TransferLeader { to: Option<NodeId> },
    /// The receiving node's digest of its state at the consistency check
    /// entry `index` (answered by that node, not forwarded).
    Digest { index: u64 },
}

impl Forwarded {
    /// Whether executing it twice is harmless, so a send whose answer was
    /// lost may be retried. Client writes are not: a retried delete would
    /// answer "gone" for its own success; nor is a transfer to whichever
    /// voter is most caught up, which the new leader would pass on again.
    pub fn idempotent(&self) -> bool {
        !matches!(
            self,
            Forwarded::Write(_) | Forwarded::TransferLeader { to: None }
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Forwarded::Write(_) => "write",
            Forwarded::ReadIndex => "read_index",
            Forwarded::AddLearner { .. } => "add_learner",
            Forwarded::Promote { .. } => "promote",
            Forwarded::Remove { .. } => "remove",
            Forwarded::Status => "status",
            Forwarded::Probe => "probe",
            Forwarded::Campaign => "campaign",
            Forwarded::TransferLeader { .. } => "transfer_leader",
            Forwarded::Digest { .. } => "digest",
        }
    }
}

/// The leader's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardReply {
    Written(CommandResult),
    ReadIndex(u64),
    Done,
    Status(Box<NodeStatus>),
    Probe {
        initialized: bool,
    },
    /// The node that leads after a transfer.
    Leader(NodeId),
    Digest(StateDigest),
}
