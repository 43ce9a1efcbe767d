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
use openraft::vote::RaftLeaderId as _;
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};

use super::watermark::{Marks, Watermark};
use super::{keys, values, CF_LOG, CF_RAFT};
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
    /// What this node has had on disk, kept outside RocksDB (none in unit tests).
    watermark: Option<Arc<Watermark>>,
}

/// One append waiting for the WAL fsync.
struct Queued {
    /// openraft's callback (`None` when it was told early: the negative control build).
    callback: Option<IOFlushed<TypeConfig>>,
    /// When it was written.
    written: std::time::Instant,
    /// Its last log index, and the watermark's truncation epoch when it was written.
    last_index: u64,
    epoch: u64,
}

/// The flusher thread and the queue to it. Dropping the last handle closes the queue and
/// waits for the thread to end, so the thread's hold on the database ends before the drop
/// returns: no thread is left closing RocksDB while the process exits.
struct Flusher {
    tx: Option<mpsc::Sender<Queued>>,
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
/// the WAL once and reports all of them (to openraft, and to the watermark). It ends when the
/// last `LogStore` clone is dropped.
fn run_flusher(db: Arc<DB>, rx: mpsc::Receiver<Queued>, watermark: Option<Arc<Watermark>>) {
    let fsync_seconds = metrics::histogram!("raftq_log_fsync_seconds");
    let append_seconds = metrics::histogram!("raftq_log_append_seconds");
    let fsyncs = metrics::counter!("raftq_log_fsyncs_total");
    while let Ok(first) = rx.recv() {
        if cfg!(feature = "negative-control-unsafe-early-flush") {
            // The negative control fsyncs on a timer, like a broker that flushes now and then;
            // it has told openraft "flushed" already (see `append`).
            std::thread::sleep(NEGATIVE_CONTROL_FSYNC_EVERY);
        }
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        // Syncs the WAL files up to everything written so far, which includes every append
        // in `waiting`: each was written before it was queued.
        let started = std::time::Instant::now();
        let result = db.flush_wal(true).map_err(|e| e.to_string());
        let done = std::time::Instant::now();
        fsync_seconds.record(done.duration_since(started).as_secs_f64());
        fsyncs.increment(1);
        for q in waiting {
            append_seconds.record(done.duration_since(q.written).as_secs_f64());
            if let (Ok(()), Some(w)) = (&result, &watermark) {
                w.flushed(q.last_index, q.epoch);
            }
            if let Some(callback) = q.callback {
                callback.io_completed(result.clone().map_err(to_io));
            }
        }
    }
}

/// How often the negative control build fsyncs its log (it acknowledges before that).
const NEGATIVE_CONTROL_FSYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn parse_index(key: &[u8]) -> StorageResult<u64> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| to_io(format!("bad log key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

pub(crate) fn encode_entry(entry: &Entry) -> StorageResult<Vec<u8>> {
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

/// What a store holds, to compare with its watermark: the last log index (of an entry, or
/// the last purged one when the log is empty behind a snapshot) and the vote's term.
pub fn stored_marks(db: &DB) -> StorageResult<Marks> {
    let raft = db
        .cf_handle(CF_RAFT)
        .ok_or_else(|| to_io("column family raft missing"))?;
    let meta =
        |key: &[u8]| -> StorageResult<Option<Vec<u8>>> { db.get_cf(raft, key).map_err(to_io) };
    // Stored as a plain log id by `purge` (and by a restore), absent before the first purge.
    let last_purged: Option<LogId> = match meta(keys::LAST_PURGED)? {
        Some(b) => {
            Some(values::decode(&b).map_err(|e| to_io(format!("corrupt last purged id: {e}")))?)
        }
        None => None,
    };
    let vote: Option<Vote> = match meta(keys::VOTE)? {
        Some(b) => Some(values::decode(&b).map_err(|e| to_io(format!("corrupt vote: {e}")))?),
        None => None,
    };
    let log = db
        .cf_handle(CF_LOG)
        .ok_or_else(|| to_io("column family log missing"))?;
    let last_entry = match db.iterator_cf(log, IteratorMode::End).next() {
        None => None,
        Some(Err(e)) => return Err(to_io(e)),
        Some(Ok((k, _))) => Some(parse_index(&k)?),
    };
    Ok(Marks {
        log_index: last_entry.or(last_purged.map(|l| l.index)).unwrap_or(0),
        vote_term: vote.map_or(0, |v| v.leader_id().term()),
    })
}

/// Makes `vote` the stored vote, durably, unless the stored one is of a later term: a node
/// rejoining after it lost data takes the term of the leader that made it a learner before it
/// starts Raft (see [`crate::rejoin`]).
pub fn adopt_vote(db: &DB, vote: &Vote) -> StorageResult<()> {
    let raft = db
        .cf_handle(CF_RAFT)
        .ok_or_else(|| to_io("column family raft missing"))?;
    if let Some(bytes) = db.get_cf(raft, keys::VOTE).map_err(to_io)? {
        let stored: Vote =
            values::decode(&bytes).map_err(|e| to_io(format!("corrupt vote: {e}")))?;
        if stored.leader_id().term() >= vote.leader_id().term() {
            return Ok(());
        }
    }
    let mut batch = WriteBatch::default();
    batch.put_cf(raft, keys::VOTE, values::encode(vote).map_err(to_io)?);
    db.write_opt(batch, &super::write_options(true))
        .map_err(to_io)
}

impl LogStore {
    /// Opens the log store on `db` and starts its flusher thread.
    pub fn new(db: Arc<DB>) -> std::io::Result<Self> {
        Self::start(db, None)
    }

    /// [`new`](Self::new), keeping `watermark` up to date with every fsync, vote and
    /// truncation.
    pub fn with_watermark(db: Arc<DB>, watermark: Arc<Watermark>) -> std::io::Result<Self> {
        Self::start(db, Some(watermark))
    }

    fn start(db: Arc<DB>, watermark: Option<Arc<Watermark>>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let flush_db = db.clone();
        let flush_watermark = watermark.clone();
        let thread = std::thread::Builder::new()
            .name("raftq-log-flush".into())
            .spawn(move || run_flusher(flush_db, rx, flush_watermark))?;
        let store = LogStore {
            db,
            committed: Arc::new(AtomicU64::new(0)),
            flusher: Arc::new(Flusher {
                tx: Some(tx),
                thread: Some(thread),
            }),
            watermark,
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
            Some(bytes) => values::decode(&bytes)
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
        let bytes = values::encode(vote).map_err(to_io)?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::VOTE, bytes);
        self.write_synced(batch).await?;
        // Then the watermark says a vote of this term was on disk: a store found later with
        // an older vote lost it.
        if let Some(w) = self.watermark.clone() {
            let term = vote.leader_id().term();
            tokio::task::spawn_blocking(move || w.voted(term))
                .await
                .map_err(to_io)??;
        }
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        // Not synced: losing it on a crash only means re-learning the commit index from the
        // leader; it never makes the node claim more than was committed.
        if let Some(c) = &committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        let mut batch = WriteBatch::default();
        let bytes = values::encode(&committed).map_err(to_io)?;
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
        let mut last_index = 0;
        {
            let cf = self.cf(CF_LOG)?;
            for entry in entries {
                last_index = entry.index();
                batch.put_cf(cf, index_key(last_index), encode_entry(&entry)?);
            }
        }
        if let Some(failure) = self.watermark.as_ref().and_then(|w| w.failure()) {
            return Err(to_io(failure));
        }
        let epoch = self.watermark.as_ref().map_or(0, |w| w.epoch());
        // Written, and so readable for replication, before this returns; durable once the
        // flusher has fsynced the WAL, which is when openraft hears that it is flushed.
        self.write_unsynced(batch)?;
        let callback = if cfg!(feature = "negative-control-unsafe-early-flush") {
            // The negative control: "flushed" before the fsync. Acknowledged records are lost
            // when every node loses power at once; the chaos suite must see that.
            callback.io_completed(Ok(()));
            None
        } else {
            Some(callback)
        };
        let queued = Queued {
            callback,
            written,
            last_index,
            epoch,
        };
        self.flusher
            .tx
            .as_ref()
            .and_then(|tx| tx.send(queued).ok())
            .ok_or_else(|| to_io("the log flusher thread has stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StorageResult<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        // The watermark first: it must never claim entries that are removed on purpose.
        if let Some(w) = self.watermark.clone() {
            let keep = last_log_id.map_or(0, |l| l.index);
            tokio::task::spawn_blocking(move || w.truncating(keep))
                .await
                .map_err(to_io)??;
        }
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(from), index_key(u64::MAX));
        // The last index (u64::MAX) is not covered by the exclusive range end; it can never be used.
        self.write_synced(batch).await
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        let mut batch = WriteBatch::default();
        let bytes = values::encode(&log_id).map_err(to_io)?;
        // Recording the purge point and deleting what it covers in one synced batch: a crash
        // leaves both or neither.
        batch.put_cf(self.cf(CF_RAFT)?, keys::LAST_PURGED, bytes);
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(0), index_key(log_id.index + 1));
        self.write_synced(batch).await
    }
}

#[cfg(test)]
mod tests {
    use openraft::impls::leader_id_adv::LeaderId as CommittedLeaderId;
    use openraft::storage::RaftLogStorage;
    use openraft::vote::RaftLeaderId;

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// What start-up compares with the watermark: the last log index (an entry's, or the last
    /// purged one's when the log is empty behind a snapshot) and the vote's term; and a vote
    /// adopted for a rejoin never lowers the stored one.
    #[tokio::test]
    async fn stored_marks_follow_the_log_the_purge_and_the_vote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = super::super::open_db(dir.path()).expect("open db");
        assert_eq!(stored_marks(&db).expect("marks"), Marks::default());
        let mut store = LogStore::new(db.clone()).expect("log store");
        store
            .save_vote(&Vote::new_committed(3, 1))
            .await
            .expect("vote");
        let mut batch = WriteBatch::default();
        let cf = db.cf_handle(CF_LOG).expect("log cf");
        for index in 1..=5 {
            let entry = Entry {
                log_id: log_id(3, index),
                payload: openraft::EntryPayload::Blank,
            };
            batch.put_cf(cf, index_key(index), encode_entry(&entry).expect("encode"));
        }
        db.write(batch).expect("write");
        assert_eq!(
            stored_marks(&db).expect("marks"),
            Marks {
                log_index: 5,
                vote_term: 3
            }
        );
        store.purge(log_id(3, 5)).await.expect("purge");
        assert_eq!(stored_marks(&db).expect("marks").log_index, 5);
        adopt_vote(&db, &Vote::new_committed(2, 2)).expect("adopt");
        assert_eq!(stored_marks(&db).expect("marks").vote_term, 3);
        adopt_vote(&db, &Vote::new_committed(7, 2)).expect("adopt");
        assert_eq!(stored_marks(&db).expect("marks").vote_term, 7);
    }
}
