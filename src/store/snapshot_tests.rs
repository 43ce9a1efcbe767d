use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use openraft::impls::leader_id_adv::LeaderId as CommittedLeaderId;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::vote::RaftLeaderId;
use openraft::EntryPayload;

use super::*;
use crate::raft::Entry;
use crate::state::{Batch, Command, CreateTopic, LogPayload, NewRecord, Publish, TopicSettings};
use crate::store::log::{open_segments, LogStore};
use crate::store::{open_db, SmShared};

const RECORDS_PER_ENTRY: usize = 10;
const VALUE_BYTES: usize = 1024;

/// Entry 1 creates topic `t`; every later one publishes [`RECORDS_PER_ENTRY`] records of
/// [`VALUE_BYTES`].
fn entries(last: u64) -> Vec<Entry> {
    (1..=last)
        .map(|index| {
            let command = match index {
                1 => Command::CreateTopic(CreateTopic {
                    name: "t".into(),
                    settings: TopicSettings::default(),
                }),
                _ => Command::Publish(Publish {
                    topic: "t".into(),
                    records: (0..RECORDS_PER_ENTRY)
                        .map(|n| NewRecord {
                            key: Some(format!("k{n}")),
                            headers: vec![],
                            value: vec![(index as u8).wrapping_add(n as u8); VALUE_BYTES],
                        })
                        .collect(),
                    producer: None,
                }),
            };
            Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(LogPayload::V1(Batch {
                    timestamp_ms: 1_000 + index,
                    commands: vec![command],
                })),
            }
        })
        .collect()
}

/// A node as a node runs: its Raft log in segment files, and a state machine that keeps
/// where the log holds each record. It appended and applied `entries(last)`.
async fn logged_node(root: &Path, last: u64) -> (LogStore, Arc<SmShared>) {
    let db = open_db(&root.join("db")).expect("open db");
    let segments = open_segments(&db, &root.join("log"), 0).expect("open the log");
    let mut store = LogStore::new(db.clone(), segments).expect("log store");
    let sm = SmShared::open(db, root.join("snapshots")).expect("open the state machine");
    sm.attach_log(Arc::new(store.for_records()));
    let entries = entries(last);
    let mut durable = store.durable();
    store
        .append(entries.clone(), IOFlushed::noop())
        .await
        .expect("append");
    durable.wait_for(|d| *d >= last).await.expect("flushed");
    sm.apply_blocking(entries).expect("apply");
    (store, sm)
}

/// The pairs of a whole snapshot.
fn pairs_of(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs = Vec::new();
    let (_, trailer) = read_file(bytes, |k, v| {
        pairs.push((k, v));
        Ok(())
    })
    .expect("a whole snapshot reads back");
    assert_eq!(trailer.version, FORMAT_VERSION);
    assert_eq!(trailer.linked, None);
    pairs
}

fn inodes(dir: &Path) -> BTreeSet<u64> {
    fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").metadata().expect("metadata").ino())
        .collect()
}

/// A node's snapshot writes no record bytes: its file holds the small state and where each
/// record is, and the log's own segment files are linked beside it (the same files, not
/// copies). Sent or backed up, it reads whole, exactly what a node storing every record whole
/// would send, and it keeps reading whole after the log has let go of its files.
#[tokio::test]
async fn a_snapshot_links_the_log_files_holding_its_records_and_copies_no_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, sm) = logged_node(dir.path(), 41).await;
    let (meta, path) = sm.build_blocking().expect("build");
    assert_eq!(meta.last_log_id.map(|l| l.index), Some(41));

    let record_bytes = (40 * RECORDS_PER_ENTRY * VALUE_BYTES) as u64;
    let size = fs::metadata(&path).expect("snapshot file").len();
    assert!(
        size < record_bytes / 10,
        "the snapshot file has {size} bytes for {record_bytes} bytes of records"
    );
    let (_, trailer) = verify_file(&path).expect("verify");
    assert_eq!(trailer.version, LINKED_VERSION);
    assert_eq!(trailer.linked, Some((2, 41)));
    let linked = inodes(&linked_dir(&path));
    assert!(!linked.is_empty());
    assert!(
        linked.is_subset(&inodes(&dir.path().join("log"))),
        "the snapshot's segment files are not the log's own"
    );

    // What a node that stores every record whole builds from the same entries.
    let whole_dir = tempfile::tempdir().expect("tempdir");
    let whole_sm = SmShared::open(
        open_db(&whole_dir.path().join("db")).expect("open db"),
        whole_dir.path().join("snapshots"),
    )
    .expect("open");
    whole_sm.apply_blocking(entries(41)).expect("apply");
    let (_, whole_path) = whole_sm.build_blocking().expect("build");
    let want = pairs_of(&fs::read(&whole_path).expect("read"));

    let mut sent = Vec::new();
    let (sent_meta, bytes) = write_whole(&path, &mut sent).expect("expand");
    assert_eq!(sent_meta, meta);
    assert_eq!(bytes, sent.len() as u64);
    assert!(pairs_of(&sent) == want, "the expanded snapshot differs");

    // The log goes (as a purge would take it); the snapshot's links keep the records.
    drop(store);
    fs::remove_dir_all(dir.path().join("log")).expect("remove the log");
    let mut again = Vec::new();
    write_whole(&path, &mut again).expect("expand without the log");
    assert!(pairs_of(&again) == want);
}

