//! Subscriptions: leased pull, ack, nack, extend, expiry, dead letters and the cursor.
//!
//! Every offset at or above a subscription's cursor is fresh (never delivered, at or above
//! `next_fresh`), leased, pending (delivered before and available again, maybe after a delay)
//! or done (acked or dead-lettered). The cursor is the ack floor: it only moves over a
//! contiguous run of done offsets, or when a client moves it explicitly.
//!
//! Leases expire and nack delays end by the entry clock alone: every entry first ends what fell
//! due ([`expire_due`]), using the index `SmState::due` of (time, subscription, offset).
//! "Settle" means one thing here: a client's ack, nack or extend of a receipt
//! ([`settle_receipts`]).

use std::collections::BTreeSet;

use super::ranges::RangeSet;
use super::{
    ApplyError, CommandResult, Outcome, ReadFault, RecordSource, SmState, StoredRecord, Write,
};

mod model;
mod offset_map;
pub use model::*;
pub use offset_map::OffsetMap;

/// Why a dead letter left the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeadReason {
    MaxDeliveries,
    Nack,
}

impl DeadReason {
    fn as_str(self) -> &'static str {
        match self {
            DeadReason::MaxDeliveries => "max_deliveries",
            DeadReason::Nack => "nack",
        }
    }
}

fn not_found(sub: &SubRef) -> ApplyError {
    ApplyError::SubscriptionNotFound(sub.topic.clone(), sub.name.clone())
}

fn find(state: &SmState, sub: &SubRef) -> Result<u64, ApplyError> {
    if !state.topics.contains_key(&sub.topic) {
        return Err(ApplyError::TopicNotFound(sub.topic.clone()));
    }
    state
        .sub_names
        .get(&(sub.topic.clone(), sub.name.clone()))
        .copied()
        .ok_or_else(|| not_found(sub))
}

fn validate_timeout(ms: u64) -> Result<(), ApplyError> {
    if ms == 0 || ms > crate::limits::MAX_ACK_TIMEOUT_MS {
        return Err(ApplyError::InvalidArgument(format!(
            "ack_timeout_ms must be between 1 and {}, not {ms}",
            crate::limits::MAX_ACK_TIMEOUT_MS
        )));
    }
    Ok(())
}

pub(super) fn create(
    state: &mut SmState,
    cmd: &CreateSub,
    writes: &mut Vec<Write>,
) -> CommandResult {
    if !crate::limits::is_valid_name(&cmd.name) {
        return Err(ApplyError::InvalidArgument(format!(
            "invalid subscription name {:?}",
            cmd.name
        )));
    }
    let topic = state
        .topics
        .get(&cmd.topic)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.topic.clone()))?;
    let s = &cmd.settings;
    validate_timeout(s.ack_timeout_ms)?;
    if s.max_deliveries == Some(0) {
        return Err(ApplyError::InvalidArgument(
            "max_deliveries must be at least 1 (omit it for no limit)".into(),
        ));
    }
    if let Some(dlq) = &s.dead_letter_topic {
        if dlq == &cmd.topic {
            return Err(ApplyError::InvalidArgument(
                "dead_letter_topic must be another topic than the subscription's own".into(),
            ));
        }
        if !state.topics.contains_key(dlq) {
            return Err(ApplyError::InvalidArgument(format!(
                "dead_letter_topic {dlq:?} does not exist; create it first"
            )));
        }
    }
    let key = (cmd.topic.clone(), cmd.name.clone());
    if let Some(id) = state.sub_names.get(&key) {
        return if state
            .subs
            .get(id)
            .is_some_and(|sub| sub.settings == cmd.settings)
        {
            Ok(Outcome::SubscriptionExists)
        } else {
            Err(ApplyError::AlreadyExists(format!(
                "{}/{}",
                cmd.topic, cmd.name
            )))
        };
    }
    let cursor = match s.start {
        Start::First => topic.first_offset,
        Start::Next => topic.next_offset,
        Start::Offset(n) if n >= topic.first_offset && n <= topic.next_offset => n,
        Start::Offset(n) => {
            return Err(ApplyError::InvalidArgument(format!(
                "start offset {n} is outside the topic's offsets {}..={}",
                topic.first_offset, topic.next_offset
            )))
        }
    };
    let id = state.next_sub_id;
    state.next_sub_id += 1;
    state.subs.insert(
        id,
        SubState {
            id,
            topic: cmd.topic.clone(),
            name: cmd.name.clone(),
            settings: s.clone(),
            origin: cursor,
            cursor,
            next_fresh: cursor,
            done: RangeSet::default(),
            leases: OffsetMap::default(),
            pending: OffsetMap::default(),
            next_lease_id: 0,
            counters: SubCounters::default(),
        },
    );
    state.sub_names.insert(key, id);
    writes.push(Write::PutSub(id));
    Ok(Outcome::SubscriptionCreated)
}

