//! Mapping of foreign agent descriptions into the registry's record.
//!
//! Three formats describe agents the registry indexes and the gateway
//! invokes: Web of Agents documents (`/.well-known/woa.json`), A2A Agent
//! Cards and Agent Protocol `AgentDescriptor`s. Each agent becomes one
//! [`AgentMetadata`] (SPECS.md "One agent record"; ADP "Mapping to Existing
//! Formats" gives the table), and the source is kept in the record's
//! `source` member (`{format, url, document}`) so anyone can see what the
//! record was made from.
//!
//! Everything here is pure: the caller fetches the documents (through the
//! outbound guard) and stores the records (through `normalise_and_validate`).
//! Two kinds of problems are told apart:
//! - a source that breaks its own format is refused with a [`FieldError`]
//!   whose pointer leads into the *source* document, so its publisher can
//!   fix it;
//! - a member that is fine in the source but that the registry cannot hold
//!   (an over-long tag, a media type without '/', an example longer than the
//!   registry keeps) is dropped and noted in `source.dropped` as
//!   `{pointer, reason}`, so one oddity does not keep an agent out.
//!
//! Unknown members of a source are not copied into the record (their names
//! could collide with the record's own); they stay in `source.document`.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use url::Url;

use crate::domain::validate::{
    compile_schema, normalise_and_validate, validate_url, MAX_EXAMPLES, MAX_EXAMPLE_TEXT_LEN,
    MAX_TAGS, MAX_TAG_LEN,
};
use crate::domain::{
    AgentMetadata, AuthRequirement, Binding, FieldError, Limits, Operation, TaskExample,
};

/// Binding protocol of a WoA REST transport: POST the WoA invocation
/// envelope to the endpoint.
pub const PROTOCOL_WOA_REST: &str = "woa-rest";
/// Binding protocol of a WoA MCP transport (streamable HTTP server).
pub const PROTOCOL_MCP: &str = "mcp";
/// Binding protocol of an A2A interface; its `transport` is in the extra.
pub const PROTOCOL_A2A: &str = "a2a";
/// Binding protocol of an Agent Protocol agent; the endpoint is its base URL.
pub const PROTOCOL_AGENT_PROTOCOL: &str = "agent-protocol";

/// Longest readable prefix a [`woa_token`] keeps before its hash.
const WOA_TOKEN_PREFIX_LEN: usize = 40;

/// Keywords that make an Agent Protocol schema object a JSON Schema rather
/// than a casual "field → type name" map.
const SCHEMA_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$defs",
    "type",
    "properties",
    "patternProperties",
    "additionalProperties",
    "items",
    "prefixItems",
    "required",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
];

/// Type names a casual Agent Protocol schema may give a field.
const SIMPLE_TYPES: &[&str] = &["string", "integer", "number", "boolean", "object", "array"];

type Result<T> = std::result::Result<T, FieldError>;

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

// ---------------------------------------------------------------------------
// Web of Agents
// ---------------------------------------------------------------------------

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
                PROTOCOL_WOA_REST,
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
                (PROTOCOL_MCP, server.clone(), 1)
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

// ---------------------------------------------------------------------------
// A2A
// ---------------------------------------------------------------------------

/// Maps an A2A Agent Card (v0.3 members) into a record, so A2A agents are
/// found by the same discovery as native ones and invoked through the
/// gateway's A2A client.
///
/// Skills give the searchable signals (tags, example tasks) and one
/// operation each; every interface becomes a binding, the card's preferred
/// one first; the first `security` requirement becomes `authentication`.
/// The card's other members (protocolVersion, capabilities,
/// documentationUrl, iconUrl, ...) stay in `source.document`.
pub fn a2a_card(card: &Value, card_url: &Url) -> Result<AgentMetadata> {
    let c = Obj::of(card, "", "a JSON object (an A2A Agent Card)")?;
    let name = c.text("name")?;
    let description = c.text("description")?;
    let url = http_url(&c, "url", true)?;
    let version = c.opt_text("version")?;
    let publisher = match c.object("provider", "an object ({organization, url})")? {
        Some(p) => p.opt_text("organization")?,
        None => None,
    };
    let mut dropped = Dropped::default();
    let (tags, examples, operations) = a2a_skills(&c, &mut dropped)?;
    let bindings = a2a_bindings(&c, url.as_str(), &mut dropped)?;
    let authentication = a2a_auth(&c)?;
    let mut meta = AgentMetadata {
        id: card_url.to_string(),
        name: name.into(),
        description: description.into(),
        version: version.map(String::from),
        publisher: publisher.map(String::from),
        tags,
        examples,
        operations,
        bindings,
        authentication: Some(authentication),
        ..Default::default()
    };
    meta.extra.insert(
        "source".into(),
        source("a2a", card_url, card.clone(), dropped),
    );
    Ok(meta)
}

/// Tags, example tasks and operations from the card's skills.
fn a2a_skills(
    c: &Obj,
    dropped: &mut Dropped,
) -> Result<(Vec<String>, Vec<TaskExample>, Vec<Operation>)> {
    let mut tags = Vec::new();
    let mut examples = Vec::new();
    let mut operations = Vec::new();
    let mut ids = HashSet::new();
    for (i, skill) in c.array("skills")?.iter().enumerate() {
        let s = Obj::of(skill, ptr("/skills", i), "a skill object")?;
        let id = s.text("id")?;
        if !ids.insert(id) {
            return Err(FieldError::new(
                s.at("id"),
                format!("duplicates the skill id '{id}'"),
            ));
        }
        let skill_name = s.opt_text("name")?;
        let skill_description = s.opt_text("description")?;
        for (p, t) in s.strings("tags")? {
            add_tag(&mut tags, t, p, "tag", dropped);
        }
        add_tag(&mut tags, id, s.at("id"), "tag", dropped);
        let skill_tag = id.trim().to_lowercase();
        let example_tags = match tag_problem(&skill_tag) {
            None => vec![skill_tag],
            Some(_) => Vec::new(),
        };
        for (j, (p, text)) in s.strings("examples")?.into_iter().enumerate() {
            let problem = if examples.len() >= MAX_EXAMPLES {
                Some(format!(
                    "the registry keeps at most {MAX_EXAMPLES} examples"
                ))
            } else {
                text_problem(text, MAX_EXAMPLE_TEXT_LEN)
            };
            if let Some(problem) = problem {
                dropped.note(p, format!("not kept as an example: {problem}"));
                continue;
            }
            examples.push(TaskExample {
                id: Some(format!("{id}/{j}")),
                text: text.into(),
                tags: example_tags.clone(),
                ..Default::default()
            });
        }
        operations.push(Operation {
            name: id.into(),
            description: skill_description.or(skill_name).map(String::from),
            ..Default::default()
        });
    }
    Ok((tags, examples, operations))
}

