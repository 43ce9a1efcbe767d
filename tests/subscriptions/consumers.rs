//! Four competing consumers of one subscription through two leader SIGKILLs. Every pull and
//! every ack attempt is recorded as the chaos suite's history (an invoke and its `ok`, `fail`
//! or `info` completion), which `history::judge` judges at the end.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftq_client::api::{ClusterStatus, PullResponse, ReceiptResults, ReceiptStatus};
use raftq_jepsen::checker::QueueOptions;
use raftq_jepsen::history::{Delivery, History, Op, OpHandle, OpResult, Process};
use serde_json::{json, Value};

use crate::common::Cluster;
use crate::history::judge;
use crate::http::{create_sub, sub_state, wait_sub_everywhere};

pub(crate) const TOPIC: &str = "jobs";
pub(crate) const SUB: &str = "s";
const TOTAL: u64 = 5000;
const CONSUMERS: usize = 4;
pub(crate) const ACK_TIMEOUT_MS: u64 = 5000;
/// Simulated processing time per batch: keeps consumption running long enough for two
/// leader kills (about 25 batches per consumer).
const WORK: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Stats {
    pulls: usize,
    empty_pulls: usize,
    pulls_unknown: usize,
    acks: usize,
    acks_unknown: usize,
    redirects: usize,
    unavailable: usize,
    /// Ack results `stale` for a receipt whose earlier ack attempt had an unknown outcome.
    stale_after_unknown: usize,
}

struct Consumers {
    http: reqwest::Client,
    /// Node ids and base URLs.
    nodes: Vec<(u64, String)>,
    leader: Mutex<Option<String>>,
    stop: AtomicBool,
    hard_deadline: Instant,
    /// Every pull and ack attempt, with its outcome.
    history: History,
    /// Offsets of acks whose outcome was unknown at least once.
    unknown_acks: Mutex<BTreeSet<u64>>,
    acked: Mutex<Vec<bool>>,
    acked_count: AtomicUsize,
    /// Requests sent and not answered yet, so that a kill can hit one in flight.
    pulls_in_flight: AtomicUsize,
    acks_in_flight: AtomicUsize,
    odd: Mutex<Vec<String>>,
    stats: Mutex<Stats>,
}

/// How one request of a consumer ended.
enum Outcome {
    /// A 200: the op to complete, and the body.
    Answered(OpHandle, bytes::Bytes),
    /// No leader known, or a definite refusal (307, 503: a leader change), recorded `fail`.
    Refused,
    /// No answer, or another 5xx: it may or may not have happened. Recorded `info`; the
    /// process is retired.
    Unknown,
    /// Any other answer, recorded `fail`: its status and body.
    Odd(u16, String),
}

impl Consumers {
    async fn leader(&self) -> Option<String> {
        if let Some(url) = self.leader.lock().unwrap().clone() {
            return Some(url);
        }
        for (_, url) in &self.nodes {
            let Ok(resp) = self
                .http
                .get(format!("{url}/v1/cluster"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
            else {
                continue;
            };
            if !resp.status().is_success() {
                continue;
            }
            let Ok(status) = resp.json::<ClusterStatus>().await else {
                continue;
            };
            if let Some(leader) = status.leader_url {
                let leader = leader.trim_end_matches('/').to_string();
                *self.leader.lock().unwrap() = Some(leader.clone());
                return Some(leader);
            }
        }
        None
    }

    /// The id of the node at `url`, for the history.
    fn node_of(&self, url: &str) -> Option<u64> {
        self.nodes.iter().find(|(_, u)| u == url).map(|(id, _)| *id)
    }

    fn forget(&self, url: &str) {
        let mut leader = self.leader.lock().unwrap();
        if leader.as_deref() == Some(url) {
            *leader = None;
        }
    }

    /// After a definite refusal: follow a 307's leader_url, or look for the leader again.
    fn redirected(&self, url: &str, status: u16, body: &[u8]) {
        let mut stats = self.stats.lock().unwrap();
        if status == 307 {
            stats.redirects += 1;
        } else {
            stats.unavailable += 1;
        }
        drop(stats);
        let target = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            v["leader_url"]
                .as_str()
                .map(|s| s.trim_end_matches('/').to_string())
        });
        match (status, target) {
            (307, Some(target)) => *self.leader.lock().unwrap() = Some(target),
            _ => self.forget(url),
        }
    }

    fn odd(&self, what: String) {
        self.odd.lock().unwrap().push(what);
    }

