//! A raftq cluster as separate hosts with their own addresses.
//!
//! The nemeses and the workloads see only the [`Hosts`] trait. Two implementations:
//! - [`netns::NetnsHosts`] (the default): one Linux network namespace per node, joined by veth
//!   pairs to a bridge in the root namespace, where the harness runs; each node is a child
//!   process of the harness.
//! - [`docker::DockerHosts`]: one container per node on a private Docker network, from an
//!   image the harness builds at setup out of the server binary and the shared libraries it
//!   loads (no registry needed). For machines where containers are the norm, or to run the
//!   nodes under a container runtime's process and filesystem isolation.
//!
//! Either way each node has its own IP address and its own network namespace, so the network
//! faults are the same code ([`net`]): a partition is a set of iptables rules inside the
//! nodes' namespaces that cuts exactly the links it names (a one-way cut drops one direction of
//! a link only), and an impairment (delay, jitter,
//! loss, reordering) is a netem qdisc on a node's interface, or, on kernels without netem, a
//! userspace packet queue that does the same ([`nfqueue`]).
//!
//! Scenarios that need more than a namespace ask for it when the hosts are made
//! ([`NodeEnv`]): fault disks under the nodes' data directories ([`Hosts::disk`],
//! [`Hosts::power_loss`]) and fake wall clocks ([`Hosts::set_clock`]). The namespace hosts
//! provide both; the Docker hosts neither (those faults fail, and the run with them).
//!
//! # Modules
//! - [`net`]: what both share: running commands, entering a node's namespace, partition rules,
//!   impairments, the root namespace's FORWARD rule.
//! - [`nfqueue`]: the userspace impairment (NFQUEUE) used when the kernel has no netem qdisc.
//! - [`netns`], [`docker`]: the two kinds of hosts.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub mod docker;
mod layout;
pub mod net;
pub mod netns;
pub mod nfqueue;

