//! Raft network: the client side of the internal gRPC transport
//! (`agentry.v1.RaftTransport`, served only on the internal listener).
//!
//! AppendEntries goes in the binary encoding (`codec`) to every peer whose
//! answers say it takes it, else as JSON like the other, smaller messages
//! (openraft's own types inside a protobuf envelope).
//! Channels are cached per peer and reconnect by themselves; each RPC carries
//! openraft's time budget as its gRPC deadline; a peer that cannot be reached
//! is reported `Unreachable`, which makes openraft back off exponentially.
//! Fault rules (testing only) are applied before anything is sent.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, Snapshot, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};
use tracing::{instrument, Instrument};

use super::cluster_auth::ClusterAuth;
use super::codec::{self, Encoding};
use super::faults::{Faults, Verdict};
use super::forward::{ForwardReply, Forwarded};
use super::membership_check::MembershipCheck;
use super::{LogId, NodeId, TypeConfig, WriteError};
use crate::crypto::signature_book::SignatureBook;
use crate::pb::raft_transport_client::RaftTransportClient;
use crate::pb::{RaftMessage, SnapshotChunk};

/// Size of one snapshot chunk on the wire.
const SNAPSHOT_CHUNK: usize = 1024 * 1024;
/// Deadline for a whole snapshot transfer.
const SNAPSHOT_DEADLINE: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 flow-control window per stream: a batch of entries is sent
/// without waiting for window updates.
pub const WINDOW: u32 = 4 * 1024 * 1024;

/// Why a message did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Certainly not delivered (fault injection, refused by the peer before
    /// it looked at the message, or no connection): safe to retry.
    #[error("not delivered to node {target}: {reason}")]
    NotSent { target: NodeId, reason: String },
    /// Sent, but no answer: the peer may or may not have acted on it.
    #[error("no answer from node {target}: {reason}")]
    NoAnswer { target: NodeId, reason: String },
    /// Larger than the message size limit; never sent.
    #[error("message of {bytes} bytes for node {target} exceeds the limit of {limit}")]
    TooLarge {
        target: NodeId,
        bytes: usize,
        limit: usize,
    },
    /// The answer could not be decoded.
    #[error("bad answer from node {target}: {reason}")]
    BadAnswer { target: NodeId, reason: String },
    /// The peer refused the message before acting on it: it belongs to
    /// another cluster, or is not the member this node has on record
    /// (`membership_check`).
    #[error("node {target} refused: {reason}")]
    Refused { target: NodeId, reason: String },
    /// `RESOURCE_EXHAUSTED`: the peer has no room to store the message
    /// now, and did not act on it. A follower of the release before 209cad8
    /// short of disk space answers entries so (today's takes them as a
    /// heartbeat instead); tonic also answers so for a message over a size
    /// limit, which sending again cannot fix either.
    #[error("node {target} cannot store it now: {reason}")]
    ShortOfSpace { target: NodeId, reason: String },
}

impl TransportError {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        match self {
            TransportError::NotSent { .. }
            | TransportError::TooLarge { .. }
            | TransportError::Refused { .. } => RPCError::Unreachable(Unreachable::new(self)),
            _ => RPCError::Network(NetworkError::new(self)),
        }
    }
}

