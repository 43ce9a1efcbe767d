//! `fsync` and its delay: syncs wait in a queue until the delay in force has passed, and one
//! thread completes them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fuser::ReplyEmpty;

use super::{errno, lock, PendingSync, Shared, SyncTarget};

impl Shared {
    // ---- syncs and their delay -------------------------------------------------------------

    pub(super) fn submit_sync(&self, target: SyncTarget, reply: ReplyEmpty) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        let mut q = lock(&self.syncs);
        if q.delay.is_zero() || q.shutdown {
            drop(q);
            self.complete_sync(target, reply);
        } else {
            q.pending.push(PendingSync {
                start: Instant::now(),
                target,
                reply,
            });
            self.syncs_changed.notify_all();
        }
    }

    fn complete_sync(&self, target: SyncTarget, reply: ReplyEmpty) {
        let res = match target {
            SyncTarget::File {
                ino,
                file,
                datasync,
            } => self.sync_file(ino, &file, datasync),
            SyncTarget::Dir(dir) => dir.file.sync_all(),
        };
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn set_fsync_delay(&self, delay: Duration) {
        lock(&self.syncs).delay = delay;
        self.syncs_changed.notify_all();
    }

    /// Completes each stalled sync once it has waited for the delay in force (so setting the
    /// delay to zero releases them all); run by one thread until shutdown.
    pub(crate) fn run_sync_worker(&self) {
        let mut q = lock(&self.syncs);
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            let mut next: Option<Instant> = None;
            let delay = q.delay;
            let shutdown = q.shutdown;
            let mut i = 0;
            while i < q.pending.len() {
                match q.pending[i].start.checked_add(delay) {
                    _ if shutdown => due.push(q.pending.swap_remove(i)),
                    Some(t) if t <= now => due.push(q.pending.swap_remove(i)),
                    Some(t) => {
                        next = Some(next.map_or(t, |n| n.min(t)));
                        i += 1;
                    }
                    None => i += 1,
                }
            }
            if !due.is_empty() {
                drop(q);
                due.sort_by_key(|p| p.start);
                for p in due {
                    self.complete_sync(p.target, p.reply);
                }
                q = lock(&self.syncs);
                continue;
            }
            if shutdown {
                return;
            }
            q = match next {
                Some(t) => {
                    self.syncs_changed
                        .wait_timeout(q, t.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self
                    .syncs_changed
                    .wait(q)
                    .unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Lets the sync worker finish the stalled syncs (as completed) and return.
    pub(crate) fn stop_sync_worker(&self) {
        lock(&self.syncs).shutdown = true;
        self.syncs_changed.notify_all();
    }
}