/// Removes a subscription and its due entries.
pub(super) fn remove(state: &mut SmState, id: u64, writes: &mut Vec<Write>) {
    if let Some(sub) = state.subs.remove(&id) {
        for (offset, lease) in &sub.leases {
            state.due.remove(&(lease.expires_ms, id, *offset));
        }
        for (offset, p) in &sub.pending {
            state.due.remove(&(p.not_before_ms, id, *offset));
        }
        state.sub_names.remove(&(sub.topic, sub.name));
        writes.push(Write::DeleteSub(id));
    }
}

pub(super) fn delete(state: &mut SmState, cmd: &SubRef, writes: &mut Vec<Write>) -> CommandResult {
    let id = find(state, cmd)?;
    remove(state, id, writes);
    Ok(Outcome::SubscriptionDeleted)
}

/// Ends every lease and delay that fell due at `now`. Runs before every entry's commands.
pub(super) fn expire_due(
    state: &mut SmState,
    source: &dyn RecordSource,
    writes: &mut Vec<Write>,
) -> Result<(), ReadFault> {
    let now = state.clock_ms;
    while let Some(&(due, id, offset)) = state.due.first() {
        if due > now {
            break;
        }
        state.due.pop_first();
        let Some(sub) = state.subs.get_mut(&id) else {
            continue;
        };
        match sub.leases.get(&offset) {
            Some(lease) if lease.expires_ms == due => {
                let lease = lease.clone();
                sub.leases.remove(&offset);
                sub.counters.expired_leases += 1;
                fail_delivery(
                    state,
                    source,
                    writes,
                    id,
                    offset,
                    lease.delivery_count,
                    Some(lease.lease_id),
                    due,
                )?;
            }
            // A nack delay ended: the record is available now; nothing to change, but the
            // entry that got here woke every waiting pull.
            _ => {}
        }
        writes.push(Write::PutSub(id));
    }
    Ok(())
}

/// A delivery ended without an ack (expired or nacked): the record becomes available again
/// from `not_before_ms`, or is dead-lettered once it reached `max_deliveries`.
#[allow(clippy::too_many_arguments)]
fn fail_delivery(
    state: &mut SmState,
    source: &dyn RecordSource,
    writes: &mut Vec<Write>,
    id: u64,
    offset: u64,
    delivery_count: u32,
    lease_id: Option<u64>,
    not_before_ms: u64,
) -> Result<ReceiptOutcome, ReadFault> {
    let Some(sub) = state.subs.get_mut(&id) else {
        return Ok(ReceiptOutcome::Stale);
    };
    if sub
        .settings
        .max_deliveries
        .is_some_and(|max| delivery_count >= max)
    {
        dead_letter(
            state,
            source,
            writes,
            id,
            offset,
            DeadReason::MaxDeliveries,
            delivery_count,
        )?;
        return Ok(ReceiptOutcome::DeadLettered);
    }
    sub.pending.insert(
        offset,
        Pending {
            delivery_count,
            not_before_ms,
            last_lease_id: lease_id,
        },
    );
    if not_before_ms > state.clock_ms {
        state.due.insert((not_before_ms, id, offset));
    }
    Ok(ReceiptOutcome::Released)
}

