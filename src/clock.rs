//! The entry clock: the time the leader stamps into every Raft entry.
//!
//! Time in the state machine is the stamp of each entry, clamped so it never goes back
//! (`state::apply_entry`). Whatever a stamp says is permanent: a stamp ten minutes ahead
//! expires every lease with less than ten minutes left and lets retention by age delete records
//! ten minutes early, on every replica. So a stamp must not leap when one node's wall clock
//! does (an NTP step, a bad RTC after a reboot, an operator's `date -s`).
//!
//! The entry clock therefore
//! - advances with this node's monotonic clock, which never jumps;
//! - is pulled toward a *reference* by at most [`MAX_SLEW_PPM`] of the elapsed time (1 %:
//!   10 ms per second), never faster, and never backwards;
//! - takes as reference the median of the wall clocks of the cluster's nodes (this node's own,
//!   and the readings the server takes of its peers every second, each
//!   carried forward by the monotonic time since it was taken), so a jump of any one node's wall
//!   clock, the leader's included, does not move it at all;
//! - starts (on the first stamp of a process) at that reference, once readings of a majority
//!   of the nodes are in ([`EntryClock::is_synced`]); the proposer waits for that, briefly;
//! - never runs behind the applied state's clock ([`EntryClock::raise_to`]): a new leader
//!   continues where the old one left off.
//!
//! Bound: in real time, a lease, a nack delay or a record's age ends at most 1 % (plus the few
//! milliseconds by which the nodes' estimates of the reference differ) earlier than its length
//! says, whatever any single node's wall clock does. A jump of a majority's wall clocks (or of
//! the only node's) is followed at 1 %: ten minutes take about 17 hours to absorb.
//!
//! Each node also watches its own wall clock against its monotonic clock and counts every
//! jump of more than [`JUMP_MS`] (`raftq_clock_jumps_total`, with a warning in the log);
//! `raftq_clock_offset_ms` is how far its wall clock is from the reference.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// Most the entry clock is pulled toward its reference, in millionths of the elapsed time.
pub const MAX_SLEW_PPM: u64 = 10_000;
/// A change of the wall clock against the monotonic clock larger than this is a jump.
pub const JUMP_MS: i64 = 1_000;
/// A peer's reading older than this is no longer used.
pub const READING_MAX_AGE: Duration = Duration::from_secs(5);

/// Microseconds since the Unix epoch by this process's wall clock.
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Where a clock that read `value_us` goes after `elapsed_us` of monotonic time, pulled toward
/// `reference_us` by at most [`MAX_SLEW_PPM`] of the elapsed time. Never less than `value_us`.
pub fn advance(value_us: u64, elapsed_us: u64, reference_us: u64) -> u64 {
    let free = value_us.saturating_add(elapsed_us);
    let max_step = elapsed_us.saturating_mul(MAX_SLEW_PPM) / 1_000_000;
    if reference_us >= free {
        free + (reference_us - free).min(max_step)
    } else {
        free - (free - reference_us).min(max_step)
    }
}

/// The median of `readings` (not empty); of an even number, the lower middle one, so that of
/// two readings the earlier wins (running late is the safe side: leases end late, never early).
pub fn median(readings: &mut [u64]) -> Option<u64> {
    if readings.is_empty() {
        return None;
    }
    readings.sort_unstable();
    Some(readings[(readings.len() - 1) / 2])
}

/// One peer's wall clock as read by this node.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// The peer's wall clock, in µs, at `at` (its answer plus half the round trip).
    wall_us: u64,
    at: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// The last value given out and when (monotonic); `None` before the first stamp.
    last: Option<(u64, Instant)>,
    /// The applied state's clock, in µs: the entry clock never runs behind it.
    floor_us: u64,
    /// Peers' readings by node id.
    readings: BTreeMap<u64, Reading>,
    /// How many nodes the cluster has, this one included (for "a majority has been read").
    nodes: usize,
}

/// This node's entry clock. See the module documentation.
#[derive(Debug)]
pub struct EntryClock {
    own_id: u64,
    state: Mutex<State>,
    synced: Notify,
}

