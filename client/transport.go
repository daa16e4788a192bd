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
	// Of the last TLS handshake: whether the node asked for a client
	// certificate, and whether the client sent one.
	certAsked, certSent bool
	// earlyErr is how the last TLS connection ended when it ended after
	// the handshake but before the node sent a byte of gRPC (its first
	// read or write error), nil otherwise.
	earlyErr error
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
	l.dialErr = nil
	if !l.tls {
		l.openedLocked()
	}
	return &watchedConn{Conn: c, l: l}, nil
}

// openedLocked records a new plaintext connection to the node.
func (l *link) openedLocked() {
	l.silentClose, l.httpReply = false, false
	l.dials++
	l.up = true
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
	l.handshakeErr, l.earlyErr = nil, nil
	l.dials++
	l.up = true
}

// askedCert records that the node asked for a client certificate in a
// handshake under way, and whether the client sent one.
func (l *link) askedCert(sent bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.certAsked, l.certSent = true, sent
}

// ended records how a TLS connection that never carried a byte from the
// node ended.
func (l *link) ended(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.earlyErr = err
	l.up = false
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

// plainCreds are the plaintext transport credentials with the link's
// accounting. gRPC hands every new connection to ClientHandshake, whoever
// dialled it: a dialer given with WithDialOptions replaces the link's own
// (dial), and its connections are counted here instead. Uncounted, the
// link would never be up, and the client would ask the node for its
// Status before every call (vet) and take every failed write for one that
// never left.
type plainCreds struct {
	credentials.TransportCredentials
	l *link
}

func (p plainCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := p.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return c, info, err
	}
	if _, ok := raw.(*watchedConn); ok {
		return c, info, nil // the link's own dial counted it
	}
	p.l.mu.Lock()
	p.l.openedLocked()
	p.l.mu.Unlock()
	return &watchedConn{Conn: c, l: p.l}, info, nil
}

func (p plainCreds) Clone() credentials.TransportCredentials {
	return plainCreds{TransportCredentials: p.TransportCredentials.Clone(), l: p.l}
}

// watchedCreds wraps TLS transport credentials to record handshake errors
// on the link of the connection.
type watchedCreds struct {
	credentials.TransportCredentials
	l *link
}

func (w watchedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	w.l.mu.Lock()
	w.l.certAsked, w.l.certSent = false, false
	w.l.mu.Unlock()
	c, info, err := w.TransportCredentials.ClientHandshake(ctx, authority, raw)
	w.l.handshook(err)
	if err != nil {
		return c, info, err
	}
	return &tlsConn{Conn: c, l: w.l}, info, nil
}

// watchClientCert returns a copy of cfg that records on l whether a node
// asks for a client certificate and whether one is sent (crypto/tls's
// choice among cfg.Certificates when cfg has no GetClientCertificate).
func watchClientCert(cfg *tls.Config, l *link) *tls.Config {
	cfg = cfg.Clone()
	get, certs := cfg.GetClientCertificate, cfg.Certificates
	cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		var cert *tls.Certificate
		if get != nil {
			var err error
			if cert, err = get(cri); err != nil {
				l.askedCert(false)
				return nil, err
			}
		} else {
			for i := range certs {
				if cri.SupportsCertificate(&certs[i]) == nil {
					cert = &certs[i]
					break
				}
			}
		}
		if cert == nil {
			cert = &tls.Certificate{}
		}
		l.askedCert(len(cert.Certificate) > 0)
		return cert, nil
	}
	return cfg
}

// tlsConn is an established TLS connection; it reports to its link how it
// ended if it ended before the node sent a byte of gRPC (a node that
// requires a client certificate verifies it after the client's side of a
// TLS 1.3 handshake is complete, then sends an alert and closes).
type tlsConn struct {
	net.Conn
	l      *link
	read   atomic.Bool // the node sent at least a byte
	closed atomic.Bool // ended (by either side)
}

func (c *tlsConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.read.Store(true)
	}
	if err != nil {
		c.end(err)
	}
	return n, err
}

func (c *tlsConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.end(err)
	}
	return n, err
}

func (c *tlsConn) end(err error) {
	if !c.closed.Swap(true) && !c.read.Load() {
		c.l.ended(err)
	}
}

func (c *tlsConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
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
	noCert := l.certAsked && !l.certSent
	earlyErr := l.earlyErr
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
		if noCert {
			return ErrTLSMismatch, &noClientCertError{err: hsErr}, false
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
	case earlyErr != nil && l.tls:
		// The handshake completed on the client's side, then the node
		// ended the connection before a byte of gRPC: it refused what the
		// client sent in the handshake. Nothing reached the node's gRPC.
		if _, ok := tlsAlert(earlyErr); ok {
			if noCert {
				return ErrTLSMismatch, &noClientCertError{err: earlyErr}, false
			}
			return ErrTLSMismatch, earlyErr, false
		}
		if noCert {
			// The alert was lost to the node's close (a broken pipe).
			return ErrTLSMismatch, &noClientCertError{err: earlyErr}, false
		}
	}
	return nil, nil, maybeSent
}

// noClientCertError is the Cause of a mismatch with a node that asked for a
// client certificate and got none, err what the client saw then.
type noClientCertError struct{ err error }

func (e *noClientCertError) Error() string {
	return "the node asked for a client certificate and the client has none: " + e.err.Error()
}

func (e *noClientCertError) Unwrap() error { return e.err }

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
