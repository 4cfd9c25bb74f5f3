//! The server side of the internal Raft transport: hands peers' messages to
//! openraft and executes requests forwarded by followers. Served only on the
//! internal listener, never next to the public API.

use futures::StreamExt;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest};
use openraft::{BasicNode, Snapshot, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use super::cluster_auth::ClusterAuth;
use super::codec::{self, Encoding};
use super::faults::Faults;
use super::forward::Forwarded;
use super::{NodeId, RaftNode, TypeConfig};
use crate::listener::Peer;
use crate::pb::raft_transport_server::RaftTransport;
use crate::pb::{PeerStamp, RaftMessage, SnapshotChunk};

/// The RPC names cluster proofs are bound to.
pub const APPEND_ENTRIES: &str = "append_entries";
pub const VOTE: &str = "vote";
pub const INSTALL_SNAPSHOT: &str = "install_snapshot";
pub const FORWARD: &str = "forward";

/// gRPC service of the internal listener.
pub struct RaftService {
    node: RaftNode,
    faults: Faults,
    max_snapshot_bytes: usize,
    auth: ClusterAuth,
    /// Which AppendEntries encoding this node's answers say it takes.
    encoding: Encoding,
}

impl RaftService {
    pub fn new(
        node: RaftNode,
        faults: Faults,
        max_snapshot_bytes: usize,
        auth: ClusterAuth,
        encoding: Encoding,
    ) -> Self {
        Self {
            node,
            faults,
            max_snapshot_bytes,
            auth,
            encoding,
        }
    }

    /// Everything a message passes before it is acted on: the caller's
    /// proof (`authenticate`), then what it claims (`admit`). The sender's
    /// membership is looked up once for both.
    fn gate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
        method: &str,
        first: (NodeId, &[u8], Option<&PeerStamp>),
    ) -> Result<(), Status> {
        let (from, payload, stamp) = first;
        let member = self.node.member_addr(from);
        self.authenticate(
            metadata,
            extensions,
            method,
            from,
            payload,
            member.as_deref(),
        )?;
        // Forwarded requests are not held to the rule for the log.
        let to_log = (method != FORWARD).then_some(member.is_some());
        self.admit(from, stamp, to_log)
    }

    /// Refuses a caller that has not proven it belongs to this cluster
    /// (`member`: the address this node has for it, if a member).
    fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
        method: &str,
        from: NodeId,
        payload: &[u8],
        member: Option<&str>,
    ) -> Result<(), Status> {
        let peer = extensions.get::<Peer>();
        self.auth
            .check(metadata, peer, method, from, payload, member)
            .inspect_err(|e| {
                tracing::warn!(
                    node_id = self.node.id,
                    method,
                    claimed_from = from,
                    remote = ?peer.map(|p| p.remote),
                    reason = e.message(),
                    "refused a Raft RPC without cluster proof"
                )
            })
    }

    /// Checks a unary message's proof and returns it.
    fn admit_message(
        &self,
        request: Request<RaftMessage>,
        method: &str,
    ) -> Result<RaftMessage, Status> {
        let (metadata, extensions, msg) = request.into_parts();
        let first = (msg.from, msg.payload.as_slice(), msg.stamp.as_ref());
        self.gate(&metadata, &extensions, method, first)?;
        Ok(msg)
    }

    /// Refuses messages from a peer cut off by fault rules
    /// (FAILED_PRECONDITION), and from a node of another cluster or
    /// addressed to another data directory of this node (PERMISSION_DENIED):
    /// both tell the sender nothing was done. `to_log`, for a request that
    /// acts on the log or the vote: whether the sender is a member here,
    /// which one claiming no cluster must be (`MembershipCheck::admit_to_log`).
    fn admit(
        &self,
        from: NodeId,
        stamp: Option<&PeerStamp>,
        to_log: Option<bool>,
    ) -> Result<(), Status> {
        if self.faults.refuses(from) {
            return Err(Status::failed_precondition(format!(
                "node {} refuses traffic from node {from} (fault injection)",
                self.node.id
            )));
        }
        let check = self.node.membership_check();
        let admitted = match to_log {
            Some(member) => check.admit_to_log(from, stamp, member),
            None => check.admit(from, stamp),
        };
        admitted.map_err(|refusal| {
            if check.should_log(from) {
                tracing::error!(
                    node_id = self.node.id,
                    peer = from,
                    "refused Raft traffic: {refusal}"
                );
            }
            Status::permission_denied(refusal.to_string())
        })
    }

    /// An answer, stamped with this node's cluster id and incarnation.
    fn answer<T: Serialize>(&self, value: &T) -> Result<Response<RaftMessage>, Status> {
        let payload = serde_json::to_vec(value).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(RaftMessage {
            from: self.node.id,
            payload,
            stamp: Some(self.node.membership_check().stamp(None)),
            encoding: self.encoding.accepts(),
            batches: self.encoding.applies_batches(),
            rules: self.encoding.apply_rules(),
        }))
    }
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(json).map_err(|e| Status::invalid_argument(format!("bad message: {e}")))
}

