//! [`Subscriber`]: a pull loop that runs a handler per message, keeps the leases of unfinished
//! messages alive, acks or nacks each message by its handler's result, and stops gracefully.
//!
//! # Life of a message
//!
//! 1. A long-poll pull leases up to `batch` messages; they wait in a local queue.
//! 2. A handler starts on a message as soon as fewer than `concurrency` handlers run.
//! 3. While a message is held (queued, running, or finished but not yet acked), a background
//!    ticker extends its lease every `extend_every`, so a slow handler does not lose it. A
//!    message being nacked or released is never extended again, and a nack or release is not
//!    sent while an extend is in flight: the server treats a released receipt whose record was
//!    not delivered again as live, so an extend applied after the release would lease the
//!    record again. (One window remains: an extend that timed out — each round is bounded by
//!    `extend_every` — may still be applied later; its record then comes back when that lease
//!    expires.)
//! 4. `Ok(())` acks the message; `Err(_)` (or a panic) nacks it: it is released after
//!    `nack_delay` and delivered again, or dead-lettered by the server when it reached the
//!    subscription's `max_deliveries`. Acks and nacks of messages that finish together go in
//!    one request.
//!
//! # Stopping
//!
//! [`StopHandle::stop`] (or a definite error from the server, see below) starts a graceful
//! stop:
//!
//! - no new pull is sent, and a pull waiting for records is abandoned (records it may have
//!   leased without the answer arriving come back when their lease expires; the subscriber
//!   never saw them, so it cannot report them);
//! - messages pulled but not started are released at once (nack, no delay), and no handler
//!   starts after the stop is seen;
//! - running handlers get `stop_grace` to finish, with their leases still extended; those that
//!   finish are acked or nacked as usual. Handlers still running when the grace ends are
//!   cancelled (dropped at their next `.await`) and their messages released;
//! - acks and releases still pending get `flush_timeout` to reach the cluster (retried through
//!   a failover); what cannot be settled by then is listed in [`StopReport::unsettled`] and
//!   comes back by itself when its lease expires.
//!
//! [`Subscriber::run`] then returns a [`StopReport`] that says exactly what happened to every
//! message it pulled.
//!
//! # Failures
//!
//! [`Error::Unavailable`] and [`Error::Indeterminate`] (no leader for longer than the client's
//! deadline, a lost answer) never end the loop: the call is retried with a backoff (100 ms
//! doubling up to 2 s). Re-sending is safe for every call the subscriber makes: an ack, nack or
//! extend applied twice has the effect of applying it once, and a pull whose answer was lost
//! only delays its records until their leases expire. A consequence worth knowing: an ack
//! re-sent after a lost answer answers `stale` for the messages the lost attempt acked, so
//! [`StopReport::stale`] counts those too.
//!
//! Any other error is definite and ends the run: the subscription or topic does not exist (or
//! was deleted), the token is refused, an argument is invalid, or the server's answer cannot be
//! decoded. The subscriber then stops as above and [`Subscriber::run`] returns a
//! [`RunError`] holding the error and the report.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};

use crate::api::{
    is_valid_name, Message, PullRequest, PullResponse, ReceiptResult, ReceiptStatus,
    DEFAULT_ACK_TIMEOUT_MS, MAX_ACK_TIMEOUT_MS, MAX_NACK_DELAY_MS, MAX_PULL, MAX_RECEIPTS,
    MAX_WAIT_MS,
};
use crate::transport::jittered;
use crate::{Client, Error};

/// Default most messages one pull leases.
pub const DEFAULT_BATCH: u32 = 10;
/// Default long-poll wait of a pull.
pub const DEFAULT_PULL_WAIT: Duration = Duration::from_secs(10);
/// Default time running handlers get to finish after a stop.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// Default time pending acks and releases get to reach the cluster after a stop.
pub const DEFAULT_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// First pause after a failed call of the loop; doubled after each failure in a row.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
/// Longest pause between failed calls of the loop.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Shortest extension period: a lease of a few milliseconds cannot be kept alive anyway.
const MIN_EXTEND_EVERY: Duration = Duration::from_millis(1);

