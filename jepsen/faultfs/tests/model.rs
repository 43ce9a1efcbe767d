//! The fault model through a real mount: what survives a drop, stalled fsyncs, a full disk.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use common::{fuse_ready, read, wait_until, Mounted};
use raftq_faultfs::FOREVER;

fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn unsynced_data_is_gone_after_drop_and_synced_data_is_kept() {
    if !fuse_ready("unsynced_data_is_gone_after_drop_and_synced_data_is_kept") {
        return;
    }
    let m = Mounted::new();
    let p = m.path("log");
    let mut f = open_rw(&p);
    f.write_all(b"synced part|").expect("write");
    f.sync_all().expect("fsync");
    f.write_all(b"unsynced part").expect("write");
    assert_eq!(read(&p), b"synced part|unsynced part");
    assert_eq!(m.ctl.stats().unsynced_bytes, 13);
    drop(f);

    let report = m.ctl.drop_unsynced().expect("drop");
    assert_eq!(report.files, 1);
    assert_eq!(read(&p), b"synced part|");
    assert_eq!(std::fs::metadata(&p).expect("stat").len(), 12);
    assert_eq!(read(&m.backing_path("log")), b"synced part|");
    let stats = m.ctl.stats();
    assert_eq!(stats.unsynced_bytes, 0);
    assert_eq!(stats.drops, 1);
    assert_eq!(stats.fsyncs, 1);
}

#[test]
fn files_existing_before_the_mount_count_as_synced() {
    if !fuse_ready("files_existing_before_the_mount_count_as_synced") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let backing = dir.path().join("b");
    let mnt = dir.path().join("m");
    std::fs::create_dir_all(backing.join("sub")).expect("mkdir");
    std::fs::create_dir(&mnt).expect("mkdir");
    std::fs::write(backing.join("sub/old"), b"from before").expect("write");
    let fs = raftq_faultfs::FaultFs::mount(&backing, &mnt).expect("mount");
    std::fs::write(mnt.join("sub/old"), b"overwritten and longer").expect("write");
    fs.control().drop_unsynced().expect("drop");
    assert_eq!(read(&mnt.join("sub/old")), b"from before");
    fs.unmount().expect("unmount");
    assert_eq!(read(&backing.join("sub/old")), b"from before");
}

#[test]
fn overwrite_of_synced_bytes_is_reverted() {
    if !fuse_ready("overwrite_of_synced_bytes_is_reverted") {
        return;
    }
    let m = Mounted::new();
    let p = m.path("data");
    let f = open_rw(&p);
    f.write_all_at(b"0123456789", 0).expect("write");
    f.sync_data().expect("fdatasync");
    f.write_all_at(b"abc", 2).expect("write");
    // Overwritten twice: the synced bytes come back, not the first overwrite.
    f.write_all_at(b"WXYZ", 3).expect("write");
    f.write_all_at(b"tail", 10).expect("write");
    assert_eq!(read(&p), b"01aWXYZ789tail");
    drop(f);
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&p), b"0123456789");
}

#[test]
fn truncate_after_sync_is_reverted() {
    if !fuse_ready("truncate_after_sync_is_reverted") {
        return;
    }
    let m = Mounted::new();
    let p = m.path("data");
    let f = open_rw(&p);
    f.write_all_at(b"0123456789", 0).expect("write");
    f.sync_all().expect("fsync");
    f.set_len(4).expect("truncate down");
    f.write_all_at(b"xy", 6).expect("write past the end");
    assert_eq!(read(&p), b"0123\0\0xy");
    drop(f);
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&p), b"0123456789");

    // A truncate up is undone too, and so is an O_TRUNC open.
    let f = open_rw(&p);
    f.set_len(1 << 20).expect("truncate up");
    drop(f);
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&p), b"0123456789");
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .expect("open O_TRUNC");
    f.write_all(b"new").expect("write");
    drop(f);
    assert_eq!(read(&p), b"new");
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&p), b"0123456789");
}

