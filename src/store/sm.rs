//! The state machine store: applies committed entries through the pure [`crate::state`]
//! functions and persists what they emit in one RocksDB write batch per apply call.
//!
//! Readers (HTTP handlers on any node) see topic metadata from memory and records from
//! RocksDB, a published record's bytes from the Raft log it points into ([`records`]). The
//! write lock on the in-memory view is held across the batch write, so a reader that sees
//! `next_offset = n` always finds every record below `n` stored (and the log entries they point
//! into durable: apply waited for them).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use tokio::sync::watch;

use super::records::{self, Entries};
use super::{keys, snapshot, subs, values, CF_SM};
use crate::raft::{
    to_io, Entry, LogId, Snapshot, SnapshotData, SnapshotMeta, StorageResult, StoredMembership,
    TypeConfig,
};
use crate::state::{
    apply_entry, Appended, ApplyResponse, CommitPoint, LogPayload, ProducerState, ReadFault,
    RecordAt, RecordSource, SmState, StoredRecord, TopicMeta, Write,
};

/// The applied state as readers see it.
#[derive(Debug, Default)]
pub struct SmView {
    pub state: SmState,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub commit_point: CommitPoint,
}

/// What the snapshot on disk is.
#[derive(Debug, Clone)]
struct CurrentSnapshot {
    meta: snapshot::FileMeta,
    path: PathBuf,
    bytes: u64,
}

/// State shared by the Raft state machine and the HTTP readers.
pub struct SmShared {
    db: Arc<DB>,
    view: RwLock<SmView>,
    /// Bumped after every apply, so long-polls wake as soon as a record is committed.
    applied_tx: watch::Sender<u64>,
    snapshot_dir: PathBuf,
    current_snapshot: Mutex<Option<CurrentSnapshot>>,
    /// Bytes of commands applied since this process opened the store.
    applied_bytes: AtomicU64,
    /// Most bytes of key/value pairs in one write batch when a snapshot is loaded.
    load_batch_bytes: AtomicU64,
    /// `applied_bytes` when the last snapshot was started.
    snapshot_mark: AtomicU64,
    /// The Raft log, which holds the bytes of published records (`records`). Until it is
    /// attached, records are stored whole.
    log: OnceLock<Arc<dyn Entries>>,
    /// The current snapshot's record files, when it is linked: where records point that the
    /// log does not hold (a follower's, after it installed a snapshot). Opened on first use.
    archive: RwLock<Option<Arc<records::Archive>>>,
}

/// The index a snapshot holds the state as of.
fn snapshot_index(meta: &snapshot::FileMeta) -> u64 {
    meta.last_log_id.as_ref().map_or(0, |l| l.index)
}

/// The record files of the linked snapshot at `path`, as of index `through`, if it has any.
fn archive_of(path: &std::path::Path, through: u64) -> Option<Arc<records::Archive>> {
    let dir = snapshot::linked_dir(path);
    dir.is_dir()
        .then(|| Arc::new(records::Archive::new(dir, through)))
}

/// The in-memory counters of [`SmState`] that are persisted under `m:state`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum SmMeta {
    V1 {
        clock_ms: u64,
        next_topic_id: u64,
        next_sub_id: u64,
        retired_nodes: Vec<u64>,
    },
}

/// Reads stored records for apply, from RocksDB and the log; and the records of the entries
/// being applied, which are not stored yet, from those entries.
struct DbRecords<'a> {
    db: &'a DB,
    reader: records::Reader<'a>,
    /// The entries of the apply call, in index order.
    entries: &'a [Entry],
    /// The stored value read last: topic, its key's offset, the value.
    last: std::cell::RefCell<Option<(u64, u64, records::Stored)>>,
}

