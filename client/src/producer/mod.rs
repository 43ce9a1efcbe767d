//! [`Producer`]: publishes records in batches, several batches in flight, in order, each batch
//! idempotent (`producer_id` + `sequence`), with bounded memory and an optional durable spool.
//!
//! # Life of a record
//!
//! 1. [`Producer::send`] waits for room in the buffer (at most `buffer_records` records and
//!    `buffer_bytes` bytes held at once: a full buffer makes `send` wait, it never grows), gives
//!    the record the next **local sequence number** (0, 1, 2, … per producer; continued across
//!    restarts with a spool) and adds it to the open batch.
//! 2. The open batch is sealed when it holds `max_batch_records` records or `max_batch_bytes`
//!    bytes (JSON-encoded), when `linger` has passed since its first record and the batch could
//!    be sent at once (while `max_in_flight` sealed batches are waiting or in flight, it keeps
//!    filling: batches grow with the load, with no timer; a linger that is already over, as a
//!    zero one always is, seals at once, after the tasks that are ready have run; with a spool
//!    it is sealed at `linger` regardless), or on [`Producer::flush`] and [`Producer::close`]. Sealing gives it the next
//!    **batch sequence**. With a spool, the batch is appended to the spool file and fsynced now, and
//!    only then does `send` return: the record is *accepted*. Without one, `send` returns as
//!    soon as the record is in the buffer.
//! 3. Up to `max_in_flight` batches are published at once, in sequence order. The server
//!    appends a batch only when its sequence is the next it expects, so the topic gets the
//!    batches in order even when their requests overtake each other (a batch that arrives too
//!    early is answered `sequence_gap` and sent again once the batch before it is committed).
//! 4. The [`Delivery`] that `send` returned resolves to the record's offset once its batch is
//!    committed, or to a [`SendError`]; the record's room in the buffer is given back.
//!
//! # Retries and what an error means
//!
//! A batch whose outcome is unknown (a time-out, a reset connection, a 5xx, no leader for
//! longer than the client's deadline) is sent again with the **same sequence**, to whichever
//! node leads, until its outcome is known: the server answers a batch it already has with its
//! original offsets (`duplicate`), so a record is never appended twice. This goes on for as
//! long as it takes (a cluster that is down makes `send` wait once the buffer is full).
//!
//! A definite refusal (a 4xx such as `topic_not_found` or `payload_too_large`) fails every
//! record of the batch with [`SendError::Refused`]: they were not appended. The refusal does not
//! consume the batch's sequence, so the batches after it are renumbered (once none of them is in
//! flight) and sent again; their records are unaffected.
//!
//! Some situations leave the producer unable to tell what the server holds; it then stops with
//! an error (every later call returns it) rather than guess:
//!
//! - [`ProducerError::ProducerForgotten`]: the server no longer knows this producer (it forgets
//!   producers idle for 7 days of log time, and the least recently active ones of a topic with
//!   more than 10,000) while a batch whose earlier attempt may have been appended, or a batch
//!   recovered from the spool, is still unsettled. A producer with nothing unsettled just starts
//!   its sequences over at 0.
//! - [`ProducerError::Desynchronized`]: a batch refused after an earlier attempt of it may have
//!   been appended (the topic was deleted meanwhile, say; a refusal of the batch's content,
//!   `payload_too_large` or `invalid_argument`, is definite even then), or answers that
//!   contradict each other (another process using the same producer id).
//!
//! The records without an outcome then resolve to [`SendError::Indeterminate`] (an attempt may
//! have been appended) or [`SendError::NotSent`].
//!
//! # Commit point
//!
//! [`Producer::commit_point`] is the highest local sequence `L` such that every record up to
//! `L` is committed or definitely failed: a checkpoint an application can store and trust.
//!
//! # Durable spool
//!
//! With [`ProducerOptions::spool`], `send` returns only once the record's batch is fsynced in
//! the spool directory, and the batch leaves the spool once it is committed or refused. A
//! producer opened again on the same spool (after a crash, a SIGKILL, or [`Producer::abort`])
//! re-sends what was pending with the original sequences, so the server deduplicates what had
//! already been appended: the producer loses nothing it accepted and appends nothing twice.
//! [`Producer::recovered`] says what it found; [`Producer::next_local_sequence`] says how many
//! records the spool has ever accepted, so an application re-reading its input can skip those.
//! The spool format is described in `spool.rs`; a spool belongs to one topic and one producer id,
//! and is locked while open.
//!
//! Without a spool, a producer starts at batch 0: give it an id that was never used on the
//! topic (the default, a random id, is one). A producer id that is reused without its spool
//! would have its first batches taken for duplicates of the old ones.

