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
//! | `corrupt-minority` | one node (the leader half of the time, else a random other) SIGKILLed, its data directory copied aside, then one or two of its newest non-empty files damaged: the write-ahead log (`db/*.log`), the table file (`db/*.sst`) or the Raft log segment (`log/*.seg`) alone, or the write-ahead log and the table file, the segment and the table file, or the segment and the write-ahead log (a sixth of the time each; a kind with no file is replaced by another kind), each file either with 1–4 bytes flipped at a random point of the first 90 % of what was written of it (a segment's preallocated zeros after its last frame are left alone) or cut to a random length of that (half of the time each); the nodes run with 64 KiB memtables, so that a short run has table files | start it after the hold and watch it: it refuses (exits; its log must say "is damaged"), or starts and catches up (a rejoin when its log says "is damaged", else a silent start: noted as a finding); when it refused, put the copy back and start it again |
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

mod apply;
mod check;
mod choose;
pub mod clock;
pub mod disk;
pub mod membership;
mod run;

pub use apply::{apply, undo};
pub use check::{check_faults, targets, Applied, FaultCheck};
pub use choose::{
    alternate, await_agreed_leader, bridge, choose, cluster_views, find_leader, halves, isolate,
    majorities_ring,
};
use run::show;
pub use run::{heal_voters, run, say};

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

#[cfg(test)]
#[path = "nemesis_tests.rs"]
mod tests;
