// Package grpccodec is the gRPC codec of dedupnode's servers and clients:
// protobuf on the wire, as gRPC's default codec, but marshalled and
// unmarshalled by the code vtprotobuf generates for our messages
// (api/dedup/v1/*_vtproto.pb.go) instead of by reflection. The bytes are
// the same; the CPU is not: the reflective unmarshal of a batch's
// per-item results was about 12 % of a load generator's CPU.
//
// It is passed per server (grpc.ForceServerCodecV2) and per connection
// (grpc.ForceCodecV2), never registered globally, so it does not change
// the codec of other gRPC code in the same process.
//
// Only the Dedup service's messages take the generated path (hotPath).
// The generated decoder does not check that strings are UTF-8, as
// proto.Unmarshal does; the only strings in those requests are namespace
// names, which the server validates itself ([A-Za-z0-9._-]) and refuses
// with InvalidArgument naming the field. Every other message (Admin, Ops,
// Internal, gRPC's health and reflection services) goes through the
// default protobuf codec and keeps its checks.
package grpccodec

import (
	"fmt"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// vtMessage is what vtprotobuf generates (features marshal, unmarshal,
// size).
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVT(dst []byte) (int, error)
	UnmarshalVT(data []byte) error
}

// hotPath returns v's generated methods when v is a message of the Dedup
// service's calls (unary or streamed).
func hotPath(v any) (vtMessage, bool) {
	switch m := v.(type) {
	case *dedupv1.StreamRequest, *dedupv1.StreamResponse,
		*dedupv1.MarkRequest, *dedupv1.MarkResponse,
		*dedupv1.CheckRequest, *dedupv1.CheckResponse,
		*dedupv1.ClaimRequest, *dedupv1.ClaimResponse,
		*dedupv1.CommitRequest, *dedupv1.RenewRequest, *dedupv1.ReleaseRequest, *dedupv1.LeaseResponse,
		*dedupv1.ForgetRequest, *dedupv1.ForgetResponse:
		return m.(vtMessage), true
	}
	return nil, false
}

// Codec is an encoding.CodecV2 named "proto": peers see the ordinary
// protobuf content type.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// fallback is gRPC's registered protobuf codec.
func fallback() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

// Name is "proto", the content-subtype of the default codec.
func (Codec) Name() string { return "proto" }

// Marshal encodes v into a buffer from gRPC's pool when it is large
// enough to be worth pooling, as the default codec does.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := hotPath(v)
	if !ok {
		if _, isProto := v.(proto.Message); !isProto {
			return nil, fmt.Errorf("grpccodec: cannot marshal %T: not a protobuf message", v)
		}
		return fallback().Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if _, err := m.MarshalToSizedBufferVT(buf); err != nil {
			return nil, fmt.Errorf("grpccodec: marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := m.MarshalToSizedBufferVT((*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("grpccodec: marshal %T: %w", v, err)
	}
	*buf = (*buf)[:size]
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v. The generated code copies every bytes
// field out of data, so the buffer goes back to the pool afterwards.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := hotPath(v)
	if !ok {
		if _, isProto := v.(proto.Message); !isProto {
			return fmt.Errorf("grpccodec: cannot unmarshal into %T: not a protobuf message", v)
		}
		return fallback().Unmarshal(data, v)
	}
	// UnmarshalVT merges into what m holds; proto.Unmarshal resets first.
	if r, ok := v.(interface{ Reset() }); ok {
		r.Reset()
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := m.UnmarshalVT(buf.ReadOnlyData()); err != nil {
		return fmt.Errorf("grpccodec: unmarshal %T: %w", v, err)
	}
	return nil
}
