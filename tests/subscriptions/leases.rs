//! Leased pulls: the lowest offsets first, acks moving the cursor (the ack floor), nack with
//! and without delay, extend, lease expiry decided by the replicated state machine, and
//! leases across a leader change.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use raftq_client::api::{PullResponse, ReceiptResults, ReceiptStatus};
use reqwest::Method;
use serde_json::json;

use crate::http::{
    ack, call, cluster_with_sub, counts, nack, now_ms, offsets, pull, settle, statuses, sub_now,
    sub_path, values, wait_cursor_everywhere,
};
use crate::SubState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_leases_lowest_offsets_and_acks_move_the_cursor() {
    let c = cluster_with_sub("q", 10, json!({"ack_timeout_ms": 60000})).await;
    let published = values(10, "q");

    let invoked_ms = now_ms();
    let first = pull(&c, "q", "s", json!({"max": 4})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2, 3], "{first:?}");
    assert_eq!(counts(&first), vec![1; 4], "{first:?}");
    let receipts: BTreeSet<&str> = first.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(receipts.len(), 4, "receipts must be distinct: {first:?}");
    for m in &first {
        assert_eq!(
            m.value_str(),
            Some(published[m.offset as usize].as_str()),
            "{m:?}"
        );
        // The lease starts at the pull's leader time, which is after the record's.
        assert!(
            m.lease_expires_ms >= m.timestamp_ms + 60_000,
            "a 60 s lease must end 60 s after the pull: {m:?}"
        );
        assert!(
            m.lease_expires_ms >= invoked_ms + 60_000 - 1_000
                && m.lease_expires_ms <= now_ms() + 60_000 + 5_000,
            "lease_expires_ms {} is not about 60 s from now ({invoked_ms}): {m:?}",
            m.lease_expires_ms
        );
    }

    let second = pull(&c, "q", "s", json!({"max": 4})).await;
    assert_eq!(
        offsets(&second),
        vec![4, 5, 6, 7],
        "no record may be leased twice at once: {second:?}"
    );
    assert_eq!(counts(&second), vec![1; 4]);

    // Acks above the floor keep the cursor; the lowest one moves it past the whole run.
    let r: Vec<&str> = first
        .iter()
        .chain(&second)
        .map(|m| m.receipt.as_str())
        .collect();
    assert_eq!(
        ack(&c, "q", "s", &[r[1], r[2]]).await,
        vec![ReceiptStatus::Acked; 2]
    );
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        st,
        SubState {
            cursor: 0,
            backlog: 2,
            in_flight: 6,
            delivered: 8,
            acked: 2,
            redelivered: 0,
            dead_lettered: 0
        },
        "after acking offsets 1 and 2"
    );
    assert_eq!(ack(&c, "q", "s", &[r[0]]).await, vec![ReceiptStatus::Acked]);
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (3, 2, 5, 3),
        "after acking offset 0 the cursor passes 0..=2: {st:?}"
    );

    // A second ack of a receipt is stale and changes nothing; results keep request order.
    assert_eq!(
        ack(&c, "q", "s", &[r[0], r[3]]).await,
        vec![ReceiptStatus::Stale, ReceiptStatus::Acked]
    );
    assert_eq!(ack(&c, "q", "s", &[r[1]]).await, vec![ReceiptStatus::Stale]);
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (4, 2, 4, 4),
        "stale acks count nothing: {st:?}"
    );

    // A pull or an ack on a follower is redirected and does nothing there.
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    c.wait_converged("q").await;
    for (op, body) in [
        ("pull", json!({"max": 10}).to_string()),
        ("ack", json!({"receipts": [r[4]]}).to_string()),
    ] {
        let path = format!("{}/{op}", sub_path("q", "s"));
        let a = call(&c, follower, Method::POST, &path, Some(&body)).await;
        let problem = a.expect_problem(&c, 307, "not_leader", &format!("{op} on a follower"));
        assert_eq!(
            a.location.as_deref(),
            Some(format!("{}{path}", c.url(leader)).as_str()),
            "Location of a {op} on a follower"
        );
        assert_eq!(problem["leader_id"], json!(leader), "{problem}");
    }
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.delivered, st.acked),
        (4, 2, 4, 8, 4),
        "redirected requests changed the subscription: {st:?}"
    );

    // What is left: 8 and 9 only, then nothing.
    let third = pull(&c, "q", "s", json!({"max": 10})).await;
    assert_eq!(offsets(&third), vec![8, 9], "{third:?}");
    let started = Instant::now();
    let empty = pull(&c, "q", "s", json!({"max": 10, "wait_ms": 0})).await;
    assert!(empty.is_empty(), "every record is leased: {empty:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "wait_ms 0 must answer at once"
    );
    let rest: Vec<&str> = second[1..]
        .iter()
        .chain(&third)
        .map(|m| m.receipt.as_str())
        .chain([r[4]])
        .collect();
    assert_eq!(
        ack(&c, "q", "s", &rest).await,
        vec![ReceiptStatus::Acked; 6]
    );
    let st = wait_cursor_everywhere(&c, "q", "s", 10, Duration::from_secs(20)).await;
    assert_eq!(
        st,
        SubState {
            cursor: 10,
            backlog: 0,
            in_flight: 0,
            delivered: 10,
            acked: 10,
            redelivered: 0,
            dead_lettered: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_keeps_position_delay_holds_back_and_extend() {
    let c = cluster_with_sub("n", 6, json!({"ack_timeout_ms": 60000})).await;

    let first = pull(&c, "n", "s", json!({"max": 3})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2]);
    assert_eq!(
        nack(&c, "n", "s", &[&first[1].receipt], 0, false).await,
        vec![ReceiptStatus::Released]
    );
    let st = sub_now(&c, "n", "s").await;
    assert_eq!(
        (st.cursor, st.in_flight, st.backlog),
        (0, 2, 4),
        "after the nack: {st:?}"
    );

    // The released record comes back at its position, before later fresh records.
    let second = pull(&c, "n", "s", json!({"max": 2})).await;
    assert_eq!(
        offsets(&second),
        vec![1, 3],
        "redelivery first, in offset order: {second:?}"
    );
    assert_eq!(counts(&second), vec![2, 1], "{second:?}");
    assert_ne!(
        second[0].receipt, first[1].receipt,
        "a new delivery has a new receipt"
    );
    assert_eq!(second[0].value_str(), Some("n/1"));
    let st = sub_now(&c, "n", "s").await;
    assert_eq!((st.delivered, st.redelivered), (5, 1), "{st:?}");
    // The nacked delivery is over.
    assert_eq!(
        ack(&c, "n", "s", &[&first[1].receipt]).await,
        vec![ReceiptStatus::Stale]
    );

    // A nack delay holds the record back; a long-poll gets it once the delay is over (the
    // leader ticks by itself: nothing else is written meanwhile).
    let nacked_at = Instant::now();
    assert_eq!(
        nack(&c, "n", "s", &[&second[0].receipt], 1500, false).await,
        vec![ReceiptStatus::Released]
    );
    let now = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 0})).await;
    assert_eq!(
        offsets(&now),
        vec![4, 5],
        "offset 1 is delayed 1.5 s: {now:?}"
    );
    assert!(
        nacked_at.elapsed() < Duration::from_millis(1400),
        "the immediate pull took too long to prove anything ({:?})",
        nacked_at.elapsed()
    );
    let later = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 10000})).await;
    let waited = nacked_at.elapsed();
    assert_eq!(offsets(&later), vec![1], "after the delay: {later:?}");
    assert_eq!(counts(&later), vec![3], "{later:?}");
    assert!(
        waited >= Duration::from_millis(1450),
        "a record nacked with delay_ms 1500 was delivered again after {waited:?}"
    );
    assert!(
        waited <= Duration::from_millis(1500 + 5000),
        "the long-poll should answer soon after the delay ends, not after {waited:?}"
    );

    // Extend: a later expiry, counted from the extend.
    let target = &second[1]; // offset 3, leased for 60 s
    let results = settle(
        &c,
        "n",
        "s",
        "extend",
        &[&first[1].receipt, &target.receipt],
        json!({"ack_timeout_ms": 120000}),
    )
    .await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Stale, ReceiptStatus::Extended],
        "{results:?}"
    );
    let extended_to = results[1]
        .lease_expires_ms
        .unwrap_or_else(|| c.fail(&format!("extended without lease_expires_ms: {results:?}")));
    assert!(
        extended_to >= target.lease_expires_ms + 60_000,
        "extend by 120 s after a 60 s lease must end at least 60 s later: {} -> {extended_to}",
        target.lease_expires_ms
    );

    // Extend really keeps the record leased: a 1 s lease extended to 60 s is not delivered
    // again 2.5 s later.
    c.publish_values("n", &["n/6".to_string()]).await;
    let short = pull(&c, "n", "s", json!({"max": 1, "ack_timeout_ms": 1000})).await;
    assert_eq!(offsets(&short), vec![6]);
    let results = settle(
        &c,
        "n",
        "s",
        "extend",
        &[&short[0].receipt],
        json!({"ack_timeout_ms": 60000}),
    )
    .await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Extended],
        "{results:?}"
    );
    assert!(
        results[0].lease_expires_ms.unwrap_or(0) >= short[0].lease_expires_ms + 59_000,
        "{results:?} vs {short:?}"
    );
    let waited_from = Instant::now();
    let none = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 2500})).await;
    assert!(
        none.is_empty(),
        "the extended lease (and all others) must hold: got {none:?}"
    );
    assert!(
        waited_from.elapsed() >= Duration::from_millis(2400),
        "an empty long-poll answered before its wait ended: {:?}",
        waited_from.elapsed()
    );

    // Ack everything live; then every old receipt is stale for each operation.
    let live: Vec<&str> = [
        &first[0], &first[2], &second[1], &now[0], &now[1], &later[0], &short[0],
    ]
    .iter()
    .map(|m| m.receipt.as_str())
    .collect();
    assert_eq!(
        ack(&c, "n", "s", &live).await,
        vec![ReceiptStatus::Acked; 7]
    );
    assert_eq!(
        nack(&c, "n", "s", &[live[0]], 0, false).await,
        vec![ReceiptStatus::Stale],
        "nack of an acked receipt"
    );
    let results = settle(&c, "n", "s", "extend", &[live[1]], json!({})).await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Stale],
        "extend of an acked receipt"
    );
    let st = wait_cursor_everywhere(&c, "n", "s", 7, Duration::from_secs(20)).await;
    assert_eq!(
        st,
        SubState {
            cursor: 7,
            backlog: 0,
            in_flight: 0,
            delivered: 9,
            acked: 7,
            redelivered: 2,
            dead_lettered: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_redelivered_first_and_stale_receipt() {
    let c = cluster_with_sub("e", 5, json!({"ack_timeout_ms": 1000})).await;

    // A consumer pulls 5, acks 3 of them (not the lowest), then dies.
    let pulled_at = Instant::now();
    let first = pull(&c, "e", "s", json!({"max": 5})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2, 3, 4]);
    let r: Vec<&str> = first.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "e", "s", &[r[1], r[3], r[4]]).await,
        vec![ReceiptStatus::Acked; 3]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!((st.cursor, st.acked), (0, 3), "{st:?}");

    // Another consumer long-polls: nothing is available until the 1 s leases expire, and
    // nobody writes meanwhile, so only the leader's own tick can answer it.
    let again = pull(
        &c,
        "e",
        "s",
        json!({"max": 1, "wait_ms": 10000, "ack_timeout_ms": 60000}),
    )
    .await;
    let waited = pulled_at.elapsed();
    assert_eq!(
        offsets(&again),
        vec![0],
        "the lowest expired record first: {again:?}"
    );
    assert_eq!(counts(&again), vec![2], "{again:?}");
    assert!(
        waited >= Duration::from_millis(950),
        "a 1 s lease was delivered again after {waited:?}"
    );
    assert!(
        waited <= Duration::from_millis(1000 + 4000),
        "the expired lease took {waited:?} to be delivered again (does the leader tick?)"
    );

    // With fresh records available too, the expired one still comes first.
    c.publish_values("e", &values(7, "e")[5..]).await;
    let more = pull(&c, "e", "s", json!({"max": 10, "ack_timeout_ms": 60000})).await;
    assert_eq!(
        offsets(&more),
        vec![2, 5, 6],
        "expired record before fresh ones: {more:?}"
    );
    assert_eq!(counts(&more), vec![2, 1, 1], "{more:?}");
    let got: Vec<Option<&str>> = more.iter().map(|m| m.value_str()).collect();
    assert_eq!(
        got,
        vec![Some("e/2"), Some("e/5"), Some("e/6")],
        "each message carries its own record, across a gap in the offsets"
    );

    // The dead consumer's receipts of the two redelivered records are stale.
    assert_eq!(
        ack(&c, "e", "s", &[r[0], r[2]]).await,
        vec![ReceiptStatus::Stale, ReceiptStatus::Stale]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(
        (
            st.cursor,
            st.in_flight,
            st.acked,
            st.delivered,
            st.redelivered
        ),
        (0, 4, 3, 9, 2),
        "stale acks change nothing: {st:?}"
    );

    // Ack the redelivered 0: the cursor stops at 2, the first unacked offset...
    assert_eq!(
        ack(&c, "e", "s", &[&again[0].receipt]).await,
        vec![ReceiptStatus::Acked]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(st.cursor, 2, "{st:?}");
    // ...and a stream read with the subscription (no `from`) resumes there, on any node,
    // not after the fifth record that was delivered.
    let leader = c.leader_id().await;
    let page = c.read(leader, "e", "subscription=s").await;
    assert_eq!(
        page.records.first().map(|r| r.offset),
        Some(2),
        "a read with the subscription must start at the first unacked offset: {page:?}"
    );
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6]
    );
    c.wait_converged("e").await;
    wait_cursor_everywhere(&c, "e", "s", 2, Duration::from_secs(20)).await;
    let follower = c.follower_id().await;
    let page = c.read(follower, "e", "subscription=s").await;
    assert_eq!(
        page.records.first().map(|r| r.offset),
        Some(2),
        "on follower {follower}: {page:?}"
    );
    // The read itself moved nothing.
    assert_eq!(sub_now(&c, "e", "s").await.cursor, 2);

    let rest: Vec<&str> = more.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "e", "s", &rest).await,
        vec![ReceiptStatus::Acked; 3]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(
        (st.cursor, st.in_flight, st.backlog, st.acked),
        (7, 0, 0, 7),
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_leader_change() {
    let c = cluster_with_sub("l", 3, json!({"ack_timeout_ms": 60000})).await;

    let old = c.leader_id().await;
    let path = format!("{}/pull", sub_path("l", "s"));
    let a = call(
        &c,
        old,
        Method::POST,
        &path,
        Some(&json!({"max": 1}).to_string()),
    )
    .await;
    let m: PullResponse = a.json(&c, 200, "pull on the leader");
    assert_eq!(offsets(&m.messages), vec![0]);
    let receipt = m.messages[0].receipt.clone();

    c.kill(old);
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old);
    // The lease is in the new leader's state: offset 0 is not available.
    let rest = pull(&c, "l", "s", json!({"max": 10})).await;
    assert_eq!(
        offsets(&rest),
        vec![1, 2],
        "offset 0 is still leased: {rest:?}"
    );

    // The receipt issued by the old leader is acked through the new one.
    let path = format!("{}/ack", sub_path("l", "s"));
    let a = call(
        &c,
        new,
        Method::POST,
        &path,
        Some(&json!({"receipts": [receipt]}).to_string()),
    )
    .await;
    let results: ReceiptResults = a.json(&c, 200, "ack through the new leader");
    assert_eq!(
        statuses(&results.results),
        vec![ReceiptStatus::Acked],
        "{results:?}"
    );
    let rest: Vec<&str> = rest.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "l", "s", &rest).await,
        vec![ReceiptStatus::Acked; 2]
    );
    let none = pull(&c, "l", "s", json!({"max": 10, "wait_ms": 1500})).await;
    assert!(none.is_empty(), "an acked record came back: {none:?}");

    c.restart(old).await;
    c.wait_converged("l").await;
    let st = wait_cursor_everywhere(&c, "l", "s", 3, Duration::from_secs(30)).await;
    assert_eq!(
        st,
        SubState {
            cursor: 3,
            backlog: 0,
            in_flight: 0,
            delivered: 3,
            acked: 3,
            redelivered: 0,
            dead_lettered: 0
        },
        "on every node, the restarted one included"
    );
    let none = pull(&c, "l", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");
}

