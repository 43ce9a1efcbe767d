//! One clean history, and for each anomaly a history that has exactly it.

use super::{check, StreamReport};
use crate::history::{History, Op, OpResult, Phase, Process};

const T: &str = "t";
const S: &str = "s";

fn publish_ok(h: &History, p: Process, values: &[&str], first: u64) {
    h.invoke(
        p,
        Some(1),
        Op::publish(T, values.iter().map(|v| v.to_string()).collect()),
    )
    .ok(OpResult::publish(first, values.len(), false));
}

fn recs(records: &[(u64, &str)]) -> Vec<(u64, String)> {
    records.iter().map(|(o, v)| (*o, v.to_string())).collect()
}

/// An ok read by `p` through subscription `sub` from `from`.
fn read(
    h: &History,
    p: Process,
    sub: Option<&str>,
    from: Option<u64>,
    records: &[(u64, &str)],
    next_offset: u64,
    cursor: Option<u64>,
) {
    h.invoke(p, Some(2), Op::read(T, sub, from))
        .ok(OpResult::Read {
            records: recs(records),
            next_offset,
            skipped: 0,
            cursor,
        });
}

fn final_read(h: &History, p: Process, node: u64, records: &[(u64, &str)]) {
    h.invoke(p, Some(node), Op::final_read(T, node))
        .ok(OpResult::Records {
            records: recs(records),
        });
}

fn run(h: &History) -> StreamReport {
    let report = check(&h.events());
    serde_json::to_string(&report).expect("report serializes");
    report
}

fn found(r: &StreamReport) -> Vec<&'static str> {
    r.table()
        .iter()
        .filter(|(_, a, _)| !a.is_empty())
        .map(|(n, _, _)| *n)
        .collect()
}

const ABC: &[(u64, &str)] = &[(0, "a"), (1, "b"), (2, "c")];

#[test]
fn clean_history_is_valid() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b"], 0);
    publish_ok(&h, w, &["c"], 2);
    h.invoke(w, Some(1), Op::publish(T, vec!["never".into()]))
        .fail("no_leader");
    let r1 = h.next_process();
    // Resume at the cursor, then pass each next_offset as the next `from`.
    read(&h, r1, Some(S), None, &[(0, "a"), (1, "b")], 2, Some(0));
    read(&h, r1, Some(S), Some(2), &[(2, "c")], 3, Some(2));
    read(&h, r1, Some(S), Some(3), &[], 3, Some(3));
    // An explicit cursor move forward, then a resume from there.
    h.invoke(r1, Some(1), Op::set_cursor(T, S, 3, false))
        .ok(OpResult::Cursor { cursor: 3 });
    read(&h, r1, Some(S), None, &[], 3, Some(3));
    // A reader without a subscription seeks where it likes.
    let r2 = h.next_process();
    read(&h, r2, None, Some(1), &[(1, "b"), (2, "c")], 3, None);
    read(&h, r2, None, Some(0), &[(0, "a")], 1, None);
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("partition", Phase::Start, vec![1]),
    )
    .ok(OpResult::Fault {
        detail: "isolated 1".into(),
    });
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("partition", Phase::Stop, vec![]),
    )
    .ok(OpResult::Fault {
        detail: "healed".into(),
    });
    let f = h.next_process();
    for node in 1..=3 {
        final_read(&h, f, node, ABC);
    }
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new(), "{r:#?}");
    assert_eq!(r.acknowledged, 3);
    assert_eq!(r.seen, 3);
    assert_eq!(r.final_reads, 3);
    assert_eq!(r.highest_read[T], 2);
    let v = r.verdict("clean");
    assert!(v.valid);
    assert_eq!(v.anomalies.len(), 10);
    assert_eq!((v.ops, v.ok, v.fail, v.info), (13, 12, 1, 0));
}

#[test]
fn one_offset_two_values_is_inconsistent() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a"], 0);
    let r1 = h.next_process();
    read(&h, r1, None, Some(0), &[(0, "a")], 1, None);
    let r2 = h.next_process();
    read(&h, r2, None, Some(0), &[(0, "ghost")], 1, None);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["inconsistent_offsets"], "{r:#?}");
    assert_eq!(r.inconsistent_offsets.examples[0].offset, Some(0));
}

#[test]
fn retry_after_info_may_duplicate() {
    let h = History::new();
    let w = h.next_process();
    h.invoke(w, Some(1), Op::publish(T, vec!["a".into()]))
        .info("timeout");
    let w2 = h.next_process();
    publish_ok(&h, w2, &["a"], 1);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (1, "a")], 2, Some(0));
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["duplicates"]);
}

#[test]
fn value_at_two_offsets_without_retry_is_unexplained() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (1, "a")], 2, Some(0));
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["unexplained_duplicates"], "{r:#?}");
}

