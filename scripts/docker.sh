#!/usr/bin/env bash
# raftq in containers: the image, and the three-node cluster of deploy/docker-compose.yml.
#
#   scripts/docker.sh image          build the image raftq:local from a release build (no registry)
#   scripts/docker.sh up             image, secrets, `up -d`, wait until every node is healthy
#   scripts/docker.sh down [-v]      stop the cluster (-v also deletes its volumes)
#   scripts/docker.sh cli ARGS...    run `raftq ARGS` in a container on the cluster's network,
#                                    with the token, e.g. `scripts/docker.sh cli topic list`
#   scripts/docker.sh test           end to end: a throwaway cluster on free ports serves a
#                                    publish and a read through every node, then `down -v`
#                                    leaves no container, network or volume behind
#
# Environment:
#   RAFTQ_BIN               put this binary in the image instead of building one
#   RAFTQ_IMAGE             image name (default raftq:local)
#   RAFTQ_COMPOSE_SECRETS   where the cluster secret, the token and tokens.toml live
#                           (default deploy/secrets/, made on the first `up`)
#   RAFTQ_COMPOSE_PORT_1..3 host ports of the nodes (default 7101-7103, on 127.0.0.1)
#   COMPOSE_PROJECT_NAME    the compose project (default raftq)
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export RAFTQ_IMAGE="${RAFTQ_IMAGE:-raftq:local}"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-raftq}"
export RAFTQ_COMPOSE_SECRETS="${RAFTQ_COMPOSE_SECRETS:-$RAFTQ_ROOT/deploy/secrets}"
COMPOSE_FILE="$RAFTQ_ROOT/deploy/docker-compose.yml"
HEALTHY_WAIT_SECS=120

# `docker compose` (v2) where there is one, else `docker-compose` (v1).
compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose -f "$COMPOSE_FILE" "$@"
    elif command -v docker-compose >/dev/null 2>&1; then
        docker-compose -f "$COMPOSE_FILE" "$@"
    else
        die "neither \`docker compose\` nor \`docker-compose\` is installed"
    fi
}

need_docker() {
    local i
    command -v docker >/dev/null 2>&1 || die "docker is not installed"
    docker info >/dev/null 2>&1 && return 0
    # An engine installed but stopped: start it when we may.
    if [[ $EUID -eq 0 ]] && command -v dockerd >/dev/null 2>&1; then
        info "the Docker engine is not running; starting it"
        service docker start >/dev/null 2>&1 || (nohup dockerd >/var/log/dockerd.log 2>&1 &)
        for ((i = 0; i < 30; i++)); do
            docker info >/dev/null 2>&1 && return 0
            sleep 1
        done
    fi
    die "the Docker engine is not running (or not reachable by this user)"
}

