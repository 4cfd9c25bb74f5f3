//! MCP sessions kept across calls. A call in a session of its own costs
//! four HTTP exchanges (`initialize`, the `initialized` notification, the
//! request, closing the session); a session kept per server and credential
//! costs one per call after the first, as MCP clients keep theirs.
//!
//! A kept session can end on the server's side at any time (its idle
//! timeout, a restart). The server then answers the session's id with 404
//! before it does anything with the request (MCP 2025-06-18, Session
//! Management), so the request is sent once more in a new session. Only
//! then: any other failure may have come after a tool's side effects, and
//! is reported as it is.
//!
//! rmcp's own reqwest client reads any answer with a JSON body as a
//! JSON-RPC message, whatever its status. A 404 or 500 whose body is a
//! JSON-RPC error without the request's id (the Python SDK's "Session not
//! found") would then leave the call waiting for its timeout; `StatusAware`
//! turns such statuses into errors at once.
//!
//! Every answer is also held to the outbound policy's `max_response_bytes`
//! as it arrives (rmcp reads a JSON body whole and an event stream without
//! end). And a request is sent from the stream its answer is read from,
//! not in place: rmcp's worker awaits `post_message` before it sends the
//! session's next request, and a server that answers in a JSON body sends
//! nothing until its tool is done, so one slow call would hold every other
//! call of the session. A JSON answer becomes a one-event stream; a
//! failure, the gateway's own JSON-RPC error for the request. The
//! session's standalone event stream (the GET that carries what the
//! server sends outside a request) is not opened: the gateway has no use
//! for it, and it held a connection on the server for each kept session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, RequestId, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};
use tokio::sync::OnceCell;
use url::Url;

use super::mcp::{Peer, Session};
use super::{capped, redacted, GatewayError, Outbound, OutboundError};

/// A kept session unused this long is closed: its server keeps state
/// for it.
const IDLE: Duration = Duration::from_secs(60);
/// A session is started anew after this long, used or not, so credentials
/// and addresses are looked at again now and then.
const MAX_AGE: Duration = Duration::from_secs(600);
/// Sessions kept at most per gateway client; past it the least recently
/// used is closed.
const MAX_KEPT: usize = 256;
/// How often idle and old sessions are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(15);
/// How much of a refusal's body its error quotes.
const QUOTED: usize = 512;
/// JSON-RPC error codes (in the range JSON-RPC leaves to implementations)
/// of the errors the gateway answers a request with itself: the server's
/// answer passed the size limit; the server no longer knows the session;
/// it refused the credentials (`data.status` 401 or 403, `data.challenge`
/// its `WWW-Authenticate`); the request got
/// no answer (unreachable, an error status).
const ANSWER_TOO_LARGE: i32 = -32099;
const SESSION_GONE: i32 = -32098;
const CREDENTIALS_REFUSED: i32 = -32097;
const NOT_ANSWERED: i32 = -32096;

/// The mark (`data.agentry`) on the gateway's own error events, drawn once
/// per process and never sent: a server's error that reuses one of the
/// codes above is read as the server's error, so a server cannot pass
/// itself off as having lost the session (the call would be sent again),
/// as a refusal of the caller's credentials, or as too large.
fn own_mark() -> &'static str {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

/// The MCP sessions of one gateway client, by server and credential.
#[derive(Default)]
pub(super) struct Sessions {
    kept: Mutex<HashMap<Key, Arc<Kept>>>,
    sweeping: std::sync::atomic::AtomicBool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    url: String,
    /// The credential's headers (`mcp::session_headers`).
    headers: Vec<(String, String)>,
}

/// One kept session, started by the first call that needs it; callers
/// that arrive meanwhile wait for that start instead of starting their
/// own.
struct Kept {
    session: OnceCell<Session>,
    born: Instant,
    used: Mutex<Instant>,
}

