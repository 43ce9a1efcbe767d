//! Settings of `raftq serve`, from flags, `RAFTQ_*` environment variables and a TOML file.
//!
//! Precedence: a flag or environment variable wins over the file, which wins over defaults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;

use crate::proposer::{DEFAULT_MAX_ENTRY_COMMANDS, MAX_ENTRY_COMMANDS};

/// Flags of `raftq serve`. Every flag has a `RAFTQ_*` environment twin.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// This node's id (a positive integer, unique in the cluster, never reused).
    #[arg(long, env = "RAFTQ_ID")]
    pub id: Option<u64>,
    /// Take the id from the host name's trailing ordinal plus one (`raftq-0` is node 1), as
    /// for the pods of a Kubernetes StatefulSet. Ignored when `--id` is given.
    #[arg(long, env = "RAFTQ_ID_FROM_HOSTNAME")]
    pub id_from_hostname: bool,
    /// Address to listen on for the client API and Raft RPC, e.g. 127.0.0.1:7001.
    #[arg(long, env = "RAFTQ_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Data directory of this node.
    #[arg(long, env = "RAFTQ_DATA")]
    pub data: Option<PathBuf>,
    /// Every voter of the cluster: `1=http://host:port,2=...,3=...` (this node included).
    #[arg(long, env = "RAFTQ_PEERS")]
    pub peers: Option<String>,
    /// Name of the cluster; a data directory of another cluster is refused.
    #[arg(long, env = "RAFTQ_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Shared secret that authenticates node-to-node Raft traffic.
    #[arg(long, env = "RAFTQ_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// File holding the cluster secret (first line).
    #[arg(long, env = "RAFTQ_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// TOML file of the API tokens this node accepts: each token's SHA-256, name and grants
    /// (see `raftq token create`). Without it the API is open to anyone who can reach it.
    #[arg(long, env = "RAFTQ_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Longest graceful shutdown before the node flushes and exits anyway, in ms.
    #[arg(long, env = "RAFTQ_SHUTDOWN_TIMEOUT_MS")]
    pub shutdown_timeout_ms: Option<u64>,
    /// Build a snapshot (and purge the log before it) after this many log entries
    /// (default 20,000).
    #[arg(long, env = "RAFTQ_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// ... or after this many bytes of commands were applied since the last snapshot
    /// (default 256 MiB), whichever comes first.
    #[arg(long, env = "RAFTQ_SNAPSHOT_BYTES")]
    pub snapshot_bytes: Option<u64>,
    /// Log entries kept before a snapshot's index when the log is purged, so a follower a
    /// little behind catches up from the log rather than a whole snapshot (default 1,000).
    #[arg(long, env = "RAFTQ_SNAPSHOT_KEEP_LOGS")]
    pub snapshot_keep_logs: Option<u64>,
    /// RocksDB memtable size per column family, in bytes (default 64 MiB). The write-ahead
    /// log is bounded at four times this: memtables are flushed when it is reached.
    #[arg(long, env = "RAFTQ_WRITE_BUFFER_BYTES")]
    pub write_buffer_bytes: Option<u64>,
    /// Size at which the Raft log starts a new segment file, in bytes (default 8 MiB). A log
    /// purge removes or recycles whole segments, so up to one segment of purged entries stays
    /// on disk; smaller segments free space sooner at the cost of more files started.
    #[arg(long, env = "RAFTQ_SEGMENT_BYTES")]
    pub segment_bytes: Option<u64>,
    /// Most client commands in one Raft entry (group commit; default 4,096). 1 turns group
    /// commit off: every command is an entry and an fsync of its own.
    #[arg(long, env = "RAFTQ_MAX_ENTRY_COMMANDS")]
    pub max_entry_commands: Option<usize>,
    /// Runtime worker threads (default: one per core). Where several nodes share a machine,
    /// 1 each spends less CPU switching between them.
    #[arg(long, env = "RAFTQ_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Most `/v1` requests this node answers at once; more get 429 `overloaded`
    /// (default 4,096).
    #[arg(long, env = "RAFTQ_MAX_REQUESTS_IN_FLIGHT")]
    pub max_requests_in_flight: Option<usize>,
    /// Most request body bytes this node holds at once, over all requests; more get 429
    /// `overloaded` (default 256 MiB; at least `max_body_bytes`).
    #[arg(long, env = "RAFTQ_MAX_BODY_BYTES_IN_FLIGHT")]
    pub max_body_bytes_in_flight: Option<u64>,
    /// Most long-polls (reads and pulls with `wait_ms`) waiting on this node at once; more
    /// get 429 `overloaded` (default 1,024).
    #[arg(long, env = "RAFTQ_MAX_LONG_POLLS")]
    pub max_long_polls: Option<usize>,
    /// Largest client request body, in bytes (default 32 MiB).
    #[arg(long, env = "RAFTQ_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// PEM certificate chain this node serves TLS with, on its one port (client API and Raft
    /// RPC). With `--tls-key`; this node's URL in `--peers` must then be `https://`.
    #[arg(long, env = "RAFTQ_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "RAFTQ_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates this node trusts when it calls `https://` peers (and nothing else).
    /// Required when any peer URL is `https://`.
    #[arg(long, env = "RAFTQ_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// TOML file with the same settings (keys as the flags, with `_` for `-`).
    #[arg(long, env = "RAFTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

