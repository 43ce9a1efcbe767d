//! Consensus wiring: the openraft type configuration, the client side of the node-to-node
//! network ([`network`], with [`stream`] for the pipelined appends; the server side is
//! [`crate::peer`]) and the Raft settings raftq runs
//! with. The Raft handle itself, which needs the storage, is [`crate::store::Raft`].

pub mod network;
pub mod stream;

use std::io;

use crate::state::{ApplyResponse, LogPayload};

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
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot's bytes as they travel between nodes: a file (one received, or one whole on
/// disk), a stream made as it is read, or a node's own linked snapshot, which goes to each
/// follower in the form it takes.
pub enum SnapshotData {
    File(tokio::fs::File),
    Stream(ChunkStream),
    /// A linked snapshot: expanded into the whole format with its records (`whole`), or as a
    /// linked transfer, the file and the log entries its records point into (`transfer`),
    /// for a follower that takes one. Each is made only when it is read.
    Linked {
        whole: ChunkStream,
        transfer: ChunkStream,
    },
}

/// Chunks of a snapshot's bytes.
pub type ChunkStream = futures::stream::BoxStream<'static, io::Result<bytes::Bytes>>;

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotData::File(file) => f.debug_tuple("File").field(file).finish(),
            SnapshotData::Stream(_) => f.write_str("Stream"),
            SnapshotData::Linked { .. } => f.write_str("Linked"),
        }
    }
}

/// Read size when a snapshot file is streamed.
const SNAPSHOT_CHUNK: usize = 1 << 20;

impl SnapshotData {
    /// The bytes in the whole format, as a stream of chunks.
    pub fn into_stream(self) -> ChunkStream {
        self.for_peer(false)
    }

    /// The bytes as they go to a follower: a linked snapshot as a linked transfer when the
    /// follower takes one (`linked`), else in the whole format.
    pub fn for_peer(self, linked: bool) -> ChunkStream {
        use futures::StreamExt;
        use tokio::io::AsyncReadExt;
        match self {
            SnapshotData::Stream(s) => s,
            SnapshotData::Linked { transfer, .. } if linked => transfer,
            SnapshotData::Linked { whole, .. } => whole,
            SnapshotData::File(file) => futures::stream::unfold(file, |mut file| async move {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK];
                match file.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok(bytes::Bytes::from(buf)), file))
                    }
                    Err(e) => Some((Err(e), file)),
                }
            })
            .boxed(),
        }
    }
}

/// What each other node said it takes, in its `/raft/status` (read once a second by every
/// node): the newest command format it applies (`state::COMMAND_FORMAT`) and the snapshot
/// transfer format it receives (`store::transfer::RECEIVES`). Shared by the replica facade,
/// which proposes batch publishes only once every member applies them, and the network, which
/// sends a follower its snapshot in the form it takes.
#[derive(Debug, Default)]
pub struct PeerFormats(std::sync::Mutex<std::collections::BTreeMap<NodeId, Formats>>);

/// What one node takes; 0 where it said nothing (a release before the field).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Formats {
    pub commands: u32,
    pub snapshots: u32,
}

impl Formats {
    /// What a node's `/raft/status` answer says it takes (0 for a field it lacks).
    pub fn from_status(status: &serde_json::Value) -> Formats {
        let number = |field: &str| {
            status[field]
                .as_u64()
                .and_then(|f| u32::try_from(f).ok())
                .unwrap_or(0)
        };
        Formats {
            commands: number("command_format"),
            snapshots: number("snapshot_format"),
        }
    }
}

impl PeerFormats {
    /// Records what node `id` said.
    pub fn record(&self, id: NodeId, formats: Formats) {
        self.lock().insert(id, formats);
    }

    /// What node `id` said last, if it was heard from.
    pub fn get(&self, id: NodeId) -> Option<Formats> {
        self.lock().get(&id).copied()
    }

