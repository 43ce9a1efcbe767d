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
//! (queue) and read the whole topic through each node. The history goes
//! to `history.jsonl`, the checkers' reports to `results.json`, a picture of throughput and
//! latency over time with the fault windows shaded to `timeline.svg`, and one table row to stdout.
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

use raftq_jepsen::checker::{check_queue, check_stream, QueueOptions, Verdict};
use raftq_jepsen::history::{read_jsonl, Event, History};
use raftq_jepsen::hosts::docker::{DockerConfig, DockerHosts};
use raftq_jepsen::hosts::netns::{NetnsConfig, NetnsHosts};
use raftq_jepsen::hosts::Hosts;
use raftq_jepsen::nemesis::{self, Scenario};
use raftq_jepsen::workload::http::Http;
use raftq_jepsen::workload::{self, queue, stream, Ctx, FinalReads, Workload};

/// How long a fresh or healed cluster may take to agree on a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Wall-time allowance on top of the duration: setup, final phase, shutdown.
const OVERHEAD_LIMIT: Duration = Duration::from_secs(90);
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
    /// Keep the nodes' data directories of valid runs too (invalid runs always keep them).
    #[arg(long)]
    keep_data: bool,
}

#[derive(Debug, Clone, Args)]
struct CheckArgs {
    /// A `history.jsonl`.
    #[arg(long)]
    history: PathBuf,
    #[arg(long, value_enum, default_value = "queue")]
    workload: Workload,
    /// The subscription's lease length in the run.
    #[arg(long, default_value_t = 3000)]
    ack_timeout_ms: u64,
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
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
    /// Whether a leader was agreed on after healing.
    healed_leader: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    drain: Option<queue::DrainReport>,
    final_reads: FinalReads,
    /// How each node exited at the end (SIGTERM).
    node_exits: BTreeMap<u64, String>,
    /// Things worth a look that are not anomalies.
    notes: Vec<String>,
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
            let hosts = NetnsHosts::create(cfg)?;
            supervise(&hosts, common, scenario, &out, seed, &bin).await
        }
        HostsKind::Docker => {
            let mut cfg = DockerConfig::new(bin.clone(), out.clone());
            cfg.subnet = subnet;
            let hosts = tokio::task::spawn_blocking(move || DockerHosts::create(cfg)).await??;
            supervise(&hosts, common, scenario, &out, seed, &bin).await
        }
    }
}

/// Runs the scenario on `hosts` within the time limit, stops on Ctrl-C or SIGTERM, shows the
/// nodes' logs when the harness fails, and tears the hosts down in every case.
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

    let settings = workload::Settings {
        publishers: common.publishers,
        consumers: common.consumers,
        max_ops: common.max_ops,
        ..workload::Settings::default()
    };
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
    let (drain, final_reads) = match healed_leader {
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
            (drain, reads)
        }
        None => {
            notes.push(format!(
                "no leader agreed on within {LEADER_TIMEOUT:?} after healing: no final drain \
                 or reads (what was not delivered counts as lost)"
            ));
            eprintln!("warning: {}", notes.last().map_or("", String::as_str));
            (None, FinalReads::default())
        }
    };

    let events = history.events();
    history.write_jsonl(out.join("history.jsonl"))?;
    std::fs::write(out.join("timeline.svg"), raftq_jepsen::plot::svg(&events))?;
    let (verdict, checker, log_checker) = judge(&events, common.workload, &settings, scenario);

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
    for fault in &faults {
        if let Some(error) = &fault.error {
            notes.push(format!("fault {}: {error}", fault.fault.describe()));
        }
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
        healed_leader,
        drain,
        final_reads,
        node_exits,
        notes: notes.clone(),
    };
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    if verdict.valid && !common.keep_data {
        for id in &ids {
            let _ = std::fs::remove_dir_all(out.join(format!("node{id}")));
        }
    }
    Ok((verdict, notes))
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
            let report = check_queue(
                events,
                &QueueOptions {
                    ack_timeout_ms: settings.ack_timeout_ms,
                },
            );
            // The log underneath the queue: offsets, divergence, acknowledged values missing
            // from the final reads.
            let log = check_stream(events);
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
            let found: Vec<String> = v
                .anomalies
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(name, n)| format!("{name}={n}"))
                .collect();
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
                if found.is_empty() {
                    "none".to_string()
                } else {
                    found.join(", ")
                },
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn subnets() {
        assert_eq!(parse_subnet("10.231.0").unwrap(), [10, 231, 0]);
        assert!(parse_subnet("8.8.8").is_err());
        assert!(parse_subnet("10.1").is_err());
        assert!(parse_subnet("192.168.300").is_err());
    }

    #[test]
    fn timestamps_look_right() {
        let t = timestamp();
        assert_eq!(t.len(), 15);
        assert!(t.starts_with("20"));
    }
}
