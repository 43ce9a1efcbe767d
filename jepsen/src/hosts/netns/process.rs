//! The node processes: starting a node in its namespace, the sentinel that leads the nodes'
//! process group, signals, and killing and reaping (one node, some, or the whole group).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::{NetnsHosts, DEATH_WAIT};
use crate::hosts::net::{lock, run};
use crate::hosts::Hosts;

/// SIGKILLs every process inside namespace `ns`.
pub(super) fn kill_namespace_processes(ns: &str) {
    let pids = run("ip", &["netns", "pids", ns]).unwrap_or_default();
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: sending a signal has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Removes the shared-memory segment and semaphore libfaketime made for process `pid`, which
/// it leaves behind when the process is killed (a later process with the same pid would find
/// them and fail).
pub(super) fn forget_fake_clock(pid: u32) {
    for name in [
        format!("/dev/shm/faketime_shm_{pid}"),
        format!("/dev/shm/sem.faketime_sem_{pid}"),
    ] {
        let _ = std::fs::remove_file(name);
    }
}

/// Reaps `child` (waits for it), then removes what libfaketime left for it when the node ran
/// under a fake clock.
pub(super) fn reap(
    child: &mut Child,
    fake_clock: bool,
) -> std::io::Result<std::process::ExitStatus> {
    let status = child.wait();
    if fake_clock {
        forget_fake_clock(child.id());
    }
    status
}

/// True once `child` has exited, without reaping it (so its pid stays ours).
pub(super) fn has_died(child: &Child) -> bool {
    let pid: libc::id_t = child.id();
    // SAFETY: `info` is a plain C struct, zeroed, written by waitid; WNOWAIT leaves the child
    // waitable, WNOHANG makes the call return at once.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc != 0 || info.si_pid() != 0
    }
}

