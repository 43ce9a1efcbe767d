//! Record values: bytes in memory, and in JSON `value` when the bytes are UTF-8 text or
//! `value_b64` (standard base64) otherwise, as API.md gives them.
//!
//! [`RecordIn`](super::RecordIn), [`Record`](super::Record) and [`Message`](super::Message)
//! hold a value as [`Bytes`], so that the binary forms (record batches) carry it with no
//! base64 and no copy; their JSON is written and read through the wire structs of [`json`],
//! which are exactly the fields of API.md (and describe them in the OpenAPI document).

use std::borrow::Cow;

use bytes::Bytes;

/// `value` as JSON's two fields: the text itself when it is UTF-8 (borrowed: no copy), its
/// base64 otherwise.
pub(crate) fn to_json(value: &[u8]) -> (Option<Cow<'_, str>>, Option<String>) {
    match std::str::from_utf8(value) {
        Ok(text) => (Some(Cow::Borrowed(text)), None),
        Err(_) => (None, Some(super::b64::encode(value))),
    }
}

/// Writes `head`, a struct serde writes as a JSON object, with the value's field added last:
/// byte for byte what serde writes for the answers' wire structs in [`json`], whose value
/// fields come last. The base64 goes into `out` directly, without the escape scan serde gives
/// every string (its alphabet needs no escaping) and without a string of its own: that scan
/// was the largest single cost on the leader of a consume run reading JSON.
pub(crate) fn write_with_value<T: serde::Serialize>(
    out: &mut Vec<u8>,
    head: &T,
    value: &[u8],
) -> serde_json::Result<()> {
    use serde::ser::Error as _;
    serde_json::to_writer(&mut *out, head)?;
    if out.pop() != Some(b'}') {
        return Err(serde_json::Error::custom("the head is not a JSON object"));
    }
    if out.last() != Some(&b'{') {
        out.push(b',');
    }
    match std::str::from_utf8(value) {
        Ok(text) => {
            out.extend_from_slice(br#""value":"#);
            serde_json::to_writer(&mut *out, text)?;
        }
        Err(_) => {
            out.extend_from_slice(br#""value_b64":""#);
            super::b64::encode_append(value, out);
            out.push(b'"');
        }
    }
    out.push(b'}');
    Ok(())
}

/// Writes `items`, each the fields before a value and the value, as a JSON array of objects
/// ([`write_with_value`]).
pub(crate) fn write_array<'a, H: serde::Serialize>(
    out: &mut Vec<u8>,
    items: impl IntoIterator<Item = (H, &'a [u8])>,
) -> serde_json::Result<()> {
    out.push(b'[');
    for (i, (head, value)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_with_value(out, &head, value)?;
    }
    out.push(b']');
    Ok(())
}

/// The bytes of a record that JSON gave as `value` or `value_b64`, exactly one of them.
pub(crate) fn from_json(value: Option<String>, value_b64: Option<String>) -> Result<Bytes, String> {
    match (value, value_b64) {
        (Some(text), None) => Ok(Bytes::from(text.into_bytes())),
        (None, Some(b64)) => super::b64::decode(b64.as_bytes())
            .map(Bytes::from)
            .map_err(|e| format!("value_b64 is not valid base64: {e}")),
        (Some(_), Some(_)) => Err("a record has both value and value_b64; send exactly one".into()),
        (None, None) => Err("a record has neither value nor value_b64".into()),
    }
}

/// The length of `value` as JSON writes it in a publish: `"value":"…"` with the text escaped
/// as serde_json escapes it, or `"value_b64":"…"`; exactly, without writing it.
pub(crate) fn json_field_len(value: &[u8]) -> usize {
    match std::str::from_utf8(value) {
        Ok(text) => json_str_len("value") + 1 + json_str_len(text),
        Err(_) => json_str_len("value_b64") + 1 + 2 + value.len().div_ceil(3) * 4,
    }
}

/// A string's length as a JSON string, quotes and escapes included, as serde_json escapes it
/// (`"` and `\` and the control characters; everything else as it is, UTF-8).
pub(crate) fn json_str_len(s: &str) -> usize {
    // Nearly every string needs no escape: one pass the compiler vectorizes finds that, and
    // only a string that does is counted byte by byte.
    let needs_escape = s.bytes().fold(false, |any, b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        return 2 + s.len();
    }
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// The JSON forms of the record types, field for field as API.md gives them.
pub(crate) mod json {
    use std::borrow::Cow;
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    /// A record as a producer sends it: exactly one of `value` (UTF-8 text) or `value_b64`.
    #[derive(Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(deny_unknown_fields)]
    pub(crate) struct RecordIn {
        /// The value as UTF-8 text. Exactly one of `value` and `value_b64`.
        #[serde(default)]
        pub value: Option<String>,
        /// The value as standard base64, for binary values. Exactly one of `value` and
        /// `value_b64`.
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
        pub value_b64: Option<String>,
        /// At most 4,096 bytes.
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
        pub key: Option<String>,
        /// At most 128 headers; names are 1 to 256 bytes.
        #[serde(default)]
        pub headers: BTreeMap<String, String>,
    }

    /// [`RecordIn`], borrowed, for writing.
    #[derive(Serialize)]
    pub(crate) struct RecordInRef<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value_b64: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub key: &'a Option<String>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        pub headers: &'a BTreeMap<String, String>,
    }

    /// A record as returned by a read: `value` when the bytes are UTF-8, `value_b64`
    /// otherwise.
    #[derive(Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    pub(crate) struct Record {
        pub offset: u64,
        pub timestamp_ms: u64,
        #[serde(default)]
        pub key: Option<String>,
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(required = true))]
        pub headers: BTreeMap<String, String>,
        /// The value, when it is UTF-8 text.
        #[serde(default)]
        pub value: Option<String>,
        /// The value as standard base64, when it is not UTF-8 text (instead of `value`).
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
        pub value_b64: Option<String>,
    }

    /// [`Record`], borrowed, for writing.
    #[derive(Serialize)]
    pub(crate) struct RecordRef<'a> {
        #[serde(flatten)]
        pub head: RecordHead<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value_b64: Option<String>,
    }

    /// [`Record`]'s fields before its value, borrowed: written by [`RecordRef`] and by
    /// [`super::write_with_value`].
    #[derive(Serialize)]
    pub(crate) struct RecordHead<'a> {
        pub offset: u64,
        pub timestamp_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub key: &'a Option<String>,
        pub headers: &'a BTreeMap<String, String>,
    }

    /// One leased record.
    #[derive(Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    pub(crate) struct Message {
        /// Names this delivery; ack, nack and extend take it.
        pub receipt: String,
        pub offset: u64,
        pub delivery_count: u32,
        pub lease_expires_ms: u64,
        pub timestamp_ms: u64,
        #[serde(default)]
        pub key: Option<String>,
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(required = true))]
        pub headers: BTreeMap<String, String>,
        /// The value, when it is UTF-8 text.
        #[serde(default)]
        pub value: Option<String>,
        /// The value as standard base64, when it is not UTF-8 text (instead of `value`).
        #[serde(default)]
        #[cfg_attr(feature = "openapi", schema(format = Byte, content_encoding = "base64"))]
        pub value_b64: Option<String>,
    }

    /// [`Message`], borrowed, for writing.
    #[derive(Serialize)]
    pub(crate) struct MessageRef<'a> {
        #[serde(flatten)]
        pub head: MessageHead<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub value_b64: Option<String>,
    }

    /// [`Message`]'s fields before its value, borrowed: written by [`MessageRef`] and by
    /// [`super::write_with_value`].
    #[derive(Serialize)]
    pub(crate) struct MessageHead<'a> {
        pub receipt: &'a str,
        pub offset: u64,
        pub delivery_count: u32,
        pub lease_expires_ms: u64,
        pub timestamp_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub key: &'a Option<String>,
        pub headers: &'a BTreeMap<String, String>,
    }
}

/// The value of a record read back, from JSON that may, from an older server, hold neither
/// field (an empty value) but never both.
pub(crate) fn read_back(value: Option<String>, value_b64: Option<String>) -> Result<Bytes, String> {
    match (value, value_b64) {
        (None, None) => Ok(Bytes::new()),
        (value, value_b64) => from_json(value, value_b64),
    }
}

/// Implements `Serialize`, `Deserialize` and (with the `openapi` feature) the OpenAPI schema of
/// a record type through its wire struct.
macro_rules! through_json {
    ($ty:ident, $wire:path) => {
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                <$wire as utoipa::PartialSchema>::schema()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $ty {}
    };
}
pub(crate) use through_json;
