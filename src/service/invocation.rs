//! Invocation use case (AIDIP 5, WoA 5): find the agent, read the body,
//! choose the operation and the binding, validate the input against the
//! operation's schema, apply the agent's authentication, call it through
//! the outbound guard, and check its answer against the output schema.
//!
//! Nothing is sent to an agent before every check has passed. Per-node
//! state (compiled schemas, in-flight limits, idempotency keys) lives here
//! and is not replicated: a retried key reaches the same answer only on the
//! node that gave it (docs/invocation.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};
use tracing::instrument;

use super::error::ServiceError;
use super::registry::{Consistency, RegistryService};
use super::woa_host::WoaHost;
use crate::config::{CredentialConfig, GatewayConfig};
use crate::domain::invoke::{parse_body, select_operation, Body, Call, Target};
use crate::domain::resolve::preferred_binding;
use crate::domain::validate::{agent_header, binding_headers, check_instance, compile_schema};
use crate::domain::{AgentMetadata, AgentRecord, AgentStatus, Binding, FieldError, Principal};
use crate::gateway::outbound::OutboundError;
use crate::gateway::token::ClientCredentials;
use crate::gateway::transport::a2a::Continuation;
use crate::gateway::transport::{self, Answer, CallSpec, Event, GatewayError, Outbound, Started};

type Result<T> = std::result::Result<T, ServiceError>;

/// An invocation as the API layer hands it over.
#[derive(Debug, Clone, Default)]
pub struct InvokeRequest {
    /// Registry id or WoA token.
    pub agent_id: String,
    /// JSON text.
    pub body: Bytes,
    pub operation: Option<String>,
    pub protocols: Vec<String>,
    pub idempotency_key: Option<String>,
    pub agent_authorization: Option<String>,
    /// Answers the question of an A2A task that waits for input (set by
    /// the Agent Protocol surface's ResumeWithInput).
    pub continues: Option<Continuation>,
}

/// How an answer compares with the output schema.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputCheck {
    Valid,
    Invalid {
        pointer: String,
        message: String,
    },
    /// No schema, or not a success.
    Unchecked,
}

/// One answer the gateway returns.
#[derive(Debug, Clone)]
pub struct Invoked {
    pub status: u16,
    pub body: Bytes,
    pub content_type: String,
    pub output_check: OutputCheck,
    pub protocol: String,
    pub endpoint: String,
    pub retry_after: Option<u32>,
    /// What the agent asked for when it refused the call's credentials
    /// (its `WWW-Authenticate`).
    pub challenge: Option<String>,
}

/// The answer to one request body.
#[derive(Debug, Clone)]
pub enum Outcome {
    Single(Invoked),
    /// In the order of the request's elements; each fails on its own.
    Batch(Vec<std::result::Result<Invoked, Arc<ServiceError>>>),
}

/// An outcome, and whether it was replayed for a repeated key.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub outcome: Outcome,
    pub replayed: bool,
}

/// Compiled schemas of one operation of one record revision.
struct Schemas {
    inputs: Option<jsonschema::Validator>,
    outputs: Option<jsonschema::Validator>,
}

type SchemaKey = (String, u64, String);

/// Compiled schemas by agent, revision and operation, with the size of
/// the JSON they were compiled from.
#[derive(Default)]
struct SchemaCache {
    entries: HashMap<SchemaKey, (Arc<Schemas>, usize)>,
    bytes: usize,
}

