//! One raftq node: opens storage, starts Raft and the HTTP server, forms the cluster when it
//! is new, and shuts down gracefully.
//!
//! Shutdown protocol (SIGTERM or SIGINT), bounded by `shutdown_timeout`:
//! 1. the shutdown flag is raised: new `/v1` requests get 503 `shutting_down` with the
//!    leader's address, and every open long-poll answers at once with what it has;
//! 2. writes already proposed are given time to finish, so their clients get a definite answer;
//! 3. a leader waits until every voter has its whole log, so the next leader loses nothing and
//!    is elected as soon as the followers' election timeout fires;
//! 4. Raft stops, the HTTP server stops, RocksDB's WAL is fsynced and the memtables flushed,
//!    the database is closed and the process exits 0.

use openraft::async_runtime::watch::WatchReceiver as _;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::Uri;
use openraft::BasicNode;
use tokio::sync::watch;

use crate::api::error::ApiError;
use crate::clock::{EntryClock, JumpDetector};
use crate::config::Settings;
use crate::proposer::{ProposeError, Proposer, ProposerLimits};
use crate::raft::network::{Network, SECRET_HEADER};
use crate::raft::{NodeId, Raft};
use crate::state::{Command, CommitPoint, Outcome};
use crate::store::{self, DataDir, LogStore, SmShared, StateMachineStore};

/// Everything a request handler needs. Shared as [`AppState`].
pub struct Node {
    pub id: NodeId,
    pub settings: Settings,
    pub raft: Raft,
    pub sm: Arc<SmShared>,
    pub proposer: Proposer,
    /// What the node holds at once (requests, body bytes, long-polls).
    pub limits: crate::api::limits::Limits,
    /// Highest committed index known here (from the log store).
    pub committed: Arc<AtomicU64>,
    /// The time this node stamps into entries when it leads (see [`crate::clock`]).
    pub clock: Arc<EntryClock>,
    /// Raised once at the start of shutdown; handlers and long-polls watch it.
    shutdown_tx: watch::Sender<bool>,
    /// Writes between "proposed" and "answered", so shutdown can let them finish.
    writes_in_flight: AtomicUsize,
    /// Set once shutdown stops Raft on purpose, so that is not mistaken for a fatal error.
    stopping_raft: AtomicBool,
    /// Set while this leader hands leadership to another voter: writes are refused (a
    /// definite 503) and heartbeats paused, so the followers' lease on it can lapse.
    transferring: AtomicBool,
}

pub type AppState = Arc<Node>;

/// Ends a leadership transfer when dropped: heartbeats on, writes accepted again.
struct TransferGuard<'a>(&'a Node);

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        self.0.raft.runtime_config().heartbeat(true);
        self.0.transferring.store(false, Ordering::SeqCst);
    }
}

