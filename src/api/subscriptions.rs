//! Subscriptions: `PUT/GET/DELETE .../subscriptions/{sub}`, the list, `pull`, `ack`, `nack`,
//! `extend` and `cursor` (docs/subscriptions.md has the semantics).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use raftq_client::api::records_form;
use raftq_client::api::{
    AckRequest, CursorRequest, CursorResponse, ErrorCode, ExtendRequest, Message, NackRequest,
    PullRequest, PullResponse, ReceiptResult, ReceiptResults, ReceiptStatus, SubscriptionConfig,
    SubscriptionInfo, SubscriptionList, SubscriptionStart, DEFAULT_ACK_TIMEOUT_MS,
    MAX_ACK_TIMEOUT_MS, MAX_NACK_DELAY_MS, MAX_NAME_LEN, MAX_PULL, MAX_RECEIPTS, MAX_WAIT_MS,
};

use super::error::ApiError;
use super::limits::Limits;
use super::openapi::responses::*;
use super::{check_name, parse_json, Access, RecordsAnswer, TopicName};
use crate::node::AppState;
use crate::state::{
    Command, CreateSub, Delivery, Outcome, Pull, Receipt, ReceiptAction, ReceiptOutcome, SetCursor,
    SettleReceipts, SmState, Start, SubRef, SubSettings, SubState,
};

/// Default number of records one pull leases.
const DEFAULT_PULL: u32 = 10;

/// The `{topic}` and `{sub}` path segments, checked.
pub struct SubPath(pub SubRef);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SubPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let axum::extract::Path((topic, name)) =
            axum::extract::Path::<(String, String)>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::invalid(format!("invalid path: {}", e.body_text())))?;
        check_name("topic", &topic)?;
        check_name("subscription", &name)?;
        Ok(SubPath(SubRef { topic, name }))
    }
}

/// Described as the `{topic}` and `{sub}` path parameters.
impl utoipa::IntoParams for SubPath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![
            super::name_param("topic", "The topic's name"),
            super::name_param("sub", "The subscription's name"),
        ]
    }
}

fn not_found(sub: &SubRef) -> ApiError {
    ApiError::new(
        ErrorCode::SubscriptionNotFound,
        format!(
            "subscription {:?} does not exist on topic {:?}",
            sub.name, sub.topic
        ),
    )
}

pub(crate) fn settings_from_api(c: &SubscriptionConfig) -> Result<SubSettings, ApiError> {
    let ack_timeout_ms = c.ack_timeout_ms.unwrap_or(DEFAULT_ACK_TIMEOUT_MS);
    check_timeout("ack_timeout_ms", ack_timeout_ms)?;
    if let Some(dlq) = &c.dead_letter_topic {
        check_name("dead_letter_topic", dlq)?;
    }
    Ok(SubSettings {
        start: match c.start {
            SubscriptionStart::First => Start::First,
            SubscriptionStart::Next => Start::Next,
            SubscriptionStart::Offset(n) => Start::Offset(n),
        },
        ack_timeout_ms,
        max_deliveries: c.max_deliveries,
        dead_letter_topic: c.dead_letter_topic.clone(),
    })
}

fn config_to_api(s: &SubSettings) -> SubscriptionConfig {
    SubscriptionConfig {
        start: match s.start {
            Start::First => SubscriptionStart::First,
            Start::Next => SubscriptionStart::Next,
            Start::Offset(n) => SubscriptionStart::Offset(n),
        },
        ack_timeout_ms: Some(s.ack_timeout_ms),
        max_deliveries: s.max_deliveries,
        dead_letter_topic: s.dead_letter_topic.clone(),
    }
}

/// The API view of a subscription.
pub fn info(state: &SmState, sub: &SubState) -> SubscriptionInfo {
    let hw = state.topics.get(&sub.topic).map_or(0, |t| t.next_offset);
    SubscriptionInfo {
        topic: sub.topic.clone(),
        name: sub.name.clone(),
        cursor: sub.cursor,
        backlog: sub.backlog(hw),
        in_flight: sub.leases.len() as u64,
        delivered: sub.counters.delivered,
        acked: sub.counters.acked,
        redelivered: sub.counters.redelivered,
        dead_lettered: sub.dead_lettered_total(),
        expired_leases: sub.counters.expired_leases,
        config: config_to_api(&sub.settings),
    }
}

fn local_info(node: &AppState, sub: &SubRef) -> Result<SubscriptionInfo, ApiError> {
    node.read(|view| {
        if !view.state.topics.contains_key(&sub.topic) {
            return Err(ApiError::topic_not_found(&sub.topic));
        }
        let state = view
            .state
            .sub(&sub.topic, &sub.name)
            .ok_or_else(|| not_found(sub))?;
        Ok(info(&view.state, state))
    })
}

