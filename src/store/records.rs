//! How the state machine stores a record: a published record as where the Raft log holds it
//! (its bytes are written once, to the log), any other record whole.
//!
//! A record appended by a publish is a [`NewRecord`] of a log entry, unchanged, plus the
//! timestamp of the entry's apply. The state machine keeps, under the key of the first of a run
//! of such records (consecutive offsets, consecutive records of one command of one entry: a
//! batch publish's), `(timestamp, index, command, first record, count)` behind
//! [`RECORD_RUN_FORMAT`], one key per published batch rather than per record, and reads the
//! bytes from the log when a record is read; a record at an offset is found under the greatest
//! key at or below it ([`find`]). A store of format 8 or older keeps one key per record behind
//! [`RECORD_AT_FORMAT`], read the same way (a run of one). A broadcast marker or a dead-lettered copy is built in apply (its headers are not the
//! log's) and is kept whole behind [`RECORD_FORMAT`], as is every record a snapshot brings in:
//! snapshot files hold records whole, so they read the same whatever a node stores.
//!
//! The log must therefore keep every entry a record points into for as long as the record
//! lives, whatever Raft purges: the state machine tells the log how far back that is
//! ([`Entries::keep_from`]), and retention, which removes records, is what lets the log's
//! segments go. See ARCHITECTURE.md, "Records in the log".

use std::cell::{Cell, RefCell};

use openraft::EntryPayload;
use serde::{Deserialize, Serialize};

use super::keys;
use crate::codec;
use crate::raft::Entry;
use crate::state::{self, LogPayload, RecordAt, StoredRecord};

/// Format byte of a record stored whole.
pub(crate) const RECORD_FORMAT: u8 = 1;
/// Format byte of a record stored as where the log holds it (written up to format 8).
pub(crate) const RECORD_AT_FORMAT: u8 = 2;
/// Format byte of a run of records stored as where the log holds them.
pub(crate) const RECORD_RUN_FORMAT: u8 = 3;

/// A record stored as where the log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AtValue {
    pub timestamp_ms: u64,
    pub at: RecordAt,
}

/// A run of records stored as where the log holds them: the records `at.record ..
/// at.record + count` of one command, at the offsets from the run's key on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunValue {
    pub timestamp_ms: u64,
    pub at: RecordAt,
    pub count: u32,
}

impl RunValue {
    /// The `n`th record of the run (`n < count`).
    pub(crate) fn nth(&self, n: u32) -> AtValue {
        AtValue {
            timestamp_ms: self.timestamp_ms,
            at: RecordAt {
                record: self.at.record + n,
                ..self.at
            },
        }
    }

    /// The run without its first `n` records (`n < count`).
    pub(crate) fn skip(&self, n: u32) -> RunValue {
        RunValue {
            at: self.nth(n).at,
            count: self.count - n,
            ..*self
        }
    }

    /// `value` followed by the record after its last, if it is that.
    pub(crate) fn extended(&self, value: &AtValue) -> Option<RunValue> {
        let next = self.at.record.checked_add(self.count)?;
        let follows = value.timestamp_ms == self.timestamp_ms
            && value.at.index == self.at.index
            && value.at.command == self.at.command
            && value.at.record == next;
        follows.then(|| RunValue {
            count: self.count + 1,
            ..*self
        })
    }
}

impl From<AtValue> for RunValue {
    fn from(value: AtValue) -> Self {
        RunValue {
            timestamp_ms: value.timestamp_ms,
            at: value.at,
            count: 1,
        }
    }
}

/// A stored record value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stored {
    Whole(StoredRecord),
    At(AtValue),
    Run(RunValue),
}

impl Stored {
    /// How many offsets, from its key's, the value holds.
    pub(crate) fn span(&self) -> u64 {
        match self {
            Stored::Whole(_) | Stored::At(_) => 1,
            Stored::Run(run) => u64::from(run.count),
        }
    }

    /// The log entry it points into, if any.
    pub(crate) fn points_into(&self) -> Option<u64> {
        match self {
            Stored::Whole(_) => None,
            Stored::At(value) => Some(value.at.index),
            Stored::Run(run) => Some(run.at.index),
        }
    }
}

pub(crate) fn encode_record(r: &StoredRecord) -> Result<Vec<u8>, bincode::Error> {
    let mut out = Vec::with_capacity(r.value.len() + 32);
    out.push(RECORD_FORMAT);
    out.extend(codec::encode(r)?);
    Ok(out)
}

/// Format 8's value of one record (what the golden bytes hold; no longer written).
#[cfg(test)]
pub(crate) fn encode_at(value: &AtValue) -> Result<Vec<u8>, bincode::Error> {
    codec::encode_versioned(RECORD_AT_FORMAT, value)
}

