//! The history of a run: every operation's invoke and completion, Jepsen style.
//!
//! # Model
//! Every client operation is two [`Event`]s: an [`Kind::Invoke`] and a completion that is
//! [`Kind::Ok`] (it happened), [`Kind::Fail`] (it definitely did not happen: a 4xx, or a 503
//! `no_leader`/`shutting_down`) or [`Kind::Info`] (unknown: timeout, reset connection, any other
//! 5xx). Both events carry the [`Op`] (what was asked); an `ok` completion also carries an
//! [`OpResult`] (what the server answered), a `fail`/`info` completion an `error` text.
//!
//! A [`Process`] is one logical, single-threaded client. **A process that sees `info` is
//! retired**: the op may still take effect at any later time, so the process can never again be
//! said to be "between" operations. The worker that drove it takes a fresh number from
//! [`History::next_process`] and carries on. (An [`OpHandle`] dropped without a completion
//! records `info` itself, so the same rule applies to cancelled operations.) The nemesis is the
//! one [`Process::Nemesis`]; its faults are [`Op::Fault`] events.
//!
//! # Recording
//! ```
//! use raftq_jepsen::history::{History, Op, OpResult};
//! let history = History::new();
//! let process = history.next_process();
//! let handle = history.invoke(process, Some(1), Op::publish("q", vec!["v1".into()]));
//! handle.ok(OpResult::publish(0, 1, false)); // first offset 0, one value
//! assert_eq!(history.events().len(), 2);
//! ```
//!
//! # On disk
//! JSON lines, one [`Event`] per line ([`History::write_jsonl`], [`write_jsonl`],
//! [`read_jsonl`]). An event looks like
//! `{"index":0,"time_us":17,"process":3,"node":1,"type":"invoke","f":"publish","value":{"topic":"q","values":["v1"]}}`
//! and its completion
//! `{"index":1,"time_us":950,"process":3,"node":1,"type":"ok","f":"publish","value":{...},"invoke_index":0,"result":{"offsets":[0]}}`.
//! `f`/`value` are the [`Op`] (kebab-case tag); `result` is the [`OpResult`] matching `f`,
//! written without a tag of its own.

mod pairs;
mod record;

pub use pairs::{op_counts, pairs, OpCounts, Pair};
pub use record::{read_jsonl, write_jsonl, History, OpHandle};

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use raftq_client::api::{Message, ReadResponse, ReceiptResult, ReceiptStatus, Record};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Who performed an operation: a client process (a number, never reused) or the nemesis.
///
/// Serialized as the number, or as the string `"nemesis"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    /// One single-threaded logical client. Retired after an `info` completion.
    Client(u64),
    /// The fault injector.
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Client(n) => write!(f, "{n}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(n) => s.serialize_u64(*n),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Process::Client(n)),
            Raw::Word(w) if w == "nemesis" => Ok(Process::Nemesis),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "process must be a number or \"nemesis\", not {w:?}"
            ))),
        }
    }
}

/// The type of an event (serialized as `"type"`, lowercase, as Jepsen does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The operation started.
    Invoke,
    /// It happened; the event carries its [`OpResult`].
    Ok,
    /// It definitely did not happen.
    Fail,
    /// Unknown whether it happened (and it may still happen later).
    Info,
}

/// Start or end of a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Start,
    Stop,
}

