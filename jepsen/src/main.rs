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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use raftq_jepsen::checker::queue::RetentionTopic;
use raftq_jepsen::checker::{
    check_ack_count, check_queue, check_stream, AckCount, QueueOptions, QueueReport, Verdict,
};
use raftq_jepsen::history::{read_jsonl, Event, History};
use raftq_jepsen::hosts::docker::{DockerConfig, DockerHosts};
use raftq_jepsen::hosts::netns::{NetnsConfig, NetnsHosts};
use raftq_jepsen::hosts::{Hosts, NodeEnv};
use raftq_jepsen::nemesis::{self, Scenario};
use raftq_jepsen::workload::digest::{self, DigestReport};
use raftq_jepsen::workload::http::Http;
use raftq_jepsen::workload::{self, queue, stream, Ctx, FinalReads, Workload};

/// How long a fresh or healed cluster may take to agree on a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Wall-time allowance on top of the duration: setup, final phase, shutdown.
const OVERHEAD_LIMIT: Duration = Duration::from_secs(120);
/// Lines of each node's log shown when the harness fails.
const LOG_TAIL: usize = 15;

#[derive(Debug, Parser)]
#[command(
    name = "raftq-jepsen",
    about = "raftq's chaos suite: faults, histories, checkers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One scenario: workload + nemesis, final drain and reads, checker.
    Run(RunArgs),
    /// Several scenarios one after the other, then the table.
    Matrix(MatrixArgs),
    /// Judges a recorded history again.
    Check(CheckArgs),
    /// The negative control's verdict on a run's `results.json`: exits 0 only when the run is
    /// INVALID because some, but not all, acknowledged records were lost (and its faults all
    /// happened); 1 otherwise.
    ExpectLoss(ExpectLossArgs),
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// The fault.
    #[arg(long, value_enum, default_value = "kill-leader")]
    scenario: Scenario,
    /// Output directory (history, results, node logs and data). Default:
    /// chaos-runs/<timestamp>-<scenario>.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Clone, Args)]
struct MatrixArgs {
    /// Scenarios to run, comma-separated (default: all of them).
    #[arg(long, value_enum, value_delimiter = ',')]
    scenarios: Vec<Scenario>,
    /// Output directory; each scenario gets `<scenario>-<workload>/` in it. Default:
    /// chaos-runs/<timestamp>.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

/// Which kind of hosts the nodes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum HostsKind {
    /// Linux network namespaces joined by a bridge; the nodes are child processes.
    Netns,
    /// Containers on a private Docker network, from an image built out of the server binary.
    Docker,
}

impl HostsKind {
    fn name(self) -> &'static str {
        match self {
            HostsKind::Netns => "netns",
            HostsKind::Docker => "docker",
        }
    }

    /// The default subnet: different for each kind, so that leftovers of one never collide
    /// with the other.
    fn default_subnet(self) -> &'static str {
        match self {
            HostsKind::Netns => "10.231.0",
            HostsKind::Docker => "10.232.0",
        }
    }
}

#[derive(Debug, Clone, Args)]
struct Common {
    /// Where the nodes run: network namespaces, or Docker containers.
    #[arg(long, value_enum, default_value = "netns")]
    hosts: HostsKind,
    /// What the clients do.
    #[arg(long, value_enum, default_value = "queue")]
    workload: Workload,
    /// How long the workload and the faults run (`20s`, `2m`, `1500ms`, or seconds).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// The `raftq` server binary. Default: `raftq` next to this executable, else
    /// `$CARGO_TARGET_DIR/release/raftq`.
    #[arg(long, env = "RAFTQ_BIN")]
    raftq_bin: Option<PathBuf>,
    /// Seed of the nemesis's choices (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Concurrent publishers.
    #[arg(long, default_value_t = 3)]
    publishers: usize,
    /// Concurrent consumers (queue) or readers (stream).
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Most client operations in the workload phase.
    #[arg(long, default_value_t = 50_000)]
    max_ops: u64,
    /// Quiet time before each fault (default: the scenario's).
    #[arg(long, value_parser = parse_duration)]
    quiet: Option<Duration>,
    /// How long each fault holds (default: the scenario's).
    #[arg(long, value_parser = parse_duration)]
    hold: Option<Duration>,
    /// First three octets of the private /24 the hosts use (default: 10.231.0 for netns,
    /// 10.232.0 for docker).
    #[arg(long)]
    subnet: Option<String>,
    /// Prefix of the names of everything the hosts create (namespaces `<prefix>-nN`, bridge
    /// `<prefix>0`, veths; containers, network and image): at most 8 letters or digits. Give
    /// two runs on one machine different prefixes and subnets.
    #[arg(long, default_value = "rqj")]
    name_prefix: String,
    /// Keep the nodes' data directories of valid runs too (invalid runs always keep them).
    #[arg(long)]
    keep_data: bool,
    /// libfaketime, for the clock scenarios (default: where Debian's `faketime` package puts
    /// it).
    #[arg(long, env = "FAKETIME_LIB")]
    faketime_lib: Option<PathBuf>,
    /// In the clock scenarios, step the nodes' monotonic clocks along with their wall clocks:
    /// a fault no server can mask (its own time leaps), to show that the clock checks see
    /// early expiries and deletions. Such a run must be INVALID.
    #[arg(long)]
    fake_monotonic: bool,
}

