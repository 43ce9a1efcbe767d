//! The durable watermark: how much of its Raft log and which vote this node has had on disk,
//! recorded outside RocksDB, so that start-up can tell a store that is whole from one that
//! silently lost what it had fsynced.
//!
//! RocksDB recovers a WAL whose tail is incomplete (a torn write, the expected result of a power
//! loss) by dropping that tail, and it cannot tell a tail cut off by a truncation or a lost
//! block from one that was never synced. After such a loss the node would open with a shorter
//! log and an older vote than it had acknowledged: it could vote for a candidate missing
//! entries it helped commit. The watermark catches that: a log that ends below the watermark,
//! or a vote in an older term than the watermark's, is a store that lost acknowledged data.
//!
//! What is recorded, and when:
//! - the vote's term, synchronously, after every vote is saved (votes are rare);
//! - the last log index known fsynced, lazily: after the log's WAL fsyncs, at most every
//!   [`LAZY_EVERY`], on a thread of its own, never on the write path (so it lags behind the
//!   log by at most that, and a loss of only the last moment's entries is caught by the
//!   leader's record of what this node acknowledged instead; see `server::store_check`);
//! - a lower log index, synchronously, before the log is truncated (a follower's
//!   uncommitted tail replaced by the leader's log), so the watermark never claims entries that
//!   were removed on purpose.
//!
//! The file (`DURABLE` in the data directory) is a [`SlotFile`]: two fixed slots written in
//! turn and fdatasynced, each with a sequence number and a CRC-32, so that a torn write of one
//! slot leaves the other, older one valid.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::slots::{Kind, SlotFile};

/// The watermark file's name in the data directory.
pub const FILE: &str = "DURABLE";
/// Longest the log index of the watermark lags behind the log's fsyncs.
pub const LAZY_EVERY: Duration = Duration::from_millis(100);

const KIND: Kind = Kind {
    magic: 0x5251_4457, // "RQDW"
    format: 1,
};

/// What the watermark says is durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// Every log entry up to this index was fsynced (or removed from the front by a purge,
    /// behind a snapshot).
    pub log_index: u64,
    /// A vote in this term was fsynced.
    pub vote_term: u64,
}

impl Marks {
    fn words(self) -> [u64; 2] {
        [self.log_index, self.vote_term]
    }

    fn from_words([log_index, vote_term]: [u64; 2]) -> Marks {
        Marks {
            log_index,
            vote_term,
        }
    }
}

/// Reads the watermark of the data directory `dir`: `Ok(None)` when there is none (a new
/// directory, or one from before watermarks); an error when the file exists but neither slot
/// is valid.
pub fn read(dir: &Path) -> io::Result<Option<Marks>> {
    let path = dir.join(FILE);
    SlotFile::<2>::read(&path, KIND)
        .map(|found| found.map(Marks::from_words))
        .map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} holds no valid watermark", path.display()),
            ),
            _ => e,
        })
}

struct Slots {
    file: SlotFile<2>,
    marks: Marks,
}

impl Slots {
    fn write(&mut self, marks: Marks) -> io::Result<()> {
        if marks == self.marks {
            return Ok(());
        }
        self.file.write(&marks.words(), true)?;
        self.marks = marks;
        Ok(())
    }
}

/// Keeps the watermark file of one data directory. Cheap to share (`Arc`).
pub struct Watermark {
    path: PathBuf,
    slots: Mutex<Slots>,
    /// Highest log index known fsynced, not yet necessarily in the file.
    flushed: AtomicU64,
    /// Bumped by every truncation: a flush reported for appends written before it must not
    /// raise the watermark (the entries it covered may be gone).
    epoch: AtomicU64,
    /// Makes a flush's epoch check and raise one step against a truncation's bump and lowering,
    /// without the file's lock: a flush report must never wait for the file's fsync.
    progress: Mutex<()>,
    wake: Condvar,
    pending: Mutex<bool>,
    stop: AtomicBool,
    /// The first error writing the file, if any (then the log store fails its next write).
    failed: Mutex<Option<String>>,
}

