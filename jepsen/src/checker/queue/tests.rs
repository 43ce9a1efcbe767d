//! One clean history, and for each anomaly a history that has exactly it.

use raftq_client::api::ReceiptStatus;

use super::{check, QueueOptions, QueueReport};
use crate::history::{Delivery, History, Op, OpResult, Phase, Process};

const T: &str = "q";
const S: &str = "s";
/// Lease length the tests' pulls get (the checker's default is 30 s; tests pass it).
const LEASE: u64 = 1_000;

fn opts() -> QueueOptions {
    QueueOptions {
        ack_timeout_ms: LEASE,
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

fn run(h: &History) -> QueueReport {
    let report = check(&h.events(), &opts());
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
    let v = r.verdict("clean");
    assert!(v.valid);
    assert_eq!(v.anomalies.len(), 9);
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
    assert_eq!(found(&r), vec!["lost"], "{r:#?}");
    assert_eq!(r.lost.count, 2);
    let lost: Vec<_> = r
        .lost
        .examples
        .iter()
        .map(|f| f.value.clone().unwrap())
        .collect();
    assert_eq!(lost, vec!["c", "d"]);
    assert_eq!(r.lost.examples[0].subscription.as_deref(), Some(S));
    let v = r.verdict("kill-all, no fsync");
    assert!(!v.valid);
    assert_eq!(v.failures, vec!["lost"]);
    assert_eq!(v.anomalies["lost"], 2);
}

#[test]
fn acknowledged_but_never_pulled_topic_is_lost() {
    let h = History::new();
    let p = h.next_process();
    publish_ok(&h, p, &["a"], 0);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost"]);
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
    assert_eq!(found(&r), vec!["lost", "duplicated", "delivery_after_ack"]);
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
