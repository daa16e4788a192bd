package security

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// DefaultHandshakeTimeout bounds a TLS handshake on the Raft port.
const DefaultHandshakeTimeout = 10 * time.Second

// StreamLayer is a raft.StreamLayer that speaks TLS over another stream
// layer (or a plain listener, see NewStreamLayer). Use it with
// raft.NewNetworkTransportWithConfig. With the configs from RaftTLS both
// ends authenticate each other: a dialler or listener whose certificate
// does not chain to the cluster CA, or is not a node certificate, fails the
// handshake, and no Raft RPC is read from or sent to it.
//
// Accept does not handshake (that would let one slow peer stall the accept
// loop); the handshake runs on the connection's first Read or Write,
// bounded by HandshakeTimeout. Dial handshakes before returning, so a
// refused peer is an error from Dial.
type StreamLayer struct {
	inner  raft.StreamLayer
	server *tls.Config
	client *tls.Config
	// HandshakeTimeout bounds each handshake (DefaultHandshakeTimeout when
	// zero). Set before use.
	HandshakeTimeout time.Duration
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

// WrapStreamLayer returns inner with TLS on top: accepted connections are
// TLS servers with serverCfg, dialled ones TLS clients with clientCfg (a
// clone whose ServerName is the dialled host unless set).
func WrapStreamLayer(inner raft.StreamLayer, serverCfg, clientCfg *tls.Config) *StreamLayer {
	return &StreamLayer{inner: inner, server: serverCfg, client: clientCfg}
}

// NewStreamLayer is WrapStreamLayer over a TCP listener. advertise, if
// non-nil, is the address reported by Addr (what other nodes dial);
// otherwise the listener's address, which must then be a specific IP.
func NewStreamLayer(ln net.Listener, advertise net.Addr, serverCfg, clientCfg *tls.Config) (*StreamLayer, error) {
	if advertise == nil {
		a, ok := ln.Addr().(*net.TCPAddr)
		if !ok || a.IP == nil || a.IP.IsUnspecified() {
			return nil, fmt.Errorf("raft address %v is not advertisable: pass an advertise address", ln.Addr())
		}
	}
	return WrapStreamLayer(&tcpLayer{ln: ln, advertise: advertise}, serverCfg, clientCfg), nil
}

func (s *StreamLayer) timeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

// Accept implements net.Listener. The handshake is deferred to first use.
func (s *StreamLayer) Accept() (net.Conn, error) {
	c, err := s.inner.Accept()
	if err != nil {
		return nil, err
	}
	return &lazyConn{Conn: tls.Server(c, s.server), timeout: s.timeout()}, nil
}

// Close implements net.Listener.
func (s *StreamLayer) Close() error { return s.inner.Close() }

// Addr implements net.Listener.
func (s *StreamLayer) Addr() net.Addr { return s.inner.Addr() }

// Dial implements raft.StreamLayer: connect within timeout, then complete
// the TLS handshake within what is left of it (at least
// HandshakeTimeout when timeout is zero).
func (s *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	c, err := s.inner.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	cfg := s.client
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		host, _, err := net.SplitHostPort(string(address))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("raft address %q: %w", address, err)
		}
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	budget := s.timeout()
	if timeout > 0 {
		budget = max(timeout-time.Since(start), time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, err)
	}
	return tc, nil
}

// lazyConn handshakes (bounded) before its first Read or Write.
type lazyConn struct {
	*tls.Conn
	timeout time.Duration
	once    sync.Once
	err     error
}

func (c *lazyConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		if err := c.Conn.HandshakeContext(ctx); err != nil {
			c.err = fmt.Errorf("raft TLS handshake from %s: %w", c.RemoteAddr(), err)
			c.Conn.Close()
		}
	})
	return c.err
}

func (c *lazyConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *lazyConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// tcpLayer is a plain TCP raft.StreamLayer over a listener.
type tcpLayer struct {
	ln        net.Listener
	advertise net.Addr
}

func (t *tcpLayer) Accept() (net.Conn, error) { return t.ln.Accept() }

func (t *tcpLayer) Close() error {
	err := t.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (t *tcpLayer) Addr() net.Addr {
	if t.advertise != nil {
		return t.advertise
	}
	return t.ln.Addr()
}

func (t *tcpLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}
