//! A codec for Kafka's record batch format, version 2 ("magic 2").
//!
//! A record batch is the unit in which Kafka (0.11 and later) sends records in a produce
//! request, stores them in its log and serves them to consumers: a fixed 61-byte header
//! followed by the records, each a short run of zigzag varints, key, value and headers. This
//! module reads and writes exactly that format, so a Kafka produce request's batch and a raftq
//! binary publish body are the same bytes, and a batch accepted once can be stored and served
//! again without being re-encoded.
//!
//! # Layout
//!
//! All fixed-width integers are big-endian. Byte positions are from the start of the batch.
//!
//! ```text
//!  0  baseOffset            int64   offset of the first record (set by the log, outside the CRC)
//!  8  batchLength           int32   bytes after this field (the whole batch is 12 + batchLength)
//! 12  partitionLeaderEpoch  int32
//! 16  magic                 int8    2
//! 17  crc                   uint32  CRC-32C (Castagnoli) of bytes 21 to the end of the batch
//! 21  attributes            int16   bits 0-2 compression (0 = none), bit 3 timestamp type
//!                                   (0 CreateTime, 1 LogAppendTime), bit 4 transactional,
//!                                   bit 5 control, bit 6 hasDeleteHorizonMs
//! 23  lastOffsetDelta       int32   offsetDelta of the last record
//! 27  baseTimestamp         int64
//! 35  maxTimestamp          int64
//! 43  producerId            int64   -1 without an idempotent producer
//! 51  producerEpoch         int16
//! 53  baseSequence          int32
//! 57  records count         int32
//! 61  records
//!
//! record:
//!   length          varint   bytes after this field
//!   attributes      int8     0 (unused)
//!   timestampDelta  varlong  from baseTimestamp
//!   offsetDelta     varint   from baseOffset
//!   keyLength       varint   -1 = null key
//!   key             bytes
//!   valueLength     varint   -1 = null value
//!   value           bytes
//!   headers count   varint
//!   headers         headerKeyLength varint, headerKey UTF-8,
//!                   headerValueLength varint (-1 = null), headerValue bytes
//! ```
//!
//! Varints are zigzag-encoded base-128 (as in Protocol Buffers' `sint32`/`sint64`): at most 5
//! bytes for a varint, 10 for a varlong.
//!
//! # Decoding
//!
//! [`decode`] reads one batch and [`decode_all`] a body of whole batches back to back. Decoding
//! is zero-copy (keys, values and header keys and values borrow from the input) and strict:
//! every length must agree with the bytes present, the CRC must match, varints must be
//! well-formed and in range, the records must carry offset deltas `0, 1, 2, …` and their count
//! must match the header. Any disagreement is a [`BatchError`] naming the field and the byte
//! position (from the start of the input) where it was found. Decoding never panics, and it
//! never allocates in proportion to a count read from the input before the bytes to back it
//! are there; [`Limits`] caps the records per batch and the headers per record.
//!
//! # Encoding
//!
//! [`encode`] appends one uncompressed batch to a buffer, with offset deltas `0..n` and the
//! batch length and CRC computed. [`set_base_offset`] rewrites the base offset of a batch in
//! place; it lies outside the CRC, so the batch stays valid, as when a Kafka broker assigns
//! offsets to a batch it appends.
//!
//! # Not supported
//!
//! - Compression (attribute bits 0-2 other than 0): such a batch is refused, not inflated.
//! - Transactional batches (bit 4) and control batches (bit 5, the commit and abort markers
//!   of transactions).
//! - Other magic values (0 and 1, the older message set formats).
//! - Empty batches (a record count of 0), which Kafka refuses in a produce request too.

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::{decode, decode_all, nth_record};
pub use encode::{encode, set_base_offset};

/// The magic byte of the record batch format this module reads and writes.
pub const MAGIC: i8 = 2;

/// Size of the batch header: everything before the first record.
pub const HEADER_BYTES: usize = 61;

