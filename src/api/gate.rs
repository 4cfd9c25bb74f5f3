//! The one gate every public request passes, on both transports: the
//! caller is identified (`auth`), its operation classified, its token
//! bucket charged, and a stream it opens counted against its share, before
//! any handler runs. gRPC services get it as a tower layer over the whole
//! server (a service added later is gated without anyone remembering to),
//! the HTTP facade as a route layer; both call `Gate::admit`. The gate
//! also says how long each operation may run (`deadline`); size limits are
//! the listeners' and the servers' (`listener`, `server`); entitlements on
//! records are the service layer's, decided with the identity found here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Deserialize;

use super::auth::{Authenticator, Identity};
use crate::consensus::{CATCH_UP_TIMEOUT, DIGEST_WAIT};
use crate::domain::Principal;
use crate::listener::{client_key, Answer, Peer};
use crate::service::audit::Scope;
use crate::service::{AuditLog, ServiceError};

/// What an operation costs, for rate limiting. Every gRPC method and every
/// HTTP route has exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Get, list, watch, registry info, health, metadata documents.
    Read,
    /// Ranked search, discovery and resolution (they cost an embedding).
    Discover,
    /// Register, update, delete, status, publisher keys.
    Write,
    /// Calls through the gateway to agents, and imports.
    Invoke,
    /// Cluster membership and the registry's signing keys.
    Admin,
}

