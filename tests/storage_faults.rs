//! A node whose disk lost or damaged what it had fsynced must notice (DESIGN.md, "Durability":
//! never a quiet truncation), and come back by itself under its own id without a vote: a
//! learner until it holds the log again, then a voter (docs/operations.md, "When a disk lies,
//! fills up or fails"). Meanwhile the rest of the cluster serves every acknowledged record.
//! The faults:
//! - bytes flipped in the middle of its newest log segment (the frames' checksums see it);
//! - its newest log segment cut short (a clean tail that the segment alone cannot tell from a
//!   torn write: the durable watermark, or the leader's record of what it acknowledged, sees it);
//! - both, while every node was down and nobody remembers what it acknowledged;
//! - bytes flipped in the middle of a record of RocksDB's newest write-ahead log, which holds
//!   the vote and the other Raft metadata (RocksDB's checksums see it);
//! - the length of the record holding the newest vote damaged, in the write-ahead log's last
//!   block: RocksDB reads that as a write torn by a crash and opens without the records from
//!   there on, in silence; the durable watermark sees the vote it lost;
//! - bytes flipped in a data block of a table file (`.sst`), which opening the database does
//!   not read: the node reads every table file at start to find it;
//! - bytes flipped in a record file of the snapshot a follower installed from a linked
//!   transfer (log entries its own log does not hold): read whole at start too;
//! - its data directory wiped (the cluster knows it as a voter that had the log).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Cluster, Load};
use openraft::vote::RaftLeaderId as _;
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

/// RocksDB's write-ahead log is a run of 32 KiB blocks of physical records; a block's last
/// bytes, too few for a header, are padding (RocksDB's `db/log_format.h`).
const WAL_BLOCK: usize = 32 * 1024;

/// A physical record of a write-ahead log: its header (a masked CRC-32C of the type and the
/// payload: 4 bytes, the payload's length: 2, its type: 1, and for the recyclable types a log
/// number: 4) at `at`, then `len` bytes of payload.
#[derive(Debug, Clone, Copy)]
struct WalRecord {
    at: usize,
    header: usize,
    len: usize,
    kind: u8,
}

impl WalRecord {
    fn payload(self) -> std::ops::Range<usize> {
        self.at + self.header..self.at + self.header + self.len
    }

    /// A record holding a whole write batch (not a fragment of one).
    fn is_full(self) -> bool {
        matches!(self.kind, 1 | 5)
    }
}

/// The physical records of a write-ahead log, up to the first that is not whole.
fn wal_records(bytes: &[u8]) -> Vec<WalRecord> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let left_in_block = WAL_BLOCK - at % WAL_BLOCK;
        if left_in_block < 7 {
            at += left_in_block;
            continue;
        }
        let Some(h) = bytes.get(at..at + 7) else {
            break;
        };
        let (len, kind) = (u16::from_le_bytes([h[4], h[5]]) as usize, h[6]);
        // Types 5 to 8, and from 10 on the odd ones, carry the log number.
        let header = if (5..=8).contains(&kind) || (kind >= 10 && kind & 1 == 1) {
            11
        } else {
            7
        };
        if (kind == 0 && len == 0)
            || header + len > left_in_block
            || at + header + len > bytes.len()
        {
            break;
        }
        records.push(WalRecord {
            at,
            header,
            len,
            kind,
        });
        at += header + len;
    }
    records
}

/// The vote a whole record's write batch stores, if it stores one: the batch's puts are a tag,
/// the family, then the key and the value, each after its length (a varint: below 128 here).
fn vote_in(payload: &[u8]) -> Option<raftq::raft::Vote> {
    let key = raftq::store::keys::VOTE;
    let mut pattern = vec![key.len() as u8];
    pattern.extend_from_slice(key);
    let at = payload.windows(pattern.len()).position(|w| w == pattern)? + pattern.len();
    let len = *payload.get(at)? as usize;
    raftq::store::values::decode(payload.get(at + 1..at + 1 + len)?).ok()
}

/// The newest segment file of a node's Raft log, and how far its frames reach: a segment is
/// preallocated, and what follows its last frame reads as zeros.
fn newest_segment(data: &Path) -> (PathBuf, u64) {
    let (path, _) = newest(&data.join("log"), "seg");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let written = bytes.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1);
    (path, written as u64)
}

/// Flips the 8 bytes of `bytes` from `at` on.
fn flip(bytes: &mut [u8], at: usize) {
    for b in &mut bytes[at..at + 8] {
        *b ^= 0x5a;
    }
}