mod driver;
pub(crate) mod handle;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use crate::api::{is_valid_name, ErrorCode, Problem, PublishResponse, RecordIn, MAX_BATCH_RECORDS};
pub use crate::error::ProducerError;
use crate::spool::{Op, Spool};
use crate::transport::jittered;
use crate::{Client, Error};
use driver::Driver;

/// Default time a batch waits for more records after its first one: none. A batch is sealed
/// at once only when it can be sent at once; while the pipeline is full it keeps filling, so
/// batches grow with the load without a timer adding latency when the load is light.
pub const DEFAULT_LINGER: Duration = Duration::ZERO;
/// Default most records per batch.
pub const DEFAULT_MAX_BATCH_RECORDS: usize = 1_000;
/// Default most bytes (JSON-encoded records) per batch.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 1 << 20;
/// Largest `max_batch_bytes` allowed (the server takes request bodies up to 32 MiB).
pub const MAX_BATCH_BYTES: usize = 16 << 20;
/// Default most batches in flight at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 5;
/// Most batches in flight at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// Default most records held (accepted and not yet committed or failed).
pub const DEFAULT_BUFFER_RECORDS: usize = 10_000;
/// Default most bytes held.
pub const DEFAULT_BUFFER_BYTES: usize = 32 << 20;
/// Longest linger allowed.
pub const MAX_LINGER: Duration = Duration::from_secs(60);

/// First pause before a batch is sent again after its outcome stayed unknown; doubled after
/// each failure in a row. The client has already retried within its own deadline.
const RETRY_INITIAL: Duration = Duration::from_millis(50);
/// Longest pause between two sends of a batch.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Most queued messages the driver takes in one go before it looks at the rest of its work.
const DRAIN_LIMIT: usize = 4_096;

/// How a [`Producer`] batches, retries and stores. `Default` is [`ProducerOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerOptions {
    /// The producer id (`[A-Za-z0-9._-]{1,128}`). `None` (the default): the spool's id when
    /// reopening a spool, otherwise a new random id.
    pub producer_id: Option<String>,
    /// How long a batch waits for more records after its first (default 5 ms, at most 60 s).
    pub linger: Duration,
    /// Most records per batch (1 to 10,000; default 1,000).
    pub max_batch_records: usize,
    /// Most bytes of JSON-encoded records per batch (default 1 MiB, at most 16 MiB). A record
    /// larger than this travels alone.
    pub max_batch_bytes: usize,
    /// Most batches in flight at once (1 to 16; default 5).
    pub max_in_flight: usize,
    /// Most records held at once, from `send` until committed or failed (default 10,000).
    pub buffer_records: usize,
    /// Most bytes held at once (default 32 MiB, at most 4 GiB - 1). A record larger than this
    /// is refused by `send`.
    pub buffer_bytes: usize,
    /// A spool directory: accepted records are kept there until committed (see the module
    /// docs). Default none.
    pub spool: Option<PathBuf>,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            producer_id: None,
            linger: DEFAULT_LINGER,
            max_batch_records: DEFAULT_MAX_BATCH_RECORDS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            buffer_records: DEFAULT_BUFFER_RECORDS,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            spool: None,
        }
    }
}

