use openraft::impls::leader_id_adv::LeaderId as CommittedLeaderId;
use openraft::vote::RaftLeaderId;
use openraft::EntryPayload;

use super::super::open_db;

use super::*;
use crate::state::{
    Batch, Command, CreateSub, CreateTopic, NewRecord, ProducerSeq, Publish, Pull, Start, SubRef,
    SubSettings, TopicSettings,
};

fn entry(index: u64, commands: Vec<Command>) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(LogPayload::V1(Batch {
            timestamp_ms: 1_000 + index,
            commands,
        })),
    }
}

fn publish(sequence: u64) -> Command {
    Command::Publish(Publish {
        topic: "t".into(),
        records: vec![NewRecord {
            key: None,
            headers: vec![],
            value: format!("v{sequence}").into_bytes(),
        }],
        producer: Some(ProducerSeq {
            producer_id: "p".into(),
            sequence,
        }),
    })
}

/// An empty state machine on a fresh database: its directory, database and store.
fn fresh_node() -> (tempfile::TempDir, Arc<DB>, Arc<SmShared>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open_db(&dir.path().join("db")).expect("open db");
    let shared = SmShared::open(db.clone(), dir.path().join("snapshots")).expect("open");
    (dir, db, shared)
}

/// Creates topic `t`.
fn create_topic_t() -> Command {
    Command::CreateTopic(CreateTopic {
        name: "t".into(),
        settings: TopicSettings::default(),
    })
}

/// Creates subscription `s` of topic `t`, with leases of one second.
fn create_sub_s() -> Command {
    Command::CreateSubscription(CreateSub {
        topic: "t".into(),
        name: "s".into(),
        settings: SubSettings {
            start: Start::First,
            ack_timeout_ms: 1_000,
            max_deliveries: None,
            dead_letter_topic: None,
        },
    })
}

/// Subscription `s` of topic `t`.
fn sub_ref() -> SubRef {
    SubRef {
        topic: "t".into(),
        name: "s".into(),
    }
}

/// Producers, counters and subscriptions come back whole from the database after a
/// restart and from a snapshot installed on a fresh node: deduplication and reports
/// survive both.
#[test]
fn state_survives_reopen_and_snapshot_install() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open_db(&dir.path().join("db")).expect("open db");
    let shared = SmShared::open(db.clone(), dir.path().join("snapshots")).expect("open");
    let entries = vec![
        entry(1, vec![create_topic_t()]),
        entry(2, vec![create_sub_s()]),
        entry(3, vec![publish(0), publish(1), publish(0)]),
        entry(
            4,
            vec![Command::Pull(Pull {
                sub: SubRef {
                    topic: "t".into(),
                    name: "s".into(),
                },
                max: 1,
                ack_timeout_ms: None,
            })],
        ),
    ];
    shared.apply_blocking(entries).expect("apply");
    let want = shared.view().state.clone();
    assert_eq!(
        want.producers.get("t", "p").map(|p| p.next_sequence),
        Some(2)
    );
    assert_eq!(want.topics["t"].counters.deduplicated, 1);
    assert_eq!(want.subs.values().next().map(|s| s.leases.len()), Some(1));

    // Restart: everything is rebuilt from the column family.
    let reopened = load_view(&db).expect("reload");
    assert_eq!(reopened.state, want);

    // Snapshot, then install it on a fresh node.
    let (_, path, _) =
        snapshot::build(&db, &dir.path().join("snapshots"), 1).expect("build snapshot");
    let other = tempfile::tempdir().expect("tempdir");
    let db2 = open_db(&other.path().join("db")).expect("open db");
    let fresh = SmShared::open(db2, other.path().join("snapshots")).expect("open");
    fresh.load_snapshot(&path).expect("install");
    assert_eq!(fresh.view().state, want);

    // The installed node deduplicates a re-send exactly as the original would.
    let resp = fresh
        .apply_blocking(vec![entry(5, vec![publish(1)])])
        .expect("apply");
    assert_eq!(
        resp[0].results[0],
        Ok(crate::state::Outcome::Published {
            first_offset: 1,
            last_offset: 1,
            duplicate: true
        })
    );
}

