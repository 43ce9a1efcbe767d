//! Idempotent publish, reports and broadcast over HTTP against a real three-node cluster
//! (API.md, "Publish", "Commit points and reports").

mod common;

use std::time::Duration;

use common::Cluster;
use raftq_client::api::{
    BroadcastResponse, PublishResponse, ReadResponse, Record, Report, SubscriptionReport,
    TopicReport, HEADER_COMMIT_INDEX, HEADER_COMMIT_TIMESTAMP_MS,
};
use serde_json::{json, Value};

fn batch(producer: &str, sequence: u64, values: &[&str]) -> Value {
    json!({
        "records": values.iter().map(|v| json!({"value": v})).collect::<Vec<_>>(),
        "producer_id": producer,
        "sequence": sequence,
    })
}

/// `POST {path}` with a JSON body to the leader.
async fn post(c: &Cluster, path: &str, body: &Value) -> reqwest::Response {
    c.post_to_leader(path, body).await
}

async fn publish(c: &Cluster, topic: &str, body: &Value) -> PublishResponse {
    let what = format!("publish {body} to {topic}");
    let resp = post(c, &format!("/v1/topics/{topic}/records"), body).await;
    c.json_of(resp, 200, &what).await
}

/// Every record of `topic` as node `id` serves it.
async fn all_records(c: &Cluster, id: u64, topic: &str) -> Vec<Record> {
    let page: ReadResponse = c
        .get_json(
            id,
            &format!("/v1/topics/{topic}/records?from=first&max=10000"),
        )
        .await;
    page.records
}

