//! The wire protocols the gateway calls agents with, one module per
//! binding protocol behind one interface (`call` for a whole answer,
//! `open_stream` for events): `rest` (AIDIP REST, `https`/`http`: the
//! plain input is the body), `woa` (WoA REST: the invocation envelope),
//! `mcp` (the envelope becomes a `tools/call` over Streamable HTTP, WoA
//! 5.3), `agent_protocol` (a ChatRequest on `stream_request`, its events
//! collected until RunCompleted) and `a2a` (`SendMessage` over JSON-RPC or
//! HTTP+JSON, A2A 1.0 or 0.3, or over gRPC in 1.0: `a2a_grpc`).
//!
//! Answers are classified here once: a 2xx JSON body is the agent's output,
//! a 4xx JSON body is passed through as the agent's own refusal, 503 is
//! "overloaded", other 5xx and anything that is not JSON are bad answers.

pub mod a2a;
mod a2a_grpc;
mod agent_protocol;
mod mcp;
mod mcp_session;
mod rest;
mod woa;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::Value;
use url::Url;

pub use agent_protocol::ap_url;
pub(crate) use mcp::{session_headers, Peer};
pub(crate) use mcp_session::in_session;

use super::outbound::{classify, read_limited, redacted, Lookup, OutboundError, OutboundPolicy};
use super::tls::TlsFiles;
use crate::domain::{Binding, Protocol};
use crate::listener::FileStamps;

/// Whether the gateway can call a binding: a protocol it speaks, in a
/// form it supports (an A2A 0.3 interface over gRPC is not).
pub fn callable(b: &Binding) -> bool {
    match b.known_protocol() {
        Some(Protocol::A2a) => a2a::callable(b),
        Some(_) => true,
        None => false,
    }
}

/// Why a call produced no usable answer.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The agent refused the credentials the call carried (`status` 401
    /// or 403) where its protocol has no answer body of its own to pass on
    /// (an MCP server refuses at the HTTP level).
    #[error("{message}")]
    Refused {
        status: u16,
        message: String,
        /// The agent's `WWW-Authenticate`, when it sent one.
        challenge: Option<String>,
    },
}

/// The guarded client and its policy, and the TLS files the client is
/// rebuilt from when they change (clones share one client).
#[derive(Clone)]
pub struct Outbound {
    pub policy: Arc<OutboundPolicy>,
    lookup: Lookup,
    tls: Arc<TlsFiles>,
    current: Arc<Mutex<Current>>,
    /// MCP sessions kept on this client.
    mcp: Arc<mcp_session::Sessions>,
}

struct Current {
    client: reqwest::Client,
    stamps: FileStamps,
    /// gRPC channels (A2A over gRPC) by origin, opened with the same TLS
    /// files as `client`.
    grpc: std::collections::HashMap<String, tonic::transport::Channel>,
}

/// gRPC channels kept at most per gateway client; past it they are all
/// dropped and opened again as calls need them.
const MAX_GRPC_CHANNELS: usize = 256;

impl Outbound {
    pub fn new(policy: OutboundPolicy, lookup: Lookup, tls: TlsFiles) -> Result<Self, String> {
        let policy = Arc::new(policy);
        let client = super::outbound::client(policy.clone(), lookup.clone(), tls.load()?)?;
        Ok(Self {
            current: Arc::new(Mutex::new(Current {
                client,
                stamps: FileStamps::new(tls.paths()),
                grpc: Default::default(),
            })),
            policy,
            lookup,
            tls: Arc::new(tls),
            mcp: Arc::default(),
        })
    }

    /// The same policy and trust, presenting another client certificate
    /// (a credential's own, for the agents it names).
    pub fn presenting(&self, cert: PathBuf, key: PathBuf) -> Result<Self, String> {
        Self::new(
            (*self.policy).clone(),
            self.lookup.clone(),
            self.tls.presenting(cert, key),
        )
    }

    /// Whether a client certificate is presented to agents that ask.
    pub fn presents_certificate(&self) -> bool {
        self.tls.client_cert_file.is_some()
    }