/// The Raft network factory of a node. Cheap to clone; clones share the
/// channel cache and the fault table.
#[derive(Clone)]
pub struct Network {
    me: NodeId,
    channels: Arc<Mutex<ChannelCache>>,
    /// Leader: what each peer has acknowledged, to notice one that lost it.
    acknowledged: Arc<Mutex<HashMap<NodeId, Acknowledged>>>,
    /// Leader: when each peer last answered an AppendEntries (heartbeats
    /// included), and was not refused.
    heard: Arc<Mutex<HashMap<NodeId, std::time::Instant>>>,
    faults: Faults,
    max_message: usize,
    auth: ClusterAuth,
    check: MembershipCheck,
    /// How this node sends AppendEntries when the peer takes it.
    encoding: Encoding,
    /// The highest encoding each peer's last answer said it takes.
    accepts: Arc<Mutex<HashMap<NodeId, u32>>>,
    /// Peers whose last answer said they apply batch entries. Unlike
    /// `accepts`, a failed message does not clear it: a member that is down
    /// keeps its say (an older binary refuses the data directory a batching
    /// one wrote, data format 4), so a lost follower does not stop batching.
    batching: Arc<Mutex<HashSet<NodeId>>>,
    /// The apply rules each peer's last answer said it follows; kept
    /// through failures like `batching`.
    rules: Arc<Mutex<HashMap<NodeId, u32>>>,
    /// Woken when this leader refuses a node, so the refusal is recorded
    /// at once rather than at the next tick (`RaftNode::record_members`).
    refusal_decided: Arc<tokio::sync::Notify>,
    /// The state machine's signatures: offered with AppendEntries as a
    /// leader, received as a follower (`signature_book`).
    signatures: Arc<SignatureBook>,
}

/// Per peer: its address, the cluster-TLS generation the channel was made
/// with, and the channel.
type ChannelCache = HashMap<NodeId, (String, u64, Channel)>;

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    Forward,
}

impl Rpc {
    /// The name a cluster proof is bound to (the server checks the same).
    fn name(self) -> &'static str {
        match self {
            Rpc::AppendEntries => super::transport::APPEND_ENTRIES,
            Rpc::Vote => super::transport::VOTE,
            Rpc::Forward => super::transport::FORWARD,
        }
    }
}

