//! `raftq-faultfs`: mounts the fault file system, unmounts a stale mount, or sends a control
//! command to a running mount.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use raftq_faultfs::{ControlServer, FaultFs, Options, FOREVER};

#[derive(Parser)]
#[command(
    name = "raftq-faultfs",
    about = "A FUSE pass-through file system that loses unsynced writes on demand, stalls fsync \
             and fills up"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mounts BACKING at MOUNTPOINT in the foreground; prints "mounted" once ready and
    /// unmounts on SIGTERM or SIGINT.
    Mount {
        /// The directory that holds the "disk" content.
        #[arg(long)]
        backing: PathBuf,
        /// Where to mount (an empty directory).
        #[arg(long)]
        mountpoint: PathBuf,
        /// The Unix socket to serve control commands on.
        #[arg(long)]
        control: PathBuf,
        /// fsync delay to start with, in milliseconds or "forever".
        #[arg(long, default_value = "0")]
        fsync_delay: String,
        /// Space limit to start with, in bytes or "unlimited".
        #[arg(long, default_value = "unlimited")]
        space: String,
        /// Directory for the pre-images of overwritten synced bytes (default: the temporary
        /// directory).
        #[arg(long)]
        undo_dir: Option<PathBuf>,
        /// Let all users use the mount (the kernel checks permissions).
        #[arg(long)]
        allow_other: bool,
    },
    /// Unmounts MOUNTPOINT at once, also one left by a crashed process (a lazy unmount).
    Unmount {
        #[arg(long)]
        mountpoint: PathBuf,
    },
    /// Sends a command to a running mount's control socket and prints the reply:
    /// drop | sync | status | fsync-delay MS|forever | space BYTES|unlimited.
    Ctl {
        /// The mount's control socket.
        #[arg(long)]
        control: PathBuf,
        /// The command and its argument.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount {
            backing,
            mountpoint,
            control,
            fsync_delay,
            space,
            undo_dir,
            allow_other,
        } => mount(
            backing,
            mountpoint,
            control,
            &fsync_delay,
            &space,
            undo_dir,
            allow_other,
        ),
        Command::Unmount { mountpoint } => raftq_faultfs::force_unmount(&mountpoint)
            .map(|()| true)
            .map_err(anyhow::Error::from),
        Command::Ctl { control, command } => ctl(control, &command.join(" ")),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("raftq-faultfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn ctl(control: PathBuf, command: &str) -> anyhow::Result<bool> {
    let reply = raftq_faultfs::send_command(&control, command)?;
    println!("{reply}");
    Ok(reply == "ok" || reply.starts_with("ok "))
}

fn parse_delay(s: &str) -> anyhow::Result<Duration> {
    if s == "forever" {
        return Ok(FOREVER);
    }
    let ms: u64 = s
        .parse()
        .with_context(|| format!("--fsync-delay takes milliseconds or 'forever', not '{s}'"))?;
    Ok(Duration::from_millis(ms))
}

fn parse_space(s: &str) -> anyhow::Result<Option<u64>> {
    if s == "unlimited" {
        return Ok(None);
    }
    let bytes: u64 = s
        .parse()
        .with_context(|| format!("--space takes bytes or 'unlimited', not '{s}'"))?;
    Ok(Some(bytes))
}

/// Blocks the termination signals in this thread and the threads it starts, so that
/// `wait_for_signal` receives them.
fn block_signals() -> anyhow::Result<libc::sigset_t> {
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!(
                "blocking signals: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(set)
    }
}

/// Waits for one of the blocked signals; `None` if the mount went away first.
fn wait_for_signal(set: &libc::sigset_t, fs: &FaultFs) -> Option<i32> {
    let second = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: `set` is a valid signal set and `second` a valid timeout.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &second) };
        if sig > 0 {
            return Some(sig);
        }
        if !fs.is_serving() {
            return None;
        }
    }
}

fn mount(
    backing: PathBuf,
    mountpoint: PathBuf,
    control: PathBuf,
    fsync_delay: &str,
    space: &str,
    undo_dir: Option<PathBuf>,
    allow_other: bool,
) -> anyhow::Result<bool> {
    let options = Options {
        fsync_delay: parse_delay(fsync_delay)?,
        space_limit: parse_space(space)?,
        undo_dir,
        allow_other,
        ..Options::default()
    };
    // Before any thread starts, so that all of them inherit the mask.
    let signals = block_signals()?;
    let fs = FaultFs::mount_with(&backing, &mountpoint, options)?;
    let server = ControlServer::start(fs.control(), &control)?;
    {
        let mut out = std::io::stdout().lock();
        // A parent that stopped listening is no reason to fail.
        let _ = writeln!(out, "mounted");
        let _ = out.flush();
    }
    let Some(sig) = wait_for_signal(&signals, &fs) else {
        drop(server);
        let _ = fs.unmount();
        bail!(
            "the mount at {} went away (unmounted from outside?)",
            mountpoint.display()
        );
    };
    eprintln!(
        "raftq-faultfs: signal {sig}: unmounting {}",
        fs.mountpoint().display()
    );
    drop(server);
    fs.unmount()?;
    Ok(true)
}
