//! `POST /v1/topics/{topic}/records` (publish) and `GET /v1/topics/{topic}/records` (read).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, Uri};
use axum::Json;
use raftq_client::api::records_form;
use raftq_client::api::{
    CommitPoint, ErrorCode, PublishRequest, PublishResponse, ReadFrom, ReadResponse, Record,
    RecordIn, MAX_BATCH_RECORDS, MAX_HEADER_NAME_BYTES, MAX_KEY_BYTES, MAX_READ_RECORDS,
    MAX_RECORD_HEADERS, MAX_WAIT_MS, RECORD_BATCH_CONTENT_TYPE,
};

use super::error::ApiError;
use super::limits::Limits;
use super::openapi::responses::*;
use super::{check_name, parse_json, RecordsAnswer, TopicName};
use crate::node::AppState;
use crate::state::{
    self, producers, record_size, BatchRecord, Command, NewRecord, Outcome, ProducerSeq, Publish,
    PublishBatch, SetCursor, StoredRecord, SubRef, DEFAULT_MAX_RECORD_BYTES,
};

/// Default and upper bound of `max_bytes` on a read.
const DEFAULT_READ_BYTES: u64 = 4 << 20;
const DEFAULT_READ_RECORDS: u64 = 100;

fn query_pairs(raw: &Option<String>) -> Vec<(String, String)> {
    raw.as_deref()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// Turns a record as published into a log record; `what` names it in errors ("record 3").
/// A record key of at most [`MAX_KEY_BYTES`], for JSON and raw publishes alike.
fn check_key(what: &str, key: Option<&str>) -> Result<(), ApiError> {
    if key.is_some_and(|k| k.len() > MAX_KEY_BYTES) {
        return Err(ApiError::invalid(format!(
            "{what} has a key longer than {MAX_KEY_BYTES} bytes"
        )));
    }
    Ok(())
}

pub(crate) fn convert(what: &str, r: RecordIn) -> Result<NewRecord, ApiError> {
    check_headers(what, r.headers.len(), r.headers.keys().map(String::as_str))?;
    check_key(what, r.key.as_deref())?;
    Ok(NewRecord {
        key: r.key,
        headers: r.headers.into_iter().collect(),
        value: r.value.into(),
    })
}

/// A value given as JSON's `value` (UTF-8 text) or `value_b64` (base64), at most one of them;
/// neither is an empty value.
pub(crate) fn json_value(
    what: &str,
    value: Option<String>,
    value_b64: Option<String>,
) -> Result<Vec<u8>, ApiError> {
    match (value, value_b64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b)) => raftq_client::api::b64::decode(b.as_bytes())
            .map_err(|e| ApiError::invalid(format!("{what}: value_b64 is not valid base64: {e}"))),
        (Some(_), Some(_)) => Err(ApiError::invalid(format!(
            "{what} has both value and value_b64; send exactly one"
        ))),
        (None, None) => Ok(Vec::new()),
    }
}

/// At most [`MAX_RECORD_HEADERS`] headers, each name 1 to [`MAX_HEADER_NAME_BYTES`] bytes.
fn check_headers<'a>(
    what: &str,
    count: usize,
    mut names: impl Iterator<Item = &'a str>,
) -> Result<(), ApiError> {
    if count > MAX_RECORD_HEADERS {
        return Err(ApiError::invalid(format!(
            "{what} has {count} headers; at most {MAX_RECORD_HEADERS} are allowed"
        )));
    }
    if let Some(name) = names.find(|k| k.is_empty() || k.len() > MAX_HEADER_NAME_BYTES) {
        return Err(ApiError::invalid(format!(
            "{what} has a header name of {} bytes; names are 1 to {MAX_HEADER_NAME_BYTES} bytes",
            name.len()
        )));
    }
    Ok(())
}

/// The records of a binary publish: a body of Kafka record batches (see
/// [`raftq_client::batch`]), each record becoming one log record, checked as the state machine
/// takes them ([`state::batch_records`]: keys and header values UTF-8, since raftq's keys and
/// header values are text; values and header values not null; header names not repeated) and
/// within the API's limits. The batches' timestamps and producer fields are not used: the
/// leader stamps each record, and idempotency is `producer_id` and `sequence`.
pub(crate) fn check_batches(body: &[u8]) -> Result<Vec<BatchRecord<'_>>, ApiError> {
    let records = state::batch_records(body).map_err(ApiError::invalid)?;
    if records.len() > MAX_BATCH_RECORDS {
        return Err(ApiError::invalid(format!(
            "a publish carries 1 to {MAX_BATCH_RECORDS} records, not {}",
            records.len()
        )));
    }
    for (i, r) in records.iter().enumerate() {
        let what = format!("record {i}");
        check_key(&what, r.key)?;
        check_headers(&what, r.headers.len(), r.headers.iter().map(|h| h.0))?;
    }
    Ok(records)
}

