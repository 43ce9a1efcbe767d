//! The Raft log in segment files ([`super::segments`]) and the Raft metadata on RocksDB.
//!
//! Durability rules (DESIGN.md): an append is reported flushed only after the segment holding
//! it is fdatasynced; the vote is saved with sync before `save_vote` returns; the last purged
//! log id is recorded, synced, before the segments it covers are removed, so a crash can never
//! leave a hole between "purged" and "present" (entries left at or below it are removed at the
//! next start). A truncation is durable before it returns.
//!
//! Appends are asynchronous, as openraft 0.10 allows: `append` makes the entries readable from
//! memory ([`Recent`]) and hands them to the log thread, which writes them to the current
//! segment, fdatasyncs it and only then reports them flushed. Meanwhile the leader already
//! replicates them, so its own fsync overlaps the followers'. Every append queued while an
//! fsync runs shares the next one (group commit). The log thread is the only writer of the
//! files while it has work; truncations and purges go through its queue too, behind the appends
//! handed over before them, and are waited for. A follower's append, when the thread has
//! nothing queued, is written and synced by `append` itself, holding the thread's state, so
//! that the commit path does not pay two thread wake-ups on the follower
//! ([`LogStore::sync_follower_appends_in_place`]); but not one that comes in right behind the
//! last fsync, while more are on their way: those go to the thread and share an fsync.
//!
//! The state machine must never make state durable ahead of the local log (its applies skip
//! RocksDB's WAL and reach disk when a memtable is flushed): [`LogStore::durable`] is how far
//! the local log is fsynced, and apply waits for it (`StateMachineStore::apply`).
//!
//! The vote and the last purged id stay in RocksDB's `raft` family; the committed id is a hint
//! in a file of its own beside the segments ([`CommitHint`]), written on every commit.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::vote::RaftLeaderId as _;
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{IteratorMode, WriteBatch, DB};
use tokio::sync::watch;

use super::commit_hint::CommitHint;
use super::datadir::sync_dir;
use super::segments::{SegmentError, SegmentLog, DEFAULT_SEGMENT_BYTES};
use super::watermark::{Marks, Watermark};
use super::{keys, values, CF_LOG, CF_RAFT};
use crate::codec;
use crate::raft::{to_io, Entry, LogId, StorageResult, TypeConfig, Vote};

/// Version byte in front of every stored log entry.
const ENTRY_FORMAT: u8 = 1;

/// The log's entries, shared by the store's clones and the log thread.
type Segments = Arc<Mutex<SegmentLog>>;

/// Bytes of the newest entries kept decoded in memory.
const RECENT_BYTES: usize = 16 << 20;

/// The newest entries, decoded: every entry not yet written to the files, and as many written
/// ones as fit in [`RECENT_BYTES`] of their encoded size. Replication and apply read them
/// without a file read, a checksum or a decode. Empty, or ending with the log's last entry:
/// appends add to it, truncations and purges cut it with the log.
#[derive(Default)]
struct Recent {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Recent {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.index())
    }

    /// Adds `entry`, and lets go of the oldest entries over the size bound that are written
    /// (at or below `written`).
    fn push(&mut self, entry: Entry, size: usize, written: u64) {
        self.bytes += size;
        self.entries.push_back((entry, size));
        while self.bytes > RECENT_BYTES
            && self
                .entries
                .front()
                .is_some_and(|(e, _)| e.index() <= written)
        {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    fn last_id(&self) -> Option<LogId> {
        self.entries.back().map(|(e, _)| e.log_id())
    }

    /// Keeps the entries before `index` only.
    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|(e, _)| e.index() >= index) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Drops the entries at or below `index`.
    fn purge_to(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(e, _)| e.index() <= index)
        {
            if let Some((_, size)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }
}

/// Locks `m`, whose data stays consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The log store. Cheap to clone: replication tasks read through clones.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    segments: Segments,
    /// The newest entries, decoded.
    recent: Arc<Mutex<Recent>>,
    /// The last index the log thread wrote to the files.
    written: Arc<AtomicU64>,
    /// How far the local log is fsynced, for apply to wait on.
    durable: Arc<Durable>,
    /// The first index a read may return: the one after the last purged (entries at or below
    /// it may stay in a segment that also holds later ones, and are never read by Raft).
    first_readable: Arc<AtomicU64>,
    /// The first index records of the state machine may point into ([`LogEntries`]): a purge
    /// removes no segment holding it or anything after it.
    keep_from: Arc<AtomicU64>,
    /// The highest committed index this node knows of, for status and readiness.
    committed: Arc<AtomicU64>,
    /// The highest committed log id this node knows of, as saved for its next start.
    commit_hint: Arc<Mutex<CommitHint>>,
    /// Appends, truncations and purges, in order, to the log thread.
    flusher: Arc<Flusher>,
    /// What this node has had on disk, kept outside RocksDB (none in unit tests).
    watermark: Option<Arc<Watermark>>,
}

