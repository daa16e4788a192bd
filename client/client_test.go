package client

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(context.Background(), nil); err == nil {
		t.Fatal("no addresses: want error")
	}
	if _, err := New(context.Background(), []string{"localhost"}); err == nil {
		t.Fatal("address without port: want error")
	}
}

func TestCodesRoundTripTheirNames(t *testing.T) {
	names := []string{"new", "duplicate", "conflict", "seen", "not_seen", "acquired", "in_progress", "ok", "lease_lost"}
	for _, n := range names {
		c, err := ParseCode(n)
		if err != nil || c.String() != n {
			t.Fatalf("ParseCode(%q) = %v, %v", n, c, err)
		}
		b, _ := json.Marshal(c)
		if string(b) != `"`+n+`"` {
			t.Fatalf("JSON of %v = %s", c, b)
		}
	}
	if _, err := ParseCode("unknown"); err == nil {
		t.Fatal("ParseCode(unknown) must fail")
	}
}

func TestContentIDAndDigest(t *testing.T) {
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got := string(ContentID([]byte("abc"))); got != abc {
		t.Fatalf("ContentID(abc) = %s", got)
	}
	if d := Digest([]byte("abc")); len(d) != 32 || d[0] != 0xba {
		t.Fatalf("Digest(abc) = %x", d)
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	c := &Client{opts: options{backoffBase: 100 * time.Millisecond, backoffMax: time.Second}}
	for n := 1; n <= 10; n++ {
		d := c.backoff(n)
		want := min(100*time.Millisecond<<(n-1), time.Second)
		if d < want/2 || d > want {
			t.Fatalf("backoff(%d) = %v, want within [%v, %v]", n, d, want/2, want)
		}
	}
}
