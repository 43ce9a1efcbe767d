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
//! | `kill-restart-leader` | SIGKILL the current leader (a random node when none is known) | restart at once (no hold) |
//! | `kill-all` | SIGKILL every node at once: one signal to the nodes' process group (netns; one `docker kill` of every container with Docker) | restart all after the hold |
//! | `pause-leader` | freeze the leader (SIGSTOP; `docker pause`) for longer than the election timeout (1.2 s) | thaw |
//! | `partition-leader` | the leader alone, the others together | heal |
//! | `partition-one` | one follower alone (a random node when no leader is known), the others together | heal |
//! | `partition-halves` | a random minority against the majority | heal |
//! | `partition-ring` | majorities ring: every node sees a majority, no two the same | heal |
//! | `partition-bridge` | two halves joined by one node that sees both | heal |
//! | `partition-oneway` | one direction of one link cut: between the leader and a random follower (a random pair when no leader is known), either what the leader sends to the follower or what the follower sends to the leader is dropped (chosen at random each time), at the receiver; the other direction still arrives | heal |
//! | `netem-delay` | every node's packets delayed 20 ms ± 10 ms | heal |
//! | `netem-loss` | 10 % of every node's packets dropped | heal |
//! | `netem-reorder` | every node's packets delayed 20 ms ± 5 ms, a quarter of them sent at once, ahead of the others | heal |
//! | `membership-demote` | one follower (a random one) demoted to learner: the voters are the other two | the voters are all nodes again |
//! | `membership-transfer` | leadership moved to a random other voter (`transfer-leader`), again 1–2 s after each transfer | nothing to undo |
//! | `membership-kill` | one follower (a random one) demoted to learner as in `membership-demote`, and 0–400 ms after the request is sent (while the change is in flight, or right after it) a random node SIGKILLed: the leader half of the time, else one of the others (the demoted node included) | restart the killed node after the hold; the voters are all nodes again |
//! | `powerloss-all` | power loss of every node: one SIGKILL to the nodes' process group, and every write their disks had not fsynced dropped, before any node is reaped | restart all after the hold |
//! | `powerloss-leader` | the leader's fsyncs take 200–300 ms each for 0.8–1.2 s (its followers commit entries its own disk has not synced yet), then power loss of the leader alone (syncs still waiting never complete) | restart it: at once on the first fault and every other one after (no hold: within the others' election timeout of 600–1200 ms), after the hold on the others |
//! | `corrupt-minority` | one node (the leader half of the time, else a random other) SIGKILLed, its data directory copied aside, then its newest write-ahead log and/or newest table file (a third of the time each, else both) damaged: 1–4 bytes flipped at a random point of the file's first 90 %, or the file cut to a random length (half of the time each); the nodes run with 64 KiB memtables, so that a short run has table files | start it after the hold and watch it: it refuses (exits; its log must say "is damaged"), or starts and catches up (a rejoin when its log says "is damaged", else a silent start: noted as a finding); when it refused, put the copy back and start it again |
//! | `clock-jump` | the leader's wall clock stepped 5 s to 10 min (log-uniform), ahead or behind at random | step it back to the true time |
//! | `clock-strobe` | the leader's wall clock stepped to +X (X as for `clock-jump`), then flipped between +X and −X every 100–500 ms while the fault holds | step it back to the true time |
//! | `disk-full` | one node's (a random one) disk limited to 16–256 KiB more than its files take | lift the limit; restart the node if it stopped |
//! | `slow-fsync` | every fsync of one node's disk (the leader's half of the time) stalls 1–3 s | a delay of zero (the waiting syncs complete) |
//!
//! # Disks and clocks
//! The power-loss, full-disk and slow-fsync scenarios need every node on a fault disk, the
//! clock scenarios every node under a fake clock ([`Scenario::needs_fault_disks`],
//! [`Scenario::needs_fake_clock`], [`crate::hosts::NodeEnv`]); only those scenarios get them.
//! Hosts that cannot provide them (Docker) fail such a fault, and the run with it. What a
//! fault found (bytes a power loss dropped, how a damaged node started, how a node with a full
//! disk ended, each clock step as measured on the node) is its [`Outcome`]: in the results
//! file, and in the table's notes where it matters ([`check_faults`]). A node that refuses to
//! start on damaged data without saying so is `damage_unreported`; one that starts on damaged
//! data is noted, as a rejoin when it said its data "is damaged", else as a silent start (the
//! checkers then judge whether that lost anything). With a FUSE fault disk a
//! stalled fsync holds the file's inode lock, so a slow fsync also stalls that node's writes
//! to the same file (its write-ahead log) for the delay.
//!
//! The netem faults impair everything a node sends, to the other nodes and to the clients
//! (see [`crate::hosts::Hosts::impair`]). They are sized so that the cluster keeps making
//! progress, more slowly: they test timeouts, retries and the classification of slow answers,
//! not loss of quorum. The bound is the Raft replication timeout, which is the heartbeat
//! interval (100 ms): a round trip between two nodes (twice the one-way delay) plus a
//! follower's fsync must fit in it, or replication stalls until the impairment ends (with
//! 50 ms ± 25 ms each way it does, completely).
//!
//! # One-way partitions
//! `partition-oneway` drops the packets of one direction of one link, at the receiving node
//! (iptables INPUT, by source address), and nothing else: if the leader cannot hear a follower,
//! the follower still hears the leader; if the follower cannot hear the leader, the leader still
//! hears the follower. TCP needs both directions, so connections across the cut stall rather
//! than fail: a connection opened from the side that can send gets its SYN through and never
//! sees the answer; on a connection already open, requests one way still arrive (a follower
//! keeps receiving heartbeats it cannot acknowledge). That is the fault: one node sees a peer
//! that is deaf to it.
//!
//! # Faults must happen
//! Every fault of a run is listed in the results with the error of applying or undoing it;
//! the run's verdict counts them: a fault that could not be applied or undone is
//! `fault_not_applied`, and a scenario other than `none` that applied no fault at all is
//! `no_fault`; both make the run invalid. The default timings fit at least one fault into 10
//! s (the quiet time with its jitter of up to a quarter, plus the hold).
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

