//! Power loss (DESIGN.md, "Durability"). A SIGKILL keeps the kernel's page cache, so it cannot
//! tell "fsync before acknowledging" from "acknowledge before fsync". Here every node's data
//! directory is a fault disk, a file system of our own that loses every write not fsynced when
//! told, as a power loss does; the process is killed at the same moment.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cluster, Load};
use raftq_client::api::{RecordIn, TopicConfig};

/// Publishes `per_task` records from each of two tasks; all must be acknowledged.
async fn publish(c: &Cluster, topic: &str, per_task: usize) -> BTreeSet<String> {
    let histories = Load::start(&c.client(), topic, 2, per_task)
        .finish(c, Duration::from_secs(60))
        .await;
    let acked: BTreeSet<String> = histories
        .iter()
        .flat_map(|h| h.acked.iter().map(|(v, _)| v.clone()))
        .collect();
    let refused: Vec<_> = histories.iter().flat_map(|h| &h.refused).collect();
    assert!(refused.is_empty(), "refused publishes: {refused:?}");
    acked
}

/// Every acknowledged value is in the topic, read through every node, and every node holds the
/// same records at the same offsets and the same state.
async fn check_identical(c: &Cluster, topic: &str, acked: &BTreeSet<String>) {
    c.wait_converged(topic).await;
    let mut logs = Vec::new();
    for id in c.ids() {
        let values: Vec<String> = c
            .read_all(id, topic)
            .await
            .into_iter()
            .map(|r| r.value_str().unwrap_or_default().to_string())
            .collect();
        let missing: Vec<&String> = acked
            .iter()
            .filter(|v| !values.contains(v))
            .take(5)
            .collect();
        assert!(
            missing.is_empty(),
            "node {id} lacks acknowledged records, e.g. {missing:?}"
        );
        logs.push((id, values));
    }
    for (id, values) in &logs[1..] {
        assert_eq!(
            values, &logs[0].1,
            "node {id} and node {} hold different records",
            logs[0].0
        );
    }
    let digests = c.digests().await;
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "the nodes' states differ: {digests:?}"
    );
}

/// Node `id`'s last log index, from its Raft status.
async fn last_log_index(c: &Cluster, id: u64) -> u64 {
    let status = c.raft_status(id).await.unwrap_or_else(|e| c.fail(&e));
    status["last_log_index"].as_u64().unwrap_or(0)
}

/// DESIGN.md: "a restarted leader never resumes its term without an election, even if it lost
/// unsynced entries". The leader replicates an entry before its own fsync, so its followers can
/// commit entries (and the client hear 2xx) that its disk never got. Here its fsyncs are slow
/// (each stalls 300 ms while the followers' take a moment); it loses power in the middle of
/// one, under load, so it loses a tail the followers committed; and it is back within the
/// election timeout. Were it to resume leading its term (openraft's leader restore), it would
/// write new entries under the log ids of committed ones and the replicas would diverge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_back_at_once_after_losing_its_unsynced_tail_reuses_no_log_id() {
    const ATTEMPTS: usize = 5;
    for attempt in 1..=ATTEMPTS {
        let c = Cluster::start_on_fault_disks(3, &[]).await;
        let topic = "powered";
        if let Err(e) = c
            .client()
            .create_topic(topic, &TopicConfig::default())
            .await
        {
            c.fail(&format!("creating {topic}: {e}"));
        }
        let mut acked = publish(&c, topic, 20).await;
        c.wait_converged(topic).await;

        let leader = c.leader_id().await;
        let disk = c.disk(leader);
        disk.set_fsync_delay(Some(Duration::from_millis(300)));
        let load = Load::start(&c.client(), topic, 4, 100_000);
        common::wait_acks(&c, &load, 200, Duration::from_secs(60)).await;
        let mut followers_log = 0;
        for id in c.ids().into_iter().filter(|id| *id != leader) {
            followers_log = followers_log.max(last_log_index(&c, id).await);
        }
        // Power loss on the leader, in the middle of a stalled fsync, and back at once.
        c.kill(leader);
        let dropped = disk
            .drop_unsynced()
            .unwrap_or_else(|e| c.fail(&format!("dropping the leader's unsynced writes: {e}")));
        disk.set_fsync_delay(None);
        c.restart(leader).await;
        let restarted_log = last_log_index(&c, leader).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        load.stop();
        let histories = load.finish(&c, Duration::from_secs(60)).await;
        acked.extend(
            histories
                .iter()
                .flat_map(|h| h.acked.iter().map(|(v, _)| v.clone())),
        );
        // The scenario needs a leader that lost entries its followers had: when it did not
        // (the kill fell between a fsync and the next write), try again.
        if dropped.bytes == 0 || restarted_log >= followers_log {
            eprintln!(
                "attempt {attempt}: the leader lost nothing the followers had (dropped \
                 {dropped:?}, log {restarted_log} after the restart, followers at \
                 {followers_log}); again"
            );
            continue;
        }
        eprintln!(
            "attempt {attempt}: the leader came back with its log at {restarted_log}, its \
             followers had {followers_log}"
        );
        acked.extend(publish(&c, topic, 50).await);
        check_identical(&c, topic, &acked).await;
        return;
    }
    panic!("in {ATTEMPTS} attempts the leader never lost a tail its followers had");
}

