//! API tokens against real nodes: every endpoint class refuses a request without a token,
//! with a wrong token, with the cluster secret, and with a token that lacks the action, and
//! such a request changes nothing; a token that has the action works, through any node.

mod common;

use common::{Cluster, PROBLEM_JSON, SECRET, SECRET_HEADER};
use raftq_client::api::{PublishRequest, PullResponse, RecordIn, TopicList};
use reqwest::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::Method;
use serde_json::{json, Value};

const ADMIN: &str = "rq_test_admin_4b1d7e0c9a";
const WRITER: &str = "rq_test_writer_0e8f21aa";
const READER: &str = "rq_test_reader_7c33d9b5";
/// admin, but only of the `scratch-*` topics.
const SCRATCH: &str = "rq_test_scratch_19fe02c4";
/// consume on `orders.*` and publish on `orders.dlq` only: may name that dead-letter topic.
const DEAD_LETTERS: &str = "rq_test_dead_letters_5a90e1";

fn tokens_file() -> String {
    common::tokens_toml(&[
        ("admin", ADMIN, "admin:*"),
        ("writer", WRITER, "publish:orders.*"),
        ("reader", READER, "consume:orders.*"),
        ("scratch", SCRATCH, "admin:scratch-*"),
        (
            "dead-letters",
            DEAD_LETTERS,
            "consume:orders.* publish:orders.dlq",
        ),
    ])
}

/// One endpoint class: a request, and a token that is valid but lacks what it needs
/// (`None` when any valid token may call it).
struct Case {
    method: Method,
    path: &'static str,
    body: Option<Value>,
    lacking: Option<&'static str>,
}

fn case(
    method: Method,
    path: &'static str,
    body: Option<Value>,
    lacking: Option<&'static str>,
) -> Case {
    Case {
        method,
        path,
        body,
        lacking,
    }
}