# The image: the binary, the shared libraries it links (as ldd finds them), an unprivileged
# user, and /data (owned by that user: see deploy/Dockerfile). FROM scratch, so no base image is pulled.
image() {
    local bin ctx lib
    need_docker
    build_raftq
    bin="$(server_binary)"
    ctx="$(mktemp -d)"
    mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc" "$ctx/rootfs/tmp" "$ctx/data"
    cp "$bin" "$ctx/rootfs/usr/local/bin/raftq"
    # Every library the binary loads, and the loader itself, at the paths it looks for them.
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
        mkdir -p "$ctx/rootfs$(dirname "$lib")"
        cp -L "$lib" "$ctx/rootfs$lib"
    done
    printf 'root:x:0:0:root:/root:/sbin/nologin\nraftq:x:10001:10001:raftq:/data:/sbin/nologin\n' \
        >"$ctx/rootfs/etc/passwd"
    printf 'root:x:0:\nraftq:x:10001:\n' >"$ctx/rootfs/etc/group"
    chmod 1777 "$ctx/rootfs/tmp"
    cp "$RAFTQ_ROOT/deploy/Dockerfile" "$ctx/Dockerfile"
    banner "docker build -t $RAFTQ_IMAGE"
    docker build -q -t "$RAFTQ_IMAGE" "$ctx" >/dev/null || { rm -rf "$ctx"; die "docker build failed"; }
    rm -rf "$ctx"
    ok "built $RAFTQ_IMAGE ($(docker image inspect -f '{{.Size}}' "$RAFTQ_IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

# The cluster secret, an API token granted admin:* and the tokens file with its hash, once.
# The files are readable inside the containers (user 10001); the directory is not readable
# by other users of this machine.
secrets() {
    local dir="$RAFTQ_COMPOSE_SECRETS" token hash
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [[ ! -s "$dir/cluster.secret" ]]; then
        od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$dir/cluster.secret"
    fi
    if [[ ! -s "$dir/api.token" ]]; then
        printf 'rq_%s\n' "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$dir/api.token"
    fi
    token="$(<"$dir/api.token")"
    hash="$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
    printf '[[token]]\nname = "compose-admin"\nsha256 = "%s"\ngrants = ["admin:*"]\n' "$hash" \
        >"$dir/tokens.toml"
    chmod 644 "$dir/cluster.secret" "$dir/tokens.toml"
    chmod 600 "$dir/api.token"
}

# Health of every node container: one line per container, "NAME STATUS".
health() {
    local id
    for id in $(compose ps -q); do
        docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
    done
}

wait_healthy() {
    local start=$SECONDS states
    while true; do
        states="$(health)"
        if [[ "$(grep -c ' healthy$' <<<"$states")" -eq 3 ]]; then
            return 0
        fi
        if ((SECONDS - start > HEALTHY_WAIT_SECS)); then
            printf '%s\n' "$states" >&2
            compose logs --tail 40 >&2 || true
            die "the nodes were not all healthy within ${HEALTHY_WAIT_SECS}s"
        fi
        sleep 1
    done
}

up() {
    image
    secrets
    banner "compose up ($COMPOSE_PROJECT_NAME)"
    compose up -d
    wait_healthy
    ok "three nodes healthy: 127.0.0.1:${RAFTQ_COMPOSE_PORT_1:-7101}, :${RAFTQ_COMPOSE_PORT_2:-7102}, :${RAFTQ_COMPOSE_PORT_3:-7103}"
    info "API token (admin:*): $(<"$RAFTQ_COMPOSE_SECRETS/api.token")"
    info "try: scripts/docker.sh cli cluster status"
}

down() {
    compose down "$@"
}

# `raftq ARGS` in a throwaway container on the cluster's network, talking to node1..node3.
cli() {
    local network="${COMPOSE_PROJECT_NAME}_default"
    docker run --rm -i --network "$network" \
        -e RAFTQ_TOKEN="$(<"$RAFTQ_COMPOSE_SECRETS/api.token")" \
        -e RAFTQ_URL=http://node1:7001,http://node2:7001,http://node3:7001 \
        "$RAFTQ_IMAGE" "$@"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# End to end, in a project of its own on free ports, cleaned up however it ends.
test_compose() {
    local i out leftovers code
    need_docker
    TEST_WORK="$(mktemp -d)"
    local work="$TEST_WORK"
    export COMPOSE_PROJECT_NAME="raftqtest$$"
    export RAFTQ_COMPOSE_SECRETS="$work/secrets"
    export RAFTQ_COMPOSE_PORT_1 RAFTQ_COMPOSE_PORT_2 RAFTQ_COMPOSE_PORT_3
    RAFTQ_COMPOSE_PORT_1="$(free_port)"
    RAFTQ_COMPOSE_PORT_2="$(free_port)"
    RAFTQ_COMPOSE_PORT_3="$(free_port)"
    trap 'compose down -v --remove-orphans >/dev/null 2>&1 || true; rm -rf "$TEST_WORK"' EXIT
    up

    banner "a topic, then a publish and a read through every node"
    out="$(cli topic create compose-check --json)"
    jq -e '.name == "compose-check"' <<<"$out" >/dev/null || die "topic create answered: $out"
    for i in 1 2 3; do
        printf 'via node%s\n' "$i" | cli publish compose-check --url "http://node$i:7001" >/dev/null
    done
    for i in 1 2 3; do
        out="$(cli tail compose-check --from first --json --url "http://node$i:7001")"
        [[ "$(jq -r '.value' <<<"$out" | sort | paste -sd,)" == "via node1,via node2,via node3" ]] ||
            die "node $i read back: $out"
        info "node $i: $(jq -c -s 'map(.value)' <<<"$out")"
    done
    # Every node answers from the host through its published port, without a token: 401.
    for port in "$RAFTQ_COMPOSE_PORT_1" "$RAFTQ_COMPOSE_PORT_2" "$RAFTQ_COMPOSE_PORT_3"; do
        [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/topics")" == 401 ]] ||
            die "127.0.0.1:$port did not require a token"
    done
    out="$(cli cluster status --json)"
    jq -e '.members | length == 3' <<<"$out" >/dev/null || die "cluster status: $out"

    banner "node1 SIGKILLed and started again: it rejoins with its volume"
    docker kill -s KILL "$(compose ps -q node1)" >/dev/null
    printf 'while node1 was down\n' | cli publish compose-check --url http://node2:7001,http://node3:7001 >/dev/null
    compose start node1
    wait_healthy
    out="$(cli tail compose-check --from first --json --url http://node1:7001)"
    [[ "$(jq -s 'length' <<<"$out")" == 4 ]] || die "node1 after its restart read back: $out"

    banner "compose stop: every node shuts down gracefully (exit 0), then down -v"
    compose stop
    for i in $(compose ps -q); do
        code="$(docker inspect -f '{{.State.ExitCode}}' "$i")"
        [[ "$code" == 0 ]] || die "$(docker inspect -f '{{.Name}}' "$i") exited $code on SIGTERM"
    done
    compose down -v --remove-orphans
    leftovers="$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")"
    leftovers+="$(docker volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")"
    leftovers+="$(docker network ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME")"
    [[ -z "$leftovers" ]] || die "compose down left behind: $leftovers"
    ok "compose: three healthy nodes served a publish and a read through each, and down cleaned up"
}

case "${1:-}" in
    image) image ;;
    up) up ;;
    down) shift; down "$@" ;;
    cli) shift; cli "$@" ;;
    test) ensure_apt_packages jq curl; test_compose ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
