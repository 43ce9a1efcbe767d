//! Group commit: many concurrent client commands become one Raft entry.
//!
//! Handlers submit commands to a bounded queue. One task takes whatever has queued up (up to
//! a command and a byte budget), stamps it with the leader's clock and proposes it as one
//! entry, keeping a few entries in flight so replication and fsync overlap. While proposals
//! are in flight new commands accumulate, so batches grow with load on their own (an
//! adaptive window with no timer). Entries are handed to Raft in submission order.
//!
//! Idempotent batches of one producer are put back in sequence order on the way in: the SDK
//! keeps several batches of a producer in flight on separate connections, and a batch that
//! overtakes its predecessor would be refused (`sequence_gap`) and have to be sent again. A
//! batch whose predecessor this node has not proposed yet waits for it, at most
//! [`HOLD_MAX`]; then it goes anyway, and the state machine decides, as always. The order is
//! a leader-local hint: nothing depends on it for correctness.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use openraft::error::ClientWriteError;
use openraft::impls::ProgressResponder;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::clock::EntryClock;
use crate::raft::NodeId;
use crate::state::{Batch, Command, CommandResult, CommitPoint, LogPayload, Publish, PublishBatch};
use crate::store::Raft;

/// Why a command got no result from the state machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// Definitely not applied: this node is not the leader.
    NotLeader {
        leader_id: Option<NodeId>,
        leader_url: Option<String>,
    },
    /// Definitely not applied: the queue is full.
    Overloaded,
    /// Definitely not applied: the node is stopping.
    ShuttingDown,
    /// Proposed, but the outcome is unknown (leader lost, node stopping, timeout).
    Indeterminate(String),
}

/// A command's answer: its result and the commit point of its entry.
pub type Proposal = Result<(CommandResult, CommitPoint), ProposeError>;

struct Pending {
    command: Command,
    bytes: usize,
    reply: oneshot::Sender<Proposal>,
}

/// Longest a producer's batch waits for its predecessor before it is proposed anyway.
pub const HOLD_MAX: Duration = Duration::from_millis(25);
/// Most batches held waiting for a predecessor at once; beyond it batches are not held.
const MAX_HELD: usize = 1_024;
/// Producers whose last proposed sequence is remembered; beyond it the idle ones are dropped.
const MAX_TRACKED: usize = 10_000;

/// Limits of one entry and of the pipeline.
#[derive(Debug, Clone, Copy)]
pub struct ProposerLimits {
    /// Most commands queued before submitters get `Overloaded`.
    pub queue: usize,
    /// Most commands in one entry.
    pub max_commands: usize,
    /// Byte budget of one entry (a single larger command still goes alone).
    pub max_bytes: usize,
    /// Entries proposed but not yet applied.
    pub in_flight: usize,
}

/// Default most commands in one entry.
pub const DEFAULT_MAX_ENTRY_COMMANDS: usize = 4_096;
/// Largest setting of the most commands in one entry.
pub const MAX_ENTRY_COMMANDS: usize = 65_536;

impl Default for ProposerLimits {
    fn default() -> Self {
        ProposerLimits {
            queue: 20_000,
            max_commands: DEFAULT_MAX_ENTRY_COMMANDS,
            max_bytes: 8 << 20,
            in_flight: 4,
        }
    }
}

/// Handle for submitting commands. Cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
}

/// Longest the first proposal of a process waits for the entry clock to have read a majority
/// of the cluster's clocks; then it stamps what it has.
const CLOCK_SYNC_WAIT: Duration = Duration::from_secs(2);

impl Proposer {
    /// Starts the batching task, stamping entries with `clock`. It ends when every `Proposer`
    /// handle is dropped.
    pub fn start(raft: Raft, limits: ProposerLimits, clock: Arc<EntryClock>) -> Proposer {
        let (tx, rx) = mpsc::channel(limits.queue);
        tokio::spawn(run(raft, rx, limits, clock));
        Proposer { tx }
    }

    /// Proposes `command` and waits for its result, at most `timeout` (then the outcome is
    /// unknown and reported as such).
    pub async fn propose(&self, command: Command, timeout: Duration) -> Proposal {
        let (reply, rx) = oneshot::channel();
        let bytes = command.approx_bytes();
        self.tx
            .try_send(Pending {
                command,
                bytes,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => ProposeError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => ProposeError::ShuttingDown,
            })?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(ProposeError::Indeterminate(
                "the proposal was dropped".into(),
            )),
            Err(_) => Err(ProposeError::Indeterminate(format!(
                "not committed within {} ms",
                timeout.as_millis()
            ))),
        }
    }
}

