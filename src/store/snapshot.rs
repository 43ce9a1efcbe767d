//! Snapshot files: the `sm` column family as of one applied index, in one checksummed file.
//!
//! Layout (all integers little-endian):
//! `b"RAFTQSNP"`, `u32` format version, `u64` meta length, meta (codec-encoded
//! [`FileMeta`]), then key/value pairs as `u32` key length, key, `u32` value length,
//! value; then `u32::MAX`, the `u64` pair count, and a `u32` CRC-32 of every byte before it.
//!
//! Format 2 (written today) holds the `sm` family's values as stored, each behind its format
//! byte (`values`), except that each subscription is one whole value, leases included, as data
//! directory format 3 stored it (a store of today keeps its pieces apart: `subs`). Format 1
//! held the applied id, membership and clock bare, and reading one gives them their format
//! byte, so a format 1 file (an older node's snapshot, a backup) loads into a store of today.
//!
//! A snapshot is written to `NAME.tmp`, fsynced, renamed to `NAME`, and the directory is
//! fsynced: a crash at any step leaves the old snapshot or the new one, never a torn one.
//! Files are read through a streaming reader and never held in memory whole.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crc32fast::Hasher;
use rocksdb::{IteratorMode, ReadOptions, WriteBatch, DB};

use super::datadir::sync_dir;
use super::faults;
use super::{keys, subs, values, CF_SM};
use crate::codec;
use crate::raft::{LogId, SnapshotMeta, StoredMembership};

/// What a snapshot file says about itself: the last applied log id and the membership it
/// holds, and its id (which names the file). Encoded field for field as openraft 0.9 encoded
/// its snapshot meta, so files written by any raftq version read the same.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileMeta {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    pub snapshot_id: String,
}

impl FileMeta {
    /// The meta as openraft knows it (without the id).
    pub fn raft_meta(&self) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: self.last_log_id,
            last_membership: self.last_membership.clone(),
        }
    }
}

const MAGIC: &[u8; 8] = b"RAFTQSNP";
/// Current snapshot format. Unknown versions are refused with a clear error.
pub const FORMAT_VERSION: u32 = 2;
/// The format before the state's metadata values carried a format byte; still read.
const FORMAT_BARE_META: u32 = 1;
const END_MARK: u32 = u32::MAX;
/// Upper bound for one key or value in a snapshot (a record is at most 16 MiB plus framing).
const MAX_ITEM: u32 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot I/O: {0}")]
    Io(#[from] io::Error),
    #[error("snapshot is not a raftq snapshot (bad magic)")]
    BadMagic,
    #[error(
        "snapshot has format version {0}; this raftq reads versions {FORMAT_BARE_META} to \
         {FORMAT_VERSION}"
    )]
    UnknownVersion(u32),
    #[error("snapshot is corrupt: {0}")]
    Corrupt(String),
    #[error("storage: {0}")]
    Db(#[from] rocksdb::Error),
}

/// A subscription that cannot be put together or taken apart (`subs`).
impl From<String> for SnapshotError {
    fn from(detail: String) -> Self {
        SnapshotError::Corrupt(detail)
    }
}

