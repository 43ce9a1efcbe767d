//! Retention over HTTP against a real three-node cluster (API.md, "Topics" and "Read"):
//! records leave from the front by count, bytes, age or acks, by log entries, on every node
//! alike; reads below the first offset say how many were skipped; reports count what left.

mod common;

use std::time::Duration;

use common::Cluster;
use raftq_client::api::{ReadResponse, TopicInfo, TopicReport};
use serde_json::{json, Value};

async fn post(c: &Cluster, path: &str, body: &Value) -> Value {
    let resp = c.post_to_leader(path, body).await;
    c.json_of(resp, 200, &format!("POST {path} {body}")).await
}

async fn publish(c: &Cluster, topic: &str, values: &[String]) {
    let records: Vec<Value> = values.iter().map(|v| json!({"value": v})).collect();
    post(
        c,
        &format!("/v1/topics/{topic}/records"),
        &json!({ "records": records }),
    )
    .await;
}

/// Waits until every node reports `topic` with `first_offset == first` and `next`.
async fn wait_offsets(c: &Cluster, topic: &str, first: u64, next: u64) {
    c.wait_for(
        &format!("{topic} to hold offsets {first}..{next} on every node"),
        Duration::from_secs(20),
        || async {
            for id in c.running_ids() {
                let info: TopicInfo = c.topic(id, topic).await?;
                let got = (info.summary.first_offset, info.summary.next_offset);
                if got != (first, next) {
                    return Err(format!("node {id} holds {}..{}", got.0, got.1));
                }
            }
            Ok(())
        },
    )
    .await;
}

fn values(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("v{i:04}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_and_bytes_limits_trim_the_front_and_reads_report_skipped() {
    let c = Cluster::start(3).await;
    c.put_json(
        "/v1/topics/last5",
        &json!({"retention": {"max_records": 5}}),
    )
    .await;
    c.put_json("/v1/topics/last5/subscriptions/slow", &json!({}))
        .await;
    // Every value is 5 bytes: 20 bytes hold 4 records.
    c.put_json("/v1/topics/small", &json!({"retention": {"max_bytes": 20}}))
        .await;
    publish(&c, "last5", &values(0..8)).await;
    publish(&c, "last5", &values(8..12)).await;
    publish(&c, "small", &values(0..10)).await;
    wait_offsets(&c, "last5", 7, 12).await;
    wait_offsets(&c, "small", 6, 10).await;

    for id in c.ids() {
        let page: ReadResponse = c
            .get_json(id, "/v1/topics/last5/records?from=2&max=100")
            .await;
        assert_eq!(page.skipped, 5, "node {id}: offsets 2..7 are gone");
        let got: Vec<u64> = page.records.iter().map(|r| r.offset).collect();
        assert_eq!(got, (7..12).collect::<Vec<_>>(), "node {id}");
        assert_eq!(page.records[0].value_str(), Some("v0007"));
        let info: TopicInfo = c.topic(id, "small").await.unwrap_or_else(|e| c.fail(&e));
        assert_eq!(info.summary.bytes, 20, "node {id}");
        assert_eq!(info.config.retention.max_bytes, Some(20));

        let report: TopicReport = c.get_json(id, "/v1/topics/last5/report").await;
        assert_eq!(report.published, 12);
        assert_eq!(report.discarded.retention, 7);
        assert_eq!(report.records, 5);
        // The subscription never consumed the 7 removed records: counted, not skipped.
        let slow = &report.subscriptions["slow"];
        assert_eq!(slow.discarded.retention, 7, "node {id}: {slow:?}");
        assert_eq!(slow.cursor, 7);
        assert_eq!(slow.backlog, 5);
    }

    // A new subscription can start no lower than the first offset.
    let leader = c.leader_id().await;
    let resp = c
        .send(
            c.http()
                .put(format!(
                    "{}/v1/topics/last5/subscriptions/late",
                    c.url(leader)
                ))
                .json(&json!({"start": 3})),
            "start below the first offset",
        )
        .await;
    c.expect_problem(resp, 400, "invalid_argument", "start 3 < first 7")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_acked_removes_what_every_subscription_finished() {
    let c = Cluster::start(3).await;
    c.create_until_acked_topic("jobs", &["a", "b"]).await;
    publish(&c, "jobs", &values(0..10)).await;

    c.pull_and_ack("jobs", "a", 6, 6).await;
    // b has acked nothing: everything stays.
    wait_offsets(&c, "jobs", 0, 10).await;
    c.pull_and_ack("jobs", "b", 4, 4).await;
    wait_offsets(&c, "jobs", 4, 10).await;
    let info: TopicInfo = c
        .topic(c.leader_id().await, "jobs")
        .await
        .unwrap_or_else(|e| c.fail(&e));
    assert!(info.config.retention.until_acked);
    let report: TopicReport = c
        .get_json(c.leader_id().await, "/v1/topics/jobs/report")
        .await;
    assert_eq!(report.discarded.retention, 4);
    for sub in ["a", "b"] {
        assert_eq!(
            report.subscriptions[sub].discarded.retention, 0,
            "{sub} had finished every removed record"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_age_out_on_an_idle_topic() {
    let c = Cluster::start(3).await;
    c.put_json(
        "/v1/topics/fresh",
        &json!({"retention": {"max_age_ms": 1500}}),
    )
    .await;
    publish(&c, "fresh", &values(0..3)).await;
    // Nothing else is written: the leader's tick, due when the first record ages out,
    // removes them.
    wait_offsets(&c, "fresh", 3, 3).await;
    publish(&c, "fresh", &values(3..4)).await;
    let info: TopicInfo = c
        .topic(c.leader_id().await, "fresh")
        .await
        .unwrap_or_else(|e| c.fail(&e));
    assert_eq!(info.summary.records, 1, "a new record is not old");
}
