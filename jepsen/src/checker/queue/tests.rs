//! One clean history, and for each anomaly a history that has exactly it.

use raftq_client::api::ReceiptStatus;

use super::{check, check_ack_count, QueueOptions, QueueReport};
use crate::history::{Delivery, Event, History, Op, OpResult, Phase, Process};

const T: &str = "q";
const S: &str = "s";
/// Lease length the tests' pulls get (the checker's default is 30 s; tests pass it).
const LEASE: u64 = 1_000;

fn opts() -> QueueOptions {
    QueueOptions {
        ack_timeout_ms: LEASE,
        dead_letter_topic: None,
        retention: None,
    }
}

fn vals(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

fn publish_ok(h: &History, p: Process, values: &[&str], first: u64) {
    h.invoke(p, Some(1), Op::publish(T, vals(values)))
        .ok(OpResult::publish(first, values.len(), false));
}

/// A delivery of `value` at `offset` whose lease started at server time `start_ms`.
fn d(value: &str, offset: u64, receipt: &str, count: u32, start_ms: u64) -> Delivery {
    Delivery {
        value: value.into(),
        offset,
        receipt: receipt.into(),
        delivery_count: count,
        lease_expires_ms: start_ms + LEASE,
    }
}

fn pull_ok(h: &History, p: Process, deliveries: Vec<Delivery>) {
    h.invoke(p, Some(1), Op::pull(T, S))
        .ok(OpResult::Pull { deliveries });
}

fn final_pull(h: &History, p: Process, deliveries: Vec<Delivery>) {
    h.invoke(p, Some(1), Op::final_pull(T, S))
        .ok(OpResult::Pull { deliveries });
}

fn ack(h: &History, p: Process, pairs: &[(&str, &str)], status: ReceiptStatus) {
    let receipts: Vec<(String, String)> = pairs
        .iter()
        .map(|(r, v)| (r.to_string(), v.to_string()))
        .collect();
    let results = receipts.iter().map(|(r, _)| (r.clone(), status)).collect();
    h.invoke(p, Some(1), Op::ack(T, S, receipts))
        .ok(OpResult::receipts(results));
}

/// The history's events two seconds apart: real time in which every lease of these tests
/// (at most a few seconds) could have run out between one pull and the next, so that only the
/// tests of the real-time checks see them cut short.
fn spaced(h: &History) -> Vec<Event> {
    let mut events = h.events();
    for e in &mut events {
        e.time_us = e.index * 2_000_000;
    }
    events
}

/// The history's events at the times `at` gives (ms, by event index; unlisted events keep
/// their place two seconds apart after the last listed one).
fn timed(h: &History, at: &[(u64, u64)]) -> Vec<Event> {
    let mut events = spaced(h);
    for (index, ms) in at {
        events[*index as usize].time_us = ms * 1000;
    }
    events
}

fn run(h: &History) -> QueueReport {
    let report = check(&spaced(h), &opts());
    // Every report must serialize (it goes into results files).
    serde_json::to_string(&report).expect("report serializes");
    report
}

/// The anomalies that occurred, by name.
fn found(r: &QueueReport) -> Vec<&'static str> {
    r.table()
        .iter()
        .filter(|(_, a, _)| !a.is_empty())
        .map(|(n, _, _)| *n)
        .collect()
}

#[test]
fn clean_history_is_valid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b"], 0);
    publish_ok(&h, p, &["c"], 2);
    // A failed publish that is never delivered, and an indeterminate one that is not either.
    h.invoke(p, Some(2), Op::publish(T, vals(&["f"])))
        .fail("no_leader");
    h.invoke(p, Some(2), Op::publish(T, vals(&["i"])))
        .info("timeout");
    let c = h.next_process();
    pull_ok(
        &h,
        c,
        vec![d("a", 0, "r0", 1, 100), d("b", 1, "r1", 1, 100)],
    );
    ack(&h, c, &[("r0", "a"), ("r1", "b")], ReceiptStatus::Acked);
    // An ack of an unknown-outcome kind changes nothing.
    h.invoke(c, Some(1), Op::ack(T, S, vec![("r0".into(), "a".into())]))
        .fail("no_leader");
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill", Phase::Start, vec![1]),
    )
    .ok(OpResult::Fault {
        detail: "killed 1".into(),
    });
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill", Phase::Stop, vec![1]),
    )
    .ok(OpResult::Fault {
        detail: "restarted 1".into(),
    });
    final_pull(&h, c, vec![d("c", 2, "r2", 1, 5_000)]);
    ack(&h, c, &[("r2", "c")], ReceiptStatus::Acked);
    final_pull(&h, c, vec![]);

    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new(), "{r:#?}");
    assert_eq!(r.attempts, 5);
    assert_eq!(r.acknowledged, 3);
    assert_eq!(r.delivered, 3);
    assert_eq!(r.final_deliveries, 1);
    assert_eq!(r.counts.ops, 10);
    assert_eq!(r.counts.ok, 7);
    assert_eq!(r.counts.fail, 2);
    assert_eq!(r.counts.info, 1);
    assert_eq!(r.acked, 3);
    let v = r.verdict("clean");
    assert!(v.valid);
    assert_eq!(v.anomalies.len(), 13);
    assert!(v.anomalies.values().all(|n| *n == 0));
}

