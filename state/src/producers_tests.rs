//! Idempotent producers, broadcast and the report counters: table tests for the rules, and a
//! property test that the balance identities hold and no counter decreases after any entry.

use proptest::prelude::*;

use super::producers::{MAX_PRODUCERS_PER_TOPIC, PRODUCER_IDLE_EXPIRY_MS, REMEMBERED_BATCHES};
use super::subscriptions_tests::{settings, Harness};
use super::*;

fn record(v: &str) -> NewRecord {
    NewRecord {
        key: None,
        headers: vec![],
        value: v.as_bytes().to_vec(),
    }
}

fn idempotent(topic: &str, producer: &str, sequence: u64, n: usize) -> Command {
    let records = (0..n)
        .map(|i| record(&format!("{producer}-{sequence}-{i}")))
        .collect();
    idempotent_records(topic, producer, sequence, records)
}

/// A publish of `records` as batch `sequence` of `producer`.
fn idempotent_records(
    topic: &str,
    producer: &str,
    sequence: u64,
    records: Vec<NewRecord>,
) -> Command {
    Command::Publish(Publish {
        topic: topic.into(),
        records,
        producer: Some(ProducerSeq {
            producer_id: producer.into(),
            sequence,
        }),
    })
}

fn published(first_offset: u64, last_offset: u64, duplicate: bool) -> CommandResult {
    Ok(Outcome::Published {
        first_offset,
        last_offset,
        duplicate,
    })
}

fn gap(producer: &str, expected: u64, got: u64) -> CommandResult {
    Err(ApplyError::SequenceGap {
        producer_id: producer.into(),
        expected,
        got,
    })
}

#[test]
fn a_resent_batch_answers_its_original_offsets_and_appends_nothing() {
    let mut h = Harness::new();
    h.topic("t");
    assert_eq!(h.run(idempotent("t", "p", 0, 3)), published(0, 2, false));
    assert_eq!(h.run(idempotent("t", "q", 0, 1)), published(3, 3, false));
    let records_before = h.records.0.len();
    assert_eq!(h.run(idempotent("t", "p", 0, 3)), published(0, 2, true));
    assert_eq!(
        h.records.0.len(),
        records_before,
        "a duplicate appends nothing"
    );
    assert_eq!(h.run(idempotent("t", "p", 1, 2)), published(4, 5, false));
    assert_eq!(h.run(idempotent("t", "p", 1, 2)), published(4, 5, true));
    let meta = &h.state.topics["t"];
    assert_eq!(meta.next_offset, 6);
    assert_eq!(meta.counters.published, 6);
    assert_eq!(meta.counters.deduplicated, 5);
}

#[test]
fn a_sequence_ahead_of_the_next_is_a_gap_and_changes_nothing() {
    let mut h = Harness::new();
    h.topic("t");
    assert_eq!(h.run(idempotent("t", "p", 1, 1)), gap("p", 0, 1));
    assert!(h.state.producers.get("t", "p").is_none());
    assert_eq!(h.run(idempotent("t", "p", 0, 1)), published(0, 0, false));
    assert_eq!(h.run(idempotent("t", "p", 5, 1)), gap("p", 1, 5));
    assert_eq!(h.state.topics["t"].next_offset, 1);
    assert_eq!(h.state.producers.get("t", "p").unwrap().next_sequence, 1);
    // Sequences are per topic: the same producer starts at 0 on another topic.
    h.topic("u");
    assert_eq!(h.run(idempotent("u", "p", 1, 1)), gap("p", 0, 1));
    assert_eq!(h.run(idempotent("u", "p", 0, 1)), published(0, 0, false));
}

#[test]
fn refused_batches_do_not_consume_their_sequence() {
    let mut h = Harness::new();
    h.ok(Command::CreateTopic(CreateTopic {
        name: "t".into(),
        settings: TopicSettings {
            max_record_bytes: Some(4),
            ..Default::default()
        },
    }));
    let too_big = idempotent_records("t", "p", 0, vec![record("12345")]);
    assert!(matches!(h.run(too_big), Err(ApplyError::RecordTooLarge(_))));
    let ok = idempotent_records("t", "p", 0, vec![record("1234")]);
    assert_eq!(h.run(ok), published(0, 0, false));
    let bad_id = idempotent_records("t", "has space", 0, vec![record("1")]);
    assert!(matches!(h.run(bad_id), Err(ApplyError::InvalidArgument(_))));
}

