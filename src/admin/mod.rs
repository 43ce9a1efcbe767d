//! The commands of the `raftq` binary that work on a node's own files or secrets rather than
//! over the API: `raftq token` (tokens and their tokens-file entries, hashed as [`crate::tokens`]
//! checks them) and `raftq backup` / `raftq restore` (a node's snapshot to a file and back, by
//! [`crate::store::backup`]). The commands that talk to a running cluster are the
//! `raftq-cli` crate's.

pub mod backup;
pub mod token;
