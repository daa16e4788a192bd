package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// appendCommandV1 is AppendCommand as of format version 1 (commit
// e7189b4): id, digest, token and fence for every item. Entries in this
// format stay in Raft logs written before the change, so DecodeCommand
// must keep reading them.
func appendCommandV1(dst []byte, c *Command) []byte {
	dst = append(dst, commandVersion1)
	dst = binary.AppendVarint(dst, c.TimestampMs)
	dst = binary.AppendUvarint(dst, uint64(len(c.Ops)))
	for i := range c.Ops {
		op := &c.Ops[i]
		dst = append(dst, byte(op.Kind))
		dst = appendBytes(dst, []byte(op.Namespace))
		dst = binary.AppendVarint(dst, op.DurationMs)
		dst = binary.AppendUvarint(dst, uint64(len(op.Items)))
		for j := range op.Items {
			it := &op.Items[j]
			dst = appendBytes(dst, it.ID)
			dst = appendBytes(dst, it.Digest)
			dst = appendBytes(dst, it.Token)
			dst = binary.AppendUvarint(dst, it.Fence)
		}
		switch op.Kind {
		case OpCreateNamespace, OpUpdateNamespace:
			dst = appendNamespace(dst, &op.Config)
		case OpSetNode, OpRemoveNode:
			dst = appendBytes(dst, []byte(op.Node.ID))
			dst = appendBytes(dst, []byte(op.Node.GRPCAddr))
		case OpRaiseFenceEpoch: // added to version 1 after e7189b4
			dst = binary.AppendUvarint(dst, op.FenceEpoch)
		case OpSetNodeRole: // the decoder reads it in either version
			dst = appendBytes(dst, []byte(op.Node.ID))
			dst = append(dst, byte(op.Node.Role))
		case OpSetNodeRegion: // the same tail in both versions
			dst = appendBytes(dst, []byte(op.Node.ID))
			dst = appendBytes(dst, []byte(op.Node.GRPCAddr))
			dst = appendBytes(dst, []byte(op.Node.Region))
		case OpSetSetting:
			dst = appendBytes(dst, []byte(op.Setting.Name))
			dst = appendBytes(dst, []byte(op.Setting.Value))
			if op.Setting.Unset {
				dst = append(dst, 1)
			} else {
				dst = append(dst, 0)
			}
		}
	}
	return dst
}

