//! What was applied, and the check that a run applied every fault its scenario promises.

use super::*;

/// One fault as the run applied it, for the results file.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    pub fault: Fault,
    /// The leader when the fault was chosen.
    pub leader: Option<u64>,
    /// Milliseconds since the history's start.
    pub start_ms: u64,
    pub stop_ms: Option<u64>,
    /// Whether applying it succeeded (it happened).
    pub applied: bool,
    /// Why applying or undoing it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The leadership transfers made while it held (`membership-transfer`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<membership::Move>,
    /// What the fault did, as found while applying and undoing it (power loss, damage, clock,
    /// full disk, slow fsync).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// What a run's faults say about the run itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCheck {
    /// Faults that could not be applied or undone, each as `description: error`.
    pub not_applied: Vec<String>,
    /// The scenario has a fault, and not one was applied.
    pub no_fault: bool,
    /// Nodes that refused to start on damaged data without saying that their data "is
    /// damaged" (`damage_unreported`, a broken promise): each as `node N at T ms: message`.
    pub damage_unreported: Vec<String>,
    /// Starts on damaged data: refused (the node exited), rejoined (it started, said its data
    /// is damaged, and caught up from the others), and silent (it started on damaged data
    /// without a word about it: a finding to look at; the checkers then judge whether anything
    /// was lost).
    pub damage_refused: u64,
    pub damage_rejoined: u64,
    pub damage_silent: u64,
    /// What the faults did that is worth a line in the table's notes.
    pub notes: Vec<String>,
}

/// Judges the faults of a run of `scenario`: every fault must have been applied and undone
/// (`fault_not_applied`), and a scenario other than `none` must have applied at least one
/// (`no_fault`).
pub fn check_faults(scenario: Scenario, faults: &[Applied]) -> FaultCheck {
    let mut check = FaultCheck {
        not_applied: faults
            .iter()
            .filter_map(|f| {
                f.error
                    .as_ref()
                    .map(|e| format!("{} at {} ms: {e}", f.fault.describe(), f.start_ms))
            })
            .collect(),
        no_fault: scenario != Scenario::None && !faults.iter().any(|f| f.applied),
        ..FaultCheck::default()
    };
    let mut lost_bytes = Vec::new();
    for f in faults {
        let at = f.start_ms;
        match &f.outcome {
            Some(Outcome::Damage(d)) => match &d.start {
                Some(disk::Start::Refused {
                    exit,
                    message,
                    says_damaged,
                }) => {
                    check.damage_refused += 1;
                    check.notes.push(format!(
                        "damage at {at} ms: node {} refused to start ({exit}): {message}",
                        d.node
                    ));
                    if !says_damaged {
                        check
                            .damage_unreported
                            .push(format!("node {} at {at} ms: {message}", d.node));
                    }
                }
                Some(disk::Start::Started {
                    caught_up,
                    says_damaged,
                    detail,
                }) => {
                    let files: Vec<String> = d
                        .damaged
                        .iter()
                        .map(|x| format!("{} {}", x.file, x.what))
                        .collect();
                    let how = if *says_damaged {
                        check.damage_rejoined += 1;
                        "rejoined: started, said its data is damaged,"
                    } else {
                        check.damage_silent += 1;
                        "STARTED on damaged data without a word about it"
                    };
                    check.notes.push(format!(
                        "damage at {at} ms: node {} {how} ({}) and {} ({detail})",
                        d.node,
                        files.join(", "),
                        if *caught_up {
                            "caught up"
                        } else {
                            "did not catch up"
                        }
                    ));
                }
                None => {}
            },
            Some(Outcome::DiskFull(d)) => check.notes.push(match &d.exit {
                Some(exit) => format!(
                    "disk full at {at} ms: node {} stopped ({exit}; {} writes refused): {}",
                    d.node,
                    d.enospc,
                    d.message.as_deref().unwrap_or_default()
                ),
                None => format!(
                    "disk full at {at} ms: node {} still ran when the limit was lifted ({} writes \
                     refused)",
                    d.node, d.enospc
                ),
            }),
            Some(Outcome::PowerLoss(p)) => lost_bytes.push(p.bytes.to_string()),
            _ => {}
        }
    }
    if !lost_bytes.is_empty() {
        check.notes.push(format!(
            "power loss: unsynced bytes lost per fault: {}",
            lost_bytes.join(", ")
        ));
    }
    check
}

/// The nodes a fault touches: killed, paused or impaired ones; for a partition, every node
/// that lost a link.
pub fn targets(fault: &Fault, ids: &[u64]) -> Vec<u64> {
    match fault {
        Fault::Kill { nodes }
        | Fault::KillAll { nodes }
        | Fault::Pause { nodes }
        | Fault::Netem { nodes, .. } => nodes.clone(),
        Fault::Demote { node, .. } => vec![*node],
        Fault::Oneway { from, to } => {
            let mut both = vec![*from, *to];
            both.sort_unstable();
            both
        }
        Fault::DemoteKill { node, kill, .. } => {
            let mut both = vec![*node, *kill];
            both.sort_unstable();
            both.dedup();
            both
        }
        Fault::Transfer { voters } => voters.clone(),
        Fault::PowerLossAll { nodes } => nodes.clone(),
        Fault::PowerLossLeader { node, .. }
        | Fault::Corrupt { node, .. }
        | Fault::ClockJump { node, .. }
        | Fault::ClockStrobe { node, .. }
        | Fault::DiskFull { node, .. }
        | Fault::SlowFsync { node, .. } => vec![*node],
        Fault::Partition { groups } => ids
            .iter()
            .copied()
            .filter(|a| ids.iter().any(|b| !crate::hosts::connected(groups, *a, *b)))
            .collect(),
    }
}
