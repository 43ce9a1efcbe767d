//! Changing the cluster: `POST /v1/cluster/nodes` (add a learner), `POST /v1/cluster/voters`
//! (set the voters), `DELETE /v1/cluster/nodes/{id}` and `POST /v1/cluster/transfer-leader`.
//!
//! Leader only (others answer 307 to the leader). Every change is a Raft membership entry;
//! openraft moves through a joint configuration, so a majority of both the old and the new
//! voters agree on every step. A node id that was removed is never accepted again: the state
//! machine remembers every retired id.

use openraft::async_runtime::watch::WatchReceiver as _;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::Uri;
use axum::Json;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use raftq_client::api::{
    AddNodeRequest, ClusterStatus, ErrorCode, SetVotersRequest, TransferLeaderRequest,
    TransferLeaderResponse,
};

use super::error::ApiError;
use super::openapi::responses::*;
use super::parse_json;
use crate::node::AppState;
use crate::raft::{NodeId, TypeConfig};

/// How long adding a learner waits for it to catch up.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

fn membership_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ApiError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            match (f.leader_id, f.leader_node) {
                (Some(id), Some(n)) => ApiError::not_leader(id, &n.addr, "/v1/cluster"),
                _ => ApiError::no_leader(),
            }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => match c {
            ChangeMembershipError::InProgress(_) => ApiError::invalid(
                "another membership change is still in progress; retry when it is done",
            )
            .with_status(409),
            other => ApiError::invalid(other.to_string()),
        },
        RaftError::APIError(e @ ClientWriteError::LogEntryDiscarded(_)) => {
            ApiError::indeterminate(e.to_string())
        }
        RaftError::APIError(e @ ClientWriteError::PreconditionFailed(_)) => {
            ApiError::internal(e.to_string())
        }
        RaftError::Fatal(f) => ApiError::indeterminate(format!("Raft stopped: {f}")),
    }
}

async fn status(node: &AppState) -> Result<Json<ClusterStatus>, ApiError> {
    super::cluster::status(State(node.clone()), RawQuery(None)).await
}

/// The voters, every member with its URL, and whether a change is half done (a joint
/// configuration, whose voters are the union of the old and the new set).
fn members(node: &AppState) -> (BTreeSet<NodeId>, BTreeMap<NodeId, String>, bool) {
    let m = node.raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    let voters = membership.voter_ids().collect();
    let nodes = membership
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect();
    (voters, nodes, membership.get_joint_config().len() > 1)
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
    node.require_leader(&uri)?;
    if node.sm.view().state.retired_nodes.contains(&req.id) {
        return Err(ApiError::invalid(format!(
            "node id {} was removed from this cluster; ids are never reused, give the new node \
             another id",
            req.id
        )));
    }
    let (_, nodes, _) = members(&node);
    match nodes.get(&req.id) {
        Some(existing) if *existing != url => {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("node {} is already a member, at {existing}", req.id),
            ))
        }
        Some(_) => {}
        None => {
            node.raft
                .add_learner(req.id, BasicNode::new(&url), false)
                .await
                .map_err(membership_error)?;
            tracing::info!(id = req.id, url, "added a learner");
        }
    }
    wait_caught_up(&node, req.id).await?;
    status(&node).await
}

/// Waits until `id` has replicated the leader's log as it was when the wait began.
pub(crate) async fn wait_caught_up(node: &AppState, id: NodeId) -> Result<(), ApiError> {
    let mut rx = node.raft.metrics();
    let target = rx.borrow_watched().last_log_index;
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    loop {
        let matched = rx
            .borrow_watched()
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).copied().flatten())
            .map(|l| l.index);
        if matched >= target {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
            return Err(ApiError::internal(format!(
                "node {id} is a learner now but has not caught up after {} s (at {matched:?} of \
                 {target:?}); check that it runs and is reachable, then add it again to wait \
                 more",
                CATCH_UP_TIMEOUT.as_secs()
            ))
            .with_status(504));
        }
    }
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
    node.require_leader(&uri)?;
    let (voters, nodes, joint) = members(&node);
    if let Some(unknown) = ids.iter().find(|id| !nodes.contains_key(id)) {
        return Err(ApiError::invalid(format!(
            "node {unknown} is not a member; add it first with POST /v1/cluster/nodes"
        )));
    }
    // Equal voters need no change, unless a change was left half done: then this one
    // finishes it.
    if ids != voters || joint {
        // New voters must have the log first, or the new configuration could not commit.
        for id in ids.difference(&voters) {
            wait_caught_up(&node, *id).await?;
        }
        // Voters that leave stay as learners; DELETE removes them.
        node.raft
            .change_membership(ids.clone(), true)
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
    node.require_leader(&uri)?;
    let (voters, nodes, _) = members(&node);
    if !nodes.contains_key(&id) {
        return Err(ApiError::invalid(format!("node {id} is not a member")).with_status(404));
    }
    if voters.contains(&id) {
        let rest: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
        if rest.is_empty() {
            return Err(ApiError::invalid(format!(
                "node {id} is the last voter; add another voter first"
            )));
        }
        node.raft
            .change_membership(rest, false)
            .await
            .map_err(membership_error)?;
    } else {
        node.raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await
            .map_err(membership_error)?;
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
    node.require_leader(&uri)?;
    let leader_id = node.transfer_leadership(req.to).await?;
    Ok(Json(TransferLeaderResponse { leader_id }))
}
