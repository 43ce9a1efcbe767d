//! Subscriptions against a real three-node cluster (API.md "Subscriptions",
//! docs/subscriptions.md): create/get/delete and refusals, leased pull of the lowest offsets,
//! acks moving the cursor (the ack floor), nack with and without delay, extend, lease expiry
//! decided by the replicated state machine (the leader ticks on its own), dead letters,
//! leases across a leader change, four competing consumers through two leader SIGKILLs, and
//! stream reads that move the cursor.
//!
//! Everything goes through raw HTTP (redirects disabled) so that status codes, problem codes
//! and `Location` headers are checked exactly. Writes go to the leader; a 307 or 503 (definite
//! refusals) is retried against the leader found again.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Cluster, PROBLEM_JSON};
use raftq_client::api::{
    ClusterStatus, Message, PullResponse, ReceiptResult, ReceiptResults, ReceiptStatus, Record,
    SubscriptionInfo,
};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

// ----- raw HTTP helpers ------------------------------------------------------------------------

/// One HTTP answer, fully read.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    location: Option<String>,
    content_type: String,
    body: String,
}

impl Answer {
    /// The body as `T` after checking the status; fails the test otherwise.
    fn json<T: DeserializeOwned>(&self, c: &Cluster, status: u16, what: &str) -> T {
        if self.status != status {
            c.fail(&format!(
                "{what}: expected status {status}, got {}: {}",
                self.status, self.body
            ));
        }
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| c.fail(&format!("{what}: undecodable answer ({e}): {}", self.body)))
    }

    /// Checks the answer is an RFC 9457 problem with `status` and `code`.
    fn problem(&self, status: u16, code: &str) -> Result<Value, String> {
        if self.status != status {
            return Err(format!(
                "expected {status} {code}, got {}: {}",
                self.status, self.body
            ));
        }
        if !self.content_type.starts_with(PROBLEM_JSON) {
            return Err(format!(
                "content-type is {:?}, not {PROBLEM_JSON}; body: {}",
                self.content_type, self.body
            ));
        }
        let value: Value = serde_json::from_str(&self.body)
            .map_err(|e| format!("problem body is not JSON ({e}): {}", self.body))?;
        if value["code"] != code {
            return Err(format!("expected code {code:?}: {}", self.body));
        }
        if value["status"].as_u64() != Some(u64::from(status)) {
            return Err(format!(
                "problem field status is not {status}: {}",
                self.body
            ));
        }
        for field in ["type", "title", "detail"] {
            if !value[field].is_string() {
                return Err(format!("problem field {field:?} missing: {}", self.body));
            }
        }
        Ok(value)
    }

    fn expect_problem(&self, c: &Cluster, status: u16, code: &str, what: &str) -> Value {
        self.problem(status, code)
            .unwrap_or_else(|e| c.fail(&format!("{what}: {e}")))
    }
}

/// Sends `method path` with an optional raw JSON body to node `id`; a transport error fails.
async fn call(c: &Cluster, id: u64, method: Method, path: &str, body: Option<&str>) -> Answer {
    let url = format!("{}{path}", c.url(id));
    let mut req = c.http().request(method.clone(), &url);
    if let Some(body) = body {
        req = req
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
    }
    let what = format!("{method} {path} on node {id}");
    let resp = c.send(req, &what).await;
    let status = resp.status().as_u16();
    let header = |name| {
        resp.headers()
            .get(name)
            .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let location = header(LOCATION);
    let content_type = header(CONTENT_TYPE).unwrap_or_default();
    let body = match resp.text().await {
        Ok(body) => body,
        Err(e) => c.fail(&format!("{what}: reading the answer: {e}")),
    };
    Answer {
        status,
        location,
        content_type,
        body,
    }
}

/// Sends a request to the leader; definite refusals caused by a leader change (307, 503) are
/// retried against the leader found again, for at most 20 s. Returns the leader that answered.
async fn call_leader(c: &Cluster, method: Method, path: &str, body: Option<&str>) -> (u64, Answer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leader = c.leader_id().await;
        let answer = call(c, leader, method.clone(), path, body).await;
        if (answer.status == 307 || answer.status == 503) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        return (leader, answer);
    }
}

fn sub_path(topic: &str, sub: &str) -> String {
    format!("/v1/topics/{topic}/subscriptions/{sub}")
}

/// The fields API.md promises in `GET .../subscriptions/{sub}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
struct SubState {
    cursor: u64,
    backlog: u64,
    in_flight: u64,
    delivered: u64,
    acked: u64,
    redelivered: u64,
    dead_lettered: u64,
}

/// `GET .../subscriptions/{sub}` on node `id`; `Err` unless 200 with the contract's fields.
async fn sub_state(c: &Cluster, id: u64, topic: &str, sub: &str) -> Result<SubState, String> {
    let path = sub_path(topic, sub);
    let resp = c
        .http()
        .get(format!("{}{path}", c.url(id)))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| format!("GET {path} on node {id}: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    if status != 200 {
        return Err(format!("GET {path} on node {id} answered {status}: {body}"));
    }
    serde_json::from_str(&body)
        .map_err(|e| format!("GET {path} on node {id}: undecodable ({e}): {body}"))
}

/// The subscription as the current leader serves it (which has applied every answered write).
async fn sub_now(c: &Cluster, topic: &str, sub: &str) -> SubState {
    let leader = c.leader_id().await;
    sub_state(c, leader, topic, sub)
        .await
        .unwrap_or_else(|e| c.fail(&e))
}

/// Waits until every running node serves the same state of the subscription and `pred`
/// accepts it; returns it.
async fn wait_sub_everywhere<P>(
    c: &Cluster,
    topic: &str,
    sub: &str,
    timeout: Duration,
    pred: P,
) -> SubState
where
    P: Fn(&SubState) -> Result<(), String>,
{
    let pred = &pred;
    let seen: Mutex<Option<SubState>> = Mutex::new(None);
    let seen_ref = &seen;
    c.wait_for(
        &format!("subscription {topic}/{sub} to converge on every running node"),
        timeout,
        move || async move {
            let mut first: Option<(u64, SubState)> = None;
            for id in c.running_ids() {
                let st = sub_state(c, id, topic, sub).await?;
                pred(&st).map_err(|e| format!("node {id}: {e}: {st:?}"))?;
                match first {
                    None => first = Some((id, st)),
                    Some((fid, fst)) if fst != st => {
                        return Err(format!("node {fid} has {fst:?}, node {id} has {st:?}"))
                    }
                    _ => {}
                }
            }
            *seen_ref.lock().unwrap() = first.map(|(_, st)| st);
            Ok(())
        },
    )
    .await;
    let st = seen.lock().unwrap().expect("set by the successful check");
    st
}

/// Creates subscription `sub` on `topic` with `config` (201 expected).
async fn create_sub(c: &Cluster, topic: &str, sub: &str, config: Value) {
    let what = format!("PUT {} {config}", sub_path(topic, sub));
    let (_, answer) = call_leader(
        c,
        Method::PUT,
        &sub_path(topic, sub),
        Some(&config.to_string()),
    )
    .await;
    if answer.status != 201 {
        c.fail(&format!(
            "{what}: expected 201, got {}: {}",
            answer.status, answer.body
        ));
    }
}

/// Pulls on the leader (200 expected) and checks each message's basic shape.
async fn pull(c: &Cluster, topic: &str, sub: &str, body: Value) -> Vec<Message> {
    let what = format!("pull {body} on {topic}/{sub}");
    let path = format!("{}/pull", sub_path(topic, sub));
    let (_, answer) = call_leader(c, Method::POST, &path, Some(&body.to_string())).await;
    let resp: PullResponse = answer.json(c, 200, &what);
    for m in &resp.messages {
        if m.receipt.is_empty() || m.delivery_count == 0 || m.lease_expires_ms == 0 {
            c.fail(&format!("{what}: malformed message {m:?}"));
        }
    }
    resp.messages
}

fn offsets(messages: &[Message]) -> Vec<u64> {
    messages.iter().map(|m| m.offset).collect()
}

fn counts(messages: &[Message]) -> Vec<u32> {
    messages.iter().map(|m| m.delivery_count).collect()
}

/// ack / nack / extend on the leader (200 expected): one result per receipt, in request order.
async fn settle(
    c: &Cluster,
    topic: &str,
    sub: &str,
    op: &str,
    receipts: &[&str],
    extra: Value,
) -> Vec<ReceiptResult> {
    let mut body = json!({ "receipts": receipts });
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            body[k] = v;
        }
    }
    let what = format!("{op} {body} on {topic}/{sub}");
    let path = format!("{}/{op}", sub_path(topic, sub));
    let (_, answer) = call_leader(c, Method::POST, &path, Some(&body.to_string())).await;
    let resp: ReceiptResults = answer.json(c, 200, &what);
    let echoed: Vec<&str> = resp.results.iter().map(|r| r.receipt.as_str()).collect();
    if echoed != receipts {
        c.fail(&format!(
            "{what}: results must answer every receipt once, in request order; got {resp:?}"
        ));
    }
    resp.results
}

fn statuses(results: &[ReceiptResult]) -> Vec<ReceiptStatus> {
    results.iter().map(|r| r.status).collect()
}

async fn ack(c: &Cluster, topic: &str, sub: &str, receipts: &[&str]) -> Vec<ReceiptStatus> {
    statuses(&settle(c, topic, sub, "ack", receipts, json!({})).await)
}

async fn nack(
    c: &Cluster,
    topic: &str,
    sub: &str,
    receipts: &[&str],
    delay_ms: u64,
    dead_letter: bool,
) -> Vec<ReceiptStatus> {
    let extra = json!({ "delay_ms": delay_ms, "dead_letter": dead_letter });
    statuses(&settle(c, topic, sub, "nack", receipts, extra).await)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

fn values(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}/{i}")).collect()
}

