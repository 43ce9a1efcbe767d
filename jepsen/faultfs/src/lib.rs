//! `raftq-faultfs`: a FUSE pass-through file system that simulates a disk's faults, for raftq's
//! chaos suite and tests: power loss (unsynced writes are lost), slow `fsync`, and a full disk.
//!
//! # The model
//!
//! The mount shows a backing directory: every file and directory of the mount is a file or
//! directory of the backing directory, and after unmounting the backing directory holds exactly
//! what a disk would hold.
//!
//! - **Data is volatile until synced**, as in the page cache. Every write, truncate or
//!   `fallocate` of a file since its last `fsync`/`fdatasync` (or [`Control::sync_all`]) is
//!   *unsynced*. Writes go to the backing file at once (reads are plain pass-through), but the
//!   first pre-image of every byte range overwritten since the last sync is saved, with the
//!   file's size at that sync. [`Control::drop_unsynced`] (the power loss) restores every file to
//!   its synced content: pre-images back, size back to the synced size. A file created since is
//!   kept, with its synced content only (empty if never synced). A file opened with `O_SYNC` or
//!   `O_DSYNC` is synced after every write (without the fsync delay).
//! - **Metadata is durable at once**, as in LazyFS: create, mkdir, rename, unlink, link,
//!   symlink, chmod, chown and utimes survive a drop whether or not the directory was synced.
//!   Unsynced state belongs to the inode, not to a name: a renamed file keeps it, an unlinked
//!   file (without other names) needs no restoring.
//! - **Slow fsync**: each `fsync`, `fdatasync` and directory `fsync` is answered only after the
//!   configured delay ([`Control::set_fsync_delay`], [`FOREVER`] for never), from another
//!   thread, so every other operation goes on meanwhile. A stalled sync takes effect when it
//!   completes (so what was written to the file during the wait is made durable too); if the
//!   power is lost first ([`Control::drop_unsynced`]) it never takes effect and is answered
//!   with `EIO`. A change of the delay applies to the syncs already waiting: each completes once
//!   it has waited for the delay in force, so setting it to zero releases them all.
//! - **Full disk**: with a space limit ([`Control::set_space_limit`]) on the total apparent size
//!   of the regular files under the mount, a write, truncate or `fallocate` that would go past
//!   it fails with `ENOSPC` and changes nothing (also a preallocation with
//!   `FALLOC_FL_KEEP_SIZE`, which needs the space without changing the size). Overwrites in
//!   place always succeed. `statfs` reports the limit as the file system's size.
//!
//! # Use
//!
//! In-process (tests): [`FaultFs::mount`] serves the mount from background threads until
//! [`FaultFs::unmount`] or drop; [`FaultFs::control`] hands out the [`Control`].
//!
//! As a process: `raftq-faultfs mount --backing DIR --mountpoint DIR --control SOCKET` prints
//! `mounted` once the mount is ready, serves the control socket (one line command, one line
//! reply, see [`execute`]) and unmounts on SIGTERM or SIGINT. `raftq-faultfs ctl --control
//! SOCKET drop|sync|status|fsync-delay MS|fsync-delay forever|space BYTES|space unlimited` sends
//! one command and exits 0 on `ok`, 1 otherwise. A mount left behind by a killed instance
//! (its mount point answers "Transport endpoint is not connected") goes with
//! `raftq-faultfs unmount --mountpoint DIR` (or `fusermount3 -u -z DIR`); a new `mount` at the
//! same place also takes it away by itself.
//!
//! # What a real disk can lose that this does not model
//!
//! - Metadata: a real file system may lose a create, rename or unlink that was not followed by
//!   an `fsync` of the directory; here they are durable at once.
//! - Torn and reordered writes: a drop restores every unsynced byte of a file. A real disk may
//!   keep any subset of the unsynced pages (some of a file's later writes but not its earlier
//!   ones), or tear a sector.
//! - Corruption and I/O errors on reads, and `fsync` failures (other than during a drop).
//! - `sync(2)` and `syncfs(2)` on the mount do not reach this file system (the kernel does not
//!   forward them); use [`Control::sync_all`] (the control command `sync`).
//! - Writes through shared writable `mmap` are not supported: files are opened in direct-I/O
//!   mode, so that the kernel's page cache can never serve content older than a drop.
//!
//! # Limits
//!
//! The backing directory must be one file system (inode numbers are passed through). The file
//! system runs as root (it mounts with `mount(2)` and reopens inodes through `/proc/self/fd`).
//! A process that serves a mount in-process must unmount it (drop the [`FaultFs`]) before it
//! exits while its own threads wait in a stalled `fsync` on it: those threads wait for an answer
//! from the very process that is exiting, which the kernel does not break up.
//! Pre-images live in unnamed sparse temporary files (in the temporary directory, or
//! [`Options::undo_dir`]); only the list of saved ranges is held in memory.

