//! `scripts/cluster.sh` as the README and outside tests use it: `up` starts three nodes with
//! the API behind a generated token and prints it; requests without the token are refused and
//! with it served; a node SIGKILLed and started again from its recorded command line rejoins
//! and serves; `wipe` stops everything and deletes the data directory.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::BIN;
use raftq_client::api::{ClusterStatus, ReadResponse};
use reqwest::header::AUTHORIZATION;
use serde_json::json;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh");

/// A base port whose next three ports are free now.
fn free_base_port() -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (rand::random::<u16>() % 40_000);
        if (1..=3).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no three consecutive free ports found");
}

/// Runs the script with this test's data directory, ports and binary.
fn script(dir: &Path, base: u16, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(SCRIPT)
        .args(args)
        .env("RAFTQ_DATA_DIR", dir)
        .env("RAFTQ_BASE_PORT", base.to_string())
        .env("RAFTQ_BIN", BIN)
        .env_remove("RAFTQ_TOKEN")
        .output()
        .expect("run scripts/cluster.sh")
}

/// Wipes the cluster however the test ends, so no node outlives it.
struct Wipe(PathBuf, u16);

impl Drop for Wipe {
    fn drop(&mut self) {
        let _ = script(&self.0, self.1, &["wipe"]);
    }
}

async fn status(http: &reqwest::Client, url: &str, token: &str) -> Option<ClusterStatus> {
    let resp = http
        .get(format!("{url}/v1/cluster"))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .send()
        .await
        .ok()?;
    resp.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_script_runs_an_authenticated_cluster_that_survives_a_killed_node() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join("data");
    let base = free_base_port();
    let _wipe = Wipe(dir.clone(), base);
    let url = |id: u16| format!("http://127.0.0.1:{}", base + id);

    let up = script(&dir, base, &["up"]);
    let stdout = String::from_utf8_lossy(&up.stdout).to_string();
    let stderr = String::from_utf8_lossy(&up.stderr).to_string();
    assert!(up.status.success(), "up failed:\n{stdout}\n{stderr}");
    let token = std::fs::read_to_string(dir.join("api.token"))
        .expect("up keeps the token in api.token")
        .trim()
        .to_string();
    assert!(
        token.starts_with("rq_") && token.len() > 40,
        "token {token:?}"
    );
    assert!(
        stdout.contains(&token) || stderr.contains(&token),
        "up must print the token"
    );
    let tokens_file = std::fs::read_to_string(dir.join("tokens.toml")).expect("tokens.toml");
    assert!(
        !tokens_file.contains(&token),
        "the nodes' tokens file must hold only the token's hash"
    );

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client");
    for id in 1..=3 {
        let resp = http
            .get(format!("{}/v1/topics", url(id)))
            .send()
            .await
            .expect("a request without a token");
        assert_eq!(resp.status().as_u16(), 401, "node {id} without a token");
    }
    let leader = status(&http, &url(1), &token)
        .await
        .and_then(|s| s.leader_url)
        .expect("a leader after up");
    let auth = format!("Bearer {token}");
    let resp = http
        .put(format!("{leader}/v1/topics/demo"))
        .header(AUTHORIZATION, &auth)
        .json(&json!({}))
        .send()
        .await
        .expect("create a topic");
    assert_eq!(resp.status().as_u16(), 201);

    // Kill node 2 and start it again from its recorded command line, as outside tests do.
    let pid_file = dir.join("node2.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("node2.pid")
        .trim()
        .parse()
        .expect("a pid");
    // SAFETY: kill(2) on a pid this test's cluster started; no memory is involved.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGKILL) },
        0,
        "SIGKILL node 2"
    );
    let cmd = std::fs::read_to_string(dir.join("node2.cmd")).expect("node2.cmd");
    // The nodes share the machine: one runtime worker each, on the recorded command line too.
    assert!(cmd.contains("--worker-threads 1"), "{cmd}");
    let node_log = std::fs::read_to_string(dir.join("node2.log")).expect("node2.log");
    assert!(
        node_log.contains("raftq node started") && node_log.contains("workers=1"),
        "node 2 does not run one worker:\n{node_log}"
    );
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("node2.log"))
        .expect("node2.log");
    // Wait for the old process to be gone (its port and data lock with it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}/cmdline")).exists()
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
    {
        assert!(Instant::now() < deadline, "node 2 did not die");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut restarted = Command::new("setsid")
        .arg("bash")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}; exec {}",
            pid_file.display(),
            cmd.trim()
        ))
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .spawn()
        .expect("restart node 2");
    let resp = http
        .post(format!("{leader}/v1/topics/demo/records"))
        .header(AUTHORIZATION, &auth)
        .json(&json!({"records": [{"value": "after the restart"}]}))
        .send()
        .await
        .expect("publish");
    assert_eq!(resp.status().as_u16(), 200);
    // Node 2 rejoins and serves the record, with the token.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page: Option<ReadResponse> = match http
            .get(format!("{}/v1/topics/demo/records?from=first", url(2)))
            .header(AUTHORIZATION, &auth)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r.json().await.ok(),
            _ => None,
        };
        if page.is_some_and(|p| p.records.len() == 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 2 did not serve the record after its restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let wipe = script(&dir, base, &["wipe"]);
    assert!(
        wipe.status.success(),
        "wipe failed: {}",
        String::from_utf8_lossy(&wipe.stderr)
    );
    assert!(!dir.exists(), "wipe leaves no data directory");
    // `wipe` stopped the restarted node too (its pid was in node2.pid), gracefully.
    let exit = restarted.wait().expect("wait for the restarted node");
    assert!(
        exit.success(),
        "the restarted node exited with {exit} on SIGTERM"
    );
    for id in 1..=3 {
        assert!(
            TcpListener::bind(("127.0.0.1", base + id)).is_ok(),
            "a node still listens on port {} after wipe",
            base + id
        );
    }
}
