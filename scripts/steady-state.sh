#!/usr/bin/env bash
# steady-state.sh — does a cluster under constant load reach a steady state
# in disk and memory? Starts NODES `serve` processes (fresh data dirs,
# loopback ports of THIS machine), creates a namespace "steady" with a short
# TTL (--ttl, 30s; --max-ttl, by default the TTL: a namespace's expired IDs
# give their space back one bucket of max TTL/32, at most 1 h, at a time)
# and streams mark-new calls into it (`dedupnode bench`,
# --concurrency 50 callers × --batch 16 IDs, --transport stream) for
# --duration, in bench runs of at most 60 s back to back. Every --interval
# it samples each node: its data dir on disk (du, allocated blocks) and its
# parts raft/wal (or raft/raft.db), raft/snapshots and fsm; VmRSS and its
# anonymous and file-backed parts (/proc/PID/status); from the node's
# /metrics, the Go heap in use, Pebble's memtables, the IDs stored (live
# and not yet dropped) and the Raft log's bytes and entries. The IDs/s of
# every bench run go into the report too: the store follows the load. It writes a
# markdown report (--out, default bench/results/steady-state-DATE.md): the
# command, the samples, and per node the max/min ratio of data dir and RSS
# over the last --window, which must be at most --max-ratio (1.10) for
# "steady"; the exit status is 1 when a node is not steady.
#
# Usage: scripts/steady-state.sh [--duration 30m] [--window 20m]
#          [--interval 30s] [--nodes 3] [--ttl 30s] [--max-ttl DUR] [--batch 16]
#          [--concurrency 50] [--max-ratio 1.10] [--bin PATH] [--out FILE]
#          [--serve-flags "..."] [--bench-flags "..."] [--note "..."]
#   Durations are in s or m (90s, 5m). --note adds a line to the report.
#   Environment: DEDUPNODE_BIN=path to a prebuilt dedupnode binary.
# Every process it starts is stopped by PID; the load is bounded in time.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CMDLINE="scripts/steady-state.sh $*"
DURATION=30m
WINDOW=20m
INTERVAL=30s
NODES=3
TTL=30s
MAXTTL=""
BATCH=16
CONC=50
MAXRATIO=1.10
BIN=${DEDUPNODE_BIN:-}
OUT=""
SERVE_FLAGS=""
BENCH_FLAGS=""
NOTE=""
while [ $# -gt 0 ]; do
	case "$1" in
	--duration) DURATION=$2; shift 2 ;;
	--window) WINDOW=$2; shift 2 ;;
	--interval) INTERVAL=$2; shift 2 ;;
	--nodes) NODES=$2; shift 2 ;;
	--ttl) TTL=$2; shift 2 ;;
	--max-ttl) MAXTTL=$2; shift 2 ;;
	--batch) BATCH=$2; shift 2 ;;
	--concurrency) CONC=$2; shift 2 ;;
	--max-ratio) MAXRATIO=$2; shift 2 ;;
	--bin) BIN=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--serve-flags) SERVE_FLAGS=$2; shift 2 ;;
	--bench-flags) BENCH_FLAGS=$2; shift 2 ;;
	--note) NOTE=$2; shift 2 ;;
	-h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "steady-state.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
# secs DUR prints DUR (Ns or Nm) in seconds.
secs() {
	case "$1" in
	*[0-9]s) echo "${1%s}" ;;
	*[0-9]m) echo $((${1%m} * 60)) ;;
	*) echo "steady-state.sh: duration $1: want e.g. 90s or 30m" >&2; exit 2 ;;
	esac
}
DUR_S=$(secs "$DURATION") WIN_S=$(secs "$WINDOW") INT_S=$(secs "$INTERVAL") || exit 2
if [ "$WIN_S" -gt "$DUR_S" ] || [ "$INT_S" -lt 1 ]; then
	echo "steady-state.sh: --window must not exceed --duration, --interval at least 1s" >&2
	exit 2
fi
command -v jq >/dev/null || { echo "steady-state.sh: needs jq" >&2; exit 1; }
command -v curl >/dev/null || { echo "steady-state.sh: needs curl" >&2; exit 1; }
[ -n "$OUT" ] || OUT=$ROOT/bench/results/steady-state-$(date +%F).md

WORK=$(mktemp -d "${TMPDIR:-/tmp}/steady-state.XXXXXX") || exit 1
# shellcheck source=lib/cleanup.sh
. "$ROOT/scripts/lib/cleanup.sh" || { rm -rf "$WORK"; exit 1; }
if [ -z "$BIN" ]; then
	(cd "$ROOT" && go build -o "$WORK/dedupnode" ./cmd/dedupnode) || exit 1
	BIN=$WORK/dedupnode
fi
# shellcheck source=lib/procs.sh
. "$ROOT/scripts/lib/procs.sh" || exit 1

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
	"$BIN" serve --node-id "n$i" --data-dir "$WORK/n$i" --raft-addr "${RS[i]}" --grpc-addr "${GS[i]}" \
		--admin-addr "${ADMINS[i]}" --log-level warn "${mode[@]}" $SERVE_FLAGS >>"$WORK/n$i.log" 2>&1 &
	SPIDS[i]=$!
	PIDS+=($!)
