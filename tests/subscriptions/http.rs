//! Raw HTTP for the subscription tests: every request goes to a node or to the
//! leader without following redirects, so status codes, problem codes and `Location` headers
//! are checked exactly.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use raftq_client::api::{Message, PullResponse, ReceiptResult, ReceiptResults, ReceiptStatus};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::common::{Cluster, PROBLEM_JSON};
use crate::{Answer, SubState};

impl Answer {
    /// The body as `T` after checking the status; fails the test otherwise.
    pub(crate) fn json<T: DeserializeOwned>(&self, c: &Cluster, status: u16, what: &str) -> T {
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
    pub(crate) fn problem(&self, status: u16, code: &str) -> Result<Value, String> {
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

    pub(crate) fn expect_problem(&self, c: &Cluster, status: u16, code: &str, what: &str) -> Value {
        self.problem(status, code)
            .unwrap_or_else(|e| c.fail(&format!("{what}: {e}")))
    }
}

/// Sends `method path` with an optional raw JSON body to node `id`; a transport error fails.
pub(crate) async fn call(
    c: &Cluster,
    id: u64,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> Answer {
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
pub(crate) async fn call_leader(
    c: &Cluster,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> (u64, Answer) {
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

pub(crate) fn sub_path(topic: &str, sub: &str) -> String {
    format!("/v1/topics/{topic}/subscriptions/{sub}")
}

/// `GET .../subscriptions/{sub}` on node `id`; `Err` unless 200 with the contract's fields.
pub(crate) async fn sub_state(
    c: &Cluster,
    id: u64,
    topic: &str,
    sub: &str,
) -> Result<SubState, String> {
    c.try_get_json(id, &sub_path(topic, sub), Duration::from_secs(5))
        .await
}

/// The subscription as the current leader serves it (which has applied every answered write).
pub(crate) async fn sub_now(c: &Cluster, topic: &str, sub: &str) -> SubState {
    let leader = c.leader_id().await;
    sub_state(c, leader, topic, sub)
        .await
        .unwrap_or_else(|e| c.fail(&e))
}

/// Waits until every running node serves the same state of the subscription and `pred`
/// accepts it; returns it.
pub(crate) async fn wait_sub_everywhere<P>(
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

/// Waits until every running node serves the same state of the subscription with its cursor
/// at `cursor`; returns it.
pub(crate) async fn wait_cursor_everywhere(
    c: &Cluster,
    topic: &str,
    sub: &str,
    cursor: u64,
    timeout: Duration,
) -> SubState {
    wait_sub_everywhere(c, topic, sub, timeout, |st| {
        if st.cursor == cursor {
            Ok(())
        } else {
            Err(format!("cursor not at {cursor}"))
        }
    })
    .await
}

/// A three-node cluster with topic `topic` holding `values(n, topic)` and subscription `s` on
/// it, created with `config`.
pub(crate) async fn cluster_with_sub(topic: &str, n: usize, config: Value) -> Cluster {
    let c = Cluster::start(3).await;
    c.create_topic(topic).await;
    c.publish_values(topic, &values(n, topic)).await;
    create_sub(&c, topic, "s", config).await;
    c
}

/// Creates subscription `sub` on `topic` with `config` (201 expected).
pub(crate) async fn create_sub(c: &Cluster, topic: &str, sub: &str, config: Value) {
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
pub(crate) async fn pull(c: &Cluster, topic: &str, sub: &str, body: Value) -> Vec<Message> {
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

pub(crate) fn offsets(messages: &[Message]) -> Vec<u64> {
    messages.iter().map(|m| m.offset).collect()
}

pub(crate) fn counts(messages: &[Message]) -> Vec<u32> {
    messages.iter().map(|m| m.delivery_count).collect()
}

/// ack / nack / extend on the leader (200 expected): one result per receipt, in request order.
pub(crate) async fn settle(
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

pub(crate) fn statuses(results: &[ReceiptResult]) -> Vec<ReceiptStatus> {
    results.iter().map(|r| r.status).collect()
}

pub(crate) async fn ack(
    c: &Cluster,
    topic: &str,
    sub: &str,
    receipts: &[&str],
) -> Vec<ReceiptStatus> {
    statuses(&settle(c, topic, sub, "ack", receipts, json!({})).await)
}

pub(crate) async fn nack(
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

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

pub(crate) fn values(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}/{i}")).collect()
}

/// Publishes raw JSON records (with keys and headers) on the leader.
pub(crate) async fn publish_json(c: &Cluster, topic: &str, records: Value) {
    let body = json!({ "records": records }).to_string();
    let path = format!("/v1/topics/{topic}/records");
    let (_, answer) = call_leader(c, Method::POST, &path, Some(&body)).await;
    let _: Value = answer.json(c, 200, &format!("publish {body}"));
}

/// `GET /v1/topics` on the leader: name -> next_offset.
pub(crate) async fn next_offsets(c: &Cluster) -> BTreeMap<String, u64> {
    let leader = c.leader_id().await;
    c.topics(leader)
        .await
        .topics
        .into_iter()
        .map(|t| (t.name, t.next_offset))
        .collect()
}
