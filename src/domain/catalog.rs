//! The AI Catalog and ARD views of a record (ARD §4, §7), as pure
//! functions: the media type an entry has, the entry itself (without its
//! signed trust manifest, which `service::ard` adds), ARD requests as
//! validated plans over the one filter engine, page tokens and facets.
//!
//! An entry's `type` is the media type of the agent's primary binding (the
//! one with the lowest `priority`, bindings without one last, else the
//! first; `MEDIA_TYPES`) when the registry can deliver a document of that
//! type, and AIDIP's otherwise, so that what `url` or `data` holds is
//! always of the entry's type:
//! - the document the agent was imported from, when it is of that type
//!   (`url`: the source's address);
//! - for A2A and MCP bindings without one, a card written from the record
//!   (`data`: an A2A Agent Card, an MCP server card);
//! - else the record as this registry serves and signs it (`url` =
//!   `<base>/agents/<id>`, type AIDIP).

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::filter::{self, AnyOf, FilterKey, HardFilters, Surface};
use super::record::{AgentMetadata, AgentRecord, Binding};
use super::validate::FieldError;

/// The media type of a host's catalog and of a nested one.
pub const CATALOG_TYPE: &str = "application/ai-catalog+json";
/// The media type of a registry's ARD API entry and of referrals.
pub const REGISTRY_TYPE: &str = "application/ai-registry+json";
/// Agents whose primary binding is plain AIDIP REST (or that have none).
pub const AIDIP_TYPE: &str = "application/aidip+json";

/// Binding protocol → entry media type; any other protocol is AIDIP's.
pub const MEDIA_TYPES: &[(&str, &str, &str)] = &[
    // (binding protocol, media type, import format of its document)
    ("a2a", "application/a2a-agent-card+json", "a2a"),
    ("mcp", "application/mcp-server-card+json", "mcp"),
    ("woa-rest", "application/woa+json", "woa"),
    (
        "agent-protocol",
        "application/agent-protocol+json",
        "agent-protocol",
    ),
];

/// ARD `pageSize`: default and largest.
pub const DEFAULT_PAGE_SIZE: u32 = 10;
pub const DEFAULT_LIST_PAGE_SIZE: u32 = 20;
pub const MAX_PAGE_SIZE: u32 = 100;
/// Explore's default bucket count.
pub const DEFAULT_FACET_LIMIT: u32 = 20;
/// Facets one explore request may ask for.
const MAX_FACETS: usize = 16;

/// The relevance cutoff shared by search and explore (ARD §7.3): an agent
/// is in the matched set of a text query when it ranks among the first
/// `MAX_MATCHED` and its ARD score (0–100) is at least `MIN_SCORE`.
pub const MIN_SCORE: u8 = 10;
pub const MAX_MATCHED: u32 = super::discovery::MAX_LIMIT;

/// The binding an entry is typed by.
pub fn primary_binding(m: &AgentMetadata) -> Option<&Binding> {
    m.bindings
        .iter()
        .enumerate()
        .min_by_key(|(i, b)| (b.priority.unwrap_or(i64::MAX), *i))
        .map(|(_, b)| b)
}

/// The entry media type of an agent (see the module comment).
pub fn media_type(m: &AgentMetadata) -> &'static str {
    let protocol = primary_binding(m).map(|b| b.protocol.to_ascii_lowercase());
    match MEDIA_TYPES
        .iter()
        .find(|(p, _, _)| Some(*p) == protocol.as_deref())
    {
        Some((p, t, format)) if WRITTEN.contains(p) || source_format(m) == Some(format) => t,
        _ => AIDIP_TYPE,
    }
}

/// Binding protocols whose documents the registry writes from a record.
const WRITTEN: [&str; 2] = ["a2a", "mcp"];

/// The format and address of the document a record was imported from.
fn source_format(m: &AgentMetadata) -> Option<&str> {
    m.extra
        .get("source")
        .and_then(|s| s.get("format"))
        .and_then(Value::as_str)
}

/// An ARD score from a ranker score (0–1, relevance only).
pub fn ard_score(score: f32) -> u8 {
    (score.clamp(0.0, 1.0) * 100.0).round() as u8
}