/// DESIGN.md, "Snapshots": a follower answers a snapshot install only once what it installed
/// is on its disk, since the leader then counts the snapshot's entries as the follower's. Here
/// a follower misses a stretch of log the leader purges, catches up by a linked transfer (the
/// snapshot file and the log entries its records point into), and loses power the moment it
/// has; the others are stopped, so nothing can send it again what it lost. Alone, it must
/// still hold the snapshot and serve every acknowledged record from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_losing_power_right_after_a_snapshot_install_keeps_what_it_installed() {
    let c =
        Cluster::start_on_fault_disks(3, &["--snapshot-logs", "40", "--snapshot-keep-logs", "5"])
            .await;
    let topic = "installed";
    if let Err(e) = c
        .client()
        .create_topic(topic, &TopicConfig::default())
        .await
    {
        c.fail(&format!("creating {topic}: {e}"));
    }
    c.wait_converged(topic).await;
    let follower = c.follower_id().await;
    c.kill(follower);

    // Records the follower never saw, in about 60 entries: past two automatic snapshots.
    let client = c.client();
    let mut acked = BTreeSet::new();
    for batch in 0..60 {
        let values: Vec<String> = (0..50)
            .map(|i| format!("r{batch:03}-{i:02}-{}", "x".repeat(200)))
            .collect();
        let records = values.iter().cloned().map(RecordIn::text).collect();
        if let Err(e) = client.publish_records(topic, records).await {
            c.fail(&format!("publishing batch {batch}: {e}"));
        }
        acked.extend(values);
    }
    // A snapshot covering every record, and the log behind it purged: the follower can only
    // come back by that snapshot.
    let taken = c.restart_by_snapshot(follower).await;
    // Power loss of the follower at once, and the others stopped (their page caches kept:
    // they are not what is tested) so that none can send it the snapshot again.
    c.kill_all();
    let dropped = c
        .disk(follower)
        .drop_unsynced()
        .unwrap_or_else(|e| c.fail(&format!("dropping the follower's unsynced writes: {e}")));
    let log = c.log_since_last_start(follower);
    assert!(
        log.contains("received a linked snapshot"),
        "the follower did not catch up by a linked transfer:\n{}",
        common::tail(&log, 30)
    );
    eprintln!("the follower lost {dropped:?} of unsynced writes");

    c.restart(follower).await;
    let status = c.status(follower).await.unwrap_or_else(|e| c.fail(&e));
    let snapshot = status.snapshot.unwrap_or_else(|| {
        c.fail(&format!(
            "the follower came back without a snapshot: {status:?}"
        ))
    });
    assert!(
        snapshot.index >= taken.snapshot.index && status.last_applied >= taken.snapshot.index,
        "the follower came back with snapshot {snapshot:?} and applied {}, having installed \
         one at {}",
        status.last_applied,
        taken.snapshot.index
    );
    let values: BTreeSet<String> = c
        .read_all(follower, topic)
        .await
        .into_iter()
        .map(|r| r.value_str().unwrap_or_default().to_string())
        .collect();
    let missing: Vec<&String> = acked.difference(&values).take(5).collect();
    assert!(
        missing.is_empty() && values.len() == acked.len(),
        "alone after the power loss, the follower holds {} of {} acknowledged records; \
         missing e.g. {missing:?}",
        values.len(),
        acked.len()
    );
}

/// The purged segments node `id`'s log keeps for reuse.
fn spares(c: &Cluster, id: u64) -> usize {
    c.log_files(id, ".spare")
}

/// Batch `batch` of publisher `task`: 16 unique values of 800 to 1,600 bytes.
fn kept_batch(task: usize, batch: usize) -> Vec<String> {
    (0..16)
        .map(|i| {
            let len = 800 + (batch * 131 + i * 53) % 800;
            format!("t{task}-{batch:05}-{i:02}-{}", "k".repeat(len))
        })
        .collect()
}