/// A pull that asks for the binary form of records (`Accept: application/vnd.raftq.records`)
/// leases exactly as a JSON pull does, and its messages carry the same receipts, offsets and
/// contents, a binary value as its bytes; its receipts ack as any others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_in_the_binary_form_leases_as_a_json_pull_does() {
    use raftq_client::api::{records_form, RECORDS_CONTENT_TYPE};

    let c = crate::common::Cluster::start(3).await;
    c.create_topic("bf").await;
    crate::http::publish_json(
        &c,
        "bf",
        json!([
            {"value": "bf/0", "key": "k", "headers": {"h": "1"}},
            {"value_b64": "/wAB"},
            {"value": "bf/2"},
            {"value": "bf/3"},
        ]),
    )
    .await;
    crate::http::create_sub(&c, "bf", "s", json!({"ack_timeout_ms": 60000})).await;
    let leader = c.leader_id().await;
    let resp = c
        .send(
            c.http()
                .post(format!("{}{}/pull", c.url(leader), sub_path("bf", "s")))
                .header(reqwest::header::ACCEPT, RECORDS_CONTENT_TYPE)
                .json(&json!({"max": 3})),
            "pull in the binary form",
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some(RECORDS_CONTENT_TYPE)
    );
    let body = resp.bytes().await.expect("the body");
    let binary = records_form::decode_pull(&body).unwrap_or_else(|e| c.fail(&e));
    assert_eq!(offsets(&binary), vec![0, 1, 2], "{binary:?}");
    assert_eq!(counts(&binary), vec![1, 1, 1]);
    assert_eq!(binary[0].value_str(), Some("bf/0"));
    assert_eq!(binary[0].key.as_deref(), Some("k"));
    assert_eq!(binary[0].headers.get("h").map(String::as_str), Some("1"));
    assert_eq!(&binary[1].value[..], &[0xff, 0x00, 0x01]);
    assert!(binary.iter().all(|m| m.lease_expires_ms > m.timestamp_ms));
    // The JSON pull gets what is left, and the binary receipts ack.
    let rest = pull(&c, "bf", "s", json!({"max": 10})).await;
    assert_eq!(offsets(&rest), vec![3]);
    let receipts: Vec<&str> = binary.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "bf", "s", &receipts).await,
        vec![ReceiptStatus::Acked; 3]
    );
}
