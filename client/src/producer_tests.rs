//! The [`Producer`] against a fake node that keeps the server's idempotency rules: per
//! producer the next expected sequence and the offsets of the last 64 batches; `sequence_gap`
//! (with `expected_sequence`) for a batch that skips ahead, the original offsets for a re-sent
//! one. A script decides, per publish request, to answer at once, late, never, after applying
//! or not, or to refuse. Tests wait for what they expect with a deadline (10 s), never for a
//! fixed time; the only fixed waits check that something does *not* happen.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{ErrorCode, PublishRequest, RecordIn};
use crate::producer::{Delivery, ProducerError, ProducerOptions, SendError};
use crate::spool::SPOOL_FILE;
use crate::{Client, Producer};

/// How long a test waits for something it expects.
const WAIT: Duration = Duration::from_secs(10);

/// A publish request as the fake node read it.
#[derive(Debug, Clone)]
struct Incoming {
    producer_id: Option<String>,
    seq: Option<u64>,
    values: Vec<String>,
}

/// What the fake node does with one publish request.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// Apply (the server's rules) and answer.
    Normal,
    /// Wait, then apply and answer.
    Delay(Duration),
    /// Apply now; answer once the gate opens.
    ApplyThenWaitGate,
    /// Apply nothing until the gate opens, then apply and answer.
    WaitGate,
    /// Apply, then never answer (the answer is lost).
    ApplyThenHang,
    /// Never answer, apply nothing.
    Hang,
    /// Answer this problem; apply nothing.
    Refuse(u16, &'static str),
}

type Script = Box<dyn Fn(&Incoming, usize) -> Plan + Send + Sync>;

/// What one producer id has done on the fake topic.
#[derive(Debug, Default)]
struct Known {
    expected: u64,
    /// (sequence, first offset, last offset) of the last 64 batches.
    recent: VecDeque<(u64, u64, u64)>,
}

#[derive(Default)]
struct Model {
    /// The topic's values, by offset.
    log: Vec<String>,
    producers: HashMap<String, Known>,
    /// Every publish request, in arrival order.
    seen: Vec<Incoming>,
}

impl Model {
    /// The server's rules: returns the status and body of the answer.
    fn apply(&mut self, request: &Incoming) -> (u16, Value) {
        let (Some(id), Some(seq)) = (&request.producer_id, request.seq) else {
            let first = self.log.len() as u64;
            self.log.extend(request.values.iter().cloned());
            return (200, published(first, self.log.len() as u64 - 1, false));
        };
        let known = self.producers.entry(id.clone()).or_default();
        if seq == known.expected {
            let first = self.log.len() as u64;
            self.log.extend(request.values.iter().cloned());
            let last = self.log.len() as u64 - 1;
            known.expected += 1;
            known.recent.push_back((seq, first, last));
            if known.recent.len() > 64 {
                known.recent.pop_front();
            }
            return (200, published(first, last, false));
        }
        if seq > known.expected {
            let mut body = problem_body(409, "sequence_gap");
            body["expected_sequence"] = json!(known.expected);
            return (409, body);
        }
        match known.recent.iter().find(|(s, _, _)| *s == seq) {
            Some((_, first, last)) => (200, published(*first, *last, true)),
            None => (409, problem_body(409, "already_exists")),
        }
    }
}

fn published(first: u64, last: u64, duplicate: bool) -> Value {
    json!({"first_offset": first, "last_offset": last, "duplicate": duplicate,
           "commit_point": {"index": 1, "timestamp_ms": 1}})
}

fn problem_body(status: u16, code: &str) -> Value {
    json!({"type": "about:blank", "title": code, "status": status, "detail": "scripted",
           "code": code})
}

/// A fake node serving one topic, `t`.
struct Fake {
    url: String,
    model: Arc<Mutex<Model>>,
    script: Arc<Mutex<Script>>,
    gate: watch::Sender<bool>,
}

