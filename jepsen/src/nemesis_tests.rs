use super::*;
use crate::hosts::connected;

/// Which nodes `id` can talk to under `groups`, itself included.
fn view(groups: &[Vec<u64>], ids: &[u64], id: u64) -> Vec<u64> {
    ids.iter()
        .copied()
        .filter(|other| connected(groups, id, *other))
        .collect()
}

fn assert_majorities_ring(ids: &[u64]) {
    let groups = majorities_ring(ids);
    let views: Vec<Vec<u64>> = ids.iter().map(|id| view(&groups, ids, *id)).collect();
    for (id, v) in ids.iter().zip(&views) {
        assert!(v.len() > ids.len() / 2, "node {id} sees {v:?}: no majority");
    }
    for (i, a) in views.iter().enumerate() {
        for b in &views[i + 1..] {
            assert_ne!(a, b, "two nodes see the same set with {groups:?}");
        }
    }
    assert!(
        views.iter().any(|v| v.len() < ids.len()),
        "{groups:?} cuts nothing"
    );
}

#[test]
fn rings_give_every_node_a_different_majority() {
    assert_majorities_ring(&[2, 1, 3]);
    assert_majorities_ring(&[1, 2, 3, 4]);
    assert_majorities_ring(&[1, 2, 3, 4, 5]);
    assert_majorities_ring(&[5, 3, 1, 7, 2, 6, 4]);
    // Three nodes: a line with the first node (the leader) at one end.
    assert_eq!(majorities_ring(&[2, 1, 3]), vec![vec![1, 2], vec![1, 3]]);
}

#[test]
fn halves_bridge_and_isolation() {
    assert_eq!(halves(&[3, 1, 2]), vec![vec![3], vec![1, 2]]);
    assert_eq!(halves(&[5, 4, 3, 2, 1]), vec![vec![4, 5], vec![1, 2, 3]]);
    assert_eq!(bridge(&[2, 3, 1]), vec![vec![2, 3], vec![1, 2]]);
    assert_eq!(bridge(&[3, 1, 2, 4, 5]), vec![vec![1, 2, 3], vec![3, 4, 5]]);
    assert_eq!(isolate(&[1, 2, 3], 2), vec![vec![2], vec![1, 3]]);
}

#[test]
fn leader_faults_target_the_leader() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let ids = [1, 2, 3];
    assert_eq!(
        choose(Scenario::KillLeader, &ids, Some(2), &mut rng),
        Some(Fault::Kill { nodes: vec![2] })
    );
    assert_eq!(
        choose(Scenario::PartitionLeader, &ids, Some(3), &mut rng),
        Some(Fault::Partition {
            groups: vec![vec![3], vec![1, 2]]
        })
    );
    let Some(Fault::Partition { groups }) =
        choose(Scenario::PartitionRing, &ids, Some(1), &mut rng)
    else {
        panic!("a ring is a partition");
    };
    // The leader keeps a link to exactly one follower.
    assert_eq!(view(&groups, &ids, 1).len(), 2);
    assert_eq!(choose(Scenario::None, &ids, Some(1), &mut rng), None);
    assert!(matches!(
        choose(Scenario::KillLeader, &ids, None, &mut rng),
        Some(Fault::Kill { nodes }) if nodes.len() == 1
    ));
}

#[test]
fn partition_one_isolates_a_follower_never_the_leader() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let ids = [1, 2, 3];
    let mut isolated = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let Some(Fault::Partition { groups }) =
            choose(Scenario::PartitionOne, &ids, Some(2), &mut rng)
        else {
            panic!("partition-one is a partition");
        };
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].len(), 1, "one node alone: {groups:?}");
        assert_ne!(groups[0], vec![2], "the leader was isolated");
        assert!(groups[1].contains(&2), "the leader keeps its majority");
        isolated.insert(groups[0][0]);
    }
    // Both followers get their turn.
    assert_eq!(isolated.into_iter().collect::<Vec<_>>(), vec![1, 3]);
    // No leader known: still one node alone.
    let Some(Fault::Partition { groups }) = choose(Scenario::PartitionOne, &ids, None, &mut rng)
    else {
        panic!("partition-one is a partition");
    };
    assert_eq!(groups[0].len(), 1);
    assert_eq!(Scenario::PartitionOne.fault(), "partition");
}

