//! Tests of the record batch codec: golden bytes from another Kafka implementation, round
//! trips, truncation, corruption and hostile inputs.

use super::*;

// Golden batches built by kafka-python 3.0.12's `DefaultRecordBatchBuilder`, printed as hex:
//
//     import struct
//     from kafka.record.default_records import DefaultRecordBatchBuilder
//
//     def build(records, base_offset=0):
//         b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
//                                       producer_id=-1, producer_epoch=-1, base_sequence=-1,
//                                       batch_size=1 << 20)
//         for i, (ts, key, value, headers) in enumerate(records):
//             assert b.append(i, timestamp=ts, key=key, value=value, headers=headers)
//         buf = bytearray(b.build())
//         struct.pack_into(">q", buf, 0, base_offset)  # baseOffset is outside the CRC
//         return bytes(buf)
//
//     a = build([
//         (1700000000000, b"key-1", b"hello", [("h1", b"v1"), ("null", None)]),
//         (1700000000005, None, b"", []),
//         (1699999999990, b"k", bytes(range(256)), [("", b""), ("caf\u00e9", b"\x00\xff")]),
//     ])
//     b = build([(1234567890123, b"only", None, [("trace", b"abc")])], base_offset=42)
//     c = build([(-5, None, None, []), (1 << 40, b"", b"x", [("z", None)])],
//               base_offset=(1 << 40) + 7)
//     for x in (a, b, c):
//         print(x.hex())
const GOLDEN_A: &str = concat!(
    "00000000000000000000016a0000000002a0f6dc410000000000020000018bcfe568000000018bcf",
    "e56805ffffffffffffffffffffffffffff00000003380000000a6b65792d310a68656c6c6f040468",
    "31047631086e756c6c010c000a02010000a604001304026b8004000102030405060708090a0b0c0d",
    "0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435",
    "363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d",
    "5e5f606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485",
    "868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacad",
    "aeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5",
    "d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfd",
    "feff0400000a636166c3a90400ff",
);
const GOLDEN_B: &str = concat!(
    "000000000000002a0000004600000000029b3b7dc20000000000000000011f71fb04cb0000011f71",
    "fb04cbffffffffffffffffffffffffffff0000000128000000086f6e6c7901020a74726163650661",
    "6263",
);
const GOLDEN_C: &str = concat!(
    "0000010000000007000000480000000002f5cc4bbe000000000001fffffffffffffffb0000010000",
    "000000ffffffffffffffffffffffffffff000000020c0000000101001e008a808080804002000278",
    "02027a01",
);

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A header as kafka-python writes it for a producer without idempotence.
fn header(base_offset: i64, last: i32, base_ts: i64, max_ts: i64) -> BatchHeader {
    BatchHeader {
        base_offset,
        partition_leader_epoch: 0,
        attributes: 0,
        last_offset_delta: last,
        base_timestamp: base_ts,
        max_timestamp: max_ts,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
    }
}

type Bytes = Option<Vec<u8>>;
/// A record to encode: timestamp delta, key, value, headers.
type Owned = (i64, Bytes, Bytes, Vec<(String, Bytes)>);
/// A borrowed header, as [`RecordRef`] takes it.
type HeaderRef<'a> = (&'a str, Option<&'a [u8]>);

fn some(bytes: &[u8]) -> Bytes {
    Some(bytes.to_vec())
}

/// The golden batches' header and records, as given to kafka-python.
fn golden_inputs() -> Vec<(&'static str, BatchHeader, Vec<Owned>)> {
    let h = |k: &str, v: Bytes| (k.to_string(), v);
    let a = vec![
        (
            0,
            some(b"key-1"),
            some(b"hello"),
            vec![h("h1", some(b"v1")), h("null", None)],
        ),
        (5, None, some(b""), vec![]),
        (
            -10,
            some(b"k"),
            Some((0..=255).collect()),
            vec![h("", some(b"")), h("caf\u{e9}", some(b"\x00\xff"))],
        ),
    ];
    let b = vec![(0, some(b"only"), None, vec![h("trace", some(b"abc"))])];
    let c = vec![
        (0, None, None, vec![]),
        ((1 << 40) + 5, some(b""), some(b"x"), vec![h("z", None)]),
    ];
    vec![
        (
            GOLDEN_A,
            header(0, 2, 1_700_000_000_000, 1_700_000_000_005),
            a,
        ),
        (
            GOLDEN_B,
            header(42, 0, 1_234_567_890_123, 1_234_567_890_123),
            b,
        ),
        (GOLDEN_C, header((1 << 40) + 7, 1, -5, 1 << 40), c),
    ]
}

