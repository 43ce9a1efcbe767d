//! A voter that lost data it had acknowledged comes back by itself, under its own id, without a
//! vote, and votes again only once it holds the log again.
//!
//! Why not just start it: a node that lost log entries or its vote may vote for a candidate
//! that lacks entries it helped commit, and may accept entries from a deposed leader of a term
//! it had already left; either can lose acknowledged writes. Why not refuse: a node whose disk
//! was replaced (a Kubernetes pod on a new volume) or damaged should not need an operator to
//! come back.
//!
//! The protocol (node side in [`rejoin`], leader side in [`demote`] and [`promote`]):
//! 1. At start-up the node finds its store damaged or lost (`server::store_check`): it sets the
//!    damaged store aside (`DataDir::set_aside`, kept for inspection), starts from an empty one,
//!    and records that it is rejoining (the `REJOINING` file), before anything else.
//! 2. Before it starts Raft, it asks the current leader to make it a learner (`/raft/rejoin`):
//!    the leader commits the membership change with a majority of the *other* voters, and
//!    answers its term. The node saves a vote of that term for that leader as its own, durably:
//!    from then on it refuses every leader of an older term, and the configuration in which it
//!    is a learner is committed, so no leader it follows counts its acknowledgements.
//! 3. It starts Raft as a learner: it never campaigns, and it refuses vote requests (the RPC
//!    layer answers them 503 while the file exists). It catches up from the leader, by snapshot
//!    when the log is purged.
//! 4. Once it has applied the membership entry that made it a learner (so it holds everything
//!    committed before it), it asks the leader to make it a voter again (`/raft/promote`); the
//!    leader waits until it has replicated the leader's whole log. When the node sees itself a
//!    voter in its applied membership, it removes the `REJOINING` file.
//!
//! A crash anywhere in between leaves the file, and the next start continues the protocol.

use std::path::Path;
use std::time::Duration;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::node::{AppState, Node};
use crate::raft::network::SECRET_HEADER;
use crate::raft::NodeId;

/// The file that says this node is rejoining, in its data directory.
pub const MARKER: &str = "REJOINING";

/// What the `REJOINING` file records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// Why the node's store was set aside.
    pub reason: String,
    /// Where the damaged store was moved (empty when there was nothing to keep).
    pub kept: String,
    /// The leader's answer once it made this node a learner.
    pub grant: Option<Grant>,
}

/// The leader's answer to a rejoin: this node is a learner as of `index`, in `term` led by
/// `leader_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub term: u64,
    pub leader_id: u64,
    /// The log index of the membership in which this node is a learner.
    pub index: u64,
}

/// Reads the marker of data directory `dir`, if the node is rejoining.
pub fn pending(dir: &Path) -> anyhow::Result<Option<Marker>> {
    match std::fs::read(dir.join(MARKER)) {
        Ok(bytes) => {
            let marker = serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{} is unreadable ({e}); it says this node is rejoining the cluster after \
                     losing data: leave it, and remove the node's data directory's other \
                     contents to start the rejoin over",
                    dir.join(MARKER).display()
                )
            })?;
            Ok(Some(marker))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes the marker durably.
pub fn record(dir: &Path, marker: &Marker) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(marker).map_err(std::io::Error::other)?;
    crate::store::datadir::write_durably(dir, MARKER, &bytes)
}

