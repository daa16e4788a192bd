package fsm

import (
	"encoding/binary"
	"fmt"
)

func encodeUvarint(v uint64) []byte { return binary.AppendUvarint(nil, v) }
func encodeVarint(v int64) []byte   { return binary.AppendVarint(nil, v) }

func decodeUvarint(b []byte) (uint64, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 || n != len(b) {
		return 0, fmt.Errorf("bad uvarint %x", b)
	}
	return v, nil
}

func decodeVarint(b []byte) (int64, error) {
	v, n := binary.Varint(b)
	if n <= 0 || n != len(b) {
		return 0, fmt.Errorf("bad varint %x", b)
	}
	return v, nil
}