/// One binding per interface: the card's `url` (priority 0) and each
/// distinct additional interface (1, 2, ...).
fn a2a_bindings(c: &Obj, url: &str, dropped: &mut Dropped) -> Result<Vec<Binding>> {
    let streaming = match c.object("capabilities", "an object")? {
        None => false,
        Some(caps) => match caps.get("streaming") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(FieldError::new(caps.at("streaming"), "must be a boolean")),
        },
    };
    let mut media_types: Vec<String> = Vec::new();
    for key in ["defaultInputModes", "defaultOutputModes"] {
        for (p, mode) in c.strings(key)? {
            let mode = mode.trim();
            if !mode.contains('/') || mode.chars().any(char::is_control) || mode.len() > 255 {
                dropped.note(
                    p,
                    "not kept as a media type: it is not of the form type/subtype",
                );
            } else if !media_types.iter().any(|m| m == mode) {
                media_types.push(mode.to_string());
            }
        }
    }
    let interaction = if streaming {
        "streaming"
    } else {
        "request-response"
    };
    let binding = |endpoint: &str, transport: String, priority: i64| Binding {
        protocol: PROTOCOL_A2A.into(),
        endpoint: endpoint.into(),
        media_types: media_types.clone(),
        interaction_model: Some(interaction.into()),
        priority: Some(priority),
        extra: Map::from_iter([("transport".to_string(), Value::String(transport))]),
    };
    let preferred = c
        .opt_text("preferredTransport")?
        .map_or_else(|| "JSONRPC".to_string(), a2a_transport);
    let mut bindings = vec![binding(url, preferred, 0)];
    for (i, interface) in c.array("additionalInterfaces")?.iter().enumerate() {
        let o = Obj::of(
            interface,
            ptr("/additionalInterfaces", i),
            "an interface object ({url, transport})",
        )?;
        let raw = o.text("url")?;
        let transport = a2a_transport(o.text("transport")?);
        let storable = Url::parse(raw)
            .map_err(|e| format!("is not an absolute URL ({e})"))
            .and_then(|u| {
                validate_url(u.as_str(), "", &Limits::default())
                    .map(|()| String::from(u))
                    .map_err(|e| e.message)
            });
        let endpoint = match storable {
            Ok(endpoint) => endpoint,
            Err(why) => {
                dropped.note(o.at("url"), format!("interface not kept: its URL {why}"));
                continue;
            }
        };
        // A2A asks cards to repeat the main interface here.
        let known = bindings.iter().any(|b| {
            b.endpoint == endpoint
                && b.extra.get("transport").and_then(Value::as_str) == Some(transport.as_str())
        });
        if !known {
            let priority = i64::try_from(bindings.len()).unwrap_or(i64::MAX);
            bindings.push(binding(&endpoint, transport, priority));
        }
    }
    Ok(bindings)
}

/// A2A transport names are upper-case constants (JSONRPC, GRPC, HTTP+JSON).
fn a2a_transport(t: &str) -> String {
    t.trim().to_ascii_uppercase()
}

/// The record's authentication from the card's first security requirement
/// (A2A lists alternatives in order of preference; within one requirement
/// every scheme applies). All requirements are checked against the declared
/// schemes so a broken card is refused rather than half-understood.
fn a2a_auth(c: &Obj) -> Result<AuthRequirement> {
    let schemes = c.object(
        "securitySchemes",
        "an object mapping scheme names to security scheme objects",
    )?;
    let mut chosen: Option<AuthRequirement> = None;
    for (i, requirement) in c.array("security")?.iter().enumerate() {
        let r = Obj::of(
            requirement,
            ptr("/security", i),
            "a security requirement object (scheme name → scopes)",
        )?;
        let mut auth = AuthRequirement::default();
        let mut names = Vec::new();
        for name in r.map.keys() {
            let Some(declared) = schemes.as_ref().and_then(|s| s.get(name)) else {
                return Err(FieldError::new(
                    r.at(name),
                    format!("names the security scheme '{name}', which securitySchemes does not declare"),
                ));
            };
            let scheme = Obj::of(
                declared,
                ptr("/securitySchemes", name),
                "a security scheme object",
            )?;
            let kind = a2a_scheme(&scheme, &mut auth)?;
            auth.kind.get_or_insert(kind);
            for (_, scope) in r.strings(name)? {
                if !auth.scopes.iter().any(|s| s == scope) {
                    auth.scopes.push(scope.into());
                }
            }
            names.push(json!(name));
        }
        if chosen.is_none() {
            if !names.is_empty() {
                auth.extra.insert("schemes".into(), Value::Array(names));
            }
            chosen = Some(auth);
        }
    }
    // No requirement, or an empty one ({}: anonymous access allowed).
    Ok(chosen
        .filter(|a| a.kind.is_some())
        .unwrap_or_else(|| AuthRequirement {
            kind: Some("none".into()),
            ..Default::default()
        }))
}

