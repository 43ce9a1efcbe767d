#!/usr/bin/env bash
# Runs a local three-node raftq cluster on 127.0.0.1:7001-7003.
#
#   scripts/cluster.sh up            build (release), start the nodes that are not running, wait for a leader
#   scripts/cluster.sh down          stop the nodes this script started (SIGTERM, then SIGKILL after 20 s)
#   scripts/cluster.sh status        running/stopped per node and each node's view of the cluster
#   scripts/cluster.sh logs [N] [-f] last 100 lines of one node's log, or of all of them
#   scripts/cluster.sh wipe          down, then delete the data directory
#
# Environment:
#   RAFTQ_BIN       use this server binary instead of building one
#   RAFTQ_DATA_DIR  data directory (default: data/ in the repository root)
#   RAFTQ_WAIT_SECS how long `up` waits for a leader (default 60)
#   RAFTQ_TOKEN     the API token to configure (granted admin:*); by default one is generated
#   RAFTQ_BASE_PORT nodes listen on BASE+1 to BASE+3 (default 7000: ports 7001-7003)
#
# The API needs a token: `up` prints it, and keeps it in api.token in the data directory
# (`export RAFTQ_TOKEN=$(cat data/api.token)`; the CLI, the SDK and curl examples use it).
#
# The three nodes share this machine: each runs one runtime worker (`--worker-threads 1`), which
# spends less CPU switching between them than a worker per core each (docs/performance.md).
#
# Everything lives in the data directory: nodeN/ (the node's storage), nodeN.log (its stdout
# and stderr), nodeN.pid, nodeN.cmd (its exact command line, shell-quoted, so a test can kill a
# node and start it again with the same arguments), cluster.secret, cluster.id, api.token and
# tokens.toml (generated once per local cluster; a restart reuses them and the data).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODE_IDS=(1 2 3)
HOST=127.0.0.1
BASE_PORT="${RAFTQ_BASE_PORT:-7000}"
[[ "$BASE_PORT" =~ ^[0-9]+$ && "$BASE_PORT" -ge 1 && "$BASE_PORT" -le 65532 ]] ||
    { echo "RAFTQ_BASE_PORT must be a port number (1 to 65532), not $BASE_PORT" >&2; exit 2; }
STOP_TIMEOUT_SECS=20
WAIT_SECS="${RAFTQ_WAIT_SECS:-60}"

DATA_DIR="${RAFTQ_DATA_DIR:-$RAFTQ_ROOT/data}"
# Absolute, so the recorded command lines work from any directory.
DATA_DIR="$(realpath -m -- "$DATA_DIR")"

port_of() { echo $((BASE_PORT + $1)); }
url_of() { echo "http://$HOST:$(port_of "$1")"; }
pid_file() { echo "$DATA_DIR/node$1.pid"; }
log_file() { echo "$DATA_DIR/node$1.log"; }
cmd_file() { echo "$DATA_DIR/node$1.cmd"; }

peers() {
    local id out=()
    for id in "${NODE_IDS[@]}"; do out+=("$id=$(url_of "$id")"); done
    (IFS=,; echo "${out[*]}")
}

