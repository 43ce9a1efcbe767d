//! Hosts as Linux network namespaces on this machine.
//!
//! # Layout
//! ```text
//!   root namespace (the harness)            namespace rqj-n1        namespace rqj-n2 ...
//!   bridge rqj0  10.231.0.254/24  ──veth──  eth0 10.231.0.1/24      eth0 10.231.0.2/24
//!                                 ──veth──────────────────────────────┘
//! ```
//! - One bridge in the root namespace (`<prefix>0`, address `.254`), one namespace per node
//!   (`<prefix>-nN`) with a veth pair into the bridge, the node's address `.N` and loopback up.
//! - Every node runs `raftq serve` inside its namespace through `ip netns exec` (which execs,
//!   so the child's pid is the server's), listening on `<subnet>.N:<port>`, with its data
//!   directory `nodeN/` and its log `nodeN.log` (appended across restarts, each start marked)
//!   under the run directory.
//! - When bridged traffic goes through the root namespace's iptables (`br_netfilter`, as with
//!   Docker, whose FORWARD policy is DROP), one `ACCEPT` rule for traffic within the bridge is
//!   inserted at the top of the root namespace's FORWARD chain, tagged with a comment, and
//!   removed at teardown. Nothing else in the root namespace changes.
//!
//! # Process group
//! Every node process belongs to one process group, led by a sentinel (a child of the harness
//! that only sleeps): the sentinel is spawned in a group of its own, and each node joins that
//! group as it starts (`process_group(pgid)`). `kill_all` is then one `kill(-pgid, SIGKILL)`:
//! every node dies by the same signal at the same instant, as in a power cut, instead of one
//! after the other. The sentinel dies with them and a new one (a new group) is made at the next
//! start. The group is not the terminal's, so a Ctrl-C reaches the harness only, which then
//! tears everything down in order.
//!
//! # Faults
//! - `kill`: SIGKILL and reap; `kill_all`: one SIGKILL to the nodes' process group, then reap
//!   each; `pause`/`resume`: SIGSTOP/SIGCONT.
//! - `partition(groups)`, `cut_oneway(links)` and `impair(ids, netem)`: inside the namespaces, as [`super::net`]
//!   describes (iptables rules, a netem qdisc or the userspace queue). Only node-to-node links
//!   are cut: the harness at `.254` still reaches every node. That models clients that sit on
//!   every side of the partition (each client talks to the nodes of its side; a client can
//!   still talk to a minority node, which must then refuse writes or serve only committed
//!   reads). `heal` removes every network fault (the namespaces are the harness's own; no
//!   other rules live there).
//!
//! # Fault disks and fake clocks
//! With [`NodeEnv::fault_disks`], every node's data directory `nodeN/` is a fault disk
//! ([`raftq_faultfs`], served by this process) over the backing directory `nodeN.disk/`, which
//! holds what a real disk would; mounted at setup, before any node starts, and unmounted at
//! teardown, after every node is dead. [`Hosts::power_loss`] kills the nodes and drops what
//! their disks had not synced; [`Hosts::disk`] hands out a disk's controls (fsync delay, space
//! limit). With [`NodeEnv::fake_clock`], every node runs under libfaketime (`LD_PRELOAD`),
//! reading its offset from `nodeN.faketime` on every call of the wall clock (no cache), with
//! its monotonic clock left alone; [`Hosts::set_clock`] rewrites that file (atomically: a new
//! file renamed over the old). libfaketime leaves a shared-memory segment per process in
//! `/dev/shm` when the process is killed; the harness removes those of the nodes it reaps.
//!
//! # Cleanup
//! Setup first removes whatever an earlier run with the same names left behind (processes in
//! the namespaces, the namespaces, the bridge, veths, the FORWARD rule), so it is idempotent.
//! [`Hosts::teardown`] (also run on drop) SIGKILLs every node, unmounts the fault disks and
//! removes everything again.
//! Needs root, `ip` (iproute2) and `iptables`; impairments use `tc` (iproute2) when the kernel
//! has netem.
//!
//! # Modules
//! - `setup`: setting up and removing what the hosts are made of: the bridge, namespaces and
//!   veths, the fault disks, the clock files.
//! - `process`: the node processes: starting one, the sentinel of their process group,
//!   signals, killing and reaping.
//! - This module: the configuration (names, addresses, paths), making the hosts
//!   ([`NetnsHosts::create`]) and the [`Hosts`] implementation.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use raftq_faultfs::{Control, FaultFs, FOREVER};

