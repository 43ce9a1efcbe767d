//! Linked transfers: a follower installs a leader's linked snapshot with its log entries as
//! the snapshot's record files, stores no record bytes in its state machine, reads every
//! record as the leader does, and links those files into its own later snapshots.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use openraft::impls::leader_id_adv::LeaderId as CommittedLeaderId;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::vote::RaftLeaderId;
use openraft::EntryPayload;

use super::*;
use crate::raft::{Entry, LogId};
use crate::state::{
    Batch, Command, CreateTopic, LogPayload, NewRecord, PublishBatch, TopicSettings,
};
use crate::store::log::{open_segments, LogStore};
use crate::store::{keys, open_db, records, SmShared, CF_SM};

const RECORDS_PER_ENTRY: usize = 10;
const VALUE_BYTES: usize = 1024;

/// Entry `index` of the workload: entry 1 creates topic `t`, every later one publishes
/// [`RECORDS_PER_ENTRY`] records of [`VALUE_BYTES`] as one record batch.
fn entry(index: u64) -> Entry {
    let command = match index {
        1 => Command::CreateTopic(CreateTopic {
            name: "t".into(),
            settings: TopicSettings::default(),
        }),
        _ => {
            let records: Vec<NewRecord> = (0..RECORDS_PER_ENTRY)
                .map(|n| NewRecord {
                    key: Some(format!("k{n}")),
                    headers: vec![],
                    value: vec![(index as u8).wrapping_add(n as u8); VALUE_BYTES],
                })
                .collect();
            Command::PublishBatch(PublishBatch {
                topic: "t".into(),
                batches: crate::state::encode_records(&records).into(),
                producer: None,
            })
        }
    };
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(LogPayload::V1(Batch {
            timestamp_ms: 1_000 + index,
            commands: vec![command],
        })),
    }
}

/// A node as a node runs: its Raft log in segment files and a state machine that keeps where
/// the log holds each record; it appended and applied entries 1 to `last` (none for 0).
async fn node(root: &Path, last: u64) -> (LogStore, Arc<SmShared>) {
    let db = open_db(&root.join("db")).expect("open db");
    let segments = open_segments(&db, &root.join("log"), 0).expect("open the log");
    let store = LogStore::new(db.clone(), segments).expect("log store");
    let sm = SmShared::open(db, root.join("snapshots")).expect("open the state machine");
    sm.attach_log(Arc::new(store.for_records()));
    let mut store = store;
    append_and_apply(&mut store, &sm, 1..=last).await;
    (store, sm)
}

async fn append_and_apply(
    store: &mut LogStore,
    sm: &SmShared,
    indexes: std::ops::RangeInclusive<u64>,
) {
    if indexes.is_empty() {
        return;
    }
    let last = *indexes.end();
    let entries: Vec<Entry> = indexes.map(entry).collect();
    let mut durable = store.durable();
    store
        .append(entries.clone(), IOFlushed::noop())
        .await
        .expect("append");
    durable.wait_for(|d| *d >= last).await.expect("flushed");
    sm.apply_blocking(entries).expect("apply");
}

/// Every record of topic `t` as `sm` reads it.
fn records_of(sm: &SmShared) -> Vec<(u64, crate::state::StoredRecord)> {
    let topic = sm.view().state.topics["t"].clone();
    sm.read_records(
        &topic,
        topic.first_offset..topic.next_offset,
        100_000,
        u64::MAX,
    )
    .expect("read")
}

/// The pairs of a snapshot expanded whole.
fn whole_pairs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut bytes = Vec::new();
    snapshot::write_whole(path, &mut bytes).expect("expand");
    let mut pairs = Vec::new();
    snapshot::read(&bytes[..], |k, v| {
        pairs.push((k, v));
        Ok(())
    })
    .expect("read back");
    pairs
}

/// `bytes` in a file of their own, as a follower receives a transfer.
fn received(dir: &Path, bytes: &[u8]) -> File {
    let path = dir.join("received");
    let mut file = File::create(&path).expect("create");
    file.write_all(bytes).expect("write");
    File::options()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open")
}

