//! Sending one logical call to the cluster: node choice, leader redirects, retries, and the
//! classification of every failure as "not applied" or "may have been applied".
//!
//! This is where the SDK's honesty lives. Each HTTP exchange ends in one [`Attempt`]; the loop
//! in [`Transport::execute`] decides from it and from the call's [`Retry`] class whether
//! sending again is safe. The rule is: re-send only when the previous attempt definitely was
//! not applied, or when the server makes re-sending harmless (reads, idempotent writes).

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng as _;
use reqwest::header::{
    HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, LOCATION, RETRY_AFTER,
};
use reqwest::{Method, StatusCode, Url};
use tokio::time::Instant;

use crate::api::{ErrorCode, Problem};
use crate::error::Error;

/// First pause after a refusal; doubled after each one. Small, because a leader election in
/// raftq takes a few hundred milliseconds and a client should notice the new leader quickly.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(25);
/// Longest pause between attempts, and the most of a server's `Retry-After` honoured at once:
/// the next attempt often goes to another node, which the hint does not speak for.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Most redirects followed in a row before backing off: during an election two nodes may
/// briefly point at each other.
pub(crate) const MAX_REDIRECT_HOPS: u32 = 5;
/// An attempt is not started with less time than this left: it could only time out, and for a
/// write a time-out after sending turns a clean "not applied" into "unknown".
const MIN_ATTEMPT_TIME: Duration = Duration::from_millis(20);
/// Nodes learnt from redirects are remembered, but no more than this many in all, so a
/// misbehaving server cannot grow the list without bound.
const MAX_NODES: usize = 64;
/// How much of an unexpected body is quoted in an error.
const BODY_SNIPPET_CHARS: usize = 200;

/// What may be done after an attempt that might have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// A read: re-sending is harmless, so every failure is retried until the deadline.
    Read,
    /// A write that may safely be applied more than once: either it has the same effect however
    /// often it is applied (creating or deleting a topic or a subscription, a publish with
    /// `producer_id` and `sequence`, which the server deduplicates, an ack, nack or extend, a
    /// cursor move), or an extra application loses nothing (a pull: the leases of an answer that
    /// never arrived expire, and their records are delivered again). Retried like a read, but
    /// once an attempt may have been applied the deadline ends in [`Error::Indeterminate`], not
    /// [`Error::Unavailable`].
    IdempotentWrite,
    /// A write that would be applied twice if sent twice (a publish without idempotency data).
    /// Only definite refusals are retried; anything else ends the call as indeterminate.
    UnsafeWrite,
}

/// One logical API call, ready to be sent to any node as often as the rules allow.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: Method,
    /// Path and query relative to a node's base URL, without the leading slash
    /// (`v1/topics/orders/records?key=a`), so that base URLs with a path prefix work.
    pub target: String,
    /// The body and its content type. `Bytes` so each re-send is a cheap clone.
    pub body: Option<(Bytes, &'static str)>,
    pub retry: Retry,
    /// Time the server may legitimately hold the request before answering (a long-poll's
    /// wait). Added to both the per-attempt time-out and the call's deadline.
    pub hold: Duration,
}

/// A 2xx answer.
pub(crate) struct Answer {
    pub status: StatusCode,
    /// The answer's `Content-Type`, when it has one.
    pub content_type: Option<HeaderValue>,
    pub body: Bytes,
}

impl Answer {
    /// Whether the answer is in the content type `media` (parameters aside).
    pub fn is(&self, media: &str) -> bool {
        self.content_type
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(media))
    }
}

/// The outcome of one HTTP exchange, classified by what it says about the call's effect.
#[derive(Debug)]
enum Attempt {
    /// 2xx: applied (for a write), with the body to decode and its content type.
    Done(StatusCode, Option<HeaderValue>, Bytes),
    /// A definite refusal to hand to the caller (4xx other than 429).
    Refused(Problem),
    /// 307: not applied here; the leader is elsewhere.
    Redirect {
        location: Url,
        leader_base: Option<Url>,
    },
    /// Definitely not applied, worth trying again after a pause: no leader, shutting down,
    /// overloaded, or the connection was never made.
    NotApplied {
        detail: String,
        code: Option<ErrorCode>,
        retry_after: Option<Duration>,
        /// A leader named by a `shutting_down` answer.
        leader_base: Option<Url>,
        /// True when the node itself is the problem and another one should be tried.
        try_another_node: bool,
    },
    /// The request may have reached the server and been applied; nothing says either way.
    Unknown { detail: String },
}

