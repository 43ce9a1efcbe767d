//! The queue workload: publishers, consumers that pull and ack, and the final drain.
//!
//! - One topic and one subscription (lease `ack_timeout_ms`, no `max_deliveries`: nothing is
//!   ever dead-lettered, so every published value must eventually be delivered).
//! - Publishers publish one unique value per request, `p<process>-<seq>`.
//! - Consumers pull (`max`, `wait_ms`) and ack everything they got; an ack that failed or whose
//!   outcome is unknown is sent again (a few times, on the node the answer pointed to, under a
//!   fresh process after an unknown outcome), so that a definite answer usually says whether
//!   the record was acked: a record acked only by an ack with an unknown outcome is one the
//!   checker cannot call settled or lost. When every attempt fails the lease expires and the
//!   record comes again.
//! - Holders (the clock scenarios: [`Settings::holders`]) pull a few records twice a second
//!   and keep each batch for 20–80 % of its lease (never past the end of the workload phase)
//!   before acking it, so that at any moment many leases have seconds to minutes left: a
//!   server whose time leapt would expire them early, and another consumer would get the
//!   records while their lease still runs (the checker's `early_redelivery`).
//! - With [`Settings::aged`], one more publisher writes to a topic with retention by age,
//!   which is never pulled: only read through every node at the end (`early_retention`).
//! - The final drain, after the faults are healed and a leader is agreed on, pulls and acks
//!   until the subscription is empty: its cursor has reached the topic's next offset and
//!   nothing is in flight. It acks every record it pulls, again and again until an answer is
//!   `ok` (within the drain's bound), so that in a correct run every acknowledged value ends up
//!   acked by an `ok` ack (the queue checker's `lost`).

use std::time::{Duration, Instant};

use raftq_client::api::{
    Message, PullResponse, ReceiptResults, ReceiptStatus, SubscriptionInfo, TopicInfo,
};
use reqwest::Method;
use serde::Serialize;
use serde_json::json;

use super::http::Http;
use super::{
    back_off, call, create_subscription, create_topic, setup_request, Client, Ctx, Settings,
};
use crate::history::{Delivery, Op, OpResult};

/// Most attempts at acking one pull's receipts (workload phase).
const ACK_ATTEMPTS: usize = 3;
/// Most records one holder's pull leases.
const HOLD_PULL_MAX: u32 = 5;
/// How much of its lease a holder keeps a record for (drawn for each pull).
const HOLD_FRACTION: std::ops::Range<f64> = 0.2..0.8;
/// How often a holder pulls.
const HOLD_PULL_EVERY: Duration = Duration::from_millis(500);
/// How long after the workload phase's deadline a consumer may still send an ack again.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// Most attempts at acking one pull's receipts in the final drain (also bounded by its time).
const DRAIN_ACK_ATTEMPTS: usize = 30;
/// Pull size and long-poll of the final drain (short: the last, empty pull waits it out, once
/// per run).
const DRAIN_PULL_MAX: u32 = 500;
const DRAIN_WAIT_MS: u64 = 200;

/// Creates the topic and the subscription.
pub async fn setup(http: &Http, settings: &Settings) -> anyhow::Result<()> {
    create_topic(http, &settings.topic).await?;
    create_subscription(
        http,
        &settings.topic,
        &settings.subscription,
        &json!({"start": "first", "ack_timeout_ms": settings.ack_timeout_ms}),
    )
    .await?;
    if let Some(aged) = &settings.aged {
        setup_request(
            http,
            Method::PUT,
            &format!("/v1/topics/{}", aged.topic),
            &json!({"retention": {"max_age_ms": aged.max_age_ms}}),
            Duration::from_secs(30),
        )
        .await?;
    }
    Ok(())
}

/// Runs the publishers, consumers and holders until the deadline or the op budget.
pub async fn run(ctx: &Ctx) {
    let publishers = (0..ctx.settings.publishers).map(|slot| super::publisher(ctx, slot));
    let consumers = (0..ctx.settings.consumers).map(|slot| consumer(ctx, slot));
    let holders = (0..ctx.settings.holders).map(|slot| holder(ctx, slot));
    let aged = async {
        if let Some(aged) = &ctx.settings.aged {
            let slot = ctx.settings.publishers;
            super::publish_to(ctx, slot, &aged.topic, "a0").await;
        }
    };
    futures::future::join4(
        futures::future::join_all(publishers),
        futures::future::join_all(consumers),
        futures::future::join_all(holders),
        aged,
    )
    .await;
}