#![warn(missing_docs)]

mod control;
mod fs;
mod sys;
mod undo;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use control::{execute, send_command, ControlServer};

use crate::fs::{FaultFsImpl, Shared};

/// A delay that never ends: stalled syncs wait until the delay changes or the power is lost.
pub const FOREVER: Duration = Duration::MAX;

/// Errors of mounting, unmounting and control.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The environment or the arguments do not allow it.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// The result of this crate's operations.
pub type Result<T> = std::result::Result<T, Error>;

/// How to mount.
#[derive(Debug, Clone)]
pub struct Options {
    /// The fsync delay to start with (zero: none).
    pub fsync_delay: Duration,
    /// The space limit to start with, in bytes (`None`: unlimited).
    pub space_limit: Option<u64>,
    /// Where the pre-images of overwritten synced bytes are kept (unnamed temporary files);
    /// `None`: the system's temporary directory. Must not be inside the mount.
    pub undo_dir: Option<PathBuf>,
    /// Threads that serve requests.
    pub threads: usize,
    /// Let users other than the mounting one use the mount (with the kernel checking
    /// permissions).
    pub allow_other: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            fsync_delay: Duration::ZERO,
            space_limit: None,
            undo_dir: None,
            threads: 4,
            allow_other: false,
        }
    }
}

/// Counters and settings of a mount.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes a drop would revert now: pre-images saved plus growth past the synced sizes.
    pub unsynced_bytes: u64,
    /// Files with unsynced changes.
    pub unsynced_files: u64,
    /// `fsync`, `fdatasync` and directory `fsync` requests received.
    pub fsyncs: u64,
    /// Syncs waiting for the fsync delay now.
    pub pending_fsyncs: u64,
    /// Drops done.
    pub drops: u64,
    /// `ENOSPC` errors returned because of the space limit.
    pub enospc: u64,
    /// The fsync delay in force ([`FOREVER`] for never).
    pub fsync_delay: Duration,
    /// Apparent size of the regular files, as counted against the limit.
    pub space_used: u64,
    /// The space limit, if any.
    pub space_limit: Option<u64>,
}

/// What a drop did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Files restored to their synced content.
    pub files: u64,
    /// Unsynced bytes those files had.
    pub bytes: u64,
    /// Stalled syncs answered with `EIO` instead of completing.
    pub failed_fsyncs: u64,
}

/// The fault controls of a mount; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

impl Control {
    /// The power loss: every file goes back to its synced content, stalled syncs fail.
    ///
    /// Meant for when no process has files open on the mount (the one using it was killed);
    /// files still open keep working and their later writes are unsynced as usual.
    pub fn drop_unsynced(&self) -> Result<DropReport> {
        self.shared
            .drop_unsynced()
            .map_err(Error::io("restoring the synced content"))
    }

    /// Makes everything written so far durable (like `sync(2)`); returns the files synced.
    pub fn sync_all(&self) -> Result<u64> {
        self.shared.sync_all().map_err(Error::io("syncing"))
    }