#[test]
fn file_created_and_never_synced_is_empty_after_drop() {
    if !fuse_ready("file_created_and_never_synced_is_empty_after_drop") {
        return;
    }
    let m = Mounted::new();
    std::fs::create_dir(m.path("dir")).expect("mkdir");
    let p = m.path("dir/new");
    std::fs::write(&p, pattern(100_000, 7)).expect("write");
    m.ctl.drop_unsynced().expect("drop");
    // Metadata is durable at once: the directory and the file are there, the data is not.
    assert!(m.path("dir").is_dir());
    assert_eq!(std::fs::metadata(&p).expect("stat").len(), 0);
    assert_eq!(read(&p), b"");
}

#[test]
fn rename_keeps_unsynced_state_with_the_file() {
    if !fuse_ready("rename_keeps_unsynced_state_with_the_file") {
        return;
    }
    let m = Mounted::new();
    let mut f = open_rw(&m.path("a"));
    f.write_all(b"A synced|").expect("write");
    f.sync_all().expect("fsync");
    f.write_all(b"A unsynced").expect("write");
    drop(f);
    let mut g = open_rw(&m.path("target"));
    g.write_all(b"replaced target").expect("write");
    g.sync_all().expect("fsync");
    drop(g);
    let mut h = open_rw(&m.path("c"));
    h.write_all(b"C unsynced, synced after the rename")
        .expect("write");
    drop(h);

    std::fs::create_dir(m.path("sub")).expect("mkdir");
    std::fs::rename(m.path("a"), m.path("sub/b")).expect("rename");
    std::fs::rename(m.path("sub/b"), m.path("target")).expect("rename over a file");
    std::fs::rename(m.path("c"), m.path("sub/c")).expect("rename");
    File::open(m.path("sub/c"))
        .expect("open")
        .sync_all()
        .expect("fsync under the new name");

    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("target")), b"A synced|");
    assert_eq!(
        read(&m.path("sub/c")),
        b"C unsynced, synced after the rename"
    );
    assert!(!m.path("a").exists());
    assert!(!m.path("c").exists());
}

#[test]
fn fsync_of_one_file_does_not_make_another_durable() {
    if !fuse_ready("fsync_of_one_file_does_not_make_another_durable") {
        return;
    }
    let m = Mounted::new();
    let mut one = open_rw(&m.path("one"));
    let mut two = open_rw(&m.path("two"));
    one.write_all(b"one").expect("write");
    two.write_all(b"two").expect("write");
    one.sync_all().expect("fsync");
    drop((one, two));
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("one")), b"one");
    assert_eq!(read(&m.path("two")), b"");
}

#[test]
fn fdatasync_counts_as_sync() {
    if !fuse_ready("fdatasync_counts_as_sync") {
        return;
    }
    let m = Mounted::new();
    let mut f = open_rw(&m.path("f"));
    f.write_all(b"data").expect("write");
    f.sync_data().expect("fdatasync");
    f.write_all(b" more").expect("write");
    drop(f);
    assert_eq!(m.ctl.stats().fsyncs, 1);
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("f")), b"data");
}

#[test]
fn sync_all_makes_everything_durable() {
    if !fuse_ready("sync_all_makes_everything_durable") {
        return;
    }
    let m = Mounted::new();
    std::fs::write(m.path("x"), b"x").expect("write");
    std::fs::write(m.path("y"), b"y").expect("write");
    assert_eq!(m.ctl.sync_all().expect("sync"), 2);
    std::fs::write(m.path("y"), b"yy").expect("write");
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("x")), b"x");
    assert_eq!(read(&m.path("y")), b"y");
}

#[test]
fn o_dsync_writes_are_durable() {
    if !fuse_ready("o_dsync_writes_are_durable") {
        return;
    }
    use std::os::unix::fs::OpenOptionsExt;
    let m = Mounted::new();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DSYNC)
        .open(m.path("f"))
        .expect("open");
    f.write_all(b"durable").expect("write");
    drop(f);
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("f")), b"durable");
}

