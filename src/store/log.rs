//! The Raft log and Raft metadata on RocksDB.
//!
//! Durability rules (DESIGN.md): an append is reported flushed only after the write-ahead log
//! holding it is fsynced; the vote is saved with sync before `save_vote` returns; the last
//! purged log id is written in the same synced batch that deletes the entries it covers, so a
//! crash can never leave a hole between "purged" and "present".
//!
//! Appends are asynchronous, as openraft 0.10 allows: `append` writes the entries (readable at
//! once, not yet durable) and returns; the flusher thread fsyncs the WAL and only then reports
//! them flushed. Meanwhile the leader already replicates them, so its own fsync overlaps the
//! followers'. Every append queued while an fsync runs shares the next one (group commit).
//! Writes are issued in the order openraft gives them, one at a time. Unsynced writes (appends,
//! the committed id) run inline, a copy into the memtable and the page cache; synced ones (the
//! vote, truncation, purge) run on the blocking pool.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};

use super::{keys, CF_LOG, CF_RAFT};
use crate::codec;
use crate::raft::{to_io, Entry, LogId, StorageResult, TypeConfig, Vote};

/// Version byte in front of every stored log entry.
const ENTRY_FORMAT: u8 = 1;

/// The log store. Cheap to clone: replication tasks read through clones.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    /// The highest committed index this node knows of, for status and readiness.
    committed: Arc<AtomicU64>,
    /// Appends written but not yet reported flushed, in order, to the flusher thread.
    flusher: Arc<Flusher>,
}

/// The flusher thread and the queue to it. Dropping the last handle closes the queue and
/// waits for the thread to end, so the thread's hold on the database ends before the drop
/// returns: no thread is left closing RocksDB while the process exits.
struct Flusher {
    /// Each append's callback, with when it was written.
    tx: Option<mpsc::Sender<(IOFlushed<TypeConfig>, std::time::Instant)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            // The thread ends once the queue is closed and its last fsync is done.
            let _ = thread.join();
        }
    }
}