/// A linked snapshot whose segment files are damaged, or gone, never expands into a wrong
/// snapshot: the read fails and names what is wrong; and such a file is never taken as a
/// received snapshot or a backup.
#[tokio::test]
async fn a_linked_snapshot_with_damaged_or_missing_files_fails_to_expand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, sm) = logged_node(dir.path(), 21).await;
    let (meta, path) = sm.build_blocking().expect("build");
    let err = verify_whole(&path).expect_err("a linked snapshot is not whole");
    assert!(
        err.to_string().contains("does not hold its records"),
        "{err}"
    );
    let mut src = File::open(&path).expect("open");
    let err = store_received(&mut src, &dir.path().join("in"), &meta.raft_meta())
        .expect_err("a linked snapshot is never received");
    assert!(
        err.to_string().contains("does not hold its records"),
        "{err}"
    );

    // One byte flipped in a record's value, in the linked file (the log's too: it is one file).
    let segments = linked_dir(&path);
    let seg = fs::read_dir(&segments)
        .expect("linked")
        .map(|e| e.expect("entry").path())
        .min()
        .expect("a linked file");
    let mut bytes = fs::read(&seg).expect("read");
    // Halfway through its frames (the preallocated rest after them reads as zeros).
    let at = bytes.iter().rposition(|b| *b != 0).expect("frames") / 2;
    bytes[at] ^= 0x40;
    fs::write(dir.path().join("damaged.seg"), &bytes).expect("write");
    fs::remove_file(&seg).expect("unlink");
    fs::rename(dir.path().join("damaged.seg"), &seg).expect("replace");
    let err = write_whole(&path, io::sink()).expect_err("damage is found");
    assert!(err.to_string().contains("damaged"), "{err}");

    fs::remove_dir_all(&segments).expect("remove the links");
    let err = verify(&path).expect_err("the links are gone");
    assert!(err.to_string().contains("segment files"), "{err}");
    let err = write_whole(&path, io::sink()).expect_err("nothing to read records from");
    assert!(err.to_string().contains("log entry"), "{err}");
}

/// Copies the files directly under `from` into `to` (a process killed: what is on disk).
fn copy_files(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let path = entry.path();
        if path.is_dir() {
            copy_files(&path, &to.join(entry.file_name()));
        } else if entry.file_name() != "LOCK" {
            fs::copy(&path, to.join(entry.file_name())).expect("copy");
        }
    }
}

/// A node that stopped after a linked snapshot was written but before its state machine was
/// flushed starts from the snapshot: it loads the records as where the log holds them, and
/// reads them from its log.
#[tokio::test]
async fn a_linked_snapshot_newer_than_the_state_machine_loads_at_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, killed) = (dir.path().join("node"), dir.path().join("killed"));
    let (store, sm) = logged_node(&node, 21).await;
    // Applies skip RocksDB's WAL: the database on disk has applied nothing yet.
    copy_files(&node.join("db"), &killed.join("db"));
    let (meta, _) = sm.build_blocking().expect("build");
    copy_files(&node.join("snapshots"), &killed.join("snapshots"));
    copy_files(&node.join("log"), &killed.join("log"));
    let want = {
        let topic = sm.view().state.topics["t"].clone();
        sm.read_records(&topic, 0..200, 200, u64::MAX)
            .expect("read")
    };
    drop((store, sm));

    let db = open_db(&killed.join("db")).expect("open db");
    let segments = open_segments(&db, &killed.join("log"), 0).expect("open the log");
    let store = LogStore::new(db.clone(), segments).expect("log store");
    let sm = SmShared::open(db, killed.join("snapshots")).expect("open");
    sm.attach_log(Arc::new(store.for_records()));
    assert_eq!(sm.view().last_applied, meta.last_log_id);
    let topic = sm.view().state.topics["t"].clone();
    let got = sm
        .read_records(&topic, 0..200, 200, u64::MAX)
        .expect("read");
    assert_eq!(got.len(), 200);
    assert!(got == want, "the records read back differ");
}

/// What a leader sends: the stream of a linked snapshot is its whole format, chunk after
/// chunk, exactly what `write_whole` writes; and a snapshot that cannot be read whole ends
/// its stream with an error (the transfer fails), never with a short or wrong body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_snapshot_streams_whole_or_ends_with_an_error() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().expect("tempdir");
    // Over a chunk of the stream (1 MiB), so that it takes several.
    let (_store, sm) = logged_node(dir.path(), 301).await;
    let (_, path) = sm.build_blocking().expect("build");
    let mut want = Vec::new();
    write_whole(&path, &mut want).expect("expand");
    assert!(want.len() > 2 * STREAM_CHUNK, "{} bytes", want.len());

    let mut got = Vec::new();
    let mut chunks = 0;
    let mut stream = whole_stream(path.clone());
    while let Some(chunk) = stream.next().await {
        got.extend_from_slice(&chunk.expect("a chunk"));
        chunks += 1;
    }
    assert!(chunks > 2, "{chunks} chunks");
    assert!(got == want, "the stream differs from the whole format");

    fs::remove_dir_all(linked_dir(&path)).expect("remove the links");
    let items: Vec<io::Result<bytes::Bytes>> = whole_stream(path).collect().await;
    let last = items.last().expect("the stream says something");
    let err = last.as_ref().expect_err("the stream ends with an error");
    assert!(err.to_string().contains("log entry"), "{err}");
}
