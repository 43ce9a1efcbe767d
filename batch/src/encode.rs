//! Encoding: writing a batch, and rewriting the base offset of one in place.

use super::{
    BatchError, BatchHeader, RecordRef, ATTRIBUTES_AT, COMPRESSION_MASK, CRC_AT, HEADER_BYTES,
    LOG_OVERHEAD, MAGIC, MAGIC_AT,
};

/// Appends one uncompressed batch holding `records` to `out`.
///
/// Record `i` gets offset delta `i`, and `lastOffsetDelta` is `records.len() - 1` (whatever
/// `header.last_offset_delta` says); `batchLength`, the record count and the CRC are computed.
/// The other fields of `header` are written as given, except the compression bits of the
/// attributes, which are cleared since the records are written uncompressed.
/// `max_timestamp` is not computed: pass `base_timestamp` plus the largest timestamp delta.
///
/// An empty `records` writes a batch with a count of 0 and `lastOffsetDelta` -1, which
/// [`decode`](super::decode) refuses.
///
/// # Panics
///
/// If the batch would exceed the format's limit of `i32::MAX` bytes (a key, value, record or
/// batch length that does not fit its `int32`).
pub fn encode(header: &BatchHeader, records: &[RecordRef<'_>], out: &mut Vec<u8>) {
    let start = out.len();
    let count = to_i32(records.len(), "record count");
    out.extend_from_slice(&header.base_offset.to_be_bytes());
    out.extend_from_slice(&[0; 4]); // batchLength, filled in below
    out.extend_from_slice(&header.partition_leader_epoch.to_be_bytes());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled in below
    out.extend_from_slice(&(header.attributes & !COMPRESSION_MASK).to_be_bytes());
    out.extend_from_slice(&(count - 1).to_be_bytes());
    out.extend_from_slice(&header.base_timestamp.to_be_bytes());
    out.extend_from_slice(&header.max_timestamp.to_be_bytes());
    out.extend_from_slice(&header.producer_id.to_be_bytes());
    out.extend_from_slice(&header.producer_epoch.to_be_bytes());
    out.extend_from_slice(&header.base_sequence.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    debug_assert_eq!(out.len() - start, HEADER_BYTES);

    for (index, record) in records.iter().enumerate() {
        // `index < records.len()`, which fits in an i32 (checked above).
        write_record(out, index as i32, record);
    }

    let batch_length = to_i32(out.len() - start - LOG_OVERHEAD, "batchLength");
    out[start + LOG_OVERHEAD - 4..start + LOG_OVERHEAD]
        .copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + ATTRIBUTES_AT..]);
    out[start + CRC_AT..start + ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
}

/// Rewrites the `baseOffset` of the batch at the start of `batch` in place.
///
/// `baseOffset` lies outside the CRC, so a valid batch stays valid. Only the header is
/// checked (present, magic 2): call it on a batch that [`decode`](super::decode) accepted.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) -> Result<(), BatchError> {
    if batch.len() < HEADER_BYTES {
        return Err(BatchError::Truncated {
            field: "batch header",
            at: 0,
            needed: HEADER_BYTES,
            available: batch.len(),
        });
    }
    let magic = batch.get(MAGIC_AT).map_or(0, |&b| b as i8);
    if magic != MAGIC {
        return Err(BatchError::Magic {
            at: MAGIC_AT,
            found: magic,
        });
    }
    if let Some(field) = batch.get_mut(..8) {
        field.copy_from_slice(&base_offset.to_be_bytes());
    }
    Ok(())
}

/// Appends record `offset_delta` (its length, then its fields).
fn write_record(out: &mut Vec<u8>, offset_delta: i32, record: &RecordRef<'_>) {
    let mut body = 1 // attributes
        + varlong_size(record.timestamp_delta)
        + varint_size(offset_delta)
        + nullable_size(record.key)
        + nullable_size(record.value)
        + varint_size(to_i32(record.headers.len(), "headers count"));
    for (key, value) in record.headers {
        body += varint_size(to_i32(key.len(), "header key length")) + key.len();
        body += nullable_size(*value);
    }
    put_varint(out, to_i32(body, "record length"));
    let body_start = out.len();
    out.push(0); // attributes
    put_varlong(out, record.timestamp_delta);
    put_varint(out, offset_delta);
    put_nullable(out, record.key);
    put_nullable(out, record.value);
    put_varint(out, to_i32(record.headers.len(), "headers count"));
    for (key, value) in record.headers {
        put_varint(out, to_i32(key.len(), "header key length"));
        out.extend_from_slice(key.as_bytes());
        put_nullable(out, *value);
    }
    debug_assert_eq!(out.len() - body_start, body);
}

/// `n` as an `int32` field of the format.
fn to_i32(n: usize, field: &str) -> i32 {
    match i32::try_from(n) {
        Ok(v) => v,
        Err(_) => panic!("record batch {field} {n} does not fit in an int32"),
    }
}

/// Zigzag encoding of a varint.
fn zigzag32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

/// Zigzag encoding of a varlong.
fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Bytes of the base-128 encoding of `raw`.
fn unsigned_size(raw: u64) -> usize {
    let bits = 64 - (raw | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

fn varint_size(v: i32) -> usize {
    unsigned_size(u64::from(zigzag32(v)))
}

fn varlong_size(v: i64) -> usize {
    unsigned_size(zigzag64(v))
}

/// Bytes of a nullable byte string: its varint length (-1 for null) and its bytes.
fn nullable_size(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => varint_size(-1),
        Some(b) => varint_size(to_i32(b.len(), "key or value length")) + b.len(),
    }
}

fn put_unsigned(out: &mut Vec<u8>, mut raw: u64) {
    while raw >= 0x80 {
        out.push((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_unsigned(out, u64::from(zigzag32(v)));
}

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    put_unsigned(out, zigzag64(v));
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, to_i32(b.len(), "key or value length"));
            out.extend_from_slice(b);
        }
    }
}
