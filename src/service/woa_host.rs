//! The registry as a Web of Agents host (WoA 4, 7): every public agent the
//! gateway can call, as one `/.well-known/woa.json` document whose `rest`
//! transport points at the gateway's `/agents/{agent_id}/invoke`.
//!
//! The document is built from a scan of the records and kept until the
//! registry changes (rebuilt at most once a second), with its ETag and
//! Last-Modified. Agent ids that do not fit WoA's agent-id ABNF appear
//! under a stable token (`gateway::import::woa_token`); the gateway maps a
//! token in its path back to the record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::error::ServiceError;
use super::registry::RegistryService;
use crate::domain::{AgentRecord, AgentStatus, Visibility};
use crate::gateway::import::woa_token;
use crate::gateway::transport;

/// The least time between two rebuilds while the registry keeps changing.
const REBUILD_EVERY: Duration = Duration::from_secs(1);

/// One built document.
#[derive(Debug)]
pub struct WoaDocument {
    /// The registry revision it was built at.
    pub revision: u64,
    pub body: Bytes,
    /// Strong validator, quoted.
    pub etag: String,
    /// The newest change among its agents.
    pub last_modified: OffsetDateTime,
    /// WoA token → registry id, for tokens that differ from the id.
    tokens: HashMap<String, String>,
    /// (registry id, name) of each agent listed, in id order.
    pub agents: Vec<(String, String)>,
    built: Instant,
}

/// The WoA host: its public base URL and the current document.
#[derive(Clone)]
pub struct WoaHost {
    base: String,
    pub max_age: Duration,
    current: Arc<Mutex<Option<Arc<WoaDocument>>>>,
}

impl WoaHost {
    /// `base` is where clients reach the HTTP API (the `rest` transport's
    /// `base`).
    pub fn new(base: String, max_age: Duration) -> Self {
        Self {
            base: base.trim_end_matches('/').to_string(),
            max_age,
            current: Arc::new(Mutex::new(None)),
        }
    }

    fn cached(&self) -> Option<Arc<WoaDocument>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The current document, rebuilt when the registry has changed.
    pub async fn document(
        &self,
        registry: &RegistryService,
    ) -> Result<Arc<WoaDocument>, ServiceError> {
        let revision = registry.reader().applied_revision();
        if let Some(doc) = self.cached() {
            if doc.revision == revision || doc.built.elapsed() < REBUILD_EVERY {
                return Ok(doc);
            }
        }
        self.rebuild(registry, revision).await
    }

    async fn rebuild(
        &self,
        registry: &RegistryService,
        revision: u64,
    ) -> Result<Arc<WoaDocument>, ServiceError> {
        let reader = registry.reader().clone();
        let base = self.base.clone();
        let previous = self.cached();
        let doc = tokio::task::spawn_blocking(move || {
            let mut records = Vec::new();
            reader.scan(|r| {
                if hosted(&r) {
                    records.push(r);
                }
            })?;
            let previous = previous
                .as_ref()
                .map(|d| (d.etag.as_str(), d.last_modified));
            Ok::<_, ServiceError>(build(&base, revision, &records, previous))
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("building woa.json: {e}")))??;
        let doc = Arc::new(doc);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(doc.clone());
        Ok(doc)
    }

    /// The registry id a WoA token stands for, if it is one of ours.
    pub async fn id_for_token(
        &self,
        registry: &RegistryService,
        token: &str,
    ) -> Result<Option<String>, ServiceError> {
        if !crate::gateway::import::is_woa_agent_id(token) {
            return Ok(None);
        }
        if let Some(id) = self.cached().and_then(|d| d.tokens.get(token).cloned()) {
            return Ok(Some(id));
        }
        let revision = registry.reader().applied_revision();
        Ok(self
            .rebuild(registry, revision)
            .await?
            .tokens
            .get(token)
            .cloned())
    }
}

/// Whether the document lists a record: public, live, active or
/// deprecated, and callable through the gateway.
fn hosted(r: &AgentRecord) -> bool {
    r.envelope.visibility == Visibility::Public
        && !r.envelope.deleted
        && matches!(
            r.metadata.effective_status(),
            AgentStatus::Active | AgentStatus::Deprecated
        )
        && r.metadata.bindings.iter().any(transport::callable)
}

/// WoA requires `inputs` and `outputs`; an agent that declares none
/// accepts and returns some object.
fn any_object() -> Value {
    json!({"type": "object"})
}