impl Kept {
    fn stale(&self, now: Instant) -> bool {
        let used = *self.used.lock().unwrap_or_else(|e| e.into_inner());
        now.duration_since(self.born) > MAX_AGE
            || now.duration_since(used) > IDLE
            || self.session.get().is_some_and(|s| s.is_closed())
    }
}

impl Sessions {
    /// Closes every kept session (the client they were started on was
    /// replaced).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Kept>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The session for `key`, and whether it was already running (kept
    /// from an earlier call) rather than started now.
    async fn get(
        self: &Arc<Self>,
        out: &Outbound,
        url: &Url,
        key: &Key,
    ) -> Result<(Arc<Kept>, bool), GatewayError> {
        let now = Instant::now();
        let kept = {
            let mut kept = self.lock();
            match kept.get(key) {
                Some(k) if !k.stale(now) => k.clone(),
                _ => {
                    if kept.len() >= MAX_KEPT {
                        kept.retain(|_, k| !k.stale(now));
                    }
                    if kept.len() >= MAX_KEPT {
                        let oldest = kept
                            .iter()
                            .min_by_key(|(_, k)| *k.used.lock().unwrap_or_else(|e| e.into_inner()))
                            .map(|(key, _)| key.clone());
                        if let Some(oldest) = oldest {
                            kept.remove(&oldest);
                        }
                    }
                    let fresh = Arc::new(Kept {
                        session: OnceCell::new(),
                        born: now,
                        used: Mutex::new(now),
                    });
                    kept.insert(key.clone(), fresh.clone());
                    fresh
                }
            }
        };
        self.sweep_later();
        *kept.used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        let running = kept.session.initialized();
        kept.session
            .get_or_try_init(|| start(out, url, &key.headers))
            .await?;
        Ok((kept, running))
    }

    /// Drops `kept` if it is still the session for `key`.
    fn forget(&self, key: &Key, kept: &Arc<Kept>) {
        let mut map = self.lock();
        if map.get(key).is_some_and(|k| Arc::ptr_eq(k, kept)) {
            map.remove(key);
        }
    }

    /// Starts the task that closes idle and old sessions, once; it ends
    /// with the gateway client.
    fn sweep_later(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let sessions: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                let now = Instant::now();
                sessions.lock().retain(|_, k| !k.stale(now));
            }
        });
    }
}

/// Initialises a session over Streamable HTTP on the guarded client,
/// every request of it carrying `headers`.
async fn start(
    out: &Outbound,
    url: &Url,
    headers: &[(String, String)],
) -> Result<Session, GatewayError> {
    use rmcp::transport::streamable_http_client::{
        StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
    };
    use rmcp::ServiceExt;
    let transport = StreamableHttpClientTransport::with_client(
        StatusAware {
            client: out.client(),
            headers: Arc::new(header_map(headers)?),
            limit: out.policy.max_response_bytes,
            timeout: out.policy.timeout,
        },
        StreamableHttpClientTransportConfig {
            uri: url.as_str().into(),
            ..Default::default()
        },
    );
    ().serve(transport).await.map_err(|e| {
        let target = redacted(url);
        if let rmcp::service::ClientInitializeError::TransportError { error, .. } = &e {
            if let Some(Refusal { status, challenge }) = credentials_refused(error.error.as_ref()) {
                return GatewayError::Refused {
                    status,
                    message: format!(
                        "the MCP server at {target} refused the credentials (HTTP {status}) when the session started"
                    ),
                    challenge,
                };
            }
        }
        OutboundError::Unreachable {
            target,
            reason: format!("the MCP session did not start: {e}"),
        }
        .into()
    })
}

/// `headers` as a session sends them. A header name the agent's record or
/// a credential's configuration got wrong makes the binding uncallable;
/// the caller's own values were checked when the call was taken.
fn header_map(headers: &[(String, String)]) -> Result<reqwest::header::HeaderMap, GatewayError> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            GatewayError::Unsupported(format!(
                "the credential header '{name}' is not an HTTP header name"
            ))
        })?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            GatewayError::Unsupported(format!(
                "the credential for header '{name}' cannot be sent in an HTTP header"
            ))
        })?;
        value.set_sensitive(true);
        map.append(name, value);
    }
    Ok(map)
}

