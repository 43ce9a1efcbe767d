//! The [`Producer`](crate::Producer)'s durable spool: a directory holding one producer's
//! accepted, not yet finished batches, so that a producer killed at any moment and restarted
//! with the same spool loses nothing it accepted and duplicates nothing.
//!
//! # Layout
//!
//! - `spool.log`: an append-only file of framed entries. Each frame is the payload length (u32,
//!   little endian), the payload's CRC-32 (u32, little endian) and the payload, one JSON
//!   [`Entry`]. The first entry is always [`Entry::Start`]: the format version, the spool's
//!   identity (topic and producer id) and the sequence counters as of the file's creation.
//! - `LOCK`: held with `flock` by the producer using the spool, so that two producers never
//!   share one (a second open is refused; the lock goes away with the process).
//! - `spool.log.tmp`: a compaction or creation in progress; ignored and removed at open.
//!
//! # Entries and replay
//!
//! Replaying the file in order rebuilds the producer's position and its pending batches:
//!
//! - `batch`: a sealed batch (its sequence, the local sequence of its first record, and its
//!   records). Written and fsynced before the batch is sent and before its records count as
//!   accepted.
//! - `done`: batches that are finished (committed). Written without fsync: a lost `done` marker
//!   only makes a restarted producer re-send a committed batch, which the server answers as a
//!   duplicate with its original offsets.
//! - `reseq`: batches definitely refused are dropped, and the pending batches after them get new
//!   sequences (a refusal does not consume its sequence). Fsynced before any renumbered batch is
//!   sent.
//!
//! # Crashes
//!
//! A frame is written with one `write` call; a crash can only leave the last frame torn. At
//! open, a frame whose CRC or length does not check and that reaches the end of the file (or is
//! followed only by zeros) is a torn tail: the file is truncated before it. A bad frame followed
//! by valid data is corruption, and the spool is refused with a message that says so.
//!
//! The file is created, and compacted, by writing `spool.log.tmp`, fsyncing it, renaming it over
//! `spool.log` and fsyncing the directory: a crash leaves the old file or the new one. A spool
//! is compacted when everything in it is done (and it holds more than
//! [`COMPACT_IDLE_BYTES`]), or when it grows past [`COMPACT_LARGE_BYTES`] with less than half
//! of it pending, and when its producer closes.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::api::RecordIn;
use crate::error::ProducerError;

/// Name of the entry log inside a spool directory.
pub(crate) const SPOOL_FILE: &str = "spool.log";
/// Name of the file being written by a creation or a compaction.
const TMP_FILE: &str = "spool.log.tmp";
/// Name of the lock file.
const LOCK_FILE: &str = "LOCK";
/// The spool format this code writes and reads.
const FORMAT: u32 = 1;
/// Length and CRC before every payload.
const FRAME_HEADER: usize = 8;
/// Largest payload accepted when reading: a batch is at most 16 MiB of encoded records, with a
/// wide margin. A longer length is a torn or corrupt frame, never an allocation.
const MAX_ENTRY_BYTES: usize = 64 << 20;
/// An all-done spool file larger than this is compacted.
pub(crate) const COMPACT_IDLE_BYTES: u64 = 1 << 20;
/// A spool file larger than this, with less than half of it pending, is compacted.
pub(crate) const COMPACT_LARGE_BYTES: u64 = 64 << 20;

/// One entry of `spool.log`, as read.
#[derive(Debug, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case", deny_unknown_fields)]
enum Entry {
    /// The first entry of every file.
    Start {
        format: u32,
        topic: String,
        producer_id: String,
        /// The sequence of the next new batch.
        next_seq: u64,
        /// The local sequence of the next new record.
        next_local: u64,
    },
    /// A sealed batch.
    Batch {
        seq: u64,
        first: u64,
        records: Vec<RecordIn>,
    },
    /// Finished batches, by the local sequence of their first record.
    Done { batches: Vec<u64> },
    /// Refused batches dropped, and new sequences for pending batches.
    Reseq {
        dropped: Vec<u64>,
        seqs: Vec<(u64, u64)>,
        next_seq: u64,
    },
}