#[test]
fn batches_older_than_the_remembered_window_are_refused_as_already_existing() {
    let mut h = Harness::new();
    h.topic("t");
    let total = REMEMBERED_BATCHES as u64 + 6;
    for seq in 0..total {
        assert_eq!(
            h.run(idempotent("t", "p", seq, 1)),
            published(seq, seq, false)
        );
    }
    let oldest_kept = total - REMEMBERED_BATCHES as u64;
    assert_eq!(
        h.run(idempotent("t", "p", oldest_kept, 1)),
        published(oldest_kept, oldest_kept, true)
    );
    match h.run(idempotent("t", "p", oldest_kept - 1, 1)) {
        Err(ApplyError::AlreadyExists(detail)) => {
            assert!(detail.contains("no longer remembered"), "{detail}")
        }
        other => panic!("expected already_exists, got {other:?}"),
    }
    assert_eq!(h.state.topics["t"].next_offset, total);
}

#[test]
fn batches_of_one_producer_in_one_entry_apply_in_order() {
    let mut h = Harness::new();
    h.topic("t");
    let mut writes = Vec::new();
    let resp = apply_entry(
        &mut h.state,
        &h.records,
        2,
        &Batch {
            timestamp_ms: 5_000,
            commands: vec![
                idempotent("t", "p", 1, 1),
                idempotent("t", "p", 0, 1),
                idempotent("t", "p", 1, 1),
                idempotent("t", "p", 0, 1),
            ],
        },
        &mut writes,
    )
    .expect("no record read fails");
    assert_eq!(
        resp.results,
        vec![
            gap("p", 0, 1),
            published(0, 0, false),
            published(1, 1, false),
            published(0, 0, true),
        ]
    );
}

#[test]
fn idle_producers_are_forgotten_by_log_time() {
    let mut h = Harness::new();
    h.topic("t");
    h.clock = 10_000;
    h.run(idempotent("t", "p", 0, 1)).unwrap();
    h.clock = 10_000 + PRODUCER_IDLE_EXPIRY_MS / 2;
    h.run(idempotent("t", "q", 0, 1)).unwrap();
    h.clock = 10_000 + PRODUCER_IDLE_EXPIRY_MS - 1;
    h.ok(Command::Tick);
    assert!(
        h.state.producers.get("t", "p").is_some(),
        "not idle long enough"
    );
    h.clock = 10_000 + PRODUCER_IDLE_EXPIRY_MS;
    let mut writes = Vec::new();
    apply_entry(
        &mut h.state,
        &h.records,
        99,
        &Batch {
            timestamp_ms: h.clock,
            commands: vec![Command::Tick],
        },
        &mut writes,
    )
    .expect("no record read fails");
    assert!(writes.contains(&Write::DeleteProducer {
        topic: "t".into(),
        producer_id: "p".into(),
    }));
    assert!(h.state.producers.get("t", "p").is_none());
    assert!(
        h.state.producers.get("t", "q").is_some(),
        "q was active later"
    );
    // A forgotten producer starts over at 0.
    assert_eq!(h.run(idempotent("t", "p", 1, 1)), gap("p", 0, 1));
}

#[test]
fn the_least_recently_active_producer_is_forgotten_beyond_the_cap() {
    let mut h = Harness::new();
    h.topic("t");
    for i in 0..MAX_PRODUCERS_PER_TOPIC {
        h.clock += 1;
        h.run(idempotent("t", &format!("p{i}"), 0, 1)).unwrap();
    }
    // p0 publishes again: p1 is now the least recently active.
    h.clock += 1;
    h.run(idempotent("t", "p0", 1, 1)).unwrap();
    h.clock += 1;
    h.run(idempotent("t", "new", 0, 1)).unwrap();
    assert_eq!(h.state.producers.count("t"), MAX_PRODUCERS_PER_TOPIC);
    assert!(h.state.producers.get("t", "p1").is_none());
    assert!(h.state.producers.get("t", "p0").is_some());
    assert!(h.state.producers.get("t", "new").is_some());
}

