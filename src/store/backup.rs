//! Backups and restores, from the snapshot files nodes already write.
//!
//! A backup is a node's newest snapshot in the whole format: the whole applied state (topics,
//! records, subscriptions with their cursors and leases, producer sequences) as of one log
//! index, checksummed end to end. A node's own snapshot links the log's files that hold its
//! records; the backup reads them from there into the file. Snapshot files and their links are
//! immutable once renamed into place, so a backup can be taken beside a running node.
//!
//! A restore builds, from a backup, the data directory of one node of a *new* cluster: every
//! node of that cluster is restored from the same file with the same `--peers`, and they then
//! start as if they had all just applied the backup's last entry. The restore:
//! - loads the snapshot into the state machine;
//! - replaces the membership it holds with the voters of `--peers` (the new cluster's
//!   addresses), identically on every node, and writes a snapshot of that state (so a
//!   follower that later receives it learns the new members, not the old ones);
//! - records the backup's last log id as purged (the log starts after it) and committed;
//! - records a vote for the node itself in the term of that last log id, so the first election
//!   is in a later term and every new entry's log id is above the restored ones.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use openraft::{BasicNode, Membership};
use rocksdb::WriteBatch;

use super::snapshot::{self, FileMeta};
use super::{keys, values, DataDir, SmShared, CF_RAFT, CF_SM};
use crate::raft::{LogId, StoredMembership, Vote};

/// The newest complete snapshot file under a data directory, without touching anything
/// there (unlike [`snapshot::newest`], which a node runs on its own directory at start and
/// which removes leftovers of interrupted writes).
pub fn newest_snapshot(data: &Path) -> anyhow::Result<(FileMeta, PathBuf)> {
    let dir = data.join("snapshots");
    let entries = fs::read_dir(&dir).with_context(|| {
        format!(
            "{} holds no snapshots directory: is {} a raftq data directory?",
            dir.display(),
            data.display()
        )
    })?;
    let mut best: Option<(FileMeta, PathBuf)> = None;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "snap") {
            continue; // a snapshot being written (.tmp), or anything else
        }
        let meta = match snapshot::verify(&path) {
            Ok(meta) => meta,
            // Removed by the node (a newer snapshot replaced it) while we looked.
            Err(snapshot::SnapshotError::Io(e)) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("snapshot {}", path.display())),
        };
        if best
            .as_ref()
            .is_none_or(|(b, _)| meta.last_log_id > b.last_log_id)
        {
            best = Some((meta, path));
        }
    }
    best.ok_or_else(|| {
        anyhow::anyhow!(
            "{} holds no snapshot yet: build one first (`raftq cluster snapshot`)",
            dir.display()
        )
    })
}

/// Copies the newest snapshot of the data directory `data` to `out`: checked whole, written
/// to `out.tmp`, fsynced, renamed, and checked again. Returns its meta and size.
pub fn backup(data: &Path, out: &Path) -> anyhow::Result<(FileMeta, u64)> {
    if out.exists() {
        bail!("{} exists; a backup never overwrites a file", out.display());
    }
    let (meta, src) = newest_snapshot(data)?;
    let name = out
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{} is not a file name", out.display()))?;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!("{}.tmp", name.to_string_lossy()));
    let copied = (|| -> anyhow::Result<u64> {
        let to = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        // A node's own snapshot links its records; the backup holds them whole.
        let (_, bytes) = snapshot::write_whole(&src, &to)
            .with_context(|| format!("read {} whole", src.display()))?;
        to.sync_all()?;
        Ok(bytes)
    })();
    let bytes = match copied {
        Ok(bytes) => bytes,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let again = snapshot::verify_whole(&tmp);
    if again.as_ref().ok().map(|m| m.last_log_id) != Some(meta.last_log_id) {
        let _ = fs::remove_file(&tmp);
        bail!(
            "the copy of {} does not read back whole: {again:?}",
            src.display()
        );
    }
    fs::rename(&tmp, out)?;
    super::datadir::sync_dir(&dir)?;
    Ok((meta, bytes))
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    /// The backup's last log id: the restored state is as of it.
    pub last_log_id: LogId,
    pub topics: usize,
    pub records: u64,
    pub subscriptions: usize,
    /// The snapshot written with the new membership.
    pub snapshot: PathBuf,
}

/// The node a restore makes: what of its settings the restore needs.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its data directory: absent or empty.
    pub data: std::path::PathBuf,
    pub cluster_id: String,
    pub id: u64,
    /// Every node of the new cluster, with its base URL: the voters.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// RocksDB's memtable size, as the node will run with.
    pub write_buffer_bytes: u64,
}