impl Fake {
    async fn start(script: impl Fn(&Incoming, usize) -> Plan + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let model = Arc::new(Mutex::new(Model::default()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Box::new(script)));
        let (gate, _) = watch::channel(false);
        let fake = Fake {
            url,
            model,
            script,
            gate,
        };
        let (model, script, gate) = (
            fake.model.clone(),
            fake.script.clone(),
            fake.gate.subscribe(),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, model.clone(), script.clone(), gate.clone()));
            }
        });
        fake
    }

    fn set_script(&self, script: impl Fn(&Incoming, usize) -> Plan + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Box::new(script);
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    fn log(&self) -> Vec<String> {
        self.model.lock().unwrap().log.clone()
    }

    fn seen(&self) -> Vec<Incoming> {
        self.model.lock().unwrap().seen.clone()
    }

    /// The server forgets every producer (as after 7 idle days).
    fn forget_producers(&self) {
        self.model.lock().unwrap().producers.clear();
    }

    /// Waits until `check` holds for the model.
    async fn wait_for(&self, what: &str, check: impl Fn(&Model) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if check(&self.model.lock().unwrap()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; log {:?}, seen {:?}",
                self.log(),
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn client(&self) -> Client {
        Client::builder([self.url.as_str()])
            .deadline(Duration::from_secs(5))
            .request_timeout(Duration::from_secs(2))
            .build()
            .expect("client")
    }
}

async fn serve(
    stream: TcpStream,
    model: Arc<Mutex<Model>>,
    script: Arc<Mutex<Script>>,
    mut gate: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (read_half, mut write_half) = stream.into_split();
    let mut reader = BufReader::new(read_half);
    while let Some((method, target, body)) = read_request(&mut reader).await {
        let (path, request) = if method == "POST" {
            crate::client::sent_publish(&target, &body)
        } else {
            (target.clone(), PublishRequest::default())
        };
        let (status, answer) = if method == "POST" && path == "/v1/topics/t/records" {
            let incoming = Incoming {
                producer_id: request.producer_id,
                seq: request.sequence,
                values: request
                    .records
                    .iter()
                    .map(|r| r.value_str().unwrap_or_default().to_string())
                    .collect(),
            };
            let plan = {
                let mut model = model.lock().unwrap();
                model.seen.push(incoming.clone());
                let index = model.seen.len() - 1;
                (script.lock().unwrap())(&incoming, index)
            };
            let apply = |incoming: &Incoming| model.lock().unwrap().apply(incoming);
            match plan {
                Plan::Normal => apply(&incoming),
                Plan::Delay(pause) => {
                    tokio::time::sleep(pause).await;
                    apply(&incoming)
                }
                Plan::ApplyThenWaitGate => {
                    let answer = apply(&incoming);
                    let _ = gate.wait_for(|open| *open).await;
                    answer
                }
                Plan::WaitGate => {
                    let _ = gate.wait_for(|open| *open).await;
                    apply(&incoming)
                }
                Plan::ApplyThenHang => {
                    apply(&incoming);
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                Plan::Hang => std::future::pending().await,
                Plan::Refuse(status, code) => (status, problem_body(status, code)),
            }
        } else {
            (404, problem_body(404, "invalid_argument"))
        };
        let body = answer.to_string();
        let content_type = if status == 200 {
            "application/json"
        } else {
            "application/problem+json"
        };
        let reply = format!(
            "HTTP/1.1 {status} Scripted\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if write_half.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn read_request(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Option<(String, String, Vec<u8>)> {
    let request = crate::tests::read_request(reader).await?;
    Some((request.method, request.target, request.body))
}

/// Opens a producer on `fake` that sends every batch of `max_batch_records` at once and keeps
/// its spool in `dir`; returns it and its options (to reopen the spool).
async fn open_spooled(
    fake: &Fake,
    dir: &std::path::Path,
    max_batch_records: usize,
) -> (Producer, ProducerOptions) {
    let options = ProducerOptions::new()
        .max_batch_records(max_batch_records)
        .linger(Duration::ZERO)
        .spool(dir);
    let producer = Producer::open(fake.client(), "t", options.clone())
        .await
        .unwrap();
    (producer, options)
}

/// A script that applies and answers the first batch (sequence 0) and leaves every other one
/// hanging.
fn only_the_first_batch_answered(incoming: &Incoming, _: usize) -> Plan {
    match incoming.seq {
        Some(0) => Plan::Normal,
        _ => Plan::Hang,
    }
}

fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn records(values: &[String]) -> Vec<RecordIn> {
    values.iter().map(|v| RecordIn::text(v.clone())).collect()
}

/// Awaits a delivery, failing the test after [`WAIT`].
async fn outcome(delivery: Delivery) -> Result<u64, SendError> {
    tokio::time::timeout(WAIT, delivery)
        .await
        .expect("no outcome within the wait")
}

async fn offsets(deliveries: Vec<Delivery>) -> Vec<Result<u64, SendError>> {
    let mut all = Vec::new();
    for delivery in deliveries {
        all.push(outcome(delivery).await);
    }
    all
}

async fn flush(producer: &Producer) {
    tokio::time::timeout(WAIT, producer.flush())
        .await
        .expect("flush within the wait")
        .expect("flush");
}

/// Batch sizes and sequences of the requests the fake node saw.
fn batches(fake: &Fake) -> Vec<(u64, usize)> {
    fake.seen()
        .iter()
        .map(|incoming| (incoming.seq.expect("a sequence"), incoming.values.len()))
        .collect()
}

#[tokio::test]
async fn batches_are_cut_by_record_count_and_sealed_by_flush() {
    let fake = Fake::start(|_, _| Plan::Normal).await;
    let options = ProducerOptions::new()
        .max_batch_records(3)
        .linger(Duration::from_secs(30));
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let sent = values("r", 7);
    let deliveries = producer.send_many(records(&sent)).await.unwrap();
    flush(&producer).await;
    assert_eq!(batches(&fake), vec![(0, 3), (1, 3), (2, 1)]);
    assert_eq!(fake.log(), sent);
    let expected: Vec<Result<u64, SendError>> = (0..7).map(Ok).collect();
    assert_eq!(offsets(deliveries).await, expected);
    let incoming = &fake.seen()[0];
    assert_eq!(
        incoming.producer_id.as_deref(),
        Some(producer.producer_id())
    );
    assert_eq!(producer.commit_point(), Some(6));
    let stats = producer.stats();
    assert_eq!((stats.accepted, stats.committed, stats.batches), (7, 7, 3));
}

#[tokio::test]
async fn batches_are_cut_by_bytes() {
    let fake = Fake::start(|_, _| Plan::Normal).await;
    // Each record encodes to 35 bytes ({"value":"…25 chars…"} plus a comma): two fit in 80.
    let sent: Vec<String> = (0..5).map(|i| format!("{i}{}", "x".repeat(24))).collect();
    let options = ProducerOptions::new()
        .max_batch_bytes(80)
        .linger(Duration::from_secs(30));
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    producer.send_many(records(&sent)).await.unwrap();
    flush(&producer).await;
    assert_eq!(batches(&fake), vec![(0, 2), (1, 2), (2, 1)]);
    assert_eq!(fake.log(), sent);
}

#[tokio::test]
async fn a_batch_waits_for_the_linger_before_it_is_sent() {
    let fake = Fake::start(|_, _| Plan::Normal).await;
    let linger = Duration::from_millis(300);
    let producer = Producer::open(fake.client(), "t", ProducerOptions::new().linger(linger))
        .await
        .unwrap();
    let started = Instant::now();
    let first = producer.send(RecordIn::text("a")).await.unwrap();
    let second = producer.send(RecordIn::text("b")).await.unwrap();
    assert_eq!(outcome(first).await, Ok(0));
    assert!(
        started.elapsed() >= linger,
        "the batch went out after {:?}, before the linger of {linger:?}",
        started.elapsed()
    );
    assert_eq!(outcome(second).await, Ok(1));
    assert_eq!(
        batches(&fake),
        vec![(0, 2)],
        "one batch, sealed by the linger"
    );
}

#[tokio::test]
async fn while_the_pipeline_is_full_the_open_batch_keeps_filling() {
    // Every request waits at the gate: batch 0 holds the only pipeline slot meanwhile.
    let fake = Fake::start(|_, _| Plan::WaitGate).await;
    let options = ProducerOptions::new()
        .max_in_flight(1)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let first = producer.send(RecordIn::text("a")).await.unwrap();
    fake.wait_for("batch 0 sent", |m| m.seen.len() == 1).await;
    // One at a time, with pauses: each record finds the previous one's batch still open.
    let rest = values("r", 9);
    let mut deliveries = Vec::new();
    for record in records(&rest) {
        deliveries.push(producer.send(record).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A linger of zero seals a batch at once only when it could be sent at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.seen().len(), 1, "nothing more could be sent meanwhile");
    fake.open_gate();
    assert_eq!(outcome(first).await, Ok(0));
    let expected: Vec<Result<u64, SendError>> = (1..10).map(Ok).collect();
    assert_eq!(offsets(deliveries).await, expected);
    assert_eq!(
        batches(&fake),
        vec![(0, 1), (1, 9)],
        "the records sent while batch 0 was in flight went out together"
    );
}

#[tokio::test]
async fn batches_that_overtake_each_other_are_resent_after_a_sequence_gap_and_stay_in_order() {
    // Batch 0's first request is slow, so batches 1 to 3 reach the node first and are
    // answered sequence_gap.
    let fake = Fake::start(|incoming, _| match incoming.seq {
        Some(0) => Plan::Delay(Duration::from_millis(300)),
        _ => Plan::Normal,
    })
    .await;
    let options = ProducerOptions::new()
        .max_batch_records(1)
        .max_in_flight(4)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let sent = values("v", 12);
    let deliveries = producer.send_many(records(&sent)).await.unwrap();
    let expected: Vec<Result<u64, SendError>> = (0..12).map(Ok).collect();
    assert_eq!(offsets(deliveries).await, expected);
    assert_eq!(fake.log(), sent, "every record once, in send order");

    let seen = fake.seen();
    let gapped: Vec<u64> = seen[..4].iter().filter_map(|i| i.seq).collect();
    assert_eq!(gapped, vec![0, 1, 2, 3], "four batches in flight at once");
    // Batch 1 went twice, with the same sequence and the same record.
    let batch_one: Vec<&Incoming> = seen.iter().filter(|i| i.seq == Some(1)).collect();
    assert!(batch_one.len() >= 2, "{seen:?}");
    assert!(batch_one.iter().all(|i| i.values == vec!["v1".to_string()]));
    assert!(
        producer.stats().sequence_gaps >= 3,
        "{:?}",
        producer.stats()
    );
    assert_eq!(producer.commit_point(), Some(11));
}

#[tokio::test]
async fn an_unknown_outcome_is_resent_with_the_same_sequence_and_answers_the_original_offsets() {
    // Batch 1 is appended but its answer is lost; the client's re-sends hang too, so its
    // deadline (room for about three attempts) passes with an unknown outcome and the producer
    // sends the batch again itself.
    let fake = Fake::start(|incoming, index| match (incoming.seq, index) {
        (Some(1), 1) => Plan::ApplyThenHang,
        (Some(1), 2..=3) => Plan::Hang,
        _ => Plan::Normal,
    })
    .await;
    let client = Client::builder([fake.url.as_str()])
        .deadline(Duration::from_millis(600))
        .request_timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let options = ProducerOptions::new()
        .max_batch_records(2)
        .linger(Duration::ZERO);
    let producer = Producer::open(client, "t", options).await.unwrap();
    let first = producer.send_many(records(&values("a", 2))).await.unwrap();
    assert_eq!(offsets(first).await, vec![Ok(0), Ok(1)]);
    let second = producer.send_many(records(&values("b", 2))).await.unwrap();
    assert_eq!(offsets(second).await, vec![Ok(2), Ok(3)]);
    flush(&producer).await;

    assert_eq!(fake.log(), vec!["a0", "a1", "b0", "b1"], "appended once");
    let seen = fake.seen();
    let resent: Vec<&Incoming> = seen.iter().filter(|i| i.seq == Some(1)).collect();
    assert!(resent.len() >= 3, "{seen:?}");
    assert!(resent
        .iter()
        .all(|i| i.values == vec!["b0".to_string(), "b1".to_string()]
            && i.producer_id.as_deref() == Some(producer.producer_id())));
    let stats = producer.stats();
    assert_eq!(stats.duplicates, 2, "{stats:?}");
    assert!(stats.publish_calls >= 3, "{stats:?}");
}

#[tokio::test]
async fn a_refused_batch_fails_alone_and_the_batches_after_it_are_renumbered() {
    // The batch holding "bad" is refused; batches after it, already in flight with higher
    // sequences, are answered sequence_gap until they are renumbered.
    let fake = Fake::start(|incoming, _| {
        if incoming.values.iter().any(|v| v == "bad") {
            Plan::Refuse(413, "payload_too_large")
        } else {
            Plan::Normal
        }
    })
    .await;
    let options = ProducerOptions::new()
        .max_batch_records(1)
        .max_in_flight(4)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let sent: Vec<String> = ["a", "bad", "c", "d", "e"].map(String::from).to_vec();
    let deliveries = producer.send_many(records(&sent)).await.unwrap();
    let results = offsets(deliveries).await;
    assert_eq!(results[0], Ok(0));
    match &results[1] {
        Err(SendError::Refused(problem)) => {
            assert_eq!(problem.code, ErrorCode::PayloadTooLarge)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(&results[2..], &[Ok(1), Ok(2), Ok(3)]);
    assert_eq!(fake.log(), vec!["a", "c", "d", "e"]);
    // "c" was first sent as sequence 2, then as sequence 1 (taking the refused one's).
    let c_seqs: Vec<u64> = fake
        .seen()
        .iter()
        .filter(|i| i.values == vec!["c".to_string()])
        .filter_map(|i| i.seq)
        .collect();
    assert_eq!(c_seqs.first(), Some(&2));
    assert_eq!(c_seqs.last(), Some(&1));
    assert_eq!(producer.commit_point(), Some(4), "a refusal is an outcome");
    assert_eq!(producer.stats().refused, 1);

    // The next batch continues the renumbered sequence.
    let next = producer.send(RecordIn::text("f")).await.unwrap();
    assert_eq!(outcome(next).await, Ok(4));
    assert_eq!(fake.seen().last().and_then(|i| i.seq), Some(4));
}

#[tokio::test]
async fn a_refused_batch_recovered_from_the_spool_is_dropped_and_the_rest_renumbered() {
    // A crash between a refusal and the spool entry that drops the refused batch: the reopened
    // producer sends it again, gets the same refusal, and carries on.
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(only_the_first_batch_answered).await;
    let (producer, options) = open_spooled(&fake, dir.path(), 1).await;
    let sent: Vec<String> = ["a", "big", "c"].map(String::from).to_vec();
    let deliveries = producer.send_many(records(&sent)).await.unwrap();
    fake.wait_for("batch 1 sent", |m| m.seen.iter().any(|i| i.seq == Some(1)))
        .await;
    producer.abort().await;
    assert_eq!(outcome(deliveries.into_iter().next().unwrap()).await, Ok(0));

    fake.set_script(|incoming, _| {
        if incoming.values.iter().any(|v| v == "big") {
            Plan::Refuse(413, "payload_too_large")
        } else {
            Plan::Normal
        }
    });
    let reopened = Producer::open(fake.client(), "t", options.clone())
        .await
        .unwrap();
    assert_eq!(reopened.recovered().batches, 2);
    flush(&reopened).await;
    assert_eq!(fake.log(), vec!["a", "c"]);
    let c_seqs: Vec<u64> = fake
        .seen()
        .iter()
        .filter(|i| i.values == vec!["c".to_string()])
        .filter_map(|i| i.seq)
        .collect();
    assert_eq!(
        c_seqs.last(),
        Some(&1),
        "c took the refused batch's sequence"
    );
    assert_eq!(reopened.stats().refused, 1);
    reopened.close().await.unwrap();
    drop(reopened);
    let again = Producer::open(fake.client(), "t", options).await.unwrap();
    assert_eq!(
        again.recovered().batches,
        0,
        "the refused batch left the spool"
    );
}

#[tokio::test]
async fn a_full_buffer_makes_send_wait_until_records_settle() {
    let fake = Fake::start(|_, _| Plan::WaitGate).await;
    let options = ProducerOptions::new()
        .buffer_records(4)
        .max_batch_records(1)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let mut deliveries = Vec::new();
    for value in values("r", 4) {
        deliveries.push(producer.send(RecordIn::text(value)).await.unwrap());
    }
    let fifth = {
        let producer = producer.clone();
        tokio::spawn(async move { producer.send(RecordIn::text("r4")).await })
    };
    fake.wait_for("four requests held", |m| m.seen.len() == 4)
        .await;
    // The check that something does not happen: the fifth send stays blocked while the
    // buffer is full, and nothing more is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !fifth.is_finished(),
        "send returned while the buffer was full"
    );
    assert_eq!(producer.next_local_sequence(), 4);
    assert_eq!(fake.seen().len(), 4);

    fake.open_gate();
    let fifth = tokio::time::timeout(WAIT, fifth)
        .await
        .expect("the fifth send returns once there is room")
        .unwrap()
        .unwrap();
    deliveries.push(fifth);
    let expected: Vec<Result<u64, SendError>> = (0..5).map(Ok).collect();
    assert_eq!(offsets(deliveries).await, expected);
}

#[tokio::test]
async fn commit_point_covers_only_a_settled_prefix() {
    // Batch 0 is appended at once but its answer waits for the gate; batch 1 (sent a little
    // later, so it lands after batch 0) is answered at once.
    let fake = Fake::start(|incoming, _| match incoming.seq {
        Some(0) => Plan::ApplyThenWaitGate,
        Some(1) => Plan::Delay(Duration::from_millis(100)),
        _ => Plan::Normal,
    })
    .await;
    let options = ProducerOptions::new()
        .max_batch_records(1)
        .max_in_flight(2)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    assert_eq!(producer.commit_point(), None, "nothing sent yet");
    let first = producer.send(RecordIn::text("a")).await.unwrap();
    let second = producer.send(RecordIn::text("b")).await.unwrap();
    assert_eq!(outcome(second).await, Ok(1));
    assert_eq!(
        producer.commit_point(),
        None,
        "record 1 is committed but record 0 has no outcome yet"
    );
    fake.open_gate();
    assert_eq!(outcome(first).await, Ok(0));
    flush(&producer).await;
    assert_eq!(producer.commit_point(), Some(1));

    // A refused record is an outcome too: the commit point passes it.
    fake.set_script(|_, _| Plan::Refuse(404, "topic_not_found"));
    let refused = producer.send(RecordIn::text("c")).await.unwrap();
    assert!(matches!(
        outcome(refused).await,
        Err(SendError::Refused(problem)) if problem.code == ErrorCode::TopicNotFound
    ));
    flush(&producer).await;
    assert_eq!(producer.commit_point(), Some(2));
}

#[tokio::test]
async fn a_spool_keeps_what_was_accepted_and_a_reopened_producer_resends_it_once() {
    let dir = tempfile::tempdir().unwrap();
    // The node appends batch 1 but never answers; batch 2 hangs unapplied.
    let fake = Fake::start(|incoming, _| match incoming.seq {
        Some(0) => Plan::Normal,
        Some(1) => Plan::ApplyThenHang,
        _ => Plan::Hang,
    })
    .await;
    let (producer, options) = open_spooled(&fake, dir.path(), 2).await;
    let id = producer.producer_id().to_string();
    let sent = values("s", 6);
    let deliveries = producer.send_many(records(&sent)).await.unwrap();
    assert_eq!(producer.next_local_sequence(), 6);
    fake.wait_for("three batches sent", |m| m.seen.len() >= 3)
        .await;
    // A crash: the producer stops with batches 1 and 2 unsettled.
    producer.abort().await;
    let results = offsets(deliveries).await;
    assert_eq!(&results[..2], &[Ok(0), Ok(1)]);
    assert!(results[2..]
        .iter()
        .all(|r| matches!(r, Err(SendError::Indeterminate { .. }))));
    assert!(matches!(
        producer.send(RecordIn::text("late")).await,
        Err(ProducerError::Closed)
    ));

    fake.set_script(|_, _| Plan::Normal);
    let reopened = Producer::open(fake.client(), "t", options).await.unwrap();
    assert_eq!(
        reopened.producer_id(),
        id,
        "the spool keeps the producer id"
    );
    let recovered = reopened.recovered();
    assert_eq!((recovered.batches, recovered.records), (2, 4));
    assert_eq!(recovered.local_sequences, Some(2..=5));
    assert_eq!(reopened.next_local_sequence(), 6);
    assert_eq!(reopened.commit_point(), Some(1));
    flush(&reopened).await;
    assert_eq!(
        fake.log(),
        sent,
        "batch 1 deduplicated, batch 2 appended, in order"
    );
    let resent: Vec<(u64, usize)> = fake.seen()[3..]
        .iter()
        .map(|i| (i.seq.unwrap(), i.values.len()))
        .collect();
    assert_eq!(&resent[..2], &[(1, 2), (2, 2)], "the original sequences");
    assert_eq!(reopened.stats().duplicates, 2);
    assert_eq!(reopened.commit_point(), Some(5));

    // New records continue the local and batch sequences.
    let next = reopened.send(RecordIn::text("s6")).await.unwrap();
    assert_eq!(next.local_sequence(), 6);
    assert_eq!(outcome(next).await, Ok(6));
    assert_eq!(fake.seen().last().and_then(|i| i.seq), Some(3));
    reopened.close().await.unwrap();
    let spool_len = std::fs::metadata(dir.path().join(SPOOL_FILE))
        .unwrap()
        .len();
    assert!(
        spool_len < 200,
        "a closed spool is compacted ({spool_len} bytes)"
    );
    let again = Producer::open(fake.client(), "t", ProducerOptions::new().spool(dir.path()))
        .await
        .unwrap();
    assert_eq!(again.recovered().batches, 0);
    assert_eq!(again.next_local_sequence(), 7);
}

#[tokio::test]
async fn a_torn_spool_tail_is_cut_and_the_intact_batches_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(|_, _| Plan::Hang).await;
    let (producer, options) = open_spooled(&fake, dir.path(), 1).await;
    producer.send_many(records(&values("t", 3))).await.unwrap();
    producer.abort().await;
    drop(producer);

    // A crash in the middle of writing a fourth batch leaves a frame cut short.
    let path = dir.path().join(SPOOL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let intact = bytes.len();
    bytes.extend_from_slice(&200u32.to_le_bytes());
    bytes.extend_from_slice(&[0xab, 0xcd, 0xef, 0x01]);
    bytes.extend_from_slice(br#"{"t":"batch","seq":3,"first":3,"rec"#);
    std::fs::write(&path, &bytes).unwrap();

    fake.set_script(|_, _| Plan::Normal);
    let reopened = Producer::open(fake.client(), "t", options).await.unwrap();
    assert_eq!(reopened.recovered().records, 3);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), intact as u64);
    flush(&reopened).await;
    let log = fake.log();
    assert_eq!(log, values("t", 3), "each recovered record once");
}

#[tokio::test]
async fn a_spool_of_another_topic_or_producer_or_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(|_, _| Plan::Normal).await;
    let options = ProducerOptions::new()
        .producer_id("p-one")
        .spool(dir.path());
    let producer = Producer::open(fake.client(), "t", options.clone())
        .await
        .unwrap();
    let err = Producer::open(fake.client(), "t", options.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, ProducerError::SpoolInUse { .. }), "{err}");
    producer.close().await.unwrap();
    drop(producer);

    let err = Producer::open(fake.client(), "other", options.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProducerError::ForeignSpool { detail, .. }
            if detail.contains("\"t\"") && detail.contains("\"other\"")),
        "{err}"
    );
    let err = Producer::open(
        fake.client(),
        "t",
        ProducerOptions::new()
            .producer_id("p-two")
            .spool(dir.path()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ProducerError::ForeignSpool { detail, .. } if detail.contains("p-one")),
        "{err}"
    );
    // Without an id, the spool's is taken.
    let producer = Producer::open(fake.client(), "t", ProducerOptions::new().spool(dir.path()))
        .await
        .unwrap();
    assert_eq!(producer.producer_id(), "p-one");
}

#[tokio::test]
async fn a_reopened_spool_the_server_no_longer_knows_is_an_error_not_a_success() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(only_the_first_batch_answered).await;
    let (producer, options) = open_spooled(&fake, dir.path(), 1).await;
    let first = producer.send(RecordIn::text("x0")).await.unwrap();
    assert_eq!(outcome(first).await, Ok(0));
    producer.send(RecordIn::text("x1")).await.unwrap();
    fake.wait_for("batch 1 sent", |m| m.seen.len() >= 2).await;
    producer.abort().await;
    drop(producer);

    // The cluster forgot the producer (its state expired) before the restart.
    let fresh = Fake::start(|_, _| Plan::Normal).await;
    let reopened = Producer::open(fresh.client(), "t", options.clone())
        .await
        .unwrap();
    assert_eq!(reopened.recovered().records, 1);
    let err = tokio::time::timeout(WAIT, reopened.flush())
        .await
        .expect("an answer within the wait")
        .unwrap_err();
    match &err {
        ProducerError::ProducerForgotten { detail } => {
            assert!(detail.contains("cannot be known"), "{detail}");
            assert!(detail.contains("1..=1"), "{detail}");
        }
        other => panic!("expected ProducerForgotten, got {other}"),
    }
    assert!(
        fresh.log().is_empty(),
        "nothing appended under a guessed sequence"
    );
    assert_eq!(
        reopened.send(RecordIn::text("x2")).await.unwrap_err(),
        err,
        "the producer stays stopped"
    );
    drop(reopened);
    // The batch stays in the spool for an operator to decide.
    let again = Producer::open(fresh.client(), "t", options).await.unwrap();
    assert_eq!(again.recovered().records, 1);
    again.abort().await;
}

#[tokio::test]
async fn a_producer_forgotten_with_nothing_unsettled_starts_over_at_sequence_zero() {
    let fake = Fake::start(|_, _| Plan::Normal).await;
    let options = ProducerOptions::new()
        .max_batch_records(1)
        .linger(Duration::ZERO);
    let producer = Producer::open(fake.client(), "t", options).await.unwrap();
    let deliveries = producer.send_many(records(&values("f", 2))).await.unwrap();
    assert_eq!(offsets(deliveries).await, vec![Ok(0), Ok(1)]);
    fake.forget_producers();
    let next = producer.send(RecordIn::text("f2")).await.unwrap();
    assert_eq!(outcome(next).await, Ok(2));
    let seqs: Vec<u64> = fake.seen().iter().filter_map(|i| i.seq).collect();
    assert_eq!(
        seqs,
        vec![0, 1, 2, 0],
        "batch 2 was refused as a gap, then sent as 0"
    );
    assert_eq!(fake.log(), values("f", 3));
}

#[tokio::test]
async fn options_records_and_closed_producers_are_checked() {
    let fake = Fake::start(|_, _| Plan::Normal).await;
    let bad = [
        ProducerOptions::new().producer_id("has space"),
        ProducerOptions::new().max_batch_records(0),
        ProducerOptions::new().max_batch_records(10_001),
        ProducerOptions::new().max_in_flight(17),
        ProducerOptions::new().buffer_records(0),
        ProducerOptions::new().max_batch_bytes(32 << 20),
        ProducerOptions::new().linger(Duration::from_secs(3600)),
    ];
    for options in bad {
        let err = Producer::open(fake.client(), "t", options.clone())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProducerError::InvalidArgument(_)),
            "{options:?}: {err}"
        );
    }
    assert!(matches!(
        Producer::open(fake.client(), "no/slash", ProducerOptions::new()).await,
        Err(ProducerError::InvalidArgument(_))
    ));

    let producer = Producer::open(fake.client(), "t", ProducerOptions::new().buffer_bytes(100))
        .await
        .unwrap();
    let err = producer
        .send(RecordIn::text("x".repeat(200)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProducerError::InvalidArgument(text) if text.contains("buffer_bytes")),
        "{err}"
    );
    let delivery = producer.send(RecordIn::text("fits")).await.unwrap();
    producer.close().await.unwrap();
    assert_eq!(
        outcome(delivery).await,
        Ok(0),
        "close waits for the outcome"
    );
    assert_eq!(
        producer.send(RecordIn::text("late")).await.unwrap_err(),
        ProducerError::Closed
    );
    producer.flush().await.unwrap();
    assert_eq!(fake.log(), vec!["fits"]);
}

