//! The administrative CLI against a real node: `raftq topic create|list|info|delete` and
//! `raftq sub create|list|info|delete` (tables and `--json`) and `raftq health`, with their
//! exit codes.

mod common;

use std::process::{Command, Output};

use common::{free_port, Cluster, BIN};
use serde_json::Value;

/// `raftq ARGS --url URL`, with no RAFTQ_* from the test's environment.
fn raftq(url: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--url").arg(url);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RAFTQ_") {
            cmd.env_remove(name);
        }
    }
    cmd.output().expect("run raftq")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_and_sub_commands_and_health_against_a_node() {
    let c = Cluster::start(1).await;
    let url = c.url(1);

    let created = json(&raftq(
        &url,
        &["topic", "create", "jobs", "--max-records", "100", "--json"],
    ));
    assert_eq!(created["name"], "jobs");
    assert_eq!(created["config"]["retention"]["max_records"], 100);
    // Again with the same settings: nothing changes, and it says so.
    let again = raftq(&url, &["topic", "create", "jobs", "--max-records", "100"]);
    assert!(again.status.success(), "{again:?}");
    assert!(text(&again.stdout).contains("already exists"), "{again:?}");
    // Other settings: a conflict, exit 1, the problem's title and detail on stderr.
    let conflict = raftq(&url, &["topic", "create", "jobs", "--max-records", "5"]);
    assert_eq!(conflict.status.code(), Some(1), "{conflict:?}");
    assert!(
        !text(&conflict.stderr).contains("Problem {"),
        "{conflict:?}"
    );

    c.publish_values("jobs", &["a".into(), "b".into()]).await;
    let list = json(&raftq(&url, &["topic", "list", "--json"]));
    assert_eq!(list["topics"][0]["name"], "jobs");
    assert_eq!(list["topics"][0]["records"], 2);
    let table = raftq(&url, &["topic", "list"]);
    let table = text(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("jobs ") && l.contains(" 2 ")),
        "{table}"
    );
    let info = json(&raftq(&url, &["topic", "info", "jobs", "--json"]));
    assert_eq!(
        (info["next_offset"].as_u64(), info["records"].as_u64()),
        (Some(2), Some(2))
    );

    // Subscriptions of the topic.
    let sub = json(&raftq(
        &url,
        &[
            "sub",
            "create",
            "jobs",
            "workers",
            "--start",
            "1",
            "--max-deliveries",
            "3",
            "--json",
        ],
    ));
    assert_eq!(
        (sub["name"].as_str(), sub["cursor"].as_u64()),
        (Some("workers"), Some(1))
    );
    assert_eq!(sub["config"]["max_deliveries"], 3);
    let bad_start = raftq(&url, &["sub", "create", "jobs", "w2", "--start", "soon"]);
    assert_eq!(bad_start.status.code(), Some(2), "{bad_start:?}");
    let subs = json(&raftq(&url, &["sub", "list", "jobs", "--json"]));
    assert_eq!(subs["subscriptions"].as_array().map(Vec::len), Some(1));
    let info = raftq(&url, &["sub", "info", "jobs", "workers"]);
    let info = text(&info.stdout);
    assert!(
        info.lines()
            .any(|l| l.starts_with("workers ") && l.contains(" 1 ")),
        "{info}"
    );
    assert!(raftq(&url, &["sub", "delete", "jobs", "workers"])
        .status
        .success());
    let gone = raftq(&url, &["sub", "info", "jobs", "workers"]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");

    let deleted = raftq(&url, &["topic", "delete", "jobs"]);
    assert!(deleted.status.success(), "{deleted:?}");
    let gone = raftq(&url, &["topic", "info", "jobs"]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    assert!(c.topics(1).await.topics.is_empty());
    let usage = raftq(&url, &["topic", "create"]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");

    // health: 0 when the node answers, 1 when nothing does.
    for args in [&["health"][..], &["health", "--ready"][..]] {
        let out = raftq(&url, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let dead = format!("http://127.0.0.1:{}", free_port());
    let out = raftq(&dead, &["health"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// `raftq ARGS --url URLS` with `stdin` as its standard input.
fn raftq_with_input(urls: &str, args: &[&str], stdin: &str) -> Output {
    use std::io::Write as _;
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--url").arg(urls);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RAFTQ_") {
            cmd.env_remove(name);
        }
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn raftq");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait for raftq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_from_stdin_consume_report_and_status_on_three_nodes() {
    let c = Cluster::start(3).await;
    let urls = c.urls().join(",");

    assert!(raftq(&urls, &["topic", "create", "orders"])
        .status
        .success());
    let published = raftq_with_input(&urls, &["publish", "orders"], "one\ntwo\nthree\n");
    assert!(published.status.success(), "{published:?}");
    assert!(
        text(&published.stderr).contains("3 records"),
        "{published:?}"
    );
    assert!(raftq(&urls, &["sub", "create", "orders", "workers"])
        .status
        .success());

    // consume prints each message as a JSON line and acks it.
    let consumed = raftq(
        &urls,
        &["consume", "orders", "-s", "workers", "--max", "3", "--json"],
    );
    assert!(consumed.status.success(), "{consumed:?}");
    let values: Vec<String> = text(&consumed.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            v["value"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(values, ["one", "two", "three"]);

    let report = json(&raftq(&urls, &["report", "orders", "--json"]));
    assert_eq!(report["published"], 3, "{report}");
    let workers = &report["subscriptions"]["workers"];
    assert_eq!(
        (workers["acked"].as_u64(), workers["backlog"].as_u64()),
        (Some(3), Some(0)),
        "{report}"
    );

    let status = json(&raftq(&urls, &["cluster", "status", "--json"]));
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
    assert_eq!(
        status["leader_id"].as_u64(),
        Some(c.leader_id().await),
        "{status}"
    );

    // A subscription that does not exist: exit 1, the problem on stderr.
    let missing = raftq(&urls, &["consume", "orders", "-s", "nobody", "--max", "1"]);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(text(&missing.stderr).contains("nobody"), "{missing:?}");
}
