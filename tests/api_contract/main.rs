//! The HTTP contract of API.md against a real three-node cluster: topics, publish and read,
//! leader redirects, long-polls, refusals of bad input, Raft endpoint authentication, cluster
//! status, and the data directory guards. One cluster per test.
//!
//! # Layout
//! - `topics`: topics, publish and read, long-polls.
//! - `leadership`: redirects to the leader, and a leader without a quorum.
//! - `bad_input`: refusals of bad input.
//! - `raft_endpoints`: the node-to-node endpoints and what they refuse.
//! - `status`: cluster status, health and readiness.
//! - `data_dir`: the data directory guards at start-up.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod data_dir;
mod leadership;
mod raft_endpoints;
mod status;
mod topics;

use raftq_client::api::ReadResponse;
use serde_json::{json, Value};

const OCTET_STREAM: &str = "application/octet-stream";

/// One record of a [`record_batch`]: key, value, headers.
type BatchRecord<'a> = (
    Option<&'a [u8]>,
    Option<&'a [u8]>,
    Vec<(&'a str, Option<&'a [u8]>)>,
);

/// A Kafka record batch (the body of a record batch publish) of `records`.
fn record_batch(records: &[BatchRecord<'_>]) -> Vec<u8> {
    use raftq_client::batch::{encode, BatchHeader, RecordRef};
    let refs: Vec<RecordRef<'_>> = records
        .iter()
        .map(|(key, value, headers)| RecordRef {
            timestamp_delta: 0,
            key: *key,
            value: *value,
            headers,
        })
        .collect();
    let header = BatchHeader::unstamped(refs.len());
    let mut out = Vec::new();
    encode(&header, &refs, &mut out);
    out
}

fn records_of<S: AsRef<str>>(values: &[S]) -> Value {
    json!({ "records": values.iter().map(|v| json!({ "value": v.as_ref() })).collect::<Vec<_>>() })
}

fn values(page: &ReadResponse) -> Vec<String> {
    page.records
        .iter()
        .map(|r| {
            r.value_str()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("<binary {:?}>", r.value))
        })
        .collect()
}
