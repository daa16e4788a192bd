# shellcheck shell=bash
# cleanup.sh — sourced by the scripts that start processes and keep their
# scratch files in one directory (case-series.sh, ab-logstore.sh), so that
# every way out of them stops what they started and leaves nothing behind.
#
# REQUIRES: WORK, the script's scratch directory, set before sourcing.
# The script appends the PID of every process it starts to PIDS. On exit,
# also after Ctrl-C or TERM (exit status 130), each of those gets SIGTERM
# and is waited for (stopped by PID, never by name), then WORK is removed.
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