use anyhow::Context as _;
use rand::seq::SliceRandom as _;
use rand::SeedableRng as _;
use serde::Serialize;

use crate::history::{History, Op, OpResult, Phase, Process};
use crate::hosts::{Hosts, Netem};
use crate::workload::http::Http;

pub mod clock;
pub mod disk;
pub mod membership;

/// How long undoing a demotion (or healing) may take to make every node a voter again.
pub const VOTERS_TIMEOUT: Duration = Duration::from_secs(30);
/// `membership-kill`: how long after the demotion is asked for the kill comes, in
/// milliseconds (uniformly drawn): from in the middle of the change to just after it.
pub const DEMOTE_KILL_DELAY_MS: std::ops::RangeInclusive<u64> = 0..=400;
/// `powerloss-leader`: each fsync of the leader's disk takes this long (ms) during the slow
/// phase, so that its followers commit entries its own disk has not synced yet.
pub const SLOW_FSYNC_MS: std::ops::RangeInclusive<u64> = 200..=300;
/// `powerloss-leader`: how long the slow phase before the power loss lasts (ms).
pub const SLOW_PHASE_MS: std::ops::RangeInclusive<u64> = 800..=1200;
/// `slow-fsync`: each fsync of the node's disk stalls this long (ms) while the fault holds.
pub const STALL_FSYNC_MS: std::ops::RangeInclusive<u64> = 1000..=3000;
/// `disk-full`: the space left on the node's disk when the limit is set (bytes).
pub const DISK_FULL_SLACK: std::ops::RangeInclusive<u64> = 16 * 1024..=256 * 1024;

/// Which fault a run applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum Scenario {
    /// No fault: the baseline.
    None,
    KillLeader,
    KillRestartLeader,
    KillAll,
    PauseLeader,
    PartitionLeader,
    PartitionOne,
    PartitionHalves,
    PartitionRing,
    PartitionBridge,
    PartitionOneway,
    NetemDelay,
    NetemLoss,
    NetemReorder,
    MembershipDemote,
    MembershipTransfer,
    MembershipKill,
    PowerlossAll,
    PowerlossLeader,
    CorruptMinority,
    ClockJump,
    ClockStrobe,
    DiskFull,
    SlowFsync,
}