impl Network {
    /// Forgets what `node` acknowledged: it was removed from the cluster or
    /// is being added again, with whatever data it has now.
    pub fn forget_acknowledged(&self, node: NodeId) {
        self.acknowledged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&node);
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&node);
    }

    /// Whether `node` answered this leader's AppendEntries (heartbeats
    /// included) within `within`, as one in step with it.
    pub fn heard_within(&self, node: NodeId, within: Duration) -> bool {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&node)
            .is_some_and(|at| at.elapsed() <= within)
    }

    /// Whether `node` was refused for losing entries it acknowledged. A
    /// refused node is sent nothing at all, not even a heartbeat: any
    /// message could feed it the log again (a new leader's first
    /// AppendEntries starts from an index the node still holds, which it
    /// accepts), and its answers carry the higher terms it campaigns with,
    /// which would make the leader step down again and again. Its own vote
    /// requests change nothing: the others hear the leader and hold more
    /// log than it does.
    ///
    /// A refusal is this leader's own knowledge until it is in the
    /// replicated record (`refusals_to_record`); from then on every leader
    /// and candidate holds to it.
    fn is_refused(&self, node: NodeId) -> bool {
        self.check.is_refused(node)
            || self
                .acknowledged
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&node)
                .is_some_and(|a| a.refused)
    }

    /// The members refused by the replicated record or by this leader.
    pub fn refused(&self) -> Vec<NodeId> {
        let mut nodes = self.check.refused();
        nodes.extend(self.refusals_to_record().into_keys());
        // The record may have taken in a refusal between the two reads.
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// The nodes this leader refused that the replicated record does not
    /// refuse yet, each with what it had acknowledged.
    pub fn refusals_to_record(&self) -> BTreeMap<NodeId, String> {
        self.acknowledged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(node, a)| a.refused && !self.check.is_refused(**node))
            .map(|(node, a)| {
                let upto = a.upto.map(|l| l.to_string()).unwrap_or_default();
                let why = format!(
                    "it lost log entries it had acknowledged to node {} (up to {upto})",
                    self.me
                );
                (*node, why)
            })
            .collect()
    }

    pub fn new(
        me: NodeId,
        faults: Faults,
        max_message: usize,
        auth: ClusterAuth,
        check: MembershipCheck,
        encoding: Encoding,
    ) -> Self {
        Self {
            me,
            channels: Arc::default(),
            acknowledged: Arc::default(),
            heard: Arc::default(),
            faults,
            max_message,
            auth,
            check,
            encoding,
            accepts: Arc::default(),
            batching: Arc::default(),
            rules: Arc::default(),
            refusal_decided: Arc::default(),
            signatures: Arc::default(),
        }
    }

    /// Offers and takes the signatures of `book` (the state machine's).
    pub fn with_signatures(mut self, book: Arc<SignatureBook>) -> Self {
        self.signatures = book;
        self
    }

    pub fn signatures(&self) -> &Arc<SignatureBook> {
        &self.signatures
    }

    /// Waits until this leader refuses a node (at once if it did since the
    /// last wait).
    pub async fn refusal_decided(&self) {
        self.refusal_decided.notified().await
    }

    /// The newest apply rules every node of `members` follows, this one
    /// included.
    pub fn rules_of_all(&self, members: impl IntoIterator<Item = NodeId>) -> u32 {
        let answered = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        rules_of_all(
            members,
            self.me,
            self.encoding.apply_rules(),
            &answered,
            self.check.cluster_rules(),
        )
    }

    /// The apply rules `node` last answered that it follows (0 if it never
    /// answered, or runs a release from before apply rules).
    pub fn answered_rules(&self, node: NodeId) -> u32 {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&node)
            .copied()
            .unwrap_or(0)
    }

    /// Whether every node of `members` (this one aside) last answered that
    /// it applies batch entries, and this node does too.
    pub fn all_apply_batches(&self, members: impl IntoIterator<Item = NodeId>) -> bool {
        if !self.encoding.applies_batches() {
            return false;
        }
        let batching = self.batching.lock().unwrap_or_else(|e| e.into_inner());
        members
            .into_iter()
            .all(|m| m == self.me || batching.contains(&m))
    }

    /// Whether AppendEntries to `target` goes in the binary encoding: only
    /// once the peer has answered that it takes it (a node of an older
    /// version never does, and keeps getting JSON).
    fn binary_to(&self, target: NodeId) -> bool {
        self.encoding == Encoding::Binary
            && self
                .accepts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&target)
                .is_some_and(|e| *e >= codec::BINARY)
    }

    fn json<Req: Serialize>(target: NodeId, request: &Req) -> Result<Vec<u8>, TransportError> {
        serde_json::to_vec(request).map_err(|e| TransportError::NotSent {
            target,
            reason: format!("cannot encode: {e}"),
        })
    }

    fn client(
        &self,
        target: NodeId,
        addr: &str,
    ) -> Result<RaftTransportClient<Channel>, TransportError> {
        let tls = match &self.auth {
            ClusterAuth::Tls(t) => Some(t.client()),
            ClusterAuth::Secret(_) => None,
        };
        let generation = tls.as_ref().map(|t| t.1).unwrap_or(0);
        let mut cache = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match cache.get(&target) {
            Some((a, g, c)) if a == addr && *g == generation => c.clone(),
            _ => {
                let not_sent = |e: &dyn std::fmt::Display| TransportError::NotSent {
                    target,
                    reason: format!("bad address {addr}: {e}"),
                };
                let scheme = if tls.is_some() { "https" } else { "http" };
                let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
                    .map_err(|e| not_sent(&e))?;
                if let Some((config, _)) = tls {
                    endpoint = endpoint.tls_config(config).map_err(|e| not_sent(&e))?;
                }
                let endpoint = endpoint
                    .connect_timeout(CONNECT_TIMEOUT)
                    .tcp_nodelay(true)
                    .initial_connection_window_size(WINDOW * 4)
                    .initial_stream_window_size(WINDOW)
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5));
                let channel = endpoint.connect_lazy();
                cache.insert(target, (addr.to_string(), generation, channel.clone()));
                channel
            }
        };
        Ok(RaftTransportClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }

    /// Applies the fault rules to a message for `target`.
    async fn gate(&self, target: NodeId) -> Result<(), TransportError> {
        match self.faults.outgoing(target) {
            Verdict::Drop => Err(TransportError::NotSent {
                target,
                reason: "dropped by fault injection".into(),
            }),
            Verdict::Deliver { delay } => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(())
            }
        }
    }

    /// Sends `payload`, encoded as `encoding` says; the answer is JSON.
    async fn unary<Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        addr: &str,
        rpc: Rpc,
        (payload, encoding): (Vec<u8>, u32),
        timeout: Duration,
    ) -> Result<Resp, TransportError> {
        if payload.len() > self.max_message {
            return Err(TransportError::TooLarge {
                target,
                bytes: payload.len(),
                limit: self.max_message,
            });
        }
        self.gate(target).await?;
        let mut client = self.client(target, addr)?;
        // A forwarded request addresses the leader, not a member's log.
        let addressed = (!matches!(rpc, Rpc::Forward)).then_some(target);
        let mut req = tonic::Request::new(RaftMessage {
            from: self.me,
            payload: Vec::new(),
            stamp: Some(self.check.stamp(addressed)),
            encoding,
            batches: false,
            rules: 0,
        });
        self.auth
            .prove(req.metadata_mut(), rpc.name(), self.me, &payload);
        req.get_mut().payload = payload;
        req.set_timeout(timeout);
        let answer = match rpc {
            Rpc::AppendEntries => client.append_entries(req).await,
            Rpc::Vote => client.vote(req).await,
            Rpc::Forward => client.forward(req).await,
        };
        if answer.is_err() && encoding == codec::BINARY {
            // The peer may no longer take it (restarted as an older
            // version): the next message goes as JSON, and its answer says
            // again what the peer takes.
            self.accepts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&target);
        }
        let answer = answer
            .map_err(|s| status_error(target, s))
            .inspect_err(|e| self.log_refusal(e))?
            .into_inner();
        self.check.answered(target, answer.stamp.as_ref());
        self.accepts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target, answer.encoding);
        let mut batching = self.batching.lock().unwrap_or_else(|e| e.into_inner());
        if answer.batches {
            batching.insert(target);
        } else {
            batching.remove(&target);
        }
        drop(batching);
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target, answer.rules);
        serde_json::from_slice(&answer.payload).map_err(|e| TransportError::BadAnswer {
            target,
            reason: e.to_string(),
        })
    }

    /// Logs a peer's refusal (at most every half minute per peer): the
    /// operator looks at the leader's log for why a member is not in step.
    fn log_refusal(&self, e: &TransportError) {
        if let TransportError::Refused { target, reason } = e {
            if self.check.should_log(*target) {
                tracing::error!(
                    node_id = self.me,
                    peer = target,
                    "node {target} refused this node's Raft traffic: {reason}"
                );
            }
        }
    }

    /// Asks the leader `target` to execute a request on this node's behalf.
    #[instrument(level = "debug", skip(self, request), fields(from = self.me))]
    pub async fn forward(
        &self,
        target: NodeId,
        addr: &str,
        request: &Forwarded,
        timeout: Duration,
    ) -> Result<Result<ForwardReply, WriteError>, TransportError> {
        let payload = (Self::json(target, request)?, codec::JSON);
        self.unary(target, addr, Rpc::Forward, payload, timeout)
            .await
    }
}

