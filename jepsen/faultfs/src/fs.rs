//! The pass-through file system and its fault state.
//!
//! This module holds what the FUSE side and the control share ([`Shared`]): the inodes the
//! kernel knows, the open handles, each file's undo record, the space count and the queue of
//! stalled syncs. The rest, by concern:
//! - `unsynced`: the model of unsynced data: the space limit, and every change of a file's
//!   content or size since its last sync saved for undoing.
//! - `syncs`: `fsync` and its delay: the queue of stalled syncs and the thread that completes
//!   them.
//! - `commands`: what the control does to the whole file system: sync everything, drop
//!   everything unsynced (the power loss), statistics.
//! - `ops`: the FUSE operations ([`FaultFsImpl`]).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, Notifier, ReplyEmpty, Request};

use crate::sys;
use crate::undo::Undo;

mod commands;
mod ops;
mod syncs;
mod unsynced;

pub(crate) use ops::FaultFsImpl;

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
