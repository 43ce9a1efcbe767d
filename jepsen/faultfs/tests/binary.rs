//! The `raftq-faultfs` binary end to end, and real processes killed on the mount.

mod common;

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{fuse_ready, is_mounted, read, wait_until, Mounted};

const BIN: &str = env!("CARGO_BIN_EXE_raftq-faultfs");

/// A `raftq-faultfs mount` process; killed and its mount detached when dropped.
struct MountProcess {
    child: Child,
    stdout: BufReader<ChildStdout>,
    mnt: PathBuf,
    backing: PathBuf,
    control: PathBuf,
    _dir: tempfile::TempDir,
}

impl MountProcess {
    fn start() -> MountProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical path");
        let backing = root.join("backing");
        let mnt = root.join("mnt");
        std::fs::create_dir(&backing).expect("mkdir");
        std::fs::create_dir(&mnt).expect("mkdir");
        let control = root.join("control.sock");
        MountProcess::start_at(dir, backing, mnt, control)
    }

    fn start_at(
        dir: tempfile::TempDir,
        backing: PathBuf,
        mnt: PathBuf,
        control: PathBuf,
    ) -> MountProcess {
        let mut child = Command::new(BIN)
            .arg("mount")
            .arg("--backing")
            .arg(&backing)
            .arg("--mountpoint")
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn raftq-faultfs mount");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read stdout");
        assert_eq!(
            line.trim(),
            "mounted",
            "raftq-faultfs mount did not come up"
        );
        MountProcess {
            child,
            stdout,
            mnt,
            backing,
            control,
            _dir: dir,
        }
    }

    /// Runs `raftq-faultfs ctl` and returns (exit success, printed line).
    fn ctl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&self.control)
            .args(args)
            .output()
            .expect("run raftq-faultfs ctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, line) = self.ctl(args);
        assert!(ok, "ctl {args:?} failed: {line}");
        assert!(line.starts_with("ok"), "ctl {args:?}: {line}");
        line
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child by its pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    }
}

impl Drop for MountProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.mnt) {
            let _ = raftq_faultfs::force_unmount(&self.mnt);
        }
    }
}

fn field(status: &str, name: &str) -> String {
    status
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in '{status}'"))
        .to_string()
}