/// What an operation asked for (the invoke value). Serialized adjacently tagged:
/// `{"f": "publish", "value": {...}}`, tags in kebab-case.
///
/// Receipts are always recorded together with the value of the record they name, as
/// `(receipt, value)` pairs, so that the checkers never have to guess which record an ack
/// meant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", content = "value", rename_all = "kebab-case")]
pub enum Op {
    /// Publish a batch of values (unique across the run) to `topic`.
    /// Ok result: [`OpResult::Publish`], one offset per value, in order.
    Publish {
        topic: String,
        values: Vec<String>,
        /// Idempotency data, when the batch was sent with it. A value retried after `info`
        /// without idempotency data may legitimately land twice.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        producer_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sequence: Option<u64>,
    },
    /// Leased pull from a subscription. Ok result: [`OpResult::Pull`].
    Pull {
        topic: String,
        subscription: String,
        /// The lease length this pull asked for; `None`: the subscription's (the queue
        /// checker then uses [`crate::checker::queue::QueueOptions::ack_timeout_ms`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_timeout_ms: Option<u64>,
        /// True for the pulls of the final drain (after healing, waiting for a leader and for
        /// every lease to expire). The queue checker counts final and ordinary pulls alike as
        /// deliveries; the flag is for reports and for readers of the history.
        #[serde(default, rename = "final", skip_serializing_if = "std::ops::Not::not")]
        final_drain: bool,
    },
    /// Ack receipts, each paired with the value of the record it names.
    /// Ok result: [`OpResult::Receipts`].
    Ack {
        topic: String,
        subscription: String,
        receipts: Vec<(String, String)>,
    },
    /// Nack (release) receipts, each paired with its record's value.
    /// Ok result: [`OpResult::Receipts`].
    Nack {
        topic: String,
        subscription: String,
        receipts: Vec<(String, String)>,
        #[serde(default)]
        delay_ms: u64,
    },
    /// Extend the leases of receipts, each paired with its record's value.
    /// Ok result: [`OpResult::Receipts`] (with `lease_expires_ms`).
    Extend {
        topic: String,
        subscription: String,
        receipts: Vec<(String, String)>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_timeout_ms: Option<u64>,
    },
    /// Stream read, optionally through a subscription, optionally from an explicit offset
    /// (`None` with a subscription: resume at its cursor). Ok result: [`OpResult::Read`].
    Read {
        topic: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subscription: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<u64>,
    },
    /// Move a subscription's cursor. Ok result: [`OpResult::Cursor`].
    SetCursor {
        topic: String,
        subscription: String,
        offset: u64,
        #[serde(default)]
        allow_backward: bool,
    },
    /// The final read of the whole topic through one node only (no redirects).
    /// Ok result: [`OpResult::Records`].
    FinalRead { topic: String, node: u64 },
    /// A fault, by the nemesis. Ok result: [`OpResult::Fault`].
    Fault {
        name: String,
        phase: Phase,
        #[serde(default)]
        targets: Vec<u64>,
    },
}

impl Op {
    /// A publish without idempotency data.
    pub fn publish(topic: impl Into<String>, values: Vec<String>) -> Op {
        Op::Publish {
            topic: topic.into(),
            values,
            producer_id: None,
            sequence: None,
        }
    }

    /// An ordinary (not final) pull with the subscription's lease length.
    pub fn pull(topic: impl Into<String>, subscription: impl Into<String>) -> Op {
        Op::Pull {
            topic: topic.into(),
            subscription: subscription.into(),
            ack_timeout_ms: None,
            final_drain: false,
        }
    }

    /// A pull of the final drain.
    pub fn final_pull(topic: impl Into<String>, subscription: impl Into<String>) -> Op {
        Op::Pull {
            topic: topic.into(),
            subscription: subscription.into(),
            ack_timeout_ms: None,
            final_drain: true,
        }
    }

    /// An ack of `(receipt, value)` pairs.
    pub fn ack(
        topic: impl Into<String>,
        subscription: impl Into<String>,
        receipts: Vec<(String, String)>,
    ) -> Op {
        Op::Ack {
            topic: topic.into(),
            subscription: subscription.into(),
            receipts,
        }
    }

    /// A stream read.
    pub fn read(topic: impl Into<String>, subscription: Option<&str>, from: Option<u64>) -> Op {
        Op::Read {
            topic: topic.into(),
            subscription: subscription.map(str::to_string),
            from,
        }
    }

    /// A cursor move.
    pub fn set_cursor(
        topic: impl Into<String>,
        subscription: impl Into<String>,
        offset: u64,
        allow_backward: bool,
    ) -> Op {
        Op::SetCursor {
            topic: topic.into(),
            subscription: subscription.into(),
            offset,
            allow_backward,
        }
    }

    /// The final read of `topic` through `node`.
    pub fn final_read(topic: impl Into<String>, node: u64) -> Op {
        Op::FinalRead {
            topic: topic.into(),
            node,
        }
    }

    /// A fault of the nemesis.
    pub fn fault(name: impl Into<String>, phase: Phase, targets: Vec<u64>) -> Op {
        Op::Fault {
            name: name.into(),
            phase,
            targets,
        }
    }

    /// The `f` tag: `"publish"`, `"pull"`, `"ack"`, `"nack"`, `"extend"`, `"read"`,
    /// `"set-cursor"`, `"final-read"`, `"fault"`.
    pub fn f(&self) -> &'static str {
        match self {
            Op::Publish { .. } => "publish",
            Op::Pull { .. } => "pull",
            Op::Ack { .. } => "ack",
            Op::Nack { .. } => "nack",
            Op::Extend { .. } => "extend",
            Op::Read { .. } => "read",
            Op::SetCursor { .. } => "set-cursor",
            Op::FinalRead { .. } => "final-read",
            Op::Fault { .. } => "fault",
        }
    }

    /// The topic the op is about (`None` for faults).
    pub fn topic(&self) -> Option<&str> {
        match self {
            Op::Publish { topic, .. }
            | Op::Pull { topic, .. }
            | Op::Ack { topic, .. }
            | Op::Nack { topic, .. }
            | Op::Extend { topic, .. }
            | Op::Read { topic, .. }
            | Op::SetCursor { topic, .. }
            | Op::FinalRead { topic, .. } => Some(topic),
            Op::Fault { .. } => None,
        }
    }

    /// True for client operations (everything but [`Op::Fault`]).
    pub fn is_client(&self) -> bool {
        !matches!(self, Op::Fault { .. })
    }
}

