//! The service layer's one error type. The API layer maps it to gRPC status
//! and HTTP problem bodies in exactly one place.

use crate::consensus::WriteError;
use crate::domain::write::Rejection;
use crate::domain::FieldError;
use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed; `field` is a JSON pointer when known.
    #[error("{message}")]
    InvalidRequest {
        field: Option<String>,
        message: String,
    },
    #[error("{0}")]
    Unauthorized(String),
    /// The agent needs a credential of its own and the call carries none
    /// (401): the caller's registry credential is not what is missing.
    #[error("{message}")]
    AgentCredentialRequired { agent: String, message: String },
    #[error("{0}")]
    Forbidden(String),
    /// Outside what the caller is entitled to (its tenant's namespaces, its
    /// quota); `field` names the member when one is to blame.
    #[error("{message}")]
    Denied {
        field: Option<String>,
        message: String,
    },
    #[error("{0}")]
    NotFound(String),
    /// The record existed and was deleted; its tombstone remains.
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    Conflict(String),
    /// A write's precondition (the revision it expected) no longer holds.
    #[error("{0}")]
    PreconditionFailed(String),
    #[error("{0}")]
    Stale(String),
    /// A watch asked for history that has been compacted away.
    #[error(
        "revision {requested} is no longer in the change history; the oldest available is {oldest}"
    )]
    RevisionCompacted { requested: u64, oldest: u64 },
    /// No leader, or this node cannot commit right now.
    #[error("{message}")]
    Unavailable {
        message: String,
        leader: Option<String>,
    },
    /// The data directory is short of space; nothing was stored (507).
    #[error("{0}")]
    InsufficientStorage(String),
    /// The request did not finish within its deadline (or an agent did
    /// not answer within the gateway's).
    #[error("{0}")]
    Timeout(String),
    /// An agent's answer could not be used (AIDIP: 502).
    #[error("{0}")]
    BadUpstream(String),
    /// An agent (or the gateway's limit for it) is overloaded (503).
    #[error("{message}")]
    Overloaded {
        message: String,
        retry_after: Option<u32>,
    },
    /// The caller's token bucket for this kind of request is empty (429).
    #[error("{message}")]
    RateLimited { message: String, retry_after: u32 },
    /// The agent can only be reached in a way the gateway does not speak.
    #[error("{0}")]
    Unsupported(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError {
    /// This node has not applied the registry's signing identity yet: a
    /// new cluster establishes it one Raft round after its first election.
    pub fn no_signing_identity() -> Self {
        Self::Unavailable {
            message: "the registry has not established its signing identity yet; retry shortly"
                .into(),
            leader: None,
        }
    }
}

impl From<FieldError> for ServiceError {
    fn from(e: FieldError) -> Self {
        let message = e.to_string();
        Self::InvalidRequest {
            // An empty pointer names the whole document (RFC 6901).
            field: Some(e.pointer),
            message,
        }
    }
}

impl From<Rejection> for ServiceError {
    fn from(r: Rejection) -> Self {
        let message = r.to_string();
        match r {
            Rejection::NotFound { .. } => Self::NotFound(message),
            Rejection::Deleted { .. } => Self::Gone(message),
            Rejection::OwnedByOther { .. } | Rejection::IncompatibleBindings { .. } => {
                Self::Conflict(message)
            }
            Rejection::Forbidden { .. }
            | Rejection::KeyForbidden { .. }
            | Rejection::LeaseForbidden { .. } => Self::Forbidden(message),
            Rejection::Stale { .. } => Self::Stale(message),
            Rejection::KeyNotFound { .. } | Rejection::LeaseNotFound { .. } => {
                Self::NotFound(message)
            }
            Rejection::QuotaExceeded { .. } => Self::Denied {
                field: None,
                message,
            },
            Rejection::RevisionChanged { .. } => Self::PreconditionFailed(message),
            Rejection::KeyConflict { .. }
            | Rejection::Unchanged { .. }
            | Rejection::Federated { .. } => Self::Conflict(message),
        }
    }
}

impl From<StorageError> for ServiceError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Installing => Self::Unavailable {
                message: e.to_string(),
                leader: None,
            },
            e => Self::Internal(e.to_string()),
        }
    }
}

impl From<WriteError> for ServiceError {
    fn from(e: WriteError) -> Self {
        let message = e.to_string();
        match e {
            WriteError::NotLeader { leader, .. } => Self::Unavailable { message, leader },
            WriteError::Unavailable(_) => Self::Unavailable {
                message,
                leader: None,
            },
            WriteError::Indeterminate(_) => Self::Timeout(message),
            WriteError::Membership(_) => Self::Conflict(message),
            WriteError::Fatal(m) => Self::Unavailable {
                message: format!(
                    "this node cannot commit writes until it restarts ({m}); try another node"
                ),
                leader: None,
            },
            WriteError::NoSpace(m) => Self::InsufficientStorage(m),
            WriteError::Upgrading(_) => Self::Unavailable {
                message,
                leader: None,
            },
        }
    }
}
