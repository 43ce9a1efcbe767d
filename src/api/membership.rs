//! Changing the cluster: `POST /v1/cluster/nodes` (add a learner), `POST /v1/cluster/voters`
//! (set the voters), `DELETE /v1/cluster/nodes/{id}` and `POST /v1/cluster/transfer-leader`.
//!
//! Leader only (others answer 307 to the leader). Every change is a Raft membership entry;
//! openraft moves through a joint configuration, so a majority of both the old and the new
//! voters agree on every step. A node id that was removed is never accepted again: the state
//! machine remembers every retired id.

use std::collections::BTreeSet;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::Uri;
use axum::Json;
use raftq_client::api::{
    AddNodeRequest, ClusterStatus, ErrorCode, SetVotersRequest, TransferLeaderRequest,
    TransferLeaderResponse,
};

use super::error::ApiError;
use super::openapi::responses::*;
use super::parse_json;
use crate::node::{AppState, WriteError};
use crate::raft::NodeId;

/// A cluster change's error. A redirect to the leader points at `/v1/cluster` (the leader's
/// view of the cluster), not at the change: a change is never replayed on another node by a
/// redirect alone.
fn membership_error(e: WriteError) -> ApiError {
    match e {
        WriteError::NotLeader { id, url } => ApiError::not_leader(id, &url, "/v1/cluster"),
        other => super::write_error(other, &Uri::from_static("/v1/cluster")),
    }
}

async fn status(node: &AppState) -> Result<Json<ClusterStatus>, ApiError> {
    super::cluster::status(State(node.clone()), RawQuery(None)).await
}

fn check_url(url: &str) -> Result<String, ApiError> {
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
        return Err(ApiError::invalid(format!(
            "url {url:?} is not a base URL like http://HOST:PORT"
        )));
    }
    Ok(url.to_string())
}

/// Add a node as a learner
///
/// Answers once the learner has caught up with the leader's log; then make it a voter with
/// `POST /v1/cluster/voters`. Leader only.
#[utoipa::path(
    post,
    path = "/v1/cluster/nodes",
    operation_id = "add_node",
    tag = "cluster",
    request_body = AddNodeRequest,
    responses(
        (status = 200, description = "The cluster with the new learner", body = ClusterStatus),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, MembershipConflict, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn add_node(
    State(node): State<AppState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ClusterStatus>, ApiError> {
    let req: AddNodeRequest = parse_json(&body?)?;
    let url = check_url(&req.url)?;
    if req.id == 0 {
        return Err(ApiError::invalid("node id 0 is reserved; ids start at 1"));
    }
    super::require_leader(&node, &uri)?;
    if node.read(|view| view.state.retired_nodes.contains(&req.id)) {
        return Err(ApiError::invalid(format!(
            "node id {} was removed from this cluster; ids are never reused, give the new node \
             another id",
            req.id
        )));
    }
    match node.status().members.get(&req.id) {
        Some(existing) if *existing != url => {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("node {} is already a member, at {existing}", req.id),
            ))
        }
        Some(_) => {}
        None => {
            node.add_learner(req.id, &url)
                .await
                .map_err(membership_error)?;
            tracing::info!(id = req.id, url, "added a learner");
        }
    }
    node.wait_caught_up(req.id)
        .await
        .map_err(membership_error)?;
    status(&node).await
}