/// Writes the bytes it is given to `inner` and folds them into a CRC.
struct CrcWriter<W> {
    inner: W,
    crc: Hasher,
    bytes: u64,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads from `inner`, folding every byte into a CRC.
struct CrcReader<R> {
    inner: R,
    crc: Hasher,
}

impl<R: Read> Read for CrcReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_item(r: &mut impl Read, len: u32) -> Result<Vec<u8>, SnapshotError> {
    if len > MAX_ITEM {
        return Err(SnapshotError::Corrupt(format!(
            "item of {len} bytes exceeds the limit"
        )));
    }
    let mut v = vec![0u8; len as usize];
    r.read_exact(&mut v)?;
    Ok(v)
}

/// The final file name of a snapshot.
pub fn file_name(meta: &FileMeta) -> String {
    format!("snap-{}.snap", meta.snapshot_id)
}

/// Builds a snapshot of the `sm` column family from a consistent RocksDB view (apply may go
/// on meanwhile) and writes it durably into `dir`. Returns its meta, path and size. Every
/// record must be stored whole (a state machine with no log: tools and tests).
pub fn build(
    db: &DB,
    dir: &Path,
    id_suffix: u64,
) -> Result<(FileMeta, PathBuf, u64), SnapshotError> {
    let records = super::records::Reader::new(None);
    build_from(db, &db.snapshot(), dir, id_suffix, &records)
}

/// [`build`] from the RocksDB view `view`, taken by the caller (at a moment when the state
/// machine was whole: never in the middle of a snapshot install).
pub fn build_from(
    db: &DB,
    view: &rocksdb::Snapshot<'_>,
    dir: &Path,
    id_suffix: u64,
    records: &super::records::Reader<'_>,
) -> Result<(FileMeta, PathBuf, u64), SnapshotError> {
    fs::create_dir_all(dir)?;
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| SnapshotError::Corrupt("column family sm missing".into()))?;
    let get = |key: &[u8]| view.get_cf(cf, key);
    let last_log_id: Option<LogId> = match get(keys::APPLIED)? {
        Some(b) => values::decode(&b).map_err(SnapshotError::Corrupt)?,
        None => None,
    };
    let membership: StoredMembership = match get(keys::MEMBERSHIP)? {
        Some(b) => values::decode(&b).map_err(SnapshotError::Corrupt)?,
        None => StoredMembership::default(),
    };
    let index = last_log_id.as_ref().map_or(0, |l| l.index);
    let meta = FileMeta {
        last_log_id,
        last_membership: membership,
        snapshot_id: format!("{index:020}-{id_suffix}"),
    };
    let name = file_name(&meta);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut w = CrcWriter {
        inner: BufWriter::new(File::create(&tmp)?),
        crc: Hasher::new(),
        bytes: 0,
    };
    let meta_bytes = codec::encode(&meta).map_err(|e| SnapshotError::Corrupt(e.to_string()))?;
    w.write_all(MAGIC)?;
    w.write_all(&FORMAT_VERSION.to_le_bytes())?;
    w.write_all(&(meta_bytes.len() as u64).to_le_bytes())?;
    w.write_all(&meta_bytes)?;
    if get(keys::INSTALLING)?.is_some() {
        return Err(SnapshotError::Corrupt(
            "the state machine is in the middle of a snapshot install".into(),
        ));
    }
    let mut opts = ReadOptions::default();
    opts.set_snapshot(view);
    let mut count = 0u64;
    // Subscriptions go in whole, as every snapshot format holds them (`subs`).
    let mut put = |k: &[u8], v: &[u8]| -> Result<(), SnapshotError> {
        w.write_all(&(k.len() as u32).to_le_bytes())?;
        w.write_all(k)?;
        w.write_all(&(v.len() as u32).to_le_bytes())?;
        w.write_all(v)?;
        count += 1;
        Ok(())
    };
    let mut whole = subs::Whole::default();
    // Records go in whole too, read from the log where the state machine keeps their place.
    for item in db.iterator_cf_opt(cf, opts, IteratorMode::Start) {
        let (k, v) = item?;
        let v = records.whole(&k, &v).map_err(SnapshotError::Corrupt)?;
        whole.push(&k, &v, &mut put)?;
    }
    whole.finish(&mut put)?;
    w.write_all(&END_MARK.to_le_bytes())?;
    w.write_all(&count.to_le_bytes())?;
    let crc = w.crc.clone().finalize();
    let mut inner = w.inner.into_inner().map_err(|e| e.into_error())?;
    inner.write_all(&crc.to_le_bytes())?;
    faults::point(faults::BUILD_WRITTEN)?;
    inner.sync_all()?;
    faults::point(faults::BUILD_SYNCED)?;
    let bytes = w.bytes + 4;
    drop(inner);
    let path = dir.join(&name);
    fs::rename(&tmp, &path)?;
    faults::point(faults::BUILD_RENAMED)?;
    sync_dir(dir)?;
    Ok((meta, path, bytes))
}