/// The highest log index known fsynced on this node, lowered by a truncation. Appends carry
/// the truncation epoch they were written in. A flush reported for an earlier epoch counts only
/// up to the lowest index kept by the truncations since: the entries above it were replaced, and
/// those put in their place are not durable because their predecessors at the same indexes were.
struct Durable {
    at: Mutex<DurableAt>,
    tx: watch::Sender<u64>,
}

struct DurableAt {
    index: u64,
    epoch: u64,
    /// The index each recent truncation kept, by the epoch it began (the last few only: a
    /// report older than all of them is not counted).
    kept: VecDeque<(u64, u64)>,
}

/// How many truncations [`Durable`] remembers.
const TRUNCATIONS_KEPT: usize = 16;

impl Durable {
    fn new(index: u64) -> Durable {
        Durable {
            at: Mutex::new(DurableAt {
                index,
                epoch: 0,
                kept: VecDeque::new(),
            }),
            tx: watch::Sender::new(index),
        }
    }

    fn at(&self) -> MutexGuard<'_, DurableAt> {
        lock(&self.at)
    }

    fn epoch(&self) -> u64 {
        self.at().epoch
    }

    fn flushed(&self, index: u64, epoch: u64) {
        let mut at = self.at();
        let counted = if epoch == at.epoch {
            Some(index)
        } else if at
            .kept
            .front()
            .is_some_and(|(began, _)| *began <= epoch + 1)
        {
            at.kept
                .iter()
                .filter(|(began, _)| *began > epoch)
                .map(|(_, kept)| *kept)
                .min()
                .map(|kept| kept.min(index))
        } else {
            None
        };
        if let Some(index) = counted.filter(|i| *i > at.index) {
            at.index = index;
            self.tx.send_replace(index);
        }
    }

    fn truncating(&self, keep: u64) {
        let mut at = self.at();
        at.epoch += 1;
        let began = at.epoch;
        at.kept.push_back((began, keep));
        if at.kept.len() > TRUNCATIONS_KEPT {
            at.kept.pop_front();
        }
        at.index = at.index.min(keep);
        self.tx.send_replace(at.index);
    }
}

/// One append: its entries' frames to write, then the fsync to wait for.
struct Queued {
    /// The entries, encoded.
    entries: Vec<(u64, Vec<u8>)>,
    /// openraft's callback (`None` when it was told early: the negative control build).
    callback: Option<IOFlushed<TypeConfig>>,
    /// When it was handed over.
    written: std::time::Instant,
    /// Its last log index, and the truncation epochs (the watermark's, the log's) when it was
    /// handed over.
    last_index: u64,
    epoch: u64,
    log_epoch: u64,
}

/// What the log thread does, in the order the store hands it over.
enum Op {
    Append(Queued),
    /// Removes the entries from this index on, durably.
    Truncate(u64, tokio::sync::oneshot::Sender<StorageResult<()>>),
    /// Removes the whole segments at or below this index.
    Purge(u64, tokio::sync::oneshot::Sender<StorageResult<()>>),
}

/// The log thread and the queue to it. Dropping the last handle closes the queue and waits for
/// the thread to end, so every append queued is written and synced before the drop returns.
struct Flusher {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What the thread works with; a follower's append takes it to write and sync in place
    /// when the thread has nothing to do ([`LogStore::append`]).
    state: Arc<Mutex<LogThread>>,
    /// Operations handed to the thread and not yet done.
    pending: Arc<AtomicU64>,
    /// This node's id, once known: appends of entries another leader made (this node is a
    /// follower) may be written and synced in place. 0: never.
    node_id: AtomicU64,
    /// [`IN_PLACE_FSYNC_MAX`] in microseconds (tests set another).
    in_place_fsync_max_us: AtomicU64,
}