/// The records of a binary publish as [`NewRecord`]s, for a cluster whose members do not all
/// apply batch publishes yet.
fn owned(records: &[BatchRecord<'_>]) -> Vec<NewRecord> {
    records
        .iter()
        .map(|r| NewRecord {
            key: r.key.map(str::to_owned),
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value: r.value.to_vec(),
        })
        .collect()
}

/// `producer_id` and `sequence`, from a JSON body or a binary publish's query: both or neither.
fn producer_seq(
    producer_id: Option<String>,
    sequence: Option<u64>,
) -> Result<Option<ProducerSeq>, ApiError> {
    match (producer_id, sequence) {
        (Some(producer_id), Some(sequence)) => {
            let seq = ProducerSeq {
                producer_id,
                sequence,
            };
            producers::validate(&seq)?;
            Ok(Some(seq))
        }
        (None, None) => Ok(None),
        _ => Err(ApiError::invalid(
            "producer_id and sequence go together: send both for an idempotent batch, or \
             neither",
        )),
    }
}

/// A publish's records as they go into the log.
enum Records {
    /// Kafka record batches, checked: a [`PublishBatch`].
    Batches(Bytes),
    /// One by one: a [`Publish`], for a cluster not all of whose members apply batches.
    Parsed(Vec<NewRecord>),
}

/// Records that came as JSON or as a raw body, each with its size: as one record batch,
/// encoded once here, when `as_batches`.
fn parsed(records: Vec<NewRecord>, as_batches: bool) -> (Records, Vec<u64>) {
    let sizes = records.iter().map(record_size).collect();
    let records = if as_batches {
        Records::Batches(state::encode_records(&records).into())
    } else {
        Records::Parsed(records)
    };
    (records, sizes)
}

/// The query of a raw publish (`Content-Type: application/octet-stream`), as [`publish`] reads
/// it; a JSON publish takes no query.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // described, not built: `publish` reads the raw query
pub struct RawPublishQuery {
    /// The record's key (a raw publish only; at most 4,096 bytes).
    #[param(max_length = 4096)]
    key: Option<String>,
    /// With `sequence`, makes a record batch publish idempotent (a record batch publish only;
    /// in a JSON publish it is a body field).
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    producer_id: Option<String>,
    /// The producer's batch number on this topic (a record batch publish only).
    sequence: Option<u64>,
}

/// The body of a record batch publish: Kafka record batches (magic 2, uncompressed).
pub struct RecordBatchBody;

impl utoipa::PartialSchema for RecordBatchBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        binary_body(
            "One or more Kafka record batches (magic 2, uncompressed, not transactional) back \
             to back, 1 to 10,000 records in all; keys and header values UTF-8",
        )
    }
}

/// The schema of a request body of raw bytes, described by `description`.
fn binary_body(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
        .description(Some(description))
        .into()
}

impl utoipa::ToSchema for RecordBatchBody {}

/// The body of a raw publish: the record's value, any bytes.
pub struct RawValue;

impl utoipa::PartialSchema for RawValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        binary_body("The record's value: the raw body, any bytes")
    }
}

impl utoipa::ToSchema for RawValue {}

