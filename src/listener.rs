//! Accepting connections, the same way on every listener (public gRPC, the
//! HTTP facade, the internal Raft listener, the peer listener): TLS with
//! certificates re-read from disk when they change (cert-manager rotates
//! them), a cap on open connections in all and per client address (one
//! client cannot take every slot), and a deadline by which a new
//! connection must have finished its TLS handshake and sent its first bytes,
//! so half-open and slow clients cannot pin sockets. What a request may do
//! once it arrives is `api::gate`'s business, not this module's.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// A listener's certificate, and the CA whose client certificates it checks
/// (mutual TLS) if any. PEM files, re-read when they change.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// Per-listener connection limits. The defaults are far above what a normal
/// client needs and far below what exhausts a node.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// A connection that has not finished its TLS handshake and sent a
    /// complete request header (HTTP/1.1) or its preface (HTTP/2) by then
    /// is closed.
    pub header_timeout_ms: u64,
    /// Largest request header block; larger ones get 431.
    pub max_header_bytes: usize,
    /// Open connections per listener; more are closed as they arrive.
    pub max_connections: usize,
    /// Open connections per client address (IPv6 by /64) and listener;
    /// more are closed as they arrive. 0: no cap (every client arrives
    /// through one proxy).
    pub max_connections_per_client: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams_per_connection: u32,
    /// A connection with no request open for this long is closed, with a
    /// GOAWAY on HTTP/2 and gRPC (HTTP/1.1 keep-alive waits are bounded by
    /// `header_timeout_ms`). 0: never. The Raft listener ignores it.
    pub idle_timeout_secs: u64,
    /// A connection whose client has taken none of what the server is
    /// sending for this long is closed: a client that stopped reading
    /// would otherwise hold its answer, and the connection, for ever.
    /// 0: never. The Raft listener ignores it.
    pub write_timeout_secs: u64,
    /// How often an HTTP/2 connection is sent a keep-alive PING, on every
    /// listener, Raft's included: it finds dead peers, and ends a
    /// connection whose client stopped speaking the protocol. 0: never.
    pub keep_alive_interval_secs: u64,
    /// How long a keep-alive PING may go unanswered before its connection
    /// is closed.
    pub keep_alive_timeout_secs: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout_ms: 10_000,
            max_header_bytes: 64 * 1024,
            max_connections: 4096,
            max_connections_per_client: 200,
            max_streams_per_connection: 256,
            idle_timeout_secs: 300,
            write_timeout_secs: 60,
            keep_alive_interval_secs: 30,
            keep_alive_timeout_secs: 20,
        }
    }
}

