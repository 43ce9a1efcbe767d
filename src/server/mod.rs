//! One raftq node's process: opens storage, starts Raft, the node's replica ([`crate::node`])
//! and the HTTP server, starts the background tasks ([`tasks`]), forms the cluster when it is
//! new, and shuts down gracefully.
//!
//! Shutdown protocol (SIGTERM or SIGINT), bounded by `shutdown_timeout`:
//! 1. the shutdown flag is raised: new `/v1` requests get 503 `shutting_down` with the
//!    leader's address, and every open long-poll answers at once with what it has;
//! 2. writes already proposed are given time to finish, so their clients get a definite answer;
//! 3. a leader waits until every voter has its whole log, so the next leader loses nothing and
//!    is elected as soon as the followers' election timeout fires;
//! 4. Raft stops, the HTTP server stops, RocksDB's WAL is fsynced and the memtables flushed,
//!    the database is closed and the process exits 0.

mod store_check;
mod tasks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use openraft::async_runtime::watch::WatchReceiver as _;
use tokio::sync::watch;

use crate::clock::EntryClock;
use crate::config::Settings;
use crate::node::{AppState, Node, Parts};
use crate::peer::PeerState;
use crate::proposer::{Proposer, ProposerLimits};
use crate::raft::network::Network;
use crate::raft::PeerFormats;
use crate::store::{self, DataDir, LogStore, Raft, SmShared, StateMachineStore};
use store_check::open_store;
use tasks::Tasks;

