//! What the driver does with each batch's outcome: an answer from the server (committed, a
//! sequence gap, a refusal), a lost attempt, and the renumbering that follows a refusal.

use super::*;

impl Driver {
    pub(super) fn on_attempt(
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
    pub(super) fn try_renumber(&mut self) -> Result<Option<Op>, ProducerError> {
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
}

fn desync(detail: String) -> ProducerError {
    ProducerError::Desynchronized { detail }
}
