//! A node whose disk lost or damaged what it had fsynced must notice (DESIGN.md, "Durability":
//! never a quiet truncation), and come back by itself under its own id without a vote: a
//! learner until it holds the log again, then a voter (docs/operations.md, "When a disk lies,
//! fills up or fails"). Meanwhile the rest of the cluster serves every acknowledged record.
//! The faults:
//! - bytes flipped in the middle of its newest log segment (the frames' checksums see it);
//! - its newest log segment cut short (a clean tail that the segment alone cannot tell from a
//!   torn write: the durable watermark, or the leader's record of what it acknowledged, sees it);
//! - both, while every node was down and nobody remembers what it acknowledged;
//! - bytes flipped in the middle of RocksDB's newest write-ahead log, which holds the vote and
//!   the other Raft metadata (RocksDB's checksums see it);
//! - bytes flipped in a data block of a table file (`.sst`), which opening the database does
//!   not read: the node reads every table file at start to find it;
//! - its data directory wiped (the cluster knows it as a voter that had the log).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Cluster, Load};
use raftq_client::api::ClusterStatus;

/// The newest file `NNN.<extension>` in `dir` (by its number), and its size.
fn newest(dir: &Path, extension: &str) -> (PathBuf, u64) {
    let suffix = format!(".{extension}");
    let mut files: Vec<(u64, PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter_map(|e| {
            let path = e.path();
            let name = path.file_name()?.to_str()?.to_string();
            let number: u64 = name.strip_suffix(&suffix)?.parse().ok()?;
            let size = e.metadata().ok()?.len();
            Some((number, path, size))
        })
        .collect();
    files.sort();
    let (_, path, size) = files
        .pop()
        .unwrap_or_else(|| panic!("no {suffix} file in {}", dir.display()));
    (path, size)
}

/// The newest write-ahead log file of a node's RocksDB, and its size.
fn newest_wal(data: &Path) -> (PathBuf, u64) {
    newest(&data.join("db"), "log")
}

/// The newest segment file of a node's Raft log, and its size.
fn newest_segment(data: &Path) -> (PathBuf, u64) {
    newest(&data.join("log"), "seg")
}

/// Flips a few bytes at `fraction` of the file, or cuts it there.
fn damage(file: &Path, size: u64, how: &str, fraction: f64) {
    let at = (size as f64 * fraction) as u64;
    match how {
        "flip" => {
            let mut bytes = std::fs::read(file).expect("read the file");
            for b in &mut bytes[at as usize..at as usize + 8] {
                *b ^= 0x5a;
            }
            std::fs::write(file, &bytes).expect("write the damaged file");
        }
        "cut" => std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .and_then(|f| f.set_len(at))
            .expect("truncate the file"),
        other => panic!("unknown damage {other}"),
    }
}

/// The largest table file of a node's RocksDB, and its size.
fn largest_table(data: &Path) -> (PathBuf, u64) {
    let db = data.join("db");
    std::fs::read_dir(&db)
        .unwrap_or_else(|e| panic!("listing {}: {e}", db.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "sst"))
        .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
        .max()
        .map(|(size, path)| (path, size))
        .unwrap_or_else(|| panic!("no table file in {}", db.display()))
}

/// A cluster with 400 acknowledged records in topic `kept`, every node caught up, and one
/// follower SIGKILLed.
async fn cluster_with_a_stopped_follower() -> (Cluster, u64, u64) {
    stopped_follower_of(Cluster::start(3).await, 0).await
}

/// The same, on `c`, with `large` more records of 2 KiB each published after the first 400.
async fn stopped_follower_of(c: Cluster, large: u64) -> (Cluster, u64, u64) {
    let client = c.client_with_topic("kept").await;
    let histories = Load::start(&client, "kept", 2, 200)
        .finish(&c, Duration::from_secs(60))
        .await;
    let acked: usize = histories.iter().map(|h| h.acked.len()).sum();
    assert_eq!(
        acked, 400,
        "every publish is acknowledged on a healthy cluster"
    );
    for batch in 0..large / 4 {
        let records = (0..4)
            .map(|i| raftq_client::api::RecordIn::text(format!("{batch}-{i}-{}", "x".repeat(2048))))
            .collect();
        if let Err(e) = client.publish_records("kept", records).await {
            c.fail(&format!("publishing batch {batch}: {e}"));
        }
    }
    c.wait_converged("kept").await;
    let follower = c.follower_id().await;
    c.kill(follower);
    (c, follower, acked as u64 + large / 4 * 4)
}

/// Whether `node` is a voter, as the leader says.
async fn is_voter(c: &Cluster, node: u64) -> Result<bool, String> {
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let s: ClusterStatus = c.status(leader).await?;
    s.member(node)
        .map(|m| m.voter)
        .ok_or_else(|| format!("node {node} is not a member: {s:?}"))
}

/// The damaged node noticed, came back as a learner, caught up and votes again; it and the
/// others hold every record and the same state; its damaged store is kept.
async fn check_rejoined(c: &Cluster, node: u64, records: u64, damaged_kept: bool) {
    c.wait_for(
        &format!("node {node} to be a voter again"),
        Duration::from_secs(60),
        || async {
            match is_voter(c, node).await? {
                true => Ok(()),
                false => Err(format!("node {node} is still a learner")),
            }
        },
    )
    .await;
    let log = c.log_since_last_start(node);
    assert!(log.contains("is damaged"), "{}", common::tail(&log, 30));
    assert!(
        log.contains("the leader made this node a learner"),
        "{}",
        common::tail(&log, 30)
    );
    let leader = c.leader_id().await;
    assert!(
        c.log(leader)
            .contains("is a learner until it has caught up"),
        "the leader did not demote node {node}"
    );
    // Everything is there, through the rejoined node too, and the states are equal.
    c.client()
        .publish_records("kept", vec![raftq_client::api::RecordIn::text("after")])
        .await
        .unwrap_or_else(|e| c.fail(&format!("publishing after the rejoin: {e}")));
    c.wait_converged("kept").await;
    for id in c.ids() {
        let records_here = c.read_all(id, "kept").await.len() as u64;
        assert_eq!(records_here, records + 1, "node {id} holds {records_here}");
    }
    let digests = c.digests().await;
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let data = c.data_dir(node);
    let kept = std::fs::read_dir(&data)
        .expect("data dir")
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("damaged-"));
    let marker = data.join(raftq::rejoin::MARKER);
    c.wait_for(
        "the rejoin marker to go",
        Duration::from_secs(10),
        || async {
            if marker.exists() {
                Err("still there".to_string())
            } else {
                Ok(())
            }
        },
    )
    .await;
    assert_eq!(
        kept, damaged_kept,
        "a damaged store is kept aside for inspection (none when there was nothing)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_segment_has_flipped_bytes_rejoins_as_a_learner() {
    let (c, node, records) = cluster_with_a_stopped_follower().await;
    let (segment, size) = newest_segment(&c.data_dir(node));
    assert!(size > 10_000, "a log segment of {size} bytes");
    // At a tenth of the file: entries after it were fsynced and acknowledged.
    damage(&segment, size, "flip", 0.1);
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    assert!(c.log(node).contains("its Raft log fails its checks"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_log_segment_was_cut_short_rejoins_as_a_learner() {
    let (c, node, records) = cluster_with_a_stopped_follower().await;
    let (segment, size) = newest_segment(&c.data_dir(node));
    // What follows the cut looks like a tail never written, or a frame torn in the middle.
    damage(&segment, size, "cut", 0.5);
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    let log = c.log(node);
    assert!(
        log.contains("but reached")
            || log.contains("had acknowledged")
            || log.contains("its Raft log fails its checks"),
        "the node names what was lost: {}",
        common::tail(&log, 30)
    );
}

/// The vote and the other Raft metadata are in RocksDB's write-ahead log: bytes flipped in its
/// middle make RocksDB refuse to open the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_wal_has_flipped_bytes_rejoins_as_a_learner() {
    let (c, node, records) = cluster_with_a_stopped_follower().await;
    let (wal, size) = newest_wal(&c.data_dir(node));
    assert!(size > 2_000, "a write-ahead log of {size} bytes");
    damage(&wal, size, "flip", 0.1);
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    assert!(c.log(node).contains("RocksDB refuses to open it"));
}

/// A flipped byte in a table file's data block: RocksDB opens the database without reading
/// that block, so only the node's full read of its table files at start finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_table_file_has_flipped_bytes_rejoins_as_a_learner() {
    // Memtables of 64 KiB, so that 1,400 records make table files. A published record's bytes
    // are in the log; the state machine's tables hold where each is, some 50 bytes a record.
    let c = Cluster::start_with(3, &["--write-buffer-bytes", "65536"]).await;
    let (c, node, records) = stopped_follower_of(c, 1_000).await;
    let (table, size) = largest_table(&c.data_dir(node));
    assert!(size > 10_000, "a table file of {size} bytes");
    // A third of the way in: a data block (the index and the footer are at the end).
    damage(&table, size, "flip", 0.3);
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    assert!(
        c.log(node).contains("a table file fails its checks"),
        "{}",
        common::tail(&c.log(node), 30)
    );
}

/// The bad day: every node down at once, one node's newest log segment damaged, and that
/// node started first, while no leader remembers what it acknowledged. Only what the node
/// itself recorded (the frames' checksums, the durable watermark) can tell; it must not vote,
/// so it waits for the others, and then rejoins through their leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_damaged_while_every_node_was_down_waits_then_rejoins() {
    for how in ["flip", "cut"] {
        let (c, node, records) = cluster_with_a_stopped_follower().await;
        c.kill_all();
        let (segment, size) = newest_segment(&c.data_dir(node));
        damage(&segment, size, how, 0.3);
        c.start_node(node);
        c.wait_for(
            &format!("node {node} to notice the damage ({how})"),
            Duration::from_secs(20),
            || async {
                let log = c.log_since_last_start(node);
                if log.contains("waiting for a leader to make this node a learner") {
                    Ok(())
                } else {
                    Err(common::tail(&log, 5))
                }
            },
        )
        .await;
        // Meanwhile it takes part in nothing: no vote, no append, no client request.
        let vote = c
            .http()
            .post(format!("{}/raft/vote", c.url(node)))
            .header(common::SECRET_HEADER, common::SECRET)
            .send()
            .await;
        assert!(vote.is_err(), "a node waiting to rejoin answered: {vote:?}");
        for id in c.ids().into_iter().filter(|id| *id != node) {
            c.restart(id).await;
        }
        check_rejoined(&c, node, records, true).await;
    }
}

/// A voter whose data directory was wiped (a pod on a new volume) and that restarts under its
/// own id rejoins the same way, catching up by snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_rejoins_as_a_learner_then_votes_again() {
    let (c, node, records) = cluster_with_a_stopped_follower().await;
    std::fs::remove_dir_all(c.data_dir(node)).expect("wipe the data directory");
    c.restart(node).await;
    check_rejoined(&c, node, records, false).await;
    assert!(c.log(node).contains("it is empty, but node"));
}
