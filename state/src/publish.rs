//! Publish and broadcast: append a batch of records to a topic, or one marker record to many
//! topics, all or nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::producers::{self, BatchOffsets, Check, ProducerSeq};
use super::{ApplyError, CommandResult, Outcome, SmState, TopicMeta, Write};

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
/// [`Publish`]) of the entry at `index`. The store may keep this instead of the record's bytes,
/// which the log already holds: the record is that [`NewRecord`] with the timestamp of the
/// entry's apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAt {
    pub index: u64,
    pub command: u32,
    pub record: u32,
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

/// Appends `record` to the topic `meta` and counts it published. `at`: where the log holds
/// it, for a record taken unchanged from a [`Publish`].
pub(super) fn append(
    meta: &mut TopicMeta,
    record: StoredRecord,
    at: Option<RecordAt>,
    size: u64,
    writes: &mut Vec<Write>,
) -> u64 {
    let offset = meta.next_offset;
    if meta.records() == 0 {
        meta.first_timestamp_ms = record.timestamp_ms;
    }
    writes.push(Write::PutRecord {
        topic_id: meta.id,
        offset,
        record,
        at,
    });
    meta.next_offset += 1;
    meta.bytes += size;
    meta.counters.published += 1;
    offset
}

/// Applies `cmd`, command `command` (when it fits a `u32`) of the entry at `index`.
pub(super) fn publish(
    state: &mut SmState,
    (index, command): (u64, Option<u32>),
    cmd: &Publish,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let clock = state.clock_ms;
    if let Some(seq) = &cmd.producer {
        producers::validate(seq)?;
    }
    let meta = state
        .topics
        .get(&cmd.topic)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.topic.clone()))?;
    if cmd.records.is_empty() {
        return Err(ApplyError::InvalidArgument(
            "a publish needs at least one record".into(),
        ));
    }
    if let Some(seq) = &cmd.producer {
        if let Check::Duplicate {
            first_offset,
            last_offset,
        } = state.producers.check(&cmd.topic, seq)?
        {
            let meta = state
                .topics
                .get_mut(&cmd.topic)
                .ok_or_else(|| ApplyError::TopicNotFound(cmd.topic.clone()))?;
            meta.counters.deduplicated += cmd.records.len() as u64;
            writes.push(Write::PutTopic(cmd.topic.clone()));
            return Ok(Outcome::Published {
                first_offset,
                last_offset,
                duplicate: true,
            });
        }
    }
    // Check every record before touching anything: a batch is all or nothing.
    let limit = meta.settings.effective_max_record_bytes();
    let mut sizes = Vec::with_capacity(cmd.records.len());
    for (i, r) in cmd.records.iter().enumerate() {
        let size = record_size(r);
        if size > limit {
            return Err(ApplyError::RecordTooLarge(format!(
                "record {i} is {size} bytes; topic {:?} accepts at most {limit}",
                cmd.topic
            )));
        }
        sizes.push(size);
    }
    let meta = state
        .topics
        .get_mut(&cmd.topic)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.topic.clone()))?;
    let first_offset = meta.next_offset;
    for (position, (r, size)) in cmd.records.iter().zip(sizes).enumerate() {
        let record = StoredRecord {
            timestamp_ms: clock,
            key: r.key.clone(),
            headers: r.headers.clone(),
            value: r.value.clone(),
        };
        let at = command
            .zip(u32::try_from(position).ok())
            .map(|(command, record)| RecordAt {
                index,
                command,
                record,
            });
        append(meta, record, at, size, writes);
    }
    let last_offset = meta.next_offset - 1;
    writes.push(Write::PutTopic(cmd.topic.clone()));
    if let Some(seq) = &cmd.producer {
        state.producers.record(
            &cmd.topic,
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
            let offset = append(meta, record.clone(), None, size, writes);
            writes.push(Write::PutTopic(name.clone()));
            offsets.insert(name, offset);
        }
    }
    Ok(Outcome::Broadcast { offsets })
}