/// The nodes this client knows and which one leads, shared by all clones of a client.
#[derive(Debug)]
struct Nodes {
    /// Base URLs, each ending in `/`. Only ever appended to, so indices stay valid.
    urls: Vec<Url>,
    /// The node that most recently answered as leader or was named as leader by a redirect.
    leader: Option<usize>,
    /// Where to start when no leader is known: moves past a node when it fails.
    next: usize,
}

impl Nodes {
    fn pick(&self) -> (usize, Url) {
        let index = self.leader.unwrap_or(self.next % self.urls.len());
        (index, self.urls[index].clone())
    }

    /// `index` failed to answer usefully: stop preferring it.
    fn failed(&mut self, index: usize) {
        if self.leader == Some(index) {
            self.leader = None;
        }
        // Only advance when nobody else has already: concurrent callers failing on the same
        // node must not skip its healthy neighbours.
        if self.next % self.urls.len() == index {
            self.next = (index + 1) % self.urls.len();
        }
    }

    /// Records `base` as the leader, adding it to the list if it is new. `None` when the list
    /// is full and the leader is unknown to it.
    fn remember_leader(&mut self, base: &Url) -> Option<usize> {
        let index = match self.urls.iter().position(|url| url == base) {
            Some(index) => index,
            None if self.urls.len() < MAX_NODES => {
                self.urls.push(base.clone());
                self.urls.len() - 1
            }
            None => return None,
        };
        self.leader = Some(index);
        Some(index)
    }
}

/// The shared state behind a [`Client`](crate::Client): one HTTP client (one connection pool)
/// and the cluster's node list.
#[derive(Debug)]
pub(crate) struct Transport {
    http: reqwest::Client,
    /// `Bearer <token>`, marked sensitive so it never shows up in `Debug` output.
    authorization: Option<HeaderValue>,
    deadline: Duration,
    request_timeout: Duration,
    nodes: Mutex<Nodes>,
}

impl Transport {
    pub(crate) fn new(
        http: reqwest::Client,
        urls: Vec<Url>,
        authorization: Option<HeaderValue>,
        deadline: Duration,
        request_timeout: Duration,
    ) -> Self {
        Transport {
            http,
            authorization,
            deadline,
            request_timeout,
            nodes: Mutex::new(Nodes {
                urls,
                leader: None,
                next: 0,
            }),
        }
    }

