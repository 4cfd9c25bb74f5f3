//! Discovery messages: protobuf ⇄ domain, and the ADP JSON form of both.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{map_to_struct, serde_path_to_pointer, struct_to_map};
use crate::domain::discovery::{Detail, DiscoveryRequest};
use crate::domain::{self, FieldError};
use crate::index::{TagMatch, UnitKind};
use crate::pb;
use crate::service::{DiscoveryResult, CONFORMANCE_LEVEL};

fn detail_from_str(s: &str) -> Result<Detail, FieldError> {
    if s.is_empty() {
        return Ok(Detail::default());
    }
    Detail::parse(s).ok_or_else(|| FieldError::new("/detail", "must be minimal, summary or full"))
}

impl TryFrom<pb::DiscoverRequest> for DiscoveryRequest {
    type Error = FieldError;

    fn try_from(r: pb::DiscoverRequest) -> Result<Self, FieldError> {
        Ok(Self {
            query: r.query,
            required_tags: r.required_tags,
            preferred_tags: r.preferred_tags,
            excluded_tags: r.excluded_tags,
            protocols: r.protocols,
            constraints: r
                .constraints
                .as_ref()
                .map(struct_to_map)
                .unwrap_or_default(),
            limit: r.limit,
            include_evidence: r.include_evidence,
            detail: detail_from_str(&r.detail)?,
            client_context: r
                .client_context
                .as_ref()
                .map(struct_to_map)
                .unwrap_or_default(),
        })
    }
}

/// The members of an ADP Discovery Request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscoverJson {
    #[serde(default)]
    query: String,
    #[serde(default)]
    required_tags: Vec<String>,
    #[serde(default)]
    preferred_tags: Vec<String>,
    #[serde(default)]
    excluded_tags: Vec<String>,
    #[serde(default)]
    protocols: Vec<String>,
    #[serde(default)]
    constraints: Map<String, Value>,
    #[serde(default)]
    limit: u32,
    #[serde(default)]
    include_evidence: bool,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    client_context: Map<String, Value>,
}

const REQUEST_MEMBERS: [&str; 10] = [
    "query",
    "required_tags",
    "preferred_tags",
    "excluded_tags",
    "protocols",
    "constraints",
    "limit",
    "include_evidence",
    "detail",
    "client_context",
];

/// Parses an ADP Discovery Request. An unknown member is refused rather
/// than ignored: it may be a hard filter this registry cannot apply, which
/// ADP forbids dropping silently.
pub fn discover_request_from_json(v: Value) -> Result<pb::DiscoverRequest, FieldError> {
    let Value::Object(obj) = &v else {
        return Err(FieldError::new(
            "",
            "the discovery request must be a JSON object",
        ));
    };
    if let Some(k) = obj.keys().find(|k| !REQUEST_MEMBERS.contains(&k.as_str())) {
        return Err(FieldError::new(
            format!("/{k}"),
            format!(
                "unknown member '{k}' (a discovery request has {})",
                REQUEST_MEMBERS.join(", ")
            ),
        ));
    }
    let r: DiscoverJson = serde_path_to_error::deserialize(v).map_err(|e| {
        let pointer = serde_path_to_pointer(e.path());
        FieldError::new(pointer, e.into_inner().to_string())
    })?;
    Ok(pb::DiscoverRequest {
        query: r.query,
        required_tags: r.required_tags,
        preferred_tags: r.preferred_tags,
        excluded_tags: r.excluded_tags,
        protocols: r.protocols,
        constraints: Some(map_to_struct(&r.constraints)),
        limit: r.limit,
        include_evidence: r.include_evidence,
        detail: r.detail,
        client_context: Some(map_to_struct(&r.client_context)),
    })
}

/// Four decimals are plenty for a score and keep responses readable.
fn round(x: f32) -> f64 {
    (f64::from(x) * 10_000.0).round() / 10_000.0
}

