//! The Raft log and Raft metadata on RocksDB.
//!
//! Durability rules (DESIGN.md): an append is reported flushed only after a synced write
//! batch (the WAL is fsynced); the vote is saved with sync before `save_vote` returns; the
//! last purged log id is written in the same synced batch that deletes the entries it covers,
//! so a crash can never leave a hole between "purged" and "present". Every write goes through
//! one blocking thread at a time (openraft serializes log I/O), off the async runtime.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};

use super::{keys, CF_LOG, CF_RAFT};
use crate::codec;
use crate::raft::{io_err, Entry, LogId, StorageResult, TypeConfig, Vote};

/// Version byte in front of every stored log entry.
const ENTRY_FORMAT: u8 = 1;

/// The log store. Cheap to clone: replication tasks read through clones.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    /// The highest committed index this node knows of, for status and readiness.
    committed: Arc<AtomicU64>,
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn parse_index(key: &[u8]) -> StorageResult<u64> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| {
        io_err(
            StorageIOError::read_logs,
            format!("bad log key of {} bytes", key.len()),
        )
    })?;
    Ok(u64::from_be_bytes(bytes))
}

fn encode_entry(entry: &Entry) -> StorageResult<Vec<u8>> {
    let mut out = vec![ENTRY_FORMAT];
    out.extend(codec::encode(entry).map_err(|e| io_err(StorageIOError::write_logs, e))?);
    Ok(out)
}

fn decode_entry(bytes: &[u8]) -> StorageResult<Entry> {
    match bytes.split_first() {
        Some((&ENTRY_FORMAT, rest)) => codec::decode(rest)
            .map_err(|e| io_err(StorageIOError::read_logs, format!("corrupt log entry: {e}"))),
        Some((v, _)) => Err(io_err(
            StorageIOError::read_logs,
            format!(
                "log entry has unknown format version {v}; this raftq is too old for this data"
            ),
        )),
        None => Err(io_err(StorageIOError::read_logs, "empty log entry")),
    }
}

impl LogStore {
    pub fn new(db: Arc<DB>) -> Self {
        let store = LogStore {
            db,
            committed: Arc::new(AtomicU64::new(0)),
        };
        if let Ok(Some(Some(c))) = store.get_meta::<Option<LogId>>(keys::COMMITTED) {
            store.committed.store(c.index, Ordering::Relaxed);
        }
        store
    }

    /// Shared view of the committed index, updated as Raft reports it.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn cf(&self, name: &str) -> StorageResult<&rocksdb::ColumnFamily> {
        self.db.cf_handle(name).ok_or_else(|| {
            io_err(
                StorageIOError::read,
                format!("column family {name} missing"),
            )
        })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StorageResult<Option<T>> {
        let cf = self.cf(CF_RAFT)?;
        match self
            .db
            .get_cf(cf, key)
            .map_err(|e| io_err(StorageIOError::read, e))?
        {
            None => Ok(None),
            Some(bytes) => codec::decode(&bytes).map(Some).map_err(|e| {
                io_err(
                    StorageIOError::read,
                    format!("corrupt raft metadata {key:?}: {e}"),
                )
            }),
        }
    }

    /// Runs a blocking RocksDB write off the async runtime.
    async fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), String> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.write_opt(batch, &super::write_options(sync))
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|join| Err(format!("write task failed: {join}")))
    }

    fn last_entry_id(&self) -> StorageResult<Option<LogId>> {
        let cf = self.cf(CF_LOG)?;
        let mut it = self.db.iterator_cf(cf, IteratorMode::End);
        match it.next() {
            None => Ok(None),
            Some(Err(e)) => Err(io_err(StorageIOError::read_logs, e)),
            Some(Ok((_, v))) => Ok(Some(*decode_entry(&v)?.get_log_id())),
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
            let (k, v) = item.map_err(|e| io_err(StorageIOError::read_logs, e))?;
            let index = parse_index(&k)?;
            if !range.contains(&index) {
                break;
            }
            let entry = decode_entry(&v)?;
            if entry.get_log_id().index != index {
                return Err(io_err(
                    StorageIOError::read_logs,
                    format!("log key {index} holds entry {}", entry.get_log_id()),
                ));
            }
            out.push(entry);
        }
        Ok(out)
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
        let bytes = codec::encode(vote).map_err(|e| io_err(StorageIOError::write_vote, e))?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::VOTE, bytes);
        self.write(batch, true)
            .await
            .map_err(|e| io_err(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        self.get_meta(keys::VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StorageResult<()> {
        // Not synced: losing it on a crash only means re-learning the commit index from the
        // leader; it never makes the node claim more than was committed.
        if let Some(c) = committed {
            self.committed.fetch_max(c.index, Ordering::Relaxed);
        }
        let mut batch = WriteBatch::default();
        let bytes = codec::encode(&committed).map_err(|e| io_err(StorageIOError::write, e))?;
        batch.put_cf(self.cf(CF_RAFT)?, keys::COMMITTED, bytes);
        self.write(batch, false)
            .await
            .map_err(|e| io_err(StorageIOError::write, e))
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId>> {
        Ok(self.get_meta::<Option<LogId>>(keys::COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        {
            let cf = self.cf(CF_LOG)?;
            for entry in entries {
                batch.put_cf(
                    cf,
                    index_key(entry.get_log_id().index),
                    encode_entry(&entry)?,
                );
            }
        }
        // One synced batch: every entry of this append shares one fsync (group commit).
        match self.write(batch, true).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(crate::raft::to_io(&e)));
                Err(StorageIOError::new(
                    ErrorSubject::Logs,
                    ErrorVerb::Write,
                    openraft::AnyError::error(e),
                )
                .into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> StorageResult<()> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            self.cf(CF_LOG)?,
            index_key(log_id.index),
            index_key(u64::MAX),
        );
        // The last index (u64::MAX) is not covered by the exclusive range end; it can never be used.
        self.write(batch, true)
            .await
            .map_err(|e| io_err(StorageIOError::write_logs, e))
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        let mut batch = WriteBatch::default();
        let bytes = codec::encode(&log_id).map_err(|e| io_err(StorageIOError::write_logs, e))?;
        // Recording the purge point and deleting what it covers in one synced batch: a crash
        // leaves both or neither.
        batch.put_cf(self.cf(CF_RAFT)?, keys::LAST_PURGED, bytes);
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(0), index_key(log_id.index + 1));
        self.write(batch, true)
            .await
            .map_err(|e| io_err(StorageIOError::write_logs, e))
    }
}