/// What the nemeses and workloads need from a cluster of hosts. Implemented by Linux network
/// namespaces with veth pairs and by containers on a private Docker network.
pub trait Hosts: Send + Sync {
    /// Node ids, lowest first.
    fn ids(&self) -> Vec<u64>;
    /// The base URL of node `id`, as the harness (in the root namespace) reaches it.
    fn url(&self, id: u64) -> String;
    /// Starts node `id` (again) with its data directory and the same command line.
    fn start(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// SIGKILLs node `id` and waits until it is gone.
    fn kill(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// SIGKILLs every running node at once (one signal for all where the hosts can: no node
    /// outlives another by the time it takes to signal it) and waits until they are all gone.
    /// Returns how it was done, for the fault's description.
    fn kill_all(&self) -> impl Future<Output = anyhow::Result<String>> + Send;
    /// Freezes node `id` (SIGSTOP, or the container's cgroup freezer).
    fn pause(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Thaws node `id`.
    fn resume(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Cuts the network so that nodes talk only within their group (iptables inside each
    /// host's namespace). Groups may overlap (a bridge node, a majorities ring).
    fn partition(&self, groups: &[Vec<u64>]) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Impairs every packet the nodes `ids` send on their network interface as `netem` says
    /// (delay with jitter, loss, reordering). Replaces an earlier impairment of those nodes.
    fn impair(&self, ids: &[u64], netem: &Netem)
        -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Drops every packet `from` sends to `to`, in one direction only, for each `(from, to)` of
    /// `links` (at the receiver: what `to` receives from `from` is dropped; what `to` sends to
    /// `from` still arrives). Replaces earlier one-way cuts; a partition in force stays.
    fn cut_oneway(&self, links: &[(u64, u64)]) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Removes every network fault: partitions, one-way cuts and impairments.
    fn heal(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Stops node `id` gracefully (SIGTERM, SIGKILL after a grace period) and says how it
    /// ended: `exit status: N` when it exited by itself, `not running` when it was not.
    fn stop(&self, id: u64) -> impl Future<Output = anyhow::Result<String>> + Send;
    /// Everything node `id` logged.
    fn log(&self, id: u64) -> String;
    /// Kills every node and removes everything the hosts created on this machine. Idempotent;
    /// implementations also run it on drop.
    fn teardown(&self);

    /// True while the harness believes node `id` runs (started and not killed; a paused node
    /// runs).
    fn is_running(&self, id: u64) -> bool;

    /// Node `id`'s data directory on this machine (for damaging its files while it is down).
    fn data_dir(&self, id: u64) -> PathBuf;
    /// How node `id` last ended, when it exited on its own rather than by the harness's hand
    /// (`exit status: 70`); `None` while it runs, or when the harness killed or stopped it.
    fn exit_status(&self, id: u64) -> Option<String>;
    /// The fault controls of the file system under node `id`'s data directory: an error when
    /// the hosts did not put the node on a fault disk ([`NodeEnv::fault_disks`]), or cannot.
    fn disk(&self, id: u64) -> anyhow::Result<raftq_faultfs::Control>;
    /// Power loss of the nodes `ids`: syncs still waiting on their disks are made to never
    /// complete, the nodes are SIGKILLed (every node of the hosts: one signal to the nodes'
    /// process group), and as soon as they are dead (or after a short wait for threads stuck
    /// in such a sync) every unsynced write on their disks is dropped; then they are reaped and
    /// the fsync delay is zero again. What each disk lost, by node.
    fn power_loss(&self, ids: &[u64]) -> impl Future<Output = anyhow::Result<PowerLoss>> + Send;
    /// Steps node `id`'s wall clock to `offset_ms` away from the true time (its monotonic
    /// clock is not touched): an error when the hosts did not start the node under a fake
    /// clock ([`NodeEnv::fake_clock`]), or cannot.
    fn set_clock(&self, id: u64, offset_ms: i64) -> anyhow::Result<()>;
    /// The ids of the nodes that run, lowest first.
    fn running_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| self.is_running(*id))
            .collect()
    }
}

/// The cluster secret every node is started with (written to the run directory's
/// `cluster.secret`); the harness sends it to read a node's `/raft/status`.
pub const CLUSTER_SECRET: &str = "raftq-jepsen-cluster-secret-0c4e5b7a91";
/// The header that carries the cluster secret.
pub const SECRET_HEADER: &str = "x-raftq-cluster-secret";

/// Where libfaketime usually is (Debian's `libfaketime` package, by architecture; a source
/// build's default prefix).
pub const FAKETIME_CANDIDATES: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The first of [`FAKETIME_CANDIDATES`] that exists.
pub fn find_faketime() -> Option<PathBuf> {
    FAKETIME_CANDIDATES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(Path::to_path_buf)
}

/// What the nodes run on besides their own namespace, for the scenarios that need it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeEnv {
    /// Every node's data directory is a fault disk of its own ([`raftq_faultfs`]), mounted at
    /// setup over a backing directory beside it and unmounted at teardown.
    pub fault_disks: bool,
    /// Every node runs under libfaketime (this library), its wall clock at the true time until
    /// [`Hosts::set_clock`] moves it.
    pub fake_clock: Option<PathBuf>,
    /// With a fake clock, step the monotonic clock along with the wall clock: a fault no server
    /// can mask, which makes its stamps jump; only to show that the clock checks can fail.
    pub fake_monotonic: bool,
    /// RocksDB's memtable size for every node (`--write-buffer-bytes`; default: the server's).
    /// Small memtables are flushed within seconds, so that a short run already has table
    /// files (`.sst`) for a fault to damage.
    pub write_buffer_bytes: Option<u64>,
    /// Every node builds a snapshot every this many log entries and keeps a fifth of them
    /// behind it (`--snapshot-logs`, `--snapshot-keep-logs`; default: the server's).
    pub snapshot_logs: Option<u64>,
}

/// What one disk lost in a power loss.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dropped {
    /// Files restored to their synced content.
    pub files: u64,
    /// Unsynced bytes they had (written since their last sync, and lost).
    pub bytes: u64,
    /// Syncs that were still waiting and failed instead of completing.
    pub failed_fsyncs: u64,
}

/// What a power loss did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PowerLoss {
    /// How the nodes were killed.
    pub how: String,
    /// What each node's disk lost.
    pub dropped: BTreeMap<u64, Dropped>,
}

impl PowerLoss {
    /// Unsynced bytes lost on every disk together.
    pub fn bytes(&self) -> u64 {
        self.dropped.values().map(|d| d.bytes).sum()
    }
}

/// Which pairs of nodes may talk under `groups`: two nodes may when some group holds both.
/// A node in no group talks to nobody. Symmetric; a node always "talks" to itself.
pub fn connected(groups: &[Vec<u64>], a: u64, b: u64) -> bool {
    a == b
        || groups
            .iter()
            .any(|group| group.contains(&a) && group.contains(&b))
}

/// An impairment of the packets a node sends, as netem describes it. Applied to everything
/// the node sends on its interface (to the other nodes and to the clients); loopback is not
/// touched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Netem {
    /// Delay added to every packet, in milliseconds.
    pub delay_ms: u32,
    /// Each packet's delay varies uniformly by up to this much either way (never below 0).
    /// Packets whose delays cross overtake each other.
    pub jitter_ms: u32,
    /// Percent of packets dropped.
    pub loss_pct: u8,
    /// Percent of packets sent at once, ahead of the delayed ones (needs a delay).
    pub reorder_pct: u8,
}

/// Correlation of netem's reordering decisions (percent): reordered packets come in short runs.
const REORDER_CORRELATION_PCT: u8 = 50;

