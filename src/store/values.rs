//! The format byte in front of every value the store keeps, and the upgrade of a store written
//! before all of them had one.
//!
//! Log entries start with `log::ENTRY_FORMAT`, records with `records::RECORD_FORMAT` (whole) or
//! `records::RECORD_AT_FORMAT` (where the log holds them); everything else (Raft's vote,
//! committed and last purged ids and the log's purge point in the `raft` family; the applied
//! id, the membership, the clock and counters, topics, subscriptions and producers in the `sm`
//! family) starts with [`META_FORMAT`], followed by the value's codec bytes. A value whose encoding
//! changes gets a new format byte beside the old one, never a changed one.
//!
//! Data directory format 2 stored the six values of [`BARE`] as codec bytes alone. Opening such
//! a store puts [`META_FORMAT`] in front of each, in one synced batch that also writes
//! [`keys::VALUES_FORMAT`]: the upgrade is all or nothing across a crash, and the key's
//! presence, not the data directory's `IDENTITY`, says whether it was done.

use rocksdb::{WriteBatch, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{keys, CF_RAFT, CF_SM};
use crate::codec;

/// Format byte in front of every stored value that is neither a log entry nor a record.
pub(crate) const META_FORMAT: u8 = 1;

/// The values data directory format 2 stored without a format byte: column family, key.
pub const BARE: [(&str, &[u8]); 6] = [
    (CF_RAFT, keys::VOTE),
    (CF_RAFT, keys::COMMITTED),
    (CF_RAFT, keys::LAST_PURGED),
    (CF_SM, keys::APPLIED),
    (CF_SM, keys::MEMBERSHIP),
    (CF_SM, keys::SM_META),
];

/// `value` as stored: [`META_FORMAT`], then its codec bytes.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    codec::encode_versioned(META_FORMAT, value)
}

/// Reads a value written by [`encode`]; a missing or unknown format byte is an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    codec::decode_versioned(META_FORMAT, bytes)
}

/// A value of [`BARE`] as format 2 stored it, as it is stored now: the same codec bytes behind
/// the format byte (`encode` is `[META_FORMAT]` followed by what format 2 wrote).
pub fn with_format_byte(bare: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bare.len() + 1);
    out.push(META_FORMAT);
    out.extend_from_slice(bare);
    out
}

/// Whether `key` of the `sm` family is one of the values format 2 stored bare (snapshot files
/// of format 1 hold them so).
pub fn is_bare_sm_key(key: &[u8]) -> bool {
    BARE.iter().any(|(cf, k)| *cf == CF_SM && *k == key)
}

/// Gives the [`BARE`] values of a store written by data directory format 2 their format byte
/// and records that it was done, in one synced batch; does nothing on a store that already
/// records it. A new, empty store gets the record alone. Returns how many values were
/// rewritten. Runs at every open, before anything reads the store.
pub fn upgrade(db: &DB) -> Result<usize, rocksdb::Error> {
    let Some(raft) = db.cf_handle(CF_RAFT) else {
        return Ok(0);
    };
    if db.get_cf(raft, keys::VALUES_FORMAT)?.is_some() {
        return Ok(0);
    }
    let mut batch = WriteBatch::default();
    let mut rewritten = 0;
    for (name, key) in BARE {
        let Some(cf) = db.cf_handle(name) else {
            continue;
        };
        if let Some(bare) = db.get_cf(cf, key)? {
            batch.put_cf(cf, key, with_format_byte(&bare));
            rewritten += 1;
        }
    }
    batch.put_cf(raft, keys::VALUES_FORMAT, [META_FORMAT]);
    db.write_opt(batch, &super::write_options(true))?;
    Ok(rewritten)
}

#[cfg(test)]
mod tests {
    use openraft::impls::leader_id_adv::LeaderId;
    use openraft::vote::RaftLeaderId;

    use super::*;
    use crate::raft::{LogId, Vote};

    fn put(db: &DB, cf: &str, key: &[u8], value: &[u8]) {
        db.put_cf(db.cf_handle(cf).expect("cf"), key, value)
            .expect("put");
    }

    fn get(db: &DB, cf: &str, key: &[u8]) -> Option<Vec<u8>> {
        db.get_cf(db.cf_handle(cf).expect("cf"), key).expect("get")
    }

    /// A store as format 2 left it (bare values, no record of the upgrade) reads back the same
    /// values after one open, and a second open changes nothing: the upgrade runs once.
    #[test]
    fn a_format_2_store_gets_its_format_bytes_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vote = Vote::new_committed(4, 2);
        let purged = LogId::new(LeaderId::new(3, 1), 17);
        {
            // Written the way format 2 wrote them, then the record of the upgrade taken away.
            let db = super::super::open_db(dir.path()).expect("open");
            let raft = db.cf_handle(CF_RAFT).expect("cf");
            db.delete_cf(raft, keys::VALUES_FORMAT).expect("delete");
            put(
                &db,
                CF_RAFT,
                keys::VOTE,
                &codec::encode(&vote).expect("enc"),
            );
            put(
                &db,
                CF_RAFT,
                keys::LAST_PURGED,
                &codec::encode(&purged).expect("enc"),
            );
            put(
                &db,
                CF_SM,
                keys::APPLIED,
                &codec::encode(&Some(purged)).expect("enc"),
            );
        }
        let db = super::super::open_db(dir.path()).expect("reopen upgrades");
        let read = |cf, key| get(&db, cf, key).expect("present");
        assert_eq!(decode::<Vote>(&read(CF_RAFT, keys::VOTE)), Ok(vote));
        assert_eq!(
            decode::<LogId>(&read(CF_RAFT, keys::LAST_PURGED)),
            Ok(purged)
        );
        assert_eq!(
            decode::<Option<LogId>>(&read(CF_SM, keys::APPLIED)),
            Ok(Some(purged))
        );
        assert_eq!(get(&db, CF_RAFT, keys::COMMITTED), None);
        assert_eq!(upgrade(&db).expect("again"), 0, "the upgrade ran twice");
        assert_eq!(decode::<Vote>(&read(CF_RAFT, keys::VOTE)), Ok(vote));
    }

    /// The upgrade relies on this: what [`encode`] writes is the format byte followed by what
    /// format 2 wrote for the same value.
    #[test]
    fn a_stored_value_is_the_format_byte_then_the_bare_bytes() {
        let vote = Vote::new_committed(4, 2);
        let bare = codec::encode(&vote).expect("enc");
        assert_eq!(with_format_byte(&bare), encode(&vote).expect("enc"));
        let applied = Some(LogId::new(LeaderId::new(3, 1), 17));
        let bare = codec::encode(&applied).expect("enc");
        assert_eq!(with_format_byte(&bare), encode(&applied).expect("enc"));
    }
}
