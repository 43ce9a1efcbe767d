//! Changing the cluster's members, through Raft membership entries. openraft moves through a
//! joint configuration, so a majority of both the old and the new voters agree on every step.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::async_runtime::watch::WatchReceiver as _;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};

use super::{Node, WriteError};
use crate::raft::{NodeId, TypeConfig};

/// How long adding a learner (or making one a voter) waits for it to catch up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

fn membership_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            match (f.leader_id, f.leader_node) {
                (Some(id), Some(n)) => WriteError::NotLeader { id, url: n.addr },
                _ => WriteError::NoLeader,
            }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => match c {
            ChangeMembershipError::InProgress(_) => WriteError::Conflict(
                "another membership change is still in progress; retry when it is done".into(),
            ),
            other => WriteError::Invalid(other.to_string()),
        },
        RaftError::APIError(e @ ClientWriteError::LogEntryDiscarded(_)) => {
            WriteError::Indeterminate(e.to_string())
        }
        RaftError::APIError(e @ ClientWriteError::PreconditionFailed(_)) => {
            WriteError::Internal(e.to_string())
        }
        RaftError::Fatal(f) => WriteError::Indeterminate(format!("Raft stopped: {f}")),
    }
}

impl Node {
    /// Adds `id` at `url` as a learner (answers once the membership entry is committed).
    pub async fn add_learner(&self, id: NodeId, url: &str) -> Result<(), WriteError> {
        self.raft
            .add_learner(id, BasicNode::new(url), false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Makes `voters` the complete set of voters; with `retain`, voters that leave stay as
    /// learners, without it they leave the cluster. Answers the index of the entry.
    pub async fn set_voters(
        &self,
        voters: BTreeSet<NodeId>,
        retain: bool,
    ) -> Result<u64, WriteError> {
        let resp = self
            .raft
            .change_membership(voters, retain)
            .await
            .map_err(membership_error)?;
        Ok(resp.log_id.index)
    }

    /// Removes learner `id` from the cluster.
    pub async fn remove_learner(&self, id: NodeId) -> Result<(), WriteError> {
        self.raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await
            .map_err(membership_error)?;
        Ok(())
    }

    /// Waits until `id` has replicated the leader's log as it was when the wait began (at most
    /// [`CATCH_UP_TIMEOUT`]).
    pub async fn wait_caught_up(&self, id: NodeId) -> Result<(), WriteError> {
        let target = self.raft.metrics().borrow_watched().last_log_index;
        let deadline = Instant::now() + CATCH_UP_TIMEOUT;
        let mut matched = None;
        let caught_up = self
            .wait_metrics(deadline, |m| {
                matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index);
                matched >= target
            })
            .await;
        if caught_up {
            return Ok(());
        }
        Err(WriteError::TimedOut(format!(
            "node {id} is a learner now but has not caught up after {} s (at {matched:?} of \
             {target:?}); check that it runs and is reachable, then add it again to wait more",
            CATCH_UP_TIMEOUT.as_secs()
        )))
    }
}
