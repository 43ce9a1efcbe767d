use std::path::PathBuf;

use openraft::impls::leader_id_adv::LeaderId as CommittedLeaderId;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::vote::RaftLeaderId;
use openraft::RaftLogReader;

use super::*;
use crate::store::open_db;
use crate::store::records::EntrySource;

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: openraft::EntryPayload::Blank,
    }
}

/// A node's database and log store in `root`, opened as a node opens them (with `durable`
/// as the watermark's index).
fn open_store(root: &Path, durable: u64) -> (Arc<DB>, LogStore) {
    let db = open_db(&root.join("db")).expect("open db");
    let log = open_segments(&db, &root.join("log"), durable).expect("open the log");
    let store = LogStore::new(db.clone(), log).expect("log store");
    (db, store)
}

/// Appends `entries` and waits until the store reports them durable (the flusher reports that
/// after a successful sync only, when it also calls openraft's callback).
async fn append_flushed(store: &mut LogStore, entries: Vec<Entry>) {
    let last = entries.last().expect("entries").index();
    let mut durable = store.durable();
    store
        .append(entries, IOFlushed::noop())
        .await
        .expect("append");
    durable
        .wait_for(|d| *d >= last)
        .await
        .expect("the flusher reports");
}

async fn indexes(store: &mut LogStore) -> Vec<u64> {
    store
        .try_get_log_entries(..)
        .await
        .expect("read")
        .iter()
        .map(|e| e.index())
        .collect()
}

/// Writes `value` under `key` in the `raft` family, synced, as the store writes its metadata.
fn put_raft_meta(db: &DB, key: &[u8], value: &impl serde::Serialize) {
    let mut batch = WriteBatch::default();
    let raft = db.cf_handle(CF_RAFT).expect("raft cf");
    batch.put_cf(raft, key, values::encode(value).expect("encode"));
    db.write_opt(batch, &crate::store::write_options(true))
        .expect("write");
}

fn marks_of(db: &DB, root: &Path) -> StorageResult<Marks> {
    let (log, _) =
        SegmentLog::open(&root.join("log"), u64::MAX, DEFAULT_SEGMENT_BYTES).expect("open the log");
    stored_marks(db, &log)
}

/// What start-up compares with the watermark: the last log index (an entry's, or the last
/// purged one's when the log is empty behind a snapshot) and the vote's term; and a vote
/// adopted for a rejoin never lowers the stored one.
#[tokio::test]
async fn stored_marks_follow_the_log_the_purge_and_the_vote() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, mut store) = open_store(dir.path(), 0);
    assert_eq!(marks_of(&db, dir.path()).expect("marks"), Marks::default());
    store
        .save_vote(&Vote::new_committed(3, 1))
        .await
        .expect("vote");
    append_flushed(&mut store, (1..=5).map(|i| blank(3, i)).collect()).await;
    assert_eq!(
        marks_of(&db, dir.path()).expect("marks"),
        Marks {
            log_index: 5,
            vote_term: 3
        }
    );
    store.purge(log_id(3, 5)).await.expect("purge");
    assert_eq!(marks_of(&db, dir.path()).expect("marks").log_index, 5);
    adopt_vote(&db, &Vote::new_committed(2, 2)).expect("adopt");
    assert_eq!(marks_of(&db, dir.path()).expect("marks").vote_term, 3);
    adopt_vote(&db, &Vote::new_committed(7, 2)).expect("adopt");
    assert_eq!(marks_of(&db, dir.path()).expect("marks").vote_term, 7);
}

