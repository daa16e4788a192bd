package rabbitproc_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/internal/rabbitproc"
)

// TestListensOnLoopbackOnly: every TCP socket the broker, its helpers and
// its port mapper listen on is bound to loopback. (The Erlang
// distribution listener used to bind every interface, on a port any
// machine on the network could reach.)
func TestListensOnLoopbackOnly(t *testing.T) {
	if _, err := rabbitproc.Find(); err != nil {
		if os.Getenv(rabbitproc.RequireEnv) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if testing.Short() && os.Getenv(rabbitproc.RequireEnv) != "1" {
		t.Skip("-short: not starting a RabbitMQ broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := rabbitproc.Start(ctx, rabbitproc.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// The broker and the port mapper are this process's children, each
	// leading a process group that holds its helpers.
	groups := map[int]bool{}
	for _, pid := range pids(t) {
		if st, ok := procStat(pid); ok && st.ppid == os.Getpid() {
			groups[st.pgrp] = true
		}
	}
	if !groups[s.PID()] {
		t.Fatalf("the broker (pid %d) is not among this process's children's groups %v", s.PID(), groups)
	}
	inodes := map[string]int{} // socket inode -> pid
	for _, pid := range pids(t) {
		if st, ok := procStat(pid); !ok || !groups[st.pgrp] {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
			if ino, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
				inodes[strings.TrimSuffix(ino, "]")] = pid
			}
		}
	}
	listening := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, l := range listeners(t, file) {
			pid, ours := inodes[l.inode]
			if !ours {
				continue
			}
			listening++
			if !l.addr.IP.IsLoopback() {
				t.Errorf("pid %d (%s) listens on %v, not on loopback", pid, comm(pid), l.addr)
			} else {
				t.Logf("pid %d (%s) listens on %v", pid, comm(pid), l.addr)
			}
		}
	}
	// AMQP, distribution and the port mapper at least.
	if listening < 3 {
		t.Fatalf("found %d listening sockets of the broker's processes, want at least 3 (AMQP, distribution, epmd)", listening)
	}
}

func pids(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

type stat struct{ ppid, pgrp int }

// procStat reads the parent and process group of pid from
// /proc/PID/stat (fields 4 and 5, after the command in parentheses).
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, false
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return stat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	return stat{ppid, pgrp}, err1 == nil && err2 == nil
}

func comm(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}

type listener struct {
	addr  net.TCPAddr
	inode string
}

// listeners parses the sockets in state LISTEN (0A) from /proc/net/tcp or
// tcp6: "sl local_address rem_address st ... inode", addresses as hex
// words in host byte order (little-endian here) and the port big-endian.
func listeners(t *testing.T, file string) []listener {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	defer f.Close()
	var out []listener
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		hostHex, portHex, _ := strings.Cut(fields[1], ":")
		raw, err := hex.DecodeString(hostHex)
		port, perr := strconv.ParseUint(portHex, 16, 16)
		if err != nil || perr != nil || len(raw)%4 != 0 {
			t.Fatalf("%s: cannot parse %q", file, fields[1])
		}
		ip := make(net.IP, len(raw))
		for w := 0; w < len(raw); w += 4 { // each 32-bit word is little-endian
			for j := range 4 {
				ip[w+j] = raw[w+3-j]
			}
		}
		out = append(out, listener{addr: net.TCPAddr{IP: ip, Port: int(port)}, inode: fields[9]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
