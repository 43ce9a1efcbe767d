//! Test harness for raftq's integration tests: real `raftq` processes on real sockets and real
//! disks, driven through the public HTTP API (raw, with `reqwest`) and the SDK.
//!
//! - [`Cluster::start`] picks free ports, makes a temporary directory (data directories, the
//!   secret file, one `nodeN.log` per node), spawns the nodes and waits for a leader that every
//!   running node agrees on.
//! - Every wait polls with a bound; a wait that runs out panics through [`Cluster::fail`],
//!   which prints the tails of every node's log and keeps the directory for inspection.
//! - Dropping a [`Cluster`] SIGKILLs every node it started. The directory is deleted unless
//!   the test is panicking or `RAFTQ_TEST_KEEP` is set.
//!
//! The raw HTTP client never follows redirects, so tests see the server's 307s.
//!
//! # Layout
//! - this file: the [`Cluster`] itself, its nodes, ports, and what dropping it does;
//! - `cluster`: starting a cluster, addresses, files, SDK clients, the serve command line;
//! - `wait`: bounded waits, the agreed leader, state digests;
//! - `process`: logs, failures, kills, signals, restarts;
//! - `http`: raw HTTP requests, JSON answers, problems, topics, records, convergence;
//! - `tls`: [`TestCa`], a certificate authority made at test time;
//! - `load`: publisher load through the SDK ([`Load`]) and its histories' judge.

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

mod cluster;
mod http;
mod load;
mod process;
mod tls;
mod wait;

// Each test binary uses a different subset of the harness.
#[allow(unused_imports)]
pub use load::{history_violations, wait_acks, History, Load};
#[allow(unused_imports)]
pub use tls::TestCa;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The cluster secret every test cluster uses (at least 16 characters, as the server demands).
pub const SECRET: &str = "raftq-integration-test-secret-7f3a9c";
/// The `--cluster-id` of every test cluster.
pub const CLUSTER_ID: &str = "itest";
/// The server binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_raftq");
/// Content type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Header that carries the cluster secret on Raft RPCs.
pub const SECRET_HEADER: &str = "x-raftq-cluster-secret";

/// Pause between two polls of a wait.
const POLL: Duration = Duration::from_millis(50);
/// How many lines of each node's log a failure shows.
const LOG_TAIL_LINES: usize = 60;

/// Ports handed out by [`free_port`] in this test process, so that two clusters started by
/// parallel tests never get the same port.
static TAKEN_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A tokens file with one entry per `(name, token, grants)` (grants separated by spaces), as
/// `raftq token create` writes them (the token's SHA-256, never the token).
pub fn tokens_toml(entries: &[(&str, &str, &str)]) -> String {
    entries
        .iter()
        .map(|(name, token, grants)| {
            let grants: Vec<String> = grants
                .split_whitespace()
                .map(|g| format!("\"{g}\""))
                .collect();
            format!(
                "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\ngrants = [{}]\n",
                raftq::tokens::token_hash_hex(token),
                grants.join(", ")
            )
        })
        .collect()
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that no other cluster of this
/// process got. Another process may still take it before the node binds it: [`Cluster::start`]
/// starts over with new ports when a node cannot listen.
pub fn free_port() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        drop(listener);
        if lock(&TAKEN_PORTS).insert(port) {
            return port;
        }
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One node process of a cluster.
struct NodeProc {
    port: u16,
    data: PathBuf,
    log: PathBuf,
    /// `None` while the node is not running (never started, killed, exited).
    child: Option<Child>,
    /// How often the harness started it, to mark each start in its log.
    starts: u32,
    /// Environment variables of its next starts (see [`Cluster::set_env`]).
    env: Vec<(String, String)>,
    /// A soft limit on open files to start the node with (`None`: the harness's own).
    open_files: Option<u64>,
}

/// A raftq cluster of real processes. See the module documentation.
pub struct Cluster {
    /// `None` once kept (see `Drop`).
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    secret_file: PathBuf,
    nodes: Mutex<BTreeMap<u64, NodeProc>>,
    /// Raw HTTP client: no redirects, no connection reuse (so a killed node never leaves a
    /// stale pooled connection behind, and every request is a fresh connect).
    http: reqwest::Client,
    /// Extra `raftq serve` arguments of every node.
    extra_args: Vec<String>,
    /// With spare nodes: how many of the lowest ids form the cluster at first (they list
    /// only each other as peers; the spares list everyone and wait to be added).
    initial_voters: Option<u64>,
    /// The API token the harness's own requests and SDK clients send, when the nodes
    /// require one.
    token: Option<String>,
    /// With TLS: the CA certificate file (PEM) that signed every node's certificate. The
    /// harness's own client and its SDK clients trust it; node URLs are `https://`.
    tls_ca: Option<PathBuf>,
    /// With fault disks: each node's data directory is a file system of our own that loses
    /// unsynced writes on command ([`Cluster::disk`]).
    disks: Mutex<BTreeMap<u64, raftq_faultfs::FaultFs>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let nodes = self
            .nodes
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for node in nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Fault disks come off before the directory holding them is removed.
        let disks = std::mem::take(
            self.disks
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (_, disk) in disks {
            let _ = disk.unmount();
        }
        let keep = std::thread::panicking() || std::env::var_os("RAFTQ_TEST_KEEP").is_some();
        if keep {
            if let Some(dir) = self.dir.take() {
                let path = dir.keep();
                eprintln!("[harness] kept the cluster directory {}", path.display());
            }
        }
    }
}