/// The `<publisher>` URNs are minted under: the registry's authority when
/// it is a domain name of two labels or more, else that name under
/// `.local` (a single-label host name such as `localhost`).
pub fn urn_publisher(authority: &str) -> String {
    let a = authority.trim().to_ascii_lowercase();
    if super::urn::parse(&format!("urn:air:{a}:x:y")).is_some() {
        a
    } else {
        let label: String = a
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'-' {
                    b as char
                } else {
                    '-'
                }
            })
            .collect();
        let label = label.trim_matches('-');
        format!("{}.local", if label.is_empty() { "agentry" } else { label })
    }
}

/// The entry's artifact: `("url", address)` or `("data", document)`.
fn artifact(m: &AgentMetadata, media_type: &str, base: &str) -> (&'static str, Value) {
    let entry = MEDIA_TYPES.iter().find(|(_, t, _)| *t == media_type);
    let source_url = m
        .extra
        .get("source")
        .and_then(|s| s.get("url"))
        .and_then(Value::as_str);
    match (entry, source_url) {
        (Some((_, _, format)), Some(url)) if source_format(m) == Some(format) => {
            ("url", json!(url))
        }
        (Some(("a2a", _, _)), _) => ("data", a2a_card(m)),
        (Some(("mcp", _, _)), _) => ("data", mcp_card(m)),
        _ => ("url", json!(record_url(base, &m.id))),
    }
}

/// An A2A Agent Card (1.0, with 0.3's `url` too) written from a record:
/// its A2A interfaces, and one skill per operation (else one from its
/// examples).
fn a2a_card(m: &AgentMetadata) -> Value {
    let endpoints: Vec<&Binding> = m
        .bindings
        .iter()
        .filter(|b| b.protocol.eq_ignore_ascii_case("a2a"))
        .collect();
    let interfaces: Vec<Value> = endpoints
        .iter()
        .map(|b| {
            let binding = b
                .extra
                .get("transport")
                .and_then(Value::as_str)
                .unwrap_or("JSONRPC");
            json!({"url": b.endpoint, "protocolBinding": binding, "protocolVersion": "1.0"})
        })
        .collect();
    let examples: Vec<&str> = m.examples.iter().map(|e| e.text.as_str()).collect();
    let skills: Vec<Value> = if m.operations.is_empty() {
        vec![
            json!({"id": "default", "name": m.name, "description": m.description,
                    "tags": m.tags, "examples": examples}),
        ]
    } else {
        m.operations
            .iter()
            .map(|o| {
                json!({"id": o.name, "name": o.name,
                       "description": o.description.clone().unwrap_or_else(|| m.description.clone()),
                       "tags": m.tags})
            })
            .collect()
    };
    json!({
        "name": m.name,
        "description": m.description,
        "version": m.version.clone().unwrap_or_else(|| "1.0.0".into()),
        "url": endpoints.first().map(|b| b.endpoint.as_str()).unwrap_or_default(),
        "supportedInterfaces": interfaces,
        "capabilities": {},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    })
}

/// An MCP server card written from a record: its MCP endpoints as
/// streamable-HTTP remotes, its operations as tools.
fn mcp_card(m: &AgentMetadata) -> Value {
    let remotes: Vec<Value> = m
        .bindings
        .iter()
        .filter(|b| b.protocol.eq_ignore_ascii_case("mcp"))
        .map(|b| json!({"type": "streamable-http", "url": b.endpoint}))
        .collect();
    let tools: Vec<Value> = m
        .operations
        .iter()
        .map(|o| {
            let mut t =
                json!({"name": o.name, "description": o.description.clone().unwrap_or_default()});
            if let Some(s) = &o.inputs {
                t["inputSchema"] = s.clone();
            }
            t
        })
        .collect();
    let mut card =
        json!({"name": m.name, "description": m.description, "remotes": remotes, "tools": tools});
    if let Some(v) = &m.version {
        card["version"] = json!(v);
    }
    card
}

/// The record's address at this registry (`GET /agents/{id}`).
pub fn record_url(base: &str, id: &str) -> String {
    let id: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
    format!(
        "{}/agents/{}",
        base.trim_end_matches('/'),
        id.replace('+', "%20")
    )
}

/// What an entry needs besides the record.
#[derive(Debug, Clone)]
pub struct EntryContext<'a> {
    /// This registry's public base URL.
    pub base: &'a str,
    /// The `<publisher>` of URNs this registry mints (`urn_publisher`).
    pub publisher: &'a str,
}