/// Flips a few bytes at `fraction` of the file, or cuts it there.
fn damage(file: &Path, size: u64, how: &str, fraction: f64) {
    let at = (size as f64 * fraction) as u64;
    match how {
        "flip" => {
            let mut bytes = std::fs::read(file).expect("read the file");
            flip(&mut bytes, at as usize);
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
    // The durable watermark records what the log fsynced lazily (at most 100 ms behind): wait
    // until it covers what the follower applied, so that the damage below lies under it and
    // the node's own checks, not only the leader's record of what it acknowledged, must see it.
    let applied = match c.status(follower).await {
        Ok(s) => s.last_applied,
        Err(e) => c.fail(&format!("status of node {follower}: {e}")),
    };
    let data = c.data_dir(follower);
    c.wait_for(
        &format!("node {follower}'s watermark to reach index {applied}"),
        Duration::from_secs(10),
        || async {
            match raftq::store::watermark::read(&data) {
                Ok(Some(m)) if m.log_index >= applied => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
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

/// The vote and the purge points are in RocksDB's write-ahead log (the commit index is not: it
/// has a file of its own), synced: bytes flipped in the payload of one of its records, with
/// records after it, make RocksDB refuse to open the database (the record's checksum fails,
/// and it is not a tail torn by a crash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_wal_has_flipped_bytes_rejoins_as_a_learner() {
    let (c, node, records) = cluster_with_a_stopped_follower().await;
    let (wal, size) = newest_wal(&c.data_dir(node));
    let mut bytes = std::fs::read(&wal).expect("read the write-ahead log");
    let found = wal_records(&bytes);
    // A whole record with another after it. (The log holds a few: the vote of each term and
    // what start-up writes, no longer a record per commit.)
    let Some(record) = found
        .windows(2)
        .map(|pair| pair[0])
        .find(|r| r.is_full() && r.len >= 16)
    else {
        panic!("no whole record with another after it in the {size} bytes: {found:?}");
    };
    flip(&mut bytes, record.payload().start + record.len / 2 - 4);
    std::fs::write(&wal, &bytes).expect("write the damaged file");
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    assert!(c.log(node).contains("RocksDB refuses to open it"));
}

/// A damaged length field in the write-ahead log's last block is, to RocksDB, a record torn by
/// a crash: it opens the database without that record and those after it, and says nothing.
/// What it drops there is a vote or a purge, which were synced:
/// the durable watermark holds the vote's term, and a lost purge leaves a log that starts
/// after its recorded purge point. Here the follower lost the vote of the newest term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_wal_lost_its_newest_vote_in_silence_rejoins_as_a_learner() {
    let c = Cluster::start(3).await;
    let client = c.client_with_topic("kept").await;
    // A second term: every follower saves a vote of it, synced, after the first term's.
    let first = c.leader_id().await;
    c.kill(first);
    let leader = c.leader_id().await;
    c.restart(first).await;
    let records = 20u64;
    for i in 0..records {
        if let Err(e) = client
            .publish_records(
                "kept",
                vec![raftq_client::api::RecordIn::text(format!("{i}"))],
            )
            .await
        {
            c.fail(&format!("publishing record {i}: {e}"));
        }
    }
    c.wait_converged("kept").await;
    // The follower that ran throughout: its write-ahead log holds both terms' votes.
    let node = match c.ids().into_iter().find(|id| *id != leader && *id != first) {
        Some(id) => id,
        None => c.fail("no follower that ran throughout"),
    };
    c.kill(node);
    let (wal, size) = newest_wal(&c.data_dir(node));
    let mut bytes = std::fs::read(&wal).expect("read the write-ahead log");
    let votes: Vec<(WalRecord, u64)> = wal_records(&bytes)
        .into_iter()
        .filter(|r| r.is_full())
        .filter_map(|r| Some((r, vote_in(&bytes[r.payload()])?.leader_id().term())))
        .collect();
    let newest = votes.iter().map(|(_, term)| *term).max().unwrap_or(0);
    let Some(&(record, _)) = votes.iter().find(|(_, term)| *term == newest) else {
        panic!("no vote in the {size} bytes of {}", wal.display());
    };
    assert!(
        votes.iter().any(|(_, term)| *term < newest),
        "the log holds the older term's vote too: {votes:?}"
    );
    assert_eq!(
        record.at / WAL_BLOCK,
        (bytes.len() - 1) / WAL_BLOCK,
        "the vote of term {newest} is in the log's last block"
    );
    // Longer than any block: the record runs past the end of the file.
    bytes[record.at + 4..record.at + 6].copy_from_slice(&u16::MAX.to_le_bytes());
    std::fs::write(&wal, &bytes).expect("write the damaged file");
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    let log = c.log(node);
    assert!(
        log.contains(&format!("but a vote in term {newest} was on disk before")),
        "{}",
        common::tail(&log, 30)
    );
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

/// A follower that caught up by a linked transfer keeps the log entries its records point into
/// as its snapshot's record files, which its own log does not hold. Bytes flipped in one of
/// them: the node reads every frame of them at start, so it says so and rejoins rather than
/// failing the reads that reach the damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_snapshot_record_files_have_flipped_bytes_rejoins_as_a_learner() {
    let c = Cluster::start_with(3, &["--snapshot-logs", "40", "--snapshot-keep-logs", "5"]).await;
    let client = c.client_with_topic("kept").await;
    c.wait_converged("kept").await;
    let node = c.follower_id().await;
    c.kill(node);
    let mut records = 0;
    for batch in 0..60 {
        let batch_records = (0..20)
            .map(|i| raftq_client::api::RecordIn::text(format!("{batch}-{i}-{}", "x".repeat(500))))
            .collect();
        if let Err(e) = client.publish_records("kept", batch_records).await {
            c.fail(&format!("publishing batch {batch}: {e}"));
        }
        records += 20;
    }
    c.restart_by_snapshot(node).await;
    c.wait_converged("kept").await;
    c.kill(node);
    let log = c.log(node);
    assert!(
        log.contains("received a linked snapshot"),
        "the follower did not catch up by a linked transfer:\n{}",
        common::tail(&log, 30)
    );
    // The snapshot's record files: `snapshots/NAME.log/*.seg`.
    let snapshots = c.data_dir(node).join("snapshots");
    let linked = std::fs::read_dir(&snapshots)
        .expect("the snapshot directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.is_dir() && p.extension().is_some_and(|x| x == "log"))
        .unwrap_or_else(|| panic!("no record files in {}", snapshots.display()));
    let (segment, _) = newest(&linked, "seg");
    let bytes = std::fs::read(&segment).expect("the record file");
    let written = bytes.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1) as u64;
    assert!(written > 10_000, "a record file of {written} bytes");
    damage(&segment, written, "flip", 0.5);
    c.restart(node).await;
    check_rejoined(&c, node, records, true).await;
    assert!(
        c.log(node).contains("its record files"),
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

/// A node whose disk fills up stops at once, with exit status 70 and the reason in its log: a
/// write it could not make is never acknowledged, and it does not go on serving from a store
/// that missed one. The other two keep the cluster going; once there is space again it starts
/// with the same command line and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_up_stops_then_catches_up() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let c = Cluster::start_on_fault_disks(3, &[]).await;
    let client = c.client_with_topic("kept").await;
    let node = c.follower_id().await;
    let disk = c.disk(node);
    // Setting a limit counts the space used anew.
    disk.set_space_limit(Some(u64::MAX));
    let used = disk.stats().space_used;
    disk.set_space_limit(Some(used + 256 * 1024));
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn({
        let (acked, stop) = (acked.clone(), stop.clone());
        async move {
            let mut batch = 0u64;
            while !stop.load(Ordering::SeqCst) && batch < 2_000 {
                let records = (0..16)
                    .map(|i| {
                        raftq_client::api::RecordIn::text(format!(
                            "{batch}-{i}-{}",
                            "x".repeat(2048)
                        ))
                    })
                    .collect();
                match client.publish_records("kept", records).await {
                    Ok(_) => acked.fetch_add(16, Ordering::SeqCst),
                    Err(e) => return Err(format!("batch {batch}: {e}")),
                };
                batch += 1;
            }
            Ok(())
        }
    });
    let status = c.wait_exit(node, Duration::from_secs(60)).await;
    stop.store(true, Ordering::SeqCst);
    match publisher.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => c.fail(&format!("publishing while a follower's disk filled: {e}")),
        Err(e) => c.fail(&format!("the publisher failed: {e}")),
    }
    assert!(disk.stats().enospc > 0, "the disk never said it was full");
    assert_eq!(status.code(), Some(70), "{status:?}");
    let log = c.log(node);
    for said in ["No space left on device", "stopping the node"] {
        assert!(log.contains(said), "{said:?}: {}", common::tail(&log, 30));
    }
    disk.set_space_limit(None);
    c.restart(node).await;
    c.wait_converged("kept").await;
    let acked = acked.load(Ordering::SeqCst);
    for id in c.ids() {
        let held = c.read_all(id, "kept").await.len() as u64;
        assert_eq!(
            held, acked,
            "node {id} holds {held} of the {acked} acknowledged"
        );
    }
    let digests = c.digests().await;
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
}
