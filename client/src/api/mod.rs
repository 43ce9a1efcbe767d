//! The JSON types of the public HTTP API (API.md), shared by the server and the SDK.
//!
//! These types are a compatibility promise to every client: field names and meanings follow
//! API.md exactly. They are deliberately separate from the server's Raft log types, which are
//! bincode on disk and versioned on their own.

pub mod b64;
mod cluster;
mod problem;
pub mod records_form;
mod reports;
mod subscriptions;
mod value;

pub use cluster::*;
pub use problem::*;
pub use records_form::RECORDS_CONTENT_TYPE;
pub use reports::*;
pub use subscriptions::*;

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub(crate) use value::{json_field_len, json_str_len};

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
/// `Content-Type` of a binary publish: one or more Kafka record batches (magic 2,
/// uncompressed) back to back; see [`crate::batch`].
pub const RECORD_BATCH_CONTENT_TYPE: &str = "application/vnd.raftq.record-batch";
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

/// A record as a producer sends it. Its value is bytes; in JSON it is exactly one of `value`
/// (UTF-8 text) or `value_b64` (base64), and in a record batch its bytes as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordIn {
    /// The value.
    pub value: Bytes,
    /// At most 4,096 bytes.
    pub key: Option<String>,
    /// At most 128 headers; names are 1 to 256 bytes.
    pub headers: BTreeMap<String, String>,
}

value::through_json!(RecordIn, value::json::RecordIn);

impl Serialize for RecordIn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (value, value_b64) = value::to_json(&self.value);
        value::json::RecordInRef {
            value,
            value_b64,
            key: &self.key,
            headers: &self.headers,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RecordIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = value::json::RecordIn::deserialize(d)?;
        Ok(RecordIn {
            value: value::from_json(r.value, r.value_b64).map_err(serde::de::Error::custom)?,
            key: r.key,
            headers: r.headers,
        })
    }
}

impl RecordIn {
    /// A record with a UTF-8 text value.
    pub fn text(value: impl Into<String>) -> Self {
        RecordIn {
            value: Bytes::from(value.into().into_bytes()),
            ..Default::default()
        }
    }

    /// A record with a binary value, copied (JSON carries it as base64; a record batch, the
    /// SDK's default, as its bytes).
    pub fn binary(value: &[u8]) -> Self {
        RecordIn::bytes(Bytes::copy_from_slice(value))
    }

    /// A record whose value is `value`, shared, not copied.
    pub fn bytes(value: impl Into<Bytes>) -> Self {
        RecordIn {
            value: value.into(),
            ..Default::default()
        }
    }

    /// The value when it is UTF-8 text.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
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

/// A record as returned by a read. Its value is bytes; in JSON it is `value` when the bytes
/// are UTF-8 text, `value_b64` (base64) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub key: Option<String>,
    pub headers: BTreeMap<String, String>,
    /// The value.
    pub value: Bytes,
}

value::through_json!(Record, value::json::Record);

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (value, value_b64) = value::to_json(&self.value);
        value::json::RecordRef {
            head: self.head(),
            value,
            value_b64,
        }
        .serialize(s)
    }
}

impl Record {
    fn head(&self) -> value::json::RecordHead<'_> {
        value::json::RecordHead {
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: &self.key,
            headers: &self.headers,
        }
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = value::json::Record::deserialize(d)?;
        Ok(Record {
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: r.key,
            headers: r.headers,
            value: value::read_back(r.value, r.value_b64).map_err(serde::de::Error::custom)?,
        })
    }
}

impl Record {
    /// The value's bytes, copied.
    pub fn value_bytes(&self) -> Vec<u8> {
        self.value.to_vec()
    }

    /// The value when it is UTF-8 text.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
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

impl ReadResponse {
    /// This answer as JSON: the bytes serde writes for it, written faster
    /// (`value::write_with_value`).
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let values: usize = self.records.iter().map(|r| r.value.len()).sum();
        let mut out = Vec::with_capacity(96 + values / 3 * 4 + 128 * self.records.len());
        out.extend_from_slice(br#"{"records":"#);
        let items = self.records.iter().map(|r| (r.head(), &r.value[..]));
        value::write_array(&mut out, items)?;
        out.push(b',');
        #[derive(Serialize)]
        struct Rest {
            next_offset: u64,
            high_watermark: u64,
            skipped: u64,
        }
        let rest = serde_json::to_vec(&Rest {
            next_offset: self.next_offset,
            high_watermark: self.high_watermark,
            skipped: self.skipped,
        })?;
        // `{"next_offset":…}` without its opening brace.
        out.extend_from_slice(&rest[1..]);
        Ok(out)
    }
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

#[cfg(test)]
mod tests;