/// The flusher thread: waits for an append, takes every other append queued behind it, fsyncs
/// the WAL once and reports all of them. It ends when the last `LogStore` clone is dropped.
fn run_flusher(db: Arc<DB>, rx: mpsc::Receiver<(IOFlushed<TypeConfig>, std::time::Instant)>) {
    let fsync_seconds = metrics::histogram!("raftq_log_fsync_seconds");
    let append_seconds = metrics::histogram!("raftq_log_append_seconds");
    let fsyncs = metrics::counter!("raftq_log_fsyncs_total");
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        // Syncs the WAL files up to everything written so far, which includes every append
        // in `waiting`: each was written before it was queued.
        let started = std::time::Instant::now();
        let result = db.flush_wal(true).map_err(|e| e.to_string());
        let done = std::time::Instant::now();
        fsync_seconds.record(done.duration_since(started).as_secs_f64());
        fsyncs.increment(1);
        for (callback, written) in waiting {
            append_seconds.record(done.duration_since(written).as_secs_f64());
            callback.io_completed(result.clone().map_err(to_io));
        }
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn parse_index(key: &[u8]) -> StorageResult<u64> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| to_io(format!("bad log key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

fn encode_entry(entry: &Entry) -> StorageResult<Vec<u8>> {
    let mut out = vec![ENTRY_FORMAT];
    out.extend(codec::encode(entry).map_err(to_io)?);
    Ok(out)
}

pub(crate) fn decode_entry(bytes: &[u8]) -> StorageResult<Entry> {
    match bytes.split_first() {
        Some((&ENTRY_FORMAT, rest)) => {
            codec::decode(rest).map_err(|e| to_io(format!("corrupt log entry: {e}")))
        }
        Some((v, _)) => Err(to_io(format!(
            "log entry has unknown format version {v}; this raftq is too old for this data"
        ))),
        None => Err(to_io("empty log entry")),
    }
}

impl LogStore {
    /// Opens the log store on `db` and starts its flusher thread.
    pub fn new(db: Arc<DB>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let flush_db = db.clone();
        let thread = std::thread::Builder::new()
            .name("raftq-log-flush".into())
            .spawn(move || run_flusher(flush_db, rx))?;
        let store = LogStore {
            db,
            committed: Arc::new(AtomicU64::new(0)),
            flusher: Arc::new(Flusher {
                tx: Some(tx),
                thread: Some(thread),
            }),
        };
        if let Ok(Some(Some(c))) = store.get_meta::<Option<LogId>>(keys::COMMITTED) {
            store.committed.store(c.index, Ordering::Relaxed);
        }
        Ok(store)
    }

    /// Shared view of the committed index, updated as Raft reports it.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn cf(&self, name: &str) -> StorageResult<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| to_io(format!("column family {name} missing")))
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        let cf = self.cf(CF_RAFT)?;
        match self.db.get_cf(cf, key).map_err(to_io)? {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes)
                .map(Some)
                .map_err(|e| to_io(format!("corrupt raft metadata {key:?}: {e}"))),
        }
    }

    /// A synced RocksDB write (the WAL fsynced before it returns), off the async runtime.
    async fn write_synced(&self, batch: WriteBatch) -> StorageResult<()> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.write_opt(batch, &super::write_options(true))
                .map_err(to_io)
        })
        .await
        .unwrap_or_else(|join| Err(to_io(format!("write task failed: {join}"))))
    }

    /// An unsynced RocksDB write, inline rather than on the blocking pool: it only copies into
    /// the memtable and the WAL's page cache, which costs less than two thread hand-offs.
    fn write_unsynced(&self, batch: WriteBatch) -> StorageResult<()> {
        self.db
            .write_opt(batch, &super::write_options(false))
            .map_err(to_io)
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId>> {
        let cf = self.cf(CF_LOG)?;
        let mut it = self.db.iterator_cf(cf, IteratorMode::End);
        match it.next() {
            None => Ok(None),
            Some(Err(e)) => Err(to_io(e)),
            Some(Ok((_, v))) => Ok(Some(decode_entry(&v)?.log_id())),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry>> {
        let start = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let cf = self.cf(CF_LOG)?;
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            cf,
            IteratorMode::From(&index_key(start), Direction::Forward),
        ) {
            let (k, v) = item.map_err(to_io)?;
            let index = parse_index(&k)?;
            if !range.contains(&index) {
                break;
            }
            let entry = decode_entry(&v)?;
            if entry.index() != index {
                return Err(to_io(format!(
                    "log key {index} holds entry {}",
                    entry.log_id()
                )));
            }
            out.push(entry);
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.get_meta(keys::VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged: Option<LogId> = self.get_meta(keys::LAST_PURGED)?;
        let last = self.last_entry_id()?.or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        let mut batch = WriteBatch::default();
        let bytes = codec::encode(vote).map_err(to_io)?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::VOTE, bytes);
        self.write_synced(batch).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        // Not synced: losing it on a crash only means re-learning the commit index from the
        // leader; it never makes the node claim more than was committed.
        if let Some(c) = &committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        let mut batch = WriteBatch::default();
        let bytes = codec::encode(&committed).map_err(to_io)?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::COMMITTED, bytes);
        self.write_unsynced(batch)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        Ok(self.get_meta::<Option<LogId>>(keys::COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = std::time::Instant::now();
        let mut batch = WriteBatch::default();
        {
            let cf = self.cf(CF_LOG)?;
            for entry in entries {
                batch.put_cf(cf, index_key(entry.index()), encode_entry(&entry)?);
            }
        }
        // Written, and so readable for replication, before this returns; durable once the
        // flusher has fsynced the WAL, which is when openraft hears that it is flushed.
        self.write_unsynced(batch)?;
        self.flusher
            .tx
            .as_ref()
            .and_then(|tx| tx.send((callback, written)).ok())
            .ok_or_else(|| to_io("the log flusher thread has stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StorageResult<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(from), index_key(u64::MAX));
        // The last index (u64::MAX) is not covered by the exclusive range end; it can never be used.
        self.write_synced(batch).await
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        let mut batch = WriteBatch::default();
        let bytes = codec::encode(&log_id).map_err(to_io)?;
        // Recording the purge point and deleting what it covers in one synced batch: a crash
        // leaves both or neither.
        batch.put_cf(self.cf(CF_RAFT)?, keys::LAST_PURGED, bytes);
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(0), index_key(log_id.index + 1));
        self.write_synced(batch).await
    }
}