/// Maps a gRPC failure to whether the message may have been acted on.
fn status_error(target: NodeId, s: tonic::Status) -> TransportError {
    let reason = format!("{:?}: {}", s.code(), s.message());
    match s.code() {
        // Our server refuses with FAILED_PRECONDITION before acting (fault
        // rules, or a message for another node id); a connection that could
        // not be opened is UNAVAILABLE with a connect error as its source.
        tonic::Code::FailedPrecondition => TransportError::NotSent { target, reason },
        tonic::Code::PermissionDenied => TransportError::Refused {
            target,
            reason: s.message().to_string(),
        },
        tonic::Code::Unavailable if is_connect_error(&s) => {
            TransportError::NotSent { target, reason }
        }
        tonic::Code::ResourceExhausted => TransportError::ShortOfSpace { target, reason },
        _ => TransportError::NoAnswer { target, reason },
    }
}

fn is_connect_error(s: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        let text = e.to_string();
        if text.contains("tcp connect error") || text.contains("Connection refused") {
            return true;
        }
        source = e.source();
    }
    false
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        Connection {
            network: self.clone(),
            target,
            addr: node.addr.clone(),
            offered_upto: None,
        }
    }
}

/// The newest apply rules every one of `members` follows: `mine` for this
/// node, what each other member last answered, and for one not heard from
/// yet (right after an election) the rules the cluster had moved to, which
/// it followed then. Never newer than this node's own.
fn rules_of_all(
    members: impl IntoIterator<Item = NodeId>,
    me: NodeId,
    mine: u32,
    answered: &HashMap<NodeId, u32>,
    cluster: u32,
) -> u32 {
    members
        .into_iter()
        .filter(|m| *m != me)
        .map(|m| answered.get(&m).copied().unwrap_or(cluster))
        .fold(mine, u32::min)
}

