//! The last check of a run: every node's whole state machine, compared by digest.
//!
//! After the final drain and reads (nothing writes any more), every node is asked
//! `GET /v1/cluster?digest=true`, whose `state_digest` is a digest of that node's state machine
//! as of the index it names. The state machine is deterministic, so nodes that applied the same
//! index must report the same digest. Nodes that are behind first catch up, and the leader may
//! still propose a tick entry now and then (a lease falling due), so the nodes are asked again,
//! all at once, until every one reports the same index; only then are the digests compared.
//!
//! `digest_mismatch` (makes the run invalid): the digests differ at one index, or within the
//! bound ([`DIGEST_TIMEOUT`]) the nodes never all reported the same index (one never reached the
//! others, or one never answered with a digest).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use raftq_client::api::ClusterStatus;
use serde::Serialize;

use super::http::Http;

/// How long the nodes may take to report one index.
pub const DIGEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeout of one `GET /v1/cluster?digest=true` (it reads the node's whole state).
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// One node's answer in a round.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeDigest {
    /// The index the digest is of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Why there is no digest (no answer, or an answer without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the comparison found, for the results file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DigestReport {
    /// Every node reported the same digest at the same index.
    pub consistent: bool,
    /// The index every node reported, when they agreed on one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// Each node's answer in the deciding round (the last round when none decided).
    pub nodes: BTreeMap<u64, NodeDigest>,
    /// Rounds asked.
    pub rounds: u32,
    pub millis: u64,
    /// What was found, in words.
    pub detail: String,
}

impl DigestReport {
    /// Count of the `digest_mismatch` anomaly: 1 when the nodes did not agree, else 0.
    pub fn mismatches(&self) -> u64 {
        u64::from(!self.consistent)
    }
}

/// What one round says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Every node reported the same index with the same digest.
    Same { index: u64 },
    /// Every node reported the same index, with different digests: decided, inconsistent.
    Differ { index: u64 },
    /// Not every node reported the same index (or some reported none): ask again.
    Pending { why: String },
}

/// Judges one round of answers from the nodes `ids`.
pub fn judge_round(ids: &[u64], answers: &BTreeMap<u64, NodeDigest>) -> Round {
    let mut indexes = BTreeMap::new();
    for id in ids {
        match answers.get(id) {
            Some(NodeDigest {
                index: Some(index),
                digest: Some(_),
                ..
            }) => {
                indexes.insert(*id, *index);
            }
            Some(NodeDigest {
                error: Some(error), ..
            }) => {
                return Round::Pending {
                    why: format!("node {id}: {error}"),
                }
            }
            _ => {
                return Round::Pending {
                    why: format!("node {id} reported no digest"),
                }
            }
        }
    }
    let distinct: std::collections::BTreeSet<u64> = indexes.values().copied().collect();
    let Some(&index) = distinct.iter().next() else {
        return Round::Pending {
            why: "no nodes".into(),
        };
    };
    if distinct.len() > 1 {
        return Round::Pending {
            why: format!("indexes differ: {indexes:?}"),
        };
    }
    let digests: std::collections::BTreeSet<&str> = ids
        .iter()
        .filter_map(|id| answers.get(id).and_then(|a| a.digest.as_deref()))
        .collect();
    if digests.len() == 1 {
        Round::Same { index }
    } else {
        Round::Differ { index }
    }
}

/// Asks every node of `ids` for its digest, all at once.
async fn ask_all(http: &Http, ids: &[u64]) -> BTreeMap<u64, NodeDigest> {
    let asks = ids.iter().map(|id| async move {
        let status: Option<ClusterStatus> = http
            .get_json(*id, "/v1/cluster?digest=true", ASK_TIMEOUT)
            .await;
        let answer = match status {
            Some(ClusterStatus {
                state_digest: Some(d),
                ..
            }) => NodeDigest {
                index: Some(d.index),
                digest: Some(d.digest),
                error: None,
            },
            Some(_) => NodeDigest {
                error: Some("answered without a state digest".into()),
                ..NodeDigest::default()
            },
            None => NodeDigest {
                error: Some("no answer to GET /v1/cluster?digest=true".into()),
                ..NodeDigest::default()
            },
        };
        (*id, answer)
    });
    futures::future::join_all(asks).await.into_iter().collect()
}

/// Compares the nodes' state digests (see the module documentation), for at most `timeout`.
pub async fn compare(http: &Http, ids: &[u64], timeout: Duration) -> DigestReport {
    let started = Instant::now();
    let deadline = started + timeout;
    let mut report = DigestReport::default();
    loop {
        let answers = ask_all(http, ids).await;
        report.rounds += 1;
        let round = judge_round(ids, &answers);
        report.nodes = answers;
        match round {
            Round::Same { index } => {
                report.consistent = true;
                report.index = Some(index);
                report.detail = format!("every node has the same state at index {index}");
                break;
            }
            Round::Differ { index } => {
                report.index = Some(index);
                report.detail = format!(
                    "the nodes' states differ at index {index}: {}",
                    describe(&report.nodes)
                );
                break;
            }
            Round::Pending { why } => {
                if Instant::now() + ROUND_PAUSE >= deadline {
                    report.detail = format!(
                        "the nodes did not report one index within {timeout:?}: {why}; last: {}",
                        describe(&report.nodes)
                    );
                    break;
                }
            }
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    report.millis = started.elapsed().as_millis() as u64;
    report
}

/// `1: 120 abc, 2: 118 abd, 3: no answer`.
fn describe(nodes: &BTreeMap<u64, NodeDigest>) -> String {
    nodes
        .iter()
        .map(|(id, n)| match (&n.index, &n.digest, &n.error) {
            (Some(index), Some(digest), _) => format!("node {id} at {index}: {digest}"),
            (_, _, Some(error)) => format!("node {id}: {error}"),
            _ => format!("node {id}: nothing"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(index: u64, digest: &str) -> NodeDigest {
        NodeDigest {
            index: Some(index),
            digest: Some(digest.into()),
            error: None,
        }
    }

    #[test]
    fn rounds_decide_only_at_one_index() {
        let ids = [1, 2, 3];
        let same: BTreeMap<u64, NodeDigest> =
            [(1, at(9, "a")), (2, at(9, "a")), (3, at(9, "a"))].into();
        assert_eq!(judge_round(&ids, &same), Round::Same { index: 9 });
        let differ: BTreeMap<u64, NodeDigest> =
            [(1, at(9, "a")), (2, at(9, "b")), (3, at(9, "a"))].into();
        assert_eq!(judge_round(&ids, &differ), Round::Differ { index: 9 });
        // Different digests at different indexes say nothing yet.
        let behind: BTreeMap<u64, NodeDigest> =
            [(1, at(9, "a")), (2, at(8, "b")), (3, at(9, "a"))].into();
        assert!(matches!(
            judge_round(&ids, &behind),
            Round::Pending { why } if why.contains("indexes differ")
        ));
        let silent: BTreeMap<u64, NodeDigest> = [
            (1, at(9, "a")),
            (
                2,
                NodeDigest {
                    error: Some("no answer".into()),
                    ..NodeDigest::default()
                },
            ),
        ]
        .into();
        assert!(matches!(
            judge_round(&ids, &silent),
            Round::Pending { why } if why.contains("node 2")
        ));
        let report = DigestReport::default();
        assert_eq!(report.mismatches(), 1);
        assert!(describe(&differ).contains("node 2 at 9: b"));
    }
}