/// Leases and pending redeliveries are written as deltas across many apply calls (pulls,
/// acks, nacks with a delay, expiries): the store still holds exactly the state, after a
/// restart and on a node that installed a snapshot of it, and the two digest the same.
#[test]
fn leases_written_as_deltas_come_back_after_reopen_and_snapshot_install() {
    use crate::state::{Outcome, ReceiptAction, SettleReceipts};
    let (dir, db, shared) = fresh_node();
    let sub = sub_ref();
    let pull = |max| {
        Command::Pull(Pull {
            sub: sub.clone(),
            max,
            ack_timeout_ms: Some(500),
        })
    };
    let settle = |action, receipts| {
        Command::SettleReceipts(SettleReceipts {
            sub: sub.clone(),
            action,
            receipts,
        })
    };
    let mut setup = vec![entry(1, vec![create_topic_t(), create_sub_s()])];
    setup.extend((2..=21).map(|i| entry(i, vec![publish(i - 2)])));
    shared.apply_blocking(setup).expect("apply");
    let resp = shared
        .apply_blocking(vec![entry(22, vec![pull(10)])])
        .expect("pull");
    let Ok(Outcome::Pulled(delivered)) = &resp[0].results[0] else {
        panic!("pull answered {:?}", resp[0].results);
    };
    let receipts: Vec<_> = delivered.iter().map(|d| d.receipt).collect();
    shared
        .apply_blocking(vec![entry(
            23,
            vec![
                settle(ReceiptAction::Ack, receipts[..3].to_vec()),
                settle(
                    ReceiptAction::Nack {
                        delay_ms: 100_000,
                        dead_letter: false,
                    },
                    receipts[3..5].to_vec(),
                ),
            ],
        )])
        .expect("settle");
    // Entry 24 is 1.5 s later: the five leases left expire before its pull runs.
    let mut late = entry(24, vec![pull(4)]);
    if let EntryPayload::Normal(LogPayload::V1(b)) = &mut late.payload {
        b.timestamp_ms += 1_500;
    }
    shared.apply_blocking(vec![late]).expect("expire and pull");
    let want = shared.view().state.clone();
    let s = want.subs.values().next().expect("the subscription");
    assert_eq!((s.leases.len(), s.pending.len()), (4, 3), "{s:?}");
    assert_eq!(s.counters.expired_leases, 5);

    assert_eq!(load_view(&db).expect("reload").state, want);
    let (_, path, _) =
        snapshot::build(&db, &dir.path().join("snapshots"), 1).expect("build snapshot");
    let other = tempfile::tempdir().expect("tempdir");
    let db2 = open_db(&other.path().join("db")).expect("open db");
    let fresh = SmShared::open(db2.clone(), other.path().join("snapshots")).expect("open");
    fresh.load_snapshot(&path).expect("install");
    assert_eq!(fresh.view().state, want);
    assert_eq!(load_view(&db2).expect("reload").state, want);
    assert_eq!(fresh.digest(), shared.digest());

    // The same subscription as data directory format 3 stored it (one whole value): the state
    // machine's open splits it, and reads the same state.
    let cf = db.cf_handle(CF_SM).expect("cf");
    let (start, end) = subs::range(s.id);
    db.delete_range_cf(cf, &start, &end).expect("delete");
    db.put_cf(cf, keys::sub(s.id), values::encode(s).expect("enc"))
        .expect("put");
    drop(shared);
    let reopened = SmShared::open(db.clone(), dir.path().join("snapshots")).expect("reopen");
    assert_eq!(reopened.view().state, want);
    let head = db.get_cf(cf, keys::sub(s.id)).expect("get").expect("head");
    assert_eq!(head[0], subs::HEAD_FORMAT, "split at open");
    assert_eq!(reopened.digest(), fresh.digest());
}

/// A record that cannot be read during apply (here: its stored bytes are garbage) fails
/// the apply: nothing of the entry is written, the applied index does not move, and the
/// in-memory state readers see is exactly what was applied before.
#[test]
fn an_unreadable_record_fails_the_apply_and_changes_nothing() {
    let (_dir, db, shared) = fresh_node();
    let sub = sub_ref();
    let topic = |name: &str| {
        Command::CreateTopic(CreateTopic {
            name: name.into(),
            settings: TopicSettings::default(),
        })
    };
    shared
        .apply_blocking(vec![
            entry(1, vec![topic("t"), topic("dlq")]),
            entry(
                2,
                vec![Command::CreateSubscription(CreateSub {
                    topic: "t".into(),
                    name: "s".into(),
                    settings: SubSettings {
                        start: Start::First,
                        ack_timeout_ms: 60_000,
                        max_deliveries: None,
                        dead_letter_topic: Some("dlq".into()),
                    },
                })],
            ),
            entry(3, vec![publish(0)]),
        ])
        .expect("apply");
    let resp = shared
        .apply_blocking(vec![entry(
            4,
            vec![Command::Pull(Pull {
                sub: sub.clone(),
                max: 1,
                ack_timeout_ms: None,
            })],
        )])
        .expect("apply");
    let Ok(crate::state::Outcome::Pulled(deliveries)) = &resp[0].results[0] else {
        panic!("pull answered {:?}", resp[0].results[0]);
    };
    let receipt = deliveries[0].receipt;
    let before = shared.view().state.clone();
    let digest = shared.digest().expect("digest");

    // The record's stored bytes go bad.
    let topic_id = before.topics["t"].id;
    let cf = db.cf_handle(CF_SM).expect("sm");
    db.put_cf(cf, keys::record(topic_id, 0), b"\x01garbage")
        .expect("corrupt the record");
    let digest_corrupt = shared.digest().expect("digest");

    let nack = Command::SettleReceipts(crate::state::SettleReceipts {
        sub,
        action: crate::state::ReceiptAction::Nack {
            delay_ms: 0,
            dead_letter: true,
        },
        receipts: vec![receipt],
    });
    let err = shared
        .apply_blocking(vec![entry(5, vec![nack])])
        .expect_err("a dead letter of an unreadable record must fail the apply");
    assert!(err.to_string().contains("cannot be trusted"), "{err}");
    assert_eq!(shared.view().state, before, "the in-memory state moved");
    assert_eq!(shared.view().commit_point.index, 4);
    assert_eq!(
        read_applied(&db).expect("applied").map(|l| l.index),
        Some(4)
    );
    assert_ne!(digest, digest_corrupt);
    assert_eq!(
        shared.digest().expect("digest"),
        digest_corrupt,
        "something was written"
    );
}

