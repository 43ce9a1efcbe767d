//! Graceful shutdown (SIGTERM): the node answers what is open, refuses what is new, exits 0
//! within its bound, and nothing acknowledged is lost; clients carry on with the new leader.

mod common;

use std::time::{Duration, Instant};

use common::{wait_acks, Cluster, Load};
use raftq_client::api::ReadResponse;
use reqwest::StatusCode;
use serde_json::json;

/// The server's shutdown bound is 15 s; allow scheduling slack on a loaded machine.
const EXIT_BOUND: Duration = Duration::from_secs(20);

/// A read of `topic` from the first record and a publish of `late` to it, both on `url`: the
/// requests a node must refuse once its shutdown began.
fn late_read_and_publish(
    http: &reqwest::Client,
    url: &str,
    topic: &str,
    late: &str,
) -> Vec<(&'static str, reqwest::RequestBuilder)> {
    vec![
        (
            "read",
            http.get(format!("{url}/v1/topics/{topic}/records?from=first")),
        ),
        (
            "publish",
            http.post(format!("{url}/v1/topics/{topic}/records"))
                .json(&json!({"records": [{"value": late}]})),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_sigterm_under_load_exits_zero_and_loses_nothing() {
    let started = Instant::now();
    let topic = "drain";
    let (c, client) = Cluster::start_with_client(topic).await;
    let old = c.leader_id().await;

    // A long-poll on the leader that no publish can answer (far beyond the end): only the
    // shutdown can. It is opened well before the SIGTERM.
    let poll = c
        .http()
        .get(format!(
            "{}/v1/topics/{topic}/records?from=1000000000&wait_ms=30000",
            c.url(old)
        ))
        .send();
    let poll = tokio::spawn(async move {
        let answer = poll.await;
        (answer, Instant::now())
    });

    let load = Load::start(&client, topic, 3, 1_000_000);
    wait_acks(&c, &load, 150, Duration::from_secs(30)).await;
    assert!(
        !poll.is_finished(),
        "the long-poll answered before the shutdown: {poll:?}"
    );

    let acked_at_term = load.acked();
    let term_sent = Instant::now();
    c.signal(old, libc::SIGTERM);
    let exit = c.wait_exit(old, EXIT_BOUND).await;
    let exited_after = term_sent.elapsed();
    assert!(
        exit.success(),
        "the leader must exit 0 after SIGTERM, got {exit} after {exited_after:?}\n{}",
        c.report("")
    );

    let (answer, answered_at) = poll.await.expect("long-poll task");
    let resp = answer.unwrap_or_else(|e| {
        c.fail(&format!(
            "the open long-poll on the leader was not answered before it exited: {e:?}"
        ))
    });
    let page: ReadResponse = c.json_of(resp, 200, "open long-poll during shutdown").await;
    assert!(page.records.is_empty(), "{page:?}");
    let poll_after = answered_at.saturating_duration_since(term_sent);
    assert!(
        poll_after < Duration::from_secs(15),
        "the open long-poll was answered {poll_after:?} after SIGTERM, not at shutdown"
    );

    // Clients carry on: a new leader, and publishing resumes through the same SDK client.
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old);
    // The old leader handed over: it asked one of its followers to take over.
    let log_old = c.log_since_last_start(old);
    assert!(
        c.ids()
            .into_iter()
            .filter(|id| *id != old)
            .any(|id| log_old.contains(&format!("asked node {id} to take over leadership"))),
        "the leader did not hand over to a follower on SIGTERM:\n{}",
        common::tail(&log_old, 20)
    );
    wait_acks(&c, &load, acked_at_term + 150, Duration::from_secs(30)).await;
    load.stop();
    let histories = load.finish(&c, Duration::from_secs(40)).await;

    // Every acknowledged record on the two remaining nodes...
    let log = c.consistent_log(topic).await;
    let summary = c.check_history(&log, &histories, &[]);
    // ...and on the old leader once it is back.
    c.restart(old).await;
    c.wait_leader(Duration::from_secs(20)).await;
    let log_after = c.consistent_log(topic).await;
    assert_eq!(log_after, log, "the restarted old leader changed the log");
    c.check_history(&log_after, &histories, &[]);
    eprintln!(
        "leader {old} exited 0 {exited_after:?} after SIGTERM (long-poll answered after \
         {poll_after:?}); new leader {new}; {summary}; test took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_open_long_polls_and_refuses_new_requests() {
    let topic = "lp-shut";
    let c = Cluster::start_with_values(topic, &["s/0".to_string(), "s/1".to_string()]).await;
    let leader = c.leader_id().await;
    let node = c.follower_id().await;
    let url = c.url(node);

    let poll = c
        .http()
        .get(format!(
            "{url}/v1/topics/{topic}/records?from=2&wait_ms=25000"
        ))
        .send();
    let poll = tokio::spawn(async move {
        let answer = poll.await;
        (answer, Instant::now())
    });
    // The long-poll must be open on the node before the signal. There is nothing to observe
    // it by, so give it a generous moment; if it arrived too late the answer below is a 503
    // shutting_down, and the assertion says so.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !poll.is_finished(),
        "the long-poll answered before the shutdown: {poll:?}"
    );

    let term_sent = Instant::now();
    c.signal(node, libc::SIGTERM);
    let (answer, answered_at) = poll.await.expect("long-poll task");
    let resp = answer.unwrap_or_else(|e| {
        c.fail(&format!(
            "the open long-poll on node {node} was not answered: {e:?}"
        ))
    });
    let page: ReadResponse = c
        .json_of(resp, 200, "an open long-poll when its node shuts down")
        .await;
    assert!(page.records.is_empty(), "{page:?}");
    assert_eq!((page.next_offset, page.high_watermark), (2, 2), "{page:?}");
    let poll_after = answered_at.saturating_duration_since(term_sent);
    assert!(
        poll_after < Duration::from_secs(10),
        "the open long-poll was answered {poll_after:?} after SIGTERM (its wait was 25 s)"
    );

    // The long-poll's answer proves the shutdown began: from now on every new request is
    // refused with 503 shutting_down (naming the leader), or not served at all: the
    // connection is refused, or (when it lands just as the listener closes, a race no TCP
    // server can avoid) closed without an answer. Never served, never a hang.
    let http = c.http();
    let mut requests = late_read_and_publish(http, &url, topic, "late");
    requests.push(("cluster status", http.get(format!("{url}/v1/cluster"))));
    requests.push(("topic list", http.get(format!("{url}/v1/topics"))));
    let (mut refused_by_503, mut not_connected, mut dropped) = (0, 0, Vec::new());
    for (what, request) in requests {
        match request.send().await {
            Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => {
                let (problem, _) = c
                    .expect_problem(
                        resp,
                        503,
                        "shutting_down",
                        &format!("{what} while shutting down"),
                    )
                    .await;
                assert_eq!(problem.leader_id, Some(leader), "{what}: {problem:?}");
                assert_eq!(
                    problem.leader_url.as_deref(),
                    Some(c.url(leader).as_str()),
                    "{what}: {problem:?}"
                );
                refused_by_503 += 1;
            }
            Ok(resp) => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                c.fail(&format!(
                    "{what} sent to node {node} after its shutdown began: expected 503 \
                     shutting_down or a refused connection, got {status}: {body}"
                ));
            }
            Err(e) if e.is_connect() => not_connected += 1,
            Err(e) if !e.is_timeout() => dropped.push(format!("{what}: {e:?}")),
            Err(e) => c.fail(&format!(
                "{what} sent to node {node} after its shutdown began: expected 503 \
                 shutting_down or a refused connection, got {e:?}"
            )),
        }
    }

    let exit = c.wait_exit(node, EXIT_BOUND).await;
    let exited_after = term_sent.elapsed();
    assert!(
        exit.success(),
        "node {node} must exit 0 after SIGTERM, got {exit}"
    );

    // The rest of the cluster is unaffected, and the node comes back with its data.
    c.publish_values(topic, &["s/2".to_string()]).await;
    c.restart(node).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<Option<&str>> = log.iter().map(|r| r.value_str()).collect();
    assert_eq!(
        got,
        vec![Some("s/0"), Some("s/1"), Some("s/2")],
        "the late publish must not be in"
    );
    eprintln!(
        "follower {node}: long-poll answered {poll_after:?} after SIGTERM; of 4 new requests \
         {refused_by_503} got 503 shutting_down, {not_connected} a refused connection, {} a \
         connection closed without answer {dropped:?}; exit 0 after {exited_after:?}",
        dropped.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_an_uncommittable_write_is_slower_but_bounded() {
    let topic = "stuck";
    let c = Cluster::start_with_values(topic, &["k/0".to_string()]).await;
    let (leader, _) = c.isolate_leader().await;
    let url = c.url(leader);

    // A write the isolated leader can append but never commit, and a long-poll; both open
    // when the SIGTERM arrives.
    let write = c
        .http()
        .post(format!("{url}/v1/topics/{topic}/records"))
        .json(&json!({"records": [{"value": "k/stuck"}]}))
        .send();
    let write = tokio::spawn(async move {
        match write.await {
            Ok(resp) => {
                let status = resp.status();
                Ok((status, resp.text().await.unwrap_or_default()))
            }
            Err(e) => Err(format!("{e:?}")),
        }
    });
    let poll = c
        .http()
        .get(format!(
            "{url}/v1/topics/{topic}/records?from=1&wait_ms=30000"
        ))
        .send();
    let poll = tokio::spawn(async move { (poll.await, Instant::now()) });
    let cl = &c;
    let write_ref = &write;
    c.wait_for(
        "the write to be appended on the isolated leader",
        Duration::from_secs(10),
        move || async move {
            if write_ref.is_finished() {
                return Err("the write was answered before the shutdown".to_string());
            }
            cl.appended_beyond_commit(leader).await
        },
    )
    .await;
    assert!(
        !poll.is_finished(),
        "the long-poll answered before the shutdown: {poll:?}"
    );

    let term_sent = Instant::now();
    c.signal(leader, libc::SIGTERM);
    let (answer, answered_at) = poll.await.expect("long-poll task");
    let resp =
        answer.unwrap_or_else(|e| c.fail(&format!("the open long-poll was not answered: {e:?}")));
    let page: ReadResponse = c.json_of(resp, 200, "an open long-poll at shutdown").await;
    assert!(
        page.records.is_empty(),
        "nothing committed after offset 0: {page:?}"
    );
    let poll_after = answered_at.saturating_duration_since(term_sent);
    assert!(
        poll_after < Duration::from_secs(5),
        "long-poll answered {poll_after:?} after SIGTERM"
    );

    // Shutdown began (the long-poll says so): new requests are refused, not served.
    let http = c.http();
    let mut refused_by_503 = 0;
    let mut requests = late_read_and_publish(http, &url, topic, "k/late");
    requests.push((
        "topic create",
        http.put(format!("{url}/v1/topics/late")).json(&json!({})),
    ));
    for (what, request) in requests {
        let answer = request.send().await;
        // While the node still owes the pending write its answer, its HTTP server is up: a
        // new request must get a 503, not a refused or dropped connection.
        let draining = !write.is_finished();
        match answer {
            Ok(resp) => {
                let what = format!("{what} on the leader while it shuts down");
                let (problem, headers) = c.expect_problem(resp, 503, "shutting_down", &what).await;
                assert_ne!(
                    problem.leader_id,
                    Some(leader),
                    "{what}: names itself as leader: {problem:?}"
                );
                assert!(
                    headers.get(reqwest::header::RETRY_AFTER).is_some(),
                    "{what}: no Retry-After"
                );
                refused_by_503 += 1;
            }
            Err(e) if !draining && !e.is_timeout() => {}
            Err(e) => c.fail(&format!(
                "{what} after the shutdown began (pending write still unanswered: {draining}): \
                 expected 503 shutting_down, got {e:?}"
            )),
        }
    }

    // Bounded: exit 0 within the shutdown bound even though the write cannot commit; the
    // write is answered, and never with success.
    let exit = c.wait_exit(leader, EXIT_BOUND).await;
    let exited_after = term_sent.elapsed();
    assert!(
        exit.success(),
        "the leader must exit 0 after SIGTERM, got {exit}"
    );
    let write_answer = write.await.expect("write task");
    if let Ok((status, body)) = &write_answer {
        assert!(
            !status.is_success(),
            "a write that could not reach a majority was acknowledged: {status} {body}"
        );
    }
    eprintln!(
        "isolated leader {leader}: long-poll answered {poll_after:?} after SIGTERM; {refused_by_503} \
         of 3 new requests got 503 shutting_down; pending write answered {write_answer:?}; exit 0 \
         after {exited_after:?}"
    );

    // Everyone back: the acknowledged record is there, the unacknowledged one at most once,
    // the refused ones never.
    for id in c.ids() {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<&str> = log.iter().filter_map(|r| r.value_str()).collect();
    assert_eq!(got.first(), Some(&"k/0"), "{got:?}");
    assert!(
        got.iter().filter(|v| **v == "k/stuck").count() <= 1,
        "{got:?}"
    );
    assert!(
        !got.contains(&"k/late"),
        "a publish refused during shutdown is in the log: {got:?}"
    );
    assert!(
        c.topic(c.leader_id().await, "late").await.is_err(),
        "a topic PUT refused during shutdown was applied"
    );
}
