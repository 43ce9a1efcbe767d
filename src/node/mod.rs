//! This node's replica as the layers above it see it: a narrow facade over the proposer, Raft
//! and the applied state.
//!
//! - Writes: [`Node::propose`] proposes one command and waits for its outcome, answering a
//!   [`WriteError`] of its own (never an HTTP error); the cluster changes
//!   ([`Node::add_learner`], [`Node::set_voters`], [`Node::remove_member`],
//!   [`Node::transfer_leadership`]) answer the same way.
//! - Reads: [`Node::read`] runs a closure over the applied view (the lock is held only for
//!   the closure, never across an `.await`); [`Node::read_records`] reads stored records.
//! - Status: [`Node::status`] is what this node knows of Raft (role, term, leader, members,
//!   replication) as a plain struct, instead of Raft's own metrics.
//!
//! Nothing above this layer holds the Raft handle or the state machine store: the HTTP API
//! ([`crate::api`]), the metrics and the rejoin protocol go through here. The node-to-node RPC
//! ([`crate::peer`]) and the server's start-up, background tasks and shutdown
//! ([`crate::server`]) are given the Raft handle by the server that built it.

mod error;
mod leadership;
mod membership;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver as _;
use openraft::ServerState;
use tokio::sync::watch;

pub use error::WriteError;

use crate::clock::EntryClock;
use crate::config::Settings;
use crate::proposer::Proposer;
use crate::raft::{Formats, NodeId, PeerFormats, QUORUM_STALE_MS};
use crate::state::{Command, CommitPoint, Outcome, StoredRecord, TopicMeta};
use crate::store::{Raft, SmShared, SmView};

/// This node's replica. Shared by the handlers as [`AppState`].
pub struct Node {
    id: NodeId,
    settings: Settings,
    raft: Raft,
    sm: Arc<SmShared>,
    proposer: Proposer,
    /// Highest committed index known here (from the log store).
    committed: Arc<AtomicU64>,
    /// The time this node stamps into entries when it leads (see [`crate::clock`]).
    clock: Arc<EntryClock>,
    /// Raised once at the start of shutdown; handlers and long-polls watch it.
    shutdown_tx: watch::Sender<bool>,
    /// Writes between "proposed" and "answered", so shutdown can let them finish.
    writes_in_flight: AtomicUsize,
    /// Set once shutdown stops Raft on purpose, so that is not mistaken for a fatal error.
    stopping_raft: AtomicBool,
    /// Set while this leader hands leadership to another voter: writes are refused (a
    /// definite 503) and heartbeats paused, so the followers' lease on it can lapse.
    transferring: AtomicBool,
    /// What each other node last said it takes (`/raft/status`), shared with the network, and
    /// whether every member applies batch publishes ([`Node::publish_batches_accepted`]).
    formats: Arc<PeerFormats>,
    batches_accepted: AtomicBool,
}

/// Whether every member of `members` but `me` has said (in `formats`) that it applies
/// commands of format 2 (batch publishes; `state::COMMAND_FORMAT`). A member not heard from
/// yet has not.
pub fn all_apply_batches(
    me: NodeId,
    members: impl IntoIterator<Item = NodeId>,
    formats: &BTreeMap<NodeId, Formats>,
) -> bool {
    members
        .into_iter()
        .filter(|id| *id != me)
        .all(|id| formats.get(&id).is_some_and(|f| f.commands >= 2))
}

pub type AppState = Arc<Node>;

/// What a node is made of; the server builds each part at start-up.
pub struct Parts {
    pub settings: Settings,
    /// What the other nodes take, shared with the network.
    pub formats: Arc<PeerFormats>,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    pub proposer: Proposer,
    pub committed: Arc<AtomicU64>,
    pub clock: Arc<EntryClock>,
}

/// This node's Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

impl Role {
    /// Lower-case, as the metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }

    pub const ALL: [Role; 5] = [
        Role::Leader,
        Role::Follower,
        Role::Candidate,
        Role::Learner,
        Role::Shutdown,
    ];
}

/// What this node knows of the cluster, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub id: NodeId,
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    /// The last index in this node's log.
    pub last_log_index: Option<u64>,
    /// Highest index this node knows committed.
    pub committed: u64,
    /// Highest index applied to the state machine.
    pub applied: u64,
    /// The last index removed from this node's log (behind its snapshot).
    pub purged: u64,
    /// Every member, voter or learner, with its base URL.
    pub members: BTreeMap<NodeId, String>,
    pub voters: BTreeSet<NodeId>,
    /// A membership change is half done (a joint configuration).
    pub joint: bool,
    /// The index of the entry that set the current membership.
    pub membership_index: Option<u64>,
    /// On the leader: the last index known replicated to each member.
    pub replication: Option<BTreeMap<NodeId, Option<u64>>>,
}

