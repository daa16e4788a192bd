package fsm

import (
	"encoding/binary"
	"fmt"
)

const recordVersion = 1

// appendRecord encodes r: version(1) state(1) firstSeen(varint)
// expires(varint) fence(uvarint) token(len+bytes) digest(len+bytes).
func appendRecord(dst []byte, r *Record) []byte {
	dst = append(dst, recordVersion, byte(r.State))
	dst = binary.AppendVarint(dst, r.FirstSeenMs)
	dst = binary.AppendVarint(dst, r.ExpiresMs)
	dst = binary.AppendUvarint(dst, r.Fence)
	dst = appendBytes(dst, r.Token)
	dst = appendBytes(dst, r.Digest)
	return dst
}

// decodeRecord parses appendRecord's output; byte slices alias data.
func decodeRecord(data []byte) (Record, error) {
	d := decoder{buf: data}
	var r Record
	if v := d.byte(); v != recordVersion {
		return r, fmt.Errorf("record version %d: %w", v, ErrCorruptCommand)
	}
	r.State = RecordState(d.byte())
	r.FirstSeenMs = d.varint()
	r.ExpiresMs = d.varint()
	r.Fence = d.uvarint()
	r.Token = d.bytes(MaxTokenBytes)
	r.Digest = d.bytes(MaxDigestBytes)
	if d.err != nil {
		return Record{}, fmt.Errorf("decode record: %w", d.err)
	}
	return r, nil
}

func (r Record) clone() Record {
	r.Token = append([]byte(nil), r.Token...)
	r.Digest = append([]byte(nil), r.Digest...)
	if len(r.Token) == 0 {
		r.Token = nil
	}
	if len(r.Digest) == 0 {
		r.Digest = nil
	}
	return r
}

// live reports whether the record still counts at time now (ms).
func (r *Record) live(now int64) bool {
	return r.ExpiresMs > now && r.State != StateReleased
}

func encodeNamespace(ns *NamespaceConfig) []byte { return appendNamespace(nil, ns) }

func decodeNamespace(data []byte) (NamespaceConfig, error) {
	d := decoder{buf: data}
	var ns NamespaceConfig
	ns.Name = string(d.bytes(maxNameBytes))
	id := d.uvarint()
	ns.ID = uint32(id)
	ns.DefaultTTLMs = d.varint()
	ns.MaxTTLMs = d.varint()
	ns.MaxIDBytes = int(d.uvarint())
	ns.Mode = ExpiryMode(d.byte())
	ns.DefaultLeaseMs = d.varint()
	ns.BucketWidthMs = d.varint()
	if d.err != nil {
		return ns, fmt.Errorf("decode namespace: %w", d.err)
	}
	return ns, nil
}

func encodeApplied(index, term uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, index)
	return binary.BigEndian.AppendUint64(b, term)
}

func decodeApplied(b []byte) (index, term uint64, err error) {
	if len(b) != 16 {
		return 0, 0, fmt.Errorf("applied index value has %d bytes, want 16", len(b))
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:]), nil
}
