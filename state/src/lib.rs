//! The replicated state machine: what a topic contains is decided here and nowhere else.
//!
//! Architecture invariant: [`apply_entry`] is a pure function of the in-memory [`SmState`] and
//! one log entry. It reads no clock, no randomness and no environment, and does no I/O; it
//! mutates the state and emits [`Write`]s, which the storage layer turns into one RocksDB write
//! batch. Every replica that applies the same entries to the same state reaches the same state.
//!
//! Time is the leader's wall clock stamped into each entry, clamped so it never goes back:
//! `clock = max(clock, entry.timestamp_ms)`.
//!
//! The types of this module that are serialized ([`LogPayload`], [`Command`], [`StoredRecord`],
//! [`TopicMeta`]) are on disk forever: they are versioned and only ever extended.

pub mod limits;
pub mod producers;
mod publish;
pub mod ranges;
pub mod retention;
pub mod subscriptions;
mod topics;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use producers::{ProducerSeq, ProducerState, Producers};
pub use publish::{
    batch_record, batch_records, encode_records, record_at, record_size, stored_size, Appended,
    BatchRecord, Broadcast, NewRecord, Publish, PublishBatch, RecordAt, StoredRecord,
    COMMAND_FORMAT, HEADER_COMMIT_INDEX, HEADER_COMMIT_TIMESTAMP_MS,
};
pub use subscriptions::{
    CreateSub, Delivery, Pull, Receipt, ReceiptAction, ReceiptOutcome, SetCursor, SettleReceipts,
    Start, SubRef, SubSettings, SubState,
};
pub use topics::{
    validate_settings, CreateTopic, DeleteTopic, TopicCounters, TopicMeta, TopicSettings,
};

pub use limits::{
    is_valid_name, DEFAULT_MAX_RECORD_BYTES, MAX_ACK_TIMEOUT_MS, MAX_NACK_DELAY_MS, MAX_NAME_LEN,
    MAX_PULL, MAX_RECORD_BYTES_LIMIT,
};

/// The payload of one Raft log entry. The enum tag is the format version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogPayload {
    V1(Batch),
}

/// How an entry's payload appears in Raft's logs: its size, never its contents.
impl std::fmt::Display for LogPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogPayload::V1(b) => write!(
                f,
                "v1 batch of {} commands at {} ms",
                b.commands.len(),
                b.timestamp_ms
            ),
        }
    }
}

/// Many client commands proposed together (group commit): one entry, one fsync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The proposing leader's wall clock, in ms since the Unix epoch.
    pub timestamp_ms: u64,
    pub commands: Vec<Command>,
}

/// One client command. Variants are only ever added at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateTopic(CreateTopic),
    DeleteTopic(DeleteTopic),
    Publish(Publish),
    /// Moves the clock forward (so due leases expire and delays end) and nothing else.
    Tick,
    CreateSubscription(CreateSub),
    DeleteSubscription(SubRef),
    Pull(Pull),
    /// Ack, nack or extend.
    SettleReceipts(SettleReceipts),
    SetCursor(SetCursor),
    /// One marker record appended to many topics.
    Broadcast(Broadcast),
    /// A publish whose records are Kafka record batches, as the client sent them.
    PublishBatch(PublishBatch),
}

impl Command {
    /// Rough encoded size, used by the proposer to bound one entry.
    pub fn approx_bytes(&self) -> usize {
        match self {
            Command::Publish(p) => p.records.iter().map(|r| record_size(r) as usize + 16).sum(),
            Command::Broadcast(b) => record_size(&b.record) as usize + 64,
            Command::PublishBatch(p) => p.batches.len() + 64,
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
        /// A re-sent idempotent batch: these are its original offsets; nothing was appended.
        duplicate: bool,
    },
    Ticked,
    SubscriptionCreated,
    /// The subscription already existed with the same settings.
    SubscriptionExists,
    SubscriptionDeleted,
    Pulled(Vec<Delivery>),
    /// One outcome per receipt, in order.
    Receipts(Vec<ReceiptOutcome>),
    CursorSet(u64),
    /// The offset of the marker in each topic.
    Broadcast {
        offsets: BTreeMap<String, u64>,
    },
}

/// Why a command was refused. A refused command changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApplyError {
    #[error("topic {0:?} does not exist")]
    TopicNotFound(String),
    #[error("subscription {1:?} does not exist on topic {0:?}")]
    SubscriptionNotFound(String, String),
    #[error("{0:?} already exists with a different configuration")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    RecordTooLarge(String),
    #[error(
        "producer {producer_id:?} sent batch {got}, but its next batch is {expected}; send the \
         batches in order"
    )]
    SequenceGap {
        producer_id: String,
        expected: u64,
        got: u64,
    },
}

/// The result of one command.
pub type CommandResult = Result<Outcome, ApplyError>;

/// The last applied entry and its clamped leader time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitPoint {
    pub index: u64,
    pub timestamp_ms: u64,
}

