//! `GET /v1/cluster`, `/healthz` and `/readyz`.

use axum::extract::{RawQuery, State};
use axum::http::Uri;
use axum::Json;
use raftq_client::api::{ClusterMember, ClusterStatus, SnapshotInfo, SnapshotTaken, StateDigest};
use serde::Serialize;

use super::error::ApiError;
use super::openapi::responses::*;
use crate::node::AppState;

/// The query of `GET /v1/cluster`, as [`status`] parses it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // described, not built: `status` parses the raw query
pub struct StatusQuery {
    /// Also digest this node's whole state machine (`state_digest`), to compare nodes.
    digest: Option<bool>,
}

/// Cluster status
///
/// This node's view: the leader, the term, the log's progress, the members and the latest
/// snapshot.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    operation_id = "cluster_status",
    tag = "cluster",
    params(StatusQuery),
    responses(
        (status = 200, description = "This node's view of the cluster", body = ClusterStatus),
        InvalidArgument, Unauthorized, Overloaded, Internal, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn status(
    State(node): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<ClusterStatus>, ApiError> {
    let mut want_digest = false;
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match (k.as_ref(), v.as_ref()) {
            ("digest", "true") => want_digest = true,
            ("digest", "false") => {}
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {k}={v}; only digest=true|false is known"
                )))
            }
        }
    }
    let state_digest = if want_digest {
        let (index, digest) = node.digest().await.map_err(ApiError::internal)?;
        Some(StateDigest { index, digest })
    } else {
        None
    };
    let status = node.status();
    let members = status
        .members
        .iter()
        .map(|(id, url)| {
            let matched_index = match &status.replication {
                Some(_) if *id == status.id => status.last_log_index,
                Some(repl) => repl.get(id).copied().flatten(),
                None => None,
            };
            ClusterMember {
                id: *id,
                url: url.clone(),
                voter: status.voters.contains(id),
                matched_index,
            }
        })
        .collect();
    Ok(Json(ClusterStatus {
        node_id: status.id,
        leader_id: status.leader,
        leader_url: status.leader_url().map(str::to_string),
        term: status.term,
        commit_index: status.committed,
        last_applied: status.applied,
        members,
        snapshot: node
            .snapshot_info()
            .map(|(index, bytes)| SnapshotInfo { index, bytes }),
        state_digest,
    }))
}

/// Build a snapshot now
///
/// On the answering node (snapshots are per node; this is not redirected to the leader), of
/// everything it has applied; answers once it is durable and the log before it may be purged.
#[utoipa::path(
    post,
    path = "/v1/cluster/snapshot",
    operation_id = "snapshot",
    tag = "cluster",
    responses(
        (status = 200, description = "The snapshot this node now has", body = SnapshotTaken),
        Unauthorized, Forbidden, Overloaded, Internal, UnavailableOrUnfinished,
    ),
    security(("bearer" = [])),
)]
pub async fn snapshot(
    State(node): State<AppState>,
    uri: Uri,
) -> Result<Json<SnapshotTaken>, ApiError> {
    let (index, bytes) = node
        .snapshot_now()
        .await
        .map_err(|e| super::write_error(e, &uri))?;
    Ok(Json(SnapshotTaken {
        node_id: node.id(),
        snapshot: SnapshotInfo { index, bytes },
    }))
}

/// Answer of `GET /healthz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    pub status: String,
}

/// Answer of `GET /readyz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Always `ready`.
    #[schema(example = "ready")]
    pub status: String,
    /// The leader this node follows (or itself).
    pub leader_id: u64,
    /// The last log index this node applied.
    pub last_applied: u64,
}

/// Liveness probe
///
/// The process is alive and answering. Needs no token.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "cluster",
    responses((status = 200, description = "Alive", body = Health)),
)]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness probe
///
/// Ready to serve: a leader is known and this node has applied everything it knows to be
/// committed. Needs no token.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "cluster",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        UnavailableOrUnfinished,
    ),
)]
pub async fn readyz(State(node): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    if node.is_shutting_down() {
        return Err(ApiError::shutting_down(None));
    }
    let status = node.status();
    let Some(leader) = status.leader else {
        return Err(ApiError::no_leader());
    };
    if leader == node.id() && !node.leads_with_quorum() {
        return Err(ApiError::no_leader());
    }
    let applied = status.applied;
    let committed = status.committed;
    if applied < committed {
        return Err(ApiError::internal(format!(
            "catching up: applied {applied} of {committed} committed"
        ))
        .with_status(503));
    }
    Ok(Json(Readiness {
        status: "ready".into(),
        leader_id: leader,
        last_applied: applied,
    }))
}
