//! The pass-through file system and its fault state.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::sys;
use crate::undo::Undo;
use crate::{DropReport, Stats};

/// The kernel caches neither entries nor attributes: after a drop every size must be fresh.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;
const BLOCK: u64 = 4096;

/// Locks a mutex, also one a panicking thread left poisoned (the data stays consistent: no
/// code here panics while holding a lock on purpose).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// An inode the kernel knows, held open so that it stays reachable through renames.
struct Node {
    fd: Arc<OwnedFd>,
    nlookup: u64,
}

struct OpenFile {
    ino: u64,
    file: Arc<File>,
    /// Opened with O_SYNC or O_DSYNC: every write is synced before it is answered.
    sync_writes: bool,
}

struct OpenDir {
    file: File,
    entries: Mutex<Vec<(u64, FileType, Vec<u8>)>>,
}

enum Handle {
    File(Arc<OpenFile>),
    Dir(Arc<OpenDir>),
}

/// Per-file state; the lock serialises every change of the file's content or size.
#[derive(Default)]
struct FileEntry {
    undo: Mutex<Option<Undo>>,
}

struct Space {
    used: u64,
    limit: Option<u64>,
}

enum SyncTarget {
    File {
        ino: u64,
        file: Arc<File>,
        datasync: bool,
    },
    Dir(Arc<OpenDir>),
}

struct PendingSync {
    start: Instant,
    target: SyncTarget,
    reply: ReplyEmpty,
}

struct SyncQueue {
    delay: Duration,
    pending: Vec<PendingSync>,
    shutdown: bool,
}

/// Everything the file system and its control share.
pub(crate) struct Shared {
    root_dev: u64,
    root_ino: u64,
    shadow_dir: PathBuf,
    backing: PathBuf,
    nodes: Mutex<HashMap<u64, Node>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    files: Mutex<HashMap<u64, Arc<FileEntry>>>,
    space: Mutex<Space>,
    syncs: Mutex<SyncQueue>,
    syncs_changed: Condvar,
    fsyncs: AtomicU64,
    drops: AtomicU64,
    enospc: AtomicU64,
    notifier: Mutex<Option<Notifier>>,
}

impl Shared {
    pub(crate) fn new(
        backing: &Path,
        shadow_dir: PathBuf,
        fsync_delay: Duration,
        space_limit: Option<u64>,
    ) -> io::Result<Shared> {
        let root = sys::openat(
            libc::AT_FDCWD,
            &sys::cname(backing.as_os_str())?,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        let st = sys::fstat(root.as_raw_fd())?;
        let used = apparent_size(backing);
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                fd: Arc::new(root),
                nlookup: 1,
            },
        );
        Ok(Shared {
            root_dev: st.st_dev,
            root_ino: st.st_ino,
            shadow_dir,
            backing: backing.to_path_buf(),
            nodes: Mutex::new(nodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            files: Mutex::new(HashMap::new()),
            space: Mutex::new(Space {
                used,
                limit: space_limit,
            }),
            syncs: Mutex::new(SyncQueue {
                delay: fsync_delay,
                pending: Vec::new(),
                shutdown: false,
            }),
            syncs_changed: Condvar::new(),
            fsyncs: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            enospc: AtomicU64::new(0),
            notifier: Mutex::new(None),
        })
    }

    pub(crate) fn set_notifier(&self, notifier: Notifier) {
        *lock(&self.notifier) = Some(notifier);
    }

    // ---- inodes ------------------------------------------------------------------------------

    /// The inode number the kernel sees: the backing inode number, except that the backing root
    /// is 1 and a backing inode numbered 1 takes the root's number (a bijection).
    fn fuse_ino(&self, st: &libc::stat) -> u64 {
        if st.st_dev == self.root_dev && st.st_ino == self.root_ino {
            ROOT
        } else if st.st_ino == ROOT {
            self.root_ino
        } else {
            st.st_ino
        }
    }