/// Attribute bits 0-2: the compression codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
pub const COMPRESSION_MASK: i16 = 0x07;
/// Attribute bit 3: the timestamp type, set for LogAppendTime, clear for CreateTime.
pub const TIMESTAMP_TYPE_BIT: i16 = 0x08;
/// Attribute bit 4: the batch belongs to a transaction.
pub const TRANSACTIONAL_BIT: i16 = 0x10;
/// Attribute bit 5: the batch is a control batch (a transaction marker).
pub const CONTROL_BIT: i16 = 0x20;
/// Attribute bit 6: `baseTimestamp` is the delete horizon set by log compaction.
pub const DELETE_HORIZON_BIT: i16 = 0x40;

/// Bytes before `batchLength`'s count starts: `baseOffset` and `batchLength` themselves.
const LOG_OVERHEAD: usize = 12;
/// Smallest valid `batchLength`: the header after the `batchLength` field.
const MIN_BATCH_LENGTH: i32 = (HEADER_BYTES - LOG_OVERHEAD) as i32;
/// Position of the magic byte.
const MAGIC_AT: usize = 16;
/// Position of the CRC.
const CRC_AT: usize = 17;
/// Position of the attributes, where the CRC-covered bytes start.
const ATTRIBUTES_AT: usize = 21;
/// Smallest encoded record: a one-byte length and six one-byte fields.
const MIN_RECORD_BYTES: usize = 7;
/// Smallest encoded header: an empty key's length and a null value's length.
const MIN_HEADER_BYTES: usize = 2;

/// The batch-level fields of a record batch (all but `batchLength`, `magic`, `crc` and the
/// record count, which follow from the records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchHeader {
    /// Offset of the first record. Assigned by the log on append; a producer sends 0.
    pub base_offset: i64,
    /// Epoch of the partition leader that appended the batch; a producer sends 0 or -1.
    pub partition_leader_epoch: i32,
    /// The attribute bits (see [`COMPRESSION_MASK`] and the `*_BIT` constants).
    pub attributes: i16,
    /// `offsetDelta` of the last record: the record count minus one.
    pub last_offset_delta: i32,
    /// Timestamp (milliseconds) from which the records' timestamp deltas count.
    pub base_timestamp: i64,
    /// Largest record timestamp in the batch (milliseconds).
    pub max_timestamp: i64,
    /// Id of the idempotent producer, or -1.
    pub producer_id: i64,
    /// Epoch of the idempotent producer, or -1.
    pub producer_epoch: i16,
    /// Sequence number of the first record for the idempotent producer, or -1.
    pub base_sequence: i32,
}

impl BatchHeader {
    /// The header of a batch of `records` records as a raftq client sends it: offsets from 0,
    /// no timestamps (-1: the leader stamps each record) and no Kafka producer fields (-1:
    /// idempotency is raftq's `producer_id` and `sequence`).
    pub fn unstamped(records: usize) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            partition_leader_epoch: -1,
            attributes: 0,
            last_offset_delta: records.saturating_sub(1).min(i32::MAX as usize) as i32,
            base_timestamp: -1,
            max_timestamp: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }
    }

    /// The compression codec in the attributes (0 = none; the only one decoding accepts).
    pub fn compression(&self) -> u8 {
        // The mask keeps three bits, so the value fits in a u8.
        (self.attributes & COMPRESSION_MASK) as u8
    }

    /// Whether the timestamps are LogAppendTime (set by the log) rather than CreateTime.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }
}

/// One decoded record, borrowing its key, value and headers from the input bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record<'a> {
    /// Timestamp relative to [`BatchHeader::base_timestamp`], in milliseconds.
    pub timestamp_delta: i64,
    /// Offset relative to [`BatchHeader::base_offset`]; record `i` of a batch has delta `i`.
    pub offset_delta: i32,
    /// The key, or `None` for a null key (distinct from an empty one).
    pub key: Option<&'a [u8]>,
    /// The value, or `None` for a null value (distinct from an empty one).
    pub value: Option<&'a [u8]>,
    /// The headers, in their order in the record (keys may repeat).
    pub headers: Vec<Header<'a>>,
}

