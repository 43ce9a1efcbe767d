//! Bad input of every kind is refused with the documented problem, and changes nothing.

use raftq_client::api::{PublishResponse, TopicList};
use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::Cluster;
use raftq_client::api::RECORD_BATCH_CONTENT_TYPE;

use crate::{record_batch, records_of, BatchRecord, OCTET_STREAM};

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

fn bad_batch(
    what: &'static str,
    query: &str,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
) -> Bad {
    Bad {
        content_type: Some(RECORD_BATCH_CONTENT_TYPE),
        body,
        ..bad(
            what,
            Method::POST,
            format!("/v1/topics/good/records{query}"),
            status,
            code,
        )
    }
}

/// Record batch publishes that must be refused.
fn bad_batches() -> Vec<Bad> {
    let mib = 1 << 20;
    let good = record_batch(&[(None, Some(b"v"), vec![])]);
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let mut compressed = good.clone();
    compressed[22] |= 1; // attributes: gzip; the CRC no longer matches either
    let big = vec![7u8; mib + 1];
    let many: Vec<BatchRecord<'_>> = (0..10_001)
        .map(|_| (None, Some(&b"x"[..]), vec![]))
        .collect();
    vec![
        bad_batch(
            "an empty record batch body",
            "",
            vec![],
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a record batch cut short",
            "",
            good[..good.len() - 1].to_vec(),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a record batch whose CRC does not match",
            "",
            flipped,
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a compressed record batch",
            "",
            compressed,
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a record batch followed by a stray byte",
            "",
            [good.clone(), vec![0]].concat(),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a record with a null value",
            "",
            record_batch(&[(None, None, vec![])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a key that is not UTF-8",
            "",
            record_batch(&[(Some(&[0xff, 0xfe]), Some(b"v"), vec![])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a header value that is not UTF-8",
            "",
            record_batch(&[(None, Some(b"v"), vec![("h", Some(&[0xc3][..]))])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a header with a null value",
            "",
            record_batch(&[(None, Some(b"v"), vec![("h", None)])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a header name that repeats",
            "",
            record_batch(&[(None, Some(b"v"), vec![("h", Some(b"1")), ("h", Some(b"2"))])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "an empty header name in a record batch",
            "",
            record_batch(&[(None, Some(b"v"), vec![("", Some(b"1"))])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a key of 4 KiB + 1 byte in a record batch",
            "",
            record_batch(&[(Some(&[b'k'; 4097]), Some(b"v"), vec![])]),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "10,001 records in a record batch",
            "",
            record_batch(&many),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a producer_id without a sequence",
            "?producer_id=p",
            good.clone(),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a sequence that is not a number",
            "?producer_id=p&sequence=x",
            good.clone(),
            400,
            "invalid_argument",
        ),
        bad_batch(
            "an unknown query parameter on a record batch publish",
            "?key=k",
            good,
            400,
            "invalid_argument",
        ),
        bad_batch(
            "a record of 1 MiB + 1 byte in a record batch",
            "",
            record_batch(&[(None, Some(&big), vec![])]),
            413,
            "payload_too_large",
        ),
    ]
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
    cases.extend(bad_batches());
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
        .map(|r| r.value_str().unwrap_or_default().chars().take(8).collect())
        .collect();
    assert_eq!(short, vec!["g/0", "g/1", "g/2", "mmmmmmmm"]);
    assert_eq!(log[3].value.len(), mib);
    let list = c.topics(leader).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["good"]);
}
