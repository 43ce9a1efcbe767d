//! Faults applied to the hosts, as a schedule.
//!
//! A [`Scenario`] names one kind of fault. [`run`] repeats it until the deadline: a quiet
//! period, then the fault for its hold time, then its undoing, and again. Every fault is
//! recorded in the history as a start and a stop event of the nemesis process, with exactly
//! what it did (which nodes, which groups).
//!
//! | scenario | fault | undone by |
//! |---|---|---|
//! | `kill-leader` | SIGKILL the current leader (a random node when none is known) | restart after the hold |
//! | `kill-all` | SIGKILL every node at once | restart all after the hold |
//! | `pause-leader` | freeze the leader (SIGSTOP; `docker pause`) for longer than the election timeout (1.2 s) | thaw |
//! | `partition-leader` | the leader alone, the others together | heal |
//! | `partition-one` | one follower alone (a random node when no leader is known), the others together | heal |
//! | `partition-halves` | a random minority against the majority | heal |
//! | `partition-ring` | majorities ring: every node sees a majority, no two the same | heal |
//! | `partition-bridge` | two halves joined by one node that sees both | heal |
//! | `netem-delay` | every node's packets delayed 20 ms ± 10 ms | heal |
//! | `netem-loss` | 10 % of every node's packets dropped | heal |
//! | `netem-reorder` | every node's packets delayed 20 ms ± 5 ms, a quarter of them sent at once, ahead of the others | heal |
//! | `membership-demote` | one follower (a random one) demoted to learner: the voters are the other two | the voters are all nodes again |
//! | `membership-transfer` | leadership moved to a random other voter (`transfer-leader`), again 1–2 s after each transfer | nothing to undo |
//!
//! The netem faults impair everything a node sends, to the other nodes and to the clients
//! (see [`crate::hosts::Hosts::impair`]). They are sized so that the cluster keeps making
//! progress, more slowly: they test timeouts, retries and the classification of slow answers,
//! not loss of quorum. The bound is the Raft replication timeout, which is the heartbeat
//! interval (100 ms): a round trip between two nodes (twice the one-way delay) plus a
//! follower's fsync must fit in it, or replication stalls until the impairment ends (with
//! 50 ms ± 25 ms each way it does, completely).
//!
//! The membership faults are requests to the cluster's own API, sent to the leader (see
//! [`membership`]); they change which nodes vote, never which nodes exist (a removed node id
//! can never join again). With two voters of three the cluster still has a majority of its
//! voters, so it keeps taking writes. Healing then makes every node a voter again
//! ([`heal_voters`]; it changes nothing when they all are, and also repairs an undo that
//! failed), so that every node takes part in the final reads as before the run.

//! # The majorities ring with three nodes
//! Links are cut in both directions (TCP needs both), so a "view" is a set of symmetric links.
//! With n ≥ 4 nodes in a random ring order, each node keeps links to its ⌈⌊n/2⌋/2⌉ nearest
//! neighbours on each side: it sees a majority, and no two nodes see the same set. With three
//! nodes a ring of pairs is every pair (no fault at all), and one-directional "grudges" as
//! Jepsen uses them isolate everyone under TCP. The only symmetric topology where every node
//! sees a majority and no two see the same is the line `a - b - c`: `a` sees {a,b}, `c` sees
//! {b,c}, `b` sees all. So with three nodes the ring is that line with **the leader at one
//! end** (`a`), so that one follower loses the leader yet keeps a majority through `b`; the
//! bridge is the same shape with a bridge node chosen at random (it may be the leader).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom as _;
use rand::SeedableRng as _;
use serde::Serialize;

use crate::history::{History, Op, OpResult, Phase, Process};
use crate::hosts::{Hosts, Netem};
use crate::workload::http::Http;

pub mod membership;

/// How long undoing a demotion (or healing) may take to make every node a voter again.
pub const VOTERS_TIMEOUT: Duration = Duration::from_secs(30);

