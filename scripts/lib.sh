# Shared helpers for raftq's scripts. Source it; do not run it.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# After sourcing: RAFTQ_ROOT is the repository root (found from this file's location, never
# from the caller's working directory) and CARGO_TARGET_DIR is exported.
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this file
RAFTQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

# One cargo profile (--release) and one target directory outside the checkout, so that a
# fresh clone on the same machine (CI) reuses the RocksDB C++ build (10-15 minutes cold).
if [[ -z "${HOME:-}" ]]; then
    HOME="$(getent passwd "$(id -u)" | cut -d: -f6)"
    export HOME
fi
: "${CARGO_TARGET_DIR:=$HOME/.cache/raftq/target}"
export CARGO_TARGET_DIR

# Colour only when talking to a terminal.
if [[ -t 1 ]]; then
    _bold=$'\e[1m' _red=$'\e[31m' _green=$'\e[32m' _yellow=$'\e[33m' _reset=$'\e[0m'
else
    _bold='' _red='' _green='' _yellow='' _reset=''
fi

info() { printf '%s\n' "$*"; }
ok() { printf '%s%s%s\n' "$_green" "$*" "$_reset"; }
warn() { printf '%swarning:%s %s\n' "$_yellow" "$_reset" "$*" >&2; }
die() {
    printf '%serror:%s %s\n' "$_red" "$_reset" "$*" >&2
    exit 1
}
banner() {
    printf '\n%s==> %s%s\n' "$_bold" "$*" "$_reset"
}

# Runs a command with root privileges: directly as root, else through sudo.
_as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

_apt_updated=0

# ensure_apt_packages PKG...: installs the Debian packages that are not installed yet.
# `apt-get update` runs once, and only when something has to be installed.
ensure_apt_packages() {
    local missing=() pkg
    if ! command -v dpkg-query >/dev/null 2>&1; then
        warn "not a Debian-like system; make sure these are installed: $*"
        return 0
    fi
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    info "installing missing packages: ${missing[*]}"
    if [[ $_apt_updated -eq 0 ]]; then
        _as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        _apt_updated=1
    fi
    _as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Makes cargo reachable (rustup installs it to ~/.cargo/bin, which a non-login shell may lack).
ensure_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [[ -f "$HOME/.cargo/env" ]]; then
        # shellcheck source=/dev/null
        source "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 ||
        die "cargo not found; install Rust with rustup (https://rustup.rs) and retry"
}

# What building the server needs: RocksDB's C++ build wants a C++ compiler, and its bindings
# (bindgen) need libclang at run time of the build.
ensure_build_deps() {
    local pkgs=(clang libclang-dev curl ca-certificates)
    command -v c++ >/dev/null 2>&1 || pkgs+=(g++)
    ensure_apt_packages "${pkgs[@]}"
    ensure_cargo
}

# ensure_rust_components COMPONENT...: e.g. rustfmt clippy; added through rustup when absent.
ensure_rust_components() {
    local c missing=()
    ensure_cargo
    for c in "$@"; do
        case "$c" in
            rustfmt) cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt) ;;
            clippy) cargo clippy --version >/dev/null 2>&1 || missing+=(clippy) ;;
            *) die "ensure_rust_components: unknown component $c" ;;
        esac
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v rustup >/dev/null 2>&1 ||
        die "missing Rust components (${missing[*]}) and no rustup to add them"
    info "adding Rust components: ${missing[*]}"
    rustup component add "${missing[@]}"
}

# True when the cargo build cache has no RocksDB build yet (the first build is the slow one).
rocksdb_cold() {
    ! compgen -G "$CARGO_TARGET_DIR/release/build/librocksdb-sys-*/output" >/dev/null
}

# build_raftq: builds the raftq binary (release) into CARGO_TARGET_DIR, unless RAFTQ_BIN names
# one to run instead.
build_raftq() {
    if [[ -n "${RAFTQ_BIN:-}" ]]; then
        info "using RAFTQ_BIN=$RAFTQ_BIN (not building)"
        return 0
    fi
    ensure_build_deps
    banner "cargo build --release --bin raftq   (target dir: $CARGO_TARGET_DIR)"
    if rocksdb_cold; then
        info "The first build compiles RocksDB (C++) and may take ~15 minutes; later builds are quick."
    fi
    (cd "$RAFTQ_ROOT" && cargo build --release --bin raftq)
}

# The raftq binary the scripts run: RAFTQ_BIN (a path, or a name on PATH) when set, else the
# release build in CARGO_TARGET_DIR; always printed as an absolute path.
server_binary() {
    if [[ -n "${RAFTQ_BIN:-}" ]]; then
        local bin="$RAFTQ_BIN"
        [[ "$bin" == */* ]] || bin="$(command -v "$bin" || true)"
        [[ -n "$bin" && -x "$bin" ]] || die "RAFTQ_BIN=$RAFTQ_BIN is not an executable file"
        echo "$(cd "$(dirname "$bin")" && pwd -P)/$(basename "$bin")"
    elif [[ "$CARGO_TARGET_DIR" == /* ]]; then
        echo "$CARGO_TARGET_DIR/release/raftq"
    else
        # cargo runs in the repository root, so a relative target dir is relative to it.
        realpath -m -- "$RAFTQ_ROOT/$CARGO_TARGET_DIR/release/raftq"
    fi
}
