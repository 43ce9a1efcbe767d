//! How a subscription is stored: its head (everything but its leases and pending
//! redeliveries) under `s` + id, and one key per lease and per pending redelivery right after
//! it, so that an apply writes the head and the offsets it changed (`OffsetMap::take_changed`),
//! never every lease in flight. An ack costs the same with 10 leases in flight as with 10,000.
//!
//! Keys, all in the `sm` family and sorting together: `s` + id (8 bytes, big endian) for the
//! head; the same + `l` + offset (8 bytes, big endian) for a lease; + `p` + offset for a
//! pending redelivery. Values: the head behind [`HEAD_FORMAT`]; a lease or a pending
//! redelivery behind `values::META_FORMAT`.
//!
//! Data directory format 3 stored each subscription whole, leases included, as one value behind
//! `values::META_FORMAT` (a "whole" value); snapshot files still hold subscriptions so, so that
//! a snapshot or backup reads the same on every release. [`Whole`] turns the stored pieces back
//! into whole values (snapshot builds, the state digest), [`split`] turns a whole value into
//! pieces (snapshot loads, [`upgrade`] at open).

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
const LEASE_TAG: u8 = b'l';
const PENDING_TAG: u8 = b'p';

fn piece_key(id: u64, tag: u8, offset: u64) -> [u8; 18] {
    let mut k = [0u8; 18];
    k[..9].copy_from_slice(&keys::sub(id));
    k[9] = tag;
    k[10..].copy_from_slice(&offset.to_be_bytes());
    k
}

/// The key of the lease on `offset` of subscription `id`.
pub fn lease_key(id: u64, offset: u64) -> [u8; 18] {
    piece_key(id, LEASE_TAG, offset)
}

/// The key of the pending redelivery of `offset` of subscription `id`.
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

/// Writes `sub` into `batch`: its head, and each lease and pending redelivery that changed
/// since the last call (put, or deleted when gone). Hands the changes over: call it once per
/// subscription and batch.
pub fn put(
    batch: &mut WriteBatch,
    cf: &ColumnFamily,
    sub: &mut SubState,
) -> Result<(), bincode::Error> {
    batch.put_cf(cf, keys::sub(sub.id), encode_head(sub)?);
    put_changed(batch, cf, &mut sub.leases, |o| lease_key(sub.id, o))?;
    put_changed(batch, cf, &mut sub.pending, |o| pending_key(sub.id, o))?;
    Ok(())
}

/// Puts the current entry of each offset `map` changed under `key(offset)`, or deletes the key
/// when the entry is gone; hands the changes over.
fn put_changed<V: Serialize>(
    batch: &mut WriteBatch,
    cf: &ColumnFamily,
    map: &mut OffsetMap<V>,
    key: impl Fn(u64) -> [u8; 18],
) -> Result<(), bincode::Error> {
    for offset in map.take_changed() {
        match map.get(&offset) {
            Some(v) => batch.put_cf(cf, key(offset), values::encode(v)?),
            None => batch.delete_cf(cf, key(offset)),
        }
    }
    Ok(())
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
    Lease(u64, u64, Lease),
    Pending(u64, u64, Pending),
}

fn read_piece(key: &[u8], value: &[u8]) -> Result<Piece, String> {
    let id_of = |k: &[u8]| u64::from_be_bytes(k[1..9].try_into().unwrap_or_default());
    match key.len() {
        9 => match value.first() {
            Some(&HEAD_FORMAT) => decode_head(value).map(Piece::Head),
            _ => values::decode(value).map(Piece::Whole),
        },
        18 => {
            let offset = u64::from_be_bytes(key[10..18].try_into().unwrap_or_default());
            match key[9] {
                LEASE_TAG => Ok(Piece::Lease(id_of(key), offset, values::decode(value)?)),
                PENDING_TAG => Ok(Piece::Pending(id_of(key), offset, values::decode(value)?)),
                tag => Err(format!("unknown kind {tag:#04x}")),
            }
        }
        n => Err(format!("a key of {n} bytes")),
    }
}

/// Puts subscriptions back together from the pairs of the subscription family, fed in key
/// order (a head, then its leases, then its pending redeliveries). Anything out of place (a
/// lease without its head, pieces after a whole value, an id that disagrees with its key) is
/// an error: the store is damaged.
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
            Piece::Lease(id, offset, lease) => {
                self.open(id)
                    .ok_or_else(misplaced)?
                    .leases
                    .insert(offset, lease);
                Ok(None)
            }
            Piece::Pending(id, offset, p) => {
                self.open(id)
                    .ok_or_else(misplaced)?
                    .pending
                    .insert(offset, p);
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

/// The pairs to store for one pair of a snapshot file: a whole subscription becomes its head,
/// leases and pending redeliveries; any other pair stays as it is.
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
    let enc = |e: bincode::Error| e.to_string();
    emit(key, encode_head(&sub).map_err(enc)?);
    for (offset, lease) in &sub.leases {
        emit(
            lease_key(sub.id, *offset).to_vec(),
            values::encode(lease).map_err(enc)?,
        );
    }
    for (offset, p) in &sub.pending {
        emit(
            pending_key(sub.id, *offset).to_vec(),
            values::encode(p).map_err(enc)?,
        );
    }
    Ok(())
}

/// Stores every whole subscription of `db` (data directory format 3) in pieces, in one synced
/// batch; does nothing on a store that has none. Runs at every open, before anything reads
/// the store. Returns how many subscriptions it split.
pub fn upgrade(db: &DB) -> Result<usize, String> {
    let Some(cf) = db.cf_handle(CF_SM) else {
        return Ok(0);
    };
    let prefix = [keys::SUB_PREFIX];
    let mut batch = WriteBatch::default();
    let mut split_subs = 0;
    for item in db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = item.map_err(|e| e.to_string())?;
        if k.first() != Some(&keys::SUB_PREFIX) {
            break;
        }
        if k.len() != 9 || v.first() == Some(&HEAD_FORMAT) {
            continue;
        }
        split(k.to_vec(), v.to_vec(), |k, v| batch.put_cf(cf, k, v))?;
        split_subs += 1;
    }
    if split_subs > 0 {
        db.write_opt(batch, &super::write_options(true))
            .map_err(|e| e.to_string())?;
    }
    Ok(split_subs)
}

#[cfg(test)]
#[path = "subs_tests.rs"]
mod tests;
