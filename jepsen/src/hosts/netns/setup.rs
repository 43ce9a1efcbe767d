//! Setting up and removing what the hosts are made of: the bridge, the namespaces and their
//! veth pairs, the fault disks and the clock files (and whatever an earlier run with the same
//! names left behind).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use raftq_faultfs::FaultFs;

use super::process::kill_namespace_processes;
use super::NetnsConfig;
use crate::hosts::net::{insert_forward_rule, remove_forward_rules, run, run_quiet, NetNs};

/// Removes everything a run with this configuration creates, whether or not it exists:
/// processes inside the namespaces, the namespaces (and with them the veth pairs), stray
/// root-side veths, the bridge and the FORWARD rule.
pub(super) fn remove_network(cfg: &NetnsConfig) {
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

/// Mounts a fault disk over `nodeN.disk/` at `nodeN/` for every node.
pub(super) fn mount_disks(cfg: &NetnsConfig) -> anyhow::Result<BTreeMap<u64, FaultFs>> {
    raftq_faultfs::check_environment().context("fault disks cannot be mounted here")?;
    let mut disks = BTreeMap::new();
    for id in 1..=cfg.nodes {
        let (backing, mountpoint) = (cfg.disk_backing(id), cfg.layout().data_dir(id));
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
pub(super) fn write_clock_file(path: &Path, offset_ms: i64) -> anyhow::Result<()> {
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

pub(super) fn create_network(cfg: &NetnsConfig) -> anyhow::Result<()> {
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
