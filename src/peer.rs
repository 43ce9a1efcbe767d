//! Node-to-node Raft RPC, server side: `/raft/*` endpoints (the client side is
//! [`crate::raft::network`]).
//!
//! Only the cluster secret opens these endpoints (compared in constant time); client API
//! tokens are never accepted here. Bodies are decoded with a size limit, so garbage or a
//! hostile length prefix is a 400, never a panic or an unbounded allocation. The endpoints
//! have their own state ([`PeerState`]) and their own error ([`PeerError`]): they share nothing
//! with the public API but the server they are routed on.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use openraft::async_runtime::watch::WatchReceiver as _;
use serde::de::DeserializeOwned;
use serde::Serialize;

use openraft::error::RaftError;

use raftq_client::api::{ErrorCode, Problem};

use crate::codec;
use crate::node::AppState;
use crate::raft::network::{SnapshotHeader, FORMAT_HEADER, RPC_FORMAT, SECRET_HEADER};
use crate::raft::{stream, NodeId, Snapshot, SnapshotData, TypeConfig};
use crate::store::{transfer, Raft, SmShared};
use crate::tokens::secret_matches;
use openraft::raft::AppendEntriesRequest;

/// What the `/raft/*` endpoints work with.
pub struct PeerState {
    pub id: NodeId,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    /// The secret every request must carry in [`SECRET_HEADER`].
    pub cluster_secret: String,
    /// The largest request body (and snapshot header) taken.
    pub body_limit: usize,
    /// The replica, for the leader's side of the rejoin protocol.
    pub node: AppState,
}

type Peer = Arc<PeerState>;

/// A `/raft/*` request that was refused or failed, answered as an RFC 9457 problem (the same
/// shape as the public API's, so a peer's log reads the same).
#[derive(Debug)]
pub struct PeerError {
    code: ErrorCode,
    status: u16,
    detail: String,
}

impl PeerError {
    fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        PeerError {
            code,
            status: code.status(),
            detail: detail.into(),
        }
    }

    fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, detail)
    }

    fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, detail)
    }

    fn internal(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, detail)
    }

    /// Not now: a 503 the caller retries.
    fn unavailable(detail: impl Into<String>) -> Self {
        PeerError {
            status: 503,
            ..Self::internal(detail)
        }
    }
}

impl From<BytesRejection> for PeerError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                ErrorCode::PayloadTooLarge,
                format!("request body too large: {}", r.body_text()),
            )
        } else {
            Self::invalid(format!("unreadable request body: {}", r.body_text()))
        }
    }
}

impl IntoResponse for PeerError {
    fn into_response(self) -> Response {
        let mut problem = Problem::new(self.code, self.detail);
        problem.status = self.status;
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response()
    }
}

fn authorize(state: &PeerState, headers: &HeaderMap) -> Result<(), PeerError> {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if secret_matches(given, state.cluster_secret.as_bytes()) {
        Ok(())
    } else {
        Err(PeerError::unauthorized(
            "Raft endpoints need the cluster secret",
        ))
    }
}

/// Refuses a body of a format this node does not read (see [`RPC_FORMAT`]).
fn check_format(headers: &HeaderMap) -> Result<(), PeerError> {
    let Some(given) = headers.get(FORMAT_HEADER) else {
        return Ok(());
    };
    match given
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        Some(RPC_FORMAT) => Ok(()),
        _ => Err(PeerError::invalid(format!(
            "Raft RPC body of format {given:?}; this node reads format {RPC_FORMAT} (run the same \
             raftq release on every node)"
        ))),
    }
}

