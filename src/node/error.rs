//! Why a write (or a change of the cluster) was not done: the replica's own answer, which the
//! HTTP adapter turns into a problem of API.md and anything else may turn into what it needs.

use crate::proposer::ProposeError;
use crate::raft::NodeId;
use crate::state::ApplyError;

/// A write or cluster change that did not succeed, and whether it may still take effect.
/// Every variant but [`WriteError::Indeterminate`] means "not done".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Another node leads: nothing was done here; send it there.
    #[error("this node is not the leader; node {id} at {url} is")]
    NotLeader { id: NodeId, url: String },
    /// No leader is known, or this one cannot commit now (no quorum heard from recently, or
    /// a leadership transfer under way).
    #[error("no leader is known right now")]
    NoLeader,
    /// This node is stopping; `leader` is where to go instead, when known.
    #[error("this node is shutting down")]
    ShuttingDown { leader: Option<(NodeId, String)> },
    /// Too many writes are queued on this node.
    #[error("{0}")]
    Overloaded(String),
    /// The state machine refused the command (it changed nothing).
    #[error("{0}")]
    Refused(ApplyError),
    /// The request cannot be done as asked.
    #[error("{0}")]
    Invalid(String),
    /// Another change of the same kind is still in progress.
    #[error("{0}")]
    Conflict(String),
    /// Proposed, but the outcome is unknown: it may or may not take effect.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// Something failed on this node.
    #[error("{0}")]
    Internal(String),
    /// Not done now; may work when retried (a transfer that did not finish, a snapshot still
    /// building).
    #[error("{0}")]
    Unavailable(String),
    /// Waited for something that did not happen in time (a learner catching up).
    #[error("{0}")]
    TimedOut(String),
}

impl WriteError {
    /// The proposer's answer, as this node's answer. `me` is this node's id: a proposer that
    /// names this node as the leader (it just lost leadership) means no leader is known.
    pub(crate) fn from_propose(e: ProposeError, me: NodeId) -> Self {
        match e {
            ProposeError::NotLeader {
                leader_id: Some(id),
                leader_url: Some(url),
            } if id != me => WriteError::NotLeader { id, url },
            ProposeError::NotLeader { .. } => WriteError::NoLeader,
            ProposeError::Overloaded => {
                WriteError::Overloaded("too many writes queued on this node; retry shortly".into())
            }
            ProposeError::ShuttingDown => WriteError::ShuttingDown { leader: None },
            ProposeError::Indeterminate(why) => WriteError::Indeterminate(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proposer_naming_this_node_means_no_leader() {
        let named = |id| ProposeError::NotLeader {
            leader_id: Some(id),
            leader_url: Some("http://n".into()),
        };
        assert_eq!(WriteError::from_propose(named(1), 1), WriteError::NoLeader);
        assert_eq!(
            WriteError::from_propose(named(2), 1),
            WriteError::NotLeader {
                id: 2,
                url: "http://n".into()
            }
        );
        let unnamed = ProposeError::NotLeader {
            leader_id: Some(2),
            leader_url: None,
        };
        assert_eq!(WriteError::from_propose(unnamed, 1), WriteError::NoLeader);
        assert_eq!(
            WriteError::from_propose(ProposeError::ShuttingDown, 1),
            WriteError::ShuttingDown { leader: None }
        );
    }
}
