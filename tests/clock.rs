//! The entry clock (docs/subscriptions.md, "Time"): a leader whose wall clock is far off does
//! not move the state machine's time. A follower restarted with its wall clock ten minutes
//! ahead (libfaketime, which fakes the wall clock of one process and leaves its monotonic
//! clock alone) and made leader must not let retention by age delete records published
//! seconds before, nor expire leases early: it stamps the cluster's time.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Cluster;
use raftq_client::api::{PullResponse, RecordIn, TopicReport};
use serde_json::json;

/// libfaketime from Debian's `faketime` package (scripts/test.sh installs it).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_ten_minutes_ahead_expires_and_deletes_nothing_early() {
    assert!(
        std::path::Path::new(FAKETIME_LIB).is_file(),
        "{FAKETIME_LIB} is missing: install Debian's faketime package (scripts/test.sh does)"
    );
    let c = Cluster::start(3).await;
    // Records older than five minutes go; leases last a minute.
    c.put_json(
        "/v1/topics/aged",
        &json!({"retention": {"max_age_ms": 300_000}}),
    )
    .await;
    c.put_json(
        "/v1/topics/aged/subscriptions/s",
        &json!({"ack_timeout_ms": 60_000}),
    )
    .await;
    let client = c.client();
    let records: Vec<RecordIn> = (0..100).map(|i| RecordIn::text(format!("r{i}"))).collect();
    client
        .publish_records("aged", records)
        .await
        .unwrap_or_else(|e| c.fail(&format!("publish: {e}")));
    let pulled = c
        .leader_json(
            reqwest::Method::POST,
            "/v1/topics/aged/subscriptions/s/pull",
            json!({"max": 10}),
        )
        .await;
    let pulled: PullResponse = serde_json::from_value(pulled).expect("a pull answer");
    assert_eq!(pulled.messages.len(), 10);

    // A follower restarts with its wall clock ten minutes ahead.
    let fast = c.follower_id().await;
    c.kill(fast);
    c.set_env(
        fast,
        &[
            ("LD_PRELOAD", FAKETIME_LIB),
            ("FAKETIME", "+10m"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    c.restart(fast).await;
    // Its wall clock really is ten minutes ahead (the test would prove nothing otherwise).
    let status = c.raft_status(fast).await.unwrap_or_else(|e| c.fail(&e));
    let ahead_ms = status["wall_us"].as_u64().unwrap_or(0) / 1000;
    let ahead_ms = ahead_ms.saturating_sub(now_ms());
    assert!(
        (590_000..610_000).contains(&ahead_ms),
        "the fast node's wall clock is {ahead_ms} ms ahead, not ten minutes"
    );

    // It becomes the leader, and stamps entries: publishes and ticks.
    c.wait_converged("aged").await;
    c.leader_json(
        reqwest::Method::POST,
        "/v1/cluster/transfer-leader",
        json!({"to": fast}),
    )
    .await;
    c.wait_for("the fast node to lead", Duration::from_secs(20), || async {
        match c.status(fast).await {
            Ok(s) if s.leader_id == Some(fast) => Ok(()),
            Ok(s) => Err(format!("leader {:?}", s.leader_id)),
            Err(e) => Err(e),
        }
    })
    .await;
    client
        .publish_records("aged", vec![RecordIn::text("after")])
        .await
        .unwrap_or_else(|e| c.fail(&format!("publish through the fast leader: {e}")));
    // Give the leader's ticker time to tick whatever it thinks is due.
    tokio::time::sleep(Duration::from_secs(3)).await;
    client
        .publish_records("aged", vec![RecordIn::text("later")])
        .await
        .unwrap_or_else(|e| c.fail(&format!("publish through the fast leader: {e}")));

    let report: TopicReport = c.get_json(fast, "/v1/topics/aged/report").await;
    assert_eq!(
        report.discarded.retention, 0,
        "retention by age deleted records published seconds ago: {report:?}"
    );
    assert_eq!(report.records, 102);
    let sub = &report.subscriptions["s"];
    assert_eq!(
        (sub.in_flight, sub.expired_leases),
        (10, 0),
        "leases of a minute expired early: {sub:?}"
    );
    // The state machine's time is the cluster's, not the fast node's.
    let skew = report.commit_point.timestamp_ms as i64 - now_ms() as i64;
    assert!(
        skew.abs() < 10_000,
        "the commit point's time is {skew} ms off the real time"
    );
    // The fast node says how far off its wall clock is.
    let metrics = c
        .call(reqwest::Method::GET, fast, "/metrics")
        .await
        .text()
        .await
        .unwrap_or_default();
    let offset: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("raftq_clock_offset_ms "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| c.fail("no raftq_clock_offset_ms in /metrics"));
    assert!(
        (590_000.0..610_000.0).contains(&offset),
        "raftq_clock_offset_ms is {offset}"
    );
}
