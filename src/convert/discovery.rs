//! Discovery messages: protobuf ⇄ domain, and the ADP JSON form of both.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{from_json, map_to_struct, status_from_pb, status_to_pb, struct_to_map};
use crate::domain::discovery::{
    Detail, DiscoveryRequest, DiscoveryResult, Scope, TagMatch, UnitKind, CONFORMANCE_LEVEL,
};
use crate::domain::resolve::{Resolution, ResolvePolicy, ResolveRequest};
use crate::domain::{self, FieldError};
use crate::pb;

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
                .map(|s| super::struct_from_client(s, "/constraints"))
                .transpose()?
                .unwrap_or_default(),
            limit: r.limit,
            include_evidence: r.include_evidence,
            detail: detail_from_str(&r.detail)?,
            client_context: r
                .client_context
                .as_ref()
                .map(|s| super::struct_from_client(s, "/client_context"))
                .transpose()?
                .unwrap_or_default(),
            scope: Scope::parse(&r.scope)
                .ok_or_else(|| FieldError::new("/scope", "must be local or federated"))?,
            ..Default::default()
        })
    }
}

impl From<&DiscoveryRequest> for pb::DiscoverRequest {
    fn from(r: &DiscoveryRequest) -> Self {
        Self {
            query: r.query.clone(),
            required_tags: r.required_tags.clone(),
            preferred_tags: r.preferred_tags.clone(),
            excluded_tags: r.excluded_tags.clone(),
            protocols: r.protocols.clone(),
            constraints: Some(map_to_struct(&r.constraints)),
            limit: r.limit,
            include_evidence: r.include_evidence,
            detail: r.detail.as_str().into(),
            client_context: Some(map_to_struct(&r.client_context)),
            scope: r.scope.as_str().into(),
        }
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
    #[serde(default)]
    scope: String,
}

const REQUEST_MEMBERS: [&str; 11] = [
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
    "scope",
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
    let obj_limit_is_zero = obj.get("limit").and_then(Value::as_u64) == Some(0);
    if let Some(k) = obj.keys().find(|k| !REQUEST_MEMBERS.contains(&k.as_str())) {
        return Err(FieldError::new(
            format!("/{k}"),
            format!(
                "unknown member '{k}' (a discovery request has {})",
                REQUEST_MEMBERS.join(", ")
            ),
        ));
    }
    let r: DiscoverJson = from_json(v)?;
    // Zero is how the gRPC message says "the default"; in JSON the member is
    // left out for that, and an explicit 0 is out of range.
    if obj_limit_is_zero {
        return Err(FieldError::new(
            "/limit",
            format!("must be from 1 to {}", crate::domain::discovery::MAX_LIMIT),
        ));
    }
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
        scope: r.scope,
    })
}

/// Four decimals are plenty for a score and keep responses readable.
fn round(x: f32) -> f64 {
    (f64::from(x) * 10_000.0).round() / 10_000.0
}

