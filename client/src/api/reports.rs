//! Reports and broadcasts: the counters of topics and subscriptions as of a commit point.

use super::*;

/// Records discarded, by reason. Cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Discarded {
    /// Removed from the topic by its retention limits.
    pub retention: u64,
    /// Reached a subscription's `max_deliveries` with no dead-letter topic to go to.
    pub max_deliveries: u64,
    /// Nacked with `"dead_letter": true` by a consumer of a subscription with no dead-letter
    /// topic.
    pub rejected: u64,
}

/// One subscription in a report. Counters are cumulative and never decrease; `cursor`,
/// `backlog` and `in_flight` are the state at the commit point.
///
/// Balance: `seen == acked + dead_lettered + skipped + discarded.retention + backlog +
/// in_flight`, where `dead_lettered` counts records moved to the dead-letter topic and records
/// discarded by a consumer's refusal (`discarded.max_deliveries + discarded.rejected` of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionReport {
    pub delivered: u64,
    pub acked: u64,
    pub redelivered: u64,
    pub expired_leases: u64,
    pub dead_lettered: u64,
    pub cursor: u64,
    /// Offsets the subscription has had to account for: from its start to the topic's next
    /// offset, plus offsets it was moved back over (`allow_backward`), which count again.
    pub seen: u64,
    /// Records a forward cursor move passed over before they were done.
    pub skipped: u64,
    pub backlog: u64,
    pub in_flight: u64,
    /// Records discarded: `max_deliveries` and `rejected` are the part of `dead_lettered` that
    /// had no dead-letter topic to go to; `retention` counts records the topic's retention
    /// removed before this subscription was done with them.
    pub discarded: Discarded,
}

/// Answer to `GET /v1/topics/{topic}/report`. Counters are cumulative and never decrease, so
/// two reports of the same topic subtract to what happened between their commit points.
///
/// Balance: `published == records + discarded.retention`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicReport {
    pub commit_point: CommitPoint,
    /// Records appended: published (not counting duplicates), dead letters moved in, and
    /// broadcast markers.
    pub published: u64,
    /// Records of re-sent idempotent batches that were answered with their original offsets
    /// and not appended again.
    pub deduplicated: u64,
    pub discarded: Discarded,
    /// Records the topic holds now.
    pub records: u64,
    pub subscriptions: BTreeMap<String, SubscriptionReport>,
}

/// Answer to `GET /v1/report`: every topic, as of one commit point.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    pub commit_point: CommitPoint,
    pub topics: BTreeMap<String, TopicReport>,
}

/// Body of `POST /v1/broadcast`: one marker record for every named topic (all topics when
/// `topics` is omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BroadcastRequest {
    /// The topics to mark (at least one); omitted: every topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub topics: Option<Vec<String>>,
    /// The marker's value as UTF-8 text (default empty); at most one of `value` and
    /// `value_b64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The marker's value as standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
    pub value_b64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// Answer to `POST /v1/broadcast`: the commit point the markers carry, and each marker's
/// offset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BroadcastResponse {
    pub commit_point: CommitPoint,
    pub offsets: BTreeMap<String, u64>,
}