/// Marks `offset` done and appends the record to the dead-letter topic (or counts it
/// discarded when there is none).
#[allow(clippy::too_many_arguments)]
fn dead_letter(
    state: &mut SmState,
    source: &dyn RecordSource,
    writes: &mut Vec<Write>,
    id: u64,
    offset: u64,
    reason: DeadReason,
    delivery_count: u32,
) -> Result<(), ReadFault> {
    let clock = state.clock_ms;
    let Some(sub) = state.subs.get_mut(&id) else {
        return Ok(());
    };
    sub.done.insert(offset);
    sub.advance_cursor();
    let origin_topic = sub.topic.clone();
    let origin_topic_name = origin_topic.clone();
    let sub_name = sub.name.clone();
    let dlq = sub.settings.dead_letter_topic.clone();
    let origin_id = state.topics.get(&origin_topic).map(|t| t.id);
    let dlq = dlq.filter(|d| state.topics.contains_key(d));
    // Read only when there is somewhere to copy it to. The record lies at or above the
    // subscription's cursor, so its topic still holds it: missing is a storage fault.
    let record = match (&dlq, origin_id) {
        (Some(_), Some(tid)) => Some(super::existing_record(source, writes, tid, offset)?),
        _ => None,
    };
    let target = dlq.and_then(|d| state.topics.get_mut(&d).map(|meta| (d, meta)));
    let appended = match (target, record) {
        (Some((dlq, meta)), Some(original)) => {
            let mut headers = original.headers;
            headers.retain(|(k, _)| !k.starts_with("raftq-dead-letter-"));
            headers.push(("raftq-dead-letter-topic".into(), origin_topic));
            headers.push(("raftq-dead-letter-offset".into(), offset.to_string()));
            headers.push(("raftq-dead-letter-subscription".into(), sub_name));
            headers.push(("raftq-dead-letter-reason".into(), reason.as_str().into()));
            headers.push((
                "raftq-dead-letter-delivery-count".into(),
                delivery_count.to_string(),
            ));
            let record = StoredRecord {
                timestamp_ms: clock,
                key: original.key,
                headers,
                value: original.value,
            };
            let size = super::stored_size(&record);
            super::publish::append(meta, super::Appended::Whole(record), size, writes);
            writes.push(Write::PutTopic(dlq));
            true
        }
        _ => false,
    };
    let Some(sub) = state.subs.get_mut(&id) else {
        return Ok(());
    };
    match (appended, reason) {
        (true, _) => sub.counters.dead_lettered += 1,
        (false, DeadReason::MaxDeliveries) => sub.counters.discarded_max_deliveries += 1,
        (false, DeadReason::Nack) => sub.counters.discarded_rejected += 1,
    }
    if !appended {
        if let Some(meta) = state.topics.get_mut(&origin_topic_name) {
            match reason {
                DeadReason::MaxDeliveries => meta.counters.discarded_max_deliveries += 1,
                DeadReason::Nack => meta.counters.discarded_rejected += 1,
            }
            writes.push(Write::PutTopic(origin_topic_name));
        }
    }
    Ok(())
}

pub(super) fn pull(state: &mut SmState, cmd: &Pull, writes: &mut Vec<Write>) -> CommandResult {
    let id = find(state, &cmd.sub)?;
    if cmd.max == 0 || cmd.max > crate::limits::MAX_PULL {
        return Err(ApplyError::InvalidArgument(format!(
            "max must be between 1 and {}",
            crate::limits::MAX_PULL
        )));
    }
    if let Some(ms) = cmd.ack_timeout_ms {
        validate_timeout(ms)?;
    }
    let now = state.clock_ms;
    let high_watermark = state
        .topics
        .get(&cmd.sub.topic)
        .map_or(0, |t| t.next_offset);
    let sub = state.subs.get_mut(&id).ok_or_else(|| not_found(&cmd.sub))?;
    let timeout = cmd.ack_timeout_ms.unwrap_or(sub.settings.ack_timeout_ms);
    let expires_ms = now.saturating_add(timeout);
    // Records available again come first (they are all below next_fresh), in offset order.
    let mut chosen: Vec<(u64, u32)> = sub
        .pending
        .iter()
        .filter(|(_, p)| p.not_before_ms <= now)
        .take(cmd.max as usize)
        .map(|(offset, p)| (*offset, p.delivery_count + 1))
        .collect();
    for (offset, _) in &chosen {
        sub.pending.remove(offset);
    }
    while chosen.len() < cmd.max as usize && sub.next_fresh < high_watermark {
        if !sub.done.contains(sub.next_fresh) {
            chosen.push((sub.next_fresh, 1));
        }
        sub.next_fresh += 1;
    }
    let mut deliveries = Vec::with_capacity(chosen.len());
    for (offset, delivery_count) in chosen {
        let lease_id = sub.next_lease_id;
        sub.next_lease_id += 1;
        sub.leases.insert(
            offset,
            Lease {
                lease_id,
                delivery_count,
                expires_ms,
            },
        );
        state.due.insert((expires_ms, id, offset));
        sub.counters.delivered += 1;
        if delivery_count > 1 {
            sub.counters.redelivered += 1;
        }
        deliveries.push(Delivery {
            receipt: Receipt {
                sub_id: id,
                offset,
                lease_id,
            },
            delivery_count,
            expires_ms,
        });
    }
    if !deliveries.is_empty() {
        writes.push(Write::PutSub(id));
    }
    Ok(Outcome::Pulled(deliveries))
}

