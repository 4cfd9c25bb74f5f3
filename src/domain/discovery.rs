//! ADP discovery requests and results, and the rules that do not depend on
//! how candidates are found: request validation and how much of a record a
//! response may show. The hard filters every candidate must pass are the
//! one filter engine of `domain::filter`. The results (`DiscoveryResult`,
//! `Candidate`, `Ranked`) are plain values here rather than in `service`, so
//! `convert` can turn them into messages without depending on the use cases
//! that build them.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::filter::{self, HardFilters, Surface};
use super::record::{
    AgentMetadata, AgentRecord, AgentStatus, Binding, Envelope, Principal, Provenance,
    VerificationState,
};
use super::validate::{normalise_tags, FieldError};

pub const DEFAULT_LIMIT: u32 = 10;
pub const MAX_LIMIT: u32 = 200;
/// Real requests run long (a pasted ticket or log: BFCL's real user
/// requests reach 4,737 characters); the ranker reads a long query's words
/// and vector in time linear in its length, so the cap only stops abuse.
pub const MAX_QUERY_CHARS: usize = 16_384;
/// Protocols a request may list.
const MAX_PROTOCOLS: usize = 16;

/// ADP `detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Detail {
    Minimal,
    #[default]
    Summary,
    Full,
}

impl Detail {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "minimal" => Some(Self::Minimal),
            "summary" => Some(Self::Summary),
            "full" => Some(Self::Full),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Summary => "summary",
            Self::Full => "full",
        }
    }
}

/// Which registries a discovery covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// This registry's agents (records kept from peers included).
    #[default]
    Local,
    /// Also the peer registries, asked in parallel under a deadline.
    Federated,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "local" => Some(Self::Local),
            "federated" => Some(Self::Federated),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Federated => "federated",
        }
    }
}

/// An ADP Discovery Request as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiscoveryRequest {
    pub query: String,
    pub required_tags: Vec<String>,
    pub preferred_tags: Vec<String>,
    pub excluded_tags: Vec<String>,
    pub protocols: Vec<String>,
    pub constraints: Map<String, Value>,
    /// 0: the default.
    pub limit: u32,
    pub include_evidence: bool,
    pub detail: Detail,
    pub client_context: Map<String, Value>,
    pub scope: Scope,
    /// Clauses of another filter language (ARD's), applied with the rest.
    /// Not sent to peers: a federated pool is filtered by them here.
    pub any_of: Vec<filter::AnyOf>,
    /// The URN publisher of records whose id is no URN (`HardFilters`).
    pub local_publisher: Option<String>,
}

/// A validated request, ready for the ranker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiscoveryPlan {
    pub query: String,
    pub preferred_tags: Vec<String>,
    pub filters: HardFilters,
    /// Constraint names this registry cannot apply (ADP `unsupported_filters`).
    pub unsupported: Vec<String>,
    pub limit: u32,
    pub include_evidence: bool,
    pub detail: Detail,
    pub client_context: Map<String, Value>,
}

/// The ADP level this registry implements.
pub const CONFORMANCE_LEVEL: &str = "D2";

/// How a tag matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagMatch {
    /// Named in the request (required or preferred).
    Direct,
    /// Derived from the query text.
    Expanded,
}

/// What kind of unit of a record (an example task or an operation) matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    Example,
    Operation,
}

/// One example task or operation that matched the query well, with its
/// score.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchedUnit {
    pub kind: UnitKind,
    /// Example id, or operation name.
    pub label: Option<String>,
    pub text: String,
    pub score: f32,
}

/// How the ranker placed one agent: the score and the evidence a response
/// may show (ADP's score components, matches, freshness and notes). A plain
/// copy of what the index found, so results do not depend on the index.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub id: String,
    pub score: f32,
    /// (name, value), in ADP's order.
    pub components: Vec<(&'static str, f32)>,
    pub matched_tags: Vec<(String, TagMatch)>,
    /// Best first; only those that matched well.
    pub matched_units: Vec<MatchedUnit>,
    pub snippet: Option<String>,
    pub indexed_at: String,
    pub status: AgentStatus,
    pub expired: bool,
    pub duplicate_of: Option<String>,
    pub notes: Vec<String>,
}

