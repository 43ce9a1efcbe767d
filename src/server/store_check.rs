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

/// Opens the node's store and makes sure it can be trusted; returns it, with the rejoin
/// marker when the node is rejoining (see [`crate::rejoin`]).
///
/// A store that lost data this node had acknowledged (RocksDB finds damage at open, or in the
/// checksums of the table files, all read first; the log or vote is behind the durable
/// watermark or behind what the leader recorded; or the store is empty while the cluster had
/// replicated to this node) is set aside, and the node starts from an empty one
/// as a learner: before Raft starts, the leader makes it one, and this node adopts the
/// leader's term. A node with no other member to rejoin through refuses to start instead.
pub(super) async fn open_store(
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
