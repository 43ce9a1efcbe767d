//! Hosts as Docker containers on a private Docker network.
//!
//! # Layout
//! ```text
//!   root namespace (the harness)                  container rqj-n1      container rqj-n2 ...
//!   bridge rqjd0  10.232.0.254/24  ── network rqj-net ── eth0 10.232.0.1   eth0 10.232.0.2
//! ```
//! - The image (`raftq-jepsen:local`) is built at setup, every run, from the server binary the
//!   run uses, without any registry: a root filesystem holding the binary
//!   (`/usr/local/bin/raftq`), exactly the shared libraries `ldd` lists for it and the dynamic
//!   loader, imported with `docker import` as a `FROM scratch` image.
//! - One Docker network (`<prefix>-net`, a bridge named `<prefix>d0`, gateway `.254`: the
//!   harness's side) and one container per node (`<prefix>-nN`) at the fixed address `.N`,
//!   running `raftq serve` on `<subnet>.N:<port>` with the same arguments as the namespace
//!   hosts. The containers are created once and started, killed and started again as they
//!   are: the same container, the same command line.
//! - The data directory `nodeN/` and the secret file are bind-mounted from the run directory:
//!   writes and fsyncs go to the run directory's filesystem, not to the storage driver's, and
//!   the data survives a kill and a restart.
//! - Logs are Docker's (`docker logs`, kept across restarts); they are copied to `nodeN.log`
//!   in the run directory whenever they are read and at teardown.
//! - Docker lets traffic within its networks through the root namespace's FORWARD chain
//!   itself; the harness still inserts its own tagged `ACCEPT` rule for the bridge, as the
//!   namespace hosts do, so that a daemon configured otherwise (no inter-container traffic)
//!   does not break the cluster. Setup also checks that the root namespace routes the subnet
//!   to the bridge, so that the harness reaches every container's address directly.
//!
//! # Faults
//! - `kill`: `docker kill -s KILL`, then `docker wait`; `start`: `docker start`.
//! - `kill_all`: one `docker kill -s KILL` naming every running container, then `docker wait`
//!   for each. Docker has no one signal for several containers: the CLI asks the daemon to
//!   kill each container, all requests at once, so the nodes die within milliseconds of each
//!   other, not at the same instant as the network-namespace hosts' process group does.
//! - `pause`/`resume`: `docker pause`/`docker unpause` (the cgroup freezer: the process is
//!   frozen without a signal it could see).
//! - `partition`, `cut_oneway`, `impair`, `heal`: as [`super::net`] describes, inside each container's
//!   network namespace, entered from the host with `nsenter -t <pid> -n` (the image has no
//!   `iptables` or `tc`; the host's are used). A restarted container has a fresh namespace:
//!   the faults in force are put back into it right after `docker start`.
//!
//! # Cleanup
//! Setup first removes whatever an earlier run with the same names left behind (containers,
//! the network, the FORWARD rule, the image). [`Hosts::teardown`] (also run on drop)
//! removes the containers, the network, the rule and the image again.
//! Needs root, Docker (the CLI and a running daemon), `nsenter` (util-linux), `iptables`, `ip`,
//! `ldd` and `tar`.
//!
//! # Modules
//! - `setup`: setting up and removing what the containers need: the tools checked, the image,
//!   the network and the containers.
//! - This module: the configuration (names, addresses, the arguments of `docker create`),
//!   making the hosts ([`DockerHosts::create`]) and the [`Hosts`] implementation.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context as _};

use super::layout::{validate, Layout};
use super::net::{lock, run, NetFaults, NetNs, NodeNet};
use super::{Hosts, Netem, PowerLoss};

mod setup;

use setup::{build_image, create_network, remove_leftovers};

pub use setup::preflight;

/// Address of the bridge (the harness's side, the network's gateway) in the subnet.
const GATEWAY_HOST: u8 = 254;
/// Seconds a graceful stop waits before SIGKILL.
const STOP_TIMEOUT_SECS: u32 = 20;
/// Where the server binary lives in the image.
const IMAGE_BIN: &str = "/usr/local/bin/raftq";
/// Where the data directory and the secret file are mounted in a container.
const DATA_MOUNT: &str = "/data";
const SECRET_MOUNT: &str = "/cluster.secret";

