//! raftq: a replicated message queue on Raft that never loses an acknowledged message.
//!
//! # Layout
//! - [`admin`]: `raftq token`, `backup` and `restore`, which work on a node's files and secrets.
//! - [`config`]: settings of `raftq serve` from flags, environment and TOML.
//! - [`metrics`]: Prometheus metrics at `/metrics`.
//! - [`server`]: one node's process: start-up, background tasks, graceful shutdown.
//! - [`node`]: this node's replica as the layers above see it: propose and wait, read the
//!   applied state, status.
//! - [`peer`]: the node-to-node RPC, server side (`/raft/*`).
//! - [`api`]: the public HTTP API (API.md), one module per endpoint family.
//! - [`tokens`]: API tokens (stored as hashes) and the actions they grant on topics.
//! - [`proposer`]: group commit, many client commands per Raft entry.
//! - [`clock`]: the entry clock the leader stamps, which no single wall clock can make leap.
//! - [`raft`]: openraft types, Raft settings and the node-to-node RPC's client side.
//! - [`state`]: the pure state machine (the `raftq-state` crate): commands, apply, and the
//!   types stored on disk.
//! - [`store`]: RocksDB: the Raft log, Raft metadata, the state machine, snapshots, the data
//!   directory's identity and lock.
//! - [`tls`]: rustls for the served port and for calls to peers.
//! - [`codec`]: the one binary codec for disk and network, with decode limits.
//!
//! See ARCHITECTURE.md for the invariants and boundaries.

pub mod admin;
pub mod api;
pub mod clock;
pub mod codec;
pub mod config;
pub mod dashboard;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod proposer;
pub mod raft;
pub mod rejoin;
pub mod server;
pub mod store;
pub mod tls;
pub mod tokens;

/// The state machine, from its own crate (`raftq-state`, beside this one).
pub use raftq_state as state;

#[cfg(test)]
mod fuzz_tests;
