//! A linked snapshot as it travels to a follower: the snapshot file as its node built it (the
//! small state, each published record as where the log holds it) and the log entries those
//! records point into, as they are. Nothing is re-encoded, and the follower keeps the entries
//! as the record files of the snapshot it installs, so it writes each record's bytes once, as
//! the leader did, and its own later snapshots link them in turn.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! magic        b"RAFTQLNK"
//! version      u32, 1
//! file length  u64
//! file         the snapshot file (linked format, `snapshot::LINKED_VERSION`)
//! entries      for each index from the file's first linked entry to its last, in order:
//!              u64 index, u32 length, u32 CRC-32C of the index and the payload, payload
//!              (the log's own encoding of the entry)
//! end          u64 u64::MAX
//! ```
//!
//! A follower stores it as [`snapshot::store_received`] stores a whole one: the entries are
//! written to segment files in the snapshot's record directory and synced, the file to
//! `NAME.tmp`, synced, checked whole, renamed, and the directory synced; a crash at any step
//! leaves the old snapshot or the new one (a record directory without its file is a leftover,
//! removed at start-up).

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::datadir::sync_dir;
use super::segments::{SegmentLog, DEFAULT_SEGMENT_BYTES, MAX_PAYLOAD};
use super::snapshot::{self, read_u32, read_u64, FileMeta, SnapshotError, LINKED_VERSION};
use super::{faults, log};
use crate::raft::SnapshotMeta;

/// First bytes of a linked transfer.
pub const MAGIC: &[u8; 8] = b"RAFTQLNK";
/// The transfer's own version.
const VERSION: u32 = 1;
/// The snapshot transfer format a node receives, as `/raft/status` says it: 2 takes whole
/// snapshots only; 4 takes linked transfers too, whose records point into the log one by one;
/// 5 takes linked transfers whose records may also be runs (`records::RunValue`, data
/// directory format 9), which a node saying 4 cannot read.
pub const RECEIVES: u32 = crate::raft::network::LINKED_TRANSFER;
/// Marks the end of the entries.
const END: u64 = u64::MAX;
/// Largest snapshot file a transfer may carry (its records are in the entries, so the file is
/// the small state and about 20 bytes a record).
const MAX_FILE: u64 = 16 << 30;

fn frame_crc(index: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), payload)
}

/// Writes the linked snapshot at `path` as a transfer to `out`: the file, then every entry its
/// records need, read from its record files (each frame checked). Returns its meta and the
/// bytes written. Both are opened before the first byte is written, so a newer snapshot
/// removing them meanwhile does not stop the copy.
pub fn write(path: &Path, out: impl Write) -> Result<(FileMeta, u64), SnapshotError> {
    let (meta, trailer) = snapshot::verify_file(path)?;
    if trailer.version != LINKED_VERSION {
        return Err(SnapshotError::Corrupt(
            "only a linked snapshot travels as a linked transfer".into(),
        ));
    }
    let mut file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let entries = match trailer.linked {
        Some((_, last)) => Some(
            SegmentLog::open_read_only(&snapshot::linked_dir(path), last)
                .map_err(|e| SnapshotError::Corrupt(format!("its record files: {e}")))?,
        ),
        None => None,
    };
    let mut out = BufWriter::new(out);
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&file_len.to_le_bytes())?;
    let copied = io::copy(&mut (&mut file).take(file_len), &mut out)?;
    if copied != file_len {
        return Err(SnapshotError::Corrupt(format!(
            "the snapshot file shrank from {file_len} to {copied} bytes while it was sent"
        )));
    }
    let mut bytes = 8 + 4 + 8 + file_len;
    if let (Some(entries), Some((first, last))) = (&entries, trailer.linked) {
        for index in first..=last {
            let payload = entries
                .read(index)
                .map_err(|e| SnapshotError::Corrupt(format!("its record files: {e}")))?
                .ok_or_else(|| {
                    SnapshotError::Corrupt(format!("its record files lack entry {index}"))
                })?;
            let len = u32::try_from(payload.len())
                .map_err(|_| SnapshotError::Corrupt(format!("entry {index} is too large")))?;
            out.write_all(&index.to_le_bytes())?;
            out.write_all(&len.to_le_bytes())?;
            out.write_all(&frame_crc(index, &payload).to_le_bytes())?;
            out.write_all(&payload)?;
            bytes += 16 + payload.len() as u64;
        }
    }
    out.write_all(&END.to_le_bytes())?;
    out.flush()?;
    Ok((meta, bytes + 8))
}

