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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use raftq_client::api::ReceiptStatus;
use serde::{Deserialize, Serialize};

use super::{Anomaly, Finding, Verdict};
use crate::history::{op_counts, pairs, Event, Kind, Op, OpCounts, OpResult};

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

/// Judges a queue-workload history.
pub fn check(events: &[Event], opts: &QueueOptions) -> QueueReport {
    let pairs = pairs(events);
    let mut report = QueueReport {
        counts: op_counts(events),
        ..QueueReport::default()
    };

    // (topic, value) -> best publish outcome and the invokes.
    let mut published: HashMap<(String, String), (PubOutcome, Vec<u64>)> = HashMap::new();
    let mut acknowledged: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut subscriptions: BTreeSet<SubKey> = BTreeSet::new();
    let mut deliveries: BTreeMap<RecKey, Vec<DeliveryRec>> = BTreeMap::new();
    let mut acks: BTreeMap<RecKey, Vec<AckRec>> = BTreeMap::new();
    let mut released: BTreeSet<String> = BTreeSet::new();
    // (topic, subscription, value) dead-lettered by an `ok` nack.
    let mut dead: BTreeSet<RecKey> = BTreeSet::new();
    // Values seen on the dead-letter topic.
    let mut dead_letter_values: BTreeSet<String> = BTreeSet::new();
    // (topic, subscription, receipt) named by an ack or nack with an unknown outcome, with
    // the invokes of those ops and whether one of them was an ack.
    let mut in_doubt: BTreeMap<RecKey, (Vec<u64>, bool)> = BTreeMap::new();
    let dead_letter_topic = opts.dead_letter_topic.as_deref();
    let mut extended: HashMap<String, u64> = HashMap::new();
    // Backward cursor moves per subscription: (invoke, complete).
    let mut seeks: HashMap<SubKey, Vec<(u64, u64)>> = HashMap::new();
    // (topic, value) -> offsets it was seen at (deliveries and final reads), and where.
    let mut offsets_of: BTreeMap<(String, String), (BTreeSet<u64>, Vec<u64>)> = BTreeMap::new();
    // Real-time bounds of leases: receipts acked (`ok`, `acked`), the earliest invoke of a
    // nack of each receipt that may have released it, and the real-time end of each receipt's
    // lease as moved by extends.
    let mut acked_receipts: HashSet<String> = HashSet::new();
    let mut nacked_at: HashMap<String, u64> = HashMap::new();
    let mut extended_until_us: HashMap<String, u64> = HashMap::new();
    // The retention topic: value -> (acknowledged, earliest publish invoke µs, publish
    // invokes); its final reads: (node, completion µs, completion index, values).
    let retention = opts.retention.as_ref();
    let mut aged: BTreeMap<String, (bool, u64, Vec<u64>)> = BTreeMap::new();
    let mut aged_reads: Vec<(u64, u64, u64, HashSet<String>)> = Vec::new();
    let time_of = |pair: &crate::history::Pair<'_>| {
        (
            pair.invoke.time_us,
            pair.completion.map_or(u64::MAX, |c| c.time_us),
        )
    };

    for pair in &pairs {
        match pair.op() {
            Op::Publish { topic, values, .. } if retention.is_some_and(|r| &r.topic == topic) => {
                let ok = pair.outcome() == Kind::Ok;
                for value in values {
                    let entry = aged.entry(value.clone()).or_insert((
                        false,
                        pair.invoke.time_us,
                        Vec::new(),
                    ));
                    entry.0 |= ok;
                    entry.1 = entry.1.min(pair.invoke.time_us);
                    entry.2.push(pair.invoke_index());
                }
            }
            Op::FinalRead { topic, node } if retention.is_some_and(|r| &r.topic == topic) => {
                if let Some(OpResult::Records { records }) = pair.result() {
                    aged_reads.push((
                        *node,
                        time_of(pair).1,
                        pair.complete_index(),
                        records.iter().map(|(_, v)| v.clone()).collect(),
                    ));
                    for (offset, value) in records {
                        let seen = offsets_of
                            .entry((topic.clone(), value.clone()))
                            .or_default();
                        seen.0.insert(*offset);
                        seen.1.push(pair.complete_index());
                    }
                }
            }
            Op::Publish { topic, values, .. } => {
                let outcome = match pair.outcome() {
                    Kind::Ok => PubOutcome::Ok,
                    Kind::Fail => PubOutcome::Fail,
                    _ => PubOutcome::Info,
                };
                for value in values {
                    report.attempts += 1;
                    let entry = published
                        .entry((topic.clone(), value.clone()))
                        .or_insert((outcome, Vec::new()));
                    entry.0 = entry.0.min(outcome);
                    entry.1.push(pair.invoke_index());
                    if outcome == PubOutcome::Ok {
                        acknowledged
                            .entry(topic.clone())
                            .or_default()
                            .insert(value.clone());
                    }
                }
            }
            Op::Pull {
                topic,
                subscription,
                ack_timeout_ms,
                final_drain,
            } => {
                if Some(topic.as_str()) == dead_letter_topic {
                    if let Some(OpResult::Pull { deliveries: ds }) = pair.result() {
                        dead_letter_values.extend(ds.iter().map(|d| d.value.clone()));
                    }
                    continue;
                }
                subscriptions.insert((topic.clone(), subscription.clone()));
                let Some(OpResult::Pull { deliveries: ds }) = pair.result() else {
                    continue;
                };
                let timeout = ack_timeout_ms.unwrap_or(opts.ack_timeout_ms);
                for d in ds {
                    let seen = offsets_of
                        .entry((topic.clone(), d.value.clone()))
                        .or_default();
                    seen.0.insert(d.offset);
                    seen.1.push(pair.complete_index());
                    let key = (topic.clone(), subscription.clone(), d.value.clone());
                    let (invoke_us, complete_us) = time_of(pair);
                    deliveries.entry(key).or_default().push(DeliveryRec {
                        pull_invoke: pair.invoke_index(),
                        pull_complete: pair.complete_index(),
                        pull_invoke_us: invoke_us,
                        pull_complete_us: complete_us,
                        lease_ms: timeout,
                        offset: d.offset,
                        receipt: d.receipt.clone(),
                        delivery_count: d.delivery_count,
                        lease_start: d.lease_expires_ms.saturating_sub(timeout),
                        lease_end: d.lease_expires_ms,
                        final_drain: *final_drain,
                    });
                }
            }
            Op::Ack {
                topic,
                subscription,
                receipts,
            } => {
                if pair.outcome() == Kind::Info {
                    for (receipt, _) in receipts {
                        let key = (topic.clone(), subscription.clone(), receipt.clone());
                        let entry = in_doubt.entry(key).or_default();
                        entry.0.push(pair.invoke_index());
                        entry.1 = true;
                    }
                }
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                for (receipt, value, status, _) in receipt_outcomes(receipts, results) {
                    if status == ReceiptStatus::Acked {
                        acked_receipts.insert(receipt.clone());
                        acks.entry((topic.clone(), subscription.clone(), value))
                            .or_default()
                            .push(AckRec {
                                invoke: pair.invoke_index(),
                                complete: pair.complete_index(),
                                receipt,
                            });
                    }
                }
            }
            Op::Nack {
                topic,
                subscription,
                receipts,
                ..
            } => {
                if pair.outcome() == Kind::Info {
                    for (receipt, _) in receipts {
                        let key = (topic.clone(), subscription.clone(), receipt.clone());
                        in_doubt.entry(key).or_default().0.push(pair.invoke_index());
                        let at = nacked_at.entry(receipt.clone()).or_insert(u64::MAX);
                        *at = (*at).min(pair.invoke.time_us);
                    }
                }
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                for (receipt, value, status, _) in receipt_outcomes(receipts, results) {
                    if matches!(
                        status,
                        ReceiptStatus::Released | ReceiptStatus::DeadLettered
                    ) {
                        let at = nacked_at.entry(receipt.clone()).or_insert(u64::MAX);
                        *at = (*at).min(pair.invoke.time_us);
                        released.insert(receipt);
                    }
                    if status == ReceiptStatus::DeadLettered {
                        dead.insert((topic.clone(), subscription.clone(), value));
                    }
                }
            }
            Op::Extend {
                receipts,
                ack_timeout_ms,
                ..
            } => {
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                let lease = ack_timeout_ms.unwrap_or(opts.ack_timeout_ms);
                for (receipt, _, status, expires) in receipt_outcomes(receipts, results) {
                    if status == ReceiptStatus::Extended {
                        let until = real_end_us(pair.invoke.time_us, lease);
                        let end = extended_until_us.entry(receipt.clone()).or_insert(until);
                        *end = (*end).max(until);
                    }
                    if let (ReceiptStatus::Extended, Some(e)) = (status, expires) {
                        let end = extended.entry(receipt).or_insert(e);
                        *end = (*end).max(e);
                    }
                }
            }
            Op::SetCursor {
                topic,
                subscription,
                allow_backward: true,
                ..
            } if pair.outcome() != Kind::Fail => {
                seeks
                    .entry((topic.clone(), subscription.clone()))
                    .or_default()
                    .push((pair.invoke_index(), pair.complete_index()));
            }
            Op::FinalRead { topic, .. } => {
                let Some(OpResult::Records { records }) = pair.result() else {
                    continue;
                };
                if Some(topic.as_str()) == dead_letter_topic {
                    dead_letter_values.extend(records.iter().map(|(_, v)| v.clone()));
                    continue;
                }
                for (offset, value) in records {
                    let seen = offsets_of
                        .entry((topic.clone(), value.clone()))
                        .or_default();
                    seen.0.insert(*offset);
                    seen.1.push(pair.complete_index());
                }
            }
            _ => {}
        }
    }

    for ((topic, value), (offsets, events)) in &offsets_of {
        if offsets.len() > 1 {
            let mut events = events.clone();
            events.sort_unstable();
            events.dedup();
            report.appended_twice.push(Finding {
                topic: topic.clone(),
                value: Some(value.clone()),
                offset: offsets.iter().next().copied(),
                events,
                detail: format!("at offsets {offsets:?}: the log holds it more than once"),
                ..Finding::default()
            });
        }
    }

    // A seek on `sub` may have happened after event `after` (an invoke) and before `before`
    // (a completion).
    let seek_between = |sub: &SubKey, after: u64, before: u64| {
        seeks
            .get(sub)
            .is_some_and(|v| v.iter().any(|&(i, c)| i < before && c > after))
    };

    // The unknown-outcome acks and nacks of the last delivery of a record (the one with the
    // highest delivery count): only those may have settled it without a definite answer, since
    // a record settled is never delivered again. With whether one of them was an ack.
    let doubt_of = |key: &RecKey| -> Option<&(Vec<u64>, bool)> {
        let last = deliveries
            .get(key)?
            .iter()
            .max_by_key(|d| d.delivery_count)?;
        in_doubt.get(&(key.0.clone(), key.1.clone(), last.receipt.clone()))
    };

    // lost: per topic, every subscription must settle (ack or dead-letter) every acknowledged
    // value; never_delivered: the weaker, older definition (not even delivered).
    for (topic, values) in &acknowledged {
        let subs: Vec<&SubKey> = subscriptions.iter().filter(|(t, _)| t == topic).collect();
        for value in values {
            if subs.is_empty() {
                let finding = Finding {
                    topic: topic.clone(),
                    value: Some(value.clone()),
                    events: published_events(&published, topic, value),
                    detail: "acknowledged, and the topic was never pulled".into(),
                    ..Finding::default()
                };
                report.never_delivered.push(finding.clone());
                report.lost.push(finding);
            }
            for (_, sub) in &subs {
                let key = (topic.clone(), sub.clone(), value.clone());
                let finding = |detail: String, events: Vec<u64>| Finding {
                    topic: topic.clone(),
                    subscription: Some(sub.clone()),
                    value: Some(value.clone()),
                    offset: deliveries.get(&key).map(|ds| ds[0].offset),
                    events,
                    detail,
                };
                let mut events = published_events(&published, topic, value);
                let delivered = deliveries.get(&key).map(Vec::as_slice).unwrap_or_default();
                events.extend(delivered.iter().map(|d| d.pull_complete));
                if delivered.is_empty() {
                    report.never_delivered.push(finding(
                        "acknowledged, never delivered (not even by the final drain)".into(),
                        events.clone(),
                    ));
                }
                if acks.contains_key(&key) {
                    report.acked += 1;
                    continue;
                }
                if dead.contains(&key) || dead_letter_values.contains(value) {
                    report.dead_lettered += 1;
                    continue;
                }
                if let Some((invokes, _)) = doubt_of(&key) {
                    events.extend(invokes);
                    report.ack_unknown.push(finding(
                        format!(
                            "acknowledged and delivered {} time(s), never acked by a definite \
                             answer; an ack or nack of it had an unknown outcome and it was \
                             never delivered again: acked, or lost",
                            delivered.len()
                        ),
                        events,
                    ));
                    continue;
                }
                let detail = if delivered.is_empty() {
                    "acknowledged, never delivered (not even by the final drain)".to_string()
                } else {
                    let receipts: Vec<&str> =
                        delivered.iter().map(|d| d.receipt.as_str()).collect();
                    format!(
                        "acknowledged and delivered {} time(s) (receipts {}), but never acked \
                         (no ok ack answered `acked`) nor dead-lettered, not even by the final \
                         drain",
                        delivered.len(),
                        receipts.join(", ")
                    )
                };
                report.lost.push(finding(detail, events));
            }
        }
    }

    for ((topic, sub, value), ds) in &deliveries {
        let sub_key = (topic.clone(), sub.clone());
        report.delivered += ds.len() as u64;
        report.delivered_distinct += 1;
        report.final_deliveries += ds.iter().filter(|d| d.final_drain).count() as u64;
        let finding = |detail: String, events: Vec<u64>, offset: Option<u64>| Finding {
            topic: topic.clone(),
            subscription: Some(sub.clone()),
            value: Some(value.clone()),
            offset,
            events,
            detail,
        };

        match published.get(&(topic.clone(), value.clone())) {
            None => report.unexpected.push(finding(
                "delivered, never published".into(),
                ds.iter().map(|d| d.pull_complete).collect(),
                Some(ds[0].offset),
            )),
            Some((PubOutcome::Info, invokes)) => report.recovered.push(finding(
                "delivered; its publish was indeterminate (info)".into(),
                invokes
                    .iter()
                    .copied()
                    .chain([ds[0].pull_complete])
                    .collect(),
                Some(ds[0].offset),
            )),
            Some((PubOutcome::Fail, invokes)) => report.aborted_read.push(finding(
                "delivered, but its publish failed (aborted read)".into(),
                invokes
                    .iter()
                    .copied()
                    .chain([ds[0].pull_complete])
                    .collect(),
                Some(ds[0].offset),
            )),
            Some((PubOutcome::Ok, _)) => {}
        }

        if ds.len() > 1 {
            report.extra_deliveries += ds.len() as u64 - 1;
            let counts: Vec<String> = ds.iter().map(|d| d.delivery_count.to_string()).collect();
            report.duplicated.push(finding(
                format!(
                    "delivered {} times (delivery_count {})",
                    ds.len(),
                    counts.join(", ")
                ),
                ds.iter().map(|d| d.pull_complete).collect(),
                Some(ds[0].offset),
            ));
        }

        let key = (topic.clone(), sub.clone(), value.clone());
        let record_acks = acks.get(&key).map(Vec::as_slice).unwrap_or_default();
        // delivery after ack: against the earliest-completing ack.
        if let Some(first) = record_acks.iter().min_by_key(|a| a.complete) {
            for d in ds.iter().filter(|d| d.pull_invoke > first.complete) {
                if seek_between(&sub_key, first.invoke, d.pull_complete) {
                    continue;
                }
                report.delivery_after_ack.push(finding(
                    format!(
                        "receipt {} was acked, then a later pull delivered the record again \
                         (receipt {}, delivery_count {})",
                        first.receipt, d.receipt, d.delivery_count
                    ),
                    vec![first.invoke, first.complete, d.pull_invoke, d.pull_complete],
                    Some(d.offset),
                ));
            }
        }
        // double ack.
        if record_acks.len() > 1 {
            let mut sorted: Vec<&AckRec> = record_acks.iter().collect();
            sorted.sort_by_key(|a| a.complete);
            let first = sorted[0];
            for second in &sorted[1..] {
                if seek_between(&sub_key, first.invoke.min(second.invoke), second.complete) {
                    continue;
                }
                report.double_ack.push(finding(
                    format!(
                        "acked twice: receipts {} and {}",
                        first.receipt, second.receipt
                    ),
                    vec![first.invoke, first.complete, second.invoke, second.complete],
                    Some(ds[0].offset),
                ));
            }
        }
        // early redelivery: a later delivery while an earlier lease still ran in real time.
        let mut in_order: Vec<&DeliveryRec> = ds.iter().collect();
        in_order.sort_by_key(|d| (d.delivery_count, d.pull_complete));
        for (i, b) in in_order.iter().enumerate().skip(1) {
            report.redeliveries_timed += 1;
            let early = in_order[..i].iter().find(|a| {
                a.receipt != b.receipt
                    && !acked_receipts.contains(&a.receipt)
                    && nacked_at
                        .get(&a.receipt)
                        .is_none_or(|at| *at >= b.pull_complete_us)
                    && !seek_between(&sub_key, a.pull_invoke, b.pull_complete)
                    && b.pull_complete_us < lease_end_us(a, &extended_until_us)
            });
            if let Some(a) = early {
                let end = lease_end_us(a, &extended_until_us);
                report.early_redelivery.push(finding(
                    format!(
                        "receipt {} (pull invoked at {} ms, lease {} ms) could not have expired \
                         before {} ms in real time, but a pull completed at {} ms delivered the \
                         record again (receipt {}, delivery_count {}): {} ms early",
                        a.receipt,
                        a.pull_invoke_us / 1000,
                        a.lease_ms,
                        end / 1000,
                        b.pull_complete_us / 1000,
                        b.receipt,
                        b.delivery_count,
                        (end - b.pull_complete_us) / 1000
                    ),
                    vec![
                        a.pull_invoke,
                        a.pull_complete,
                        b.pull_invoke,
                        b.pull_complete,
                    ],
                    Some(b.offset),
                ));
            }
        }
        // lease overlap.
        let mut by_start: Vec<&DeliveryRec> = ds.iter().collect();
        by_start.sort_by_key(|d| (d.lease_start, d.pull_invoke));
        for (i, a) in by_start.iter().enumerate() {
            if released.contains(&a.receipt) {
                continue;
            }
            let a_end = extended
                .get(&a.receipt)
                .map_or(a.lease_end, |&e| e.max(a.lease_end));
            for b in &by_start[i + 1..] {
                if b.receipt != a.receipt && b.lease_start < a_end {
                    report.lease_overlap.push(finding(
                        format!(
                            "lease of receipt {} [{}, {}] overlaps lease of receipt {} [{}, {}] \
                             by {} ms",
                            a.receipt,
                            a.lease_start,
                            a_end,
                            b.receipt,
                            b.lease_start,
                            b.lease_end,
                            a_end - b.lease_start
                        ),
                        vec![a.pull_complete, b.pull_complete],
                        Some(b.offset),
                    ));
                }
            }
        }
    }

    // early retention: an acknowledged value of the retention topic missing from a final read
    // that came before it could be old enough to go.
    if let Some(r) = retention {
        for (node, read_us, read_index, values) in &aged_reads {
            for (value, (ok, published_us, invokes)) in &aged {
                if !*ok {
                    continue;
                }
                report.retention_checked += 1;
                if values.contains(value) {
                    continue;
                }
                let keep_until = real_end_us(*published_us, r.max_age_ms);
                if *read_us >= keep_until {
                    report.retention_expired += 1;
                    continue;
                }
                let mut events = invokes.clone();
                events.push(*read_index);
                report.early_retention.push(Finding {
                    topic: r.topic.clone(),
                    value: Some(value.clone()),
                    events,
                    detail: format!(
                        "acknowledged, published from {} ms, missing from the final read through \
                         node {node} that completed at {} ms: at most {} ms old there, less than \
                         the maximum age of {} ms (which lasts at least {} ms in real time)",
                        published_us / 1000,
                        read_us / 1000,
                        read_us.saturating_sub(*published_us) / 1000,
                        r.max_age_ms,
                        (keep_until - published_us) / 1000
                    ),
                    ..Finding::default()
                });
            }
        }
    }

    report.acknowledged = acknowledged.values().map(|v| v.len() as u64).sum();
    // Every record, acknowledged or not: what the server's count of acks must come to.
    report.acked_records = acks.len() as u64;
    report.ack_unknown_records = deliveries
        .keys()
        .filter(|key| !acks.contains_key(*key) && !dead.contains(*key))
        .filter(|key| doubt_of(key).is_some_and(|(_, by_ack)| *by_ack))
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

