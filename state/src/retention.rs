//! Retention: removing records from the front of a topic, decided by log entries only.
//!
//! After the commands of every entry, each topic with a limit is checked at the entry's clock:
//! - `max_records`: at most this many records stay;
//! - `max_bytes`: the stored bytes (as [`super::record_size`] counts them) stay at or below it;
//! - `max_age_ms`: records whose timestamp is at least this old are removed;
//! - `until_acked`: records below the cursor of every subscription of the topic are removed
//!   (a topic without subscriptions keeps its records: nobody has consumed them).
//!
//! The new first offset is the highest any rule asks for. Records are removed from the front
//! only, by one range delete in storage. A subscription whose cursor is below the new first
//! offset moves up to it; what it had not finished there is counted as discarded for
//! retention (per subscription and per topic), never silently skipped. Leases and pending
//! redeliveries of removed records end with them.
//!
//! Timestamps never decrease along a topic (the entry clock never does), so the age rule
//! looks only at the first record, whose timestamp the topic keeps in memory; the leader
//! ticks when it falls due ([`SmState::next_due`]).

use super::{ReadFault, RecordSource, SmState, Write};

/// What the age rule needs: the time the first record becomes too old.
pub fn age_due(meta: &super::TopicMeta) -> Option<u64> {
    let max_age = meta.settings.max_age_ms?;
    if meta.records() == 0 {
        return None;
    }
    Some(meta.first_timestamp_ms.saturating_add(max_age))
}

/// Applies every topic's retention at the current clock.
pub(super) fn enforce(
    state: &mut SmState,
    source: &dyn RecordSource,
    writes: &mut Vec<Write>,
) -> Result<(), ReadFault> {
    let names: Vec<String> = state
        .topics
        .iter()
        .filter(|(_, m)| m.settings.has_retention() && m.records() > 0)
        .map(|(n, _)| n.clone())
        .collect();
    for name in names {
        // Moving a cursor up to the new first offset can carry it further (over records it
        // had already finished), which can raise the `until_acked` floor: go again until
        // nothing moves. Each round removes at least one record, so this ends.
        while enforce_topic(state, source, &name, writes)? {}
    }
    Ok(())
}

/// One round of retention for topic `name`; true when it removed records.
fn enforce_topic(
    state: &mut SmState,
    source: &dyn RecordSource,
    name: &str,
    writes: &mut Vec<Write>,
) -> Result<bool, ReadFault> {
    let now = state.clock_ms;
    let until_acked_floor = match state.topics.get(name) {
        Some(meta) if meta.settings.until_acked => state.subs_of(name).map(|s| s.cursor).min(),
        _ => None,
    };
    let Some(meta) = state.topics.get(name) else {
        return Ok(false);
    };
    let (topic_id, start, end) = (meta.id, meta.first_offset, meta.next_offset);
    let settings = meta.settings;
    let mut first = start;
    if let Some(max) = settings.max_records {
        first = first.max(end.saturating_sub(max));
    }
    if let Some(floor) = until_acked_floor {
        first = first.max(floor.min(end));
    }
    // Bytes and age need the records themselves: walk from the front (each record is read at
    // most once in its life, when it is removed, plus the one that stays).
    let mut bytes = meta.bytes;
    let mut first_ts = meta.first_timestamp_ms;
    let mut removed_bytes = 0u64;
    let mut offset = start;
    let needs_walk = |offset: u64, bytes: u64, ts: u64| {
        offset < end
            && (offset < first
                || settings.max_bytes.is_some_and(|max| bytes > max)
                || settings
                    .max_age_ms
                    .is_some_and(|age| ts.saturating_add(age) <= now))
    };
    while needs_walk(offset, bytes, first_ts) {
        // Every offset from the first to the next holds a record: one that cannot be read is
        // a storage fault, never a reason to decide differently from the other replicas.
        let record = super::existing_record(source, writes, topic_id, offset)?;
        let size = super::stored_size(&record);
        if offset >= first {
            // Only the byte or age rule still removes: check the record itself.
            let too_old = settings
                .max_age_ms
                .is_some_and(|age| record.timestamp_ms.saturating_add(age) <= now);
            let too_big = settings.max_bytes.is_some_and(|max| bytes > max);
            if !too_old && !too_big {
                first_ts = record.timestamp_ms;
                break;
            }
        }
        bytes = bytes.saturating_sub(size);
        removed_bytes += size;
        offset += 1;
        first_ts = record.timestamp_ms;
    }
    let new_first = offset;
    if new_first == start {
        if let Some(meta) = state.topics.get_mut(name) {
            meta.first_timestamp_ms = first_ts;
        }
        return Ok(false);
    }
    // The timestamp of the new first record, if there is one.
    if new_first < end {
        first_ts = super::existing_record(source, writes, topic_id, new_first)?.timestamp_ms;
    }
    let removed = new_first - start;
    let sub_ids: Vec<u64> = state.subs_of(name).map(|s| s.id).collect();
    for id in sub_ids {
        super::subscriptions::trim(state, id, new_first, writes);
    }
    let Some(meta) = state.topics.get_mut(name) else {
        return Ok(false);
    };
    meta.first_offset = new_first;
    meta.first_timestamp_ms = first_ts;
    meta.bytes = meta.bytes.saturating_sub(removed_bytes);
    meta.counters.discarded_retention += removed;
    writes.push(Write::TrimTopic {
        topic_id,
        from: start,
        to: new_first,
    });
    writes.push(Write::PutTopic(name.to_string()));
    Ok(true)
}