impl RecordSource for DbRecords<'_> {
    fn stored(&self, topic_id: u64, offset: u64) -> Result<Option<StoredRecord>, ReadFault> {
        let fault = |reason: String| ReadFault {
            topic_id,
            offset,
            reason,
        };
        // Retention reads a topic's records in a row from its front: most lie in the value
        // found last.
        let mut last = self.last.borrow_mut();
        let holds = |(t, from, stored): &(u64, u64, records::Stored)| {
            *t == topic_id && offset >= *from && offset - from < stored.span()
        };
        if !last.as_ref().is_some_and(&holds) {
            let cf = self
                .db
                .cf_handle(CF_SM)
                .ok_or_else(|| fault("column family sm missing".into()))?;
            let mut it = records::topic_iter(self.db, cf, topic_id, offset.saturating_add(1));
            *last = match records::find(&mut it, topic_id, offset).map_err(fault)? {
                // The value's only record, and what it is: taken, not kept and copied.
                Some((_, records::Stored::Whole(record))) => return Ok(Some(record)),
                found => found.map(|(from, stored)| (topic_id, from, stored)),
            };
        }
        match last.as_ref().filter(|found| holds(found)) {
            Some((_, from, stored)) => self
                .reader
                .nth(stored, offset - from)
                .map(Some)
                .map_err(fault),
            None => Ok(None),
        }
    }

    fn logged(&self, at: RecordAt, timestamp_ms: u64) -> Result<StoredRecord, String> {
        let value = records::AtValue { timestamp_ms, at };
        let first = self.entries.first().map_or(0, |e| e.log_id.index);
        let in_hand = at
            .index
            .checked_sub(first)
            .and_then(|i| self.entries.get(usize::try_from(i).ok()?));
        match in_hand {
            Some(entry) => records::record_in(entry, &value),
            None => self.reader.at(&value),
        }
    }
}

impl SmShared {
    /// Loads the applied state from RocksDB, first bringing in the newest snapshot file if it
    /// is ahead of what the database holds (a crash between storing a received snapshot and
    /// loading it).
    pub fn open(db: Arc<DB>, snapshot_dir: PathBuf) -> anyhow::Result<Arc<SmShared>> {
        let mut current = None;
        if let Some(name) = snapshot::interrupted_load(&db)? {
            // A crash in the middle of loading a snapshot: the family holds part of it. The
            // snapshot file was complete and durable before the load began.
            let path = snapshot_dir.join(&name);
            anyhow::ensure!(
                path.is_file(),
                "the state machine was being replaced by snapshot {name} when the node stopped, \
                 and that file is gone from {}: the state machine is incomplete. Move the data \
                 directory aside and let the node rejoin empty",
                snapshot_dir.display()
            );
            tracing::info!(snapshot = %name, "finishing a snapshot install that a crash interrupted");
            snapshot::load_into(&db, &path)?;
        }
        if let Some((meta, path)) = snapshot::newest(&snapshot_dir)? {
            let applied = read_applied(&db)?;
            if meta.last_log_id > applied {
                tracing::info!(snapshot = %meta.snapshot_id, "loading snapshot newer than the state machine");
                snapshot::load_into(&db, &path)?;
            }
            let bytes = std::fs::metadata(&path)?.len();
            current = Some(CurrentSnapshot { meta, path, bytes });
        }
        let archive = current
            .as_ref()
            .and_then(|c| archive_of(&c.path, snapshot_index(&c.meta)));
        let split = subs::upgrade(&db).map_err(|e| anyhow::anyhow!("{e}"))?;
        if split > 0 {
            tracing::info!(
                subscriptions = split,
                "subscriptions now stored as a head and blocks of leases (data directory format 10)"
            );
        }
        let view = load_view(&db)?;
        let applied_index = view.last_applied.map_or(0, |l| l.index);
        let (applied_tx, _) = watch::channel(applied_index);
        Ok(Arc::new(SmShared {
            db,
            view: RwLock::new(view),
            applied_tx,
            snapshot_dir,
            current_snapshot: Mutex::new(current),
            applied_bytes: AtomicU64::new(0),
            load_batch_bytes: AtomicU64::new(snapshot::LOAD_BATCH_BYTES as u64),
            snapshot_mark: AtomicU64::new(0),
            log: OnceLock::new(),
            archive: RwLock::new(archive),
        }))
    }

    /// Gives the state machine its Raft log: from then on, a published record is stored as
    /// where the log holds it. Once only; later calls change nothing.
    pub fn attach_log(&self, log: Arc<dyn Entries>) {
        let _ = self.log.set(log);
    }

    fn log(&self) -> Option<&dyn Entries> {
        self.log.get().map(|l| l.as_ref())
    }

