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

/// One entry of a non-public record's reader list: a principal, every
/// principal of a tenant, or every principal with a role. Written
/// `principal:NAME`, `tenant:NAME` or `role:ROLE` on the wire; a principal
/// of a tenant is named `TENANT/NAME` (see `Principal::qualified_name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ReadGrant {
    Principal(String),
    Tenant(String),
    Role(Role),
}

impl ReadGrant {
    /// Whether `principal` is one of the readers this entry names.
    pub fn admits(&self, principal: &Principal) -> bool {
        match self {
            Self::Principal(name) => principal.qualified_name() == *name,
            Self::Tenant(t) => principal.tenant.as_ref() == Some(t),
            Self::Role(r) => principal.role == *r,
        }
    }
}

impl TryFrom<String> for ReadGrant {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let (kind, value) = s.split_once(':').unwrap_or(("", ""));
        let value = value.trim();
        if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) {
            return Err(format!(
                "reader '{s}' must be principal:NAME, tenant:NAME or role:ROLE"
            ));
        }
        match kind {
            "principal" => Ok(Self::Principal(value.to_string())),
            "tenant" => Ok(Self::Tenant(value.to_string())),
            "role" => Role::parse(value)
                .map(Self::Role)
                .ok_or_else(|| format!("reader '{s}': role must be admin, publisher or reader")),
            _ => Err(format!(
                "reader '{s}' must be principal:NAME, tenant:NAME or role:ROLE"
            )),
        }
    }
}

impl From<ReadGrant> for String {
    fn from(r: ReadGrant) -> String {
        match r {
            ReadGrant::Principal(n) => format!("principal:{n}"),
            ReadGrant::Tenant(t) => format!("tenant:{t}"),
            ReadGrant::Role(r) => format!("role:{}", r.as_str()),
        }
    }
}

/// Who may read a record, as a writer sets it: a new visibility replaces
/// the reader list too (public records have none).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Sharing {
    pub visibility: Visibility,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<ReadGrant>,
}

/// Who may read a record, as the index and every read path judge it: the
/// public; else its owner, admins and the listed readers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Access {
    pub public: bool,
    /// Shared: the discovery index holds one copy per owner, not per
    /// agent.
    pub owner: std::sync::Arc<str>,
    pub owner_tenant: Option<Box<str>>,
    pub readers: Box<[ReadGrant]>,
}

impl Access {
    pub fn of(envelope: &Envelope) -> Self {
        Self {
            public: envelope.visibility == Visibility::Public,
            owner: envelope.owner.as_str().into(),
            owner_tenant: envelope.owner_tenant.as_deref().map(Box::from),
            readers: envelope.readers.as_slice().into(),
        }
    }

    pub fn admits(&self, principal: Option<&Principal>) -> bool {
        may_read(
            principal,
            self.public,
            &self.owner,
            self.owner_tenant.as_deref(),
            &self.readers,
        )
    }
}

