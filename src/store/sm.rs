//! The state machine store: applies committed entries through the pure [`crate::state`]
//! functions and persists what they emit in one RocksDB write batch per apply call.
//!
//! Readers (HTTP handlers on any node) see topic metadata from memory and records from
//! RocksDB. The write lock on the in-memory view is held across the batch write, so a reader
//! that sees `next_offset = n` always finds every record below `n` on disk.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use tokio::sync::watch;

use super::{keys, snapshot, CF_SM};
use crate::codec;
use crate::raft::{
    io_err, Entry, LogId, Snapshot, SnapshotMeta, StorageResult, StoredMembership, TypeConfig,
};
use crate::state::{
    apply_entry, pending_record, ApplyResponse, CommitPoint, LogPayload, RecordSource, SmState,
    StoredRecord, SubState, TopicMeta, Write,
};

/// Version byte in front of every stored record.
const RECORD_FORMAT: u8 = 1;

/// The applied state as readers see it.
#[derive(Debug, Default)]
pub struct SmView {
    pub state: SmState,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub commit_point: CommitPoint,
}

/// What the snapshot on disk is.
#[derive(Debug, Clone)]
struct CurrentSnapshot {
    meta: SnapshotMeta,
    path: PathBuf,
    bytes: u64,
}

/// State shared by the Raft state machine and the HTTP readers.
pub struct SmShared {
    db: Arc<DB>,
    view: RwLock<SmView>,
    /// Bumped after every apply, so long-polls wake as soon as a record is committed.
    applied_tx: watch::Sender<u64>,
    snapshot_dir: PathBuf,
    current_snapshot: Mutex<Option<CurrentSnapshot>>,
}

fn encode_record(r: &StoredRecord) -> Result<Vec<u8>, bincode::Error> {
    let mut out = Vec::with_capacity(r.value.len() + 32);
    out.push(RECORD_FORMAT);
    out.extend(codec::encode(r)?);
    Ok(out)
}

fn decode_record(bytes: &[u8]) -> Result<StoredRecord, String> {
    match bytes.split_first() {
        Some((&RECORD_FORMAT, rest)) => {
            codec::decode(rest).map_err(|e| format!("corrupt record: {e}"))
        }
        Some((v, _)) => Err(format!("record has unknown format version {v}")),
        None => Err("empty record".into()),
    }
}

/// The in-memory counters of [`SmState`] that are persisted under `m:state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum SmMeta {
    V1 {
        clock_ms: u64,
        next_topic_id: u64,
        next_sub_id: u64,
    },
}

/// Reads records for apply: writes of the same apply call first, then RocksDB.
struct DbRecords<'a> {
    db: &'a DB,
}

impl RecordSource for DbRecords<'_> {
    fn record(&self, pending: &[Write], topic_id: u64, offset: u64) -> Option<StoredRecord> {
        if let Some(r) = pending_record(pending, topic_id, offset) {
            return Some(r);
        }
        let cf = self.db.cf_handle(CF_SM)?;
        let bytes = self.db.get_cf(cf, keys::record(topic_id, offset)).ok()??;
        decode_record(&bytes).ok()
    }
}

impl SmShared {
    /// Loads the applied state from RocksDB, first bringing in the newest snapshot file if it
    /// is ahead of what the database holds (a crash between storing a received snapshot and
    /// loading it).
    pub fn open(db: Arc<DB>, snapshot_dir: PathBuf) -> anyhow::Result<Arc<SmShared>> {
        let mut current = None;
        if let Some((meta, path)) = snapshot::newest(&snapshot_dir)? {
            let applied = read_applied(&db)?;
            if meta.last_log_id > applied {
                tracing::info!(snapshot = %meta.snapshot_id, "loading snapshot newer than the state machine");
                snapshot::load_into(&db, &path)?;
            }
            let bytes = std::fs::metadata(&path)?.len();
            current = Some(CurrentSnapshot { meta, path, bytes });
        }
        let view = load_view(&db)?;
        let applied_index = view.last_applied.map_or(0, |l| l.index);
        let (applied_tx, _) = watch::channel(applied_index);
        Ok(Arc::new(SmShared {
            db,
            view: RwLock::new(view),
            applied_tx,
            snapshot_dir,
            current_snapshot: Mutex::new(current),
        }))
    }

    /// A read view of the applied state. Hold it briefly: apply waits for it.
    pub fn view(&self) -> RwLockReadGuard<'_, SmView> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn view_mut(&self) -> RwLockWriteGuard<'_, SmView> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Watch the applied index.
    pub fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// The index and size of the newest snapshot on disk.
    pub fn snapshot_info(&self) -> Option<(u64, u64)> {
        let cur = self
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cur.as_ref()
            .map(|c| (c.meta.last_log_id.map_or(0, |l| l.index), c.bytes))
    }