    /// The current snapshot's record files, if it is linked.
    fn archive(&self) -> Option<Arc<records::Archive>> {
        self.archive
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where records are read from: the log, then the current snapshot's record files
    /// (`archive`, from [`SmShared::archive`]). `None` without a log.
    fn sources<'a>(
        &'a self,
        archive: &'a Option<Arc<records::Archive>>,
    ) -> Option<records::Sources<'a>> {
        self.log().map(|log| records::Sources {
            log,
            archive: archive.as_deref(),
        })
    }

    /// A read view of the applied state. Hold it briefly: apply waits for it.
    pub fn view(&self) -> RwLockReadGuard<'_, SmView> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn view_mut(&self) -> RwLockWriteGuard<'_, SmView> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Watch the applied index.
    pub fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// The index and size of the newest snapshot on disk.
    pub fn snapshot_info(&self) -> Option<(u64, u64)> {
        let cur = self
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cur.as_ref().map(|c| (snapshot_index(&c.meta), c.bytes))
    }

    /// Reads stored records of `topic` at `offsets`: at most `max` records and, after the
    /// first, at most `max_bytes` of values.
    pub fn read_records(
        &self,
        topic: &TopicMeta,
        offsets: std::ops::Range<u64>,
        max: u64,
        max_bytes: u64,
    ) -> Result<Vec<(u64, StoredRecord)>, String> {
        let std::ops::Range { start: from, end } = offsets;
        let cf = self.db.cf_handle(CF_SM).ok_or("column family sm missing")?;
        let archive = self.archive();
        let sources = self.sources(&archive);
        let reader = records::Reader::new(sources.as_ref().map(|s| s as &dyn records::EntrySource));
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let mut it = records::topic_iter(&self.db, cf, topic.id, end);
        // The value holding `from` (a run may start below it), else the first after it.
        if records::find(&mut it, topic.id, from)?.is_none() {
            it.seek(keys::record(topic.id, from));
        }
        'values: while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            let Some((id, first)) = keys::parse_record(k) else {
                break;
            };
            if id != topic.id || first >= end {
                break;
            }
            let mut stored = Some(records::decode(v)?);
            let span = stored.as_ref().map_or(0, records::Stored::span);
            for n in from.saturating_sub(first)..span {
                let offset = first + n;
                if offset >= end || out.len() as u64 >= max {
                    break 'values;
                }
                // A record stored whole is the value's only one: taken, not copied.
                let rec = match stored.take_if(|s| matches!(s, records::Stored::Whole(_))) {
                    Some(records::Stored::Whole(rec)) => rec,
                    _ => reader.nth(stored.as_ref().ok_or("a record read twice")?, n)?,
                };
                bytes += rec.value.len() as u64;
                if !out.is_empty() && bytes > max_bytes {
                    break 'values;
                }
                out.push((offset, rec));
            }
            it.next();
        }
        it.status().map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// Applies entries and persists the result; blocking.
    ///
    /// A storage fault met while applying (a record that cannot be read) fails the whole call:
    /// nothing is written, the in-memory view is reloaded from what RocksDB holds (so no reader
    /// sees a half-applied state), and the error stops Raft, which stops the node.
    pub(crate) fn apply_blocking(&self, entries: Vec<Entry>) -> StorageResult<Vec<ApplyResponse>> {
        let mut view = self.view_mut();
        let result = self.apply_locked(&mut view, entries);
        if let Err(e) = &result {
            tracing::error!("applying entries failed, nothing of them is kept: {e}");
            match load_view(&self.db) {
                Ok(reloaded) => *view = reloaded,
                Err(reload) => {
                    tracing::error!("reloading the state machine after that failed too: {reload}")
                }
            }
        }
        result
    }

    fn apply_locked(
        &self,
        view: &mut SmView,
        entries: Vec<Entry>,
    ) -> StorageResult<Vec<ApplyResponse>> {
        let cf = self
            .db
            .cf_handle(CF_SM)
            .ok_or_else(|| to_io("column family sm missing"))?;
        let mut writes = Vec::new();
        let mut responses = Vec::with_capacity(entries.len());
        let mut membership_changed = false;
        let archive = self.archive();
        let sources = self.sources(&archive);
        let source = DbRecords {
            db: &self.db,
            reader: records::Reader::new(sources.as_ref().map(|s| s as &dyn records::EntrySource)),
            entries: &entries,
            last: Default::default(),
        };
        for entry in &entries {
            let index = entry.log_id.index;
            view.last_applied = Some(entry.log_id);
            let resp = match &entry.payload {
                EntryPayload::Blank => ApplyResponse {
                    commit_point: CommitPoint {
                        index,
                        timestamp_ms: view.state.clock_ms,
                    },
                    results: vec![],
                },
                EntryPayload::Normal(LogPayload::V1(batch)) => {
                    let bytes: usize = batch.commands.iter().map(|c| c.approx_bytes()).sum();
                    self.applied_bytes
                        .fetch_add(bytes as u64, Ordering::Relaxed);
                    apply_entry(&mut view.state, &source, index, batch, &mut writes).map_err(
                        |fault| {
                            to_io(format!(
                                "applying entry {index}: {fault}; the store cannot be trusted"
                            ))
                        },
                    )?
                }
                EntryPayload::Membership(m) => {
                    let before: Vec<u64> = view
                        .membership
                        .membership()
                        .nodes()
                        .map(|(id, _)| *id)
                        .collect();
                    for id in before {
                        if m.get_node(&id).is_none() {
                            view.state.retired_nodes.insert(id);
                        }
                    }
                    view.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    membership_changed = true;
                    ApplyResponse {
                        commit_point: CommitPoint {
                            index,
                            timestamp_ms: view.state.clock_ms,
                        },
                        results: vec![],
                    }
                }
            };
            view.commit_point = resp.commit_point;
            responses.push(resp);
        }
        let mut batch = WriteBatch::default();
        let mut subs_touched = std::collections::BTreeSet::new();
        let mut topics_touched = std::collections::BTreeSet::new();
        let enc = |e: bincode::Error| to_io(e);
        // A batch publish's records go in as one run, under the first one's key.
        let mut runs = records::RunWriter::new(&self.db, cf);
        for w in writes {
            match w {
                Write::PutTopic(name) => {
                    topics_touched.insert(name);
                }
                Write::DeleteTopic { name, id } => {
                    topics_touched.remove(&name);
                    batch.delete_cf(cf, keys::topic(&name));
                    runs.delete_topic(&mut batch, id).map_err(enc)?;
                    let (start, end) = keys::producers_of(id);
                    batch.delete_range_cf(cf, start, end);
                }
                Write::TrimTopic { topic_id, from, to } => {
                    runs.trim(&mut batch, topic_id, from, to).map_err(to_io)?;
                }
                Write::PutProducer { topic, producer_id } => {
                    let (Some(meta), Some(p)) = (
                        view.state.topics.get(&topic),
                        view.state.producers.get(&topic, &producer_id),
                    ) else {
                        continue;
                    };
                    batch.put_cf(
                        cf,
                        keys::producer(meta.id, &producer_id),
                        values::encode(p).map_err(enc)?,
                    );
                }
                Write::DeleteProducer { topic, producer_id } => {
                    if let Some(meta) = view.state.topics.get(&topic) {
                        batch.delete_cf(cf, keys::producer(meta.id, &producer_id));
                    }
                }
                Write::PutRecord {
                    topic_id,
                    offset,
                    record,
                } => {
                    // The log holds a published record's bytes: keep where, if it can be read.
                    let value = match record {
                        Appended::Logged { timestamp_ms, at } if self.log.get().is_some() => {
                            let value = records::AtValue { timestamp_ms, at };
                            runs.push(&mut batch, topic_id, offset, value)
                                .map_err(enc)?;
                            continue;
                        }
                        Appended::Logged { timestamp_ms, at } => {
                            records::encode_record(&source.logged(at, timestamp_ms).map_err(to_io)?)
                        }
                        Appended::Whole(record) => records::encode_record(&record),
                    };
                    batch.put_cf(cf, keys::record(topic_id, offset), value.map_err(enc)?);
                }
                // Written once at the end, whatever number of commands touched it.
                Write::PutSub(id) => {
                    subs_touched.insert(id);
                }
                Write::DeleteSub(id) => {
                    let (start, end) = subs::range(id);
                    batch.delete_range_cf(cf, start, end);
                }
            }
        }
        runs.flush(&mut batch).map_err(enc)?;
        // Ids are never reused, so a subscription deleted in this batch is simply absent. Each
        // is written as its head and the leases and pending redeliveries that changed.
        for id in subs_touched {
            if let Some(sub) = view.state.subs.get_mut(&id) {
                subs::put(&mut batch, cf, sub).map_err(enc)?;
            }
        }
        // Written once, after any delete of the same name in this batch: a topic deleted and
        // created again within one apply call ends up with its new metadata.
        for name in topics_touched {
            if let Some(meta) = view.state.topics.get(&name) {
                batch.put_cf(cf, keys::topic(&name), values::encode(meta).map_err(enc)?);
            }
        }
        let sm_meta = SmMeta::V1 {
            clock_ms: view.state.clock_ms,
            next_topic_id: view.state.next_topic_id,
            next_sub_id: view.state.next_sub_id,
            retired_nodes: view.state.retired_nodes.iter().copied().collect(),
        };
        batch.put_cf(cf, keys::SM_META, values::encode(&sm_meta).map_err(enc)?);
        batch.put_cf(
            cf,
            keys::APPLIED,
            values::encode(&view.last_applied).map_err(enc)?,
        );
        if membership_changed {
            batch.put_cf(
                cf,
                keys::MEMBERSHIP,
                values::encode(&view.membership).map_err(enc)?,
            );
        }
        // Not in the WAL (see `apply_write_options`): a crash loses what was applied since
        // the family's last flush, and start-up applies it again from the Raft log. What a
        // flush makes durable is a consistent prefix (one batch per apply call, the applied
        // id in it), and never ahead of the log: `StateMachineStore::apply` waited until the
        // local log was fsynced up to these entries.
        self.db
            .write_opt(batch, &super::apply_write_options())
            .map_err(to_io)?;
        self.applied_tx.send_replace(view.commit_point.index);
        Ok(responses)
    }

    /// The database, for tests that look at what is stored.
    #[cfg(test)]
    pub(crate) fn db_handle(&self) -> Arc<DB> {
        self.db.clone()
    }

    fn set_archive(&self, archive: Option<Arc<records::Archive>>) {
        *self.archive.write().unwrap_or_else(|p| p.into_inner()) = archive;
    }

    /// Replaces the whole state with the snapshot at `path`. The view lock is held across
    /// the load and the reload, so readers never see memory and disk disagree.
    fn load_snapshot(&self, path: &std::path::Path) -> Result<(), snapshot::SnapshotError> {
        let mut view = self.view_mut();
        let batch_bytes = self.load_batch_bytes.load(Ordering::Relaxed) as usize;
        snapshot::load_into_with(&self.db, path, batch_bytes)?;
        *view = load_view(&self.db).map_err(|e| snapshot::SnapshotError::Corrupt(e.to_string()))?;
        let applied = view.last_applied.map_or(0, |l| l.index);
        // Its records are whole, or in its record files (a linked transfer), which are read
        // from now on where the log lacks an entry: swapped under the view lock with the
        // state, so no reader pairs the new state with the old files.
        self.set_archive(archive_of(path, applied));
        drop(view);
        self.applied_tx.send_replace(applied);
        Ok(())
    }
}