impl SmShared {
    /// Loads snapshots in batches of `bytes` (tests: many batches from a small state).
    pub(crate) fn set_load_batch_bytes(&self, bytes: usize) {
        self.load_batch_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

fn open_at(dir: &std::path::Path) -> Arc<SmShared> {
    let db = open_db(&dir.join("db")).expect("open db");
    SmShared::open(db, dir.join("snapshots")).expect("open state machine")
}

fn workload(shared: &SmShared, indexes: std::ops::RangeInclusive<u64>) {
    for index in indexes {
        let commands = if index == 1 {
            vec![Command::CreateTopic(CreateTopic {
                name: "t".into(),
                settings: TopicSettings::default(),
            })]
        } else {
            vec![publish(index - 2)]
        };
        shared
            .apply_blocking(vec![entry(index, commands)])
            .expect("apply");
    }
}

/// [`workload`] on a state machine whose log is `log`: the entries go into the log first.
fn logged_workload(shared: &SmShared, log: &MemLog, indexes: std::ops::RangeInclusive<u64>) {
    for index in indexes {
        let commands = match index {
            1 => vec![create_topic_t()],
            _ => vec![publish(index - 2)],
        };
        let e = entry(index, commands);
        log.entries.lock().expect("lock").insert(index, e.clone());
        shared.apply_blocking(vec![e]).expect("apply");
    }
}

/// A node that applied `entries` entries of [`workload`], in a directory of its own.
fn node_with(entries: u64) -> (tempfile::TempDir, Arc<SmShared>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = open_at(dir.path());
    workload(&shared, 1..=entries);
    (dir, shared)
}

/// A leader with a snapshot of `entries` entries: its directory, its state machine, the
/// snapshot's meta and file.
fn leader_snapshot(
    entries: u64,
) -> (
    tempfile::TempDir,
    Arc<SmShared>,
    snapshot::FileMeta,
    PathBuf,
) {
    let (dir, leader) = node_with(entries);
    let (meta, path) = leader.build_blocking().expect("leader snapshot");
    (dir, leader, meta, path)
}

/// What is in the snapshot directory: complete snapshots (each verified) by index, and
/// whether any temp file is left.
fn snapshot_files(dir: &std::path::Path) -> (Vec<u64>, bool) {
    let mut indexes = Vec::new();
    let mut tmp = false;
    for entry in std::fs::read_dir(dir.join("snapshots")).expect("snapshot dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".tmp") {
            tmp = true;
        } else if name.ends_with(".log") {
            // A linked snapshot's segment files: a leftover without their snapshot.
            tmp |= !path.with_extension("snap").is_file();
        } else {
            let meta = snapshot::verify(&path).expect("a complete snapshot verifies");
            indexes.push(meta.last_log_id.map_or(0, |l| l.index));
        }
    }
    indexes.sort();
    (indexes, tmp)
}

/// A crash at each step of building a snapshot: the node restarts with exactly the state
/// it had applied, every snapshot file left is complete (the old one, or the new one once
/// renamed), temp files are cleared, and the next build succeeds.
#[test]
fn a_crash_at_each_step_of_a_snapshot_build_leaves_a_consistent_node() {
    for point in crate::store::faults::BUILD {
        // With a log, so that the snapshot is linked and every step is taken.
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = open_at(dir.path());
        let log = Arc::new(MemLog::default());
        shared.attach_log(log.clone());
        logged_workload(&shared, &log, 1..=3);
        shared.build_blocking().expect("first snapshot");
        logged_workload(&shared, &log, 4..=6);
        let want = shared.view().state.clone();
        {
            let _armed = crate::store::faults::arm(point);
            assert!(shared.build_blocking().is_err(), "{point} did not fail");
        }
        drop(shared);

        let (before, _) = snapshot_files(dir.path());
        let reopened = open_at(dir.path());
        reopened.attach_log(log.clone());
        assert_eq!(reopened.view().state, want, "{point}: state after restart");
        assert_eq!(reopened.view().commit_point.index, 6, "{point}");
        let (after, tmp) = snapshot_files(dir.path());
        assert!(!tmp, "{point}: a temp file survived the restart");
        assert_eq!(before, after, "{point}");
        let renamed = point == crate::store::faults::BUILD_RENAMED;
        let newest = if renamed { 6 } else { 3 };
        assert_eq!(after.last(), Some(&newest), "{point}: {after:?}");
        assert_eq!(reopened.snapshot_info().map(|(i, _)| i), Some(newest));
        let (meta, _) = reopened.build_blocking().expect("a build after the crash");
        assert_eq!(meta.last_log_id.map(|l| l.index), Some(6));
    }
}

/// A crash at each step of receiving and installing a snapshot: the node restarts with
/// either its own old state or exactly the snapshot's (once the snapshot file is durable
/// under its final name, start-up finishes the install), never a mix.
#[test]
fn a_crash_at_each_step_of_a_snapshot_install_leaves_a_consistent_node() {
    let (_leader_dir, leader, meta, path) = leader_snapshot(8);
    let leader_state = leader.view().state.clone();

    for point in crate::store::faults::INSTALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let follower = open_at(dir.path());
        // Small batches: a crash can stop a load between two of them.
        follower.set_load_batch_bytes(64);
        workload(&follower, 1..=2);
        let old_state = follower.view().state.clone();
        {
            let _armed = crate::store::faults::arm(point);
            let mut src = std::fs::File::open(&path).expect("snapshot file");
            assert!(
                follower
                    .install_blocking(&mut src, &meta.raft_meta())
                    .is_err(),
                "{point} did not fail"
            );
        }
        drop(follower);

        let reopened = open_at(dir.path());
        let durable = !matches!(
            point,
            crate::store::faults::RECEIVE_WRITTEN | crate::store::faults::RECEIVE_SYNCED
        );
        let (files, tmp) = snapshot_files(dir.path());
        assert!(!tmp, "{point}: a temp file survived the restart");
        if durable {
            assert_eq!(reopened.view().state, leader_state, "{point}");
            assert_eq!(reopened.view().commit_point.index, 8, "{point}");
            assert_eq!(files, vec![8], "{point}");
        } else {
            assert_eq!(reopened.view().state, old_state, "{point}");
            assert_eq!(reopened.view().commit_point.index, 2, "{point}");
            assert!(files.is_empty(), "{point}: {files:?}");
        }
        // And the install goes through when tried again.
        let mut src = std::fs::File::open(&path).expect("snapshot file");
        reopened
            .install_blocking(&mut src, &meta.raft_meta())
            .expect("install after restart");
        assert_eq!(reopened.view().state, leader_state, "{point}");
    }
}

