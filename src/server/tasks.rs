//! The node's background tasks: the leader's ticks, snapshots by size, the peers' clocks, the
//! log of leader and member changes, and forming a new cluster. Each decision a task takes is a
//! pure function of what it read ([`tick_decision`], [`snapshot_due`], [`clock_peers`],
//! [`bootstraps`]), tested below; the tasks only read, decide and act.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::watch::WatchReceiver as _;
use openraft::vote::RaftLeaderId as _;
use openraft::BasicNode;

use crate::clock::{EntryClock, JumpDetector};
use crate::node::AppState;
use crate::raft::{LogId, NodeId, HEARTBEAT_MS};
use crate::store::{Raft, SmShared};

/// What the background tasks work with: the replica, and the parts of it only the server holds.
#[derive(Clone)]
pub(super) struct Tasks {
    pub node: AppState,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    pub clock: Arc<EntryClock>,
}

/// What the ticker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tick {
    /// Propose a tick now.
    Propose,
    /// Look again after this long (or when something is applied).
    Wait(Duration),
}

/// Longest the ticker sleeps before it looks again.
const TICK_LOOK_AGAIN: Duration = Duration::from_secs(1);

/// The ticker's decision: tick when something is due (`next_due`, in entry-clock ms) and this
/// node may propose (`may_tick`: it leads with a quorum and no transfer is under way);
/// otherwise wait until it is due, a heartbeat when it is due but another node leads (its tick
/// will arrive as an applied entry), and never longer than [`TICK_LOOK_AGAIN`].
pub(super) fn tick_decision(next_due: Option<u64>, now: u64, may_tick: bool) -> Tick {
    let wait = match next_due {
        Some(due) if due <= now && may_tick => return Tick::Propose,
        Some(due) if due <= now => Duration::from_millis(HEARTBEAT_MS),
        Some(due) => Duration::from_millis(due - now),
        None => TICK_LOOK_AGAIN,
    };
    Tick::Wait(wait.min(TICK_LOOK_AGAIN))
}

/// Longest the size policy waits, after an apply, before it looks at the bytes applied.
const SNAPSHOT_LOOK_EVERY: Duration = Duration::from_millis(100);

/// Whether applied command bytes since the last snapshot call for a new one.
pub(super) fn snapshot_due(bytes_since_snapshot: u64, snapshot_bytes: u64) -> bool {
    bytes_since_snapshot >= snapshot_bytes
}

/// Whose clocks the entry clock is set from: the members Raft knows, or, before the cluster
/// has any, the configured peers.
pub(super) fn clock_peers(
    members: &BTreeMap<NodeId, String>,
    configured: &BTreeMap<NodeId, String>,
) -> Vec<(NodeId, String)> {
    let listed = if members.is_empty() {
        configured
    } else {
        members
    };
    listed.iter().map(|(id, url)| (*id, url.clone())).collect()
}

/// Whether node `me` is the one that forms a new cluster of `peers`: the one with the lowest
/// id. (It still does so only if neither it nor any peer that answers has Raft state.)
pub(super) fn bootstraps(me: NodeId, peers: &BTreeMap<NodeId, String>) -> bool {
    peers.keys().next() == Some(&me)
}

/// How often every node reads its peers' wall clocks for the entry clock's reference.
const CLOCK_SAMPLE_EVERY: Duration = Duration::from_secs(1);