use super::layout::{validate, Layout};
use super::net::{have, lock, require_root, NetFaults, NetNs, NodeNet};
use super::{Dropped, Hosts, Netem, NodeEnv, PowerLoss};

mod process;
mod setup;

use process::{forget_fake_clock, has_died, kill_namespace_processes, reap, signal};
use setup::{create_network, mount_disks, remove_network, write_clock_file};

pub use setup::faketime_offset;

/// Address of the bridge (the harness's side) in the subnet.
const BRIDGE_HOST: u8 = 254;
/// How long a graceful stop waits before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a power loss waits for the killed nodes to die before it drops their unsynced
/// writes anyway: a thread waiting for a sync that will never complete dies only once the
/// drop fails that sync.
const DEATH_WAIT: Duration = Duration::from_millis(100);

/// How to lay out the hosts.
#[derive(Debug, Clone)]
pub struct NetnsConfig {
    /// The `raftq` server binary.
    pub bin: PathBuf,
    /// Where data directories, logs and the secret file go.
    pub run_dir: PathBuf,
    /// Number of nodes (ids 1..=nodes), at most 250.
    pub nodes: u64,
    /// The private /24 the hosts live in: its first three octets, e.g. `[10, 231, 0]`.
    pub subnet: [u8; 3],
    /// Name prefix of the bridge (`<prefix>0`), namespaces (`<prefix>-nN`) and veths.
    /// At most 8 characters (interface names are limited to 15).
    pub prefix: String,
    /// The port every node listens on, on its own address.
    pub port: u16,
    /// `--cluster-id` of the cluster.
    pub cluster_id: String,
    /// `RAFTQ_LOG` filter of the nodes.
    pub log_filter: String,
    /// Fault disks and fake clocks, for the scenarios that need them.
    pub env: NodeEnv,
}

impl NetnsConfig {
    /// Three nodes in 10.231.0.0/24, names `rqj*`, port 7000.
    pub fn new(bin: PathBuf, run_dir: PathBuf) -> Self {
        NetnsConfig {
            bin,
            run_dir,
            nodes: 3,
            subnet: [10, 231, 0],
            prefix: "rqj".to_string(),
            port: 7000,
            cluster_id: "jepsen".to_string(),
            log_filter: "info".to_string(),
            env: NodeEnv::default(),
        }
    }

    fn bridge(&self) -> String {
        format!("{}0", self.prefix)
    }

    /// The namespace of node `id`.
    pub fn netns(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// The root-namespace end of node `id`'s veth pair.
    fn veth_root(&self, id: u64) -> String {
        format!("{}-v{id}", self.prefix)
    }

    /// The other end, before it moves into the namespace (renamed `eth0` there).
    fn veth_peer(&self, id: u64) -> String {
        format!("{}-p{id}", self.prefix)
    }

    /// The nodes' addresses, URLs and files.
    fn layout(&self) -> Layout<'_> {
        Layout::new(&self.run_dir, self.nodes, self.subnet, self.port)
    }

    /// The address of node `id`.
    pub fn node_addr(&self, id: u64) -> Ipv4Addr {
        self.layout().node_addr(id)
    }

    /// The harness's address on the bridge.
    pub fn bridge_addr(&self) -> Ipv4Addr {
        self.layout().addr(BRIDGE_HOST)
    }