/// One discovered agent, with what the caller may see of it.
///
/// It holds the stored record itself (shared with the record cache) and
/// how the caller may see it; the visible copy is made once, by whoever
/// encodes the answer ([`Candidate::metadata`]), not here and again there.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub hit: Ranked,
    record: Arc<AgentRecord>,
    detail: Detail,
    /// The caller manages the record, so nothing is withheld from it.
    trusted: bool,
    /// Policy withholds something of the record from the caller.
    pub redacted: bool,
    pub expires_at: Option<String>,
    /// Where a record from another registry came from (ADP provenance).
    pub provenance: Option<Provenance>,
}

impl Candidate {
    /// `record` as `principal` may see it at `detail`.
    pub fn new(
        hit: Ranked,
        record: Arc<AgentRecord>,
        detail: Detail,
        principal: Option<&Principal>,
        expires_at: Option<String>,
    ) -> Self {
        let trusted = principal.is_some_and(|p| record.managed_by(p));
        Candidate {
            hit,
            redacted: redacts(&record, detail, trusted),
            provenance: record.envelope.provenance.clone(),
            record,
            detail,
            trusted,
            expires_at,
        }
    }

    /// What the caller may see of the record's metadata.
    pub fn metadata(&self) -> AgentMetadata {
        visible(&self.record, self.detail, self.trusted)
    }

    /// The signed record, at full detail when nothing was redacted.
    pub fn full_record(&self) -> Option<&AgentRecord> {
        (self.detail == Detail::Full && !self.redacted).then_some(&*self.record)
    }

    pub fn metadata_updated_at(&self) -> &str {
        let r = &self.record;
        r.metadata
            .updated_at
            .as_deref()
            .unwrap_or(&r.envelope.modified_at)
    }

    pub fn verification(&self) -> VerificationState {
        let publisher = self.record.envelope.publisher.as_ref();
        publisher.map(|p| p.state).unwrap_or_default()
    }
}

/// An ADP Discovery Response.
#[derive(Debug, Clone)]
pub struct DiscoveryResult {
    pub request_id: String,
    pub generated_at: String,
    pub candidates: Vec<Candidate>,
    pub applied_filters: Map<String, Value>,
    pub unsupported_filters: Vec<String>,
    pub warnings: Vec<String>,
    pub detail: Detail,
    pub include_evidence: bool,
    pub indexed_revision: u64,
    pub scope: Scope,
    /// Ranked agents neither read nor shown: the candidates before them
    /// filled an answer (`service::MAX_PAGE_BYTES`).
    pub left_out: usize,
}

fn check_text(s: &str, pointer: &str, max: usize) -> Result<(), FieldError> {
    if s.chars().count() > max {
        return Err(FieldError::new(
            pointer,
            format!("must be at most {max} characters"),
        ));
    }
    if s.chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        return Err(FieldError::new(
            pointer,
            "must not contain control characters",
        ));
    }
    Ok(())
}

impl DiscoveryRequest {
    /// How many candidates the request asks for (0: the default; above the
    /// maximum, the maximum, though `plan` refuses that).
    pub fn effective_limit(&self) -> u32 {
        match self.limit {
            0 => DEFAULT_LIMIT,
            n => n.min(MAX_LIMIT),
        }
    }

