//! Publish and broadcast: append a batch of records to a topic, or one marker record to many
//! topics, all or nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::producers::{self, BatchOffsets, Check, ProducerSeq};
use super::{ApplyError, Batch, Command, CommandResult, Outcome, SmState, TopicMeta, Write};

/// A record as it travels in the log, before it has an offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewRecord {
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
    /// Encoded as one length and the raw bytes (the same bytes bincode writes for a plain
    /// `Vec<u8>`, which it writes and reads one element at a time).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// A record as stored under `(topic id, offset)`. Versioned by the enum tag of
/// [`StoredRecord::V1`]'s encoding (see `store`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// Leader time (clamped) of the entry that appended it.
    pub timestamp_ms: u64,
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
    /// As in [`NewRecord`].
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

/// Where a published record lies in the Raft log: record `record` of command `command` (a
/// [`Publish`] or a [`PublishBatch`]) of the entry at `index`. The store may keep this instead
/// of the record's bytes, which the log already holds: the record is that command's record
/// `record` with the timestamp of the entry's apply ([`record_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAt {
    pub index: u64,
    pub command: u32,
    pub record: u32,
}

/// A record as apply hands it to the store ([`Write::PutRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Built in apply (a broadcast marker, whose headers carry the commit point; a
    /// dead-lettered copy): stored as it is.
    Whole(StoredRecord),
    /// A published record, unchanged: the command at `at` holds it, and it is stamped
    /// `timestamp_ms`. Nothing of it is copied in apply; the store keeps `at`, or reads the
    /// record from the entry ([`record_at`]) to store it whole.
    Logged { timestamp_ms: u64, at: RecordAt },
}

impl Appended {
    pub fn timestamp_ms(&self) -> u64 {
        match self {
            Appended::Whole(r) => r.timestamp_ms,
            Appended::Logged { timestamp_ms, .. } => *timestamp_ms,
        }
    }
}

/// The record at `at` in `batch` (the entry at `at.index`), stamped `timestamp_ms`: what a
/// [`Appended::Logged`] record is. An error when the entry holds no such record (it is not
/// the entry `at` names, or it was damaged).
pub fn record_at(batch: &Batch, at: RecordAt, timestamp_ms: u64) -> Result<StoredRecord, String> {
    let missing = || {
        format!(
            "log entry {} holds no record {} in command {}",
            at.index, at.record, at.command
        )
    };
    match batch.commands.get(at.command as usize) {
        Some(Command::Publish(p)) => {
            let r = p.records.get(at.record as usize).ok_or_else(missing)?;
            Ok(StoredRecord {
                timestamp_ms,
                key: r.key.clone(),
                headers: r.headers.clone(),
                value: r.value.clone(),
            })
        }
        Some(Command::PublishBatch(p)) => {
            let r = batch_record(&p.batches, at.record as usize).map_err(|e| {
                format!(
                    "log entry {} command {}: record {}: {e}",
                    at.index, at.command, at.record
                )
            })?;
            Ok(r.stored(timestamp_ms))
        }
        _ => Err(missing()),
    }
}

/// Bytes a record counts for in limits and in topic sizes: value, key and headers.
pub fn record_size(r: &NewRecord) -> u64 {
    size_of(r.key.as_deref(), &r.headers, &r.value)
}

/// Bytes a stored record counts for, as [`record_size`] counts a new one.
pub fn stored_size(r: &StoredRecord) -> u64 {
    size_of(r.key.as_deref(), &r.headers, &r.value)
}

fn size_of(key: Option<&str>, headers: &[(String, String)], value: &[u8]) -> u64 {
    let headers: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    (value.len() + key.map_or(0, str::len) + headers) as u64
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    pub topic: String,
    pub records: Vec<NewRecord>,
    /// Makes the batch idempotent (see `producers`).
    pub producer: Option<ProducerSeq>,
}

/// A publish whose records are carried as the client sent them: Kafka record batches, not
/// parsed into [`NewRecord`]s, so their bytes go from the request body through the log and
/// replication to the disk unchanged, and the store keeps where they are ([`RecordAt`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishBatch {
    pub topic: String,
    /// One or more Kafka record batches (magic 2, uncompressed, not transactional), back to
    /// back: what [`batch_records`] accepts. Encoded as one length and the bytes.
    pub batches: bytes::Bytes,
    /// Makes the batch idempotent (see `producers`).
    pub producer: Option<ProducerSeq>,
}