/// A refusal of the request's credentials: the status (401 or 403) and
/// the server's challenge, when it sent one.
#[derive(Debug, PartialEq)]
struct Refusal {
    status: u16,
    challenge: Option<String>,
}

/// The refusal of the request's credentials that `error` (a transport
/// failure) was, if it was one.
fn credentials_refused(error: &(dyn std::error::Error + Send + Sync + 'static)) -> Option<Refusal> {
    refusal(error.downcast_ref::<StreamableHttpError<McpHttpError>>()?)
}

fn refusal(e: &StreamableHttpError<McpHttpError>) -> Option<Refusal> {
    match e {
        StreamableHttpError::AuthRequired(a) => Some(Refusal {
            status: 401,
            challenge: Some(a.www_authenticate_header.clone()),
        }),
        StreamableHttpError::Client(McpHttpError::Status {
            status: status @ (401 | 403),
            ..
        }) => Some(Refusal {
            status: *status,
            challenge: None,
        }),
        _ => None,
    }
}

/// One request in the kept session for its server and credential (started
/// first if there is none): the address checked by the outbound policy
/// first, the whole exchange within the policy's timeout. A kept session
/// the server no longer knows is replaced and the request sent again
/// once. `what` names the request in a refusal; `headers` (the
/// credential, `mcp::session_headers`) go with every request of the
/// session.
pub(crate) async fn in_session<T, F>(
    out: &Outbound,
    url: &Url,
    headers: Vec<(String, String)>,
    what: &str,
    request: impl Fn(Peer) -> F,
) -> Result<T, GatewayError>
where
    F: std::future::Future<Output = Result<T, rmcp::ServiceError>>,
{
    out.preflight(url).await?;
    let target = redacted(url);
    let timeout = out.policy.timeout;
    let sessions = out.mcp_sessions();
    let key = Key {
        url: url.as_str().to_string(),
        headers,
    };
    let limit = out.policy.max_response_bytes;
    let run = async {
        let mut retried = false;
        loop {
            let (kept, running) = sessions.get(out, url, &key).await?;
            let Some(session) = kept.session.get() else {
                return Err(GatewayError::BadAnswer(format!(
                    "the MCP session with {target} did not start"
                )));
            };
            let e = match request(session.peer().clone()).await {
                Ok(v) => return Ok(v),
                Err(e) => failure(&e),
            };
            if matches!(e, Failure::SessionGone) {
                sessions.forget(&key, &kept);
                if running && !retried {
                    tracing::debug!(%target, "the MCP server ended a kept session; starting another");
                    retried = true;
                    continue;
                }
            } else if session.is_closed() {
                sessions.forget(&key, &kept);
            }
            return Err(refused(&target, what, limit, e));
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| OutboundError::Timeout {
            target: target.clone(),
            ms: timeout.as_millis(),
        })?
}

/// True for an error the gateway answered itself (`error_event`).
fn is_own(error: &rmcp::model::ErrorData) -> bool {
    error
        .data
        .as_ref()
        .and_then(|d| d.get("agentry"))
        .and_then(serde_json::Value::as_str)
        == Some(own_mark())
}

/// How a request failed, whether that came back as a transport error (a
/// message sent in place) or as the gateway's own error event (a request
/// sent from its answer's stream, `failure_event`).
enum Failure {
    /// The server answered 404 to the session's id.
    SessionGone,
    /// The server refused the credentials (401 or 403).
    Refused(Refusal),
    /// The answer passed the size limit.
    TooLarge,
    /// Anything else, by its cause.
    Other(String),
}

fn failure(e: &rmcp::ServiceError) -> Failure {
    match e {
        rmcp::ServiceError::McpError(error) if is_own(error) => match error.code.0 {
            ANSWER_TOO_LARGE => Failure::TooLarge,
            SESSION_GONE => Failure::SessionGone,
            CREDENTIALS_REFUSED => {
                let data = error.data.as_ref();
                match data.and_then(|d| d["status"].as_u64()) {
                    Some(status @ (401 | 403)) => Failure::Refused(Refusal {
                        status: status as u16,
                        challenge: data
                            .and_then(|d| d["challenge"].as_str())
                            .map(str::to_string),
                    }),
                    _ => Failure::Other(error.message.to_string()),
                }
            }
            _ => Failure::Other(error.message.to_string()),
        },
        rmcp::ServiceError::TransportSend(sent) => {
            let error = sent.error.as_ref();
            if let Some(StreamableHttpError::Client(McpHttpError::SessionGone)) =
                error.downcast_ref::<StreamableHttpError<McpHttpError>>()
            {
                return Failure::SessionGone;
            }
            match credentials_refused(error) {
                Some(r) => Failure::Refused(r),
                None => Failure::Other(error.to_string()),
            }
        }
        other => Failure::Other(other.to_string()),
    }
}

/// A failed request as the caller reads it: a refusal of its credentials
/// as such, an answer past the size limit as such, anything else by its
/// cause (without rmcp's transport type names).
fn refused(target: &str, what: &str, limit: usize, failure: Failure) -> GatewayError {
    let cause = match failure {
        Failure::TooLarge => {
            return OutboundError::TooLarge {
                target: target.into(),
                limit,
            }
            .into();
        }
        Failure::Refused(Refusal { status, challenge }) => {
            return GatewayError::Refused {
                status,
                message: format!(
                    "the MCP server at {target} refused the credentials of {what} (HTTP {status})"
                ),
                challenge,
            };
        }
        Failure::SessionGone => McpHttpError::SessionGone.to_string(),
        Failure::Other(cause) => cause,
    };
    GatewayError::BadAnswer(format!(
        "the MCP server at {target} refused {what}: {cause}"
    ))
}

/// What the gateway's MCP client reports beyond rmcp's own errors.
#[derive(Debug, thiserror::Error)]
pub enum McpHttpError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("the server no longer knows the session (HTTP 404)")]
    SessionGone,
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
}