impl ConnectionLimits {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }

    fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }

    fn write_timeout(&self) -> Option<Duration> {
        (self.write_timeout_secs > 0).then(|| Duration::from_secs(self.write_timeout_secs))
    }

    pub fn keep_alive_interval(&self) -> Option<Duration> {
        (self.keep_alive_interval_secs > 0)
            .then(|| Duration::from_secs(self.keep_alive_interval_secs))
    }

    pub fn keep_alive_timeout(&self) -> Duration {
        Duration::from_secs(self.keep_alive_timeout_secs)
    }

    /// `max_header_bytes` as HTTP/2's header list size setting.
    pub fn max_header_list_size(&self) -> u32 {
        u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX)
    }

    /// The same limits without the idle and write timeouts: for Raft's
    /// listener, whose requests are not counted, whose connections are
    /// never idle for long anyway (heartbeats), and whose callers are
    /// members proven by the cluster's credentials.
    pub fn for_members(self) -> Self {
        Self {
            idle_timeout_secs: 0,
            write_timeout_secs: 0,
            ..self
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(100..=120_000).contains(&self.header_timeout_ms) {
            return Err("[connections] header_timeout_ms must be 100..=120000".into());
        }
        if !(8 * 1024..=1024 * 1024).contains(&self.max_header_bytes) {
            return Err("[connections] max_header_bytes must be 8 KiB..=1 MiB".into());
        }
        if self.idle_timeout_secs > 86_400
            || self.write_timeout_secs > 86_400
            || self.keep_alive_interval_secs > 86_400
        {
            return Err(
                "[connections] idle_timeout_secs, write_timeout_secs and keep_alive_interval_secs \
                 must be at most 86400"
                    .into(),
            );
        }
        if !(1..=3_600).contains(&self.keep_alive_timeout_secs) {
            return Err("[connections] keep_alive_timeout_secs must be 1..=3600".into());
        }
        if self.max_connections == 0 || self.max_streams_per_connection == 0 {
            return Err(
                "[connections] max_connections and max_streams_per_connection must be positive"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Whether a TLS listener with a client CA asks for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Ask, and check any certificate sent against the client CA; clients
    /// without one still connect (they authenticate otherwise).
    Optional,
    /// Refuse the handshake without a certificate from the client CA.
    Required,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// How often reloaders look at their files' modification times.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// The modification times of the files a reloader depends on (TLS
/// certificates, a JWKS file), looked at no more than once a second, so a
/// per-request check costs no system call. `changed` answers the new times
/// when any file changed; `settle` records them once the reload worked, so
/// a broken rotation is tried again a second later until it loads.
pub struct FileStamps {
    paths: Vec<PathBuf>,
    seen: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl FileStamps {
    pub fn new(paths: Vec<PathBuf>) -> Self {
        let seen = Self::read(&paths);
        Self {
            paths,
            seen,
            checked: Instant::now(),
        }
    }

    fn read(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
        paths
            .iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    /// The files' new modification times, when a check is due and any of
    /// them changed since the last `settle`.
    pub fn changed(&mut self) -> Option<Vec<Option<SystemTime>>> {
        if self.checked.elapsed() < RELOAD_CHECK {
            return None;
        }
        self.checked = Instant::now();
        let now = Self::read(&self.paths);
        (now != self.seen).then_some(now)
    }

    pub fn settle(&mut self, stamps: Vec<Option<SystemTime>>) {
        self.seen = stamps;
    }
}

/// Reads every certificate of a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.into(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.into(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.into(),
            message: "no certificate in the file".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.into(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        path: path.into(),
        message: e.to_string(),
    })
}

/// The crypto provider every TLS endpoint of Agentry uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Trust anchors from a PEM CA file.
pub fn roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))?;
    }
    Ok(roots)
}