impl ProducerOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this producer id.
    pub fn producer_id(mut self, id: impl Into<String>) -> Self {
        self.producer_id = Some(id.into());
        self
    }

    /// Let a batch wait up to `linger` for more records.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Put at most `records` records in a batch.
    pub fn max_batch_records(mut self, records: usize) -> Self {
        self.max_batch_records = records;
        self
    }

    /// Put at most `bytes` bytes of encoded records in a batch.
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// Keep at most `batches` batches in flight.
    pub fn max_in_flight(mut self, batches: usize) -> Self {
        self.max_in_flight = batches;
        self
    }

    /// Hold at most `records` records.
    pub fn buffer_records(mut self, records: usize) -> Self {
        self.buffer_records = records;
        self
    }

    /// Hold at most `bytes` bytes.
    pub fn buffer_bytes(mut self, bytes: usize) -> Self {
        self.buffer_bytes = bytes;
        self
    }

    /// Keep accepted records in the spool directory `dir` until they are committed.
    pub fn spool(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spool = Some(dir.into());
        self
    }

    fn check(&self) -> Result<(), ProducerError> {
        let invalid = |text: String| Err(ProducerError::InvalidArgument(text));
        if let Some(id) = &self.producer_id {
            if !is_valid_name(id) {
                return invalid(format!(
                    "producer id {id:?} must match [A-Za-z0-9._-]{{1,128}}"
                ));
            }
        }
        if self.linger > MAX_LINGER {
            return invalid(format!(
                "linger is at most {MAX_LINGER:?}, not {:?}",
                self.linger
            ));
        }
        if self.max_batch_records == 0 || self.max_batch_records > MAX_BATCH_RECORDS {
            return invalid(format!(
                "max_batch_records is 1 to {MAX_BATCH_RECORDS}, not {}",
                self.max_batch_records
            ));
        }
        if self.max_batch_bytes == 0 || self.max_batch_bytes > MAX_BATCH_BYTES {
            return invalid(format!(
                "max_batch_bytes is 1 to {MAX_BATCH_BYTES}, not {}",
                self.max_batch_bytes
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return invalid(format!(
                "max_in_flight is 1 to {MAX_IN_FLIGHT}, not {}",
                self.max_in_flight
            ));
        }
        if self.buffer_records == 0 || self.buffer_records > Semaphore::MAX_PERMITS {
            return invalid(format!(
                "buffer_records is 1 to {}, not {}",
                Semaphore::MAX_PERMITS,
                self.buffer_records
            ));
        }
        if self.buffer_bytes == 0 || self.buffer_bytes > u32::MAX as usize {
            return invalid(format!(
                "buffer_bytes is 1 to {}, not {}",
                u32::MAX,
                self.buffer_bytes
            ));
        }
        Ok(())
    }
}

/// Why a record has no offset. Every variant says whether the record may be in the topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The server definitely refused the record's batch (a 4xx problem such as
    /// `topic_not_found` or `payload_too_large`; a refusal applies to the whole batch). The
    /// record was **not** appended.
    #[error("refused, not appended: {0}")]
    Refused(Box<Problem>),
    /// The record **may or may not** have been appended: its batch was in flight, or an attempt
    /// of it was lost, when the producer stopped (see [`ProducerError`] for why). With a spool,
    /// the batch is still there, and a producer opened on the spool settles it.
    #[error("outcome unknown, the record may or may not have been appended: {detail}")]
    Indeterminate {
        /// What happened, for humans.
        detail: String,
    },
    /// The producer stopped before sending the record: it was **not** appended by this
    /// producer. With a spool, an accepted record is still there, and a producer opened on the
    /// spool sends it.
    #[error("not sent, not appended: {detail}")]
    NotSent {
        /// Why, for humans.
        detail: String,
    },
    /// The record **was** committed (exactly once), but the server no longer remembers at
    /// which offset: a batch re-sent long after it was appended (the server keeps the offsets
    /// of each producer's last 64 batches). Never publish it again.
    #[error("committed, but the server no longer remembers the offset of its batch")]
    OffsetUnknown,
}

impl SendError {
    /// True when the record is in the topic ([`SendError::OffsetUnknown`]).
    pub fn is_committed(&self) -> bool {
        matches!(self, SendError::OffsetUnknown)
    }

    /// True when the record may be in the topic: committed with an unknown offset, or an
    /// unknown outcome.
    pub fn may_have_been_appended(&self) -> bool {
        matches!(
            self,
            SendError::OffsetUnknown | SendError::Indeterminate { .. }
        )
    }
}

/// What a producer found in its spool when it was opened: batches accepted by an earlier
/// producer on this spool that were not known to be committed. They are re-sent first, with
/// their original sequences.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Pending batches found.
    pub batches: usize,
    /// Records in them.
    pub records: u64,
    /// The local sequences of the first and last of them (there may be finished records in
    /// between).
    pub local_sequences: Option<RangeInclusive<u64>>,
}

/// Counters of a producer since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Records accepted by `send` (in the spool, with one).
    pub accepted: u64,
    /// Records committed, recovered ones included.
    pub committed: u64,
    /// Committed records whose batch the server answered as a duplicate (an earlier attempt
    /// had been appended and its answer lost, or a recovered batch had been appended before the
    /// restart).
    pub duplicates: u64,
    /// Records definitely refused.
    pub refused: u64,
    /// Records that ended with an unknown outcome or unsent when the producer stopped.
    pub unsettled: u64,
    /// Batches committed.
    pub batches: u64,
    /// Publish calls made (a batch sent again after a lost answer or a `sequence_gap` counts
    /// again).
    pub publish_calls: u64,
    /// `sequence_gap` answers (batches that overtook the one before them).
    pub sequence_gaps: u64,
}

/// The record's outcome, once its batch has one: `.await` it for the offset.
#[derive(Debug)]
pub struct Delivery {
    local_sequence: u64,
    outcome: oneshot::Receiver<Result<u64, SendError>>,
}

impl Delivery {
    /// The record's local sequence number.
    pub fn local_sequence(&self) -> u64 {
        self.local_sequence
    }
}

impl Future for Delivery {
    type Output = Result<u64, SendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.outcome).poll(cx).map(|outcome| {
            outcome.unwrap_or_else(|_| {
                Err(SendError::Indeterminate {
                    detail: "the producer's background task ended (its runtime shut down) \
                             before the record's outcome was known"
                        .to_string(),
                })
            })
        })
    }
}