/// The negative control: a build that answers before fsync, killed on every node at once,
/// forgets acknowledged publishes; the final drain comes back without them.
#[test]
fn acknowledged_missing_from_final_drain_is_lost() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b", "c"], 0);
    publish_ok(&h, p, &["d"], 3);
    let c = h.next_process();
    pull_ok(&h, c, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, c, &[("r0", "a")], ReceiptStatus::Acked);
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill-all", Phase::Start, vec![1, 2, 3]),
    )
    .ok(OpResult::Fault {
        detail: "killed 1, 2, 3".into(),
    });
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill-all", Phase::Stop, vec![1, 2, 3]),
    )
    .ok(OpResult::Fault {
        detail: "restarted 1, 2, 3".into(),
    });
    // Only "b" survived the crash.
    final_pull(&h, c, vec![d("b", 1, "r1", 1, 9_000)]);
    final_pull(&h, c, vec![]);

    let r = run(&h);
    assert!(!r.valid);
    // "b" came back but was never acked: lost as well, though delivered.
    assert_eq!(found(&r), vec!["lost", "never_delivered"], "{r:#?}");
    assert_eq!(r.never_delivered.count, 2);
    assert_eq!(r.lost.count, 3);
    let lost: Vec<_> = r
        .lost
        .examples
        .iter()
        .map(|f| f.value.clone().unwrap())
        .collect();
    assert_eq!(lost, vec!["b", "c", "d"]);
    assert_eq!(r.lost.examples[0].subscription.as_deref(), Some(S));
    let v = r.verdict("kill-all, no fsync");
    assert!(!v.valid);
    assert_eq!(v.failures, vec!["lost"]);
    assert_eq!(v.anomalies["lost"], 3);
    assert_eq!(v.anomalies["never_delivered"], 2);
}

#[test]
fn acknowledged_but_never_pulled_topic_is_lost() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost", "never_delivered"]);
}

#[test]
fn unexpected_value_is_invalid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(
        &h,
        p,
        vec![d("a", 0, "r0", 1, 100), d("ghost", 1, "r1", 1, 100)],
    );
    ack(&h, p, &[("r0", "a"), ("r1", "ghost")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["unexpected"], "{r:#?}");
    assert_eq!(r.unexpected.examples[0].value.as_deref(), Some("ghost"));
}

#[test]
fn redelivery_after_lease_expiry_is_duplicated_but_valid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    // The lease [100, 1100] ran out; the record comes again at 2000.
    pull_ok(&h, p, vec![d("a", 0, "r1", 2, 2_000)]);
    ack(&h, p, &[("r1", "a")], ReceiptStatus::Acked);
    // The old receipt is stale now: not an ack.
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Stale);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["duplicated"]);
    assert_eq!(r.duplicated.count, 1);
    assert_eq!(r.extra_deliveries, 1);
    assert!(r.duplicated.examples[0]
        .detail
        .contains("delivery_count 1, 2"));
}

#[test]
fn delivered_after_info_publish_is_recovered_and_valid() {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish(T, vals(&["a"])))
        .info("connection reset");
    let c = h.next_process();
    pull_ok(&h, c, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, c, &[("r0", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["recovered"]);
}

#[test]
fn delivered_after_failed_publish_is_aborted_read() {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish(T, vals(&["a"])))
        .fail("no_leader");
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    let r = run(&h);
    assert!(!r.valid);
    // Never acknowledged, so never lost, acked or not.
    assert_eq!(found(&r), vec!["aborted_read"], "{r:#?}");
}