/// One leased record as a pull returned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub value: String,
    pub offset: u64,
    pub receipt: String,
    pub delivery_count: u32,
    /// Server (leader-stamped) time the lease ends.
    pub lease_expires_ms: u64,
}

impl Delivery {
    /// From an SDK message (a binary value is taken as lossy UTF-8).
    pub fn from_message(m: &Message) -> Delivery {
        Delivery {
            value: String::from_utf8_lossy(&m.value).into_owned(),
            offset: m.offset,
            receipt: m.receipt.clone(),
            delivery_count: m.delivery_count,
            lease_expires_ms: m.lease_expires_ms,
        }
    }
}

/// `(offset, value)` of an SDK record (a binary value is taken as lossy UTF-8).
pub fn record_pair(r: &Record) -> (u64, String) {
    (r.offset, String::from_utf8_lossy(&r.value).into_owned())
}

/// What an `ok` completion carries. Which variant goes with which [`Op`]:
///
/// | op | result |
/// |---|---|
/// | `Publish` | `Publish` |
/// | `Pull` | `Pull` |
/// | `Ack`, `Nack`, `Extend` | `Receipts` |
/// | `Read` | `Read` |
/// | `SetCursor` | `Cursor` |
/// | `FinalRead` | `Records` |
/// | `Fault` | `Fault` |
///
/// Serialized untagged (the op's `f` tells which); [`OpHandle::ok`] panics on a mismatch,
/// since that is a bug in the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum OpResult {
    /// The offsets assigned, one per published value, in order.
    Publish {
        offsets: Vec<u64>,
        /// The server said the batch was a duplicate of an earlier one (idempotency).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// The messages leased.
    Pull { deliveries: Vec<Delivery> },
    /// One result per receipt, in request order (ack: acked/stale; nack: released/
    /// dead_lettered/stale; extend: extended/stale with `lease_expires_ms`).
    Receipts { results: Vec<ReceiptResult> },
    /// A stream read's answer.
    Read {
        /// `(offset, value)` in the order returned.
        records: Vec<(u64, String)>,
        next_offset: u64,
        /// Records below the topic's first offset that the read jumped (retention).
        #[serde(default)]
        skipped: u64,
        /// The subscription's cursor as the server reported it, if it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<u64>,
    },
    /// The cursor after a cursor move.
    Cursor { cursor: u64 },
    /// The whole topic as read through one node.
    Records { records: Vec<(u64, String)> },
    /// What the nemesis did, in words.
    Fault { detail: String },
}

impl OpResult {
    /// A [`OpResult::Publish`] from a publish answer's first offset and batch length.
    pub fn publish(first_offset: u64, count: usize, duplicate: bool) -> OpResult {
        OpResult::Publish {
            offsets: (first_offset..first_offset + count as u64).collect(),
            duplicate,
        }
    }

    /// A [`OpResult::Pull`] from SDK messages.
    pub fn pull(messages: &[Message]) -> OpResult {
        OpResult::Pull {
            deliveries: messages.iter().map(Delivery::from_message).collect(),
        }
    }

    /// A [`OpResult::Read`] from an SDK read answer and the cursor, if known.
    pub fn read(resp: &ReadResponse, cursor: Option<u64>) -> OpResult {
        OpResult::Read {
            records: resp.records.iter().map(record_pair).collect(),
            next_offset: resp.next_offset,
            skipped: resp.skipped,
            cursor,
        }
    }

    /// A [`OpResult::Receipts`] of `(receipt, status)` pairs.
    pub fn receipts(results: Vec<(String, ReceiptStatus)>) -> OpResult {
        OpResult::Receipts {
            results: results
                .into_iter()
                .map(|(receipt, status)| ReceiptResult {
                    receipt,
                    status,
                    lease_expires_ms: None,
                })
                .collect(),
        }
    }

    /// True when this result is the kind `op` completes with.
    pub fn matches(&self, op: &Op) -> bool {
        matches!(
            (op, self),
            (Op::Publish { .. }, OpResult::Publish { .. })
                | (Op::Pull { .. }, OpResult::Pull { .. })
                | (
                    Op::Ack { .. } | Op::Nack { .. } | Op::Extend { .. },
                    OpResult::Receipts { .. }
                )
                | (Op::Read { .. }, OpResult::Read { .. })
                | (Op::SetCursor { .. }, OpResult::Cursor { .. })
                | (Op::FinalRead { .. }, OpResult::Records { .. })
                | (Op::Fault { .. }, OpResult::Fault { .. })
        )
    }

