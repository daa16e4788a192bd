package fsm

import (
	"strings"
	"testing"
)

// Errors name the namespace whose limit a request broke; the nameless
// config (the server's check before the namespace is known) names no
// namespace, least of all a made-up one.
func TestValidateErrorsNameTheLimit(t *testing.T) {
	ns := DefaultNamespaceConfig("orders")
	op := Op{Kind: OpMark, DurationMs: ns.MaxTTLMs + 1, Items: []Item{{ID: []byte("a")}}}
	if err := Validate(&op, &ns, Limits{}); err == nil || !strings.Contains(err.Error(), `max TTL of namespace "orders"`) {
		t.Fatalf("err = %v", err)
	}
	widest := NamespaceConfig{MaxTTLMs: MaxTTLLimitMs, MaxIDBytes: MaxIDBytesLimit}
	op.DurationMs = MaxTTLLimitMs + 1
	err := Validate(&op, &widest, Limits{})
	if err == nil || !strings.Contains(err.Error(), "the largest max TTL a namespace can have") || strings.Contains(err.Error(), "namespace \"") {
		t.Fatalf("err = %v", err)
	}
	op = Op{Kind: OpClaim, Items: []Item{{ID: make([]byte, MaxIDBytesLimit+1)}}}
	if err := Validate(&op, &widest, Limits{}); err == nil || !strings.Contains(err.Error(), "the most any namespace allows") {
		t.Fatalf("err = %v", err)
	}
}