#[test]
fn failed_then_ok_retry_is_not_aborted() {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish(T, vals(&["a"])))
        .fail("no_leader");
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new());
    assert_eq!(r.attempts, 2);
}

#[test]
fn delivery_after_ack_is_invalid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    // Invoked after the ack completed, and the record comes back.
    pull_ok(&h, p, vec![d("a", 0, "r1", 2, 5_000)]);
    let r = run(&h);
    assert!(!r.valid);
    // Two deliveries are necessarily a (tolerated) duplicate too.
    assert_eq!(
        found(&r),
        vec!["duplicated", "delivery_after_ack"],
        "{r:#?}"
    );
    assert_eq!(r.delivery_after_ack.count, 1);
    assert_eq!(r.delivery_after_ack.examples[0].events.len(), 4);
}

#[test]
fn pull_concurrent_with_ack_is_not_delivery_after_ack() {
    let h = History::new();
    let p = h.next_process();
    let q = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    // q's pull is invoked after p's ack was invoked but before it completed: the pull may
    // take effect first.
    let acking = h.invoke(p, Some(1), Op::ack(T, S, vec![("r0".into(), "a".into())]));
    let pulling = h.invoke(q, Some(1), Op::pull(T, S));
    acking.ok(OpResult::receipts(vec![(
        "r0".into(),
        ReceiptStatus::Acked,
    )]));
    pulling.ok(OpResult::Pull {
        deliveries: vec![d("a", 0, "r1", 2, 5_000)],
    });
    let r = run(&h);
    assert_eq!(found(&r), vec!["duplicated"], "{r:#?}");
    assert!(r.valid);
}

#[test]
fn backward_seek_excuses_redelivery_after_ack() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    h.invoke(p, Some(1), Op::set_cursor(T, S, 0, true))
        .ok(OpResult::Cursor { cursor: 0 });
    pull_ok(&h, p, vec![d("a", 0, "r1", 1, 5_000)]);
    ack(&h, p, &[("r1", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert_eq!(found(&r), vec!["duplicated"], "{r:#?}");
    assert!(r.valid);
}

#[test]
fn double_ack_is_invalid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    // The same receipt acked again must be stale; the server said acked.
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["double_ack"], "{r:#?}");
    assert_eq!(r.double_ack.count, 1);
}

#[test]
fn double_ack_of_two_deliveries_is_invalid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    pull_ok(&h, p, vec![d("a", 0, "r1", 2, 2_000)]);
    ack(&h, p, &[("r1", "a")], ReceiptStatus::Acked);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["duplicated", "double_ack"], "{r:#?}");
}