    /// Decodes the untagged JSON of a result for `op`.
    pub fn from_json(op: &Op, value: serde_json::Value) -> serde_json::Result<OpResult> {
        #[derive(Deserialize)]
        struct Publish {
            offsets: Vec<u64>,
            #[serde(default)]
            duplicate: bool,
        }
        #[derive(Deserialize)]
        struct Pull {
            deliveries: Vec<Delivery>,
        }
        #[derive(Deserialize)]
        struct Receipts {
            results: Vec<ReceiptResult>,
        }
        #[derive(Deserialize)]
        struct Read {
            records: Vec<(u64, String)>,
            next_offset: u64,
            #[serde(default)]
            skipped: u64,
            #[serde(default)]
            cursor: Option<u64>,
        }
        #[derive(Deserialize)]
        struct Cursor {
            cursor: u64,
        }
        #[derive(Deserialize)]
        struct Records {
            records: Vec<(u64, String)>,
        }
        #[derive(Deserialize)]
        struct Fault {
            detail: String,
        }
        Ok(match op {
            Op::Publish { .. } => {
                let r: Publish = serde_json::from_value(value)?;
                OpResult::Publish {
                    offsets: r.offsets,
                    duplicate: r.duplicate,
                }
            }
            Op::Pull { .. } => OpResult::Pull {
                deliveries: serde_json::from_value::<Pull>(value)?.deliveries,
            },
            Op::Ack { .. } | Op::Nack { .. } | Op::Extend { .. } => OpResult::Receipts {
                results: serde_json::from_value::<Receipts>(value)?.results,
            },
            Op::Read { .. } => {
                let r: Read = serde_json::from_value(value)?;
                OpResult::Read {
                    records: r.records,
                    next_offset: r.next_offset,
                    skipped: r.skipped,
                    cursor: r.cursor,
                }
            }
            Op::SetCursor { .. } => OpResult::Cursor {
                cursor: serde_json::from_value::<Cursor>(value)?.cursor,
            },
            Op::FinalRead { .. } => OpResult::Records {
                records: serde_json::from_value::<Records>(value)?.records,
            },
            Op::Fault { .. } => OpResult::Fault {
                detail: serde_json::from_value::<Fault>(value)?.detail,
            },
        })
    }
}

/// One event of the history. See the [module docs](self) for the JSON form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Position in the history, 0, 1, 2, … in recording order (which is also time order).
    pub index: u64,
    /// Monotonic microseconds since the [`History`] was created.
    pub time_us: u64,
    pub process: Process,
    /// The node the client talked to (for a completion: the node that answered, when known).
    pub node: Option<u64>,
    pub kind: Kind,
    /// What was asked; a completion repeats its invoke's op.
    pub op: Op,
    /// For completions: the index of the invoke event they complete.
    pub invoke_index: Option<u64>,
    /// For `ok` completions: what the server answered.
    pub result: Option<OpResult>,
    /// For `fail` and `info` completions: why.
    pub error: Option<String>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    index: u64,
    time_us: u64,
    process: Process,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<u64>,
    #[serde(rename = "type")]
    kind: Kind,
    #[serde(flatten)]
    op: &'a Op,
    #[serde(skip_serializing_if = "Option::is_none")]
    invoke_index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a OpResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

#[derive(Deserialize)]
struct EventIn {
    index: u64,
    time_us: u64,
    process: Process,
    #[serde(default)]
    node: Option<u64>,
    #[serde(rename = "type")]
    kind: Kind,
    f: String,
    #[serde(default)]
    value: serde_json::Value,
    #[serde(default)]
    invoke_index: Option<u64>,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EventOut {
            index: self.index,
            time_us: self.time_us,
            process: self.process,
            node: self.node,
            kind: self.kind,
            op: &self.op,
            invoke_index: self.invoke_index,
            result: self.result.as_ref(),
            error: self.error.as_deref(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let raw = EventIn::deserialize(d)?;
        let op: Op = serde_json::from_value(serde_json::json!({"f": raw.f, "value": raw.value}))
            .map_err(D::Error::custom)?;
        let result = match raw.result {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(OpResult::from_json(&op, v).map_err(D::Error::custom)?),
        };
        Ok(Event {
            index: raw.index,
            time_us: raw.time_us,
            process: raw.process,
            node: raw.node,
            kind: raw.kind,
            op,
            invoke_index: raw.invoke_index,
            result,
            error: raw.error,
        })
    }
}

impl Event {
    /// True for an invoke.
    pub fn is_invoke(&self) -> bool {
        self.kind == Kind::Invoke
    }
}

#[cfg(test)]
mod tests;