fn server_config(files: &TlsConfig, client_auth: ClientAuth) -> Result<ServerConfig, TlsError> {
    let certs = read_certs(&files.cert_file)?;
    let key = read_key(&files.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca_file {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let verifier = match client_auth {
                ClientAuth::Optional => verifier.allow_unauthenticated(),
                ClientAuth::Required => verifier,
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?,
            )
        }
        // Without a client CA nobody can be checked: plain server TLS.
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("{}: {e}", files.cert_file.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

struct Loaded {
    config: Arc<ServerConfig>,
    stamps: FileStamps,
}

/// A listener's TLS configuration, rebuilt from its files when any of them
/// changes. A broken rotation (a key that does not match, a half-written
/// file) keeps the previous certificate and logs why.
pub struct ReloadingTls {
    files: TlsConfig,
    client_auth: ClientAuth,
    loaded: Mutex<Loaded>,
}

impl ReloadingTls {
    pub fn load(files: TlsConfig, client_auth: ClientAuth) -> Result<Arc<Self>, TlsError> {
        let config = Arc::new(server_config(&files, client_auth)?);
        let paths = [
            Some(&files.cert_file),
            Some(&files.key_file),
            files.client_ca_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        Ok(Arc::new(Self {
            files,
            client_auth,
            loaded: Mutex::new(Loaded {
                config,
                stamps: FileStamps::new(paths),
            }),
        }))
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<ServerConfig> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(stamps) = loaded.stamps.changed() {
            match server_config(&self.files, self.client_auth) {
                Ok(c) => {
                    tracing::info!(cert = %self.files.cert_file.display(), "TLS certificate files changed; reloaded");
                    loaded.config = Arc::new(c);
                    loaded.stamps.settle(stamps);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS certificate files changed but cannot be loaded; keeping the previous certificate");
                }
            }
        }
        loaded.config.clone()
    }
}

/// Who is at the other end of a connection, as every request on it sees it
/// (in its extensions, on both transports).
#[derive(Debug, Clone)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The client's end-entity certificate, already verified against the
    /// listener's client CA.
    pub client_cert: Option<CertificateDer<'static>>,
    /// The connection's open requests; each request holds a `Busy` of it.
    pub activity: Arc<Activity>,
}

/// How many requests are open on a connection, since when none has been
/// (what the idle timeout reads), and which answers wait for the client
/// to take them (what the write timeout reads on HTTP/2, where a client
/// can starve one stream of flow-control window while the socket itself
/// stays writable). The gate (gRPC) and `serve_http` count requests; the
/// connection itself only reads.
#[derive(Debug)]
pub struct Activity(Mutex<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    open: usize,
    quiet_since: tokio::time::Instant,
    /// Since when each answer handed to the connection has waited for the
    /// client, by its request's number.
    waiting: HashMap<u64, tokio::time::Instant>,
    next: u64,
}

impl Default for Activity {
    fn default() -> Self {
        Self(Mutex::new(ActivityState {
            open: 0,
            quiet_since: tokio::time::Instant::now(),
            waiting: HashMap::new(),
            next: 0,
        }))
    }
}

impl Activity {
    /// Counts a request as open until the returned guard is dropped (with
    /// its answer's body, or when the request is abandoned).
    pub fn busy(self: &Arc<Self>) -> Busy {
        let mut state = self.state();
        state.open += 1;
        state.next += 1;
        Busy {
            activity: self.clone(),
            request: state.next,
        }
    }

    /// When the connection has been idle for `limit`, if no request starts
    /// before then; `None` while one is open.
    fn idle_at(&self, limit: Duration) -> Option<tokio::time::Instant> {
        let state = self.state();
        (state.open == 0).then_some(state.quiet_since + limit)
    }

    /// Since when the answer that has waited longest for the client has
    /// waited; `None` while none waits.
    fn waiting_since(&self) -> Option<tokio::time::Instant> {
        self.state().waiting.values().min().copied()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One open request on a connection (`Activity::busy`).
pub struct Busy {
    activity: Arc<Activity>,
    request: u64,
}

impl Busy {
    /// Records that the request's answer waits for the client to take it,
    /// from now (`true`: handed to the connection, or a part of it just
    /// taken), or that it waits for the server itself (`false`: a stream
    /// with nothing new to send).
    fn waiting(&self, for_client: bool) {
        let mut state = self.activity.state();
        if for_client {
            state
                .waiting
                .insert(self.request, tokio::time::Instant::now());
        } else {
            state.waiting.remove(&self.request);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.activity.state();
        state.open = state.open.saturating_sub(1);
        state.quiet_since = tokio::time::Instant::now();
        state.waiting.remove(&self.request);
    }
}

/// The largest part of an answer handed to the connection at a time.
/// HTTP/2 takes a part whole into its send buffer however little window
/// the client gave, so parts bound what a client withholding window can
/// leave buffered there; and the connection asks for the next part only
/// when the client has room for it, which is what tells `Answer` that the
/// client is still taking the answer.
const ANSWER_PART: usize = 16 * 1024;

/// An answer's body, holding its request's `Busy` until it is dropped
/// (finished, or its client gone) and telling the connection whether it
/// waits for the client: from the moment it is handed over, and after
/// every part the connection takes from it, until it next has nothing to
/// send. A client that stops taking it (HTTP/2 with no window for the
/// stream, or a full socket) leaves it waiting, and the write timeout
/// closes the connection; a stream quiet because nothing happens does not
/// wait. Data is handed over in parts of at most `ANSWER_PART`.
pub struct Answer<B> {
    body: B,
    busy: Option<Busy>,
    /// Whether `busy` was last recorded as waiting for the client.
    waiting: bool,
    /// What is left of the body's last data frame.
    rest: Option<Bytes>,
}

impl<B> Answer<B> {
    pub fn new(body: B, busy: Option<Busy>) -> Self {
        if let Some(busy) = &busy {
            busy.waiting(true);
        }
        Self {
            body,
            busy,
            waiting: true,
            rest: None,
        }
    }

    /// The next part of `data`, keeping what follows it for later.
    fn part(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > ANSWER_PART {
            self.rest = Some(data.split_off(ANSWER_PART));
        }
        data
    }
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Answer<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let polled = match this.rest.take() {
            Some(rest) => Poll::Ready(Some(Ok(http_body::Frame::data(this.part(rest))))),
            None => match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_data() {
                    Ok(data) => http_body::Frame::data(this.part(data)),
                    Err(frame) => frame,
                }))),
                other => other,
            },
        };
        if let Some(busy) = &this.busy {
            match &polled {
                // Taken: the wait for the client starts again.
                Poll::Ready(Some(Ok(_))) => {
                    busy.waiting(true);
                    this.waiting = true;
                }
                Poll::Pending if this.waiting => {
                    busy.waiting(false);
                    this.waiting = false;
                }
                // Ended: `busy` goes with the body.
                _ => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = self.body.size_hint();
        if let Some(rest) = &self.rest {
            let rest = rest.len() as u64;
            hint.set_lower(hint.lower().saturating_add(rest));
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(rest));
            }
        }
        hint
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection. Until it has sent its first bytes it must do so
/// by its deadline; it holds its slot of the listener's connection cap
/// until dropped.
pub struct Conn {
    io: Io,
    peer: Peer,
    /// Bytes a client must send before the deadline stops applying: the
    /// HTTP/2 preface is 24 bytes; HTTP/1.1 headers are then covered by
    /// hyper's own header timeout.
    pending: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
    /// The write timeout, and its timer while a write waits for the client
    /// to take data (`None` while writes go through).
    write_stall: Option<(Duration, Option<Pin<Box<tokio::time::Sleep>>>)>,
    /// The write timeout again, and its timer for the answers that wait
    /// for the client (`Answer`), which sleeps until the oldest could first
    /// have waited that long.
    answer_stall: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    /// The listener's name, for the metrics of why it was closed.
    listener: &'static str,
    /// Set once the connection has failed itself (a deadline, a
    /// stalled write), so the reason is counted once.
    closed: bool,
    _open: crate::metrics::OpenConnection,
    _permit: OwnedSemaphorePermit,
    _client: Option<ClientSlot>,
}

const FIRST_BYTES: usize = 24;

/// The key a client is counted (and rate limited) by: its address, IPv6
/// by /64 (one host usually holds a whole /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Open connections per client on one listener.
struct PerClient {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerClient {
    /// A slot for one more connection of `ip`'s client, if it has room.
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let key = client_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            table: self.clone(),
            key,
        })
    }
}

/// One open connection of a client; gives its slot back when dropped.
struct ClientSlot {
    table: Arc<PerClient>,
    key: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Whether the moment `due` names (`None`: not while things stay as they
/// are) has come; until then `timer` is set, and polled so this task
/// wakes, for the next moment it could: `due` itself, or `limit` from now.
fn passed(
    timer: &mut Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    cx: &mut Context<'_>,
    due: impl Fn() -> Option<tokio::time::Instant>,
) -> bool {
    while timer.as_mut().poll(cx).is_ready() {
        let now = tokio::time::Instant::now();
        match due() {
            Some(at) if at <= now => return true,
            Some(at) => timer.as_mut().reset(at),
            None => timer.as_mut().reset(now + limit),
        }
    }
    false
}

impl Conn {
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Whether an answer has waited for the client to take any of it for
    /// the write timeout; until then the timer is set (and polled, so this
    /// task wakes) for the next moment that could be true.
    fn answer_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let activity = &self.peer.activity;
        self.answer_stall.as_mut().is_some_and(|(limit, timer)| {
            passed(timer, *limit, cx, || {
                activity.waiting_since().map(|since| since + *limit)
            })
        })
    }

    /// The error that ends the connection for `reason`, counted once.
    fn closing(&mut self, reason: &'static str, message: &'static str) -> io::Error {
        if !self.closed {
            self.closed = true;
            crate::metrics::observe_connection_closed(self.listener, reason);
        }
        io::Error::new(io::ErrorKind::TimedOut, message)
    }

    /// `written`, or an error once writes have waited for the client to
    /// take data for the whole write timeout.
    fn unless_stalled<T>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let Some((limit, stalled)) = &mut self.write_stall else {
            return written;
        };
        if written.is_ready() {
            *stalled = None;
            return written;
        }
        let timer = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(*limit)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(self.closing(
                "write_timeout",
                "the client took nothing of the answer for the write timeout",
            )));
        }
        written
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let result = match &mut this.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Some((missing, deadline)) = &mut this.pending {
            let got = buf.filled().len() - before;
            if got >= *missing {
                this.pending = None;
            } else {
                *missing -= got;
                if result.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(this.closing(
                        "header_timeout",
                        "the client sent no complete request in time",
                    )));
                }
            }
        }
        // Only a connection waiting for its client is checked: one with
        // bytes arriving has its client still there to give the window it
        // withholds.
        if result.is_pending() && this.answer_stalled(cx) {
            return Poll::Ready(Err(this.closing(
                "write_timeout",
                "the client took nothing of an answer for the write timeout",
            )));
        }
        result
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        };
        self.unless_stalled(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        };
        self.unless_stalled(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        };
        self.unless_stalled(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

/// One listener's accepted connections, ready to serve.
pub type Incoming = ReceiverStream<Result<Conn, io::Error>>;

/// Accepts connections until shutdown: TLS handshakes run concurrently
/// (a slow one holds up nobody else) under the header deadline, and
/// connections over either cap (the listener's, the client's) are closed
/// at once.
pub fn accept(
    name: &'static str,
    listener: TcpListener,
    tls: Option<Arc<ReloadingTls>>,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
) -> Incoming {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_client = (limits.max_connections_per_client > 0).then(|| {
        Arc::new(PerClient {
            max: limits.max_connections_per_client,
            open: Mutex::default(),
        })
    });
    tokio::spawn(async move {
        let stop = async move {
            let _ = shutdown.wait_for(|s| *s).await;
        };
        tokio::pin!(stop);
        let mut last_full_warning: Option<Instant> = None;
        let mut last_client_warning: Option<Instant> = None;
        loop {
            let (tcp, remote) = tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off
                        // rather than spin.
                        tracing::warn!(listener = name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                if last_full_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        listener = name,
                        max = limits.max_connections,
                        "connection cap reached; closing new connections"
                    );
                    last_full_warning = Some(Instant::now());
                }
                crate::metrics::observe_connection_closed(name, "connection_cap");
                drop(tcp);
                continue;
            };
            // None: no cap; Some(None): the client is at its cap.
            let client = per_client.as_ref().map(|t| t.take(remote.ip()));
            if matches!(client, Some(None)) {
                if last_client_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        listener = name,
                        client = %client_key(remote.ip()),
                        max = limits.max_connections_per_client,
                        "a client reached its connection cap; closing its new connections"
                    );
                    last_client_warning = Some(Instant::now());
                }
                crate::metrics::observe_connection_closed(name, "client_cap");
                drop(tcp);
                continue;
            }
            let open = crate::metrics::connection_opened(name);
            // Small answers must not wait for the client's delayed ACK.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            let deadline = tokio::time::Instant::now() + limits.header_timeout();
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let (io, client_cert) = match tls {
                    None => (Io::Plain(tcp), None),
                    Some(tls) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                        match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let cert = stream
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .and_then(|c| c.first())
                                    .map(|c| c.clone().into_owned());
                                (Io::Tls(Box::new(stream)), cert)
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(listener = name, %remote, error = %e, "TLS handshake failed");
                                crate::metrics::observe_connection_closed(name, "tls_handshake");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(listener = name, %remote, "TLS handshake timed out");
                                crate::metrics::observe_connection_closed(name, "header_timeout");
                                return;
                            }
                        }
                    }
                };
                let conn = Conn {
                    io,
                    peer: Peer {
                        remote,
                        client_cert,
                        activity: Arc::default(),
                    },
                    pending: Some((FIRST_BYTES, Box::pin(tokio::time::sleep_until(deadline)))),
                    write_stall: limits.write_timeout().map(|limit| (limit, None)),
                    answer_stall: limits
                        .write_timeout()
                        .map(|limit| (limit, Box::pin(tokio::time::sleep(limit)))),
                    listener: name,
                    closed: false,
                    _open: open,
                    _permit: permit,
                    _client: client.flatten(),
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Serves an axum app on accepted connections: HTTP/1.1 and HTTP/2, with
/// the header deadline and size limit (431), the HTTP/2 stream cap, and the
/// connection's `Peer` in every request's extensions. Each request counts
/// as open on its connection until its answer has been sent.
pub async fn serve_http(
    app: axum::Router,
    incoming: Incoming,
    limits: ConnectionLimits,
    shutdown: watch::Receiver<bool>,
) {
    use tower::ServiceExt;

    let mut builder = Builder::new(TokioExecutor::new());
    http1_limits(&mut builder, &limits);
    http2_limits(&mut builder, &limits);
    let service_for = move |peer: Peer| {
        let app = app.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            // Open from the request's head until its answer's body is
            // sent (or the request abandoned): the idle timeout waits.
            let busy = peer.activity.busy();
            req.extensions_mut().insert(peer.clone());
            let answer = app.clone().oneshot(req.map(axum::body::Body::new));
            async move {
                let response = answer.await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|b| axum::body::Body::new(Answer::new(b, Some(busy)))),
                )
            }
        })
    };
    serve(builder, incoming, service_for, limits, shutdown).await;
}

