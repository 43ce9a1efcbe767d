//! The queue checker: publish, pull, ack (CHECKERS.md, "Queue workload").
//!
//! Values are unique across the run. Per topic, `attempts` are the values of invoked
//! publishes and `acknowledged` those of `ok` publishes. Per (topic, subscription),
//! `delivered` is the multiset of values returned by `ok` [`Op::Pull`]s, **ordinary and final
//! alike**: the final drain is the set of pulls marked `final` ([`Op::final_pull`]), made after
//! healing every fault, waiting for a leader and for every lease to expire. [`Op::FinalRead`]s
//! (reads of the log) are not deliveries and are ignored here.
//!
//! | anomaly | definition | makes the history invalid |
//! |---|---|---|
//! | `lost` | acknowledged on a topic, and on one of its subscriptions never acked (no `ok` ack answered `acked` for a receipt of it) nor dead-lettered (no `ok` nack answered `dead_lettered`, and it was not seen on the dead-letter topic), after the final drain (every subscription seen in a pull must settle every acknowledged value; a topic with acknowledged values but no pulls at all loses them all). A value whose only ack or nack had an unknown outcome is `ack_unknown` instead | yes |
//! | `never_delivered` | the old, weaker `lost`: acknowledged, never delivered on one of its subscriptions (each one is also `lost`) | no (counted in `lost`) |
//! | `ack_unknown` | acknowledged, neither acked nor dead-lettered by an `ok` answer, but an ack or nack of the receipt of its last delivery had an unknown outcome (`info`): it may have been acked (it was never delivered again). The server's count of acks settles how many were ([`check_ack_count`]) | no |
//! | `unexpected` | delivered, never attempted on that topic | yes |
//! | `duplicated` | delivered more than once on one subscription (redeliveries after expiry or nack are allowed); `extra_deliveries` counts the surplus | no |
//! | `recovered` | delivered, but no publish of it was `ok` and one was `info` (or never completed) | no |
//! | `aborted_read` | delivered, but every publish of it `fail`ed | yes |
//! | `delivery_after_ack` | a pull invoked after an `ok` ack answered `acked` for a record returned that record | yes |
//! | `double_ack` | two `ok` acks answered `acked` for one record | yes |
//! | `lease_overlap` | two deliveries (different receipts) of one record whose leases overlap by server time | no |
//! | `appended_twice` | one value at two offsets of a topic (seen in deliveries or in a final read): a publish applied twice, which idempotent producers must never cause | yes |
//! | `early_redelivery` | a record delivered again, by another pull, while an earlier delivery's lease had not run out in real time: the later pull completed before the earlier pull's invoke + its lease × [`CLOCK_RATE`] − [`CLOCK_MARGIN_MS`] (an `ok` extend answered `extended` moves that end to its own invoke + its lease × [`CLOCK_RATE`]), and the earlier receipt was neither nacked (by a nack invoked before, whatever its outcome) nor acked (that is `delivery_after_ack`) | yes |
//! | `early_retention` | on the topic with retention by age ([`QueueOptions::retention`]), an acknowledged value missing from an `ok` final read through some node that completed before the value's first publish was invoked + the maximum age × [`CLOCK_RATE`] − [`CLOCK_MARGIN_MS`]: retention deleted it early | yes |
//!
//! # Real time
//! The last two compare the server's time with the harness's: a lease or a record's age ends
//! when the state machine's clock (the leader's stamps) says so, and the server promises that
//! this clock runs at most 1 % faster than real time, whatever one node's wall clock does. So
//! in real time a lease of `T` ms granted by a pull invoked at `i` cannot end before
//! `i + 0.99 T` (the grant is stamped after the invoke), give or take the few milliseconds by
//! which the nodes' estimates of the time differ ([`CLOCK_MARGIN_MS`]); likewise a record
//! cannot be old enough to delete before `0.99 × max_age` after its publish was invoked. Times
//! are the history's (one monotonic clock), so the harness's own wall clock does not matter.
//!
//! A lease is `[lease_expires_ms - ack_timeout, lease_expires_ms]`, where ack_timeout is the
//! pull's `ack_timeout_ms`, or else [`QueueOptions::ack_timeout_ms`] (the subscription's). An
//! `ok` extend answered `extended` moves the end to its `lease_expires_ms`; a delivery `ok`
//! nacked (`released`/`dead_lettered`) ended early at an unknown server time and is not
//! compared as the earlier lease. A backward cursor move (`allow_backward`, not `fail`ed) on
//! the subscription that may have happened between an ack and a later delivery or second ack
//! excuses them (a seek forgets done marks).
//!
//! # Settled values
//! A leased queue promises more than delivery: a delivered record stays the subscription's until
//! it is acked or dead-lettered, so an acknowledged value that was delivered once, never acked,
//! and never delivered again (not even by the final drain, which acks everything it pulls) was
//! lost by the queue. Only definite answers settle a value: an `ok` ack whose result for the
//! receipt is `acked`, an `ok` nack whose result is `dead_lettered`, or the value itself on the
//! subscriptions' dead-letter topic ([`QueueOptions::dead_letter_topic`]; pulls and final reads
//! of that topic are not checked as deliveries of their own). An ack answered `stale`, a nack
//! answered `released`, and any `fail`ed ack settle nothing. An ack or nack whose outcome is
//! unknown may have settled the value on the server without the history ever knowing; such a
//! value, unless a definite answer settles it, is counted as `ack_unknown` rather than `lost`
//! (the workloads retry such acks, so that an answer usually decides), provided the unknown
//! outcome belongs to its last delivery: a record delivered again after an ack was not settled
//! by that ack. How many of them the server really acked is then decided by its own count of
//! acks after the final drain ([`check_ack_count`]), which the chaos run compares.
//!
//! # Modules
//! - `walk`: one pass over the history, gathering what each op says about values, deliveries,
//!   acks, nacks, extends and cursor moves.
//! - `values`: per value: one value at two offsets (`appended_twice`), and whether every
//!   acknowledged value was settled on every subscription (`lost`, `never_delivered`,
//!   `ack_unknown`).
//! - `deliveries`: per delivered record: `unexpected`, `recovered`, `aborted_read`,
//!   `duplicated`, `delivery_after_ack`, `double_ack`.
//! - `leases`: the lease and real-time checks: `early_redelivery`, `lease_overlap`,
//!   `early_retention`.
//!
//! [`Op::Pull`]: crate::history::Op::Pull
//! [`Op::final_pull`]: crate::history::Op::final_pull
//! [`Op::FinalRead`]: crate::history::Op::FinalRead

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{Anomaly, Verdict};
use crate::history::{op_counts, pairs, Event, OpCounts};