fn agent_object(r: &AgentRecord, token: &str) -> Value {
    let m = &r.metadata;
    let single = (m.operations.len() == 1).then(|| &m.operations[0]);
    let inputs = m
        .inputs
        .clone()
        .or_else(|| single.and_then(|o| o.inputs.clone()))
        .unwrap_or_else(any_object);
    let outputs = m
        .outputs
        .clone()
        .or_else(|| single.and_then(|o| o.outputs.clone()))
        .unwrap_or_else(any_object);
    let mut a = Map::new();
    a.insert("id".into(), json!(token));
    a.insert("name".into(), json!(m.name));
    a.insert("description".into(), json!(m.description));
    if let Some(v) = &m.version {
        a.insert("version".into(), json!(v));
    }
    if !m.capabilities.is_empty() {
        a.insert("capabilities".into(), json!(m.capabilities));
    }
    a.insert("inputs".into(), inputs);
    a.insert("outputs".into(), outputs);
    a.insert("transports".into(), json!(["rest"]));
    if !m.operations.is_empty() {
        let ops: Vec<Value> = m
            .operations
            .iter()
            .map(|o| {
                let mut op = Map::new();
                op.insert("name".into(), json!(o.name));
                op.insert(
                    "description".into(),
                    json!(o.description.clone().unwrap_or_else(|| o.name.clone())),
                );
                if let Some(s) = &o.inputs {
                    op.insert("inputs".into(), s.clone());
                }
                if let Some(s) = &o.outputs {
                    op.insert("outputs".into(), s.clone());
                }
                Value::Object(op)
            })
            .collect();
        a.insert("operations".into(), Value::Array(ops));
    }
    // The mapping from a token back to the record, for readers.
    if token != m.id {
        a.insert("registry_id".into(), json!(m.id));
    }
    Value::Object(a)
}

/// The document of `records`; `previous` is the last build's ETag and
/// Last-Modified (see [`changed_at`]).
fn build(
    base: &str,
    revision: u64,
    records: &[AgentRecord],
    previous: Option<(&str, OffsetDateTime)>,
) -> WoaDocument {
    let mut tokens = HashMap::new();
    let agents: Vec<Value> = records
        .iter()
        .map(|r| {
            let token = woa_token(&r.metadata.id);
            if token != r.metadata.id {
                tokens.insert(token.clone(), r.metadata.id.clone());
            }
            agent_object(r, &token)
        })
        .collect();
    let doc = json!({
        "woa_version": "1",
        "agents": agents,
        "transports": {
            "rest": {"base": base, "invoke_path": "/agents/{agent_id}/invoke"}
        }
    });
    let body = Bytes::from(doc.to_string());
    let digest = Sha256::digest(&body);
    let etag = format!("\"{}\"", crate::crypto::hex(&digest[..12]));
    WoaDocument {
        revision,
        body,
        last_modified: changed_at(previous, &etag, OffsetDateTime::now_utc()),
        etag,
        tokens,
        agents: records
            .iter()
            .map(|r| (r.metadata.id.clone(), r.metadata.name.clone()))
            .collect(),
        built: Instant::now(),
    }
}

/// IMF-fixdate (RFC 9110 5.6.7), as Last-Modified is written.
pub fn http_date(t: OffsetDateTime) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.to_offset(time::UtcOffset::UTC)
        .format(FORMAT)
        .unwrap_or_default()
}

/// Reads an IMF-fixdate (If-Modified-Since).
pub fn parse_http_date(s: &str) -> Option<OffsetDateTime> {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), FORMAT)
        .ok()
        .map(|t| t.assume_utc())
}

/// When a rebuilt document last changed, for its Last-Modified: the
/// previous build's time while the body is the same, otherwise now (whole
/// seconds), always after the previous. Not the newest record's date: a
/// deletion, an expiry or a record dated in the past would leave that date
/// where it was or move it back, and a client's If-Modified-Since would then
/// be answered 304 for a document that changed.
pub fn changed_at(
    previous: Option<(&str, OffsetDateTime)>,
    etag: &str,
    now: OffsetDateTime,
) -> OffsetDateTime {
    let now = now.replace_nanosecond(0).unwrap_or(now);
    match previous {
        Some((tag, at)) if tag == etag => at,
        Some((_, at)) => now.max(at + time::Duration::SECOND),
        None => now,
    }
}

/// Whether an `If-None-Match` list names `etag` (weak comparison, RFC 9110
/// 13.1.2), so a GET answers 304.
pub fn none_match_fails(if_none_match: &str, etag: &str) -> bool {
    if_none_match
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
}