/// `peers` in TOML: the flag's string, or a table `{ 1 = "http://..." }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PeersValue {
    Text(String),
    Table(BTreeMap<String, String>),
}

/// The TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    listen: Option<SocketAddr>,
    data: Option<PathBuf>,
    peers: Option<PeersValue>,
    cluster_id: Option<String>,
    cluster_secret: Option<String>,
    cluster_secret_file: Option<PathBuf>,
    tokens_file: Option<PathBuf>,
    shutdown_timeout_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    raft_body_limit: Option<usize>,
    write_timeout_ms: Option<u64>,
    snapshot_logs: Option<u64>,
    snapshot_bytes: Option<u64>,
    snapshot_keep_logs: Option<u64>,
    write_buffer_bytes: Option<u64>,
    segment_bytes: Option<u64>,
    max_entry_commands: Option<usize>,
    worker_threads: Option<usize>,
    max_requests_in_flight: Option<usize>,
    max_body_bytes_in_flight: Option<u64>,
    max_long_polls: Option<usize>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
}

/// Resolved settings of one node.
#[derive(Debug, Clone)]
pub struct Settings {
    pub id: u64,
    pub listen: SocketAddr,
    pub data: PathBuf,
    /// id -> base URL of every voter, this node included.
    pub peers: BTreeMap<u64, String>,
    pub cluster_id: String,
    pub cluster_secret: String,
    /// API tokens; empty means the API is open.
    pub tokens: std::sync::Arc<crate::tokens::Tokens>,
    /// Where the tokens came from, for the start-up log.
    pub tokens_file: Option<PathBuf>,
    pub shutdown_timeout: Duration,
    /// Largest client request body.
    pub max_body_bytes: usize,
    /// Most `/v1` requests answered at once.
    pub max_requests_in_flight: usize,
    /// Most request body bytes held at once.
    pub max_body_bytes_in_flight: u64,
    /// Most long-polls waiting at once.
    pub max_long_polls: usize,
    /// Largest Raft RPC body, and the decode limit for it.
    pub raft_body_limit: usize,
    /// How long a write waits for commit before answering "outcome unknown".
    pub write_timeout: Duration,
    /// Log entries between snapshots.
    pub snapshot_logs: u64,
    /// Applied command bytes between snapshots.
    pub snapshot_bytes: u64,
    /// Log entries kept before a snapshot when purging.
    pub snapshot_keep_logs: u64,
    /// RocksDB memtable size per column family.
    pub write_buffer_bytes: u64,
    /// Size at which the Raft log starts a new segment file.
    pub segment_bytes: u64,
    /// Most client commands in one Raft entry.
    pub max_entry_commands: usize,
    /// Runtime worker threads (`None`: one per core).
    pub worker_threads: Option<usize>,
    /// The TLS this node serves, when it has a certificate.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// The HTTP client for calls to peers (trusting `--tls-ca` for `https://` peers).
    pub peer_http: reqwest::Client,
}

