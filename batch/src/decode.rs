//! Decoding: a bounds-checked cursor over the input and the batch and record parsers.

use super::{
    Batch, BatchError, BatchHeader, Header, Limits, Record, ATTRIBUTES_AT, COMPRESSION_MASK,
    CONTROL_BIT, CRC_AT, HEADER_BYTES, LOG_OVERHEAD, MAGIC, MAGIC_AT, MIN_BATCH_LENGTH,
    MIN_HEADER_BYTES, MIN_RECORD_BYTES, TRANSACTIONAL_BIT,
};

/// Decodes exactly one batch at the start of `bytes`; returns it and the number of bytes it
/// takes (`12 + batchLength`). Bytes after the batch are not looked at.
///
/// The checks, in order: the header fields up to the magic byte are present and the magic is
/// 2; `batchLength` covers at least the header and the input holds the whole batch; the CRC
/// matches; the batch is not compressed, transactional or a control batch; the record count
/// is positive and within `limits`; then each record, which must lie within its declared
/// length and within the batch, carry offset delta `i`, and use its whole length; and at the
/// end, the records fill the batch exactly and `lastOffsetDelta` is the last record's
/// offset delta.
pub fn decode<'a>(bytes: &'a [u8], limits: &Limits) -> Result<(Batch<'a>, usize), BatchError> {
    decode_at(bytes, 0, limits)
}

/// Decodes a body of one or more batches back to back, and nothing else after them.
///
/// An empty body is [`BatchError::Empty`]. Fewer bytes than a batch header after a batch are
/// [`BatchError::TrailingBytes`]; more are decoded as the next batch, and their errors are
/// that batch's. `limits` applies to each batch separately. Positions in errors count from
/// the start of `bytes`.
pub fn decode_all<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Vec<Batch<'a>>, BatchError> {
    if bytes.is_empty() {
        return Err(BatchError::Empty);
    }
    let mut batches = Vec::new();
    let mut pos = 0;
    loop {
        let (batch, used) = decode_at(bytes, pos, limits)?;
        batches.push(batch);
        pos += used;
        let rest = bytes.len().saturating_sub(pos);
        if rest == 0 {
            return Ok(batches);
        }
        if rest < HEADER_BYTES {
            return Err(BatchError::TrailingBytes {
                at: pos,
                extra: rest,
            });
        }
    }
}

/// Decodes the batch starting at `bytes[start..]`, reporting positions from the start of
/// `bytes`; returns it and the bytes it takes.
fn decode_at<'a>(
    bytes: &'a [u8],
    start: usize,
    limits: &Limits,
) -> Result<(Batch<'a>, usize), BatchError> {
    let Frame {
        mut c,
        base_offset,
        length_at,
        batch_length,
        partition_leader_epoch,
        total,
        end,
    } = frame(bytes, start)?;
    let available = bytes.len().saturating_sub(start);

    let crc = c.u32("crc")?;
    let covered = bytes
        .get(start + ATTRIBUTES_AT..end)
        .ok_or(BatchError::Truncated {
            field: "CRC-covered bytes",
            at: start + ATTRIBUTES_AT,
            needed: total - ATTRIBUTES_AT,
            available: available.saturating_sub(ATTRIBUTES_AT),
        })?;
    let computed = crc32c::crc32c(covered);
    if computed != crc {
        return Err(BatchError::Crc {
            at: start + CRC_AT,
            expected: crc,
            computed,
            from: start + ATTRIBUTES_AT,
        });
    }

    let attributes_at = c.pos;
    let attributes = c.i16("attributes")?;
    if attributes & COMPRESSION_MASK != 0 {
        return Err(BatchError::Compressed {
            at: attributes_at,
            codec: (attributes & COMPRESSION_MASK) as u8,
        });
    }
    if attributes & TRANSACTIONAL_BIT != 0 {
        return Err(BatchError::Transactional {
            at: attributes_at,
            attributes,
        });
    }
    if attributes & CONTROL_BIT != 0 {
        return Err(BatchError::Control {
            at: attributes_at,
            attributes,
        });
    }
    let last_offset_delta_at = c.pos;
    let last_offset_delta = c.i32("lastOffsetDelta")?;
    let header = BatchHeader {
        base_offset,
        partition_leader_epoch,
        attributes,
        last_offset_delta,
        base_timestamp: c.i64("baseTimestamp")?,
        max_timestamp: c.i64("maxTimestamp")?,
        producer_id: c.i64("producerId")?,
        producer_epoch: c.i16("producerEpoch")?,
        base_sequence: c.i32("baseSequence")?,
    };
    let count_at = c.pos;
    let count = c.i32("record count")?;
    if count <= 0 {
        return Err(BatchError::RecordCountInvalid {
            at: count_at,
            count,
        });
    }
    // Positive after the check above.
    let count_usize = count as usize;
    if count_usize > limits.max_records {
        return Err(BatchError::RecordCountAboveLimit {
            at: count_at,
            count,
            limit: limits.max_records,
        });
    }

    let mut records = Vec::with_capacity(count_usize.min(c.remaining() / MIN_RECORD_BYTES));
    for index in 0..count_usize {
        if c.remaining() == 0 {
            return Err(BatchError::RecordCountMismatch {
                at: count_at,
                declared: count,
                found: index,
            });
        }
        c.bound = Bound::Batch {
            at: length_at,
            declared: batch_length,
            record: index,
        };
        records.push(record(&mut c, index, limits)?);
    }
    if c.remaining() != 0 {
        return Err(BatchError::BatchLengthLong {
            at: length_at,
            declared: batch_length,
            count: count_usize,
            extra: c.remaining(),
            from: c.pos,
        });
    }
    let last = records.last().map_or(-1, |r| r.offset_delta);
    if last_offset_delta != last {
        return Err(BatchError::LastOffsetDelta {
            at: last_offset_delta_at,
            declared: last_offset_delta,
            last,
        });
    }
    Ok((Batch { header, records }, total))
}

