package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeCommand: arbitrary bytes never panic the decoder (either
// format version); whatever decodes re-encodes (in the current version) to
// bytes that decode to the same command, and an accepted current-version
// entry re-encodes to exactly its own bytes (the decoder takes only the
// canonical form).
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range commandCases() {
		f.Add(AppendCommand(nil, &c))
		f.Add(appendCommandV1(nil, &c))
	}
	f.Add(AppendCommand(nil, &Command{TimestampMs: t0, Ops: []Op{{Kind: OpMark, Namespace: "n", DurationMs: 5, Items: []Item{{ID: []byte("a"), Digest: []byte("d"), Token: []byte("t")}}}}}))
	f.Add(AppendCommand(nil, &Command{Ops: []Op{{Kind: OpCreateNamespace, Config: DefaultNamespaceConfig("x")}, {Kind: OpSetNode, Node: NodeInfo{ID: "n1", GRPCAddr: "h:1"}}, {Kind: OpTick}, {Kind: OpRaiseFenceEpoch, FenceEpoch: 3}}}))
	f.Add([]byte{1, 0, 200, 200, 200, 200, 1})
	f.Add([]byte{2, 0, 1, 1, 0, 0, 1, 't', 200, 200, 200, 200, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCommand(data)
		if err != nil {
			if !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("error does not wrap ErrCorruptCommand: %v", err)
			}
			return
		}
		enc := AppendCommand(nil, &c)
		c2, err := DecodeCommand(enc)
		if err != nil {
			t.Fatalf("re-encoded command fails to decode: %v", err)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encoded command differs:\n%+v\n%+v", c, c2)
		}
		if !bytes.Equal(enc, AppendCommand(nil, &c2)) {
			t.Fatal("encoding is not stable")
		}
		if data[0] == commandVersion && !bytes.Equal(enc, data) {
			t.Fatalf("accepted a non-canonical entry:\n%x\nre-encodes to\n%x", data, enc)
		}
	})
}

// FuzzValidate: validation never panics, and every accepted op has items
// within the namespace's limits (so nothing invalid reaches the log).
func FuzzValidate(f *testing.F) {
	f.Add(uint8(OpMark), int64(0), []byte("id"), []byte{}, []byte("tok"), uint64(0), 3)
	f.Add(uint8(OpCommit), int64(-1), []byte{}, []byte("d"), []byte{}, uint64(1), 0)
	ns := DefaultNamespaceConfig("default")
	ns.MaxIDBytes = 16
	f.Fuzz(func(t *testing.T, kind uint8, dur int64, id, digest, token []byte, fence uint64, n int) {
		n = n % 20
		if n < 0 {
			n = -n
		}
		op := Op{Kind: OpKind(kind), DurationMs: dur}
		for range n {
			op.Items = append(op.Items, Item{ID: id, Digest: digest, Token: token, Fence: fence})
		}
		err := Validate(&op, &ns, Limits{MaxBatch: 10})
		if err != nil {
			var ie *InvalidError
			if !errors.As(err, &ie) || ie.Field == "" || !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("error without a field: %v", err)
			}
			return
		}
		if len(op.Items) == 0 || len(op.Items) > 10 || len(id) == 0 || len(id) > 16 || len(digest) > MaxDigestBytes || len(token) > MaxTokenBytes || dur < 0 || dur > ns.MaxTTLMs {
			t.Fatalf("accepted invalid op %+v", op)
		}
	})
}

// FuzzDecodeBucketEntry: arbitrary registry values never panic the
// decoder; whatever decodes in the windowed format re-encodes to bytes
// that decode to the same entry (a uvarint may arrive over-long, never
// from appendBucketEntry), and a value of one uvarint (the format before
// windows) decodes as a legacy bucket with no windows.
func FuzzDecodeBucketEntry(f *testing.F) {
	f.Add(appendBucketEntry(nil, bucketEntry{count: 3, inserts: 9, shift: windowShift}))
	f.Add(appendBucketEntry(nil, bucketEntry{count: 1 << 40, inserts: 1 << 41, shift: 2, legacy: true}))
	f.Add(encodeUvarint(310))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := decodeBucketEntry(data, windowShift)
		if err != nil {
			return
		}
		if _, n := binary.Uvarint(data); n == len(data) {
			if !e.legacy || e.inserts != 0 || e.windows() != 0 {
				t.Fatalf("a count alone decoded as %+v, want a legacy bucket without windows", e)
			}
			return
		}
		enc := appendBucketEntry(nil, e)
		if e2, err := decodeBucketEntry(enc, windowShift); err != nil || e2 != e {
			t.Fatalf("%x decodes to %+v, which encodes to %x, which decodes to %+v, %v", data, e, enc, e2, err)
		}
	})
}
