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
//! - [`nemesis`]: faults applied to the hosts: kills (one node, or every node by one signal),
//!   pauses, partitions (one-way ones too), packet delay, loss and reordering; membership
//!   changes through the cluster's API (a follower demoted to learner, with or without a kill
//!   while the change is in flight; leadership transfers); power loss (every unsynced write
//!   dropped, on every node at once or on a leader whose fsyncs were slowed), damaged files,
//!   a full disk and stalled fsyncs (on fault disks, `raftq-faultfs`); a wall clock stepped or
//!   strobing (libfaketime). A fault that cannot be applied, or a scenario in which none was,
//!   fails the run.
//! - [`workload`]: clients that drive the cluster and record the history, and the end of every
//!   run: the final drain, the final reads and the comparison of every node's state digest.
//! - [`plot`]: a picture of a run (SVG): throughput and latency over time, faults shaded.

pub mod checker;
pub mod history;
pub mod hosts;
pub mod nemesis;
pub mod plot;
pub mod workload;