impl Scenario {
    /// Every scenario, in the matrix's order.
    pub const ALL: [Scenario; 24] = [
        Scenario::None,
        Scenario::KillLeader,
        Scenario::KillRestartLeader,
        Scenario::KillAll,
        Scenario::PauseLeader,
        Scenario::PartitionLeader,
        Scenario::PartitionOne,
        Scenario::PartitionHalves,
        Scenario::PartitionRing,
        Scenario::PartitionBridge,
        Scenario::PartitionOneway,
        Scenario::NetemDelay,
        Scenario::NetemLoss,
        Scenario::NetemReorder,
        Scenario::MembershipDemote,
        Scenario::MembershipTransfer,
        Scenario::MembershipKill,
        Scenario::PowerlossAll,
        Scenario::PowerlossLeader,
        Scenario::CorruptMinority,
        Scenario::ClockJump,
        Scenario::ClockStrobe,
        Scenario::DiskFull,
        Scenario::SlowFsync,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::None => "none",
            Scenario::KillLeader => "kill-leader",
            Scenario::KillRestartLeader => "kill-restart-leader",
            Scenario::KillAll => "kill-all",
            Scenario::PauseLeader => "pause-leader",
            Scenario::PartitionLeader => "partition-leader",
            Scenario::PartitionOne => "partition-one",
            Scenario::PartitionHalves => "partition-halves",
            Scenario::PartitionRing => "partition-ring",
            Scenario::PartitionBridge => "partition-bridge",
            Scenario::PartitionOneway => "partition-oneway",
            Scenario::NetemDelay => "netem-delay",
            Scenario::NetemLoss => "netem-loss",
            Scenario::NetemReorder => "netem-reorder",
            Scenario::MembershipDemote => "membership-demote",
            Scenario::MembershipTransfer => "membership-transfer",
            Scenario::MembershipKill => "membership-kill",
            Scenario::PowerlossAll => "powerloss-all",
            Scenario::PowerlossLeader => "powerloss-leader",
            Scenario::CorruptMinority => "corrupt-minority",
            Scenario::ClockJump => "clock-jump",
            Scenario::ClockStrobe => "clock-strobe",
            Scenario::DiskFull => "disk-full",
            Scenario::SlowFsync => "slow-fsync",
        }
    }

    /// The fault's kind as the results table shows it.
    pub fn fault(self) -> &'static str {
        match self {
            Scenario::None => "-",
            Scenario::KillLeader | Scenario::KillRestartLeader | Scenario::KillAll => "kill -9",
            Scenario::PauseLeader => "SIGSTOP",
            Scenario::NetemDelay | Scenario::NetemLoss | Scenario::NetemReorder => "netem",
            Scenario::MembershipDemote | Scenario::MembershipTransfer => "membership",
            Scenario::MembershipKill => "membership + kill -9",
            Scenario::PowerlossAll | Scenario::PowerlossLeader => "power loss",
            Scenario::CorruptMinority => "damaged files",
            Scenario::ClockJump | Scenario::ClockStrobe => "clock",
            Scenario::DiskFull => "full disk",
            Scenario::SlowFsync => "slow fsync",
            _ => "partition",
        }
    }

    /// True for the scenarios whose nodes need fault disks under their data directories.
    pub fn needs_fault_disks(self) -> bool {
        matches!(
            self,
            Scenario::PowerlossAll
                | Scenario::PowerlossLeader
                | Scenario::DiskFull
                | Scenario::SlowFsync
        )
    }

    /// True for the scenarios whose nodes run under a fake wall clock; their workload also
    /// holds leases for a while and writes to a topic with retention by age, so that an early
    /// expiry or deletion can be seen (see [`crate::workload::Settings::clock_checks`]).
    pub fn needs_fake_clock(self) -> bool {
        matches!(self, Scenario::ClockJump | Scenario::ClockStrobe)
    }

    /// How long applying one fault takes beyond the hold (the slow phase of
    /// `powerloss-leader`), for the schedule.
    pub fn apply_time(self) -> Duration {
        match self {
            Scenario::PowerlossLeader => Duration::from_millis(*SLOW_PHASE_MS.end() + 500),
            _ => Duration::ZERO,
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
            Scenario::MembershipDemote | Scenario::MembershipTransfer | Scenario::MembershipKill
        )
    }

    /// Default timing: the quiet time before each fault and how long a fault holds.
    pub fn default_timing(self) -> Timing {
        let (quiet, hold) = match self {
            Scenario::None => (0, 0),
            Scenario::KillLeader => (3000, 3000),
            // No hold: the killed leader is started again at once.
            Scenario::KillRestartLeader => (2000, 0),
            Scenario::KillAll => (4000, 2000),
            Scenario::MembershipKill => (3000, 3000),
            // Longer than the election timeout (1.2 s): the others elect a new leader while
            // the old one is frozen, and it wakes up deposed.
            Scenario::PauseLeader => (3000, 3000),
            // As kill-all: the nodes come back after the hold.
            Scenario::PowerlossAll => (4000, 2000),
            // Every other fault has no hold at all (see `Fault::PowerLossLeader`).
            Scenario::PowerlossLeader => (3000, 3000),
            // The node is down for the hold; then it is started and watched.
            Scenario::CorruptMinority => (3000, 2000),
            Scenario::ClockJump | Scenario::ClockStrobe => (3000, 5000),
            Scenario::DiskFull | Scenario::SlowFsync => (3000, 5000),
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
    /// SIGKILL every node with one signal ([`Hosts::kill_all`]); undone by starting them all.
    KillAll { nodes: Vec<u64> },
    /// SIGSTOP these nodes; undone by SIGCONT.
    Pause { nodes: Vec<u64> },
    /// Nodes talk only within their groups; undone by healing.
    Partition { groups: Vec<Vec<u64>> },
    /// What `from` sends to `to` is dropped (one direction only); undone by healing.
    Oneway { from: u64, to: u64 },
    /// What these nodes send is impaired; undone by healing.
    Netem { nodes: Vec<u64>, netem: Netem },
    /// `node` is demoted to learner: `voters` (the others) become the complete set of voters;
    /// undone by making every node a voter again.
    Demote { node: u64, voters: Vec<u64> },
    /// While the fault holds, leadership moves to a random other voter of `voters`, again 1–2 s
    /// after each transfer; nothing to undo.
    Transfer { voters: Vec<u64> },
    /// `node` is demoted to learner (`voters` become the complete set) and `delay_ms` after
    /// the request is sent, `kill` is SIGKILLed; undone by starting `kill` again and making
    /// every node a voter again.
    DemoteKill {
        node: u64,
        voters: Vec<u64>,
        kill: u64,
        delay_ms: u64,
    },
    /// Power loss of every node ([`Hosts::power_loss`]: one SIGKILL to the nodes' process
    /// group, then every disk's unsynced writes dropped); undone by starting them all.
    PowerLossAll { nodes: Vec<u64> },
    /// `node`'s fsyncs take `fsync_delay_ms` each for `slow_ms`, then power loss of `node`
    /// alone; undone by starting it: at once when `at_once` (no hold: within the others'
    /// election timeout), else after the hold.
    PowerLossLeader {
        node: u64,
        fsync_delay_ms: u64,
        slow_ms: u64,
        at_once: bool,
    },
    /// `node` SIGKILLed, its data directory copied aside, then its files damaged as `plan`
    /// says ([`disk::damage`]); undone by starting it and watching it refuse or catch up; when
    /// it refused, its pre-damage copy is put back and it is started again.
    Corrupt { node: u64, plan: Vec<disk::Damage> },
    /// `node`'s wall clock stepped `offset_ms` away from the true time; undone by stepping it
    /// back.
    ClockJump { node: u64, offset_ms: i64 },
    /// `node`'s wall clock stepped to `+amplitude_ms`, then flipped between `+amplitude_ms`
    /// and `-amplitude_ms` every 100–500 ms while the fault holds; undone by stepping it back
    /// to the true time.
    ClockStrobe { node: u64, amplitude_ms: u64 },
    /// `node`'s disk limited to `slack` bytes above what its files take now; undone by lifting
    /// the limit, and starting the node when it stopped.
    DiskFull { node: u64, slack: u64 },
    /// Every fsync of `node`'s disk stalls `delay_ms`; undone by a delay of zero.
    SlowFsync { node: u64, delay_ms: u64 },
}

/// What a fault did, as found while applying and undoing it (the results file's `outcome`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    PowerLoss(disk::PowerLossOutcome),
    Damage(disk::DamageOutcome),
    Clock(clock::ClockOutcome),
    DiskFull(disk::DiskFullOutcome),
    SlowFsync(disk::SlowFsyncOutcome),
}