impl SmShared {
    /// Bytes of commands applied since the last snapshot was started (or since start-up).
    pub fn bytes_since_snapshot(&self) -> u64 {
        self.applied_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(self.snapshot_mark.load(Ordering::Relaxed))
    }

    /// A digest of the whole state machine and the index it is as of: two nodes at the same
    /// index must have the same digest. Taken from a consistent RocksDB view, so apply goes
    /// on meanwhile. Reads everything: for tests and operators, not for hot paths.
    pub fn digest(&self) -> Result<(u64, String), String> {
        let cf = self.db.cf_handle(CF_SM).ok_or("column family sm missing")?;
        let (index, view) = {
            let guard = self.view();
            (guard.commit_point.index, self.db.snapshot())
        };
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_snapshot(&view);
        let mut crc = crc32fast::Hasher::new();
        let (mut pairs, mut bytes) = (0u64, 0u64);
        // Over the pairs as a snapshot holds them (subscriptions whole), so that nodes that
        // store them differently still compare.
        let mut fold = |k: &[u8], v: &[u8]| -> Result<(), String> {
            crc.update(&(k.len() as u64).to_le_bytes());
            crc.update(k);
            crc.update(&(v.len() as u64).to_le_bytes());
            crc.update(v);
            pairs += 1;
            bytes += (k.len() + v.len()) as u64;
            Ok(())
        };
        let mut whole = subs::Whole::default();
        let archive = self.archive();
        let sources = self.sources(&archive);
        let reader = records::Reader::new(sources.as_ref().map(|s| s as &dyn records::EntrySource));
        for item in self.db.iterator_cf_opt(cf, opts, IteratorMode::Start) {
            let (k, v) = item.map_err(|e| e.to_string())?;
            reader.whole(&k, &v, &mut |k, v| whole.push(k, v, &mut fold))?;
        }
        whole.finish(&mut fold)?;
        Ok((index, format!("{pairs}-{bytes}-{:08x}", crc.finalize())))
    }

