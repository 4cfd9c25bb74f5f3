//! WoA REST (`woa-rest`): the WoA invocation envelope (`agent`,
//! `operation`, `input`, `stream`) is the body.

use serde_json::{json, Map, Value};

use super::{
    events_or_answer, post, whole_answer, Answer, CallSpec, GatewayError, Outbound, Started,
};
use crate::domain::Binding;

/// The agent's id at its WoA host, which the envelope names.
pub(super) fn woa_agent(b: &Binding) -> Result<&str, GatewayError> {
    b.extra
        .get("woa_agent")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            GatewayError::Unsupported(format!(
                "the {} binding to {} names no 'woa_agent' (the agent's id at its WoA host)",
                b.protocol, b.endpoint
            ))
        })
}

fn envelope(spec: &CallSpec<'_>) -> Result<Value, GatewayError> {
    let mut env = Map::new();
    env.insert("agent".into(), json!(woa_agent(spec.binding)?));
    if let Some(op) = spec.operation {
        env.insert("operation".into(), json!(op));
    }
    env.insert("input".into(), spec.input.clone());
    if spec.stream {
        env.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(env))
}

pub(super) async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    let (resp, url) = post(out, spec, &envelope(spec)?, "application/json").await?;
    whole_answer(out, resp, &url).await
}

pub(super) async fn open_stream(
    out: &Outbound,
    spec: &CallSpec<'_>,
) -> Result<Started, GatewayError> {
    let accept = "text/event-stream, application/json";
    let (resp, url) = post(out, spec, &envelope(spec)?, accept).await?;
    events_or_answer(out, resp, &url).await
}

#[cfg(test)]
mod tests {
    use super::super::tests::{binding, spec};
    use super::*;

    #[test]
    fn the_envelope_names_the_hosts_agent() {
        let input = json!({"text": "hi"});
        let woa = binding("woa-rest", json!({"woa_agent": "summarizer"}));
        assert_eq!(
            envelope(&spec(&woa, &input, Some("default"), false)).unwrap(),
            json!({"agent": "summarizer", "operation": "default", "input": {"text": "hi"}})
        );
        assert!(envelope(&spec(&binding("woa-rest", json!({})), &input, None, false)).is_err());
    }
}