#[test]
fn deleting_a_topic_forgets_its_producers() {
    let mut h = Harness::new();
    h.topic("t");
    h.run(idempotent("t", "p", 0, 1)).unwrap();
    h.ok(Command::DeleteTopic(DeleteTopic { name: "t".into() }));
    h.topic("t");
    assert_eq!(h.run(idempotent("t", "p", 1, 1)), gap("p", 0, 1));
    assert_eq!(h.run(idempotent("t", "p", 0, 1)), published(0, 0, false));
}

fn broadcast(topics: Option<&[&str]>, value: &str) -> Command {
    Command::Broadcast(Broadcast {
        topics: topics.map(|t| t.iter().map(|s| s.to_string()).collect()),
        record: NewRecord {
            key: None,
            headers: vec![("who".into(), "test".into())],
            value: value.as_bytes().to_vec(),
        },
    })
}

#[test]
fn a_broadcast_marks_every_named_topic_with_its_commit_point_or_none() {
    let mut h = Harness::new();
    h.topic("a");
    h.topic("b");
    h.topic("c");
    h.publish("b", &["x", "y"]);
    h.clock = 77_000;
    let offsets = match h.ok(broadcast(Some(&["a", "b", "a"]), "tick")) {
        Outcome::Broadcast { offsets } => offsets,
        other => panic!("{other:?}"),
    };
    let index = h.index;
    assert_eq!(
        offsets,
        [("a".into(), 0), ("b".into(), 2)].into_iter().collect()
    );
    for (topic, offset) in &offsets {
        let id = h.state.topics[topic].id;
        let marker = &h.records.0[&(id, *offset)];
        let header = |k: &str| {
            marker
                .headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header(HEADER_COMMIT_INDEX), Some(index.to_string()));
        assert_eq!(header(HEADER_COMMIT_TIMESTAMP_MS), Some("77000".into()));
        assert_eq!(header("who"), Some("test".into()));
        assert_eq!(marker.value, b"tick");
    }
    assert_eq!(h.state.topics["c"].next_offset, 0, "c was not named");

    // All topics when none are named.
    match h.ok(broadcast(None, "")) {
        Outcome::Broadcast { offsets } => assert_eq!(offsets.len(), 3),
        other => panic!("{other:?}"),
    }

    // One missing topic: nothing anywhere.
    let before: Vec<u64> = h.state.topics.values().map(|m| m.next_offset).collect();
    assert_eq!(
        h.run(broadcast(Some(&["a", "missing"]), "x")),
        Err(ApplyError::TopicNotFound("missing".into()))
    );
    // A marker too large for one topic: nothing anywhere.
    h.ok(Command::CreateTopic(CreateTopic {
        name: "small".into(),
        settings: TopicSettings {
            max_record_bytes: Some(8),
            ..Default::default()
        },
    }));
    assert!(matches!(
        h.run(broadcast(Some(&["a", "small"]), "x")),
        Err(ApplyError::RecordTooLarge(_))
    ));
    let after: Vec<u64> = h
        .state
        .topics
        .iter()
        .filter(|(n, _)| *n != "small")
        .map(|(_, m)| m.next_offset)
        .collect();
    assert_eq!(before, after);
}

// ----- balances -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Publish(usize),
    Idempotent(u8, u64),
    Pull(u8, u32),
    Ack(u8, usize),
    Nack(u8, usize, bool),
    Advance(u64),
    Seek(u8, u64, bool),
    Broadcast,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..4).prop_map(Op::Publish),
        (0u8..2, 0u64..4).prop_map(|(p, s)| Op::Idempotent(p, s)),
        (0u8..2, 1u32..4).prop_map(|(s, m)| Op::Pull(s, m)),
        (0u8..2, any::<usize>()).prop_map(|(s, i)| Op::Ack(s, i)),
        (0u8..2, any::<usize>(), any::<bool>()).prop_map(|(s, i, d)| Op::Nack(s, i, d)),
        (0u64..400).prop_map(Op::Advance),
        (0u8..2, 0u64..40, any::<bool>()).prop_map(|(s, o, b)| Op::Seek(s, o, b)),
        Just(Op::Broadcast),
    ]
}

