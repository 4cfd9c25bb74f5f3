//! `/mcp`: the registry as an MCP server, over Streamable HTTP (rmcp's
//! server half), so an MCP client — a coding assistant, an agent framework
//! — can find agents, read their signed records, call them through the
//! gateway and see what the MCP servers in the directory offer.
//!
//! Four tools, each a translation to the use case the facade's own routes
//! call, so an answer here is the answer there:
//! - `discover_agents` → `Discovery.Discover` (the `POST /discover`
//!   handler; `structuredContent` is the same ADP Discovery Response);
//! - `get_agent` → `Registry.Get` (the record as `GET /agents/{id}` gives
//!   it, with the registry's signature);
//! - `invoke_agent` → `Gateway.Invoke` (schema checks, bindings, outbound
//!   guard: `POST /agents/{id}/invoke`);
//! - `list_agent_tools` → `tools/list` on an MCP server record's endpoint
//!   through the gateway's guarded client (`gateway::mcp_tools`).
//!
//! Who may do what is decided exactly as for every other request: `/mcp`
//! is a facade route, so `gate_http` authenticates each HTTP request
//! (bearer API key or JWT, else anonymous), charges it as a read and puts
//! the `Identity` in its extensions; rmcp hands the request's `Parts` to
//! the tool, which charges the tool's own class (discover, invoke) to the
//! same gate before running, and calls the handler with that identity, so
//! entitlements (private records, anonymous reads and invocations) are the
//! service layer's as always.
//!
//! Where reads need credentials, an anonymous request is refused with 401
//! before any MCP: its challenge names the OAuth metadata of `/mcp`
//! (`http::oauth`), from which MCP clients sign in by themselves.
//!
//! Between the gate and the MCP layer, a request's `Host` and `Origin` must
//! name this registry or a page allowed to call it (`mcp_origin`: MCP
//! requires servers to validate `Origin`, against DNS rebinding); others
//! are refused with 403 before their body is read.
//!
//! The server is stateless (no `Mcp-Session-Id`): every POST carries one
//! JSON-RPC message and is answered on its own, so any node of a cluster
//! can answer any request behind a plain load balancer, and nothing is
//! kept per client between requests. Failures are mapped once, in
//! `tool_error`: a tool that fails answers a result with `isError` and the
//! problem body of SPECS.md as `structuredContent` (MCP's "tool execution
//! error", which the model can read and correct); only a request for a
//! tool that does not exist is a JSON-RPC error.

use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerInfo, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tonic::Status;
use tracing::Instrument;

use super::auth::Identity;
use super::error::{detail_of, problem_body};
use super::gate::OpClass;
use super::http::HttpState;
use crate::convert::discovery::{discover_request_from_json, discover_response_to_json};
use crate::convert::record_pb_to_json;
use crate::domain::discovery::MAX_LIMIT;
use crate::domain::filter::{self, Surface};
use crate::domain::validate::{check_instance, compile_schema};
use crate::domain::Principal;
use crate::listener::Peer;
use crate::pb::{
    self, discovery_server::Discovery, gateway_server::Gateway, registry_server::Registry,
};
use crate::service::{Consistency, ServiceError};

/// The route, also the `instance` of the problem bodies tools answer with.
pub const MCP_PATH: &str = "/mcp";

/// Protocol revisions this server answers in: the client's own when it is
/// one of these, else the newest rmcp models (structured tool output needs
/// 2025-06-18 or later).
const PROTOCOL_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The four tools, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolName {
    DiscoverAgents,
    GetAgent,
    InvokeAgent,
    ListAgentTools,
}

impl ToolName {
    const ALL: [ToolName; 4] = [
        ToolName::DiscoverAgents,
        ToolName::GetAgent,
        ToolName::InvokeAgent,
        ToolName::ListAgentTools,
    ];

    fn as_str(self) -> &'static str {
        match self {
            ToolName::DiscoverAgents => "discover_agents",
            ToolName::GetAgent => "get_agent",
            ToolName::InvokeAgent => "invoke_agent",
            ToolName::ListAgentTools => "list_agent_tools",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The gate class charged for a call, beyond the read every `/mcp`
    /// request is charged by its route (so `get_agent` adds nothing).
    fn class(self) -> Option<OpClass> {
        match self {
            ToolName::DiscoverAgents => Some(OpClass::Discover),
            ToolName::GetAgent => None,
            // Listing a server's tools calls it through the gateway.
            ToolName::InvokeAgent | ToolName::ListAgentTools => Some(OpClass::Invoke),
        }
    }
}

/// An array of non-blank strings.
fn strings(description: &str) -> Value {
    json!({"type": "array", "items": {"type": "string", "minLength": 1}, "description": description})
}

/// A string, or an array of them (the ADP constraints that take either).
fn string_or_strings(description: &str) -> Value {
    json!({
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}}
        ],
        "description": description
    })
}

