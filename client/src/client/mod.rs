//! The public client: one method per API call (subscriptions in `subscriptions.rs`, reports and
//! cluster administration in `cluster.rs`; options in `builder.rs`).
//!
//! Each method validates its arguments, describes the HTTP exchange as a [`Call`] with its
//! [`Retry`] class, and leaves sending to [`Transport`]. Choosing the class is the one
//! decision that matters here; everything else is plumbing.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{
    is_valid_name, PublishRequest, PublishResponse, ReadFrom, ReadResponse, RecordIn, TopicConfig,
    TopicInfo, TopicList, TopicSummary, MAX_BATCH_RECORDS, MAX_WAIT_MS, RECORD_BATCH_CONTENT_TYPE,
};
use crate::api::{records_form, RECORDS_CONTENT_TYPE};
use crate::batch;
use crate::error::Error;
use crate::transport::{encode_query_value, Call, Retry, Transport};

mod builder;
mod cluster;
mod subscriptions;

pub use builder::ClientBuilder;

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
    publish_format: PublishFormat,
    read_format: ReadFormat,
    /// Set once a server answered that it does not take record batches (a server older than
    /// them, during a rolling upgrade): from then on this client publishes JSON.
    json_only: Arc<std::sync::atomic::AtomicBool>,
}

/// A publish encoded for the wire: its query, body and content type.
pub(crate) struct EncodedPublish {
    query: String,
    body: (Bytes, &'static str),
    idempotent: bool,
}

/// How [`Client::publish`] (and the [`crate::Producer`] on it) sends records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PublishFormat {
    /// Kafka record batches (`application/vnd.raftq.record-batch`, see [`crate::batch`]):
    /// values go as their bytes, with no JSON escaping or base64 on either side. The default.
    #[default]
    RecordBatch,
    /// JSON (`application/json`), binary values in base64: what servers before the record
    /// batch format accept.
    Json,
}

/// How [`Client::read`] and [`Client::pull`] (and the consumers on them) ask for records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadFormat {
    /// The binary form (`application/vnd.raftq.records`, see [`crate::api::records_form`]):
    /// values as their bytes, with no JSON escaping or base64 on either side. The default; a
    /// server that predates it answers JSON, which is read as such.
    #[default]
    Records,
    /// JSON (`application/json`), binary values in base64.
    Json,
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
        let (records, producer_id, sequence) = (
            &request.records[..],
            request.producer_id.as_deref(),
            request.sequence,
        );
        let encoded = self.encode_publish(records, producer_id, sequence)?;
        self.send_publish(topic, &encoded, records, producer_id, sequence)
            .await
    }

    /// Encodes a publish of `records` once, in this client's [`PublishFormat`], so that it can
    /// be sent again without encoding it again.
    pub(crate) fn encode_publish(
        &self,
        records: &[RecordIn],
        producer_id: Option<&str>,
        sequence: Option<u64>,
    ) -> Result<EncodedPublish, Error> {
        if records.is_empty() || records.len() > MAX_BATCH_RECORDS {
            return Err(Error::InvalidArgument(format!(
                "a batch holds 1 to {MAX_BATCH_RECORDS} records, not {}",
                records.len()
            )));
        }
        let idempotent = producer_id.is_some() && sequence.is_some();
        let format = if self.json_only.load(std::sync::atomic::Ordering::Relaxed) {
            PublishFormat::Json
        } else {
            self.publish_format
        };
        let (query, body) = match format {
            PublishFormat::RecordBatch => {
                let mut query = Query::default();
                if let (Some(producer_id), Some(sequence)) = (producer_id, sequence) {
                    query.push("producer_id", producer_id);
                    query.push("sequence", sequence);
                }
                (
                    query,
                    (record_batch_body(records)?, RECORD_BATCH_CONTENT_TYPE),
                )
            }
            PublishFormat::Json => {
                /// [`PublishRequest`], borrowed: the same JSON.
                #[derive(Serialize)]
                struct Borrowed<'a> {
                    records: &'a [RecordIn],
                    #[serde(skip_serializing_if = "Option::is_none")]
                    producer_id: Option<&'a str>,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    sequence: Option<u64>,
                }
                let request = Borrowed {
                    records,
                    producer_id,
                    sequence,
                };
                (Query::default(), (json_body(&request)?, JSON))
            }
        };
        Ok(EncodedPublish {
            query: query.0,
            body,
            idempotent,
        })
    }

    /// Sends a publish of `records` that [`Client::encode_publish`] encoded: see
    /// [`Client::publish`]. A server that refuses record batches as an unknown content type
    /// (one older than them) gets the same records again as JSON, and so does every later
    /// publish of this client: the refusal is definite, so nothing was appended.
    pub(crate) async fn send_publish(
        &self,
        topic: &str,
        encoded: &EncodedPublish,
        records: &[RecordIn],
        producer_id: Option<&str>,
        sequence: Option<u64>,
    ) -> Result<PublishResponse, Error> {
        let is_batch = encoded.body.1 == RECORD_BATCH_CONTENT_TYPE;
        if is_batch && self.json_only.load(std::sync::atomic::Ordering::Relaxed) {
            // Encoded before this client learnt that its server refuses batches (a producer's
            // batch sent again): send JSON at once rather than be refused again.
            let json = self.encode_publish(records, producer_id, sequence)?;
            return self.send_encoded(topic, &json).await;
        }
        let result = self.send_encoded(topic, encoded).await;
        let refused_format = is_batch
            && result
                .as_ref()
                .err()
                .and_then(Error::problem)
                .is_some_and(|p| {
                    (p.status == 400 && p.detail.starts_with("unsupported Content-Type"))
                        || p.status == 415
                });
        if !refused_format {
            return result;
        }
        tracing::warn!(
            %topic,
            "the server does not take record batches (it is older than them); publishing JSON"
        );
        self.json_only
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let json = self.encode_publish(records, producer_id, sequence)?;
        self.send_encoded(topic, &json).await
    }

    async fn send_encoded(
        &self,
        topic: &str,
        encoded: &EncodedPublish,
    ) -> Result<PublishResponse, Error> {
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/records{}", encoded.query),
            body: Some(encoded.body.clone()),
            retry: if encoded.idempotent {
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
        let call = Call {
            method: Method::GET,
            target: format!("v1/topics/{topic}/records{}", query.0),
            body: None,
            retry: Retry::Read,
            hold,
        };
        self.send_records(&call, records_form::decode_read).await
    }

    /// Sends `call` asking for records in this client's [`ReadFormat`], and decodes the
    /// answer by its content type: the binary form with `binary`, JSON otherwise.
    pub(crate) async fn send_records<T: DeserializeOwned>(
        &self,
        call: &Call,
        binary: fn(&Bytes) -> Result<T, String>,
    ) -> Result<T, Error> {
        let accept = match self.read_format {
            ReadFormat::Records => Some(RECORDS_CONTENT_TYPE),
            ReadFormat::Json => None,
        };
        let answer = self.transport.execute_accepting(call, accept).await?;
        if answer.is(RECORDS_CONTENT_TYPE) {
            return binary(&answer.body).map_err(|err| Error::Decode {
                detail: format!(
                    "{} /{} answered {} with records that do not decode: {err}",
                    call.method, call.target, answer.status
                ),
            });
        }
        decode_json(call, answer.status, &answer.body)
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
        decode_json(call, status, &body)
    }
}

