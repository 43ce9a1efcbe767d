//! Group commit: many concurrent client commands become one Raft entry.
//!
//! Handlers submit commands to a bounded queue. One task takes whatever has queued up (up to
//! a command and a byte budget), stamps it with the leader's clock and proposes it as one
//! entry, keeping a few entries in flight so replication and fsync overlap. While proposals
//! are in flight new commands accumulate, so batches grow with load on their own (an
//! adaptive window with no timer). Entries are handed to Raft in submission order.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::ClientWriteError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::raft::{NodeId, Raft};
use crate::state::{Batch, Command, CommandResult, CommitPoint, LogPayload};

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

impl Default for ProposerLimits {
    fn default() -> Self {
        ProposerLimits {
            queue: 20_000,
            max_commands: 4096,
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Proposer {
    /// Starts the batching task. It ends when every `Proposer` handle is dropped.
    pub fn start(raft: Raft, limits: ProposerLimits) -> Proposer {
        let (tx, rx) = mpsc::channel(limits.queue);
        tokio::spawn(run(raft, rx, limits));
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

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>, limits: ProposerLimits) {
    let permits = Arc::new(Semaphore::new(limits.in_flight));
    let mut carry: Option<Pending> = None;
    loop {
        // Wait for a free pipeline slot first: commands arriving meanwhile join the batch.
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < limits.max_commands {
            match rx.try_recv() {
                Ok(p) if bytes + p.bytes > limits.max_bytes => {
                    carry = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let payload = LogPayload::V1(Batch {
            time_ms: now_ms(),
            commands,
        });
        match raft.client_write_ff(payload).await {
            Err(fatal) => {
                let msg = format!("raft stopped: {fatal}");
                for r in replies {
                    let _ = r.send(Err(ProposeError::Indeterminate(msg.clone())));
                }
                return;
            }
            Ok(receiver) => {
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
        ClientWriteError<NodeId, openraft::BasicNode>,
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
            // openraft answers ForwardToLeader only for entries it never appended, or that
            // were truncated away: either way they are not, and never will be, committed.
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
