//! `raftq bench`: the standard workloads against a running cluster, through the SDK.
//!
//! - **P1** durable publish: `--n` records of `--size` random bytes, `--inflight` publish calls
//!   in flight, one record per call; a record counts only once its publish is acknowledged
//!   (committed on a majority, each fsynced). With `--publish sdk` (the default) the calls go
//!   through one [`Producer`], which coalesces concurrent calls into idempotent batches, as an
//!   application using the SDK would; `--publish single` sends one POST per record.
//! - **P2** consume and ack: `--n` records published first, then `--consumers` consumers on
//!   one subscription, each pulling batches of `--batch` and acking every message it got;
//!   the rate until every record is acked. `--idle-leases N` first leases `N` more records
//!   that are never acked, to measure acks with that many leases in flight.
//! - **P3** latency: `--lat-n` publishes one after the other (one in flight).
//! - **P4** stream fan-out: `--readers` readers read the whole topic from offset 0 while a
//!   producer publishes `--n` records; records per second per reader.
//!
//! Every workload runs on a topic of its own (`<prefix>-p1-<run id>` ...), deleted afterwards
//! unless `--keep`. Results are a table on stdout, or one JSON object per workload with
//! `--json`; `--out FILE` appends the JSON lines to a file as well. `--watch-pid` samples the
//! resident memory of server processes on this machine during each workload, and what each
//! record cost: their CPU time and this process's, and the bytes they wrote to disk.

mod measure;
mod workloads;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use raftq_client::api::{
    PullRequest, ReadFrom, ReceiptStatus, RecordIn, Retention, SubscriptionConfig,
    SubscriptionStart, TopicConfig, MAX_ACK_TIMEOUT_MS, MAX_PULL,
};
use raftq_client::{Client, Producer, ProducerOptions, Reader};
use rand::RngCore;
use serde::Serialize;

use crate::{block_on, connect, describe, table, Connection, Failure};

use measure::{histogram, latency, round, CostWatch, Errors, MemoryWatch};
pub use measure::{Cost, ProcessCost};

/// Distinct payloads generated per run; records cycle through them.
const PAYLOAD_POOL: usize = 1024;
/// How often progress is printed when stderr is not a terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Acks a P2 consumer has in flight while it pulls again.
const ACKS_IN_FLIGHT: usize = 2;
/// Long-poll wait of pulls and reads.
const WAIT: Duration = Duration::from_millis(1_000);
/// How long a P2 consumer or P4 reader waits after an error before it tries again, so a node
/// that keeps failing is not asked again in a tight loop.
const ERROR_PAUSE: Duration = Duration::from_millis(50);

/// One of the standard workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    P1,
    P2,
    P3,
    P4,
    /// The disk's fsync ceiling in `--disk-dir`: 4 KiB appends and 1 MiB appends, each followed
    /// by fdatasync.
    Disk,
}

impl Workload {
    /// The name on the command line, in results and in topic names.
    fn name(self) -> &'static str {
        match self {
            Workload::P1 => "p1",
            Workload::P2 => "p2",
            Workload::P3 => "p3",
            Workload::P4 => "p4",
            Workload::Disk => "disk",
        }
    }
}

/// The topic a workload runs on: `<prefix>-<workload>-<run id>-<round>`, lower-case.
fn topic_name(prefix: &str, workload: Workload, run_id: &str, round: u32) -> String {
    format!("{prefix}-{}-{run_id}-{round}", workload.name()).to_lowercase()
}

/// How P1, P3 and the pre-fills publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishMode {
    /// Through one SDK producer: concurrent calls become idempotent batches.
    Sdk,
    /// One POST of one record per call (no batching, no idempotency).
    Single,
}