/// Whether the received bytes in `src` (from its start) are a linked transfer.
pub fn is_transfer(src: &mut File) -> io::Result<bool> {
    use std::io::Seek;
    src.seek(io::SeekFrom::Start(0))?;
    let mut magic = [0u8; 8];
    let is = match src.read_exact(&mut magic) {
        Ok(()) => &magic == MAGIC,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(e),
    };
    src.seek(io::SeekFrom::Start(0))?;
    Ok(is)
}

/// Stores a received linked transfer (`src`, from its start) in `dir` durably, after checking
/// it whole: its file, that it is the snapshot announced (`want`), and every entry (its CRC,
/// that it decodes as the entry of its index, and that they are exactly the linked ones). The
/// entries become the snapshot's record files. Nothing that fails a check gets a final name.
/// Returns the meta and the final path of the snapshot file.
pub fn store_received(
    src: &mut File,
    dir: &Path,
    want: &SnapshotMeta,
) -> Result<(FileMeta, PathBuf), SnapshotError> {
    use std::io::Seek;
    fs::create_dir_all(dir)?;
    src.seek(io::SeekFrom::Start(0))?;
    let mut r = BufReader::new(&mut *src);
    let file_len = read_header(&mut r)?;
    // The file first, under a name of the transfer's own, to learn its meta.
    let receiving = dir.join(format!("receiving-{}.tmp", std::process::id()));
    let stored = (|| {
        let mut out = File::create(&receiving)?;
        let copied = io::copy(&mut (&mut r).take(file_len), &mut out)?;
        if copied != file_len {
            return Err(SnapshotError::Corrupt(format!(
                "the transfer ends inside its snapshot file ({copied} of {file_len} bytes)"
            )));
        }
        out.sync_all()?;
        let (meta, trailer) = snapshot::read_file(File::open(&receiving)?, |_, _| Ok(()))?;
        if trailer.version != LINKED_VERSION {
            return Err(SnapshotError::Corrupt(
                "a linked transfer must carry a linked snapshot file".into(),
            ));
        }
        snapshot::check_announced(&meta, want)?;
        let path = dir.join(snapshot::file_name(&meta));
        let records = snapshot::linked_dir(&path);
        // The same snapshot stored before (sent again): a file with its final name was renamed
        // only after its record files were synced, so they are whole, and perhaps in use as
        // the current snapshot's; they are kept, not written again.
        if !stored_before(&path, &meta) {
            if records.exists() {
                fs::remove_dir_all(&records)?;
            }
            store_entries(&mut r, &records, trailer.linked)?;
        }
        faults::point(faults::RECEIVE_WRITTEN)?;
        Ok::<_, SnapshotError>((meta, path))
    })();
    let (meta, path) = match stored {
        Ok(stored) => stored,
        Err(e) => {
            let _ = fs::remove_file(&receiving);
            return Err(e);
        }
    };
    faults::point(faults::RECEIVE_SYNCED)?;
    // What reached the disk is checked again, whole, before it gets its final name.
    let again =
        snapshot::read_file(File::open(&receiving)?, |_, _| Ok(())).and_then(|(again, _)| {
            match again == meta {
                true => Ok(()),
                false => Err(SnapshotError::Corrupt(
                    "the stored copy differs from the received snapshot".into(),
                )),
            }
        });
    if let Err(e) = again {
        let _ = fs::remove_file(&receiving);
        let _ = fs::remove_dir_all(snapshot::linked_dir(&path));
        return Err(e);
    }
    fs::rename(&receiving, &path)?;
    faults::point(faults::RECEIVE_RENAMED)?;
    sync_dir(dir)?;
    Ok((meta, path))
}

/// Whether the snapshot file at `path` is there already and holds `meta`: stored before, with
/// its record files.
fn stored_before(path: &Path, meta: &FileMeta) -> bool {
    snapshot::verify_file(path).is_ok_and(|(stored, _)| stored == *meta)
}

/// Reads the entries of a transfer from `r` into new segment files in `into`, synced (the
/// directory too); they must be exactly `linked`'s, each whole and decoding as its own entry.
fn store_entries(
    r: &mut impl Read,
    into: &Path,
    linked: Option<(u64, u64)>,
) -> Result<(), SnapshotError> {
    let segments = |e: super::segments::SegmentError| SnapshotError::Corrupt(e.to_string());
    let mut log = match linked {
        Some(_) => Some(
            SegmentLog::open(into, 0, DEFAULT_SEGMENT_BYTES)
                .map_err(segments)?
                .0,
        ),
        None => None,
    };
    read_entries(r, linked, |index, payload| match log.as_mut() {
        Some(log) => log.append(index, payload).map_err(segments),
        None => Ok(()),
    })?;
    if let Some(mut log) = log {
        log.sync().map_err(segments)?;
        sync_dir(into)?;
    }
    Ok(())
}