#[test]
fn unlinked_unsynced_file_needs_no_restoring() {
    if !fuse_ready("unlinked_unsynced_file_needs_no_restoring") {
        return;
    }
    let m = Mounted::new();
    let mut f = open_rw(&m.path("gone"));
    f.write_all(b"synced").expect("write");
    f.sync_all().expect("fsync");
    f.write_all(b" and not").expect("write");
    std::fs::remove_file(m.path("gone")).expect("unlink");
    // Still open while the power goes: nothing to restore, nothing comes back.
    let report = m.ctl.drop_unsynced().expect("drop");
    assert_eq!(report.files, 0);
    assert!(!m.path("gone").exists());
    drop(f);
    assert_eq!(std::fs::read_dir(&m.backing).expect("ls").count(), 0);
}

#[test]
fn stalled_fsync_does_not_block_other_files_and_completes_after_the_delay() {
    if !fuse_ready("stalled_fsync_does_not_block_other_files_and_completes_after_the_delay") {
        return;
    }
    let m = Mounted::new();
    std::fs::write(m.path("other"), b"other synced").expect("write");
    m.ctl.sync_all().expect("sync");
    let delay = Duration::from_secs(3);
    m.ctl.set_fsync_delay(Some(delay));

    let mut f = open_rw(&m.path("slow"));
    f.write_all(b"written before the fsync").expect("write");
    let start = Instant::now();
    let syncer = std::thread::spawn(move || {
        let res = f.sync_all();
        (res, start.elapsed())
    });
    wait_until("the fsync to stall", Duration::from_secs(5), || {
        m.ctl.stats().pending_fsyncs == 1
    });

    // Reads and writes of another file go on while the fsync waits.
    let t = Instant::now();
    let mut o = open_rw(&m.path("other"));
    o.write_all_at(b"OTHER", 0).expect("write");
    let mut buf = Vec::new();
    o.read_to_end(&mut buf).expect("read");
    assert_eq!(buf, b"OTHER synced");
    std::fs::write(m.path("third"), b"3").expect("create and write");
    assert_eq!(read(&m.path("third")), b"3");
    // Done while the fsync still waits: the I/O did not wait for it.
    assert_eq!(
        m.ctl.stats().pending_fsyncs,
        1,
        "other files' I/O took {:?}, until the fsync ended",
        t.elapsed()
    );
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "other files' I/O took {:?} during a stalled fsync",
        t.elapsed()
    );

    let (res, took) = syncer.join().expect("fsync thread");
    res.expect("fsync");
    assert!(
        took >= delay,
        "fsync returned after {took:?}, before the delay"
    );
    assert!(took < delay + Duration::from_secs(3), "fsync took {took:?}");

    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("slow")), b"written before the fsync");
    assert_eq!(read(&m.path("other")), b"other synced");
}