/// `raftq bench`: run P1 to P4 against a running cluster.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workloads to run, in this order.
    #[arg(long, value_delimiter = ',', default_value = "p1,p2,p3,p4")]
    pub workloads: Vec<Workload>,
    /// Records of P1, P2 and P4.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub n: u64,
    /// Bytes of each record's value (random; base64 in JSON, as they are in record batches).
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    pub size: usize,
    /// Publish calls in flight in P1, P2's pre-fill and P4.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub inflight: usize,
    /// How publishes are sent.
    #[arg(long, value_enum, default_value = "sdk")]
    pub publish: PublishMode,
    /// The SDK producer's most batches in flight.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub producer_batches: usize,
    /// The SDK producer's most records per batch (default: `--inflight`, so that every
    /// record in flight can go in one batch).
    #[arg(long, value_name = "N")]
    pub producer_batch_records: Option<usize>,
    /// The SDK producer's linger, in milliseconds (it seals a batch early only when it could
    /// be sent at once).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub linger_ms: u64,
    /// Publishes of P3, one in flight.
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    pub lat_n: u64,
    /// Consumers of P2.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub consumers: usize,
    /// Most messages per pull in P2.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub batch: u32,
    /// Leases P2 takes before its consumers start and never acks (pulled with a 12-hour ack
    /// timeout, on `N` more records published first): what an ack costs with that many
    /// leases in flight.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub idle_leases: u64,
    /// Readers of P4.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub readers: usize,
    /// Run the whole list of workloads this many times (memory should not grow across runs).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeat: u32,
    /// Give up on a workload after this many seconds.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub max_secs: u64,
    /// Prefix of the topics the workloads create.
    #[arg(long, default_value = "bench", value_name = "NAME")]
    pub topic_prefix: String,
    /// Keep the topics afterwards (they are deleted by default).
    #[arg(long)]
    pub keep: bool,
    /// Sample the resident memory of this process (a node on this machine) during each
    /// workload, and count its CPU time and disk writes per record; repeat for more.
    #[arg(long = "watch-pid", value_name = "PID")]
    pub watch_pids: Vec<u32>,
    /// Print one JSON object per workload instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also append one JSON line per workload to this file.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Directory the `disk` workload writes its probe file in (removed afterwards).
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub disk_dir: PathBuf,
    /// Seconds of each half of the `disk` workload.
    #[arg(long, default_value_t = 3, value_name = "SECS")]
    pub disk_secs: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Latency figures, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// Resident memory of one watched process.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub pid: u32,
    pub rss_start_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_end_mib: f64,
}

/// The disk's fsync ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct DiskProbe {
    /// 4 KiB appends, each followed by fdatasync, per second.
    pub fsyncs_4k_per_s: f64,
    /// MiB per second of 1 MiB appends, each followed by fdatasync.
    pub mib_per_s_1m: f64,
}

/// The outcome of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub workload: Workload,
    pub run: u32,
    pub topic: String,
    /// Records the workload set out to move.
    pub n: u64,
    /// Records acknowledged (P1, P3), acked (P2) or read by the slowest reader (P4).
    pub done: u64,
    pub complete: bool,
    pub secs: f64,
    pub msgs_per_s: f64,
    pub mib_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<Latency>,
    /// P2: messages delivered more than once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redelivered: Option<u64>,
    /// P4: records/s of each reader.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_reader_msgs_per_s: Vec<f64>,
    /// P2 and P4: the pre-fill or concurrent producer's own rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish_msgs_per_s: Option<f64>,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<Memory>,
    /// With `--watch-pid`: CPU time and disk writes per record over the whole workload (for P2
    /// and P4 that includes their publishing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskProbe>,
    /// P1, P3: the SDK producer's batches, publish calls and `sequence_gap` answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub producer: Option<serde_json::Value>,
    pub config: BTreeMap<&'static str, serde_json::Value>,
}

/// Runs `raftq bench`.
pub fn bench(args: BenchArgs) -> ExitCode {
    match check(&args) {
        Ok(()) => block_on(run(args)),
        Err(failure) => failure.report(),
    }
}

fn check(args: &BenchArgs) -> Result<(), Failure> {
    let usage = |text: String| Err(Failure::Usage(text));
    if args.workloads.is_empty() {
        return usage("--workloads names no workload".into());
    }
    if args.n == 0 || args.lat_n == 0 {
        return usage("--n and --lat-n are at least 1".into());
    }
    if args.size == 0 || args.size > 1 << 20 {
        return usage(format!("--size is 1 to 1048576 bytes, not {}", args.size));
    }
    if args.inflight == 0 || args.inflight > 4096 {
        return usage(format!("--inflight is 1 to 4096, not {}", args.inflight));
    }
    if args.consumers == 0 || args.readers == 0 || args.consumers > 256 || args.readers > 256 {
        return usage("--consumers and --readers are 1 to 256".into());
    }
    if args.batch == 0 || args.batch > MAX_PULL {
        return usage(format!("--batch is 1 to {MAX_PULL}, not {}", args.batch));
    }
    if args.repeat == 0 {
        return usage("--repeat is at least 1".into());
    }
    if args.idle_leases > 1_000_000 {
        return usage(format!(
            "--idle-leases is at most 1000000, not {}",
            args.idle_leases
        ));
    }
    // The longest name a run makes: a topic-creating workload, an 8-digit run id, the last round.
    let longest = topic_name(&args.topic_prefix, Workload::P1, "00000000", args.repeat);
    if !raftq_client::api::is_valid_name(&longest) {
        return usage(format!(
            "--topic-prefix {:?} does not make valid topic names ({longest:?}: \
             [A-Za-z0-9._-], at most 128 characters)",
            args.topic_prefix
        ));
    }
    Ok(())
}