/// The catalog entry of a record, without `trustManifest`.
pub fn entry(record: &AgentRecord, ctx: &EntryContext) -> Map<String, Value> {
    let m = &record.metadata;
    let media_type = media_type(m);
    let mut e = Map::new();
    e.insert(
        "identifier".into(),
        json!(super::urn::for_id(&m.id, ctx.publisher)),
    );
    e.insert("displayName".into(), json!(m.name));
    e.insert("type".into(), json!(media_type));
    let (member, artifact) = artifact(m, media_type, ctx.base);
    e.insert(member.into(), artifact);
    if !m.description.is_empty() {
        e.insert("description".into(), json!(m.description));
    }
    if !m.tags.is_empty() {
        e.insert("tags".into(), json!(m.tags));
    }
    let mut capabilities: Vec<&str> = m.capabilities.iter().map(String::as_str).collect();
    for op in &m.operations {
        if !capabilities.contains(&op.name.as_str()) {
            capabilities.push(&op.name);
        }
    }
    if !capabilities.is_empty() {
        e.insert("capabilities".into(), json!(capabilities));
    }
    // The schema asks for two to five.
    let queries: Vec<&str> = m
        .examples
        .iter()
        .map(|x| x.text.as_str())
        .filter(|t| !t.trim().is_empty())
        .take(5)
        .collect();
    if queries.len() >= 2 {
        e.insert("representativeQueries".into(), json!(queries));
    }
    if let Some(v) = &m.version {
        e.insert("version".into(), json!(v));
    }
    let updated = m
        .updated_at
        .as_deref()
        .filter(|t| super::time::parse(t).is_some())
        .unwrap_or(&record.envelope.modified_at);
    if super::time::parse(updated).is_some() {
        e.insert("updatedAt".into(), json!(updated));
    }
    let mut meta = Map::new();
    meta.insert("id".into(), json!(m.id));
    meta.insert("status".into(), json!(m.effective_status().as_str()));
    meta.insert("revision".into(), json!(record.envelope.revision));
    if let Some(p) = &m.publisher {
        meta.insert("publisher".into(), json!(p));
    }
    e.insert("metadata".into(), Value::Object(meta));
    e
}

/// `sha256:<hex>` of bytes, as trust manifests write digests.
pub fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in d {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// ARD `federation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Federation {
    #[default]
    Auto,
    Referrals,
    None,
}