    /// Builds a snapshot of the applied state durably and makes it the current one, unless a
    /// newer one was installed meanwhile (then that one stays current and is returned);
    /// blocking.
    pub(crate) fn build_blocking(&self) -> StorageResult<(snapshot::FileMeta, PathBuf)> {
        let started = std::time::Instant::now();
        self.snapshot_mark.store(
            self.applied_bytes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        // The view is taken under the state lock, which an install holds for its whole load:
        // a build never sees a half-loaded state machine.
        let view = {
            let _whole = self.view();
            self.db.snapshot()
        };
        let archive = self.archive();
        let sources = self.sources(&archive);
        let built = snapshot::build_from(
            &self.db,
            &view,
            &self.snapshot_dir,
            snapshot_id_suffix(),
            sources.as_ref().map(|s| s as &dyn Entries),
        )
        .map_err(to_io)?;
        drop(view);
        let snapshot::Built {
            meta,
            path,
            bytes,
            lowest,
        } = built;
        // Once this returns, openraft may purge the log up to the snapshot. Apply writes skip
        // the WAL, so make the applied state durable in table files first: a crash then
        // re-applies only what came after, from the log, instead of loading the whole
        // snapshot file again at start-up (which `open` would do, and is correct, but slow).
        self.flush_state()?;
        // What the state on disk points into the log is now at least what the snapshot's view
        // pointed into (records only go, and new ones point past the view): the log may let
        // go of the entries below it. Not before the flush: until then, the state on disk may
        // be an older one that points further back.
        if let Some(log) = self.log() {
            let applied = snapshot_index(&meta);
            log.keep_from(lowest.unwrap_or(applied + 1));
        }
        let (meta, path) = self.adopt_built(meta, path, bytes);
        log_snapshot("built", &meta, bytes, started);
        metrics::histogram!("raftq_snapshot_build_seconds").record(started.elapsed().as_secs_f64());
        Ok((meta, path))
    }

    /// Writes what the state machine applied so far to table files (waits for the flush).
    pub(crate) fn flush_state(&self) -> std::io::Result<()> {
        let cf = self
            .db
            .cf_handle(CF_SM)
            .ok_or_else(|| to_io("column family sm missing"))?;
        self.db.flush_cf(cf).map_err(to_io)
    }

    /// Makes a freshly built snapshot the current one and removes the others, unless the
    /// current one is newer (a snapshot installed while this one was being built): then the
    /// built file is removed and the current one returned. A build never replaces or deletes a
    /// newer snapshot.
    fn adopt_built(
        &self,
        meta: snapshot::FileMeta,
        path: PathBuf,
        bytes: u64,
    ) -> (snapshot::FileMeta, PathBuf) {
        let mut cur = self
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(newer) = cur
            .as_ref()
            .filter(|c| c.meta.last_log_id > meta.last_log_id)
        {
            tracing::info!(
                built = %meta.snapshot_id,
                current = %newer.meta.snapshot_id,
                "a newer snapshot was installed while this one was built; keeping the newer"
            );
            if newer.path != path {
                snapshot::remove(&path);
            }
            return (newer.meta.clone(), newer.path.clone());
        }
        *cur = Some(CurrentSnapshot {
            meta: meta.clone(),
            path: path.clone(),
            bytes,
        });
        self.set_archive(archive_of(&path, snapshot_index(&meta)));
        snapshot::remove_others(&self.snapshot_dir, &path);
        (meta, path)
    }

    /// Stores a received snapshot durably, checks it is the one announced, and replaces the
    /// state machine with it; blocking.
    pub(crate) fn install_blocking(
        &self,
        src: &mut std::fs::File,
        want: &SnapshotMeta,
    ) -> StorageResult<()> {
        let started = std::time::Instant::now();
        let fail = |e: snapshot::SnapshotError| to_io(e);
        let fault = |e: std::io::Error| to_io(e);
        // `src` is the received body, read here and removed after: what is kept is the copy
        // stored below, synced on its own. Not synced, the body's pages are dropped with the
        // file instead of written out, so the record bytes reach this node's disk once.
        let linked = super::transfer::is_transfer(src).map_err(fault)?;
        let (got, path) = match linked {
            true => super::transfer::store_received(src, &self.snapshot_dir, want),
            false => snapshot::store_received(src, &self.snapshot_dir, want),
        }
        .map_err(fail)?;
        if linked {
            tracing::info!(
                snapshot = %got.snapshot_id,
                "received a linked snapshot: the log entries its records point into are its \
                 record files, and no record is copied into the state machine"
            );
        }
        super::faults::point(super::faults::INSTALL_STORED).map_err(fault)?;
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        self.load_snapshot(&path).map_err(fail)?;
        // The loaded state holds records whole or in the snapshot's record files (load_into's
        // writes are durable once it returns), and records appended from now on point past
        // the snapshot.
        if let Some(log) = self.log() {
            log.keep_from(snapshot_index(&got) + 1);
        }
        log_snapshot("installed", &got, bytes, started);
        metrics::histogram!("raftq_snapshot_install_seconds")
            .record(started.elapsed().as_secs_f64());
        super::faults::point(super::faults::INSTALL_LOADED).map_err(fault)?;
        let mut cur = self
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *cur = Some(CurrentSnapshot {
            meta: got,
            path: path.clone(),
            bytes,
        });
        snapshot::remove_others(&self.snapshot_dir, &path);
        Ok(())
    }
}

/// Logs a snapshot built or installed (`done`) and how long it took.
fn log_snapshot(done: &str, meta: &snapshot::FileMeta, bytes: u64, started: std::time::Instant) {
    tracing::info!(
        snapshot = %meta.snapshot_id,
        index = meta.last_log_id.map_or(0, |id| id.index),
        bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "snapshot {done}"
    );
}

fn read_applied(db: &DB) -> anyhow::Result<Option<LogId>> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| anyhow::anyhow!("column family sm missing"))?;
    Ok(match db.get_cf(cf, keys::APPLIED)? {
        Some(b) => {
            values::decode(&b).map_err(|e| anyhow::anyhow!("corrupt applied log id: {e}"))?
        }
        None => None,
    })
}