#[test]
fn overlapping_leases_are_reported_not_invalid() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let q = h.next_process();
    // Lease [100, 1100], then a second delivery at 600: both consumers hold the record.
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    pull_ok(&h, q, vec![d("a", 0, "r1", 2, 600)]);
    ack(&h, q, &[("r1", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["duplicated", "lease_overlap"]);
    assert_eq!(r.lease_overlap.count, 1);
    assert!(r.lease_overlap.examples[0].detail.contains("by 500 ms"));
}

#[test]
fn lease_overlap_honours_per_pull_timeout_extend_and_nack() {
    // A pull's own ack_timeout_ms defines its lease: [lease_expires - 200, lease_expires].
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b", "c"], 0);
    let short = Op::Pull {
        topic: T.into(),
        subscription: S.into(),
        ack_timeout_ms: Some(200),
        final_drain: false,
    };
    h.invoke(p, Some(1), short.clone()).ok(OpResult::Pull {
        deliveries: vec![Delivery {
            lease_expires_ms: 300,
            ..d("a", 0, "ra0", 1, 0)
        }],
    });
    h.invoke(p, Some(1), short).ok(OpResult::Pull {
        deliveries: vec![Delivery {
            lease_expires_ms: 600,
            ..d("a", 0, "ra1", 2, 0)
        }],
    });
    // "b": the first lease was extended to 5000, so a delivery at 3000 overlaps it.
    pull_ok(&h, p, vec![d("b", 1, "rb0", 1, 100)]);
    h.invoke(
        p,
        Some(1),
        Op::Extend {
            topic: T.into(),
            subscription: S.into(),
            receipts: vec![("rb0".into(), "b".into())],
            ack_timeout_ms: Some(4_000),
        },
    )
    .ok(OpResult::Receipts {
        results: vec![raftq_client::api::ReceiptResult {
            receipt: "rb0".into(),
            status: ReceiptStatus::Extended,
            lease_expires_ms: Some(5_000),
        }],
    });
    pull_ok(&h, p, vec![d("b", 1, "rb1", 2, 3_000)]);
    // "c": nacked, so its redelivery at 500 does not overlap.
    pull_ok(&h, p, vec![d("c", 2, "rc0", 1, 100)]);
    h.invoke(
        p,
        Some(1),
        Op::Nack {
            topic: T.into(),
            subscription: S.into(),
            receipts: vec![("rc0".into(), "c".into())],
            delay_ms: 0,
        },
    )
    .ok(OpResult::receipts(vec![(
        "rc0".into(),
        ReceiptStatus::Released,
    )]));
    pull_ok(&h, p, vec![d("c", 2, "rc1", 2, 500)]);
    ack(
        &h,
        p,
        &[("ra1", "a"), ("rb1", "b"), ("rc1", "c")],
        ReceiptStatus::Acked,
    );
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(r.lease_overlap.count, 1, "{r:#?}");
    assert_eq!(r.lease_overlap.examples[0].value.as_deref(), Some("b"));
    assert_eq!(r.duplicated.count, 3);
}

#[test]
fn report_survives_a_jsonl_round_trip_of_its_history() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Acked);
    pull_ok(&h, p, vec![d("a", 0, "r1", 2, 5_000)]);
    let dir = std::env::temp_dir().join(format!("raftq-queue-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("history.jsonl");
    h.write_jsonl(&path).unwrap();
    let events = crate::history::read_jsonl(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(check(&events, &opts()), check(&h.events(), &opts()));
    let r = check(&events, &opts());
    assert_eq!(
        found(&r),
        vec![
            "lost",
            "never_delivered",
            "duplicated",
            "delivery_after_ack"
        ]
    );
}

#[test]
fn a_retried_publish_that_landed_once_is_valid_but_twice_is_appended_twice() {
    // The idempotent producer's retry after an unknown outcome: two attempts, one record.
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish(T, vals(&["a"])))
        .info("timeout");
    let q = h.next_process();
    h.invoke(q, Some(2), Op::publish(T, vals(&["a"])))
        .ok(OpResult::publish(0, 1, true));
    pull_ok(&h, q, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, q, &[("r0", "a")], ReceiptStatus::Acked);
    h.invoke(q, Some(1), Op::final_read(T, 1))
        .ok(OpResult::Records {
            records: vec![(0, "a".into())],
        });
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert!(found(&r).is_empty(), "{r:#?}");

    // The same, but the log holds the value at two offsets (seen by a final read).
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish(T, vals(&["a"])))
        .info("timeout");
    let q = h.next_process();
    h.invoke(q, Some(2), Op::publish(T, vals(&["a"])))
        .ok(OpResult::publish(1, 1, false));
    pull_ok(&h, q, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, q, &[("r0", "a")], ReceiptStatus::Acked);
    h.invoke(q, Some(1), Op::final_read(T, 1))
        .ok(OpResult::Records {
            records: vec![(0, "a".into()), (1, "a".into())],
        });
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["appended_twice"], "{r:#?}");
    assert!(r.appended_twice.examples[0].detail.contains("{0, 1}"));

    // Seen by deliveries alone: the value delivered at two offsets.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(
        &h,
        p,
        vec![d("a", 0, "r0", 1, 100), d("a", 1, "r1", 1, 100)],
    );
    ack(&h, p, &[("r0", "a"), ("r1", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(!r.valid);
    assert!(found(&r).contains(&"appended_twice"), "{r:#?}");
}

/// The leased queue's `lost`: delivered is not enough; an acknowledged value must be acked (an
/// `ok` ack answered `acked`) or dead-lettered by the end.
#[test]
fn delivered_but_never_acked_is_lost() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b"], 0);
    let c = h.next_process();
    pull_ok(
        &h,
        c,
        vec![d("a", 0, "r0", 1, 100), d("b", 1, "r1", 1, 100)],
    );
    ack(&h, c, &[("r0", "a")], ReceiptStatus::Acked);
    // "b" is never acked and never comes again, not even in the final drain.
    final_pull(&h, c, vec![]);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost"], "{r:#?}");
    assert_eq!(r.lost.count, 1);
    assert_eq!(r.lost.examples[0].value.as_deref(), Some("b"));
    assert_eq!(r.lost.examples[0].offset, Some(1));
    assert!(r.lost.examples[0].detail.contains("never acked"), "{r:#?}");
    assert_eq!(r.never_delivered.count, 0);
    assert_eq!(r.acked, 1);
    assert_eq!(r.verdict("x").failures, vec!["lost"]);

    // Acked when it came again (the final drain): fine.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    final_pull(&h, p, vec![d("a", 0, "r1", 2, 5_000)]);
    ack(&h, p, &[("r1", "a")], ReceiptStatus::Acked);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["duplicated"], "{r:#?}");
}

#[test]
fn dead_lettered_is_not_lost() {
    // By a nack answered `dead_lettered`.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    h.invoke(
        p,
        Some(1),
        Op::Nack {
            topic: T.into(),
            subscription: S.into(),
            receipts: vec![("r0".into(), "a".into())],
            delay_ms: 0,
        },
    )
    .ok(OpResult::receipts(vec![(
        "r0".into(),
        ReceiptStatus::DeadLettered,
    )]));
    final_pull(&h, p, vec![]);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert!(found(&r).is_empty(), "{r:#?}");
    assert_eq!(r.dead_lettered, 1);

    // Moved to the dead-letter topic (its lease expired `max_deliveries` times): seen there by
    // a pull or a final read, and not judged as a delivery of its own.
    for by_read in [false, true] {
        let h = History::new();
        let p = h.next_process();
        publish_ok(&h, p, &["a"], 0);
        pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
        if by_read {
            h.invoke(p, Some(1), Op::final_read("dlq", 1))
                .ok(OpResult::Records {
                    records: vec![(0, "a".into())],
                });
        } else {
            h.invoke(p, Some(1), Op::pull("dlq", "dlq-s"))
                .ok(OpResult::Pull {
                    deliveries: vec![d("a", 0, "x0", 1, 9_000)],
                });
        }
        let with_dlq = QueueOptions {
            dead_letter_topic: Some("dlq".into()),
            ..opts()
        };
        let r = check(&h.events(), &with_dlq);
        assert!(r.valid, "{r:#?}");
        assert!(found(&r).is_empty(), "{r:#?}");
        assert_eq!(r.dead_lettered, 1);
        // Without knowing the dead-letter topic, the value is lost.
        let r = check(&h.events(), &opts());
        assert!(!r.valid, "{r:#?}");
        assert!(found(&r).contains(&"lost"), "{r:#?}");
    }
}

