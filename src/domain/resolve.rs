//! AIDIP Agent Semantic Resolution: (intent, context, policy) → candidate
//! endpoints with invocation metadata. The policy is hard: a candidate that
//! fails it is excluded and the exclusion reported with its reasons; the
//! context only informs ranking (domain → preferred tag, locale → language).
//! The answer (`Resolution`) is a plain value here, beside its request, so
//! `convert` reads it without depending on `service`.

use serde_json::{Map, Value};

use super::record::{AgentMetadata, AgentRecord, AgentStatus, Binding, Operation};
use super::validate::{normalise_tags, FieldError};

pub const DEFAULT_MAX_CANDIDATES: u32 = 3;
pub const MAX_CANDIDATES: u32 = 50;

/// The hard requirements of a resolution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolvePolicy {
    pub required_tags: Vec<String>,
    pub excluded_tags: Vec<String>,
    /// Lowercase; empty: any.
    pub protocols: Vec<String>,
    /// Empty: active only.
    pub statuses: Vec<AgentStatus>,
    /// Only agents whose publisher metadata is verified.
    pub require_verified: bool,
    pub max_candidates: u32,
}

/// A resolution request as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolveRequest {
    pub intent: String,
    pub context: Map<String, Value>,
    pub policy: ResolvePolicy,
}

/// One resolved agent.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub id: String,
    pub score: f32,
    /// What the caller may see of the record (full detail, redacted for
    /// strangers).
    pub metadata: AgentMetadata,
    pub redacted: bool,
    pub binding: Binding,
    pub operation: Option<Operation>,
    pub status: AgentStatus,
    pub notes: Vec<String>,
}

/// An ASR answer.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub request_id: String,
    pub generated_at: String,
    pub candidates: Vec<Resolved>,
    /// (agent id, reasons, score) of relevant agents the policy excluded.
    pub excluded: Vec<(String, Vec<String>, f32)>,
    pub warnings: Vec<String>,
}

