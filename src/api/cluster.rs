//! `GET /v1/cluster`, `/healthz` and `/readyz`.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::Json;
use raftq_client::api::{ClusterMember, ClusterStatus, SnapshotInfo};
use serde_json::{json, Value};

use super::error::ApiError;
use crate::node::AppState;

pub async fn status(State(node): State<AppState>) -> Json<ClusterStatus> {
    let m = node.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: Vec<u64> = membership.voter_ids().collect();
    let leader_url = m
        .current_leader
        .and_then(|id| membership.get_node(&id).map(|n| n.addr.clone()));
    let members = membership
        .nodes()
        .map(|(id, n)| {
            let matched_index = match &m.replication {
                Some(_) if *id == node.id => m.last_log_index,
                Some(repl) => repl.get(id).and_then(|l| l.map(|l| l.index)),
                None => None,
            };
            ClusterMember {
                id: *id,
                url: n.addr.clone(),
                voter: voters.contains(id),
                matched_index,
            }
        })
        .collect();
    Json(ClusterStatus {
        node_id: node.id,
        leader_id: m.current_leader,
        leader_url,
        term: m.current_term,
        commit_index: node.committed.load(Ordering::Relaxed),
        last_applied: m.last_applied.map_or(0, |l| l.index),
        members,
        snapshot: node
            .sm
            .snapshot_info()
            .map(|(index, bytes)| SnapshotInfo { index, bytes }),
    })
}

/// The process is alive and answering.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Ready to serve: a leader is known and this node has applied everything it knows to be
/// committed.
pub async fn readyz(State(node): State<AppState>) -> Result<Json<Value>, ApiError> {
    if node.is_shutting_down() {
        return Err(ApiError::shutting_down(None));
    }
    let m = node.raft.metrics().borrow().clone();
    let Some(leader) = m.current_leader else {
        return Err(ApiError::no_leader());
    };
    if leader == node.id && !node.leads_with_quorum() {
        return Err(ApiError::no_leader());
    }
    let applied = m.last_applied.map_or(0, |l| l.index);
    let committed = node.committed.load(Ordering::Relaxed);
    if applied < committed {
        return Err(ApiError::internal(format!(
            "catching up: applied {applied} of {committed} committed"
        ))
        .with_status(503));
    }
    Ok(Json(
        json!({ "status": "ready", "leader_id": leader, "last_applied": applied }),
    ))
}