/// The schema of one ADP constraint this registry applies, by name. The
/// names come from the filter engine's one list, so the tool accepts
/// exactly what `POST /discover` does.
fn constraint_schema(name: &str) -> Value {
    match name {
        "verified_only" => json!({"type": "boolean",
            "description": "Only agents whose publisher signature this registry verified."}),
        "allow_stale" => json!({"type": "boolean",
            "description": "Also return agents past their expires_at (marked in freshness)."}),
        "max_results_age_seconds" => json!({"type": "integer", "minimum": 0,
            "description": "Only agents whose metadata was updated at most this many seconds ago."}),
        "status" => json!({
            "anyOf": [
                {"type": "string", "enum": ["active", "deprecated", "inactive", "deleted"]},
                {"type": "array", "items": {"type": "string", "enum": ["active", "deprecated", "inactive", "deleted"]}}
            ],
            "description": "Only agents in these statuses (default: active and deprecated)."
        }),
        "region" => string_or_strings("Only agents that declare one of these regions."),
        "language" => string_or_strings(
            "Only agents that support one of these languages (BCP 47, e.g. 'en').",
        ),
        "capabilities" => string_or_strings("Only agents that declare all of these capabilities."),
        other => string_or_strings(&format!("The ADP constraint '{other}'.")),
    }
}

fn discover_input_schema() -> Value {
    let names: Vec<&str> = filter::names(Surface::AdpConstraint).collect();
    let constraints: Map<String, Value> = names
        .iter()
        .map(|n| (n.to_string(), constraint_schema(n)))
        .collect();
    json!({
        "type": "object",
        "properties": {
            "task": {
                "type": "string", "minLength": 1, "maxLength": crate::domain::discovery::MAX_QUERY_CHARS,
                "description": "The task you need an agent for, in plain language, e.g. 'translate a German contract into English'. Agents are ranked by what they say they do and by their example tasks, not by keywords alone."
            },
            "required_tags": strings("Only agents carrying every one of these tags."),
            "preferred_tags": strings("Agents carrying these tags rank higher; others still qualify."),
            "excluded_tags": strings("No agent carrying any of these tags."),
            "protocols": strings("Only agents reachable over one of these binding protocols, e.g. 'https', 'woa-rest', 'mcp', 'agent-protocol', 'a2a'."),
            "constraints": {
                "type": "object",
                "properties": constraints,
                "description": format!("ADP hard filters: {}; a name this registry does not apply is not an error, it is listed in the answer's unsupported_filters.", names.join(", "))
            },
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10,
                "description": "How many agents to return, best first."},
            "include_evidence": {"type": "boolean", "default": true,
                "description": "Explain each ranking: score components, matched tags and the example tasks that matched."},
            "detail": {"type": "string", "enum": ["minimal", "summary", "full"], "default": "summary",
                "description": "How much of each agent's record to include."},
            "scope": {"type": "string", "enum": ["local", "federated"], "default": "local",
                "description": "'federated' also asks this registry's peer registries."}
        },
        "required": ["task"],
        "additionalProperties": false
    })
}

fn id_schema(description: &str) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": 1024, "description": description})
}

fn agent_authorization_schema() -> Value {
    json!({"type": "string", "minLength": 1,
        "description": "Your own credential for the agent, if it needs one (sent to the agent, never to this registry)."})
}

/// One tool as listed, with the validator of its arguments.
struct ToolDef {
    name: ToolName,
    tool: Tool,
    validator: jsonschema::Validator,
}

fn object(v: Value) -> Arc<Map<String, Value>> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

fn annotations(title: &str, read_only: bool, open_world: bool) -> ToolAnnotations {
    ToolAnnotations {
        title: Some(title.to_string()),
        read_only_hint: Some(read_only),
        destructive_hint: (!read_only).then_some(false),
        idempotent_hint: Some(read_only),
        open_world_hint: Some(open_world),
    }
}