#[derive(Debug, Clone, Args)]
struct CheckArgs {
    /// A `history.jsonl`.
    #[arg(long)]
    history: PathBuf,
    #[arg(long, value_enum, default_value = "queue")]
    workload: Workload,
    /// The subscription's lease length in the run (the clock scenarios use 20000).
    #[arg(long, default_value_t = 3000)]
    ack_timeout_ms: u64,
    /// The topic with retention by age, if the run had one (the clock scenarios:
    /// `jepsen-aged`), and its maximum age.
    #[arg(long, requires = "max_age_ms")]
    retention_topic: Option<String>,
    #[arg(long, requires = "retention_topic")]
    max_age_ms: Option<u64>,
}

#[derive(Debug, Clone, Args)]
struct ExpectLossArgs {
    /// The `results.json` of the run.
    #[arg(long)]
    results: PathBuf,
}

/// `20s`, `2m`, `1500ms`, `1h`, or a number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (try 20s, 2m, 1500ms)"))?;
    let seconds = match unit.trim() {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}")),
    };
    Ok(Duration::from_secs_f64(seconds))
}

/// The server binary: the flag or `RAFTQ_BIN`; else `raftq` beside this executable (both are
/// built into the same target directory); else `$CARGO_TARGET_DIR/release/raftq`.
fn resolve_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path.to_path_buf());
    }
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("raftq"));
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(target).join("release").join("raftq"));
    }
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .with_context(|| {
            format!(
                "no raftq binary found (looked at {candidates:?}); build it with \
                 `cargo build --release --bin raftq` or pass --raftq-bin / RAFTQ_BIN"
            )
        })
}

fn parse_subnet(text: &str) -> anyhow::Result<[u8; 3]> {
    let parts: Vec<u8> = text
        .split('.')
        .map(|p| p.parse::<u8>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--subnet must be three octets like 10.231.0, not {text:?}"))?;
    let [a, b, c] = parts[..] else {
        bail!("--subnet must be three octets like 10.231.0, not {text:?}");
    };
    let private = a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168);
    if !private {
        bail!("--subnet {text} is not a private range (10/8, 172.16/12, 192.168/16)");
    }
    Ok([a, b, c])
}

/// UTC `YYYYMMDD-HHMMSS`, for directory names.
fn timestamp() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // `YYYY-MM-DDTHH:MM:SS.mmmZ` without its separators and milliseconds.
    let t = raftq_client::api::utc_time(ms);
    let digits = |from: usize, to: usize| t[from..to].replace(['-', ':'], "");
    format!("{}-{}", digits(0, 10), digits(11, 19))
}

