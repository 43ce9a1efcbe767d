//! What both kinds of hosts share: running commands, entering a node's network namespace, and
//! the network faults inside it.
//!
//! # Network faults
//! Every node has a network namespace of its own with one interface, `eth0`, at the node's
//! address. [`NetFaults`] keeps the faults that are in force and puts them into the
//! namespaces:
//! - partitions: iptables DROP rules on INPUT (source) and OUTPUT (destination) for the
//!   address of every other node that shares no group with this one ([`partition_rules`]);
//! - one-way cuts: a DROP rule on the receiver's INPUT for the sender's address only
//!   ([`oneway_rules`]): packets from `a` to `b` are lost, packets from `b` to `a` arrive. TCP
//!   needs both directions, so a connection either way stalls (its SYN or data gets through
//!   one way, the answers never come back), as a real asymmetric fault makes it: a node keeps
//!   hearing a peer that cannot hear it;
//! - impairments: a netem qdisc on `eth0` (`tc qdisc replace dev eth0 root netem ...`). When
//!   the kernel has no netem qdisc (found out at the first impairment, then kept), the same
//!   impairment is done in userspace instead: an iptables rule on OUTPUT sends every packet
//!   leaving `eth0` to a netfilter queue, and a thread of the harness inside the namespace
//!   ([`super::nfqueue`]) drops, delays or passes each one.
//!
//! INPUT and OUTPUT of the nodes' namespaces belong to the harness: they hold nothing else,
//! and every change rewrites them whole from the faults in force. Healing flushes them, removes
//! the qdisc and stops the queues.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use anyhow::{bail, Context as _};

use super::nfqueue::Impairer;
use super::{connected, Netem};

/// The interface of a node inside its namespace.
pub const NODE_DEV: &str = "eth0";
/// The netfilter queue the userspace impairment reads (one per namespace, so one number).
pub const QUEUE_NUM: u16 = 7;
/// The comment that tags the harness's rules in the root namespace's FORWARD chain.
pub const FORWARD_COMMENT: &str = "raftq-jepsen";

/// Locks a mutex, also when a panicking thread poisoned it (the data stays usable).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs a command to completion; an error names the command and carries its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `program args` with no input and its output thrown away; its exit status.
fn run_silent(program: &str, args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// Runs a command whose failure does not matter (cleanup of things that may not exist).
pub fn run_quiet(program: &str, args: &[&str]) -> bool {
    run_silent(program, args).is_ok_and(|s| s.success())
}

/// True when `program` can be run at all (found on the PATH).
pub fn have(program: &str, probe: &str) -> bool {
    run_silent(program, &[probe]).is_ok()
}

/// Fails unless the harness runs as root; `what` says what needs it.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{what} need root; run as root or through sudo");
    }
    Ok(())
}

/// A node's network namespace, and how the harness runs a command inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetNs {
    /// A named namespace (`ip netns add`), entered with `ip netns exec`.
    Named(String),
    /// The namespace of a process (a container's main process), entered with
    /// `nsenter -t <pid> -n`.
    Process(u32),
}

impl NetNs {
    /// Runs `program args` inside the namespace with the harness's own filesystem (so the
    /// host's `iptables` and `tc` work in a container that has neither).
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        match self {
            NetNs::Named(name) => {
                let mut all = vec!["netns", "exec", name.as_str(), program];
                all.extend_from_slice(args);
                run("ip", &all)
            }
            NetNs::Process(pid) => {
                let pid = pid.to_string();
                let mut all = vec!["-t", pid.as_str(), "-n", program];
                all.extend_from_slice(args);
                run("nsenter", &all)
            }
        }
    }

    /// The file that names the namespace, for `setns(2)`.
    pub fn path(&self) -> PathBuf {
        match self {
            NetNs::Named(name) => PathBuf::from("/run/netns").join(name),
            NetNs::Process(pid) => PathBuf::from(format!("/proc/{pid}/ns/net")),
        }
    }
}

impl std::fmt::Display for NetNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetNs::Named(name) => write!(f, "namespace {name}"),
            NetNs::Process(pid) => write!(f, "the namespace of pid {pid}"),
        }
    }
}

/// One node as the network faults see it.
#[derive(Debug, Clone)]
pub struct NodeNet {
    pub id: u64,
    pub addr: Ipv4Addr,
    /// `None` while the node has no namespace (a stopped container): its faults are put in
    /// place by [`NetFaults::restore`] when it starts.
    pub ns: Option<NetNs>,
}