/// A follower's append (entries another leader made) is written and synced by `append` itself
/// when the log thread has nothing to do: reported flushed, and durable, before it returns.
/// A leader's own entries and every append of a store that does not know its node id go to
/// the log thread, and are reported flushed all the same.
#[tokio::test]
async fn a_followers_append_is_synced_before_it_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, mut store) = open_store(dir.path(), 0);
    let followers = |term: u64, range: std::ops::RangeInclusive<u64>| -> Vec<Entry> {
        range.map(|i| blank(term, i)).collect()
    };
    append_flushed(&mut store, followers(2, 1..=3)).await;
    store.sync_follower_appends_in_place(2);
    // A loaded machine's fsync can take longer than the 20 ms after which appends go to the
    // log thread (tested below), which this test is not about.
    store.set_in_place_fsync_max(std::time::Duration::from_secs(3600));
    for round in 0..3u64 {
        let first = 4 + round * 3;
        // The log thread reports an append flushed just before it lets go of its state; an
        // append in that moment goes to the thread, as it should. Wait for it to let go.
        for _ in 0..5_000 {
            if store.log_thread_idle() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(
            store.log_thread_idle(),
            "round {round}: the log thread stays busy"
        );
        let (tx, mut rx) = {
            use openraft::type_config::TypeConfigExt;
            TypeConfig::oneshot::<Result<(), std::io::Error>>()
        };
        store
            .append(followers(2, first..=first + 2), IOFlushed::signal(tx))
            .await
            .expect("append");
        assert!(
            matches!(rx.try_recv(), Ok(Ok(()))),
            "round {round}: not reported flushed when append returned"
        );
        assert_eq!(*store.durable().borrow(), first + 2);
    }
    // This node's own entries (it leads term 3): through the log thread.
    let own = (13..=15)
        .map(|i| Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 2), i),
            payload: openraft::EntryPayload::Blank,
        })
        .collect();
    append_flushed(&mut store, own).await;
    assert_eq!(indexes(&mut store).await, (1..=15).collect::<Vec<_>>());
    drop(store);
    drop(db);
    let (_db, mut store) = open_store(dir.path(), 15);
    assert_eq!(indexes(&mut store).await, (1..=15).collect::<Vec<_>>());
}

/// When a follower's append that finds the log thread idle is synced in place: after a quick
/// fsync that ended at least as long ago as it took (one append at a time, spaced by the round
/// trip to the leader); not after a slow fsync (a stalled disk); not right behind the last
/// fsync, when appends come in faster than they are synced and the log thread groups them.
#[test]
fn a_follower_syncs_in_place_only_when_its_appends_are_spaced() {
    use std::time::Duration;
    let us = Duration::from_micros;
    let max = Duration::from_millis(20);
    // The first append a store makes: no fsync yet.
    assert!(sync_here(Duration::ZERO, None, max));
    // Spaced: the last fsync took 200 µs and ended 200 µs or more ago.
    assert!(sync_here(us(200), Some(us(200)), max));
    assert!(sync_here(us(200), Some(us(700)), max));
    // Right behind it: ended 50 or 199 µs ago.
    assert!(!sync_here(us(200), Some(us(50)), max));
    assert!(!sync_here(us(200), Some(us(199)), max));
    // A slow fsync, however long ago.
    let ms = Duration::from_millis;
    assert!(!sync_here(ms(25), Some(ms(5_000)), max));
    assert!(sync_here(ms(20), Some(ms(5_000)), max));
}

/// A saved commit index past the log's end (a follower that received entries, heard they
/// were committed, and stopped before writing them) reads back as the log's end, so that
/// start-up applies only what the log holds; behind a snapshot, the end is the purge point.
#[tokio::test]
async fn a_commit_index_past_the_log_reads_back_as_its_end() {
    async fn saved_then_read(store: &mut LogStore, committed: LogId) -> Option<LogId> {
        store.save_committed(Some(committed)).await.expect("save");
        store.read_committed().await.expect("read")
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, mut store) = open_store(dir.path(), 0);
    assert_eq!(store.read_committed().await.expect("read"), None);
    append_flushed(&mut store, (1..=5).map(|i| blank(2, i)).collect()).await;
    assert_eq!(
        saved_then_read(&mut store, log_id(2, 3)).await,
        Some(log_id(2, 3))
    );
    assert_eq!(
        saved_then_read(&mut store, log_id(2, 55)).await,
        Some(log_id(2, 5))
    );
    store.purge(log_id(2, 5)).await.expect("purge");
    assert_eq!(
        saved_then_read(&mut store, log_id(3, 70)).await,
        Some(log_id(2, 5))
    );
}

