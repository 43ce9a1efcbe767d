//! `raftq bench` against a real three-node cluster: every workload runs to completion, what it
//! reports matches what the cluster holds, and bad arguments are refused before anything runs.
//! (Speed itself is measured by `scripts/bench.sh`, not asserted here.)

mod common;

use std::process::{Command, Output};

use common::{Cluster, BIN};
use serde_json::Value;

fn bench(c: &Cluster, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("bench")
        .arg("--url")
        .arg(c.urls().join(","))
        .args(args)
        .output()
        .expect("run raftq bench")
}

fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn explain(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_completes_and_reports_what_the_cluster_holds() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let pid = c.pid(leader).to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.jsonl");
    let output = bench(
        &c,
        &[
            "--workloads",
            "p1,p2,p3,p4,disk",
            "--n",
            "300",
            "--lat-n",
            "20",
            "--inflight",
            "16",
            "--size",
            "512",
            "--disk-dir",
            dir.path().to_str().unwrap(),
            "--disk-secs",
            "1",
            "--watch-pid",
            &pid,
            "--json",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(output.status.success(), "{}", explain(&output));
    let results = lines(&output);
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["p1", "p2", "p3", "p4", "disk"],
        "{}",
        explain(&output)
    );
    let saved = std::fs::read_to_string(&out).expect("results file");
    assert_eq!(
        saved.lines().count(),
        5,
        "--out holds one line per workload"
    );

    for r in &results {
        assert_eq!(r["complete"], true, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        if r["workload"] != "disk" {
            assert_eq!(r["done"], r["n"], "{r}");
            assert!(r["msgs_per_s"].as_f64().unwrap() > 0.0, "{r}");
            let memory = r["memory"].as_array().expect("memory samples");
            assert_eq!(memory[0]["pid"].to_string(), pid, "{r}");
            assert!(memory[0]["rss_peak_mib"].as_f64().unwrap() > 1.0, "{r}");
        }
    }
    let (p1, p2, p3, p4, disk) = (
        &results[0],
        &results[1],
        &results[2],
        &results[3],
        &results[4],
    );
    assert_eq!(p1["n"], 300);
    assert_eq!(p3["n"], 20);
    for r in [p1, p3] {
        let l = &r["latency_ms"];
        let (p50, p99, p999) = (
            l["p50"].as_f64().unwrap(),
            l["p99"].as_f64().unwrap(),
            l["p999"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{r}");
        // Every record went through the SDK producer in idempotent batches.
        assert!(r["producer"]["batches"].as_u64().unwrap() >= 1, "{r}");
    }
    assert_eq!(p2["redelivered"], 0, "{p2}");
    assert_eq!(p4["per_reader_msgs_per_s"].as_array().unwrap().len(), 4);
    assert!(disk["disk"]["fsyncs_4k_per_s"].as_f64().unwrap() > 0.0);
    assert!(disk["disk"]["mib_per_s_1m"].as_f64().unwrap() > 0.0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "the disk probe removed its file (only the results file is left)"
    );

    // The workloads' topics are gone afterwards.
    let topics = c.topics(leader).await;
    assert!(
        topics.topics.is_empty(),
        "topics left behind: {:?}",
        topics.topics
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_p1_counts_is_what_the_topic_holds_in_both_publish_modes() {
    let c = Cluster::start(3).await;
    for mode in ["sdk", "single"] {
        let output = bench(
            &c,
            &[
                "--workloads",
                "p1",
                "--n",
                "250",
                "--inflight",
                "8",
                "--publish",
                mode,
                "--topic-prefix",
                mode,
                "--keep",
                "--json",
                "--quiet",
            ],
        );
        assert!(output.status.success(), "{}", explain(&output));
        let r = &lines(&output)[0];
        assert_eq!(r["done"], 250, "{r}");
        let topic = r["topic"].as_str().unwrap();
        assert!(topic.starts_with(mode), "{topic}");
        let leader = c.leader_id().await;
        let info = c.topic(leader, topic).await.expect("kept topic");
        assert_eq!(info.summary.records, 250, "{mode}: {info:?}");
        assert_eq!(info.summary.next_offset, 250, "{mode}: {info:?}");
    }
}

/// `--idle-leases N`: P2 leases N more records first and never acks them, so its acks run with
/// N leases in flight; what it counts is only what the consumers acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2_with_idle_leases_acks_the_rest_and_leaves_them_in_flight() {
    let c = Cluster::start(3).await;
    let output = bench(
        &c,
        &[
            "--workloads",
            "p2",
            "--n",
            "200",
            "--idle-leases",
            "1500",
            "--inflight",
            "64",
            "--keep",
            "--json",
            "--quiet",
        ],
    );
    assert!(output.status.success(), "{}", explain(&output));
    let r = &lines(&output)[0];
    assert_eq!(
        (r["done"].as_u64(), r["n"].as_u64()),
        (Some(200), Some(200)),
        "{r}"
    );
    assert_eq!(r["config"]["idle_leases"], 1500, "{r}");
    let topic = r["topic"].as_str().unwrap();
    let leader = c.leader_id().await;
    let sub: serde_json::Value = c
        .try_get_json(
            leader,
            &format!("/v1/topics/{topic}/subscriptions/bench"),
            std::time::Duration::from_secs(5),
        )
        .await
        .expect("the kept subscription");
    assert_eq!(sub["in_flight"], 1500, "{sub}");
    assert_eq!(sub["acked"], 200, "{sub}");
    assert_eq!(sub["cursor"], 0, "the idle leases hold the cursor: {sub}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_usage_errors_and_create_nothing() {
    let c = Cluster::start(1).await;
    for (args, says) in [
        (&["--n", "0"][..], "--n"),
        (&["--batch", "5000"][..], "--batch"),
        (&["--size", "0"][..], "--size"),
        (&["--topic-prefix", "no spaces"][..], "--topic-prefix"),
        (&["--repeat", "0"][..], "--repeat"),
        (&["--idle-leases", "1000001"][..], "--idle-leases"),
    ] {
        let output = bench(&c, args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            explain(&output)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let leader = c.leader_id().await;
    assert!(c.topics(leader).await.topics.is_empty());
}