/// Encodes owned records through [`RecordRef`]s.
fn encode_owned(header: &BatchHeader, records: &[Owned], out: &mut Vec<u8>) {
    let headers: Vec<Vec<HeaderRef<'_>>> = records
        .iter()
        .map(|r| {
            r.3.iter()
                .map(|(k, v)| (k.as_str(), v.as_deref()))
                .collect()
        })
        .collect();
    let refs: Vec<RecordRef<'_>> = records
        .iter()
        .zip(&headers)
        .map(|(r, h)| RecordRef {
            timestamp_delta: r.0,
            key: r.1.as_deref(),
            value: r.2.as_deref(),
            headers: h,
        })
        .collect();
    encode(header, &refs, out);
}

/// Asserts that `batch` holds exactly `header` and `records`.
fn assert_batch(batch: &Batch<'_>, header: &BatchHeader, records: &[Owned]) {
    assert_eq!(&batch.header, header);
    assert_eq!(batch.records.len(), records.len());
    for (i, (got, want)) in batch.records.iter().zip(records).enumerate() {
        assert_eq!(got.offset_delta, i as i32);
        assert_eq!(got.timestamp_delta, want.0, "record {i}");
        assert_eq!(got.key, want.1.as_deref(), "record {i}");
        assert_eq!(got.value, want.2.as_deref(), "record {i}");
        let headers: Vec<HeaderRef<'_>> = want
            .3
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        let got_headers: Vec<HeaderRef<'_>> =
            got.headers.iter().map(|h| (h.key, h.value)).collect();
        assert_eq!(got_headers, headers, "record {i}");
    }
}

#[test]
fn golden_batches_decode_to_the_expected_fields() {
    for (hex, header, records) in golden_inputs() {
        let bytes = unhex(hex);
        let (batch, used) = decode(&bytes, &Limits::default()).unwrap();
        assert_eq!(used, bytes.len());
        assert_batch(&batch, &header, &records);
    }
}

#[test]
fn golden_batches_encode_to_identical_bytes() {
    for (hex, header, records) in golden_inputs() {
        let mut out = vec![0xAA]; // encode appends
        encode_owned(&header, &records, &mut out);
        assert_eq!(out[0], 0xAA);
        assert_eq!(to_hex(&out[1..]), hex);
    }
}

#[test]
fn golden_body_of_two_batches() {
    let mut body = unhex(GOLDEN_B);
    body.extend(unhex(GOLDEN_C));
    let batches = decode_all(&body, &Limits::default()).unwrap();
    let inputs = golden_inputs();
    assert_eq!(batches.len(), 2);
    assert_batch(&batches[0], &inputs[1].1, &inputs[1].2);
    assert_batch(&batches[1], &inputs[2].1, &inputs[2].2);
}