/// The commit index saved is read back after a restart (from the hint's file, written without
/// a sync), and a directory from before the file, which kept it in RocksDB's `raft` family, is
/// read as the greater of the key and the file.
#[tokio::test]
async fn the_commit_index_is_read_back_after_a_restart() {
    async fn reopened(root: &Path, db: &Arc<DB>) -> (LogStore, Option<LogId>) {
        let log = open_segments(db, &root.join("log"), 9).expect("open the log");
        let mut store = LogStore::new(db.clone(), log).expect("log store");
        let committed = store.read_committed().await.expect("read");
        (store, committed)
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, mut store) = open_store(dir.path(), 0);
    append_flushed(&mut store, (1..=9).map(|i| blank(2, i)).collect()).await;
    store
        .save_committed(Some(log_id(2, 4)))
        .await
        .expect("save");
    store
        .save_committed(Some(log_id(2, 6)))
        .await
        .expect("save");
    drop(store);
    let (store, committed) = reopened(dir.path(), &db).await;
    assert_eq!(committed, Some(log_id(2, 6)));
    assert_eq!(store.committed_index().load(Ordering::Relaxed), 6);
    drop(store);
    // An older key is ignored; a newer one (a directory written by an older raftq since) wins.
    put_raft_meta(&db, keys::COMMITTED, &Some(log_id(2, 5)));
    assert_eq!(reopened(dir.path(), &db).await.1, Some(log_id(2, 6)));
    put_raft_meta(&db, keys::COMMITTED, &Some(log_id(2, 8)));
    assert_eq!(reopened(dir.path(), &db).await.1, Some(log_id(2, 8)));
    // The hint's file gone (lost with a power loss before it reached the disk): the key.
    std::fs::remove_file(dir.path().join("log").join(super::super::commit_hint::FILE))
        .expect("remove");
    put_raft_meta(&db, keys::COMMITTED, &Some(log_id(2, 7)));
    assert_eq!(reopened(dir.path(), &db).await.1, Some(log_id(2, 7)));
}

/// Entries are removed from the front only by a purge, recorded first: a log that starts
/// after the entry following the last purged one lost the entries in between.
#[tokio::test]
async fn a_log_that_starts_after_a_gap_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, mut store) = open_store(dir.path(), 0);
    // A log that starts at 10 (as a restored or snapshot-installed node's does, after its
    // purge point).
    append_flushed(&mut store, (10..=12).map(|i| blank(1, i)).collect()).await;
    let err = marks_of(&db, dir.path()).expect_err("nothing purged before 10");
    assert!(err.to_string().contains("starts at index 10"), "{err}");
    put_raft_meta(&db, keys::LAST_PURGED, &log_id(1, 8));
    assert!(marks_of(&db, dir.path()).is_err(), "entry 9 is missing");
    put_raft_meta(&db, keys::LAST_PURGED, &log_id(1, 9));
    assert_eq!(marks_of(&db, dir.path()).expect("marks").log_index, 12);
}

/// The durable index apply waits on rises once the flusher has synced an append, falls to
/// the kept entries on a truncation, and is not raised by a flush of entries written before
/// the truncation (those indexes now hold other entries, not yet synced).
#[tokio::test]
async fn the_durable_index_follows_flushes_and_truncations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_db, mut store) = open_store(dir.path(), 0);
    let durable = store.durable();
    assert_eq!(*durable.borrow(), 0);
    append_flushed(&mut store, (1..=5).map(|i| blank(1, i)).collect()).await;
    assert_eq!(*durable.borrow(), 5);
    store
        .truncate_after(Some(log_id(1, 3)))
        .await
        .expect("truncate");
    assert_eq!(*durable.borrow(), 3);
    append_flushed(&mut store, (4..=6).map(|i| blank(2, i)).collect()).await;
    assert_eq!(*durable.borrow(), 6);
    assert_eq!(indexes(&mut store).await, vec![1, 2, 3, 4, 5, 6]);

    // A flush reported for appends written before a truncation counts up to what the
    // truncation kept (those entries survived it), never above.
    let tracker = Durable::new(2);
    let before = tracker.epoch();
    tracker.truncating(3);
    tracker.flushed(5, before);
    assert_eq!(
        *tracker.tx.borrow(),
        3,
        "a flush from before the truncation counted past what it kept"
    );
    tracker.flushed(4, tracker.epoch());
    assert_eq!(*tracker.tx.borrow(), 4);
    let before = tracker.epoch();
    tracker.truncating(2);
    tracker.truncating(1);
    tracker.flushed(9, before);
    assert_eq!(
        *tracker.tx.borrow(),
        1,
        "two truncations: the lower keep counts"
    );
}

/// A purge is recorded before its segments go; a crash in between leaves entries at or below
/// the purge point, which the next start removes, so the log appends after the purge point.
#[tokio::test]
async fn a_purge_interrupted_after_its_record_is_finished_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (db, mut store) = open_store(dir.path(), 0);
        append_flushed(&mut store, (1..=10).map(|i| blank(1, i)).collect()).await;
        // The purge's record, and then the crash: the segments are still there.
        put_raft_meta(&db, keys::LAST_PURGED, &log_id(1, 20));
    }
    let (_db, mut store) = open_store(dir.path(), 10);
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 20)));
    assert_eq!(state.last_log_id, Some(log_id(1, 20)));
    assert!(indexes(&mut store).await.is_empty());
    append_flushed(&mut store, vec![blank(2, 21)]).await;
    assert_eq!(indexes(&mut store).await, vec![21]);
}

