#!/usr/bin/env bash
# Fuzzes the HTTP API against its own OpenAPI description: starts one node that requires an
# API token, and lets Schemathesis (property-based, from the description at /v1/openapi.json)
# send it generated requests, valid and invalid. Every answer must be
#   - no 5xx (not_a_server_error),
#   - a status the operation documents (status_code_conformance),
#   - of a documented content type (content_type_conformance),
#   - a body that matches the documented schema (response_schema_conformance),
#   - and, for every status from 400 up, an application/problem+json problem with the
#     answer's status and a documented code (scripts/api-fuzz-hooks.py).
#
#   scripts/api-fuzz.sh [MAX_EXAMPLES]    at most MAX_EXAMPLES generated cases per operation
#                                         and phase (default 100: under a minute, once built)
#
# Environment:
#   RAFTQ_BIN        use this server binary instead of building one
#   RAFTQ_FUZZ_SEED  Schemathesis' random seed (default: a new one, printed, to replay a run)
#
# Schemathesis is installed, pinned, into a virtualenv under ~/.cache/raftq/ (python3-venv is
# installed when missing). The node starts with a topic, records and a subscription with leased
# records, whose names and receipts the fuzzer uses half the time. Every operation but the
# deletes is fuzzed first, then the deletes. POST /v1/cluster/nodes is not fuzzed: adding a
# learner at a made-up URL waits a minute for it to catch up and leaves the one-node cluster
# with a dead member. The node and its data directory are removed on exit.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SCHEMATHESIS_VERSION=4.32.5
VENV="$HOME/.cache/raftq/api-fuzz-venv"
MAX_EXAMPLES="${1:-100}"
[[ "$MAX_EXAMPLES" =~ ^[1-9][0-9]*$ ]] || die "MAX_EXAMPLES must be a positive integer, not $MAX_EXAMPLES"
SEED="${RAFTQ_FUZZ_SEED:-$(od -An -tu4 -N4 /dev/urandom | tr -d ' ')}"
[[ "$SEED" =~ ^[0-9]+$ ]] || die "RAFTQ_FUZZ_SEED must be a non-negative integer, not $SEED"
READY_SECS=60
STOP_TIMEOUT_SECS=20

# The Python the virtualenv is made with: the system's, whose venv module comes from
# python3-venv on Debian.
system_python() {
    if [[ -x /usr/bin/python3 ]]; then echo /usr/bin/python3; else command -v python3; fi
}

ensure_schemathesis() {
    local python
    if [[ -x "$VENV/bin/schemathesis" ]] &&
        [[ "$("$VENV/bin/schemathesis" --version 2>/dev/null)" == *"version $SCHEMATHESIS_VERSION" ]]; then
        return 0
    fi
    ensure_apt_packages python3 python3-venv
    python="$(system_python)"
    [[ -n "$python" ]] || die "no python3 found"
    info "installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "schemathesis==$SCHEMATHESIS_VERSION"
    [[ "$("$VENV/bin/schemathesis" --version)" == *"version $SCHEMATHESIS_VERSION" ]] ||
        die "schemathesis $SCHEMATHESIS_VERSION did not install into $VENV"
}


WORK=""
NODE_PID=""
FAILED=1

