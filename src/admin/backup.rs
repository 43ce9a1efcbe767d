//! `raftq backup` and `raftq restore`: a node's newest snapshot copied to a file, and the data
//! directory of a new cluster's node made from such a file (see [`crate::store::backup`]).
//! Exit status 0 on success, 1 on any failure (with what went wrong on stderr).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::store::backup;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The data directory of a node (running or stopped) whose newest snapshot is copied.
    /// Build a fresh one first with `raftq cluster snapshot --url` that node.
    #[arg(long, env = "RAFTQ_DATA")]
    pub data: PathBuf,
    /// The backup file to write; never overwritten.
    #[arg(long)]
    pub out: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup file (`raftq backup --out`).
    #[arg(long)]
    pub from: PathBuf,
    /// The settings of the node to make, as `raftq serve` takes them: `--data` must be
    /// empty or absent, and every node of the new cluster is restored from the same file
    /// with the same `--peers`.
    #[command(flatten)]
    pub serve: crate::config::ServeArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn backup(args: BackupArgs) -> ExitCode {
    match backup::backup(&args.data, &args.out) {
        Ok((meta, bytes)) => {
            let index = meta.last_log_id.map_or(0, |l| l.index);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "file": args.out,
                        "index": index,
                        "bytes": bytes,
                        "snapshot_id": meta.snapshot_id,
                    })
                );
            } else {
                println!(
                    "backed up snapshot {} (state as of log index {index}, {bytes} bytes) to {}",
                    meta.snapshot_id,
                    args.out.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("raftq backup: {e:#}");
            ExitCode::from(1)
        }
    }
}

pub fn restore(args: RestoreArgs) -> ExitCode {
    let result = args.serve.resolve().and_then(|settings| {
        let target = backup::Target {
            data: settings.data.clone(),
            cluster_id: settings.cluster_id.clone(),
            id: settings.id,
            peers: settings.peers.clone(),
            write_buffer_bytes: settings.write_buffer_bytes,
        };
        backup::restore(&args.from, &target).map(|r| (settings, r))
    });
    match result {
        Ok((settings, r)) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "data": settings.data,
                        "node_id": settings.id,
                        "index": r.last_log_id.index,
                        "topics": r.topics,
                        "records": r.records,
                        "subscriptions": r.subscriptions,
                        "voters": settings.peers.keys().collect::<Vec<_>>(),
                    })
                );
            } else {
                println!(
                    "restored node {} in {}: {} topics, {} records, {} subscriptions, as of log index {}; \
                     voters {:?}. Restore every node the same way, then start them with `raftq serve`.",
                    settings.id,
                    settings.data.display(),
                    r.topics,
                    r.records,
                    r.subscriptions,
                    r.last_log_id.index,
                    settings.peers.keys().collect::<Vec<_>>(),
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("raftq restore: {e:#}");
            ExitCode::from(1)
        }
    }
}
