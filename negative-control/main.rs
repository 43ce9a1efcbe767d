//! `raftq` with the WAL switched off: the chaos suite's negative control. Same command line.
include!("../src/main.rs");