impl Watermark {
    /// Opens (creating if needed) the watermark of `dir`, starting from `current` (what the
    /// store holds now, checked against the file by the caller before this).
    pub fn open(dir: &Path, current: Marks) -> io::Result<Arc<Watermark>> {
        let path = dir.join(FILE);
        let (file, _, existed) = SlotFile::open(&path, KIND)?;
        // Start from what the store holds now: never more than was found on disk before. (The
        // marks set here differ from any `current`, so that it is written.)
        let mut slots = Slots {
            file,
            marks: Marks {
                log_index: u64::MAX,
                vote_term: u64::MAX,
            },
        };
        slots.write(current)?;
        if !existed {
            super::datadir::sync_dir(dir)?;
        }
        Ok(Arc::new(Watermark {
            path,
            flushed: AtomicU64::new(current.log_index),
            slots: Mutex::new(slots),
            epoch: AtomicU64::new(0),
            progress: Mutex::new(()),
            wake: Condvar::new(),
            pending: Mutex::new(false),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
        }))
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current truncation epoch, to hand back to [`flushed`](Self::flushed).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Appends up to `index`, written in truncation epoch `epoch`, are fsynced: the file will
    /// say so within [`LAZY_EVERY`] (if no truncation came in between).
    pub fn flushed(&self, index: u64, epoch: u64) {
        {
            let _progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            if epoch != self.epoch.load(Ordering::SeqCst) {
                return;
            }
            self.flushed.fetch_max(index, Ordering::SeqCst);
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *pending = true;
        self.wake.notify_one();
    }

    /// The log is about to be truncated after `index`: lowers the watermark to at most
    /// `index`, durably, before the truncation happens.
    pub fn truncating(&self, index: u64) -> io::Result<()> {
        let mut slots = self.slots();
        {
            let _progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            self.epoch.fetch_add(1, Ordering::SeqCst);
            let lowered = self.flushed.load(Ordering::SeqCst).min(index);
            self.flushed.store(lowered, Ordering::SeqCst);
        }
        let marks = Marks {
            log_index: slots.marks.log_index.min(index),
            ..slots.marks
        };
        slots.write(marks)
    }

    /// A vote in `term` was saved durably: records it now.
    pub fn voted(&self, term: u64) -> io::Result<()> {
        let mut slots = self.slots();
        let marks = Marks {
            vote_term: slots.marks.vote_term.max(term),
            ..slots.marks
        };
        slots.write(marks)
    }

    /// Writes the flushed index reported so far, if it moved.
    fn write_flushed(&self) -> io::Result<()> {
        let mut slots = self.slots();
        let marks = Marks {
            log_index: self.flushed.load(Ordering::SeqCst),
            ..slots.marks
        };
        if marks.log_index > slots.marks.log_index {
            slots.write(marks)?;
        }
        Ok(())
    }

    /// What the file says now.
    pub fn marks(&self) -> Marks {
        self.slots().marks
    }

    /// The first error of the background writer, if any.
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs the lazy writer until [`stop`](Self::stop): the flushed index goes to the file at
    /// most every [`LAZY_EVERY`].
    pub fn run_writer(self: Arc<Self>) {
        loop {
            {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                while !*pending && !self.stop.load(Ordering::SeqCst) {
                    pending = self.wake.wait(pending).unwrap_or_else(|p| p.into_inner());
                }
                *pending = false;
            }
            if let Err(e) = self.write_flushed() {
                let msg = format!("writing {}: {e}", self.path.display());
                tracing::error!("{msg}");
                let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                failed.get_or_insert(msg);
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(LAZY_EVERY);
        }
    }

    /// Ends [`run_writer`](Self::run_writer) after one last write.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        *pending = true;
        self.wake.notify_one();
    }
}

/// What a store holds now compared with its watermark: `Err` with what is missing when it
/// holds less than the watermark says was durable.
pub fn check(found: Marks, watermark: Marks) -> Result<(), String> {
    let mut missing = Vec::new();
    if found.log_index < watermark.log_index {
        missing.push(format!(
            "its Raft log ends at index {} but reached {} on disk before",
            found.log_index, watermark.log_index
        ));
    }
    if found.vote_term < watermark.vote_term {
        missing.push(format!(
            "its vote is in term {} but a vote in term {} was on disk before",
            found.vote_term, watermark.vote_term
        ));
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(log_index: u64, vote_term: u64) -> Marks {
        Marks {
            log_index,
            vote_term,
        }
    }

    /// A slot of the `DURABLE` file as today's code writes it (format 1): it reads back, and
    /// writes again byte for byte. A new layout gets a new format number beside this one.
    #[test]
    fn a_slot_reads_back_and_writes_again_byte_for_byte() {
        const SLOT: &str = concat!(
            "57445152010000000900000000000000",
            "2a000000000000000700000000000000e64dcb2400000000",
        );
        let bytes = crate::codec::unhex(SLOT);
        let marks = Marks {
            log_index: 42,
            vote_term: 7,
        };
        assert_eq!(
            SlotFile::<2>::decode(KIND, &bytes),
            Some((9, marks.words()))
        );
        assert_eq!(
            SlotFile::<2>::encode(KIND, 9, &marks.words()),
            bytes,
            "the slot's layout changed"
        );
    }

    #[test]
    fn slots_alternate_and_a_torn_slot_leaves_the_older_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()).expect("read"), None);
        let w = Watermark::open(dir.path(), marks(5, 1)).expect("open");
        assert_eq!(read(dir.path()).expect("read"), Some(marks(5, 1)));
        w.voted(3).expect("vote");
        w.flushed(9, w.epoch());
        w.write_flushed().expect("write");
        assert_eq!(read(dir.path()).expect("read"), Some(marks(9, 3)));
        // Tear the newest slot: the one before it is read.
        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path).expect("file");
        const SLOT_BYTES: usize = SlotFile::<2>::SLOT_BYTES;
        let newest = (w.slots().file.seq() % 2) as usize * SLOT_BYTES;
        bytes[newest + 20] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        assert_eq!(read(dir.path()).expect("read"), Some(marks(5, 3)));
        // Both torn: an error, never a made-up watermark.
        bytes[(1 - newest / SLOT_BYTES) * SLOT_BYTES + 3] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        assert!(read(dir.path()).is_err());
    }

    #[test]
    fn a_truncation_lowers_the_watermark_and_older_flushes_cannot_raise_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = Watermark::open(dir.path(), marks(0, 1)).expect("open");
        let before = w.epoch();
        w.flushed(100, before);
        w.write_flushed().expect("write");
        assert_eq!(w.marks(), marks(100, 1));
        w.truncating(90).expect("truncate");
        assert_eq!(read(dir.path()).expect("read"), Some(marks(90, 1)));
        // A flush of appends written before the truncation comes late: ignored.
        w.flushed(100, before);
        w.write_flushed().expect("write");
        assert_eq!(w.marks().log_index, 90);
        // New appends after it count.
        w.flushed(93, w.epoch());
        w.write_flushed().expect("write");
        assert_eq!(w.marks().log_index, 93);
    }

    #[test]
    fn the_store_is_checked_against_the_watermark() {
        assert_eq!(check(marks(10, 2), marks(10, 2)), Ok(()));
        assert_eq!(check(marks(12, 3), marks(10, 2)), Ok(()));
        let err = check(marks(7, 2), marks(10, 2)).expect_err("lost log");
        assert!(err.contains("ends at index 7 but reached 10"), "{err}");
        let err = check(marks(10, 1), marks(10, 2)).expect_err("lost vote");
        assert!(err.contains("term 1"), "{err}");
    }

    #[test]
    fn the_lazy_writer_catches_up_and_stops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = Watermark::open(dir.path(), marks(0, 0)).expect("open");
        let thread = std::thread::spawn({
            let w = w.clone();
            move || w.run_writer()
        });
        w.flushed(42, w.epoch());
        w.stop();
        thread.join().expect("writer");
        assert_eq!(read(dir.path()).expect("read"), Some(marks(42, 0)));
        assert_eq!(w.failure(), None);
    }
}
