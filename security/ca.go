package security

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dedupnode/dedupnode/internal/atomicfile"
)

// Organization is the subject organization of every certificate the
// development CA issues.
const Organization = "dedupnode"

// Default validity periods of development certificates.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 2 * 365 * 24 * time.Hour
)

// CA is a certificate authority that can issue node and client
// certificates. It is meant for development and small deployments; an
// operator with a PKI can use its own certificates instead (see
// IsNodeCertificate for what a node certificate needs).
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert, PEM-encoded.
	CertPEM []byte
}

// NewCA creates a self-signed CA named commonName, valid for validFor
// (DefaultCAValidity when <= 0), with a fresh ECDSA P-256 key.
func NewCA(commonName string, validFor time.Duration) (*CA, error) {
	if validFor <= 0 {
		validFor = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{Organization}, CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(der)}, nil
}

// LoadCA reads a CA certificate and its private key from PEM files (as
// WriteDevPKI writes them), so more certificates can be issued later.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("CA certificate %s: no PEM CERTIFICATE block", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("certificate %s is not a CA", certFile)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("CA key %s: no PEM block", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key %s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s: %T cannot sign", keyFile, k)
	}
	return &CA{Cert: cert, Key: signer, CertPEM: encodeCert(cert.Raw)}, nil
}

// KeyPEM returns the CA's private key as a PEM "PRIVATE KEY" (PKCS #8).
func (ca *CA) KeyPEM() ([]byte, error) { return encodeKey(ca.Key) }

// Issued is a certificate and its private key, both PEM-encoded.
type Issued struct {
	CertPEM []byte
	KeyPEM  []byte
}

// IssueNode issues a node certificate for name, usable as both TLS server
// and TLS client (Raft and gRPC between nodes). Its SANs are name,
// localhost, 127.0.0.1, ::1 and every entry of hosts (IP addresses become IP
// SANs, anything else a DNS SAN). validFor <= 0 means DefaultCertValidity.
func (ca *CA) IssueNode(name string, hosts []string, validFor time.Duration) (Issued, error) {
	if name == "" {
		return Issued{}, errors.New("node certificate: empty name")
	}
	all := append([]string{name, "localhost", "127.0.0.1", "::1"}, hosts...)
	return ca.issue(name, all, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, validFor)
}

// IssueClient issues a client-only certificate for name (it cannot act as a
// node: IsNodeCertificate reports false for it).
func (ca *CA) IssueClient(name string, validFor time.Duration) (Issued, error) {
	if name == "" {
		return Issued{}, errors.New("client certificate: empty name")
	}
	return ca.issue(name, []string{name}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, validFor)
}

func (ca *CA) issue(name string, hosts []string, usage []x509.ExtKeyUsage, validFor time.Duration) (Issued, error) {
	if validFor <= 0 {
		validFor = DefaultCertValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, fmt.Errorf("generate key for %s: %w", name, err)
	}
	serial, err := newSerial()
	if err != nil {
		return Issued{}, err
	}
	now := time.Now()
	notAfter := now.Add(validFor)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{Organization}, CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" || seen[h] {
			continue
		}
		seen[h] = true
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Issued{}, fmt.Errorf("create certificate for %s: %w", name, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// IsNodeCertificate reports whether cert may identify a dedupnode node: it
// is allowed to act as a TLS server (extended key usage serverAuth, or no
// restriction at all). Client certificates issued by IssueClient carry only
// clientAuth and are refused on the Raft port and for the Internal service,
// even when the same CA signed them.
//
// REQUIRES: cert was verified against the cluster CA by the TLS handshake.
func IsNodeCertificate(cert *x509.Certificate) bool {
	if cert == nil {
		return false
	}
	if len(cert.ExtKeyUsage) == 0 && len(cert.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) ||
		slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageAny)
}

// DevPKIOptions configures WriteDevPKI.
type DevPKIOptions struct {
	// Nodes names one certificate per node (files <node>.crt, <node>.key).
	Nodes []string
	// Hosts are extra SANs (DNS names or IPs) added to every node
	// certificate, for nodes reached by an address other than their name,
	// localhost or 127.0.0.1.
	Hosts []string
	// Client names the client certificate (files client.crt, client.key);
	// empty means "client". NoClient skips it.
	Client   string
	NoClient bool
	// Force overwrites existing node and client files. An existing CA
	// (ca.crt and ca.key) is always reused, so nodes can be added later.
	Force bool
	// Validity of the issued certificates (DefaultCertValidity when 0).
	Validity time.Duration
}

// WriteDevPKI writes a development PKI into dir (created 0700 if missing):
// ca.crt and ca.key (reused when both exist), <node>.crt/.key per node and
// client.crt/.key. Keys are written 0600, certificates 0644. It returns the
// paths written, in order, and refuses to overwrite an existing node or
// client file unless opts.Force.
func WriteDevPKI(dir string, opts DevPKIOptions) ([]string, error) {
	for _, n := range opts.Nodes {
		if n == "" || n == "ca" || n == "client" || strings.ContainsAny(n, `/\`) || n == "." || n == ".." {
			return nil, fmt.Errorf("node name %q: want a plain name other than ca or client", n)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	var written []string
	caCrt, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	var ca *CA
	if exists(caCrt) != exists(caKey) {
		return nil, fmt.Errorf("%s: found only one of ca.crt and ca.key; restore the other or remove both", dir)
	}
	if exists(caCrt) {
		var err error
		if ca, err = LoadCA(caCrt, caKey); err != nil {
			return nil, fmt.Errorf("reuse existing CA: %w", err)
		}
	} else {
		var err error
		if ca, err = NewCA("dedupnode development CA", 0); err != nil {
			return nil, err
		}
		kp, err := ca.KeyPEM()
		if err != nil {
			return nil, err
		}
		if err := writeFile(caKey, kp, 0o600, true); err != nil {
			return nil, err
		}
		if err := writeFile(caCrt, ca.CertPEM, 0o644, true); err != nil {
			return nil, err
		}
		written = append(written, caCrt, caKey)
	}

	type item struct {
		base string
		iss  func() (Issued, error)
	}
	var items []item
	for _, n := range opts.Nodes {
		items = append(items, item{n, func() (Issued, error) { return ca.IssueNode(n, opts.Hosts, opts.Validity) }})
	}
	if !opts.NoClient {
		name := opts.Client
		if name == "" {
			name = "client"
		}
		items = append(items, item{"client", func() (Issued, error) { return ca.IssueClient(name, opts.Validity) }})
	}
	if !opts.Force {
		for _, it := range items {
			for _, ext := range []string{".crt", ".key"} {
				if p := filepath.Join(dir, it.base+ext); exists(p) {
					return written, fmt.Errorf("%s exists: remove it or pass --force", p)
				}
			}
		}
	}
	for _, it := range items {
		iss, err := it.iss()
		if err != nil {
			return written, err
		}
		crt, key := filepath.Join(dir, it.base+".crt"), filepath.Join(dir, it.base+".key")
		if err := writeFile(key, iss.KeyPEM, 0o600, opts.Force); err != nil {
			return written, err
		}
		if err := writeFile(crt, iss.CertPEM, 0o644, opts.Force); err != nil {
			return written, err
		}
		written = append(written, crt, key)
	}
	return written, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// writeFile writes data to path atomically (atomicfile.Write). Without
// overwrite an existing path is an error.
func writeFile(path string, data []byte, perm os.FileMode, overwrite bool) error {
	if !overwrite && exists(path) {
		return fmt.Errorf("%s exists", path)
	}
	return atomicfile.Write(path, data, perm)
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