/// One record header: a UTF-8 key and an optional value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header<'a> {
    /// The header key; never null, possibly empty.
    pub key: &'a str,
    /// The header value, or `None` for a null value.
    pub value: Option<&'a [u8]>,
}

/// One decoded record batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch<'a> {
    /// The batch-level fields.
    pub header: BatchHeader,
    /// The records, at least one, in offset order.
    pub records: Vec<Record<'a>>,
}

/// A record to encode with [`encode`]; its offset delta is its position in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Timestamp relative to [`BatchHeader::base_timestamp`], in milliseconds.
    pub timestamp_delta: i64,
    /// The key, or `None` for a null key.
    pub key: Option<&'a [u8]>,
    /// The value, or `None` for a null value.
    pub value: Option<&'a [u8]>,
    /// The headers as `(key, value)` pairs; a `None` value is a null header value.
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
}

/// A record's headers as [`RecordRef::headers`] takes them.
pub type HeaderRefs<'a> = Vec<(&'a str, Option<&'a [u8]>)>;

/// Text headers (name, value) as [`RecordRef::headers`] takes them: every value present.
pub fn text_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> HeaderRefs<'a> {
    headers
        .into_iter()
        .map(|(name, value)| (name, Some(value.as_bytes())))
        .collect()
}

/// Bounds that decoding enforces on counts read from the input, on top of the bytes present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most records one batch may declare and hold.
    pub max_records: usize,
    /// Most headers one record may declare and hold.
    pub max_headers_per_record: usize,
}

impl Default for Limits {
    /// 100,000 records per batch and 256 headers per record.
    fn default() -> Self {
        Limits {
            max_records: 100_000,
            max_headers_per_record: 256,
        }
    }
}

