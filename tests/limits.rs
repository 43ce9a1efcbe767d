//! Load limits against a real node: a flood of long-polls or of large request bodies beyond
//! the node's limits gets 429 `overloaded` with `Retry-After`, the node's memory stays bounded,
//! and it keeps serving.

mod common;

use std::time::Duration;

use common::Cluster;
use raftq_client::api::ReadResponse;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Long-polls allowed to wait at once on the test node.
const LONG_POLLS: usize = 4;
/// Largest request body, and the body bytes the node may hold at once (four such bodies).
const MAX_BODY: usize = 8 << 20;
const BODIES_IN_FLIGHT: usize = 4 * MAX_BODY;

/// One node with the small limits above, and an empty topic `t`.
async fn start_node_with_topic() -> Cluster {
    let limit = |n: usize| n.to_string();
    let (polls, body, bodies) = (limit(LONG_POLLS), limit(MAX_BODY), limit(BODIES_IN_FLIGHT));
    let args = [
        "--max-long-polls",
        polls.as_str(),
        "--max-body-bytes",
        body.as_str(),
        "--max-body-bytes-in-flight",
        bodies.as_str(),
    ];
    let c = Cluster::start_with(1, &args).await;
    c.create_topic("t").await;
    c
}

/// Peak resident memory of a process, from `/proc/PID/status`.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc status");
    kib / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_beyond_the_limit_get_429_and_the_waiting_ones_are_answered() {
    let c = start_node_with_topic().await;
    c.put_json("/v1/topics/t/subscriptions/s", &json!({})).await;
    let base = c.url(1);

    // Three times as many long-polls as may wait, half reads, half pulls, on an empty topic.
    let mut tasks = Vec::new();
    for i in 0..3 * LONG_POLLS {
        let http = c.http().clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            let req = if i % 2 == 0 {
                http.get(format!(
                    "{base}/v1/topics/t/records?from=first&wait_ms=20000"
                ))
            } else {
                // One record each, so every waiting pull gets one of those published.
                http.post(format!("{base}/v1/topics/t/subscriptions/s/pull"))
                    .json(&json!({"max": 1, "wait_ms": 20000}))
            };
            let started = std::time::Instant::now();
            let resp = req.send().await.expect("long-poll request");
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key("retry-after");
            let mut body: serde_json::Value = resp.json().await.unwrap_or_default();
            body["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
            (i, status, retry_after, body)
        }));
    }
    // Those beyond the limit are answered at once; the others wait for a record.
    let mut refused = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while refused < 2 * LONG_POLLS {
        let done: Vec<usize> = (0..tasks.len())
            .filter(|&i| tasks[i].is_finished())
            .collect();
        refused = done.len();
        if tokio::time::Instant::now() > deadline {
            c.fail(&format!(
                "only {refused} long-polls were answered before any record"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wake: Vec<String> = (0..LONG_POLLS).map(|i| format!("wake-{i}")).collect();
    c.publish_values("t", &wake).await;
    let (mut overloaded, mut answered) = (0, 0);
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("long-poll task"));
    }
    for (i, status, retry_after, body) in results {
        match status {
            429 => {
                assert_eq!(body["code"], "overloaded", "long-poll {i}: {body}");
                assert!(retry_after, "long-poll {i}: 429 without Retry-After");
                overloaded += 1;
            }
            200 => {
                let got = body["records"]
                    .as_array()
                    .or(body["messages"].as_array())
                    .map_or(0, Vec::len);
                assert!(
                    got >= 1,
                    "long-poll {i} should have been answered by the records: {body}"
                );
                answered += 1;
            }
            other => c.fail(&format!("long-poll {i}: unexpected status {other}: {body}")),
        }
    }
    assert_eq!(
        (overloaded, answered),
        (2 * LONG_POLLS, LONG_POLLS),
        "exactly the long-polls beyond the limit are refused"
    );
    // The slots are free again: a new long-poll waits and is answered at its deadline.
    let page: ReadResponse = c
        .get_json(1, "/v1/topics/t/records?from=next&wait_ms=50")
        .await;
    assert!(page.records.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_large_bodies_gets_429_and_memory_stays_bounded() {
    let c = start_node_with_topic().await;
    let addr = c.url(1).trim_start_matches("http://").to_string();
    let pid = c.pid(1);
    let before = peak_rss_mib(pid);

    // 64 publishes each announcing a body of (almost) the largest size. Without a limit the
    // node would read them all: 512 MB at once.
    const FLOOD: usize = 64;
    let body_len = MAX_BODY - 4096;
    let head = format!(
        "POST /v1/topics/t/records HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {body_len}\r\n\r\n"
    );
    let mut conns = Vec::new();
    for _ in 0..FLOOD {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(head.as_bytes())
            .await
            .expect("send the request head");
        conns.push(s);
    }
    // A refused request is answered at once, before its body is read; an admitted one waits
    // for its body, so it says nothing.
    let waits: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let got = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
                (s, got.map(|r| r.map(|n| buf[..n].to_vec())))
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for wait in waits {
        let (s, got) = wait.await.expect("a waiting task");
        match got {
            Err(_) => admitted.push(s),
            Ok(Ok(buf)) => {
                let n = buf.len();
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                assert!(
                    text.starts_with("HTTP/1.1 429"),
                    "expected 429, got {text:?}"
                );
                assert!(text.to_ascii_lowercase().contains("retry-after:"), "{text}");
                assert!(text.contains("\"overloaded\""), "{text}");
                refused += 1;
            }
            Ok(Err(e)) => c.fail(&format!("reading an answer: {e}")),
        }
    }
    let fits = BODIES_IN_FLIGHT / body_len;
    assert_eq!(
        (admitted.len(), refused),
        (fits, FLOOD - fits),
        "the node admits exactly the bodies its budget holds"
    );
    // The admitted ones send their bodies (not JSON, so each is read whole, then refused),
    // all but the last byte first: the node holds every admitted body at once, as it would
    // hold every body of the flood were there no limit (measured: over 500 MiB more).
    let body = vec![b'x'; body_len - 1];
    for s in &mut admitted {
        s.write_all(&body).await.expect("send a body");
    }
    for s in &mut admitted {
        s.write_all(b"x")
            .await
            .expect("send the last byte of a body");
    }
    for mut s in admitted {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
            .await
            .expect("an answer to an admitted body")
            .expect("read the answer");
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(
            text.starts_with("HTTP/1.1 400"),
            "expected 400, got {text:?}"
        );
    }
    let after = peak_rss_mib(pid);
    assert!(
        after < before + 200,
        "peak RSS grew from {before} MiB to {after} MiB under a flood the limits should bound"
    );
    // And the node serves as before.
    let ack = c.publish_values("t", &["after the flood".into()]).await;
    assert_eq!(ack.first_offset, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_limit_get_429_and_a_refused_publish_changes_nothing() {
    const IN_FLIGHT: usize = 3;
    let c = Cluster::start_with(1, &["--max-requests-in-flight", &IN_FLIGHT.to_string()]).await;
    c.create_topic("t").await;
    let base = c.url(1);

    // Long-poll reads of the empty topic hold every request slot, long enough that the checks
    // below run while they wait even on a loaded machine (with 4 s the test failed once under
    // load).
    let polls: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let http = c.http().clone();
            let url = format!("{base}/v1/topics/t/records?from=first&wait_ms=15000");
            tokio::spawn(async move {
                let resp = http.get(url).send().await.expect("long-poll");
                let status = resp.status().as_u16();
                let body: ReadResponse = resp.json().await.expect("a read answer");
                (status, body.records.len())
            })
        })
        .collect();
    // Once they all wait, any further /v1 request is refused: wait for the first refusal.
    c.wait_for(
        "every request slot held",
        Duration::from_secs(10),
        || async {
            match c.http().get(format!("{base}/v1/cluster")).send().await {
                Ok(r) if r.status().as_u16() == 429 => Ok(()),
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;

    // A valid publish now is refused before anything happens, and says when to come back.
    let resp = c
        .http()
        .post(format!("{base}/v1/topics/t/records"))
        .json(&json!({"records": [{"value": "refused"}]}))
        .send()
        .await
        .expect("publish");
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    let problem: serde_json::Value = resp.json().await.expect("a problem body");
    assert_eq!(problem["code"], "overloaded", "{problem}");
    // Probes are not /v1 requests and stay open.
    let health = c
        .http()
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status().as_u16(), 200);

    // The long-polls end empty-handed: the refused publish never reached the topic.
    for poll in polls {
        let (status, records) = poll.await.expect("a long-poll task");
        assert_eq!((status, records), (200, 0), "a long-poll saw a record");
    }
    assert!(c.read_all(1, "t").await.is_empty());
    let ack = c.publish_values("t", &["accepted".into()]).await;
    assert_eq!(ack.first_offset, 0, "the refused publish took an offset");
}

/// Soft and hard limits on open files of process `pid`, from `/proc/PID/limits`.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    (fields[0].to_string(), fields[1].to_string())
}

/// Every segment of the Raft log keeps its file open. A node started with a soft limit on open
/// files below what its log needs raises it to its hard limit and keeps serving: here a soft
/// limit of 64, and a log of 64 KiB segments grown to more than 150 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_raises_its_open_files_limit_to_keep_a_log_of_many_segments() {
    let c = Cluster::start_with(1, &["--segment-bytes", "65536"]).await;
    c.create_topic("t").await;
    c.kill(1);
    c.set_open_files_limit(1, 64);
    c.restart(1).await;
    let (soft, hard) = open_files_limits(c.pid(1));
    assert_eq!(
        soft, hard,
        "the node runs with the soft limit it was started with"
    );
    let client = c.client();
    for batch in 0..160 {
        let records = (0..8)
            .map(|i| {
                raftq_client::api::RecordIn::text(format!("{batch}-{i}-{}", "v".repeat(8_000)))
            })
            .collect();
        if let Err(e) = client.publish_records("t", records).await {
            c.fail(&format!("publishing batch {batch}: {e}"));
        }
    }
    let segments = c.log_files(1, ".seg");
    assert!(segments > 150, "the log has {segments} segments");
    // What an operator watches: the files open, every segment's among them, against the
    // limit the node raised.
    let metrics = c
        .http()
        .get(format!("{}/metrics", c.url(1)))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the metrics");
    let gauge = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    let (open, max) = (gauge("process_open_fds"), gauge("process_max_fds"));
    assert!(
        open as usize > segments && open < max,
        "{open} files open of at most {max}, for {segments} segments"
    );
    assert_eq!(max.to_string(), hard, "the limit the node runs with");
    assert_eq!(c.read_all(1, "t").await.len(), 160 * 8);
}