#[test]
fn fsync_delay_forever_stalls_until_released() {
    if !fuse_ready("fsync_delay_forever_stalls_until_released") {
        return;
    }
    let m = Mounted::new();
    m.ctl.set_fsync_delay(Some(FOREVER));
    let mut f = open_rw(&m.path("f"));
    f.write_all(b"payload").expect("write");
    let syncer = std::thread::spawn(move || f.sync_all());
    wait_until("the fsync to stall", Duration::from_secs(5), || {
        m.ctl.stats().pending_fsyncs == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!syncer.is_finished(), "a forever fsync returned");
    std::fs::write(m.path("g"), b"g").expect("write another file");
    m.ctl.set_fsync_delay(None);
    wait_until("the fsync to return", Duration::from_secs(5), || {
        syncer.is_finished()
    });
    syncer.join().expect("thread").expect("fsync");
    m.ctl.drop_unsynced().expect("drop");
    assert_eq!(read(&m.path("f")), b"payload");
    assert_eq!(read(&m.path("g")), b"");
}

#[test]
fn drop_during_a_stalled_fsync_fails_it_and_loses_the_data() {
    if !fuse_ready("drop_during_a_stalled_fsync_fails_it_and_loses_the_data") {
        return;
    }
    let m = Mounted::new();
    m.ctl.set_fsync_delay(Some(FOREVER));
    let mut f = open_rw(&m.path("f"));
    f.write_all(b"never durable").expect("write");
    let syncer = std::thread::spawn(move || f.sync_all());
    wait_until("the fsync to stall", Duration::from_secs(5), || {
        m.ctl.stats().pending_fsyncs == 1
    });
    let report = m.ctl.drop_unsynced().expect("drop");
    assert_eq!(report.failed_fsyncs, 1);
    let err = syncer
        .join()
        .expect("thread")
        .expect_err("an fsync cut by the power loss succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(read(&m.path("f")), b"");
}

#[test]
fn enospc_at_the_limit_changes_nothing_and_unlimited_lets_writes_through() {
    if !fuse_ready("enospc_at_the_limit_changes_nothing_and_unlimited_lets_writes_through") {
        return;
    }
    let m = Mounted::new();
    std::fs::write(m.path("existing"), pattern(5000, 1)).expect("write");
    m.ctl.set_space_limit(Some(15_000));
    assert_eq!(m.ctl.stats().space_used, 5000);

    let mut f = open_rw(&m.path("f"));
    f.write_all(&pattern(8000, 2))
        .expect("write within the limit");
    let err = f
        .write_all(&pattern(4000, 3))
        .expect_err("write past the limit");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(
        read(&m.path("f")),
        pattern(8000, 2),
        "a refused write changed the file"
    );
    let err = f.set_len(20_000).expect_err("truncate past the limit");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(std::fs::metadata(m.path("f")).expect("stat").len(), 8000);
    // SAFETY: plain system call on an open descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOSPC)
    );
    // Overwriting in place needs no space.
    f.write_all_at(b"in place", 0).expect("overwrite");
    let stats = m.ctl.stats();
    assert_eq!(stats.enospc, 3);
    assert_eq!(stats.space_used, 13_000);

    // Freed space can be used again.
    std::fs::remove_file(m.path("existing")).expect("unlink");
    f.write_all_at(&pattern(4000, 3), 8000)
        .expect("write into freed space");

    m.ctl.set_space_limit(None);
    f.write_all_at(&pattern(100_000, 4), 12_000)
        .expect("write after 'space unlimited'");
    assert_eq!(std::fs::metadata(m.path("f")).expect("stat").len(), 112_000);
}

#[test]
fn statfs_shows_the_limit() {
    if !fuse_ready("statfs_shows_the_limit") {
        return;
    }
    let m = Mounted::new();
    std::fs::write(m.path("f"), pattern(4096 * 3, 0)).expect("write");
    let statvfs = |p: &std::path::Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and writable buffer.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st
    };
    m.ctl.set_space_limit(Some(10 << 20));
    let st = statvfs(&m.mnt);
    assert_eq!(st.f_blocks * st.f_frsize, 10 << 20);
    assert_eq!(st.f_bavail * st.f_frsize, (10 << 20) - 4096 * 3);
    assert_eq!(st.f_bfree * st.f_frsize, (10 << 20) - 4096 * 3);

    m.ctl.set_space_limit(None);
    let st = statvfs(&m.mnt);
    let backing = statvfs(&m.backing);
    assert_eq!(
        st.f_blocks * st.f_frsize,
        backing.f_blocks * backing.f_frsize
    );
}

#[test]
fn large_file_round_trip() {
    if !fuse_ready("large_file_round_trip") {
        return;
    }
    let m = Mounted::new();
    let p = m.path("big");
    let mib = 1 << 20;
    let chunk = pattern(mib, 9);
    let mut f = open_rw(&p);
    for _ in 0..192 {
        f.write_all(&chunk).expect("write");
    }
    f.sync_data().expect("fdatasync");
    // Overwrite 64 MiB in the middle and append 64 MiB more, all unsynced.
    let other = pattern(mib, 200);
    for i in 64..128 {
        f.write_all_at(&other, i * mib as u64).expect("overwrite");
    }
    for i in 192..256 {
        f.write_all_at(&other, i * mib as u64).expect("append");
    }
    assert_eq!(f.metadata().expect("stat").len(), 256 * mib as u64);
    assert!(m.ctl.stats().unsynced_bytes >= 128 * mib as u64);
    drop(f);
    m.ctl.drop_unsynced().expect("drop");
    let mut f = File::open(&p).expect("open");
    assert_eq!(f.metadata().expect("stat").len(), 192 * mib as u64);
    let mut buf = vec![0u8; mib];
    for i in 0..192 {
        f.read_exact(&mut buf).expect("read");
        assert!(buf == chunk, "MiB {i} differs after the drop");
    }
}

