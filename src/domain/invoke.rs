//! What an invocation body means (AIDIP 5, WoA 5.1–5.2): the agent's plain
//! input, a WoA envelope, or an array of either (a batch), and which of the
//! agent's operations a call is for.
//!
//! One rule here widens "operation": an MCP server whose record declares no
//! operations (every server published through the MCP Registry API or
//! mirrored from one) is called with a tool name as the operation, when the
//! call goes over an `mcp` binding that names no tool itself. The record
//! cannot list those tools (they live on the server and change without a
//! publish), so the name is not checked here; the server checks its own
//! arguments. `select_operation` applies it, `mcp_tool` names the tool, and
//! both read the binding the same way, so what passes selection is what the
//! transport sends.

use serde_json::{Map, Value};

use super::protocol::Protocol;
use super::record::{AgentMetadata, Binding, Operation};
use super::validate::FieldError;

/// Batches larger than this are refused as a whole.
pub const MAX_BATCH: usize = 100;

/// One call, as the caller asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The operation the body names (envelope `operation`), if any.
    pub operation: Option<String>,
    /// The agent's input object.
    pub input: Value,
    /// The caller sent a WoA envelope rather than plain input.
    pub envelope: bool,
    /// `"stream": true` in the body (envelope member, or an AIDIP agent's
    /// own streaming parameter in plain input, which stays in the input).
    pub stream: bool,
}

/// A parsed invocation body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Single(Call),
    /// Each element on its own: a bad element fails alone.
    Batch(Vec<Result<Call, FieldError>>),
}

/// Reads an invocation body for the agent the path names. `names` are the
/// names the agent answers to (its id and its WoA token): an envelope
/// whose `agent` is anything else is refused (WoA 5.2 requires 400).
pub fn parse_body(body: Value, names: &[&str]) -> Result<Body, FieldError> {
    match body {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(FieldError::new("", "a batch must hold at least one call"));
            }
            if items.len() > MAX_BATCH {
                return Err(FieldError::new(
                    "",
                    format!("a batch may hold at most {MAX_BATCH} calls"),
                ));
            }
            Ok(Body::Batch(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| parse_call(v, names, &format!("/{i}")))
                    .collect(),
            ))
        }
        v => parse_call(v, names, "").map(Body::Single),
    }
}

/// An object is an envelope when it holds an object `input` and a string
/// `agent` or `operation`: plain input is an object too, so the envelope is
/// recognised by the members WoA gives it.
fn is_envelope(m: &Map<String, Value>) -> bool {
    m.get("input").is_some_and(Value::is_object)
        && (m.get("agent").is_some_and(Value::is_string)
            || m.get("operation").is_some_and(Value::is_string))
}

fn parse_call(v: Value, names: &[&str], at: &str) -> Result<Call, FieldError> {
    let Value::Object(mut m) = v else {
        return Err(FieldError::new(
            at,
            "must be a JSON object (the agent's input or a WoA envelope {agent, operation, input})",
        ));
    };
    if !is_envelope(&m) {
        let stream = m.get("stream") == Some(&Value::Bool(true));
        return Ok(Call {
            operation: None,
            input: Value::Object(m),
            envelope: false,
            stream,
        });
    }
    if let Some(agent) = m.get("agent").and_then(Value::as_str) {
        if !names.contains(&agent) {
            return Err(FieldError::new(
                format!("{at}/agent"),
                format!(
                    "names agent '{agent}' but the request path names '{}'",
                    names.first().copied().unwrap_or_default()
                ),
            ));
        }
    }
    let stream = match m.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(FieldError::new(
                format!("{at}/stream"),
                "must be true or false",
            ))
        }
    };
    let operation = match m.get("operation") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(FieldError::new(
                format!("{at}/operation"),
                "must be a string naming one of the agent's operations",
            ))
        }
    };
    Ok(Call {
        operation,
        input: m.remove("input").unwrap_or_default(),
        envelope: true,
        stream,
    })
}

/// The operation a call is for, and the schemas that apply to it (the
/// operation's own, else the agent's). Neither `operation` nor `tool`
/// means the agent's single unnamed operation.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub operation: Option<&'a Operation>,
    /// The MCP tool named by a call to an agent whose tools are its
    /// operations (the module's rule): undeclared, so no schema of its own.
    pub tool: Option<&'a str>,
    pub inputs: Option<&'a Value>,
    pub outputs: Option<&'a Value>,
}

impl Target<'_> {
    /// The name the call is sent with: the declared operation's, else the
    /// tool's.
    pub fn name(&self) -> Option<&str> {
        self.operation.map(|o| o.name.as_str()).or(self.tool)
    }
}

