//! Per value: one value at two offsets of a topic (`appended_twice`), and whether every
//! acknowledged value was settled (acked or dead-lettered) on every subscription of its topic
//! (`lost`, `never_delivered`, `ack_unknown`).

use std::collections::HashMap;

use super::{PubOutcome, QueueReport, Seen, SubKey};
use crate::checker::Finding;

/// `appended_twice`: a value seen at more than one offset of its topic.
pub(super) fn appended_twice(seen: &Seen, report: &mut QueueReport) {
    for ((topic, value), (offsets, events)) in &seen.offsets_of {
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
}

/// `lost`, `never_delivered` and `ack_unknown`: every acknowledged value against every
/// subscription of its topic.
pub(super) fn settled(seen: &Seen, report: &mut QueueReport) {
    let Seen {
        published,
        acknowledged,
        subscriptions,
        deliveries,
        acks,
        dead,
        dead_letter_values,
        ..
    } = seen;
    // lost: per topic, every subscription must settle (ack or dead-letter) every acknowledged
    // value; never_delivered: the weaker, older definition (not even delivered).
    for (topic, values) in acknowledged {
        let subs: Vec<&SubKey> = subscriptions.iter().filter(|(t, _)| t == topic).collect();
        for value in values {
            if subs.is_empty() {
                let finding = Finding {
                    topic: topic.clone(),
                    value: Some(value.clone()),
                    events: published_events(published, topic, value),
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
                let mut events = published_events(published, topic, value);
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
                if let Some((invokes, _)) = seen.doubt_of(&key) {
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