/// Which fault a run applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// No fault: the baseline.
    None,
    KillLeader,
    KillAll,
    PauseLeader,
    PartitionLeader,
    PartitionOne,
    PartitionHalves,
    PartitionRing,
    PartitionBridge,
    NetemDelay,
    NetemLoss,
    NetemReorder,
    MembershipDemote,
    MembershipTransfer,
}

impl Scenario {
    /// Every scenario, in the matrix's order.
    pub const ALL: [Scenario; 14] = [
        Scenario::None,
        Scenario::KillLeader,
        Scenario::KillAll,
        Scenario::PauseLeader,
        Scenario::PartitionLeader,
        Scenario::PartitionOne,
        Scenario::PartitionHalves,
        Scenario::PartitionRing,
        Scenario::PartitionBridge,
        Scenario::NetemDelay,
        Scenario::NetemLoss,
        Scenario::NetemReorder,
        Scenario::MembershipDemote,
        Scenario::MembershipTransfer,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::None => "none",
            Scenario::KillLeader => "kill-leader",
            Scenario::KillAll => "kill-all",
            Scenario::PauseLeader => "pause-leader",
            Scenario::PartitionLeader => "partition-leader",
            Scenario::PartitionOne => "partition-one",
            Scenario::PartitionHalves => "partition-halves",
            Scenario::PartitionRing => "partition-ring",
            Scenario::PartitionBridge => "partition-bridge",
            Scenario::NetemDelay => "netem-delay",
            Scenario::NetemLoss => "netem-loss",
            Scenario::NetemReorder => "netem-reorder",
            Scenario::MembershipDemote => "membership-demote",
            Scenario::MembershipTransfer => "membership-transfer",
        }
    }

    /// The fault's kind as the results table shows it.
    pub fn fault(self) -> &'static str {
        match self {
            Scenario::None => "-",
            Scenario::KillLeader | Scenario::KillAll => "kill -9",
            Scenario::PauseLeader => "SIGSTOP",
            Scenario::NetemDelay | Scenario::NetemLoss | Scenario::NetemReorder => "netem",
            Scenario::MembershipDemote | Scenario::MembershipTransfer => "membership",
            _ => "partition",
        }
    }

    /// The impairment of a netem scenario.
    pub fn netem(self) -> Option<Netem> {
        let netem = match self {
            Scenario::NetemDelay => Netem {
                delay_ms: 20,
                jitter_ms: 10,
                ..Netem::default()
            },
            Scenario::NetemLoss => Netem {
                loss_pct: 10,
                ..Netem::default()
            },
            Scenario::NetemReorder => Netem {
                delay_ms: 20,
                jitter_ms: 5,
                reorder_pct: 25,
                ..Netem::default()
            },
            _ => return None,
        };
        Some(netem)
    }

    /// True for the scenarios that change the voters or the leader through the API.
    pub fn changes_membership(self) -> bool {
        matches!(
            self,
            Scenario::MembershipDemote | Scenario::MembershipTransfer
        )
    }

    /// Default timing: the quiet time before each fault and how long a fault holds.
    pub fn default_timing(self) -> Timing {
        let (quiet, hold) = match self {
            Scenario::None => (0, 0),
            Scenario::KillLeader => (3000, 3000),
            Scenario::KillAll => (4000, 2000),
            // Longer than the election timeout (1.2 s): the others elect a new leader while
            // the old one is frozen, and it wakes up deposed.
            Scenario::PauseLeader => (3000, 3000),
            _ => (3000, 6000),
        };
        Timing {
            quiet: Duration::from_millis(quiet),
            hold: Duration::from_millis(hold),
        }
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// When faults happen.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Quiet time before each fault.
    pub quiet: Duration,
    /// How long each fault holds before it is undone.
    pub hold: Duration,
}