/// What applying one entry answers: one result per command, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    pub commit_point: CommitPoint,
    pub results: Vec<CommandResult>,
}

/// The in-memory part of the state: everything except the records themselves.
/// It is small (one entry per topic and per subscription) and persisted by the writes apply
/// emits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmState {
    /// The state machine's clock: max of all applied entries' leader times.
    pub clock_ms: u64,
    /// Topic ids are never reused, so a deleted topic's records can never reappear in a
    /// new topic of the same name.
    pub next_topic_id: u64,
    pub topics: BTreeMap<String, TopicMeta>,
    /// Subscription ids are never reused either: a receipt names one subscription forever.
    pub next_sub_id: u64,
    pub subs: BTreeMap<u64, SubState>,
    /// (topic, name) -> id. Derived from `subs`.
    pub sub_names: BTreeMap<(String, String), u64>,
    /// (due time, subscription id, offset) of every lease expiry and nack delay. Derived
    /// from `subs`.
    pub due: BTreeSet<(u64, u64, u64)>,
    /// Idempotent producers per topic.
    pub producers: Producers,
    /// Node ids that were members and were removed: never to be reused. Maintained from the
    /// membership entries the store applies.
    pub retired_nodes: BTreeSet<u64>,
}

impl SmState {
    /// Inserts a subscription loaded from storage and rebuilds its index entries.
    pub fn restore_sub(&mut self, sub: SubState) {
        for (offset, lease) in &sub.leases {
            self.due.insert((lease.expires_ms, sub.id, *offset));
        }
        for (offset, p) in &sub.pending {
            if p.not_before_ms > self.clock_ms {
                self.due.insert((p.not_before_ms, sub.id, *offset));
            }
        }
        self.sub_names
            .insert((sub.topic.clone(), sub.name.clone()), sub.id);
        self.subs.insert(sub.id, sub);
    }

    /// When the next lease expires, delay ends or record ages out of its topic, if any: the
    /// leader ticks then.
    pub fn next_due(&self) -> Option<u64> {
        let retention = self.topics.values().filter_map(retention::age_due).min();
        match (self.due.first().map(|d| d.0), retention) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The subscription `name` of `topic`.
    pub fn sub(&self, topic: &str, name: &str) -> Option<&SubState> {
        let id = self.sub_names.get(&(topic.to_string(), name.to_string()))?;
        self.subs.get(id)
    }

    /// Subscriptions of `topic`, by name.
    pub fn subs_of<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a SubState> + 'a {
        self.sub_names
            .range((topic.to_string(), String::new())..)
            .take_while(move |((t, _), _)| t == topic)
            .filter_map(|(_, id)| self.subs.get(id))
    }
}

/// Reads a stored record during apply (dead-lettering copies one, retention by bytes and age
/// looks at each). Only what storage holds: apply looks first among the writes of the apply in
/// progress, which are not stored yet.
///
/// `Ok(None)` means the record is not stored. A record that cannot be read or decoded is an
/// `Err`: apply never decides anything from a failed read (one replica would decide
/// differently from the others), it stops instead.
pub trait RecordSource {
    fn stored(&self, topic_id: u64, offset: u64) -> Result<Option<StoredRecord>, ReadFault>;

    /// A record that this apply appended from an earlier entry ([`Appended::Logged`]) and that
    /// is not stored yet: the record at `at`, stamped `timestamp_ms`, read from its entry
    /// (records of the entry being applied are read from it, not from here). An error when
    /// the entry cannot be read.
    fn logged(&self, at: RecordAt, timestamp_ms: u64) -> Result<StoredRecord, String>;
}

/// A record apply needed could not be read from storage, or is missing although the topic's
/// offsets say it exists. The store cannot be trusted: the node must stop, not go on with a
/// guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {offset} of topic id {topic_id} cannot be read during apply: {reason}")]
pub struct ReadFault {
    pub topic_id: u64,
    pub offset: u64,
    pub reason: String,
}

impl ReadFault {
    /// The record must exist (it lies between its topic's first and next offset) but does not.
    pub fn missing(topic_id: u64, offset: u64) -> Self {
        ReadFault {
            topic_id,
            offset,
            reason: "the record is missing although its topic holds that offset".into(),
        }
    }
}

/// Reads a record that must exist, among the writes of this apply (`pending`, newest last)
/// first, then in storage: a missing one is a [`ReadFault`].
pub(crate) fn existing_record(
    source: &dyn RecordSource,
    pending: &[Write],
    topic_id: u64,
    offset: u64,
) -> Result<StoredRecord, ReadFault> {
    match pending_record(pending, topic_id, offset) {
        Some(Appended::Whole(record)) => Ok(record.clone()),
        Some(Appended::Logged { timestamp_ms, at }) => {
            source
                .logged(*at, *timestamp_ms)
                .map_err(|reason| ReadFault {
                    topic_id,
                    offset,
                    reason,
                })
        }
        None => source
            .stored(topic_id, offset)?
            .ok_or_else(|| ReadFault::missing(topic_id, offset)),
    }
}