/// A build that started before a newer snapshot was installed, and finishes after, must
/// neither replace nor delete the installed one: the node keeps the newer snapshot (the
/// log before it may already be purged).
#[test]
fn a_build_that_finishes_after_an_install_keeps_the_newer_snapshot() {
    let (_leader_dir, _leader, meta, path) = leader_snapshot(8);
    let (dir, follower) = node_with(2);
    // The build takes its view and writes its file (index 2)...
    let view = follower.db.snapshot();
    let built = snapshot::build_from(&follower.db, &view, &dir.path().join("snapshots"), 1, None)
        .expect("build");
    let (built, built_path, bytes) = (built.meta, built.path, built.bytes);
    drop(view);
    // ...meanwhile the leader's snapshot (index 8) is installed...
    let mut src = std::fs::File::open(&path).expect("snapshot file");
    follower
        .install_blocking(&mut src, &meta.raft_meta())
        .expect("install");
    // ...and then the build finishes.
    let (kept, kept_path) = follower.adopt_built(built, built_path, bytes);
    assert_eq!(kept.last_log_id.map(|l| l.index), Some(8));
    assert!(kept_path.is_file(), "the installed snapshot was deleted");
    assert_eq!(follower.snapshot_info().map(|(i, _)| i), Some(8));
    let (files, tmp) = snapshot_files(dir.path());
    assert_eq!(
        files,
        vec![8],
        "the stale build must be gone, the install kept"
    );
    assert!(!tmp);
    drop(follower);
    assert_eq!(open_at(dir.path()).snapshot_info().map(|(i, _)| i), Some(8));
}

/// A received snapshot that is not the one announced (another last log id or membership)
/// is refused before it gets a snapshot's name: nothing is installed now, and nothing is
/// loaded at the next start.
#[test]
fn a_received_snapshot_that_fails_its_checks_is_never_stored() {
    let (_leader_dir, _leader, meta, path) = leader_snapshot(8);
    let (dir, follower) = node_with(2);
    let old_state = follower.view().state.clone();
    let mut announced = meta.raft_meta();
    announced.last_log_id = Some(LogId::new(CommittedLeaderId::new(1, 1), 9));
    let mut src = std::fs::File::open(&path).expect("snapshot file");
    let err = follower
        .install_blocking(&mut src, &announced)
        .expect_err("a snapshot that is not the one announced");
    assert!(err.to_string().contains("announced"), "{err}");
    assert_eq!(snapshot_files(dir.path()), (vec![], false));
    assert_eq!(follower.view().state, old_state);
    drop(follower);
    let reopened = open_at(dir.path());
    assert_eq!(reopened.view().state, old_state, "loaded at the next start");
    assert_eq!(reopened.view().commit_point.index, 2);
}

/// Loading a snapshot writes it in bounded batches, not one batch holding the whole
/// state, and still ends with exactly the snapshot's state.
#[test]
fn a_snapshot_loads_in_bounded_batches() {
    let (_leader_dir, leader, _, path) = leader_snapshot(200);
    let want = leader.view().state.clone();

    let dir = tempfile::tempdir().expect("tempdir");
    let db = open_db(&dir.path().join("db")).expect("open db");
    let limit = 1024;
    let (_, stats) = snapshot::load_into_with(&db, &path, limit).expect("load");
    assert!(stats.pairs > 200, "{stats:?}");
    assert!(stats.batches >= stats.pairs / 40, "{stats:?}");
    assert!(stats.largest_batch_bytes < 2 * limit, "{stats:?}");
    assert_eq!(snapshot::interrupted_load(&db).expect("marker"), None);
    assert_eq!(load_view(&db).expect("view").state, want);
}

/// What a node killed now would find on disk: a copy of its database files as they are
/// (every write that reached the OS, nothing that is only in memory), opened in `to`.
fn killed_copy(dir: &std::path::Path, to: &std::path::Path) -> Arc<SmShared> {
    std::fs::create_dir_all(to.join("db")).expect("copy dir");
    for file in std::fs::read_dir(dir.join("db")).expect("db dir") {
        let file = file.expect("entry");
        if file.file_name() != "LOCK" {
            std::fs::copy(file.path(), to.join("db").join(file.file_name())).expect("copy");
        }
    }
    // The copy is taken while nothing writes: the test's own writes are done, and a flush
    // it asked for has finished.
    open_at(to)
}

/// Apply batches are not written to the WAL (the Raft log is the state machine's log): a
/// crash takes the state machine back to its last flush, a consistent state at that applied
/// index, and applying the lost entries again from the log gives exactly the state it had.
/// Writes that are in the WAL (here a Raft metadata write) survive the same crash.
#[test]
fn a_crash_takes_the_state_machine_back_to_its_last_flush_and_the_log_replays_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = open_at(dir.path());
    workload(&shared, 1..=3);
    shared.flush_state().expect("flush");
    let at_flush = shared.view().state.clone();
    workload(&shared, 4..=6);
    let before_crash = shared.view().state.clone();
    let log_cf = shared.db.cf_handle(crate::store::CF_RAFT).expect("raft cf");
    shared
        .db
        .put_cf_opt(
            log_cf,
            b"in-the-wal",
            b"1",
            &crate::store::write_options(false),
        )
        .expect("a write through the WAL");
    let killed = tempfile::tempdir().expect("tempdir");
    let reopened = killed_copy(dir.path(), killed.path());
    let log_cf = reopened
        .db
        .cf_handle(crate::store::CF_RAFT)
        .expect("raft cf");
    assert_eq!(
        reopened.db.get_cf(log_cf, b"in-the-wal").expect("read"),
        Some(b"1".to_vec()),
        "the crash is not a crash: it lost a write that was in the WAL"
    );
    assert_eq!(
        reopened.view().commit_point.index,
        3,
        "apply batches reached the WAL: every applied byte is written twice"
    );
    assert_eq!(reopened.view().state, at_flush);
    workload(&reopened, 4..=6);
    assert_eq!(reopened.view().state, before_crash);
}