/// A follower whose log lacks everything installs a leader's linked transfer: its state
/// machine keeps only where each record is (in the snapshot's record files, not its log),
/// every record and the digest read as the leader's, and the snapshot expands to what the
/// leader's does. Its own next snapshot, after entries of its own log, links the received
/// files and its log's, and expands to exactly what a node storing every record whole builds.
#[tokio::test]
async fn a_follower_installs_a_linked_transfer_and_links_its_files_in_turn() {
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let (_leader_log, leader) = node(leader_dir.path(), 41).await;
    let (meta, path) = leader.build_blocking().expect("build");
    let mut bytes = Vec::new();
    let (sent, written) = write(&path, &mut bytes).expect("a linked transfer");
    assert_eq!((sent, written), (meta.clone(), bytes.len() as u64));
    let record_bytes = (40 * RECORDS_PER_ENTRY * VALUE_BYTES) as u64;
    assert!(
        written < record_bytes + record_bytes / 10,
        "{written} bytes sent"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let (mut follower_log, follower) = node(dir.path(), 0).await;
    let mut src = received(dir.path(), &bytes);
    assert!(is_transfer(&mut src).expect("read"));
    follower
        .install_blocking(&mut src, &meta.raft_meta())
        .expect("install");

    // No record's bytes in the state machine: each is where the received files hold it.
    let db = open_db_of(&follower);
    let cf = db.cf_handle(CF_SM).expect("sm cf");
    let topic = follower.view().state.topics["t"].clone();
    let formats: Vec<u8> = db
        .iterator_cf(
            cf,
            rocksdb::IteratorMode::From(&keys::record(topic.id, 0), rocksdb::Direction::Forward),
        )
        .map(|item| item.expect("read"))
        .map_while(|(k, v)| keys::parse_record(&k).map(|_| v[0]))
        .collect();
    assert!(!formats.is_empty());
    assert!(
        formats.iter().all(|f| *f == records::RECORD_RUN_FORMAT),
        "{formats:?}"
    );
    let installed = snapshot::newest(&dir.path().join("snapshots"))
        .expect("newest")
        .expect("the installed snapshot");
    assert!(snapshot::linked_dir(&installed.1).is_dir());
    assert_eq!(records_of(&follower), records_of(&leader));
    assert_eq!(follower.digest(), leader.digest());
    assert!(whole_pairs(&installed.1) == whole_pairs(&path));

    // The follower goes on from its own log, then snapshots.
    append_and_apply(&mut follower_log, &follower, 42..=45).await;
    let (own, own_path) = follower
        .build_blocking()
        .expect("the follower's own snapshot");
    assert_eq!(own.last_log_id.map(|l| l.index), Some(45));
    let (_, trailer) = snapshot::verify_file(&own_path).expect("verify");
    assert_eq!(trailer.linked, Some((2, 45)));
    // What a node that stores every record whole builds from the same entries.
    let whole_dir = tempfile::tempdir().expect("tempdir");
    let whole = SmShared::open(
        open_db(&whole_dir.path().join("db")).expect("open db"),
        whole_dir.path().join("snapshots"),
    )
    .expect("open");
    whole
        .apply_blocking((1..=45).map(entry).collect())
        .expect("apply");
    let (_, whole_path) = whole.build_blocking().expect("build");
    let mut want = Vec::new();
    snapshot::read(File::open(&whole_path).expect("open"), |k, v| {
        want.push((k, v));
        Ok(())
    })
    .expect("read");
    assert!(
        whole_pairs(&own_path) == want,
        "the follower's snapshot differs"
    );
    // The installed snapshot is gone; its records are read through the new one's files.
    assert!(!installed.1.exists());
    assert_eq!(records_of(&follower), records_of(&whole));
}

fn open_db_of(sm: &SmShared) -> Arc<rocksdb::DB> {
    sm.db_handle()
}

/// A transfer that is damaged, cut short, or not the snapshot announced is refused whole: no
/// snapshot gets a final name, and nothing is left behind that start-up would take.
#[tokio::test]
async fn a_damaged_or_cut_transfer_is_refused_and_leaves_no_snapshot() {
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let (_log, leader) = node(leader_dir.path(), 11).await;
    let (meta, path) = leader.build_blocking().expect("build");
    let mut bytes = Vec::new();
    write(&path, &mut bytes).expect("a linked transfer");

    let mut flipped = bytes.clone();
    let at = bytes.len() - 600; // inside the last entry's record values
    flipped[at] ^= 0x01;
    let cut = bytes[..bytes.len() - 9].to_vec();
    let mut other = meta.raft_meta();
    other.last_log_id = Some(LogId::new(CommittedLeaderId::new(1, 1), 10));
    let cases: Vec<(&str, Vec<u8>, crate::raft::SnapshotMeta, &str)> = vec![
        ("flipped", flipped, meta.raft_meta(), "checksum mismatch"),
        ("cut", cut, meta.raft_meta(), "I/O"),
        ("not announced", bytes.clone(), other, "was announced"),
    ];
    for (what, bytes, want, says) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let snapshots = dir.path().join("snapshots");
        let mut src = received(dir.path(), &bytes);
        let err = store_received(&mut src, &snapshots, &want).expect_err(what);
        assert!(err.to_string().contains(says), "{what}: {err}");
        assert!(
            snapshot::newest(&snapshots).expect("newest").is_none(),
            "{what}: a snapshot was kept"
        );
        let left: Vec<_> = fs::read_dir(&snapshots)
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert!(left.is_empty(), "{what}: {left:?}");
    }
}