/// The real-time end (history µs, less the margin) of delivery `a`'s lease, as its extends
/// moved it.
fn lease_end_us(a: &DeliveryRec, extended_until_us: &HashMap<String, u64>) -> u64 {
    let own = real_end_us(a.pull_invoke_us, a.lease_ms);
    extended_until_us
        .get(&a.receipt)
        .map_or(own, |e| own.max(*e))
}

fn published_events(
    published: &HashMap<(String, String), (PubOutcome, Vec<u64>)>,
    topic: &str,
    value: &str,
) -> Vec<u64> {
    published
        .get(&(topic.to_string(), value.to_string()))
        .map(|(_, e)| e.clone())
        .unwrap_or_default()
}

/// `(receipt, value, status, lease_expires_ms)` for each result, matched to the op's
/// `(receipt, value)` pairs by receipt (results name their receipt).
fn receipt_outcomes(
    receipts: &[(String, String)],
    results: &[raftq_client::api::ReceiptResult],
) -> Vec<(String, String, ReceiptStatus, Option<u64>)> {
    let value_of: HashMap<&str, &str> = receipts
        .iter()
        .map(|(r, v)| (r.as_str(), v.as_str()))
        .collect();
    results
        .iter()
        .filter_map(|r| {
            value_of.get(r.receipt.as_str()).map(|v| {
                (
                    r.receipt.clone(),
                    v.to_string(),
                    r.status,
                    r.lease_expires_ms,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