// commandCases cover every op kind and every item shape: a shared token,
// per-item tokens (the Batcher's merged calls), empty tokens, digests,
// fences, ops without items. Empty byte slices are nil, as decoded.
func commandCases() []Command {
	shared := Op{Kind: OpMark, Namespace: "orders", DurationMs: 600_000}
	for i := range 16 {
		shared.Items = append(shared.Items, Item{ID: []byte(fmt.Sprintf("id-%013d", i)), Token: []byte("0123456789abcdef")})
	}
	mixed := Op{Kind: OpMark, Items: []Item{
		{ID: []byte("a"), Token: nil},
		{ID: []byte("b"), Token: []byte("own-b"), Digest: []byte("digest-b")},
		{ID: []byte("c")},
		{ID: []byte("d"), Token: []byte("own-d")},
		{ID: bytes.Repeat([]byte{0xff}, MaxIDBytesLimit), Token: []byte("own-d"), Digest: bytes.Repeat([]byte{1}, MaxDigestBytes)},
	}}
	fenced := Op{Kind: OpCommit, Namespace: "n", DurationMs: -1, Items: []Item{
		{ID: []byte("x"), Token: []byte("t"), Fence: 1},
		{ID: []byte("y"), Token: []byte("t"), Fence: 1 << 40},
		{ID: []byte("z"), Token: []byte("t")},
	}}
	return []Command{
		{TimestampMs: t0, Ops: []Op{shared}},
		{TimestampMs: -5, Ops: []Op{mixed, fenced, {Kind: OpClaim, Namespace: "n", DurationMs: 30_000, Items: []Item{{ID: []byte("q"), Token: []byte("t")}}}}},
		{TimestampMs: t0, Ops: []Op{
			{Kind: OpCreateNamespace, Config: DefaultNamespaceConfig("x")},
			{Kind: OpUpdateNamespace, Config: NamespaceConfig{Name: "y", ID: 7, DefaultTTLMs: 1000, MaxTTLMs: 2000, MaxIDBytes: 64, Mode: ExpirySliding, DefaultLeaseMs: 5, BucketWidthMs: 1000}},
			{Kind: OpDeleteNamespace, Namespace: "z"},
			{Kind: OpSetNode, Node: NodeInfo{ID: "n1", GRPCAddr: "h:1"}},
			{Kind: OpRemoveNode, Node: NodeInfo{ID: "n2"}},
			{Kind: OpRenew, Items: []Item{{ID: []byte("r"), Token: []byte("t"), Fence: 3}}},
			{Kind: OpRelease, Items: []Item{{ID: []byte("r"), Fence: 3}}},
			{Kind: OpForget, Items: []Item{{ID: []byte("f"), Token: []byte("t")}}},
			{Kind: OpTick},
			{Kind: OpRaiseFenceEpoch, FenceEpoch: 3},
			{Kind: OpSetNodeRole, Node: NodeInfo{ID: "r1", Role: RoleReplica}},
			{Kind: OpSetNodeRole, Node: NodeInfo{ID: "r2", Role: RoleMember}},
			{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n3", GRPCAddr: "h:3", Region: "eu-west"}},
			{Kind: OpSetNodeRegion, Node: NodeInfo{ID: "n4"}},
			{Kind: OpSetSetting, Setting: Setting{Name: "preferred-leader-regions", Value: "us,eu"}},
			{Kind: OpSetSetting, Setting: Setting{Name: "x", Unset: true}},
		}},
		{},
	}
}

// Both formats decode to the same command, equal to what was encoded.
func TestCommand_RoundTripBothVersions(t *testing.T) {
	for i, c := range commandCases() {
		want := c
		if want.Ops == nil {
			want.Ops = []Op{}
		}
		v2 := AppendCommand(nil, &c)
		v1 := appendCommandV1(nil, &c)
		if v2[0] != commandVersion || v1[0] != commandVersion1 {
			t.Fatalf("case %d: versions %d, %d", i, v2[0], v1[0])
		}
		for _, enc := range []struct {
			name string
			data []byte
			want Command
		}{{"v2", v2, want}, {"v1", v1, withoutLeaseTokens(want)}} {
			got, err := DecodeCommand(enc.data)
			if err != nil {
				t.Fatalf("case %d %s: %v", i, enc.name, err)
			}
			if want := enc.want; !reflect.DeepEqual(got, want) {
				t.Fatalf("case %d %s:\n got %+v\nwant %+v", i, enc.name, got, want)
			}
		}
		size := 0
		for j := range c.Ops {
			size += EncodedOpSize(&c.Ops[j])
		}
		if body := len(v2) - 1 - binary.PutVarint(make([]byte, 10), c.TimestampMs) - binary.PutUvarint(make([]byte, 10), uint64(len(c.Ops))); size < body {
			t.Fatalf("case %d: EncodedOpSize %d below the %d bytes written", i, size, body)
		}
	}
}

// withoutLeaseTokens is c as a version 1 entry decodes: its Commit, Renew
// and Release items without tokens (that format's builds never checked
// them; apply checks a lease item's token against its holder's).
func withoutLeaseTokens(c Command) Command {
	ops := make([]Op, len(c.Ops))
	for i, op := range c.Ops {
		if op.Kind == OpCommit || op.Kind == OpRenew || op.Kind == OpRelease {
			op.Items = append([]Item(nil), op.Items...)
			for j := range op.Items {
				op.Items[j].Token = nil
			}
		}
		ops[i] = op
	}
	c.Ops = ops
	return c
}

// A call of 16-byte IDs with one 16-byte token, no digests: the token is
// written once, each further ID costs its bytes and a one-byte head (17
// bytes; version 1: 36).
func TestCommand_V2WritesTheCallsTokenOnce(t *testing.T) {
	call := func(n int) *Command {
		op := Op{Kind: OpMark, Namespace: "orders", DurationMs: 600_000}
		for i := range n {
			op.Items = append(op.Items, Item{ID: []byte(fmt.Sprintf("id-%013d", i)), Token: []byte("0123456789abcdef")})
		}
		return &Command{TimestampMs: t0, Ops: []Op{op}}
	}
	perID := func(enc func([]byte, *Command) []byte) float64 {
		return float64(len(enc(nil, call(32)))-len(enc(nil, call(16)))) / 16
	}
	v1, v2 := perID(appendCommandV1), perID(AppendCommand)
	t.Logf("bytes per further 16-byte ID: v1 %.1f, v2 %.1f; a whole 16-ID call: v1 %d, v2 %d bytes",
		v1, v2, len(appendCommandV1(nil, call(16))), len(AppendCommand(nil, call(16))))
	if v2 != 17 || v1 != 36 {
		t.Fatalf("bytes per ID: v1 %.1f, v2 %.1f; want 36 and 17", v1, v2)
	}
}

// The decoder takes only the canonical form of version 2, so every
// accepted entry re-encodes to the same bytes.
func TestCommand_RejectsNonCanonicalV2(t *testing.T) {
	op := func(token string, heads ...[]byte) []byte {
		b := []byte{commandVersion, 0, 1, byte(OpMark), 0, 0}
		b = appendBytes(b, []byte(token))
		b = binary.AppendUvarint(b, uint64(len(heads)))
		for _, h := range heads {
			b = append(b, h...)
		}
		return b
	}
	item := func(id string, flags byte, rest ...byte) []byte {
		head := uint64(len(id)) << itemShift
		if flags != 0 {
			head |= itemExtras
		}
		b := append(binary.AppendUvarint(nil, head), id...)
		if flags != 0 {
			b = append(b, flags)
		}
		return append(b, rest...)
	}
	for name, data := range map[string][]byte{
		"first item with its own token": op("t", item("a", itemOwnToken, 1, 'u')),
		"own token equal to the op's":   op("t", item("a", 0), item("b", itemOwnToken, 1, 't')),
		"empty digest flagged":          op("t", item("a", itemDigest, 0)),
		"zero fence flagged":            op("t", item("a", itemFence, 0)),
		"token without items":           op("t"),
		"id longer than the limit":      op("t", item(string(make([]byte, MaxIDBytesLimit+1)), 0)),
		"id past the end":               op("t", binary.AppendUvarint(nil, 9<<itemShift)),
		"extras without flags":          op("t", append(binary.AppendUvarint(nil, 1<<itemShift|itemExtras), 'a', 0)),
		"unknown flag":                  op("t", item("a", 1<<5)),
		"unknown version":               {3, 0, 0},
	} {
		if _, err := DecodeCommand(data); !errors.Is(err, ErrCorruptCommand) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := DecodeCommand(op("t", item("a", 0), item("b", itemOwnToken, 1, 'u'))); err != nil {
		t.Fatalf("canonical entry refused: %v", err)
	}
}

// BenchmarkCommandCodec: encode and decode one entry of 50 calls of 16
// IDs (16 bytes, one 16-byte token per call), per format version; ns/op
// is per entry of 800 IDs.
func BenchmarkCommandCodec(b *testing.B) {
	c := Command{TimestampMs: t0}
	for k := range 50 {
		op := Op{Kind: OpMark, Namespace: "bench", DurationMs: 600_000}
		tok := []byte(fmt.Sprintf("token-%010d", k))
		for i := range 16 {
			op.Items = append(op.Items, Item{ID: []byte(fmt.Sprintf("id-%06d-%06d", k, i)), Token: tok})
		}
		c.Ops = append(c.Ops, op)
	}
	for _, v := range []struct {
		name string
		enc  func([]byte, *Command) []byte
	}{{"v1", appendCommandV1}, {"v2", AppendCommand}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				data := v.enc(nil, &c)
				n = len(data)
				if _, err := DecodeCommand(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/800, "B/ID")
		})
	}
}