/// Rebuilds the in-memory view from the `sm` column family.
fn load_view(db: &DB) -> anyhow::Result<SmView> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| anyhow::anyhow!("column family sm missing"))?;
    let mut view = SmView {
        last_applied: read_applied(db)?,
        ..Default::default()
    };
    if let Some(b) = db.get_cf(cf, keys::MEMBERSHIP)? {
        view.membership =
            values::decode(&b).map_err(|e| anyhow::anyhow!("corrupt membership: {e}"))?;
    }
    if let Some(b) = db.get_cf(cf, keys::SM_META)? {
        let SmMeta::V1 {
            clock_ms,
            next_topic_id,
            next_sub_id,
            retired_nodes,
        } = values::decode(&b).map_err(|e| anyhow::anyhow!("corrupt state machine clock: {e}"))?;
        view.state.retired_nodes = retired_nodes.into_iter().collect();
        view.state.clock_ms = clock_ms;
        view.state.next_topic_id = next_topic_id;
        view.state.next_sub_id = next_sub_id;
    }
    for sub in subs::load(db).map_err(|e| anyhow::anyhow!("{e}"))? {
        view.state.restore_sub(sub);
    }
    let prefix = [keys::TOPIC_PREFIX];
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item?;
        if k.first() != Some(&keys::TOPIC_PREFIX) {
            break;
        }
        let name = String::from_utf8(k[1..].to_vec())?;
        let meta: TopicMeta = values::decode(&v)
            .map_err(|e| anyhow::anyhow!("corrupt metadata of topic {name:?}: {e}"))?;
        view.state.topics.insert(name, meta);
    }
    let topic_names: std::collections::BTreeMap<u64, String> = view
        .state
        .topics
        .iter()
        .map(|(name, meta)| (meta.id, name.clone()))
        .collect();
    let prefix = [keys::PRODUCER_PREFIX];
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item?;
        if k.first() != Some(&keys::PRODUCER_PREFIX) {
            break;
        }
        let (topic_id, producer_id) = keys::parse_producer(&k)
            .ok_or_else(|| anyhow::anyhow!("corrupt producer key {k:?}"))?;
        let state: ProducerState = values::decode(&v)
            .map_err(|e| anyhow::anyhow!("corrupt producer {producer_id:?}: {e}"))?;
        // A producer of a deleted topic is removed with it; one left over is ignored.
        if let Some(topic) = topic_names.get(&topic_id) {
            view.state
                .producers
                .restore(topic.clone(), producer_id, state);
        }
    }
    view.commit_point = CommitPoint {
        index: view.last_applied.map_or(0, |l| l.index),
        timestamp_ms: view.state.clock_ms,
    };
    Ok(view)
}

