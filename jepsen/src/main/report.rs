//! What a run reports and how it is judged: the checkers that fit the workload, `results.json`,
//! the table row and the exit status, and the negative control's verdict.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use raftq_jepsen::checker::{check_queue, check_stream, AckCount, QueueOptions, Verdict};
use raftq_jepsen::history::Event;
use raftq_jepsen::nemesis::{self, Scenario};
use raftq_jepsen::workload::digest::DigestReport;
use raftq_jepsen::workload::{self, queue, FinalReads, Workload};

use crate::cli::HostsKind;

/// Everything a run reports, in `results.json`.
#[derive(Debug, Serialize)]
pub(crate) struct RunResults {
    pub(crate) scenario: String,
    pub(crate) workload: Workload,
    pub(crate) hosts: HostsKind,
    pub(crate) fault: String,
    pub(crate) duration_ms: u64,
    pub(crate) wall_ms: u64,
    pub(crate) seed: u64,
    pub(crate) raftq_bin: PathBuf,
    /// The combined verdict of the table row.
    pub(crate) verdict: Verdict,
    /// The workload's own checker (queue or stream).
    pub(crate) checker: serde_json::Value,
    /// The log checks (the stream checker over publishes and final reads), for the queue
    /// workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_checker: Option<serde_json::Value>,
    pub(crate) faults: Vec<nemesis::Applied>,
    /// `corrupt-minority`: how the nodes restarted on damaged data fared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) damage: Option<DamageSummary>,
    /// The queue checker's options (lease, retention topic), to judge the history again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue_options: Option<QueueOptions>,
    /// Whether a leader was agreed on after healing.
    pub(crate) healed_leader: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drain: Option<queue::DrainReport>,
    pub(crate) final_reads: FinalReads,
    /// The final reads of the topic with retention by age (clock scenarios).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) aged_reads: Option<FinalReads>,
    /// The server's count of acks against the history's, after a complete drain (queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ack_count: Option<AckCount>,
    /// Every node's state digest at one index, after the final reads (`None`: not compared,
    /// as there was no leader after healing).
    pub(crate) digest: Option<DigestReport>,
    /// How each node exited at the end (SIGTERM).
    pub(crate) node_exits: BTreeMap<u64, String>,
    /// Things worth a look that are not anomalies.
    pub(crate) notes: Vec<String>,
}

/// How the nodes restarted on damaged data fared (`corrupt-minority`).
#[derive(Debug, Serialize)]
pub(crate) struct DamageSummary {
    /// Starts that were refused: the node exited (its message must say "is damaged").
    pub(crate) refused: u64,
    /// Starts that went ahead after the node said its data "is damaged", and caught up from
    /// the others (a rejoin).
    pub(crate) rejoined: u64,
    /// Starts that went ahead on damaged data without a word about it (a finding to look at).
    pub(crate) silent: u64,
    /// Refusals whose message did not say "is damaged".
    pub(crate) unreported: Vec<String>,
}

/// What a finished run hands back to the table.
pub(crate) struct Row {
    pub(crate) scenario: Scenario,
    pub(crate) workload: Workload,
    pub(crate) outcome: Result<Verdict, String>,
    pub(crate) notes: Vec<String>,
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

/// The queue checker's options for a run with `settings`.
pub(crate) fn queue_options(settings: &workload::Settings) -> QueueOptions {
    QueueOptions {
        ack_timeout_ms: settings.ack_timeout_ms,
        // The workload's subscription has no dead-letter topic.
        dead_letter_topic: None,
        retention: settings.aged.clone(),
    }
}

/// Runs the checkers that fit the workload: the combined verdict and the full reports.
pub(crate) fn judge(
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

pub(crate) const TABLE_HEADER: &str = "| scenario | workload | fault | ops | ok/fail/info | anomalies | verdict |\n|---|---|---|---|---|---|---|";

pub(crate) fn table_row(row: &Row) -> String {
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

pub(crate) fn exit_code(rows: &[Row]) -> ExitCode {
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

/// The negative control's verdict on a run's results: `(passed, why)`. It passes when the run
/// is INVALID because some, but not all, acknowledged records were lost: `lost` among its
/// failures with `0 < lost < acknowledged` by the queue checker (acknowledged records that no
/// consumer ever had acked), or `log.lost` with `0 < lost < acknowledged` by the log checker
/// (acknowledged records missing from the final reads: records that were acked before the
/// power loss are lost from the log, though a consumer had them); and every fault of the run
/// happened.
pub(crate) fn expect_loss(results: &serde_json::Value) -> (bool, String) {
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
