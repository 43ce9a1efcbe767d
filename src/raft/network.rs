//! Node-to-node Raft RPC, client side: bincode bodies over HTTP, authenticated with the
//! cluster secret. One pooled HTTP client per node keeps connections alive between calls.
//!
//! A snapshot travels as one streamed request: a length-prefixed header (the leader's vote and
//! the snapshot's meta) followed by the snapshot in the whole format, 1 MiB at a time.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkV2};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Formats, NodeId, PeerFormats, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};
use crate::codec;

/// The header that carries the cluster secret on every Raft RPC.
pub const SECRET_HEADER: &str = "x-raftq-cluster-secret";

/// The header that names the format of a Raft RPC's body, and of its answer.
pub const FORMAT_HEADER: &str = "x-raftq-rpc-format";
/// Format of Raft RPC bodies: 1 is the codec encoding of openraft 0.9's messages, pinned byte
/// for byte by `raft::tests`. A request without [`FORMAT_HEADER`] (from a node of before the
/// header) is format 1; a receiver refuses a format it does not know with a 400 naming it. A
/// change of encoding is a new format, never a changed one.
pub const RPC_FORMAT: u32 = 1;

/// Asks the peer at `url` for its `/raft/status` (with the cluster secret): its JSON answer
/// (`Null` when the body is not JSON), or `None` when it did not answer within `timeout`.
pub async fn peer_status(
    http: &reqwest::Client,
    secret: &str,
    url: &str,
    timeout: std::time::Duration,
) -> Option<serde_json::Value> {
    let resp = http
        .get(format!("{url}/raft/status"))
        .header(SECRET_HEADER, secret)
        .timeout(timeout)
        .send()
        .await
        .ok()?;
    Some(resp.json().await.unwrap_or_default())
}

/// How long a peer's `/raft/status` may take to answer before a snapshot is sent to it.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long one snapshot transfer may take at most.
const SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// What precedes the snapshot file in a snapshot transfer.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct SnapshotHeader {
    pub vote: Vote,
    pub meta: SnapshotMeta,
}

impl SnapshotHeader {
    /// The header as it goes on the wire: its length (`u64`, little-endian), then the header.
    pub fn frame(&self) -> Result<Vec<u8>, bincode::Error> {
        let header = codec::encode(self)?;
        let mut framed = (header.len() as u64).to_le_bytes().to_vec();
        framed.extend(header);
        Ok(framed)
    }

    /// Reads a header framed by [`SnapshotHeader::frame`] from the start of a received body:
    /// the header and how many bytes it took, or `Ok(None)` while more bytes are needed. A
    /// length over `limit` or an undecodable header is an error.
    pub fn parse_frame(head: &[u8], limit: u64) -> Result<Option<(SnapshotHeader, usize)>, String> {
        let Some(prefix) = head.get(..8) else {
            return Ok(None);
        };
        let mut len = [0u8; 8];
        len.copy_from_slice(prefix);
        let len = u64::from_le_bytes(len);
        if len > limit || len > (usize::MAX - 8) as u64 {
            return Err(format!(
                "snapshot header of {len} bytes is over the limit of {limit}"
            ));
        }
        let end = 8 + len as usize;
        let Some(body) = head.get(8..end) else {
            return Ok(None);
        };
        let header = codec::decode_limited(body, limit)
            .map_err(|e| format!("undecodable snapshot header: {e}"))?;
        Ok(Some((header, end)))
    }
}

/// Builds connections to peers.
#[derive(Clone)]
pub struct Network {
    http: reqwest::Client,
    secret: Arc<str>,
    decode_limit: u64,
    /// What each peer takes: a linked snapshot goes as a linked transfer only to a follower
    /// that said it takes one.
    formats: Arc<PeerFormats>,
    /// The first index this node's log still reads ([`crate::store::log::LogStore::first_readable`]).
    first_readable: Arc<AtomicU64>,
}

impl Network {
    /// `http` is the node's peer client ([`crate::tls::peer_client`]): pooled, and trusting
    /// the cluster's CA for `https://` peers.
    pub fn new(
        http: reqwest::Client,
        secret: Arc<str>,
        decode_limit: u64,
        formats: Arc<PeerFormats>,
        first_readable: Arc<AtomicU64>,
    ) -> Self {
        Network {
            http,
            secret,
            decode_limit,
            formats,
            first_readable,
        }
    }
}

/// Whether a follower that said `formats` (`None`: not heard from) takes a linked transfer.
pub fn takes_linked(formats: Option<Formats>) -> bool {
    formats.is_some_and(|f| f.snapshots >= LINKED_TRANSFER)
}