/// One entry of `spool.log`, as written (borrowing the records).
#[derive(Debug, Serialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum EntryOut<'a> {
    Start {
        format: u32,
        topic: &'a str,
        producer_id: &'a str,
        next_seq: u64,
        next_local: u64,
    },
    Batch {
        seq: u64,
        first: u64,
        records: &'a [RecordIn],
    },
    Done {
        batches: &'a [u64],
    },
    Reseq {
        dropped: &'a [u64],
        seqs: &'a [(u64, u64)],
        next_seq: u64,
    },
}

/// A batch in the spool that is not finished.
#[derive(Debug, Clone)]
pub(crate) struct PendingBatch {
    /// Its current batch sequence.
    pub seq: u64,
    pub records: Arc<Vec<RecordIn>>,
}

/// A change to write, in order.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A new batch: `first` is the local sequence of its first record.
    Batch {
        first: u64,
        seq: u64,
        records: Arc<Vec<RecordIn>>,
    },
    /// Batches finished, by first local sequence.
    Done(Vec<u64>),
    /// Batches dropped as refused, new sequences `(first local, seq)` for the pending ones after
    /// them, and the next new batch's sequence.
    Reseq {
        dropped: Vec<u64>,
        seqs: Vec<(u64, u64)>,
        next_seq: u64,
    },
}

/// An open spool: the lock, the append handle and the replayed state.
#[derive(Debug)]
pub(crate) struct Spool {
    dir: PathBuf,
    topic: String,
    producer_id: String,
    file: File,
    /// Bytes in `spool.log`.
    size: u64,
    next_seq: u64,
    next_local: u64,
    /// Pending batches by the local sequence of their first record.
    pending: BTreeMap<u64, PendingBatch>,
    /// Holds the `flock`; closing it (on drop or process death) releases the spool.
    _lock: File,
}

/// The replayed state of a spool file.
#[derive(Debug, Default)]
struct Replayed {
    next_seq: u64,
    next_local: u64,
    pending: BTreeMap<u64, PendingBatch>,
}