/// Writes entries into the `log` family as a format 4 directory held them.
fn write_log_family(db: &DB, entries: &[Entry]) {
    let cf = db.cf_handle(CF_LOG).expect("log cf");
    let mut batch = WriteBatch::default();
    for e in entries {
        batch.put_cf(
            cf,
            e.index().to_be_bytes(),
            encode_entry(e).expect("encode"),
        );
    }
    db.write(batch).expect("write");
}

fn family_is_empty(db: &DB) -> bool {
    let cf = db.cf_handle(CF_LOG).expect("log cf");
    db.iterator_cf(cf, IteratorMode::Start).next().is_none()
}

/// The upgrade to format 5 moves the log's entries out of RocksDB into segment files, and only
/// then empties the family; an upgrade a crash interrupted (a half-written staging directory,
/// or segments renamed into place while the family still held the entries) is made again from
/// the family; a second open moves nothing.
#[tokio::test]
async fn a_format_4_log_moves_into_segment_files_even_after_an_interrupted_upgrade() {
    let entries: Vec<Entry> = (1..=40).map(|i| blank(1 + i / 20, i)).collect();
    for interrupted in [None, Some("log.upgrade"), Some("log")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open_db(&dir.path().join("db")).expect("open db");
        write_log_family(&db, &entries);
        if let Some(leftover) = interrupted {
            // Segments of a copy that did not finish: entries 1 and 2 only.
            let (mut partial, _) = SegmentLog::open(&dir.path().join(leftover), 0, 1_000)
                .expect("open a partial copy");
            for e in &entries[..2] {
                partial
                    .append(e.index(), &encode_entry(e).expect("encode"))
                    .expect("append");
            }
            partial.sync().expect("sync");
        }
        let dir_log: PathBuf = dir.path().join("log");
        assert_eq!(move_log_family(&db, &dir_log).expect("upgrade"), 40);
        assert!(family_is_empty(&db), "the family still holds entries");
        assert!(!dir.path().join("log.upgrade").exists());
        assert_eq!(move_log_family(&db, &dir_log).expect("again"), 0);
        let log = open_segments(&db, &dir_log, 40).expect("open");
        let mut store = LogStore::new(db.clone(), log).expect("store");
        let read = store.try_get_log_entries(..).await.expect("read");
        assert_eq!(read, entries, "{interrupted:?}");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_log_id, Some(log_id(3, 40)));
    }
}

/// A real power loss under the log store: the log lives on a fault disk (a FUSE file system of
/// our own that drops every write not fsynced when told). Every entry the store reported
/// flushed is there after the loss, through several rounds and segment boundaries, while the
/// log thread syncs outside the segment log's lock, and (every other round) while a follower's
/// appends are synced in place. Needs root and `/dev/fuse`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_reported_flushed_survives_a_power_loss() {
    let (root, disk, mount) = crate::store::segments::tests::fault_disk();
    let db = open_db(&root.path().join("db")).expect("open db");
    let dir = mount.join("log");
    let mut flushed = 0u64;
    for round in 0..5u64 {
        let (log, _) = SegmentLog::open(&dir, flushed, 4_096).expect("open after a power loss");
        let mut store = LogStore::new(db.clone(), log).expect("store");
        if round % 2 == 1 {
            // A follower's store (the entries are node 1's): appends synced in place.
            store.sync_follower_appends_in_place(2);
        }
        let held = indexes(&mut store).await;
        assert_eq!(
            held,
            (1..=held.len() as u64).collect::<Vec<_>>(),
            "round {round}"
        );
        assert!(
            held.len() as u64 >= flushed,
            "round {round}: {flushed} entries were reported flushed, {} survived",
            held.len()
        );
        // Appends of a few entries each, every one waited for: several segments' worth.
        let mut next = held.len() as u64 + 1;
        for _ in 0..12 {
            let batch = (next..next + 3).map(|i| publish_entry(round, i)).collect();
            append_flushed(&mut store, batch).await;
            next += 3;
        }
        flushed = next - 1;
        // The power goes while the store is still open.
        disk.control().drop_unsynced().expect("power loss");
        drop(store);
    }
    disk.unmount().expect("unmount");
}

/// An entry of about 300 bytes, so that a few fill a small segment.
fn publish_entry(term: u64, index: u64) -> Entry {
    use crate::state::{Batch, Command, LogPayload, NewRecord, Publish};
    Entry {
        log_id: log_id(term + 1, index),
        payload: openraft::EntryPayload::Normal(LogPayload::V1(Batch {
            timestamp_ms: index,
            commands: vec![Command::Publish(Publish {
                topic: "t".into(),
                records: vec![NewRecord {
                    key: None,
                    headers: vec![],
                    value: vec![index as u8; 300],
                }],
                producer: None,
            })],
        })),
    }
}