/// Reads the entries of a transfer from `r` through its end, handing each to `entry`: they
/// must be exactly `linked`'s, in order, each whole and decoding as the entry of its index,
/// and nothing may follow the end.
fn read_entries(
    r: &mut impl Read,
    linked: Option<(u64, u64)>,
    mut entry: impl FnMut(u64, &[u8]) -> Result<(), SnapshotError>,
) -> Result<(), SnapshotError> {
    let corrupt = |what: String| SnapshotError::Corrupt(what);
    let mut next = linked.map(|(first, _)| first);
    loop {
        let index = read_u64(r)?;
        if index == END {
            break;
        }
        let Some(expected) = next else {
            return Err(corrupt(format!(
                "entry {index} in a transfer that links no entries"
            )));
        };
        if index != expected {
            return Err(corrupt(format!(
                "entry {index} where entry {expected} was due"
            )));
        }
        let len = read_u32(r)?;
        if len > MAX_PAYLOAD {
            return Err(corrupt(format!("entry {index} of {len} bytes")));
        }
        let crc = read_u32(r)?;
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload)?;
        if frame_crc(index, &payload) != crc {
            return Err(corrupt(format!(
                "entry {index} is damaged: checksum mismatch"
            )));
        }
        let decoded = log::decode_entry(&payload).map_err(|e| corrupt(e.to_string()))?;
        if decoded.log_id.index != index {
            return Err(corrupt(format!(
                "entry {index} holds entry {}",
                decoded.log_id
            )));
        }
        entry(index, &payload)?;
        next = Some(index + 1);
    }
    let mut rest = [0u8; 1];
    if r.read(&mut rest)? != 0 {
        return Err(corrupt("bytes after the end of the transfer".into()));
    }
    if let (Some((_, last)), Some(next)) = (linked, next) {
        if next != last + 1 {
            return Err(corrupt(format!(
                "the transfer ends before entry {next}; its records need up to {last}"
            )));
        }
    }
    Ok(())
}

/// Checks a received linked transfer at `path` whole, as [`store_received`] will, and writes
/// nothing: its header, its snapshot file, and every entry. Returns the snapshot's meta.
pub fn verify(path: &Path) -> Result<FileMeta, SnapshotError> {
    let mut r = BufReader::new(File::open(path)?);
    let file_len = read_header(&mut r)?;
    let (meta, trailer) = snapshot::read_file((&mut r).take(file_len), |_, _| Ok(()))?;
    if trailer.version != LINKED_VERSION {
        return Err(SnapshotError::Corrupt(
            "a linked transfer must carry a linked snapshot file".into(),
        ));
    }
    read_entries(&mut r, trailer.linked, |_, _| Ok(()))?;
    Ok(meta)
}

/// Reads a transfer's magic and version; returns the length of its snapshot file.
fn read_header(r: &mut impl Read) -> Result<u64, SnapshotError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = read_u32(r)?;
    if version != VERSION {
        return Err(SnapshotError::Corrupt(format!(
            "linked transfer version {version}; this raftq reads version {VERSION}"
        )));
    }
    let file_len = read_u64(r)?;
    if file_len > MAX_FILE {
        return Err(SnapshotError::Corrupt(format!(
            "a snapshot file of {file_len} bytes in a linked transfer"
        )));
    }
    Ok(file_len)
}

/// Checks a received snapshot at `path` whole, in either form a follower takes (a linked
/// transfer, or the whole format), writing nothing; returns its meta.
pub fn verify_received(path: &Path) -> Result<FileMeta, SnapshotError> {
    let mut file = File::open(path)?;
    match is_transfer(&mut file)? {
        true => verify(path),
        false => snapshot::verify_whole(path),
    }
}

/// The linked snapshot at `path` as a transfer ([`write`]), made on a blocking thread as the
/// stream is read; nothing is read before it is first polled. A failure ends the stream with
/// the error.
pub fn stream(path: PathBuf) -> futures::stream::BoxStream<'static, io::Result<bytes::Bytes>> {
    snapshot::stream_on_a_thread(path, |path, out| write(path, out).map(|_| ()))
}

#[cfg(test)]
#[path = "transfer_tests.rs"]
mod tests;
