//! Agent Protocol: an `AgentDescriptor` (the answer of `GET {base}/describe`)
//! mapped into a record, so AP agents are found and invoked through the
//! gateway like the others. AP's "casual" schemas are read here, because no
//! other format has them.

use std::collections::HashSet;

use serde_json::{json, Map, Value};
use url::Url;

use super::{add_tag, ptr, source, Dropped, Obj, Result};
use crate::domain::validate::compile_schema;
use crate::domain::{AgentMetadata, Binding, FieldError, Operation, Protocol};

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
    let mut tags = vec![Protocol::AgentProtocol.as_str().to_string()];
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
            protocol: Protocol::AgentProtocol.as_str().into(),
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

#[cfg(test)]
mod tests {
    use super::super::test_support::{dropped_pointers, stored, url};
    use super::*;

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