/// The record's auth type for one A2A (OpenAPI-style) security scheme. Only
/// the first scheme of a requirement writes its details into `auth`.
fn a2a_scheme(scheme: &Obj, auth: &mut AuthRequirement) -> Result<String> {
    let first = auth.kind.is_none();
    Ok(match scheme.text("type")? {
        "oauth2" | "openIdConnect" => "oauth2_bearer".into(),
        "http" => match scheme.text("scheme")?.to_ascii_lowercase().as_str() {
            "bearer" => "oauth2_bearer".into(),
            other => format!("http_{other}"),
        },
        "apiKey" => {
            let place = scheme.text("in")?;
            let name = scheme.text("name")?;
            if first {
                auth.extra.insert("in".into(), json!(place));
                auth.extra.insert("name".into(), json!(name));
                if place == "header" {
                    auth.extra.insert("header".into(), json!(name));
                }
            }
            "api_key".into()
        }
        "mutualTLS" => "mtls".into(),
        other => other.to_ascii_lowercase(),
    })
}

// ---------------------------------------------------------------------------
// Agent Protocol
// ---------------------------------------------------------------------------

/// Maps an Agent Protocol `AgentDescriptor` (the answer of `GET
/// {base}/describe`) into a record, so AP agents are found and invoked
/// through the gateway like the others.
///
/// AP's schemas are "casual": a formal JSON Schema object is used as-is, a
/// flat field → simple type map (or `["input: string"]` list) becomes an
/// object schema, and anything else is kept in the operation's extra as
/// `ap_input_schema` / `ap_output_schema` rather than guessed at. An agent
/// that lists no operation gets AP's default `chat` operation, which every
/// AP agent supports.
pub fn ap_descriptor(desc: &Value, describe_url: &Url) -> Result<AgentMetadata> {
    let base = ap_base_url(describe_url)?;
    let d = Obj::of(desc, "", "a JSON object (an AgentDescriptor)")?;
    let name = d.text("name")?;
    let description = d.text("purpose")?;
    let mut dropped = Dropped::default();
    let mut tags = vec![PROTOCOL_AGENT_PROTOCOL.to_string()];
    for (i, tool) in d.array("tools")?.iter().enumerate() {
        let p = ptr("/tools", i);
        match tool.as_str() {
            Some(t) => add_tag(&mut tags, t, p, "tag", &mut dropped),
            None => dropped.note(p, "not kept as a tag: it is not a string"),
        }
    }
    let mut operations = Vec::new();
    let mut names = HashSet::new();
    for (i, op) in d.array("operations")?.iter().enumerate() {
        let o = Obj::of(op, ptr("/operations", i), "an AgentOperation object")?;
        let op_name = o.text("name")?;
        if !names.insert(op_name) {
            return Err(FieldError::new(
                o.at("name"),
                format!("duplicates the operation name '{op_name}'"),
            ));
        }
        let mut operation = Operation {
            name: op_name.into(),
            description: o.opt_text("description")?.map(String::from),
            ..Default::default()
        };
        operation.inputs =
            ap_schema_member(&o, "input_schema", "ap_input_schema", &mut operation.extra);
        operation.outputs = ap_schema_member(
            &o,
            "output_schema",
            "ap_output_schema",
            &mut operation.extra,
        );
        operations.push(operation);
    }
    if operations.is_empty() {
        operations.push(Operation {
            name: "chat".into(),
            description: Some("send a chat request".into()),
            inputs: Some(json!({
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
            })),
            outputs: Some(json!({
                "type": "object",
                "properties": {"output": {"type": "string"}},
            })),
            ..Default::default()
        });
    }
    let mut meta = AgentMetadata {
        id: base.clone(),
        name: name.into(),
        description: description.into(),
        tags,
        operations,
        bindings: vec![Binding {
            protocol: PROTOCOL_AGENT_PROTOCOL.into(),
            endpoint: base,
            priority: Some(0),
            ..Default::default()
        }],
        ..Default::default()
    };
    meta.extra.insert(
        "source".into(),
        source("agent-protocol", describe_url, desc.clone(), dropped),
    );
    Ok(meta)
}

/// The agent's base URL: every AP route (`/describe`, `/run`, ...) is
/// relative to it, so it is both the record id and the binding endpoint.
/// It never ends in '/', so routes are appended as `{base}/run`.
fn ap_base_url(describe_url: &Url) -> Result<String> {
    let refuse =
        |why: &str| FieldError::new("", format!("the describe URL '{describe_url}' {why}"));
    if !matches!(describe_url.scheme(), "http" | "https") {
        return Err(refuse("must be an http(s) URL"));
    }
    if describe_url.query().is_some() || describe_url.fragment().is_some() {
        return Err(refuse("must not have a query or fragment"));
    }
    let s = describe_url.as_str();
    s.strip_suffix("/describe/")
        .or_else(|| s.strip_suffix("/describe"))
        .map(String::from)
        .ok_or_else(|| {
            refuse("must end in /describe (Agent Protocol routes are relative to the agent's base URL)")
        })
}

/// An AP operation's schema member as a JSON Schema; what cannot be read as
/// one is kept under `keep_as` in the operation's extra.
fn ap_schema_member(
    o: &Obj,
    key: &str,
    keep_as: &str,
    extra: &mut Map<String, Value>,
) -> Option<Value> {
    let original = o.get(key)?;
    let schema = ap_schema(original);
    if schema.is_none() {
        extra.insert(keep_as.into(), original.clone());
    }
    schema
}

/// Reads an AP schema: a JSON Schema object, or a casual flat field → type
/// name form (an object, or a list of "field: type" strings).
fn ap_schema(value: &Value) -> Option<Value> {
    match value {
        Value::Object(m)
            if m.is_empty() || m.keys().any(|k| SCHEMA_KEYWORDS.contains(&k.as_str())) =>
        {
            compile_schema(value, "").ok().map(|_| value.clone())
        }
        Value::Object(m) => casual_schema(m.iter().map(|(k, t)| Some((k.as_str(), t.as_str()?)))),
        Value::Array(items) => casual_schema(items.iter().map(|i| i.as_str()?.split_once(':'))),
        _ => None,
    }
}

