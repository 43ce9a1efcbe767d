//! Raw HTTP against the nodes (redirects never followed): requests, JSON answers, problems,
//! topics, records, and the convergence of every node on one log.

use std::time::{Duration, Instant};

use raftq_client::api::{
    Problem, PublishResponse, ReadResponse, Record, RecordIn, TopicInfo, TopicList,
};
use reqwest::header::{HeaderMap, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::{Cluster, POLL, PROBLEM_JSON};

impl Cluster {
    /// Sends `request`; a transport error fails the test (with `what` and the logs).
    pub async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> reqwest::Response {
        match request.send().await {
            Ok(resp) => resp,
            Err(e) => self.fail(&format!("{what}: transport error: {e:?}")),
        }
    }

    /// The running nodes other than `node`.
    pub fn running_except(&self, node: u64) -> Vec<u64> {
        let mut ids = self.running_ids();
        ids.retain(|id| *id != node);
        ids
    }

    /// Kills every node but the leader, which is then alone: it may append entries but can
    /// never commit them. Returns the leader and the nodes killed.
    pub async fn isolate_leader(&self) -> (u64, Vec<u64>) {
        let leader = self.leader_id().await;
        let followers = self.running_except(leader);
        for id in &followers {
            self.kill(*id);
        }
        (leader, followers)
    }

    /// `Ok` when leader `id`'s own log (as its `/v1/cluster` says) ends beyond its commit
    /// index: it appended an entry it has not committed.
    pub async fn appended_beyond_commit(&self, id: u64) -> Result<(), String> {
        let status = self.status(id).await?;
        let own = status.matched_index(id);
        match own {
            Some(end) if end > status.commit_index => Ok(()),
            _ => Err(format!(
                "log end {own:?}, commit index {}",
                status.commit_index
            )),
        }
    }

    /// `{method} {path}` without a body to node `node`; the raw answer.
    pub async fn call(&self, method: reqwest::Method, node: u64, path: &str) -> reqwest::Response {
        let what = format!("{method} {path} on node {node}");
        let url = format!("{}{path}", self.url(node));
        self.send(self.http.request(method, url), &what).await
    }

    /// Creates subscription `sub` of `topic` starting at its first record, on the leader.
    pub async fn subscribe_from_first(&self, topic: &str, sub: &str) -> Value {
        self.leader_json(
            reqwest::Method::PUT,
            &format!("/v1/topics/{topic}/subscriptions/{sub}"),
            json!({"start": "first"}),
        )
        .await
    }

    /// `POST {path}` with a JSON body to the current leader; the raw answer.
    pub async fn post_to_leader(&self, path: &str, body: &Value) -> reqwest::Response {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        self.send(self.http.post(url).json(body), &format!("POST {path}"))
            .await
    }

    /// `METHOD {path}` with a JSON body on the current leader, expecting a 2xx; its JSON
    /// answer (`Null` when it has none).
    pub async fn leader_json(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        let what = format!("{method} {path} on leader {leader}");
        let resp = self
            .send(self.http.request(method, url).json(&body), &what)
            .await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        if !(200..300).contains(&status) {
            self.fail(&format!("{what} answered {status}: {text}"));
        }
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Pulls `pull` messages of `topic`/`sub` on the leader (leases of 10 minutes) and acks the
    /// first `ack` of them; the receipts of all that were pulled.
    pub async fn pull_and_ack(
        &self,
        topic: &str,
        sub: &str,
        pull: usize,
        ack: usize,
    ) -> Vec<Value> {
        let base = format!("/v1/topics/{topic}/subscriptions/{sub}");
        let pulled = self
            .leader_json(
                reqwest::Method::POST,
                &format!("{base}/pull"),
                json!({"max": pull, "ack_timeout_ms": 600_000}),
            )
            .await;
        let receipts: Vec<Value> = pulled["messages"]
            .as_array()
            .map(|m| m.iter().map(|m| m["receipt"].clone()).collect())
            .unwrap_or_default();
        if receipts.len() != pull {
            self.fail(&format!("pulled {} of {pull}: {pulled}", receipts.len()));
        }
        self.leader_json(
            reqwest::Method::POST,
            &format!("{base}/ack"),
            json!({"receipts": receipts[..ack]}),
        )
        .await;
        receipts
    }

    /// Creates `topic` with `until_acked` retention and the subscriptions `subs` of it (their
    /// default configuration), on the leader.
    pub async fn create_until_acked_topic(&self, topic: &str, subs: &[&str]) {
        self.put_json(
            &format!("/v1/topics/{topic}"),
            &json!({"retention": {"until_acked": true}}),
        )
        .await;
        for sub in subs {
            self.put_json(
                &format!("/v1/topics/{topic}/subscriptions/{sub}"),
                &json!({}),
            )
            .await;
        }
    }

    /// `PUT {path}` with a JSON body on the current leader, expecting 200 or 201 (creating a
    /// topic or a subscription).
    pub async fn put_json(&self, path: &str, body: &Value) {
        let leader = self.wait_leader(Duration::from_secs(20)).await;
        let url = format!("{}{path}", self.url(leader));
        let resp = self
            .send(self.http.put(url).json(body), &format!("PUT {path}"))
            .await;
        let status = resp.status().as_u16();
        if status != 200 && status != 201 {
            let text = resp.text().await.unwrap_or_default();
            self.fail(&format!("PUT {path} answered {status}: {text}"));
        }
    }

    /// `GET {path}` on node `id`, expecting 200 and a JSON body of type `T`.
    pub async fn get_json<T: DeserializeOwned>(&self, id: u64, path: &str) -> T {
        let what = format!("GET {path} on node {id}");
        let resp = self
            .send(self.http.get(format!("{}{path}", self.url(id))), &what)
            .await;
        self.json_of(resp, 200, &what).await
    }

    /// The body of `resp` as `T`, after checking its status is `status`.
    pub async fn json_of<T: DeserializeOwned>(
        &self,
        resp: reqwest::Response,
        status: u16,
        what: &str,
    ) -> T {
        let got = resp.status().as_u16();
        let body = resp.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        if got != status {
            self.fail(&format!(
                "{what}: expected status {status}, got {got}: {text}"
            ));
        }
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| self.fail(&format!("{what}: undecodable answer ({e}): {text}")))
    }

    /// Checks that `resp` is an RFC 9457 problem with `status` and `code` and every field
    /// API.md names; returns it and the answer's headers.
    pub async fn check_problem(
        resp: reqwest::Response,
        status: u16,
        code: &str,
    ) -> Result<(Problem, HeaderMap), String> {
        let got = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading the body: {e}"))?;
        let text = String::from_utf8_lossy(&body);
        if got != status {
            return Err(format!("expected {status} {code}, got {got}: {text}"));
        }
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with(PROBLEM_JSON) {
            return Err(format!(
                "content-type is {content_type:?}, not {PROBLEM_JSON}; body: {text}"
            ));
        }
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("problem body is not JSON ({e}): {text}"))?;
        for field in ["type", "title", "detail", "code"] {
            if !value[field].is_string() {
                return Err(format!(
                    "problem field {field:?} missing or not a string: {text}"
                ));
            }
        }
        if value["status"].as_u64() != Some(u64::from(status)) {
            return Err(format!("problem field \"status\" is not {status}: {text}"));
        }
        if value["code"] != code {
            return Err(format!("expected code {code:?}: {text}"));
        }
        let problem: Problem = serde_json::from_value(value).map_err(|e| {
            format!("problem does not decode as raftq_client::api::Problem ({e}): {text}")
        })?;
        Ok((problem, headers))
    }

    /// [`Cluster::check_problem`], failing the test on a mismatch.
    pub async fn expect_problem(
        &self,
        resp: reqwest::Response,
        status: u16,
        code: &str,
        what: &str,
    ) -> (Problem, HeaderMap) {
        match Self::check_problem(resp, status, code).await {
            Ok(answer) => answer,
            Err(e) => self.fail(&format!("{what}: {e}")),
        }
    }

    /// [`Cluster::expect_problem`] for a 503 `no_leader`, which must carry `Retry-After`.
    pub async fn expect_no_leader(&self, resp: reqwest::Response, what: &str) -> Problem {
        let (problem, headers) = self.expect_problem(resp, 503, "no_leader", what).await;
        assert!(
            headers.get(RETRY_AFTER).is_some(),
            "{what}: 503 no_leader must carry Retry-After"
        );
        problem
    }

    /// `GET /v1/topics` on node `id`.
    pub async fn topics(&self, id: u64) -> TopicList {
        self.get_json(id, "/v1/topics").await
    }

    /// `GET /v1/topics/{name}` on node `id`: `Err` with the answer when it is not 200.
    pub async fn topic(&self, id: u64, name: &str) -> Result<TopicInfo, String> {
        self.try_get_json(id, &format!("/v1/topics/{name}"), Duration::from_secs(5))
            .await
    }

    /// `GET {path}` on node `id` with a `timeout`, decoded as `T`: `Err` saying what went
    /// wrong when the request fails, the answer is not 200 or it does not decode.
    pub async fn try_get_json<T: DeserializeOwned>(
        &self,
        id: u64,
        path: &str,
        timeout: Duration,
    ) -> Result<T, String> {
        let resp = self
            .http
            .get(format!("{}{path}", self.url(id)))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("GET {path} on node {id}: {e}"))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status != StatusCode::OK {
            return Err(format!("GET {path} on node {id} answered {status}: {body}"));
        }
        serde_json::from_str(&body)
            .map_err(|e| format!("GET {path} on node {id}: undecodable ({e}): {body}"))
    }

    /// `GET /v1/topics/{topic}/records?{query}` on node `id`, expecting 200.
    pub async fn read(&self, id: u64, topic: &str, query: &str) -> ReadResponse {
        self.get_json(id, &format!("/v1/topics/{topic}/records?{query}"))
            .await
    }

    /// Every record of `topic` as node `id` serves it: reads from `first`, page after page,
    /// until the high watermark.
    pub async fn read_all(&self, id: u64, topic: &str) -> Vec<Record> {
        let mut records = Vec::new();
        let mut from = String::from("first");
        loop {
            let page = self
                .read(id, topic, &format!("from={from}&max=10000"))
                .await;
            let progressed = !page.records.is_empty();
            records.extend(page.records);
            if page.next_offset >= page.high_watermark {
                return records;
            }
            if !progressed {
                self.fail(&format!(
                    "node {id}: reading {topic} from {from} returned no record although \
                     next_offset {} < high_watermark {}",
                    page.next_offset, page.high_watermark
                ));
            }
            from = page.next_offset.to_string();
        }
    }

    /// A three-node cluster with topic `topic` holding the text `values`, applied on every
    /// node.
    pub async fn start_with_values(topic: &str, values: &[String]) -> Cluster {
        let c = Cluster::start(3).await;
        c.create_topic(topic).await;
        c.publish_values(topic, values).await;
        c.wait_converged(topic).await;
        c
    }

    /// Creates `name` on the leader with the default configuration (201 expected). Definite
    /// refusals caused by a leader change (307, 503) are retried.
    pub async fn create_topic(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leader = self.leader_id().await;
            let what = format!("PUT /v1/topics/{name} on leader {leader}");
            let resp = self
                .send(
                    self.http
                        .put(format!("{}/v1/topics/{name}", self.url(leader)))
                        .json(&json!({})),
                    &what,
                )
                .await;
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            match status {
                201 => return,
                307 | 503 if Instant::now() < deadline => tokio::time::sleep(POLL).await,
                _ => self.fail(&format!("{what}: expected 201, got {status}: {body}")),
            }
        }
    }

    /// Publishes text `values` as one batch on the leader, raw (no SDK), and returns the
    /// answer. Definite refusals caused by a leader change (307, 503) are retried.
    pub async fn publish_values(&self, topic: &str, values: &[String]) -> PublishResponse {
        let records: Vec<RecordIn> = values.iter().map(|v| RecordIn::text(v.clone())).collect();
        let body = json!({ "records": records });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let leader = self.leader_id().await;
            let what = format!(
                "publishing {} records to {topic} on leader {leader}",
                values.len()
            );
            let resp = self
                .send(
                    self.http
                        .post(format!("{}/v1/topics/{topic}/records", self.url(leader)))
                        .json(&body),
                    &what,
                )
                .await;
            let status = resp.status().as_u16();
            if (status == 307 || status == 503) && Instant::now() < deadline {
                tokio::time::sleep(POLL).await;
                continue;
            }
            return self.json_of(resp, 200, &what).await;
        }
    }

    /// Waits (at most 30 s) until every running node agrees on a leader, has applied at least
    /// up to the leader's commit index, and serves the same `next_offset` for `topic`.
    pub async fn wait_converged(&self, topic: &str) {
        let cluster = self;
        let what = format!("every running node to apply everything committed (topic {topic})");
        self.wait_for(&what, Duration::from_secs(30), move || async move {
            let leader = cluster.agreed_leader().await?;
            let leader_status = cluster.status(leader).await?;
            let leader_topic = cluster.topic(leader, topic).await?;
            for id in cluster.running_ids() {
                let status = cluster.status(id).await?;
                if status.last_applied < leader_status.commit_index {
                    return Err(format!(
                        "node {id} applied up to {} < the leader's commit index {}",
                        status.last_applied, leader_status.commit_index
                    ));
                }
                let info = cluster.topic(id, topic).await?;
                if info.summary.next_offset != leader_topic.summary.next_offset {
                    return Err(format!(
                        "node {id} has next_offset {} for {topic}, the leader {}",
                        info.summary.next_offset, leader_topic.summary.next_offset
                    ));
                }
            }
            Ok(())
        })
        .await;
    }

    /// Waits for convergence, reads all of `topic` from every running node separately, checks
    /// that the offsets are dense from 0 and that every node returns the very same records,
    /// and returns them.
    pub async fn consistent_log(&self, topic: &str) -> Vec<Record> {
        self.wait_converged(topic).await;
        let mut logs = Vec::new();
        for id in self.running_ids() {
            logs.push((id, self.read_all(id, topic).await));
        }
        let (first_id, first) = &logs[0];
        for (i, record) in first.iter().enumerate() {
            if record.offset != i as u64 {
                self.fail(&format!(
                    "node {first_id}: topic {topic} is not dense from 0: position {i} holds \
                     offset {} ({:?})",
                    record.offset, record.value
                ));
            }
        }
        for (id, log) in &logs[1..] {
            if log != first {
                let at = first
                    .iter()
                    .zip(log.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(first.len().min(log.len()));
                self.fail(&format!(
                    "nodes {first_id} and {id} diverge on topic {topic}: {} vs {} records, first \
                     difference at position {at}: {:?} vs {:?}",
                    first.len(),
                    log.len(),
                    first.get(at),
                    log.get(at)
                ));
            }
        }
        first.clone()
    }
}