/// Publishes records to one topic in ordered, idempotent batches: see the [module
/// docs](self). Cheap to clone; clones share the producer. The producer keeps running in the
/// background until it is closed, aborted, or every clone is dropped and everything it
/// accepted has an outcome.
///
/// ```no_run
/// # use std::time::Duration;
/// # use raftq_client::api::RecordIn;
/// # use raftq_client::{Client, Producer, ProducerOptions};
/// # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error>> {
/// let producer = Producer::open(
///     client,
///     "orders",
///     ProducerOptions::new().spool("/var/spool/orders-producer"),
/// )
/// .await?;
/// let delivery = producer.send(RecordIn::text("order 17 placed")).await?; // in the spool
/// let offset = delivery.await?; // committed on a majority
/// println!("offset {offset}, commit point {:?}", producer.commit_point());
/// producer.close().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

impl fmt::Debug for Producer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.inner.topic)
            .field("producer_id", &self.inner.producer_id)
            .field("spool", &self.inner.spool_dir)
            .field("commit_point", &self.commit_point())
            .finish()
    }
}

struct Inner {
    topic: String,
    producer_id: String,
    spool_dir: Option<PathBuf>,
    recovered: Recovered,
    buffer_bytes: usize,
    spooled: bool,
    /// Assigns local sequences and queues records in one step, so the driver sees records in
    /// local-sequence order.
    intake: Mutex<Intake>,
    /// Room in the buffer, in records and in bytes: taken by `send`, given back by the driver
    /// when a record's outcome is known. Closed when the producer stops, which wakes waiters.
    records_room: Arc<Semaphore>,
    bytes_room: Arc<Semaphore>,
    shared: Arc<Shared>,
}

struct Intake {
    next_local: u64,
    /// No more records are taken (close or abort called).
    closed: bool,
    tx: mpsc::UnboundedSender<Msg>,
}

/// State the driver publishes for the handles.
#[derive(Default)]
struct Shared {
    /// The lowest local sequence without an outcome (everything below is committed or definitely
    /// failed).
    commit_below: AtomicU64,
    /// Set once when the driver stops.
    ended: Mutex<Option<Ended>>,
    stats: Counters,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    committed: AtomicU64,
    duplicates: AtomicU64,
    refused: AtomicU64,
    unsettled: AtomicU64,
    batches: AtomicU64,
    publish_calls: AtomicU64,
    sequence_gaps: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// How the driver stopped.
#[derive(Debug, Clone)]
enum Ended {
    /// Closed (or every handle dropped) after everything had an outcome.
    Closed,
    /// Aborted: what had no outcome was left unsettled (and in the spool, with one).
    Aborted,
    /// Stopped by an error.
    Failed(ProducerError),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; if something did, the data is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

type Responder = oneshot::Sender<Result<(), ProducerError>>;

/// What the handles send to the driver.
enum Msg {
    Record(Pending),
    Flush(Responder),
    Close(Responder),
    Abort(oneshot::Sender<()>),
}

/// A record on its way to a batch.
struct Pending {
    local: u64,
    record: RecordIn,
    bytes: usize,
    /// With a spool: told once the record's batch is fsynced.
    accepted: Option<Responder>,
    outcome: oneshot::Sender<Result<u64, SendError>>,
}

/// Where a sealed batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    /// To be sent (first time, or again).
    Ready,
    /// A publish task owns it.
    InFlight,
    /// Answered `sequence_gap` while a batch before it was unsettled: sent again once every
    /// batch before it is committed.
    Gapped,
    /// Committed; its records resolved.
    Committed,
    /// Definitely refused; its records resolved. Removed when the batches after it are
    /// renumbered.
    Refused,
}

/// A sealed batch.
pub(super) struct Slot {
    /// The local sequence of its first record: stable, unlike `seq`.
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) records: Arc<Vec<RecordIn>>,
    /// One per record; empty for a batch recovered from the spool (nobody awaits those).
    pub(super) outcomes: Vec<oneshot::Sender<Result<u64, SendError>>>,
    /// With a spool, until it is written there.
    pub(super) accepted: Vec<Responder>,
    /// Buffer room to give back when it settles.
    pub(super) held_records: usize,
    pub(super) held_bytes: usize,
    pub(super) state: SlotState,
    /// Written to the spool (always true without one).
    pub(super) spooled: bool,
    /// Some attempt may have been appended (or, for a recovered batch, it may have been sent
    /// before the restart).
    pub(super) maybe_applied: bool,
}

impl Slot {
    pub(super) fn settled(&self) -> bool {
        matches!(self.state, SlotState::Committed | SlotState::Refused)
    }

    pub(super) fn last_local(&self) -> u64 {
        self.id + self.records.len() as u64 - 1
    }
}
