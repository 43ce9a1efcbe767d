//! Subscriptions against a real three-node cluster (API.md "Subscriptions",
//! docs/subscriptions.md): create/get/delete and refusals, leased pull of the lowest offsets,
//! acks moving the cursor (the ack floor), nack with and without delay, extend, lease expiry
//! decided by the replicated state machine (the leader ticks on its own), dead letters,
//! leases across a leader change, four competing consumers through two leader SIGKILLs, and
//! stream reads that move the cursor.
//!
//! Everything goes through raw HTTP (redirects disabled) so that status codes, problem codes
//! and `Location` headers are checked exactly. Writes go to the leader; a 307 or 503 (definite
//! refusals) is retried against the leader found again.
//!
//! # Layout
//! - `http`: raw HTTP requests and answers, shared by every test.
//! - `crud`: create, get, delete, and every refusal.
//! - `leases`: pull, ack, nack, extend, lease expiry, leases across a leader change.
//! - `dead_letters`: `max_deliveries` and the dead-letter topic.
//! - `consumers`: four competing consumers through two leader SIGKILLs, their pulls and acks
//!   recorded as a chaos-suite history.
//! - `history`: how that history is judged (the chaos suite's queue checker, plus what it
//!   does not look at), and a negative control of the judge.
//! - `cursors`: stream reads through a subscription move its cursor.

#[path = "../common/mod.rs"]
mod common;

mod consumers;
mod crud;
mod cursors;
mod dead_letters;
mod history;
mod http;
mod leases;

use serde::Deserialize;

// The answers the tests read field by field, defined at the crate root so that every module
// sees their fields.

/// One HTTP answer, fully read.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    location: Option<String>,
    content_type: String,
    body: String,
}

/// The fields API.md promises in `GET .../subscriptions/{sub}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
struct SubState {
    cursor: u64,
    backlog: u64,
    in_flight: u64,
    delivered: u64,
    acked: u64,
    redelivered: u64,
    dead_lettered: u64,
}
