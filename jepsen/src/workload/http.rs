//! The raw HTTP client of the workloads and the nemeses.
//!
//! It never follows redirects by itself and never reuses a connection: every request is a fresh
//! connect to one node, so each answer says exactly which node gave it, and a killed node never
//! leaves a stale pooled connection behind (whose failure would be indeterminate). A `307` is
//! followed by hand to the leader it names (at most [`MAX_HOPS`] times) within one operation.
//!
//! Every answer is classified as API.md defines outcomes:
//! - `2xx`: [`Class::Ok`];
//! - `4xx` (a `307` left unfollowed included), `503` `no_leader`/`shutting_down`, and a request
//!   that never left (the connection was refused or could not be made): [`Class::Fail`];
//! - anything else (timeout, reset, other 5xx): [`Class::Info`].

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Most redirects followed within one operation.
pub const MAX_HOPS: usize = 3;
/// Connect timeout; shorter than every request timeout, so a connect that cannot finish is
/// reported as a connect error (a definite failure) rather than as a timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// How an answer counts in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Ok,
    Fail,
    Info,
}

/// The final answer of one operation.
#[derive(Debug, Clone)]
pub struct Answer {
    pub class: Class,
    /// The node that gave this answer (after following redirects).
    pub node: u64,
    /// HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// The body as JSON (`Null` when there was none or it was not JSON).
    pub body: Value,
    /// A short description for fail and info: the problem code or the transport error.
    pub error: Option<String>,
    /// A leader named by a `307` or a problem body.
    pub leader_hint: Option<u64>,
}

impl Answer {
    /// The body decoded as `T`, when the answer is ok.
    pub fn decode<T: DeserializeOwned>(&self) -> Option<T> {
        if self.class != Class::Ok {
            return None;
        }
        serde_json::from_value(self.body.clone()).ok()
    }

    /// The problem code of an error answer.
    pub fn code(&self) -> Option<&str> {
        self.body.get("code").and_then(Value::as_str)
    }

    /// True when the request never reached the node or the node had no leader: worth trying
    /// another node.
    pub fn should_rotate(&self) -> bool {
        match self.class {
            Class::Ok => false,
            Class::Info => true,
            Class::Fail => self.status.is_none_or(|s| s == 503 || s == 307),
        }
    }
}

/// A client for every node of a cluster.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    urls: BTreeMap<u64, String>,
}

