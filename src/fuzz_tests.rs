//! Fuzz targets for every decoder of bytes that come from outside the process: Raft RPC bodies
//! (and the answers peers send back), the snapshot transfer's header and file, what is read
//! back from disk (log entries, records, state machine metadata), and client request bodies,
//! query strings, receipts and paths.
//!
//! Each target feeds arbitrary bytes, and valid encodings with bytes flipped, cut short or
//! grown, to the decoder, which must answer `Ok` or `Err` and never panic, hang or allocate
//! without bound. Property-based (proptest): `cargo test` runs a bounded number of cases per
//! target (`RAFTQ_FUZZ_CASES`, default 256); `scripts/fuzz.sh` runs many more.

use proptest::prelude::*;

use crate::codec;
use crate::raft::{Entry, LogId, TypeConfig, Vote};
use crate::state::{Batch, Command, LogPayload, NewRecord, ProducerSeq, Publish, StoredRecord};

fn cases() -> u32 {
    std::env::var("RAFTQ_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Failures are shrunk and reported; no regression files are written into the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Arbitrary bytes.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..2048)
}

/// A valid encoding with some bytes replaced, then cut at or grown past its end.
fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    (
        proptest::collection::vec((0..len, any::<u8>()), 0..8),
        0..len + 16,
        any::<u8>(),
    )
        .prop_map(move |(flips, cut, fill)| {
            let mut out = valid.clone();
            for (i, b) in flips {
                if let Some(slot) = out.get_mut(i) {
                    *slot = b;
                }
            }
            out.resize(cut, fill);
            out
        })
}

fn log_id(index: u64) -> LogId {
    use openraft::vote::RaftLeaderId;
    LogId::new(openraft::impls::leader_id_adv::LeaderId::new(3, 1), index)
}

fn sample_entry() -> Entry {
    Entry {
        log_id: log_id(9),
        payload: openraft::EntryPayload::Normal(LogPayload::V1(Batch {
            timestamp_ms: 1_764_480_000_000,
            commands: vec![Command::Publish(Publish {
                topic: "orders".into(),
                records: vec![NewRecord {
                    key: Some("k".into()),
                    headers: vec![("h".into(), "v".into())],
                    value: b"hello".to_vec(),
                }],
                producer: Some(ProducerSeq {
                    producer_id: "p-1".into(),
                    sequence: 4,
                }),
            })],
        })),
    }
}

fn sample_append() -> Vec<u8> {
    let req = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(8)),
        entries: vec![sample_entry(), sample_entry()],
        leader_commit: Some(log_id(8)),
    };
    codec::encode(&req).expect("encode an append request")
}

/// Every Raft RPC body a node decodes, as the server and as the client of its peers.
fn decode_raft_bodies(b: &[u8]) {
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
    let limit = 1 << 20;
    let _ = codec::decode_limited::<AppendEntriesRequest<TypeConfig>>(b, limit);
    let _ = codec::decode_limited::<VoteRequest<TypeConfig>>(b, limit);
    let _ = codec::decode_limited::<Result<AppendEntriesResponse<TypeConfig>, String>>(b, limit);
    let _ = codec::decode_limited::<Result<VoteResponse<TypeConfig>, String>>(b, limit);
}

/// Two append requests as the streamed appends frame them.
fn sample_append_stream() -> Vec<u8> {
    use crate::raft::stream::frame;
    let req: openraft::raft::AppendEntriesRequest<TypeConfig> =
        codec::decode(&sample_append()).expect("the sample decodes");
    let mut out = frame(&req).expect("frame").to_vec();
    out.extend_from_slice(&frame(&req).expect("frame"));
    out
}

/// The streamed appends' frames, of requests (as a follower reads them) and of answers (as the
/// leader reads them), the bytes arriving whole or in two chunks.
fn decode_append_stream(b: &[u8]) {
    use crate::raft::stream::{Answer, Frames};
    use openraft::raft::AppendEntriesRequest;
    for cut in [0, b.len() / 2] {
        let mut requests = Frames::new(1 << 20);
        let mut answers = Frames::new(1 << 20);
        for chunk in [&b[..cut], &b[cut..]] {
            requests.push(chunk);
            answers.push(chunk);
            while let Ok(Some(_)) = requests.take::<AppendEntriesRequest<TypeConfig>>() {}
            while let Ok(Some(_)) = answers.take::<Answer>() {}
        }
    }
}

