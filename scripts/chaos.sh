#!/usr/bin/env bash
# Runs raftq's chaos suite: a matrix of fault scenarios against a three-node cluster on separate
# hosts (network namespaces, or Docker containers), each judged by the checkers, and prints the
# results table.
#
#   scripts/chaos.sh [DURATION] [MATRIX ARGS...]
#
#   DURATION      how long each scenario's workload and faults run (default 30s; 45s, 2m, ...)
#   MATRIX ARGS   passed to `raftq-jepsen matrix`, e.g. --scenarios kill-leader,partition-ring
#                 --workload stream --seed 7 --hosts docker
#
# Environment:
#   RAFTQ_BIN          use this server binary instead of building one
#   CHAOS_WORKLOAD     queue (default) or stream
#   CHAOS_HOSTS        netns (default: network namespaces) or docker (containers on a private
#                      Docker network, from an image built out of the server binary; needs a
#                      running Docker daemon, pulls nothing)
#   CHAOS_OUT          the output directory (default: chaos-runs/<timestamp>/)
#
# Builds `raftq` and `raftq-jepsen` (release, into CARGO_TARGET_DIR, see lib.sh), installs
# iproute2, iptables and faketime when missing, and runs the matrix as root (through sudo when
# needed: namespaces, veths, a bridge, containers' namespaces, iptables rules and FUSE mounts
# need it). Everything a run creates on the machine is removed at the end, on Ctrl-C, and at
# the start of the next run: with netns the namespaces rqj-n*, the bridge rqj0 and one FORWARD
# rule (traffic stays on 10.231.0.0/24); with docker the containers rqj-n*, the network rqj-net
# (bridge rqjd0, 10.232.0.0/24), one FORWARD rule and the image raftq-jepsen:local.
# Without a matrix argument the whole matrix runs: every scenario, the netem ones (packet
# delay, loss, reordering), the membership ones (membership-demote: a follower demoted to
# learner for the fault window; membership-transfer: leadership moved every 1-2 s) and the
# disk and clock ones included. powerloss-all, powerloss-leader, disk-full and slow-fsync put
# every node's data directory on a fault disk (a FUSE file system served by the harness: needs
# /dev/fuse, and mounts as root without fusermount3); clock-jump and clock-strobe run every
# node under libfaketime (Debian's faketime package). With --hosts docker those scenarios say
# they are not supported, and the run fails (fault_not_applied).
# Results go to chaos-runs/<timestamp>/ in the repository: per scenario history.jsonl,
# results.json and the node logs; summary.md holds the table.
#
# Exit status: 0 when every scenario is valid, 1 when a checker found an anomaly, 2 when the
# harness failed.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

DURATION="${1:-30s}"
[[ $# -gt 0 ]] && shift
WORKLOAD="${CHAOS_WORKLOAD:-queue}"
HOSTS_ARGS=()
case "${CHAOS_HOSTS:-}" in
    "") ;;
    netns | docker) HOSTS_ARGS=(--hosts "$CHAOS_HOSTS") ;;
    *) die "CHAOS_HOSTS must be netns or docker, not '$CHAOS_HOSTS'" ;;
esac
# The kind of hosts in use, also when given as a matrix argument (--hosts docker).
HOSTS="${CHAOS_HOSTS:-netns}"
prev=""
for arg in "$@"; do
    case "$arg" in --hosts=*) HOSTS="${arg#--hosts=}" ;; esac
    [[ "$prev" == --hosts ]] && HOSTS="$arg"
    prev="$arg"
done

banner "setup"
ensure_apt_packages iproute2 iptables faketime
if [[ "$HOSTS" == docker ]] && ! command -v docker >/dev/null 2>&1; then
    die "docker hosts need Docker (the engine and its CLI) with a running daemon"
fi
if [[ -z "${RAFTQ_BIN:-}" ]]; then
    ensure_build_deps
    if rocksdb_cold; then
        info "No RocksDB build in $CARGO_TARGET_DIR yet: the first build may take ~15 minutes."
    fi
    cargo build --release --bin raftq
    RAFTQ_BIN="$CARGO_TARGET_DIR/release/raftq"
else
    ensure_cargo
fi
cargo build --release -p raftq-jepsen
[[ -x "$RAFTQ_BIN" ]] || die "no server binary at $RAFTQ_BIN"

OUT="${CHAOS_OUT:-$RAFTQ_ROOT/chaos-runs/$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd -P)"
banner "chaos matrix: $DURATION per scenario, $WORKLOAD workload, $HOSTS hosts, into ${OUT#"$RAFTQ_ROOT"/}"
status=0
_as_root "$CARGO_TARGET_DIR/release/raftq-jepsen" matrix \
    --raftq-bin "$RAFTQ_BIN" \
    --workload "$WORKLOAD" \
    --duration "$DURATION" \
    --out "$OUT" \
    ${HOSTS_ARGS[@]+"${HOSTS_ARGS[@]}"} \
    "$@" || status=$?

case $status in
    0) ok "every scenario valid" ;;
    1) warn "a checker found an anomaly: see $OUT/*/results.json" ;;
    130) warn "interrupted" ;;
    *) warn "the harness failed (exit $status): see the output above and $OUT" ;;
esac
exit "$status"
