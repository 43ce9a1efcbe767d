//! Rust SDK for raftq, a replicated message queue on Raft, over its HTTP/JSON API (API.md).
//!
//! A [`Client`] knows a few node URLs, finds the leader by itself, follows the leader when it
//! moves, and retries what is safe to retry within a deadline. It never reports a write as
//! failed when it may have happened: an outcome it cannot know is reported as
//! [`Error::Indeterminate`].
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use raftq_client::api::{ReadFrom, RecordIn, TopicConfig};
//! use raftq_client::{Client, ReadOptions};
//!
//! # async fn run() -> Result<(), raftq_client::Error> {
//! let client = Client::builder(["http://10.0.0.1:7001", "http://10.0.0.2:7001"])
//!     .token("s3cret")
//!     .deadline(Duration::from_secs(10))
//!     .build()?;
//! client.create_topic("orders", &TopicConfig::default()).await?;
//!
//! let ack = client
//!     .publish_records("orders", vec![RecordIn::text("order 17 placed").with_key("order-17")])
//!     .await?;
//!
//! let read = client
//!     .read(
//!         "orders",
//!         &ReadOptions::new()
//!             .from(ReadFrom::Offset(ack.first_offset))
//!             .wait(Duration::from_secs(5)),
//!     )
//!     .await?;
//! for record in &read.records {
//!     println!("{} {:?}", record.offset, record.value);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Producing
//!
//! A [`Producer`] publishes a stream of records to one topic: it batches them (by count, bytes
//! and linger time), keeps several batches in flight while the topic still gets them in send
//! order, and makes every batch idempotent (`producer_id` + `sequence`), so a batch whose
//! answer was lost is sent again with the same sequence until its outcome is known and is never
//! appended twice. `send` waits when the buffer is full; [`Producer::commit_point`] is the
//! highest local sequence up to which every record is committed or definitely failed.
//!
//! With a spool directory, `send` returns only once the record's batch is fsynced there, and a
//! producer killed at any moment and opened again on the same spool re-sends what was pending
//! with the original sequences: it loses nothing it accepted and duplicates nothing.
//!
//! ```no_run
//! use std::time::Duration;
//! use raftq_client::api::RecordIn;
//! use raftq_client::{Client, Producer, ProducerOptions, SendError};
//!
//! # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
//! let producer = Producer::open(
//!     client,
//!     "orders",
//!     ProducerOptions::new()
//!         .linger(Duration::from_millis(10))
//!         .spool("/var/lib/orders-producer/spool"),
//! )
//! .await?;
//! if producer.recovered().records > 0 {
//!     println!("re-sending {} records from before the restart", producer.recovered().records);
//! }
//! let mut deliveries = Vec::new();
//! for i in 0..1_000 {
//!     let record = RecordIn::text(format!("order {i} placed")).with_key(format!("order-{i}"));
//!     deliveries.push(producer.send(record).await?); // accepted: fsynced in the spool
//! }
//! for delivery in deliveries {
//!     match delivery.await {
//!         Ok(offset) => println!("committed at offset {offset}"),
//!         Err(SendError::Refused(problem)) => println!("not appended: {problem}"),
//!         Err(other) => println!("{other}"),
//!     }
//! }
//! producer.close().await?; // waits for every outcome, compacts the spool
//! # Ok(())
//! # }
//! ```
//!
//! The [`producer`] module documents the rules: what each [`SendError`] means for the record,
//! when the producer stops with a [`ProducerError`], and how the spool recovers.
//!
//! # Consuming a subscription
//!
//! A [`Subscriber`] pulls leased messages, runs a handler per message, extends the leases of
//! messages still being handled, acks on `Ok` and nacks (releases for redelivery) on `Err`. It
//! rides out leader changes, and stops gracefully: running handlers get a grace period, and
//! every message pulled but not handled is released at once and listed in the [`StopReport`].
//!
//! ```no_run
//! use std::time::Duration;
//! use raftq_client::api::{SubscriptionConfig, SubscriptionStart};
//! use raftq_client::{Client, Subscriber, SubscriberOptions};
//!
//! # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
//! client
//!     .create_subscription(
//!         "orders",
//!         "billing",
//!         &SubscriptionConfig {
//!             start: SubscriptionStart::First,
//!             ack_timeout_ms: Some(30_000),
//!             max_deliveries: Some(5),
//!             dead_letter_topic: Some("orders.dlq".to_string()),
//!         },
//!     )
//!     .await?;
//!
//! let subscriber = Subscriber::new(
//!     client,
//!     "orders",
//!     "billing",
//!     SubscriberOptions::new()
//!         .concurrency(8)
//!         .stop_grace(Duration::from_secs(5)),
//! )?;
//! let stop = subscriber.stop_handle();
//! tokio::spawn(async move {
//!     let _ = tokio::signal::ctrl_c().await;
//!     stop.stop(); // graceful: see the `subscriber` module
//! });
//!
//! let report = subscriber
//!     .run(|message| async move {
//!         let order = String::from_utf8(message.value_bytes())?;
//!         println!("billing offset {} (delivery {}): {order}", message.offset, message.delivery_count);
//!         Ok::<(), std::string::FromUtf8Error>(()) // Ok acks, Err releases for redelivery
//!     })
//!     .await?;
//! println!(
//!     "acked {}, released at stop {:?}, not settled {:?}",
//!     report.acked, report.released_on_stop, report.unsettled
//! );
//! # Ok(())
//! # }
//! ```
//!
//! Delivery is at least once: a message whose ack is lost, or whose lease expires, is handled
//! again. For stream semantics, a [`Reader`] follows a subscription's cursor with long-poll
//! reads, committing each batch when it asks for the next. The single calls are there too:
//! [`Client::pull`], [`Client::ack`], [`Client::nack`], [`Client::extend`],
//! [`Client::set_cursor`].
//!
//! # Leaders and nodes
//!
//! Writes go to the last node known to lead; with none known, to the next node in the list.
//! A follower answers `307` with the leader's address: the client re-sends the same request
//! there (at most 5 redirects in a row) and remembers that leader, also for reads, so a
//! caller reads its own acknowledged writes. Reads fall back to the other nodes when the
//! leader cannot be reached. Nodes named by redirects are added to the list.
//!
//! # Deadlines, retries and what an error means for a write
//!
//! Every call has a deadline (default 30 s, plus the wait of a long-poll read) covering all its
//! attempts; each attempt has its own time-out (default 10 s, plus the wait). Between attempts
//! the client pauses 25 ms, doubling up to 1 s, with jitter; a server's `Retry-After` is
//! honoured up to 1 s.
//!
//! Some answers prove the request was **not applied**, so re-sending it is always safe:
//! a `307` redirect, a `503` with code `no_leader` or `shutting_down`, a `429` `overloaded`,
//! and a connection that could not be opened (refused, unreachable, connect time-out). The
//! client retries these for every call, moving to another node where that helps.
//!
//! Other failures leave the outcome **unknown**: a time-out after the request was sent, a reset
//! connection, any other `5xx` (with or without a problem body). What happens then depends on
//! the call:
//!
//! - Reads (`GET`) are retried, on any node, until the deadline.
//! - [`Client::create_topic`], [`Client::delete_topic`], and a [`Client::publish`] with both
//!   `producer_id` and `sequence` are retried too, because applying them twice has the effect
//!   of applying them once (the server deduplicates a re-sent batch and answers its original
//!   offsets with `duplicate: true`).
//! - The subscription calls are all retried too: [`Client::create_subscription`] and
//!   [`Client::delete_subscription`] like topics; [`Client::ack`], [`Client::nack`],
//!   [`Client::extend`] and [`Client::set_cursor`] because applying them twice has the effect of
//!   applying them once (a re-sent ack or nack answers `stale` for the receipts its lost first
//!   attempt already settled, so after a retry `stale` does not mean the ack failed); and
//!   [`Client::pull`] because a second pull loses nothing: the records leased by an answer that
//!   never arrived are delivered again when their lease expires (with a higher
//!   `delivery_count`, possibly to another consumer).
//! - A publish without `producer_id` + `sequence` (also [`Client::publish_records`] and
//!   [`Client::publish_bytes`]) is **never** re-sent after such a failure: re-sending could
//!   append the records twice. The call returns [`Error::Indeterminate`] at once, and it was
//!   sent exactly once.
//!
//! When the deadline passes, a call returns [`Error::Unavailable`] if no attempt can have been
//! applied (only refusals and failed connects), and [`Error::Indeterminate`] if some attempt
//! of a write may have been. A `4xx` problem is a definite refusal and is returned at once as
//! [`Error::Api`], which therefore always means "this call had no effect"; the one exception
//! proves the rule: a refusal that follows an attempt which may have been applied is reported
//! as [`Error::Indeterminate`]. A success status is a definite "applied" (if its body cannot
//! be parsed, the error is [`Error::Decode`]).
//!
//! # Layout
//!
//! - [`api`]: the JSON types of API.md, shared with the server.
//! - `client`: [`Client`], [`ClientBuilder`], [`ReadOptions`]; one method per API call, each
//!   choosing how its call may be retried.
//! - `transport`: node list, leader tracking, redirects, the retry loop and the classification
//!   of every answer as "applied", "not applied" or "unknown".
//! - `error`: [`Error`].
//! - [`producer`]: [`Producer`], its options, [`Delivery`] and errors.
//! - `spool`: the producer's durable spool (an append-only file of checksummed entries).
//! - [`subscriber`]: [`Subscriber`], its options, stop handle and report.
//! - `reader`: [`Reader`].

pub mod api;
/// Kafka's record batch format, the body of a binary publish: the `raftq-batch` crate.
pub use raftq_batch as batch;
mod client;
mod error;
pub mod producer;
mod reader;
mod spool;
pub mod subscriber;
mod transport;

pub use client::{
    Client, ClientBuilder, PublishFormat, ReadFormat, ReadOptions, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DEADLINE, DEFAULT_REQUEST_TIMEOUT,
};
pub use error::Error;
pub use producer::{
    Delivery, Producer, ProducerError, ProducerOptions, ProducerStats, Recovered, SendError,
};
pub use reader::{Reader, DEFAULT_READ_WAIT};
pub use subscriber::{RunError, StopHandle, StopReport, Subscriber, SubscriberOptions};

#[cfg(test)]
mod producer_tests;
#[cfg(test)]
mod tests;
