//! Raft network. The registry runs as a single voter until the cluster issue
//! adds the internal gRPC transport; openraft never opens a connection for a
//! single-voter cluster, so every RPC here reports the target unreachable.
//! Adding nodes means replacing this factory, not re-plumbing the node.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

use super::{NodeId, TypeConfig};

/// Network factory of the node.
#[derive(Debug, Clone, Default)]
pub struct Network;

/// A connection to one peer.
#[derive(Debug)]
pub struct Connection {
    target: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        Connection { target }
    }
}

impl Connection {
    fn unreachable<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        let msg = format!(
            "no Raft transport to node {} in a single-node registry",
            self.target
        );
        RPCError::Unreachable(Unreachable::new(&std::io::Error::other(msg)))
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.unreachable())
    }
}
