package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// OpKind names one operation inside a Command.
type OpKind uint8

// Operation kinds. The numeric values are part of the Raft log format and
// must never change.
const (
	OpMark            OpKind = 1
	OpClaim           OpKind = 2
	OpCommit          OpKind = 3
	OpRenew           OpKind = 4
	OpRelease         OpKind = 5
	OpForget          OpKind = 6
	OpCreateNamespace OpKind = 7
	OpUpdateNamespace OpKind = 8
	OpDeleteNamespace OpKind = 9
	OpSetNode         OpKind = 10
	OpRemoveNode      OpKind = 11
	// OpTick carries only the timestamp: it lets the FSM drop expired
	// buckets when no client writes arrive.
	OpTick OpKind = 12
	// OpRaiseFenceEpoch raises the fencing epoch (the high bits of every
	// fencing token granted afterwards) to at least Op.FenceEpoch; an
	// import proposes it so that new tokens exceed every token the source
	// cluster could grant (see DESIGN.md, Fencing epochs).
	OpRaiseFenceEpoch OpKind = 13
)

func (k OpKind) String() string {
	switch k {
	case OpMark:
		return "mark"
	case OpClaim:
		return "claim"
	case OpCommit:
		return "commit"
	case OpRenew:
		return "renew"
	case OpRelease:
		return "release"
	case OpForget:
		return "forget"
	case OpCreateNamespace:
		return "create-namespace"
	case OpUpdateNamespace:
		return "update-namespace"
	case OpDeleteNamespace:
		return "delete-namespace"
	case OpSetNode:
		return "set-node"
	case OpRemoveNode:
		return "remove-node"
	case OpTick:
		return "tick"
	case OpRaiseFenceEpoch:
		return "raise-fence-epoch"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Item is one message ID inside an Op.
type Item struct {
	// ID is the opaque message ID, 1..Namespace.MaxIDBytes bytes.
	ID []byte
	// Digest is an optional payload digest (at most MaxDigestBytes); an ID
	// recorded with one digest and seen with another answers CONFLICT.
	Digest []byte
	// Token is the request token of the logical call this item belongs to
	// (at most MaxTokenBytes). Retries carry the same token and get the
	// first answer back.
	Token []byte
	// Fence is the fencing token for Commit, Renew and Release.
	Fence uint64
}

// Op is one client request (or one internal action) inside a Command.
type Op struct {
	Kind OpKind
	// Namespace names the dedup space; "" means DefaultNamespace.
	Namespace string
	// DurationMs is the TTL (Mark, Commit) or lease (Claim, Renew) in
	// milliseconds; 0 means the namespace default.
	DurationMs int64
	Items      []Item
	// Config is the namespace for Create/UpdateNamespace.
	Config NamespaceConfig
	// Node is the node for SetNode/RemoveNode (RemoveNode uses Node.ID).
	Node NodeInfo
	// FenceEpoch is the epoch OpRaiseFenceEpoch raises the state's to (if
	// it is lower), at most MaxFenceEpoch.
	FenceEpoch uint64
}

// NodeInfo maps a Raft server ID to the address clients use.
type NodeInfo struct {
	ID       string
	GRPCAddr string
}

// Command is the payload of one Raft log entry: the leader's timestamp and
// the operations it groups. Apply computes every expiry from TimestampMs and
// never reads a clock (see doc.go).
type Command struct {
	// TimestampMs is the leader's wall clock in Unix milliseconds when it
	// proposed the entry. Apply uses max(TimestampMs, last applied timestamp)
	// so time never goes backwards, across leader changes too.
	TimestampMs int64
	Ops         []Op
}

// Format limits enforced by DecodeCommand (and by Validate at the edge).
const (
	commandVersion = 1
	// MaxDigestBytes bounds Item.Digest (a SHA-512 fits).
	MaxDigestBytes = 64
	// MaxTokenBytes bounds Item.Token.
	MaxTokenBytes = 64
	// MaxIDBytesLimit is the largest MaxIDBytes a namespace may configure.
	MaxIDBytesLimit = 4096
	maxNameBytes    = 128
	maxAddrBytes    = 256
)

// ErrCorruptCommand is returned by DecodeCommand for bytes that are not a
// Command written by AppendCommand.
var ErrCorruptCommand = errors.New("corrupt command")

// AppendCommand appends the binary encoding of c to dst and returns it.
//
// Layout (all integers are unsigned varints unless noted):
//
//	version(1 byte) timestamp(zigzag varint) nops
//	op*: kind(1 byte) namespace(len+bytes) duration(zigzag) nitems
//	     item*: id(len+bytes) digest(len+bytes) token(len+bytes) fence
//	     then, by kind: namespace config | node info | fence epoch | nothing
func AppendCommand(dst []byte, c *Command) []byte {
	dst = append(dst, commandVersion)
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
		case OpRaiseFenceEpoch:
			dst = binary.AppendUvarint(dst, op.FenceEpoch)
		}
	}
	return dst
}