impl OpClass {
    pub const ALL: [OpClass; 5] = [
        OpClass::Read,
        OpClass::Discover,
        OpClass::Write,
        OpClass::Invoke,
        OpClass::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Read => "read",
            OpClass::Discover => "discover",
            OpClass::Write => "write",
            OpClass::Invoke => "invoke",
            OpClass::Admin => "admin",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The class of a gRPC method, by its path (`/package.Service/Method`).
/// `None` for a method this table does not know: the gate refuses it, and
/// a test walks every method of every service served so none is missed.
pub fn grpc_class(path: &str) -> Option<OpClass> {
    let (service, method) = path.trim_start_matches('/').split_once('/')?;
    use OpClass::*;
    Some(match (service, method) {
        ("grpc.health.v1.Health", _) => Read,
        ("grpc.reflection.v1.ServerReflection", _)
        | ("grpc.reflection.v1alpha.ServerReflection", _) => Read,
        (
            "agentry.v1.Registry",
            "Register" | "Update" | "Delete" | "SetStatus" | "Refresh" | "RefreshLease"
            | "RevokeLease",
        ) => Write,
        ("agentry.v1.Registry", "Get" | "List" | "Watch" | "GetLease") => Read,
        ("agentry.v1.Discovery", "Discover" | "Resolve") => Discover,
        ("agentry.v1.Ard", "Search" | "Explore") => Discover,
        ("agentry.v1.Ard", "ListAgents" | "GetAgent") => Read,
        ("agentry.v1.Cluster", "Status" | "ListAudit") => Read,
        (
            "agentry.v1.Cluster",
            "Initialize" | "AddLearner" | "Promote" | "Remove" | "TransferLeader" | "SetFaults"
            | "Backup" | "Check",
        ) => Admin,
        ("agentry.v1.Federation", "GetRegistryInfo" | "ListPublisherKeys") => Read,
        ("agentry.v1.Federation", "RotateKey" | "RetireKey" | "RevokeKey") => Admin,
        ("agentry.v1.Federation", "AddPublisherKey" | "RemovePublisherKey") => Write,
        ("agentry.v1.Gateway", "Invoke" | "InvokeStream" | "Import") => Invoke,
        ("agentry.v1.AgentProtocol", "ListAgents" | "Describe" | "GetRun" | "ListThreads") => Read,
        ("agentry.v1.AgentProtocol", "Run" | "GetEvents" | "StreamEvents" | "StreamRequest") => {
            Invoke
        }
        ("agentry.v1.Peering", "GetRegistryInfo" | "Follow") => Read,
        ("agentry.v1.Peering", "Discover") => Discover,
        _ => return None,
    })
}

/// Whether a gRPC method answers with a stream: such an answer holds one
/// of its caller's stream slots (`max_open_streams`) for as long as it is
/// open. Every server-streaming method of the served services, the health
/// watch and reflection's bidirectional stream; a test checks the list
/// against the descriptors.
pub fn grpc_streams(path: &str) -> bool {
    matches!(
        path.trim_start_matches('/'),
        "agentry.v1.Registry/Watch"
            | "agentry.v1.Peering/Follow"
            | "agentry.v1.Cluster/Backup"
            | "agentry.v1.Gateway/InvokeStream"
            | "agentry.v1.AgentProtocol/StreamEvents"
            | "agentry.v1.AgentProtocol/StreamRequest"
            | "grpc.health.v1.Health/Watch"
            | "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            | "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    )
}

/// How long an operation (`package.Service/Method` on gRPC, `METHOD
/// /route` over HTTP) may run before it is answered with a timeout: the
/// configured request deadline, except for adding a learner, which may be
/// asked to wait until the learner caught up (a snapshot and the log tail,
/// minutes for a large directory). The leader bounds that wait
/// (`CATCH_UP_TIMEOUT`) and a follower passing it on allows one request
/// timeout more; the deadline leaves one more again, so the operation's
/// own answer arrives first. A replica consistency check likewise outlasts
/// its members' wait to hash their state, so a member that never answers
/// is reported in the check's own answer.
pub fn deadline(operation: &str, request_timeout: Duration) -> Duration {
    match operation.trim_start_matches('/') {
        "agentry.v1.Cluster/AddLearner" | "POST /cluster/learners" => {
            CATCH_UP_TIMEOUT + 2 * request_timeout
        }
        // The check's entry is a write; then every member is given
        // `DIGEST_WAIT` to hash its state, and the transport a little more.
        "agentry.v1.Cluster/Check" | "POST /cluster/check" => {
            request_timeout + DIGEST_WAIT + Duration::from_secs(10)
        }
        _ => request_timeout,
    }
}

/// The error of a request still working at its deadline `limit`.
pub fn late(limit: Duration) -> ServiceError {
    let within = if limit.subsec_millis() == 0 {
        format!("{} s", limit.as_secs())
    } else {
        format!("{} ms", limit.as_millis())
    };
    ServiceError::Timeout(format!("the request did not finish within {within}"))
}

/// The deadline a gRPC client sent with its call (`grpc-timeout`: at most
/// eight digits and a unit, H M S m u n). A malformed one is ignored, as
/// if none had been sent: the server's own deadline still applies.
pub fn client_deadline(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Whether an HTTP route ("METHOD /route/{param}") always answers with
/// server-sent events that stay open: those hold a stream slot, taken here
/// before the handler starts any work. `invoke` and `get_events` stream
/// only when asked to, and take a slot in their handlers when they do;
/// `/mcp` answers one event and closes, like any request.
pub fn http_streams(operation: &str) -> bool {
    matches!(
        operation,
        "GET /changes" | "POST /agents/{id}/stream_request"
    )
}

/// A token bucket: sustained requests per second and the burst allowed
/// above it.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

const fn rate(per_second: u32, burst: u32) -> Rate {
    Rate { per_second, burst }
}

/// One bucket per class of operation.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassRates {
    pub read: Rate,
    pub discover: Rate,
    pub write: Rate,
    pub invoke: Rate,
    pub admin: Rate,
}

impl ClassRates {
    fn get(&self, class: OpClass) -> Rate {
        match class {
            OpClass::Read => self.read,
            OpClass::Discover => self.discover,
            OpClass::Write => self.write,
            OpClass::Invoke => self.invoke,
            OpClass::Admin => self.admin,
        }
    }
}

/// Rate limits (`[rate_limits]`): on by default, with figures a normal
/// client never meets and a flood does.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    pub enabled: bool,
    /// Per client address (IPv6 by /64), for callers without credentials
    /// and for failed authentication attempts.
    pub anonymous: ClassRates,
    /// Per principal, for authenticated callers.
    pub authenticated: ClassRates,
    /// Distinct addresses and principals tracked per class; past it, new
    /// ones share one bucket, so memory stays bounded under a flood from
    /// many addresses.
    pub max_tracked_keys: usize,
    /// Streamed answers (watches, event streams, peer feeds, streamed
    /// calls, backups) one caller holds open at once on this node; 0: no
    /// limit. A stream keeps a task and its buffers for as long as the
    /// client keeps it, so the request rate alone does not bound them.
    pub max_open_streams: usize,
    /// Streams every anonymous caller together holds open on this node; 0:
    /// no limit. Addresses are cheap (an IPv6 /48 holds 65,536 /64s), so
    /// without it a flood from many of them could hold as many streams as
    /// it has addresses, and their memory, while authenticated callers
    /// (operators, peers following the feed) keep their own allowance.
    pub max_anonymous_streams: usize,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            anonymous: ClassRates {
                read: rate(200, 400),
                discover: rate(100, 200),
                write: rate(10, 20),
                invoke: rate(20, 40),
                admin: rate(5, 10),
            },
            authenticated: ClassRates {
                read: rate(2000, 4000),
                discover: rate(500, 1000),
                write: rate(500, 1000),
                invoke: rate(200, 400),
                admin: rate(50, 100),
            },
            max_tracked_keys: 100_000,
            max_open_streams: 100,
            max_anonymous_streams: 1000,
        }
    }
}

