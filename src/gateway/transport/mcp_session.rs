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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};
use tokio::sync::OnceCell;
use url::Url;

use super::mcp::{Peer, Session};
use super::{redacted, GatewayError, Outbound, OutboundError};

/// A kept session unused this long is closed: it holds an open event
/// stream on its server.
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

/// The MCP sessions of one gateway client, by server and credential.
#[derive(Default)]
pub(super) struct Sessions {
    kept: Mutex<HashMap<Key, Arc<Kept>>>,
    sweeping: std::sync::atomic::AtomicBool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    url: String,
    bearer: Option<String>,
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
            .get_or_try_init(|| start(out, url, key.bearer.clone()))
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

/// Initialises a session over Streamable HTTP on the guarded client.
async fn start(out: &Outbound, url: &Url, bearer: Option<String>) -> Result<Session, GatewayError> {
    use rmcp::transport::streamable_http_client::{
        StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
    };
    use rmcp::ServiceExt;
    let transport = StreamableHttpClientTransport::with_client(
        StatusAware(out.client()),
        StreamableHttpClientTransportConfig {
            uri: url.as_str().into(),
            auth_header: bearer,
            ..Default::default()
        },
    );
    ().serve(transport).await.map_err(|e| {
        let target = redacted(url);
        if let rmcp::service::ClientInitializeError::TransportError { error, .. } = &e {
            if let Some(status) = credentials_refused(error.error.as_ref()) {
                return GatewayError::Refused {
                    status,
                    message: format!(
                        "the MCP server at {target} refused the credentials (HTTP {status}) when the session started"
                    ),
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

/// The status of a refusal of the request's credentials (401 or 403),
/// when that is what `error` (a transport failure) was.
fn credentials_refused(error: &(dyn std::error::Error + Send + Sync + 'static)) -> Option<u16> {
    match error.downcast_ref::<StreamableHttpError<McpHttpError>>()? {
        StreamableHttpError::AuthRequired(_) => Some(401),
        StreamableHttpError::Client(McpHttpError::Status {
            status: status @ (401 | 403),
            ..
        }) => Some(*status),
        _ => None,
    }
}

/// One request in the kept session for its server and credential (started
/// first if there is none): the address checked by the outbound policy
/// first, the whole exchange within the policy's timeout. A kept session
/// the server no longer knows is replaced and the request sent again
/// once. `what` names the request in a refusal; `bearer` is sent as
/// `Authorization: Bearer` (the one credential rmcp sends).
pub(crate) async fn in_session<T, F>(
    out: &Outbound,
    url: &Url,
    bearer: Option<String>,
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
        bearer,
    };
    let run = async {
        let mut retried = false;
        loop {
            let (kept, running) = sessions.get(out, url, &key).await?;
            let Some(session) = kept.session.get() else {
                return Err(GatewayError::BadAnswer(format!(
                    "the MCP session with {target} did not start"
                )));
            };
            match request(session.peer().clone()).await {
                Err(e) if session_gone(&e) => {
                    sessions.forget(&key, &kept);
                    if running && !retried {
                        tracing::debug!(%target, "the MCP server ended a kept session; starting another");
                        retried = true;
                        continue;
                    }
                    return Err(refused(&target, what, &e));
                }
                Err(e) => {
                    if session.is_closed() {
                        sessions.forget(&key, &kept);
                    }
                    return Err(refused(&target, what, &e));
                }
                Ok(v) => return Ok(v),
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| OutboundError::Timeout {
            target: target.clone(),
            ms: timeout.as_millis(),
        })?
}

/// A failed request as the caller reads it: a refusal of its credentials
/// as such, a transport failure by its cause (without rmcp's transport
/// type names).
fn refused(target: &str, what: &str, e: &rmcp::ServiceError) -> GatewayError {
    let cause = match e {
        rmcp::ServiceError::TransportSend(sent) => {
            if let Some(status) = credentials_refused(sent.error.as_ref()) {
                return GatewayError::Refused {
                    status,
                    message: format!(
                        "the MCP server at {target} refused the credentials of {what} (HTTP {status})"
                    ),
                };
            }
            sent.error.to_string()
        }
        other => other.to_string(),
    };
    GatewayError::BadAnswer(format!(
        "the MCP server at {target} refused {what}: {cause}"
    ))
}

/// Whether the server answered 404 to the session's id: it has forgotten
/// the session and did not look at the request.
fn session_gone(e: &rmcp::ServiceError) -> bool {
    let rmcp::ServiceError::TransportSend(sent) = e else {
        return false;
    };
    matches!(
        sent.error
            .downcast_ref::<StreamableHttpError<McpHttpError>>(),
        Some(StreamableHttpError::Client(McpHttpError::SessionGone))
    )
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
/// client, answering an error status as an error.
#[derive(Clone)]
struct StatusAware(reqwest::Client);

fn from_reqwest(e: StreamableHttpError<reqwest::Error>) -> StreamableHttpError<McpHttpError> {
    match e {
        StreamableHttpError::Client(e) => StreamableHttpError::Client(McpHttpError::Http(e)),
        StreamableHttpError::ServerDoesNotSupportSse => {
            StreamableHttpError::ServerDoesNotSupportSse
        }
        StreamableHttpError::ServerDoesNotSupportDeleteSession => {
            StreamableHttpError::ServerDoesNotSupportDeleteSession
        }
        StreamableHttpError::UnexpectedContentType(t) => {
            StreamableHttpError::UnexpectedContentType(t)
        }
        other => StreamableHttpError::UnexpectedServerResponse(other.to_string().into()),
    }
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

impl StreamableHttpClient for StatusAware {
    type Error = McpHttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<McpHttpError>> {
        let mut req = self
            .0
            .post(uri.as_ref())
            .header(
                reqwest::header::ACCEPT,
                format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"),
            )
            .json(&message);
        if let Some(token) = auth_header {
            req = req.bearer_auth(token);
        }
        if let Some(id) = &session_id {
            req = req.header(HEADER_SESSION_ID, id.as_ref());
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
            return Ok(StreamableHttpPostResponse::Accepted);
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
        let new_session = header(HEADER_SESSION_ID);
        let ctype = header(reqwest::header::CONTENT_TYPE.as_str());
        match ctype {
            Some(t) if t.starts_with(EVENT_STREAM_MIME_TYPE) => {
                Ok(StreamableHttpPostResponse::Sse(
                    SseStream::from_bytes_stream(resp.bytes_stream()).boxed(),
                    new_session,
                ))
            }
            Some(t) if t.starts_with(JSON_MIME_TYPE) => {
                let message: ServerJsonRpcMessage = resp
                    .json()
                    .await
                    .map_err(|e| StreamableHttpError::Client(e.into()))?;
                Ok(StreamableHttpPostResponse::Json(message, new_session))
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
    ) -> Result<(), StreamableHttpError<McpHttpError>> {
        self.0
            .delete_session(uri, session_id, auth_header)
            .await
            .map_err(from_reqwest)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<McpHttpError>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header)
            .await
            .map_err(from_reqwest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server answering every POST with `status` and a JSON-RPC error
    /// without a request id, as the Python SDK answers an unknown session.
    async fn answering(status: u16) -> String {
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(move || async move {
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    [("content-type", "application/json")],
                    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}"#,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/mcp")
    }

    async fn post(uri: &str, session: Option<&str>) -> StreamableHttpError<McpHttpError> {
        let message: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
        ))
        .unwrap();
        let answer = StatusAware(reqwest::Client::new())
            .post_message(uri.into(), message, session.map(Arc::from), None)
            .await;
        match answer {
            Err(e) => e,
            Ok(_) => panic!("an error status was read as an answer"),
        }
    }

    #[tokio::test]
    async fn error_statuses_are_errors_and_a_forgotten_session_is_told_apart() {
        let gone = answering(404).await;
        assert!(matches!(
            post(&gone, Some("s-1")).await,
            StreamableHttpError::Client(McpHttpError::SessionGone)
        ));
        // Without a session there is none to forget: a plain 404.
        assert!(matches!(
            post(&gone, None).await,
            StreamableHttpError::Client(McpHttpError::Status { status: 404, .. })
        ));
        let failing = answering(500).await;
        match post(&failing, Some("s-1")).await {
            StreamableHttpError::Client(McpHttpError::Status { status, body }) => {
                assert_eq!(status, 500);
                assert!(body.contains("Session not found"), "{body}");
            }
            other => panic!("{other}"),
        }
    }
}