/// The snapshot transfer format of a linked transfer (`store::transfer::RECEIVES`): 5, since a
/// linked snapshot's records may be runs; a follower that says 4 gets the whole format.
pub const LINKED_TRANSFER: u32 = 5;

/// A connection to one peer.
pub struct Peer {
    target: NodeId,
    url: String,
    net: Network,
    /// Whether the peer takes appends as one stream ([`super::stream`]); cleared when it
    /// answers that it does not know the endpoint, and then appends go one request at a time.
    streams: bool,
    /// Whether this connection carries log replication (not heartbeats): then a stream of
    /// appends that has gone on behind the purged log is ended ([`until_stale`]).
    replicates: bool,
}

impl Network {
    fn peer(&self, target: NodeId, node: &BasicNode, replicates: bool) -> Peer {
        Peer {
            target,
            url: node.addr.trim_end_matches('/').to_string(),
            net: self.clone(),
            streams: true,
            replicates,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        self.peer(target, node, true)
    }

    /// Heartbeats carry the leader's idea of what the follower holds, which lags behind a
    /// snapshot the follower is installing: they are never checked against the purged log.
    async fn new_heartbeat_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        self.peer(target, node, false)
    }

    async fn new_snapshot_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        self.peer(target, node, false)
    }
}

/// Where an append request resumes, against the first index the leader's log still reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// After the purged log, its entries (if any) right after its previous one.
    Fine,
    /// Its previous entry comes before the purge point, and it carries no entries.
    Behind,
    /// Its entries do not follow its previous entry: some in between were purged.
    Broken,
}

/// Where `req` resumes, with `first_readable` the first index the leader's log still reads.
pub fn resume_of(req: &AppendEntriesRequest<TypeConfig>, first_readable: u64) -> Resume {
    let next = req.prev_log_id.as_ref().map_or(0, |l| l.index + 1);
    match req.entries.first() {
        Some(first) if first.log_id.index != next => Resume::Broken,
        Some(_) => Resume::Fine,
        None if next < first_readable => Resume::Behind,
        None => Resume::Fine,
    }
}

/// `input` up to the request where a replication stream has gone on behind the purged log,
/// and whether it stopped there (known once it has ended).
///
/// The leader never starts replication there (a follower that far behind is sent a snapshot,
/// and the log is purged only past every stream in flight), but openraft 0.10.0-alpha.37 can
/// keep a stream running after it has moved that follower on to a snapshot and purged behind
/// it. Such a stream asks the log for purged entries, gets none, and sends the same entry-less
/// request every 10 ms for as long as the leader leads, never the entries after the snapshot;
/// asked for a range that straddles the purge point, it gets the entries after it and would
/// send them behind a previous entry they do not follow. The first is stopped at its second
/// such request (a single one is also what a commit update to a follower that is being sent a
/// snapshot looks like, and goes as before), the second at once. Ending the stream with an
/// error resets the follower's replication, which resumes from where the follower is.
fn until_stale<S>(
    input: S,
    first_readable: Arc<AtomicU64>,
) -> (
    impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
    Arc<AtomicBool>,
)
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let mut behind_before = false;
    let input = input.take_while(move |req| {
        let go_on = match resume_of(req, first_readable.load(Ordering::SeqCst)) {
            Resume::Fine => true,
            Resume::Behind => !std::mem::replace(&mut behind_before, true),
            Resume::Broken => false,
        };
        if !go_on {
            flag.store(true, Ordering::SeqCst);
        }
        futures::future::ready(go_on)
    });
    (input, stopped)
}

type RpcResult<T> = Result<T, RPCError<TypeConfig>>;
type StreamItem = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

pub(super) fn network_err(e: impl std::fmt::Display) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::from_string(e))
}

