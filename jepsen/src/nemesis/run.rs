//! The nemesis's schedule: faults and heals in turn until the run ends, then every node a
//! voter again.

use super::*;

/// Applies faults of `scenario` on the schedule of `timing` until `deadline`, recording each
/// start and stop in `history` as the nemesis process. A fault is only started when it can be
/// undone by the deadline; whatever it did is undone before this returns.
pub async fn run<H: Hosts>(
    hosts: &H,
    http: &Http,
    history: &History,
    scenario: Scenario,
    timing: Timing,
    deadline: Instant,
    seed: u64,
) -> Vec<Applied> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ids = hosts.ids();
    let mut applied = Vec::new();
    if scenario == Scenario::None {
        return applied;
    }
    loop {
        let quiet = jitter(timing.quiet, &mut rng);
        if Instant::now() + quiet + timing.hold + scenario.apply_time() > deadline {
            break;
        }
        tokio::time::sleep(quiet).await;
        let leader = find_leader(http).await;
        let Some(fault) = choose(scenario, &ids, leader, &mut rng) else {
            break;
        };
        let fault = alternate(fault, applied.len());
        let mut outcome = None;
        let name = scenario.name();
        let touched = targets(&fault, &ids);
        let detail = format!("{} (leader: {})", fault.describe(), show(leader));
        let start_ms = history.elapsed_us() / 1000;
        say(history, &format!("start {name}: {detail}"));
        let handle = history.invoke(
            Process::Nemesis,
            None,
            Op::fault(name, Phase::Start, touched.clone()),
        );
        let mut error = None;
        let mut applied_ok = false;
        match apply(hosts, http, &fault, timing.hold, &mut outcome).await {
            Ok(extra) => {
                applied_ok = true;
                if !extra.is_empty() {
                    say(history, &format!("applied {name}{extra}"));
                }
                handle.ok(OpResult::Fault {
                    detail: format!("{detail}{extra}"),
                });
            }
            Err(err) => {
                say(history, &format!("cannot apply {name}: {err:#}"));
                error = Some(format!("apply: {err:#}"));
                handle.info(format!("{err:#}"));
            }
        }
        let hold_end = Instant::now() + fault.hold(timing.hold);
        let moves = match &fault {
            Fault::Transfer { voters } => {
                membership::transfers(http, history, voters, hold_end, &mut rng).await
            }
            Fault::ClockStrobe { node, amplitude_ms } if applied_ok => {
                let (flips, failed) =
                    clock::strobe(hosts, *node, *amplitude_ms as i64, hold_end, &mut rng).await;
                if let Some(Outcome::Clock(c)) = outcome.as_mut() {
                    c.flips = flips;
                }
                if let Some(failed) = failed {
                    say(history, &format!("strobe of {name} stopped: {failed}"));
                    error.get_or_insert(format!("strobe: {failed}"));
                }
                Vec::new()
            }
            _ => {
                tokio::time::sleep_until(hold_end.into()).await;
                Vec::new()
            }
        };
        let made = moves.iter().filter(|m| m.error.is_none()).count();
        if matches!(fault, Fault::Transfer { .. }) && made == 0 {
            applied_ok = false;
            error.get_or_insert_with(|| "no leadership transfer succeeded".to_string());
        }
        let handle = history.invoke(
            Process::Nemesis,
            None,
            Op::fault(name, Phase::Stop, touched),
        );
        match undo(hosts, http, &fault, &mut outcome).await {
            Ok(extra) => {
                if !extra.is_empty() {
                    say(history, &format!("undone {name}{extra}"));
                }
                let mut detail = format!("undone: {}{extra}", fault.describe());
                if matches!(fault, Fault::Transfer { .. }) {
                    let listed: Vec<String> = moves.iter().map(|m| m.describe()).collect();
                    detail.push_str(&format!(
                        "; {} transfers, {made} ok: {}",
                        moves.len(),
                        listed.join(", ")
                    ));
                }
                handle.ok(OpResult::Fault { detail });
            }
            Err(err) => {
                say(history, &format!("cannot undo {name}: {err:#}"));
                error.get_or_insert(format!("undo: {err:#}"));
                handle.info(format!("{err:#}"));
            }
        }
        say(history, &format!("stop {name}"));
        applied.push(Applied {
            fault,
            leader,
            start_ms,
            stop_ms: Some(history.elapsed_us() / 1000),
            applied: applied_ok,
            error,
            moves,
            outcome,
        });
    }
    applied
}

/// Healing's part for the membership: makes every node of `ids` a voter again (bounded by
/// [`VOTERS_TIMEOUT`]). Returns whether the voters had to change; when they did, or when they
/// could not be restored, it is recorded in the history as a stop of the fault `name`.
pub async fn heal_voters(
    http: &Http,
    history: &History,
    name: &str,
    ids: &[u64],
) -> anyhow::Result<bool> {
    let result = membership::ensure_voters(http, ids, Instant::now() + VOTERS_TIMEOUT).await;
    match &result {
        Ok(ensured) if !ensured.changed => {}
        Ok(ensured) => {
            let detail = format!(
                "healing: voters {:?} again (were {:?}; leader {})",
                ids, ensured.before, ensured.leader
            );
            say(history, &detail);
            let missing = ids
                .iter()
                .copied()
                .filter(|id| !ensured.before.contains(id))
                .collect();
            history
                .invoke(
                    Process::Nemesis,
                    None,
                    Op::fault(name, Phase::Stop, missing),
                )
                .ok(OpResult::Fault { detail });
        }
        Err(err) => {
            say(
                history,
                &format!("healing: cannot make {ids:?} voters: {err:#}"),
            );
            history
                .invoke(
                    Process::Nemesis,
                    None,
                    Op::fault(name, Phase::Stop, ids.to_vec()),
                )
                .info(format!("healing: cannot make {ids:?} voters: {err:#}"));
        }
    }
    result.map(|ensured| ensured.changed)
}

pub(super) fn show(node: Option<u64>) -> String {
    node.map_or_else(|| "none".to_string(), |n| n.to_string())
}

/// A progress line, stamped with the time since the history began.
pub fn say(history: &History, text: &str) {
    eprintln!(
        "[{:>6.1}s] nemesis: {text}",
        history.elapsed_us() as f64 / 1e6
    );
}

/// Picks a seeded random number generator's next delay jitter: up to a quarter of `base`.
fn jitter(base: Duration, rng: &mut impl rand::Rng) -> Duration {
    let quarter = base.as_millis() as u64 / 4;
    if quarter == 0 {
        return base;
    }
    base + Duration::from_millis(rng.gen_range(0..=quarter))
}