impl Settings {
    /// The `/raft/status` of the peer at `url`, asked with this node's client and secret (see
    /// [`crate::raft::network::peer_status`]).
    pub async fn peer_status(&self, url: &str, timeout: Duration) -> Option<serde_json::Value> {
        crate::raft::network::peer_status(&self.peer_http, &self.cluster_secret, url, timeout).await
    }

    /// This node's own base URL, as the other nodes reach it.
    pub fn own_url(&self) -> &str {
        self.peers.get(&self.id).map_or("", String::as_str)
    }
}

/// Parses `1=http://a:1,2=http://b:2`.
pub fn parse_peers(text: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, url) = part
            .split_once('=')
            .ok_or_else(|| anyhow!("peer {part:?} is not of the form ID=URL"))?;
        insert_peer(&mut peers, id, url)?;
    }
    Ok(peers)
}

fn insert_peer(peers: &mut BTreeMap<u64, String>, id: &str, url: &str) -> anyhow::Result<()> {
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| anyhow!("peer id {id:?} is not a positive integer"))?;
    if id == 0 {
        bail!("peer id 0 is reserved; ids start at 1");
    }
    let url = url.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
        bail!("peer {id} has URL {url:?}; expected http://HOST:PORT or https://HOST:PORT");
    }
    if peers.insert(id, url.to_string()).is_some() {
        bail!("peer {id} is listed twice");
    }
    Ok(())
}

/// This machine's host name.
fn hostname() -> anyhow::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        bail!(
            "cannot read the host name: {}",
            std::io::Error::last_os_error()
        );
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The node id of a host named `NAME-ORDINAL`: the ordinal plus one.
pub fn id_from_hostname(host: &str) -> anyhow::Result<u64> {
    let short = host.split('.').next().unwrap_or(host);
    short
        .rsplit_once('-')
        .and_then(|(_, ordinal)| ordinal.parse::<u64>().ok())
        .and_then(|ordinal| ordinal.checked_add(1))
        .ok_or_else(|| {
            anyhow!("--id-from-hostname: the host name {host:?} does not end in -ORDINAL (as raftq-0 does)")
        })
}

