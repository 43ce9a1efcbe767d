//! Snapshot files: the `sm` column family as of one applied index, in one checksummed file.
//!
//! Layout (all integers little-endian):
//! `b"RAFTQSNP"`, `u32` format version, `u64` meta length, meta (codec-encoded
//! [`FileMeta`]), then key/value pairs as `u32` key length, key, `u32` value length,
//! value; then `u32::MAX`, the `u64` pair count, in format 3 the linked entries (`u8` 1 and
//! `u64` first and last index, or `u8` 0), and a `u32` CRC-32 of every byte before it.
//!
//! Two kinds of file:
//! - **Whole** (format 2, [`FORMAT_VERSION`]): every record in the file. What travels from a
//!   leader to a follower, what a backup is, and what a state machine without a log builds.
//!   It holds the `sm` family's values as stored, each behind its format byte (`values`), with
//!   each record whole and each subscription one whole value, leases included, as data
//!   directory format 3 stored it (a store of today keeps its pieces apart: `subs`). Format 1
//!   held the applied id, membership and clock bare, and reading one gives them their format
//!   byte, so a format 1 file (an older node's snapshot, a backup) loads into a store of today.
//! - **Linked** (format 3, [`LINKED_VERSION`]): a node's own snapshot. Records are as the state
//!   machine stores them, mostly where the log holds them (`records`), and the log's segment
//!   files that hold those entries are hard-linked into the directory `NAME.log` beside the
//!   file: building one writes the small state and no record bytes, and the links keep the
//!   records readable whatever the log removes later. Sent to a follower or backed up, it is
//!   expanded on the way into the whole format ([`write_whole`]).
//!
//! A snapshot is written to `NAME.tmp` (its links first, synced), fsynced, renamed to `NAME`,
//! and the directory is fsynced: a crash at any step leaves the old snapshot or the new one,
//! never a torn one (a `NAME.log` without its `NAME` is a leftover, removed at start-up).
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
/// The whole format: every record in the file. Unknown versions are refused with a clear error.
pub const FORMAT_VERSION: u32 = 2;
/// The linked format: records where the log holds them, the log's files linked beside.
pub const LINKED_VERSION: u32 = 3;
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
         {LINKED_VERSION}"
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

pub(crate) fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

