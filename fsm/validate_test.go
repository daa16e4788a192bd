package fsm

import (
	"errors"
	"regexp"
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

// namespacePattern is the rule ValidateNamespaceName states, as a regexp:
// the oracle the byte loop is checked against.
var namespacePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func TestValidateNamespaceNameFollowsThePattern(t *testing.T) {
	long := strings.Repeat("a", 128)
	for _, name := range []string{
		"", "a", "orders", "Orders.v2_eu-1", "9lives", long, long + "a",
		".hidden", "_x", "-x", "a b", "a/b", "ä", "a\x00", "a.", "a..b", "A-",
	} {
		checkNamespaceName(t, name)
	}
}

func FuzzValidateNamespaceName(f *testing.F) {
	for _, s := range []string{"", "a", "orders.v2", "-x", "a b", strings.Repeat("z", 129)} {
		f.Add(s)
	}
	f.Fuzz(checkNamespaceName)
}

func checkNamespaceName(t *testing.T, name string) {
	want := namespacePattern.MatchString(name)
	err := ValidateNamespaceName(name)
	if (err == nil) != want {
		t.Fatalf("ValidateNamespaceName(%q) = %v, pattern says valid=%v", name, err, want)
	}
	var inv *InvalidError
	if err != nil && (!errors.As(err, &inv) || inv.Field != "namespace") {
		t.Fatalf("ValidateNamespaceName(%q) = %v, want an *InvalidError for field namespace", name, err)
	}
}

// TestValidateNodeIDIsWhatTheFSMRecords: ValidateNodeID accepts exactly the
// IDs every node op can carry through the log. A 129-byte ID was once let
// into the Raft configuration, and every command naming it was rejected by
// the decoder: it could never be given an address or be retired.
func TestValidateNodeIDIsWhatTheFSMRecords(t *testing.T) {
	for _, id := range []string{"n1", "a b", "ä-1", "node.eu-west_3", strings.Repeat("x", MaxNodeIDBytes), strings.Repeat("é", MaxNodeIDBytes/2)} {
		if err := ValidateNodeID(id); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v, want nil", id, err)
		}
		for _, kind := range []OpKind{OpSetNode, OpRemoveNode, OpSetNodeRegion, OpSetNodeRole} {
			c := Command{TimestampMs: 1, Ops: []Op{{Kind: kind, Node: NodeInfo{ID: id, GRPCAddr: "127.0.0.1:7070", Region: "eu"}}}}
			got, err := DecodeCommand(AppendCommand(nil, &c))
			if err != nil || got.Ops[0].Node.ID != id {
				t.Errorf("%s of a valid ID %q: decoded %+v, %v", kind, id, got.Ops, err)
			}
		}
	}
	long := strings.Repeat("x", MaxNodeIDBytes+1)
	c := Command{TimestampMs: 1, Ops: []Op{{Kind: OpSetNode, Node: NodeInfo{ID: long, GRPCAddr: "127.0.0.1:7070"}}}}
	if _, err := DecodeCommand(AppendCommand(nil, &c)); !errors.Is(err, ErrCorruptCommand) {
		t.Fatalf("decoder accepts a %d-byte node ID (%v): update MaxNodeIDBytes", len(long), err)
	}
	for _, id := range []string{"", long, strings.Repeat("é", MaxNodeIDBytes/2+1), "n1\n", "a\x00b", " n1", "n1 ", "\xff"} {
		err := ValidateNodeID(id)
		var inv *InvalidError
		if !errors.As(err, &inv) || inv.Field != "node_id" {
			t.Errorf("ValidateNodeID(%q) = %v, want an *InvalidError for field node_id", id, err)
		}
	}
	if err := ValidateNodeID(long); err == nil || !strings.Contains(err.Error(), "129 bytes, longer than the 128 bytes") {
		t.Errorf("ValidateNodeID(129 bytes) = %v, want the length and the limit", err)
	}
}