    /// Validates and normalises the request (ADP "validate the request,
    /// normalise tags and constraints").
    pub fn plan(mut self) -> Result<DiscoveryPlan, FieldError> {
        let query = self.query.trim().to_string();
        if query.is_empty() {
            return Err(FieldError::new(
                "/query",
                "is required: the task, in natural language",
            ));
        }
        check_text(&query, "/query", MAX_QUERY_CHARS)?;
        normalise_tags(&mut self.required_tags, "/required_tags")?;
        normalise_tags(&mut self.preferred_tags, "/preferred_tags")?;
        normalise_tags(&mut self.excluded_tags, "/excluded_tags")?;
        if let Some(t) = self
            .required_tags
            .iter()
            .find(|t| self.excluded_tags.contains(t))
        {
            return Err(FieldError::new(
                "/excluded_tags",
                format!("'{t}' is both required and excluded"),
            ));
        }
        if self.protocols.len() > MAX_PROTOCOLS {
            return Err(FieldError::new(
                "/protocols",
                format!("must hold at most {MAX_PROTOCOLS} entries"),
            ));
        }
        let mut protocols = Vec::new();
        for (i, p) in self.protocols.iter().enumerate() {
            let p = p.trim().to_ascii_lowercase();
            if p.is_empty() {
                return Err(FieldError::new(
                    format!("/protocols/{i}"),
                    "must not be blank",
                ));
            }
            check_text(&p, &format!("/protocols/{i}"), 64)?;
            if !protocols.contains(&p) {
                protocols.push(p);
            }
        }
        if self.limit > MAX_LIMIT {
            return Err(FieldError::new(
                "/limit",
                format!("must be from 1 to {MAX_LIMIT}"),
            ));
        }
        let limit = self.effective_limit();
        let mut filters = HardFilters {
            required_tags: self.required_tags,
            excluded_tags: self.excluded_tags,
            protocols,
            any_of: self.any_of,
            local_publisher: self.local_publisher,
            ..Default::default()
        };
        let mut unsupported = Vec::new();
        for (key, v) in &self.constraints {
            match filter::key(Surface::AdpConstraint, key) {
                Some(k) => filters.set(k, v, &format!("/constraints/{key}"))?,
                None => unsupported.push(key.clone()),
            }
        }
        Ok(DiscoveryPlan {
            query,
            preferred_tags: self.preferred_tags,
            filters,
            unsupported,
            limit,
            include_evidence: self.include_evidence,
            detail: self.detail,
            client_context: self.client_context,
        })
    }
}

/// Constraint members that hint at billing or internal arrangements.
const SENSITIVE_CONSTRAINTS: [&str; 5] = ["cost", "price", "pricing", "billing", "contract"];

/// The part of a record a caller may see at `detail`, and whether policy
/// left anything out (ADP "redacted"). Owners and admins see everything at
/// `full`; everyone else gets the record without its private parts:
/// unknown extension members, the signature, auth instructions, billing
/// constraints and credentials in endpoint URLs.
pub fn visible_metadata(
    record: &AgentRecord,
    detail: Detail,
    principal: Option<&Principal>,
) -> (AgentMetadata, bool) {
    let trusted = principal.is_some_and(|p| record.managed_by(p));
    (
        visible(record, detail, trusted),
        redacts(record, detail, trusted),
    )
}

/// Whether [`visible`] withholds anything from an untrusted caller: the
/// test of it without the copy, since every discovery answer asks it of
/// every candidate before any of them is encoded.
fn redacts(record: &AgentRecord, detail: Detail, trusted: bool) -> bool {
    if trusted {
        return false;
    }
    let m = &record.metadata;
    let bindings = m
        .bindings
        .iter()
        .any(|b| !b.extra.is_empty() || has_url_secrets(&b.endpoint));
    bindings
        || detail == Detail::Full
            && (!m.extra.is_empty()
                || m.signature.is_some()
                || m.endpoint.as_deref().is_some_and(has_url_secrets)
                || [&m.auth, &m.authentication]
                    .into_iter()
                    .flatten()
                    .any(|a| a.instructions.is_some() || !a.extra.is_empty())
                || m.constraints
                    .as_ref()
                    .is_some_and(|c| c.keys().any(|k| sensitive(k)))
                || m.examples.iter().any(|ex| !ex.extra.is_empty()))
}

fn sensitive(constraint: &str) -> bool {
    SENSITIVE_CONSTRAINTS.contains(&constraint.to_ascii_lowercase().as_str())
}

