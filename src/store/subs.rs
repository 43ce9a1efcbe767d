//! How a subscription is stored: its head (everything but its leases and pending
//! redeliveries) under `s` + id, and its leases and pending redeliveries right after it in
//! blocks of [`BLOCK_OFFSETS`] consecutive offsets, one key per block, so that an apply writes
//! the head and the blocks whose offsets it changed (`OffsetMap::take_changed`), never every
//! lease in flight. An ack costs the same with 10 leases in flight as with 10,000; a pull of 64
//! fresh records, and the ack of them, writes one or two blocks instead of 64 keys.
//!
//! Keys, all in the `sm` family and sorting together: `s` + id (8 bytes, big endian) for the
//! head; the same + `L` + the block's first offset (8 bytes, big endian, a multiple of
//! [`BLOCK_OFFSETS`]) for a block of leases; + `P` + first offset for a block of pending
//! redeliveries. Values: the head behind [`HEAD_FORMAT`]; a block behind
//! `values::META_FORMAT`, its entries as (offset, value) pairs in offset order, every offset
//! within the block, never empty (a block with nothing left is deleted).
//!
//! Data directory formats 4 to 9 stored one key per offset (`l` + offset, `p` + offset), and
//! format 3 each subscription whole, leases included, as one value behind
//! `values::META_FORMAT` (a "whole" value); snapshot files still hold subscriptions whole, so
//! that a snapshot or backup reads the same on every release. Both still read; [`upgrade`]
//! rewrites either into blocks at open. [`Whole`] turns the stored blocks back into whole
//! values (snapshot builds, the state digest), [`split`] turns a whole value into blocks
//! (snapshot loads).

use rocksdb::{ColumnFamily, Direction, IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::{keys, values, CF_SM};
use crate::codec;
use crate::state::ranges::RangeSet;
use crate::state::subscriptions::{Lease, OffsetMap, Pending, SubCounters, SubSettings};
use crate::state::SubState;

/// Format byte of a subscription's head (its leases and pending redeliveries under keys of
/// their own). A whole subscription, as data directory format 3 stored it and snapshot files
/// hold it, has `values::META_FORMAT` there instead.
pub(crate) const HEAD_FORMAT: u8 = 2;
/// Offsets per block of leases or pending redeliveries: a pull's usual batch, so that a pull
/// and its ack each write one block or two.
pub const BLOCK_OFFSETS: u64 = 64;
const LEASE_BLOCK_TAG: u8 = b'L';
const PENDING_BLOCK_TAG: u8 = b'P';
/// One key per lease, as data directory formats 4 to 9 stored them; read, never written.
const LEASE_TAG: u8 = b'l';
/// One key per pending redelivery, as formats 4 to 9 stored them; read, never written.
const PENDING_TAG: u8 = b'p';

fn piece_key(id: u64, tag: u8, offset: u64) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[..9].copy_from_slice(&keys::sub(id));
    k[9] = tag;
    k[10..].copy_from_slice(&offset.to_be_bytes());
    k
}

/// The first offset of the block that holds `offset`.
fn block_start(offset: u64) -> u64 {
    offset - offset % BLOCK_OFFSETS
}

/// The key of the block of subscription `id`'s leases that holds `offset`.
pub fn lease_block_key(id: u64, offset: u64) -> [u8; 18] {
    piece_key(id, LEASE_BLOCK_TAG, block_start(offset))
}

/// The key of the block of subscription `id`'s pending redeliveries that holds `offset`.
pub fn pending_block_key(id: u64, offset: u64) -> [u8; 18] {
    piece_key(id, PENDING_BLOCK_TAG, block_start(offset))
}

/// The key of the lease on `offset` of subscription `id` as data directory formats 4 to 9
/// stored it (one key per lease).
pub fn lease_key(id: u64, offset: u64) -> [u8; 18] {
    piece_key(id, LEASE_TAG, offset)
}

/// The key of the pending redelivery of `offset` as formats 4 to 9 stored it.
pub fn pending_key(id: u64, offset: u64) -> [u8; 18] {
    piece_key(id, PENDING_TAG, offset)
}

/// Every key of subscription `id`: its head, leases and pending redeliveries.
pub fn range(id: u64) -> (Vec<u8>, Vec<u8>) {
    let end = match id.checked_add(1) {
        Some(next) => keys::sub(next).to_vec(),
        None => vec![keys::SUB_PREFIX + 1],
    };
    (keys::sub(id).to_vec(), end)
}

/// The head as stored: [`SubState`]'s fields in order, without `leases` and `pending`.
#[derive(Serialize)]
struct HeadRef<'a> {
    id: u64,
    topic: &'a str,
    name: &'a str,
    settings: &'a SubSettings,
    origin: u64,
    cursor: u64,
    next_fresh: u64,
    done: &'a RangeSet,
    next_lease_id: u64,
    counters: &'a SubCounters,
}

