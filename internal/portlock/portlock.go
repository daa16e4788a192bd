// Package portlock reserves loopback TCP ports for servers that tests and
// tools start, kill and restart on a fixed address.
//
// The usual trick, listening on 127.0.0.1:0 and closing the listener to
// learn a free port, hands out ports from the kernel's ephemeral range.
// The kernel gives the same ports to every other bind(":0") and to the
// local end of every outgoing connection, so a port freed by a killed node
// can be taken by any process on the machine before the node restarts: the
// node then fails to bind, and its clients reach whatever took the port
// (in CI once, a server that closed the connection at once). Ports below
// the ephemeral range are never handed out by the kernel; between our own
// processes a lock file per port, held for the reservation's lifetime,
// keeps two of them from choosing the same port.
package portlock

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// lowest is the lowest port handed out: below it live the well-known and
// registered ports of services a test may start (PostgreSQL, RabbitMQ,
// Redis, epmd).
const lowest = 20000

// Ports is a reservation of loopback ports.
type Ports struct {
	addrs []string
	locks []*os.File
}

// Reserve returns n distinct loopback ports that were free when chosen,
// below the kernel's ephemeral range, each locked against the other
// processes that use this package until Release.
func Reserve(n int) (*Ports, error) {
	lo, hi := lowest, ephemeralLow()
	if hi-lo < 1000 {
		return nil, fmt.Errorf("portlock: the ephemeral port range starts at %d, leaving too few ports above %d", hi, lo)
	}
	return reserve(n, lo, hi, filepath.Join(os.TempDir(), "dedupnode-ports"))
}

// reserve picks n ports in [lo, hi), with their lock files in dir.
func reserve(n, lo, hi int, dir string) (*Ports, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, fmt.Errorf("portlock: %w", err)
	}
	_ = os.Chmod(dir, 0o1777) // shared by every user's tests, as /tmp is
	p := &Ports{}
	taken := map[int]bool{}
	for tries := 0; len(p.addrs) < n; tries++ {
		if tries > 1000*n {
			p.Release()
			return nil, fmt.Errorf("portlock: no free port in %d..%d after %d tries", lo, hi-1, tries)
		}
		port := lo + rand.IntN(hi-lo)
		if taken[port] {
			continue
		}
		lock, ok, err := tryLock(filepath.Join(dir, strconv.Itoa(port)))
		if err != nil {
			p.Release()
			return nil, fmt.Errorf("portlock: %w", err)
		}
		if !ok {
			continue // another of our processes holds it
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			lock.Close() // in use by a process that does not lock
			continue
		}
		ln.Close()
		taken[port] = true
		p.addrs = append(p.addrs, addr)
		p.locks = append(p.locks, lock)
	}
	return p, nil
}

// Addrs returns the reserved ports as 127.0.0.1:PORT addresses.
func (p *Ports) Addrs() []string { return append([]string(nil), p.addrs...) }

// Release gives the ports back to other processes. The servers bound to
// them keep them; only the locks go.
func (p *Ports) Release() error {
	var errs []error
	for _, f := range p.locks {
		errs = append(errs, f.Close())
	}
	p.locks = nil
	return errors.Join(errs...)
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux's ip_local_port_range; 32768 where it cannot be read, the lowest
// default among Linux, the BSDs and macOS).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	v, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return v
}
