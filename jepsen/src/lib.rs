//! raftq's chaos suite, in the style of Jepsen.
//!
//! # Layout
//! - [`history`]: the recorded history: every client operation's invoke and completion
//!   (ok / fail / info), process, node and time; JSON lines on disk.
//! - [`checker`]: judges a history: the queue checker (Jepsen's total-queue plus the leased
//!   queue's own properties) and the stream checker (Jepsen's Kafka queue workload).
//! - [`hosts`]: a three-node raftq cluster as separate hosts with their own addresses (Linux
//!   network namespaces with veth pairs, or containers on a private Docker network), behind
//!   the [`hosts::Hosts`] trait.
//! - [`nemesis`]: faults applied to the hosts: kills, pauses, partitions, packet delay, loss
//!   and reordering; and membership changes through the cluster's API (a follower demoted to
//!   learner, leadership transfers).
//! - [`workload`]: clients that drive the cluster and record the history.
//! - [`plot`]: a picture of a run (SVG): throughput and latency over time, faults shaded.

pub mod checker;
pub mod history;
pub mod hosts;
pub mod nemesis;
pub mod plot;
pub mod workload;