#[derive(Deserialize)]
struct Head {
    id: u64,
    topic: String,
    name: String,
    settings: SubSettings,
    origin: u64,
    cursor: u64,
    next_fresh: u64,
    done: RangeSet,
    next_lease_id: u64,
    counters: SubCounters,
}

/// `sub`'s head as stored.
pub fn encode_head(sub: &SubState) -> Result<Vec<u8>, bincode::Error> {
    let head = HeadRef {
        id: sub.id,
        topic: &sub.topic,
        name: &sub.name,
        settings: &sub.settings,
        origin: sub.origin,
        cursor: sub.cursor,
        next_fresh: sub.next_fresh,
        done: &sub.done,
        next_lease_id: sub.next_lease_id,
        counters: &sub.counters,
    };
    codec::encode_versioned(HEAD_FORMAT, &head)
}

/// Writes `sub` into `batch`: its head, and each block of leases and of pending redeliveries
/// in which an offset changed since the last call (put whole, or deleted when empty). Hands
/// the changes over: call it once per subscription and batch.
pub fn put(
    batch: &mut WriteBatch,
    cf: &ColumnFamily,
    sub: &mut SubState,
) -> Result<(), bincode::Error> {
    batch.put_cf(cf, keys::sub(sub.id), encode_head(sub)?);
    put_changed(batch, cf, &mut sub.leases, |o| lease_block_key(sub.id, o))?;
    put_changed(batch, cf, &mut sub.pending, |o| {
        pending_block_key(sub.id, o)
    })?;
    Ok(())
}

/// Puts each block of `map` in which an offset changed under `key(first offset)`, or deletes
/// the key when the block holds nothing now; hands the changes over.
fn put_changed<V: Serialize>(
    batch: &mut WriteBatch,
    cf: &ColumnFamily,
    map: &mut OffsetMap<V>,
    key: impl Fn(u64) -> [u8; 18],
) -> Result<(), bincode::Error> {
    let changed = map.take_changed();
    for (start, entries) in blocks(map, changed) {
        if entries.is_empty() {
            batch.delete_cf(cf, key(start));
        } else {
            batch.put_cf(cf, key(start), values::encode(&entries)?);
        }
    }
    Ok(())
}

