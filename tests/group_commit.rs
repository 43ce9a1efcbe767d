//! Group commit: many concurrent publish requests share Raft entries (and so fsyncs), and
//! every one still gets its own, distinct, dense offset; `--max-entry-commands 1` turns it off.

mod common;

use std::collections::BTreeSet;

use common::Cluster;
use raftq_client::api::PublishResponse;
use serde_json::json;

/// Publishes `n` one-record batches to `topic` on the leader, all at once, as independent
/// clients would; returns the answers.
async fn publish_concurrently(cluster: &Cluster, topic: &str, n: usize) -> Vec<PublishResponse> {
    let leader = cluster.leader_id().await;
    let url = format!("{}/v1/topics/{topic}/records", cluster.url(leader));
    let mut tasks = Vec::new();
    for i in 0..n {
        let http = cluster.http().clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let resp = http
                .post(&url)
                .json(&json!({ "records": [{ "value": format!("v{i}") }] }))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp.text().await.map_err(|e| e.to_string())?;
            if status != 200 {
                return Err(format!("publish {i}: {status}: {body}"));
            }
            serde_json::from_str::<PublishResponse>(&body).map_err(|e| format!("{e}: {body}"))
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(a) => answers.push(a),
            Err(e) => cluster.fail(&e),
        }
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_share_entries_and_get_dense_offsets() {
    let cluster = Cluster::start(3).await;
    cluster.create_topic("gc").await;
    const N: usize = 256;
    let answers = publish_concurrently(&cluster, "gc", N).await;

    let offsets: BTreeSet<u64> = answers.iter().map(|a| a.first_offset).collect();
    assert_eq!(offsets.len(), N, "every publish gets its own offset");
    assert_eq!(
        offsets.iter().copied().collect::<Vec<_>>(),
        (0..N as u64).collect::<Vec<_>>(),
        "offsets are dense"
    );
    assert!(answers
        .iter()
        .all(|a| a.first_offset == a.last_offset && !a.duplicate));

    // Each answer names the log entry that carried it. Fewer entries than publishes means
    // several client commands were committed (and fsynced) together.
    let entries: BTreeSet<u64> = answers.iter().map(|a| a.commit_point.index).collect();
    eprintln!("{N} publishes used {} entries", entries.len());
    assert!(
        entries.len() < N,
        "{N} concurrent publishes took {} Raft entries: no group commit",
        entries.len()
    );

    // And what was acknowledged is what every node serves.
    cluster.wait_converged("gc").await;
    let log = cluster.consistent_log("gc").await;
    let values: BTreeSet<String> = log
        .iter()
        .filter_map(|r| r.value_str().map(str::to_owned))
        .collect();
    assert_eq!(values.len(), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_command_per_entry_every_publish_is_an_entry_of_its_own() {
    let cluster = Cluster::start_with(3, &["--max-entry-commands", "1"]).await;
    cluster.create_topic("solo").await;
    const N: usize = 64;
    let answers = publish_concurrently(&cluster, "solo", N).await;
    let entries: BTreeSet<u64> = answers.iter().map(|a| a.commit_point.index).collect();
    assert_eq!(
        entries.len(),
        N,
        "--max-entry-commands 1: each publish has an entry of its own"
    );
    let offsets: BTreeSet<u64> = answers.iter().map(|a| a.first_offset).collect();
    assert_eq!(offsets.len(), N);
}