/// The JSON answer `body` to `call`.
fn decode_json<T: DeserializeOwned>(
    call: &Call,
    status: StatusCode,
    body: &[u8],
) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(|err| Error::Decode {
        detail: format!(
            "{} /{} answered {status} with {err}: {}",
            call.method,
            call.target,
            String::from_utf8_lossy(body)
                .chars()
                .take(200)
                .collect::<String>()
        ),
    })
}

pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Error> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} name {name:?} must match [A-Za-z0-9._-]{{1,128}}"
        )))
    }
}

/// The records of a publish as one Kafka record batch: offsets from 0, no timestamps (the
/// leader stamps each record), no Kafka producer fields (idempotency is `producer_id` and
/// `sequence` in the query).
fn record_batch_body(records: &[RecordIn]) -> Result<Bytes, Error> {
    let headers: Vec<batch::HeaderRefs<'_>> = records
        .iter()
        .map(|r| batch::text_headers(r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        .collect();
    let refs: Vec<batch::RecordRef<'_>> = records
        .iter()
        .zip(&headers)
        .map(|(r, headers)| batch::RecordRef {
            timestamp_delta: 0,
            key: r.key.as_deref().map(str::as_bytes),
            value: Some(&r.value),
            headers,
        })
        .collect();
    let header = batch::BatchHeader::unstamped(refs.len());
    let bytes: usize = records.iter().map(|r| r.value.len() + 16).sum();
    let mut out = Vec::with_capacity(batch::HEADER_BYTES + bytes);
    batch::encode(&header, &refs, &mut out);
    Ok(Bytes::from(out))
}

fn json_body(value: &impl Serialize) -> Result<Bytes, Error> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| Error::InvalidArgument(format!("cannot encode the request: {err}")))
}

/// What a test server makes of a publish this client sent, in either format: the path without
/// the query, and the request as JSON would carry it (a value that is UTF-8 as `value`, any
/// other as `value_b64`).
#[cfg(test)]
pub(crate) fn sent_publish(target: &str, body: &[u8]) -> (String, PublishRequest) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if let Ok(request) = serde_json::from_slice::<PublishRequest>(body) {
        return (path.to_string(), request);
    }
    let limits = batch::Limits::default();
    let batches = batch::decode_all(body, &limits).expect("a publish body is JSON or batches");
    let records = batches
        .iter()
        .flat_map(|b| &b.records)
        .map(|r| {
            let value = r.value.expect("a value");
            let mut record = RecordIn::binary(value);
            record.key = r
                .key
                .map(|k| String::from_utf8(k.to_vec()).expect("UTF-8 key"));
            for h in &r.headers {
                let value = h.value.expect("a header value");
                record.headers.insert(
                    h.key.to_string(),
                    String::from_utf8(value.to_vec()).expect("UTF-8 header value"),
                );
            }
            record
        })
        .collect();
    let mut request = PublishRequest {
        records,
        producer_id: None,
        sequence: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').expect("name=value");
        match name {
            "producer_id" => request.producer_id = Some(value.to_string()),
            "sequence" => request.sequence = Some(value.parse().expect("a sequence")),
            other => panic!("unexpected query parameter {other}"),
        }
    }
    (path.to_string(), request)
}