impl SchemaCache {
    /// Keeps `compiled` (from `size` bytes of JSON). An agent's earlier
    /// revisions are never asked for again, so they go: a publisher
    /// updating one record cannot fill the cache with them. Past
    /// [`MAX_SCHEMAS`] or [`MAX_SCHEMA_BYTES`] it starts over.
    fn insert(&mut self, key: SchemaKey, compiled: Arc<Schemas>, size: usize) {
        let bytes = &mut self.bytes;
        self.entries.retain(|(id, revision, _), (_, b)| {
            let stale = *id == key.0 && *revision != key.1;
            if stale {
                *bytes -= *b;
            }
            !stale
        });
        if self.entries.len() >= MAX_SCHEMAS || self.bytes + size > MAX_SCHEMA_BYTES {
            self.entries.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.entries.insert(key, (compiled, size));
    }
}
type IdempotencyKey = (String, String, String);

struct Remembered {
    fingerprint: [u8; 32],
    answer: Arc<OnceCell<Outcome>>,
    /// The kept answer's size (0 while the call runs).
    bytes: usize,
    /// The size of a first answer too large to keep: a repeat is refused
    /// rather than calling the agent again.
    not_kept: Option<usize>,
}

/// Keys seen within the window, oldest first, and the bytes of the
/// answers they keep.
#[derive(Default)]
struct Idempotency {
    entries: HashMap<IdempotencyKey, Remembered>,
    order: VecDeque<(Instant, IdempotencyKey)>,
    bytes: usize,
}

impl Idempotency {
    fn forget_oldest(&mut self) {
        if let Some((_, old)) = self.order.pop_front() {
            if let Some(r) = self.entries.remove(&old) {
                self.bytes -= r.bytes;
            }
        }
    }
}

/// Entries kept at most, whatever the window (each holds an answer).
const MAX_REMEMBERED: usize = 10_000;
/// The longest `Idempotency-Key` taken (the MCP tool's bound too): keys
/// are held in memory for the window.
const MAX_IDEMPOTENCY_KEY: usize = 256;
/// Compiled operations kept; the cache starts over when it fills.
const MAX_SCHEMAS: usize = 4_096;
/// The schemas' JSON the cache may hold (their compiled forms are a few
/// times as large); it starts over past it.
const MAX_SCHEMA_BYTES: usize = 32 * 1024 * 1024;
/// Batch elements called at the same time.
const BATCH_PARALLELISM: usize = 4;

/// A credential for the agents it names: a header to inject (a value read
/// once at start, or a token the gateway gets itself), a client
/// certificate of its own, or both.
struct Credential {
    agent: String,
    header: Option<(String, String)>,
    /// The header that carries the gateway's own token, and its source.
    token: Option<(String, Arc<ClientCredentials>)>,
    /// The client presenting the credential's certificate.
    outbound: Option<Outbound>,
}

/// What a call to one agent goes out with.
#[derive(Clone)]
pub(super) struct Credentials {
    pub headers: Vec<(String, String)>,
    /// A header whose value is the gateway's own token, fetched when the
    /// call is sent (a token may expire while a call waits).
    token: Option<(String, Arc<ClientCredentials>)>,
    /// The guarded client presenting the certificate meant for the agent
    /// (`gateway.outbound`'s unless a credential names its own).
    pub outbound: Outbound,
}

impl Credentials {
    /// The headers of the next request, and the token among them.
    pub(super) async fn headers(&self) -> Result<(Vec<(String, String)>, Option<String>)> {
        let mut headers = self.headers.clone();
        let Some((name, source)) = &self.token else {
            return Ok((headers, None));
        };
        let bearer = source.bearer().await?;
        headers.push((name.clone(), bearer.clone()));
        Ok((headers, Some(bearer)))
    }

    /// The credentials with the headers `binding` declares for every
    /// request (`validate::binding_headers`: settings such as a region),
    /// sent first; a header the credential travels in stays the
    /// credential's. A declaration the record's checks would refuse (a
    /// record of another registry, or stored before them) is 501.
    pub(super) fn with_binding(mut self, agent: &str, binding: &Binding) -> Result<Self> {
        let declared = binding_headers(binding).map_err(|e| {
            ServiceError::Unsupported(format!(
                "agent '{agent}' cannot be called: its binding declares headers{}: {}",
                e.pointer, e.message
            ))
        })?;
        let credential = |name: &str| {
            let token = self.token.as_ref().map(|(h, _)| h);
            self.headers
                .iter()
                .map(|(h, _)| h)
                .chain(token)
                .any(|h| h.eq_ignore_ascii_case(name))
        };
        let mut headers: Vec<_> = declared
            .into_iter()
            .filter(|(n, _)| !credential(n))
            .collect();
        headers.append(&mut self.headers);
        self.headers = headers;
        Ok(self)
    }

