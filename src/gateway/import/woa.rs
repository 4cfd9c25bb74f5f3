//! Web of Agents: a host's `/.well-known/woa.json` document mapped into one
//! record per agent the gateway can invoke, and the WoA agent ids under
//! which this registry, as a WoA host, publishes its own records.
//!
//! WoA is the one format where a document describes many agents and
//! transports the gateway may not speak, so its import also reports what it
//! left out (`WoaImport`), rather than failing or guessing.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use url::Url;

use super::{add_tag, http_url, ptr, source, Dropped, Obj, Result};
use crate::domain::validate::{compile_schema, normalise_and_validate};
use crate::domain::{AgentMetadata, Binding, FieldError, Limits, Operation, Protocol};

/// Longest readable prefix a [`woa_token`] keeps before its hash.
const WOA_TOKEN_PREFIX_LEN: usize = 40;

/// What one WoA document yields: the agents the gateway can invoke, and an
/// account of what it cannot, so the caller can tell the host's operator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WoaImport {
    pub agents: Vec<AgentMetadata>,
    pub skipped: Vec<Skipped>,
    pub unsupported_transports: Vec<UnsupportedTransport>,
}

/// An agent left out because none of its transports is supported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    /// The agent's id within the WoA document.
    pub agent_id: String,
    pub reason: String,
}

/// A transport an agent lists that the gateway does not implement (a
/// private or unknown registered transport, or MCP not over HTTP).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnsupportedTransport {
    /// The agent's id within the WoA document.
    pub agent_id: String,
    pub transport: String,
    pub reason: String,
}

/// Whether `s` is a WoA agent id (`agent-id = 1*( ALPHA / DIGIT / "-" /
/// "_" )`), i.e. usable as-is where this registry is the WoA host.
pub fn is_woa_agent_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The WoA agent id under which this registry, as a WoA host, publishes the
/// record `id`: WoA ids are plain tokens while registry ids are often URIs.
///
/// An id that already is a WoA agent id is used unchanged. Any other id
/// gets a stable token that stays readable and cannot collide by accident:
/// its characters outside `[A-Za-z0-9_-]` become '-', runs of '-' collapse
/// to one, '-' is trimmed from both ends, the result is cut to at most 40
/// characters (and trimmed of a '-' the cut exposes), then `-` and the first
/// 12 hex digits of the SHA-256 of the id are appended (the hash alone when
/// nothing readable is left). It depends on the id only, so the token stays
/// the same across restarts and across the nodes of a cluster.
pub fn woa_token(id: &str) -> String {
    if is_woa_agent_id(id) {
        return id.to_string();
    }
    let mut readable = String::with_capacity(id.len());
    for c in id.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c
        } else {
            '-'
        };
        if !(c == '-' && readable.ends_with('-')) {
            readable.push(c);
        }
    }
    // Only ASCII is left, so every byte index is a character boundary.
    let readable = readable.trim_matches('-');
    let readable = readable[..readable.len().min(WOA_TOKEN_PREFIX_LEN)].trim_end_matches('-');
    let hash = crate::crypto::hex(&Sha256::digest(id.as_bytes())[..6]);
    if readable.is_empty() {
        hash
    } else {
        format!("{readable}-{hash}")
    }
}

/// A WoA transport configuration, checked once per document.
enum Transport {
    Rest {
        base: String,
        invoke_path: String,
    },
    Mcp {
        server: String,
        namespace: String,
        field: String,
    },
    Unsupported(String),
}