/// A request that could not be sent: unreachable when no connection could be made.
pub(super) fn send_err(e: reqwest::Error) -> RPCError<TypeConfig> {
    if e.is_connect() {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

/// A peer's answer other than 2xx, with the start of its body.
pub(super) fn refused(
    target: NodeId,
    status: reqwest::StatusCode,
    body: &[u8],
) -> RPCError<TypeConfig> {
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    network_err(format!("peer {target} answered {status}: {text}"))
}

impl Peer {
    /// A Raft RPC to `/raft/{path}`: the cluster secret, the body format, a binary body.
    pub(super) fn request(&self, path: &str) -> reqwest::RequestBuilder {
        self.net
            .http
            .post(format!("{}/raft/{path}", self.url))
            .header(SECRET_HEADER, &*self.net.secret)
            .header(FORMAT_HEADER, RPC_FORMAT)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
    }

    async fn post(
        &self,
        path: &str,
        body: reqwest::Body,
        timeout: std::time::Duration,
    ) -> RpcResult<bytes::Bytes> {
        let resp = self
            .request(path)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(send_err)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(network_err)?;
        if !status.is_success() {
            return Err(refused(self.target, status, &bytes));
        }
        Ok(bytes)
    }

    /// Decodes a peer's answer: its result, or a Raft error it reported (a node that is
    /// shutting down or has stopped), which is as good as unreachable.
    fn answer<Resp: DeserializeOwned>(&self, bytes: &[u8]) -> RpcResult<Resp> {
        let result: Result<Resp, RaftError<TypeConfig>> =
            codec::decode_limited(bytes, self.net.decode_limit).map_err(network_err)?;
        result.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    async fn call<Req, Resp>(&self, path: &str, req: &Req, option: &RPCOption) -> RpcResult<Resp>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let body = codec::encode(req).map_err(network_err)?;
        let bytes = self.post(path, body.into(), option.hard_ttl()).await?;
        self.answer(&bytes)
    }

    /// What the peer takes, as it last said in its `/raft/status`; asked now when it was not
    /// heard from yet (it, or this node, has just started), so that the form a snapshot goes
    /// in does not depend on when the once-a-second reading last reached it.
    async fn formats(&self) -> Option<Formats> {
        if let Some(formats) = self.net.formats.get(self.target) {
            return Some(formats);
        }
        let status =
            peer_status(&self.net.http, &self.net.secret, &self.url, STATUS_TIMEOUT).await?;
        let formats = Formats::from_status(&status);
        self.net.formats.record(self.target, formats);
        Some(formats)
    }

    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: Snapshot,
    ) -> RpcResult<SnapshotResponse<TypeConfig>> {
        let prefix = SnapshotHeader {
            vote,
            meta: snapshot.meta,
        }
        .frame()
        .map_err(network_err)?;
        let prefix = Ok::<_, std::io::Error>(bytes::Bytes::from(prefix));
        let linked = takes_linked(self.formats().await);
        let chunks = futures::StreamExt::chain(
            futures::stream::once(futures::future::ready(prefix)),
            snapshot.snapshot.for_peer(linked),
        );
        let bytes = self
            .post(
                "snapshot",
                reqwest::Body::wrap_stream(chunks),
                SNAPSHOT_TIMEOUT,
            )
            .await?;
        self.answer(&bytes)
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
        self.call("append", &rpc, &option).await
    }

    /// The appends to this follower as one streamed request, several in flight at once (see
    /// [`super::stream`]); one request at a time to a peer that does not take the stream.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, StreamItem>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let (input, stale) = if self.replicates {
            until_stale(input, self.net.first_readable.clone())
        } else {
            until_stale(input, Arc::new(AtomicU64::new(0)))
        };
        let target = self.target;
        let first_readable = self.net.first_readable.clone();
        // After the answers, an error when the requests stopped at one that was stale.
        let ended_stale = move || {
            stale.load(Ordering::SeqCst).then(|| {
                let floor = first_readable.load(Ordering::SeqCst);
                tracing::warn!(
                    target,
                    "a replication stream to peer {target} went on behind this node's purged \
                     log (it reads from entry {floor}); ending it, so that the follower's \
                     replication resumes from where the follower is"
                );
                Err(network_err(format!(
                    "replication to peer {target} resumed behind the purged log"
                )))
            })
        };
        let answers = async move {
            if self.streams {
                let opened = super::stream::open(
                    self.request(super::stream::PATH),
                    self.target,
                    self.net.decode_limit,
                    option.hard_ttl(),
                    input,
                )
                .await?;
                match opened {
                    Ok(answers) => return Ok(answers),
                    Err(input) => {
                        tracing::info!(
                            target = self.target,
                            "peer does not take streamed appends (an older release); sending \
                             them one at a time"
                        );
                        self.streams = false;
                        return stream_append_sequential(self, input, option).await;
                    }
                }
            }
            stream_append_sequential(self, input, option).await
        };
        Box::pin(async move {
            let answers = answers.await?;
            let tail = futures::stream::once(async move { ended_stale() })
                .filter_map(futures::future::ready);
            Ok(answers.chain(tail).boxed())
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        self.call("vote", &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        self.call("pre-vote", &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            res = self.send_snapshot(vote, snapshot) => Ok(res?),
        }
    }
}
