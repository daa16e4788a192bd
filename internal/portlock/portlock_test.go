package portlock

import (
	"net"
	"strconv"
	"testing"
)

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, s, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func TestReservedPortsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	p, err := Reserve(12)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	seen := map[string]bool{}
	for _, a := range p.Addrs() {
		if seen[a] {
			t.Fatalf("%s reserved twice", a)
		}
		seen[a] = true
		if port := portOf(t, a); port < lowest || port >= ephemeralLow() {
			t.Fatalf("port %d outside %d..%d: the kernel may hand it to another process", port, lowest, ephemeralLow()-1)
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("reserved %s cannot be bound: %v", a, err)
		}
		ln.Close()
	}
	if len(seen) != 12 {
		t.Fatalf("got %d ports, want 12", len(seen))
	}
}

// A port another reservation holds is not handed out again until it is
// released, even though nothing is bound to it yet.
func TestALockedPortIsSkippedUntilReleased(t *testing.T) {
	dir := t.TempDir()
	first, err := Reserve(1)
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, first.Addrs()[0])
	first.Release()

	held, err := reserve(1, port, port+1, dir)
	if err != nil {
		t.Fatalf("the only port of the range, free and unlocked: %v", err)
	}
	if _, err := reserve(1, port, port+1, dir); err == nil {
		t.Fatal("a port locked by another reservation was handed out again")
	}
	held.Release()
	again, err := reserve(1, port, port+1, dir)
	if err != nil {
		t.Fatalf("after release the port is free again: %v", err)
	}
	again.Release()
}

// A port some other process has bound is skipped, lock or not.
func TestABoundPortIsSkipped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if p, err := reserve(1, port, port+1, t.TempDir()); err == nil {
		p.Release()
		t.Fatalf("port %d is bound by a listener, yet it was reserved", port)
	}
}
