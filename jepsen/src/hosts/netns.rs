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
//! # Faults
//! - `kill`: SIGKILL and reap; `pause`/`resume`: SIGSTOP/SIGCONT.
//! - `partition(groups)` and `impair(ids, netem)`: inside the namespaces, as [`super::net`]
//!   describes (iptables rules, a netem qdisc or the userspace queue). Only node-to-node links
//!   are cut: the harness at `.254` still reaches every node. That models clients that sit on
//!   every side of the partition (each client talks to the nodes of its side; a client can
//!   still talk to a minority node, which must then refuse writes or serve only committed
//!   reads). `heal` removes every network fault (the namespaces are the harness's own; no
//!   other rules live there).
//!
//! # Cleanup
//! Setup first removes whatever an earlier run with the same names left behind (processes in
//! the namespaces, the namespaces, the bridge, veths, the FORWARD rule), so it is idempotent.
//! [`Hosts::teardown`] (also run on drop) SIGKILLs every node and removes everything again.
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

use super::net::{
    have, insert_forward_rule, lock, remove_forward_rules, require_root, run, run_quiet, NetFaults,
    NetNs, NodeNet,
};
use super::{Hosts, Netem};

/// Address of the bridge (the harness's side) in the subnet.
const BRIDGE_HOST: u8 = 254;
/// How long a graceful stop waits before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

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
}

/// A cluster of `raftq` nodes in network namespaces. See the module documentation.
pub struct NetnsHosts {
    cfg: Arc<NetnsConfig>,
    nodes: Mutex<BTreeMap<u64, Node>>,
    faults: Arc<NetFaults>,
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
        std::fs::write(
            cfg.secret_file(),
            "raftq-jepsen-cluster-secret-0c4e5b7a91\n",
        )
        .context("cannot write the secret file")?;
        remove_network(&cfg);
        let hosts = NetnsHosts {
            nodes: Mutex::new((1..=cfg.nodes).map(|id| (id, Node::default())).collect()),
            cfg: Arc::new(cfg),
            faults: Arc::new(NetFaults::default()),
            torn_down: AtomicBool::new(false),
        };
        // On failure, `hosts` drops here and removes what was made so far.
        create_network(&hosts.cfg).context("cannot set up the network namespaces")?;
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
            node.child = None;
        }
        node.starts += 1;
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
        // Only the command line configures the node.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RAFTQ_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("RAFTQ_LOG", &cfg.log_filter)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            // Its own process group: a Ctrl-C at the terminal reaches the harness only, which
            // then tears everything down in order.
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start node {id}"))?;
        node.child = Some(child);
        Ok(())
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
        tokio::task::spawn_blocking(move || {
            // SIGKILL; fails only when it exited already.
            let _ = child.kill();
            // Anything else left in the node's namespace dies too (should `ip netns exec` ever
            // fork instead of exec, the server would be its child).
            kill_namespace_processes(&ns);
            child.wait().context("cannot reap the killed node")?;
            Ok(())
        })
        .await?
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
        tokio::task::spawn_blocking(move || {
            let _ = signal(&child, libc::SIGCONT);
            let _ = signal(&child, libc::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                if let Some(status) = child.try_wait()? {
                    return Ok(status.to_string());
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let status = child.wait()?;
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
        for mut child in children {
            let _ = child.kill();
            let _ = child.wait();
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
            Some(_) => {
                node.child = None; // exited on its own (reaped by try_wait)
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_names_and_addresses() {
        let mut cfg = NetnsConfig::new(PathBuf::from("/bin/true"), PathBuf::from("/tmp/run"));
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.netns(2), "rqj-n2");
        assert_eq!(cfg.bridge(), "rqj0");
        assert_eq!(cfg.node_addr(3), Ipv4Addr::new(10, 231, 0, 3));
        assert_eq!(cfg.bridge_addr(), Ipv4Addr::new(10, 231, 0, 254));
        assert_eq!(
            cfg.peers_arg(),
            "1=http://10.231.0.1:7000,2=http://10.231.0.2:7000,3=http://10.231.0.3:7000"
        );
        let nodes = NetnsHosts::net_nodes(&cfg);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].ns, Some(NetNs::Named("rqj-n1".into())));
        cfg.prefix = "much-too-long".into();
        assert!(cfg.validate().is_err());
        cfg.prefix = "rqj".into();
        cfg.nodes = 0;
        assert!(cfg.validate().is_err());
    }
}