    /// The agent answered `status` to a request that carried `bearer`: a
    /// 401 means the token is no good, and the next call gets a new one.
    pub(super) async fn answered(&self, bearer: Option<String>, status: u16) {
        if let (Some((_, source)), Some(bearer), 401) = (&self.token, bearer, status) {
            source.refused(&bearer).await;
        }
    }
}

impl Credential {
    fn matches(&self, id: &str) -> bool {
        match self.agent.strip_suffix('*') {
            Some(prefix) => id.starts_with(prefix),
            None => self.agent == id,
        }
    }
}

/// The invocation gateway's use cases.
#[derive(Clone)]
pub struct InvocationService {
    inner: Arc<Inner>,
}

struct Inner {
    registry: RegistryService,
    outbound: Outbound,
    woa: WoaHost,
    anonymous: bool,
    max_concurrent: usize,
    window: Duration,
    /// Bytes of answers the idempotency memo keeps.
    memo_bytes: usize,
    credentials: Vec<Credential>,
    schemas: Mutex<SchemaCache>,
    inflight: Mutex<HashMap<String, Arc<Semaphore>>>,
    idempotency: Mutex<Idempotency>,
    ap_runs: super::agent_protocol::ApRuns,
}

/// A call that passed every check, ready to go out.
struct Prepared {
    record: Arc<AgentRecord>,
    call: Call,
    operation: Option<String>,
    schemas: Arc<Schemas>,
    binding: usize,
    credentials: Credentials,
    continues: Option<Continuation>,
}

fn invalid(e: FieldError, prefix: &str) -> ServiceError {
    ServiceError::InvalidRequest {
        field: Some(format!("{prefix}{}", e.pointer)),
        message: if prefix.is_empty() {
            e.to_string()
        } else {
            format!("{prefix}{}: {}", e.pointer, e.message)
        },
    }
}

impl From<GatewayError> for ServiceError {
    fn from(e: GatewayError) -> Self {
        let message = e.to_string();
        match e {
            GatewayError::Outbound(OutboundError::Refused { .. }) => Self::Forbidden(message),
            GatewayError::Outbound(OutboundError::Timeout { .. }) | GatewayError::Timeout(_) => {
                Self::Timeout(message)
            }
            GatewayError::Outbound(OutboundError::TooLarge { .. })
            | GatewayError::Outbound(OutboundError::Unreachable { .. })
            | GatewayError::BadAnswer(_)
            | GatewayError::Refused { .. } => Self::BadUpstream(message),
            GatewayError::Overloaded { retry_after, .. } => Self::Overloaded {
                message,
                retry_after,
            },
            GatewayError::Unsupported(_) => Self::Unsupported(message),
        }
    }
}

/// The gateway's configured credentials (`[[gateway.credentials]]`), read
/// before the node starts: a variable unset or a certificate unreadable
/// stops the start before it touches the data directory.
pub struct ConfiguredCredentials(Vec<Credential>);

impl ConfiguredCredentials {
    pub fn load(config: &GatewayConfig, outbound: &Outbound) -> std::result::Result<Self, String> {
        config
            .credentials
            .iter()
            .map(|c| credential(c, outbound))
            .collect::<std::result::Result<_, _>>()
            .map(Self)
    }
}

impl InvocationService {
    pub fn new(
        registry: RegistryService,
        config: &GatewayConfig,
        outbound: Outbound,
        credentials: ConfiguredCredentials,
        woa: WoaHost,
    ) -> Self {
        let credentials = credentials.0;
        Self {
            inner: Arc::new(Inner {
                registry,
                outbound,
                woa,
                anonymous: config.anonymous_invoke,
                max_concurrent: config.max_concurrent_per_agent,
                window: Duration::from_secs(config.idempotency_window_secs),
                memo_bytes: config.idempotency_max_bytes,
                credentials,
                schemas: Mutex::default(),
                inflight: Mutex::new(HashMap::new()),
                idempotency: Mutex::new(Idempotency::default()),
                ap_runs: super::agent_protocol::ApRuns::new(
                    Duration::from_secs(config.run_input_wait_secs),
                    config.runs_max_bytes,
                ),
            }),
        }
    }

    pub fn outbound(&self) -> &Outbound {
        &self.inner.outbound
    }

    /// Every tool the MCP server `binding` of `record` lists, asked with
    /// the credentials a call to it would carry (configured ones, else the
    /// caller's `agent_authorization`).
    pub async fn list_mcp_tools(
        &self,
        record: &AgentRecord,
        binding: &Binding,
        agent_authorization: Option<String>,
    ) -> Result<Vec<rmcp::model::Tool>> {
        let c = self
            .credentials_for(
                record,
                &InvokeRequest {
                    agent_authorization,
                    ..Default::default()
                },
            )?
            .with_binding(&record.metadata.id, binding)?;
        let (headers, _) = c.headers().await?;
        Ok(crate::gateway::mcp_tools::list_tools(&c.outbound, &binding.endpoint, &headers).await?)
    }

    pub fn registry(&self) -> &RegistryService {
        &self.inner.registry
    }

    pub fn woa(&self) -> &WoaHost {
        &self.inner.woa
    }

    pub(super) fn ap_runs(&self) -> &super::agent_protocol::ApRuns {
        &self.inner.ap_runs
    }

    pub(super) fn require_caller(&self, principal: Option<&Principal>) -> Result<()> {
        if principal.is_none() && !self.inner.anonymous {
            return Err(ServiceError::Unauthorized(
                "invoking an agent needs an API key (Authorization: Bearer <key>)".into(),
            ));
        }
        Ok(())
    }

    /// The record the path names: by id, else by its WoA token.
    pub(super) async fn agent(
        &self,
        principal: Option<&Principal>,
        id: &str,
    ) -> Result<AgentRecord> {
        let registry = &self.inner.registry;
        let record = match registry.get(principal, id, Consistency::Local).await {
            Err(ServiceError::NotFound(m)) => {
                match self.inner.woa.id_for_token(registry, id).await? {
                    Some(real) => registry.get(principal, &real, Consistency::Local).await?.0,
                    None => return Err(ServiceError::NotFound(m)),
                }
            }
            other => other?.0,
        };
        if record.metadata.effective_status() == AgentStatus::Inactive {
            return Err(ServiceError::Unavailable {
                message: format!("agent '{}' is inactive", record.metadata.id),
                leader: None,
            });
        }
        Ok(record)
    }

