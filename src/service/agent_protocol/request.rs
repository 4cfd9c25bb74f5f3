//! AP's request documents as the gateway reads them, and the documents it
//! answers with for an agent it runs itself.

use serde_json::{json, Map, Value};

use super::{bad_request, Result};
use crate::domain::AgentRecord;

/// AP's request types.
pub(super) enum ApRequest {
    Chat(Chat),
    Cancel {
        run_id: String,
    },
    Resume {
        run_id: String,
        keys: Map<String, Value>,
    },
}

/// A ChatRequest: starts a run (in `thread_id`'s thread when given).
pub(super) struct Chat {
    pub input: Option<Value>,
    pub thread_id: Option<String>,
    pub operation: Option<String>,
}

pub(super) fn parse_request(v: &Value) -> Result<ApRequest> {
    let Value::Object(m) = v else {
        return Err(bad_request("", "an AP Request must be a JSON object"));
    };
    let text = |k: &str| m.get(k).and_then(Value::as_str).map(String::from);
    let run_id = || text("run_id").ok_or_else(|| bad_request("/run_id", "is required"));
    let kind = text("type").unwrap_or_else(|| "ChatRequest".into());
    match kind.as_str() {
        "ChatRequest" => Ok(ApRequest::Chat(Chat {
            input: m.get("input").cloned(),
            thread_id: text("thread_id"),
            operation: text("operation"),
        })),
        "CancelRequest" => Ok(ApRequest::Cancel { run_id: run_id()? }),
        "ResumeWithInput" => Ok(ApRequest::Resume {
            run_id: run_id()?,
            keys: match m.get("request_keys") {
                Some(Value::Object(k)) => k.clone(),
                _ => {
                    return Err(bad_request(
                        "/request_keys",
                        "must be an object of key → value",
                    ))
                }
            },
        }),
        other => Err(bad_request(
            "/type",
            format!(
                "'{other}' is not a request type (ChatRequest, CancelRequest, ResumeWithInput)"
            ),
        )),
    }
}

/// The operation's input from a chat request: an object as it is; text
/// that is a JSON object; else text for the schema's only string property
/// (or `input` when there is no schema). Returns it with the required
/// members still missing (key → what to ask).
pub(super) fn chat_input(
    schema: Option<&Value>,
    input: Option<Value>,
) -> (Map<String, Value>, Map<String, Value>) {
    let props = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let map = match input {
        Some(Value::Object(m)) => m,
        Some(Value::String(s)) => match crate::domain::json::parse_json(s.as_bytes()) {
            Ok(Value::Object(m)) => m,
            _ => {
                let strings: Vec<&String> = props
                    .map(|p| {
                        p.iter()
                            .filter(|(_, v)| v.get("type") == Some(&json!("string")))
                            .map(|(k, _)| k)
                            .collect()
                    })
                    .unwrap_or_default();
                let key = match (schema, strings.as_slice()) {
                    (None, _) => Some("input".to_string()),
                    (_, [one]) => Some((*one).clone()),
                    _ => None,
                };
                key.map(|k| Map::from_iter([(k, json!(s))]))
                    .unwrap_or_default()
            }
        },
        _ => Map::new(),
    };
    let missing = missing(schema, &map);
    (map, missing)
}

/// The schema's required members `map` lacks, each with what to ask for
/// it (its description, else its type).
pub(super) fn missing(schema: Option<&Value>, map: &Map<String, Value>) -> Map<String, Value> {
    let props = schema.and_then(|s| s.get("properties"));
    schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .filter(|k| !map.contains_key(*k))
                .map(|k| {
                    let p = props.and_then(|p| p.get(k));
                    let ask = p
                        .and_then(|p| p.get("description"))
                        .or_else(|| p.and_then(|p| p.get("type")))
                        .and_then(Value::as_str)
                        .unwrap_or("a value");
                    (k.to_string(), json!(ask))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The AgentDescriptor of a gateway-hosted agent.
pub(super) fn descriptor(record: &AgentRecord) -> Value {
    let m = &record.metadata;
    let operations: Vec<Value> = if m.operations.is_empty() {
        vec![json!({"name": "default", "description": m.description,
            "input_schema": m.inputs, "output_schema": m.outputs})]
    } else {
        m.operations
            .iter()
            .map(|o| {
                json!({"name": o.name, "description": o.description.clone().unwrap_or_default(),
                    "input_schema": o.inputs.as_ref().or(m.inputs.as_ref()),
                    "output_schema": o.outputs.as_ref().or(m.outputs.as_ref())})
            })
            .collect()
    };
    json!({
        "name": m.name,
        "purpose": m.description,
        "endpoints": ["/describe", "/run", "/get_events", "/stream_request", "/runs", "/threads"],
        "operations": operations,
        "tools": [],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_text_fills_the_only_string_property_or_is_asked_for() {
        let schema = json!({"type": "object",
            "properties": {"text": {"type": "string"}, "target_language": {"type": "string", "description": "Which language?"}},
            "required": ["text", "target_language"]});
        let (m, missing) = chat_input(Some(&schema), Some(json!(r#"{"text": "hi"}"#)));
        assert_eq!(m, Map::from_iter([("text".into(), json!("hi"))]));
        assert_eq!(
            missing,
            Map::from_iter([("target_language".into(), json!("Which language?"))])
        );
        let one =
            json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]});
        let (m, missing) = chat_input(Some(&one), Some(json!("what is AP?")));
        assert_eq!(m["q"], "what is AP?");
        assert!(missing.is_empty());
        let (m, _) = chat_input(None, Some(json!("free text")));
        assert_eq!(m["input"], "free text");
    }

    #[test]
    fn requests_are_told_apart_by_type() {
        assert!(matches!(
            parse_request(&json!({"input": "x"})),
            Ok(ApRequest::Chat(_))
        ));
        assert!(matches!(
            parse_request(&json!({"type": "CancelRequest", "run_id": "r"})),
            Ok(ApRequest::Cancel { .. })
        ));
        assert!(parse_request(&json!({"type": "CancelRequest"})).is_err());
        assert!(parse_request(
            &json!({"type": "ResumeWithInput", "run_id": "r", "request_keys": 1})
        )
        .is_err());
        assert!(parse_request(&json!({"type": "Dance"})).is_err());
        assert!(parse_request(&json!([1])).is_err());
    }
}
