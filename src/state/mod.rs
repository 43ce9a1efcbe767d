//! The replicated state machine: what a topic contains is decided here and nowhere else.
//!
//! Architecture invariant: [`apply_entry`] is a pure function of the in-memory [`SmState`] and
//! one log entry. It reads no clock, no randomness and no environment, and does no I/O; it
//! mutates the state and emits [`Write`]s, which the storage layer turns into one RocksDB write
//! batch. Every replica that applies the same entries to the same state reaches the same state.
//!
//! Time is the leader's wall clock stamped into each entry, clamped so it never goes back:
//! `clock = max(clock, entry.time_ms)`.
//!
//! The types of this module that are serialized ([`LogPayload`], [`Command`], [`StoredRecord`],
//! [`TopicMeta`]) are on disk forever: they are versioned and only ever extended.

mod publish;
mod topics;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use publish::{record_size, NewRecord, Publish, StoredRecord};
pub use topics::{validate_settings, CreateTopic, DeleteTopic, TopicMeta, TopicSettings};

/// Default upper bound on one record (value + key + headers) when a topic sets none.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 1 << 20;
/// The largest `max_record_bytes` a topic may configure.
pub const MAX_RECORD_BYTES_LIMIT: u64 = 16 << 20;

/// The payload of one Raft log entry. The enum tag is the format version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogPayload {
    V1(Batch),
}

/// Many client commands proposed together (group commit): one entry, one fsync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The proposing leader's wall clock, in ms since the Unix epoch.
    pub time_ms: u64,
    pub commands: Vec<Command>,
}

/// One client command. Variants are only ever added at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateTopic(CreateTopic),
    DeleteTopic(DeleteTopic),
    Publish(Publish),
    /// Moves the clock forward and nothing else.
    Tick,
}

impl Command {
    /// Rough encoded size, used by the proposer to bound one entry.
    pub fn approx_bytes(&self) -> usize {
        match self {
            Command::Publish(p) => p.records.iter().map(|r| record_size(r) as usize + 16).sum(),
            _ => 64,
        }
    }
}

/// The outcome of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    TopicCreated,
    /// The topic already existed with the same settings.
    TopicExists,
    TopicDeleted,
    Published {
        first_offset: u64,
        last_offset: u64,
    },
    Ticked,
}

/// Why a command was refused. A refused command changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    #[error("topic {0:?} does not exist")]
    TopicNotFound(String),
    #[error("topic {0:?} already exists with a different configuration")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    RecordTooLarge(String),
}

/// The result of one command.
pub type CommandResult = Result<Outcome, ApplyError>;

/// The last applied entry and its clamped leader time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitPoint {
    pub index: u64,
    pub time_ms: u64,
}

/// What applying one entry answers: one result per command, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    pub commit_point: CommitPoint,
    pub results: Vec<CommandResult>,
}

/// The in-memory part of the state: everything except the records themselves.
/// It is small (one entry per topic) and persisted by the writes apply emits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmState {
    /// The state machine's clock: max of all applied entries' leader times.
    pub clock_ms: u64,
    /// Topic ids are never reused, so a deleted topic's records can never reappear in a
    /// new topic of the same name.
    pub next_topic_id: u64,
    pub topics: BTreeMap<String, TopicMeta>,
}

/// A change to durable state, emitted by apply and executed by the storage layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Persist the current metadata of this topic (from the state after apply).
    PutTopic(String),
    /// Remove a topic and every record it had.
    DeleteTopic { name: String, id: u64 },
    /// Store one record.
    PutRecord {
        topic_id: u64,
        offset: u64,
        record: StoredRecord,
    },
}

/// Applies one normal entry at `index`. Pure: see the module docs.
pub fn apply_entry(
    state: &mut SmState,
    index: u64,
    batch: &Batch,
    writes: &mut Vec<Write>,
) -> ApplyResponse {
    state.clock_ms = state.clock_ms.max(batch.time_ms);
    let results = batch
        .commands
        .iter()
        .map(|cmd| apply_command(state, cmd, writes))
        .collect();
    ApplyResponse {
        commit_point: CommitPoint {
            index,
            time_ms: state.clock_ms,
        },
        results,
    }
}

fn apply_command(state: &mut SmState, cmd: &Command, writes: &mut Vec<Write>) -> CommandResult {
    match cmd {
        Command::CreateTopic(c) => topics::create(state, c, writes),
        Command::DeleteTopic(c) => topics::delete(state, c, writes),
        Command::Publish(c) => publish::publish(state, c, writes),
        Command::Tick => Ok(Outcome::Ticked),
    }
}

#[cfg(test)]
mod tests;
