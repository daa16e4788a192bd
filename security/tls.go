package security

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// KeyPair is a certificate and key loaded from PEM files that can be
// reloaded in place (for example on SIGHUP) without restarting listeners:
// tls.Configs built from it pick up the new pair on their next handshake.
type KeyPair struct {
	certFile, keyFile string

	mu   sync.RWMutex
	cert *tls.Certificate
}

// LoadKeyPair reads certFile and keyFile (PEM).
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a certificate needs both a cert file and a key file")
	}
	kp := &KeyPair{certFile: certFile, keyFile: keyFile}
	if err := kp.Reload(); err != nil {
		return nil, err
	}
	return kp, nil
}

// Reload re-reads the files. On error the previous pair stays in use.
func (kp *KeyPair) Reload() error {
	c, err := tls.LoadX509KeyPair(kp.certFile, kp.keyFile)
	if err != nil {
		return fmt.Errorf("load key pair %s, %s: %w", kp.certFile, kp.keyFile, err)
	}
	if c.Leaf == nil && len(c.Certificate) > 0 {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return fmt.Errorf("parse %s: %w", kp.certFile, err)
		}
	}
	kp.mu.Lock()
	kp.cert = &c
	kp.mu.Unlock()
	return nil
}

// Certificate returns the current pair.
func (kp *KeyPair) Certificate() *tls.Certificate {
	kp.mu.RLock()
	defer kp.mu.RUnlock()
	return kp.cert
}

func (kp *KeyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return kp.Certificate(), nil
}

func (kp *KeyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return kp.Certificate(), nil
}

// LoadCertPool reads one or more PEM certificates (a CA bundle) from file.
func LoadCertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s: no PEM certificates found", file)
	}
	return pool, nil
}

// ServerTLS builds the gRPC server's tls.Config from its certificate.
//
// With clientCAFile set, every client must present a certificate that
// chains to it (mutual TLS). Otherwise, with nodeCAFile set, a client
// certificate is verified against the cluster CA if one is offered (so
// nodes that dial with their node certificate are recognised, see
// PeerIsNode) and not required; with neither, client certificates are not
// asked for. Minimum version TLS 1.2.
func ServerTLS(kp *KeyPair, clientCAFile, nodeCAFile string) (*tls.Config, error) {
	if kp == nil {
		return nil, errors.New("server TLS needs a certificate")
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: kp.getCertificate,
	}
	switch {
	case clientCAFile != "":
		pool, err := LoadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	case nodeCAFile != "":
		pool, err := LoadCertPool(nodeCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// ClientTLS builds a client tls.Config. caFile (empty: the system roots)
// verifies the server; kp, if non-nil, is presented when the server asks for
// a client certificate. serverName overrides the name verified against the
// server's certificate (empty: the host dialled).
func ClientTLS(caFile string, kp *KeyPair, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pool, err := LoadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if kp != nil {
		cfg.GetClientCertificate = kp.getClientCertificate
	}
	return cfg, nil
}

// ClientTLSFiles is ClientTLS from file names: certFile and keyFile must be
// both set or both empty.
func ClientTLSFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both --tls-cert and --tls-key")
	}
	var kp *KeyPair
	if certFile != "" {
		var err error
		if kp, err = LoadKeyPair(certFile, keyFile); err != nil {
			return nil, err
		}
	}
	return ClientTLS(caFile, kp, "")
}

// RaftTLS builds the two sides of mutually authenticated Raft traffic from
// the node's key pair and the cluster CA: the server side requires and
// verifies a client certificate chaining to caFile, both sides require the
// peer's certificate to be a node certificate (IsNodeCertificate), and
// TLS 1.3 is the minimum.
func RaftTLS(kp *KeyPair, caFile string) (server, client *tls.Config, err error) {
	if kp == nil {
		return nil, nil, errors.New("raft TLS needs the node's certificate")
	}
	if caFile == "" {
		return nil, nil, errors.New("raft TLS needs the cluster CA file")
	}
	pool, err := LoadCertPool(caFile)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{
		MinVersion:       tls.VersionTLS13,
		GetCertificate:   kp.getCertificate,
		ClientCAs:        pool,
		ClientAuth:       tls.RequireAndVerifyClientCert,
		VerifyConnection: requireNodePeer,
	}
	client = &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              pool,
		GetClientCertificate: kp.getClientCertificate,
		VerifyConnection:     requireNodePeer,
	}
	return server, client, nil
}

// requireNodePeer refuses a verified peer whose certificate is not a node
// certificate (runs after chain verification).
func requireNodePeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("peer presented no certificate")
	}
	if !IsNodeCertificate(cs.PeerCertificates[0]) {
		return fmt.Errorf("peer certificate %q is not a node certificate (no serverAuth usage)", cs.PeerCertificates[0].Subject.CommonName)
	}
	return nil
}

// PeerIsNode reports whether a TLS connection state shows a peer that
// presented a verified node certificate.
func PeerIsNode(cs tls.ConnectionState) bool {
	return len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 && IsNodeCertificate(cs.VerifiedChains[0][0])
}