#[test]
fn netem_scenarios_impair_every_node() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let ids = [1, 2, 3];
    for scenario in [
        Scenario::NetemDelay,
        Scenario::NetemLoss,
        Scenario::NetemReorder,
    ] {
        let netem = scenario
            .netem()
            .expect("a netem scenario has an impairment");
        assert!(netem.validate().is_ok(), "{scenario}: {netem}");
        assert_eq!(scenario.fault(), "netem");
        let fault = choose(scenario, &ids, Some(1), &mut rng);
        assert_eq!(
            fault,
            Some(Fault::Netem {
                nodes: vec![1, 2, 3],
                netem
            })
        );
        let fault = fault.unwrap_or(Fault::Kill { nodes: vec![] });
        assert_eq!(targets(&fault, &ids), vec![1, 2, 3]);
        assert!(fault.describe().starts_with("netem [1, 2, 3] "));
    }
    assert_eq!(Scenario::NetemLoss.netem().map(|n| n.loss_pct), Some(10));
    assert_eq!(Scenario::KillLeader.netem(), None);
    // Every scenario is in the matrix once, under its own name.
    let names: std::collections::BTreeSet<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(names.len(), Scenario::ALL.len());
    assert!(names.contains("partition-one") && names.contains("netem-reorder"));
    assert!(names.contains("membership-demote") && names.contains("membership-transfer"));
}

#[test]
fn demote_takes_a_follower_out_of_the_voters() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let ids = [1, 2, 3];
    let mut demoted = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let Some(Fault::Demote { node, voters }) =
            choose(Scenario::MembershipDemote, &ids, Some(3), &mut rng)
        else {
            panic!("membership-demote is a demotion");
        };
        assert_ne!(node, 3, "the leader was demoted");
        assert_eq!(voters.len(), 2, "{voters:?}");
        assert!(!voters.contains(&node) && voters.contains(&3), "{voters:?}");
        let fault = Fault::Demote {
            node,
            voters: voters.clone(),
        };
        assert_eq!(targets(&fault, &ids), vec![node]);
        assert_eq!(
            fault.describe(),
            format!("demote {node} (voters {voters:?})")
        );
        demoted.insert(node);
    }
    assert_eq!(demoted.into_iter().collect::<Vec<_>>(), vec![1, 2]);
    // No leader known: still one node out of three.
    let Some(Fault::Demote { voters, .. }) =
        choose(Scenario::MembershipDemote, &ids, None, &mut rng)
    else {
        panic!("membership-demote is a demotion");
    };
    assert_eq!(voters.len(), 2);
    assert!(Scenario::MembershipDemote.changes_membership());
    assert!(!Scenario::PartitionOne.changes_membership());
}

#[test]
fn transfer_moves_among_every_node() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let fault = choose(Scenario::MembershipTransfer, &[3, 1, 2], Some(1), &mut rng);
    assert_eq!(
        fault,
        Some(Fault::Transfer {
            voters: vec![1, 2, 3]
        })
    );
    let fault = fault.unwrap_or(Fault::Kill { nodes: vec![] });
    assert_eq!(targets(&fault, &[1, 2, 3]), vec![1, 2, 3]);
    assert!(fault
        .describe()
        .starts_with("transfer-leader among [1, 2, 3]"));
    for scenario in [Scenario::MembershipDemote, Scenario::MembershipTransfer] {
        assert_eq!(scenario.fault(), "membership");
        assert_eq!(scenario.netem(), None);
    }
    // The fault as the results file shows it.
    let json = serde_json::to_value(Fault::Demote {
        node: 2,
        voters: vec![1, 3],
    })
    .unwrap_or_default();
    assert_eq!(
        json,
        serde_json::json!({"kind": "demote", "node": 2, "voters": [1, 3]})
    );
}

