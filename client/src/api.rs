//! The JSON types of the public HTTP API (API.md), shared by the server and the SDK.
//!
//! These types are a compatibility promise to every client: field names and meanings follow
//! API.md exactly. They are deliberately separate from the server's Raft log types, which are
//! bincode on disk and versioned on their own.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest topic or subscription name.
pub const MAX_NAME_LEN: usize = 128;
/// Most records in one publish request.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// Most headers on one record.
pub const MAX_RECORD_HEADERS: usize = 128;
/// Longest header name of a record, in bytes (values count towards the record's size).
pub const MAX_HEADER_NAME_BYTES: usize = 256;
/// Longest record key, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;
/// Most records one read returns.
pub const MAX_READ_RECORDS: u64 = 10_000;
/// Longest long-poll a read may ask for.
pub const MAX_WAIT_MS: u64 = 30_000;

/// The rule of [`is_valid_name`] as a regular expression (ECMA-262, as OpenAPI schemas use).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,128}$";

/// True when `name` is a valid topic or subscription name: `[A-Za-z0-9._-]{1,128}`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// A record as a producer sends it: exactly one of `value` (UTF-8 text) or `value_b64`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordIn {
    /// The value as UTF-8 text. Exactly one of `value` and `value_b64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value as standard base64, for binary values. Exactly one of `value` and `value_b64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
    pub value_b64: Option<String>,
    /// At most 4,096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub key: Option<String>,
    /// At most 128 headers; names are 1 to 256 bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

impl RecordIn {
    /// A record with a UTF-8 text value.
    pub fn text(value: impl Into<String>) -> Self {
        RecordIn {
            value: Some(value.into()),
            ..Default::default()
        }
    }

    /// A record with a binary value (sent as base64).
    pub fn binary(value: &[u8]) -> Self {
        use base64::Engine as _;
        RecordIn {
            value_b64: Some(base64::engine::general_purpose::STANDARD.encode(value)),
            ..Default::default()
        }
    }

    /// Sets the record's key.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds one header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

/// Body of `POST /v1/topics/{topic}/records`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10000))]
    pub records: Vec<RecordIn>,
    /// With `sequence`, makes the batch idempotent: a name like a topic's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,128}$"))]
    pub producer_id: Option<String>,
    /// The producer's batch number on this topic (0, 1, 2, ...); only with `producer_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
}

/// Milliseconds since the Unix epoch (as in [`CommitPoint::timestamp_ms`]) as an RFC 3339 UTC
/// time, e.g. `2025-11-30T05:20:00.123Z`.
pub fn utc_time(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The last applied log entry and its leader timestamp: everything up to it is durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommitPoint {
    pub index: u64,
    pub timestamp_ms: u64,
}

/// Answer to a publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishResponse {
    pub first_offset: u64,
    pub last_offset: u64,
    pub duplicate: bool,
    pub commit_point: CommitPoint,
}

/// A record as returned by a read: `value` when the bytes are UTF-8, `value_b64` otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Record {
    pub offset: u64,
    pub timestamp_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub headers: BTreeMap<String, String>,
    /// The value, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value as standard base64, when it is not UTF-8 text (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
    pub value_b64: Option<String>,
}

/// A value's bytes from the API's `value` (UTF-8 text) or `value_b64` (base64) field.
fn value_bytes(value: &Option<String>, value_b64: &Option<String>) -> Vec<u8> {
    use base64::Engine as _;
    match (value, value_b64) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    }
}

impl Record {
    /// The value's bytes, whichever way they were sent.
    pub fn value_bytes(&self) -> Vec<u8> {
        value_bytes(&self.value, &self.value_b64)
    }
}

/// Answer to `GET /v1/topics/{topic}/records`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadResponse {
    pub records: Vec<Record>,
    pub next_offset: u64,
    pub high_watermark: u64,
    pub skipped: u64,
}

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// A given offset.
    Offset(u64),
    /// The topic's first retained record.
    First,
    /// The last record.
    Last,
    /// Only records published after the call.
    Next,
}

impl fmt::Display for ReadFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadFrom::Offset(n) => write!(f, "{n}"),
            ReadFrom::First => f.write_str("first"),
            ReadFrom::Last => f.write_str("last"),
            ReadFrom::Next => f.write_str("next"),
        }
    }
}

impl std::str::FromStr for ReadFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "first" => Ok(ReadFrom::First),
            "last" => Ok(ReadFrom::Last),
            "next" => Ok(ReadFrom::Next),
            n => n.parse::<u64>().map(ReadFrom::Offset).map_err(|_| {
                format!("`from` must be an offset, `first`, `last` or `next`, not {n:?}")
            }),
        }
    }
}

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

/// Most records one pull leases.
pub const MAX_PULL: u32 = 1_000;
/// Most receipts in one ack, nack or extend.
pub const MAX_RECEIPTS: usize = 10_000;
/// Longest lease a pull or extend may ask for (12 hours).
pub const MAX_ACK_TIMEOUT_MS: u64 = 12 * 60 * 60 * 1000;
/// Longest nack delay (12 hours).
pub const MAX_NACK_DELAY_MS: u64 = 12 * 60 * 60 * 1000;
/// Lease length when neither the pull nor the subscription says.
pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;