/// How a [`Subscriber`] pulls and handles messages. `Default` is [`SubscriberOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberOptions {
    /// Most messages one pull leases (1 to 1,000; default 10).
    pub batch: u32,
    /// Long-poll wait of each pull (at most 30 s; default 10 s).
    pub wait: Duration,
    /// Lease length asked for by pulls and extends. `None` (the default): the subscription's
    /// `ack_timeout_ms`, read from the cluster when [`Subscriber::run`] starts.
    pub ack_timeout: Option<Duration>,
    /// How often held messages get their leases extended. `None` (the default): a third of the
    /// lease length.
    pub extend_every: Option<Duration>,
    /// A consumer name sent with each pull (shown by the server; optional).
    pub consumer: Option<String>,
    /// How many handlers run at once (default 1: messages are handled one at a time, in the
    /// order they were pulled).
    pub concurrency: usize,
    /// Delay before a message whose handler failed is delivered again (default none).
    pub nack_delay: Duration,
    /// Time running handlers get to finish after a stop (default 10 s; zero cancels them at
    /// once).
    pub stop_grace: Duration,
    /// Time pending acks and releases get to reach the cluster after a stop (default 10 s).
    pub flush_timeout: Duration,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        SubscriberOptions {
            batch: DEFAULT_BATCH,
            wait: DEFAULT_PULL_WAIT,
            ack_timeout: None,
            extend_every: None,
            consumer: None,
            concurrency: 1,
            nack_delay: Duration::ZERO,
            stop_grace: DEFAULT_STOP_GRACE,
            flush_timeout: DEFAULT_FLUSH_TIMEOUT,
        }
    }
}

impl SubscriberOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lease up to `batch` messages per pull.
    pub fn batch(mut self, batch: u32) -> Self {
        self.batch = batch;
        self
    }

    /// Long-poll each pull for up to `wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Lease messages for `ack_timeout` (and extend by as much).
    pub fn ack_timeout(mut self, ack_timeout: Duration) -> Self {
        self.ack_timeout = Some(ack_timeout);
        self
    }

    /// Extend the leases of held messages every `period`.
    pub fn extend_every(mut self, period: Duration) -> Self {
        self.extend_every = Some(period);
        self
    }

    /// Name this consumer in its pulls.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// Run up to `concurrency` handlers at once.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Deliver a message whose handler failed again after `delay`.
    pub fn nack_delay(mut self, delay: Duration) -> Self {
        self.nack_delay = delay;
        self
    }

    /// Give running handlers `grace` to finish after a stop.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Give pending acks and releases `timeout` to settle after a stop.
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.flush_timeout = timeout;
        self
    }

    fn check(&self) -> Result<(), Error> {
        let invalid = |text: String| Err(Error::InvalidArgument(text));
        if self.batch == 0 || self.batch > MAX_PULL {
            return invalid(format!(
                "batch is 1 to {MAX_PULL} messages, not {}",
                self.batch
            ));
        }
        if millis(self.wait) > MAX_WAIT_MS {
            return invalid(format!(
                "the pull wait is at most {MAX_WAIT_MS} ms, not {:?}",
                self.wait
            ));
        }
        if let Some(ack_timeout) = self.ack_timeout {
            let ms = millis(ack_timeout);
            if ms == 0 || ms > MAX_ACK_TIMEOUT_MS {
                return invalid(format!(
                    "the ack time-out is 1 to {MAX_ACK_TIMEOUT_MS} ms, not {ack_timeout:?}"
                ));
            }
            if let Some(every) = self.extend_every {
                if every >= ack_timeout {
                    return invalid(format!(
                        "extend_every ({every:?}) must be shorter than the ack time-out \
                         ({ack_timeout:?}), or leases expire between extensions"
                    ));
                }
            }
        }
        if self.extend_every == Some(Duration::ZERO) {
            return invalid("extend_every must be positive".to_string());
        }
        if self.concurrency == 0 {
            return invalid("concurrency is at least 1".to_string());
        }
        if millis(self.nack_delay) > MAX_NACK_DELAY_MS {
            return invalid(format!(
                "the nack delay is at most {MAX_NACK_DELAY_MS} ms, not {:?}",
                self.nack_delay
            ));
        }
        Ok(())
    }
}

/// Stops a running [`Subscriber`] gracefully. Cheap to clone; usable from any task or thread,
/// before or while the subscriber runs.
#[derive(Debug, Clone)]
pub struct StopHandle {
    stop: Arc<watch::Sender<bool>>,
}

