//! The FUSE operations: every request the kernel sends, answered from the shared state.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::{errno, lock, Handle, OpenDir, OpenFile, Shared, SyncTarget, BLOCK, ROOT, TTL};
use crate::sys;

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

/// Answers a request that returns nothing but success or an error.
fn reply_empty(reply: ReplyEmpty, res: Result<(), Errno>) {
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// The FUSE side: every request is answered from the shared state.
pub(crate) struct FaultFsImpl {
    pub(crate) shared: Arc<Shared>,
}

impl FaultFsImpl {
    /// The backing descriptor of `ino`, for the operations that work in `io::Result`.
    fn node_io(&self, ino: INodeNo) -> io::Result<Arc<OwnedFd>> {
        self.shared
            .node(ino)
            .map_err(|e| io::Error::from_raw_os_error(e.code()))
    }

    /// Runs `op` on the backing descriptor of `ino`.
    fn on_node<T>(
        &self,
        ino: INodeNo,
        op: impl FnOnce(RawFd) -> io::Result<T>,
    ) -> Result<T, Errno> {
        let fd = self.shared.node(ino)?;
        op(fd.as_raw_fd()).map_err(|e| errno(&e))
    }

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
            let dir = self.node_io(parent)?;
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
        match self.on_node(ino, sys::fstat) {
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
        match self.on_node(ino, sys::readlink_fd) {
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
            let dir = self.node_io(parent)?;
            let name = sys::cname(name)?;
            let st = sys::fstatat(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)?;
            sys::unlinkat(dir.as_raw_fd(), &name, 0)?;
            self.shared.forget_unlinked(&st);
            Ok(())
        })();
        reply_empty(reply, res.map_err(|e| errno(&e)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = (|| -> io::Result<()> {
            let dir = self.node_io(parent)?;
            sys::unlinkat(dir.as_raw_fd(), &sys::cname(name)?, libc::AT_REMOVEDIR)
        })();
        reply_empty(reply, res.map_err(|e| errno(&e)));
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
            let dir = self.node_io(parent)?;
            let newdir = self.node_io(newparent)?;
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
        reply_empty(reply, res.map_err(|e| errno(&e)));
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
            let dir = self.node_io(newparent)?;
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
        let file = match self.shared.open_file(fh) {
            Ok(of) => of.file.clone(),
            Err(_) => match self.on_node(ino, |fd| sys::reopen(fd, libc::O_RDONLY)) {
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
        match self.on_node(ino, |fd| {
            sys::reopen(fd, libc::O_RDONLY | libc::O_DIRECTORY)
        }) {
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
        let vfs = match self.on_node(INodeNo(ROOT), sys::fstatvfs) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
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
        reply_empty(
            reply,
            self.on_node(ino, |fd| sys::access_fd(fd, mask.bits())),
        );
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
        reply_empty(reply, self.shared.fallocate(fh, offset, length, mode));
    }
}