/// The one rule every read path applies (through `AgentRecord::readable_by`
/// or `Access::admits`).
fn may_read(
    principal: Option<&Principal>,
    public: bool,
    owner: &str,
    owner_tenant: Option<&str>,
    readers: &[ReadGrant],
) -> bool {
    public
        || principal.is_some_and(|p| {
            p.may_manage(owner, owner_tenant) || readers.iter().any(|r| r.admits(p))
        })
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

/// The members each part of a record defines itself. An unknown member
/// (`extra`, gRPC's `extensions`) with one of these names would be written
/// twice into the stored JSON, which then no longer reads back.
const METADATA_MEMBERS: &[&str] = &[
    "id",
    "name",
    "description",
    "version",
    "publisher",
    "capabilities",
    "tags",
    "endpoint",
    "supported_languages",
    "authentication",
    "auth",
    "status",
    "operations",
    "inputs",
    "outputs",
    "examples",
    "bindings",
    "constraints",
    "expires_at",
    "updated_at",
    "signature",
];
const AUTH_MEMBERS: &[&str] = &["type", "instructions", "scopes"];
const BINDING_MEMBERS: &[&str] = &[
    "protocol",
    "endpoint",
    "media_types",
    "interaction_model",
    "priority",
];
const OPERATION_MEMBERS: &[&str] = &["name", "description", "inputs", "outputs", "examples"];
const OPERATION_EXAMPLE_MEMBERS: &[&str] = &["input", "output"];
const TASK_EXAMPLE_MEMBERS: &[&str] = &[
    "id",
    "text",
    "tags",
    "input_schema",
    "output_schema",
    "language",
];

/// The pointer of the first unknown member of `extra` named like one of
/// `members`, under `at`.
fn clash(extra: &Map<String, Value>, members: &[&str], at: &str) -> Option<String> {
    extra
        .keys()
        .find(|k| members.contains(&k.as_str()))
        .map(|k| format!("{at}/extensions/{k}"))
}

impl AgentMetadata {
    /// The first unknown member, at any depth, that reuses the name of a
    /// member the record defines (only gRPC's `extensions` can carry one;
    /// JSON puts such a member in its field), as a pointer into the gRPC
    /// message's shape: `/extensions/description`,
    /// `/bindings/0/extensions/endpoint`.
    pub fn clashing_member(&self) -> Option<String> {
        let auth = [
            ("/authentication", &self.authentication),
            ("/auth", &self.auth),
        ];
        clash(&self.extra, METADATA_MEMBERS, "")
            .or_else(|| {
                auth.iter()
                    .find_map(|(at, a)| a.as_ref().and_then(|a| clash(&a.extra, AUTH_MEMBERS, at)))
            })
            .or_else(|| {
                self.bindings
                    .iter()
                    .enumerate()
                    .find_map(|(i, b)| clash(&b.extra, BINDING_MEMBERS, &format!("/bindings/{i}")))
            })
            .or_else(|| {
                self.examples.iter().enumerate().find_map(|(i, e)| {
                    clash(&e.extra, TASK_EXAMPLE_MEMBERS, &format!("/examples/{i}"))
                })
            })
            .or_else(|| {
                self.operations.iter().enumerate().find_map(|(i, o)| {
                    let at = format!("/operations/{i}");
                    clash(&o.extra, OPERATION_MEMBERS, &at).or_else(|| {
                        o.examples.iter().enumerate().find_map(|(j, e)| {
                            clash(
                                &e.extra,
                                OPERATION_EXAMPLE_MEMBERS,
                                &format!("{at}/examples/{j}"),
                            )
                        })
                    })
                })
            })
    }

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
    /// The owner's tenant (absent: the owner belongs to none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_tenant: Option<String>,
    pub revision: u64,
    pub created_revision: u64,
    pub registered_at: String,
    pub modified_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    #[serde(default)]
    pub visibility: Visibility,
    /// Who besides the owner and admins may read a private record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<ReadGrant>,
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
    /// The newest `updated_at` and `version` earlier metadata of this id
    /// carried, kept while the current metadata leaves them out: a later
    /// write older than these is stale (`domain::write::hold_freshness`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness_floor: Option<FreshnessFloor>,
}

/// Freshness an id's next write must not go below, for the members its
/// current metadata leaves out.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FreshnessFloor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
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
    /// The owning principal's tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl PublisherKey {
    /// Whether the key belongs to the owner `owner` of tenant `tenant`.
    pub fn belongs_to(&self, owner: &str, tenant: Option<&str>) -> bool {
        self.principal == owner && self.tenant.as_deref() == tenant
    }

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
    /// Whether this registry offers the record to its peers: public, and
    /// its own (copies of other registries' records are theirs to share).
    pub fn shared_with_peers(&self) -> bool {
        self.envelope.provenance.is_none() && self.envelope.visibility == Visibility::Public
    }

    /// Whether `principal` may read this record.
    pub fn readable_by(&self, principal: Option<&Principal>) -> bool {
        let e = &self.envelope;
        may_read(
            principal,
            e.visibility == Visibility::Public,
            &e.owner,
            e.owner_tenant.as_deref(),
            &e.readers,
        )
    }

    /// Whether `principal` may change this record.
    pub fn managed_by(&self, principal: &Principal) -> bool {
        principal.may_manage(&self.envelope.owner, self.envelope.owner_tenant.as_deref())
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

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Publisher => "publisher",
            Self::Reader => "reader",
        }
    }
}