    /// Calls an agent (or, for an array body, each element).
    #[instrument(name = "gateway.invoke", skip_all, fields(agent_id = %req.agent_id))]
    pub async fn invoke(
        &self,
        principal: Option<&Principal>,
        req: InvokeRequest,
    ) -> Result<Invocation> {
        self.require_caller(principal)?;
        let record = Arc::new(self.agent(principal, &req.agent_id).await?);
        let body = self.parse(&record, &req)?;
        let Some(key) = req.idempotency_key.clone().filter(|k| !k.is_empty()) else {
            let outcome = Box::pin(self.run(&record, body, &req)).await?;
            return Ok(Invocation {
                outcome,
                replayed: false,
            });
        };
        let (k, cell) = self.remember(principal, &record.metadata.id, &key, &req)?;
        let mut ran = false;
        let outcome = cell
            .get_or_try_init(|| {
                ran = true;
                Box::pin(self.run(&record, body, &req))
            })
            .await?
            .clone();
        if ran {
            self.kept(&k, &cell, &outcome);
        }
        Ok(Invocation {
            outcome,
            replayed: !ran,
        })
    }

    /// Calls an agent and relays its events. Events after the first are
    /// produced while the stream is read; dropping it cancels the call.
    #[instrument(name = "gateway.invoke_stream", skip_all, fields(agent_id = %req.agent_id))]
    pub async fn invoke_stream(
        &self,
        principal: Option<&Principal>,
        req: InvokeRequest,
    ) -> Result<BoxStream<'static, std::result::Result<Event, ServiceError>>> {
        self.require_caller(principal)?;
        let record = Arc::new(self.agent(principal, &req.agent_id).await?);
        let call = match self.parse(&record, &req)? {
            Body::Single(call) => call,
            Body::Batch(_) => {
                return Err(ServiceError::InvalidRequest {
                    field: Some(String::new()),
                    message: "a batch cannot be streamed; send one call".into(),
                })
            }
        };
        let prepared = self.prepare(&record, call, &req, "")?;
        let permit = self.permit(&record.metadata.id)?;
        let binding = &prepared.record.metadata.bindings[prepared.binding];
        let (headers, bearer) = prepared.credentials.headers().await?;
        let spec = CallSpec {
            binding,
            operation: prepared.operation.as_deref(),
            name_operation: prepared.record.metadata.operations.len() > 1,
            input: &prepared.call.input,
            stream: true,
            headers,
            continues: prepared.continues.as_ref(),
        };
        let started = transport::open_stream(&prepared.credentials.outbound, &spec).await?;
        Ok(match started {
            Started::Whole(answer) => {
                prepared.credentials.answered(bearer, answer.status).await;
                let invoked = finish(&prepared, answer);
                let events = whole_events(invoked);
                drop(permit);
                futures::stream::iter(events.into_iter().map(Ok)).boxed()
            }
            Started::Events(events) => events
                // The permit lives as long as the relay.
                .map(move |e| {
                    let _held: &OwnedSemaphorePermit = &permit;
                    e.map_err(ServiceError::from)
                })
                .chain(futures::stream::once(async {
                    Ok(Event {
                        event: "end".into(),
                        data: r#"{"status":200}"#.into(),
                        id: None,
                    })
                }))
                .boxed(),
        })
    }

    /// The request's body, and its `Idempotency-Key` checked: every call
    /// that carries one passes here before it is remembered or sent.
    fn parse(&self, record: &AgentRecord, req: &InvokeRequest) -> Result<Body> {
        let value = crate::domain::json::parse_json(&req.body).map_err(|e| {
            ServiceError::InvalidRequest {
                field: Some(String::new()),
                message: format!("the invocation body is not valid JSON: {e}"),
            }
        })?;
        let id = record.metadata.id.as_str();
        let token = crate::gateway::import::woa_token(id);
        let body = parse_body(value, &[id, token.as_str()]).map_err(|e| invalid(e, ""))?;
        if let Some(k) = &req.idempotency_key {
            idempotency_key(k)?;
        }
        Ok(body)
    }

    /// Runs a parsed body: one call, or each element of a batch.
    async fn run(
        &self,
        record: &Arc<AgentRecord>,
        body: Body,
        req: &InvokeRequest,
    ) -> Result<Outcome> {
        match body {
            Body::Single(call) => {
                let prepared = self.prepare(record, call, req, "")?;
                Ok(Outcome::Single(self.send(&prepared).await?))
            }
            Body::Batch(items) => {
                let results = futures::stream::iter(items.into_iter().enumerate().map(
                    |(i, item)| async move {
                        let at = format!("/{i}");
                        let call = item.map_err(|e| invalid(e, ""))?;
                        let prepared = self.prepare(record, call, req, &at)?;
                        self.send(&prepared).await
                    },
                ))
                .buffered(BATCH_PARALLELISM)
                .map(|r| r.map_err(Arc::new))
                .collect()
                .await;
                Ok(Outcome::Batch(results))
            }
        }
    }