/// Decrements the in-flight write count when a write handler finishes, however it ends.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Node {
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    /// A receiver that changes when shutdown begins.
    pub fn shutdown_rx(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    /// The current leader's id and URL, when known.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let id = m.current_leader?;
        let url = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, url))
    }

    /// Whether this node believes it leads.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().current_leader == Some(self.id)
    }

    /// Whether this node leads and has heard from a quorum recently. A leader cut off from
    /// its followers keeps believing it leads (openraft does not step down on its own); it
    /// must not take writes that can only time out, nor report itself ready.
    pub fn leads_with_quorum(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        if m.current_leader != Some(self.id) {
            return false;
        }
        if m.membership_config.membership().voter_ids().count() <= 1 {
            return true;
        }
        m.last_quorum_acked.as_ref().is_some_and(|acked| {
            openraft::Instant::elapsed(&**acked) <= Duration::from_millis(QUORUM_STALE_MS)
        })
    }

    /// Whether a leadership transfer is under way on this node.
    pub fn is_transferring(&self) -> bool {
        self.transferring.load(Ordering::SeqCst)
    }

    /// Answers early, without doing anything, unless this node leads with a quorum: a 307 to
    /// the leader, or 503 `no_leader` (also while a transfer is under way). A definite "not
    /// applied".
    pub fn require_leader(&self, uri: &Uri) -> Result<(), ApiError> {
        match self.leader() {
            Some((id, _))
                if id == self.id && (!self.leads_with_quorum() || self.is_transferring()) =>
            {
                Err(ApiError::no_leader())
            }
            Some((id, _)) if id == self.id => Ok(()),
            Some((id, url)) => Err(ApiError::not_leader(id, &url, &path_and_query(uri))),
            None => Err(ApiError::no_leader()),
        }
    }

    /// Hands leadership to voter `to` (or the most up-to-date follower): writes pause (answered
    /// 503 `no_leader`, never applied), the followers are let catch up, heartbeats stop until
    /// the followers' lease on this leader lapses, and the target is asked to start an
    /// election. Returns the new leader. Leader only.
    pub async fn transfer_leadership(&self, to: Option<NodeId>) -> Result<NodeId, ApiError> {
        let (target, url) = match to {
            Some(id) if id == self.id => {
                return Err(ApiError::invalid(format!("node {id} already leads")))
            }
            Some(id) => {
                let m = self.raft.metrics().borrow_watched().clone();
                let membership = m.membership_config.membership();
                if !membership.voter_ids().any(|v| v == id) {
                    return Err(ApiError::invalid(format!(
                        "node {id} is not a voter; only a voter can lead"
                    )));
                }
                let url = membership
                    .get_node(&id)
                    .map(|n| n.addr.clone())
                    .unwrap_or_default();
                (id, url)
            }
            None => most_up_to_date_follower(self)
                .ok_or_else(|| ApiError::invalid("there is no other voter to lead"))?,
        };
        if self.transferring.swap(true, Ordering::SeqCst) {
            return Err(ApiError::no_leader());
        }
        // Heartbeats come back and writes resume however this ends, a dropped request
        // (cancelling this future) included.
        let _resume = TransferGuard(self);
        self.transfer_to(target, &url).await
    }

    async fn transfer_to(&self, target: NodeId, url: &str) -> Result<NodeId, ApiError> {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        while self.writes_in_flight.load(Ordering::SeqCst) > 0
            && start.elapsed() < Duration::from_secs(2)
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        wait_followers_caught_up(self, deadline).await;
        self.raft.runtime_config().heartbeat(false);
        let paused = Instant::now();
        hand_over(self, target, url, paused, deadline).await;
        let mut rx = self.raft.metrics();
        loop {
            let leader = rx.borrow_watched().current_leader;
            match leader {
                Some(id) if id != self.id => return Ok(id),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(ApiError::internal(format!(
                    "node {target} did not take over within 10 s; this node still leads"
                ))
                .with_status(503));
            }
        }
    }

    /// Proposes one command through Raft and maps every failure to its API answer.
    /// `uri` is the request's path and query, for the 307 to the leader.
    pub async fn propose(
        &self,
        uri: &Uri,
        cmd: Command,
    ) -> Result<(Outcome, CommitPoint), ApiError> {
        if self.is_shutting_down() {
            return Err(ApiError::shutting_down(
                self.leader().filter(|(id, _)| *id != self.id),
            ));
        }
        self.require_leader(uri)?;
        self.writes_in_flight.fetch_add(1, Ordering::SeqCst);
        let _guard = InFlight(&self.writes_in_flight);
        match self
            .proposer
            .propose(cmd, self.settings.write_timeout)
            .await
        {
            Ok((Ok(outcome), cp)) => Ok((outcome, cp)),
            Ok((Err(refused), _)) => Err(refused.into()),
            Err(ProposeError::NotLeader {
                leader_id: Some(id),
                leader_url: Some(url),
            }) if id != self.id => Err(ApiError::not_leader(id, &url, &path_and_query(uri))),
            Err(ProposeError::NotLeader { .. }) => Err(ApiError::no_leader()),
            Err(ProposeError::Overloaded) => Err(ApiError::overloaded(
                "too many writes queued on this node; retry shortly",
            )),
            Err(ProposeError::ShuttingDown) => Err(ApiError::shutting_down(None)),
            Err(ProposeError::Indeterminate(why)) => Err(ApiError::indeterminate(why)),
        }
    }
}

/// Raft timing. The leader lease openraft grants is `ELECTION_TIMEOUT_MAX_MS`.
const HEARTBEAT_MS: u64 = 100;
const ELECTION_TIMEOUT_MIN_MS: u64 = 600;
const ELECTION_TIMEOUT_MAX_MS: u64 = 1200;
/// A leader that has not heard from a quorum for this long answers `no_leader`.
const QUORUM_STALE_MS: u64 = ELECTION_TIMEOUT_MAX_MS;

fn path_and_query(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_string(), |pq| pq.as_str().to_string())
}