impl Tasks {
    /// On the leader: proposes a tick entry when a lease expires or a nack delay ends and
    /// nothing else moved the clock past it, so expired records become available again (and
    /// waiting pulls are answered) without a client write. Time in the state machine stays the
    /// leader's stamped time; this task only decides when to stamp.
    pub async fn ticker(self) {
        let node = &self.node;
        let mut applied = node.applied_changes();
        let mut shutdown = node.shutdown_rx();
        loop {
            applied.borrow_and_update();
            let (next_due, applied_clock) =
                node.read(|view| (view.state.next_due(), view.state.clock_ms));
            self.clock.raise_to(applied_clock);
            let now = self.clock.now_ms();
            let may_tick = node.is_leader() && node.leads_with_quorum() && !node.is_transferring();
            let wait = match tick_decision(next_due, now, may_tick) {
                Tick::Propose => match node.propose_tick().await {
                    // The tick settled everything due up to its time; look again at once.
                    Ok(()) => continue,
                    Err(e) => {
                        tracing::debug!("tick not committed: {e}");
                        Duration::from_millis(HEARTBEAT_MS)
                    }
                },
                Tick::Wait(wait) => wait,
            };
            tokio::select! {
                _ = tokio::time::sleep(wait.min(TICK_LOOK_AGAIN)) => {}
                _ = applied.changed() => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Snapshot policy by size: openraft triggers a snapshot after `snapshot_logs` entries;
    /// this task also triggers one once `snapshot_bytes` of commands were applied since the
    /// last, so a few huge entries cannot grow the log without bound either. It looks after
    /// an apply, at most every [`SNAPSHOT_LOOK_EVERY`]: not once for every entry.
    pub async fn snapshot_by_bytes(self) {
        let mut applied = self.node.applied_changes();
        let mut shutdown = self.node.shutdown_rx();
        let threshold = self.node.settings().snapshot_bytes;
        loop {
            if snapshot_due(self.sm.bytes_since_snapshot(), threshold) {
                if let Err(e) = self.raft.trigger().snapshot().await {
                    tracing::warn!("cannot trigger a snapshot: {e}");
                }
                // Give the build time to start (it resets the count) before looking again.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            tokio::select! {
                _ = applied.changed() => {}
                _ = shutdown.changed() => return,
            }
            tokio::select! {
                _ = tokio::time::sleep(SNAPSHOT_LOOK_EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Reads every other member's wall clock once a second (through `/raft/status`), for the
    /// entry clock's reference, and the command format it applies (so that this node proposes
    /// batch publishes only once every member applies them), and watches this node's own wall clock for jumps: each is
    /// logged and counted in `raftq_clock_jumps_total`; `raftq_clock_offset_ms` is how far this
    /// node's wall clock is from the cluster's.
    pub async fn sample_clocks(self) {
        let node = &self.node;
        let mut shutdown = node.shutdown_rx();
        let mut jumps = JumpDetector::default();
        let jumps_total = metrics::counter!("raftq_clock_jumps_total");
        let offset = metrics::gauge!("raftq_clock_offset_ms");
        loop {
            let peers = clock_peers(&node.status().members, &node.settings().peers);
            self.clock.set_nodes(peers.len());
            let reads = peers
                .iter()
                .filter(|(id, _)| *id != node.id())
                .map(|(id, url)| self.read_clock(*id, url));
            futures::future::join_all(reads).await;
            node.update_batches_accepted();
            if let Some(jump_ms) = jumps.check() {
                jumps_total.increment(1);
                tracing::warn!(
                    jump_ms,
                    "this node's wall clock jumped; the entry clock keeps to the monotonic clock \
                     and the cluster's median wall clock"
                );
            }
            offset.set(self.clock.offset_ms() as f64);
            tokio::select! {
                _ = tokio::time::sleep(CLOCK_SAMPLE_EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// One reading of peer `id`'s wall clock.
    async fn read_clock(&self, id: NodeId, url: &str) {
        let settings = self.node.settings();
        let sent = Instant::now();
        let Some(v) = settings.peer_status(url, Duration::from_millis(500)).await else {
            return;
        };
        if let Some(wall_us) = v["wall_us"].as_u64() {
            self.clock.record_reading(id, wall_us, sent, Instant::now());
        }
        let formats = crate::raft::Formats::from_status(&v);
        self.node.record_formats(id, formats);
    }

    /// Logs, at info, every change of leader or term and of the members as this node sees
    /// them, with the figures an operator needs to follow an election or a membership change.
    /// It watches openraft's server metrics, which change with the vote, the server state, the
    /// leader and the membership only (its full metrics change, and wake every watcher, on
    /// every turn of the Raft core: several times for each entry).
    pub async fn log_changes(self) {
        let node = &self.node;
        let mut rx = self.raft.server_metrics();
        let mut shutdown = node.shutdown_rx();
        let mut seen: Option<(Option<NodeId>, u64)> = None;
        let mut members: Option<(Option<LogId>, Vec<NodeId>, Vec<NodeId>)> = None;
        loop {
            {
                let m = rx.borrow_watched();
                let term = m.vote.leader_id().term();
                let leader = (m.current_leader, term);
                if seen != Some(leader) {
                    let previous = seen.and_then(|(l, _)| l);
                    if m.current_leader.is_some() {
                        metrics::counter!("raftq_leader_changes_total").increment(1);
                    }
                    match m.current_leader {
                        Some(id) => {
                            let data = self.raft.data_metrics();
                            let data = data.borrow_watched();
                            tracing::info!(
                                term,
                                leader = id,
                                previous_leader = previous,
                                this_node_leads = id == node.id(),
                                last_log_index = data.last_log.map_or(0, |l| l.index),
                                last_applied = data.last_applied.map_or(0, |l| l.index),
                                "leader changed"
                            )
                        }
                        None => tracing::info!(term, previous_leader = previous, "no leader known"),
                    }
                    seen = Some(leader);
                }
                // Compared by the log id of the entry that set them: no lists built per change.
                let config_id = *m.membership_config.log_id();
                if members.as_ref().map(|(id, _, _)| *id) != Some(config_id) {
                    let membership = m.membership_config.membership();
                    let voters: Vec<NodeId> = membership.voter_ids().collect();
                    let learners: Vec<NodeId> = membership.learner_ids().collect();
                    let changed = members
                        .as_ref()
                        .is_none_or(|(_, v, l)| *v != voters || *l != learners);
                    if changed && !voters.is_empty() {
                        tracing::info!(voters = ?voters, learners = ?learners, term, "members");
                    }
                    members = Some((config_id, voters, learners));
                }
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Forms a new cluster: when no node has Raft state, the node with the lowest id
    /// initializes it with every peer as a voter. Restarted nodes already have state and skip
    /// this.
    pub async fn bootstrap(self) {
        let node = &self.node;
        let settings = node.settings();
        if !bootstraps(node.id(), &settings.peers) {
            return;
        }
        if !matches!(self.raft.is_initialized().await, Ok(false)) {
            return;
        }
        for (id, url) in settings.peers.iter().filter(|(id, _)| **id != node.id()) {
            if let Some(v) = settings.peer_status(url, Duration::from_secs(1)).await {
                if v["initialized"] == serde_json::Value::Bool(true) {
                    tracing::info!(
                        peer = id,
                        "peer already has cluster state; not initializing"
                    );
                    return;
                }
            }
        }
        let members: BTreeMap<NodeId, BasicNode> = settings
            .peers
            .iter()
            .map(|(id, url)| (*id, BasicNode::new(url)))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(voters = ?settings.peers.keys().collect::<Vec<_>>(), "initialized a new cluster")
            }
            Err(e) => tracing::info!("cluster initialization skipped: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEARTBEAT: Duration = Duration::from_millis(HEARTBEAT_MS);

    #[test]
    fn the_leader_ticks_when_something_is_due() {
        assert_eq!(tick_decision(Some(100), 100, true), Tick::Propose);
        assert_eq!(tick_decision(Some(50), 100, true), Tick::Propose);
        // Due, but another node leads (or this one cannot commit): its tick will come.
        assert_eq!(tick_decision(Some(50), 100, false), Tick::Wait(HEARTBEAT));
    }

    #[test]
    fn the_ticker_waits_until_due_and_never_long() {
        assert_eq!(
            tick_decision(Some(400), 100, true),
            Tick::Wait(Duration::from_millis(300))
        );
        assert_eq!(
            tick_decision(Some(100_000), 100, true),
            Tick::Wait(TICK_LOOK_AGAIN)
        );
        assert_eq!(tick_decision(None, 100, true), Tick::Wait(TICK_LOOK_AGAIN));
        assert_eq!(tick_decision(None, 100, false), Tick::Wait(TICK_LOOK_AGAIN));
    }

    #[test]
    fn a_snapshot_is_due_at_the_threshold() {
        assert!(!snapshot_due(0, 1));
        assert!(!snapshot_due(99, 100));
        assert!(snapshot_due(100, 100));
        assert!(snapshot_due(101, 100));
    }

    fn peers(ids: &[NodeId]) -> BTreeMap<NodeId, String> {
        ids.iter()
            .map(|id| (*id, format!("http://127.0.0.1:700{id}")))
            .collect()
    }

    #[test]
    fn clocks_are_read_from_the_members_or_else_the_configured_peers() {
        let configured = peers(&[1, 2, 3]);
        assert_eq!(clock_peers(&BTreeMap::new(), &configured).len(), 3);
        let members = peers(&[1, 2, 3, 4]);
        let read: Vec<NodeId> = clock_peers(&members, &configured)
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(read, vec![1, 2, 3, 4]);
    }

    #[test]
    fn the_lowest_id_forms_the_cluster() {
        let p = peers(&[2, 3, 5]);
        assert!(bootstraps(2, &p));
        assert!(!bootstraps(3, &p));
        assert!(!bootstraps(1, &p));
        assert!(!bootstraps(1, &BTreeMap::new()));
    }
}