# True when PID is node N: a live raftq process serving N's data directory. A zombie (empty
# cmdline), or a recycled pid that now belongs to anything else, is not.
is_node_pid() {
    local id="$1" pid="$2" argv=() i is_raftq=1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    mapfile -d '' -t argv 2>/dev/null <"/proc/$pid/cmdline" || return 1
    for ((i = 0; i < ${#argv[@]}; i++)); do
        [[ "${argv[i]}" == *raftq* ]] && is_raftq=0
    done
    [[ $is_raftq -eq 0 ]] || return 1
    for ((i = 0; i < ${#argv[@]}; i++)); do
        [[ "${argv[i]}" == "--data=$DATA_DIR/node$id" ]] && return 0
        [[ "${argv[i]}" == --data && "${argv[i + 1]:-}" == "$DATA_DIR/node$id" ]] && return 0
    done
    return 1
}

# Prints the pid of node N when it is running; fails otherwise. The pid file comes first; a
# node started again from nodeN.cmd by someone else (a test that kill -9s and restarts nodes)
# is found by its command line and its pid file brought up to date, so `down` stops it too.
running_pid() {
    local id="$1" file pid dir
    file="$(pid_file "$id")"
    if [[ -f "$file" ]]; then
        pid="$(<"$file")"
        if is_node_pid "$id" "$pid"; then
            echo "$pid"
            return 0
        fi
    fi
    for dir in /proc/[0-9]*; do
        pid="${dir#/proc/}"
        [[ "$pid" != "$$" && "$pid" != "$BASHPID" ]] || continue
        if is_node_pid "$id" "$pid"; then
            [[ -d "$DATA_DIR" ]] && echo "$pid" >"$file"
            echo "$pid"
            return 0
        fi
    done
    return 1
}

# True when something accepts TCP connections on PORT.
port_in_use() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# json_field KEY JSON: the first value of KEY (string unquoted, null as "null"), or nothing.
# Enough for the flat scalar fields of GET /v1/cluster without requiring jq.
json_field() {
    local matches
    matches="$(grep -o "\"$1\"[[:space:]]*:[[:space:]]*\(\"[^\"]*\"\|[^,}[:space:]]*\)" <<<"$2" || true)"
    matches="${matches%%$'\n'*}"
    [[ -n "$matches" ]] || return 0
    matches="${matches#*:}"
    matches="${matches#"${matches%%[![:space:]]*}"}"
    matches="${matches#\"}"
    echo "${matches%\"}"
}

cluster_json() {
    local auth=()
    [[ -s "$DATA_DIR/api.token" ]] && auth=(-H "Authorization: Bearer $(<"$DATA_DIR/api.token")")
    curl -fsS --noproxy '*' --max-time 2 "${auth[@]}" "$(url_of "$1")/v1/cluster" 2>/dev/null
}

# Prints "ID URL" of the leader as some node reports it; fails when no node knows one.
find_leader() {
    local id json leader
    for id in "${NODE_IDS[@]}"; do
        json="$(cluster_json "$id")" || continue
        leader="$(json_field leader_id "$json")"
        if [[ -n "$leader" && "$leader" != null ]]; then
            echo "$leader $(json_field leader_url "$json")"
            return 0
        fi
    done
    return 1
}


# Creates the data directory, the cluster secret and the cluster id, once.
prepare_data_dir() {
    local id tmp
    mkdir -p "$DATA_DIR"
    for id in "${NODE_IDS[@]}"; do mkdir -p "$DATA_DIR/node$id"; done
    if [[ ! -s "$DATA_DIR/cluster.secret" ]]; then
        tmp="$(umask 077 && mktemp "$DATA_DIR/.cluster.secret.XXXXXX")"
        od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp"
        chmod 600 "$tmp"
        mv -f "$tmp" "$DATA_DIR/cluster.secret"
        info "generated a cluster secret in $DATA_DIR/cluster.secret"
    fi
    chmod 600 "$DATA_DIR/cluster.secret"
    if [[ ! -s "$DATA_DIR/cluster.id" ]]; then
        printf 'local-%s\n' "$(od -An -tx1 -N6 /dev/urandom | tr -d ' \n')" >"$DATA_DIR/cluster.id"
    fi
    prepare_token
}

# The API token: RAFTQ_TOKEN if given, else the one kept from before, else a new one. The
# nodes get only its SHA-256, in tokens.toml.
prepare_token() {
    local token="${RAFTQ_TOKEN:-}" tmp hash
    if [[ -z "$token" && -s "$DATA_DIR/api.token" ]]; then
        token="$(<"$DATA_DIR/api.token")"
    fi
    if [[ -z "$token" ]]; then
        token="rq_$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
        info "generated an API token in $DATA_DIR/api.token"
    fi
    [[ "$token" =~ ^[[:graph:]]+$ ]] || die "RAFTQ_TOKEN must be printable characters without spaces"
    if [[ -s "$DATA_DIR/api.token" && "$(<"$DATA_DIR/api.token")" != "$token" ]]; then
        warn "the API token changes; nodes already running keep the old one until restarted"
    fi
    tmp="$(umask 077 && mktemp "$DATA_DIR/.api.token.XXXXXX")"
    printf '%s\n' "$token" >"$tmp"
    mv -f "$tmp" "$DATA_DIR/api.token"
    hash="$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
    tmp="$(umask 077 && mktemp "$DATA_DIR/.tokens.toml.XXXXXX")"
    printf '# Written by scripts/cluster.sh: the SHA-256 of the token in api.token.\n[[token]]\nname = "local-admin"\nsha256 = "%s"\ngrants = ["admin:*"]\n' \
        "$hash" >"$tmp"
    mv -f "$tmp" "$DATA_DIR/tokens.toml"
}

# The full, self-contained command line of node N, one argument per line.
node_command() {
    local id="$1" bin="$2" cluster_id
    cluster_id="$(<"$DATA_DIR/cluster.id")"
    printf '%s\n' "$bin" serve \
        --id "$id" \
        --listen "$HOST:$(port_of "$id")" \
        --data "$DATA_DIR/node$id" \
        --peers "$(peers)" \
        --cluster-secret-file "$DATA_DIR/cluster.secret" \
        --tokens-file "$DATA_DIR/tokens.toml" \
        --cluster-id "$cluster_id" \
        --worker-threads 1
}

# Prints its arguments as one shell command line: plain words as they are, others in single
# quotes. `bash -c "$(cat nodeN.cmd)"` and Python's shlex.split both read it back.
shell_quote() {
    local arg q="'" out=()
    for arg in "$@"; do
        if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
            out+=("$arg")
        else
            out+=("$q${arg//$q/$q\\$q$q}$q")
        fi
    done
    echo "${out[*]}"
}

start_node() {
    local id="$1" bin="$2" cmd=() log pidf var unset_env=()
    mapfile -t cmd < <(node_command "$id" "$bin")
    log="$(log_file "$id")"
    pidf="$(pid_file "$id")"

    # The command line alone must describe the node: no RAFTQ_* settings leak in from this shell.
    for var in $(compgen -e); do
        [[ "$var" == RAFTQ_* ]] && unset_env+=(-u "$var")
    done

    shell_quote "${cmd[@]}" >"$(cmd_file "$id")"
    printf '\n=== %s cluster.sh: starting node %s: %s\n' "$(date -u +%FT%TZ)" "$id" "$(<"$(cmd_file "$id")")" >>"$log"

    rm -f "$pidf"
    # setsid: own session, so the node outlives this script and the terminal. The inner shell
    # writes its own pid, then execs the server under that same pid.
    # shellcheck disable=SC2016 # $$ and $@ belong to the inner shell
    setsid nohup env "${unset_env[@]}" bash -c 'echo "$$" >"$0"; exec "$@"' "$pidf" "${cmd[@]}" \
        </dev/null >>"$log" 2>&1 &
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s "$pidf" ]] && break
        sleep 0.1
    done
    [[ -s "$pidf" ]] || die "node $id did not start; see $log"
    info "node $id started (pid $(<"$pidf")), $(url_of "$id"), log: $log"
}

print_log_tails() {
    local id
    for id in "${NODE_IDS[@]}"; do
        printf '\n--- last lines of %s ---\n' "$(log_file "$id")" >&2
        tail -n 30 "$(log_file "$id")" >&2 2>/dev/null || echo "(no log)" >&2
    done
}

wait_for_leader() {
    local waited=0 id alive
    printf 'waiting up to %ss for a leader ' "$WAIT_SECS"
    while ! LEADER="$(find_leader)"; do
        alive=0
        for id in "${NODE_IDS[@]}"; do running_pid "$id" >/dev/null && alive=$((alive + 1)); done
        if [[ $alive -eq 0 ]]; then
            echo
            print_log_tails
            die "every node has exited"
        fi
        if ((waited >= WAIT_SECS)); then
            echo
            print_log_tails
            die "no leader after ${WAIT_SECS}s ($alive of ${#NODE_IDS[@]} nodes running; they are left running: scripts/cluster.sh status | logs | down)"
        fi
        printf '.'
        sleep 1
        waited=$((waited + 1))
    done
    echo
}

cmd_up() {
    local id bin pid to_start=()
    # curl talks to the nodes, whether built here or not.
    ensure_apt_packages curl ca-certificates
    build_raftq
    bin="$(server_binary)"
    [[ -x "$bin" ]] || die "no server binary at $bin"
    prepare_data_dir

    for id in "${NODE_IDS[@]}"; do
        if pid="$(running_pid "$id")"; then
            info "node $id is already running (pid $pid)"
        else
            to_start+=("$id")
        fi
    done
    if [[ ${#to_start[@]} -eq 0 ]]; then
        info "the cluster is already running"
    fi
    # Check every port first, so a conflict starts nothing rather than half a cluster.
    for id in "${to_start[@]}"; do
        if port_in_use "$(port_of "$id")"; then
            die "port $(port_of "$id") is taken by another process (see: ss -ltnp 'sport = :$(port_of "$id")'); nothing started"
        fi
    done
    for id in "${to_start[@]}"; do start_node "$id" "$bin"; done

    wait_for_leader
    local leader_id leader_url
    read -r leader_id leader_url <<<"$LEADER"

    echo
    ok "raftq is up. Data: $DATA_DIR"
    for id in "${NODE_IDS[@]}"; do
        info "  node $id: $(url_of "$id")"
    done
    info "  leader: node $leader_id ${leader_url:+($leader_url)}"
    info "  API token (admin:*): $(<"$DATA_DIR/api.token")"
    cat <<EOF

Try it (writes to a follower answer 307; curl --location-trusted follows to the leader and
keeps the token):
  export RAFTQ_TOKEN=\$(cat $DATA_DIR/api.token)
  curl --location-trusted -H "Authorization: Bearer \$RAFTQ_TOKEN" -X PUT localhost:$(port_of 1)/v1/topics/demo
  curl --location-trusted -H "Authorization: Bearer \$RAFTQ_TOKEN" -X POST -H 'content-type: application/json' -d '{"records":[{"value":"hello"}]}' localhost:$(port_of 1)/v1/topics/demo/records
  curl -H "Authorization: Bearer \$RAFTQ_TOKEN" 'localhost:$(port_of 2)/v1/topics/demo/records?from=first'

  scripts/cluster.sh status | logs [N] [-f] | down | wipe
EOF
}

cmd_down() {
    local id pid pids=() waited=0 left entry
    [[ -d "$DATA_DIR" ]] || { info "no data directory at $DATA_DIR; nothing to stop"; return 0; }
    for id in "${NODE_IDS[@]}"; do
        if pid="$(running_pid "$id")"; then
            info "stopping node $id (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$id:$pid")
        elif [[ -f "$(pid_file "$id")" ]]; then
            info "node $id is not running (stale pid file removed)"
            rm -f "$(pid_file "$id")"
        fi
    done
    [[ ${#pids[@]} -eq 0 ]] && { info "no node is running"; return 0; }

    while :; do
        left=()
        for entry in "${pids[@]}"; do is_node_pid "${entry%%:*}" "${entry#*:}" && left+=("$entry"); done
        [[ ${#left[@]} -eq 0 ]] && break
        if ((waited >= STOP_TIMEOUT_SECS * 10)); then
            for entry in "${left[@]}"; do
                warn "node ${entry%%:*} (pid ${entry#*:}) did not stop within ${STOP_TIMEOUT_SECS}s; sending SIGKILL"
                kill -KILL "${entry#*:}" 2>/dev/null || true
            done
            sleep 0.5
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    for entry in "${pids[@]}"; do rm -f "$(pid_file "${entry%%:*}")"; done
    ok "stopped"
}

cmd_status() {
    local id pid json all_running=0 leader term commit applied
    info "data: $DATA_DIR"
    for id in "${NODE_IDS[@]}"; do
        if pid="$(running_pid "$id")"; then
            printf 'node %s  %-8s pid %-7s %s  ' "$id" running "$pid" "$(url_of "$id")"
        else
            printf 'node %s  %-8s %-11s %s  ' "$id" stopped "" "$(url_of "$id")"
            all_running=1
        fi
        if json="$(cluster_json "$id")"; then
            leader="$(json_field leader_id "$json")"
            term="$(json_field term "$json")"
            commit="$(json_field commit_index "$json")"
            applied="$(json_field last_applied "$json")"
            printf 'leader=%s term=%s commit=%s applied=%s\n' \
                "${leader:-?}" "${term:-?}" "${commit:-?}" "${applied:-?}"
        else
            echo "(no answer from /v1/cluster)"
        fi
    done
    return "$all_running"
}

cmd_logs() {
    local follow=() files=() arg id
    for arg in "$@"; do
        case "$arg" in
            -f | --follow) follow=(-F) ;;
            [0-9]*)
                [[ " ${NODE_IDS[*]} " == *" $arg "* ]] || die "no node $arg (nodes: ${NODE_IDS[*]})"
                files+=("$(log_file "$arg")")
                ;;
            *) die "logs: unknown argument $arg (usage: logs [N] [-f])" ;;
        esac
    done
    if [[ ${#files[@]} -eq 0 ]]; then
        for id in "${NODE_IDS[@]}"; do
            [[ -f "$(log_file "$id")" ]] && files+=("$(log_file "$id")")
        done
    fi
    [[ ${#files[@]} -gt 0 ]] || die "no logs in $DATA_DIR"
    exec tail -n 100 "${follow[@]}" "${files[@]}"
}

cmd_wipe() {
    cmd_down
    [[ -d "$DATA_DIR" ]] || { info "nothing to wipe"; return 0; }
    # Refuse to delete a directory this script did not make (RAFTQ_DATA_DIR may point anywhere).
    local entry name
    for entry in "$DATA_DIR"/* "$DATA_DIR"/.[!.]*; do
        [[ -e "$entry" ]] || continue
        name="$(basename "$entry")"
        case "$name" in
            node[0-9]* | cluster.secret | cluster.id | .cluster.secret.* | api.token | tokens.toml | .api.token.* | .tokens.toml.*) ;;
            *) die "refusing to delete $DATA_DIR: it holds $name, which cluster.sh did not create" ;;
        esac
    done
    rm -rf -- "$DATA_DIR"
    ok "deleted $DATA_DIR"
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

main() {
    local command="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$command" in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        logs) cmd_logs "$@" ;;
        wipe) cmd_wipe ;;
        -h | --help | help) usage ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