impl RateLimitConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (who, rates) in [
            ("anonymous", &self.anonymous),
            ("authenticated", &self.authenticated),
        ] {
            for class in OpClass::ALL {
                let r = rates.get(class);
                if r.per_second == 0 || r.burst == 0 {
                    return Err(format!(
                        "rate_limits.{who}.{}: per_second and burst must be positive",
                        class.as_str()
                    ));
                }
            }
        }
        if self.max_tracked_keys < 16 {
            return Err("rate_limits.max_tracked_keys must be at least 16".into());
        }
        Ok(())
    }
}

fn quota(r: Rate) -> Quota {
    let per_second = NonZeroU32::new(r.per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(r.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(per_second).allow_burst(burst)
}

/// Where new keys go once `max_tracked_keys` is reached.
const OVERFLOW_ADDR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
const OVERFLOW_PRINCIPAL: &str = "\u{0}overflow";

struct Limiter {
    by_address: Vec<DefaultKeyedRateLimiter<IpAddr>>,
    by_principal: Vec<DefaultKeyedRateLimiter<String>>,
    max_keys: usize,
    clock: DefaultClock,
}

impl Limiter {
    fn new(config: &RateLimitConfig) -> Self {
        Self {
            by_address: OpClass::ALL
                .iter()
                .map(|c| RateLimiter::keyed(quota(config.anonymous.get(*c))))
                .collect(),
            by_principal: OpClass::ALL
                .iter()
                .map(|c| RateLimiter::keyed(quota(config.authenticated.get(*c))))
                .collect(),
            max_keys: config.max_tracked_keys,
            clock: DefaultClock::default(),
        }
    }

    fn wait(&self, not_until: governor::NotUntil<governor::clock::QuantaInstant>) -> Duration {
        not_until.wait_time_from(self.clock.now())
    }

    /// Charges an anonymous caller's address. Past the key cap every
    /// address shares one bucket until idle ones are forgotten: a flood
    /// from many addresses degrades anonymous service, never memory.
    fn charge_address(&self, class: OpClass, ip: IpAddr) -> Result<(), Duration> {
        let l = &self.by_address[class.index()];
        let key = if l.len() >= self.max_keys {
            OVERFLOW_ADDR
        } else {
            client_key(ip)
        };
        l.check_key(&key).map_err(|n| self.wait(n))
    }

    fn charge_principal(&self, class: OpClass, name: &str) -> Result<(), Duration> {
        let l = &self.by_principal[class.index()];
        let key = if l.len() >= self.max_keys {
            OVERFLOW_PRINCIPAL
        } else {
            name
        };
        l.check_key(&key.to_string()).map_err(|n| self.wait(n))
    }

    /// Forgets buckets that are full again (indistinguishable from new).
    fn forget_idle(&self) {
        for l in &self.by_address {
            l.retain_recent();
            l.shrink_to_fit();
        }
        for l in &self.by_principal {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// Who a stream is counted against: a principal, or an anonymous
/// caller's address (IPv6 by /64), as the rate limiter keys them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum StreamOwner {
    Principal(String),
    Address(IpAddr),
}

/// The streams open on this node, and who holds them.
struct OpenStreams {
    /// Per caller; `usize::MAX` when streams are not limited (they are
    /// still counted, for `/metrics`).
    max: usize,
    /// All anonymous callers together.
    anonymous_max: usize,
    held: std::sync::Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_owner: HashMap<StreamOwner, usize>,
    anonymous: usize,
}

impl OpenStreams {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        // The counts are consistent after every statement; a panic
        // elsewhere while they were held leaves nothing half done.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Streams open on a node: `/metrics` shows them, so an operator sees how
/// close anonymous callers are to their shared limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounts {
    pub anonymous: usize,
    pub authenticated: usize,
}

/// One open stream of a caller, given back when dropped: it travels with
/// the answer's body, so it is held exactly as long as the stream is.
pub struct StreamSlot {
    streams: Arc<OpenStreams>,
    owner: StreamOwner,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.streams.held();
        if matches!(self.owner, StreamOwner::Address(_)) {
            held.anonymous = held.anonymous.saturating_sub(1);
        }
        if let Some(n) = held.by_owner.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                held.by_owner.remove(&self.owner);
            }
        }
    }
}

/// `body` that keeps `held` (a stream slot) until it is dropped: finished,
/// or its client gone.
pub fn holding<B, H>(body: B, held: H) -> impl http_body::Body<Data = B::Data, Error = B::Error>
where
    B: http_body::Body,
{
    http_body_util::BodyExt::map_frame(body, move |frame| {
        let _held = &held;
        frame
    })
}

/// Authentication and limits, shared by every listener of a node.
pub struct Gate {
    auth: Arc<Authenticator>,
    limiter: Option<Limiter>,
    streams: Arc<OpenStreams>,
    audit: Option<Arc<AuditLog>>,
}

impl Gate {
    pub fn new(auth: Arc<Authenticator>, limits: &RateLimitConfig) -> Arc<Self> {
        Self::with_audit(auth, limits, None)
    }

    /// A gate that also records every write and admin request in `audit`.
    pub fn with_audit(
        auth: Arc<Authenticator>,
        limits: &RateLimitConfig,
        audit: Option<Arc<AuditLog>>,
    ) -> Arc<Self> {
        let gate = Arc::new(Self {
            auth,
            limiter: limits.enabled.then(|| Limiter::new(limits)),
            streams: Arc::new(OpenStreams {
                max: match limits.max_open_streams {
                    n if limits.enabled && n > 0 => n,
                    _ => usize::MAX,
                },
                anonymous_max: match limits.max_anonymous_streams {
                    n if limits.enabled && n > 0 => n,
                    _ => usize::MAX,
                },
                held: Default::default(),
            }),
            audit,
        });
        if gate.limiter.is_some() {
            let weak = Arc::downgrade(&gate);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(10));
                loop {
                    tick.tick().await;
                    let Some(gate) = weak.upgrade() else { break };
                    if let Some(l) = &gate.limiter {
                        l.forget_idle();
                    }
                }
            });
        }
        gate
    }

    /// Identifies the caller and charges its bucket for `class`. A caller
    /// whose credentials fail is charged as anonymous first, so guessing
    /// keys is limited like any other flood.
    pub async fn admit(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&Peer>,
        class: OpClass,
    ) -> Result<Identity, ServiceError> {
        let identity = self.auth.identify(headers, peer).await;
        let principal = identity.as_ref().ok().and_then(|i| i.0.as_ref());
        self.charge(principal, peer, class)?;
        identity
    }

    /// Charges a caller already identified for one more operation of
    /// `class`: a request that carries operations of other classes (an MCP
    /// tool call inside `/mcp`) pays for each without being authenticated
    /// again. `None` is an anonymous caller, charged by address.
    pub fn charge(
        &self,
        principal: Option<&Principal>,
        peer: Option<&Peer>,
        class: OpClass,
    ) -> Result<(), ServiceError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        let charged = match (principal, peer) {
            (Some(p), _) => limiter.charge_principal(class, &p.name),
            (None, Some(peer)) => limiter.charge_address(class, peer.remote.ip()),
            // In-process callers have no connection; nothing to charge.
            (None, None) => Ok(()),
        };
        let Err(wait) = charged else {
            return Ok(());
        };
        let retry_after = u32::try_from(wait.as_secs_f64().ceil() as u64)
            .unwrap_or(u32::MAX)
            .max(1);
        let who = match principal {
            Some(p) => format!("principal '{}'", p.name),
            None => peer
                .map(|p| format!("address {}", client_key(p.remote.ip())))
                .unwrap_or_default(),
        };
        Err(ServiceError::RateLimited {
            message: format!(
                "rate limit for {} requests of {who} exceeded; retry in {retry_after} s",
                class.as_str()
            ),
            retry_after,
        })
    }

    /// A stream slot for a caller about to be answered with a stream, or
    /// 429 `rate_limited` when it already holds `max_open_streams`, or it
    /// is anonymous and anonymous callers together hold
    /// `max_anonymous_streams`. `None` for in-process callers.
    pub fn open_stream(
        &self,
        principal: Option<&Principal>,
        peer: Option<&Peer>,
    ) -> Result<Option<StreamSlot>, ServiceError> {
        let streams = &self.streams;
        let owner = match (principal, peer) {
            (Some(p), _) => StreamOwner::Principal(p.name.clone()),
            (None, Some(peer)) => StreamOwner::Address(client_key(peer.remote.ip())),
            (None, None) => return Ok(None),
        };
        let anonymous = matches!(owner, StreamOwner::Address(_));
        let mut held = streams.held();
        if anonymous && held.anonymous >= streams.anonymous_max {
            return Err(ServiceError::RateLimited {
                message: format!(
                    "anonymous callers already hold {} streams on this node, the most they may hold together; authenticate, or retry later",
                    streams.anonymous_max
                ),
                retry_after: 5,
            });
        }
        let open = held.by_owner.entry(owner.clone()).or_insert(0);
        if *open >= streams.max {
            let who = match &owner {
                StreamOwner::Principal(name) => format!("principal '{name}'"),
                StreamOwner::Address(ip) => format!("address {ip}"),
            };
            return Err(ServiceError::RateLimited {
                message: format!(
                    "{who} already has {} streams open, the most one caller may hold; close one and retry",
                    streams.max
                ),
                retry_after: 5,
            });
        }
        *open += 1;
        if anonymous {
            held.anonymous += 1;
        }
        drop(held);
        Ok(Some(StreamSlot {
            streams: streams.clone(),
            owner,
        }))
    }

    /// The streams open on this node now.
    pub fn open_streams(&self) -> StreamCounts {
        let held = self.streams.held();
        let all: usize = held.by_owner.values().sum();
        StreamCounts {
            anonymous: held.anonymous,
            authenticated: all.saturating_sub(held.anonymous),
        }
    }
}