    /// Every check before a call: binding, operation (which may depend on
    /// the binding: `domain::invoke`), input schema, authentication. `at`
    /// prefixes pointers for a batch element.
    fn prepare(
        &self,
        record: &Arc<AgentRecord>,
        call: Call,
        req: &InvokeRequest,
        at: &str,
    ) -> Result<Prepared> {
        let meta = &record.metadata;
        let accepted: Vec<String> = req
            .protocols
            .iter()
            .map(|p| p.to_ascii_lowercase())
            .collect();
        let binding = call_binding(meta, &accepted).ok_or_else(|| no_binding(record, &accepted))?;
        let requested = call.operation.as_deref().or(req.operation.as_deref());
        let target =
            select_operation(meta, Some(binding), requested).map_err(|e| invalid(e, at))?;
        let schemas = self.schemas(record, &target)?;
        // A follow-up answers the agent's question, not the operation's
        // input schema.
        let checked = schemas.inputs.as_ref().filter(|_| req.continues.is_none());
        if let Some(v) = checked {
            let prefix = if call.envelope {
                format!("{at}/input")
            } else {
                at.to_string()
            };
            check_instance(v, &call.input, "").map_err(|e| invalid(e, &prefix))?;
        }
        let operation = target.name().map(String::from);
        let mut credentials = self
            .credentials_for(record, req)?
            .with_binding(&meta.id, binding)?;
        let binding = meta
            .bindings
            .iter()
            .position(|b| std::ptr::eq(b, binding))
            .unwrap_or_default();
        if let Some(k) = &req.idempotency_key {
            credentials
                .headers
                .push(("Idempotency-Key".into(), k.clone()));
        }
        Ok(Prepared {
            record: record.clone(),
            operation,
            call,
            schemas,
            binding,
            credentials,
            continues: req.continues.clone(),
        })
    }

    /// Sends a prepared call, holding one of the agent's in-flight permits.
    async fn send(&self, p: &Prepared) -> Result<Invoked> {
        let _permit = self.permit(&p.record.metadata.id)?;
        let binding = &p.record.metadata.bindings[p.binding];
        let (headers, bearer) = p.credentials.headers().await?;
        let spec = CallSpec {
            binding,
            operation: p.operation.as_deref(),
            name_operation: p.record.metadata.operations.len() > 1,
            input: &p.call.input,
            stream: false,
            headers,
            continues: p.continues.as_ref(),
        };
        let answer = transport::call(&p.credentials.outbound, &spec).await?;
        p.credentials.answered(bearer, answer.status).await;
        Ok(finish(p, answer))
    }