/// Maps a WoA document into one record per agent the gateway can invoke.
///
/// The document is checked as a whole before anything is returned: one
/// malformed agent or transport refuses the document, so a host is never
/// half-imported (a later fix would otherwise look like agents appearing
/// and vanishing). Each returned record has also passed the registry's own
/// record checks (apart from the operator's size limit), for the same
/// reason. Transports other than `rest` and MCP over HTTP are reported,
/// never guessed at. `allow_http` admits plain-http transport URLs, for
/// tests and private deployments (WoA requires https).
pub fn woa_document(doc: &Value, doc_url: &Url, allow_http: bool) -> Result<WoaImport> {
    let root = Obj::of(doc, "", "a JSON object (a WoA document)")?;
    match root.get("woa_version") {
        Some(Value::String(v)) if v == "1" => {}
        Some(v) => {
            return Err(FieldError::new(
                "/woa_version",
                format!(
                    "must be the string \"1\" (the only WoA version this registry reads), not {v}"
                ),
            ))
        }
        None => {
            return Err(FieldError::new(
                "/woa_version",
                "is required and must be the string \"1\"",
            ))
        }
    }
    let configs = root.object(
        "transports",
        "an object mapping transport names to configuration objects",
    )?;
    let mut transports = HashMap::new();
    for (name, config) in configs.iter().flat_map(|t| t.map) {
        let at = ptr("/transports", name);
        transports.insert(name.as_str(), woa_transport(name, config, at, allow_http)?);
    }
    let Some(Value::Array(agents)) = root.get("agents") else {
        return Err(FieldError::new(
            "/agents",
            "is required and must be an array of agent objects",
        ));
    };

    // Size is the caller's limit (operators tune it); the rest of the
    // record rules are fixed, so check them here with the source pointer.
    let unbounded = Limits {
        max_record_bytes: usize::MAX,
        ..Limits::default()
    };
    let mut out = WoaImport {
        agents: Vec::new(),
        skipped: Vec::new(),
        unsupported_transports: Vec::new(),
    };
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, agent) in agents.iter().enumerate() {
        let a = Obj::of(agent, ptr("/agents", i), "an agent object")?;
        let id = a.text("id")?;
        if !is_woa_agent_id(id) {
            return Err(FieldError::new(
                a.at("id"),
                format!(
                    "'{id}' is not a WoA agent id (one or more ASCII letters, digits, '-' or '_')"
                ),
            ));
        }
        if let Some(first) = ids.insert(id, i) {
            return Err(FieldError::new(
                a.at("id"),
                format!("duplicates the id '{id}' of /agents/{first}"),
            ));
        }
        if let Some(meta) = woa_agent(&a, id, doc_url, configs.as_ref(), &transports, &mut out)? {
            normalise_and_validate(&mut meta.clone(), &unbounded).map_err(|e| {
                FieldError::new(
                    a.at.clone(),
                    format!("maps to a record the registry cannot store ({e})"),
                )
            })?;
            out.agents.push(meta);
        }
    }
    Ok(out)
}

/// Checks one entry of the document's `transports` object.
fn woa_transport(name: &str, config: &Value, at: String, allow_http: bool) -> Result<Transport> {
    let c = Obj::of(config, at, "a transport configuration object")?;
    match name {
        "rest" => {
            let base = http_url(&c, "base", allow_http)?;
            if base.query().is_some() || base.fragment().is_some() {
                return Err(FieldError::new(
                    c.at("base"),
                    "must not have a query or fragment (invoke_path is appended to it)",
                ));
            }
            let base = base.as_str().trim_end_matches('/').to_string();
            let invoke_path = c.text("invoke_path")?;
            if !invoke_path.starts_with('/') {
                return Err(FieldError::new(
                    c.at("invoke_path"),
                    "must be an absolute path beginning with '/'",
                ));
            }
            if invoke_path.contains('#') {
                return Err(FieldError::new(
                    c.at("invoke_path"),
                    "must not contain a fragment ('#')",
                ));
            }
            rest_url(&base, invoke_path, "agent")
                .map_err(|m| FieldError::new(c.at("invoke_path"), m))?;
            Ok(Transport::Rest {
                base,
                invoke_path: invoke_path.to_string(),
            })
        }
        "mcp" => {
            let server = c.text("server")?;
            let namespace = c.text("tool_namespace")?.to_string();
            let field = c.text("tool_field")?.to_string();
            // WoA lets `server` be any MCP server identifier; the gateway
            // speaks only MCP over HTTP, so anything else is unsupported,
            // while an http(s) URL must follow the https rule.
            let over_http = Url::parse(server)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host());
            if !over_http {
                return Ok(Transport::Unsupported(format!(
                    "its MCP server '{server}' is not an http(s) URL (only MCP over HTTP is supported)"
                )));
            }
            Ok(Transport::Mcp {
                server: http_url(&c, "server", allow_http)?.into(),
                namespace,
                field,
            })
        }
        _ if name.contains('.') => Ok(Transport::Unsupported(
            "it is a private transport (reverse-DNS name) this gateway does not implement".into(),
        )),
        _ => Ok(Transport::Unsupported(
            "it is not a transport this gateway implements (rest, mcp)".into(),
        )),
    }
}

/// The invocation URL of a REST transport for one agent (WoA 4.3.1: base
/// and invoke_path concatenated, "{agent_id}" replaced).
fn rest_url(base: &str, invoke_path: &str, agent: &str) -> std::result::Result<String, String> {
    let joined = format!("{base}{}", invoke_path.replace("{agent_id}", agent));
    Url::parse(&joined)
        .map(String::from)
        .map_err(|e| format!("does not make a valid URL with the base ({e})"))
}