/// Once a snapshot is built openraft may purge the log up to it, so the applied state must be
/// durable by then without the snapshot file: a crash right after the build, with the snapshot
/// directory gone too, still finds the database at the snapshot's index or beyond.
#[test]
fn a_built_snapshot_leaves_the_state_machine_durable_up_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = open_at(dir.path());
    workload(&shared, 1..=5);
    let want = shared.view().state.clone();
    let (meta, _) = shared.build_blocking().expect("snapshot");
    assert_eq!(meta.last_log_id.map(|l| l.index), Some(5));
    workload(&shared, 6..=7);

    // The copy has no snapshot directory: nothing to load at start-up.
    let killed = tempfile::tempdir().expect("tempdir");
    let reopened = killed_copy(dir.path(), killed.path());
    assert_eq!(reopened.view().commit_point.index, 5);
    assert_eq!(reopened.view().state, want);
}

/// Apply never runs ahead of the local log's fsync (its writes skip the WAL and reach disk at
/// the next memtable flush): while the log is durable up to index 1, applying entries 2 and 3
/// waits and changes nothing; once the log reports 3 durable, the apply completes.
#[tokio::test]
async fn apply_waits_until_the_local_log_is_durable_up_to_its_entries() {
    let (_dir, _db, shared) = fresh_node();
    let (durable, log_durable) = watch::channel(0u64);
    let mut store = StateMachineStore::new(shared.clone(), log_durable);
    durable.send_replace(1);
    let entries = [
        entry(1, vec![create_topic_t()]),
        entry(2, vec![publish(0)]),
        entry(3, vec![publish(1)]),
    ];
    // Entry 1 is durable: it applies at once.
    let first = futures::stream::iter(entries[..1].iter().cloned().map(|e| Ok((e, None))));
    store.apply(first).await.expect("apply 1");
    assert_eq!(shared.view().commit_point.index, 1);

    let rest = futures::stream::iter(entries[1..].iter().cloned().map(|e| Ok((e, None))));
    let mut apply = std::pin::pin!(store.apply(rest));
    assert!(
        futures::poll!(apply.as_mut()).is_pending(),
        "applied entries the local log has not synced"
    );
    assert_eq!(shared.view().commit_point.index, 1);
    durable.send_replace(2);
    assert!(futures::poll!(apply.as_mut()).is_pending());
    durable.send_replace(3);
    apply.await.expect("apply 2 and 3");
    assert_eq!(shared.view().commit_point.index, 3);
}

/// A log of entries in memory that the state machine reads records from.
#[derive(Default)]
struct MemLog {
    entries: Mutex<std::collections::BTreeMap<u64, Entry>>,
    keep_from: AtomicU64,
}

impl records::EntrySource for MemLog {
    fn entry(&self, index: u64) -> Result<Entry, String> {
        let entries = self.entries.lock().expect("lock");
        entries
            .get(&index)
            .cloned()
            .ok_or_else(|| format!("log entry {index} is not in the log"))
    }
}

impl Entries for MemLog {
    fn keep_from(&self, index: u64) {
        self.keep_from.fetch_max(index, Ordering::SeqCst);
    }

    /// Writes the entries into segment files (a log in memory has no files to link).
    fn link_segments(&self, first: u64, last: u64, into: &std::path::Path) -> Result<(), String> {
        let entries = self.entries.lock().expect("lock");
        let mut log = crate::store::segments::SegmentLog::open(into, 0, 1 << 20)
            .map(|(log, _)| log)
            .map_err(|e| e.to_string())?;
        for index in first..=last {
            let entry = entries
                .get(&index)
                .ok_or_else(|| format!("log entry {index} is not in the log"))?;
            let bytes = crate::store::log::encode_entry(entry).map_err(|e| e.to_string())?;
            log.append(index, &bytes).map_err(|e| e.to_string())?;
        }
        log.sync().map_err(|e| e.to_string())
    }

    fn first_stored(&self) -> Option<u64> {
        self.entries.lock().expect("lock").keys().next().copied()
    }
}

/// The pairs a snapshot file holds.
fn snapshot_pairs(path: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs = Vec::new();
    let file = std::fs::File::open(path).expect("open the snapshot");
    snapshot::read(file, |k, v| {
        pairs.push((k, v));
        Ok(())
    })
    .expect("read the snapshot");
    pairs
}

/// The pairs of a snapshot as it travels: a linked one expanded with its records.
fn whole_pairs(path: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut bytes = Vec::new();
    snapshot::write_whole(path, &mut bytes).expect("the snapshot reads whole");
    let mut pairs = Vec::new();
    let (_, trailer) = snapshot::read_file(&bytes[..], |k, v| {
        pairs.push((k, v));
        Ok(())
    })
    .expect("the whole snapshot reads back");
    assert_eq!(trailer.version, snapshot::FORMAT_VERSION);
    pairs
}

