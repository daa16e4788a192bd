package grpccodec

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// samples are messages of every shape the hot path sends: batches of
// IDs, per-item results with records, a streamed call and an error with
// details (a google.protobuf.Any).
func samples(t testing.TB) []proto.Message {
	detail, err := anypb.New(&dedupv1.Record{State: dedupv1.RecordState_RECORD_STATE_LEASED, FencingToken: 9})
	if err != nil {
		t.Fatal(err)
	}
	big := &dedupv1.CheckRequest{Namespace: "orders", Consistency: dedupv1.Consistency_CONSISTENCY_LINEARIZABLE}
	for i := range 5000 { // over gRPC's pooling threshold
		big.Ids = append(big.Ids, []byte{byte(i), byte(i >> 8), 'x'})
	}
	return []proto.Message{
		&dedupv1.MarkRequest{Namespace: "orders", TtlMs: 86_400_000, RequestToken: []byte("tok-1"),
			Items: []*dedupv1.MarkItem{{Id: []byte("a")}, {Id: []byte("b"), Digest: bytes.Repeat([]byte{7}, 32)}}},
		&dedupv1.MarkResponse{Results: []*dedupv1.MarkResult{
			{Code: dedupv1.MarkResult_NEW, Record: &dedupv1.Record{FirstSeenUnixMs: 1_780_000_000_000, ExpiresUnixMs: 1_780_086_400_000, RequestToken: []byte("tok-1")}},
			{Code: dedupv1.MarkResult_DUPLICATE, Record: &dedupv1.Record{FirstSeenUnixMs: 1, RequestToken: []byte("tok-0")}},
		}},
		&dedupv1.CheckResponse{AppliedIndex: 42, Results: []*dedupv1.CheckResult{{Code: dedupv1.CheckResult_NOT_SEEN}, {Code: dedupv1.CheckResult_SEEN, Record: &dedupv1.Record{}}}},
		big,
		&dedupv1.StreamRequest{Call: &dedupv1.StreamRequest_Check{Check: &dedupv1.CheckRequest{Ids: [][]byte{[]byte("z")}}}},
		&dedupv1.StreamResponse{RequestId: 7, Error: &dedupv1.StreamError{Code: 14, Message: "leader changed", Details: []*anypb.Any{detail}}},
		&dedupv1.MarkRequest{}, // empty: zero bytes on the wire
	}
}

// The codec is only a faster path to the same wire format: what it writes
// is byte for byte what the default protobuf codec writes, and what it
// reads back equals the message sent.
func TestCodecWritesTheDefaultCodecsBytesAndReadsThemBack(t *testing.T) {
	var c Codec
	for _, m := range samples(t) {
		got, err := c.Marshal(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Errorf("%T: codec bytes differ from proto.Marshal's", m)
		}
		back := m.ProtoReflect().New().Interface()
		if err := c.Unmarshal(got, back); err != nil {
			t.Fatalf("%T: unmarshal: %v", m, err)
		}
		if !proto.Equal(back, m) {
			t.Errorf("%T: round trip changed the message:\n got %v\nwant %v", m, back, m)
		}
		got.Free()
	}
}

// gRPC may hand a message it already used to Unmarshal (a stream's
// RecvMsg into the caller's value); the result must be the new message
// only, as with proto.Unmarshal, not the old fields plus the new ones.
func TestUnmarshalIntoAUsedMessageReplacesIt(t *testing.T) {
	var c Codec
	first, _ := c.Marshal(&dedupv1.CheckRequest{Namespace: "a", Ids: [][]byte{[]byte("1"), []byte("2")}})
	second, _ := c.Marshal(&dedupv1.CheckRequest{Ids: [][]byte{[]byte("3")}})
	var m dedupv1.CheckRequest
	if err := c.Unmarshal(first, &m); err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(second, &m); err != nil {
		t.Fatal(err)
	}
	if m.Namespace != "" || len(m.Ids) != 1 || string(m.Ids[0]) != "3" {
		t.Fatalf("second unmarshal kept the first message's fields: %v", &m)
	}
}

// The decoded message owns its bytes: gRPC recycles the receive buffer
// after Unmarshal, and an ID must not change under the caller afterwards.
func TestUnmarshalledBytesDoNotAliasTheReceiveBuffer(t *testing.T) {
	wire, err := proto.Marshal(&dedupv1.CheckRequest{Ids: [][]byte{[]byte("order-1")}})
	if err != nil {
		t.Fatal(err)
	}
	var m dedupv1.CheckRequest
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &m); err != nil {
		t.Fatal(err)
	}
	for i := range wire {
		wire[i] = 0
	}
	if string(m.Ids[0]) != "order-1" {
		t.Fatalf("ID changed with the receive buffer: %q", m.Ids[0])
	}
}

// Messages without generated methods (gRPC's own health service) go
// through the default codec; a value that is no protobuf message is an
// error naming its type, not a panic.
func TestOtherMessagesUseTheDefaultCodec(t *testing.T) {
	var c Codec
	in := &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}
	data, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out grpc_health_v1.HealthCheckResponse
	if err := c.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if out.Status != in.Status {
		t.Fatalf("health status %v after a round trip, want %v", out.Status, in.Status)
	}
	if _, err := c.Marshal(struct{}{}); err == nil {
		t.Fatal("marshalled a struct that is no protobuf message")
	}
	if err := c.Unmarshal(data, &struct{}{}); err == nil {
		t.Fatal("unmarshalled into a struct that is no protobuf message")
	}
}

