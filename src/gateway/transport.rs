//! The wire protocols the gateway calls agents with, one per binding
//! protocol: AIDIP REST (`https`, `http`: the plain input is the body), WoA
//! REST (`woa-rest`: the invocation envelope), MCP (`mcp`: the envelope
//! becomes a `tools/call` over Streamable HTTP, WoA 5.3) and the Agent
//! Protocol (`agent-protocol`: a ChatRequest on `stream_request`, its events
//! collected until RunCompleted).
//!
//! Answers are classified here once: a 2xx JSON body is the agent's output,
//! a 4xx JSON body is passed through as the agent's own refusal, 503 is
//! "overloaded", other 5xx and anything that is not JSON are bad answers.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use url::Url;

use super::outbound::{classify, read_limited, redacted, Lookup, OutboundError, OutboundPolicy};
use crate::domain::Binding;

/// Binding protocols the gateway can call.
pub const PROTOCOLS: &[&str] = &["https", "http", "woa-rest", "mcp", "agent-protocol"];

pub fn speaks(protocol: &str) -> bool {
    PROTOCOLS.contains(&protocol)
}

/// Why a call produced no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Outbound(#[from] OutboundError),
    /// The agent answered, but not with something the gateway can return.
    #[error("{0}")]
    BadAnswer(String),
    /// The agent said it is overloaded (503).
    #[error("{message}")]
    Overloaded {
        message: String,
        retry_after: Option<u32>,
    },
    /// The agent's own gateway timed out (it answered 504).
    #[error("{0}")]
    Timeout(String),
    /// The binding lacks what its protocol needs.
    #[error("{0}")]
    Unsupported(String),
}

/// The guarded client and its policy.
#[derive(Clone)]
pub struct Outbound {
    pub client: reqwest::Client,
    pub policy: Arc<OutboundPolicy>,
    lookup: Lookup,
}

impl Outbound {
    pub fn new(policy: OutboundPolicy, lookup: Lookup) -> Result<Self, String> {
        let policy = Arc::new(policy);
        Ok(Self {
            client: super::outbound::client(policy.clone(), lookup.clone())?,
            policy,
            lookup,
        })
    }

    /// Checks a target before a client that does its own connecting (the
    /// MCP transport) starts, so a refusal reads as one rather than as a
    /// generic transport failure. The resolver still enforces the policy.
    pub async fn preflight(&self, url: &Url) -> Result<(), OutboundError> {
        self.policy.check_url(url)?;
        if let Some(url::Host::Domain(host)) = url.host() {
            let addrs =
                (self.lookup)(host.to_string())
                    .await
                    .map_err(|e| OutboundError::Unreachable {
                        target: redacted(url),
                        reason: format!("cannot resolve {host}: {e}"),
                    })?;
            self.policy.filter_resolved(host, addrs)?;
        }
        Ok(())
    }

    /// GETs a document (the WoA crawler, Agent Cards, AP `describe`).
    /// `validators` are sent as If-None-Match / If-Modified-Since.
    pub async fn fetch(
        &self,
        url: &Url,
        accept: &str,
        validators: &[(&str, String)],
    ) -> Result<Fetched, OutboundError> {
        self.policy.check_url(url)?;
        let mut req = self
            .client
            .get(url.clone())
            .header(reqwest::header::ACCEPT, accept)
            .timeout(self.policy.timeout);
        for (name, value) in validators {
            req = req.header(*name, value);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| classify(&e, url, self.policy.timeout))?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let (etag, last_modified, cache_control) = (
            header("etag"),
            header("last-modified"),
            header("cache-control"),
        );
        let final_url = resp.url().clone();
        let body = read_limited(resp, self.policy.max_response_bytes, self.policy.timeout).await?;
        Ok(Fetched {
            status,
            url: final_url,
            body,
            etag,
            last_modified,
            cache_control,
        })
    }
}

/// A fetched document and its caching validators.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub status: u16,
    /// Where the document was finally read from (after redirects).
    pub url: Url,
    pub body: Vec<u8>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub cache_control: Option<String>,
}

