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
