//! Waiting, always with a bound: for a condition, for an agreed leader, for a node's health,
//! for every node to apply the same index.

use std::future::Future;
use std::process::Child;
use std::time::{Duration, Instant};

use raftq_client::api::{ClusterStatus, SnapshotTaken};
use reqwest::StatusCode;

use super::{lock, Cluster, POLL};

impl Cluster {
    /// Polls `check` until it returns `Ok`, at most `timeout`; then fails with the last error.
    pub async fn wait_for<F, Fut>(&self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check().await {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "timed out after {timeout:?} waiting for {what}; last state: {last}"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A node the harness started that exited on its own, if any (it is marked not running).
    fn unexpected_exit(&self) -> Option<String> {
        let mut nodes = lock(&self.nodes);
        for (id, node) in nodes.iter_mut() {
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    node.child = None;
                    return Some(format!("node {id} exited unexpectedly with {status}"));
                }
            }
        }
        None
    }

    /// `GET /readyz` on node `id`: the answer, whatever its status; `Err` when the request
    /// fails.
    pub async fn get_readyz(&self, id: u64) -> Result<reqwest::Response, String> {
        self.http
            .get(format!("{}/readyz", self.url(id)))
            .send()
            .await
            .map_err(|e| format!("GET /readyz on node {id}: {e}"))
    }

    /// `GET /v1/cluster` on node `id`.
    pub async fn status(&self, id: u64) -> Result<ClusterStatus, String> {
        self.try_get_json(id, "/v1/cluster", Duration::from_secs(3))
            .await
    }

    /// `GET /raft/status` on node `id`, with the cluster secret: its JSON answer.
    pub async fn raft_status(&self, id: u64) -> Result<serde_json::Value, String> {
        let what = format!("GET /raft/status on node {id}");
        self.http
            .get(format!("{}/raft/status", self.url(id)))
            .header(super::SECRET_HEADER, super::SECRET)
            .timeout(Duration::from_secs(3))
            .send()
            .await
            .map_err(|e| format!("{what}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("{what}: undecodable: {e}"))
    }

    /// Waits until node `id` has purged its log beyond entry `above`. A leader purges behind
    /// its snapshot, but not while a replication request still covers the entries (the
    /// request to a stopped follower is retried): this waits for it.
    pub async fn wait_purged(&self, id: u64, above: u64) {
        self.wait_for(
            &format!("node {id} to purge its log beyond entry {above}"),
            Duration::from_secs(60),
            || async {
                match self.raft_status(id).await?["purged"].as_u64() {
                    Some(purged) if purged > above => Ok(()),
                    other => Err(format!("purged up to {other:?}")),
                }
            },
        )
        .await;
    }

    /// Brings the stopped follower `follower` back by a snapshot only: the leader takes one
    /// covering what it applied and purges its log behind it, then the follower is started
    /// again and this waits until it holds a snapshot at least as new. The snapshot taken.
    pub async fn restart_by_snapshot(&self, follower: u64) -> SnapshotTaken {
        let leader = self.leader_id().await;
        let resp = self
            .call(reqwest::Method::POST, leader, "/v1/cluster/snapshot")
            .await;
        let taken: SnapshotTaken = self.json_of(resp, 200, "POST /v1/cluster/snapshot").await;
        self.wait_purged(leader, 20).await;
        self.restart(follower).await;
        self.wait_for(
            &format!("node {follower} to install the snapshot"),
            Duration::from_secs(60),
            || async {
                let status = self.status(follower).await?;
                match status.snapshot {
                    Some(snap) if snap.index >= taken.snapshot.index => Ok(()),
                    other => Err(format!(
                        "its snapshot is {other:?}, applied {}",
                        status.last_applied
                    )),
                }
            },
        )
        .await;
        taken
    }

    /// The leader every running node names, in the same term; an error says who disagrees.
    pub async fn agreed_leader(&self) -> Result<u64, String> {
        let ids = self.running_ids();
        if ids.is_empty() {
            return Err("no node is running".into());
        }
        let mut seen = Vec::with_capacity(ids.len());
        for id in &ids {
            seen.push(self.status(*id).await?);
        }
        let views: Vec<String> = seen
            .iter()
            .map(|s| {
                format!(
                    "node {} sees leader {:?} in term {}",
                    s.node_id, s.leader_id, s.term
                )
            })
            .collect();
        let first = &seen[0];
        let leader = first.leader_id.ok_or_else(|| views.join("; "))?;
        if seen
            .iter()
            .any(|s| s.leader_id != Some(leader) || s.term != first.term)
        {
            return Err(views.join("; "));
        }
        if !ids.contains(&leader) {
            return Err(format!(
                "the named leader is not running: {}",
                views.join("; ")
            ));
        }
        Ok(leader)
    }

    pub(super) async fn poll_leader(&self, timeout: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(exit) = self.unexpected_exit() {
                return Err(exit);
            }
            let last = match self.agreed_leader().await {
                Ok(id) => return Ok(id),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!("no agreed leader after {timeout:?}: {last}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every running node has applied the same index, then returns each node's
    /// state digest (`GET /v1/cluster?digest=true`) at that index.
    pub async fn digests(&self) -> Vec<(u64, String)> {
        let mut last = String::new();
        for _ in 0..100 {
            let mut seen = Vec::new();
            for id in self.running_ids() {
                let s: ClusterStatus = self.get_json(id, "/v1/cluster?digest=true").await;
                let d = s
                    .state_digest
                    .unwrap_or_else(|| self.fail("no state_digest in the answer"));
                seen.push((id, d.index, d.digest));
            }
            if seen.iter().all(|(_, index, _)| *index == seen[0].1) {
                return seen.into_iter().map(|(_, i, d)| (i, d)).collect();
            }
            last = format!("{seen:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.fail(&format!("the nodes never applied the same index: {last}"))
    }

    /// Waits until every running node agrees on a running leader; returns its id.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        match self.poll_leader(timeout).await {
            Ok(id) => id,
            Err(e) => self.fail(&format!("waiting for a leader: {e}")),
        }
    }

    /// The current leader (waits up to 30 s for one).
    pub async fn leader_id(&self) -> u64 {
        self.wait_leader(Duration::from_secs(30)).await
    }

    /// A running node that is not the current leader.
    pub async fn follower_id(&self) -> u64 {
        let leader = self.leader_id().await;
        match self.running_ids().into_iter().find(|id| *id != leader) {
            Some(id) => id,
            None => self.fail("no running follower"),
        }
    }

    /// Waits until node `id` answers `GET /healthz` with 200.
    pub(super) async fn wait_healthy(&self, id: u64, deadline: Instant) -> Result<(), String> {
        loop {
            {
                let mut nodes = lock(&self.nodes);
                let node = nodes.get_mut(&id).expect("node exists");
                match node.child.as_mut().map(Child::try_wait) {
                    None => return Err(format!("node {id} is not running")),
                    Some(Ok(Some(status))) => {
                        node.child = None;
                        return Err(format!("node {id} exited with {status}"));
                    }
                    Some(_) => {}
                }
            }
            let healthy = self
                .http
                .get(format!("{}/healthz", self.url(id)))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            if healthy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("node {id} did not answer /healthz in time"));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