/// Serves gRPC services on accepted connections, HTTP/2 only, with the
/// same limits as `serve_http` and the connection's `Peer` in every
/// request's extensions. `service` (the gate in front of the services)
/// counts each request as open on its connection.
///
/// An HTTP/1.1 request is answered 505 with the error body and its
/// connection closed; it never reaches the services. hyper's connection
/// sniffing reads HTTP/1.1 whatever the builder is told (its HTTP/2-only
/// setting does nothing on a connection that may upgrade), and an HTTP/1.1
/// request head left unfinished on a gRPC listener used to hold its
/// connection for ever: HTTP/1.1 gets the facade's header deadline and
/// size limit here too.
pub async fn serve_grpc<S>(
    service: S,
    incoming: Incoming,
    limits: ConnectionLimits,
    shutdown: watch::Receiver<bool>,
) where
    S: tower::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    use futures::future::Either;
    use hyper::service::Service as _;
    use tower::ServiceExt;

    let mut builder = Builder::new(TokioExecutor::new());
    http1_limits(&mut builder, &limits);
    builder.http1().keep_alive(false);
    http2_limits(&mut builder, &limits);
    let service_for = move |peer: Peer| {
        let grpc = hyper_util::service::TowerToHyperService::new(service.clone().map_request(
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer.clone());
                req
            },
        ));
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            if req.version() == http::Version::HTTP_2 {
                Either::Left(grpc.call(req))
            } else {
                Either::Right(std::future::ready(Ok(http2_only(req.uri().path()))))
            }
        })
    };
    serve(builder, incoming, service_for, limits, shutdown).await;
}

