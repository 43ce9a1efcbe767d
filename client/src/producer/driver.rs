//! The producer's driver task: seals batches, keeps up to `max_in_flight` of them in flight in
//! order, re-sends with the same sequence, and settles each record's outcome.

use super::*;

mod answers;

/// What a publish task reports.
pub(super) struct Attempt {
    slot: u64,
    seq: u64,
    /// Every batch before this one was committed when it was sent.
    front: bool,
    maybe_applied: bool,
    result: Result<PublishResponse, Error>,
}

/// The background task: owns the batches, the spool and the publish tasks.
pub(super) struct Driver {
    pub(super) client: Client,
    pub(super) topic: Arc<str>,
    pub(super) producer_id: Arc<str>,
    pub(super) linger: Duration,
    pub(super) max_batch_records: usize,
    pub(super) max_batch_bytes: usize,
    pub(super) max_in_flight: usize,
    pub(super) rx: mpsc::UnboundedReceiver<Msg>,
    pub(super) shared: Arc<Shared>,
    pub(super) records_room: Arc<Semaphore>,
    pub(super) bytes_room: Arc<Semaphore>,
    pub(super) spooled: bool,
    /// `None` without a spool, and while a blocking write has it.
    pub(super) spool: Option<Spool>,
    /// The batch being filled.
    pub(super) open: Vec<Pending>,
    pub(super) open_bytes: usize,
    pub(super) open_since: Option<Instant>,
    /// Sealed batches not yet removed, in sequence (and local sequence) order. Committed ones
    /// are removed from the front.
    pub(super) slots: VecDeque<Slot>,
    /// The sequence of the next sealed batch.
    pub(super) next_seq: u64,
    /// One past the last local sequence received.
    pub(super) received_below: u64,
    pub(super) tasks: JoinSet<Attempt>,
    pub(super) task_slots: HashMap<tokio::task::Id, u64>,
    /// Committed batches to mark done in the spool.
    pub(super) done: Vec<u64>,
    /// The server forgot this producer: once nothing is in flight, the unsettled batches are
    /// renumbered from 0, starting with this one.
    pub(super) restart_from_zero: Option<u64>,
    /// Seal the open batch now (a flush).
    pub(super) seal_now: bool,
    /// `(local sequence, responder)`: answered once everything below it is settled.
    pub(super) flush_waiters: Vec<(u64, Responder)>,
    pub(super) close_waiters: Vec<Responder>,
    /// Close requested, or every handle dropped: finish what is there, then stop.
    pub(super) closing: bool,
    /// Every handle is gone and the queue is empty: stop receiving.
    pub(super) intake_done: bool,
    /// Refused batches waiting for the renumbering of the batches after them.
    pub(super) refused_waiting: usize,
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
    pub(super) async fn run(mut self) {
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
            let handle = self.tasks.spawn(publish_batch(
                self.client.clone(),
                self.topic.clone(),
                (records, self.producer_id.clone(), seq),
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
    (records, producer_id, seq): (Arc<Vec<RecordIn>>, Arc<str>, u64),
    slot: u64,
    front: bool,
    shared: Arc<Shared>,
) -> Attempt {
    let mut maybe_applied = false;
    let mut backoff = RETRY_INITIAL;
    // Encoded once: a batch sent again is the same bytes.
    let encoded = match client.encode_publish(&records, Some(&producer_id), Some(seq)) {
        Ok(encoded) => encoded,
        Err(err) => {
            return Attempt {
                slot,
                seq,
                front,
                maybe_applied,
                result: Err(err),
            }
        }
    };
    loop {
        add(&shared.stats.publish_calls, 1);
        let result = client
            .send_publish(&topic, &encoded, &records, Some(&producer_id), Some(seq))
            .await;
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