#[test]
fn pass_through_operations() {
    if !fuse_ready("pass_through_operations") {
        return;
    }
    let m = Mounted::new();
    std::fs::create_dir_all(m.path("a/b")).expect("mkdir -p");
    std::fs::write(m.path("a/b/f"), b"hello").expect("write");
    std::fs::hard_link(m.path("a/b/f"), m.path("a/link")).expect("link");
    std::os::unix::fs::symlink("b/f", m.path("a/sym")).expect("symlink");
    assert_eq!(read(&m.path("a/sym")), b"hello");
    assert_eq!(
        std::fs::read_link(m.path("a/sym")).expect("readlink"),
        std::path::Path::new("b/f")
    );
    let md = std::fs::metadata(m.path("a/link")).expect("stat");
    assert_eq!(md.nlink(), 2);
    assert_eq!(
        md.ino(),
        std::fs::metadata(m.path("a/b/f")).expect("stat").ino()
    );
    let mut names: Vec<String> = std::fs::read_dir(m.path("a"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "link", "sym"]);

    std::fs::set_permissions(m.path("a/b/f"), std::fs::Permissions::from_mode(0o640))
        .expect("chmod");
    assert_eq!(
        std::fs::metadata(m.path("a/b/f")).expect("stat").mode() & 0o7777,
        0o640
    );
    let f = File::options()
        .write(true)
        .open(m.path("a/b/f"))
        .expect("open");
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    f.set_modified(when).expect("utimes");
    assert_eq!(f.metadata().expect("stat").modified().expect("mtime"), when);
    // SAFETY: plain system calls on an open descriptor.
    unsafe {
        assert_eq!(
            libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20),
            0
        );
        assert_eq!(libc::fallocate(f.as_raw_fd(), 0, 0, 8192), 0);
    }
    assert_eq!(f.metadata().expect("stat").len(), 8192);
    drop(f);

    // A file with a large hole.
    let h = open_rw(&m.path("holey"));
    h.write_all_at(b"end", 1 << 30).expect("write past a hole");
    assert_eq!(h.metadata().expect("stat").len(), (1 << 30) + 3);
    drop(h);

    std::fs::remove_file(m.path("a/link")).expect("unlink");
    std::fs::remove_file(m.path("a/sym")).expect("unlink");
    std::fs::remove_file(m.path("a/b/f")).expect("unlink");
    std::fs::remove_dir(m.path("a/b")).expect("rmdir");
    assert!(std::fs::remove_dir(m.path("a/missing")).is_err());
    std::fs::remove_file(m.path("holey")).expect("unlink");
    std::fs::remove_dir(m.path("a")).expect("rmdir");
    assert_eq!(std::fs::read_dir(&m.backing).expect("ls").count(), 0);
    File::open(&m.mnt)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
    assert_eq!(m.ctl.stats().space_used, 0);
}

#[test]
fn unmount_leaves_nothing_mounted() {
    if !fuse_ready("unmount_leaves_nothing_mounted") {
        return;
    }
    let m = Mounted::new();
    let mnt = m.fs.mountpoint().to_path_buf();
    assert!(common::is_mounted(&mnt));
    let Mounted { fs, dir, .. } = m;
    fs.unmount().expect("unmount");
    assert!(!common::is_mounted(&mnt));
    drop(dir);
}

/// A small deterministic generator (xorshift), so that a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn fallocate(f: &File, mode: i32, offset: u64, len: u64) {
    // SAFETY: plain system call on an open descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
}