/// Lowercase hex, for comparing bytes to the golden constants.
fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// xorshift64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Null, empty, short, or (rarely) up to 64 KiB.
    fn nullable(&mut self) -> Option<Vec<u8>> {
        match self.below(20) {
            0..=2 => None,
            3..=4 => Some(Vec::new()),
            5 => {
                let n = self.below(64 * 1024 + 1) as usize;
                Some(self.bytes(n))
            }
            _ => {
                let n = self.below(40) as usize;
                Some(self.bytes(n))
            }
        }
    }

    fn timestamp_delta(&mut self) -> i64 {
        match self.below(6) {
            0 => 0,
            1 => -(self.below(1000) as i64),
            2 => i64::MIN,
            3 => i64::MAX,
            4 => self.next() as i64,
            _ => self.below(100_000) as i64,
        }
    }

    fn header(&mut self, last: i32) -> BatchHeader {
        BatchHeader {
            base_offset: self.next() as i64,
            partition_leader_epoch: self.next() as i32,
            // Compression bits (3) are cleared by `encode`.
            attributes: [0, 3, TIMESTAMP_TYPE_BIT, DELETE_HORIZON_BIT][self.below(4) as usize],
            last_offset_delta: last,
            base_timestamp: self.next() as i64,
            max_timestamp: self.next() as i64,
            producer_id: self.next() as i64,
            producer_epoch: self.next() as i16,
            base_sequence: self.next() as i32,
        }
    }

    fn records(&mut self) -> Vec<Owned> {
        let count = match self.below(5) {
            0 => 1,
            1 => 300 + self.below(100) as usize,
            _ => 1 + self.below(30) as usize,
        };
        (0..count)
            .map(|_| {
                let headers = (0..self.below(6))
                    .map(|_| {
                        let key = ["", "k", "trace-id", "caf\u{e9}"][self.below(4) as usize];
                        (key.to_string(), self.nullable())
                    })
                    .collect();
                (
                    self.timestamp_delta(),
                    self.nullable(),
                    self.nullable(),
                    headers,
                )
            })
            .collect()
    }
}

#[test]
fn random_batches_round_trip() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..150 {
        let records = rng.records();
        let header = rng.header(records.len() as i32 - 1);
        let mut out = Vec::new();
        encode_owned(&header, &records, &mut out);
        let first = out.len();
        let records2 = rng.records();
        let header2 = rng.header(records2.len() as i32 - 1);
        encode_owned(&header2, &records2, &mut out);

        let limits = limits(1000, 5);
        let (batch, used) = decode(&out, &limits).unwrap();
        assert_eq!(used, first);
        let clear = |h: BatchHeader| BatchHeader {
            attributes: h.attributes & !COMPRESSION_MASK,
            ..h
        };
        assert_batch(&batch, &clear(header), &records);
        let all = decode_all(&out, &limits).unwrap();
        assert_eq!(all.len(), 2);
        assert_batch(&all[0], &clear(header), &records);
        assert_batch(&all[1], &clear(header2), &records2);
    }
}

#[test]
fn every_strict_prefix_is_an_error() {
    let limits = Limits::default();
    let a = unhex(GOLDEN_A);
    for n in 0..a.len() {
        assert!(decode(&a[..n], &limits).is_err(), "prefix {n}");
        assert!(decode_all(&a[..n], &limits).is_err(), "prefix {n}");
    }
    let b_len = unhex(GOLDEN_B).len();
    let mut body = unhex(GOLDEN_B);
    body.extend(unhex(GOLDEN_C));
    for n in 0..body.len() {
        let result = decode_all(&body[..n], &limits);
        if n == b_len {
            // The first batch alone is a valid body.
            assert_eq!(result.unwrap().len(), 1);
        } else if n > b_len && n < b_len + HEADER_BYTES {
            let err = format!("{:?}", result.unwrap_err());
            assert_eq!(
                err,
                format!("TrailingBytes {{ at: 82, extra: {} }}", n - b_len)
            );
        } else {
            assert!(result.is_err(), "prefix {n}");
        }
    }
}

#[test]
fn trailing_byte_and_empty_body() {
    let limits = Limits::default();
    let mut a = unhex(GOLDEN_A);
    let len = a.len();
    a.push(0);
    // `decode` reads one batch and leaves what follows to the caller.
    assert_eq!(decode(&a, &limits).unwrap().1, len);
    let err = decode_all(&a, &limits).unwrap_err();
    assert_eq!(err, BatchError::TrailingBytes { at: len, extra: 1 });
    assert!(err.to_string().contains("from byte 374"), "{err}");
    assert_eq!(decode_all(&[], &limits).unwrap_err(), BatchError::Empty);
}

#[test]
fn flipping_a_crc_covered_byte_is_a_crc_mismatch() {
    let a = unhex(GOLDEN_A);
    for i in CRC_AT..a.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut bad = a.clone();
            bad[i] ^= mask;
            let err = decode(&bad, &Limits::default()).unwrap_err();
            let is_crc = matches!(
                err,
                BatchError::Crc {
                    at: 17,
                    from: 21,
                    ..
                }
            );
            assert!(is_crc, "byte {i}: {err}");
        }
    }
}

