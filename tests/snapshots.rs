//! Snapshots, log purge and bounded disk against a real three-node cluster: a follower that
//! missed a purged stretch of log catches up by snapshot and ends with exactly the leader's
//! state; a whole cluster restarts after purges; a publish-then-ack work queue keeps its
//! data directories bounded.

mod common;

use std::path::Path;
use std::time::Duration;

use common::Cluster;
use raftq_client::api::{
    PublishRequest, PullRequest, RecordIn, SnapshotTaken, TopicInfo, TopicReport,
};
use raftq_client::Client;
use serde_json::{json, Value};

/// Publishes `count` records of `size` bytes in batches of `batch`, numbered from `start`.
async fn publish(c: &Cluster, client: &Client, topic: &str, start: u64, count: u64, size: usize) {
    let batch = 500;
    let pad = "x".repeat(size.saturating_sub(12));
    let mut i = start;
    while i < start + count {
        let n = batch.min(start + count - i);
        let records = (i..i + n)
            .map(|k| RecordIn::text(format!("{k:010}{pad}")))
            .collect();
        if let Err(e) = client.publish_records(topic, records).await {
            c.fail(&format!("publish of records {i}.. failed: {e}"));
        }
        i += n;
    }
}

/// Pulls and acks until `count` messages of `sub` were acked.
async fn drain(c: &Cluster, client: &Client, topic: &str, sub: &str, count: u64) {
    let mut acked = 0;
    while acked < count {
        let want = 1000.min(count - acked) as u32;
        let request = PullRequest {
            max: Some(want),
            wait_ms: Some(5_000),
            ..Default::default()
        };
        let pulled = match client.pull(topic, sub, &request).await {
            Ok(p) => p,
            Err(e) => c.fail(&format!("pull failed after {acked} acks: {e}")),
        };
        let receipts: Vec<String> = pulled.messages.into_iter().map(|m| m.receipt).collect();
        if receipts.is_empty() {
            c.fail(&format!("nothing to pull after {acked} of {count} acks"));
        }
        acked += receipts.len() as u64;
        if let Err(e) = client.ack(topic, sub, &receipts).await {
            c.fail(&format!("ack failed: {e}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_by_snapshot_and_matches_the_leader_exactly() {
    let c = Cluster::start_with(3, &["--snapshot-logs", "40", "--snapshot-keep-logs", "5"]).await;
    let client = c.client();
    c.create_until_acked_topic("tasks", &["w"]).await;
    c.put_json(
        "/v1/topics/log",
        &json!({"retention": {"max_records": 1000}}),
    )
    .await;

    let follower = c.follower_id().await;
    c.kill(follower);
    // 50,000 records published, all acked (so until_acked removes them), plus a topic
    // trimmed by count, and an idempotent producer whose sequence must survive.
    publish(&c, &client, "tasks", 0, 50_000, 16).await;
    drain(&c, &client, "tasks", "w", 50_000).await;
    publish(&c, &client, "log", 0, 5_000, 16).await;
    for seq in 0..3 {
        let resp = c
            .send(
                c.http()
                    .post(format!(
                        "{}/v1/topics/log/records",
                        c.url(c.leader_id().await)
                    ))
                    .json(
                        &json!({"records": [{"value": "p"}], "producer_id": "p", "sequence": seq}),
                    ),
                "idempotent publish",
            )
            .await;
        let _: Value = c.json_of(resp, 200, "idempotent publish").await;
    }
    let leader = c.leader_id().await;
    let info: TopicInfo = c
        .topic(leader, "tasks")
        .await
        .unwrap_or_else(|e| c.fail(&e));
    assert_eq!(
        (info.summary.first_offset, info.summary.next_offset),
        (50_000, 50_000),
        "until_acked removed every acked record"
    );
    let status = c.status(leader).await.unwrap_or_else(|e| c.fail(&e));
    let snap = status
        .snapshot
        .unwrap_or_else(|| c.fail("the leader has no snapshot"));
    assert!(snap.index > 100, "the leader snapshotted late: {snap:?}");

    c.wait_purged(leader, 100).await;

    // The follower comes back behind the purged log: only a snapshot can bring it up.
    c.restart(follower).await;
    let want = status.last_applied;
    c.wait_for(
        "the follower to catch up",
        Duration::from_secs(60),
        || async {
            let s = c.status(follower).await?;
            if s.last_applied >= want {
                Ok(())
            } else {
                Err(format!("applied {} of {want}", s.last_applied))
            }
        },
    )
    .await;
    assert!(
        c.log_since_last_start(follower)
            .contains("snapshot installed"),
        "the follower caught up without a snapshot:\n{}",
        common::tail(&c.log_since_last_start(follower), 30)
    );
    // As a linked transfer: the records' log entries came as the snapshot's record files.
    assert!(
        c.log_since_last_start(follower)
            .contains("received a linked snapshot"),
        "the follower received the snapshot whole:\n{}",
        common::tail(&c.log_since_last_start(follower), 30)
    );
    let seen = c.digests().await;
    assert!(
        seen.iter().all(|d| d == &seen[0]),
        "state digests differ: {seen:?}"
    );
    let report: TopicReport = c.get_json(follower, "/v1/topics/log/report").await;
    assert_eq!(report.published, 5_003);
    assert_eq!(report.records, 1_000);
    assert_eq!(report.discarded.retention, 4_003);

    // The whole cluster restarts after its logs were purged: same state everywhere.
    c.kill_all();
    for id in c.ids() {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    let seen = c.digests().await;
    assert!(
        seen.iter().all(|d| d == &seen[0]),
        "state digests differ after a full restart: {seen:?}"
    );
    // Deduplication survived snapshot, install and restart (the SDK retries an idempotent
    // publish while the restarted cluster settles).
    let request = PublishRequest {
        records: vec![RecordIn::text("p")],
        producer_id: Some("p".into()),
        sequence: Some(2),
    };
    let again = c
        .client()
        .publish("log", &request)
        .await
        .unwrap_or_else(|e| c.fail(&format!("re-sent idempotent publish: {e}")));
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.first_offset, 5_002, "{again:?}");

    // An operator asks a node for a snapshot now: it answers once one covers what it applied.
    let node = c.follower_id().await;
    let applied = c
        .status(node)
        .await
        .unwrap_or_else(|e| c.fail(&e))
        .last_applied;
    let resp = c
        .call(reqwest::Method::POST, node, "/v1/cluster/snapshot")
        .await;
    let taken: SnapshotTaken = c.json_of(resp, 200, "POST /v1/cluster/snapshot").await;
    assert_eq!(taken.node_id, node);
    assert!(taken.snapshot.index >= applied, "{taken:?} < {applied}");
    assert!(taken.snapshot.bytes > 0);
    let status = c.status(node).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(status.snapshot, Some(taken.snapshot));
}

/// Bytes on disk under `path`, each file once however many names it has (a snapshot links
/// the log's segment files): those of the purged log segments kept for reuse (`*.spare`, at
/// most `MAX_SPARE_SEGMENTS` of them), and the rest.
fn dir_size(path: &Path) -> (u64, u64) {
    fn walk(path: &Path, seen: &mut std::collections::HashSet<(u64, u64)>, total: &mut (u64, u64)) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(entries) = std::fs::read_dir(path) {
            for entry in entries.flatten() {
                match entry.metadata() {
                    Ok(m) if m.is_dir() => walk(&entry.path(), seen, total),
                    Ok(m) if seen.insert((m.dev(), m.ino())) => {
                        if entry.file_name().to_string_lossy().ends_with(".spare") {
                            total.1 += m.len();
                        } else {
                            total.0 += m.len();
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let mut total = (0, 0);
    walk(path, &mut std::collections::HashSet::new(), &mut total);
    total
}

/// The bound: with 1 MiB memtables (so a write-ahead log of at most 4 MiB), snapshots every
/// 50 entries keeping 10, and a work queue that removes what is acked, a node's data
/// directory holds the WAL, the memtables' flushed output not yet compacted, at most two
/// snapshots of the (small) live state and the log tail: well under 24 MiB, however many
/// bytes pass through. Here 60 MiB pass through. Beside that, the log keeps purged segments
/// for reuse, at most `MAX_SPARE_SEGMENTS` of them.
const BOUND: u64 = 24 << 20;
const SPARES_BOUND: u64 = raftq::store::segments::MAX_SPARE_SEGMENTS as u64
    * raftq::store::segments::DEFAULT_SEGMENT_BYTES;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_then_ack_work_queue_keeps_the_data_directory_bounded() {
    let c = Cluster::start_with(
        3,
        &[
            "--snapshot-logs",
            "50",
            "--snapshot-keep-logs",
            "10",
            "--write-buffer-bytes",
            "1048576",
        ],
    )
    .await;
    let client = c.client();
    c.create_until_acked_topic("q", &["w"]).await;

    let record = 1024;
    let per_cycle = 1_024; // 1 MiB per cycle
    let cycles = 60;
    let (mut sizes, mut spares) = (Vec::new(), Vec::new());
    for cycle in 0..cycles {
        publish(&c, &client, "q", cycle * per_cycle, per_cycle, record).await;
        drain(&c, &client, "q", "w", per_cycle).await;
        if cycle % 10 == 9 {
            let each: Vec<(u64, u64)> = c
                .ids()
                .iter()
                .map(|id| dir_size(&c.data_dir(*id)))
                .collect();
            sizes.push(each.iter().map(|s| s.0).max().unwrap_or(0));
            spares.push(each.iter().map(|s| s.1).max().unwrap_or(0));
        }
    }
    eprintln!(
        "largest data directory after every 10 MiB published and acked: {:?} MiB, and spare log segments {:?} MiB",
        sizes.iter().map(|s| s / (1 << 20)).collect::<Vec<_>>(),
        spares.iter().map(|s| s / (1 << 20)).collect::<Vec<_>>()
    );
    assert!(
        spares.iter().all(|s| *s <= SPARES_BOUND),
        "spare log segments beyond their bound ({SPARES_BOUND} bytes): {spares:?}"
    );
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(
        largest < BOUND,
        "a data directory reached {largest} bytes (bound {BOUND}); sizes {sizes:?}"
    );
    // Not growing with what passed through: the last size is no more than the bound's
    // half above the first.
    let (first, last) = (sizes[0], sizes[sizes.len() - 1]);
    assert!(
        last <= first + BOUND / 2,
        "data directories grow with throughput: {sizes:?}"
    );
}