/// Publishes raw JSON records (with keys and headers) on the leader.
async fn publish_json(c: &Cluster, topic: &str, records: Value) {
    let body = json!({ "records": records }).to_string();
    let path = format!("/v1/topics/{topic}/records");
    let (_, answer) = call_leader(c, Method::POST, &path, Some(&body)).await;
    let _: Value = answer.json(c, 200, &format!("publish {body}"));
}

/// `GET /v1/topics` on the leader: name -> next_offset.
async fn next_offsets(c: &Cluster) -> BTreeMap<String, u64> {
    let leader = c.leader_id().await;
    c.topics(leader)
        .await
        .topics
        .into_iter()
        .map(|t| (t.name, t.next_offset))
        .collect()
}

// ----- 1 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_crud_and_errors() {
    let c = Cluster::start(3).await;
    c.create_topic("t").await;
    c.create_topic("other").await;
    c.publish_values("t", &values(3, "t")).await;
    let s = sub_path("t", "s");

    // PUT: 201, then 200 for the same configuration, 409 for another one.
    let config = json!({"ack_timeout_ms": 60000, "max_deliveries": 5});
    let (_, a) = call_leader(&c, Method::PUT, &s, Some(&config.to_string())).await;
    assert_eq!(a.status, 201, "first PUT of {s}: {}", a.body);
    let (_, a) = call_leader(&c, Method::PUT, &s, Some(&config.to_string())).await;
    assert_eq!(
        a.status, 200,
        "PUT of {s} with the same configuration: {}",
        a.body
    );
    for different in [
        json!({"ack_timeout_ms": 60000}),
        json!({"ack_timeout_ms": 60000, "max_deliveries": 6}),
        json!({"ack_timeout_ms": 60000, "max_deliveries": 5, "dead_letter_topic": "other"}),
    ] {
        let (_, a) = call_leader(&c, Method::PUT, &s, Some(&different.to_string())).await;
        a.expect_problem(&c, 409, "already_exists", &format!("PUT {s} {different}"));
    }

    // GET: a fresh subscription starting at the first record.
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        st,
        SubState {
            cursor: 0,
            backlog: 3,
            in_flight: 0,
            delivered: 0,
            acked: 0,
            redelivered: 0,
            dead_lettered: 0
        },
        "a new subscription on 3 records"
    );
    // The answer also decodes as the SDK's type, with its configuration.
    let leader = c.leader_id().await;
    let info: SubscriptionInfo = c.get_json(leader, &s).await;
    assert_eq!(
        (info.topic.as_str(), info.name.as_str()),
        ("t", "s"),
        "{info:?}"
    );
    assert_eq!(info.config.ack_timeout_ms, Some(60000), "{info:?}");
    assert_eq!(info.config.max_deliveries, Some(5), "{info:?}");

    // Other starts: "next" and an offset.
    create_sub(&c, "t", "from-next", json!({"start": "next"})).await;
    create_sub(&c, "t", "from-2", json!({"start": 2})).await;
    let st = sub_now(&c, "t", "from-next").await;
    assert_eq!((st.cursor, st.backlog), (3, 0), "start next: {st:?}");
    let st = sub_now(&c, "t", "from-2").await;
    assert_eq!((st.cursor, st.backlog), (2, 1), "start 2: {st:?}");

    // The list, and the topic's subscription count, on a follower once replicated.
    c.wait_converged("t").await;
    wait_sub_everywhere(&c, "t", "s", Duration::from_secs(20), |st| {
        if st.backlog == 3 {
            Ok(())
        } else {
            Err("backlog is not 3".into())
        }
    })
    .await;
    let follower = c.follower_id().await;
    let list: Value = c.get_json(follower, "/v1/topics/t/subscriptions").await;
    let names: BTreeSet<&str> = list["subscriptions"]
        .as_array()
        .unwrap_or_else(|| c.fail(&format!("GET /v1/topics/t/subscriptions: {list}")))
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["from-2", "from-next", "s"]),
        "subscription list: {list}"
    );
    let topics = c.topics(follower).await;
    let t = topics
        .topics
        .iter()
        .find(|t| t.name == "t")
        .expect("topic t");
    assert_eq!(t.subscriptions, 3, "{topics:?}");

    // One live delivery whose receipt the refused requests below must not touch.
    let leased = pull(&c, "t", "s", json!({"max": 1})).await;
    assert_eq!(offsets(&leased), vec![0]);
    let receipt = leased[0].receipt.clone();
    let before = sub_now(&c, "t", "s").await;
    assert_eq!(
        (
            before.cursor,
            before.backlog,
            before.in_flight,
            before.delivered
        ),
        (0, 2, 1, 1),
        "after one pull: {before:?}"
    );
    let topics_before = next_offsets(&c).await;
    let leader = c.leader_id().await;
    let list_before: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;

    let r = receipt.as_str();
    let long_name = "a".repeat(129);
    let x = sub_path("t", "x");
    /// What is sent, and the refusal expected: (what, method, path, body, status, code).
    type Refusal = (String, Method, String, Option<String>, u16, &'static str);
    let cases: Vec<Refusal> = vec![
        // Bad subscription configurations.
        (
            "start latest".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": "latest"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "start -1".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": -1}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "start above next_offset".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"start": 4}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms 0".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms above 12 h".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": 43_200_001u64}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack_timeout_ms a string".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout_ms": "5"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "max_deliveries 0".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"max_deliveries": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "dead_letter_topic that does not exist".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"dead_letter_topic": "nope"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "dead_letter_topic = the topic itself".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"dead_letter_topic": "t"}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "unknown field".into(),
            Method::PUT,
            x.clone(),
            Some(json!({"ack_timeout": 5}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "malformed JSON".into(),
            Method::PUT,
            x.clone(),
            Some("{\"start\":".into()),
            400,
            "invalid_argument",
        ),
        (
            "subscription name with a space".into(),
            Method::PUT,
            sub_path("t", "a%20b"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "subscription name of 129 chars".into(),
            Method::PUT,
            sub_path("t", &long_name),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        // Unknown topic.
        (
            "PUT on an unknown topic".into(),
            Method::PUT,
            sub_path("nope", "s"),
            Some("{}".into()),
            404,
            "topic_not_found",
        ),
        (
            "GET on an unknown topic".into(),
            Method::GET,
            sub_path("nope", "s"),
            None,
            404,
            "topic_not_found",
        ),
        (
            "list on an unknown topic".into(),
            Method::GET,
            "/v1/topics/nope/subscriptions".into(),
            None,
            404,
            "topic_not_found",
        ),
        (
            "pull on an unknown topic".into(),
            Method::POST,
            format!("{}/pull", sub_path("nope", "s")),
            Some("{}".into()),
            404,
            "topic_not_found",
        ),
        (
            "ack on an unknown topic".into(),
            Method::POST,
            format!("{}/ack", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "DELETE on an unknown topic".into(),
            Method::DELETE,
            sub_path("nope", "s"),
            None,
            404,
            "topic_not_found",
        ),
        (
            "nack on an unknown topic".into(),
            Method::POST,
            format!("{}/nack", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "extend on an unknown topic".into(),
            Method::POST,
            format!("{}/extend", sub_path("nope", "s")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "cursor on an unknown topic".into(),
            Method::PUT,
            format!("{}/cursor", sub_path("nope", "s")),
            Some(json!({"offset": 0}).to_string()),
            404,
            "topic_not_found",
        ),
        (
            "read with a subscription on an unknown topic".into(),
            Method::GET,
            "/v1/topics/nope/records?subscription=s".into(),
            None,
            404,
            "topic_not_found",
        ),
        // Unknown subscription.
        (
            "GET of an unknown subscription".into(),
            Method::GET,
            sub_path("t", "nope"),
            None,
            404,
            "subscription_not_found",
        ),
        (
            "pull on an unknown subscription".into(),
            Method::POST,
            format!("{}/pull", sub_path("t", "nope")),
            Some("{}".into()),
            404,
            "subscription_not_found",
        ),
        (
            "ack on an unknown subscription".into(),
            Method::POST,
            format!("{}/ack", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "nack on an unknown subscription".into(),
            Method::POST,
            format!("{}/nack", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "extend on an unknown subscription".into(),
            Method::POST,
            format!("{}/extend", sub_path("t", "nope")),
            Some(json!({"receipts": [r]}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "cursor of an unknown subscription".into(),
            Method::PUT,
            format!("{}/cursor", sub_path("t", "nope")),
            Some(json!({"offset": 1}).to_string()),
            404,
            "subscription_not_found",
        ),
        (
            "DELETE of an unknown subscription".into(),
            Method::DELETE,
            sub_path("t", "nope"),
            None,
            404,
            "subscription_not_found",
        ),
        (
            "read with an unknown subscription".into(),
            Method::GET,
            "/v1/topics/t/records?subscription=nope".into(),
            None,
            404,
            "subscription_not_found",
        ),
        // Bad pulls.
        (
            "pull max 0".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"max": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull max 1001".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"max": 1001}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull wait_ms 30001".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"wait_ms": 30001}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull ack_timeout_ms 0".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "pull with an unknown field".into(),
            Method::POST,
            format!("{s}/pull"),
            Some(json!({"maximum": 3}).to_string()),
            400,
            "invalid_argument",
        ),
        // Bad receipts.
        (
            "ack without receipts field".into(),
            Method::POST,
            format!("{s}/ack"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "ack of no receipts".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": []}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a made-up receipt".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": ["not-a-receipt"]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a live receipt plus a made-up one".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [r, "garbage"]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of a number".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [42]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack with an unknown field".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": [r], "all": true}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "ack of 10,001 receipts".into(),
            Method::POST,
            format!("{s}/ack"),
            Some(json!({"receipts": vec![r; 10_001]}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "nack delay above 12 h".into(),
            Method::POST,
            format!("{s}/nack"),
            Some(json!({"receipts": [r], "delay_ms": 43_200_001u64}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "nack of a made-up receipt".into(),
            Method::POST,
            format!("{s}/nack"),
            Some(json!({"receipts": ["x"], "dead_letter": true}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "extend ack_timeout_ms 0".into(),
            Method::POST,
            format!("{s}/extend"),
            Some(json!({"receipts": [r], "ack_timeout_ms": 0}).to_string()),
            400,
            "invalid_argument",
        ),
        // Bad cursor moves.
        (
            "cursor above next_offset".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some(json!({"offset": 4}).to_string()),
            400,
            "invalid_argument",
        ),
        (
            "cursor without offset".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some("{}".into()),
            400,
            "invalid_argument",
        ),
        (
            "cursor offset a string".into(),
            Method::PUT,
            format!("{s}/cursor"),
            Some(json!({"offset": "2"}).to_string()),
            400,
            "invalid_argument",
        ),
    ];
    let mut failures = Vec::new();
    for (what, method, path, body, status, code) in &cases {
        let (_, a) = call_leader(&c, method.clone(), path, body.as_deref()).await;
        if let Err(e) = a.problem(*status, code) {
            failures.push(format!("{what} ({method} {path}): {e}"));
        }
    }
    // Wrong refusals are reported at the end, after the rest of the test has run.
    let wrong_refusals = (!failures.is_empty()).then(|| {
        let text = format!(
            "{} of {} refusals wrong:\n  {}",
            failures.len(),
            cases.len(),
            failures.join("\n  ")
        );
        eprintln!("{text}");
        text
    });

    // Nothing the refused requests asked for happened.
    let after = sub_now(&c, "t", "s").await;
    assert_eq!(after, before, "refused requests changed the subscription");
    assert_eq!(
        next_offsets(&c).await,
        topics_before,
        "refused requests changed topics"
    );
    let leader = c.leader_id().await;
    let list_after: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;
    assert_eq!(
        list_after, list_before,
        "refused requests changed the subscription list"
    );
    let (_, a) = call_leader(&c, Method::GET, &x, None).await;
    a.expect_problem(
        &c,
        404,
        "subscription_not_found",
        "GET of the never-created x",
    );
    // The receipt named in refused acks/nacks/extends is still the live delivery.
    assert_eq!(
        ack(&c, "t", "s", &[r]).await,
        vec![ReceiptStatus::Acked],
        "the live receipt after the refused requests"
    );
    let st = sub_now(&c, "t", "s").await;
    assert_eq!((st.cursor, st.in_flight, st.acked), (1, 0, 1), "{st:?}");

    // DELETE: 204, then gone; a second DELETE is 404.
    let (_, a) = call_leader(&c, Method::DELETE, &s, None).await;
    assert_eq!(a.status, 204, "DELETE {s}: {}", a.body);
    let (_, a) = call_leader(&c, Method::GET, &s, None).await;
    a.expect_problem(&c, 404, "subscription_not_found", "GET after DELETE");
    let (_, a) = call_leader(&c, Method::DELETE, &s, None).await;
    a.expect_problem(&c, 404, "subscription_not_found", "second DELETE");
    // Re-created, it starts over (no state left behind).
    create_sub(&c, "t", "s", json!({})).await;
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.delivered, st.acked),
        (0, 3, 0, 0, 0),
        "re-created subscription: {st:?}"
    );

    // Deleting the topic deletes its subscriptions; a new topic of that name has none.
    let (_, a) = call_leader(&c, Method::DELETE, "/v1/topics/t", None).await;
    assert_eq!(a.status, 204, "DELETE topic t: {}", a.body);
    let (_, a) = call_leader(&c, Method::GET, &sub_path("t", "from-2"), None).await;
    a.expect_problem(&c, 404, "topic_not_found", "GET sub of a deleted topic");
    c.create_topic("t").await;
    for sub in ["s", "from-2", "from-next"] {
        let (_, a) = call_leader(&c, Method::GET, &sub_path("t", sub), None).await;
        a.expect_problem(
            &c,
            404,
            "subscription_not_found",
            &format!("GET {sub} on the re-created topic t"),
        );
    }
    let leader = c.leader_id().await;
    let list: Value = c.get_json(leader, "/v1/topics/t/subscriptions").await;
    assert_eq!(list["subscriptions"], json!([]), "{list}");
    c.wait_converged("t").await;
    for id in c.running_ids() {
        let topics = c.topics(id).await;
        let t = topics
            .topics
            .iter()
            .find(|t| t.name == "t")
            .expect("topic t");
        assert_eq!(t.subscriptions, 0, "node {id}: {topics:?}");
    }
    if let Some(text) = wrong_refusals {
        c.fail(&text);
    }
}

// ----- 2 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_leases_lowest_offsets_and_acks_move_the_cursor() {
    let c = Cluster::start(3).await;
    c.create_topic("q").await;
    let published = values(10, "q");
    c.publish_values("q", &published).await;
    create_sub(&c, "q", "s", json!({"ack_timeout_ms": 60000})).await;

    let invoked_ms = now_ms();
    let first = pull(&c, "q", "s", json!({"max": 4})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2, 3], "{first:?}");
    assert_eq!(counts(&first), vec![1; 4], "{first:?}");
    let receipts: BTreeSet<&str> = first.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(receipts.len(), 4, "receipts must be distinct: {first:?}");
    for m in &first {
        assert_eq!(
            m.value.as_deref(),
            Some(published[m.offset as usize].as_str()),
            "{m:?}"
        );
        // The lease starts at the pull's leader time, which is after the record's.
        assert!(
            m.lease_expires_ms >= m.timestamp_ms + 60_000,
            "a 60 s lease must end 60 s after the pull: {m:?}"
        );
        assert!(
            m.lease_expires_ms >= invoked_ms + 60_000 - 1_000
                && m.lease_expires_ms <= now_ms() + 60_000 + 5_000,
            "lease_expires_ms {} is not about 60 s from now ({invoked_ms}): {m:?}",
            m.lease_expires_ms
        );
    }

    let second = pull(&c, "q", "s", json!({"max": 4})).await;
    assert_eq!(
        offsets(&second),
        vec![4, 5, 6, 7],
        "no record may be leased twice at once: {second:?}"
    );
    assert_eq!(counts(&second), vec![1; 4]);

    // Acks above the floor keep the cursor; the lowest one moves it past the whole run.
    let r: Vec<&str> = first
        .iter()
        .chain(&second)
        .map(|m| m.receipt.as_str())
        .collect();
    assert_eq!(
        ack(&c, "q", "s", &[r[1], r[2]]).await,
        vec![ReceiptStatus::Acked; 2]
    );
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        st,
        SubState {
            cursor: 0,
            backlog: 2,
            in_flight: 6,
            delivered: 8,
            acked: 2,
            redelivered: 0,
            dead_lettered: 0
        },
        "after acking offsets 1 and 2"
    );
    assert_eq!(ack(&c, "q", "s", &[r[0]]).await, vec![ReceiptStatus::Acked]);
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (3, 2, 5, 3),
        "after acking offset 0 the cursor passes 0..=2: {st:?}"
    );

    // A second ack of a receipt is stale and changes nothing; results keep request order.
    assert_eq!(
        ack(&c, "q", "s", &[r[0], r[3]]).await,
        vec![ReceiptStatus::Stale, ReceiptStatus::Acked]
    );
    assert_eq!(ack(&c, "q", "s", &[r[1]]).await, vec![ReceiptStatus::Stale]);
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (4, 2, 4, 4),
        "stale acks count nothing: {st:?}"
    );

    // A pull or an ack on a follower is redirected and does nothing there.
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    c.wait_converged("q").await;
    for (op, body) in [
        ("pull", json!({"max": 10}).to_string()),
        ("ack", json!({"receipts": [r[4]]}).to_string()),
    ] {
        let path = format!("{}/{op}", sub_path("q", "s"));
        let a = call(&c, follower, Method::POST, &path, Some(&body)).await;
        let problem = a.expect_problem(&c, 307, "not_leader", &format!("{op} on a follower"));
        assert_eq!(
            a.location.as_deref(),
            Some(format!("{}{path}", c.url(leader)).as_str()),
            "Location of a {op} on a follower"
        );
        assert_eq!(problem["leader_id"], json!(leader), "{problem}");
    }
    let st = sub_now(&c, "q", "s").await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.delivered, st.acked),
        (4, 2, 4, 8, 4),
        "redirected requests changed the subscription: {st:?}"
    );

    // What is left: 8 and 9 only, then nothing.
    let third = pull(&c, "q", "s", json!({"max": 10})).await;
    assert_eq!(offsets(&third), vec![8, 9], "{third:?}");
    let started = Instant::now();
    let empty = pull(&c, "q", "s", json!({"max": 10, "wait_ms": 0})).await;
    assert!(empty.is_empty(), "every record is leased: {empty:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "wait_ms 0 must answer at once"
    );
    let rest: Vec<&str> = second[1..]
        .iter()
        .chain(&third)
        .map(|m| m.receipt.as_str())
        .chain([r[4]])
        .collect();
    assert_eq!(
        ack(&c, "q", "s", &rest).await,
        vec![ReceiptStatus::Acked; 6]
    );
    let st = wait_sub_everywhere(&c, "q", "s", Duration::from_secs(20), |st| {
        if st.cursor == 10 {
            Ok(())
        } else {
            Err("cursor not at 10".into())
        }
    })
    .await;
    assert_eq!(
        st,
        SubState {
            cursor: 10,
            backlog: 0,
            in_flight: 0,
            delivered: 10,
            acked: 10,
            redelivered: 0,
            dead_lettered: 0
        }
    );
}

// ----- 3 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_keeps_position_delay_holds_back_and_extend() {
    let c = Cluster::start(3).await;
    c.create_topic("n").await;
    c.publish_values("n", &values(6, "n")).await;
    create_sub(&c, "n", "s", json!({"ack_timeout_ms": 60000})).await;

    let first = pull(&c, "n", "s", json!({"max": 3})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2]);
    assert_eq!(
        nack(&c, "n", "s", &[&first[1].receipt], 0, false).await,
        vec![ReceiptStatus::Released]
    );
    let st = sub_now(&c, "n", "s").await;
    assert_eq!(
        (st.cursor, st.in_flight, st.backlog),
        (0, 2, 4),
        "after the nack: {st:?}"
    );

    // The released record comes back at its position, before later fresh records.
    let second = pull(&c, "n", "s", json!({"max": 2})).await;
    assert_eq!(
        offsets(&second),
        vec![1, 3],
        "redelivery first, in offset order: {second:?}"
    );
    assert_eq!(counts(&second), vec![2, 1], "{second:?}");
    assert_ne!(
        second[0].receipt, first[1].receipt,
        "a new delivery has a new receipt"
    );
    assert_eq!(second[0].value.as_deref(), Some("n/1"));
    let st = sub_now(&c, "n", "s").await;
    assert_eq!((st.delivered, st.redelivered), (5, 1), "{st:?}");
    // The nacked delivery is over.
    assert_eq!(
        ack(&c, "n", "s", &[&first[1].receipt]).await,
        vec![ReceiptStatus::Stale]
    );

    // A nack delay holds the record back; a long-poll gets it once the delay is over (the
    // leader ticks by itself: nothing else is written meanwhile).
    let nacked_at = Instant::now();
    assert_eq!(
        nack(&c, "n", "s", &[&second[0].receipt], 1500, false).await,
        vec![ReceiptStatus::Released]
    );
    let now = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 0})).await;
    assert_eq!(
        offsets(&now),
        vec![4, 5],
        "offset 1 is delayed 1.5 s: {now:?}"
    );
    assert!(
        nacked_at.elapsed() < Duration::from_millis(1400),
        "the immediate pull took too long to prove anything ({:?})",
        nacked_at.elapsed()
    );
    let later = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 10000})).await;
    let waited = nacked_at.elapsed();
    assert_eq!(offsets(&later), vec![1], "after the delay: {later:?}");
    assert_eq!(counts(&later), vec![3], "{later:?}");
    assert!(
        waited >= Duration::from_millis(1450),
        "a record nacked with delay_ms 1500 was delivered again after {waited:?}"
    );
    assert!(
        waited <= Duration::from_millis(1500 + 5000),
        "the long-poll should answer soon after the delay ends, not after {waited:?}"
    );

    // Extend: a later expiry, counted from the extend.
    let target = &second[1]; // offset 3, leased for 60 s
    let results = settle(
        &c,
        "n",
        "s",
        "extend",
        &[&first[1].receipt, &target.receipt],
        json!({"ack_timeout_ms": 120000}),
    )
    .await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Stale, ReceiptStatus::Extended],
        "{results:?}"
    );
    let extended_to = results[1]
        .lease_expires_ms
        .unwrap_or_else(|| c.fail(&format!("extended without lease_expires_ms: {results:?}")));
    assert!(
        extended_to >= target.lease_expires_ms + 60_000,
        "extend by 120 s after a 60 s lease must end at least 60 s later: {} -> {extended_to}",
        target.lease_expires_ms
    );

    // Extend really keeps the record leased: a 1 s lease extended to 60 s is not delivered
    // again 2.5 s later.
    c.publish_values("n", &["n/6".to_string()]).await;
    let short = pull(&c, "n", "s", json!({"max": 1, "ack_timeout_ms": 1000})).await;
    assert_eq!(offsets(&short), vec![6]);
    let results = settle(
        &c,
        "n",
        "s",
        "extend",
        &[&short[0].receipt],
        json!({"ack_timeout_ms": 60000}),
    )
    .await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Extended],
        "{results:?}"
    );
    assert!(
        results[0].lease_expires_ms.unwrap_or(0) >= short[0].lease_expires_ms + 59_000,
        "{results:?} vs {short:?}"
    );
    let waited_from = Instant::now();
    let none = pull(&c, "n", "s", json!({"max": 10, "wait_ms": 2500})).await;
    assert!(
        none.is_empty(),
        "the extended lease (and all others) must hold: got {none:?}"
    );
    assert!(
        waited_from.elapsed() >= Duration::from_millis(2400),
        "an empty long-poll answered before its wait ended: {:?}",
        waited_from.elapsed()
    );

    // Ack everything live; then every old receipt is stale for each operation.
    let live: Vec<&str> = [
        &first[0], &first[2], &second[1], &now[0], &now[1], &later[0], &short[0],
    ]
    .iter()
    .map(|m| m.receipt.as_str())
    .collect();
    assert_eq!(
        ack(&c, "n", "s", &live).await,
        vec![ReceiptStatus::Acked; 7]
    );
    assert_eq!(
        nack(&c, "n", "s", &[live[0]], 0, false).await,
        vec![ReceiptStatus::Stale],
        "nack of an acked receipt"
    );
    let results = settle(&c, "n", "s", "extend", &[live[1]], json!({})).await;
    assert_eq!(
        statuses(&results),
        vec![ReceiptStatus::Stale],
        "extend of an acked receipt"
    );
    let st = wait_sub_everywhere(&c, "n", "s", Duration::from_secs(20), |st| {
        if st.cursor == 7 {
            Ok(())
        } else {
            Err("cursor not at 7".into())
        }
    })
    .await;
    assert_eq!(
        st,
        SubState {
            cursor: 7,
            backlog: 0,
            in_flight: 0,
            delivered: 9,
            acked: 7,
            redelivered: 2,
            dead_lettered: 0
        }
    );
}

