//! Stream reads through a subscription move its cursor, forward only.

use std::time::Duration;

use raftq_client::api::ReceiptStatus;
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::http::{
    ack, call, call_leader, cluster_with_sub, offsets, pull, sub_now, sub_path,
    wait_cursor_everywhere,
};
use crate::Answer;

/// Sends `PUT {cursor}` with `body` to the leader.
async fn put_cursor(c: &Cluster, cursor: &str, body: Value) -> Answer {
    let (_, answer) = call_leader(c, Method::PUT, cursor, Some(&body.to_string())).await;
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_with_subscription_moves_cursor_forward_only() {
    let c = cluster_with_sub("r", 10, json!({"ack_timeout_ms": 60000})).await;
    let leader = c.leader_id().await;

    // from=4 with the subscription: everything before 4 is done.
    let page = c.read(leader, "r", "subscription=s&from=4&max=3").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    assert_eq!(page.next_offset, 7);
    let st = sub_now(&c, "r", "s").await;
    assert_eq!(
        (st.cursor, st.backlog),
        (4, 6),
        "the read moved the cursor to 4: {st:?}"
    );
    // Without from: resume at the cursor, moving nothing.
    let page = c.read(leader, "r", "subscription=s&max=2").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 4);
    // A from below the cursor reads from there but never moves the cursor back.
    let page = c.read(leader, "r", "subscription=s&from=2&max=1").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 4);

    // On a follower, a read that would move the cursor is a write: 307 to the leader.
    c.wait_converged("r").await;
    wait_cursor_everywhere(&c, "r", "s", 4, Duration::from_secs(20)).await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    let path = "/v1/topics/r/records?subscription=s&from=6";
    let a = call(&c, follower, Method::GET, path, None).await;
    a.expect_problem(&c, 307, "not_leader", "a cursor-moving read on a follower");
    assert_eq!(
        a.location.as_deref(),
        Some(format!("{}{path}", c.url(leader)).as_str())
    );
    assert_eq!(
        sub_now(&c, "r", "s").await.cursor,
        4,
        "a redirected read moved the cursor"
    );
    // A follower serves a read without from at the cursor.
    let page = c.read(follower, "r", "subscription=s").await;
    assert_eq!(page.records.first().map(|r| r.offset), Some(4), "{page:?}");

    // A stream reader passing next_offset commits as it goes; pulls start at the cursor.
    let page = c.read(leader, "r", "subscription=s&from=7&max=1").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![7]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 7);
    let leased = pull(&c, "r", "s", json!({"max": 2})).await;
    assert_eq!(
        offsets(&leased),
        vec![7, 8],
        "pull starts at the cursor: {leased:?}"
    );
    // Reading past leased records says they are done: their receipts become stale.
    let page = c.read(leader, "r", "subscription=s&from=9").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![9]
    );
    let st = sub_now(&c, "r", "s").await;
    assert_eq!((st.cursor, st.in_flight, st.backlog), (9, 0, 1), "{st:?}");
    assert_eq!(
        ack(&c, "r", "s", &[&leased[0].receipt, &leased[1].receipt]).await,
        vec![ReceiptStatus::Stale; 2],
        "receipts the cursor moved past"
    );

    // PUT cursor: backward needs allow_backward.
    let cursor = format!("{}/cursor", sub_path("r", "s"));
    let a = put_cursor(&c, &cursor, json!({"offset": 3})).await;
    a.expect_problem(
        &c,
        400,
        "invalid_argument",
        "moving the cursor back without allow_backward",
    );
    assert_eq!(
        sub_now(&c, "r", "s").await.cursor,
        9,
        "a refused move changed the cursor"
    );
    let a = call(
        &c,
        follower,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 3, "allow_backward": true}).to_string()),
    )
    .await;
    a.expect_problem(&c, 307, "not_leader", "PUT cursor on a follower");
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 9);
    let a = put_cursor(&c, &cursor, json!({"offset": 3, "allow_backward": true})).await;
    let moved: Value = a.json(&c, 200, "moving the cursor back with allow_backward");
    assert_eq!(moved["cursor"], json!(3), "{moved}");
    let st = sub_now(&c, "r", "s").await;
    assert_eq!((st.cursor, st.backlog, st.in_flight), (3, 7, 0), "{st:?}");
    let again = pull(&c, "r", "s", json!({"max": 100})).await;
    assert_eq!(
        offsets(&again),
        (3..10).collect::<Vec<_>>(),
        "records after the new cursor are delivered again: {again:?}"
    );

    // Forward up to the topic's next offset; above it is refused.
    let a = put_cursor(&c, &cursor, json!({"offset": 11})).await;
    a.expect_problem(&c, 400, "invalid_argument", "cursor above next_offset");
    let a = put_cursor(&c, &cursor, json!({"offset": 11, "allow_backward": true})).await;
    a.expect_problem(
        &c,
        400,
        "invalid_argument",
        "cursor above next_offset, allow_backward",
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 3);
    let a = put_cursor(&c, &cursor, json!({"offset": 10})).await;
    let moved: Value = a.json(&c, 200, "moving the cursor to next_offset");
    assert_eq!(moved["cursor"], json!(10), "{moved}");
    let r: Vec<&str> = again.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "r", "s", &r[..2]).await,
        vec![ReceiptStatus::Stale; 2]
    );
    let st = wait_cursor_everywhere(&c, "r", "s", 10, Duration::from_secs(20)).await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (10, 0, 0, 0),
        "{st:?}"
    );
    let none = pull(&c, "r", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");
}