cleanup() {
    local waited=0
    if [[ -n "$NODE_PID" ]] && kill -0 "$NODE_PID" 2>/dev/null; then
        kill -TERM "$NODE_PID" 2>/dev/null || true
        while kill -0 "$NODE_PID" 2>/dev/null && ((waited < STOP_TIMEOUT_SECS * 10)); do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$NODE_PID" 2>/dev/null; then
            warn "the node (pid $NODE_PID) did not stop within ${STOP_TIMEOUT_SECS}s; sending SIGKILL"
            kill -KILL "$NODE_PID" 2>/dev/null || true
        fi
        wait "$NODE_PID" 2>/dev/null || true
    fi
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if [[ $FAILED -ne 0 && -f "$WORK/node.log" ]]; then
            printf '\n--- last lines of the node log ---\n' >&2
            tail -n 40 "$WORK/node.log" >&2 || true
        fi
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ensure_apt_packages curl ca-certificates
ensure_schemathesis
build_raftq
bin="$(server_binary)"
[[ -x "$bin" ]] || die "no server binary at $bin"

banner "one node with an API token"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/raftq-api-fuzz.XXXXXX")"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/cluster.secret"
TOKEN="rq_$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
printf '[[token]]\nname = "api-fuzz"\nsha256 = "%s"\ngrants = ["admin:*"]\n' \
    "$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)" >"$WORK/tokens.toml"
PORT="$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"

# The command line alone describes the node: no RAFTQ_* settings leak in from this shell.
unset_env=()
for var in $(compgen -e); do
    [[ "$var" == RAFTQ_* ]] && unset_env+=(-u "$var")
done
env "${unset_env[@]}" "$bin" serve \
    --id 1 \
    --listen "127.0.0.1:$PORT" \
    --data "$WORK/node1" \
    --peers "1=$URL" \
    --cluster-secret-file "$WORK/cluster.secret" \
    --tokens-file "$WORK/tokens.toml" \
    --cluster-id api-fuzz \
    </dev/null >"$WORK/node.log" 2>&1 &
NODE_PID=$!
info "node 1 (pid $NODE_PID) at $URL, data and log in $WORK"

waited=0
until curl -fsS --noproxy '*' --max-time 2 "$URL/readyz" >/dev/null 2>&1; do
    kill -0 "$NODE_PID" 2>/dev/null || die "the node exited before it was ready"
    ((waited < READY_SECS * 10)) || die "the node was not ready after ${READY_SECS}s"
    sleep 0.1
    waited=$((waited + 1))
done
# Ours, not another process that had the port first: it is alive and knows our token.
kill -0 "$NODE_PID" 2>/dev/null || die "the node exited; is port $PORT taken?"
curl -fsS --noproxy '*' --max-time 2 -H "Authorization: Bearer $TOKEN" "$URL/v1/cluster" >/dev/null ||
    die "the server at $URL does not take this run's token: not the node this script started"
ok "ready"

# A topic with records and a subscription with leased records, offered to the fuzzer besides
# the names and receipts it makes up: without them nearly every generated request would stop
# at 404, or at a receipt raftq never issued, before the code worth testing.
api() {
    local method="$1" path="$2" data=()
    [[ $# -ge 3 ]] && data=(-H 'Content-Type: application/json' --data "$3")
    curl -fsS --noproxy '*' --max-time 10 -X "$method" -H "Authorization: Bearer $TOKEN" \
        "${data[@]}" "$URL$path"
}
api PUT /v1/topics/fuzz >/dev/null
api PUT /v1/topics/fuzz/subscriptions/workers >/dev/null
api POST /v1/topics/fuzz/records \
    '{"records": [{"value": "a"}, {"value": "b", "key": "k", "headers": {"h": "v"}}, {"value_b64": "//79"}]}' >/dev/null
receipts="$(api POST /v1/topics/fuzz/subscriptions/workers/pull '{"max": 2, "ack_timeout_ms": 600000}' |
    "$VENV/bin/python" -c 'import json, sys; print(json.dumps([m["receipt"] for m in json.load(sys.stdin)["messages"]]))')"
cat >"$WORK/schemathesis.toml" <<EOF
[dictionaries.topics]
values = ["fuzz"]

[dictionaries.subscriptions]
values = ["workers"]

[dictionaries.receipts]
values = $receipts

[parameters]
"path.topic" = { dictionary = "topics", probability = 0.5 }
"path.sub" = { dictionary = "subscriptions", probability = 0.5 }
"query.subscription" = { dictionary = "subscriptions", probability = 0.5 }
"body.receipts[*]" = { dictionary = "receipts", probability = 0.5 }
EOF
info "topic fuzz with 3 records, subscription workers with receipts $receipts"

# Long-polls (wait_ms up to 30 s) are slow, not wrong: the request timeout leaves them room.
# Schemathesis runs in the work directory, where it keeps its cache, removed on exit.
fuzz() {
    (
        cd "$WORK"
        SCHEMATHESIS_HOOKS="$RAFTQ_ROOT/scripts/api-fuzz-hooks.py" \
            "$VENV/bin/schemathesis" --config-file "$WORK/schemathesis.toml" \
            run "$URL/v1/openapi.json" \
            --header "Authorization: Bearer $TOKEN" \
            --checks "$CHECKS" \
            --exclude-operation-id add_node \
            --max-examples "$MAX_EXAMPLES" \
            --seed "$SEED" \
            --request-timeout 40 \
            --generation-database none \
            --no-color \
            "$@"
    )
}
CHECKS=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,problem_with_documented_code

# Everything but the deletes first, so the topic and subscription above stay for the others
# (the stateful phase would otherwise delete them early through the links it infers), then
# the deletes.
banner "schemathesis $SCHEMATHESIS_VERSION: at most $MAX_EXAMPLES examples per operation, seed $SEED"
fuzz --exclude-operation-id delete_topic --exclude-operation-id delete_subscription
banner "schemathesis $SCHEMATHESIS_VERSION: the deletes"
fuzz --include-operation-id delete_topic --include-operation-id delete_subscription
kill -0 "$NODE_PID" 2>/dev/null || die "the node is gone after the run"
FAILED=0
ok "API fuzzing passed (seed $SEED)"