    fn attr(&self, st: &libc::stat) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.fuse_ino(st)),
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            ctime: time(st.st_ctime, st.st_ctime_nsec),
            crtime: UNIX_EPOCH,
            kind: kind(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: BLOCK as u32,
            flags: 0,
        }
    }

    fn node(&self, ino: INodeNo) -> Result<Arc<OwnedFd>, Errno> {
        lock(&self.nodes)
            .get(&ino.0)
            .map(|n| n.fd.clone())
            .ok_or(Errno::ESTALE)
    }

    /// Counts one more kernel reference to the inode behind the `O_PATH` descriptor `fd`.
    fn remember(&self, fd: OwnedFd) -> Result<FileAttr, Errno> {
        let st = sys::fstat(fd.as_raw_fd()).map_err(|e| errno(&e))?;
        let attr = self.attr(&st);
        lock(&self.nodes)
            .entry(attr.ino.0)
            .and_modify(|n| n.nlookup += 1)
            .or_insert(Node {
                fd: Arc::new(fd),
                nlookup: 1,
            });
        Ok(attr)
    }

    fn lookup_name(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        if parent.0 == ROOT && name.as_bytes() == b".." {
            let fd = self.node(parent)?;
            let dup = sys::path_fd(fd.as_raw_fd()).map_err(|e| errno(&e))?;
            return self.remember(dup);
        }
        let dir = self.node(parent)?;
        let name = sys::cname(name).map_err(|e| errno(&e))?;
        let fd = sys::openat(dir.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map_err(|e| errno(&e))?;
        self.remember(fd)
    }

    fn forget_node(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let mut nodes = lock(&self.nodes);
        if let Some(node) = nodes.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 {
                nodes.remove(&ino);
            }
        }
    }

    /// Gives a freshly created inode the requester's ownership (only possible as root).
    fn own(&self, fd: RawFd, req: &Request) {
        if sys::is_root() && (req.uid() != 0 || req.gid() != 0) {
            // Best effort, as with any pass-through file system.
            let _ = sys::chown_fd(fd, Some(req.uid()), Some(req.gid()));
        }
    }

    // ---- handles -----------------------------------------------------------------------------

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, h);
        fh
    }

    fn open_file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            Some(Handle::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::EBADF),
        }
    }

    fn open_dir(&self, fh: FileHandle) -> Result<Arc<OpenDir>, Errno> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::Dir(d)) => Ok(d.clone()),
            Some(Handle::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::EBADF),
        }
    }

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

    fn recount_space(&self) {
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

    fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
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
    fn set_size(&self, ino: u64, fd: RawFd, new_size: u64) -> Result<(), Errno> {
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

    fn fallocate(&self, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
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
    fn sync_file(&self, ino: u64, file: &File, datasync: bool) -> io::Result<()> {
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
    fn forget_unlinked(&self, st: &libc::stat) {
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 {
            self.release_space(st.st_size as u64);
            lock(&self.files).remove(&self.fuse_ino(st));
        }
    }

    // ---- syncs and their delay -------------------------------------------------------------

    fn submit_sync(&self, target: SyncTarget, reply: ReplyEmpty) {
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

/// Total size of the regular files under `dir`, each inode counted once.
fn apparent_size(dir: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() && (md.nlink() <= 1 || seen.insert((md.dev(), md.ino()))) {
                total = total.saturating_add(md.len());
            }
        }
    }
    total
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = nsecs.clamp(0, 999_999_999) as u32;
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(secs as u64, nsecs))
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))
            .and_then(|t| t.checked_add(Duration::new(0, nsecs)))
    };
    t.unwrap_or(UNIX_EPOCH)
}

fn timespec(t: TimeOrNow) -> libc::timespec {
    match t {
        TimeOrNow::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nsecs) = (-(d.as_secs() as i64), -(d.subsec_nanos() as i64));
                if nsecs < 0 {
                    secs -= 1;
                    nsecs += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: secs as libc::time_t,
                    tv_nsec: nsecs as libc::c_long,
                }
            }
        },
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn std_kind(t: std::fs::FileType) -> FileType {
    FileType::from_std(t).unwrap_or(FileType::RegularFile)
}