/// The openraft state machine: a handle on [`SmShared`], and on how far the local log is
/// durable.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<SmShared>,
    /// The local log's fsynced index (`LogStore::durable`): apply waits until it covers the
    /// entries it applies. `None` only for openraft's conformance suite, which applies entries
    /// it never appended.
    log_durable: Option<watch::Receiver<u64>>,
}

impl StateMachineStore {
    /// The state machine of a node whose log reports its fsynced index on `log_durable`.
    pub fn new(shared: Arc<SmShared>, log_durable: watch::Receiver<u64>) -> Self {
        StateMachineStore {
            shared,
            log_durable: Some(log_durable),
        }
    }

    /// A state machine that applies without waiting for a log: for openraft's conformance
    /// suite only.
    #[cfg(test)]
    pub fn without_log(shared: Arc<SmShared>) -> Self {
        StateMachineStore {
            shared,
            log_durable: None,
        }
    }

    /// Waits until the local log is fsynced up to `index`. Apply writes skip RocksDB's WAL and
    /// reach the disk whenever a memtable is flushed, so state applied from an entry the local
    /// log has not synced yet could outlive that entry in a power loss: the node would restart
    /// with a state machine ahead of its log. Usually there is no wait: the leader's own fsync
    /// ran beside the followers' that committed the entry.
    async fn wait_for_log(&self, index: u64) -> StorageResult<()> {
        let Some(durable) = &self.log_durable else {
            return Ok(());
        };
        if *durable.borrow() >= index {
            return Ok(());
        }
        let waited = std::time::Instant::now();
        durable
            .clone()
            .wait_for(|d| *d >= index)
            .await
            .map_err(|_| to_io("the log stopped before the entries to apply were durable"))?;
        metrics::histogram!("raftq_apply_log_wait_seconds").record(waited.elapsed().as_secs_f64());
        Ok(())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<SmShared>) -> StorageResult<T> + Send + 'static,
    ) -> StorageResult<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(shared))
            .await
            .map_err(to_io)?
    }
}

