#!/usr/bin/env bash
# CI chaos run: about two minutes of a 3-node process-mode cluster under
# faults (kill -9 of the leader and of any node, graceful restarts,
# SIGSTOP/SIGCONT, partitions, one-way and asymmetric Raft links, slow and
# resetting links, kill -9 of every node at once), then the history check.
# Exits non-zero on any invariant violation, after writing the smallest
# offending history and the whole history to $CHAOS_OUT (default .chaos/).
#
#   scripts/chaos-ci.sh                      # 90 s under faults (~2 min in all)
#   CHAOS_DURATION=10m scripts/chaos-ci.sh   # longer
#   CHAOS_SEED=42 scripts/chaos-ci.sh        # repeat a run's choices
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${CHAOS_DURATION:-90s}"
out="${CHAOS_OUT:-.chaos}"
mkdir -p "$out"
rm -f "$out/violation.json" "$out/history.json"

# Built as the tests build it (internal/testbin; .ci/run sets
# GOFLAGS=-pgo=off), so after the test run it is a link, not a compile of
# every dependency in a mode of its own.
go build -o "$out/dedupnode" ./cmd/dedupnode

args=(chaos --mode process --duration "$duration" --nodes "${CHAOS_NODES:-3}" --clients "${CHAOS_CLIENTS:-8}"
  --violation-file "$out/violation.json" --log-level warn)
[[ -n "${CHAOS_SEED:-}" ]] && args+=(--seed "$CHAOS_SEED")

set +e
"$out/dedupnode" "${args[@]}" | tee "$out/report.txt"
rc=${PIPESTATUS[0]}
set -e
if [[ "$rc" != 0 ]]; then
  echo "chaos-ci: FAILED (exit $rc); report in $out/report.txt" >&2
  [[ -f "$out/violation.json" ]] && echo "chaos-ci: smallest offending history: $out/violation.json" >&2
  exit "$rc"
fi
echo "chaos-ci: passed"
