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

mod run_loop;

use run_loop::{Loop, Target};

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
        let target = Target {
            client: self.client,
            topic: self.topic,
            subscription: self.subscription,
        };
        let state = Loop::new(
            target,
            pull_request,
            ack_timeout,
            extend_every,
            &self.options,
        );
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
