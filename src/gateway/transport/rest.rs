//! AIDIP REST (`https`, `http`): the caller's input is the body; an agent
//! that declares several operations is told which one in the body (AIDIP 5:
//! `"operation": ...`).

use serde_json::{json, Value};

use super::{
    events_or_answer, post, whole_answer, Answer, CallSpec, GatewayError, Outbound, Started,
};

/// The JSON body the agent receives.
fn body(spec: &CallSpec<'_>) -> Value {
    match (spec.input, spec.operation) {
        (Value::Object(m), Some(op)) if spec.name_operation && !m.contains_key("operation") => {
            let mut m = m.clone();
            m.insert("operation".into(), json!(op));
            Value::Object(m)
        }
        (v, _) => v.clone(),
    }
}

pub(super) async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    let (resp, url) = post(out, spec, &body(spec), "application/json").await?;
    whole_answer(out, resp, &url).await
}

pub(super) async fn open_stream(
    out: &Outbound,
    spec: &CallSpec<'_>,
) -> Result<Started, GatewayError> {
    let accept = "text/event-stream, application/json";
    let (resp, url) = post(out, spec, &body(spec), accept).await?;
    events_or_answer(out, resp, &url).await
}

#[cfg(test)]
mod tests {
    use super::super::tests::{binding, spec};
    use super::*;

    #[test]
    fn the_input_is_the_body_with_the_operation_named_when_there_are_several() {
        let input = json!({"text": "hi"});
        let plain = binding("https", json!({}));
        assert_eq!(body(&spec(&plain, &input, Some("t"), false)), input);
        assert_eq!(
            body(&spec(&plain, &input, Some("t"), true)),
            json!({"text": "hi", "operation": "t"})
        );
    }
}
