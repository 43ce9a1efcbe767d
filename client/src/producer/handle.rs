//! The [`Producer`] handle: opening (spool recovery included), `send`, `flush`, `close`,
//! stats; what it hands the driver.

use super::*;
use crate::api::{json_field_len, json_str_len};

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
        let bytes = encoded_len(&record);
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

/// The size of `record` as JSON in a publish request (plus its separating comma): exactly what
/// serde_json writes, counted without writing it.
pub(crate) fn encoded_len(record: &RecordIn) -> usize {
    let mut fields = Vec::with_capacity(3);
    fields.push(json_field_len(&record.value));
    if let Some(key) = &record.key {
        fields.push(json_str_len("key") + 1 + json_str_len(key));
    }
    if !record.headers.is_empty() {
        let pairs: usize = record
            .headers
            .iter()
            .map(|(name, value)| json_str_len(name) + 1 + json_str_len(value))
            .sum();
        fields.push(json_str_len("headers") + 1 + 2 + pairs + record.headers.len() - 1);
    }
    let body: usize = fields.iter().sum();
    // The comma before the record, the braces, the commas between fields.
    1 + 2 + body + fields.len().saturating_sub(1)
}
