//! The binary form of a read's and a pull's answer (`application/vnd.raftq.records`): the
//! records as Kafka record batches, their values as bytes, with no JSON string or base64 per
//! record.
//!
//! ```text
//! head length   u32, big-endian
//! head          that many bytes of JSON: the JSON answer without its records' contents
//!               (a read: next_offset, high_watermark, skipped; a pull: each message's
//!               receipt, offset, delivery_count and lease_expires_ms)
//! batches       the records, in the answer's order, as Kafka record batches (magic 2,
//!               uncompressed, timestamp type LogAppendTime): each record at its offset,
//!               stamped with its timestamp_ms; one batch per run of consecutive offsets
//! ```
//!
//! Keys and header values are UTF-8 text, as in JSON. [`encode_read`] and [`encode_pull`]
//! write it (the server), [`decode_read`] and [`decode_pull`] read it (the SDK), taking the
//! values as slices of the body, not copies.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{Message, ReadResponse, Record};
use crate::batch;

/// `Accept` and `Content-Type` of the binary form.
pub const RECORDS_CONTENT_TYPE: &str = "application/vnd.raftq.records";

/// Most bytes the JSON head of an answer may take, read back.
const MAX_HEAD_BYTES: usize = 16 << 20;

/// What a read's head holds.
#[derive(Serialize, Deserialize)]
struct ReadHead {
    next_offset: u64,
    high_watermark: u64,
    skipped: u64,
}

/// What a pull's head holds of each message.
#[derive(Serialize, Deserialize)]
struct MessageHead<'a> {
    #[serde(borrow)]
    receipt: std::borrow::Cow<'a, str>,
    offset: u64,
    delivery_count: u32,
    lease_expires_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct PullHead<'a> {
    #[serde(borrow)]
    messages: Vec<MessageHead<'a>>,
}

/// A record's contents, as the batches carry them.
struct Contents<'a> {
    offset: u64,
    timestamp_ms: u64,
    key: Option<&'a str>,
    headers: &'a BTreeMap<String, String>,
    value: &'a [u8],
}

