#!/usr/bin/env bash
# pgo-profile.sh — regenerates cmd/dedupnode/default.pgo, the CPU profile
# that `go build ./cmd/dedupnode` applies for profile-guided optimisation
# (Go 1.21 and later use a main package's default.pgo by default; build
# with -pgo=off to leave it out).
#
# It starts `dedupnode dev` (3 nodes in one process, free loopback ports,
# a temporary data dir) with --cpu-profile, drives it with the workloads of
# scripts/bench-peers.sh' rows, streamed and unary, each bench call with
# --cpu-profile of its own (the client package is in the same binary), and
# merges the profiles. A profile only guides the compiler's inlining and
# block layout; it cannot change what the program does.
#
# Usage: scripts/pgo-profile.sh [--out FILE] [--scale K]
#   --out    where the merged profile goes (default cmd/dedupnode/default.pgo)
#   --scale  multiplies every workload's length (default 1: about 100 s)
#   Environment: DEDUPNODE_BIN=a prebuilt dedupnode binary (default: one
#   built here with -pgo=off).
# Every process it starts is stopped by PID; every load is bounded in time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$ROOT/cmd/dedupnode/default.pgo
SCALE=1
while [[ $# -gt 0 ]]; do
	case $1 in
	--out | --scale)
		if [[ $# -lt 2 ]]; then
			echo "pgo-profile.sh: $1 needs a value (see --help)" >&2
			exit 2
		fi
		if [[ $1 == --out ]]; then OUT=$2; else SCALE=$2; fi
		shift 2
		;;
	-h | --help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "pgo-profile.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
if ! [[ $SCALE =~ ^[1-9][0-9]*$ ]]; then
	echo "pgo-profile.sh: --scale $SCALE: want a whole number from 1" >&2
	exit 2
fi

WORK=$(mktemp -d)
# shellcheck source=lib/cleanup.sh
source "$ROOT/scripts/lib/cleanup.sh"

BIN=${DEDUPNODE_BIN:-}
if [[ -z $BIN ]]; then
	echo "building dedupnode (-pgo=off)" >&2
	(cd "$ROOT" && go build -pgo=off -o "$WORK/dedupnode" ./cmd/dedupnode)
	BIN=$WORK/dedupnode
fi

"$BIN" dev --base-port 0 --data-dir "$WORK/data" --cpu-profile "$WORK/server.prof" \
	>"$WORK/dev.out" 2>"$WORK/dev.err" &
DEV=$!
PIDS+=("$DEV")
ADDRS=
for _ in $(seq 1 120); do
	ADDRS=$(awk '/^addrs:/ {print $2}' "$WORK/dev.out")
	[[ -n $ADDRS ]] && break
	kill -0 "$DEV" 2>/dev/null || break
	sleep 0.5
done
if [[ -z $ADDRS ]]; then
	echo "pgo-profile.sh: dedupnode dev did not start:" >&2
	cat "$WORK/dev.err" >&2
	exit 1
fi

n=0
load() {
	local secs=$1
	shift
	n=$((n + 1))
	echo "load $n: $* for $((secs * SCALE))s" >&2
	"$BIN" bench --addr "$ADDRS" --no-progress --duration "$((secs * SCALE))s" \
		--cpu-profile "$WORK/client-$n.prof" "$@" >"$WORK/bench-$n.out"
}
# The write rows weigh most, as in the benchmark; the store grows through
# them so compactions are in the profile too.
load 25 --workload mark-new --transport stream
load 10 --workload mark-new --transport stream --batch 1
load 10 --workload mark-new
load 8 --workload mark-new --batch 1
load 8 --workload check-miss --transport stream
load 6 --workload check-miss
load 8 --workload check-hit --transport stream --preload 50000
load 6 --workload mark-mixed --transport stream
load 6 --workload claim-commit --transport stream

kill -INT "$DEV"
wait "$DEV" || true
PIDS=()
if [[ ! -s $WORK/server.prof ]]; then
	echo "pgo-profile.sh: dedupnode dev wrote no profile" >&2
	exit 1
fi
go tool pprof -proto "$WORK/server.prof" "$WORK"/client-*.prof >"$WORK/merged.pgo"
mv "$WORK/merged.pgo" "$OUT"
echo "wrote $OUT ($(wc -c <"$OUT") bytes); rebuild to apply it" >&2