/// An object schema with every field required, when each entry is a field
/// name with a simple type name.
fn casual_schema<'a>(fields: impl Iterator<Item = Option<(&'a str, &'a str)>>) -> Option<Value> {
    let mut properties = Map::new();
    for field in fields {
        let (name, kind) = field?;
        let (name, kind) = (name.trim(), kind.trim().to_ascii_lowercase());
        if name.is_empty() || !SIMPLE_TYPES.contains(&kind.as_str()) {
            return None;
        }
        properties.insert(name.into(), json!({"type": kind}));
    }
    if properties.is_empty() {
        return None;
    }
    let required: Vec<String> = properties.keys().cloned().collect();
    Some(json!({"type": "object", "properties": properties, "required": required}))
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/// Appends one reference token to a JSON pointer (RFC 6901 escaping).
fn ptr(base: &str, token: impl std::fmt::Display) -> String {
    let token = token.to_string();
    format!("{base}/{}", token.replace('~', "~0").replace('/', "~1"))
}

/// A JSON object of a source document with its pointer, so every accessor
/// names the member it refuses.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    at: String,
}

impl<'a> Obj<'a> {
    fn of(value: &'a Value, at: impl Into<String>, what: &str) -> Result<Self> {
        let at = at.into();
        match value.as_object() {
            Some(map) => Ok(Self { map, at }),
            None => Err(FieldError::new(at, format!("must be {what}"))),
        }
    }

    fn at(&self, key: &str) -> String {
        ptr(&self.at, key)
    }

    /// A member; null counts as absent (serialisers often write unset
    /// optional members as null).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A required string that is not blank.
    fn text(&self, key: &str) -> Result<&'a str> {
        match self.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
            Some(Value::String(_)) => Err(FieldError::new(self.at(key), "must not be blank")),
            Some(_) => Err(FieldError::new(self.at(key), "must be a string")),
            None => Err(FieldError::new(
                self.at(key),
                "is required (a non-empty string)",
            )),
        }
    }

    /// An optional string; a blank one counts as absent.
    fn opt_text(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.trim().is_empty())),
            Some(_) => Err(FieldError::new(self.at(key), "must be a string")),
        }
    }

    /// An optional array; empty when absent.
    fn array(&self, key: &str) -> Result<&'a [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(FieldError::new(self.at(key), "must be an array")),
        }
    }

    /// An optional array of strings, each with its pointer.
    fn strings(&self, key: &str) -> Result<Vec<(String, &'a str)>> {
        let at = self.at(key);
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some(s) => Ok((ptr(&at, i), s)),
                None => Err(FieldError::new(ptr(&at, i), "must be a string")),
            })
            .collect()
    }

    /// An optional nested object.
    fn object(&self, key: &str, what: &str) -> Result<Option<Obj<'a>>> {
        self.get(key)
            .map(|v| Obj::of(v, self.at(key), what))
            .transpose()
    }
}

/// A required absolute http(s) URL with a host; plain http only when
/// allowed.
fn http_url(o: &Obj, key: &str, allow_http: bool) -> Result<Url> {
    let refuse = |why: String| FieldError::new(o.at(key), why);
    let text = o.text(key)?;
    let url = Url::parse(text).map_err(|e| refuse(format!("is not an absolute URL ({e})")))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => return Err(refuse("must use https (plain http is not allowed)".into())),
        other => return Err(refuse(format!("must be an http(s) URL, not {other}:"))),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("must name a host".into()));
    }
    Ok(url)
}

/// Members dropped because the registry cannot hold them, as `{pointer,
/// reason}` (pointers into the source document).
#[derive(Default)]
struct Dropped(Vec<Value>);

impl Dropped {
    fn note(&mut self, pointer: String, reason: impl Into<String>) {
        self.0
            .push(json!({"pointer": pointer, "reason": reason.into()}));
    }
}

/// Why the registry would refuse a (trimmed, lower-cased) tag.
fn tag_problem(tag: &str) -> Option<String> {
    if tag.is_empty() {
        Some("it is blank".into())
    } else if tag.chars().count() > MAX_TAG_LEN {
        Some(format!("it is longer than {MAX_TAG_LEN} characters"))
    } else if tag.chars().any(char::is_control) {
        Some("it contains control characters".into())
    } else {
        None
    }
}

/// Why the registry would refuse a required text of at most `max`
/// characters.
fn text_problem(text: &str, max: usize) -> Option<String> {
    if text.trim().is_empty() {
        Some("it is blank".into())
    } else if text.chars().count() > max {
        Some(format!("it is longer than {max} characters"))
    } else if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        Some("it contains control characters".into())
    } else {
        None
    }
}

/// Adds a tag-like value (a tag, a WoA capability) as the registry will
/// store it: trimmed, lower-cased, once; what it would refuse is noted.
fn add_tag(list: &mut Vec<String>, raw: &str, pointer: String, what: &str, dropped: &mut Dropped) {
    let tag = raw.trim().to_lowercase();
    let problem = match tag_problem(&tag) {
        _ if list.contains(&tag) => return,
        None if list.len() >= MAX_TAGS => format!("the registry keeps at most {MAX_TAGS}"),
        None => {
            list.push(tag);
            return;
        }
        Some(problem) => problem,
    };
    dropped.note(pointer, format!("not kept as a {what}: {problem}"));
}