/// Reads a snapshot stream through to the end, checking magic, version, framing, count and
/// checksum; calls `pair` for every key/value, as stored today (a format 1 file's bare values
/// get their format byte). Returns the meta.
pub fn read(
    r: impl Read,
    mut pair: impl FnMut(Vec<u8>, Vec<u8>) -> Result<(), SnapshotError>,
) -> Result<FileMeta, SnapshotError> {
    let mut r = CrcReader {
        inner: BufReader::new(r),
        crc: Hasher::new(),
    };
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = read_u32(&mut r)?;
    if !(FORMAT_BARE_META..=FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::UnknownVersion(version));
    }
    let meta_len = read_u64(&mut r)?;
    if meta_len > MAX_ITEM as u64 {
        return Err(SnapshotError::Corrupt(format!("meta of {meta_len} bytes")));
    }
    let meta_bytes = read_item(&mut r, meta_len as u32)?;
    let meta: FileMeta =
        codec::decode(&meta_bytes).map_err(|e| SnapshotError::Corrupt(format!("meta: {e}")))?;
    let mut count = 0u64;
    loop {
        let klen = read_u32(&mut r)?;
        if klen == END_MARK {
            break;
        }
        let k = read_item(&mut r, klen)?;
        let vlen = read_u32(&mut r)?;
        let v = read_item(&mut r, vlen)?;
        let v = match version == FORMAT_BARE_META && values::is_bare_sm_key(&k) {
            true => values::with_format_byte(&v),
            false => v,
        };
        pair(k, v)?;
        count += 1;
    }
    let want = read_u64(&mut r)?;
    if want != count {
        return Err(SnapshotError::Corrupt(format!(
            "{count} pairs, trailer says {want}"
        )));
    }
    let computed = r.crc.clone().finalize();
    let stored = read_u32(&mut r.inner)?;
    if stored != computed {
        return Err(SnapshotError::Corrupt("checksum mismatch".into()));
    }
    let mut rest = [0u8; 1];
    if r.inner.read(&mut rest)? != 0 {
        return Err(SnapshotError::Corrupt("bytes after the checksum".into()));
    }
    Ok(meta)
}

/// Checks a whole snapshot file and returns its meta.
pub fn verify(path: &Path) -> Result<FileMeta, SnapshotError> {
    read(File::open(path)?, |_, _| Ok(()))
}

/// Copies a received snapshot stream into `dir` durably after checking it whole and checking
/// that it is the snapshot announced (`want`: its last log id and membership). Nothing that
/// fails a check ever gets a snapshot's final name: only a renamed file is loaded at start-up.
/// Returns the meta and the final path.
pub fn store_received(
    src: &mut File,
    dir: &Path,
    want: &SnapshotMeta,
) -> Result<(FileMeta, PathBuf), SnapshotError> {
    use std::io::Seek;
    fs::create_dir_all(dir)?;
    src.seek(io::SeekFrom::Start(0))?;
    let meta = read(&mut *src, |_, _| Ok(()))?;
    if meta.raft_meta() != *want {
        return Err(SnapshotError::Corrupt(format!(
            "received snapshot {} holds up to {:?} with membership {:?}, but was announced as \
             up to {:?} with membership {:?}",
            meta.snapshot_id,
            meta.last_log_id,
            meta.last_membership,
            want.last_log_id,
            want.last_membership
        )));
    }
    let name = file_name(&meta);
    let tmp = dir.join(format!("{name}.tmp"));
    src.seek(io::SeekFrom::Start(0))?;
    let mut out = File::create(&tmp)?;
    let stored = (|| {
        io::copy(src, &mut out)?;
        faults::point(faults::RECEIVE_WRITTEN)?;
        out.sync_all()?;
        faults::point(faults::RECEIVE_SYNCED)?;
        // What reached the disk is checked again, whole, before it gets its final name.
        let again = verify(&tmp)?;
        if again != meta {
            return Err(SnapshotError::Corrupt(
                "the stored copy differs from the received snapshot".into(),
            ));
        }
        Ok::<_, SnapshotError>(())
    })();
    drop(out);
    if let Err(e) = stored {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let path = dir.join(&name);
    fs::rename(&tmp, &path)?;
    faults::point(faults::RECEIVE_RENAMED)?;
    sync_dir(dir)?;
    Ok((meta, path))
}

/// Bytes of key/value pairs written to RocksDB in one batch while loading a snapshot: memory
/// for a load is bounded by this, not by the size of the state.
pub const LOAD_BATCH_BYTES: usize = 4 << 20;

/// What a load did, for tests and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Key/value pairs written.
    pub pairs: u64,
    /// RocksDB write batches of pairs.
    pub batches: u64,
    /// Bytes of the largest of them.
    pub largest_batch_bytes: usize,
}