#[test]
fn an_ack_that_did_not_answer_acked_does_not_count() {
    // Answered `stale`, a nack answered `released`, a failed ack: none settles the value.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b", "c"], 0);
    pull_ok(
        &h,
        p,
        vec![
            d("a", 0, "r0", 1, 100),
            d("b", 1, "r1", 1, 100),
            d("c", 2, "r2", 1, 100),
        ],
    );
    ack(&h, p, &[("r0", "a")], ReceiptStatus::Stale);
    h.invoke(
        p,
        Some(1),
        Op::Nack {
            topic: T.into(),
            subscription: S.into(),
            receipts: vec![("r1".into(), "b".into())],
            delay_ms: 0,
        },
    )
    .ok(OpResult::receipts(vec![(
        "r1".into(),
        ReceiptStatus::Released,
    )]));
    h.invoke(p, Some(1), Op::ack(T, S, vec![("r2".into(), "c".into())]))
        .fail("no_leader");
    // An `ok` ack whose results name another receipt only.
    h.invoke(p, Some(1), Op::ack(T, S, vec![("r2".into(), "c".into())]))
        .ok(OpResult::receipts(vec![(
            "r9".into(),
            ReceiptStatus::Acked,
        )]));
    final_pull(&h, p, vec![]);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost"], "{r:#?}");
    let lost: Vec<_> = r
        .lost
        .examples
        .iter()
        .map(|f| f.value.clone().unwrap_or_default())
        .collect();
    assert_eq!(lost, vec!["a", "b", "c"]);
}

#[test]
fn an_ack_with_an_unknown_outcome_is_in_doubt_not_lost() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b"], 0);
    pull_ok(
        &h,
        p,
        vec![d("a", 0, "r0", 1, 100), d("b", 1, "r1", 1, 100)],
    );
    // The ack of "a" timed out: it may have been applied, so "a" never coming back is no proof
    // of loss.
    h.invoke(p, Some(1), Op::ack(T, S, vec![("r0".into(), "a".into())]))
        .info("timeout");
    // The ack of "b" timed out too, but a retry answered acked.
    let q = h.next_process();
    h.invoke(q, Some(1), Op::ack(T, S, vec![("r1".into(), "b".into())]))
        .info("timeout");
    ack(&h, q, &[("r1", "b")], ReceiptStatus::Acked);
    final_pull(&h, q, vec![]);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["ack_unknown"], "{r:#?}");
    assert_eq!(r.ack_unknown.count, 1);
    assert_eq!(r.ack_unknown.examples[0].value.as_deref(), Some("a"));
    assert_eq!(r.acked, 1);
    assert_eq!((r.acked_records, r.ack_unknown_records), (1, 1));

    // The server's count of acks settles it: 2 means the unknown ack of "a" was applied; 1
    // means it was not, and "a" never came again: lost.
    let count = check_ack_count(&r, 2);
    assert_eq!(count.lost, 0, "{count:?}");
    let count = check_ack_count(&r, 1);
    assert_eq!(count.lost, 1, "{count:?}");
    assert!(count.detail.contains("never acked"), "{count:?}");
    // Fewer than the definite answers, or more than the history knows: described, and the
    // loss bounded by the records in doubt.
    assert_eq!(check_ack_count(&r, 0).lost, 1);
    assert_eq!(check_ack_count(&r, 3).lost, 0);
    assert!(check_ack_count(&r, 3).detail.contains("more than"));

    // An unknown ack of an earlier delivery settles nothing: the record came again, so that
    // ack was not applied before it, and the later delivery was never acked.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    pull_ok(&h, p, vec![d("a", 0, "r0", 1, 100)]);
    h.invoke(p, Some(1), Op::ack(T, S, vec![("r0".into(), "a".into())]))
        .info("timeout");
    let q = h.next_process();
    pull_ok(&h, q, vec![d("a", 0, "r1", 2, 5_000)]);
    final_pull(&h, q, vec![]);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost", "duplicated"], "{r:#?}");
    assert_eq!(r.ack_unknown_records, 0);
}

