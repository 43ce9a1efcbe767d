//! At start-up, before Raft runs: is this node's store one it can trust? A store that lost
//! data the node had acknowledged is set aside and the node rejoins (see [`crate::rejoin`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::Settings;
use crate::store::{self, DataDir};

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

/// The node's store: the database (Raft metadata and the state machine) and the log.
pub(super) struct Opened {
    pub db: Arc<rocksdb::DB>,
    pub log: store::segments::SegmentLog,
    /// The rejoin marker when the node is rejoining (see [`crate::rejoin`]).
    pub rejoining: Option<crate::rejoin::Marker>,
}

/// Opens the node's store and makes sure it can be trusted.
///
/// A store that lost data this node had acknowledged (RocksDB finds damage at open, or in the
/// checksums of the table files, all read first; a log segment fails its checks at or below
/// the durable watermark, or anywhere but its tail; records point into log entries the log
/// no longer holds; the log or vote is behind the durable
/// watermark or behind what the leader recorded; or the store is empty while the cluster had
/// replicated to this node) is set aside, and the node starts from an empty one
/// as a learner: before Raft starts, the leader makes it one, and this node adopts the
/// leader's term. A node with no other member to rejoin through refuses to start instead.
pub(super) async fn open_store(settings: &Settings, datadir: &DataDir) -> anyhow::Result<Opened> {
    let root = datadir.root();
    let mut marker = crate::rejoin::pending(root)?;
    let open = || store::open_db_with(&datadir.db_path(), settings.write_buffer_bytes);
    // A bad frame above what the watermark says was fsynced is the torn tail of writes never
    // synced; at or below it, damage. An unreadable watermark counts everything as synced (and
    // is itself reported as a loss below).
    let durable = match store::watermark::read(root) {
        Ok(marks) => marks.map_or(0, |m| m.log_index),
        Err(_) => u64::MAX,
    };
    let open_log = |db: &rocksdb::DB| {
        store::log::open_segments_with(db, &datadir.log_dir(), durable, settings.segment_bytes)
    };
    let (db, log, lost) = match open() {
        Ok(db) => {
            let started = std::time::Instant::now();
            match store::verify_tables(&db) {
                // A table file whose blocks do not match their checksums.
                Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
                    let what = format!("a table file fails its checks: {e}");
                    (Some(db), None, Some(what))
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
                    match open_log(&db) {
                        // What the log holds is not what was written and synced.
                        Err(e @ store::segments::SegmentError::Damaged { .. }) => (
                            Some(db),
                            None,
                            Some(format!("its Raft log fails its checks: {e}")),
                        ),
                        // A full disk, permissions: nothing says the data is bad.
                        Err(e) => anyhow::bail!("cannot open the Raft log: {e}"),
                        Ok(log) => {
                            let archived = store::snapshot::archived(&datadir.snapshot_dir())
                                .map_err(|e| e.to_string());
                            let points = archived.and_then(|archived| {
                                store::records::check_log_holds(&db, log.first_index(), archived)
                            });
                            let lost = match (points, &marker) {
                                // Records point into entries the log lost.
                                (Err(what), _) => Some(format!("its records are missing: {what}")),
                                // Already rejoining: what the store holds is what it caught up
                                // since.
                                (Ok(()), Some(_)) => None,
                                (Ok(()), None) => find_loss(settings, root, &db, &log).await,
                            };
                            (Some(db), Some(log), lost)
                        }
                    }
                }
            }
        }
        // What RocksDB found on disk is not what it wrote: checksums, sizes, missing files.
        Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => {
            (None, None, Some(format!("RocksDB refuses to open it: {e}")))
        }
        // A full disk, permissions, a missing mount: nothing says the data is bad.
        Err(e) => anyhow::bail!(
            "cannot open the database in {}: {e}",
            datadir.db_path().display()
        ),
    };
    let (db, log) = match (lost, db, log) {
        (None, Some(db), Some(log)) => (db, log),
        (None, _, _) => anyhow::bail!("the store opened without a database or log"),
        (Some(what), db, log) => {
            let message = damaged_message(settings, &what);
            if !settings.peers.keys().any(|id| *id != settings.id) {
                anyhow::bail!(
                    "{message}. It has no other member to rejoin through: restore it from a \
                     backup (docs/operations.md, \"Backup and restore\")"
                );
            }
            // An empty store (a wiped directory) has nothing worth keeping.
            let empty = match (&db, &log) {
                (Some(db), Some(log)) => store::log::stored_marks(db, log)
                    .is_ok_and(|m| m == store::watermark::Marks::default()),
                _ => false,
            };
            tracing::error!("{message}; rejoining as a learner");
            drop((db, log));
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
            let db = open()?;
            let log = open_log(&db)?;
            (db, log)
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
    Ok(Opened {
        db,
        log,
        rejoining: marker,
    })
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
    log: &store::segments::SegmentLog,
) -> Option<String> {
    let found = match store::log::stored_marks(db, log) {
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
        let Some(v) = settings.peer_status(url, Duration::from_secs(1)).await else {
            continue;
        };
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
