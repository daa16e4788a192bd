#!/usr/bin/env bash
# scale.sh — issue 6's scale figures, measured with real `dedupnode serve`
# processes on loopback ports of THIS machine:
#
#   1. load N live IDs through the real API (`dedupnode bench -w mark-new`,
#      large batches, many callers), then per node: RSS (VmRSS, VmHWM, anon
#      and file-backed parts, from /proc/PID/status) and disk bytes (du of
#      the Raft log, Raft snapshots and Pebble), each also per live ID;
#   2. restart of a node holding N IDs (a follower of a 3-node cluster, or
#      the only node): SIGTERM + start, then kill -9 + start; milliseconds
#      from the start of the process to its port, to `status --wait`-style
#      readiness (knows a leader, applied up to the leader's commit index)
#      and to a linearizable Check sent to that node answering SEEN;
#   3. a new follower (`serve --join`, non-voter, promoted once caught up)
#      brought up from a Raft snapshot of N IDs: the script first makes sure
#      the leader's log was compacted behind a snapshot (small marks pad the
#      log past raft's 10 240 trailing entries, then it waits for raft's
#      snapshot timer), so the follower must install the snapshot;
#   4. disk space returned once the N IDs expire (their TTL is short,
#      --ttl): Pebble bytes before and after the expiry buckets were dropped
#      and compacted, polled with a deadline;
#   5. the Raft log bound: every node is stopped and its Raft log read
#      (bench/scaleprobe --raft-log): the log's size on disk against the
#      bytes of the entries it keeps (behind the last snapshot: trailing
#      logs; and after it), and whether it is at most twice those.
#
# It prints a markdown report and writes it to
# bench/results/scale-<date>-<size>.md (or --out FILE).
#
# Usage:
#   scripts/scale.sh [flags]
#     --ids N            live IDs to load (default 10000000; 1e8 for 100M)
#     --nodes 1|3        cluster size (default 3)
#     --batch N          IDs per Mark call (default 1000)
#     --concurrency N    concurrent callers (default 16)
#     --ttl DURATION     TTL of the loaded IDs, e.g. 16m (default: long
#                        enough for the load and the measurements, about
#                        N/25000 s + 9 min; 1d with --skip expiry)
#     --skip LIST        phases to leave out: restart,follower,expiry,raftlog
#     --raft-log-store S serve --raft-log-store S (wal or boltdb; default:
#                        the binary's default)
#     --serve-args "..." more serve flags for every node, e.g.
#                        "--raft-trailing-logs 1024 --raft-snapshot-interval 5s"
#     --dir DIR          parent of the data directory (default $TMPDIR or /tmp)
#     --out FILE         report file (default bench/results/scale-<date>-<size>.md)
#     --load-max DUR     bound on the load (seconds; default max(600, N/10000))
#     --expiry-max DUR   bound on the wait for disk space after expiry (s; default 900)
#     --keep             keep the data directory and node logs
#     --worktree         build the checkout as it is (default: the committed
#                        tree, git archive HEAD)
#   Environment: DEDUPNODE_BIN=path to use a prebuilt dedupnode binary.
#
# Every wait is bounded in time; every process it starts is stopped by PID
# on exit (also on Ctrl-C); the data directory is deleted unless --keep.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

IDS=10000000
NODES=3
BATCH=1000
CONC=16
TTL_S=""
SKIP=""
PARENT=${TMPDIR:-/tmp}
OUT=""
LOAD_MAX=""
EXPIRY_MAX=900
KEEP=0
WORKTREE=0
LOG_STORE=""
SERVE_ARGS=""
ARGS_GIVEN="$*"

usage() { sed -n '2,54p' "$0" | sed 's/^# \{0,1\}//'; }

# dur_s 16m|90s|1h|1d|600 -> seconds
dur_s() {
	local v=$1
	case "$v" in
	*d) echo $((${v%d} * 86400)) ;;
	*h) echo $((${v%h} * 3600)) ;;
	*m) echo $((${v%m} * 60)) ;;
	*s) echo "${v%s}" ;;
	*) echo "$v" ;;
	esac
}

while [ $# -gt 0 ]; do
	case "$1" in
	-h | --help) usage; exit 0 ;;
	--ids) IDS=$(python3 -c "print(int(float('$2')))" 2>/dev/null || echo "$2"); shift 2 ;;
	--nodes) NODES=$2; shift 2 ;;
	--batch) BATCH=$2; shift 2 ;;
	--concurrency) CONC=$2; shift 2 ;;
	--ttl) TTL_S=$(dur_s "$2"); shift 2 ;;
	--skip) SKIP=$2; shift 2 ;;
	--dir) PARENT=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--load-max) LOAD_MAX=$(dur_s "$2"); shift 2 ;;
	--expiry-max) EXPIRY_MAX=$(dur_s "$2"); shift 2 ;;
	--raft-log-store) LOG_STORE=$2; shift 2 ;;
	--serve-args) SERVE_ARGS=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--worktree) WORKTREE=1; shift ;;
	*) echo "scale.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case "$NODES" in 1 | 3) ;; *) echo "scale.sh: --nodes must be 1 or 3" >&2; exit 2 ;; esac
[[ "$IDS" =~ ^[0-9]+$ ]] && [ "$IDS" -ge 1000 ] || { echo "scale.sh: --ids must be a number >= 1000" >&2; exit 2; }
for x in "$BATCH" "$CONC" "$EXPIRY_MAX"; do
	[[ "$x" =~ ^[0-9]+$ ]] && [ "$x" -ge 1 ] || { echo "scale.sh: --batch, --concurrency and --expiry-max must be positive integers" >&2; exit 2; }
