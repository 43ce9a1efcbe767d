//! Batch publishes: records carried as Kafka record batches apply exactly as the same records
//! carried as `NewRecord`s, and a batch raftq cannot take is refused whole.

use proptest::prelude::*;

use super::tests::{batch, create, encode_batch, publish_batch, put_records, run};
use super::*;

fn records_publish(topic: &str, records: &[NewRecord]) -> Command {
    Command::Publish(Publish {
        topic: topic.into(),
        records: records.to_vec(),
        producer: None,
    })
}

fn arb_record() -> impl Strategy<Value = NewRecord> {
    (
        proptest::option::of("[a-z0-9é]{0,12}"),
        proptest::collection::btree_map("[a-z-]{1,8}", "[ -~é]{0,10}", 0..4),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(key, headers, value)| NewRecord {
            key,
            headers: headers.into_iter().collect(),
            value,
        })
}

proptest! {
    /// The same records, published as a batch and as `NewRecord`s on two replicas, give the
    /// same answers, the same topics (offsets, sizes, counters) and, read back from the
    /// entries, the same records; in one entry with other commands, and with a retention limit
    /// that removes some of them again in the same entry.
    #[test]
    fn a_batch_publish_applies_as_the_same_records_do(
        groups in proptest::collection::vec(proptest::collection::vec(arb_record(), 1..6), 1..5),
        max_records in proptest::option::of(1u64..8),
    ) {
        let settings = TopicSettings { max_records, ..Default::default() };
        let create = Command::CreateTopic(CreateTopic { name: "t".into(), settings });
        let (mut plain, mut batched) = (SmState::default(), SmState::default());
        run(&mut plain, 1, create.clone()).0.expect("created");
        run(&mut batched, 1, create).0.expect("created");
        let plain_entry = batch(10, groups.iter().map(|g| records_publish("t", g)).collect());
        let batch_entry = batch(10, groups.iter().map(|g| publish_batch("t", g)).collect());
        let (mut w1, mut w2) = (Vec::new(), Vec::new());
        let r1 = apply_entry(&mut plain, &NothingStored, 2, &plain_entry, &mut w1)
            .expect("no record read fails");
        let r2 = apply_entry(&mut batched, &NothingStored, 2, &batch_entry, &mut w2)
            .expect("no record read fails");
        prop_assert_eq!(r1, r2);
        prop_assert_eq!(&plain.topics, &batched.topics);
        prop_assert_eq!(put_records(&w1, &plain_entry), put_records(&w2, &batch_entry));
    }
}

/// Each way a batch's bytes can be wrong for raftq: refused with `invalid_argument` naming it,
/// and nothing changes.
#[test]
fn a_batch_raftq_cannot_take_is_refused_whole() {
    let good = encode_batch(&[NewRecord {
        key: Some("k".into()),
        headers: vec![("h".into(), "v".into())],
        value: b"value".to_vec(),
    }]);
    let with = |key: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)], value: Option<&[u8]>| {
        let mut out = Vec::new();
        let record = raftq_batch::RecordRef {
            timestamp_delta: 0,
            key,
            value,
            headers,
        };
        raftq_batch::encode(&raftq_batch::BatchHeader::unstamped(1), &[record], &mut out);
        out
    };
    let mut flipped = good.clone();
    *flipped.last_mut().expect("not empty") ^= 1;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "malformed record batch"),
        ("a flipped byte", flipped, "CRC mismatch"),
        ("cut short", good[..good.len() - 1].to_vec(), "truncated"),
        (
            "a key that is not UTF-8",
            with(Some(&[0xff]), &[], Some(b"v")),
            "record 0: its key is not UTF-8 text",
        ),
        (
            "a header value that is not UTF-8",
            with(None, &[("h", Some(&[0xc3]))], Some(b"v")),
            "record 0: its header \"h\" is not UTF-8 text",
        ),
        (
            "a null header value",
            with(None, &[("h", None)], Some(b"v")),
            "record 0: header \"h\" has a null value",
        ),
        (
            "a repeated header",
            with(None, &[("h", Some(b"1")), ("h", Some(b"2"))], Some(b"v")),
            "record 0: header \"h\" appears more than once",
        ),
        (
            "a null value",
            with(None, &[], None),
            "record 0 has a null value",
        ),
    ];
    for (what, bytes, expected) in cases {
        let mut state = SmState::default();
        run(&mut state, 1, create("t")).0.expect("created");
        let before = state.clone();
        let cmd = Command::PublishBatch(PublishBatch {
            topic: "t".into(),
            batches: bytes.into(),
            producer: None,
        });
        let (result, writes) = run(&mut state, 2, cmd);
        match result {
            Err(ApplyError::InvalidArgument(detail)) => {
                assert!(detail.contains(expected), "{what}: {detail}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            !writes.iter().any(|w| matches!(w, Write::PutRecord { .. })),
            "{what}"
        );
        assert_eq!(state.topics, before.topics, "{what}");
    }
}

/// A record the log holds in an earlier entry of the same apply call is read through the
/// source, and one of the entry being applied from the entry itself: dead-lettering and
/// retention read them before they are stored.
#[test]
fn records_not_yet_stored_are_read_from_their_entry() {
    struct Log(Batch, std::cell::Cell<u32>);
    impl RecordSource for Log {
        fn stored(&self, _: u64, _: u64) -> Result<Option<StoredRecord>, ReadFault> {
            Ok(None)
        }
        fn logged(&self, at: RecordAt, timestamp_ms: u64) -> Result<StoredRecord, String> {
            assert_eq!(
                at.index, 2,
                "only the earlier entry is read through the source"
            );
            self.1.set(self.1.get() + 1);
            record_at(&self.0, at, timestamp_ms)
        }
    }
    let mut state = SmState::default();
    let settings = TopicSettings {
        max_bytes: Some(7),
        ..Default::default()
    };
    let cmd = Command::CreateTopic(CreateTopic {
        name: "t".into(),
        settings,
    });
    run(&mut state, 1, cmd).0.expect("created");
    let rec = |v: &str| NewRecord {
        key: None,
        headers: vec![],
        value: v.as_bytes().to_vec(),
    };
    let first = batch(
        10,
        vec![publish_batch("t", &[rec("aaa"), rec("bbb"), rec("cc")])],
    );
    let second = batch(11, vec![publish_batch("t", &[rec("dddd")])]);
    let log = Log(first.clone(), Default::default());
    let mut writes = Vec::new();
    // 8 bytes: retention reads record 0 for its size, from the entry being applied.
    apply_entry(&mut state, &log, 2, &first, &mut writes).expect("read from the entry");
    assert_eq!(log.1.get(), 0);
    let meta = &state.topics["t"];
    assert_eq!((meta.first_offset, meta.next_offset, meta.bytes), (1, 3, 5));
    // 9 bytes: records 1 (for its size) and 2 (the new first record's timestamp), of entry 2
    // and not stored yet, are read through the source.
    apply_entry(&mut state, &log, 3, &second, &mut writes).expect("read through the source");
    assert_eq!(log.1.get(), 2);
    let meta = &state.topics["t"];
    assert_eq!((meta.first_offset, meta.next_offset, meta.bytes), (2, 4, 6));
}