pub(crate) fn encode_run(value: &RunValue) -> Result<Vec<u8>, bincode::Error> {
    codec::encode_versioned(RECORD_RUN_FORMAT, value)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Stored, String> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => codec::decode(rest)
            .map(Stored::Whole)
            .map_err(|e| format!("corrupt record: {e}")),
        Some((&RECORD_AT_FORMAT, rest)) => codec::decode(rest)
            .map(Stored::At)
            .map_err(|e| format!("corrupt record location: {e}")),
        Some((&RECORD_RUN_FORMAT, rest)) => match codec::decode::<RunValue>(rest) {
            Ok(run) if run.count == 0 => Err("corrupt record run: no records".into()),
            Ok(run) if run.at.record.checked_add(run.count).is_none() => {
                Err("corrupt record run: past the last record a command can hold".into())
            }
            Ok(run) => Ok(Stored::Run(run)),
            Err(e) => Err(format!("corrupt record run: {e}")),
        },
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
        Some(&RECORD_AT_FORMAT | &RECORD_RUN_FORMAT) => Ok(decode(bytes)?.points_into()),
        _ => Ok(None),
    }
}

/// An iterator over the record keys of topic `topic_id` below offset `end`. Bounded both ways:
/// past a topic's records come other keys (after the newest topic's, the subscriptions'), and
/// an iterator that steps onto them walks every key deleted there (acked leases, deleted
/// topics and subscriptions, each a tombstone until compaction drops it) before it finds a
/// live one, on every read at a topic's end.
pub(crate) fn topic_iter<'a>(
    db: &'a rocksdb::DB,
    cf: &'a rocksdb::ColumnFamily,
    topic_id: u64,
    end: u64,
) -> rocksdb::DBRawIterator<'a> {
    let mut opts = rocksdb::ReadOptions::default();
    opts.set_iterate_lower_bound(keys::record(topic_id, 0).to_vec());
    opts.set_iterate_upper_bound(keys::record(topic_id, end).to_vec());
    db.raw_iterator_cf_opt(cf, opts)
}

