//! What both kinds of hosts lay out alike: the nodes' addresses in a private /24, their URLs
//! and peer list, and their files in the run directory.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::CLUSTER_SECRET;

/// Where a cluster's nodes live: node `N` at `<subnet>.N:<port>`, its files `nodeN*` in the
/// run directory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout<'a> {
    run_dir: &'a Path,
    nodes: u64,
    subnet: [u8; 3],
    port: u16,
}

impl<'a> Layout<'a> {
    pub(super) fn new(run_dir: &'a Path, nodes: u64, subnet: [u8; 3], port: u16) -> Self {
        Layout {
            run_dir,
            nodes,
            subnet,
            port,
        }
    }

    /// Host `host` of the subnet.
    pub(super) fn addr(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, host)
    }

    /// The address of node `id`.
    pub(super) fn node_addr(&self, id: u64) -> Ipv4Addr {
        self.addr(id as u8)
    }

    pub(super) fn url(&self, id: u64) -> String {
        format!("http://{}:{}", self.node_addr(id), self.port)
    }

    /// `--peers` of every node: `1=<url>,2=<url>,...`.
    pub(super) fn peers_arg(&self) -> String {
        (1..=self.nodes)
            .map(|id| format!("{id}={}", self.url(id)))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(super) fn secret_file(&self) -> PathBuf {
        self.run_dir.join("cluster.secret")
    }

    /// `nodeN<suffix>` in the run directory: the data directory (no suffix), the log
    /// (`.log`), a fault disk's backing directory (`.disk`), the clock file (`.faketime`).
    pub(super) fn node_file(&self, id: u64, suffix: &str) -> PathBuf {
        self.run_dir.join(format!("node{id}{suffix}"))
    }

    pub(super) fn data_dir(&self, id: u64) -> PathBuf {
        self.node_file(id, "")
    }

    pub(super) fn log_file(&self, id: u64) -> PathBuf {
        self.node_file(id, ".log")
    }

    /// Checks that the server binary `bin` is there, creates the run directory and writes
    /// the secret file.
    pub(super) fn prepare(&self, bin: &Path) -> anyhow::Result<()> {
        if !bin.is_file() {
            bail!(
                "raftq binary {} not found; build it (cargo build --release --bin raftq) or \
                 pass --raftq-bin / RAFTQ_BIN",
                bin.display()
            );
        }
        std::fs::create_dir_all(self.run_dir)
            .with_context(|| format!("cannot create {}", self.run_dir.display()))?;
        std::fs::write(self.secret_file(), format!("{CLUSTER_SECRET}\n"))
            .context("cannot write the secret file")
    }
}

/// Checks the number of nodes (1 to 250, each an address of the /24) and the name prefix (1
/// to 8 letters or digits).
pub(super) fn validate(nodes: u64, prefix: &str) -> anyhow::Result<()> {
    if nodes == 0 || nodes > 250 {
        bail!("between 1 and 250 nodes, not {nodes}");
    }
    if prefix.is_empty() || prefix.len() > 8 || !prefix.bytes().all(|b| b.is_ascii_alphanumeric()) {
        bail!("the name prefix must be 1 to 8 letters or digits, not {prefix:?}");
    }
    Ok(())
}
