//! Micro-benchmarks of the state machine's apply, per command family, of the codec that
//! writes log entries and records, and of the JSON a leader reads and writes for clients that
//! do not send record batches (`json/`: binary values, so base64).
//!
//!     cargo bench --bench state              (all)
//!     cargo bench --bench state -- apply/    (one group)
//!
//! Every figure is for one Raft entry as the proposer builds it under load: 64 client commands
//! of one 1 KiB record each, or one command carrying 64 records, or 64 receipts.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use raftq::codec;
use raftq::state::{
    apply_entry, Batch, Command, CreateSub, CreateTopic, LogPayload, NewRecord, NothingStored,
    Outcome, ProducerSeq, Publish, PublishBatch, Pull, ReceiptAction, SetCursor, SettleReceipts,
    SmState, Start, StoredRecord, SubRef, SubSettings, TopicSettings,
};

const TOPIC: &str = "bench";
const SUB: &str = "workers";
const RECORDS: usize = 64;

fn record(i: usize) -> NewRecord {
    let mut value = vec![0u8; 1024];
    for (j, b) in value.iter_mut().enumerate() {
        *b = (i * 31 + j * 7) as u8;
    }
    NewRecord {
        key: None,
        headers: vec![],
        value,
    }
}

fn publish(records: Vec<NewRecord>, producer: Option<ProducerSeq>) -> Command {
    Command::Publish(Publish {
        topic: TOPIC.to_string(),
        records,
        producer,
    })
}

/// One batch publish of 64 records, as the leader proposes what an SDK sends.
fn batch_publish() -> Command {
    let records: Vec<NewRecord> = (0..RECORDS).map(record).collect();
    Command::PublishBatch(PublishBatch {
        topic: TOPIC.to_string(),
        batches: raftq::state::encode_records(&records).into(),
        producer: None,
    })
}

fn batch(commands: Vec<Command>) -> Batch {
    Batch {
        timestamp_ms: 1_700_000_000_000,
        commands,
    }
}

/// 64 publish commands of one record each.
fn publishes() -> Batch {
    batch(
        (0..RECORDS)
            .map(|i| publish(vec![record(i)], None))
            .collect(),
    )
}

fn sub_ref() -> SubRef {
    SubRef {
        topic: TOPIC.to_string(),
        name: SUB.to_string(),
    }
}

/// Applies `batch` at `index`; panics on a refused command, so a broken setup cannot pass
/// for a fast apply.
fn apply(state: &mut SmState, index: u64, batch: &Batch) -> Vec<Outcome> {
    let mut writes = Vec::new();
    let response = apply_entry(state, &NothingStored, index, batch, &mut writes)
        .expect("no record read fails");
    response
        .results
        .into_iter()
        .map(|r| r.expect("command refused"))
        .collect()
}

/// A topic with a subscription and `records` records.
fn topic_state(records: usize) -> SmState {
    let mut state = SmState::default();
    let setup = batch(vec![
        Command::CreateTopic(CreateTopic {
            name: TOPIC.to_string(),
            settings: TopicSettings::default(),
        }),
        Command::CreateSubscription(CreateSub {
            topic: TOPIC.to_string(),
            name: SUB.to_string(),
            settings: SubSettings {
                start: Start::First,
                ack_timeout_ms: 30_000,
                max_deliveries: None,
                dead_letter_topic: None,
            },
        }),
    ]);
    apply(&mut state, 1, &setup);
    let all: Vec<usize> = (0..records).collect();
    for (index, chunk) in (2..).zip(all.chunks(1_000)) {
        let records = chunk.iter().map(|&i| record(i)).collect();
        apply(&mut state, index, &batch(vec![publish(records, None)]));
    }
    state
}