    /// Sends `body` to the subscription's `action` (`pull`, `ack`) on the leader, recording
    /// `op` in the history by `process` (replaced by a fresh one when the outcome is unknown);
    /// `in_flight` counts the request while it is sent.
    async fn request(
        &self,
        process: &mut Process,
        op: Op,
        action: &str,
        body: &Value,
        timeout: Duration,
        in_flight: &AtomicUsize,
    ) -> Outcome {
        let Some(leader) = self.leader().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return Outcome::Refused;
        };
        let op = self.history.invoke(*process, self.node_of(&leader), op);
        in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .http
            .post(format!(
                "{leader}/v1/topics/{TOPIC}/subscriptions/{SUB}/{action}"
            ))
            .json(body)
            .timeout(timeout)
            .send()
            .await;
        let (status, body) = match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match resp.bytes().await {
                    Ok(body) => (status, body),
                    Err(_) => (0, Default::default()),
                }
            }
            Err(_) => (0, Default::default()),
        };
        in_flight.fetch_sub(1, Ordering::SeqCst);
        let outcome = match status {
            200 => return Outcome::Answered(op, body),
            307 | 503 => {
                op.fail(format!("answered {status}"));
                self.redirected(&leader, status, &body);
                Outcome::Refused
            }
            0 | 500..=599 => {
                op.info(format!("answered {status}"));
                *process = self.history.next_process();
                self.forget(&leader);
                Outcome::Unknown
            }
            other => {
                op.fail(format!("answered {other}"));
                return Outcome::Odd(other, String::from_utf8_lossy(&body).into_owned());
            }
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        outcome
    }

    async fn run(self: Arc<Self>, consumer: usize) {
        let pull_body = json!({
            "max": 50, "wait_ms": 1000, "ack_timeout_ms": ACK_TIMEOUT_MS,
            "consumer": format!("c{consumer}"),
        });
        let pull_op = Op::Pull {
            topic: TOPIC.into(),
            subscription: SUB.into(),
            ack_timeout_ms: Some(ACK_TIMEOUT_MS),
            final_drain: false,
        };
        let mut process = self.history.next_process();
        while !self.stop.load(Ordering::SeqCst) && Instant::now() < self.hard_deadline {
            let timeout = Duration::from_secs(6);
            let in_flight = &self.pulls_in_flight;
            let (op, body) = match self
                .request(
                    &mut process,
                    pull_op.clone(),
                    "pull",
                    &pull_body,
                    timeout,
                    in_flight,
                )
                .await
            {
                Outcome::Answered(op, body) => (op, body),
                Outcome::Refused => continue,
                Outcome::Unknown => {
                    // The leases (if any) expire and the records come back.
                    self.stats.lock().unwrap().pulls_unknown += 1;
                    continue;
                }
                Outcome::Odd(status, body) => {
                    self.odd(format!("c{consumer}: pull answered {status}: {body}"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let messages = match serde_json::from_slice::<PullResponse>(&body) {
                Ok(resp) => resp.messages,
                Err(e) => {
                    op.info(format!("undecodable answer: {e}"));
                    process = self.history.next_process();
                    self.odd(format!(
                        "c{consumer}: undecodable pull answer ({e}): {}",
                        String::from_utf8_lossy(&body)
                    ));
                    continue;
                }
            };
            op.ok(OpResult::pull(&messages));
            {
                let mut stats = self.stats.lock().unwrap();
                stats.pulls += 1;
                if messages.is_empty() {
                    stats.empty_pulls += 1;
                }
            }
            if messages.is_empty() {
                continue;
            }
            for m in &messages {
                if m.value_str() != Some(format!("w/{}", m.offset).as_str()) {
                    self.odd(format!(
                        "c{consumer}: wrong payload for offset {}: {m:?}",
                        m.offset
                    ));
                }
            }
            let delivered: Vec<Delivery> = messages.iter().map(Delivery::from_message).collect();
            tokio::time::sleep(WORK).await;
            self.ack_all(consumer, &mut process, &delivered).await;
        }
    }

    /// Acks `delivered` until the outcome is known (retrying unknown outcomes with the same
    /// receipts) or the hard deadline passes.
    async fn ack_all(&self, consumer: usize, process: &mut Process, delivered: &[Delivery]) {
        let receipts: Vec<&str> = delivered.iter().map(|d| d.receipt.as_str()).collect();
        let pairs: Vec<(String, String)> = delivered
            .iter()
            .map(|d| (d.receipt.clone(), d.value.clone()))
            .collect();
        let body = json!({ "receipts": receipts });
        let mut after_unknown = false;
        while Instant::now() < self.hard_deadline {
            let op = Op::ack(TOPIC, SUB, pairs.clone());
            let timeout = Duration::from_secs(5);
            let in_flight = &self.acks_in_flight;
            let (op, bytes) = match self
                .request(process, op, "ack", &body, timeout, in_flight)
                .await
            {
                Outcome::Answered(op, bytes) => (op, bytes),
                Outcome::Refused => continue,
                Outcome::Unknown => {
                    self.stats.lock().unwrap().acks_unknown += 1;
                    self.unknown_acks
                        .lock()
                        .unwrap()
                        .extend(delivered.iter().map(|d| d.offset));
                    after_unknown = true;
                    continue;
                }
                Outcome::Odd(status, body) => {
                    self.odd(format!("c{consumer}: ack answered {status}: {body}"));
                    return;
                }
            };
            let results = match serde_json::from_slice::<ReceiptResults>(&bytes) {
                Ok(r) => r.results,
                Err(e) => {
                    op.info(format!("undecodable answer: {e}"));
                    *process = self.history.next_process();
                    self.odd(format!(
                        "c{consumer}: undecodable ack answer ({e}): {}",
                        String::from_utf8_lossy(&bytes)
                    ));
                    return;
                }
            };
            op.ok(OpResult::Receipts {
                results: results.clone(),
            });
            let echoed: Vec<&str> = results.iter().map(|r| r.receipt.as_str()).collect();
            if echoed != receipts {
                self.odd(format!(
                    "c{consumer}: ack results do not answer the receipts in order: {results:?}"
                ));
                return;
            }
            let mut stats = self.stats.lock().unwrap();
            stats.acks += 1;
            let mut acked = self.acked.lock().unwrap();
            for (d, result) in delivered.iter().zip(&results) {
                if !matches!(result.status, ReceiptStatus::Acked | ReceiptStatus::Stale) {
                    self.odd(format!("c{consumer}: an ack answered {result:?}"));
                }
                if result.status == ReceiptStatus::Acked && !acked[d.offset as usize] {
                    acked[d.offset as usize] = true;
                    self.acked_count.fetch_add(1, Ordering::SeqCst);
                }
                if after_unknown && result.status == ReceiptStatus::Stale {
                    stats.stale_after_unknown += 1;
                }
            }
            return;
        }
        self.odd(format!(
            "c{consumer}: an ack got no known outcome before the deadline"
        ));
    }
}

async fn wait_acked(c: &Cluster, consumers: &Arc<Consumers>, target: usize, timeout: Duration) {
    let shared = consumers.clone();
    c.wait_for(
        &format!("{target} of {TOTAL} records acked by the consumers"),
        timeout,
        move || {
            let n = shared.acked_count.load(Ordering::SeqCst);
            let stats = format!("{:?}", shared.stats.lock().unwrap());
            async move {
                if n >= target {
                    Ok(())
                } else {
                    Err(format!("{n} acked; {stats}"))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_consumers_leader_killed_twice() {
    let test_started = Instant::now();
    let c = Cluster::start(3).await;
    c.create_topic(TOPIC).await;
    let history = History::new();
    let publisher = history.next_process();
    for batch in 0..(TOTAL / 500) {
        let vals: Vec<String> = (batch * 500..(batch + 1) * 500)
            .map(|i| format!("w/{i}"))
            .collect();
        let op = history.invoke(publisher, None, Op::publish(TOPIC, vals.clone()));
        let ack = c.publish_values(TOPIC, &vals).await;
        assert_eq!(ack.first_offset, batch * 500, "{ack:?}");
        op.ok(OpResult::publish(ack.first_offset, vals.len(), false));
    }
    create_sub(&c, TOPIC, SUB, json!({"ack_timeout_ms": ACK_TIMEOUT_MS})).await;

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(1))
        .build()
        .expect("HTTP client");
    let t0 = Instant::now();
    let shared = Arc::new(Consumers {
        http,
        nodes: c.ids().into_iter().map(|id| (id, c.url(id))).collect(),
        leader: Mutex::new(None),
        stop: AtomicBool::new(false),
        hard_deadline: t0 + Duration::from_secs(90),
        history,
        unknown_acks: Mutex::new(BTreeSet::new()),
        acked: Mutex::new(vec![false; TOTAL as usize]),
        acked_count: AtomicUsize::new(0),
        pulls_in_flight: AtomicUsize::new(0),
        acks_in_flight: AtomicUsize::new(0),
        odd: Mutex::new(Vec::new()),
        stats: Mutex::new(Stats::default()),
    });
    let tasks: Vec<_> = (0..CONSUMERS)
        .map(|i| tokio::spawn(shared.clone().run(i)))
        .collect();

    // Two leader SIGKILLs, at about 1/3 and 2/3, each node restarted after a new election.
    // The first hits a pull in flight (its answer, and maybe its leases, are lost), the second
    // an ack in flight (applied or not, the consumer cannot know), when the timing allows.
    let mut kills = Vec::new();
    for (k, target) in [(1, TOTAL as usize / 3), (2, 2 * TOTAL as usize / 3)] {
        wait_acked(&c, &shared, target, Duration::from_secs(40)).await;
        let old = c.leader_id().await;
        let in_flight = if k == 1 {
            &shared.pulls_in_flight
        } else {
            &shared.acks_in_flight
        };
        let aim_until = Instant::now() + Duration::from_secs(5);
        while in_flight.load(Ordering::SeqCst) == 0 && Instant::now() < aim_until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let hit = in_flight.load(Ordering::SeqCst);
        let at = shared.acked_count.load(Ordering::SeqCst);
        if at >= TOTAL as usize {
            c.fail(&format!(
                "consumption finished before leader kill #{k}: the test proves nothing (slow WORK?)"
            ));
        }
        c.kill(old);
        let killed = Instant::now();
        let new = c.wait_leader(Duration::from_secs(20)).await;
        assert_ne!(new, old);
        let elected = killed.elapsed();
        c.restart(old).await;
        let kind = if k == 1 { "pulls" } else { "acks" };
        kills.push(format!(
            "kill #{k}: node {old} at {at} acked ({:?}, {hit} {kind} in flight), node {new} leads \
             {elected:?} later",
            t0.elapsed()
        ));
    }

    // Until every offset is acked (or acked by an ack whose answer was lost: then the
    // subscription's cursor must say it is done).
    let sh = shared.clone();
    let cl = &c;
    c.wait_for(
        "every record to be acked",
        Duration::from_secs(90).saturating_sub(t0.elapsed()),
        move || {
            let sh = sh.clone();
            async move {
                let n = sh.acked_count.load(Ordering::SeqCst);
                if n == TOTAL as usize {
                    return Ok(());
                }
                let missing: Vec<u64> = {
                    let acked = sh.acked.lock().unwrap();
                    (0..TOTAL).filter(|o| !acked[*o as usize]).collect()
                };
                let unknown = sh.unknown_acks.lock().unwrap().clone();
                let stats = format!("{:?}", sh.stats.lock().unwrap());
                if missing.iter().all(|o| unknown.contains(o)) {
                    let leader = cl.agreed_leader().await?;
                    let st = sub_state(cl, leader, TOPIC, SUB).await?;
                    if st.cursor == TOTAL {
                        return Ok(());
                    }
                }
                Err(format!(
                    "{n} of {TOTAL} acked; first missing {:?}; {stats}",
                    &missing[..missing.len().min(10)]
                ))
            }
        },
    )
    .await;
    shared.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        if let Err(e) = tokio::time::timeout(Duration::from_secs(30), task).await {
            c.fail(&format!("a consumer did not stop: {e}"));
        }
    }
    let consumed_in = t0.elapsed();

    let odd = shared.odd.lock().unwrap().clone();
    if !odd.is_empty() {
        c.fail(&format!(
            "{} unexpected answers, the first: \n  {}",
            odd.len(),
            odd[..odd.len().min(20)].join("\n  ")
        ));
    }

    // ----- judge the history -----
    let events = shared.history.events();
    let options = QueueOptions {
        ack_timeout_ms: ACK_TIMEOUT_MS,
        ..QueueOptions::default()
    };
    let judgement = judge(&events, &options);
    if let Err(failure) = judgement.result() {
        let kept = c.root().join("consumers.jsonl");
        let saved = match raftq_jepsen::history::write_jsonl(&events, &kept) {
            Ok(()) => format!("the history is in {}", kept.display()),
            Err(e) => format!("the history could not be saved: {e}"),
        };
        c.fail(&format!(
            "the consumers' history breaks the subscription's promises ({saved}): {failure}"
        ));
    }
    let report = &judgement.report;

    // Every node ends with the cursor at the end and nothing in flight.
    c.wait_converged(TOPIC).await;
    let st = wait_sub_everywhere(&c, TOPIC, SUB, Duration::from_secs(30), |st| {
        if st.cursor == TOTAL && st.in_flight == 0 {
            Ok(())
        } else {
            Err(format!("not cursor {TOTAL} / in_flight 0"))
        }
    })
    .await;
    assert_eq!(st.backlog, 0, "{st:?}");
    assert_eq!(st.acked, TOTAL, "each record acked exactly once: {st:?}");
    assert_eq!(
        st.delivered - st.redelivered,
        TOTAL,
        "first deliveries must be exactly one per record: {st:?}"
    );
    assert!(
        st.delivered >= report.delivered,
        "the server counted fewer deliveries ({}) than the consumers saw ({}): {st:?}",
        st.delivered,
        report.delivered
    );
    let stats = shared.stats.lock().unwrap();
    eprintln!(
        "{}; {} deliveries seen ({} on the server, {} redelivered), {} records acked by a known \
         answer, {} by lost answers, {} stale after unknown; {:?}; {stats:?}; consumed in \
         {consumed_in:?}, test took {:?}",
        kills.join("; "),
        report.delivered,
        st.delivered,
        st.redelivered,
        report.acked,
        report.ack_unknown.count,
        stats.stale_after_unknown,
        report.counts,
        test_started.elapsed()
    );
}
