#!/usr/bin/env bash
# Benchmarks a fresh local three-node cluster with the four standard workloads.
#
#   scripts/bench.sh [ARGS...]      ARGS go to `raftq bench`, e.g. `--n 20000 --workloads p1,p3`
#
# Starts a three-node cluster on 127.0.0.1:7001-7003 in a data directory of its own (wiped
# before and after), measures the disk's fsync ceiling in that directory, runs P1 to P4
# (`REPEAT` times, default 3, watching each node's resident memory) and stops the cluster.
# Results: bench-results/bench-<UTC time>.jsonl (one JSON object per workload and run) and
# bench-results/bench-<UTC time>.txt (the table), also printed.
#
# Environment:
#   REPEAT           rounds of the workloads (default 3: memory must not grow across rounds)
#   RAFTQ_BENCH_DIR  data directory of the benchmark cluster (default: bench-data/ in the
#                    repository root)
#   RAFTQ_BIN        use this binary instead of building one
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

REPEAT="${REPEAT:-3}"
export RAFTQ_DATA_DIR="${RAFTQ_BENCH_DIR:-$RAFTQ_ROOT/bench-data}"
RESULTS="$RAFTQ_ROOT/bench-results"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="$RESULTS/bench-$STAMP.jsonl"
TABLE="$RESULTS/bench-$STAMP.txt"

for port in 7001 7002 7003; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "something already listens on 127.0.0.1:$port: stop it first (scripts/cluster.sh down), or run \`raftq bench\` against that cluster yourself"
    fi
done

ensure_build_deps
mkdir -p "$RESULTS"
scripts/cluster.sh wipe >/dev/null
cleanup() {
    scripts/cluster.sh down >/dev/null 2>&1 || true
    scripts/cluster.sh wipe >/dev/null 2>&1 || true
}
trap cleanup EXIT
scripts/cluster.sh up
# The cluster requires its API token (RAFTQ_TOKEN if it was set, else the generated one).
RAFTQ_TOKEN="$(<"$RAFTQ_DATA_DIR/api.token")"
export RAFTQ_TOKEN

bin="$(server_binary)"
pids=()
for id in 1 2 3; do
    pids+=(--watch-pid "$(<"$RAFTQ_DATA_DIR/node$id.pid")")
done

banner "disk: 4 KiB and 1 MiB appends, each followed by fdatasync, in $RAFTQ_DATA_DIR"
"$bin" bench --workloads disk --disk-dir "$RAFTQ_DATA_DIR" --out "$OUT" | tee "$TABLE"
banner "P1 to P4, $REPEAT rounds"
"$bin" bench --repeat "$REPEAT" "${pids[@]}" --out "$OUT" "$@" | tee -a "$TABLE"
{
    echo
    echo "host: $(nproc) cores, $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(uname -r); $(git rev-parse --short HEAD 2>/dev/null || echo "no git")"
} | tee -a "$TABLE"
ok "results: $OUT and $TABLE"