/// The flags for opening the backing file: the access mode only. Appending, truncating and
/// synchronous writes are done by the file system itself; O_DIRECT would impose alignment.
fn backing_flags(flags: i32) -> i32 {
    (flags & libc::O_ACCMODE) | libc::O_LARGEFILE
}

fn wants_sync_writes(flags: i32) -> bool {
    flags & (libc::O_SYNC | libc::O_DSYNC) != 0
}

/// The FUSE side: every request is answered from the shared state.
pub(crate) struct FaultFsImpl {
    pub(crate) shared: Arc<Shared>,
}

impl FaultFsImpl {
    fn new_entry(&self, fd: OwnedFd, req: &Request, reply: ReplyEntry) {
        self.shared.own(fd.as_raw_fd(), req);
        match self.shared.remember(fd) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// Creates something in `parent` with `make`, then answers with its entry.
    fn make_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: Option<u32>,
        reply: ReplyEntry,
        make: impl FnOnce(RawFd, &std::ffi::CStr) -> io::Result<()>,
    ) {
        let res = (|| -> io::Result<OwnedFd> {
            let dir = self
                .shared
                .node(parent)
                .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
            let cname = sys::cname(name)?;
            make(dir.as_raw_fd(), &cname)?;
            let fd = sys::openat(dir.as_raw_fd(), &cname, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            if let Some(mode) = mode {
                // The process umask may have taken bits the caller asked for.
                sys::chmod_fd(fd.as_raw_fd(), mode & 0o7777)?;
            }
            Ok(fd)
        })();
        match res {
            Ok(fd) => self.new_entry(fd, req, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for FaultFsImpl {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.shared.lookup_name(parent, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.forget_node(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let res = self
            .shared
            .node(ino)
            .and_then(|fd| sys::fstat(fd.as_raw_fd()).map_err(|e| errno(&e)));
        match res {
            Ok(st) => reply.attr(&TTL, &self.shared.attr(&st)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let res = (|| -> Result<libc::stat, Errno> {
            let fd = self.shared.node(ino)?;
            let raw = fd.as_raw_fd();
            let st = sys::fstat(raw).map_err(|e| errno(&e))?;
            let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
            if let Some(mode) = mode {
                if !is_link {
                    sys::chmod_fd(raw, mode & 0o7777).map_err(|e| errno(&e))?;
                }
            }
            if uid.is_some() || gid.is_some() {
                sys::chown_fd(raw, uid, gid).map_err(|e| errno(&e))?;
            }
            if let Some(size) = size {
                self.shared.set_size(ino.0, raw, size)?;
            }
            if (atime.is_some() || mtime.is_some()) && !is_link {
                sys::utimens_fd(raw, atime.map(timespec), mtime.map(timespec))
                    .map_err(|e| errno(&e))?;
            }
            sys::fstat(raw).map_err(|e| errno(&e))
        })();
        match res {
            Ok(st) => reply.attr(&TTL, &self.shared.attr(&st)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let res = self
            .shared
            .node(ino)
            .and_then(|fd| sys::readlink_fd(fd.as_raw_fd()).map_err(|e| errno(&e)));
        match res {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !umask;
        self.make_node(req, parent, name, Some(mode), reply, |dir, name| {
            sys::mknodat(dir, name, mode, u64::from(rdev))
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !umask;
        self.make_node(req, parent, name, Some(mode), reply, |dir, name| {
            sys::mkdirat(dir, name, mode)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = (|| -> io::Result<()> {
            let dir = self
                .shared
                .node(parent)
                .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
            let name = sys::cname(name)?;
            let st = sys::fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)?;
            sys::unlinkat(dir.as_raw_fd(), &name, 0)?;
            self.shared.forget_unlinked(&st);
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = (|| -> io::Result<()> {
            let dir = self
                .shared
                .node(parent)
                .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
            sys::unlinkat(dir.as_raw_fd(), &sys::cname(name)?, libc::AT_REMOVEDIR)
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = match sys::cname(target.as_os_str()) {
            Ok(t) => t,
            Err(e) => return reply.error(errno(&e)),
        };
        self.make_node(req, parent, link_name, None, reply, |dir, name| {
            sys::symlinkat(&target, dir, name)
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let res = (|| -> io::Result<()> {
            let to_io = |e: Errno| io::Error::from_raw_os_error(e.code());
            let dir = self.shared.node(parent).map_err(to_io)?;
            let newdir = self.shared.node(newparent).map_err(to_io)?;
            let name = sys::cname(name)?;
            let newname = sys::cname(newname)?;
            let exchange = flags.bits() & libc::RENAME_EXCHANGE != 0;
            // A replaced target loses its name: remember what it was.
            let replaced = if exchange {
                None
            } else {
                let src = sys::fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)?;
                sys::fstatat(newdir.as_raw_fd(), &newname, libc::AT_SYMLINK_NOFOLLOW)
                    .ok()
                    .filter(|t| (t.st_dev, t.st_ino) != (src.st_dev, src.st_ino))
            };
            sys::renameat2(
                dir.as_raw_fd(),
                &name,
                newdir.as_raw_fd(),
                &newname,
                flags.bits(),
            )?;
            if let Some(t) = replaced {
                self.shared.forget_unlinked(&t);
            }
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let fd = match self.shared.node(ino) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let res = (|| -> io::Result<OwnedFd> {
            let dir = self
                .shared
                .node(newparent)
                .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
            let newname = sys::cname(newname)?;
            sys::link_fd(fd.as_raw_fd(), dir.as_raw_fd(), &newname)?;
            sys::path_fd(fd.as_raw_fd())
        })();
        match res
            .map_err(|e| errno(&e))
            .and_then(|fd| self.shared.remember(fd))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let res = (|| -> Result<u64, Errno> {
            let fd = self.shared.node(ino)?;
            let file =
                sys::reopen(fd.as_raw_fd(), backing_flags(flags.0)).map_err(|e| errno(&e))?;
            if flags.0 & libc::O_TRUNC != 0 {
                self.shared.set_size(ino.0, fd.as_raw_fd(), 0)?;
            }
            Ok(self.shared.add_handle(Handle::File(Arc::new(OpenFile {
                ino: ino.0,
                file: Arc::new(file),
                sync_writes: wants_sync_writes(flags.0),
            }))))
        })();
        match res {
            // Direct I/O: the kernel keeps no page cache that could outlive a drop.
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let of = match self.shared.open_file(fh) {
            Ok(of) => of,
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match of.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.shared.write(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.handles).remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let file =
            match self.shared.open_file(fh) {
                Ok(of) => of.file.clone(),
                Err(_) => match self.shared.node(ino).and_then(|fd| {
                    sys::reopen(fd.as_raw_fd(), libc::O_RDONLY).map_err(|e| errno(&e))
                }) {
                    Ok(f) => Arc::new(f),
                    Err(e) => return reply.error(e),
                },
            };
        self.shared.submit_sync(
            SyncTarget::File {
                ino: ino.0,
                file,
                datasync,
            },
            reply,
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let res = self.shared.node(ino).and_then(|fd| {
            sys::reopen(fd.as_raw_fd(), libc::O_RDONLY | libc::O_DIRECTORY).map_err(|e| errno(&e))
        });
        match res {
            Ok(file) => {
                let fh = self.shared.add_handle(Handle::Dir(Arc::new(OpenDir {
                    file,
                    entries: Mutex::new(Vec::new()),
                })));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dir = match self.shared.open_dir(fh) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let mut entries = lock(&dir.entries);
        if offset == 0 {
            // A listing starts (or restarts): take a fresh snapshot of the directory.
            let path = PathBuf::from(format!("/proc/self/fd/{}", dir.file.as_raw_fd()));
            let rd = match std::fs::read_dir(&path) {
                Ok(rd) => rd,
                Err(e) => return reply.error(errno(&e)),
            };
            entries.clear();
            entries.push((ino.0, FileType::Directory, b".".to_vec()));
            entries.push((ino.0, FileType::Directory, b"..".to_vec()));
            for e in rd.flatten() {
                let st_ino = e.ino();
                let kind = e.file_type().map(std_kind).unwrap_or(FileType::RegularFile);
                let mapped = if st_ino == ROOT {
                    self.shared.root_ino
                } else {
                    st_ino
                };
                entries.push((mapped, kind, e.file_name().as_bytes().to_vec()));
            }
        }
        for (i, (e_ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(*e_ino),
                (i + 1) as u64,
                *kind,
                OsStr::from_bytes(name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.shared.handles).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.shared.open_dir(fh) {
            Ok(dir) => self.shared.submit_sync(SyncTarget::Dir(dir), reply),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let root = match self.shared.node(INodeNo(ROOT)) {
            Ok(fd) => fd,
            Err(e) => return reply.error(e),
        };
        let vfs = match sys::fstatvfs(root.as_raw_fd()) {
            Ok(v) => v,
            Err(e) => return reply.error(errno(&e)),
        };
        let (used, limit) = {
            let s = lock(&self.shared.space);
            (s.used, s.limit)
        };
        let namelen = vfs.f_namemax as u32;
        match limit {
            Some(limit) => {
                let blocks = limit / BLOCK;
                let free = limit.saturating_sub(used) / BLOCK;
                reply.statfs(
                    blocks,
                    free,
                    free,
                    vfs.f_files,
                    vfs.f_ffree,
                    BLOCK as u32,
                    namelen,
                    BLOCK as u32,
                );
            }
            None => reply.statfs(
                vfs.f_blocks,
                vfs.f_bfree,
                vfs.f_bavail,
                vfs.f_files,
                vfs.f_ffree,
                vfs.f_bsize as u32,
                namelen,
                vfs.f_frsize as u32,
            ),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let res = self
            .shared
            .node(ino)
            .and_then(|fd| sys::access_fd(fd.as_raw_fd(), mask.bits()).map_err(|e| errno(&e)));
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mode = mode & !umask & 0o7777;
        let res = (|| -> Result<(FileAttr, u64), Errno> {
            let dir = self.shared.node(parent)?;
            let cname = sys::cname(name).map_err(|e| errno(&e))?;
            // Exclusive first, to know whether the file is new (and so gets mode and owner).
            let base = backing_flags(flags);
            let (fd, created) = match sys::openat(
                dir.as_raw_fd(),
                &cname,
                base | libc::O_CREAT | libc::O_EXCL,
                mode,
            ) {
                Ok(fd) => (fd, true),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => (
                    sys::openat(dir.as_raw_fd(), &cname, base, 0).map_err(|e| errno(&e))?,
                    false,
                ),
                Err(e) => return Err(errno(&e)),
            };
            let file = File::from(fd);
            let path = sys::path_fd(file.as_raw_fd()).map_err(|e| errno(&e))?;
            let st = sys::fstat(file.as_raw_fd()).map_err(|e| errno(&e))?;
            if created {
                // The process umask may have taken bits the caller asked for.
                let _ = sys::chmod_fd(path.as_raw_fd(), mode);
                self.shared.own(path.as_raw_fd(), req);
            }
            let attr = self.shared.remember(path)?;
            if flags & libc::O_TRUNC != 0 && st.st_size > 0 {
                let node = self.shared.node(attr.ino)?;
                self.shared.set_size(attr.ino.0, node.as_raw_fd(), 0)?;
            }
            let st = sys::fstat(file.as_raw_fd()).map_err(|e| errno(&e))?;
            let fh = self.shared.add_handle(Handle::File(Arc::new(OpenFile {
                ino: attr.ino.0,
                file: Arc::new(file),
                sync_writes: wants_sync_writes(flags),
            })));
            Ok((self.shared.attr(&st), fh))
        })();
        match res {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.shared.fallocate(fh, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
