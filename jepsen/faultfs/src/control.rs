//! The control protocol: one line command, one line reply (`ok ...` or `error ...`), over a
//! Unix stream socket.
//!
//! | command | reply |
//! | --- | --- |
//! | `drop` | `ok dropped files=N bytes=N failed_fsyncs=N` |
//! | `sync` | `ok synced files=N` |
//! | `status` | `ok unsynced_bytes=N unsynced_files=N fsyncs=N pending_fsyncs=N drops=N enospc=N fsync_delay=MS|forever space_used=N space_limit=N|unlimited` |
//! | `fsync-delay MS`, `fsync-delay forever`, `fsync-delay 0` | `ok fsync-delay ...` |
//! | `space BYTES`, `space unlimited` | `ok space ...` |

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Control, Error, Result, FOREVER};

const USAGE: &str = "expected drop, sync, status, fsync-delay MS|forever, space BYTES|unlimited";

/// Lines longer than this are refused.
const MAX_LINE: u64 = 4096;

fn delay_text(d: Duration) -> String {
    if d == FOREVER {
        "forever".into()
    } else {
        d.as_millis().to_string()
    }
}

/// Runs one command line against `ctl` and returns the reply line (without a newline).
pub fn execute(ctl: &Control, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["drop"] => match ctl.drop_unsynced() {
            Ok(r) => format!(
                "ok dropped files={} bytes={} failed_fsyncs={}",
                r.files, r.bytes, r.failed_fsyncs
            ),
            Err(e) => format!("error {e}"),
        },
        ["sync"] => match ctl.sync_all() {
            Ok(n) => format!("ok synced files={n}"),
            Err(e) => format!("error {e}"),
        },
        ["status"] => {
            let s = ctl.stats();
            format!(
                "ok unsynced_bytes={} unsynced_files={} fsyncs={} pending_fsyncs={} drops={} \
                 enospc={} fsync_delay={} space_used={} space_limit={}",
                s.unsynced_bytes,
                s.unsynced_files,
                s.fsyncs,
                s.pending_fsyncs,
                s.drops,
                s.enospc,
                delay_text(s.fsync_delay),
                s.space_used,
                s.space_limit
                    .map_or_else(|| "unlimited".to_string(), |l| l.to_string()),
            )
        }
        ["fsync-delay", "forever"] => {
            ctl.set_fsync_delay(Some(FOREVER));
            "ok fsync-delay forever".into()
        }
        ["fsync-delay", ms] => match ms.parse::<u64>() {
            Ok(ms) => {
                ctl.set_fsync_delay(Some(Duration::from_millis(ms)));
                format!("ok fsync-delay {ms}")
            }
            Err(_) => format!(
                "error fsync-delay takes milliseconds or 'forever', not '{}'",
                ms.escape_debug()
            ),
        },
        ["space", "unlimited"] => {
            ctl.set_space_limit(None);
            "ok space unlimited".into()
        }
        ["space", bytes] => match bytes.parse::<u64>() {
            Ok(b) => {
                ctl.set_space_limit(Some(b));
                format!("ok space {b}")
            }
            Err(_) => format!(
                "error space takes a number of bytes or 'unlimited', not '{}'",
                bytes.escape_debug()
            ),
        },
        [] => format!("error empty command ({USAGE})"),
        _ => format!(
            "error unknown command '{}' ({USAGE})",
            line.trim().escape_debug()
        ),
    }
}

/// Serves the control protocol on a Unix socket until dropped (then the socket file goes).
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ControlServer {
    /// Listens at `path` (a stale socket file there is replaced) and serves `ctl`.
    pub fn start(ctl: Control, path: &Path) -> Result<ControlServer> {
        if let Ok(md) = std::fs::symlink_metadata(path) {
            if !md.file_type().is_socket() {
                return Err(Error::Invalid(format!(
                    "{} exists and is not a socket",
                    path.display()
                )));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(Error::Invalid(format!(
                    "{} is in use by another running process",
                    path.display()
                )));
            }
            std::fs::remove_file(path).map_err(Error::io(format!(
                "removing the stale socket {}",
                path.display()
            )))?;
        }
        let listener = UnixListener::bind(path)
            .map_err(Error::io(format!("listening on {}", path.display())))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("faultfs-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if thread_stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let conn = match conn {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of descriptors, say: do not spin.
                            eprintln!("raftq-faultfs: control socket: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    };
                    let ctl = ctl.clone();
                    // One thread per connection: a slow client holds up nobody.
                    let _ = std::thread::Builder::new()
                        .name("faultfs-control-conn".into())
                        .spawn(move || {
                            if let Err(e) = serve_connection(&ctl, conn) {
                                if e.kind() != io::ErrorKind::BrokenPipe {
                                    eprintln!("raftq-faultfs: control connection: {e}");
                                }
                            }
                        });
                }
            })
            .map_err(Error::io("starting the control thread"))?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread up.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_connection(ctl: &Control, conn: UnixStream) -> io::Result<()> {
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        let n = (&mut reader).take(MAX_LINE).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if !line.ends_with('\n') && n as u64 == MAX_LINE {
            writeln!(writer, "error command line too long")?;
            return Ok(());
        } else {
            execute(ctl, line.trim())
        };
        writeln!(writer, "{reply}")?;
    }
}

/// Sends one command to the control socket at `path` and returns the reply line.
pub fn send_command(path: &Path, command: &str) -> Result<String> {
    let mut conn = UnixStream::connect(path)
        .map_err(Error::io(format!("connecting to {}", path.display())))?;
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(Error::io("setting a timeout"))?;
    writeln!(conn, "{}", command.trim()).map_err(Error::io("sending the command"))?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .map_err(Error::io("reading the reply"))?;
    if line.is_empty() {
        return Err(Error::Invalid(
            "the control socket closed without a reply".into(),
        ));
    }
    Ok(line.trim_end().to_string())
}