    /// What a fault disk shows at `data_dir(id)` lives here.
    pub fn disk_backing(&self, id: u64) -> PathBuf {
        self.layout().node_file(id, ".disk")
    }

    /// The file libfaketime reads node `id`'s clock offset from.
    fn clock_file(&self, id: u64) -> PathBuf {
        self.layout().node_file(id, ".faketime")
    }

    fn validate(&self) -> anyhow::Result<()> {
        validate(self.nodes, &self.prefix)
    }
}

/// One node process.
#[derive(Default)]
struct Node {
    child: Option<Child>,
    /// How often it was started, to mark each start in its log.
    starts: u32,
    /// How it ended the last time it exited on its own (not killed or stopped by the harness).
    exited: Option<String>,
}

/// A cluster of `raftq` nodes in network namespaces. See the module documentation.
pub struct NetnsHosts {
    cfg: Arc<NetnsConfig>,
    nodes: Mutex<BTreeMap<u64, Node>>,
    /// The sentinel that leads the nodes' process group (its pid is the group's id), while
    /// it lives. Locked after `nodes` when both are.
    sentinel: Mutex<Option<Child>>,
    faults: Arc<NetFaults>,
    /// The fault disks, by node (with [`NodeEnv::fault_disks`]).
    disks: Mutex<BTreeMap<u64, FaultFs>>,
    torn_down: AtomicBool,
}

/// Checks what the namespaces need: root, `ip` and `iptables`.
pub fn preflight() -> anyhow::Result<()> {
    require_root(
        "the network-namespace hosts (they create namespaces, a bridge, veth pairs and \
         iptables rules)",
    )?;
    for program in ["ip", "iptables"] {
        if !have(program, "-V") {
            bail!(
                "`{program}` not found; install iproute2 and iptables \
                 (apt-get install iproute2 iptables), or run scripts/chaos.sh, which does"
            );
        }
    }
    Ok(())
}

impl NetnsHosts {
    /// Checks the machine, removes leftovers of an earlier run with the same names, creates
    /// the bridge, namespaces and veths, and writes the secret file. Starts no node.
    pub fn create(cfg: NetnsConfig) -> anyhow::Result<NetnsHosts> {
        cfg.validate()?;
        preflight()?;
        cfg.layout().prepare(&cfg.bin)?;
        if let Some(lib) = &cfg.env.fake_clock {
            if !lib.is_file() {
                bail!(
                    "libfaketime not found at {}: install Debian's faketime package \
                     (apt-get install faketime), or run scripts/chaos.sh, which does",
                    lib.display()
                );
            }
            for id in 1..=cfg.nodes {
                write_clock_file(&cfg.clock_file(id), 0)?;
            }
        }
        remove_network(&cfg);
        let hosts = NetnsHosts {
            nodes: Mutex::new((1..=cfg.nodes).map(|id| (id, Node::default())).collect()),
            sentinel: Mutex::new(None),
            cfg: Arc::new(cfg),
            faults: Arc::new(NetFaults::default()),
            disks: Mutex::new(BTreeMap::new()),
            torn_down: AtomicBool::new(false),
        };
        // On failure, `hosts` drops here and removes what was made so far.
        create_network(&hosts.cfg).context("cannot set up the network namespaces")?;
        if hosts.cfg.env.fault_disks {
            *lock(&hosts.disks) = mount_disks(&hosts.cfg)?;
        }
        Ok(hosts)
    }

    /// The configuration.
    pub fn config(&self) -> &NetnsConfig {
        &self.cfg
    }

    /// Every node's address and namespace, for the network faults.
    fn net_nodes(cfg: &NetnsConfig) -> Vec<NodeNet> {
        (1..=cfg.nodes)
            .map(|id| NodeNet {
                id,
                addr: cfg.node_addr(id),
                ns: Some(NetNs::Named(cfg.netns(id))),
            })
            .collect()
    }
}