/// Which delivery a receipt names, if it is still live: its delivery count and lease id, and
/// whether it is still leased (or its lease expired and it was not delivered again).
struct Live {
    delivery_count: u32,
    lease_id: u64,
    leased_until: Option<u64>,
    not_before_ms: u64,
}

fn live(sub: &SubState, r: &Receipt) -> Option<Live> {
    if r.sub_id != sub.id {
        return None;
    }
    if let Some(lease) = sub.leases.get(&r.offset) {
        return (lease.lease_id == r.lease_id).then_some(Live {
            delivery_count: lease.delivery_count,
            lease_id: lease.lease_id,
            leased_until: Some(lease.expires_ms),
            not_before_ms: 0,
        });
    }
    let p = sub.pending.get(&r.offset)?;
    (p.last_lease_id == Some(r.lease_id)).then_some(Live {
        delivery_count: p.delivery_count,
        lease_id: r.lease_id,
        leased_until: None,
        not_before_ms: p.not_before_ms,
    })
}

pub(super) fn settle_receipts(
    state: &mut SmState,
    source: &dyn RecordSource,
    cmd: &SettleReceipts,
    writes: &mut Vec<Write>,
) -> Result<CommandResult, ReadFault> {
    let id = match find(state, &cmd.sub) {
        Ok(id) => id,
        Err(refused) => return Ok(Err(refused)),
    };
    match &cmd.action {
        ReceiptAction::Nack { delay_ms, .. } if *delay_ms > crate::limits::MAX_NACK_DELAY_MS => {
            return Ok(Err(ApplyError::InvalidArgument(format!(
                "delay_ms must be at most {}",
                crate::limits::MAX_NACK_DELAY_MS
            ))))
        }
        ReceiptAction::Extend {
            ack_timeout_ms: Some(ms),
        } => {
            if let Err(refused) = validate_timeout(*ms) {
                return Ok(Err(refused));
            }
        }
        _ => {}
    }
    let now = state.clock_ms;
    let mut results = Vec::with_capacity(cmd.receipts.len());
    for r in &cmd.receipts {
        let Some(sub) = state.subs.get_mut(&id) else {
            return Ok(Err(not_found(&cmd.sub)));
        };
        let Some(delivery) = live(sub, r) else {
            results.push(ReceiptOutcome::Stale);
            continue;
        };
        // The delivery ends here (extend starts a new lease for it below).
        let (delivery_count, lease_id) = (delivery.delivery_count, delivery.lease_id);
        match delivery.leased_until {
            Some(expires) => {
                sub.leases.remove(&r.offset);
                state.due.remove(&(expires, id, r.offset));
            }
            None => {
                sub.pending.remove(&r.offset);
                state.due.remove(&(delivery.not_before_ms, id, r.offset));
            }
        }
        let outcome = match &cmd.action {
            ReceiptAction::Ack => {
                sub.done.insert(r.offset);
                sub.advance_cursor();
                sub.counters.acked += 1;
                ReceiptOutcome::Acked
            }
            ReceiptAction::Extend { ack_timeout_ms } => {
                let expires_ms =
                    now.saturating_add(ack_timeout_ms.unwrap_or(sub.settings.ack_timeout_ms));
                sub.leases.insert(
                    r.offset,
                    Lease {
                        lease_id,
                        delivery_count,
                        expires_ms,
                    },
                );
                state.due.insert((expires_ms, id, r.offset));
                ReceiptOutcome::Extended { expires_ms }
            }
            ReceiptAction::Nack {
                dead_letter: true, ..
            } => {
                dead_letter(
                    state,
                    source,
                    writes,
                    id,
                    r.offset,
                    DeadReason::Nack,
                    delivery_count,
                )?;
                ReceiptOutcome::DeadLettered
            }
            ReceiptAction::Nack { delay_ms, .. } => fail_delivery(
                state,
                source,
                writes,
                id,
                r.offset,
                delivery_count,
                None,
                now.saturating_add(*delay_ms),
            )?,
        };
        results.push(outcome);
    }
    writes.push(Write::PutSub(id));
    Ok(Ok(Outcome::Receipts(results)))
}