/// The MCP tool an `mcp` binding sends a call to (WoA 4.3.2): the value of
/// the member its `tool_field` names (`agent`, the default: `woa_agent`,
/// the agent's id at its WoA host; `operation`: the call's operation),
/// else its `tool` member, else the call's operation. `mcp_tool(b, None)`
/// is the tool the binding fixes whatever the call; `None` there means
/// the operation names the tool.
pub fn mcp_tool<'a>(binding: &'a Binding, operation: Option<&'a str>) -> Option<&'a str> {
    let member = |k: &str| binding.extra.get(k).and_then(Value::as_str);
    let named = match member("tool_field").unwrap_or("agent") {
        "agent" => member("woa_agent"),
        "operation" => operation,
        other => member(other),
    };
    named.or_else(|| member("tool")).or(operation)
}

/// Whether a call over `binding` names its MCP tool by the operation while
/// the agent declares no operations: the module's rule.
fn tools_are_operations(meta: &AgentMetadata, binding: Option<&Binding>) -> bool {
    meta.operations.is_empty()
        && binding.is_some_and(|b| {
            b.known_protocol() == Some(Protocol::Mcp) && mcp_tool(b, None).is_none()
        })
}

/// Chooses the operation of a call that will go over `binding` (`None`:
/// not yet known, and then the module's rule does not apply): the one
/// named; else the only one; else the one named "default" (WoA's implied
/// name); an agent with several operations and none named is a 400 that
/// lists them. An agent whose tools are its operations (the module's rule)
/// takes any non-empty name as its tool, and must be given one.
pub fn select_operation<'a>(
    meta: &'a AgentMetadata,
    binding: Option<&Binding>,
    requested: Option<&'a str>,
) -> Result<Target<'a>, FieldError> {
    if tools_are_operations(meta, binding) {
        return match requested {
            Some(tool) if !tool.trim().is_empty() => Ok(Target {
                operation: None,
                tool: Some(tool),
                inputs: meta.inputs.as_ref(),
                outputs: meta.outputs.as_ref(),
            }),
            _ => Err(FieldError::new(
                "/operation",
                "name the MCP tool to call as the operation (envelope 'operation' or ?operation=): the agent is an MCP server whose record declares no operations (its tools/list, or the MCP tool list_agent_tools, names them)",
            )),
        };
    }
    let ops = &meta.operations;
    let names = || {
        ops.iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let op = match requested {
        Some(name) => match ops.iter().find(|o| o.name == name) {
            Some(op) => Some(op),
            None if name == "default" && ops.len() <= 1 => ops.first(),
            None => {
                return Err(FieldError::new(
                    "/operation",
                    if ops.is_empty() {
                        format!("names operation '{name}' but the agent declares none")
                    } else {
                        format!(
                            "names operation '{name}', which the agent does not declare (it has: {})",
                            names()
                        )
                    },
                ))
            }
        },
        None => match ops.len() {
            0 => None,
            1 => ops.first(),
            _ => match ops.iter().find(|o| o.name == "default") {
                Some(op) => Some(op),
                None => {
                    return Err(FieldError::new(
                        "/operation",
                        format!(
                            "the agent has several operations ({}); name one (envelope 'operation' or ?operation=)",
                            names()
                        ),
                    ))
                }
            },
        },
    };
    Ok(Target {
        operation: op,
        tool: None,
        inputs: op.and_then(|o| o.inputs.as_ref()).or(meta.inputs.as_ref()),
        outputs: op
            .and_then(|o| o.outputs.as_ref())
            .or(meta.outputs.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn single(v: Value) -> Call {
        match parse_body(v, &["summarizer", "sum-token"]).unwrap() {
            Body::Single(c) => c,
            Body::Batch(_) => panic!("expected a single call"),
        }
    }

    #[test]
    fn plain_input_and_envelopes_are_told_apart() {
        let plain = single(json!({"text": "hi", "stream": true}));
        assert!(!plain.envelope && plain.stream);
        assert_eq!(plain.input, json!({"text": "hi", "stream": true}));

        let env =
            single(json!({"agent": "summarizer", "operation": "default", "input": {"text": "hi"}}));
        assert!(env.envelope && !env.stream);
        assert_eq!(env.operation.as_deref(), Some("default"));
        assert_eq!(env.input, json!({"text": "hi"}));

        // The WoA token names the same agent.
        assert!(single(json!({"agent": "sum-token", "input": {}})).envelope);
        // An input that merely has an `input` member stays plain input.
        assert!(!single(json!({"input": {"x": 1}})).envelope);
    }

    #[test]
    fn an_envelope_naming_another_agent_is_refused() {
        let e = parse_body(json!({"agent": "other", "input": {}}), &["summarizer"]).unwrap_err();
        assert_eq!(e.pointer, "/agent");
        assert!(e.message.contains("other"), "{e}");
        let e = parse_body(json!([{"a": 1}, 7]), &["x"]).unwrap();
        match e {
            Body::Batch(items) => {
                assert!(items[0].is_ok());
                assert_eq!(items[1].as_ref().unwrap_err().pointer, "/1");
            }
            Body::Single(_) => panic!("expected a batch"),
        }
        assert!(parse_body(json!([]), &["x"]).is_err());
        assert!(parse_body(json!("text"), &["x"]).is_err());
    }

    #[test]
    fn operations_are_chosen_by_name_or_alone() {
        let meta: AgentMetadata = serde_json::from_value(json!({
            "id": "a", "name": "A", "description": "d",
            "inputs": {"type": "object"},
            "operations": [
                {"name": "translate", "inputs": {"type": "object", "required": ["text"]}},
                {"name": "detect"}
            ]
        }))
        .unwrap();
        let t = select_operation(&meta, None, Some("translate")).unwrap();
        assert_eq!(
            t.inputs,
            Some(&json!({"type": "object", "required": ["text"]}))
        );
        // An operation without its own schema falls back to the agent's.
        let t = select_operation(&meta, None, Some("detect")).unwrap();
        assert_eq!(t.inputs, Some(&json!({"type": "object"})));
        let e = select_operation(&meta, None, None).unwrap_err();
        assert!(e.message.contains("translate, detect"), "{e}");
        assert!(select_operation(&meta, None, Some("nope")).is_err());

        let single: AgentMetadata =
            serde_json::from_value(json!({"id": "b", "name": "B", "description": "d"})).unwrap();
        assert!(select_operation(&single, None, None)
            .unwrap()
            .operation
            .is_none());
        assert!(select_operation(&single, None, Some("default")).is_ok());
    }

    fn binding(v: Value) -> Binding {
        serde_json::from_value(v).unwrap()
    }

    /// A server from the MCP Registry API: `mcp` bindings, no operations.
    fn published_server() -> AgentMetadata {
        serde_json::from_value(json!({
            "id": "mcp:io.acme/weather", "name": "weather", "description": "d",
            "bindings": [
                {"protocol": "mcp", "endpoint": "https://mcp.acme.example/weather", "interaction_model": "streamable-http", "priority": 0},
                {"protocol": "mcp-package", "endpoint": "https://www.npmjs.com/package/@acme/weather-mcp", "priority": 1}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn an_mcp_server_without_operations_takes_the_tool_as_the_operation() {
        let meta = published_server();
        let b = &meta.bindings[0];
        let t = select_operation(&meta, Some(b), Some("forecast")).unwrap();
        assert_eq!((t.name(), t.tool), (Some("forecast"), Some("forecast")));
        assert!(t.operation.is_none() && t.inputs.is_none() && t.outputs.is_none());
        assert_eq!(mcp_tool(b, t.name()), Some("forecast"));
        // "default" is just another tool name here.
        assert_eq!(
            select_operation(&meta, Some(b), Some("default"))
                .unwrap()
                .name(),
            Some("default")
        );
        // Without a name there is nothing to call: a 400 at /operation.
        for missing in [None, Some(""), Some("  ")] {
            let e = select_operation(&meta, Some(b), missing).unwrap_err();
            assert_eq!(e.pointer, "/operation");
            assert!(e.message.contains("MCP tool"), "{e}");
        }
        // Before a binding is chosen the rule does not apply.
        let e = select_operation(&meta, None, Some("forecast")).unwrap_err();
        assert!(e.message.contains("declares none"), "{e}");
    }

    #[test]
    fn the_rule_needs_an_mcp_binding_that_fixes_no_tool_and_no_declared_operations() {
        let meta = published_server();
        // A binding that is not MCP keeps the old refusal (REST agents
        // that declare no operations).
        let rest = binding(json!({"protocol": "https", "endpoint": "https://a.example/run"}));
        let e = select_operation(&meta, Some(&rest), Some("forecast")).unwrap_err();
        assert!(e.message.contains("declares none"), "{e}");
        assert!(select_operation(&meta, Some(&rest), None)
            .unwrap()
            .name()
            .is_none());
        // An MCP binding that fixes its tool (WoA's `woa_agent`, or `tool`)
        // is the agent's single unnamed operation, as before.
        for fixed in [
            json!({"protocol": "mcp", "endpoint": "https://h.example/mcp", "woa_agent": "echo", "tool_field": "agent"}),
            json!({"protocol": "MCP", "endpoint": "https://h.example/mcp", "tool": "echo"}),
        ] {
            let b = binding(fixed);
            assert_eq!(mcp_tool(&b, None), Some("echo"));
            assert!(select_operation(&meta, Some(&b), None)
                .unwrap()
                .name()
                .is_none());
            assert!(select_operation(&meta, Some(&b), Some("other")).is_err());
        }
        // An agent that declares operations chooses among them only.
        let declared: AgentMetadata = serde_json::from_value(json!({
            "id": "t", "name": "T", "description": "d",
            "bindings": [{"protocol": "mcp", "endpoint": "https://h.example/mcp", "tool_field": "operation"}],
            "operations": [{"name": "translate"}]
        }))
        .unwrap();
        let b = &declared.bindings[0];
        let t = select_operation(&declared, Some(b), Some("translate")).unwrap();
        assert!(t.operation.is_some() && t.tool.is_none());
        assert_eq!(mcp_tool(b, t.name()), Some("translate"));
        assert!(select_operation(&declared, Some(b), Some("word_count")).is_err());
    }
}