/// How to lay out the containers.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The `raftq` server binary (dynamically linked or static) the image is built from.
    pub bin: PathBuf,
    /// Where data directories, logs and the secret file go.
    pub run_dir: PathBuf,
    /// Number of nodes (ids 1..=nodes), at most 250.
    pub nodes: u64,
    /// The private /24 of the Docker network: its first three octets, e.g. `[10, 232, 0]`.
    pub subnet: [u8; 3],
    /// Name prefix of the containers (`<prefix>-nN`), the network (`<prefix>-net`) and its
    /// bridge (`<prefix>d0`). At most 8 letters or digits.
    pub prefix: String,
    /// The image tag the harness builds and removes.
    pub image: String,
    /// The port every node listens on, on its own address.
    pub port: u16,
    /// `--cluster-id` of the cluster.
    pub cluster_id: String,
    /// `RAFTQ_LOG` filter of the nodes.
    pub log_filter: String,
}

impl DockerConfig {
    /// Three nodes in 10.232.0.0/24, names `rqj*`, image `raftq-jepsen:local`, port 7000.
    pub fn new(bin: PathBuf, run_dir: PathBuf) -> Self {
        DockerConfig {
            bin,
            run_dir,
            nodes: 3,
            subnet: [10, 232, 0],
            prefix: "rqj".to_string(),
            image: "raftq-jepsen:local".to_string(),
            port: 7000,
            cluster_id: "jepsen".to_string(),
            log_filter: "info".to_string(),
        }
    }

    /// The container of node `id`.
    pub fn container(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    /// The Docker network.
    pub fn network(&self) -> String {
        format!("{}-net", self.prefix)
    }

    /// The network's bridge in the root namespace.
    fn bridge(&self) -> String {
        format!("{}d0", self.prefix)
    }

    /// The nodes' addresses, URLs and files.
    fn layout(&self) -> Layout<'_> {
        Layout::new(&self.run_dir, self.nodes, self.subnet, self.port)
    }

    /// The address of node `id`.
    pub fn node_addr(&self, id: u64) -> Ipv4Addr {
        self.layout().node_addr(id)
    }

    /// True when `name` is one of this configuration's containers, of this run or an earlier
    /// one with more nodes: `<prefix>-n<digits>`.
    fn is_ours(&self, name: &str) -> bool {
        name.strip_prefix(&format!("{}-n", self.prefix))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }

    /// The arguments of `docker create` for node `id`.
    fn create_args(&self, id: u64) -> Vec<String> {
        let mount = |src: &Path, dst: &str, extra: &str| {
            format!("type=bind,src={},dst={dst}{extra}", src.display())
        };
        let mut args: Vec<String> = [
            "create",
            "--name",
            &self.container(id),
            "--hostname",
            &self.container(id),
            "--network",
            &self.network(),
            "--ip",
            &self.node_addr(id).to_string(),
            "--log-driver",
            "json-file",
            "--mount",
            &mount(&self.layout().data_dir(id), DATA_MOUNT, ""),
            "--mount",
            &mount(&self.layout().secret_file(), SECRET_MOUNT, ",readonly"),
            "--env",
            &format!("RAFTQ_LOG={}", self.log_filter),
            "--env",
            "NO_COLOR=1",
            &self.image,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(
            [
                "serve",
                "--id",
                &id.to_string(),
                "--listen",
                &format!("{}:{}", self.node_addr(id), self.port),
                "--data",
                DATA_MOUNT,
                "--peers",
                &self.layout().peers_arg(),
                "--cluster-secret-file",
                SECRET_MOUNT,
                "--cluster-id",
                &self.cluster_id,
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args
    }

    fn validate(&self) -> anyhow::Result<()> {
        validate(self.nodes, &self.prefix)?;
        // `--mount` takes comma-separated key=value pairs.
        let run_dir = self.run_dir.to_string_lossy();
        if run_dir.contains(',') || run_dir.contains('=') {
            bail!(
                "the run directory {run_dir} contains ',' or '=', which Docker's --mount \
                 cannot take; choose another --out"
            );
        }
        Ok(())
    }
}

/// What the harness believes about one container.
#[derive(Debug, Default, Clone, Copy)]
struct Node {
    /// Started and not killed since.
    running: bool,
    /// Paused and not resumed since.
    paused: bool,
}

/// A cluster of `raftq` nodes in Docker containers. See the module documentation.
pub struct DockerHosts {
    cfg: Arc<DockerConfig>,
    nodes: Arc<Mutex<BTreeMap<u64, Node>>>,
    faults: Arc<NetFaults>,
    torn_down: AtomicBool,
}

/// Every node's address and, when its container runs, its namespace (by the container's
/// main process).
fn net_nodes(cfg: &DockerConfig) -> anyhow::Result<Vec<NodeNet>> {
    let names: Vec<String> = (1..=cfg.nodes).map(|id| cfg.container(id)).collect();
    let mut args = vec!["inspect", "--format", "{{.State.Pid}}"];
    args.extend(names.iter().map(String::as_str));
    let pids = run("docker", &args)?;
    let pids: Vec<u32> = pids
        .lines()
        .map(|l| l.trim().parse::<u32>().unwrap_or(0))
        .collect();
    Ok((1..=cfg.nodes)
        .zip(pids.into_iter().chain(std::iter::repeat(0)))
        .map(|(id, pid)| NodeNet {
            id,
            addr: cfg.node_addr(id),
            ns: (pid != 0).then_some(NetNs::Process(pid)),
        })
        .collect())
}

/// Copies the container's log (stdout and stderr, in order) to `nodeN.log`.
fn save_log(cfg: &DockerConfig, id: u64) -> anyhow::Result<()> {
    let file = File::create(cfg.layout().log_file(id)).context("cannot write the node's log")?;
    let status = Command::new("docker")
        .args(["logs", &cfg.container(id)])
        .stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .status()
        .context("cannot run docker logs")?;
    if !status.success() {
        bail!("docker logs {} failed: {status}", cfg.container(id));
    }
    Ok(())
}

impl DockerHosts {
    /// Checks the machine, removes leftovers of an earlier run with the same names, builds the
    /// image, creates the network and the containers, and writes the secret file. Starts no
    /// node.
    pub fn create(cfg: DockerConfig) -> anyhow::Result<DockerHosts> {
        cfg.validate()?;
        preflight()?;
        cfg.layout().prepare(&cfg.bin)?;
        for id in 1..=cfg.nodes {
            std::fs::create_dir_all(cfg.layout().data_dir(id)).with_context(|| {
                format!("cannot create {}", cfg.layout().data_dir(id).display())
            })?;
        }
        remove_leftovers(&cfg);
        let hosts = DockerHosts {
            nodes: Arc::new(Mutex::new(
                (1..=cfg.nodes).map(|id| (id, Node::default())).collect(),
            )),
            cfg: Arc::new(cfg),
            faults: Arc::new(NetFaults::default()),
            torn_down: AtomicBool::new(false),
        };
        // On failure, `hosts` drops here and removes what was made so far.
        build_image(&hosts.cfg)?;
        create_network(&hosts.cfg).context("cannot set up the Docker network")?;
        Ok(hosts)
    }

    /// The configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.cfg
    }

    /// Runs `docker <args>` for node `id` off the async runtime, updating what the harness
    /// believes about the node when it succeeded.
    async fn docker(
        &self,
        id: u64,
        args: &[&str],
        update: impl FnOnce(&mut Node) + Send + 'static,
    ) -> anyhow::Result<()> {
        let name = self.cfg.container(id);
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.push(name);
        let nodes = Arc::clone(&self.nodes);
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            run("docker", &args)?;
            if let Some(node) = lock(&nodes).get_mut(&id) {
                update(node);
            }
            Ok(())
        })
        .await?
    }