/// The connection to one peer that openraft replicates through.
pub struct Connection {
    network: Network,
    target: NodeId,
    addr: String,
    /// The newest revision whose signature this peer was sent; unset until
    /// the first message, which starts from the newest signed (a follower
    /// further behind signs those records itself).
    offered_upto: Option<u64>,
}

/// Why nothing is sent to a refused node.
fn refusal(target: NodeId) -> Unreachable {
    Unreachable::new(&std::io::Error::other(format!(
        "node {target} lost acknowledged log entries; refused"
    )))
}

/// The error openraft gets for a message to a refused node.
fn refused<E: std::error::Error>(target: NodeId) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(refusal(target))
}

/// What a peer has acknowledged to this leader (under one vote).
#[derive(Clone, Copy)]
struct Acknowledged {
    vote: Vote<NodeId>,
    upto: Option<LogId>,
    refused: bool,
}

impl Connection {
    /// Keeps what the peer acknowledged (to notice one that later lost it,
    /// and refuse it) and when it last answered; false once it is refused.
    fn record_answer(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        answer: &AppendEntriesResponse<NodeId>,
    ) -> bool {
        let sent_up_to = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
        let mut table = self
            .network
            .acknowledged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // What was acknowledged under an earlier vote may since have been
        // replaced by another leader, so it is not carried over. A refusal
        // is: it was decided under one vote, where a lost entry can only
        // mean lost data, and a re-election must not start feeding the
        // node (`is_refused`).
        let mut seen = match table.get(&self.target) {
            Some(a) if a.vote == rpc.vote || a.refused => Acknowledged {
                vote: rpc.vote,
                ..*a
            },
            _ => Acknowledged {
                vote: rpc.vote,
                upto: None,
                refused: false,
            },
        };
        match answer {
            AppendEntriesResponse::Success => seen.upto = seen.upto.max(sent_up_to),
            AppendEntriesResponse::PartialSuccess(upto) => seen.upto = seen.upto.max(*upto),
            // The peer no longer holds an entry it acknowledged: its data
            // directory was wiped or replaced. It must not take part as if
            // it still had them (and openraft's leader stops on a reverted
            // follower log), so it is refused until an operator removes it
            // and adds it back (`forget_acknowledged`).
            AppendEntriesResponse::Conflict
                if seen.refused || (rpc.prev_log_id.is_some() && rpc.prev_log_id <= seen.upto) =>
            {
                if !seen.refused {
                    seen.refused = true;
                    tracing::error!(
                        node_id = self.target,
                        acknowledged = ?seen.upto,
                        "node {} lost log entries it had acknowledged (its data directory was wiped or replaced); \
                         it is refused: remove it and add it back (agentry cluster remove / add / promote)",
                        self.target
                    );
                    self.network.refusal_decided.notify_one();
                }
                table.insert(self.target, seen);
                return false;
            }
            _ => {}
        }
        table.insert(self.target, seen);
        drop(table);
        self.network
            .heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.target, std::time::Instant::now());
        true
    }

    async fn call<Resp: DeserializeOwned, E>(
        &self,
        rpc: Rpc,
        payload: Result<(Vec<u8>, u32), TransportError>,
        entries: u64,
        timeout: Duration,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error + DeserializeOwned,
    {
        let started = std::time::Instant::now();
        let sent = match payload {
            Ok(p) => {
                self.network
                    .unary(self.target, &self.addr, rpc, p, timeout)
                    .await
            }
            Err(e) => Err(e),
        };
        let answer: Result<Resp, RaftError<NodeId, E>> = match sent {
            Ok(a) => a,
            // Too big for one message: openraft retries with fewer entries.
            Err(TransportError::TooLarge { .. }) if entries > 1 => {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(entries / 2),
                ))
            }
            // A follower of an earlier release short of space. A network
            // error gets no backoff from openraft (an unreachable peer's
            // backoff would stop its heartbeats too), so it is paced here.
            Err(e @ TransportError::ShortOfSpace { .. }) if entries > 0 => {
                before_reoffering(started, timeout).await;
                return Err(e.unreachable());
            }
            Err(e) => return Err(e.unreachable()),
        };
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// Waits, after a follower short of space took none of the entries sent at
/// `started`, until they may be offered again: half the message's time
/// `budget`. openraft offers them again as soon as `append_entries`
/// returns; this keeps that to a few tries a second instead of thousands.
async fn before_reoffering(started: std::time::Instant, budget: Duration) {
    tokio::time::sleep_until((started + budget / 2).into()).await;
}