    pub(super) fn permit(&self, id: &str) -> Result<OwnedSemaphorePermit> {
        let max = self.inner.max_concurrent;
        let sem = {
            let mut map = self
                .inner
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            map.entry(id.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(max)))
                .clone()
        };
        sem.try_acquire_owned().map_err(|_| ServiceError::Overloaded {
            message: format!(
                "agent '{id}' already has {max} calls in flight through this node (gateway.max_concurrent_per_agent)"
            ),
            retry_after: Some(1),
        })
    }

    /// The compiled schemas of a target, cached per declared operation (a
    /// tool name a caller makes up selects no schema of its own, so it
    /// neither needs nor gets an entry).
    fn schemas(&self, record: &AgentRecord, target: &Target<'_>) -> Result<Arc<Schemas>> {
        let key = (
            record.metadata.id.clone(),
            record.envelope.revision,
            target.operation.map(|o| o.name.clone()).unwrap_or_default(),
        );
        if let Some((s, _)) = self
            .inner
            .schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .get(&key)
        {
            return Ok(s.clone());
        }
        let compile = |s: Option<&Value>| {
            s.map(|s| compile_schema(s, "")).transpose().map_err(|e| {
                ServiceError::Internal(format!("a stored schema does not compile: {e}"))
            })
        };
        let compiled = Arc::new(Schemas {
            inputs: compile(target.inputs)?,
            outputs: compile(target.outputs)?,
        });
        let size = [target.inputs, target.outputs]
            .into_iter()
            .flatten()
            .map(crate::domain::json::json_bytes)
            .sum::<usize>();
        self.inner
            .schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, compiled.clone(), size);
        Ok(compiled)
    }

    /// The headers that carry the agent's credential (one configured for
    /// it, else the caller's `Agent-Authorization`) and the client that
    /// presents the certificate meant for it. An agent that requires
    /// authentication and gets none of them → 401 before anything is sent.
    pub(super) fn credentials_for(
        &self,
        record: &AgentRecord,
        req: &InvokeRequest,
    ) -> Result<Credentials> {
        let meta = &record.metadata;
        let configured = self.inner.credentials.iter().find(|c| c.matches(&meta.id));
        // The credential's own certificate, else `gateway.outbound`'s.
        let outbound = configured
            .and_then(|c| c.outbound.clone())
            .unwrap_or_else(|| self.inner.outbound.clone());
        let with = |headers| Credentials {
            headers,
            token: None,
            outbound: outbound.clone(),
        };
        if let Some(header) = configured.and_then(|c| c.header.clone()) {
            return Ok(with(vec![header]));
        }
        if let Some(token) = configured.and_then(|c| c.token.clone()) {
            return Ok(Credentials {
                token: Some(token),
                ..with(Vec::new())
            });
        }
        let auth = meta.authentication.as_ref().or(meta.auth.as_ref());
        let kind = auth
            .and_then(|a| a.kind.as_deref())
            .unwrap_or("none")
            .to_ascii_lowercase();
        let header = auth
            .and_then(|a| a.extra.get("header"))
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| {
                if kind == "api_key" {
                    "X-API-Key".into()
                } else {
                    "Authorization".into()
                }
            });
        match (&req.agent_authorization, kind.as_str()) {
            (Some(v), _) if !v.is_empty() => {
                header_value(v, "/agent_authorization")?;
                // Records are checked when written; one written before
                // that check (or by another registry) gets a clear answer.
                agent_header(&header).map_err(|e| {
                    ServiceError::Unsupported(format!(
                        "agent '{}' cannot take a credential: its record's authentication header {e}",
                        meta.id
                    ))
                })?;
                Ok(with(vec![(header, v.clone())]))
            }
            (_, "none") => Ok(with(Vec::new())),
            (_, "mtls") if outbound.presents_certificate() => Ok(with(Vec::new())),
            (_, "mtls") => Err(ServiceError::Unsupported(format!(
                "agent '{}' requires mutual TLS, and the gateway has no client certificate to present: configure gateway.outbound.client_cert_file, or client_cert_file on a gateway.credentials entry for the agent",
                meta.id
            ))),
            (_, kind) => Err(ServiceError::AgentCredentialRequired {
                agent: meta.id.clone(),
                message: format!(
                    "agent '{}' requires {kind} authentication: pass its credential in the Agent-Authorization header (gRPC: agent_authorization), or configure gateway.credentials",
                    meta.id
                ),
            }),
        }
    }

    /// The answer cell of an idempotency key: the first call with the key
    /// fills it, and later ones (or concurrent ones, which wait) read it. A
    /// call that fails leaves it empty, so a retry runs again.
    fn remember(
        &self,
        principal: Option<&Principal>,
        id: &str,
        key: &str,
        req: &InvokeRequest,
    ) -> Result<(IdempotencyKey, Arc<OnceCell<Outcome>>)> {
        let mut h = Sha256::new();
        h.update(&req.body);
        h.update([0]);
        h.update(req.operation.as_deref().unwrap_or_default());
        for p in &req.protocols {
            h.update([0]);
            h.update(p);
        }
        let fingerprint: [u8; 32] = h.finalize().into();
        let owner = principal.map(|p| p.name.clone()).unwrap_or_default();
        let k = (owner, id.to_string(), key.to_string());
        let now = Instant::now();
        let mut memo = self
            .inner
            .idempotency
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while let Some((at, _)) = memo.order.front() {
            if now.duration_since(*at) < self.inner.window && memo.entries.len() < MAX_REMEMBERED {
                break;
            }
            memo.forget_oldest();
        }
        if let Some(r) = memo.entries.get(&k) {
            if r.fingerprint != fingerprint {
                return Err(ServiceError::Conflict(format!(
                    "Idempotency-Key '{key}' was used with a different request within the last {} s",
                    self.inner.window.as_secs()
                )));
            }
            if let Some(size) = r.not_kept {
                return Err(ServiceError::Conflict(format!(
                    "Idempotency-Key '{key}' was answered within the last {} s, but that answer ({size} bytes) was larger than this node keeps for a repeat ({} bytes); the agent was not called again",
                    self.inner.window.as_secs(),
                    self.inner.memo_bytes / 8
                )));
            }
            return Ok((k, r.answer.clone()));
        }
        let answer = Arc::new(OnceCell::new());
        memo.entries.insert(
            k.clone(),
            Remembered {
                fingerprint,
                answer: answer.clone(),
                bytes: 0,
                not_kept: None,
            },
        );
        memo.order.push_back((now, k.clone()));
        Ok((k, answer))
    }

    /// Counts the first answer to `k` against the memo's bytes, forgetting
    /// the oldest answers past them. One over an eighth of them is not
    /// kept, so a few large answers cannot push every other key out; a
    /// repeat of it is refused instead of calling the agent again.
    fn kept(&self, k: &IdempotencyKey, cell: &Arc<OnceCell<Outcome>>, outcome: &Outcome) {
        let size = outcome_bytes(outcome);
        let mut memo = self
            .inner
            .idempotency
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Forgotten meanwhile (the window, the count), or another call's.
        let Some(r) = memo
            .entries
            .get_mut(k)
            .filter(|r| Arc::ptr_eq(&r.answer, cell))
        else {
            return;
        };
        if size > self.inner.memo_bytes / 8 {
            r.answer = Arc::new(OnceCell::new());
            r.not_kept = Some(size);
            return;
        }
        r.bytes = size;
        memo.bytes += size;
        while memo.bytes > self.inner.memo_bytes && !memo.order.is_empty() {
            memo.forget_oldest();
        }
    }
}