impl Gate {
    /// `admit`, and the audit scope the request's answer runs in when the
    /// trail records it (writes, admin actions and imports): the answer to
    /// an admitted request and a refusal alike, so the trail and the error
    /// body share the correlation id. Both transports call this.
    ///
    /// Admission counts against the request's deadline `limit`: checking a
    /// token may mean fetching the issuer's keys, and an issuer that does
    /// not answer must not hold the request for the outbound client's own
    /// timeout on top of the handler's. The caller gives the handler what
    /// is left of `limit`.
    pub async fn admit_audited(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&Peer>,
        class: OpClass,
        operation: &str,
        limit: Duration,
    ) -> (Result<Identity, ServiceError>, Audited) {
        let admitted = tokio::time::timeout(limit, self.admit(headers, peer, class))
            .await
            .unwrap_or_else(|_| Err(late(limit)));
        let audited = matches!(class, OpClass::Write | OpClass::Admin)
            || operation.ends_with("/Import")
            || operation.starts_with("POST /import/");
        let scope = self.audit.as_ref().filter(|_| audited).map(|log| {
            let principal = admitted.as_ref().ok().and_then(|i| i.0.clone());
            let scope = Scope::new(
                principal,
                peer.map(|p| p.remote.ip().to_string()),
                headers.get("x-request-id").and_then(|v| v.to_str().ok()),
                operation.to_string(),
            );
            (log.clone(), scope)
        });
        (admitted, Audited(scope))
    }
}