/// The answer to an HTTP/1.x request on a gRPC listener: 505 and the error
/// body, saying where the JSON API is.
fn http2_only(path: &str) -> hyper::Response<tonic::body::Body> {
    let detail = crate::api::error::refusal_detail(
        505,
        "this listener serves gRPC, over HTTP/2 only; the JSON/HTTP API is on the HTTP listener"
            .into(),
    );
    let body = crate::api::error::problem_body(&detail, path).to_string();
    let mut answer = hyper::Response::new(tonic::body::Body::new(http_body_util::Full::new(
        Bytes::from(body),
    )));
    *answer.status_mut() = http::StatusCode::HTTP_VERSION_NOT_SUPPORTED;
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    answer
}

type Builder = hyper_util::server::conn::auto::Builder<TokioExecutor>;

/// The HTTP/1.1 settings every public listener shares: the request head's
/// deadline and size limit (431).
fn http1_limits(builder: &mut Builder, limits: &ConnectionLimits) {
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout())
        .max_buf_size(limits.max_header_bytes.max(8192));
}

/// The HTTP/2 settings every public listener shares.
fn http2_limits(builder: &mut Builder, limits: &ConnectionLimits) {
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .max_header_list_size(limits.max_header_list_size())
        .keep_alive_interval(limits.keep_alive_interval())
        .keep_alive_timeout(limits.keep_alive_timeout());
}