#[test]
fn idempotent_retry_must_not_duplicate() {
    let h = History::new();
    let idem = |w| {
        h.invoke(
            w,
            Some(1),
            Op::Publish {
                topic: T.into(),
                values: vec!["a".into()],
                producer_id: Some("p-1".into()),
                sequence: Some(0),
            },
        )
    };
    idem(h.next_process()).info("timeout");
    idem(h.next_process()).ok(OpResult::publish(1, 1, true));
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (1, "a")], 2, Some(0));
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["unexplained_duplicates"], "{r:#?}");
}

#[test]
fn acknowledged_below_highest_read_unseen_is_lost() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, None, Some(0), &[(0, "a")], 1, None);
    let r2 = h.next_process();
    read(&h, r2, None, Some(2), &[(2, "c")], 3, None);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost", "unseen"], "{r:#?}");
    assert_eq!(r.lost.count, 1);
    assert_eq!(r.lost.examples[0].value.as_deref(), Some("b"));
}

#[test]
fn unseen_without_final_read_is_reported_only() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a")], 1, Some(0));
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), vec!["unseen"]);
}

/// The negative control: acknowledged publishes missing from the final reads through every
/// node (an all-nodes kill of a build that answers before fsync).
#[test]
fn acknowledged_missing_from_final_reads_is_lost() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b"], 0);
    publish_ok(&h, w, &["c", "d"], 2);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (1, "b")], 2, Some(0));
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
    let f = h.next_process();
    for node in 1..=3 {
        final_read(&h, f, node, &[(0, "a"), (1, "b")]);
    }
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["lost", "unseen"], "{r:#?}");
    assert_eq!(r.lost.count, 2);
    let v = r.verdict("kill-all, no fsync");
    assert!(!v.valid);
    assert_eq!(v.failures, vec!["lost"]);
}

#[test]
fn resume_past_previous_end_is_poll_skip() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), None, &[(0, "a")], 1, Some(0));
    // Resumes at the cursor, and starts at 2, not 1.
    read(&h, r1, Some(S), None, &[(2, "c")], 3, Some(0));
    // "b" was seen by someone else: nothing is lost.
    let r2 = h.next_process();
    read(&h, r2, None, Some(1), &[(1, "b")], 2, None);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["poll_skip"], "{r:#?}");
    assert_eq!(r.poll_skip.examples[0].offset, Some(1));
}

#[test]
fn gaps_inside_a_read_and_past_from_are_poll_skips() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (2, "c")], 3, Some(0));
    let r2 = h.next_process();
    read(&h, r2, None, Some(0), &[(1, "b")], 2, None);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["poll_skip"], "{r:#?}");
    assert_eq!(r.poll_skip.count, 2);
}

#[test]
fn retention_skip_is_not_a_poll_skip() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, None, Some(0), ABC, 3, None);
    let r2 = h.next_process();
    h.invoke(r2, Some(2), Op::read(T, Some(S), Some(0)))
        .ok(OpResult::Read {
            records: recs(&[(2, "c")]),
            next_offset: 3,
            skipped: 2,
            cursor: Some(0),
        });
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new());
}

#[test]
fn going_back_without_a_seek_is_nonmonotonic_poll() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), None, &[(0, "a"), (1, "b")], 2, Some(0));
    read(&h, r1, Some(S), None, &[(1, "b"), (2, "c")], 3, Some(0));
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["nonmonotonic_poll"], "{r:#?}");
}

#[test]
fn going_back_after_an_explicit_seek_is_fine() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(0), &[(0, "a"), (1, "b")], 2, Some(0));
    read(&h, r1, Some(S), Some(2), &[(2, "c")], 3, Some(2));
    h.invoke(r1, Some(1), Op::set_cursor(T, S, 1, true))
        .ok(OpResult::Cursor { cursor: 1 });
    read(&h, r1, Some(S), None, &[(1, "b"), (2, "c")], 3, Some(1));
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new());
}

#[test]
fn later_publish_at_lower_offset_is_nonmonotonic_send() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a"], 5);
    publish_ok(&h, w, &["b"], 3);
    let r = run(&h);
    assert!(!r.valid);
    // Nobody read: both are unseen, which without a final read is only reported.
    assert_eq!(found(&r), vec!["unseen", "nonmonotonic_send"], "{r:#?}");
    assert_eq!(r.nonmonotonic_send.count, 1);
}

#[test]
fn cursor_reported_lower_after_higher_is_cursor_backward() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    read(&h, r1, Some(S), Some(2), &[(2, "c")], 3, Some(2));
    // Invoked after r1's read completed; the server reports the cursor at 1.
    let r2 = h.next_process();
    read(&h, r2, Some(S), None, &[(1, "b"), (2, "c")], 3, Some(1));
    let r3 = h.next_process();
    read(&h, r3, None, Some(0), &[(0, "a")], 1, None);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["cursor_backward"], "{r:#?}");
    assert_eq!(r.cursor_backward.examples[0].offset, Some(1));
}