fn definitions() -> Result<Vec<ToolDef>, String> {
    let specs = [
        (
            ToolName::DiscoverAgents,
            "Find agents for a task: describe the task in plain language (and optionally filter by tags, protocols or ADP constraints) to get agents ranked best first, each with its score, the evidence for it, its bindings and freshness. Call get_agent for a candidate's full signed record and invoke_agent to call it.",
            discover_input_schema(),
            json!({"type": "object", "required": ["candidates"],
                "properties": {"candidates": {"type": "array", "items": {"type": "object"}},
                               "unsupported_filters": {"type": "array"}, "warnings": {"type": "array"}}}),
            annotations("Discover agents", true, false),
        ),
        (
            ToolName::GetAgent,
            "Get one agent's full record as the registry stores it: metadata (operations with their input/output JSON Schemas, bindings, auth), owner, visibility, revision and the registry's ed25519 signature over the canonical record.",
            json!({
                "type": "object",
                "properties": {
                    "id": id_schema("The agent's id, as discover_agents returns it."),
                    "consistency": {"type": "string", "enum": ["local", "linearizable"], "default": "local",
                        "description": "'linearizable' waits until this node has every committed change (slower)."}
                },
                "required": ["id"],
                "additionalProperties": false
            }),
            json!({"type": "object", "required": ["id"]}),
            annotations("Get an agent's signed record", true, false),
        ),
        (
            ToolName::InvokeAgent,
            "Call an agent through the registry's gateway. The input is checked against the agent's input schema before the agent is contacted, and its output against the output schema (reported in output_check). For an agent with several operations, name one. An MCP server in the directory is called the same way: the operation is the tool's name (see list_agent_tools).",
            json!({
                "type": "object",
                "properties": {
                    "agent_id": id_schema("The agent to call."),
                    "input": {"type": "object", "description": "The input, as the operation's input schema in the agent's record describes it."},
                    "operation": {"type": "string", "minLength": 1, "maxLength": 256,
                        "description": "The operation to call; needed when the agent declares more than one. For an MCP server, the name of the tool to call (as list_agent_tools lists it)."},
                    "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 256,
                        "description": "Repeat a call with the same key to get the first answer again instead of a second call."},
                    "agent_authorization": agent_authorization_schema()
                },
                "required": ["agent_id", "input"],
                "additionalProperties": false
            }),
            json!({"type": "object", "required": ["agent_id", "status", "output_check"],
                "properties": {"status": {"type": "integer"}, "output_check": {"type": "object"}}}),
            annotations("Invoke an agent", false, true),
        ),
        (
            ToolName::ListAgentTools,
            "List the tools an MCP server in the directory offers (its tools/list, fetched live through the gateway): each tool's name, description and input schema. Call one with invoke_agent, the tool's name as the operation.",
            json!({
                "type": "object",
                "properties": {
                    "agent_id": id_schema("The MCP server's record id (a record with an 'mcp' binding)."),
                    "agent_authorization": agent_authorization_schema()
                },
                "required": ["agent_id"],
                "additionalProperties": false
            }),
            json!({"type": "object", "required": ["agent_id", "endpoint", "tools"],
                "properties": {"tools": {"type": "array", "items": {"type": "object", "required": ["name", "inputSchema"]}}}}),
            annotations("List an MCP server's tools", true, true),
        ),
    ];
    specs
        .into_iter()
        .map(|(name, description, input, output, annotations)| {
            let validator = compile_schema(&input, name.as_str()).map_err(|e| e.to_string())?;
            let tool = Tool {
                name: name.as_str().into(),
                title: annotations.title.clone(),
                description: Some(description.into()),
                input_schema: object(input),
                output_schema: Some(object(output)),
                annotations: Some(annotations),
                execution: None,
                icons: None,
                meta: None,
            };
            Ok(ToolDef {
                name,
                tool,
                validator,
            })
        })
        .collect()
}

/// The tool list, built once (the schemas are constants; a unit test
/// checks that they compile).
fn catalog() -> Result<&'static [ToolDef], Status> {
    static CATALOG: OnceLock<Result<Vec<ToolDef>, String>> = OnceLock::new();
    CATALOG
        .get_or_init(definitions)
        .as_deref()
        .map_err(|e| ServiceError::Internal(format!("the MCP tool schemas: {e}")).into())
}

/// The one mapping of a failed tool call: MCP's tool execution error with
/// the problem body every other surface answers with.
fn tool_error(status: &Status) -> CallToolResult {
    let detail = detail_of(status);
    CallToolResult::structured_error(problem_body(&detail, MCP_PATH))
}

/// A request to a gRPC handler, carrying the caller as the gate found it.
fn grpc_request<T>(identity: &Identity, msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.extensions_mut().insert(identity.clone());
    req
}

/// A member the schema check already found to be a string, if present.
fn text(args: &Map<String, Value>, key: &str) -> Option<String> {
    args.get(key).and_then(Value::as_str).map(String::from)
}