/// Waits until every running node has applied at least `index`.
async fn converge(c: &Cluster, index: u64) {
    c.wait_for(
        &format!("every node to apply index {index}"),
        Duration::from_secs(20),
        || async {
            for id in c.running_ids() {
                let s = c.status(id).await?;
                if s.last_applied < index {
                    return Err(format!("node {id} applied {}", s.last_applied));
                }
            }
            Ok(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_publish_deduplicates_across_leader_kill_and_full_restart() {
    let c = Cluster::start(3).await;
    c.put_json("/v1/topics/orders", &json!({})).await;

    let first = publish(&c, "orders", &batch("p-1", 0, &["a", "b"])).await;
    assert_eq!(
        (first.first_offset, first.last_offset, first.duplicate),
        (0, 1, false)
    );
    let again = publish(&c, "orders", &batch("p-1", 0, &["a", "b"])).await;
    assert_eq!(
        (again.first_offset, again.last_offset, again.duplicate),
        (0, 1, true)
    );
    assert!(again.commit_point.index > first.commit_point.index);

    // A gap is refused with the expected sequence, and changes nothing.
    let resp = post(&c, "/v1/topics/orders/records", &batch("p-1", 2, &["z"])).await;
    let (problem, _) = c.expect_problem(resp, 409, "sequence_gap", "a gap").await;
    assert_eq!(problem.expected_sequence, Some(1), "{problem:?}");
    let second = publish(&c, "orders", &batch("p-1", 1, &["c"])).await;
    assert_eq!((second.first_offset, second.duplicate), (2, false));

    // Half the idempotency data, or a bad producer id, is refused.
    for (what, body) in [
        (
            "producer_id alone",
            json!({"records": [{"value": "x"}], "producer_id": "p"}),
        ),
        (
            "sequence alone",
            json!({"records": [{"value": "x"}], "sequence": 0}),
        ),
        ("a bad producer id", batch("has space", 0, &["x"])),
        (
            "a negative sequence",
            json!({"records": [{"value": "x"}], "producer_id": "p", "sequence": -1}),
        ),
    ] {
        let resp = post(&c, "/v1/topics/orders/records", &body).await;
        c.expect_problem(resp, 400, "invalid_argument", what).await;
    }

    // The leader dies; the new leader still knows the producer.
    let old = c.leader_id().await;
    c.kill(old);
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old);
    let resent = publish(&c, "orders", &batch("p-1", 1, &["c"])).await;
    assert_eq!((resent.first_offset, resent.duplicate), (2, true));
    c.restart(old).await;

    // Every node dies at once and comes back: still deduplicated.
    c.kill_all();
    for id in c.ids() {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    let resent = publish(&c, "orders", &batch("p-1", 0, &["a", "b"])).await;
    assert_eq!(
        (resent.first_offset, resent.last_offset, resent.duplicate),
        (0, 1, true)
    );
    let third = publish(&c, "orders", &batch("p-1", 2, &["d"])).await;
    assert_eq!((third.first_offset, third.duplicate), (3, false));

    converge(&c, third.commit_point.index).await;
    for id in c.ids() {
        let values: Vec<String> = all_records(&c, id, "orders")
            .await
            .into_iter()
            .map(|r| r.value_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(values, ["a", "b", "c", "d"], "node {id}");
        let report: TopicReport = c.get_json(id, "/v1/topics/orders/report").await;
        assert_eq!(report.published, 4, "node {id}");
        assert_eq!(report.deduplicated, 2 + 1 + 2, "node {id}");
    }
}

fn check_balances(report: &TopicReport, what: &str) {
    assert_eq!(
        report.published,
        report.records + report.discarded.retention,
        "{what}: published = records + discarded.retention"
    );
    for (name, s) in &report.subscriptions {
        assert_eq!(
            s.seen,
            s.acked + s.dead_lettered + s.skipped + s.discarded.retention + s.backlog + s.in_flight,
            "{what}: balance of subscription {name}: {s:?}"
        );
    }
}

fn sub_delta(after: &SubscriptionReport, before: &SubscriptionReport) -> [u64; 7] {
    [
        after.delivered - before.delivered,
        after.acked - before.acked,
        after.redelivered - before.redelivered,
        after.expired_leases - before.expired_leases,
        after.dead_lettered - before.dead_lettered,
        after.discarded.max_deliveries - before.discarded.max_deliveries,
        after.discarded.rejected - before.discarded.rejected,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_subtract_to_exactly_what_a_workload_did() {
    let c = Cluster::start(3).await;
    c.put_json("/v1/topics/jobs", &json!({})).await;
    c.put_json("/v1/topics/jobs.dlq", &json!({})).await;
    c.put_json(
        "/v1/topics/jobs/subscriptions/main",
        &json!({"dead_letter_topic": "jobs.dlq"}),
    )
    .await;
    c.put_json(
        "/v1/topics/jobs/subscriptions/strict",
        &json!({"max_deliveries": 1}),
    )
    .await;
    // Some history before the first report.
    publish(&c, "jobs", &batch("warm", 0, &["w1", "w2"])).await;
    let leader = c.leader_id().await;
    let before: TopicReport = c.get_json(leader, "/v1/topics/jobs/report").await;
    check_balances(&before, "before");

    // The workload: 6 records in two batches, one batch re-sent; 4 leased on `main`, 2
    // acked, 1 nacked to the dead-letter topic; 3 leased on `strict` and nacked (each
    // reaches max_deliveries, and there is no dead-letter topic: discarded), 1 of them with
    // dead_letter (rejected); one broadcast.
    publish(&c, "jobs", &batch("w", 0, &["1", "2", "3"])).await;
    publish(&c, "jobs", &batch("w", 1, &["4", "5", "6"])).await;
    publish(&c, "jobs", &batch("w", 1, &["4", "5", "6"])).await;
    let pull = |sub: &'static str, max: u64| {
        let c = &c;
        async move {
            let resp = post(
                c,
                &format!("/v1/topics/jobs/subscriptions/{sub}/pull"),
                &json!({"max": max}),
            )
            .await;
            let v: Value = c.json_of(resp, 200, "pull").await;
            v["messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| m["receipt"].as_str().unwrap_or_default().to_string())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        }
    };
    let settle = |sub: &'static str, verb: &'static str, body: Value| {
        let c = &c;
        async move {
            let resp = post(
                c,
                &format!("/v1/topics/jobs/subscriptions/{sub}/{verb}"),
                &body,
            )
            .await;
            let _: Value = c.json_of(resp, 200, verb).await;
        }
    };
    let main = pull("main", 4).await;
    assert_eq!(main.len(), 4);
    settle("main", "ack", json!({"receipts": &main[..2]})).await;
    settle(
        "main",
        "nack",
        json!({"receipts": &main[2..3], "dead_letter": true}),
    )
    .await;
    let strict = pull("strict", 3).await;
    assert_eq!(strict.len(), 3);
    settle("strict", "nack", json!({"receipts": &strict[..2]})).await;
    settle(
        "strict",
        "nack",
        json!({"receipts": &strict[2..], "dead_letter": true}),
    )
    .await;
    let resp = post(
        &c,
        "/v1/broadcast",
        &json!({"topics": ["jobs"], "value": "mark"}),
    )
    .await;
    let marked: BroadcastResponse = c.json_of(resp, 200, "broadcast").await;

    let leader = c.leader_id().await;
    let after: TopicReport = c.get_json(leader, "/v1/topics/jobs/report").await;
    check_balances(&after, "after");
    assert!(after.commit_point.index >= marked.commit_point.index);
    assert_eq!(
        after.published - before.published,
        6 + 1,
        "6 records and a marker"
    );
    assert_eq!(after.deduplicated - before.deduplicated, 3);
    assert_eq!(after.records - before.records, 7);
    assert_eq!(
        after.discarded.max_deliveries - before.discarded.max_deliveries,
        2
    );
    assert_eq!(after.discarded.rejected - before.discarded.rejected, 1);
    let d = |name: &str| sub_delta(&after.subscriptions[name], &before.subscriptions[name]);
    // delivered, acked, redelivered, expired, dead_lettered, discarded max/rejected
    assert_eq!(d("main"), [4, 2, 0, 0, 1, 0, 0]);
    assert_eq!(d("strict"), [3, 0, 0, 0, 3, 2, 1]);
    assert_eq!(after.subscriptions["main"].in_flight, 1);
    let dlq: TopicReport = c.get_json(leader, "/v1/topics/jobs.dlq/report").await;
    assert_eq!(dlq.published, 1);

    // Every node reports the same once it has applied as far, and /v1/report agrees.
    converge(&c, after.commit_point.index).await;
    for id in c.ids() {
        let all: Report = c.get_json(id, "/v1/report").await;
        let mine = &all.topics["jobs"];
        let same_point = TopicReport {
            commit_point: mine.commit_point,
            ..after.clone()
        };
        if mine.commit_point.index == after.commit_point.index {
            assert_eq!(mine, &same_point, "node {id}");
        } else {
            // A later tick entry may have been applied since; counters are as before, the
            // state may have moved only by lease expiry (none is due within 30 s).
            assert_eq!(mine.published, after.published, "node {id}");
            assert_eq!(mine.subscriptions, after.subscriptions, "node {id}");
        }
        assert_eq!(all.commit_point, mine.commit_point);
    }

    let resp = c
        .call(reqwest::Method::GET, leader, "/v1/topics/nope/report")
        .await;
    c.expect_problem(resp, 404, "topic_not_found", "missing topic")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_is_in_every_named_topic_at_one_commit_point_or_in_none() {
    let c = Cluster::start(3).await;
    for t in ["a", "b", "c"] {
        c.put_json(&format!("/v1/topics/{t}"), &json!({})).await;
    }
    publish(&c, "b", &batch("p", 0, &["x", "y"])).await;

    let resp = post(
        &c,
        "/v1/broadcast",
        &json!({"topics": ["a", "b"], "value": "eod", "headers": {"kind": "end-of-day"}}),
    )
    .await;
    let marked: BroadcastResponse = c.json_of(resp, 200, "broadcast to a and b").await;
    assert_eq!(marked.offsets.len(), 2);
    assert_eq!(marked.offsets["a"], 0);
    assert_eq!(marked.offsets["b"], 2);

    // Refusals append nothing anywhere.
    let resp = post(&c, "/v1/broadcast", &json!({"topics": ["a", "missing"]})).await;
    c.expect_problem(resp, 404, "topic_not_found", "a missing topic")
        .await;
    for (what, body) in [
        ("no topics", json!({"topics": []})),
        ("an unknown field", json!({"topic": "a"})),
        ("a bad name", json!({"topics": ["bad name"]})),
        ("two values", json!({"value": "v", "value_b64": "dg=="})),
    ] {
        let resp = post(&c, "/v1/broadcast", &body).await;
        c.expect_problem(resp, 400, "invalid_argument", what).await;
    }

    // Omitted topics: all of them.
    let resp = post(&c, "/v1/broadcast", &json!({})).await;
    let everywhere: BroadcastResponse = c.json_of(resp, 200, "broadcast to all").await;
    assert_eq!(
        everywhere.offsets.keys().collect::<Vec<_>>(),
        ["a", "b", "c"]
    );

    converge(&c, everywhere.commit_point.index).await;
    for id in c.ids() {
        for (topic, want_len) in [("a", 2), ("b", 4), ("c", 1)] {
            let records = all_records(&c, id, topic).await;
            assert_eq!(records.len(), want_len, "node {id}, topic {topic}");
        }
        for (topic, offset) in &marked.offsets {
            let records = all_records(&c, id, topic).await;
            let marker = &records[*offset as usize];
            assert_eq!(marker.value_str(), Some("eod"));
            assert_eq!(marker.headers["kind"], "end-of-day");
            assert_eq!(
                marker.headers[HEADER_COMMIT_INDEX],
                marked.commit_point.index.to_string(),
                "node {id}, topic {topic}: the marker carries its entry's commit point"
            );
            assert_eq!(
                marker.headers[HEADER_COMMIT_TIMESTAMP_MS],
                marked.commit_point.timestamp_ms.to_string()
            );
            assert_eq!(marker.timestamp_ms, marked.commit_point.timestamp_ms);
        }
    }
}
