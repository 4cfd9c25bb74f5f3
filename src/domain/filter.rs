//! The one filter engine. Every filter Agentry accepts — AIDIP list and
//! search filters, ADP hard filters and constraints — becomes a
//! `HardFilters` and is evaluated by `HardFilters::admit` over one view of a
//! record, `AgentFacts` (kept in the discovery index, and computed from the
//! record where a listing scans storage). So a filter selects the same set
//! whatever the route.
//!
//! ARD's dot-path filters (`POST /ard/search`, `/ard/explore`) and the
//! Appendix A list filters (`GET /ard/agents`) are clauses of the same
//! `HardFilters` (`any_of`): OR within a key, AND across keys, and a
//! multi-valued fact matches when any of its values does.
//!
//! Filter names are one typed table (`FILTER_NAMES`): each surface's
//! accepted names, the allow-list of the HTTP facade, `applied_filters` and
//! `unsupported_filters` all come from it.
//!
//! Semantics (one rule per filter, on every route):
//! - `tags` (AIDIP) and `required_tags` (ADP): every tag must be among the
//!   agent's tags *or* capabilities (AIDIP capabilities are capability
//!   tags); `excluded_tags`: none of them may be.
//! - `capabilities`: every one must be among the agent's capabilities.
//! - languages: every one must be supported; an agent that declares none is
//!   language-agnostic and passes.
//! - regions: any one; an agent without a region constraint serves all.
//! - protocols: any one of the agent's bindings.
//! - status: one of the listed; the default differs by standard (AIDIP
//!   lists every status but deleted, ADP active and deprecated), so each
//!   surface sets it explicitly.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::record::{AgentMetadata, AgentRecord, AgentStatus, Principal};
use super::validate::{normalise_tags, FieldError};

/// A filter the engine evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterKey {
    Tags,
    ExcludedTags,
    Capabilities,
    Languages,
    Statuses,
    Publisher,
    Owner,
    Protocols,
    Regions,
    VerifiedOnly,
    MaxAgeSeconds,
    AllowStale,
    /// ARD `type`: the media type of the agent's catalog entry.
    MediaType,
    Version,
    /// ARD `displayName`: the name contains the value, ignoring case.
    DisplayName,
    /// ARD `publisher`: the `<publisher>` of the entry's URN identifier.
    UrnPublisher,
    CreatedAfter,
    UpdatedAfter,
}

impl FilterKey {
    /// Its name in ADP `applied_filters`.
    pub fn applied_name(self) -> &'static str {
        match self {
            Self::Tags => "required_tags",
            Self::ExcludedTags => "excluded_tags",
            Self::Capabilities => "capabilities",
            Self::Languages => "language",
            Self::Statuses => "status",
            Self::Publisher => "publisher",
            Self::Owner => "owner",
            Self::Protocols => "protocols",
            Self::Regions => "region",
            Self::VerifiedOnly => "verified_only",
            Self::MaxAgeSeconds => "max_results_age_seconds",
            Self::AllowStale => "allow_stale",
            Self::MediaType => "type",
            Self::Version => "version",
            Self::DisplayName => "displayName",
            Self::UrnPublisher => "publisher",
            Self::CreatedAfter => "createdAfter",
            Self::UpdatedAfter => "updatedAfter",
        }
    }
}

/// Where a filter name is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Members of `filters` in AIDIP's `POST /agents/search`.
    AidipSearch,
    /// Members of `constraints` in an ADP Discovery Request (others are
    /// reported as `unsupported_filters`).
    AdpConstraint,
    /// Keys of an ARD `query.filter` (search and explore) and the fields
    /// explore aggregates.
    Ard,
    /// Fields of the ARD list filter expression (`GET /ard/agents`,
    /// Appendix A, plus the search keys).
    ArdList,
    /// Query parameters of the MCP Registry API's `GET /v0.1/servers`
    /// (evaluated over each version).
    McpList,
}