/// What every workload shares.
struct Ctx {
    client: Client,
    args: BenchArgs,
    payloads: Arc<Vec<bytes::Bytes>>,
    run_id: String,
}

async fn run(args: BenchArgs) -> Result<ExitCode, Failure> {
    let client = connect(&args.connection)?;
    let status = client.cluster().await?;
    let mut rng = rand::thread_rng();
    let payloads = (0..PAYLOAD_POOL)
        .map(|_| {
            let mut bytes = vec![0u8; args.size];
            rng.fill_bytes(&mut bytes);
            bytes::Bytes::from(bytes)
        })
        .collect();
    let run_id = format!("{:08x}", rng.next_u32());
    if !args.quiet {
        eprintln!(
            "raftq bench: {} nodes, leader {}, workloads {:?} x{}, run {run_id}",
            status.members.len(),
            status
                .leader_id
                .map_or("unknown".to_string(), |id| id.to_string()),
            args.workloads,
            args.repeat,
        );
    }
    let ctx = Ctx {
        client,
        args,
        payloads: Arc::new(payloads),
        run_id,
    };
    let mut outcomes = Vec::new();
    for round in 1..=ctx.args.repeat {
        for &workload in &ctx.args.workloads {
            let outcome = ctx.workload(workload, round).await?;
            emit(&ctx.args, &outcome)?;
            outcomes.push(outcome);
        }
    }
    if !ctx.args.json {
        println!("{}", summary(&outcomes));
        if outcomes.iter().any(|o| o.workload == Workload::Disk) {
            println!(
                "Disk: MSGS/S is 4 KiB appends each followed by fdatasync per second, MIB/S the \
                 throughput of 1 MiB appends each followed by fdatasync."
            );
        }
    }
    Ok(if outcomes.iter().all(|o| o.complete) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn emit(args: &BenchArgs, outcome: &Outcome) -> Result<(), Failure> {
    let line = serde_json::to_string(outcome)
        .map_err(|err| Failure::Usage(format!("cannot encode a result: {err}")))?;
    if args.json {
        println!("{line}");
    }
    if let Some(path) = &args.out {
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| writeln!(file, "{line}"));
        if let Err(err) = written {
            return Err(Failure::Usage(format!(
                "cannot append to {}: {err}",
                path.display()
            )));
        }
    }
    Ok(())
}

fn summary(outcomes: &[Outcome]) -> String {
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let lat = |f: fn(&Latency) -> f64| {
                o.latency_ms
                    .as_ref()
                    .map_or("-".to_string(), |l| format!("{:.2}", f(l)))
            };
            let peak = o.memory.iter().map(|m| m.rss_peak_mib).reduce(f64::max);
            vec![
                format!("{:?}", o.workload),
                o.run.to_string(),
                format!("{}/{}", o.done, o.n),
                format!("{:.2}", o.secs),
                format!("{:.0}", o.msgs_per_s),
                format!("{:.1}", o.mib_per_s),
                lat(|l| l.p50),
                lat(|l| l.p99),
                lat(|l| l.p999),
                peak.map_or("-".to_string(), |p| format!("{p:.0}")),
                o.cost.as_ref().map_or("-".to_string(), |c| {
                    format!(
                        "{:.1}",
                        c.nodes_cpu_us_per_record + c.client_cpu_us_per_record
                    )
                }),
                o.cost.as_ref().map_or("-".to_string(), |c| {
                    format!("{:.0}", c.disk_bytes_per_record_per_node)
                }),
                o.errors.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "WORKLOAD",
            "RUN",
            "RECORDS",
            "SECS",
            "MSGS/S",
            "MIB/S",
            "P50 MS",
            "P99 MS",
            "P999 MS",
            "PEAK RSS MIB",
            "CPU US/REC",
            "DISK B/REC/NODE",
            "ERRORS",
        ],
        &rows,
        1,
    )
}

