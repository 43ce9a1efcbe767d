#!/usr/bin/env bash
# Runs the fuzz targets (src/fuzz_tests.rs) far longer than `cargo test` does.
#
#   scripts/fuzz.sh [CASES]     cases per target (default 100000; `cargo test` runs 256)
#
# Every decoder of outside bytes is a target: Raft RPC bodies and peers' answers, the snapshot
# transfer's header and file, values read back from disk, client request bodies, query
# strings, receipts, paths and tokens files. A target fails when any input makes its decoder
# panic; proptest then shrinks the input and prints it.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

CASES="${1:-100000}"
[[ "$CASES" =~ ^[0-9]+$ && "$CASES" -gt 0 ]] || die "CASES must be a positive number, not $CASES"
ensure_build_deps
banner "fuzz targets, $CASES cases each"
RAFTQ_FUZZ_CASES="$CASES" cargo test --release --lib fuzz_ -- --test-threads 2