pub(crate) fn read_u64(r: &mut impl Read) -> io::Result<u64> {
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

/// The directory of a linked snapshot's segment files, beside the snapshot file at `path`.
pub fn linked_dir(path: &Path) -> PathBuf {
    path.with_extension("log")
}

/// Writes a snapshot file: header, pairs, trailer, all folded into its CRC.
struct Writer<W: Write> {
    w: CrcWriter<W>,
    version: u32,
    count: u64,
}

impl<W: Write> Writer<W> {
    fn start(inner: W, version: u32, meta: &FileMeta) -> Result<Self, SnapshotError> {
        let mut w = CrcWriter {
            inner,
            crc: Hasher::new(),
            bytes: 0,
        };
        let meta_bytes = codec::encode(meta).map_err(|e| SnapshotError::Corrupt(e.to_string()))?;
        w.write_all(MAGIC)?;
        w.write_all(&version.to_le_bytes())?;
        w.write_all(&(meta_bytes.len() as u64).to_le_bytes())?;
        w.write_all(&meta_bytes)?;
        Ok(Writer {
            w,
            version,
            count: 0,
        })
    }

    fn put(&mut self, k: &[u8], v: &[u8]) -> Result<(), SnapshotError> {
        self.w.write_all(&(k.len() as u32).to_le_bytes())?;
        self.w.write_all(k)?;
        self.w.write_all(&(v.len() as u32).to_le_bytes())?;
        self.w.write_all(v)?;
        self.count += 1;
        Ok(())
    }

    /// Writes the trailer (in the linked format, the entries linked) and the CRC; returns the
    /// writer it wrote to and the bytes written.
    fn finish(mut self, linked: Option<(u64, u64)>) -> Result<(W, u64), SnapshotError> {
        self.w.write_all(&END_MARK.to_le_bytes())?;
        self.w.write_all(&self.count.to_le_bytes())?;
        if self.version == LINKED_VERSION {
            match linked {
                Some((first, last)) => {
                    self.w.write_all(&[1])?;
                    self.w.write_all(&first.to_le_bytes())?;
                    self.w.write_all(&last.to_le_bytes())?;
                }
                None => self.w.write_all(&[0])?,
            }
        }
        let crc = self.w.crc.clone().finalize();
        self.w.inner.write_all(&crc.to_le_bytes())?;
        Ok((self.w.inner, self.w.bytes + 4))
    }
}

/// A snapshot built: its meta, path and size, and the lowest log index a record in it points
/// into (a linked snapshot's; `None` when every record is whole).
#[derive(Debug)]
pub struct Built {
    pub meta: FileMeta,
    pub path: PathBuf,
    pub bytes: u64,
    pub lowest: Option<u64>,
}

/// Builds a whole snapshot of the `sm` column family from a consistent RocksDB view (apply may
/// go on meanwhile) and writes it durably into `dir`. Returns its meta, path and size. Every
/// record must be stored whole (a state machine with no log: tools and tests).
pub fn build(
    db: &DB,
    dir: &Path,
    id_suffix: u64,
) -> Result<(FileMeta, PathBuf, u64), SnapshotError> {
    let built = build_from(db, &db.snapshot(), dir, id_suffix, None)?;
    Ok((built.meta, built.path, built.bytes))
}

/// [`build`] from the RocksDB view `view`, taken by the caller (at a moment when the state
/// machine was whole: never in the middle of a snapshot install). With the node's `log`, the
/// snapshot is linked: records stay as stored, and the segment files holding the entries they
/// point into are linked beside it; without, it is whole.
pub fn build_from(
    db: &DB,
    view: &rocksdb::Snapshot<'_>,
    dir: &Path,
    id_suffix: u64,
    log: Option<&dyn super::records::Entries>,
) -> Result<Built, SnapshotError> {
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
    let path = dir.join(&name);
    if get(keys::INSTALLING)?.is_some() {
        return Err(SnapshotError::Corrupt(
            "the state machine is in the middle of a snapshot install".into(),
        ));
    }
    let version = match log {
        Some(_) => LINKED_VERSION,
        None => FORMAT_VERSION,
    };
    let mut w = Writer::start(BufWriter::new(File::create(&tmp)?), version, &meta)?;
    let mut opts = ReadOptions::default();
    opts.set_snapshot(view);
    // Subscriptions go in whole, as every snapshot format holds them (`subs`).
    let mut put = |k: &[u8], v: &[u8]| w.put(k, v);
    let mut whole = subs::Whole::default();
    let reader = super::records::Reader::new(None);
    let mut lowest: Option<u64> = None;
    for item in db.iterator_cf_opt(cf, opts, IteratorMode::Start) {
        let (k, v) = item?;
        if log.is_none() {
            reader.whole(&k, &v, &mut |k, v| whole.push(k, v, &mut put))?;
            continue;
        }
        if keys::parse_record(&k).is_some() {
            if let Some(at) = super::records::points_into(&v).map_err(SnapshotError::Corrupt)? {
                lowest = Some(lowest.map_or(at, |l| l.min(at)));
            }
        }
        whole.push(&k, &v, &mut put)?;
    }
    whole.finish(&mut put)?;
    let linked = lowest.map(|first| (first, index));
    let (inner, bytes) = w.finish(linked)?;
    let inner = inner.into_inner().map_err(|e| e.into_error())?;
    faults::point(faults::BUILD_WRITTEN)?;
    if let (Some(log), Some((first, last))) = (log, linked) {
        // The record files, linked before the file that needs them gets its name.
        let segments = linked_dir(&path);
        if segments.exists() {
            fs::remove_dir_all(&segments)?;
        }
        fs::create_dir(&segments)?;
        log.link_segments(first, last, &segments)
            .map_err(SnapshotError::Corrupt)?;
        faults::point(faults::BUILD_LINKED)?;
        sync_dir(&segments)?;
    }
    inner.sync_all()?;
    faults::point(faults::BUILD_SYNCED)?;
    drop(inner);
    fs::rename(&tmp, &path)?;
    faults::point(faults::BUILD_RENAMED)?;
    sync_dir(dir)?;
    Ok(Built {
        meta,
        path,
        bytes,
        lowest,
    })
}

/// What a snapshot file says of itself beyond its meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub version: u32,
    /// A linked snapshot's first and last log index its linked segments must hold.
    pub linked: Option<(u64, u64)>,
}

