//! The Agent Protocol (`agent-protocol`): an invocation is a run started
//! with a ChatRequest on `stream_request`; a whole answer collects its
//! events until RunCompleted.

use axum::body::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use url::Url;

use super::{
    events_or_answer, exchange, redacted, Answer, CallSpec, GatewayError, Outbound, Started,
};

/// An AP agent's route (`base` + `/` + `route`).
pub fn ap_url(base: &str, route: &str) -> Result<Url, GatewayError> {
    Url::parse(&format!("{}/{route}", base.trim_end_matches('/'))).map_err(|e| {
        GatewayError::Unsupported(format!("the AP agent URL {base} is not a URL: {e}"))
    })
}

/// Starts an AP run for an invocation: a ChatRequest whose `input` is the
/// caller's `input` text, else the whole input as JSON text.
async fn stream_request(
    out: &Outbound,
    spec: &CallSpec<'_>,
) -> Result<(reqwest::Response, Url), GatewayError> {
    let url = ap_url(&spec.binding.endpoint, "stream_request")?;
    let text = match spec.input.get("input") {
        Some(Value::String(s)) => s.clone(),
        _ => spec.input.to_string(),
    };
    let request = json!({"type": "ChatRequest", "input": text});
    let resp = exchange(
        out,
        reqwest::Method::POST,
        &url,
        Some(&request),
        &spec.headers,
        "text/event-stream, application/json",
    )
    .await?;
    Ok((resp, url))
}

/// An AP run as one answer: `{output, finish_reason, run_id, thread_id}`
/// from its events (RunCompleted's `result`, else the TextOutputs).
pub(super) async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    let (resp, url) = stream_request(out, spec).await?;
    let mut events = match events_or_answer(out, resp, &url).await? {
        Started::Whole(a) if a.status >= 400 => return Ok(a),
        Started::Whole(_) => {
            return Err(GatewayError::BadAnswer(format!(
                "the AP agent at {} did not stream its run",
                redacted(&url)
            )))
        }
        Started::Events(e) => e,
    };
    let mut text = Vec::new();
    let mut ids = (Value::Null, Value::Null);
    while let Some(e) = events.next().await {
        let event: Value = serde_json::from_str(&e?.data).unwrap_or(Value::Null);
        if ids.0.is_null() {
            ids = (event["run_id"].clone(), event["thread_id"].clone());
        }
        match event["type"].as_str().unwrap_or_default() {
            "TextOutput" => text.push(event["content"].as_str().unwrap_or_default().to_string()),
            "WaitForInput" => {
                return Err(GatewayError::BadAnswer(
                    "the AP agent asked for input (WaitForInput); run it through the Agent Protocol routes to answer".into(),
                ))
            }
            "RunCompleted" => {
                let reason = event["finish_reason"].as_str().unwrap_or("success");
                if reason != "success" {
                    return Err(GatewayError::BadAnswer(format!(
                        "the AP agent's run ended with finish_reason '{reason}'"
                    )));
                }
                let output = match &event["result"] {
                    Value::Null => json!(text.join("")),
                    r => r.clone(),
                };
                let json = json!({"output": output, "finish_reason": reason, "run_id": ids.0, "thread_id": ids.1});
                return Ok(Answer {
                    status: 200,
                    body: Bytes::from(json.to_string()),
                    json,
                    content_type: "application/json".into(),
                    retry_after: None,
                    challenge: None,
                });
            }
            _ => {}
        }
    }
    Err(GatewayError::BadAnswer(format!(
        "the AP agent at {} ended its stream without RunCompleted",
        redacted(&url)
    )))
}

pub(super) async fn open_stream(
    out: &Outbound,
    spec: &CallSpec<'_>,
) -> Result<Started, GatewayError> {
    let (resp, url) = stream_request(out, spec).await?;
    events_or_answer(out, resp, &url).await
}