    /// Sets the delay of every `fsync`: `None` or zero for none, [`FOREVER`] for never.
    pub fn set_fsync_delay(&self, delay: Option<Duration>) {
        self.shared.set_fsync_delay(delay.unwrap_or(Duration::ZERO));
    }

    /// Sets the space limit in bytes (`None`: unlimited). The space used is counted anew.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.shared.set_space_limit(limit);
    }

    /// Counters and settings.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }
}

/// A mounted fault file system; unmounts when dropped.
pub struct FaultFs {
    shared: Arc<Shared>,
    mountpoint: PathBuf,
    backing: PathBuf,
    unmounter: Option<fuser::SessionUnmounter>,
    session: Option<JoinHandle<io::Result<()>>>,
    sync_worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FaultFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultFs")
            .field("backing", &self.backing)
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

/// Checks that FUSE mounts can be made here: root and `/dev/fuse`.
pub fn check_environment() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::Invalid(
            "/dev/fuse does not exist: FUSE is not available here (in a container, pass \
             --device /dev/fuse)"
                .into(),
        ));
    }
    if !sys::is_root() {
        return Err(Error::Invalid(
            "raftq-faultfs must run as root (it mounts with mount(2))".into(),
        ));
    }
    if !Path::new("/proc/self/fd").is_dir() {
        return Err(Error::Invalid("/proc is not mounted".into()));
    }
    Ok(())
}

/// Detaches whatever is mounted at `mountpoint` (a mount left by a crashed process too).
pub fn force_unmount(mountpoint: &Path) -> Result<()> {
    let path = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid("the mount point contains a NUL byte".into()))?;
    sys::umount_detach(&path).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EINVAL) => " (nothing is mounted there)",
            Some(libc::EPERM) => " (needs root; or use `fusermount3 -u -z`)",
            _ => "",
        };
        Error::Io {
            what: format!("unmounting {}{hint}", mountpoint.display()),
            source: e,
        }
    })
}

impl FaultFs {
    /// Mounts `backing` at `mountpoint` with the default options; served by background threads.
    pub fn mount(backing: impl AsRef<Path>, mountpoint: impl AsRef<Path>) -> Result<FaultFs> {
        FaultFs::mount_with(backing, mountpoint, Options::default())
    }

    /// Mounts `backing` at `mountpoint`. A dead mount left at `mountpoint` by a killed process
    /// is detached first. The process's soft limit of open files is raised to its hard limit
    /// (the file system holds a descriptor for every inode the kernel knows).
    pub fn mount_with(
        backing: impl AsRef<Path>,
        mountpoint: impl AsRef<Path>,
        options: Options,
    ) -> Result<FaultFs> {
        check_environment()?;
        sys::raise_nofile_limit();
        let mountpoint = mountpoint.as_ref();
        // A mount left by a crashed process answers ENOTCONN: take it away first.
        if let Err(e) = std::fs::metadata(mountpoint) {
            if e.raw_os_error() == Some(libc::ENOTCONN) {
                force_unmount(mountpoint)?;
            }
        }
        let backing = backing.as_ref().canonicalize().map_err(Error::io(format!(
            "backing directory {}",
            backing.as_ref().display()
        )))?;
        let mountpoint = mountpoint
            .canonicalize()
            .map_err(Error::io(format!("mount point {}", mountpoint.display())))?;
        if !backing.is_dir() {
            return Err(Error::Invalid(format!(
                "backing {} is not a directory",
                backing.display()
            )));
        }
        if !mountpoint.is_dir() {
            return Err(Error::Invalid(format!(
                "mount point {} is not a directory",
                mountpoint.display()
            )));
        }
        if mountpoint.starts_with(&backing) || backing.starts_with(&mountpoint) {
            return Err(Error::Invalid(format!(
                "the mount point {} and the backing directory {} must not contain each other",
                mountpoint.display(),
                backing.display()
            )));
        }
        let undo_dir = options.undo_dir.clone().unwrap_or_else(std::env::temp_dir);
        if undo_dir.starts_with(&mountpoint) {
            return Err(Error::Invalid(format!(
                "the undo directory {} must not be inside the mount",
                undo_dir.display()
            )));
        }
        let delay = options.fsync_delay;
        let shared = Arc::new(
            Shared::new(&backing, undo_dir, delay, options.space_limit)
                .map_err(Error::io(format!("opening {}", backing.display())))?,
        );
        let worker_shared = shared.clone();
        let sync_worker = std::thread::Builder::new()
            .name("faultfs-fsync".into())
            .spawn(move || worker_shared.run_sync_worker())
            .map_err(Error::io("starting the fsync thread"))?;

        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("raftq-faultfs".into()),
            fuser::MountOption::Subtype("raftq-faultfs".into()),
            fuser::MountOption::NoAtime,
        ];
        if options.allow_other {
            config.acl = fuser::SessionACL::All;
            config
                .mount_options
                .push(fuser::MountOption::DefaultPermissions);
        }
        config.n_threads = Some(options.threads.max(1));

