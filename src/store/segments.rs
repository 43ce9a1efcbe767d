//! Segment files: an append-only log of numbered entries in files of our own, the storage the
//! Raft log moves to so that a record's bytes are written once per node (an append and an
//! fdatasync) instead of through RocksDB's WAL, a memtable flush and compactions. `LogStore`
//! keeps the Raft log's entries here (ARCHITECTURE.md, "The Raft log in segment files").
//!
//! A directory holds segments named by their first index (`00000000000000000042.seg`). A
//! segment is [`MAGIC`] then frames: `u32` payload length, `u32` CRC-32C of the index and the
//! payload, `u64` index, the payload (integers little-endian). Indexes follow each other without
//! a gap, within a segment and from one segment to the next. A segment is created at its full
//! size ([`preallocate`]) and frames are written into it, so the bytes after the last frame
//! read as zeros: a header of zeros (or a rest too short for one, all zeros) is where the frames
//! end. A segment written before this layout ends where its file ends, and reads the same.
//!
//! A segment the log purged is kept for reuse (renamed `<n>.spare`, at most
//! [`MAX_SPARE_SEGMENTS`]) when nothing else holds it (no snapshot links its file, no caller is
//! syncing it), and the next segment is started in it: its blocks are already written, so an
//! fdatasync after an append into them writes the data alone, not also the metadata that marks
//! fresh blocks written (on ext4, about a quarter of the sync's time: docs/performance.md, step
//! 21). Its old frames stay beyond the new ones until overwritten, so every append writes a
//! header of zeros after its frame (as much of one as the segment has room for), which the next
//! append overwrites: the frames end where the zeros are, in a reused file as in a new one. An
//! older frame could not pass for the next entry anyway: it holds an entry at or below the purge
//! that freed the file, below any entry appended since.
//!
//! Durability: [`SegmentLog::sync`] fdatasyncs the segment being appended to; a segment is
//! fsynced before the next one is created, and the directory after every file created, renamed
//! or removed. Opening checks every frame. A frame that does not read whole (its length runs
//! past the end, its CRC or its index is wrong) is damage when its index is at or below
//! `durable` (the caller's record of what was fsynced, and so may have been acknowledged), or
//! when it is not in the last segment; the open then fails and names it. Otherwise it is the
//! torn tail of writes that were never synced: the file is cut before it, and that is reported.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::datadir::sync_dir;

/// First bytes of every segment file: what it is and its format.
pub const MAGIC: &[u8; 8] = b"RQSEG\x00\x00\x01";
const FRAME_HEADER: usize = 16;
/// Upper bound of one payload: a length above it is damage, not an allocation.
pub const MAX_PAYLOAD: u32 = 256 << 20;
/// Default size at which the log starts a new segment. A purge removes whole segments, so up to
/// one segment of purged entries stays on disk: small enough for a node's data directory to stay
/// bounded, large enough that starting a segment (a file created, a directory fsync) is rare.
pub const DEFAULT_SEGMENT_BYTES: u64 = 8 << 20;
/// Purged segments kept for reuse: 256 MiB of files at the default size, the default snapshot
/// policy's bytes, so that what one snapshot's purge frees can hold every segment written until
/// the next one. A purge beyond it removes files, as before.
pub const MAX_SPARE_SEGMENTS: usize = 32;
const SPARE_SUFFIX: &str = ".spare";

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment log {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("segment {path} is damaged at byte {position} (entry {index}): {reason}")]
    Damaged {
        path: PathBuf,
        position: u64,
        index: u64,
        reason: String,
    },
    #[error("entry {got} appended after entry {last}: entries follow each other")]
    OutOfOrder { last: u64, got: u64 },
    #[error("an entry of {0} bytes is larger than a segment frame holds")]
    TooLarge(usize),
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What opening found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub segments: usize,
    pub entries: u64,
    /// Bytes of a torn tail cut off the last segment (never-synced writes).
    pub cut_bytes: u64,
}

struct Segment {
    first: u64,
    path: PathBuf,
    /// Shared with a caller that syncs it outside its lock ([`SegmentLog::unsynced`]).
    file: Arc<File>,
    /// Byte position of each entry's frame, in index order from `first`.
    positions: Vec<u64>,
    /// Bytes in the file (where the next frame goes).
    len: u64,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.positions.is_empty()).then(|| self.first + self.positions.len() as u64 - 1)
    }
}