/// The copy of `record`'s metadata shown at `detail`, without what
/// [`redacts`] names unless the caller is `trusted`.
fn visible(record: &AgentRecord, detail: Detail, trusted: bool) -> AgentMetadata {
    let m = &record.metadata;
    let bindings: Vec<Binding> = m
        .bindings
        .iter()
        .map(|b| {
            let minimal = detail == Detail::Minimal;
            Binding {
                protocol: b.protocol.clone(),
                endpoint: match trusted {
                    true => b.endpoint.clone(),
                    false => strip_url_secrets(&b.endpoint),
                },
                media_types: match minimal {
                    true => Vec::new(),
                    false => b.media_types.clone(),
                },
                interaction_model: b.interaction_model.clone().filter(|_| !minimal),
                priority: b.priority,
                extra: match trusted {
                    true => b.extra.clone(),
                    false => Map::new(),
                },
            }
        })
        .collect();
    match detail {
        Detail::Minimal => AgentMetadata {
            id: m.id.clone(),
            status: Some(m.effective_status()),
            bindings,
            ..Default::default()
        },
        Detail::Summary => AgentMetadata {
            id: m.id.clone(),
            name: m.name.clone(),
            description: m.description.clone(),
            version: m.version.clone(),
            publisher: m.publisher.clone(),
            tags: m.tags.clone(),
            capabilities: m.capabilities.clone(),
            status: Some(m.effective_status()),
            bindings,
            updated_at: m.updated_at.clone(),
            expires_at: m.expires_at.clone(),
            ..Default::default()
        },
        Detail::Full => {
            let mut full = AgentMetadata {
                bindings,
                ..m.clone()
            };
            if !trusted {
                full.extra.clear();
                full.signature = None;
                full.endpoint = full.endpoint.as_deref().map(strip_url_secrets);
                for a in [&mut full.auth, &mut full.authentication]
                    .into_iter()
                    .flatten()
                {
                    a.instructions = None;
                    a.extra.clear();
                }
                if let Some(c) = &mut full.constraints {
                    c.retain(|k, _| !sensitive(k));
                }
                for ex in &mut full.examples {
                    ex.extra.clear();
                }
            }
            full
        }
    }
}