/// One accepted name.
#[derive(Debug, Clone, Copy)]
pub struct FilterName {
    pub surface: Surface,
    pub name: &'static str,
    pub key: FilterKey,
}

const fn name(surface: Surface, name: &'static str, key: FilterKey) -> FilterName {
    FilterName { surface, name, key }
}

/// Every filter name of every surface.
pub const FILTER_NAMES: &[FilterName] = &[
    name(
        Surface::AidipSearch,
        "capabilities",
        FilterKey::Capabilities,
    ),
    name(Surface::AidipSearch, "tags", FilterKey::Tags),
    name(
        Surface::AidipSearch,
        "supported_languages",
        FilterKey::Languages,
    ),
    name(
        Surface::AidipSearch,
        "supported_language",
        FilterKey::Languages,
    ),
    name(Surface::AidipSearch, "language", FilterKey::Languages),
    name(Surface::AidipSearch, "status", FilterKey::Statuses),
    name(Surface::AidipSearch, "publisher", FilterKey::Publisher),
    name(Surface::AdpConstraint, "region", FilterKey::Regions),
    name(
        Surface::AdpConstraint,
        "verified_only",
        FilterKey::VerifiedOnly,
    ),
    name(
        Surface::AdpConstraint,
        "max_results_age_seconds",
        FilterKey::MaxAgeSeconds,
    ),
    name(Surface::AdpConstraint, "status", FilterKey::Statuses),
    name(Surface::AdpConstraint, "allow_stale", FilterKey::AllowStale),
    name(Surface::AdpConstraint, "language", FilterKey::Languages),
    name(
        Surface::AdpConstraint,
        "capabilities",
        FilterKey::Capabilities,
    ),
    name(Surface::Ard, "type", FilterKey::MediaType),
    name(Surface::Ard, "tags", FilterKey::Tags),
    name(Surface::Ard, "capabilities", FilterKey::Capabilities),
    name(Surface::Ard, "publisher", FilterKey::UrnPublisher),
    name(Surface::Ard, "version", FilterKey::Version),
    name(Surface::Ard, "displayName", FilterKey::DisplayName),
    name(Surface::ArdList, "displayName", FilterKey::DisplayName),
    name(Surface::ArdList, "type", FilterKey::MediaType),
    name(Surface::ArdList, "publisherId", FilterKey::UrnPublisher),
    name(Surface::ArdList, "publisher", FilterKey::UrnPublisher),
    name(Surface::ArdList, "createdAfter", FilterKey::CreatedAfter),
    name(Surface::ArdList, "updatedAfter", FilterKey::UpdatedAfter),
    name(Surface::ArdList, "tags", FilterKey::Tags),
    name(Surface::ArdList, "capabilities", FilterKey::Capabilities),
    name(Surface::ArdList, "version", FilterKey::Version),
    name(Surface::McpList, "search", FilterKey::DisplayName),
    name(Surface::McpList, "version", FilterKey::Version),
    name(Surface::McpList, "updated_since", FilterKey::UpdatedAfter),
];

/// The names `surface` accepts, in table order.
pub fn names(surface: Surface) -> impl Iterator<Item = &'static str> {
    FILTER_NAMES
        .iter()
        .filter(move |n| n.surface == surface)
        .map(|n| n.name)
}

/// The filter `name` means on `surface`, if it accepts it.
pub fn key(surface: Surface, name: &str) -> Option<FilterKey> {
    FILTER_NAMES
        .iter()
        .find(|n| n.surface == surface && n.name == name)
        .map(|n| n.key)
}

/// Every status but deleted: AIDIP's default for listing and search.
pub const ALL_BUT_DELETED: [AgentStatus; 3] = [
    AgentStatus::Active,
    AgentStatus::Deprecated,
    AgentStatus::Inactive,
];

