//! The client commands of the `raftq` binary: `consume` (queue semantics, through
//! [`raftq_client::Subscriber`]), `tail` (stream semantics, through [`raftq_client::Reader`]),
//! `publish` (lines as records, through [`raftq_client::Producer`]) and `report` (a topic's
//! counters).
//!
//! All find the cluster from `--url` (repeatable) or `RAFTQ_URL` (comma-separated), default
//! the local three-node cluster of `scripts/cluster.sh`, and send `--token`/`RAFTQ_TOKEN` when
//! given. Records go to stdout, one per line; everything else goes to stderr. Exit status: 0
//! when done or stopped by Ctrl-C, 1 when the cluster refused or could not serve the request
//! (the problem's title and detail are printed), 2 for usage errors. `publish` exits 0 only
//! when every record was committed, 1 when any failed or has an unknown outcome, and 130 when
//! interrupted.

pub mod backup;
pub mod bench;
pub mod cluster;
pub mod health;
pub mod sub;
pub mod token;
pub mod topic;

use std::io::{self, BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use raftq_client::api::{
    CommitPoint, Message, ReadFrom, Record, RecordIn, SubscriptionReport, TopicReport, MAX_PULL,
};
use raftq_client::{
    Client, Delivery, Error, Producer, ProducerError, ProducerOptions, Reader, SendError,
    Subscriber, SubscriberOptions,
};

/// Nodes tried when neither `--url` nor `RAFTQ_URL` names any.
pub const DEFAULT_URLS: [&str; 3] = [
    "http://127.0.0.1:7001",
    "http://127.0.0.1:7002",
    "http://127.0.0.1:7003",
];

/// Long-poll wait of `tail -f` reads.
const FOLLOW_WAIT: Duration = Duration::from_secs(10);
/// Most records one `tail` read asks for.
const TAIL_BATCH: u64 = 1_000;
/// How long `tail` tries to commit its last batch to a subscription when it ends.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the cluster.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// A node's base URL; repeat for more nodes (any one reachable node finds the leader).
    #[arg(
        long = "url",
        value_name = "URL",
        env = "RAFTQ_URL",
        value_delimiter = ',',
        default_values = DEFAULT_URLS,
        global = true
    )]
    pub urls: Vec<String>,
    /// API token, sent as `Authorization: Bearer <token>`.
    #[arg(long, env = "RAFTQ_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// PEM CA certificates to trust for `https://` nodes, instead of the system's.
    #[arg(long, value_name = "FILE", env = "RAFTQ_CA_FILE", global = true)]
    pub ca_file: Option<std::path::PathBuf>,
}

/// `raftq consume`: pull messages of a subscription, print each, ack it once printed.
#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    /// The topic.
    pub topic: String,
    /// The subscription to consume (it must exist).
    #[arg(long, short = 's')]
    pub subscription: String,
    /// Stop after this many messages (the default: run until Ctrl-C).
    #[arg(long, short = 'n', value_name = "N")]
    pub max: Option<u64>,
    /// Print each message as a JSON line (with its receipt, headers and timestamps).
    #[arg(long)]
    pub json: bool,
    /// Most messages leased per pull.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub batch: u32,
    /// Consumer name sent with each pull.
    #[arg(long)]
    pub consumer: Option<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `raftq tail`: print the records of a topic, optionally following a subscription's cursor.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// The topic.
    pub topic: String,
    /// Where to start: `first`, `last`, `next` or an offset. Default: the subscription's cursor
    /// with `--subscription`, `first` without.
    #[arg(long, value_name = "first|last|next|N")]
    pub from: Option<ReadFrom>,
    /// Read for this subscription: start at its cursor and move the cursor past every record
    /// printed.
    #[arg(long, short = 's')]
    pub subscription: Option<String>,
    /// Keep waiting for new records (long-poll) until Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Stop after this many records.
    #[arg(long, short = 'n', value_name = "N")]
    pub max: Option<u64>,
    /// Print each record as a JSON line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// `raftq publish`: publish the lines of a file (or of stdin) as records, one per line.
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// The topic (it must exist).
    pub topic: String,
    /// Read the records from this file instead of stdin. With `--spool`, a run started again
    /// with the same file and spool skips the lines already accepted and continues.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Keep accepted records in this directory until they are committed: a killed run loses
    /// nothing, and the next run with the same spool sends what was pending first.
    #[arg(long, value_name = "DIR")]
    pub spool: Option<PathBuf>,
    /// The producer id, for a new spool (default: the spool's own, or a random id). Needs
    /// `--spool`.
    #[arg(long, value_name = "ID")]
    pub producer_id: Option<String>,
    /// Give every record this key.
    #[arg(long, conflicts_with = "key_separator")]
    pub key: Option<String>,
    /// Split each line at the first SEP: the key before it, the value after it (a line
    /// without SEP has no key).
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// Most records per batch.
    #[arg(long, default_value_t = 1_000, value_name = "N")]
    pub batch: usize,
    /// How long a batch waits for more records, in milliseconds (it keeps filling anyway while
    /// `--in-flight` batches are out).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub linger_ms: u64,
    /// Most batches in flight at once.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub in_flight: usize,
    /// Most records read ahead and not yet committed (reading waits when it is reached).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub buffer: usize,
    #[command(flatten)]
    pub connection: Connection,
}

