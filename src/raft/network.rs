//! Node-to-node Raft RPC, client side: bincode bodies over HTTP, authenticated with the
//! cluster secret. One pooled HTTP client per node keeps connections alive between calls.

use std::error::Error;
use std::sync::Arc;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{NodeId, TypeConfig};
use crate::codec;

/// The header that carries the cluster secret on every Raft RPC.
pub const SECRET_HEADER: &str = "x-raftq-cluster-secret";

/// Builds connections to peers.
#[derive(Clone)]
pub struct Network {
    http: reqwest::Client,
    secret: Arc<str>,
    decode_limit: u64,
}

impl Network {
    pub fn new(secret: Arc<str>, decode_limit: u64) -> Self {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .tcp_nodelay(true)
            .connect_timeout(std::time::Duration::from_millis(500))
            .build()
            .unwrap_or_default();
        Network {
            http,
            secret,
            decode_limit,
        }
    }
}

/// A connection to one peer.
pub struct Peer {
    target: NodeId,
    url: String,
    net: Network,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            target,
            url: node.addr.trim_end_matches('/').to_string(),
            net: self.clone(),
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl Peer {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        let body = codec::encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let resp = self
            .net
            .http
            .post(format!("{}/raft/{path}", self.url))
            .header(SECRET_HEADER, &*self.net.secret)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .timeout(option.hard_ttl())
            .body(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            let err = AnyError::error(format!("peer {} answered {status}: {text}", self.target));
            return Err(RPCError::Network(NetworkError::new(&err)));
        }
        let result: Result<Resp, RaftError<NodeId, E>> =
            codec::decode_limited(&bytes, self.net.decode_limit)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.call("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call("vote", &rpc, &option).await
    }
}