done
skip() { [[ ",$SKIP," == *",$1,"* ]]; }
for p in ${SKIP//,/ }; do
	case "$p" in restart | follower | expiry | raftlog) ;; *) echo "scale.sh: --skip: unknown phase $p (restart, follower, expiry, raftlog)" >&2; exit 2 ;; esac
done
command -v jq >/dev/null || { echo "scale.sh: needs jq" >&2; exit 1; }

human() { # 10000000 -> 10M
	local n=$1
	if [ $((n % 1000000)) -eq 0 ]; then echo "$((n / 1000000))M"
	elif [ $((n % 1000)) -eq 0 ]; then echo "$((n / 1000))k"
	else echo "$n"; fi
}
SIZE=$(human "$IDS")
[ -n "$LOAD_MAX" ] || LOAD_MAX=$((IDS / 10000 > 600 ? IDS / 10000 : 600))
if [ -z "$TTL_S" ]; then
	if skip expiry; then TTL_S=86400; else TTL_S=$((IDS / 25000 + 540)); fi
fi
# the namespace's max TTL is the TTL: its expiry buckets are TTL/32 wide
# (1 s .. 1 h, fsm/DESIGN.md "Records and buckets")
BUCKET_S=$(((TTL_S + 31) / 32))
[ "$BUCKET_S" -ge 1 ] || BUCKET_S=1
[ "$BUCKET_S" -le 3600 ] || BUCKET_S=3600

DATE=$(date -u +%Y-%m-%d)
[ -n "$OUT" ] || OUT=bench/results/scale-$DATE-$SIZE.md
mkdir -p "$(dirname "$OUT")"

WORK=$(mktemp -d "$PARENT/dedupnode-scale.XXXXXX") || exit 1
LOG=$WORK/script.log
now_ns() { date +%s%N; }
now_s() { date +%s; }
T0=$(now_s)
log() { printf '%s scale [%4ds]: %s\n' "$(date -u +%H:%M:%S)" "$(($(now_s) - T0))" "$*" | tee -a "$LOG" >&2; }

# --- processes -------------------------------------------------------------
declare -A PID GPORT RPORT
SAMPLER=""
BGPIDS=()
stop_pid() { # stop_pid PID [grace seconds]: TERM, then KILL
	local p=$1 g=${2:-20} i
	kill -0 "$p" 2>/dev/null || { wait "$p" 2>/dev/null; return 0; }
	kill -TERM "$p" 2>/dev/null
	for ((i = 0; i < g * 10; i++)); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
	wait "$p" 2>/dev/null
	return 0
}
cleanup() {
	local n p
	trap - EXIT INT TERM
	for p in "${BGPIDS[@]}"; do stop_pid "$p" 5; done
	[ -n "$SAMPLER" ] && stop_pid "$SAMPLER" 2
	for n in "${!PID[@]}"; do
		[ -n "${PID[$n]}" ] && stop_pid "${PID[$n]}" 15
	done
	if [ "$KEEP" = 1 ]; then
		log "kept $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

free_port() { # a port nobody listens on, from 20000..59999
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			for q in "${GPORT[@]}" "${RPORT[@]}"; do [ "$q" = "$p" ] && continue 2; done
			echo "$p"
			return 0
		fi
	done
	return 1
}

# --- build -------------------------------------------------------------------
# From the committed tree (git archive HEAD), so that other people's
# uncommitted work in this checkout does not end up in the figures;
# --worktree builds the checkout as it is.
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
SRC=$ROOT
BUILT_FROM="commit \`$COMMIT\`"
if [ "$WORKTREE" = 0 ] && git rev-parse HEAD >/dev/null 2>&1; then
	SRC=$WORK/src
	mkdir -p "$SRC"
	git archive HEAD | tar -x -C "$SRC" || { log "git archive failed"; exit 1; }
else
	dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)
	BUILT_FROM="the working tree at commit \`$COMMIT\` ($dirty files changed)"
fi
BIN=${DEDUPNODE_BIN:-}
if [ -z "$BIN" ]; then
	log "building dedupnode from $BUILT_FROM"
	(cd "$SRC" && go build -o "$WORK/dedupnode" ./cmd/dedupnode) || { log "build failed"; exit 1; }
	BIN=$WORK/dedupnode
else
	BUILT_FROM="$BIN (DEDUPNODE_BIN)"
fi
(cd "$SRC" && go build -o "$WORK/scaleprobe" ./bench/scaleprobe) || { log "build of bench/scaleprobe failed"; exit 1; }
PROBE=$WORK/scaleprobe

