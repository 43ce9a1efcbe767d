//! Judging a consumers' history (`consumers`): the chaos suite's queue checker
//! (`raftq_jepsen::checker::queue`, CHECKERS.md "Queue workload"), with the overlap of two
//! leases of one record made a failure (the chaos suite only counts it), plus what that checker
//! does not look at:
//!
//! - `receipt_issued_twice`: one receipt in two deliveries;
//! - `same_delivery_count`: two deliveries of one record with the same `delivery_count`;
//! - `delivered_after_acked_delivery`: a delivery of a record with a higher `delivery_count`
//!   than the delivery whose receipt an ack answered `acked`.

use std::collections::{BTreeMap, HashMap, HashSet};

use raftq_client::api::ReceiptStatus::{self, Acked, Stale};
use raftq_jepsen::checker::{queue, Finding, QueueOptions, QueueReport, Verdict, MAX_EXAMPLES};
use raftq_jepsen::history::{pairs, Delivery, Event, Kind, Op, OpResult, Process};

use crate::consumers::{ACK_TIMEOUT_MS, SUB, TOPIC};

/// What [`judge`] found.
pub(crate) struct Judgement {
    pub(crate) report: QueueReport,
    /// The queue checker's verdict, with the failures of this test's own checks added.
    pub(crate) verdict: Verdict,
    /// One line per example of each failure (at most `MAX_EXAMPLES` of each).
    pub(crate) examples: Vec<String>,
}

impl Judgement {
    /// `Err` with the failures, their counts and their first examples, when there is one.
    pub(crate) fn result(&self) -> Result<(), String> {
        if self.verdict.valid {
            return Ok(());
        }
        let shown = self.examples.len().min(30);
        Err(format!(
            "failed: {}; every anomaly found: {}; the first {shown} examples:\n  {}",
            self.verdict.failures.join(", "),
            self.verdict.anomalies_found(),
            self.examples[..shown].join("\n  ")
        ))
    }
}

/// Judges the history of consumers of one or more subscriptions.
pub(crate) fn judge(events: &[Event], options: &QueueOptions) -> Judgement {
    let report = queue::check(events, options);
    let mut verdict = report.verdict("consumers");
    verdict.add("lease_overlap", report.lease_overlap.count, true);
    let mut examples: Vec<String> = verdict
        .failures
        .iter()
        .flat_map(|name| {
            examples_of(&report, name)
                .into_iter()
                .map(move |f| format!("{name}: {}", describe(&f)))
        })
        .collect();
    let mut own: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, example) in unchecked_by_queue(events) {
        own.entry(name).or_default().push(example);
    }
    for (name, found) in own {
        verdict.add(name, found.len() as u64, true);
        let kept = found.into_iter().take(MAX_EXAMPLES);
        examples.extend(kept.map(|e| format!("{name}: {e}")));
    }
    Judgement {
        report,
        verdict,
        examples,
    }
}

/// The examples the report keeps for anomaly `name` (its fields are named as the anomalies).
fn examples_of(report: &QueueReport, name: &str) -> Vec<Finding> {
    serde_json::to_value(report)
        .ok()
        .and_then(|v| serde_json::from_value(v[name]["examples"].clone()).ok())
        .unwrap_or_default()
}

fn describe(f: &Finding) -> String {
    format!(
        "{}/{} value {} offset {:?}: {} (events {:?})",
        f.topic,
        f.subscription.as_deref().unwrap_or("-"),
        f.value.as_deref().unwrap_or("-"),
        f.offset,
        f.detail,
        f.events
    )
}

/// Violations of the properties the queue checker does not judge, as `(name, example)`.
fn unchecked_by_queue(events: &[Event]) -> Vec<(&'static str, String)> {
    let mut found = Vec::new();
    let mut by_receipt: HashMap<&str, &Delivery> = HashMap::new();
    let mut by_record: BTreeMap<(&str, &str, &str), Vec<&Delivery>> = BTreeMap::new();
    let mut acked: HashSet<&str> = HashSet::new();
    for pair in pairs(events) {
        match (pair.result(), pair.op()) {
            (
                Some(OpResult::Pull { deliveries }),
                Op::Pull {
                    topic,
                    subscription: sub,
                    ..
                },
            ) => {
                for d in deliveries {
                    if let Some(first) = by_receipt.insert(&d.receipt, d) {
                        let example = format!("{first:?} and {d:?}");
                        found.push(("receipt_issued_twice", example));
                    }
                    by_record.entry((topic, sub, &d.value)).or_default().push(d);
                }
            }
            (Some(OpResult::Receipts { results }), Op::Ack { .. }) => acked.extend(
                results
                    .iter()
                    .filter(|r| r.status == ReceiptStatus::Acked)
                    .map(|r| r.receipt.as_str()),
            ),
            _ => {}
        }
    }
    for ((topic, sub, value), ds) in &by_record {
        let record = format!("{topic}/{sub} value {value}");
        let mut by_count: HashMap<u32, &Delivery> = HashMap::new();
        for d in ds {
            if let Some(other) = by_count.insert(d.delivery_count, d) {
                let example = format!("{record}: {other:?} and {d:?}");
                found.push(("same_delivery_count", example));
            }
        }
        let acked_count = ds
            .iter()
            .filter(|d| acked.contains(d.receipt.as_str()))
            .map(|d| d.delivery_count)
            .min();
        if let Some(n) = acked_count {
            for d in ds.iter().filter(|d| d.delivery_count > n) {
                let example = format!("{record}: {d:?} follows delivery #{n}, which was acked");
                found.push(("delivered_after_acked_delivery", example));
            }
        }
    }
    found
}