/// Publish records
///
/// A JSON batch of 1 to 10,000 records, idempotent with `producer_id` and `sequence`; the same
/// as Kafka record batches with `Content-Type: application/vnd.raftq.record-batch` (`?producer_id=`
/// and `?sequence=` make it idempotent); or, with `Content-Type: application/octet-stream`, one
/// record whose value is the raw body (`?key=` sets its key). A 2xx means the batch is
/// committed on a majority and applied.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/records",
    operation_id = "publish",
    tag = "records",
    params(TopicName, RawPublishQuery),
    request_body(
        description = "A batch of records, or one raw record",
        content(
            (PublishRequest = "application/json"),
            (inline(RecordBatchBody) = "application/vnd.raftq.record-batch"),
            (inline(RawValue) = "application/octet-stream"),
        )
    ),
    responses(
        (status = 200, description = "Committed (or, re-sent, answered with its original \
            offsets and `duplicate: true`)", body = PublishResponse),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, TopicNotFound, SequenceGap,
        PayloadTooLarge, Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn publish(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PublishResponse>, ApiError> {
    let body = body?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_ascii_lowercase();
    // Records go into the log as record batches, unparsed, once every member applies them;
    // until then (a rolling upgrade), as records.
    let as_batches = node.publish_batches_accepted();
    let mut producer = None;
    let (records, sizes) = if content_type.starts_with("application/octet-stream") {
        let mut key = None;
        for (k, v) in query_pairs(&raw) {
            match k.as_str() {
                "key" => key = Some(v),
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter {other:?} for a raw publish"
                    )))
                }
            }
        }
        check_key("the raw record", key.as_deref())?;
        parsed(
            vec![NewRecord {
                key,
                headers: vec![],
                value: body.to_vec(),
            }],
            as_batches,
        )
    } else if content_type.starts_with("application/json") {
        let req: PublishRequest = parse_json(&body)?;
        producer = producer_seq(req.producer_id, req.sequence)?;
        if req.records.is_empty() || req.records.len() > MAX_BATCH_RECORDS {
            return Err(ApiError::invalid(format!(
                "a publish carries 1 to {MAX_BATCH_RECORDS} records, not {}",
                req.records.len()
            )));
        }
        let records = req
            .records
            .into_iter()
            .enumerate()
            .map(|(i, r)| convert(&format!("record {i}"), r))
            .collect::<Result<Vec<_>, _>>()?;
        parsed(records, as_batches)
    } else if content_type.starts_with(RECORD_BATCH_CONTENT_TYPE) {
        let (mut producer_id, mut sequence) = (None, None);
        for (k, v) in query_pairs(&raw) {
            match k.as_str() {
                "producer_id" => producer_id = Some(v),
                "sequence" => sequence = Some(parse_u64("sequence", &v)?),
                other => {
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter {other:?} for a record batch publish"
                    )))
                }
            }
        }
        producer = producer_seq(producer_id, sequence)?;
        let checked = check_batches(&body)?;
        let sizes = checked.iter().map(BatchRecord::size).collect();
        let records = if as_batches {
            Records::Batches(body.clone())
        } else {
            Records::Parsed(owned(&checked))
        };
        (records, sizes)
    } else {
        return Err(ApiError::invalid(format!(
            "unsupported Content-Type {content_type:?}: use application/json, \
             {RECORD_BATCH_CONTENT_TYPE} or application/octet-stream"
        )));
    };
    // Refuse oversize records before proposing (apply checks again, deterministically).
    let limit = node.read(|view| {
        view.state
            .topics
            .get(&topic)
            .map_or(DEFAULT_MAX_RECORD_BYTES, |m| {
                m.settings.effective_max_record_bytes()
            })
    });
    if let Some((i, size)) = sizes.iter().enumerate().find(|(_, s)| **s > limit) {
        return Err(ApiError::too_large(format!(
            "record {i} is {size} bytes; topic {topic:?} accepts at most {limit}"
        )));
    }
    let command = match records {
        Records::Batches(batches) => Command::PublishBatch(PublishBatch {
            topic,
            batches,
            producer,
        }),
        Records::Parsed(records) => Command::Publish(Publish {
            topic,
            records,
            producer,
        }),
    };
    let (outcome, cp) = super::propose(&node, &uri, command).await?;
    match outcome {
        Outcome::Published {
            first_offset,
            last_offset,
            duplicate,
        } => Ok(Json(PublishResponse {
            first_offset,
            last_offset,
            duplicate,
            commit_point: CommitPoint {
                index: cp.index,
                timestamp_ms: cp.timestamp_ms,
            },
        })),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}

/// The query of a read, as [`read_params`] parses it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // described, not built: `read_params` parses the raw query
pub struct ReadQuery {
    /// Where to start: an offset, `first`, `last` (the last record) or `next` (only records
    /// published after the call). Without it, `subscription` resumes at its cursor, and a read
    /// without either starts at `first`.
    #[param(pattern = "^([0-9]+|first|last|next)$", example = "first")]
    from: Option<String>,
    /// Read for this subscription: without `from`, start at its cursor; with `from`, move its
    /// cursor forward to `from` (never back).
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    subscription: Option<String>,
    /// Most records to return (default 100).
    #[param(minimum = 1, maximum = 10000)]
    max: Option<u64>,
    /// Most bytes of records to return (default 4 MiB); at least one record is returned.
    #[param(minimum = 1)]
    max_bytes: Option<u64>,
    /// Long-poll: wait up to this long for a record at or after `from` (default 0).
    #[param(maximum = 30000)]
    wait_ms: Option<u64>,
}

