//! Dead letters: a record delivered `max_deliveries` times goes to the dead-letter topic
//! exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use raftq_client::api::{Message, ReceiptStatus, Record};
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::http::{
    ack, counts, create_sub, nack, next_offsets, offsets, publish_json, pull, sub_now,
    wait_cursor_everywhere,
};
use crate::SubState;

/// Checks a dead letter against its origin record.
fn check_dead_letter(
    c: &Cluster,
    dl: &Record,
    origin: &Value,
    offset: u64,
    reason: &str,
    deliveries: u32,
) {
    let mut want: BTreeMap<String, String> = origin["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    want.insert("raftq-dead-letter-topic".into(), "t".into());
    want.insert("raftq-dead-letter-offset".into(), offset.to_string());
    want.insert("raftq-dead-letter-subscription".into(), "s".into());
    want.insert("raftq-dead-letter-reason".into(), reason.into());
    want.insert(
        "raftq-dead-letter-delivery-count".into(),
        deliveries.to_string(),
    );
    let ok = dl.value_str() == origin["value"].as_str()
        && dl.key.as_deref() == origin["key"].as_str()
        && dl.headers == want;
    if !ok {
        c.fail(&format!(
            "dead letter of t/{offset} ({reason}, {deliveries} deliveries): expected value {}, key \
             {}, headers {want:?}; got {dl:?}",
            origin["value"], origin["key"]
        ));
    }
}

/// `(cursor, dead_lettered, acked, in_flight, backlog)` of a subscription.
fn settled_counts(st: &SubState) -> (u64, u64, u64, u64, u64) {
    (
        st.cursor,
        st.dead_lettered,
        st.acked,
        st.in_flight,
        st.backlog,
    )
}

/// Pulls with `body` (at most one message) and checks that the message is `offset` in its
/// `count`-th delivery; returns it.
async fn pull_one(
    c: &Cluster,
    topic: &str,
    sub: &str,
    body: Value,
    offset: u64,
    count: u32,
) -> Message {
    let what = format!("pull {body} on {topic}/{sub}");
    let m = pull(c, topic, sub, body).await;
    assert_eq!(
        (offsets(&m), counts(&m)),
        (vec![offset], vec![count]),
        "{what}: {m:?}"
    );
    m.into_iter().next().expect("one message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_deliveries_dead_letters_exactly_once() {
    let c = Cluster::start(3).await;
    c.create_topic("t").await;
    c.create_topic("t.dlq").await;
    create_sub(
        &c,
        "t",
        "s",
        json!({"max_deliveries": 2, "dead_letter_topic": "t.dlq", "ack_timeout_ms": 60000}),
    )
    .await;
    let poison = json!({"value": "poison", "key": "k0", "headers": {"h": "v", "trace": "abc"}});
    let fine = json!({"value": "fine"});
    publish_json(&c, "t", json!([poison.clone(), fine.clone()])).await;

    // Nacked twice: the second nack reaches max_deliveries and dead-letters it.
    let m = pull_one(&c, "t", "s", json!({"max": 1}), 0, 1).await;
    assert_eq!(
        nack(&c, "t", "s", &[&m.receipt], 0, false).await,
        vec![ReceiptStatus::Released]
    );
    let m = pull_one(&c, "t", "s", json!({"max": 1}), 0, 2).await;
    assert_eq!(
        nack(&c, "t", "s", &[&m.receipt], 0, false).await,
        vec![ReceiptStatus::DeadLettered],
        "a nack of the delivery that reached max_deliveries"
    );
    let leader = c.leader_id().await;
    let dlq = c.read(leader, "t.dlq", "from=first").await;
    assert_eq!(dlq.records.len(), 1, "one dead letter: {dlq:?}");
    check_dead_letter(&c, &dlq.records[0], &poison, 0, "max_deliveries", 2);

    // Never delivered again; the cursor moves past it once 1 is acked.
    let m = pull(&c, "t", "s", json!({"max": 10})).await;
    assert_eq!(
        offsets(&m),
        vec![1],
        "the dead letter must not come back: {m:?}"
    );
    assert_eq!(
        ack(&c, "t", "s", &[&m[0].receipt]).await,
        vec![ReceiptStatus::Acked]
    );
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(settled_counts(&st), (2, 1, 1, 0, 0), "{st:?}");

    // Expired twice: dead-lettered by the state machine's own clock, with nobody writing.
    let poison2 = json!({"value": "poison-2", "key": "k2"});
    publish_json(&c, "t", json!([poison2.clone()])).await;
    pull_one(&c, "t", "s", json!({"max": 1, "ack_timeout_ms": 300}), 2, 1).await;
    // After the first expiry: the same record, its second delivery.
    let body = json!({"max": 1, "wait_ms": 10000, "ack_timeout_ms": 300});
    pull_one(&c, "t", "s", body, 2, 2).await;
    let cl = &c;
    c.wait_for(
        "the twice-expired record to be dead-lettered",
        Duration::from_secs(10),
        move || async move {
            let leader = cl.agreed_leader().await?;
            let page = cl.read(leader, "t.dlq", "from=first").await;
            if page.records.len() == 2 {
                Ok(())
            } else {
                Err(format!("t.dlq holds {} records", page.records.len()))
            }
        },
    )
    .await;
    let none = pull(&c, "t", "s", json!({"max": 10, "wait_ms": 1000})).await;
    assert!(none.is_empty(), "a dead letter came back: {none:?}");
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        (st.cursor, st.dead_lettered, st.in_flight),
        (3, 2, 0),
        "{st:?}"
    );

    // nack with dead_letter: true dead-letters at once, reason "nack".
    let bad = json!({"value": "bad", "headers": {"why": "schema"}});
    publish_json(&c, "t", json!([bad.clone()])).await;
    let m = pull_one(&c, "t", "s", json!({"max": 1}), 3, 1).await;
    assert_eq!(
        nack(&c, "t", "s", &[&m.receipt], 0, true).await,
        vec![ReceiptStatus::DeadLettered]
    );
    assert_eq!(
        nack(&c, "t", "s", &[&m.receipt], 0, true).await,
        vec![ReceiptStatus::Stale]
    );

    // Exactly once each, the same on every node.
    let dlq = c.consistent_log("t.dlq").await;
    assert_eq!(dlq.len(), 3, "three dead letters, once each: {dlq:?}");
    check_dead_letter(&c, &dlq[0], &poison, 0, "max_deliveries", 2);
    check_dead_letter(&c, &dlq[1], &poison2, 2, "max_deliveries", 2);
    check_dead_letter(&c, &dlq[2], &bad, 3, "nack", 1);
    let st = wait_cursor_everywhere(&c, "t", "s", 4, Duration::from_secs(20)).await;
    assert_eq!(settled_counts(&st), (4, 3, 1, 0, 0), "{st:?}");
    let none = pull(&c, "t", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");

    // Without a dead-letter topic the record is discarded and counted.
    c.create_topic("u").await;
    c.publish_values("u", &["u/0".to_string(), "u/1".to_string()])
        .await;
    create_sub(&c, "u", "d", json!({"max_deliveries": 1})).await;
    let before = next_offsets(&c).await;
    let m = pull_one(&c, "u", "d", json!({"max": 1}), 0, 1).await;
    assert_eq!(
        nack(&c, "u", "d", &[&m.receipt], 0, false).await,
        vec![ReceiptStatus::DeadLettered],
        "max_deliveries 1 is reached by the first delivery"
    );
    let st = sub_now(&c, "u", "d").await;
    assert_eq!(settled_counts(&st), (1, 1, 0, 0, 1), "{st:?}");
    assert_eq!(
        next_offsets(&c).await,
        before,
        "a discarded record must go to no topic"
    );
    let m = pull(&c, "u", "d", json!({"max": 10})).await;
    assert_eq!(
        offsets(&m),
        vec![1],
        "the discarded record must not come back: {m:?}"
    );
}