/// Puts every block of `map`, as a whole subscription's are stored for the first time.
fn put_all<V: Serialize>(
    map: &OffsetMap<V>,
    key: impl Fn(u64) -> [u8; 18],
    emit: &mut impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<(), bincode::Error> {
    for (start, entries) in blocks(map, map.keys().copied()) {
        emit(key(start).to_vec(), values::encode(&entries)?);
    }
    Ok(())
}

/// For each block that holds one of `offsets` (in increasing order), once: its first offset
/// and `map`'s entries in it (none when the block is empty now).
fn blocks<'a, V>(
    map: &'a OffsetMap<V>,
    offsets: impl IntoIterator<Item = u64> + 'a,
) -> impl Iterator<Item = (u64, Vec<(u64, &'a V)>)> + 'a {
    let mut last = None;
    offsets
        .into_iter()
        .map(block_start)
        .filter(move |start| last.replace(*start) != Some(*start))
        .map(move |start| {
            let entries = map
                .range(start..start.saturating_add(BLOCK_OFFSETS))
                .map(|(o, v)| (*o, v))
                .collect();
            (start, entries)
        })
}

/// A block's entries as stored, checked: in increasing order, every one within the block that
/// starts at `start`, and at least one.
fn decode_block<V: serde::de::DeserializeOwned>(
    start: u64,
    value: &[u8],
) -> Result<Vec<(u64, V)>, String> {
    let entries: Vec<(u64, V)> = values::decode(value)?;
    if !start.is_multiple_of(BLOCK_OFFSETS) {
        return Err(format!("a block at offset {start}, not a block's first"));
    }
    if entries.is_empty() {
        return Err(format!("an empty block at offset {start}"));
    }
    let mut previous = None;
    for (offset, _) in &entries {
        if block_start(*offset) != start || previous.is_some_and(|p| p >= *offset) {
            return Err(format!(
                "offset {offset} out of place in the block at offset {start}"
            ));
        }
        previous = Some(*offset);
    }
    Ok(entries)
}

/// A head as [`encode_head`] stored it: the subscription, with no leases and no pending
/// redeliveries.
pub fn decode_head(value: &[u8]) -> Result<SubState, String> {
    let h: Head = codec::decode_versioned(HEAD_FORMAT, value)?;
    Ok(SubState {
        id: h.id,
        topic: h.topic,
        name: h.name,
        settings: h.settings,
        origin: h.origin,
        cursor: h.cursor,
        next_fresh: h.next_fresh,
        done: h.done,
        leases: Default::default(),
        pending: Default::default(),
        next_lease_id: h.next_lease_id,
        counters: h.counters,
    })
}

/// One stored pair of the subscription family, read.
enum Piece {
    /// A head: the subscription without its leases and pending redeliveries.
    Head(SubState),
    /// A whole subscription (data directory format 3, snapshot files).
    Whole(SubState),
    /// Leases of subscription `id`: a block, or one (formats 4 to 9).
    Leases(u64, Vec<(u64, Lease)>),
    /// Pending redeliveries of subscription `id`: a block, or one (formats 4 to 9).
    Pending(u64, Vec<(u64, Pending)>),
}

/// The subscription id in a key of the subscription family (at least 9 bytes long).
fn id_in(key: &[u8]) -> u64 {
    u64::from_be_bytes(key[1..9].try_into().unwrap_or_default())
}

fn read_piece(key: &[u8], value: &[u8]) -> Result<Piece, String> {
    match key.len() {
        9 => match value.first() {
            Some(&HEAD_FORMAT) => decode_head(value).map(Piece::Head),
            _ => values::decode(value).map(Piece::Whole),
        },
        18 => {
            let id = id_in(key);
            let offset = u64::from_be_bytes(key[10..18].try_into().unwrap_or_default());
            match key[9] {
                LEASE_BLOCK_TAG => Ok(Piece::Leases(id, decode_block(offset, value)?)),
                PENDING_BLOCK_TAG => Ok(Piece::Pending(id, decode_block(offset, value)?)),
                LEASE_TAG => Ok(Piece::Leases(id, vec![(offset, values::decode(value)?)])),
                PENDING_TAG => Ok(Piece::Pending(id, vec![(offset, values::decode(value)?)])),
                tag => Err(format!("unknown kind {tag:#04x}")),
            }
        }
        n => Err(format!("a key of {n} bytes")),
    }
}

/// Puts subscriptions back together from the pairs of the subscription family, fed in key
/// order (a head, then its blocks of leases and of pending redeliveries, or formats 4 to 9's
/// keys of one each). Anything out of place (a lease without its head, pieces after a whole
/// value, an id that disagrees with its key, an offset stored twice) is an error: the store is
/// damaged.
#[derive(Default)]
pub struct Assembler {
    current: Option<(SubState, bool)>,
}

impl Assembler {
    /// Feeds one pair; returns the subscription it completed, if any.
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<Option<SubState>, String> {
        let piece = read_piece(key, value)
            .map_err(|e| format!("corrupt subscription key {}: {e}", codec::hex(key)))?;
        let misplaced = || {
            format!(
                "corrupt subscription key {}: not under its subscription",
                codec::hex(key)
            )
        };
        match piece {
            Piece::Head(sub) | Piece::Whole(sub) if key != keys::sub(sub.id) => Err(format!(
                "corrupt subscription key {}: it holds subscription {}",
                codec::hex(key),
                sub.id
            )),
            Piece::Head(sub) => Ok(self.current.replace((sub, false)).map(as_stored)),
            Piece::Whole(sub) => Ok(self.current.replace((sub, true)).map(as_stored)),
            Piece::Leases(id, entries) => {
                let sub = self.open(id).ok_or_else(misplaced)?;
                insert_all(&mut sub.leases, entries).map_err(|e| twice(key, e))?;
                Ok(None)
            }
            Piece::Pending(id, entries) => {
                let sub = self.open(id).ok_or_else(misplaced)?;
                insert_all(&mut sub.pending, entries).map_err(|e| twice(key, e))?;
                Ok(None)
            }
        }
    }

    /// The head being assembled, if it is subscription `id`'s and stored in pieces.
    fn open(&mut self, id: u64) -> Option<&mut SubState> {
        match &mut self.current {
            Some((sub, false)) if sub.id == id => Some(sub),
            _ => None,
        }
    }

    /// The last subscription, once every pair was fed. Its maps record no changes: it is as
    /// stored.
    pub fn finish(self) -> Option<SubState> {
        self.current.map(as_stored)
    }
}

/// Inserts each of `entries` into `map`; the first offset already there is an error.
fn insert_all<V>(map: &mut OffsetMap<V>, entries: Vec<(u64, V)>) -> Result<(), u64> {
    for (offset, v) in entries {
        if map.insert(offset, v).is_some() {
            return Err(offset);
        }
    }
    Ok(())
}

fn twice(key: &[u8], offset: u64) -> String {
    format!(
        "corrupt subscription key {}: offset {offset} is stored twice",
        codec::hex(key)
    )
}

/// Every subscription stored in `db`'s `sm` family, as stored.
pub fn load(db: &DB) -> Result<Vec<SubState>, String> {
    let cf = db.cf_handle(CF_SM).ok_or("column family sm missing")?;
    let prefix = [keys::SUB_PREFIX];
    let mut asm = Assembler::default();
    let mut subs = Vec::new();
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if k.first() != Some(&keys::SUB_PREFIX) {
            break;
        }
        subs.extend(asm.push(&k, &v)?);
    }
    subs.extend(asm.finish());
    Ok(subs)
}

/// A subscription just read, with no changes recorded.
fn as_stored((mut sub, _): (SubState, bool)) -> SubState {
    sub.leases.take_changed();
    sub.pending.take_changed();
    sub
}

/// Turns the `sm` family's pairs, fed in key order, into the pairs a snapshot file holds:
/// every pair as stored, except a subscription's pieces, which become one whole value under
/// its head's key. Snapshot files and the state digest therefore read the same whichever way
/// a node stores its subscriptions.
#[derive(Default)]
pub struct Whole {
    asm: Assembler,
}

impl Whole {
    /// Feeds one pair; calls `emit` with what it completes.
    pub fn push<E: From<String>>(
        &mut self,
        key: &[u8],
        value: &[u8],
        emit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if key.first() == Some(&keys::SUB_PREFIX) {
            if let Some(sub) = self.asm.push(key, value)? {
                emit_whole(&sub, emit)?;
            }
            return Ok(());
        }
        if let Some(sub) = std::mem::take(&mut self.asm).finish() {
            emit_whole(&sub, emit)?;
        }
        emit(key, value)
    }

    /// Emits the subscription still being assembled; call once after the last pair.
    pub fn finish<E: From<String>>(
        self,
        emit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        match self.asm.finish() {
            Some(sub) => emit_whole(&sub, emit),
            None => Ok(()),
        }
    }
}

fn emit_whole<E: From<String>>(
    sub: &SubState,
    emit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let whole = values::encode(sub).map_err(|e| E::from(e.to_string()))?;
    emit(&keys::sub(sub.id), &whole)
}

/// The pairs to store for one pair of a snapshot file: a whole subscription becomes its head
/// and blocks; any other pair stays as it is.
pub fn split(
    key: Vec<u8>,
    value: Vec<u8>,
    mut emit: impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<(), String> {
    if key.len() != 9 || key[0] != keys::SUB_PREFIX || value.first() == Some(&HEAD_FORMAT) {
        emit(key, value);
        return Ok(());
    }
    let sub: SubState = match read_piece(&key, &value)? {
        Piece::Whole(sub) if keys::sub(sub.id)[..] == key[..] => sub,
        _ => {
            return Err(format!(
                "corrupt subscription key {}: it holds another subscription",
                codec::hex(&key)
            ))
        }
    };
    emit_stored(&sub, &mut emit).map_err(|e| e.to_string())
}

/// `sub` as stored: its head, then its blocks of leases and of pending redeliveries.
fn emit_stored(
    sub: &SubState,
    emit: &mut impl FnMut(Vec<u8>, Vec<u8>),
) -> Result<(), bincode::Error> {
    emit(keys::sub(sub.id).to_vec(), encode_head(sub)?);
    put_all(&sub.leases, |o| lease_block_key(sub.id, o), emit)?;
    put_all(&sub.pending, |o| pending_block_key(sub.id, o), emit)
}

/// Stores every subscription of `db` that an older data directory format left whole (format
/// 3) or with one key per lease and pending redelivery (formats 4 to 9) as a head and blocks, in one
/// synced batch; does nothing on a store that has none. Runs at every open, before anything
/// reads the store. Returns how many subscriptions it rewrote.
pub fn upgrade(db: &DB) -> Result<usize, String> {
    let Some(cf) = db.cf_handle(CF_SM) else {
        return Ok(0);
    };
    let prefix = [keys::SUB_PREFIX];
    let mut old = std::collections::BTreeSet::new();
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if k.first() != Some(&keys::SUB_PREFIX) {
            break;
        }
        let whole = k.len() == 9 && v.first() != Some(&HEAD_FORMAT);
        let one_per_offset = k.len() == 18 && matches!(k[9], LEASE_TAG | PENDING_TAG);
        if whole || one_per_offset {
            old.insert(id_in(&k));
        }
    }
    if old.is_empty() {
        return Ok(0);
    }
    let mut batch = WriteBatch::default();
    for sub in load(db)?.iter().filter(|s| old.contains(&s.id)) {
        let (start, end) = range(sub.id);
        batch.delete_range_cf(cf, start, end);
        emit_stored(sub, &mut |k, v| batch.put_cf(cf, k, v)).map_err(|e| e.to_string())?;
    }
    db.write_opt(batch, &super::write_options(true))
        .map_err(|e| e.to_string())?;
    Ok(old.len())
}

#[cfg(test)]
#[path = "subs_tests.rs"]
mod tests;