/// Everything a run reports, in `results.json`.
#[derive(Debug, Serialize)]
struct RunResults {
    scenario: String,
    workload: Workload,
    hosts: HostsKind,
    fault: String,
    duration_ms: u64,
    wall_ms: u64,
    seed: u64,
    raftq_bin: PathBuf,
    /// The combined verdict of the table row.
    verdict: Verdict,
    /// The workload's own checker (queue or stream).
    checker: serde_json::Value,
    /// The log checks (the stream checker over publishes and final reads), for the queue
    /// workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    log_checker: Option<serde_json::Value>,
    faults: Vec<nemesis::Applied>,
    /// `corrupt-minority`: how the nodes restarted on damaged data fared.
    #[serde(skip_serializing_if = "Option::is_none")]
    damage: Option<DamageSummary>,
    /// The queue checker's options (lease, retention topic), to judge the history again.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_options: Option<QueueOptions>,
    /// Whether a leader was agreed on after healing.
    healed_leader: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drain: Option<queue::DrainReport>,
    final_reads: FinalReads,
    /// The final reads of the topic with retention by age (clock scenarios).
    #[serde(skip_serializing_if = "Option::is_none")]
    aged_reads: Option<FinalReads>,
    /// The server's count of acks against the history's, after a complete drain (queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    ack_count: Option<AckCount>,
    /// Every node's state digest at one index, after the final reads (`None`: not compared,
    /// as there was no leader after healing).
    digest: Option<DigestReport>,
    /// How each node exited at the end (SIGTERM).
    node_exits: BTreeMap<u64, String>,
    /// Things worth a look that are not anomalies.
    notes: Vec<String>,
}

/// How the nodes restarted on damaged data fared (`corrupt-minority`).
#[derive(Debug, Serialize)]
struct DamageSummary {
    /// Starts that were refused: the node exited (its message must say "is damaged").
    refused: u64,
    /// Starts that went ahead after the node said its data "is damaged", and caught up from
    /// the others (a rejoin).
    rejoined: u64,
    /// Starts that went ahead on damaged data without a word about it (a finding to look at).
    silent: u64,
    /// Refusals whose message did not say "is damaged".
    unreported: Vec<String>,
}

/// What a finished run hands back to the table.
struct Row {
    scenario: Scenario,
    workload: Workload,
    outcome: Result<Verdict, String>,
    notes: Vec<String>,
}

/// Asked to stop (Ctrl-C or SIGTERM).
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Merges the workload checker's verdict with the log checker's: anomalies of the log checker
/// are prefixed `log.`; valid when both are.
fn combine(primary: Verdict, log: Option<Verdict>) -> Verdict {
    let Some(log) = log else {
        return primary;
    };
    let mut out = primary;
    for (name, count) in log.anomalies {
        out.anomalies.insert(format!("log.{name}"), count);
    }
    out.failures
        .extend(log.failures.into_iter().map(|f| format!("log.{f}")));
    out.valid = out.failures.is_empty();
    out
}

/// Runs one scenario into `out`. `Err` is a harness failure.
async fn run_scenario(
    common: &Common,
    scenario: Scenario,
    out: &Path,
    seed: u64,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    match common.hosts {
        HostsKind::Netns => raftq_jepsen::hosts::netns::preflight()?,
        HostsKind::Docker => raftq_jepsen::hosts::docker::preflight()?,
    }
    let bin = resolve_bin(common.raftq_bin.as_deref())?;
    let subnet = parse_subnet(
        common
            .subnet
            .as_deref()
            .unwrap_or(common.hosts.default_subnet()),
    )?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = out
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", out.display()))?;
    eprintln!(
        "==> {scenario} / {} on {} hosts for {:?} (seed {seed}) into {}",
        common.workload.name(),
        common.hosts.name(),
        common.duration,
        out.display()
    );
    match common.hosts {
        HostsKind::Netns => {
            let mut cfg = NetnsConfig::new(bin.clone(), out.clone());
            cfg.subnet = subnet;
            cfg.prefix = common.name_prefix.clone();
            cfg.env = node_env(common, scenario)?;
            let hosts = tokio::task::spawn_blocking(move || NetnsHosts::create(cfg)).await??;
            supervise(&hosts, common, scenario, &out, seed, &bin).await
        }
        HostsKind::Docker => {
            let mut cfg = DockerConfig::new(bin.clone(), out.clone());
            cfg.subnet = subnet;
            if common.name_prefix != cfg.prefix {
                cfg.image = format!("raftq-jepsen-{}:local", common.name_prefix);
                cfg.prefix = common.name_prefix.clone();
            }
            let hosts = tokio::task::spawn_blocking(move || DockerHosts::create(cfg)).await??;
            supervise(&hosts, common, scenario, &out, seed, &bin).await
        }
    }
}

