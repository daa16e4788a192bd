package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a server process this harness started; it is stopped by its PID.
type proc struct {
	name    string
	cmd     *exec.Cmd
	pid     int
	stopSig syscall.Signal
	done    chan struct{}
	logPath string
	mu      sync.Mutex
	exitErr error
}

// procs tracks every child, so an interrupted run still stops them all.
var (
	procsMu sync.Mutex
	procs   = map[int]*proc{}
)

type startOpts struct {
	name    string
	path    string
	args    []string
	dir     string // working directory
	logPath string // stdout+stderr go here
	uid     int    // run as this user when > 0 (postgres refuses root)
	gid     int
	stopSig syscall.Signal // default SIGTERM
	stdout  io.Writer      // optional extra copy of stdout (e.g. to parse it)
}

func startProc(o startOpts) (*proc, error) {
	logf, err := os.OpenFile(o.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.path, o.args...)
	cmd.Dir = o.dir
	cmd.Stderr = logf
	if o.stdout != nil {
		cmd.Stdout = io.MultiWriter(logf, o.stdout)
	} else {
		cmd.Stdout = logf
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,            // our signals (Ctrl-C) are not theirs; we stop them ourselves
		Pdeathsig: syscall.SIGKILL, // and they die with the harness
	}
	if o.uid > 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(o.uid), Gid: uint32(o.gid)}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", o.name, err)
	}
	sig := o.stopSig
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	p := &proc{name: o.name, cmd: cmd, pid: cmd.Process.Pid, stopSig: sig, done: make(chan struct{}), logPath: o.logPath}
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
		procsMu.Lock()
		delete(procs, p.pid)
		procsMu.Unlock()
	}()
	procsMu.Lock()
	procs[p.pid] = p
	procsMu.Unlock()
	logf2("started %s pid %d", o.name, p.pid)
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends the stop signal to the PID, waits up to 15 s, then SIGKILLs
// the PID and its process group (the group this harness created for it).
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(p.pid, p.stopSig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		logf2("%s pid %d did not stop in 15 s; killing", p.name, p.pid)
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
	}
	logf2("stopped %s pid %d", p.name, p.pid)
}

func (p *proc) tailLog(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stopAll stops every child still running (on interrupt or exit).
func stopAll() {
	procsMu.Lock()
	list := make([]*proc, 0, len(procs))
	for _, p := range procs {
		list = append(list, p)
	}
	procsMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop() }()
	}
	wg.Wait()
}

// freePorts asks the OS for n free loopback TCP ports.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitFor polls check every 100 ms until it succeeds, the process dies or
// the timeout passes.
func waitFor(ctx context.Context, what string, timeout time.Duration, ps []*proc, check func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		for _, p := range ps {
			if p.exited() {
				return fmt.Errorf("%s exited while waiting for %s; log tail:\n%s", p.name, what, p.tailLog(15))
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w", what, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cpuSeconds returns the CPU time (user+system) of the given processes and
// all their descendants, from /proc.
func cpuSeconds(roots []int) float64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	type st struct {
		ppid  int
		ticks int64
	}
	all := map[int]st{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// fields after the ")" that closes the command name
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		stt, _ := strconv.ParseInt(f[12], 10, 64)
		all[pid] = st{ppid: ppid, ticks: ut + stt}
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	// descendants: iterate until no change (trees are shallow)
	for changed := true; changed; {
		changed = false
		for pid, s := range all {
			if !in[pid] && in[s.ppid] {
				in[pid] = true
				changed = true
			}
		}
	}
	var ticks int64
	for pid := range in {
		ticks += all[pid].ticks
	}
	return float64(ticks) / 100 // USER_HZ is 100 on Linux
}

// selfCPUSeconds is this process's own CPU time (the load generator).
func selfCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// lineWatcher is an io.Writer that reports the first line with a prefix.
type lineWatcher struct {
	prefix string
	mu     sync.Mutex
	buf    []byte
	found  chan string
	once   sync.Once
}

func newLineWatcher(prefix string) *lineWatcher {
	return &lineWatcher{prefix: prefix, found: make(chan string, 1)}
}

func (w *lineWatcher) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if j := strings.Index(line, w.prefix); j >= 0 {
			rest := strings.TrimSpace(line[j+len(w.prefix):])
			w.once.Do(func() { w.found <- rest })
		}
	}
	if len(w.buf) > 1<<16 {
		w.buf = w.buf[len(w.buf)-1<<16:]
	}
	return len(b), nil
}

// readFirstLine returns the first line of a file (versions etc.).
func readFirstLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		return sc.Text()
	}
	return ""
}

var errSkip = errors.New("skipped")

func logf2(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// machineBusySeconds is the CPU time all processes on the machine spent
// (user, nice, system, irq, softirq, steal), from /proc/stat.
func machineBusySeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return float64(ticks) / 100
}

// cpuSample is the CPU clock of the servers, this harness and the machine.
type cpuSample struct{ server, self, machine float64 }

func sampleCPU(pids []int) cpuSample {
	return cpuSample{server: cpuSeconds(pids), self: selfCPUSeconds(), machine: machineBusySeconds()}
}