    /// The client for the next request: rebuilt first when a TLS file
    /// changed (checked at most once a second); a change that does not
    /// load keeps the previous client.
    pub fn client(&self) -> reqwest::Client {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stamps) = current.stamps.changed() {
            let rebuilt = self.tls.load().and_then(|material| {
                super::outbound::client(self.policy.clone(), self.lookup.clone(), material)
            });
            match rebuilt {
                Ok(client) => {
                    tracing::info!(files = ?self.tls.paths(), "the gateway's TLS files changed; reloaded");
                    current.client = client;
                    current.stamps.settle(stamps);
                    // Sessions and channels opened on the previous client
                    // would go on presenting its certificate.
                    self.mcp.clear();
                    current.grpc.clear();
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "the gateway's TLS files changed but cannot be loaded; keeping the previous ones"
                ),
            }
        }
        current.client.clone()
    }

    /// The kept gRPC channel to `url`'s origin: connected lazily through
    /// the outbound guard (`a2a_grpc::GuardedConnector`), with TLS that
    /// trusts and presents what the HTTP client does.
    fn grpc_channel(&self, url: &Url) -> Result<tonic::transport::Channel, GatewayError> {
        self.policy.check_url(url)?;
        // Notices rotated TLS files first, which drops the channels.
        self.client();
        let origin = url.origin().ascii_serialization();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = current.grpc.get(&origin) {
            return Ok(channel.clone());
        }
        let unusable = |e: String| {
            GatewayError::Unsupported(format!("the gRPC interface {}: {e}", redacted(url)))
        };
        let mut endpoint = tonic::transport::Endpoint::from_shared(origin.clone())
            .map_err(|e| unusable(e.to_string()))?
            .connect_timeout(self.policy.connect_timeout)
            .user_agent(concat!("agentry/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| unusable(e.to_string()))?;
        if url.scheme() == "https" {
            endpoint = endpoint
                .tls_config(self.tls.grpc().map_err(unusable)?)
                .map_err(|e| unusable(crate::error_chain(&e)))?;
        }
        let channel = endpoint.connect_with_connector_lazy(a2a_grpc::GuardedConnector {
            policy: self.policy.clone(),
            lookup: self.lookup.clone(),
        });
        if current.grpc.len() >= MAX_GRPC_CHANNELS {
            current.grpc.clear();
        }
        current.grpc.insert(origin, channel.clone());
        Ok(channel)
    }

    fn mcp_sessions(&self) -> Arc<mcp_session::Sessions> {
        self.mcp.clone()
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
            .client()
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
    /// The operation called: a declared one, or the MCP tool a call to an
    /// MCP server without declared operations names (`domain::invoke`).
    pub operation: Option<&'a str>,
    /// The agent declares several operations: AIDIP REST then names the
    /// one called in the body (AIDIP 5: `"operation": ...`).
    pub name_operation: bool,
    pub input: &'a Value,
    pub stream: bool,
    /// Credentials and the idempotency key, as (header, value).
    pub headers: Vec<(String, String)>,
    /// The A2A task this call answers (other protocols have no tasks).
    pub continues: Option<&'a a2a::Continuation>,
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
    /// The agent's `WWW-Authenticate` on a refusal of the call's
    /// credentials (`challenge`), as it sent it: every transport's answer
    /// is held to one bound where it is finished
    /// (`service::invocation::finish`).
    pub challenge: Option<String>,
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

pub(super) fn endpoint(b: &Binding) -> Result<Url, GatewayError> {
    Url::parse(&b.endpoint).map_err(|e| {
        GatewayError::Unsupported(format!(
            "the binding endpoint {} is not a URL: {e}",
            b.endpoint
        ))
    })
}

/// What the agent asks for when it refuses the call's credentials: its
/// `WWW-Authenticate` challenges on a 401 (or a 403, RFC 6750's
/// `insufficient_scope`), joined into one list as RFC 9110 allows.
fn challenge(resp: &reqwest::Response) -> Option<String> {
    if !matches!(resp.status().as_u16(), 401 | 403) {
        return None;
    }
    let all: Vec<&str> = resp
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    let joined = all.join(", ");
    (!joined.is_empty()).then_some(joined)
}

fn retry_after(resp: &reqwest::Response) -> Option<u32> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// POSTs `body` to the binding's endpoint and waits for the response head.
async fn post(
    out: &Outbound,
    spec: &CallSpec<'_>,
    body: &Value,
    accept: &str,
) -> Result<(reqwest::Response, Url), GatewayError> {
    let url = endpoint(spec.binding)?;
    let resp = exchange(
        out,
        reqwest::Method::POST,
        &url,
        Some(body),
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
        .client()
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
    let challenge = challenge(&resp);
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = read_limited(resp, out.policy.max_response_bytes, out.policy.timeout).await?;
    let mut answer = classify_answer(status, &content_type, Bytes::from(body), retry, url)?;
    answer.challenge = challenge;
    Ok(answer)
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
            challenge: None,
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
        challenge: None,
    })
}

/// Calls the agent and waits for its whole answer.
pub async fn call(out: &Outbound, spec: &CallSpec<'_>) -> Result<Answer, GatewayError> {
    match protocol(spec.binding)? {
        Protocol::Https | Protocol::Http => rest::call(out, spec).await,
        Protocol::WoaRest => woa::call(out, spec).await,
        // Boxed: rmcp's session future is large and deeply nested.
        Protocol::Mcp => Box::pin(mcp::call(out, spec)).await,
        Protocol::AgentProtocol => agent_protocol::call(out, spec).await,
        Protocol::A2a => a2a::call(out, spec).await,
    }
}

/// Calls the agent asking for a stream of events. Agents that answer with
/// one JSON body (and MCP tools) give a whole answer instead.
pub async fn open_stream(out: &Outbound, spec: &CallSpec<'_>) -> Result<Started, GatewayError> {
    match protocol(spec.binding)? {
        Protocol::Https | Protocol::Http => rest::open_stream(out, spec).await,
        Protocol::WoaRest => woa::open_stream(out, spec).await,
        Protocol::Mcp => Box::pin(mcp::call(out, spec)).await.map(Started::Whole),
        Protocol::AgentProtocol => agent_protocol::open_stream(out, spec).await,
        Protocol::A2a => a2a::open_stream(out, spec).await,
    }
}

fn protocol(b: &Binding) -> Result<Protocol, GatewayError> {
    b.known_protocol().ok_or_else(|| {
        GatewayError::Unsupported(format!("the gateway cannot call '{}' bindings", b.protocol))
    })
}

/// `bytes` while the count in `seen` stays within `limit`: the stream
/// ends before the chunk that would pass it, and `over` is set. `seen` is
/// shared so that its reader can start the count again (`relay` does, at
/// each whole event).
pub(super) fn capped(
    bytes: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    limit: usize,
    seen: Arc<AtomicUsize>,
    over: Arc<AtomicBool>,
) -> impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static {
    bytes.take_while(move |chunk| {
        let len = chunk.as_ref().map_or(0, |c| c.len());
        let fits = seen.load(Ordering::Relaxed) + len <= limit;
        if fits {
            seen.fetch_add(len, Ordering::Relaxed);
        } else {
            over.store(true, Ordering::Relaxed);
        }
        futures::future::ready(fits)
    })
}

/// The agent's server-sent events, one at a time, each within `idle` of
/// the one before and no larger than `limit`. Dropping the stream drops
/// the connection, which is how a client's disconnect reaches the agent.
///
/// An event is only measured once it is whole, and until then its bytes
/// pile up in the parser: an agent that never ends its event would fill
/// the memory for as long as `idle` lasts. So the bytes received since the
/// last event are held to twice `limit` (room for the event's field names
/// and line breaks), and past that the stream ends as too large.
fn relay(
    resp: reqwest::Response,
    target: String,
    idle: Duration,
    limit: usize,
) -> BoxStream<'static, Result<Event, GatewayError>> {
    let unparsed = Arc::new(AtomicUsize::new(0));
    let over = Arc::new(AtomicBool::new(false));
    let bytes = capped(
        resp.bytes_stream(),
        limit.saturating_mul(2),
        unparsed.clone(),
        over.clone(),
    );
    let events = sse_stream::SseStream::from_bytes_stream(bytes);
    futures::stream::unfold(
        (Box::pin(events), target, false),
        move |(mut events, target, done)| {
            let (unparsed, over) = (unparsed.clone(), over.clone());
            async move {
                if done {
                    return None;
                }
                let next = loop {
                    let next = tokio::time::timeout(idle, events.next()).await;
                    if let Ok(Some(Ok(_))) = &next {
                        unparsed.store(0, Ordering::Relaxed);
                    }
                    match next {
                        Err(_) => {
                            break Some(Err(GatewayError::from(OutboundError::Timeout {
                                target: target.clone(),
                                ms: idle.as_millis(),
                            })))
                        }
                        Ok(None) if over.load(Ordering::Relaxed) => {
                            break Some(Err(GatewayError::from(OutboundError::TooLarge {
                                target: target.clone(),
                                limit,
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
            }
        },
    )
    .boxed()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub(super) fn binding(protocol: &str, extra: Value) -> Binding {
        Binding {
            protocol: protocol.into(),
            endpoint: "https://agents.example/invoke".into(),
            extra: extra.as_object().cloned().unwrap_or_default(),
            ..Default::default()
        }
    }

    pub(super) fn spec<'a>(
        b: &'a Binding,
        input: &'a Value,
        op: Option<&'a str>,
        many: bool,
    ) -> CallSpec<'a> {
        CallSpec {
            binding: b,
            operation: op,
            name_operation: many,
            input,
            stream: false,
            headers: Vec::new(),
            continues: None,
        }
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