/// `discover_agents`: the arguments become an ADP Discovery Request
/// (`task` is its `query`; evidence unless declined) and go through the
/// same conversion and handler as `POST /discover`.
async fn discover_agents(
    state: &HttpState,
    identity: &Identity,
    mut args: Map<String, Value>,
) -> Result<Value, Status> {
    let task = args.remove("task").unwrap_or(Value::Null);
    args.insert("query".into(), task);
    args.entry("include_evidence").or_insert(Value::Bool(true));
    let req = discover_request_from_json(Value::Object(args)).map_err(ServiceError::from)?;
    let resp = Discovery::discover(&state.api, grpc_request(identity, req))
        .await?
        .into_inner();
    Ok(discover_response_to_json(resp).map_err(ServiceError::from)?)
}

/// `get_agent`: `Registry.Get`, the record in its JSON form.
async fn get_agent(
    state: &HttpState,
    identity: &Identity,
    args: Map<String, Value>,
) -> Result<Value, Status> {
    let consistency = match args.get("consistency").and_then(Value::as_str) {
        Some("linearizable") => pb::ReadConsistency::Linearizable,
        _ => pb::ReadConsistency::Local,
    };
    let req = pb::GetRequest {
        id: text(&args, "id").unwrap_or_default(),
        consistency: consistency as i32,
    };
    let resp = Registry::get(&state.api, grpc_request(identity, req))
        .await?
        .into_inner();
    let record = resp
        .record
        .ok_or_else(|| ServiceError::Internal("the handler returned no record".into()))?;
    Ok(record_pb_to_json(&record).map_err(|e| ServiceError::Internal(e.to_string()))?)
}

/// The JSON of an agent's answer, or its text when it is not JSON.
fn answer_json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| json!(String::from_utf8_lossy(body)))
}

/// `invoke_agent`: `Gateway.Invoke` with a WoA envelope naming the agent,
/// so the input is always one call's input (never read as a batch or as an
/// envelope of its own) and schema errors point into `/input`. An answer
/// the agent refused (4xx passed through) is a tool error with the
/// agent's own body.
async fn invoke_agent(
    state: &HttpState,
    identity: &Identity,
    args: Map<String, Value>,
) -> Result<(Value, bool), Status> {
    let agent_id = text(&args, "agent_id").unwrap_or_default();
    let operation = text(&args, "operation");
    let mut envelope = json!({"agent": agent_id, "input": args.get("input").cloned().unwrap_or_else(|| json!({}))});
    if let Some(op) = &operation {
        envelope["operation"] = json!(op);
    }
    let req = pb::InvokeRequest {
        agent_id: agent_id.clone(),
        body: envelope.to_string().into_bytes(),
        operation: operation.unwrap_or_default(),
        idempotency_key: text(&args, "idempotency_key").unwrap_or_default(),
        agent_authorization: text(&args, "agent_authorization").unwrap_or_default(),
        ..Default::default()
    };
    let resp = Gateway::invoke(&state.invocation, grpc_request(identity, req))
        .await?
        .into_inner();
    let r = resp
        .result
        .ok_or_else(|| ServiceError::Internal("the gateway answered no result".into()))?;
    let check = match &r.output_check {
        Some(c) if c.state == "invalid" => {
            json!({"state": c.state, "pointer": c.pointer, "message": c.message})
        }
        Some(c) => json!({"state": c.state}),
        None => json!({"state": "unchecked"}),
    };
    let refused = r.status >= 400;
    let mut out = json!({
        "agent_id": agent_id,
        "status": r.status,
        "output_check": check,
        "protocol": r.protocol,
        "replayed": resp.replayed,
    });
    out[if refused { "error" } else { "output" }] = answer_json(&r.body);
    if let Some(s) = resp.retry_after {
        out["retry_after"] = json!(s);
    }
    if !r.agent_challenge.is_empty() {
        out["agent_challenge"] = json!(r.agent_challenge);
    }
    Ok((out, refused))
}