/// Longest an fsync may have taken for the next follower append to be synced in place; after
/// a slower one the log thread syncs, so that a stalled disk stalls that thread only, not the
/// node's runtime, until an fsync is quick again.
const IN_PLACE_FSYNC_MAX: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether a follower's append that finds the log thread idle is written and synced in place,
/// given how long the last fsync took, how long ago it ended, and [`IN_PLACE_FSYNC_MAX`]. Not
/// after a slow fsync (above). Nor when the last fsync ended more recently than it took: an
/// append that comes in that soon came in behind it, while the runtime was held by it, and
/// more are likely on their way (the leader keeps several in flight); the log thread takes it,
/// and those that follow while it syncs share its next fsync instead of paying one each. One
/// append at a time, spaced by the round trip to the leader, stays in place.
fn sync_here(
    last_fsync: std::time::Duration,
    since_it_ended: Option<std::time::Duration>,
    max: std::time::Duration,
) -> bool {
    last_fsync <= max && since_it_ended.is_none_or(|since| since >= last_fsync)
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

/// The log thread: the writer of the segment files (but for a follower's appends written in
/// place while it is idle, holding its state: [`LogStore::sync_follower_appends_in_place`]).
/// It takes every operation queued,
/// writes the appends' frames, fdatasyncs the segment once (outside the segment log's lock, so
/// reads of older entries go on) and reports every append (to openraft, to the watermark, to
/// apply); a truncation or a purge first syncs and reports the appends queued before it. The
/// store's caller never waits for a file write: an entry is readable from memory
/// ([`Recent`]) from the moment it is handed over, and where a running fsync holds up writes
/// to its file (FUSE does), only this thread waits. After a failed write or sync every later
/// operation fails too: the kernel may have dropped the pages that failed, and a later sync that
/// succeeds would not bring them back. It ends when the last `LogStore` clone is dropped.
fn run_flusher(state: Arc<Mutex<LogThread>>, rx: mpsc::Receiver<Op>, pending: Arc<AtomicU64>) {
    while let Ok(first) = rx.recv() {
        // The negative control fsyncs on a timer, like a broker that flushes now and then; it
        // has told openraft "flushed" already (see `append`). It still writes each append to
        // the files as it comes, as such a broker does, so that a snapshot finds the entries it
        // links there.
        let early = cfg!(feature = "negative-control-unsafe-early-flush");
        let fsync_at = std::time::Instant::now() + NEGATIVE_CONTROL_FSYNC_EVERY;
        let more = std::iter::from_fn(|| {
            if !early {
                return rx.try_recv().ok();
            }
            let now = std::time::Instant::now();
            (now < fsync_at)
                .then(|| rx.recv_timeout(fsync_at - now).ok())
                .flatten()
        });
        let mut thread = lock(&state);
        let mut done = 0;
        for op in std::iter::once(first).chain(more) {
            done += 1;
            match op {
                Op::Append(q) => thread.write(q),
                Op::Truncate(from, reply) => {
                    thread.sync_and_report();
                    let result = thread.on_segments(|log| log.truncate_from(from));
                    thread
                        .written
                        .fetch_min(from.saturating_sub(1), Ordering::SeqCst);
                    let _ = reply.send(result);
                }
                Op::Purge(index, reply) => {
                    thread.sync_and_report();
                    let result = thread.on_segments(|log| log.purge_to(index).map(drop));
                    let _ = reply.send(result);
                }
            }
        }
        thread.sync_and_report();
        // Counted down while the state is still held: an append that finds nothing pending
        // and takes the state after this finds every operation before it done.
        pending.fetch_sub(done, Ordering::SeqCst);
    }
}

struct LogThread {
    segments: Segments,
    watermark: Option<Arc<Watermark>>,
    durable: Arc<Durable>,
    /// The last index written to the files (entries above it are in memory only).
    written: Arc<AtomicU64>,
    failed: Option<String>,
    /// Appends written, waiting for the sync.
    waiting: Vec<Queued>,
    fsync_seconds: metrics::Histogram,
    append_seconds: metrics::Histogram,
    fsyncs: metrics::Counter,
    /// How long the last fsync took, and when it ended.
    last_fsync: std::time::Duration,
    last_sync_end: Option<std::time::Instant>,
}

impl LogThread {
    /// Whether a follower's append found now is written and synced in place, as far as this
    /// state tells ([`sync_here`]; nothing waiting for a sync).
    fn takes_in_place(&self, max: std::time::Duration) -> bool {
        let since = self.last_sync_end.map(|end| end.elapsed());
        self.waiting.is_empty() && sync_here(self.last_fsync, since, max)
    }

    fn fail(&mut self, e: String) -> String {
        if self.failed.is_none() {
            tracing::error!("{e}; every later log write fails");
            self.failed = Some(e.clone());
        }
        e
    }

    fn on_segments(
        &mut self,
        f: impl FnOnce(&mut SegmentLog) -> Result<(), SegmentError>,
    ) -> StorageResult<()> {
        if let Some(e) = &self.failed {
            return Err(to_io(e));
        }
        let result = f(&mut lock(&self.segments)).map_err(|e| e.to_string());
        result.map_err(|e| to_io(self.fail(e)))
    }

    fn write(&mut self, mut q: Queued) {
        let entries = std::mem::take(&mut q.entries);
        let last = q.last_index;
        let result = self.on_segments(|log| {
            entries
                .iter()
                .try_for_each(|(index, bytes)| log.append(*index, bytes))
        });
        if result.is_ok() {
            self.written.store(last, Ordering::SeqCst);
        }
        self.waiting.push(q);
    }

    /// Syncs what was written and reports every append waiting for it.
    fn sync_and_report(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let result = match &self.failed {
            Some(e) => Err(e.clone()),
            None => {
                // Every append waiting was written before this, so the segment to sync taken
                // now covers all of them (earlier segments were synced when the next began).
                let target = lock(&self.segments).unsynced();
                match target {
                    None => Ok(()),
                    Some((file, path)) => file.sync_data().map_err(|e| {
                        self.fail(format!("syncing the log segment {}: {e}", path.display()))
                    }),
                }
            }
        };
        let done = std::time::Instant::now();
        self.last_fsync = done.duration_since(started);
        self.last_sync_end = Some(done);
        self.fsync_seconds.record(self.last_fsync.as_secs_f64());
        self.fsyncs.increment(1);
        for q in self.waiting.drain(..) {
            self.append_seconds
                .record(done.duration_since(q.written).as_secs_f64());
            if result.is_ok() {
                if let Some(w) = &self.watermark {
                    w.flushed(q.last_index, q.epoch);
                }
                self.durable.flushed(q.last_index, q.log_epoch);
            }
            if let Some(callback) = q.callback {
                callback.io_completed(result.clone().map_err(to_io));
            }
        }
    }
}

/// How often the negative control build fsyncs its log (it acknowledges before that).
const NEGATIVE_CONTROL_FSYNC_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

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

fn get_meta<T: serde::de::DeserializeOwned>(db: &DB, key: &[u8]) -> StorageResult<Option<T>> {
    let cf = db
        .cf_handle(CF_RAFT)
        .ok_or_else(|| to_io("column family raft missing"))?;
    match db.get_cf(cf, key).map_err(to_io)? {
        None => Ok(None),
        Some(bytes) => values::decode(&bytes)
            .map(Some)
            .map_err(|e| to_io(format!("corrupt raft metadata {key:?}: {e}"))),
    }
}

/// Opens the node's log in `dir` (see [`SegmentLog::open`]; `durable` is the highest index the
/// watermark says was fsynced), after moving the entries of a data directory of format 4 or
/// older out of RocksDB's `log` family ([`move_log_family`]). New segments are started at
/// [`DEFAULT_SEGMENT_BYTES`].
pub fn open_segments(db: &DB, dir: &Path, durable: u64) -> Result<SegmentLog, SegmentError> {
    open_segments_with(db, dir, durable, DEFAULT_SEGMENT_BYTES)
}

/// [`open_segments`], starting a new segment when the last reaches `segment_bytes`.
pub fn open_segments_with(
    db: &DB,
    dir: &Path,
    durable: u64,
    segment_bytes: u64,
) -> Result<SegmentLog, SegmentError> {
    let moved = move_log_family(db, dir)?;
    if moved > 0 {
        tracing::info!(
            entries = moved,
            "the Raft log moved from the database into segment files (data directory format 5)"
        );
    }
    let (log, recovery) = SegmentLog::open(dir, durable, segment_bytes)?;
    if recovery.cut_bytes > 0 {
        tracing::warn!(
            bytes = recovery.cut_bytes,
            "cut the torn tail of the log (writes never synced)"
        );
    }
    tracing::info!(
        segments = recovery.segments,
        entries = recovery.entries,
        "log segments checked"
    );
    Ok(log)
}

/// The upgrade to data directory format 5: copies the Raft log's entries from RocksDB's `log`
/// family into segment files in `dir`, then removes them from the family. Returns how many
/// entries moved (none when the family is empty, as it always is once upgraded).
///
/// Crash-safe at every step: the segments are written in a directory beside `dir`, synced, and
/// renamed into place; the family's entries are removed, synced, only after that. The family is
/// the source until it is empty, so a family that still holds entries means an upgrade that did
/// not finish: whatever `dir` holds then is a copy and is made again.
pub fn move_log_family(db: &DB, dir: &Path) -> Result<u64, SegmentError> {
    let db_err = |e: rocksdb::Error| SegmentError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    let io = |source: std::io::Error| SegmentError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let cf = db
        .cf_handle(CF_LOG)
        .ok_or_else(|| io(std::io::Error::other("column family log missing")))?;
    if db.iterator_cf(cf, IteratorMode::Start).next().is_none() {
        return Ok(0);
    }
    let staging = dir.with_extension("upgrade");
    for leftover in [&staging, &dir.to_path_buf()] {
        if leftover.exists() {
            fs::remove_dir_all(leftover).map_err(io)?;
        }
    }
    let (mut log, _) = SegmentLog::open(&staging, u64::MAX, DEFAULT_SEGMENT_BYTES)?;
    let mut moved = 0u64;
    for item in db.iterator_cf(cf, IteratorMode::Start) {
        let (key, value) = item.map_err(db_err)?;
        let index = parse_index(&key).map_err(io)?;
        // Checked as the log would be read: a damaged entry fails the upgrade, not a later read.
        let entry = decode_entry(&value).map_err(io)?;
        if entry.index() != index {
            return Err(io(to_io(format!(
                "log key {index} holds entry {}",
                entry.log_id()
            ))));
        }
        log.append(index, &value)?;
        moved += 1;
    }
    log.sync()?;
    drop(log);
    fs::rename(&staging, dir).map_err(io)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(io)?;
    }
    let mut batch = WriteBatch::default();
    batch.delete_range_cf(cf, [0u8; 8], [0xffu8; 8]);
    batch.delete_cf(cf, [0xffu8; 8]);
    db.write_opt(batch, &super::write_options(true))
        .map_err(db_err)?;
    db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
    Ok(moved)
}