/// Reads serve the newest entries from memory and the older ones from the files, in one range;
/// a truncation and a purge cut both.
#[tokio::test]
async fn reads_join_entries_from_the_files_and_from_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (_db, mut store) = open_store(dir.path(), 0);
        append_flushed(&mut store, (1..=5).map(|i| blank(1, i)).collect()).await;
    }
    // Reopened: entries 1 to 5 are in the files only, 6 to 8 also in memory.
    let (_db, mut store) = open_store(dir.path(), 5);
    append_flushed(&mut store, (6..=8).map(|i| blank(2, i)).collect()).await;
    assert_eq!(store.recent().first_index(), Some(6));
    let read = store.try_get_log_entries(3..=7).await.expect("read");
    assert_eq!(
        read.iter().map(|e| e.log_id()).collect::<Vec<_>>(),
        vec![
            log_id(1, 3),
            log_id(1, 4),
            log_id(1, 5),
            log_id(2, 6),
            log_id(2, 7)
        ]
    );
    store
        .truncate_after(Some(log_id(2, 6)))
        .await
        .expect("truncate");
    append_flushed(&mut store, vec![blank(3, 7)]).await;
    assert_eq!(
        store.try_get_log_entries(6..).await.expect("read"),
        vec![blank(2, 6), blank(3, 7)]
    );
    store.purge(log_id(2, 6)).await.expect("purge");
    assert_eq!(
        store.try_get_log_entries(..).await.expect("read"),
        vec![blank(3, 7)]
    );
}

/// A log store whose segments hold a few hundred bytes each, so that a few entries fill one.
fn open_small_segments(root: &Path) -> (Arc<DB>, LogStore) {
    let db = open_db(&root.join("db")).expect("open db");
    let (log, _) = SegmentLog::open(&root.join("log"), u64::MAX, 1024).expect("open the log");
    let store = LogStore::new(db.clone(), log).expect("log store");
    (db, store)
}

fn files_purged_of(db: &DB) -> Option<u64> {
    get_meta::<u64>(db, keys::FILES_PURGED).expect("read")
}

/// Raft's purge removes no segment holding an entry the state machine's records point into:
/// `keep_from` bounds it, the bound is recorded with the purge and holds across a restart,
/// and once the records let go, the next purge takes the segments. Raft itself reads nothing
/// it purged either way. A log that lost entries records point into is refused at start-up.
#[tokio::test]
async fn a_purge_keeps_the_entries_records_point_into() {
    use crate::store::records::Entries;
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let (db, mut store) = open_small_segments(dir.path());
        append_flushed(&mut store, (1..=30).map(|i| publish_entry(1, i)).collect()).await;
        store.for_records().keep_from(12);
        store.purge(log_id(2, 25)).await.expect("purge");
        assert_eq!(indexes(&mut store).await, (26..=30).collect::<Vec<_>>());
        assert_eq!(files_purged_of(&db), Some(11));
        let entries = store.for_records();
        for index in 12..=30 {
            assert_eq!(entries.entry(index).expect("kept").index(), index);
        }
    }
    let (db, mut store) = open_small_segments(dir.path());
    let entries = store.for_records();
    for index in 12..=30 {
        assert_eq!(entries.entry(index).expect("kept").index(), index);
    }
    assert_eq!(indexes(&mut store).await, (26..=30).collect::<Vec<_>>());
    marks_of(&db, dir.path()).expect("the log holds what records point into");

    // The records let go of everything up to 25: the next purge takes the segments, and an
    // older bound never brings a lower purge point back.
    entries.keep_from(26);
    entries.keep_from(5);
    store.purge(log_id(2, 27)).await.expect("purge");
    assert_eq!(files_purged_of(&db), Some(25));
    let err = entries.entry(12).expect_err("gone");
    assert!(err.contains("entry 12"), "{err}");
    assert_eq!(indexes(&mut store).await, (28..=30).collect::<Vec<_>>());
    drop((store, entries));

    // Entries between the files' purge point and Raft's went missing: refused.
    let db_path = dir.path().join("db");
    drop(db);
    let db = open_db(&db_path).expect("open db");
    put_raft_meta(&db, keys::FILES_PURGED, &5u64);
    let err = marks_of(&db, dir.path()).expect_err("entries 6 to 25 are gone");
    assert!(err.to_string().contains("from index 6"), "{err}");
}
