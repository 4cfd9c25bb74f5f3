//! The registry's Raft commands. Everything `apply` needs travels inside the
//! command (the caller, the leader's clock), so applying it is deterministic
//! on every node.

use serde::{Deserialize, Serialize};

use crate::domain::write::{Rejection, WriteMode};
use crate::domain::{AgentMetadata, AgentStatus, Change, Principal, Visibility};

/// One replicated write.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    /// Register or update metadata.
    Put {
        /// Boxed: records are large next to the other commands.
        metadata: Box<AgentMetadata>,
        visibility: Option<Visibility>,
        principal: Principal,
        mode: WriteMode,
        now: String,
    },
    /// Delete, leaving a tombstone.
    Delete {
        id: String,
        principal: Principal,
        now: String,
    },
    /// Set the lifecycle status.
    SetStatus {
        id: String,
        status: AgentStatus,
        reason: Option<String>,
        principal: Principal,
        now: String,
    },
}

impl Command {
    /// The agent id the command writes.
    pub fn id(&self) -> &str {
        match self {
            Self::Put { metadata, .. } => &metadata.id,
            Self::Delete { id, .. } | Self::SetStatus { id, .. } => id,
        }
    }
}

/// The outcome of applying one log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The write happened; this is the change it made (boxed: it holds a
    /// whole record).
    Applied(Box<Change>),
    /// The write was refused by the registry's rules; nothing changed.
    Rejected(Rejection),
    /// A blank or membership entry; there is no client to answer.
    Internal,
}
