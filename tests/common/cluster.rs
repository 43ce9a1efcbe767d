//! Starting a cluster (ports, directories, TLS, tokens, fault disks), the nodes' addresses
//! and files, SDK clients, and the `raftq serve` command line of each node.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use raftq_client::Client;
use reqwest::header::HeaderMap;

use super::{free_port, lock, Cluster, NodeProc, TestCa, BIN, CLUSTER_ID, SECRET};

impl Cluster {
    /// Starts an `n`-node cluster and waits until all nodes agree on a leader.
    pub async fn start(n: u64) -> Cluster {
        Self::start_with(n, &[]).await
    }

    /// [`Cluster::start`], with extra `raftq serve` arguments for every node (e.g.
    /// `--snapshot-logs 50`).
    pub async fn start_with(n: u64, extra_args: &[&str]) -> Cluster {
        Self::start_full(n, 0, extra_args).await
    }

    /// A cluster of `voters` nodes, plus `spares` more (the next ids) that are not started:
    /// start one with [`Cluster::restart`], then add it through the membership API.
    pub async fn start_with_spares(voters: u64, spares: u64, extra_args: &[&str]) -> Cluster {
        Self::start_full(voters, spares, extra_args).await
    }

    /// An `n`-node cluster that requires API tokens: `tokens_toml` is the tokens file every
    /// node gets, `admin_token` the token the harness itself sends (it must be granted
    /// `admin:*` for the harness's own checks to work).
    pub async fn start_with_tokens(n: u64, tokens_toml: &str, admin_token: &str) -> Cluster {
        Self::start_inner(n, 0, &[], Some((tokens_toml, admin_token)), None, false).await
    }

    /// An `n`-node cluster that serves TLS on every port (client API and Raft alike), with
    /// one certificate signed by `ca`, and trusts `ca` between nodes.
    pub async fn start_with_tls(n: u64, ca: &TestCa) -> Cluster {
        Self::start_inner(n, 0, &[], None, Some(ca), false).await
    }

    async fn start_full(n: u64, spares: u64, extra_args: &[&str]) -> Cluster {
        Self::start_inner(n, spares, extra_args, None, None, false).await
    }

    /// An `n`-node cluster whose every data directory is a fault disk: a FUSE file system of
    /// our own that keeps unsynced writes only in a form it can drop, as a power loss would
    /// ([`Cluster::disk`]). Needs root and `/dev/fuse`.
    pub async fn start_on_fault_disks(n: u64, extra_args: &[&str]) -> Cluster {
        if let Err(e) = raftq_faultfs::check_environment() {
            panic!("fault disks cannot be mounted here: {e}");
        }
        Self::start_inner(n, 0, extra_args, None, None, true).await
    }

    /// The fault disk under node `id`'s data directory (see [`Cluster::start_on_fault_disks`]).
    pub fn disk(&self, id: u64) -> raftq_faultfs::Control {
        lock(&self.disks)
            .get(&id)
            .unwrap_or_else(|| panic!("node {id} has no fault disk"))
            .control()
    }

