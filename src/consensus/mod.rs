//! Consensus: the Raft type configuration, the commands every write becomes,
//! the node that proposes them, and the internal gRPC transport between
//! nodes. A write is only acknowledged once openraft has committed its log
//! entry and the state machine has applied it.

pub(crate) mod batcher;
pub mod cluster_auth;
pub mod codec;
mod command;
mod faults;
mod forward;
mod membership_check;
mod network;
mod node;
mod transport;

pub use cluster_auth::{ClusterAuth, ClusterAuthConfig};
pub use command::{Command, CommandResult, Proposal, PublisherKeyChange, APPLY_RULES};
pub use faults::{Faults, LinkFault};
pub use forward::Forwarded;
pub use membership_check::{ClusterRecord, MembershipCheck, SharedRecord};
pub use network::{Network, WINDOW};
pub use node::{
    Bootstrap, MemberDigest, NodeSettings, NodeStatus, RaftNode, Role, WriteError, ANSWERED_WITHIN,
    CATCH_UP_TIMEOUT, DIGEST_WAIT, HAND_OFF_TIMEOUT,
};
pub use transport::RaftService;

openraft::declare_raft_types!(
    /// Raft types of the registry: commands in, command results out.
    pub TypeConfig:
        D = Proposal,
        R = CommandResult,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        // The snapshot file, positioned at its bytes (`storage::state_machine`).
        SnapshotData = tokio::fs::File,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type StorageError = openraft::StorageError<NodeId>;