/// A producer: (topic, producer id).
type ProducerKey = (String, String);

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn producer_key(command: &Command) -> Option<(ProducerKey, u64)> {
    match command {
        Command::Publish(Publish {
            topic, producer, ..
        })
        | Command::PublishBatch(PublishBatch {
            topic, producer, ..
        }) => producer
            .as_ref()
            .map(|seq| ((topic.clone(), seq.producer_id.clone()), seq.sequence)),
        _ => None,
    }
}

/// One producer's waiting batches: (sequence, arrival number) to the batch and when it came.
type Held<T> = BTreeMap<(u64, u64), (T, Instant)>;

/// Puts each producer's batches in sequence order (see the module docs).
struct Order<T> {
    /// Highest sequence proposed per producer, and when.
    last: HashMap<ProducerKey, (u64, Instant)>,
    /// Batches waiting for their predecessor, by producer and (sequence, arrival number: a
    /// re-sent batch can arrive while its first attempt waits), with when they came.
    held: HashMap<ProducerKey, Held<T>>,
    held_count: usize,
    arrivals: u64,
}

impl<T> Order<T> {
    fn new() -> Self {
        Order {
            last: HashMap::new(),
            held: HashMap::new(),
            held_count: 0,
            arrivals: 0,
        }
    }

    /// Takes a command: pushes onto `out` what may be proposed now (the command, and any held
    /// successors it releases), in order; keeps it if its predecessor has not been proposed.
    fn admit(
        &mut self,
        item: T,
        key: Option<(ProducerKey, u64)>,
        now: Instant,
        out: &mut VecDeque<T>,
    ) {
        let Some((key, seq)) = key else {
            out.push_back(item);
            return;
        };
        let early = self
            .last
            .get(&key)
            .is_some_and(|&(last, _)| seq > last.saturating_add(1));
        if early && self.held_count < MAX_HELD {
            self.arrivals += 1;
            self.held
                .entry(key)
                .or_default()
                .insert((seq, self.arrivals), (item, now));
            self.held_count += 1;
            return;
        }
        out.push_back(item);
        self.proposed(key, seq, now, out);
    }

    /// Records that `seq` of `key` goes out now, and releases the held batches that follow it.
    fn proposed(&mut self, key: ProducerKey, seq: u64, now: Instant, out: &mut VecDeque<T>) {
        let mut last = seq;
        if let Some(&(before, _)) = self.last.get(&key) {
            last = last.max(before);
        }
        if let Some(slot) = self.held.get_mut(&key) {
            while let Some(entry) = slot.first_entry() {
                if entry.key().0 > last.saturating_add(1) {
                    break;
                }
                let ((next, _), (item, _)) = entry.remove_entry();
                self.held_count -= 1;
                out.push_back(item);
                last = last.max(next);
            }
            if slot.is_empty() {
                self.held.remove(&key);
            }
        }
        if self.last.len() >= MAX_TRACKED && !self.last.contains_key(&key) {
            let horizon = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
            self.last.retain(|_, (_, at)| *at >= horizon);
            if self.last.len() >= MAX_TRACKED {
                self.last.clear();
            }
        }
        self.last.insert(key, (last, now));
    }

    /// When the oldest held batch has waited long enough.
    fn next_release(&self) -> Option<Instant> {
        self.held
            .values()
            .flat_map(|slot| slot.values().map(|(_, since)| *since + HOLD_MAX))
            .min()
    }

    /// Releases every producer's held batches that waited [`HOLD_MAX`], with what follows them.
    fn release_due(&mut self, now: Instant, out: &mut VecDeque<T>) {
        let due: Vec<ProducerKey> = self
            .held
            .iter()
            .filter(|(_, slot)| slot.values().any(|(_, since)| *since + HOLD_MAX <= now))
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            // The waiting is over for this producer: everything it holds goes, in order.
            if let Some(slot) = self.held.remove(&key) {
                let mut last = None;
                for ((seq, _), (item, _)) in slot {
                    self.held_count -= 1;
                    out.push_back(item);
                    last = Some(seq);
                }
                if let Some(seq) = last {
                    self.proposed(key, seq, now, out);
                }
            }
        }
    }

    fn is_holding(&self) -> bool {
        self.held_count > 0
    }
}