/// One fault, as applied and as recorded in the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL these nodes; undone by starting them again.
    Kill { nodes: Vec<u64> },
    /// SIGSTOP these nodes; undone by SIGCONT.
    Pause { nodes: Vec<u64> },
    /// Nodes talk only within their groups; undone by healing.
    Partition { groups: Vec<Vec<u64>> },
    /// What these nodes send is impaired; undone by healing.
    Netem { nodes: Vec<u64>, netem: Netem },
    /// `node` is demoted to learner: `voters` (the others) become the complete set of voters;
    /// undone by making every node a voter again.
    Demote { node: u64, voters: Vec<u64> },
    /// While the fault holds, leadership moves to a random other voter of `voters`, again 1–2 s
    /// after each transfer; nothing to undo.
    Transfer { voters: Vec<u64> },
}

impl Fault {
    /// A short text for logs and the history, e.g. `partition [[1],[2,3]]`.
    pub fn describe(&self) -> String {
        match self {
            Fault::Kill { nodes } => format!("kill {nodes:?}"),
            Fault::Pause { nodes } => format!("pause {nodes:?}"),
            Fault::Partition { groups } => format!("partition {groups:?}"),
            Fault::Netem { nodes, netem } => format!("netem {nodes:?} {netem}"),
            Fault::Demote { node, voters } => format!("demote {node} (voters {voters:?})"),
            Fault::Transfer { voters } => format!(
                "transfer-leader among {voters:?}, {}-{} ms apart",
                membership::TRANSFER_EVERY_MS.start(),
                membership::TRANSFER_EVERY_MS.end()
            ),
        }
    }
}

/// The leader as the nodes see it: asks every node concurrently and takes the leader named
/// with the highest term. `None` when no node answers with a leader.
pub async fn find_leader(http: &Http) -> Option<u64> {
    cluster_views(http)
        .await
        .into_values()
        .filter_map(|(term, leader)| Some((term, leader?)))
        .max()
        .map(|(_, leader)| leader)
}

/// Each answering node's `(term, leader_id)`.
pub async fn cluster_views(http: &Http) -> BTreeMap<u64, (u64, Option<u64>)> {
    membership::statuses(http)
        .await
        .into_iter()
        .map(|(id, s)| (id, (s.term, s.leader_id)))
        .collect()
}

