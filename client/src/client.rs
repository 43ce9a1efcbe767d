//! The public client: construction, and one method per API call.
//!
//! Each method validates its arguments, describes the HTTP exchange as a [`Call`] with its
//! [`Retry`] class, and leaves sending to [`Transport`]. Choosing the class is the one
//! decision that matters here; everything else is plumbing.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{
    is_valid_name, AckRequest, AddNodeRequest, BroadcastRequest, BroadcastResponse, ClusterStatus,
    CursorRequest, CursorResponse, ExtendRequest, NackRequest, PublishRequest, PublishResponse,
    PullRequest, PullResponse, ReadFrom, ReadResponse, ReceiptResult, ReceiptResults, RecordIn,
    Report, SetVotersRequest, SnapshotTaken, SubscriptionConfig, SubscriptionInfo,
    SubscriptionList, TopicConfig, TopicInfo, TopicList, TopicReport, TopicSummary,
    TransferLeaderRequest, TransferLeaderResponse, MAX_ACK_TIMEOUT_MS, MAX_BATCH_RECORDS,
    MAX_NACK_DELAY_MS, MAX_PULL, MAX_RECEIPTS, MAX_WAIT_MS,
};
use crate::error::Error;
use crate::transport::{base_url, encode_query_value, Call, Retry, Transport};

/// Default total time budget of one call, across all its attempts.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Default time-out of one HTTP attempt (a long-poll read adds its wait to it).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time allowed to open a TCP connection. Kept well below the request time-out on
/// purpose: a connect failure proves the request was not sent, so a write can safely move to
/// the next node, whereas a request time-out cannot prove anything.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

const JSON: &str = "application/json";
const OCTET_STREAM: &str = "application/octet-stream";

/// A handle to a raftq cluster. Cheap to clone: clones share one connection pool and one
/// view of who the leader is.
#[derive(Clone)]
pub struct Client {
    transport: Arc<Transport>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Transport's Debug shows the node list; the token is a sensitive header value and
        // prints as "Sensitive".
        f.debug_struct("Client")
            .field("transport", &self.transport)
            .finish()
    }
}

/// Options of a [`Client`], from [`Client::builder`].
#[derive(Clone)]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<String>,
    /// PEM CA certificates to trust instead of the system's.
    ca_pem: Option<Vec<u8>>,
    deadline: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("urls", &self.urls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("deadline", &self.deadline)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl ClientBuilder {
    /// An API token, sent as `Authorization: Bearer <token>` on every request, including the
    /// re-sends that follow a leader redirect (the redirect names another cluster node).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trust these PEM CA certificates (one or more) for `https://` nodes, instead of the
    /// system's CA certificates: a node whose certificate they did not sign is refused.
    /// Without this, `https://` nodes need a certificate the system trusts.
    pub fn ca_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// [`ClientBuilder::ca_cert_pem`] from a file.
    pub fn ca_file(self, path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let pem = std::fs::read(path).map_err(|err| {
            Error::InvalidArgument(format!("cannot read the CA file {}: {err}", path.display()))
        })?;
        Ok(self.ca_cert_pem(pem))
    }

    /// Total time budget of one call across all its attempts, redirects and pauses
    /// (default 30 s). A long-poll read gets its wait on top.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Time-out of one HTTP attempt (default 10 s). A long-poll read gets its wait on top.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Time allowed to open a connection (default 2 s, never more than the request time-out).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Checks the options and builds the client. Nothing is sent yet.
    pub fn build(self) -> Result<Client, Error> {
        if self.urls.is_empty() {
            return Err(Error::InvalidArgument(
                "at least one node URL is needed".to_string(),
            ));
        }
        let mut urls = Vec::with_capacity(self.urls.len());
        for raw in &self.urls {
            let url = base_url(raw)?;
            if !urls.contains(&url) {
                urls.push(url);
            }
        }
        if self.deadline.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the deadline and the request time-out must be positive".to_string(),
            ));
        }
        let authorization = match self.token {
            None => None,
            Some(token) => {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        Error::InvalidArgument(
                            "the token contains characters not allowed in an HTTP header"
                                .to_string(),
                        )
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let mut http = reqwest::Client::builder().use_rustls_tls();
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|err| {
                Error::InvalidArgument(format!("the CA certificates are not valid PEM: {err}"))
            })?;
            if certs.is_empty() {
                return Err(Error::InvalidArgument(
                    "no CA certificate in the given PEM (expected \"BEGIN CERTIFICATE\" blocks)"
                        .to_string(),
                ));
            }
            http = http.tls_built_in_root_certs(false);
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            // Redirects are followed by the transport, which re-sends the body, remembers the
            // leader and keeps the token (reqwest would drop a POST body on some redirects).
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.connect_timeout.min(self.request_timeout))
            .user_agent(concat!("raftq-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| {
                Error::InvalidArgument(format!("cannot build the HTTP client: {err}"))
            })?;
        Ok(Client {
            transport: Arc::new(Transport::new(
                http,
                urls,
                authorization,
                self.deadline,
                self.request_timeout,
            )),
        })
    }
}