impl ResolveRequest {
    /// Validates and normalises in place.
    pub fn normalise(&mut self) -> Result<(), FieldError> {
        self.intent = self.intent.trim().to_string();
        if self.intent.is_empty() {
            return Err(FieldError::new(
                "/intent",
                "is required: the task to resolve",
            ));
        }
        if self.intent.chars().count() > super::discovery::MAX_QUERY_CHARS {
            return Err(FieldError::new(
                "/intent",
                format!(
                    "must be at most {} characters",
                    super::discovery::MAX_QUERY_CHARS
                ),
            ));
        }
        let p = &mut self.policy;
        normalise_tags(&mut p.required_tags, "/policy/required_tags")?;
        normalise_tags(&mut p.excluded_tags, "/policy/excluded_tags")?;
        for (i, proto) in p.protocols.iter_mut().enumerate() {
            *proto = proto.trim().to_ascii_lowercase();
            if proto.is_empty() {
                return Err(FieldError::new(
                    format!("/policy/protocols/{i}"),
                    "must not be blank",
                ));
            }
        }
        p.max_candidates = match p.max_candidates {
            0 => DEFAULT_MAX_CANDIDATES,
            n if n > MAX_CANDIDATES => {
                return Err(FieldError::new(
                    "/policy/max_candidates",
                    format!("must be from 1 to {MAX_CANDIDATES}"),
                ))
            }
            n => n,
        };
        for key in ["domain", "locale"] {
            if let Some(v) = self.context.get(key) {
                if !v.is_string() {
                    return Err(FieldError::new(
                        format!("/context/{key}"),
                        "must be a string",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The context's domain, as a tag to prefer.
    pub fn domain_tag(&self) -> Option<String> {
        self.context
            .get("domain")
            .and_then(Value::as_str)
            .map(|d| d.trim().to_lowercase())
            .filter(|d| !d.is_empty())
    }

    /// The language of the context's locale ("zh-CN" → "zh").
    pub fn locale_language(&self) -> Option<String> {
        self.context
            .get("locale")
            .and_then(Value::as_str)
            .and_then(|l| l.split(['-', '_']).next())
            .map(str::to_lowercase)
            .filter(|l| !l.is_empty())
    }
}

impl ResolvePolicy {
    pub fn statuses(&self) -> &[AgentStatus] {
        if self.statuses.is_empty() {
            &[AgentStatus::Active]
        } else {
            &self.statuses
        }
    }

    /// Why `record` fails the policy (empty: it passes). `verified` is the
    /// state of its publisher metadata.
    pub fn violations(&self, record: &AgentRecord, verified: bool) -> Vec<String> {
        let m = &record.metadata;
        let has = |t: &String| m.tags.contains(t) || m.capabilities.contains(t);
        let mut out = Vec::new();
        let missing: Vec<&str> = self
            .required_tags
            .iter()
            .filter(|t| !has(t))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            out.push(format!("lacks required tags: {}", missing.join(", ")));
        }
        let banned: Vec<&str> = self
            .excluded_tags
            .iter()
            .filter(|t| has(t))
            .map(String::as_str)
            .collect();
        if !banned.is_empty() {
            out.push(format!("has excluded tags: {}", banned.join(", ")));
        }
        if !self.statuses().contains(&m.effective_status()) {
            out.push(format!("status is {}", m.effective_status().as_str()));
        }
        if self.binding(record).is_none() {
            out.push(format!(
                "no binding with an acceptable protocol ({})",
                self.protocols.join(", ")
            ));
        }
        if self.require_verified && !verified {
            out.push("publisher metadata is self-asserted, not verified".into());
        }
        out
    }

    /// The binding to use: acceptable protocol, lowest `priority` first
    /// (bindings without one after those with one), then declaration order.
    pub fn binding<'a>(&self, record: &'a AgentRecord) -> Option<&'a Binding> {
        preferred_binding(&record.metadata.bindings, |b| {
            let p = b.protocol.to_ascii_lowercase();
            self.protocols.is_empty() || self.protocols.contains(&p)
        })
    }
}

/// The binding to call among those `acceptable` passes: lowest `priority`
/// first (bindings without one after those with one), then declaration
/// order.
pub fn preferred_binding(
    bindings: &[Binding],
    acceptable: impl Fn(&Binding) -> bool,
) -> Option<&Binding> {
    bindings
        .iter()
        .filter(|b| acceptable(b))
        .min_by_key(|b| b.priority.unwrap_or(i64::MAX))
}

/// The operation a client should call: the one named, else the only one.
pub fn chosen_operation<'a>(
    record: &'a AgentRecord,
    best_match: Option<&str>,
) -> Option<&'a Operation> {
    let ops = &record.metadata.operations;
    best_match
        .and_then(|name| ops.iter().find(|o| o.name == name))
        .or(if ops.len() == 1 { ops.first() } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> AgentRecord {
        AgentRecord {
            metadata: serde_json::from_value(json!({
                "id": "a", "name": "A", "description": "d", "tags": ["legal"], "status": "deprecated",
                "bindings": [
                    {"protocol": "grpc", "endpoint": "grpc://a.example:443"},
                    {"protocol": "https", "endpoint": "https://a.example/slow", "priority": 5},
                    {"protocol": "https", "endpoint": "https://a.example/fast", "priority": 1}
                ],
                "operations": [{"name": "summarise"}]
            }))
            .unwrap(),
            envelope: Default::default(),
        }
    }

    #[test]
    fn policy_reports_every_reason_and_picks_the_preferred_binding() {
        let r = record();
        let mut req = ResolveRequest {
            intent: " summarise a contract ".into(),
            context: json!({"locale": "zh-CN", "domain": "Legal"})
                .as_object()
                .unwrap()
                .clone(),
            policy: ResolvePolicy {
                required_tags: vec!["Legal".into(), "chinese".into()],
                protocols: vec!["HTTPS".into()],
                require_verified: true,
                ..Default::default()
            },
        };
        req.normalise().unwrap();
        assert_eq!(req.locale_language().as_deref(), Some("zh"));
        assert_eq!(req.domain_tag().as_deref(), Some("legal"));
        assert_eq!(req.policy.max_candidates, DEFAULT_MAX_CANDIDATES);
        let v = req.policy.violations(&r, false);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(
            v[0].contains("chinese") && v[1].contains("deprecated") && v[2].contains("verified")
        );
        assert_eq!(
            req.policy.binding(&r).unwrap().endpoint,
            "https://a.example/fast"
        );
        assert_eq!(chosen_operation(&r, None).unwrap().name, "summarise");
        req.intent = "  ".into();
        assert_eq!(req.normalise().unwrap_err().pointer, "/intent");
    }
}
