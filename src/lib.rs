//! raftq: a replicated message queue on Raft that never loses an acknowledged message.
//!
//! # Layout
//! - [`config`]: settings of `raftq serve` from flags, environment and TOML.
//! - [`metrics`]: Prometheus metrics at `/metrics`.
//! - [`node`]: one running node: storage, Raft, HTTP, cluster formation, graceful shutdown.
//! - [`api`]: the public HTTP API (API.md), one module per endpoint family.
//! - [`auth`]: API tokens (stored as hashes) and the actions they grant on topics.
//! - [`proposer`]: group commit, many client commands per Raft entry.
//! - [`clock`]: the entry clock the leader stamps, which no single wall clock can make leap.
//! - [`raft`]: openraft types and the node-to-node RPC (client and server side).
//! - [`state`]: the pure state machine: commands, apply, and the types stored on disk.
//! - [`store`]: RocksDB: the Raft log, Raft metadata, the state machine, snapshots, the data
//!   directory's identity and lock.
//! - [`tls`]: rustls for the served port and for calls to peers.
//! - [`codec`]: the one binary codec for disk and network, with decode limits.
//!
//! See ARCHITECTURE.md for the invariants and boundaries.

pub mod api;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod codec;
pub mod config;
pub mod dashboard;
pub mod metrics;
pub mod node;
pub mod proposer;
pub mod raft;
pub mod rejoin;
pub mod state;
pub mod store;
pub mod tls;

#[cfg(test)]
mod fuzz_tests;