/// The audit scope of one request, if the trail records it.
pub struct Audited(Option<(Arc<AuditLog>, Scope)>);

impl Audited {
    /// Runs the request's answer in its scope.
    pub async fn run<F: std::future::Future>(self, answer: F) -> F::Output {
        match self.0 {
            Some((log, scope)) => log.run(scope, answer).await,
            None => answer.await,
        }
    }
}

/// The gRPC status of an answer as grpc-go names it (`OK`, `NotFound`):
/// an error's status is in the headers (trailers-only answer); an answer
/// without one there is a success, or a stream whose outcome comes later.
fn grpc_code_name(headers: &http::HeaderMap) -> String {
    let code = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32);
    match code {
        tonic::Code::Ok => "OK".to_string(),
        other => format!("{other:?}"),
    }
}

/// An answer tonic gave by itself (a trailers-only error without an
/// `ErrorDetail`: the request did not decode or was too large) rewritten
/// with one (`error::with_transport_detail`); every other answer as it is.
/// Errors inside a stream travel in its trailers, from handlers that always
/// attach the detail.
fn with_transport_detail(
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers();
    if headers.contains_key("grpc-status-details-bin") {
        return response;
    }
    match tonic::Status::from_header_map(headers) {
        Some(status) if status.code() != tonic::Code::Ok => {
            super::error::with_transport_detail(status).into_http()
        }
        _ => response,
    }
}

