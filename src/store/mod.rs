//! Durable storage: the Raft log in segment files of our own (`segments`, through
//! `log::LogStore`), and one RocksDB instance per node with three column families.
//!
//! - `log`: empty since data directory format 5 (the Raft log's entries moved to segment files;
//!   `log::move_log_family` moves an older directory's). Kept so that older stores open.
//! - `raft`: Raft metadata: the vote, the last purged log id, and the record that every value
//!   carries a format byte (`values`). The committed log id was kept here until it moved to a
//!   file of its own (`commit_hint`); the key is still read, and a restore from a backup
//!   writes it.
//! - `sm`: the state machine: topic metadata, records, applied log id, membership, clock.
//!
//! The state machine's applies skip RocksDB's WAL: the Raft log is its log. They reach disk when
//! a memtable is flushed, and apply waits until the local log is fsynced up to what it applies
//! (`sm::StateMachineStore::apply`), so the state on disk is never ahead of the log, and
//! start-up applies again whatever the state machine had not flushed. Architecture invariant:
//! nothing outside this module touches RocksDB or the segment files.

// openraft's `StorageError` is large, and it is the error type its storage traits require.
#![allow(clippy::result_large_err)]

pub mod backup;
pub mod commit_hint;
pub mod datadir;
pub mod faults;
pub mod log;
pub mod records;
pub mod segments;
pub mod slots;
pub mod sm;
pub mod snapshot;
pub mod subs;
pub mod transfer;
pub mod values;
pub mod watermark;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod formats;

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, WriteOptions, DB};

pub use datadir::DataDir;
pub use log::LogStore;
pub use sm::{SmShared, SmView, StateMachineStore};

/// The Raft instance of a node: openraft over this log store and state machine.
pub type Raft = openraft::Raft<crate::raft::TypeConfig, StateMachineStore>;

pub const CF_LOG: &str = "log";
pub const CF_RAFT: &str = "raft";
pub const CF_SM: &str = "sm";

/// Options for every RocksDB write: `sync` fsyncs the WAL before the write returns.
pub fn write_options(sync: bool) -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(sync);
    w
}

/// Options for the state machine's apply batches: not in the WAL. The Raft log is the state
/// machine's log: every applied entry is in it, fsynced before it is applied, and start-up
/// applies again whatever the state machine had not flushed to its table files (see `sm.rs`).
/// So each applied byte reaches the disk when its memtable is flushed, not a second time
/// through the WAL.
pub fn apply_write_options() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.disable_wal(true);
    w
}

/// Default memtable size per column family.
pub const DEFAULT_WRITE_BUFFER_BYTES: u64 = 64 << 20;

/// Opens (creating if needed) the node's database at `path` with default sizes.
pub fn open_db(path: &Path) -> Result<Arc<DB>, rocksdb::Error> {
    open_db_with(path, DEFAULT_WRITE_BUFFER_BYTES)
}

/// Opens (creating if needed) the node's database at `path`, with memtables of
/// `write_buffer_bytes` per column family and the write-ahead log bounded at four times that
/// (reaching it flushes the memtables holding the oldest log data).
pub fn open_db_with(path: &Path, write_buffer_bytes: u64) -> Result<Arc<DB>, rocksdb::Error> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // An incomplete record at the end of the WAL (a write torn by a crash, which was never
    // acknowledged) is dropped; any other damage (a checksum mismatch anywhere, a record cut in
    // the middle) refuses to open. PointInTime would open after dropping everything from the
    // first bad record on: entries this node fsynced and acknowledged, forgotten in silence.
    opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
    // The sizes of closed, synced WAL files are recorded in the MANIFEST and checked at open:
    // a WAL that is missing or shorter than it was is refused.
    opts.set_track_and_verify_wals_in_manifest(true);
    // Checksums verified on every read, files checked at open, a background error stops writes.
    opts.set_paranoid_checks(true);
    opts.set_max_background_jobs(2);
    let buffer = write_buffer_bytes as usize;
    opts.set_write_buffer_size(buffer);
    opts.set_max_total_wal_size(4 * write_buffer_bytes);
    let cfs = [CF_LOG, CF_RAFT, CF_SM].map(|name| {
        let mut cf = Options::default();
        cf.set_write_buffer_size(buffer);
        ColumnFamilyDescriptor::new(name, cf)
    });
    let db = DB::open_cf_descriptors(&opts, path, cfs)?;
    let rewritten = values::upgrade(&db)?;
    if rewritten > 0 {
        tracing::info!(
            values = rewritten,
            "the store's Raft and state metadata now carry a format byte (data directory format 2 to 3)"
        );
    }
    Ok(Arc::new(db))
}