/// A holder: every [`HOLD_PULL_EVERY`], pulls up to [`HOLD_PULL_MAX`] records and keeps them
/// for a random part of their lease ([`HOLD_FRACTION`], never past the end of the workload
/// phase) before acking them, so that many leases are held at once, each at its own point.
/// Each held batch is acked by a process of its own.
async fn holder(ctx: &Ctx, slot: usize) {
    use futures::StreamExt as _;
    use rand::{Rng as _, SeedableRng as _};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Vec<Message>, Instant)>();
    let puller = async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(slot as u64);
        let mut client = Client::new(&ctx.history, super::first_node(ctx, slot + 2));
        let name = format!("h{slot}");
        while ctx.may_invoke() {
            let messages = pull_live(ctx, &mut client, HOLD_PULL_MAX, &name).await;
            if let Some(messages) = messages.filter(|m| !m.is_empty()) {
                let keep = ctx.settings.ack_timeout_ms as f64 * rng.gen_range(HOLD_FRACTION);
                let until = (Instant::now() + Duration::from_millis(keep as u64)).min(ctx.deadline);
                let _ = tx.send((messages, until));
            }
            tokio::time::sleep(HOLD_PULL_EVERY).await;
        }
    };
    let releaser = async {
        let mut held = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                got = rx.recv() => match got {
                    Some((messages, until)) => held.push(release(ctx, slot, messages, until)),
                    None => break,
                },
                Some(()) = held.next(), if !held.is_empty() => {}
            }
        }
        while held.next().await.is_some() {}
    };
    futures::future::join(puller, releaser).await;
}

/// Acks a holder's batch at `until`, as a process of its own.
async fn release(ctx: &Ctx, slot: usize, messages: Vec<Message>, until: Instant) {
    tokio::time::sleep_until(until.into()).await;
    let mut client = Client::new(&ctx.history, super::first_node(ctx, slot + 2));
    ack(
        ctx,
        &mut client,
        &messages,
        ACK_ATTEMPTS,
        ctx.deadline + ACK_GRACE,
    )
    .await;
}

async fn consumer(ctx: &Ctx, slot: usize) {
    let mut client = Client::new(&ctx.history, super::first_node(ctx, slot + 1));
    let consumer_name = format!("c{slot}");
    while ctx.may_invoke() {
        let messages = pull_live(ctx, &mut client, ctx.settings.pull_max, &consumer_name).await;
        if let Some(messages) = messages {
            if !messages.is_empty() {
                // Retries may run a little past the deadline: a definite answer is worth it.
                let until = ctx.deadline + ACK_GRACE;
                ack(ctx, &mut client, &messages, ACK_ATTEMPTS, until).await;
            }
        }
    }
}

/// One pull, recorded. `Some(messages)` when it was ok.
/// A pull of the workload phase: the run's long-poll, not the final drain.
async fn pull_live(
    ctx: &Ctx,
    client: &mut Client,
    max: u32,
    consumer: &str,
) -> Option<Vec<Message>> {
    pull(ctx, client, max, ctx.settings.wait_ms, consumer, false).await
}

async fn pull(
    ctx: &Ctx,
    client: &mut Client,
    max: u32,
    wait_ms: u64,
    consumer: &str,
    final_drain: bool,
) -> Option<Vec<Message>> {
    let (topic, sub) = (&ctx.settings.topic, &ctx.settings.subscription);
    let op = if final_drain {
        Op::final_pull(topic, sub)
    } else {
        Op::pull(topic, sub)
    };
    let body = json!({"max": max, "wait_ms": wait_ms, "consumer": consumer});
    let (answer, ok) = call(
        ctx,
        client,
        op,
        Method::POST,
        &ctx.topic_path(&format!("/subscriptions/{sub}/pull")),
        Some(&body),
        ctx.timeout_with_wait(wait_ms),
        |r: &PullResponse| OpResult::pull(&r.messages),
    )
    .await;
    let out = ok.map(|r| {
        let n = r.messages.len() as u64;
        ctx.progress
            .received
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r.messages
    });
    client.after(ctx, &answer);
    back_off(&answer).await;
    out
}

