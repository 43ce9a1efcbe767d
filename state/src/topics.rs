//! Topic commands: create and delete.

use serde::{Deserialize, Serialize};

use super::{
    ApplyError, CommandResult, Outcome, SmState, Write, DEFAULT_MAX_RECORD_BYTES,
    MAX_RECORD_BYTES_LIMIT,
};

/// A topic's settings as stored (the on-disk twin of the API's `TopicConfig`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSettings {
    pub max_age_ms: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_records: Option<u64>,
    pub max_record_bytes: Option<u64>,
    /// Remove records below the cursor of every subscription (work queues).
    pub until_acked: bool,
}

impl TopicSettings {
    /// Whether any retention rule applies.
    pub fn has_retention(&self) -> bool {
        self.max_age_ms.is_some()
            || self.max_bytes.is_some()
            || self.max_records.is_some()
            || self.until_acked
    }

    /// The largest record this topic accepts.
    pub fn effective_max_record_bytes(&self) -> u64 {
        self.max_record_bytes.unwrap_or(DEFAULT_MAX_RECORD_BYTES)
    }
}

/// What the state machine knows about one topic. Records live in storage, keyed by
/// `(id, offset)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Unique for the life of the cluster; never reused after a delete.
    pub id: u64,
    pub settings: TopicSettings,
    /// Lowest offset still stored (records below it were removed by retention).
    pub first_offset: u64,
    /// The offset the next record gets; dense, never reused.
    pub next_offset: u64,
    /// Bytes of the stored records, as [`super::record_size`] counts them.
    pub bytes: u64,
    /// Leader time of the entry that created the topic.
    pub created_ms: u64,
    pub counters: TopicCounters,
    /// Timestamp of the record at `first_offset` (meaningless while the topic is empty):
    /// what the age rule of retention looks at.
    pub first_timestamp_ms: u64,
}

/// Cumulative counters of a topic; they never decrease.
///
/// `published == records() + discarded_retention` at every commit point: retention is the
/// only way a record leaves a topic. Records a subscription discards stay in the topic for
/// the others; they are counted here too (summed over the topic's subscriptions, including
/// deleted ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicCounters {
    /// Records appended: published, dead letters moved in, broadcast markers.
    pub published: u64,
    /// Records of re-sent idempotent batches answered as duplicates.
    pub deduplicated: u64,
    pub discarded_retention: u64,
    pub discarded_max_deliveries: u64,
    /// Nacked with `dead_letter` where there is no dead-letter topic.
    pub discarded_rejected: u64,
}

impl TopicMeta {
    /// Number of records still stored.
    pub fn records(&self) -> u64 {
        self.next_offset - self.first_offset
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopic {
    pub name: String,
    pub settings: TopicSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteTopic {
    pub name: String,
}

/// Validates settings that apply must refuse even if the API layer let them through.
pub fn validate_settings(settings: &TopicSettings) -> Result<(), ApplyError> {
    if let Some(n) = settings.max_record_bytes {
        if n == 0 || n > MAX_RECORD_BYTES_LIMIT {
            return Err(ApplyError::InvalidArgument(format!(
                "max_record_bytes must be between 1 and {MAX_RECORD_BYTES_LIMIT}, not {n}"
            )));
        }
    }
    for (field, value) in [
        ("retention.max_age_ms", settings.max_age_ms),
        ("retention.max_bytes", settings.max_bytes),
        ("retention.max_records", settings.max_records),
    ] {
        if value == Some(0) {
            return Err(ApplyError::InvalidArgument(format!(
                "{field} must be at least 1 (omit it for no limit)"
            )));
        }
    }
    Ok(())
}

pub(super) fn create(
    state: &mut SmState,
    cmd: &CreateTopic,
    writes: &mut Vec<Write>,
) -> CommandResult {
    if !crate::limits::is_valid_name(&cmd.name) {
        return Err(ApplyError::InvalidArgument(format!(
            "invalid topic name {:?}",
            cmd.name
        )));
    }
    validate_settings(&cmd.settings)?;
    if let Some(existing) = state.topics.get(&cmd.name) {
        return if existing.settings == cmd.settings {
            Ok(Outcome::TopicExists)
        } else {
            Err(ApplyError::AlreadyExists(cmd.name.clone()))
        };
    }
    let id = state.next_topic_id;
    state.next_topic_id += 1;
    state.topics.insert(
        cmd.name.clone(),
        TopicMeta {
            id,
            settings: cmd.settings,
            first_offset: 0,
            next_offset: 0,
            bytes: 0,
            created_ms: state.clock_ms,
            counters: TopicCounters::default(),
            first_timestamp_ms: 0,
        },
    );
    writes.push(Write::PutTopic(cmd.name.clone()));
    Ok(Outcome::TopicCreated)
}

pub(super) fn delete(
    state: &mut SmState,
    cmd: &DeleteTopic,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let meta = state
        .topics
        .remove(&cmd.name)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.name.clone()))?;
    let subs: Vec<u64> = state.subs_of(&cmd.name).map(|s| s.id).collect();
    for id in subs {
        super::subscriptions::remove(state, id, writes);
    }
    state.producers.remove_topic(&cmd.name);
    writes.push(Write::DeleteTopic {
        name: cmd.name.clone(),
        id: meta.id,
    });
    Ok(Outcome::TopicDeleted)
}