fn sample_snapshot() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = crate::store::open_db_with(&dir.path().join("db"), 1 << 20).expect("open RocksDB");
    let cf = db.cf_handle(crate::store::CF_SM).expect("the sm family");
    for i in 0..5u64 {
        db.put_cf(cf, crate::store::keys::record(1, i), sample_record())
            .expect("a write");
    }
    let snaps = dir.path().join("snapshots");
    let (_, path, _) = crate::store::snapshot::build(&db, &snaps, 1).expect("build a snapshot");
    std::fs::read(path).expect("read the snapshot file")
}

fn read_snapshot(b: &[u8]) {
    let mut pairs = 0u64;
    let _ = crate::store::snapshot::read(b, |_, _| {
        pairs += 1;
        Ok(())
    });
}

fn sample_snapshot_header() -> Vec<u8> {
    use crate::raft::network::SnapshotHeader;
    let meta = crate::raft::SnapshotMeta {
        last_log_id: Some(log_id(9)),
        last_membership: Default::default(),
    };
    let header = SnapshotHeader {
        vote: Vote::new_committed(3, 1),
        meta,
    };
    let mut framed = header.frame().expect("frame a header");
    framed.extend_from_slice(b"the snapshot file follows");
    framed
}

fn parse_snapshot_header(b: &[u8]) {
    use crate::raft::network::SnapshotHeader;
    // Byte by byte, as a stream may deliver it: every prefix is "more", done or an error.
    for end in [0, 7, 8, b.len() / 2, b.len()] {
        if let Ok(Some((_, used))) = SnapshotHeader::parse_frame(&b[..end.min(b.len())], 1 << 20) {
            assert!(used <= end, "the header claims bytes it was not given");
        }
    }
}

fn sample_record() -> Vec<u8> {
    crate::store::records::encode_record(&StoredRecord {
        timestamp_ms: 7,
        key: Some("k".into()),
        headers: vec![("a".into(), "b".into())],
        value: vec![1, 2, 3],
    })
    .expect("encode a record")
}

fn sample_log_entry() -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend(codec::encode(&sample_entry()).expect("encode an entry"));
    out
}

/// Everything read back from the `log`, `raft` and `sm` column families.
fn decode_disk(b: &[u8]) {
    use crate::state::{ProducerState, SubState, TopicMeta};
    use crate::store::values::META_FORMAT;
    let _ = crate::store::log::decode_entry(b);
    let _ = crate::store::records::decode(b);
    let _ = codec::decode_versioned::<TopicMeta>(META_FORMAT, b);
    let _ = codec::decode_versioned::<SubState>(META_FORMAT, b);
    let mut subs = crate::store::subs::Assembler::default();
    let _ = subs.push(&crate::store::keys::sub(1), b);
    let _ = subs.push(&crate::store::subs::lease_key(1, 2), b);
    let _ = subs.push(&crate::store::subs::pending_key(1, 3), b);
    let _ = subs.push(&crate::store::subs::lease_block_key(1, 64), b);
    let _ = subs.push(&crate::store::subs::pending_block_key(1, 128), b);
    let _ = codec::decode_versioned::<ProducerState>(META_FORMAT, b);
    let _ = codec::decode::<Option<Vote>>(b);
    let _ = codec::decode::<Option<LogId>>(b);
    let _ = codec::decode::<crate::raft::StoredMembership>(b);
}