/// The framing of the batch at `bytes[start..]`: its fixed fields up to the magic byte,
/// checked (magic 2, a `batchLength` that covers the header and lies within the input), and a
/// cursor bounded by the batch's end, positioned at the CRC.
struct Frame<'a> {
    c: Cursor<'a>,
    base_offset: i64,
    length_at: usize,
    batch_length: i32,
    partition_leader_epoch: i32,
    /// Bytes the batch takes: `12 + batchLength`.
    total: usize,
    /// Where it ends.
    end: usize,
}

fn frame(bytes: &[u8], start: usize) -> Result<Frame<'_>, BatchError> {
    let mut c = Cursor {
        buf: bytes,
        pos: start,
        end: bytes.len(),
        bound: Bound::Input,
    };
    let base_offset = c.i64("baseOffset")?;
    let length_at = c.pos;
    let batch_length = c.i32("batchLength")?;
    let partition_leader_epoch = c.i32("partitionLeaderEpoch")?;
    let magic = c.i8("magic")?;
    if magic != MAGIC {
        return Err(BatchError::Magic {
            at: start + MAGIC_AT,
            found: magic,
        });
    }
    if batch_length < MIN_BATCH_LENGTH {
        return Err(BatchError::BatchLengthTooSmall {
            at: length_at,
            declared: batch_length,
        });
    }
    // Non-negative after the check above.
    let total = LOG_OVERHEAD + batch_length as usize;
    let available = bytes.len().saturating_sub(start);
    if total > available {
        return Err(BatchError::Truncated {
            field: "batch (12 + batchLength bytes)",
            at: start,
            needed: total,
            available,
        });
    }
    let end = start + total;
    c.end = end;
    Ok(Frame {
        c,
        base_offset,
        length_at,
        batch_length,
        partition_leader_epoch,
        total,
        end,
    })
}

/// Record `n` (counting from 0 across the batches) of a body of batches back to back that
/// [`decode_all`] accepted, found without decoding the records before it or checking the
/// CRCs again: the batches before it are skipped by their lengths and record counts, the
/// records before it by their lengths. For reading one record of a body checked once already.
///
/// Every length is still checked against the bytes present, and the record itself is decoded
/// as [`decode`] decodes it, so any input gives a record or an error, never a panic; but a
/// damaged byte that a CRC would catch goes unnoticed unless it breaks the framing.
pub fn nth_record<'a>(
    bytes: &'a [u8],
    n: usize,
    limits: &Limits,
) -> Result<Record<'a>, BatchError> {
    let mut start = 0;
    let mut before = 0;
    while start < bytes.len() {
        let Frame {
            mut c,
            length_at,
            batch_length,
            end,
            ..
        } = frame(bytes, start)?;
        c.pos = start + HEADER_BYTES - 4;
        let count_at = c.pos;
        let count = c.i32("record count")?;
        let count = usize::try_from(count).ok().filter(|&c| c > 0).ok_or(
            BatchError::RecordCountInvalid {
                at: count_at,
                count,
            },
        )?;
        if n - before < count {
            let index = n - before;
            for skipped in 0..index {
                c.bound = Bound::Batch {
                    at: length_at,
                    declared: batch_length,
                    record: skipped,
                };
                let length = c.count("record length", skipped, "a non-negative length")?;
                c.take(length, "record body")?;
            }
            c.bound = Bound::Batch {
                at: length_at,
                declared: batch_length,
                record: index,
            };
            return record(&mut c, index, limits);
        }
        before += count;
        start = end;
    }
    Err(BatchError::NoSuchRecord {
        index: n,
        count: before,
    })
}