/// DESIGN.md, "Durability", with the log reusing its files (ARCHITECTURE.md, "The Raft log in
/// segment files"): a purged segment's file is renamed a spare and the next segment starts in
/// it, its older frames still on disk beyond the new ones. Here every node's log runs in 64
/// KiB segments. Small entries of a topic whose retention lets them go fill segments to their
/// end, and snapshots purge them, until every node keeps spares. Then entries of 14 to 26 KiB
/// of a second topic go into those files, so that each segment's new frames end well before
/// its older ones did; and power is lost on every node at once, once every node has finished
/// a segment in a reused file and is appending to another. Every acknowledged record must be
/// on every node after the restart, no node may find its store damaged, and the nodes must
/// agree: no older frame of a reused file may pass for an entry, nor make an open refuse a log
/// whose synced entries are whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_on_logs_that_reuse_their_files_keeps_every_acknowledged_record() {
    // About 430 entries of the first topic fill a segment.
    const CHURN_ENTRIES: u64 = 3_000;
    const SPARES: usize = 4;
    let c = Cluster::start_on_fault_disks(
        3,
        &[
            "--segment-bytes",
            "65536",
            // Snapshots only when asked: a purge after many segments frees many at once.
            "--snapshot-logs",
            "1000000",
            "--snapshot-keep-logs",
            "5",
        ],
    )
    .await;
    let client = c.client();
    let churn = TopicConfig {
        retention: raftq_client::api::Retention {
            max_records: Some(20),
            ..Default::default()
        },
        ..Default::default()
    };
    for (topic, config) in [("churn", churn), ("kept", TopicConfig::default())] {
        if let Err(e) = client.create_topic(topic, &config).await {
            c.fail(&format!("creating {topic}: {e}"));
        }
    }
    let churning = Load::start(&client, "churn", 4, 1_000_000);
    let ids = c.ids();
    c.wait_for(
        "the logs to span several segments",
        Duration::from_secs(120),
        || async {
            for id in &ids {
                let last = last_log_index(&c, *id).await;
                if last < CHURN_ENTRIES {
                    return Err(format!("node {id}'s log ends at {last}"));
                }
            }
            Ok(())
        },
    )
    .await;
    churning.stop();
    churning.finish(&c, Duration::from_secs(60)).await;
    for id in c.ids() {
        let resp = c
            .call(reqwest::Method::POST, id, "/v1/cluster/snapshot")
            .await;
        assert_eq!(resp.status(), 200, "a snapshot on node {id}");
        c.wait_purged(id, CHURN_ENTRIES - 100).await;
    }
    let before: Vec<usize> = c.ids().into_iter().map(|id| spares(&c, id)).collect();
    eprintln!("spares on each node: {before:?}");
    assert!(
        before.iter().all(|n| *n >= SPARES),
        "the purges left {before:?} spares"
    );

    // Batches of 14 to 26 KiB, one at a time, until every node has started two segments in
    // spares, and has spares left (so the segments started since are all in reused files).
    // Then two publishers, and power loss on every node once both have been answered: their
    // next batches are being appended.
    let mut acked = BTreeSet::new();
    let mut batch = 0;
    loop {
        let counts: Vec<usize> = c.ids().into_iter().map(|id| spares(&c, id)).collect();
        assert!(
            counts.iter().all(|n| *n >= 1),
            "spares {counts:?} ({before:?} before): the publishing rolled past them"
        );
        if counts.iter().zip(&before).all(|(now, was)| now + 2 <= *was) {
            eprintln!("after {batch} batches, spares on each node: {counts:?}");
            break;
        }
        assert!(batch < 200, "after {batch} batches, spares {counts:?}");
        let values = kept_batch(0, batch);
        let records = values.iter().cloned().map(RecordIn::text).collect();
        if let Err(e) = client.publish_records("kept", records).await {
            c.fail(&format!("publishing batch {batch}: {e}"));
        }
        acked.extend(values);
        batch += 1;
    }
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let publishers: Vec<_> = (1..=2)
        .map(|task| {
            let (client, answered) = (client.clone(), answered.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for batch in 0.. {
                    let values = kept_batch(task, batch);
                    let records = values.iter().cloned().map(RecordIn::text).collect();
                    let result = client.publish_records("kept", records).await;
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    match result {
                        Ok(_) => acked.extend(values),
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect();
    let seen = answered.clone();
    c.wait_for(
        "the publishers' first answers",
        Duration::from_secs(60),
        || {
            let n = seen.load(std::sync::atomic::Ordering::SeqCst);
            async move {
                if n >= 2 {
                    Ok(())
                } else {
                    Err(format!("{n} answered"))
                }
            }
        },
    )
    .await;
    c.kill_all();
    for id in c.ids() {
        let dropped = c
            .disk(id)
            .drop_unsynced()
            .unwrap_or_else(|e| c.fail(&format!("dropping node {id}'s unsynced writes: {e}")));
        eprintln!("node {id} lost {dropped:?} of unsynced writes");
    }
    for publisher in publishers {
        match tokio::time::timeout(Duration::from_secs(60), publisher).await {
            Ok(Ok(values)) => acked.extend(values),
            other => c.fail(&format!("a publisher did not finish: {other:?}")),
        }
    }
    for id in c.ids() {
        c.restart(id).await;
    }
    for id in c.ids() {
        let log = c.log_since_last_start(id);
        assert!(
            !log.contains("is damaged"),
            "node {id} found its store damaged after the power loss:\n{}",
            common::tail(&log, 30)
        );
    }
    eprintln!("{} records acknowledged before the power loss", acked.len());
    assert!(!acked.is_empty(), "no record was acknowledged");
    acked.extend(publish(&c, "kept", 20).await);
    check_identical(&c, "kept", &acked).await;
}