/// About what an outcome holds in memory: its bodies and texts.
fn outcome_bytes(outcome: &Outcome) -> usize {
    let invoked = |i: &Invoked| {
        i.body.len()
            + i.content_type.len()
            + i.protocol.len()
            + i.endpoint.len()
            + i.challenge.as_ref().map_or(0, String::len)
            + std::mem::size_of::<Invoked>()
    };
    match outcome {
        Outcome::Single(i) => invoked(i),
        Outcome::Batch(results) => results
            .iter()
            .map(|r| match r {
                Ok(i) => invoked(i),
                Err(e) => e.to_string().len() + std::mem::size_of::<Invoked>(),
            })
            .sum(),
    }
}

/// An `Idempotency-Key` that can travel in a header and is not longer
/// than keys are kept.
fn idempotency_key(key: &str) -> Result<()> {
    header_value(key, "/idempotency_key")?;
    if key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(ServiceError::InvalidRequest {
            field: Some("/idempotency_key".into()),
            message: format!(
                "/idempotency_key: at most {MAX_IDEMPOTENCY_KEY} bytes, not {}",
                key.len()
            ),
        });
    }
    Ok(())
}

fn credential(c: &CredentialConfig, base: &Outbound) -> std::result::Result<Credential, String> {
    if let Some(h) = &c.header {
        agent_header(h)
            .map_err(|e| format!("gateway.credentials for '{}': header {e}", c.agent))?;
    }
    let value = match (&c.value, &c.value_env) {
        (Some(v), _) => Some(v.clone()),
        (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
            format!(
                "gateway.credentials for '{}': environment variable {var} is not set",
                c.agent
            )
        })?),
        (None, None) => None,
    };
    let outbound = match (&c.client_cert_file, &c.client_key_file) {
        (Some(cert), Some(key)) => Some(
            base.presenting(cert.clone(), key.clone())
                .map_err(|e| format!("gateway.credentials for '{}': {e}", c.agent))?,
        ),
        _ => None,
    };
    let header = || c.header.clone().unwrap_or_else(|| "Authorization".into());
    let token = match &c.oauth2 {
        Some(o) => {
            let source =
                ClientCredentials::new(o, outbound.clone().unwrap_or_else(|| base.clone()))
                    .map_err(|e| format!("gateway.credentials for '{}': {e}", c.agent))?;
            Some((header(), Arc::new(source)))
        }
        None => None,
    };
    if value.is_none() && token.is_none() && outbound.is_none() {
        return Err(format!(
            "gateway.credentials for '{}': no value, token source or client certificate",
            c.agent
        ));
    }
    Ok(Credential {
        agent: c.agent.clone(),
        header: value.map(|v| (header(), v)),
        token,
        outbound,
    })
}

/// The binding a call goes over: the preferred one the gateway can call,
/// among the protocols the caller accepts (empty: any).
pub(super) fn call_binding<'a>(
    meta: &'a AgentMetadata,
    accepted: &[String],
) -> Option<&'a Binding> {
    preferred_binding(&meta.bindings, |b| {
        let p = b.protocol.to_ascii_lowercase();
        transport::callable(b) && (accepted.is_empty() || accepted.contains(&p))
    })
}

/// Refuses a caller's value that cannot travel in an HTTP header (a
/// control character, which gRPC and the MCP tools can carry): it would
/// fail only when the call is sent, as if the agent were unreachable.
fn header_value(v: &str, field: &str) -> Result<()> {
    if crate::domain::validate::header_value(v) {
        return Ok(());
    }
    Err(ServiceError::InvalidRequest {
        field: Some(field.into()),
        message: "must be visible ASCII characters and spaces only: it is sent to the agent in an HTTP header".into(),
    })
}

fn no_binding(record: &AgentRecord, accepted: &[String]) -> ServiceError {
    let offered: Vec<&str> = record
        .metadata
        .bindings
        .iter()
        .map(|b| b.protocol.as_str())
        .collect();
    let callable = record.metadata.bindings.iter().any(transport::callable);
    if !accepted.is_empty() && callable {
        return ServiceError::InvalidRequest {
            field: Some("/protocols".into()),
            message: format!(
                "agent '{}' has no binding with an acceptable protocol ({}); it offers {}",
                record.metadata.id,
                accepted.join(", "),
                offered.join(", ")
            ),
        };
    }
    ServiceError::Unsupported(format!(
        "agent '{}' offers only bindings the gateway cannot call ({}); the gateway speaks {}",
        record.metadata.id,
        offered.join(", "),
        crate::domain::Protocol::ALL.map(|p| p.as_str()).join(", ")
    ))
}