#[test]
fn new_scenarios_choose_their_faults() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let ids = [1, 2, 3];
    // kill-restart-leader: the leader, restarted with no hold.
    assert_eq!(
        choose(Scenario::KillRestartLeader, &ids, Some(2), &mut rng),
        Some(Fault::Kill { nodes: vec![2] })
    );
    assert_eq!(
        Scenario::KillRestartLeader.default_timing().hold,
        Duration::ZERO
    );
    // kill-all: every node, as one fault for the hosts' kill_all.
    let all = choose(Scenario::KillAll, &ids, Some(2), &mut rng);
    assert_eq!(
        all,
        Some(Fault::KillAll {
            nodes: vec![1, 2, 3]
        })
    );
    assert_eq!(
        targets(&all.unwrap_or(Fault::Kill { nodes: vec![] }), &ids),
        vec![1, 2, 3]
    );
    // partition-oneway: always between the leader and a follower, both directions in turn.
    let mut directions = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let Some(Fault::Oneway { from, to }) =
            choose(Scenario::PartitionOneway, &ids, Some(3), &mut rng)
        else {
            panic!("partition-oneway is a one-way cut");
        };
        assert_ne!(from, to);
        assert!(from == 3 || to == 3, "{from}->{to} misses the leader");
        directions.insert(from == 3);
        let fault = Fault::Oneway { from, to };
        assert_eq!(targets(&fault, &ids).len(), 2);
        assert_eq!(fault.describe(), format!("drop {from}->{to} (one way)"));
    }
    assert_eq!(directions.len(), 2, "both directions are chosen");
    assert_eq!(Scenario::PartitionOneway.fault(), "partition");
    // membership-kill: a follower demoted; the leader killed about half of the time.
    let (mut leader_kills, mut other_kills) = (0, 0);
    for _ in 0..100 {
        let Some(Fault::DemoteKill {
            node,
            voters,
            kill,
            delay_ms,
        }) = choose(Scenario::MembershipKill, &ids, Some(1), &mut rng)
        else {
            panic!("membership-kill is a demotion with a kill");
        };
        assert_ne!(node, 1, "the leader was demoted");
        assert_eq!(voters, membership::without(&ids, node));
        assert!(DEMOTE_KILL_DELAY_MS.contains(&delay_ms));
        assert!(ids.contains(&kill));
        if kill == 1 {
            leader_kills += 1;
        } else {
            other_kills += 1;
        }
    }
    assert!((25..=75).contains(&leader_kills), "{leader_kills} of 100");
    assert!(other_kills > 0);
    assert!(Scenario::MembershipKill.changes_membership());
    // No leader known: still a kill of some node.
    assert!(matches!(
        choose(Scenario::MembershipKill, &ids, None, &mut rng),
        Some(Fault::DemoteKill { kill, .. }) if ids.contains(&kill)
    ));
}

/// The CI subset runs 10 s per scenario: at least one fault of each must fit, and so must
/// one of every scenario but the baseline.
#[test]
fn default_timings_fit_a_fault_into_ten_seconds() {
    for scenario in Scenario::ALL {
        if scenario == Scenario::None {
            continue;
        }
        let t = scenario.default_timing();
        // The worst jitter: a quarter of the quiet time.
        let worst = t.quiet + t.quiet / 4 + t.hold + scenario.apply_time();
        assert!(
            worst < Duration::from_secs(10),
            "{scenario}: {worst:?} does not fit into 10 s"
        );
    }
}

#[test]
fn faults_that_did_not_happen_are_reported() {
    let applied = |ok: bool, error: Option<&str>| Applied {
        fault: Fault::Kill { nodes: vec![1] },
        leader: Some(1),
        start_ms: 3_000,
        stop_ms: Some(6_000),
        applied: ok,
        error: error.map(str::to_string),
        moves: Vec::new(),
        outcome: None,
    };
    let fine = check_faults(Scenario::KillLeader, &[applied(true, None)]);
    assert_eq!(fine, FaultCheck::default());
    let none = check_faults(Scenario::KillLeader, &[]);
    assert!(none.no_fault && none.not_applied.is_empty());
    assert_eq!(check_faults(Scenario::None, &[]), FaultCheck::default());
    let failed = check_faults(
        Scenario::KillLeader,
        &[
            applied(false, Some("apply: cannot kill")),
            applied(true, None),
        ],
    );
    assert!(!failed.no_fault);
    assert_eq!(
        failed.not_applied,
        vec!["kill [1] at 3000 ms: apply: cannot kill".to_string()]
    );
    // Applied but not undone: still reported, and it did happen.
    let undo = check_faults(
        Scenario::KillLeader,
        &[applied(true, Some("undo: cannot start"))],
    );
    assert!(!undo.no_fault);
    assert_eq!(undo.not_applied.len(), 1);
    // Every fault failed: both.
    let all_failed = check_faults(Scenario::KillLeader, &[applied(false, Some("apply: x"))]);
    assert!(all_failed.no_fault);
    assert_eq!(all_failed.not_applied.len(), 1);
}