/// Format of the commands this build applies, which `/raft/status` tells the other nodes: 1
/// is every command up to [`Command::Broadcast`], 2 adds [`Command::PublishBatch`]. A leader
/// proposes a batch publish only once every member has said it applies format 2, so that a
/// rolling upgrade never hands an older node an entry it cannot read.
pub const COMMAND_FORMAT: u32 = 2;

/// A record of a [`PublishBatch`], borrowed from its bytes, checked as raftq needs it: its key
/// and header values UTF-8 text, its value and header values not null, its header names
/// unique (sorted by name, as the JSON form holds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecord<'a> {
    pub key: Option<&'a str>,
    pub headers: Vec<(&'a str, &'a str)>,
    pub value: &'a [u8],
}

impl BatchRecord<'_> {
    /// Bytes it counts for in limits and topic sizes, as [`record_size`] counts a
    /// [`NewRecord`].
    pub fn size(&self) -> u64 {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        (self.value.len() + self.key.map_or(0, str::len) + headers) as u64
    }

    /// The record, owned and stamped `timestamp_ms`.
    pub fn stored(&self, timestamp_ms: u64) -> StoredRecord {
        StoredRecord {
            timestamp_ms,
            key: self.key.map(str::to_owned),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value: self.value.to_vec(),
        }
    }
}

/// `records` as one Kafka record batch (offsets from 0, no timestamps or Kafka producer
/// fields: the leader stamps each record), for a [`PublishBatch`] of records that came in
/// another form.
pub fn encode_records(records: &[NewRecord]) -> Vec<u8> {
    let headers: Vec<raftq_batch::HeaderRefs<'_>> = records
        .iter()
        .map(|r| raftq_batch::text_headers(r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        .collect();
    let refs: Vec<raftq_batch::RecordRef<'_>> = records
        .iter()
        .zip(&headers)
        .map(|(r, headers)| raftq_batch::RecordRef {
            timestamp_delta: 0,
            key: r.key.as_deref().map(str::as_bytes),
            value: Some(&r.value),
            headers,
        })
        .collect();
    let size: usize = records.iter().map(|r| record_size(r) as usize + 32).sum();
    let mut out = Vec::with_capacity(raftq_batch::HEADER_BYTES + size);
    raftq_batch::encode(
        &raftq_batch::BatchHeader::unstamped(records.len()),
        &refs,
        &mut out,
    );
    out
}

/// Bounds of the batch decoder in apply: only what the bytes themselves back (the body is in
/// memory already). The API's own, tighter limits are checked before proposing; apply must not
/// refuse, on replay, what a later API limit would.
const DECODE_LIMITS: raftq_batch::Limits = raftq_batch::Limits {
    max_records: usize::MAX,
    max_headers_per_record: usize::MAX,
};

/// Every record of a [`PublishBatch`]'s bytes, checked (the batches strictly, CRCs included,
/// and each record as [`BatchRecord`] says), or what is wrong with the first one that fails.
/// Zero-copy: keys, values and headers borrow from `bytes`.
pub fn batch_records(bytes: &[u8]) -> Result<Vec<BatchRecord<'_>>, String> {
    let batches = raftq_batch::decode_all(bytes, &DECODE_LIMITS)
        .map_err(|e| format!("malformed record batch: {e}"))?;
    let mut records = Vec::with_capacity(batches.iter().map(|b| b.records.len()).sum());
    for r in batches.iter().flat_map(|b| &b.records) {
        records.push(checked(records.len(), r)?);
    }
    Ok(records)
}

/// Record `n` of a [`PublishBatch`]'s bytes that [`batch_records`] accepted, found without
/// decoding the records before it or checking the CRCs again.
pub fn batch_record(bytes: &[u8], n: usize) -> Result<BatchRecord<'_>, String> {
    let r = raftq_batch::nth_record(bytes, n, &DECODE_LIMITS).map_err(|e| e.to_string())?;
    checked(n, &r)
}

