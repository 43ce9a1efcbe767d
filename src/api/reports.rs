//! Commit points and reports (`GET /v1/topics/{topic}/report`, `GET /v1/report`) and
//! `POST /v1/broadcast`.
//!
//! Reports are served by any node from its applied state, under one read of the view: every
//! counter in one answer is as of the one commit point it names. The leader's is the freshest.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::Uri;
use axum::{Extension, Json};
use raftq_client::api::{
    BroadcastRequest, BroadcastResponse, CommitPoint, Discarded, RecordIn, Report,
    SubscriptionReport, TopicReport,
};

use super::error::ApiError;
use super::openapi::responses::*;
use super::{check_name, parse_json, Access, TopicName};
use crate::node::AppState;
use crate::state::{self, Broadcast, Command, Outcome, SmState, SubState, TopicMeta};
use crate::tokens::Action;

fn commit_point(cp: state::CommitPoint) -> CommitPoint {
    CommitPoint {
        index: cp.index,
        timestamp_ms: cp.timestamp_ms,
    }
}

/// The report of one subscription whose topic's next offset is `high_watermark`.
pub fn subscription_report(sub: &SubState, high_watermark: u64) -> SubscriptionReport {
    let c = &sub.counters;
    SubscriptionReport {
        delivered: c.delivered,
        acked: c.acked,
        redelivered: c.redelivered,
        expired_leases: c.expired_leases,
        dead_lettered: sub.dead_lettered_total(),
        cursor: sub.cursor,
        seen: sub.seen(high_watermark),
        skipped: c.skipped,
        backlog: sub.backlog(high_watermark),
        in_flight: sub.leases.len() as u64,
        discarded: Discarded {
            retention: c.discarded_retention,
            max_deliveries: c.discarded_max_deliveries,
            rejected: c.discarded_rejected,
        },
    }
}

/// The report of topic `name` as of `cp`.
pub fn topic_report(
    state: &SmState,
    name: &str,
    meta: &TopicMeta,
    cp: state::CommitPoint,
) -> TopicReport {
    let c = &meta.counters;
    TopicReport {
        commit_point: commit_point(cp),
        published: c.published,
        deduplicated: c.deduplicated,
        discarded: Discarded {
            retention: c.discarded_retention,
            max_deliveries: c.discarded_max_deliveries,
            rejected: c.discarded_rejected,
        },
        records: meta.records(),
        subscriptions: state
            .subs_of(name)
            .map(|sub| (sub.name.clone(), subscription_report(sub, meta.next_offset)))
            .collect(),
    }
}

/// Report on a topic
///
/// Cumulative counters (they never decrease, so two reports subtract) as of one commit point:
/// every record published at or before its timestamp is durable and counted.
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/report",
    operation_id = "topic_report",
    tag = "reports",
    params(TopicName),
    responses(
        (status = 200, description = "The topic's report", body = TopicReport),
        InvalidArgument, Unauthorized, Forbidden, TopicNotFound, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn topic(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
) -> Result<Json<TopicReport>, ApiError> {
    node.read(|view| {
        let meta = view
            .state
            .topics
            .get(&topic)
            .ok_or_else(|| ApiError::topic_not_found(&topic))?;
        Ok(Json(topic_report(
            &view.state,
            &topic,
            meta,
            view.commit_point,
        )))
    })
}

/// Report on every topic
///
/// The report of every topic the caller's token may see, as of one commit point.
#[utoipa::path(
    get,
    path = "/v1/report",
    operation_id = "report",
    tag = "reports",
    responses(
        (status = 200, description = "Every visible topic's report", body = Report),
        Unauthorized, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn all(
    State(node): State<AppState>,
    Extension(access): Extension<Access>,
) -> Json<Report> {
    Json(node.read(|view| {
        Report {
            commit_point: commit_point(view.commit_point),
            topics: view
                .state
                .topics
                .iter()
                .filter(|(name, _)| access.sees(name))
                .map(|(name, meta)| {
                    (
                        name.clone(),
                        topic_report(&view.state, name, meta, view.commit_point),
                    )
                })
                .collect(),
        }
    }))
}

/// Broadcast a commit-point marker
///
/// One marker record appended to every named topic (all topics when none is named) in a
/// single Raft entry, carrying the commit point in its headers. The token needs `publish` on
/// each named topic, or on every topic (`publish:*`) when none is named.
#[utoipa::path(
    post,
    path = "/v1/broadcast",
    operation_id = "broadcast",
    tag = "reports",
    request_body(content = Option<BroadcastRequest>, content_type = "application/json",
        description = "Every field is optional, and so is the body"),
    responses(
        (status = 200, description = "The markers' commit point and offsets",
            body = BroadcastResponse),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, TopicNotFound, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn broadcast(
    State(node): State<AppState>,
    Extension(access): Extension<Access>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<BroadcastResponse>, ApiError> {
    let body = body?;
    let req: BroadcastRequest = if body.iter().all(u8::is_ascii_whitespace) {
        BroadcastRequest::default()
    } else {
        parse_json(&body)?
    };
    if let Some(topics) = &req.topics {
        if topics.is_empty() {
            return Err(ApiError::invalid(
                "topics is empty: name at least one topic, or omit it for all topics",
            ));
        }
        for topic in topics {
            check_name("topic", topic)?;
            access.require(Action::Publish, topic)?;
        }
    } else {
        access.require_all(Action::Publish)?;
    }
    // A marker without a value carries an empty one: its point is in the headers.
    let value = super::records::json_value("the marker", req.value, req.value_b64)?;
    let record = super::records::convert(
        "the marker",
        RecordIn {
            value: value.into(),
            key: req.key,
            headers: req.headers,
        },
    )?;
    let (outcome, cp) = super::propose(
        &node,
        &uri,
        Command::Broadcast(Broadcast {
            topics: req.topics,
            record,
        }),
    )
    .await?;
    match outcome {
        Outcome::Broadcast { offsets } => Ok(Json(BroadcastResponse {
            commit_point: commit_point(cp),
            offsets,
        })),
        other => Err(ApiError::internal(format!("unexpected outcome {other:?}"))),
    }
}
