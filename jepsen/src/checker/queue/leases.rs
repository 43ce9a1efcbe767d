//! The lease and real-time checks: a record delivered again while an earlier lease still ran
//! in real time (`early_redelivery`), two leases of one record that overlap by server time
//! (`lease_overlap`), and a value of the retention topic gone before it could be old enough
//! (`early_retention`). See "Real time" in the module above.

use std::collections::HashMap;

use super::{real_end_us, DeliveryRec, QueueOptions, QueueReport, Seen, SubKey};
use crate::checker::Finding;

/// `early_redelivery` and `lease_overlap` of one record: its deliveries `ds` on the
/// subscription `sub_key`, each finding made by `finding` (detail, events, offset).
pub(super) fn check_record(
    seen: &Seen,
    sub_key: &SubKey,
    ds: &[DeliveryRec],
    finding: &impl Fn(String, Vec<u64>, Option<u64>) -> Finding,
    report: &mut QueueReport,
) {
    let Seen {
        released,
        extended,
        acked_receipts,
        nacked_at,
        extended_until_us,
        ..
    } = seen;
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
                && !seen.seek_between(sub_key, a.pull_invoke, b.pull_complete)
                && b.pull_complete_us < lease_end_us(a, extended_until_us)
        });
        if let Some(a) = early {
            let end = lease_end_us(a, extended_until_us);
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

/// `early_retention`: an acknowledged value of the retention topic missing from a final read.
pub(super) fn early_retention(seen: &Seen, opts: &QueueOptions, report: &mut QueueReport) {
    let Seen {
        aged, aged_reads, ..
    } = seen;
    let retention = opts.retention.as_ref();
    // early retention: an acknowledged value of the retention topic missing from a final read
    // that came before it could be old enough to go.
    if let Some(r) = retention {
        for (node, read_us, read_index, values) in aged_reads {
            for (value, (ok, published_us, invokes)) in aged {
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
}

/// The real-time end (history µs, less the margin) of delivery `a`'s lease, as its extends
/// moved it.
fn lease_end_us(a: &DeliveryRec, extended_until_us: &HashMap<String, u64>) -> u64 {
    let own = real_end_us(a.pull_invoke_us, a.lease_ms);
    extended_until_us
        .get(&a.receipt)
        .map_or(own, |e| own.max(*e))
}