/// A publish of "a", then a pull of it (lease [`LEASE`]) by one consumer and a second delivery
/// of it to another consumer. Events: 0/1 publish, 2/3 first pull, 4/5 second pull.
fn redelivered(second_receipt: &str) -> History {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let (c1, c2) = (h.next_process(), h.next_process());
    pull_ok(&h, c1, vec![d("a", 0, "r0", 1, 100)]);
    pull_ok(&h, c2, vec![d("a", 0, second_receipt, 2, 1_100)]);
    ack(&h, c2, &[(second_receipt, "a")], ReceiptStatus::Acked);
    h
}

#[test]
fn a_redelivery_while_the_lease_still_runs_in_real_time_is_early() {
    // The first pull is invoked at 1000 ms; its lease of 1000 ms cannot end, in real time,
    // before 1000 + 990 - 100 = 1890 ms.
    let h = redelivered("r1");
    for (completed_ms, early) in [(1_500, true), (1_880, true), (1_890, false), (5_000, false)] {
        let events = timed(&h, &[(2, 1_000), (3, 1_010), (4, 1_020), (5, completed_ms)]);
        let r = check(&events, &opts());
        assert_eq!(r.early_redelivery.count, u64::from(early), "{r:#?}");
        assert_eq!(r.valid, !early, "{completed_ms} ms: {r:#?}");
        if early {
            assert_eq!(found(&r), vec!["duplicated", "early_redelivery"]);
            let f = &r.early_redelivery.examples[0];
            assert_eq!(f.value.as_deref(), Some("a"));
            assert_eq!(f.events, vec![2, 3, 4, 5]);
            assert!(
                f.detail.contains("could not have expired before 1890 ms"),
                "{}",
                f.detail
            );
            let v = r.verdict("clock-jump");
            assert_eq!(v.failures, vec!["early_redelivery"]);
        }
        assert_eq!(r.redeliveries_timed, 1);
    }
}