/// The iptables commands (arguments after `iptables`) that make node `id` drop traffic to and
/// from every other node it shares no group with. `nodes` are all nodes with their addresses.
pub fn partition_rules(
    nodes: &[(u64, Ipv4Addr)],
    groups: &[Vec<u64>],
    id: u64,
) -> Vec<Vec<String>> {
    let mut rules = Vec::new();
    for (other, addr) in nodes {
        if connected(groups, id, *other) {
            continue;
        }
        let addr = addr.to_string();
        for (chain, flag) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
            rules.push(strings(&["-A", chain, flag, &addr, "-j", "DROP"]));
        }
    }
    rules
}

/// The iptables commands that make node `id` drop what it receives over the one-way cuts
/// `links` (`(from, to)`: packets from `from` to `to` are dropped, at `to`).
pub fn oneway_rules(nodes: &[(u64, Ipv4Addr)], links: &[(u64, u64)], id: u64) -> Vec<Vec<String>> {
    let mut rules = Vec::new();
    for (from, to) in links {
        if *to != id || from == to {
            continue;
        }
        if let Some((_, addr)) = nodes.iter().find(|(n, _)| n == from) {
            let rule = strings(&["-A", "INPUT", "-s", &addr.to_string(), "-j", "DROP"]);
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
    }
    rules
}

/// The iptables command that hands every packet leaving the node's interface to the userspace
/// impairment. `--queue-bypass`: while no thread listens, packets pass untouched.
pub fn queue_rule() -> Vec<String> {
    strings(&[
        "-A",
        "OUTPUT",
        "-o",
        NODE_DEV,
        "-j",
        "NFQUEUE",
        "--queue-num",
        &QUEUE_NUM.to_string(),
        "--queue-bypass",
    ])
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The rule (after `-I FORWARD 1` / `-D FORWARD`) that lets traffic within `bridge` through
/// the root namespace's FORWARD chain, tagged with [`FORWARD_COMMENT`].
fn forward_rule(bridge: &str) -> Vec<String> {
    strings(&[
        "-i",
        bridge,
        "-o",
        bridge,
        "-m",
        "comment",
        "--comment",
        FORWARD_COMMENT,
        "-j",
        "ACCEPT",
    ])
}

/// Inserts the FORWARD rule for `bridge` at the top of the root namespace's FORWARD chain:
/// bridged traffic goes through it when `br_netfilter` is loaded (as with Docker, whose
/// FORWARD policy is DROP).
pub fn insert_forward_rule(bridge: &str) -> anyhow::Result<()> {
    let rule = forward_rule(bridge);
    let mut args = vec!["-I", "FORWARD", "1"];
    args.extend(rule.iter().map(String::as_str));
    run("iptables", &args).context("cannot let traffic through the bridge")?;
    Ok(())
}

/// Removes every copy of the FORWARD rule for `bridge` (a crashed run may have left one).
pub fn remove_forward_rules(bridge: &str) {
    let rule = forward_rule(bridge);
    let mut args = vec!["-D", "FORWARD"];
    args.extend(rule.iter().map(String::as_str));
    for _ in 0..10 {
        if !run_quiet("iptables", &args) {
            break;
        }
    }
}

/// How impairments are put in place on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// A netem qdisc.
    Tc,
    /// The userspace queue (the kernel has no netem qdisc, or there is no `tc`).
    Queue,
}

#[derive(Default)]
struct FaultState {
    /// The partition in force.
    groups: Option<Vec<Vec<u64>>>,
    /// The one-way cuts in force: `(from, to)`.
    oneway: Vec<(u64, u64)>,
    /// The impairment in force, per node.
    netem: BTreeMap<u64, Netem>,
    /// Decided at the first impairment.
    engine: Option<Engine>,
    /// Running userspace impairments, per node.
    queues: BTreeMap<u64, Impairer>,
}

/// The network faults in force on a set of nodes (see the module documentation). Its methods
/// block (they run commands): call them from `spawn_blocking`.
#[derive(Default)]
pub struct NetFaults {
    state: Mutex<FaultState>,
}

impl NetFaults {
    /// Partitions the nodes into `groups` (replacing an earlier partition).
    pub fn partition(&self, nodes: &[NodeNet], groups: &[Vec<u64>]) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        state.groups = Some(groups.to_vec());
        for node in nodes {
            sync_filters(&state, node, nodes)?;
        }
        Ok(())
    }

    /// Cuts the links `(from, to)` in one direction (replacing earlier one-way cuts).
    pub fn cut_oneway(&self, nodes: &[NodeNet], links: &[(u64, u64)]) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        state.oneway = links.to_vec();
        for node in nodes {
            sync_filters(&state, node, nodes)?;
        }
        Ok(())
    }

    /// Impairs what the nodes `ids` send (replacing an earlier impairment of them).
    pub fn impair(&self, nodes: &[NodeNet], ids: &[u64], netem: &Netem) -> anyhow::Result<()> {
        netem.validate()?;
        let mut state = lock(&self.state);
        for node in nodes.iter().filter(|n| ids.contains(&n.id)) {
            state.netem.insert(node.id, *netem);
            apply_netem(&mut state, node, nodes)?;
        }
        Ok(())
    }

    /// Removes every fault from every node that has a namespace. Says on stderr what each
    /// userspace impairment did.
    pub fn heal(&self, nodes: &[NodeNet]) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        state.groups = None;
        state.oneway.clear();
        let impaired: Vec<u64> = state.netem.keys().copied().collect();
        state.netem.clear();
        let mut first_error = None;
        for node in nodes {
            let Some(ns) = &node.ns else { continue };
            if let Err(err) = flush_filters(ns) {
                first_error.get_or_insert(err);
            }
            if impaired.contains(&node.id) && state.engine == Some(Engine::Tc) {
                // Fails only when there is no netem qdisc: nothing to remove.
                let _ = ns.run("tc", &["qdisc", "del", "dev", NODE_DEV, "root"]);
            }
        }
        // After the queue rules are gone: a stopping queue passes what it still holds.
        for (id, queue) in std::mem::take(&mut state.queues) {
            eprintln!("hosts: userspace impairment of node {id}: {}", queue.stop());
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Puts the faults in force back into node `id`'s namespace, after the node started in a
    /// fresh one (a restarted container).
    pub fn restore(&self, id: u64, nodes: &[NodeNet]) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        let Some(node) = nodes.iter().find(|n| n.id == id) else {
            return Ok(());
        };
        if let Some(old) = state.queues.remove(&id) {
            // Bound to the namespace that died with the old process.
            old.stop();
        }
        if state.netem.contains_key(&id) {
            apply_netem(&mut state, node, nodes)
        } else {
            sync_filters(&state, node, nodes)
        }
    }

    /// Stops every userspace impairment (the namespaces are about to go away).
    pub fn shutdown(&self) {
        let mut state = lock(&self.state);
        for (_, queue) in std::mem::take(&mut state.queues) {
            queue.stop();
        }
    }
}