/// Reads a snapshot stream through to the end, checking magic, version, framing, count and
/// checksum; calls `pair` for every key/value, as stored today (a format 1 file's bare values
/// get their format byte). Returns the meta.
pub fn read(
    r: impl Read,
    pair: impl FnMut(Vec<u8>, Vec<u8>) -> Result<(), SnapshotError>,
) -> Result<FileMeta, SnapshotError> {
    read_file(r, pair).map(|(meta, _)| meta)
}

/// [`read`], with what the trailer says.
pub fn read_file(
    r: impl Read,
    mut pair: impl FnMut(Vec<u8>, Vec<u8>) -> Result<(), SnapshotError>,
) -> Result<(FileMeta, Trailer), SnapshotError> {
    let mut file = FileReader::open(r)?;
    while let Some((k, v)) = file.next_pair()? {
        pair(k, v)?;
    }
    let meta = file.meta.clone();
    let trailer = file.finish()?;
    Ok((meta, trailer))
}

/// A key and its value.
type Pair = (Vec<u8>, Vec<u8>);

/// A snapshot read pair by pair.
struct FileReader<R: Read> {
    r: CrcReader<BufReader<R>>,
    meta: FileMeta,
    version: u32,
    count: u64,
}

impl<R: Read> FileReader<R> {
    fn open(r: R) -> Result<Self, SnapshotError> {
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
        if !(FORMAT_BARE_META..=LINKED_VERSION).contains(&version) {
            return Err(SnapshotError::UnknownVersion(version));
        }
        let meta_len = read_u64(&mut r)?;
        if meta_len > MAX_ITEM as u64 {
            return Err(SnapshotError::Corrupt(format!("meta of {meta_len} bytes")));
        }
        let meta_bytes = read_item(&mut r, meta_len as u32)?;
        let meta: FileMeta =
            codec::decode(&meta_bytes).map_err(|e| SnapshotError::Corrupt(format!("meta: {e}")))?;
        Ok(FileReader {
            r,
            meta,
            version,
            count: 0,
        })
    }

    /// The next pair, or `None` at the end mark.
    fn next_pair(&mut self) -> Result<Option<Pair>, SnapshotError> {
        let r = &mut self.r;
        let klen = read_u32(r)?;
        if klen == END_MARK {
            return Ok(None);
        }
        let k = read_item(r, klen)?;
        let vlen = read_u32(r)?;
        let v = read_item(r, vlen)?;
        let v = match self.version == FORMAT_BARE_META && values::is_bare_sm_key(&k) {
            true => values::with_format_byte(&v),
            false => v,
        };
        self.count += 1;
        Ok(Some((k, v)))
    }

