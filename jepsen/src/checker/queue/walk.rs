//! One pass over the history: what each op says about values (publishes), deliveries
//! (pulls), acks, nacks, extends, cursor moves and final reads, gathered into [`Seen`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use raftq_client::api::ReceiptStatus;

use super::{
    real_end_us, AckRec, DeliveryRec, PubOutcome, QueueOptions, QueueReport, RecKey, Seen, SubKey,
};
use crate::history::{Kind, Op, OpResult, Pair};

/// Reads `pairs` (the history's operations) once; counts the publish attempts into `report`.
pub(super) fn walk(pairs: &[Pair<'_>], opts: &QueueOptions, report: &mut QueueReport) -> Seen {
    // Each of these ends up as the field of [`Seen`] of the same name, which says what it holds.
    let mut published: HashMap<(String, String), (PubOutcome, Vec<u64>)> = HashMap::new();
    let mut acknowledged: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut subscriptions: BTreeSet<SubKey> = BTreeSet::new();
    let mut deliveries: BTreeMap<RecKey, Vec<DeliveryRec>> = BTreeMap::new();
    let mut acks: BTreeMap<RecKey, Vec<AckRec>> = BTreeMap::new();
    let mut released: BTreeSet<String> = BTreeSet::new();
    let mut dead: BTreeSet<RecKey> = BTreeSet::new();
    let mut dead_letter_values: BTreeSet<String> = BTreeSet::new();
    let mut in_doubt: BTreeMap<RecKey, (Vec<u64>, bool)> = BTreeMap::new();
    let dead_letter_topic = opts.dead_letter_topic.as_deref();
    let mut extended: HashMap<String, u64> = HashMap::new();
    let mut seeks: HashMap<SubKey, Vec<(u64, u64)>> = HashMap::new();
    let mut offsets_of: OffsetsOf = BTreeMap::new();
    let mut acked_receipts: HashSet<String> = HashSet::new();
    let mut nacked_at: HashMap<String, u64> = HashMap::new();
    let mut extended_until_us: HashMap<String, u64> = HashMap::new();
    let retention = opts.retention.as_ref();
    let mut aged: BTreeMap<String, (bool, u64, Vec<u64>)> = BTreeMap::new();
    let mut aged_reads: Vec<(u64, u64, u64, HashSet<String>)> = Vec::new();
    let time_of = |pair: &crate::history::Pair<'_>| {
        (
            pair.invoke.time_us,
            pair.completion.map_or(u64::MAX, |c| c.time_us),
        )
    };

    for pair in pairs {
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
                        saw_offset(&mut offsets_of, topic, value, *offset, pair);
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
                    saw_offset(&mut offsets_of, topic, &d.value, d.offset, pair);
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
                mark_in_doubt(&mut in_doubt, (topic, subscription), receipts, pair, true);
                for (receipt, value, status, _) in receipt_outcomes(pair, receipts) {
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
                let sub_key = (topic.as_str(), subscription.as_str());
                for (receipt, _) in mark_in_doubt(&mut in_doubt, sub_key, receipts, pair, false) {
                    keep_min(&mut nacked_at, receipt, pair.invoke.time_us);
                }
                for (receipt, value, status, _) in receipt_outcomes(pair, receipts) {
                    if matches!(
                        status,
                        ReceiptStatus::Released | ReceiptStatus::DeadLettered
                    ) {
                        keep_min(&mut nacked_at, &receipt, pair.invoke.time_us);
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
                let lease = ack_timeout_ms.unwrap_or(opts.ack_timeout_ms);
                for (receipt, _, status, expires) in receipt_outcomes(pair, receipts) {
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
                    saw_offset(&mut offsets_of, topic, value, *offset, pair);
                }
            }
            _ => {}
        }
    }
    Seen {
        published,
        acknowledged,
        subscriptions,
        deliveries,
        acks,
        released,
        dead,
        dead_letter_values,
        in_doubt,
        extended,
        seeks,
        offsets_of,
        acked_receipts,
        nacked_at,
        extended_until_us,
        aged,
        aged_reads,
    }
}

/// (topic, value) -> the offsets it was seen at, and the completions that saw it.
type OffsetsOf = BTreeMap<(String, String), (BTreeSet<u64>, Vec<u64>)>;

/// Records that `value` of `topic` stood at `offset`, as `pair` (a pull or a final read) saw.
fn saw_offset(offsets_of: &mut OffsetsOf, topic: &str, value: &str, offset: u64, pair: &Pair<'_>) {
    let seen = offsets_of
        .entry((topic.to_string(), value.to_string()))
        .or_default();
    seen.0.insert(offset);
    seen.1.push(pair.complete_index());
}

/// When `pair`, an ack (`ack`) or a nack of `receipts`, is indeterminate: marks each receipt
/// in doubt and returns them all; otherwise returns none.
fn mark_in_doubt<'r>(
    in_doubt: &mut BTreeMap<RecKey, (Vec<u64>, bool)>,
    (topic, subscription): (&str, &str),
    receipts: &'r [(String, String)],
    pair: &Pair<'_>,
    ack: bool,
) -> &'r [(String, String)] {
    if pair.outcome() != Kind::Info {
        return &[];
    }
    for (receipt, _) in receipts {
        let key = (topic.to_string(), subscription.to_string(), receipt.clone());
        let entry = in_doubt.entry(key).or_default();
        entry.0.push(pair.invoke_index());
        entry.1 |= ack;
    }
    receipts
}

/// Keeps the earlier of `at` and what `earliest` holds for `receipt`.
fn keep_min(earliest: &mut HashMap<String, u64>, receipt: &str, at: u64) {
    let held = earliest.entry(receipt.to_string()).or_insert(u64::MAX);
    *held = (*held).min(at);
}

/// `(receipt, value, status, lease_expires_ms)` for each result of `pair` (none unless it
/// answered with receipts), matched to the op's `(receipt, value)` pairs by receipt (results
/// name their receipt).
fn receipt_outcomes(
    pair: &Pair<'_>,
    receipts: &[(String, String)],
) -> Vec<(String, String, ReceiptStatus, Option<u64>)> {
    let Some(OpResult::Receipts { results }) = pair.result() else {
        return Vec::new();
    };
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
