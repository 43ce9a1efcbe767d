//! `raftq-jepsen`: runs raftq's chaos suite.
//!
//! ```text
//! raftq-jepsen run --scenario kill-leader --workload queue --duration 20s --out DIR
//! raftq-jepsen matrix --duration 30s --out DIR [--scenarios kill-leader,partition-ring]
//! raftq-jepsen matrix --hosts docker --scenarios kill-leader,netem-delay
//! raftq-jepsen check --history DIR/history.jsonl --workload queue
//! ```
//!
//! A run: create the hosts (`--hosts netns`, the default: network namespaces; `--hosts
//! docker`: containers on a private Docker network; both need root), start three nodes, wait
//! for a leader, create the workload's topic, then run the workload and the nemesis together for the
//! duration. Then heal every fault, resume and start every node, wait for a leader that all
//! nodes agree on, make every node a voter again (the membership faults demote nodes), drain
//! (queue; the drain acks everything it pulls) and read the whole topic through each node, then
//! compare every node's state digest at one index. The history goes
//! to `history.jsonl`, the checkers' reports to `results.json`, a picture of throughput and
//! latency over time with the fault windows shaded to `timeline.svg`, and one table row to stdout.
//!
//! Besides the checkers' anomalies, a run's verdict has the run's own: `ack_unknown_lost`
//! (queue: records whose only ack had an unknown outcome, that the subscription's own count of
//! acks after a complete drain says were never acked: see
//! [`raftq_jepsen::checker::queue::check_ack_count`]), `digest_mismatch` (the
//! nodes' state machines differ at one index, or never reach one index: see
//! [`raftq_jepsen::workload::digest`]), `fault_not_applied` (a fault of the scenario could not
//! be applied or undone) and `no_fault` (a scenario other than `none` applied no fault at all).
//! Each makes the run invalid.
//!
//! Two runs may share a machine when their `--name-prefix` and `--subnet` differ (the
//! namespaces, bridge and veths, or containers, network and image, are named after the prefix).
//!
//! Exit status: 0 when every run is valid, 1 when a checker found an anomaly, 2 when the
//! harness itself failed (130 when interrupted; everything it created is removed first).
//!
//! # Layout
//! - `main/cli.rs`: the command line: subcommands, their arguments, durations, subnets, the
//!   server binary.
//! - `main/run.rs`: one scenario's run: the hosts, the workload and the nemesis together, the
//!   final phase, the run's own checks.
//! - `main/report.rs`: judging a history, `results.json`, the table and the exit status, the
//!   negative control's verdict.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::Parser;

use raftq_jepsen::checker::queue::RetentionTopic;
use raftq_jepsen::history::read_jsonl;
use raftq_jepsen::nemesis::Scenario;
use raftq_jepsen::workload;

#[path = "main/cli.rs"]
mod cli;
#[path = "main/report.rs"]
mod report;
#[path = "main/run.rs"]
mod run;

use cli::{timestamp, CheckArgs, Cli, Command, Common};
use report::{exit_code, expect_loss, judge, table_row, Row, TABLE_HEADER};
use run::{run_scenario, Interrupted};

fn default_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Runs the scenarios into `out` (one directory each when there are several), printing each
/// row as it finishes and the table at the end.
async fn run_all(common: &Common, scenarios: &[Scenario], out: &Path, single: bool) -> ExitCode {
    let seed = common.seed.unwrap_or_else(default_seed);
    let mut rows = Vec::new();
    for (i, scenario) in scenarios.iter().enumerate() {
        let dir = if single {
            out.to_path_buf()
        } else {
            out.join(format!("{scenario}-{}", common.workload.name()))
        };
        let result = run_scenario(common, *scenario, &dir, seed.wrapping_add(i as u64)).await;
        let row = match result {
            Ok((verdict, notes)) => Row {
                scenario: *scenario,
                workload: common.workload,
                outcome: Ok(verdict),
                notes,
            },
            Err(err) if err.is::<Interrupted>() => {
                eprintln!(
                    "interrupted; everything this run made (nodes, namespaces or containers, \
                     rules) is removed"
                );
                return ExitCode::from(130);
            }
            Err(err) => Row {
                scenario: *scenario,
                workload: common.workload,
                outcome: Err(format!("{err:#}")),
                notes: Vec::new(),
            },
        };
        eprintln!("{TABLE_HEADER}\n{}", table_row(&row));
        for note in &row.notes {
            eprintln!("note: {note}");
        }
        rows.push(row);
    }
    let table = format!(
        "{TABLE_HEADER}\n{}\n",
        rows.iter().map(table_row).collect::<Vec<_>>().join("\n")
    );
    if !single {
        let _ = std::fs::write(out.join("summary.md"), &table);
    }
    println!("\n{table}");
    println!("output: {}", out.display());
    exit_code(&rows)
}

fn check_history(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let events = read_jsonl(&args.history)?;
    let settings = workload::Settings {
        ack_timeout_ms: args.ack_timeout_ms,
        aged: args
            .retention_topic
            .clone()
            .zip(args.max_age_ms)
            .map(|(topic, max_age_ms)| RetentionTopic { topic, max_age_ms }),
        ..workload::Settings::default()
    };
    let (verdict, checker, log) = judge(&events, args.workload, &settings, Scenario::None);
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "verdict": verdict, "checker": checker, "log_checker": log
        }))?
    );
    Ok(if verdict.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("raftq-jepsen: cannot start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run(args) => {
            let out = args.out.clone().unwrap_or_else(|| {
                PathBuf::from("chaos-runs").join(format!("{}-{}", timestamp(), args.scenario))
            });
            runtime.block_on(run_all(&args.common, &[args.scenario], &out, true))
        }
        Command::Matrix(args) => {
            let scenarios = if args.scenarios.is_empty() {
                Scenario::ALL.to_vec()
            } else {
                args.scenarios.clone()
            };
            let out = args
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("chaos-runs").join(timestamp()));
            runtime.block_on(run_all(&args.common, &scenarios, &out, false))
        }
        Command::Check(args) => match check_history(&args) {
            Ok(code) => code,
            Err(err) => {
                eprintln!("raftq-jepsen: {err:#}");
                ExitCode::from(2)
            }
        },
        Command::ExpectLoss(args) => {
            let judged = std::fs::read_to_string(&args.results)
                .with_context(|| format!("cannot read {}", args.results.display()))
                .and_then(|text| Ok(serde_json::from_str::<serde_json::Value>(&text)?))
                .map(|results| expect_loss(&results));
            match judged {
                Ok((true, why)) => {
                    println!("negative control passed: {why}");
                    ExitCode::SUCCESS
                }
                Ok((false, why)) => {
                    println!("negative control FAILED: {why}");
                    ExitCode::from(1)
                }
                Err(err) => {
                    eprintln!("raftq-jepsen: {err:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "main_tests.rs"]
mod tests;