/// Reads every entry of every column family once, so that RocksDB checks the checksum of
/// every block of every table file: opening checks only the files' sizes and footers, and a
/// flipped byte in a data block would otherwise surface only when that block is read (in
/// apply, or in a snapshot), long after the node went back to voting. Costs one sequential
/// read of the store, bypassing the block cache. Returns the bytes read.
pub fn verify_tables(db: &DB) -> Result<u64, rocksdb::Error> {
    let mut bytes = 0u64;
    for name in [CF_LOG, CF_RAFT, CF_SM] {
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        let mut read = rocksdb::ReadOptions::default();
        read.set_verify_checksums(true);
        read.fill_cache(false);
        read.set_readahead_size(2 << 20);
        let mut it = db.raw_iterator_cf_opt(&cf, read);
        it.seek_to_first();
        while it.valid() {
            bytes += it.key().map_or(0, <[u8]>::len) as u64;
            bytes += it.value().map_or(0, <[u8]>::len) as u64;
            it.next();
        }
        it.status()?;
    }
    Ok(bytes)
}

/// Keys of the `sm` column family. One-byte prefixes keep families of keys apart and sorted.
pub mod keys {
    /// Applied log id.
    pub const APPLIED: &[u8] = b"m:applied";
    /// Last applied membership.
    pub const MEMBERSHIP: &[u8] = b"m:membership";
    /// Clock and id counters of [`crate::state::SmState`].
    pub const SM_META: &[u8] = b"m:state";
    /// Present only while a snapshot is being loaded into the family: the snapshot's file
    /// name. Found at start-up, it means the family is half-loaded (see `snapshot::load_into`).
    pub const INSTALLING: &[u8] = b"m:installing";
    /// First key of the topic family.
    pub const TOPIC_PREFIX: u8 = b't';
    /// First key of the record family.
    pub const RECORD_PREFIX: u8 = b'r';
    /// First key of the subscription family.
    pub const SUB_PREFIX: u8 = b's';

    /// `p` + topic id (big endian) + producer id: one idempotent producer of a topic.
    pub const PRODUCER_PREFIX: u8 = b'p';

    pub fn producer(topic_id: u64, producer_id: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + producer_id.len());
        k.push(PRODUCER_PREFIX);
        k.extend_from_slice(&topic_id.to_be_bytes());
        k.extend_from_slice(producer_id.as_bytes());
        k
    }

    /// The key range of every producer of topic `topic_id`.
    pub fn producers_of(topic_id: u64) -> ([u8; 9], [u8; 9]) {
        let mut start = [0u8; 9];
        start[0] = PRODUCER_PREFIX;
        start[1..].copy_from_slice(&topic_id.to_be_bytes());
        let mut end = start;
        end[1..].copy_from_slice(&(topic_id + 1).to_be_bytes());
        (start, end)
    }

    pub fn parse_producer(key: &[u8]) -> Option<(u64, String)> {
        if key.len() < 10 || key[0] != PRODUCER_PREFIX {
            return None;
        }
        let id = u64::from_be_bytes(key[1..9].try_into().ok()?);
        let producer = String::from_utf8(key[9..].to_vec()).ok()?;
        Some((id, producer))
    }

    pub fn sub(id: u64) -> [u8; 9] {
        let mut k = [0u8; 9];
        k[0] = SUB_PREFIX;
        k[1..9].copy_from_slice(&id.to_be_bytes());
        k
    }

    pub fn topic(name: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(1 + name.len());
        k.push(TOPIC_PREFIX);
        k.extend_from_slice(name.as_bytes());
        k
    }

    pub fn record(topic_id: u64, offset: u64) -> [u8; 17] {
        let mut k = [0u8; 17];
        k[0] = RECORD_PREFIX;
        k[1..9].copy_from_slice(&topic_id.to_be_bytes());
        k[9..17].copy_from_slice(&offset.to_be_bytes());
        k
    }

    /// Splits a record key into (topic id, offset).
    pub fn parse_record(key: &[u8]) -> Option<(u64, u64)> {
        if key.len() != 17 || key[0] != RECORD_PREFIX {
            return None;
        }
        let id = u64::from_be_bytes(key[1..9].try_into().ok()?);
        let off = u64::from_be_bytes(key[9..17].try_into().ok()?);
        Some((id, off))
    }

    /// Raft metadata keys (`raft` column family).
    pub const VOTE: &[u8] = b"vote";
    pub const COMMITTED: &[u8] = b"committed";
    pub const LAST_PURGED: &[u8] = b"last_purged";
    /// The index up to which the log's segments were removed: at or below `LAST_PURGED`, lower
    /// while records point into entries Raft has purged (`log::LogStore::purge`).
    pub const FILES_PURGED: &[u8] = b"files_purged";
    /// Present once every value of the store carries a format byte (`values::upgrade`).
    pub const VALUES_FORMAT: &[u8] = b"format";
}