impl Netem {
    /// Checks that the impairment makes sense (percentages, reordering needs a delay).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.loss_pct > 100 || self.reorder_pct > 100 {
            anyhow::bail!("netem percentages are 0 to 100: {self}");
        }
        if self.reorder_pct > 0 && self.delay_ms == 0 {
            anyhow::bail!("netem reordering needs a delay to reorder against: {self}");
        }
        if *self == Netem::default() {
            anyhow::bail!("a netem impairment that changes nothing");
        }
        Ok(())
    }

    /// The arguments after `tc qdisc replace dev <dev> root`: `netem delay 50ms 25ms loss 10%`.
    pub fn tc_args(&self) -> Vec<String> {
        let mut args = vec!["netem".to_string()];
        if self.delay_ms > 0 {
            args.extend(["delay".to_string(), format!("{}ms", self.delay_ms)]);
            if self.jitter_ms > 0 {
                args.push(format!("{}ms", self.jitter_ms));
            }
        }
        if self.loss_pct > 0 {
            args.extend(["loss".to_string(), format!("{}%", self.loss_pct)]);
        }
        if self.reorder_pct > 0 {
            args.extend([
                "reorder".to_string(),
                format!("{}%", self.reorder_pct),
                format!("{REORDER_CORRELATION_PCT}%"),
            ]);
        }
        args
    }

    /// What happens to one packet: `None` drops it, otherwise it leaves after the delay.
    /// `roll` draws uniformly from `[0, 1)`. The userspace impairment's version of netem (no
    /// correlation between packets).
    pub fn fate(&self, mut roll: impl FnMut() -> f64) -> Option<std::time::Duration> {
        if roll() * 100.0 < f64::from(self.loss_pct) {
            return None;
        }
        if self.reorder_pct > 0 && roll() * 100.0 < f64::from(self.reorder_pct) {
            return Some(std::time::Duration::ZERO);
        }
        let jitter = f64::from(self.jitter_ms) * (2.0 * roll() - 1.0);
        let ms = (f64::from(self.delay_ms) + jitter).max(0.0);
        Some(std::time::Duration::from_micros((ms * 1000.0) as u64))
    }
}

impl std::fmt::Display for Netem {
    /// `delay 50ms±25ms loss 10% reorder 25%` (the parts that are set).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.delay_ms > 0 || self.jitter_ms > 0 {
            parts.push(format!("delay {}ms±{}ms", self.delay_ms, self.jitter_ms));
        }
        if self.loss_pct > 0 {
            parts.push(format!("loss {}%", self.loss_pct));
        }
        if self.reorder_pct > 0 {
            parts.push(format!("reorder {}%", self.reorder_pct));
        }
        if parts.is_empty() {
            parts.push("nothing".to_string());
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_groups_connect_pairwise() {
        let bridge = vec![vec![1, 2], vec![2, 3]];
        assert!(connected(&bridge, 1, 2));
        assert!(connected(&bridge, 2, 3));
        assert!(!connected(&bridge, 1, 3));
        assert!(connected(&bridge, 3, 3));
        let isolated = vec![vec![1], vec![2, 3]];
        assert!(!connected(&isolated, 1, 2));
        assert!(connected(&isolated, 2, 3));
        assert!(!connected(&[vec![2, 3]], 1, 2));
    }

    #[test]
    fn netem_as_tc_arguments() {
        let delay = Netem {
            delay_ms: 50,
            jitter_ms: 25,
            ..Netem::default()
        };
        assert_eq!(delay.tc_args().join(" "), "netem delay 50ms 25ms");
        assert_eq!(delay.to_string(), "delay 50ms±25ms");
        let all = Netem {
            delay_ms: 20,
            jitter_ms: 0,
            loss_pct: 10,
            reorder_pct: 25,
        };
        assert_eq!(
            all.tc_args().join(" "),
            "netem delay 20ms loss 10% reorder 25% 50%"
        );
        assert!(all.validate().is_ok());
        let loss = Netem {
            loss_pct: 15,
            ..Netem::default()
        };
        assert_eq!(loss.tc_args().join(" "), "netem loss 15%");
        assert!(Netem::default().validate().is_err());
        assert!(Netem {
            reorder_pct: 10,
            ..Netem::default()
        }
        .validate()
        .is_err());
        assert!(Netem {
            loss_pct: 101,
            ..Netem::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn netem_fates_follow_the_settings() {
        let netem = Netem {
            delay_ms: 50,
            jitter_ms: 25,
            loss_pct: 10,
            reorder_pct: 20,
        };
        // Rolls: below 10% drops; then below 20% goes at once; then the jitter roll.
        assert_eq!(netem.fate(|| 0.05), None);
        let mut rolls = [0.5, 0.1].into_iter();
        assert_eq!(
            netem.fate(|| rolls.next().unwrap_or(0.0)),
            Some(std::time::Duration::ZERO)
        );
        let mut rolls = [0.5, 0.5, 0.0].into_iter();
        assert_eq!(
            netem.fate(|| rolls.next().unwrap_or(0.0)),
            Some(std::time::Duration::from_millis(25))
        );
        let mut rolls = [0.5, 0.5, 0.5].into_iter();
        assert_eq!(
            netem.fate(|| rolls.next().unwrap_or(0.0)),
            Some(std::time::Duration::from_millis(50))
        );
        // Jitter larger than the delay never gives a negative delay.
        let wide = Netem {
            delay_ms: 10,
            jitter_ms: 30,
            ..Netem::default()
        };
        assert_eq!(wide.fate(|| 0.0), Some(std::time::Duration::ZERO));
    }
}