/// A stored record (its JSON) with only what [`visible_metadata`] shows
/// below `full` detail, and its whole envelope: example tasks, operations,
/// schemas, constraints and extension members are skipped unparsed.
/// Discovery answers read every hit's stored record, and at summary detail
/// most of the parse went to members they never show (a record's five
/// example tasks alone are most of its allocations).
pub fn parse_summary(stored: &[u8]) -> serde_json::Result<AgentRecord> {
    /// The members a summary shows, with `AgentMetadata`'s defaults.
    #[derive(serde::Deserialize)]
    struct Summary {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        version: Option<String>,
        #[serde(default)]
        publisher: Option<String>,
        #[serde(default)]
        capabilities: Vec<String>,
        #[serde(default)]
        tags: Vec<String>,
        #[serde(default)]
        status: Option<AgentStatus>,
        #[serde(default)]
        bindings: Vec<Binding>,
        #[serde(default)]
        expires_at: Option<String>,
        #[serde(default)]
        updated_at: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Stored {
        metadata: Summary,
        envelope: Envelope,
    }
    let Stored {
        metadata: m,
        envelope,
    } = serde_json::from_slice(stored)?;
    Ok(AgentRecord {
        metadata: AgentMetadata {
            id: m.id,
            name: m.name,
            description: m.description,
            version: m.version,
            publisher: m.publisher,
            capabilities: m.capabilities,
            tags: m.tags,
            status: m.status,
            bindings: m.bindings,
            expires_at: m.expires_at,
            updated_at: m.updated_at,
            ..Default::default()
        },
        envelope,
    })
}

/// Whether [`strip_url_secrets`] changes `endpoint`.
fn has_url_secrets(endpoint: &str) -> bool {
    endpoint.contains(['@', '?', '#']) && strip_url_secrets(endpoint) != endpoint
}

/// The URL without user information, query or fragment, which is where
/// credentials and internal routing hints hide.
fn strip_url_secrets(endpoint: &str) -> String {
    // Credentials need an '@', a query a '?', a fragment a '#': an endpoint
    // without any of them has nothing to strip, and is not parsed (this
    // runs for every binding of every result).
    if !endpoint.contains(['@', '?', '#']) {
        return endpoint.to_string();
    }
    match url::Url::parse(endpoint) {
        Ok(mut u) if !u.cannot_be_a_base() => {
            if u.username().is_empty()
                && u.password().is_none()
                && u.query().is_none()
                && u.fragment().is_none()
            {
                return endpoint.to_string();
            }
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        _ => endpoint.to_string(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::domain::record::Role;
    use serde_json::json;

    fn req(v: Value) -> DiscoveryRequest {
        let o = v.as_object().unwrap();
        let list = |k: &str| -> Vec<String> {
            o.get(k)
                .and_then(|x| x.as_array())
                .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
                .unwrap_or_default()
        };
        DiscoveryRequest {
            query: o.get("query").and_then(|q| q.as_str()).unwrap_or("").into(),
            required_tags: list("required_tags"),
            excluded_tags: list("excluded_tags"),
            protocols: list("protocols"),
            constraints: o
                .get("constraints")
                .and_then(|c| c.as_object())
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    #[test]
    fn unknown_constraints_are_reported_and_known_ones_typed() {
        let p = req(
            json!({"query": "find a translation agent", "required_tags": ["Translation"],
            "constraints": {"unsupported_private_filter": "example", "region": "APAC"}}),
        )
        .plan()
        .unwrap();
        assert_eq!(p.unsupported, vec!["unsupported_private_filter"]);
        assert_eq!(p.filters.required_tags, vec!["translation"]);
        assert_eq!(p.filters.regions, vec!["apac"]);
        assert_eq!(p.limit, DEFAULT_LIMIT);
        let e = req(json!({"query": "x", "constraints": {"max_results_age_seconds": "soon"}}))
            .plan()
            .unwrap_err();
        assert_eq!(e.pointer, "/constraints/max_results_age_seconds");
        assert_eq!(
            req(json!({"query": "  "})).plan().unwrap_err().pointer,
            "/query"
        );
        let e = req(json!({"query": "x", "required_tags": ["a"], "excluded_tags": ["A"]}))
            .plan()
            .unwrap_err();
        assert_eq!(e.pointer, "/excluded_tags");
    }

    /// A deprecated record of `owner` tagged `hr`, served over HTTPS in APAC,
    /// with private parts for redaction to remove.
    pub(in crate::domain) fn record(owner: &str) -> AgentRecord {
        let meta: AgentMetadata = serde_json::from_value(json!({
            "id": "a", "name": "A", "description": "d", "tags": ["hr"],
            "bindings": [{"protocol": "HTTPS", "endpoint": "https://u:p@a.example/x?token=1", "x-internal": 1}],
            "auth": {"type": "bearer", "instructions": "ask bob"},
            "constraints": {"region": ["APAC"], "cost": "3 cents"},
            "x-private-note": "internal",
            "status": "deprecated"
        }))
        .unwrap();
        AgentRecord {
            metadata: meta,
            envelope: Envelope {
                owner: owner.into(),
                modified_at: "2026-01-01T00:00:00Z".into(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn full_detail_is_redacted_for_strangers_only() {
        let r = record("alice");
        let (m, redacted) = visible_metadata(&r, Detail::Full, None);
        assert!(redacted);
        assert!(m.extra.is_empty() && m.bindings[0].extra.is_empty());
        assert_eq!(m.bindings[0].endpoint, "https://a.example/x");
        assert!(m.auth.as_ref().unwrap().instructions.is_none());
        assert!(!m.constraints.as_ref().unwrap().contains_key("cost"));
        let alice = Principal::new("alice", Role::Publisher);
        let (m, redacted) = visible_metadata(&r, Detail::Full, Some(&alice));
        assert!(!redacted);
        assert_eq!(m, r.metadata);
        let (m, _) = visible_metadata(&r, Detail::Minimal, Some(&alice));
        assert!(m.name.is_empty() && m.bindings.len() == 1 && m.status.is_some());
    }

    /// `redacts` is asked of every candidate before anything is copied,
    /// so it must name exactly what `visible` withholds: anything a
    /// stranger's copy lacks that the owner's has, and nothing else.
    #[test]
    fn redaction_is_reported_exactly_when_a_stranger_sees_less_than_the_owner() {
        let clean = json!({
            "id": "a", "name": "A", "description": "d",
            "endpoint": "https://a.example/legacy",
            "bindings": [{"protocol": "HTTPS", "endpoint": "https://a.example/x",
                          "media_types": ["application/json"], "interaction_model": "sync"}],
            "auth": {"type": "bearer", "scopes": ["run"]},
            "constraints": {"region": ["APAC"]},
            "examples": [{"text": "run payroll"}]
        });
        let private: [(&str, Value); 9] = [
            ("/bindings/0/endpoint", json!("https://u:p@a.example/x")),
            ("/bindings/0/endpoint", json!("https://a.example/x#frag")),
            ("/endpoint", json!("https://a.example/legacy?key=1")),
            ("/auth/instructions", json!("ask bob")),
            ("/auth/x-note", json!(1)),
            ("/constraints/Cost", json!("3 cents")),
            ("/examples/0/x-note", json!(1)),
            ("/signature", json!({"alg": "Ed25519", "value": "c2ln"})),
            ("/x-private-note", json!("internal")),
        ];
        let mut cases = vec![(clean.clone(), None)];
        for (pointer, value) in private {
            let mut m = clean.clone();
            let (parent, member) = pointer.rsplit_once('/').unwrap();
            m.pointer_mut(parent).unwrap()[member] = value;
            cases.push((m, Some(pointer)));
        }
        let mut binding_extra = clean.clone();
        binding_extra["bindings"][0]["x-internal"] = json!(1);
        cases.push((binding_extra, Some("/bindings/0/x-internal")));
        for (metadata, private) in cases {
            let mut r = record("alice");
            r.metadata = serde_json::from_value(metadata).unwrap();
            for detail in [Detail::Minimal, Detail::Summary, Detail::Full] {
                let differs = visible(&r, detail, false) != visible(&r, detail, true);
                assert_eq!(
                    redacts(&r, detail, false),
                    differs,
                    "{private:?} {detail:?}"
                );
                assert!(!redacts(&r, detail, true));
            }
            // Bindings are shown at every detail, the rest only at full.
            let in_binding = private.is_some_and(|p| p.starts_with("/bindings"));
            assert_eq!(redacts(&r, Detail::Full, false), private.is_some());
            assert_eq!(redacts(&r, Detail::Summary, false), in_binding);
            assert_eq!(redacts(&r, Detail::Minimal, false), in_binding);
        }
    }

    #[test]
    fn a_summary_shows_what_the_whole_record_shows_below_full_detail() {
        let mut r = record("alice");
        // Every member set, so a member a summary answer comes to show
        // that the summary does not parse fails here.
        let mut metadata = serde_json::to_value(&r.metadata).unwrap();
        let more = json!({
            "version": "2.1", "publisher": "Acme", "capabilities": ["payroll"],
            "endpoint": "https://a.example/legacy", "supported_languages": ["en"],
            "authentication": {"type": "oauth2", "scopes": ["run"]},
            "expires_at": "2027-01-01T00:00:00Z", "updated_at": "2026-02-01T00:00:00Z",
            "examples": [{"text": "run payroll for March", "x-note": 1}],
            "operations": [{"name": "run", "inputs": {"type": "object"}}],
            "inputs": {"type": "object"}, "outputs": {"type": "object"},
            "signature": {"alg": "Ed25519", "value": "c2ln"}
        });
        for (k, v) in more.as_object().unwrap() {
            metadata[k] = v.clone();
        }
        r.metadata = serde_json::from_value(metadata).unwrap();
        r.envelope.revision = 7;
        let stored = serde_json::to_vec(&r).unwrap();
        let summary = parse_summary(&stored).unwrap();
        assert_eq!(summary.envelope, r.envelope);
        assert!(summary.metadata.examples.is_empty() && summary.metadata.inputs.is_none());
        let alice = Principal::new("alice", Role::Publisher);
        for principal in [None, Some(&alice)] {
            for detail in [Detail::Minimal, Detail::Summary] {
                assert_eq!(
                    visible_metadata(&summary, detail, principal),
                    visible_metadata(&r, detail, principal),
                    "{detail:?}, {principal:?}"
                );
            }
        }
    }

    #[test]
    fn endpoints_lose_credentials_queries_and_fragments_and_nothing_else() {
        for (given, shown) in [
            ("https://a.example/x", "https://a.example/x"),
            (
                "https://a.example:8443/v1/run",
                "https://a.example:8443/v1/run",
            ),
            ("https://u@a.example/x", "https://a.example/x"),
            ("https://u:p@a.example/x", "https://a.example/x"),
            ("https://a.example/x?key=1", "https://a.example/x"),
            ("https://a.example/x#k", "https://a.example/x"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(strip_url_secrets(given), shown, "{given}");
        }
    }
}
