//! State machine unit tests: plain values in, plain values out; no RocksDB, no HTTP.

use proptest::prelude::*;

use super::*;

use super::NothingStored as NoRecords;

pub(super) fn batch(timestamp_ms: u64, commands: Vec<Command>) -> Batch {
    Batch {
        timestamp_ms,
        commands,
    }
}

pub(super) fn create(name: &str) -> Command {
    Command::CreateTopic(CreateTopic {
        name: name.into(),
        settings: TopicSettings::default(),
    })
}

pub(super) fn publish(topic: &str, values: &[&str]) -> Command {
    Command::Publish(Publish {
        topic: topic.into(),
        records: values
            .iter()
            .map(|v| NewRecord {
                key: None,
                headers: vec![],
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        producer: None,
    })
}

/// The same records as [`publish`]'s `records`, as a batch publish: one Kafka record batch.
pub(super) fn publish_batch(topic: &str, records: &[NewRecord]) -> Command {
    Command::PublishBatch(PublishBatch {
        topic: topic.into(),
        batches: encode_batch(records).into(),
        producer: None,
    })
}

/// `records` as one Kafka record batch, as the SDK encodes them.
pub(super) fn encode_batch(records: &[NewRecord]) -> Vec<u8> {
    encode_records(records)
}

/// The records `writes` put, each as the store would hold it: a logged one read from `batch`,
/// the entry at `index` that was applied.
pub(super) fn put_records(writes: &[Write], batch: &Batch) -> Vec<(u64, u64, StoredRecord)> {
    writes
        .iter()
        .filter_map(|w| match w {
            Write::PutRecord {
                topic_id,
                offset,
                record,
            } => Some((
                *topic_id,
                *offset,
                match record {
                    Appended::Whole(r) => r.clone(),
                    Appended::Logged { timestamp_ms, at } => {
                        record_at(batch, *at, *timestamp_ms).expect("the entry holds it")
                    }
                },
            )),
            _ => None,
        })
        .collect()
}

/// Applies one command in its own entry and returns its result and the writes.
pub(super) fn run(
    state: &mut SmState,
    timestamp_ms: u64,
    cmd: Command,
) -> (CommandResult, Vec<Write>) {
    let mut writes = Vec::new();
    let resp = apply_entry(
        state,
        &NoRecords,
        1,
        &batch(timestamp_ms, vec![cmd]),
        &mut writes,
    )
    .expect("no record read fails");
    assert_eq!(resp.results.len(), 1);
    (resp.results.into_iter().next().unwrap(), writes)
}

#[test]
fn create_topic_table() {
    let small = TopicSettings {
        max_record_bytes: Some(10),
        ..Default::default()
    };
    struct Case {
        name: &'static str,
        settings: TopicSettings,
        want: CommandResult,
    }
    let cases = [
        Case {
            name: "t",
            settings: TopicSettings::default(),
            want: Ok(Outcome::TopicCreated),
        },
        Case {
            name: "t",
            settings: TopicSettings::default(),
            want: Ok(Outcome::TopicExists),
        },
        Case {
            name: "t",
            settings: small,
            want: Err(ApplyError::AlreadyExists("t".into())),
        },
        Case {
            name: "bad/name",
            settings: TopicSettings::default(),
            want: Err(ApplyError::InvalidArgument(
                "invalid topic name \"bad/name\"".into(),
            )),
        },
        Case {
            name: "u",
            settings: TopicSettings {
                max_record_bytes: Some(0),
                ..Default::default()
            },
            want: Err(ApplyError::InvalidArgument(
                "max_record_bytes must be between 1 and 16777216, not 0".into(),
            )),
        },
        Case {
            name: "u",
            settings: TopicSettings {
                max_records: Some(0),
                ..Default::default()
            },
            want: Err(ApplyError::InvalidArgument(
                "retention.max_records must be at least 1 (omit it for no limit)".into(),
            )),
        },
        Case {
            name: "u",
            settings: small,
            want: Ok(Outcome::TopicCreated),
        },
    ];
    let mut state = SmState::default();
    for (i, c) in cases.iter().enumerate() {
        let before = state.clone();
        let (got, writes) = run(
            &mut state,
            100,
            Command::CreateTopic(CreateTopic {
                name: c.name.into(),
                settings: c.settings,
            }),
        );
        assert_eq!(got, c.want, "case {i}");
        match got {
            Ok(Outcome::TopicCreated) => assert_eq!(writes, vec![Write::PutTopic(c.name.into())]),
            _ => {
                assert!(
                    writes.is_empty(),
                    "case {i}: a refused or no-op create writes nothing"
                );
                assert_eq!(state.topics, before.topics, "case {i}: and changes nothing");
            }
        }
    }
    assert_eq!(state.topics["t"].id, 0);
    assert_eq!(state.topics["u"].id, 1);
}

/// Each published record says where the log holds it: its entry, its command's place in the
/// entry and its own in the command. A broadcast marker, built in apply, holds other headers
/// than any record in the log, so it says nothing.
#[test]
fn published_records_say_where_the_log_holds_them_and_markers_do_not() {
    let mut state = SmState::default();
    run(&mut state, 10, create("t")).0.unwrap();
    let mut writes = Vec::new();
    let commands = vec![
        publish("t", &["a"]),
        Command::Broadcast(Broadcast {
            topics: None,
            record: NewRecord {
                key: None,
                headers: vec![],
                value: b"m".to_vec(),
            },
        }),
        publish("t", &["b", "c"]),
        publish_batch("t", &[text("d"), text("e")]),
    ];
    let entry = batch(20, commands);
    apply_entry(&mut state, &NoRecords, 7, &entry, &mut writes).expect("no record read fails");
    let at: Vec<(u64, Option<RecordAt>)> = writes
        .iter()
        .filter_map(|w| match w {
            Write::PutRecord {
                offset,
                record: Appended::Logged { at, timestamp_ms },
                ..
            } => {
                assert_eq!(*timestamp_ms, 20);
                Some((*offset, Some(*at)))
            }
            Write::PutRecord { offset, .. } => Some((*offset, None)),
            _ => None,
        })
        .collect();
    let at_ = |command, record| {
        Some(RecordAt {
            index: 7,
            command,
            record,
        })
    };
    assert_eq!(
        at,
        [
            (0, at_(0, 0)),
            (1, None),
            (2, at_(2, 0)),
            (3, at_(2, 1)),
            (4, at_(3, 0)),
            (5, at_(3, 1))
        ]
    );
    let values: Vec<Vec<u8>> = put_records(&writes, &entry)
        .into_iter()
        .map(|(_, _, r)| r.value)
        .collect();
    assert_eq!(values, [&b"a"[..], b"m", b"b", b"c", b"d", b"e"]);
}

fn text(value: &str) -> NewRecord {
    NewRecord {
        key: None,
        headers: vec![],
        value: value.as_bytes().to_vec(),
    }
}

#[test]
fn publish_assigns_dense_offsets_and_timestamps() {
    let mut state = SmState::default();
    run(&mut state, 10, create("t")).0.unwrap();
    let (r, writes) = run(&mut state, 50, publish("t", &["a", "bb"]));
    assert_eq!(
        r,
        Ok(Outcome::Published {
            first_offset: 0,
            last_offset: 1,
            duplicate: false,
        })
    );
    let at: Vec<_> = writes
        .iter()
        .filter_map(|w| match w {
            Write::PutRecord {
                topic_id,
                offset,
                record: Appended::Logged { timestamp_ms, at },
            } => Some((*topic_id, *offset, *timestamp_ms, *at)),
            _ => None,
        })
        .collect();
    // Where the log holds each: record 0 and 1 of command 0 of entry 1 (`run`'s index).
    let at_ = |record| RecordAt {
        index: 1,
        command: 0,
        record,
    };
    assert_eq!(at, [(0, 0, 50, at_(0)), (0, 1, 50, at_(1))]);
    let entry = batch(50, vec![publish("t", &["a", "bb"])]);
    assert_eq!(put_records(&writes, &entry)[1].2.value, b"bb");
    assert!(writes.contains(&Write::PutTopic("t".into())));
    let (r, _) = run(&mut state, 60, publish("t", &["c"]));
    assert_eq!(
        r,
        Ok(Outcome::Published {
            first_offset: 2,
            last_offset: 2,
            duplicate: false,
        })
    );
    let meta = &state.topics["t"];
    assert_eq!(
        (
            meta.first_offset,
            meta.next_offset,
            meta.records(),
            meta.bytes
        ),
        (0, 3, 3, 4)
    );
}

#[test]
fn publish_refusals_change_nothing() {
    let mut state = SmState::default();
    run(
        &mut state,
        1,
        Command::CreateTopic(CreateTopic {
            name: "t".into(),
            settings: TopicSettings {
                max_record_bytes: Some(3),
                ..Default::default()
            },
        }),
    )
    .0
    .unwrap();
    let before = state.clone();
    let cases = [
        (
            publish("missing", &["a"]),
            Err(ApplyError::TopicNotFound("missing".into())),
        ),
        (
            publish("t", &[]),
            Err(ApplyError::InvalidArgument(
                "a publish needs at least one record".into(),
            )),
        ),
        (
            publish("t", &["ok", "toolong"]),
            Err(ApplyError::RecordTooLarge(
                "record 1 is 7 bytes; topic \"t\" accepts at most 3".into(),
            )),
        ),
    ];
    for (i, (cmd, want)) in cases.into_iter().enumerate() {
        let (got, writes) = run(&mut state, 1, cmd);
        assert_eq!(got, want, "case {i}");
        assert!(writes.is_empty(), "case {i}");
        assert_eq!(state, before, "case {i}");
    }
}

#[test]
fn delete_topic_and_ids_never_reused() {
    let mut state = SmState::default();
    run(&mut state, 1, create("t")).0.unwrap();
    run(&mut state, 1, publish("t", &["a"])).0.unwrap();
    let (r, writes) = run(
        &mut state,
        1,
        Command::DeleteTopic(DeleteTopic { name: "t".into() }),
    );
    assert_eq!(r, Ok(Outcome::TopicDeleted));
    assert_eq!(
        writes,
        vec![Write::DeleteTopic {
            name: "t".into(),
            id: 0
        }]
    );
    let (r, _) = run(
        &mut state,
        1,
        Command::DeleteTopic(DeleteTopic { name: "t".into() }),
    );
    assert_eq!(r, Err(ApplyError::TopicNotFound("t".into())));
    run(&mut state, 1, create("t")).0.unwrap();
    assert_eq!(
        state.topics["t"].id, 1,
        "a re-created topic gets a fresh id"
    );
    assert_eq!(state.topics["t"].next_offset, 0);
}

#[test]
fn clock_never_goes_back_and_commit_point_carries_it() {
    let mut state = SmState::default();
    let mut w = Vec::new();
    let r1 = apply_entry(
        &mut state,
        &NoRecords,
        5,
        &batch(1000, vec![Command::Tick]),
        &mut w,
    )
    .expect("no record read fails");
    let r2 = apply_entry(
        &mut state,
        &NoRecords,
        6,
        &batch(400, vec![Command::Tick]),
        &mut w,
    )
    .expect("no record read fails");
    assert_eq!(
        r1.commit_point,
        CommitPoint {
            index: 5,
            timestamp_ms: 1000
        }
    );
    assert_eq!(
        r2.commit_point,
        CommitPoint {
            index: 6,
            timestamp_ms: 1000
        }
    );
    assert_eq!(r2.results, vec![Ok(Outcome::Ticked)]);
    assert!(w.is_empty());
}

#[test]
fn one_entry_many_commands_each_answered_in_order() {
    let mut state = SmState::default();
    let mut w = Vec::new();
    let resp = apply_entry(
        &mut state,
        &NoRecords,
        9,
        &batch(
            5,
            vec![
                create("a"),
                publish("a", &["x"]),
                publish("nope", &["y"]),
                publish("a", &["z"]),
            ],
        ),
        &mut w,
    )
    .expect("no record read fails");
    assert_eq!(
        resp.results,
        vec![
            Ok(Outcome::TopicCreated),
            Ok(Outcome::Published {
                first_offset: 0,
                last_offset: 0,
                duplicate: false,
            }),
            Err(ApplyError::TopicNotFound("nope".into())),
            Ok(Outcome::Published {
                first_offset: 1,
                last_offset: 1,
                duplicate: false,
            }),
        ]
    );
}

proptest! {
    /// Determinism: the same entries applied to two replicas give the same state, the same
    /// answers and the same writes; offsets stay dense whatever the interleaving.
    #[test]
    fn replicas_agree(ops in proptest::collection::vec((0u8..4, 0usize..3, 0u64..1_000_000, 0usize..4), 1..60)) {
        let names = ["a", "b", "c"];
        let mut entries = Vec::new();
        for (kind, topic, time, n) in ops {
            let name = names[topic];
            let cmd = match kind {
                0 => create(name),
                1 => Command::DeleteTopic(DeleteTopic { name: name.into() }),
                2 => publish(name, &vec!["v"; n]),
                _ => Command::Tick,
            };
            entries.push(batch(time, vec![cmd]));
        }
        let (mut s1, mut s2) = (SmState::default(), SmState::default());
        let (mut w1, mut w2) = (Vec::new(), Vec::new());
        let mut last_clock = 0;
        for (i, e) in entries.iter().enumerate() {
            let r1 = apply_entry(&mut s1, &NoRecords, i as u64, e, &mut w1).expect("no record read fails");
            let r2 = apply_entry(&mut s2, &NoRecords, i as u64, e, &mut w2).expect("no record read fails");
            prop_assert_eq!(&r1, &r2);
            prop_assert!(r1.commit_point.timestamp_ms >= last_clock);
            last_clock = r1.commit_point.timestamp_ms;
        }
        prop_assert_eq!(&s1, &s2);
        prop_assert_eq!(w1, w2);
        for meta in s1.topics.values() {
            prop_assert!(meta.first_offset <= meta.next_offset);
            prop_assert_eq!(meta.bytes, meta.records());
        }
    }
}
