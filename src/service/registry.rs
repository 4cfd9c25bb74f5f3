//! The registry use cases over the Raft node (writes) and the applied state
//! (reads).

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, instrument};

use super::ServiceError;
use crate::consensus::{Command, CommandResult, NodeStatus, RaftNode};
use crate::domain::filter::HardFilters;
use crate::domain::validate::{normalise_and_validate, validate_id};
use crate::domain::write::WriteMode;
use crate::domain::{
    AgentMetadata, AgentRecord, AgentStatus, Change, Limits, Principal, ReadGrant, Sharing,
    Visibility,
};
use crate::index::SearchIndex;
use crate::storage::{Applied, FollowEnd, Reader};

type Result<T> = std::result::Result<T, ServiceError>;

/// How fresh a read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// This node's applied state.
    #[default]
    Local,
    /// Confirmed with a quorum first.
    Linearizable,
}

/// A list request.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Its statuses set explicitly (AIDIP: `filter::ALL_BUT_DELETED`).
    pub filter: HardFilters,
    pub page_size: u32,
    pub page_token: String,
    pub consistency: Consistency,
}

/// One page of results.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub records: Vec<AgentRecord>,
    pub next_page_token: String,
    pub total_count: u64,
    pub applied_revision: u64,
}

pub const DEFAULT_PAGE_SIZE: u32 = 50;
pub const MAX_PAGE_SIZE: u32 = 1000;

/// A list page ends early once its records' stored forms reach this many
/// bytes (it always holds one): stock gRPC clients refuse answers over
/// 4 MiB, and a page of large records would otherwise be one.
pub const MAX_PAGE_BYTES: usize = 2 << 20;

/// A stream of changes for a watcher.
pub type ChangeStream = Pin<Box<dyn Stream<Item = Result<Change>> + Send>>;

/// How long a write waits for a new cluster's signing identity before it
/// is answered "unavailable": establishing it takes one Raft round after
/// the first election, retried with backoff while no leader is known.
const IDENTITY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The registry's use cases.
#[derive(Clone)]
pub struct RegistryService {
    node: RaftNode,
    reader: Reader,
    index: SearchIndex,
    limits: Limits,
    anonymous_reads: bool,
    /// Becomes true when the server shuts down; open watches then end, so
    /// graceful shutdown does not wait on streams that never finish.
    shutdown: watch::Receiver<bool>,
    /// Peer registries (none unless configured).
    peers: crate::federation::Peers,
    /// Tenants' namespaces and the record quotas.
    tenancy: std::sync::Arc<super::tenancy::Tenancy>,
    /// Batches refreshes into log entries; started on the first refresh.
    refresher: std::sync::Arc<std::sync::OnceLock<super::leases::Refresher>>,
}

pub(super) fn require_writer(principal: Option<&Principal>) -> Result<&Principal> {
    match principal {
        None => Err(ServiceError::Unauthorized(
            "this operation needs an API key (Authorization: Bearer <key>)".into(),
        )),
        Some(p) if !p.may_write() => Err(ServiceError::Forbidden(format!(
            "principal '{}' has the reader role and may not write",
            p.name
        ))),
        Some(p) => Ok(p),
    }
}

fn split_sharing(sharing: Option<Sharing>) -> (Option<Visibility>, Vec<ReadGrant>) {
    match sharing {
        Some(s) => (Some(s.visibility), s.readers),
        None => (None, Vec::new()),
    }
}

fn encode_token(id: &str) -> String {
    crate::crypto::hex(id.as_bytes())
}