#[test]
fn random_operations_match_a_model() {
    if !fuse_ready("random_operations_match_a_model") {
        return;
    }
    let m = Mounted::new();
    const FILES: usize = 4;
    const MAX: u64 = 256 * 1024;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut files: Vec<File> = (0..FILES)
        .map(|i| open_rw(&m.path(&format!("f{i}"))))
        .collect();
    // What each file holds now, and what it held at its last sync.
    let mut now: Vec<Vec<u8>> = vec![Vec::new(); FILES];
    let mut synced: Vec<Vec<u8>> = vec![Vec::new(); FILES];
    let check = |now: &[Vec<u8>], step: usize| {
        for (i, want) in now.iter().enumerate() {
            let got = read(&m.path(&format!("f{i}")));
            assert!(
                got == *want,
                "file f{i} differs from the model at step {step}"
            );
        }
    };
    for step in 0..4000 {
        let i = rng.below(FILES as u64) as usize;
        let (f, cur) = (&files[i], &mut now[i]);
        let size = cur.len() as u64;
        match rng.below(100) {
            0..=44 => {
                let off = rng.below(size + 4096).min(MAX);
                let long = rng.below(4) == 0;
                let len = 1 + rng.below(if long { 64 * 1024 } else { 600 });
                let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                f.write_all_at(&data, off).expect("write");
                let end = (off + len) as usize;
                if cur.len() < end {
                    cur.resize(end, 0);
                }
                cur[off as usize..end].copy_from_slice(&data);
            }
            45..=54 => {
                let new = rng.below(MAX);
                f.set_len(new).expect("truncate");
                cur.resize(new as usize, 0);
            }
            55..=62 => {
                let off = rng.below(size + 4096);
                let len = 1 + rng.below(32 * 1024);
                let end = (off + len) as usize;
                match rng.below(4) {
                    0 => {
                        fallocate(f, 0, off, len);
                        if cur.len() < end {
                            cur.resize(end, 0);
                        }
                    }
                    1 => fallocate(f, libc::FALLOC_FL_KEEP_SIZE, off, len),
                    2 => {
                        fallocate(
                            f,
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            off,
                            len,
                        );
                        let e = end.min(cur.len());
                        if (off as usize) < e {
                            cur[off as usize..e].fill(0);
                        }
                    }
                    _ => {
                        fallocate(f, libc::FALLOC_FL_ZERO_RANGE, off, len);
                        if cur.len() < end {
                            cur.resize(end, 0);
                        }
                        cur[off as usize..end].fill(0);
                    }
                }
            }
            63..=77 => {
                if rng.below(2) == 0 {
                    f.sync_all().expect("fsync");
                } else {
                    f.sync_data().expect("fdatasync");
                }
                synced[i] = cur.clone();
            }
            78..=79 => {
                // Reopen the file (a new handle, the same unsynced state).
                files[i] = open_rw(&m.path(&format!("f{i}")));
            }
            80..=81 => {
                // The power loss, with files open: everything goes back to the last syncs.
                m.ctl.drop_unsynced().expect("drop");
                now.clone_from(&synced);
                check(&now, step);
            }
            _ => {
                let off = rng.below(size + 10);
                let mut buf = vec![0u8; 1 + rng.below(8192) as usize];
                let n = f.read_at(&mut buf, off).expect("read");
                let want = &cur[(off as usize).min(cur.len())..];
                let want = &want[..want.len().min(buf.len())];
                assert_eq!(&buf[..n], want, "read at step {step}");
            }
        }
    }
    check(&now, 4000);
    m.ctl.drop_unsynced().expect("drop");
    check(&synced, 4001);
}

#[test]
fn unmount_releases_stalled_fsyncs() {
    if !fuse_ready("unmount_releases_stalled_fsyncs") {
        return;
    }
    let m = Mounted::new();
    m.ctl.set_fsync_delay(Some(FOREVER));
    let mut f = open_rw(&m.path("f"));
    f.write_all(b"synced at unmount").expect("write");
    let syncer = std::thread::spawn(move || f.sync_all());
    wait_until("the fsync to stall", Duration::from_secs(5), || {
        m.ctl.stats().pending_fsyncs == 1
    });
    let Mounted {
        fs, dir, backing, ..
    } = m;
    let mnt = fs.mountpoint().to_path_buf();
    // The file is still open in the syncing thread: the mount is detached.
    fs.unmount().expect("unmount");
    wait_until("the fsync to return", Duration::from_secs(5), || {
        syncer.is_finished()
    });
    syncer.join().expect("thread").expect("fsync");
    assert!(!common::is_mounted(&mnt));
    assert_eq!(read(&backing.join("f")), b"synced at unmount");
    drop(dir);
}