/// Serves each accepted connection with the service `service_for` makes
/// for its peer, until shutdown; then closes every connection as below and
/// returns once all have ended.
///
/// A connection is closed gracefully when it has had no open request for
/// the idle timeout, and when the node stops: an HTTP/2 client gets a
/// GOAWAY (NO_ERROR), so it knows which of its requests were taken and
/// retries the rest on a new connection instead of seeing a reset (gRPC's
/// MAX_CONNECTION_IDLE, A9); an idle HTTP/1.1 connection is closed between
/// requests. Open requests may finish. A connection still open
/// `header_timeout` after that (a client that does not answer the GOAWAY's
/// PING, or a request that does not end) is dropped.
async fn serve<S, B>(
    builder: Builder,
    mut incoming: Incoming,
    service_for: impl Fn(Peer) -> S,
    limits: ConnectionLimits,
    mut shutdown: watch::Receiver<bool>,
) where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use hyper_util::rt::TokioIo;
    use tokio_stream::StreamExt;

    // Every connection's task holds a sender; all are gone when the last
    // connection has ended.
    let (alive, mut all_ended) = mpsc::channel::<()>(1);
    loop {
        let conn = tokio::select! {
            _ = stopped(&mut shutdown) => break,
            next = incoming.next() => match next {
                Some(Ok(c)) => c,
                Some(Err(_)) => continue,
                None => break,
            },
        };
        let listener = conn.listener;
        let activity = conn.peer.activity.clone();
        let service = service_for(conn.peer.clone());
        let builder = builder.clone();
        let mut stopping = shutdown.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            let _alive = alive;
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            tokio::pin!(connection);
            let idle_limit = limits.idle_timeout();
            // Set once the connection is being closed: when it is dropped.
            let mut closing: Option<Pin<Box<tokio::time::Sleep>>> = None;
            loop {
                tokio::select! {
                    ended = connection.as_mut() => {
                        if let Err(e) = ended {
                            connection_error(listener, e.as_ref());
                        }
                        break;
                    }
                    _ = idle(&activity, idle_limit), if closing.is_none() => {
                        crate::metrics::observe_connection_closed(listener, "idle");
                        connection.as_mut().graceful_shutdown();
                        closing = Some(Box::pin(tokio::time::sleep(limits.header_timeout())));
                    }
                    _ = stopped(&mut stopping), if closing.is_none() => {
                        connection.as_mut().graceful_shutdown();
                        closing = Some(Box::pin(tokio::time::sleep(limits.header_timeout())));
                    }
                    _ = async { closing.as_mut()?.as_mut().await; Some(()) }, if closing.is_some() => {
                        tracing::debug!(listener, "a connection being closed did not end in time; dropped");
                        break;
                    }
                }
            }
        });
    }
    drop(alive);
    let _ = all_ended.recv().await;
}