/// Waits until every child in `children` has died (not reaped), at most `limit`.
fn await_death(children: &[(u64, Child)], limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && !children.iter().all(|(_, c)| has_died(c)) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(super) fn signal(child: &Child, sig: libc::c_int) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    // SAFETY: sending a signal has no memory-safety preconditions; the child is not reaped
    // yet (we hold it), so its pid cannot have been reused.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!(
            "cannot send signal {sig} to pid {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

impl NetnsHosts {
    /// The nodes' process group: the sentinel's pid, after making a new sentinel when there is
    /// none alive.
    fn group(&self) -> anyhow::Result<i32> {
        let mut sentinel = lock(&self.sentinel);
        if let Some(child) = sentinel.as_mut() {
            if child.try_wait()?.is_none() {
                return i32::try_from(child.id()).context("pid out of range");
            }
        }
        // A process that does nothing for 30 years, leading a group of its own.
        let child = Command::new("sleep")
            .arg("1000000000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the sentinel of the nodes' process group (`sleep`)")?;
        let pgid = i32::try_from(child.id()).context("pid out of range")?;
        *sentinel = Some(child);
        Ok(pgid)
    }

    pub(super) fn spawn(&self, id: u64) -> anyhow::Result<()> {
        let cfg = &self.cfg;
        let mut nodes = lock(&self.nodes);
        let node = nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id}"))?;
        if let Some(child) = node.child.as_mut() {
            if child.try_wait()?.is_none() {
                return Ok(()); // already running
            }
            if cfg.env.fake_clock.is_some() {
                forget_fake_clock(child.id());
            }
            node.child = None;
        }
        let pgid = self.group()?;
        node.starts += 1;
        node.exited = None;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(cfg.layout().log_file(id))
            .context("cannot open the node's log")?;
        writeln!(
            log,
            "===== [raftq-jepsen] start #{} of node {id} =====",
            node.starts
        )?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &cfg.netns(id)])
            .arg(&cfg.bin)
            .arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(format!("{}:{}", cfg.node_addr(id), cfg.port))
            .arg("--data")
            .arg(cfg.layout().data_dir(id))
            .arg("--peers")
            .arg(cfg.layout().peers_arg())
            .arg("--cluster-secret-file")
            .arg(cfg.layout().secret_file())
            .arg("--cluster-id")
            .arg(&cfg.cluster_id);
        if let Some(bytes) = cfg.env.write_buffer_bytes {
            cmd.arg("--write-buffer-bytes").arg(bytes.to_string());
        }
        if let Some(logs) = cfg.env.snapshot_logs {
            cmd.arg("--snapshot-logs").arg(logs.to_string());
            cmd.arg("--snapshot-keep-logs").arg((logs / 5).to_string());
        }
        // Only the command line configures the node.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RAFTQ_") {
                cmd.env_remove(name);
            }
        }
        if let Some(lib) = &cfg.env.fake_clock {
            // The wall clock from the node's offset file, read on every call so that a step
            // takes effect at once; the monotonic clock is the real one (unless the clock
            // checks themselves are being tested).
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", cfg.clock_file(id))
                .env("FAKETIME_NO_CACHE", "1");
            if !cfg.env.fake_monotonic {
                cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            }
        }
        cmd.env("RAFTQ_LOG", &cfg.log_filter)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            // The nodes' group (see the module documentation): `kill_all` is one signal.
            .process_group(pgid);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start node {id}"))?;
        node.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the nodes `only` (each on its own), or every running node (`None`: one signal
    /// to the nodes' process group); once they are all dead, or after [`DEATH_WAIT`] (threads
    /// waiting for a stalled sync die only when it ends), runs `dead`; then reaps them. Returns
    /// how they were killed and what `dead` returned.
    pub(super) async fn kill_nodes<R: Send + 'static>(
        &self,
        only: Option<Vec<u64>>,
        dead: impl FnOnce() -> R + Send + 'static,
    ) -> anyhow::Result<(String, R)> {
        let fake_clock = self.cfg.env.fake_clock.is_some();
        let mut children: Vec<(u64, Child)> = {
            let mut nodes = lock(&self.nodes);
            nodes
                .iter_mut()
                .filter(|(id, _)| only.as_ref().is_none_or(|o| o.contains(id)))
                .filter_map(|(id, n)| n.child.take().map(|c| (*id, c)))
                .collect()
        };
        let namespaces: Vec<String> = match &only {
            Some(ids) => ids.iter().map(|id| self.cfg.netns(*id)).collect(),
            None => self.ids().iter().map(|id| self.cfg.netns(*id)).collect(),
        };
        if let Some(ids) = only {
            return tokio::task::spawn_blocking(move || {
                for (_, child) in children.iter_mut() {
                    let _ = child.kill();
                }
                for ns in &namespaces {
                    kill_namespace_processes(ns);
                }
                await_death(&children, DEATH_WAIT);
                let out = dead();
                for (id, mut child) in children {
                    reap(&mut child, fake_clock)
                        .with_context(|| format!("cannot reap node {id}"))?;
                }
                Ok((format!("SIGKILL to nodes {ids:?}"), out))
            })
            .await?;
        }
        let sentinel = lock(&self.sentinel).take();
        tokio::task::spawn_blocking(move || {
            let Some(mut sentinel) = sentinel else {
                // No node was ever started in a group: nothing runs.
                for (_, mut child) in children {
                    let _ = child.kill();
                    let _ = reap(&mut child, fake_clock);
                }
                return Ok(("no process group: nothing ran".to_string(), dead()));
            };
            let pgid = i32::try_from(sentinel.id()).context("pid out of range")?;
            // Checked before the signal: which running nodes are not in the group.
            let outside: Vec<u64> = children
                .iter()
                .filter(|(_, c)| {
                    let pid = c.id() as i32;
                    // SAFETY: getpgid has no memory-safety preconditions; the child is not
                    // reaped, so its pid names it.
                    let group = unsafe { libc::getpgid(pid) };
                    group != pgid
                })
                .map(|(id, _)| *id)
                .collect();
            let running: Vec<u64> = children.iter().map(|(id, _)| *id).collect();
            // SAFETY: sending a signal has no memory-safety preconditions; the sentinel is not
            // reaped, so the group id is still ours.
            let sent = unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let sent_err = std::io::Error::last_os_error();
            for (id, child) in children.iter_mut() {
                if outside.contains(id) || sent != 0 {
                    let _ = child.kill();
                }
            }
            // Anything else left in the namespaces dies too (as `kill` does).
            for ns in &namespaces {
                kill_namespace_processes(ns);
            }
            let _ = sentinel.kill();
            let _ = sentinel.wait();
            await_death(&children, DEATH_WAIT);
            let out = dead();
            for (id, mut child) in children {
                reap(&mut child, fake_clock).with_context(|| format!("cannot reap node {id}"))?;
            }
            if sent != 0 {
                bail!(
                    "cannot signal the nodes' process group {pgid}: {sent_err}; nodes \
                     {running:?} were killed one by one instead"
                );
            }
            let mut how = format!("one SIGKILL to process group {pgid}: nodes {running:?}");
            if !outside.is_empty() {
                how.push_str(&format!(
                    "; nodes {outside:?} were not in the group and were killed on their own"
                ));
            }
            Ok((how, out))
        })
        .await?
    }
}