// ----- 4 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_redelivered_first_and_stale_receipt() {
    let c = Cluster::start(3).await;
    c.create_topic("e").await;
    c.publish_values("e", &values(5, "e")).await;
    create_sub(&c, "e", "s", json!({"ack_timeout_ms": 1000})).await;

    // A consumer pulls 5, acks 3 of them (not the lowest), then dies.
    let pulled_at = Instant::now();
    let first = pull(&c, "e", "s", json!({"max": 5})).await;
    assert_eq!(offsets(&first), vec![0, 1, 2, 3, 4]);
    let r: Vec<&str> = first.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "e", "s", &[r[1], r[3], r[4]]).await,
        vec![ReceiptStatus::Acked; 3]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!((st.cursor, st.acked), (0, 3), "{st:?}");

    // Another consumer long-polls: nothing is available until the 1 s leases expire, and
    // nobody writes meanwhile, so only the leader's own tick can answer it.
    let again = pull(
        &c,
        "e",
        "s",
        json!({"max": 1, "wait_ms": 10000, "ack_timeout_ms": 60000}),
    )
    .await;
    let waited = pulled_at.elapsed();
    assert_eq!(
        offsets(&again),
        vec![0],
        "the lowest expired record first: {again:?}"
    );
    assert_eq!(counts(&again), vec![2], "{again:?}");
    assert!(
        waited >= Duration::from_millis(950),
        "a 1 s lease was delivered again after {waited:?}"
    );
    assert!(
        waited <= Duration::from_millis(1000 + 4000),
        "the expired lease took {waited:?} to be delivered again (does the leader tick?)"
    );

    // With fresh records available too, the expired one still comes first.
    c.publish_values("e", &values(7, "e")[5..]).await;
    let more = pull(&c, "e", "s", json!({"max": 10, "ack_timeout_ms": 60000})).await;
    assert_eq!(
        offsets(&more),
        vec![2, 5, 6],
        "expired record before fresh ones: {more:?}"
    );
    assert_eq!(counts(&more), vec![2, 1, 1], "{more:?}");
    let got: Vec<Option<&str>> = more.iter().map(|m| m.value.as_deref()).collect();
    assert_eq!(
        got,
        vec![Some("e/2"), Some("e/5"), Some("e/6")],
        "each message carries its own record, across a gap in the offsets"
    );

    // The dead consumer's receipts of the two redelivered records are stale.
    assert_eq!(
        ack(&c, "e", "s", &[r[0], r[2]]).await,
        vec![ReceiptStatus::Stale, ReceiptStatus::Stale]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(
        (
            st.cursor,
            st.in_flight,
            st.acked,
            st.delivered,
            st.redelivered
        ),
        (0, 4, 3, 9, 2),
        "stale acks change nothing: {st:?}"
    );

    // Ack the redelivered 0: the cursor stops at 2, the first unacked offset...
    assert_eq!(
        ack(&c, "e", "s", &[&again[0].receipt]).await,
        vec![ReceiptStatus::Acked]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(st.cursor, 2, "{st:?}");
    // ...and a stream read with the subscription (no `from`) resumes there, on any node,
    // not after the fifth record that was delivered.
    let leader = c.leader_id().await;
    let page = c.read(leader, "e", "subscription=s").await;
    assert_eq!(
        page.records.first().map(|r| r.offset),
        Some(2),
        "a read with the subscription must start at the first unacked offset: {page:?}"
    );
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2, 3, 4, 5, 6]
    );
    c.wait_converged("e").await;
    wait_sub_everywhere(&c, "e", "s", Duration::from_secs(20), |st| {
        if st.cursor == 2 {
            Ok(())
        } else {
            Err("cursor not 2".into())
        }
    })
    .await;
    let follower = c.follower_id().await;
    let page = c.read(follower, "e", "subscription=s").await;
    assert_eq!(
        page.records.first().map(|r| r.offset),
        Some(2),
        "on follower {follower}: {page:?}"
    );
    // The read itself moved nothing.
    assert_eq!(sub_now(&c, "e", "s").await.cursor, 2);

    let rest: Vec<&str> = more.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "e", "s", &rest).await,
        vec![ReceiptStatus::Acked; 3]
    );
    let st = sub_now(&c, "e", "s").await;
    assert_eq!(
        (st.cursor, st.in_flight, st.backlog, st.acked),
        (7, 0, 0, 7),
        "{st:?}"
    );
}

