//! The producer against a real three-node cluster.
//!
//! - `raftq publish` with a spool, SIGKILLed four times at random moments and started again
//!   each time, ends with every line of its file in the topic exactly once, in file order, on
//!   every node.
//! - The SDK `Producer` without a spool rides out a SIGKILL of the leader: every record it
//!   reports committed is in the topic at the offset it reported, and nothing is duplicated.

mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, History, BIN};
use raftq_client::api::{CommitPoint, PublishResponse, RecordIn, TopicReport};
use raftq_client::{Producer, ProducerOptions, SendError};
use rand::Rng as _;

/// Lines in the file `raftq publish` reads.
const LINES: usize = 10_000;

/// A `raftq publish` run of `file` into `topic` with `spool`, its stderr in `log`.
fn spawn_publish(c: &Cluster, topic: &str, file: &Path, spool: &Path, log: &Path) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.arg("publish")
        .arg(topic)
        .arg("--file")
        .arg(file)
        .arg("--spool")
        .arg(spool)
        // Small batches and a small buffer: the file is read as it is published, so the kills
        // land while it is being read, and each restart skips the lines already accepted.
        .args([
            "--batch",
            "20",
            "--in-flight",
            "2",
            "--linger-ms",
            "1",
            "--buffer",
            "300",
        ])
        .arg("--url")
        .arg(c.urls().join(","));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RAFTQ_") {
            cmd.env_remove(name);
        }
    }
    let stderr = File::create(log).expect("create the publish log");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {BIN} publish: {e}"))
}

/// How many records `topic` holds, as any running node answers.
async fn records_in(c: &Cluster, topic: &str) -> u64 {
    for id in c.running_ids() {
        if let Ok(info) = c.topic(id, topic).await {
            return info.summary.next_offset;
        }
    }
    0
}