impl Federation {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "auto" => Some(Self::Auto),
            "referrals" => Some(Self::Referrals),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// An ARD `query.filter` as filter clauses: every key must be one the
/// table lists for ARD (an unsupported path is refused, ARD §7.1).
pub fn filter_clauses(
    filter: &Map<String, Value>,
    pointer: &str,
) -> Result<Vec<AnyOf>, FieldError> {
    filter
        .iter()
        .map(|(path, v)| {
            let at = format!("{pointer}/{}", super::validate::pointer_token(path));
            let key = filter::key(Surface::Ard, path).ok_or_else(|| {
                FieldError::new(
                    &at,
                    format!(
                        "unsupported filter path '{path}' (supported: {})",
                        filter::names(Surface::Ard).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            AnyOf::new(key, v, &at)
        })
        .collect()
}

/// A validated ARD search.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchPlan {
    pub text: String,
    pub clauses: Vec<AnyOf>,
    pub federation: Federation,
    pub page_size: u32,
    /// Results to skip (from the page token).
    pub offset: u32,
    /// What a page token of this search must carry.
    pub fingerprint: String,
}

impl SearchPlan {
    pub fn new(
        text: &str,
        filter: &Map<String, Value>,
        federation: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<Self, FieldError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(FieldError::new(
                "/query/text",
                "is required: the need, in natural language",
            ));
        }
        if text.chars().count() > super::discovery::MAX_QUERY_CHARS {
            return Err(FieldError::new(
                "/query/text",
                format!(
                    "must be at most {} characters",
                    super::discovery::MAX_QUERY_CHARS
                ),
            ));
        }
        let clauses = filter_clauses(filter, "/query/filter")?;
        let federation = Federation::parse(federation)
            .ok_or_else(|| FieldError::new("/federation", "must be auto, referrals or none"))?;
        let page_size = page_size_or(page_size, DEFAULT_PAGE_SIZE, "/pageSize")?;
        let fingerprint = fingerprint(&[
            text,
            &Value::Object(filter.clone()).to_string(),
            &format!("{federation:?}"),
        ]);
        let offset = match page_token {
            "" => 0,
            t => decode_token(t, &fingerprint, "/pageToken")?
                .parse()
                .map_err(|_| bad_token("/pageToken"))?,
        };
        Ok(Self {
            text: text.to_string(),
            clauses,
            federation,
            page_size,
            offset,
            fingerprint,
        })
    }

    /// How many ranked agents the page needs (one more tells whether
    /// another page follows), within the matched set.
    pub fn depth(&self) -> u32 {
        (self.offset + self.page_size + 1).min(MAX_MATCHED)
    }

    /// The token of the page after one that ended at `next_offset`.
    pub fn token_at(&self, next_offset: u32) -> String {
        encode_token(&next_offset.to_string(), &self.fingerprint)
    }
}

/// A page size: 0 means the default, more than `MAX_PAGE_SIZE` is refused.
pub fn page_size_or(n: u32, default: u32, pointer: &str) -> Result<u32, FieldError> {
    match n {
        0 => Ok(default),
        n if n > MAX_PAGE_SIZE => Err(FieldError::new(
            pointer,
            format!("must be from 1 to {MAX_PAGE_SIZE}"),
        )),
        n => Ok(n),
    }
}

fn fingerprint(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Page tokens are opaque to clients: `<position>.<fingerprint>` in
/// base64url, refused when used with another request.
fn encode_token(position: &str, fingerprint: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{position}.{fingerprint}"))
}

fn bad_token(pointer: &str) -> FieldError {
    FieldError::new(
        pointer,
        "is not a page token of this request (use the pageToken of the previous page, with the same query)",
    )
}

fn decode_token(token: &str, fingerprint: &str, pointer: &str) -> Result<String, FieldError> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| bad_token(pointer))?;
    let (position, fp) = raw.rsplit_once('.').ok_or_else(|| bad_token(pointer))?;
    if fp != fingerprint {
        return Err(bad_token(pointer));
    }
    Ok(position.to_string())
}

/// One facet an explore request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct FacetRequest {
    /// As the request named it.
    pub field: String,
    pub key: FilterKey,
    pub limit: u32,
    pub min_count: u64,
}

/// A validated ARD explore.
#[derive(Debug, Clone, PartialEq)]
pub struct ExplorePlan {
    /// Empty: no relevance narrowing.
    pub text: String,
    pub clauses: Vec<AnyOf>,
    pub facets: Vec<FacetRequest>,
}

impl ExplorePlan {
    pub fn new(
        text: &str,
        filter: &Map<String, Value>,
        facets: Vec<(String, Option<u32>, Option<u32>)>,
    ) -> Result<Self, FieldError> {
        let clauses = filter_clauses(filter, "/query/filter")?;
        if facets.is_empty() {
            return Err(FieldError::new(
                "/resultType/facets",
                "must name at least one facet",
            ));
        }
        if facets.len() > MAX_FACETS {
            return Err(FieldError::new(
                "/resultType/facets",
                format!("must hold at most {MAX_FACETS} facets"),
            ));
        }
        let facets = facets
            .into_iter()
            .enumerate()
            .map(|(i, (field, limit, min_count))| {
                let at = format!("/resultType/facets/{i}");
                let key = filter::key(Surface::Ard, &field).ok_or_else(|| {
                    FieldError::new(
                        format!("{at}/field"),
                        format!(
                            "unsupported facet field '{field}' (supported: {})",
                            filter::names(Surface::Ard).collect::<Vec<_>>().join(", ")
                        ),
                    )
                })?;
                let limit = match limit {
                    None => DEFAULT_FACET_LIMIT,
                    Some(n) if (1..=1000).contains(&n) => n,
                    Some(_) => {
                        return Err(FieldError::new(
                            format!("{at}/limit"),
                            "must be from 1 to 1000",
                        ))
                    }
                };
                Ok(FacetRequest {
                    field,
                    key,
                    limit,
                    min_count: u64::from(min_count.unwrap_or(1).max(1)),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            text: text.trim().to_string(),
            clauses,
            facets,
        })
    }
}

/// The values an entry shows for a facet's field.
pub fn facet_values(entry: &Map<String, Value>, key: FilterKey) -> Vec<String> {
    let field = match key {
        FilterKey::UrnPublisher => {
            return entry
                .get("identifier")
                .and_then(Value::as_str)
                .and_then(super::urn::parse)
                .map(|u| vec![u.publisher.to_ascii_lowercase()])
                .unwrap_or_default()
        }
        FilterKey::MediaType => "type",
        FilterKey::Tags => "tags",
        FilterKey::Capabilities => "capabilities",
        FilterKey::Version => "version",
        FilterKey::DisplayName => "displayName",
        _ => return Vec::new(),
    };
    match entry.get(field) {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            let mut out: Vec<String> = a
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            out.sort();
            out.dedup();
            out
        }
        _ => Vec::new(),
    }
}

/// One computed facet: buckets by count (then value), and the entries
/// counted in buckets beyond the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Facet {
    pub field: String,
    pub buckets: Vec<(String, u64)>,
    pub other_count: u64,
}

/// Counts `request`'s field over the matched entries.
pub fn facet<'a>(
    request: &FacetRequest,
    entries: impl Iterator<Item = &'a Map<String, Value>>,
) -> Facet {
    let mut counts: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for e in entries {
        for v in facet_values(e, request.key) {
            *counts.entry(v).or_default() += 1;
        }
    }
    let mut all: Vec<(String, u64)> = counts
        .into_iter()
        .filter(|(_, n)| *n >= request.min_count)
        .collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let cut = (request.limit as usize).min(all.len());
    let other_count = all[cut..].iter().map(|(_, n)| n).sum();
    all.truncate(cut);
    Facet {
        field: request.field.clone(),
        buckets: all,
        other_count,
    }
}