    fn node(&self, id: u64) -> Node {
        lock(&self.nodes).get(&id).copied().unwrap_or_default()
    }
}

impl Drop for DockerHosts {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Hosts for DockerHosts {
    fn ids(&self) -> Vec<u64> {
        (1..=self.cfg.nodes).collect()
    }

    fn url(&self, id: u64) -> String {
        self.cfg.layout().url(id)
    }

    async fn start(&self, id: u64) -> anyhow::Result<()> {
        if self.is_running(id) {
            return Ok(());
        }
        self.docker(id, &["start"], |n| {
            n.running = true;
            n.paused = false;
        })
        .await
        .with_context(|| format!("cannot start node {id}"))?;
        // A fresh namespace: put the network faults in force back.
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        tokio::task::spawn_blocking(move || faults.restore(id, &net_nodes(&cfg)?))
            .await?
            .with_context(|| format!("cannot restore the network faults of node {id}"))
    }

    async fn kill(&self, id: u64) -> anyhow::Result<()> {
        if !self.node(id).running {
            return Ok(());
        }
        let (cfg, nodes) = (Arc::clone(&self.cfg), Arc::clone(&self.nodes));
        tokio::task::spawn_blocking(move || {
            let name = cfg.container(id);
            if let Err(err) = run("docker", &["kill", "--signal", "KILL", &name]) {
                // Fine when it had exited already.
                if !format!("{err:#}").contains("is not running") {
                    return Err(err.context(format!("cannot kill node {id}")));
                }
            }
            // Until it is gone.
            run("docker", &["wait", &name]).context("cannot wait for the killed node")?;
            if let Some(node) = lock(&nodes).get_mut(&id) {
                node.running = false;
                node.paused = false;
            }
            Ok(())
        })
        .await?
    }

    async fn kill_all(&self) -> anyhow::Result<String> {
        let running: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|id| self.node(*id).running)
            .collect();
        if running.is_empty() {
            return Ok("no container was running".to_string());
        }
        let (cfg, nodes) = (Arc::clone(&self.cfg), Arc::clone(&self.nodes));
        tokio::task::spawn_blocking(move || {
            let names: Vec<String> = running.iter().map(|id| cfg.container(*id)).collect();
            let mut args = vec!["kill", "--signal", "KILL"];
            args.extend(names.iter().map(String::as_str));
            if let Err(err) = run("docker", &args) {
                // Fine for a container that had exited already; anything else is not.
                let text = format!("{err:#}");
                let unexpected = text
                    .lines()
                    .any(|l| l.contains("Error") && !l.contains("is not running"));
                if unexpected {
                    return Err(err.context(format!("cannot kill nodes {running:?}")));
                }
            }
            for (id, name) in running.iter().zip(&names) {
                run("docker", &["wait", name])
                    .with_context(|| format!("cannot wait for killed node {id}"))?;
                if let Some(node) = lock(&nodes).get_mut(id) {
                    node.running = false;
                    node.paused = false;
                }
            }
            Ok(format!(
                "one `docker kill -s KILL` of containers {}",
                names.join(" ")
            ))
        })
        .await?
    }

    async fn pause(&self, id: u64) -> anyhow::Result<()> {
        let node = self.node(id);
        if !node.running || node.paused {
            return Ok(());
        }
        self.docker(id, &["pause"], |n| n.paused = true).await
    }

    async fn resume(&self, id: u64) -> anyhow::Result<()> {
        if !self.node(id).paused {
            return Ok(());
        }
        self.docker(id, &["unpause"], |n| n.paused = false).await
    }