/// Flushes the harness's chains in `ns`.
fn flush_filters(ns: &NetNs) -> anyhow::Result<()> {
    for chain in ["INPUT", "OUTPUT"] {
        ns.run("iptables", &["-F", chain])?;
    }
    Ok(())
}

/// Rewrites `node`'s INPUT and OUTPUT from the faults in force: the partition's rules, and the
/// queue rule when it has a userspace impairment.
fn sync_filters(state: &FaultState, node: &NodeNet, nodes: &[NodeNet]) -> anyhow::Result<()> {
    let Some(ns) = &node.ns else { return Ok(()) };
    flush_filters(ns)?;
    let mut rules = Vec::new();
    let addrs: Vec<(u64, Ipv4Addr)> = nodes.iter().map(|n| (n.id, n.addr)).collect();
    if let Some(groups) = &state.groups {
        rules = partition_rules(&addrs, groups, node.id);
    }
    rules.extend(oneway_rules(&addrs, &state.oneway, node.id));
    if state.netem.contains_key(&node.id) && state.engine == Some(Engine::Queue) {
        rules.push(queue_rule());
    }
    for rule in rules {
        let args: Vec<&str> = rule.iter().map(String::as_str).collect();
        ns.run("iptables", &args)?;
    }
    Ok(())
}

/// True when `tc` failed because the kernel does not know the netem qdisc (or there is no
/// `tc` at all): the userspace queue can stand in.
fn netem_unsupported(err: &anyhow::Error) -> bool {
    let text = format!("{err:#}");
    text.contains("qdisc kind is unknown")
        || text.contains("Unknown qdisc")
        // `nsenter` and `ip netns exec` when there is no `tc` to run.
        || text.contains("failed to execute tc")
        || text.contains("exec of \"tc\" failed")
}

