//! API errors: every error leaves the server as an RFC 9457 problem with a code of API.md.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use raftq_client::api::{ErrorCode, Problem};

use crate::state::ApplyError;

/// An error answer: the problem body plus the headers some codes carry.
#[derive(Debug)]
pub struct ApiError {
    pub problem: Box<Problem>,
    /// `Location` of a 307 redirect to the leader.
    pub location: Option<String>,
    /// `Retry-After` seconds for 503 answers.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ApiError {
            problem: Box::new(Problem::new(code, detail)),
            location: None,
            retry_after: None,
        }
    }

    /// Overrides the HTTP status (for answers API.md does not pair with a code, e.g. 404 for
    /// an unknown path).
    pub fn with_status(mut self, status: u16) -> Self {
        self.problem.status = status;
        self
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, detail)
    }

    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, detail)
    }

    pub fn topic_not_found(topic: &str) -> Self {
        Self::new(
            ErrorCode::TopicNotFound,
            format!("topic {topic:?} does not exist"),
        )
    }

    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, detail)
    }

    /// 307 to the leader, carrying `leader_id` and `leader_url` in the body too.
    pub fn not_leader(leader_id: u64, leader_url: &str, path_and_query: &str) -> Self {
        let mut e = Self::new(
            ErrorCode::NotLeader,
            format!("this node is not the leader; send writes to node {leader_id} at {leader_url}"),
        );
        e.problem.leader_id = Some(leader_id);
        e.problem.leader_url = Some(leader_url.to_string());
        e.location = Some(format!(
            "{}{}",
            leader_url.trim_end_matches('/'),
            path_and_query
        ));
        e
    }

    pub fn no_leader() -> Self {
        let mut e = Self::new(
            ErrorCode::NoLeader,
            "no leader is known right now (election in progress or no quorum); the command was not proposed, retry",
        );
        e.retry_after = Some(1);
        e
    }

    pub fn shutting_down(leader: Option<(u64, String)>) -> Self {
        let mut e = Self::new(
            ErrorCode::ShuttingDown,
            "this node is shutting down; the request was not processed, send it to another node",
        );
        if let Some((id, url)) = leader {
            e.problem.leader_id = Some(id);
            e.problem.leader_url = Some(url);
        }
        e.retry_after = Some(1);
        e
    }

    pub fn overloaded(detail: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorCode::Overloaded, detail);
        e.retry_after = Some(1);
        e
    }

    /// An answer whose outcome is unknown: the command may or may not take effect.
    pub fn indeterminate(detail: impl Into<String>) -> Self {
        Self::internal(format!(
            "outcome unknown: {}; retry with the same idempotency data",
            detail.into()
        ))
        .with_status(504)
    }
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> Self {
        let code = match &e {
            ApplyError::TopicNotFound(_) => ErrorCode::TopicNotFound,
            ApplyError::SubscriptionNotFound(..) => ErrorCode::SubscriptionNotFound,
            ApplyError::AlreadyExists(_) => ErrorCode::AlreadyExists,
            ApplyError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            ApplyError::RecordTooLarge(_) => ErrorCode::PayloadTooLarge,
            ApplyError::SequenceGap { .. } => ErrorCode::SequenceGap,
        };
        let mut err = ApiError::new(code, e.to_string());
        if let ApplyError::SequenceGap { expected, .. } = e {
            err.problem.expected_sequence = Some(expected);
        }
        err
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(format!("request body too large: {}", r.body_text()))
        } else {
            ApiError::invalid(format!("unreadable request body: {}", r.body_text()))
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.problem).unwrap_or_default();
        let mut resp = (status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(loc) = self.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
            h.insert(header::LOCATION, loc);
        }
        if let Some(secs) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
