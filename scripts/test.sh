#!/usr/bin/env bash
# Runs every check the project has, as CI does: formatting, lints, the test suite, a bounded
# fuzzing of the API against its OpenAPI description, then a bounded subset of the chaos suite.
#
#   scripts/test.sh [ARGS...]     ARGS go to `cargo test`, e.g. `scripts/test.sh -- --nocapture`
#
# Installs what a fresh Debian machine lacks (clang, libclang-dev, curl, chromium, rustfmt, clippy).
# Everything builds with --release (the project's one cargo profile) into CARGO_TARGET_DIR,
# by default ~/.cache/raftq/target, so the slow RocksDB C++ build happens once per machine.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"

step() {
    local name="$1" start=$SECONDS status=0
    shift
    banner "$name"
    "$@" || status=$?
    if [[ $status -ne 0 ]]; then
        printf '%sFAILED%s: %s (exit %s, %ss)\n' "$_red" "$_reset" "$name" "$status" $((SECONDS - start)) >&2
        exit "$status"
    fi
    ok "ok: $name ($((SECONDS - start))s)"
}

banner "setup"
ensure_build_deps
ensure_rust_components rustfmt clippy
# The dashboard test loads the page in headless Chromium.
ensure_apt_packages chromium fonts-dejavu-core
# The clock test runs a node under a fake wall clock (libfaketime).
ensure_apt_packages faketime
info "cargo: $(cargo --version)"
info "target dir: $CARGO_TARGET_DIR"
if rocksdb_cold; then
    info "No RocksDB build in the target dir yet: the first build compiles it (C++) and may take ~15 minutes."
fi

step "cargo fmt --all --check" \
    cargo fmt --all --check
step "cargo clippy --release --workspace --all-targets -- -D warnings" \
    cargo clippy --release --workspace --all-targets -- -D warnings
step "cargo test --release --workspace $*" \
    cargo test --release --workspace "$@"
# The API against its own OpenAPI description: one node, Schemathesis, a bounded run.
step "API fuzzing: Schemathesis against /v1/openapi.json on one node" \
    scripts/api-fuzz.sh
# The chaos subset: a three-node cluster in network namespaces (root, or sudo), each fault
# judged by the queue checker. RAFTQ_SKIP_CHAOS=1 skips it on a machine without namespaces;
# CI always runs it.
if [[ "${RAFTQ_SKIP_CHAOS:-0}" == 1 && "${CI:-}" != true ]]; then
    info "RAFTQ_SKIP_CHAOS=1: chaos subset skipped"
else
    step "chaos subset: kill-leader, kill-all, pause-leader, partition-leader, powerloss-all, powerloss-leader, corrupt-minority, clock-jump (queue, 10 s each)" \
        scripts/chaos.sh 10s --scenarios kill-leader,kill-all,pause-leader,partition-leader,powerloss-all,powerloss-leader,corrupt-minority,clock-jump
    step "chaos negative control: powerloss-all against the early-flush build must lose some, not all, acknowledged records" \
        scripts/negative-control.sh 10s
fi

# The three-node Docker Compose deployment, end to end (needs a running Docker engine).
# RAFTQ_SKIP_DOCKER=1 skips it on a machine without one; CI always runs it.
if [[ "${RAFTQ_SKIP_DOCKER:-0}" == 1 && "${CI:-}" != true ]]; then
    info "RAFTQ_SKIP_DOCKER=1: compose deployment check skipped"
else
    step "compose deployment: image, three healthy nodes, publish and read through each, down" \
        scripts/docker.sh test
fi

ok "all checks passed"