/// Answers are gzip-compressed for a client that compressed its request,
/// as grpc-go's servers answer: most clients advertise gzip in
/// `grpc-accept-encoding` whether or not they want it (grpcio always
/// does), and compressing every answer for them would cost the server CPU
/// for bandwidth nobody asked to save; a client that compresses its own
/// requests (a peer registry across a WAN) has asked. The services answer
/// compressed whenever the client accepts it, so for any other request
/// the header is taken away before they see it.
fn answer_compression_as_asked(headers: &mut http::HeaderMap) {
    let compressed = headers
        .get("grpc-encoding")
        .is_some_and(|e| e.as_bytes() != b"identity");
    if !compressed {
        headers.remove("grpc-accept-encoding");
    }
}

/// The gate as a tower layer over a listener's gRPC services, with the
/// request deadline it holds handlers to (`deadline`, or the client's own
/// `grpc-timeout` when sooner).
#[derive(Clone)]
pub struct GateLayer {
    pub gate: Arc<Gate>,
    pub request_timeout: Duration,
}

impl<S> tower::Layer<S> for GateLayer {
    type Service = GateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GateService {
            gate: self.gate.clone(),
            request_timeout: self.request_timeout,
            inner,
        }
    }
}

#[derive(Clone)]
pub struct GateService<S> {
    gate: Arc<Gate>,
    request_timeout: Duration,
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for GateService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        answer_compression_as_asked(req.headers_mut());
        // The clone is the one that was not made ready; keep the ready one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        let request_timeout = self.request_timeout;
        Box::pin(async move {
            let Some(class) = grpc_class(req.uri().path()) else {
                let unknown =
                    ServiceError::Unsupported(format!("unknown method {}", req.uri().path()));
                let response = tonic::Status::from(unknown).into_http();
                crate::metrics::observe_unrouted(
                    "grpc",
                    grpc_code_name(response.headers()),
                    std::time::Duration::ZERO,
                );
                return Ok(response);
            };
            let peer = req.extensions().get::<Peer>().cloned();
            // The connection is not idle until the answer has been sent.
            let busy = peer.as_ref().map(|p| p.activity.busy());
            let operation = req.uri().path().trim_start_matches('/').to_string();
            // The client's own deadline, when it is the sooner: past it the
            // client has given up, and the work would be wasted.
            let limit = deadline(&operation, request_timeout);
            let limit = client_deadline(req.headers()).map_or(limit, |c| c.min(limit));
            let started = std::time::Instant::now();
            let due = tokio::time::Instant::now() + limit;
            let (admitted, audited) = gate
                .admit_audited(req.headers(), peer.as_ref(), class, &operation, limit)
                .await;
            let response = audited
                .run(async move {
                    match admitted {
                        Ok(identity) => {
                            let slot = if grpc_streams(req.uri().path()) {
                                match gate.open_stream(identity.0.as_ref(), peer.as_ref()) {
                                    Ok(slot) => slot,
                                    Err(e) => return Ok(tonic::Status::from(e).into_http()),
                                }
                            } else {
                                None
                            };
                            req.extensions_mut().insert(identity);
                            let Ok(response) = tokio::time::timeout_at(due, inner.call(req)).await
                            else {
                                return Ok(tonic::Status::from(late(limit)).into_http());
                            };
                            let response = response.map(with_transport_detail)?;
                            Ok(response.map(|b| {
                                tonic::body::Body::new(Answer::new(holding(b, slot), busy))
                            }))
                        }
                        Err(e) => Ok(tonic::Status::from(e).into_http()),
                    }
                })
                .await;
            if let Ok(r) = &response {
                crate::metrics::observe_request(
                    crate::metrics::RequestLabels {
                        transport: "grpc",
                        route: operation,
                        code: grpc_code_name(r.headers()),
                    },
                    started.elapsed(),
                );
            }
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Principal, Role};

    fn peer(ip: &str) -> Peer {
        Peer {
            remote: format!("{ip}:1234").parse().unwrap(),
            client_cert: None,
            activity: Default::default(),
        }
    }

    #[test]
    fn a_grpc_client_deadline_is_read_in_every_unit_and_a_malformed_one_ignored() {
        let of = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            client_deadline(&headers)
        };
        assert_eq!(of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(of("5S"), Some(Duration::from_secs(5)));
        assert_eq!(of("250m"), Some(Duration::from_millis(250)));
        assert_eq!(of("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(of("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "100", "100x", "123456789S", "-1S", "1.5S", "1 S"] {
            assert_eq!(of(bad), None, "{bad:?}");
        }
        assert_eq!(client_deadline(&http::HeaderMap::new()), None);
        // A deadline under a second is said in milliseconds.
        let late = late(Duration::from_millis(250)).to_string();
        assert!(late.contains("250 ms"), "{late}");
    }

    #[test]
    fn adding_a_learner_may_outlast_the_request_deadline_and_its_own_wait() {
        let request = Duration::from_secs(30);
        for op in ["agentry.v1.Cluster/AddLearner", "POST /cluster/learners"] {
            // The leader's wait, then a follower's forwarding, answer first.
            assert!(deadline(op, request) > CATCH_UP_TIMEOUT + request, "{op}");
        }
        for op in ["agentry.v1.Cluster/Check", "POST /cluster/check"] {
            assert!(deadline(op, request) > DIGEST_WAIT + request, "{op}");
        }
        for op in [
            "agentry.v1.Cluster/Promote",
            "agentry.v1.Registry/Register",
            "GET /cluster/learners",
            "POST /cluster/members/4/promote",
        ] {
            assert_eq!(deadline(op, request), request, "{op}");
        }
    }

    #[test]
    fn every_method_of_every_served_service_has_a_class() {
        use prost::Message;
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET).unwrap();
        let mut seen = 0;
        for file in &set.file {
            for service in &file.service {
                let name = format!("{}.{}", file.package(), service.name());
                if name == "agentry.v1.RaftTransport" {
                    // Served only on the Raft listener, behind cluster proof.
                    continue;
                }
                for m in &service.method {
                    let path = format!("/{name}/{}", m.name());
                    assert!(grpc_class(&path).is_some(), "{path} has no class");
                    assert_eq!(
                        grpc_streams(&path),
                        m.server_streaming() || m.client_streaming(),
                        "{path}"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 30, "only {seen} methods");
        assert_eq!(grpc_class("/agentry.v1.RaftTransport/Forward"), None);
        assert_eq!(grpc_class("/agentry.v1.Registry/Nope"), None);
    }

    #[tokio::test]
    async fn buckets_per_address_and_principal() {
        let mut auth = Authenticator::default();
        auth.add_digest(
            &super::super::auth::key_digest("key-of-alice-000001"),
            Principal::new("alice", Role::Publisher),
        );
        let mut limits = RateLimitConfig::default();
        limits.anonymous.discover = rate(1, 3);
        limits.authenticated.discover = rate(1, 5);
        let gate = Gate::new(Arc::new(auth), &limits);
        let anon = http::HeaderMap::new();
        let a = peer("192.0.2.1");
        for _ in 0..3 {
            gate.admit(&anon, Some(&a), OpClass::Discover)
                .await
                .unwrap();
        }
        let e = gate
            .admit(&anon, Some(&a), OpClass::Discover)
            .await
            .unwrap_err();
        assert!(
            matches!(e, ServiceError::RateLimited { retry_after: 1, .. }),
            "{e:?}"
        );
        // Another address, another class, and a principal have their own.
        gate.admit(&anon, Some(&peer("192.0.2.2")), OpClass::Discover)
            .await
            .unwrap();
        gate.admit(&anon, Some(&a), OpClass::Read).await.unwrap();
        let mut md = http::HeaderMap::new();
        md.insert(
            "authorization",
            "Bearer key-of-alice-000001".parse().unwrap(),
        );
        for _ in 0..5 {
            gate.admit(&md, Some(&a), OpClass::Discover).await.unwrap();
        }
        assert!(gate.admit(&md, Some(&a), OpClass::Discover).await.is_err());
        // A bad key is charged to the address, then refused as 401.
        let mut bad = http::HeaderMap::new();
        bad.insert("authorization", "Bearer wrong".parse().unwrap());
        let e = gate
            .admit(&bad, Some(&peer("192.0.2.9")), OpClass::Read)
            .await
            .unwrap_err();
        assert!(matches!(e, ServiceError::Unauthorized(_)));
    }

    #[tokio::test]
    async fn a_caller_holds_at_most_max_open_streams_until_one_closes() {
        let mut auth = Authenticator::default();
        auth.add_digest(
            &super::super::auth::key_digest("key-of-alice-000001"),
            Principal::new("alice", Role::Publisher),
        );
        let limits = RateLimitConfig {
            max_open_streams: 2,
            ..Default::default()
        };
        let gate = Gate::new(Arc::new(auth), &limits);
        let alice = Principal::new("alice", Role::Publisher);
        let (a, b) = (peer("192.0.2.1"), peer("192.0.2.2"));
        let mut held: Vec<_> = (0..2)
            .map(|_| gate.open_stream(None, Some(&a)).unwrap().unwrap())
            .collect();
        let e = gate.open_stream(None, Some(&a)).err().unwrap();
        assert!(
            matches!(&e, ServiceError::RateLimited { retry_after: 5, message } if message.contains("address 192.0.2.1")),
            "{e:?}"
        );
        // Another address and a principal (from the same address) have
        // their own; in-process callers are not counted.
        let other = gate.open_stream(None, Some(&b)).unwrap();
        assert!(other.is_some());
        let alices: Vec<_> = (0..2)
            .map(|_| gate.open_stream(Some(&alice), Some(&a)).unwrap())
            .collect();
        assert!(gate.open_stream(Some(&alice), Some(&b)).is_err());
        assert!(gate.open_stream(None, None).unwrap().is_none());
        // A slot comes back when its stream is dropped, and a caller with
        // none open is forgotten.
        drop(held.pop());
        let again = gate.open_stream(None, Some(&a)).unwrap();
        assert!(again.is_some());
        drop(again);
        let counts = StreamCounts {
            anonymous: 2,
            authenticated: 2,
        };
        assert_eq!(gate.open_streams(), counts);
        drop(alices);
        let open = gate.streams.held().by_owner.clone();
        assert_eq!(open.len(), 2, "{open:?}");
        assert!(!open.contains_key(&StreamOwner::Principal("alice".into())));
        drop((held, other));
        assert_eq!(gate.open_streams(), StreamCounts::default());

        // Not limited when rate limits are off, or at 0, but still counted.
        for limits in [
            RateLimitConfig {
                enabled: false,
                ..Default::default()
            },
            RateLimitConfig {
                max_open_streams: 0,
                max_anonymous_streams: 0,
                ..Default::default()
            },
        ] {
            let gate = Gate::new(Arc::new(Authenticator::default()), &limits);
            let many: Vec<_> = (0..150)
                .map(|_| gate.open_stream(None, Some(&a)).unwrap())
                .collect();
            assert!(many.iter().all(Option::is_some));
            assert_eq!(gate.open_streams().anonymous, 150);
        }
    }

    #[tokio::test]
    async fn anonymous_callers_together_hold_at_most_their_share() {
        let limits = RateLimitConfig {
            max_open_streams: 2,
            max_anonymous_streams: 5,
            ..Default::default()
        };
        let gate = Gate::new(Arc::new(Authenticator::default()), &limits);
        let mut held: Vec<_> = (1..=5)
            .map(|i| {
                let who = peer(&format!("192.0.2.{i}"));
                gate.open_stream(None, Some(&who)).unwrap().unwrap()
            })
            .collect();
        // A sixth address, under its own limit, finds the anonymous share
        // taken; a principal is served from its own allowance.
        let e = gate.open_stream(None, Some(&peer("192.0.2.6"))).err();
        assert!(
            matches!(&e, Some(ServiceError::RateLimited { retry_after: 5, message }) if message.contains("anonymous callers already hold 5 streams")),
            "{e:?}"
        );
        let operator = Principal::new("operator", Role::Admin);
        let theirs = gate.open_stream(Some(&operator), Some(&peer("192.0.2.6")));
        assert!(theirs.unwrap().is_some());
        // A refusal took nothing; a closed stream frees a place in the share.
        assert_eq!(gate.open_streams().anonymous, 5);
        assert!(!gate
            .streams
            .held()
            .by_owner
            .contains_key(&StreamOwner::Address("192.0.2.6".parse().unwrap())));
        drop(held.pop());
        let sixth = gate.open_stream(None, Some(&peer("192.0.2.6"))).unwrap();
        assert!(sixth.is_some());
    }

    #[tokio::test]
    async fn many_addresses_share_one_bucket_past_the_cap() {
        let mut limits = RateLimitConfig {
            max_tracked_keys: 16,
            ..Default::default()
        };
        limits.anonymous.read = rate(1, 1);
        let gate = Gate::new(Arc::new(Authenticator::default()), &limits);
        let anon = http::HeaderMap::new();
        let mut refused = 0;
        for i in 0..200u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            if gate
                .admit(&anon, Some(&peer(&ip.to_string())), OpClass::Read)
                .await
                .is_err()
            {
                refused += 1;
            }
        }
        let tracked = gate.limiter.as_ref().unwrap().by_address[0].len();
        assert!(tracked <= 17, "{tracked} keys tracked");
        assert!(refused > 150, "{refused}");
        // IPv6 addresses of one /64 share a bucket.
        assert_eq!(
            client_key("2001:db8:1:2:3:4:5:6".parse().unwrap()),
            client_key("2001:db8:1:2:ffff::1".parse().unwrap())
        );
    }
}
