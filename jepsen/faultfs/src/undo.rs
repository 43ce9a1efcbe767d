//! The undo record of one file: what its synced content was, where it differs now.
//!
//! Writes go to the backing file at once. Before a byte below the synced size is changed for the
//! first time since the last sync, its synced value (the pre-image) is copied into a shadow file
//! at the same offset. The shadow is an unnamed sparse temporary file, so it costs disk space
//! only for the bytes saved, and nothing is held in memory but the list of saved ranges.
//! Restoring writes the saved ranges back and truncates the file to its synced size; syncing
//! simply forgets the record.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::sys;

/// Copies are done in pieces of this size.
const CHUNK: usize = 1 << 20;

#[derive(Debug)]
pub(crate) struct Undo {
    /// A read-write descriptor of the backing file: pre-images are read and restored through it.
    file: File,
    /// The file's size at its last sync.
    synced_size: u64,
    /// The file's size now (kept up to date by every change).
    size: u64,
    /// Saved ranges of `[0, synced_size)`, start -> end, disjoint and not adjacent.
    saved: BTreeMap<u64, u64>,
    saved_bytes: u64,
    /// Where the pre-images are, at their own offsets; created on the first one.
    shadow: Option<File>,
}

impl Undo {
    pub(crate) fn new(file: File, synced_size: u64) -> Undo {
        Undo {
            file,
            synced_size,
            size: synced_size,
            saved: BTreeMap::new(),
            saved_bytes: 0,
            shadow: None,
        }
    }

    pub(crate) fn set_size(&mut self, size: u64) {
        self.size = size;
    }

    /// Bytes a restore would change: pre-images saved plus growth past the synced size.
    pub(crate) fn unsynced_bytes(&self) -> u64 {
        self.saved_bytes + self.size.saturating_sub(self.synced_size)
    }

    /// Syncs the backing file through the record's own descriptor.
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// True when the backing file has no name left (it was unlinked): nothing to restore.
    pub(crate) fn is_unlinked(&self) -> io::Result<bool> {
        Ok(sys::fstat(self.file.as_raw_fd())?.st_nlink == 0)
    }

    /// Saves the synced content of `[start, end)` that is not saved yet, before it is changed.
    pub(crate) fn save(&mut self, start: u64, end: u64, shadow_dir: &Path) -> io::Result<()> {
        let end = end.min(self.synced_size);
        if start >= end {
            return Ok(());
        }
        let gaps = gaps(&self.saved, start, end);
        if gaps.is_empty() {
            return Ok(());
        }
        if self.shadow.is_none() {
            self.shadow = Some(tempfile::tempfile_in(shadow_dir).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot create an undo file in {}: {e}",
                        shadow_dir.display()
                    ),
                )
            })?);
        }
        let Some(shadow) = self.shadow.as_ref() else {
            return Err(io::Error::other("undo file missing"));
        };
        for &(a, b) in &gaps {
            copy_range(&self.file, shadow, a, b)?;
        }
        for (a, b) in gaps {
            insert(&mut self.saved, a, b);
            self.saved_bytes += b - a;
        }
        Ok(())
    }

    /// Puts the synced content back: the saved pre-images, then the synced size.
    pub(crate) fn restore(&self) -> io::Result<()> {
        if let Some(shadow) = &self.shadow {
            for (&a, &b) in &self.saved {
                copy_range(shadow, &self.file, a, b)?;
            }
        }
        self.file.set_len(self.synced_size)
    }
}

