//! The workloads of `raftq bench` themselves: publishing (P1, P3 and pre-fills), the disk
//! probe, consume and ack (P2) and stream fan-out (P4).

use super::measure::append_fsync;
use super::*;

/// Counts, times and histograms of one publishing run.
pub(super) struct Published {
    ok: u64,
    /// The SDK producer's counters: batches, calls, sequence gaps.
    producer: Option<serde_json::Value>,
    secs: f64,
    latencies: Histogram<u64>,
}

impl Ctx {
    /// Publishes `n` records with `inflight` calls in flight; every acknowledged record's
    /// latency (call to acknowledgement) goes into the histogram.
    pub(super) async fn publish(
        &self,
        topic: &str,
        n: u64,
        inflight: usize,
        bar: &ProgressBar,
        errors: &Arc<Errors>,
    ) -> Result<Published, Failure> {
        let producer = match self.args.publish {
            PublishMode::Sdk => {
                let options = ProducerOptions::new()
                    .linger(Duration::from_millis(self.args.linger_ms))
                    .max_in_flight(self.args.producer_batches)
                    .buffer_records(inflight.max(1) * 2)
                    .max_batch_records(self.producer_batch_records());
                let producer = Producer::open(self.client.clone(), topic, options)
                    .await
                    .map_err(Failure::Producer)?;
                Some(producer)
            }
            PublishMode::Single => None,
        };
        let next = Arc::new(AtomicU64::new(0));
        let deadline = self.deadline();
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..inflight {
            let (next, producer, client, errors, bar) = (
                next.clone(),
                producer.clone(),
                self.client.clone(),
                errors.clone(),
                bar.clone(),
            );
            let topic = topic.to_string();
            let make = self.payloads.clone();
            tasks.spawn(async move {
                let mut hist = histogram();
                let mut ok = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n || Instant::now() >= deadline {
                        break;
                    }
                    let record = RecordIn::bytes(make[(i % make.len() as u64) as usize].clone());
                    let sent = Instant::now();
                    let result = match &producer {
                        Some(producer) => match producer.send(record).await {
                            Ok(delivery) => delivery.await.map(|_| ()).map_err(|e| e.to_string()),
                            Err(err) => Err(err.to_string()),
                        },
                        None => client
                            .publish_records(&topic, vec![record])
                            .await
                            .map(|_| ())
                            .map_err(|e| describe(&e)),
                    };
                    match result {
                        Ok(()) => {
                            let us = sent.elapsed().as_micros().max(1) as u64;
                            let _ = hist.record(us.min(600_000_000));
                            ok += 1;
                            bar.inc(1);
                        }
                        Err(text) => errors.record(text),
                    }
                }
                (ok, hist)
            });
        }
        let mut ok = 0;
        let mut latencies = histogram();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((count, hist)) => {
                    ok += count;
                    let _ = latencies.add(hist);
                }
                Err(err) => errors.record(format!("a publishing task failed: {err}")),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let mut stats = None;
        if let Some(producer) = producer {
            if let Err(err) = producer.close().await {
                errors.record(err.to_string());
            }
            let s = producer.stats();
            stats = Some(serde_json::json!({
                "batches": s.batches,
                "publish_calls": s.publish_calls,
                "sequence_gaps": s.sequence_gaps,
                "records_per_batch": round(s.committed as f64 / s.batches.max(1) as f64, 1),
            }));
        }
        Ok(Published {
            ok,
            producer: stats,
            secs,
            latencies,
        })
    }

    pub(super) async fn disk(&self) -> Result<Outcome, Failure> {
        let dir = self.args.disk_dir.clone();
        let secs = Duration::from_secs(self.args.disk_secs.max(1));
        let bar = self.progress("disk", 2);
        let path = dir.join(format!("raftq-disk-probe-{}", self.run_id));
        let halves = bar.clone();
        let probe = tokio::task::spawn_blocking(move || -> std::io::Result<DiskProbe> {
            let result = (|| {
                let small = append_fsync(&path, 4096, secs)?;
                halves.inc(1);
                let large = append_fsync(&path, 1 << 20, secs)?;
                halves.inc(1);
                Ok(DiskProbe {
                    fsyncs_4k_per_s: round(small, 1),
                    mib_per_s_1m: round(large, 1),
                })
            })();
            let _ = std::fs::remove_file(&path);
            result
        })
        .await
        .map_err(|err| Failure::Usage(format!("the disk probe failed: {err}")))?
        .map_err(|err| {
            Failure::Usage(format!(
                "cannot probe the disk in {}: {err}",
                self.args.disk_dir.display()
            ))
        })?;
        bar.finish_and_clear();
        let mut outcome = self.outcome(Workload::Disk, "-", 0, 0, secs.as_secs_f64() * 2.0);
        outcome.msgs_per_s = probe.fsyncs_4k_per_s;
        outcome.mib_per_s = probe.mib_per_s_1m;
        outcome.complete = true;
        outcome.config = BTreeMap::from([(
            "dir",
            serde_json::Value::from(self.args.disk_dir.display().to_string()),
        )]);
        outcome.disk = Some(probe);
        Ok(outcome)
    }

    /// P1 (`n` records, `inflight` calls in flight) and P3 (one in flight): the publishing run
    /// and its latencies.
    pub(super) async fn publishing(
        &self,
        workload: Workload,
        topic: &str,
        n: u64,
        inflight: usize,
        errors: &Arc<Errors>,
    ) -> Result<Outcome, Failure> {
        let bar = self.progress(&workload.name().to_uppercase(), n);
        let published = self.publish(topic, n, inflight, &bar, errors).await?;
        bar.finish_and_clear();
        let mut outcome = self.outcome(workload, topic, n, published.ok, published.secs);
        outcome.latency_ms = latency(&published.latencies);
        outcome.producer = published.producer;
        Ok(outcome)
    }

    pub(super) async fn p2(&self, topic: &str, errors: &Arc<Errors>) -> Result<Outcome, Failure> {
        let n = self.args.n;
        let idle = self.args.idle_leases;
        let bar = self.progress("fill", n + idle);
        let filled = self
            .publish(topic, n + idle, self.args.inflight, &bar, errors)
            .await?;
        bar.finish_and_clear();
        let subscription = "bench";
        let config = SubscriptionConfig {
            start: SubscriptionStart::First,
            ack_timeout_ms: Some(30_000),
            max_deliveries: None,
            dead_letter_topic: None,
        };
        self.client
            .create_subscription(topic, subscription, &config)
            .await?;
        self.take_idle_leases(topic, subscription, idle, errors)
            .await?;
        let target = filled.ok.saturating_sub(idle);
        let bar = self.progress("P2", target);
        let acked = Arc::new(AtomicU64::new(0));
        let redelivered = Arc::new(AtomicU64::new(0));
        // When the last ack landed: consumers still long-polling then do not count.
        let finished = Arc::new(std::sync::OnceLock::new());
        let deadline = self.deadline();
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..self.args.consumers {
            let (client, topic, acked, redelivered, errors, bar, finished) = (
                self.client.clone(),
                topic.to_string(),
                acked.clone(),
                redelivered.clone(),
                errors.clone(),
                bar.clone(),
                finished.clone(),
            );
            let request = PullRequest {
                max: Some(self.args.batch),
                wait_ms: Some(WAIT.as_millis() as u64),
                ack_timeout_ms: None,
                consumer: Some(format!("bench-{i}")),
            };
            tasks.spawn(async move {
                // Acks go out while the next pull is made, at most ACKS_IN_FLIGHT at a time, as
                // a consumer that acks after handling each batch would.
                let mut acks = tokio::task::JoinSet::new();
                while acked.load(Ordering::Relaxed) < target && Instant::now() < deadline {
                    let pulled = match client.pull(&topic, subscription, &request).await {
                        Ok(pulled) => pulled,
                        Err(err) => {
                            errors.record(describe(&err));
                            tokio::time::sleep(ERROR_PAUSE).await;
                            continue;
                        }
                    };
                    if pulled.messages.is_empty() {
                        continue;
                    }
                    let again = pulled
                        .messages
                        .iter()
                        .filter(|m| m.delivery_count > 1)
                        .count();
                    redelivered.fetch_add(again as u64, Ordering::Relaxed);
                    let receipts: Vec<String> =
                        pulled.messages.into_iter().map(|m| m.receipt).collect();
                    while acks.len() >= ACKS_IN_FLIGHT {
                        acks.join_next().await;
                    }
                    let (client, topic, acked, errors, bar, finished) = (
                        client.clone(),
                        topic.clone(),
                        acked.clone(),
                        errors.clone(),
                        bar.clone(),
                        finished.clone(),
                    );
                    acks.spawn(async move {
                        match client.ack(&topic, subscription, &receipts).await {
                            Ok(results) => {
                                let done = results
                                    .iter()
                                    .filter(|r| r.status == ReceiptStatus::Acked)
                                    .count() as u64;
                                if acked.fetch_add(done, Ordering::Relaxed) + done >= target {
                                    let _ = finished.set(Instant::now());
                                }
                                bar.inc(done);
                            }
                            Err(err) => errors.record(describe(&err)),
                        }
                    });
                }
                while acks.join_next().await.is_some() {}
            });
        }
        while let Some(joined) = tasks.join_next().await {
            if let Err(err) = joined {
                errors.record(format!("a consumer task failed: {err}"));
            }
        }
        let secs = finished
            .get()
            .copied()
            .unwrap_or_else(Instant::now)
            .duration_since(start)
            .as_secs_f64();
        bar.finish_and_clear();
        let mut outcome = self.outcome(
            Workload::P2,
            topic,
            n,
            acked.load(Ordering::Relaxed).min(target),
            secs,
        );
        outcome.redelivered = Some(redelivered.load(Ordering::Relaxed));
        outcome.publish_msgs_per_s = Some(round(filled.ok as f64 / filled.secs.max(1e-9), 1));
        Ok(outcome)
    }

    /// Leases the first `idle` records of `subscription` for 12 hours and never acks them.
    async fn take_idle_leases(
        &self,
        topic: &str,
        subscription: &str,
        idle: u64,
        errors: &Arc<Errors>,
    ) -> Result<(), Failure> {
        let bar = self.progress("idle leases", idle);
        let mut taken = 0u64;
        let deadline = self.deadline();
        while taken < idle {
            if Instant::now() >= deadline {
                errors.record(format!(
                    "took {taken} of {idle} idle leases before --max-secs ran out"
                ));
                break;
            }
            let request = PullRequest {
                max: Some((idle - taken).min(u64::from(MAX_PULL)) as u32),
                wait_ms: Some(WAIT.as_millis() as u64),
                ack_timeout_ms: Some(MAX_ACK_TIMEOUT_MS),
                consumer: Some("bench-idle".into()),
            };
            let pulled = self.client.pull(topic, subscription, &request).await?;
            taken += pulled.messages.len() as u64;
            bar.inc(pulled.messages.len() as u64);
        }
        bar.finish_and_clear();
        Ok(())
    }

    pub(super) async fn p4(&self, topic: &str, errors: &Arc<Errors>) -> Result<Outcome, Failure> {
        let n = self.args.n;
        let readers = self.args.readers as u64;
        let bar = self.progress("P4", n * readers);
        let deadline = self.deadline();
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..self.args.readers {
            let mut reader = Reader::for_topic(self.client.clone(), topic)?
                .start(ReadFrom::First)
                .max(1_000)
                .wait(WAIT);
            let (errors, bar) = (errors.clone(), bar.clone());
            tasks.spawn(async move {
                let mut read = 0u64;
                while read < n && Instant::now() < deadline {
                    match reader.next_batch().await {
                        Ok(batch) => {
                            read += batch.records.len() as u64;
                            bar.inc(batch.records.len() as u64);
                        }
                        Err(err) => {
                            errors.record(describe(&err));
                            tokio::time::sleep(ERROR_PAUSE).await;
                        }
                    }
                }
                (read, start.elapsed().as_secs_f64())
            });
        }
        let published = self
            .publish(topic, n, self.args.inflight, &ProgressBar::hidden(), errors)
            .await?;
        let mut rates = Vec::new();
        let mut slowest: Option<(u64, f64)> = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((read, secs)) => {
                    rates.push(round(read as f64 / secs.max(1e-9), 1));
                    if slowest.is_none_or(|(r, s)| (read, -secs) < (r, -s)) {
                        slowest = Some((read, secs));
                    }
                }
                Err(err) => errors.record(format!("a reader task failed: {err}")),
            }
        }
        bar.finish_and_clear();
        let (read, secs) = slowest.unwrap_or((0, start.elapsed().as_secs_f64()));
        let mut outcome = self.outcome(Workload::P4, topic, n, read.min(published.ok), secs);
        outcome.complete = read >= n && published.ok >= n;
        outcome.per_reader_msgs_per_s = rates;
        outcome.publish_msgs_per_s = Some(round(published.ok as f64 / published.secs.max(1e-9), 1));
        Ok(outcome)
    }
}