impl Ctx {
    /// A progress bar on a terminal; elsewhere (a log, CI) a line every few seconds.
    fn progress(&self, label: &str, total: u64) -> ProgressBar {
        if self.args.quiet {
            return ProgressBar::hidden();
        }
        if !std::io::stderr().is_terminal() {
            let bar = ProgressBar::hidden();
            bar.set_length(total);
            let (ticker, label) = (bar.clone(), label.to_string());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(PROGRESS_EVERY).await;
                    if ticker.is_finished() {
                        return;
                    }
                    eprintln!(
                        "raftq bench: {label} {}/{total} ({:.0}/s)",
                        ticker.position(),
                        ticker.per_sec()
                    );
                }
            });
            return bar;
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>4} [{elapsed_precise}] {wide_bar} {pos}/{len} {per_sec} eta {eta}",
            )
            .expect("valid progress template"),
        );
        bar.set_prefix(label.to_string());
        bar
    }

    /// The SDK producer's most records per batch: `--producer-batch-records`, else
    /// `--inflight`.
    fn producer_batch_records(&self) -> usize {
        self.args
            .producer_batch_records
            .unwrap_or(self.args.inflight)
            .clamp(1, 10_000)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.args.max_secs)
    }

    async fn fresh_topic(&self, workload: Workload, round: u32) -> Result<String, Failure> {
        let name = topic_name(&self.args.topic_prefix, workload, &self.run_id, round);
        // A leftover of an earlier run with the same id would skew the counts.
        match self.client.delete_topic(&name).await {
            Ok(()) => {}
            Err(err) if err.problem().is_some_and(|p| p.status == 404) => {}
            Err(err) => return Err(err.into()),
        }
        let config = TopicConfig {
            retention: Retention::default(),
            max_record_bytes: None,
        };
        self.client.create_topic(&name, &config).await?;
        Ok(name)
    }

    async fn drop_topic(&self, name: &str) {
        if self.args.keep {
            return;
        }
        if let Err(err) = self.client.delete_topic(name).await {
            eprintln!(
                "raftq bench: could not delete topic {name}: {}",
                describe(&err)
            );
        }
    }

    async fn workload(&self, workload: Workload, round: u32) -> Result<Outcome, Failure> {
        if workload == Workload::Disk {
            let mut outcome = self.disk().await?;
            outcome.run = round;
            return Ok(outcome);
        }
        let topic = self.fresh_topic(workload, round).await?;
        let watch = MemoryWatch::start(&self.args.watch_pids);
        let cost = CostWatch::start(&self.args.watch_pids);
        let errors = Arc::new(Errors::default());
        let mut outcome = match workload {
            Workload::P1 => {
                self.publishing(workload, &topic, self.args.n, self.args.inflight, &errors)
                    .await?
            }
            Workload::P2 => self.p2(&topic, &errors).await?,
            Workload::P3 => {
                self.publishing(workload, &topic, self.args.lat_n, 1, &errors)
                    .await?
            }
            Workload::P4 => self.p4(&topic, &errors).await?,
            Workload::Disk => unreachable!("handled above"),
        };
        outcome.memory = watch.finish();
        outcome.cost = cost.finish(outcome.done);
        let (count, first) = errors.take();
        outcome.errors = count;
        outcome.first_error = first;
        outcome.run = round;
        outcome.config = self.config(workload);
        self.drop_topic(&topic).await;
        Ok(outcome)
    }

    fn config(&self, workload: Workload) -> BTreeMap<&'static str, serde_json::Value> {
        let a = &self.args;
        let mut c = BTreeMap::new();
        c.insert("size", a.size.into());
        c.insert("urls", a.connection.urls.clone().into());
        c.insert(
            "publish_format",
            match a.connection.publish_format {
                crate::PublishFormatArg::RecordBatch => "record-batch",
                crate::PublishFormatArg::Json => "json",
            }
            .into(),
        );
        c.insert(
            "read_format",
            match a.connection.read_format {
                crate::ReadFormatArg::Records => "records",
                crate::ReadFormatArg::Json => "json",
            }
            .into(),
        );
        c.insert(
            "publish",
            serde_json::to_value(a.publish).unwrap_or_default(),
        );
        if a.publish == PublishMode::Sdk {
            c.insert("producer_batches", a.producer_batches.into());
            c.insert(
                "producer_batch_records",
                self.producer_batch_records().into(),
            );
            c.insert("linger_ms", a.linger_ms.into());
        }
        if matches!(workload, Workload::P1 | Workload::P2 | Workload::P4) {
            c.insert("inflight", a.inflight.into());
        }
        if workload == Workload::P2 {
            c.insert("consumers", a.consumers.into());
            c.insert("batch", a.batch.into());
            c.insert("idle_leases", a.idle_leases.into());
        }
        if workload == Workload::P4 {
            c.insert("readers", a.readers.into());
        }
        c
    }

    fn outcome(&self, workload: Workload, topic: &str, n: u64, done: u64, secs: f64) -> Outcome {
        let rate = done as f64 / secs.max(1e-9);
        Outcome {
            workload,
            run: 0,
            topic: topic.to_string(),
            n,
            done,
            complete: done >= n,
            secs: round(secs, 3),
            msgs_per_s: round(rate, 1),
            mib_per_s: round(rate * self.args.size as f64 / (1 << 20) as f64, 2),
            latency_ms: None,
            redelivered: None,
            per_reader_msgs_per_s: Vec::new(),
            publish_msgs_per_s: None,
            errors: 0,
            first_error: None,
            memory: Vec::new(),
            cost: None,
            disk: None,
            producer: None,
            config: BTreeMap::new(),
        }
    }
}