/// Waits until every node in `ids` answers and all name the same leader, which is one of
/// them; returns it, or `None` when `timeout` passes first.
pub async fn await_agreed_leader(http: &Http, ids: &[u64], timeout: Duration) -> Option<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let views = cluster_views(http).await;
        let leaders: Vec<Option<u64>> = ids
            .iter()
            .map(|id| views.get(id).and_then(|(_, leader)| *leader))
            .collect();
        if let Some(Some(leader)) = leaders.first() {
            if leaders.iter().all(|l| *l == Some(*leader)) && ids.contains(leader) {
                return Some(*leader);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `node` alone; everyone else together.
pub fn isolate(ids: &[u64], node: u64) -> Vec<Vec<u64>> {
    let rest: Vec<u64> = ids.iter().copied().filter(|id| *id != node).collect();
    vec![vec![node], rest]
}

/// A random minority (⌊n/2⌋ nodes, in `order`'s first places) against the majority.
pub fn halves(order: &[u64]) -> Vec<Vec<u64>> {
    let cut = order.len() / 2;
    let mut minority = order[..cut].to_vec();
    let mut majority = order[cut..].to_vec();
    minority.sort_unstable();
    majority.sort_unstable();
    vec![minority, majority]
}

/// A majorities ring over the nodes in `order` (see the module documentation). With three
/// nodes: the line `order[0] - order[1] - order[2]`, so put the leader first.
pub fn majorities_ring(order: &[u64]) -> Vec<Vec<u64>> {
    let n = order.len();
    if n <= 3 {
        return order
            .windows(2)
            .map(|pair| {
                let mut pair = pair.to_vec();
                pair.sort_unstable();
                pair
            })
            .collect();
    }
    // Links to the `reach` nearest neighbours on each side: 1 + 2 * reach > n / 2.
    let reach = (n / 2).div_ceil(2);
    let mut groups = Vec::new();
    for i in 0..n {
        for k in 1..=reach {
            let mut pair = vec![order[i], order[(i + k) % n]];
            pair.sort_unstable();
            if !groups.contains(&pair) {
                groups.push(pair);
            }
        }
    }
    groups
}

/// Two halves joined by `order[0]`, which belongs to both.
pub fn bridge(order: &[u64]) -> Vec<Vec<u64>> {
    let Some((&bridge_node, rest)) = order.split_first() else {
        return Vec::new();
    };
    let cut = rest.len() / 2;
    let mut left: Vec<u64> = std::iter::once(bridge_node)
        .chain(rest[..cut].iter().copied())
        .collect();
    let mut right: Vec<u64> = std::iter::once(bridge_node)
        .chain(rest[cut..].iter().copied())
        .collect();
    left.sort_unstable();
    right.sort_unstable();
    vec![left, right]
}

/// Chooses the next fault of `scenario`. `leader` is the current leader, if known.
pub fn choose(
    scenario: Scenario,
    ids: &[u64],
    leader: Option<u64>,
    rng: &mut impl rand::Rng,
) -> Option<Fault> {
    let mut shuffled = ids.to_vec();
    shuffled.shuffle(rng);
    // The leader, or a random node when no leader is known (leader-biased faults).
    let target = leader
        .filter(|l| ids.contains(l))
        .unwrap_or_else(|| shuffled[0]);
    let leader_first = || {
        let mut order = vec![target];
        order.extend(shuffled.iter().copied().filter(|id| *id != target));
        order
    };
    // A follower: any node but the leader (a random one when no leader is known).
    let follower = shuffled
        .iter()
        .copied()
        .find(|id| Some(*id) != leader)
        .unwrap_or(target);
    Some(match scenario {
        Scenario::None => return None,
        Scenario::KillLeader => Fault::Kill {
            nodes: vec![target],
        },
        Scenario::KillAll => Fault::Kill {
            nodes: ids.to_vec(),
        },
        Scenario::PauseLeader => Fault::Pause {
            nodes: vec![target],
        },
        Scenario::PartitionLeader => Fault::Partition {
            groups: isolate(ids, target),
        },
        Scenario::PartitionOne => Fault::Partition {
            groups: isolate(ids, follower),
        },
        Scenario::PartitionHalves => Fault::Partition {
            groups: halves(&shuffled),
        },
        Scenario::PartitionRing => Fault::Partition {
            groups: majorities_ring(&if ids.len() <= 3 {
                leader_first()
            } else {
                shuffled.clone()
            }),
        },
        Scenario::PartitionBridge => Fault::Partition {
            groups: bridge(&shuffled),
        },
        Scenario::NetemDelay | Scenario::NetemLoss | Scenario::NetemReorder => Fault::Netem {
            nodes: ids.to_vec(),
            netem: scenario.netem()?,
        },
        Scenario::MembershipDemote => Fault::Demote {
            node: follower,
            voters: membership::without(ids, follower),
        },
        Scenario::MembershipTransfer => {
            let mut voters = ids.to_vec();
            voters.sort_unstable();
            Fault::Transfer { voters }
        }
    })
}

/// Applies `fault`; a membership change is given up on after `bound`. Returns what is worth
/// adding to the fault's description (empty for most faults).
pub async fn apply<H: Hosts>(
    hosts: &H,
    http: &Http,
    fault: &Fault,
    bound: Duration,
) -> anyhow::Result<String> {
    match fault {
        Fault::Kill { nodes } => {
            // All at once: the kills run concurrently (SIGKILL is sent before any reaping).
            let kills = nodes.iter().map(|id| hosts.kill(*id));
            for result in futures::future::join_all(kills).await {
                result?;
            }
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.pause(*id).await?;
            }
        }
        Fault::Partition { groups } => hosts.partition(groups).await?,
        Fault::Netem { nodes, netem } => hosts.impair(nodes, netem).await?,
        Fault::Demote { voters, .. } => {
            let done = membership::ensure_voters(http, voters, Instant::now() + bound).await?;
            return Ok(format!(
                "; voters {voters:?} (were {:?}; leader {})",
                done.before, done.leader
            ));
        }
        // The transfers happen while the fault holds.
        Fault::Transfer { .. } => {}
    }
    Ok(String::new())
}

/// Undoes `fault`. Returns what is worth adding to the description (empty for most faults).
pub async fn undo<H: Hosts>(hosts: &H, http: &Http, fault: &Fault) -> anyhow::Result<String> {
    match fault {
        Fault::Kill { nodes } => {
            for id in nodes {
                hosts.start(*id).await?;
            }
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.resume(*id).await?;
            }
        }
        Fault::Partition { .. } | Fault::Netem { .. } => hosts.heal().await?,
        Fault::Demote { node, voters } => {
            let mut all = voters.clone();
            all.push(*node);
            all.sort_unstable();
            let done =
                membership::ensure_voters(http, &all, Instant::now() + VOTERS_TIMEOUT).await?;
            return Ok(format!("; voters {all:?} again (leader {})", done.leader));
        }
        Fault::Transfer { .. } => {}
    }
    Ok(String::new())
}