fn raft_config(settings: &Settings) -> anyhow::Result<openraft::Config> {
    let config = openraft::Config {
        cluster_name: settings.cluster_id.clone(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        // Entries are batches of many commands; bound how many go in one RPC.
        max_payload_entries: 32,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.snapshot_logs),
        max_in_snapshot_log_to_keep: settings.snapshot_keep_logs,
        // Safety-relevant choices, set here rather than left to openraft's defaults:
        //
        // A restarted leader never resumes its term without an election. openraft 0.10
        // restores leadership by default; but the leader replicates an entry before its own
        // fsync, so after a power loss it may come back without entries its followers
        // committed, and, still leading the same term, write new entries under the log ids of
        // those committed ones. Followers compare log ids only, so the replicas would diverge.
        // An election instead makes it learn the committed log from a majority first.
        enable_leader_restore: Some(false),
        // A follower whose log went backwards (lost entries it acknowledged) is a fault to
        // stop on, never progress to reset quietly.
        allow_log_reversion: Some(false),
        // No pre-vote round: with it, a follower left alone (the others down) never starts an
        // election and keeps naming its dead leader, so writes sent to it are redirected to a
        // node that is gone instead of answered 503 `no_leader`. A node cut off and back does
        // not depose a healthy leader anyway: the followers' leader lease (the election
        // timeout) refuses its vote requests.
        enable_pre_vote: Some(false),
        ..Default::default()
    };
    Ok(config.validate()?)
}

/// Starts a node and runs it until a signal (graceful shutdown) or a fatal error.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    if cfg!(feature = "negative-control-unsafe-early-flush") {
        tracing::error!(
            "NEGATIVE CONTROL BUILD: log appends are acknowledged before they are fsynced; \
             acknowledged data WILL be lost on a power loss. This binary exists only to prove \
             the chaos suite detects that loss."
        );
    }
    crate::metrics::install();
    let datadir = DataDir::open(&settings.data, &settings.cluster_id, settings.id)?;
    let (db, rejoining) = open_store(&settings, &datadir).await?;
    let found = store::log::stored_marks(&db).map_err(|e| {
        anyhow::anyhow!(
            "reading the Raft state in {}: {e}",
            datadir.db_path().display()
        )
    })?;
    let watermark =
        store::watermark::Watermark::open(datadir.root(), found).with_context(|| {
            format!(
                "cannot write the watermark file in {}",
                datadir.root().display()
            )
        })?;
    let sm = SmShared::open(db.clone(), datadir.snapshot_dir())?;
    let watermark_writer = std::thread::Builder::new()
        .name("raftq-watermark".into())
        .spawn({
            let w = watermark.clone();
            move || w.run_writer()
        })
        .context("starting the watermark thread")?;
    let log_store = LogStore::with_watermark(db.clone(), watermark.clone())
        .context("starting the log flusher thread")?;
    let committed = log_store.committed_index();
    let network = Network::new(
        settings.peer_http.clone(),
        settings.cluster_secret.clone().into(),
        settings.raft_body_limit as u64,
    );
    let raft = Raft::new(
        settings.id,
        Arc::new(raft_config(&settings)?),
        network,
        log_store,
        StateMachineStore::new(sm.clone()),
    )
    .await
    .context("starting Raft")?;

    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    let clock = Arc::new(EntryClock::new(settings.id, settings.peers.len()));
    let proposer = Proposer::start(
        raft.clone(),
        ProposerLimits {
            max_commands: settings.max_entry_commands,
            ..ProposerLimits::default()
        },
        clock.clone(),
    );
    let (shutdown_tx, _) = watch::channel(false);
    let node: AppState = Arc::new(Node {
        id: settings.id,
        settings: settings.clone(),
        raft: raft.clone(),
        sm,
        proposer,
        limits: crate::api::limits::Limits::new(&settings),
        committed,
        clock,
        shutdown_tx,
        writes_in_flight: AtomicUsize::new(0),
        stopping_raft: AtomicBool::new(false),
        transferring: AtomicBool::new(false),
    });
    tracing::info!(
        id = settings.id,
        listen = %settings.listen,
        url = settings.own_url(),
        cluster = %settings.cluster_id,
        data = %settings.data.display(),
        tls = settings.tls.is_some(),
        "raftq node started"
    );
    match &settings.tokens_file {
        Some(path) => tracing::info!(
            tokens = settings.tokens.len(),
            file = %path.display(),
            "API tokens required on /v1"
        ),
        None => tracing::warn!(
            "THE API IS OPEN: no API tokens are configured (--tokens-file), so anyone who can \
             reach {} can publish, consume and administer this cluster",
            settings.listen
        ),
    }

    let app = crate::api::router(node.clone())
        .merge(crate::raft::rpc::router(node.clone()))
        .merge(crate::metrics::router(node.clone()))
        .merge(crate::dashboard::router())
        .layer(axum::middleware::from_fn(crate::metrics::http_layer));
    let (server_stop_tx, mut server_stop_rx) = watch::channel(false);
    let stopped = async move {
        let _ = server_stop_rx.wait_for(|s| *s).await;
    };
    let server = match &settings.tls {
        Some(tls) => {
            let listener = crate::tls::TlsListener::new(listener, tls.clone())?;
            tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
        None => {
            // Answers go out as soon as they are written (no Nagle delay behind an
            // unacknowledged segment), as the clients' and peers' requests already do.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
            })
        }
    };

    match rejoining.and_then(|m| m.grant) {
        Some(grant) => {
            tokio::spawn(crate::rejoin::finish_when_caught_up(node.clone(), grant));
        }
        // A new cluster forms only from nodes that are not rejoining one.
        None => {
            tokio::spawn(bootstrap(node.clone()));
        }
    }
    tokio::spawn(log_changes(node.clone()));
    tokio::spawn(ticker(node.clone()));
    tokio::spawn(sample_clocks(node.clone()));
    tokio::spawn(snapshot_by_bytes(node.clone()));
    let fatal = watch_fatal(node.clone());

    tokio::select! {
        sig = wait_for_signal() => tracing::info!(signal = sig, "shutdown requested"),
        msg = fatal => {
            // Storage or Raft failed: the node must not keep serving (it could diverge).
            tracing::error!("{msg}; stopping the node");
            let _ = db.flush_wal(true);
            std::process::exit(70);
        }
    }
    shutdown(node, server_stop_tx, server, db, datadir).await;
    watermark.stop();
    let _ = watermark_writer.join();
    Ok(())
}

