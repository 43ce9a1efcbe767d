//! The data directory guards: a node refuses to start on a directory that is not its own.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{self, free_port, Cluster};

/// Runs `cmd` (expected to refuse to start) and returns its exit status, how long it ran and
/// what it printed. Kills it after 10 s.
async fn run_refused(
    c: &Cluster,
    mut cmd: std::process::Command,
    what: &str,
) -> (std::process::ExitStatus, Duration, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| c.fail(&format!("{what}: cannot spawn: {e}")));
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("collect output");
                c.fail(&format!(
                    "{what}: still running after 10 s (it must refuse to start); output:\n{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
    }
    let elapsed = started.elapsed();
    let output = child.wait_with_output().expect("collect output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, elapsed, text)
}

/// Runs `cmd` and checks that it refuses to start: it exits unsuccessfully, its output says
/// `says`, and it took less than `within` (when given).
async fn expect_refusal(
    c: &Cluster,
    cmd: std::process::Command,
    what: &str,
    says: &str,
    within: Option<Duration>,
) {
    let (status, elapsed, output) = run_refused(c, cmd, what).await;
    assert!(!status.success(), "{what}: exited with {status}: {output}");
    if let Some(within) = within {
        assert!(
            elapsed < within,
            "{what}: it took {elapsed:?} to refuse: {output}"
        );
    }
    assert!(
        output.contains(says),
        "{what}: the refusal should say {says:?}: {output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_directory_guards_refuse_to_start() {
    let c = Cluster::start(3).await;
    c.create_topic("dd").await;
    c.publish_values("dd", &["dd/0".to_string()]).await;

    // A second process on a running node's data directory.
    let cmd = c.serve_command(1, free_port(), &c.data_dir(1), common::CLUSTER_ID);
    expect_refusal(
        &c,
        cmd,
        "a second process on node 1's data directory",
        "already in use",
        Some(Duration::from_secs(5)),
    )
    .await;
    c.wait_leader(Duration::from_secs(10)).await;
    assert!(c.is_running(1), "node 1 must keep running");

    // Another node id, or another cluster id, on a stopped node's data directory.
    let exit = c.terminate(2).await;
    assert!(
        exit.success(),
        "node 2 should stop cleanly on SIGTERM: {exit}"
    );
    let cmd = c.serve_command(3, free_port(), &c.data_dir(2), common::CLUSTER_ID);
    expect_refusal(
        &c,
        cmd,
        "node id 3 on node 2's data directory",
        "belongs to node",
        Some(Duration::from_secs(5)),
    )
    .await;
    let cmd = c.serve_command(2, free_port(), &c.data_dir(2), "another-cluster");
    expect_refusal(
        &c,
        cmd,
        "another cluster id on node 2's data directory",
        "belongs to node",
        None,
    )
    .await;

    // The refused starts left the directory intact: node 2 comes back with its data.
    c.restart(2).await;
    c.wait_leader(Duration::from_secs(20)).await;
    c.publish_values("dd", &["dd/1".to_string()]).await;
    let log = c.consistent_log("dd").await;
    let got: Vec<Option<&str>> = log.iter().map(|r| r.value_str()).collect();
    assert_eq!(got, vec![Some("dd/0"), Some("dd/1")]);
}
