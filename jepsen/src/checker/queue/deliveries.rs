//! Per delivered record: deliveries of values never published (`unexpected`), of publishes
//! that were indeterminate (`recovered`) or failed (`aborted_read`), more than one delivery
//! (`duplicated`), a delivery after an ack (`delivery_after_ack`), two acks (`double_ack`);
//! then the record's lease checks.

use super::{leases, AckRec, PubOutcome, QueueReport, Seen};
use crate::checker::Finding;

/// Judges every delivered record (topic, subscription, value) by its deliveries and acks.
pub(super) fn judge(seen: &Seen, report: &mut QueueReport) {
    let Seen {
        published,
        deliveries,
        acks,
        ..
    } = seen;
    for ((topic, sub, value), ds) in deliveries {
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

        // The publish's invocations, then the first delivery.
        let after_publish = |invokes: &[u64]| -> Vec<u64> {
            invokes
                .iter()
                .copied()
                .chain([ds[0].pull_complete])
                .collect()
        };
        match published.get(&(topic.clone(), value.clone())) {
            None => report.unexpected.push(finding(
                "delivered, never published".into(),
                ds.iter().map(|d| d.pull_complete).collect(),
                Some(ds[0].offset),
            )),
            Some((PubOutcome::Info, invokes)) => report.recovered.push(finding(
                "delivered; its publish was indeterminate (info)".into(),
                after_publish(invokes),
                Some(ds[0].offset),
            )),
            Some((PubOutcome::Fail, invokes)) => report.aborted_read.push(finding(
                "delivered, but its publish failed (aborted read)".into(),
                after_publish(invokes),
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
                if seen.seek_between(&sub_key, first.invoke, d.pull_complete) {
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
                if seen.seek_between(&sub_key, first.invoke.min(second.invoke), second.complete) {
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
        leases::check_record(seen, &sub_key, ds, &finding, report);
    }
}