/// A published record is stored as where the log holds it (a few bytes, not its value), and
/// reads, the state digest and a snapshot see it whole, exactly as on a node that stores it
/// whole; a snapshot tells the log how far back records point. A record whose entry the log
/// lost is an error that names it, not a wrong record.
#[test]
fn published_records_are_stored_as_their_place_in_the_log() {
    let (_d1, db, logged) = fresh_node();
    let log = Arc::new(MemLog::default());
    logged.attach_log(log.clone());
    let (_d2, _db2, whole) = fresh_node();
    let marker = Command::Broadcast(crate::state::Broadcast {
        topics: None,
        record: NewRecord {
            key: Some("k".into()),
            headers: vec![("h".into(), "v".into())],
            value: b"marker".to_vec(),
        },
    });
    let entries = vec![
        entry(1, vec![create_topic_t()]),
        entry(2, vec![publish(0), marker]),
        entry(3, vec![create_sub_s(), publish(1), publish(2)]),
    ];
    for e in &entries {
        log.entries
            .lock()
            .expect("lock")
            .insert(e.log_id.index, e.clone());
    }
    logged.apply_blocking(entries.clone()).expect("apply");
    whole.apply_blocking(entries).expect("apply");

    let topic = logged.view().state.topics["t"].clone();
    let cf = db.cf_handle(CF_SM).expect("sm cf");
    let stored = |offset| {
        db.get_cf(cf, keys::record(topic.id, offset))
            .expect("get")
            .expect("stored")
    };
    // Offsets 0, 2 and 3 were published, each by a command of its own (a run of one); 1 is
    // the marker, built in apply, stored whole.
    for offset in [0, 2, 3] {
        let value = stored(offset);
        assert_eq!(value[0], records::RECORD_RUN_FORMAT, "offset {offset}");
        assert!(value.len() < 32, "offset {offset}: {} bytes", value.len());
    }
    assert_eq!(stored(1)[0], records::RECORD_FORMAT);

    let read = |sm: &SmShared| sm.read_records(&topic, 0..4, 10, 1 << 20).expect("read");
    let got = read(&logged);
    assert_eq!(got, read(&whole));
    assert_eq!(
        got.iter().map(|(_, r)| r.value.clone()).collect::<Vec<_>>(),
        [&b"v0"[..], b"marker", b"v1", b"v2"]
    );
    assert_eq!(got[0].1.timestamp_ms, 1_002);
    assert_eq!(
        logged.digest().expect("digest"),
        whole.digest().expect("digest")
    );

    let (_, logged_snapshot) = logged.build_blocking().expect("build");
    let (_, whole_snapshot) = whole.build_blocking().expect("build");
    assert!(whole_pairs(&logged_snapshot) == snapshot_pairs(&whole_snapshot));
    assert_eq!(
        log.keep_from.load(Ordering::SeqCst),
        2,
        "the lowest entry pointed into"
    );

    // An entry the log lost is read from the snapshot's record files, which hold it; with
    // those gone too, the read fails and names it.
    log.entries.lock().expect("lock").remove(&3);
    let (_, linked) = snapshot::verify_file(&logged_snapshot).expect("verify");
    assert_eq!(linked.linked, Some((2, 3)));
    std::fs::remove_dir_all(snapshot::linked_dir(&logged_snapshot)).expect("remove the files");
    let err = logged
        .read_records(&topic, 2..4, 10, 1 << 20)
        .expect_err("entry 3 is gone");
    assert!(err.contains("log entry 3"), "{err}");
}

/// The same records published as record batches and as `NewRecord`s, applied to a node that
/// keeps records where the log holds them and to one without a log (which stores them whole,
/// read from the entries it is applying): every record, the digest and the snapshot read the
/// same on all three, and nothing of a batch publish is stored but where it lies. One apply
/// call of several entries in which retention reads, for its sizes, records an earlier entry
/// of the same call published.
#[test]
fn batch_publishes_read_as_the_same_records_wherever_they_are_kept() {
    let records = |from: u32, n: u32| -> Vec<NewRecord> {
        (from..from + n)
            .map(|i| NewRecord {
                key: (i % 2 == 0).then(|| format!("k{i}")),
                headers: vec![("h".into(), format!("{i}"))],
                value: if i % 3 == 0 {
                    vec![0xff, i as u8]
                } else {
                    format!("value {i}").into_bytes()
                },
            })
            .collect()
    };
    let batch = |from, n| {
        Command::PublishBatch(crate::state::PublishBatch {
            topic: "t".into(),
            batches: crate::state::encode_records(&records(from, n)).into(),
            producer: None,
        })
    };
    let plain = |from, n| {
        Command::Publish(Publish {
            topic: "t".into(),
            records: records(from, n),
            producer: None,
        })
    };
    // At most 60 bytes: the publishes of entries 3 and 4 push records of entry 2 out.
    let create = Command::CreateTopic(CreateTopic {
        name: "t".into(),
        settings: TopicSettings {
            max_bytes: Some(60),
            ..Default::default()
        },
    });
    let entries = |publish: &dyn Fn(u32, u32) -> Command| {
        vec![
            entry(1, vec![create.clone()]),
            entry(2, vec![publish(0, 4), create_sub_s()]),
            entry(3, vec![publish(4, 2), publish(6, 3)]),
            entry(4, vec![publish(9, 1)]),
        ]
    };
    let (batched_entries, plain_entries) = (entries(&batch), entries(&plain));
    let node = |entries: &[Entry], logged: bool| {
        let (dir, db, shared) = fresh_node();
        let log = Arc::new(MemLog::default());
        if logged {
            shared.attach_log(log.clone());
            for e in entries {
                log.entries
                    .lock()
                    .expect("lock")
                    .insert(e.log_id.index, e.clone());
            }
        }
        shared.apply_blocking(entries.to_vec()).expect("apply");
        (dir, db, shared, log)
    };
    let (_d1, db, batched, log) = node(&batched_entries, true);
    let (_d2, _, plain, _) = node(&plain_entries, true);
    let (_d3, _, whole, _) = node(&batched_entries, false);

    let topic = batched.view().state.topics["t"].clone();
    assert!(
        topic.first_offset > 0,
        "retention removed the first records"
    );
    // One key per command's records left (the first one's: the rest of a run that retention
    // cut into starts at the topic's first offset), each a run.
    let cf = db.cf_handle(CF_SM).expect("sm cf");
    let keys: Vec<(u64, u8)> = db
        .iterator_cf(
            cf,
            IteratorMode::From(&keys::record(topic.id, 0), Direction::Forward),
        )
        .map(|item| item.expect("read"))
        .map_while(|(k, v)| Some((keys::parse_record(&k)?.1, v[0])))
        .collect();
    let starts = [0, 4, 6, 9].into_iter().filter(|o| *o > topic.first_offset);
    let want: Vec<(u64, u8)> = std::iter::once(topic.first_offset)
        .chain(starts)
        .map(|o| (o, records::RECORD_RUN_FORMAT))
        .collect();
    assert_eq!(keys, want);
    let read = |sm: &SmShared| {
        sm.read_records(&topic, topic.first_offset..topic.next_offset, 100, 1 << 20)
            .expect("read")
    };
    let got = read(&batched);
    assert_eq!(got.len() as u64, topic.next_offset - topic.first_offset);
    assert_eq!(got, read(&plain));
    assert_eq!(got, read(&whole));
    assert_eq!(got.last().expect("a record").1.value, [0xff, 9]);
    assert_eq!(
        batched.digest().expect("digest"),
        plain.digest().expect("digest")
    );
    assert_eq!(
        batched.digest().expect("digest"),
        whole.digest().expect("digest")
    );
    let (_, batched_snapshot) = batched.build_blocking().expect("build");
    let (_, whole_snapshot) = whole.build_blocking().expect("build");
    assert!(whole_pairs(&batched_snapshot) == snapshot_pairs(&whole_snapshot));
    let first_entry = match topic.first_offset {
        0..4 => 2,
        4..9 => 3,
        _ => 4,
    };
    assert_eq!(log.keep_from.load(Ordering::SeqCst), first_entry);
}

