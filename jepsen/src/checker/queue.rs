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
//! | `lost` | acknowledged on a topic, never delivered on one of its subscriptions (every subscription seen in a pull must deliver every acknowledged value; a topic with acknowledged values but no pulls at all loses them all) | yes |
//! | `unexpected` | delivered, never attempted on that topic | yes |
//! | `duplicated` | delivered more than once on one subscription (redeliveries after expiry or nack are allowed); `extra_deliveries` counts the surplus | no |
//! | `recovered` | delivered, but no publish of it was `ok` and one was `info` (or never completed) | no |
//! | `aborted_read` | delivered, but every publish of it `fail`ed | yes |
//! | `delivery_after_ack` | a pull invoked after an `ok` ack answered `acked` for a record returned that record | yes |
//! | `double_ack` | two `ok` acks answered `acked` for one record | yes |
//! | `lease_overlap` | two deliveries (different receipts) of one record whose leases overlap by server time | no |
//! | `appended_twice` | one value at two offsets of a topic (seen in deliveries or in a final read): a publish applied twice, which idempotent producers must never cause | yes |
//!
//! A lease is `[lease_expires_ms - ack_timeout, lease_expires_ms]`, where ack_timeout is the
//! pull's `ack_timeout_ms`, or else [`QueueOptions::ack_timeout_ms`] (the subscription's). An
//! `ok` extend answered `extended` moves the end to its `lease_expires_ms`; a delivery `ok`
//! nacked (`released`/`dead_lettered`) ended early at an unknown server time and is not
//! compared as the earlier lease. A backward cursor move (`allow_backward`, not `fail`ed) on
//! the subscription that may have happened between an ack and a later delivery or second ack
//! excuses them (a seek forgets done marks).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use raftq_client::api::ReceiptStatus;
use serde::{Deserialize, Serialize};

use super::{Anomaly, Finding, Verdict};
use crate::history::{op_counts, pairs, Event, Kind, Op, OpCounts, OpResult};

/// Parameters of the queue checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueOptions {
    /// Lease length of pulls that did not name one (the subscription's `ack_timeout_ms`).
    pub ack_timeout_ms: u64,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            ack_timeout_ms: raftq_client::api::DEFAULT_ACK_TIMEOUT_MS,
        }
    }
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
    pub lost: Anomaly,
    pub unexpected: Anomaly,
    pub duplicated: Anomaly,
    pub recovered: Anomaly,
    pub aborted_read: Anomaly,
    pub delivery_after_ack: Anomaly,
    pub double_ack: Anomaly,
    pub lease_overlap: Anomaly,
    #[serde(default)]
    pub appended_twice: Anomaly,
}

impl QueueReport {
    fn table(&self) -> [(&'static str, &Anomaly, bool); 9] {
        [
            ("lost", &self.lost, true),
            ("unexpected", &self.unexpected, true),
            ("duplicated", &self.duplicated, false),
            ("recovered", &self.recovered, false),
            ("aborted_read", &self.aborted_read, true),
            ("delivery_after_ack", &self.delivery_after_ack, true),
            ("double_ack", &self.double_ack, true),
            ("lease_overlap", &self.lease_overlap, false),
            ("appended_twice", &self.appended_twice, true),
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
    let mut extended: HashMap<String, u64> = HashMap::new();
    // Backward cursor moves per subscription: (invoke, complete).
    let mut seeks: HashMap<SubKey, Vec<(u64, u64)>> = HashMap::new();
    // (topic, value) -> offsets it was seen at (deliveries and final reads), and where.
    let mut offsets_of: BTreeMap<(String, String), (BTreeSet<u64>, Vec<u64>)> = BTreeMap::new();

    for pair in &pairs {
        match pair.op() {
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
                    deliveries.entry(key).or_default().push(DeliveryRec {
                        pull_invoke: pair.invoke_index(),
                        pull_complete: pair.complete_index(),
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
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                for (receipt, value, status, _) in receipt_outcomes(receipts, results) {
                    if status == ReceiptStatus::Acked {
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
            Op::Nack { receipts, .. } => {
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                for (receipt, _, status, _) in receipt_outcomes(receipts, results) {
                    if matches!(
                        status,
                        ReceiptStatus::Released | ReceiptStatus::DeadLettered
                    ) {
                        released.insert(receipt);
                    }
                }
            }
            Op::Extend { receipts, .. } => {
                let Some(OpResult::Receipts { results }) = pair.result() else {
                    continue;
                };
                for (receipt, _, status, expires) in receipt_outcomes(receipts, results) {
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

    // lost: per topic, every subscription must deliver every acknowledged value.
    for (topic, values) in &acknowledged {
        let subs: Vec<&SubKey> = subscriptions.iter().filter(|(t, _)| t == topic).collect();
        for value in values {
            if subs.is_empty() {
                report.lost.push(Finding {
                    topic: topic.clone(),
                    value: Some(value.clone()),
                    events: published_events(&published, topic, value),
                    detail: "acknowledged, and the topic was never pulled".into(),
                    ..Finding::default()
                });
            }
            for (_, sub) in &subs {
                let key = (topic.clone(), sub.clone(), value.clone());
                if !deliveries.contains_key(&key) {
                    report.lost.push(Finding {
                        topic: topic.clone(),
                        subscription: Some(sub.clone()),
                        value: Some(value.clone()),
                        events: published_events(&published, topic, value),
                        detail: "acknowledged, never delivered (not even by the final drain)"
                            .into(),
                        ..Finding::default()
                    });
                }
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

    report.acknowledged = acknowledged.values().map(|v| v.len() as u64).sum();
    report.valid = report
        .table()
        .iter()
        .all(|(_, a, fatal)| !*fatal || a.is_empty());
    report
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
