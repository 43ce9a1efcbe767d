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

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::OpenOptions;
use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raftq_client::api::{
    ClusterStatus, Problem, PublishResponse, ReadResponse, Record, RecordIn, TopicInfo, TopicList,
};
use raftq_client::{Client, Error};
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

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

/// A certificate authority made at test time, and the files of one server certificate it
/// signed for `127.0.0.1` and `localhost`.
pub struct TestCa {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new CA (its own key) and a server certificate signed by it.
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let key = KeyPair::generate().expect("generate the server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} node"));
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the server certificate");
        TestCa {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes `ca.pem`, `node.pem` and `node.key` into `dir`, returning their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let paths = (
            dir.join("ca.pem"),
            dir.join("node.pem"),
            dir.join("node.key"),
        );
        std::fs::write(&paths.0, &self.ca_pem).expect("write ca.pem");
        std::fs::write(&paths.1, &self.cert_pem).expect("write node.pem");
        std::fs::write(&paths.2, &self.key_pem).expect("write node.key");
        paths
    }
}

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
        Self::start_inner(n, 0, &[], Some((tokens_toml, admin_token)), None).await
    }

    /// An `n`-node cluster that serves TLS on every port (client API and Raft alike), with
    /// one certificate signed by `ca`, and trusts `ca` between nodes.
    pub async fn start_with_tls(n: u64, ca: &TestCa) -> Cluster {
        Self::start_inner(n, 0, &[], None, Some(ca)).await
    }

    async fn start_full(n: u64, spares: u64, extra_args: &[&str]) -> Cluster {
        Self::start_inner(n, spares, extra_args, None, None).await
    }

    /// An `n`-node cluster whose every data directory is a fault disk: a FUSE file system of
    /// our own that keeps unsynced writes only in a form it can drop, as a power loss would
    /// ([`Cluster::disk`]). Needs root and `/dev/fuse`.
    pub async fn start_on_fault_disks(n: u64, extra_args: &[&str]) -> Cluster {
        if let Err(e) = raftq_faultfs::check_environment() {
            panic!("fault disks cannot be mounted here: {e}");
        }
        Self::start_inner_on(n, 0, extra_args, None, None, true).await
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
    ) -> Cluster {
        Self::start_inner_on(n, spares, extra_args, tokens, tls, false).await
    }

    async fn start_inner_on(
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

    // ----- addresses and files -------------------------------------------------------------

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

    fn spawn(&self, id: u64) {
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

    // ----- logs and failures ---------------------------------------------------------------

    /// Everything node `id` wrote to stdout and stderr, over all its starts.
    pub fn log(&self, id: u64) -> String {
        let path = lock(&self.nodes)
            .get(&id)
            .map(|n| n.log.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"));
        std::fs::read(&path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// What node `id` logged since its latest start.
    pub fn log_since_last_start(&self, id: u64) -> String {
        let log = self.log(id);
        match log.rfind("===== [harness] start #") {
            Some(at) => log[at..].to_string(),
            None => log,
        }
    }

    fn any_start_log_contains(&self, needle: &str) -> bool {
        self.ids()
            .into_iter()
            .any(|id| self.log_since_last_start(id).contains(needle))
    }

    /// `msg`, the cluster directory, and the tail of every node's log.
    pub fn report(&self, msg: &str) -> String {
        let mut text = format!(
            "{msg}\n\ncluster directory: {} (kept for inspection)\n",
            self.root.display()
        );
        let states: Vec<(u64, u16, bool)> = lock(&self.nodes)
            .iter()
            .map(|(id, n)| (*id, n.port, n.child.is_some()))
            .collect();
        for (id, port, running) in states {
            let state = if running { "running" } else { "not running" };
            text.push_str(&format!(
                "\n----- node {id} (port {port}, {state}): last {LOG_TAIL_LINES} log lines -----\n{}\n",
                tail(&self.log(id), LOG_TAIL_LINES)
            ));
        }
        text
    }

    /// Panics with `msg` and the tails of every node's log.
    #[track_caller]
    pub fn fail(&self, msg: &str) -> ! {
        panic!("{}", self.report(msg))
    }

    // ----- waiting ---------------------------------------------------------------------------

    /// Polls `check` until it returns `Ok`, at most `timeout`; then fails with the last error.
    pub async fn wait_for<F, Fut>(&self, what: &str, timeout: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check().await {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "timed out after {timeout:?} waiting for {what}; last state: {last}"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A node the harness started that exited on its own, if any (it is marked not running).
    fn unexpected_exit(&self) -> Option<String> {
        let mut nodes = lock(&self.nodes);
        for (id, node) in nodes.iter_mut() {
            if let Some(child) = node.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    node.child = None;
                    return Some(format!("node {id} exited unexpectedly with {status}"));
                }
            }
        }
        None
    }

    /// `GET /v1/cluster` on node `id`.
    pub async fn status(&self, id: u64) -> Result<ClusterStatus, String> {
        let resp = self
            .http
            .get(format!("{}/v1/cluster", self.url(id)))
            .timeout(Duration::from_secs(3))
            .send()
            .await
            .map_err(|e| format!("GET /v1/cluster on node {id}: {e}"))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status != StatusCode::OK {
            return Err(format!(
                "GET /v1/cluster on node {id} answered {status}: {body}"
            ));
        }
        serde_json::from_str(&body)
            .map_err(|e| format!("GET /v1/cluster on node {id}: undecodable ({e}): {body}"))
    }

    /// The leader every running node names, in the same term; an error says who disagrees.
    pub async fn agreed_leader(&self) -> Result<u64, String> {
        let ids = self.running_ids();
        if ids.is_empty() {
            return Err("no node is running".into());
        }
        let mut seen = Vec::with_capacity(ids.len());
        for id in &ids {
            seen.push(self.status(*id).await?);
        }
        let views: Vec<String> = seen
            .iter()
            .map(|s| {
                format!(
                    "node {} sees leader {:?} in term {}",
                    s.node_id, s.leader_id, s.term
                )
            })
            .collect();
        let first = &seen[0];
        let leader = first.leader_id.ok_or_else(|| views.join("; "))?;
        if seen
            .iter()
            .any(|s| s.leader_id != Some(leader) || s.term != first.term)
        {
            return Err(views.join("; "));
        }
        if !ids.contains(&leader) {
            return Err(format!(
                "the named leader is not running: {}",
                views.join("; ")
            ));
        }
        Ok(leader)
    }

    async fn poll_leader(&self, timeout: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(exit) = self.unexpected_exit() {
                return Err(exit);
            }
            let last = match self.agreed_leader().await {
                Ok(id) => return Ok(id),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!("no agreed leader after {timeout:?}: {last}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until every running node has applied the same index, then returns each node's
    /// state digest (`GET /v1/cluster?digest=true`) at that index.
    pub async fn digests(&self) -> Vec<(u64, String)> {
        let mut last = String::new();
        for _ in 0..100 {
            let mut seen = Vec::new();
            for id in self.running_ids() {
                let s: ClusterStatus = self.get_json(id, "/v1/cluster?digest=true").await;
                let d = s
                    .state_digest
                    .unwrap_or_else(|| self.fail("no state_digest in the answer"));
                seen.push((id, d.index, d.digest));
            }
            if seen.iter().all(|(_, index, _)| *index == seen[0].1) {
                return seen.into_iter().map(|(_, i, d)| (i, d)).collect();
            }
            last = format!("{seen:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.fail(&format!("the nodes never applied the same index: {last}"))
    }

    /// Waits until every running node agrees on a running leader; returns its id.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        match self.poll_leader(timeout).await {
            Ok(id) => id,
            Err(e) => self.fail(&format!("waiting for a leader: {e}")),
        }
    }

    /// The current leader (waits up to 30 s for one).
    pub async fn leader_id(&self) -> u64 {
        self.wait_leader(Duration::from_secs(30)).await
    }

    /// A running node that is not the current leader.
    pub async fn follower_id(&self) -> u64 {
        let leader = self.leader_id().await;
        match self.running_ids().into_iter().find(|id| *id != leader) {
            Some(id) => id,
            None => self.fail("no running follower"),
        }
    }

    /// Waits until node `id` answers `GET /healthz` with 200.
    async fn wait_healthy(&self, id: u64, deadline: Instant) -> Result<(), String> {
        loop {
            {
                let mut nodes = lock(&self.nodes);
                let node = nodes.get_mut(&id).expect("node exists");
                match node.child.as_mut().map(Child::try_wait) {
                    None => return Err(format!("node {id} is not running")),
                    Some(Ok(Some(status))) => {
                        node.child = None;
                        return Err(format!("node {id} exited with {status}"));
                    }
                    Some(_) => {}
                }
            }
            let healthy = self
                .http
                .get(format!("{}/healthz", self.url(id)))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK);
            if healthy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("node {id} did not answer /healthz in time"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    // ----- process control -------------------------------------------------------------------

    /// The process id of running node `id`.
    pub fn pid(&self, id: u64) -> u32 {
        match lock(&self.nodes).get(&id).and_then(|n| n.child.as_ref()) {
            Some(child) => child.id(),
            None => panic!("node {id} is not running"),
        }
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&self, id: u64) {
        let child = lock(&self.nodes).get_mut(&id).and_then(|n| n.child.take());
        match child {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            None => self.fail(&format!("kill: node {id} is not running")),
        }
    }

    /// SIGKILLs every running node at once (all signals first, then the reaping).
    pub fn kill_all(&self) {
        let mut children: Vec<Child> = lock(&self.nodes)
            .values_mut()
            .filter_map(|n| n.child.take())
            .collect();
        for child in &mut children {
            let _ = child.kill();
        }
        for child in &mut children {
            let _ = child.wait();
        }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to node `id` without waiting.
    pub fn signal(&self, id: u64, signal: libc::c_int) {
        let pid = self.pid(id) as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            self.fail(&format!(
                "kill({pid}, {signal}) for node {id} failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }

    /// Waits, at most `timeout`, for node `id` to exit; returns its exit status.
    pub async fn wait_exit(&self, id: u64, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut nodes = lock(&self.nodes);
                let node = nodes.get_mut(&id).expect("node exists");
                match node.child.as_mut().map(Child::try_wait) {
                    None => {
                        drop(nodes);
                        self.fail(&format!("wait_exit: node {id} is not running"));
                    }
                    Some(Ok(Some(status))) => {
                        node.child = None;
                        return status;
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => {
                        drop(nodes);
                        self.fail(&format!("waiting for node {id}: {e}"));
                    }
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!("node {id} did not exit within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERMs node `id` and waits (at most 25 s) for it to exit.
    pub async fn terminate(&self, id: u64) -> ExitStatus {
        self.signal(id, libc::SIGTERM);
        self.wait_exit(id, Duration::from_secs(25)).await
    }

    /// Runs `cmd` and waits (at most 10 s) for it to exit; returns its status and output.
    pub async fn run_to_exit(&self, mut cmd: Command, what: &str) -> (bool, String) {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| self.fail(&format!("{what}: cannot spawn: {e}")));
        let started = std::time::Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collect output");
                self.fail(&format!(
                    "{what}: still running after 10 s: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = child.wait_with_output().expect("collect output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Sets environment variables for the next starts of node `id` (e.g. a fake clock);
    /// an empty list clears them.
    pub fn set_env(&self, id: u64, env: &[(&str, &str)]) {
        let mut nodes = lock(&self.nodes);
        let node = nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"));
        node.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Starts node `id` again with the same command line and data directory, without waiting
    /// for anything.
    pub fn start_node(&self, id: u64) {
        self.spawn(id);
    }

    /// Starts node `id` again with the same command line and data directory, and waits until
    /// it answers `/healthz` (not until it caught up: see [`Cluster::wait_converged`]).
    pub async fn restart(&self, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.spawn(id);
            match self.wait_healthy(id, deadline).await {
                Ok(()) => return,
                // The port can stay busy for a moment after a kill (or another process took
                // it in between): try again until the deadline.
                Err(_)
                    if Instant::now() < deadline
                        && self.log_since_last_start(id).contains("cannot listen")
                        && !self.is_running(id) =>
                {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => self.fail(&format!("restarting node {id}: {e}")),
            }
        }
    }

    // ----- raw HTTP --------------------------------------------------------------------------

    /// Sends `request`; a transport error fails the test (with `what` and the logs).
    pub async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> reqwest::Response {
        match request.send().await {
            Ok(resp) => resp,
            Err(e) => self.fail(&format!("{what}: transport error: {e:?}")),
        }
    }

    /// The running nodes other than `node`.
    pub fn running_except(&self, node: u64) -> Vec<u64> {
        let mut ids = self.running_ids();
        ids.retain(|id| *id != node);
        ids
    }

    /// Kills every node but the leader, which is then alone: it may append entries but can
    /// never commit them. Returns the leader and the nodes killed.
    pub async fn isolate_leader(&self) -> (u64, Vec<u64>) {
        let leader = self.leader_id().await;
        let followers = self.running_except(leader);
        for id in &followers {
            self.kill(*id);
        }
        (leader, followers)
    }

    /// `Ok` when leader `id`'s own log (as its `/v1/cluster` says) ends beyond its commit
    /// index: it appended an entry it has not committed.
    pub async fn appended_beyond_commit(&self, id: u64) -> Result<(), String> {
        let status = self.status(id).await?;
        let own = status.matched_index(id);
        match own {
            Some(end) if end > status.commit_index => Ok(()),
            _ => Err(format!(
                "log end {own:?}, commit index {}",
                status.commit_index
            )),
        }
    }

    /// `{method} {path}` without a body to node `node`; the raw answer.
    pub async fn call(&self, method: reqwest::Method, node: u64, path: &str) -> reqwest::Response {
        let what = format!("{method} {path} on node {node}");
        let url = format!("{}{path}", self.url(node));
        self.send(self.http.request(method, url), &what).await
    }

    /// Creates subscription `sub` of `topic` starting at its first record, on the leader.
    pub async fn subscribe_from_first(&self, topic: &str, sub: &str) -> Value {
        self.leader_json(
            reqwest::Method::PUT,
            &format!("/v1/topics/{topic}/subscriptions/{sub}"),
            json!({"start": "first"}),
        )
        .await
    }

    /// `POST {path}` with a JSON body to the current leader; the raw answer.
    pub async fn post_to_leader(&self, path: &str, body: &Value) -> reqwest::Response {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        self.send(self.http.post(url).json(body), &format!("POST {path}"))
            .await
    }

    /// `METHOD {path}` with a JSON body on the current leader, expecting a 2xx; its JSON
    /// answer (`Null` when it has none).
    pub async fn leader_json(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        let what = format!("{method} {path} on leader {leader}");
        let resp = self
            .send(self.http.request(method, url).json(&body), &what)
            .await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        if !(200..300).contains(&status) {
            self.fail(&format!("{what} answered {status}: {text}"));
        }
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Pulls `pull` messages of `topic`/`sub` on the leader (leases of 10 minutes) and acks the
    /// first `ack` of them; the receipts of all that were pulled.
    pub async fn pull_and_ack(
        &self,
        topic: &str,
        sub: &str,
        pull: usize,
        ack: usize,
    ) -> Vec<Value> {
        let base = format!("/v1/topics/{topic}/subscriptions/{sub}");
        let pulled = self
            .leader_json(
                reqwest::Method::POST,
                &format!("{base}/pull"),
                json!({"max": pull, "ack_timeout_ms": 600_000}),
            )
            .await;
        let receipts: Vec<Value> = pulled["messages"]
            .as_array()
            .map(|m| m.iter().map(|m| m["receipt"].clone()).collect())
            .unwrap_or_default();
        if receipts.len() != pull {
            self.fail(&format!("pulled {} of {pull}: {pulled}", receipts.len()));
        }
        self.leader_json(
            reqwest::Method::POST,
            &format!("{base}/ack"),
            json!({"receipts": receipts[..ack]}),
        )
        .await;
        receipts
    }

    /// `PUT {path}` with a JSON body on the current leader, expecting 200 or 201 (creating a
    /// topic or a subscription).
    pub async fn put_json(&self, path: &str, body: &Value) {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        let resp = self
            .send(self.http.put(url).json(body), &format!("PUT {path}"))
            .await;
        let status = resp.status().as_u16();
        if status != 200 && status != 201 {
            let text = resp.text().await.unwrap_or_default();
            self.fail(&format!("PUT {path} answered {status}: {text}"));
        }
    }

    /// `GET {path}` on node `id`, expecting 200 and a JSON body of type `T`.
    pub async fn get_json<T: DeserializeOwned>(&self, id: u64, path: &str) -> T {
        let what = format!("GET {path} on node {id}");
        let resp = self
            .send(self.http.get(format!("{}{path}", self.url(id))), &what)
            .await;
        self.json_of(resp, 200, &what).await
    }

    /// The body of `resp` as `T`, after checking its status is `status`.
    pub async fn json_of<T: DeserializeOwned>(
        &self,
        resp: reqwest::Response,
        status: u16,
        what: &str,
    ) -> T {
        let got = resp.status().as_u16();
        let body = resp.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        if got != status {
            self.fail(&format!(
                "{what}: expected status {status}, got {got}: {text}"
            ));
        }
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| self.fail(&format!("{what}: undecodable answer ({e}): {text}")))
    }

    /// Checks that `resp` is an RFC 9457 problem with `status` and `code` and every field
    /// API.md names; returns it and the answer's headers.
    pub async fn check_problem(
        resp: reqwest::Response,
        status: u16,
        code: &str,
    ) -> Result<(Problem, HeaderMap), String> {
        let got = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading the body: {e}"))?;
        let text = String::from_utf8_lossy(&body);
        if got != status {
            return Err(format!("expected {status} {code}, got {got}: {text}"));
        }
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with(PROBLEM_JSON) {
            return Err(format!(
                "content-type is {content_type:?}, not {PROBLEM_JSON}; body: {text}"
            ));
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("problem body is not JSON ({e}): {text}"))?;
        for field in ["type", "title", "detail", "code"] {
            if !value[field].is_string() {
                return Err(format!(
                    "problem field {field:?} missing or not a string: {text}"
                ));
            }
        }
        if value["status"].as_u64() != Some(u64::from(status)) {
            return Err(format!("problem field \"status\" is not {status}: {text}"));
        }
        if value["code"] != code {
            return Err(format!("expected code {code:?}: {text}"));
        }
        let problem: Problem = serde_json::from_value(value).map_err(|e| {
            format!("problem does not decode as raftq_client::api::Problem ({e}): {text}")
        })?;
        Ok((problem, headers))
    }

    /// [`Cluster::check_problem`], failing the test on a mismatch.
    pub async fn expect_problem(
        &self,
        resp: reqwest::Response,
        status: u16,
        code: &str,
        what: &str,
    ) -> (Problem, HeaderMap) {
        match Self::check_problem(resp, status, code).await {
            Ok(answer) => answer,
            Err(e) => self.fail(&format!("{what}: {e}")),
        }
    }

    /// `GET /v1/topics` on node `id`.
    pub async fn topics(&self, id: u64) -> TopicList {
        self.get_json(id, "/v1/topics").await
    }

    /// `GET /v1/topics/{name}` on node `id`: `Err` with the answer when it is not 200.
    pub async fn topic(&self, id: u64, name: &str) -> Result<TopicInfo, String> {
        let resp = self
            .http
            .get(format!("{}/v1/topics/{name}", self.url(id)))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| format!("GET /v1/topics/{name} on node {id}: {e}"))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status != StatusCode::OK {
            return Err(format!(
                "GET /v1/topics/{name} on node {id} answered {status}: {body}"
            ));
        }
        serde_json::from_str(&body)
            .map_err(|e| format!("GET /v1/topics/{name} on node {id}: undecodable ({e}): {body}"))
    }

    /// `GET /v1/topics/{topic}/records?{query}` on node `id`, expecting 200.
    pub async fn read(&self, id: u64, topic: &str, query: &str) -> ReadResponse {
        self.get_json(id, &format!("/v1/topics/{topic}/records?{query}"))
            .await
    }

    /// Every record of `topic` as node `id` serves it: reads from `first`, page after page,
    /// until the high watermark.
    pub async fn read_all(&self, id: u64, topic: &str) -> Vec<Record> {
        let mut records = Vec::new();
        let mut from = String::from("first");
        loop {
            let page = self
                .read(id, topic, &format!("from={from}&max=10000"))
                .await;
            let progressed = !page.records.is_empty();
            records.extend(page.records);
            if page.next_offset >= page.high_watermark {
                return records;
            }
            if !progressed {
                self.fail(&format!(
                    "node {id}: reading {topic} from {from} returned no record although \
                     next_offset {} < high_watermark {}",
                    page.next_offset, page.high_watermark
                ));
            }
            from = page.next_offset.to_string();
        }
    }

    /// Creates `name` on the leader with the default configuration (201 expected). Definite
    /// refusals caused by a leader change (307, 503) are retried.
    pub async fn create_topic(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leader = self.leader_id().await;
            let what = format!("PUT /v1/topics/{name} on leader {leader}");
            let resp = self
                .send(
                    self.http
                        .put(format!("{}/v1/topics/{name}", self.url(leader)))
                        .json(&json!({})),
                    &what,
                )
                .await;
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            match status {
                201 => return,
                307 | 503 if Instant::now() < deadline => tokio::time::sleep(POLL).await,
                _ => self.fail(&format!("{what}: expected 201, got {status}: {body}")),
            }
        }
    }

    /// Publishes text `values` as one batch on the leader, raw (no SDK), and returns the
    /// answer. Definite refusals caused by a leader change (307, 503) are retried.
    pub async fn publish_values(&self, topic: &str, values: &[String]) -> PublishResponse {
        let records: Vec<RecordIn> = values.iter().map(|v| RecordIn::text(v.clone())).collect();
        let body = json!({ "records": records });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leader = self.leader_id().await;
            let what = format!(
                "publishing {} records to {topic} on leader {leader}",
                values.len()
            );
            let resp = self
                .send(
                    self.http
                        .post(format!("{}/v1/topics/{topic}/records", self.url(leader)))
                        .json(&body),
                    &what,
                )
                .await;
            let status = resp.status().as_u16();
            if (status == 307 || status == 503) && Instant::now() < deadline {
                tokio::time::sleep(POLL).await;
                continue;
            }
            return self.json_of(resp, 200, &what).await;
        }
    }

    /// Waits (at most 30 s) until every running node agrees on a leader, has applied at least
    /// up to the leader's commit index, and serves the same `next_offset` for `topic`.
    pub async fn wait_converged(&self, topic: &str) {
        let cluster = self;
        let what = format!("every running node to apply everything committed (topic {topic})");
        self.wait_for(&what, Duration::from_secs(30), move || async move {
            let leader = cluster.agreed_leader().await?;
            let leader_status = cluster.status(leader).await?;
            let leader_topic = cluster.topic(leader, topic).await?;
            for id in cluster.running_ids() {
                let status = cluster.status(id).await?;
                if status.last_applied < leader_status.commit_index {
                    return Err(format!(
                        "node {id} applied up to {} < the leader's commit index {}",
                        status.last_applied, leader_status.commit_index
                    ));
                }
                let info = cluster.topic(id, topic).await?;
                if info.summary.next_offset != leader_topic.summary.next_offset {
                    return Err(format!(
                        "node {id} has next_offset {} for {topic}, the leader {}",
                        info.summary.next_offset, leader_topic.summary.next_offset
                    ));
                }
            }
            Ok(())
        })
        .await;
    }

    /// Waits for convergence, reads all of `topic` from every running node separately, checks
    /// that the offsets are dense from 0 and that every node returns the very same records,
    /// and returns them.
    pub async fn consistent_log(&self, topic: &str) -> Vec<Record> {
        self.wait_converged(topic).await;
        let mut logs = Vec::new();
        for id in self.running_ids() {
            logs.push((id, self.read_all(id, topic).await));
        }
        let (first_id, first) = &logs[0];
        for (i, record) in first.iter().enumerate() {
            if record.offset != i as u64 {
                self.fail(&format!(
                    "node {first_id}: topic {topic} is not dense from 0: position {i} holds \
                     offset {} ({:?})",
                    record.offset, record.value
                ));
            }
        }
        for (id, log) in &logs[1..] {
            if log != first {
                let at = first
                    .iter()
                    .zip(log.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(first.len().min(log.len()));
                self.fail(&format!(
                    "nodes {first_id} and {id} diverge on topic {topic}: {} vs {} records, first \
                     difference at position {at}: {:?} vs {:?}",
                    first.len(),
                    log.len(),
                    first.get(at),
                    log.get(at)
                ));
            }
        }
        first.clone()
    }

    /// Checks a publish history against the final log of its topic (see
    /// [`history_violations`]) and fails the test on any violation. Returns a summary.
    pub fn check_history(
        &self,
        log: &[Record],
        histories: &[History],
        others: &[String],
    ) -> String {
        let (violations, summary) = history_violations(log, histories, others);
        if !violations.is_empty() {
            let shown = violations.len().min(30);
            self.fail(&format!(
                "the publish history does not match the log ({summary}); {} violations, the \
                 first {shown}:\n  {}",
                violations.len(),
                violations[..shown].join("\n  ")
            ));
        }
        summary
    }
}

/// Judges publish histories against the final log of their topic, as the chaos suite does
/// (CHECKERS.md): every acknowledged value is present exactly once, at the offset it was
/// acknowledged at (lost / duplicated / wrong offset); an indeterminate value at most once; a
/// definitely refused value never (aborted write); nothing in the log that nobody published
/// (unexpected); and each task's acknowledged offsets increase in acknowledgement order
/// (nonmonotonic send). `others` are values published outside the histories. Returns the
/// violations and a summary of the counts.
pub fn history_violations(
    log: &[Record],
    histories: &[History],
    others: &[String],
) -> (Vec<String>, String) {
    let mut positions: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut violations = Vec::new();
    for record in log {
        match record.value.as_deref() {
            Some(value) => positions.entry(value).or_default().push(record.offset),
            None => violations.push(format!(
                "unexpected: offset {} holds a binary value {:?}",
                record.offset, record.value_b64
            )),
        }
    }
    let found = |value: &str| positions.get(value).cloned().unwrap_or_default();
    let mut attempted: BTreeSet<&str> = others.iter().map(String::as_str).collect();
    let (mut acked, mut indeterminate, mut refused, mut recovered) = (0, 0, 0, 0);
    for history in histories {
        let mut previous: Option<(&str, u64)> = None;
        for (value, ack) in &history.acked {
            acked += 1;
            attempted.insert(value);
            let at = found(value);
            if at.is_empty() {
                violations.push(format!(
                    "lost: task {} value {value:?} was acknowledged at offset {} but is not in \
                     the log",
                    history.task, ack.first_offset
                ));
            } else if at.len() > 1 {
                violations.push(format!(
                    "duplicated: acknowledged value {value:?} is at offsets {at:?}"
                ));
            } else if at[0] != ack.first_offset || ack.last_offset != ack.first_offset {
                violations.push(format!(
                    "wrong offset: value {value:?} was acknowledged at offsets {}..={} but is \
                     at {}",
                    ack.first_offset, ack.last_offset, at[0]
                ));
            }
            if let Some((before, offset)) = previous {
                if ack.first_offset <= offset {
                    violations.push(format!(
                        "nonmonotonic send: task {} got {value:?} acknowledged at {} after \
                         {before:?} at {offset}",
                        history.task, ack.first_offset
                    ));
                }
            }
            previous = Some((value, ack.first_offset));
        }
        for (value, error) in &history.indeterminate {
            indeterminate += 1;
            attempted.insert(value);
            let at = found(value);
            if at.len() > 1 {
                violations.push(format!(
                    "duplicated: value {value:?} (indeterminate: {error}) is at offsets {at:?} \
                     although it was sent once"
                ));
            }
            recovered += at.len();
        }
        for (value, error) in &history.refused {
            refused += 1;
            attempted.insert(value);
            let at = found(value);
            if !at.is_empty() {
                violations.push(format!(
                    "aborted write visible: value {value:?} was definitely refused ({error}) \
                     but is at offsets {at:?}"
                ));
            }
        }
        for (value, error) in &history.odd {
            violations.push(format!(
                "the SDK answered {value:?} with an unexpected error: {error}"
            ));
        }
    }
    for record in log {
        if let Some(value) = record.value.as_deref() {
            if !attempted.contains(value) {
                violations.push(format!(
                    "unexpected: offset {} holds {value:?}, which nobody published",
                    record.offset
                ));
            }
        }
    }
    let summary = format!(
        "{} records in the log; {acked} acknowledged, {indeterminate} indeterminate \
         ({recovered} of them present), {refused} definitely refused",
        log.len()
    );
    (violations, summary)
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

// ----- publisher load through the SDK ----------------------------------------------------------

/// What one sequential publisher task saw, in order.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub task: usize,
    /// Values the SDK acknowledged (Ok), with the answer, in acknowledgement order.
    pub acked: Vec<(String, PublishResponse)>,
    /// Values whose publish may or may not have been applied (`Error::Indeterminate`).
    pub indeterminate: Vec<(String, String)>,
    /// Values definitely not applied (`Error::Api`, `Error::Unavailable`).
    pub refused: Vec<(String, String)>,
    /// Values answered with an error the SDK should never give here.
    pub odd: Vec<(String, String)>,
}

/// Publisher tasks running in the background.
pub struct Load {
    pub stop: Arc<AtomicBool>,
    pub acks: Arc<AtomicUsize>,
    handles: Vec<tokio::task::JoinHandle<History>>,
}

impl Load {
    /// Starts `tasks` tasks, each publishing up to `per_task` single-record batches one after
    /// the other through `client`, with values unique across tasks.
    pub fn start(client: &Client, topic: &str, tasks: usize, per_task: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(AtomicUsize::new(0));
        let handles = (0..tasks)
            .map(|task| {
                let (client, topic) = (client.clone(), topic.to_string());
                let (stop, acks) = (stop.clone(), acks.clone());
                tokio::spawn(async move {
                    let mut history = History {
                        task,
                        ..History::default()
                    };
                    for i in 0..per_task {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let value = format!("{topic}/t{task}/{i:06}");
                        let record = RecordIn::text(value.clone());
                        match client.publish_records(&topic, vec![record]).await {
                            Ok(ack) => {
                                history.acked.push((value, ack));
                                acks.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e @ Error::Indeterminate { .. }) => {
                                history.indeterminate.push((value, e.to_string()))
                            }
                            Err(e @ (Error::Api(_) | Error::Unavailable { .. })) => {
                                history.refused.push((value, e.to_string()))
                            }
                            Err(e) => history.odd.push((value, format!("{e:?}"))),
                        }
                    }
                    history
                })
            })
            .collect();
        Load {
            stop,
            acks,
            handles,
        }
    }

    /// Acknowledged publishes so far, over all tasks.
    pub fn acked(&self) -> usize {
        self.acks.load(Ordering::SeqCst)
    }

    /// Asks the tasks to stop after their current publish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits (at most `timeout` in all) for every task to finish and returns their histories.
    pub async fn finish(self, cluster: &Cluster, timeout: Duration) -> Vec<History> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut histories = Vec::with_capacity(self.handles.len());
        for handle in self.handles {
            match tokio::time::timeout_at(deadline, handle).await {
                Ok(Ok(history)) => histories.push(history),
                Ok(Err(e)) => cluster.fail(&format!("a publisher task failed: {e}")),
                Err(_) => cluster.fail(&format!(
                    "the publisher tasks did not finish within {timeout:?}"
                )),
            }
        }
        histories
    }
}

/// Waits until `load` has at least `target` acknowledged publishes.
pub async fn wait_acks(cluster: &Cluster, load: &Load, target: usize, timeout: Duration) {
    let acks = load.acks.clone();
    cluster
        .wait_for(
            &format!("{target} acknowledged publishes"),
            timeout,
            move || {
                let now = acks.load(Ordering::SeqCst);
                async move {
                    if now >= target {
                        Ok(())
                    } else {
                        Err(format!("{now} acknowledged"))
                    }
                }
            },
        )
        .await;
}