/// Resolves once the node is stopping (or its signal is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Resolves once the connection has had no open request for `limit`
/// (never with no limit).
async fn idle(activity: &Activity, limit: Option<Duration>) {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    loop {
        match activity.idle_at(limit) {
            Some(at) if at <= tokio::time::Instant::now() => return,
            Some(at) => tokio::time::sleep_until(at).await,
            // A request is open: look again when it could first be over
            // and idle for as long.
            None => tokio::time::sleep(limit).await,
        }
    }
}

/// Logs how a connection ended with an error, and counts hyper's own
/// header deadline (HTTP/1.1 request heads after the first bytes, and
/// keep-alive waits) among the closes.
fn connection_error(listener: &'static str, e: &(dyn std::error::Error + 'static)) {
    tracing::debug!(listener, error = %e, "connection ended with an error");
    if e.downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
    {
        crate::metrics::observe_connection_closed(listener, "header_timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The server's end of a fresh loopback connection with `write_timeout`,
    /// and the client's end.
    async fn pair(write_timeout: Duration) -> (Conn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, remote) = listener.accept().await.unwrap();
        let conn = Conn {
            io: Io::Plain(server),
            peer: Peer {
                remote,
                client_cert: None,
                activity: Arc::default(),
            },
            pending: None,
            write_stall: Some((write_timeout, None)),
            answer_stall: None,
            listener: "test",
            closed: false,
            _open: crate::metrics::connection_opened("test"),
            _permit: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            _client: None,
        };
        (conn, client)
    }

    #[tokio::test]
    async fn an_answer_goes_in_parts_and_waits_for_its_client_only_while_it_has_some() {
        use http_body::Frame;
        use http_body_util::BodyExt;
        let activity = Arc::new(Activity::default());
        let data = Bytes::from((0..40 * 1024).map(|i| i as u8).collect::<Vec<u8>>());
        let mut answer = Answer::new(
            http_body_util::Full::new(data.clone()),
            Some(activity.busy()),
        );
        // Handed over: waiting for the client from the start.
        assert!(activity.waiting_since().is_some());
        let (mut parts, mut got) = (Vec::new(), Vec::new());
        while let Some(frame) = answer.frame().await {
            let part = frame.unwrap().into_data().unwrap();
            parts.push(part.len());
            got.extend_from_slice(&part);
        }
        assert_eq!(parts, [ANSWER_PART, ANSWER_PART, 8 * 1024]);
        assert_eq!(got, data);
        drop(answer);
        assert!(activity.waiting_since().is_none());
        assert!(activity.idle_at(Duration::ZERO).is_some());

        // A stream with nothing to send waits for the server, not the
        // client; each event it sends makes it wait for the client again.
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(1);
        let mut answer = Answer::new(
            http_body_util::StreamBody::new(ReceiverStream::new(rx)),
            Some(activity.busy()),
        );
        assert!(futures::poll!(answer.frame()).is_pending());
        assert!(activity.waiting_since().is_none());
        tx.send(Ok(Frame::data(Bytes::from_static(b"event"))))
            .await
            .unwrap();
        let event = answer.frame().await.unwrap().unwrap();
        assert_eq!(event.into_data().unwrap(), "event");
        assert!(activity.waiting_since().is_some());
        assert!(activity.idle_at(Duration::ZERO).is_none());
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_is_cut_off_and_one_that_reads_is_not() {
        // Long enough that a test thread descheduled under load does not
        // look like a client that stopped reading.
        let limit = Duration::from_secs(3);
        let chunk = vec![7u8; 64 * 1024];

        // A client that reads everything gets 32 MiB without a stall error.
        let (mut conn, mut client) = pair(limit).await;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.map(|_| got.len())
        });
        for _ in 0..512 {
            conn.write_all(&chunk).await.unwrap();
        }
        conn.shutdown().await.unwrap();
        drop(conn);
        assert_eq!(reader.await.unwrap().unwrap(), 512 * chunk.len());

        // One that reads nothing: once the socket buffers are full, the
        // next write fails after the limit instead of waiting for ever.
        let (mut conn, _client) = pair(limit).await;
        let started = Instant::now();
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(30), conn.write_all(&chunk)).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => break e,
                Err(_) => panic!("a write waited 30 s for a client that does not read"),
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    }
}