#[tonic::async_trait]
impl RaftTransport for RaftService {
    #[instrument(level = "debug", skip_all, fields(node_id = self.node.id, from = request.get_ref().from))]
    async fn append_entries(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let arrived = std::time::Instant::now();
        let msg = self.admit_message(request, APPEND_ENTRIES)?;
        let rpc: AppendEntriesRequest<TypeConfig> = match msg.encoding {
            codec::JSON => decode(&msg.payload)?,
            codec::BINARY => {
                let received = codec::decode_append(msg.payload.into())
                    .map_err(|e| Status::invalid_argument(format!("bad message: {e}")))?;
                // Offers first, so the entries this message commits find
                // their signatures when they are applied.
                let leader = received.rpc.vote.leader_id;
                self.node.signatures().receive(
                    (leader.term, leader.node_id),
                    received.leader_applied,
                    received.offers,
                );
                received.rpc
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown message encoding {other}"
                )))
            }
        };
        // Entries this node could not store would stop its Raft core. Short
        // of space, it takes the message as a heartbeat (it keeps its leader,
        // does not start elections, and applies what it holds and the leader
        // committed) and answers that it took none of the entries: the
        // leader sends them again, paced (`network`), until space is back.
        // An error here instead made openraft's leader retry at once, every
        // few hundred microseconds, logging each try.
        let carries_entries = !rpc.entries.is_empty();
        if carries_entries {
            if let Err(e) = self.node.space() {
                tracing::debug!(error = %e, "entries refused for lack of space");
                let matched = rpc.prev_log_id;
                let heartbeat = AppendEntriesRequest {
                    entries: Vec::new(),
                    ..rpc
                };
                let answer = self
                    .node
                    .raft
                    .append_entries(heartbeat)
                    .await
                    .map(|a| match a {
                        AppendEntriesResponse::Success => {
                            AppendEntriesResponse::PartialSuccess(matched)
                        }
                        other => other,
                    });
                return self.answer(&answer);
            }
        }
        let answer = self.answer(&self.node.raft.append_entries(rpc).await);
        if carries_entries {
            crate::metrics::observe_append_handling(arrived.elapsed());
        }
        answer
    }

    #[instrument(level = "debug", skip_all, fields(node_id = self.node.id, from = request.get_ref().from))]
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let msg = self.admit_message(request, VOTE)?;
        let rpc: VoteRequest<NodeId> = decode(&msg.payload)?;
        self.node.signatures().forget_leader();
        self.answer(&self.node.raft.vote(rpc).await)
    }

    #[instrument(level = "info", skip_all, fields(node_id = self.node.id))]
    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftMessage>, Status> {
        let (metadata, extensions, mut chunks) = request.into_parts();
        let first = chunks
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        self.gate(
            &metadata,
            &extensions,
            INSTALL_SNAPSHOT,
            (first.from, &first.header, first.stamp.as_ref()),
        )?;
        let (vote, meta): (Vote<NodeId>, SnapshotMeta<NodeId, BasicNode>) = decode(&first.header)?;
        // Written to a file of the state machine's as it arrives, so a
        // snapshot of any size costs a chunk of memory here.
        let mut file = self
            .node
            .raft
            .begin_receiving_snapshot()
            .await
            .map_err(|e| Status::unavailable(format!("cannot receive a snapshot now: {e}")))?;
        let unwritable = |e: std::io::Error| Status::internal(format!("snapshot not stored: {e}"));
        let mut bytes = 0usize;
        let mut data = first.data;
        loop {
            if bytes + data.len() > self.max_snapshot_bytes {
                return Err(Status::resource_exhausted(format!(
                    "snapshot exceeds {} bytes",
                    self.max_snapshot_bytes
                )));
            }
            bytes += data.len();
            file.write_all(&data).await.map_err(unwritable)?;
            match chunks.next().await {
                Some(chunk) => data = chunk?.data,
                None => break,
            }
        }
        file.flush().await.map_err(unwritable)?;
        file.rewind().await.map_err(unwritable)?;
        tracing::info!(bytes, snapshot = %meta.snapshot_id, "received a snapshot");
        let snapshot = Snapshot::<TypeConfig> {
            meta,
            snapshot: file,
        };
        self.answer(&self.node.raft.install_full_snapshot(vote, snapshot).await)
    }

    #[instrument(level = "debug", skip_all, fields(node_id = self.node.id, from = request.get_ref().from))]
    async fn forward(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let msg = self.admit_message(request, FORWARD)?;
        let forwarded: Forwarded = decode(&msg.payload)?;
        tracing::debug!(request = forwarded.name(), "executing a forwarded request");
        let write = matches!(forwarded, Forwarded::Write(_));
        let reply = self.node.execute(forwarded).await;
        if write && reply.is_ok() {
            // The follower that passed the write on answers its client
            // next, and that client may read through it at once: send the
            // commit now rather than with the next entries (a leader waits
            // up to 2 ms for those, vendor/README.md).
            let _ = self.node.raft.trigger().heartbeat().await;
        }
        self.answer(&reply)
    }
}