pub(crate) struct ReadParams {
    from: Option<ReadFrom>,
    subscription: Option<String>,
    max: u64,
    max_bytes: u64,
    wait: Duration,
}

fn parse_u64(name: &str, v: &str) -> Result<u64, ApiError> {
    v.parse::<u64>().map_err(|_| {
        ApiError::invalid(format!(
            "`{name}` must be a non-negative integer, not {v:?}"
        ))
    })
}

pub(crate) fn read_params(raw: &Option<String>) -> Result<ReadParams, ApiError> {
    let mut p = ReadParams {
        from: None,
        subscription: None,
        max: DEFAULT_READ_RECORDS,
        max_bytes: DEFAULT_READ_BYTES,
        wait: Duration::ZERO,
    };
    for (k, v) in query_pairs(raw) {
        match k.as_str() {
            "from" => p.from = Some(v.parse().map_err(ApiError::invalid)?),
            "subscription" => {
                check_name("subscription", &v)?;
                p.subscription = Some(v);
            }
            "max" => {
                p.max = parse_u64("max", &v)?;
                if p.max == 0 || p.max > MAX_READ_RECORDS {
                    return Err(ApiError::invalid(format!(
                        "`max` must be 1 to {MAX_READ_RECORDS}"
                    )));
                }
            }
            "max_bytes" => {
                p.max_bytes = parse_u64("max_bytes", &v)?;
                if p.max_bytes == 0 {
                    return Err(ApiError::invalid("`max_bytes` must be at least 1"));
                }
            }
            "wait_ms" => {
                let ms = parse_u64("wait_ms", &v)?;
                if ms > MAX_WAIT_MS {
                    return Err(ApiError::invalid(format!(
                        "`wait_ms` must be 0 to {MAX_WAIT_MS}"
                    )));
                }
                p.wait = Duration::from_millis(ms);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    Ok(p)
}

fn to_api(offset: u64, r: StoredRecord) -> Record {
    Record {
        offset,
        timestamp_ms: r.timestamp_ms,
        key: r.key,
        headers: r.headers.into_iter().collect(),
        value: r.value.into(),
    }
}

/// With `subscription`: where the read starts. Without `from`, at the cursor; with `from`
/// above the cursor, the cursor first moves forward to it (a write, through Raft).
/// Whether this node's applied state has the topic (and the subscription, when named).
fn exists(node: &AppState, topic: &str, sub: Option<&str>) -> bool {
    node.read(|view| {
        view.state.topics.contains_key(topic)
            && sub.is_none_or(|s| view.state.sub(topic, s).is_some())
    })
}

/// Most a read waits for its node to apply what its log already holds before it answers that
/// a topic or subscription does not exist: longer than an election, so a follower whose leader
/// just died learns what the new leader commits.
const CATCH_UP_WAIT: Duration = Duration::from_secs(3);

/// A node may hold entries in its log whose commit it has not learned yet (a follower right
/// after its leader died holds the creation of a topic that the client saw acknowledged).
/// Before such a node says "does not exist", it waits, at most [`CATCH_UP_WAIT`], until it has
/// applied its whole log as of now.
async fn catch_up(node: &AppState) {
    let target = node.status().last_log_index.unwrap_or(0);
    let mut applied = node.applied_changes();
    let _ = tokio::time::timeout(CATCH_UP_WAIT, applied.wait_for(|a| *a >= target)).await;
}

async fn subscription_start(
    node: &AppState,
    uri: &Uri,
    topic: &str,
    sub: &str,
    from: Option<ReadFrom>,
) -> Result<u64, ApiError> {
    let (cursor, target) = node.read(|view| {
        let meta = view
            .state
            .topics
            .get(topic)
            .ok_or_else(|| ApiError::topic_not_found(topic))?;
        let state = view.state.sub(topic, sub).ok_or_else(|| {
            ApiError::new(
                ErrorCode::SubscriptionNotFound,
                format!("subscription {sub:?} does not exist on topic {topic:?}"),
            )
        })?;
        let hw = meta.next_offset;
        let target = match from {
            None => state.cursor,
            Some(ReadFrom::Offset(n)) => n,
            Some(ReadFrom::First) => meta.first_offset,
            Some(ReadFrom::Last) => hw.saturating_sub(1).max(meta.first_offset),
            Some(ReadFrom::Next) => hw,
        };
        Ok::<_, ApiError>((state.cursor, target))
    })?;
    if target > cursor {
        let cmd = Command::SetCursor(SetCursor {
            sub: SubRef {
                topic: topic.to_string(),
                name: sub.to_string(),
            },
            offset: target,
            allow_backward: false,
            forward_only: true,
        });
        super::propose(node, uri, cmd).await?;
    }
    Ok(target)
}

/// Read records
///
/// Committed records only, from any node (but moving a subscription's cursor, with both
/// `subscription` and `from`, is a write for the leader). A read below the topic's first offset starts there
/// and says how many records it `skipped`.
// Serves committed records only: apply runs after commit, and records become visible to
// readers when their entry is applied. Any node serves reads from its own applied state.
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/records",
    operation_id = "read",
    tag = "records",
    params(TopicName, ReadQuery),
    responses(
        (status = 200, description = "Records (none when the wait ended first); in their \
            binary form when `Accept` names `application/vnd.raftq.records`",
            content(
                (ReadResponse = "application/json"),
                (inline(super::RecordsBody) = "application/vnd.raftq.records"),
            )),
        NotLeader,
        InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, Overloaded, Internal,
        Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn read(
    State(node): State<AppState>,
    State(limits): State<Arc<Limits>>,
    TopicName(topic): TopicName,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Result<RecordsAnswer<ReadResponse>, ApiError> {
    let answer = |r| RecordsAnswer::new(&headers, r, records_form::encode_read);
    let p = read_params(&raw)?;
    if !exists(&node, &topic, p.subscription.as_deref()) {
        catch_up(&node).await;
        // Only the leader says "does not exist": a node that is behind (one that missed all
        // its leader wrote before the leader died, say) cannot tell a topic that is not there
        // from one it has not heard of. It sends the read to the leader, or, with none known,
        // answers 503 `no_leader`, which a client retries.
        if !exists(&node, &topic, p.subscription.as_deref()) {
            node.check_leader()
                .map_err(|e| super::write_error(e, &uri))?;
        }
    }
    let deadline = tokio::time::Instant::now() + p.wait;
    let mut applied = node.applied_changes();
    let mut shutdown = node.shutdown_rx();
    // `next` means "after the call": pin it to the high watermark seen first.
    let mut start: Option<u64> = match (&p.subscription, p.from) {
        (Some(sub), from) => Some(subscription_start(&node, &uri, &topic, sub, from).await?),
        (None, Some(ReadFrom::Offset(n))) => Some(n),
        (None, _) => None,
    };
    let mut waiting = None;
    loop {
        applied.borrow_and_update();
        let (meta, hw, from, skipped) = node.read(|view| {
            let meta = view
                .state
                .topics
                .get(&topic)
                .ok_or_else(|| ApiError::topic_not_found(&topic))?
                .clone();
            let hw = meta.next_offset;
            let from = *start.get_or_insert(match p.from {
                Some(ReadFrom::Offset(n)) => n,
                Some(ReadFrom::Last) => hw.saturating_sub(1).max(meta.first_offset),
                Some(ReadFrom::Next) => hw,
                Some(ReadFrom::First) | None => meta.first_offset,
            });
            let skipped = meta.first_offset.saturating_sub(from);
            let from = from.max(meta.first_offset);
            Ok::<_, ApiError>((meta, hw, from, skipped))
        })?;
        if from < hw {
            let rows = node
                .read_records(&meta, from..hw, p.max, p.max_bytes)
                .map_err(|e| ApiError::internal(format!("reading records: {e}")))?;
            let next_offset = rows.last().map_or(from, |(o, _)| o + 1);
            let records = rows.into_iter().map(|(o, r)| to_api(o, r)).collect();
            return answer(ReadResponse {
                records,
                next_offset,
                high_watermark: hw,
                skipped,
            });
        }
        let empty = ReadResponse {
            records: vec![],
            next_offset: from,
            high_watermark: hw,
            skipped,
        };
        if *shutdown.borrow() || tokio::time::Instant::now() >= deadline {
            return answer(empty);
        }
        if waiting.is_none() {
            waiting = Some(limits.long_poll()?);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return answer(empty),
            _ = shutdown.changed() => return answer(empty),
            changed = applied.changed() => if changed.is_err() { return answer(empty) },
        }
    }
}