/// Makes `settings.data`, which must be absent or empty, the data directory of node
/// `settings.id` of a new cluster restored from the backup `from` (see the module's doc).
pub fn restore(from: &Path, settings: &Target) -> anyhow::Result<Restored> {
    let meta = snapshot::verify_whole(from)
        .with_context(|| format!("{} is not a whole raftq snapshot", from.display()))?;
    let Some(last) = meta.last_log_id else {
        bail!(
            "{} is the snapshot of an empty state: nothing to restore",
            from.display()
        );
    };
    if let Ok(mut entries) = fs::read_dir(&settings.data) {
        if entries.next().is_some() {
            bail!(
                "{} is not empty: a restore makes a new data directory; give an empty or absent --data",
                settings.data.display()
            );
        }
    }
    let existed = settings.data.exists();
    let result = restore_into(from, settings, last);
    if result.is_err() {
        // A refused or failed restore leaves the directory as it found it: absent or empty.
        if existed {
            if let Ok(entries) = fs::read_dir(&settings.data) {
                for entry in entries.flatten() {
                    let path = entry.path();
                    let _ = if path.is_dir() {
                        fs::remove_dir_all(&path)
                    } else {
                        fs::remove_file(&path)
                    };
                }
            }
        } else {
            let _ = fs::remove_dir_all(&settings.data);
        }
    }
    result
}

fn restore_into(from: &Path, settings: &Target, last: LogId) -> anyhow::Result<Restored> {
    let datadir = DataDir::open(&settings.data, &settings.cluster_id, settings.id)?;
    let db = super::open_db_with(&datadir.db_path(), settings.write_buffer_bytes)
        .with_context(|| format!("open the database in {}", settings.data.display()))?;
    snapshot::load_into(&db, from).context("load the backup")?;

    let sm = SmShared::open(db.clone(), datadir.snapshot_dir())?;
    let (topics, records, subscriptions) = {
        let view = sm.view();
        let state = &view.state;
        if let Some(id) = settings
            .peers
            .keys()
            .find(|id| state.retired_nodes.contains(id))
        {
            bail!(
                "node id {id} was removed from the cluster this backup comes from, and a removed id \
                 is never used again: give the restored cluster other ids"
            );
        }
        (
            state.topics.len(),
            state.topics.values().map(|t| t.records()).sum::<u64>(),
            state.topics.keys().map(|t| state.subs_of(t).count()).sum(),
        )
    };

    let nodes: std::collections::BTreeMap<u64, BasicNode> = settings
        .peers
        .iter()
        .map(|(id, url)| (*id, BasicNode::new(url)))
        .collect();
    let voters: std::collections::BTreeSet<u64> = settings.peers.keys().copied().collect();
    let membership = Membership::new(vec![voters], nodes)
        .map_err(|e| anyhow::anyhow!("the restored cluster's members: {e}"))?;
    let term = last.committed_leader_id().term;
    let mut batch = WriteBatch::default();
    let cf_sm = db
        .cf_handle(CF_SM)
        .ok_or_else(|| anyhow::anyhow!("column family sm missing"))?;
    batch.put_cf(
        cf_sm,
        keys::MEMBERSHIP,
        values::encode(&StoredMembership::new(Some(last), membership))?,
    );
    let cf_raft = db
        .cf_handle(CF_RAFT)
        .ok_or_else(|| anyhow::anyhow!("column family raft missing"))?;
    batch.put_cf(cf_raft, keys::LAST_PURGED, values::encode(&last)?);
    batch.put_cf(cf_raft, keys::COMMITTED, values::encode(&Some(last))?);
    batch.put_cf(
        cf_raft,
        keys::VOTE,
        values::encode(&Vote::new(term, settings.id))?,
    );
    db.write_opt(batch, &super::write_options(true))?;
    drop(sm);

    // Reopen so the view holds the new membership, and write the snapshot a lagging
    // follower will be sent.
    let sm = SmShared::open(db.clone(), datadir.snapshot_dir())?;
    let (built, path) = sm.build_blocking().context("write the restored snapshot")?;
    if built.last_log_id != Some(last) {
        bail!(
            "the restored snapshot holds up to {:?}, not the backup's {last}",
            built.last_log_id
        );
    }
    Ok(Restored {
        last_log_id: last,
        topics,
        records,
        subscriptions,
        snapshot: path,
    })
}
