//! Subscriptions: configurations, pull, ack, nack, extend and the cursor.

use super::*;

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

/// One leased record. Its value is bytes; in JSON it is `value` when the bytes are UTF-8
/// text, `value_b64` (base64) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Names this delivery; ack, nack and extend take it.
    pub receipt: String,
    pub offset: u64,
    pub delivery_count: u32,
    pub lease_expires_ms: u64,
    pub timestamp_ms: u64,
    pub key: Option<String>,
    pub headers: BTreeMap<String, String>,
    /// The value.
    pub value: Bytes,
}

super::value::through_json!(Message, super::value::json::Message);

impl Serialize for Message {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (value, value_b64) = super::value::to_json(&self.value);
        super::value::json::MessageRef {
            head: self.head(),
            value,
            value_b64,
        }
        .serialize(s)
    }
}

impl Message {
    fn head(&self) -> super::value::json::MessageHead<'_> {
        super::value::json::MessageHead {
            receipt: &self.receipt,
            offset: self.offset,
            delivery_count: self.delivery_count,
            lease_expires_ms: self.lease_expires_ms,
            timestamp_ms: self.timestamp_ms,
            key: &self.key,
            headers: &self.headers,
        }
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = super::value::json::Message::deserialize(d)?;
        Ok(Message {
            receipt: m.receipt,
            offset: m.offset,
            delivery_count: m.delivery_count,
            lease_expires_ms: m.lease_expires_ms,
            timestamp_ms: m.timestamp_ms,
            key: m.key,
            headers: m.headers,
            value: super::value::read_back(m.value, m.value_b64)
                .map_err(serde::de::Error::custom)?,
        })
    }
}

impl Message {
    /// The value's bytes, copied.
    pub fn value_bytes(&self) -> Vec<u8> {
        self.value.to_vec()
    }

    /// The value when it is UTF-8 text.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

/// Answer to `POST .../pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullResponse {
    pub messages: Vec<Message>,
}

impl PullResponse {
    /// This answer as JSON: the bytes serde writes for it, written faster
    /// (`value::write_with_value`).
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        let values: usize = self.messages.iter().map(|m| m.value.len()).sum();
        let mut out = Vec::with_capacity(16 + values / 3 * 4 + 256 * self.messages.len());
        out.extend_from_slice(br#"{"messages":"#);
        let items = self.messages.iter().map(|m| (m.head(), &m.value[..]));
        super::value::write_array(&mut out, items)?;
        out.push(b'}');
        Ok(out)
    }
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