/// Finds a record among not-yet-stored writes, newest first.
fn pending_record(pending: &[Write], topic_id: u64, offset: u64) -> Option<&Appended> {
    pending.iter().rev().find_map(|w| match w {
        Write::PutRecord {
            topic_id: t,
            offset: o,
            record,
        } if *t == topic_id && *o == offset => Some(record),
        _ => None,
    })
}

/// The records of the entry being applied, read from it; any other through the source.
struct InEntry<'a> {
    source: &'a dyn RecordSource,
    index: u64,
    batch: &'a Batch,
}

impl RecordSource for InEntry<'_> {
    fn stored(&self, topic_id: u64, offset: u64) -> Result<Option<StoredRecord>, ReadFault> {
        self.source.stored(topic_id, offset)
    }

    fn logged(&self, at: RecordAt, timestamp_ms: u64) -> Result<StoredRecord, String> {
        if at.index == self.index {
            record_at(self.batch, at, timestamp_ms)
        } else {
            self.source.logged(at, timestamp_ms)
        }
    }
}

/// A source with nothing stored: records come only from the writes of the apply in progress.
/// For benchmarks and tests of apply alone.
pub struct NothingStored;

impl RecordSource for NothingStored {
    fn stored(&self, _topic_id: u64, _offset: u64) -> Result<Option<StoredRecord>, ReadFault> {
        Ok(None)
    }

    fn logged(&self, at: RecordAt, _timestamp_ms: u64) -> Result<StoredRecord, String> {
        Err(format!("no log holds entry {}", at.index))
    }
}

/// A change to durable state, emitted by apply and executed by the storage layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Persist the current metadata of this topic (from the state after apply).
    PutTopic(String),
    /// Remove a topic and every record it had.
    DeleteTopic { name: String, id: u64 },
    /// Store one record: whole, or, for a published record, as where the Raft log holds it
    /// (the store may keep that instead of the bytes).
    PutRecord {
        topic_id: u64,
        offset: u64,
        record: Appended,
    },
    /// Persist the current state of this subscription.
    PutSub(u64),
    /// Remove a subscription.
    DeleteSub(u64),
    /// Remove the records `from..to` of a topic (retention).
    TrimTopic { topic_id: u64, from: u64, to: u64 },
    /// Persist the current state of this producer.
    PutProducer { topic: String, producer_id: String },
    /// Forget a producer (expired or evicted).
    DeleteProducer { topic: String, producer_id: String },
}

/// Applies one normal entry at `index`. Pure: see the module docs.
///
/// An `Err` is a storage fault met while reading a record: the state and `writes` are then
/// half-applied and must be thrown away (the caller reloads the state from storage and stops).
pub fn apply_entry(
    state: &mut SmState,
    source: &dyn RecordSource,
    index: u64,
    batch: &Batch,
    writes: &mut Vec<Write>,
) -> Result<ApplyResponse, ReadFault> {
    state.clock_ms = state.clock_ms.max(batch.timestamp_ms);
    let source = &InEntry {
        source,
        index,
        batch,
    };
    subscriptions::expire_due(state, source, writes)?;
    state.expire_producers(writes);
    let results = batch
        .commands
        .iter()
        .enumerate()
        .map(|(position, cmd)| {
            let position = u32::try_from(position).ok();
            apply_command(state, source, (index, position), cmd, writes)
        })
        .collect::<Result<_, _>>()?;
    retention::enforce(state, source, writes)?;
    Ok(ApplyResponse {
        commit_point: CommitPoint {
            index,
            timestamp_ms: state.clock_ms,
        },
        results,
    })
}

/// Applies `cmd`, command `at.1` (when it fits a `u32`) of the entry at index `at.0`.
fn apply_command(
    state: &mut SmState,
    source: &dyn RecordSource,
    at: (u64, Option<u32>),
    cmd: &Command,
    writes: &mut Vec<Write>,
) -> Result<CommandResult, ReadFault> {
    Ok(match cmd {
        Command::CreateTopic(c) => topics::create(state, c, writes),
        Command::DeleteTopic(c) => topics::delete(state, c, writes),
        Command::Publish(c) => publish::publish(state, at, c, writes),
        Command::Tick => Ok(Outcome::Ticked),
        Command::CreateSubscription(c) => subscriptions::create(state, c, writes),
        Command::DeleteSubscription(c) => subscriptions::delete(state, c, writes),
        Command::Pull(c) => subscriptions::pull(state, c, writes),
        Command::SettleReceipts(c) => {
            return subscriptions::settle_receipts(state, source, c, writes)
        }
        Command::SetCursor(c) => subscriptions::set_cursor(state, c, writes),
        Command::Broadcast(c) => publish::broadcast(state, at.0, c, writes),
        Command::PublishBatch(c) => publish::publish_batch(state, at, c, writes),
    })
}

#[cfg(test)]
mod producers_tests;
#[cfg(test)]
mod publish_tests;
#[cfg(test)]
mod subscriptions_tests;
#[cfg(test)]
mod tests;