// ----- a negative control of the judge ---------------------------------------------------------
/// One operation of a hand-written history: invoked and answered at these milliseconds,
/// with this answer (`None`: the outcome is unknown).
type Step = (u64, u64, Op, Option<OpResult>);

/// A broken history: its name, its pulls, its acks, and the failures it must cause.
type Case = (&'static str, Vec<Step>, Vec<Step>, &'static [&'static str]);

/// The events of `steps` in time order, each step by a process of its own.
fn history(steps: &[Step]) -> Vec<Event> {
    let mut events = Vec::new();
    for (n, (invoked, answered, op, result)) in steps.iter().enumerate() {
        let event = |ms: u64, kind: Kind, result: Option<OpResult>| Event {
            index: 0,
            time_us: ms * 1000,
            process: Process::Client(n as u64),
            node: Some(1),
            kind,
            op: op.clone(),
            invoke_index: None,
            result,
            error: None,
        };
        events.push(event(*invoked, Kind::Invoke, None));
        let kind = if result.is_some() {
            Kind::Ok
        } else {
            Kind::Info
        };
        events.push(event(*answered, kind, result.clone()));
    }
    events.sort_by_key(|e| e.time_us);
    for (index, e) in events.iter_mut().enumerate() {
        e.index = index as u64;
    }
    events
}

fn value(offset: u64) -> String {
    format!("w/{offset}")
}

/// A pull invoked at `invoked` ms, answered 5 ms later with one delivery.
fn pull(offset: u64, receipt: &str, count: u32, expires: u64, invoked: u64) -> Step {
    let op = Op::Pull {
        topic: TOPIC.into(),
        subscription: SUB.into(),
        ack_timeout_ms: Some(ACK_TIMEOUT_MS),
        final_drain: false,
    };
    let delivery = Delivery {
        value: value(offset),
        offset,
        receipt: receipt.to_string(),
        delivery_count: count,
        lease_expires_ms: expires,
    };
    let result = OpResult::Pull {
        deliveries: vec![delivery],
    };
    (invoked, invoked + 5, op, Some(result))
}

/// An ack of one receipt answered at `answered` ms (`None`: the answer was lost).
fn ack(offset: u64, receipt: &str, status: Option<ReceiptStatus>, answered: u64) -> Step {
    let op = Op::ack(TOPIC, SUB, vec![(receipt.to_string(), value(offset))]);
    let result = status.map(|s| OpResult::receipts(vec![(receipt.to_string(), s)]));
    (answered - 5, answered, op, result)
}

/// A negative control for the judge of `four_consumers_leader_killed_twice`: histories
/// that ack twice, deliver after an ack, never ack, lease twice at once, reuse a receipt
/// or repeat a delivery count must all be reported. A checker that cannot see these
/// proves nothing.
#[test]
fn consumer_history_checker_sees_every_kind_of_violation() {
    let options = QueueOptions {
        ack_timeout_ms: ACK_TIMEOUT_MS,
        ..QueueOptions::default()
    };
    let publish = (
        0,
        0,
        Op::publish(TOPIC, vec![value(0), value(1)]),
        Some(OpResult::publish(0, 2, false)),
    );
    // Offset 0: delivered, expired, delivered again and acked; the first receipt is stale.
    // Offset 1: acked by an ack whose answer was lost (the retry says stale).
    let deliveries = vec![
        pull(0, "a", 1, 10_000, 0),
        pull(0, "b", 2, 15_000, 6_000),
        pull(1, "c", 1, 10_000, 0),
    ];
    let acks = vec![
        ack(0, "a", Some(Stale), 6_100),
        ack(0, "b", Some(Acked), 6_200),
        ack(1, "c", None, 395),
        ack(1, "c", Some(Stale), 400),
    ];
    let steps = |deliveries: &[Step], acks: &[Step]| -> Vec<Event> {
        history(&[std::slice::from_ref(&publish), deliveries, acks].concat())
    };
    let judgement = judge(&steps(&deliveries, &acks), &options);
    assert_eq!(judgement.result(), Ok(()));
    assert_eq!(judgement.report.ack_unknown.count, 1);

    let cases: Vec<Case> = vec![
        (
            "two acked results",
            deliveries.clone(),
            [acks.clone(), vec![ack(0, "b", Some(Acked), 6_300)]].concat(),
            &["double_ack"],
        ),
        (
            "never acked",
            deliveries.clone(),
            vec![ack(0, "b", Some(Acked), 6_200)],
            &["lost"],
        ),
        (
            "a pull sent after the ack answered",
            [deliveries.clone(), vec![pull(0, "d", 3, 30_000, 7_000)]].concat(),
            acks.clone(),
            &["delivery_after_ack", "delivered_after_acked_delivery"],
        ),
        (
            "leases overlapping",
            vec![
                pull(0, "a", 1, 10_000, 0),
                pull(0, "b", 2, 14_000, 6_000),
                pull(1, "c", 1, 10_000, 0),
            ],
            acks.clone(),
            &["lease_overlap"],
        ),
        (
            "a receipt issued twice",
            [deliveries.clone(), vec![pull(1, "a", 2, 20_000, 0)]].concat(),
            acks.clone(),
            &["receipt_issued_twice"],
        ),
        (
            "two deliveries with one count",
            [deliveries.clone(), vec![pull(1, "e", 1, 20_000, 0)]].concat(),
            acks.clone(),
            &["same_delivery_count"],
        ),
    ];
    for (name, deliveries, acks, expected) in cases {
        let judgement = judge(&steps(&deliveries, &acks), &options);
        let failures = &judgement.verdict.failures;
        for anomaly in expected {
            assert!(
                failures.iter().any(|f| f == anomaly),
                "{name}: expected a {anomaly:?} failure, got {failures:?}: {:?}",
                judgement.result()
            );
        }
    }
}