fn check_timeout(field: &str, ms: u64) -> Result<(), ApiError> {
    if ms == 0 || ms > MAX_ACK_TIMEOUT_MS {
        return Err(ApiError::invalid(format!(
            "{field} must be between 1 and {MAX_ACK_TIMEOUT_MS} ms, not {ms}"
        )));
    }
    Ok(())
}

/// An empty body means "all defaults".
pub(crate) fn parse_optional<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse_json(body)
    }
}

/// Create a subscription
///
/// Idempotent: the same configuration again answers 200; a different one, 409.
#[utoipa::path(
    put,
    path = "/v1/topics/{topic}/subscriptions/{sub}",
    operation_id = "create_subscription",
    tag = "subscriptions",
    params(SubPath),
    request_body(content = Option<SubscriptionConfig>, content_type = "application/json",
        description = "The subscription's configuration; every field is optional, and so is the body"),
    responses(
        (status = 201, description = "Created", body = SubscriptionInfo),
        (status = 200, description = "A subscription of the same configuration exists",
            body = SubscriptionInfo),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, TopicNotFound, AlreadyExists,
        PayloadTooLarge, Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn create(
    State(node): State<AppState>,
    Extension(access): Extension<Access>,
    SubPath(sub): SubPath,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let config: SubscriptionConfig = parse_optional(&body?)?;
    let settings = settings_from_api(&config)?;
    // A dead letter appends to the dead-letter topic: whoever names one must be allowed to
    // publish there, or `consume` on one topic would be `publish` on any other.
    if let Some(dlq) = &settings.dead_letter_topic {
        access.require(crate::tokens::Action::Publish, dlq)?;
    }
    let cmd = Command::CreateSubscription(CreateSub {
        topic: sub.topic.clone(),
        name: sub.name.clone(),
        settings,
    });
    let (outcome, _) = super::propose(&node, &uri, cmd).await?;
    let status = if outcome == Outcome::SubscriptionCreated {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(local_info(&node, &sub)?)).into_response())
}

