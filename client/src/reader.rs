//! [`Reader`]: follows a topic, and optionally a subscription's cursor, with long-poll reads
//! (stream semantics).

use std::time::Duration;

use crate::api::{ReadFrom, ReadResponse};
use crate::client::check_name;
use crate::transport::jittered;
use crate::{Client, Error, ReadOptions};

/// Default long-poll wait of [`Reader::next_batch`].
pub const DEFAULT_READ_WAIT: Duration = Duration::from_secs(10);

/// First pause after a failed read; doubled after each failure in a row.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// Longest pause between failed reads.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Reads a topic batch after batch, each read starting where the previous one ended.
///
/// With a subscription ([`Reader::new`]), the reader follows the subscription's cursor: the
/// first batch starts at the cursor (or at [`Reader::start`]), and every later read passes the
/// previous batch's `next_offset` as `from`, which moves the cursor past the previous batch.
/// So **a batch is committed when the next one is asked for**: a reader that crashes, or is
/// dropped, after handling a batch but before asking for the next one sees that batch again
/// the next time it starts (at-least-once). [`Reader::commit`] commits the last batch without
/// reading on, for a clean exit.
///
/// Without a subscription ([`Reader::for_topic`]) the reader just reads on from
/// [`Reader::start`] (default: the first retained record).
///
/// Failover errors ([`Error::Unavailable`]: no node or no leader answered within the client's
/// deadline) are retried with a backoff (100 ms doubling up to 2 s) until a read succeeds
/// (or for as long as [`Reader::retry_for`] says), so
/// [`Reader::next_batch`] survives leader changes. A read that moves the cursor is a write (a
/// follower redirects it to the leader) and safe to repeat: the cursor only moves forward to
/// `from`. The futures of `next_batch` and `commit` are cancel-safe: dropping one (say, on a
/// time-out) leaves the reader where it was.
///
/// ```no_run
/// # use raftq_client::{Client, Reader};
/// # async fn demo(client: Client) -> Result<(), raftq_client::Error> {
/// let mut reader = Reader::new(client, "orders", "audit")?;
/// loop {
///     let batch = reader.next_batch().await?; // also commits the previous batch
///     for record in &batch.records {
///         println!("{} {:?}", record.offset, record.value);
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Reader {
    client: Client,
    topic: String,
    /// The subscription, the size of a batch and the wait of each read (`from` is set per
    /// read).
    options: ReadOptions,
    start: Option<ReadFrom>,
    /// The `next_offset` of the last batch: where the next read starts.
    next: Option<u64>,
    /// How long failover errors are retried; `None`: until a read succeeds.
    retry_for: Option<Duration>,
}

impl Reader {
    /// A reader that follows (and commits) `subscription`'s cursor on `topic`.
    pub fn new(
        client: Client,
        topic: impl Into<String>,
        subscription: impl Into<String>,
    ) -> Result<Reader, Error> {
        let subscription = subscription.into();
        check_name("subscription", &subscription)?;
        let mut reader = Reader::for_topic(client, topic)?;
        reader.options.subscription = Some(subscription);
        Ok(reader)
    }

    /// A reader of `topic` that tracks its position itself, starting at the first retained
    /// record unless [`Reader::start`] says otherwise.
    pub fn for_topic(client: Client, topic: impl Into<String>) -> Result<Reader, Error> {
        let topic = topic.into();
        check_name("topic", &topic)?;
        Ok(Reader {
            client,
            topic,
            options: ReadOptions::new().wait(DEFAULT_READ_WAIT),
            start: None,
            next: None,
            retry_for: None,
        })
    }

    /// Where the first batch starts. With a subscription, an offset above its cursor moves the
    /// cursor there first (everything before it counts as done).
    pub fn start(mut self, from: ReadFrom) -> Self {
        self.start = Some(from);
        self
    }

    /// At most `max` records per batch (default: the server's).
    pub fn max(mut self, max: u64) -> Self {
        self.options.max = Some(max);
        self
    }

    /// At most about `max_bytes` of values per batch (at least one record when any is there).
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.options.max_bytes = Some(max_bytes);
        self
    }

    /// Long-poll each read for up to `wait` (at most 30 s; default 10 s; zero answers at once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = (!wait.is_zero()).then_some(wait);
        self
    }

    /// Stop retrying failover errors `limit` after a call's first failure, and return the error
    /// ([`Error::Unavailable`]). Default: retry until a read succeeds. Each attempt is a whole
    /// [`Client::read`], itself retried within the client's deadline, so `Duration::ZERO` means
    /// "as patient as one client call".
    pub fn retry_for(mut self, limit: Duration) -> Self {
        self.retry_for = Some(limit);
        self
    }

    /// Changes the most records of the next batches.
    pub fn set_max(&mut self, max: Option<u64>) {
        self.options.max = max;
    }

    /// Where the next batch starts: the `next_offset` of the last batch, `None` before the
    /// first one.
    pub fn next_offset(&self) -> Option<u64> {
        self.next
    }

    /// The next records: at the cursor (or the start) for the first call, then after the
    /// previous batch, committing it. Waits up to the long-poll wait for a record; an empty
    /// batch means none came. Retries failover errors; returns definite errors (a missing
    /// topic or subscription, a refused token, an invalid option).
    pub async fn next_batch(&mut self) -> Result<ReadResponse, Error> {
        let from = match self.next {
            Some(next) => Some(ReadFrom::Offset(next)),
            None => match (self.start, &self.options.subscription) {
                (Some(start), _) => Some(start),
                (None, Some(_)) => None,
                (None, None) => Some(ReadFrom::First),
            },
        };
        let options = ReadOptions {
            from,
            ..self.options.clone()
        };
        let batch = self.read_retrying(&options).await?;
        self.next = Some(batch.next_offset);
        Ok(batch)
    }

    /// With a subscription: moves its cursor past the last batch without reading on (a read of
    /// at most one record from the last batch's `next_offset`, whose answer is dropped), so
    /// that the next reader of the subscription starts after it. Does nothing before the first
    /// batch or without a subscription.
    pub async fn commit(&mut self) -> Result<(), Error> {
        let (Some(next), Some(subscription)) = (self.next, &self.options.subscription) else {
            return Ok(());
        };
        let options = ReadOptions {
            from: Some(ReadFrom::Offset(next)),
            subscription: Some(subscription.clone()),
            max: Some(1),
            max_bytes: None,
            wait: None,
        };
        self.read_retrying(&options).await.map(drop)
    }

    async fn read_retrying(&self, options: &ReadOptions) -> Result<ReadResponse, Error> {
        let mut backoff = RETRY_INITIAL;
        let started = tokio::time::Instant::now();
        loop {
            match self.client.read(&self.topic, options).await {
                Ok(batch) => return Ok(batch),
                Err(err @ (Error::Unavailable { .. } | Error::Indeterminate { .. }))
                    if self.retry_for.is_none_or(|limit| started.elapsed() < limit) =>
                {
                    tracing::warn!(error = %err, topic = %self.topic, "read failed, retrying");
                    tokio::time::sleep(jittered(backoff)).await;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
                Err(err) => return Err(err),
            }
        }
    }
}