    async fn start_inner(
        n: u64,
        spares: u64,
        extra_args: &[&str],
        tokens: Option<(&str, &str)>,
        tls: Option<&TestCa>,
        fault_disks: bool,
    ) -> Cluster {
        const ATTEMPTS: u32 = 3;
        for attempt in 1..=ATTEMPTS {
            let mut cluster = Cluster::create(n + spares, tokens.map(|(_, t)| t), tls);
            if fault_disks {
                cluster.mount_fault_disks();
            }
            cluster.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
            if tls.is_some() {
                let dir = cluster.root.clone();
                for (flag, file) in [
                    ("--tls-cert", "node.pem"),
                    ("--tls-key", "node.key"),
                    ("--tls-ca", "ca.pem"),
                ] {
                    cluster.extra_args.push(flag.into());
                    cluster
                        .extra_args
                        .push(dir.join(file).to_string_lossy().into_owned());
                }
            }
            if let Some((text, _)) = tokens {
                let path = cluster.root.join("tokens.toml");
                std::fs::write(&path, text).expect("write the tokens file");
                cluster.extra_args.push("--tokens-file".into());
                cluster.extra_args.push(path.to_string_lossy().into_owned());
            }
            if spares > 0 {
                cluster.initial_voters = Some(n);
            }
            for id in 1..=n {
                cluster.spawn(id);
            }
            match cluster.poll_leader(Duration::from_secs(30)).await {
                Ok(_) => return cluster,
                Err(err)
                    if attempt < ATTEMPTS && cluster.any_start_log_contains("cannot listen") =>
                {
                    eprintln!("[harness] a port was taken by someone else; starting over: {err}");
                }
                Err(err) => cluster.fail(&format!("the new cluster did not elect a leader: {err}")),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn create(n: u64, token: Option<&str>, tls: Option<&TestCa>) -> Cluster {
        assert!(n >= 1, "a cluster needs at least one node");
        let dir = tempfile::Builder::new()
            .prefix("raftq-it-")
            .tempdir()
            .expect("create a temporary directory");
        let root = dir.path().to_path_buf();
        let secret_file = root.join("cluster.secret");
        std::fs::write(&secret_file, format!("{SECRET}\n")).expect("write the secret file");
        let nodes = (1..=n)
            .map(|id| {
                let node = NodeProc {
                    port: free_port(),
                    data: root.join(format!("node{id}")),
                    log: root.join(format!("node{id}.log")),
                    child: None,
                    starts: 0,
                    env: Vec::new(),
                    open_files: None,
                };
                (id, node)
            })
            .collect();
        let mut headers = HeaderMap::new();
        if let Some(t) = token {
            let value = format!("Bearer {t}")
                .parse()
                .expect("a token fits in a header");
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut http = reqwest::Client::builder();
        let tls_ca = tls.map(|ca| ca.write(&root).0);
        if let Some(ca) = tls {
            let cert = reqwest::Certificate::from_pem(ca.ca_pem.as_bytes()).expect("CA PEM");
            http = http
                .use_rustls_tls()
                .tls_built_in_root_certs(false)
                .add_root_certificate(cert);
        }
        let http = http
            .default_headers(headers)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(45))
            .build()
            .expect("build the HTTP client");
        Cluster {
            dir: Some(dir),
            root,
            secret_file,
            nodes: Mutex::new(nodes),
            http,
            extra_args: Vec::new(),
            initial_voters: None,
            token: token.map(str::to_owned),
            tls_ca,
            disks: Mutex::new(BTreeMap::new()),
        }
    }

    /// Mounts a fault disk at every node's data directory, backed by `diskN/` beside it.
    fn mount_fault_disks(&self) {
        let dirs: Vec<(u64, PathBuf)> = lock(&self.nodes)
            .iter()
            .map(|(id, n)| (*id, n.data.clone()))
            .collect();
        for (id, data) in dirs {
            let backing = self.root.join(format!("disk{id}"));
            for dir in [&backing, &data] {
                std::fs::create_dir_all(dir)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
            }
            let fs = raftq_faultfs::FaultFs::mount(&backing, &data)
                .unwrap_or_else(|e| panic!("mounting a fault disk at {}: {e}", data.display()));
            lock(&self.disks).insert(id, fs);
        }
    }

    /// Every node id of the cluster, running or not.
    pub fn ids(&self) -> Vec<u64> {
        lock(&self.nodes).keys().copied().collect()
    }

    /// The ids of the nodes the harness believes are running.
    pub fn running_ids(&self) -> Vec<u64> {
        lock(&self.nodes)
            .iter()
            .filter(|(_, n)| n.child.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn is_running(&self, id: u64) -> bool {
        lock(&self.nodes)
            .get(&id)
            .is_some_and(|n| n.child.is_some())
    }

    pub fn port(&self, id: u64) -> u16 {
        lock(&self.nodes)
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
            .port
    }

    /// Base URL of node `id`, as in `--peers` (no trailing slash).
    pub fn url(&self, id: u64) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port(id))
    }

    /// `https` when the cluster serves TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls_ca.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The CA file of a TLS cluster.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls_ca.as_deref()
    }

    /// Base URLs of every node, in id order.
    pub fn urls(&self) -> Vec<String> {
        self.ids().into_iter().map(|id| self.url(id)).collect()
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        lock(&self.nodes)
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
            .data
            .clone()
    }

    /// How many files named `*<suffix>` node `id`'s Raft log directory holds (`.seg`: its
    /// segments; `.spare`: purged segments kept for reuse).
    pub fn log_files(&self, id: u64, suffix: &str) -> usize {
        let dir = self.data_dir(id).join("log");
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
            .count()
    }

    /// The cluster's temporary directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The raw HTTP client (redirects disabled).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// An SDK client that knows every node, with a 20 s deadline per call.
    pub fn client(&self) -> Client {
        self.client_for(&self.urls())
    }

    /// A three-node cluster with topic `topic`, and an SDK client of it (see
    /// [`Cluster::client_with_topic`]).
    pub async fn start_with_client(topic: &str) -> (Cluster, Client) {
        let c = Cluster::start(3).await;
        let client = c.client_with_topic(topic).await;
        (c, client)
    }

    /// An SDK client, after creating `topic` (default settings) through it.
    pub async fn client_with_topic(&self, topic: &str) -> raftq_client::Client {
        let client = self.client();
        let config = raftq_client::api::TopicConfig::default();
        if let Err(e) = client.create_topic(topic, &config).await {
            self.fail(&format!("creating {topic} through the SDK: {e}"));
        }
        client
    }

    /// An SDK client that knows only `urls`, with a 20 s deadline per call.
    pub fn client_for(&self, urls: &[String]) -> Client {
        let mut builder = Client::builder(urls).deadline(Duration::from_secs(20));
        if let Some(t) = &self.token {
            builder = builder.token(t);
        }
        if let Some(ca) = &self.tls_ca {
            builder = builder
                .ca_file(ca)
                .unwrap_or_else(|e| self.fail(&format!("cannot read the CA file: {e}")));
        }
        builder
            .build()
            .unwrap_or_else(|e| self.fail(&format!("cannot build an SDK client: {e}")))
    }

    fn peers_arg(
        nodes: &BTreeMap<u64, NodeProc>,
        id: u64,
        initial: Option<u64>,
        scheme: &str,
    ) -> String {
        let limit = match initial {
            Some(k) if id <= k => k,
            _ => u64::MAX,
        };
        nodes
            .iter()
            .filter(|(peer, _)| **peer <= limit)
            .map(|(id, n)| format!("{id}={scheme}://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `raftq serve` command line of a node of this cluster, with the given id, port, data
    /// directory and cluster id (the harness uses its own values; tests vary them to check the
    /// start-up guards). Standard streams are left to the caller.
    pub fn serve_command(&self, id: u64, port: u16, data: &Path, cluster_id: &str) -> Command {
        let peers = Self::peers_arg(&lock(&self.nodes), id, self.initial_voters, self.scheme());
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data")
            .arg(data)
            .arg("--peers")
            .arg(peers)
            .arg("--cluster-secret-file")
            .arg(&self.secret_file)
            .arg("--cluster-id")
            .arg(cluster_id)
            .args(&self.extra_args);
        // Only the command line configures the node: no RAFTQ_* leaks in from the test's
        // environment, except the log filter, which may be overridden with RAFTQ_TEST_LOG.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RAFTQ_") {
                cmd.env_remove(name);
            }
        }
        let filter = std::env::var("RAFTQ_TEST_LOG").unwrap_or_else(|_| "info".to_string());
        cmd.env("RAFTQ_LOG", filter);
        // Plain logs: they end up in files and in panic messages.
        cmd.env("NO_COLOR", "1");
        cmd
    }

    pub(super) fn spawn(&self, id: u64) {
        let (port, data, log_path) = {
            let nodes = lock(&self.nodes);
            let node = nodes
                .get(&id)
                .unwrap_or_else(|| panic!("no node {id} in this cluster"));
            assert!(node.child.is_none(), "node {id} is already running");
            (node.port, node.data.clone(), node.log.clone())
        };
        let mut cmd = self.serve_command(id, port, &data, CLUSTER_ID);
        if let Some(node) = lock(&self.nodes).get(&id) {
            cmd.envs(node.env.iter().map(|(k, v)| (k, v)));
            if let Some(soft) = node.open_files {
                use std::os::unix::process::CommandExt;
                // SAFETY: between fork and exec only getrlimit and setrlimit run, both
                // async-signal-safe, on a struct of the child's own stack.
                unsafe {
                    cmd.pre_exec(move || {
                        let mut limit = libc::rlimit {
                            rlim_cur: 0,
                            rlim_max: 0,
                        };
                        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        limit.rlim_cur = soft.min(limit.rlim_max);
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
        }
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open the node log");
        let mut nodes = lock(&self.nodes);
        let node = nodes.get_mut(&id).expect("node exists");
        node.starts += 1;
        let _ = writeln!(
            log,
            "===== [harness] start #{} of node {id} =====",
            node.starts
        );
        let stdout = log.try_clone().expect("clone the log file handle");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {BIN}: {e}"));
        node.child = Some(child);
    }
}