mod deliveries;
mod leases;
mod values;
mod walk;

/// The slowest real time may pass against the server's time: its clock runs at most 1 %
/// faster than real time (so a span of server time `t` lasts at least `0.99 t` in real time).
pub const CLOCK_RATE: f64 = 0.99;
/// Slack for the few milliseconds by which the nodes' estimates of the time differ, and for
/// the harness's own scheduling, in the real-time checks.
pub const CLOCK_MARGIN_MS: u64 = 100;

/// Parameters of the queue checker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOptions {
    /// Lease length of pulls that did not name one (the subscription's `ack_timeout_ms`).
    pub ack_timeout_ms: u64,
    /// The subscriptions' dead-letter topic, when the workload gives them one: a value pulled
    /// or read from it was dead-lettered (settled, not lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// A topic with retention by age that the workload publishes to and reads at the end, but
    /// never pulls: judged by `early_retention` only (its values are not expected in any
    /// subscription, and may legitimately go once they are old enough).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionTopic>,
}

/// A topic with retention by age (`retention.max_age_ms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionTopic {
    pub topic: String,
    pub max_age_ms: u64,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            ack_timeout_ms: raftq_client::api::DEFAULT_ACK_TIMEOUT_MS,
            dead_letter_topic: None,
            retention: None,
        }
    }
}

