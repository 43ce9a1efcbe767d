#!/usr/bin/env bash
# The chaos suite's negative control: proves the suite can see lost acknowledged writes.
#
#   scripts/negative-control.sh [DURATION]     (default 10s)
#
# Builds `raftq-negative-control-unsafe` (negative-control/: the server with its RocksDB WAL
# switched off, a separate binary so the real `raftq` never has that option), runs the
# coordinated crash of every node (kill-all) with the queue workload against it, and succeeds
# only when the checkers judge the run INVALID. A suite that calls this run valid proves
# nothing, and this script fails.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

DURATION="${1:-10s}"

banner "negative control: build the no-WAL server"
ensure_build_deps
# Its own workspace (so its feature never reaches the real binary), resolved exactly like the
# main one so that RocksDB's build is shared: start from the main lock file every time.
cp Cargo.lock negative-control/Cargo.lock
cargo build --release --manifest-path negative-control/Cargo.toml
BIN="$CARGO_TARGET_DIR/release/raftq-negative-control-unsafe"

status=0
RAFTQ_BIN="$BIN" scripts/chaos.sh "$DURATION" --scenarios kill-all || status=$?
case $status in
    1) ok "negative control: the checkers judged the no-WAL run INVALID, as they must" ;;
    0) die "negative control: the no-WAL run was judged VALID; the chaos suite cannot see loss" ;;
    *) die "negative control: the harness failed (exit $status)" ;;
esac
