//! The one binary codec for everything raftq writes to disk or sends between nodes.
//!
//! bincode 1.3 with varint integers and an explicit size limit on decode, so a hostile or
//! corrupt input can never make a node allocate without bound. Types encoded here are a
//! compatibility promise: they are on disk forever, so each carries its own version (an
//! enum tag or a leading version byte) and old versions keep decoding.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Upper bound for any single decoded value that did not come with its own limit.
pub const DEFAULT_DECODE_LIMIT: u64 = 1 << 30;

fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .with_little_endian()
        .with_limit(limit)
        .reject_trailing_bytes()
}

/// Encodes `value`. Encoding our own in-memory types cannot fail except on a size overflow,
/// which the limits on input make impossible; the error is still returned, never unwrapped.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .with_little_endian()
        .serialize(value)
}

/// Decodes `bytes` with the default limit.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    decode_limited(bytes, DEFAULT_DECODE_LIMIT)
}

/// Decodes `bytes`, refusing anything that would allocate more than `limit` bytes.
pub fn decode_limited<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, bincode::Error> {
    options(limit).deserialize(bytes)
}

/// Encodes `value` behind a leading format byte `version`.
pub fn encode_versioned<T: Serialize + ?Sized>(
    version: u8,
    value: &T,
) -> Result<Vec<u8>, bincode::Error> {
    let body = encode(value)?;
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(version);
    out.extend(body);
    Ok(out)
}

/// Decodes a value written by [`encode_versioned`] with format byte `version`; any other
/// format byte is an error that names it.
pub fn decode_versioned<T: DeserializeOwned>(version: u8, bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&v, rest)) if v == version => decode(rest).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("unknown format version {v}")),
        None => Err("empty value".into()),
    }
}

/// Lowercase hex digits of `bytes` (token hashes; stored bytes held as text by tests).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from hex digits, for tests that hold stored bytes as text.
#[cfg(test)]
pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length {}", s.len());
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let v: (u64, String, Vec<u8>) = (7, "x".into(), vec![1, 2, 3]);
        let bytes = encode(&v).unwrap();
        let back: (u64, String, Vec<u8>) = decode(&bytes).unwrap();
        assert_eq!(back, v);
    }

    /// `StoredRecord` and `NewRecord` as they were before their values were encoded as bytes:
    /// what is on disk and in logs from then on must read back the same.
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct PlainRecord {
        timestamp_ms: u64,
        key: Option<String>,
        headers: Vec<(String, String)>,
        value: Vec<u8>,
    }

    #[test]
    fn record_values_as_bytes_keep_the_old_encoding() {
        use crate::state::{NewRecord, StoredRecord};
        // Around the varint length boundaries, and large.
        for len in [0usize, 1, 250, 251, 252, 65_535, 65_536, 70_000] {
            let value: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let plain = PlainRecord {
                timestamp_ms: 1_700_000_000_123,
                key: Some("k".into()),
                headers: vec![("h".into(), "v".into())],
                value: value.clone(),
            };
            let stored = StoredRecord {
                timestamp_ms: plain.timestamp_ms,
                key: plain.key.clone(),
                headers: plain.headers.clone(),
                value: value.clone(),
            };
            let old = encode(&plain).unwrap();
            assert_eq!(encode(&stored).unwrap(), old, "value of {len} bytes");
            assert_eq!(decode::<StoredRecord>(&old).unwrap(), stored);
            assert_eq!(
                decode::<PlainRecord>(&encode(&stored).unwrap()).unwrap(),
                plain
            );
            let new = NewRecord {
                key: None,
                headers: vec![],
                value: value.clone(),
            };
            let plain_new = (None::<String>, Vec::<(String, String)>::new(), value);
            assert_eq!(encode(&new).unwrap(), encode(&plain_new).unwrap());
        }
        // A value claiming more bytes than the limit is refused, not allocated.
        let mut bomb = encode(&(0u64, None::<String>, Vec::<(String, String)>::new())).unwrap();
        bomb.extend(encode(&(1u64 << 60)).unwrap());
        assert!(decode_limited::<StoredRecord>(&bomb, 1 << 20).is_err());
    }

    #[test]
    fn garbage_and_bombs_are_errors_not_panics() {
        // A length prefix claiming 2^60 bytes must be refused by the limit, not allocated.
        let mut bomb = encode(&u64::MAX).unwrap();
        bomb.truncate(9);
        assert!(decode_limited::<Vec<u8>>(&bomb, 1024).is_err());
        assert!(decode::<(u64, String)>(&[0xff, 0xfe, 0x00]).is_err());
        assert!(decode::<u64>(&[]).is_err());
        // Trailing bytes are corruption, not padding.
        let mut long = encode(&5u64).unwrap();
        long.push(0);
        assert!(decode::<u64>(&long).is_err());
    }
}
