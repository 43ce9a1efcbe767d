//! The loop of one [`Subscriber::run`]: pulls, hands messages to the handler, extends leases,
//! acks, nacks and releases, and stops gracefully with a report.

use super::*;

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
pub(super) struct Target {
    pub(super) client: Client,
    pub(super) topic: String,
    pub(super) subscription: String,
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
pub(super) struct Loop {
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
    /// The loop's state before its first pull.
    pub(super) fn new(
        target: Target,
        pull_request: PullRequest,
        ack_timeout: Duration,
        extend_every: Duration,
        options: &SubscriberOptions,
    ) -> Loop {
        Loop {
            target,
            pull_request,
            ack_timeout,
            extend_every,
            batch: options.batch as usize,
            concurrency: options.concurrency,
            nack_delay: options.nack_delay,
            stop_grace: options.stop_grace,
            flush_timeout: options.flush_timeout,
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
        }
    }

    pub(super) async fn run<F, Fut, E>(
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