/// Reads record `index` from `c` (bounded by the batch) and moves `c` past it.
fn record<'a>(c: &mut Cursor<'a>, index: usize, limits: &Limits) -> Result<Record<'a>, BatchError> {
    let at = c.pos;
    let declared = c.count("record length", index, "a non-negative length")?;
    let body_at = c.pos;
    // Checks that the body lies within the batch (reports it as BatchLengthShort if not).
    c.take(declared, "record body")?;
    let mut r = Cursor {
        buf: c.buf,
        pos: body_at,
        end: body_at + declared,
        bound: Bound::Record {
            record: index,
            at,
            declared,
        },
    };

    let attributes_at = r.pos;
    let attributes = r.i8("attributes")?;
    if attributes != 0 {
        return Err(BatchError::RecordAttributes {
            record: index,
            at: attributes_at,
            value: attributes,
        });
    }
    let timestamp_delta = r.varlong("timestampDelta", index)?;
    let offset_delta_at = r.pos;
    let offset_delta = r.varint("offsetDelta", index)?;
    if usize::try_from(offset_delta).ok() != Some(index) {
        return Err(BatchError::OffsetDelta {
            record: index,
            at: offset_delta_at,
            found: offset_delta,
        });
    }
    let key = r.nullable_bytes("key length", "key", index)?;
    let value = r.nullable_bytes("value length", "value", index)?;

    let headers_at = r.pos;
    let header_count = r.count("headers count", index, "a non-negative count")?;
    if header_count > limits.max_headers_per_record {
        return Err(BatchError::TooManyHeaders {
            record: index,
            at: headers_at,
            count: header_count as i32,
            limit: limits.max_headers_per_record,
        });
    }
    let mut headers = Vec::with_capacity(header_count.min(r.remaining() / MIN_HEADER_BYTES));
    for h in 0..header_count {
        let key_length = r.count(
            "header key length",
            index,
            "a non-negative length (a header key cannot be null)",
        )?;
        let key_at = r.pos;
        let key_bytes = r.take(key_length, "header key")?;
        let key = std::str::from_utf8(key_bytes).map_err(|e| BatchError::HeaderKeyUtf8 {
            record: index,
            header: h,
            at: key_at,
            valid_up_to: e.valid_up_to(),
        })?;
        let value = r.nullable_bytes("header value length", "header value", index)?;
        headers.push(Header { key, value });
    }
    if r.remaining() != 0 {
        return Err(BatchError::RecordLengthLong {
            record: index,
            at,
            declared,
            used: r.pos - body_at,
        });
    }
    c.pos = r.end;
    Ok(Record {
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers,
    })
}

/// What limits a [`Cursor`]'s reads, and so which error a read past its end is.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// The end of the input: [`BatchError::Truncated`].
    Input,
    /// The end of the batch that `batchLength` declares: [`BatchError::BatchLengthShort`].
    Batch {
        /// Position of `batchLength`.
        at: usize,
        /// Its value.
        declared: i32,
        /// The record being read.
        record: usize,
    },
    /// The end of a record's declared length: [`BatchError::RecordLengthShort`].
    Record {
        /// Index of the record.
        record: usize,
        /// Position of its length.
        at: usize,
        /// Its length.
        declared: usize,
    },
}

/// A read position in `buf` that never reads at or past `end` (`pos <= end <= buf.len()`).
struct Cursor<'a> {
    /// The whole input: positions are indexes into it.
    buf: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Where reads stop.
    end: usize,
    /// What `end` is.
    bound: Bound,
}

