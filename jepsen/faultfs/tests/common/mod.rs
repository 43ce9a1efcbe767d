//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use raftq_faultfs::{Control, FaultFs, Options};
use tempfile::TempDir;

/// True when FUSE mounts can be made. Without root or /dev/fuse the test fails, unless
/// RAFTQ_SKIP_FUSE=1 asks to skip it.
pub fn fuse_ready(test: &str) -> bool {
    match raftq_faultfs::check_environment() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("RAFTQ_SKIP_FUSE").as_deref() == Ok("1") {
                eprintln!("{test}: skipped (RAFTQ_SKIP_FUSE=1): {e}");
                false
            } else {
                panic!(
                    "{test} needs root and /dev/fuse to mount a FUSE file system: {e}; \
                     set RAFTQ_SKIP_FUSE=1 to skip the FUSE tests"
                );
            }
        }
    }
}

/// A mount in a temporary directory; unmounted (before the directory goes) when dropped.
pub struct Mounted {
    // Fields drop in order: the mount first, then its directories.
    pub fs: FaultFs,
    pub ctl: Control,
    pub backing: PathBuf,
    pub mnt: PathBuf,
    pub dir: TempDir,
}

impl Mounted {
    pub fn new() -> Mounted {
        Mounted::with(Options::default())
    }

    pub fn with(options: Options) -> Mounted {
        let dir = tempfile::tempdir().expect("temporary directory");
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&backing).expect("backing directory");
        std::fs::create_dir(&mnt).expect("mount point");
        let fs = FaultFs::mount_with(&backing, &mnt, options).expect("mount");
        let ctl = fs.control();
        Mounted {
            fs,
            ctl,
            backing,
            mnt,
            dir,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    pub fn backing_path(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let path = path.to_string_lossy().to_string();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(path.as_str()))
}

pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
