//! The queue workload: publishers, consumers that pull and ack, and the final drain.
//!
//! - One topic and one subscription (lease `ack_timeout_ms`, no `max_deliveries`: nothing is
//!   ever dead-lettered, so every published value must eventually be delivered).
//! - Publishers publish one unique value per request, `p<process>-<seq>`.
//! - Consumers pull (`max`, `wait_ms`) and ack everything they got; a definitely failed ack
//!   is retried (a few times, on the node the answer pointed to); an unknown one is not (the
//!   lease expires and the record comes again).
//! - The final drain, after the faults are healed and a leader is agreed on, pulls and acks
//!   until the subscription is empty: its cursor has reached the topic's next offset and
//!   nothing is in flight.

use std::time::{Duration, Instant};

use raftq_client::api::{Message, PullResponse, ReceiptResults, SubscriptionInfo, TopicInfo};
use reqwest::Method;
use serde::Serialize;
use serde_json::json;

use super::http::{Class, Http};
use super::{back_off, call, create_topic, setup_request, Client, Ctx, Settings};
use crate::history::{Delivery, Op, OpResult};

/// Most attempts at acking one pull's receipts.
const ACK_ATTEMPTS: usize = 3;
/// Pull size and long-poll of the final drain.
const DRAIN_PULL_MAX: u32 = 500;
const DRAIN_WAIT_MS: u64 = 1000;

/// Creates the topic and the subscription.
pub async fn setup(http: &Http, settings: &Settings) -> anyhow::Result<()> {
    create_topic(http, &settings.topic).await?;
    setup_request(
        http,
        Method::PUT,
        &format!(
            "/v1/topics/{}/subscriptions/{}",
            settings.topic, settings.subscription
        ),
        &json!({"start": "first", "ack_timeout_ms": settings.ack_timeout_ms}),
        Duration::from_secs(30),
    )
    .await
    .map(drop)
}

/// Runs the publishers and consumers until the deadline or the op budget.
pub async fn run(ctx: &Ctx) {
    let publishers = (0..ctx.settings.publishers).map(|slot| super::publisher(ctx, slot));
    let consumers = (0..ctx.settings.consumers).map(|slot| consumer(ctx, slot));
    futures::future::join(
        futures::future::join_all(publishers),
        futures::future::join_all(consumers),
    )
    .await;
}

async fn consumer(ctx: &Ctx, slot: usize) {
    let mut client = Client::new(&ctx.history, super::first_node(ctx, slot + 1));
    let consumer_name = format!("c{slot}");
    while ctx.may_invoke() {
        let messages = pull(
            ctx,
            &mut client,
            ctx.settings.pull_max,
            ctx.settings.wait_ms,
            &consumer_name,
            false,
        )
        .await;
        if let Some(messages) = messages {
            if !messages.is_empty() {
                ack(ctx, &mut client, &messages).await;
            }
        }
    }
}

/// One pull, recorded. `Some(messages)` when it was ok.
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

/// Acks `messages`, recorded; retries a definitely failed ack a few times. True when an ack
/// was ok.
async fn ack(ctx: &Ctx, client: &mut Client, messages: &[Message]) -> bool {
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
    for _ in 0..ACK_ATTEMPTS {
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
        if ok.is_some() {
            client.after(ctx, &answer);
            return true;
        }
        client.after(ctx, &answer);
        if answer.class == Class::Info {
            return false; // unknown: the lease expires if it did not happen
        }
        back_off(&answer).await;
    }
    false
}

/// How the final drain went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DrainReport {
    /// The subscription was empty at the end.
    pub complete: bool,
    pub pulls: u64,
    pub delivered: u64,
    /// The last subscription and topic state seen.
    pub cursor: Option<u64>,
    pub next_offset: Option<u64>,
    pub in_flight: Option<u64>,
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
                ack(ctx, &mut client, &messages).await;
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