pub(super) fn set_cursor(
    state: &mut SmState,
    cmd: &SetCursor,
    writes: &mut Vec<Write>,
) -> CommandResult {
    let id = find(state, &cmd.sub)?;
    let topic = state
        .topics
        .get(&cmd.sub.topic)
        .ok_or_else(|| ApplyError::TopicNotFound(cmd.sub.topic.clone()))?;
    let (first, high_watermark) = (topic.first_offset, topic.next_offset);
    let sub = state.subs.get_mut(&id).ok_or_else(|| not_found(&cmd.sub))?;
    let target = cmd.offset;
    if target == sub.cursor || (cmd.forward_only && target < sub.cursor) {
        return Ok(Outcome::CursorSet(sub.cursor));
    }
    if target > high_watermark {
        return Err(ApplyError::InvalidArgument(format!(
            "offset {target} is beyond the topic's next offset {high_watermark}"
        )));
    }
    if target < sub.cursor && !cmd.allow_backward {
        return Err(ApplyError::InvalidArgument(format!(
            "offset {target} is below the cursor {}; set allow_backward to move it back",
            sub.cursor
        )));
    }
    if target < first {
        return Err(ApplyError::InvalidArgument(format!(
            "offset {target} is below the topic's first offset {first}"
        )));
    }
    // A seek: forget what the move passes over (and, backward, everything).
    let backward = target < sub.cursor;
    if backward {
        // Everything from the target up was accounted for (done below the cursor, done,
        // leased or backlog above it); from now on it is backlog again, so the offsets that
        // were done count a second time.
        sub.counters.rewound += (sub.cursor - target) + sub.done.len();
    } else {
        // Offsets passed over that were not done are skipped.
        let done_passed = sub.done.count_below(target);
        sub.counters.skipped += (target - sub.cursor) - done_passed;
    }
    forget_below(sub, &mut state.due, id, (!backward).then_some(target));
    if backward {
        sub.done.clear();
        sub.next_fresh = target;
    } else {
        sub.done.remove_below(target);
        sub.next_fresh = sub.next_fresh.max(target);
    }
    sub.cursor = target;
    sub.advance_cursor();
    writes.push(Write::PutSub(id));
    Ok(Outcome::CursorSet(sub.cursor))
}

/// Retention removed every record below `first`: a subscription whose cursor is below it moves
/// up, counting what it had not finished there as discarded for retention, and forgetting the
/// leases and redeliveries of removed records.
pub(super) fn trim(state: &mut SmState, id: u64, first: u64, writes: &mut Vec<Write>) {
    let Some(sub) = state.subs.get_mut(&id) else {
        return;
    };
    if sub.cursor >= first {
        return;
    }
    let done_passed = sub.done.count_below(first);
    sub.counters.discarded_retention += (first - sub.cursor) - done_passed;
    forget_below(sub, &mut state.due, id, Some(first));
    sub.done.remove_below(first);
    sub.cursor = first;
    sub.next_fresh = sub.next_fresh.max(first);
    sub.advance_cursor();
    writes.push(Write::PutSub(id));
}

/// Forgets the leases and pending redeliveries of subscription `id` (`sub`) below `bound`
/// (every one when `None`), and their entries in the due index `due`.
fn forget_below(
    sub: &mut SubState,
    due: &mut BTreeSet<(u64, u64, u64)>,
    id: u64,
    bound: Option<u64>,
) {
    fn drop_below<V>(
        map: &mut OffsetMap<V>,
        due: &mut BTreeSet<(u64, u64, u64)>,
        id: u64,
        bound: Option<u64>,
        due_ms: impl Fn(&V) -> u64,
    ) {
        for (offset, v) in map.remove_below(bound) {
            due.remove(&(due_ms(&v), id, offset));
        }
    }
    drop_below(&mut sub.leases, due, id, bound, |l| l.expires_ms);
    drop_below(&mut sub.pending, due, id, bound, |p| p.not_before_ms);
}