    /// The same transport (connection pool, token, time-outs) to the node at `base` alone.
    pub(crate) fn only(&self, base: Url) -> Transport {
        Transport::new(
            self.http.clone(),
            vec![base],
            self.authorization.clone(),
            self.deadline,
            self.request_timeout,
        )
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        // The lock is never held across an await or a panic-prone call; if some caller's
        // thread panicked anyway, the node list is still consistent, so keep using it.
        self.nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The base URL of the node currently believed to lead, if any.
    pub(crate) fn known_leader(&self) -> Option<Url> {
        let nodes = self.nodes();
        nodes.leader.map(|index| nodes.urls[index].clone())
    }

    /// Remembers `leader_url` (from a cluster status) as the leader.
    pub(crate) fn learn_leader(&self, leader_url: &str) {
        if let Ok(base) = base_url(leader_url) {
            self.nodes().remember_leader(&base);
        }
    }

    /// Sends `call` until it gets a definite answer or its deadline passes, and returns the
    /// status and body of the 2xx answer.
    pub(crate) async fn execute(&self, call: &Call) -> Result<(StatusCode, Bytes), Error> {
        let answer = self.execute_accepting(call, None).await?;
        Ok((answer.status, answer.body))
    }

    /// [`Transport::execute`], asking for the answer in the content type `accept` (the server
    /// may answer in another: see [`Answer::content_type`]).
    pub(crate) async fn execute_accepting(
        &self,
        call: &Call,
        accept: Option<&'static str>,
    ) -> Result<Answer, Error> {
        let budget = self.deadline + call.hold;
        let deadline = Instant::now() + budget;
        let mut backoff = INITIAL_BACKOFF;
        let mut tries = Tries {
            attempts: 0,
            maybe_applied: None,
            last_detail: String::from("no attempt was made"),
            last_code: None,
        };
        let mut hops = 0u32;
        // Where the last redirect pointed: the next attempt goes there, without a pause.
        let mut redirect: Option<(Option<usize>, Url)> = None;

        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining < MIN_ATTEMPT_TIME && tries.attempts > 0 {
                return Err(tries.give_up(call, budget));
            }
            let (node, url) = match redirect.take() {
                Some(target) => target,
                None => {
                    let (index, base) = self.nodes().pick();
                    (Some(index), join(&base, &call.target)?)
                }
            };
            tries.attempts += 1;
            let timeout = (self.request_timeout + call.hold).min(remaining);
            let outcome = self.attempt(call, accept, &url, timeout).await;
            let mut retry_after = None;
            match outcome {
                Attempt::Done(status, content_type, body) => {
                    if let Some(index) = node {
                        // A node that accepted a write leads (or led a moment ago); a read
                        // says nothing about leadership.
                        if call.retry != Retry::Read {
                            self.nodes().leader = Some(index);
                        }
                    }
                    return Ok(Answer {
                        status,
                        content_type,
                        body,
                    });
                }
                Attempt::Refused(problem) => {
                    // The refusal speaks for this attempt only. After an attempt that may have
                    // been applied, "refused" would wrongly suggest the call had no effect.
                    return Err(match tries.maybe_applied {
                        Some(first) => Error::Indeterminate {
                            detail: format!(
                                "an earlier attempt may have been applied ({first}); a later \
                                 attempt was refused: {problem}"
                            ),
                        },
                        None => Error::Api(Box::new(problem)),
                    });
                }
                Attempt::Redirect {
                    location,
                    leader_base,
                } => {
                    hops += 1;
                    let index = leader_base.and_then(|base| self.nodes().remember_leader(&base));
                    tracing::debug!(from = %url, to = %location, hops, "following leader redirect");
                    if hops <= MAX_REDIRECT_HOPS {
                        tries.last_detail = format!("{url}: redirected to {location}");
                        tries.last_code = Some(ErrorCode::NotLeader);
                        redirect = Some((index, location));
                        continue;
                    }
                    tries.last_detail = format!(
                        "more than {MAX_REDIRECT_HOPS} redirects in a row, last from {url} to \
                         {location}"
                    );
                    tries.last_code = Some(ErrorCode::NotLeader);
                    if let Some(index) = index {
                        self.nodes().failed(index);
                    }
                }
                Attempt::NotApplied {
                    detail,
                    code,
                    retry_after: hint,
                    leader_base,
                    try_another_node,
                } => {
                    tracing::debug!(%url, %detail, "not applied, will retry");
                    if let (true, Some(index)) = (try_another_node, node) {
                        self.nodes().failed(index);
                    }
                    if let Some(base) = leader_base {
                        self.nodes().remember_leader(&base);
                    }
                    tries.last_detail = detail;
                    tries.last_code = code;
                    retry_after = hint;
                }
                Attempt::Unknown { detail } => {
                    if call.retry == Retry::UnsafeWrite {
                        return Err(Error::Indeterminate {
                            detail: format!(
                                "{detail}; not re-sent because the request carries no \
                                 producer_id and sequence"
                            ),
                        });
                    }
                    tracing::debug!(%url, %detail, "may have reached the server, will retry");
                    if let Some(index) = node {
                        self.nodes().failed(index);
                    }
                    if call.retry == Retry::IdempotentWrite && tries.maybe_applied.is_none() {
                        tries.maybe_applied = Some(detail.clone());
                    }
                    tries.last_detail = detail;
                    tries.last_code = None;
                }
            }
            hops = 0;

            let pause = jittered(backoff).max(retry_after.unwrap_or_default().min(MAX_BACKOFF));
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let remaining = deadline.saturating_duration_since(Instant::now());
            if pause + MIN_ATTEMPT_TIME > remaining {
                return Err(tries.give_up(call, budget));
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One HTTP exchange with one node, classified.
    async fn attempt(
        &self,
        call: &Call,
        accept: Option<&'static str>,
        url: &Url,
        timeout: Duration,
    ) -> Attempt {
        let mut request = self
            .http
            .request(call.method.clone(), url.clone())
            .timeout(timeout);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        if let Some((body, content_type)) = &call.body {
            request = request
                .header(CONTENT_TYPE, *content_type)
                .body(body.clone());
        }
        let response = match request.send().await {
            Ok(response) => response,
            // A connect error (refused, unreachable, DNS, connect time-out) happens before a
            // single byte of the request is written: definitely not applied.
            Err(err) if err.is_connect() => {
                return Attempt::NotApplied {
                    detail: format!("{url}: cannot connect: {}", error_chain(&err)),
                    code: None,
                    retry_after: None,
                    leader_base: None,
                    try_another_node: true,
                }
            }
            Err(err) => {
                let what = if err.is_timeout() {
                    format!("no answer within {timeout:?}")
                } else {
                    "the exchange failed".to_string()
                };
                return Attempt::Unknown {
                    detail: format!(
                        "{} {url}: {what} after the request may have been sent: {}",
                        call.method,
                        error_chain(&err)
                    ),
                };
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        match response.bytes().await {
            Ok(body) => classify(call, url, status, &headers, body),
            // The status line arrived, the body did not. For a 2xx write the status alone says
            // "applied" but the offsets are lost, which the caller cannot use: report it as
            // unknown so an idempotent publish is re-sent and answers the original offsets.
            Err(err) if status.is_success() => Attempt::Unknown {
                detail: format!(
                    "{} {url}: answered {status} (applied) but the body was lost: {}",
                    call.method,
                    error_chain(&err)
                ),
            },
            // Otherwise the status is still a definite answer; classify it without the body.
            Err(_) => classify(call, url, status, &headers, Bytes::new()),
        }
    }
}

/// Sorts an answer into the [`Attempt`] kinds. Never fails: a body that is not a problem is
/// quoted, not parsed.
fn classify(
    call: &Call,
    url: &Url,
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
) -> Attempt {
    if status.is_success() {
        return Attempt::Done(status, headers.get(CONTENT_TYPE).cloned(), body);
    }
    let problem = parse_problem(status, &body);
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);

    if status == StatusCode::TEMPORARY_REDIRECT || status == StatusCode::PERMANENT_REDIRECT {
        let leader_url = problem.as_ref().and_then(|p| p.leader_url.as_deref());
        let location = headers
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| url.join(value).ok())
            .or_else(|| {
                leader_url
                    .and_then(|leader| base_url(leader).ok())
                    .and_then(|base| join(&base, &call.target).ok())
            });
        return match location {
            Some(location) if may_follow(url, &location) => {
                let leader_base = leader_url
                    .and_then(|leader| base_url(leader).ok())
                    .or_else(|| base_of(&location, &call.target));
                Attempt::Redirect {
                    location,
                    leader_base,
                }
            }
            // A redirect is a definite "not here", even when it does not say where.
            _ => Attempt::NotApplied {
                detail: format!("{url}: answered {status} without a usable Location"),
                code: Some(ErrorCode::NotLeader),
                retry_after,
                leader_base: None,
                try_another_node: true,
            },
        };
    }

    if status == StatusCode::TOO_MANY_REQUESTS {
        let problem = problem.unwrap_or_else(|| synthesized_problem(status, &body));
        return Attempt::NotApplied {
            detail: format!("{url}: {problem}"),
            code: Some(problem.code),
            retry_after,
            leader_base: None,
            // The node is fine, just busy; for a write it is still the leader.
            try_another_node: false,
        };
    }

    if status.is_client_error() {
        return Attempt::Refused(problem.unwrap_or_else(|| synthesized_problem(status, &body)));
    }

    if status == StatusCode::SERVICE_UNAVAILABLE {
        if let Some(problem) = &problem {
            if matches!(problem.code, ErrorCode::NoLeader | ErrorCode::ShuttingDown) {
                let leader_base = problem
                    .leader_url
                    .as_deref()
                    .and_then(|leader| base_url(leader).ok())
                    .filter(|leader| !url.as_str().starts_with(leader.as_str()));
                return Attempt::NotApplied {
                    detail: format!("{url}: {problem}"),
                    code: Some(problem.code),
                    retry_after,
                    leader_base,
                    try_another_node: true,
                };
            }
        }
    }

    // Any other answer (5xx, an unexpected 1xx/3xx) promises nothing about the effect.
    let said = match &problem {
        Some(problem) => problem.to_string(),
        None => snippet(&body),
    };
    Attempt::Unknown {
        detail: format!("{} {url}: answered {status}: {said}", call.method),
    }
}

/// What a call's attempts so far came to.
struct Tries {
    attempts: u32,
    /// The first failure after which a write may have been applied.
    maybe_applied: Option<String>,
    last_detail: String,
    last_code: Option<ErrorCode>,
}

impl Tries {
    /// The error for a call whose deadline passed: indeterminate when some attempt may have
    /// been applied, unavailable otherwise.
    fn give_up(self, call: &Call, budget: Duration) -> Error {
        let Tries {
            attempts,
            maybe_applied,
            last_detail,
            last_code,
        } = self;
        match maybe_applied {
            Some(first) => Error::Indeterminate {
                detail: format!(
                "no definite answer within {budget:?} ({attempts} attempts); an earlier attempt \
                 may have been applied ({first}); last: {last_detail}"
            ),
            },
            None => {
                let effect = match call.retry {
                    Retry::Read => "",
                    Retry::IdempotentWrite | Retry::UnsafeWrite => "; the write was not applied",
                };
                Error::Unavailable {
                    detail: format!(
                    "no definite answer within {budget:?} ({attempts} attempts){effect}; last: \
                     {last_detail}"
                ),
                    last_code,
                }
            }
        }
    }
}

/// A pause between `backoff / 2` and `backoff`: enough randomness that clients refused
/// together do not come back together.
pub(crate) fn jittered(backoff: Duration) -> Duration {
    let half = backoff / 2;
    let extra_us = rand::thread_rng().gen_range(0..=half.as_micros() as u64);
    half + Duration::from_micros(extra_us)
}

/// The problem document in an error body. A body with a `code` but missing other fields is
/// accepted too: the code is what decides whether a retry is safe, and a `no_leader` answer
/// should not turn into "outcome unknown" because a `title` is missing.
fn parse_problem(status: StatusCode, body: &[u8]) -> Option<Problem> {
    if let Ok(problem) = serde_json::from_slice::<Problem>(body) {
        return Some(problem);
    }
    #[derive(serde::Deserialize)]
    struct Partial {
        code: ErrorCode,
        #[serde(default)]
        detail: Option<String>,
        #[serde(default)]
        leader_id: Option<u64>,
        #[serde(default)]
        leader_url: Option<String>,
        #[serde(default)]
        expected_sequence: Option<u64>,
    }
    let partial = serde_json::from_slice::<Partial>(body).ok()?;
    Some(Problem {
        type_: "about:blank".to_string(),
        title: partial.code.title().to_string(),
        status: status.as_u16(),
        detail: partial.detail.unwrap_or_default(),
        code: partial.code,
        leader_id: partial.leader_id,
        leader_url: partial.leader_url,
        expected_sequence: partial.expected_sequence,
    })
}

/// A problem for a non-2xx answer whose body is not a problem document.
fn synthesized_problem(status: StatusCode, body: &[u8]) -> Problem {
    let code = match status {
        StatusCode::BAD_REQUEST => ErrorCode::InvalidArgument,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::Overloaded,
        _ => ErrorCode::Unknown,
    };
    Problem {
        type_: "about:blank".to_string(),
        title: status
            .canonical_reason()
            .unwrap_or("Unexpected status")
            .to_string(),
        status: status.as_u16(),
        detail: snippet(body),
        code,
        leader_id: None,
        leader_url: None,
        expected_sequence: None,
    }
}

/// The start of a body, as text, for error messages.
fn snippet(body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty body)".to_string();
    }
    let text = String::from_utf8_lossy(body);
    let mut quoted: String = text.chars().take(BODY_SNIPPET_CHARS).collect();
    if text.chars().nth(BODY_SNIPPET_CHARS).is_some() {
        quoted.push('…');
    }
    quoted
}

/// An error and its causes on one line: reqwest's own message is only "error sending request".
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether a redirect from `from` to `to` may be followed: to `http` or `https`, but never from
/// `https` down to `http`, which would send the token and the body in the clear.
fn may_follow(from: &Url, to: &Url) -> bool {
    match to.scheme() {
        "https" => true,
        "http" => from.scheme() == "http",
        _ => false,
    }
}

/// Parses and normalizes a node's base URL: `http` or `https`, no query or fragment, path ending in `/`
/// so that relative targets join below it.
pub(crate) fn base_url(raw: &str) -> Result<Url, Error> {
    let invalid = |reason: &str| Error::InvalidUrl {
        url: raw.to_string(),
        reason: reason.to_string(),
    };
    let mut url = Url::parse(raw.trim()).map_err(|err| invalid(&err.to_string()))?;
    match url.scheme() {
        "http" | "https" => {}
        _ => return Err(invalid("the scheme must be http or https")),
    }
    if url.host_str().is_none() {
        return Err(invalid("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a base URL takes no query or fragment"));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// `base` (ending in `/`) plus a relative target.
fn join(base: &Url, target: &str) -> Result<Url, Error> {
    base.join(target).map_err(|err| Error::InvalidUrl {
        url: format!("{base}{target}"),
        reason: err.to_string(),
    })
}

/// The base URL of the node a redirect points at: `location` minus the target we asked for,
/// or its origin when the server rewrote the target.
fn base_of(location: &Url, target: &str) -> Option<Url> {
    let full = location.as_str();
    let base = match full.strip_suffix(target) {
        Some(base) if base.ends_with('/') => Url::parse(base).ok(),
        _ => location.join("/").ok(),
    }?;
    base_url(base.as_str()).ok()
}

/// Percent-encodes a query value: everything but RFC 3986's unreserved characters, so that
/// arbitrary keys (`&`, `=`, `+`, spaces, non-ASCII) arrive unchanged.
pub(crate) fn encode_query_value(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
