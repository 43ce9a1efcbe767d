//! Consensus wiring: the openraft type configuration, the node-to-node network (client side
//! in [`network`], server side in [`rpc`]) and the Raft settings raftq runs with.

pub mod network;
pub mod rpc;

use std::io;

use openraft::{AnyError, BasicNode, StorageError, StorageIOError};

use crate::state::{ApplyResponse, LogPayload};

openraft::declare_raft_types!(
    /// raftq's Raft types: the log entry payload is a versioned batch of commands, a node is
    /// known by its base URL, and snapshots are files streamed in chunks.
    pub TypeConfig:
        D = LogPayload,
        R = ApplyResponse,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, BasicNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Wraps any displayable storage failure as an openraft I/O error on the given subject.
pub fn io_err(
    f: fn(AnyError) -> StorageIOError<NodeId>,
    e: impl std::fmt::Display,
) -> StorageError<NodeId> {
    StorageError::IO {
        source: f(AnyError::error(e.to_string())),
    }
}

/// Converts a storage error into an `io::Error` for callbacks that want one.
pub fn to_io(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Subject for snapshot write failures (no signature known at that point).
pub fn snap_write(e: AnyError) -> StorageIOError<NodeId> {
    StorageIOError::write_snapshot(None, e)
}

/// Subject for snapshot read failures.
pub fn snap_read(e: AnyError) -> StorageIOError<NodeId> {
    StorageIOError::read_snapshot(None, e)
}