/// Where and how much a [`Client::read`] reads. `Default` reads from the subscription's
/// cursor (give one) with the server's default size and no wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Where to start; without it, `subscription` resumes at its cursor.
    pub from: Option<ReadFrom>,
    /// A subscription whose cursor the read resumes from, or moves forward to `from`.
    pub subscription: Option<String>,
    /// Most records to return.
    pub max: Option<u64>,
    /// Most value bytes to return (at least one record is returned if any is available).
    pub max_bytes: Option<u64>,
    /// Long-poll: wait up to this long (at most 30 s) for a record at or after `from`.
    pub wait: Option<Duration>,
}

impl ReadOptions {
    /// Options with nothing set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Start at `from`.
    pub fn from(mut self, from: ReadFrom) -> Self {
        self.from = Some(from);
        self
    }

    /// Start at an offset.
    pub fn from_offset(self, offset: u64) -> Self {
        self.from(ReadFrom::Offset(offset))
    }

    /// Read for (and move the cursor of) a subscription.
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.subscription = Some(name.into());
        self
    }

    /// Return at most `max` records.
    pub fn max(mut self, max: u64) -> Self {
        self.max = Some(max);
        self
    }

    /// Return at most about `max_bytes` of values.
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// Long-poll for up to `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }
}

/// Builds a query string of percent-encoded values.
#[derive(Default)]
struct Query(String);

impl Query {
    fn push(&mut self, name: &str, value: impl fmt::Display) {
        self.0.push(if self.0.is_empty() { '?' } else { '&' });
        self.0.push_str(name);
        self.0.push('=');
        self.0.push_str(&encode_query_value(&value.to_string()));
    }
}

impl Client {
    /// A client with default options for the nodes at `urls` (base URLs such as
    /// `http://10.0.0.1:7001`). Any one reachable node is enough to find the others' leader.
    pub fn new(urls: impl IntoIterator<Item = impl AsRef<str>>) -> Result<Client, Error> {
        Client::builder(urls).build()
    }