async fn run(
    raft: Raft,
    mut rx: mpsc::Receiver<Pending>,
    limits: ProposerLimits,
    clock: Arc<EntryClock>,
) {
    // The first stamp anchors the entry clock: it waits (briefly) for a majority's clocks.
    let mut anchored = false;
    let permits = Arc::new(Semaphore::new(limits.in_flight));
    let mut order: Order<Pending> = Order::new();
    // Admitted in order, not yet in an entry.
    let mut ready: VecDeque<Pending> = VecDeque::new();
    let mut closed = false;
    let admit = |order: &mut Order<Pending>, ready: &mut VecDeque<Pending>, p: Pending| {
        let key = producer_key(&p.command);
        order.admit(p, key, Instant::now(), ready);
    };
    loop {
        // Wait for a free pipeline slot first: commands arriving meanwhile join the batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        while ready.is_empty() {
            let release_at = order.next_release();
            if closed && release_at.is_none() {
                return;
            }
            tokio::select! {
                msg = rx.recv(), if !closed => match msg {
                    Some(p) => admit(&mut order, &mut ready, p),
                    None => closed = true,
                },
                _ = sleep_until_opt(release_at), if release_at.is_some() => {
                    order.release_due(Instant::now(), &mut ready);
                }
            }
        }
        while ready.len() < limits.max_commands {
            match rx.try_recv() {
                Ok(p) => admit(&mut order, &mut ready, p),
                Err(_) => break,
            }
        }
        if order.is_holding() {
            order.release_due(Instant::now(), &mut ready);
        }
        let mut bytes = 0;
        let mut batch = Vec::new();
        while let Some(p) = ready.front() {
            if !batch.is_empty()
                && (batch.len() >= limits.max_commands || bytes + p.bytes > limits.max_bytes)
            {
                break;
            }
            bytes += p.bytes;
            batch.extend(ready.pop_front());
        }
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        metrics::histogram!("raftq_entry_commands").record(commands.len() as f64);
        metrics::histogram!("raftq_entry_bytes").record(bytes as f64);
        if !anchored && !clock.wait_synced(CLOCK_SYNC_WAIT).await {
            tracing::warn!(
                "stamping the first entry before this node has read the clocks of a majority \
                 of the cluster: the entry clock starts from this node's wall clock"
            );
        }
        anchored = true;
        let payload = LogPayload::V1(Batch {
            timestamp_ms: clock.stamp_ms(),
            commands,
        });
        let (responder, _commit, receiver) = ProgressResponder::new();
        match raft.client_write_ff(payload, Some(responder)).await {
            Err(fatal) => {
                let msg = format!("raft stopped: {fatal}");
                for r in replies {
                    let _ = r.send(Err(ProposeError::Indeterminate(msg.clone())));
                }
                return;
            }
            Ok(()) => {
                tokio::spawn(async move {
                    let answer = receiver.await;
                    drop(permit);
                    deliver(answer, replies);
                });
            }
        }
    }
}

type WriteAnswer = Result<
    Result<
        openraft::raft::ClientWriteResponse<crate::raft::TypeConfig>,
        ClientWriteError<crate::raft::TypeConfig>,
    >,
    oneshot::error::RecvError,
>;

