#!/usr/bin/env bash
# The chaos suite's negative control: proves the suite can see lost acknowledged writes.
#
#   scripts/negative-control.sh [DURATION] [MATRIX ARGS...]     (default 10s)
#
#   MATRIX ARGS   passed on to `raftq-jepsen matrix`, e.g. --seed 7, or --name-prefix and
#                 --subnet to run beside another run on the same machine
#
# Builds `raftq-negative-control-unsafe` (negative-control/: the server built with the
# `negative-control-unsafe-early-flush` feature, which reports log appends flushed before the
# WAL is fsynced and fsyncs only every 500 ms; a separate binary so the real `raftq` never has
# that option), runs the coordinated power loss of every node (powerloss-all: every node
# SIGKILLed by one signal, and every write its disk had not synced dropped) with the queue
# workload against it, and succeeds only when the checkers judge a run INVALID because some,
# but not all, acknowledged records were lost: `lost` or `log.lost` among the failures with
# `0 < lost < acknowledged`, and every fault applied (`raftq-jepsen expect-loss` reads that
# from the run's results.json). A suite that calls this run valid proves nothing; one that only
# sees a wiped cluster proves little; either way this script fails.
#
# Environment:
#   NEGATIVE_CONTROL_BIN   use this build of the negative control instead of building one
#   NEGATIVE_CONTROL_ATTEMPTS  most runs until one shows the loss (default 3)
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

DURATION="${1:-10s}"
[[ $# -gt 0 ]] && shift

if [[ -n "${NEGATIVE_CONTROL_BIN:-}" ]]; then
    BIN="$NEGATIVE_CONTROL_BIN"
    ensure_cargo
else
    banner "negative control: build the early-flush server"
    ensure_build_deps
    # Its own workspace (so its feature never reaches the real binary), resolved exactly like the
    # main one so that RocksDB's build is shared: start from the main lock file every time.
    cp Cargo.lock negative-control/Cargo.lock
    cargo build --release --manifest-path negative-control/Cargo.toml
    BIN="$CARGO_TARGET_DIR/release/raftq-negative-control-unsafe"
fi
[[ -x "$BIN" ]] || die "no negative-control binary at $BIN"

# The loss is a race (acknowledged entries not yet synced anywhere when the power goes), so a
# run may end before it happens: up to ATTEMPTS runs, and one judged lossy as above suffices.
# Each run is judged in full and reported; a harness failure ends the script at once.
ATTEMPTS="${NEGATIVE_CONTROL_ATTEMPTS:-3}"
for attempt in $(seq 1 "$ATTEMPTS"); do
    OUT="$RAFTQ_ROOT/chaos-runs/$(date -u +%Y%m%d-%H%M%S)-negative-control"
    status=0
    RAFTQ_BIN="$BIN" CHAOS_OUT="$OUT" scripts/chaos.sh "$DURATION" --scenarios powerloss-all "$@" ||
        status=$?
    RESULTS="$OUT/powerloss-all-queue/results.json"
    case $status in
        0 | 1) ;;
        *) die "negative control: the harness failed (exit $status)" ;;
    esac
    [[ -f "$RESULTS" ]] || die "negative control: no results at $RESULTS"
    if "$CARGO_TARGET_DIR/release/raftq-jepsen" expect-loss --results "$RESULTS"; then
        ok "negative control: the early-flush run was judged INVALID for losing acknowledged records, as it must (run $attempt of at most $ATTEMPTS)"
        exit 0
    fi
    info "negative control: run $attempt of $ATTEMPTS did not show the loss (see $RESULTS)"
done
die "negative control: no run of $ATTEMPTS was judged lossy"