    /// Reads and checks what follows the end mark.
    fn finish(mut self) -> Result<Trailer, SnapshotError> {
        let r = &mut self.r;
        let want = read_u64(r)?;
        if want != self.count {
            return Err(SnapshotError::Corrupt(format!(
                "{} pairs, trailer says {want}",
                self.count
            )));
        }
        let mut linked = None;
        if self.version == LINKED_VERSION {
            let mut flag = [0u8; 1];
            r.read_exact(&mut flag)?;
            linked = match flag[0] {
                0 => None,
                1 => {
                    let (first, last) = (read_u64(r)?, read_u64(r)?);
                    if first > last {
                        return Err(SnapshotError::Corrupt(format!(
                            "linked entries {first} to {last}"
                        )));
                    }
                    Some((first, last))
                }
                other => {
                    return Err(SnapshotError::Corrupt(format!(
                        "linked-entries flag {other}"
                    )))
                }
            };
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
        Ok(Trailer {
            version: self.version,
            linked,
        })
    }
}

/// Checks a whole snapshot file and returns its meta. A linked one must have its directory of
/// segment files beside it, starting at or before the first entry it needs; the frames in it
/// are checked as they are read ([`write_whole`]).
pub fn verify(path: &Path) -> Result<FileMeta, SnapshotError> {
    verify_file(path).map(|(meta, _)| meta)
}

/// [`verify`], with what the trailer says.
pub fn verify_file(path: &Path) -> Result<(FileMeta, Trailer), SnapshotError> {
    let (meta, trailer) = read_file(File::open(path)?, |_, _| Ok(()))?;
    if let Some((first, _)) = trailer.linked {
        let dir = linked_dir(path);
        let firsts = super::segments::segment_firsts(&dir)
            .map_err(|e| SnapshotError::Corrupt(format!("its segment files: {e}")))?;
        if firsts.first().is_none_or(|l| *l > first) {
            return Err(SnapshotError::Corrupt(format!(
                "its segment files in {} do not start at or before entry {first}",
                dir.display()
            )));
        }
    }
    Ok((meta, trailer))
}

/// Checks a snapshot file that must hold every record itself (one received, a backup).
pub fn verify_whole(path: &Path) -> Result<FileMeta, SnapshotError> {
    let (meta, trailer) = read_file(File::open(path)?, |_, _| Ok(()))?;
    refuse_linked(&trailer)?;
    Ok(meta)
}

fn refuse_linked(trailer: &Trailer) -> Result<(), SnapshotError> {
    match trailer.linked {
        None => Ok(()),
        Some((first, last)) => Err(SnapshotError::Corrupt(format!(
            "it does not hold its records: they are in linked log entries {first} to {last} \
             of the node that built it (a backup or a transfer holds them whole)"
        ))),
    }
}

/// Writes the snapshot at `path` to `out` in the whole format: a linked one with its records
/// read from its linked segments (each frame checked), a whole one as it is. Returns its meta
/// and the bytes written. The files are opened before the first byte is written, so the node
/// removing them meanwhile (a newer snapshot) does not stop the copy.
pub fn write_whole(path: &Path, out: impl Write) -> Result<(FileMeta, u64), SnapshotError> {
    let mut file = FileReader::open(File::open(path)?)?;
    let through = file.meta.last_log_id.as_ref().map_or(0, |l| l.index);
    let segments = match file.version == LINKED_VERSION && linked_dir(path).is_dir() {
        true => Some(super::records::SegmentEntries(
            super::segments::SegmentLog::open_read_only(&linked_dir(path), through)
                .map_err(|e| SnapshotError::Corrupt(format!("its linked segment files: {e}")))?,
        )),
        false => None,
    };
    let reader = super::records::Reader::new(
        segments
            .as_ref()
            .map(|s| s as &dyn super::records::EntrySource),
    );
    let meta = file.meta.clone();
    let mut w = Writer::start(BufWriter::new(out), FORMAT_VERSION, &meta)?;
    while let Some((k, v)) = file.next_pair()? {
        reader.whole(&k, &v, &mut |k, v| w.put(k, v))?;
    }
    let trailer = file.finish()?;
    if let (Some((first, _)), Some(lowest)) = (trailer.linked, reader.lowest()) {
        if lowest < first {
            return Err(SnapshotError::Corrupt(format!(
                "a record points into entry {lowest}, below the linked entries from {first}"
            )));
        }
    }
    let (out, bytes) = w.finish(None)?;
    out.into_inner().map_err(|e| e.into_error())?.flush()?;
    Ok((meta, bytes))
}

/// Chunks of a snapshot stream, from a blocking writer to an async reader.
const STREAM_CHUNK: usize = 1 << 20;

/// A writer that sends what it is given, in chunks, to a channel.
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<io::Result<bytes::Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(STREAM_CHUNK));
        self.tx
            .blocking_send(Ok(chunk.into()))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= STREAM_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.buf.is_empty() {
            true => Ok(()),
            false => self.send(),
        }
    }
}

