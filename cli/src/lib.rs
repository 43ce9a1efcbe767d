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
//!
//! The `raftq` binary dispatches these beside `serve`; they speak to the cluster only through the
//! SDK ([`raftq_client`]), never through the server's own code.

pub mod bench;
pub mod cluster;
mod consume;
pub mod health;
mod publish;
mod report;
pub mod sub;
pub mod topic;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use raftq_client::api::ReadFrom;
use raftq_client::{Client, Error, ProducerError};

pub use consume::{consume, tail};
pub use publish::publish;
pub use report::report;

/// Nodes tried when neither `--url` nor `RAFTQ_URL` names any.
pub const DEFAULT_URLS: [&str; 3] = [
    "http://127.0.0.1:7001",
    "http://127.0.0.1:7002",
    "http://127.0.0.1:7003",
];

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
    /// How publishes are sent: Kafka record batches, or JSON (for servers that predate
    /// record batches).
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        env = "RAFTQ_PUBLISH_FORMAT",
        default_value = "record-batch",
        global = true
    )]
    pub publish_format: PublishFormatArg,
    /// How reads and pulls ask for records: in their binary form (record batches), or JSON.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        env = "RAFTQ_READ_FORMAT",
        default_value = "records",
        global = true
    )]
    pub read_format: ReadFormatArg,
}

/// `--read-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadFormatArg {
    Records,
    Json,
}

/// `--publish-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PublishFormatArg {
    RecordBatch,
    Json,
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
    builder = builder.publish_format(match connection.publish_format {
        PublishFormatArg::RecordBatch => raftq_client::PublishFormat::RecordBatch,
        PublishFormatArg::Json => raftq_client::PublishFormat::Json,
    });
    builder = builder.read_format(match connection.read_format {
        ReadFormatArg::Records => raftq_client::ReadFormat::Records,
        ReadFormatArg::Json => raftq_client::ReadFormat::Json,
    });
    Ok(builder.build()?)
}

/// Every command runs on one thread: a client's work is waiting on sockets, and where it
/// shares a small machine with the nodes (as `raftq bench` does), a second worker thread only
/// adds wake-ups and context switches that take the cores from the nodes. Measured on two
/// cores (docs/performance.md, "Step 18: the client on one thread"): P1 through `raftq bench`
/// at half the client's CPU per record, and the nodes' own CPU per record lower too. Blocking
/// work (the disk probe, the spool's files) goes to tokio's blocking pool, as before.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure::Usage(format!("cannot start the runtime: {err}")))
}

/// How a command's run ends when it succeeds: an exit status of its own, or 0.
trait Done {
    fn exit_code(self) -> ExitCode;
}

impl Done for () {
    fn exit_code(self) -> ExitCode {
        ExitCode::SUCCESS
    }
}

impl Done for ExitCode {
    fn exit_code(self) -> ExitCode {
        self
    }
}

/// Runs a command on a runtime of its own and turns how it ended into the exit status.
fn block_on<T: Done>(work: impl std::future::Future<Output = Result<T, Failure>>) -> ExitCode {
    match runtime().and_then(|rt| rt.block_on(work)) {
        Ok(done) => done.exit_code(),
        Err(failure) => failure.report(),
    }
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

/// A value as pretty JSON, one trailing newline.
fn json_text(value: &impl serde::Serialize) -> Result<String, Failure> {
    serde_json::to_string_pretty(value)
        .map(|text| text + "\n")
        .map_err(|err| Failure::Output(io::Error::other(err)))
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use raftq_client::api::ReadFrom;

    use super::*;
    use crate::publish::run_publish;
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

    /// Commands run on one thread (see `runtime`): a second worker took the cores from the
    /// nodes a benchmark measures.
    #[test]
    fn commands_run_on_one_thread() {
        let rt = runtime().expect("a runtime");
        assert_eq!(
            rt.handle().runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        );
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