/// `head` framed, then `records` as batches of consecutive offsets.
fn encode(head: &impl Serialize, records: &[Contents<'_>]) -> Result<Vec<u8>, String> {
    let head = serde_json::to_vec(head).map_err(|e| e.to_string())?;
    let head_len = u32::try_from(head.len()).map_err(|_| "the answer's head is too long")?;
    let size: usize = records.iter().map(|r| r.value.len() + 32).sum();
    let mut out = Vec::with_capacity(4 + head.len() + size + batch::HEADER_BYTES);
    out.extend_from_slice(&head_len.to_be_bytes());
    out.extend_from_slice(&head);
    let mut rest = records;
    while let Some(first) = rest.first() {
        let run = 1 + rest
            .windows(2)
            .take_while(|w| w[0].offset.checked_add(1) == Some(w[1].offset))
            .count();
        let (group, tail) = rest.split_at(run);
        rest = tail;
        let headers: Vec<batch::HeaderRefs<'_>> = group
            .iter()
            .map(|r| batch::text_headers(r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
            .collect();
        let base_timestamp = first.timestamp_ms as i64;
        let refs: Vec<batch::RecordRef<'_>> = group
            .iter()
            .zip(&headers)
            .map(|(r, headers)| batch::RecordRef {
                timestamp_delta: (r.timestamp_ms as i64).wrapping_sub(base_timestamp),
                key: r.key.map(str::as_bytes),
                value: Some(r.value),
                headers,
            })
            .collect();
        let max_timestamp = group.iter().map(|r| r.timestamp_ms).max().unwrap_or(0) as i64;
        let header = batch::BatchHeader {
            base_offset: first.offset as i64,
            attributes: batch::TIMESTAMP_TYPE_BIT,
            base_timestamp,
            max_timestamp,
            ..batch::BatchHeader::unstamped(group.len())
        };
        batch::encode(&header, &refs, &mut out);
    }
    Ok(out)
}

/// A read's answer in the binary form.
pub fn encode_read(answer: &ReadResponse) -> Result<Vec<u8>, String> {
    let head = ReadHead {
        next_offset: answer.next_offset,
        high_watermark: answer.high_watermark,
        skipped: answer.skipped,
    };
    let records: Vec<Contents<'_>> = answer
        .records
        .iter()
        .map(|r| Contents {
            offset: r.offset,
            timestamp_ms: r.timestamp_ms,
            key: r.key.as_deref(),
            headers: &r.headers,
            value: &r.value,
        })
        .collect();
    encode(&head, &records)
}

/// A pull's answer (its messages) in the binary form.
pub fn encode_pull(messages: &[Message]) -> Result<Vec<u8>, String> {
    let head = PullHead {
        messages: messages
            .iter()
            .map(|m| MessageHead {
                receipt: m.receipt.as_str().into(),
                offset: m.offset,
                delivery_count: m.delivery_count,
                lease_expires_ms: m.lease_expires_ms,
            })
            .collect(),
    };
    let records: Vec<Contents<'_>> = messages
        .iter()
        .map(|m| Contents {
            offset: m.offset,
            timestamp_ms: m.timestamp_ms,
            key: m.key.as_deref(),
            headers: &m.headers,
            value: &m.value,
        })
        .collect();
    encode(&head, &records)
}

/// A record of the batches, owned but for its value, a slice of the body.
struct Decoded {
    offset: u64,
    timestamp_ms: u64,
    key: Option<String>,
    headers: BTreeMap<String, String>,
    value: Bytes,
}

/// The head's bytes and the records of the batches after it.
fn decode(body: &Bytes) -> Result<(&[u8], Vec<Decoded>), String> {
    let len = body
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or("the answer is shorter than its head's length")? as usize;
    if len > MAX_HEAD_BYTES {
        return Err(format!(
            "the answer's head is {len} bytes, more than it may be"
        ));
    }
    let head = body
        .get(4..4 + len)
        .ok_or_else(|| format!("the answer ends inside its head of {len} bytes"))?;
    let batches = &body[4 + len..];
    if batches.is_empty() {
        return Ok((head, vec![]));
    }
    let limits = batch::Limits {
        max_records: usize::MAX,
        max_headers_per_record: usize::MAX,
    };
    let decoded = batch::decode_all(batches, &limits).map_err(|e| e.to_string())?;
    let text = |bytes: &[u8], what: &str| {
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("a record's {what} is not UTF-8"))
    };
    let mut records = Vec::new();
    for b in &decoded {
        for r in &b.records {
            let value = r.value.ok_or("a record has a null value")?;
            let mut headers = BTreeMap::new();
            for h in &r.headers {
                let v = h.value.ok_or("a record has a null header value")?;
                headers.insert(h.key.to_string(), text(v, "header value")?);
            }
            records.push(Decoded {
                offset: (b.header.base_offset as u64).wrapping_add(r.offset_delta as u64),
                timestamp_ms: b.header.base_timestamp.wrapping_add(r.timestamp_delta) as u64,
                key: r.key.map(|k| text(k, "key")).transpose()?,
                headers,
                value: body.slice_ref(value),
            });
        }
    }
    Ok((head, records))
}

/// A read's answer from the binary form.
pub fn decode_read(body: &Bytes) -> Result<ReadResponse, String> {
    let (head, records) = decode(body)?;
    let head: ReadHead = serde_json::from_slice(head).map_err(|e| e.to_string())?;
    Ok(ReadResponse {
        records: records
            .into_iter()
            .map(|r| Record {
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key,
                headers: r.headers,
                value: r.value,
            })
            .collect(),
        next_offset: head.next_offset,
        high_watermark: head.high_watermark,
        skipped: head.skipped,
    })
}

/// A pull's messages from the binary form: the head's messages and the records, one each, in
/// the same order.
pub fn decode_pull(body: &Bytes) -> Result<Vec<Message>, String> {
    let (head, records) = decode(body)?;
    let head: PullHead<'_> = serde_json::from_slice(head).map_err(|e| e.to_string())?;
    if head.messages.len() != records.len() {
        return Err(format!(
            "the answer names {} messages but holds {} records",
            head.messages.len(),
            records.len()
        ));
    }
    head.messages
        .into_iter()
        .zip(records)
        .map(|(m, r)| {
            if m.offset != r.offset {
                return Err(format!(
                    "message {} names offset {} but its record has offset {}",
                    m.receipt, m.offset, r.offset
                ));
            }
            Ok(Message {
                receipt: m.receipt.into_owned(),
                offset: m.offset,
                delivery_count: m.delivery_count,
                lease_expires_ms: m.lease_expires_ms,
                timestamp_ms: r.timestamp_ms,
                key: r.key,
                headers: r.headers,
                value: r.value,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: u64, value: &[u8]) -> Record {
        Record {
            offset,
            timestamp_ms: 1_700_000_000_000 + offset * 7,
            key: offset.is_multiple_of(2).then(|| format!("k{offset}")),
            headers: [("h".to_string(), format!("v{offset}"))].into(),
            value: Bytes::copy_from_slice(value),
        }
    }

    /// A read's answer goes through the binary form unchanged: binary and text values, gaps
    /// in the offsets (several batches), and no records at all.
    #[test]
    fn a_read_answer_round_trips() {
        for offsets in [vec![], vec![5], vec![3, 4, 5, 9, 10, 12]] {
            let mut records: Vec<Record> = offsets
                .iter()
                .map(|&o| record(o, &[0xff, o as u8, b'a']))
                .collect();
            if let Some(last) = records.last_mut() {
                last.value = Bytes::from_static(b"text");
            }
            let answer = ReadResponse {
                records,
                next_offset: 13,
                high_watermark: 20,
                skipped: 2,
            };
            let body = Bytes::from(encode_read(&answer).unwrap());
            assert_eq!(decode_read(&body).unwrap(), answer);
        }
    }

    /// A pull's messages go through the binary form unchanged, out of offset order too.
    #[test]
    fn a_pull_answer_round_trips() {
        let messages: Vec<Message> = [7u64, 8, 2, 9]
            .iter()
            .enumerate()
            .map(|(i, &o)| {
                let r = record(o, format!("value {o}").as_bytes());
                Message {
                    receipt: format!("1.{o}.{i}"),
                    offset: o,
                    delivery_count: i as u32 + 1,
                    lease_expires_ms: 99,
                    timestamp_ms: r.timestamp_ms,
                    key: r.key,
                    headers: r.headers,
                    value: r.value,
                }
            })
            .collect();
        let body = Bytes::from(encode_pull(&messages).unwrap());
        assert_eq!(decode_pull(&body).unwrap(), messages);
        assert_eq!(
            decode_pull(&Bytes::from(encode_pull(&[]).unwrap())).unwrap(),
            vec![]
        );
    }

    /// A body cut anywhere, or a head that does not match its records, is an error, never a
    /// panic or a wrong answer.
    #[test]
    fn a_damaged_answer_is_an_error() {
        let messages: Vec<Message> = (0..3)
            .map(|o| Message {
                receipt: format!("1.{o}.0"),
                offset: o,
                delivery_count: 1,
                lease_expires_ms: 1,
                timestamp_ms: 1,
                key: None,
                headers: BTreeMap::new(),
                value: Bytes::from_static(b"v"),
            })
            .collect();
        let body = encode_pull(&messages).unwrap();
        for n in 0..body.len() {
            let cut = Bytes::copy_from_slice(&body[..n]);
            assert!(decode_pull(&cut).is_err(), "cut at {n}");
        }
        let fewer = encode_pull(&messages[..2]).unwrap();
        let head_len = u32::from_be_bytes(fewer[..4].try_into().unwrap()) as usize;
        let mut mixed =
            body[..4 + u32::from_be_bytes(body[..4].try_into().unwrap()) as usize].to_vec();
        mixed.extend_from_slice(&fewer[4 + head_len..]);
        let err = decode_pull(&Bytes::from(mixed)).unwrap_err();
        assert!(
            err.contains("names 3 messages but holds 2 records"),
            "{err}"
        );
    }
}