impl StopHandle {
    /// Starts the graceful stop described in the [module docs](crate::subscriber); returns at
    /// once. [`Subscriber::run`] returns when the stop is complete. Calling it again, or before
    /// `run`, is fine.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// True once [`StopHandle::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// What a [`Subscriber::run`] did, message by message. Every pulled message ends in exactly
/// one of: `acked`, `nacked`, `dead_lettered`, `stale`, `released_on_stop`, `unsettled`, or
/// `lost_before_start`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Messages leased by pulls.
    pub pulled: u64,
    /// Handlers that ran to the end (returned `Ok`, `Err`, or panicked).
    pub processed: u64,
    /// Handlers that returned `Err` or panicked.
    pub failed: u64,
    /// Messages acked after their handler returned `Ok`.
    pub acked: u64,
    /// Messages released for redelivery after their handler failed.
    pub nacked: u64,
    /// Messages the server dead-lettered when they were nacked (a failed handler, or a release
    /// at stop, of a message that reached the subscription's `max_deliveries`).
    pub dead_lettered: u64,
    /// Acks and nacks answered `stale`: the lease had been lost (the record expired and was
    /// delivered again, possibly elsewhere, or the cursor moved past it), or a re-sent ack
    /// found the record already acked by its own lost first attempt.
    pub stale: u64,
    /// Extensions answered `stale`: a handler kept running on a message whose lease was lost.
    pub lost_leases: u64,
    /// Messages whose lease was lost while they waited in the queue; their handler never ran
    /// (the record was or will be delivered again).
    pub lost_before_start: u64,
    /// Handlers cancelled when the stop's grace period ended (their messages are released).
    pub cancelled: u64,
    /// `(offset, receipt)` of every message the stop released (never started, or cancelled),
    /// confirmed `released` by the server: they are available again right away.
    pub released_on_stop: Vec<(u64, String)>,
    /// `(offset, receipt)` of messages whose ack or release never reached the cluster before
    /// the run ended. Their leases expire by themselves and the records are delivered again,
    /// so a handled message listed here will be handled a second time.
    pub unsettled: Vec<(u64, String)>,
}

/// A run that ended because of a definite error: the error and what was done until then.
#[derive(Debug)]
pub struct RunError {
    /// The error that ended the run.
    pub error: Error,
    /// What happened to the messages pulled before and during the stop.
    pub report: StopReport,
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the subscriber stopped: {}", self.error)
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<RunError> for Error {
    fn from(err: RunError) -> Self {
        err.error
    }
}

/// Consumes a subscription with a handler per message: see the [module docs](self).
///
/// ```no_run
/// # use std::time::Duration;
/// # use raftq_client::{Client, Subscriber, SubscriberOptions};
/// # async fn demo(client: Client) -> Result<(), raftq_client::Error> {
/// let subscriber = Subscriber::new(
///     client,
///     "orders",
///     "billing",
///     SubscriberOptions::new().concurrency(4),
/// )?;
/// let stop = subscriber.stop_handle();
/// tokio::spawn(async move {
///     tokio::time::sleep(Duration::from_secs(60)).await;
///     stop.stop();
/// });
/// let report = subscriber
///     .run(|message| async move {
///         println!("{} {:?}", message.offset, message.value);
///         Ok::<(), std::io::Error>(())
///     })
///     .await?;
/// println!("acked {}, released {:?}", report.acked, report.released_on_stop);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Subscriber {
    client: Client,
    topic: String,
    subscription: String,
    options: SubscriberOptions,
    stop: Arc<watch::Sender<bool>>,
}

impl Subscriber {
    /// A subscriber of `subscription` on `topic`. Checks the names and options; sends
    /// nothing.
    pub fn new(
        client: Client,
        topic: impl Into<String>,
        subscription: impl Into<String>,
        options: SubscriberOptions,
    ) -> Result<Subscriber, Error> {
        let (topic, subscription) = (topic.into(), subscription.into());
        for (what, name) in [("topic", &topic), ("subscription", &subscription)] {
            if !is_valid_name(name) {
                return Err(Error::InvalidArgument(format!(
                    "{what} name {name:?} must match [A-Za-z0-9._-]{{1,128}}"
                )));
            }
        }
        options.check()?;
        Ok(Subscriber {
            client,
            topic,
            subscription,
            options,
            stop: Arc::new(watch::channel(false).0),
        })
    }

