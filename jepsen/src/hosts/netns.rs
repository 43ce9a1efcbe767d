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

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use raftq_faultfs::{Control, FaultFs, FOREVER};

use super::net::{
    have, insert_forward_rule, lock, remove_forward_rules, require_root, run, run_quiet, NetFaults,
    NetNs, NodeNet,
};
use super::{Dropped, Hosts, Netem, NodeEnv, PowerLoss, CLUSTER_SECRET};

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

    fn addr(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, host)
    }

    /// The address of node `id`.
    pub fn node_addr(&self, id: u64) -> Ipv4Addr {
        self.addr(id as u8)
    }

    /// The harness's address on the bridge.
    pub fn bridge_addr(&self) -> Ipv4Addr {
        self.addr(BRIDGE_HOST)
    }

    fn url(&self, id: u64) -> String {
        format!("http://{}:{}", self.node_addr(id), self.port)
    }

    fn peers_arg(&self) -> String {
        (1..=self.nodes)
            .map(|id| format!("{id}={}", self.url(id)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn secret_file(&self) -> PathBuf {
        self.run_dir.join("cluster.secret")
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.run_dir.join(format!("node{id}"))
    }

    fn log_file(&self, id: u64) -> PathBuf {
        self.run_dir.join(format!("node{id}.log"))
    }

    /// What a fault disk shows at `data_dir(id)` lives here.
    pub fn disk_backing(&self, id: u64) -> PathBuf {
        self.run_dir.join(format!("node{id}.disk"))
    }

    /// The file libfaketime reads node `id`'s clock offset from.
    fn clock_file(&self, id: u64) -> PathBuf {
        self.run_dir.join(format!("node{id}.faketime"))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.nodes == 0 || self.nodes > 250 {
            bail!("between 1 and 250 nodes, not {}", self.nodes);
        }
        if self.prefix.is_empty()
            || self.prefix.len() > 8
            || !self.prefix.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            bail!(
                "the name prefix must be 1 to 8 letters or digits, not {:?}",
                self.prefix
            );
        }
        Ok(())
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

/// Removes everything a run with this configuration creates, whether or not it exists:
/// processes inside the namespaces, the namespaces (and with them the veth pairs), stray
/// root-side veths, the bridge and the FORWARD rule.
fn remove_network(cfg: &NetnsConfig) {
    let listed = run("ip", &["netns", "list"]).unwrap_or_default();
    let ours: Vec<String> = listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| {
            name.strip_prefix(&format!("{}-n", cfg.prefix))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
        .collect();
    for ns in &ours {
        // Whatever still runs in the namespace (a node of a crashed earlier run).
        kill_namespace_processes(ns);
    }
    for ns in &ours {
        // A namespace whose processes are still dying may refuse once; try a few times.
        for _ in 0..20 {
            if run_quiet("ip", &["netns", "del", ns]) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for id in 1..=cfg.nodes.max(9) {
        let veth = cfg.veth_root(id);
        if Path::new(&format!("/sys/class/net/{veth}")).exists() {
            run_quiet("ip", &["link", "del", &veth]);
        }
    }
    let bridge = cfg.bridge();
    if Path::new(&format!("/sys/class/net/{bridge}")).exists() {
        run_quiet("ip", &["link", "del", &bridge]);
    }
    remove_forward_rules(&bridge);
}

/// SIGKILLs every process inside namespace `ns`.
fn kill_namespace_processes(ns: &str) {
    let pids = run("ip", &["netns", "pids", ns]).unwrap_or_default();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: sending a signal has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Removes the shared-memory segment and semaphore libfaketime made for process `pid`, which
/// it leaves behind when the process is killed (a later process with the same pid would find
/// them and fail).
fn forget_fake_clock(pid: u32) {
    for name in [
        format!("/dev/shm/faketime_shm_{pid}"),
        format!("/dev/shm/sem.faketime_sem_{pid}"),
    ] {
        let _ = std::fs::remove_file(name);
    }
}

/// Reaps `child` (waits for it), then removes what libfaketime left for it when the node ran
/// under a fake clock.
fn reap(child: &mut Child, fake_clock: bool) -> std::io::Result<std::process::ExitStatus> {
    let status = child.wait();
    if fake_clock {
        forget_fake_clock(child.id());
    }
    status
}

/// True once `child` has exited, without reaping it (so its pid stays ours).
fn has_died(child: &Child) -> bool {
    let pid: libc::id_t = child.id();
    // SAFETY: `info` is a plain C struct, zeroed, written by waitid; WNOWAIT leaves the child
    // waitable, WNOHANG makes the call return at once.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc != 0 || info.si_pid() != 0
    }
}

/// Waits until every child in `children` has died (not reaped), at most `limit`.
fn await_death(children: &[(u64, Child)], limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && !children.iter().all(|(_, c)| has_died(c)) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Mounts a fault disk over `nodeN.disk/` at `nodeN/` for every node.
fn mount_disks(cfg: &NetnsConfig) -> anyhow::Result<BTreeMap<u64, FaultFs>> {
    raftq_faultfs::check_environment().context("fault disks cannot be mounted here")?;
    let mut disks = BTreeMap::new();
    for id in 1..=cfg.nodes {
        let (backing, mountpoint) = (cfg.disk_backing(id), cfg.data_dir(id));
        for dir in [&backing, &mountpoint] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let options = raftq_faultfs::Options {
            // The pre-images of overwritten synced bytes: on the run directory's file system,
            // outside the mount.
            undo_dir: Some(cfg.run_dir.clone()),
            ..raftq_faultfs::Options::default()
        };
        let fs = FaultFs::mount_with(&backing, &mountpoint, options)
            .with_context(|| format!("cannot mount node {id}'s fault disk"))?;
        disks.insert(id, fs);
    }
    Ok(disks)
}

/// Writes `offset_ms` as libfaketime reads a relative offset (`+12.345`, seconds), into a new
/// file renamed over `path`, so that a reader never sees half of it.
fn write_clock_file(path: &Path, offset_ms: i64) -> anyhow::Result<()> {
    let text = faketime_offset(offset_ms);
    let tmp = path.with_extension("faketime.new");
    std::fs::write(&tmp, format!("{text}\n"))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
}

/// A relative libfaketime offset of `offset_ms` milliseconds: `+12.345`, `-0.250`.
pub fn faketime_offset(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}", abs / 1000, abs % 1000)
}

fn create_network(cfg: &NetnsConfig) -> anyhow::Result<()> {
    let bridge = cfg.bridge();
    let prefix_len = 24;
    run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{}/{prefix_len}", cfg.bridge_addr()),
            "dev",
            &bridge,
        ],
    )?;
    run("ip", &["link", "set", &bridge, "up"])?;
    insert_forward_rule(&bridge)?;
    for id in 1..=cfg.nodes {
        let ns = cfg.netns(id);
        let (veth, peer) = (cfg.veth_root(id), cfg.veth_peer(id));
        run("ip", &["netns", "add", &ns])?;
        run(
            "ip",
            &["link", "add", &veth, "type", "veth", "peer", "name", &peer],
        )?;
        run("ip", &["link", "set", &peer, "netns", &ns])?;
        run("ip", &["-n", &ns, "link", "set", &peer, "name", "eth0"])?;
        run(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/{prefix_len}", cfg.node_addr(id)),
                "dev",
                "eth0",
            ],
        )?;
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        run("ip", &["link", "set", &veth, "master", &bridge])?;
        run("ip", &["link", "set", &veth, "up"])?;
        // iptables must work inside the namespace, or partitions cannot.
        NetNs::Named(ns.clone())
            .run("iptables", &["-S", "INPUT"])
            .with_context(|| format!("iptables does not work inside namespace {ns}"))?;
    }
    Ok(())
}

fn signal(child: &Child, sig: libc::c_int) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    // SAFETY: sending a signal has no memory-safety preconditions; the child is not reaped
    // yet (we hold it), so its pid cannot have been reused.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!(
            "cannot send signal {sig} to pid {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl NetnsHosts {
    /// Checks the machine, removes leftovers of an earlier run with the same names, creates
    /// the bridge, namespaces and veths, and writes the secret file. Starts no node.
    pub fn create(cfg: NetnsConfig) -> anyhow::Result<NetnsHosts> {
        cfg.validate()?;
        preflight()?;
        if !cfg.bin.is_file() {
            bail!(
                "raftq binary {} not found; build it (cargo build --release --bin raftq) or \
                 pass --raftq-bin / RAFTQ_BIN",
                cfg.bin.display()
            );
        }
        std::fs::create_dir_all(&cfg.run_dir)
            .with_context(|| format!("cannot create {}", cfg.run_dir.display()))?;
        std::fs::write(cfg.secret_file(), format!("{CLUSTER_SECRET}\n"))
            .context("cannot write the secret file")?;
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

    /// The nodes' process group: the sentinel's pid, after making a new sentinel when there is
    /// none alive.
    fn group(&self) -> anyhow::Result<i32> {
        let mut sentinel = lock(&self.sentinel);
        if let Some(child) = sentinel.as_mut() {
            if child.try_wait()?.is_none() {
                return i32::try_from(child.id()).context("pid out of range");
            }
        }
        // A process that does nothing for 30 years, leading a group of its own.
        let child = Command::new("sleep")
            .arg("1000000000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the sentinel of the nodes' process group (`sleep`)")?;
        let pgid = i32::try_from(child.id()).context("pid out of range")?;
        *sentinel = Some(child);
        Ok(pgid)
    }

    fn spawn(&self, id: u64) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let mut nodes = lock(&self.nodes);
        let node = nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))?;
        if let Some(child) = node.child.as_mut() {
            if child.try_wait()?.is_none() {
                return Ok(()); // already running
            }
            if cfg.env.fake_clock.is_some() {
                forget_fake_clock(child.id());
            }
            node.child = None;
        }
        let pgid = self.group()?;
        node.starts += 1;
        node.exited = None;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(cfg.log_file(id))
            .context("cannot open the node's log")?;
        writeln!(
            log,
            "===== [raftq-jepsen] start #{} of node {id} =====",
            node.starts
        )?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &cfg.netns(id)])
            .arg(&cfg.bin)
            .arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(format!("{}:{}", cfg.node_addr(id), cfg.port))
            .arg("--data")
            .arg(cfg.data_dir(id))
            .arg("--peers")
            .arg(cfg.peers_arg())
            .arg("--cluster-secret-file")
            .arg(cfg.secret_file())
            .arg("--cluster-id")
            .arg(&cfg.cluster_id);
        if let Some(bytes) = cfg.env.write_buffer_bytes {
            cmd.arg("--write-buffer-bytes").arg(bytes.to_string());
        }
        // Only the command line configures the node.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RAFTQ_") {
                cmd.env_remove(name);
            }
        }
        if let Some(lib) = &cfg.env.fake_clock {
            // The wall clock from the node's offset file, read on every call so that a step
            // takes effect at once; the monotonic clock is the real one (unless the clock
            // checks themselves are being tested).
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", cfg.clock_file(id))
                .env("FAKETIME_NO_CACHE", "1");
            if !cfg.env.fake_monotonic {
                cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            }
        }
        cmd.env("RAFTQ_LOG", &cfg.log_filter)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            // The nodes' group (see the module documentation): `kill_all` is one signal.
            .process_group(pgid);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start node {id}"))?;
        node.child = Some(child);
        Ok(())
    }
}