/// The gateway's answer from the agent's: checked against the output
/// schema when it is a success.
/// Longest agent challenge passed on: a real one (scheme, realm, scope,
/// resource metadata URL) is well under it, and a longer one is dropped
/// whole rather than cut into something that no longer parses.
const CHALLENGE_LIMIT: usize = 2048;

fn finish(p: &Prepared, answer: Answer) -> Invoked {
    let output_check = match (&p.schemas.outputs, answer.status) {
        (Some(v), 200..=299) => match check_instance(v, &answer.json, "") {
            Ok(()) => OutputCheck::Valid,
            Err(e) => OutputCheck::Invalid {
                pointer: e.pointer,
                message: e.message,
            },
        },
        _ => OutputCheck::Unchecked,
    };
    if let OutputCheck::Invalid { pointer, message } = &output_check {
        tracing::info!(agent_id = %p.record.metadata.id, %pointer, %message, "agent answer does not match its output schema");
    }
    let binding = &p.record.metadata.bindings[p.binding];
    Invoked {
        status: answer.status,
        body: answer.body,
        content_type: answer.content_type,
        output_check,
        protocol: binding.protocol.clone(),
        endpoint: binding.endpoint.clone(),
        retry_after: answer.retry_after,
        challenge: answer.challenge.filter(|c| c.len() <= CHALLENGE_LIMIT),
    }
}

/// A whole answer as a stream: `result` (or `error` for the agent's own
/// refusal), then `end` with the status (and the agent's challenge, when it
/// refused the call's credentials: a stream has no headers to carry it).
fn whole_events(i: Invoked) -> Vec<Event> {
    let ok = (200..300).contains(&i.status);
    let mut end = serde_json::json!({"status": i.status});
    if let Some(c) = &i.challenge {
        end["agent_challenge"] = serde_json::json!(c);
    }
    vec![
        Event {
            event: if ok { "result" } else { "error" }.into(),
            data: String::from_utf8_lossy(&i.body).into_owned(),
            id: None,
        },
        Event {
            event: "end".into(),
            data: end.to_string(),
            id: None,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::outbound::{system_lookup, OutboundPolicy};

    /// The schema cache holds one revision per agent and at most its
    /// bytes: a publisher updating a record with a large schema, or many
    /// agents with large ones, cannot grow it without bound.
    #[test]
    fn the_schema_cache_keeps_one_revision_per_agent_and_its_bytes() {
        let mut cache = SchemaCache::default();
        let none = || {
            Arc::new(Schemas {
                inputs: None,
                outputs: None,
            })
        };
        let key = |id: &str, revision: u64, op: &str| (id.to_string(), revision, op.to_string());
        cache.insert(key("a", 1, "x"), none(), 1000);
        cache.insert(key("a", 1, "y"), none(), 500);
        cache.insert(key("b", 7, "x"), none(), 200);
        assert_eq!((cache.entries.len(), cache.bytes), (3, 1700));
        // A new revision of `a` drops both operations of the old one.
        cache.insert(key("a", 2, "x"), none(), 300);
        assert_eq!((cache.entries.len(), cache.bytes), (2, 500));
        assert!(cache.entries.contains_key(&key("b", 7, "x")));
        // Past the bytes, it starts over with the newcomer.
        cache.insert(key("c", 1, "x"), none(), MAX_SCHEMA_BYTES - 100);
        assert_eq!(cache.entries.len(), 1);
        assert_eq!(cache.bytes, MAX_SCHEMA_BYTES - 100);
        cache.insert(key("d", 1, "x"), none(), 100);
        assert_eq!(cache.entries.len(), 2, "exactly at the bound still fits");
    }

    #[test]
    fn a_configured_credential_header_is_checked_at_start() {
        let outbound = Outbound::new(
            OutboundPolicy::default(),
            system_lookup(),
            Default::default(),
        )
        .unwrap();
        let config = |header: &str| CredentialConfig {
            agent: "acme/*".into(),
            header: Some(header.into()),
            value: Some("k".into()),
            ..Default::default()
        };
        let c = credential(&config("X-API-Key"), &outbound).unwrap();
        assert_eq!(c.header, Some(("X-API-Key".into(), "k".into())));
        for bad in ["X API Key", "Content-Type", "mcp-session-id"] {
            let e = credential(&config(bad), &outbound)
                .err()
                .unwrap_or_else(|| panic!("{bad} taken"));
            assert!(
                e.starts_with("gateway.credentials for 'acme/*': header '"),
                "{e}"
            );
        }
    }
}
