//! Topics, publish and read, round trip through every node, and long-polls that answer on
//! commit.

use std::time::{Duration, Instant};

use base64::Engine as _;
use raftq_client::api::{PublishResponse, ReadResponse, TopicInfo, TopicList};
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::Cluster;
use raftq_client::api::{records_form, RECORDS_CONTENT_TYPE, RECORD_BATCH_CONTENT_TYPE};

use crate::{record_batch, records_of, values, OCTET_STREAM};

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

    // Publish a record batch: a binary value as its bytes, a key and headers; idempotent
    // with producer_id and sequence in the query, so the same batch again is a duplicate.
    let batch = record_batch(&[(
        Some(b"k3"),
        Some(&[0xfe, 0x00, 0x7f]),
        vec![("b", Some(b"2")), ("a", Some(b"1"))],
    )]);
    for (attempt, duplicate) in [("publish a record batch", false), ("again", true)] {
        let resp = c
            .send(
                http.post(format!(
                    "{lurl}/v1/topics/orders/records?producer_id=batcher&sequence=0"
                ))
                .header(CONTENT_TYPE, RECORD_BATCH_CONTENT_TYPE)
                .body(batch.clone()),
                attempt,
            )
            .await;
        let ack: PublishResponse = c.json_of(resp, 200, attempt).await;
        assert_eq!(
            (ack.first_offset, ack.last_offset, ack.duplicate),
            (3, 3, duplicate),
            "{attempt}: {ack:?}"
        );
    }

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
        (4, 4, 0),
        "{page:?}"
    );
    let r = &page.records;
    assert_eq!(r.len(), 4, "{page:?}");
    assert_eq!(r[0].value_str(), Some("hello"));
    assert_eq!(r[0].key.as_deref(), Some("k1"));
    assert_eq!(r[0].headers.get("h").map(String::as_str), Some("v"));
    assert_eq!(&r[1].value[..], &[0xff, 0x00, 0x01]);
    assert_eq!(r[2].value_str(), Some("raw-bytes"));
    assert_eq!(r[2].key.as_deref(), Some("order 17"));
    assert_eq!(&r[3].value[..], &[0xfe, 0x00, 0x7f]);
    // In JSON, a UTF-8 value is `value` and any other `value_b64`, never both.
    let raw: Value = c
        .get_json(follower, "/v1/topics/orders/records?from=first")
        .await;
    let fields = |i: usize| {
        let record = &raw["records"][i];
        (record["value"].as_str(), record["value_b64"].as_str())
    };
    assert_eq!(fields(0), (Some("hello"), None), "{raw}");
    assert_eq!(fields(1), (None, Some("/wAB")), "{raw}");
    assert_eq!(fields(3), (None, Some("/gB/")), "{raw}");
    // The binary form of the same read holds the same records.
    let resp = c
        .send(
            http.get(format!(
                "{}/v1/topics/orders/records?from=first",
                c.url(follower)
            ))
            .header(reqwest::header::ACCEPT, RECORDS_CONTENT_TYPE),
            "read in the binary form",
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some(RECORDS_CONTENT_TYPE)
    );
    let body = resp.bytes().await.expect("the body");
    let binary = records_form::decode_read(&body).expect("the binary form decodes");
    assert_eq!(binary, page, "the binary form reads as the JSON one");
    assert_eq!(r[3].key.as_deref(), Some("k3"));
    assert_eq!(
        r[3].headers.iter().collect::<Vec<_>>(),
        vec![
            (&"a".to_string(), &"1".to_string()),
            (&"b".to_string(), &"2".to_string())
        ]
    );
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
        vec![3],
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
    assert_eq!(page.high_watermark, 4, "{page:?}");

    // GET list on a follower.
    let list: TopicList = c.topics(follower).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["orders", "small"], "{list:?}");
    let orders = &list.topics[0];
    assert_eq!(
        (orders.first_offset, orders.next_offset, orders.records),
        (0, 4, 4),
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
