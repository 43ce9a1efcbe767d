//! The commit hint: the highest committed log id this node knows of, written on every commit
//! into a [`SlotFile`] of its own (`COMMITTED` in the log directory), without a sync.
//!
//! It is a hint. Raft does not need it (a node that loses it learns the commit index from the
//! leader again); what it gives is that a node restarted alone, after every node was stopped,
//! applies the entries its log holds up to the last commit it saw, so that its reads (which
//! need no leader) include what was acknowledged before the stop. A write into the page cache
//! survives the process being killed; a power loss may take the newest slots, which leaves an
//! older commit (never a later one), or none. A commit hint past the log's end (entries received
//! but not written when the node stopped) is cut back to the log's end by the log store.
//!
//! Until data directory format 9 the commit index was a key of RocksDB's `raft` family,
//! written through its WAL on every commit, which cost each node a RocksDB write per commit. A
//! directory that still has the key is read as the greater of the key and the file.

use std::io;
use std::path::Path;

use super::slots::{Kind, SlotFile};
use crate::raft::LogId;

/// The commit hint's file name in the log directory.
pub const FILE: &str = "COMMITTED";

const KIND: Kind = Kind {
    magic: 0x5251_4349, // "RQCI"
    format: 1,
};

/// A slot's words: 1 when a log id follows (0 for none), its term, leader node id and index.
type Words = [u64; 4];

fn to_words(id: Option<LogId>) -> Words {
    match id {
        None => [0; 4],
        Some(id) => {
            let leader = id.committed_leader_id();
            [1, leader.term, leader.node_id, id.index]
        }
    }
}

fn from_words([some, term, node_id, index]: Words) -> Option<LogId> {
    (some == 1).then(|| {
        LogId::new(
            openraft::impls::leader_id_adv::LeaderId { term, node_id },
            index,
        )
    })
}

/// The commit hint of one log directory, open for writing.
pub struct CommitHint {
    file: SlotFile<4>,
    last: Option<LogId>,
}

impl CommitHint {
    /// Opens (creating if needed) the hint in `dir`. A file whose slots are all torn is read as
    /// no hint, and said so: the node learns the commit index from the leader.
    pub fn open(dir: &Path) -> io::Result<CommitHint> {
        let path = dir.join(FILE);
        let (file, found, existed) = SlotFile::open(&path, KIND)?;
        if existed && found.is_none() {
            tracing::warn!(
                file = %path.display(),
                "the commit hint holds no valid slot (torn by a power loss?); \
                 the commit index will be learned from the leader"
            );
        }
        Ok(CommitHint {
            file,
            last: found.and_then(from_words),
        })
    }

    /// The hint read at open, or written last.
    pub fn get(&self) -> Option<LogId> {
        self.last
    }

    /// Records `committed`, unsynced: one `pwrite` into the page cache. A commit at or below
    /// the one held already is not written.
    pub fn set(&mut self, committed: Option<LogId>) -> io::Result<()> {
        if committed <= self.last {
            return Ok(());
        }
        self.file.write(&to_words(committed), false)?;
        self.last = committed;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, node_id: u64, index: u64) -> LogId {
        LogId::new(
            openraft::impls::leader_id_adv::LeaderId { term, node_id },
            index,
        )
    }

    /// A slot of the `COMMITTED` file as today's code writes it (format 1): it reads back, and
    /// writes again byte for byte. A new layout gets a new format number beside this one.
    #[test]
    fn a_slot_reads_back_and_writes_again_byte_for_byte() {
        const SLOT: &str = concat!(
            "49435152010000000500000000000000",
            "01000000000000000300000000000000020000000000000064000000000000001b82a20100000000",
        );
        let bytes = crate::codec::unhex(SLOT);
        let id = Some(log_id(3, 2, 100));
        let found = SlotFile::<4>::decode(KIND, &bytes).expect("a valid slot");
        assert_eq!((found.0, from_words(found.1)), (5, id));
        assert_eq!(
            SlotFile::<4>::encode(KIND, 5, &to_words(id)),
            bytes,
            "the slot's layout changed"
        );
        assert_eq!(from_words(to_words(None)), None);
    }

    #[test]
    fn the_hint_only_moves_forward_and_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut hint = CommitHint::open(dir.path()).expect("open");
        assert_eq!(hint.get(), None);
        hint.set(Some(log_id(1, 1, 10))).expect("set");
        hint.set(Some(log_id(2, 3, 12))).expect("set");
        // An older commit (a late report) does not move it back.
        hint.set(Some(log_id(1, 1, 11))).expect("set");
        hint.set(None).expect("set");
        assert_eq!(hint.get(), Some(log_id(2, 3, 12)));
        drop(hint);
        let hint = CommitHint::open(dir.path()).expect("reopen");
        assert_eq!(hint.get(), Some(log_id(2, 3, 12)));
    }

    #[test]
    fn a_torn_hint_falls_back_to_the_older_slot_then_to_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE);
        let mut hint = CommitHint::open(dir.path()).expect("open");
        hint.set(Some(log_id(1, 1, 10))).expect("set");
        hint.set(Some(log_id(1, 1, 20))).expect("set");
        let mut bytes = std::fs::read(&path).expect("file");
        // The newest slot (sequence 2) is the first in the file.
        bytes[30] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        let hint = CommitHint::open(dir.path()).expect("reopen");
        assert_eq!(hint.get(), Some(log_id(1, 1, 10)));
        drop(hint);
        std::fs::write(&path, &bytes[..7]).expect("cut");
        let hint = CommitHint::open(dir.path()).expect("reopen");
        assert_eq!(hint.get(), None);
    }
}