/// rmcp's Streamable HTTP client over the gateway's guarded reqwest
/// client, answering an error status as an error and holding answers to
/// a size.
#[derive(Clone)]
struct StatusAware {
    client: reqwest::Client,
    /// The session's credential, on every request (rmcp's own client
    /// sends only a bearer token, in `Authorization`).
    headers: Arc<reqwest::header::HeaderMap>,
    /// The most bytes one answer may carry.
    limit: usize,
    /// How long a call's exchange may last: its caller has gone by then,
    /// and a server that never answers must not keep a task and a
    /// connection per abandoned call for the rest of the session.
    timeout: Duration,
}

/// An event carrying a JSON-RPC error for request `id`, which the
/// gateway answers itself.
fn error_event(id: &RequestId, code: i32, message: String, data: serde_json::Value) -> Sse {
    let mut data = match data {
        serde_json::Value::Object(o) => o,
        _ => serde_json::Map::new(),
    };
    data.insert("agentry".into(), own_mark().into());
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": data},
    });
    Sse {
        data: Some(error.to_string()),
        ..Sse::default()
    }
}

/// The events of an answer (an event stream, or one JSON message as a
/// single event), held to `limit` bytes. When the limit cuts it short,
/// request `id` (if it was one) is answered with `ANSWER_TOO_LARGE` so
/// that the call ends at once instead of at its timeout.
fn answer_events(
    resp: reqwest::Response,
    json: bool,
    limit: usize,
    id: Option<RequestId>,
) -> BoxStream<'static, Result<Sse, SseError>> {
    let over = Arc::new(AtomicBool::new(false));
    let bytes = capped(resp.bytes_stream(), limit, Default::default(), over.clone());
    let events = if json {
        let id = id.clone();
        let cut = over.clone();
        futures::stream::once(async move {
            let mut body = Vec::new();
            let mut bytes = std::pin::pin!(bytes);
            while let Some(chunk) = bytes.next().await {
                body.extend_from_slice(&chunk.map_err(|e| SseError::Body(Box::new(e)))?);
            }
            let text = String::from_utf8(body)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    serde_json::from_str::<ServerJsonRpcMessage>(&text)
                        .map(|_| text)
                        .map_err(|e| e.to_string())
                });
            Ok(match (text, &id) {
                (Ok(text), _) => Sse {
                    data: Some(text),
                    ..Sse::default()
                },
                // Cut short: the tail below answers.
                (Err(_), _) if cut.load(Ordering::Relaxed) => Sse::default(),
                (Err(why), Some(id)) => error_event(
                    id,
                    rmcp::model::ErrorCode::INTERNAL_ERROR.0,
                    format!("the server answered with JSON that is not a JSON-RPC message: {why}"),
                    serde_json::Value::Null,
                ),
                (Err(_), None) => Sse::default(),
            })
        })
        .boxed()
    } else {
        SseStream::from_bytes_stream(bytes).boxed()
    };
    let tail = futures::stream::iter([()]).filter_map(move |()| {
        let event = match &id {
            Some(id) if over.load(Ordering::Relaxed) => Some(Ok(error_event(
                id,
                ANSWER_TOO_LARGE,
                format!("the answer is larger than the gateway's limit of {limit} bytes"),
                serde_json::Value::Null,
            ))),
            _ => None,
        };
        futures::future::ready(event)
    });
    events.chain(tail).boxed()
}