fn sub_ref(i: u8) -> SubRef {
    SubRef {
        topic: "t".into(),
        name: ["s1", "s2"][i as usize].into(),
    }
}

/// Every counter of a topic and its subscriptions, to compare across entries.
fn counters(state: &SmState) -> Vec<u64> {
    let mut out = Vec::new();
    for meta in state.topics.values() {
        let c = meta.counters;
        out.extend([
            c.published,
            c.deduplicated,
            c.discarded_retention,
            c.discarded_max_deliveries,
            c.discarded_rejected,
        ]);
    }
    for sub in state.subs.values() {
        let c = &sub.counters;
        out.extend([
            c.delivered,
            c.acked,
            c.redelivered,
            c.expired_leases,
            c.dead_lettered,
            c.discarded_max_deliveries,
            c.discarded_rejected,
            c.skipped,
            c.rewound,
            c.discarded_retention,
        ]);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// After every entry: `published == records + discarded.retention` for each topic;
    /// `seen == acked + dead_lettered + skipped + backlog + in_flight` for each subscription;
    /// the topic's discard counters equal the sums over its subscriptions; and no counter
    /// ever decreases.
    #[test]
    fn balances_hold_and_counters_never_decrease(
        ops in proptest::collection::vec(op(), 1..150),
        max_records in prop::option::of(1u64..12),
        max_bytes in prop::option::of(1u64..40),
        max_age_ms in prop::option::of(1u64..1_500),
        until_acked in any::<bool>(),
    ) {
        let mut h = Harness::new();
        let retention = TopicSettings { max_records, max_bytes, max_age_ms, until_acked, ..Default::default() };
        h.ok(Command::CreateTopic(CreateTopic { name: "t".into(), settings: retention }));
        h.topic("dlq");
        // s1 dead-letters into a topic; s2 has nowhere to, so it discards.
        h.subscribe("t", "s1", settings(200, Some(2), Some("dlq")));
        h.subscribe("t", "s2", settings(150, Some(3), None));
        let mut receipts: [Vec<Receipt>; 2] = [vec![], vec![]];
        let mut next_seq = [0u64; 2];
        let mut previous = counters(&h.state);
        let mut broadcasts = 0;

        for op in ops {
            match op {
                Op::Publish(n) => {
                    let values: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
                    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
                    h.publish("t", &refs);
                }
                Op::Idempotent(p, back) => {
                    // A mix of new batches, re-sends and gaps.
                    let producer = ["p", "q"][p as usize];
                    let seq = (next_seq[p as usize] + 1).saturating_sub(back);
                    let result = h.run(idempotent("t", producer, seq, 2));
                    if seq == next_seq[p as usize] {
                        let ok = matches!(result, Ok(Outcome::Published { duplicate: false, .. }));
                        prop_assert!(ok, "a new batch is appended: {:?}", result);
                        next_seq[p as usize] += 1;
                    } else if seq < next_seq[p as usize] {
                        let ok = matches!(result, Ok(Outcome::Published { duplicate: true, .. }));
                        prop_assert!(ok, "a re-send is a duplicate: {:?}", result);
                    } else {
                        let ok = matches!(result, Err(ApplyError::SequenceGap { .. }));
                        prop_assert!(ok, "a gap is refused: {:?}", result);
                    }
                }
                Op::Pull(s, max) => {
                    if let Ok(Outcome::Pulled(d)) = h.run(Command::Pull(Pull { sub: sub_ref(s), max, ack_timeout_ms: None })) {
                        receipts[s as usize].extend(d.into_iter().map(|d| d.receipt));
                    }
                }
                Op::Ack(s, i) | Op::Nack(s, i, _) if receipts[s as usize].is_empty() => {
                    let _ = i;
                }
                Op::Ack(s, i) => {
                    let r = receipts[s as usize][i % receipts[s as usize].len()];
                    h.run(Command::SettleReceipts(SettleReceipts { sub: sub_ref(s), action: ReceiptAction::Ack, receipts: vec![r] })).unwrap();
                }
                Op::Nack(s, i, dead_letter) => {
                    let r = receipts[s as usize][i % receipts[s as usize].len()];
                    h.run(Command::SettleReceipts(SettleReceipts {
                        sub: sub_ref(s),
                        action: ReceiptAction::Nack { delay_ms: 0, dead_letter },
                        receipts: vec![r],
                    })).unwrap();
                }
                Op::Advance(ms) => {
                    h.clock += ms;
                    h.ok(Command::Tick);
                }
                Op::Seek(s, offset, allow_backward) => {
                    // Refusals (beyond the end, backward without leave) are fine: they change
                    // nothing, and the checks below still run.
                    let _ = h.run(Command::SetCursor(SetCursor { sub: sub_ref(s), offset, allow_backward, forward_only: false }));
                }
                Op::Broadcast => {
                    h.ok(broadcast(None, "mark"));
                    broadcasts += 1;
                }
            }

            for (name, meta) in &h.state.topics {
                prop_assert_eq!(meta.counters.published, meta.records() + meta.counters.discarded_retention, "topic {}", name);
                // Storage holds exactly the offsets first..next, and their bytes.
                let stored: Vec<(u64, u64)> = h.records.0.range((meta.id, 0)..(meta.id + 1, 0))
                    .map(|((_, o), r)| (*o, stored_size(r))).collect();
                let offsets: Vec<u64> = stored.iter().map(|(o, _)| *o).collect();
                prop_assert_eq!(offsets, (meta.first_offset..meta.next_offset).collect::<Vec<_>>(), "topic {}", name);
                prop_assert_eq!(meta.bytes, stored.iter().map(|(_, b)| b).sum::<u64>(), "bytes of {}", name);
            }
            // Retention holds after every entry.
            let t = &h.state.topics["t"];
            if let Some(max) = max_records { prop_assert!(t.records() <= max); }
            if let Some(max) = max_bytes { prop_assert!(t.bytes <= max, "{} bytes > {}", t.bytes, max); }
            if let (Some(age), Some(first)) = (max_age_ms, h.records.0.get(&(t.id, t.first_offset))) {
                prop_assert!(first.timestamp_ms + age > h.clock, "an expired record stayed");
                prop_assert_eq!(first.timestamp_ms, t.first_timestamp_ms);
            }
            if until_acked {
                let floor = h.state.subs_of("t").map(|s| s.cursor).min().unwrap_or(0);
                prop_assert!(t.first_offset >= floor.min(t.next_offset), "records below every cursor stayed");
            }
            let hw = h.state.topics["t"].next_offset;
            let (mut max_deliveries, mut rejected) = (0, 0);
            for sub in h.state.subs.values() {
                let accounted = sub.counters.acked + sub.dead_lettered_total() + sub.counters.skipped
                    + sub.counters.discarded_retention + sub.backlog(hw) + sub.leases.len() as u64;
                prop_assert_eq!(sub.seen(hw), accounted, "subscription {}: {:?}", sub.name, sub.counters);
                max_deliveries += sub.counters.discarded_max_deliveries;
                rejected += sub.counters.discarded_rejected;
            }
            let t = h.state.topics["t"].counters;
            prop_assert_eq!(t.discarded_max_deliveries, max_deliveries);
            prop_assert_eq!(t.discarded_rejected, rejected);
            prop_assert_eq!(h.state.topics["dlq"].counters.published, h.state.subs.values().map(|s| s.counters.dead_lettered).sum::<u64>() + broadcasts);
            let now = counters(&h.state);
            for (i, (a, b)) in previous.iter().zip(&now).enumerate() {
                prop_assert!(b >= a, "counter {} went from {} down to {}", i, a, b);
            }
            previous = now;
        }
    }
}