impl<'a> Cursor<'a> {
    /// Bytes left before `end`.
    fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    /// The error for `field` at `at` needing `needed` bytes with `available` left.
    fn short(&self, field: &'static str, at: usize, needed: usize, available: usize) -> BatchError {
        match self.bound {
            Bound::Input => BatchError::Truncated {
                field,
                at,
                needed,
                available,
            },
            Bound::Batch {
                at: length_at,
                declared,
                record,
            } => BatchError::BatchLengthShort {
                at: length_at,
                declared,
                record,
                field,
                field_at: at,
                needed,
                available,
            },
            Bound::Record {
                record,
                at: record_at,
                declared,
            } => BatchError::RecordLengthShort {
                record,
                at: record_at,
                declared,
                field,
                field_at: at,
                needed,
                available,
            },
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BatchError> {
        let available = self.remaining();
        if n > available {
            return Err(self.short(field, self.pos, n, available));
        }
        let bytes = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or_else(|| self.short(field, self.pos, n, available))?;
        self.pos += n;
        Ok(bytes)
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], BatchError> {
        let at = self.pos;
        let available = self.remaining();
        let bytes = self.take(N, field)?;
        <[u8; N]>::try_from(bytes).map_err(|_| self.short(field, at, N, available))
    }

    fn i8(&mut self, field: &'static str) -> Result<i8, BatchError> {
        Ok(i8::from_be_bytes(self.array(field)?))
    }

    fn i16(&mut self, field: &'static str) -> Result<i16, BatchError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, BatchError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, BatchError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, BatchError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// An unsigned base-128 varint of at most `max_bytes` bytes whose value fits in `bits`
    /// bits.
    fn unsigned_varint(
        &mut self,
        field: &'static str,
        record: usize,
        max_bytes: usize,
        bits: u32,
    ) -> Result<u64, BatchError> {
        let at = self.pos;
        let available = self.remaining();
        let mut value: u64 = 0;
        for i in 0..max_bytes {
            let Some(&byte) = self.buf.get(self.pos).filter(|_| self.pos < self.end) else {
                return Err(self.short(field, at, i + 1, available));
            };
            self.pos += 1;
            let shift = 7 * i as u32;
            let last = i + 1 == max_bytes;
            if last && byte & 0x80 != 0 {
                return Err(BatchError::VarintTooLong {
                    record,
                    field,
                    at,
                    max_bytes,
                });
            }
            // The last byte may only carry the bits left up to `bits`.
            if last && u32::from(byte) >> (bits - shift) != 0 {
                return Err(BatchError::VarintOutOfRange {
                    record,
                    field,
                    at,
                    bits,
                });
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        // Unreachable: the last byte either ends the varint or is refused above.
        Err(BatchError::VarintTooLong {
            record,
            field,
            at,
            max_bytes,
        })
    }

    /// A zigzag varint (at most 5 bytes, 32 bits).
    fn varint(&mut self, field: &'static str, record: usize) -> Result<i32, BatchError> {
        // At most 32 bits after the checks of `unsigned_varint`.
        let raw = self.unsigned_varint(field, record, 5, 32)? as u32;
        Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
    }

    /// A zigzag varlong (at most 10 bytes, 64 bits).
    fn varlong(&mut self, field: &'static str, record: usize) -> Result<i64, BatchError> {
        let raw = self.unsigned_varint(field, record, 10, 64)?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    /// A varint that must not be negative (a length or a count); `allowed` says what is, in
    /// the error.
    fn count(
        &mut self,
        field: &'static str,
        record: usize,
        allowed: &'static str,
    ) -> Result<usize, BatchError> {
        let at = self.pos;
        let value = self.varint(field, record)?;
        usize::try_from(value).map_err(|_| BatchError::InvalidLength {
            record,
            field,
            at,
            value,
            allowed,
        })
    }

    /// A varint length followed by that many bytes; a length of -1 is `None`.
    fn nullable_bytes(
        &mut self,
        length_field: &'static str,
        field: &'static str,
        record: usize,
    ) -> Result<Option<&'a [u8]>, BatchError> {
        let at = self.pos;
        let length = self.varint(length_field, record)?;
        match length {
            -1 => Ok(None),
            // Non-negative in this arm.
            0.. => self.take(length as usize, field).map(Some),
            _ => Err(BatchError::InvalidLength {
                record,
                field: length_field,
                at,
                value: length,
                allowed: "-1 (null) or a non-negative length",
            }),
        }
    }
}