/// The start of an error answer's body, for its error.
async fn quoted(resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut chunks = resp.bytes_stream();
    while let Some(Ok(chunk)) = chunks.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= QUOTED {
            break;
        }
    }
    body.truncate(QUOTED);
    String::from_utf8_lossy(&body).trim().to_string()
}

/// What a POST got back, before its body is read.
enum Sent {
    /// 202 or 204: a notification or response taken.
    Accepted,
    /// An answer: an event stream, or a JSON body (`json`).
    Answer {
        resp: reqwest::Response,
        json: bool,
        session: Option<String>,
    },
}

impl StatusAware {
    /// One POST of `message`, its error statuses read as errors.
    async fn send(
        &self,
        uri: &str,
        message: &ClientJsonRpcMessage,
        session_id: Option<&str>,
    ) -> Result<Sent, StreamableHttpError<McpHttpError>> {
        let mut req = self
            .client
            .post(uri)
            .headers((*self.headers).clone())
            .header(
                reqwest::header::ACCEPT,
                format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"),
            )
            .json(message);
        if let Some(id) = session_id {
            req = req.header(HEADER_SESSION_ID, id);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            if let Some(challenge) = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
            {
                return Err(StreamableHttpError::AuthRequired(AuthRequiredError {
                    www_authenticate_header: challenge.to_string(),
                }));
            }
        }
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(Sent::Accepted);
        }
        if status == reqwest::StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::Client(McpHttpError::SessionGone));
        }
        if !status.is_success() {
            return Err(StreamableHttpError::Client(McpHttpError::Status {
                status: status.as_u16(),
                body: quoted(resp).await,
            }));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let session = header(HEADER_SESSION_ID);
        let json = match header(reqwest::header::CONTENT_TYPE.as_str()) {
            Some(t) if t.starts_with(EVENT_STREAM_MIME_TYPE) => false,
            Some(t) if t.starts_with(JSON_MIME_TYPE) => true,
            other => return Err(StreamableHttpError::UnexpectedContentType(other)),
        };
        Ok(Sent::Answer {
            resp,
            json,
            session,
        })
    }
}