#[tokio::test]
async fn a_dropped_producer_still_delivers_what_it_accepted() {
    let fake = Fake::start(|_, _| Plan::Delay(Duration::from_millis(50))).await;
    let producer = Producer::open(fake.client(), "t", ProducerOptions::new())
        .await
        .unwrap();
    let deliveries = producer.send_many(records(&values("d", 3))).await.unwrap();
    drop(producer);
    assert_eq!(offsets(deliveries).await, vec![Ok(0), Ok(1), Ok(2)]);
}

/// The producer's size of a record (what its batch limits count) is exactly the record's JSON,
/// for every kind of character serde_json escapes and for every field combination.
#[test]
fn a_records_counted_size_is_its_json_size() {
    let texts = [
        "",
        "plain",
        "quote \" and backslash \\",
        "controls \u{0}\u{1}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1f}",
        "del \u{7f}, é, ∑, 🦀",
        "/slash/ stays",
        // One character to escape each, among many that need none (the fast path must see it).
        "just a \" quote in a longer string of plain text",
        "just a \\ backslash in a longer string of plain text",
        "just a \u{1f} control in a longer string of plain text",
        "just a \t tab in a longer string of plain text",
    ];
    let mut seen = 0;
    for (i, value) in texts.iter().enumerate() {
        for key in [None, Some(texts[(i + 1) % texts.len()])] {
            for headers in 0..3 {
                let mut record = if i % 2 == 0 {
                    RecordIn::text(*value)
                } else {
                    RecordIn::binary(value.as_bytes())
                };
                record.key = key.map(str::to_string);
                for h in 0..headers {
                    record.headers.insert(
                        format!("{}{h}", texts[(i + h + 2) % texts.len()]),
                        texts[(i + h + 3) % texts.len()].to_string(),
                    );
                }
                let json = serde_json::to_vec(&record).expect("json");
                assert_eq!(
                    super::producer::handle::encoded_len(&record),
                    json.len() + 1,
                    "{}",
                    String::from_utf8_lossy(&json)
                );
                seen += 1;
            }
        }
    }
    assert_eq!(seen, texts.len() * 2 * 3);
}