fn cases() -> Vec<Case> {
    let receipts = json!({"receipts": ["0-1-1"]});
    vec![
        case(Method::GET, "/v1/topics", None, None),
        case(Method::GET, "/v1/report", None, None),
        case(Method::GET, "/v1/cluster", None, None),
        case(
            Method::PUT,
            "/v1/topics/orders.new",
            Some(json!({})),
            Some(WRITER),
        ),
        case(Method::DELETE, "/v1/topics/orders.eu", None, Some(READER)),
        case(Method::GET, "/v1/topics/orders.eu", None, Some(SCRATCH)),
        case(
            Method::POST,
            "/v1/topics/orders.eu/records",
            Some(json!({"records": [{"value": "intruder"}]})),
            Some(READER),
        ),
        case(
            Method::GET,
            "/v1/topics/orders.eu/records?from=first",
            None,
            Some(WRITER),
        ),
        case(
            Method::GET,
            "/v1/topics/orders.eu/report",
            None,
            Some(SCRATCH),
        ),
        case(
            Method::GET,
            "/v1/topics/orders.eu/subscriptions",
            None,
            Some(SCRATCH),
        ),
        case(
            Method::PUT,
            "/v1/topics/orders.eu/subscriptions/s2",
            Some(json!({})),
            Some(WRITER),
        ),
        // Naming a dead-letter topic needs publish there: consume on the subscription's own
        // topic is not enough (a dead letter appends to the other topic).
        case(
            Method::PUT,
            "/v1/topics/orders.eu/subscriptions/s3",
            Some(json!({"dead_letter_topic": "scratch-1"})),
            Some(READER),
        ),
        case(
            Method::PUT,
            "/v1/topics/orders.eu/subscriptions/s3",
            Some(json!({"dead_letter_topic": "scratch-1"})),
            Some(DEAD_LETTERS),
        ),
        case(
            Method::GET,
            "/v1/topics/orders.eu/subscriptions/s",
            None,
            Some(SCRATCH),
        ),
        case(
            Method::DELETE,
            "/v1/topics/orders.eu/subscriptions/s",
            None,
            Some(READER),
        ),
        case(
            Method::POST,
            "/v1/topics/orders.eu/subscriptions/s/pull",
            Some(json!({"max": 10})),
            Some(WRITER),
        ),
        case(
            Method::POST,
            "/v1/topics/orders.eu/subscriptions/s/ack",
            Some(receipts.clone()),
            Some(WRITER),
        ),
        case(
            Method::POST,
            "/v1/topics/orders.eu/subscriptions/s/nack",
            Some(receipts.clone()),
            Some(WRITER),
        ),
        case(
            Method::POST,
            "/v1/topics/orders.eu/subscriptions/s/extend",
            Some(receipts),
            Some(WRITER),
        ),
        case(
            Method::PUT,
            "/v1/topics/orders.eu/subscriptions/s/cursor",
            Some(json!({"offset": 2})),
            Some(WRITER),
        ),
        // A broadcast to every topic needs publish on every topic.
        case(Method::POST, "/v1/broadcast", Some(json!({})), Some(WRITER)),
        case(
            Method::POST,
            "/v1/broadcast",
            Some(json!({"topics": ["orders.eu"]})),
            Some(READER),
        ),
        case(Method::POST, "/v1/cluster/snapshot", None, Some(SCRATCH)),
        case(
            Method::POST,
            "/v1/cluster/nodes",
            Some(json!({"id": 9, "url": "http://127.0.0.1:9"})),
            Some(WRITER),
        ),
        case(Method::DELETE, "/v1/cluster/nodes/3", None, Some(SCRATCH)),
        case(
            Method::POST,
            "/v1/cluster/voters",
            Some(json!({"ids": [1, 2]})),
            Some(WRITER),
        ),
        case(
            Method::POST,
            "/v1/cluster/transfer-leader",
            Some(json!({})),
            Some(READER),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_missing_wrong_and_ungranted_tokens_and_changes_nothing() {
    let c = Cluster::start_with_tokens(3, &tokens_file(), ADMIN).await;
    c.create_topic("orders.eu").await;
    c.create_topic("scratch-1").await;
    c.put_json("/v1/topics/orders.eu/subscriptions/s", &json!({}))
        .await;
    c.publish_values("orders.eu", &["a".into(), "b".into(), "c".into()])
        .await;
    let before = c.digests().await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;

    // A client that sends no Authorization header of its own.
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("build an HTTP client");
    let mut failures = Vec::new();
    for node in [leader, follower] {
        for case in cases() {
            let url = format!("{}{}", c.url(node), case.path);
            let mut attempts: Vec<(&str, Option<String>, u16, &str)> = vec![
                ("no token", None, 401, "unauthorized"),
                (
                    "a wrong token",
                    Some("rq_not_a_token".into()),
                    401,
                    "unauthorized",
                ),
                (
                    "the cluster secret",
                    Some(SECRET.into()),
                    401,
                    "unauthorized",
                ),
            ];
            if let Some(token) = case.lacking {
                attempts.push((
                    "a token lacking the action",
                    Some(token.into()),
                    403,
                    "forbidden",
                ));
            }
            for (how, token, status, code) in attempts {
                let mut req = bare.request(case.method.clone(), &url);
                if let Some(t) = &token {
                    req = req.header(AUTHORIZATION, format!("Bearer {t}"));
                }
                if let Some(body) = &case.body {
                    req = req.json(body);
                }
                let what = format!("{} {} on node {node} with {how}", case.method, case.path);
                let resp = c.send(req, &what).await;
                let challenged = resp.headers().contains_key(WWW_AUTHENTICATE);
                match Cluster::check_problem(resp, status, code).await {
                    Err(e) => failures.push(format!("{what}: {e}")),
                    Ok(_) if status == 401 && !challenged => {
                        failures.push(format!("{what}: 401 without WWW-Authenticate"))
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    // The cluster secret header opens only the Raft endpoints, never /v1.
    let resp = c
        .send(
            bare.get(format!("{}/v1/topics", c.url(leader)))
                .header(SECRET_HEADER, SECRET),
            "GET /v1/topics with the cluster secret header",
        )
        .await;
    if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
        failures.push(format!("/v1 with the cluster secret header: {e}"));
    }
    // And a valid API token never opens the Raft endpoints.
    for endpoint in ["append", "append-stream", "vote", "snapshot"] {
        let url = format!("{}/raft/{endpoint}", c.url(follower));
        let resp = c
            .send(
                bare.post(&url)
                    .header(AUTHORIZATION, format!("Bearer {ADMIN}")),
                &url,
            )
            .await;
        if let Err(e) = Cluster::check_problem(resp, 401, "unauthorized").await {
            failures.push(format!("/raft/{endpoint} with the admin API token: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing the refused requests asked for happened, on any node.
    let after = c.digests().await;
    assert_eq!(before, after, "refused requests changed the state");
    let list: TopicList = c.topics(leader).await;
    let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["orders.eu", "scratch-1"]);
    assert_eq!(
        c.status(leader)
            .await
            .unwrap_or_else(|e| c.fail(&e))
            .members
            .len(),
        3
    );

    // Each token does what it is granted, through a follower too (the SDK follows the
    // redirect to the leader with its token).
    let writer = raftq_client::Client::builder(&[c.url(follower)])
        .token(WRITER)
        .build()
        .expect("build an SDK client");
    let batch = |v: &str| PublishRequest {
        records: vec![RecordIn::text(v)],
        ..Default::default()
    };
    let ack = writer
        .publish("orders.eu", &batch("granted"))
        .await
        .unwrap_or_else(|e| c.fail(&format!("the writer token could not publish: {e}")));
    assert_eq!(ack.first_offset, 3);
    match writer.publish("scratch-1", &batch("not granted")).await {
        Err(raftq_client::Error::Api(p)) if p.status == 403 => {}
        other => c.fail(&format!(
            "the writer token on scratch-1: expected 403, got {other:?}"
        )),
    }
    let pull = bare
        .post(format!(
            "{}/v1/topics/orders.eu/subscriptions/s/pull",
            c.url(leader)
        ))
        .header(AUTHORIZATION, format!("Bearer {READER}"))
        .json(&json!({"max": 10}));
    let pulled: PullResponse = c
        .json_of(
            c.send(pull, "pull with the reader token").await,
            200,
            "pull",
        )
        .await;
    assert_eq!(pulled.messages.len(), 4);

    // Listings show only the topics a token is granted something on.
    for (token, want) in [
        (WRITER, vec!["orders.eu"]),
        (SCRATCH, vec!["scratch-1"]),
        (ADMIN, vec!["orders.eu", "scratch-1"]),
    ] {
        let req = bare
            .get(format!("{}/v1/topics", c.url(follower)))
            .header(AUTHORIZATION, format!("Bearer {token}"));
        let list: TopicList = c
            .json_of(c.send(req, "list topics").await, 200, "list")
            .await;
        let names: Vec<&str> = list.topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, want, "GET /v1/topics with {token}");
        let req = bare
            .get(format!("{}/v1/report", c.url(follower)))
            .header(AUTHORIZATION, format!("Bearer {token}"));
        let report: Value = c.json_of(c.send(req, "report").await, 200, "report").await;
        let mut names: Vec<&str> = report["topics"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        names.sort_unstable();
        assert_eq!(names, want, "GET /v1/report with {token}");
    }

    // Health endpoints stay open: probes carry no token.
    let resp = c
        .send(bare.get(format!("{}/healthz", c.url(leader))), "healthz")
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(!ct.starts_with(PROBLEM_JSON), "healthz answered a problem");

    // With publish on the dead-letter topic as well, the same subscription can be made.
    c.create_topic("orders.dlq").await;
    let req = bare
        .put(format!(
            "{}/v1/topics/orders.eu/subscriptions/s3",
            c.url(leader)
        ))
        .header(AUTHORIZATION, format!("Bearer {DEAD_LETTERS}"))
        .json(&json!({"dead_letter_topic": "orders.dlq"}));
    let resp = c
        .send(req, "a subscription naming a granted dead-letter topic")
        .await;
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
}

/// The CLI's `cluster snapshot` asks each node it is given with the caller's token: refused
/// without one, a snapshot on every node with the admin token (it once asked with none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_asks_each_node_for_a_snapshot_with_the_callers_token() {
    let c = Cluster::start_with_tokens(3, &tokens_file(), ADMIN).await;
    let snapshot = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(["cluster", "snapshot"]);
        for id in 1..=3 {
            cmd.arg("--url").arg(c.url(id));
        }
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RAFTQ_") {
                cmd.env_remove(name);
            }
        }
        if let Some(token) = token {
            cmd.env("RAFTQ_TOKEN", token);
        }
        cmd.output().expect("run raftq")
    };
    let refused = snapshot(None);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let done = snapshot(Some(ADMIN));
    assert!(done.status.success(), "{done:?}");
    let out = String::from_utf8_lossy(&done.stdout);
    for id in 1..=3 {
        assert!(
            out.contains(&format!("node {id} (")),
            "no snapshot of node {id}: {out}"
        );
    }
}
