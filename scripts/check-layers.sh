#!/usr/bin/env bash
# Checks the import rules of ARCHITECTURE.md ("Layers"): no import circle between the modules of
# any crate, the server's modules import only down their layers, and the state machine crate
# depends on serde, serde_bytes and thiserror alone. The rules live in tests/layers.rs; this runs
# that test alone (scripts/test.sh runs it with the rest).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$RAFTQ_ROOT"
ensure_build_deps
cargo test --release -p raftq --test layers