/// One fault as the run applied it, for the results file.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    pub fault: Fault,
    /// The leader when the fault was chosen.
    pub leader: Option<u64>,
    /// Milliseconds since the history's start.
    pub start_ms: u64,
    pub stop_ms: Option<u64>,
    /// Why applying or undoing it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The leadership transfers made while it held (`membership-transfer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<membership::Move>,
}

/// The nodes a fault touches: killed, paused or impaired ones; for a partition, every node
/// that lost a link.
pub fn targets(fault: &Fault, ids: &[u64]) -> Vec<u64> {
    match fault {
        Fault::Kill { nodes } | Fault::Pause { nodes } | Fault::Netem { nodes, .. } => {
            nodes.clone()
        }
        Fault::Demote { node, .. } => vec![*node],
        Fault::Transfer { voters } => voters.clone(),
        Fault::Partition { groups } => ids
            .iter()
            .copied()
            .filter(|a| ids.iter().any(|b| !crate::hosts::connected(groups, *a, *b)))
            .collect(),
    }
}

/// Applies faults of `scenario` on the schedule of `timing` until `deadline`, recording each
/// start and stop in `history` as the nemesis process. A fault is only started when it can be
/// undone by the deadline; whatever it did is undone before this returns.
pub async fn run<H: Hosts>(
    hosts: &H,
    http: &Http,
    history: &History,
    scenario: Scenario,
    timing: Timing,
    deadline: Instant,
    seed: u64,
) -> Vec<Applied> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ids = hosts.ids();
    let mut applied = Vec::new();
    if scenario == Scenario::None {
        return applied;
    }
    loop {
        let quiet = jitter(timing.quiet, &mut rng);
        if Instant::now() + quiet + timing.hold > deadline {
            break;
        }
        tokio::time::sleep(quiet).await;
        let leader = find_leader(http).await;
        let Some(fault) = choose(scenario, &ids, leader, &mut rng) else {
            break;
        };
        let name = scenario.name();
        let touched = targets(&fault, &ids);
        let detail = format!("{} (leader: {})", fault.describe(), show(leader));
        let start_ms = history.elapsed_us() / 1000;
        say(history, &format!("start {name}: {detail}"));
        let handle = history.invoke(
            Process::Nemesis,
            None,
            Op::fault(name, Phase::Start, touched.clone()),
        );
        let mut error = None;
        match apply(hosts, http, &fault, timing.hold).await {
            Ok(extra) => {
                if !extra.is_empty() {
                    say(history, &format!("applied {name}{extra}"));
                }
                handle.ok(OpResult::Fault {
                    detail: format!("{detail}{extra}"),
                });
            }
            Err(err) => {
                say(history, &format!("cannot apply {name}: {err:#}"));
                error = Some(format!("apply: {err:#}"));
                handle.info(format!("{err:#}"));
            }
        }
        let hold_end = Instant::now() + timing.hold;
        let moves = match &fault {
            Fault::Transfer { voters } => {
                membership::transfers(http, history, voters, hold_end, &mut rng).await
            }
            _ => {
                tokio::time::sleep_until(hold_end.into()).await;
                Vec::new()
            }
        };
        let made = moves.iter().filter(|m| m.error.is_none()).count();
        if matches!(fault, Fault::Transfer { .. }) && made == 0 {
            error.get_or_insert_with(|| "no leadership transfer succeeded".to_string());
        }
        let handle = history.invoke(
            Process::Nemesis,
            None,
            Op::fault(name, Phase::Stop, touched),
        );
        match undo(hosts, http, &fault).await {
            Ok(extra) => {
                let mut detail = format!("undone: {}{extra}", fault.describe());
                if matches!(fault, Fault::Transfer { .. }) {
                    let listed: Vec<String> = moves.iter().map(|m| m.describe()).collect();
                    detail.push_str(&format!(
                        "; {} transfers, {made} ok: {}",
                        moves.len(),
                        listed.join(", ")
                    ));
                }
                handle.ok(OpResult::Fault { detail });
            }
            Err(err) => {
                say(history, &format!("cannot undo {name}: {err:#}"));
                error.get_or_insert(format!("undo: {err:#}"));
                handle.info(format!("{err:#}"));
            }
        }
        say(history, &format!("stop {name}"));
        applied.push(Applied {
            fault,
            leader,
            start_ms,
            stop_ms: Some(history.elapsed_us() / 1000),
            error,
            moves,
        });
    }
    applied
}

