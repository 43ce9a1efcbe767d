//! The HTTP contract of API.md against a real three-node cluster: topics, publish and read,
//! leader redirects, long-polls, refusals of bad input, Raft endpoint authentication, cluster
//! status, and the data directory guards. One cluster per test.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{free_port, Cluster, SECRET, SECRET_HEADER};
use raftq_client::api::{PublishResponse, ReadResponse, TopicInfo, TopicList};
use raftq_client::Client;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const OCTET_STREAM: &str = "application/octet-stream";

fn records_of<S: AsRef<str>>(values: &[S]) -> Value {
    json!({ "records": values.iter().map(|v| json!({ "value": v.as_ref() })).collect::<Vec<_>>() })
}

fn values(page: &ReadResponse) -> Vec<String> {
    page.records
        .iter()
        .map(|r| {
            r.value
                .clone()
                .unwrap_or_else(|| format!("<binary {:?}>", r.value_b64))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_publish_and_read_round_trip() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    let http = c.http();
    let lurl = c.url(leader);

    // PUT: 201 created, 200 same configuration, 409 different configuration.
    let put = |name: &str, body: Option<Value>| {
        let req = http.put(format!("{lurl}/v1/topics/{name}"));
        match body {
            Some(body) => req.json(&body),
            None => req,
        }
    };
    let resp = c.send(put("orders", None), "PUT orders").await;
    assert_eq!(
        resp.status(),
        StatusCode::CREATED,
        "first PUT of a topic creates it"
    );
    let resp = c
        .send(put("orders", Some(json!({}))), "PUT orders again")
        .await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "PUT with the same configuration answers 200"
    );
    let resp = c
        .send(
            put("orders", Some(json!({"max_record_bytes": 2048}))),
            "PUT orders, other config",
        )
        .await;
    c.expect_problem(
        resp,
        409,
        "already_exists",
        "PUT orders with another configuration",
    )
    .await;
    let small = json!({"max_record_bytes": 64, "retention": {"max_records": 1000}});
    let resp = c.send(put("small", Some(small)), "PUT small").await;
    assert_eq!(resp.status(), StatusCode::CREATED);

    // GET one: config and commit point.
    let info: TopicInfo = c.get_json(leader, "/v1/topics/small").await;
    assert_eq!(info.summary.name, "small");
    assert_eq!(info.config.max_record_bytes, Some(64));
    assert_eq!(info.config.retention.max_records, Some(1000));
    assert_eq!(
        (info.summary.first_offset, info.summary.next_offset),
        (0, 0)
    );
    assert!(
        info.commit_point.index > 0,
        "commit_point.index of an applied topic: {info:?}"
    );

    // Publish JSON: text with key and headers, and binary.
    let body = json!({"records": [
        {"value": "hello", "key": "k1", "headers": {"h": "v"}},
        {"value_b64": base64::engine::general_purpose::STANDARD.encode([0xffu8, 0x00, 0x01])},
    ]});
    let resp = c
        .send(
            http.post(format!("{lurl}/v1/topics/orders/records"))
                .json(&body),
            "publish JSON",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "publish JSON").await;
    assert_eq!(
        (ack.first_offset, ack.last_offset, ack.duplicate),
        (0, 1, false),
        "{ack:?}"
    );
    assert!(ack.commit_point.index > info.commit_point.index, "{ack:?}");
    assert!(ack.commit_point.timestamp_ms > 0, "{ack:?}");

    // Publish raw bytes with a key.
    let resp = c
        .send(
            http.post(format!("{lurl}/v1/topics/orders/records?key=order%2017"))
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body("raw-bytes"),
            "publish raw",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "publish raw").await;
    assert_eq!((ack.first_offset, ack.last_offset), (2, 2), "{ack:?}");

    // The topic's own record size limit: 65 bytes of value on a 64-byte topic.
    let resp = c
        .send(
            http.post(format!("{lurl}/v1/topics/small/records"))
                .json(&records_of(&["x".repeat(65)])),
            "publish 65 bytes to small",
        )
        .await;
    c.expect_problem(
        resp,
        413,
        "payload_too_large",
        "a record over the topic's max_record_bytes",
    )
    .await;

    // Read from a follower once it has applied everything.
    c.wait_converged("orders").await;
    let page = c.read(follower, "orders", "from=first").await;
    assert_eq!(
        (page.next_offset, page.high_watermark, page.skipped),
        (3, 3, 0),
        "{page:?}"
    );
    let r = &page.records;
    assert_eq!(r.len(), 3, "{page:?}");
    assert_eq!(r[0].value.as_deref(), Some("hello"));
    assert_eq!(r[0].key.as_deref(), Some("k1"));
    assert_eq!(r[0].headers.get("h").map(String::as_str), Some("v"));
    assert_eq!(
        (r[1].value.as_deref(), r[1].value_b64.as_deref()),
        (None, Some("/wAB"))
    );
    assert_eq!(r[2].value.as_deref(), Some("raw-bytes"));
    assert_eq!(r[2].key.as_deref(), Some("order 17"));
    assert!(
        r.iter().all(|x| x.timestamp_ms > 0),
        "leader timestamps: {page:?}"
    );
    assert!(
        r.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms),
        "{page:?}"
    );
    assert_eq!(
        c.read(leader, "orders", "from=first").await.records,
        page.records,
        "leader and follower serve the same records"
    );

    // from=last, from=N with max, from beyond the end.
    let page = c.read(follower, "orders", "from=last").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2],
        "{page:?}"
    );
    let page = c.read(follower, "orders", "from=1&max=1").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![1],
        "{page:?}"
    );
    assert_eq!(page.next_offset, 2, "{page:?}");
    let page = c.read(follower, "orders", "from=7").await;
    assert!(page.records.is_empty(), "{page:?}");
    assert_eq!(page.high_watermark, 3, "{page:?}");

    // GET list on a follower.
    let list: TopicList = c.topics(follower).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["orders", "small"], "{list:?}");
    let orders = &list.topics[0];
    assert_eq!(
        (orders.first_offset, orders.next_offset, orders.records),
        (0, 3, 3),
        "{list:?}"
    );
    assert!(orders.bytes > 0, "{list:?}");

    // DELETE: 204, then 404 everywhere.
    let resp = c
        .send(
            http.delete(format!("{lurl}/v1/topics/small")),
            "DELETE small",
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let resp = c
        .send(http.get(format!("{lurl}/v1/topics/small")), "GET small")
        .await;
    c.expect_problem(resp, 404, "topic_not_found", "GET a deleted topic")
        .await;
    let resp = c
        .send(
            http.delete(format!("{lurl}/v1/topics/small")),
            "DELETE small again",
        )
        .await;
    c.expect_problem(resp, 404, "topic_not_found", "DELETE a deleted topic")
        .await;
    let follower_url = c.url(follower);
    c.wait_for(
        "the follower to drop the deleted topic",
        Duration::from_secs(10),
        || {
            let req = http.get(format!("{follower_url}/v1/topics/small")).send();
            async move {
                match req.await {
                    Ok(r) if r.status() == StatusCode::NOT_FOUND => Ok(()),
                    Ok(r) => Err(format!("follower answers {}", r.status())),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_follower_redirect_to_the_leader() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let followers = c.running_except(leader);
    let (f1, f2) = (followers[0], followers[1]);
    let (lurl, furl) = (c.url(leader), c.url(f1));
    let http = c.http();
    c.create_topic("redir").await;
    c.wait_converged("redir").await;

    // A publish on a follower: 307 to the same path and query on the leader.
    let path = "/v1/topics/redir/records?key=order%2017";
    let resp = c
        .send(
            http.post(format!("{furl}{path}"))
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body("via-location"),
            "publish on a follower",
        )
        .await;
    let location = resp
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (problem, _) = c
        .expect_problem(resp, 307, "not_leader", "publish on a follower")
        .await;
    assert_eq!(
        location.as_deref(),
        Some(format!("{lurl}{path}").as_str()),
        "Location header"
    );
    assert_eq!(problem.leader_id, Some(leader), "{problem:?}");
    assert_eq!(
        problem.leader_url.as_deref(),
        Some(lurl.as_str()),
        "{problem:?}"
    );
    let info = c
        .topic(leader, "redir")
        .await
        .unwrap_or_else(|e| c.fail(&e));
    assert_eq!(
        info.summary.next_offset, 0,
        "a redirected publish must not be applied"
    );

    // Re-sending the request to Location (curl -L style) succeeds.
    let location = location.expect("checked above");
    let resp = c
        .send(
            http.post(&location)
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body("via-location"),
            "publish re-sent to Location",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "publish re-sent to Location").await;
    assert_eq!(ack.first_offset, 0, "{ack:?}");

    // Topic creation and deletion on a follower redirect too, and are not applied.
    let resp = c
        .send(
            http.put(format!("{furl}/v1/topics/redir2"))
                .json(&json!({})),
            "PUT on a follower",
        )
        .await;
    let location = resp.headers().get(LOCATION).cloned();
    c.expect_problem(resp, 307, "not_leader", "PUT on a follower")
        .await;
    assert_eq!(
        location.as_ref().and_then(|v| v.to_str().ok()),
        Some(format!("{lurl}/v1/topics/redir2").as_str())
    );
    let resp = c
        .send(
            http.delete(format!("{furl}/v1/topics/redir")),
            "DELETE on a follower",
        )
        .await;
    let location = resp.headers().get(LOCATION).cloned();
    c.expect_problem(resp, 307, "not_leader", "DELETE on a follower")
        .await;
    assert_eq!(
        location.as_ref().and_then(|v| v.to_str().ok()),
        Some(format!("{lurl}/v1/topics/redir").as_str())
    );
    let list = c.topics(leader).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["redir"],
        "redirected PUT/DELETE must change nothing: {list:?}"
    );

    // A stock HTTP client that follows redirects (307 keeps method and body) just works.
    let following = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build a redirect-following client");
    let resp = c
        .send(
            following
                .post(format!("{furl}/v1/topics/redir/records"))
                .json(&records_of(&["via-reqwest"])),
            "publish on a follower with a redirect-following client",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "redirect-following client").await;
    assert_eq!(ack.first_offset, 1, "{ack:?}");

    // The SDK given only a follower, then a list that starts with followers.
    let only_follower = c.client_for(std::slice::from_ref(&furl));
    let ack = only_follower
        .publish_records(
            "redir",
            vec![raftq_client::api::RecordIn::text("via-sdk-follower")],
        )
        .await
        .unwrap_or_else(|e| c.fail(&format!("SDK pointed at follower {f1} only: {e}")));
    assert_eq!(ack.first_offset, 2, "{ack:?}");
    assert_eq!(
        only_follower
            .known_leader()
            .map(|u| u.trim_end_matches('/').to_string()),
        Some(lurl.clone()),
        "the SDK should remember the leader it was redirected to"
    );
    let followers_first: Client = c.client_for(&[c.url(f2), furl.clone(), lurl.clone()]);
    let ack = followers_first
        .publish_records(
            "redir",
            vec![raftq_client::api::RecordIn::text("via-sdk-list")],
        )
        .await
        .unwrap_or_else(|e| c.fail(&format!("SDK with followers first: {e}")));
    assert_eq!(ack.first_offset, 3, "{ack:?}");

    // Exactly one copy of each publish, in order, on every node.
    let log = c.consistent_log("redir").await;
    let got: Vec<(Option<&str>, Option<&str>)> = log
        .iter()
        .map(|r| (r.value.as_deref(), r.key.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("via-location"), Some("order 17")),
            (Some("via-reqwest"), None),
            (Some("via-sdk-follower"), None),
            (Some("via-sdk-list"), None),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_answers_on_commit_not_at_timeout() {
    let c = Cluster::start(3).await;
    let follower = c.follower_id().await;
    c.create_topic("lp").await;
    c.create_topic("lp-idle").await;
    let three: Vec<String> = (0..3).map(|i| format!("lp/{i}")).collect();
    c.publish_values("lp", &three).await;
    c.wait_converged("lp").await;
    c.wait_converged("lp-idle").await;
    let furl = c.url(follower);

    // Records already there: answered at once despite the wait.
    let t = Instant::now();
    let page = c.read(follower, "lp", "from=0&wait_ms=10000").await;
    assert_eq!(values(&page), three);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?} with records available",
        t.elapsed()
    );

    // Waiting at the high watermark on a follower; one publish to the leader answers it.
    let wait = Duration::from_millis(10_000);
    let poll = c
        .http()
        .get(format!(
            "{furl}/v1/topics/lp/records?from=3&wait_ms={}",
            wait.as_millis()
        ))
        .send();
    let t = Instant::now();
    let handle = tokio::spawn(async move {
        let resp = poll.await;
        (resp, Instant::now())
    });
    let ack = c.publish_values("lp", &["lp/arrives".to_string()]).await;
    let acked_at = Instant::now();
    assert_eq!(ack.first_offset, 3);
    let (resp, answered_at) = handle.await.expect("long-poll task");
    let resp = resp.unwrap_or_else(|e| c.fail(&format!("long-poll on follower {follower}: {e}")));
    let page: ReadResponse = c.json_of(resp, 200, "long-poll on a follower").await;
    let elapsed = answered_at - t;
    assert_eq!(values(&page), vec!["lp/arrives"], "{page:?}");
    assert_eq!(page.records[0].offset, 3);
    assert!(
        elapsed < Duration::from_secs(5),
        "the long-poll must answer when the record commits, not at the end of its {wait:?} \
         wait: answered after {elapsed:?}"
    );
    eprintln!(
        "long-poll answered {:?} after the publish was acknowledged ({elapsed:?} in all)",
        answered_at.saturating_duration_since(acked_at)
    );

    // from=next: only records published after the call. Publish until the poll answers.
    let poll = c
        .http()
        .get(format!(
            "{furl}/v1/topics/lp/records?from=next&wait_ms=10000"
        ))
        .send();
    let t = Instant::now();
    let handle = tokio::spawn(poll);
    let mut sent = Vec::new();
    while !handle.is_finished() {
        if t.elapsed() > Duration::from_secs(8) {
            c.fail("a from=next long-poll did not answer while records were being published");
        }
        let value = format!("lp/next/{}", sent.len());
        c.publish_values("lp", std::slice::from_ref(&value)).await;
        sent.push(value);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resp = handle
        .await
        .expect("long-poll task")
        .unwrap_or_else(|e| c.fail(&format!("from=next long-poll: {e}")));
    let page: ReadResponse = c.json_of(resp, 200, "from=next long-poll").await;
    let got = values(&page);
    assert!(!got.is_empty(), "from=next answered empty: {page:?}");
    assert!(
        got.iter().all(|v| sent.contains(v)),
        "from=next returned records published before the call: {got:?} (sent after: {sent:?})"
    );
    assert!(page.records[0].offset >= 4, "{page:?}");

    // No publish: an empty answer after about wait_ms, on a follower and on the leader.
    let leader = c.leader_id().await;
    for (id, query) in [
        (follower, "from=next&wait_ms=1500"),
        (leader, "from=0&wait_ms=1500"),
    ] {
        let t = Instant::now();
        let page = c.read(id, "lp-idle", query).await;
        let elapsed = t.elapsed();
        assert!(page.records.is_empty(), "{page:?}");
        assert_eq!((page.next_offset, page.high_watermark), (0, 0), "{page:?}");
        assert!(
            elapsed >= Duration::from_millis(1400) && elapsed < Duration::from_millis(4000),
            "an idle long-poll with wait_ms=1500 on node {id} answered after {elapsed:?}"
        );
    }
}

/// A leader that lost its followers keeps believing it leads (openraft does not step down on
/// its own). Once it has not heard from a quorum for an election timeout, it must refuse
/// writes at once with a definite 503 `no_leader` (not proposed, nothing changes) and report
/// itself not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_without_quorum_refuses_writes_and_is_not_ready() {
    let c = Cluster::start(3).await;
    let topic = "lonely";
    c.create_topic(topic).await;
    c.publish_values(topic, &["l/0".to_string()]).await;
    c.wait_converged(topic).await;
    let (leader, _) = c.isolate_leader().await;

    let cl = &c;
    c.wait_for(
        "the isolated leader to report itself not ready",
        Duration::from_secs(10),
        move || async move {
            let resp = cl
                .http()
                .get(format!("{}/readyz", cl.url(leader)))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            Cluster::check_problem(resp, 503, "no_leader")
                .await
                .map(|_| ())
        },
    )
    .await;

    let resp = c
        .send(
            c.http()
                .post(format!("{}/v1/topics/{topic}/records", c.url(leader)))
                .json(&records_of(&["l/refused"])),
            "publish to a leader without quorum",
        )
        .await;
    let (_, headers) = c
        .expect_problem(resp, 503, "no_leader", "publish to a leader without quorum")
        .await;
    assert!(
        headers.get(RETRY_AFTER).is_some(),
        "no_leader carries Retry-After"
    );
    let info = c.topic(leader, topic).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(
        info.summary.next_offset, 1,
        "a refused write changed the topic: {info:?}"
    );

    // Once the followers are back the write goes through, and the refused value never appears.
    for id in c.ids().into_iter().filter(|id| *id != leader) {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(20)).await;
    c.publish_values(topic, &["l/1".to_string()]).await;
    c.wait_converged(topic).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<Option<&str>> = log.iter().map(|r| r.value.as_deref()).collect();
    assert_eq!(got, vec![Some("l/0"), Some("l/1")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_nothing_is_acknowledged_or_visible() {
    let c = Cluster::start(3).await;
    let topic = "quorum";
    c.create_topic(topic).await;
    let before: Vec<String> = (0..5).map(|i| format!("q/{i}")).collect();
    c.publish_values(topic, &before).await;
    c.wait_converged(topic).await;

    let (leader, followers) = c.isolate_leader().await;

    // A publish to the isolated leader: it may append the entry but can never commit it.
    let request = c
        .http()
        .post(format!("{}/v1/topics/{topic}/records", c.url(leader)))
        .json(&records_of(&["q/no-quorum"]))
        .timeout(Duration::from_secs(25))
        .send();
    let pending = tokio::spawn(async move {
        let t = Instant::now();
        let answer = match request.await {
            Ok(resp) => {
                let status = resp.status();
                Ok((status, resp.text().await.unwrap_or_default()))
            }
            Err(e) => Err(e.to_string()),
        };
        (answer, t.elapsed())
    });
    // Wait until the entry is in the leader's log beyond its commit index (or until the
    // publish was answered, e.g. because the leader stepped down).
    let cl = &c;
    let pending_ref = &pending;
    c.wait_for(
        "the isolated leader to append the publish",
        Duration::from_secs(10),
        move || async move {
            if pending_ref.is_finished() {
                return Ok(());
            }
            cl.appended_beyond_commit(leader).await
        },
    )
    .await;

    // Reads on the isolated leader never show the uncommitted record, even when waiting.
    let page = c.read(leader, topic, "from=5&wait_ms=1500").await;
    assert!(
        page.records.is_empty(),
        "an uncommitted record was served: {page:?}"
    );
    assert_eq!(page.high_watermark, 5, "{page:?}");
    let page = c.read(leader, topic, "from=first").await;
    assert_eq!(values(&page), before, "{page:?}");
    let info = c.topic(leader, topic).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(info.summary.next_offset, 5, "{info:?}");

    let (answer, elapsed) = pending.await.expect("publish task");
    let definite = match &answer {
        Ok((status, body)) => {
            if status.is_success() {
                c.fail(&format!(
                    "a publish with two of three nodes dead was acknowledged ({status} after \
                     {elapsed:?}): {body}"
                ));
            }
            let code = serde_json::from_str::<Value>(body)
                .ok()
                .map(|v| v["code"].clone());
            status.is_client_error()
                || *status == StatusCode::TEMPORARY_REDIRECT
                || (*status == StatusCode::SERVICE_UNAVAILABLE
                    && matches!(
                        code.as_ref().and_then(Value::as_str),
                        Some("no_leader" | "shutting_down")
                    ))
        }
        Err(_) => false,
    };
    eprintln!(
        "publish without quorum answered after {elapsed:?}: {answer:?} (definite: {definite})"
    );
    // For the report only (not part of the contract): does the isolated leader still claim to
    // lead and to be ready?
    let isolated = c.status(leader).await;
    let ready = c
        .call(reqwest::Method::GET, leader, "/readyz")
        .await
        .status();
    eprintln!(
        "isolated node {leader}: leader_id {:?}, /readyz {ready}",
        isolated.map(|s| s.leader_id)
    );

    // Heal: the log converges, the acknowledged records are there, the refused one at most
    // once (and not at all when the refusal was definite), and writes work again.
    for id in &followers {
        c.restart(*id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    // A write commits only after every entry before it in the leader's log, so once this one
    // is acknowledged the fate of the refused publish is settled too.
    let ack = c.publish_values(topic, &["q/after".to_string()]).await;
    let log = c.consistent_log(topic).await;
    let got: Vec<String> = log.iter().filter_map(|r| r.value.clone()).collect();
    assert_eq!(
        got[..5],
        before[..],
        "the acknowledged records come first: {got:?}"
    );
    let copies = got.iter().filter(|v| *v == "q/no-quorum").count();
    assert!(
        copies <= 1,
        "the unacknowledged publish appears {copies} times"
    );
    assert!(
        !(definite && copies == 1),
        "a publish refused with a definite error ({answer:?}) became visible after healing"
    );
    assert_eq!(got.len(), 5 + copies + 1, "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some("q/after"), "{got:?}");
    assert_eq!(ack.first_offset, (5 + copies) as u64);
}

/// One request of the bad-input table.
struct Bad {
    what: &'static str,
    method: Method,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn bad(
    what: &'static str,
    method: Method,
    path: impl Into<String>,
    status: u16,
    code: &'static str,
) -> Bad {
    Bad {
        what,
        method,
        path: path.into(),
        content_type: None,
        body: Vec::new(),
        status,
        code,
    }
}

fn bad_publish(
    what: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Bad {
    Bad {
        content_type: Some("application/json"),
        body: body.into(),
        ..bad(what, Method::POST, "/v1/topics/good/records", status, code)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_changes_nothing() {
    let c = Cluster::start(3).await;
    c.create_topic("good").await;
    c.publish_values("good", &["g/0".to_string(), "g/1".to_string()])
        .await;
    let leader = c.leader_id().await;
    let lurl = c.url(leader);
    let mib = 1usize << 20;

    let many: Vec<Value> = (0..10_001)
        .map(|i| json!({ "value": format!("m{i}") }))
        .collect();
    let ok_then_bad = json!({"records": [{"value": "fine"}, {"value_b64": "not base64!"}]});
    let mut cases = vec![
        bad(
            "topic name with a space",
            Method::PUT,
            "/v1/topics/a%20b",
            400,
            "invalid_argument",
        ),
        bad(
            "topic name of 129 chars",
            Method::PUT,
            format!("/v1/topics/{}", "a".repeat(129)),
            400,
            "invalid_argument",
        ),
        bad(
            "non-ASCII topic name",
            Method::PUT,
            "/v1/topics/%C3%A9",
            400,
            "invalid_argument",
        ),
        bad(
            "publish to an invalid name",
            Method::POST,
            "/v1/topics/a%20b/records",
            400,
            "invalid_argument",
        ),
        bad(
            "read of an invalid name",
            Method::GET,
            "/v1/topics/a%20b/records?from=first",
            400,
            "invalid_argument",
        ),
        bad(
            "GET of an invalid name",
            Method::GET,
            "/v1/topics/%C3%A9",
            400,
            "invalid_argument",
        ),
        Bad {
            content_type: Some("application/json"),
            body: br#"{"retention": {"max_age_ms": "soon"}}"#.to_vec(),
            ..bad(
                "topic config of the wrong type",
                Method::PUT,
                "/v1/topics/newtopic",
                400,
                "invalid_argument",
            )
        },
        Bad {
            content_type: Some("application/json"),
            body: br#"{"retentoin": {}}"#.to_vec(),
            ..bad(
                "topic config with an unknown field",
                Method::PUT,
                "/v1/topics/newtopic",
                400,
                "invalid_argument",
            )
        },
        bad_publish(
            "malformed JSON",
            &b"{\"records\": ["[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "unknown top-level field",
            &br#"{"records": [{"value": "x"}], "extra": 1}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "unknown record field",
            &br#"{"records": [{"value": "x", "bogus": 1}]}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "empty records",
            &br#"{"records": []}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish("no records field", &b"{}"[..], 400, "invalid_argument"),
        bad_publish(
            "10,001 records",
            json!({ "records": many }).to_string(),
            400,
            "invalid_argument",
        ),
        bad_publish(
            "both value and value_b64",
            &br#"{"records": [{"value": "x", "value_b64": "eA=="}]}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "neither value nor value_b64",
            &br#"{"records": [{"key": "k"}]}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "bad base64",
            &br#"{"records": [{"value_b64": "!!!"}]}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "a good record then a bad one",
            ok_then_bad.to_string(),
            400,
            "invalid_argument",
        ),
        bad_publish(
            "producer_id without sequence",
            &br#"{"records": [{"value": "x"}], "producer_id": "p"}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "a producer_id that is not a name",
            &br#"{"records": [{"value": "x"}], "producer_id": "a/b", "sequence": 0}"#[..],
            400,
            "invalid_argument",
        ),
        bad_publish(
            "record of 1 MiB + 1 byte",
            records_of(&["v".repeat(mib + 1)]).to_string(),
            413,
            "payload_too_large",
        ),
        bad_publish(
            "value of 1 MiB - 1 plus a 2-byte key",
            json!({"records": [{"value": "v".repeat(mib - 1), "key": "kk"}]}).to_string(),
            413,
            "payload_too_large",
        ),
        Bad {
            content_type: Some(OCTET_STREAM),
            body: vec![7u8; mib + 1],
            ..bad(
                "raw record of 1 MiB + 1 byte",
                Method::POST,
                "/v1/topics/good/records",
                413,
                "payload_too_large",
            )
        },
        bad_publish(
            "a record with 129 headers",
            json!({"records": [{"value": "h", "headers": (0..129)
                .map(|i| (format!("h{i}"), json!("v")))
                .collect::<serde_json::Map<String, Value>>()}]})
            .to_string(),
            400,
            "invalid_argument",
        ),
        bad_publish(
            "a header name of 257 bytes",
            json!({"records": [{"value": "h", "headers": {"n".repeat(257): "v"}}]}).to_string(),
            400,
            "invalid_argument",
        ),
        bad_publish(
            "an empty header name",
            json!({"records": [{"value": "h", "headers": {"": "v"}}]}).to_string(),
            400,
            "invalid_argument",
        ),
        bad_publish(
            "a key of 4 KiB + 1 byte",
            json!({"records": [{"value": "k", "key": "k".repeat(4097)}]}).to_string(),
            400,
            "invalid_argument",
        ),
        Bad {
            content_type: Some(OCTET_STREAM),
            body: b"raw".to_vec(),
            ..bad(
                "raw record with a key of 4 KiB + 1 byte",
                Method::POST,
                format!("/v1/topics/good/records?key={}", "k".repeat(4097)),
                400,
                "invalid_argument",
            )
        },
        bad_publish(
            "body over the 32 MiB request limit",
            records_of(&["b".repeat(33 * mib)]).to_string(),
            413,
            "payload_too_large",
        ),
        Bad {
            content_type: Some("application/json"),
            body: records_of(&["x"]).to_string().into_bytes(),
            ..bad(
                "publish to an unknown topic",
                Method::POST,
                "/v1/topics/nope/records",
                404,
                "topic_not_found",
            )
        },
        bad(
            "read of an unknown topic",
            Method::GET,
            "/v1/topics/nope/records?from=first",
            404,
            "topic_not_found",
        ),
        bad(
            "GET of an unknown topic",
            Method::GET,
            "/v1/topics/nope",
            404,
            "topic_not_found",
        ),
        bad(
            "DELETE of an unknown topic",
            Method::DELETE,
            "/v1/topics/nope",
            404,
            "topic_not_found",
        ),
        bad(
            "from=-1",
            Method::GET,
            "/v1/topics/good/records?from=-1",
            400,
            "invalid_argument",
        ),
        bad(
            "from=abc",
            Method::GET,
            "/v1/topics/good/records?from=abc",
            400,
            "invalid_argument",
        ),
        bad(
            "max=0",
            Method::GET,
            "/v1/topics/good/records?from=first&max=0",
            400,
            "invalid_argument",
        ),
        bad(
            "max=10001",
            Method::GET,
            "/v1/topics/good/records?from=first&max=10001",
            400,
            "invalid_argument",
        ),
        bad(
            "max=abc",
            Method::GET,
            "/v1/topics/good/records?from=first&max=abc",
            400,
            "invalid_argument",
        ),
        bad(
            "wait_ms=30001",
            Method::GET,
            "/v1/topics/good/records?from=first&wait_ms=30001",
            400,
            "invalid_argument",
        ),
        bad(
            "wait_ms=-5",
            Method::GET,
            "/v1/topics/good/records?from=first&wait_ms=-5",
            400,
            "invalid_argument",
        ),
        bad(
            "unknown query parameter",
            Method::GET,
            "/v1/topics/good/records?from=first&bogus=1",
            400,
            "invalid_argument",
        ),
        bad(
            "unknown subscription",
            Method::GET,
            "/v1/topics/good/records?subscription=nosuch",
            404,
            "subscription_not_found",
        ),
    ];
    // The same checks on a follower for reads (any node serves them).
    let follower = c.follower_id().await;
    cases.push(Bad {
        what: "from=abc on a follower",
        ..bad(
            "",
            Method::GET,
            "/v1/topics/good/records?from=abc",
            400,
            "invalid_argument",
        )
    });

    let mut failures = Vec::new();
    for case in &cases {
        let node = if case.what.ends_with("on a follower") {
            follower
        } else {
            leader
        };
        let before: TopicList = c.topics(leader).await;
        let mut request = c
            .http()
            .request(case.method.clone(), format!("{}{}", c.url(node), case.path));
        if let Some(content_type) = case.content_type {
            request = request
                .header(CONTENT_TYPE, content_type)
                .body(case.body.clone());
        }
        let outcome = match request.send().await {
            Ok(resp) => Cluster::check_problem(resp, case.status, case.code)
                .await
                .map(|_| ()),
            Err(e) => Err(format!("transport error: {e:?}")),
        };
        if let Err(e) = outcome {
            failures.push(format!(
                "{} ({} {}): {e}",
                case.what, case.method, case.path
            ));
        }
        let after: TopicList = c.topics(leader).await;
        if after != before {
            failures.push(format!(
                "{}: the topics changed: {before:?} -> {after:?}",
                case.what
            ));
        }
    }
    if !failures.is_empty() {
        c.fail(&format!(
            "{} of {} bad requests were not refused as API.md says:\n  {}",
            failures.len(),
            cases.len(),
            failures.join("\n  ")
        ));
    }

    // The node still serves; a record of exactly 1 MiB is accepted; nothing else got in.
    let ack = c.publish_values("good", &["g/2".to_string()]).await;
    assert_eq!(ack.first_offset, 2);
    let resp = c
        .send(
            c.http()
                .post(format!("{lurl}/v1/topics/good/records"))
                .header(CONTENT_TYPE, OCTET_STREAM)
                .body(vec![b'm'; mib]),
            "a raw record of exactly 1 MiB",
        )
        .await;
    let ack: PublishResponse = c.json_of(resp, 200, "a raw record of exactly 1 MiB").await;
    assert_eq!(ack.first_offset, 3);
    let log = c.consistent_log("good").await;
    let short: Vec<String> = log
        .iter()
        .map(|r| {
            r.value
                .clone()
                .unwrap_or_default()
                .chars()
                .take(8)
                .collect()
        })
        .collect();
    assert_eq!(short, vec!["g/0", "g/1", "g/2", "mmmmmmmm"]);
    assert_eq!(log[3].value.as_ref().map(String::len), Some(mib));
    let list = c.topics(leader).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["good"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_endpoints_need_the_cluster_secret() {
    use openraft::raft::VoteRequest;
    use raftq::raft::{TypeConfig, Vote};

    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    c.create_topic("r").await;
    let term = c.status(leader).await.unwrap_or_else(|e| c.fail(&e)).term;
    let http = c.http();

    // A well-formed vote request for a much higher term: if it got through, the node would
    // move to that term and the cluster would hold a new election.
    let vote = VoteRequest::<TypeConfig> {
        vote: Vote::new(term + 100, 99),
        last_log_id: None,
        leadership_transfer: false,
    };
    let vote_body = raftq::codec::encode(&vote).expect("encode a vote request");

    let mut failures = Vec::new();
    for node in [follower, leader] {
        let base = c.url(node);
        for endpoint in ["append", "vote", "pre-vote", "snapshot"] {
            let url = format!("{base}/raft/{endpoint}");
            let attempts = [
                (
                    "wrong secret",
                    http.post(&url)
                        .header(SECRET_HEADER, "not-the-secret-0123456789"),
                ),
                ("no secret", http.post(&url)),
                (
                    "a client bearer token",
                    http.post(&url).header(AUTHORIZATION, "Bearer anything"),
                ),
                (
                    "the secret as a bearer token",
                    http.post(&url)
                        .header(AUTHORIZATION, format!("Bearer {SECRET}")),
                ),
            ];
            for (how, request) in attempts {
                let resp = c.send(request.body(vote_body.clone()), &url).await;
                if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
                    failures.push(format!("node {node} /raft/{endpoint} with {how}: {e}"));
                }
            }
            for garbage in [&b"\xff\xfe\xfd garbage"[..], &b""[..]] {
                let request = http
                    .post(&url)
                    .header(SECRET_HEADER, SECRET)
                    .body(garbage.to_vec());
                let resp = c.send(request, &url).await;
                if let Err(e) = Cluster::check_problem(resp, 400, "invalid_argument").await {
                    failures.push(format!(
                        "node {node} /raft/{endpoint} with garbage {garbage:?}: {e}"
                    ));
                }
            }
        }
        let status_url = format!("{base}/raft/status");
        let resp = c
            .send(http.get(&status_url), "GET /raft/status without secret")
            .await;
        if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
            failures.push(format!(
                "node {node} GET /raft/status without the secret: {e}"
            ));
        }
        let resp = c
            .send(
                http.get(&status_url).header(SECRET_HEADER, SECRET),
                "GET /raft/status",
            )
            .await;
        if resp.status() != StatusCode::OK {
            failures.push(format!(
                "node {node} GET /raft/status with the secret: {}",
                resp.status()
            ));
        }
    }
    if !failures.is_empty() {
        c.fail(&format!(
            "Raft endpoint authentication:\n  {}",
            failures.join("\n  ")
        ));
    }

    // Nothing moved: same leader, same term everywhere, and the cluster still takes writes.
    let after = c.wait_leader(Duration::from_secs(10)).await;
    assert_eq!(
        after, leader,
        "the leader changed after refused Raft requests"
    );
    for id in c.running_ids() {
        let status = c.status(id).await.unwrap_or_else(|e| c.fail(&e));
        assert_eq!(
            status.term, term,
            "node {id} changed term after refused Raft requests"
        );
    }
    let ack = c
        .publish_values("r", &["after-raft-garbage".to_string()])
        .await;
    assert_eq!(ack.first_offset, 0);
    c.consistent_log("r").await;
}

/// A snapshot that no leader following the protocol could send (entries of a term beyond the
/// sender's vote) or a broken snapshot file is refused with a 400 to the sender: the node keeps
/// its state and keeps serving, rather than stopping on a broken invariant or a failed install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_no_leader_could_send_are_refused() {
    use openraft::impls::leader_id_adv::LeaderId;
    use raftq::raft::network::SnapshotHeader;
    use raftq::raft::{LogId, SnapshotMeta, Vote};

    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    c.create_topic("s").await;
    let term = c.status(leader).await.unwrap_or_else(|e| c.fail(&e)).term;
    let body = |snapshot_term: u64, file: &[u8]| {
        let header = SnapshotHeader {
            vote: Vote::new_committed(term, leader),
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(
                    LeaderId {
                        term: snapshot_term,
                        node_id: leader,
                    },
                    1_000_000,
                )),
                last_membership: Default::default(),
            },
        };
        let mut body = header.frame().expect("encode a snapshot header");
        body.extend_from_slice(file);
        body
    };
    let url = format!("{}/raft/snapshot", c.url(follower));
    for (what, bytes) in [
        (
            "entries beyond the sender's vote",
            body(term + 1, b"RAFTQSNP"),
        ),
        (
            "a file that is not a snapshot",
            body(term, b"not a snapshot at all"),
        ),
    ] {
        let request = c
            .http()
            .post(&url)
            .header(SECRET_HEADER, SECRET)
            .body(bytes);
        let resp = c.send(request, &url).await;
        if let Err(e) = Cluster::check_problem(resp, 400, "invalid_argument").await {
            c.fail(&format!("a snapshot with {what}: {e}"));
        }
    }

    // Nothing moved: the follower still runs, at the same term, and follows the leader.
    let status = c.status(follower).await.unwrap_or_else(|e| c.fail(&e));
    assert_eq!(status.term, term, "the follower changed term");
    let ack = c.publish_values("s", &["after".to_string()]).await;
    assert_eq!(ack.first_offset, 0);
    c.consistent_log("s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_health_and_readiness() {
    let c = Cluster::start(3).await;
    let leader = c.leader_id().await;
    let lurl = c.url(leader);
    let http = c.http();
    let cl = &c;

    // Settled: every node ready, and the leader knows every member's replication progress.
    c.wait_for(
        "every node ready and replicated",
        Duration::from_secs(20),
        move || async move {
            for id in cl.running_ids() {
                let resp = cl
                    .http()
                    .get(format!("{}/readyz", cl.url(id)))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("node {id} /readyz: {}", resp.status()));
                }
            }
            let status = cl.status(leader).await?;
            if status.members.iter().any(|m| m.matched_index.is_none()) {
                return Err(format!("leader's members: {:?}", status.members));
            }
            Ok(())
        },
    )
    .await;

    let leader_status = c.status(leader).await.unwrap_or_else(|e| c.fail(&e));
    for id in c.ids() {
        let raw: Value = c.get_json(id, "/v1/cluster").await;
        for field in [
            "node_id",
            "leader_id",
            "leader_url",
            "term",
            "commit_index",
            "last_applied",
            "members",
            "snapshot",
        ] {
            assert!(
                raw.get(field).is_some(),
                "node {id}: /v1/cluster lacks {field:?}: {raw}"
            );
        }
        for member in raw["members"].as_array().expect("members is an array") {
            for field in ["id", "url", "voter", "matched_index"] {
                assert!(
                    member.get(field).is_some(),
                    "node {id}: a member lacks {field:?}: {raw}"
                );
            }
        }
        let status = c.status(id).await.unwrap_or_else(|e| c.fail(&e));
        assert_eq!(status.node_id, id);
        assert_eq!(status.leader_id, Some(leader), "node {id}: {status:?}");
        assert_eq!(
            status.leader_url.as_deref(),
            Some(lurl.as_str()),
            "node {id}: {status:?}"
        );
        assert_eq!(status.term, leader_status.term, "node {id}: {status:?}");
        assert!(status.term >= 1, "{status:?}");
        assert!(status.commit_index >= 1, "node {id}: {status:?}");
        assert!(
            status.last_applied <= status.commit_index,
            "node {id}: {status:?}"
        );
        let members: Vec<(u64, String, bool)> = status
            .members
            .iter()
            .map(|m| (m.id, m.url.clone(), m.voter))
            .collect();
        let expected: Vec<(u64, String, bool)> =
            c.ids().into_iter().map(|i| (i, c.url(i), true)).collect();
        assert_eq!(members, expected, "node {id}: members");
        if id == leader {
            let own = status.matched_index(leader);
            assert!(
                own >= Some(status.commit_index),
                "leader's own log end below commit: {status:?}"
            );
            for m in &status.members {
                assert!(
                    m.matched_index <= own,
                    "member {} is ahead of the leader: {status:?}",
                    m.id
                );
            }
        }
        let resp = c
            .send(http.get(format!("{}/healthz", c.url(id))), "GET /healthz")
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "node {id} /healthz");
        let resp = c
            .send(http.get(format!("{}/readyz", c.url(id))), "GET /readyz")
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "node {id} /readyz");
    }

    // With no leader at all (every node crashed, one follower back alone): not ready, writes
    // answer 503 no_leader with Retry-After, reads are still served from local state.
    c.create_topic("nl").await;
    c.wait_converged("nl").await;
    let lone = c.follower_id().await;
    c.kill_all();
    c.restart(lone).await;
    let surl = c.url(lone);
    c.wait_for(
        "the lone node to know no leader",
        Duration::from_secs(20),
        || {
            let request = http.get(format!("{surl}/v1/cluster")).send();
            async move {
                let status: raftq_client::api::ClusterStatus = request
                    .await
                    .map_err(|e| e.to_string())?
                    .json()
                    .await
                    .map_err(|e| e.to_string())?;
                match status.leader_id {
                    None => Ok(()),
                    Some(l) => Err(format!("still names leader {l} in term {}", status.term)),
                }
            }
        },
    )
    .await;
    let resp = c
        .send(
            http.get(format!("{surl}/readyz")),
            "GET /readyz without a leader",
        )
        .await;
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "/readyz without a leader"
    );
    let resp = c
        .send(
            http.put(format!("{surl}/v1/topics/nol")).json(&json!({})),
            "PUT without a leader",
        )
        .await;
    let retry_after = resp.headers().get(RETRY_AFTER).cloned();
    c.expect_problem(resp, 503, "no_leader", "a topic PUT with no leader")
        .await;
    assert!(
        retry_after.is_some(),
        "503 no_leader must carry Retry-After"
    );
    let resp = c
        .send(
            http.post(format!("{surl}/v1/topics/nl/records"))
                .json(&records_of(&["x"])),
            "publish without a leader",
        )
        .await;
    let retry_after = resp.headers().get(RETRY_AFTER).cloned();
    c.expect_problem(resp, 503, "no_leader", "a publish with no leader")
        .await;
    assert!(
        retry_after.is_some(),
        "503 no_leader must carry Retry-After"
    );
    let page = c.read(lone, "nl", "from=first").await;
    assert!(
        page.records.is_empty() && page.high_watermark == 0,
        "{page:?}"
    );

    // Everyone back: a leader again, every node ready.
    for id in c.ids().into_iter().filter(|id| *id != lone) {
        c.restart(id).await;
    }
    c.wait_leader(Duration::from_secs(30)).await;
    c.wait_for(
        "every node ready again",
        Duration::from_secs(20),
        move || async move {
            for id in cl.running_ids() {
                let resp = cl
                    .http()
                    .get(format!("{}/readyz", cl.url(id)))
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("node {id} /readyz: {}", resp.status()));
                }
            }
            Ok(())
        },
    )
    .await;
    c.consistent_log("nl").await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_directory_guards_refuse_to_start() {
    let c = Cluster::start(3).await;
    c.create_topic("dd").await;
    c.publish_values("dd", &["dd/0".to_string()]).await;

    // A second process on a running node's data directory.
    let cmd = c.serve_command(1, free_port(), &c.data_dir(1), common::CLUSTER_ID);
    let (status, elapsed, output) =
        run_refused(&c, cmd, "a second process on node 1's data directory").await;
    assert!(
        !status.success(),
        "a second process on node 1's data dir exited with {status}: {output}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "it took {elapsed:?} to refuse: {output}"
    );
    assert!(
        output.contains("already in use"),
        "the refusal should say \"already in use\": {output}"
    );
    c.wait_leader(Duration::from_secs(10)).await;
    assert!(c.is_running(1), "node 1 must keep running");

    // Another node id, or another cluster id, on a stopped node's data directory.
    let exit = c.terminate(2).await;
    assert!(
        exit.success(),
        "node 2 should stop cleanly on SIGTERM: {exit}"
    );
    let cmd = c.serve_command(3, free_port(), &c.data_dir(2), common::CLUSTER_ID);
    let (status, elapsed, output) =
        run_refused(&c, cmd, "node id 3 on node 2's data directory").await;
    assert!(
        !status.success(),
        "--id 3 on node 2's data dir exited with {status}: {output}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "it took {elapsed:?} to refuse: {output}"
    );
    assert!(
        output.contains("belongs to node"),
        "the refusal should say \"belongs to node\": {output}"
    );
    let cmd = c.serve_command(2, free_port(), &c.data_dir(2), "another-cluster");
    let (status, _, output) =
        run_refused(&c, cmd, "another cluster id on node 2's data directory").await;
    assert!(
        !status.success(),
        "another --cluster-id on node 2's data dir exited with {status}: {output}"
    );
    assert!(
        output.contains("belongs to node"),
        "the refusal should say \"belongs to node\": {output}"
    );

    // The refused starts left the directory intact: node 2 comes back with its data.
    c.restart(2).await;
    c.wait_leader(Duration::from_secs(20)).await;
    c.publish_values("dd", &["dd/1".to_string()]).await;
    let log = c.consistent_log("dd").await;
    let got: Vec<Option<&str>> = log.iter().map(|r| r.value.as_deref()).collect();
    assert_eq!(got, vec![Some("dd/0"), Some("dd/1")]);
}