/// A snapshot brings records in whole: once one is installed, the log may let go of every
/// entry up to it.
#[test]
fn an_installed_snapshot_lets_the_log_go_up_to_it() {
    let (_leader_dir, leader) = node_with(5);
    let (meta, path) = leader.build_blocking().expect("build");
    let (_dir, _db, follower) = fresh_node();
    let log = Arc::new(MemLog::default());
    follower.attach_log(log.clone());
    let mut file = std::fs::File::open(&path).expect("open");
    follower
        .install_blocking(&mut file, &meta.raft_meta())
        .expect("install");
    assert_eq!(log.keep_from.load(Ordering::SeqCst), 6);
}

/// At start-up, a log that no longer holds the entry a topic's first record points into is a
/// store that lost data; records stored whole need nothing from the log.
#[test]
fn start_up_finds_a_log_that_lost_what_records_point_into() {
    let (_dir, db, shared) = fresh_node();
    // Stored whole (no log attached yet): the log is not needed.
    shared
        .apply_blocking(vec![
            entry(1, vec![create_topic_t()]),
            entry(2, vec![publish(0)]),
        ])
        .expect("apply");
    assert_eq!(records::check_log_holds(&db, None, None), Ok(()));

    let (_dir, db, shared) = fresh_node();
    let log = Arc::new(MemLog::default());
    shared.attach_log(log.clone());
    let entries = vec![entry(1, vec![create_topic_t()]), entry(2, vec![publish(0)])];
    shared.apply_blocking(entries).expect("apply");
    assert_eq!(records::check_log_holds(&db, Some(1), None), Ok(()));
    assert_eq!(records::check_log_holds(&db, Some(2), None), Ok(()));
    for lost in [Some(3), None] {
        let err = records::check_log_holds(&db, lost, None).expect_err("entry 2 is gone");
        assert!(err.contains("log entry 2"), "{err}");
    }
}

/// Records published in batches of every size, trimmed from the front at every point (in the
/// same apply call as their publish or a later one, inside a run or at its edge), read back
/// from every offset the same as on a node that stores them whole, and the digest and the
/// snapshot the same too; every key left is a run, at most one per publish.
#[test]
fn runs_of_published_records_trim_and_read_as_records_stored_whole() {
    let batch = |from: u32, n: u32| {
        let records: Vec<NewRecord> = (from..from + n)
            .map(|i| NewRecord {
                key: None,
                headers: vec![],
                value: format!("value {i}").into_bytes(),
            })
            .collect();
        Command::PublishBatch(crate::state::PublishBatch {
            topic: "t".into(),
            batches: crate::state::encode_records(&records).into(),
            producer: None,
        })
    };
    for seed in 1..=12u64 {
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut next = |below: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % below
        };
        let max_records = 1 + next(40);
        let create = Command::CreateTopic(CreateTopic {
            name: "t".into(),
            settings: TopicSettings {
                max_records: Some(max_records),
                ..Default::default()
            },
        });
        let mut entries = vec![entry(1, vec![create])];
        let mut published = 0u32;
        for index in 2..30 {
            let commands = (0..1 + next(3))
                .map(|_| {
                    let n = 1 + next(24) as u32;
                    published += n;
                    batch(published - n, n)
                })
                .collect();
            entries.push(entry(index, commands));
        }
        let (_d1, db, logged) = fresh_node();
        let log = Arc::new(MemLog::default());
        logged.attach_log(log.clone());
        for e in &entries {
            log.entries
                .lock()
                .expect("lock")
                .insert(e.log_id.index, e.clone());
        }
        let (_d2, _, whole) = fresh_node();
        // Apply calls of 1 to 4 entries.
        let mut rest = &entries[..];
        while !rest.is_empty() {
            let (now, later) = rest.split_at((1 + next(4) as usize).min(rest.len()));
            logged.apply_blocking(now.to_vec()).expect("apply");
            whole.apply_blocking(now.to_vec()).expect("apply");
            rest = later;
        }
        let topic = logged.view().state.topics["t"].clone();
        assert_eq!(topic.next_offset, u64::from(published), "seed {seed}");
        assert_eq!(topic.records(), max_records.min(u64::from(published)));
        for from in topic.first_offset..topic.next_offset {
            let read = |sm: &SmShared| {
                sm.read_records(&topic, from..topic.next_offset, 1_000, 1 << 20)
                    .expect("read")
            };
            let got = read(&logged);
            assert_eq!(got, read(&whole), "seed {seed}, from {from}");
            assert_eq!(got.len() as u64, topic.next_offset - from);
            assert_eq!(got[0].1.value, format!("value {from}").into_bytes());
        }
        assert_eq!(
            logged.digest().expect("digest"),
            whole.digest().expect("digest"),
            "seed {seed}"
        );
        let cf = db.cf_handle(CF_SM).expect("sm cf");
        let stored: Vec<u8> = db
            .iterator_cf(
                cf,
                IteratorMode::From(&keys::record(topic.id, 0), Direction::Forward),
            )
            .map(|item| item.expect("read"))
            .map_while(|(k, v)| keys::parse_record(&k).map(|_| v[0]))
            .collect();
        assert!(stored.iter().all(|f| *f == records::RECORD_RUN_FORMAT));
        assert!(stored.len() as u64 <= topic.records());
        let (_, logged_snapshot) = logged.build_blocking().expect("build");
        let (_, whole_snapshot) = whole.build_blocking().expect("build");
        assert!(whole_pairs(&logged_snapshot) == snapshot_pairs(&whole_snapshot));
    }
}

