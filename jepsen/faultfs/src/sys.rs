//! Thin wrappers over the `*at` system calls the pass-through needs.
//!
//! Every inode the kernel knows is held as an `O_PATH` descriptor; operations on it go through
//! these calls relative to that descriptor, or through its `/proc/self/fd/N` magic link when the
//! call has no `*at` form that accepts an `O_PATH` descriptor.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A file name as a C string; names with a NUL byte are invalid.
pub(crate) fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The magic link that reopens `fd`.
pub(crate) fn proc_path(fd: RawFd) -> CString {
    // A decimal number never contains a NUL byte.
    CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default()
}

pub(crate) fn openat(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; the returned descriptor is owned by nobody else.
    let fd = cvt(unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and is open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the inode behind `fd` (any descriptor, `O_PATH` ones included) anew with `flags`.
pub(crate) fn reopen(fd: RawFd, flags: i32) -> io::Result<File> {
    let fd = openat(libc::AT_FDCWD, &proc_path(fd), flags, 0)?;
    Ok(File::from(fd))
}

/// An `O_PATH` descriptor for the same inode as `fd`.
pub(crate) fn path_fd(fd: RawFd) -> io::Result<OwnedFd> {
    openat(libc::AT_FDCWD, &proc_path(fd), libc::O_PATH, 0)
}

pub(crate) fn fstatat(dir: RawFd, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a writable stat buffer and `name` a valid C string.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded and filled the buffer (it was zeroed before anyway).
    Ok(unsafe { st.assume_init() })
}

/// `stat` of the inode behind `fd` itself (a symlink is not followed).
pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    fstatat(fd, c"", libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

pub(crate) fn mkdirat(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    cvt(unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub(crate) fn mknodat(dir: RawFd, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    cvt(unsafe {
        libc::mknodat(
            dir,
            name.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })
    .map(drop)
}

pub(crate) fn unlinkat(dir: RawFd, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

pub(crate) fn renameat2(
    old_dir: RawFd,
    old: &CStr,
    new_dir: RawFd,
    new: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are valid C strings.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir as libc::c_long,
            old.as_ptr(),
            new_dir as libc::c_long,
            new.as_ptr(),
            flags as libc::c_long,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A hard link `new_dir/new` to the inode behind `fd`.
pub(crate) fn link_fd(fd: RawFd, new_dir: RawFd, new: &CStr) -> io::Result<()> {
    let old = proc_path(fd);
    // SAFETY: both names are valid C strings.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            old.as_ptr(),
            new_dir,
            new.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

pub(crate) fn symlinkat(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are valid C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) }).map(drop)
}

/// The target of the symlink behind the `O_PATH` descriptor `fd`.
pub(crate) fn readlink_fd(fd: RawFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for its whole length.
    let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub(crate) fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: `path` is a valid C string.
    cvt(unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), mode as libc::mode_t, 0) }).map(drop)
}

pub(crate) fn chown_fd(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    // SAFETY: the empty name is a valid C string; AT_EMPTY_PATH makes the call act on `fd`.
    cvt(unsafe {
        libc::fchownat(
            fd,
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// Sets the access and modification times of the inode behind `fd`; `None` leaves one as it is.
pub(crate) fn utimens_fd(
    fd: RawFd,
    atime: Option<libc::timespec>,
    mtime: Option<libc::timespec>,
) -> io::Result<()> {
    let omit = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_OMIT,
    };
    let times = [atime.unwrap_or(omit), mtime.unwrap_or(omit)];
    let path = proc_path(fd);
    // SAFETY: `path` is a valid C string and `times` holds two timespecs.
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

pub(crate) fn access_fd(fd: RawFd, mask: i32) -> io::Result<()> {
    let path = proc_path(fd);
    // SAFETY: `path` is a valid C string.
    cvt(unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mask, 0) }).map(drop)
}

pub(crate) fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let offset = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain system call on an open descriptor.
    cvt(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) }).map(drop)
}

pub(crate) fn fstatvfs(fd: RawFd) -> io::Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `st` is a writable statvfs buffer.
    cvt(unsafe { libc::fstatvfs(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded and filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// Detaches the mount at `path` at once (`umount -l`); it goes away when no longer busy.
pub(crate) fn umount_detach(path: &CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid C string.
    cvt(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// Raises the soft limit of open descriptors to the hard limit: every inode the kernel holds
/// and every file with unsynced data keeps a descriptor open here.
pub(crate) fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit buffer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max
    {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above; failing leaves the limit as it was.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}
