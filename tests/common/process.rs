//! The node processes: their logs, failing a test with them, kills, signals, restarts.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{lock, tail, Cluster, LOG_TAIL_LINES};

impl Cluster {
    /// Everything node `id` wrote to stdout and stderr, over all its starts.
    pub fn log(&self, id: u64) -> String {
        let path = lock(&self.nodes)
            .get(&id)
            .map(|n| n.log.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"));
        std::fs::read(&path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// What node `id` logged since its latest start.
    pub fn log_since_last_start(&self, id: u64) -> String {
        let log = self.log(id);
        match log.rfind("===== [harness] start #") {
            Some(at) => log[at..].to_string(),
            None => log,
        }
    }

    pub(super) fn any_start_log_contains(&self, needle: &str) -> bool {
        self.ids()
            .into_iter()
            .any(|id| self.log_since_last_start(id).contains(needle))
    }

    /// `msg`, the cluster directory, and the tail of every node's log.
    pub fn report(&self, msg: &str) -> String {
        let mut text = format!(
            "{msg}\n\ncluster directory: {} (kept for inspection)\n",
            self.root.display()
        );
        let states: Vec<(u64, u16, bool)> = lock(&self.nodes)
            .iter()
            .map(|(id, n)| (*id, n.port, n.child.is_some()))
            .collect();
        for (id, port, running) in states {
            let state = if running { "running" } else { "not running" };
            text.push_str(&format!(
                "\n----- node {id} (port {port}, {state}): last {LOG_TAIL_LINES} log lines -----\n{}\n",
                tail(&self.log(id), LOG_TAIL_LINES)
            ));
        }
        text
    }

    /// Panics with `msg` and the tails of every node's log.
    #[track_caller]
    pub fn fail(&self, msg: &str) -> ! {
        panic!("{}", self.report(msg))
    }

    /// The process id of running node `id`.
    pub fn pid(&self, id: u64) -> u32 {
        match lock(&self.nodes).get(&id).and_then(|n| n.child.as_ref()) {
            Some(child) => child.id(),
            None => panic!("node {id} is not running"),
        }
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&self, id: u64) {
        let child = lock(&self.nodes).get_mut(&id).and_then(|n| n.child.take());
        match child {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            None => self.fail(&format!("kill: node {id} is not running")),
        }
    }

    /// SIGKILLs every running node at once (all signals first, then the reaping).
    pub fn kill_all(&self) {
        let mut children: Vec<Child> = lock(&self.nodes)
            .values_mut()
            .filter_map(|n| n.child.take())
            .collect();
        for child in &mut children {
            let _ = child.kill();
        }
        for child in &mut children {
            let _ = child.wait();
        }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to node `id` without waiting.
    pub fn signal(&self, id: u64, signal: libc::c_int) {
        let pid = self.pid(id) as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            self.fail(&format!(
                "kill({pid}, {signal}) for node {id} failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }

    /// Waits, at most `timeout`, for node `id` to exit; returns its exit status.
    pub async fn wait_exit(&self, id: u64, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut nodes = lock(&self.nodes);
                let node = nodes.get_mut(&id).expect("node exists");
                match node.child.as_mut().map(Child::try_wait) {
                    None => {
                        drop(nodes);
                        self.fail(&format!("wait_exit: node {id} is not running"));
                    }
                    Some(Ok(Some(status))) => {
                        node.child = None;
                        return status;
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => {
                        drop(nodes);
                        self.fail(&format!("waiting for node {id}: {e}"));
                    }
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!("node {id} did not exit within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERMs node `id` and waits (at most 25 s) for it to exit.
    pub async fn terminate(&self, id: u64) -> ExitStatus {
        self.signal(id, libc::SIGTERM);
        self.wait_exit(id, Duration::from_secs(25)).await
    }

    /// Runs `cmd` and waits (at most 10 s) for it to exit; returns its status and output.
    pub async fn run_to_exit(&self, mut cmd: Command, what: &str) -> (bool, String) {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| self.fail(&format!("{what}: cannot spawn: {e}")));
        let started = std::time::Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collect output");
                self.fail(&format!(
                    "{what}: still running after 10 s: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = child.wait_with_output().expect("collect output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Starts node `id` from now on with a soft limit of `soft` open files (its hard limit
    /// the harness's own).
    pub fn set_open_files_limit(&self, id: u64, soft: u64) {
        lock(&self.nodes)
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
            .open_files = Some(soft);
    }

    /// Sets environment variables for the next starts of node `id` (e.g. a fake clock);
    /// an empty list clears them.
    pub fn set_env(&self, id: u64, env: &[(&str, &str)]) {
        let mut nodes = lock(&self.nodes);
        let node = nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"));
        node.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Starts node `id` again with the same command line and data directory, without waiting
    /// for anything.
    pub fn start_node(&self, id: u64) {
        self.spawn(id);
    }

    /// Starts node `id` again with the same command line and data directory, and waits until
    /// it answers `/healthz` (not until it caught up: see [`Cluster::wait_converged`]).
    pub async fn restart(&self, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.spawn(id);
            match self.wait_healthy(id, deadline).await {
                Ok(()) => return,
                // The port can stay busy for a moment after a kill (or another process took
                // it in between): try again until the deadline.
                Err(_)
                    if Instant::now() < deadline
                        && self.log_since_last_start(id).contains("cannot listen")
                        && !self.is_running(id) =>
                {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => self.fail(&format!("restarting node {id}: {e}")),
            }
        }
    }
}