pub fn discovery_result_to_pb(r: &DiscoveryResult) -> pb::DiscoverResponse {
    let candidates = r
        .candidates
        .iter()
        .map(|c| {
            let h = &c.hit;
            let evidence = r.include_evidence;
            pb::Candidate {
                id: h.id.clone(),
                name: c.metadata.name.clone(),
                description: c.metadata.description.clone(),
                bindings: pb::AgentMetadata::from(&c.metadata).bindings,
                score: round(h.score),
                score_components: if evidence {
                    h.components
                        .iter()
                        .map(|(k, v)| (k.to_string(), round(*v)))
                        .collect()
                } else {
                    Default::default()
                },
                matched_tags: if evidence {
                    h.matched_tags.iter().map(|(t, _)| t.clone()).collect()
                } else {
                    Vec::new()
                },
                matched_examples: h
                    .matched_units
                    .iter()
                    .map(|(u, s)| pb::MatchedExample {
                        id: u.label.clone().unwrap_or_default(),
                        text: u.text.clone(),
                        score: round(*s),
                        kind: match u.kind {
                            UnitKind::Example => "example".into(),
                            UnitKind::Operation => "operation".into(),
                        },
                    })
                    .collect(),
                credential_refs: Vec::new(),
                redacted: c.redacted,
                status: h.status.as_str().into(),
                freshness: Some(pb::Freshness {
                    metadata_updated_at: c.metadata_updated_at.clone(),
                    indexed_at: h.indexed_at.clone(),
                    expired: h.expired,
                    expires_at: c.expires_at.clone(),
                }),
                snippet: h.snippet.clone().unwrap_or_default(),
                tag_matches: if evidence {
                    h.matched_tags
                        .iter()
                        .map(|(t, how)| pb::TagMatch {
                            tag: t.clone(),
                            r#match: match how {
                                TagMatch::Direct => "direct".into(),
                                TagMatch::Expanded => "expanded".into(),
                            },
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                metadata: Some((&c.metadata).into()),
                notes: h.notes.clone(),
                duplicate_of: h.duplicate_of.clone().unwrap_or_default(),
            }
        })
        .collect();
    pb::DiscoverResponse {
        request_id: r.request_id.clone(),
        candidates,
        applied_filters: Some(map_to_struct(&r.applied_filters)),
        unsupported_filters: r.unsupported_filters.clone(),
        warnings: r.warnings.clone(),
        generated_at: r.generated_at.clone(),
        conformance_level: CONFORMANCE_LEVEL.into(),
        indexed_revision: r.indexed_revision,
        detail: r.detail.as_str().into(),
        include_evidence: r.include_evidence,
    }
}

/// The ADP JSON form of a Discovery Response. At `full` detail a candidate
/// is the visible metadata with the ADP candidate members set over it; at
/// `summary` the summary members; at `minimal` only what resolution needs.
pub fn discover_response_to_json(r: &pb::DiscoverResponse) -> Result<Value, FieldError> {
    let detail = detail_from_str(&r.detail)?;
    let mut candidates = Vec::with_capacity(r.candidates.len());
    for c in &r.candidates {
        let meta: domain::AgentMetadata = c.metadata.clone().unwrap_or_default().try_into()?;
        let mut obj = match serde_json::to_value(&meta) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        obj.insert("id".into(), c.id.clone().into());
        obj.insert("score".into(), json!(c.score));
        obj.insert("status".into(), c.status.clone().into());
        obj.insert("redacted".into(), c.redacted.into());
        if let Some(f) = &c.freshness {
            let mut fr = json!({
                "metadata_updated_at": f.metadata_updated_at,
                "indexed_at": f.indexed_at,
                "expired": f.expired,
            });
            if let Some(e) = &f.expires_at {
                fr["expires_at"] = e.clone().into();
            }
            obj.insert("freshness".into(), fr);
        }
        if detail == Detail::Minimal {
            obj.remove("name");
            obj.remove("description");
        } else {
            obj.insert("name".into(), c.name.clone().into());
            obj.insert("description".into(), c.description.clone().into());
        }
        if r.include_evidence {
            obj.insert(
                "score_components".into(),
                json!(c
                    .score_components
                    .iter()
                    .collect::<std::collections::BTreeMap<_, _>>()),
            );
            obj.insert("matched_tags".into(), json!(c.matched_tags));
            obj.insert(
                "matched_examples".into(),
                Value::Array(
                    c.matched_examples
                        .iter()
                        .map(|e| {
                            let mut m = json!({"text": e.text, "score": e.score, "kind": e.kind});
                            if !e.id.is_empty() {
                                m["id"] = e.id.clone().into();
                            }
                            m
                        })
                        .collect(),
                ),
            );
            if !c.snippet.is_empty() {
                obj.insert("snippet".into(), c.snippet.clone().into());
            }
            obj.insert(
                "tag_matches".into(),
                Value::Array(
                    c.tag_matches
                        .iter()
                        .map(|t| json!({"tag": t.tag, "match": t.r#match}))
                        .collect(),
                ),
            );
        }
        if !c.notes.is_empty() {
            obj.insert("notes".into(), json!(c.notes));
        }
        if !c.duplicate_of.is_empty() {
            obj.insert("duplicate_of".into(), c.duplicate_of.clone().into());
        }
        candidates.push(Value::Object(obj));
    }
    Ok(json!({
        "request_id": r.request_id,
        "generated_at": r.generated_at,
        "conformance_level": r.conformance_level,
        "candidates": candidates,
        "applied_filters": r.applied_filters.as_ref().map(struct_to_map).unwrap_or_default(),
        "unsupported_filters": r.unsupported_filters,
        "warnings": r.warnings,
        "indexed_revision": r.indexed_revision,
    }))
}