    /// Reads stored records of `topic` from `from` up to (excluding) `end`: at most `max`
    /// records and, after the first, at most `max_bytes` of values.
    pub fn read_records(
        &self,
        topic: &TopicMeta,
        from: u64,
        end: u64,
        max: u64,
        max_bytes: u64,
    ) -> Result<Vec<(u64, StoredRecord)>, String> {
        let cf = self.db.cf_handle(CF_SM).ok_or("column family sm missing")?;
        let start = keys::record(topic.id, from);
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
        {
            let (k, v) = item.map_err(|e| e.to_string())?;
            let Some((id, offset)) = keys::parse_record(&k) else {
                break;
            };
            if id != topic.id || offset >= end || out.len() as u64 >= max {
                break;
            }
            let rec = decode_record(&v)?;
            bytes += rec.value.len() as u64;
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push((offset, rec));
        }
        Ok(out)
    }

    /// Applies entries and persists the result; blocking.
    fn apply_blocking(&self, entries: Vec<Entry>) -> StorageResult<Vec<ApplyResponse>> {
        let cf = self.db.cf_handle(CF_SM).ok_or_else(|| {
            io_err(
                StorageIOError::write_state_machine,
                "column family sm missing",
            )
        })?;
        let mut view = self.view_mut();
        let mut writes = Vec::new();
        let mut responses = Vec::with_capacity(entries.len());
        let mut membership_changed = false;
        for entry in &entries {
            let index = entry.log_id.index;
            view.last_applied = Some(entry.log_id);
            let resp = match &entry.payload {
                EntryPayload::Blank => ApplyResponse {
                    commit_point: CommitPoint {
                        index,
                        time_ms: view.state.clock_ms,
                    },
                    results: vec![],
                },
                EntryPayload::Normal(LogPayload::V1(batch)) => apply_entry(
                    &mut view.state,
                    &DbRecords { db: &self.db },
                    index,
                    batch,
                    &mut writes,
                ),
                EntryPayload::Membership(m) => {
                    view.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    membership_changed = true;
                    ApplyResponse {
                        commit_point: CommitPoint {
                            index,
                            time_ms: view.state.clock_ms,
                        },
                        results: vec![],
                    }
                }
            };
            view.commit_point = resp.commit_point;
            responses.push(resp);
        }
        let mut batch = WriteBatch::default();
        let mut subs_touched = std::collections::BTreeSet::new();
        let enc = |e: bincode::Error| io_err(StorageIOError::write_state_machine, e);
        for w in writes {
            match w {
                Write::PutTopic(name) => {
                    if let Some(meta) = view.state.topics.get(&name) {
                        batch.put_cf(cf, keys::topic(&name), codec::encode(meta).map_err(enc)?);
                    }
                }
                Write::DeleteTopic { name, id } => {
                    batch.delete_cf(cf, keys::topic(&name));
                    batch.delete_range_cf(cf, keys::record(id, 0), keys::record(id + 1, 0));
                }
                Write::PutRecord {
                    topic_id,
                    offset,
                    record,
                } => {
                    batch.put_cf(
                        cf,
                        keys::record(topic_id, offset),
                        encode_record(&record).map_err(enc)?,
                    );
                }
                // Written once at the end, whatever number of commands touched it.
                Write::PutSub(id) => {
                    subs_touched.insert(id);
                }
                Write::DeleteSub(id) => batch.delete_cf(cf, keys::sub(id)),
            }
        }
        // Ids are never reused, so a subscription deleted in this batch is simply absent.
        for id in subs_touched {
            if let Some(sub) = view.state.subs.get(&id) {
                batch.put_cf(cf, keys::sub(id), codec::encode(sub).map_err(enc)?);
            }
        }
        let sm_meta = SmMeta::V1 {
            clock_ms: view.state.clock_ms,
            next_topic_id: view.state.next_topic_id,
            next_sub_id: view.state.next_sub_id,
        };
        batch.put_cf(cf, keys::SM_META, codec::encode(&sm_meta).map_err(enc)?);
        batch.put_cf(
            cf,
            keys::APPLIED,
            codec::encode(&view.last_applied).map_err(enc)?,
        );
        if membership_changed {
            batch.put_cf(
                cf,
                keys::MEMBERSHIP,
                codec::encode(&view.membership).map_err(enc)?,
            );
        }
        // Not synced: every applied entry is already fsynced in the Raft log, and the log and
        // the state machine share one WAL, so recovery replays a consistent prefix.
        self.db
            .write_opt(batch, &super::write_options(false))
            .map_err(|e| io_err(StorageIOError::write_state_machine, e))?;
        let applied = view.commit_point.index;
        drop(view);
        self.applied_tx.send_replace(applied);
        Ok(responses)
    }

    /// Replaces the whole state with the snapshot at `path`. The view lock is held across
    /// the load and the reload, so readers never see memory and disk disagree.
    fn load_snapshot(&self, path: &std::path::Path) -> Result<(), snapshot::SnapshotError> {
        let mut view = self.view_mut();
        snapshot::load_into(&self.db, path)?;
        *view = load_view(&self.db).map_err(|e| snapshot::SnapshotError::Corrupt(e.to_string()))?;
        let applied = view.last_applied.map_or(0, |l| l.index);
        drop(view);
        self.applied_tx.send_replace(applied);
        Ok(())
    }
}