/// Replaces the whole `sm` column family with the snapshot at `path`, which must be a complete
/// snapshot (verified when it got its name), in batches of about [`LOAD_BATCH_BYTES`].
///
/// All or nothing across a crash: the first batch, synced, clears the family and writes the
/// marker `m:installing` naming the snapshot file; the last, synced, removes the marker. A
/// state machine found with the marker at start-up is half-loaded, and
/// [`crate::store::SmShared::open`] loads the snapshot it names again.
pub fn load_into(db: &DB, path: &Path) -> Result<FileMeta, SnapshotError> {
    load_into_with(db, path, LOAD_BATCH_BYTES).map(|(meta, _)| meta)
}

/// [`load_into`] with batches of `batch_bytes`.
pub fn load_into_with(
    db: &DB,
    path: &Path,
    batch_bytes: usize,
) -> Result<(FileMeta, LoadStats), SnapshotError> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| SnapshotError::Corrupt("column family sm missing".into()))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| SnapshotError::Corrupt(format!("bad snapshot path {}", path.display())))?;
    let mut start = WriteBatch::default();
    start.delete_range_cf(cf, [0u8].as_slice(), [0xffu8; 32].as_slice());
    start.put_cf(cf, keys::INSTALLING, name.as_bytes());
    db.write_opt(start, &super::write_options(true))?;

    let mut stats = LoadStats::default();
    let mut batch = WriteBatch::default();
    let mut bytes = 0usize;
    let unsynced = super::write_options(false);
    let meta = read(File::open(path)?, |k, v| {
        if k.as_slice() == keys::INSTALLING {
            return Err(SnapshotError::Corrupt(
                "the snapshot holds an install marker".into(),
            ));
        }
        bytes += k.len() + v.len();
        subs::split(k, v, |k, v| batch.put_cf(cf, k, v))?;
        stats.pairs += 1;
        if bytes >= batch_bytes {
            db.write_opt(std::mem::take(&mut batch), &unsynced)?;
            stats.batches += 1;
            stats.largest_batch_bytes = stats.largest_batch_bytes.max(bytes);
            bytes = 0;
            if stats.batches == 1 {
                // The family now holds the snapshot's applied log id and part of its state.
                faults::point(faults::INSTALL_LOADING)?;
            }
        }
        Ok(())
    })?;
    if bytes > 0 {
        db.write_opt(batch, &unsynced)?;
        stats.batches += 1;
        stats.largest_batch_bytes = stats.largest_batch_bytes.max(bytes);
    }
    // Synced: makes every batch before it durable too (one WAL), then the state is whole.
    let mut end = WriteBatch::default();
    end.delete_cf(cf, keys::INSTALLING);
    db.write_opt(end, &super::write_options(true))?;
    Ok((meta, stats))
}

/// The snapshot file name an interrupted load left in the `sm` family, if any.
pub fn interrupted_load(db: &DB) -> Result<Option<String>, SnapshotError> {
    let cf = db
        .cf_handle(CF_SM)
        .ok_or_else(|| SnapshotError::Corrupt("column family sm missing".into()))?;
    match db.get_cf(cf, keys::INSTALLING)? {
        None => Ok(None),
        Some(name) => String::from_utf8(name)
            .map(Some)
            .map_err(|_| SnapshotError::Corrupt("the install marker is not a file name".into())),
    }
}

/// The newest complete snapshot in `dir`, if any; removes leftovers of interrupted writes.
pub fn newest(dir: &Path) -> Result<Option<(FileMeta, PathBuf)>, SnapshotError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut best: Option<(FileMeta, PathBuf)> = None;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if name.ends_with(".tmp") {
            // A write or a receive that never finished: never used, safe to drop.
            let _ = fs::remove_file(&path);
            continue;
        }
        if !name.ends_with(".snap") {
            continue;
        }
        let meta = verify(&path)?;
        if best
            .as_ref()
            .is_none_or(|(b, _)| meta.last_log_id > b.last_log_id)
        {
            best = Some((meta, path));
        }
    }
    Ok(best)
}

/// Removes every snapshot file in `dir` except `keep`.
pub fn remove_others(dir: &Path, keep: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path != keep && path.extension().is_some_and(|e| e == "snap") {
                let _ = fs::remove_file(path);
            }
        }
    }
}