/// Maps one agent object; `None` when none of its transports is supported.
fn woa_agent(
    a: &Obj,
    id: &str,
    doc_url: &Url,
    configs: Option<&Obj>,
    transports: &HashMap<&str, Transport>,
    out: &mut WoaImport,
) -> Result<Option<AgentMetadata>> {
    let name = a.text("name")?;
    let description = a.text("description")?;
    let version = a.opt_text("version")?;
    let mut dropped = Dropped::default();
    let mut capabilities = Vec::new();
    for (p, c) in a.strings("capabilities")? {
        add_tag(&mut capabilities, c, p, "capability", &mut dropped);
    }
    let inputs = woa_schema(a, "inputs")?
        .ok_or_else(|| FieldError::new(a.at("inputs"), "is required (a JSON Schema object)"))?;
    let outputs = woa_schema(a, "outputs")?
        .ok_or_else(|| FieldError::new(a.at("outputs"), "is required (a JSON Schema object)"))?;

    let mut operations = Vec::new();
    let mut op_names = HashSet::new();
    for (j, op) in a.array("operations")?.iter().enumerate() {
        let o = Obj::of(op, ptr(&a.at("operations"), j), "an operation object")?;
        let op_name = o.text("name")?;
        if !is_woa_agent_id(op_name) {
            return Err(FieldError::new(
                o.at("name"),
                format!("'{op_name}' is not a token (ASCII letters, digits, '-' and '_')"),
            ));
        }
        if !op_names.insert(op_name) {
            return Err(FieldError::new(
                o.at("name"),
                format!("duplicates the operation name '{op_name}'"),
            ));
        }
        // Each operation carries its own schemas so it can be validated
        // (and invoked) without looking at the agent level.
        operations.push(Operation {
            name: op_name.to_string(),
            description: Some(o.text("description")?.to_string()),
            inputs: Some(woa_schema(&o, "inputs")?.unwrap_or_else(|| inputs.clone())),
            outputs: Some(woa_schema(&o, "outputs")?.unwrap_or_else(|| outputs.clone())),
            ..Default::default()
        });
    }

    let names = a.strings("transports")?;
    if names.is_empty() {
        return Err(FieldError::new(
            a.at("transports"),
            "is required and must name at least one transport",
        ));
    }
    let mut used = Map::new();
    let mut bindings = Vec::new();
    let mut unsupported = Vec::new();
    for (p, t) in names {
        let (Some(config), Some(transport)) =
            (configs.and_then(|c| c.map.get(t)), transports.get(t))
        else {
            return Err(FieldError::new(
                p,
                format!("names the transport '{t}', which the document's transports object does not define"),
            ));
        };
        if used.insert(t.to_string(), config.clone()).is_some() {
            return Err(FieldError::new(
                p,
                format!("lists the transport '{t}' twice"),
            ));
        }
        let mut extra = Map::from_iter([("woa_agent".to_string(), json!(id))]);
        let (protocol, endpoint, priority) = match transport {
            Transport::Rest { base, invoke_path } => (
                Protocol::WoaRest.as_str(),
                rest_url(base, invoke_path, id).map_err(|m| FieldError::new(p, m))?,
                0,
            ),
            Transport::Mcp {
                server,
                namespace,
                field,
            } => {
                extra.insert("tool_namespace".into(), json!(namespace));
                extra.insert("tool_field".into(), json!(field));
                (Protocol::Mcp.as_str(), server.clone(), 1)
            }
            Transport::Unsupported(reason) => {
                unsupported.push((t, reason.as_str()));
                continue;
            }
        };
        bindings.push(Binding {
            protocol: protocol.into(),
            endpoint,
            media_types: vec!["application/json".into()],
            interaction_model: Some("request-response".into()),
            priority: Some(priority),
            extra,
        });
    }
    bindings.sort_by_key(|b| b.priority);
    for (t, reason) in &unsupported {
        out.unsupported_transports.push(UnsupportedTransport {
            agent_id: id.into(),
            transport: t.to_string(),
            reason: reason.to_string(),
        });
    }
    if bindings.is_empty() {
        let listed: Vec<String> = unsupported
            .iter()
            .map(|(t, reason)| format!("'{t}': {reason}"))
            .collect();
        out.skipped.push(Skipped {
            agent_id: id.into(),
            reason: format!(
                "none of its transports is supported ({})",
                listed.join("; ")
            ),
        });
        return Ok(None);
    }

    // The provenance document is this agent's slice of the WoA document:
    // itself valid WoA, with the configurations its transports refer to.
    let document = json!({
        "woa_version": "1",
        "agents": [Value::Object(a.map.clone())],
        "transports": used,
    });
    let mut agent_url = doc_url.clone();
    agent_url.set_fragment(Some(id));
    let mut meta = AgentMetadata {
        id: agent_url.into(),
        name: name.into(),
        description: description.into(),
        version: version.map(String::from),
        publisher: doc_url.host_str().map(String::from),
        capabilities,
        tags: vec!["woa".into()],
        inputs: Some(inputs),
        outputs: Some(outputs),
        operations,
        bindings,
        ..Default::default()
    };
    meta.extra
        .insert("source".into(), source("woa", doc_url, document, dropped));
    Ok(Some(meta))
}