    /// What every node heard from said last.
    pub fn all(&self) -> std::collections::BTreeMap<NodeId, Formats> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<NodeId, Formats>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type StorageResult<T> = Result<T, io::Error>;

/// Raft timing. The leader lease openraft grants is `ELECTION_TIMEOUT_MAX_MS`.
pub const HEARTBEAT_MS: u64 = 100;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 600;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 1200;
/// A leader that has not heard from a quorum for this long answers `no_leader`.
pub const QUORUM_STALE_MS: u64 = ELECTION_TIMEOUT_MAX_MS;

/// The Raft settings of a node of cluster `cluster_id` that snapshots every `snapshot_logs`
/// entries and keeps `snapshot_keep_logs` entries behind its snapshot.
pub fn config(
    cluster_id: &str,
    snapshot_logs: u64,
    snapshot_keep_logs: u64,
) -> anyhow::Result<openraft::Config> {
    let config = openraft::Config {
        cluster_name: cluster_id.to_string(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        // Entries are batches of many commands; bound how many go in one RPC.
        max_payload_entries: 32,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(snapshot_logs),
        max_in_snapshot_log_to_keep: snapshot_keep_logs,
        // Safety-relevant choices, set here rather than left to openraft's defaults:
        //
        // A restarted leader never resumes its term without an election. openraft 0.10
        // restores leadership by default; but the leader replicates an entry before its own
        // fsync, so after a power loss it may come back without entries its followers
        // committed, and, still leading the same term, write new entries under the log ids of
        // those committed ones. Followers compare log ids only, so the replicas would diverge.
        // An election instead makes it learn the committed log from a majority first.
        enable_leader_restore: Some(false),
        // A follower whose log went backwards (lost entries it acknowledged) is a fault to
        // stop on, never progress to reset quietly.
        allow_log_reversion: Some(false),
        // No pre-vote round: with it, a follower left alone (the others down) never starts an
        // election and keeps naming its dead leader, so writes sent to it are redirected to a
        // node that is gone instead of answered 503 `no_leader`. A node cut off and back does
        // not depose a healthy leader anyway: the followers' leader lease (the election
        // timeout) refuses its vote requests.
        enable_pre_vote: Some(false),
        ..Default::default()
    };
    Ok(config.validate()?)
}

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
                    timestamp_ms: 1234,
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

    /// Bytes of the RPC bodies below, as raftq encodes them today.
    const HEX_APPEND: &str = concat!(
        "070201010702290107022a0100fd7b2034d39a0100000102066f7264657273",
        "0101016b01016801760568656c6c6f0001070228",
    );
    const HEX_APPEND_ANSWERS: [&str; 4] = ["0000", "00010107022a", "0002", "0003080300"];
    const HEX_APPEND_BATCH: &str = concat!(
        "070201010702290107022a0100fd7b2034d39a010000010a066f72646572734e00000000000000000000",
        "0042ffffffff025c4e63f9000000000000ffffffffffffffffffffffffffffffffffffffffffffffffff",
        "ffffffffff0000000120000000026b0a68656c6c6f02026802760001070228",
    );
    const HEX_VOTE: &str = "0803000107022a00";
    const HEX_VOTE_ANSWER: &str = "00080300010107022a";
    const HEX_SNAPSHOT_HEADER: &str = concat!(
        "57000000000000000702010107022a0107022a0103010203030115687474703a2f2f3132372e302e302e",
        "313a373030310215687474703a2f2f3132372e302e302e313a373030320315687474703a2f2f3132372e",
        "302e302e313a3730303300",
    );

    /// Decodes `hex` as a `T` that has no `PartialEq`, checks it reads as `want` (by its
    /// `Debug`) and that it encodes again to the same bytes.
    fn same_wire<T>(hex: &str, want: &T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let today = codec::encode(want).expect("encode");
        assert!(
            !hex.is_empty(),
            "no bytes pinned yet; today's are {}",
            codec::hex(&today)
        );
        let bytes = codec::unhex(hex);
        let got: T = codec::decode(&bytes).expect("pinned bytes decode");
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
        assert_eq!(
            codec::hex(&codec::encode(&got).expect("encode")),
            hex,
            "encoding changed"
        );
        assert_eq!(codec::hex(&today), hex, "encoding changed");
    }

    /// Node-to-node RPC bodies as today's code encodes them (bincode through `codec`, as
    /// `raft::network` sends them and `peer` reads them): they decode and encode again byte for
    /// byte. They carry no version of their own (openraft's types): a change here means nodes
    /// of the two versions cannot talk, so a cluster upgrade must stop every node first
    /// (ARCHITECTURE.md, "Why openraft"); this test makes such a change visible.
    #[test]
    fn rpc_bodies_read_back_and_write_again_byte_for_byte() {
        use openraft::error::RaftError;
        use openraft::raft::{
            AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse,
        };

        use crate::raft::network::SnapshotHeader;
        use crate::state::{Command, NewRecord, Publish};

        let publish = LogPayload::V1(Batch {
            timestamp_ms: 1_764_480_000_123,
            commands: vec![Command::Publish(Publish {
                topic: "orders".into(),
                records: vec![NewRecord {
                    key: Some("k".into()),
                    headers: vec![("h".into(), "v".into())],
                    value: b"hello".to_vec(),
                }],
                producer: None,
            })],
        });
        let append = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(7, 2),
            prev_log_id: Some(log_id(41)),
            entries: vec![Entry {
                log_id: log_id(42),
                payload: EntryPayload::Normal(publish),
            }],
            leader_commit: Some(log_id(40)),
        };
        same_wire(HEX_APPEND, &append);
        // A batch publish: its records one length and the batch's bytes, as received.
        let batch = crate::state::encode_records(&[NewRecord {
            key: Some("k".into()),
            headers: vec![("h".into(), "v".into())],
            value: b"hello".to_vec(),
        }]);
        let append_batch = AppendEntriesRequest::<TypeConfig> {
            entries: vec![Entry {
                log_id: log_id(42),
                payload: EntryPayload::Normal(LogPayload::V1(Batch {
                    timestamp_ms: 1_764_480_000_123,
                    commands: vec![Command::PublishBatch(crate::state::PublishBatch {
                        topic: "orders".into(),
                        batches: batch.clone().into(),
                        producer: None,
                    })],
                })),
            }],
            ..append.clone()
        };
        same_wire(HEX_APPEND_BATCH, &append_batch);
        let encoded = codec::encode(&append_batch).expect("encode");
        assert!(
            encoded.windows(batch.len()).any(|w| w == batch),
            "the batch's bytes are in the request as they are"
        );
        // Answers go back as the Raft call's result.
        type Answer = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>;
        let answers: Vec<Answer> = vec![
            Ok(AppendEntriesResponse::Success),
            Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(42)))),
            Ok(AppendEntriesResponse::Conflict),
            Ok(AppendEntriesResponse::HigherVote(Vote::new(8, 3))),
        ];
        for (hex, answer) in HEX_APPEND_ANSWERS.iter().zip(&answers) {
            same_wire(hex, answer);
        }
        same_wire(
            HEX_VOTE,
            &VoteRequest::<TypeConfig>::new(Vote::new(8, 3), Some(log_id(42))),
        );
        let granted: Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>> =
            Ok(VoteResponse::new(Vote::new(8, 3), Some(log_id(42)), true));
        same_wire(HEX_VOTE_ANSWER, &granted);
        let header = SnapshotHeader {
            vote: Vote::new_committed(7, 2),
            meta: SnapshotMeta {
                last_log_id: Some(log_id(42)),
                last_membership: StoredMembership::new(Some(log_id(42)), membership()),
            },
        };
        let framed = header.frame().expect("frame");
        assert_eq!(
            codec::hex(&framed),
            HEX_SNAPSHOT_HEADER,
            "snapshot header frame changed"
        );
        let (back, end) = SnapshotHeader::parse_frame(&framed, 1 << 20)
            .expect("parse")
            .expect("whole");
        assert_eq!(end, framed.len());
        assert_eq!(back.frame().expect("frame"), framed);
    }
}