    /// A handle that stops [`Subscriber::run`] gracefully.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            stop: self.stop.clone(),
        }
    }

    /// Pulls and handles messages until stopped (see the [module docs](self)).
    ///
    /// `handler` is called once per message, from this task; the future it returns runs as its
    /// own Tokio task, so it must be `Send + 'static` (clone what it needs into it). Its
    /// `Ok(())` acks the message; its `Err` (shown in the log) or a panic releases it for
    /// redelivery. Handlers must tolerate redelivery (a lost lease, a crash before the ack) and
    /// cancellation at an `.await` (when the stop's grace period ends).
    ///
    /// Returns the [`StopReport`] after a stop, or a [`RunError`] after a definite error
    /// (the subscription does not exist, the token is refused, ...). Failover errors are
    /// retried, never returned.
    pub async fn run<F, Fut, E>(self, handler: F) -> Result<StopReport, RunError>
    where
        F: FnMut(Message) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let mut stop_rx = self.stop.subscribe();
        let ack_timeout = match self.options.ack_timeout {
            Some(ack_timeout) => ack_timeout,
            None => match self.learn_ack_timeout(&mut stop_rx).await {
                Ok(Some(ack_timeout)) => ack_timeout,
                Ok(None) => return Ok(StopReport::default()),
                Err(error) => {
                    return Err(RunError {
                        error,
                        report: StopReport::default(),
                    })
                }
            },
        };
        let extend_every = self
            .options
            .extend_every
            .unwrap_or(ack_timeout / 3)
            .max(MIN_EXTEND_EVERY);
        let pull_request = PullRequest {
            max: Some(self.options.batch),
            wait_ms: Some(millis(self.options.wait)),
            ack_timeout_ms: Some(millis(ack_timeout)),
            consumer: self.options.consumer.clone(),
        };
        let state = Loop {
            target: Target {
                client: self.client,
                topic: self.topic,
                subscription: self.subscription,
            },
            pull_request,
            ack_timeout,
            extend_every,
            batch: self.options.batch as usize,
            concurrency: self.options.concurrency,
            nack_delay: self.options.nack_delay,
            stop_grace: self.options.stop_grace,
            flush_timeout: self.options.flush_timeout,
            queue: VecDeque::new(),
            held: HashMap::new(),
            handlers: JoinSet::new(),
            running: HashMap::new(),
            to_ack: Vec::new(),
            to_nack: Vec::new(),
            to_release: Vec::new(),
            pull: None,
            pull_backoff: Duration::ZERO,
            settle: None,
            extend: None,
            stopping: false,
            grace_deadline: None,
            flush_deadline: None,
            fatal: None,
            report: StopReport::default(),
        };
        state.run(handler, stop_rx).await
    }

    /// The subscription's lease length, retried through failovers. `Ok(None)` when stopped
    /// meanwhile.
    async fn learn_ack_timeout(
        &self,
        stop_rx: &mut watch::Receiver<bool>,
    ) -> Result<Option<Duration>, Error> {
        let mut backoff = RETRY_INITIAL;
        loop {
            if *stop_rx.borrow() {
                return Ok(None);
            }
            let lookup = self.client.subscription(&self.topic, &self.subscription);
            let result = tokio::select! {
                result = lookup => result,
                _ = stop_rx.wait_for(|stopped| *stopped) => return Ok(None),
            };
            match result {
                Ok(info) => {
                    let ms = info.config.ack_timeout_ms.unwrap_or(DEFAULT_ACK_TIMEOUT_MS);
                    return Ok(Some(Duration::from_millis(ms.max(1))));
                }
                Err(err) if is_transient(&err) => {
                    tracing::warn!(error = %err, "cannot read the subscription yet, retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(jittered(backoff)) => {}
                        _ = stop_rx.wait_for(|stopped| *stopped) => return Ok(None),
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// Errors after which the loop retries: nothing definite happened.
fn is_transient(err: &Error) -> bool {
    matches!(err, Error::Unavailable { .. } | Error::Indeterminate { .. })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A message held by the subscriber, from its pull until its ack or nack is answered.
#[derive(Debug)]
struct Held {
    offset: u64,
    /// When its lease was last known to start: the pull's answer, or an extend's sending.
    renewed: Instant,
    /// An extend answered `stale`: the lease is gone.
    lost: bool,
    /// Being nacked or released: never extended again. (The server treats a released
    /// receipt whose record was not delivered again as still live, so an extend applied after
    /// the release would lease the record again.)
    releasing: bool,
}

/// `(offset, receipt)` of a message.
type Entry = (u64, String);

/// Acks, nacks (after handler failures) and releases (at stop) sent together.
#[derive(Debug, Default)]
struct Batch {
    acks: Vec<Entry>,
    nacks: Vec<Entry>,
    releases: Vec<Entry>,
}

/// What a settle request came back with: the results of a prefix of each part (all of it
/// unless `error`), and the definite error that cut it short.
#[derive(Debug, Default)]
struct Settled {
    acks: Vec<ReceiptResult>,
    nacks: Vec<ReceiptResult>,
    releases: Vec<ReceiptResult>,
    error: Option<Error>,
}

/// What an extend request came back with.
#[derive(Debug)]
struct Extended {
    results: Vec<ReceiptResult>,
    error: Option<Error>,
}

#[derive(Debug, Clone)]
struct Target {
    client: Client,
    topic: String,
    subscription: String,
}

#[derive(Debug, Clone, Copy)]
enum Settle {
    Ack,
    Nack(Duration),
}

impl Target {
    /// Sends `receipts` in chunks, retrying failover errors until the calls succeed or fail
    /// definitely. Returns the results of the prefix that was answered.
    async fn settle(
        &self,
        kind: Settle,
        receipts: &[String],
    ) -> (Vec<ReceiptResult>, Option<Error>) {
        let mut results = Vec::with_capacity(receipts.len());
        for chunk in receipts.chunks(MAX_RECEIPTS) {
            let mut backoff = RETRY_INITIAL;
            loop {
                let (topic, subscription) = (&self.topic, &self.subscription);
                let answer = match kind {
                    Settle::Ack => self.client.ack(topic, subscription, chunk).await,
                    Settle::Nack(delay) => {
                        self.client
                            .nack(topic, subscription, chunk, delay, false)
                            .await
                    }
                };
                match answer {
                    Ok(answer) => {
                        results.extend(answer);
                        break;
                    }
                    Err(err) if is_transient(&err) => {
                        tracing::warn!(error = %err, ?kind, "cannot settle messages yet, retrying");
                        tokio::time::sleep(jittered(backoff)).await;
                        backoff = (backoff * 2).min(RETRY_MAX);
                    }
                    Err(err) => return (results, Some(err)),
                }
            }
        }
        (results, None)
    }

    /// One extension round: each chunk once (the next tick retries what fails).
    async fn extend(&self, receipts: Vec<String>, ack_timeout: Duration) -> Extended {
        let mut results = Vec::with_capacity(receipts.len());
        for chunk in receipts.chunks(MAX_RECEIPTS) {
            let answer = self
                .client
                .extend(&self.topic, &self.subscription, chunk, Some(ack_timeout))
                .await;
            match answer {
                Ok(answer) => results.extend(answer),
                Err(err) => {
                    return Extended {
                        results,
                        error: Some(err),
                    }
                }
            }
        }
        Extended {
            results,
            error: None,
        }
    }
}

/// The state of one [`Subscriber::run`].
struct Loop {
    target: Target,
    pull_request: PullRequest,
    ack_timeout: Duration,
    extend_every: Duration,
    batch: usize,
    concurrency: usize,
    nack_delay: Duration,
    stop_grace: Duration,
    flush_timeout: Duration,

    /// Pulled, not started, in pull order.
    queue: VecDeque<Message>,
    /// Every message pulled and not yet settled, by receipt.
    held: HashMap<String, Held>,
    handlers: JoinSet<Result<(), String>>,
    /// The message each running handler works on.
    running: HashMap<Id, Entry>,
    /// Finished, waiting for the next settle request.
    to_ack: Vec<Entry>,
    to_nack: Vec<Entry>,
    to_release: Vec<Entry>,

    pull: Option<BoxFuture<Result<PullResponse, Error>>>,
    /// Pause before the next pull, after failures.
    pull_backoff: Duration,
    /// The settle request in flight and what it carries.
    settle: Option<(Batch, BoxFuture<Settled>)>,
    /// The extend request in flight, with the time it was sent.
    extend: Option<(Instant, BoxFuture<Option<Extended>>)>,

    stopping: bool,
    grace_deadline: Option<Instant>,
    flush_deadline: Option<Instant>,
    fatal: Option<Error>,
    report: StopReport,
}

/// Awaits the future in `slot`; only polled when the slot is full (select! preconditions).
async fn in_slot<T, F: Future<Output = T> + Unpin>(slot: &mut Option<F>) -> T {
    match slot.as_mut() {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Awaits the future of the pair in `slot`, like [`in_slot`].
async fn in_pair_slot<A, T, F: Future<Output = T> + Unpin>(slot: &mut Option<(A, F)>) -> T {
    match slot.as_mut() {
        Some((_, future)) => future.await,
        None => std::future::pending().await,
    }
}

impl Loop {
    async fn run<F, Fut, E>(
        mut self,
        mut handler: F,
        mut stop_rx: watch::Receiver<bool>,
    ) -> Result<StopReport, RunError>
    where
        F: FnMut(Message) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let mut ticker = tokio::time::interval(self.extend_every);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        loop {
            if !self.stopping && *stop_rx.borrow() {
                self.begin_stop(None);
            }
            self.start_handlers(&mut handler, &stop_rx);
            if self.stopping {
                self.check_stop_progress();
            }
            self.start_settle();
            self.start_pull();
            if self.done() {
                break;
            }
            let stopping = self.stopping;
            let has_handlers = !self.handlers.is_empty();
            let has_pull = self.pull.is_some();
            let has_settle = self.settle.is_some();
            let has_extend = self.extend.is_some();
            let grace = self.grace_deadline.filter(|_| has_handlers);
            let flush = self.flush_deadline;
            tokio::select! {
                _ = stop_rx.wait_for(|stopped| *stopped), if !stopping => {
                    self.begin_stop(None);
                }
                Some(joined) = self.handlers.join_next_with_id(), if has_handlers => {
                    self.handler_done(joined);
                }
                result = in_slot(&mut self.pull), if has_pull => {
                    self.pull = None;
                    self.pulled(result);
                }
                settled = in_pair_slot(&mut self.settle), if has_settle => {
                    let (batch, _) = self.settle.take().expect("a settle in flight");
                    self.settled(batch, settled);
                }
                extended = in_pair_slot(&mut self.extend), if has_extend => {
                    let (sent, _) = self.extend.take().expect("an extend in flight");
                    self.extended(sent, extended);
                }
                _ = ticker.tick() => {
                    self.start_extend();
                }
                _ = tokio::time::sleep_until(grace.unwrap_or(far)), if grace.is_some() => {
                    self.grace_over();
                }
                _ = tokio::time::sleep_until(flush.unwrap_or(far)), if flush.is_some() => {
                    self.flush_over();
                }
            }
        }
        match self.fatal {
            None => Ok(self.report),
            Some(error) => Err(RunError {
                error,
                report: self.report,
            }),
        }
    }

    fn begin_stop(&mut self, error: Option<Error>) {
        if let Some(error) = error {
            tracing::error!(%error, "definite error, stopping the subscriber");
            if self.fatal.is_none() {
                self.fatal = Some(error);
            }
        }
        if self.stopping {
            return;
        }
        tracing::debug!(
            queued = self.queue.len(),
            running = self.handlers.len(),
            "stopping the subscriber"
        );
        self.stopping = true;
        // Abandon a pull in flight: what it may have leased comes back after the lease.
        self.pull = None;
        for message in std::mem::take(&mut self.queue) {
            self.release_later((message.offset, message.receipt), true);
        }
        self.grace_deadline = Some(Instant::now() + self.stop_grace);
    }

    /// Starts handlers on queued messages while there is room, unless stopping.
    fn start_handlers<F, Fut, E>(&mut self, handler: &mut F, stop_rx: &watch::Receiver<bool>)
    where
        F: FnMut(Message) -> Fut + Send,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        while !self.stopping && self.handlers.len() < self.concurrency {
            // A handler may have called stop() just before returning: honour it before
            // starting the next message.
            if *stop_rx.borrow() {
                self.begin_stop(None);
                return;
            }
            let Some(message) = self.queue.pop_front() else {
                return;
            };
            if self
                .held
                .get(&message.receipt)
                .is_some_and(|held| held.lost)
            {
                // Its record was or will be delivered again; handling it here too would only
                // duplicate the work.
                self.held.remove(&message.receipt);
                self.report.lost_before_start += 1;
                continue;
            }
            let entry = (message.offset, message.receipt.clone());
            let work = handler(message);
            let task = self
                .handlers
                .spawn(async move { work.await.map_err(|error| error.to_string()) });
            self.running.insert(task.id(), entry);
        }
    }

    /// Queues a nack (after a handler failure) or a release (at stop) of `entry`, and stops
    /// extending its lease.
    fn release_later(&mut self, entry: Entry, at_stop: bool) {
        if let Some(held) = self.held.get_mut(&entry.1) {
            held.releasing = true;
        }
        if at_stop {
            self.to_release.push(entry);
        } else {
            self.to_nack.push(entry);
        }
    }

    fn handler_done(&mut self, joined: Result<(Id, Result<(), String>), tokio::task::JoinError>) {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(err) => (err.id(), Err(err)),
        };
        let Some(entry) = self.running.remove(&id) else {
            return;
        };
        match outcome {
            Ok(Ok(())) => {
                self.report.processed += 1;
                self.to_ack.push(entry);
            }
            Ok(Err(error)) => {
                self.report.processed += 1;
                self.report.failed += 1;
                tracing::warn!(offset = entry.0, %error, "handler failed, releasing the message");
                self.release_later(entry, false);
            }
            Err(err) if err.is_panic() => {
                self.report.processed += 1;
                self.report.failed += 1;
                tracing::error!(offset = entry.0, "handler panicked, releasing the message");
                self.release_later(entry, false);
            }
            Err(_) => {
                // Cancelled: only by the stop, which has released the message already.
            }
        }
    }

    fn start_pull(&mut self) {
        if self.stopping
            || self.pull.is_some()
            || !self.queue.is_empty()
            || self.handlers.len() >= self.concurrency
            || self.held.len() >= self.batch + self.concurrency
        {
            return;
        }
        let target = self.target.clone();
        let request = self.pull_request.clone();
        let pause = self.pull_backoff;
        self.pull = Some(Box::pin(async move {
            if !pause.is_zero() {
                tokio::time::sleep(jittered(pause)).await;
            }
            target
                .client
                .pull(&target.topic, &target.subscription, &request)
                .await
        }));
    }

    fn pulled(&mut self, result: Result<PullResponse, Error>) {
        match result {
            Ok(answer) => {
                self.pull_backoff = Duration::ZERO;
                let now = Instant::now();
                self.report.pulled += answer.messages.len() as u64;
                for message in answer.messages {
                    self.held.insert(
                        message.receipt.clone(),
                        Held {
                            offset: message.offset,
                            renewed: now,
                            lost: false,
                            releasing: false,
                        },
                    );
                    self.queue.push_back(message);
                }
            }
            Err(err) if is_transient(&err) => {
                tracing::warn!(error = %err, "pull failed, retrying");
                self.pull_backoff = (self.pull_backoff * 2).clamp(RETRY_INITIAL, RETRY_MAX);
            }
            Err(err) => self.begin_stop(Some(err)),
        }
    }

    fn start_settle(&mut self) {
        // An extend in flight may carry receipts about to be released: were it applied after
        // the release, it would lease those records again. Releases wait for it; acks need not
        // (an ack is final, a later extend of its receipt is `stale`).
        let releases_may_go = self.extend.is_none();
        if self.settle.is_some()
            || (self.to_ack.is_empty()
                && (!releases_may_go || (self.to_nack.is_empty() && self.to_release.is_empty())))
        {
            return;
        }
        let batch = if releases_may_go {
            Batch {
                acks: std::mem::take(&mut self.to_ack),
                nacks: std::mem::take(&mut self.to_nack),
                releases: std::mem::take(&mut self.to_release),
            }
        } else {
            Batch {
                acks: std::mem::take(&mut self.to_ack),
                ..Batch::default()
            }
        };
        let receipts = |entries: &[Entry]| -> Vec<String> {
            entries.iter().map(|(_, receipt)| receipt.clone()).collect()
        };
        let (acks, nacks, releases) = (
            receipts(&batch.acks),
            receipts(&batch.nacks),
            receipts(&batch.releases),
        );
        let target = self.target.clone();
        let nack_delay = self.nack_delay;
        let future: BoxFuture<Settled> = Box::pin(async move {
            let mut settled = Settled::default();
            if !releases.is_empty() {
                // Releases first: other consumers can have those records right away.
                let (results, error) = target.settle(Settle::Nack(Duration::ZERO), &releases).await;
                settled.releases = results;
                if error.is_some() {
                    settled.error = error;
                    return settled;
                }
            }
            if !acks.is_empty() {
                let (results, error) = target.settle(Settle::Ack, &acks).await;
                settled.acks = results;
                if error.is_some() {
                    settled.error = error;
                    return settled;
                }
            }
            if !nacks.is_empty() {
                let (results, error) = target.settle(Settle::Nack(nack_delay), &nacks).await;
                settled.nacks = results;
                settled.error = error;
            }
            settled
        });
        self.settle = Some((batch, future));
    }

    fn settled(&mut self, batch: Batch, settled: Settled) {
        let Batch {
            acks,
            nacks,
            releases,
        } = batch;
        self.count_results(&releases, &settled.releases, Part::Release);
        self.count_results(&acks, &settled.acks, Part::Ack);
        self.count_results(&nacks, &settled.nacks, Part::Nack);
        if let Some(error) = settled.error {
            // What the error left unanswered is not settled; at stop, report it as such.
            for (entries, results) in [
                (releases, settled.releases.len()),
                (acks, settled.acks.len()),
                (nacks, settled.nacks.len()),
            ] {
                for entry in entries.into_iter().skip(results) {
                    self.held.remove(&entry.1);
                    self.report.unsettled.push(entry);
                }
            }
            self.begin_stop(Some(error));
        }
    }

    fn count_results(&mut self, entries: &[Entry], results: &[ReceiptResult], part: Part) {
        for (entry, result) in entries.iter().zip(results) {
            self.held.remove(&entry.1);
            match (result.status, part) {
                (ReceiptStatus::Stale, _) => self.report.stale += 1,
                (ReceiptStatus::DeadLettered, _) => self.report.dead_lettered += 1,
                (ReceiptStatus::Acked, _) => self.report.acked += 1,
                (ReceiptStatus::Released, Part::Release) => {
                    self.report.released_on_stop.push(entry.clone())
                }
                (ReceiptStatus::Released, _) => self.report.nacked += 1,
                // An answer that does not fit the request: count it where it was meant to go.
                (ReceiptStatus::Extended, Part::Ack) => self.report.acked += 1,
                (ReceiptStatus::Extended, Part::Nack) => self.report.nacked += 1,
                (ReceiptStatus::Extended, Part::Release) => {
                    self.report.released_on_stop.push(entry.clone())
                }
            }
        }
    }

    fn start_extend(&mut self) {
        if self.extend.is_some() {
            return;
        }
        let now = Instant::now();
        // Messages extended (or pulled) less than half a period ago can wait for the next tick.
        let due_before = now.checked_sub(self.extend_every / 2).unwrap_or(now);
        let receipts: Vec<String> = self
            .held
            .iter()
            .filter(|(_, held)| !held.lost && !held.releasing && held.renewed <= due_before)
            .map(|(receipt, _)| receipt.clone())
            .collect();
        if receipts.is_empty() {
            return;
        }
        let target = self.target.clone();
        let (ack_timeout, limit) = (self.ack_timeout, self.extend_every);
        // Bounded by the period, so that a failover cannot hold up the next round.
        let future: BoxFuture<Option<Extended>> = Box::pin(async move {
            tokio::time::timeout(limit, target.extend(receipts, ack_timeout))
                .await
                .ok()
        });
        self.extend = Some((now, future));
    }

    fn extended(&mut self, sent: Instant, extended: Option<Extended>) {
        let Some(extended) = extended else {
            tracing::warn!("extending leases took longer than the extension period");
            return;
        };
        for result in &extended.results {
            let Some(held) = self.held.get_mut(&result.receipt) else {
                continue;
            };
            match result.status {
                ReceiptStatus::Stale => {
                    if !held.lost {
                        held.lost = true;
                        self.report.lost_leases += 1;
                        tracing::warn!(
                            offset = held.offset,
                            "lease lost: the record will be delivered again"
                        );
                    }
                }
                _ => held.renewed = sent,
            }
        }
        match extended.error {
            None => {}
            Some(err) if is_transient(&err) => {
                tracing::warn!(error = %err, "cannot extend leases, retrying at the next tick");
            }
            Some(err) => self.begin_stop(Some(err)),
        }
    }

    /// While stopping: once no handler runs, starts the flush time limit.
    fn check_stop_progress(&mut self) {
        if self.handlers.is_empty() && self.flush_deadline.is_none() {
            self.flush_deadline = Some(Instant::now() + self.flush_timeout);
        }
    }

    /// The grace period ended: cancel the handlers still running and release their messages.
    fn grace_over(&mut self) {
        if self.handlers.is_empty() {
            return;
        }
        tracing::warn!(
            running = self.handlers.len(),
            "handlers did not finish within the stop's grace period, cancelling them"
        );
        // Dropping the set aborts its tasks; their results are of no interest any more.
        self.handlers = JoinSet::new();
        for (_, entry) in std::mem::take(&mut self.running) {
            self.report.cancelled += 1;
            self.release_later(entry, true);
        }
    }

    /// The flush time limit ended: whatever is not settled stays so.
    fn flush_over(&mut self) {
        tracing::warn!("acks and releases did not settle in time after the stop");
        if let Some((batch, _)) = self.settle.take() {
            for entry in batch
                .releases
                .into_iter()
                .chain(batch.acks)
                .chain(batch.nacks)
            {
                self.held.remove(&entry.1);
                self.report.unsettled.push(entry);
            }
        }
        for entry in std::mem::take(&mut self.to_release)
            .into_iter()
            .chain(std::mem::take(&mut self.to_ack))
            .chain(std::mem::take(&mut self.to_nack))
        {
            self.held.remove(&entry.1);
            self.report.unsettled.push(entry);
        }
    }

    /// Stopped, every handler ended, everything settled (or given up on).
    fn done(&self) -> bool {
        self.stopping
            && self.handlers.is_empty()
            && self.queue.is_empty()
            && self.settle.is_none()
            && self.to_ack.is_empty()
            && self.to_nack.is_empty()
            && self.to_release.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
enum Part {
    Ack,
    Nack,
    Release,
}
