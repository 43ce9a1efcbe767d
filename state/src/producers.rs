//! Idempotent producers: per (topic, producer id), the next expected batch sequence and the
//! offsets of the producer's most recent batches.
//!
//! Rules (checked in the same entry that appends the records, so the check and the append
//! commit together):
//! - `sequence == expected`: the batch is appended and `expected` becomes `sequence + 1`.
//! - `sequence < expected`: a re-send. Within the last [`REMEMBERED_BATCHES`] batches it is
//!   answered with the original offsets (`duplicate`); older than that, with
//!   [`ApplyError::AlreadyExists`] (committed long ago, offsets no longer known). Either way
//!   nothing is appended.
//! - `sequence > expected`: [`ApplyError::SequenceGap`]; nothing changes.
//!
//! A producer the state machine does not know expects sequence 0.
//!
//! Bounded state: a producer is forgotten once it has not published for
//! [`PRODUCER_IDLE_EXPIRY_MS`] of log time, and when a topic holds more than
//! [`MAX_PRODUCERS_PER_TOPIC`] producers, the least recently active one is forgotten. Both
//! are decided from the entry clock only, so every replica forgets the same producers at the
//! same entry.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{ApplyError, SmState, Write};

/// How many of a producer's latest batches keep their offsets for duplicate answers.
pub const REMEMBERED_BATCHES: usize = 64;
/// A producer idle this long (log time) is forgotten: 7 days.
pub const PRODUCER_IDLE_EXPIRY_MS: u64 = 7 * 24 * 60 * 60 * 1000;
/// Most producers remembered per topic; beyond it the least recently active is forgotten.
pub const MAX_PRODUCERS_PER_TOPIC: usize = 10_000;

/// The idempotency data of one publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerSeq {
    pub producer_id: String,
    pub sequence: u64,
}

/// One remembered batch: its sequence and offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOffsets {
    pub sequence: u64,
    pub first_offset: u64,
    pub last_offset: u64,
}

/// What the state machine keeps per producer and topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    pub next_sequence: u64,
    /// Log time of its last appended batch.
    pub last_active_ms: u64,
    /// Its latest batches, oldest first, at most [`REMEMBERED_BATCHES`].
    pub recent: Vec<BatchOffsets>,
}

/// All producers, with the index that decides which to forget.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Producers {
    pub by_key: BTreeMap<(String, String), ProducerState>,
    /// (last active, topic, producer id): oldest first.
    by_age: BTreeSet<(u64, String, String)>,
    /// Producers per topic.
    counts: BTreeMap<String, usize>,
}

/// What a publish with idempotency data must do.
pub enum Check {
    /// Append, then call [`Producers::record`].
    Append,
    /// Already appended: answer these offsets.
    Duplicate { first_offset: u64, last_offset: u64 },
}

impl Producers {
    /// Adds a producer loaded from storage.
    pub fn restore(&mut self, topic: String, producer_id: String, state: ProducerState) {
        self.by_age
            .insert((state.last_active_ms, topic.clone(), producer_id.clone()));
        *self.counts.entry(topic.clone()).or_default() += 1;
        self.by_key.insert((topic, producer_id), state);
    }

    /// The state of one producer.
    pub fn get(&self, topic: &str, producer_id: &str) -> Option<&ProducerState> {
        self.by_key
            .get(&(topic.to_string(), producer_id.to_string()))
    }

    /// Number of producers remembered for `topic`.
    pub fn count(&self, topic: &str) -> usize {
        self.counts.get(topic).copied().unwrap_or(0)
    }

    /// Decides what a publish of `topic` with `seq` does. Changes nothing.
    pub fn check(&self, topic: &str, seq: &ProducerSeq) -> Result<Check, ApplyError> {
        let expected = self
            .get(topic, &seq.producer_id)
            .map_or(0, |p| p.next_sequence);
        if seq.sequence == expected {
            return Ok(Check::Append);
        }
        if seq.sequence > expected {
            return Err(ApplyError::SequenceGap {
                producer_id: seq.producer_id.clone(),
                expected,
                got: seq.sequence,
            });
        }
        let known = self.get(topic, &seq.producer_id).and_then(|p| {
            p.recent
                .iter()
                .find(|b| b.sequence == seq.sequence)
                .copied()
        });
        match known {
            Some(b) => Ok(Check::Duplicate {
                first_offset: b.first_offset,
                last_offset: b.last_offset,
            }),
            None => Err(ApplyError::AlreadyExists(format!(
                "batch {} of producer {:?} on topic {topic:?} was committed long ago (the \
                 producer is at batch {expected}); its offsets are no longer remembered (the \
                 last {REMEMBERED_BATCHES} batches are)",
                seq.sequence, seq.producer_id
            ))),
        }
    }

