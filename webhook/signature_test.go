package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/webhook"
)

func mac(secret, msg string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(msg))
	return m.Sum(nil)
}

func githubSig(secret, body string) string { return "sha256=" + hex.EncodeToString(mac(secret, body)) }

func stripeSig(secret, body string, ts time.Time) string {
	t := fmt.Sprint(ts.Unix())
	return "t=" + t + ",v1=" + hex.EncodeToString(mac(secret, t+"."+body))
}

func post(t *testing.T, srv *httptest.Server, id, body string, h map[string]string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/hook", strings.NewReader(body))
	req.Header.Set("Webhook-Id", id)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, status: resp.Header.Get(webhook.StatusHeader), body: string(b), header: resp.Header}
}

// TestProxySignatures: issue 12 input 6a. A forged delivery (GitHub,
// Stripe, generic HMAC) gets 401, never reaches the upstream and marks
// nothing; the genuine delivery of the same event ID then goes through.
func TestProxySignatures(t *testing.T) {
	cl := testcluster.Demo(t)
	b := newBatcher(t, cl)
	c := testcluster.Client(t, cl.Addrs())
	gh, err := webhook.GitHubSignature([]byte("old-secret"), []byte("gh-secret"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := webhook.StripeSignature(0, []byte("whsec_test"))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := webhook.NewHMACSignature("X-Signature", "", "base64", []byte("gen-secret"))
	if err != nil {
		t.Fatal(err)
	}
	const body = `{"action":"opened"}`
	now := time.Now()
	for _, tc := range []struct {
		name            string
		v               webhook.Verifier
		forged, genuine map[string]string
	}{
		{"github", gh,
			map[string]string{"X-Hub-Signature-256": githubSig("guess", body)},
			map[string]string{"X-Hub-Signature-256": githubSig("gh-secret", body)}},
		{"stripe", st,
			// Right secret, but a timestamp outside the 5 min tolerance: a replay.
			map[string]string{"Stripe-Signature": stripeSig("whsec_test", body, now.Add(-10*time.Minute))},
			map[string]string{"Stripe-Signature": stripeSig("whsec_test", body, now)}},
		{"hmac", gen,
			map[string]string{"X-Signature": base64.StdEncoding.EncodeToString(mac("gen-secret", body+" "))},
			map[string]string{"X-Signature": base64.StdEncoding.EncodeToString(mac("gen-secret", body))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream(t)
			srv := startProxy(t, b, u, func(cfg *webhook.Config) { cfg.Verify = tc.v })
			id := "sig-" + tc.name
			for _, h := range []map[string]string{tc.forged, nil} {
				if a := post(t, srv, id, body, h); a.code != http.StatusUnauthorized || a.status != "bad-signature" {
					t.Fatalf("forged or unsigned delivery: %+v, want 401 bad-signature", a)
				}
			}
			if n := u.count(id); n != 0 {
				t.Fatalf("a rejected delivery reached the upstream %d times", n)
			}
			// Not marked: not seen, or no namespace yet (a check creates
			// none).
			res, err := c.Check(t.Context(), "hooks", [][]byte{[]byte(id)}, client.Linearizable)
			if !errors.Is(err, client.ErrNamespaceNotFound) && (err != nil || res[0].Code != client.CodeNotSeen) {
				t.Fatalf("a rejected delivery marked its ID: %v %v", res, err)
			}
			if a := post(t, srv, id, body, tc.genuine); a.code != http.StatusCreated || a.status != "processed" {
				t.Fatalf("genuine delivery after the forged one: %+v", a)
			}
			if a := post(t, srv, id, body, tc.genuine); a.status != "duplicate" {
				t.Fatalf("genuine redelivery: %+v", a)
			}
			if n := u.count(id); n != 1 {
				t.Fatalf("upstream got %s %d times, want 1", id, n)
			}
		})
	}
}

// TestVerifiers covers the signature formats' edge cases.
func TestVerifiers(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte("payload")
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	gh, _ := webhook.GitHubSignature([]byte("s"))
	st, _ := webhook.StripeSignature(time.Minute, []byte("whsec_a"), []byte("whsec_b"))
	hx, _ := webhook.NewHMACSignature("X-Sig", "v1=", "hex", []byte("k"))
	b64, _ := webhook.NewHMACSignature("X-Sig", "", "base64", []byte("k"))
	ts := fmt.Sprint(now.Unix())
	for _, c := range []struct {
		name string
		v    webhook.Verifier
		h    http.Header
		ok   bool
	}{
		{"github ok", gh, h("X-Hub-Signature-256", githubSig("s", "payload")), true},
		{"github no prefix", gh, h("X-Hub-Signature-256", hex.EncodeToString(mac("s", "payload"))), false},
		{"github sha1 header only", gh, h("X-Hub-Signature", "sha1=00"), false},
		{"github uppercase hex", gh, h("X-Hub-Signature-256", "sha256="+strings.ToUpper(hex.EncodeToString(mac("s", "payload")))), true},
		{"github truncated", gh, h("X-Hub-Signature-256", githubSig("s", "payload")[:20]), false},
		{"stripe second secret (rotation)", st, h("Stripe-Signature", stripeSig("whsec_b", "payload", now)), true},
		{"stripe one of two v1", st, h("Stripe-Signature", "t="+ts+",v1="+strings.Repeat("ab", 32)+",v1="+hex.EncodeToString(mac("whsec_a", ts+".payload"))), true},
		{"stripe v0 only", st, h("Stripe-Signature", "t="+ts+",v0="+hex.EncodeToString(mac("whsec_a", ts+".payload"))), false},
		{"stripe too old", st, h("Stripe-Signature", stripeSig("whsec_a", "payload", now.Add(-61*time.Second))), false},
		{"stripe too far ahead", st, h("Stripe-Signature", stripeSig("whsec_a", "payload", now.Add(61*time.Second))), false},
		{"stripe within tolerance", st, h("Stripe-Signature", stripeSig("whsec_a", "payload", now.Add(-59*time.Second))), true},
		{"stripe timestamp not signed", st, h("Stripe-Signature", "t="+fmt.Sprint(now.Unix()+1)+",v1="+hex.EncodeToString(mac("whsec_a", ts+".payload"))), false},
		{"stripe no timestamp", st, h("Stripe-Signature", "v1="+hex.EncodeToString(mac("whsec_a", ts+".payload"))), false},
		{"hmac hex with prefix", hx, h("X-Sig", "v1="+hex.EncodeToString(mac("k", "payload"))), true},
		{"hmac hex without prefix", hx, h("X-Sig", hex.EncodeToString(mac("k", "payload"))), false},
		{"hmac base64", b64, h("X-Sig", base64.StdEncoding.EncodeToString(mac("k", "payload"))), true},
		{"hmac base64 given hex", b64, h("X-Sig", hex.EncodeToString(mac("k", "payload"))), false},
		{"hmac missing", b64, h(), false},
	} {
		err := c.v.Verify(c.h, body, now)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, webhook.ErrBadSignature) {
			t.Errorf("%s: error %v does not wrap ErrBadSignature", c.name, err)
		}
	}
	if _, err := webhook.GitHubSignature(); err == nil {
		t.Error("GitHubSignature without a secret accepted")
	}
	if _, err := webhook.GitHubSignature([]byte{}); err == nil {
		t.Error("an empty secret accepted")
	}
	if _, err := webhook.NewHMACSignature("X", "", "base32", []byte("k")); err == nil {
		t.Error("encoding base32 accepted")
	}
	if _, err := webhook.NewHMACSignature("", "", "hex", []byte("k")); err == nil {
		t.Error("HMAC without a header accepted")
	}
}

// FuzzStripeSignature: no header value panics the Stripe or GitHub
// parsers, and every rejection wraps ErrBadSignature.
func FuzzStripeSignature(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	f.Add(stripeSig("whsec_x", "body", now))
	f.Add("t=,v1=")
	f.Add("t=1800000000,v1=zz,v0=00,,=,t")
	st, _ := webhook.StripeSignature(0, []byte("whsec_x"))
	gh, _ := webhook.GitHubSignature([]byte("s"))
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set("Stripe-Signature", v)
		h.Set("X-Hub-Signature-256", v)
		for _, vf := range []webhook.Verifier{st, gh} {
			if err := vf.Verify(h, []byte("body"), now); err != nil && !errors.Is(err, webhook.ErrBadSignature) {
				t.Fatalf("%q: %v does not wrap ErrBadSignature", v, err)
			}
		}
	})
}