impl Fault {
    /// A short text for logs and the history, e.g. `partition [[1],[2,3]]`.
    pub fn describe(&self) -> String {
        match self {
            Fault::Kill { nodes } => format!("kill {nodes:?}"),
            Fault::KillAll { nodes } => format!("kill-all {nodes:?}"),
            Fault::Oneway { from, to } => format!("drop {from}->{to} (one way)"),
            Fault::DemoteKill {
                node,
                voters,
                kill,
                delay_ms,
            } => format!("demote {node} (voters {voters:?}), kill {kill} {delay_ms} ms later"),
            Fault::Pause { nodes } => format!("pause {nodes:?}"),
            Fault::Partition { groups } => format!("partition {groups:?}"),
            Fault::Netem { nodes, netem } => format!("netem {nodes:?} {netem}"),
            Fault::Demote { node, voters } => format!("demote {node} (voters {voters:?})"),
            Fault::Transfer { voters } => format!(
                "transfer-leader among {voters:?}, {}-{} ms apart",
                membership::TRANSFER_EVERY_MS.start(),
                membership::TRANSFER_EVERY_MS.end()
            ),
            Fault::PowerLossAll { nodes } => format!("power loss {nodes:?}"),
            Fault::PowerLossLeader {
                node,
                fsync_delay_ms,
                slow_ms,
                at_once,
            } => format!(
                "power loss [{node}] after {slow_ms} ms of {fsync_delay_ms} ms fsyncs, restarted {}",
                if *at_once { "at once" } else { "after the hold" }
            ),
            Fault::Corrupt { node, plan } => {
                let parts: Vec<String> = plan
                    .iter()
                    .map(|d| match d {
                        disk::Damage::Flip {
                            file,
                            at_permille,
                            masks,
                        } => format!(
                            "flip {} byte(s) of the newest {file:?} at {}.{}%",
                            masks.len(),
                            at_permille / 10,
                            at_permille % 10
                        ),
                        disk::Damage::Truncate { file, to_permille } => format!(
                            "cut the newest {file:?} to {}.{}%",
                            to_permille / 10,
                            to_permille % 10
                        ),
                    })
                    .collect();
                format!("kill {node}, damage its files ({})", parts.join(", "))
            }
            Fault::ClockJump { node, offset_ms } => {
                format!("clock of {node} stepped {offset_ms:+} ms")
            }
            Fault::ClockStrobe { node, amplitude_ms } => format!(
                "clock of {node} flipping between +{amplitude_ms} and -{amplitude_ms} ms every \
                 {}-{} ms",
                clock::STROBE_EVERY_MS.start(),
                clock::STROBE_EVERY_MS.end()
            ),
            Fault::DiskFull { node, slack } => {
                format!("disk of {node} full ({slack} bytes left)")
            }
            Fault::SlowFsync { node, delay_ms } => {
                format!("fsyncs of {node} stall {delay_ms} ms each")
            }
        }
    }

    /// How long the fault holds: `default`, but nothing for a power loss of the leader that
    /// restarts it at once.
    pub fn hold(&self, default: Duration) -> Duration {
        match self {
            Fault::PowerLossLeader { at_once: true, .. } => Duration::ZERO,
            _ => default,
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
        Scenario::KillLeader | Scenario::KillRestartLeader => Fault::Kill {
            nodes: vec![target],
        },
        Scenario::KillAll => Fault::KillAll {
            nodes: ids.to_vec(),
        },
        Scenario::PartitionOneway => {
            // The leader and a follower, one of the two directions at random.
            let other = follower;
            if rng.gen_bool(0.5) {
                Fault::Oneway {
                    from: target,
                    to: other,
                }
            } else {
                Fault::Oneway {
                    from: other,
                    to: target,
                }
            }
        }
        Scenario::MembershipKill => {
            // The leader half of the time, else another node (the demoted one included).
            let others: Vec<u64> = shuffled
                .iter()
                .copied()
                .filter(|id| Some(*id) != leader)
                .collect();
            let kill = match leader.filter(|l| ids.contains(l)) {
                Some(l) if rng.gen_bool(0.5) || others.is_empty() => l,
                _ => *others.choose(rng).unwrap_or(&target),
            };
            Fault::DemoteKill {
                node: follower,
                voters: membership::without(ids, follower),
                kill,
                delay_ms: rng.gen_range(DEMOTE_KILL_DELAY_MS),
            }
        }
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
        Scenario::PowerlossAll => Fault::PowerLossAll {
            nodes: ids.to_vec(),
        },
        Scenario::PowerlossLeader => Fault::PowerLossLeader {
            node: target,
            fsync_delay_ms: rng.gen_range(SLOW_FSYNC_MS),
            slow_ms: rng.gen_range(SLOW_PHASE_MS),
            at_once: true,
        },
        Scenario::CorruptMinority => Fault::Corrupt {
            node: leader_or_other(ids, leader, &shuffled, rng),
            plan: disk::Damage::plan(rng),
        },
        Scenario::ClockJump => {
            let step = clock::step_ms(rng) as i64;
            Fault::ClockJump {
                node: target,
                offset_ms: if rng.gen_bool(0.5) { step } else { -step },
            }
        }
        Scenario::ClockStrobe => Fault::ClockStrobe {
            node: target,
            amplitude_ms: clock::step_ms(rng),
        },
        Scenario::DiskFull => Fault::DiskFull {
            node: shuffled[0],
            slack: rng.gen_range(DISK_FULL_SLACK),
        },
        Scenario::SlowFsync => Fault::SlowFsync {
            node: leader_or_other(ids, leader, &shuffled, rng),
            delay_ms: rng.gen_range(STALL_FSYNC_MS),
        },
    })
}