    /// Records an appended batch at log time `now`.
    pub fn record(
        &mut self,
        topic: &str,
        seq: &ProducerSeq,
        batch: BatchOffsets,
        now: u64,
        writes: &mut Vec<Write>,
    ) {
        let key = (topic.to_string(), seq.producer_id.clone());
        match self.by_key.get_mut(&key) {
            Some(p) => {
                self.by_age
                    .remove(&(p.last_active_ms, key.0.clone(), key.1.clone()));
                p.next_sequence = seq.sequence + 1;
                p.last_active_ms = p.last_active_ms.max(now);
                if p.recent.len() >= REMEMBERED_BATCHES {
                    p.recent.remove(0);
                }
                p.recent.push(batch);
                self.by_age
                    .insert((p.last_active_ms, key.0.clone(), key.1.clone()));
            }
            None => {
                self.restore(
                    key.0.clone(),
                    key.1.clone(),
                    ProducerState {
                        next_sequence: seq.sequence + 1,
                        last_active_ms: now,
                        recent: vec![batch],
                    },
                );
                if self.count(topic) > MAX_PRODUCERS_PER_TOPIC {
                    self.evict_oldest_of(topic, writes);
                }
            }
        }
        writes.push(Write::PutProducer {
            topic: key.0,
            producer_id: key.1,
        });
    }

    fn remove(&mut self, topic: &str, producer_id: &str) -> Option<ProducerState> {
        let state = self
            .by_key
            .remove(&(topic.to_string(), producer_id.to_string()))?;
        self.by_age.remove(&(
            state.last_active_ms,
            topic.to_string(),
            producer_id.to_string(),
        ));
        if let Some(n) = self.counts.get_mut(topic) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(topic);
            }
        }
        Some(state)
    }

    /// Forgets the least recently active producer of `topic` (ties: lowest id).
    fn evict_oldest_of(&mut self, topic: &str, writes: &mut Vec<Write>) {
        let oldest = self
            .by_age
            .iter()
            .find(|(_, t, _)| t == topic)
            .map(|(_, _, p)| p.clone());
        if let Some(producer_id) = oldest {
            self.remove(topic, &producer_id);
            writes.push(Write::DeleteProducer {
                topic: topic.to_string(),
                producer_id,
            });
        }
    }

    /// Forgets every producer idle for [`PRODUCER_IDLE_EXPIRY_MS`] at log time `now`.
    pub fn expire(&mut self, now: u64, writes: &mut Vec<Write>) {
        while let Some((last, topic, producer_id)) = self.by_age.first().cloned() {
            if last.saturating_add(PRODUCER_IDLE_EXPIRY_MS) > now {
                break;
            }
            self.remove(&topic, &producer_id);
            writes.push(Write::DeleteProducer { topic, producer_id });
        }
    }

    /// Forgets every producer of a deleted topic (storage removes them with the topic).
    pub fn remove_topic(&mut self, topic: &str) {
        let ids: Vec<String> = self
            .by_key
            .range((topic.to_string(), String::new())..)
            .take_while(|((t, _), _)| t == topic)
            .map(|((_, p), _)| p.clone())
            .collect();
        for producer_id in ids {
            self.remove(topic, &producer_id);
        }
    }
}

/// Checks the idempotency fields of a publish.
pub fn validate(seq: &ProducerSeq) -> Result<(), ApplyError> {
    if !crate::limits::is_valid_name(&seq.producer_id) {
        return Err(ApplyError::InvalidArgument(format!(
            "producer_id must be 1 to 128 characters of A-Z a-z 0-9 . _ -, not {:?}",
            seq.producer_id
        )));
    }
    Ok(())
}

impl SmState {
    /// Forgets producers whose time is up (runs before every entry's commands).
    pub(super) fn expire_producers(&mut self, writes: &mut Vec<Write>) {
        let now = self.clock_ms;
        self.producers.expire(now, writes);
    }
}