#[test]
fn nacks_extends_acks_and_per_pull_leases_move_the_real_time_end() {
    // A nack of the first receipt (answered released, or with an unknown outcome) invoked
    // before the second pull completed: not early. One answered stale released nothing.
    for (status, excused) in [
        (Some(ReceiptStatus::Released), true),
        (None, true),
        (Some(ReceiptStatus::Stale), false),
    ] {
        let h = History::new();
        let p = h.next_process();
        publish_ok(&h, p, &["a"], 0);
        let (c1, c2) = (h.next_process(), h.next_process());
        pull_ok(&h, c1, vec![d("a", 0, "r0", 1, 100)]);
        let nack = h.invoke(
            c1,
            Some(1),
            Op::Nack {
                topic: T.into(),
                subscription: S.into(),
                receipts: vec![("r0".into(), "a".into())],
                delay_ms: 0,
            },
        );
        match status {
            Some(status) => {
                nack.ok(OpResult::receipts(vec![("r0".into(), status)]));
            }
            None => {
                nack.info("timeout");
            }
        }
        pull_ok(&h, c2, vec![d("a", 0, "r1", 2, 300)]);
        ack(&h, c2, &[("r1", "a")], ReceiptStatus::Acked);
        let events = timed(
            &h,
            &[(2, 1_000), (3, 1_010), (4, 1_100), (5, 1_110), (7, 1_300)],
        );
        let r = check(&events, &opts());
        assert_eq!(r.early_redelivery.is_empty(), excused, "{status:?}: {r:#?}");
    }

    // An extend answered `extended` (lease 2000 ms, invoked at 1500 ms) moves the end to
    // 1500 + 1980 - 100 = 3380 ms.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let (c1, c2) = (h.next_process(), h.next_process());
    pull_ok(&h, c1, vec![d("a", 0, "r0", 1, 100)]);
    h.invoke(
        c1,
        Some(1),
        Op::Extend {
            topic: T.into(),
            subscription: S.into(),
            receipts: vec![("r0".into(), "a".into())],
            ack_timeout_ms: Some(2_000),
        },
    )
    .ok(OpResult::Receipts {
        results: vec![raftq_client::api::ReceiptResult {
            receipt: "r0".into(),
            status: ReceiptStatus::Extended,
            lease_expires_ms: Some(3_500),
        }],
    });
    pull_ok(&h, c2, vec![d("a", 0, "r1", 2, 3_600)]);
    ack(&h, c2, &[("r1", "a")], ReceiptStatus::Acked);
    for (completed_ms, early) in [(3_000, true), (3_400, false)] {
        let events = timed(
            &h,
            &[
                (2, 1_000),
                (3, 1_010),
                (4, 1_500),
                (5, 1_510),
                (7, completed_ms),
            ],
        );
        let r = check(&events, &opts());
        assert_eq!(r.early_redelivery.count, u64::from(early), "{r:#?}");
    }

    // A pull that asked for its own, longer lease (5000 ms): early until 1000 + 4950 - 100.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let (c1, c2) = (h.next_process(), h.next_process());
    h.invoke(
        c1,
        Some(1),
        Op::Pull {
            topic: T.into(),
            subscription: S.into(),
            ack_timeout_ms: Some(5_000),
            final_drain: false,
        },
    )
    .ok(OpResult::Pull {
        deliveries: vec![Delivery {
            lease_expires_ms: 5_100,
            ..d("a", 0, "r0", 1, 0)
        }],
    });
    final_pull(&h, c2, vec![d("a", 0, "r1", 2, 5_200)]);
    ack(&h, c2, &[("r1", "a")], ReceiptStatus::Acked);
    for (completed_ms, early) in [(5_000, true), (5_900, false)] {
        let events = timed(&h, &[(2, 1_000), (3, 1_010), (4, 1_020), (5, completed_ms)]);
        let r = check(&events, &opts());
        assert_eq!(r.early_redelivery.count, u64::from(early), "{r:#?}");
    }

    // Acked, then delivered again at once: that is `delivery_after_ack`, not an early expiry.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let c = h.next_process();
    pull_ok(&h, c, vec![d("a", 0, "r0", 1, 100)]);
    ack(&h, c, &[("r0", "a")], ReceiptStatus::Acked);
    pull_ok(&h, c, vec![d("a", 0, "r1", 2, 200)]);
    let events = timed(
        &h,
        &[(2, 1_000), (3, 1_010), (4, 1_020), (5, 1_030), (7, 1_100)],
    );
    let r = check(&events, &opts());
    assert_eq!(
        found(&r),
        vec!["duplicated", "delivery_after_ack", "lease_overlap"],
        "{r:#?}"
    );
}

