package cluster

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer over a listener we own, so that a
// bind with port 0 works (the real address is read back before Raft starts)
// and every accepted connection is closed at shutdown (raft's own
// NetworkTransport leaves inbound connections to the remote end).
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(ln net.Listener, advertise string) (*streamLayer, error) {
	s := &streamLayer{ln: ln, conns: map[net.Conn]struct{}{}}
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
		}
		s.advertise = a
	}
	a, ok := s.Addr().(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("raft address %v is not TCP", s.Addr())
	}
	if a.IP == nil || a.IP.IsUnspecified() {
		return nil, fmt.Errorf("raft address %v is not advertisable: set an advertise address", a)
	}
	return s, nil
}

// Accept implements net.Listener; accepted connections are tracked.
func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.ln.Accept()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	s.conns[c] = struct{}{}
	return &trackedConn{Conn: c, s: s}, nil
}

// Close stops accepting and closes every accepted connection.
func (s *streamLayer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range conns {
		c.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Addr is the advertised address, else the bound one.
func (s *streamLayer) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.ln.Addr()
}

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

type trackedConn struct {
	net.Conn
	s    *streamLayer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c.Conn)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