/// Removes the marker durably: the node is a voter again.
pub fn finish(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(MARKER)) {
        Ok(()) => crate::store::datadir::sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// How often a rejoining node asks its peers again.
const RETRY: Duration = Duration::from_secs(1);

/// Node side, before Raft starts: asks every peer in turn until the leader makes this node a
/// learner, and returns its answer. Waits as long as it takes (no leader, a change in
/// progress), saying so in the log every few seconds.
pub async fn demote_self(settings: &Settings) -> Grant {
    let mut attempt = 0u64;
    loop {
        for (peer, url) in settings.peers.iter().filter(|(id, _)| **id != settings.id) {
            let answer = settings
                .peer_http
                .post(format!("{url}/raft/rejoin"))
                .header(SECRET_HEADER, &settings.cluster_secret)
                .json(&serde_json::json!({ "id": settings.id }))
                .timeout(Duration::from_secs(15))
                .send()
                .await;
            match answer {
                Ok(resp) if resp.status().is_success() => match resp.json::<Grant>().await {
                    Ok(grant) => {
                        tracing::info!(
                            leader = grant.leader_id,
                            term = grant.term,
                            index = grant.index,
                            "the leader made this node a learner; catching up"
                        );
                        return grant;
                    }
                    Err(e) => tracing::warn!(peer, "unreadable answer to a rejoin: {e}"),
                },
                Ok(resp) => tracing::debug!(peer, status = %resp.status(), "rejoin not taken"),
                Err(e) => tracing::debug!(peer, "rejoin request failed: {e}"),
            }
        }
        if attempt.is_multiple_of(5) {
            tracing::warn!(
                "rejoining: waiting for a leader to make this node a learner (it lost data it \
                 had acknowledged, so it must not vote until it holds the log again)"
            );
        }
        attempt += 1;
        tokio::time::sleep(RETRY).await;
    }
}

/// Node side, once Raft runs: waits until the node has applied the membership that made it a
/// learner, asks the leader to make it a voter again until it is one in its applied
/// membership, then removes the marker. Ends early on shutdown.
pub async fn finish_when_caught_up(node: AppState, grant: Grant) {
    let mut applied = node.applied_changes();
    let mut shutdown = node.shutdown_rx();
    loop {
        let (applied_index, voter) = node.read(|view| {
            let voter = view
                .membership
                .membership()
                .voter_ids()
                .any(|id| id == node.id());
            (view.last_applied.map_or(0, |l| l.index), voter)
        });
        if applied_index >= grant.index && voter {
            match finish(&node.settings().data) {
                Ok(()) => tracing::info!("rejoined: a voter again"),
                Err(e) => tracing::error!("cannot remove the rejoin marker: {e}"),
            }
            return;
        }
        if applied_index >= grant.index {
            if let Some((leader, url)) = node.other_leader() {
                let settings = node.settings();
                let answer = settings
                    .peer_http
                    .post(format!("{url}/raft/promote"))
                    .header(SECRET_HEADER, &settings.cluster_secret)
                    .json(&serde_json::json!({ "id": node.id() }))
                    .timeout(Duration::from_secs(70))
                    .send()
                    .await;
                match answer {
                    Ok(r) if r.status().is_success() => {
                        tracing::info!(leader, "the leader made this node a voter again")
                    }
                    Ok(r) => tracing::debug!(leader, status = %r.status(), "promotion not taken"),
                    Err(e) => tracing::debug!(leader, "promotion request failed: {e}"),
                }
            }
        }
        tokio::select! {
            _ = applied.changed() => {}
            _ = tokio::time::sleep(RETRY) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Whether this node is rejoining: it then refuses to vote.
pub fn is_rejoining(node: &Node) -> bool {
    node.settings().data.join(MARKER).exists()
}

/// Leader side: makes `id` a learner (if it is a voter) and answers the grant. Only a leader
/// that has heard from a quorum takes it; the change commits with a majority of the other
/// voters before the answer.
pub async fn demote(node: &Node, id: NodeId) -> Result<Grant, String> {
    if !node.leads_with_quorum() || node.is_transferring() {
        return Err("not the leader".into());
    }
    let status = node.status();
    if !status.members.contains_key(&id) {
        return Err(format!("node {id} is not a member"));
    }
    if id == node.id() {
        return Err("a leader does not rejoin through itself".into());
    }
    let index = if status.voters.contains(&id) {
        let rest: BTreeSet<NodeId> = status.voters.iter().copied().filter(|v| *v != id).collect();
        if rest.is_empty() {
            return Err("it is the only voter".into());
        }
        let index = node
            .set_voters(rest.clone(), true)
            .await
            .map_err(|e| format!("cannot make node {id} a learner: {e}"))?;
        tracing::warn!(
            node = id,
            voters = ?rest,
            "node {id} lost data it had acknowledged: it is a learner until it has caught up"
        );
        index
    } else {
        node.status().membership_index.unwrap_or(0)
    };
    let term = node.status().term;
    Ok(Grant {
        term,
        leader_id: node.id(),
        index,
    })
}

/// Leader side: makes learner `id` a voter again once it has replicated this leader's log.
pub async fn promote(node: &Node, id: NodeId) -> Result<(), String> {
    if !node.leads_with_quorum() || node.is_transferring() {
        return Err("not the leader".into());
    }
    let status = node.status();
    if !status.members.contains_key(&id) {
        return Err(format!("node {id} is not a member"));
    }
    if status.voters.contains(&id) {
        return Ok(());
    }
    node.wait_caught_up(id).await.map_err(|e| e.to_string())?;
    let mut all = status.voters;
    all.insert(id);
    node.set_voters(all.clone(), true)
        .await
        .map_err(|e| format!("cannot make node {id} a voter: {e}"))?;
    tracing::info!(node = id, voters = ?all, "node {id} caught up and is a voter again");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `REJOINING` file as today's code writes it: it reads back, and writes again byte for
    /// byte, so a node that crashed mid-rejoin under an older version finishes under a newer one.
    #[test]
    fn the_marker_file_reads_back_and_writes_again_byte_for_byte() {
        const WRITTEN: &str = r#"{
  "reason": "a table file fails its checks: Corruption: block checksum mismatch",
  "kept": "/data/damaged-1764480000",
  "grant": {
    "term": 7,
    "leader_id": 2,
    "index": 42
  }
}"#;
        let marker: Marker = serde_json::from_str(WRITTEN).expect("the marker reads");
        assert_eq!(
            marker,
            Marker {
                reason: "a table file fails its checks: Corruption: block checksum mismatch".into(),
                kept: "/data/damaged-1764480000".into(),
                grant: Some(Grant {
                    term: 7,
                    leader_id: 2,
                    index: 42,
                }),
            }
        );
        let dir = tempfile::tempdir().expect("tempdir");
        record(dir.path(), &marker).expect("record");
        let again = std::fs::read_to_string(dir.path().join(MARKER)).expect("read");
        assert_eq!(again, WRITTEN, "the marker's encoding changed");
        assert_eq!(pending(dir.path()).expect("pending"), Some(marker));
        finish(dir.path()).expect("finish");
        assert_eq!(pending(dir.path()).expect("pending"), None);
    }
}