/// A topic deleted in the same apply call that published a batch to it keeps none of that
/// batch's records: the run is written before the topic's records are removed, and the state
/// is what a node that stores records whole holds.
#[test]
fn a_topic_deleted_in_the_apply_that_published_to_it_keeps_no_run() {
    let records: Vec<NewRecord> = (0..5)
        .map(|i| NewRecord {
            key: None,
            headers: vec![],
            value: format!("value {i}").into_bytes(),
        })
        .collect();
    let publish = Command::PublishBatch(crate::state::PublishBatch {
        topic: "t".into(),
        batches: crate::state::encode_records(&records).into(),
        producer: None,
    });
    let delete = Command::DeleteTopic(crate::state::DeleteTopic { name: "t".into() });
    let entries = vec![
        entry(1, vec![create_topic_t()]),
        entry(2, vec![publish, delete]),
    ];
    let (_d1, db, logged) = fresh_node();
    let log = Arc::new(MemLog::default());
    logged.attach_log(log.clone());
    for e in &entries {
        log.entries
            .lock()
            .expect("lock")
            .insert(e.log_id.index, e.clone());
    }
    let (_d2, _, whole) = fresh_node();
    logged.apply_blocking(entries.clone()).expect("apply");
    whole.apply_blocking(entries).expect("apply");
    let cf = db.cf_handle(CF_SM).expect("sm cf");
    let left: Vec<Vec<u8>> = db
        .iterator_cf(cf, IteratorMode::Start)
        .map(|item| item.expect("read").0.to_vec())
        .filter(|k| keys::parse_record(k).is_some())
        .collect();
    assert!(left.is_empty(), "record keys left: {left:?}");
    assert_eq!(
        logged.digest().expect("digest"),
        whole.digest().expect("digest")
    );
}

/// A read of the newest topic does not walk the deleted keys around its records: after them
/// lie the subscriptions', and a subscription deleted with its topic (here after 2,000 leases
/// and acks) leaves its keys in place until compaction drops them; before them lie the deleted
/// topic's records. Read unbounded, every read at the topic's end stepped over all those after
/// it (readers following a producer ran several times slower after a consume-and-ack run on the
/// same cluster), and a read from its first key, found going back, all those before it.
#[test]
fn a_read_at_a_topics_end_skips_no_deleted_keys_after_it() {
    use crate::state::{DeleteTopic, Outcome, ReceiptAction, SettleReceipts};
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
    let (_dir, _db, shared) = fresh_node();
    let topic = |name: &str| {
        Command::CreateTopic(CreateTopic {
            name: name.into(),
            settings: TopicSettings::default(),
        })
    };
    let publish_to = |name: &str, n: usize| {
        Command::Publish(Publish {
            topic: name.into(),
            records: (0..n)
                .map(|i| NewRecord {
                    key: None,
                    headers: vec![],
                    value: format!("v{i}").into_bytes(),
                })
                .collect(),
            producer: None,
        })
    };
    let Command::CreateSubscription(mut sub_on_a) = create_sub_s() else {
        unreachable!()
    };
    sub_on_a.topic = "a".into();
    let sub = SubRef {
        topic: "a".into(),
        name: "s".into(),
    };
    // Topic `a` and its subscription first, then `t`: `t`'s records are the last record keys.
    shared
        .apply_blocking(vec![
            entry(
                1,
                vec![
                    topic("a"),
                    Command::CreateSubscription(sub_on_a),
                    topic("t"),
                ],
            ),
            entry(2, vec![publish_to("a", 2_000), publish_to("t", 3)]),
        ])
        .expect("apply");
    let mut index = 3;
    for _ in 0..2 {
        let pull = Command::Pull(Pull {
            sub: sub.clone(),
            max: 1_000,
            ack_timeout_ms: None,
        });
        let resp = shared
            .apply_blocking(vec![entry(index, vec![pull])])
            .expect("pull");
        let Ok(Outcome::Pulled(delivered)) = &resp[0].results[0] else {
            panic!("pull answered {:?}", resp[0].results);
        };
        assert_eq!(delivered.len(), 1_000);
        let ack = Command::SettleReceipts(SettleReceipts {
            sub: sub.clone(),
            action: ReceiptAction::Ack,
            receipts: delivered.iter().map(|d| d.receipt).collect(),
        });
        shared
            .apply_blocking(vec![entry(index + 1, vec![ack])])
            .expect("ack");
        index += 2;
    }
    let delete = Command::DeleteTopic(DeleteTopic { name: "a".into() });
    shared
        .apply_blocking(vec![entry(index, vec![delete])])
        .expect("delete");

    let t = shared.view().state.topics["t"].clone();
    assert_eq!((t.first_offset, t.next_offset), (0, 3));
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut perf = PerfContext::default();
    // The last record, and nothing yet at the end (what a reader following a producer asks),
    // then from within the topic and from its first key.
    for (offsets, want) in [(2..3, 1), (3..3, 0), (1..3, 2), (0..3, 3)] {
        perf.reset();
        let got = shared
            .read_records(&t, offsets.clone(), 100, 1 << 20)
            .expect("read");
        // Every key the read stepped over, live or deleted (all of them are in the memtable).
        let steps = perf.metric(PerfMetric::NextOnMemtableCount)
            + perf.metric(PerfMetric::PrevOnMemtableCount);
        assert_eq!(got.len(), want, "{offsets:?}");
        assert!(
            steps < 20,
            "reading {offsets:?} stepped over {steps} keys: {}",
            perf.report(true)
        );
    }
    set_perf_stats(PerfStatsLevel::Disable);
}
