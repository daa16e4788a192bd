#!/usr/bin/env bash
# case-series.sh — a series of cases (mark-new unless a case names its
# workload, as check-hit:10s, and --batch unless it names its batch, as
# mark-new/1:10s) of different lengths on ONE
# cluster of `serve` processes (fresh data dirs, loopback ports of THIS
# machine), one markdown row per case: IDs/s, p99, server CPU per ID
# (utime+stime of the node processes over the case, from /proc, over the
# IDs acknowledged in the measured window: keep --warmup 0s for a true
# figure), and what Pebble and Raft did during the case, summed over the
# nodes, from each node's /metrics before and after: Pebble bytes per
# acknowledged ID written to its WAL, by flushes and by compactions, and
# read by compactions; flushes, compactions, nodes that took a Raft
# snapshot (dedup_raft_last_snapshot_index moved); live sstable MiB per
# node after the case. The store grows from case to case, as it does
# between the cases and repeats of scripts/bench-peers.sh.
#
# Usage: scripts/case-series.sh [--cases "2s 10s 2s 10s"] [--nodes 3]
#          [--batch 16] [--warmup 0s] [--bin PATH] [--label NAME]
#          [--profile-dir DIR] [--serve-flags "..."] [--bench-flags "..."]
#   --profile-dir sends SIGUSR1/SIGUSR2 around each case (a build with a
#   profiling hook on those signals writes one CPU profile per case there).
#   --bench-flags are added to every `dedupnode bench` call (e.g.
#   "--transport stream").
#   Environment: DEDUPNODE_BIN=path to a prebuilt dedupnode binary.
# Every process it starts is stopped by PID; every case is bounded in time.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CASES="2s 10s 2s 10s"
NODES=3
BATCH=16
WARMUP=0s
BIN=${DEDUPNODE_BIN:-}
LABEL=run
PROFDIR=""
SERVE_FLAGS=""
BENCH_FLAGS=""
while [ $# -gt 0 ]; do
	case "$1" in
	--cases) CASES=$2; shift 2 ;;
	--nodes) NODES=$2; shift 2 ;;
	--batch) BATCH=$2; shift 2 ;;
	--warmup) WARMUP=$2; shift 2 ;;
	--bin) BIN=$2; shift 2 ;;
	--label) LABEL=$2; shift 2 ;;
	--profile-dir) PROFDIR=$2; shift 2 ;;
	--serve-flags) SERVE_FLAGS=$2; shift 2 ;;
	--bench-flags) BENCH_FLAGS=$2; shift 2 ;;
	-h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "case-series.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