# --- figures -------------------------------------------------------------------
# Everything measured goes to $FIG as "key<TAB>value"; the report reads it.
FIG=$WORK/figures.tsv
: >"$FIG"
put() { printf '%s\t%s\n' "$1" "$2" >>"$FIG"; }
get() { awk -F'\t' -v k="$1" '$1 == k { v = $2 } END { print v }' "$FIG"; }
NOTES=()
note() { NOTES+=("$*"); log "NOTE: $*"; }
CMDS=()
cmd_note() { CMDS+=("$*"); }

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Machine load sampler: every 5 s, 1-min load average, busy CPU of the
# whole machine and of the nodes, in cores. Stopped by PID on exit.
sampler() {
	local prev_busy prev_total prev_nodes busy total nodes pids s n
	read -r prev_busy prev_total < <(awk '/^cpu /{b=$2+$3+$4+$7+$8+$9; t=b+$5+$6; print b, t}' /proc/stat)
	prev_nodes=0
	while :; do
		sleep 5
		read -r busy total < <(awk '/^cpu /{b=$2+$3+$4+$7+$8+$9; t=b+$5+$6; print b, t}' /proc/stat)
		nodes=0
		pids=$(cat "$WORK/pids" 2>/dev/null)
		for p in $pids; do
			s=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null) && nodes=$((nodes + s))
		done
		n=$(nproc)
		printf '%s %s %.2f %s\n' "$(now_s)" "$(cut -d' ' -f1 /proc/loadavg)" \
			"$(awk -v b=$((busy - prev_busy)) -v t=$((total - prev_total)) -v n="$n" 'BEGIN{ if (t > 0) printf "%.2f", b / t * n; else print 0 }')" \
			"$nodes" >>"$WORK/load.txt"
		prev_busy=$busy
		prev_total=$total
		prev_nodes=$nodes
	done
}
# load_summary FROM TO -> "min–max (mean M)" of the 1-min load average
load_summary() {
	awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b { n++; s += $2; if (min == "" || $2 < min) min = $2; if ($2 > max) max = $2; c += $3 }
		END { if (n) printf "%.2f–%.2f (mean %.2f; machine busy %.2f of 2 cores)", min, max, s / n, c / n; else print "n/a" }' "$WORK/load.txt"
}

write_pids() { local n; for n in "${!PID[@]}"; do [ -n "${PID[$n]}" ] && echo "${PID[$n]}"; done >"$WORK/pids"; }

# start_node NAME [mode flags...]: start `dedupnode serve` in the background
start_node() {
	local n=$1
	shift
	mkdir -p "$WORK/data"
	local extra=()
	[ -n "$LOG_STORE" ] && extra+=(--raft-log-store "$LOG_STORE")
	# shellcheck disable=SC2206 # word splitting of --serve-args is intended
	[ -n "$SERVE_ARGS" ] && extra+=($SERVE_ARGS)
	"$BIN" serve --node-id "$n" --data-dir "$WORK/data/$n" \
		--raft-addr "127.0.0.1:${RPORT[$n]}" --grpc-addr "127.0.0.1:${GPORT[$n]}" \
		--log-level warn "${extra[@]}" "$@" >>"$WORK/$n.log" 2>&1 &
	PID[$n]=$!
	write_pids
}
addr() { echo "127.0.0.1:${GPORT[$1]}"; }
status_json() { "$BIN" status --addr "$(addr "$1")" --timeout 10s -o json 2>/dev/null; }
leader_node() { # the node name of the current leader
	local n id
	for n in "${!PID[@]}"; do
		[ -n "${PID[$n]}" ] || continue
		id=$(status_json "$n" | jq -r '.leader_id // empty')
		[ -n "$id" ] && { echo "$id"; return 0; }
	done
	return 1
}
rss() { # rss NODE -> "VmRSS VmHWM RssAnon RssFile" in bytes (%.0f: mawk's %d stops at 2^31-1)
	awk '/^VmRSS:/{r=$2} /^VmHWM:/{h=$2} /^RssAnon:/{a=$2} /^RssFile:/{f=$2}
		END { printf "%.0f %.0f %.0f %.0f\n", r*1024, h*1024, a*1024, f*1024 }' "/proc/${PID[$1]}/status" 2>/dev/null
}
dub() { # allocated bytes of a path (0 if missing)
	[ -e "$1" ] || { echo 0; return; }
	du -s -B1 "$1" 2>/dev/null | cut -f1
}
disk() { # disk NODE -> "raft_log snapshots pebble" (the log: raft.db or wal/, whichever store)
	local d=$WORK/data/$1
	echo "$(($(dub "$d/raft/raft.db") + $(dub "$d/raft/wal"))) $(dub "$d/raft/snapshots") $(dub "$d/fsm")"
}
mib() { awk -v b="$1" 'BEGIN { m = b / 1048576; if (m < 100) printf "%.1f MiB", m; else printf "%.0f MiB", m }'; }
per_id() { awk -v b="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", b / n; else print "-" }'; }
secs() { awk -v m="$1" 'BEGIN { if (m == "") print "-"; else printf "%.2f s", m / 1000 }'; }