/// `raftq report`: the counters of one topic, or of every topic, as of a commit point.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// The topic (default: every topic).
    pub topic: Option<String>,
    /// Print the report as JSON, as the server answers it.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

/// Why a command failed: decides the exit status.
#[derive(Debug)]
enum Failure {
    /// Bad arguments: exit 2.
    Usage(String),
    /// The cluster refused or could not serve: exit 1.
    Api(Error),
    /// Writing to stdout failed: exit 1.
    Output(io::Error),
    /// The producer could not start or stopped: exit 1.
    Producer(ProducerError),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument(_) | Error::InvalidUrl { .. } => Failure::Usage(err.to_string()),
            other => Failure::Api(other),
        }
    }
}

impl Failure {
    fn report(self) -> ExitCode {
        match self {
            Failure::Usage(text) => {
                eprintln!("raftq: {text}");
                ExitCode::from(2)
            }
            Failure::Api(err) => {
                eprintln!("raftq: {}", describe(&err));
                ExitCode::from(1)
            }
            Failure::Output(err) => {
                eprintln!("raftq: cannot write to stdout: {err}");
                ExitCode::from(1)
            }
            Failure::Producer(err) => {
                eprintln!("raftq: {err}");
                ExitCode::from(1)
            }
        }
    }
}

/// An error for humans: a problem's title and detail, otherwise the error's own text.
pub fn describe(err: &Error) -> String {
    match err.problem() {
        Some(problem) if problem.detail.is_empty() => problem.title.clone(),
        Some(problem) => format!("{}: {}", problem.title, problem.detail),
        None => err.to_string(),
    }
}

fn connect(connection: &Connection) -> Result<Client, Failure> {
    let urls: Vec<&str> = connection
        .urls
        .iter()
        .map(|url| url.trim())
        .filter(|url| !url.is_empty())
        .collect();
    if urls.is_empty() {
        return Err(Failure::Usage("no node URL given".to_string()));
    }
    let mut builder = Client::builder(urls);
    if let Some(token) = &connection.token {
        builder = builder.token(token);
    }
    if let Some(ca) = &connection.ca_file {
        builder = builder.ca_file(ca)?;
    }
    Ok(builder.build()?)
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|err| Failure::Usage(format!("cannot start the runtime: {err}")))
}

/// Calls `on_first` at the first Ctrl-C; a second Ctrl-C exits at once with status 130.
fn on_interrupt(on_first: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        eprintln!("raftq: stopping (Ctrl-C again to quit at once)");
        on_first();
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
}