/// Where the record of `topic_id` at `offset` is stored: the stored value whose key is the
/// greatest at or below the offset's, if it holds the offset (its key's offset and the
/// value, decoded). `it` is left on that key.
pub(crate) fn find(
    it: &mut rocksdb::DBRawIterator<'_>,
    topic_id: u64,
    offset: u64,
) -> Result<Option<(u64, Stored)>, String> {
    // A value under `offset` itself is found going forward. Going back from a topic's first
    // key (always its front's offset, after a trim too) steps onto the keys a trim or a topic
    // deletion removed with a range tombstone, and RocksDB walks every one of them, lower
    // bound or not, until compaction drops them.
    let key = keys::record(topic_id, offset);
    it.seek(key);
    if !(it.valid() && it.key() == Some(&key[..])) {
        it.seek_for_prev(key);
    }
    if !it.valid() {
        it.status().map_err(|e| format!("RocksDB: {e}"))?;
        return Ok(None);
    }
    let (Some(key), Some(value)) = (it.key(), it.value()) else {
        return Ok(None);
    };
    match keys::parse_record(key) {
        Some((id, from)) if id == topic_id => {
            let stored = decode(value)?;
            Ok((offset - from < stored.span()).then_some((from, stored)))
        }
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

    /// The `n`th record a stored value holds or points at (`n` below its span).
    pub(crate) fn nth(&self, stored: &Stored, n: u64) -> Result<StoredRecord, String> {
        match stored {
            Stored::Whole(r) if n == 0 => Ok(r.clone()),
            Stored::At(value) if n == 0 => self.at(value),
            Stored::Run(run) if n < u64::from(run.count) => self.at(&run.nth(n as u32)),
            _ => Err(format!(
                "no record {n} in a stored value of {}",
                stored.span()
            )),
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

    /// A pair under `key` of the state machine as a snapshot holds it and the state digest
    /// counts it, the same on every node, given to `emit`: a record that points into the log
    /// as the record stored whole, a run as its records, each whole under its own key. Other
    /// pairs are given as they are.
    pub fn whole<E: From<String>>(
        &self,
        key: &[u8],
        value: &[u8],
        emit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let points = matches!(value.first(), Some(&RECORD_AT_FORMAT | &RECORD_RUN_FORMAT));
        let Some((topic_id, first)) = keys::parse_record(key).filter(|_| points) else {
            return emit(key, value);
        };
        let stored = decode(value)?;
        for n in 0..stored.span() {
            let offset = first.checked_add(n).ok_or_else(|| {
                format!("a record run of topic {topic_id} passes the last offset")
            })?;
            let record = encode_record(&self.nth(&stored, n)?).map_err(|e| e.to_string())?;
            emit(&keys::record(topic_id, offset), &record)?;
        }
        Ok(())
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
        let mut it = topic_iter(db, cf, meta.id, meta.first_offset.saturating_add(1));
        let Some((_, stored)) = find(&mut it, meta.id, meta.first_offset)? else {
            continue;
        };
        if let Some(index) = stored.points_into() {
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

/// Writes the published records of one apply call as runs ([`RunValue`]): each record that
/// follows the pending run (the next offset, the next record of the same command) extends it,
/// any other starts a new one. The apply call's removals of records go through it too, so
/// that they come after the pending run in the write batch: trimming a topic's front keeps
/// the rest of a run that straddles the new first offset, under that offset's key.
pub(crate) struct RunWriter<'a> {
    db: &'a rocksdb::DB,
    cf: &'a rocksdb::ColumnFamily,
    /// The run not written yet: topic, its first offset, the run.
    pending: Option<(u64, u64, RunValue)>,
    /// The runs this call wrote, by topic and first offset: not in RocksDB yet.
    written: std::collections::BTreeMap<(u64, u64), RunValue>,
}

impl<'a> RunWriter<'a> {
    pub(crate) fn new(db: &'a rocksdb::DB, cf: &'a rocksdb::ColumnFamily) -> Self {
        RunWriter {
            db,
            cf,
            pending: None,
            written: Default::default(),
        }
    }

    /// Adds the record at `offset` of topic `topic_id`, stored as `value`.
    pub(crate) fn push(
        &mut self,
        batch: &mut rocksdb::WriteBatch,
        topic_id: u64,
        offset: u64,
        value: AtValue,
    ) -> Result<(), bincode::Error> {
        if let Some((topic, first, run)) = &mut self.pending {
            let next =
                *topic == topic_id && first.checked_add(u64::from(run.count)) == Some(offset);
            if let Some(longer) = run.extended(&value).filter(|_| next) {
                *run = longer;
                return Ok(());
            }
        }
        self.flush(batch)?;
        self.pending = Some((topic_id, offset, RunValue::from(value)));
        Ok(())
    }

    /// Writes the pending run.
    pub(crate) fn flush(&mut self, batch: &mut rocksdb::WriteBatch) -> Result<(), bincode::Error> {
        if let Some((topic_id, first, run)) = self.pending.take() {
            self.put(batch, topic_id, first, run)?;
        }
        Ok(())
    }

    fn put(
        &mut self,
        batch: &mut rocksdb::WriteBatch,
        topic_id: u64,
        first: u64,
        run: RunValue,
    ) -> Result<(), bincode::Error> {
        batch.put_cf(self.cf, keys::record(topic_id, first), encode_run(&run)?);
        self.written.insert((topic_id, first), run);
        Ok(())
    }

    /// Removes every record of topic `topic_id`, the pending run's included.
    pub(crate) fn delete_topic(
        &mut self,
        batch: &mut rocksdb::WriteBatch,
        topic_id: u64,
    ) -> Result<(), bincode::Error> {
        self.flush(batch)?;
        batch.delete_range_cf(
            self.cf,
            keys::record(topic_id, 0),
            keys::record(topic_id + 1, 0),
        );
        Ok(())
    }

    /// Removes the records `from..to` of topic `topic_id` (its front: no record of it lies
    /// below `from`), keeping the records at and after `to` of a run that holds `to`.
    pub(crate) fn trim(
        &mut self,
        batch: &mut rocksdb::WriteBatch,
        topic_id: u64,
        from: u64,
        to: u64,
    ) -> Result<(), String> {
        self.flush(batch).map_err(|e| e.to_string())?;
        let rest = match to.checked_sub(1).filter(|last| *last >= from) {
            Some(last) => self.holding(topic_id, last)?,
            None => None,
        }
        .filter(|(first, run)| first + u64::from(run.count) > to)
        .map(|(first, run)| run.skip((to - first) as u32));
        batch.delete_range_cf(
            self.cf,
            keys::record(topic_id, from),
            keys::record(topic_id, to),
        );
        if let Some(rest) = rest {
            self.put(batch, topic_id, to, rest)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The run holding `offset`, if a run holds it: among those this call wrote, else in
    /// RocksDB.
    fn holding(&self, topic_id: u64, offset: u64) -> Result<Option<(u64, RunValue)>, String> {
        let here = self
            .written
            .range((topic_id, 0)..=(topic_id, offset))
            .next_back()
            .map(|(&(_, first), run)| (first, *run));
        let mut it = topic_iter(self.db, self.cf, topic_id, offset.saturating_add(1));
        let stored = match find(&mut it, topic_id, offset)? {
            Some((first, Stored::Run(run))) => Some((first, run)),
            _ => None,
        };
        // The newer of the two: a value written by this call at or above the stored one's key
        // replaces it.
        Ok(match (here, stored) {
            (Some(h), Some(s)) if s.0 > h.0 => Some(s),
            (Some(h), _) => Some(h).filter(|(first, run)| offset - first < u64::from(run.count)),
            (None, s) => s,
        })
    }
}