fn deliver(answer: WriteAnswer, replies: Vec<oneshot::Sender<Proposal>>) {
    match answer {
        Ok(Ok(resp)) => {
            let cp = resp.data.commit_point;
            let mut results = resp.data.results.into_iter();
            for r in replies {
                let res = results
                    .next()
                    .map(|res| (res, cp))
                    .ok_or_else(|| ProposeError::Indeterminate("missing result".into()));
                let _ = r.send(res);
            }
        }
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
            // openraft answers ForwardToLeader only for entries it never appended, so they
            // are not, and never will be, committed. An entry appended and then replaced by
            // another leader's log is `LogEntryDiscarded` (it may still commit elsewhere): that
            // one falls to the indeterminate arm below.
            let err = ProposeError::NotLeader {
                leader_id: f.leader_id,
                leader_url: f.leader_node.map(|n| n.addr),
            };
            for r in replies {
                let _ = r.send(Err(err.clone()));
            }
        }
        Ok(Err(e)) => {
            let msg = e.to_string();
            for r in replies {
                let _ = r.send(Err(ProposeError::Indeterminate(msg.clone())));
            }
        }
        Err(_) => {
            for r in replies {
                let _ = r.send(Err(ProposeError::Indeterminate(
                    "leader stepped down before the entry was applied".into(),
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(producer: &str) -> ProducerKey {
        ("t".to_string(), producer.to_string())
    }

    /// Admits `(label, producer, seq)` items one by one; returns what came out after each.
    fn admit_all(
        order: &mut Order<&'static str>,
        items: &[(&'static str, &str, u64)],
        now: Instant,
    ) -> Vec<Vec<&'static str>> {
        items
            .iter()
            .map(|&(label, producer, seq)| {
                let mut out = VecDeque::new();
                order.admit(label, Some((key(producer), seq)), now, &mut out);
                Vec::from(out)
            })
            .collect()
    }

    #[test]
    fn batches_in_order_pass_straight_through() {
        let mut order = Order::new();
        let outs = admit_all(
            &mut order,
            &[("a0", "a", 0), ("a1", "a", 1), ("a2", "a", 2)],
            Instant::now(),
        );
        assert_eq!(outs, vec![vec!["a0"], vec!["a1"], vec!["a2"]]);
        assert!(!order.is_holding());
    }

    #[test]
    fn an_early_batch_waits_for_its_predecessor_and_follows_it() {
        let mut order = Order::new();
        let outs = admit_all(
            &mut order,
            &[
                ("a0", "a", 0),
                ("a3", "a", 3),
                ("a2", "a", 2),
                ("b7", "b", 7),
                ("a1", "a", 1),
            ],
            Instant::now(),
        );
        assert_eq!(
            outs,
            vec![
                vec!["a0"],
                vec![],
                vec![],
                vec!["b7"],
                vec!["a1", "a2", "a3"]
            ]
        );
        assert!(!order.is_holding());
        assert_eq!(order.next_release(), None);
    }

    #[test]
    fn a_producer_seen_first_and_retries_are_never_held() {
        let mut order = Order::new();
        let mut out = VecDeque::new();
        order.admit("x", None, Instant::now(), &mut out);
        let outs = admit_all(
            &mut order,
            &[("a5", "a", 5), ("a5again", "a", 5), ("a3", "a", 3)],
            Instant::now(),
        );
        assert_eq!(out, vec!["x"]);
        assert_eq!(outs, vec![vec!["a5"], vec!["a5again"], vec!["a3"]]);
    }

    #[test]
    fn a_batch_sent_again_while_its_first_attempt_waits_is_kept_too() {
        let mut order = Order::new();
        let outs = admit_all(
            &mut order,
            &[
                ("a0", "a", 0),
                ("a2", "a", 2),
                ("a2again", "a", 2),
                ("a1", "a", 1),
            ],
            Instant::now(),
        );
        assert_eq!(
            outs,
            vec![vec!["a0"], vec![], vec![], vec!["a1", "a2", "a2again"]]
        );
        assert!(!order.is_holding());
    }

    #[test]
    fn a_held_batch_goes_after_hold_max_with_what_follows_it() {
        let mut order = Order::new();
        let start = Instant::now();
        admit_all(
            &mut order,
            &[("a0", "a", 0), ("a2", "a", 2), ("a3", "a", 3)],
            start,
        );
        assert_eq!(order.next_release(), Some(start + HOLD_MAX));
        let mut out = VecDeque::new();
        order.release_due(start + HOLD_MAX - Duration::from_millis(1), &mut out);
        assert!(out.is_empty(), "released before its time: {out:?}");
        order.release_due(start + HOLD_MAX, &mut out);
        assert_eq!(out, vec!["a2", "a3"]);
        // The predecessor arriving late is not held: the state machine answers it.
        let outs = admit_all(
            &mut order,
            &[("a1", "a", 1), ("a4", "a", 4)],
            start + HOLD_MAX,
        );
        assert_eq!(outs, vec![vec!["a1"], vec!["a4"]]);
    }

    #[test]
    fn no_more_than_max_held_batches_wait() {
        let mut order = Order::new();
        let now = Instant::now();
        let mut out = VecDeque::new();
        order.admit(0, Some((key("a"), 0)), now, &mut out);
        for seq in 2..(MAX_HELD as u64 + 2) {
            order.admit(seq, Some((key("a"), seq)), now, &mut out);
        }
        assert_eq!(out, vec![0]);
        assert_eq!(order.held_count, MAX_HELD);
        order.admit(100, Some((key("b"), 0)), now, &mut out);
        order.admit(102, Some((key("b"), 2)), now, &mut out);
        assert_eq!(out, vec![0, 100, 102], "past the cap, nothing more is held");
        assert_eq!(order.held_count, MAX_HELD);
    }
}