command -v jq >/dev/null || { echo "case-series.sh: needs jq" >&2; exit 1; }
command -v curl >/dev/null || { echo "case-series.sh: needs curl" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/case-series.XXXXXX") || exit 1
# shellcheck source=lib/cleanup.sh
. "$ROOT/scripts/lib/cleanup.sh" || { rm -rf "$WORK"; exit 1; }

if [ -z "$BIN" ]; then
	(cd "$ROOT" && go build -o "$WORK/dedupnode" ./cmd/dedupnode) || exit 1
	BIN=$WORK/dedupnode
fi
# shellcheck source=lib/procs.sh
. "$ROOT/scripts/lib/procs.sh" || exit 1
METRICS="dedup_pebble_wal_written_bytes_total dedup_pebble_flush_written_bytes_total dedup_pebble_compaction_written_bytes_total dedup_pebble_compaction_read_bytes_total dedup_pebble_flushes_total dedup_pebble_compactions_total dedup_raft_last_snapshot_index dedup_pebble_live_sstable_bytes"
# scrape OUT: one line per node, the METRICS' values in order
scrape() {
	local a
	for a in "${ADMINS[@]}"; do
		curl -s --max-time 5 "http://$a/metrics" | awk -v want="$METRICS" '
			BEGIN { n = split(want, w, " ") }
			!/^#/ { v[$1] = $2 }
			END { for (i = 1; i <= n; i++) printf "%s ", (w[i] in v ? v[w[i]] : 0); print "" }'
	done >"$1"
}

declare -a GS RS ADMINS SPIDS
peers="" addrs=""
for ((i = 1; i <= NODES; i++)); do
	GS[i]=127.0.0.1:$(free_port)
	RS[i]=127.0.0.1:$(free_port)
	ADMINS[i]=127.0.0.1:$(free_port)
	peers+="${peers:+,}n$i=${RS[i]}=${GS[i]}"
	addrs+="${addrs:+,}${GS[i]}"
done
for ((i = 1; i <= NODES; i++)); do
	mode=(--peers "$peers")
	[ "$NODES" = 1 ] && mode=(--bootstrap)
	# shellcheck disable=SC2086
	DEDUPNODE_PROFHOOK_DIR=$PROFDIR "$BIN" serve --node-id "n$i" --data-dir "$WORK/n$i" --raft-addr "${RS[i]}" \
		--grpc-addr "${GS[i]}" --admin-addr "${ADMINS[i]}" --log-level warn "${mode[@]}" $SERVE_FLAGS >>"$WORK/n$i.log" 2>&1 &
	SPIDS+=($!)
	PIDS+=($!)
done
if ! "$BIN" status --addr "$addrs" --wait --timeout 60s >/dev/null 2>>"$WORK/status.log"; then
	echo "case-series.sh: cluster not ready" >&2
	tail -5 "$WORK"/n*.log >&2
	exit 1
fi

echo "| label | case | length | IDs | IDs/s | p99 ms | CPU µs/ID | WAL B/ID | flush B/ID | compact write B/ID | compact read B/ID | flushes | compactions | snapshots | live MiB/node | load 1 min |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
n=0
for c in $CASES; do
	n=$((n + 1))
	wl=mark-new len=$c batch=$BATCH
	case "$c" in *:*) wl=${c%%:*} len=${c#*:} ;; esac
	case "$wl" in */*) batch=${wl#*/} wl=${wl%%/*} ;; esac
	scrape "$WORK/m0"
	[ -n "$PROFDIR" ] && kill -USR1 "${SPIDS[@]}"
	c0=$(cpu_ticks "${SPIDS[@]}")
	out=$("$BIN" bench --addr "$addrs" -w "$wl" -c 50 -b "$batch" -d "$len" --warmup "$WARMUP" --conns 2 \
		--max-time 120s --no-progress -o json $BENCH_FLAGS 2>>"$WORK/bench.log")
	c1=$(cpu_ticks "${SPIDS[@]}")
	[ -n "$PROFDIR" ] && kill -USR2 "${SPIDS[@]}"
	scrape "$WORK/m1"
	ids=$(jq -r '.ids' <<<"$out")
	rate=$(jq -r '.ids_per_sec | floor' <<<"$out")
	p99=$(jq -r '.p99_ms' <<<"$out")
	load=$(cut -d' ' -f1 /proc/loadavg)
	paste -d' ' "$WORK/m0" "$WORK/m1" | awk -v label="$LABEL" -v n="$n" -v len="$c" -v ids="$ids" -v rate="$rate" \
		-v p99="$p99" -v cpu=$((c1 - c0)) -v hz="$HZ" -v load="$load" -v k=8 '
		{ for (i = 1; i <= k; i++) { d[i] += $(k + i) - $i }; if ($(k + 1 + 6) != $(1 + 6)) snaps++; live += $(2 * k) }
		END {
			if (ids <= 0) { printf "| %s | %d | %s | 0 | - | - | - | | | | | | | | | %s |\n", label, n, len, load; exit }
			printf "| %s | %d | %s | %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %d | %d | %d | %.0f | %s |\n",
				label, n, len, ids, rate, p99, cpu / hz / ids * 1e6, d[1] / ids, d[2] / ids, d[3] / ids, d[4] / ids,
				d[5], d[6], snaps, live / NR / 1048576, load }'
done