/// What it means for a store to have lost acknowledged data, and what happens next.
fn damaged_message(settings: &Settings, what: &str) -> String {
    format!(
        "the data directory {dir} of node {id} is damaged: {what}. This node may have lost log \
         entries or a vote it had acknowledged, so it must not vote until it holds the log \
         again (it could help elect a leader that lacks acknowledged writes)",
        dir = settings.data.display(),
        id = settings.id,
    )
}

/// Opens the node's store and makes sure it can be trusted; returns it, with the rejoin
/// marker when the node is rejoining (see [`crate::rejoin`]).
///
/// A store that lost data this node had acknowledged (RocksDB finds damage at open, or in the
/// checksums of the table files, all read first; the log or vote is behind the durable
/// watermark or behind what the leader recorded; or the store is empty while the cluster had
/// replicated to this node) is set aside, and the node starts from an empty one
/// as a learner: before Raft starts, the leader makes it one, and this node adopts the
/// leader's term. A node with no other member to rejoin through refuses to start instead.
async fn open_store(
    settings: &Settings,
    datadir: &DataDir,
) -> anyhow::Result<(Arc<rocksdb::DB>, Option<crate::rejoin::Marker>)> {
    let root = datadir.root();
    let mut marker = crate::rejoin::pending(root)?;
    let open = || store::open_db_with(&datadir.db_path(), settings.write_buffer_bytes);
    let (db, lost) = match open() {
        Ok(db) => {
            let started = std::time::Instant::now();
            let lost = match store::verify_tables(&db) {
                // A table file whose blocks do not match their checksums.
                Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
                    Some(format!("a table file fails its checks: {e}"))
                }
                // A read error says the disk failed, not what is on it.
                Err(e) => anyhow::bail!(
                    "cannot read the database in {}: {e}",
                    datadir.db_path().display()
                ),
                Ok(bytes) => {
                    tracing::info!(
                        bytes,
                        millis = started.elapsed().as_millis() as u64,
                        "every table file's checksums verified"
                    );
                    match &marker {
                        // Already rejoining: what the store holds is what it caught up since.
                        Some(_) => None,
                        None => find_loss(settings, root, &db).await,
                    }
                }
            };
            (Some(db), lost)
        }
        // What RocksDB found on disk is not what it wrote: checksums, sizes, missing files.
        Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
            (None, Some(format!("RocksDB refuses to open it: {e}")))
        }
        // A full disk, permissions, a missing mount: nothing says the data is bad.
        Err(e) => anyhow::bail!(
            "cannot open the database in {}: {e}",
            datadir.db_path().display()
        ),
    };
    let db = match lost {
        None => match db {
            Some(db) => db,
            None => open()?,
        },
        Some(what) => {
            let message = damaged_message(settings, &what);
            if !settings.peers.keys().any(|id| *id != settings.id) {
                anyhow::bail!(
                    "{message}. It has no other member to rejoin through: restore it from a \
                     backup (docs/operations.md, \"Backup and restore\")"
                );
            }
            // An empty store (a wiped directory) has nothing worth keeping.
            let empty = db.as_deref().is_some_and(|db| {
                store::log::stored_marks(db).is_ok_and(|m| m == store::watermark::Marks::default())
            });
            tracing::error!("{message}; rejoining as a learner");
            drop(db);
            let kept = match empty {
                true => None,
                false => datadir.set_aside().with_context(|| {
                    format!("setting aside the damaged store in {}", root.display())
                })?,
            };
            if let Some(kept) = &kept {
                tracing::warn!(kept = %kept.display(), "the damaged store is kept for inspection");
            }
            let m = crate::rejoin::Marker {
                reason: what,
                kept: kept.map(|p| p.display().to_string()).unwrap_or_default(),
                grant: None,
            };
            crate::rejoin::record(root, &m)?;
            marker = Some(m);
            open()?
        }
    };
    if let Some(m) = &mut marker {
        let grant = match m.grant {
            Some(grant) => grant,
            None => {
                let grant = crate::rejoin::demote_self(settings).await;
                m.grant = Some(grant);
                crate::rejoin::record(root, m)?;
                grant
            }
        };
        let vote = crate::raft::Vote::new_committed(grant.term, grant.leader_id);
        store::log::adopt_vote(&db, &vote)?;
    }
    Ok((db, marker))
}