/// Whether a conditional GET may be answered 304 (RFC 9110 13.1):
/// If-None-Match rules when present (weak comparison), else
/// If-Modified-Since.
pub fn not_modified(
    etag: &str,
    last_modified: OffsetDateTime,
    if_none_match: Option<&str>,
    if_modified_since: Option<&str>,
) -> bool {
    if let Some(inm) = if_none_match {
        return none_match_fails(inm, etag);
    }
    if_modified_since
        .and_then(parse_http_date)
        .is_some_and(|since| last_modified <= since)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentMetadata, Envelope};

    fn record(id: &str, extra: Value) -> AgentRecord {
        let mut meta = json!({"id": id, "name": "Echo", "description": "Echoes its input.",
            "bindings": [{"protocol": "https", "endpoint": "https://echo.example/invoke"}]});
        if let (Value::Object(m), Value::Object(e)) = (&mut meta, extra) {
            m.extend(e);
        }
        AgentRecord {
            metadata: serde_json::from_value::<AgentMetadata>(meta).unwrap(),
            envelope: Envelope {
                modified_at: "2026-11-20T10:00:00Z".into(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_document_lists_callable_public_agents_with_tokens() {
        let plain = record(
            "echo",
            json!({"outputs": {"type": "object", "required": ["echo"]}}),
        );
        let uri = record("https://agents.example/echo", json!({}));
        let mut private = record("secret", json!({}));
        private.envelope.visibility = Visibility::Private;
        // The gateway calls A2A over JSON-RPC and HTTP+JSON, not gRPC.
        let grpc_only = record(
            "card",
            json!({"bindings": [{"protocol": "a2a", "endpoint": "https://a.example/", "transport": "GRPC"}]}),
        );
        let hosted_records: Vec<AgentRecord> = [plain, uri, private, grpc_only]
            .into_iter()
            .filter(hosted)
            .collect();
        let doc = build("https://registry.example", 7, &hosted_records, None);
        let v: Value = serde_json::from_slice(&doc.body).unwrap();
        assert_eq!(v["woa_version"], "1");
        assert_eq!(
            v["transports"]["rest"]["invoke_path"],
            "/agents/{agent_id}/invoke"
        );
        let agents = v["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 2, "{v}");
        assert_eq!(agents[0]["id"], "echo");
        assert_eq!(agents[0]["outputs"]["required"][0], "echo");
        assert_eq!(agents[0]["inputs"], json!({"type": "object"}));
        let token = agents[1]["id"].as_str().unwrap();
        assert!(crate::gateway::import::is_woa_agent_id(token), "{token}");
        assert_eq!(agents[1]["registry_id"], "https://agents.example/echo");
        assert_eq!(
            doc.tokens.get(token).map(String::as_str),
            Some("https://agents.example/echo")
        );
    }

    #[test]
    fn last_modified_moves_forward_exactly_when_the_document_changes() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let first = changed_at(None, "\"a\"", t0);
        assert_eq!(first, t0);
        let later = t0 + time::Duration::minutes(5);
        // The same body keeps its date, however much later it is rebuilt.
        assert_eq!(changed_at(Some(("\"a\"", first)), "\"a\"", later), t0);
        // A changed body (a deletion, a record dated in the past) moves it
        // to now, and within the same second still past the previous date.
        assert_eq!(changed_at(Some(("\"a\"", first)), "\"b\"", later), later);
        assert_eq!(
            changed_at(Some(("\"a\"", first)), "\"b\"", t0),
            t0 + time::Duration::SECOND
        );
    }

    #[test]
    fn conditional_requests_compare_validators() {
        let doc = build("https://r.example", 1, &[record("echo", json!({}))], None);
        assert!(not_modified(
            &doc.etag,
            doc.last_modified,
            Some(&doc.etag),
            None
        ));
        assert!(not_modified(
            &doc.etag,
            doc.last_modified,
            Some(&format!("\"x\", W/{}", doc.etag)),
            None
        ));
        assert!(!not_modified(
            &doc.etag,
            doc.last_modified,
            Some("\"other\""),
            Some(&http_date(doc.last_modified))
        ));
        let after = http_date(doc.last_modified + time::Duration::DAY);
        let before = http_date(doc.last_modified - time::Duration::DAY);
        assert!(not_modified(
            &doc.etag,
            doc.last_modified,
            None,
            Some(&after)
        ));
        assert!(!not_modified(
            &doc.etag,
            doc.last_modified,
            None,
            Some(&before)
        ));
        assert!(!not_modified(&doc.etag, doc.last_modified, None, None));
    }
}
