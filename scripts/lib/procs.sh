# shellcheck shell=bash
# procs.sh — helpers sourced by the scripts that start local nodes and
# measure them (case-series.sh, ab-logstore.sh).

# free_port prints a loopback TCP port the OS reports free now.
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# cpu_ticks prints the summed utime+stime of the given PIDs, in clock ticks
# (HZ per second); a PID that is gone counts 0.
cpu_ticks() {
	local t=0 p s
	for p in "$@"; do
		s=$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null) && t=$((t + s))
	done
	echo "$t"
}
HZ=$(getconf CLK_TCK)
