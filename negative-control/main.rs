//! `raftq` acknowledging before fsync: the chaos suite's negative control. Same command line.
include!("../src/main.rs");
