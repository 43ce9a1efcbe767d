//! The stream workload: publishers, and readers that move subscription cursors by reading
//! with `from=next_offset`.
//!
//! - Publishers as in the queue workload: one unique value per request.
//! - Each reader has a subscription of its own (`<subscription>-r<slot>`, start `first`), so
//!   that the poll checks can hold each subscription to one process at a time. A reader reads
//!   `?subscription=S&from=N` with N the previous answer's `next_offset`: the read also says
//!   "everything before N is done" and moves the cursor forward (a write: a follower answers
//!   307, followed to the leader). A fresh process (the first, or one after `info`) reads
//!   without `from`, resuming at the subscription's cursor.
//! - After every `ok` read the reader records the subscription's cursor as the server holds
//!   it, for the checker's `cursor_backward`: a `PUT .../cursor` with the offset the read
//!   started at and `allow_backward: false` (an [`Op::SetCursor`]). That read left the cursor
//!   exactly there (or higher, when a retired process's move landed late), so the move
//!   changes nothing and its answer is the cursor. The probe is a write, committed through
//!   the leader, so what it reports is the replicated state, not one replica's possibly
//!   lagging view (`GET .../subscriptions/{sub}` is served from the answering node's applied
//!   state, and a lagging follower would report an older cursor that is no anomaly). A probe
//!   refused because the cursor is already higher (400) records nothing about the cursor.
//! - The final phase is the final read through every node (see [`super::final_reads`]).

use raftq_client::api::{CursorResponse, ReadResponse};
use reqwest::Method;
use serde_json::json;

use super::http::Http;
use super::{back_off, call, create_subscription, create_topic, Client, Ctx, Settings};
use crate::history::{Op, OpResult};

/// Most records one read asks for.
const READ_MAX: u64 = 100;

/// The subscription of reader `slot`.
fn reader_subscription(settings: &Settings, slot: usize) -> String {
    format!("{}-r{slot}", settings.subscription)
}

/// Creates the topic and one subscription per reader.
pub async fn setup(http: &Http, settings: &Settings) -> anyhow::Result<()> {
    create_topic(http, &settings.topic).await?;
    for slot in 0..settings.consumers {
        let subscription = reader_subscription(settings, slot);
        create_subscription(
            http,
            &settings.topic,
            &subscription,
            &json!({"start": "first"}),
        )
        .await?;
    }
    Ok(())
}

/// Runs the publishers and readers until the deadline or the op budget.
pub async fn run(ctx: &Ctx) {
    let publishers = (0..ctx.settings.publishers).map(|slot| super::publisher(ctx, slot));
    let readers = (0..ctx.settings.consumers).map(|slot| reader(ctx, slot));
    futures::future::join(
        futures::future::join_all(publishers),
        futures::future::join_all(readers),
    )
    .await;
}

async fn reader(ctx: &Ctx, slot: usize) {
    let sub = reader_subscription(&ctx.settings, slot);
    let mut client = Client::new(&ctx.history, super::first_node(ctx, slot + 1));
    // Where this process's next read starts; `None`: at the subscription's cursor.
    let mut from: Option<u64> = None;
    let mut process = client.process;
    let wait_ms = ctx.settings.wait_ms;
    while ctx.may_invoke() {
        if client.process != process {
            // A fresh process resumes at the cursor, as a restarted consumer would.
            (process, from) = (client.process, None);
        }
        let mut path = ctx.topic_path(&format!(
            "/records?subscription={sub}&max={READ_MAX}&wait_ms={wait_ms}"
        ));
        if let Some(n) = from {
            path.push_str(&format!("&from={n}"));
        }
        let (answer, ok) = call(
            ctx,
            &client,
            Op::read(&ctx.settings.topic, Some(&sub), from),
            Method::GET,
            &path,
            None,
            ctx.timeout_with_wait(wait_ms),
            |r: &ReadResponse| OpResult::read(r, None),
        )
        .await;
        client.after(ctx, &answer);
        back_off(&answer).await;
        let Some(r) = ok else { continue };
        ctx.progress
            .received
            .fetch_add(r.records.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let started_at =
            from.unwrap_or_else(|| r.records.first().map_or(r.next_offset, |rec| rec.offset));
        from = Some(r.next_offset);
        if !ctx.may_invoke() {
            break;
        }
        let answer = probe_cursor(ctx, &client, &sub, started_at).await;
        client.after(ctx, &answer);
        back_off(&answer).await;
    }
}

/// Records the subscription's cursor: a cursor move to `offset`, where the reader's last read
/// left it, that never moves it back (see the module documentation).
async fn probe_cursor(ctx: &Ctx, client: &Client, sub: &str, offset: u64) -> super::http::Answer {
    let body = json!({"offset": offset, "allow_backward": false});
    let (answer, _) = call(
        ctx,
        client,
        Op::set_cursor(&ctx.settings.topic, sub, offset, false),
        Method::PUT,
        &ctx.topic_path(&format!("/subscriptions/{sub}/cursor")),
        Some(&body),
        ctx.settings.request_timeout,
        |r: &CursorResponse| OpResult::Cursor { cursor: r.cursor },
    )
    .await;
    answer
}
