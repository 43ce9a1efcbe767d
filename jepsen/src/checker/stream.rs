//! The stream checker: publish, read with subscriptions, cursors (CHECKERS.md, "Stream
//! workload"), after Jepsen's Kafka queue workload.
//!
//! Per topic, offset -> values is built from every `ok` [`Op::Read`], every `ok`
//! [`Op::FinalRead`] and every `ok` [`Op::Publish`] (its values at its offsets, in order).
//! (`info` reads carry no answer, so there is nothing to take from them.)
//!
//! | anomaly | definition | makes the history invalid |
//! |---|---|---|
//! | `inconsistent_offsets` | one offset holds two different values | yes |
//! | `duplicates` | one value at two offsets, explained: it was published by two or more attempts, one of them `info`, none with idempotency data | no |
//! | `unexplained_duplicates` | one value at two offsets otherwise | yes |
//! | `lost` | a value acknowledged and never seen by any `ok` read or final read, when either its offset is <= h, the highest offset any `ok` (non-final) read returned, or its topic had an `ok` final read (after the final read through every node, unseen is loss) | yes |
//! | `unseen` | a value acknowledged, never seen by any `ok` read or final read (includes the lost ones) | no (`lost` decides) |
//! | `poll_skip` | per (process, topic, subscription), a read started past where the previous `ok` read ended (or a read's records have a gap, or its `next_offset` jumps past its last record) | yes |
//! | `nonmonotonic_poll` | the same, but going backwards | yes |
//! | `nonmonotonic_send` | a process's later `ok` publish to a topic landed at a lower offset than its earlier one (or a batch's offsets do not increase) | yes |
//! | `cursor_backward` | a subscription's server-reported cursor was lower than one reported by an op that completed before this op was invoked, with no `allow_backward` move in between | yes |
//! | `divergence` | the final reads of a topic through different nodes differ (count: nodes that differ from the longest) | yes |
//!
//! Where a read is expected to start: at its `from` when it has one (a `from` other than the
//! previous end is the process moving the cursor explicitly, not an anomaly); without `from`
//! but with a subscription, where the process's previous `ok` read of that subscription ended
//! (its last record + 1, or its `next_offset` when empty) or where the process's last `ok`
//! [`Op::SetCursor`] put the cursor; without either, anywhere. `skipped` (retention) excuses a
//! gap of that size. The poll checks assume each subscription is read from its cursor by one
//! process at a time; readers that pass `from` are checked whatever they share.
//!
//! Cursor moves with `allow_backward` that end `info` (or never) switch the cursor check off
//! for that subscription from their invoke on: they may take effect at any later time.
//!
//! Where the cursors come from: the cursor of an `ok` [`Op::SetCursor`] answer (the stream
//! workload probes after every read with a forward-only move to where the read started, whose
//! answer is the committed cursor) and a [`OpResult::Read`]'s `cursor` when a reader recorded
//! one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::{Anomaly, Finding, Verdict};
use crate::history::{op_counts, pairs, Event, Kind, Op, OpCounts, OpResult, Process};

/// What the stream checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    /// No anomaly that must not happen happened.
    pub valid: bool,
    /// Client operations by outcome.
    pub counts: OpCounts,
    /// Distinct values acknowledged (`ok` publishes).
    pub acknowledged: u64,
    /// Distinct values seen by `ok` reads and final reads.
    pub seen: u64,
    /// `ok` final reads.
    pub final_reads: u64,
    /// Per topic: the highest offset an `ok` non-final read returned.
    pub highest_read: BTreeMap<String, u64>,
    pub inconsistent_offsets: Anomaly,
    pub duplicates: Anomaly,
    pub unexplained_duplicates: Anomaly,
    pub lost: Anomaly,
    pub unseen: Anomaly,
    pub poll_skip: Anomaly,
    pub nonmonotonic_poll: Anomaly,
    pub nonmonotonic_send: Anomaly,
    pub cursor_backward: Anomaly,
    pub divergence: Anomaly,
}