/// Raises the process's soft limit on open files to its hard limit, as far as the kernel
/// allows, and logs what the log can then hold: every segment of the Raft log keeps its file
/// open (`store::segments`), and so do RocksDB's table files, so a soft limit of 1,024 (a
/// common default) would stop a node whose log held 8 GiB of records at the default segment
/// size, with "Too many open files". Best effort: a limit that cannot be read or raised is
/// logged and kept.
fn raise_open_files_limit(segment_bytes: u64) {
    let mut limit = match crate::metrics::open_files_limit() {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!("cannot read the limit on open files: {e}");
            return;
        }
    };
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads only the struct passed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(limit = was, "cannot raise the limit on open files: {e}");
            limit.rlim_cur = was;
        }
    }
    let files = limit.rlim_cur;
    let log_gib = files.saturating_mul(segment_bytes) >> 30;
    tracing::info!(
        files,
        was,
        log_gib,
        "open files limit: every log segment holds one open, so the log can hold about \
         log_gib GiB (raise the hard limit, LimitNOFILE, for more)"
    );
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
    raise_open_files_limit(settings.segment_bytes);
    let datadir = DataDir::open(&settings.data, &settings.cluster_id, settings.id)?;
    let store_check::Opened { db, log, rejoining } = open_store(&settings, &datadir).await?;
    let found = store::log::stored_marks(&db, &log).map_err(|e| {
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
    let log_store = LogStore::with_watermark(db.clone(), log, watermark.clone())
        .context("starting the log flusher thread")?;
    log_store.sync_follower_appends_in_place(settings.id);
    // Published records are stored as where the log holds them from here on.
    sm.attach_log(Arc::new(log_store.for_records()));
    let log_durable = log_store.durable();
    let committed = log_store.committed_index();
    let formats = Arc::new(PeerFormats::default());
    let network = Network::new(
        settings.peer_http.clone(),
        settings.cluster_secret.clone().into(),
        settings.raft_body_limit as u64,
        formats.clone(),
        log_store.first_readable(),
    );
    let raft_config = crate::raft::config(
        &settings.cluster_id,
        settings.snapshot_logs,
        settings.snapshot_keep_logs,
    )?;
    let raft = Raft::new(
        settings.id,
        Arc::new(raft_config),
        network,
        log_store,
        StateMachineStore::new(sm.clone(), log_durable),
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
    let node: AppState = Arc::new(Node::new(Parts {
        settings: settings.clone(),
        formats,
        raft: raft.clone(),
        sm: sm.clone(),
        proposer,
        committed,
        clock: clock.clone(),
    }));
    tracing::info!(
        id = settings.id,
        listen = %settings.listen,
        url = settings.own_url(),
        cluster = %settings.cluster_id,
        data = %settings.data.display(),
        tls = settings.tls.is_some(),
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
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

    let peer = PeerState {
        id: settings.id,
        raft: raft.clone(),
        sm: sm.clone(),
        cluster_secret: settings.cluster_secret.clone(),
        body_limit: settings.raft_body_limit,
        node: node.clone(),
    };
    let app = crate::api::router(node.clone())
        .merge(crate::peer::router(peer))
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

    let tasks = Tasks {
        node: node.clone(),
        raft: raft.clone(),
        sm,
        clock,
    };
    match rejoining.and_then(|m| m.grant) {
        Some(grant) => {
            tokio::spawn(crate::rejoin::finish_when_caught_up(node.clone(), grant));
        }
        // A new cluster forms only from nodes that are not rejoining one.
        None => {
            tokio::spawn(tasks.clone().bootstrap());
        }
    }
    tokio::spawn(tasks.clone().log_changes());
    tokio::spawn(tasks.clone().ticker());
    tokio::spawn(tasks.clone().sample_clocks());
    tokio::spawn(tasks.snapshot_by_bytes());
    let fatal = watch_fatal(node.clone(), raft.clone());

    tokio::select! {
        sig = wait_for_signal() => tracing::info!(signal = sig, "shutdown requested"),
        msg = fatal => {
            // Storage or Raft failed: the node must not keep serving (it could diverge).
            tracing::error!("{msg}; stopping the node");
            let _ = db.flush_wal(true);
            std::process::exit(70);
        }
    }
    shutdown(node, raft, server_stop_tx, server, db, datadir).await;
    watermark.stop();
    let _ = watermark_writer.join();
    Ok(())
}

/// Resolves when Raft stops for any reason other than our own shutdown. Raft's core owns the
/// senders of its metrics: they close when it stops, and its last full metrics say why. Until
/// then this waits on the server metrics, which change only with the vote, the state, the
/// leader or the membership (the full ones change on every turn of the core).
async fn watch_fatal(node: AppState, raft: Raft) -> String {
    let mut rx = raft.server_metrics();
    while rx.changed().await.is_ok() {}
    if let Err(fatal) = &raft.metrics().borrow_watched().running_state {
        if !node.stopping_raft() {
            return format!("Raft stopped with a fatal error: {fatal}");
        }
    }
    if node.stopping_raft() {
        std::future::pending::<()>().await;
    }
    "Raft stopped unexpectedly".to_string()
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

/// The shutdown protocol of the module docs.
async fn shutdown(
    node: AppState,
    raft: Raft,
    server_stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    db: Arc<rocksdb::DB>,
    datadir: DataDir,
) {
    let started = Instant::now();
    let deadline = started + node.settings().shutdown_timeout;
    let was_leader = node.leader().is_some_and(|(id, _)| id == node.id());
    node.begin_shutdown();

    // Let writes already proposed get their answer (bounded by the write timeout anyway).
    let drain_until = (Instant::now() + node.settings().write_timeout).min(deadline);
    while node.writes_in_flight() > 0 && Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let successor = if was_leader {
        node.wait_followers_caught_up(deadline).await;
        node.most_up_to_date_follower()
    } else {
        None
    };

    node.mark_stopping_raft();
    let remaining = deadline.saturating_duration_since(Instant::now());
    if tokio::time::timeout(remaining, raft.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("Raft did not stop within the shutdown timeout");
    }
    let raft_stopped = Instant::now();
    if let Some((id, url)) = successor {
        node.hand_over(id, &url, raft_stopped, deadline).await;
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
    drop(raft);
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