/// The snapshot at `path` in the whole format ([`write_whole`]), made on a blocking thread as
/// the stream is read; nothing is read before the stream is first polled (openraft drops the
/// snapshot a build returns unread). A failure ends the stream with the error.
pub fn whole_stream(
    path: PathBuf,
) -> futures::stream::BoxStream<'static, io::Result<bytes::Bytes>> {
    stream_on_a_thread(path, |path, out| write_whole(path, out).map(|_| ()))
}

/// What `write(path, out)` writes, made on a blocking thread as the stream is read; nothing is
/// written before the stream is first polled (openraft drops the snapshot a build returns
/// unread). A failure ends the stream with the error.
pub fn stream_on_a_thread(
    path: PathBuf,
    write: fn(&Path, ChannelWriter) -> Result<(), SnapshotError>,
) -> futures::stream::BoxStream<'static, io::Result<bytes::Bytes>> {
    use futures::StreamExt;
    futures::stream::once(async move { on_a_thread(path, write) })
        .flatten()
        .boxed()
}

fn on_a_thread(
    path: PathBuf,
    write: fn(&Path, ChannelWriter) -> Result<(), SnapshotError>,
) -> futures::stream::BoxStream<'static, io::Result<bytes::Bytes>> {
    use futures::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let out = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(STREAM_CHUNK),
        };
        if let Err(e) = write(&path, out) {
            if !tx.is_closed() {
                tracing::warn!(snapshot = %path.display(), "a snapshot could not be sent: {e}");
                let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
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
    let (meta, trailer) = read_file(&mut *src, |_, _| Ok(()))?;
    refuse_linked(&trailer)?;
    check_announced(&meta, want)?;
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

/// A received snapshot must be the one announced (`want`: its last log id and membership).
pub fn check_announced(meta: &FileMeta, want: &SnapshotMeta) -> Result<(), SnapshotError> {
    if meta.raft_meta() == *want {
        return Ok(());
    }
    Err(SnapshotError::Corrupt(format!(
        "received snapshot {} holds up to {:?} with membership {:?}, but was announced as up to \
         {:?} with membership {:?}",
        meta.snapshot_id,
        meta.last_log_id,
        meta.last_membership,
        want.last_log_id,
        want.last_membership
    )))
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
        if name.ends_with(".log") && !path.with_extension("snap").exists() {
            // The links of a build that stopped before its file got its name.
            let _ = fs::remove_dir_all(&path);
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

/// The entries the newest snapshot in `dir` holds in its record files (first and last), when
/// it is linked and has them, after checking that the files hold each of those entries whole
/// (every frame's checksum read, as the log's own are when it opens): start-up's check, so
/// that a node whose record files lost or damaged entries its records point into says so and
/// rejoins, instead of failing every read that reaches them.
pub fn archived(dir: &Path) -> Result<Option<(u64, u64)>, SnapshotError> {
    let Some((_, path)) = newest(dir)? else {
        return Ok(None);
    };
    let (_, trailer) = verify_file(&path)?;
    let segments = linked_dir(&path);
    let Some((first, last)) = trailer.linked.filter(|_| segments.is_dir()) else {
        return Ok(None);
    };
    let log = super::segments::SegmentLog::open_read_only(&segments, last)
        .map_err(|e| SnapshotError::Corrupt(format!("its record files: {e}")))?;
    let held = match (log.first_index(), log.last_index()) {
        (Some(from), Some(to)) if from <= first && to >= last => return Ok(Some((first, last))),
        (Some(from), Some(to)) => format!("{from} to {to}"),
        _ => "none".to_string(),
    };
    Err(SnapshotError::Corrupt(format!(
        "its record files in {} hold entries {held} where it needs {first} to {last}",
        segments.display()
    )))
}

/// Removes every snapshot in `dir` except `keep` (and its linked segment files).
pub fn remove_others(dir: &Path, keep: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path != keep && path.extension().is_some_and(|e| e == "snap") {
                remove(&path);
            }
        }
    }
}

/// Removes the snapshot at `path` and its linked segment files, if any (the log's own files
/// stay: only these names of them go).
pub fn remove(path: &Path) {
    let _ = fs::remove_file(path);
    let _ = fs::remove_dir_all(linked_dir(path));
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
