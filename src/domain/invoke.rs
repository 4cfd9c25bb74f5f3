//! What an invocation body means (AIDIP 5, WoA 5.1–5.2): the agent's plain
//! input, a WoA envelope, or an array of either (a batch), and which of the
//! agent's operations a call is for.

use serde_json::{Map, Value};

use super::record::{AgentMetadata, Operation};
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
/// operation's own, else the agent's). `None` means the agent's single
/// unnamed operation.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub operation: Option<&'a Operation>,
    pub inputs: Option<&'a Value>,
    pub outputs: Option<&'a Value>,
}

impl Target<'_> {
    pub fn name(&self) -> Option<&str> {
        self.operation.map(|o| o.name.as_str())
    }
}

/// Chooses the operation: the one named; else the only one; else the one
/// named "default" (WoA's implied name); an agent with several operations
/// and none named is a 400 that lists them.
pub fn select_operation<'a>(
    meta: &'a AgentMetadata,
    requested: Option<&str>,
) -> Result<Target<'a>, FieldError> {
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
        let t = select_operation(&meta, Some("translate")).unwrap();
        assert_eq!(
            t.inputs,
            Some(&json!({"type": "object", "required": ["text"]}))
        );
        // An operation without its own schema falls back to the agent's.
        let t = select_operation(&meta, Some("detect")).unwrap();
        assert_eq!(t.inputs, Some(&json!({"type": "object"})));
        let e = select_operation(&meta, None).unwrap_err();
        assert!(e.message.contains("translate, detect"), "{e}");
        assert!(select_operation(&meta, Some("nope")).is_err());

        let single: AgentMetadata =
            serde_json::from_value(json!({"id": "b", "name": "B", "description": "d"})).unwrap();
        assert!(select_operation(&single, None).unwrap().operation.is_none());
        assert!(select_operation(&single, Some("default")).is_ok());
    }
}