/// `list_agent_tools`: the record (as the caller may see it), its MCP
/// binding over Streamable HTTP, and that server's `tools/list` through
/// the gateway's guarded client.
async fn list_agent_tools(
    state: &HttpState,
    principal: Option<&Principal>,
    args: Map<String, Value>,
) -> Result<Value, Status> {
    if principal.is_none() {
        return Err(ServiceError::Unauthorized(
            "listing a server's tools calls it through the gateway; send an API key (Authorization: Bearer <key>)".into(),
        )
        .into());
    }
    let id = text(&args, "agent_id").unwrap_or_default();
    let service = state.invocation.service();
    let (record, _) = service
        .registry()
        .get(principal, &id, Consistency::Local)
        .await?;
    let mcp: Vec<_> = record
        .metadata
        .bindings
        .iter()
        .filter(|b| b.protocol.eq_ignore_ascii_case("mcp"))
        .collect();
    let binding = mcp
        .iter()
        .find(|b| {
            b.interaction_model
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case("streamable-http"))
        })
        .ok_or_else(|| {
            if mcp.is_empty() {
                ServiceError::InvalidRequest {
                    field: Some("/agent_id".into()),
                    message: format!("agent '{id}' is not an MCP server (it has no 'mcp' binding)"),
                }
            } else {
                ServiceError::Unsupported(format!(
                    "agent '{id}' is reachable over MCP's SSE transport only; the gateway speaks Streamable HTTP"
                ))
            }
        })?;
    let bearer = text(&args, "agent_authorization");
    let tools = service.list_mcp_tools(&record, binding, bearer).await?;
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut v = json!({"name": t.name, "inputSchema": *t.input_schema});
            for (k, x) in [
                ("title", t.title.as_ref().map(|s| json!(s))),
                ("description", t.description.as_ref().map(|s| json!(s))),
                ("outputSchema", t.output_schema.as_ref().map(|s| json!(**s))),
            ] {
                if let Some(x) = x {
                    v[k] = x;
                }
            }
            v
        })
        .collect();
    Ok(json!({
        "agent_id": record.metadata.id,
        "endpoint": binding.endpoint,
        "tools": tools,
    }))
}

/// One MCP session's handler (a fresh one per request: the server is
/// stateless).
#[derive(Clone)]
struct AgentryMcp {
    state: HttpState,
}

impl AgentryMcp {
    /// Runs one tool call: the caller from the HTTP request, the tool's
    /// gate class, the schema check, the use case.
    async fn call(
        &self,
        tool: &ToolDef,
        args: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, Status> {
        let parts = context
            .extensions
            .get::<axum::http::request::Parts>()
            .ok_or_else(|| {
                ServiceError::Internal("the MCP request carries no HTTP request".into())
            })?;
        let identity =
            parts.extensions.get::<Identity>().cloned().ok_or_else(|| {
                ServiceError::Internal("the request did not pass the gate".into())
            })?;
        if let Some(class) = tool.name.class() {
            let peer = parts.extensions.get::<Peer>();
            self.state.gate.charge(identity.0.as_ref(), peer, class)?;
        }
        let args_value = Value::Object(args);
        check_instance(&tool.validator, &args_value, "").map_err(ServiceError::from)?;
        let Value::Object(args) = args_value else {
            return Err(ServiceError::Internal("arguments stopped being an object".into()).into());
        };
        let state = &self.state;
        Ok(match tool.name {
            ToolName::DiscoverAgents => {
                CallToolResult::structured(discover_agents(state, &identity, args).await?)
            }
            ToolName::GetAgent => {
                CallToolResult::structured(get_agent(state, &identity, args).await?)
            }
            ToolName::InvokeAgent => match invoke_agent(state, &identity, args).await? {
                (out, false) => CallToolResult::structured(out),
                (out, true) => CallToolResult::structured_error(out),
            },
            ToolName::ListAgentTools => CallToolResult::structured(
                list_agent_tools(state, identity.0.as_ref(), args).await?,
            ),
        })
    }
}

impl ServerHandler for AgentryMcp {
    fn get_info(&self) -> ServerInfo {
        ServerInfo {
            protocol_version: ProtocolVersion::V_2025_06_18,
            capabilities: ServerCapabilities::builder().enable_tools().build(),
            server_info: Implementation {
                name: "agentry".into(),
                title: Some("Agentry agent registry".into()),
                version: env!("CARGO_PKG_VERSION").into(),
                description: Some(
                    "A federated registry of AI agents: discover, inspect and invoke them.".into(),
                ),
                icons: None,
                website_url: None,
            },
            instructions: Some(
                "Use discover_agents with a plain-language task to find agents, get_agent for one agent's signed record, invoke_agent to call an agent through the registry's gateway, and list_agent_tools to see the tools of an MCP server in the directory (then call one with invoke_agent, the tool's name as the operation).".into(),
            ),
        }
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let asked = request.protocol_version.to_string();
        let mut info = self.get_info();
        if PROTOCOL_VERSIONS.contains(&asked.as_str()) {
            info.protocol_version = request.protocol_version.clone();
        }
        if context.peer.peer_info().is_none() {
            context.peer.set_peer_info(request);
        }
        Ok(info)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let catalog =
            catalog().map_err(|s| McpError::internal_error(s.message().to_string(), None))?;
        Ok(ListToolsResult::with_all_items(
            catalog.iter().map(|d| d.tool.clone()).collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let catalog = catalog().ok()?;
        catalog
            .iter()
            .find(|d| d.tool.name == name)
            .map(|d| d.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let catalog =
            catalog().map_err(|s| McpError::internal_error(s.message().to_string(), None))?;
        let Some(tool) =
            ToolName::parse(&request.name).and_then(|n| catalog.iter().find(|d| d.name == n))
        else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool '{}' (this server has discover_agents, get_agent, invoke_agent and list_agent_tools)",
                    request.name
                ),
                None,
            ));
        };
        let span = tracing::info_span!(
            "mcp.tool",
            tool = tool.name.as_str(),
            is_error = tracing::field::Empty
        );
        let args = request.arguments.unwrap_or_default();
        async {
            let result = self
                .call(tool, args, &context)
                .await
                .unwrap_or_else(|status| tool_error(&status));
            tracing::Span::current().record("is_error", result.is_error.unwrap_or(false));
            Ok(result)
        }
        .instrument(span)
        .await
    }
}

