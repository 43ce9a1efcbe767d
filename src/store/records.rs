//! How the state machine stores a record: a published record as where the Raft log holds it
//! (its bytes are written once, to the log), any other record whole.
//!
//! A record appended by a publish is a [`NewRecord`] of a log entry, unchanged, plus the
//! timestamp of the entry's apply. The state machine keeps `(timestamp, index, command,
//! record)` behind [`RECORD_AT_FORMAT`] and reads the bytes from the log when the record is
//! read. A broadcast marker or a dead-lettered copy is built in apply (its headers are not the
//! log's) and is kept whole behind [`RECORD_FORMAT`], as is every record a snapshot brings in:
//! snapshot files hold records whole, so they read the same whatever a node stores.
//!
//! The log must therefore keep every entry a record points into for as long as the record
//! lives, whatever Raft purges: the state machine tells the log how far back that is
//! ([`Entries::keep_from`]), and retention, which removes records, is what lets the log's
//! segments go. See ARCHITECTURE.md, "Records in the log".

use std::borrow::Cow;
use std::cell::{Cell, RefCell};

use openraft::EntryPayload;
use serde::{Deserialize, Serialize};

use super::keys;
use crate::codec;
use crate::raft::Entry;
use crate::state::{self, LogPayload, RecordAt, StoredRecord};

/// Format byte of a record stored whole.
pub(crate) const RECORD_FORMAT: u8 = 1;
/// Format byte of a record stored as where the log holds it.
pub(crate) const RECORD_AT_FORMAT: u8 = 2;

/// A record stored as where the log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AtValue {
    pub timestamp_ms: u64,
    pub at: RecordAt,
}

/// A stored record value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    Whole(StoredRecord),
    At(AtValue),
}

pub(crate) fn encode_record(r: &StoredRecord) -> Result<Vec<u8>, bincode::Error> {
    let mut out = Vec::with_capacity(r.value.len() + 32);
    out.push(RECORD_FORMAT);
    out.extend(codec::encode(r)?);
    Ok(out)
}

pub(crate) fn encode_at(value: &AtValue) -> Result<Vec<u8>, bincode::Error> {
    codec::encode_versioned(RECORD_AT_FORMAT, value)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Stored, String> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => codec::decode(rest)
            .map(Stored::Whole)
            .map_err(|e| format!("corrupt record: {e}")),
        Some((&RECORD_AT_FORMAT, rest)) => codec::decode(rest)
            .map(Stored::At)
            .map_err(|e| format!("corrupt record location: {e}")),
        Some((v, _)) => Err(format!("record has unknown format version {v}")),
        None => Err("empty record".into()),
    }
}

/// Log entries that records point into, read back.
pub trait EntrySource {
    /// The entry at `index`, whether or not Raft has purged it.
    fn entry(&self, index: u64) -> Result<Entry, String>;
}

/// The Raft log as the state machine sees it: the entries its records point into, how far
/// back the log must keep them, and how a snapshot shares them.
pub trait Entries: EntrySource + Send + Sync {
    /// No record points below `index` any more, in the state machine as it is on disk: the
    /// log may remove entries below it. Never lowers what an earlier call said.
    fn keep_from(&self, index: u64);

    /// Puts into the directory `into` segment files (`store::segments`) that hold entries
    /// `first..=last`, all of them durable: hard links to the log's own files, so a snapshot
    /// holds the records it points at without a copy. The caller syncs `into`.
    fn link_segments(&self, first: u64, last: u64, into: &std::path::Path) -> Result<(), String>;

    /// The first entry the log's files hold, if any.
    fn first_stored(&self) -> Option<u64>;
}

/// The entries records point into, wherever they are: the Raft log, and the record files of
/// the current snapshot. A follower that installed a snapshot holds there the entries its
/// records point into and its log does not (`store::transfer`); a node's own later snapshot
/// links them again, so they stay until retention lets them go. The snapshot's files are
/// opened (every frame checked) only when an entry is not in the log.
pub struct Sources<'a> {
    pub log: &'a dyn Entries,
    pub archive: Option<&'a Archive>,
}