/// Runs `raftq consume`.
pub fn consume(args: ConsumeArgs) -> ExitCode {
    match runtime().and_then(|rt| rt.block_on(run_consume(args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn run_consume(args: ConsumeArgs) -> Result<(), Failure> {
    if args.max == Some(0) {
        return Ok(());
    }
    if args.batch == 0 || args.batch > MAX_PULL {
        return Err(Failure::Usage(format!(
            "--batch is 1 to {MAX_PULL}, not {}",
            args.batch
        )));
    }
    let client = connect(&args.connection)?;
    // Never lease more than are left to print: what is leased and not printed is released at
    // the stop, but would have been held from other consumers meanwhile.
    let batch = match args.max {
        Some(max) => u64::from(args.batch).min(max) as u32,
        None => args.batch,
    };
    let mut options = SubscriberOptions::new().batch(batch);
    if let Some(consumer) = &args.consumer {
        options = options.consumer(consumer.clone());
    }
    let subscriber = Subscriber::new(client, &args.topic, &args.subscription, options)?;
    let stop = subscriber.stop_handle();
    let interrupt = stop.clone();
    on_interrupt(move || interrupt.stop());

    let printed = Arc::new(AtomicU64::new(0));
    let count = printed.clone();
    let (json, max) = (args.json, args.max);
    // One handler at a time (the default concurrency): lines come out in pull order, and a
    // message is acked only after its line was flushed to stdout.
    let result = subscriber
        .run(move |message: Message| {
            let written = print_message(&message, json);
            if written.is_ok() {
                let done = count.fetch_add(1, Ordering::SeqCst) + 1;
                if max.is_some_and(|max| done >= max) {
                    // The subscriber starts no handler after this; the message is still acked.
                    stop.stop();
                }
            } else {
                stop.stop();
            }
            async move { written }
        })
        .await;

    let (report, error) = match result {
        Ok(report) => (report, None),
        Err(err) => (err.report, Some(err.error)),
    };
    eprintln!(
        "raftq: {} consumed: {} acked, {} released for redelivery{}",
        printed.load(Ordering::SeqCst),
        report.acked,
        report.nacked + report.released_on_stop.len() as u64,
        if report.stale > 0 {
            format!(", {} acks found their lease already lost", report.stale)
        } else {
            String::new()
        }
    );
    if !report.unsettled.is_empty() {
        let offsets: Vec<String> = report
            .unsettled
            .iter()
            .map(|(offset, _)| offset.to_string())
            .collect();
        eprintln!(
            "raftq: warning: could not ack or release offsets {}: they will be delivered again \
             when their lease expires",
            offsets.join(", ")
        );
    }
    if let Some(err) = error {
        return Err(err.into());
    }
    if report.failed > 0 {
        // Only output errors fail this handler.
        return Err(Failure::Output(io::Error::other(
            "stdout closed, the message was released",
        )));
    }
    Ok(())
}

fn print_message(message: &Message, json: bool) -> Result<(), io::Error> {
    let line = if json {
        serde_json::to_string(message).map_err(io::Error::other)?
    } else {
        format!(
            "{}\t{}\t{}\t{}",
            message.offset,
            message.delivery_count,
            key_field(message.key.as_deref()),
            value_field(message.value.as_deref(), message.value_b64.as_deref())
        )
    };
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// Runs `raftq tail`.
pub fn tail(args: TailArgs) -> ExitCode {
    match runtime().and_then(|rt| rt.block_on(run_tail(args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn run_tail(args: TailArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let mut reader = match &args.subscription {
        Some(subscription) => Reader::new(client, &args.topic, subscription)?,
        None => Reader::for_topic(client, &args.topic)?,
    };
    if let Some(from) = args.from {
        reader = reader.start(from);
    }
    reader = if args.follow {
        // Following rides out failovers, however long: Ctrl-C ends it.
        reader.wait(FOLLOW_WAIT)
    } else {
        // A one-off read gives up when the client's deadline passes without an answer.
        reader.wait(Duration::ZERO).retry_for(Duration::ZERO)
    };

    let interrupted = Arc::new(tokio::sync::Notify::new());
    let notify = interrupted.clone();
    on_interrupt(move || notify.notify_one());

    let mut printed = 0u64;
    let mut out = io::stdout().lock();
    loop {
        let remaining = args.max.map(|max| max.saturating_sub(printed));
        if remaining == Some(0) {
            break;
        }
        // Never read more than is left to print: with a subscription, the whole batch is
        // committed by the next read.
        reader.set_max(Some(remaining.unwrap_or(TAIL_BATCH).min(TAIL_BATCH)));
        let batch = tokio::select! {
            batch = reader.next_batch() => batch?,
            _ = interrupted.notified() => break,
        };
        if batch.skipped > 0 {
            eprintln!(
                "raftq: {} records before offset {} were removed by retention and skipped",
                batch.skipped,
                batch
                    .records
                    .first()
                    .map_or(batch.next_offset, |record| record.offset)
            );
        }
        for record in &batch.records {
            // Stdout failing (a closed pipe) ends the command without committing this batch:
            // it is read again next time.
            print_record(&mut out, record, args.json).map_err(Failure::Output)?;
            printed += 1;
        }
        out.flush().map_err(Failure::Output)?;
        if !args.follow && (batch.records.is_empty() || batch.next_offset >= batch.high_watermark) {
            break;
        }
    }
    drop(out);
    // Commit the last batch printed (with a subscription): the next reader starts after it.
    match tokio::time::timeout(COMMIT_TIMEOUT, reader.commit()).await {
        Ok(result) => result?,
        Err(_) => eprintln!(
            "raftq: warning: could not move the subscription's cursor past the last records \
             printed; they will be read again"
        ),
    }
    Ok(())
}

/// Lines read ahead of the producer.
const PUBLISH_READ_AHEAD: usize = 4_096;
/// Most lines handed to the producer in one `send_many`.
const PUBLISH_CHUNK: usize = 1_000;
/// How often progress is redrawn on a terminal.
const PROGRESS_TTY: Duration = Duration::from_millis(250);
/// How often a progress line is printed when stderr is not a terminal.
const PROGRESS_PLAIN: Duration = Duration::from_secs(10);
/// Failed records printed one by one; the rest are only counted.
const FAILURES_SHOWN: u64 = 10;

/// One line of input: its number (from 0) and its bytes, without the line end.
struct Line {
    number: u64,
    bytes: Vec<u8>,
}

/// What the collector of deliveries saw (the totals come from the producer's counters).
#[derive(Debug, Default)]
struct Tally {
    /// Records whose outcome is unknown (they may have been appended).
    unknown: u64,
    /// Failures printed so far.
    shown: u64,
}

/// Runs `raftq publish`.
pub fn publish(args: PublishArgs) -> ExitCode {
    match runtime().and_then(|rt| rt.block_on(run_publish(args))) {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}

fn producer_failure(err: ProducerError) -> Failure {
    match err {
        ProducerError::InvalidArgument(text) => Failure::Usage(text),
        other => Failure::Producer(other),
    }
}

async fn run_publish(args: PublishArgs) -> Result<ExitCode, Failure> {
    if args.producer_id.is_some() && args.spool.is_none() {
        return Err(Failure::Usage(
            "--producer-id needs --spool: without a spool a producer starts again at batch \
             sequence 0, and the server would take a new run's records for duplicates of an \
             earlier run's and drop them. Give a --spool directory (it keeps the id and the \
             sequence), or leave out --producer-id"
                .to_string(),
        ));
    }
    if args.key_separator.as_deref() == Some("") {
        return Err(Failure::Usage(
            "--key-separator must not be empty".to_string(),
        ));
    }
    // The input is opened first: a missing file is reported before anything is sent.
    let input: Box<dyn BufRead + Send> = match &args.file {
        Some(path) => match std::fs::File::open(path) {
            Ok(file) => Box::new(io::BufReader::new(file)),
            Err(err) => {
                return Err(Failure::Usage(format!(
                    "cannot read {}: {err}",
                    path.display()
                )))
            }
        },
        None => Box::new(io::BufReader::new(io::stdin())),
    };
    let client = connect(&args.connection)?;
    // A missing topic is one clear error, rather than one refusal per batch.
    client.topic(&args.topic).await?;
    let mut options = ProducerOptions::new()
        .max_batch_records(args.batch)
        .linger(Duration::from_millis(args.linger_ms))
        .max_in_flight(args.in_flight)
        .buffer_records(args.buffer);
    if let Some(dir) = &args.spool {
        options = options.spool(dir.clone());
    }
    if let Some(id) = &args.producer_id {
        options = options.producer_id(id.clone());
    }
    let producer = Producer::open(client, &args.topic, options)
        .await
        .map_err(producer_failure)?;

    // With a spool and a file, line i is the record with local sequence i: the lines the
    // spool has accepted are skipped.
    let resumable = args.file.is_some() && args.spool.is_some();
    let skip = if resumable {
        producer.next_local_sequence()
    } else {
        0
    };
    let recovered = producer.recovered().clone();
    if recovered.records > 0 {
        eprintln!(
            "raftq: re-sending {} records that the spool held from an earlier run",
            recovered.records
        );
    }
    if skip > 0 {
        eprintln!("raftq: resuming: skipping the first {skip} lines, accepted by an earlier run");
    }
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::channel(PUBLISH_READ_AHEAD);
    std::thread::spawn(move || read_lines(input, skip, lines_tx));

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    on_interrupt(move || {
        let _ = stop_tx.send(true);
    });
    let tty = io::stderr().is_terminal();
    let started = Instant::now();
    let progress = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(if tty { PROGRESS_TTY } else { PROGRESS_PLAIN });
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let done = producer.stats().committed;
                let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
                if tty {
                    eprint!("\r\x1b[2Kraftq: {done} published ({rate:.0}/s)");
                } else {
                    eprintln!("raftq: {done} published ({rate:.0}/s)");
                }
            }
        })
    };
    let (outcomes_tx, mut outcomes_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Delivery)>();
    // Set when an interrupted run with a spool stops: its unsettled records are not failures,
    // they wait in the spool for the next run.
    let kept_in_spool = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let quiet = kept_in_spool.clone();
    let collector = tokio::spawn(async move {
        let mut tally = Tally::default();
        while let Some((number, delivery)) = outcomes_rx.recv().await {
            let failure = match delivery.await {
                Ok(_) | Err(SendError::OffsetUnknown) => continue,
                Err(err) => err,
            };
            if matches!(failure, SendError::Indeterminate { .. }) {
                tally.unknown += 1;
            }
            let kept = quiet.load(Ordering::SeqCst) && !matches!(failure, SendError::Refused(_));
            if tally.shown < FAILURES_SHOWN && !kept {
                tally.shown += 1;
                let clear = if tty { "\r\x1b[2K" } else { "" };
                eprintln!("{clear}raftq: line {}: {failure}", number + 1);
            }
        }
        tally
    });

    let mut interrupted = false;
    let mut stopped: Option<ProducerError> = None;
    let mut input_error: Option<String> = None;
    'input: loop {
        let first = tokio::select! {
            line = lines_rx.recv() => line,
            Ok(()) = stop_rx.changed() => {
                interrupted = true;
                break;
            }
        };
        let Some(first) = first else { break };
        let mut chunk = vec![first];
        while chunk.len() < PUBLISH_CHUNK {
            match lines_rx.try_recv() {
                Ok(line) => chunk.push(line),
                Err(_) => break,
            }
        }
        let mut numbers = Vec::with_capacity(chunk.len());
        let mut records = Vec::with_capacity(chunk.len());
        for line in chunk {
            match line {
                Ok(line) => {
                    numbers.push(line.number);
                    records.push(record_of(
                        line.bytes,
                        args.key.as_deref(),
                        args.key_separator.as_deref(),
                    ));
                }
                Err(text) => {
                    input_error = Some(text);
                    break;
                }
            }
        }
        if !records.is_empty() {
            let sent = tokio::select! {
                sent = producer.send_many(records) => sent,
                Ok(()) = stop_rx.changed() => {
                    interrupted = true;
                    break;
                }
            };
            match sent {
                Ok(deliveries) => {
                    for (number, delivery) in numbers.into_iter().zip(deliveries) {
                        if resumable && delivery.local_sequence() != number {
                            stopped = Some(ProducerError::Desynchronized {
                                detail: format!(
                                    "line {} got local sequence {}: the spool does not match \
                                     the file",
                                    number + 1,
                                    delivery.local_sequence()
                                ),
                            });
                            break 'input;
                        }
                        let _ = outcomes_tx.send((number, delivery));
                    }
                }
                Err(err) => {
                    stopped = Some(err);
                    break;
                }
            }
        }
        if input_error.is_some() {
            break;
        }
    }
    drop(lines_rx);

    let end = if interrupted && args.spool.is_some() {
        kept_in_spool.store(true, Ordering::SeqCst);
        producer.abort().await;
        Ok(())
    } else {
        if interrupted {
            eprintln!(
                "raftq: interrupted: waiting for the outcome of what was sent (Ctrl-C again to \
                 quit at once)"
            );
        }
        producer.close().await
    };
    if let Err(err) = end {
        stopped.get_or_insert(err);
    }
    drop(outcomes_tx);
    let tally = collector.await.unwrap_or_default();
    progress.abort();

    let elapsed = started.elapsed().as_secs_f64();
    let stats = producer.stats();
    if tty {
        eprint!("\r\x1b[2K");
    }
    // The producer's counters, not the tally: records accepted by a `send_many` cut short by
    // Ctrl-C have their outcome too, without a delivery anyone awaited.
    let mut summary = format!(
        "raftq: {} records published to {} in {elapsed:.1} s ({:.0}/s)",
        stats.committed,
        args.topic,
        stats.committed as f64 / elapsed.max(0.001)
    );
    if recovered.records > 0 {
        summary.push_str(&format!(
            ", {} of them from the spool of an earlier run",
            recovered.records.min(stats.committed)
        ));
    }
    if stats.duplicates > 0 {
        summary.push_str(&format!(
            "; {} were already in the topic (a batch sent again after a lost answer or a \
             restart) and were not appended twice",
            stats.duplicates
        ));
    }
    eprintln!("{summary}");
    if stats.refused > 0 {
        eprintln!("raftq: {} records refused (not appended)", stats.refused);
    }
    if stats.unsettled > 0 && !kept_in_spool.load(Ordering::SeqCst) {
        eprintln!(
            "raftq: {} records have no outcome: the producer stopped before their batches were \
             settled ({} of them may have been appended, as listed above)",
            stats.unsettled, tally.unknown
        );
    }
    let failed = stats.refused + stats.unsettled;
    if let Some(text) = &input_error {
        eprintln!("raftq: {text}");
    }
    if let Some(err) = &stopped {
        eprintln!("raftq: {err}");
    }
    // Accepted (into the spool) and not settled: counted by the producer, since records
    // accepted by a `send_many` cut short by Ctrl-C never reached the tally.
    let unsettled =
        (recovered.records + stats.accepted).saturating_sub(stats.committed + stats.refused);
    let spool_note = |what: &str| {
        if let Some(dir) = &args.spool {
            eprintln!(
                "raftq: {what}: the {unsettled} records accepted and not yet committed stay in the \
                 spool {}; run the same command again to send them{}",
                dir.display(),
                if resumable {
                    " and the rest of the file"
                } else {
                    ""
                }
            );
        }
    };
    if interrupted {
        spool_note("interrupted");
        return Ok(ExitCode::from(130));
    }
    if stopped.is_some() || input_error.is_some() || failed > 0 {
        if stopped.is_some() {
            spool_note("stopped");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads lines (split at `\n`, a `\r` before it dropped), skipping the first `skip`, and
/// hands them over until the receiver is gone. Runs on its own thread: reading stdin blocks.
fn read_lines(
    mut input: Box<dyn BufRead + Send>,
    skip: u64,
    lines: tokio::sync::mpsc::Sender<Result<Line, String>>,
) {
    let mut number = 0u64;
    loop {
        let mut bytes = Vec::new();
        match input.read_until(b'\n', &mut bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) => {
                let _ = lines.blocking_send(Err(format!("cannot read line {}: {err}", number + 1)));
                return;
            }
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if number >= skip && lines.blocking_send(Ok(Line { number, bytes })).is_err() {
            return;
        }
        number += 1;
    }
    if number < skip {
        let _ = lines.blocking_send(Err(format!(
            "the spool has accepted {skip} records but the input has only {number} lines: is it \
             the file the spool was used with?"
        )));
    }
}

/// A line as a record: text when it is UTF-8, binary otherwise; the key from `--key` or
/// split off at `--key-separator`.
fn record_of(bytes: Vec<u8>, key: Option<&str>, separator: Option<&str>) -> RecordIn {
    let (key, value) = match separator {
        Some(separator) => {
            let sep = separator.as_bytes();
            match bytes.windows(sep.len()).position(|window| window == sep) {
                Some(at) => (
                    Some(String::from_utf8_lossy(&bytes[..at]).into_owned()),
                    bytes[at + sep.len()..].to_vec(),
                ),
                None => (None, bytes),
            }
        }
        None => (key.map(str::to_string), bytes),
    };
    let record = match String::from_utf8(value) {
        Ok(text) => RecordIn::text(text),
        Err(err) => RecordIn::binary(err.as_bytes()),
    };
    match key {
        Some(key) => record.with_key(key),
        None => record,
    }
}

/// Runs `raftq report`.
pub fn report(args: ReportArgs) -> ExitCode {
    match runtime().and_then(|rt| rt.block_on(run_report(args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

async fn run_report(args: ReportArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let text = match &args.topic {
        Some(topic) => {
            let report = client.topic_report(topic).await?;
            if args.json {
                json_text(&report)?
            } else {
                report_table(report.commit_point, &[(topic.as_str(), &report)])
            }
        }
        None => {
            let report = client.report().await?;
            if args.json {
                json_text(&report)?
            } else {
                let topics: Vec<(&str, &TopicReport)> = report
                    .topics
                    .iter()
                    .map(|(name, topic)| (name.as_str(), topic))
                    .collect();
                report_table(report.commit_point, &topics)
            }
        }
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::Output)
}

fn json_text(value: &impl serde::Serialize) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|text| text + "\n")
        .map_err(|err| Failure::Output(io::Error::other(err)))
}

/// A report for people: the commit point, one row per topic, one row per subscription.
fn report_table(commit_point: CommitPoint, topics: &[(&str, &TopicReport)]) -> String {
    let mut text = format!(
        "commit point: log index {} at {} (every count is as of this entry)\n",
        commit_point.index,
        utc_time(commit_point.timestamp_ms)
    );
    if topics.is_empty() {
        text.push_str("\nno topics\n");
        return text;
    }
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|(name, topic)| {
            let mut row = vec![name.to_string()];
            row.extend(
                [
                    topic.published,
                    topic.deduplicated,
                    topic.records,
                    topic.discarded.retention,
                    topic.discarded.max_deliveries,
                    topic.discarded.rejected,
                ]
                .map(|n| n.to_string()),
            );
            row
        })
        .collect();
    text.push('\n');
    text.push_str(&table(
        &[
            "topic",
            "published",
            "deduplicated",
            "records",
            "discarded:retention",
            "max_deliveries",
            "rejected",
        ],
        &rows,
        1,
    ));
    let subscriptions: Vec<Vec<String>> = topics
        .iter()
        .flat_map(|(name, topic)| {
            topic
                .subscriptions
                .iter()
                .map(move |(sub, report)| subscription_row(name, sub, report))
        })
        .collect();
    text.push('\n');
    if subscriptions.is_empty() {
        text.push_str("no subscriptions\n");
    } else {
        text.push_str(&table(
            &[
                "topic",
                "subscription",
                "delivered",
                "acked",
                "redelivered",
                "expired_leases",
                "dead_lettered",
                "skipped",
                "cursor",
                "backlog",
                "in_flight",
            ],
            &subscriptions,
            2,
        ));
    }
    text
}

fn subscription_row(topic: &str, name: &str, report: &SubscriptionReport) -> Vec<String> {
    let mut row = vec![topic.to_string(), name.to_string()];
    row.extend(
        [
            report.delivered,
            report.acked,
            report.redelivered,
            report.expired_leases,
            report.dead_lettered,
            report.skipped,
            report.cursor,
            report.backlog,
            report.in_flight,
        ]
        .map(|n| n.to_string()),
    );
    row
}

/// Aligned columns: the first `text_columns` to the left, the others (numbers) to the right.
fn table(headers: &[&str], rows: &[Vec<String>], text_columns: usize) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i < text_columns {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("{cell:>width$}"));
            }
        }
        line.trim_end().to_string() + "\n"
    };
    let mut text = line(headers.to_vec());
    for row in rows {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time.
fn utc_time(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn print_record(out: &mut impl Write, record: &Record, json: bool) -> Result<(), io::Error> {
    if json {
        let line = serde_json::to_string(record).map_err(io::Error::other)?;
        writeln!(out, "{line}")
    } else {
        writeln!(
            out,
            "{}\t{}\t{}",
            record.offset,
            key_field(record.key.as_deref()),
            value_field(record.value.as_deref(), record.value_b64.as_deref())
        )
    }
}

/// A key on one line: `-` when there is none.
fn key_field(key: Option<&str>) -> String {
    key.map_or_else(|| "-".to_string(), escape)
}

/// A value on one line: text escaped, binary as `base64:...`.
fn value_field(value: Option<&str>, value_b64: Option<&str>) -> String {
    match (value, value_b64) {
        (Some(text), _) => escape(text),
        (None, Some(b64)) => format!("base64:{b64}"),
        (None, None) => String::new(),
    }
}

/// Escapes what would break a tab-separated line: backslash, tab, newlines and other control
/// characters. `--json` prints values exactly.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '\t' => escaped.push_str("\\t"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            c if c.is_control() => escaped.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Command {
        Consume(ConsumeArgs),
        Tail(TailArgs),
        Publish(PublishArgs),
        Report(ReportArgs),
    }

    #[test]
    fn lines_escape_what_would_break_them() {
        assert_eq!(escape("a\tb\nc\\d\u{1}é"), "a\\tb\\nc\\\\d\\u{1}é");
        assert_eq!(key_field(None), "-");
        assert_eq!(value_field(None, Some("AAE=")), "base64:AAE=");
        let record = Record {
            offset: 7,
            timestamp_ms: 1,
            key: Some("k".into()),
            headers: Default::default(),
            value: Some("two\nlines".into()),
            value_b64: None,
        };
        let mut out = Vec::new();
        print_record(&mut out, &record, false).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "7\tk\ttwo\\nlines\n");
        let mut out = Vec::new();
        print_record(&mut out, &record, true).unwrap();
        let back: Record = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn arguments_parse() {
        // Only the flags are checked here; URLs from the environment are not (tests share it).
        let cli = Cli::try_parse_from([
            "raftq",
            "tail",
            "t",
            "--from",
            "last",
            "-f",
            "-s",
            "s",
            "--url",
            "http://a:1",
            "--url",
            "http://b:2,http://c:3",
        ])
        .unwrap();
        let Command::Tail(tail) = cli.command else {
            panic!("tail")
        };
        assert_eq!(tail.from, Some(ReadFrom::Last));
        assert!(tail.follow);
        assert_eq!(tail.subscription.as_deref(), Some("s"));
        assert_eq!(
            tail.connection.urls,
            vec!["http://a:1", "http://b:2", "http://c:3"]
        );
        assert!(Cli::try_parse_from(["raftq", "tail", "t", "--from", "latest"]).is_err());
        assert!(
            Cli::try_parse_from(["raftq", "consume", "t"]).is_err(),
            "needs -s"
        );
        let cli = Cli::try_parse_from(["raftq", "consume", "t", "-s", "s", "--max", "3", "--json"])
            .unwrap();
        let Command::Consume(consume) = cli.command else {
            panic!("consume")
        };
        assert_eq!((consume.max, consume.json), (Some(3), true));
    }

    #[test]
    fn publish_and_report_arguments_parse() {
        let cli = Cli::try_parse_from([
            "raftq",
            "publish",
            "t",
            "--file",
            "lines.txt",
            "--spool",
            "spool-dir",
            "--producer-id",
            "importer",
            "--batch",
            "100",
            "--linger-ms",
            "0",
        ])
        .unwrap();
        let Command::Publish(publish) = cli.command else {
            panic!("publish")
        };
        assert_eq!(publish.file, Some(PathBuf::from("lines.txt")));
        assert_eq!(publish.spool, Some(PathBuf::from("spool-dir")));
        assert_eq!(publish.producer_id.as_deref(), Some("importer"));
        assert_eq!(
            (publish.batch, publish.linger_ms, publish.in_flight),
            (100, 0, 5)
        );
        assert!(
            Cli::try_parse_from([
                "raftq",
                "publish",
                "t",
                "--key",
                "k",
                "--key-separator",
                ":"
            ])
            .is_err(),
            "--key and --key-separator exclude each other"
        );
        let cli = Cli::try_parse_from(["raftq", "report", "--json"]).unwrap();
        let Command::Report(report) = cli.command else {
            panic!("report")
        };
        assert_eq!((report.topic, report.json), (None, true));
    }

    #[tokio::test]
    async fn producer_id_without_a_spool_is_refused_before_anything_is_sent() {
        let cli = Cli::try_parse_from([
            "raftq",
            "publish",
            "t",
            "--producer-id",
            "p",
            "--url",
            "http://127.0.0.1:9",
        ])
        .unwrap();
        let Command::Publish(publish) = cli.command else {
            panic!("publish")
        };
        match run_publish(publish).await {
            Err(Failure::Usage(text)) => assert!(text.contains("--spool"), "{text}"),
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn lines_become_records_with_keys() {
        let plain = record_of(b"hello".to_vec(), None, None);
        assert_eq!(plain, RecordIn::text("hello"));
        let keyed = record_of(b"hello".to_vec(), Some("k"), None);
        assert_eq!(keyed, RecordIn::text("hello").with_key("k"));
        let split = record_of(b"order-17::placed::now".to_vec(), None, Some("::"));
        assert_eq!(split, RecordIn::text("placed::now").with_key("order-17"));
        let unsplit = record_of(b"no separator".to_vec(), None, Some("::"));
        assert_eq!(unsplit, RecordIn::text("no separator"));
        let binary = record_of(vec![0xff, 0x00], None, None);
        assert_eq!(binary, RecordIn::binary(&[0xff, 0x00]));
    }

    #[test]
    fn lines_are_read_after_the_skipped_ones() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let input: Box<dyn BufRead + Send> = Box::new(io::Cursor::new(b"a\nb\r\nc\n\nd".to_vec()));
        read_lines(input, 1, tx);
        let mut got = Vec::new();
        while let Ok(line) = rx.try_recv() {
            let line = line.unwrap();
            got.push((line.number, String::from_utf8(line.bytes).unwrap()));
        }
        let expected: Vec<(u64, String)> = [(1, "b"), (2, "c"), (3, ""), (4, "d")]
            .map(|(n, s)| (n, s.to_string()))
            .to_vec();
        assert_eq!(got, expected);

        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        read_lines(Box::new(io::Cursor::new(b"a\n".to_vec())), 5, tx);
        let err = rx.try_recv().unwrap().err().unwrap();
        assert!(err.contains("only 1 lines"), "{err}");
    }

    #[test]
    fn reports_print_as_aligned_tables() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_time(1_764_480_000_123), "2025-11-30T05:20:00.123Z");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        let mut topic = TopicReport {
            published: 10_000,
            deduplicated: 12,
            records: 10_000,
            ..Default::default()
        };
        topic.subscriptions.insert(
            "billing".to_string(),
            SubscriptionReport {
                delivered: 7,
                acked: 5,
                cursor: 5,
                ..Default::default()
            },
        );
        let text = report_table(
            CommitPoint {
                index: 42,
                timestamp_ms: 0,
            },
            &[("orders", &topic)],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("log index 42 at 1970-01-01T00:00:00.000Z"),
            "{text}"
        );
        assert_eq!(lines[2].split_whitespace().next(), Some("topic"));
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["orders", "10000", "12", "10000", "0", "0", "0"]
        );
        assert_eq!(
            lines[6].split_whitespace().take(4).collect::<Vec<_>>(),
            ["orders", "billing", "7", "5"]
        );
        // Numbers are right-aligned under their headers.
        assert_eq!(
            lines[2].find("published").map(|at| at + "published".len()),
            lines[3].find("10000").map(|at| at + 5)
        );
        assert!(report_table(CommitPoint::default(), &[]).contains("no topics"));
    }

    #[test]
    fn problems_print_title_and_detail() {
        let problem = raftq_client::api::Problem::new(
            raftq_client::api::ErrorCode::SubscriptionNotFound,
            "no subscription s on topic t",
        );
        assert_eq!(
            describe(&Error::Api(Box::new(problem))),
            "Subscription not found: no subscription s on topic t"
        );
    }
}