pub fn discovery_result_to_pb(r: &DiscoveryResult) -> pb::DiscoverResponse {
    let now = time::OffsetDateTime::now_utc();
    let candidates = r
        .candidates
        .iter()
        .map(|c| {
            let h = &c.hit;
            let evidence = r.include_evidence;
            let metadata = c.metadata();
            pb::Candidate {
                id: h.id.clone(),
                name: metadata.name.clone(),
                description: metadata.description.clone(),
                bindings: super::bindings_to_pb(&metadata.bindings),
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
                    .map(|u| pb::MatchedExample {
                        id: u.label.clone().unwrap_or_default(),
                        text: u.text.clone(),
                        score: round(u.score),
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
                    metadata_updated_at: c.metadata_updated_at().to_string(),
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
                metadata: Some(metadata.into()),
                notes: h.notes.clone(),
                duplicate_of: h.duplicate_of.clone().unwrap_or_default(),
                verification: verification_name(c.verification()).into(),
                record: c.full_record().map(|r| super::record_to_pb(r, now)),
                provenance: c.provenance.as_ref().map(super::provenance_to_pb),
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
        scope: r.scope.as_str().into(),
    }
}

pub fn verification_name(v: domain::VerificationState) -> &'static str {
    match v {
        domain::VerificationState::Verified => "verified",
        domain::VerificationState::SelfAsserted => "self_asserted",
    }
}

/// The ADP JSON form of a Discovery Response. At `full` detail a candidate
/// is the visible metadata with the ADP candidate members set over it; at
/// `summary` the summary members; at `minimal` only what resolution needs.
/// Takes the response, so each candidate's metadata moves into the JSON
/// rather than being copied once more.
pub fn discover_response_to_json(mut r: pb::DiscoverResponse) -> Result<Value, FieldError> {
    let detail = detail_from_str(&r.detail)?;
    let mut candidates = Vec::with_capacity(r.candidates.len());
    for c in &mut r.candidates {
        let meta: domain::AgentMetadata = c.metadata.take().unwrap_or_default().try_into()?;
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
        if !c.verification.is_empty() {
            obj.insert("verification".into(), c.verification.clone().into());
        }
        if let Some(record) = &c.record {
            obj.insert("record".into(), super::record_pb_to_json(record)?);
        }
        if let Some(p) = &c.provenance {
            // ADP's provenance members sit on the candidate itself.
            if let Value::Object(members) = super::provenance_pb_to_json(p) {
                obj.extend(members);
            }
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
        "scope": if r.scope.is_empty() { "local" } else { r.scope.as_str() },
    }))
}

impl TryFrom<pb::ResolveRequest> for ResolveRequest {
    type Error = FieldError;

    fn try_from(r: pb::ResolveRequest) -> Result<Self, FieldError> {
        let p = r.policy.unwrap_or_default();
        let statuses = p
            .statuses
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let pointer = format!("/policy/statuses/{i}");
                status_from_pb(*s, &pointer)?
                    .ok_or_else(|| FieldError::new(pointer, "must not be unspecified"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            intent: r.intent,
            context: r.context.as_ref().map(struct_to_map).unwrap_or_default(),
            policy: ResolvePolicy {
                required_tags: p.required_tags,
                excluded_tags: p.excluded_tags,
                protocols: p.protocols,
                statuses,
                require_verified: p.require_verified,
                max_candidates: p.max_candidates,
            },
        })
    }
}

pub fn resolution_to_pb(r: &Resolution) -> pb::ResolveResponse {
    let candidates = r
        .candidates
        .iter()
        .map(|c| {
            let m = &c.metadata;
            let op = c.operation.as_ref();
            let input = op.and_then(|o| o.inputs.as_ref()).or(m.inputs.as_ref());
            let output = op.and_then(|o| o.outputs.as_ref()).or(m.outputs.as_ref());
            let auth = m.authentication.as_ref().or(m.auth.as_ref());
            let full = pb::AgentMetadata::from(&domain::AgentMetadata {
                bindings: vec![c.binding.clone()],
                authentication: auth.cloned(),
                ..Default::default()
            });
            pb::ResolvedCandidate {
                agent_id: c.id.clone(),
                name: m.name.clone(),
                score: round(c.score),
                binding: full.bindings.into_iter().next(),
                endpoint: c.binding.endpoint.clone(),
                invocation: Some(pb::Invocation {
                    operation: op.map(|o| o.name.clone()).unwrap_or_default(),
                    input_schema: input.map(super::json_to_pb),
                    output_schema: output.map(super::json_to_pb),
                    authentication: full.authentication,
                    gateway_path: format!(
                        "/agents/{}/invoke",
                        url::form_urlencoded::byte_serialize(c.id.as_bytes()).collect::<String>()
                    ),
                }),
                redacted: c.redacted,
                status: c.status.as_str().into(),
                notes: c.notes.clone(),
            }
        })
        .collect();
    pb::ResolveResponse {
        request_id: r.request_id.clone(),
        generated_at: r.generated_at.clone(),
        candidates,
        excluded: r
            .excluded
            .iter()
            .map(|(id, reasons, score)| pb::Exclusion {
                agent_id: id.clone(),
                reasons: reasons.clone(),
                score: round(*score),
            })
            .collect(),
        warnings: r.warnings.clone(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveJson {
    #[serde(default)]
    intent: String,
    #[serde(default)]
    context: Map<String, Value>,
    #[serde(default)]
    policy: PolicyJson,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PolicyJson {
    #[serde(default)]
    required_tags: Vec<String>,
    #[serde(default)]
    excluded_tags: Vec<String>,
    #[serde(default)]
    protocols: Vec<String>,
    #[serde(default)]
    statuses: Vec<String>,
    #[serde(default)]
    require_verified: bool,
    #[serde(default)]
    max_candidates: u32,
}

/// Parses an ASR request: `{intent, context, policy}`. Unknown members are
/// refused: a policy this registry does not understand must not be ignored.
pub fn resolve_request_from_json(v: Value) -> Result<pb::ResolveRequest, FieldError> {
    if !v.is_object() {
        return Err(FieldError::new(
            "",
            "the resolve request must be a JSON object",
        ));
    }
    let r: ResolveJson = from_json(v)?;
    let statuses = r
        .policy
        .statuses
        .iter()
        .enumerate()
        .map(|(i, s)| {
            domain::AgentStatus::parse(s)
                .map(|st| status_to_pb(Some(st)) as i32)
                .ok_or_else(|| {
                    FieldError::new(
                        format!("/policy/statuses/{i}"),
                        "must be active, deprecated, inactive or deleted",
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(pb::ResolveRequest {
        intent: r.intent,
        context: Some(map_to_struct(&r.context)),
        policy: Some(pb::ResolvePolicy {
            required_tags: r.policy.required_tags,
            excluded_tags: r.policy.excluded_tags,
            protocols: r.policy.protocols,
            statuses,
            require_verified: r.policy.require_verified,
            max_candidates: r.policy.max_candidates,
        }),
    })
}

/// The JSON form of an ASR answer.
pub fn resolve_response_to_json(r: &pb::ResolveResponse) -> Result<Value, FieldError> {
    let mut candidates = Vec::with_capacity(r.candidates.len());
    for c in &r.candidates {
        let carrier = pb::AgentMetadata {
            bindings: c.binding.clone().into_iter().collect(),
            authentication: c.invocation.as_ref().and_then(|i| i.authentication.clone()),
            ..Default::default()
        };
        let meta: domain::AgentMetadata = carrier.try_into()?;
        let inv = c.invocation.clone().unwrap_or_default();
        let mut invocation = json!({"gateway_path": inv.gateway_path});
        if !inv.operation.is_empty() {
            invocation["operation"] = inv.operation.into();
        }
        if let Some(s) = &inv.input_schema {
            invocation["input_schema"] = super::pb_to_json(s);
        }
        if let Some(s) = &inv.output_schema {
            invocation["output_schema"] = super::pb_to_json(s);
        }
        if let Some(a) = &meta.authentication {
            invocation["authentication"] = serde_json::to_value(a).unwrap_or(Value::Null);
        }
        let mut out = json!({
            "agent_id": c.agent_id,
            "name": c.name,
            "score": c.score,
            "status": c.status,
            "binding": meta.bindings.first().map(|b| serde_json::to_value(b).unwrap_or(Value::Null)),
            "endpoint": c.endpoint,
            "invocation": invocation,
            "redacted": c.redacted,
        });
        if !c.notes.is_empty() {
            out["notes"] = json!(c.notes);
        }
        candidates.push(out);
    }
    Ok(json!({
        "request_id": r.request_id,
        "generated_at": r.generated_at,
        "candidates": candidates,
        "excluded": r.excluded.iter().map(|e| json!({"agent_id": e.agent_id, "reasons": e.reasons, "score": e.score})).collect::<Vec<_>>(),
        "warnings": r.warnings,
    }))
}
