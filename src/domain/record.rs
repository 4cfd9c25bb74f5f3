//! The agent record: the union of AIDIP's and ADP's metadata (SPECS.md "One
//! agent record") plus the registry's envelope.
//!
//! Every object keeps the members it does not know in `extra`, so a relay
//! returns them as they came (ADP: a relay MUST preserve unknown fields).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Member name reserved for the registry envelope in the JSON form of a stored
/// record. It is read-only: writes ignore it.
pub const ENVELOPE_MEMBER: &str = "registry";

/// Lifecycle status (ADP/AIDIP `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    #[default]
    Active,
    Deprecated,
    Inactive,
    Deleted,
}

impl AgentStatus {
    pub const ALL: [AgentStatus; 4] = [
        Self::Active,
        Self::Deprecated,
        Self::Inactive,
        Self::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Deprecated => "deprecated",
            Self::Inactive => "inactive",
            Self::Deleted => "deleted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == s.trim().to_ascii_lowercase())
    }
}

/// Who may read a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    #[default]
    Public,
    Private,
}

impl Visibility {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "public" => Some(Self::Public),
            "private" => Some(Self::Private),
            _ => None,
        }
    }
}

/// AIDIP `authentication` / ADP `auth`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AuthRequirement {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// ADP binding.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Binding {
    // Required members default to empty so validation can name them by
    // pointer (a serde "missing field" error only names the parent).
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media_types: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// AIDIP operation example.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OperationExample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// AIDIP operation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Operation {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<OperationExample>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// ADP example task.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskExample {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The publisher's metadata of one agent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentMetadata {
    /// Empty only before the registry assigns an id on registration.
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_languages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<AuthRequirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthRequirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AgentStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<Operation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<TaskExample>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Map<String, Value>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl AgentMetadata {
    /// The status filters and lists go by: an unset status counts as active.
    pub fn effective_status(&self) -> AgentStatus {
        self.status.unwrap_or(AgentStatus::Active)
    }

    /// True when `expires_at` lies before `now` (both RFC 3339).
    pub fn is_expired_at(&self, now: time::OffsetDateTime) -> bool {
        self.expires_at
            .as_deref()
            .and_then(super::time::parse)
            .is_some_and(|t| t <= now)
    }
}

/// The registry's envelope around a record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Envelope {
    pub owner: String,
    pub revision: u64,
    pub created_revision: u64,
    pub registered_at: String,
    pub modified_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    #[serde(default)]
    pub visibility: Visibility,
    #[serde(default)]
    pub deleted: bool,
    /// How the registry judged the publisher's ADP `signature` when it
    /// accepted the metadata (absent on records from before the check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<PublisherVerification>,
    /// The accepting registry's signature over the record (see
    /// `crypto::signature`); absent only before the registry has keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<RegistrySignature>,
    /// Set on records kept from a peer registry's change feed (ADP
    /// federation provenance); such records are read-only here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
}

/// Where a federated record came from (ADP `origin_service`,
/// `origin_authority`, `origin_signature`, `received_at`), with what a
/// client needs to check the origin's signature itself: the origin's own
/// envelope. Put `origin_envelope` in place of the record's `registry`
/// member and the result is the record exactly as the origin signed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The peer's federation endpoint the record was received from.
    pub origin_service: String,
    /// The authority that accepted and signed the record.
    pub origin_authority: String,
    /// The origin's signature (also inside `origin_envelope`).
    pub origin_signature: RegistrySignature,
    /// When this registry received this version (RFC 3339).
    pub received_at: String,
    /// The record's revision at the origin: a copy never goes back to an
    /// older one.
    pub origin_revision: u64,
    /// The origin's `registry` member as it signed it (null on a
    /// discovery candidate, whose record is the origin's own).
    pub origin_envelope: Value,
    /// Authorities a discovery candidate was relayed through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub via: Vec<String>,
}

/// Verified: the metadata carries an ADP `signature` by a key its owner
/// registered for the record's id namespace. Anything else is
/// self-asserted (ADP: services SHOULD tell the two apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationState {
    Verified,
    #[default]
    SelfAsserted,
}

/// The registry's verdict on a publisher signature.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PublisherVerification {
    pub state: VerificationState,
    /// The publisher key that verified it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Why it is self-asserted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl PublisherVerification {
    pub fn self_asserted(reason: impl Into<String>) -> Self {
        Self {
            state: VerificationState::SelfAsserted,
            key_id: None,
            reason: Some(reason.into()),
        }
    }
}

/// A publisher's public key, bound to its principal and the agent id
/// prefixes it may vouch for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublisherKey {
    pub key_id: String,
    /// 32-byte Ed25519 public key, base64url without padding.
    pub public_key: String,
    /// The principal that owns the key (and the records it can verify).
    pub principal: String,
    /// Agent id prefixes the key vouches for.
    pub namespaces: Vec<String>,
    pub added_at: String,
}

impl PublisherKey {
    pub fn covers(&self, id: &str) -> bool {
        self.namespaces.iter().any(|n| id.starts_with(n.as_str()))
    }
}

impl AgentRecord {
    /// The authority a live federated record belongs to (it is read-only
    /// here); None for this registry's own records and for tombstones.
    pub fn federated_from(&self) -> Option<&str> {
        self.envelope
            .provenance
            .as_ref()
            .filter(|_| !self.envelope.deleted)
            .map(|p| p.origin_authority.as_str())
    }

    /// Whether the publisher's metadata is verified (not self-asserted).
    pub fn is_verified(&self) -> bool {
        self.envelope
            .publisher
            .as_ref()
            .is_some_and(|p| p.state == VerificationState::Verified)
    }
}

/// A registry's ed25519 signature over the canonical form of a record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RegistrySignature {
    /// Always "Ed25519".
    pub alg: String,
    /// The registry (its operator's DNS name) that signed.
    pub authority: String,
    pub key_id: String,
    /// When it signed (RFC 3339); the key must have been valid then.
    pub signed_at: String,
    /// The signature, base64url without padding.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// A stored record as the state machine keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub metadata: AgentMetadata,
    pub envelope: Envelope,
}

impl AgentRecord {
    /// Whether `principal` may read this record.
    pub fn readable_by(&self, principal: Option<&Principal>) -> bool {
        match self.envelope.visibility {
            Visibility::Public => true,
            Visibility::Private => principal.is_some_and(|p| p.may_manage(&self.envelope.owner)),
        }
    }
}

/// Role of an authenticated caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    Publisher,
    Reader,
}

impl Role {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "admin" => Some(Self::Admin),
            "publisher" => Some(Self::Publisher),
            "reader" => Some(Self::Reader),
            _ => None,
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
}

impl Principal {
    /// Owners manage their own records; admins manage every record.
    pub fn may_manage(&self, owner: &str) -> bool {
        self.role == Role::Admin || self.name == owner
    }

    pub fn may_write(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Publisher)
    }
}

/// What a change did, for the change feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Updated,
    StatusChanged,
    Deleted,
}

/// One entry of the change feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    pub record: AgentRecord,
}