    /// A builder for a client with a token or other time limits.
    pub fn builder(urls: impl IntoIterator<Item = impl AsRef<str>>) -> ClientBuilder {
        ClientBuilder {
            urls: urls
                .into_iter()
                .map(|url| url.as_ref().to_string())
                .collect(),
            token: None,
            ca_pem: None,
            deadline: DEFAULT_DEADLINE,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// The base URL of the node this client currently believes leads, if it knows one.
    pub fn known_leader(&self) -> Option<String> {
        self.transport.known_leader().map(String::from)
    }

    /// Creates a topic, or confirms it exists with the same configuration.
    ///
    /// Returns `true` when this call's request created it (201) and `false` when it already
    /// existed with this configuration (200). After a lost answer the request is re-sent, so
    /// `false` can also mean an earlier attempt of this same call created it. A different
    /// existing configuration is [`Error::Api`] with code `already_exists`.
    pub async fn create_topic(&self, name: &str, config: &TopicConfig) -> Result<bool, Error> {
        check_name("topic", name)?;
        let call = Call {
            method: Method::PUT,
            target: format!("v1/topics/{name}"),
            body: Some((json_body(config)?, JSON)),
            // The same PUT applied twice has the effect of applying it once.
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let (status, _) = self.transport.execute(&call).await?;
        Ok(status == StatusCode::CREATED)
    }

    /// All topics with their offsets and sizes.
    pub async fn list_topics(&self) -> Result<Vec<TopicSummary>, Error> {
        let list: TopicList = self.get("v1/topics".to_string(), Duration::ZERO).await?;
        Ok(list.topics)
    }

    /// One topic: its offsets, sizes, configuration and commit point.
    pub async fn topic(&self, name: &str) -> Result<TopicInfo, Error> {
        check_name("topic", name)?;
        self.get(format!("v1/topics/{name}"), Duration::ZERO).await
    }

    /// Deletes a topic and its subscriptions.
    ///
    /// The request is re-sent after a lost answer. If that re-send finds the topic gone, the
    /// call cannot tell whether its own earlier attempt deleted it, and returns
    /// [`Error::Indeterminate`] (quoting `topic_not_found`); a `topic_not_found` on the first
    /// answer is [`Error::Api`].
    pub async fn delete_topic(&self, name: &str) -> Result<(), Error> {
        check_name("topic", name)?;
        let call = Call {
            method: Method::DELETE,
            target: format!("v1/topics/{name}"),
            body: None,
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        self.transport.execute(&call).await?;
        Ok(())
    }

    /// Publishes a batch of 1 to 10,000 records; on success they are committed on a majority
    /// and durable.
    ///
    /// With both `producer_id` and `sequence` set, the batch is retried after any failure
    /// until the deadline, because the server answers a re-sent batch with its original offsets
    /// (`duplicate: true`) instead of appending it again. Without them, the batch is re-sent
    /// only after definite refusals (redirect, no leader, shutting down, overloaded, connection
    /// refused); any other failure returns [`Error::Indeterminate`] at once.
    pub async fn publish(
        &self,
        topic: &str,
        request: &PublishRequest,
    ) -> Result<PublishResponse, Error> {
        check_name("topic", topic)?;
        if request.records.is_empty() || request.records.len() > MAX_BATCH_RECORDS {
            return Err(Error::InvalidArgument(format!(
                "a batch holds 1 to {MAX_BATCH_RECORDS} records, not {}",
                request.records.len()
            )));
        }
        let idempotent = request.producer_id.is_some() && request.sequence.is_some();
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/records"),
            body: Some((json_body(request)?, JSON)),
            retry: if idempotent {
                Retry::IdempotentWrite
            } else {
                Retry::UnsafeWrite
            },
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }

    /// Publishes `records` without idempotency data: see [`Client::publish`] for what that
    /// means when the answer is lost.
    pub async fn publish_records(
        &self,
        topic: &str,
        records: Vec<RecordIn>,
    ) -> Result<PublishResponse, Error> {
        let request = PublishRequest {
            records,
            producer_id: None,
            sequence: None,
        };
        self.publish(topic, &request).await
    }

    /// Publishes one record whose value is `bytes`, sent as a raw `application/octet-stream`
    /// body (no base64), with an optional key. Not idempotent: see [`Client::publish`].
    pub async fn publish_bytes(
        &self,
        topic: &str,
        key: Option<&str>,
        bytes: Vec<u8>,
    ) -> Result<PublishResponse, Error> {
        check_name("topic", topic)?;
        let mut query = Query::default();
        if let Some(key) = key {
            query.push("key", key);
        }
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/records{}", query.0),
            body: Some((Bytes::from(bytes), OCTET_STREAM)),
            retry: Retry::UnsafeWrite,
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }

    /// Reads committed records (stream semantics). Goes to the leader when one is known, so
    /// records this client has just published are visible; falls back to any node.
    ///
    /// With `wait`, the call's deadline and the attempt's time-out are extended by the wait.
    pub async fn read(&self, topic: &str, options: &ReadOptions) -> Result<ReadResponse, Error> {
        check_name("topic", topic)?;
        let mut query = Query::default();
        if let Some(from) = options.from {
            query.push("from", from);
        }
        if let Some(subscription) = &options.subscription {
            check_name("subscription", subscription)?;
            query.push("subscription", subscription);
        }
        if let Some(max) = options.max {
            query.push("max", max);
        }
        if let Some(max_bytes) = options.max_bytes {
            query.push("max_bytes", max_bytes);
        }
        let mut hold = Duration::ZERO;
        if let Some(wait) = options.wait {
            let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            if wait_ms > MAX_WAIT_MS {
                return Err(Error::InvalidArgument(format!(
                    "wait is at most {MAX_WAIT_MS} ms, not {wait_ms} ms"
                )));
            }
            query.push("wait_ms", wait_ms);
            hold = Duration::from_millis(wait_ms);
        }
        self.get(format!("v1/topics/{topic}/records{}", query.0), hold)
            .await
    }

    /// Creates a subscription on `topic`, or confirms it exists with the same configuration.
    ///
    /// Returns `true` when this call's request created it (201) and `false` when it already
    /// existed with this configuration (200). Like [`Client::create_topic`], the request is
    /// re-sent after a lost answer, so `false` can also mean an earlier attempt of this same call
    /// created it. A different existing configuration is [`Error::Api`] with code
    /// `already_exists`; if that refusal follows a lost answer (possible with
    /// `start: "next"`, should the server store the offset it resolved), it is
    /// [`Error::Indeterminate`].
    pub async fn create_subscription(
        &self,
        topic: &str,
        name: &str,
        config: &SubscriptionConfig,
    ) -> Result<bool, Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        if let Some(ack_timeout_ms) = config.ack_timeout_ms {
            check_ack_timeout_ms(ack_timeout_ms)?;
        }
        if config.max_deliveries == Some(0) {
            return Err(Error::InvalidArgument(
                "max_deliveries is at least 1".to_string(),
            ));
        }
        if let Some(dead_letter_topic) = &config.dead_letter_topic {
            check_name("dead-letter topic", dead_letter_topic)?;
        }
        let call = Call {
            method: Method::PUT,
            target: format!("v1/topics/{topic}/subscriptions/{name}"),
            body: Some((json_body(config)?, JSON)),
            // The same PUT applied twice has the effect of applying it once.
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let (status, _) = self.transport.execute(&call).await?;
        Ok(status == StatusCode::CREATED)
    }

    /// One subscription: its cursor, counters and configuration.
    pub async fn subscription(&self, topic: &str, name: &str) -> Result<SubscriptionInfo, Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        self.get(
            format!("v1/topics/{topic}/subscriptions/{name}"),
            Duration::ZERO,
        )
        .await
    }

    /// All subscriptions of `topic`.
    pub async fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionInfo>, Error> {
        check_name("topic", topic)?;
        let list: SubscriptionList = self
            .get(format!("v1/topics/{topic}/subscriptions"), Duration::ZERO)
            .await?;
        Ok(list.subscriptions)
    }

    /// Deletes a subscription: its cursor, leases and counters are gone, and every receipt it
    /// issued becomes unusable.
    ///
    /// Re-sent after a lost answer; a re-send that finds the subscription gone returns
    /// [`Error::Indeterminate`] (quoting `subscription_not_found`), as for
    /// [`Client::delete_topic`].
    pub async fn delete_subscription(&self, topic: &str, name: &str) -> Result<(), Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        let call = Call {
            method: Method::DELETE,
            target: format!("v1/topics/{topic}/subscriptions/{name}"),
            body: None,
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        self.transport.execute(&call).await?;
        Ok(())
    }

    /// Leases up to `request.max` records of a subscription (queue semantics). Each
    /// [`Message`](crate::api::Message) must then be acked, nacked or extended with its
    /// `receipt` before its lease expires, or it is delivered again.
    ///
    /// A pull is a write (it goes to the leader). With `wait_ms` it long-polls: the call's
    /// deadline and the attempt's time-out are extended by the wait.
    ///
    /// **Retries.** A pull whose answer is lost (time-out, reset connection, a 5xx) is re-sent
    /// until the deadline: nothing is lost by it, because the records the lost answer leased are
    /// delivered again when their lease expires (after `ack_timeout_ms`, with a
    /// `delivery_count` one higher). They are only delayed, and may reach another consumer of
    /// the subscription first. When the deadline passes after such a loss, the error is
    /// [`Error::Indeterminate`]; the same holds for the records then.
    pub async fn pull(
        &self,
        topic: &str,
        subscription: &str,
        request: &PullRequest,
    ) -> Result<PullResponse, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        if let Some(max) = request.max {
            if max == 0 || max > MAX_PULL {
                return Err(Error::InvalidArgument(format!(
                    "a pull leases 1 to {MAX_PULL} records, not {max}"
                )));
            }
        }
        let wait_ms = request.wait_ms.unwrap_or(0);
        if wait_ms > MAX_WAIT_MS {
            return Err(Error::InvalidArgument(format!(
                "wait is at most {MAX_WAIT_MS} ms, not {wait_ms} ms"
            )));
        }
        if let Some(ack_timeout_ms) = request.ack_timeout_ms {
            check_ack_timeout_ms(ack_timeout_ms)?;
        }
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/pull"),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::from_millis(wait_ms),
        };
        self.send_json(&call).await
    }

    /// Acks deliveries: their records are done and never delivered again. Answers one result
    /// per receipt, in order: `acked`, or `stale` when the receipt no longer names a live
    /// delivery (already acked, or expired and delivered again, or passed by a cursor move).
    ///
    /// **Retries.** Re-acking is harmless, so the ack is re-sent after a lost answer until the
    /// deadline. A re-sent ack answers `stale` for the receipts its lost first attempt acked:
    /// after a retry, `stale` does not prove the ack failed. (An [`Error::Indeterminate`] ack
    /// can be settled by acking again: `acked` or `stale`, the record is not leased to you
    /// any more either way.)
    pub async fn ack(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
    ) -> Result<Vec<ReceiptResult>, Error> {
        let request = AckRequest {
            receipts: receipt_list(receipts)?,
        };
        self.receipt_call(topic, subscription, "ack", &request, request.receipts.len())
            .await
    }

    /// Nacks deliveries: their records become available again at their original offsets after
    /// `delay` (at most 12 h), or, with `dead_letter`, go to the subscription's dead-letter
    /// topic at once. A record whose `delivery_count` reached the subscription's
    /// `max_deliveries` is dead-lettered rather than released. Answers `released`,
    /// `dead_lettered` or `stale` per receipt, in order.
    ///
    /// Re-sent after a lost answer, like [`Client::ack`]: a re-send answers `stale` for what the
    /// lost attempt already released.
    pub async fn nack(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
        delay: Duration,
        dead_letter: bool,
    ) -> Result<Vec<ReceiptResult>, Error> {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        if delay_ms > MAX_NACK_DELAY_MS {
            return Err(Error::InvalidArgument(format!(
                "a nack delay is at most {MAX_NACK_DELAY_MS} ms, not {delay_ms} ms"
            )));
        }
        let request = NackRequest {
            receipts: receipt_list(receipts)?,
            delay_ms,
            dead_letter,
        };
        self.receipt_call(
            topic,
            subscription,
            "nack",
            &request,
            request.receipts.len(),
        )
        .await
    }

    /// Extends leases: each now ends `ack_timeout` (default: the subscription's) after the
    /// extend is applied. Answers `extended` with the new `lease_expires_ms`, or `stale` when
    /// the lease is lost (the record was delivered again, or acked). Re-sent after a lost answer:
    /// extending twice has the effect of extending once.
    pub async fn extend(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
        ack_timeout: Option<Duration>,
    ) -> Result<Vec<ReceiptResult>, Error> {
        let ack_timeout_ms = match ack_timeout {
            None => None,
            Some(timeout) => {
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                check_ack_timeout_ms(ms)?;
                Some(ms)
            }
        };
        let request = ExtendRequest {
            receipts: receipt_list(receipts)?,
            ack_timeout_ms,
        };
        self.receipt_call(
            topic,
            subscription,
            "extend",
            &request,
            request.receipts.len(),
        )
        .await
    }

    /// Sets a subscription's cursor (its ack floor) to `offset` and returns the new cursor.
    /// Forward always (up to the topic's next offset); backward only with `allow_backward`.
    /// Moving it is a seek: leases and done marks it passes over are forgotten and their
    /// receipts become `stale`. Re-sent after a lost answer (setting the same offset twice has
    /// the effect of setting it once).
    pub async fn set_cursor(
        &self,
        topic: &str,
        subscription: &str,
        offset: u64,
        allow_backward: bool,
    ) -> Result<u64, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        let request = CursorRequest {
            offset,
            allow_backward,
        };
        let call = Call {
            method: Method::PUT,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/cursor"),
            body: Some((json_body(&request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let answer: CursorResponse = self.send_json(&call).await?;
        Ok(answer.cursor)
    }

    /// An ack, nack or extend: a safe-to-repeat write answering one result per receipt.
    async fn receipt_call(
        &self,
        topic: &str,
        subscription: &str,
        verb: &str,
        request: &impl Serialize,
        receipts: usize,
    ) -> Result<Vec<ReceiptResult>, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/{verb}"),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let answer: ReceiptResults = self.send_json(&call).await?;
        if answer.results.len() != receipts {
            // The call was applied (2xx), but results cannot be matched to receipts.
            return Err(Error::Decode {
                detail: format!(
                    "{verb} of {receipts} receipts answered {} results",
                    answer.results.len()
                ),
            });
        }
        Ok(answer.results)
    }

    /// The counters of one topic and its subscriptions as of the answering node's commit
    /// point (any node may answer; the leader's is the freshest).
    pub async fn topic_report(&self, topic: &str) -> Result<TopicReport, Error> {
        check_name("topic", topic)?;
        self.get(format!("v1/topics/{topic}/report"), Duration::ZERO)
            .await
    }

    /// The counters of every topic as of one commit point.
    pub async fn report(&self) -> Result<Report, Error> {
        self.get("v1/report".to_string(), Duration::ZERO).await
    }

    /// Appends one marker record to every topic `request` names (all topics when it names
    /// none) in a single Raft entry; each marker carries that entry's commit point in its
    /// headers. Not idempotent: after a lost answer this returns [`Error::Indeterminate`]
    /// rather than append the markers twice.
    pub async fn broadcast(&self, request: &BroadcastRequest) -> Result<BroadcastResponse, Error> {
        if let Some(topics) = &request.topics {
            for topic in topics {
                check_name("topic", topic)?;
            }
        }
        let call = Call {
            method: Method::POST,
            target: "v1/broadcast".to_string(),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::UnsafeWrite,
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }

    /// The cluster as the answering node sees it (any node may answer). A leader it names is
    /// remembered for the next write.
    pub async fn cluster(&self) -> Result<ClusterStatus, Error> {
        let status: ClusterStatus = self.get("v1/cluster".to_string(), Duration::ZERO).await?;
        if let Some(leader_url) = &status.leader_url {
            self.transport.learn_leader(leader_url);
        }
        Ok(status)
    }

    /// Adds node `id` at `url` as a learner and waits (on the server, up to 60 s) until it
    /// has caught up. Adding a node that is already a member at the same URL only waits.
    pub async fn add_node(&self, id: u64, url: &str) -> Result<ClusterStatus, Error> {
        let body = AddNodeRequest {
            id,
            url: url.to_string(),
        };
        self.membership_call(
            Method::POST,
            "v1/cluster/nodes".into(),
            Some(json_body(&body)?),
        )
        .await
    }

    /// Makes exactly `ids` the voters (members that leave the voters stay as learners).
    pub async fn set_voters(&self, ids: &[u64]) -> Result<ClusterStatus, Error> {
        let body = SetVotersRequest { ids: ids.to_vec() };
        self.membership_call(
            Method::POST,
            "v1/cluster/voters".into(),
            Some(json_body(&body)?),
        )
        .await
    }

    /// Removes node `id` from the cluster. Its id can never be used again.
    pub async fn remove_node(&self, id: u64) -> Result<ClusterStatus, Error> {
        self.membership_call(Method::DELETE, format!("v1/cluster/nodes/{id}"), None)
            .await
    }

    /// Moves leadership to voter `to` (or the most up-to-date follower); returns the new
    /// leader.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<u64, Error> {
        let body = TransferLeaderRequest { to };
        let answer: TransferLeaderResponse = self
            .membership_call(
                Method::POST,
                "v1/cluster/transfer-leader".into(),
                Some(json_body(&body)?),
            )
            .await?;
        Ok(answer.leader_id)
    }

    /// Asks the node at `url` (snapshots are per node) to build a snapshot now.
    pub async fn snapshot(&self, url: &str) -> Result<SnapshotTaken, Error> {
        let single = Client::new([url])?;
        let call = Call {
            method: Method::POST,
            target: "v1/cluster/snapshot".to_string(),
            body: None,
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        single.send_json(&call).await
    }

    /// Membership changes converge on a target state, so re-sending one after a lost answer
    /// is safe.
    async fn membership_call<T: DeserializeOwned>(
        &self,
        method: Method,
        target: String,
        body: Option<Bytes>,
    ) -> Result<T, Error> {
        let call = Call {
            method,
            target,
            body: body.map(|b| (b, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }

    async fn get<T: DeserializeOwned>(&self, target: String, hold: Duration) -> Result<T, Error> {
        let call = Call {
            method: Method::GET,
            target,
            body: None,
            retry: Retry::Read,
            hold,
        };
        self.send_json(&call).await
    }

    async fn send_json<T: DeserializeOwned>(&self, call: &Call) -> Result<T, Error> {
        let (status, body) = self.transport.execute(call).await?;
        serde_json::from_slice(&body).map_err(|err| Error::Decode {
            detail: format!(
                "{} /{} answered {status} with {err}: {}",
                call.method,
                call.target,
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ),
        })
    }
}

fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} name {name:?} must match [A-Za-z0-9._-]{{1,128}}"
        )))
    }
}

fn check_ack_timeout_ms(ack_timeout_ms: u64) -> Result<(), Error> {
    if ack_timeout_ms == 0 || ack_timeout_ms > MAX_ACK_TIMEOUT_MS {
        Err(Error::InvalidArgument(format!(
            "an ack time-out is 1 to {MAX_ACK_TIMEOUT_MS} ms, not {ack_timeout_ms} ms"
        )))
    } else {
        Ok(())
    }
}

fn receipt_list(receipts: &[impl AsRef<str>]) -> Result<Vec<String>, Error> {
    if receipts.is_empty() || receipts.len() > MAX_RECEIPTS {
        return Err(Error::InvalidArgument(format!(
            "a call takes 1 to {MAX_RECEIPTS} receipts, not {}",
            receipts.len()
        )));
    }
    Ok(receipts
        .iter()
        .map(|receipt| receipt.as_ref().to_string())
        .collect())
}

fn json_body(value: &impl Serialize) -> Result<Bytes, Error> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| Error::InvalidArgument(format!("cannot encode the request: {err}")))
}
