//! Choosing a fault: the leader and the cluster's views, the partition topologies (isolate,
//! halves, majorities ring, bridge), and which fault of a scenario comes next.

use super::*;

/// The leader as the nodes see it: asks every node concurrently and takes the leader named
/// with the highest term. `None` when no node answers with a leader.
pub async fn find_leader(http: &Http) -> Option<u64> {
    cluster_views(http)
        .await
        .into_values()
        .filter_map(|(term, leader)| Some((term, leader?)))
        .max()
        .map(|(_, leader)| leader)
}

/// Each answering node's `(term, leader_id)`.
pub async fn cluster_views(http: &Http) -> BTreeMap<u64, (u64, Option<u64>)> {
    membership::statuses(http)
        .await
        .into_iter()
        .map(|(id, s)| (id, (s.term, s.leader_id)))
        .collect()
}

/// Waits until every node in `ids` answers and all name the same leader, which is one of
/// them; returns it, or `None` when `timeout` passes first.
pub async fn await_agreed_leader(http: &Http, ids: &[u64], timeout: Duration) -> Option<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        let views = cluster_views(http).await;
        let leaders: Vec<Option<u64>> = ids
            .iter()
            .map(|id| views.get(id).and_then(|(_, leader)| *leader))
            .collect();
        if let Some(Some(leader)) = leaders.first() {
            if leaders.iter().all(|l| *l == Some(*leader)) && ids.contains(leader) {
                return Some(*leader);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `node` alone; everyone else together.
pub fn isolate(ids: &[u64], node: u64) -> Vec<Vec<u64>> {
    let rest: Vec<u64> = ids.iter().copied().filter(|id| *id != node).collect();
    vec![vec![node], rest]
}

/// A random minority (⌊n/2⌋ nodes, in `order`'s first places) against the majority.
pub fn halves(order: &[u64]) -> Vec<Vec<u64>> {
    let cut = order.len() / 2;
    let mut minority = order[..cut].to_vec();
    let mut majority = order[cut..].to_vec();
    minority.sort_unstable();
    majority.sort_unstable();
    vec![minority, majority]
}

/// A majorities ring over the nodes in `order` (see the module documentation). With three
/// nodes: the line `order[0] - order[1] - order[2]`, so put the leader first.
pub fn majorities_ring(order: &[u64]) -> Vec<Vec<u64>> {
    let n = order.len();
    if n <= 3 {
        return order
            .windows(2)
            .map(|pair| {
                let mut pair = pair.to_vec();
                pair.sort_unstable();
                pair
            })
            .collect();
    }
    // Links to the `reach` nearest neighbours on each side: 1 + 2 * reach > n / 2.
    let reach = (n / 2).div_ceil(2);
    let mut groups = Vec::new();
    for i in 0..n {
        for k in 1..=reach {
            let mut pair = vec![order[i], order[(i + k) % n]];
            pair.sort_unstable();
            if !groups.contains(&pair) {
                groups.push(pair);
            }
        }
    }
    groups
}

/// Two halves joined by `order[0]`, which belongs to both.
pub fn bridge(order: &[u64]) -> Vec<Vec<u64>> {
    let Some((&bridge_node, rest)) = order.split_first() else {
        return Vec::new();
    };
    let cut = rest.len() / 2;
    let mut left: Vec<u64> = std::iter::once(bridge_node)
        .chain(rest[..cut].iter().copied())
        .collect();
    let mut right: Vec<u64> = std::iter::once(bridge_node)
        .chain(rest[cut..].iter().copied())
        .collect();
    left.sort_unstable();
    right.sort_unstable();
    vec![left, right]
}

/// Chooses the next fault of `scenario`. `leader` is the current leader, if known.
pub fn choose(
    scenario: Scenario,
    ids: &[u64],
    leader: Option<u64>,
    rng: &mut impl rand::Rng,
) -> Option<Fault> {
    let mut shuffled = ids.to_vec();
    shuffled.shuffle(rng);
    // The leader, or a random node when no leader is known (leader-biased faults).
    let target = leader
        .filter(|l| ids.contains(l))
        .unwrap_or_else(|| shuffled[0]);
    let leader_first = || {
        let mut order = vec![target];
        order.extend(shuffled.iter().copied().filter(|id| *id != target));
        order
    };
    // A follower: any node but the leader (a random one when no leader is known).
    let follower = shuffled
        .iter()
        .copied()
        .find(|id| Some(*id) != leader)
        .unwrap_or(target);
    Some(match scenario {
        Scenario::None => return None,
        Scenario::KillLeader | Scenario::KillRestartLeader => Fault::Kill {
            nodes: vec![target],
        },
        Scenario::KillAll => Fault::KillAll {
            nodes: ids.to_vec(),
        },
        Scenario::PartitionOneway => {
            // The leader and a follower, one of the two directions at random.
            let other = follower;
            if rng.gen_bool(0.5) {
                Fault::Oneway {
                    from: target,
                    to: other,
                }
            } else {
                Fault::Oneway {
                    from: other,
                    to: target,
                }
            }
        }
        Scenario::MembershipKill => {
            // The leader half of the time, else another node (the demoted one included).
            let others: Vec<u64> = shuffled
                .iter()
                .copied()
                .filter(|id| Some(*id) != leader)
                .collect();
            let kill = match leader.filter(|l| ids.contains(l)) {
                Some(l) if rng.gen_bool(0.5) || others.is_empty() => l,
                _ => *others.choose(rng).unwrap_or(&target),
            };
            Fault::DemoteKill {
                node: follower,
                voters: membership::without(ids, follower),
                kill,
                delay_ms: rng.gen_range(DEMOTE_KILL_DELAY_MS),
            }
        }
        Scenario::PauseLeader => Fault::Pause {
            nodes: vec![target],
        },
        Scenario::PartitionLeader => Fault::Partition {
            groups: isolate(ids, target),
        },
        Scenario::PartitionOne => Fault::Partition {
            groups: isolate(ids, follower),
        },
        Scenario::PartitionHalves => Fault::Partition {
            groups: halves(&shuffled),
        },
        Scenario::PartitionRing => Fault::Partition {
            groups: majorities_ring(&if ids.len() <= 3 {
                leader_first()
            } else {
                shuffled.clone()
            }),
        },
        Scenario::PartitionBridge => Fault::Partition {
            groups: bridge(&shuffled),
        },
        Scenario::NetemDelay | Scenario::NetemLoss | Scenario::NetemReorder => Fault::Netem {
            nodes: ids.to_vec(),
            netem: scenario.netem()?,
        },
        Scenario::MembershipDemote => Fault::Demote {
            node: follower,
            voters: membership::without(ids, follower),
        },
        Scenario::MembershipTransfer => {
            let mut voters = ids.to_vec();
            voters.sort_unstable();
            Fault::Transfer { voters }
        }
        Scenario::PowerlossAll => Fault::PowerLossAll {
            nodes: ids.to_vec(),
        },
        Scenario::PowerlossLeader => Fault::PowerLossLeader {
            node: target,
            fsync_delay_ms: rng.gen_range(SLOW_FSYNC_MS),
            slow_ms: rng.gen_range(SLOW_PHASE_MS),
            at_once: true,
        },
        Scenario::CorruptMinority => Fault::Corrupt {
            node: leader_or_other(ids, leader, &shuffled, rng),
            plan: disk::Damage::plan(rng),
        },
        Scenario::ClockJump => {
            let step = clock::step_ms(rng) as i64;
            Fault::ClockJump {
                node: target,
                offset_ms: if rng.gen_bool(0.5) { step } else { -step },
            }
        }
        Scenario::ClockStrobe => Fault::ClockStrobe {
            node: target,
            amplitude_ms: clock::step_ms(rng),
        },
        Scenario::DiskFull => Fault::DiskFull {
            node: shuffled[0],
            slack: rng.gen_range(DISK_FULL_SLACK),
        },
        Scenario::SlowFsync => Fault::SlowFsync {
            node: leader_or_other(ids, leader, &shuffled, rng),
            delay_ms: rng.gen_range(STALL_FSYNC_MS),
        },
    })
}

/// The leader half of the time (when one is known), else a random other node.
fn leader_or_other(
    ids: &[u64],
    leader: Option<u64>,
    shuffled: &[u64],
    rng: &mut impl rand::Rng,
) -> u64 {
    let others: Vec<u64> = shuffled
        .iter()
        .copied()
        .filter(|id| Some(*id) != leader)
        .collect();
    match leader.filter(|l| ids.contains(l)) {
        Some(l) if rng.gen_bool(0.5) || others.is_empty() => l,
        _ => *others.choose(rng).unwrap_or(&shuffled[0]),
    }
}

/// The `nth` fault of a run (from 0), as the run applies it: a power loss of the leader
/// restarts it at once every other time, the first time included.
pub fn alternate(mut fault: Fault, nth: usize) -> Fault {
    if let Fault::PowerLossLeader { at_once, .. } = &mut fault {
        *at_once = nth.is_multiple_of(2);
    }
    fault
}
