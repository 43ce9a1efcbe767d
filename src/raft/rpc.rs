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
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::network::SECRET_HEADER;
use crate::api::error::ApiError;
use crate::codec;
use crate::node::AppState;
use crate::raft::Raft;

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

async fn vote(
    State(s): State<AppState>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, ApiError> {
    serve_rpc(s, h, body, |raft, req| async move { raft.vote(req).await }).await
}

async fn snapshot(
    State(s): State<AppState>,
    h: HeaderMap,
    body: RpcBody,
) -> Result<Response, ApiError> {
    serve_rpc(s, h, body, |raft, req| async move {
        raft.install_snapshot(req).await
    })
    .await
}

/// Starts an election on this node now. A leader that shuts down asks its most up-to-date
/// follower to do this as soon as the followers' leader lease has lapsed, instead of waiting
/// for a randomized election timeout. Starting an election is always safe in Raft.
async fn elect(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    state
        .raft
        .trigger()
        .elect()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Whether this node has Raft state (used by the bootstrap of a new cluster).
async fn status(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let initialized = state
        .raft
        .is_initialized()
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let m = state.raft.metrics().borrow().clone();
    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    // On the leader: how far each node has replicated (in memory since it became leader).
    let matched: std::collections::BTreeMap<String, u64> = m
        .replication
        .iter()
        .flatten()
        .filter_map(|(id, l)| l.map(|l| (id.to_string(), l.index)))
        .collect();
    Ok(axum::Json(serde_json::json!({
        "node_id": state.id,
        "initialized": initialized,
        "voters": voters,
        "matched": matched,
    }))
    .into_response())
}

pub fn router(state: AppState) -> Router {
    let limit = state.settings.raft_body_limit;
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/status", get(status))
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