/// The record's `source` member: where it came from and what it said.
fn source(format: &str, url: &Url, document: Value, dropped: Dropped) -> Value {
    let mut source = json!({"format": format, "url": url.as_str(), "document": document});
    if !dropped.0.is_empty() {
        source["dropped"] = Value::Array(dropped.0);
    }
    source
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("test URL parses")
    }

    /// The record as the registry stores it, which proves it can.
    fn stored(mut meta: AgentMetadata) -> AgentMetadata {
        normalise_and_validate(&mut meta, &Limits::default())
            .unwrap_or_else(|e| panic!("the registry refuses the record: {e}"));
        meta
    }

    fn dropped_pointers(meta: &AgentMetadata) -> Vec<String> {
        meta.extra["source"]["dropped"]
            .as_array()
            .map(|d| {
                d.iter()
                    .map(|n| n["pointer"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    // ----- Web of Agents ---------------------------------------------------

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

    // ----- A2A -------------------------------------------------------------

    const CARD_URL: &str = "https://georoute-agent.example.com/.well-known/agent-card.json";

    fn route_planner_card() -> Value {
        json!({
            "protocolVersion": "0.3.0",
            "name": "GeoSpatial Route Planner Agent",
            "description": "Plans driving routes with live traffic and renders custom maps.",
            "url": "https://georoute-agent.example.com/a2a/v1",
            "preferredTransport": "JSONRPC",
            "additionalInterfaces": [
                {"url": "https://georoute-agent.example.com/a2a/v1", "transport": "JSONRPC"},
                {"url": "https://georoute-agent.example.com/a2a/grpc", "transport": "GRPC"},
                {"url": "https://georoute-agent.example.com/a2a/json", "transport": "HTTP+JSON"}
            ],
            "provider": {"organization": "Example Geo Services Inc.", "url": "https://www.examplegeoservices.com"},
            "iconUrl": "https://georoute-agent.example.com/icon.png",
            "version": "1.2.0",
            "documentationUrl": "https://docs.examplegeoservices.com/georoute-agent/api",
            "capabilities": {"streaming": true, "pushNotifications": true, "stateTransitionHistory": false},
            "securitySchemes": {
                "google": {"type": "openIdConnect",
                           "openIdConnectUrl": "https://accounts.google.com/.well-known/openid-configuration"}
            },
            "security": [{"google": ["openid", "profile", "email"]}],
            "defaultInputModes": ["application/json", "text/plain"],
            "defaultOutputModes": ["application/json", "image/png"],
            "skills": [
                {
                    "id": "route-optimizer-traffic",
                    "name": "Traffic-Aware Route Optimizer",
                    "description": "Calculates the fastest driving route between two or more places, using live traffic.",
                    "tags": ["maps", "routing", "navigation", "directions", "traffic"],
                    "examples": [
                        "Plan a route from Mountain View to San Francisco International Airport avoiding tolls.",
                        "{\"origin\": {\"lat\": 37.422, \"lng\": -122.084}, \"destination\": {\"lat\": 37.7749, \"lng\": -122.4194}}"
                    ],
                    "inputModes": ["application/json", "text/plain"],
                    "outputModes": ["application/json", "application/vnd.geo+json", "text/html"]
                },
                {
                    "id": "custom-map-generator",
                    "name": "Personalized Map Generator",
                    "tags": ["maps", "customization", "visualization", "cartography"],
                    "examples": [
                        "Generate a map of my road trip with every planned stop highlighted.",
                        "Show all coffee shops within a mile of Union Square on a map."
                    ],
                    "inputModes": ["application/json"],
                    "outputModes": ["image/png", "image/jpeg"]
                }
            ],
            "supportsAuthenticatedExtendedCard": true
        })
    }

    fn card(v: &Value) -> AgentMetadata {
        a2a_card(v, &url(CARD_URL)).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a2a_card_maps_per_the_adp_table() {
        let m = card(&route_planner_card());
        assert_eq!(m.id, CARD_URL);
        assert_eq!(m.name, "GeoSpatial Route Planner Agent");
        assert_eq!(
            m.description,
            "Plans driving routes with live traffic and renders custom maps."
        );
        assert_eq!(m.version.as_deref(), Some("1.2.0"));
        assert_eq!(m.publisher.as_deref(), Some("Example Geo Services Inc."));
        assert_eq!(
            m.tags,
            vec![
                "maps",
                "routing",
                "navigation",
                "directions",
                "traffic",
                "route-optimizer-traffic",
                "customization",
                "visualization",
                "cartography",
                "custom-map-generator"
            ]
        );

        let examples: Vec<(&str, &str, &[String])> = m
            .examples
            .iter()
            .map(|e| {
                (
                    e.id.as_deref().unwrap_or(""),
                    e.text.as_str(),
                    e.tags.as_slice(),
                )
            })
            .collect();
        assert_eq!(examples.len(), 4);
        assert_eq!(examples[0].0, "route-optimizer-traffic/0");
        assert!(examples[0].1.starts_with("Plan a route"));
        assert_eq!(examples[0].2, ["route-optimizer-traffic"]);
        assert_eq!(examples[3].0, "custom-map-generator/1");
        assert_eq!(examples[3].2, ["custom-map-generator"]);

        let ops: Vec<(&str, Option<&str>)> = m
            .operations
            .iter()
            .map(|o| (o.name.as_str(), o.description.as_deref()))
            .collect();
        assert_eq!(
            ops,
            vec![
                ("route-optimizer-traffic",
                 Some("Calculates the fastest driving route between two or more places, using live traffic.")),
                // No description: the skill's name.
                ("custom-map-generator", Some("Personalized Map Generator")),
            ]
        );
        assert!(m
            .operations
            .iter()
            .all(|o| o.inputs.is_none() && o.outputs.is_none()));

        // The main interface, then the additional ones; the repeated main
        // interface is not bound twice.
        let bound: Vec<(&str, &str, Option<i64>)> = m
            .bindings
            .iter()
            .map(|b| {
                (
                    b.endpoint.as_str(),
                    b.extra["transport"].as_str().unwrap_or(""),
                    b.priority,
                )
            })
            .collect();
        assert_eq!(
            bound,
            vec![
                (
                    "https://georoute-agent.example.com/a2a/v1",
                    "JSONRPC",
                    Some(0)
                ),
                (
                    "https://georoute-agent.example.com/a2a/grpc",
                    "GRPC",
                    Some(1)
                ),
                (
                    "https://georoute-agent.example.com/a2a/json",
                    "HTTP+JSON",
                    Some(2)
                ),
            ]
        );
        for b in &m.bindings {
            assert_eq!(b.protocol, "a2a");
            assert_eq!(b.interaction_model.as_deref(), Some("streaming"));
            assert_eq!(
                b.media_types,
                vec!["application/json", "text/plain", "image/png"]
            );
        }

        let auth = m.authentication.as_ref().unwrap();
        assert_eq!(auth.kind.as_deref(), Some("oauth2_bearer"));
        assert_eq!(auth.scopes, vec!["openid", "profile", "email"]);
        assert_eq!(auth.extra["schemes"], json!(["google"]));

        assert_eq!(
            m.extra["source"],
            json!({"format": "a2a", "url": CARD_URL, "document": route_planner_card()})
        );
        for member in [
            "protocolVersion",
            "capabilities",
            "documentationUrl",
            "iconUrl",
        ] {
            assert!(
                !m.extra.contains_key(member),
                "{member} stays in the source"
            );
        }
        let m = stored(m);
        assert_eq!(m.auth, m.authentication);
    }

    #[test]
    fn a2a_minimal_card_gets_one_jsonrpc_binding_and_no_auth() {
        let m = stored(card(&json!({
            "name": "Echo",
            "description": "Repeats what it is sent.",
            "url": "http://localhost:9999/",
            "preferredTransport": null,
            "skills": []
        })));
        assert_eq!(m.bindings.len(), 1);
        let b = &m.bindings[0];
        assert_eq!(
            (b.protocol.as_str(), b.endpoint.as_str()),
            ("a2a", "http://localhost:9999/")
        );
        assert_eq!(b.extra["transport"], "JSONRPC");
        assert_eq!(b.priority, Some(0));
        assert_eq!(b.interaction_model.as_deref(), Some("request-response"));
        assert!(b.media_types.is_empty());
        assert_eq!(
            m.authentication.and_then(|a| a.kind).as_deref(),
            Some("none")
        );
        assert!(m.tags.is_empty() && m.examples.is_empty() && m.operations.is_empty());
        assert!(m.extra["source"].get("dropped").is_none());
    }

    #[test]
    fn a2a_security_schemes_map_to_auth_types() {
        let cases = [
            (
                json!({"bearer": {"type": "http", "scheme": "Bearer", "bearerFormat": "JWT"}}),
                json!([{"bearer": []}]),
                "oauth2_bearer",
                json!({"schemes": ["bearer"]}),
            ),
            (
                json!({"basic": {"type": "http", "scheme": "basic"}}),
                json!([{"basic": []}]),
                "http_basic",
                json!({"schemes": ["basic"]}),
            ),
            (
                json!({"key": {"type": "apiKey", "in": "header", "name": "X-API-Key"}}),
                json!([{"key": []}]),
                "api_key",
                json!({"in": "header", "name": "X-API-Key", "header": "X-API-Key", "schemes": ["key"]}),
            ),
            (
                json!({"key": {"type": "apiKey", "in": "query", "name": "api_key"}}),
                json!([{"key": []}]),
                "api_key",
                json!({"in": "query", "name": "api_key", "schemes": ["key"]}),
            ),
            (
                json!({"mtls": {"type": "mutualTLS"}}),
                json!([{"mtls": []}]),
                "mtls",
                json!({"schemes": ["mtls"]}),
            ),
            (
                json!({"oauth": {"type": "oauth2", "flows": {"clientCredentials": {
                 "tokenUrl": "https://auth.example.com/token", "scopes": {"routes:read": "Read routes"}}}}}),
                json!([{"oauth": ["routes:read"]}]),
                "oauth2_bearer",
                json!({"schemes": ["oauth"]}),
            ),
            // Declared but not required: anonymous access.
            (
                json!({"bearer": {"type": "http", "scheme": "bearer"}}),
                json!(null),
                "none",
                json!({}),
            ),
            // An empty requirement first: anonymous access is preferred.
            (
                json!({"bearer": {"type": "http", "scheme": "bearer"}}),
                json!([{}, {"bearer": []}]),
                "none",
                json!({}),
            ),
            // Alternatives: the first one; both schemes of it apply.
            (
                json!({"key": {"type": "apiKey", "in": "header", "name": "X-Key"},
                    "oauth": {"type": "oauth2", "flows": {}}}),
                json!([{"oauth": ["a"], "key": []}, {"key": []}]),
                "oauth2_bearer",
                json!({"schemes": ["oauth", "key"]}),
            ),
        ];
        for (schemes, security, kind, extra) in cases {
            let mut c = route_planner_card();
            c["securitySchemes"] = schemes;
            c["security"] = security.clone();
            let m = stored(card(&c));
            let auth = m.authentication.unwrap();
            assert_eq!(auth.kind.as_deref(), Some(kind), "{security}");
            assert_eq!(Value::Object(auth.extra), extra, "{security}");
        }
        let mut c = route_planner_card();
        c["securitySchemes"] = json!({"oauth": {"type": "oauth2", "flows": {}}});
        c["security"] = json!([{"oauth": ["routes:read", "maps:write"]}]);
        assert_eq!(
            card(&c).authentication.unwrap().scopes,
            vec!["routes:read", "maps:write"]
        );
    }

    #[test]
    fn a2a_members_the_registry_cannot_hold_are_dropped_and_noted() {
        let mut c = route_planner_card();
        c["skills"][0]["tags"] = json!(["Maps", "t".repeat(65), "ROUTING"]);
        c["skills"][1]["examples"] =
            json!(["", "e".repeat(MAX_EXAMPLE_TEXT_LEN + 1), "Map my commute."]);
        c["defaultInputModes"] = json!(["text", "text/plain"]);
        c["additionalInterfaces"][1]["url"] = json!("grpc.example.com:443/a2a");
        c["additionalInterfaces"][2]["url"] = json!("ftp://georoute-agent.example.com/a2a");
        let m = stored(card(&c));
        assert_eq!(&m.tags[..2], ["maps", "routing"]);
        assert_eq!(m.examples.len(), 3);
        assert_eq!(m.examples[2].text, "Map my commute.");
        assert_eq!(m.examples[2].id.as_deref(), Some("custom-map-generator/2"));
        assert_eq!(m.bindings.len(), 1);
        assert_eq!(
            m.bindings[0].media_types,
            vec!["text/plain", "application/json", "image/png"]
        );
        assert_eq!(
            dropped_pointers(&m),
            vec![
                "/skills/0/tags/1",
                "/skills/1/examples/0",
                "/skills/1/examples/1",
                "/defaultInputModes/0",
                "/additionalInterfaces/1/url",
                "/additionalInterfaces/2/url",
            ]
        );
    }

    #[test]
    fn a2a_skill_id_that_is_no_valid_tag_is_not_an_example_tag() {
        let mut c = route_planner_card();
        let id = format!("skill-{}", "x".repeat(70));
        c["skills"][1]["id"] = json!(id);
        let m = stored(card(&c));
        assert!(m.examples[2].tags.is_empty());
        assert_eq!(m.operations[1].name, id);
        assert_eq!(dropped_pointers(&m), vec!["/skills/1/id"]);
    }

    #[test]
    fn a2a_errors_name_the_member() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |c| {
                    c.as_object_mut().unwrap().remove("name");
                },
                "/name",
            ),
            (|c| c["description"] = json!("  "), "/description"),
            (
                |c| {
                    c.as_object_mut().unwrap().remove("url");
                },
                "/url",
            ),
            (|c| c["url"] = json!("/a2a/v1"), "/url"),
            (
                |c| c["url"] = json!("grpc://georoute-agent.example.com"),
                "/url",
            ),
            (|c| c["version"] = json!(1.2), "/version"),
            (|c| c["provider"] = json!("Example Geo"), "/provider"),
            (
                |c| c["provider"]["organization"] = json!(["Example"]),
                "/provider/organization",
            ),
            (
                |c| c["preferredTransport"] = json!(1),
                "/preferredTransport",
            ),
            (
                |c| c["capabilities"]["streaming"] = json!("yes"),
                "/capabilities/streaming",
            ),
            (
                |c| c["defaultOutputModes"] = json!("image/png"),
                "/defaultOutputModes",
            ),
            (
                |c| c["additionalInterfaces"][1] = json!("https://x.example"),
                "/additionalInterfaces/1",
            ),
            (
                |c| {
                    c["additionalInterfaces"][1]
                        .as_object_mut()
                        .unwrap()
                        .remove("transport");
                },
                "/additionalInterfaces/1/transport",
            ),
            (|c| c["skills"] = json!({}), "/skills"),
            (
                |c| {
                    c["skills"][0].as_object_mut().unwrap().remove("id");
                },
                "/skills/0/id",
            ),
            (
                |c| c["skills"][1]["id"] = json!("route-optimizer-traffic"),
                "/skills/1/id",
            ),
            (|c| c["skills"][0]["tags"] = json!("maps"), "/skills/0/tags"),
            (
                |c| c["skills"][1]["examples"] = json!([{"text": "x"}]),
                "/skills/1/examples/0",
            ),
            (
                |c| c["skills"][0]["description"] = json!(false),
                "/skills/0/description",
            ),
            (|c| c["security"] = json!({"google": []}), "/security"),
            (
                |c| c["security"] = json!([{"github": []}]),
                "/security/0/github",
            ),
            (
                |c| c["security"] = json!([{"google": []}, {"a/b": []}]),
                "/security/1/a~1b",
            ),
            (
                |c| c["security"] = json!([{"google": "openid"}]),
                "/security/0/google",
            ),
            (|c| c["securitySchemes"] = json!([]), "/securitySchemes"),
            (
                |c| c["securitySchemes"]["google"] = json!("oidc"),
                "/securitySchemes/google",
            ),
            (
                |c| {
                    c["securitySchemes"]["google"]
                        .as_object_mut()
                        .unwrap()
                        .remove("type");
                },
                "/securitySchemes/google/type",
            ),
            (
                |c| c["securitySchemes"]["google"] = json!({"type": "apiKey", "in": "header"}),
                "/securitySchemes/google/name",
            ),
            (
                |c| c["securitySchemes"]["google"] = json!({"type": "http"}),
                "/securitySchemes/google/scheme",
            ),
        ];
        for (edit, pointer) in cases {
            let mut c = route_planner_card();
            edit(&mut c);
            let err =
                a2a_card(&c, &url(CARD_URL)).expect_err(&format!("should be refused at {pointer}"));
            assert_eq!(err.pointer, pointer, "{err}");
        }
        assert_eq!(
            a2a_card(&json!("card"), &url(CARD_URL))
                .unwrap_err()
                .pointer,
            ""
        );
    }

    // ----- Agent Protocol --------------------------------------------------

    const DESCRIBE_URL: &str = "https://agents.example.org/gpt-researcher/describe";

    fn researcher() -> Value {
        json!({
            "name": "GPT Researcher",
            "purpose": "Researches a topic on the web for several minutes and writes a cited report.",
            "endpoints": ["/describe", "/run", "/get_events", "/stream_request"],
            "operations": [
                {
                    "name": "research",
                    "description": "Research a topic and write a report.",
                    "input_schema": {"type": "object",
                                     "properties": {"topic": {"type": "string"}, "depth": {"type": "integer"}},
                                     "required": ["topic"]},
                    "output_schema": {"report": "string", "sources": "Array"}
                },
                {
                    "name": "chat",
                    "description": "send a chat request",
                    "input_schema": ["input: string"],
                    "output_schema": ["output: string"]
                },
                {
                    "name": "summarize_url",
                    "description": "Summarize one web page.",
                    "input_schema": "url: the page to summarize",
                    "output_schema": {"summary": "str"}
                },
                {"name": "cancel"}
            ],
            "tools": ["web_search", "BrowserTool", "pdf_writer"]
        })
    }

    fn descriptor(v: &Value, at: &str) -> AgentMetadata {
        ap_descriptor(v, &url(at)).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn ap_descriptor_maps_operations_tools_and_base_url() {
        let m = descriptor(&researcher(), DESCRIBE_URL);
        let base = "https://agents.example.org/gpt-researcher";
        assert_eq!(m.id, base);
        assert_eq!(m.name, "GPT Researcher");
        assert!(m.description.starts_with("Researches a topic"));
        assert_eq!(
            m.tags,
            vec!["agent-protocol", "web_search", "browsertool", "pdf_writer"]
        );
        assert_eq!(
            m.bindings,
            vec![Binding {
                protocol: "agent-protocol".into(),
                endpoint: base.into(),
                priority: Some(0),
                ..Default::default()
            }]
        );

        let ops = &m.operations;
        assert_eq!(ops.len(), 4);
        // A formal schema as-is; a casual map converted.
        assert_eq!(
            ops[0].inputs.as_ref(),
            Some(&researcher()["operations"][0]["input_schema"])
        );
        assert_eq!(
            ops[0].outputs,
            Some(json!({"type": "object",
                        "properties": {"report": {"type": "string"}, "sources": {"type": "array"}},
                        "required": ["report", "sources"]}))
        );
        // The casual list form of AP's default chat operation.
        assert_eq!(
            ops[1].inputs,
            Some(
                json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})
            )
        );
        assert_eq!(ops[1].description.as_deref(), Some("send a chat request"));
        // Unreadable schemas are kept, not guessed at.
        assert_eq!(
            (ops[2].inputs.as_ref(), ops[2].outputs.as_ref()),
            (None, None)
        );
        assert_eq!(
            ops[2].extra["ap_input_schema"],
            "url: the page to summarize"
        );
        assert_eq!(ops[2].extra["ap_output_schema"], json!({"summary": "str"}));
        assert_eq!(ops[3].name, "cancel");
        assert!(ops[3].inputs.is_none() && ops[3].description.is_none() && ops[3].extra.is_empty());

        assert_eq!(
            m.extra["source"],
            json!({"format": "agent-protocol", "url": DESCRIBE_URL, "document": researcher()})
        );
        stored(m);
    }

    #[test]
    fn ap_descriptor_without_operations_gets_the_default_chat() {
        let d =
            json!({"name": "Browser Use", "purpose": "Automates a web browser.", "operations": []});
        for (at, base) in [
            (
                "https://browser.example.com/describe",
                "https://browser.example.com",
            ),
            (
                "https://browser.example.com/agents/browser/describe/",
                "https://browser.example.com/agents/browser",
            ),
            ("http://127.0.0.1:8000/describe", "http://127.0.0.1:8000"),
        ] {
            let m = stored(descriptor(&d, at));
            assert_eq!(
                (m.id.as_str(), m.bindings[0].endpoint.as_str()),
                (base, base)
            );
            assert_eq!(m.tags, vec!["agent-protocol"]);
            assert_eq!(m.operations.len(), 1);
            let chat = &m.operations[0];
            assert_eq!(chat.name, "chat");
            assert_eq!(chat.inputs.as_ref().unwrap()["required"], json!(["input"]));
            assert_eq!(
                chat.outputs.as_ref().unwrap()["properties"]["output"]["type"],
                "string"
            );
        }
        let m = descriptor(
            &json!({"name": "Echo", "purpose": "Echoes."}),
            "https://e.example/describe",
        );
        assert_eq!(m.operations[0].name, "chat");
    }

    #[test]
    fn ap_tools_the_registry_cannot_hold_are_dropped_and_noted() {
        let mut d = researcher();
        d["tools"] = json!(["web_search", {"name": "calculator"}, "t".repeat(65), "Web_Search"]);
        let m = stored(descriptor(&d, DESCRIBE_URL));
        assert_eq!(m.tags, vec!["agent-protocol", "web_search"]);
        assert_eq!(dropped_pointers(&m), vec!["/tools/1", "/tools/2"]);
    }

    #[test]
    fn ap_casual_schemas() {
        let cases = [
            (json!({}), Some(json!({}))),
            (json!({"type": "object"}), Some(json!({"type": "object"}))),
            (json!({"type": "nonsense"}), None),
            (
                json!({"input": "String", "count": " integer "}),
                Some(
                    json!({"type": "object", "properties": {"input": {"type": "string"}, "count": {"type": "integer"}},
                         "required": ["input", "count"]}),
                ),
            ),
            (
                json!(["a: number", "b:boolean"]),
                Some(
                    json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "boolean"}},
                         "required": ["a", "b"]}),
                ),
            ),
            (json!(["input"]), None),
            (json!([": string"]), None),
            (json!(["input: str"]), None),
            (json!([]), None),
            (json!({"input": {"kind": "text"}}), None),
            (json!({"input": "string", "meta": 3}), None),
            (json!(true), None),
            (json!("string"), None),
        ];
        for (casual, expected) in cases {
            assert_eq!(ap_schema(&casual), expected, "{casual}");
        }
    }

    #[test]
    fn ap_errors_name_the_member() {
        type Edit = fn(&mut Value);
        let cases: Vec<(Edit, &str)> = vec![
            (
                |d| {
                    d.as_object_mut().unwrap().remove("name");
                },
                "/name",
            ),
            (|d| d["name"] = json!(5), "/name"),
            (
                |d| {
                    d.as_object_mut().unwrap().remove("purpose");
                },
                "/purpose",
            ),
            (|d| d["purpose"] = json!(""), "/purpose"),
            (|d| d["operations"] = json!({"chat": {}}), "/operations"),
            (|d| d["operations"][1] = json!("chat"), "/operations/1"),
            (
                |d| d["operations"][1]["name"] = json!("research"),
                "/operations/1/name",
            ),
            (
                |d| {
                    d["operations"][0].as_object_mut().unwrap().remove("name");
                },
                "/operations/0/name",
            ),
            (
                |d| d["operations"][0]["description"] = json!(["x"]),
                "/operations/0/description",
            ),
            (|d| d["tools"] = json!("web_search"), "/tools"),
        ];
        for (edit, pointer) in cases {
            let mut d = researcher();
            edit(&mut d);
            let err = ap_descriptor(&d, &url(DESCRIBE_URL))
                .expect_err(&format!("should be refused at {pointer}"));
            assert_eq!(err.pointer, pointer, "{err}");
        }
        for at in [
            "https://agents.example.org/gpt-researcher",
            "https://agents.example.org/gpt-researcher/describe?key=1",
            "https://agents.example.org/undescribe",
            "ftp://agents.example.org/describe",
        ] {
            let err = ap_descriptor(&researcher(), &url(at)).unwrap_err();
            assert_eq!(err.pointer, "", "{at}");
            assert!(err.message.contains("describe URL"), "{err}");
        }
    }
}