/// The earliest real time (history µs) a span of `ms` of server time that began no earlier
/// than `from_us` can have ended, less the margin.
fn real_end_us(from_us: u64, ms: u64) -> u64 {
    let span_us = (ms as f64 * 1000.0 * CLOCK_RATE) as u64;
    (from_us + span_us).saturating_sub(CLOCK_MARGIN_MS * 1000)
}

/// What the queue checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueReport {
    /// No anomaly that must not happen happened.
    pub valid: bool,
    /// Client operations by outcome.
    pub counts: OpCounts,
    /// Size of the `attempts` multiset (values of invoked publishes, retries included).
    pub attempts: u64,
    /// Distinct values acknowledged (`ok` publishes).
    pub acknowledged: u64,
    /// Size of the `delivered` multiset (every delivery, every subscription).
    pub delivered: u64,
    /// Deliveries made by the final drain.
    pub final_deliveries: u64,
    /// Distinct (subscription, value) delivered.
    pub delivered_distinct: u64,
    /// Deliveries beyond the first of each (subscription, value).
    pub extra_deliveries: u64,
    /// Distinct (subscription, acknowledged value) acked by an `ok` ack answered `acked`.
    #[serde(default)]
    pub acked: u64,
    /// Distinct (subscription, acknowledged value) dead-lettered.
    #[serde(default)]
    pub dead_lettered: u64,
    /// Distinct (subscription, value) of every delivered record, acknowledged or not, acked by
    /// an `ok` ack answered `acked` ([`check_ack_count`]).
    #[serde(default)]
    pub acked_records: u64,
    /// Distinct (subscription, value) of delivered records not acked by a definite answer, not
    /// dead-lettered, and named by an ack with an unknown outcome ([`check_ack_count`]).
    #[serde(default)]
    pub ack_unknown_records: u64,
    pub lost: Anomaly,
    #[serde(default)]
    pub never_delivered: Anomaly,
    #[serde(default)]
    pub ack_unknown: Anomaly,
    pub unexpected: Anomaly,
    pub duplicated: Anomaly,
    pub recovered: Anomaly,
    pub aborted_read: Anomaly,
    pub delivery_after_ack: Anomaly,
    pub double_ack: Anomaly,
    pub lease_overlap: Anomaly,
    #[serde(default)]
    pub appended_twice: Anomaly,
    #[serde(default)]
    pub early_redelivery: Anomaly,
    #[serde(default)]
    pub early_retention: Anomaly,
    /// Redeliveries compared with an earlier lease in real time.
    #[serde(default)]
    pub redeliveries_timed: u64,
    /// (acknowledged value, final read) pairs of the retention topic judged; values that were
    /// missing from a read but old enough to have gone.
    #[serde(default)]
    pub retention_checked: u64,
    #[serde(default)]
    pub retention_expired: u64,
}

impl QueueReport {
    fn table(&self) -> [(&'static str, &Anomaly, bool); 13] {
        [
            ("lost", &self.lost, true),
            ("never_delivered", &self.never_delivered, false),
            ("ack_unknown", &self.ack_unknown, false),
            ("unexpected", &self.unexpected, true),
            ("duplicated", &self.duplicated, false),
            ("recovered", &self.recovered, false),
            ("aborted_read", &self.aborted_read, true),
            ("delivery_after_ack", &self.delivery_after_ack, true),
            ("double_ack", &self.double_ack, true),
            ("lease_overlap", &self.lease_overlap, false),
            ("appended_twice", &self.appended_twice, true),
            ("early_redelivery", &self.early_redelivery, true),
            ("early_retention", &self.early_retention, true),
        ]
    }

    /// The one-line summary for a results table.
    pub fn verdict(&self, scenario: &str) -> Verdict {
        Verdict::new("queue", scenario, self.counts, &self.table())
    }
}

/// How a value's publishes ended, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum PubOutcome {
    Ok,
    Info,
    Fail,
}