    async fn partition(&self, groups: &[Vec<u64>]) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let groups = groups.to_vec();
        tokio::task::spawn_blocking(move || faults.partition(&net_nodes(&cfg)?, &groups)).await?
    }

    async fn impair(&self, ids: &[u64], netem: &Netem) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let (ids, netem) = (ids.to_vec(), *netem);
        tokio::task::spawn_blocking(move || faults.impair(&net_nodes(&cfg)?, &ids, &netem)).await?
    }

    async fn cut_oneway(&self, links: &[(u64, u64)]) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        let links = links.to_vec();
        tokio::task::spawn_blocking(move || faults.cut_oneway(&net_nodes(&cfg)?, &links)).await?
    }

    async fn heal(&self) -> anyhow::Result<()> {
        let (cfg, faults) = (Arc::clone(&self.cfg), Arc::clone(&self.faults));
        tokio::task::spawn_blocking(move || faults.heal(&net_nodes(&cfg)?)).await?
    }

    /// `docker stop` (SIGTERM, SIGKILL after 20 s), after unpausing.
    async fn stop(&self, id: u64) -> anyhow::Result<String> {
        if !self.is_running(id) {
            return Ok("not running".to_string());
        }
        if self.node(id).paused {
            self.resume(id).await?;
        }
        let timeout = STOP_TIMEOUT_SECS.to_string();
        self.docker(id, &["stop", "--time", &timeout], |n| n.running = false)
            .await?;
        let cfg = Arc::clone(&self.cfg);
        let code = tokio::task::spawn_blocking(move || {
            run(
                "docker",
                &[
                    "inspect",
                    "--format",
                    "{{.State.ExitCode}}",
                    &cfg.container(id),
                ],
            )
        })
        .await??;
        Ok(format!("exit status: {}", code.trim()))
    }

    fn log(&self, id: u64) -> String {
        // The container's log when it still exists, else the copy of the last one.
        let _ = save_log(&self.cfg, id);
        std::fs::read(self.cfg.layout().log_file(id))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// Removes the containers (their logs copied to the run directory first), the network,
    /// the FORWARD rule and the image.
    fn teardown(&self) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        self.faults.shutdown();
        for id in 1..=self.cfg.nodes {
            let _ = save_log(&self.cfg, id);
        }
        remove_leftovers(&self.cfg);
    }

    fn is_running(&self, id: u64) -> bool {
        if !self.node(id).running {
            return false;
        }
        let state = run(
            "docker",
            &[
                "inspect",
                "--format",
                "{{.State.Running}}",
                &self.cfg.container(id),
            ],
        );
        let running = state.is_ok_and(|s| s.trim() == "true");
        if !running {
            // Exited on its own.
            if let Some(node) = lock(&self.nodes).get_mut(&id) {
                node.running = false;
                node.paused = false;
            }
        }
        running
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.cfg.layout().data_dir(id)
    }

    /// The container's exit code when it is not running (Docker keeps the last one; after a
    /// kill by the harness that is 137, which is not an exit of its own: `None` then).
    fn exit_status(&self, id: u64) -> Option<String> {
        if self.is_running(id) {
            return None;
        }
        let code = run(
            "docker",
            &[
                "inspect",
                "--format",
                "{{.State.ExitCode}}",
                &self.cfg.container(id),
            ],
        )
        .ok()?;
        let code = code.trim();
        (code != "137").then(|| format!("exit status: {code}"))
    }

    fn disk(&self, id: u64) -> anyhow::Result<raftq_faultfs::Control> {
        bail!(
            "fault disks are not supported with --hosts docker (node {id}'s data directory is a \
             bind mount, not a fault file system): run this scenario with --hosts netns"
        )
    }

    async fn power_loss(&self, ids: &[u64]) -> anyhow::Result<PowerLoss> {
        bail!(
            "power loss needs fault disks, which are not supported with --hosts docker (nodes \
             {ids:?} untouched): run this scenario with --hosts netns"
        )
    }

    fn set_clock(&self, id: u64, offset_ms: i64) -> anyhow::Result<()> {
        bail!(
            "fake clocks (libfaketime) are not supported with --hosts docker (node {id}'s clock \
             not moved by {offset_ms} ms): run this scenario with --hosts netns"
        )
    }
}

#[cfg(test)]
#[path = "docker_tests.rs"]
mod tests;