/// A failed exchange for request `id` as the JSON-RPC error the call gets,
/// in the codes `failure` reads back.
fn failure_event(id: &RequestId, e: &StreamableHttpError<McpHttpError>) -> Sse {
    let (code, data) = match (e, refusal(e)) {
        (_, Some(Refusal { status, challenge })) => (
            CREDENTIALS_REFUSED,
            serde_json::json!({ "status": status, "challenge": challenge }),
        ),
        (StreamableHttpError::Client(McpHttpError::SessionGone), _) => {
            (SESSION_GONE, serde_json::Value::Null)
        }
        _ => (NOT_ANSWERED, serde_json::Value::Null),
    };
    error_event(id, code, e.to_string(), data)
}

impl StreamableHttpClient for StatusAware {
    type Error = McpHttpError;

    /// The session's start and notifications are sent here and now. A
    /// request after the start is sent from the answer's stream instead,
    /// which rmcp reads beside its other work: the worker awaits this
    /// function before it sends the session's next request, and a server
    /// that answers in JSON sends nothing until its tool is done. Such a
    /// request's failure is then its error event (`failure_event`).
    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _bearer: Option<String>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<McpHttpError>> {
        let (id, start) = match &message {
            ClientJsonRpcMessage::Request(request) => (
                Some(request.id.clone()),
                matches!(request.request, ClientRequest::InitializeRequest(_)),
            ),
            _ => (None, false),
        };
        match id {
            Some(id) if !start => {
                let this = self.clone();
                let due = tokio::time::Instant::now() + self.timeout;
                let events = futures::stream::once(async move {
                    let sent = this.send(&uri, &message, session_id.as_deref()).await;
                    match sent {
                        Ok(Sent::Answer { resp, json, .. }) => {
                            answer_events(resp, json, this.limit, Some(id))
                        }
                        Ok(Sent::Accepted) => {
                            let e = StreamableHttpError::UnexpectedServerResponse(
                                "the request was accepted without an answer".into(),
                            );
                            futures::stream::iter([Ok(failure_event(&id, &e))]).boxed()
                        }
                        Err(e) => futures::stream::iter([Ok(failure_event(&id, &e))]).boxed(),
                    }
                })
                .flatten()
                .take_until(tokio::time::sleep_until(due))
                .boxed();
                Ok(StreamableHttpPostResponse::Sse(events, None))
            }
            _ => match self.send(&uri, &message, session_id.as_deref()).await? {
                Sent::Accepted => Ok(StreamableHttpPostResponse::Accepted),
                Sent::Answer {
                    resp,
                    json,
                    session,
                } => Ok(StreamableHttpPostResponse::Sse(
                    answer_events(resp, json, self.limit, id),
                    session,
                )),
            },
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _bearer: Option<String>,
    ) -> Result<(), StreamableHttpError<McpHttpError>> {
        let resp = self
            .client
            .delete(uri.as_ref())
            .headers((*self.headers).clone())
            .header(HEADER_SESSION_ID, session_id.as_ref())
            .send()
            .await
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        // A server that keeps no sessions it can end says so with 405.
        if resp.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        resp.error_for_status()
            .map(drop)
            .map_err(|e| StreamableHttpError::Client(e.into()))
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        last_event_id: Option<String>,
        _bearer: Option<String>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<McpHttpError>> {
        // Without an event id this is the standalone stream, not opened
        // (see the module's doc); with one, an answer's broken stream
        // resumed, held to the same size.
        let Some(last_event_id) = last_event_id else {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        };
        let resp = self
            .client
            .get(uri.as_ref())
            .headers((*self.headers).clone())
            .header(reqwest::header::ACCEPT, EVENT_STREAM_MIME_TYPE)
            .header(HEADER_SESSION_ID, session_id.as_ref())
            .header(HEADER_LAST_EVENT_ID, last_event_id)
            .send()
            .await
            .map_err(|e| StreamableHttpError::Client(e.into()))?;
        let status = resp.status();
        if status == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            return Err(StreamableHttpError::Client(McpHttpError::Status {
                status: status.as_u16(),
                body: quoted(resp).await,
            }));
        }
        Ok(answer_events(resp, false, self.limit, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server answering every POST with `status`, `content_type` and
    /// `body`.
    async fn answering(status: u16, content_type: &'static str, body: String) -> String {
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(move || async move {
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", content_type)],
                    body,
                )
            }),
        );
        format!("{}/mcp", serving(app).await)
    }

    /// The base URL of `app`, served on a loopback port.
    async fn serving(app: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    /// A JSON-RPC error without a request id, as the Python SDK answers an
    /// unknown session.
    async fn failing_with(status: u16) -> String {
        let body =
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}"#;
        answering(status, "application/json", body.into()).await
    }

    fn client() -> StatusAware {
        StatusAware {
            client: reqwest::Client::new(),
            headers: Default::default(),
            limit: 1 << 10,
            timeout: Duration::from_secs(5),
        }
    }

    fn tools_list() -> ClientJsonRpcMessage {
        serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
        ))
        .unwrap()
    }