pub(super) fn strings(v: &Value, pointer: &str) -> Result<Vec<String>, FieldError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str()
                    .map(String::from)
                    .ok_or_else(|| FieldError::new(format!("{pointer}/{i}"), "must be a string"))
            })
            .collect(),
        _ => Err(FieldError::new(
            pointer,
            "must be a string or an array of strings",
        )),
    }
}

/// The filters of a request, normalised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HardFilters {
    pub required_tags: Vec<String>,
    pub excluded_tags: Vec<String>,
    /// Lowercase; empty: any protocol.
    pub protocols: Vec<String>,
    /// Lowercase; an agent without a region constraint serves every region.
    pub regions: Vec<String>,
    pub max_age_seconds: Option<u64>,
    /// Empty: active and deprecated.
    pub statuses: Vec<AgentStatus>,
    /// Also return records past `expires_at`.
    pub allow_stale: bool,
    /// Agents that declare no languages are language-agnostic (AIDIP).
    pub languages: Vec<String>,
    pub capabilities: Vec<String>,
    /// AIDIP search filters beyond ADP's.
    pub publisher: Option<String>,
    pub owner: Option<String>,
    /// Only agents whose publisher metadata is verified (ADP: verified vs
    /// self-asserted), constraint `verified_only`.
    pub verified_only: bool,
    /// ARD clauses: each must hold, by any one of its values.
    pub any_of: Vec<AnyOf>,
    /// Registered (`CreatedAfter`) or updated strictly after these.
    pub created_after: Option<i64>,
    pub updated_after: Option<i64>,
    /// The URN publisher of records whose id is not a URN (this registry's
    /// authority, as `domain::urn` mints them), for `UrnPublisher`.
    pub local_publisher: Option<String>,
}

/// One ARD filter clause: the fact named by `key` has one of `values`
/// (normalised as `AnyOf::new` does).
#[derive(Debug, Clone, PartialEq)]
pub struct AnyOf {
    pub key: FilterKey,
    pub values: Vec<String>,
}

impl AnyOf {
    /// A clause from a request's value (a string or an array of strings;
    /// `pointer` names it in errors). Only keys that compare strings make
    /// clauses.
    pub fn new(key: FilterKey, v: &Value, pointer: &str) -> Result<Self, FieldError> {
        let mut values = strings(v, pointer)?;
        if values.is_empty() {
            return Err(FieldError::new(pointer, "must name at least one value"));
        }
        match key {
            FilterKey::Tags | FilterKey::Capabilities => normalise_tags(&mut values, pointer)?,
            FilterKey::MediaType | FilterKey::UrnPublisher | FilterKey::DisplayName => {
                for s in &mut values {
                    *s = s.trim().to_lowercase();
                }
            }
            FilterKey::Version => {}
            other => {
                return Err(FieldError::new(
                    pointer,
                    format!(
                        "'{}' is not a field to match values of",
                        other.applied_name()
                    ),
                ))
            }
        }
        Ok(Self { key, values })
    }
}

impl HardFilters {
    /// The filters as ADP `applied_filters`: what every candidate passed,
    /// named as the table names them.
    pub fn applied(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |key: FilterKey, v: Value| {
            m.insert(key.applied_name().into(), v);
        };
        let lists = [
            (FilterKey::Tags, &self.required_tags),
            (FilterKey::ExcludedTags, &self.excluded_tags),
            (FilterKey::Protocols, &self.protocols),
            (FilterKey::Regions, &self.regions),
            (FilterKey::Languages, &self.languages),
            (FilterKey::Capabilities, &self.capabilities),
        ];
        for (key, list) in lists {
            if !list.is_empty() {
                put(key, Value::from(list.clone()));
            }
        }
        if let Some(a) = self.max_age_seconds {
            put(FilterKey::MaxAgeSeconds, a.into());
        }
        if let Some(p) = &self.publisher {
            put(FilterKey::Publisher, p.clone().into());
        }
        if let Some(o) = &self.owner {
            put(FilterKey::Owner, o.clone().into());
        }
        if self.verified_only {
            put(FilterKey::VerifiedOnly, true.into());
        }
        for clause in &self.any_of {
            put(clause.key, Value::from(clause.values.clone()));
        }
        for (key, at) in [
            (FilterKey::CreatedAfter, self.created_after),
            (FilterKey::UpdatedAfter, self.updated_after),
        ] {
            if let Some(t) = at {
                put(key, t.into());
            }
        }
        let statuses: Vec<String> = self
            .statuses()
            .iter()
            .map(|s| s.as_str().to_string())
            .collect();
        put(FilterKey::Statuses, statuses.into());
        m.insert("visibility".into(), "readable by the caller".into());
        m.insert("exclude_expired".into(), (!self.allow_stale).into());
        m
    }