/// Client request bodies, query strings, receipts and paths, through our own validation.
fn decode_client_input(b: &[u8]) {
    use raftq_client::api::{
        AckRequest, BroadcastRequest, CursorRequest, NackRequest, PublishRequest, PullRequest,
        SubscriptionConfig, TopicConfig,
    };
    if let Ok(p) = serde_json::from_slice::<PublishRequest>(b) {
        for r in p.records {
            let _ = crate::api::records::convert("fuzz", r);
        }
    }
    if let Ok(c) = crate::api::subscriptions::parse_optional::<SubscriptionConfig>(b) {
        let _ = crate::api::subscriptions::settings_from_api(&c);
    }
    let _ = crate::api::subscriptions::parse_optional::<PullRequest>(b);
    let _ = serde_json::from_slice::<TopicConfig>(b);
    let _ = serde_json::from_slice::<BroadcastRequest>(b);
    let _ = serde_json::from_slice::<CursorRequest>(b);
    let _ = serde_json::from_slice::<NackRequest>(b);
    if let Ok(a) = serde_json::from_slice::<AckRequest>(b) {
        let _ = crate::api::subscriptions::parse_receipts(&a.receipts);
    }
    let _ = crate::api::records::check_batches(b);
    let text = String::from_utf8_lossy(b).into_owned();
    let _ = crate::api::records::read_params(&Some(text.clone()));
    let _ = crate::state::Receipt::parse(&text);
    let tokens = crate::tokens::Tokens::parse(
        &format!(
            "[[token]]\nname = \"t\"\nsha256 = \"{}\"\ngrants = [\"publish:a*\"]\n",
            crate::tokens::token_hash_hex("t")
        ),
        "cluster-secret-0123",
    )
    .expect("a tokens file");
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        axum::http::HeaderValue::from_static("Bearer t"),
    );
    let path = format!("/v1/topics/{text}/records");
    for route in [
        "/v1/topics/{topic}/records",
        "/v1/topics/{topic}",
        "/v1/cluster/nodes/{id}",
    ] {
        let _ = crate::api::auth::authorize(
            &tokens,
            "cluster-secret-0123",
            &axum::http::Method::POST,
            Some(route),
            &path,
            &headers,
        );
    }
    let _ = crate::tokens::Tokens::parse(&text, "cluster-secret-0123");
}

/// A record batch publish body: two records with a key, headers and a binary value.
fn sample_record_batch() -> Vec<u8> {
    use raftq_client::batch::{encode, BatchHeader, RecordRef};
    let headers = [("h", Some(&b"v"[..]))];
    let records = [
        RecordRef {
            timestamp_delta: 0,
            key: Some(b"k"),
            value: Some(&[0, 1, 0xff]),
            headers: &headers,
        },
        RecordRef {
            timestamp_delta: 5,
            key: None,
            value: Some(b"text"),
            headers: &[],
        },
    ];
    let header = BatchHeader::unstamped(records.len());
    let mut out = Vec::new();
    encode(&header, &records, &mut out);
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_record_batch_publish_mutated(b in mutated(sample_record_batch())) {
        decode_client_input(&b);
    }

    #[test]
    fn fuzz_raft_rpc_bodies(b in bytes()) {
        decode_raft_bodies(&b);
    }

    #[test]
    fn fuzz_raft_rpc_bodies_mutated(b in mutated(sample_append())) {
        decode_raft_bodies(&b);
    }

    #[test]
    fn fuzz_append_stream(b in bytes()) {
        decode_append_stream(&b);
    }

    #[test]
    fn fuzz_append_stream_mutated(b in mutated(sample_append_stream())) {
        decode_append_stream(&b);
    }

    #[test]
    fn fuzz_snapshot_header(b in bytes()) {
        parse_snapshot_header(&b);
    }

    #[test]
    fn fuzz_snapshot_header_mutated(b in mutated(sample_snapshot_header())) {
        parse_snapshot_header(&b);
    }

    #[test]
    fn fuzz_snapshot_file(b in bytes()) {
        read_snapshot(&b);
    }

    #[test]
    fn fuzz_disk_values(b in bytes()) {
        decode_disk(&b);
    }

    #[test]
    fn fuzz_disk_values_mutated(
        b in prop_oneof![mutated(sample_record()), mutated(sample_log_entry())]
    ) {
        decode_disk(&b);
    }

    #[test]
    fn fuzz_client_input(b in bytes()) {
        decode_client_input(&b);
    }

    #[test]
    fn fuzz_client_input_json(
        v in proptest::collection::vec(
            prop_oneof![
                Just("{\"records\":[{\"value\":\"x\",\"headers\":{\"h\":\"v\"}}]}".to_string()),
                Just("{\"receipts\":[\"0.1.2\",\"9.9.9\"]}".to_string()),
                Just("{\"max\":5,\"wait_ms\":100}".to_string()),
                Just("{\"start\":\"first\",\"max_deliveries\":3}".to_string()),
                "[\\PC]{0,12}".prop_map(|s| s),
            ],
            1..4,
        )
    ) {
        decode_client_input(v.concat().as_bytes());
    }
}

