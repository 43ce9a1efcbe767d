//! Clock faults: one node's wall clock stepped away from the true time (`clock-jump`) or
//! flipped back and forth (`clock-strobe`), through libfaketime ([`Hosts::set_clock`]).
//!
//! Every step that starts or ends a fault is checked on the node itself: its `/raft/status`
//! answers its wall clock (`wall_us`), and the harness compares it with its own (the same
//! machine's clock, read halfway through the request). A node whose clock did not move by the
//! step, within [`TOLERANCE_MS`], makes the fault fail (`fault_not_applied`): a clock fault
//! that silently does nothing proves nothing.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hosts::Hosts;
use crate::workload::http::Http;

/// How far a node's measured offset may be from the one set (request latency, the time
/// libfaketime takes to read its file, rounding).
pub const TOLERANCE_MS: i64 = 2_000;
/// How long to keep asking a node for its clock.
const MEASURE_TIMEOUT: Duration = Duration::from_secs(5);
/// Sizes of a step, in milliseconds (drawn log-uniformly: seconds as often as minutes).
pub const STEP_MS: std::ops::RangeInclusive<u64> = 5_000..=600_000;
/// `clock-strobe`: how long each side of the strobe lasts, in milliseconds.
pub const STROBE_EVERY_MS: std::ops::RangeInclusive<u64> = 100..=500;

/// A step size in [`STEP_MS`], log-uniform.
pub fn step_ms(rng: &mut impl rand::Rng) -> u64 {
    let (lo, hi) = (*STEP_MS.start() as f64, *STEP_MS.end() as f64);
    let x = rng.gen_range(lo.ln()..=hi.ln()).exp();
    (x as u64).clamp(*STEP_MS.start(), *STEP_MS.end())
}

/// How a clock fault went, for the results file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClockOutcome {
    pub node: u64,
    /// The offset set when the fault started (the first side of a strobe).
    pub offset_ms: i64,
    /// The node's wall clock against the harness's right after the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_ms: Option<i64>,
    /// Strobe: steps made while the fault held (each to the other side).
    #[serde(skip_serializing_if = "is_zero")]
    pub flips: u64,
    /// The node's wall clock against the harness's after stepping back to the true time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_ms: Option<i64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The node's wall clock minus the harness's, in ms; `None` when it does not answer.
pub async fn measure(http: &Http, node: u64) -> Option<i64> {
    let deadline = Instant::now() + MEASURE_TIMEOUT;
    loop {
        if let Some((status, harness_us)) = http.raft_status(node, Duration::from_secs(2)).await {
            if let Some(wall_us) = status.get("wall_us").and_then(|v| v.as_u64()) {
                return Some((wall_us as i64 - harness_us as i64) / 1000);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Steps `node`'s wall clock to `offset_ms` and checks that it moved there. Returns the
/// measured offset.
pub async fn step<H: Hosts>(
    hosts: &H,
    http: &Http,
    node: u64,
    offset_ms: i64,
) -> anyhow::Result<i64> {
    hosts.set_clock(node, offset_ms)?;
    let measured = measure(http, node).await.ok_or_else(|| {
        anyhow::anyhow!("node {node} does not answer its wall clock (/raft/status)")
    })?;
    if (measured - offset_ms).abs() > TOLERANCE_MS {
        anyhow::bail!(
            "node {node}'s wall clock is {measured} ms from the true time, not {offset_ms} ms: \
             the fake clock did not take"
        );
    }
    Ok(measured)
}

/// `clock-strobe`: until `until`, flips `node`'s clock to the other side (`±amplitude_ms`)
/// every [`STROBE_EVERY_MS`]. Returns how many flips it made and the first error, if any.
pub async fn strobe<H: Hosts>(
    hosts: &H,
    node: u64,
    amplitude_ms: i64,
    until: Instant,
    rng: &mut impl rand::Rng,
) -> (u64, Option<String>) {
    let mut flips = 0;
    let mut side = 1i64;
    loop {
        let wait = Duration::from_millis(rng.gen_range(STROBE_EVERY_MS));
        if Instant::now() + wait >= until {
            tokio::time::sleep_until(until.into()).await;
            return (flips, None);
        }
        tokio::time::sleep(wait).await;
        side = -side;
        if let Err(e) = hosts.set_clock(node, side * amplitude_ms) {
            return (flips, Some(format!("{e:#}")));
        }
        flips += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    #[test]
    fn steps_reach_from_seconds_to_minutes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let steps: Vec<u64> = (0..1000).map(|_| step_ms(&mut rng)).collect();
        assert!(steps.iter().all(|s| STEP_MS.contains(s)));
        // Log-uniform: about a third below 20 s, about a third above 2.5 min.
        let short = steps.iter().filter(|s| **s < 20_000).count();
        let long = steps.iter().filter(|s| **s > 150_000).count();
        assert!((200..450).contains(&short), "{short} short steps");
        assert!((150..400).contains(&long), "{long} long steps");
    }
}