/// Whether the store lost data this node had on disk or had acknowledged: `Some(what)` when it
/// did. Checks the durable watermark (see [`store::watermark`]), then asks the peers: a store
/// that is empty although the leader replicated to this node, or whose log ends before what
/// the leader recorded this node acknowledged (the last moments before a crash, which the
/// watermark may not have recorded yet), lost it. Only a leader of this node's term or a later
/// one is believed (a deposed leader may remember entries that were rightly replaced).
async fn find_loss(
    settings: &Settings,
    root: &std::path::Path,
    db: &rocksdb::DB,
) -> Option<String> {
    let found = match store::log::stored_marks(db) {
        Ok(found) => found,
        Err(e) => return Some(format!("its Raft state cannot be read: {e}")),
    };
    match store::watermark::read(root) {
        Err(e) => return Some(format!("its watermark cannot be read: {e}")),
        Ok(Some(recorded)) => {
            if let Err(what) = store::watermark::check(found, recorded) {
                return Some(what);
            }
        }
        Ok(None) => {}
    }
    let empty = found == store::watermark::Marks::default();
    for (peer, url) in settings.peers.iter().filter(|(id, _)| **id != settings.id) {
        let Ok(resp) = settings
            .peer_http
            .get(format!("{url}/raft/status"))
            .header(SECRET_HEADER, &settings.cluster_secret)
            .timeout(Duration::from_secs(1))
            .send()
            .await
        else {
            continue;
        };
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        let matched = v["matched"][settings.id.to_string()].as_u64().unwrap_or(0);
        if empty {
            let is_voter = v["voters"]
                .as_array()
                .is_some_and(|ids| ids.iter().any(|id| id.as_u64() == Some(settings.id)));
            if v["initialized"] == serde_json::Value::Bool(true) && is_voter && matched > 0 {
                return Some(format!(
                    "it is empty, but node {peer} replicated the log up to index {matched} to \
                     this node before"
                ));
            }
            continue;
        }
        let leads = v["leader_id"].as_u64() == Some(*peer);
        let peer_term = v["term"].as_u64().unwrap_or(0);
        if leads && peer_term >= found.vote_term && matched > found.log_index {
            return Some(format!(
                "its Raft log ends at index {}, but the leader, node {peer}, recorded that this \
                 node had acknowledged the log up to index {matched}",
                found.log_index
            ));
        }
    }
    None
}