/// The snapshot file target's mutations need a real snapshot, built once.
#[test]
fn fuzz_snapshot_file_mutated() {
    let valid = sample_snapshot();
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(&mutated(valid.clone()), |b| {
            read_snapshot(&b);
            Ok(())
        })
        .expect("no input panics the snapshot reader");
    // And the valid one reads back whole.
    let mut pairs = 0;
    crate::store::snapshot::read(&valid[..], |_, _| {
        pairs += 1;
        Ok(())
    })
    .expect("the valid snapshot reads");
    assert_eq!(pairs, 5);
}

/// A log in memory that writes the entries it is asked to link into segment files.
struct LinkedLog(Vec<Entry>);

impl crate::store::records::EntrySource for LinkedLog {
    fn entry(&self, index: u64) -> Result<Entry, String> {
        self.0
            .iter()
            .find(|e| e.log_id.index == index)
            .cloned()
            .ok_or_else(|| format!("no entry {index}"))
    }
}

impl crate::store::records::Entries for LinkedLog {
    fn keep_from(&self, _index: u64) {}

    fn link_segments(&self, first: u64, last: u64, into: &std::path::Path) -> Result<(), String> {
        let (mut log, _) = crate::store::segments::SegmentLog::open(into, 0, 1 << 20)
            .map_err(|e| e.to_string())?;
        for index in first..=last {
            let entry = crate::store::records::EntrySource::entry(self, index)?;
            let bytes = crate::store::log::encode_entry(&entry).map_err(|e| e.to_string())?;
            log.append(index, &bytes).map_err(|e| e.to_string())?;
        }
        log.sync().map_err(|e| e.to_string())
    }

    fn first_stored(&self) -> Option<u64> {
        self.0.first().map(|e| e.log_id.index)
    }
}

/// A linked transfer of a small state machine: a topic and two entries of published records.
fn sample_transfer() -> Vec<u8> {
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = crate::store::open_db_with(&dir.path().join("db"), 1 << 20).expect("open RocksDB");
    let sm = crate::store::SmShared::open(db, dir.path().join("snapshots")).expect("open");
    let entry = |index: u64, command: Command| Entry {
        log_id: log_id(index),
        payload: openraft::EntryPayload::Normal(LogPayload::V1(Batch {
            timestamp_ms: 1_764_480_000_000 + index,
            commands: vec![command],
        })),
    };
    let records: Vec<NewRecord> = (0..3)
        .map(|i| NewRecord {
            key: Some(format!("k{i}")),
            headers: vec![("h".into(), "v".into())],
            value: vec![i as u8; 40],
        })
        .collect();
    let publish = || {
        Command::PublishBatch(crate::state::PublishBatch {
            topic: "t".into(),
            batches: crate::state::encode_records(&records).into(),
            producer: None,
        })
    };
    let entries = vec![
        entry(
            1,
            Command::CreateTopic(crate::state::CreateTopic {
                name: "t".into(),
                settings: Default::default(),
            }),
        ),
        entry(2, publish()),
        entry(3, publish()),
    ];
    sm.attach_log(Arc::new(LinkedLog(entries.clone())));
    sm.apply_blocking(entries).expect("apply");
    let (_, path) = sm.build_blocking().expect("build a linked snapshot");
    let mut bytes = Vec::new();
    crate::store::transfer::write(&path, &mut bytes).expect("a linked transfer");
    bytes
}

/// The linked transfer's check, on bytes as a follower received them.
fn verify_transfer(dir: &std::path::Path, b: &[u8]) -> bool {
    let path = dir.join("received");
    std::fs::write(&path, b).expect("write the received bytes");
    crate::store::transfer::verify_received(&path).is_ok()
}

/// A received snapshot in either form, arbitrary or a valid linked transfer mutated, is
/// checked without a panic; the valid one passes.
#[test]
fn fuzz_linked_transfer() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let valid = sample_transfer();
    assert!(
        verify_transfer(dir.path(), &valid),
        "the valid transfer checks"
    );
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(&mutated(valid), |b| {
            verify_transfer(dir.path(), &b);
            Ok(())
        })
        .expect("no mutated transfer panics the check");
    runner
        .run(&bytes(), |b| {
            let mut framed = crate::store::transfer::MAGIC.to_vec();
            framed.extend_from_slice(&b);
            verify_transfer(dir.path(), &framed);
            Ok(())
        })
        .expect("no arbitrary transfer panics the check");
}