impl EntryClock {
    /// A clock for node `own_id` of a cluster of `nodes` nodes.
    pub fn new(own_id: u64, nodes: usize) -> Self {
        EntryClock {
            own_id,
            state: Mutex::new(State {
                nodes: nodes.max(1),
                ..State::default()
            }),
            synced: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Updates the cluster size (membership changes).
    pub fn set_nodes(&self, nodes: usize) {
        self.lock().nodes = nodes.max(1);
    }

    /// Records peer `id`'s wall clock reading `wall_us`, taken over a round trip that started
    /// at `sent` and ended at `received` (monotonic).
    pub fn record_reading(&self, id: u64, wall_us: u64, sent: Instant, received: Instant) {
        if id == self.own_id {
            return;
        }
        let half_trip = received.saturating_duration_since(sent).as_micros() as u64 / 2;
        let mut st = self.lock();
        st.readings.insert(
            id,
            Reading {
                wall_us: wall_us.saturating_add(half_trip),
                at: received,
            },
        );
        if synced(&st, received) {
            drop(st);
            self.synced.notify_waiters();
        }
    }

    /// The reference at `now`: the median of this node's wall clock and its peers' fresh
    /// readings carried forward.
    fn reference(st: &State, now: Instant, own_wall_us: u64) -> u64 {
        let mut all: Vec<u64> = fresh(st, now)
            .map(|r| {
                r.wall_us
                    .saturating_add(now.saturating_duration_since(r.at).as_micros() as u64)
            })
            .collect();
        all.push(own_wall_us);
        median(&mut all).unwrap_or(own_wall_us)
    }

    /// Whether readings of a majority of the nodes (this one included) are fresh.
    pub fn is_synced(&self) -> bool {
        synced(&self.lock(), Instant::now())
    }

    /// Waits until [`is_synced`](Self::is_synced), at most `max`; says whether it is.
    pub async fn wait_synced(&self, max: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let notified = self.synced.notified();
            if self.is_synced() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_synced();
            }
        }
    }

    /// The entry clock now, in ms since the Unix epoch: what the leader stamps into an entry.
    /// Never less than any stamp before. The first stamp anchors the clock.
    pub fn stamp_ms(&self) -> u64 {
        self.stamp_us_at(Instant::now(), wall_us()) / 1000
    }

    /// What [`stamp_ms`](Self::stamp_ms) would give now, without giving it (so a node that only
    /// asks, to decide whether something is due, never anchors its clock).
    pub fn now_ms(&self) -> u64 {
        let st = self.lock();
        Self::value_at(&st, Instant::now(), wall_us()) / 1000
    }

    fn value_at(st: &State, now: Instant, own_wall_us: u64) -> u64 {
        let reference = Self::reference(st, now, own_wall_us);
        let value = match st.last {
            None => reference,
            Some((value, at)) => advance(
                value,
                now.saturating_duration_since(at).as_micros() as u64,
                reference,
            ),
        }
        .max(st.floor_us);
        st.last.map_or(value, |(last, _)| value.max(last))
    }

    fn stamp_us_at(&self, now: Instant, own_wall_us: u64) -> u64 {
        let mut st = self.lock();
        let value = Self::value_at(&st, now, own_wall_us);
        st.last = Some((value, now));
        value
    }

    /// The applied state's clock reached `clock_ms`: the entry clock does not run behind it
    /// (so a new leader goes on from where the state machine is, rather than freezing time).
    pub fn raise_to(&self, clock_ms: u64) {
        let mut st = self.lock();
        st.floor_us = st.floor_us.max(clock_ms.saturating_mul(1000));
    }

    /// How far this node's wall clock is from the reference, in ms (positive: ahead).
    pub fn offset_ms(&self) -> i64 {
        let st = self.lock();
        let own = wall_us();
        let reference = Self::reference(&st, Instant::now(), own);
        (own as i64 - reference as i64) / 1000
    }
}

fn fresh(st: &State, now: Instant) -> impl Iterator<Item = &Reading> {
    st.readings
        .values()
        .filter(move |r| now.saturating_duration_since(r.at) <= READING_MAX_AGE)
}

fn synced(st: &State, now: Instant) -> bool {
    fresh(st, now).count() + 1 > st.nodes / 2
}

/// Watches this node's wall clock against its monotonic clock: call [`check`](Self::check)
/// now and then; it reports a jump of more than [`JUMP_MS`] since the last call.
#[derive(Debug)]
pub struct JumpDetector {
    last: (u64, Instant),
}

impl Default for JumpDetector {
    fn default() -> Self {
        JumpDetector {
            last: (wall_us(), Instant::now()),
        }
    }
}

impl JumpDetector {
    /// The jump of the wall clock since the last check, in ms, if it is larger than
    /// [`JUMP_MS`] either way.
    pub fn check(&mut self) -> Option<i64> {
        self.check_at(wall_us(), Instant::now())
    }

