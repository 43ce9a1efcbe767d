//! Node-to-node Raft RPC, server side: `/raft/*` endpoints.
//!
//! Only the cluster secret opens these endpoints (compared in constant time); client API
//! tokens are never accepted here. Bodies are decoded with a size limit, so garbage or a
//! hostile length prefix is a 400, never a panic or an unbounded allocation.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use openraft::async_runtime::watch::WatchReceiver as _;
use serde::de::DeserializeOwned;
use serde::Serialize;

use openraft::error::RaftError;

use super::network::{SnapshotHeader, SECRET_HEADER};
use crate::api::error::ApiError;
use crate::codec;
use crate::node::AppState;
use crate::raft::{NodeId, Raft, Snapshot, SnapshotData, TypeConfig};
use crate::store::{snapshot, StateMachineStore};

/// Constant-time comparison, so a wrong secret's timing says nothing about the right one.
pub fn secret_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= (given.get(i).copied().unwrap_or(0) ^ b) as usize;
    }
    diff == 0
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if secret_matches(given, state.settings.cluster_secret.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized(
            "Raft endpoints need the cluster secret",
        ))
    }
}

fn decode<T: DeserializeOwned>(state: &AppState, body: &[u8]) -> Result<T, ApiError> {
    codec::decode_limited(body, state.settings.raft_body_limit as u64)
        .map_err(|e| ApiError::invalid(format!("undecodable Raft RPC body: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Response {
    match codec::encode(value) {
        Ok(bytes) => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("encoding Raft reply: {e}")).into_response(),
    }
}

/// Authorizes, decodes the request, runs the Raft call and encodes its result.
async fn serve_rpc<Req, Resp, Fut>(
    state: AppState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    call: impl FnOnce(Raft, Req) -> Fut,
) -> Result<Response, ApiError>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    Fut: std::future::Future<Output = Resp>,
{
    authorize(&state, &headers)?;
    let req = decode(&state, &body?)?;
    Ok(reply(&call(state.raft.clone(), req).await))
}

type RpcBody = Result<Bytes, BytesRejection>;

async fn append(
    State(s): State<AppState>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, ApiError> {
    serve_rpc(s, h, body, |raft, req| async move {
        raft.append_entries(req).await
    })
    .await
}

/// A node rejoining after it lost data does not vote (see [`crate::rejoin`]): it could help
/// elect a leader that lacks entries it once acknowledged. Unreachable, as far as candidates
/// can tell.
fn refuse_vote_while_rejoining(s: &AppState) -> Result<(), ApiError> {
    if crate::rejoin::is_rejoining(s) {
        return Err(ApiError::internal(
            "this node is rejoining after losing data and does not vote until it has caught up",
        )
        .with_status(503));
    }
    Ok(())
}

async fn vote(
    State(s): State<AppState>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, ApiError> {
    authorize(&s, &h)?;
    refuse_vote_while_rejoining(&s)?;
    serve_rpc(s, h, body, |raft, req| async move { raft.vote(req).await }).await
}

async fn pre_vote(
    State(s): State<AppState>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, ApiError> {
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
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let store = StateMachineStore::new(state.sm.clone());
    let (file, path) = store
        .begin_receiving_snapshot()
        .await
        .map_err(|e| ApiError::internal(format!("cannot receive a snapshot: {e}")))?;
    let result = receive_snapshot(&state, file, &path, body).await;
    // The state machine has copied what it installs; the received stream is not needed.
    let _ = tokio::fs::remove_file(&path).await;
    result
}

async fn receive_snapshot(
    state: &AppState,
    mut file: SnapshotData,
    path: &std::path::Path,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    use futures::StreamExt;
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};

    let header_limit = state.settings.raft_body_limit as u64;
    let io = |e: std::io::Error| ApiError::internal(format!("storing a received snapshot: {e}"));
    let mut head = Vec::new();
    let mut header: Option<SnapshotHeader> = None;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(format!("snapshot body: {e}")))?;
        let mut data = &chunk[..];
        if header.is_none() {
            head.extend_from_slice(data);
            data = &[];
            let Some((parsed, end)) =
                SnapshotHeader::parse_frame(&head, header_limit).map_err(ApiError::invalid)?
            else {
                continue;
            };
            header = Some(parsed);
            file.write_all(&head[end..]).await.map_err(io)?;
        }
        file.write_all(data).await.map_err(io)?;
    }
    let Some(header) = header else {
        return Err(ApiError::invalid("snapshot body ended before its header"));
    };
    file.flush().await.map_err(io)?;
    file.rewind().await.map_err(io)?;
    check_snapshot(state, &header)?;
    // Checked whole here, so that a broken transfer is refused to its sender; the state
    // machine checks it again as it stores it, and a failure there would stop this node.
    let path = path.to_path_buf();
    let got = tokio::task::spawn_blocking(move || snapshot::verify(&path))
        .await
        .map_err(|e| ApiError::internal(format!("checking a received snapshot: {e}")))?
        .map_err(|e| ApiError::invalid(format!("received snapshot: {e}")))?;
    if got.last_log_id != header.meta.last_log_id {
        return Err(ApiError::invalid(format!(
            "received snapshot holds up to {:?}, but its header says {:?}",
            got.last_log_id, header.meta.last_log_id
        )));
    }
    let snapshot = Snapshot {
        meta: header.meta,
        snapshot: file,
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
fn check_snapshot(state: &AppState, header: &SnapshotHeader) -> Result<(), ApiError> {
    let Some(last) = &header.meta.last_log_id else {
        return Ok(());
    };
    if last.committed_leader_id() > &header.vote.leader_id {
        return Err(ApiError::invalid(format!(
            "snapshot up to {last} is beyond the sender's vote {}",
            header.vote
        )));
    }
    let local_committed = state.raft.metrics().borrow_watched().local_committed;
    if let Some(committed) = &local_committed {
        if last > committed && last.index <= committed.index {
            return Err(ApiError::invalid(format!(
                "snapshot up to {last} contradicts the committed log up to {committed}"
            )));
        }
    }
    Ok(())
}

/// Starts an election on this node now. A leader that shuts down asks its most up-to-date
/// follower to do this as soon as the followers' leader lease has lapsed, instead of waiting
/// for a randomized election timeout. Starting an election is always safe in Raft.
async fn elect(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    state
        .raft
        .trigger()
        .elect(false)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(serde::Deserialize)]
struct RejoinRequest {
    id: NodeId,
}

/// Authenticates a rejoin or promote request and reads the id of the node it is about.
fn rejoin_request(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<NodeId, ApiError> {
    authorize(state, headers)?;
    let req: RejoinRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("{what} request: {e}")))?;
    Ok(req.id)
}

/// `/raft/rejoin`: a node that lost data asks to be made a learner (leader only).
async fn rejoin(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = rejoin_request(&state, &headers, &body, "rejoin")?;
    match crate::rejoin::demote(&state, id).await {
        Ok(grant) => {
            // Its log went back to nothing: replicate to it from the start, by snapshot.
            let _ = state.raft.trigger().allow_next_revert(&id, true).await;
            Ok(axum::Json(grant).into_response())
        }
        Err(why) => Err(ApiError::internal(why).with_status(503)),
    }
}

/// `/raft/promote`: a rejoining node that caught up asks to vote again (leader only).
async fn promote(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = rejoin_request(&state, &headers, &body, "promote")?;
    crate::rejoin::promote(&state, id)
        .await
        .map_err(|why| ApiError::internal(why).with_status(503))?;
    Ok(axum::Json(serde_json::json!({ "id": id })).into_response())
}

/// Whether this node has Raft state (used by the bootstrap of a new cluster).
async fn status(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let initialized = state
        .raft
        .is_initialized()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
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
    }))
    .into_response())
}

pub fn router(state: AppState) -> Router {
    let limit = state.settings.raft_body_limit;
    Router::new()
        .route("/raft/append", post(append))
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

#[cfg(test)]
mod tests {
    use super::secret_matches;

    #[test]
    fn secret_comparison() {
        assert!(secret_matches(b"abc", b"abc"));
        assert!(!secret_matches(b"abd", b"abc"));
        assert!(!secret_matches(b"ab", b"abc"));
        assert!(!secret_matches(b"abcd", b"abc"));
        assert!(!secret_matches(b"", b"abc"));
    }
}