fn logs(paths: &[std::path::PathBuf]) -> String {
    paths
        .iter()
        .map(|path| {
            format!(
                "----- {} -----\n{}",
                path.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                std::fs::read_to_string(path).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_with_a_spool_killed_four_times_leaves_every_line_exactly_once() {
    let started = Instant::now();
    let c = Cluster::start(3).await;
    let topic = "lines";
    c.create_topic(topic).await;
    let work = c.root().join("publish");
    std::fs::create_dir_all(&work).expect("create the work directory");
    let file = work.join("lines.txt");
    let lines: Vec<String> = (0..LINES).map(|i| format!("line-{i:05}")).collect();
    std::fs::write(&file, lines.join("\n") + "\n").expect("write the input file");
    let spool = work.join("spool");

    let mut rng = rand::thread_rng();
    let mut run_logs = Vec::new();
    let mut killed_at = Vec::new();
    for run in 0..4 {
        // Kill somewhere in each fifth of the file, at a random record count and a random
        // moment after it.
        let mark = (run as u64 + 1) * 2_000 - 1_000 + rng.gen_range(0..1_000);
        let log = work.join(format!("run{run}.log"));
        let mut child = spawn_publish(&c, topic, &file, &spool, &log);
        run_logs.push(log);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                c.fail(&format!(
                    "run {run} ended ({status}) before it could be killed at {mark} records:\n{}",
                    logs(&run_logs)
                ));
            }
            let now = records_in(&c, topic).await;
            if now >= mark {
                break;
            }
            if Instant::now() > deadline {
                c.fail(&format!(
                    "run {run} did not reach {mark} records within 30 s (at {now}):\n{}",
                    logs(&run_logs)
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
        child.kill().expect("SIGKILL raftq publish");
        let _ = child.wait();
        killed_at.push(records_in(&c, topic).await);
    }

    let log = work.join("final.log");
    let mut child = spawn_publish(&c, topic, &file, &spool, &log);
    run_logs.push(log);
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            c.fail(&format!(
                "the last run did not finish within 40 s:\n{}",
                logs(&run_logs)
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if !status.success() {
        c.fail(&format!(
            "the last run failed ({status}):\n{}",
            logs(&run_logs)
        ));
    }

    // Every node serves the very same log: every line once, in file order.
    let log = c.consistent_log(topic).await;
    let values: Vec<&str> = log.iter().filter_map(|r| r.value_str()).collect();
    if values != lines.iter().map(String::as_str).collect::<Vec<_>>() {
        let mut seen = std::collections::HashMap::new();
        for value in &values {
            *seen.entry(*value).or_insert(0) += 1;
        }
        let duplicated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(10).collect();
        let missing: Vec<_> = lines
            .iter()
            .filter(|l| !seen.contains_key(l.as_str()))
            .take(10)
            .collect();
        c.fail(&format!(
            "the topic holds {} records, not the {LINES} lines once each in order; duplicated \
             (first 10): {duplicated:?}; missing (first 10): {missing:?}\n{}",
            values.len(),
            logs(&run_logs)
        ));
    }

    // `raftq report --json` counts them once too.
    let output = Command::new(BIN)
        .args(["report", topic, "--json", "--url"])
        .arg(c.urls().join(","))
        .output()
        .expect("run raftq report");
    assert!(
        output.status.success(),
        "raftq report failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: TopicReport =
        serde_json::from_slice(&output.stdout).expect("raftq report --json prints a report");
    assert_eq!(
        (report.published, report.records),
        (LINES as u64, LINES as u64)
    );
    let human = Command::new(BIN)
        .args(["report", topic, "--url"])
        .arg(c.urls().join(","))
        .output()
        .expect("run raftq report");
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human
            .lines()
            .any(|line| line.starts_with("lines") && line.contains("10000")),
        "{human}"
    );
    eprintln!(
        "raftq publish killed at {killed_at:?} records, then finished: {LINES} lines once each, \
         {} records of re-sent batches deduplicated; test took {:?}",
        report.deduplicated,
        started.elapsed()
    );
}

/// Waits (at most 40 s) until `producer` has `target` records committed.
async fn wait_committed(c: &Cluster, producer: &Producer, target: u64) {
    c.wait_for(
        &format!("{target} records committed"),
        Duration::from_secs(40),
        || {
            let committed = producer.stats().committed;
            async move {
                if committed >= target {
                    Ok(())
                } else {
                    Err(format!("{committed} committed"))
                }
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_without_a_spool_rides_out_a_leader_sigkill_without_duplicates() {
    const RECORDS: usize = 6_000;
    let started = Instant::now();
    let c = Cluster::start(3).await;
    let topic = "produced";
    c.create_topic(topic).await;
    let options = ProducerOptions::new()
        .max_batch_records(25)
        .max_in_flight(4);
    let producer = Producer::open(c.client(), topic, options)
        .await
        .unwrap_or_else(|e| c.fail(&format!("opening the producer: {e}")));

    // About 2,000 records a second, so that the failover happens mid-stream.
    let sender = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut deliveries = Vec::with_capacity(RECORDS);
            let mut ticker = tokio::time::interval(Duration::from_millis(5));
            for chunk in 0..RECORDS / 10 {
                ticker.tick().await;
                for i in chunk * 10..chunk * 10 + 10 {
                    let value = format!("p-{i:05}");
                    match producer.send(RecordIn::text(value.clone())).await {
                        Ok(delivery) => deliveries.push((value, delivery)),
                        Err(e) => return Err(format!("send of {value}: {e}")),
                    }
                }
            }
            Ok(deliveries)
        })
    };

    wait_committed(&c, &producer, 1_000).await;
    let old = c.leader_id().await;
    c.kill(old);
    let at_kill = producer.stats().committed;
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old, "the SIGKILLed node {old} cannot still lead");
    wait_committed(&c, &producer, at_kill + 1_000).await;
    assert!(
        !c.is_running(old),
        "node {old} must still be down while the new leader takes the batches"
    );
    c.restart(old).await;

    let deliveries = match tokio::time::timeout(Duration::from_secs(40), sender).await {
        Ok(Ok(Ok(deliveries))) => deliveries,
        Ok(Ok(Err(e))) => c.fail(&e),
        Ok(Err(e)) => c.fail(&format!("the sending task failed: {e}")),
        Err(_) => c.fail("the sending task did not finish within 40 s"),
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(40), producer.close())
        .await
        .unwrap_or_else(|_| c.fail("close did not finish within 40 s"))
    {
        c.fail(&format!("the producer stopped: {e}"));
    }

    let mut history = History::default();
    for (value, delivery) in deliveries {
        match delivery.await {
            Ok(offset) => history.acked.push((
                value,
                PublishResponse {
                    first_offset: offset,
                    last_offset: offset,
                    duplicate: false,
                    commit_point: CommitPoint::default(),
                },
            )),
            Err(e @ SendError::Indeterminate { .. }) => {
                history.indeterminate.push((value, e.to_string()))
            }
            Err(e @ (SendError::Refused(_) | SendError::NotSent { .. })) => {
                history.refused.push((value, e.to_string()))
            }
            Err(e @ SendError::OffsetUnknown) => history.odd.push((value, e.to_string())),
        }
    }
    let log = c.consistent_log(topic).await;
    // Present once at the reported offset, nothing duplicated or invented, offsets increasing
    // in send order.
    let summary = c.check_history(&log, std::slice::from_ref(&history), &[]);
    assert_eq!(
        history.acked.len(),
        RECORDS,
        "the producer retries until each batch's outcome is known: {summary}"
    );
    let stats = producer.stats();
    eprintln!(
        "leader {old} killed at {at_kill} committed records, node {new} took over; {summary}; \
         {} publish calls for {} batches, {} sequence gaps, {} records deduplicated; test took \
         {:?}",
        stats.publish_calls,
        stats.batches,
        stats.sequence_gaps,
        stats.duplicates,
        started.elapsed()
    );
}
