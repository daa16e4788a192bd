package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrBadSignature is what a Verifier's error wraps when a request's
// signature is missing, malformed, stale or wrong. The middleware answers
// 401 and marks nothing.
var ErrBadSignature = errors.New("webhook signature verification failed")

// Verifier checks that a request was signed by the sender, before the
// middleware reads its event ID or claims anything. Implementations must
// compare in constant time (hmac.Equal).
type Verifier interface {
	Verify(h http.Header, body []byte, now time.Time) error
}

func badSig(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadSignature, fmt.Sprintf(format, args...))
}

// checkSecrets rejects an empty secret list or an empty secret: an HMAC
// with an empty key is something anyone can compute.
func checkSecrets(secrets [][]byte) error {
	if len(secrets) == 0 {
		return errors.New("webhook: a signature verifier needs at least one secret")
	}
	for i, s := range secrets {
		if len(s) == 0 {
			return fmt.Errorf("webhook: secret %d is empty", i+1)
		}
	}
	return nil
}

func hmacSHA256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// anyMatch reports whether sig is the HMAC-SHA256 of parts under one of
// secrets (several during a secret rotation), comparing in constant time.
func anyMatch(secrets [][]byte, sig []byte, parts ...[]byte) bool {
	ok := false
	for _, s := range secrets {
		if hmac.Equal(hmacSHA256(s, parts...), sig) {
			ok = true
		}
	}
	return ok
}

// GitHubSignature verifies GitHub's "X-Hub-Signature-256: sha256=<hex>",
// the HMAC-SHA256 of the raw body under the webhook's secret. Several
// secrets may be given (a rotation): one must match.
func GitHubSignature(secrets ...[]byte) (Verifier, error) {
	if err := checkSecrets(secrets); err != nil {
		return nil, err
	}
	return &HMACSignature{Header: "X-Hub-Signature-256", Prefix: "sha256=", Encoding: "hex", Secrets: secrets}, nil
}

// HMACSignature verifies a generic signature header: the HMAC-SHA256 of
// the raw body under one of Secrets, hex- or base64-encoded, optionally
// after a fixed prefix (such as "sha256=").
type HMACSignature struct {
	// Header names the header carrying the signature. Required.
	Header string
	// Prefix, if set, must start the header's value and is stripped.
	Prefix string
	// Encoding is "hex" (default) or "base64" (standard, padded).
	Encoding string
	// Secrets are the keys; one must match.
	Secrets [][]byte
}

// NewHMACSignature returns a checked HMACSignature.
func NewHMACSignature(header, prefix, encoding string, secrets ...[]byte) (*HMACSignature, error) {
	if header == "" {
		return nil, errors.New("webhook: the HMAC signature header name is required")
	}
	switch encoding {
	case "":
		encoding = "hex"
	case "hex", "base64":
	default:
		return nil, fmt.Errorf("webhook: signature encoding %q: want hex or base64", encoding)
	}
	if err := checkSecrets(secrets); err != nil {
		return nil, err
	}
	return &HMACSignature{Header: header, Prefix: prefix, Encoding: encoding, Secrets: secrets}, nil
}

// Verify implements Verifier.
func (v *HMACSignature) Verify(h http.Header, body []byte, _ time.Time) error {
	val := h.Get(v.Header)
	if val == "" {
		return badSig("no %s header", v.Header)
	}
	enc, ok := strings.CutPrefix(val, v.Prefix)
	if !ok {
		return badSig("%s does not start with %q", v.Header, v.Prefix)
	}
	var sig []byte
	var err error
	if v.Encoding == "base64" {
		sig, err = base64.StdEncoding.DecodeString(enc)
	} else {
		sig, err = hex.DecodeString(enc)
	}
	if err != nil || len(sig) != sha256.Size {
		return badSig("%s is not a %s-encoded HMAC-SHA256", v.Header, v.Encoding)
	}
	if !anyMatch(v.Secrets, sig, body) {
		return badSig("%s does not match the body", v.Header)
	}
	return nil
}

// DefaultStripeTolerance is how far a Stripe-Signature timestamp may be
// from now, as in Stripe's own libraries.
const DefaultStripeTolerance = 5 * time.Minute

// StripeSignature verifies Stripe's "Stripe-Signature: t=<unix>,v1=<hex>
// [,v1=<hex>...]": one v1 must be the HMAC-SHA256 of "<t>.<body>" under
// one of secrets (the endpoint's "whsec_..." string, used as is), and t
// must be within tolerance of now (0: DefaultStripeTolerance) — in either
// direction, so a captured delivery cannot be replayed later. Other
// schemes (v0) are ignored, as Stripe's libraries do.
func StripeSignature(tolerance time.Duration, secrets ...[]byte) (Verifier, error) {
	if err := checkSecrets(secrets); err != nil {
		return nil, err
	}
	if tolerance < 0 {
		return nil, fmt.Errorf("webhook: negative Stripe tolerance %v", tolerance)
	}
	if tolerance == 0 {
		tolerance = DefaultStripeTolerance
	}
	return &stripeSignature{tolerance: tolerance, secrets: secrets}, nil
}

type stripeSignature struct {
	tolerance time.Duration
	secrets   [][]byte
}

func (v *stripeSignature) Verify(h http.Header, body []byte, now time.Time) error {
	val := h.Get("Stripe-Signature")
	if val == "" {
		return badSig("no Stripe-Signature header")
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(val, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil && len(b) == sha256.Size {
				sigs = append(sigs, b)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if ts == "" || err != nil {
		return badSig("Stripe-Signature has no valid timestamp")
	}
	if len(sigs) == 0 {
		return badSig("Stripe-Signature has no v1 signature")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > v.tolerance || d < -v.tolerance {
		return badSig("Stripe-Signature timestamp is %v away from now, more than the %v tolerance", d.Round(time.Second), v.tolerance)
	}
	ok := false
	for _, sig := range sigs {
		if anyMatch(v.secrets, sig, []byte(ts), []byte("."), body) {
			ok = true
		}
	}
	if !ok {
		return badSig("no Stripe-Signature v1 matches the body")
	}
	return nil
}