    /// Sets filter `key` from a request's JSON value (`pointer` names it in
    /// errors). Tag-like values are normalised as records are.
    pub fn set(&mut self, key: FilterKey, v: &Value, pointer: &str) -> Result<(), FieldError> {
        let boolean = |v: &Value| {
            v.as_bool()
                .ok_or_else(|| FieldError::new(pointer, "must be a boolean"))
        };
        let one = |v: &Value| -> Result<String, FieldError> {
            let mut all = strings(v, pointer)?;
            match all.len() {
                1 => Ok(all.remove(0)),
                _ => Err(FieldError::new(pointer, "must be one string")),
            }
        };
        match key {
            FilterKey::Tags => {
                self.required_tags = strings(v, pointer)?;
                normalise_tags(&mut self.required_tags, pointer)?;
            }
            FilterKey::ExcludedTags => {
                self.excluded_tags = strings(v, pointer)?;
                normalise_tags(&mut self.excluded_tags, pointer)?;
            }
            FilterKey::Capabilities => {
                self.capabilities = strings(v, pointer)?;
                normalise_tags(&mut self.capabilities, pointer)?;
            }
            FilterKey::Languages => {
                self.languages = strings(v, pointer)?;
                normalise_tags(&mut self.languages, pointer)?;
            }
            FilterKey::Regions => {
                self.regions = strings(v, pointer)?
                    .into_iter()
                    .map(|r| r.trim().to_ascii_lowercase())
                    .collect();
            }
            FilterKey::Protocols => {
                self.protocols = strings(v, pointer)?
                    .into_iter()
                    .map(|p| p.trim().to_ascii_lowercase())
                    .collect();
            }
            FilterKey::Statuses => {
                self.statuses = strings(v, pointer)?
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        AgentStatus::parse(s).ok_or_else(|| {
                            FieldError::new(
                                format!("{pointer}/{i}"),
                                "must be active, deprecated, inactive or deleted",
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            FilterKey::Publisher => self.publisher = Some(one(v)?),
            FilterKey::Owner => self.owner = Some(one(v)?),
            FilterKey::VerifiedOnly => self.verified_only = boolean(v)?,
            FilterKey::AllowStale => self.allow_stale = boolean(v)?,
            FilterKey::MaxAgeSeconds => {
                self.max_age_seconds = Some(v.as_u64().ok_or_else(|| {
                    FieldError::new(pointer, "must be a non-negative integer (seconds)")
                })?);
            }
            FilterKey::CreatedAfter | FilterKey::UpdatedAfter => {
                let text = one(v)?;
                let at = super::time::parse_lenient(&text).ok_or_else(|| {
                    FieldError::new(
                        pointer,
                        format!("'{text}' is not an ISO 8601 date or RFC 3339 time"),
                    )
                })?;
                let at = Some(at.unix_timestamp());
                if key == FilterKey::CreatedAfter {
                    self.created_after = at;
                } else {
                    self.updated_after = at;
                }
            }
            FilterKey::MediaType
            | FilterKey::Version
            | FilterKey::DisplayName
            | FilterKey::UrnPublisher => self.any_of.push(AnyOf::new(key, v, pointer)?),
        }
        Ok(())
    }

    /// Normalises the tag-like filters the way records are normalised, so a
    /// filter for "NLP" finds records tagged "nlp" (for filters set field
    /// by field, as the gRPC list request does).
    pub fn normalise(&mut self) -> Result<(), FieldError> {
        normalise_tags(&mut self.required_tags, "/tags")?;
        normalise_tags(&mut self.capabilities, "/capabilities")?;
        normalise_tags(&mut self.languages, "/languages")?;
        Ok(())
    }

    /// Whether `record` passes (a tombstone never does). For paths that
    /// read records from storage; the index keeps the facts instead.
    pub fn admit_record(
        &self,
        record: &AgentRecord,
        principal: Option<&Principal>,
        now_unix: i64,
    ) -> bool {
        self.admit_record_leased(record, None, principal, now_unix)
    }

    /// [`Self::admit_record`] for an agent whose lease, if it holds one,
    /// expires at `lease_expiry` (`domain::lease`).
    pub fn admit_record_leased(
        &self,
        record: &AgentRecord,
        lease_expiry: Option<i64>,
        principal: Option<&Principal>,
        now_unix: i64,
    ) -> bool {
        let facts = AgentFacts::of(record);
        let expires = lease_expiry.or(facts.expires_unix);
        !record.envelope.deleted && self.admit_expiring(&facts, || expires, principal, now_unix)
    }

    pub fn statuses(&self) -> &[AgentStatus] {
        if self.statuses.is_empty() {
            &[AgentStatus::Active, AgentStatus::Deprecated]
        } else {
            &self.statuses
        }
    }

    /// Whether an agent passes every hard filter. `facts` are the indexed
    /// properties of the agent.
    pub fn admit(&self, facts: &AgentFacts, principal: Option<&Principal>, now_unix: i64) -> bool {
        self.admit_expiring(facts, || facts.expires_unix, principal, now_unix)
    }

    /// [`Self::admit`], with the agent's expiry as a lease sets it
    /// (`domain::lease`) in place of its own `expires_at`. The expiry is
    /// asked for last, and only of an agent every other filter admits: a
    /// lease is a lookup by id, which at 100k leased agents cost more than
    /// all the other filters together when a filter rejected most agents.
    pub fn admit_expiring(
        &self,
        facts: &AgentFacts,
        expires_unix: impl FnOnce() -> Option<i64>,
        principal: Option<&Principal>,
        now_unix: i64,
    ) -> bool {
        if !facts.access.admits(principal) {
            return false;
        }
        if !self.statuses().contains(&facts.status) || (self.verified_only && !facts.verified) {
            return false;
        }
        if let Some(max) = self.max_age_seconds {
            let age = now_unix.saturating_sub(facts.updated_unix);
            if age < 0 || age as u64 > max {
                return false;
            }
        }
        self.required_tags.iter().all(|t| facts.has_tag(t))
            && !self.excluded_tags.iter().any(|t| facts.has_tag(t))
            && (self.protocols.is_empty()
                || facts
                    .protocols
                    .iter()
                    .any(|p| self.protocols.iter().any(|q| **p == **q)))
            && (self.regions.is_empty()
                || facts.regions.is_empty()
                || facts.regions.iter().any(|r| self.regions.contains(r)))
            && (facts.languages.is_empty()
                || self.languages.iter().all(|l| facts.languages.contains(l)))
            && self.capabilities.iter().all(|c| facts.has_capability(c))
            && self
                .publisher
                .as_ref()
                .is_none_or(|p| facts.publisher.as_deref() == Some(p.as_str()))
            && self
                .owner
                .as_ref()
                .is_none_or(|o| *facts.access.owner == **o)
            && self.created_after.is_none_or(|t| facts.created_unix > t)
            && self.updated_after.is_none_or(|t| facts.updated_unix > t)
            && self
                .any_of
                .iter()
                .all(|c| facts.any(c, self.local_publisher.as_deref()))
            && (self.allow_stale || expires_unix().is_none_or(|t| t > now_unix))
    }
}

/// What the hard filters need to know of an agent, kept in the index so
/// filtering never reads storage. One per agent in memory, so its lists
/// are boxed slices and its strings boxed `str`s (a `Vec`'s or `String`'s
/// capacity word is 8 bytes an agent each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentFacts {
    /// Who may read the agent (owner, visibility, readers).
    pub access: super::record::Access,
    pub status: AgentStatus,
    /// Tags and capabilities together, sorted (ADP tags; AIDIP capabilities
    /// are capability tags too). The values a filter names exactly are
    /// shared strings: the discovery index keeps one copy of each value
    /// for all the agents that have it.
    pub tags: Box<[Arc<str>]>,
    pub capabilities: Box<[Arc<str>]>,
    pub publisher: Option<Arc<str>>,
    pub protocols: Box<[Arc<str>]>,
    pub regions: Box<[String]>,
    pub languages: Box<[String]>,
    pub expires_unix: Option<i64>,
    /// `updated_at`, else when the registry last changed the record.
    pub updated_unix: i64,
    /// The publisher's signature verified (see `PublisherVerification`).
    pub verified: bool,
    /// The media type of its catalog entry (`domain::catalog`).
    pub media_type: &'static str,
    pub version: Option<Box<str>>,
    /// The name, lowercase.
    pub name: Box<str>,
    /// Operation names, normalised as capabilities are (ARD shows them
    /// among an entry's capabilities).
    pub operations: Box<[String]>,
    /// The `<publisher>` of an id that is an ARD URN, lowercase.
    pub urn_publisher: Option<Arc<str>>,
    /// When the registry first stored the record.
    pub created_unix: i64,
}

impl AgentFacts {
    pub fn of(record: &AgentRecord) -> Self {
        let m = &record.metadata;
        let mut tags: Vec<Arc<str>> = m
            .tags
            .iter()
            .chain(&m.capabilities)
            .map(|t| t.as_str().into())
            .collect();
        tags.sort();
        tags.dedup();
        let mut protocols: Vec<Arc<str>> = m
            .bindings
            .iter()
            .map(|b| b.protocol.to_ascii_lowercase().into())
            .collect();
        protocols.sort();
        protocols.dedup();
        let updated = m
            .updated_at
            .as_deref()
            .and_then(super::time::parse)
            .or_else(|| super::time::parse(&record.envelope.modified_at));
        Self {
            access: super::record::Access::of(&record.envelope),
            status: m.effective_status(),
            tags: tags.into(),
            capabilities: m.capabilities.iter().map(|c| c.as_str().into()).collect(),
            publisher: m.publisher.as_deref().map(Arc::from),
            protocols: protocols.into(),
            regions: declared_regions(m).into(),
            languages: m.supported_languages.as_slice().into(),
            expires_unix: m
                .expires_at
                .as_deref()
                .and_then(super::time::parse)
                .map(|t| t.unix_timestamp()),
            updated_unix: updated.map(|t| t.unix_timestamp()).unwrap_or(0),
            verified: record.is_verified(),
            media_type: super::catalog::media_type(m),
            version: m.version.as_deref().map(Box::from),
            name: m.name.to_lowercase().into(),
            operations: m
                .operations
                .iter()
                .map(|o| o.name.trim().to_lowercase())
                .collect(),
            urn_publisher: super::urn::parse(&m.id)
                .map(|u| u.publisher.to_ascii_lowercase().into()),
            created_unix: super::time::parse(&record.envelope.registered_at)
                .map_or(0, |t| t.unix_timestamp()),
        }
    }

    pub fn has_capability(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| **c == *capability)
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.binary_search_by(|t| (**t).cmp(tag)).is_ok()
    }

    /// Whether an ARD clause holds: any of its values matches. A record
    /// whose id is not a URN has `local_publisher` as its publisher.
    pub fn any(&self, clause: &AnyOf, local_publisher: Option<&str>) -> bool {
        let values = &clause.values;
        match clause.key {
            FilterKey::Tags => values.iter().any(|v| self.has_tag(v)),
            FilterKey::Capabilities => values
                .iter()
                .any(|v| self.has_capability(v) || self.operations.contains(v)),
            FilterKey::MediaType => values.iter().any(|v| v == self.media_type),
            FilterKey::Version => self
                .version
                .as_deref()
                .is_some_and(|x| values.iter().any(|v| v == x)),
            FilterKey::DisplayName => values.iter().any(|v| self.name.contains(v.as_str())),
            FilterKey::UrnPublisher => self
                .urn_publisher
                .as_deref()
                .or(local_publisher)
                .is_some_and(|p| values.iter().any(|v| v.eq_ignore_ascii_case(p))),
            _ => false,
        }
    }
}

/// Regions an agent declares in `constraints.region` or
/// `constraints.regions` (a string or an array), lowercase.
fn declared_regions(m: &AgentMetadata) -> Vec<String> {
    let Some(c) = &m.constraints else {
        return Vec::new();
    };
    ["region", "regions"]
        .iter()
        .filter_map(|k| c.get(*k))
        .flat_map(|v| match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        })
        .map(|r| r.trim().to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::discovery::tests::record;
    use crate::domain::record::{Envelope, Role, Visibility};
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn rec(
        tags: &[&str],
        caps: &[&str],
        langs: &[&str],
        status: Option<AgentStatus>,
    ) -> AgentRecord {
        AgentRecord {
            metadata: AgentMetadata {
                id: "a".into(),
                tags: tags.iter().map(|s| s.to_string()).collect(),
                capabilities: caps.iter().map(|s| s.to_string()).collect(),
                supported_languages: langs.iter().map(|s| s.to_string()).collect(),
                status,
                ..Default::default()
            },
            envelope: Envelope {
                owner: "alice".into(),
                ..Default::default()
            },
        }
    }

    /// AIDIP's listing filters: every status but deleted.
    fn listing() -> HardFilters {
        HardFilters {
            statuses: ALL_BUT_DELETED.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_capability_counts_as_a_tag_on_every_route() {
        // Before one engine, the AIDIP filter search matched `tags` against
        // tags only, and ranked search against tags and capabilities.
        let r = rec(&["nlp"], &["translate"], &[], None);
        let tags = HardFilters {
            required_tags: vec!["translate".into()],
            ..listing()
        };
        assert!(tags.admit_record(&r, None, NOW));
        let mut capabilities = listing();
        capabilities
            .set(
                FilterKey::Capabilities,
                &json!(["Translate"]),
                "/capabilities",
            )
            .unwrap();
        assert!(capabilities.admit_record(&r, None, NOW));
        // A tag is not a capability.
        let mut not_capability = listing();
        not_capability
            .set(FilterKey::Capabilities, &json!("nlp"), "/capabilities")
            .unwrap();
        assert!(!not_capability.admit_record(&r, None, NOW));
    }

    #[test]
    fn tags_are_and_and_languages_respect_agnostic_agents() {
        let f = HardFilters {
            required_tags: vec!["nlp".into(), "chinese".into()],
            languages: vec!["zh".into()],
            ..listing()
        };
        assert!(f.admit_record(
            &rec(&["nlp", "chinese", "x"], &[], &["zh"], None),
            None,
            NOW
        ));
        assert!(!f.admit_record(&rec(&["nlp"], &[], &["zh"], None), None, NOW));
        assert!(f.admit_record(&rec(&["nlp", "chinese"], &[], &[], None), None, NOW));
        assert!(!f.admit_record(&rec(&["nlp", "chinese"], &[], &["en"], None), None, NOW));
    }

    #[test]
    fn deleted_status_hidden_unless_asked_and_private_hidden_from_others() {
        let deleted = rec(&[], &[], &[], Some(AgentStatus::Deleted));
        assert!(!listing().admit_record(&deleted, None, NOW));
        let f = HardFilters {
            statuses: vec![AgentStatus::Deleted],
            ..Default::default()
        };
        assert!(f.admit_record(&deleted, None, NOW));
        // A tombstone never passes.
        let mut tombstone = rec(&[], &[], &[], None);
        tombstone.envelope.deleted = true;
        assert!(!listing().admit_record(&tombstone, None, NOW));
        let mut private = rec(&[], &[], &[], None);
        private.envelope.visibility = Visibility::Private;
        let bob = Principal::new("bob", Role::Reader);
        let alice = Principal::new("alice", Role::Publisher);
        assert!(!listing().admit_record(&private, Some(&bob), NOW));
        assert!(listing().admit_record(&private, Some(&alice), NOW));
    }

    #[test]
    fn expired_hidden_by_default() {
        let mut r = rec(&[], &[], &[], None);
        r.metadata.expires_at = Some("2000-01-01T00:00:00Z".into());
        assert!(!listing().admit_record(&r, None, NOW));
        let stale = HardFilters {
            allow_stale: true,
            ..listing()
        };
        assert!(stale.admit_record(&r, None, NOW));
    }

    #[test]
    fn names_come_from_one_table() {
        for n in FILTER_NAMES {
            assert_eq!(key(n.surface, n.name), Some(n.key), "{}", n.name);
        }
        assert_eq!(key(Surface::AidipSearch, "region"), None);
        assert_eq!(key(Surface::AdpConstraint, "tags"), None);
        // Every value a surface accepts sets the filter its name means.
        let mut f = HardFilters::default();
        f.set(
            FilterKey::Statuses,
            &json!(["active", "inactive"]),
            "/status",
        )
        .unwrap();
        f.set(FilterKey::Regions, &json!("EU"), "/region").unwrap();
        f.set(FilterKey::MaxAgeSeconds, &json!(60), "/max").unwrap();
        f.set(FilterKey::Publisher, &json!("acme"), "/publisher")
            .unwrap();
        let applied = f.applied();
        assert_eq!(applied["status"], json!(["active", "inactive"]));
        assert_eq!(applied["region"], json!(["eu"]));
        assert_eq!(applied["publisher"], json!("acme"));
        assert_eq!(applied["max_results_age_seconds"], json!(60));
        let e = f
            .set(FilterKey::Statuses, &json!(["gone"]), "/status")
            .unwrap_err();
        assert_eq!(e.pointer, "/status/0");
        let e = f
            .set(FilterKey::VerifiedOnly, &json!("yes"), "/v")
            .unwrap_err();
        assert_eq!(e.pointer, "/v");
        let e = f
            .set(FilterKey::Publisher, &json!(["a", "b"]), "/p")
            .unwrap_err();
        assert_eq!(e.pointer, "/p");
    }

    #[test]
    fn filters_use_indexed_facts() {
        let r = record("alice");
        let f = AgentFacts::of(&r);
        assert_eq!(&*f.protocols, [Arc::from("https")]);
        assert_eq!(&*f.regions, ["apac"]);
        let now = 1_800_000_000;
        let mut h = HardFilters {
            required_tags: vec!["hr".into()],
            protocols: vec!["https".into()],
            regions: vec!["apac".into()],
            ..Default::default()
        };
        assert!(h.admit(&f, None, now));
        h.regions = vec!["eu".into()];
        assert!(!h.admit(&f, None, now));
        h.regions.clear();
        h.statuses = vec![AgentStatus::Active];
        assert!(!h.admit(&f, None, now), "deprecated is not active");
        h.statuses.clear();
        h.max_age_seconds = Some(60);
        assert!(!h.admit(&f, None, now), "updated long ago");
        let mut private = r.clone();
        private.envelope.visibility = Visibility::Private;
        let pf = AgentFacts::of(&private);
        assert!(!HardFilters::default().admit(&pf, None, now));
    }
}