struct DeliveryRec {
    pull_invoke: u64,
    pull_complete: u64,
    /// History times (µs) of the pull's invoke and completion.
    pull_invoke_us: u64,
    pull_complete_us: u64,
    /// The lease length the pull got (ms).
    lease_ms: u64,
    offset: u64,
    receipt: String,
    delivery_count: u32,
    lease_start: u64,
    lease_end: u64,
    final_drain: bool,
}

struct AckRec {
    invoke: u64,
    complete: u64,
    receipt: String,
}

type SubKey = (String, String);
type RecKey = (String, String, String);

/// What the history says, gathered in one pass over it (`walk`); the checks read it.
struct Seen {
    /// (topic, value) -> best publish outcome and the invokes.
    published: HashMap<(String, String), (PubOutcome, Vec<u64>)>,
    /// Topic -> values of its `ok` publishes.
    acknowledged: BTreeMap<String, BTreeSet<String>>,
    /// Every (topic, subscription) pulled.
    subscriptions: BTreeSet<SubKey>,
    /// (topic, subscription, value) -> every delivery of it.
    deliveries: BTreeMap<RecKey, Vec<DeliveryRec>>,
    /// (topic, subscription, value) -> its `ok` acks answered `acked`.
    acks: BTreeMap<RecKey, Vec<AckRec>>,
    /// Receipts nacked (`released` or `dead_lettered`).
    released: BTreeSet<String>,
    /// (topic, subscription, value) dead-lettered by an `ok` nack.
    dead: BTreeSet<RecKey>,
    /// Values seen on the dead-letter topic.
    dead_letter_values: BTreeSet<String>,
    /// (topic, subscription, receipt) named by an ack or nack with an unknown outcome, with
    /// the invokes of those ops and whether one of them was an ack.
    in_doubt: BTreeMap<RecKey, (Vec<u64>, bool)>,
    /// Receipt -> the latest lease end (server time) an `ok` extend answered `extended` gave.
    extended: HashMap<String, u64>,
    /// Backward cursor moves per subscription: (invoke, complete).
    seeks: HashMap<SubKey, Vec<(u64, u64)>>,
    /// (topic, value) -> offsets it was seen at (deliveries and final reads), and where.
    offsets_of: BTreeMap<(String, String), (BTreeSet<u64>, Vec<u64>)>,
    /// Real-time bounds of leases: receipts acked (`ok`, `acked`), the earliest invoke of a
    /// nack of each receipt that may have released it, and the real-time end of each receipt's
    /// lease as moved by extends.
    acked_receipts: HashSet<String>,
    nacked_at: HashMap<String, u64>,
    extended_until_us: HashMap<String, u64>,
    /// The retention topic: value -> (acknowledged, earliest publish invoke µs, publish
    /// invokes); its final reads: (node, completion µs, completion index, values).
    aged: BTreeMap<String, (bool, u64, Vec<u64>)>,
    aged_reads: Vec<(u64, u64, u64, HashSet<String>)>,
}

impl Seen {
    /// A seek on `sub` may have happened after event `after` (an invoke) and before `before`
    /// (a completion).
    fn seek_between(&self, sub: &SubKey, after: u64, before: u64) -> bool {
        self.seeks
            .get(sub)
            .is_some_and(|v| v.iter().any(|&(i, c)| i < before && c > after))
    }

