#!/usr/bin/env bash
# ab-logstore.sh — the Raft log stores (serve --raft-log-store wal|boltdb)
# measured alternately (A B A B ...) in one sitting with `dedupnode bench`
# mark-new, 50 callers, batch 16 and batch 1, on 1-node and 3-node clusters
# of `serve` processes on loopback ports of THIS machine. Prints one
# markdown table row per run: IDs/s, p99, and the server CPU per acknowledged
# ID (utime+stime of every node process over the run, from /proc, divided by
# the IDs acknowledged; it includes the warm-up), and the Raft log entry
# bytes per ID stored (n1's log read after the run with bench/scaleprobe
# --raft-log: entry data over the IDs the node stored, warm-up included).
#
# Usage: scripts/ab-logstore.sh [--rounds N] [--duration 10s] [--nodes "1 3"]
#                               [--batches "16 1"] [--stores "wal boltdb"]
#                               [--builds "old=PATH new=PATH"]
#   --builds alternates prebuilt binaries too (A/B of two builds).
#   Environment: DEDUPNODE_BIN=path to a prebuilt dedupnode binary.
# Every process it starts is stopped by PID; every run is bounded in time.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=2
DUR=10s
NODES_LIST="1 3"
BATCHES="16 1"
STORES="wal boltdb"
BUILDS=""
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--duration) DUR=$2; shift 2 ;;
	--nodes) NODES_LIST=$2; shift 2 ;;
	--batches) BATCHES=$2; shift 2 ;;
	--stores) STORES=$2; shift 2 ;;
	--builds) BUILDS=$2; shift 2 ;;
	-h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "ab-logstore.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
command -v jq >/dev/null || { echo "ab-logstore.sh: needs jq" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ab-logstore.XXXXXX") || exit 1
# shellcheck source=lib/cleanup.sh
. "$ROOT/scripts/lib/cleanup.sh" || { rm -rf "$WORK"; exit 1; }

if [ -z "$BUILDS" ]; then
	BIN=${DEDUPNODE_BIN:-}
	if [ -z "$BIN" ]; then
		(cd "$ROOT" && go build -o "$WORK/dedupnode" ./cmd/dedupnode) || exit 1
		BIN=$WORK/dedupnode
	fi
	BUILDS="this=$BIN"
fi
(cd "$ROOT" && go build -o "$WORK/scaleprobe" ./bench/scaleprobe) || exit 1

# shellcheck source=lib/procs.sh
. "$ROOT/scripts/lib/procs.sh" || exit 1

# run BUILD STORE NODES BATCH ROUND
run() {
	local build=${1%%=*} BIN=${1#*=} store=$2 nodes=$3 batch=$4 round=$5 i g r peers="" addrs="" dir
	local -a gs rs pids=()
	dir=$WORK/run-$build-$store-$nodes-$batch-$round
	for ((i = 1; i <= nodes; i++)); do
		gs[i]=127.0.0.1:$(free_port)
		rs[i]=127.0.0.1:$(free_port)
		peers+="${peers:+,}n$i=${rs[i]}=${gs[i]}"
		addrs+="${addrs:+,}${gs[i]}"
	done
	for ((i = 1; i <= nodes; i++)); do
		mode=(--peers "$peers")
		[ "$nodes" = 1 ] && mode=(--bootstrap)
		"$BIN" serve --node-id "n$i" --data-dir "$dir/n$i" --raft-addr "${rs[i]}" --grpc-addr "${gs[i]}" \
			--log-level warn --raft-log-store "$store" "${mode[@]}" >>"$dir.log" 2>&1 &
		pids+=($!)
		PIDS+=($!)
	done
	if ! "$BIN" status --addr "$addrs" --wait --timeout 60s >/dev/null 2>>"$dir.log"; then
		echo "| $build | $store | $nodes | $batch | $round | cluster not ready (see log) | | | | | |"
		for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
		return
	fi
	local c0 c1 out
	c0=$(cpu_ticks "${pids[@]}")
	out=$("$BIN" bench --addr "$addrs" -w mark-new -c 50 -b "$batch" -d "$DUR" --warmup 2s --max-time 60s \
		--no-progress -o json 2>>"$dir.log")
	c1=$(cpu_ticks "${pids[@]}")
	local stored
	stored=$("$BIN" status --addr "${gs[1]}" --timeout 10s -o json 2>/dev/null | jq -r '.ids_stored // 0')
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	local eb
	eb=$("$WORK/scaleprobe" --raft-log "$dir/n1" 2>>"$dir.log" | jq -r '.entry_bytes // 0')
	rm -rf "$dir"
	local ids rate p99 errs
	ids=$(jq -r '.ids' <<<"$out")
	rate=$(jq -r '.ids_per_sec | floor' <<<"$out")
	p99=$(jq -r '.p99_ms' <<<"$out")
	errs=$(jq -r '.errors' <<<"$out")
	echo "| $build | $store | $nodes | $batch | $round | $rate | $p99 | $(awk -v c=$((c1 - c0)) -v hz="$HZ" -v n="$ids" 'BEGIN { if (n > 0) printf "%.1f", c / hz / n * 1e6; else print "-" }') | $(awk -v b="${eb:-0}" -v n="${stored:-0}" 'BEGIN { if (n > 0) printf "%.1f", b / n; else print "-" }') | $errs | $(cut -d' ' -f1 /proc/loadavg) |"
}

echo "| build | store | nodes | batch | round | IDs/s | p99 ms | server CPU µs/ID | log bytes/ID | errors | load (1 min) |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for ((round = 1; round <= ROUNDS; round++)); do
	for nodes in $NODES_LIST; do
		for batch in $BATCHES; do
			for store in $STORES; do
				for b in $BUILDS; do
					run "$b" "$store" "$nodes" "$batch" "$round"
				done
			done
		done
	done
done
