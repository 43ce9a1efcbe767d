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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
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

use crate::api::{
    is_valid_name, ErrorCode, Problem, PublishRequest, PublishResponse, RecordIn, MAX_BATCH_RECORDS,
};
pub use crate::error::ProducerError;
use crate::spool::{Op, Spool};
use crate::transport::jittered;
use crate::{Client, Error};

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

impl Producer {
    /// Opens a producer for `topic`. With a spool, the spool is opened (created if needed,
    /// checked to be this topic's and this producer's, locked) and its pending batches are
    /// queued to be sent first. Nothing is sent to the cluster until there is a batch.
    pub async fn open(
        client: Client,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Producer, ProducerError> {
        if !is_valid_name(topic) {
            return Err(ProducerError::InvalidArgument(format!(
                "topic name {topic:?} must match [A-Za-z0-9._-]{{1,128}}"
            )));
        }
        options.check()?;
        let spool = match &options.spool {
            None => None,
            Some(dir) => {
                let (dir, topic, wanted) =
                    (dir.clone(), topic.to_string(), options.producer_id.clone());
                let path = dir.clone();
                let spool = tokio::task::spawn_blocking(move || {
                    Spool::open(&dir, &topic, wanted.as_deref(), random_producer_id)
                })
                .await
                .map_err(|err| ProducerError::Spool {
                    path,
                    detail: format!("opening the spool failed: {err}"),
                })??;
                if !is_valid_name(spool.producer_id()) {
                    return Err(ProducerError::Spool {
                        path: spool.dir().to_path_buf(),
                        detail: format!(
                            "it names producer {:?}, which is not a valid producer id",
                            spool.producer_id()
                        ),
                    });
                }
                Some(spool)
            }
        };
        let producer_id = match &spool {
            Some(spool) => spool.producer_id().to_string(),
            None => options
                .producer_id
                .clone()
                .unwrap_or_else(random_producer_id),
        };

        let mut slots = VecDeque::new();
        let mut recovered = Recovered::default();
        let (next_seq, next_local) = match &spool {
            None => (0, 0),
            Some(spool) => {
                for (first, batch) in spool.pending() {
                    let count = batch.records.len() as u64;
                    recovered.batches += 1;
                    recovered.records += count;
                    let last = first + count - 1;
                    recovered.local_sequences = Some(match recovered.local_sequences {
                        None => *first..=last,
                        Some(range) => *range.start()..=last,
                    });
                    slots.push_back(Slot {
                        id: *first,
                        seq: batch.seq,
                        records: batch.records.clone(),
                        outcomes: Vec::new(),
                        accepted: Vec::new(),
                        held_records: 0,
                        held_bytes: 0,
                        state: SlotState::Ready,
                        spooled: true,
                        // It may have been sent before the restart.
                        maybe_applied: true,
                    });
                }
                (spool.next_seq(), spool.next_local())
            }
        };
        if recovered.batches > 0 {
            tracing::debug!(
                topic,
                producer_id,
                batches = recovered.batches,
                records = recovered.records,
                "re-sending what the spool held"
            );
        }

        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let first_unsettled = slots.front().map_or(next_local, |slot| slot.id);
        shared
            .commit_below
            .store(first_unsettled, Ordering::Relaxed);
        let records_room = Arc::new(Semaphore::new(options.buffer_records));
        let bytes_room = Arc::new(Semaphore::new(options.buffer_bytes));
        let spool_dir = spool.as_ref().map(|spool| spool.dir().to_path_buf());
        let driver = Driver {
            client,
            topic: Arc::from(topic),
            producer_id: Arc::from(producer_id.as_str()),
            linger: options.linger,
            max_batch_records: options.max_batch_records,
            max_batch_bytes: options.max_batch_bytes,
            max_in_flight: options.max_in_flight,
            rx,
            shared: shared.clone(),
            records_room: records_room.clone(),
            bytes_room: bytes_room.clone(),
            spooled: spool.is_some(),
            spool,
            open: Vec::new(),
            open_bytes: 0,
            open_since: None,
            slots,
            next_seq,
            received_below: next_local,
            tasks: JoinSet::new(),
            task_slots: HashMap::new(),
            done: Vec::new(),
            restart_from_zero: None,
            seal_now: false,
            flush_waiters: Vec::new(),
            close_waiters: Vec::new(),
            closing: false,
            intake_done: false,
            refused_waiting: 0,
        };
        tokio::spawn(driver.run());
        Ok(Producer {
            inner: Arc::new(Inner {
                topic: topic.to_string(),
                producer_id,
                spooled: spool_dir.is_some(),
                spool_dir,
                recovered,
                buffer_bytes: options.buffer_bytes,
                intake: Mutex::new(Intake {
                    next_local,
                    closed: false,
                    tx,
                }),
                records_room,
                bytes_room,
                shared,
            }),
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// The producer id sent with every batch.
    pub fn producer_id(&self) -> &str {
        &self.inner.producer_id
    }

    /// The spool directory, if any.
    pub fn spool_dir(&self) -> Option<&Path> {
        self.inner.spool_dir.as_deref()
    }

    /// What the spool held when the producer was opened.
    pub fn recovered(&self) -> &Recovered {
        &self.inner.recovered
    }

    /// The local sequence the next record will get. With a spool, when nothing has been sent
    /// since the producer was opened, this is the number of records the spool has ever
    /// accepted: an application that re-reads the same input after a restart skips that many.
    pub fn next_local_sequence(&self) -> u64 {
        lock(&self.inner.intake).next_local
    }

    /// The highest local sequence `L` such that every record up to `L` is committed or
    /// definitely failed (refused), or `None` while record 0 has no such outcome yet.
    pub fn commit_point(&self) -> Option<u64> {
        self.inner
            .shared
            .commit_below
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// Counters since the producer was opened.
    pub fn stats(&self) -> ProducerStats {
        let c = &self.inner.shared.stats;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ProducerStats {
            accepted: get(&c.accepted),
            committed: get(&c.committed),
            duplicates: get(&c.duplicates),
            refused: get(&c.refused),
            unsettled: get(&c.unsettled),
            batches: get(&c.batches),
            publish_calls: get(&c.publish_calls),
            sequence_gaps: get(&c.sequence_gaps),
        }
    }

    /// Sends one record. Waits for room in the buffer and, with a spool, until the record's
    /// batch is fsynced there; returns its [`Delivery`], which resolves to its offset once it is
    /// committed.
    ///
    /// With a spool, each `send` waits for its batch to be sealed (up to `linger`) and synced;
    /// to publish many records quickly, use [`Producer::send_many`] or several tasks.
    ///
    /// Fails when the record is larger than the buffer, or when the producer is closed or has
    /// stopped (with the error that stopped it). Dropping the future after the record was
    /// queued does not take it back.
    pub async fn send(&self, record: RecordIn) -> Result<Delivery, ProducerError> {
        let (delivery, accepted) = self.enqueue(record).await?;
        if let Some(accepted) = accepted {
            self.accepted(accepted).await?;
        }
        Ok(delivery)
    }

    /// Sends records in order, each with the next local sequence (when no other task sends at
    /// the same time, they get consecutive ones), and returns once all of them are accepted.
    /// The buffer need not hold them all at once: later records wait for room while earlier
    /// ones are published.
    ///
    /// On an error, the records before the one that failed may have been accepted and are
    /// published; [`Producer::next_local_sequence`] tells how far it got.
    pub async fn send_many(
        &self,
        records: impl IntoIterator<Item = RecordIn>,
    ) -> Result<Vec<Delivery>, ProducerError> {
        let mut deliveries = Vec::new();
        let mut waits = Vec::new();
        for record in records {
            let (delivery, accepted) = self.enqueue(record).await?;
            deliveries.push(delivery);
            waits.extend(accepted);
        }
        for accepted in waits {
            self.accepted(accepted).await?;
        }
        Ok(deliveries)
    }

    /// Waits until every record sent before this call has an outcome (committed, refused, or
    /// unknown because the producer stopped). Seals the open batch at once. A cluster that is
    /// down makes this wait until it is back; bound it with `tokio::time::timeout` if needed.
    ///
    /// Fails when the producer stopped on an error (with that error), or was aborted.
    pub async fn flush(&self) -> Result<(), ProducerError> {
        let (tx, rx) = oneshot::channel();
        if lock(&self.inner.intake).tx.send(Msg::Flush(tx)).is_err() {
            return self.after_end(true);
        }
        match rx.await {
            Ok(result) => result,
            Err(_) => self.after_end(true),
        }
    }

    /// Takes no more records, waits until everything accepted has an outcome (as
    /// [`Producer::flush`]), compacts the spool, and stops the producer. Every clone is closed.
    /// `Ok` does not mean every record was committed: their deliveries say that.
    pub async fn close(&self) -> Result<(), ProducerError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut intake = lock(&self.inner.intake);
            intake.closed = true;
            if intake.tx.send(Msg::Close(tx)).is_err() {
                drop(intake);
                return self.after_end(true);
            }
        }
        match rx.await {
            Ok(result) => result,
            Err(_) => self.after_end(true),
        }
    }

    /// Stops at once: batches in flight are abandoned and every record without an outcome
    /// resolves to [`SendError::Indeterminate`] (sent, outcome unknown) or
    /// [`SendError::NotSent`]. With a spool, the accepted ones stay in the spool and a producer
    /// opened on it later sends them.
    pub async fn abort(&self) {
        let (tx, rx) = oneshot::channel();
        {
            let mut intake = lock(&self.inner.intake);
            intake.closed = true;
            if intake.tx.send(Msg::Abort(tx)).is_err() {
                return;
            }
        }
        let _ = rx.await;
    }

    /// Queues `record` with the next local sequence: the delivery, and with a spool the
    /// receiver told once it is accepted.
    async fn enqueue(
        &self,
        record: RecordIn,
    ) -> Result<
        (
            Delivery,
            Option<oneshot::Receiver<Result<(), ProducerError>>>,
        ),
        ProducerError,
    > {
        let bytes = encoded_len(&record)?;
        if bytes > self.inner.buffer_bytes {
            return Err(ProducerError::InvalidArgument(format!(
                "a record of {bytes} bytes (JSON-encoded) does not fit in the producer's buffer \
                 of {} bytes; raise buffer_bytes",
                self.inner.buffer_bytes
            )));
        }
        self.check_open()?;
        let record_permit = match self.inner.records_room.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => return Err(self.end_error()),
        };
        let bytes_permit = match self
            .inner
            .bytes_room
            .clone()
            .acquire_many_owned(bytes as u32)
            .await
        {
            Ok(permit) => permit,
            Err(_) => return Err(self.end_error()),
        };
        let (outcome_tx, outcome_rx) = oneshot::channel();
        let (accepted_tx, accepted_rx) = if self.inner.spooled {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let local = {
            let mut intake = lock(&self.inner.intake);
            if intake.closed {
                return Err(self.end_error());
            }
            let local = intake.next_local;
            let pending = Pending {
                local,
                record,
                bytes,
                accepted: accepted_tx,
                outcome: outcome_tx,
            };
            if intake.tx.send(Msg::Record(pending)).is_err() {
                drop(intake);
                return Err(self.end_error());
            }
            intake.next_local += 1;
            local
        };
        // The driver gives the room back when the record's outcome is known.
        record_permit.forget();
        bytes_permit.forget();
        Ok((
            Delivery {
                local_sequence: local,
                outcome: outcome_rx,
            },
            accepted_rx,
        ))
    }

    async fn accepted(
        &self,
        accepted: oneshot::Receiver<Result<(), ProducerError>>,
    ) -> Result<(), ProducerError> {
        match accepted.await {
            Ok(result) => result,
            Err(_) => Err(self.end_error()),
        }
    }

    fn check_open(&self) -> Result<(), ProducerError> {
        let closed = lock(&self.inner.intake).closed;
        let ended = lock(&self.inner.shared.ended).is_some();
        if closed || ended {
            return Err(self.end_error());
        }
        Ok(())
    }

    /// The error for a call that finds the producer stopped or closing.
    fn end_error(&self) -> ProducerError {
        match &*lock(&self.inner.shared.ended) {
            Some(Ended::Failed(err)) => err.clone(),
            _ => ProducerError::Closed,
        }
    }

    /// The answer of `flush` or `close` once the driver is gone.
    fn after_end(&self, closed_is_ok: bool) -> Result<(), ProducerError> {
        match &*lock(&self.inner.shared.ended) {
            Some(Ended::Failed(err)) => Err(err.clone()),
            Some(Ended::Closed) if closed_is_ok => Ok(()),
            _ => Err(ProducerError::Closed),
        }
    }
}

/// A new random producer id.
fn random_producer_id() -> String {
    format!("p-{:016x}", rand::random::<u64>())
}

/// The size of `record` as JSON in a publish request (plus its separating comma).
fn encoded_len(record: &RecordIn) -> Result<usize, ProducerError> {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(1);
    serde_json::to_writer(&mut count, record).map_err(|err| {
        ProducerError::InvalidArgument(format!("the record cannot be encoded: {err}"))
    })?;
    Ok(count.0)
}

/// Where a sealed batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
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
struct Slot {
    /// The local sequence of its first record: stable, unlike `seq`.
    id: u64,
    seq: u64,
    records: Arc<Vec<RecordIn>>,
    /// One per record; empty for a batch recovered from the spool (nobody awaits those).
    outcomes: Vec<oneshot::Sender<Result<u64, SendError>>>,
    /// With a spool, until it is written there.
    accepted: Vec<Responder>,
    /// Buffer room to give back when it settles.
    held_records: usize,
    held_bytes: usize,
    state: SlotState,
    /// Written to the spool (always true without one).
    spooled: bool,
    /// Some attempt may have been appended (or, for a recovered batch, it may have been sent
    /// before the restart).
    maybe_applied: bool,
}

impl Slot {
    fn settled(&self) -> bool {
        matches!(self.state, SlotState::Committed | SlotState::Refused)
    }

    fn last_local(&self) -> u64 {
        self.id + self.records.len() as u64 - 1
    }
}

/// What a publish task reports.
struct Attempt {
    slot: u64,
    seq: u64,
    /// Every batch before this one was committed when it was sent.
    front: bool,
    maybe_applied: bool,
    result: Result<PublishResponse, Error>,
}

/// The background task: owns the batches, the spool and the publish tasks.
struct Driver {
    client: Client,
    topic: Arc<str>,
    producer_id: Arc<str>,
    linger: Duration,
    max_batch_records: usize,
    max_batch_bytes: usize,
    max_in_flight: usize,
    rx: mpsc::UnboundedReceiver<Msg>,
    shared: Arc<Shared>,
    records_room: Arc<Semaphore>,
    bytes_room: Arc<Semaphore>,
    spooled: bool,
    /// `None` without a spool, and while a blocking write has it.
    spool: Option<Spool>,
    /// The batch being filled.
    open: Vec<Pending>,
    open_bytes: usize,
    open_since: Option<Instant>,
    /// Sealed batches not yet removed, in sequence (and local sequence) order. Committed ones
    /// are removed from the front.
    slots: VecDeque<Slot>,
    /// The sequence of the next sealed batch.
    next_seq: u64,
    /// One past the last local sequence received.
    received_below: u64,
    tasks: JoinSet<Attempt>,
    task_slots: HashMap<tokio::task::Id, u64>,
    /// Committed batches to mark done in the spool.
    done: Vec<u64>,
    /// The server forgot this producer: once nothing is in flight, the unsettled batches are
    /// renumbered from 0, starting with this one.
    restart_from_zero: Option<u64>,
    /// Seal the open batch now (a flush).
    seal_now: bool,
    /// `(local sequence, responder)`: answered once everything below it is settled.
    flush_waiters: Vec<(u64, Responder)>,
    close_waiters: Vec<Responder>,
    /// Close requested, or every handle dropped: finish what is there, then stop.
    closing: bool,
    /// Every handle is gone and the queue is empty: stop receiving.
    intake_done: bool,
    /// Refused batches waiting for the renumbering of the batches after them.
    refused_waiting: usize,
}

/// Why the driver's loop ended.
enum Exit {
    Closed,
    Aborted(Option<oneshot::Sender<()>>),
    Failed(ProducerError),
}

enum Event {
    Attempt(Option<Result<(tokio::task::Id, Attempt), JoinError>>),
    Msg(Option<Msg>),
    Linger,
}

impl Driver {
    async fn run(mut self) {
        let exit = self.main_loop().await;
        self.finish(exit);
    }

    async fn main_loop(&mut self) -> Exit {
        loop {
            if let Err(err) = self.pump().await {
                return Exit::Failed(err);
            }
            if self.closing
                && self.open.is_empty()
                && self.slots.is_empty()
                && self.tasks.is_empty()
            {
                if let Some(spool) = self.spool.take() {
                    let dir = spool.dir().to_path_buf();
                    let compacted = tokio::task::spawn_blocking(move || {
                        let mut spool = spool;
                        spool.compact()
                    })
                    .await;
                    if !matches!(compacted, Ok(Ok(()))) {
                        // Everything is settled; the spool is still valid, only larger.
                        tracing::warn!(spool = %dir.display(), "could not compact the spool");
                    }
                }
                return Exit::Closed;
            }
            // While a full pipeline's worth of batches waits or is in flight, a sealed batch
            // could not go anyway: the open one keeps filling (an adaptive linger). With a
            // spool, sealing is what makes records safe, so it is never put off.
            let linger_at = self
                .open_since
                .filter(|_| self.spooled || self.pipeline_has_room())
                .map(|since| since + self.linger);
            // A linger already over (always so with a zero linger) seals without a timer: one
            // would only fire at the runtime's next millisecond tick, a millisecond added to
            // every publish that could have gone at once. First, though, the producer lets
            // every task that is ready run once and takes what they queued: callers woken
            // together (by the answer to the previous batch) then share the next batch instead
            // of the first of them going alone.
            if linger_at.is_some_and(|at| at <= Instant::now()) {
                tokio::task::yield_now().await;
                for _ in 0..DRAIN_LIMIT {
                    let Ok(msg) = self.rx.try_recv() else { break };
                    if let Some(exit) = self.on_msg(Some(msg)) {
                        return exit;
                    }
                }
                self.seal_open();
                continue;
            }
            let event = tokio::select! {
                joined = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => {
                    Event::Attempt(joined)
                }
                msg = self.rx.recv(), if !self.intake_done => Event::Msg(msg),
                _ = sleep_until(linger_at), if linger_at.is_some() => Event::Linger,
            };
            match event {
                Event::Attempt(None) => {}
                Event::Attempt(Some(joined)) => {
                    if let Err(err) = self.on_attempt(joined) {
                        return Exit::Failed(err);
                    }
                }
                Event::Msg(msg) => {
                    if let Some(exit) = self.on_msg(msg) {
                        return exit;
                    }
                    // Take what else is queued before pumping: it makes fuller batches.
                    for _ in 0..DRAIN_LIMIT {
                        let Ok(msg) = self.rx.try_recv() else { break };
                        if let Some(exit) = self.on_msg(Some(msg)) {
                            return exit;
                        }
                    }
                }
                Event::Linger => self.seal_open(),
            }
        }
    }

    fn on_msg(&mut self, msg: Option<Msg>) -> Option<Exit> {
        match msg {
            Some(Msg::Record(pending)) => self.add(pending),
            Some(Msg::Flush(responder)) => {
                self.seal_now = true;
                self.flush_waiters.push((self.received_below, responder));
            }
            Some(Msg::Close(responder)) => {
                self.closing = true;
                self.close_waiters.push(responder);
            }
            Some(Msg::Abort(responder)) => return Some(Exit::Aborted(Some(responder))),
            None => {
                // Every handle is gone: finish what was accepted, then stop.
                self.intake_done = true;
                self.closing = true;
            }
        }
        None
    }

    /// True when fewer than `max_in_flight` sealed batches are waiting to be sent or in flight.
    fn pipeline_has_room(&self) -> bool {
        self.slots
            .iter()
            .filter(|slot| !matches!(slot.state, SlotState::Committed | SlotState::Refused))
            .count()
            < self.max_in_flight
    }

    /// Adds a record to the open batch, sealing it when full.
    fn add(&mut self, pending: Pending) {
        self.received_below = pending.local + 1;
        if !self.spooled {
            add(&self.shared.stats.accepted, 1);
        }
        if !self.open.is_empty() && self.open_bytes + pending.bytes > self.max_batch_bytes {
            self.seal_open();
        }
        if self.open.is_empty() {
            self.open_since = Some(Instant::now());
        }
        self.open_bytes += pending.bytes;
        self.open.push(pending);
        if self.open.len() >= self.max_batch_records || self.open_bytes >= self.max_batch_bytes {
            self.seal_open();
        }
    }

    /// Turns the open batch into a slot with the next sequence.
    fn seal_open(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let pendings = std::mem::take(&mut self.open);
        let held_bytes = std::mem::take(&mut self.open_bytes);
        self.open_since = None;
        let id = pendings[0].local;
        let mut records = Vec::with_capacity(pendings.len());
        let mut outcomes = Vec::with_capacity(pendings.len());
        let mut accepted = Vec::new();
        for pending in pendings {
            records.push(pending.record);
            outcomes.push(pending.outcome);
            accepted.extend(pending.accepted);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.slots.push_back(Slot {
            id,
            seq,
            held_records: records.len(),
            records: Arc::new(records),
            outcomes,
            accepted,
            held_bytes,
            state: SlotState::Ready,
            spooled: !self.spooled,
            maybe_applied: false,
        });
    }

    /// Everything that follows from the state: seal, write the spool, renumber, send, and
    /// publish the commit point.
    async fn pump(&mut self) -> Result<(), ProducerError> {
        if self.seal_now || self.closing {
            self.seal_open();
            self.seal_now = false;
        }
        let mut ops = Vec::new();
        // Batches not yet in the spool are the newest, at the back.
        let unspooled = self
            .slots
            .iter()
            .rev()
            .take_while(|slot| !slot.spooled)
            .count();
        let first_unspooled = self.slots.len() - unspooled;
        if self.spooled {
            for slot in self.slots.range(first_unspooled..) {
                ops.push(Op::Batch {
                    first: slot.id,
                    seq: slot.seq,
                    records: slot.records.clone(),
                });
            }
            if !self.done.is_empty() {
                ops.push(Op::Done(std::mem::take(&mut self.done)));
            }
        }
        // After the new batches: a renumbering covers them too.
        if let Some(reseq) = self.try_renumber()? {
            if self.spooled {
                ops.push(reseq);
            }
        }
        if !ops.is_empty() {
            self.write_spool(ops).await?;
        }
        // A renumbering keeps the order, so the unspooled batches are still the last ones.
        let first_unspooled = self.slots.len() - unspooled;
        for slot in self.slots.range_mut(first_unspooled..) {
            slot.spooled = true;
            add(&self.shared.stats.accepted, slot.accepted.len() as u64);
            for responder in slot.accepted.drain(..) {
                let _ = responder.send(Ok(()));
            }
        }
        self.send_ready();
        self.publish_progress();
        Ok(())
    }

    async fn write_spool(&mut self, ops: Vec<Op>) -> Result<(), ProducerError> {
        let Some(mut spool) = self.spool.take() else {
            return Err(ProducerError::Desynchronized {
                detail: "the spool was lost by an earlier failed write".to_string(),
            });
        };
        let dir = spool.dir().to_path_buf();
        let written = tokio::task::spawn_blocking(move || {
            let result = spool.write(&ops);
            (spool, result)
        })
        .await;
        match written {
            Ok((spool, Ok(()))) => {
                self.spool = Some(spool);
                Ok(())
            }
            Ok((_, Err(err))) => Err(ProducerError::Spool {
                path: dir,
                detail: format!(
                    "cannot write or fsync spool.log: {err}; the producer stopped (what the \
                     spool holds is consistent: reopen it once the disk is fixed)"
                ),
            }),
            Err(err) => Err(ProducerError::Spool {
                path: dir,
                detail: format!("the spool write did not complete: {err}"),
            }),
        }
    }

    /// Starts a publish task for every batch that may go now, in order.
    fn send_ready(&mut self) {
        if self.restart_from_zero.is_some() {
            return;
        }
        let mut in_flight = self
            .slots
            .iter()
            .filter(|slot| slot.state == SlotState::InFlight)
            .count();
        // Every batch before the current one is committed.
        let mut front = true;
        let mut starts = Vec::new();
        for slot in self.slots.iter_mut() {
            match slot.state {
                SlotState::Committed => continue,
                // Nothing after a refused batch goes before the renumbering.
                SlotState::Refused => break,
                SlotState::InFlight => front = false,
                // Waits for the batches before it; the ones after it would only gap too.
                SlotState::Gapped if !front => break,
                SlotState::Gapped | SlotState::Ready => {
                    if in_flight >= self.max_in_flight || !slot.spooled {
                        break;
                    }
                    slot.state = SlotState::InFlight;
                    in_flight += 1;
                    starts.push((slot.id, slot.seq, slot.records.clone(), front));
                    front = false;
                }
            }
        }
        for (id, seq, records, front) in starts {
            let request = PublishRequest {
                records: records.as_ref().clone(),
                producer_id: Some(self.producer_id.to_string()),
                sequence: Some(seq),
            };
            let handle = self.tasks.spawn(publish_batch(
                self.client.clone(),
                self.topic.clone(),
                request,
                id,
                front,
                self.shared.clone(),
            ));
            self.task_slots.insert(handle.id(), id);
        }
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        self.slots.iter().position(|slot| slot.id == id)
    }

    fn on_attempt(
        &mut self,
        joined: Result<(tokio::task::Id, Attempt), JoinError>,
    ) -> Result<(), ProducerError> {
        let attempt = match joined {
            Ok((task, attempt)) => {
                self.task_slots.remove(&task);
                attempt
            }
            Err(err) => {
                // The task panicked (a bug): its request may have been appended, and nothing
                // tells where the server's sequence stands.
                let id = self.task_slots.remove(&err.id());
                return Err(desync(format!(
                    "the task publishing the batch of local sequence {id:?} failed: {err}"
                )));
            }
        };
        let Some(index) = self.index_of(attempt.slot) else {
            return Err(desync(format!(
                "an answer arrived for batch {} (local sequence {}), which the producer no longer \
                 holds",
                attempt.seq, attempt.slot
            )));
        };
        let slot = &mut self.slots[index];
        if slot.state != SlotState::InFlight || slot.seq != attempt.seq {
            return Err(desync(format!(
                "an answer for batch {} arrived while that batch was {:?} as sequence {}",
                attempt.seq, slot.state, slot.seq
            )));
        }
        slot.maybe_applied |= attempt.maybe_applied;
        match attempt.result {
            Ok(answer) => self.on_committed(index, Some(answer)),
            Err(Error::Api(problem)) => match problem.code {
                ErrorCode::SequenceGap => {
                    self.on_gap(index, attempt.front, problem.expected_sequence)
                }
                // Committed long ago: the server no longer remembers its offsets.
                ErrorCode::AlreadyExists => self.on_committed(index, None),
                // A refusal for the batch's content (too large, malformed) is definite even
                // after a lost attempt: the same content was refused then too. Any other
                // refusal (the topic deleted, the token revoked) may follow an attempt that was
                // appended.
                code if self.slots[index].maybe_applied
                    && !matches!(
                        code,
                        ErrorCode::PayloadTooLarge | ErrorCode::InvalidArgument
                    ) =>
                {
                    let slot = &self.slots[index];
                    Err(desync(format!(
                        "batch {} (local sequences {}..={}) was refused ({problem}) after an \
                         earlier attempt of it may have been appended; whether it was, and which \
                         sequence the server expects next, cannot be known",
                        slot.seq,
                        slot.id,
                        slot.last_local()
                    )))
                }
                _ => {
                    self.on_refused(index, *problem);
                    Ok(())
                }
            },
            // Refused before anything was sent.
            Err(err @ (Error::InvalidArgument(_) | Error::InvalidUrl { .. })) => {
                self.on_refused(
                    index,
                    Problem::new(ErrorCode::InvalidArgument, err.to_string()),
                );
                Ok(())
            }
            // publish_batch retries these until the outcome is known; they never come back.
            Err(
                err @ (Error::Indeterminate { .. }
                | Error::Decode { .. }
                | Error::Unavailable { .. }),
            ) => Err(desync(format!(
                "a publish task gave up with an unknown outcome: {err}"
            ))),
        }
    }

    fn on_committed(
        &mut self,
        index: usize,
        answer: Option<PublishResponse>,
    ) -> Result<(), ProducerError> {
        let slot = &mut self.slots[index];
        let count = slot.records.len() as u64;
        match &answer {
            Some(answer) => {
                let span = answer
                    .last_offset
                    .checked_sub(answer.first_offset)
                    .and_then(|d| d.checked_add(1));
                if span != Some(count) {
                    return Err(desync(format!(
                        "batch {} of {count} records was answered with offsets {}..={} \
                         (duplicate: {}): the server holds another batch under this sequence; \
                         is another process using producer id {:?}?",
                        slot.seq,
                        answer.first_offset,
                        answer.last_offset,
                        answer.duplicate,
                        self.producer_id
                    )));
                }
                for (i, outcome) in slot.outcomes.drain(..).enumerate() {
                    let _ = outcome.send(Ok(answer.first_offset + i as u64));
                }
                if answer.duplicate {
                    add(&self.shared.stats.duplicates, count);
                }
            }
            None => {
                for outcome in slot.outcomes.drain(..) {
                    let _ = outcome.send(Err(SendError::OffsetUnknown));
                }
            }
        }
        add(&self.shared.stats.committed, count);
        add(&self.shared.stats.batches, 1);
        slot.state = SlotState::Committed;
        let (records, bytes) = (slot.held_records, slot.held_bytes);
        let id = slot.id;
        self.release(records, bytes);
        if self.spooled {
            self.done.push(id);
        }
        while self
            .slots
            .front()
            .is_some_and(|s| s.state == SlotState::Committed)
        {
            self.slots.pop_front();
        }
        Ok(())
    }

    fn on_gap(
        &mut self,
        index: usize,
        front: bool,
        expected: Option<u64>,
    ) -> Result<(), ProducerError> {
        add(&self.shared.stats.sequence_gaps, 1);
        if !front {
            // It overtook a batch before it (the server's expected sequence may be stale by
            // now): sent again once that one is committed.
            self.slots[index].state = SlotState::Gapped;
            return Ok(());
        }
        // Every batch before it was committed when it was sent, yet the server expects an
        // older sequence: it has forgotten this producer, and then it expects 0.
        let slot = &self.slots[index];
        if slot.seq == 0 || expected.is_some_and(|expected| expected != 0) {
            return Err(desync(format!(
                "the server answered sequence_gap to batch sequence {} although every batch \
                 before it was committed, and expects sequence {}; is another process using \
                 producer id {:?}?",
                slot.seq,
                expected.map_or_else(|| "(not said)".to_string(), |e| e.to_string()),
                self.producer_id
            )));
        }
        let unsettled: Vec<&Slot> = self.slots.iter().filter(|s| !s.settled()).collect();
        if unsettled.iter().any(|s| s.maybe_applied) {
            let first = unsettled.first().map_or(slot.id, |s| s.id);
            let last = unsettled.last().map_or(slot.id, |s| s.last_local());
            let records: usize = unsettled.iter().map(|s| s.records.len()).sum();
            let what = match self.spool.as_ref() {
                Some(spool) => format!(
                    " They are still in the spool {}: check the topic for them, then move the \
                     spool directory aside (a producer with a new spool starts afresh).",
                    spool.dir().display()
                ),
                None => " Check the topic for them.".to_string(),
            };
            return Err(ProducerError::ProducerForgotten {
                detail: format!(
                    "the server no longer knows producer {:?} on topic {:?} (it forgets \
                     producers idle for 7 days of log time, and the least recently active ones \
                     when a topic has more than 10,000): it expects a batch sequence older than \
                     {}. Whether the {records} unsettled records with local sequences \
                     {first}..={last}, sent before or recovered from the spool, were appended \
                     cannot be known.{what}",
                    self.producer_id, self.topic, slot.seq
                ),
            });
        }
        tracing::warn!(
            producer_id = %self.producer_id,
            topic = %self.topic,
            "the server no longer knows this producer; nothing was unsettled, so its batch \
             sequences start over at 0"
        );
        let id = slot.id;
        self.slots[index].state = SlotState::Gapped;
        self.restart_from_zero = Some(id);
        Ok(())
    }

    fn on_refused(&mut self, index: usize, problem: Problem) {
        let slot = &mut self.slots[index];
        // The deliveries carry the refusal; a log line per batch would repeat it.
        tracing::debug!(
            topic = %self.topic,
            sequence = slot.seq,
            records = slot.records.len(),
            %problem,
            "batch refused"
        );
        add(&self.shared.stats.refused, slot.records.len() as u64);
        for outcome in slot.outcomes.drain(..) {
            let _ = outcome.send(Err(SendError::Refused(Box::new(problem.clone()))));
        }
        slot.state = SlotState::Refused;
        let (records, bytes) = (slot.held_records, slot.held_bytes);
        self.refused_waiting += 1;
        self.release(records, bytes);
    }

    /// Once nothing from the first refused batch on is in flight (or, after the server forgot
    /// the producer, nothing at all), drops the refused batches and renumbers the rest: a
    /// refusal does not consume its sequence. Returns the spool entry that records it.
    fn try_renumber(&mut self) -> Result<Option<Op>, ProducerError> {
        let (start, base) = match self.restart_from_zero {
            Some(id) => match self.index_of(id) {
                Some(index) => (index, 0),
                None => {
                    self.restart_from_zero = None;
                    return Ok(None);
                }
            },
            None if self.refused_waiting == 0 => return Ok(None),
            None => match self
                .slots
                .iter()
                .position(|slot| slot.state == SlotState::Refused)
            {
                Some(index) => (index, self.slots[index].seq),
                None => return Ok(None),
            },
        };
        if self
            .slots
            .iter()
            .skip(start)
            .any(|slot| slot.state == SlotState::InFlight)
        {
            return Ok(None);
        }
        if let Some(slot) = self
            .slots
            .iter()
            .skip(start)
            .find(|slot| slot.state == SlotState::Committed)
        {
            return Err(desync(format!(
                "batch {} was committed although a batch before it was refused (or forgotten \
                 by the server); is another process using producer id {:?}?",
                slot.seq, self.producer_id
            )));
        }
        let tail: Vec<Slot> = self.slots.drain(start..).collect();
        let mut dropped = Vec::new();
        let mut seqs = Vec::new();
        for mut slot in tail {
            if slot.state == SlotState::Refused {
                dropped.push(slot.id);
                continue;
            }
            slot.seq = base + seqs.len() as u64;
            slot.state = SlotState::Ready;
            seqs.push((slot.id, slot.seq));
            self.slots.push_back(slot);
        }
        self.next_seq = base + seqs.len() as u64;
        self.restart_from_zero = None;
        // Every refused batch was at or after the first one.
        self.refused_waiting = 0;
        Ok(Some(Op::Reseq {
            dropped,
            seqs,
            next_seq: self.next_seq,
        }))
    }

    fn release(&self, records: usize, bytes: usize) {
        if records > 0 {
            self.records_room.add_permits(records);
        }
        if bytes > 0 {
            self.bytes_room.add_permits(bytes);
        }
    }

    /// Publishes the commit point and answers the flushes it satisfies.
    fn publish_progress(&mut self) {
        let below = self
            .slots
            .iter()
            .find(|slot| !slot.settled())
            .map(|slot| slot.id)
            .or_else(|| self.open.first().map(|pending| pending.local))
            .unwrap_or(self.received_below);
        self.shared.commit_below.store(below, Ordering::Release);
        let mut i = 0;
        while i < self.flush_waiters.len() {
            if self.flush_waiters[i].0 <= below {
                let (_, responder) = self.flush_waiters.swap_remove(i);
                let _ = responder.send(Ok(()));
            } else {
                i += 1;
            }
        }
    }

    /// Settles everything left and tells every waiter how the producer ended.
    fn finish(mut self, exit: Exit) {
        let (ended, aborted_by) = match exit {
            Exit::Closed => (Ended::Closed, None),
            Exit::Aborted(responder) => (Ended::Aborted, responder),
            Exit::Failed(err) => {
                tracing::error!(
                    topic = %self.topic,
                    producer_id = %self.producer_id,
                    error = %err,
                    "the producer stopped"
                );
                (Ended::Failed(err), None)
            }
        };
        *lock(&self.shared.ended) = Some(ended.clone());
        self.rx.close();
        self.records_room.close();
        self.bytes_room.close();
        self.tasks.abort_all();
        let (reason, error) = match &ended {
            Ended::Closed => ("it was closed".to_string(), ProducerError::Closed),
            Ended::Aborted => ("it was aborted".to_string(), ProducerError::Closed),
            Ended::Failed(err) => (err.to_string(), err.clone()),
        };
        let kept = match self.spool.as_ref() {
            Some(spool) => format!(
                "; it is kept in the spool {} and a producer opened on it sends it",
                spool.dir().display()
            ),
            None => String::new(),
        };
        let mut unsettled = 0u64;
        for mut slot in self.slots.drain(..) {
            for responder in slot.accepted.drain(..) {
                let _ = responder.send(Err(error.clone()));
            }
            if slot.settled() {
                continue;
            }
            unsettled += slot.records.len() as u64;
            let outcome = if slot.state == SlotState::InFlight || slot.maybe_applied {
                SendError::Indeterminate {
                    detail: format!(
                        "the producer stopped ({reason}) while batch {} was in flight or after \
                         an attempt of it was lost{}",
                        slot.seq,
                        if slot.spooled { &kept } else { "" }
                    ),
                }
            } else {
                SendError::NotSent {
                    detail: format!(
                        "the producer stopped ({reason}) before sending it{}",
                        if slot.spooled { &kept } else { "" }
                    ),
                }
            };
            for responder in slot.outcomes.drain(..) {
                let _ = responder.send(Err(outcome.clone()));
            }
        }
        // Records not yet in a sealed batch: never sent, and (with a spool) never accepted.
        let not_sent = SendError::NotSent {
            detail: format!("the producer stopped ({reason}) before sending it"),
        };
        let mut pendings: Vec<Pending> = std::mem::take(&mut self.open);
        let mut late_waiters = Vec::new();
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Record(pending) => pendings.push(pending),
                Msg::Flush(responder) | Msg::Close(responder) => late_waiters.push(responder),
                Msg::Abort(responder) => {
                    let _ = responder.send(());
                }
            }
        }
        for pending in pendings {
            unsettled += 1;
            if let Some(responder) = pending.accepted {
                let _ = responder.send(Err(error.clone()));
            }
            let _ = pending.outcome.send(Err(not_sent.clone()));
        }
        add(&self.shared.stats.unsettled, unsettled);
        let answer = match &ended {
            Ended::Closed => Ok(()),
            _ => Err(error.clone()),
        };
        for (_, responder) in self.flush_waiters.drain(..) {
            let _ = responder.send(answer.clone());
        }
        for responder in self.close_waiters.drain(..).chain(late_waiters) {
            let _ = responder.send(match &ended {
                Ended::Failed(err) => Err(err.clone()),
                _ => Ok(()),
            });
        }
        if let Some(responder) = aborted_by {
            let _ = responder.send(());
        }
    }
}

fn desync(detail: String) -> ProducerError {
    ProducerError::Desynchronized { detail }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Publishes one batch until its outcome is known: an answer, or a definite refusal. A lost
/// answer or an unavailable cluster is retried with the same sequence.
async fn publish_batch(
    client: Client,
    topic: Arc<str>,
    request: PublishRequest,
    slot: u64,
    front: bool,
    shared: Arc<Shared>,
) -> Attempt {
    let seq = request.sequence.unwrap_or_default();
    let mut maybe_applied = false;
    let mut backoff = RETRY_INITIAL;
    loop {
        add(&shared.stats.publish_calls, 1);
        let result = client.publish(&topic, &request).await;
        match &result {
            Err(Error::Indeterminate { detail } | Error::Decode { detail }) => {
                maybe_applied = true;
                tracing::warn!(%topic, sequence = seq, %detail, "batch outcome unknown; sending it again");
            }
            Err(Error::Unavailable { detail, .. }) => {
                tracing::warn!(%topic, sequence = seq, %detail, "cluster unavailable; sending the batch again");
            }
            _ => {
                return Attempt {
                    slot,
                    seq,
                    front,
                    maybe_applied,
                    result,
                }
            }
        }
        tokio::time::sleep(jittered(backoff)).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}