/// Healing's part for the membership: makes every node of `ids` a voter again (bounded by
/// [`VOTERS_TIMEOUT`]). Returns whether the voters had to change; when they did, or when they
/// could not be restored, it is recorded in the history as a stop of the fault `name`.
pub async fn heal_voters(
    http: &Http,
    history: &History,
    name: &str,
    ids: &[u64],
) -> anyhow::Result<bool> {
    let result = membership::ensure_voters(http, ids, Instant::now() + VOTERS_TIMEOUT).await;
    match &result {
        Ok(ensured) if !ensured.changed => {}
        Ok(ensured) => {
            let detail = format!(
                "healing: voters {:?} again (were {:?}; leader {})",
                ids, ensured.before, ensured.leader
            );
            say(history, &detail);
            let missing = ids
                .iter()
                .copied()
                .filter(|id| !ensured.before.contains(id))
                .collect();
            history
                .invoke(
                    Process::Nemesis,
                    None,
                    Op::fault(name, Phase::Stop, missing),
                )
                .ok(OpResult::Fault { detail });
        }
        Err(err) => {
            say(
                history,
                &format!("healing: cannot make {ids:?} voters: {err:#}"),
            );
            history
                .invoke(
                    Process::Nemesis,
                    None,
                    Op::fault(name, Phase::Stop, ids.to_vec()),
                )
                .info(format!("healing: cannot make {ids:?} voters: {err:#}"));
        }
    }
    result.map(|ensured| ensured.changed)
}

fn show(node: Option<u64>) -> String {
    node.map_or_else(|| "none".to_string(), |n| n.to_string())
}

/// A progress line, stamped with the time since the history began.
pub fn say(history: &History, text: &str) {
    eprintln!(
        "[{:>6.1}s] nemesis: {text}",
        history.elapsed_us() as f64 / 1e6
    );
}