#[test]
fn control_socket_commands_work_end_to_end() {
    if !fuse_ready("control_socket_commands_work_end_to_end") {
        return;
    }
    let mut p = MountProcess::start();
    let f = |n: &str| p.mnt.join(n);

    std::fs::write(f("a"), b"first").expect("write");
    let status = p.ok(&["status"]);
    assert_eq!(field(&status, "unsynced_bytes"), "5");
    assert_eq!(field(&status, "space_limit"), "unlimited");
    assert_eq!(p.ok(&["sync"]), "ok synced files=1");
    std::fs::write(f("a"), b"second, longer").expect("write");
    std::fs::write(f("b"), b"never synced").expect("write");
    assert_eq!(
        p.ok(&["drop"]),
        "ok dropped files=2 bytes=26 failed_fsyncs=0"
    );
    assert_eq!(read(&f("a")), b"first");
    assert_eq!(read(&f("b")), b"");
    assert_eq!(field(&p.ok(&["status"]), "drops"), "1");

    // fsync-delay forever stalls an fsync until the delay is set back to 0.
    assert_eq!(p.ok(&["fsync-delay", "forever"]), "ok fsync-delay forever");
    let path = f("a");
    let syncer = std::thread::spawn(move || {
        let mut file = OpenOptions::new().append(true).open(path)?;
        file.write_all(b"+stalled")?;
        file.sync_all()
    });
    wait_until("a stalled fsync", Duration::from_secs(5), || {
        field(&p.ok(&["status"]), "pending_fsyncs") == "1"
    });
    assert_eq!(field(&p.ok(&["status"]), "fsync_delay"), "forever");
    assert_eq!(p.ok(&["fsync-delay", "0"]), "ok fsync-delay 0");
    syncer.join().expect("thread").expect("fsync");
    assert_eq!(p.ok(&["fsync-delay", "25"]), "ok fsync-delay 25");
    let start = std::time::Instant::now();
    std::fs::File::open(f("a"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    assert!(start.elapsed() >= Duration::from_millis(25));
    p.ok(&["fsync-delay", "0"]);

    // space BYTES fills the disk, space unlimited empties it.
    let used: u64 = field(&p.ok(&["status"]), "space_used")
        .parse()
        .expect("number");
    assert_eq!(used, 13);
    assert_eq!(p.ok(&["space", "20"]), "ok space 20");
    let err = std::fs::write(f("c"), b"more than seven").expect_err("ENOSPC");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(field(&p.ok(&["status"]), "enospc"), "1");
    assert_eq!(p.ok(&["space", "unlimited"]), "ok space unlimited");
    std::fs::write(f("c"), b"more than seven").expect("write");

    // Bad input is an error line and exit status 1, never a crash.
    for bad in [
        vec!["bogus"],
        vec!["fsync-delay", "soon"],
        vec!["space", "-5"],
        vec!["space"],
        vec!["drop", "now"],
    ] {
        let (ok, line) = p.ctl(&bad);
        assert!(!ok, "ctl {bad:?} succeeded: {line}");
        assert!(line.starts_with("error "), "ctl {bad:?}: {line}");
    }
    let out = Command::new(BIN)
        .args(["ctl", "--control", "/nonexistent/socket", "status"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/socket"));

    // SIGTERM unmounts cleanly and exits 0; the backing directory holds the disk content.
    p.signal(libc::SIGTERM);
    let status = p.child.wait().expect("wait");
    assert!(status.success(), "exit status {status}");
    assert!(!is_mounted(&p.mnt));
    assert!(!p.control.exists(), "the control socket was left behind");
    assert_eq!(read(&p.backing.join("a")), b"first+stalled");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut p.stdout, &mut rest);
}

#[test]
fn mount_of_a_killed_instance_can_be_unmounted_and_mounted_again() {
    if !fuse_ready("mount_of_a_killed_instance_can_be_unmounted_and_mounted_again") {
        return;
    }
    let mut p = MountProcess::start();
    std::fs::write(p.mnt.join("f"), b"data").expect("write");
    p.signal(libc::SIGKILL);
    p.child.wait().expect("wait");
    let err = std::fs::metadata(&p.mnt).expect_err("a dead mount answers");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));

    let out = Command::new(BIN)
        .args(["unmount", "--mountpoint"])
        .arg(&p.mnt)
        .output()
        .expect("run unmount");
    assert!(
        out.status.success(),
        "unmount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&p.mnt));
    assert!(p.mnt.is_dir());
    // Unmounting what is not mounted says so.
    let out = Command::new(BIN)
        .args(["unmount", "--mountpoint"])
        .arg(&p.mnt)
        .output()
        .expect("run unmount");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing is mounted"));

    // A new instance over a dead mount (killed again) takes it over by itself.
    let dir = tempfile::tempdir().expect("tempdir");
    let (backing, mnt, control) = (p.backing.clone(), p.mnt.clone(), p.control.clone());
    let mut q = MountProcess::start_at(dir, backing.clone(), mnt.clone(), control.clone());
    q.signal(libc::SIGKILL);
    q.child.wait().expect("wait");
    let r = MountProcess::start_at(tempfile::tempdir().expect("tempdir"), backing, mnt, control);
    assert_eq!(read(&r.mnt.join("f")), b"data");
    drop(r);
    drop(q);
    drop(p);
}

/// Not a test by itself: the writer process of `killed_writer_keeps_exactly_its_synced_prefix`.
#[test]
fn child_writer_process() {
    let Ok(path) = std::env::var("FAULTFS_CHILD_FILE") else {
        return;
    };
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open");
    for i in 0..RECORDS {
        f.write_all(&record(i)).expect("append");
        if i % 2 == 1 {
            f.sync_data().expect("fdatasync");
        }
    }
    // libtest may have written to this line already: the marker ends it.
    println!("{WRITTEN}");
    std::io::stdout().flush().expect("flush");
    // Wait to be killed.
    std::thread::sleep(Duration::from_secs(120));
}

const RECORDS: usize = 41;
const WRITTEN: &str = "faultfs-child-has-written-everything";

fn record(i: usize) -> Vec<u8> {
    format!("record {i:05} {}\n", "x".repeat(i * 7 % 50)).into_bytes()
}

#[test]
fn killed_writer_keeps_exactly_its_synced_prefix() {
    if !fuse_ready("killed_writer_keeps_exactly_its_synced_prefix") {
        return;
    }
    let m = Mounted::new();
    let path = m.path("wal.log");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_writer_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAULTFS_CHILD_FILE", &path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the writer");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut written = false;
    for line in stdout.lines() {
        if line.expect("read").trim_end().ends_with(WRITTEN) {
            written = true;
            break;
        }
    }
    assert!(written, "the writer died before writing everything");
    child.kill().expect("SIGKILL the writer");
    child.wait().expect("wait");

    let all: Vec<u8> = (0..RECORDS).flat_map(record).collect();
    assert_eq!(
        read(&path),
        all,
        "everything is visible before the power loss"
    );
    m.ctl.drop_unsynced().expect("drop");
    // The last fdatasync followed record RECORDS - 2: the last record is lost.
    let synced: Vec<u8> = (0..RECORDS - 1).flat_map(record).collect();
    let survived = read(&path);
    assert_eq!(
        String::from_utf8_lossy(&survived),
        String::from_utf8_lossy(&synced)
    );
    assert_eq!(read(&m.backing_path("wal.log")), synced);
}
