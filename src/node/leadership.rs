//! Handing leadership over: on request ([`Node::transfer_leadership`]) and when a leader stops
//! (the server's shutdown uses the same steps).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Node, WriteError};
use crate::raft::network::SECRET_HEADER;
use crate::raft::{NodeId, ELECTION_TIMEOUT_MAX_MS};

/// Ends a leadership transfer when dropped: heartbeats on, writes accepted again.
struct TransferGuard<'a>(&'a Node);

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        self.0.raft.runtime_config().heartbeat(true);
        self.0.transferring.store(false, Ordering::SeqCst);
    }
}

impl Node {
    /// Hands leadership to voter `to` (or the most up-to-date follower): writes pause (answered
    /// [`WriteError::NoLeader`], never applied), the followers are let catch up, heartbeats
    /// stop until the followers' lease on this leader lapses, and the target is asked to start
    /// an election. Returns the new leader. Leader only.
    pub async fn transfer_leadership(&self, to: Option<NodeId>) -> Result<NodeId, WriteError> {
        let (target, url) = match to {
            Some(id) if id == self.id => {
                return Err(WriteError::Invalid(format!("node {id} already leads")))
            }
            Some(id) => {
                let status = self.status();
                if !status.voters.contains(&id) {
                    return Err(WriteError::Invalid(format!(
                        "node {id} is not a voter; only a voter can lead"
                    )));
                }
                let url = status.members.get(&id).cloned().unwrap_or_default();
                (id, url)
            }
            None => self
                .most_up_to_date_follower()
                .ok_or_else(|| WriteError::Invalid("there is no other voter to lead".into()))?,
        };
        if self.transferring.swap(true, Ordering::SeqCst) {
            return Err(WriteError::NoLeader);
        }
        // Heartbeats come back and writes resume however this ends, a dropped request
        // (cancelling this future) included.
        let _resume = TransferGuard(self);
        self.transfer_to(target, &url).await
    }

    async fn transfer_to(&self, target: NodeId, url: &str) -> Result<NodeId, WriteError> {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        while self.writes_in_flight() > 0 && start.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.wait_followers_caught_up(deadline).await;
        self.raft.runtime_config().heartbeat(false);
        let paused = Instant::now();
        self.hand_over(target, url, paused, deadline).await;
        let mut new_leader = None;
        let taken_over = self
            .wait_metrics(deadline, |m| {
                new_leader = m.current_leader.filter(|id| *id != self.id);
                new_leader.is_some()
            })
            .await;
        match new_leader {
            Some(id) if taken_over => Ok(id),
            _ => Err(WriteError::Unavailable(format!(
                "node {target} did not take over within 10 s; this node still leads"
            ))),
        }
    }

    /// The follower with the most of the log, to hand leadership to.
    pub(crate) fn most_up_to_date_follower(&self) -> Option<(NodeId, String)> {
        let status = self.status();
        let repl = status.replication.as_ref()?;
        let best = status
            .voters
            .iter()
            .copied()
            .filter(|id| *id != self.id)
            .max_by_key(|id| repl.get(id).copied().flatten())?;
        Some((best, status.members.get(&best)?.clone()))
    }

    /// Hands leadership over: once the followers' leader lease on the stopped (or paused)
    /// leader has lapsed (no vote is granted before that), asks the most up-to-date follower
    /// to start an election at once, rather than leave the cluster to its randomized election
    /// timeouts.
    pub(crate) async fn hand_over(
        &self,
        id: NodeId,
        url: &str,
        raft_stopped: Instant,
        deadline: Instant,
    ) {
        let lease_lapsed = raft_stopped + Duration::from_millis(ELECTION_TIMEOUT_MAX_MS + 50);
        if lease_lapsed >= deadline {
            return;
        }
        tokio::time::sleep_until(lease_lapsed.into()).await;
        let result = self
            .settings
            .peer_http
            .post(format!("{url}/raft/elect"))
            .header(SECRET_HEADER, &self.settings.cluster_secret)
            .timeout(
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_secs(2)),
            )
            .send()
            .await;
        match result {
            Ok(r) if r.status().is_success() => {
                tracing::info!(successor = id, "asked node {id} to take over leadership")
            }
            Ok(r) => {
                tracing::warn!(successor = id, status = %r.status(), "hand-over request refused")
            }
            Err(e) => tracing::warn!(successor = id, "hand-over request failed: {e}"),
        }
    }

    /// On the leader: waits until every voter has replicated the whole log (bounded), so
    /// handing over loses nothing and the next leader can be elected without catching up.
    pub(crate) async fn wait_followers_caught_up(&self, deadline: Instant) {
        let bound = (Instant::now() + Duration::from_secs(3)).min(deadline);
        let caught_up = self
            .wait_metrics(bound, |m| match &m.replication {
                Some(repl) => repl
                    .iter()
                    .all(|(_, matched)| matched.map(|l| l.index) >= m.last_log_index),
                None => true,
            })
            .await;
        if !caught_up {
            tracing::warn!("followers not fully caught up at leader shutdown");
        }
    }
}
