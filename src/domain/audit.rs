//! The audit trail's entries: who tried which write or admin action, from
//! where, and what came of it.

use serde::{Deserialize, Serialize};

use super::record::{Principal, Role};
use super::write::Rejection;

/// One recorded attempt. Committed entries (`node` absent) are written by
/// `apply` and are the same on every node; refusals before anything was
/// proposed are kept by the node that refused (`node` names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Position in the trail it belongs to (committed: the replicated
    /// sequence; refused: this node's); the listing's cursor.
    pub seq: u64,
    /// RFC 3339: the leader's clock for committed entries.
    pub at: String,
    /// `NAME`, or `TENANT/NAME` for a principal of a tenant; absent:
    /// anonymous (or a credential that failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The client's address as the node that took the request saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `register`, `update`, `delete`, `set_status`, `add_publisher_key`,
    /// `cluster.promote`, …; before the service names it, the transport's
    /// (`POST /agents`, `agentry.v1.Registry/Register`).
    pub operation: String,
    /// The agent id, key id or node id acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `ok`, or the error code the caller was answered with.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Also in the error body the caller received.
    pub correlation_id: String,
    /// The revision a committed change made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// The node that refused, for entries that were never proposed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
}

/// Who asked for a replicated change, carried inside the command so that
/// `apply` records the same entry on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub operation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub correlation_id: String,
}

impl AuditContext {
    /// The entry for this context at `at` with `outcome`.
    pub fn entry(&self, at: &str, outcome: Outcome) -> AuditEntry {
        AuditEntry {
            seq: 0,
            at: at.to_string(),
            principal: self
                .principal
                .as_ref()
                .map(|p| p.qualified_name().into_owned()),
            role: self.principal.as_ref().map(|p| p.role),
            tenant: self.principal.as_ref().and_then(|p| p.tenant.clone()),
            address: self.address.clone(),
            operation: self.operation.clone(),
            target: self.target.clone(),
            outcome: outcome.code.to_string(),
            message: outcome.message,
            correlation_id: self.correlation_id.clone(),
            revision: outcome.revision,
            node: None,
        }
    }
}

/// The outcome of a request that ended before it was answered.
pub const CANCELLED: &str = "cancelled";

/// Every outcome an entry can record: `ok`, or the error code the caller
/// was answered with (`api::error`'s codes and [`CANCELLED`]). A listing's
/// `outcome` filter must name one, so a misspelt filter is refused instead
/// of silently matching nothing; unit tests hold every code the API and
/// the state machine answer with to this list.
pub const OUTCOMES: [&str; 15] = [
    "ok",
    "invalid_request",
    "unauthorized",
    "forbidden",
    "not_found",
    "conflict",
    "stale_metadata",
    "unavailable",
    "insufficient_storage",
    "timeout",
    "bad_gateway",
    "rate_limited",
    "unsupported",
    "internal",
    CANCELLED,
];

/// What came of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub code: String,
    pub message: Option<String>,
    pub revision: Option<u64>,
}

impl Outcome {
    pub fn ok(revision: Option<u64>) -> Self {
        Self {
            code: "ok".into(),
            message: None,
            revision,
        }
    }

    pub fn refused(code: &str, message: String) -> Self {
        Self {
            code: code.into(),
            message: Some(message),
            revision: None,
        }
    }
}

impl Rejection {
    /// The ADP error code the caller is answered with (the API layer maps
    /// the same rejection to the same code through `ServiceError`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. }
            | Self::Deleted { .. }
            | Self::KeyNotFound { .. }
            | Self::LeaseNotFound { .. } => "not_found",
            Self::Forbidden { .. }
            | Self::KeyForbidden { .. }
            | Self::LeaseForbidden { .. }
            | Self::QuotaExceeded { .. } => "forbidden",
            Self::Stale { .. } => "stale_metadata",
            Self::OwnedByOther { .. }
            | Self::IncompatibleBindings { .. }
            | Self::KeyConflict { .. }
            | Self::Unchanged { .. }
            | Self::RevisionChanged { .. }
            | Self::Federated { .. } => "conflict",
        }
    }
}

/// A listing of the trail: filters combine with AND.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub principal: Option<String>,
    pub target: Option<String>,
    pub operation: Option<String>,
    pub outcome: Option<String>,
    /// RFC 3339 bounds, inclusive `since`, exclusive `until`.
    pub since: Option<time::OffsetDateTime>,
    pub until: Option<time::OffsetDateTime>,
}

impl AuditQuery {
    pub fn matches(&self, e: &AuditEntry) -> bool {
        let at = super::time::parse(&e.at);
        self.principal
            .as_ref()
            .is_none_or(|p| e.principal.as_ref() == Some(p))
            && self
                .target
                .as_ref()
                .is_none_or(|t| e.target.as_ref() == Some(t))
            && self.operation.as_ref().is_none_or(|o| &e.operation == o)
            && self.outcome.as_ref().is_none_or(|o| &e.outcome == o)
            && self.since.is_none_or(|s| at.is_some_and(|a| a >= s))
            && self.until.is_none_or(|u| at.is_some_and(|a| a < u))
    }
}