/// An open segment log. One writer: the caller serializes appends, truncations and purges.
pub struct SegmentLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    max_segment_bytes: u64,
    /// Whether the last segment has writes not yet synced.
    dirty: bool,
    /// Purged segment files kept for reuse, and the number the next one is named by.
    spares: Vec<PathBuf>,
    next_spare: u64,
}

fn file_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// A spare segment file's name: its number, in the order spares were made.
fn spare_name(n: u64) -> String {
    format!("{n}{SPARE_SUFFIX}")
}

fn frame_crc(index: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), payload)
}

/// Entry `index`'s frame: header and payload, with room left for the header of zeros an append
/// writes after it (so that adding them does not copy the frame).
fn frame(index: u64, payload: &[u8]) -> Result<Vec<u8>, SegmentError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_PAYLOAD)
        .ok_or(SegmentError::TooLarge(payload.len()))?;
    let mut frame = Vec::with_capacity(2 * FRAME_HEADER + payload.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&frame_crc(index, payload).to_le_bytes());
    frame.extend_from_slice(&index.to_le_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// Gives the segment its full size up front (`fallocate` without `FALLOC_FL_KEEP_SIZE`): its
/// blocks are reserved and read back as zeros until written, and its size does not change as
/// frames are appended, so an fdatasync after an append does not record a new size. It still
/// writes metadata: ext4 keeps the reserved blocks as unwritten extents and marks the ones an
/// append wrote as written at the fdatasync. Measured alone on ext4 (a 32 KiB append then an
/// fdatasync): about 270 µs when the file grows, 170 to 190 µs here, 95 to 110 µs into blocks
/// already written with zeros. No zeros are written: that would write every byte of the log
/// twice (docs/performance.md, step 16's experiments); a purged segment's file, whose blocks
/// are written, is reused instead when there is one. Best effort: on a file system without
/// `fallocate` the file grows as frames are appended.
fn preallocate(file: &File, bytes: u64) {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(bytes).unwrap_or(libc::off_t::MAX);
    // SAFETY: fallocate on a valid, owned file descriptor; it only reserves space.
    let _ = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
}

/// Whether `bytes` (a frame header, or a rest too short for one) are all zeros: the end of the
/// frames written, in a segment whose preallocated rest reads as zeros. No entry has an empty
/// payload, so no frame's header is.
fn is_end(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// Why a frame could not be read, and where the good part of its segment ends.
struct Bad {
    position: u64,
    reason: String,
}

/// Reads every frame of the segment at `path`, which must start at `first`.
fn scan(path: &Path, first: u64) -> Result<(Vec<u64>, u64, Option<Bad>), SegmentError> {
    let io = io_at(path);
    let file = File::open(path).map_err(&io)?;
    let size = file.metadata().map_err(&io)?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut magic = [0u8; 8];
    if size < MAGIC.len() as u64 {
        let reason = format!("{size} bytes, shorter than the segment header");
        return Ok((
            vec![],
            0,
            Some(Bad {
                position: 0,
                reason,
            }),
        ));
    }
    r.read_exact(&mut magic).map_err(&io)?;
    if &magic != MAGIC {
        let reason = "not a raftq segment (bad header)".to_string();
        return Ok((
            vec![],
            0,
            Some(Bad {
                position: 0,
                reason,
            }),
        ));
    }
    let mut positions = Vec::new();
    let mut pos = MAGIC.len() as u64;
    let mut payload = Vec::new();
    while pos < size {
        let index = first + positions.len() as u64;
        let bad = |reason: String| {
            Some(Bad {
                position: pos,
                reason,
            })
        };
        if size - pos < FRAME_HEADER as u64 {
            let mut rest = vec![0u8; (size - pos) as usize];
            r.read_exact(&mut rest).map_err(&io)?;
            if is_end(&rest) {
                // The preallocated rest, too short for a frame.
                return Ok((positions, pos, None));
            }
            return Ok((
                positions,
                pos,
                bad(format!("{} bytes of a frame header", size - pos)),
            ));
        }
        let mut header = [0u8; FRAME_HEADER];
        r.read_exact(&mut header).map_err(&io)?;
        if is_end(&header) {
            // The preallocated rest of the segment: what follows was never written, or is
            // what a torn write left there, beyond the last whole frame either way.
            return Ok((positions, pos, None));
        }
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
        let got = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let end = pos + FRAME_HEADER as u64 + u64::from(len);
        if len > MAX_PAYLOAD || end > size {
            return Ok((
                positions,
                pos,
                bad(format!("a frame of {len} bytes runs past the end")),
            ));
        }
        payload.resize(len as usize, 0);
        r.read_exact(&mut payload).map_err(&io)?;
        if frame_crc(got, &payload) != crc {
            return Ok((positions, pos, bad("checksum mismatch".into())));
        }
        if got != index {
            return Ok((
                positions,
                pos,
                bad(format!("holds entry {got} where {index} belongs")),
            ));
        }
        positions.push(pos);
        pos = end;
    }
    Ok((positions, pos, None))
}

/// The first indexes of the segment files in `dir` (their names), in order.
pub fn segment_firsts(dir: &Path) -> Result<Vec<u64>, SegmentError> {
    numbered_files(dir, ".seg")
}

/// The numbers that name the files `<number><suffix>` in `dir`, in order.
fn numbered_files(dir: &Path, suffix: &str) -> Result<Vec<u64>, SegmentError> {
    let io = io_at(dir);
    let mut numbers = Vec::new();
    for item in fs::read_dir(dir).map_err(&io)? {
        let name = item.map_err(&io)?.file_name();
        if let Some(n) = name
            .to_string_lossy()
            .strip_suffix(suffix)
            .and_then(|n| n.parse::<u64>().ok())
        {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

impl SegmentLog {
    /// Opens (creating if needed) the log in `dir`, checking every frame (see the module docs:
    /// `durable` is the highest index known synced).
    pub fn open(
        dir: &Path,
        durable: u64,
        max_segment_bytes: u64,
    ) -> Result<(SegmentLog, Recovery), SegmentError> {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let firsts = segment_firsts(dir)?;
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            max_segment_bytes: max_segment_bytes.max(MAGIC.len() as u64 + 1),
            dirty: false,
            spares: Vec::new(),
            next_spare: 0,
        };
        log.keep_spares()?;
        let mut recovery = Recovery::default();
        for (n, &first) in firsts.iter().enumerate() {
            let path = dir.join(file_name(first));
            let last_segment = n + 1 == firsts.len();
            log.check_follows(first, &path)?;
            let (positions, good_len, bad) = scan(&path, first)?;
            if let Some(bad) = bad {
                let index = first + positions.len() as u64;
                if !last_segment || index <= durable {
                    return Err(SegmentError::Damaged {
                        path,
                        position: bad.position,
                        index,
                        reason: bad.reason,
                    });
                }
                // The torn tail of writes never synced: cut it off (a segment left without
                // its header, made by a crash right after it was created, goes whole).
                let io = io_at(&path);
                if good_len == 0 {
                    recovery.cut_bytes += fs::metadata(&path).map_err(&io)?.len();
                    fs::remove_file(&path).map_err(&io)?;
                    sync_dir(dir).map_err(&io)?;
                    continue;
                }
                let file = OpenOptions::new().write(true).open(&path).map_err(&io)?;
                recovery.cut_bytes += file.metadata().map_err(&io)?.len() - good_len;
                file.set_len(good_len).map_err(&io)?;
                file.sync_all().map_err(&io)?;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_at(&path))?;
            if last_segment {
                preallocate(&file, log.max_segment_bytes);
                // What a crashed process wrote without syncing is in the page cache and reads
                // back whole: sync it now, so that everything the log holds once open is
                // durable (a caller may act on it as such, as apply does).
                file.sync_data().map_err(io_at(&path))?;
            }
            recovery.entries += positions.len() as u64;
            log.segments.push(Segment {
                first,
                path,
                file: Arc::new(file),
                positions,
                len: good_len,
            });
        }
        recovery.segments = log.segments.len();
        Ok((log, recovery))
    }

    /// Opens the segments in `dir` to read entries up to `through` only, changing nothing: a
    /// snapshot's linked segments (`store::snapshot`), which share their files with the log
    /// that wrote them and may be appended to meanwhile. A frame that does not read whole is
    /// damage at or below `through`, and the end of what is read above it.
    pub fn open_read_only(dir: &Path, through: u64) -> Result<SegmentLog, SegmentError> {
        let firsts = segment_firsts(dir)?;
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            segments: Vec::new(),
            max_segment_bytes: DEFAULT_SEGMENT_BYTES,
            dirty: false,
            spares: Vec::new(),
            next_spare: 0,
        };
        for first in firsts.into_iter().filter(|f| *f <= through) {
            let path = dir.join(file_name(first));
            log.check_follows(first, &path)?;
            let (mut positions, len, bad) = scan(&path, first)?;
            let held = first + positions.len() as u64;
            if let Some(bad) = bad.filter(|_| held <= through) {
                return Err(SegmentError::Damaged {
                    path,
                    position: bad.position,
                    index: held,
                    reason: bad.reason,
                });
            }
            positions.truncate((through + 1 - first) as usize);
            let file = File::open(&path).map_err(io_at(&path))?;
            log.segments.push(Segment {
                first,
                path,
                file: Arc::new(file),
                positions,
                len,
            });
        }
        Ok(log)
    }

    /// Hard-links into `into` (an existing directory) every segment file holding entries
    /// `first..=last`, which must all be in the log: a snapshot's record files, shared with the
    /// log instead of copied. Entries after `last` in the files are the log's, and readers of
    /// the links ignore them. The caller syncs `into`. Returns the number of files linked.
    pub fn link_range(&self, first: u64, last: u64, into: &Path) -> Result<usize, SegmentError> {
        let missing = |index: u64| SegmentError::Io {
            path: self.dir.clone(),
            source: io::Error::new(
                io::ErrorKind::NotFound,
                format!("entry {index} is not in the log, so it cannot be linked"),
            ),
        };
        if self.first_index().is_none_or(|f| f > first) {
            return Err(missing(first));
        }
        if self.last_index().is_none_or(|l| l < last) {
            return Err(missing(last));
        }
        let mut linked = 0;
        for seg in &self.segments {
            let Some(seg_last) = seg.last() else { continue };
            if seg_last < first || seg.first > last {
                continue;
            }
            let to = into.join(file_name(seg.first));
            fs::hard_link(&seg.path, &to).map_err(io_at(&to))?;
            linked += 1;
        }
        Ok(linked)
    }

    /// [`link_range`](Self::link_range), except that a file holding entries after `last` is
    /// not linked but copied up to `last`, into a new file of its own name, synced: so that
    /// files linked after these, from another log, start right after `last` (a follower's
    /// record files received with a snapshot end where its own log may already hold entries).
    /// At most one file is copied.
    pub fn link_or_copy(&self, first: u64, last: u64, into: &Path) -> Result<usize, SegmentError> {
        let straddles = self
            .segments
            .iter()
            .find(|s| s.first <= last && s.last().is_some_and(|l| l > last));
        let Some(seg) = straddles else {
            return self.link_range(first, last, into);
        };
        let (seg_first, linked) = match seg.first.checked_sub(1).filter(|l| *l >= first) {
            Some(before) => (seg.first, self.link_range(first, before, into)?),
            None => (first.max(seg.first), 0),
        };
        // Copied from its first entry, or from `first` when that is later.
        let path = into.join(file_name(seg_first));
        let io = io_at(&path);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(&io)?;
        let mut out = io::BufWriter::new(&mut file);
        out.write_all(MAGIC).map_err(&io)?;
        for index in seg_first..=last {
            let payload = self.read(index)?.ok_or_else(|| SegmentError::Io {
                path: self.dir.clone(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("entry {index} is not in the log, so it cannot be copied"),
                ),
            })?;
            out.write_all(&frame(index, &payload)?).map_err(&io)?;
        }
        out.flush().map_err(&io)?;
        drop(out);
        file.sync_all().map_err(&io)?;
        Ok(linked + 1)
    }

    /// A segment at `path` starting at `first` must start right after the last one opened.
    fn check_follows(&self, first: u64, path: &Path) -> Result<(), SegmentError> {
        match self.last_index().filter(|prev| first != prev + 1) {
            None => Ok(()),
            Some(prev) => Err(SegmentError::Damaged {
                path: path.to_path_buf(),
                position: 0,
                index: prev + 1,
                reason: format!("starts at entry {first}; the segment before ends at {prev}"),
            }),
        }
    }

    /// The first and last index held, if any.
    pub fn first_index(&self) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| !s.positions.is_empty())
            .map(|s| s.first)
    }

    pub fn last_index(&self) -> Option<u64> {
        self.segments.iter().rev().find_map(Segment::last)
    }

    /// The directory of the log's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends entry `index` (the one after the last, or any index on an empty log). Readable
    /// at once; durable after the next [`sync`](Self::sync).
    pub fn append(&mut self, index: u64, payload: &[u8]) -> Result<(), SegmentError> {
        self.check_next(index)?;
        let mut frame = frame(index, payload)?;
        let frame_len = frame.len() as u64;
        let roll = match self.segments.last() {
            None => true,
            // Emptied by a truncation, for entries that now start elsewhere.
            Some(s) if s.positions.is_empty() => s.first != index,
            Some(s) => s.len + frame_len > self.max_segment_bytes,
        };
        if roll {
            self.start_segment(index)?;
        }
        let Some(seg) = self.segments.last_mut() else {
            // `start_segment` above leaves one whenever there was none.
            return Err(SegmentError::Io {
                path: self.dir.clone(),
                source: io::Error::other("no segment to append to"),
            });
        };
        // Zeros after the frame: where the frames end (see the module docs).
        let room = self.max_segment_bytes.saturating_sub(seg.len + frame_len);
        frame.resize(frame.len() + room.min(FRAME_HEADER as u64) as usize, 0);
        seg.file
            .write_all_at(&frame, seg.len)
            .map_err(io_at(&seg.path))?;
        seg.positions.push(seg.len);
        seg.len += frame_len;
        self.dirty = true;
        Ok(())
    }

    fn check_next(&self, index: u64) -> Result<(), SegmentError> {
        match self.last_index() {
            Some(last) if index != last + 1 => Err(SegmentError::OutOfOrder { last, got: index }),
            _ => Ok(()),
        }
    }

    /// For a caller that syncs outside its lock, so that appends go on meanwhile: the file an
    /// fdatasync must reach to make every entry appended so far durable, with its path (`None`
    /// when nothing was appended since the last sync). The log counts it as synced from now on:
    /// the caller must sync it before it reports those entries durable, and must treat a failed
    /// sync as the end of the log (its pages may be lost, and a later sync would not say so).
    /// An append after this call needs the next one.
    pub fn unsynced(&mut self) -> Option<(Arc<File>, PathBuf)> {
        let seg = self.segments.last().filter(|_| self.dirty)?;
        self.dirty = false;
        Some((seg.file.clone(), seg.path.clone()))
    }

    /// Syncs the current segment (the earlier ones were synced when the next one started).
    pub fn sync(&mut self) -> Result<(), SegmentError> {
        if let (true, Some(seg)) = (self.dirty, self.segments.last()) {
            seg.file.sync_data().map_err(io_at(&seg.path))?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Syncs the current segment and starts a new one whose first entry will be `first`, in a
    /// spare file when there is one.
    fn start_segment(&mut self, first: u64) -> Result<(), SegmentError> {
        self.sync()?;
        let path = self.dir.join(file_name(first));
        let io = io_at(&path);
        let file = match self.spares.pop() {
            Some(spare) if !path.exists() => {
                fs::rename(&spare, &path).map_err(io_at(&spare))?;
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(&io)?;
                // No older bytes past the segment's size, where the frames may end with no
                // room for the zeros.
                file.set_len(self.max_segment_bytes).map_err(&io)?;
                file
            }
            spare => {
                self.spares.extend(spare);
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(&io)?
            }
        };
        preallocate(&file, self.max_segment_bytes);
        // The header, and the zeros where the frames end (a reused file holds older ones).
        let mut start = MAGIC.to_vec();
        start.resize(MAGIC.len() + FRAME_HEADER, 0);
        file.write_all_at(&start, 0).map_err(&io)?;
        file.sync_all().map_err(&io)?;
        sync_dir(&self.dir).map_err(&io)?;
        // An empty segment left by a truncation is replaced, not kept beside the new one.
        if self.segments.last().is_some_and(|s| s.positions.is_empty()) {
            if let Some(empty) = self.segments.pop() {
                fs::remove_file(&empty.path).map_err(io_at(&empty.path))?;
            }
        }
        self.segments.push(Segment {
            first,
            path: path.clone(),
            file: Arc::new(file),
            positions: Vec::new(),
            len: MAGIC.len() as u64,
        });
        Ok(())
    }

    /// Entry `index`'s payload, checked against its CRC; `None` when the log does not hold it.
    pub fn read(&self, index: u64) -> Result<Option<Vec<u8>>, SegmentError> {
        let Some(seg) = self
            .segments
            .iter()
            .rev()
            .find(|s| s.first <= index && s.last().is_some_and(|l| index <= l))
        else {
            return Ok(None);
        };
        let pos = seg.positions[(index - seg.first) as usize];
        let io = io_at(&seg.path);
        let mut header = [0u8; FRAME_HEADER];
        seg.file.read_exact_at(&mut header, pos).map_err(&io)?;
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
        let got = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let damaged = |reason: &str| SegmentError::Damaged {
            path: seg.path.clone(),
            position: pos,
            index,
            reason: reason.into(),
        };
        if len > MAX_PAYLOAD || pos + FRAME_HEADER as u64 + u64::from(len) > seg.len {
            return Err(damaged("its length runs past the frames written"));
        }
        let mut payload = vec![0u8; len as usize];
        seg.file
            .read_exact_at(&mut payload, pos + FRAME_HEADER as u64)
            .map_err(&io)?;
        if got != index || frame_crc(got, &payload) != crc {
            return Err(damaged("checksum mismatch on read"));
        }
        Ok(Some(payload))
    }

    /// Removes entry `index` and every entry after it, durably (a follower's log that
    /// conflicts with its leader's).
    pub fn truncate_from(&mut self, index: u64) -> Result<(), SegmentError> {
        // Whole segments from `index` on go, except a segment starting at `index` that is the
        // only one: it stays, emptied below, so the log keeps a file to append to.
        loop {
            let others = self.segments.len().saturating_sub(1);
            let Some(seg) = self
                .segments
                .pop_if(|s| s.first > index || (s.first == index && others > 0))
            else {
                break;
            };
            fs::remove_file(&seg.path).map_err(io_at(&seg.path))?;
        }
        if let Some(seg) = self.segments.last_mut() {
            let keep = index.saturating_sub(seg.first) as usize;
            if keep < seg.positions.len() {
                let cut = seg.positions[keep];
                seg.positions.truncate(keep);
                seg.len = cut;
                seg.file.set_len(cut).map_err(io_at(&seg.path))?;
                preallocate(&seg.file, self.max_segment_bytes);
                seg.file.sync_all().map_err(io_at(&seg.path))?;
            }
        }
        self.dirty = false;
        sync_dir(&self.dir).map_err(io_at(&self.dir))
    }

    /// Removes every whole segment whose entries are all at or below `index`, the one being
    /// appended to included (the log is then empty, and its next append may have any index:
    /// Raft purges past its last entry when a snapshot replaces the whole log). Returns the
    /// first index still held.
    pub fn purge_to(&mut self, index: u64) -> Result<Option<u64>, SegmentError> {
        let mut removed = false;
        while self
            .segments
            .first()
            .is_some_and(|s| s.last().is_none_or(|l| l <= index))
        {
            let seg = self.segments.remove(0);
            self.retire(seg)?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        }
        Ok(self.first_index())
    }

    /// A purged segment's file: kept as a spare when there is room and nothing else holds it
    /// (a snapshot's hard link, or a caller syncing it outside the lock: its old inode must not
    /// be written again under them), removed otherwise. The caller syncs the directory.
    fn retire(&mut self, seg: Segment) -> Result<(), SegmentError> {
        use std::os::unix::fs::MetadataExt;
        let io = io_at(&seg.path);
        let alone =
            Arc::strong_count(&seg.file) == 1 && seg.file.metadata().map_err(&io)?.nlink() == 1;
        if alone && self.spares.len() < MAX_SPARE_SEGMENTS {
            let spare = self.dir.join(spare_name(self.next_spare));
            self.next_spare += 1;
            fs::rename(&seg.path, &spare).map_err(&io)?;
            self.spares.push(spare);
        } else {
            fs::remove_file(&seg.path).map_err(&io)?;
        }
        Ok(())
    }

    /// At open: the spare files in the directory, kept up to [`MAX_SPARE_SEGMENTS`] and
    /// removed beyond it.
    fn keep_spares(&mut self) -> Result<(), SegmentError> {
        let mut found = numbered_files(&self.dir, SPARE_SUFFIX)?;
        self.next_spare = found.last().map_or(0, |n| n + 1);
        let extra = found.len().saturating_sub(MAX_SPARE_SEGMENTS);
        for n in found.drain(..extra) {
            let path = self.dir.join(spare_name(n));
            fs::remove_file(&path).map_err(io_at(&path))?;
        }
        if extra > 0 {
            sync_dir(&self.dir).map_err(io_at(&self.dir))?;
        }
        self.spares = found
            .into_iter()
            .map(|n| self.dir.join(spare_name(n)))
            .collect();
        Ok(())
    }

    /// How many purged segment files are kept for reuse.
    pub fn spare_count(&self) -> usize {
        self.spares.len()
    }
}

#[cfg(test)]
#[path = "segments_tests.rs"]
pub(super) mod tests;