/// Puts `node`'s impairment in place, choosing the engine at the first one.
fn apply_netem(state: &mut FaultState, node: &NodeNet, nodes: &[NodeNet]) -> anyhow::Result<()> {
    let Some(ns) = &node.ns else { return Ok(()) };
    let Some(netem) = state.netem.get(&node.id).copied() else {
        return Ok(());
    };
    let mut tc = vec!["qdisc", "replace", "dev", NODE_DEV, "root"];
    let netem_args = netem.tc_args();
    tc.extend(netem_args.iter().map(String::as_str));
    if state.engine != Some(Engine::Queue) {
        match ns.run("tc", &tc) {
            Ok(_) => {
                state.engine = Some(Engine::Tc);
                return Ok(());
            }
            Err(err) if state.engine.is_none() && netem_unsupported(&err) => {
                eprintln!(
                    "hosts: no netem qdisc here ({err:#}); impairing packets in userspace \
                     through a netfilter queue instead"
                );
                state.engine = Some(Engine::Queue);
            }
            Err(err) => {
                return Err(err.context(format!("cannot impair node {} with netem", node.id)))
            }
        }
    }
    let queue = Impairer::start(&ns.path(), QUEUE_NUM, netem)
        .with_context(|| format!("cannot impair node {} in userspace ({ns})", node.id))?;
    if let Some(old) = state.queues.insert(node.id, queue) {
        old.stop();
    }
    sync_filters(state, node, nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<(u64, Ipv4Addr)> {
        (1..=3)
            .map(|id| (id, Ipv4Addr::new(10, 231, 0, id as u8)))
            .collect()
    }

    #[test]
    fn rules_cut_only_links_between_groups() {
        let nodes = addrs();
        let groups = vec![vec![1], vec![2, 3]];
        let r1 = partition_rules(&nodes, &groups, 1);
        assert_eq!(r1.len(), 4);
        assert!(r1
            .iter()
            .any(|r| r.join(" ") == "-A INPUT -s 10.231.0.2 -j DROP"));
        assert!(r1
            .iter()
            .any(|r| r.join(" ") == "-A OUTPUT -d 10.231.0.3 -j DROP"));
        let r2 = partition_rules(&nodes, &groups, 2);
        assert_eq!(r2.len(), 2);
        assert!(r2.iter().all(|r| r.contains(&"10.231.0.1".to_string())));
        // Only node addresses are ever dropped (the harness's side stays reachable).
        assert!(r1.iter().all(|r| !r.join(" ").contains(".254")));
        let bridge = vec![vec![1, 2], vec![2, 3]];
        assert!(partition_rules(&nodes, &bridge, 2).is_empty());
        assert_eq!(partition_rules(&nodes, &bridge, 3).len(), 2);
    }

    #[test]
    fn oneway_cuts_drop_one_direction_at_the_receiver() {
        let nodes = addrs();
        // Packets from 1 to 2 are dropped: node 2 drops what comes from 1; node 1 drops
        // nothing, so what 2 sends to 1 arrives.
        let links = [(1, 2)];
        assert_eq!(
            oneway_rules(&nodes, &links, 2)
                .iter()
                .map(|r| r.join(" "))
                .collect::<Vec<_>>(),
            vec!["-A INPUT -s 10.231.0.1 -j DROP"]
        );
        assert!(oneway_rules(&nodes, &links, 1).is_empty());
        assert!(oneway_rules(&nodes, &links, 3).is_empty());
        // Two links into one node, and nonsense (a node to itself, an unknown node) ignored.
        let links = [(1, 3), (2, 3), (3, 3), (9, 3), (1, 3)];
        assert_eq!(oneway_rules(&nodes, &links, 3).len(), 2);
        // Never an OUTPUT rule: the sender's own stack is not told, the packet just vanishes.
        assert!(oneway_rules(&nodes, &links, 3)
            .iter()
            .all(|r| r[1] == "INPUT" && !r.join(" ").contains(".254")));
    }

    #[test]
    fn namespaces_name_their_files() {
        assert_eq!(
            NetNs::Named("rqj-n1".into()).path(),
            PathBuf::from("/run/netns/rqj-n1")
        );
        assert_eq!(NetNs::Process(42).path(), PathBuf::from("/proc/42/ns/net"));
        assert_eq!(
            queue_rule().join(" "),
            "-A OUTPUT -o eth0 -j NFQUEUE --queue-num 7 --queue-bypass"
        );
    }

    #[test]
    fn missing_netem_is_recognised() {
        let err =
            anyhow::anyhow!("`tc qdisc replace` failed: Error: Specified qdisc kind is unknown.");
        assert!(netem_unsupported(&err));
        let other = anyhow::anyhow!("`tc qdisc replace` failed: Cannot find device \"eth0\"");
        assert!(!netem_unsupported(&other));
    }
}