/// Why bytes are not a valid, supported record batch.
///
/// Every position (`at`, `field_at`) is a byte index from the start of the input given to
/// [`decode`] or [`decode_all`]; record and header indexes count from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The input ends before a field of the batch header, or before the end of the batch that
    /// `batchLength` declares.
    #[error(
        "truncated batch: {field} at byte {at} needs {needed} bytes, \
         but the input has only {available} left"
    )]
    Truncated {
        /// What was being read.
        field: &'static str,
        /// Where it starts.
        at: usize,
        /// Bytes it needs (for a varint: at least this many).
        needed: usize,
        /// Bytes the input has from `at` on.
        available: usize,
    },

    /// The magic byte is not 2: not a record batch of format v2.
    #[error(
        "magic byte at byte {at} is {found}, expected 2: only the record batch format v2 \
         (Kafka 0.11 and later) is supported"
    )]
    Magic {
        /// Position of the magic byte.
        at: usize,
        /// The magic byte found.
        found: i8,
    },

    /// `batchLength` is smaller than the batch header that must follow it.
    #[error(
        "batchLength {declared} at byte {at} is too small: the header after it alone takes \
         49 bytes"
    )]
    BatchLengthTooSmall {
        /// Position of `batchLength`.
        at: usize,
        /// The value found.
        declared: i32,
    },

    /// The records run past the end of the batch that `batchLength` declares.
    #[error(
        "batchLength {declared} at byte {at} is too small for the records: {field} of record \
         {record} at byte {field_at} needs {needed} bytes, but only {available} are left in \
         the batch"
    )]
    BatchLengthShort {
        /// Position of `batchLength`.
        at: usize,
        /// The value found.
        declared: i32,
        /// Index of the record being read.
        record: usize,
        /// What was being read.
        field: &'static str,
        /// Where it starts.
        field_at: usize,
        /// Bytes it needs (for a varint: at least this many).
        needed: usize,
        /// Bytes left in the batch from `field_at` on.
        available: usize,
    },

    /// Bytes are left in the batch that `batchLength` declares after the declared records.
    #[error(
        "batchLength {declared} at byte {at} is too large, or the record count too small: \
         {extra} bytes are left in the batch after its {count} records, from byte {from}"
    )]
    BatchLengthLong {
        /// Position of `batchLength`.
        at: usize,
        /// The value found.
        declared: i32,
        /// Records read (the declared count).
        count: usize,
        /// Bytes left over.
        extra: usize,
        /// Where the left-over bytes start.
        from: usize,
    },

    /// The CRC does not match the bytes it covers: the batch is corrupt.
    #[error(
        "CRC mismatch: the crc at byte {at} is {expected:#010x}, but the CRC-32C of the bytes \
         from {from} to the end of the batch is {computed:#010x}; the batch is corrupt"
    )]
    Crc {
        /// Position of the crc field.
        at: usize,
        /// The CRC stored in the batch.
        expected: u32,
        /// The CRC of the bytes present.
        computed: u32,
        /// Where the covered bytes start (the attributes).
        from: usize,
    },

    /// The attributes name a compression codec.
    #[error(
        "compressed batches are not supported: compression codec {codec} in the attributes \
         at byte {at}; send the records uncompressed"
    )]
    Compressed {
        /// Position of the attributes.
        at: usize,
        /// The codec (attribute bits 0-2).
        codec: u8,
    },

    /// The attributes mark a transactional batch.
    #[error(
        "transactional batches are not supported: attributes {attributes:#06x} at byte {at} \
         have the transactional bit (bit 4) set"
    )]
    Transactional {
        /// Position of the attributes.
        at: usize,
        /// The attributes found.
        attributes: i16,
    },

    /// The attributes mark a control batch.
    #[error(
        "control batches are not supported: attributes {attributes:#06x} at byte {at} have \
         the control bit (bit 5) set"
    )]
    Control {
        /// Position of the attributes.
        at: usize,
        /// The attributes found.
        attributes: i16,
    },

    /// The record count is zero or negative.
    #[error("record count {count} at byte {at} is invalid: a batch holds at least one record")]
    RecordCountInvalid {
        /// Position of the record count.
        at: usize,
        /// The value found.
        count: i32,
    },

    /// The record count is above [`Limits::max_records`].
    #[error("record count {count} at byte {at} is above the limit of {limit} records per batch")]
    RecordCountAboveLimit {
        /// Position of the record count.
        at: usize,
        /// The value found.
        count: i32,
        /// The limit.
        limit: usize,
    },

    /// [`nth_record`] was asked for a record past the last one.
    #[error("there is no record {index}: the batches hold {count} records")]
    NoSuchRecord {
        /// The record asked for.
        index: usize,
        /// Records the batches hold.
        count: usize,
    },

    /// The batch ends before the number of records its record count declares.
    #[error(
        "record count {declared} at byte {at} does not match the records: the batch ends \
         after {found} records"
    )]
    RecordCountMismatch {
        /// Position of the record count.
        at: usize,
        /// The value found.
        declared: i32,
        /// Records in the batch.
        found: usize,
    },

    /// `lastOffsetDelta` is not the last record's `offsetDelta`.
    #[error(
        "lastOffsetDelta {declared} at byte {at} does not match the last record's \
         offsetDelta {last}"
    )]
    LastOffsetDelta {
        /// Position of `lastOffsetDelta`.
        at: usize,
        /// The value found.
        declared: i32,
        /// The last record's `offsetDelta`.
        last: i32,
    },

    /// A varint runs over its maximum length (5 bytes for a varint, 10 for a varlong).
    #[error(
        "malformed varint: {field} of record {record} at byte {at} is longer than \
         {max_bytes} bytes"
    )]
    VarintTooLong {
        /// Index of the record.
        record: usize,
        /// What was being read.
        field: &'static str,
        /// Where the varint starts.
        at: usize,
        /// Its maximum length.
        max_bytes: usize,
    },

    /// A varint's last byte carries bits beyond 32 bits (64 for a varlong).
    #[error(
        "malformed varint: {field} of record {record} at byte {at} does not fit in {bits} bits"
    )]
    VarintOutOfRange {
        /// Index of the record.
        record: usize,
        /// What was being read.
        field: &'static str,
        /// Where the varint starts.
        at: usize,
        /// The width of the field.
        bits: u32,
    },

    /// A length or count is negative where it may not be (only -1, meaning null, is allowed
    /// for keys, values and header values; nothing below 0 elsewhere).
    #[error("{field} {value} of record {record} at byte {at} is invalid: expected {allowed}")]
    InvalidLength {
        /// Index of the record.
        record: usize,
        /// What was read.
        field: &'static str,
        /// Where it starts.
        at: usize,
        /// The value found.
        value: i32,
        /// What it may be.
        allowed: &'static str,
    },

    /// A record's attributes byte is not 0 (record attributes are unused in format v2).
    #[error("record {record}: attributes at byte {at} are {value}, expected 0")]
    RecordAttributes {
        /// Index of the record.
        record: usize,
        /// Position of the attributes byte.
        at: usize,
        /// The value found.
        value: i8,
    },

    /// A record's `offsetDelta` is not its index in the batch.
    #[error(
        "record {record}: offsetDelta {found} at byte {at}, expected {record} (record i of \
         a batch has offsetDelta i)"
    )]
    OffsetDelta {
        /// Index of the record.
        record: usize,
        /// Position of the `offsetDelta`.
        at: usize,
        /// The value found.
        found: i32,
    },

    /// A record's fields run past the end its length declares.
    #[error(
        "record {record} at byte {at} declares length {declared}, but its {field} at byte \
         {field_at} needs {needed} bytes and only {available} are left in the record"
    )]
    RecordLengthShort {
        /// Index of the record.
        record: usize,
        /// Position of the record's length.
        at: usize,
        /// The length found.
        declared: usize,
        /// The field that runs past the end.
        field: &'static str,
        /// Where that field starts.
        field_at: usize,
        /// Bytes it needs (for a varint: at least this many).
        needed: usize,
        /// Bytes left in the record from `field_at` on.
        available: usize,
    },

    /// A record's fields end before the end its length declares.
    #[error(
        "record {record} at byte {at} declares length {declared}, but its fields take only \
         {used} bytes"
    )]
    RecordLengthLong {
        /// Index of the record.
        record: usize,
        /// Position of the record's length.
        at: usize,
        /// The length found.
        declared: usize,
        /// Bytes its fields take.
        used: usize,
    },

    /// A record declares more headers than [`Limits::max_headers_per_record`].
    #[error(
        "record {record}: headers count {count} at byte {at} is above the limit of {limit} \
         headers per record"
    )]
    TooManyHeaders {
        /// Index of the record.
        record: usize,
        /// Position of the headers count.
        at: usize,
        /// The value found.
        count: i32,
        /// The limit.
        limit: usize,
    },

    /// A header key is not valid UTF-8.
    #[error(
        "record {record}, header {header}: the key at byte {at} is not valid UTF-8 (invalid \
         from its byte {valid_up_to} on)"
    )]
    HeaderKeyUtf8 {
        /// Index of the record.
        record: usize,
        /// Index of the header in the record.
        header: usize,
        /// Where the key bytes start.
        at: usize,
        /// Length of the valid UTF-8 prefix of the key.
        valid_up_to: usize,
    },

    /// Bytes follow the last batch of a body that cannot be another batch.
    #[error(
        "{extra} trailing bytes after the last batch, from byte {at}: fewer than a batch \
         header; a body holds whole batches only"
    )]
    TrailingBytes {
        /// Where the trailing bytes start.
        at: usize,
        /// How many there are.
        extra: usize,
    },

    /// The body is empty.
    #[error("empty body: at least one record batch is required")]
    Empty,
}
