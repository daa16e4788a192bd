package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// link watches the TCP connections gRPC makes to one node address: whether
// one is up, the typed error of the last failed dial or TLS handshake, and
// whether the peer closed a connection without sending a byte. gRPC reports
// transport failures as text; the client classifies them from this instead.
type link struct {
	addr string
	tls  bool // the client dials this node over TLS

	mu           sync.Mutex
	dials        uint64 // successful dials (and handshakes)
	up           bool   // a connection is open
	dialErr      error  // last failed dial, nil after a success
	handshakeErr error  // last failed TLS handshake, nil after a success
	silentClose  bool   // the last connection was closed before the peer sent a byte
	httpReply    bool   // the peer answered with "HTTP/1."
	downSince    time.Time
}

// linkState is a link's state at the start of an attempt.
type linkState struct {
	dials uint64
	up    bool
}

func (l *link) state() linkState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return linkState{dials: l.dials, up: l.up}
}

// down reports whether the last dial to the node failed and none succeeded
// since: a leader that refuses connections is not dialled again as leader.
func (l *link) down() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dialErr != nil
}

func (l *link) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.dialErr == nil {
			l.downSince = time.Now()
		}
		l.dialErr = err
		l.up = false
		return nil, err
	}
	l.dialErr, l.silentClose, l.httpReply = nil, false, false
	if !l.tls {
		l.dials++
		l.up = true
	}
	return &watchedConn{Conn: c, l: l}, nil
}

// handshook records the outcome of a TLS handshake on a watched conn.
func (l *link) handshook(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.handshakeErr = err
		l.up = false
		return
	}
	l.handshakeErr = nil
	l.dials++
	l.up = true
}

// watchedConn reports to its link what the peer sent first and when the
// connection ended.
type watchedConn struct {
	net.Conn
	l      *link
	read   atomic.Bool // the peer sent at least a byte
	closed atomic.Bool
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.read.Swap(true) && bytes.HasPrefix(b[:n], []byte("HTTP/1.")) {
		c.l.mu.Lock()
		c.l.httpReply = true
		c.l.mu.Unlock()
	}
	if err != nil && !c.closed.Swap(true) {
		c.l.mu.Lock()
		c.l.up = false
		if !c.read.Load() && isEOF(err) {
			c.l.silentClose = true
		}
		c.l.mu.Unlock()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	if !c.closed.Swap(true) {
		c.l.mu.Lock()
		c.l.up = false
		c.l.mu.Unlock()
	}
	return c.Conn.Close()
}

// watchedCreds wraps TLS transport credentials to record handshake errors
// on the link of the connection.
type watchedCreds struct {
	credentials.TransportCredentials
	l *link
}

func (w watchedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := w.TransportCredentials.ClientHandshake(ctx, authority, raw)
	w.l.handshook(err)
	return c, info, err
}

func (w watchedCreds) Clone() credentials.TransportCredentials {
	return watchedCreds{TransportCredentials: w.TransportCredentials.Clone(), l: w.l}
}

// transportError classifies an attempt that failed without an answer from
// a node (no dedupnode status details), from what the link saw. before is
// the link's state when the attempt started. It returns the kind, the typed
// cause, and whether the request may have reached the node.
func (l *link) transportError(before linkState) (kind, cause error, maybeSent bool) {
	l.mu.Lock()
	after := linkState{dials: l.dials, up: l.up}
	dialErr, hsErr, silent, httpReply := l.dialErr, l.handshakeErr, l.silentClose, l.httpReply
	l.mu.Unlock()
	// The request can only have left over a connection that was up when
	// the attempt began or that came up during it.
	maybeSent = before.up || after.dials != before.dials
	switch {
	case hsErr != nil && !maybeSent:
		if isEOF(hsErr) {
			// Closed during the handshake without a word: a Raft port.
			return ErrNotGRPC, hsErr, false
		}
		return ErrTLSMismatch, hsErr, false
	case dialErr != nil && !maybeSent:
		return ErrRefused, dialErr, false
	case httpReply:
		return ErrNotGRPC, errors.New("the port serves HTTP/1.1, not gRPC (an admin HTTP port?)"), maybeSent
	case silent && !l.tls:
		// A TLS port and a Raft port both close a plaintext HTTP/2
		// connection without a word; a TLS handshake tells them apart.
		if probeTLS(l.addr) {
			return ErrTLSMismatch, errNodeSpeaksTLS, maybeSent
		}
		return ErrNotGRPC, errNotGRPCPort, maybeSent
	}
	return nil, nil, maybeSent
}

// errNotGRPCPort is the Cause of ErrNotGRPC for a port that closes the
// connection at once, as a node's Raft port does.
var errNotGRPCPort = errors.New("the port closes gRPC connections without a word, as a node's Raft port (--raft-addr) does")

// probeTLS reports whether addr completes a TLS handshake (any certificate).
func probeTLS(addr string) bool {
	d := &net.Dialer{Timeout: time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe: nothing is sent over it
	if err != nil {
		return false
	}
	c.Close()
	return true
}