/// The stream workload's pattern: each ok read is followed by a forward-only cursor move to
/// where the read started, whose answer is the cursor as the server holds it.
fn read_then_probe(h: &History, p: Process, from: u64, records: &[(u64, &str)], cursor: u64) {
    let next = records.last().map_or(from, |r| r.0 + 1);
    read(h, p, Some(S), Some(from), records, next, None);
    h.invoke(p, Some(1), Op::set_cursor(T, S, from, false))
        .ok(OpResult::Cursor { cursor });
}

#[test]
fn probed_cursors_that_only_grow_are_valid() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c", "d"], 0);
    let r1 = h.next_process();
    read_then_probe(&h, r1, 0, &[(0, "a"), (1, "b")], 0);
    read_then_probe(&h, r1, 2, &[(2, "c")], 2);
    // A probe refused because the cursor is higher says nothing about the cursor.
    h.invoke(r1, Some(1), Op::set_cursor(T, S, 1, false))
        .fail("400 invalid_argument");
    // A retired reader's successor resumes at the cursor and probes there: equal is fine.
    let r2 = h.next_process();
    read(&h, r2, Some(S), None, &[(3, "d")], 4, None);
    h.invoke(r2, Some(1), Op::set_cursor(T, S, 3, false))
        .ok(OpResult::Cursor { cursor: 3 });
    read_then_probe(&h, r2, 4, &[], 4);
    read_then_probe(&h, r2, 4, &[], 4);
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new(), "{r:#?}");
}

#[test]
fn probed_cursor_lower_than_an_earlier_probe_is_cursor_backward() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c", "d"], 0);
    let r1 = h.next_process();
    read_then_probe(&h, r1, 0, &[(0, "a"), (1, "b")], 0);
    read_then_probe(&h, r1, 2, &[(2, "c"), (3, "d")], 2);
    // The cursor moved to 4 (the next read says so) and the server confirmed it...
    read_then_probe(&h, r1, 4, &[], 4);
    // ...then, after a crash, a fresh process resumes at 2 and the server accepts 2 as the
    // cursor: it went back without anyone asking.
    let r2 = h.next_process();
    read(&h, r2, Some(S), None, &[(2, "c"), (3, "d")], 4, None);
    h.invoke(r2, Some(3), Op::set_cursor(T, S, 2, false))
        .ok(OpResult::Cursor { cursor: 2 });
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["cursor_backward"], "{r:#?}");
    assert_eq!(r.cursor_backward.count, 1);
    let finding = &r.cursor_backward.examples[0];
    assert_eq!(finding.offset, Some(2));
    assert_eq!(finding.subscription.as_deref(), Some(S));
    assert!(finding.detail.contains("cursor 4"), "{}", finding.detail);
    assert!(!r.verdict("probe").valid);
}

#[test]
fn cursor_lower_in_concurrent_or_after_backward_move_is_fine() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b", "c"], 0);
    let r1 = h.next_process();
    let r2 = h.next_process();
    // Concurrent: r2 invoked before r1 completed.
    let pending = h.invoke(r2, Some(2), Op::read(T, Some(S), None));
    read(&h, r1, Some(S), Some(2), &[(2, "c")], 3, Some(2));
    pending.ok(OpResult::Read {
        records: recs(ABC),
        next_offset: 3,
        skipped: 0,
        cursor: Some(0),
    });
    // After a backward move.
    let r3 = h.next_process();
    h.invoke(r3, Some(1), Op::set_cursor(T, S, 0, true))
        .ok(OpResult::Cursor { cursor: 0 });
    read(&h, r3, Some(S), None, ABC, 3, Some(0));
    let r = run(&h);
    assert!(r.valid, "{r:#?}");
    assert_eq!(found(&r), Vec::<&str>::new());
}

#[test]
fn final_reads_that_differ_are_divergence() {
    let h = History::new();
    let w = h.next_process();
    publish_ok(&h, w, &["a", "b"], 0);
    let f = h.next_process();
    final_read(&h, f, 1, &[(0, "a"), (1, "b")]);
    final_read(&h, f, 2, &[(0, "a"), (1, "b")]);
    final_read(&h, f, 3, &[(0, "a")]);
    let r = run(&h);
    assert!(!r.valid);
    assert_eq!(found(&r), vec!["divergence"], "{r:#?}");
    assert_eq!(r.divergence.count, 1);
    assert!(r.divergence.examples[0].detail.contains("node 3"));
}