impl RaftNetwork<TypeConfig> for Connection {
    #[instrument(level = "debug", skip_all, fields(target = self.target, entries = rpc.entries.len()))]
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let entries = rpc.entries.len() as u64;
        if self.network.is_refused(self.target) {
            return Err(refused(self.target));
        }
        let started = std::time::Instant::now();
        // The commands inside are the proposers' bytes either way; binary
        // only frames them, JSON decodes and re-encodes each.
        let binary = self.network.binary_to(self.target);
        let book = &self.network.signatures;
        let (offers, applied) = if binary {
            let after = *self.offered_upto.get_or_insert_with(|| book.newest());
            book.offers_after(after)
        } else {
            (Vec::new(), 0)
        };
        let payload = if binary {
            codec::encode_append(&rpc, &offers, applied)
                .map(|bytes| (bytes, codec::BINARY))
                .map_err(|e| TransportError::NotSent {
                    target: self.target,
                    reason: format!("cannot encode: {e}"),
                })
        } else {
            Network::json(self.target, &rpc).map(|bytes| (bytes, codec::JSON))
        };
        let answer: AppendEntriesResponse<NodeId> = self
            .call::<_, openraft::error::Infallible>(
                Rpc::AppendEntries,
                payload,
                entries,
                option.hard_ttl(),
            )
            .await?;
        // A follower short of space took none of the entries
        // (`transport::append_entries`); each offer still counts as a
        // heartbeat there.
        let took_none = entries > 0
            && matches!(answer, AppendEntriesResponse::PartialSuccess(m) if m == rpc.prev_log_id);
        if entries > 0 && !took_none {
            crate::metrics::observe_replicate(started.elapsed(), entries);
        }
        if let Some(last) = offers.last() {
            self.offered_upto = Some(last.revision);
        }
        if !self.record_answer(&rpc, &answer) {
            return Err(refused(self.target));
        }
        if took_none {
            before_reoffering(started, option.hard_ttl()).await;
        }
        Ok(answer)
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // openraft 0.9 sends snapshots through `full_snapshot`, which this
        // transport streams; the chunk-by-chunk RPC is never used.
        Err(RPCError::Unreachable(Unreachable::new(
            &std::io::Error::other("chunked snapshot RPCs are not used; snapshots are streamed"),
        )))
    }

    #[instrument(level = "debug", skip_all, fields(target = self.target, term = rpc.vote.leader_id.term))]
    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // A refused node's vote would count for entries it no longer holds.
        if self.network.is_refused(self.target) {
            return Err(refused(self.target));
        }
        self.network.signatures.forget_leader();
        let payload = Network::json(self.target, &rpc).map(|bytes| (bytes, codec::JSON));
        self.call::<_, openraft::error::Infallible>(Rpc::Vote, payload, 0, option.hard_ttl())
            .await
    }

    #[instrument(level = "info", skip_all, fields(target = self.target, snapshot = %snapshot.meta.snapshot_id))]
    async fn full_snapshot(
        &mut self,
        vote: Vote<NodeId>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let target = self.target;
        let net = &self.network;
        if net.is_refused(target) {
            return Err(StreamingError::Unreachable(refusal(target)));
        }
        let not_sent = |e: TransportError| StreamingError::Unreachable(Unreachable::new(&e));
        net.gate(target).await.map_err(not_sent)?;
        let header = serde_json::to_vec(&(&vote, &snapshot.meta))
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        use futures::StreamExt;
        // A built snapshot names a checkpoint; the document is written from
        // it here, in this replication's own task, so the state machine
        // keeps applying meanwhile. Sends of the same checkpoint that
        // overlap share one document.
        let mut cancel = std::pin::pin!(cancel);
        let stored = snapshot.snapshot.into_std().await;
        let written = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let written = crate::storage::outgoing_snapshot(stored);
            crate::metrics::observe_snapshot("write", started.elapsed());
            written
        });
        let document = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            w = written => w
                .map_err(std::io::Error::other)
                .and_then(|w| w.map_err(std::io::Error::other))
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?,
        };
        let bytes = document.size().unwrap_or(0);
        let me = net.me;
        let header_proof = header.clone();
        let first = SnapshotChunk {
            from: me,
            header,
            data: Vec::new(),
            stamp: Some(net.check.stamp(Some(target))),
        };
        // The bytes are read from the document as the stream is sent, a
        // chunk at a time (a 2 GB snapshot is never held in memory). A read
        // error ends the stream short, which the receiver refuses (the
        // document does not parse), so the leader sends it again later.
        let rest = futures::stream::unfold(Some(0), move |offset| {
            let document = document.clone();
            async move {
                let offset: u64 = offset?;
                let read =
                    tokio::task::spawn_blocking(move || document.read(offset, SNAPSHOT_CHUNK))
                        .await
                        .map_err(std::io::Error::other)
                        .and_then(|read| read);
                match read {
                    Ok(data) if data.is_empty() => None,
                    Ok(data) => {
                        let next = offset + data.len() as u64;
                        let chunk = SnapshotChunk {
                            from: me,
                            header: Vec::new(),
                            data,
                            stamp: None,
                        };
                        Some((chunk, Some(next)))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the snapshot to send failed");
                        None
                    }
                }
            }
        });
        let chunks = futures::stream::once(async move { first }).chain(rest);
        let mut client = net.client(target, &self.addr).map_err(not_sent)?;
        let mut req = tonic::Request::new(chunks);
        // The proof covers the vote and metadata; the data follows on the
        // same authenticated stream.
        net.auth.prove(
            req.metadata_mut(),
            super::transport::INSTALL_SNAPSHOT,
            me,
            &header_proof,
        );
        req.set_timeout(SNAPSHOT_DEADLINE);
        let send = async move { client.install_snapshot(req).await }
            .instrument(tracing::info_span!("snapshot_stream", bytes));
        let answer = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            a = send => a,
        };
        let answer = answer
            .map_err(|s| status_error(target, s))
            .inspect_err(|e| net.log_refusal(e))
            .map_err(|e| match e {
                e @ (TransportError::NotSent { .. } | TransportError::Refused { .. }) => {
                    not_sent(e)
                }
                e => StreamingError::Network(NetworkError::new(&e)),
            })?
            .into_inner();
        net.check.answered(target, answer.stamp.as_ref());
        let answer: Result<SnapshotResponse<NodeId>, Fatal<NodeId>> =
            serde_json::from_slice(&answer.payload)
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        answer.map_err(|e| StreamingError::RemoteError(RemoteError::new(target, e)))
    }

    fn backoff(&self) -> Backoff {
        // 100 ms doubling to 2 s: a restarted peer is found again quickly, a
        // dead one costs little.
        Backoff::new(std::iter::successors(
            Some(Duration::from_millis(100)),
            |d| Some((*d * 2).min(Duration::from_secs(2))),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::raft_transport_server::{RaftTransport, RaftTransportServer};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tonic::{Request, Response, Status, Streaming};

    /// A follower of the release before 209cad8 whose disk is short of
    /// space: it refuses every AppendEntries that carries entries.
    #[derive(Default)]
    struct FullOldFollower {
        refused: Arc<AtomicUsize>,
    }

    #[tonic::async_trait]
    impl RaftTransport for FullOldFollower {
        async fn append_entries(
            &self,
            _: Request<RaftMessage>,
        ) -> Result<Response<RaftMessage>, Status> {
            self.refused.fetch_add(1, Ordering::SeqCst);
            Err(Status::resource_exhausted("insufficient storage"))
        }
        async fn vote(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("vote"))
        }
        async fn install_snapshot(
            &self,
            _: Request<Streaming<SnapshotChunk>>,
        ) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("install_snapshot"))
        }
        async fn forward(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("forward"))
        }
    }

    #[tokio::test]
    async fn entries_refused_for_space_are_offered_again_at_a_paced_rate() {
        let follower = FullOldFollower::default();
        let refused = follower.refused.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftTransportServer::new(follower))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let record = super::super::membership_check::SharedRecord::new(Default::default());
        let network = Network::new(
            1,
            Faults::default(),
            4 << 20,
            ClusterAuth::from_secret("a cluster secret of enough length").unwrap(),
            MembershipCheck::new(1, "incarnation", record),
            Encoding::default(),
        );
        let mut leader = Connection {
            network,
            target: 2,
            addr,
            offered_upto: None,
        };
        let vote = Vote::new_committed(1, 1);
        let log_id = |index| openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
        let budget = Duration::from_millis(400);
        let started = std::time::Instant::now();
        for _ in 0..3 {
            let rpc = AppendEntriesRequest {
                vote,
                prev_log_id: Some(log_id(1)),
                entries: vec![openraft::Entry {
                    log_id: log_id(2),
                    payload: openraft::EntryPayload::Blank,
                }],
                leader_commit: Some(log_id(1)),
            };
            let answer = leader.append_entries(rpc, RPCOption::new(budget)).await;
            assert!(
                matches!(answer, Err(RPCError::Network(_))),
                "a refusal for space is an error openraft retries: {answer:?}"
            );
        }
        // Each refusal was answered at once; without the pacing the three
        // tries would take a few milliseconds, not half the budget each.
        assert_eq!(refused.load(Ordering::SeqCst), 3);
        assert!(
            started.elapsed() >= budget * 3 / 2,
            "{:?}",
            started.elapsed()
        );

        // A heartbeat refused so is not held back: nothing is resent.
        let heartbeat = AppendEntriesRequest {
            vote,
            prev_log_id: Some(log_id(1)),
            entries: Vec::new(),
            leader_commit: Some(log_id(1)),
        };
        let started = std::time::Instant::now();
        let _ = leader
            .append_entries(heartbeat, RPCOption::new(budget))
            .await;
        assert!(started.elapsed() < budget / 2, "{:?}", started.elapsed());
    }

    #[test]
    fn rules_are_the_oldest_any_member_follows() {
        let answered = HashMap::from([(2, 2), (3, 1)]);
        assert_eq!(rules_of_all([1, 2, 3], 1, 2, &answered, 2), 1);
        assert_eq!(rules_of_all([1, 2], 1, 2, &answered, 0), 2);
        // Never newer than this node's own, whatever the others say.
        assert_eq!(rules_of_all([1, 2], 1, 1, &answered, 2), 1);
        assert_eq!(rules_of_all([1], 1, 2, &answered, 0), 2);
    }

    #[test]
    fn members_not_heard_from_are_taken_at_the_clusters_rules() {
        // Right after an election nobody has answered yet: the rules the
        // cluster moved to hold, not the oldest.
        let none = HashMap::new();
        assert_eq!(rules_of_all([1, 2, 3], 1, 2, &none, 2), 2);
        assert_eq!(rules_of_all([1, 2, 3], 1, 2, &none, 0), 0);
        // An answer counts over the cluster's record: a member that came
        // back as an older binary is followed at its own level.
        let older = HashMap::from([(3, 0)]);
        assert_eq!(rules_of_all([1, 2, 3], 1, 2, &older, 2), 0);
    }
}