done
if ! "$BIN" status --addr "$addrs" --wait --timeout 60s >/dev/null 2>>"$WORK/status.log"; then
	echo "steady-state.sh: cluster not ready" >&2
	tail -5 "$WORK"/n*.log >&2
	exit 1
fi
[ -n "$MAXTTL" ] || MAXTTL=$TTL
if ! "$BIN" namespace create steady --addr "$addrs" --ttl "$TTL" --max-ttl "$MAXTTL" >/dev/null 2>>"$WORK/status.log"; then
	echo "steady-state.sh: cannot create namespace steady" >&2
	tail -5 "$WORK/status.log" >&2
	exit 1
fi

# kib PATH prints what PATH occupies on disk in KiB (0 when missing; du
# still totals a directory whose files come and go while it counts).
kib() {
	local k
	k=$(du -sk "$1" 2>/dev/null | cut -f1)
	echo "${k:-0}"
}
# sample T: one line per node into $WORK/samples: T node dir wal snaps fsm
# rss anon file heap logbytes logentries memtables ids goheld (sizes in KiB,
# metrics in bytes).
sample() {
	local t=$1 i d p m
	for ((i = 1; i <= NODES; i++)); do
		d=$WORK/n$i p=${SPIDS[i]}
		m=$(curl -s --max-time 5 "http://${ADMINS[i]}/metrics" | awk '
			/^go_memstats_heap_inuse_bytes / { h = $2 }
			/^go_memstats_sys_bytes / { sys = $2 }
			/^go_memstats_heap_released_bytes / { rel = $2 }
			/^dedup_raft_log_bytes / { b = $2 }
			/^dedup_raft_log_entries / { e = $2 }
			/^dedup_pebble_memtable_bytes / { m = $2 }
			/^dedup_storage_ids / { i = $2 }
			END { printf "%.0f %.0f %.0f %.0f %.0f %.0f", h, b, e, m, i, sys - rel }')
		echo "$t n$i $(kib "$d") $(($(kib "$d/raft/wal") + $(kib "$d/raft/raft.db"))) $(kib "$d/raft/snapshots") $(kib "$d/fsm") $(awk '
			/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 }
			END { printf "%d %d %d", r, a, f }' "/proc/$p/status" 2>/dev/null || echo "0 0 0") $m"
	done >>"$WORK/samples"
}

start=$(date +%s)
sample 0
# The load: bench runs of at most 60 s back to back until --duration is up;
# each is bounded by its --max-time.
(
	while :; do
		left=$((start + DUR_S - $(date +%s)))
		[ "$left" -ge 5 ] || break
		d=$((left < 60 ? left : 60))
		# shellcheck disable=SC2086
		"$BIN" bench --addr "$addrs" -w mark-new -c "$CONC" -b "$BATCH" --transport stream --ttl "$TTL" \
			-n steady -d "${d}s" --max-time "$((d + 30))s" --no-progress -o json $BENCH_FLAGS \
			>>"$WORK/bench.jsonl" 2>>"$WORK/bench.log"
	done
) &
LOADPID=$!
PIDS+=($LOADPID)
next=$INT_S
while :; do
	now=$(($(date +%s) - start))
	if [ "$now" -ge "$next" ]; then
		sample "$next"
		next=$((next + INT_S))
	fi
	[ "$next" -le "$DUR_S" ] || break
	sleep 1
done
wait "$LOADPID"
for ((i = 1; i <= NODES; i++)); do
	kill -0 "${SPIDS[i]}" 2>/dev/null || echo "steady-state.sh: node n$i exited during the run (see below)" >&2
done

