package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runDevCluster starts `dev` with args, waits for its addrs line and stops
// it again; it returns the addrs line.
func runDevCluster(t *testing.T, args ...string) string {
	t.Helper()
	r := startCmd(append([]string{"dev"}, args...)...)
	t.Cleanup(func() { r.stop(t) })
	a := r.addrs(t)
	if code := r.stop(t); code != 0 {
		t.Fatalf("dev %v exited %d: %s", args, code, r.errs.String())
	}
	return a
}

// freeBase returns a port P such that n consecutive ports from P and from
// P+devRaftOffset could all be bound just now (the OS picks P).
func freeBase(t *testing.T, n int) int {
	t.Helper()
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if base > 65535-devRaftOffset-devMaxNodes {
			continue
		}
		ok := true
		var held []net.Listener
		for i := range n {
			for _, p := range []int{base + i, base + devRaftOffset + i} {
				hl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
				if err != nil {
					ok = false
					break
				}
				held = append(held, hl)
			}
		}
		for _, hl := range held {
			hl.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("found no free base port")
	return 0
}

// twoFreeBases returns two different free base ports for 2-node clusters.
func twoFreeBases(t *testing.T) (int, int) {
	t.Helper()
	p1, p2 := freeBase(t, 2), freeBase(t, 2)
	for p2 == p1 {
		p2 = freeBase(t, 2)
	}
	return p1, p2
}

// TestDevDataDirKeepsItsPorts: a dev cluster's nodes know each other by
// the ports they were created with, so a later run with another
// --base-port would dial the old ones forever. It is refused at once with
// the ports recorded; without --base-port, or with 0, the run reuses them.
func TestDevDataDirKeepsItsPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 2-node clusters")
	}
	dir := filepath.Join(t.TempDir(), "dev")
	p1, p2 := twoFreeBases(t)
	first := runDevCluster(t, "--nodes", "2", "--data-dir", dir, "--base-port", strconv.Itoa(p1))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, out, errs := runCLI(t, ctx, "", "dev", "--nodes", "2", "--data-dir", dir, "--base-port", strconv.Itoa(p2))
	if ctx.Err() != nil {
		t.Fatal("dev with another --base-port hung")
	}
	want := "was created with --base-port " + strconv.Itoa(p1) + " (gRPC 127.0.0.1:" + strconv.Itoa(p1) + "-" + strconv.Itoa(p1+1)
	if code != exitUsage || !strings.Contains(errs, want) || !strings.Contains(errs, "rerun with --base-port "+strconv.Itoa(p1)) || out != "" {
		t.Fatalf("dev with another --base-port: exit %d, stdout %q, stderr %q; want exit %d naming %q", code, out, errs, exitUsage, want)
	}
	assertOneLine(t, errs)

	if again := runDevCluster(t, "--nodes", "2", "--data-dir", dir); again != first {
		t.Fatalf("dev without --base-port served %s, want the kept %s", again, first)
	}
	if again := runDevCluster(t, "--nodes", "2", "--data-dir", dir, "--base-port", "0"); again != first {
		t.Fatalf("dev --base-port 0 served %s, want the kept %s", again, first)
	}
}

// TestDevDataDirWithoutPortsFileNamesTheRecordedPorts: a data dir without
// dev-ports.json (an earlier version kept none for a fixed --base-port) on
// other ports: the nodes refuse to start, and dev names the Raft ports
// their configuration records and the --base-port that gives them.
func TestDevDataDirWithoutPortsFileNamesTheRecordedPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 2-node cluster")
	}
	dir := filepath.Join(t.TempDir(), "dev")
	p1, p2 := twoFreeBases(t)
	runDevCluster(t, "--nodes", "2", "--data-dir", dir, "--base-port", strconv.Itoa(p1))
	if err := os.Remove(filepath.Join(dir, devPortsFile)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, _, errs := runCLI(t, ctx, "", "dev", "--nodes", "2", "--data-dir", dir, "--base-port", strconv.Itoa(p2))
	if ctx.Err() != nil {
		t.Fatal("dev on other ports hung")
	}
	for _, want := range []string{"n1's Raft on 127.0.0.1:" + strconv.Itoa(p1+devRaftOffset), "rerun with --base-port " + strconv.Itoa(p1)} {
		if code != exitUsage || !strings.Contains(errs, want) {
			t.Fatalf("exit %d, stderr %q; want exit %d naming %q", code, errs, exitUsage, want)
		}
	}
	assertOneLine(t, errs)
}