/// Acks `messages`, recorded; sends the ack again after a failure or an unknown outcome, at
/// most `attempts` times and not after `until` (the first attempt is always made). Returns how
/// many receipts the `ok` answer said were `acked`, or `None` when no answer was `ok`.
async fn ack(
    ctx: &Ctx,
    client: &mut Client,
    messages: &[Message],
    attempts: usize,
    until: Instant,
) -> Option<usize> {
    let (topic, sub) = (&ctx.settings.topic, &ctx.settings.subscription);
    let pairs: Vec<(String, String)> = messages
        .iter()
        .map(|m| {
            let d = Delivery::from_message(m);
            (d.receipt, d.value)
        })
        .collect();
    let receipts: Vec<&str> = pairs.iter().map(|(r, _)| r.as_str()).collect();
    let body = json!({ "receipts": receipts });
    let path = ctx.topic_path(&format!("/subscriptions/{sub}/ack"));
    for attempt in 0..attempts {
        if attempt > 0 && Instant::now() >= until {
            break;
        }
        let (answer, ok) = call(
            ctx,
            client,
            Op::ack(topic, sub, pairs.clone()),
            Method::POST,
            &path,
            Some(&body),
            ctx.settings.request_timeout,
            |r: &ReceiptResults| OpResult::Receipts {
                results: r.results.clone(),
            },
        )
        .await;
        client.after(ctx, &answer);
        if let Some(results) = ok {
            let acked = results
                .results
                .iter()
                .filter(|r| r.status == ReceiptStatus::Acked)
                .count();
            return Some(acked);
        }
        back_off(&answer).await;
    }
    None
}

/// How the final drain went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainReport {
    /// The subscription was empty at the end.
    pub complete: bool,
    pub pulls: u64,
    pub delivered: u64,
    /// Receipts the drain's acks answered `acked`.
    pub acked: u64,
    /// Receipts the drain pulled and could not get answered `acked` (their leases expire and
    /// the records come again).
    pub unacked: u64,
    /// The last subscription and topic state seen.
    pub cursor: Option<u64>,
    pub next_offset: Option<u64>,
    pub in_flight: Option<u64>,
    /// The subscription's count of acked records, as last seen.
    pub server_acked: Option<u64>,
    pub millis: u64,
}

/// Pulls and acks until the subscription is empty (bounded by the drain timeout).
pub async fn final_drain(ctx: &Ctx, leader: u64) -> DrainReport {
    let started = Instant::now();
    let deadline = started + ctx.settings.drain_timeout;
    let mut client = Client::new(&ctx.history, leader);
    let mut report = DrainReport::default();
    let sub = ctx.settings.subscription.clone();
    while Instant::now() < deadline {
        report.pulls += 1;
        let messages = pull(
            ctx,
            &mut client,
            DRAIN_PULL_MAX,
            DRAIN_WAIT_MS,
            "final-drain",
            true,
        )
        .await;
        match messages {
            Some(messages) if !messages.is_empty() => {
                report.delivered += messages.len() as u64;
                let acked = ack(ctx, &mut client, &messages, DRAIN_ACK_ATTEMPTS, deadline)
                    .await
                    .unwrap_or(0);
                report.acked += acked as u64;
                report.unacked += (messages.len() - acked) as u64;
            }
            Some(_) => {
                let timeout = ctx.settings.request_timeout;
                let info: Option<SubscriptionInfo> = ctx
                    .http
                    .get_json(
                        client.node,
                        &ctx.topic_path(&format!("/subscriptions/{sub}")),
                        timeout,
                    )
                    .await;
                let topic: Option<TopicInfo> = ctx
                    .http
                    .get_json(client.node, &ctx.topic_path(""), timeout)
                    .await;
                report.cursor = info.as_ref().map(|i| i.cursor);
                report.in_flight = info.as_ref().map(|i| i.in_flight);
                report.server_acked = info.as_ref().map(|i| i.acked);
                report.next_offset = topic.as_ref().map(|t| t.summary.next_offset);
                if let (Some(info), Some(topic)) = (info, topic) {
                    if info.cursor >= topic.summary.next_offset && info.in_flight == 0 {
                        report.complete = true;
                        break;
                    }
                }
            }
            None => {}
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    report
}