/// A refusal before the MCP layer is reached, in the facade's problem body.
fn refusal(status: Status) -> Response {
    let d = detail_of(&status);
    let code = StatusCode::from_u16(u16::try_from(d.http_status).unwrap_or(500))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/problem+json")],
        problem_body(&d, MCP_PATH).to_string(),
    )
        .into_response()
}

/// The JSON-RPC error (HTTP 400) for a body that rmcp would misanswer: not
/// JSON (-32700) or not a JSON-RPC 2.0 message (-32600), which rmcp answers
/// with a plain-text 415; a request whose id is not a string or an integer
/// (-32600: MCP requires one of those), which rmcp takes for a notification
/// and leaves unanswered; `params` that are not an object (-32602, with the
/// request's id), which rmcp answers with a plain-text 415 or ignores; a
/// method that is not a string (-32600), or a `tools/call` without a tool's
/// name (-32602), which rmcp answers with a plain-text 415; and a
/// `tools/call` whose `arguments` is not an object (-32602), which rmcp
/// reports as an unknown method.
fn not_json_rpc(body: &[u8]) -> Option<Response> {
    let mut id = Value::Null;
    let (code, message) = match crate::domain::json::parse_json(body) {
        Err(e) => (-32700, format!("Parse error: {e}")),
        Ok(Value::Object(m)) if m.get("jsonrpc").and_then(Value::as_str) == Some("2.0") => {
            let method = m.get("method").and_then(Value::as_str);
            let params = m.get("params").filter(|p| !p.is_null());
            let arguments = params.and_then(|p| p.get("arguments"));
            let unanswerable = m
                .get("id")
                .is_some_and(|id| !id.is_string() && !id.is_i64() && !id.is_u64());
            if m.get("method").is_some_and(|v| !v.is_string()) {
                (
                    -32600,
                    "Invalid Request: method must be a string".to_string(),
                )
            } else if method.is_some() && unanswerable {
                (
                    -32600,
                    "Invalid Request: a request's id must be a string or an integer (leave it out for a notification)".to_string(),
                )
            } else if method.is_some() && params.is_some_and(|p| !p.is_object()) {
                id = m.get("id").cloned().unwrap_or(Value::Null);
                (
                    -32602,
                    "Invalid params: params must be an object".to_string(),
                )
            } else if method == Some("tools/call")
                && params.and_then(|p| p.get("name")).is_none_or(|n| !n.is_string())
            {
                id = m.get("id").cloned().unwrap_or(Value::Null);
                (
                    -32602,
                    "Invalid params: params.name must name a tool".to_string(),
                )
            } else if method == Some("tools/call")
                && arguments.is_some_and(|a| !a.is_object() && !a.is_null())
            {
                id = m.get("id").cloned().unwrap_or(Value::Null);
                (
                    -32602,
                    "Invalid params: params.arguments must be an object of the tool's arguments"
                        .to_string(),
                )
            } else {
                return None;
            }
        }
        Ok(_) => (
            -32600,
            "Invalid Request: the body must be one JSON-RPC 2.0 message (an object with \"jsonrpc\": \"2.0\")".to_string(),
        ),
    };
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    Some(super::http::json_response(StatusCode::BAD_REQUEST, &body))
}