// ----- 5 ---------------------------------------------------------------------------------------

/// Checks a dead letter against its origin record.
fn check_dead_letter(
    c: &Cluster,
    dl: &Record,
    origin: &Value,
    offset: u64,
    reason: &str,
    deliveries: u32,
) {
    let mut want: BTreeMap<String, String> = origin["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    want.insert("raftq-dead-letter-topic".into(), "t".into());
    want.insert("raftq-dead-letter-offset".into(), offset.to_string());
    want.insert("raftq-dead-letter-subscription".into(), "s".into());
    want.insert("raftq-dead-letter-reason".into(), reason.into());
    want.insert(
        "raftq-dead-letter-delivery-count".into(),
        deliveries.to_string(),
    );
    let ok = dl.value.as_deref() == origin["value"].as_str()
        && dl.key.as_deref() == origin["key"].as_str()
        && dl.headers == want;
    if !ok {
        c.fail(&format!(
            "dead letter of t/{offset} ({reason}, {deliveries} deliveries): expected value {}, key \
             {}, headers {want:?}; got {dl:?}",
            origin["value"], origin["key"]
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_deliveries_dead_letters_exactly_once() {
    let c = Cluster::start(3).await;
    c.create_topic("t").await;
    c.create_topic("t.dlq").await;
    create_sub(
        &c,
        "t",
        "s",
        json!({"max_deliveries": 2, "dead_letter_topic": "t.dlq", "ack_timeout_ms": 60000}),
    )
    .await;
    let poison = json!({"value": "poison", "key": "k0", "headers": {"h": "v", "trace": "abc"}});
    let fine = json!({"value": "fine"});
    publish_json(&c, "t", json!([poison.clone(), fine.clone()])).await;

    // Nacked twice: the second nack reaches max_deliveries and dead-letters it.
    let m = pull(&c, "t", "s", json!({"max": 1})).await;
    assert_eq!((offsets(&m), counts(&m)), (vec![0], vec![1]));
    assert_eq!(
        nack(&c, "t", "s", &[&m[0].receipt], 0, false).await,
        vec![ReceiptStatus::Released]
    );
    let m = pull(&c, "t", "s", json!({"max": 1})).await;
    assert_eq!((offsets(&m), counts(&m)), (vec![0], vec![2]));
    assert_eq!(
        nack(&c, "t", "s", &[&m[0].receipt], 0, false).await,
        vec![ReceiptStatus::DeadLettered],
        "a nack of the delivery that reached max_deliveries"
    );
    let leader = c.leader_id().await;
    let dlq = c.read(leader, "t.dlq", "from=first").await;
    assert_eq!(dlq.records.len(), 1, "one dead letter: {dlq:?}");
    check_dead_letter(&c, &dlq.records[0], &poison, 0, "max_deliveries", 2);

    // Never delivered again; the cursor moves past it once 1 is acked.
    let m = pull(&c, "t", "s", json!({"max": 10})).await;
    assert_eq!(
        offsets(&m),
        vec![1],
        "the dead letter must not come back: {m:?}"
    );
    assert_eq!(
        ack(&c, "t", "s", &[&m[0].receipt]).await,
        vec![ReceiptStatus::Acked]
    );
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        (
            st.cursor,
            st.dead_lettered,
            st.acked,
            st.in_flight,
            st.backlog
        ),
        (2, 1, 1, 0, 0),
        "{st:?}"
    );

    // Expired twice: dead-lettered by the state machine's own clock, with nobody writing.
    let poison2 = json!({"value": "poison-2", "key": "k2"});
    publish_json(&c, "t", json!([poison2.clone()])).await;
    let m = pull(&c, "t", "s", json!({"max": 1, "ack_timeout_ms": 300})).await;
    assert_eq!((offsets(&m), counts(&m)), (vec![2], vec![1]));
    let m = pull(
        &c,
        "t",
        "s",
        json!({"max": 1, "wait_ms": 10000, "ack_timeout_ms": 300}),
    )
    .await;
    assert_eq!(
        (offsets(&m), counts(&m)),
        (vec![2], vec![2]),
        "after the first expiry"
    );
    let cl = &c;
    c.wait_for(
        "the twice-expired record to be dead-lettered",
        Duration::from_secs(10),
        move || async move {
            let leader = cl.agreed_leader().await?;
            let page = cl.read(leader, "t.dlq", "from=first").await;
            if page.records.len() == 2 {
                Ok(())
            } else {
                Err(format!("t.dlq holds {} records", page.records.len()))
            }
        },
    )
    .await;
    let none = pull(&c, "t", "s", json!({"max": 10, "wait_ms": 1000})).await;
    assert!(none.is_empty(), "a dead letter came back: {none:?}");
    let st = sub_now(&c, "t", "s").await;
    assert_eq!(
        (st.cursor, st.dead_lettered, st.in_flight),
        (3, 2, 0),
        "{st:?}"
    );

    // nack with dead_letter: true dead-letters at once, reason "nack".
    let bad = json!({"value": "bad", "headers": {"why": "schema"}});
    publish_json(&c, "t", json!([bad.clone()])).await;
    let m = pull(&c, "t", "s", json!({"max": 1})).await;
    assert_eq!((offsets(&m), counts(&m)), (vec![3], vec![1]));
    assert_eq!(
        nack(&c, "t", "s", &[&m[0].receipt], 0, true).await,
        vec![ReceiptStatus::DeadLettered]
    );
    assert_eq!(
        nack(&c, "t", "s", &[&m[0].receipt], 0, true).await,
        vec![ReceiptStatus::Stale]
    );

    // Exactly once each, the same on every node.
    let dlq = c.consistent_log("t.dlq").await;
    assert_eq!(dlq.len(), 3, "three dead letters, once each: {dlq:?}");
    check_dead_letter(&c, &dlq[0], &poison, 0, "max_deliveries", 2);
    check_dead_letter(&c, &dlq[1], &poison2, 2, "max_deliveries", 2);
    check_dead_letter(&c, &dlq[2], &bad, 3, "nack", 1);
    let st = wait_sub_everywhere(&c, "t", "s", Duration::from_secs(20), |st| {
        if st.cursor == 4 {
            Ok(())
        } else {
            Err("cursor not 4".into())
        }
    })
    .await;
    assert_eq!(
        (
            st.cursor,
            st.dead_lettered,
            st.acked,
            st.in_flight,
            st.backlog
        ),
        (4, 3, 1, 0, 0),
        "{st:?}"
    );
    let none = pull(&c, "t", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");

    // Without a dead-letter topic the record is discarded and counted.
    c.create_topic("u").await;
    c.publish_values("u", &["u/0".to_string(), "u/1".to_string()])
        .await;
    create_sub(&c, "u", "d", json!({"max_deliveries": 1})).await;
    let before = next_offsets(&c).await;
    let m = pull(&c, "u", "d", json!({"max": 1})).await;
    assert_eq!((offsets(&m), counts(&m)), (vec![0], vec![1]));
    assert_eq!(
        nack(&c, "u", "d", &[&m[0].receipt], 0, false).await,
        vec![ReceiptStatus::DeadLettered],
        "max_deliveries 1 is reached by the first delivery"
    );
    let st = sub_now(&c, "u", "d").await;
    assert_eq!(
        (
            st.cursor,
            st.dead_lettered,
            st.acked,
            st.in_flight,
            st.backlog
        ),
        (1, 1, 0, 0, 1),
        "{st:?}"
    );
    assert_eq!(
        next_offsets(&c).await,
        before,
        "a discarded record must go to no topic"
    );
    let m = pull(&c, "u", "d", json!({"max": 10})).await;
    assert_eq!(
        offsets(&m),
        vec![1],
        "the discarded record must not come back: {m:?}"
    );
}

// ----- 6 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_leader_change() {
    let c = Cluster::start(3).await;
    c.create_topic("l").await;
    c.publish_values("l", &values(3, "l")).await;
    create_sub(&c, "l", "s", json!({"ack_timeout_ms": 60000})).await;

    let old = c.leader_id().await;
    let path = format!("{}/pull", sub_path("l", "s"));
    let a = call(
        &c,
        old,
        Method::POST,
        &path,
        Some(&json!({"max": 1}).to_string()),
    )
    .await;
    let m: PullResponse = a.json(&c, 200, "pull on the leader");
    assert_eq!(offsets(&m.messages), vec![0]);
    let receipt = m.messages[0].receipt.clone();

    c.kill(old);
    let new = c.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new, old);
    // The lease is in the new leader's state: offset 0 is not available.
    let rest = pull(&c, "l", "s", json!({"max": 10})).await;
    assert_eq!(
        offsets(&rest),
        vec![1, 2],
        "offset 0 is still leased: {rest:?}"
    );

    // The receipt issued by the old leader is acked through the new one.
    let path = format!("{}/ack", sub_path("l", "s"));
    let a = call(
        &c,
        new,
        Method::POST,
        &path,
        Some(&json!({"receipts": [receipt]}).to_string()),
    )
    .await;
    let results: ReceiptResults = a.json(&c, 200, "ack through the new leader");
    assert_eq!(
        statuses(&results.results),
        vec![ReceiptStatus::Acked],
        "{results:?}"
    );
    let rest: Vec<&str> = rest.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "l", "s", &rest).await,
        vec![ReceiptStatus::Acked; 2]
    );
    let none = pull(&c, "l", "s", json!({"max": 10, "wait_ms": 1500})).await;
    assert!(none.is_empty(), "an acked record came back: {none:?}");

    c.restart(old).await;
    c.wait_converged("l").await;
    let st = wait_sub_everywhere(&c, "l", "s", Duration::from_secs(30), |st| {
        if st.cursor == 3 {
            Ok(())
        } else {
            Err("cursor not 3".into())
        }
    })
    .await;
    assert_eq!(
        st,
        SubState {
            cursor: 3,
            backlog: 0,
            in_flight: 0,
            delivered: 3,
            acked: 3,
            redelivered: 0,
            dead_lettered: 0
        },
        "on every node, the restarted one included"
    );
    let none = pull(&c, "l", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");
}

// ----- 7 ---------------------------------------------------------------------------------------

const TOTAL: u64 = 5000;
const CONSUMERS: usize = 4;
const ACK_TIMEOUT_MS: u64 = 5000;
/// Simulated processing time per batch: keeps consumption running long enough for two
/// leader kills (about 25 batches per consumer).
const WORK: Duration = Duration::from_millis(200);

/// Some fields are only read through `Debug` in failure messages.
#[allow(dead_code)]
#[derive(Debug, Clone)]
struct Delivery {
    consumer: usize,
    offset: u64,
    receipt: String,
    delivery_count: u32,
    lease_expires_ms: u64,
    /// When the pull that answered was sent (since the start of consumption).
    invoked: Duration,
    answered: Duration,
}

#[allow(dead_code)]
#[derive(Debug, Clone)]
struct AckOutcome {
    consumer: usize,
    offset: u64,
    receipt: String,
    status: ReceiptStatus,
    invoked: Duration,
    answered: Duration,
    /// An earlier attempt of this very ack had an unknown outcome.
    after_unknown: bool,
}

#[derive(Debug, Default)]
struct Stats {
    pulls: usize,
    empty_pulls: usize,
    pulls_unknown: usize,
    acks: usize,
    acks_unknown: usize,
    redirects: usize,
    unavailable: usize,
}

struct Consumers {
    http: reqwest::Client,
    urls: Vec<String>,
    leader: Mutex<Option<String>>,
    t0: Instant,
    stop: AtomicBool,
    hard_deadline: Instant,
    deliveries: Mutex<Vec<Delivery>>,
    acks: Mutex<Vec<AckOutcome>>,
    /// Receipts (with their offsets) of acks whose outcome was unknown at least once.
    unknown_acks: Mutex<Vec<(String, u64)>>,
    acked: Mutex<Vec<bool>>,
    acked_count: AtomicUsize,
    /// Requests sent and not answered yet, so that a kill can hit one in flight.
    pulls_in_flight: AtomicUsize,
    acks_in_flight: AtomicUsize,
    odd: Mutex<Vec<String>>,
    stats: Mutex<Stats>,
}

impl Consumers {
    async fn leader(&self) -> Option<String> {
        if let Some(url) = self.leader.lock().unwrap().clone() {
            return Some(url);
        }
        for url in &self.urls {
            let Ok(resp) = self
                .http
                .get(format!("{url}/v1/cluster"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
            else {
                continue;
            };
            if !resp.status().is_success() {
                continue;
            }
            let Ok(status) = resp.json::<ClusterStatus>().await else {
                continue;
            };
            if let Some(leader) = status.leader_url {
                let leader = leader.trim_end_matches('/').to_string();
                *self.leader.lock().unwrap() = Some(leader.clone());
                return Some(leader);
            }
        }
        None
    }

    fn forget(&self, url: &str) {
        let mut leader = self.leader.lock().unwrap();
        if leader.as_deref() == Some(url) {
            *leader = None;
        }
    }

    /// After a definite refusal: follow a 307's leader_url, or look for the leader again.
    fn redirected(&self, url: &str, status: u16, body: &[u8]) {
        let mut stats = self.stats.lock().unwrap();
        if status == 307 {
            stats.redirects += 1;
        } else {
            stats.unavailable += 1;
        }
        drop(stats);
        let target = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            v["leader_url"]
                .as_str()
                .map(|s| s.trim_end_matches('/').to_string())
        });
        match (status, target) {
            (307, Some(target)) => *self.leader.lock().unwrap() = Some(target),
            _ => self.forget(url),
        }
    }

    fn odd(&self, what: String) {
        self.odd.lock().unwrap().push(what);
    }

    async fn run(self: Arc<Self>, consumer: usize) {
        let pull_body = json!({
            "max": 50, "wait_ms": 1000, "ack_timeout_ms": ACK_TIMEOUT_MS,
            "consumer": format!("c{consumer}"),
        });
        while !self.stop.load(Ordering::SeqCst) && Instant::now() < self.hard_deadline {
            let Some(leader) = self.leader().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let invoked = self.t0.elapsed();
            self.pulls_in_flight.fetch_add(1, Ordering::SeqCst);
            let sent = self
                .http
                .post(format!("{leader}/v1/topics/jobs/subscriptions/s/pull"))
                .json(&pull_body)
                .timeout(Duration::from_secs(6))
                .send()
                .await;
            let (status, body) = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    match resp.bytes().await {
                        Ok(body) => (status, body),
                        Err(_) => (0, Default::default()),
                    }
                }
                Err(_) => (0, Default::default()),
            };
            self.pulls_in_flight.fetch_sub(1, Ordering::SeqCst);
            let answered = self.t0.elapsed();
            match status {
                200 => {}
                307 | 503 => {
                    self.redirected(&leader, status, &body);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                0 | 500..=599 => {
                    // Unknown outcome: the leases (if any) expire and the records come back.
                    self.stats.lock().unwrap().pulls_unknown += 1;
                    self.forget(&leader);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                other => {
                    self.odd(format!(
                        "c{consumer}: pull answered {other}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            let messages = match serde_json::from_slice::<PullResponse>(&body) {
                Ok(resp) => resp.messages,
                Err(e) => {
                    self.odd(format!(
                        "c{consumer}: undecodable pull answer ({e}): {}",
                        String::from_utf8_lossy(&body)
                    ));
                    continue;
                }
            };
            {
                let mut stats = self.stats.lock().unwrap();
                stats.pulls += 1;
                if messages.is_empty() {
                    stats.empty_pulls += 1;
                }
            }
            if messages.is_empty() {
                continue;
            }
            {
                let mut deliveries = self.deliveries.lock().unwrap();
                for m in &messages {
                    if m.value.as_deref() != Some(format!("w/{}", m.offset).as_str()) {
                        self.odd(format!(
                            "c{consumer}: wrong payload for offset {}: {m:?}",
                            m.offset
                        ));
                    }
                    deliveries.push(Delivery {
                        consumer,
                        offset: m.offset,
                        receipt: m.receipt.clone(),
                        delivery_count: m.delivery_count,
                        lease_expires_ms: m.lease_expires_ms,
                        invoked,
                        answered,
                    });
                }
            }
            tokio::time::sleep(WORK).await;
            self.ack_all(consumer, &messages).await;
        }
    }

    /// Acks `messages` until the outcome is known (retrying unknown outcomes with the same
    /// receipts) or the hard deadline passes.
    async fn ack_all(&self, consumer: usize, messages: &[Message]) {
        let receipts: Vec<&str> = messages.iter().map(|m| m.receipt.as_str()).collect();
        let body = json!({ "receipts": receipts });
        let mut after_unknown = false;
        while Instant::now() < self.hard_deadline {
            let Some(leader) = self.leader().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let invoked = self.t0.elapsed();
            self.acks_in_flight.fetch_add(1, Ordering::SeqCst);
            let sent = self
                .http
                .post(format!("{leader}/v1/topics/jobs/subscriptions/s/ack"))
                .json(&body)
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            let (status, bytes) = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    match resp.bytes().await {
                        Ok(body) => (status, body),
                        Err(_) => (0, Default::default()),
                    }
                }
                Err(_) => (0, Default::default()),
            };
            self.acks_in_flight.fetch_sub(1, Ordering::SeqCst);
            let answered = self.t0.elapsed();
            match status {
                200 => {}
                307 | 503 => {
                    self.redirected(&leader, status, &bytes);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                0 | 500..=599 => {
                    self.stats.lock().unwrap().acks_unknown += 1;
                    if !after_unknown {
                        let mut unknown = self.unknown_acks.lock().unwrap();
                        for m in messages {
                            unknown.push((m.receipt.clone(), m.offset));
                        }
                    }
                    after_unknown = true;
                    self.forget(&leader);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                other => {
                    self.odd(format!(
                        "c{consumer}: ack answered {other}: {}",
                        String::from_utf8_lossy(&bytes)
                    ));
                    return;
                }
            }
            let results = match serde_json::from_slice::<ReceiptResults>(&bytes) {
                Ok(r) => r.results,
                Err(e) => {
                    self.odd(format!(
                        "c{consumer}: undecodable ack answer ({e}): {}",
                        String::from_utf8_lossy(&bytes)
                    ));
                    return;
                }
            };
            let echoed: Vec<&str> = results.iter().map(|r| r.receipt.as_str()).collect();
            if echoed != receipts {
                self.odd(format!(
                    "c{consumer}: ack results do not answer the receipts in order: {results:?}"
                ));
                return;
            }
            self.stats.lock().unwrap().acks += 1;
            let mut acks = self.acks.lock().unwrap();
            let mut acked = self.acked.lock().unwrap();
            for (m, result) in messages.iter().zip(&results) {
                if !matches!(result.status, ReceiptStatus::Acked | ReceiptStatus::Stale) {
                    self.odd(format!("c{consumer}: an ack answered {result:?}"));
                }
                if result.status == ReceiptStatus::Acked && !acked[m.offset as usize] {
                    acked[m.offset as usize] = true;
                    self.acked_count.fetch_add(1, Ordering::SeqCst);
                }
                acks.push(AckOutcome {
                    consumer,
                    offset: m.offset,
                    receipt: m.receipt.clone(),
                    status: result.status,
                    invoked,
                    answered,
                    after_unknown,
                });
            }
            return;
        }
        self.odd(format!(
            "c{consumer}: an ack got no known outcome before the deadline"
        ));
    }
}

/// Judges a consumer history (see `four_consumers_leader_killed_twice`): every offset below
/// `total` acked at least once (or possibly acked by an ack whose answer was lost), never two
/// `acked` results for one offset, no delivery by a pull sent after an ack of that record was
/// answered `acked`, no delivery after the acked delivery, no receipt issued twice, no two
/// deliveries with the same count, and never two overlapping leases of one record (each
/// delivery's lease starts, in leader time, at or after the previous one ended). Returns the
/// violations and how many offsets only had acks whose outcome was unknown.
fn consumer_violations(
    deliveries: &[Delivery],
    acks: &[AckOutcome],
    unknown_receipts: &BTreeSet<String>,
    total: u64,
    ack_timeout_ms: u64,
) -> (Vec<String>, usize) {
    let mut violations = Vec::new();
    let mut by_offset: BTreeMap<u64, Vec<&Delivery>> = BTreeMap::new();
    let mut receipts: HashMap<&str, &Delivery> = HashMap::new();
    for d in deliveries {
        if d.offset >= total {
            violations.push(format!("delivered an offset that does not exist: {d:?}"));
        }
        if let Some(other) = receipts.insert(d.receipt.as_str(), d) {
            violations.push(format!("receipt issued twice: {other:?} and {d:?}"));
        }
        by_offset.entry(d.offset).or_default().push(d);
    }
    let mut acked_results: BTreeMap<u64, Vec<&AckOutcome>> = BTreeMap::new();
    for a in acks {
        if a.status == ReceiptStatus::Acked {
            acked_results.entry(a.offset).or_default().push(a);
        }
    }
    let mut acked_unseen = 0;
    for offset in 0..total {
        let delivered = by_offset.get(&offset).cloned().unwrap_or_default();
        let acked = acked_results.get(&offset).cloned().unwrap_or_default();
        if acked.len() > 1 {
            violations.push(format!(
                "acked twice: offset {offset} has {} acked results: {acked:?}",
                acked.len()
            ));
        }
        if acked.is_empty() {
            let lost_ack = delivered
                .iter()
                .any(|d| unknown_receipts.contains(d.receipt.as_str()));
            if lost_ack {
                acked_unseen += 1;
            } else {
                violations.push(format!(
                    "never acked: offset {offset} (deliveries {delivered:?})"
                ));
            }
        }
        // Never delivered again once an ack was answered `acked`.
        if let Some(first_ack) = acked.iter().map(|a| a.answered).min() {
            for d in &delivered {
                if d.invoked > first_ack {
                    violations.push(format!(
                        "delivered after ack: offset {offset} delivered by a pull sent at {:?}, \
                         after an ack answered acked at {first_ack:?}: {d:?}; acks {acked:?}",
                        d.invoked
                    ));
                }
            }
        }
        if let Some(a) = acked.first() {
            let acked_count = receipts.get(a.receipt.as_str()).map(|d| d.delivery_count);
            for d in &delivered {
                if acked_count.is_some_and(|n| d.delivery_count > n) {
                    violations.push(format!(
                        "delivered after ack: offset {offset}: delivery {d:?} follows delivery \
                         #{acked_count:?}, which was acked"
                    ));
                }
            }
        }
        // Never leased twice at once: each delivery starts after the previous lease ended
        // (leader-stamped times; every lease is `ack_timeout_ms` long).
        let mut sorted = delivered.clone();
        sorted.sort_by_key(|d| d.delivery_count);
        for w in sorted.windows(2) {
            if w[0].delivery_count == w[1].delivery_count {
                violations.push(format!(
                    "same delivery_count: offset {offset} delivered twice as #{}: {:?} and {:?}",
                    w[0].delivery_count, w[0], w[1]
                ));
            } else if w[1].lease_expires_ms.saturating_sub(ack_timeout_ms) < w[0].lease_expires_ms {
                violations.push(format!(
                    "leased twice at once: offset {offset}: {:?} then {:?}",
                    w[0], w[1]
                ));
            }
        }
    }
    (violations, acked_unseen)
}

async fn wait_acked(c: &Cluster, consumers: &Arc<Consumers>, target: usize, timeout: Duration) {
    let shared = consumers.clone();
    c.wait_for(
        &format!("{target} of {TOTAL} records acked by the consumers"),
        timeout,
        move || {
            let n = shared.acked_count.load(Ordering::SeqCst);
            let stats = format!("{:?}", shared.stats.lock().unwrap());
            async move {
                if n >= target {
                    Ok(())
                } else {
                    Err(format!("{n} acked; {stats}"))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_consumers_leader_killed_twice() {
    let test_started = Instant::now();
    let c = Cluster::start(3).await;
    c.create_topic("jobs").await;
    for batch in 0..(TOTAL / 500) {
        let vals: Vec<String> = (batch * 500..(batch + 1) * 500)
            .map(|i| format!("w/{i}"))
            .collect();
        let ack = c.publish_values("jobs", &vals).await;
        assert_eq!(ack.first_offset, batch * 500, "{ack:?}");
    }
    create_sub(&c, "jobs", "s", json!({"ack_timeout_ms": ACK_TIMEOUT_MS})).await;

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("HTTP client");
    let t0 = Instant::now();
    let shared = Arc::new(Consumers {
        http,
        urls: c.urls(),
        leader: Mutex::new(None),
        t0,
        stop: AtomicBool::new(false),
        hard_deadline: t0 + Duration::from_secs(90),
        deliveries: Mutex::new(Vec::new()),
        acks: Mutex::new(Vec::new()),
        unknown_acks: Mutex::new(Vec::new()),
        acked: Mutex::new(vec![false; TOTAL as usize]),
        acked_count: AtomicUsize::new(0),
        pulls_in_flight: AtomicUsize::new(0),
        acks_in_flight: AtomicUsize::new(0),
        odd: Mutex::new(Vec::new()),
        stats: Mutex::new(Stats::default()),
    });
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|i| tokio::spawn(shared.clone().run(i)))
        .collect();

    // Two leader SIGKILLs, at about 1/3 and 2/3, each node restarted after a new election.
    // The first hits a pull in flight (its answer, and maybe its leases, are lost), the second
    // an ack in flight (applied or not, the consumer cannot know), when the timing allows.
    let mut kills = Vec::new();
    for (k, target) in [(1, TOTAL as usize / 3), (2, 2 * TOTAL as usize / 3)] {
        wait_acked(&c, &shared, target, Duration::from_secs(40)).await;
        let old = c.leader_id().await;
        let in_flight = if k == 1 {
            &shared.pulls_in_flight
        } else {
            &shared.acks_in_flight
        };
        let aim_until = Instant::now() + Duration::from_secs(5);
        while in_flight.load(Ordering::SeqCst) == 0 && Instant::now() < aim_until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let hit = in_flight.load(Ordering::SeqCst);
        let at = shared.acked_count.load(Ordering::SeqCst);
        if at >= TOTAL as usize {
            c.fail(&format!(
                "consumption finished before leader kill #{k}: the test proves nothing (slow WORK?)"
            ));
        }
        c.kill(old);
        let killed = Instant::now();
        let new = c.wait_leader(Duration::from_secs(20)).await;
        assert_ne!(new, old);
        let elected = killed.elapsed();
        c.restart(old).await;
        let kind = if k == 1 { "pulls" } else { "acks" };
        kills.push(format!(
            "kill #{k}: node {old} at {at} acked ({:?}, {hit} {kind} in flight), node {new} leads \
             {elected:?} later",
            t0.elapsed()
        ));
    }

    // Until every offset is acked (or acked by an ack whose answer was lost: then the
    // subscription's cursor must say it is done).
    let sh = shared.clone();
    let cl = &c;
    c.wait_for(
        "every record to be acked",
        Duration::from_secs(90).saturating_sub(t0.elapsed()),
        move || {
            let sh = sh.clone();
            async move {
                let n = sh.acked_count.load(Ordering::SeqCst);
                if n == TOTAL as usize {
                    return Ok(());
                }
                let missing: Vec<u64> = {
                    let acked = sh.acked.lock().unwrap();
                    (0..TOTAL).filter(|o| !acked[*o as usize]).collect()
                };
                let unknown: BTreeSet<u64> = sh
                    .unknown_acks
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, o)| *o)
                    .collect();
                let stats = format!("{:?}", sh.stats.lock().unwrap());
                if missing.iter().all(|o| unknown.contains(o)) {
                    let leader = cl.agreed_leader().await?;
                    let st = sub_state(cl, leader, "jobs", "s").await?;
                    if st.cursor == TOTAL {
                        return Ok(());
                    }
                }
                Err(format!(
                    "{n} of {TOTAL} acked; first missing {:?}; {stats}",
                    &missing[..missing.len().min(10)]
                ))
            }
        },
    )
    .await;
    shared.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        if let Err(e) = tokio::time::timeout(Duration::from_secs(30), task).await {
            c.fail(&format!("a consumer did not stop: {e}"));
        }
    }
    let consumed_in = t0.elapsed();

    let odd = shared.odd.lock().unwrap().clone();
    if !odd.is_empty() {
        c.fail(&format!(
            "{} unexpected answers, the first: \n  {}",
            odd.len(),
            odd[..odd.len().min(20)].join("\n  ")
        ));
    }

    // ----- judge the history -----
    let deliveries = shared.deliveries.lock().unwrap().clone();
    let acks = shared.acks.lock().unwrap().clone();
    let unknown_receipts: BTreeSet<String> = shared
        .unknown_acks
        .lock()
        .unwrap()
        .iter()
        .map(|(r, _)| r.clone())
        .collect();
    let (violations, acked_unseen) =
        consumer_violations(&deliveries, &acks, &unknown_receipts, TOTAL, ACK_TIMEOUT_MS);
    let doubled_acks = acks
        .iter()
        .filter(|a| a.after_unknown && a.status == ReceiptStatus::Stale)
        .count();
    if !violations.is_empty() {
        c.fail(&format!(
            "{} violations of the subscription's promises, the first:\n  {}",
            violations.len(),
            violations[..violations.len().min(30)].join("\n  ")
        ));
    }

    // Every node ends with the cursor at the end and nothing in flight.
    c.wait_converged("jobs").await;
    let st = wait_sub_everywhere(&c, "jobs", "s", Duration::from_secs(30), |st| {
        if st.cursor == TOTAL && st.in_flight == 0 {
            Ok(())
        } else {
            Err(format!("not cursor {TOTAL} / in_flight 0"))
        }
    })
    .await;
    assert_eq!(st.backlog, 0, "{st:?}");
    assert_eq!(st.acked, TOTAL, "each record acked exactly once: {st:?}");
    assert_eq!(
        st.delivered - st.redelivered,
        TOTAL,
        "first deliveries must be exactly one per record: {st:?}"
    );
    assert!(
        st.delivered >= deliveries.len() as u64,
        "the server counted fewer deliveries ({}) than the consumers saw ({}): {st:?}",
        st.delivered,
        deliveries.len()
    );
    let stats = shared.stats.lock().unwrap();
    eprintln!(
        "{}; {} deliveries seen ({} on the server, {} redelivered), {} ack results, {acked_unseen} \
         records acked by lost answers, {doubled_acks} stale after unknown; {stats:?}; consumed in \
         {consumed_in:?}, test took {:?}",
        kills.join("; "),
        deliveries.len(),
        st.delivered,
        st.redelivered,
        acks.len(),
        test_started.elapsed()
    );
}

/// A negative control for the judge of `four_consumers_leader_killed_twice`: histories that
/// ack twice, deliver after an ack, never ack, lease twice at once, reuse a receipt or repeat a
/// delivery count must all be reported. A checker that cannot see these proves nothing.
#[test]
fn consumer_history_checker_sees_every_kind_of_violation() {
    let ms = Duration::from_millis;
    let delivery = |offset: u64, receipt: &str, count: u32, expires: u64, invoked: u64| Delivery {
        consumer: 0,
        offset,
        receipt: receipt.to_string(),
        delivery_count: count,
        lease_expires_ms: expires,
        invoked: ms(invoked),
        answered: ms(invoked + 5),
    };
    let ack = |offset: u64, receipt: &str, status: ReceiptStatus, answered: u64| AckOutcome {
        consumer: 0,
        offset,
        receipt: receipt.to_string(),
        status,
        invoked: ms(answered - 5),
        answered: ms(answered),
        after_unknown: false,
    };
    use ReceiptStatus::{Acked, Stale};
    // Offset 0: delivered, expired, delivered again and acked; the first receipt is stale.
    // Offset 1: acked by an ack whose answer was lost (the retry says stale).
    let deliveries = vec![
        delivery(0, "a", 1, 10_000, 0),
        delivery(0, "b", 2, 15_000, 6_000),
        delivery(1, "c", 1, 10_000, 0),
    ];
    let acks = vec![
        ack(0, "a", Stale, 6_100),
        ack(0, "b", Acked, 6_200),
        ack(1, "c", Stale, 400),
    ];
    let unknown: BTreeSet<String> = ["c".to_string()].into();
    let (violations, unseen) = consumer_violations(&deliveries, &acks, &unknown, 2, 5000);
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(unseen, 1);

    let cases: Vec<(&str, Vec<Delivery>, Vec<AckOutcome>, &str)> = vec![
        (
            "two acked results",
            deliveries.clone(),
            [acks.clone(), vec![ack(0, "b", Acked, 6_300)]].concat(),
            "acked twice",
        ),
        (
            "never acked",
            deliveries.clone(),
            vec![ack(0, "b", Acked, 6_200)],
            "never acked",
        ),
        (
            "a pull sent after the ack answered",
            [deliveries.clone(), vec![delivery(0, "d", 3, 30_000, 7_000)]].concat(),
            acks.clone(),
            "delivered after ack",
        ),
        (
            "leases overlapping",
            vec![
                delivery(0, "a", 1, 10_000, 0),
                delivery(0, "b", 2, 14_000, 6_000),
                delivery(1, "c", 1, 10_000, 0),
            ],
            acks.clone(),
            "leased twice at once",
        ),
        (
            "a receipt issued twice",
            [deliveries.clone(), vec![delivery(1, "a", 2, 20_000, 0)]].concat(),
            acks.clone(),
            "receipt issued twice",
        ),
        (
            "two deliveries with one count",
            [deliveries.clone(), vec![delivery(1, "e", 1, 20_000, 0)]].concat(),
            acks.clone(),
            "same delivery_count",
        ),
    ];
    for (name, deliveries, acks, expected) in cases {
        // Without the lost ack, offset 1 has no `acked` at all.
        let unknown = if expected == "never acked" {
            BTreeSet::new()
        } else {
            unknown.clone()
        };
        let (violations, _) = consumer_violations(&deliveries, &acks, &unknown, 2, 5000);
        assert!(
            violations.iter().any(|v| v.starts_with(expected)),
            "{name}: expected a {expected:?} violation, got {violations:?}"
        );
    }
}

// ----- 8 ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_with_subscription_moves_cursor_forward_only() {
    let c = Cluster::start(3).await;
    c.create_topic("r").await;
    c.publish_values("r", &values(10, "r")).await;
    create_sub(&c, "r", "s", json!({"ack_timeout_ms": 60000})).await;
    let leader = c.leader_id().await;

    // from=4 with the subscription: everything before 4 is done.
    let page = c.read(leader, "r", "subscription=s&from=4&max=3").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    assert_eq!(page.next_offset, 7);
    let st = sub_now(&c, "r", "s").await;
    assert_eq!(
        (st.cursor, st.backlog),
        (4, 6),
        "the read moved the cursor to 4: {st:?}"
    );
    // Without from: resume at the cursor, moving nothing.
    let page = c.read(leader, "r", "subscription=s&max=2").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 4);
    // A from below the cursor reads from there but never moves the cursor back.
    let page = c.read(leader, "r", "subscription=s&from=2&max=1").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 4);

    // On a follower, a read that would move the cursor is a write: 307 to the leader.
    c.wait_converged("r").await;
    wait_sub_everywhere(&c, "r", "s", Duration::from_secs(20), |st| {
        if st.cursor == 4 {
            Ok(())
        } else {
            Err("cursor not 4".into())
        }
    })
    .await;
    let leader = c.leader_id().await;
    let follower = c.follower_id().await;
    let path = "/v1/topics/r/records?subscription=s&from=6";
    let a = call(&c, follower, Method::GET, path, None).await;
    a.expect_problem(&c, 307, "not_leader", "a cursor-moving read on a follower");
    assert_eq!(
        a.location.as_deref(),
        Some(format!("{}{path}", c.url(leader)).as_str())
    );
    assert_eq!(
        sub_now(&c, "r", "s").await.cursor,
        4,
        "a redirected read moved the cursor"
    );
    // A follower serves a read without from at the cursor.
    let page = c.read(follower, "r", "subscription=s").await;
    assert_eq!(page.records.first().map(|r| r.offset), Some(4), "{page:?}");

    // A stream reader passing next_offset commits as it goes; pulls start at the cursor.
    let page = c.read(leader, "r", "subscription=s&from=7&max=1").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![7]
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 7);
    let leased = pull(&c, "r", "s", json!({"max": 2})).await;
    assert_eq!(
        offsets(&leased),
        vec![7, 8],
        "pull starts at the cursor: {leased:?}"
    );
    // Reading past leased records says they are done: their receipts become stale.
    let page = c.read(leader, "r", "subscription=s&from=9").await;
    assert_eq!(
        page.records.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![9]
    );
    let st = sub_now(&c, "r", "s").await;
    assert_eq!((st.cursor, st.in_flight, st.backlog), (9, 0, 1), "{st:?}");
    assert_eq!(
        ack(&c, "r", "s", &[&leased[0].receipt, &leased[1].receipt]).await,
        vec![ReceiptStatus::Stale; 2],
        "receipts the cursor moved past"
    );

    // PUT cursor: backward needs allow_backward.
    let cursor = format!("{}/cursor", sub_path("r", "s"));
    let (_, a) = call_leader(
        &c,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 3}).to_string()),
    )
    .await;
    a.expect_problem(
        &c,
        400,
        "invalid_argument",
        "moving the cursor back without allow_backward",
    );
    assert_eq!(
        sub_now(&c, "r", "s").await.cursor,
        9,
        "a refused move changed the cursor"
    );
    let a = call(
        &c,
        follower,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 3, "allow_backward": true}).to_string()),
    )
    .await;
    a.expect_problem(&c, 307, "not_leader", "PUT cursor on a follower");
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 9);
    let (_, a) = call_leader(
        &c,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 3, "allow_backward": true}).to_string()),
    )
    .await;
    let moved: Value = a.json(&c, 200, "moving the cursor back with allow_backward");
    assert_eq!(moved["cursor"], json!(3), "{moved}");
    let st = sub_now(&c, "r", "s").await;
    assert_eq!((st.cursor, st.backlog, st.in_flight), (3, 7, 0), "{st:?}");
    let again = pull(&c, "r", "s", json!({"max": 100})).await;
    assert_eq!(
        offsets(&again),
        (3..10).collect::<Vec<_>>(),
        "records after the new cursor are delivered again: {again:?}"
    );

    // Forward up to the topic's next offset; above it is refused.
    let (_, a) = call_leader(
        &c,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 11}).to_string()),
    )
    .await;
    a.expect_problem(&c, 400, "invalid_argument", "cursor above next_offset");
    let (_, a) = call_leader(
        &c,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 11, "allow_backward": true}).to_string()),
    )
    .await;
    a.expect_problem(
        &c,
        400,
        "invalid_argument",
        "cursor above next_offset, allow_backward",
    );
    assert_eq!(sub_now(&c, "r", "s").await.cursor, 3);
    let (_, a) = call_leader(
        &c,
        Method::PUT,
        &cursor,
        Some(&json!({"offset": 10}).to_string()),
    )
    .await;
    let moved: Value = a.json(&c, 200, "moving the cursor to next_offset");
    assert_eq!(moved["cursor"], json!(10), "{moved}");
    let r: Vec<&str> = again.iter().map(|m| m.receipt.as_str()).collect();
    assert_eq!(
        ack(&c, "r", "s", &r[..2]).await,
        vec![ReceiptStatus::Stale; 2]
    );
    let st = wait_sub_everywhere(&c, "r", "s", Duration::from_secs(20), |st| {
        if st.cursor == 10 {
            Ok(())
        } else {
            Err("cursor not 10".into())
        }
    })
    .await;
    assert_eq!(
        (st.cursor, st.backlog, st.in_flight, st.acked),
        (10, 0, 0, 0),
        "{st:?}"
    );
    let none = pull(&c, "r", "s", json!({"max": 10})).await;
    assert!(none.is_empty(), "{none:?}");
}