#[test]
fn disk_and_clock_scenarios_choose_their_faults() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let ids = [1, 2, 3];
    // powerloss-all: every node.
    let all = choose(Scenario::PowerlossAll, &ids, Some(2), &mut rng);
    assert_eq!(
        all,
        Some(Fault::PowerLossAll {
            nodes: vec![1, 2, 3]
        })
    );
    // powerloss-leader: the leader, slowed then cut; restarted at once every other time.
    let Some(first) = choose(Scenario::PowerlossLeader, &ids, Some(3), &mut rng) else {
        panic!("powerloss-leader has a fault");
    };
    let Fault::PowerLossLeader {
        node,
        fsync_delay_ms,
        slow_ms,
        ..
    } = first.clone()
    else {
        panic!("powerloss-leader is a power loss of the leader: {first:?}");
    };
    assert_eq!(node, 3);
    assert!(SLOW_FSYNC_MS.contains(&fsync_delay_ms));
    assert!(SLOW_PHASE_MS.contains(&slow_ms));
    let hold = Duration::from_secs(3);
    let at_once: Vec<Duration> = (0..4)
        .map(|nth| alternate(first.clone(), nth).hold(hold))
        .collect();
    assert_eq!(at_once, vec![Duration::ZERO, hold, Duration::ZERO, hold]);
    assert!(alternate(first.clone(), 0)
        .describe()
        .ends_with("restarted at once"));
    assert_eq!(targets(&first, &ids), vec![3]);
    // Other faults keep their hold.
    assert_eq!(
        alternate(Fault::Kill { nodes: vec![1] }, 0).hold(hold),
        hold
    );

    // corrupt-minority and slow-fsync: the leader about half of the time.
    for scenario in [Scenario::CorruptMinority, Scenario::SlowFsync] {
        let mut leader = 0;
        for _ in 0..100 {
            let fault = choose(scenario, &ids, Some(1), &mut rng);
            let node = match &fault {
                Some(Fault::Corrupt { node, plan }) => {
                    assert!(!plan.is_empty());
                    *node
                }
                Some(Fault::SlowFsync { node, delay_ms }) => {
                    assert!(STALL_FSYNC_MS.contains(delay_ms));
                    *node
                }
                other => panic!("{scenario}: {other:?}"),
            };
            if node == 1 {
                leader += 1;
            }
        }
        assert!((25..=75).contains(&leader), "{scenario}: {leader} of 100");
    }

    // clock-jump: the leader, seconds to minutes, both ways.
    let (mut ahead, mut behind) = (0, 0);
    for _ in 0..100 {
        let Some(Fault::ClockJump { node, offset_ms }) =
            choose(Scenario::ClockJump, &ids, Some(2), &mut rng)
        else {
            panic!("clock-jump is a jump");
        };
        assert_eq!(node, 2);
        assert!(clock::STEP_MS.contains(&offset_ms.unsigned_abs()));
        if offset_ms > 0 {
            ahead += 1;
        } else {
            behind += 1;
        }
    }
    assert!(ahead > 25 && behind > 25, "{ahead} ahead, {behind} behind");
    let Some(Fault::ClockStrobe { node, amplitude_ms }) =
        choose(Scenario::ClockStrobe, &ids, Some(2), &mut rng)
    else {
        panic!("clock-strobe is a strobe");
    };
    assert_eq!(node, 2);
    assert!(clock::STEP_MS.contains(&amplitude_ms));

    // disk-full: any node, a little space left.
    let mut nodes = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let Some(Fault::DiskFull { node, slack }) =
            choose(Scenario::DiskFull, &ids, Some(2), &mut rng)
        else {
            panic!("disk-full fills a disk");
        };
        assert!(DISK_FULL_SLACK.contains(&slack));
        nodes.insert(node);
    }
    assert_eq!(nodes.len(), 3);

    // What they need from the hosts.
    let disks: Vec<&str> = Scenario::ALL
        .iter()
        .filter(|s| s.needs_fault_disks())
        .map(|s| s.name())
        .collect();
    assert_eq!(
        disks,
        vec![
            "powerloss-all",
            "powerloss-leader",
            "disk-full",
            "slow-fsync"
        ]
    );
    let clocks: Vec<&str> = Scenario::ALL
        .iter()
        .filter(|s| s.needs_fake_clock())
        .map(|s| s.name())
        .collect();
    assert_eq!(clocks, vec!["clock-jump", "clock-strobe"]);
    assert!(!Scenario::CorruptMinority.needs_fault_disks());
    assert_eq!(Scenario::PowerlossAll.fault(), "power loss");
}