/// `POST /mcp`. The gate has admitted the request (so a refusal here is
/// counted, audited and rate limited like any other); its `Host` and
/// `Origin` are checked against the names the registry answers to
/// (`mcp_origin`) before anything reads the body; the body is read within
/// the facade's size limit (rmcp itself reads bodies unbounded) and the
/// JSON-RPC message answered by a stateless Streamable HTTP service.
pub async fn serve(State(state): State<HttpState>, req: Request) -> Response {
    if let Err(e) = state.mcp_origins.check(req.headers(), req.uri()) {
        tracing::info!(reason = %e, "an /mcp request was refused (DNS-rebinding protection)");
        return refusal(e.into());
    }
    // Where reads need credentials, nothing on /mcp is open to an anonymous
    // caller: answer 401 at once, whose challenge sends an MCP client to
    // sign in (`http::oauth`), rather than an anonymous session whose every
    // tool fails.
    let principal = req
        .extensions()
        .get::<Identity>()
        .and_then(|i| i.0.as_ref());
    if let Err(e) = state.api.service().require_reader(principal) {
        return refusal(e.into());
    }
    let (mut parts, body) = req.into_parts();
    let bytes = match super::http::decoded_body(&parts.headers, body, state.max_body).await {
        Ok(b) => b,
        Err(refused) => return refusal(refused),
    };
    // What goes on to rmcp is the body as decoded.
    if parts.headers.remove(header::CONTENT_ENCODING).is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    if parts.method == axum::http::Method::POST {
        if let Some(refused) = not_json_rpc(&bytes) {
            return refused;
        }
    }
    let declared_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.trim_start().starts_with("application/json"));
    let req = Request::from_parts(parts, axum::body::Body::from(bytes.clone()));
    let service = StreamableHttpService::new(
        move || {
            Ok(AgentryMcp {
                state: state.clone(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        StreamableHttpServerConfig {
            stateful_mode: false,
            sse_keep_alive: None,
            sse_retry: None,
            ..Default::default()
        },
    );
    let answer = service.handle(req).await.map(axum::body::Body::new);
    json_rpc_refusal(answer, &bytes, declared_json).await
}

/// rmcp's own refusals are plain text; a JSON-RPC client reads them as
/// JSON-RPC errors instead. A 406 (an `Accept` without both media types)
/// or a 415 for another content type keeps its status, with code -32000
/// and no id, as the MCP TypeScript SDK sends them. A 415 for a JSON body
/// is rmcp failing to read a member it types more strictly than the checks
/// above (`_meta` that is no object, say): 400 -32600, the request's id
/// echoed. Every other answer as it is.
async fn json_rpc_refusal(answer: Response, request: &[u8], declared_json: bool) -> Response {
    let plain = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|t| !t.contains("json") && !t.contains("event-stream"));
    if !(answer.status().is_client_error() || answer.status().is_server_error()) || !plain {
        return answer;
    }
    let status = answer.status();
    let text = axum::body::to_bytes(answer.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("refused").to_string());
    let (status, code, id, message) =
        if status == StatusCode::UNSUPPORTED_MEDIA_TYPE && declared_json {
            let id = serde_json::from_slice::<Value>(request)
                .ok()
                .and_then(|v| v.get("id").cloned())
                .unwrap_or(Value::Null);
            (
                StatusCode::BAD_REQUEST,
                -32600,
                id,
                format!("Invalid Request: {text}"),
            )
        } else {
            (status, -32000, Value::Null, text)
        };
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    super::http::json_response(status, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_are_not_json_rpc_get_a_json_rpc_error() {
        // The refusal's body, after checking it is one (a 400).
        let refused = |body: &[u8]| -> Value {
            let refused = not_json_rpc(body).expect("refused");
            assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
            let bytes =
                futures::executor::block_on(axum::body::to_bytes(refused.into_body(), 4096))
                    .unwrap();
            serde_json::from_slice(&bytes).unwrap()
        };
        for (body, code) in [
            (&b"{bad"[..], -32700),
            (b"[1]", -32600),
            (br#"{"method": "tools/list", "id": 1}"#, -32600),
            (
                br#"{"jsonrpc": "2.0", "method": "tools/list", "id": null}"#,
                -32600,
            ),
            (
                br#"{"jsonrpc": "2.0", "method": "tools/list", "id": {"a": 1}}"#,
                -32600,
            ),
            (
                br#"{"jsonrpc": "2.0", "method": "tools/list", "id": [1]}"#,
                -32600,
            ),
            (
                br#"{"jsonrpc": "2.0", "method": "tools/list", "id": true}"#,
                -32600,
            ),
        ] {
            let v = refused(body);
            assert_eq!(v["error"]["code"], code, "{v}");
            assert_eq!(v["id"], Value::Null);
        }
        for id in ["1.5", "1.0", "1e3"] {
            let body = format!(r#"{{"jsonrpc": "2.0", "method": "tools/list", "id": {id}}}"#);
            let v = refused(body.as_bytes());
            assert_eq!(v["error"]["code"], -32600, "{v}");
        }
        for (body, code) in [
            (r#"{"jsonrpc": "2.0", "method": 7, "id": 3}"#, -32600),
            (r#"{"jsonrpc": "2.0", "method": null, "id": 3}"#, -32600),
            (
                r#"{"jsonrpc": "2.0", "method": "tools/call", "id": 3, "params": {"name": 5}}"#,
                -32602,
            ),
            (
                r#"{"jsonrpc": "2.0", "method": "tools/call", "id": 3, "params": {}}"#,
                -32602,
            ),
        ] {
            let v = refused(body.as_bytes());
            assert_eq!(v["error"]["code"], code, "{v}");
        }
        for params in [r#""NaN""#, "5", "[1]", "true"] {
            let body = format!(
                r#"{{"jsonrpc": "2.0", "method": "tools/list", "id": 3, "params": {params}}}"#
            );
            let v = refused(body.as_bytes());
            assert_eq!(
                (&v["error"]["code"], &v["id"]),
                (&json!(-32602), &json!(3)),
                "{v}"
            );
        }
        assert!(
            not_json_rpc(br#"{"jsonrpc": "2.0", "method": "ping", "id": 1, "params": null}"#)
                .is_none()
        );
        assert!(not_json_rpc(br#"{"jsonrpc": "2.0", "method": "ping", "id": 1}"#).is_none());
        assert!(not_json_rpc(br#"{"jsonrpc": "2.0", "method": "ping", "id": "a"}"#).is_none());
        assert!(
            not_json_rpc(br#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#).is_none()
        );
        let call = |arguments: &str| {
            format!(
                r#"{{"jsonrpc": "2.0", "method": "tools/call", "id": 7, "params": {{"name": "get_agent", "arguments": {arguments}}}}}"#
            )
        };
        for ok in [r#"{"id": "x"}"#, "null"] {
            assert!(not_json_rpc(call(ok).as_bytes()).is_none(), "{ok}");
        }
        let v = refused(call(r#""id=x""#).as_bytes());
        assert_eq!(v["error"]["code"], -32602, "{v}");
        assert_eq!(v["id"], 7, "the request's id is echoed");
    }

    #[test]
    fn the_tool_schemas_compile_and_name_every_tool() {
        let defs = definitions().unwrap();
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "discover_agents",
                "get_agent",
                "invoke_agent",
                "list_agent_tools"
            ]
        );
        for d in &defs {
            assert_eq!(d.tool.input_schema["type"], "object");
            assert_eq!(d.tool.input_schema["additionalProperties"], false);
            assert!(d.tool.description.as_ref().is_some_and(|s| s.len() > 40));
        }
    }

    #[test]
    fn discover_constraints_are_the_filter_engines() {
        let schema = discover_input_schema();
        let listed: Vec<&str> = schema["properties"]["constraints"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let engine: Vec<&str> = filter::names(Surface::AdpConstraint).collect();
        assert_eq!(listed, engine);
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let defs = definitions().unwrap();
        let discover = &defs[0].validator;
        assert!(check_instance(discover, &json!({"task": "translate"}), "").is_ok());
        let e = check_instance(discover, &json!({"task": 3}), "").unwrap_err();
        assert!(e.to_string().contains("/task"), "{e}");
        assert!(check_instance(discover, &json!({}), "").is_err());
        assert!(check_instance(discover, &json!({"task": "x", "limit": 0}), "").is_err());
        assert!(check_instance(discover, &json!({"task": "x", "bogus": 1}), "").is_err());
        let invoke = &defs[2].validator;
        assert!(check_instance(invoke, &json!({"agent_id": "a", "input": {}}), "").is_ok());
        assert!(check_instance(invoke, &json!({"agent_id": "a", "input": [1]}), "").is_err());
        // A small failing value is quoted, a large one only named.
        let e = check_instance(discover, &json!({"task": 3}), "").unwrap_err();
        assert!(e.message.contains("3 is not of type"), "{e}");
        let long = "a".repeat(100_000);
        let e = check_instance(&defs[1].validator, &json!({ "id": long }), "").unwrap_err();
        assert_eq!(e.pointer, "/id");
        assert!(e.message.len() < 200, "{}", e.message);
    }
}
