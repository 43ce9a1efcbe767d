// The `raftq` command (also built, WAL off, as the chaos suite's negative control).

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "raftq",
    version,
    about = "A replicated message queue that never loses an acknowledged message"
)]
struct Cli {
    /// Log format: `human` or `json`.
    #[arg(long, global = true, env = "RAFTQ_LOG_FORMAT", default_value = "human", value_parser = ["human", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one node of a raftq cluster.
    Serve(raftq::config::ServeArgs),
    /// Consume a subscription: pull messages, print each on a line, ack it once printed.
    Consume(raftq_cli::ConsumeArgs),
    /// Print a topic's records, optionally for a subscription (moving its cursor) and following.
    Tail(raftq_cli::TailArgs),
    /// Publish lines of a file or stdin as records, in ordered idempotent batches; with
    /// --spool, a killed run loses nothing and a rerun resumes.
    Publish(raftq_cli::PublishArgs),
    /// Print the counters of a topic (or of every topic) as of a commit point.
    Report(raftq_cli::ReportArgs),
    /// Measure a running cluster: durable publish (P1), consume and ack (P2), latency (P3),
    /// stream fan-out (P4).
    Bench(raftq_cli::bench::BenchArgs),
    /// See and change the cluster: status, add, promote, remove, transfer-leader, snapshot.
    Cluster(raftq_cli::cluster::ClusterArgs),
    /// Make API tokens: a new random token with its tokens-file entry, or a token's hash.
    Token(raftq::admin::token::TokenArgs),
    /// Create, list, describe and delete topics.
    Topic(raftq_cli::topic::TopicArgs),
    /// Create, list, describe and delete the subscriptions of a topic.
    Sub(raftq_cli::sub::SubArgs),
    /// Copy a node's newest snapshot to a backup file (safe beside a running node).
    Backup(raftq::admin::backup::BackupArgs),
    /// Make the data directory of a new cluster's node from a backup file.
    Restore(raftq::admin::backup::RestoreArgs),
    /// Ask one node whether it is alive (or, with --ready, ready); exit 0 if so, 1 if not.
    Health(raftq_cli::health::HealthArgs),
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAFTQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=error"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let result = match cli.command {
        Cmd::Serve(args) => args.resolve().and_then(|settings| {
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = settings.worker_threads {
                runtime.worker_threads(n);
            }
            runtime
                .enable_all()
                .build()?
                .block_on(raftq::server::run(settings))
        }),
        Cmd::Consume(args) => return raftq_cli::consume(args),
        Cmd::Tail(args) => return raftq_cli::tail(args),
        Cmd::Publish(args) => return raftq_cli::publish(args),
        Cmd::Report(args) => return raftq_cli::report(args),
        Cmd::Cluster(args) => return raftq_cli::cluster::cluster(args),
        Cmd::Bench(args) => return raftq_cli::bench::bench(args),
        Cmd::Token(args) => return raftq::admin::token::token(args),
        Cmd::Topic(args) => return raftq_cli::topic::topic(args),
        Cmd::Sub(args) => return raftq_cli::sub::sub(args),
        Cmd::Backup(args) => return raftq::admin::backup::backup(args),
        Cmd::Restore(args) => return raftq::admin::backup::restore(args),
        Cmd::Health(args) => return raftq_cli::health::health(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raftq: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