/// A snapshot's record files, opened on first use.
pub struct Archive {
    /// The directory, and the last entry read from it (the snapshot's index).
    dir: std::path::PathBuf,
    through: u64,
    opened: std::sync::OnceLock<Result<SegmentEntries, String>>,
}

impl Archive {
    pub fn new(dir: std::path::PathBuf, through: u64) -> Archive {
        Archive {
            dir,
            through,
            opened: std::sync::OnceLock::new(),
        }
    }

    fn open(&self) -> Result<&SegmentEntries, String> {
        self.opened
            .get_or_init(|| {
                super::segments::SegmentLog::open_read_only(&self.dir, self.through)
                    .map(SegmentEntries)
                    .map_err(|e| format!("the current snapshot's record files: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl EntrySource for Sources<'_> {
    fn entry(&self, index: u64) -> Result<Entry, String> {
        match self.log.entry(index) {
            Ok(entry) => Ok(entry),
            // The snapshot's files hold committed entries only, the same as any log's.
            Err(in_log) => match self.archive {
                Some(archive) if index <= archive.through => archive
                    .open()
                    .and_then(|files| files.entry(index))
                    .map_err(|e| format!("{in_log}; {e}")),
                _ => Err(in_log),
            },
        }
    }
}

impl Entries for Sources<'_> {
    fn keep_from(&self, index: u64) {
        self.log.keep_from(index);
    }

    /// The entries the log's files hold are linked from them; those before, from the current
    /// snapshot's record files (a follower's, after an install).
    fn link_segments(&self, first: u64, last: u64, into: &std::path::Path) -> Result<(), String> {
        let stored = self.log.first_stored();
        let Some(archive) = self.archive.filter(|_| stored.is_none_or(|f| f > first)) else {
            return self.log.link_segments(first, last, into);
        };
        let before_log = stored.map_or(last, |f| (f - 1).min(last));
        archive
            .open()?
            .0
            .link_or_copy(first, before_log, into)
            .map_err(|e| format!("linking entries {first} to {before_log}: {e}"))?;
        if before_log < last {
            self.log.link_segments(before_log + 1, last, into)?;
        }
        Ok(())
    }

    fn first_stored(&self) -> Option<u64> {
        self.log.first_stored()
    }
}

/// The entries in a directory of segment files (a snapshot's linked ones), up to an index.
pub struct SegmentEntries(pub super::segments::SegmentLog);

impl EntrySource for SegmentEntries {
    fn entry(&self, index: u64) -> Result<Entry, String> {
        let bytes = self
            .0
            .read(index)
            .map_err(|e| format!("reading log entry {index}: {e}"))?
            .ok_or_else(|| format!("log entry {index} is not in the linked segments"))?;
        let entry = super::log::decode_entry(&bytes).map_err(|e| e.to_string())?;
        if entry.log_id.index != index {
            return Err(format!("log entry {index} holds entry {}", entry.log_id));
        }
        Ok(entry)
    }
}

/// The log index a stored record value points into (`None` for a record stored whole).
pub(crate) fn points_into(bytes: &[u8]) -> Result<Option<u64>, String> {
    match bytes.first() {
        Some(&RECORD_AT_FORMAT) => match decode(bytes)? {
            Stored::At(value) => Ok(Some(value.at.index)),
            Stored::Whole(_) => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The record at `at` in `entry`, with `timestamp_ms`.
pub(crate) fn record_in(entry: &Entry, value: &AtValue) -> Result<StoredRecord, String> {
    let AtValue { timestamp_ms, at } = *value;
    if entry.log_id.index != at.index {
        return Err(format!(
            "log entry {} was read for a record of entry {}",
            entry.log_id.index, at.index
        ));
    }
    let EntryPayload::Normal(LogPayload::V1(batch)) = &entry.payload else {
        return Err(format!(
            "log entry {} holds no record {} in command {}",
            at.index, at.record, at.command
        ));
    };
    state::record_at(batch, at, timestamp_ms)
}

/// Turns stored values into records. Records read in a row mostly lie in one entry: the last
/// entry read is kept, so each is read and decoded once per run of them.
pub struct Reader<'a> {
    log: Option<&'a dyn EntrySource>,
    last: RefCell<Option<Entry>>,
    lowest: Cell<Option<u64>>,
}

impl<'a> Reader<'a> {
    /// A reader of the records of a state machine whose log is `log` (none: every record must
    /// be stored whole).
    pub fn new(log: Option<&'a dyn EntrySource>) -> Self {
        Reader {
            log,
            last: RefCell::new(None),
            lowest: Cell::new(None),
        }
    }

    /// The record a stored value holds or points at.
    pub fn record(&self, bytes: &[u8]) -> Result<StoredRecord, String> {
        match decode(bytes)? {
            Stored::Whole(r) => Ok(r),
            Stored::At(value) => self.at(&value),
        }
    }

    /// The record `value` points at.
    pub(crate) fn at(&self, value: &AtValue) -> Result<StoredRecord, String> {
        let index = value.at.index;
        self.lowest
            .set(Some(self.lowest.get().map_or(index, |l| l.min(index))));
        let mut last = self.last.borrow_mut();
        if let Some(entry) = last.as_ref().filter(|e| e.log_id.index == index) {
            return record_in(entry, value);
        }
        let log = self.log.ok_or_else(|| {
            format!("a record points into log entry {index}, and there is no log to read")
        })?;
        let entry = log.entry(index)?;
        let record = record_in(&entry, value);
        *last = Some(entry);
        record
    }

    /// `value` as a record stored whole, for a pair under `key` of the state machine: what a
    /// snapshot holds and the state digest counts, the same on every node. Other pairs are
    /// returned as they are.
    pub fn whole<'v>(&self, key: &[u8], value: &'v [u8]) -> Result<Cow<'v, [u8]>, String> {
        if value.first() != Some(&RECORD_AT_FORMAT) || keys::parse_record(key).is_none() {
            return Ok(Cow::Borrowed(value));
        }
        let record = self.record(value)?;
        encode_record(&record)
            .map(Cow::Owned)
            .map_err(|e| e.to_string())
    }

    /// The lowest log index among the records this reader resolved.
    pub fn lowest(&self) -> Option<u64> {
        self.lowest.get()
    }
}

/// Whether the log, which starts at `log_first` (none: empty), or the current snapshot's
/// record files, which hold `archive` (first and last entry; none: it has none), hold the entry
/// the first record of each topic points into. At start-up: records only ever go from the front
/// of a topic, so a log that lacks one of these lost entries the state machine needs.
pub(crate) fn check_log_holds(
    db: &rocksdb::DB,
    log_first: Option<u64>,
    archive: Option<(u64, u64)>,
) -> Result<(), String> {
    use crate::state::TopicMeta;
    let cf = db
        .cf_handle(super::CF_SM)
        .ok_or("column family sm missing")?;
    // A half-loaded snapshot is loaded again at open, whole records only.
    if db
        .get_cf(cf, keys::INSTALLING)
        .map_err(|e| e.to_string())?
        .is_some()
    {
        return Ok(());
    }
    let prefix = [keys::TOPIC_PREFIX];
    let mode = rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward);
    for item in db.iterator_cf(cf, mode) {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if k.first() != Some(&keys::TOPIC_PREFIX) {
            break;
        }
        let meta: TopicMeta = super::values::decode(&v)?;
        if meta.records() == 0 {
            continue;
        }
        let Some(bytes) = db
            .get_cf(cf, keys::record(meta.id, meta.first_offset))
            .map_err(|e| e.to_string())?
        else {
            continue;
        };
        if let Stored::At(value) = decode(&bytes)? {
            let index = value.at.index;
            let archived = archive.is_some_and(|(first, last)| (first..=last).contains(&index));
            if !archived && log_first.is_none_or(|first| index < first) {
                return Err(format!(
                    "record {} of topic {:?} points into log entry {index}, which the log no \
                     longer holds (it starts at {})",
                    meta.first_offset,
                    String::from_utf8_lossy(&k[1..]),
                    log_first.map_or("no entry".to_string(), |f| format!("entry {f}"))
                ));
            }
        }
    }
    Ok(())
}