impl Http {
    /// A client for the nodes `id -> base URL`.
    pub fn new(urls: BTreeMap<u64, String>) -> anyhow::Result<Http> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .connect_timeout(CONNECT_TIMEOUT)
            .no_proxy()
            .build()?;
        Ok(Http { client, urls })
    }

    /// Node ids, lowest first.
    pub fn ids(&self) -> Vec<u64> {
        self.urls.keys().copied().collect()
    }

    /// The node after `id` in id order (wrapping around).
    pub fn next_node(&self, id: u64) -> u64 {
        self.urls
            .range(id + 1..)
            .next()
            .or_else(|| self.urls.iter().next())
            .map_or(id, |(id, _)| *id)
    }

    fn node_of_url(&self, url: &str) -> Option<u64> {
        self.urls
            .iter()
            .find(|(_, base)| {
                url.strip_prefix(base.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
            .map(|(id, _)| *id)
    }

    /// Sends `method path` with an optional JSON body to `node`, following redirects, with
    /// `timeout` for each request.
    pub async fn send(
        &self,
        node: u64,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Answer {
        let mut node = node;
        let mut path = path.to_string();
        let mut leader_hint = None;
        for hop in 0..=MAX_HOPS {
            let Some(base) = self.urls.get(&node) else {
                return Answer {
                    class: Class::Fail,
                    node,
                    status: None,
                    body: Value::Null,
                    error: Some(format!("no node {node}")),
                    leader_hint,
                };
            };
            let mut request = self
                .client
                .request(method.clone(), format!("{base}{path}"))
                .timeout(timeout);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(err) => return transport_error(node, &err, leader_hint),
            };
            let status = response.status();
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let bytes = match response.bytes().await {
                Ok(bytes) => bytes,
                Err(err) => return transport_error(node, &err, leader_hint),
            };
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if let Some(id) = body.get("leader_id").and_then(Value::as_u64) {
                leader_hint = Some(id);
            }
            if status == StatusCode::TEMPORARY_REDIRECT && hop < MAX_HOPS {
                let target = location.as_deref().and_then(|loc| {
                    let id = self.node_of_url(loc)?;
                    let rest = &loc[self.urls[&id].len()..];
                    Some((id, rest.to_string()))
                });
                if let Some((id, rest)) = target {
                    leader_hint = Some(id);
                    node = id;
                    path = rest;
                    continue;
                }
            }
            let code = body.get("code").and_then(Value::as_str).map(str::to_string);
            let class = classify(status, code.as_deref());
            let error = (class != Class::Ok).then(|| {
                format!(
                    "{} {}",
                    status.as_u16(),
                    code.unwrap_or_else(|| "(no code)".to_string())
                )
            });
            return Answer {
                class,
                node,
                status: Some(status.as_u16()),
                body,
                error,
                leader_hint,
            };
        }
        unreachable!("the last hop returns")
    }

    /// `GET /raft/status` on `node` with the cluster secret (the node's Raft view and its wall
    /// clock, `wall_us`), with the harness's wall clock in µs halfway through the request;
    /// `None` on any error.
    pub async fn raft_status(&self, node: u64, timeout: Duration) -> Option<(Value, u64)> {
        let base = self.urls.get(&node)?;
        let before = wall_us();
        let response = self
            .client
            .get(format!("{base}/raft/status"))
            .header(crate::hosts::SECRET_HEADER, crate::hosts::CLUSTER_SECRET)
            .timeout(timeout)
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body: Value = response.json().await.ok()?;
        let after = wall_us();
        Some((body, before / 2 + after / 2))
    }

    /// `POST path` with the JSON `body` to `node` (see [`Http::send`]).
    pub async fn post(&self, node: u64, path: &str, body: &Value, timeout: Duration) -> Answer {
        self.send(node, Method::POST, path, Some(body), timeout)
            .await
    }

    /// `GET path` on `node`, decoded; `None` on any error.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        node: u64,
        path: &str,
        timeout: Duration,
    ) -> Option<T> {
        self.send(node, Method::GET, path, None, timeout)
            .await
            .decode()
    }
}

/// Microseconds since the Unix epoch by the harness's wall clock.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Classifies an HTTP answer (API.md: "Durable acknowledgement").
pub fn classify(status: StatusCode, code: Option<&str>) -> Class {
    if status.is_success() {
        Class::Ok
    } else if status == StatusCode::SERVICE_UNAVAILABLE {
        match code {
            Some("no_leader" | "shutting_down") => Class::Fail,
            _ => Class::Info,
        }
    } else if status.is_client_error() || status.is_redirection() {
        Class::Fail
    } else {
        Class::Info
    }
}

fn transport_error(node: u64, err: &reqwest::Error, leader_hint: Option<u64>) -> Answer {
    // A connect error means the request never left this process: definitely not applied.
    let class = if err.is_connect() {
        Class::Fail
    } else {
        Class::Info
    };
    let kind = if err.is_connect() {
        "connect"
    } else if err.is_timeout() {
        "timeout"
    } else {
        "transport"
    };
    Answer {
        class,
        node,
        status: None,
        body: Value::Null,
        error: Some(format!("{kind}: {}", error_chain(err))),
        leader_hint,
    }
}

/// An error with its sources, on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_follows_api_md() {
        let cases = [
            (StatusCode::OK, None, Class::Ok),
            (StatusCode::CREATED, None, Class::Ok),
            (StatusCode::NOT_FOUND, Some("topic_not_found"), Class::Fail),
            (
                StatusCode::TOO_MANY_REQUESTS,
                Some("overloaded"),
                Class::Fail,
            ),
            (
                StatusCode::TEMPORARY_REDIRECT,
                Some("not_leader"),
                Class::Fail,
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("no_leader"),
                Class::Fail,
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("shutting_down"),
                Class::Fail,
            ),
            (StatusCode::SERVICE_UNAVAILABLE, None, Class::Info),
            (StatusCode::GATEWAY_TIMEOUT, Some("internal"), Class::Info),
            (StatusCode::INTERNAL_SERVER_ERROR, None, Class::Info),
        ];
        for (status, code, class) in cases {
            assert_eq!(classify(status, code), class, "{status} {code:?}");
        }
    }

    #[test]
    fn next_node_wraps() {
        let urls = (1..=3).map(|id| (id, format!("http://h{id}"))).collect();
        let http = Http::new(urls).unwrap();
        assert_eq!(http.next_node(1), 2);
        assert_eq!(http.next_node(3), 1);
        assert_eq!(http.node_of_url("http://h2/v1/x"), Some(2));
    }
}
