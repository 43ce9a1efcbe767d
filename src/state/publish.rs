//! Publish: append a batch of records to a topic, all or nothing.

use serde::{Deserialize, Serialize};

use super::{ApplyError, CommandResult, Outcome, SmState, Write};

/// A record as it travels in the log, before it has an offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewRecord {
    pub key: Option<String>,
    pub headers: Vec<(String, String)>,
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
    pub value: Vec<u8>,
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
}

pub(super) fn publish(
    state: &mut SmState,
    cmd: &Publish,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let clock = state.clock_ms;
    let meta = state
        .topics
        .get_mut(&cmd.topic)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.topic.clone()))?;
    if cmd.records.is_empty() {
        return Err(ApplyError::InvalidArgument(
            "a publish needs at least one record".into(),
        ));
    }
    // Check every record before touching anything: a batch is all or nothing.
    let limit = meta.settings.effective_max_record_bytes();
    let mut total = 0u64;
    for (i, r) in cmd.records.iter().enumerate() {
        let size = record_size(r);
        if size > limit {
            return Err(ApplyError::RecordTooLarge(format!(
                "record {i} is {size} bytes; topic {:?} accepts at most {limit}",
                cmd.topic
            )));
        }
        total += size;
    }
    let first_offset = meta.next_offset;
    for r in &cmd.records {
        writes.push(Write::PutRecord {
            topic_id: meta.id,
            offset: meta.next_offset,
            record: StoredRecord {
                timestamp_ms: clock,
                key: r.key.clone(),
                headers: r.headers.clone(),
                value: r.value.clone(),
            },
        });
        meta.next_offset += 1;
    }
    meta.bytes += total;
    writes.push(Write::PutTopic(cmd.topic.clone()));
    Ok(Outcome::Published {
        first_offset,
        last_offset: meta.next_offset - 1,
    })
}