    /// The unknown-outcome acks and nacks of the last delivery of a record (the one with the
    /// highest delivery count): only those may have settled it without a definite answer, since
    /// a record settled is never delivered again. With whether one of them was an ack.
    fn doubt_of(&self, key: &RecKey) -> Option<&(Vec<u64>, bool)> {
        let last = self
            .deliveries
            .get(key)?
            .iter()
            .max_by_key(|d| d.delivery_count)?;
        self.in_doubt
            .get(&(key.0.clone(), key.1.clone(), last.receipt.clone()))
    }
}

/// Judges a queue-workload history.
pub fn check(events: &[Event], opts: &QueueOptions) -> QueueReport {
    let pairs = pairs(events);
    let mut report = QueueReport {
        counts: op_counts(events),
        ..QueueReport::default()
    };
    let seen = walk::walk(&pairs, opts, &mut report);
    values::appended_twice(&seen, &mut report);
    values::settled(&seen, &mut report);
    deliveries::judge(&seen, &mut report);
    leases::early_retention(&seen, opts, &mut report);

    let Seen {
        acknowledged,
        deliveries,
        acks,
        dead,
        ..
    } = &seen;
    report.acknowledged = acknowledged.values().map(|v| v.len() as u64).sum();
    // Every record, acknowledged or not: what the server's count of acks must come to.
    report.acked_records = acks.len() as u64;
    report.ack_unknown_records = deliveries
        .keys()
        .filter(|key| !acks.contains_key(*key) && !dead.contains(*key))
        .filter(|key| seen.doubt_of(key).is_some_and(|(_, by_ack)| *by_ack))
        .count() as u64;
    report.valid = report
        .table()
        .iter()
        .all(|(_, a, fatal)| !*fatal || a.is_empty());
    report
}

/// The server's own count of acks against the history's, after a complete final drain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckCount {
    /// The subscription's `acked` counter as the server reported it after the drain.
    pub server_acked: u64,
    /// Records the history shows acked by a definite answer: the least the server can count.
    pub acked_records: u64,
    /// Records whose only acks had unknown outcomes.
    pub ack_unknown_records: u64,
    /// Of those, how many the server did not count as acked: acknowledged records it lost.
    pub lost: u64,
    /// What the numbers say, in words.
    pub detail: String,
}

/// Settles the `ack_unknown` records by the server's count of acks (one subscription, no
/// nacks, no cursor moves, no retention: the queue workload). Each of them either was acked by
/// an ack whose answer never came, or was never acked; a record never acked comes again when
/// its lease expires, and a complete final drain acks everything it pulls with a definite
/// answer, so after it every record the server still holds as not acked would be in the
/// drain's `ok` acks. Hence a correct server's `acked` counter is exactly `acked_records +
/// ack_unknown_records`; a smaller one means that many records whose ack was in doubt were
/// neither acked nor delivered again: lost. (A larger one is counted twice somewhere; it says
/// nothing about loss and is only described.)
pub fn check_ack_count(report: &QueueReport, server_acked: u64) -> AckCount {
    let (known, unknown) = (report.acked_records, report.ack_unknown_records);
    let expected = known + unknown;
    let lost = expected.saturating_sub(server_acked).min(unknown);
    let detail = if server_acked == expected {
        format!(
            "the server counts {server_acked} acked records: the {known} acked by definite \
             answers and all {unknown} whose ack had an unknown outcome"
        )
    } else if server_acked < known {
        format!(
            "the server counts {server_acked} acked records, fewer than the {known} its own \
             definite answers acked"
        )
    } else if server_acked < expected {
        format!(
            "the server counts {server_acked} acked records: {known} acked by definite \
             answers, so only {} of the {unknown} whose ack had an unknown outcome; {lost} \
             were never acked and never delivered again",
            server_acked - known
        )
    } else {
        format!(
            "the server counts {server_acked} acked records, more than the {expected} the \
             history can account for"
        )
    };
    AckCount {
        server_acked,
        acked_records: known,
        ack_unknown_records: unknown,
        lost,
        detail,
    }
}

#[cfg(test)]
mod tests;