#[test]
fn base_offset_is_outside_the_crc() {
    let a = unhex(GOLDEN_A);
    for i in 0..8 {
        let mut other = a.clone();
        other[i] ^= 0x5a;
        let (batch, _) = decode(&other, &Limits::default()).unwrap();
        assert_ne!(batch.header.base_offset, 0);
    }
    let mut b = unhex(GOLDEN_B);
    set_base_offset(&mut b, -7_000_000_000).unwrap();
    let (batch, _) = decode(&b, &Limits::default()).unwrap();
    assert_eq!(batch.header.base_offset, -7_000_000_000);
    assert!(set_base_offset(&mut b[..60], 1).is_err());
    b[MAGIC_AT] = 1;
    assert_eq!(
        set_base_offset(&mut b, 1),
        Err(BatchError::Magic { at: 16, found: 1 })
    );
}

// Records for hand-made batches (a batch header is 61 bytes, so a first record's length is
// at byte 61 and its body starts at byte 62). Varints are zigzag: 0 -> 00, -1 -> 01,
// 1 -> 02, 2 -> 04.
/// Record 0: length 7, attributes 0, timestampDelta 0, offsetDelta 0, null key, value "x",
/// no headers.
const R0: &[u8] = &[0x0e, 0, 0, 0, 0x01, 0x02, b'x', 0];
/// The same with offsetDelta 1.
const R1: &[u8] = &[0x0e, 0, 0, 2, 0x01, 0x02, b'x', 0];
/// The same with offsetDelta 2.
const R2: &[u8] = &[0x0e, 0, 0, 4, 0x01, 0x02, b'x', 0];

/// A batch with the given attributes, lastOffsetDelta, record count and records, its
/// batchLength and CRC correct (so that the check under test is the one that fails).
fn raw_batch(attributes: i16, last: i32, count: i32, records: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&header(0, 0, 0, 0), &[], &mut out);
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    out[23..27].copy_from_slice(&last.to_be_bytes());
    out[57..61].copy_from_slice(&count.to_be_bytes());
    out.extend(records.concat());
    reseal(&mut out);
    out
}