/// Measures applying `entry` at `index` to a fresh copy of `state` (the copy is not timed).
fn apply_on(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    state: &SmState,
    index: u64,
    entry: &Batch,
) {
    group.bench_function(name, |b| {
        b.iter_batched_ref(
            || state.clone(),
            |s| apply(s, index, black_box(entry)),
            BatchSize::SmallInput,
        )
    });
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(RECORDS as u64));

    let state = topic_state(0);
    let entry = publishes();
    apply_on(
        &mut group,
        "publish_64_commands_of_1_record",
        &state,
        10,
        &entry,
    );

    let entry = batch(vec![publish((0..RECORDS).map(record).collect(), None)]);
    apply_on(
        &mut group,
        "publish_1_command_of_64_records",
        &state,
        10,
        &entry,
    );

    let entry = batch(vec![batch_publish()]);
    apply_on(
        &mut group,
        "publish_batch_1_command_of_64_records",
        &state,
        10,
        &entry,
    );

    let entry = batch(
        (0..RECORDS)
            .map(|i| {
                publish(
                    vec![record(i)],
                    Some(ProducerSeq {
                        producer_id: format!("p{}", i % 8),
                        sequence: (i / 8) as u64,
                    }),
                )
            })
            .collect(),
    );
    apply_on(
        &mut group,
        "publish_idempotent_64_commands",
        &state,
        10,
        &entry,
    );

    let filled = topic_state(10_000);
    let pull = batch(vec![Command::Pull(Pull {
        sub: sub_ref(),
        max: RECORDS as u32,
        ack_timeout_ms: None,
    })]);
    apply_on(&mut group, "pull_64", &filled, 100, &pull);

    let mut leased = filled.clone();
    let receipts = match apply(&mut leased, 100, &pull).pop() {
        Some(Outcome::Pulled(deliveries)) => deliveries.into_iter().map(|d| d.receipt).collect(),
        other => panic!("pull answered {other:?}"),
    };
    let ack = batch(vec![Command::SettleReceipts(SettleReceipts {
        sub: sub_ref(),
        action: ReceiptAction::Ack,
        receipts,
    })]);
    apply_on(&mut group, "ack_64", &leased, 101, &ack);

    let cursor = batch(vec![Command::SetCursor(SetCursor {
        sub: sub_ref(),
        offset: 5_000,
        allow_backward: false,
        forward_only: false,
    })]);
    group.throughput(Throughput::Elements(1));
    apply_on(&mut group, "set_cursor", &filled, 100, &cursor);

    let create = batch(vec![Command::CreateTopic(CreateTopic {
        name: "another".to_string(),
        settings: TopicSettings::default(),
    })]);
    apply_on(&mut group, "create_topic", &filled, 100, &create);
    group.finish();
}

fn bench_codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    let payload = LogPayload::V1(publishes());
    let encoded = codec::encode(&payload).expect("encode");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("encode_entry_64_records", |b| {
        b.iter(|| codec::encode(black_box(&payload)).expect("encode"))
    });
    group.bench_function("decode_entry_64_records", |b| {
        b.iter(|| codec::decode::<LogPayload>(black_box(&encoded)).expect("decode"))
    });

    let payload = LogPayload::V1(batch(vec![batch_publish()]));
    let encoded = codec::encode(&payload).expect("encode");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("encode_entry_batch_of_64_records", |b| {
        b.iter(|| codec::encode(black_box(&payload)).expect("encode"))
    });
    group.bench_function("decode_entry_batch_of_64_records", |b| {
        b.iter(|| codec::decode::<LogPayload>(black_box(&encoded)).expect("decode"))
    });

    let stored = StoredRecord {
        timestamp_ms: 1_700_000_000_000,
        key: Some("key-1".to_string()),
        headers: vec![("trace".to_string(), "abc".to_string())],
        value: record(1).value,
    };
    let encoded = codec::encode(&stored).expect("encode");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("encode_record_1k", |b| {
        b.iter(|| codec::encode(black_box(&stored)).expect("encode"))
    });
    group.bench_function("decode_record_1k", |b| {
        b.iter(|| codec::decode::<StoredRecord>(black_box(&encoded)).expect("decode"))
    });
    group.finish();
}

/// A publish of 64 binary 1 KiB values as a JSON client sends it, parsed as the leader parses
/// it; and a pull of 64 binary values answered in JSON, as the leader writes it.
fn bench_json(c: &mut Criterion) {
    use raftq_client::api::{Message, PublishRequest, PullResponse, RecordIn};
    let binary =
        |i: usize| -> Vec<u8> { (0..1024).map(|j| (i * 31 + j * 7) as u8 | 0x80).collect() };
    assert!((0..RECORDS).all(|i| std::str::from_utf8(&binary(i)).is_err()));
    let mut group = c.benchmark_group("json");
    let request = PublishRequest {
        records: (0..RECORDS).map(|i| RecordIn::binary(&binary(i))).collect(),
        producer_id: None,
        sequence: None,
    };
    let body = serde_json::to_vec(&request).expect("encode");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("parse_publish_64_binary_1k", |b| {
        b.iter(|| serde_json::from_slice::<PublishRequest>(black_box(&body)).expect("parse"))
    });
    let pull = PullResponse {
        messages: (0..RECORDS)
            .map(|i| Message {
                receipt: format!("r.{i}.0123456789abcdef"),
                offset: i as u64,
                delivery_count: 1,
                lease_expires_ms: 1_700_000_030_000,
                timestamp_ms: 1_700_000_000_000,
                key: None,
                headers: Default::default(),
                value: binary(i).into(),
            })
            .collect(),
    };
    let written = pull.to_json().expect("write");
    group.throughput(Throughput::Bytes(written.len() as u64));
    group.bench_function("write_pull_64_binary_1k", |b| {
        b.iter(|| black_box(&pull).to_json().expect("write"))
    });
    group.finish();
}

criterion_group!(benches, bench_apply, bench_codec, bench_json);
criterion_main!(benches);