/// What a store holds, to compare with its watermark: the last log index (of an entry, or
/// the last purged one when the log is empty behind a snapshot) and the vote's term. A log
/// that starts after the entry following the last purged one has lost entries: an error.
pub fn stored_marks(db: &DB, log: &SegmentLog) -> StorageResult<Marks> {
    // Stored as a plain log id by `purge` (and by a restore), absent before the first purge.
    let last_purged: Option<LogId> = get_meta(db, keys::LAST_PURGED)?;
    let vote: Option<Vote> = get_meta(db, keys::VOTE)?;
    let purged = last_purged.map(|l| l.index);
    let last_entry = log.last_index().filter(|last| purged < Some(*last));
    if let (Some(first), Some(_)) = (log.first_index(), last_entry) {
        // Entries start at index 0 or 1 when nothing was purged.
        let expected = purged.map_or(1, |p| p + 1);
        if first > expected {
            return Err(to_io(format!(
                "the log starts at index {first}, but the entries before it were never purged \
                 (the last purged index is {})",
                purged.map_or("none".to_string(), |p| p.to_string())
            )));
        }
    }
    // Entries Raft purged but the state machine's records point into stay in the files, from
    // the one after the segments' purge point up to Raft's.
    if let (Some(files), Some(purged)) = (get_meta::<u64>(db, keys::FILES_PURGED)?, purged) {
        let (first, last) = (log.first_index(), log.last_index());
        if files < purged && (first.is_none_or(|f| f > files + 1) || last < Some(purged)) {
            return Err(to_io(format!(
                "the log holds {}, but records point into every entry from index {} (Raft \
                 purged up to {purged})",
                match (first, last) {
                    (Some(f), Some(l)) => format!("entries {f} to {l}"),
                    _ => "no entries".to_string(),
                },
                files + 1
            )));
        }
    }
    Ok(Marks {
        log_index: last_entry.or(purged).unwrap_or(0),
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

/// Up to where the log's segments were removed: [`keys::FILES_PURGED`], or the last purged
/// index (`last_purged`, when given) in a store that has never kept entries for records.
fn files_purged(db: &DB, last_purged: Option<LogId>) -> StorageResult<Option<u64>> {
    Ok(get_meta::<u64>(db, keys::FILES_PURGED)?.or(last_purged.map(|l| l.index)))
}

/// The log's entries as the state machine reads the records it points into: from memory or
/// from the files, including entries Raft has purged but the records still need.
#[derive(Clone)]
pub struct LogEntries {
    segments: Segments,
    recent: Arc<Mutex<Recent>>,
    keep_from: Arc<AtomicU64>,
}

impl super::records::EntrySource for LogEntries {
    fn entry(&self, index: u64) -> Result<Entry, String> {
        {
            let recent = lock(&self.recent);
            if let Some(first) = recent.first_index().filter(|first| *first <= index) {
                if let Some((entry, _)) = recent.entries.get((index - first) as usize) {
                    return Ok(entry.clone());
                }
            }
        }
        // Not in memory: written, so in the files (an entry leaves memory only once written).
        let bytes = lock(&self.segments)
            .read(index)
            .map_err(|e| format!("reading log entry {index}: {e}"))?
            .ok_or_else(|| format!("log entry {index} is not in the log"))?;
        let entry = decode_entry(&bytes).map_err(|e| e.to_string())?;
        if entry.index() != index {
            return Err(format!("log entry {index} holds entry {}", entry.log_id()));
        }
        Ok(entry)
    }
}

impl super::records::Entries for LogEntries {
    fn keep_from(&self, index: u64) {
        self.keep_from.fetch_max(index, Ordering::SeqCst);
    }

    fn link_segments(&self, first: u64, last: u64, into: &Path) -> Result<(), String> {
        // Under the segment log's lock: no file is created or removed meanwhile. Entries up
        // to `last` are durable (a snapshot's are applied), so in the files, not only in memory.
        lock(&self.segments)
            .link_range(first, last, into)
            .map(|_| ())
            .map_err(|e| format!("linking log entries {first} to {last}: {e}"))
    }

    fn first_stored(&self) -> Option<u64> {
        lock(&self.segments).first_index()
    }
}

impl LogStore {
    /// Opens the log store on `db` (the Raft metadata) and `log` (the entries) and starts its
    /// log thread.
    pub fn new(db: Arc<DB>, log: SegmentLog) -> std::io::Result<Self> {
        Self::start(db, log, None)
    }

    /// [`new`](Self::new), keeping `watermark` up to date with every fsync, vote and
    /// truncation.
    pub fn with_watermark(
        db: Arc<DB>,
        log: SegmentLog,
        watermark: Arc<Watermark>,
    ) -> std::io::Result<Self> {
        Self::start(db, log, Some(watermark))
    }

    fn start(
        db: Arc<DB>,
        mut log: SegmentLog,
        watermark: Option<Arc<Watermark>>,
    ) -> std::io::Result<Self> {
        let last_purged: Option<LogId> = get_meta(&db, keys::LAST_PURGED)?;
        // Finishes a purge a crash interrupted: it was recorded before its segments went.
        if let Some(files) = files_purged(&db, last_purged)? {
            log.purge_to(files).map_err(to_io)?;
        }
        // Everything the log holds once open is durable (the open synced it).
        let durable = Arc::new(Durable::new(
            log.last_index()
                .max(last_purged.map(|l| l.index))
                .unwrap_or(0),
        ));
        let written = Arc::new(AtomicU64::new(log.last_index().unwrap_or(0)));
        let mut commit_hint = CommitHint::open(log.dir())?;
        // A directory from before the hint's file has the commit index in RocksDB.
        let committed_key: Option<LogId> =
            get_meta::<Option<LogId>>(&db, keys::COMMITTED)?.flatten();
        if committed_key > commit_hint.get() {
            commit_hint.set(committed_key)?;
        }
        let segments = Arc::new(Mutex::new(log));
        let (tx, rx) = mpsc::channel();
        let state = Arc::new(Mutex::new(LogThread {
            segments: segments.clone(),
            watermark: watermark.clone(),
            durable: durable.clone(),
            written: written.clone(),
            failed: None,
            waiting: Vec::new(),
            fsync_seconds: metrics::histogram!("raftq_log_fsync_seconds"),
            append_seconds: metrics::histogram!("raftq_log_append_seconds"),
            fsyncs: metrics::counter!("raftq_log_fsyncs_total"),
            last_fsync: std::time::Duration::ZERO,
            last_sync_end: None,
        }));
        let pending = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new()
            .name("raftq-log-flush".into())
            .spawn({
                let (state, pending) = (state.clone(), pending.clone());
                move || run_flusher(state, rx, pending)
            })?;
        let store = LogStore {
            db,
            segments,
            recent: Arc::default(),
            written,
            durable,
            first_readable: Arc::new(AtomicU64::new(last_purged.map_or(0, |l| l.index + 1))),
            // No state machine reads records from this log until `for_records`.
            keep_from: Arc::new(AtomicU64::new(u64::MAX)),
            committed: Arc::new(AtomicU64::new(commit_hint.get().map_or(0, |c| c.index))),
            commit_hint: Arc::new(Mutex::new(commit_hint)),
            flusher: Arc::new(Flusher {
                tx: Some(tx),
                thread: Some(thread),
                state,
                pending,
                node_id: AtomicU64::new(0),
                in_place_fsync_max_us: AtomicU64::new(IN_PLACE_FSYNC_MAX.as_micros() as u64),
            }),
            watermark,
        };
        Ok(store)
    }

    /// Tells the store this node's id, so that a follower's appends (entries another leader
    /// made) are written and synced by the caller itself when the log thread is idle, which
    /// saves two thread hand-offs on the path of every commit: the follower's answer is what
    /// the leader waits for. A leader's appends always go to the log thread, so that
    /// replication starts while its own fsync runs.
    pub fn sync_follower_appends_in_place(&self, node_id: u64) {
        self.flusher.node_id.store(node_id, Ordering::SeqCst);
    }

    /// Sets the longest an fsync may have taken for the next follower append to be synced in
    /// place ([`IN_PLACE_FSYNC_MAX`]): a test's disk may be slow at any moment.
    #[cfg(test)]
    pub(crate) fn set_in_place_fsync_max(&self, max: std::time::Duration) {
        self.flusher
            .in_place_fsync_max_us
            .store(max.as_micros() as u64, Ordering::SeqCst);
    }

    /// Whether a follower's append made now is written in place: the log thread has nothing
    /// queued and is not holding its state, which takes it in place
    /// ([`LogThread::takes_in_place`]). The thread reports an append flushed a moment before it
    /// lets go of its state.
    #[cfg(test)]
    pub(crate) fn log_thread_idle(&self) -> bool {
        self.flusher.pending.load(Ordering::SeqCst) == 0
            && self
                .flusher
                .state
                .try_lock()
                .is_ok_and(|thread| thread.takes_in_place(self.in_place_fsync_max()))
    }

    /// [`IN_PLACE_FSYNC_MAX`], or what a test set instead.
    fn in_place_fsync_max(&self) -> std::time::Duration {
        let us = self.flusher.in_place_fsync_max_us.load(Ordering::Relaxed);
        std::time::Duration::from_micros(us)
    }

    /// The first index a read of this log returns (one past the last purged), as purges move
    /// it. Replication checks the requests it sends against it ([`crate::raft::network`]).
    pub fn first_readable(&self) -> Arc<AtomicU64> {
        self.first_readable.clone()
    }

    /// Shared view of the committed index, updated as Raft reports it.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// The entries as the state machine reads records from them. From the first call on, a
    /// purge keeps every entry until the state machine says how far back its records point
    /// ([`super::records::Entries::keep_from`]); before it, a purge removes all it may.
    pub fn for_records(&self) -> LogEntries {
        let _ = self
            .keep_from
            .compare_exchange(u64::MAX, 0, Ordering::SeqCst, Ordering::SeqCst);
        LogEntries {
            segments: self.segments.clone(),
            recent: self.recent.clone(),
            keep_from: self.keep_from.clone(),
        }
    }

    /// The highest log index fsynced on this node, as it moves (a truncation lowers it).
    pub fn durable(&self) -> watch::Receiver<u64> {
        self.durable.tx.subscribe()
    }

    fn cf(&self, name: &str) -> StorageResult<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| to_io(format!("column family {name} missing")))
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        get_meta(&self.db, key)
    }

    fn segments(&self) -> MutexGuard<'_, SegmentLog> {
        lock(&self.segments)
    }

    fn recent(&self) -> MutexGuard<'_, Recent> {
        lock(&self.recent)
    }

    fn send(&self, op: Op) -> StorageResult<()> {
        self.flusher.pending.fetch_add(1, Ordering::SeqCst);
        let sent = self.flusher.tx.as_ref().and_then(|tx| tx.send(op).ok());
        sent.ok_or_else(|| {
            self.flusher.pending.fetch_sub(1, Ordering::SeqCst);
            to_io("the log thread has stopped")
        })
    }

    /// Writes and syncs `q` here, as the log thread would, if this node is a follower (every
    /// entry was made by another leader, as its node id tells), the thread has nothing pending
    /// and the last fsync was quick and did not end just now ([`sync_here`]). Gives `q` back
    /// otherwise.
    fn sync_in_place(&self, q: Queued, from_another_leader: bool) -> Option<Queued> {
        // The negative control syncs on its timer only: it must stay the broker that
        // acknowledges what it has not synced, on followers too.
        let unsafe_build = cfg!(feature = "negative-control-unsafe-early-flush");
        if unsafe_build || !from_another_leader {
            return Some(q);
        }
        if self.flusher.pending.load(Ordering::SeqCst) != 0 {
            return Some(q);
        }
        let Ok(mut thread) = self.flusher.state.try_lock() else {
            return Some(q);
        };
        if !thread.takes_in_place(self.in_place_fsync_max()) {
            return Some(q);
        }
        thread.write(q);
        thread.sync_and_report();
        None
    }

    /// Hands `op` (a truncation or a purge) to the log thread, behind every append queued, and
    /// waits until it is done.
    async fn run_on_log_thread(
        &self,
        op: impl FnOnce(tokio::sync::oneshot::Sender<StorageResult<()>>) -> Op,
    ) -> StorageResult<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(op(tx))?;
        rx.await
            .unwrap_or_else(|_| Err(to_io("the log thread stopped before it was done")))
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

    /// The last purged log id, and the log's end: its last entry, or the purge point when no
    /// entry follows it (entries at or below the purge point may stay for the records that
    /// point into them).
    fn purged_and_end(&self) -> StorageResult<(Option<LogId>, Option<LogId>)> {
        let last_purged: Option<LogId> = self.get_meta(keys::LAST_PURGED)?;
        Ok((last_purged, self.last_entry_id()?.max(last_purged)))
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId>> {
        if let Some(last) = self.recent().last_id() {
            return Ok(Some(last));
        }
        let bytes = {
            let log = self.segments();
            match log.last_index() {
                None => return Ok(None),
                Some(last) => log.read(last).map_err(to_io)?,
            }
        };
        bytes
            .map(|b| decode_entry(&b).map(|e| e.log_id()))
            .transpose()
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
        let start = start.max(self.first_readable.load(Ordering::SeqCst));
        // The newest entries from memory; what comes before them from the files.
        let (cached_from, cached) = {
            let recent = self.recent();
            let from = recent.first_index().unwrap_or(u64::MAX);
            // Found by search, not by walking: memory holds up to `RECENT_BYTES` of entries
            // (some 16,000 of one small record each), and replication reads here for every
            // request it sends.
            let at = recent.entries.partition_point(|(e, _)| e.index() < start);
            let cached: Vec<Entry> = recent
                .entries
                .range(at..)
                .map(|(e, _)| e)
                .take_while(|e| range.contains(&e.index()))
                .cloned()
                .collect();
            (from, cached)
        };
        if start >= cached_from {
            return Ok(cached);
        }
        // The bytes are read under the lock, and decoded after it is released.
        let found = {
            let log = self.segments();
            let (Some(first), Some(last)) = (log.first_index(), log.last_index()) else {
                return Ok(cached);
            };
            let mut found = Vec::new();
            for index in start.max(first)..=last.min(cached_from.saturating_sub(1)) {
                if !range.contains(&index) {
                    break;
                }
                let bytes = log
                    .read(index)
                    .map_err(to_io)?
                    .ok_or_else(|| to_io(format!("log entry {index} is missing")))?;
                found.push((index, bytes));
            }
            found
        };
        let mut out = found
            .into_iter()
            .map(|(index, bytes)| {
                let entry = decode_entry(&bytes)?;
                if entry.index() != index {
                    return Err(to_io(format!(
                        "log entry {index} holds entry {}",
                        entry.log_id()
                    )));
                }
                Ok(entry)
            })
            .collect::<StorageResult<Vec<_>>>()?;
        out.extend(cached);
        Ok(out)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.get_meta(keys::VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let (last_purged, end) = self.purged_and_end()?;
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: end,
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
        lock(&self.commit_hint).set(committed).map_err(to_io)
    }

    /// The commit index saved, but never beyond the log's end. A follower learns that entries
    /// are committed (by a majority that need not include it) as soon as it has received
    /// them, before its own log has written them; a crash, or a disk that fills up, can then
    /// leave a saved commit index past the entries the log holds. openraft applies again up to
    /// it at start and cannot read what is not there, so start-up would fail; what the log lost
    /// was never acknowledged by this node, and the leader sends it again.
    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        let Some(committed) = lock(&self.commit_hint).get() else {
            return Ok(None);
        };
        let (_, end) = self.purged_and_end()?;
        Ok(match end {
            Some(end) if end.index < committed.index => {
                tracing::info!(
                    committed = committed.index,
                    log_end = end.index,
                    "the saved commit index is past the log's end (entries received but not \
                     written before the node stopped); starting from the log's end"
                );
                Some(end)
            }
            Some(_) => Some(committed),
            None => None,
        })
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = std::time::Instant::now();
        let entries: Vec<Entry> = entries.into_iter().collect();
        let me = self.flusher.node_id.load(Ordering::SeqCst);
        let from_another_leader =
            me != 0 && entries.iter().all(|e| e.log_id.leader_id.node_id != me);
        let encoded = entries
            .iter()
            .map(|entry| Ok((entry.index(), encode_entry(entry)?)))
            .collect::<StorageResult<Vec<_>>>()?;
        let Some(last_index) = encoded.last().map(|(index, _)| *index) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        if let Some(failure) = self.watermark.as_ref().and_then(|w| w.failure()) {
            return Err(to_io(failure));
        }
        let epoch = self.watermark.as_ref().map_or(0, |w| w.epoch());
        let log_epoch = self.durable.epoch();
        // Readable from memory at once; the log thread writes it to the files, and it is
        // durable once that thread has synced the segment, which is when openraft hears that it
        // is flushed.
        {
            let written = self.written.load(Ordering::SeqCst);
            let mut recent = self.recent();
            for (entry, (_, bytes)) in entries.into_iter().zip(&encoded) {
                recent.push(entry, bytes.len(), written);
            }
        }
        let callback = if cfg!(feature = "negative-control-unsafe-early-flush") {
            // The negative control: "flushed" before the fsync, and applied as if it were.
            // Acknowledged records are lost when every node loses power at once; the chaos
            // suite must see that.
            callback.io_completed(Ok(()));
            self.durable.flushed(last_index, log_epoch);
            None
        } else {
            Some(callback)
        };
        let q = Queued {
            entries: encoded,
            callback,
            written,
            last_index,
            epoch,
            log_epoch,
        };
        match self.sync_in_place(q, from_another_leader) {
            None => Ok(()),
            Some(q) => self.send(Op::Append(q)),
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> StorageResult<()> {
        let from = last_log_id.map_or(0, |l| l.index + 1);
        let keep = last_log_id.map_or(0, |l| l.index);
        // The watermarks first: they must never claim entries that are removed on purpose, nor
        // count the entries appended in their place as durable before they are synced.
        if let Some(w) = self.watermark.clone() {
            tokio::task::spawn_blocking(move || w.truncating(keep))
                .await
                .map_err(to_io)??;
        }
        self.durable.truncating(keep);
        self.recent().truncate_from(from);
        self.run_on_log_thread(|done| Op::Truncate(from, done))
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        // Raft no longer reads at or below `log_id`; the segments go only up to where the
        // state machine's records still point (`keep_from`), and never go back.
        let keep_from = self.keep_from.load(Ordering::SeqCst);
        let files = log_id.index.min(keep_from.saturating_sub(1));
        let files = files_purged(&self.db, None)?.map_or(files, |before| files.max(before));
        // The purge point is recorded, synced, before any segment goes: a crash in between
        // leaves entries at or below it, which the next start removes, never a hole.
        let mut batch = WriteBatch::default();
        let bytes = values::encode(&log_id).map_err(to_io)?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::LAST_PURGED, bytes);
        let bytes = values::encode(&files).map_err(to_io)?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::FILES_PURGED, bytes);
        self.write_synced(batch).await?;
        self.first_readable
            .fetch_max(log_id.index + 1, Ordering::SeqCst);
        self.recent().purge_to(log_id.index);
        self.run_on_log_thread(|done| Op::Purge(files, done)).await
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