impl Drop for NetnsHosts {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Hosts for NetnsHosts {
    fn ids(&self) -> Vec<u64> {
        (1..=self.cfg.nodes).collect()
    }

    fn url(&self, id: u64) -> String {
        self.cfg.layout().url(id)
    }

    async fn start(&self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)
    }

    async fn kill(&self, id: u64) -> anyhow::Result<()> {
        let Some(mut child) = lock(&self.nodes).get_mut(&id).and_then(|n| n.child.take()) else {
            return Ok(());
        };
        let ns = self.cfg.netns(id);
        let fake_clock = self.cfg.env.fake_clock.is_some();
        tokio::task::spawn_blocking(move || {
            // SIGKILL; fails only when it exited already.
            let _ = child.kill();
            // Anything else left in the node's namespace dies too (should `ip netns exec` ever
            // fork instead of exec, the server would be its child).
            kill_namespace_processes(&ns);
            reap(&mut child, fake_clock).context("cannot reap the killed node")?;
            Ok(())
        })
        .await?
    }

    /// One SIGKILL to the nodes' process group (the sentinel's), then each node reaped. A node
    /// that is somehow not in the group (it should not happen) is killed right after, on its
    /// own, and named in the answer.
    async fn kill_all(&self) -> anyhow::Result<String> {
        let (how, ()) = self.kill_nodes(None, || ()).await?;
        Ok(how)
    }

    async fn power_loss(&self, ids: &[u64]) -> anyhow::Result<PowerLoss> {
        let mut disks = Vec::new();
        for id in ids {
            disks.push((*id, self.disk(*id)?));
        }
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        // Nothing becomes durable any more: a sync waiting now (a slow disk) never completes.
        for (_, disk) in &disks {
            disk.set_fsync_delay(Some(FOREVER));
        }
        let group = if sorted == self.ids() {
            None
        } else {
            Some(sorted)
        };
        let dropping = disks.clone();
        let killed = self
            .kill_nodes(group, move || {
                let mut dropped = BTreeMap::new();
                let mut errors = Vec::new();
                for (id, disk) in &dropping {
                    match disk.drop_unsynced() {
                        Ok(r) => {
                            dropped.insert(
                                *id,
                                Dropped {
                                    files: r.files,
                                    bytes: r.bytes,
                                    failed_fsyncs: r.failed_fsyncs,
                                },
                            );
                        }
                        Err(e) => errors.push(format!("node {id}: {e}")),
                    }
                }
                (dropped, errors)
            })
            .await;
        for (_, disk) in &disks {
            disk.set_fsync_delay(None);
        }
        let (how, (dropped, errors)) = killed?;
        if !errors.is_empty() {
            bail!(
                "the nodes were killed, but unsynced writes could not be dropped: {}",
                errors.join("; ")
            );
        }
        Ok(PowerLoss { how, dropped })
    }
    async fn pause(&self, id: u64) -> anyhow::Result<()> {
        match lock(&self.nodes).get(&id).and_then(|n| n.child.as_ref()) {
            Some(child) => signal(child, libc::SIGSTOP),
            None => Ok(()),
        }
    }

    async fn resume(&self, id: u64) -> anyhow::Result<()> {
        match lock(&self.nodes).get(&id).and_then(|n| n.child.as_ref()) {
            Some(child) => signal(child, libc::SIGCONT),
            None => Ok(()),
        }
    }