// FuzzUnmarshalAgreesWithProto feeds the generated decoder the requests a
// client may send. What both accept they decode to equal messages
// (unknown fields aside: the server never reads them). Malformed input is
// where they differ: the generated decoder accepts a string that is not
// UTF-8 (the server validates namespace names itself), a 10-byte varint
// overflowing 64 bits, a malformed group among unknown fields, and the
// message it decodes then still encodes; it refuses a known field sent
// with the wrong wire type, which proto.Unmarshal keeps as unknown.
func FuzzUnmarshalAgreesWithProto(f *testing.F) {
	for _, m := range samples(f) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) < 4096 {
			f.Add(b)
		}
	}
	f.Add([]byte{0x12, 0x80}) // truncated length
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newMsg := range []func() proto.Message{
			func() proto.Message { return new(dedupv1.StreamRequest) },
			func() proto.Message { return new(dedupv1.MarkRequest) },
			func() proto.Message { return new(dedupv1.CheckRequest) },
			func() proto.Message { return new(dedupv1.ClaimRequest) },
		} {
			want := newMsg()
			wantErr := proto.Unmarshal(data, want)
			got := newMsg()
			gotErr := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, got)
			switch {
			case wantErr != nil && gotErr == nil:
				// Malformed input the generated decoder is lenient with
				// (see the test's doc): what it decoded must still encode,
				// so nothing downstream of the server's decode breaks.
				if _, err := got.(interface{ MarshalVT() ([]byte, error) }).MarshalVT(); err != nil {
					t.Fatalf("%T: accepted input proto.Unmarshal refuses (%v) and cannot encode it again: %v", want, wantErr, err)
				}
				continue
			case wantErr == nil && gotErr != nil:
				// proto.Unmarshal keeps a known field sent with another
				// wire type as an unknown field; the generated decoder
				// refuses the message. Only malformed clients send those.
				if !strings.Contains(gotErr.Error(), "wrong wireType") {
					t.Fatalf("%T: refused input proto.Unmarshal accepts: %v", want, gotErr)
				}
				continue
			case wantErr != nil:
				continue
			}
			discardUnknown(got.ProtoReflect())
			discardUnknown(want.ProtoReflect())
			if !proto.Equal(got, want) {
				t.Fatalf("%T: decoded differently:\n got %v\nwant %v", want, got, want)
			}
		}
	})
}

// discardUnknown drops the unknown fields of m and of every message in it.
func discardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				discardUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			discardUnknown(v.Message())
		}
		return true
	})
}

// BenchmarkCodec compares the codec with gRPC's default protobuf codec on
// the messages of one 16-ID mark call and one 16-ID check answer, full
// and compact (what the client asks for: a code byte per ID).
func BenchmarkCodec(b *testing.B) {
	res := &dedupv1.MarkResponse{}
	req := &dedupv1.MarkRequest{Namespace: "bench", TtlMs: 86_400_000, RequestToken: bytes.Repeat([]byte{1}, 16)}
	chk := &dedupv1.CheckResponse{AppliedIndex: 1 << 30}
	for i := range 16 {
		req.Items = append(req.Items, &dedupv1.MarkItem{Id: bytes.Repeat([]byte{byte(i)}, 16)})
		res.Results = append(res.Results, &dedupv1.MarkResult{Code: dedupv1.MarkResult_NEW,
			Record: &dedupv1.Record{FirstSeenUnixMs: 1_780_000_000_000, ExpiresUnixMs: 1_780_086_400_000, RequestToken: req.RequestToken}})
		chk.Results = append(chk.Results, &dedupv1.CheckResult{Code: dedupv1.CheckResult_NOT_SEEN})
	}
	compactRes := &dedupv1.MarkResponse{Codes: bytes.Repeat([]byte{byte(dedupv1.MarkResult_NEW)}, 16),
		NewRecord: &dedupv1.Record{FirstSeenUnixMs: 1_780_000_000_000, ExpiresUnixMs: 1_780_086_400_000}}
	compactChk := &dedupv1.CheckResponse{AppliedIndex: 1 << 30, Codes: bytes.Repeat([]byte{byte(dedupv1.CheckResult_NOT_SEEN)}, 16)}
	codecs := []encoding.CodecV2{encoding.GetCodecV2("proto"), Codec{}}
	for j, m := range []proto.Message{req, res, chk, compactRes, compactChk} {
		for i, c := range codecs {
			name := fmt.Sprintf("%T%s/%s", m, []string{"", "", "", "-compact", "-compact"}[j], []string{"default", "generated"}[i])
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					data, err := c.Marshal(m)
					if err != nil {
						b.Fatal(err)
					}
					out := m.ProtoReflect().New().Interface()
					if err := c.Unmarshal(data, out); err != nil {
						b.Fatal(err)
					}
					data.Free()
				}
			})
		}
	}
}