fn read_applied(db: &DB) -> anyhow::Result<Option<LogId>> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| anyhow::anyhow!("column family sm missing"))?;
    Ok(match db.get_cf(cf, keys::APPLIED)? {
        Some(b) => codec::decode(&b)?,
        None => None,
    })
}

/// Rebuilds the in-memory view from the `sm` column family.
fn load_view(db: &DB) -> anyhow::Result<SmView> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| anyhow::anyhow!("column family sm missing"))?;
    let mut view = SmView {
        last_applied: read_applied(db)?,
        ..Default::default()
    };
    if let Some(b) = db.get_cf(cf, keys::MEMBERSHIP)? {
        view.membership = codec::decode(&b)?;
    }
    if let Some(b) = db.get_cf(cf, keys::SM_META)? {
        let SmMeta::V1 {
            clock_ms,
            next_topic_id,
            next_sub_id,
        } = codec::decode(&b)?;
        view.state.clock_ms = clock_ms;
        view.state.next_topic_id = next_topic_id;
        view.state.next_sub_id = next_sub_id;
    }
    let prefix = [keys::SUB_PREFIX];
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item?;
        if k.first() != Some(&keys::SUB_PREFIX) {
            break;
        }
        let sub: SubState =
            codec::decode(&v).map_err(|e| anyhow::anyhow!("corrupt subscription {k:?}: {e}"))?;
        view.state.restore_sub(sub);
    }
    let prefix = [keys::TOPIC_PREFIX];
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item?;
        if k.first() != Some(&keys::TOPIC_PREFIX) {
            break;
        }
        let name = String::from_utf8(k[1..].to_vec())?;
        let meta: TopicMeta = codec::decode(&v)
            .map_err(|e| anyhow::anyhow!("corrupt metadata of topic {name:?}: {e}"))?;
        view.state.topics.insert(name, meta);
    }
    view.commit_point = CommitPoint {
        index: view.last_applied.map_or(0, |l| l.index),
        time_ms: view.state.clock_ms,
    };
    Ok(view)
}

/// The openraft state machine: a handle on [`SmShared`].
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<SmShared>,
}

impl StateMachineStore {
    pub fn new(shared: Arc<SmShared>) -> Self {
        StateMachineStore { shared }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<SmShared>) -> StorageResult<T> + Send + 'static,
    ) -> StorageResult<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(shared))
            .await
            .map_err(|e| io_err(StorageIOError::write_state_machine, e))?
    }
}

fn snapshot_id_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot> {
        let (meta, path) = self
            .blocking(|shared| {
                let (meta, path, bytes) =
                    snapshot::build(&shared.db, &shared.snapshot_dir, snapshot_id_suffix())
                        .map_err(|e| io_err(crate::raft::snap_write, e))?;
                let mut cur = shared
                    .current_snapshot
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                *cur = Some(CurrentSnapshot {
                    meta: meta.clone(),
                    path: path.clone(),
                    bytes,
                });
                snapshot::remove_others(&shared.snapshot_dir, &path);
                tracing::info!(snapshot = %meta.snapshot_id, bytes, "snapshot built");
                Ok((meta, path))
            })
            .await?;
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| io_err(crate::raft::snap_read, e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        let view = self.shared.view();
        Ok((view.last_applied, view.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<ApplyResponse>>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.blocking(move |shared| shared.apply_blocking(entries))
            .await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<tokio::fs::File>> {
        let dir = self.shared.snapshot_dir.clone();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| io_err(crate::raft::snap_write, e))?;
        let path = dir.join(format!("incoming-{}.tmp", snapshot_id_suffix()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| io_err(crate::raft::snap_write, e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> StorageResult<()> {
        let mut src = snapshot.into_std().await;
        let want = meta.clone();
        self.blocking(move |shared| {
            let fail = |e: snapshot::SnapshotError| io_err(crate::raft::snap_write, e);
            src.sync_all()
                .map_err(|e| io_err(crate::raft::snap_write, e))?;
            let (got, path) =
                snapshot::store_received(&mut src, &shared.snapshot_dir).map_err(fail)?;
            if got.last_log_id != want.last_log_id || got.snapshot_id != want.snapshot_id {
                return Err(io_err(
                    crate::raft::snap_write,
                    format!(
                        "received snapshot {} does not match its meta {}",
                        got.snapshot_id, want.snapshot_id
                    ),
                ));
            }
            let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            shared.load_snapshot(&path).map_err(fail)?;
            let mut cur = shared
                .current_snapshot
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *cur = Some(CurrentSnapshot {
                meta: got,
                path: path.clone(),
                bytes,
            });
            snapshot::remove_others(&shared.snapshot_dir, &path);
            Ok(())
        })
        .await
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot>> {
        let cur = self
            .shared
            .current_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match cur {
            None => Ok(None),
            Some(c) => {
                let file = tokio::fs::File::open(&c.path)
                    .await
                    .map_err(|e| io_err(crate::raft::snap_read, e))?;
                Ok(Some(Snapshot {
                    meta: c.meta,
                    snapshot: Box::new(file),
                }))
            }
        }
    }
}