/// One call to one binding.
pub struct CallSpec<'a> {
    pub binding: &'a Binding,
    /// The operation called, if the agent declares operations.
    pub operation: Option<&'a str>,
    /// The agent declares several operations: AIDIP REST then names the
    /// one called in the body (AIDIP 5: `"operation": ...`).
    pub name_operation: bool,
    pub input: &'a Value,
    pub stream: bool,
    /// Credentials and the idempotency key, as (header, value).
    pub headers: Vec<(String, String)>,
}

/// An answer the gateway returns: a success or the agent's own 4xx.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Exactly as the agent sent it.
    pub body: Bytes,
    pub json: Value,
    pub content_type: String,
    pub retry_after: Option<u32>,
}

/// One event of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

/// How a streamed call began: a stream of events, or (an agent that does
/// not stream, or refused) one whole answer.
pub enum Started {
    Events(BoxStream<'static, Result<Event, GatewayError>>),
    Whole(Answer),
}

fn woa_agent(b: &Binding) -> Result<&str, GatewayError> {
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

/// The JSON body a REST binding receives.
fn rest_body(spec: &CallSpec<'_>) -> Result<Value, GatewayError> {
    Ok(match spec.binding.protocol.as_str() {
        "woa-rest" => {
            let mut env = Map::new();
            env.insert("agent".into(), json!(woa_agent(spec.binding)?));
            if let Some(op) = spec.operation {
                env.insert("operation".into(), json!(op));
            }
            env.insert("input".into(), spec.input.clone());
            if spec.stream {
                env.insert("stream".into(), json!(true));
            }
            Value::Object(env)
        }
        _ => match (spec.input, spec.operation) {
            (Value::Object(m), Some(op)) if spec.name_operation && !m.contains_key("operation") => {
                let mut m = m.clone();
                m.insert("operation".into(), json!(op));
                Value::Object(m)
            }
            (v, _) => v.clone(),
        },
    })
}

fn endpoint(b: &Binding) -> Result<Url, GatewayError> {
    Url::parse(&b.endpoint).map_err(|e| {
        GatewayError::Unsupported(format!(
            "the binding endpoint {} is not a URL: {e}",
            b.endpoint
        ))
    })
}

fn retry_after(resp: &reqwest::Response) -> Option<u32> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Sends a REST call and waits for the response head.
async fn send_rest(
    out: &Outbound,
    spec: &CallSpec<'_>,
    accept: &str,
) -> Result<(reqwest::Response, Url), GatewayError> {
    let url = endpoint(spec.binding)?;
    let body = rest_body(spec)?;
    let resp = exchange(
        out,
        reqwest::Method::POST,
        &url,
        Some(&body),
        &spec.headers,
        accept,
    )
    .await?;
    Ok((resp, url))
}

/// One request to an agent's HTTP surface through the guard, up to the
/// response head (within the gateway's deadline).
pub async fn exchange(
    out: &Outbound,
    method: reqwest::Method,
    url: &Url,
    body: Option<&Value>,
    headers: &[(String, String)],
    accept: &str,
) -> Result<reqwest::Response, GatewayError> {
    out.policy.check_url(url)?;
    let mut req = out
        .client
        .request(method, url.clone())
        .header(reqwest::header::ACCEPT, accept);
    if let Some(b) = body {
        req = req.json(b);
    }
    for (name, value) in headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let timeout = out.policy.timeout;
    Ok(tokio::time::timeout(timeout, req.send())
        .await
        .map_err(|_| OutboundError::Timeout {
            target: redacted(url),
            ms: timeout.as_millis(),
        })?
        .map_err(|e| classify(&e, url, timeout))?)
}

/// The events of an SSE answer, or the whole answer when the agent sent
/// something else (a refusal, or JSON).
pub async fn events_or_answer(
    out: &Outbound,
    resp: reqwest::Response,
    url: &Url,
) -> Result<Started, GatewayError> {
    let is_sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if !(is_sse && resp.status().is_success()) {
        return whole_answer(out, resp, url).await.map(Started::Whole);
    }
    Ok(Started::Events(relay(
        resp,
        redacted(url),
        out.policy.timeout,
        out.policy.max_response_bytes,
    )))
}

/// Reads and classifies a whole REST answer.
pub async fn whole_answer(
    out: &Outbound,
    resp: reqwest::Response,
    url: &Url,
) -> Result<Answer, GatewayError> {
    let status = resp.status().as_u16();
    let retry = retry_after(&resp);
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = read_limited(resp, out.policy.max_response_bytes, out.policy.timeout).await?;
    classify_answer(status, &content_type, Bytes::from(body), retry, url)
}

/// The one judgement of an agent's HTTP answer.
fn classify_answer(
    status: u16,
    content_type: &str,
    body: Bytes,
    retry_after: Option<u32>,
    url: &Url,
) -> Result<Answer, GatewayError> {
    let target = redacted(url);
    match status {
        503 => {
            return Err(GatewayError::Overloaded {
                message: format!("the agent at {target} is overloaded (it answered 503)"),
                retry_after,
            })
        }
        504 => {
            return Err(GatewayError::Timeout(format!(
                "the agent at {target} timed out (it answered 504)"
            )))
        }
        s if s >= 500 => {
            return Err(GatewayError::BadAnswer(format!(
                "the agent at {target} failed (it answered {s})"
            )))
        }
        s if !(200..500).contains(&s) || (300..400).contains(&s) => {
            return Err(GatewayError::BadAnswer(format!(
                "the agent at {target} answered with status {s}"
            )))
        }
        _ => {}
    }
    if matches!(status, 202 | 204) && body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Answer {
            status,
            body,
            json: Value::Null,
            content_type: String::new(),
            retry_after,
        });
    }
    let json: Value = serde_json::from_slice(&body).map_err(|e| {
        GatewayError::BadAnswer(format!(
            "the agent at {target} answered {status} with a body that is not JSON ({e})"
        ))
    })?;
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let content_type = if status >= 400 && essence == "application/problem+json" {
        "application/problem+json"
    } else {
        "application/json"
    };
    Ok(Answer {
        status,
        body,
        json,
        content_type: content_type.into(),
        retry_after,
    })
}