/// Describe a subscription
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/subscriptions/{sub}",
    operation_id = "get_subscription",
    tag = "subscriptions",
    params(SubPath),
    responses(
        (status = 200, description = "The subscription", body = SubscriptionInfo),
        InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn get(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
) -> Result<Json<SubscriptionInfo>, ApiError> {
    Ok(Json(local_info(&node, &sub)?))
}

/// List the subscriptions of a topic
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/subscriptions",
    operation_id = "list_subscriptions",
    tag = "subscriptions",
    params(TopicName),
    responses(
        (status = 200, description = "The topic's subscriptions", body = SubscriptionList),
        InvalidArgument, Unauthorized, Forbidden, TopicNotFound, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
) -> Result<Json<SubscriptionList>, ApiError> {
    node.read(|view| {
        if !view.state.topics.contains_key(&topic) {
            return Err(ApiError::topic_not_found(&topic));
        }
        let subscriptions = view
            .state
            .subs_of(&topic)
            .map(|s| info(&view.state, s))
            .collect();
        Ok(Json(SubscriptionList { subscriptions }))
    })
}

/// Delete a subscription
#[utoipa::path(
    delete,
    path = "/v1/topics/{topic}/subscriptions/{sub}",
    operation_id = "delete_subscription",
    tag = "subscriptions",
    params(SubPath),
    responses(
        (status = 204, description = "Deleted"),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, Overloaded,
        Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
    uri: Uri,
) -> Result<StatusCode, ApiError> {
    super::propose(&node, &uri, Command::DeleteSubscription(sub)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lease records
///
/// Leases records through Raft; long-polls (`wait_ms`) until at least one can be leased or the
/// wait ends. Ack, nack or extend each by its `receipt`.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/subscriptions/{sub}/pull",
    operation_id = "pull",
    tag = "subscriptions",
    params(SubPath),
    request_body(content = Option<PullRequest>, content_type = "application/json",
        description = "Every field is optional, and so is the body"),
    responses(
        (status = 200, description = "Leased records, lowest offsets first (none when the \
            wait ended first); in their binary form when `Accept` names \
            `application/vnd.raftq.records`",
            content(
                (PullResponse = "application/json"),
                (inline(super::RecordsBody) = "application/vnd.raftq.records"),
            )),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn pull(
    State(node): State<AppState>,
    State(limits): State<Arc<Limits>>,
    SubPath(sub): SubPath,
    headers: HeaderMap,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<RecordsAnswer<PullResponse>, ApiError> {
    let answer = |messages| {
        RecordsAnswer::new(&headers, PullResponse { messages }, |r: &PullResponse| {
            records_form::encode_pull(&r.messages)
        })
    };
    let req: PullRequest = parse_optional(&body?)?;
    let max = req.max.unwrap_or(DEFAULT_PULL);
    if max == 0 || max > MAX_PULL {
        return Err(ApiError::invalid(format!(
            "max must be between 1 and {MAX_PULL}, not {max}"
        )));
    }
    let wait_ms = req.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::invalid(format!(
            "wait_ms must be 0 to {MAX_WAIT_MS}"
        )));
    }
    if let Some(ms) = req.ack_timeout_ms {
        check_timeout("ack_timeout_ms", ms)?;
    }
    if req
        .consumer
        .as_ref()
        .is_some_and(|c| c.len() > MAX_NAME_LEN)
    {
        return Err(ApiError::invalid(format!(
            "consumer must be at most {MAX_NAME_LEN} bytes"
        )));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let mut applied = node.applied_changes();
    let mut shutdown = node.shutdown_rx();
    let cmd = Command::Pull(Pull {
        sub: sub.clone(),
        max,
        ack_timeout_ms: req.ack_timeout_ms,
    });
    let mut waiting = None;
    loop {
        applied.borrow_and_update();
        // Propose only when something can be leased (or to let Raft answer: a follower
        // redirects, a missing subscription is refused), so a waiting pull writes nothing.
        let worth_proposing = node.read(|view| {
            let hw = view
                .state
                .topics
                .get(&sub.topic)
                .map_or(0, |t| t.next_offset);
            match view.state.sub(&sub.topic, &sub.name) {
                Some(s) => s.has_available(hw, node.now_ms()),
                None => true,
            }
        }) || !node.is_leader();
        let out_of_time = tokio::time::Instant::now() >= deadline;
        if worth_proposing || out_of_time {
            let deliveries = match super::propose(&node, &uri, cmd.clone()).await?.0 {
                Outcome::Pulled(d) => d,
                other => return Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
            };
            if !deliveries.is_empty() || out_of_time {
                return answer(messages(&node, &sub, deliveries)?);
            }
        }
        if *shutdown.borrow() {
            return answer(vec![]);
        }
        if waiting.is_none() {
            waiting = Some(limits.long_poll()?);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => return answer(vec![]),
            changed = applied.changed() => if changed.is_err() {
                return answer(vec![]);
            },
        }
    }
}

/// Fills leased deliveries with their records, read from this (the leader's) applied state.
/// Deliveries of consecutive offsets (the usual case) are read with one range read each.
fn messages(
    node: &AppState,
    sub: &SubRef,
    deliveries: Vec<Delivery>,
) -> Result<Vec<Message>, ApiError> {
    let Some(meta) = node.read(|view| view.state.topics.get(&sub.topic).cloned()) else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(deliveries.len());
    let mut rest = deliveries.as_slice();
    while let Some(first) = rest.first() {
        let run = 1 + rest
            .windows(2)
            .take_while(|w| w[0].receipt.offset.checked_add(1) == Some(w[1].receipt.offset))
            .count();
        let (group, tail) = rest.split_at(run);
        rest = tail;
        let from = first.receipt.offset;
        let rows = node
            .read_records(
                &meta,
                from..from.saturating_add(run as u64),
                run as u64,
                u64::MAX,
            )
            .map_err(|e| ApiError::internal(format!("reading records from {from}: {e}")))?;
        let mut rows = rows.into_iter().peekable();
        for d in group {
            let offset = d.receipt.offset;
            while rows.next_if(|(o, _)| *o < offset).is_some() {}
            // A record gone since (its topic deleted) is not sent; its lease simply expires.
            let Some((_, record)) = rows.next_if(|(o, _)| *o == offset) else {
                continue;
            };
            out.push(Message {
                receipt: d.receipt.to_string(),
                offset,
                delivery_count: d.delivery_count,
                lease_expires_ms: d.expires_ms,
                timestamp_ms: record.timestamp_ms,
                key: record.key,
                headers: record.headers.into_iter().collect(),
                value: record.value.into(),
            });
        }
    }
    Ok(out)
}

pub(crate) fn parse_receipts(receipts: &[String]) -> Result<Vec<Receipt>, ApiError> {
    if receipts.is_empty() || receipts.len() > MAX_RECEIPTS {
        return Err(ApiError::invalid(format!(
            "receipts must hold 1 to {MAX_RECEIPTS} receipts, not {}",
            receipts.len()
        )));
    }
    receipts
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Receipt::parse(r).ok_or_else(|| {
                ApiError::invalid(format!("receipt {i} ({r:?}) is not a receipt raftq issued"))
            })
        })
        .collect()
}

async fn settle(
    node: &AppState,
    uri: &Uri,
    sub: SubRef,
    texts: Vec<String>,
    action: ReceiptAction,
) -> Result<Json<ReceiptResults>, ApiError> {
    let receipts = parse_receipts(&texts)?;
    let cmd = Command::SettleReceipts(SettleReceipts {
        sub,
        action,
        receipts,
    });
    let outcomes = match super::propose(node, uri, cmd).await?.0 {
        Outcome::Receipts(r) => r,
        other => return Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    };
    let results = texts
        .into_iter()
        .zip(outcomes)
        .map(|(receipt, outcome)| {
            let (status, lease_expires_ms) = match outcome {
                ReceiptOutcome::Acked => (ReceiptStatus::Acked, None),
                ReceiptOutcome::Released => (ReceiptStatus::Released, None),
                ReceiptOutcome::DeadLettered => (ReceiptStatus::DeadLettered, None),
                ReceiptOutcome::Extended { expires_ms } => {
                    (ReceiptStatus::Extended, Some(expires_ms))
                }
                ReceiptOutcome::Stale => (ReceiptStatus::Stale, None),
            };
            ReceiptResult {
                receipt,
                status,
                lease_expires_ms,
            }
        })
        .collect();
    Ok(Json(ReceiptResults { results }))
}

/// Acknowledge deliveries
///
/// `acked`, or `stale` for a receipt whose lease expired and was delivered again, or that
/// was acked already: a stale receipt changes nothing.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/subscriptions/{sub}/ack",
    operation_id = "ack",
    tag = "subscriptions",
    params(SubPath),
    request_body = AckRequest,
    responses(
        (status = 200, description = "One result per receipt, in order", body = ReceiptResults),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn ack(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReceiptResults>, ApiError> {
    let req: AckRequest = parse_json(&body?)?;
    settle(&node, &uri, sub, req.receipts, ReceiptAction::Ack).await
}

/// Release deliveries
///
/// `released` (available again at the same offset, after `delay_ms`), `dead_lettered`, or
/// `stale`.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/subscriptions/{sub}/nack",
    operation_id = "nack",
    tag = "subscriptions",
    params(SubPath),
    request_body = NackRequest,
    responses(
        (status = 200, description = "One result per receipt, in order", body = ReceiptResults),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn nack(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReceiptResults>, ApiError> {
    let req: NackRequest = parse_json(&body?)?;
    if req.delay_ms > MAX_NACK_DELAY_MS {
        return Err(ApiError::invalid(format!(
            "delay_ms must be at most {MAX_NACK_DELAY_MS}"
        )));
    }
    let action = ReceiptAction::Nack {
        delay_ms: req.delay_ms,
        dead_letter: req.dead_letter,
    };
    settle(&node, &uri, sub, req.receipts, action).await
}

/// Extend leases
///
/// `extended` with the new `lease_expires_ms`, or `stale`.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/subscriptions/{sub}/extend",
    operation_id = "extend",
    tag = "subscriptions",
    params(SubPath),
    request_body = ExtendRequest,
    responses(
        (status = 200, description = "One result per receipt, in order", body = ReceiptResults),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn extend(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ReceiptResults>, ApiError> {
    let req: ExtendRequest = parse_json(&body?)?;
    if let Some(ms) = req.ack_timeout_ms {
        check_timeout("ack_timeout_ms", ms)?;
    }
    let action = ReceiptAction::Extend {
        ack_timeout_ms: req.ack_timeout_ms,
    };
    settle(&node, &uri, sub, req.receipts, action).await
}

/// Move the cursor
///
/// Every offset below the cursor is done. It moves back only with `allow_backward`.
#[utoipa::path(
    put,
    path = "/v1/topics/{topic}/subscriptions/{sub}/cursor",
    operation_id = "set_cursor",
    tag = "subscriptions",
    params(SubPath),
    request_body = CursorRequest,
    responses(
        (status = 200, description = "The cursor now", body = CursorResponse),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, SubscriptionNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn cursor(
    State(node): State<AppState>,
    SubPath(sub): SubPath,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CursorResponse>, ApiError> {
    let req: CursorRequest = parse_json(&body?)?;
    let cmd = Command::SetCursor(SetCursor {
        sub,
        offset: req.offset,
        allow_backward: req.allow_backward,
        forward_only: false,
    });
    match super::propose(&node, &uri, cmd).await?.0 {
        Outcome::CursorSet(cursor) => Ok(Json(CursorResponse { cursor })),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}