fn decode_token(token: &str) -> Result<String> {
    let bad = || ServiceError::InvalidRequest {
        field: Some("/page_token".into()),
        message: "page_token is not a token this registry issued".into(),
    };
    let bytes = crate::crypto::unhex(token).ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// Refuses the record writes that would bypass the MCP registry's rules on
/// one of its servers (`mcp:<name>`): there, versions are only ever
/// appended, statuses are set per version and a deletion stays visible to
/// mirrors as a status, so those records change only through `/v0.1`.
fn not_an_mcp_server(id: &str) -> Result<()> {
    if id.starts_with(crate::domain::mcp::ID_PREFIX) {
        return Err(ServiceError::InvalidRequest {
            field: Some("/id".into()),
            message: format!(
                "/id: '{id}' is an MCP server's record; publish versions with POST /v0.1/publish and change statuses with PATCH /v0.1/servers/{{serverName}}/status"
            ),
        });
    }
    Ok(())
}

impl RegistryService {
    pub fn new(
        node: RaftNode,
        reader: Reader,
        index: SearchIndex,
        limits: Limits,
        anonymous_reads: bool,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            node,
            reader,
            index,
            limits,
            anonymous_reads,
            shutdown,
            peers: Default::default(),
            tenancy: Default::default(),
            refresher: Default::default(),
        }
    }

    pub(super) fn refresher(&self) -> &super::leases::Refresher {
        self.refresher
            .get_or_init(|| super::leases::Refresher::start(self.node.clone()))
    }

    /// The same service, with tenants and quotas.
    pub fn with_tenancy(mut self, tenancy: super::tenancy::Tenancy) -> Self {
        self.tenancy = std::sync::Arc::new(tenancy);
        self
    }

    pub fn tenancy(&self) -> &super::tenancy::Tenancy {
        &self.tenancy
    }

    /// The same service, federating with `peers`.
    pub fn with_peers(mut self, peers: crate::federation::Peers) -> Self {
        self.peers = peers;
        self
    }

    pub fn peers(&self) -> &crate::federation::Peers {
        &self.peers
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    pub fn index(&self) -> &SearchIndex {
        &self.index
    }

    /// Ready when this node knows a leader and has applied the signing
    /// identity; returns the applied revision.
    pub fn ready(&self) -> Result<u64> {
        self.live()?;
        // A node that cannot store writes is taken out of rotation until
        // space is back.
        self.node
            .space()
            .map_err(|e| ServiceError::InsufficientStorage(e.to_string()))?;
        // Its reads are refused until the install ends.
        if self.reader.installing() {
            return Err(crate::storage::StorageError::Installing.into());
        }
        let status = self.node.status();
        let member =
            status.voters.contains(&status.node_id) || status.learners.contains(&status.node_id);
        if status.initialized && !member && !status.voters.is_empty() {
            return Err(ServiceError::Unavailable {
                message: format!(
                    "node {} is not a member of the cluster its data directory belongs to (voters {:?}): it was removed, or the directory was restored for another node id",
                    status.node_id, status.voters
                ),
                leader: None,
            });
        }
        match status.leader {
            // Records written before the identity would be stored unsigned.
            Some(_) if self.reader.signer().is_none() => Err(ServiceError::no_signing_identity()),
            Some(_) => Ok(self.reader.applied_revision()),
            None => Err(ServiceError::Unavailable {
                message: "no Raft leader is known yet".into(),
                leader: None,
            }),
        }
    }

    /// Liveness: fails once the Raft core has stopped (a storage failure it
    /// could not get past), so a supervisor restarts the node.
    pub fn live(&self) -> Result<()> {
        match self.node.core_stopped() {
            None => Ok(()),
            Some(why) => Err(ServiceError::Unavailable {
                message: format!("the Raft core stopped: {why}"),
                leader: None,
            }),
        }
    }

    /// This node's Raft state, for status and metrics.
    pub fn node_status(&self) -> NodeStatus {
        self.node.status()
    }

    pub fn space_stats(&self) -> crate::storage::SpaceStats {
        self.node.space_stats()
    }

    pub(crate) fn require_reader(&self, principal: Option<&Principal>) -> Result<()> {
        if principal.is_none() && !self.anonymous_reads {
            return Err(ServiceError::Unauthorized(
                "anonymous reads are disabled; send an API key".into(),
            ));
        }
        Ok(())
    }

    pub(crate) async fn read_barrier(&self, consistency: Consistency) -> Result<()> {
        if consistency == Consistency::Linearizable {
            self.node.read_barrier().await?;
        }
        Ok(())
    }

    /// Waits (briefly) until this node has applied the registry's signing
    /// identity. A cluster establishes it just after its first election; a
    /// record written before that would be stored unsigned and signed only
    /// when the identity's entry applies, so a node behind it would serve it
    /// unsigned meanwhile. Once this node has the identity, its entry is
    /// committed ahead of anything proposed from here on.
    async fn signing_identity(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + IDENTITY_WAIT;
        while self.reader.signer().is_none() {
            if tokio::time::Instant::now() >= deadline {
                return Err(ServiceError::no_signing_identity());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Proposes a record command and waits until it is applied here. The
    /// change is the one the discovery index and watchers received: a
    /// caller that only reads it (an answer) copies nothing.
    pub(crate) async fn commit(&self, command: Command) -> Result<Arc<Change>> {
        Ok(self.commit_or_reject(command).await??)
    }

    /// [`Self::commit`], with the state machine's refusal (a stale
    /// revision, a rule) kept apart from errors of the way there.
    async fn commit_or_reject(
        &self,
        command: Command,
    ) -> Result<std::result::Result<Arc<Change>, crate::domain::write::Rejection>> {
        self.signing_identity().await?;
        match super::audit::propose(&self.node, command).await? {
            CommandResult::Applied(change) => Ok(Ok(change)),
            CommandResult::Rejected(r) => Ok(Err(r)),
            other => Err(ServiceError::Internal(format!(
                "a record command produced {other:?}"
            ))),
        }
    }

    /// The answer to a change `principal` may not make to record `id`:
    /// "not found" when they may not read it either, as every read answers
    /// (a record one may not read is never said to exist); `e` otherwise.
    /// Decided here, at the edge: `apply` records the refusal as it is.
    pub(super) fn unseen(&self, principal: &Principal, id: &str, e: ServiceError) -> ServiceError {
        // A failed precondition names the record's revision: of a record
        // the caller may not read, it would tell that it exists.
        if !matches!(
            e,
            ServiceError::Forbidden(_) | ServiceError::PreconditionFailed(_)
        ) {
            return e;
        }
        match self.reader.get(id) {
            Ok(Some(r)) if r.readable_by(Some(principal)) => e,
            Ok(_) => ServiceError::NotFound(format!("agent '{id}' not found")),
            Err(_) => e,
        }
    }

    /// Becomes true when the server shuts down.
    pub(crate) fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// The Raft node (identity changes are proposed through it).
    pub(crate) fn node(&self) -> &RaftNode {
        &self.node
    }

    /// Registers (creates or refreshes) an agent. Returns the record and
    /// whether it was created.
    #[instrument(skip_all, fields(agent_id = %metadata.id, principal = principal.map(|p| p.name.as_str())))]
    pub async fn register(
        &self,
        principal: Option<&Principal>,
        mut metadata: AgentMetadata,
        sharing: Option<Sharing>,
    ) -> Result<(Arc<Change>, bool)> {
        super::audit::begin("register", Some(&metadata.id));
        let principal = require_writer(principal)?;
        if metadata.id.is_empty() {
            metadata.id = format!("agent-{}", uuid::Uuid::new_v4());
            super::audit::begin("register", Some(&metadata.id));
        }
        self.tenancy.check_namespace(principal, &metadata.id)?;
        not_an_mcp_server(&metadata.id)?;
        let (visibility, readers) = split_sharing(sharing);
        // Judged on the metadata as sent, before normalisation changes it.
        let verdict = self.judge_publisher(&metadata, principal)?;
        normalise_and_validate(&mut metadata, &self.limits)?;
        let change = self
            .commit(Command::Put {
                metadata: Box::new(metadata),
                visibility,
                readers,
                principal: principal.clone(),
                mode: WriteMode::Register,
                now: crate::domain::time::now(),
                publisher: Some(verdict),
                quota: self.tenancy.quota_for(principal),
                expected_revision: None,
                rules: 0,
            })
            .await?;
        let created = change.kind == crate::domain::ChangeKind::Created;
        debug!(revision = change.revision, created, "registered");
        Ok((change, created))
    }

    /// Writes `metadata` only if the stored record (or tombstone) still has
    /// `expected` revision (0: none), for read-modify-write use cases; a
    /// record that changed meanwhile comes back as the rejection, for the
    /// caller to read again and retry. Same checks as register and update.
    pub(super) async fn put_if(
        &self,
        principal: Option<&Principal>,
        mut metadata: AgentMetadata,
        expected: u64,
        mode: WriteMode,
    ) -> Result<std::result::Result<AgentRecord, crate::domain::write::Rejection>> {
        let principal = require_writer(principal)?;
        self.tenancy.check_namespace(principal, &metadata.id)?;
        let verdict = self.judge_publisher(&metadata, principal)?;
        normalise_and_validate(&mut metadata, &self.limits)?;
        let quota = match mode {
            WriteMode::Register => self.tenancy.quota_for(principal),
            WriteMode::Update => None,
        };
        let command = Command::Put {
            metadata: Box::new(metadata),
            visibility: None,
            readers: Vec::new(),
            principal: principal.clone(),
            mode,
            now: crate::domain::time::now(),
            publisher: Some(verdict),
            quota,
            expected_revision: Some(expected),
            rules: 0,
        };
        Ok(self
            .commit_or_reject(command)
            .await?
            .map(|change| Arc::unwrap_or_clone(change).record))
    }

    /// Replaces an existing agent's metadata.
    #[instrument(skip_all, fields(agent_id = %id, principal = principal.map(|p| p.name.as_str())))]
    /// Replaces an agent's metadata; with `expected_revision`, only while
    /// the record still has that revision (HTTP `If-Match`).
    pub async fn update(
        &self,
        principal: Option<&Principal>,
        id: &str,
        mut metadata: AgentMetadata,
        sharing: Option<Sharing>,
        expected_revision: Option<u64>,
    ) -> Result<Arc<Change>> {
        super::audit::begin("update", Some(id));
        let principal = require_writer(principal)?;
        validate_id(id, "/id")?;
        self.tenancy.check_namespace(principal, id)?;
        not_an_mcp_server(id)?;
        let (visibility, readers) = split_sharing(sharing);
        if metadata.id.is_empty() {
            metadata.id = id.to_string();
        } else if metadata.id != id {
            return Err(ServiceError::InvalidRequest {
                field: Some("/id".into()),
                message: format!(
                    "/id: '{}' does not match the agent id '{id}' in the request path",
                    metadata.id
                ),
            });
        }
        let verdict = self.judge_publisher(&metadata, principal)?;
        normalise_and_validate(&mut metadata, &self.limits)?;
        self.commit(Command::Put {
            metadata: Box::new(metadata),
            visibility,
            readers,
            principal: principal.clone(),
            mode: WriteMode::Update,
            now: crate::domain::time::now(),
            publisher: Some(verdict),
            quota: None,
            expected_revision,
            rules: 0,
        })
        .await
        .map_err(|e| self.unseen(principal, id, e))
    }

    /// Deletes an agent, leaving a tombstone; returns its revision.
    #[instrument(skip_all, fields(agent_id = %id, principal = principal.map(|p| p.name.as_str())))]
    pub async fn delete(
        &self,
        principal: Option<&Principal>,
        id: &str,
        expected_revision: Option<u64>,
    ) -> Result<u64> {
        super::audit::begin("delete", Some(id));
        let principal = require_writer(principal)?;
        validate_id(id, "/id")?;
        not_an_mcp_server(id)?;
        let change = self
            .commit(Command::Delete {
                id: id.to_string(),
                principal: principal.clone(),
                now: crate::domain::time::now(),
                expected_revision,
            })
            .await
            .map_err(|e| self.unseen(principal, id, e))?;
        Ok(change.revision)
    }

    /// Sets an agent's lifecycle status.
    #[instrument(skip_all, fields(agent_id = %id, principal = principal.map(|p| p.name.as_str())))]
    pub async fn set_status(
        &self,
        principal: Option<&Principal>,
        id: &str,
        status: AgentStatus,
        reason: Option<String>,
        expected_revision: Option<u64>,
    ) -> Result<Arc<Change>> {
        super::audit::begin("set_status", Some(id));
        let principal = require_writer(principal)?;
        validate_id(id, "/id")?;
        not_an_mcp_server(id)?;
        if let Some(r) = &reason {
            if r.chars().count() > 1024 || r.chars().any(|c| c.is_control()) {
                return Err(ServiceError::InvalidRequest {
                    field: Some("/reason".into()),
                    message: "/reason: must be at most 1024 characters without control characters"
                        .into(),
                });
            }
        }
        let now = crate::domain::time::now();
        self.commit(Command::SetStatus {
            id: id.to_string(),
            status,
            reason,
            principal: principal.clone(),
            now,
            expected_revision,
        })
        .await
        .map_err(|e| self.unseen(principal, id, e))
    }

    /// Fetches one agent. Private records of others read as not found.
    #[instrument(skip_all, fields(agent_id = %id))]
    pub async fn get(
        &self,
        principal: Option<&Principal>,
        id: &str,
        consistency: Consistency,
    ) -> Result<(AgentRecord, u64)> {
        self.get_leased(principal, id, consistency)
            .await
            .map(|(r, revision, _)| (r, revision))
    }

    /// [`Self::get`], with the expiry the agent's lease gives it (if it
    /// holds one) read together with the record (`Reader::get_leased`).
    #[instrument(skip_all, fields(agent_id = %id))]
    pub async fn get_leased(
        &self,
        principal: Option<&Principal>,
        id: &str,
        consistency: Consistency,
    ) -> Result<(AgentRecord, u64, Option<i64>)> {
        self.require_reader(principal)?;
        validate_id(id, "/id")?;
        self.read_barrier(consistency).await?;
        let revision = self.reader.applied_revision();
        match self.reader.get_leased(id)? {
            Some((r, _)) if !r.readable_by(principal) => {
                Err(ServiceError::NotFound(format!("agent '{id}' not found")))
            }
            Some((r, _)) if r.envelope.deleted => Err(ServiceError::Gone(format!(
                "agent '{id}' was deleted at revision {}",
                r.envelope.revision
            ))),
            Some((r, lease)) => Ok((r, revision, lease)),
            None => Err(ServiceError::NotFound(format!("agent '{id}' not found"))),
        }
    }

    /// Lists agents matching the filters, in id order, one page at a time.
    #[instrument(skip_all)]
    pub async fn list(
        &self,
        principal: Option<&Principal>,
        mut query: ListQuery,
    ) -> Result<ListPage> {
        self.require_reader(principal)?;
        query.filter.normalise()?;
        let page_size = match query.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                return Err(ServiceError::InvalidRequest {
                    field: Some("/page_size".into()),
                    message: format!("/page_size: must be at most {MAX_PAGE_SIZE}"),
                })
            }
            n => n,
        } as usize;
        let after = if query.page_token.is_empty() {
            None
        } else {
            Some(decode_token(&query.page_token)?)
        };
        self.read_barrier(query.consistency).await?;
        let revision = self.reader.applied_revision();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let (mut total, mut records, mut more) = (0u64, Vec::new(), false);
        let mut bytes = 0;
        // Count what lies before the page too, so total_count is the same on
        // every page.
        self.reader.scan_sized(|r, size| {
            // Looked up per record: a scan is long, and applies wait for
            // the table's lock.
            let lease = self.reader.leases().expiry_unix(&r.metadata.id);
            if query.filter.admit_record_leased(&r, lease, principal, now) {
                total += 1;
                let after_token = after.as_deref().is_none_or(|a| r.metadata.id.as_str() > a);
                if after_token && !more {
                    let fits = records.is_empty() || bytes + size <= MAX_PAGE_BYTES;
                    if records.len() < page_size && fits {
                        bytes += size;
                        records.push(r);
                    } else {
                        more = true;
                    }
                }
            }
        })?;
        let next_page_token = match (more, records.last()) {
            (true, Some(last)) => encode_token(&last.metadata.id),
            _ => String::new(),
        };
        Ok(ListPage {
            records,
            next_page_token,
            total_count: total,
            applied_revision: revision,
        })
    }

    /// Streams changes from `from_revision` on (0: from now). The stream
    /// first replays history, then follows live changes, never skipping or
    /// repeating a revision.
    pub fn watch(&self, principal: Option<&Principal>, from_revision: u64) -> Result<ChangeStream> {
        self.require_reader(principal)?;
        // Subscribe before reading history so nothing falls in between.
        let live = self.reader.subscribe();
        let oldest = self.reader.oldest_revision();
        if from_revision != 0 && from_revision < oldest {
            return Err(ServiceError::RevisionCompacted {
                requested: from_revision,
                oldest,
            });
        }
        let next = if from_revision == 0 {
            self.reader.applied_revision() + 1
        } else {
            from_revision
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let reader = self.reader.clone();
        let principal = principal.cloned();
        tokio::spawn(forward_changes(
            reader,
            live,
            next,
            principal,
            tx,
            self.shutdown.clone(),
        ));
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// Changes a change stream (a watch, a peer's feed) holds ready for its
/// client: the stream sends on as the client reads, and one that stops
/// reading holds this many records (up to 256 KiB each) besides the batch
/// of history being sent, and no more.
pub(super) const STREAM_BUFFER: usize = 8;

/// Completes when the stream's receiver hangs up or the server shuts down,
/// so a follower that hung up ends its task now, not at the next change.
pub(super) fn hung_up_or_shut_down<T>(
    tx: &mpsc::Sender<T>,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let tx = tx.clone();
    async move {
        tokio::select! {
            _ = tx.closed() => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    }
}

/// Feeds one watcher until it hangs up or the server shuts down.
async fn forward_changes(
    reader: Reader,
    live: broadcast::Receiver<Applied>,
    next: u64,
    principal: Option<Principal>,
    tx: mpsc::Sender<Result<Change>>,
    shutdown: watch::Receiver<bool>,
) {
    let stop = hung_up_or_shut_down(&tx, shutdown);
    let sink = |c: Arc<Change>| {
        let visible = c.record.readable_by(principal.as_ref());
        let tx = tx.clone();
        async move { !visible || tx.send(Ok(Arc::unwrap_or_clone(c))).await.is_ok() }
    };
    let error = match reader.follow(live, next, stop, sink).await {
        FollowEnd::Stopped => return,
        FollowEnd::Compacted { requested, oldest } => {
            ServiceError::RevisionCompacted { requested, oldest }
        }
        FollowEnd::Failed(e) => e.into(),
    };
    let _ = tx.send(Err(error)).await;
}