fn read_secret(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the cluster secret file {}", path.display()))?;
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

impl ServeArgs {
    /// Merges flags, environment and the optional file into settings, checking them.
    pub fn resolve(&self) -> anyhow::Result<Settings> {
        let file: FileConfig = match &self.config {
            None => FileConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("invalid config file {}", path.display()))?
            }
        };
        let id = match self.id.or(file.id) {
            Some(id) => id,
            None if self.id_from_hostname => id_from_hostname(&hostname()?)?,
            None => bail!("--id (or RAFTQ_ID, or `id` in the config file) is required"),
        };
        if id == 0 {
            bail!("--id must be at least 1");
        }
        let listen = self
            .listen
            .or(file.listen)
            .ok_or_else(|| anyhow!("--listen HOST:PORT (or RAFTQ_LISTEN) is required"))?;
        let data = self
            .data
            .clone()
            .or(file.data)
            .ok_or_else(|| anyhow!("--data DIR (or RAFTQ_DATA) is required"))?;
        let peers = match (&self.peers, file.peers) {
            (Some(text), _) => parse_peers(text)?,
            (None, Some(PeersValue::Text(text))) => parse_peers(&text)?,
            (None, Some(PeersValue::Table(t))) => {
                let mut peers = BTreeMap::new();
                for (k, v) in t {
                    insert_peer(&mut peers, &k, &v)?;
                }
                peers
            }
            (None, None) => bail!("--peers 1=http://HOST:PORT,2=... (or RAFTQ_PEERS) is required"),
        };
        if !peers.contains_key(&id) {
            bail!("--peers must include this node's own id {id}");
        }
        let secret = match (&self.cluster_secret, &self.cluster_secret_file, file.cluster_secret, file.cluster_secret_file) {
            (Some(s), _, _, _) => s.clone(),
            (None, Some(p), _, _) => read_secret(p)?,
            (None, None, Some(s), _) => s,
            (None, None, None, Some(p)) => read_secret(&p)?,
            (None, None, None, None) => bail!(
                "a cluster secret is required to authenticate Raft traffic: --cluster-secret-file FILE \
                 (or RAFTQ_CLUSTER_SECRET / RAFTQ_CLUSTER_SECRET_FILE)"
            ),
        };
        if secret.len() < 16 {
            bail!("the cluster secret must be at least 16 characters long");
        }
        let tokens_file = self.tokens_file.clone().or(file.tokens_file);
        let tokens = match &tokens_file {
            Some(path) => crate::tokens::Tokens::load(path, &secret)?,
            None => crate::tokens::Tokens::default(),
        };
        let cluster_id = self
            .cluster_id
            .clone()
            .or(file.cluster_id)
            .unwrap_or_else(|| "raftq".into());
        if !raftq_client::api::is_valid_name(&cluster_id) {
            bail!("--cluster-id must match [A-Za-z0-9._-]{{1,128}}");
        }
        let snapshot_logs = self.snapshot_logs.or(file.snapshot_logs).unwrap_or(20_000);
        let snapshot_bytes = self
            .snapshot_bytes
            .or(file.snapshot_bytes)
            .unwrap_or(256 << 20);
        if snapshot_logs == 0 || snapshot_bytes == 0 {
            bail!("snapshot_logs and snapshot_bytes must be at least 1");
        }
        let snapshot_keep_logs = self
            .snapshot_keep_logs
            .or(file.snapshot_keep_logs)
            .unwrap_or(1_000);
        let write_buffer_bytes = within(
            "write_buffer_bytes",
            self.write_buffer_bytes.or(file.write_buffer_bytes),
            64 << 20,
            (64 << 10, 1 << 30),
            "64 KiB and 1 GiB",
        )?;
        let segment_bytes = within(
            "segment_bytes",
            self.segment_bytes.or(file.segment_bytes),
            crate::store::segments::DEFAULT_SEGMENT_BYTES,
            (64 << 10, 1 << 30),
            "64 KiB and 1 GiB",
        )?;
        let worker_threads = self
            .worker_threads
            .or(file.worker_threads)
            .map(|n| within("worker_threads", Some(n), n, (1, 1024), "1 and 1024"))
            .transpose()?;
        let max_entry_commands = within(
            "max_entry_commands",
            self.max_entry_commands.or(file.max_entry_commands),
            DEFAULT_MAX_ENTRY_COMMANDS,
            (1, MAX_ENTRY_COMMANDS),
            &format!("1 and {MAX_ENTRY_COMMANDS}"),
        )?;
        let max_body_bytes = within(
            "max_body_bytes",
            self.max_body_bytes.or(file.max_body_bytes),
            32 << 20,
            (1 << 20, 1 << 30),
            "1 MiB and 1 GiB",
        )?;
        let max_requests_in_flight = within(
            "max_requests_in_flight",
            self.max_requests_in_flight.or(file.max_requests_in_flight),
            4_096,
            (1, 1 << 20),
            "1 and 1048576",
        )?;
        let max_body_bytes_in_flight = self
            .max_body_bytes_in_flight
            .or(file.max_body_bytes_in_flight)
            .unwrap_or(256 << 20);
        if max_body_bytes_in_flight < max_body_bytes as u64 || max_body_bytes_in_flight > 1 << 40 {
            bail!(
                "max_body_bytes_in_flight ({max_body_bytes_in_flight}) must be at least max_body_bytes \
                 ({max_body_bytes}), or no request of the largest size could ever be admitted, and at most 1 TiB"
            );
        }
        let max_long_polls = within(
            "max_long_polls",
            self.max_long_polls.or(file.max_long_polls),
            1_024,
            (1, 1 << 20),
            "1 and 1048576",
        )?;
        let tls_cert = self.tls_cert.clone().or(file.tls_cert);
        let tls_key = self.tls_key.clone().or(file.tls_key);
        let tls_ca = self.tls_ca.clone().or(file.tls_ca);
        let own_https = peers[&id].starts_with("https://");
        let tls = match (&tls_cert, &tls_key) {
            (Some(cert), Some(key)) if own_https => Some(crate::tls::server_config(cert, key)?),
            (Some(_), Some(_)) => bail!(
                "this node serves TLS (--tls-cert), so its own URL in --peers must be https://, not {}",
                peers[&id]
            ),
            (Some(_), None) | (None, Some(_)) => {
                bail!("--tls-cert and --tls-key go together: give both or neither")
            }
            (None, None) if own_https => bail!(
                "this node's URL in --peers is https:// but it has no certificate: give --tls-cert and --tls-key"
            ),
            (None, None) => None,
        };
        if tls_ca.is_none() && peers.values().any(|url| url.starts_with("https://")) {
            bail!(
                "peers are reached over https://, so --tls-ca is required: the PEM CA certificates \
                 that signed the nodes' certificates (no system CA is trusted between nodes)"
            );
        }
        let peer_http = crate::tls::peer_client(tls_ca.as_deref())?;
        Ok(Settings {
            id,
            listen,
            data,
            peers,
            cluster_id,
            cluster_secret: secret,
            tokens: std::sync::Arc::new(tokens),
            tokens_file,
            shutdown_timeout: Duration::from_millis(
                self.shutdown_timeout_ms
                    .or(file.shutdown_timeout_ms)
                    .unwrap_or(15_000),
            ),
            max_body_bytes,
            max_requests_in_flight,
            max_body_bytes_in_flight,
            max_long_polls,
            raft_body_limit: file.raft_body_limit.unwrap_or(256 << 20),
            write_timeout: Duration::from_millis(file.write_timeout_ms.unwrap_or(10_000)),
            snapshot_logs,
            snapshot_bytes,
            snapshot_keep_logs,
            write_buffer_bytes,
            segment_bytes,
            max_entry_commands,
            worker_threads,
            tls,
            peer_http,
        })
    }
}