/// What the scenario's nodes run on: fault disks, a fake clock.
fn node_env(common: &Common, scenario: Scenario) -> anyhow::Result<NodeEnv> {
    let fake_clock = if scenario.needs_fake_clock() {
        let lib = common
            .faketime_lib
            .clone()
            .or_else(raftq_jepsen::hosts::find_faketime)
            .with_context(|| {
                format!(
                    "{scenario} runs the nodes under libfaketime, which is not installed (looked \
                     at {:?}): install Debian's faketime package (apt-get install faketime) or \
                     pass --faketime-lib",
                    raftq_jepsen::hosts::FAKETIME_CANDIDATES
                )
            })?;
        Some(lib)
    } else {
        None
    };
    Ok(NodeEnv {
        fault_disks: scenario.needs_fault_disks(),
        fake_clock,
        fake_monotonic: common.fake_monotonic,
        // Damage needs table files as well as write-ahead logs: with the default 64 MiB
        // memtables a short run never flushes one.
        write_buffer_bytes: (scenario == Scenario::CorruptMinority).then_some(64 << 10),
    })
}

/// What a run leaves of the nodes' data besides `nodeN/`: the fault disks' backing
/// directories, pre-damage copies and clock files.
fn data_paths(out: &Path, id: u64) -> Vec<PathBuf> {
    ["", ".disk", ".pre-damage", ".faketime"]
        .iter()
        .map(|suffix| out.join(format!("node{id}{suffix}")))
        .collect()
}