/// Picks a seeded random number generator's next delay jitter: up to a quarter of `base`.
fn jitter(base: Duration, rng: &mut impl rand::Rng) -> Duration {
    let quarter = base.as_millis() as u64 / 4;
    if quarter == 0 {
        return base;
    }
    base + Duration::from_millis(rng.gen_range(0..=quarter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::connected;

    /// Which nodes `id` can talk to under `groups`, itself included.
    fn view(groups: &[Vec<u64>], ids: &[u64], id: u64) -> Vec<u64> {
        ids.iter()
            .copied()
            .filter(|other| connected(groups, id, *other))
            .collect()
    }

    fn assert_majorities_ring(ids: &[u64]) {
        let groups = majorities_ring(ids);
        let views: Vec<Vec<u64>> = ids.iter().map(|id| view(&groups, ids, *id)).collect();
        for (id, v) in ids.iter().zip(&views) {
            assert!(v.len() > ids.len() / 2, "node {id} sees {v:?}: no majority");
        }
        for (i, a) in views.iter().enumerate() {
            for b in &views[i + 1..] {
                assert_ne!(a, b, "two nodes see the same set with {groups:?}");
            }
        }
        assert!(
            views.iter().any(|v| v.len() < ids.len()),
            "{groups:?} cuts nothing"
        );
    }

    #[test]
    fn rings_give_every_node_a_different_majority() {
        assert_majorities_ring(&[2, 1, 3]);
        assert_majorities_ring(&[1, 2, 3, 4]);
        assert_majorities_ring(&[1, 2, 3, 4, 5]);
        assert_majorities_ring(&[5, 3, 1, 7, 2, 6, 4]);
        // Three nodes: a line with the first node (the leader) at one end.
        assert_eq!(majorities_ring(&[2, 1, 3]), vec![vec![1, 2], vec![1, 3]]);
    }

    #[test]
    fn halves_bridge_and_isolation() {
        assert_eq!(halves(&[3, 1, 2]), vec![vec![3], vec![1, 2]]);
        assert_eq!(halves(&[5, 4, 3, 2, 1]), vec![vec![4, 5], vec![1, 2, 3]]);
        assert_eq!(bridge(&[2, 3, 1]), vec![vec![2, 3], vec![1, 2]]);
        assert_eq!(bridge(&[3, 1, 2, 4, 5]), vec![vec![1, 2, 3], vec![3, 4, 5]]);
        assert_eq!(isolate(&[1, 2, 3], 2), vec![vec![2], vec![1, 3]]);
    }

    #[test]
    fn leader_faults_target_the_leader() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let ids = [1, 2, 3];
        assert_eq!(
            choose(Scenario::KillLeader, &ids, Some(2), &mut rng),
            Some(Fault::Kill { nodes: vec![2] })
        );
        assert_eq!(
            choose(Scenario::PartitionLeader, &ids, Some(3), &mut rng),
            Some(Fault::Partition {
                groups: vec![vec![3], vec![1, 2]]
            })
        );
        let Some(Fault::Partition { groups }) =
            choose(Scenario::PartitionRing, &ids, Some(1), &mut rng)
        else {
            panic!("a ring is a partition");
        };
        // The leader keeps a link to exactly one follower.
        assert_eq!(view(&groups, &ids, 1).len(), 2);
        assert_eq!(choose(Scenario::None, &ids, Some(1), &mut rng), None);
        assert!(matches!(
            choose(Scenario::KillLeader, &ids, None, &mut rng),
            Some(Fault::Kill { nodes }) if nodes.len() == 1
        ));
    }

    #[test]
    fn partition_one_isolates_a_follower_never_the_leader() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let ids = [1, 2, 3];
        let mut isolated = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let Some(Fault::Partition { groups }) =
                choose(Scenario::PartitionOne, &ids, Some(2), &mut rng)
            else {
                panic!("partition-one is a partition");
            };
            assert_eq!(groups.len(), 2, "{groups:?}");
            assert_eq!(groups[0].len(), 1, "one node alone: {groups:?}");
            assert_ne!(groups[0], vec![2], "the leader was isolated");
            assert!(groups[1].contains(&2), "the leader keeps its majority");
            isolated.insert(groups[0][0]);
        }
        // Both followers get their turn.
        assert_eq!(isolated.into_iter().collect::<Vec<_>>(), vec![1, 3]);
        // No leader known: still one node alone.
        let Some(Fault::Partition { groups }) =
            choose(Scenario::PartitionOne, &ids, None, &mut rng)
        else {
            panic!("partition-one is a partition");
        };
        assert_eq!(groups[0].len(), 1);
        assert_eq!(Scenario::PartitionOne.fault(), "partition");
    }

    #[test]
    fn netem_scenarios_impair_every_node() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let ids = [1, 2, 3];
        for scenario in [
            Scenario::NetemDelay,
            Scenario::NetemLoss,
            Scenario::NetemReorder,
        ] {
            let netem = scenario
                .netem()
                .expect("a netem scenario has an impairment");
            assert!(netem.validate().is_ok(), "{scenario}: {netem}");
            assert_eq!(scenario.fault(), "netem");
            let fault = choose(scenario, &ids, Some(1), &mut rng);
            assert_eq!(
                fault,
                Some(Fault::Netem {
                    nodes: vec![1, 2, 3],
                    netem
                })
            );
            let fault = fault.unwrap_or(Fault::Kill { nodes: vec![] });
            assert_eq!(targets(&fault, &ids), vec![1, 2, 3]);
            assert!(fault.describe().starts_with("netem [1, 2, 3] "));
        }
        assert_eq!(Scenario::NetemLoss.netem().map(|n| n.loss_pct), Some(10));
        assert_eq!(Scenario::KillLeader.netem(), None);
        // Every scenario is in the matrix once, under its own name.
        let names: std::collections::BTreeSet<&str> =
            Scenario::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Scenario::ALL.len());
        assert!(names.contains("partition-one") && names.contains("netem-reorder"));
        assert!(names.contains("membership-demote") && names.contains("membership-transfer"));
    }

    #[test]
    fn demote_takes_a_follower_out_of_the_voters() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let ids = [1, 2, 3];
        let mut demoted = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let Some(Fault::Demote { node, voters }) =
                choose(Scenario::MembershipDemote, &ids, Some(3), &mut rng)
            else {
                panic!("membership-demote is a demotion");
            };
            assert_ne!(node, 3, "the leader was demoted");
            assert_eq!(voters.len(), 2, "{voters:?}");
            assert!(!voters.contains(&node) && voters.contains(&3), "{voters:?}");
            let fault = Fault::Demote {
                node,
                voters: voters.clone(),
            };
            assert_eq!(targets(&fault, &ids), vec![node]);
            assert_eq!(
                fault.describe(),
                format!("demote {node} (voters {voters:?})")
            );
            demoted.insert(node);
        }
        assert_eq!(demoted.into_iter().collect::<Vec<_>>(), vec![1, 2]);
        // No leader known: still one node out of three.
        let Some(Fault::Demote { voters, .. }) =
            choose(Scenario::MembershipDemote, &ids, None, &mut rng)
        else {
            panic!("membership-demote is a demotion");
        };
        assert_eq!(voters.len(), 2);
        assert!(Scenario::MembershipDemote.changes_membership());
        assert!(!Scenario::PartitionOne.changes_membership());
    }

    #[test]
    fn transfer_moves_among_every_node() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let fault = choose(Scenario::MembershipTransfer, &[3, 1, 2], Some(1), &mut rng);
        assert_eq!(
            fault,
            Some(Fault::Transfer {
                voters: vec![1, 2, 3]
            })
        );
        let fault = fault.unwrap_or(Fault::Kill { nodes: vec![] });
        assert_eq!(targets(&fault, &[1, 2, 3]), vec![1, 2, 3]);
        assert!(fault
            .describe()
            .starts_with("transfer-leader among [1, 2, 3]"));
        for scenario in [Scenario::MembershipDemote, Scenario::MembershipTransfer] {
            assert_eq!(scenario.fault(), "membership");
            assert_eq!(scenario.netem(), None);
        }
        // The fault as the results file shows it.
        let json = serde_json::to_value(Fault::Demote {
            node: 2,
            voters: vec![1, 3],
        })
        .unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"kind": "demote", "node": 2, "voters": [1, 3]})
        );
    }
}