impl Spool {
    /// Opens (or creates) the spool in `dir` for `topic`. With `producer_id`, the spool must be
    /// that producer's (or new); without, a new spool gets `new_id()`. Replays the file,
    /// truncating a torn tail. Blocking.
    pub(crate) fn open(
        dir: &Path,
        topic: &str,
        producer_id: Option<&str>,
        new_id: impl FnOnce() -> String,
    ) -> Result<Spool, ProducerError> {
        let failed = |what: &str, err: io::Error| ProducerError::Spool {
            path: dir.to_path_buf(),
            detail: format!("{what}: {err}"),
        };
        fs::create_dir_all(dir).map_err(|err| failed("cannot create the directory", err))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|err| failed("cannot open the lock file", err))?;
        if !try_lock(&lock).map_err(|err| failed("cannot lock the spool", err))? {
            return Err(ProducerError::SpoolInUse {
                path: dir.to_path_buf(),
            });
        }
        // A creation or compaction that crashed before its rename left this behind; the file it
        // was meant to replace is intact.
        match fs::remove_file(dir.join(TMP_FILE)) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(failed("cannot remove the unfinished spool.log.tmp", err)),
        }

        let path = dir.join(SPOOL_FILE);
        let mut spool = match File::open(&path) {
            Ok(mut file) => {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes)
                    .map_err(|err| failed("cannot read spool.log", err))?;
                drop(file);
                let (identity, replayed, valid_len) =
                    replay(&bytes).map_err(|detail| ProducerError::Spool {
                        path: dir.to_path_buf(),
                        detail: format!(
                            "{detail}. The spool is damaged; move the directory aside (a new \
                             spool starts a new producer) and check the topic for the records \
                             it held"
                        ),
                    })?;
                let (spool_topic, spool_producer) = identity;
                if spool_topic != topic {
                    return Err(ProducerError::ForeignSpool {
                        path: dir.to_path_buf(),
                        detail: format!(
                            "it belongs to producer {spool_producer:?} on topic {spool_topic:?}, \
                             not to topic {topic:?}; use another spool directory"
                        ),
                    });
                }
                if let Some(wanted) = producer_id {
                    if wanted != spool_producer {
                        return Err(ProducerError::ForeignSpool {
                            path: dir.to_path_buf(),
                            detail: format!(
                                "it belongs to producer {spool_producer:?}, not to {wanted:?}; \
                                 use another spool directory, or open it without a producer id"
                            ),
                        });
                    }
                }
                let file = OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(|err| failed("cannot open spool.log for writing", err))?;
                if (valid_len as u64) < bytes.len() as u64 {
                    tracing::warn!(
                        spool = %dir.display(),
                        torn_bytes = bytes.len() - valid_len,
                        "the spool ends in a torn entry (a crash during a write); truncating it"
                    );
                    file.set_len(valid_len as u64)
                        .and_then(|()| file.sync_all())
                        .map_err(|err| failed("cannot truncate the torn tail of spool.log", err))?;
                }
                Spool {
                    dir: dir.to_path_buf(),
                    topic: spool_topic,
                    producer_id: spool_producer,
                    file,
                    size: valid_len as u64,
                    next_seq: replayed.next_seq,
                    next_local: replayed.next_local,
                    pending: replayed.pending,
                    _lock: lock,
                }
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let producer_id = match producer_id {
                    Some(id) => id.to_string(),
                    None => new_id(),
                };
                let mut spool = Spool {
                    dir: dir.to_path_buf(),
                    topic: topic.to_string(),
                    producer_id,
                    // Replaced by the rewrite below.
                    file: lock
                        .try_clone()
                        .map_err(|err| failed("cannot duplicate a file handle", err))?,
                    size: 0,
                    next_seq: 0,
                    next_local: 0,
                    pending: BTreeMap::new(),
                    _lock: lock,
                };
                spool
                    .rewrite()
                    .map_err(|err| failed("cannot create spool.log", err))?;
                spool
            }
            Err(err) => return Err(failed("cannot open spool.log", err)),
        };
        spool.next_local = spool.next_local.max(
            spool
                .pending
                .iter()
                .map(|(first, batch)| first + batch.records.len() as u64)
                .max()
                .unwrap_or(0),
        );
        Ok(spool)
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The producer id the spool belongs to.
    pub(crate) fn producer_id(&self) -> &str {
        &self.producer_id
    }

    /// The sequence of the next new batch.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The local sequence of the next new record.
    pub(crate) fn next_local(&self) -> u64 {
        self.next_local
    }

    /// Pending batches, by the local sequence of their first record.
    pub(crate) fn pending(&self) -> &BTreeMap<u64, PendingBatch> {
        &self.pending
    }

    /// Bytes in `spool.log`.
    #[cfg(test)]
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Appends `ops` in one write, fsynced when it holds a batch or a resequencing (what must
    /// be durable before it is acted on), then compacts the file when that is worth it.
    /// Blocking.
    pub(crate) fn write(&mut self, ops: &[Op]) -> io::Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        let mut sync = false;
        for op in ops {
            match op {
                Op::Batch {
                    first,
                    seq,
                    records,
                } => {
                    sync = true;
                    frame(
                        &mut buf,
                        &EntryOut::Batch {
                            seq: *seq,
                            first: *first,
                            records,
                        },
                    )?;
                }
                Op::Done(batches) => frame(&mut buf, &EntryOut::Done { batches })?,
                Op::Reseq {
                    dropped,
                    seqs,
                    next_seq,
                } => {
                    sync = true;
                    frame(
                        &mut buf,
                        &EntryOut::Reseq {
                            dropped,
                            seqs,
                            next_seq: *next_seq,
                        },
                    )?;
                }
            }
        }
        self.file.write_all(&buf)?;
        self.size += buf.len() as u64;
        if sync {
            self.file.sync_data()?;
        }
        for op in ops {
            self.apply(op);
        }
        let idle = self.pending.is_empty() && self.size > COMPACT_IDLE_BYTES;
        let large = self.size > COMPACT_LARGE_BYTES && self.pending_bytes() * 2 < self.size;
        if idle || large {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Compacts the file if anything in it is finished: used when the producer closes, so that
    /// a closed producer leaves a spool of one small entry. Blocking.
    pub(crate) fn compact(&mut self) -> io::Result<()> {
        if self.pending.is_empty() && self.size > self.start_len()? {
            self.rewrite()?;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Batch {
                first,
                seq,
                records,
            } => {
                self.next_seq = self.next_seq.max(seq + 1);
                self.next_local = self.next_local.max(first + records.len() as u64);
                self.pending.insert(
                    *first,
                    PendingBatch {
                        seq: *seq,
                        records: records.clone(),
                    },
                );
            }
            Op::Done(batches) => {
                for first in batches {
                    self.pending.remove(first);
                }
            }
            Op::Reseq {
                dropped,
                seqs,
                next_seq,
            } => {
                for first in dropped {
                    self.pending.remove(first);
                }
                for (first, seq) in seqs {
                    if let Some(batch) = self.pending.get_mut(first) {
                        batch.seq = *seq;
                    }
                }
                self.next_seq = *next_seq;
            }
        }
    }

    /// Roughly the bytes the pending batches take in the file.
    fn pending_bytes(&self) -> u64 {
        self.pending
            .values()
            .map(|batch| {
                batch
                    .records
                    .iter()
                    .map(|record| {
                        record.value.len()
                            + record.key.as_ref().map_or(0, String::len)
                            + record
                                .headers
                                .iter()
                                .map(|(k, v)| k.len() + v.len())
                                .sum::<usize>()
                            + 16
                    })
                    .sum::<usize>() as u64
            })
            .sum()
    }

    fn start_entry(&self) -> EntryOut<'_> {
        EntryOut::Start {
            format: FORMAT,
            topic: &self.topic,
            producer_id: &self.producer_id,
            next_seq: self.next_seq,
            next_local: self.next_local,
        }
    }

    fn start_len(&self) -> io::Result<u64> {
        let mut buf = Vec::new();
        frame(&mut buf, &self.start_entry())?;
        Ok(buf.len() as u64)
    }

    /// Writes a new `spool.log` holding the start entry and the pending batches: tmp file,
    /// fsync, rename, fsync of the directory, then reopens the append handle.
    fn rewrite(&mut self) -> io::Result<()> {
        let mut buf = Vec::new();
        frame(&mut buf, &self.start_entry())?;
        for (first, batch) in &self.pending {
            frame(
                &mut buf,
                &EntryOut::Batch {
                    seq: batch.seq,
                    first: *first,
                    records: &batch.records,
                },
            )?;
        }
        let tmp = self.dir.join(TMP_FILE);
        let path = self.dir.join(SPOOL_FILE);
        {
            let mut file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&tmp)?;
            file.write_all(&buf)?;
            file.sync_all()?;
        }
        fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)?;
        self.file = OpenOptions::new().append(true).open(&path)?;
        self.size = buf.len() as u64;
        Ok(())
    }
}