impl StreamReport {
    fn table(&self) -> [(&'static str, &Anomaly, bool); 10] {
        [
            ("inconsistent_offsets", &self.inconsistent_offsets, true),
            ("duplicates", &self.duplicates, false),
            ("unexplained_duplicates", &self.unexplained_duplicates, true),
            ("lost", &self.lost, true),
            ("unseen", &self.unseen, false),
            ("poll_skip", &self.poll_skip, true),
            ("nonmonotonic_poll", &self.nonmonotonic_poll, true),
            ("nonmonotonic_send", &self.nonmonotonic_send, true),
            ("cursor_backward", &self.cursor_backward, true),
            ("divergence", &self.divergence, true),
        ]
    }

    /// The one-line summary for a results table.
    pub fn verdict(&self, scenario: &str) -> Verdict {
        Verdict::new("stream", scenario, self.counts, &self.table())
    }
}

#[derive(Default)]
struct PublishInfo {
    attempts: u32,
    any_info: bool,
    any_idempotent: bool,
    invokes: Vec<u64>,
    /// Offset assigned by an ok publish, and that completion's index.
    acked_at: Option<(u64, u64)>,
}

/// offset -> value -> the events that put it there.
type OffsetMap = BTreeMap<u64, BTreeMap<String, Vec<u64>>>;
/// A final read: its completion's index and its records.
type FinalRead = (u64, Vec<(u64, String)>);

/// Judges a stream-workload history.
pub fn check(events: &[Event]) -> StreamReport {
    let pairs = pairs(events);
    let mut report = StreamReport {
        counts: op_counts(events),
        ..StreamReport::default()
    };

    // topic -> offset -> value -> events that say so.
    let mut at_offset: BTreeMap<String, OffsetMap> = BTreeMap::new();
    let mut publishes: BTreeMap<(String, String), PublishInfo> = BTreeMap::new();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    // topic -> node -> (completion index, records) of its last ok final read.
    let mut finals: BTreeMap<String, BTreeMap<u64, FinalRead>> = BTreeMap::new();

    let mut note = |topic: &str, offset: u64, value: &str, event: u64| {
        at_offset
            .entry(topic.to_string())
            .or_default()
            .entry(offset)
            .or_default()
            .entry(value.to_string())
            .or_default()
            .push(event);
    };

    for pair in &pairs {
        match (pair.op(), pair.result()) {
            (
                Op::Publish {
                    topic,
                    values,
                    producer_id,
                    ..
                },
                result,
            ) => {
                let offsets = match result {
                    Some(OpResult::Publish { offsets, .. }) => Some(offsets),
                    _ => None,
                };
                for (i, value) in values.iter().enumerate() {
                    let info = publishes.entry((topic.clone(), value.clone())).or_default();
                    info.attempts += 1;
                    info.any_info |= pair.outcome() == Kind::Info;
                    info.any_idempotent |= producer_id.is_some();
                    info.invokes.push(pair.invoke_index());
                    if let Some(&offset) = offsets.and_then(|o| o.get(i)) {
                        info.acked_at.get_or_insert((offset, pair.complete_index()));
                        note(topic, offset, value, pair.complete_index());
                    }
                }
            }
            (Op::Read { topic, .. }, Some(OpResult::Read { records, .. })) => {
                for (offset, value) in records {
                    note(topic, *offset, value, pair.complete_index());
                    seen.insert((topic.clone(), value.clone()));
                    let h = report.highest_read.entry(topic.clone()).or_insert(*offset);
                    *h = (*h).max(*offset);
                }
            }
            (Op::FinalRead { topic, node }, Some(OpResult::Records { records })) => {
                report.final_reads += 1;
                for (offset, value) in records {
                    note(topic, *offset, value, pair.complete_index());
                    seen.insert((topic.clone(), value.clone()));
                }
                finals
                    .entry(topic.clone())
                    .or_default()
                    .insert(*node, (pair.complete_index(), records.clone()));
            }
            _ => {}
        }
    }

    // inconsistent offsets, duplicates.
    let mut offsets_of: BTreeMap<(String, String), BTreeMap<u64, Vec<u64>>> = BTreeMap::new();
    for (topic, offsets) in &at_offset {
        for (offset, values) in offsets {
            if values.len() > 1 {
                report.inconsistent_offsets.push(Finding {
                    topic: topic.clone(),
                    offset: Some(*offset),
                    events: values.values().flatten().copied().collect(),
                    detail: format!(
                        "offset {offset} holds {} values: {}",
                        values.len(),
                        values.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                    ..Finding::default()
                });
            }
            for (value, evs) in values {
                offsets_of
                    .entry((topic.clone(), value.clone()))
                    .or_default()
                    .insert(*offset, evs.clone());
            }
        }
    }
    for ((topic, value), offsets) in &offsets_of {
        if offsets.len() < 2 {
            continue;
        }
        let info = publishes.get(&(topic.clone(), value.clone()));
        let explained = info.is_some_and(|i| i.attempts >= 2 && i.any_info && !i.any_idempotent);
        let finding = Finding {
            topic: topic.clone(),
            value: Some(value.clone()),
            offset: offsets.keys().next().copied(),
            events: offsets.values().flatten().copied().collect(),
            detail: format!(
                "value at offsets {}{}",
                offsets
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                if explained {
                    " (publish retried after info without idempotency data)"
                } else {
                    ""
                }
            ),
            ..Finding::default()
        };
        if explained {
            report.duplicates.push(finding);
        } else {
            report.unexplained_duplicates.push(finding);
        }
    }

    // lost, unseen.
    for ((topic, value), info) in &publishes {
        let Some((offset, complete)) = info.acked_at else {
            continue;
        };
        report.acknowledged += 1;
        if seen.contains(&(topic.clone(), value.clone())) {
            continue;
        }
        let finding = |detail: String| Finding {
            topic: topic.clone(),
            value: Some(value.clone()),
            offset: Some(offset),
            events: vec![complete],
            detail,
            ..Finding::default()
        };
        let had_final = finals.contains_key(topic);
        let h = report.highest_read.get(topic).copied();
        if h.is_some_and(|h| offset <= h) {
            report.lost.push(finding(format!(
                "acknowledged at offset {offset}, reads reached offset {}, never seen",
                h.unwrap_or_default()
            )));
        } else if had_final {
            report.lost.push(finding(format!(
                "acknowledged at offset {offset}, missing from the final reads through every node"
            )));
        }
        report.unseen.push(finding(format!(
            "acknowledged at offset {offset}, never read{}",
            if had_final {
                " (not even by the final reads)"
            } else {
                ""
            }
        )));
    }
    report.seen = seen.len() as u64;

    check_polls(&pairs, &mut report);
    check_sends(&pairs, &mut report);
    check_cursors(&pairs, &mut report);

    // divergence.
    for (topic, by_node) in &finals {
        let Some((&ref_node, (ref_event, reference))) = by_node
            .iter()
            .max_by_key(|(node, (_, records))| (records.len(), std::cmp::Reverse(**node)))
        else {
            continue;
        };
        for (&node, (event, records)) in by_node {
            if node == ref_node || records == reference {
                continue;
            }
            let first_diff = records
                .iter()
                .zip(reference.iter())
                .position(|(a, b)| a != b);
            let detail = match first_diff {
                Some(i) => format!(
                    "node {node} has {:?} where node {ref_node} has {:?}",
                    records[i], reference[i]
                ),
                None => format!(
                    "node {node} has {} records, node {ref_node} has {}",
                    records.len(),
                    reference.len()
                ),
            };
            report.divergence.push(Finding {
                topic: topic.clone(),
                offset: first_diff
                    .map(|i| records[i].0)
                    .or_else(|| reference.get(records.len()).map(|r| r.0)),
                events: vec![*ref_event, *event],
                detail,
                ..Finding::default()
            });
        }
    }

    report.valid = report
        .table()
        .iter()
        .all(|(_, a, fatal)| !*fatal || a.is_empty());
    report
}

fn check_polls(pairs: &[crate::history::Pair<'_>], report: &mut StreamReport) {
    // (process, topic, subscription) -> where the previous read ended, and that event.
    let mut end: HashMap<(Process, String, Option<String>), (u64, u64)> = HashMap::new();
    for pair in pairs {
        match (pair.op(), pair.result()) {
            (
                Op::SetCursor {
                    topic,
                    subscription,
                    ..
                },
                Some(OpResult::Cursor { cursor }),
            ) => {
                end.insert(
                    (pair.process(), topic.clone(), Some(subscription.clone())),
                    (*cursor, pair.complete_index()),
                );
            }
            (
                Op::Read {
                    topic,
                    subscription,
                    from,
                },
                Some(OpResult::Read {
                    records,
                    next_offset,
                    skipped,
                    ..
                }),
            ) => {
                let key = (pair.process(), topic.clone(), subscription.clone());
                let prev = end.get(&key).copied();
                let expected = from
                    .map(|f| (f, None))
                    .or_else(|| subscription.as_ref().and(prev).map(|(e, ev)| (e, Some(ev))));
                let me = pair.complete_index();
                let finding = |offset: u64, events: Vec<u64>, detail: String| Finding {
                    topic: topic.clone(),
                    subscription: subscription.clone(),
                    offset: Some(offset),
                    events,
                    detail,
                    ..Finding::default()
                };
                let evs = |prev_ev: Option<u64>| prev_ev.into_iter().chain([me]).collect();
                if let Some((e, prev_ev)) = expected {
                    let start = records.first().map_or(*next_offset, |r| r.0);
                    if start > e + skipped {
                        report.poll_skip.push(finding(
                            e,
                            evs(prev_ev),
                            format!(
                                "expected to start at {e}, started at {start} (skipped {skipped})"
                            ),
                        ));
                    } else if start < e {
                        report.nonmonotonic_poll.push(finding(
                            start,
                            evs(prev_ev),
                            format!("expected to start at {e}, started at {start}"),
                        ));
                    }
                }
                for w in records.windows(2) {
                    let (a, b) = (w[0].0, w[1].0);
                    if b > a + 1 {
                        report.poll_skip.push(finding(
                            a + 1,
                            vec![me],
                            format!("offsets {a} then {b} within one read"),
                        ));
                    } else if b <= a {
                        report.nonmonotonic_poll.push(finding(
                            b,
                            vec![me],
                            format!("offsets {a} then {b} within one read"),
                        ));
                    }
                }
                let read_end = match records.last() {
                    Some(&(last, _)) => {
                        if *next_offset > last + 1 {
                            report.poll_skip.push(finding(
                                last + 1,
                                vec![me],
                                format!("last record {last}, next_offset {next_offset}"),
                            ));
                        } else if *next_offset <= last {
                            report.nonmonotonic_poll.push(finding(
                                *next_offset,
                                vec![me],
                                format!("last record {last}, next_offset {next_offset}"),
                            ));
                        }
                        last + 1
                    }
                    None => *next_offset,
                };
                end.insert(key, (read_end, me));
            }
            _ => {}
        }
    }
}

fn check_sends(pairs: &[crate::history::Pair<'_>], report: &mut StreamReport) {
    // (process, topic) -> highest offset so far and that event.
    let mut high: HashMap<(Process, String), (u64, u64)> = HashMap::new();
    for pair in pairs {
        let (Op::Publish { topic, .. }, Some(OpResult::Publish { offsets, .. })) =
            (pair.op(), pair.result())
        else {
            continue;
        };
        let me = pair.complete_index();
        let finding = |offset: u64, events: Vec<u64>, detail: String| Finding {
            topic: topic.clone(),
            offset: Some(offset),
            events,
            detail,
            ..Finding::default()
        };
        for w in offsets.windows(2) {
            if w[1] <= w[0] {
                report.nonmonotonic_send.push(finding(
                    w[1],
                    vec![me],
                    format!("offsets {} then {} within one batch", w[0], w[1]),
                ));
            }
        }
        let key = (pair.process(), topic.clone());
        if let (Some(&first), Some(&(h, ev))) = (offsets.first(), high.get(&key)) {
            if first <= h {
                report.nonmonotonic_send.push(finding(
                    first,
                    vec![ev, me],
                    format!("earlier publish reached offset {h}, this one landed at {first}"),
                ));
            }
        }
        if let Some(&max) = offsets.iter().max() {
            let entry = high.entry(key).or_insert((max, me));
            if max >= entry.0 {
                *entry = (max, me);
            }
        }
    }
}

fn check_cursors(pairs: &[crate::history::Pair<'_>], report: &mut StreamReport) {
    #[derive(Default)]
    struct SubState {
        /// Highest cursor reported by a completed op (cursor, completion index).
        floor: Option<(u64, u64)>,
        /// Backward moves in flight: while any is, completions do not raise the floor.
        seeking: u32,
        /// A backward move ended info (or never): it may take effect at any time.
        disabled: bool,
    }
    let sub_of = |op: &Op| -> Option<(String, String)> {
        match op {
            Op::Read {
                topic,
                subscription: Some(s),
                ..
            }
            | Op::SetCursor {
                topic,
                subscription: s,
                ..
            } => Some((topic.clone(), s.clone())),
            _ => None,
        }
    };
    let is_backward = |op: &Op| {
        matches!(
            op,
            Op::SetCursor {
                allow_backward: true,
                ..
            }
        )
    };
    // (event index, pair position, is invoke), in history order.
    let mut steps: Vec<(u64, usize, bool)> = Vec::new();
    for (i, pair) in pairs.iter().enumerate() {
        if sub_of(pair.op()).is_none() {
            continue;
        }
        steps.push((pair.invoke_index(), i, true));
        if let Some(c) = pair.completion {
            steps.push((c.index, i, false));
        }
    }
    steps.sort_unstable();

    let mut subs: HashMap<(String, String), SubState> = HashMap::new();
    // pair position -> the floor when it was invoked (None: no constraint).
    let mut floor_at_invoke: HashMap<usize, Option<(u64, u64)>> = HashMap::new();
    for (_, i, invoke) in steps {
        let pair = &pairs[i];
        let key = sub_of(pair.op()).expect("filtered above");
        let state = subs.entry(key.clone()).or_default();
        if invoke {
            if is_backward(pair.op()) {
                match pair.outcome() {
                    Kind::Ok | Kind::Fail => state.seeking += 1,
                    _ => state.disabled = true,
                }
                state.floor = None;
                // Everything in flight may now legitimately see a lower cursor.
                for (j, f) in floor_at_invoke.iter_mut() {
                    if sub_of(pairs[*j].op()).as_ref() == Some(&key) {
                        *f = None;
                    }
                }
                floor_at_invoke.insert(i, None);
            } else {
                floor_at_invoke.insert(i, if state.seeking > 0 { None } else { state.floor });
            }
            continue;
        }
        let invoked_floor = floor_at_invoke.remove(&i).flatten();
        if is_backward(pair.op()) {
            state.seeking = state.seeking.saturating_sub(1);
        }
        let cursor = match pair.result() {
            Some(OpResult::Read {
                cursor: Some(c), ..
            }) => *c,
            Some(OpResult::Cursor { cursor }) => *cursor,
            _ => continue,
        };
        let me = pair.complete_index();
        if state.disabled {
            continue;
        }
        if let Some((floor, floor_event)) = invoked_floor {
            if cursor < floor {
                report.cursor_backward.push(Finding {
                    topic: key.0.clone(),
                    subscription: Some(key.1.clone()),
                    offset: Some(cursor),
                    events: vec![floor_event, me],
                    detail: format!(
                        "cursor {floor} reported (event {floor_event}) before this op began, \
                         then {cursor} (node {:?})",
                        pair.completion.and_then(|c| c.node)
                    ),
                    ..Finding::default()
                });
            }
        }
        if is_backward(pair.op()) {
            if state.seeking == 0 {
                state.floor = Some((cursor, me));
            }
        } else if state.seeking == 0 && state.floor.is_none_or(|(f, _)| cursor > f) {
            state.floor = Some((cursor, me));
        }
    }
}

#[cfg(test)]
mod tests;