/// A WoA schema member (WoA 4.2: a JSON Schema 2020-12 object), if present.
fn woa_schema(o: &Obj, key: &str) -> Result<Option<Value>> {
    let Some(schema) = o.get(key) else {
        return Ok(None);
    };
    if !schema.is_object() {
        return Err(FieldError::new(o.at(key), "must be a JSON Schema object"));
    }
    compile_schema(schema, &o.at(key))?;
    Ok(Some(schema.clone()))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{dropped_pointers, stored, url};
    use super::*;

    const WOA_URL: &str = "https://api.example.com/.well-known/woa.json";

    /// The agent of WoA Appendix B.
    fn summarizer() -> Value {
        json!({
            "id": "summarizer",
            "name": "Document Summarizer",
            "description": "Summarizes English text.",
            "version": "1.0.0",
            "capabilities": ["https://example.com/capability/summarization"],
            "inputs": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "Input document text in English."},
                    "max_words": {"type": "integer", "minimum": 10, "maximum": 500,
                                  "description": "Maximum number of words in the summary."}
                },
                "required": ["text"]
            },
            "outputs": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"summary": {"type": "string", "description": "The generated summary."}},
                "required": ["summary"]
            },
            "transports": ["rest"],
            "operations": [{"name": "default", "description": "Default summarization operation."}]
        })
    }

    fn rest() -> Value {
        json!({"base": "https://api.example.com", "invoke_path": "/agents/{agent_id}/invoke"})
    }

    /// WoA Appendix B: one agent, the REST transport.
    fn appendix_b() -> Value {
        json!({"woa_version": "1", "agents": [summarizer()], "transports": {"rest": rest()}})
    }

    /// A host with several agents and transports, some not supported.
    fn multi_host() -> Value {
        json!({
            "woa_version": "1",
            "agents": [
                summarizer(),
                {
                    "id": "translator_v2",
                    "name": "Translator",
                    "description": "Translates short texts between European languages.",
                    "capabilities": ["urn:example:cap:translation", "Translation"],
                    "inputs": {"type": "object",
                               "properties": {"text": {"type": "string"}, "target": {"type": "string"}},
                               "required": ["text", "target"]},
                    "outputs": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "transports": ["com.example.queue", "mcp", "rest", "grpc"],
                    "operations": [
                        {"name": "translate", "description": "Translate the text."},
                        {"name": "detect", "description": "Detect the language of the text.",
                         "inputs": {"type": "object", "properties": {"text": {"type": "string"}},
                                    "required": ["text"]},
                         "outputs": {"type": "object", "properties": {"language": {"type": "string"}}}}
                    ],
                    "authz": {"scheme": "south", "policy_uri": "https://authz.example.com/south/policies/translator"}
                },
                {
                    "id": "batch-ocr",
                    "name": "Batch OCR",
                    "description": "Extracts text from scanned pages, queued.",
                    "inputs": {"type": "object"},
                    "outputs": {"type": "object"},
                    "transports": ["com.example.queue", "grpc"]
                }
            ],
            "transports": {
                "rest": rest(),
                "mcp": {"server": "https://mcp.example.com/mcp", "tool_namespace": "example", "tool_field": "agent"},
                "com.example.queue": {"queue": "amqps://mq.example.com/agents"},
                "grpc": {"target": "grpc.example.com:443"}
            }
        })
    }

    fn import(doc: &Value) -> WoaImport {
        woa_document(doc, &url(WOA_URL), false).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn woa_appendix_b_agent_becomes_a_rest_bound_record() {
        let out = import(&appendix_b());
        assert!(out.skipped.is_empty() && out.unsupported_transports.is_empty());
        assert_eq!(out.agents.len(), 1);
        let m = &out.agents[0];
        assert_eq!(
            m.id,
            "https://api.example.com/.well-known/woa.json#summarizer"
        );
        assert_eq!(m.name, "Document Summarizer");
        assert_eq!(m.description, "Summarizes English text.");
        assert_eq!(m.version.as_deref(), Some("1.0.0"));
        assert_eq!(m.publisher.as_deref(), Some("api.example.com"));
        assert_eq!(
            m.capabilities,
            vec!["https://example.com/capability/summarization"]
        );
        assert_eq!(m.tags, vec!["woa"]);
        assert_eq!(m.inputs.as_ref(), Some(&summarizer()["inputs"]));
        assert_eq!(m.outputs.as_ref(), Some(&summarizer()["outputs"]));

        // The operation without schemas of its own gets the agent's.
        assert_eq!(m.operations.len(), 1);
        let op = &m.operations[0];
        assert_eq!(op.name, "default");
        assert_eq!(
            op.description.as_deref(),
            Some("Default summarization operation.")
        );
        assert_eq!(op.inputs, m.inputs);
        assert_eq!(op.outputs, m.outputs);

        assert_eq!(
            m.bindings,
            vec![Binding {
                protocol: "woa-rest".into(),
                endpoint: "https://api.example.com/agents/summarizer/invoke".into(),
                media_types: vec!["application/json".into()],
                interaction_model: Some("request-response".into()),
                priority: Some(0),
                extra: Map::from_iter([("woa_agent".to_string(), json!("summarizer"))]),
            }]
        );
        assert_eq!(
            m.extra["source"],
            json!({"format": "woa", "url": WOA_URL, "document": appendix_b()})
        );
        let m = stored(m.clone());
        assert_eq!(m.auth, None);
    }

    #[test]
    fn woa_transports_are_mapped_or_reported_never_guessed() {
        let out = import(&multi_host());
        let ids: Vec<&str> = out.agents.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "https://api.example.com/.well-known/woa.json#summarizer",
                "https://api.example.com/.well-known/woa.json#translator_v2"
            ]
        );

        let t = &out.agents[1];
        // rest first (0), mcp next (1), whatever order the agent lists them in.
        let bound: Vec<(&str, &str, Option<i64>)> = t
            .bindings
            .iter()
            .map(|b| (b.protocol.as_str(), b.endpoint.as_str(), b.priority))
            .collect();
        assert_eq!(
            bound,
            vec![
                (
                    "woa-rest",
                    "https://api.example.com/agents/translator_v2/invoke",
                    Some(0)
                ),
                ("mcp", "https://mcp.example.com/mcp", Some(1)),
            ]
        );
        assert_eq!(
            Value::Object(t.bindings[1].extra.clone()),
            json!({"woa_agent": "translator_v2", "tool_namespace": "example", "tool_field": "agent"})
        );
        assert_eq!(
            t.capabilities,
            vec!["urn:example:cap:translation", "translation"]
        );
        assert_eq!(t.operations[0].inputs, t.inputs);
        assert_eq!(
            t.operations[1].inputs.as_ref(),
            Some(&multi_host()["agents"][1]["operations"][1]["inputs"])
        );
        assert_eq!(
            t.operations[1].outputs.as_ref(),
            Some(&multi_host()["agents"][1]["operations"][1]["outputs"])
        );

        // Provenance: the agent as received plus the configurations it uses,
        // itself a WoA document.
        let doc = &t.extra["source"]["document"];
        assert_eq!(doc["woa_version"], "1");
        assert_eq!(doc["agents"][0], multi_host()["agents"][1]);
        let used: Vec<&String> = doc["transports"]
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert_eq!(used, vec!["com.example.queue", "mcp", "rest", "grpc"]);
        assert!(
            t.extra.get("authz").is_none(),
            "unknown members stay in the source"
        );

        let reported: Vec<(&str, &str)> = out
            .unsupported_transports
            .iter()
            .map(|u| (u.agent_id.as_str(), u.transport.as_str()))
            .collect();
        assert_eq!(
            reported,
            vec![
                ("translator_v2", "com.example.queue"),
                ("translator_v2", "grpc"),
                ("batch-ocr", "com.example.queue"),
                ("batch-ocr", "grpc"),
            ]
        );
        assert!(out.unsupported_transports[0]
            .reason
            .contains("private transport"));
        assert!(out.unsupported_transports[1]
            .reason
            .contains("not a transport this gateway implements"));

        assert_eq!(out.skipped.len(), 1);
        assert_eq!(out.skipped[0].agent_id, "batch-ocr");
        let reason = &out.skipped[0].reason;
        assert!(
            reason.contains("'com.example.queue'") && reason.contains("'grpc'"),
            "{reason}"
        );

        for m in out.agents {
            stored(m);
        }
    }

    #[test]
    fn woa_import_serialises_for_the_api() {
        let v = serde_json::to_value(import(&multi_host())).unwrap();
        assert_eq!(v["agents"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["skipped"][0]["agent_id"], "batch-ocr");
        assert_eq!(v["unsupported_transports"][1]["transport"], "grpc");
    }

    #[test]
    fn woa_rest_url_is_base_plus_invoke_path() {
        let cases = [
            (
                "https://api.example.com",
                "/agents/{agent_id}/invoke",
                "https://api.example.com/agents/summarizer/invoke",
            ),
            (
                "https://api.example.com/v1/",
                "/invoke?agent={agent_id}&mode=sync",
                "https://api.example.com/v1/invoke?agent=summarizer&mode=sync",
            ),
            (
                "https://API.Example.com:8443/base",
                "/invoke",
                "https://api.example.com:8443/base/invoke",
            ),
        ];
        for (base, path, expected) in cases {
            let mut doc = appendix_b();
            doc["transports"]["rest"] = json!({"base": base, "invoke_path": path});
            assert_eq!(
                import(&doc).agents[0].bindings[0].endpoint,
                expected,
                "{base} {path}"
            );
        }
    }

    #[test]
    fn woa_mcp_server_that_is_no_http_url_is_unsupported() {
        for server in [
            "stdio:npx -y @example/summarizer-mcp",
            "summarizer-mcp",
            "mcp.example.com:7000",
        ] {
            let mut doc = appendix_b();
            doc["agents"][0]["transports"] = json!(["mcp"]);
            doc["transports"]["mcp"] =
                json!({"server": server, "tool_namespace": "example", "tool_field": "agent"});
            let out = import(&doc);
            assert!(out.agents.is_empty(), "{server}");
            assert_eq!(out.skipped[0].agent_id, "summarizer");
            assert!(
                out.unsupported_transports[0]
                    .reason
                    .contains("not an http(s) URL"),
                "{server}"
            );
        }
    }

    #[test]
    fn woa_plain_http_only_when_allowed() {
        let mut doc = appendix_b();
        doc["transports"]["rest"]["base"] = json!("http://localhost:8080");
        let err = woa_document(&doc, &url(WOA_URL), false).unwrap_err();
        assert_eq!(err.pointer, "/transports/rest/base");
        assert!(err.message.contains("https"), "{err}");
        let out = woa_document(&doc, &url(WOA_URL), true).unwrap();
        assert_eq!(
            out.agents[0].bindings[0].endpoint,
            "http://localhost:8080/agents/summarizer/invoke"
        );

        let mut doc = multi_host();
        doc["transports"]["mcp"]["server"] = json!("http://mcp.example.com/mcp");
        let err = woa_document(&doc, &url(WOA_URL), false).unwrap_err();
        assert_eq!(err.pointer, "/transports/mcp/server");
        assert!(woa_document(&doc, &url(WOA_URL), true).is_ok());
    }

    #[test]
    fn woa_record_id_replaces_the_document_urls_fragment() {
        let out =
            woa_document(&appendix_b(), &url("https://h.example/woa.json#top"), false).unwrap();
        assert_eq!(out.agents[0].id, "https://h.example/woa.json#summarizer");
        assert_eq!(out.agents[0].publisher.as_deref(), Some("h.example"));
    }

    #[test]
    fn woa_capabilities_the_registry_cannot_hold_are_dropped_and_noted() {
        let mut doc = appendix_b();
        let long = format!("https://example.com/capability/{}", "x".repeat(60));
        doc["agents"][0]["capabilities"] = json!(["Summarization", long, "  ", "summarization"]);
        let m = &import(&doc).agents[0];
        assert_eq!(m.capabilities, vec!["summarization"]);
        assert_eq!(
            dropped_pointers(m),
            vec!["/agents/0/capabilities/1", "/agents/0/capabilities/2"]
        );
        let notes = &m.extra["source"]["dropped"];
        assert!(
            notes[0]["reason"]
                .as_str()
                .unwrap()
                .contains("longer than 64"),
            "{notes}"
        );
        stored(m.clone());
    }

    #[test]
    fn woa_agent_the_registry_would_refuse_refuses_the_document() {
        let mut doc = multi_host();
        doc["agents"][1]["name"] = json!("n".repeat(300));
        let err = woa_document(&doc, &url(WOA_URL), false).unwrap_err();
        assert_eq!(err.pointer, "/agents/1");
        assert!(err.message.contains("/name"), "{err}");
    }

    #[test]
    fn woa_one_bad_agent_refuses_the_whole_document() {
        let mut doc = multi_host();
        doc["agents"][2]["inputs"] = json!({"type": "nonsense"});
        let err = woa_document(&doc, &url(WOA_URL), false).unwrap_err();
        assert_eq!(err.pointer, "/agents/2/inputs");
        assert!(err.message.contains("JSON Schema"), "{err}");
    }

    #[test]
    fn woa_errors_name_the_member() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (|d| d["woa_version"] = json!(1), "/woa_version"),
            (|d| d["woa_version"] = json!("2"), "/woa_version"),
            (
                |d| {
                    d.as_object_mut().unwrap().remove("woa_version");
                },
                "/woa_version",
            ),
            (
                |d| {
                    d.as_object_mut().unwrap().remove("agents");
                },
                "/agents",
            ),
            (|d| d["agents"] = json!({"summarizer": {}}), "/agents"),
            (|d| d["agents"][0] = json!("summarizer"), "/agents/0"),
            (
                |d| d["agents"][0]["id"] = json!("sum marizer"),
                "/agents/0/id",
            ),
            (
                |d| d["agents"][0]["id"] = json!("summarizer.v1"),
                "/agents/0/id",
            ),
            (|d| d["agents"][0]["id"] = json!(""), "/agents/0/id"),
            (|d| d["agents"][0]["id"] = json!(7), "/agents/0/id"),
            (
                |d| d["agents"][2]["id"] = json!("translator_v2"),
                "/agents/2/id",
            ),
            (|d| d["agents"][0]["name"] = json!(""), "/agents/0/name"),
            (
                |d| {
                    d["agents"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("description");
                },
                "/agents/0/description",
            ),
            (
                |d| d["agents"][0]["version"] = json!(1),
                "/agents/0/version",
            ),
            (
                |d| d["agents"][0]["capabilities"] = json!("summarization"),
                "/agents/0/capabilities",
            ),
            (
                |d| d["agents"][0]["capabilities"] = json!(["a", 5]),
                "/agents/0/capabilities/1",
            ),
            (
                |d| {
                    d["agents"][0].as_object_mut().unwrap().remove("inputs");
                },
                "/agents/0/inputs",
            ),
            (
                |d| d["agents"][0]["outputs"] = json!("string"),
                "/agents/0/outputs",
            ),
            (
                |d| d["agents"][0]["outputs"] = json!(true),
                "/agents/0/outputs",
            ),
            (
                |d| d["agents"][0]["transports"] = json!([]),
                "/agents/0/transports",
            ),
            (
                |d| {
                    d["agents"][0].as_object_mut().unwrap().remove("transports");
                },
                "/agents/0/transports",
            ),
            (
                |d| d["agents"][0]["transports"] = json!("rest"),
                "/agents/0/transports",
            ),
            (
                |d| d["agents"][0]["transports"] = json!(["rest", "soap"]),
                "/agents/0/transports/1",
            ),
            (
                |d| d["agents"][0]["transports"] = json!(["rest", "rest"]),
                "/agents/0/transports/1",
            ),
            (
                |d| d["agents"][0]["operations"] = json!({}),
                "/agents/0/operations",
            ),
            (
                |d| d["agents"][0]["operations"] = json!([{"name": "default"}]),
                "/agents/0/operations/0/description",
            ),
            (
                |d| d["agents"][0]["operations"] = json!([{"name": "sum up", "description": "d"}]),
                "/agents/0/operations/0/name",
            ),
            (
                |d| {
                    d["agents"][0]["operations"] = json!([{"name": "a", "description": "d"}, {"name": "a", "description": "e"}])
                },
                "/agents/0/operations/1/name",
            ),
            (
                |d| d["agents"][0]["operations"][0]["inputs"] = json!({"type": 7}),
                "/agents/0/operations/0/inputs",
            ),
            (|d| d["transports"] = json!(["rest"]), "/transports"),
            (
                |d| d["transports"]["rest"] = json!("https://api.example.com"),
                "/transports/rest",
            ),
            (
                |d| d["transports"]["rest"]["base"] = json!("api.example.com"),
                "/transports/rest/base",
            ),
            (
                |d| d["transports"]["rest"]["base"] = json!("ftp://api.example.com"),
                "/transports/rest/base",
            ),
            (
                |d| d["transports"]["rest"]["base"] = json!("https://api.example.com/?v=1"),
                "/transports/rest/base",
            ),
            (
                |d| {
                    d["transports"]["rest"]
                        .as_object_mut()
                        .unwrap()
                        .remove("base");
                },
                "/transports/rest/base",
            ),
            (
                |d| d["transports"]["rest"]["invoke_path"] = json!("agents/{agent_id}"),
                "/transports/rest/invoke_path",
            ),
            (
                |d| d["transports"]["rest"]["invoke_path"] = json!("/agents#x"),
                "/transports/rest/invoke_path",
            ),
            (
                |d| {
                    d["transports"]["mcp"]
                        .as_object_mut()
                        .unwrap()
                        .remove("tool_field");
                },
                "/transports/mcp/tool_field",
            ),
            (
                |d| d["transports"]["mcp"]["tool_namespace"] = json!(3),
                "/transports/mcp/tool_namespace",
            ),
            (
                |d| d["transports"]["mcp"]["server"] = json!(""),
                "/transports/mcp/server",
            ),
            (
                |d| d["transports"]["com.example.queue"] = json!(5),
                "/transports/com.example.queue",
            ),
            (|d| d["transports"]["x/y"] = json!(null), "/transports/x~1y"),
        ];
        for (edit, pointer) in cases {
            let mut doc = multi_host();
            edit(&mut doc);
            let err = woa_document(&doc, &url(WOA_URL), false)
                .expect_err(&format!("should be refused at {pointer}"));
            assert_eq!(err.pointer, pointer, "{err}");
            assert!(!err.message.is_empty());
        }
        let err = woa_document(&json!([]), &url(WOA_URL), false).unwrap_err();
        assert_eq!(err.pointer, "");
    }

    #[test]
    fn woa_document_without_agents_or_transports_is_empty() {
        let out = import(&json!({"woa_version": "1", "agents": []}));
        assert_eq!(
            out,
            WoaImport {
                agents: vec![],
                skipped: vec![],
                unsupported_transports: vec![]
            }
        );
    }

    #[test]
    fn woa_token_keeps_agent_ids_and_derives_stable_tokens() {
        for id in ["summarizer", "agent-12345", "translator_v2", "A"] {
            assert!(is_woa_agent_id(id));
            assert_eq!(woa_token(id), id);
        }
        for id in ["", "a b", "a.b", "x/y", "é"] {
            assert!(!is_woa_agent_id(id), "{id}");
        }
        // sha256("https://agents.example.net/id/hr-core-automator") = b64a79eed4ae...
        assert_eq!(
            woa_token("https://agents.example.net/id/hr-core-automator"),
            "https-agents-example-net-id-hr-core-auto-b64a79eed4ae"
        );
        // sha256("urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66") = a189abacde44...
        assert_eq!(
            woa_token("urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"),
            "urn-uuid-6e8bc430-9c3a-11d9-9669-0800200-a189abacde44"
        );
        let ids = [
            "translator.example.com",
            "https://a.example/agents/x",
            "https://a.example/agents/x/",
            "--weird..id--",
            "日本語",
            "https://a.example/aaaaaaaaaaaaaaaaaaaaaaa/bbbbbbbb",
            "agent 1",
        ];
        let tokens: Vec<String> = ids.iter().map(|id| woa_token(id)).collect();
        for (id, token) in ids.iter().zip(&tokens) {
            assert!(is_woa_agent_id(token), "{id} -> {token}");
            assert!(
                !token.contains("--") && !token.starts_with('-'),
                "{id} -> {token}"
            );
            assert!(token.len() <= WOA_TOKEN_PREFIX_LEN + 13, "{id} -> {token}");
            assert_eq!(&woa_token(id), token, "deterministic");
        }
        assert_eq!(
            tokens[0],
            format!("translator-example-com-{}", &tokens[0][23..])
        );
        assert_ne!(
            tokens[1], tokens[2],
            "ids differing only in punctuation stay apart"
        );
        assert_eq!(tokens[4].len(), 12, "nothing readable: the hash alone");
        // The cut at 40 characters falls on a '-', which is dropped.
        let readable = format!("https-a-example-{}", "a".repeat(23));
        assert_eq!(tokens[5].len(), readable.len() + 13, "{}", tokens[5]);
        assert!(
            tokens[5].starts_with(&format!("{readable}-")),
            "{}",
            tokens[5]
        );
    }
}
