#!/usr/bin/env bash
# bench-peers.sh — run the same deduplication workloads against dedupnode
# (3 nodes and 1 node) and its peers on THIS machine, over loopback, and
# write bench/results/<date>.md and .json (<date>-quick.* with --quick).
#
# Peers: Redis (appendfsync always / everysec / none), PostgreSQL 15,
# etcd 3.7 (embedded, 1 and 3 members), NATS JetStream 2.15 (embedded,
# R1 and R3, default and sync_always). Every server is started on loopback
# ports from the OS and stopped by its PID; every load loop is bounded in
# time. Missing Debian packages (redis-server, postgresql-15) are installed
# with apt-get.
#
# Usage:
#   scripts/bench-peers.sh [--quick] [peers run flags...]
#     --quick                 reduced set: 25 cases x 2 s (under a minute measured)
#     --systems redis,etcd-3  only these systems (keys or prefixes)
#     --duration 10s          measured time per case (default 10s; 2s quick)
#     --keep                  keep data dirs and server logs
#   Environment: DEDUPNODE_BIN=path to use a prebuilt dedupnode binary.
#
# The harness is the Go module bench/peers (kept apart from dedupnode's own
# go.mod); its workload loop and statistics are dedupnode's bench package.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

for a in "$@"; do
	case "$a" in
	-h | --help)
		sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	esac
done

log() { printf '%s bench-peers: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- Debian packages -------------------------------------------------------
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
if [ ${#need[@]} -gt 0 ]; then
	SUDO=
	if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
	log "installing ${need[*]} with apt-get"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- build -----------------------------------------------------------------
BIN=$(mktemp -d "${TMPDIR:-/tmp}/bench-peers-bin.XXXXXX")
trap 'rm -rf "$BIN"' EXIT

dedup_bin=${DEDUPNODE_BIN:-}
if [ -z "$dedup_bin" ]; then
	log "building dedupnode"
	if go build -o "$BIN/dedupnode" ./cmd/dedupnode; then
		dedup_bin=$BIN/dedupnode
	else
		log "WARNING: dedupnode did not build; its rows will be missing"
	fi
fi

log "building the peers harness (bench/peers)"
# -mod=mod: the harness requires dedupnode through a replace directive, so a
# dependency added to dedupnode's go.mod is picked up without a manual tidy.
(cd bench/peers && go build -mod=mod -o "$BIN/peers" .)

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- 2>/dev/null; then commit="$commit+dirty"; fi

# --- run -------------------------------------------------------------------
args=(run --out "$ROOT/bench/results" --command "scripts/bench-peers.sh $*")
if [ -n "$dedup_bin" ]; then args+=(--dedupnode-bin "$dedup_bin"); fi
log "running (servers on 127.0.0.1 only; every loop bounded in time)"
DEDUPNODE_COMMIT=$commit "$BIN/peers" "${args[@]}" "$@"