/// Calls the agent and waits for its whole answer.
pub async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    match spec.binding.protocol.as_str() {
        // Boxed: rmcp's session future is large and deeply nested.
        "mcp" => Box::pin(call_mcp(out, spec)).await,
        "agent-protocol" => call_ap(out, spec).await,
        "https" | "http" | "woa-rest" => {
            let (resp, url) = send_rest(out, spec, "application/json").await?;
            whole_answer(out, resp, &url).await
        }
        other => Err(GatewayError::Unsupported(format!(
            "the gateway cannot call '{other}' bindings"
        ))),
    }
}

/// Calls the agent asking for a stream of events. Agents that answer with
/// one JSON body (and MCP tools) give a whole answer instead.
pub async fn open_stream(out: &Outbound, spec: &CallSpec<'_>) -> Result<Started, GatewayError> {
    if spec.binding.protocol == "mcp" {
        return Box::pin(call_mcp(out, spec)).await.map(Started::Whole);
    }
    if spec.binding.protocol == "agent-protocol" {
        let (resp, url) = ap_stream_request(out, spec).await?;
        return events_or_answer(out, resp, &url).await;
    }
    if !matches!(
        spec.binding.protocol.as_str(),
        "https" | "http" | "woa-rest"
    ) {
        return call(out, spec).await.map(Started::Whole);
    }
    let (resp, url) = send_rest(out, spec, "text/event-stream, application/json").await?;
    events_or_answer(out, resp, &url).await
}

/// The agent's server-sent events, one at a time, each within `idle` of
/// the one before and no larger than `limit`. Dropping the stream drops
/// the connection, which is how a client's disconnect reaches the agent.
fn relay(
    resp: reqwest::Response,
    target: String,
    idle: Duration,
    limit: usize,
) -> BoxStream<'static, Result<Event, GatewayError>> {
    let events = sse_stream::SseStream::from_bytes_stream(resp.bytes_stream());
    futures::stream::unfold(
        (Box::pin(events), target, false),
        move |(mut events, target, done)| async move {
            if done {
                return None;
            }
            let next = loop {
                match tokio::time::timeout(idle, events.next()).await {
                    Err(_) => {
                        break Some(Err(GatewayError::from(OutboundError::Timeout {
                            target: target.clone(),
                            ms: idle.as_millis(),
                        })))
                    }
                    Ok(None) => break None,
                    Ok(Some(Err(e))) => {
                        break Some(Err(GatewayError::from(OutboundError::Unreachable {
                            target: target.clone(),
                            reason: format!("the event stream broke off: {e}"),
                        })))
                    }
                    // Comments and retry hints carry nothing to relay.
                    Ok(Some(Ok(sse))) if sse.data.is_none() && sse.event.is_none() => continue,
                    Ok(Some(Ok(sse))) => {
                        let data = sse.data.unwrap_or_default();
                        if data.len() > limit {
                            break Some(Err(GatewayError::from(OutboundError::TooLarge {
                                target: target.clone(),
                                limit,
                            })));
                        }
                        break Some(Ok(Event {
                            event: sse.event.unwrap_or_else(|| "message".into()),
                            data,
                            id: sse.id,
                        }));
                    }
                }
            };
            let failed = matches!(next, Some(Err(_)));
            next.map(|item| (item, (events, target, failed)))
        },
    )
    .boxed()
}