/// Appends one frame holding `entry` to `buf`.
fn frame(buf: &mut Vec<u8>, entry: &EntryOut<'_>) -> io::Result<()> {
    let payload = serde_json::to_vec(entry).map_err(io::Error::other)?;
    if payload.len() > MAX_ENTRY_BYTES {
        return Err(io::Error::other(format!(
            "a spool entry of {} bytes is larger than the {MAX_ENTRY_BYTES} bytes allowed",
            payload.len()
        )));
    }
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    buf.extend_from_slice(&payload);
    Ok(())
}

/// Replays a whole `spool.log`: returns its identity (topic, producer id), the state, and the
/// length of the valid prefix (shorter than `bytes` when the tail is torn).
fn replay(bytes: &[u8]) -> Result<((String, String), Replayed, usize), String> {
    let mut state = Replayed::default();
    let mut identity = None;
    let mut pos = 0usize;
    while pos < bytes.len() {
        // A damaged frame is a torn tail only if nothing valid can follow it.
        let corrupt = |why: &str| -> Result<(), String> {
            Err(format!(
                "spool.log is corrupt at byte {pos} of {}: {why}, and data follows",
                bytes.len()
            ))
        };
        let rest = &bytes[pos..];
        if rest.len() < FRAME_HEADER {
            break; // a torn header
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let reaches_end = FRAME_HEADER.saturating_add(len) >= rest.len();
        let zeros_to_end = rest.iter().all(|&b| b == 0);
        if len == 0 || len > MAX_ENTRY_BYTES {
            if reaches_end || zeros_to_end {
                break;
            }
            corrupt(&format!("an entry claims {len} bytes"))?;
        }
        if FRAME_HEADER + len > rest.len() {
            break; // a torn payload
        }
        let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
        if crc32fast::hash(payload) != crc {
            if FRAME_HEADER + len == rest.len() || zeros_to_end {
                break;
            }
            corrupt("an entry's checksum does not match")?;
        }
        let entry: Entry = serde_json::from_slice(payload).map_err(|err| {
            format!("spool.log holds an entry this version cannot read at byte {pos}: {err}")
        })?;
        match (entry, identity.is_some()) {
            (
                Entry::Start {
                    format,
                    topic,
                    producer_id,
                    next_seq,
                    next_local,
                },
                false,
            ) => {
                if format != FORMAT {
                    return Err(format!(
                        "spool.log has format {format}; this version reads format {FORMAT}"
                    ));
                }
                identity = Some((topic, producer_id));
                state.next_seq = next_seq;
                state.next_local = next_local;
            }
            (Entry::Start { .. }, true) => {
                return Err(format!("spool.log has a second start entry at byte {pos}"))
            }
            (_, false) => return Err("spool.log does not begin with a start entry".to_string()),
            (
                Entry::Batch {
                    seq,
                    first,
                    records,
                },
                true,
            ) => {
                if records.is_empty() {
                    return Err(format!("spool.log holds an empty batch at byte {pos}"));
                }
                state.next_seq = state.next_seq.max(seq.saturating_add(1));
                state.next_local = state
                    .next_local
                    .max(first.saturating_add(records.len() as u64));
                state.pending.insert(
                    first,
                    PendingBatch {
                        seq,
                        records: Arc::new(records),
                    },
                );
            }
            (Entry::Done { batches }, true) => {
                for first in batches {
                    state.pending.remove(&first);
                }
            }
            (
                Entry::Reseq {
                    dropped,
                    seqs,
                    next_seq,
                },
                true,
            ) => {
                for first in dropped {
                    state.pending.remove(&first);
                }
                for (first, seq) in seqs {
                    if let Some(batch) = state.pending.get_mut(&first) {
                        batch.seq = seq;
                    }
                }
                state.next_seq = next_seq;
            }
        }
        pos += FRAME_HEADER + len;
    }
    match identity {
        Some(identity) => Ok((identity, state, pos)),
        None => Err(if bytes.is_empty() {
            "spool.log is empty (it is always created with a start entry)".to_string()
        } else {
            "spool.log does not begin with a valid start entry".to_string()
        }),
    }
}

/// Takes the `flock` on `file` without waiting; `false` when another holds it.
#[cfg(unix)]
fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd as _;
    // SAFETY: flock on a valid file descriptor owned by `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Without `flock`, the spool is not protected against a second producer.
#[cfg(not(unix))]
fn try_lock(_file: &File) -> io::Result<bool> {
    Ok(true)
}

/// Makes a rename in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
#[path = "spool_tests.rs"]
mod tests;
