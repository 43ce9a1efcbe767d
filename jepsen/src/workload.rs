//! Clients that drive the cluster and record the history.
//!
//! - [`http`]: the raw HTTP client (no automatic redirects, no pooled connections) and the
//!   classification of answers into ok / fail / info.
//! - [`queue`]: the queue workload: publishers, consumers that pull and ack, and the final
//!   drain.
//! - [`stream`]: the stream workload: publishers and readers that move subscription cursors
//!   with `from=next_offset`.
//! - Both end with [`final_reads`]: the whole topic read through each node separately; then
//!   [`digest::compare`]: every node's whole state, by digest, at one index.
//!
//! Every worker is one logical client at a time: it takes a [`Process`] from the history, and
//! after an `info` completion it retires that process and continues under a fresh one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::Serialize;
use serde_json::json;

use raftq_client::api::PublishResponse;

use self::http::{Answer, Class, Http};
use crate::history::{History, Op, OpResult, Process};

pub mod digest;
pub mod http;
pub mod queue;
pub mod stream;

/// Which workload a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Queue,
    Stream,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Queue => "queue",
            Workload::Stream => "stream",
        }
    }
}

/// Settings shared by the workloads.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The topic the run uses.
    pub topic: String,
    /// The subscription (queue: the consumers' shared one; stream: a prefix per reader).
    pub subscription: String,
    /// Concurrent publishers.
    pub publishers: usize,
    /// Concurrent consumers (queue) or readers (stream).
    pub consumers: usize,
    /// Lease length of the queue subscription.
    pub ack_timeout_ms: u64,
    /// Timeout of one request (a long-poll adds its wait).
    pub request_timeout: Duration,
    /// Most records one pull leases.
    pub pull_max: u32,
    /// Long-poll of one pull or read.
    pub wait_ms: u64,
    /// Pause of a publisher between two publishes (bounds the request rate).
    pub publish_pause: Duration,
    /// Most client operations the workload phase invokes (the final phase is bounded apart).
    pub max_ops: u64,
    /// Bound of the final drain.
    pub drain_timeout: Duration,
    /// Queue: consumers that hold what they pull for part of its lease before acking it (see
    /// [`Settings::clock_checks`]).
    pub holders: usize,
    /// A second topic, with retention by age, that one more publisher writes to and that is
    /// read through every node at the end (see [`Settings::clock_checks`]).
    pub aged: Option<crate::checker::queue::RetentionTopic>,
}

/// The clock scenarios' workload: the lease of [`Settings::clock_checks`].
pub const CLOCK_ACK_TIMEOUT_MS: u64 = 20_000;
/// The clock scenarios' retention topic and its maximum age.
pub const AGED_TOPIC: &str = "jepsen-aged";
pub const AGED_MAX_AGE_MS: u64 = 30_000;

impl Settings {
    /// The settings of the clock scenarios, where an early lease expiry or an early deletion
    /// by age must be visible: leases of [`CLOCK_ACK_TIMEOUT_MS`], two consumers that hold each
    /// pull's records for 20–80 % of the lease before acking them (so that at any moment some
    /// leases have seconds to minutes left, which a clock that leapt would cut short), and a
    /// topic with a maximum age of [`AGED_MAX_AGE_MS`] (records younger than that, in real
    /// time, must all still be there at the end).
    pub fn clock_checks(self) -> Settings {
        Settings {
            ack_timeout_ms: CLOCK_ACK_TIMEOUT_MS,
            holders: 2,
            aged: Some(crate::checker::queue::RetentionTopic {
                topic: AGED_TOPIC.to_string(),
                max_age_ms: AGED_MAX_AGE_MS,
            }),
            ..self
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            topic: "jepsen".to_string(),
            subscription: "s".to_string(),
            publishers: 3,
            consumers: 2,
            ack_timeout_ms: 3000,
            request_timeout: Duration::from_secs(3),
            pull_max: 20,
            wait_ms: 500,
            publish_pause: Duration::from_millis(5),
            max_ops: 50_000,
            drain_timeout: Duration::from_secs(30),
            holders: 0,
            aged: None,
        }
    }
}

/// What the workers share.
pub struct Ctx {
    pub http: Http,
    pub history: History,
    pub settings: Settings,
    /// End of the workload phase.
    pub deadline: Instant,
    /// Operations invoked so far in the workload phase, against [`Settings::max_ops`].
    invoked: AtomicU64,
    /// Progress counters for the console.
    pub progress: Progress,
}