    fn check_at(&mut self, wall: u64, now: Instant) -> Option<i64> {
        let (last_wall, last_at) = self.last;
        self.last = (wall, now);
        let expected = now.saturating_duration_since(last_at).as_micros() as i64;
        let moved = wall as i64 - last_wall as i64;
        let jump_ms = (moved - expected) / 1000;
        (jump_ms.abs() > JUMP_MS).then_some(jump_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;
    const MINUTE: u64 = 60 * SECOND;

    #[test]
    fn advance_follows_the_monotonic_clock_and_slews_at_most_one_percent() {
        // In step with the reference: moves with elapsed time exactly.
        assert_eq!(
            advance(1_000 * SECOND, SECOND, 1_001 * SECOND),
            1_001 * SECOND
        );
        // The reference leapt ten minutes ahead: one second later, 1 % more than a second.
        assert_eq!(
            advance(1_000 * SECOND, SECOND, 1_000 * SECOND + 10 * MINUTE),
            1_001 * SECOND + SECOND / 100
        );
        // Ten minutes behind: 1 % less, never backwards.
        assert_eq!(
            advance(1_000 * SECOND, SECOND, 1_000 * SECOND - 10 * MINUTE),
            1_001 * SECOND - SECOND / 100
        );
        // A small difference is closed at once.
        assert_eq!(
            advance(1_000 * SECOND, SECOND, 1_001 * SECOND + 2_000),
            1_001 * SECOND + 2_000
        );
        // No time passed: nothing moves, whatever the reference says.
        assert_eq!(advance(5 * SECOND, 0, 50 * MINUTE), 5 * SECOND);
    }

    #[test]
    fn a_ten_minute_jump_is_absorbed_at_one_percent_and_no_faster() {
        let mut value = 0u64;
        let reference_offset = 10 * MINUTE;
        let step = 100_000; // 100 ms between stamps
        let mut real = 0u64;
        while real < 10 * MINUTE {
            real += step;
            value = advance(value, step, real + reference_offset);
            // Never faster than 1.01 times real time.
            assert!(value <= real + real / 100, "{value} after {real}");
        }
        assert_eq!(value, 10 * MINUTE + 6 * SECOND);
    }

    #[test]
    fn the_median_ignores_one_jumped_clock_and_prefers_the_earlier_of_two() {
        assert_eq!(median(&mut [5, 600, 6]), Some(6));
        assert_eq!(median(&mut [600, 5]), Some(5));
        assert_eq!(median(&mut [7]), Some(7));
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [1, 2, 3, 4, 1_000]), Some(3));
    }

    #[test]
    fn a_leader_whose_wall_clock_is_ten_minutes_ahead_stamps_the_clusters_time() {
        let clock = EntryClock::new(1, 3);
        let t0 = Instant::now();
        let real = 1_700_000_000 * SECOND;
        assert!(!synced(&clock.lock(), t0));
        clock.record_reading(2, real, t0, t0);
        clock.record_reading(3, real + 2_000, t0, t0);
        assert!(synced(&clock.lock(), t0));
        // This node's wall clock is ten minutes ahead: the median of the three is node 3's.
        let first = clock.stamp_us_at(t0, real + 10 * MINUTE);
        assert_eq!(first, real + 2_000);
        // A minute of monotonic time later, still the cluster's time.
        let later = t0 + Duration::from_secs(4);
        let stamp = clock.stamp_us_at(later, real + 10 * MINUTE + 4 * SECOND);
        assert_eq!(stamp, real + 2_000 + 4 * SECOND);
    }

    #[test]
    fn stamps_never_go_back_and_never_run_behind_the_applied_clock() {
        let clock = EntryClock::new(1, 1);
        let t0 = Instant::now();
        let a = clock.stamp_us_at(t0, 100 * MINUTE);
        // The wall clock steps back an hour: the stamp keeps going forward.
        let b = clock.stamp_us_at(t0 + Duration::from_millis(10), 40 * MINUTE);
        assert!(b > a, "{b} <= {a}");
        assert!(b - a <= 10_000, "moved {} µs in 10 ms", b - a);
        // The applied state is ahead (another leader's stamps): go on from there.
        clock.raise_to((200 * MINUTE) / 1000);
        let c = clock.stamp_us_at(t0 + Duration::from_millis(20), 40 * MINUTE);
        assert!(c >= 200 * MINUTE);
    }

    #[test]
    fn jumps_are_told_from_the_monotonic_clock() {
        let t0 = Instant::now();
        let mut d = JumpDetector {
            last: (100 * SECOND, t0),
        };
        assert_eq!(d.check_at(101 * SECOND, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            d.check_at(700 * SECOND, t0 + Duration::from_secs(2)),
            Some(598_000)
        );
        assert_eq!(
            d.check_at(640 * SECOND, t0 + Duration::from_secs(3)),
            Some(-61_000)
        );
        assert_eq!(d.check_at(641 * SECOND, t0 + Duration::from_secs(4)), None);
    }
}
