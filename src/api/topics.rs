//! `PUT/GET/DELETE /v1/topics/{topic}` and `GET /v1/topics`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use raftq_client::api::{CommitPoint, Retention, TopicConfig, TopicInfo, TopicList, TopicSummary};

use super::error::ApiError;
use super::openapi::responses::*;
use super::{parse_json, Access, TopicName};
use crate::node::AppState;
use crate::state::{Command, CreateTopic, DeleteTopic, Outcome, SmState, TopicMeta, TopicSettings};

fn settings_from_api(c: &TopicConfig) -> TopicSettings {
    TopicSettings {
        max_age_ms: c.retention.max_age_ms,
        max_bytes: c.retention.max_bytes,
        max_records: c.retention.max_records,
        max_record_bytes: c.max_record_bytes,
        until_acked: c.retention.until_acked,
    }
}

fn config_to_api(s: &TopicSettings) -> TopicConfig {
    TopicConfig {
        retention: Retention {
            max_age_ms: s.max_age_ms,
            max_bytes: s.max_bytes,
            max_records: s.max_records,
            until_acked: s.until_acked,
        },
        max_record_bytes: s.max_record_bytes,
    }
}

pub fn summary(state: &SmState, name: &str, meta: &TopicMeta) -> TopicSummary {
    TopicSummary {
        name: name.to_string(),
        first_offset: meta.first_offset,
        next_offset: meta.next_offset,
        records: meta.records(),
        bytes: meta.bytes,
        subscriptions: state.subs_of(name).count() as u64,
    }
}

fn info(node: &AppState, name: &str) -> Result<TopicInfo, ApiError> {
    node.read(|view| {
        let meta = view
            .state
            .topics
            .get(name)
            .ok_or_else(|| ApiError::topic_not_found(name))?;
        Ok(TopicInfo {
            summary: summary(&view.state, name, meta),
            config: config_to_api(&meta.settings),
            commit_point: CommitPoint {
                index: view.commit_point.index,
                timestamp_ms: view.commit_point.timestamp_ms,
            },
        })
    })
}

/// Create a topic
///
/// Idempotent: the same configuration again answers 200; a different one, 409.
#[utoipa::path(
    put,
    path = "/v1/topics/{topic}",
    operation_id = "create_topic",
    tag = "topics",
    params(TopicName),
    request_body(content = Option<TopicConfig>, content_type = "application/json",
        description = "The topic's configuration; every field is optional, and so is the body"),
    responses(
        (status = 201, description = "Created", body = TopicInfo),
        (status = 200, description = "A topic of the same configuration exists", body = TopicInfo),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, AlreadyExists, PayloadTooLarge,
        Overloaded, Internal, Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn create(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let config: TopicConfig = if body.iter().all(u8::is_ascii_whitespace) {
        TopicConfig::default()
    } else {
        parse_json(&body)?
    };
    let settings = settings_from_api(&config);
    crate::state::validate_settings(&settings)?;
    let (outcome, _) = super::propose(
        &node,
        &uri,
        Command::CreateTopic(CreateTopic {
            name: topic.clone(),
            settings,
        }),
    )
    .await?;
    let status = if outcome == Outcome::TopicCreated {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    // Read back from this node's applied state: the command was applied here before the answer.
    Ok((status, Json(info(&node, &topic)?)).into_response())
}

/// List topics
///
/// The topics the caller's token may see (every topic when the API is open).
#[utoipa::path(
    get,
    path = "/v1/topics",
    operation_id = "list_topics",
    tag = "topics",
    responses(
        (status = 200, description = "The topics", body = TopicList),
        Unauthorized, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(node): State<AppState>,
    Extension(access): Extension<Access>,
) -> Json<TopicList> {
    Json(node.read(|view| {
        TopicList {
            topics: view
                .state
                .topics
                .iter()
                .filter(|(n, _)| access.sees(n))
                .map(|(n, m)| summary(&view.state, n, m))
                .collect(),
        }
    }))
}

/// Describe a topic
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}",
    operation_id = "get_topic",
    tag = "topics",
    params(TopicName),
    responses(
        (status = 200, description = "The topic", body = TopicInfo),
        InvalidArgument, Unauthorized, Forbidden, TopicNotFound, Overloaded, Unavailable,
    ),
    security(("bearer" = [])),
)]
pub async fn get(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
) -> Result<Json<TopicInfo>, ApiError> {
    Ok(Json(info(&node, &topic)?))
}

/// Delete a topic, its records and its subscriptions
#[utoipa::path(
    delete,
    path = "/v1/topics/{topic}",
    operation_id = "delete_topic",
    tag = "topics",
    params(TopicName),
    responses(
        (status = 204, description = "Deleted"),
        NotLeader, InvalidArgument, Unauthorized, Forbidden, TopicNotFound, Overloaded, Internal,
        Unavailable, Indeterminate,
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    State(node): State<AppState>,
    TopicName(topic): TopicName,
    uri: Uri,
) -> Result<StatusCode, ApiError> {
    super::propose(
        &node,
        &uri,
        Command::DeleteTopic(DeleteTopic { name: topic }),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