/// An authenticated caller. A name is unique within its tenant: `alice`
/// of tenant `a` and `alice` of tenant `b` are two principals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// The tenant (organisation) the principal belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl Principal {
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            role,
            tenant: None,
        }
    }

    /// The name that tells this principal apart across tenants:
    /// `TENANT/NAME`, or the bare name of a principal of no tenant.
    pub fn qualified_name(&self) -> std::borrow::Cow<'_, str> {
        match &self.tenant {
            Some(t) => format!("{t}/{}", self.name).into(),
            None => self.name.as_str().into(),
        }
    }

    pub fn in_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }

    /// Owners manage their own records (the same name in the same
    /// tenant); admins manage every record.
    pub fn may_manage(&self, owner: &str, owner_tenant: Option<&str>) -> bool {
        self.role == Role::Admin || (self.name == owner && self.tenant.as_deref() == owner_tenant)
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
    /// Whether the version before this change was shared with peers and
    /// this one is not: what the peer feed withdraws (any other change to a
    /// record peers never saw is left out, so the feed reveals nothing of
    /// private records). `None` in changes recorded before this was kept:
    /// those are withdrawn, as they were then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unshared: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every member each part defines, set once.
    fn full() -> Value {
        let auth = json!({"type": "api_key", "instructions": "i", "scopes": ["s"]});
        json!({
            "id": "a", "name": "n", "description": "d", "version": "1", "publisher": "p",
            "capabilities": ["c"], "tags": ["t"], "endpoint": "https://e.example",
            "supported_languages": ["en"], "authentication": auth, "auth": auth,
            "status": "active",
            "operations": [{"name": "o", "description": "d", "inputs": {}, "outputs": {},
                            "examples": [{"input": 1, "output": 2}]}],
            "inputs": {}, "outputs": {},
            "examples": [{"id": "e", "text": "t", "tags": ["x"], "input_schema": {},
                          "output_schema": {}, "language": "en"}],
            "bindings": [{"protocol": "https", "endpoint": "https://e.example",
                          "media_types": ["m"], "interaction_model": "i", "priority": 1}],
            "constraints": {}, "expires_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z", "signature": {}
        })
    }

    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    fn sorted(list: &[&'static str]) -> Vec<&'static str> {
        let mut l = list.to_vec();
        l.sort_unstable();
        l
    }

    #[test]
    fn the_member_lists_are_exactly_the_structs_members() {
        let meta: AgentMetadata = serde_json::from_value(full()).unwrap();
        // Nothing fell into an unknown-member bag: every listed name is real.
        assert_eq!(meta, {
            let mut m = meta.clone();
            m.extra.clear();
            m
        });
        assert!(meta.auth.as_ref().unwrap().extra.is_empty());
        assert!(meta.bindings[0].extra.is_empty());
        assert!(meta.examples[0].extra.is_empty());
        assert!(meta.operations[0].extra.is_empty());
        assert!(meta.operations[0].examples[0].extra.is_empty());
        // And every real member is listed.
        let v = serde_json::to_value(&meta).unwrap();
        assert_eq!(keys(&v), sorted(METADATA_MEMBERS));
        assert_eq!(keys(&v["auth"]), sorted(AUTH_MEMBERS));
        assert_eq!(keys(&v["bindings"][0]), sorted(BINDING_MEMBERS));
        assert_eq!(keys(&v["examples"][0]), sorted(TASK_EXAMPLE_MEMBERS));
        assert_eq!(keys(&v["operations"][0]), sorted(OPERATION_MEMBERS));
        assert_eq!(
            keys(&v["operations"][0]["examples"][0]),
            sorted(OPERATION_EXAMPLE_MEMBERS)
        );
    }

    #[test]
    fn an_unknown_member_named_like_a_real_one_is_found_at_any_depth() {
        let meta: AgentMetadata = serde_json::from_value(full()).unwrap();
        assert_eq!(meta.clashing_member(), None);
        let mut m = meta.clone();
        m.extra.insert("x-kept".into(), json!(1));
        assert_eq!(m.clashing_member(), None);
        m.extra.insert("description".into(), json!("twice"));
        assert_eq!(
            m.clashing_member().as_deref(),
            Some("/extensions/description")
        );
        let mut m = meta.clone();
        m.bindings[0].extra.insert("endpoint".into(), json!("x"));
        assert_eq!(
            m.clashing_member().as_deref(),
            Some("/bindings/0/extensions/endpoint")
        );
        let mut m = meta.clone();
        m.operations[0].examples[0]
            .extra
            .insert("output".into(), json!(3));
        assert_eq!(
            m.clashing_member().as_deref(),
            Some("/operations/0/examples/0/extensions/output")
        );
        let mut m = meta;
        m.auth
            .as_mut()
            .unwrap()
            .extra
            .insert("type".into(), json!("x"));
        assert_eq!(
            m.clashing_member().as_deref(),
            Some("/auth/extensions/type")
        );
        // Written twice, the JSON would not read back: what the check prevents.
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(serde_json::from_slice::<AgentMetadata>(&bytes).is_err());
    }
}
