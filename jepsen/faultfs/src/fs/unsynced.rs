//! The model of unsynced data: the space limit on the files' total size, and every change of
//! a file's content or size since its last sync, saved (in the file's undo record) so that a
//! power loss can restore the synced content.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{Errno, FileHandle};

use super::{apparent_size, errno, lock, FileEntry, Shared};
use crate::sys;
use crate::undo::Undo;

impl Shared {
    // ---- space -------------------------------------------------------------------------------

    /// Takes `n` bytes of the space limit, or fails with ENOSPC and takes nothing.
    fn reserve(&self, n: u64) -> Result<(), Errno> {
        if n == 0 {
            return Ok(());
        }
        let mut space = lock(&self.space);
        if let Some(limit) = space.limit {
            if space.used.saturating_add(n) > limit {
                drop(space);
                self.enospc.fetch_add(1, Ordering::Relaxed);
                return Err(Errno::ENOSPC);
            }
        }
        space.used += n;
        Ok(())
    }

    /// Fails with ENOSPC if `n` more bytes would not fit, without taking them.
    fn check_space(&self, n: u64) -> Result<(), Errno> {
        let space = lock(&self.space);
        match space.limit {
            Some(limit) if n > 0 && space.used.saturating_add(n) > limit => {
                drop(space);
                self.enospc.fetch_add(1, Ordering::Relaxed);
                Err(Errno::ENOSPC)
            }
            _ => Ok(()),
        }
    }

    fn release_space(&self, n: u64) {
        let mut space = lock(&self.space);
        space.used = space.used.saturating_sub(n);
    }

    pub(super) fn recount_space(&self) {
        let used = apparent_size(&self.backing);
        lock(&self.space).used = used;
    }

    pub(crate) fn set_space_limit(&self, limit: Option<u64>) {
        self.recount_space();
        lock(&self.space).limit = limit;
    }

    // ---- file content ------------------------------------------------------------------------

    fn entry(&self, ino: u64) -> Arc<FileEntry> {
        lock(&self.files).entry(ino).or_default().clone()
    }

    fn existing_entry(&self, ino: u64) -> Option<Arc<FileEntry>> {
        lock(&self.files).get(&ino).cloned()
    }

    /// The undo record of a file about to change, created with the current size as the synced
    /// size if the file is clean.
    fn undo_for(undo: &mut Option<Undo>, fd: RawFd, size: u64) -> io::Result<&mut Undo> {
        if undo.is_none() {
            let file = sys::reopen(fd, libc::O_RDWR)?;
            *undo = Some(Undo::new(file, size));
        }
        undo.as_mut()
            .ok_or_else(|| io::Error::other("undo record missing"))
    }

    pub(super) fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let of = self.open_file(fh)?;
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let end = offset
            .checked_add(u64::from(len))
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(Errno::EFBIG)?;
        let entry = self.entry(of.ino);
        let mut undo = lock(&entry.undo);
        let size = of.file.metadata().map_err(|e| errno(&e))?.len();
        let grow = end.saturating_sub(size);
        self.reserve(grow)?;
        let res = (|| -> io::Result<()> {
            let u = Self::undo_for(&mut undo, of.file.as_raw_fd(), size)?;
            u.save(offset, end, &self.shadow_dir)?;
            of.file.write_all_at(data, offset)?;
            u.set_size(size.max(end));
            Ok(())
        })();
        if let Err(e) = res {
            // Give back what was not used (a partial write may have grown the file).
            let now = of.file.metadata().map(|m| m.len()).unwrap_or(size);
            if let Some(u) = undo.as_mut() {
                u.set_size(now);
            }
            self.release_space(grow.saturating_sub(now.saturating_sub(size)));
            return Err(errno(&e));
        }
        drop(undo);
        if of.sync_writes {
            self.sync_file(of.ino, &of.file, true)
                .map_err(|e| errno(&e))?;
        }
        Ok(len)
    }

    /// Truncates or extends the file behind the node `fd` to `new_size`.
    pub(super) fn set_size(&self, ino: u64, fd: RawFd, new_size: u64) -> Result<(), Errno> {
        if new_size > i64::MAX as u64 {
            return Err(Errno::EFBIG);
        }
        let file = sys::reopen(fd, libc::O_RDWR).map_err(|e| errno(&e))?;
        let entry = self.entry(ino);
        let mut undo = lock(&entry.undo);
        let size = file.metadata().map_err(|e| errno(&e))?.len();
        if new_size == size {
            return Ok(());
        }
        let grow = new_size.saturating_sub(size);
        self.reserve(grow)?;
        let res = (|| -> io::Result<()> {
            let u = Self::undo_for(&mut undo, file.as_raw_fd(), size)?;
            u.save(new_size, size, &self.shadow_dir)?;
            file.set_len(new_size)?;
            u.set_size(new_size);
            Ok(())
        })();
        match res {
            Ok(()) => {
                self.release_space(size.saturating_sub(new_size));
                Ok(())
            }
            Err(e) => {
                self.release_space(grow);
                Err(errno(&e))
            }
        }
    }

    pub(super) fn fallocate(
        &self,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let of = self.open_file(fh)?;
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or(Errno::EFBIG)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let op = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let entry = self.entry(of.ino);
        let mut undo = lock(&entry.undo);
        let size = of.file.metadata().map_err(|e| errno(&e))?.len();
        let beyond = end.saturating_sub(size);
        // Changed bytes below the synced size, if any.
        let overwritten = match op {
            0 => None,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Some((offset, end.min(size))),
            libc::FALLOC_FL_ZERO_RANGE => Some((offset, end.min(size))),
            _ => return Err(Errno::EOPNOTSUPP),
        };
        // Preallocation past the end needs the space even when the size stays.
        let grow = if keep_size { 0 } else { beyond };
        if keep_size {
            self.check_space(beyond)?;
        } else {
            self.reserve(grow)?;
        }
        let res = (|| -> io::Result<()> {
            if grow > 0 || overwritten.is_some() {
                let u = Self::undo_for(&mut undo, of.file.as_raw_fd(), size)?;
                if let Some((a, b)) = overwritten {
                    u.save(a, b, &self.shadow_dir)?;
                }
                sys::fallocate(&of.file, mode, offset, length)?;
                u.set_size(size + grow);
            } else {
                sys::fallocate(&of.file, mode, offset, length)?;
            }
            Ok(())
        })();
        res.map_err(|e| {
            self.release_space(grow);
            errno(&e)
        })
    }

    /// Makes the file durable: the backing file is synced and its undo record forgotten.
    pub(super) fn sync_file(&self, ino: u64, file: &File, datasync: bool) -> io::Result<()> {
        match self.existing_entry(ino) {
            Some(entry) => {
                let mut undo = lock(&entry.undo);
                if datasync {
                    file.sync_data()?;
                } else {
                    file.sync_all()?;
                }
                *undo = None;
                Ok(())
            }
            None if datasync => file.sync_data(),
            None => file.sync_all(),
        }
    }

    /// Forgets the state of a file whose last name is gone (given its `stat` from before).
    pub(super) fn forget_unlinked(&self, st: &libc::stat) {
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 {
            self.release_space(st.st_size as u64);
            lock(&self.files).remove(&self.fuse_ino(st));
        }
    }
}