/// Sets batchLength to the bytes present and recomputes the CRC.
fn reseal(batch: &mut [u8]) {
    let length = (batch.len() - 12) as i32;
    batch[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn decode_err(bytes: &[u8]) -> BatchError {
    decode(bytes, &Limits::default()).unwrap_err()
}

fn limits(max_records: usize, max_headers_per_record: usize) -> Limits {
    Limits {
        max_records,
        max_headers_per_record,
    }
}

/// The `Debug` form of the error decoding `bytes` gives.
fn debug_err(bytes: &[u8], limits: &Limits) -> String {
    format!("{:?}", decode(bytes, limits).unwrap_err())
}

#[test]
fn hand_made_records_decode() {
    let bytes = raw_batch(0, 2, 3, &[R0, R1, R2]);
    let (batch, _) = decode(&bytes, &Limits::default()).unwrap();
    assert_eq!(batch.records.len(), 3);
    assert_eq!(batch.records[2].offset_delta, 2);
    assert_eq!(batch.records[2].value, Some(&b"x"[..]));
    // The largest 10-byte varlong, i64::MIN.
    let mut body = vec![0x1e, 0];
    body.extend([0xff; 9]);
    body.extend([0x01, 0, 0x01, 0x01, 0]);
    let bytes = raw_batch(0, 0, 1, &[&body]);
    let (batch, _) = decode(&bytes, &Limits::default()).unwrap();
    assert_eq!(batch.records[0].timestamp_delta, i64::MIN);
}

/// A hand-made batch that breaks one rule: attributes, lastOffsetDelta, record count, records,
/// and the start of the expected error's `Debug` form.
type Hostile = (i16, i32, i32, &'static [&'static [u8]], &'static str);

#[rustfmt::skip]
const HOSTILE: &[Hostile] = &[
    // Varints: offsetDelta of 6 bytes, timestampDelta of 11, bits beyond 32 and beyond 64.
    (0, 0, 1, &[&[0x18, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0, 0, 0, 0]],
     "VarintTooLong { record: 0, field: \"offsetDelta\", at: 64, max_bytes: 5 }"),
    (0, 0, 1, &[&[0x20, 0], &[0xff; 10], &[0; 5]],
     "VarintTooLong { record: 0, field: \"timestampDelta\", at: 63, max_bytes: 10 }"),
    (0, 0, 1, &[&[0x0e, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10]],
     "VarintOutOfRange { record: 0, field: \"offsetDelta\", at: 64, bits: 32 }"),
    (0, 0, 1, &[&[0x20, 0], &[0xff; 9], &[0x02, 0, 0, 0, 0, 0]],
     "VarintOutOfRange { record: 0, field: \"timestampDelta\", at: 63, bits: 64 }"),
    // Negative lengths: -1 where null is not allowed, below -1 where it is.
    (0, 0, 1, &[&[0x01, 0, 0, 0, 0x01, 0x02, b'x', 0]],
     "InvalidLength { record: 0, field: \"record length\", at: 61, value: -1"),
    (0, 0, 1, &[&[0x0c, 0, 0, 0, 0x03, 0x01, 0]],
     "InvalidLength { record: 0, field: \"key length\", at: 65, value: -2"),
    (0, 0, 1, &[&[0x0c, 0, 0, 0, 0x01, 0x09, 0]],
     "InvalidLength { record: 0, field: \"value length\", at: 66, value: -5"),
    (0, 0, 1, &[&[0x0e, 0, 0, 0, 0x01, 0x02, b'x', 0x01]],
     "InvalidLength { record: 0, field: \"headers count\", at: 68, value: -1"),
    (0, 0, 1, &[&[0x12, 0, 0, 0, 0x01, 0x02, b'x', 0x02, 0x01, 0x01]],
     "InvalidLength { record: 0, field: \"header key length\", at: 69, value: -1"),
    (0, 0, 1, &[&[0x12, 0, 0, 0, 0x01, 0x02, b'x', 0x02, 0x00, 0x03]],
     "InvalidLength { record: 0, field: \"header value length\", at: 70, value: -2"),
    // Header key "a", then a header key that is not UTF-8.
    (0, 0, 1, &[&[0x1c, 0, 0, 0, 0x01, 0x02, b'x', 0x04, 0x02, b'a', 0x01, 0x04, 0xc3, 0x28, 0x01]],
     "HeaderKeyUtf8 { record: 0, header: 1, at: 73, valid_up_to: 0 }"),
    (0, 0, 1, &[&[0x0c, 1, 0, 0, 0x01, 0x01, 0]],
     "RecordAttributes { record: 0, at: 62, value: 1 }"),
    // Record lengths one more and one less than the fields take.
    (0, 0, 1, &[&[0x10, 0, 0, 0, 0x01, 0x02, b'x', 0, 0]],
     "RecordLengthLong { record: 0, at: 61, declared: 8, used: 7 }"),
    (0, 0, 1, &[&[0x0c, 0, 0, 0, 0x01, 0x02, b'x', 0]],
     "RecordLengthShort { record: 0, at: 61, declared: 6, field: \"headers count\", field_at: 68, needed: 1, available: 0 }"),
    // A key length of 2^31-1 in a small record.
    (0, 0, 1, &[&[0x10, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x0f]],
     "RecordLengthShort { record: 0, at: 61, declared: 8, field: \"key\", field_at: 70, needed: 2147483647, available: 0 }"),
    // batchLength against the records: a record past the end, a byte left over.
    (0, 0, 1, &[&[0x28, 0, 0, 0, 0x01, 0x02, b'x', 0]],
     "BatchLengthShort { at: 8, declared: 57, record: 0, field: \"record body\", field_at: 62, needed: 20, available: 7 }"),
    (0, 0, 1, &[R0, &[0]],
     "BatchLengthLong { at: 8, declared: 58, count: 1, extra: 1, from: 69 }"),
    (0, 0, 1, &[R0, R1],
     "BatchLengthLong { at: 8, declared: 65, count: 1, extra: 8, from: 69 }"),
    // Offsets and counts.
    (0, 0, 1, &[R1], "OffsetDelta { record: 0, at: 64, found: 1 }"),
    (0, 1, 2, &[R0, R2], "OffsetDelta { record: 1, at: 72, found: 2 }"),
    (0, 5, 2, &[R0, R1], "LastOffsetDelta { at: 23, declared: 5, last: 1 }"),
    (0, 2, 3, &[R0, R1], "RecordCountMismatch { at: 57, declared: 3, found: 2 }"),
    (0, 0, 0, &[], "RecordCountInvalid { at: 57, count: 0 }"),
    (0, 0, -1, &[R0], "RecordCountInvalid { at: 57, count: -1 }"),
    (0, 0, i32::MAX, &[R0], "RecordCountAboveLimit { at: 57, count: 2147483647, limit: 100000 }"),
    // Attributes (the CRC is correct, so these checks are what fails).
    (1, 0, 1, &[R0], "Compressed { at: 21, codec: 1 }"),
    (4, 0, 1, &[R0], "Compressed { at: 21, codec: 4 }"),
    (7, 0, 1, &[R0], "Compressed { at: 21, codec: 7 }"),
    (0x10, 0, 1, &[R0], "Transactional { at: 21, attributes: 16 }"),
    (0x20, 0, 1, &[R0], "Control { at: 21, attributes: 32 }"),
];

#[test]
fn hostile_batches_are_refused_with_the_right_error() {
    for (attributes, last, count, records, want) in HOSTILE {
        let err = decode_err(&raw_batch(*attributes, *last, *count, records));
        let got = format!("{err:?}");
        assert!(got.starts_with(want), "want {want}\n got {got}");
    }
    let err = decode_err(&raw_batch(2, 0, 1, &[R0]));
    assert_eq!(
        err.to_string(),
        "compressed batches are not supported: compression codec 2 in the attributes at \
         byte 21; send the records uncompressed"
    );
    // Timestamp type and delete horizon are accepted.
    let ok = raw_batch(TIMESTAMP_TYPE_BIT | DELETE_HORIZON_BIT, 0, 1, &[R0]);
    assert!(decode(&ok, &Limits::default()).is_ok());
}

#[test]
fn huge_counts_with_tiny_bodies_fail_fast() {
    let unlimited = limits(usize::MAX, usize::MAX);
    let err = debug_err(&raw_batch(0, 0, i32::MAX, &[R0]), &unlimited);
    assert_eq!(
        err,
        "RecordCountMismatch { at: 57, declared: 2147483647, found: 1 }"
    );
    let err = debug_err(&raw_batch(0, 0, i32::MAX, &[]), &unlimited);
    assert_eq!(
        err,
        "RecordCountMismatch { at: 57, declared: 2147483647, found: 0 }"
    );
    // A headers count of 2^31-1, one empty header, then the end of the record.
    let record: &[u8] = &[
        0x1a, 0, 0, 0, 1, 2, b'x', 0xfe, 0xff, 0xff, 0xff, 0x0f, 0, 0,
    ];
    let err = debug_err(&raw_batch(0, 0, 1, &[record]), &unlimited);
    assert!(err.starts_with("RecordLengthShort { record: 0, at: 61, declared: 13, field: \"header key length\", field_at: 75"), "{err}");
}

#[test]
fn limits_on_headers() {
    // Two headers with empty keys and empty values.
    let record: &[u8] = &[0x16, 0, 0, 0, 0x01, 0x02, b'x', 0x04, 0, 0, 0, 0];
    let bytes = raw_batch(0, 0, 1, &[record]);
    let err = debug_err(&bytes, &limits(2, 1));
    assert_eq!(
        err,
        "TooManyHeaders { record: 0, at: 68, count: 2, limit: 1 }"
    );
    let (batch, _) = decode(&bytes, &limits(2, 2)).unwrap();
    assert_eq!(batch.records[0].headers.len(), 2);
}

#[test]
fn magic_and_batch_length() {
    let mut a = unhex(GOLDEN_A);
    a[MAGIC_AT] = 1;
    assert_eq!(decode_err(&a), BatchError::Magic { at: 16, found: 1 });
    assert_eq!(decode_err(&a[..17]), BatchError::Magic { at: 16, found: 1 });
    let mut a = unhex(GOLDEN_A);
    for declared in [48, -1, i32::MIN] {
        a[8..12].copy_from_slice(&declared.to_be_bytes());
        let want = BatchError::BatchLengthTooSmall { at: 8, declared };
        assert_eq!(decode_err(&a), want);
    }
    let a = unhex(GOLDEN_A);
    let err = debug_err(&a[..100], &Limits::default());
    assert_eq!(err, "Truncated { field: \"batch (12 + batchLength bytes)\", at: 0, needed: 374, available: 100 }");
    let err = decode_err(&a[..10]);
    assert_eq!(
        err.to_string(),
        "truncated batch: batchLength at byte 8 needs 4 bytes, but the input has only 2 left"
    );
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let valid = unhex(GOLDEN_A);
    let limits = Limits::default();
    let mut ok = 0;
    for _ in 0..100_000 {
        let len = rng.below(300) as usize;
        let mut bytes = rng.bytes(len);
        match rng.below(4) {
            0 => {}
            // A valid header, the rest random, with a patched length and CRC.
            1 | 2 if len > HEADER_BYTES => {
                bytes[..HEADER_BYTES].copy_from_slice(&valid[..HEADER_BYTES]);
                let count = rng.below(4) as i32;
                bytes[57..61].copy_from_slice(&count.to_be_bytes());
                bytes[23..27].copy_from_slice(&(count - 1).to_be_bytes());
                if rng.below(2) == 0 {
                    bytes[61] = 2 * rng.below(30) as u8;
                }
                reseal(&mut bytes);
            }
            // A valid batch with a few bytes changed and the CRC recomputed.
            _ => {
                bytes = valid.clone();
                for _ in 0..1 + rng.below(3) {
                    let i = HEADER_BYTES + rng.below((valid.len() - HEADER_BYTES) as u64) as usize;
                    bytes[i] = rng.next() as u8;
                }
                let cut = rng.below(bytes.len() as u64 + 1) as usize;
                if rng.below(4) == 0 {
                    bytes.truncate(cut.max(HEADER_BYTES));
                }
                reseal(&mut bytes);
            }
        }
        if let Ok((batch, used)) = decode(&bytes, &limits) {
            ok += 1;
            assert!(used <= bytes.len());
            assert_eq!(
                batch.records.len() as i32 - 1,
                batch.header.last_offset_delta
            );
        }
        let _ = decode_all(&bytes, &limits);
    }
    // The mutations reach the record parser and sometimes still make valid batches.
    assert!(ok > 0);
}

/// `nth_record` finds, without decoding what comes before, exactly the record `decode_all`
/// puts at that place, across batches; past the last record it says how many there are.
#[test]
fn nth_record_is_the_record_decode_all_finds_there() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let limits = limits(1000, 5);
    for _ in 0..60 {
        let mut out = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let records = rng.records();
            let header = rng.header(records.len() as i32 - 1);
            encode_owned(&header, &records, &mut out);
        }
        let all: Vec<Record<'_>> = decode_all(&out, &limits)
            .unwrap()
            .into_iter()
            .flat_map(|b| b.records)
            .collect();
        for (n, record) in all.iter().enumerate() {
            assert_eq!(&nth_record(&out, n, &limits).unwrap(), record, "record {n}");
        }
        assert_eq!(
            nth_record(&out, all.len(), &limits),
            Err(BatchError::NoSuchRecord {
                index: all.len(),
                count: all.len()
            })
        );
    }
}

/// Whatever the bytes, `nth_record` answers a record or an error, never a panic.
#[test]
fn nth_record_never_panics() {
    let mut rng = Rng(0x94D0_49BB_1331_11EB);
    let valid = unhex(GOLDEN_A);
    let limits = Limits::default();
    for _ in 0..50_000 {
        let mut bytes = valid.clone();
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] = rng.next() as u8;
        }
        if rng.below(3) == 0 {
            bytes.truncate(rng.below(bytes.len() as u64) as usize);
        }
        let _ = nth_record(&bytes, rng.below(4) as usize, &limits);
    }
}
