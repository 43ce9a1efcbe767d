//! Consensus wiring: the openraft type configuration, the node-to-node network (client side
//! in [`network`], server side in [`rpc`]) and the Raft settings raftq runs with.

pub mod network;
pub mod rpc;

use std::io;

use crate::state::{ApplyResponse, LogPayload};
use crate::store::StateMachineStore;

openraft::declare_raft_types!(
    /// raftq's Raft types: the log entry payload is a versioned batch of commands and a node is
    /// known by its base URL. Terms, leader ids and votes are openraft's defaults (a leader id
    /// is a term and a node id), whose encoding is the one raftq has always stored.
    pub TypeConfig:
        D = LogPayload,
        R = ApplyResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// Snapshots travel and are installed as files.
pub type SnapshotData = tokio::fs::File;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type StorageResult<T> = Result<T, io::Error>;

/// Wraps any displayable storage failure as an `io::Error`, the error type of openraft's
/// storage traits.
pub fn to_io(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

#[cfg(test)]
mod tests {
    //! Stored bytes written by raftq on openraft 0.9 (log entries, the vote, the committed and
    //! applied log ids, the membership, snapshot file metas) must read back unchanged: a data
    //! directory survives the upgrade. The hex below was produced by raftq on openraft 0.9.25.

    use std::collections::{BTreeMap, BTreeSet};

    use openraft::vote::RaftLeaderId;
    use openraft::{BasicNode, EntryPayload, Membership};

    use super::*;
    use crate::codec;
    use crate::state::{Batch, LogPayload};
    use crate::store::snapshot::FileMeta;

    /// Decodes `hex` as `T`, checks it is `want`, and that encoding `want` gives the same bytes.
    fn same<T>(hex: &str, want: &T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let bytes = codec::unhex(hex);
        let got: T = codec::decode(&bytes).expect("0.9 bytes decode");
        assert_eq!(&got, want);
        assert_eq!(
            codec::encode(want).expect("encode"),
            bytes,
            "encoding changed"
        );
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(openraft::impls::leader_id_adv::LeaderId::new(7, 2), index)
    }

    fn membership() -> Membership<NodeId, BasicNode> {
        let nodes: BTreeMap<NodeId, BasicNode> = (1..=3)
            .map(|i| {
                (
                    i,
                    BasicNode {
                        addr: format!("http://127.0.0.1:700{i}"),
                    },
                )
            })
            .collect();
        Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).expect("membership")
    }

    #[test]
    fn data_written_on_openraft_0_9_reads_back_the_same() {
        let entry = |index, payload| Entry {
            log_id: log_id(index),
            payload,
        };
        same(
            concat!(
                "07022a020103010203030115687474703a2f2f3132372e302e302e313a373030310215687474703a",
                "2f2f3132372e302e302e313a373030320315687474703a2f2f3132372e302e302e313a37303033",
            ),
            &entry(42, EntryPayload::Membership(membership())),
        );
        same("07022b00", &entry(43, EntryPayload::Blank));
        same(
            "07022c0100fbd20400",
            &entry(
                44,
                EntryPayload::Normal(LogPayload::V1(Batch {
                    time_ms: 1234,
                    commands: vec![],
                })),
            ),
        );
        same("070201", &Vote::new_committed(7, 2));
        same("0107022a", &Some(log_id(42)));
        let stored = StoredMembership::new(Some(log_id(42)), membership());
        same(
            concat!(
                "0107022a0103010203030115687474703a2f2f3132372e302e302e313a373030310215687474703a",
                "2f2f3132372e302e302e313a373030320315687474703a2f2f3132372e302e302e313a37303033",
            ),
            &stored,
        );
        same(
            concat!(
                "0107022a0107022a0103010203030115687474703a2f2f3132372e302e302e313a37303031021568",
                "7474703a2f2f3132372e302e302e313a373030320315687474703a2f2f3132372e302e302e313a37",
                "30303303732d31",
            ),
            &FileMeta {
                last_log_id: Some(log_id(42)),
                last_membership: stored,
                snapshot_id: "s-1".into(),
            },
        );
    }
}