/// ARD list ordering (`orderBy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderField {
    Identifier,
    DisplayName,
    UpdatedAt,
    CreatedAt,
}

/// A validated ARD list.
#[derive(Debug, Clone, PartialEq)]
pub struct ListPlan {
    pub filters: HardFilters,
    pub order: OrderField,
    pub descending: bool,
    pub page_size: u32,
    /// The sort key of the last entry of the previous page.
    pub after: Option<String>,
    pub fingerprint: String,
}

impl ListPlan {
    pub fn new(
        filter: &str,
        order_by: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<Self, FieldError> {
        let filters = parse_list_filter(filter)?;
        let (order, descending) = parse_order(order_by)?;
        let page_size = page_size_or(page_size, DEFAULT_LIST_PAGE_SIZE, "/pageSize")?;
        let fingerprint = fingerprint(&[filter.trim(), order_by.trim()]);
        let after = match page_token {
            "" => None,
            t => Some(decode_token(t, &fingerprint, "/pageToken")?),
        };
        Ok(Self {
            filters,
            order,
            descending,
            page_size,
            after,
            fingerprint,
        })
    }

    /// The sort key of an entry (ties broken by id, so keys are unique
    /// and a page boundary never skips or repeats an entry).
    pub fn sort_key(&self, entry: &Map<String, Value>, id: &str, created: &str) -> String {
        let field = match self.order {
            OrderField::Identifier => entry
                .get("identifier")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            OrderField::DisplayName => entry
                .get("displayName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_lowercase(),
            OrderField::UpdatedAt => sortable_time(
                entry
                    .get("updatedAt")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            OrderField::CreatedAt => sortable_time(created),
        };
        format!("{field}\u{0}{id}")
    }

    pub fn token_after(&self, key: &str) -> String {
        encode_token(key, &self.fingerprint)
    }
}

fn sortable_time(t: &str) -> String {
    super::time::parse(t).map_or_else(String::new, |t| {
        format!("{:020}", t.unix_timestamp_nanos().max(0))
    })
}

fn parse_order(order_by: &str) -> Result<(OrderField, bool), FieldError> {
    let words: Vec<&str> = order_by.split_whitespace().collect();
    let bad = || {
        FieldError::new(
            "/orderBy",
            "must be one of identifier, displayName, updatedAt, createdAt, optionally followed by ASC or DESC",
        )
    };
    let (field, dir) = match words.as_slice() {
        [] => return Ok((OrderField::Identifier, false)),
        [f] => (*f, "asc"),
        [f, d] => (*f, *d),
        _ => return Err(bad()),
    };
    let order = match field {
        "identifier" => OrderField::Identifier,
        "displayName" | "name" => OrderField::DisplayName,
        "updatedAt" | "updated_at" => OrderField::UpdatedAt,
        "createdAt" | "created_at" => OrderField::CreatedAt,
        _ => return Err(bad()),
    };
    let descending = match dir.to_ascii_lowercase().as_str() {
        "asc" => false,
        "desc" => true,
        _ => return Err(bad()),
    };
    Ok((order, descending))
}

/// Parses the list filter expression (ARD Appendix A):
/// `clause (AND clause)*`, each `field = value[,value…]` (OR within a
/// field) or, for the times, `field > value` / `field = value`; values
/// bare or in single or double quotes. Fields come from the one table
/// (`Surface::ArdList`).
pub fn parse_list_filter(expr: &str) -> Result<HardFilters, FieldError> {
    const AT: &str = "/filter";
    let mut filters = HardFilters {
        statuses: filter::ALL_BUT_DELETED.to_vec(),
        ..Default::default()
    };
    let tokens = tokenize(expr)?;
    let mut i = 0;
    while i < tokens.len() {
        if i > 0 {
            match tokens.get(i) {
                Some(Token::Word(w)) if w.eq_ignore_ascii_case("and") => i += 1,
                _ => {
                    return Err(FieldError::new(
                        AT,
                        "clauses must be joined by AND (use commas for OR within a field)",
                    ))
                }
            }
        }
        let (Some(Token::Word(field)), Some(Token::Op(op))) = (tokens.get(i), tokens.get(i + 1))
        else {
            return Err(FieldError::new(
                AT,
                "expected a clause such as type = 'application/a2a-agent-card+json'",
            ));
        };
        let key = filter::key(Surface::ArdList, field).ok_or_else(|| {
            FieldError::new(
                AT,
                format!(
                    "unsupported filter field '{field}' (supported: {})",
                    filter::names(Surface::ArdList)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        i += 2;
        let mut values = Vec::new();
        loop {
            match tokens.get(i) {
                Some(Token::Word(v)) | Some(Token::Quoted(v)) => values.push(v.clone()),
                _ => return Err(FieldError::new(AT, format!("'{field}' needs a value"))),
            }
            i += 1;
            if tokens.get(i) == Some(&Token::Comma) {
                i += 1;
            } else {
                break;
            }
        }
        let times = matches!(key, FilterKey::CreatedAfter | FilterKey::UpdatedAfter);
        match (op.as_str(), times) {
            ("=", _) | (">", true) => {}
            _ => {
                return Err(FieldError::new(
                    AT,
                    format!("'{field}' takes '='{}", if times { " or '>'" } else { "" }),
                ))
            }
        }
        if times && values.len() != 1 {
            return Err(FieldError::new(AT, format!("'{field}' takes one time")));
        }
        let value = if values.len() == 1 {
            Value::String(values.remove(0))
        } else {
            Value::from(values)
        };
        filters.set(key, &value, AT)?;
    }
    Ok(filters)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Op(String),
    Comma,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, FieldError> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            ',' => {
                chars.next();
                out.push(Token::Comma);
            }
            '=' | '>' | ':' => {
                chars.next();
                // `:` is AIP-160's "has"; taken as `=`.
                out.push(Token::Op(if c == '>' { ">" } else { "=" }.into()));
            }
            '\'' | '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(ch) => s.push(ch),
                        None => {
                            return Err(FieldError::new("/filter", "a quoted value is not closed"))
                        }
                    }
                }
                out.push(Token::Quoted(s));
            }
            _ => {
                let mut s = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch.is_whitespace() || matches!(ch, ',' | '=' | '>' | '\'' | '"') {
                        break;
                    }
                    s.push(ch);
                    chars.next();
                }
                if s.is_empty() {
                    return Err(FieldError::new(
                        "/filter",
                        format!("unexpected character '{c}'"),
                    ));
                }
                out.push(Token::Word(s));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::AgentFacts;
    use crate::domain::record::Envelope;

    fn record(id: &str, protocol: &str, source: Option<Value>) -> AgentRecord {
        let mut meta: AgentMetadata = serde_json::from_value(json!({
            "id": id, "name": "Weather Agent", "description": "Forecasts.",
            "tags": ["weather"], "capabilities": ["forecast"],
            "operations": [{"name": "get_weather"}],
            "examples": [{"text": "rain in Paris?"}, {"text": "wind in Oslo"}],
            "version": "1.2.0",
            "bindings": [
                {"protocol": "https", "endpoint": "https://w.example/x", "priority": 5},
                {"protocol": protocol, "endpoint": "https://w.example/y", "priority": 1}
            ]
        }))
        .unwrap();
        if let Some(s) = source {
            meta.extra.insert("source".into(), s);
        }
        AgentRecord {
            metadata: meta,
            envelope: Envelope {
                owner: "alice".into(),
                revision: 7,
                registered_at: "2026-03-01T00:00:00Z".into(),
                modified_at: "2026-03-02T00:00:00Z".into(),
                ..Default::default()
            },
        }
    }

    const CTX: EntryContext = EntryContext {
        base: "https://reg.example.org",
        publisher: "reg.example.org",
    };

    #[test]
    fn the_primary_binding_types_the_entry_and_a_matching_source_is_its_url() {
        let a2a = record(
            "https://w.example/card.json",
            "a2a",
            Some(json!({"format": "a2a", "url": "https://w.example/card.json"})),
        );
        let e = entry(&a2a, &CTX);
        assert_eq!(e["type"], "application/a2a-agent-card+json");
        assert_eq!(e["url"], "https://w.example/card.json");
        assert_eq!(
            e["identifier"],
            "urn:air:reg.example.org:agents:https_3A_2F_2Fw.example_2Fcard.json"
        );
        assert_eq!(e["capabilities"], json!(["forecast", "get_weather"]));
        assert_eq!(
            e["representativeQueries"],
            json!(["rain in Paris?", "wind in Oslo"])
        );
        assert_eq!(e["updatedAt"], "2026-03-02T00:00:00Z");
        assert_eq!(e["metadata"]["id"], "https://w.example/card.json");
        // Without a document of its type, a card written from the record.
        let mcp = record("weather", "mcp", None);
        let e = entry(&mcp, &CTX);
        assert_eq!(e["type"], "application/mcp-server-card+json");
        assert!(!e.contains_key("url"));
        assert_eq!(
            e["data"]["remotes"],
            json!([{"type": "streamable-http", "url": "https://w.example/y"}])
        );
        assert_eq!(e["data"]["tools"][0]["name"], "get_weather");
        let a2a = entry(&record("weather", "a2a", None), &CTX);
        assert_eq!(
            a2a["data"]["supportedInterfaces"][0]["url"],
            "https://w.example/y"
        );
        // A WoA binding without its document: the record, typed AIDIP.
        let woa = entry(&record("weather", "woa-rest", None), &CTX);
        assert_eq!(woa["type"], AIDIP_TYPE);
        assert_eq!(woa["url"], "https://reg.example.org/agents/weather");
        let plain = record("urn:air:acme.com:wx:weather", "http", None);
        let e = entry(&plain, &CTX);
        assert_eq!(e["type"], AIDIP_TYPE);
        assert_eq!(e["identifier"], "urn:air:acme.com:wx:weather");
        // One example is too few for representativeQueries.
        let mut one = record("w", "https", None);
        one.metadata.examples.truncate(1);
        assert!(!entry(&one, &CTX).contains_key("representativeQueries"));
    }

    #[test]
    fn single_label_authorities_mint_under_local() {
        assert_eq!(
            urn_publisher("Registry.Example.org"),
            "registry.example.org"
        );
        assert_eq!(urn_publisher("localhost"), "localhost.local");
        assert_eq!(urn_publisher("my_host"), "my-host.local");
    }

    #[test]
    fn ard_filters_are_or_within_a_key_and_and_across_keys() {
        let r = record("urn:air:acme.com:wx:weather", "a2a", None);
        let facts = AgentFacts::of(&r);
        let admit = |filter: Value| {
            let clauses = filter_clauses(filter.as_object().unwrap(), "/query/filter").unwrap();
            let f = HardFilters {
                any_of: clauses,
                local_publisher: Some("reg.example.org".into()),
                ..Default::default()
            };
            f.admit(&facts, None, 1_800_000_000)
        };
        assert!(admit(
            json!({"type": ["application/mcp-server-card+json", "application/a2a-agent-card+json"]})
        ));
        assert!(admit(
            json!({"type": "application/a2a-agent-card+json", "tags": ["x", "Weather"]})
        ));
        assert!(!admit(
            json!({"type": "application/a2a-agent-card+json", "tags": ["x"]})
        ));
        // A capability counts as a tag; operation names are capabilities.
        assert!(admit(
            json!({"tags": "forecast", "capabilities": "get_weather"})
        ));
        assert!(admit(json!({"publisher": "ACME.com", "version": "1.2.0"})));
        assert!(!admit(json!({"publisher": "reg.example.org"})));
        assert!(admit(json!({"displayName": "weather"})));
        // Minted identifiers belong to this registry.
        let local = AgentFacts::of(&record("weather", "a2a", None));
        let f = HardFilters {
            any_of: filter_clauses(
                json!({"publisher": "reg.example.org"}).as_object().unwrap(),
                "/f",
            )
            .unwrap(),
            local_publisher: Some("reg.example.org".into()),
            ..Default::default()
        };
        assert!(f.admit(&local, None, 1_800_000_000));
        let e = filter_clauses(
            json!({"trustManifest.attestations.type": ["SOC2"]})
                .as_object()
                .unwrap(),
            "/query/filter",
        )
        .unwrap_err();
        assert_eq!(e.pointer, "/query/filter/trustManifest.attestations.type");
        assert!(e.to_string().contains("unsupported filter path"));
        let e = filter_clauses(json!({"tags": [1]}).as_object().unwrap(), "/f").unwrap_err();
        assert_eq!(e.pointer, "/f/tags/0");
    }

    #[test]
    fn list_filters_parse_appendix_a() {
        let f = parse_list_filter(
            "type = 'application/a2a-agent-card+json','application/mcp-server-card+json' AND updatedAfter > \"2026-01-01\" and publisherId=acme.com",
        )
        .unwrap();
        assert_eq!(f.any_of.len(), 2);
        assert_eq!(f.any_of[0].values.len(), 2);
        assert_eq!(f.updated_after, Some(1_767_225_600));
        let r = record("urn:air:acme.com:wx:weather", "a2a", None);
        assert!(f.admit_record(&r, None, 1_800_000_000));
        let older = parse_list_filter("updatedAfter > 2026-06-01").unwrap();
        assert!(!older.admit_record(&r, None, 1_800_000_000));
        for bad in [
            "type",
            "type = ",
            "colour = red",
            "type = a OR type = b",
            "displayName > x",
            "name = 'unclosed",
            "createdAfter > yesterday",
        ] {
            assert!(parse_list_filter(bad).is_err(), "{bad}");
        }
        assert!(parse_list_filter("").unwrap().any_of.is_empty());
    }

    #[test]
    fn page_tokens_belong_to_their_request() {
        let f = Map::new();
        let p = SearchPlan::new("weather", &f, "none", 5, "").unwrap();
        let t = p.token_at(5);
        let next = SearchPlan::new("weather", &f, "none", 5, &t).unwrap();
        assert_eq!(next.offset, 5);
        assert_eq!(next.depth(), 11);
        let e = SearchPlan::new("flights", &f, "none", 5, &t).unwrap_err();
        assert_eq!(e.pointer, "/pageToken");
        assert!(SearchPlan::new("weather", &f, "none", 5, "%%%").is_err());
        assert_eq!(
            SearchPlan::new("weather", &f, "none", 1000, "")
                .unwrap_err()
                .pointer,
            "/pageSize"
        );
        assert_eq!(
            SearchPlan::new(" ", &f, "none", 5, "").unwrap_err().pointer,
            "/query/text"
        );
        assert_eq!(
            SearchPlan::new("x", &f, "everywhere", 5, "")
                .unwrap_err()
                .pointer,
            "/federation"
        );
        let l = ListPlan::new("", "displayName DESC", 0, "").unwrap();
        assert_eq!(l.page_size, DEFAULT_LIST_PAGE_SIZE);
        assert!(l.descending);
        let t = l.token_after("weather\u{0}w");
        assert_eq!(
            ListPlan::new("", "displayName DESC", 0, &t).unwrap().after,
            Some("weather\u{0}w".into())
        );
        assert!(ListPlan::new("", "identifier", 0, &t).is_err());
        assert!(ListPlan::new("", "colour", 0, "").is_err());
    }

    #[test]
    fn facets_count_the_matched_entries() {
        let entries: Vec<Map<String, Value>> = [
            json!({"type": "a", "tags": ["x", "y"], "identifier": "urn:air:acme.com:n:a"}),
            json!({"type": "a", "tags": ["x"], "identifier": "urn:air:other.org:n:b"}),
            json!({"type": "b", "identifier": "urn:air:acme.com:n:c"}),
        ]
        .into_iter()
        .map(|v| v.as_object().unwrap().clone())
        .collect();
        let req = |key, limit, min_count| FacetRequest {
            field: "f".into(),
            key,
            limit,
            min_count,
        };
        let f = facet(&req(FilterKey::MediaType, 1, 1), entries.iter());
        assert_eq!(f.buckets, vec![("a".to_string(), 2)]);
        assert_eq!(f.other_count, 1);
        let f = facet(&req(FilterKey::Tags, 10, 2), entries.iter());
        assert_eq!(f.buckets, vec![("x".to_string(), 2)]);
        let f = facet(&req(FilterKey::UrnPublisher, 10, 1), entries.iter());
        assert_eq!(
            f.buckets,
            vec![("acme.com".to_string(), 2), ("other.org".to_string(), 1)]
        );
    }
}