/// Set the voters
///
/// The complete set of voters from now on, through a joint configuration; voters that leave
/// stay as learners. Leader only.
#[utoipa::path(
    post,
    path = "/v1/cluster/voters",
    operation_id = "set_voters",
    tag = "cluster",
    request_body = SetVotersRequest,
    responses(
        (status = 200, description = "The cluster with its new voters", body = ClusterStatus),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, MembershipConflict, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn set_voters(
    State(node): State<AppState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ClusterStatus>, ApiError> {
    let req: SetVotersRequest = parse_json(&body?)?;
    let ids: BTreeSet<NodeId> = req.ids.iter().copied().collect();
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "ids is empty: a cluster needs at least one voter",
        ));
    }
    if ids.len() != req.ids.len() {
        return Err(ApiError::invalid("ids lists a node twice"));
    }
    super::require_leader(&node, &uri)?;
    let now = node.status();
    let (voters, joint) = (now.voters, now.joint);
    if let Some(unknown) = ids.iter().find(|id| !now.members.contains_key(id)) {
        return Err(ApiError::invalid(format!(
            "node {unknown} is not a member; add it first with POST /v1/cluster/nodes"
        )));
    }
    // Equal voters need no change, unless a change was left half done: then this one
    // finishes it.
    if ids != voters || joint {
        // New voters must have the log first, or the new configuration could not commit.
        for id in ids.difference(&voters) {
            node.wait_caught_up(*id).await.map_err(membership_error)?;
        }
        // Voters that leave stay as learners; DELETE removes them.
        node.set_voters(ids.clone(), true)
            .await
            .map_err(membership_error)?;
        tracing::info!(voters = ?ids, "voters changed");
    }
    status(&node).await
}

/// Remove a node
///
/// Its id is never accepted again. Leader only.
#[utoipa::path(
    delete,
    path = "/v1/cluster/nodes/{id}",
    operation_id = "remove_node",
    tag = "cluster",
    params(("id" = u64, Path, description = "The node's id", minimum = 1)),
    responses(
        (status = 200, description = "The cluster without the node", body = ClusterStatus),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, MemberNotFound, MembershipConflict,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn remove_node(
    State(node): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Result<Json<ClusterStatus>, ApiError> {
    // A segment that does not decode (not UTF-8) is a problem like any other bad id, not
    // axum's plain-text rejection.
    let Path(id) =
        path.map_err(|e| ApiError::invalid(format!("invalid node id in path: {}", e.body_text())))?;
    let id: NodeId = id
        .parse()
        .map_err(|_| ApiError::invalid(format!("node id {id:?} is not a positive integer")))?;
    super::require_leader(&node, &uri)?;
    let now = node.status();
    let voters = now.voters;
    if !now.members.contains_key(&id) {
        return Err(ApiError::invalid(format!("node {id} is not a member")).with_status(404));
    }
    if voters.contains(&id) {
        let rest: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
        if rest.is_empty() {
            return Err(ApiError::invalid(format!(
                "node {id} is the last voter; add another voter first"
            )));
        }
        node.set_voters(rest, false)
            .await
            .map_err(membership_error)?;
    } else {
        node.remove_learner(id).await.map_err(membership_error)?;
    }
    tracing::info!(id, "removed a node");
    status(&node).await
}

/// Transfer leadership
///
/// To voter `to`, or (omitted) to the most up-to-date follower. Writes pause meanwhile
/// (answered 503 `no_leader`, never applied). Leader only.
#[utoipa::path(
    post,
    path = "/v1/cluster/transfer-leader",
    operation_id = "transfer_leader",
    tag = "cluster",
    request_body(content = Option<TransferLeaderRequest>, content_type = "application/json",
        description = "Optional, and so is the body"),
    responses(
        (status = 200, description = "The new leader", body = TransferLeaderResponse),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, PayloadTooLarge, Overloaded,
        UnavailableOrUnfinished,
    ),
    security(("bearer" = [])),
)]
pub async fn transfer_leader(
    State(node): State<AppState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TransferLeaderResponse>, ApiError> {
    let body = body?;
    let req: TransferLeaderRequest = if body.iter().all(u8::is_ascii_whitespace) {
        TransferLeaderRequest::default()
    } else {
        parse_json(&body)?
    };
    super::require_leader(&node, &uri)?;
    let leader_id = node
        .transfer_leadership(req.to)
        .await
        .map_err(|e| super::write_error(e, &uri))?;
    Ok(Json(TransferLeaderResponse { leader_id }))
}