/// Counters for the progress line.
#[derive(Debug, Default)]
pub struct Progress {
    pub ok: AtomicU64,
    pub fail: AtomicU64,
    pub info: AtomicU64,
    /// Values acknowledged by `ok` publishes.
    pub published: AtomicU64,
    /// Records returned by `ok` pulls or reads.
    pub received: AtomicU64,
}

impl Progress {
    fn count(&self, class: Class) {
        let counter = match class {
            Class::Ok => &self.ok,
            Class::Fail => &self.fail,
            Class::Info => &self.info,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `ok=.. fail=.. info=.. published=.. received=..`.
    pub fn line(&self) -> String {
        format!(
            "ok={} fail={} info={} published={} received={}",
            self.ok.load(Ordering::Relaxed),
            self.fail.load(Ordering::Relaxed),
            self.info.load(Ordering::Relaxed),
            self.published.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

impl Ctx {
    pub fn new(http: Http, history: History, settings: Settings, deadline: Instant) -> Arc<Ctx> {
        Arc::new(Ctx {
            http,
            history,
            settings,
            deadline,
            invoked: AtomicU64::new(0),
            progress: Progress::default(),
        })
    }

    /// True while the workload phase may invoke another operation (time and op budget).
    pub fn may_invoke(&self) -> bool {
        Instant::now() < self.deadline
            && self.invoked.fetch_add(1, Ordering::Relaxed) < self.settings.max_ops
    }

    /// Request timeout plus a long-poll wait.
    pub fn timeout_with_wait(&self, wait_ms: u64) -> Duration {
        self.settings.request_timeout + Duration::from_millis(wait_ms)
    }

    /// Path of the run's topic, plus `rest`.
    pub fn topic_path(&self, rest: &str) -> String {
        format!("/v1/topics/{}{rest}", self.settings.topic)
    }
}

/// One logical client: its current process and the node it talks to.
pub struct Client {
    pub process: Process,
    pub node: u64,
}

impl Client {
    /// A client with a fresh process, starting at `node`.
    pub fn new(history: &History, node: u64) -> Client {
        Client {
            process: history.next_process(),
            node,
        }
    }

    /// The process number (for value names).
    pub fn number(&self) -> u64 {
        match self.process {
            Process::Client(n) => n,
            Process::Nemesis => u64::MAX,
        }
    }

    /// After an answer: retire the process on `info`; move to the leader the answer named, or
    /// to the next node when this one could not serve.
    pub fn after(&mut self, ctx: &Ctx, answer: &Answer) {
        ctx.progress.count(answer.class);
        if answer.class == Class::Info {
            self.process = ctx.history.next_process();
        }
        if answer.class == Class::Ok {
            self.node = answer.node;
        } else if answer.should_rotate() {
            self.node = match answer.leader_hint {
                Some(leader) if leader != answer.node => leader,
                _ => ctx.http.next_node(answer.node),
            };
        }
    }
}

/// Pause after an answer that was not ok, so that a leaderless cluster is not hammered.
pub async fn back_off(answer: &Answer) {
    if answer.class != Class::Ok {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends a setup request (create a topic or subscription) until it succeeds, trying every node
/// in turn, for at most `timeout`. Not recorded in the history: setup is not under test.
pub async fn setup_request(
    http: &Http,
    method: Method,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> anyhow::Result<Answer> {
    let deadline = Instant::now() + timeout;
    let mut node = http.ids().first().copied().unwrap_or(1);
    loop {
        let answer = http
            .send(
                node,
                method.clone(),
                path,
                Some(body),
                Duration::from_secs(5),
            )
            .await;
        if answer.class == Class::Ok {
            return Ok(answer);
        }
        if answer
            .status
            .is_some_and(|s| (400..500).contains(&s) && s != 429)
        {
            anyhow::bail!(
                "{method} {path} refused: {:?} {}",
                answer.error,
                answer.body
            );
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "{method} {path} did not succeed within {timeout:?}: {:?}",
                answer.error
            );
        }
        node = answer.leader_hint.unwrap_or_else(|| http.next_node(node));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates the run's topic.
pub async fn create_topic(http: &Http, topic: &str) -> anyhow::Result<()> {
    setup_request(
        http,
        Method::PUT,
        &format!("/v1/topics/{topic}"),
        &json!({}),
        Duration::from_secs(30),
    )
    .await
    .map(drop)
}

/// Creates `subscription` of `topic` with `body` (retried until a node takes it).
pub async fn create_subscription(
    http: &Http,
    topic: &str,
    subscription: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    setup_request(
        http,
        Method::PUT,
        &format!("/v1/topics/{topic}/subscriptions/{subscription}"),
        body,
        Duration::from_secs(30),
    )
    .await
    .map(drop)
}

/// The node worker `slot` starts at.
pub fn first_node(ctx: &Ctx, slot: usize) -> u64 {
    let ids = ctx.http.ids();
    ids[slot % ids.len()]
}

/// One recorded operation: invokes `op` in the history for `client`, sends the request to the
/// client's node, and completes the op by the answer's class (an ok answer with `result` of
/// its body). An ok answer whose body does not decode as `T` counts as unknown (info).
/// Returns the answer (its class as recorded) and, when ok, the decoded body.
#[allow(clippy::too_many_arguments)]
pub async fn call<T: serde::de::DeserializeOwned>(
    ctx: &Ctx,
    client: &Client,
    op: Op,
    method: Method,
    path: &str,
    body: Option<&serde_json::Value>,
    timeout: Duration,
    result: impl FnOnce(&T) -> OpResult,
) -> (Answer, Option<T>) {
    let mut handle = ctx.history.invoke(client.process, Some(client.node), op);
    let mut answer = ctx
        .http
        .send(client.node, method, path, body, timeout)
        .await;
    handle.set_node(Some(answer.node));
    let mut out = None;
    match answer.class {
        Class::Ok => match answer.decode::<T>() {
            Some(decoded) => {
                handle.ok(result(&decoded));
                out = Some(decoded);
            }
            None => {
                answer.class = Class::Info;
                handle.info(format!("2xx with an unexpected body: {}", answer.body));
            }
        },
        Class::Fail => {
            handle.fail(answer.error.clone().unwrap_or_default());
        }
        Class::Info => {
            handle.info(answer.error.clone().unwrap_or_default());
        }
    }
    (answer, out)
}

/// A publisher: an idempotent producer (`producer_id` `p<slot>`, batch `sequence` 0, 1, 2,
/// …) publishing one unique value `p<slot>-<n>` per request until the deadline or the op
/// budget.
///
/// After an `ok` the next value gets the next sequence. After a definite failure of a batch
/// never sent before, the sequence was not used: the next value takes it. After an unknown
/// outcome (`info`) the same batch is sent again with the same sequence until one answer is
/// `ok`, as a producer must (a definite failure of a re-send says nothing about the earlier
/// attempt): the server answers a batch it already has with its original offsets
/// (`duplicate: true`) instead of appending it twice. Following Jepsen, the retry is a new op of a new process; it carries the same value,
/// so a value in the log at two offsets is a broken promise the checkers report.
pub async fn publisher(ctx: &Ctx, slot: usize) {
    publish_to(ctx, slot, &ctx.settings.topic, &format!("p{slot}")).await;
}

/// A publisher to `topic` as idempotent producer `producer` (values `<producer>-<n>`), as
/// [`publisher`] describes.
pub async fn publish_to(ctx: &Ctx, slot: usize, topic: &str, producer: &str) {
    let mut client = Client::new(&ctx.history, first_node(ctx, slot));
    let producer = producer.to_string();
    let (mut sequence, mut n) = (0u64, 0u64);
    let mut retry: Option<String> = None;
    // Whether some attempt of the current batch has an unknown outcome.
    let mut unknown = false;
    let path = format!("/v1/topics/{topic}/records");
    while ctx.may_invoke() {
        let value = retry.take().unwrap_or_else(|| {
            n += 1;
            format!("{producer}-{}", n - 1)
        });
        let body = json!({
            "records": [{"value": value}],
            "producer_id": producer,
            "sequence": sequence,
        });
        let op = Op::Publish {
            topic: topic.to_string(),
            values: vec![value.clone()],
            producer_id: Some(producer.clone()),
            sequence: Some(sequence),
        };
        let (answer, ok) = call(
            ctx,
            &client,
            op,
            Method::POST,
            &path,
            Some(&body),
            ctx.settings.request_timeout,
            |r: &PublishResponse| OpResult::publish(r.first_offset, 1, r.duplicate),
        )
        .await;
        match answer.class {
            Class::Ok => {
                sequence += 1;
                unknown = false;
                if ok.is_some_and(|r| !r.duplicate) {
                    ctx.progress.published.fetch_add(1, Ordering::Relaxed);
                }
            }
            Class::Info => {
                unknown = true;
                retry = Some(value);
            }
            // Still unknown whether an earlier attempt landed: keep re-sending it.
            Class::Fail if unknown => retry = Some(value),
            Class::Fail => {}
        }
        client.after(ctx, &answer);
        back_off(&answer).await;
        tokio::time::sleep(ctx.settings.publish_pause).await;
    }
}

/// What the final reads found, for the results file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FinalReads {
    /// Node -> records read through it (`None`: its read failed).
    pub records: std::collections::BTreeMap<u64, Option<usize>>,
    /// True when every node returned the same records.
    pub identical: bool,
}

/// The final read of the whole topic through each node separately (no redirects), each
/// recorded as one [`Op::FinalRead`]. Before reading, waits (bounded) until the node has
/// applied everything the leader had committed, so that a lagging follower is not mistaken
/// for a divergent one.
pub async fn final_reads(ctx: &Ctx, leader: u64) -> FinalReads {
    final_reads_of(ctx, leader, &ctx.settings.topic).await
}

/// [`final_reads`] of `topic`.
pub async fn final_reads_of(ctx: &Ctx, leader: u64, topic: &str) -> FinalReads {
    let http = &ctx.http;
    let timeout = ctx.settings.request_timeout;
    let commit_index = http
        .get_json::<raftq_client::api::ClusterStatus>(leader, "/v1/cluster", timeout)
        .await
        .map_or(0, |s| s.commit_index);
    let mut out = FinalReads::default();
    let mut seen: Vec<Vec<(u64, String)>> = Vec::new();
    let mut client = Client::new(&ctx.history, leader);
    for node in http.ids() {
        let caught_up_by = Instant::now() + Duration::from_secs(5);
        while Instant::now() < caught_up_by {
            let status: Option<raftq_client::api::ClusterStatus> =
                http.get_json(node, "/v1/cluster", timeout).await;
            if status.is_some_and(|s| s.last_applied >= commit_index) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut handle =
            ctx.history
                .invoke(client.process, Some(node), Op::final_read(topic, node));
        match read_all(ctx, node, topic).await {
            Ok(records) => {
                out.records.insert(node, Some(records.len()));
                seen.push(records.clone());
                handle.set_node(Some(node));
                handle.ok(OpResult::Records { records });
            }
            // The node answers, definitely, that the topic does not exist: the read happened
            // and found nothing. (A cluster that lost its state after a crash looks like this;
            // counting it as "no read" would hide the loss.)
            Err(answer)
                if answer.status == Some(404) && answer.body["code"] == "topic_not_found" =>
            {
                out.records.insert(node, Some(0));
                seen.push(Vec::new());
                handle.set_node(Some(node));
                handle.ok(OpResult::Records {
                    records: Vec::new(),
                });
            }
            Err(answer) => {
                out.records.insert(node, None);
                let why = answer.error.clone().unwrap_or_else(|| "read failed".into());
                // A read changes nothing: a failed one simply did not happen.
                handle.fail(why);
                client.after(ctx, &answer);
            }
        }
    }
    out.identical = seen.windows(2).all(|w| w[0] == w[1]) && !seen.is_empty();
    out
}

/// Reads the whole of `topic` through `node` alone, page by page.
async fn read_all(ctx: &Ctx, node: u64, topic: &str) -> Result<Vec<(u64, String)>, Answer> {
    let mut records = Vec::new();
    let mut from = 0u64;
    loop {
        let path = format!("/v1/topics/{topic}/records?from={from}&max=1000");
        let answer = ctx
            .http
            .send(node, Method::GET, &path, None, ctx.settings.request_timeout)
            .await;
        let Some(page) = answer.decode::<raftq_client::api::ReadResponse>() else {
            return Err(answer);
        };
        let got = page.records.len();
        records.extend(page.records.iter().map(crate::history::record_pair));
        if got == 0 || page.next_offset >= page.high_watermark {
            return Ok(records);
        }
        from = page.next_offset;
    }
}
