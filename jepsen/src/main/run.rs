//! One scenario's run: the hosts made, the nodes started, the workload and the nemesis run
//! together, then the final phase (heal, drain, final reads, state digests), the run's own
//! checks and `results.json`; the hosts torn down in every case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use raftq_jepsen::checker::{check_ack_count, QueueReport, Verdict};
use raftq_jepsen::history::History;
use raftq_jepsen::hosts::docker::{DockerConfig, DockerHosts};
use raftq_jepsen::hosts::netns::{NetnsConfig, NetnsHosts};
use raftq_jepsen::hosts::{Hosts, NodeEnv};
use raftq_jepsen::nemesis::{self, Scenario};
use raftq_jepsen::workload::digest;
use raftq_jepsen::workload::http::Http;
use raftq_jepsen::workload::{self, queue, stream, Ctx, FinalReads, Workload};

use crate::cli::{parse_subnet, resolve_bin, Common, HostsKind};
use crate::report::{judge, queue_options, DamageSummary, RunResults};

/// How long a fresh or healed cluster may take to agree on a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Wall-time allowance on top of the duration: setup, final phase, shutdown.
const OVERHEAD_LIMIT: Duration = Duration::from_secs(120);
/// Lines of each node's log shown when the harness fails.
const LOG_TAIL: usize = 15;

/// Asked to stop (Ctrl-C or SIGTERM).
#[derive(Debug)]
pub(crate) struct Interrupted;

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

/// Runs one scenario into `out`. `Err` is a harness failure.
pub(crate) async fn run_scenario(
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
    let run = Run {
        common,
        scenario,
        out: &out,
        seed,
        bin: &bin,
    };
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
            supervise(&hosts, run).await
        }
        HostsKind::Docker => {
            let mut cfg = DockerConfig::new(bin.clone(), out.clone());
            cfg.subnet = subnet;
            if common.name_prefix != cfg.prefix {
                cfg.image = format!("raftq-jepsen-{}:local", common.name_prefix);
                cfg.prefix = common.name_prefix.clone();
            }
            let hosts = tokio::task::spawn_blocking(move || DockerHosts::create(cfg)).await??;
            supervise(&hosts, run).await
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
        write_buffer_bytes: common
            .write_buffer_bytes
            .or((scenario == Scenario::CorruptMinority).then_some(64 << 10)),
        // Faults on the disk meet snapshot builds (which link the log's files) and the purges
        // after them, and a node behind the purged log catches up by snapshot.
        snapshot_logs: common.snapshot_logs.or((scenario.needs_fault_disks()
            || scenario == Scenario::CorruptMinority)
            .then_some(500)),
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

/// What one scenario's run is given: the options, the scenario, the (resolved) output
/// directory, the seed and the server binary.
#[derive(Clone, Copy)]
struct Run<'a> {
    common: &'a Common,
    scenario: Scenario,
    out: &'a Path,
    seed: u64,
    bin: &'a Path,
}

/// Runs the scenario on `hosts` within the time limit, stops on Ctrl-C or SIGTERM, shows the
/// nodes' logs when the harness fails, and tears the hosts down in every case (then removes
/// the nodes' data of a valid run, unless asked to keep it).
async fn supervise<H: Hosts>(hosts: &H, run: Run<'_>) -> anyhow::Result<(Verdict, Vec<String>)> {
    let Run { common, out, .. } = run;
    let limit = common.duration + OVERHEAD_LIMIT;
    let result = tokio::select! {
        r = tokio::time::timeout(limit, scenario_body(hosts, run)) => {
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
    run: Run<'_>,
) -> anyhow::Result<(Verdict, Vec<String>)> {
    let Run {
        common,
        scenario,
        out,
        seed,
        bin,
    } = run;
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