fn snapshot_id_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl SmShared {
    /// A new, empty temp file in the snapshot directory to receive a snapshot into, and its
    /// path (a leftover is removed when the node next starts).
    pub async fn begin_receiving_snapshot(&self) -> StorageResult<(tokio::fs::File, PathBuf)> {
        let dir = self.snapshot_dir.clone();
        tokio::fs::create_dir_all(&dir).await?;
        let path = dir.join(format!("incoming-{}.tmp", snapshot_id_suffix()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await?;
        Ok((file, path))
    }
}

impl StateMachineStore {
    /// The snapshot at `path` as openraft sends it: in the whole format, a linked one expanded
    /// with its records as it is read.
    async fn open_snapshot(meta: snapshot::FileMeta, path: PathBuf) -> StorageResult<Snapshot> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = tokio::fs::File::open(&path).await?;
        let mut head = [0u8; 12];
        file.read_exact(&mut head).await?;
        file.rewind().await?;
        let snapshot = match head[8..12] == snapshot::LINKED_VERSION.to_le_bytes() {
            true => SnapshotData::Linked {
                whole: snapshot::whole_stream(path.clone()),
                transfer: super::transfer::stream(path),
            },
            false => SnapshotData::File(file),
        };
        Ok(Snapshot {
            meta: meta.raft_meta(),
            snapshot,
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> StorageResult<Snapshot> {
        let (meta, path) = self.blocking(|shared| shared.build_blocking()).await?;
        Self::open_snapshot(meta, path).await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        let view = self.shared.view();
        Ok((view.last_applied, view.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> StorageResult<()>
    where
        Strm: futures::Stream<Item = StorageResult<EntryResponder<TypeConfig>>>
            + Unpin
            + openraft::OptionalSend,
    {
        use futures::StreamExt;
        // Everything openraft hands over at once is applied in one RocksDB write batch.
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            batch.push(entry);
            responders.push(responder);
        }
        if let Some(last) = batch.last() {
            self.wait_for_log(last.log_id.index).await?;
        }
        // Inline: applying is CPU work on memory plus one unsynced RocksDB write (microseconds
        // per entry), cheaper than two thread hand-offs to the blocking pool and back.
        let responses = self.shared.apply_blocking(batch)?;
        for (responder, response) in responders.into_iter().zip(responses) {
            if let Some(r) = responder {
                r.send(response);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> StorageResult<()> {
        let want = meta.clone();
        let (file, spooled) = match snapshot {
            SnapshotData::File(file) => (file, None),
            chunks @ (SnapshotData::Stream(_) | SnapshotData::Linked { .. }) => {
                let mut chunks = chunks.into_stream();
                // Made by a node's own state machine, not received: written to a file first.
                use futures::StreamExt;
                use tokio::io::{AsyncSeekExt, AsyncWriteExt};
                let (mut file, path) = self.shared.begin_receiving_snapshot().await?;
                while let Some(chunk) = chunks.next().await {
                    file.write_all(&chunk?).await?;
                }
                file.flush().await?;
                file.rewind().await?;
                (file, Some(path))
            }
        };
        let mut src = file.into_std().await;
        let result = self
            .blocking(move |shared| shared.install_blocking(&mut src, &want))
            .await;
        if let Some(path) = spooled {
            let _ = tokio::fs::remove_file(path).await;
        }
        result
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot>> {
        let cur = self
            .shared
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match cur {
            None => Ok(None),
            Some(c) => Ok(Some(Self::open_snapshot(c.meta, c.path).await?)),
        }
    }
}

#[cfg(test)]
#[path = "sm_tests.rs"]
mod tests;