/// An AP agent's route (`base` + `/` + `route`).
pub fn ap_url(base: &str, route: &str) -> Result<Url, GatewayError> {
    Url::parse(&format!("{}/{route}", base.trim_end_matches('/'))).map_err(|e| {
        GatewayError::Unsupported(format!("the AP agent URL {base} is not a URL: {e}"))
    })
}

/// Starts an AP run for an invocation: a ChatRequest whose `input` is the
/// caller's `input` text, else the whole input as JSON text.
async fn ap_stream_request(
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
async fn call_ap(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    let (resp, url) = ap_stream_request(out, spec).await?;
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

/// The MCP tool a WoA envelope maps to (WoA 4.3.2): the envelope member
/// `tool_field` names (`agent`: the host's agent id; `operation`: the
/// operation's name).
fn mcp_tool(spec: &CallSpec<'_>) -> Result<String, GatewayError> {
    let b = spec.binding;
    let field = b
        .extra
        .get("tool_field")
        .and_then(Value::as_str)
        .unwrap_or("agent");
    let tool = match field {
        "agent" => woa_agent(b).ok().map(String::from),
        "operation" => spec.operation.map(String::from),
        other => b.extra.get(other).and_then(Value::as_str).map(String::from),
    };
    tool.or_else(|| {
        b.extra
            .get("tool")
            .and_then(Value::as_str)
            .map(String::from)
    })
    .ok_or_else(|| {
        GatewayError::Unsupported(format!(
            "the mcp binding to {} cannot name a tool (tool_field '{field}' has no value)",
            b.endpoint
        ))
    })
}

/// A WoA envelope as an MCP `tools/call` over Streamable HTTP (rmcp, on
/// the guarded client): initialise, call, close the session.
async fn call_mcp(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::{
        StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
    };
    use rmcp::ServiceExt;

    let url = endpoint(spec.binding)?;
    out.preflight(&url).await?;
    let tool = mcp_tool(spec)?;
    let arguments = match spec.input {
        Value::Object(m) => Some(m.clone()),
        _ => None,
    };
    // rmcp sends one credential, as `Authorization: Bearer`.
    let auth_header = spec
        .headers
        .iter()
        .find(|(h, _)| h.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.strip_prefix("Bearer ").unwrap_or(v).to_string());
    let target = redacted(&url);
    let timeout = out.policy.timeout;
    let run = async {
        let transport = StreamableHttpClientTransport::with_client(
            out.client.clone(),
            StreamableHttpClientTransportConfig {
                uri: url.as_str().into(),
                auth_header,
                ..Default::default()
            },
        );
        let client =
            ().serve(transport)
                .await
                .map_err(|e| OutboundError::Unreachable {
                    target: target.clone(),
                    reason: format!("the MCP session did not start: {e}"),
                })?;
        let result = client
            .call_tool(CallToolRequestParams {
                meta: None,
                name: tool.clone().into(),
                arguments,
                task: None,
            })
            .await;
        if let Err(e) = client.cancel().await {
            tracing::debug!(error = %e, "closing the MCP session failed");
        }
        result.map_err(|e| {
            GatewayError::BadAnswer(format!(
                "the MCP server at {target} refused tools/call '{tool}': {e}"
            ))
        })
    };
    let result =
        tokio::time::timeout(timeout, run)
            .await
            .map_err(|_| OutboundError::Timeout {
                target: target.clone(),
                ms: timeout.as_millis(),
            })??;
    mcp_answer(result, &target, out.policy.max_response_bytes)
}

/// The tool's result as the agent's JSON output: its structured content,
/// else a single text item that is JSON, else the content list itself.
fn mcp_answer(
    result: rmcp::model::CallToolResult,
    target: &str,
    limit: usize,
) -> Result<Answer, GatewayError> {
    let text = |r: &rmcp::model::CallToolResult| -> Vec<String> {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    };
    if result.is_error == Some(true) {
        let mut why = text(&result).join(" ");
        why.truncate(300);
        return Err(GatewayError::BadAnswer(format!(
            "the MCP tool at {target} reported an error: {why}"
        )));
    }
    let json = match (&result.structured_content, text(&result).as_slice()) {
        (Some(v), _) => v.clone(),
        (None, [one]) => serde_json::from_str::<Value>(one)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({"content": result.content})),
        _ => json!({"content": result.content}),
    };
    let body = serde_json::to_vec(&json).map_err(|e| GatewayError::BadAnswer(e.to_string()))?;
    if body.len() > limit {
        return Err(OutboundError::TooLarge {
            target: target.into(),
            limit,
        }
        .into());
    }
    Ok(Answer {
        status: 200,
        body: Bytes::from(body),
        json,
        content_type: "application/json".into(),
        retry_after: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(protocol: &str, extra: Value) -> Binding {
        Binding {
            protocol: protocol.into(),
            endpoint: "https://agents.example/invoke".into(),
            extra: extra.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    fn spec<'a>(b: &'a Binding, input: &'a Value, op: Option<&'a str>, many: bool) -> CallSpec<'a> {
        CallSpec {
            binding: b,
            operation: op,
            name_operation: many,
            input,
            stream: false,
            headers: Vec::new(),
        }
    }

    #[test]
    fn each_protocol_gets_its_body() {
        let input = json!({"text": "hi"});
        let plain = binding("https", json!({}));
        assert_eq!(
            rest_body(&spec(&plain, &input, Some("t"), false)).unwrap(),
            input
        );
        assert_eq!(
            rest_body(&spec(&plain, &input, Some("t"), true)).unwrap(),
            json!({"text": "hi", "operation": "t"})
        );
        let woa = binding("woa-rest", json!({"woa_agent": "summarizer"}));
        assert_eq!(
            rest_body(&spec(&woa, &input, Some("default"), false)).unwrap(),
            json!({"agent": "summarizer", "operation": "default", "input": {"text": "hi"}})
        );
        assert!(rest_body(&spec(&binding("woa-rest", json!({})), &input, None, false)).is_err());
        let mcp = binding("mcp", json!({"woa_agent": "echo", "tool_field": "agent"}));
        assert_eq!(mcp_tool(&spec(&mcp, &input, None, false)).unwrap(), "echo");
        let by_op = binding("mcp", json!({"tool_field": "operation"}));
        assert_eq!(
            mcp_tool(&spec(&by_op, &input, Some("sum"), false)).unwrap(),
            "sum"
        );
    }

    #[test]
    fn answers_are_classified_once() {
        let url = Url::parse("https://agents.example/x?token=secret").unwrap();
        let ok = classify_answer(
            200,
            "application/json",
            Bytes::from_static(b"{\"a\":1}"),
            None,
            &url,
        )
        .unwrap();
        assert_eq!(ok.json, json!({"a": 1}));
        let refused = classify_answer(
            422,
            "application/problem+json",
            Bytes::from_static(b"{\"title\":\"bad\"}"),
            None,
            &url,
        )
        .unwrap();
        assert_eq!(
            (refused.status, refused.content_type.as_str()),
            (422, "application/problem+json")
        );
        assert!(matches!(
            classify_answer(503, "", Bytes::new(), Some(7), &url),
            Err(GatewayError::Overloaded {
                retry_after: Some(7),
                ..
            })
        ));
        let e = classify_answer(500, "", Bytes::new(), None, &url).unwrap_err();
        assert!(matches!(e, GatewayError::BadAnswer(_)));
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(matches!(
            classify_answer(200, "text/html", Bytes::from_static(b"<html>"), None, &url),
            Err(GatewayError::BadAnswer(_))
        ));
    }
}
