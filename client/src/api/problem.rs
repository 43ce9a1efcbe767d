//! Errors as RFC 9457 problems with the stable codes of API.md, and the broadcast markers'
//! header names.

use super::*;

/// Header of a broadcast marker: the index of the log entry that appended it.
pub const HEADER_COMMIT_INDEX: &str = "raftq-commit-index";
/// Header of a broadcast marker: the leader timestamp of that entry.
pub const HEADER_COMMIT_TIMESTAMP_MS: &str = "raftq-commit-timestamp-ms";

/// The stable, machine-readable error codes of API.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidArgument,
    Unauthorized,
    Forbidden,
    TopicNotFound,
    SubscriptionNotFound,
    AlreadyExists,
    PayloadTooLarge,
    NotLeader,
    NoLeader,
    ShuttingDown,
    SequenceGap,
    Overloaded,
    Internal,
    /// A code this SDK does not know (a newer server).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code API.md defines: all but [`ErrorCode::Unknown`], which only an SDK meets.
    pub const DOCUMENTED: [ErrorCode; 13] = [
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::TopicNotFound,
        ErrorCode::SubscriptionNotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PayloadTooLarge,
        ErrorCode::NotLeader,
        ErrorCode::NoLeader,
        ErrorCode::ShuttingDown,
        ErrorCode::SequenceGap,
        ErrorCode::Overloaded,
        ErrorCode::Internal,
    ];

    /// The code as it appears in a problem body.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TopicNotFound => "topic_not_found",
            ErrorCode::SubscriptionNotFound => "subscription_not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::NoLeader => "no_leader",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::SequenceGap => "sequence_gap",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Internal => "internal",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The HTTP status API.md pairs with the code.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::TopicNotFound | ErrorCode::SubscriptionNotFound => 404,
            ErrorCode::AlreadyExists | ErrorCode::SequenceGap => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::NotLeader => 307,
            ErrorCode::Overloaded => 429,
            ErrorCode::NoLeader | ErrorCode::ShuttingDown => 503,
            ErrorCode::Internal | ErrorCode::Unknown => 500,
        }
    }

    /// A short human title for the code.
    pub fn title(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "Invalid argument",
            ErrorCode::Unauthorized => "Unauthorized",
            ErrorCode::Forbidden => "Forbidden",
            ErrorCode::TopicNotFound => "Topic not found",
            ErrorCode::SubscriptionNotFound => "Subscription not found",
            ErrorCode::AlreadyExists => "Already exists with a different configuration",
            ErrorCode::PayloadTooLarge => "Payload too large",
            ErrorCode::NotLeader => "Not the leader",
            ErrorCode::NoLeader => "No leader",
            ErrorCode::ShuttingDown => "Shutting down",
            ErrorCode::SequenceGap => "Sequence gap",
            ErrorCode::Overloaded => "Overloaded",
            ErrorCode::Internal => "Internal error",
            ErrorCode::Unknown => "Unknown error",
        }
    }
}

/// A problem's `code`: one of [`ErrorCode::DOCUMENTED`] (a server never answers `unknown`).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::DOCUMENTED.iter().map(|c| c.as_str())))
            .description(Some(
                "The stable, machine-readable error code (API.md lists each with its status)",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ErrorCode {}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An RFC 9457 problem body, as every error of the API is answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: ErrorCode,
    /// With `not_leader` and `shutting_down`: the leader's id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_id: Option<u64>,
    /// With `not_leader` and `shutting_down`: the leader's base URL, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_url: Option<String>,
    /// With `sequence_gap`: the batch sequence the server expects next from that producer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_sequence: Option<u64>,
}

impl Problem {
    /// A problem for `code` with a human `detail`.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Problem {
            type_: format!("https://raftq.dev/problems/{}", code.as_str()),
            title: code.title().to_string(),
            status: code.status(),
            detail: detail.into(),
            code,
            leader_id: None,
            expected_sequence: None,
            leader_url: None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.title, self.code, self.detail)
    }
}
