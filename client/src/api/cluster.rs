//! Topics and the cluster: configurations, listings, status and membership changes.

use super::*;

/// Retention limits of a topic: records are removed from the front of the topic while any
/// limit is exceeded (each is optional; none means keep everything).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Remove records at least this old (by their leader timestamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_age_ms: Option<u64>,
    /// Keep the stored bytes (values, keys and headers) at or below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_bytes: Option<u64>,
    /// Keep at most this many records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_records: Option<u64>,
    /// Work queue: remove records below the cursor of every subscription (a topic without
    /// subscriptions keeps its records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub until_acked: bool,
}

/// Body of `PUT /v1/topics/{topic}`; all fields optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    #[serde(default)]
    pub retention: Retention,
    /// The largest record the topic accepts, in bytes (value, key and headers; default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16777216))]
    pub max_record_bytes: Option<u64>,
}

/// One topic in `GET /v1/topics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicSummary {
    pub name: String,
    pub first_offset: u64,
    pub next_offset: u64,
    pub records: u64,
    pub bytes: u64,
    pub subscriptions: u64,
}

/// Answer to `GET /v1/topics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicList {
    pub topics: Vec<TopicSummary>,
}

/// Answer to `GET /v1/topics/{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicInfo {
    #[serde(flatten)]
    pub summary: TopicSummary,
    pub config: TopicConfig,
    pub commit_point: CommitPoint,
}

/// One member in `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterMember {
    pub id: u64,
    pub url: String,
    pub voter: bool,
    /// Last log index known to be replicated to this member (known on the leader only).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub matched_index: Option<u64>,
}

/// The latest snapshot of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotInfo {
    pub index: u64,
    pub bytes: u64,
}

/// Answer to `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterStatus {
    pub node_id: u64,
    /// `null` while no leader is known.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub leader_id: Option<u64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub leader_url: Option<String>,
    pub term: u64,
    pub commit_index: u64,
    pub last_applied: u64,
    pub members: Vec<ClusterMember>,
    /// This node's latest snapshot; `null` before its first.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub snapshot: Option<SnapshotInfo>,
    /// With `?digest=true`: a digest of this node's whole state machine as of an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_digest: Option<StateDigest>,
}

impl ClusterStatus {
    /// Member `id`, if it is one.
    pub fn member(&self, id: u64) -> Option<&ClusterMember> {
        self.members.iter().find(|m| m.id == id)
    }

    /// How far member `id`'s log is known replicated (on the leader only; see
    /// [`ClusterMember::matched_index`]).
    pub fn matched_index(&self, id: u64) -> Option<u64> {
        self.member(id).and_then(|m| m.matched_index)
    }
}

/// A digest of a node's state machine: nodes that applied the same `index` have the same
/// `digest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateDigest {
    pub index: u64,
    pub digest: String,
}

/// Body of `POST /v1/cluster/nodes`: add a node as a learner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AddNodeRequest {
    /// The new node's id: never 0, never the id of a node removed before.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub id: u64,
    /// Its base URL, like `http://HOST:PORT`.
    pub url: String,
}

/// Body of `POST /v1/cluster/voters`: the complete set of voters from now on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetVotersRequest {
    /// Members' ids, each once.
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub ids: Vec<u64>,
}

/// Body of `POST /v1/cluster/transfer-leader`: the voter to lead (omitted: the most
/// up-to-date follower).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TransferLeaderRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<u64>,
}

/// Answer to `POST /v1/cluster/transfer-leader`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TransferLeaderResponse {
    pub leader_id: u64,
}

/// Answer to `POST /v1/cluster/snapshot`: the snapshot the answering node now has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotTaken {
    pub node_id: u64,
    pub snapshot: SnapshotInfo,
}