/// Record `index` as raftq takes it: see [`BatchRecord`].
fn checked<'a>(index: usize, r: &raftq_batch::Record<'a>) -> Result<BatchRecord<'a>, String> {
    let text = |bytes: &'a [u8], field: &dyn Fn() -> String| {
        std::str::from_utf8(bytes)
            .map_err(|_| format!("record {index}: its {} is not UTF-8 text", field()))
    };
    let key = r.key.map(|k| text(k, &|| "key".to_string())).transpose()?;
    let mut headers = Vec::with_capacity(r.headers.len());
    for h in &r.headers {
        let value = h
            .value
            .ok_or_else(|| format!("record {index}: header {:?} has a null value", h.key))?;
        headers.push((h.key, text(value, &|| format!("header {:?}", h.key))?));
    }
    headers.sort_by(|a, b| a.0.cmp(b.0));
    if let Some(pair) = headers.windows(2).find(|p| p[0].0 == p[1].0) {
        return Err(format!(
            "record {index}: header {:?} appears more than once",
            pair[0].0
        ));
    }
    let value = r
        .value
        .ok_or_else(|| format!("record {index} has a null value"))?;
    Ok(BatchRecord {
        key,
        headers,
        value,
    })
}

/// One marker record appended to many topics in one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Broadcast {
    /// `None`: every topic that exists when the entry is applied.
    pub topics: Option<Vec<String>>,
    pub record: NewRecord,
}

/// Header of a broadcast marker: the index of the entry that appended it.
pub const HEADER_COMMIT_INDEX: &str = "raftq-commit-index";
/// Header of a broadcast marker: the leader time of that entry.
pub const HEADER_COMMIT_TIMESTAMP_MS: &str = "raftq-commit-timestamp-ms";

/// Appends `record` to the topic `meta` and counts it published.
pub(super) fn append(
    meta: &mut TopicMeta,
    record: Appended,
    size: u64,
    writes: &mut Vec<Write>,
) -> u64 {
    let offset = meta.next_offset;
    if meta.records() == 0 {
        meta.first_timestamp_ms = record.timestamp_ms();
    }
    writes.push(Write::PutRecord {
        topic_id: meta.id,
        offset,
        record,
    });
    meta.next_offset += 1;
    meta.bytes += size;
    meta.counters.published += 1;
    offset
}

/// Applies `cmd`, command `command` (when it fits a `u32`) of the entry at `index`.
pub(super) fn publish(
    state: &mut SmState,
    at: (u64, Option<u32>),
    cmd: &Publish,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let sizes: Vec<u64> = cmd.records.iter().map(record_size).collect();
    let whole = |i: usize, timestamp_ms| {
        let r = &cmd.records[i];
        StoredRecord {
            timestamp_ms,
            key: r.key.clone(),
            headers: r.headers.clone(),
            value: r.value.clone(),
        }
    };
    append_published(
        state,
        at,
        (&cmd.topic, cmd.producer.as_ref()),
        &sizes,
        &whole,
        writes,
    )
}

/// Applies `cmd`, as [`publish`]: the same checks and outcome, its records taken from the
/// batches' bytes where they lie. Bytes that [`batch_records`] refuses are refused whole
/// (the leader checks them before proposing, so only a leader's fault gets here).
pub(super) fn publish_batch(
    state: &mut SmState,
    at: (u64, Option<u32>),
    cmd: &PublishBatch,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let records = batch_records(&cmd.batches).map_err(ApplyError::InvalidArgument)?;
    let sizes: Vec<u64> = records.iter().map(BatchRecord::size).collect();
    let whole = |i: usize, timestamp_ms| records[i].stored(timestamp_ms);
    append_published(
        state,
        at,
        (&cmd.topic, cmd.producer.as_ref()),
        &sizes,
        &whole,
        writes,
    )
}