/// Runs the scenario on `hosts` within the time limit, stops on Ctrl-C or SIGTERM, shows the
/// nodes' logs when the harness fails, and tears the hosts down in every case (then removes
/// the nodes' data of a valid run, unless asked to keep it).
async fn supervise<H: Hosts>(
    hosts: &H,
    common: &Common,
    scenario: Scenario,
    out: &Path,
    seed: u64,
    bin: &Path,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    let limit = common.duration + OVERHEAD_LIMIT;
    let result = tokio::select! {
        r = tokio::time::timeout(limit, scenario_body(hosts, common, scenario, out, seed, bin)) => {
            match r {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!("the run took longer than {limit:?}; stopped")),
            }
        }
        _ = interrupted() => Err(anyhow::Error::new(Interrupted)),
    };
    if let Err(err) = &result {
        if !err.is::<Interrupted>() {
            eprintln!("harness error: {err:#}");
            for id in hosts.ids() {
                let log = hosts.log(id);
                let lines: Vec<&str> = log.lines().collect();
                eprintln!("--- node {id} log (last {LOG_TAIL} lines) ---");
                for line in &lines[lines.len().saturating_sub(LOG_TAIL)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
    hosts.teardown();
    if let Ok((verdict, _)) = &result {
        if verdict.valid && !common.keep_data {
            for id in hosts.ids() {
                for path in data_paths(out, id) {
                    if path.is_dir() {
                        let _ = std::fs::remove_dir_all(&path);
                    } else {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
    }
    result
}

async fn scenario_body<H: Hosts>(
    hosts: &H,
    common: &Common,
    scenario: Scenario,
    out: &Path,
    seed: u64,
    bin: &Path,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    let wall = Instant::now();
    let ids = hosts.ids();
    let http = Http::new(ids.iter().map(|id| (*id, hosts.url(*id))).collect())?;
    for id in &ids {
        hosts.start(*id).await?;
    }
    let leader = nemesis::await_agreed_leader(&http, &ids, LEADER_TIMEOUT)
        .await
        .context("the new cluster did not agree on a leader")?;
    eprintln!(
        "cluster up in {:.1}s, leader {leader}",
        wall.elapsed().as_secs_f64()
    );

    let mut settings = workload::Settings {
        publishers: common.publishers,
        consumers: common.consumers,
        max_ops: common.max_ops,
        ..workload::Settings::default()
    };
    if scenario.needs_fake_clock() && common.workload == Workload::Queue {
        settings = settings.clock_checks();
    }
    match common.workload {
        Workload::Queue => queue::setup(&http, &settings).await?,
        Workload::Stream => stream::setup(&http, &settings).await?,
    }

    let history = History::new();
    let deadline = Instant::now() + common.duration;
    let ctx = Ctx::new(http.clone(), history.clone(), settings.clone(), deadline);
    let mut timing = scenario.default_timing();
    timing.quiet = common.quiet.unwrap_or(timing.quiet);
    timing.hold = common.hold.unwrap_or(timing.hold);

    let workload_phase = async {
        match common.workload {
            Workload::Queue => queue::run(&ctx).await,
            Workload::Stream => stream::run(&ctx).await,
        }
    };
    let progress = async {
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(2).min(deadline - Instant::now())).await;
            eprintln!(
                "[{:>6.1}s] clients: {}",
                history.elapsed_us() as f64 / 1e6,
                ctx.progress.line()
            );
        }
    };
    let (faults, (), ()) = tokio::join!(
        nemesis::run(hosts, &http, &history, scenario, timing, deadline, seed),
        workload_phase,
        progress,
    );

    // The final phase: no fault left, every node up, one leader.
    let mut notes = Vec::new();
    nemesis::say(&history, "healing: heal, resume and start every node");
    hosts.heal().await?;
    for id in &ids {
        hosts.resume(*id).await?;
        if !hosts.is_running(*id) {
            hosts.start(*id).await?;
        }
    }
    let mut healed_leader = nemesis::await_agreed_leader(&http, &ids, LEADER_TIMEOUT).await;
    // Every node a voter again (the membership scenarios demote nodes), so that every node
    // takes part in the final phase as it did before the run.
    if healed_leader.is_some() || scenario.changes_membership() {
        match nemesis::heal_voters(&http, &history, scenario.name(), &ids).await {
            Ok(false) => {}
            Ok(true) => {
                healed_leader = nemesis::await_agreed_leader(&http, &ids, LEADER_TIMEOUT).await;
            }
            Err(err) => {
                notes.push(format!(
                    "healing could not make every node a voter again: {err:#}"
                ));
                eprintln!("warning: {}", notes.last().map_or("", String::as_str));
            }
        }
    }
    let mut aged_final = None;
    let (drain, final_reads, digests) = match healed_leader {
        Some(leader) => {
            nemesis::say(&history, &format!("healed; leader {leader}; final phase"));
            let drain = match common.workload {
                Workload::Queue => {
                    let report = queue::final_drain(&ctx, leader).await;
                    eprintln!(
                        "final drain: {} records in {} pulls, {} ms, complete: {}",
                        report.delivered, report.pulls, report.millis, report.complete
                    );
                    if !report.complete {
                        notes.push(format!("final drain incomplete: {report:?}"));
                    }
                    Some(report)
                }
                Workload::Stream => None,
            };
            let reads = workload::final_reads(&ctx, leader).await;
            eprintln!("final reads (records per node): {:?}", reads.records);
            if let Some(aged) = &settings.aged {
                let aged_reads = workload::final_reads_of(&ctx, leader, &aged.topic).await;
                eprintln!(
                    "final reads of {} (records per node): {:?}",
                    aged.topic, aged_reads.records
                );
                aged_final = Some(aged_reads);
            }
            let digests = digest::compare(&http, &ids, digest::DIGEST_TIMEOUT).await;
            eprintln!(
                "state digests: {} ({} rounds, {} ms)",
                digests.detail, digests.rounds, digests.millis
            );
            (drain, reads, Some(digests))
        }
        None => {
            notes.push(format!(
                "no leader agreed on within {LEADER_TIMEOUT:?} after healing: no final drain \
                 or reads (what was not delivered counts as lost)"
            ));
            eprintln!("warning: {}", notes.last().map_or("", String::as_str));
            (None, FinalReads::default(), None)
        }
    };

    let events = history.events();
    history.write_jsonl(out.join("history.jsonl"))?;
    std::fs::write(out.join("timeline.svg"), raftq_jepsen::plot::svg(&events))?;
    let (mut verdict, checker, log_checker) = judge(&events, common.workload, &settings, scenario);
    // The run's own checks: the records whose ack was in doubt, by the server's count of acks
    // (queue, after a complete drain); the nodes' states; the faults themselves.
    let mut ack_count = None;
    if let Some(drain) = drain.as_ref().filter(|d| d.complete) {
        let report = serde_json::from_value::<QueueReport>(checker.clone());
        if let (Some(server), Ok(report)) = (drain.server_acked, report) {
            let count = check_ack_count(&report, server);
            verdict.add("ack_unknown_lost", count.lost, true);
            if server != count.acked_records + count.ack_unknown_records {
                notes.push(format!("ack count: {}", count.detail));
            }
            ack_count = Some(count);
        }
    }
    if let Some(digests) = &digests {
        verdict.add("digest_mismatch", digests.mismatches(), true);
        if !digests.consistent {
            notes.push(format!("digest_mismatch: {}", digests.detail));
        }
    }
    let fault_check = nemesis::check_faults(scenario, &faults);
    verdict.add(
        "fault_not_applied",
        fault_check.not_applied.len() as u64,
        true,
    );
    verdict.add("no_fault", u64::from(fault_check.no_fault), true);
    for failed in &fault_check.not_applied {
        notes.push(format!("fault_not_applied: {failed}"));
    }
    let damage = (scenario == Scenario::CorruptMinority).then(|| {
        verdict.add(
            "damage_unreported",
            fault_check.damage_unreported.len() as u64,
            true,
        );
        notes.push(format!(
            "damaged data: {} start(s) refused, {} rejoined (said \"{}\" and caught up), {} \
             went ahead on damaged data without a word",
            fault_check.damage_refused,
            fault_check.damage_rejoined,
            nemesis::disk::DAMAGED,
            fault_check.damage_silent
        ));
        for unreported in &fault_check.damage_unreported {
            notes.push(format!(
                "damage_unreported: refused without saying \"{}\": {unreported}",
                nemesis::disk::DAMAGED
            ));
        }
        DamageSummary {
            refused: fault_check.damage_refused,
            rejoined: fault_check.damage_rejoined,
            silent: fault_check.damage_silent,
            unreported: fault_check.damage_unreported.clone(),
        }
    });
    notes.extend(fault_check.notes.iter().cloned());
    if fault_check.no_fault {
        notes.push(format!(
            "no_fault: scenario {scenario} applied no fault in {:?} (quiet {:?}, hold {:?})",
            common.duration, timing.quiet, timing.hold
        ));
    }

    // Stop every node gracefully: a node that does not exit 0 on SIGTERM is worth a note.
    let stops = ids
        .iter()
        .map(|id| async move { (*id, hosts.stop(*id).await) });
    let mut node_exits = BTreeMap::new();
    for (id, result) in futures::future::join_all(stops).await {
        let text = result.unwrap_or_else(|e| format!("{e:#}"));
        if !text.contains("exit status: 0") {
            notes.push(format!("node {id} did not exit cleanly on SIGTERM: {text}"));
        }
        node_exits.insert(id, text);
    }

    let results = RunResults {
        scenario: scenario.name().to_string(),
        workload: common.workload,
        hosts: common.hosts,
        fault: scenario.fault().to_string(),
        duration_ms: common.duration.as_millis() as u64,
        wall_ms: wall.elapsed().as_millis() as u64,
        seed,
        raftq_bin: bin.to_path_buf(),
        verdict: verdict.clone(),
        checker,
        log_checker,
        faults,
        damage,
        queue_options: (common.workload == Workload::Queue).then(|| queue_options(&settings)),
        healed_leader,
        drain,
        final_reads,
        aged_reads: aged_final,
        ack_count,
        digest: digests,
        node_exits,
        notes: notes.clone(),
    };
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    Ok((verdict, notes))
}

/// The queue checker's options for a run with `settings`.
fn queue_options(settings: &workload::Settings) -> QueueOptions {
    QueueOptions {
        ack_timeout_ms: settings.ack_timeout_ms,
        // The workload's subscription has no dead-letter topic.
        dead_letter_topic: None,
        retention: settings.aged.clone(),
    }
}

/// Runs the checkers that fit the workload: the combined verdict and the full reports.
fn judge(
    events: &[Event],
    workload: Workload,
    settings: &workload::Settings,
    scenario: Scenario,
) -> (Verdict, serde_json::Value, Option<serde_json::Value>) {
    match workload {
        Workload::Queue => {
            let report = check_queue(events, &queue_options(settings));
            // The log underneath the queue: offsets, divergence, acknowledged values missing
            // from the final reads. Not of the topic with retention by age, whose records may
            // legitimately be gone (the queue checker's `early_retention` judges it).
            let aged = settings.aged.as_ref().map(|a| a.topic.as_str());
            let log_events: Vec<Event> = events
                .iter()
                .filter(|e| aged.is_none() || e.op.topic() != aged)
                .cloned()
                .collect();
            let log = check_stream(&log_events);
            let verdict = combine(
                report.verdict(scenario.name()),
                Some(log.verdict(scenario.name())),
            );
            (
                verdict,
                serde_json::to_value(&report).unwrap_or_default(),
                Some(serde_json::to_value(&log).unwrap_or_default()),
            )
        }
        Workload::Stream => {
            let report = check_stream(events);
            (
                report.verdict(scenario.name()),
                serde_json::to_value(&report).unwrap_or_default(),
                None,
            )
        }
    }
}

const TABLE_HEADER: &str = "| scenario | workload | fault | ops | ok/fail/info | anomalies | verdict |\n|---|---|---|---|---|---|---|";

fn table_row(row: &Row) -> String {
    match &row.outcome {
        Ok(v) => {
            let mut verdict = if v.valid {
                "valid".to_string()
            } else {
                format!("INVALID ({})", v.failures.join(", "))
            };
            if !row.notes.is_empty() {
                verdict.push_str(&format!(" [{} note(s)]", row.notes.len()));
            }
            format!(
                "| {} | {} | {} | {} | {}/{}/{} | {} | {} |",
                row.scenario,
                row.workload.name(),
                row.scenario.fault(),
                v.ops,
                v.ok,
                v.fail,
                v.info,
                v.anomalies_found(),
                verdict
            )
        }
        Err(err) => format!(
            "| {} | {} | {} | - | - | - | HARNESS ERROR: {} |",
            row.scenario,
            row.workload.name(),
            row.scenario.fault(),
            err.replace('|', "/").replace('\n', " ")
        ),
    }
}

fn exit_code(rows: &[Row]) -> ExitCode {
    if rows.iter().any(|r| r.outcome.is_err()) {
        ExitCode::from(2)
    } else if rows
        .iter()
        .any(|r| r.outcome.as_ref().is_ok_and(|v| !v.valid))
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

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

/// The negative control's verdict on a run's results: `(passed, why)`. It passes when the run
/// is INVALID because some, but not all, acknowledged records were lost: `lost` among its
/// failures with `0 < lost < acknowledged` by the queue checker (acknowledged records that no
/// consumer ever had acked), or `log.lost` with `0 < lost < acknowledged` by the log checker
/// (acknowledged records missing from the final reads: records that were acked before the
/// power loss are lost from the log, though a consumer had them); and every fault of the run
/// happened.
fn expect_loss(results: &serde_json::Value) -> (bool, String) {
    let verdict = &results["verdict"];
    let failures: Vec<String> = verdict["failures"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let valid = verdict["valid"].as_bool().unwrap_or(true);
    let count = |report: &str| {
        (
            results[report]["lost"]["count"].as_u64().unwrap_or(0),
            results[report]["acknowledged"].as_u64().unwrap_or(0),
        )
    };
    let (lost, acknowledged) = count("checker");
    let (log_lost, log_acknowledged) = count("log_checker");
    let numbers = format!(
        "queue checker: lost {lost} of {acknowledged} acknowledged; log checker: lost \
         {log_lost} of {log_acknowledged}; verdict {}; failures {failures:?}",
        if valid { "valid" } else { "INVALID" }
    );
    let failed = |name: &str| failures.iter().any(|f| f == name);
    let some_not_all = |lost: u64, of: u64| lost > 0 && lost < of;
    let faults_failed = failed("fault_not_applied") || failed("no_fault");
    let partial = (failed("lost") && some_not_all(lost, acknowledged))
        || (failed("log.lost") && some_not_all(log_lost, log_acknowledged));
    let passed = !valid && partial && !faults_failed;
    let why = if passed {
        format!(
            "the run is INVALID because some, not all, acknowledged records were lost: {numbers}"
        )
    } else if valid {
        format!("the run was judged valid: the suite did not see the loss ({numbers})")
    } else if faults_failed {
        format!("the faults did not all happen, so the run proves nothing ({numbers})")
    } else if lost == 0 && log_lost == 0 {
        format!("the run is INVALID, but not because acknowledged records were lost ({numbers})")
    } else {
        format!(
            "every acknowledged record was lost: a wiped cluster, not the loss of what was not \
             yet synced ({numbers})"
        )
    };
    (passed, why)
}

#[cfg(test)]
#[path = "main_tests.rs"]
mod tests;