    async fn sent(uri: &str, session: Option<&str>) -> StreamableHttpError<McpHttpError> {
        match client().send(uri, &tools_list(), session).await {
            Err(e) => e,
            Ok(_) => panic!("an error status was read as an answer"),
        }
    }

    /// The messages of the answer to a request posted to `uri` in
    /// session `s-1`.
    async fn messages(uri: &str) -> Vec<ServerJsonRpcMessage> {
        messages_from(client(), uri).await
    }

    async fn messages_from(client: StatusAware, uri: &str) -> Vec<ServerJsonRpcMessage> {
        let answer = client
            .post_message(uri.into(), tools_list(), Some(Arc::from("s-1")), None)
            .await;
        let Ok(StreamableHttpPostResponse::Sse(events, _)) = answer else {
            panic!("a request is answered by its stream");
        };
        let events: Vec<_> = events.collect().await;
        events
            .into_iter()
            .filter_map(|e| e.unwrap().data.filter(|d| !d.is_empty()))
            .map(|data| serde_json::from_str(&data).unwrap())
            .collect()
    }

    /// How a request posted to `uri` fails, as the call reads it back from
    /// the last message of its answer.
    async fn call_failure(uri: &str) -> Failure {
        match messages(uri).await.pop() {
            Some(ServerJsonRpcMessage::Error(e)) => {
                assert_eq!(e.id, RequestId::Number(7));
                failure(&rmcp::ServiceError::McpError(e.error))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn error_statuses_are_errors_and_a_forgotten_session_is_told_apart() {
        let gone = failing_with(404).await;
        assert!(matches!(
            sent(&gone, Some("s-1")).await,
            StreamableHttpError::Client(McpHttpError::SessionGone)
        ));
        // Without a session there is none to forget: a plain 404.
        assert!(matches!(
            sent(&gone, None).await,
            StreamableHttpError::Client(McpHttpError::Status { status: 404, .. })
        ));
        let failing = failing_with(500).await;
        match sent(&failing, Some("s-1")).await {
            StreamableHttpError::Client(McpHttpError::Status { status, body }) => {
                assert_eq!(status, 500);
                assert!(body.contains("Session not found"), "{body}");
            }
            other => panic!("{other}"),
        }

        // A request sent from its answer's stream fails the same ways.
        assert!(matches!(call_failure(&gone).await, Failure::SessionGone));
        assert!(matches!(
            call_failure(&failing_with(403).await).await,
            Failure::Refused(Refusal {
                status: 403,
                challenge: None
            })
        ));
        match call_failure(&failing).await {
            Failure::Other(cause) => assert!(cause.contains("HTTP 500"), "{cause}"),
            _ => panic!("a 500 is neither a refusal nor a lost session"),
        }
    }

    #[tokio::test]
    async fn a_servers_error_in_the_gateways_codes_is_the_servers() {
        // The codes the gateway answers with itself, sent by a server as
        // its own JSON-RPC errors, even with the data they would carry.
        for (code, data) in [
            (SESSION_GONE, serde_json::Value::Null),
            (
                CREDENTIALS_REFUSED,
                serde_json::json!({"status": 401, "challenge": "Basic"}),
            ),
            (ANSWER_TOO_LARGE, serde_json::json!({"agentry": "guessed"})),
        ] {
            let body = serde_json::json!({"jsonrpc": "2.0", "id": 7,
                "error": {"code": code, "message": "as the server says", "data": data}});
            let uri = answering(200, "application/json", body.to_string()).await;
            match call_failure(&uri).await {
                Failure::Other(cause) => assert!(cause.contains("as the server says"), "{cause}"),
                _ => panic!("{code}: the server's error was read as the gateway's"),
            }
        }
    }

    #[tokio::test]
    async fn a_refusal_keeps_the_servers_challenge() {
        const CHALLENGE: &str = r#"Bearer realm="tools", error="invalid_token""#;
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(|| async {
                (
                    axum::http::StatusCode::UNAUTHORIZED,
                    [("www-authenticate", CHALLENGE)],
                    "",
                )
            }),
        );
        let uri = format!("{}/mcp", serving(app).await);
        let expected = Refusal {
            status: 401,
            challenge: Some(CHALLENGE.into()),
        };
        // Sent in line (the session's start) and from the answer's stream
        // (a call in a kept session), the same refusal.
        assert_eq!(refusal(&sent(&uri, None).await), Some(expected));
        match call_failure(&uri).await {
            Failure::Refused(r) => assert_eq!(r.challenge.as_deref(), Some(CHALLENGE)),
            _ => panic!("a 401 is a refusal of the credentials"),
        }
    }

    #[tokio::test]
    async fn an_answer_past_the_limit_ends_the_call() {
        let answer = |text: String| {
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "result": {"tools": [], "text": text}})
                .to_string()
        };
        let small = answering(200, "application/json", answer("x".repeat(100))).await;
        let answered = messages(&small).await;
        assert!(
            matches!(answered.as_slice(), [ServerJsonRpcMessage::Response(_)]),
            "{answered:?}"
        );
        let big = answering(200, "application/json", answer("x".repeat(2000))).await;
        assert_eq!(messages(&big).await.len(), 1);
        assert!(matches!(call_failure(&big).await, Failure::TooLarge));

        // An event stream that goes on past the limit: what came before
        // it in whole chunks (here, none: axum sends the body as one),
        // then the gateway's own error.
        let note = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#;
        let chatter = answering(
            200,
            "text/event-stream",
            format!("event: message\ndata: {note}\n\n").repeat(100),
        )
        .await;
        let mut got = messages(&chatter).await;
        assert!(matches!(got.pop(), Some(ServerJsonRpcMessage::Error(_))));
        assert!(
            got.iter()
                .all(|m| matches!(m, ServerJsonRpcMessage::Notification(_))),
            "{got:?}"
        );
        assert!(matches!(call_failure(&chatter).await, Failure::TooLarge));
    }

    #[tokio::test]
    async fn a_call_without_an_answer_ends_at_its_deadline() {
        let app = axum::Router::new()
            .route(
                "/silent",
                axum::routing::post(std::future::pending::<String>),
            )
            .route(
                "/open",
                axum::routing::post(|| async {
                    let never = futures::stream::pending::<
                        Result<axum::response::sse::Event, std::convert::Infallible>,
                    >();
                    axum::response::sse::Sse::new(never)
                }),
            );
        let base = serving(app).await;
        let impatient = || StatusAware {
            timeout: Duration::from_millis(200),
            ..client()
        };
        // A server that sends no headers, and an event stream that never
        // answers: both closed at the deadline (the caller has gone by
        // then), instead of held for the session's life.
        for path in ["silent", "open"] {
            let uri = format!("{base}/{path}");
            let call = messages_from(impatient(), &uri);
            let got = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .unwrap_or_else(|_| panic!("{path}: still open"));
            assert!(got.is_empty(), "{path}: {got:?}");
        }
    }
}
