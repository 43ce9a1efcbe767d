use super::*;

fn all_kinds() -> History {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, Some(1), Op::publish("q", vec!["a".into(), "b".into()]))
        .ok(OpResult::publish(0, 2, false));
    h.invoke(
        p,
        Some(1),
        Op::Publish {
            topic: "q".into(),
            values: vec!["c".into()],
            producer_id: Some("p-1".into()),
            sequence: Some(3),
        },
    )
    .fail("no_leader");
    h.invoke(p, Some(2), Op::pull("q", "s")).ok(OpResult::Pull {
        deliveries: vec![Delivery {
            value: "a".into(),
            offset: 0,
            receipt: "r0".into(),
            delivery_count: 1,
            lease_expires_ms: 1_000,
        }],
    });
    h.invoke(
        p,
        Some(2),
        Op::ack("q", "s", vec![("r0".into(), "a".into())]),
    )
    .ok(OpResult::receipts(vec![(
        "r0".into(),
        ReceiptStatus::Acked,
    )]));
    h.invoke(
        p,
        Some(2),
        Op::Nack {
            topic: "q".into(),
            subscription: "s".into(),
            receipts: vec![("r1".into(), "b".into())],
            delay_ms: 5,
        },
    )
    .ok(OpResult::receipts(vec![(
        "r1".into(),
        ReceiptStatus::Released,
    )]));
    h.invoke(
        p,
        Some(2),
        Op::Extend {
            topic: "q".into(),
            subscription: "s".into(),
            receipts: vec![("r2".into(), "b".into())],
            ack_timeout_ms: Some(100),
        },
    )
    .ok(OpResult::Receipts {
        results: vec![ReceiptResult {
            receipt: "r2".into(),
            status: ReceiptStatus::Extended,
            lease_expires_ms: Some(77),
        }],
    });
    h.invoke(p, Some(3), Op::read("q", Some("s"), Some(0)))
        .ok(OpResult::Read {
            records: vec![(0, "a".into()), (1, "b".into())],
            next_offset: 2,
            skipped: 0,
            cursor: Some(0),
        });
    h.invoke(p, Some(3), Op::read("q", None, None))
        .info("timeout");
    let p = h.next_process();
    h.invoke(p, Some(1), Op::set_cursor("q", "s", 2, false))
        .ok(OpResult::Cursor { cursor: 2 });
    h.invoke(p, Some(1), Op::final_pull("q", "s"))
        .ok(OpResult::Pull { deliveries: vec![] });
    h.invoke(p, Some(1), Op::final_read("q", 1))
        .ok(OpResult::Records {
            records: vec![(0, "a".into()), (1, "b".into())],
        });
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill", Phase::Start, vec![1, 2]),
    )
    .ok(OpResult::Fault {
        detail: "killed 1, 2".into(),
    });
    h.invoke(
        Process::Nemesis,
        None,
        Op::fault("kill", Phase::Stop, vec![]),
    )
    .info("restart timed out");
    {
        let _dropped = h.invoke(p, None, Op::read("q", None, Some(5)));
    }
    h
}

#[test]
fn jsonl_round_trip() {
    let h = all_kinds();
    let events = h.events();
    let dir = std::env::temp_dir().join(format!("raftq-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("h.jsonl");
    h.write_jsonl(&path).unwrap();
    let back = read_jsonl(&path).unwrap();
    assert_eq!(back, events);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text
        .lines()
        .next()
        .unwrap()
        .contains(r#""type":"invoke","f":"publish""#));
    assert!(text.contains(r#""f":"set-cursor""#));
    assert!(text.contains(r#""f":"final-read""#));
    assert!(text.contains(r#""process":"nemesis""#));
    assert!(text.contains(r#""final":true"#));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn indexes_times_and_pairs() {
    let h = all_kinds();
    let events = h.events();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.index, i as u64);
        if i > 0 {
            assert!(e.time_us >= events[i - 1].time_us);
        }
    }
    let ps = pairs(&events);
    assert_eq!(ps.len(), events.len() / 2);
    assert!(ps.iter().all(|p| p.completion.is_some()));
    assert_eq!(ps.last().unwrap().outcome(), Kind::Info);
    assert_eq!(
        ps.last().unwrap().completion.unwrap().error.as_deref(),
        Some("abandoned")
    );
    let counts = op_counts(&events);
    assert_eq!(
        counts,
        OpCounts {
            ops: 12,
            ok: 9,
            fail: 1,
            info: 2
        }
    );
    assert_eq!(h.next_process(), Process::Client(2));
}

#[test]
fn pairs_without_invoke_index_go_by_process() {
    let h = History::new();
    let a = h.next_process();
    let b = h.next_process();
    let ha = h.invoke(a, None, Op::publish("q", vec!["x".into()]));
    let hb = h.invoke(b, None, Op::publish("q", vec!["y".into()]));
    hb.fail("nope");
    ha.ok(OpResult::publish(4, 1, false));
    let mut events = h.events();
    for e in &mut events {
        e.invoke_index = None;
    }
    let ps = pairs(&events);
    assert_eq!(ps[0].outcome(), Kind::Ok);
    assert_eq!(ps[1].outcome(), Kind::Fail);
    let json = serde_json::to_string(&events[3]).unwrap();
    let back: Event = serde_json::from_str(&json).unwrap();
    assert_eq!(back, events[3]);
}

#[test]
#[should_panic(expected = "cannot complete")]
fn mismatched_result_panics() {
    let h = History::new();
    let p = h.next_process();
    h.invoke(p, None, Op::pull("q", "s"))
        .ok(OpResult::Cursor { cursor: 1 });
}