/// A setting's value (`given`, or `default`), refused with an error naming it unless it lies in
/// `bounds` (inclusive; `shown` says them in words).
fn within<T: PartialOrd + std::fmt::Display>(
    name: &str,
    given: Option<T>,
    default: T,
    bounds: (T, T),
    shown: &str,
) -> anyhow::Result<T> {
    let value = given.unwrap_or(default);
    if value < bounds.0 || value > bounds.1 {
        bail!("{name} must be between {shown}, not {value}");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> ServeArgs {
        ServeArgs {
            id: Some(1),
            listen: Some("127.0.0.1:7001".parse().unwrap()),
            data: Some("/tmp/x".into()),
            peers: Some("1=http://127.0.0.1:7001, 2=http://127.0.0.1:7002/".into()),
            cluster_secret: Some("0123456789abcdef".into()),
            ..Default::default()
        }
    }

    #[test]
    fn flags_resolve() {
        let s = base().resolve().unwrap();
        assert_eq!(s.peers[&2], "http://127.0.0.1:7002");
        assert_eq!(s.own_url(), "http://127.0.0.1:7001");
        assert_eq!(s.cluster_id, "raftq");
        assert_eq!(
            (s.snapshot_logs, s.snapshot_bytes, s.snapshot_keep_logs),
            (20_000, 256 << 20, 1_000)
        );
        assert_eq!(s.worker_threads, None, "one worker per core unless told");
        assert_eq!(s.segment_bytes, 8 << 20);
        let mut a = base();
        a.snapshot_logs = Some(50);
        a.write_buffer_bytes = Some(1 << 20);
        a.segment_bytes = Some(64 << 10);
        a.worker_threads = Some(1);
        let s = a.resolve().unwrap();
        assert_eq!((s.snapshot_logs, s.write_buffer_bytes), (50, 1 << 20));
        assert_eq!(s.segment_bytes, 64 << 10);
        assert_eq!(s.worker_threads, Some(1));
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        type Mutation = Box<dyn Fn(&mut ServeArgs)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|a| a.id = None), "--id"),
            (Box::new(|a| a.id = Some(3)), "own id 3"),
            (
                Box::new(|a| a.peers = Some("1=ftp://x".into())),
                "expected http://",
            ),
            (
                Box::new(|a| a.peers = Some("1=http://a:1,1=http://b:2".into())),
                "listed twice",
            ),
            (
                Box::new(|a| a.peers = Some("x=http://a:1".into())),
                "not a positive integer",
            ),
            (
                Box::new(|a| a.cluster_secret = Some("short".into())),
                "at least 16",
            ),
            (
                Box::new(|a| a.cluster_secret = None),
                "cluster secret is required",
            ),
            (
                Box::new(|a| a.cluster_id = Some("a b".into())),
                "--cluster-id",
            ),
            (
                Box::new(|a| a.snapshot_logs = Some(0)),
                "snapshot_logs and snapshot_bytes must be at least 1",
            ),
            (
                Box::new(|a| a.write_buffer_bytes = Some(1000)),
                "write_buffer_bytes must be between",
            ),
            (
                Box::new(|a| a.segment_bytes = Some(4096)),
                "segment_bytes must be between",
            ),
            (
                Box::new(|a| a.max_body_bytes_in_flight = Some(1 << 20)),
                "must be at least max_body_bytes",
            ),
            (
                Box::new(|a| a.max_long_polls = Some(0)),
                "max_long_polls must be between",
            ),
            (
                Box::new(|a| a.max_requests_in_flight = Some(0)),
                "max_requests_in_flight must be between",
            ),
            (
                Box::new(|a| a.max_body_bytes = Some(1000)),
                "max_body_bytes must be between",
            ),
            (
                Box::new(|a| a.worker_threads = Some(0)),
                "worker_threads must be between 1 and",
            ),
            (
                Box::new(|a| a.max_entry_commands = Some(0)),
                "max_entry_commands must be between 1 and",
            ),
            (
                Box::new(|a| a.max_entry_commands = Some(100_000)),
                "max_entry_commands must be between 1 and",
            ),
        ];
        for (mutate, want) in cases {
            let mut a = base();
            mutate(&mut a);
            let err = a.resolve().unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn tokens_file_is_loaded_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut a = base();
        assert!(a.resolve().unwrap().tokens.is_empty(), "no file: open API");
        a.tokens_file = Some(path.clone());
        let err = format!("{:#}", a.resolve().unwrap_err());
        assert!(err.contains("cannot read the tokens file"), "{err}");
        std::fs::write(
            &path,
            format!(
                "[[token]]\nname = \"t\"\nsha256 = \"{}\"\ngrants = [\"admin:*\"]\n",
                crate::tokens::token_hash_hex("tok")
            ),
        )
        .unwrap();
        assert_eq!(a.resolve().unwrap().tokens.len(), 1);
        // The cluster secret may not double as a token.
        std::fs::write(
            &path,
            format!(
                "[[token]]\nname = \"t\"\nsha256 = \"{}\"\ngrants = [\"admin:*\"]\n",
                crate::tokens::token_hash_hex("0123456789abcdef")
            ),
        )
        .unwrap();
        let err = format!("{:#}", a.resolve().unwrap_err());
        assert!(err.contains("cluster secret"), "{err}");
    }

    #[test]
    fn file_is_overridden_by_flags() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "fedcba9876543210fedcba\n").unwrap();
        let cfg = dir.path().join("n.toml");
        std::fs::write(
            &cfg,
            format!(
                "id = 2\nlisten = \"127.0.0.1:9002\"\ndata = \"/tmp/d2\"\ncluster_secret_file = {:?}\n\
                 cluster_id = \"c9\"\n[peers]\n1 = \"http://127.0.0.1:9001\"\n2 = \"http://127.0.0.1:9002\"\n",
                secret
            ),
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(cfg.clone()),
            ..Default::default()
        };
        let s = args.resolve().unwrap();
        assert_eq!(
            (s.id, s.cluster_id.as_str(), s.cluster_secret.as_str()),
            (2, "c9", "fedcba9876543210fedcba")
        );
        let args = ServeArgs {
            config: Some(cfg),
            id: Some(1),
            ..Default::default()
        };
        assert_eq!(args.resolve().unwrap().id, 1);
    }

    #[test]
    fn ids_come_from_statefulset_host_names() {
        assert_eq!(id_from_hostname("raftq-0").unwrap(), 1);
        assert_eq!(
            id_from_hostname("raftq-2.raftq-headless.ns.svc").unwrap(),
            3
        );
        assert_eq!(id_from_hostname("my-queue-11").unwrap(), 12);
        for bad in ["raftq", "raftq-", "raftq-x", "", "a-18446744073709551615"] {
            assert!(id_from_hostname(bad).is_err(), "{bad}");
        }
        // --id wins over the host name.
        let mut a = base();
        a.id_from_hostname = true;
        assert_eq!(a.resolve().unwrap().id, 1);
    }

    #[test]
    fn tls_settings_are_checked() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca_pem = file("ca.pem", &ca.pem());
        let cert_pem = file("node.pem", &cert.pem());
        let key_pem = file("node.key", &key.serialize_pem());
        let other_key = file("other.key", &KeyPair::generate().unwrap().serialize_pem());
        let garbage = file("garbage.pem", "not pem at all");
        let tls = |cert: &PathBuf, key: &PathBuf| {
            let mut a = base();
            a.peers = Some("1=https://127.0.0.1:7001,2=https://127.0.0.1:7002".into());
            a.tls_cert = Some(cert.clone());
            a.tls_key = Some(key.clone());
            a.tls_ca = Some(ca_pem.clone());
            a
        };

        let s = tls(&cert_pem, &key_pem).resolve().unwrap();
        assert!(s.tls.is_some());
        assert!(base().resolve().unwrap().tls.is_none());

        type Mutation = Box<dyn Fn(&mut ServeArgs)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|a| a.tls_cert = None), "go together"),
            (
                Box::new(|a| {
                    a.tls_cert = None;
                    a.tls_key = None;
                }),
                "https:// but it has no certificate",
            ),
            (
                Box::new(|a| a.peers = Some("1=http://127.0.0.1:7001".into())),
                "must be https://",
            ),
            (Box::new(|a| a.tls_ca = None), "--tls-ca is required"),
            (
                Box::new(|a| a.tls_cert = Some("/nonexistent/node.pem".into())),
                "cannot read the certificate file",
            ),
            (
                Box::new(|a| a.tls_cert = Some(a.tls_key.clone().unwrap())),
                "no certificate in it",
            ),
            (
                Box::new(|a| a.tls_key = Some(a.tls_cert.clone().unwrap())),
                "no PEM private key",
            ),
            (
                Box::new(|a| a.tls_ca = Some(a.tls_key.clone().unwrap())),
                "no certificate in it",
            ),
            (
                Box::new(move |a| a.tls_key = Some(other_key.clone())),
                "does not go with the certificate",
            ),
        ];
        for (mutate, expected) in cases {
            let mut a = tls(&cert_pem, &key_pem);
            mutate(&mut a);
            let err = format!("{:#}", a.resolve().unwrap_err());
            assert!(err.contains(expected), "expected {expected:?} in: {err}");
        }
        // A plain node may still call https:// peers, given the CA.
        let mut a = base();
        a.peers = Some("1=http://127.0.0.1:7001,2=https://127.0.0.1:7002".into());
        a.tls_ca = Some(ca_pem.clone());
        assert!(a.resolve().is_ok());
        a.tls_ca = Some(garbage);
        assert!(a.resolve().is_err());
    }

    /// The operations guide's configuration reference names every flag of `raftq serve` with
    /// its environment variable, so a new setting cannot go undocumented.
    #[test]
    fn every_setting_is_in_the_configuration_reference() {
        use clap::Args as _;
        let guide = include_str!("../docs/operations.md");
        let start = guide
            .find("## Configuration reference")
            .expect("the guide has a configuration reference");
        let reference = &guide[start..];
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        let mut checked = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let env = arg
                .get_env()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_else(|| panic!("--{long} has no RAFTQ_* variable"));
            let row = reference
                .lines()
                .find(|l| l.starts_with(&format!("| `--{long}")))
                .unwrap_or_else(|| panic!("--{long} is not in the configuration reference"));
            assert!(
                row.contains(&format!("`{env}`")),
                "--{long}'s row lacks {env}: {row}"
            );
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} flags found");
        for key in [
            "raft_body_limit",
            "write_timeout_ms",
            "RAFTQ_LOG_FORMAT",
            "RAFTQ_LOG`",
        ] {
            assert!(
                reference.contains(key),
                "{key} is not in the configuration reference"
            );
        }
    }
}