impl NetnsHosts {
    /// SIGKILLs the nodes `only` (each on its own), or every running node (`None`: one signal
    /// to the nodes' process group); once they are all dead, or after [`DEATH_WAIT`] (threads
    /// waiting for a stalled sync die only when it ends), runs `dead`; then reaps them. Returns
    /// how they were killed and what `dead` returned.
    async fn kill_nodes<R: Send + 'static>(
        &self,
        only: Option<Vec<u64>>,
        dead: impl FnOnce() -> R + Send + 'static,
    ) -> anyhow::Result<(String, R)> {
        let fake_clock = self.cfg.env.fake_clock.is_some();
        let mut children: Vec<(u64, Child)> = {
            let mut nodes = lock(&self.nodes);
            nodes
                .iter_mut()
                .filter(|(id, _)| only.as_ref().is_none_or(|o| o.contains(id)))
                .filter_map(|(id, n)| n.child.take().map(|c| (*id, c)))
                .collect()
        };
        let namespaces: Vec<String> = match &only {
            Some(ids) => ids.iter().map(|id| self.cfg.netns(*id)).collect(),
            None => self.ids().iter().map(|id| self.cfg.netns(*id)).collect(),
        };
        if let Some(ids) = only {
            return tokio::task::spawn_blocking(move || {
                for (_, child) in children.iter_mut() {
                    let _ = child.kill();
                }
                for ns in &namespaces {
                    kill_namespace_processes(ns);
                }
                await_death(&children, DEATH_WAIT);
                let out = dead();
                for (id, mut child) in children {
                    reap(&mut child, fake_clock)
                        .with_context(|| format!("cannot reap node {id}"))?;
                }
                Ok((format!("SIGKILL to nodes {ids:?}"), out))
            })
            .await?;
        }
        let sentinel = lock(&self.sentinel).take();
        tokio::task::spawn_blocking(move || {
            let Some(mut sentinel) = sentinel else {
                // No node was ever started in a group: nothing runs.
                for (_, mut child) in children {
                    let _ = child.kill();
                    let _ = reap(&mut child, fake_clock);
                }
                return Ok(("no process group: nothing ran".to_string(), dead()));
            };
            let pgid = i32::try_from(sentinel.id()).context("pid out of range")?;
            // Checked before the signal: which running nodes are not in the group.
            let outside: Vec<u64> = children
                .iter()
                .filter(|(_, c)| {
                    let pid = c.id() as i32;
                    // SAFETY: getpgid has no memory-safety preconditions; the child is not
                    // reaped, so its pid names it.
                    let group = unsafe { libc::getpgid(pid) };
                    group != pgid
                })
                .map(|(id, _)| *id)
                .collect();
            let running: Vec<u64> = children.iter().map(|(id, _)| *id).collect();
            // SAFETY: sending a signal has no memory-safety preconditions; the sentinel is not
            // reaped, so the group id is still ours.
            let sent = unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let sent_err = std::io::Error::last_os_error();
            for (id, child) in children.iter_mut() {
                if outside.contains(id) || sent != 0 {
                    let _ = child.kill();
                }
            }
            // Anything else left in the namespaces dies too (as `kill` does).
            for ns in &namespaces {
                kill_namespace_processes(ns);
            }
            let _ = sentinel.kill();
            let _ = sentinel.wait();
            await_death(&children, DEATH_WAIT);
            let out = dead();
            for (id, mut child) in children {
                reap(&mut child, fake_clock).with_context(|| format!("cannot reap node {id}"))?;
            }
            if sent != 0 {
                bail!(
                    "cannot signal the nodes' process group {pgid}: {sent_err}; nodes \
                     {running:?} were killed one by one instead"
                );
            }
            let mut how = format!("one SIGKILL to process group {pgid}: nodes {running:?}");
            if !outside.is_empty() {
                how.push_str(&format!(
                    "; nodes {outside:?} were not in the group and were killed on their own"
                ));
            }
            Ok((how, out))
        })
        .await?
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
        self.cfg.url(id)
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
        std::fs::read(self.cfg.log_file(id))
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
        self.cfg.data_dir(id)
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