/// Logs, at info, every change of leader or term and of the members as this node sees them,
/// with the figures an operator needs to follow an election or a membership change.
async fn log_changes(node: AppState) {
    let mut rx = node.raft.metrics();
    let mut shutdown = node.shutdown_rx();
    let mut seen: Option<(Option<NodeId>, u64)> = None;
    let mut members: Option<(Option<crate::raft::LogId>, Vec<NodeId>, Vec<NodeId>)> = None;
    loop {
        {
            let m = rx.borrow_watched();
            let term = m.current_term;
            let leader = (m.current_leader, term);
            if seen != Some(leader) {
                let previous = seen.and_then(|(l, _)| l);
                if m.current_leader.is_some() {
                    metrics::counter!("raftq_leader_changes_total").increment(1);
                }
                match m.current_leader {
                    Some(id) => tracing::info!(
                        term,
                        leader = id,
                        previous_leader = previous,
                        this_node_leads = id == node.id,
                        last_log_index = m.last_log_index.unwrap_or(0),
                        last_applied = m.last_applied.map_or(0, |l| l.index),
                        "leader changed"
                    ),
                    None => tracing::info!(term, previous_leader = previous, "no leader known"),
                }
                seen = Some(leader);
            }
            // Compared by the log id of the entry that set them: no lists built per change.
            let config_id = *m.membership_config.log_id();
            if members.as_ref().map(|(id, _, _)| *id) != Some(config_id) {
                let membership = m.membership_config.membership();
                let voters: Vec<NodeId> = membership.voter_ids().collect();
                let learners: Vec<NodeId> = membership.learner_ids().collect();
                let changed = members
                    .as_ref()
                    .is_none_or(|(_, v, l)| *v != voters || *l != learners);
                if changed && !voters.is_empty() {
                    tracing::info!(voters = ?voters, learners = ?learners, term, "members");
                }
                members = Some((config_id, voters, learners));
            }
        }
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// Resolves when Raft stops for any reason other than our own shutdown.
async fn watch_fatal(node: AppState) -> String {
    let mut rx = node.raft.metrics();
    loop {
        if let Err(fatal) = &rx.borrow_watched().running_state {
            if !node.stopping_raft.load(Ordering::SeqCst) {
                return format!("Raft stopped with a fatal error: {fatal}");
            }
        }
        if rx.changed().await.is_err() {
            if node.stopping_raft.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            return "Raft stopped unexpectedly".to_string();
        }
    }
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers we can only run until killed.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// How often every node reads its peers' wall clocks for the entry clock's reference.
const CLOCK_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Reads every other member's wall clock once a second (through `/raft/status`), for the entry
/// clock's reference, and watches this node's own wall clock for jumps: each is logged and
/// counted in `raftq_clock_jumps_total`; `raftq_clock_offset_ms` is how far this node's wall
/// clock is from the cluster's.
async fn sample_clocks(node: AppState) {
    let mut shutdown = node.shutdown_rx();
    let mut jumps = JumpDetector::default();
    let jumps_total = metrics::counter!("raftq_clock_jumps_total");
    let offset = metrics::gauge!("raftq_clock_offset_ms");
    loop {
        let peers: Vec<(NodeId, String)> = {
            let m = node.raft.metrics();
            let m = m.borrow_watched();
            let membership = m.membership_config.membership();
            let listed: Vec<(NodeId, String)> = membership
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect();
            if listed.is_empty() {
                node.settings
                    .peers
                    .iter()
                    .map(|(id, url)| (*id, url.clone()))
                    .collect()
            } else {
                listed
            }
        };
        node.clock.set_nodes(peers.len());
        let reads = peers
            .iter()
            .filter(|(id, _)| *id != node.id)
            .map(|(id, url)| read_clock(&node, *id, url));
        futures::future::join_all(reads).await;
        if let Some(jump_ms) = jumps.check() {
            jumps_total.increment(1);
            tracing::warn!(
                jump_ms,
                "this node's wall clock jumped; the entry clock keeps to the monotonic clock \
                 and the cluster's median wall clock"
            );
        }
        offset.set(node.clock.offset_ms() as f64);
        tokio::select! {
            _ = tokio::time::sleep(CLOCK_SAMPLE_EVERY) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// One reading of peer `id`'s wall clock.
async fn read_clock(node: &Node, id: NodeId, url: &str) {
    let sent = Instant::now();
    let Ok(resp) = node
        .settings
        .peer_http
        .get(format!("{url}/raft/status"))
        .header(SECRET_HEADER, &node.settings.cluster_secret)
        .timeout(Duration::from_millis(500))
        .send()
        .await
    else {
        return;
    };
    let Ok(v) = resp.json::<serde_json::Value>().await else {
        return;
    };
    if let Some(wall_us) = v["wall_us"].as_u64() {
        node.clock.record_reading(id, wall_us, sent, Instant::now());
    }
}

/// Snapshot policy by size: openraft triggers a snapshot after `snapshot_logs` entries; this
/// task also triggers one once `snapshot_bytes` of commands were applied since the last, so a
/// few huge entries cannot grow the log without bound either.
async fn snapshot_by_bytes(node: AppState) {
    let mut applied = node.sm.subscribe_applied();
    let mut shutdown = node.shutdown_rx();
    loop {
        if node.sm.bytes_since_snapshot() >= node.settings.snapshot_bytes {
            if let Err(e) = node.raft.trigger().snapshot().await {
                tracing::warn!("cannot trigger a snapshot: {e}");
            }
            // Give the build time to start (it resets the count) before looking again.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::select! {
            _ = applied.changed() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// On the leader: proposes a tick entry when a lease expires or a nack delay ends and nothing
/// else moved the clock past it, so expired records become available again (and waiting pulls
/// are answered) without a client write. Time in the state machine stays the leader's
/// stamped time; this task only decides when to stamp.
async fn ticker(node: AppState) {
    let mut applied = node.sm.subscribe_applied();
    let mut shutdown = node.shutdown_rx();
    loop {
        applied.borrow_and_update();
        let (next_due, applied_clock) = {
            let view = node.sm.view();
            (view.state.next_due(), view.state.clock_ms)
        };
        node.clock.raise_to(applied_clock);
        let now = node.clock.now_ms();
        let wait = match next_due {
            Some(due)
                if due <= now
                    && node.is_leader()
                    && node.leads_with_quorum()
                    && !node.is_transferring() =>
            {
                match node
                    .proposer
                    .propose(Command::Tick, node.settings.write_timeout)
                    .await
                {
                    // The tick settled everything due up to its time; look again at once.
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!("tick not committed: {e:?}");
                        Duration::from_millis(HEARTBEAT_MS)
                    }
                }
            }
            // Due, but another node leads: its tick will arrive as an applied entry.
            Some(due) if due <= now => Duration::from_millis(HEARTBEAT_MS),
            Some(due) => Duration::from_millis(due - now),
            None => Duration::from_secs(1),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait.min(Duration::from_secs(1))) => {}
            _ = applied.changed() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Forms a new cluster: when no node has Raft state, the node with the lowest id initializes
/// it with every peer as a voter. Restarted nodes already have state and skip this.
async fn bootstrap(node: AppState) {
    let lowest = node.settings.peers.keys().next().copied();
    if lowest != Some(node.id) {
        return;
    }
    if !matches!(node.raft.is_initialized().await, Ok(false)) {
        return;
    }
    let http = &node.settings.peer_http;
    for (id, url) in node.settings.peers.iter().filter(|(id, _)| **id != node.id) {
        let resp = http
            .get(format!("{url}/raft/status"))
            .header(SECRET_HEADER, &node.settings.cluster_secret)
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        if let Ok(r) = resp {
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            if v["initialized"] == serde_json::Value::Bool(true) {
                tracing::info!(
                    peer = id,
                    "peer already has cluster state; not initializing"
                );
                return;
            }
        }
    }
    let members: BTreeMap<NodeId, BasicNode> = node
        .settings
        .peers
        .iter()
        .map(|(id, url)| (*id, BasicNode::new(url)))
        .collect();
    match node.raft.initialize(members).await {
        Ok(()) => {
            tracing::info!(voters = ?node.settings.peers.keys().collect::<Vec<_>>(), "initialized a new cluster")
        }
        Err(e) => tracing::info!("cluster initialization skipped: {e}"),
    }
}

async fn shutdown(
    node: AppState,
    server_stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    db: Arc<rocksdb::DB>,
    datadir: DataDir,
) {
    let started = Instant::now();
    let deadline = started + node.settings.shutdown_timeout;
    let was_leader = node.leader().is_some_and(|(id, _)| id == node.id);
    node.shutdown_tx.send_replace(true);

    // Let writes already proposed get their answer (bounded by the write timeout anyway).
    let drain_until = (Instant::now() + node.settings.write_timeout).min(deadline);
    while node.writes_in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let successor = if was_leader {
        wait_followers_caught_up(&node, deadline).await;
        most_up_to_date_follower(&node)
    } else {
        None
    };

    node.stopping_raft.store(true, Ordering::SeqCst);
    let remaining = deadline.saturating_duration_since(Instant::now());
    if tokio::time::timeout(remaining, node.raft.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("Raft did not stop within the shutdown timeout");
    }
    let raft_stopped = Instant::now();
    if let Some((id, url)) = successor {
        hand_over(&node, id, &url, raft_stopped, deadline).await;
    }
    // Keep answering `shutting_down` a moment, so clients on open connections get a definite
    // answer rather than a reset.
    tokio::time::sleep_until((started + SHUTDOWN_LINGER).min(deadline).into()).await;
    server_stop.send_replace(true);
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(500));
    if tokio::time::timeout(remaining, server).await.is_err() {
        tracing::warn!("HTTP connections still open at the shutdown timeout; closing them");
    }
    // Durable close: WAL fsynced, memtables flushed, then the database is closed.
    if let Err(e) = db.flush_wal(true) {
        tracing::error!("flushing the WAL at shutdown failed: {e}");
    }
    for cf in [store::CF_LOG, store::CF_RAFT, store::CF_SM] {
        if let Some(h) = db.cf_handle(cf) {
            if let Err(e) = db.flush_cf(h) {
                tracing::warn!("flushing column family {cf} at shutdown failed: {e}");
            }
        }
    }
    drop(node);
    drop(db);
    drop(datadir);
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        was_leader,
        "shutdown complete"
    );
}

/// How long a stopping node keeps answering `shutting_down` before closing its listener.
const SHUTDOWN_LINGER: Duration = Duration::from_millis(250);

/// The follower with the most of the log, to hand leadership to.
fn most_up_to_date_follower(node: &Node) -> Option<(NodeId, String)> {
    let m = node.raft.metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    let voters: Vec<NodeId> = membership.voter_ids().filter(|id| *id != node.id).collect();
    let repl = m.replication.as_ref()?;
    let best = voters
        .into_iter()
        .max_by_key(|id| repl.get(id).copied().flatten().map(|l| l.index))?;
    Some((best, membership.get_node(&best)?.addr.clone()))
}

/// Hands leadership over: once the followers' leader lease on the stopped leader has lapsed
/// (no vote is granted before that), ask the most up-to-date follower to start an election
/// at once, rather than leave the cluster to its randomized election timeouts.
async fn hand_over(node: &Node, id: NodeId, url: &str, raft_stopped: Instant, deadline: Instant) {
    let lease_lapsed = raft_stopped + Duration::from_millis(ELECTION_TIMEOUT_MAX_MS + 50);
    if lease_lapsed >= deadline {
        return;
    }
    tokio::time::sleep_until(lease_lapsed.into()).await;
    let result = node
        .settings
        .peer_http
        .post(format!("{url}/raft/elect"))
        .header(SECRET_HEADER, &node.settings.cluster_secret)
        .timeout(
            deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(2)),
        )
        .send()
        .await;
    match result {
        Ok(r) if r.status().is_success() => {
            tracing::info!(successor = id, "asked node {id} to take over leadership")
        }
        Ok(r) => tracing::warn!(successor = id, status = %r.status(), "hand-over request refused"),
        Err(e) => tracing::warn!(successor = id, "hand-over request failed: {e}"),
    }
}

/// On the leader: wait until every voter has replicated the whole log (bounded), so handing
/// over loses nothing and the next leader can be elected without catching up.
async fn wait_followers_caught_up(node: &Node, deadline: Instant) {
    let mut rx = node.raft.metrics();
    let bound = (Instant::now() + Duration::from_secs(3)).min(deadline);
    loop {
        let done = {
            let m = rx.borrow_watched();
            let last = m.last_log_index;
            match &m.replication {
                Some(repl) => repl
                    .iter()
                    .all(|(_, matched)| matched.map(|l| l.index) >= last),
                None => true,
            }
        };
        if done {
            return;
        }
        let left = bound.saturating_duration_since(Instant::now());
        if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
            tracing::warn!("followers not fully caught up at leader shutdown");
            return;
        }
    }
}