        let fs = FaultFsImpl {
            shared: shared.clone(),
        };
        let mut session = match fuser::Session::new(fs, &mountpoint, &config) {
            Ok(s) => s,
            Err(e) => {
                shared.stop_sync_worker();
                let _ = sync_worker.join();
                return Err(Error::Io {
                    what: format!("mounting at {}", mountpoint.display()),
                    source: e,
                });
            }
        };
        shared.set_notifier(session.notifier());
        let unmounter = session.unmount_callable();
        let session = std::thread::Builder::new()
            .name("faultfs-session".into())
            .spawn(move || session.run());
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                // The session was dropped with the closure: it unmounted.
                shared.stop_sync_worker();
                let _ = sync_worker.join();
                return Err(Error::io("starting the session thread")(e));
            }
        };
        Ok(FaultFs {
            shared,
            mountpoint,
            backing,
            unmounter: Some(unmounter),
            session: Some(session),
            sync_worker: Some(sync_worker),
        })
    }

    /// The fault controls.
    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The backing directory.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// False once the mount is gone (unmounted from outside, or its connection aborted).
    pub fn is_serving(&self) -> bool {
        self.session.as_ref().is_some_and(|s| !s.is_finished())
    }

    /// Unmounts: stalled syncs complete, the mount goes away (detached if still in use), and
    /// the serving threads end once no file is open any more.
    pub fn unmount(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        // Processes blocked in a stalled fsync must get their answer to let go of the mount.
        self.shared.stop_sync_worker();
        if let Some(w) = self.sync_worker.take() {
            let _ = w.join();
        }
        let mut result = Ok(());
        let mut wait = Duration::from_secs(10);
        if let Some(mut unmounter) = self.unmounter.take() {
            if unmounter.unmount().is_err() {
                // Busy: detach it; it disappears from the namespace now and ends when unused,
                // which is unlikely to be soon.
                result = force_unmount(&self.mountpoint);
                wait = Duration::from_secs(1);
            }
        }
        if let Some(session) = self.session.take() {
            let deadline = Instant::now() + wait;
            while !session.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if session.is_finished() {
                match session.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        if result.is_ok() {
                            result = Err(Error::io("serving the mount")(e));
                        }
                    }
                    Err(_) => {
                        if result.is_ok() {
                            result = Err(Error::Invalid("the session thread panicked".into()));
                        }
                    }
                }
            }
            // Otherwise files are still open on the detached mount: the thread ends when
            // they are closed.
        }
        result
    }
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!(
                "raftq-faultfs: unmounting {}: {e}",
                self.mountpoint.display()
            );
        }
    }
}

// Controls and mounts are handed between threads (and held across `.await`s) by their users.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Control>();
    send_sync::<FaultFs>();
    send_sync::<ControlServer>();
};