# record_node PHASE NODE: RSS, disk and status figures of one node
record_node() {
	local ph=$1 n=$2 r d st
	r=$(rss "$n")
	d=$(disk "$n")
	st=$(status_json "$n")
	put "$ph.$n.rss" "$r"
	put "$ph.$n.disk" "$d"
	put "$ph.$n.ids" "$(jq -r '.ids_stored // 0' <<<"$st")"
	put "$ph.$n.bloom" "$(jq -r '"\(.bloom.memory_bytes // 0) \(.bloom.bits_per_id // 0) \(.bloom.filters // 0)"' <<<"$st")"
	put "$ph.$n.state" "$(jq -r '"\(.state // "?") applied=\(.applied_index // 0) snapshot=\(.last_snapshot_index // 0)"' <<<"$st")"
}

# wait_caught_up NODE TIMEOUT_S: the node applied up to the leader's commit index
wait_caught_up() {
	"$BIN" status --addr "$(addr "$1")" --wait --timeout "${2}s" -o json >/dev/null 2>>"$LOG"
}

# --- report ------------------------------------------------------------------
report() {
	local n ph r d ids b
	{
		echo "# Scale figures, $SIZE IDs, $NODES-node cluster ($DATE)"
		echo
		echo "Command: \`scripts/scale.sh${ARGS_GIVEN:+ $ARGS_GIVEN}\`; dedupnode built from $BUILT_FROM."
		echo "Machine: $(nproc) cores ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(go env GOVERSION 2>/dev/null || echo go); every node and the load generator on the same machine, over loopback."
		echo "Started $(date -u -d "@$T0" +%H:%M:%S) UTC, took $(( ($(now_s) - T0) / 60 )) min $(( ($(now_s) - T0) % 60 )) s."
		echo "Machine load (1-min load average, sampled every 5 s): whole run $(load_summary "$T0" "$(now_s)"); during the load $(load_summary "$(get load.t0)" "$(get load.t1)")."
		echo
		echo "## Load"
		echo
		echo "\`$(get load.cmd)\`"
		echo
		echo "$(get load.ids) IDs in $(get load.secs) s = $(get load.rate) IDs/s, p99 $(get load.p99) ms per call of $BATCH IDs, errors $(get load.errors); namespace \`scale\`, TTL $TTL_S s (expiry buckets $BUCKET_S s wide)."
		echo
		for ph in load snap; do
			[ -n "$(get "$ph.nodes")" ] || continue
			if [ "$ph" = load ]; then
				echo "### RSS and disk per node, after the load (all nodes caught up)"
			else
				echo "### RSS and disk per node, after the leader's Raft snapshot and log compaction"
			fi
			echo
			echo "| node | IDs stored | VmRSS | RSS / ID | peak (VmHWM) | anon / file-backed | Bloom | Raft log | Raft snapshots | Pebble | disk / ID |"
			echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
			for n in $(get "$ph.nodes"); do
				read -r r1 r2 r3 r4 <<<"$(get "$ph.$n.rss")"
				read -r d1 d2 d3 <<<"$(get "$ph.$n.disk")"
				read -r b1 b2 _ <<<"$(get "$ph.$n.bloom")"
				ids=$(get "$ph.$n.ids")
				echo "| $n ($(get "$ph.$n.state" | cut -d' ' -f1)) | $ids | $(mib "${r1:-0}") | $(per_id "${r1:-0}" "$ids") B | $(mib "${r2:-0}") | $(mib "${r3:-0}") / $(mib "${r4:-0}") | $(mib "${b1:-0}"), $(printf '%.1f' "${b2:-0}") bits/ID | $(mib "${d1:-0}") ($(per_id "${d1:-0}" "$ids") B/ID) | $(mib "${d2:-0}") | $(mib "${d3:-0}") ($(per_id "${d3:-0}" "$ids") B/ID) | $(per_id $(( ${d1:-0} + ${d2:-0} + ${d3:-0} )) "$ids") B |"
			done
			echo
		done
		if [ -n "$(get restart.rows)" ]; then
			echo "## Restart of a node holding $SIZE IDs"
			echo
			echo "Milliseconds from the start of \`dedupnode serve\` on the existing data directory. \"caught up\": it knows a leader and applied the log up to the leader's commit index (what \`dedupnode status --wait\` waits for); \"check\": a linearizable Check sent to that node (no leader routing) answers SEEN for an ID marked before; \"Bloom\": its filters are loaded (clean stop) or rebuilt (crash) — until then reads go to Pebble."
			echo
			echo "| what | stop took | port open | leader known | caught up | linearizable check | Bloom ready | VmRSS at caught up | VmRSS after Bloom |"
			echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
			for ph in $(get restart.rows); do
				echo "| $(get "$ph.what") | $(get "$ph.stop") | $(secs "$(get "$ph.listen")") | $(secs "$(get "$ph.leader")") | $(secs "$(get "$ph.caught")") | $(secs "$(get "$ph.check")") | $(secs "$(get "$ph.bloom")") | $(mib "$(get "$ph.rss1")") | $(mib "$(get "$ph.rss2")") |"
			done
			echo
		fi
		if [ -n "$(get follower.done)" ]; then
			echo "## A new follower from a snapshot of $SIZE IDs"
			echo
			echo "\`$(get follower.cmd)\`; milliseconds from its start. The leader's last snapshot was at index $(get follower.leader_snap) (commit index $(get follower.leader_commit)); raft keeps 10 240 entries behind a snapshot, so the new node had to install it. \"snapshot received\": the snapshot file is in its snapshot store (its status shows a snapshot index); it is then restored into Pebble and the Bloom filters, and the log after it replayed, until \"caught up\"."
			echo
			echo "| port open | leader known | snapshot received | caught up (snapshot restored, log replayed) | linearizable check | voter | its VmRSS | its disk (log / snapshots / Pebble) |"
			echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
			read -r d1 d2 d3 <<<"$(get follower.disk)"
			echo "| $(secs "$(get follower.listen)") | $(secs "$(get follower.leader)") | $(secs "$(get follower.snapshot)") (index $(get follower.snapindex)) | $(secs "$(get follower.caught)") | $(secs "$(get follower.check)") | $(secs "$(get follower.voter)") | $(mib "$(get follower.rss)") | $(mib "${d1:-0}") / $(mib "${d2:-0}") / $(mib "${d3:-0}") |"
			echo
		fi
		if [ -n "$(get expiry.nodes)" ]; then
			echo "## Disk space returned after the IDs expired"
			echo
			echo "Every loaded ID had expired at $(get expiry.t_exp_h) UTC; the last expiry bucket could be dropped $BUCKET_S s later. Pebble (fsm/) bytes per node; the Raft log comes back only with wal (whole segments deleted behind a snapshot); boltdb never shrinks its file, it reuses its free pages."
			echo
			echo "| node | IDs stored before / after | Pebble before | Pebble after | returned | Raft log before / after | Pebble size last changed (s after the last bucket could be dropped; +0 = by the first poll) |"
			echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
			for n in $(get expiry.nodes); do
				read -r _ _ p0 <<<"$(get "expiry.$n.before")"
				read -r l0 _ _ <<<"$(get "expiry.$n.before")"
				read -r l1 _ p1 <<<"$(get "expiry.$n.after")"
				echo "| $n | $(get "expiry.$n.ids0") / $(get "expiry.$n.ids1") | $(mib "${p0:-0}") | $(mib "${p1:-0}") | $(awk -v a="${p0:-0}" -v b="${p1:-0}" 'BEGIN { if (a > 0) printf "%.0f%%", (a - b) / a * 100; else print "-" }') | $(mib "${l0:-0}") / $(mib "${l1:-0}") | $(get "expiry.$n.at") |"
			done
			echo
			echo "$(get expiry.verdict)"
			echo
		fi
		if [ -n "$(get raftlog.nodes)" ]; then
			echo "## Raft log on disk against the entries it keeps"
			echo
			echo "Every node stopped (SIGTERM) at the end of the run, then its Raft log read offline (\`scaleprobe --raft-log DIR\`): the entries it keeps (from its first index — the last snapshot's index minus the trailing logs, after a truncation — to its last), their bytes (entry data), and the log's allocated size on disk (du). Bound: disk ≤ 2× the kept entries' bytes."
			echo
			echo "| node | store | last snapshot | log first..last index | entries kept | their bytes | log on disk | disk / kept | ≤ 2× |"
			echo "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"
			for n in $(get raftlog.nodes); do
				read -r st fi li ne eb db <<<"$(get "raftlog.$n")"
				echo "| $n | $st | $(get "raftlog.$n.snap") | $fi..$li | $ne | $(mib "${eb:-0}") | $(mib "${db:-0}") | $(awk -v d="${db:-0}" -v e="${eb:-0}" 'BEGIN { if (e > 0) printf "%.2f", d / e; else print "-" }') | $(awk -v d="${db:-0}" -v e="${eb:-0}" 'BEGIN { if (e > 0 && d <= 2 * e) print "yes"; else print "**no**" }') |"
			done
			echo
		fi
		if [ ${#NOTES[@]} -gt 0 ]; then
			echo "## Notes"
			echo
			for x in "${NOTES[@]}"; do echo "- $x"; done
			echo
		fi
		echo "## Commands run"
		echo
		echo '```'
		for x in "${CMDS[@]}"; do echo "$x"; done
		echo '```'
	} >"$WORK/report.md"
	cp "$WORK/report.md" "$OUT"
	cat "$WORK/report.md"
	log "report written to $OUT"
}

fatal() { note "stopped early: $*"; report; exit 1; }

# =============================================================================
log "data under $WORK ($(df -h --output=avail "$WORK" | tail -1 | tr -d ' ') free); $SIZE IDs, $NODES node(s), TTL ${TTL_S}s, load average $(loadavg)"
sampler &
SAMPLER=$!

# --- cluster -------------------------------------------------------------------
NAMES=()
for ((i = 1; i <= NODES; i++)); do NAMES+=("n$i"); done
for n in "${NAMES[@]}" n9; do
	GPORT[$n]=$(free_port) || fatal "no free port"
	RPORT[$n]=$(free_port) || fatal "no free port"
done
if [ "$NODES" = 1 ]; then
	start_node n1 --bootstrap
	cmd_note "dedupnode serve --node-id n1 --data-dir DIR/n1 --raft-addr 127.0.0.1:${RPORT[n1]} --grpc-addr 127.0.0.1:${GPORT[n1]} --log-level warn --bootstrap"
else
	PEERS=""
	for n in "${NAMES[@]}"; do PEERS+="${PEERS:+,}$n=127.0.0.1:${RPORT[$n]}=127.0.0.1:${GPORT[$n]}"; done
	for n in "${NAMES[@]}"; do start_node "$n" --peers "$PEERS"; done
	cmd_note "dedupnode serve --node-id nI --data-dir DIR/nI --raft-addr R --grpc-addr G --log-level warn --peers $PEERS   # I = 1..3"
fi
ALL=$(for n in "${NAMES[@]}"; do printf '%s,' "$(addr "$n")"; done)
ALL=${ALL%,}
for n in "${NAMES[@]}"; do
	wait_caught_up "$n" 60 || fatal "$n not ready within 60 s (see $WORK/$n.log)"
done
LEADER=$(leader_node) || fatal "no leader"
log "cluster up: $ALL, leader $LEADER"

"$BIN" namespace create scale --ttl "${TTL_S}s" --max-ttl "${TTL_S}s" --addr "$ALL" -o json >>"$LOG" 2>&1 ||
	fatal "namespace create failed"
cmd_note "dedupnode namespace create scale --ttl ${TTL_S}s --max-ttl ${TTL_S}s"
"$BIN" mark -n scale --addr "$ALL" scale-probe >>"$LOG" 2>&1 || fatal "mark of the probe ID failed"
cmd_note "dedupnode mark -n scale scale-probe"
LAST_MARK=$(now_s)

# --- 1. load -------------------------------------------------------------------
LOADCMD="dedupnode bench -w mark-new -n scale --create-namespace=false --ttl ${TTL_S}s -c $CONC -b $BATCH --count $IDS --max-time ${LOAD_MAX}s --timeout 30s --no-progress -o json"
put load.cmd "$LOADCMD"
cmd_note "$LOADCMD --addr $ALL"
log "loading $SIZE IDs (bound ${LOAD_MAX}s; load average $(loadavg))"
put load.t0 "$(now_s)"
LOAD_START=$(now_s)
"$BIN" bench -w mark-new -n scale --create-namespace=false --ttl "${TTL_S}s" -c "$CONC" -b "$BATCH" \
	--count "$IDS" --max-time "${LOAD_MAX}s" --timeout 30s --no-progress -o json --addr "$ALL" \
	>"$WORK/load.json" 2>>"$LOG" &
BENCH=$!
BGPIDS+=("$BENCH")
ticks=0
while kill -0 "$BENCH" 2>/dev/null; do
	sleep 1
	ticks=$((ticks + 1))
	if [ $((ticks % 30)) = 0 ] && kill -0 "$BENCH" 2>/dev/null; then
		log "  $(status_json "$LEADER" | jq -r '.ids_stored') IDs stored on $LEADER; load average $(loadavg)"
	fi
done
wait "$BENCH"
rc=$?
put load.t1 "$(now_s)"
LAST_MARK=$(now_s)
[ -s "$WORK/load.json" ] || fatal "the load produced no result (exit $rc; see $LOG)"
put load.ids "$(jq -r .ids "$WORK/load.json")"
put load.secs "$(jq -r .duration_sec "$WORK/load.json")"
put load.rate "$(jq -r '.ids_per_sec | floor' "$WORK/load.json")"
put load.p99 "$(jq -r .p99_ms "$WORK/load.json")"
put load.errors "$(jq -r .errors "$WORK/load.json")"
log "loaded $(get load.ids) IDs in $(get load.secs) s ($(get load.rate) IDs/s), bench exit $rc"
[ "$(get load.ids)" -ge "$IDS" ] || note "the load stopped at $(get load.ids) of $IDS IDs (bench exit $rc: $(jq -r '.note // empty' "$WORK/load.json"))"
if [ "$(jq -r '.outcomes.NEW // 0' "$WORK/load.json")" != "$(get load.ids)" ]; then
	note "not every answer was NEW: $(jq -c .outcomes "$WORK/load.json")"
fi

for n in "${NAMES[@]}"; do
	wait_caught_up "$n" 300 || note "$n had not caught up 300 s after the load"
done
sleep 10 # let the last flushes settle
put load.nodes "${NAMES[*]}"
for n in "${NAMES[@]}"; do record_node load "$n"; done
log "after load: $(for n in "${NAMES[@]}"; do printf '%s rss=%s disk=%s; ' "$n" "$(get "load.$n.rss" | cut -d' ' -f1)" "$(get "load.$n.disk")"; done)"
expired_check() { # note if the first loaded IDs may have expired already
	if [ "$(now_s)" -ge $((LOAD_START + TTL_S)) ]; then
		note "$1 was measured $(($(now_s) - LOAD_START - TTL_S)) s after the first loaded IDs expired: raise --ttl"
	fi
}
expired_check "the RSS/disk after the load"

# --- 2. restart ----------------------------------------------------------------
# restart_node PHASE NODE SIGNAL WHAT
restart_node() {
	local ph=$1 n=$2 sig=$3 what=$4 t0 t1 since out
	t0=$(now_ns)
	if [ "$sig" = KILL ]; then
		kill -KILL "${PID[$n]}" 2>/dev/null
		wait "${PID[$n]}" 2>/dev/null
	else
		stop_pid "${PID[$n]}" 60
	fi
	t1=$(now_ns)
	PID[$n]=""
	write_pids
	put "$ph.stop" "$(secs $(((t1 - t0) / 1000000)))"
	since=$(now_ns)
	start_node "$n"
	out=$("$PROBE" --addr "$(addr "$n")" --since "$since" --timeout 300s --namespace scale --id scale-probe \
		--until caught_up,check,bloom 2>>"$LOG")
	echo "$out" >>"$LOG"
	put "$ph.what" "$what"
	put "$ph.listen" "$(jq -r '.listen_ms // empty' <<<"$out")"
	put "$ph.leader" "$(jq -r '.leader_ms // empty' <<<"$out")"
	put "$ph.caught" "$(jq -r '.caught_up_ms // empty' <<<"$out")"
	put "$ph.check" "$(jq -r '.check_ms // empty' <<<"$out")"
	put "$ph.bloom" "$(jq -r '.bloom_ms // empty' <<<"$out")"
	put "$ph.rss1" "$(rss "$n" | cut -d' ' -f1)"
	[ -n "$(jq -r '.error // empty' <<<"$out")" ] && note "$what: $(jq -r .error <<<"$out")"
	sleep 5
	put "$ph.rss2" "$(rss "$n" | cut -d' ' -f1)"
	log "$what: $(jq -c . <<<"$out")"
}
if ! skip restart; then
	RN=n1
	if [ "$NODES" -gt 1 ]; then
		for n in "${NAMES[@]}"; do [ "$n" != "$LEADER" ] && RN=$n && break; done
		W="follower $RN of 3"
	else
		W="the only node"
	fi
	restart_node rs1 "$RN" TERM "$W, SIGTERM (clean stop) then start"
	# a crash under writes: the node applies fresh marks after its clean
	# start, so the Bloom filters it saved at the clean stop are stale and
	# must be rebuilt (fsm/DESIGN.md "Trade-offs")
	"$BIN" bench -w mark-new -n scale --create-namespace=false --ttl "${TTL_S}s" -c 4 -b 500 --count 20000 \
		--max-time 60s --no-progress -o json --addr "$ALL" >>"$LOG" 2>&1 || note "the marks before the crash failed"
	LAST_MARK=$(now_s)
	wait_caught_up "$RN" 60 || note "$RN had not caught up 60 s after the marks before the crash"
	cmd_note "dedupnode bench -w mark-new -n scale --create-namespace=false --ttl ${TTL_S}s -c 4 -b 500 --count 20000   # before the kill -9"
	restart_node rs2 "$RN" KILL "$W, 20 000 fresh marks, then kill -9 (crash) and start"
	put restart.rows "rs1 rs2"
	cmd_note "kill -TERM PID (or kill -KILL PID); dedupnode serve --node-id $RN --data-dir DIR/$RN --raft-addr R --grpc-addr G --log-level warn"
	cmd_note "scaleprobe --addr G --since START_NS --namespace scale --id scale-probe --until caught_up,check,bloom   # bench/scaleprobe"
	expired_check "the restart"
	LEADER=$(leader_node) || fatal "no leader after the restarts"
fi

# --- 3. new follower from a snapshot --------------------------------------------
TRAILING=10240 # hashicorp/raft's default TrailingLogs (cluster/ keeps it)
if ! skip follower; then
	st=$(status_json "$LEADER")
	snap=$(jq -r '.last_snapshot_index' <<<"$st")
	commit=$(jq -r '.commit_index' <<<"$st")
	log "leader $LEADER: commit $commit, last snapshot $snap"
	# The new node needs a snapshot only if the leader's log no longer
	# starts at index 1: after a snapshot at S raft keeps S-10240.. .
	if [ "$snap" -le $((TRAILING + 1)) ]; then
		target=$((TRAILING + 400))
		[ "$commit" -gt $((target - 8192)) ] && target=$((commit + 8192 + 200)) # raft snapshots after 8192 new entries
		if [ "$commit" -lt "$target" ]; then
			PADCMD="dedupnode bench -w mark-new -n scale --create-namespace=false --ttl ${TTL_S}s -c 2 -b 1 --count N --max-time 120s --no-progress -o json"
			cmd_note "$PADCMD   # pads the Raft log with small entries, until the commit index passes $target"
			note "the load made only $commit Raft entries (about $((IDS / (commit > 0 ? commit : 1))) IDs per entry) and raft keeps $TRAILING entries behind a snapshot, so a new follower would have replayed the whole log, not a snapshot; the script padded the log with single-ID marks (2 callers) to index $target and waited for the leader's snapshot"
			for ((k = 0; k < 8; k++)); do
				commit=$(status_json "$LEADER" | jq -r '.commit_index')
				[ "$commit" -ge "$target" ] && break
				need=$(((target - commit) + 500))
				log "padding the log: commit $commit, target $target, $need single-ID marks"
				"$BIN" bench -w mark-new -n scale --create-namespace=false --ttl "${TTL_S}s" -c 2 -b 1 --count "$need" \
					--max-time 120s --no-progress -o json --addr "$(addr "$LEADER")" >>"$LOG" 2>&1
			done
			LAST_MARK=$(now_s)
		fi
		log "waiting for the leader's snapshot past index $((TRAILING + 1)) (raft checks every 120-240 s)"
		deadline=$(($(now_s) + 330))
		while [ "$(now_s)" -lt "$deadline" ]; do
			snap=$(status_json "$LEADER" | jq -r '.last_snapshot_index')
			[ "$snap" -gt $((TRAILING + 1)) ] && break
			sleep 2
		done
	fi
	st=$(status_json "$LEADER")
	snap=$(jq -r '.last_snapshot_index' <<<"$st")
	put follower.leader_snap "$snap"
	put follower.leader_commit "$(jq -r '.commit_index' <<<"$st")"
	if [ "$snap" -le $((TRAILING + 1)) ]; then
		note "the leader had no snapshot past index $((TRAILING + 1)) within 330 s (last $snap): the new follower may have replayed the log instead"
	fi
	put snap.nodes "${NAMES[*]}"
	for n in "${NAMES[@]}"; do record_node snap "$n"; done
	log "follower n9 joins through $LEADER"
	since=$(now_ns)
	start_node n9 --join "$(addr "$LEADER")"
	put follower.cmd "dedupnode serve --node-id n9 --data-dir DIR/n9 --raft-addr R --grpc-addr G --log-level warn --join LEADER"
	cmd_note "dedupnode serve --node-id n9 --data-dir DIR/n9 --raft-addr 127.0.0.1:${RPORT[n9]} --grpc-addr 127.0.0.1:${GPORT[n9]} --log-level warn --join $(addr "$LEADER")"
	out=$("$PROBE" --addr "$(addr n9)" --since "$since" --timeout 900s --namespace scale --id scale-probe \
		--until snapshot,caught_up,check,voter 2>>"$LOG")
	echo "$out" >>"$LOG"
	log "follower: $(jq -c . <<<"$out")"
	put follower.listen "$(jq -r '.listen_ms // empty' <<<"$out")"
	put follower.leader "$(jq -r '.leader_ms // empty' <<<"$out")"
	put follower.snapshot "$(jq -r '.snapshot_ms // empty' <<<"$out")"
	put follower.snapindex "$(jq -r '.snapshot_index // empty' <<<"$out")"
	put follower.caught "$(jq -r '.caught_up_ms // empty' <<<"$out")"
	put follower.check "$(jq -r '.check_ms // empty' <<<"$out")"
	put follower.voter "$(jq -r '.voter_ms // empty' <<<"$out")"
	put follower.rss "$(rss n9 | cut -d' ' -f1)"
	put follower.disk "$(disk n9)"
	put follower.done 1
	[ -n "$(jq -r '.error // empty' <<<"$out")" ] && note "new follower: $(jq -r .error <<<"$out")"
	NAMES+=(n9)
	expired_check "the new follower"
fi

# --- 4. space returned after expiry ---------------------------------------------
if ! skip expiry; then
	T_EXP=$((LAST_MARK + TTL_S + 1))
	put expiry.t_exp_h "$(date -u -d "@$T_EXP" +%H:%M:%S)"
	put expiry.nodes "${NAMES[*]}"
	for n in "${NAMES[@]}"; do
		put "expiry.$n.before" "$(disk "$n")"
		put "expiry.$n.ids0" "$(status_json "$n" | jq -r '.ids_stored // 0')"
	done
	wake=$((T_EXP + BUCKET_S + 2))
	log "waiting $((wake - $(now_s))) s until every ID expired and its bucket may be dropped ($(date -u -d "@$wake" +%H:%M:%S) UTC)"
	while [ "$(now_s)" -lt "$wake" ]; do
		sleep $((wake - $(now_s) > 60 ? 60 : (wake - $(now_s) > 0 ? wake - $(now_s) : 1)))
	done
	deadline=$(($(now_s) + EXPIRY_MAX))
	declare -A LASTSZ AT
	ok=0
	while [ "$(now_s)" -lt "$deadline" ]; do
		all=1
		line=""
		for n in "${NAMES[@]}"; do
			read -r _ _ p <<<"$(disk "$n")"
			read -r _ _ p0 <<<"$(get "expiry.$n.before")"
			ids=$(status_json "$n" | jq -r '.ids_stored // -1')
			if [ "${LASTSZ[$n]:-}" != "$p" ]; then
				LASTSZ[$n]=$p
				AT[$n]=$(($(now_s) - wake))
			fi
			line+="$n ids=$ids pebble=$(mib "$p"); "
			# done when nothing is stored and Pebble shrank to a fifth or
			# less, or stopped changing for 60 s (preallocated WAL files)
			if [ "$ids" != 0 ] || { [ "$p" -gt $((p0 / 5)) ] && [ $(($(now_s) - wake - AT[$n])) -lt 60 ]; }; then all=0; fi
		done
		log "  $line"
		if [ "$all" = 1 ]; then
			ok=$((ok + 1))
			[ "$ok" -ge 2 ] && break
		else
			ok=0
		fi
		sleep 10
	done
	for n in "${NAMES[@]}"; do
		put "expiry.$n.after" "$(disk "$n")"
		put "expiry.$n.ids1" "$(status_json "$n" | jq -r '.ids_stored // -1')"
		put "expiry.$n.at" "+${AT[$n]:-?} s"
	done
	if [ "$ok" -ge 2 ]; then
		put expiry.verdict "Polled every 10 s from $BUCKET_S s after the last expiry until every node stored 0 IDs and its Pebble directory had shrunk to a fifth or less of its size before expiry or stopped changing for 60 s; the last column says when each node's Pebble size last changed (seconds after the last bucket could be dropped). Sizes are allocated bytes (du -B1): Pebble preallocates its WAL files."
	else
		put expiry.verdict "Within the --expiry-max bound ($EXPIRY_MAX s after the last bucket could be dropped) not every node reached 0 IDs stored and a Pebble directory a fifth or less of its earlier size; the figures are as of the deadline."
		note "space after expiry: not every node had returned its space within ${EXPIRY_MAX} s"
	fi
	cmd_note "(wait until every ID expired, then poll du -s -B1 DIR/nI/fsm and dedupnode status -o json every 10 s, at most ${EXPIRY_MAX}s)"
fi

# --- 5. the Raft log on disk against the entries it keeps ------------------------
if ! skip raftlog; then
	for n in "${NAMES[@]}"; do
		[ -n "${PID[$n]:-}" ] || continue
		put "raftlog.$n.snap" "$(status_json "$n" | jq -r '.last_snapshot_index // 0')"
	done
	for n in "${NAMES[@]}"; do
		[ -n "${PID[$n]:-}" ] || continue
		stop_pid "${PID[$n]}" 60
		PID[$n]=""
		write_pids
		out=$("$PROBE" --raft-log "$WORK/data/$n" 2>>"$LOG") || { note "scaleprobe --raft-log $n failed (see $LOG)"; continue; }
		echo "$out" >>"$LOG"
		put "raftlog.$n" "$(jq -r '"\(.store) \(.first_index) \(.last_index) \(.entries) \(.entry_bytes) \(.disk_bytes)"' <<<"$out")"
		put raftlog.nodes "$(get raftlog.nodes) $n"
		log "raft log of $n: $(jq -c . <<<"$out")"
		if [ "$(jq -r .first_index <<<"$out")" -le 1 ]; then
			note "$n's Raft log was never truncated (first index $(jq -r .first_index <<<"$out")): no snapshot past the trailing logs yet, so the bound is not tested on it"
		fi
	done
	cmd_note "kill -TERM PID; scaleprobe --raft-log DIR/nI   # every node, at the end"
fi

report