fn decode<T: DeserializeOwned>(state: &PeerState, body: &[u8]) -> Result<T, PeerError> {
    codec::decode_limited(body, state.body_limit as u64)
        .map_err(|e| PeerError::invalid(format!("undecodable Raft RPC body: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Response {
    match codec::encode(value) {
        Ok(bytes) => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => PeerError::internal(format!("encoding Raft reply: {e}")).into_response(),
    }
}

/// Authorizes, decodes the request, runs the Raft call and encodes its result.
async fn serve_rpc<Req, Resp, Fut>(
    state: Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    call: impl FnOnce(Raft, Req) -> Fut,
) -> Result<Response, PeerError>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    Fut: std::future::Future<Output = Resp>,
{
    authorize(&state, &headers)?;
    check_format(&headers)?;
    let req = decode(&state, &body?)?;
    Ok(reply(&call(state.raft.clone(), req).await))
}

type RpcBody = Result<Bytes, BytesRejection>;

async fn append(State(s): State<Peer>, h: HeaderMap, body: RpcBody) -> Result<Response, PeerError> {
    serve_rpc(s, h, body, |raft, req| async move {
        raft.append_entries(req).await
    })
    .await
}

/// Appends as one stream ([`crate::raft::stream`]): each framed request in the body goes to
/// Raft as it arrives, and each answer goes back framed as Raft gives it, in order, while
/// later requests are already on their way. A frame that is too large or does not decode ends
/// the requests there; the answers to those before it still go back, and the sender, missing
/// the rest, gives the stream up.
async fn append_stream(
    State(s): State<Peer>,
    h: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, PeerError> {
    use futures::StreamExt;
    use stream::{frame, Answer, Frames};

    authorize(&s, &h)?;
    check_format(&h)?;
    let frames = Frames::new(s.body_limit as u64);
    let chunks = body.into_data_stream();
    let requests =
        futures::stream::unfold((chunks, frames), |(mut chunks, mut frames)| async move {
            loop {
                match frames.take::<AppendEntriesRequest<TypeConfig>>() {
                    Ok(Some(req)) => return Some((req, (chunks, frames))),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!("append stream: {e}; no more requests taken from it");
                        return None;
                    }
                }
                match chunks.next().await {
                    Some(Ok(chunk)) => frames.push(&chunk),
                    Some(Err(e)) => {
                        tracing::debug!("append stream: the request body broke off: {e}");
                        return None;
                    }
                    None => return None,
                }
            }
        });
    let answers = s.raft.stream_append(Box::pin(requests)).map(|answer| {
        let answer: Answer = answer.map_err(|fatal| fatal.to_string());
        frame(&answer).map_err(std::io::Error::other)
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        axum::body::Body::from_stream(answers),
    )
        .into_response())
}

/// A node rejoining after it lost data does not vote (see [`crate::rejoin`]): it could help
/// elect a leader that lacks entries it once acknowledged. Unreachable, as far as candidates
/// can tell.
fn refuse_vote_while_rejoining(s: &PeerState) -> Result<(), PeerError> {
    if crate::rejoin::is_rejoining(&s.node) {
        return Err(PeerError::unavailable(
            "this node is rejoining after losing data and does not vote until it has caught up",
        ));
    }
    Ok(())
}

async fn vote(State(s): State<Peer>, h: HeaderMap, body: RpcBody) -> Result<Response, PeerError> {
    authorize(&s, &h)?;
    refuse_vote_while_rejoining(&s)?;
    serve_rpc(s, h, body, |raft, req| async move { raft.vote(req).await }).await
}

async fn pre_vote(
    State(s): State<Peer>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, PeerError> {
    authorize(&s, &h)?;
    refuse_vote_while_rejoining(&s)?;
    serve_rpc(
        s,
        h,
        body,
        |raft, req| async move { raft.pre_vote(req).await },
    )
    .await
}

/// Receives a snapshot: the header (vote and meta), then the file, streamed to a temp file in
/// the snapshot directory; then hands it to Raft, which installs it through the state machine
/// (checked whole, fsynced, renamed into place, loaded).
async fn snapshot(
    State(state): State<Peer>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, PeerError> {
    authorize(&state, &headers)?;
    check_format(&headers)?;
    let (file, path) = state
        .sm
        .begin_receiving_snapshot()
        .await
        .map_err(|e| PeerError::internal(format!("cannot receive a snapshot: {e}")))?;
    let result = receive_snapshot(&state, file, &path, body).await;
    // The state machine has copied what it installs; the received stream is not needed.
    let _ = tokio::fs::remove_file(&path).await;
    result
}

async fn receive_snapshot(
    state: &PeerState,
    mut file: tokio::fs::File,
    path: &std::path::Path,
    body: axum::body::Body,
) -> Result<Response, PeerError> {
    use futures::StreamExt;
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};

    let header_limit = state.body_limit as u64;
    let io = |e: std::io::Error| PeerError::internal(format!("storing a received snapshot: {e}"));
    let mut head = Vec::new();
    let mut header: Option<SnapshotHeader> = None;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| PeerError::invalid(format!("snapshot body: {e}")))?;
        let mut data = &chunk[..];
        if header.is_none() {
            head.extend_from_slice(data);
            data = &[];
            let Some((parsed, end)) =
                SnapshotHeader::parse_frame(&head, header_limit).map_err(PeerError::invalid)?
            else {
                continue;
            };
            header = Some(parsed);
            file.write_all(&head[end..]).await.map_err(io)?;
        }
        file.write_all(data).await.map_err(io)?;
    }
    let Some(header) = header else {
        return Err(PeerError::invalid("snapshot body ended before its header"));
    };
    file.flush().await.map_err(io)?;
    file.rewind().await.map_err(io)?;
    check_snapshot(state, &header)?;
    // Checked whole here, so that a broken transfer is refused to its sender; the state
    // machine checks it again as it stores it, and a failure there would stop this node.
    let path = path.to_path_buf();
    let got = tokio::task::spawn_blocking(move || transfer::verify_received(&path))
        .await
        .map_err(|e| PeerError::internal(format!("checking a received snapshot: {e}")))?
        .map_err(|e| PeerError::invalid(format!("received snapshot: {e}")))?;
    if got.last_log_id != header.meta.last_log_id {
        return Err(PeerError::invalid(format!(
            "received snapshot holds up to {:?}, but its header says {:?}",
            got.last_log_id, header.meta.last_log_id
        )));
    }
    let snapshot = Snapshot {
        meta: header.meta,
        snapshot: SnapshotData::File(file),
    };
    let result = state
        .raft
        .install_full_snapshot(header.vote, snapshot)
        .await
        .map_err(RaftError::<TypeConfig>::Fatal);
    Ok(reply(&result))
}

/// Refuses a snapshot that no leader following the protocol can send, which openraft would
/// treat as a broken invariant: one holding entries of a term beyond the sender's vote, or one
/// ahead of what this node has committed but not past its committed index.
fn check_snapshot(state: &PeerState, header: &SnapshotHeader) -> Result<(), PeerError> {
    let Some(last) = &header.meta.last_log_id else {
        return Ok(());
    };
    if last.committed_leader_id() > &header.vote.leader_id {
        return Err(PeerError::invalid(format!(
            "snapshot up to {last} is beyond the sender's vote {}",
            header.vote
        )));
    }
    let local_committed = state.raft.metrics().borrow_watched().local_committed;
    if let Some(committed) = &local_committed {
        if last > committed && last.index <= committed.index {
            return Err(PeerError::invalid(format!(
                "snapshot up to {last} contradicts the committed log up to {committed}"
            )));
        }
    }
    Ok(())
}

/// Starts an election on this node now. A leader that shuts down asks its most up-to-date
/// follower to do this as soon as the followers' leader lease has lapsed, instead of waiting
/// for a randomized election timeout. Starting an election is always safe in Raft.
async fn elect(State(state): State<Peer>, headers: HeaderMap) -> Result<Response, PeerError> {
    authorize(&state, &headers)?;
    state
        .raft
        .trigger()
        .elect(false)
        .await
        .map_err(|e| PeerError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(serde::Deserialize)]
struct RejoinRequest {
    id: NodeId,
}

/// Authenticates a rejoin or promote request and reads the id of the node it is about.
fn rejoin_request(
    state: &PeerState,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<NodeId, PeerError> {
    authorize(state, headers)?;
    let req: RejoinRequest = serde_json::from_slice(body)
        .map_err(|e| PeerError::invalid(format!("{what} request: {e}")))?;
    Ok(req.id)
}

/// `/raft/rejoin`: a node that lost data asks to be made a learner (leader only).
async fn rejoin(
    State(state): State<Peer>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PeerError> {
    let id = rejoin_request(&state, &headers, &body, "rejoin")?;
    match crate::rejoin::demote(&state.node, id).await {
        Ok(grant) => {
            // Its log went back to nothing: replicate to it from the start, by snapshot.
            let _ = state.raft.trigger().allow_next_revert(&id, true).await;
            Ok(axum::Json(grant).into_response())
        }
        Err(why) => Err(PeerError::unavailable(why)),
    }
}

/// `/raft/promote`: a rejoining node that caught up asks to vote again (leader only).
async fn promote(
    State(state): State<Peer>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PeerError> {
    let id = rejoin_request(&state, &headers, &body, "promote")?;
    crate::rejoin::promote(&state.node, id)
        .await
        .map_err(PeerError::unavailable)?;
    Ok(axum::Json(serde_json::json!({ "id": id })).into_response())
}

/// Whether this node has Raft state (used by the bootstrap of a new cluster).
async fn status(State(state): State<Peer>, headers: HeaderMap) -> Result<Response, PeerError> {
    authorize(&state, &headers)?;
    let initialized = state
        .raft
        .is_initialized()
        .await
        .map_err(|e| PeerError::internal(e.to_string()))?;
    let m = state.raft.metrics().borrow_watched().clone();
    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    // On the leader: how far each node has replicated (in memory since it became leader).
    let matched: std::collections::BTreeMap<String, u64> = m
        .replication
        .iter()
        .flatten()
        .filter_map(|(id, l)| l.as_ref().map(|l| (id.to_string(), l.index)))
        .collect();
    Ok(axum::Json(serde_json::json!({
        "node_id": state.id,
        "initialized": initialized,
        "term": m.current_term,
        "leader_id": m.current_leader,
        "last_log_index": m.last_log_index.unwrap_or(0),
        "voters": voters,
        "matched": matched,
        // The last log index removed from this node's log (behind its snapshot).
        "purged": m.purged.map_or(0, |l| l.index),
        // This node's wall clock, for the peers' entry clocks (crate::clock).
        "wall_us": crate::clock::wall_us(),
        // The newest commands this node applies: a leader proposes batch publishes only once
        // every member applies them.
        "command_format": crate::state::COMMAND_FORMAT,
        // The snapshot transfer format it receives: a leader sends its linked snapshots as
        // linked transfers only to followers that take them.
        "snapshot_format": crate::store::transfer::RECEIVES,
    }))
    .into_response())
}

/// The `/raft/*` routes.
pub fn router(state: PeerState) -> Router {
    let state = Arc::new(state);
    let limit = state.body_limit;
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/append-stream", post(append_stream))
        .route("/raft/vote", post(vote))
        .route("/raft/pre-vote", post(pre_vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/status", get(status))
        .route("/raft/rejoin", post(rejoin))
        .route("/raft/promote", post(promote))
        .route("/raft/elect", post(elect))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