#[test]
fn a_server_that_stamps_a_leaping_wall_clock_is_caught() {
    // What a server stamping its leader's wall clock would do when that clock leaps ten minutes
    // ahead: a holder's lease of 20 s, granted at 2 s and held, expires at once, and another
    // consumer gets the record 300 ms after the leap, at 6.3 s of real time.
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a", "b"], 0);
    let (holder, other) = (h.next_process(), h.next_process());
    let long = |receipt: &str, value: &str, offset: u64, start: u64| Delivery {
        value: value.into(),
        offset,
        receipt: receipt.into(),
        delivery_count: if receipt.ends_with('0') { 1 } else { 2 },
        lease_expires_ms: start + 20_000,
    };
    pull_ok(
        &h,
        holder,
        vec![long("ra0", "a", 0, 2_000), long("rb0", "b", 1, 2_000)],
    );
    pull_ok(
        &h,
        other,
        vec![long("ra1", "a", 0, 606_000), long("rb1", "b", 1, 606_000)],
    );
    ack(
        &h,
        other,
        &[("ra1", "a"), ("rb1", "b")],
        ReceiptStatus::Acked,
    );
    // The holder's acks come too late: its receipts are stale.
    ack(
        &h,
        holder,
        &[("ra0", "a"), ("rb0", "b")],
        ReceiptStatus::Stale,
    );
    let events = timed(&h, &[(2, 2_000), (3, 2_010), (4, 6_000), (5, 6_300)]);
    let opts = QueueOptions {
        ack_timeout_ms: 20_000,
        ..opts()
    };
    let r = check(&events, &opts);
    assert!(!r.valid);
    assert_eq!(r.early_redelivery.count, 2, "{r:#?}");
    // By server time alone nothing overlaps: the leap moved the server's own clock.
    assert!(r.lease_overlap.is_empty());
}

/// A history with the retention topic "aged": "x" published (invoked at 1 s, ok), "y"
/// published with an unknown outcome, then one final read through node 1 that has `seen`.
/// Events: 0/1 publish x, 2/3 publish y, 4/5 the final read.
fn aged_history(seen: &[&str]) -> History {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish("aged", vals(&["x"])))
        .ok(OpResult::publish(0, 1, false));
    h.invoke(p, Some(1), Op::publish("aged", vals(&["y"])))
        .info("timeout");
    h.invoke(p, Some(1), Op::final_read("aged", 1))
        .ok(OpResult::Records {
            records: seen
                .iter()
                .enumerate()
                .map(|(i, v)| (i as u64, v.to_string()))
                .collect(),
        });
    h
}

fn aged_opts() -> QueueOptions {
    QueueOptions {
        retention: Some(super::RetentionTopic {
            topic: "aged".into(),
            max_age_ms: 10_000,
        }),
        ..opts()
    }
}

#[test]
fn a_record_younger_than_its_maximum_age_must_still_be_there() {
    // "x" was published from 1 s on: it may go at 1000 + 9900 - 100 = 10 800 ms at the
    // earliest.
    for (read_ms, seen, early) in [
        (5_000, &["x"][..], false),
        (5_000, &[][..], true),
        (10_700, &[][..], true),
        (10_800, &[][..], false),
        (60_000, &[][..], false),
    ] {
        let h = aged_history(seen);
        let events = timed(
            &h,
            &[(0, 1_000), (1, 1_010), (4, read_ms - 10), (5, read_ms)],
        );
        let r = check(&events, &aged_opts());
        assert_eq!(
            r.early_retention.count,
            u64::from(early),
            "{read_ms}: {r:#?}"
        );
        assert_eq!(r.valid, !early, "{read_ms} {seen:?}: {r:#?}");
        // The retention topic is never pulled: its values are not lost for that.
        assert!(r.lost.is_empty(), "{r:#?}");
        assert_eq!(r.acknowledged, 0);
        assert_eq!(r.retention_checked, 1);
        if early {
            let f = &r.early_retention.examples[0];
            assert_eq!(f.value.as_deref(), Some("x"));
            assert_eq!(f.events, vec![0, 5]);
            assert!(f.detail.contains("through node 1"), "{}", f.detail);
            assert_eq!(r.verdict("clock-jump").failures, vec!["early_retention"]);
        } else if seen.is_empty() {
            assert_eq!(r.retention_expired, 1);
        }
    }
    // Without knowing the topic has a maximum age, its acknowledged values count as lost.
    let r = check(&spaced(&aged_history(&["x"])), &opts());
    assert_eq!(found(&r), vec!["lost", "never_delivered"]);
}