#[test]
fn fault_outcomes_are_judged_and_noted() {
    let damaged = |start: disk::Start| Applied {
        fault: Fault::Corrupt {
            node: 2,
            plan: Vec::new(),
        },
        leader: Some(1),
        start_ms: 3_000,
        stop_ms: Some(6_000),
        applied: true,
        error: None,
        moves: Vec::new(),
        outcome: Some(Outcome::Damage(disk::DamageOutcome {
            node: 2,
            damaged: vec![disk::Damaged {
                file: "db/000009.log".into(),
                size: 100,
                what: "cut to 10 bytes".into(),
            }],
            start: Some(start),
            after_restore: None,
            copy: std::path::PathBuf::from("node2.pre-damage"),
        })),
    };
    let refused = |message: &str| disk::Start::Refused {
        exit: "exit status: 2".into(),
        message: message.into(),
        says_damaged: message.contains(disk::DAMAGED),
    };
    let check = check_faults(
        Scenario::CorruptMinority,
        &[
            damaged(refused("the data directory is damaged: checksum mismatch.")),
            damaged(refused("thread 'main' panicked")),
            damaged(disk::Start::Started {
                caught_up: true,
                says_damaged: false,
                detail: "applied 10 of 10".into(),
            }),
            damaged(disk::Start::Started {
                caught_up: true,
                says_damaged: true,
                detail: "applied 10 of 10".into(),
            }),
        ],
    );
    assert_eq!(
        (
            check.damage_refused,
            check.damage_rejoined,
            check.damage_silent
        ),
        (2, 1, 1)
    );
    assert_eq!(
        check.damage_unreported,
        vec!["node 2 at 3000 ms: thread 'main' panicked".to_string()]
    );
    assert_eq!(check.notes.len(), 4);
    assert!(check.notes[2]
        .contains("STARTED on damaged data without a word about it (db/000009.log cut to 10"));
    assert!(check.notes[3].contains("rejoined: started, said its data is damaged,"));
    assert!(check.not_applied.is_empty() && !check.no_fault);

    // A full disk: how the node ended, in the notes.
    let full = Applied {
        fault: Fault::DiskFull { node: 3, slack: 1 },
        outcome: Some(Outcome::DiskFull(disk::DiskFullOutcome {
            node: 3,
            used: 10,
            limit: 11,
            enospc: 4,
            exit: Some("exit status: 70".into()),
            message: Some("IO error: No space left on device".into()),
            log_mark: 0,
        })),
        ..damaged(refused(""))
    };
    let check = check_faults(Scenario::DiskFull, &[full]);
    assert_eq!(
        check.notes,
        vec![
            "disk full at 3000 ms: node 3 stopped (exit status: 70; 4 writes refused): IO \
             error: No space left on device"
                .to_string()
        ]
    );
    // The outcome as the results file shows it.
    let json = serde_json::to_value(Outcome::PowerLoss(disk::PowerLossOutcome {
        bytes: 7,
        ..disk::PowerLossOutcome::default()
    }))
    .unwrap_or_default();
    assert_eq!(json["kind"], "power_loss");
    assert_eq!(json["bytes"], 7);
}