/// A crash at each step of receiving and installing a linked transfer: the node restarts with
/// its old state or exactly the leader's, reads every record of it, and installs the transfer
/// again.
#[tokio::test]
async fn a_crash_at_each_step_of_a_linked_install_leaves_a_consistent_node() {
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let (_log, leader) = node(leader_dir.path(), 9).await;
    let (meta, path) = leader.build_blocking().expect("build");
    let mut bytes = Vec::new();
    write(&path, &mut bytes).expect("a linked transfer");
    let leader_records = records_of(&leader);

    for point in faults::INSTALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, follower) = node(dir.path(), 3).await;
        follower.set_load_batch_bytes(64);
        let old = records_of(&follower);
        {
            let _armed = faults::arm(point);
            let mut src = received(dir.path(), &bytes);
            assert!(
                follower
                    .install_blocking(&mut src, &meta.raft_meta())
                    .is_err(),
                "{point} did not fail"
            );
        }
        drop(follower);
        drop(log);
        let (_log, reopened) = node(dir.path(), 0).await;
        let durable = !matches!(point, faults::RECEIVE_WRITTEN | faults::RECEIVE_SYNCED);
        match durable {
            true => assert_eq!(records_of(&reopened), leader_records, "{point}"),
            false => assert_eq!(records_of(&reopened), old, "{point}"),
        }
        let mut src = received(dir.path(), &bytes);
        reopened
            .install_blocking(&mut src, &meta.raft_meta())
            .expect("install after the restart");
        assert_eq!(records_of(&reopened), leader_records, "{point}");
    }
}

/// The same transfer installed again (sent twice) keeps the record files stored the first
/// time, which the current snapshot reads from, instead of removing and writing them again.
#[tokio::test]
async fn a_transfer_installed_twice_keeps_its_record_files() {
    use std::os::unix::fs::MetadataExt;
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let (_log, leader) = node(leader_dir.path(), 9).await;
    let (meta, path) = leader.build_blocking().expect("build");
    let mut bytes = Vec::new();
    write(&path, &mut bytes).expect("a linked transfer");

    let dir = tempfile::tempdir().expect("tempdir");
    let (_follower_log, follower) = node(dir.path(), 0).await;
    let install = || {
        let mut src = received(dir.path(), &bytes);
        follower
            .install_blocking(&mut src, &meta.raft_meta())
            .expect("install");
    };
    let record_files = || -> Vec<std::path::PathBuf> {
        let (_, path) = snapshot::newest(&dir.path().join("snapshots"))
            .expect("newest")
            .expect("installed");
        fs::read_dir(snapshot::linked_dir(&path))
            .expect("record files")
            .map(|e| e.expect("entry").path())
            .collect()
    };
    install();
    // A second name for each record file: a file written anew would not have it.
    let aside = tempfile::tempdir().expect("tempdir");
    let files = record_files();
    assert!(!files.is_empty());
    for (n, file) in files.iter().enumerate() {
        fs::hard_link(file, aside.path().join(n.to_string())).expect("link aside");
    }
    install();
    for file in record_files() {
        let links = fs::metadata(&file).expect("metadata").nlink();
        assert_eq!(links, 2, "{} was written again", file.display());
    }
    assert_eq!(records_of(&follower), records_of(&leader));
}