func appendNamespace(dst []byte, ns *NamespaceConfig) []byte {
	dst = appendBytes(dst, []byte(ns.Name))
	dst = binary.AppendUvarint(dst, uint64(ns.ID))
	dst = binary.AppendVarint(dst, ns.DefaultTTLMs)
	dst = binary.AppendVarint(dst, ns.MaxTTLMs)
	dst = binary.AppendUvarint(dst, uint64(ns.MaxIDBytes))
	dst = append(dst, byte(ns.Mode))
	dst = binary.AppendVarint(dst, ns.DefaultLeaseMs)
	dst = binary.AppendVarint(dst, ns.BucketWidthMs)
	return dst
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// DecodeCommand parses the bytes written by AppendCommand. Byte slices in
// the result alias data. Any malformed input returns an error wrapping
// ErrCorruptCommand; it never panics.
func DecodeCommand(data []byte) (Command, error) {
	d := decoder{buf: data}
	var c Command
	if v := d.byte(); v != commandVersion {
		if d.err != nil {
			return c, d.err
		}
		return c, fmt.Errorf("%w: version %d, want %d", ErrCorruptCommand, v, commandVersion)
	}
	c.TimestampMs = d.varint()
	nops := d.count(3)
	if d.err != nil {
		return c, d.err
	}
	c.Ops = make([]Op, nops)
	for i := range c.Ops {
		op := &c.Ops[i]
		op.Kind = OpKind(d.byte())
		if op.Kind < OpMark || op.Kind > OpRaiseFenceEpoch {
			if d.err == nil {
				d.fail("unknown op kind %d", op.Kind)
			}
			return Command{}, d.err
		}
		op.Namespace = string(d.bytes(maxNameBytes))
		op.DurationMs = d.varint()
		nitems := d.count(4)
		if d.err != nil {
			return Command{}, d.err
		}
		if nitems > 0 {
			op.Items = make([]Item, nitems)
		}
		for j := range op.Items {
			it := &op.Items[j]
			it.ID = d.bytes(MaxIDBytesLimit)
			it.Digest = d.bytes(MaxDigestBytes)
			it.Token = d.bytes(MaxTokenBytes)
			it.Fence = d.uvarint()
		}
		switch op.Kind {
		case OpCreateNamespace, OpUpdateNamespace:
			ns := &op.Config
			ns.Name = string(d.bytes(maxNameBytes))
			id := d.uvarint()
			if id > 1<<32-1 {
				d.fail("namespace id %d out of range", id)
			}
			ns.ID = uint32(id)
			ns.DefaultTTLMs = d.varint()
			ns.MaxTTLMs = d.varint()
			maxID := d.uvarint()
			if maxID > MaxIDBytesLimit {
				d.fail("max id bytes %d out of range", maxID)
			}
			ns.MaxIDBytes = int(maxID)
			ns.Mode = ExpiryMode(d.byte())
			ns.DefaultLeaseMs = d.varint()
			ns.BucketWidthMs = d.varint()
		case OpSetNode, OpRemoveNode:
			op.Node.ID = string(d.bytes(maxNameBytes))
			op.Node.GRPCAddr = string(d.bytes(maxAddrBytes))
		case OpRaiseFenceEpoch:
			op.FenceEpoch = d.uvarint()
		}
		if d.err != nil {
			return Command{}, d.err
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		d.fail("%d trailing bytes", len(d.buf))
	}
	if d.err != nil {
		return Command{}, d.err
	}
	return c, nil
}

type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorruptCommand, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.buf) == 0 {
		d.fail("truncated")
		return 0
	}
	b := d.buf[0]
	d.buf = d.buf[1:]
	return b
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// count reads an element count and rejects counts that could not fit in the
// remaining bytes, given each element takes at least minSize bytes; this
// bounds allocations on hostile input.
func (d *decoder) count(minSize int) uint64 {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.buf)/minSize+1) {
		d.fail("count %d exceeds remaining %d bytes", n, len(d.buf))
		return 0
	}
	return n
}

func (d *decoder) bytes(max int) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(len(d.buf)) {
		d.fail("length %d exceeds limit %d or remaining %d bytes", n, max, len(d.buf))
		return nil
	}
	if n == 0 {
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
}