/// Where a new subscription's cursor starts: `"first"`, `"next"` or an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubscriptionStart {
    /// The topic's first retained record (the default).
    #[default]
    First,
    /// Only records published after the subscription was created.
    Next,
    /// A given offset.
    Offset(u64),
}

impl Serialize for SubscriptionStart {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SubscriptionStart::First => s.serialize_str("first"),
            SubscriptionStart::Next => s.serialize_str("next"),
            SubscriptionStart::Offset(n) => s.serialize_u64(*n),
        }
    }
}

/// `"first"`, `"next"` or an offset, as the (de)serializers above read and write it.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for SubscriptionStart {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type,
        };
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(["first", "next"])),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                    .minimum(Some(0)),
            )
            .description(Some(
                "Where a new subscription's cursor starts: `first` (the topic's first retained \
                 record, the default), `next` (only records published from now on) or an offset",
            ))
            .default(Some(serde_json::json!("first")))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for SubscriptionStart {}

impl<'de> Deserialize<'de> for SubscriptionStart {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Offset(u64),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Offset(n) => Ok(SubscriptionStart::Offset(n)),
            Raw::Word(w) if w == "first" => Ok(SubscriptionStart::First),
            Raw::Word(w) if w == "next" => Ok(SubscriptionStart::Next),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "start must be \"first\", \"next\" or an offset, not {w:?}"
            ))),
        }
    }
}

/// Body of `PUT /v1/topics/{topic}/subscriptions/{sub}`; all fields optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    #[serde(default)]
    pub start: SubscriptionStart,
    /// Lease length for pulls that do not name one (default 30,000 ms, at most 12 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 43200000))]
    pub ack_timeout_ms: Option<u64>,
    /// Deliveries after which a record that is still not acked is dead-lettered
    /// (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<u32>,
    /// Where dead letters go; without one they are discarded and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._-]{1,128}$"))]
    pub dead_letter_topic: Option<String>,
}

/// Answer to `GET .../subscriptions/{sub}` (and to its `PUT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionInfo {
    pub topic: String,
    pub name: String,
    /// The ack floor: every offset below it is done.
    pub cursor: u64,
    /// Records at or above the cursor that are neither done nor leased.
    pub backlog: u64,
    /// Records leased right now.
    pub in_flight: u64,
    /// Deliveries, redeliveries included.
    pub delivered: u64,
    pub acked: u64,
    /// Deliveries of a record that had been delivered before.
    pub redelivered: u64,
    pub dead_lettered: u64,
    pub expired_leases: u64,
    pub config: SubscriptionConfig,
}

/// Body of `POST .../pull`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// Most records to lease (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max: Option<u32>,
    /// Long-poll: wait this long for a record to lease (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 30000))]
    pub wait_ms: Option<u64>,
    /// Lease length (default: the subscription's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 43200000))]
    pub ack_timeout_ms: Option<u64>,
    /// The consumer's name, for logs (at most 128 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub consumer: Option<String>,
}

/// One leased record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Message {
    /// Names this delivery; ack, nack and extend take it.
    pub receipt: String,
    pub offset: u64,
    pub delivery_count: u32,
    pub lease_expires_ms: u64,
    pub timestamp_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub headers: BTreeMap<String, String>,
    /// The value, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value as standard base64, when it is not UTF-8 text (instead of `value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
    pub value_b64: Option<String>,
}

impl Message {
    /// The value's bytes, whichever way they were sent.
    pub fn value_bytes(&self) -> Vec<u8> {
        value_bytes(&self.value, &self.value_b64)
    }
}

/// Answer to `POST .../pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullResponse {
    pub messages: Vec<Message>,
}

/// Body of `POST .../ack`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10000))]
    pub receipts: Vec<String>,
}

/// Body of `POST .../nack`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NackRequest {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10000))]
    pub receipts: Vec<String>,
    /// Make the record available again after this long (at most 12 hours).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 43200000))]
    pub delay_ms: u64,
    #[serde(default)]
    pub dead_letter: bool,
}

/// Body of `POST .../extend`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 10000))]
    pub receipts: Vec<String>,
    /// The new lease length from now (default: the subscription's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 43200000))]
    pub ack_timeout_ms: Option<u64>,
}

/// What happened to one receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReceiptStatus {
    Acked,
    Released,
    DeadLettered,
    Extended,
    /// The receipt no longer names a live delivery (acked already, or expired and
    /// delivered again, or its subscription moved past it); nothing changed.
    Stale,
}

/// One receipt's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReceiptResult {
    pub receipt: String,
    pub status: ReceiptStatus,
    /// With `extended`: the new expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_ms: Option<u64>,
}

/// Answer to ack, nack and extend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReceiptResults {
    pub results: Vec<ReceiptResult>,
}

/// Body of `PUT .../cursor`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CursorRequest {
    pub offset: u64,
    #[serde(default)]
    pub allow_backward: bool,
}

/// Answer to `PUT .../cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CursorResponse {
    pub cursor: u64,
}

/// Answer to `GET /v1/topics/{topic}/subscriptions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionList {
    pub subscriptions: Vec<SubscriptionInfo>,
}

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

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