    async fn partition(&self, groups: &[Vec<u64>]) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let groups = groups.to_vec();
        tokio::task::spawn_blocking(move || faults.partition(&Self::net_nodes(&cfg), &groups))
            .await?
    }

    async fn impair(&self, ids: &[u64], netem: &Netem) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let (ids, netem) = (ids.to_vec(), *netem);
        tokio::task::spawn_blocking(move || faults.impair(&Self::net_nodes(&cfg), &ids, &netem))
            .await?
    }

    async fn cut_oneway(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let links = links.to_vec();
        tokio::task::spawn_blocking(move || faults.cut_oneway(&Self::net_nodes(&cfg), &links))
            .await?
    }

    async fn heal(&self) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        tokio::task::spawn_blocking(move || faults.heal(&Self::net_nodes(&cfg))).await?
    }

    /// SIGTERM (after SIGCONT, in case it is paused), then SIGKILL when it has not exited
    /// within 20 s.
    async fn stop(&self, id: u64) -> anyhow::Result<String> {
        let Some(mut child) = lock(&self.nodes).get_mut(&id).and_then(|n| n.child.take()) else {
            return Ok("not running".to_string());
        };
        let fake_clock = self.cfg.env.fake_clock.is_some();
        tokio::task::spawn_blocking(move || {
            let _ = signal(&child, libc::SIGCONT);
            let _ = signal(&child, libc::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                if has_died(&child) {
                    return Ok(reap(&mut child, fake_clock)?.to_string());
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let status = reap(&mut child, fake_clock)?;
                    return Ok(format!("killed after {STOP_TIMEOUT:?}: {status}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await?
    }

    /// SIGKILLs every node and removes the namespaces, the bridge and the FORWARD rule.
    fn teardown(&self) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let children: Vec<Child> = lock(&self.nodes)
            .values_mut()
            .filter_map(|n| n.child.take())
            .collect();
        let fake_clock = self.cfg.env.fake_clock.is_some();
        for mut child in children {
            let _ = child.kill();
            let _ = reap(&mut child, fake_clock);
        }
        if let Some(mut sentinel) = lock(&self.sentinel).take() {
            let _ = sentinel.kill();
            let _ = sentinel.wait();
        }
        // Every node is dead: nothing holds the disks any more.
        let disks = std::mem::take(&mut *lock(&self.disks));
        for (id, disk) in disks {
            if let Err(e) = disk.unmount() {
                eprintln!("warning: unmounting node {id}'s fault disk: {e}");
            }
        }
        self.faults.shutdown();
        remove_network(&self.cfg);
    }

    fn log(&self, id: u64) -> String {
        std::fs::read(self.cfg.layout().log_file(id))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    fn is_running(&self, id: u64) -> bool {
        let mut nodes = lock(&self.nodes);
        let Some(node) = nodes.get_mut(&id) else {
            return false;
        };
        match node.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(result) => {
                // Exited on its own (reaped by try_wait).
                node.exited = Some(match result {
                    Ok(Some(status)) => status.to_string(),
                    Ok(None) => unreachable!("matched above"),
                    Err(e) => format!("cannot tell: {e}"),
                });
                if let Some(child) = node.child.take() {
                    if self.cfg.env.fake_clock.is_some() {
                        forget_fake_clock(child.id());
                    }
                }
                false
            }
            None => false,
        }
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.cfg.layout().data_dir(id)
    }

    fn exit_status(&self, id: u64) -> Option<String> {
        if self.is_running(id) {
            return None;
        }
        lock(&self.nodes).get(&id).and_then(|n| n.exited.clone())
    }

    fn disk(&self, id: u64) -> anyhow::Result<Control> {
        if !self.cfg.env.fault_disks {
            bail!("node {id} is not on a fault disk (the hosts were made without them)");
        }
        lock(&self.disks)
            .get(&id)
            .map(FaultFs::control)
            .with_context(|| format!("node {id} has no fault disk"))
    }

    fn set_clock(&self, id: u64, offset_ms: i64) -> anyhow::Result<()> {
        if self.cfg.env.fake_clock.is_none() {
            bail!("node {id} does not run under a fake clock (the hosts were made without one)");
        }
        if !(1..=self.cfg.nodes).contains(&id) {
            bail!("no node {id}");
        }
        write_clock_file(&self.cfg.clock_file(id), offset_ms)
    }
}

#[cfg(test)]
#[path = "netns_tests.rs"]
mod tests;