/// The leader half of the time (when one is known), else a random other node.
fn leader_or_other(
    ids: &[u64],
    leader: Option<u64>,
    shuffled: &[u64],
    rng: &mut impl rand::Rng,
) -> u64 {
    let others: Vec<u64> = shuffled
        .iter()
        .copied()
        .filter(|id| Some(*id) != leader)
        .collect();
    match leader.filter(|l| ids.contains(l)) {
        Some(l) if rng.gen_bool(0.5) || others.is_empty() => l,
        _ => *others.choose(rng).unwrap_or(&shuffled[0]),
    }
}

/// The `nth` fault of a run (from 0), as the run applies it: a power loss of the leader
/// restarts it at once every other time, the first time included.
pub fn alternate(mut fault: Fault, nth: usize) -> Fault {
    if let Fault::PowerLossLeader { at_once, .. } = &mut fault {
        *at_once = nth.is_multiple_of(2);
    }
    fault
}

/// Applies `fault`; a membership change is given up on after `bound`. Returns what is worth
/// adding to the fault's description (empty for most faults); what it found goes to `outcome`.
pub async fn apply<H: Hosts>(
    hosts: &H,
    http: &Http,
    fault: &Fault,
    bound: Duration,
    outcome: &mut Option<Outcome>,
) -> anyhow::Result<String> {
    match fault {
        Fault::PowerLossAll { nodes } => {
            let loss = hosts.power_loss(nodes).await?;
            let text = format!("; {}; {}", loss.how, lost_text(&loss.dropped));
            *outcome = Some(Outcome::PowerLoss(disk::PowerLossOutcome {
                bytes: loss.bytes(),
                dropped: loss.dropped,
                ..disk::PowerLossOutcome::default()
            }));
            return Ok(text);
        }
        Fault::PowerLossLeader {
            node,
            fsync_delay_ms,
            slow_ms,
            ..
        } => {
            let disk = hosts.disk(*node)?;
            let before = disk.stats().fsyncs;
            disk.set_fsync_delay(Some(Duration::from_millis(*fsync_delay_ms)));
            tokio::time::sleep(Duration::from_millis(*slow_ms)).await;
            let stats = disk.stats();
            let loss = hosts.power_loss(&[*node]).await;
            // The power loss sets it back; this is for when it failed before.
            disk.set_fsync_delay(None);
            let loss = loss?;
            let slow = stats.fsyncs.saturating_sub(before);
            let text = format!(
                "; {}; {} ({} syncs asked for while slow, {} waiting at the end)",
                loss.how,
                lost_text(&loss.dropped),
                slow,
                stats.pending_fsyncs
            );
            *outcome = Some(Outcome::PowerLoss(disk::PowerLossOutcome {
                bytes: loss.bytes(),
                dropped: loss.dropped,
                pending_fsyncs: Some(stats.pending_fsyncs),
                slow_fsyncs: Some(slow),
            }));
            return Ok(text);
        }
        Fault::Corrupt { node, plan } => {
            hosts.kill(*node).await?;
            let data = hosts.data_dir(*node);
            let copy = disk::copy_path(&data);
            let plan = plan.clone();
            let (copied, damaged) = tokio::task::spawn_blocking({
                let (data, copy) = (data.clone(), copy.clone());
                move || -> anyhow::Result<(u64, Vec<disk::Damaged>)> {
                    let _ = std::fs::remove_dir_all(&copy);
                    disk::copy_tree(&data, &copy)?;
                    let copied = std::fs::read_dir(copy.join("db")).map_or(0, |d| d.count());
                    let damaged = disk::damage(&data, &plan)?;
                    disk::verify_damage(&data, &copy, &damaged)?;
                    Ok((copied as u64, damaged))
                }
            })
            .await??;
            let parts: Vec<String> = damaged
                .iter()
                .map(|d| format!("{} ({} bytes) {}", d.file, d.size, d.what))
                .collect();
            let text = format!(
                "; killed {node}; copied its data directory aside ({copied} files in db/); {}",
                parts.join("; ")
            );
            *outcome = Some(Outcome::Damage(disk::DamageOutcome {
                node: *node,
                damaged,
                start: None,
                after_restore: None,
                copy,
            }));
            return Ok(text);
        }
        Fault::ClockJump { node, offset_ms } => {
            let measured = clock::step(hosts, http, *node, *offset_ms).await?;
            *outcome = Some(Outcome::Clock(clock::ClockOutcome {
                node: *node,
                offset_ms: *offset_ms,
                measured_ms: Some(measured),
                ..clock::ClockOutcome::default()
            }));
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::ClockStrobe { node, amplitude_ms } => {
            let offset = *amplitude_ms as i64;
            let measured = clock::step(hosts, http, *node, offset).await?;
            *outcome = Some(Outcome::Clock(clock::ClockOutcome {
                node: *node,
                offset_ms: offset,
                measured_ms: Some(measured),
                ..clock::ClockOutcome::default()
            }));
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::DiskFull { node, slack } => {
            let disk = hosts.disk(*node)?;
            let log_mark = hosts.log(*node).len();
            // Setting a limit counts the space used anew.
            disk.set_space_limit(Some(u64::MAX));
            let stats = disk.stats();
            let limit = stats.space_used + slack;
            disk.set_space_limit(Some(limit));
            *outcome = Some(Outcome::DiskFull(disk::DiskFullOutcome {
                node: *node,
                used: stats.space_used,
                limit,
                enospc: stats.enospc,
                log_mark,
                ..disk::DiskFullOutcome::default()
            }));
            return Ok(format!(
                "; node {node}'s files take {} bytes; limit {limit}",
                stats.space_used
            ));
        }
        Fault::SlowFsync { node, delay_ms } => {
            let disk = hosts.disk(*node)?;
            let before = disk.stats().fsyncs;
            disk.set_fsync_delay(Some(Duration::from_millis(*delay_ms)));
            *outcome = Some(Outcome::SlowFsync(disk::SlowFsyncOutcome {
                node: *node,
                delay_ms: *delay_ms,
                fsyncs_before: before,
                ..disk::SlowFsyncOutcome::default()
            }));
        }
        Fault::Kill { nodes } => {
            // All at once: the kills run concurrently (SIGKILL is sent before any reaping).
            let kills = nodes.iter().map(|id| hosts.kill(*id));
            for result in futures::future::join_all(kills).await {
                result?;
            }
        }
        Fault::KillAll { .. } => {
            let how = hosts.kill_all().await?;
            return Ok(format!("; {how}"));
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.pause(*id).await?;
            }
        }
        Fault::Partition { groups } => hosts.partition(groups).await?,
        Fault::Oneway { from, to } => hosts.cut_oneway(&[(*from, *to)]).await?,
        Fault::Netem { nodes, netem } => hosts.impair(nodes, netem).await?,
        Fault::DemoteKill {
            voters,
            kill,
            delay_ms,
            ..
        } => {
            // The demotion is asked for, and the kill comes while it is in flight or just
            // after; the demotion may then not happen (its leader died), which is part of the
            // fault, so only the kill must succeed.
            let demote = membership::ensure_voters(http, voters, Instant::now() + bound);
            let killing = async {
                tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
                hosts.kill(*kill).await
            };
            let (demoted, killed) = tokio::join!(demote, killing);
            killed.with_context(|| format!("cannot kill node {kill}"))?;
            let outcome = match demoted {
                Ok(done) => format!(
                    "voters {voters:?} (were {:?}; leader {})",
                    done.before, done.leader
                ),
                Err(err) => format!("demotion not confirmed: {err:#}"),
            };
            return Ok(format!("; killed {kill}; {outcome}"));
        }
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

/// What the disks lost, in words: `node 1 lost 1234 bytes (3 files), node 2 ...`.
fn lost_text(dropped: &BTreeMap<u64, crate::hosts::Dropped>) -> String {
    let parts: Vec<String> = dropped
        .iter()
        .map(|(id, d)| {
            let mut text = format!(
                "node {id} lost {} unsynced bytes ({} files)",
                d.bytes, d.files
            );
            if d.failed_fsyncs > 0 {
                text.push_str(&format!(", {} waiting syncs failed", d.failed_fsyncs));
            }
            text
        })
        .collect();
    parts.join(", ")
}

/// Undoes `fault`. Returns what is worth adding to the description (empty for most faults);
/// what it found goes to `outcome`.
pub async fn undo<H: Hosts>(
    hosts: &H,
    http: &Http,
    fault: &Fault,
    outcome: &mut Option<Outcome>,
) -> anyhow::Result<String> {
    match fault {
        Fault::PowerLossAll { nodes } => {
            for id in nodes {
                hosts.start(*id).await?;
            }
        }
        Fault::PowerLossLeader { node, .. } => hosts.start(*node).await?,
        Fault::Corrupt { node, .. } => {
            let Some(Outcome::Damage(done)) = outcome.as_mut() else {
                // Nothing was damaged: only the kill is to undo.
                hosts.start(*node).await?;
                return Ok(format!("; started {node}"));
            };
            return undo_damage(hosts, http, *node, done).await;
        }
        Fault::ClockJump { node, .. } | Fault::ClockStrobe { node, .. } => {
            let measured = clock::step(hosts, http, *node, 0).await?;
            if let Some(Outcome::Clock(c)) = outcome.as_mut() {
                c.restored_ms = Some(measured);
            }
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::DiskFull { node, .. } => {
            let disk = hosts.disk(*node)?;
            let stats = disk.stats();
            disk.set_space_limit(None);
            let mut text = String::new();
            let mut refused = true;
            if let Some(Outcome::DiskFull(d)) = outcome.as_mut() {
                d.enospc = stats.enospc.saturating_sub(d.enospc);
                refused = d.enospc > 0;
                text = format!("; {} writes refused for want of space", d.enospc);
                if !hosts.is_running(*node) {
                    let log = hosts.log(*node);
                    let since = log.get(d.log_mark..).unwrap_or(&log);
                    d.exit = Some(
                        hosts
                            .exit_status(*node)
                            .unwrap_or_else(|| "exited (status unknown)".into()),
                    );
                    d.message = Some(disk::log_excerpt(since, disk::NO_SPACE));
                    text.push_str(&format!(
                        "; node {node} had stopped ({}); started again",
                        d.exit.as_deref().unwrap_or_default()
                    ));
                } else {
                    text.push_str(&format!("; node {node} still ran"));
                }
            }
            hosts.start(*node).await?;
            if !refused {
                anyhow::bail!(
                    "no write was refused for want of space while the limit held: the disk \
                     never filled up{text}"
                );
            }
            return Ok(text);
        }
        Fault::SlowFsync { node, .. } => {
            let disk = hosts.disk(*node)?;
            let stats = disk.stats();
            disk.set_fsync_delay(None);
            if let Some(Outcome::SlowFsync(d)) = outcome.as_mut() {
                d.fsyncs = stats.fsyncs.saturating_sub(d.fsyncs_before);
                d.pending_at_end = stats.pending_fsyncs;
                if d.fsyncs == 0 {
                    anyhow::bail!("node {node} asked for no fsync while they were slow");
                }
                return Ok(format!(
                    "; {} syncs asked for while slow, {} still waiting",
                    d.fsyncs, d.pending_at_end
                ));
            }
        }
        Fault::Kill { nodes } | Fault::KillAll { nodes } => {
            for id in nodes {
                hosts.start(*id).await?;
            }
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.resume(*id).await?;
            }
        }
        Fault::Partition { .. } | Fault::Oneway { .. } | Fault::Netem { .. } => {
            hosts.heal().await?
        }
        Fault::DemoteKill { kill, .. } => {
            hosts.start(*kill).await?;
            let all = hosts.ids();
            let done =
                membership::ensure_voters(http, &all, Instant::now() + VOTERS_TIMEOUT).await?;
            return Ok(format!(
                "; started {kill}; voters {all:?} again (leader {})",
                done.leader
            ));
        }
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

/// Undoes a `corrupt-minority` fault: starts the node on its damaged data and watches it;
/// when it refuses, puts its pre-damage copy back and starts it again.
async fn undo_damage<H: Hosts>(
    hosts: &H,
    http: &Http,
    node: u64,
    done: &mut disk::DamageOutcome,
) -> anyhow::Result<String> {
    let first = disk::observe_start(hosts, http, node).await?;
    done.start = Some(first.clone());
    let mut text = match &first {
        disk::Start::Started {
            caught_up,
            says_damaged,
            detail,
        } => format!(
            "; node {node} started on its damaged data, {} ({}: {detail})",
            if *says_damaged {
                "saying it is damaged"
            } else {
                "without a word about it"
            },
            if *caught_up {
                "caught up"
            } else {
                "not caught up"
            }
        ),
        disk::Start::Refused { exit, message, .. } => {
            format!("; node {node} refused to start ({exit}): {message}")
        }
    };
    if first.refused() {
        let (data, copy) = (hosts.data_dir(node), done.copy.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            disk::clear_dir(&data)?;
            disk::copy_tree(&copy, &data)
        })
        .await??;
        let again = disk::observe_start(hosts, http, node).await?;
        done.after_restore = Some(again.clone());
        match &again {
            disk::Start::Refused { exit, message, .. } => anyhow::bail!(
                "node {node} refused to start on its pre-damage copy too ({exit}): {message} \
                 (the copy stays at {})",
                done.copy.display()
            ),
            disk::Start::Started {
                caught_up, detail, ..
            } => text.push_str(&format!(
                "; put its pre-damage copy back: started ({}: {detail})",
                if *caught_up {
                    "caught up"
                } else {
                    "not caught up"
                }
            )),
        }
    }
    let _ = std::fs::remove_dir_all(&done.copy);
    Ok(text)
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
    /// Whether applying it succeeded (it happened).
    pub applied: bool,
    /// Why applying or undoing it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The leadership transfers made while it held (`membership-transfer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<membership::Move>,
    /// What the fault did, as found while applying and undoing it (power loss, damage, clock,
    /// full disk, slow fsync).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// What a run's faults say about the run itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCheck {
    /// Faults that could not be applied or undone, each as `description: error`.
    pub not_applied: Vec<String>,
    /// The scenario has a fault, and not one was applied.
    pub no_fault: bool,
    /// Nodes that refused to start on damaged data without saying that their data "is
    /// damaged" (`damage_unreported`, a broken promise): each as `node N at T ms: message`.
    pub damage_unreported: Vec<String>,
    /// Starts on damaged data: refused (the node exited), rejoined (it started, said its data
    /// is damaged, and caught up from the others), and silent (it started on damaged data
    /// without a word about it: a finding to look at; the checkers then judge whether anything
    /// was lost).
    pub damage_refused: u64,
    pub damage_rejoined: u64,
    pub damage_silent: u64,
    /// What the faults did that is worth a line in the table's notes.
    pub notes: Vec<String>,
}

/// Judges the faults of a run of `scenario`: every fault must have been applied and undone
/// (`fault_not_applied`), and a scenario other than `none` must have applied at least one
/// (`no_fault`).
pub fn check_faults(scenario: Scenario, faults: &[Applied]) -> FaultCheck {
    let mut check = FaultCheck {
        not_applied: faults
            .iter()
            .filter_map(|f| {
                f.error
                    .as_ref()
                    .map(|e| format!("{} at {} ms: {e}", f.fault.describe(), f.start_ms))
            })
            .collect(),
        no_fault: scenario != Scenario::None && !faults.iter().any(|f| f.applied),
        ..FaultCheck::default()
    };
    let mut lost_bytes = Vec::new();
    for f in faults {
        let at = f.start_ms;
        match &f.outcome {
            Some(Outcome::Damage(d)) => match &d.start {
                Some(disk::Start::Refused {
                    exit,
                    message,
                    says_damaged,
                }) => {
                    check.damage_refused += 1;
                    check.notes.push(format!(
                        "damage at {at} ms: node {} refused to start ({exit}): {message}",
                        d.node
                    ));
                    if !says_damaged {
                        check
                            .damage_unreported
                            .push(format!("node {} at {at} ms: {message}", d.node));
                    }
                }
                Some(disk::Start::Started {
                    caught_up,
                    says_damaged,
                    detail,
                }) => {
                    let files: Vec<String> = d
                        .damaged
                        .iter()
                        .map(|x| format!("{} {}", x.file, x.what))
                        .collect();
                    let how = if *says_damaged {
                        check.damage_rejoined += 1;
                        "rejoined: started, said its data is damaged,"
                    } else {
                        check.damage_silent += 1;
                        "STARTED on damaged data without a word about it"
                    };
                    check.notes.push(format!(
                        "damage at {at} ms: node {} {how} ({}) and {} ({detail})",
                        d.node,
                        files.join(", "),
                        if *caught_up {
                            "caught up"
                        } else {
                            "did not catch up"
                        }
                    ));
                }
                None => {}
            },
            Some(Outcome::DiskFull(d)) => check.notes.push(match &d.exit {
                Some(exit) => format!(
                    "disk full at {at} ms: node {} stopped ({exit}; {} writes refused): {}",
                    d.node,
                    d.enospc,
                    d.message.as_deref().unwrap_or_default()
                ),
                None => format!(
                    "disk full at {at} ms: node {} still ran when the limit was lifted ({} writes \
                     refused)",
                    d.node, d.enospc
                ),
            }),
            Some(Outcome::PowerLoss(p)) => lost_bytes.push(p.bytes.to_string()),
            _ => {}
        }
    }
    if !lost_bytes.is_empty() {
        check.notes.push(format!(
            "power loss: unsynced bytes lost per fault: {}",
            lost_bytes.join(", ")
        ));
    }
    check
}

/// The nodes a fault touches: killed, paused or impaired ones; for a partition, every node
/// that lost a link.
pub fn targets(fault: &Fault, ids: &[u64]) -> Vec<u64> {
    match fault {
        Fault::Kill { nodes }
        | Fault::KillAll { nodes }
        | Fault::Pause { nodes }
        | Fault::Netem { nodes, .. } => nodes.clone(),
        Fault::Demote { node, .. } => vec![*node],
        Fault::Oneway { from, to } => {
            let mut both = vec![*from, *to];
            both.sort_unstable();
            both
        }
        Fault::DemoteKill { node, kill, .. } => {
            let mut both = vec![*node, *kill];
            both.sort_unstable();
            both.dedup();
            both
        }
        Fault::Transfer { voters } => voters.clone(),
        Fault::PowerLossAll { nodes } => nodes.clone(),
        Fault::PowerLossLeader { node, .. }
        | Fault::Corrupt { node, .. }
        | Fault::ClockJump { node, .. }
        | Fault::ClockStrobe { node, .. }
        | Fault::DiskFull { node, .. }
        | Fault::SlowFsync { node, .. } => vec![*node],
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
        if Instant::now() + quiet + timing.hold + scenario.apply_time() > deadline {
            break;
        }
        tokio::time::sleep(quiet).await;
        let leader = find_leader(http).await;
        let Some(fault) = choose(scenario, &ids, leader, &mut rng) else {
            break;
        };
        let fault = alternate(fault, applied.len());
        let mut outcome = None;
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
        let mut applied_ok = false;
        match apply(hosts, http, &fault, timing.hold, &mut outcome).await {
            Ok(extra) => {
                applied_ok = true;
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
        let hold_end = Instant::now() + fault.hold(timing.hold);
        let moves = match &fault {
            Fault::Transfer { voters } => {
                membership::transfers(http, history, voters, hold_end, &mut rng).await
            }
            Fault::ClockStrobe { node, amplitude_ms } if applied_ok => {
                let (flips, failed) =
                    clock::strobe(hosts, *node, *amplitude_ms as i64, hold_end, &mut rng).await;
                if let Some(Outcome::Clock(c)) = outcome.as_mut() {
                    c.flips = flips;
                }
                if let Some(failed) = failed {
                    say(history, &format!("strobe of {name} stopped: {failed}"));
                    error.get_or_insert(format!("strobe: {failed}"));
                }
                Vec::new()
            }
            _ => {
                tokio::time::sleep_until(hold_end.into()).await;
                Vec::new()
            }
        };
        let made = moves.iter().filter(|m| m.error.is_none()).count();
        if matches!(fault, Fault::Transfer { .. }) && made == 0 {
            applied_ok = false;
            error.get_or_insert_with(|| "no leadership transfer succeeded".to_string());
        }
        let handle = history.invoke(
            Process::Nemesis,
            None,
            Op::fault(name, Phase::Stop, touched),
        );
        match undo(hosts, http, &fault, &mut outcome).await {
            Ok(extra) => {
                if !extra.is_empty() {
                    say(history, &format!("undone {name}{extra}"));
                }
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
            applied: applied_ok,
            error,
            moves,
            outcome,
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
#[path = "nemesis_tests.rs"]
mod tests;