/// Copies `[start, end)` from `src` to the same offsets of `dst`; bytes past the end of `src`
/// are copied as zeros.
fn copy_range(src: &File, dst: &File, start: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min((end - start) as usize)];
    let mut pos = start;
    while pos < end {
        let want = CHUNK.min((end - pos) as usize);
        let chunk = &mut buf[..want];
        let mut got = 0;
        while got < want {
            match src.read_at(&mut chunk[got..], pos + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        chunk[got..].fill(0);
        dst.write_all_at(chunk, pos)?;
        pos += want as u64;
    }
    Ok(())
}

/// The parts of `[start, end)` that no range of `saved` covers, in order.
fn gaps(saved: &BTreeMap<u64, u64>, start: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = start;
    // A range that starts before `start` may reach into it.
    if let Some((_, &e)) = saved.range(..start).next_back() {
        pos = pos.max(e);
    }
    for (&s, &e) in saved.range(start..end) {
        if s > pos {
            out.push((pos, s));
        }
        pos = pos.max(e);
        if pos >= end {
            break;
        }
    }
    if pos < end {
        out.push((pos, end));
    }
    out
}

/// Adds `[start, end)`, which overlaps no range of `saved`, merging it with adjacent ranges.
fn insert(saved: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    if let Some((&s, &e)) = saved.range(..=start).next_back() {
        if e >= start {
            saved.remove(&s);
            start = s;
            end = end.max(e);
        }
    }
    if let Some(&e) = saved.get(&end) {
        saved.remove(&end);
        end = e;
    }
    saved.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(ranges: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        ranges.iter().copied().collect()
    }

    #[test]
    fn gaps_cover_what_is_not_saved() {
        let saved = map(&[(10, 20), (30, 40)]);
        assert_eq!(gaps(&saved, 0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(gaps(&saved, 15, 35), vec![(20, 30)]);
        assert_eq!(gaps(&saved, 10, 20), vec![]);
        assert_eq!(gaps(&saved, 12, 18), vec![]);
        assert_eq!(gaps(&saved, 5, 12), vec![(5, 10)]);
        assert_eq!(gaps(&saved, 20, 30), vec![(20, 30)]);
        assert_eq!(gaps(&saved, 40, 41), vec![(40, 41)]);
        assert_eq!(gaps(&BTreeMap::new(), 3, 7), vec![(3, 7)]);
    }

    #[test]
    fn insert_merges_neighbours() {
        let mut saved = map(&[(10, 20), (30, 40)]);
        insert(&mut saved, 20, 30);
        assert_eq!(saved, map(&[(10, 40)]));
        let mut saved = map(&[(10, 20)]);
        insert(&mut saved, 0, 5);
        insert(&mut saved, 25, 30);
        assert_eq!(saved, map(&[(0, 5), (10, 20), (25, 30)]));
        insert(&mut saved, 5, 10);
        assert_eq!(saved, map(&[(0, 20), (25, 30)]));
    }

    /// A file holding `0123456789` in a directory of its own, opened for reading and writing.
    fn ten_bytes() -> (tempfile::TempDir, std::path::PathBuf, std::fs::File) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").expect("write");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        (dir, path, file)
    }

    #[test]
    fn restore_puts_back_first_pre_images_and_size() {
        let (dir, path, file) = ten_bytes();
        let mut undo = Undo::new(file.try_clone().expect("clone"), 10);
        undo.save(2, 5, dir.path()).expect("save");
        file.write_all_at(b"abc", 2).expect("write");
        // A second overwrite of the same bytes keeps the first pre-image.
        undo.save(3, 8, dir.path()).expect("save");
        file.write_all_at(b"XYZWV", 3).expect("write");
        undo.save(8, 30, dir.path()).expect("save");
        file.write_all_at(b"past the end", 8).expect("write");
        undo.set_size(20);
        assert_eq!(undo.unsynced_bytes(), 8 + 10);
        undo.restore().expect("restore");
        assert_eq!(std::fs::read(&path).expect("read"), b"0123456789");
    }

    #[test]
    fn restore_undoes_a_truncation() {
        let (dir, path, file) = ten_bytes();
        let mut undo = Undo::new(file.try_clone().expect("clone"), 10);
        undo.save(4, 10, dir.path()).expect("save");
        file.set_len(4).expect("truncate");
        file.write_all_at(b"zz", 6).expect("write");
        undo.restore().expect("restore");
        assert_eq!(std::fs::read(&path).expect("read"), b"0123456789");
    }
}