impl Status {
    /// The leader's base URL, when a leader is known and is a member.
    pub fn leader_url(&self) -> Option<&str> {
        self.members.get(&self.leader?).map(String::as_str)
    }
}

/// Decrements the in-flight write count when a write finishes, however it ends.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Node {
    pub fn new(parts: Parts) -> Node {
        let (shutdown_tx, _) = watch::channel(false);
        Node {
            id: parts.settings.id,
            settings: parts.settings,
            raft: parts.raft,
            sm: parts.sm,
            proposer: parts.proposer,
            committed: parts.committed,
            clock: parts.clock,
            shutdown_tx,
            writes_in_flight: AtomicUsize::new(0),
            stopping_raft: AtomicBool::new(false),
            transferring: AtomicBool::new(false),
            formats: parts.formats,
            batches_accepted: AtomicBool::new(false),
        }
    }

    /// Whether a publish may go into the log as a batch publish: every member has said it
    /// applies them. Until then (a rolling upgrade, or the first second after a start, before
    /// the peers were asked), publishes go as records, which every release applies.
    pub fn publish_batches_accepted(&self) -> bool {
        self.batches_accepted.load(Ordering::Relaxed)
    }

    /// Records what node `id` said it takes (0 for what it did not say, as a release before
    /// the field does).
    pub fn record_formats(&self, id: NodeId, formats: Formats) {
        self.formats.record(id, formats);
    }

    /// Decides again, from the formats recorded, whether every current member applies batch
    /// publishes; logs the change when there is one.
    pub fn update_batches_accepted(&self) {
        let formats = self.formats.all();
        let members = self.status().members.into_keys();
        let accepted = all_apply_batches(self.id, members, &formats);
        if self.batches_accepted.swap(accepted, Ordering::Relaxed) != accepted {
            if accepted {
                tracing::info!(
                    "every member applies batch publishes: records now go into the log as \
                     the record batches clients send"
                );
            } else {
                tracing::info!(
                    "a member does not apply batch publishes (or was not heard from yet): \
                     records go into the log one by one until it does"
                );
            }
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    // ---- reads ----

    /// Runs `f` over the applied state. The view is locked for reading while `f` runs: keep
    /// it short, and copy out what outlives it.
    pub fn read<R>(&self, f: impl FnOnce(&SmView) -> R) -> R {
        f(&self.sm.view())
    }

    /// A receiver that changes after every apply (its value is the last applied index).
    pub fn applied_changes(&self) -> watch::Receiver<u64> {
        self.sm.subscribe_applied()
    }

    /// Stored records of `topic` at `offsets`: at most `max` records and, after the first, at
    /// most `max_bytes` of values.
    pub fn read_records(
        &self,
        topic: &TopicMeta,
        offsets: std::ops::Range<u64>,
        max: u64,
        max_bytes: u64,
    ) -> Result<Vec<(u64, StoredRecord)>, String> {
        self.sm.read_records(topic, offsets, max, max_bytes)
    }

    /// A digest of the whole applied state and the index it is as of (read off the request's
    /// task, as it reads every stored value).
    pub async fn digest(&self) -> Result<(u64, String), String> {
        let sm = self.sm.clone();
        tokio::task::spawn_blocking(move || sm.digest())
            .await
            .map_err(|e| e.to_string())?
    }

    /// The index and size of this node's newest snapshot.
    pub fn snapshot_info(&self) -> Option<(u64, u64)> {
        self.sm.snapshot_info()
    }

    /// The entry clock's time now (see [`crate::clock`]).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Highest committed index known here.
    pub fn committed_index(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// What this node knows of Raft now.
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        Status {
            id: self.id,
            role: match m.state {
                ServerState::Leader => Role::Leader,
                ServerState::Follower => Role::Follower,
                ServerState::Candidate => Role::Candidate,
                ServerState::Learner => Role::Learner,
                ServerState::Shutdown => Role::Shutdown,
            },
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            committed: self.committed_index(),
            applied: m.last_applied.map_or(0, |l| l.index),
            purged: m.purged.map_or(0, |l| l.index),
            members: membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
            voters: membership.voter_ids().collect(),
            joint: membership.get_joint_config().len() > 1,
            membership_index: m.membership_config.log_id().map(|l| l.index),
            replication: m.replication.as_ref().map(|repl| {
                repl.iter()
                    .map(|(id, l)| (*id, l.as_ref().map(|l| l.index)))
                    .collect()
            }),
        }
    }

    /// Waits until `done` holds for Raft's metrics, or `deadline` passes, or Raft stops (no
    /// change can come any more); whether it held.
    async fn wait_metrics(
        &self,
        deadline: std::time::Instant,
        mut done: impl FnMut(&openraft::RaftMetrics<crate::raft::TypeConfig>) -> bool,
    ) -> bool {
        let mut rx = self.raft.metrics();
        loop {
            if done(&rx.borrow_watched()) {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero()
                || !matches!(tokio::time::timeout(left, rx.changed()).await, Ok(Ok(())))
            {
                return false;
            }
        }
    }

    // ---- leadership ----

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    /// A receiver that changes when shutdown begins.
    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    /// The current leader's id and URL, when known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let id = m.current_leader?;
        let url = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, url))
    }

    /// The leader when it is another node: where a client of this node should go.
    pub fn other_leader(&self) -> Option<(NodeId, String)> {
        self.leader().filter(|(id, _)| *id != self.id)
    }

    /// Whether this node believes it leads.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.id)
    }

    /// Whether this node leads and has heard from a quorum recently. A leader cut off from
    /// its followers keeps believing it leads (openraft does not step down on its own); it
    /// must not take writes that can only time out, nor report itself ready.
    pub fn leads_with_quorum(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        if m.current_leader != Some(self.id) {
            return false;
        }
        if m.membership_config.membership().voter_ids().count() <= 1 {
            return true;
        }
        m.last_quorum_acked.as_ref().is_some_and(|acked| {
            openraft::Instant::elapsed(&**acked) <= Duration::from_millis(QUORUM_STALE_MS)
        })
    }

    /// Whether a leadership transfer is under way on this node.
    pub fn is_transferring(&self) -> bool {
        self.transferring.load(Ordering::SeqCst)
    }

    /// Answers early, without doing anything, unless this node leads with a quorum:
    /// [`WriteError::NotLeader`] naming the leader, or [`WriteError::NoLeader`] (also while a
    /// transfer is under way). A definite "not applied".
    pub fn check_leader(&self) -> Result<(), WriteError> {
        match self.leader() {
            Some((id, _))
                if id == self.id && (!self.leads_with_quorum() || self.is_transferring()) =>
            {
                Err(WriteError::NoLeader)
            }
            Some((id, _)) if id == self.id => Ok(()),
            Some((id, url)) => Err(WriteError::NotLeader { id, url }),
            None => Err(WriteError::NoLeader),
        }
    }

    // ---- writes ----

    /// Proposes one command through Raft and waits for its outcome.
    pub async fn propose(&self, cmd: Command) -> Result<(Outcome, CommitPoint), WriteError> {
        if self.is_shutting_down() {
            return Err(WriteError::ShuttingDown {
                leader: self.other_leader(),
            });
        }
        self.check_leader()?;
        self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight(&self.writes_in_flight);
        match self
            .proposer
            .propose(cmd, self.settings.write_timeout)
            .await
        {
            Ok((Ok(outcome), cp)) => Ok((outcome, cp)),
            Ok((Err(refused), _)) => Err(WriteError::Refused(refused)),
            Err(e) => Err(WriteError::from_propose(e, self.id)),
        }
    }

    /// Proposes a tick (moves the state machine's clock, so due leases expire), not counted
    /// as a client write. For the leader's ticker.
    pub(crate) async fn propose_tick(&self) -> Result<(), String> {
        self.proposer
            .propose(Command::Tick, self.settings.write_timeout)
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    }

    /// Builds a snapshot of everything applied so far and waits (at most a minute) until it is
    /// durable; answers its index and size.
    pub async fn snapshot_now(&self) -> Result<(u64, u64), WriteError> {
        let applied = self.read(|view| view.commit_point.index);
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| WriteError::Internal(format!("cannot start a snapshot: {e}")))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((index, bytes)) = self.snapshot_info() {
                if index >= applied {
                    return Ok((index, bytes));
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(WriteError::Unavailable(format!(
                    "the snapshot of index {applied} is not done after 60 s; see the node's log"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // ---- shutdown (the server's) ----

    /// Raises the shutdown flag: new requests are turned away and long-polls answer at once.
    pub(crate) fn begin_shutdown(&self) {
        self.shutdown_tx.send_replace(true);
    }

    /// Writes proposed and not yet answered.
    pub(crate) fn writes_in_flight(&self) -> usize {
        self.writes_in_flight.load(Ordering::SeqCst)
    }

    /// Says that Raft is being stopped on purpose (so its end is not a fatal error).
    pub(crate) fn mark_stopping_raft(&self) {
        self.stopping_raft.store(true, Ordering::SeqCst);
    }

    /// Whether Raft is being stopped on purpose.
    pub(crate) fn stopping_raft(&self) -> bool {
        self.stopping_raft.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
