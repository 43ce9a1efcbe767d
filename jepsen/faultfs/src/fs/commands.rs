//! What the control does to the whole file system: sync every file, drop every unsynced write
//! (the power loss), and the statistics.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{Errno, INodeNo};

use super::{lock, FileEntry, Shared};
use crate::{DropReport, Stats};

impl Shared {
    // ---- control -----------------------------------------------------------------------------

    fn entries(&self) -> Vec<Arc<FileEntry>> {
        lock(&self.files).values().cloned().collect()
    }

    /// Forgets clean entries nobody is using.
    fn prune_entries(&self) {
        lock(&self.files).retain(|_, e| {
            Arc::strong_count(e) > 1
                || match e.undo.try_lock() {
                    Ok(u) => u.is_some(),
                    Err(_) => true,
                }
        });
    }

    pub(crate) fn sync_all(&self) -> io::Result<u64> {
        let mut files = 0;
        let mut first_err = None;
        for entry in self.entries() {
            let mut undo = lock(&entry.undo);
            if let Some(u) = undo.as_ref() {
                match u.sync() {
                    Ok(()) => {
                        *undo = None;
                        files += 1;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        self.prune_entries();
        match first_err {
            Some(e) => Err(e),
            None => Ok(files),
        }
    }

    pub(crate) fn drop_unsynced(&self) -> io::Result<DropReport> {
        // Stalled syncs never complete: the power went before they did.
        let stalled = std::mem::take(&mut lock(&self.syncs).pending);
        let mut report = DropReport {
            failed_fsyncs: stalled.len() as u64,
            ..DropReport::default()
        };
        for p in stalled {
            p.reply.error(Errno::EIO);
        }
        let mut first_err = None;
        for entry in self.entries() {
            let mut undo = lock(&entry.undo);
            let Some(u) = undo.as_ref() else { continue };
            let res = u.is_unlinked().and_then(|unlinked| {
                if unlinked {
                    Ok(false)
                } else {
                    u.restore().map(|()| true)
                }
            });
            match res {
                Ok(restored) => {
                    if restored {
                        report.files += 1;
                        report.bytes += u.unsynced_bytes();
                    }
                    *undo = None;
                }
                // The record stays: a second drop restores again.
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.prune_entries();
        self.recount_space();
        self.drops.fetch_add(1, Ordering::Relaxed);
        self.invalidate_kernel_caches();
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Tells the kernel to forget cached attributes and data of every inode it knows.
    fn invalidate_kernel_caches(&self) {
        let notifier = lock(&self.notifier).clone();
        let Some(notifier) = notifier else { return };
        let inos: Vec<u64> = lock(&self.nodes).keys().copied().collect();
        for ino in inos {
            // An inode the kernel already forgot answers ENOENT: nothing to do then.
            let _ = notifier.inval_inode(INodeNo(ino), 0, 0);
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut unsynced_bytes = 0;
        let mut unsynced_files = 0;
        for entry in self.entries() {
            if let Some(u) = lock(&entry.undo).as_ref() {
                unsynced_files += 1;
                unsynced_bytes += u.unsynced_bytes();
            }
        }
        let (fsync_delay, pending_fsyncs) = {
            let q = lock(&self.syncs);
            (q.delay, q.pending.len() as u64)
        };
        let (space_used, space_limit) = {
            let s = lock(&self.space);
            (s.used, s.limit)
        };
        Stats {
            unsynced_bytes,
            unsynced_files,
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            pending_fsyncs,
            drops: self.drops.load(Ordering::Relaxed),
            enospc: self.enospc.load(Ordering::Relaxed),
            fsync_delay,
            space_used,
            space_limit,
        }
    }
}