ids=$(jq -s 'map(.ids) | add // 0' "$WORK/bench.jsonl" 2>/dev/null || echo 0)
errs=$(jq -s 'map((.errors // 0) + (.unexpected // 0)) | add // 0' "$WORK/bench.jsonl" 2>/dev/null || echo 0)
mkdir -p "$(dirname "$OUT")"
{
	echo "# Steady state under streamed marks, $NODES nodes, TTL $TTL ($(date +%F))"
	echo
	echo "Built at $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD -- . ':!bench/results' || echo ' (with uncommitted changes)'); $(nproc) cores, load average at the end $(cut -d' ' -f1-3 /proc/loadavg)."
	echo "The machine was shared with other engineers' work, so throughput is lower"
	echo "than on a quiet machine; the criterion is stability, not speed."
	[ -n "$NOTE" ] && { echo; echo "$NOTE"; }
	echo
	echo '```'
	echo "$CMDLINE"
	echo '```'
	echo
	echo "Namespace: \`dedupnode namespace create steady --ttl $TTL --max-ttl $MAXTTL\`."
	echo "Load: \`dedupnode bench -w mark-new -c $CONC -b $BATCH --transport stream --ttl $TTL -n steady\` in runs of"
	echo "at most 60 s for $DURATION: $ids IDs acknowledged ($((ids / DUR_S)) IDs/s on average), $errs errors or"
	echo "unexpected answers. Serve flags beyond the addresses: \`--log-level warn${SERVE_FLAGS:+ $SERVE_FLAGS}\`."
	echo "IDs/s of the bench runs in order: $(jq -r '.ids_per_sec | floor' "$WORK/bench.jsonl" 2>/dev/null | paste -sd' ')."
	echo
} >"$OUT"
awk -v nodes="$NODES" -v dur="$DUR_S" -v win="$WIN_S" -v maxratio="$MAXRATIO" -v window="$WINDOW" '
	function mib(k) { return sprintf("%.0f", k / 1024) }
	{
		t = $1; n = $2; ts[t] = 1
		dir[t, n] = $3; wal[t, n] = $4; snap[t, n] = $5; fsm[t, n] = $6
		rss[t, n] = $7; anon[t, n] = $8; file[t, n] = $9; heap[t, n] = $10; lb[t, n] = $11; le[t, n] = $12; mt[t, n] = $13; ids[t, n] = $14; held[t, n] = $15
		if (t >= dur - win) {
			if (!((n, "d") in lo) || $3 < lo[n, "d"]) lo[n, "d"] = $3
			if ($3 > hi[n, "d"]) hi[n, "d"] = $3
			if (!((n, "r") in lo) || $7 < lo[n, "r"]) lo[n, "r"] = $7
			if ($7 > hi[n, "r"]) hi[n, "r"] = $7
		}
	}
	END {
		nt = 0; for (t in ts) times[++nt] = t + 0
		for (i = 2; i <= nt; i++) for (j = i; j > 1 && times[j - 1] > times[j]; j--) { x = times[j]; times[j] = times[j - 1]; times[j - 1] = x }
		printf "## Verdict: every node within %.0f%% over the last %s\n\n", (maxratio - 1) * 100, window
		print "| node | data dir MiB min–max | ratio | RSS MiB min–max | ratio | steady |"
		print "| --- | --- | ---: | --- | ---: | --- |"
		bad = 0
		for (k = 1; k <= nodes; k++) {
			n = "n" k
			rd = lo[n, "d"] > 0 ? hi[n, "d"] / lo[n, "d"] : 0
			rr = lo[n, "r"] > 0 ? hi[n, "r"] / lo[n, "r"] : 0
			ok = rd > 0 && rr > 0 && rd <= maxratio && rr <= maxratio
			if (!ok) bad = 1
			printf "| %s | %s–%s | %.3f | %s–%s | %.3f | %s |\n", n, mib(lo[n, "d"]), mib(hi[n, "d"]), rd, mib(lo[n, "r"]), mib(hi[n, "r"]), rr, ok ? "yes" : "NO"
		}
		print ""
		print "## Samples: data dir and RSS per node (MiB)\n"
		hdr = "| t (s) |"; sep = "| ---: |"
		for (k = 1; k <= nodes; k++) { hdr = hdr " n" k " dir | n" k " RSS |"; sep = sep " ---: | ---: |" }
		print hdr; print sep
		for (i = 1; i <= nt; i++) {
			t = times[i]; line = "| " t (t >= dur - win ? "" : " (before window)") " |"
			for (k = 1; k <= nodes; k++) line = line " " mib(dir[t, "n" k]) " | " mib(rss[t, "n" k]) " |"
			print line
		}
		print ""
		print "## Parts per node\n"
		print "On disk (MiB): Raft log files, snapshots, ID store (fsm). RSS (MiB): anonymous"
		print "and file-backed; the memory the Go runtime holds from the OS (Sys less"
		print "HeapReleased: the rest of the anonymous part is C memory, the block cache and"
		print "memtables of Pebble in a cgo build), the Go heap in use, the memtables. Raft log"
		print "kept (dedup_raft_log_bytes in MiB, dedup_raft_log_entries). IDs stored"
		print "(thousands, live and not yet dropped).\n"
		print "| t (s) | node | raft log | snapshots | fsm | anon | file | Go held | Go heap | memtables | log MiB | log entries | IDs (k) |"
		print "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
		for (i = 1; i <= nt; i++) for (k = 1; k <= nodes; k++) {
			t = times[i]; n = "n" k
			printf "| %d | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %.0f | %.1f | %d | %.0f |\n", t, n, mib(wal[t, n]), mib(snap[t, n]), mib(fsm[t, n]), mib(anon[t, n]), mib(file[t, n]), held[t, n] / 1048576, heap[t, n] / 1048576, mt[t, n] / 1048576, lb[t, n] / 1048576, le[t, n], ids[t, n] / 1000
		}
		exit bad
	}' "$WORK/samples" >>"$OUT"
status=$?
echo "steady-state.sh: wrote $OUT" >&2
sed -n '/^## Verdict/,/^## Samples/p' "$OUT" | head -n -1 >&2
if [ -s "$WORK/bench.log" ]; then
	echo "steady-state.sh: bench stderr (last lines):" >&2
	tail -5 "$WORK/bench.log" >&2
fi
exit "$status"