/// What a publish does, whatever form its records come in: `sizes` has one entry per record,
/// and `whole(i, timestamp)` builds record `i` for the rare record the log cannot point at
/// (a command past `u32::MAX` in its entry).
fn append_published(
    state: &mut SmState,
    (index, command): (u64, Option<u32>),
    (topic, producer): (&str, Option<&ProducerSeq>),
    sizes: &[u64],
    whole: &dyn Fn(usize, u64) -> StoredRecord,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let clock = state.clock_ms;
    if let Some(seq) = producer {
        producers::validate(seq)?;
    }
    let meta = state
        .topics
        .get(topic)
        .ok_or_else(|| ApplyError::TopicNotFound(topic.to_string()))?;
    if sizes.is_empty() {
        return Err(ApplyError::InvalidArgument(
            "a publish needs at least one record".into(),
        ));
    }
    if let Some(seq) = producer {
        if let Check::Duplicate {
            first_offset,
            last_offset,
        } = state.producers.check(topic, seq)?
        {
            let meta = state
                .topics
                .get_mut(topic)
                .ok_or_else(|| ApplyError::TopicNotFound(topic.to_string()))?;
            meta.counters.deduplicated += sizes.len() as u64;
            writes.push(Write::PutTopic(topic.to_string()));
            return Ok(Outcome::Published {
                first_offset,
                last_offset,
                duplicate: true,
            });
        }
    }
    // Check every record before touching anything: a batch is all or nothing.
    let limit = meta.settings.effective_max_record_bytes();
    if let Some((i, size)) = sizes.iter().enumerate().find(|(_, s)| **s > limit) {
        return Err(ApplyError::RecordTooLarge(format!(
            "record {i} is {size} bytes; topic {topic:?} accepts at most {limit}"
        )));
    }
    let meta = state
        .topics
        .get_mut(topic)
        .ok_or_else(|| ApplyError::TopicNotFound(topic.to_string()))?;
    let first_offset = meta.next_offset;
    for (position, &size) in sizes.iter().enumerate() {
        let record = match command.zip(u32::try_from(position).ok()) {
            Some((command, record)) => Appended::Logged {
                timestamp_ms: clock,
                at: RecordAt {
                    index,
                    command,
                    record,
                },
            },
            None => Appended::Whole(whole(position, clock)),
        };
        append(meta, record, size, writes);
    }
    let last_offset = meta.next_offset - 1;
    writes.push(Write::PutTopic(topic.to_string()));
    if let Some(seq) = producer {
        state.producers.record(
            topic,
            seq,
            BatchOffsets {
                sequence: seq.sequence,
                first_offset,
                last_offset,
            },
            clock,
            writes,
        );
    }
    Ok(Outcome::Published {
        first_offset,
        last_offset,
        duplicate: false,
    })
}

/// Appends one marker to every named topic (all topics when none are named), carrying the
/// entry's commit point (`index`, the clock) in its headers. All or nothing.
pub(super) fn broadcast(
    state: &mut SmState,
    index: u64,
    cmd: &Broadcast,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let clock = state.clock_ms;
    let names: Vec<String> = match &cmd.topics {
        Some(names) => {
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            unique
        }
        None => state.topics.keys().cloned().collect(),
    };
    let mut headers: Vec<(String, String)> = cmd
        .record
        .headers
        .iter()
        .filter(|(k, _)| k != HEADER_COMMIT_INDEX && k != HEADER_COMMIT_TIMESTAMP_MS)
        .cloned()
        .collect();
    headers.push((HEADER_COMMIT_INDEX.into(), index.to_string()));
    headers.push((HEADER_COMMIT_TIMESTAMP_MS.into(), clock.to_string()));
    let record = StoredRecord {
        timestamp_ms: clock,
        key: cmd.record.key.clone(),
        headers,
        value: cmd.record.value.clone(),
    };
    let size = stored_size(&record);
    for name in &names {
        let meta = state
            .topics
            .get(name)
            .ok_or_else(|| ApplyError::TopicNotFound(name.clone()))?;
        let limit = meta.settings.effective_max_record_bytes();
        if size > limit {
            return Err(ApplyError::RecordTooLarge(format!(
                "the marker is {size} bytes with its headers; topic {name:?} accepts at most \
                 {limit}"
            )));
        }
    }
    let mut offsets = BTreeMap::new();
    for name in names {
        if let Some(meta) = state.topics.get_mut(&name) {
            let offset = append(meta, Appended::Whole(record.clone()), size, writes);
            writes.push(Write::PutTopic(name.clone()));
            offsets.insert(name, offset);
        }
    }
    Ok(Outcome::Broadcast { offsets })
}
