package fsm

import (
	"bytes"
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
	// OpSetNodeRole records a node's role (Node.ID, Node.Role): a read
	// replica is a permanent non-voter the leader never promotes on its
	// own. The leader proposes it before adding a replica to the Raft
	// configuration, so no leader ever sees a replica without its role.
	OpSetNodeRole OpKind = 14
	// OpSetNodeRegion is OpSetNode with the node's region (Node.Region;
	// "" removes the recorded region). A separate kind keeps clusters that
	// use no regions writing the entries older nodes read.
	OpSetNodeRegion OpKind = 15
	// OpSetSetting sets the cluster setting Setting.Name to Setting.Value
	// (Setting.Unset removes it).
	OpSetSetting OpKind = 16
)

// maxOpKind is the largest OpKind DecodeCommand accepts.
const maxOpKind = OpSetSetting

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
	case OpSetNodeRole:
		return "set-node-role"
	case OpSetNodeRegion:
		return "set-node-region"
	case OpSetSetting:
		return "set-setting"
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
	// first answer back. An item whose ID and token an earlier item of
	// its op carries is no retry: it is answered as a second call would
	// be (DESIGN.md, "Repeats within a request").
	Token []byte
	// Fence is the fencing token for Commit, Renew and Release.
	Fence uint64
}

// A Commit, Renew or Release item's Token is the request token of the
// Claim that granted the lease: with Fence, it proves the caller holds
// the lease (apply checks both; DESIGN.md, Claims). An item without one
// (entries proposed before holders had to prove it, and every version 1
// entry, whose lease items' tokens were never checked) is checked by its
// Fence alone, as when it was written.

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
	// Setting is the cluster setting of OpSetSetting.
	Setting Setting
}

// NodeInfo maps a Raft server ID to the address clients use and, with
// OpSetNodeRegion, the node's region.
type NodeInfo struct {
	ID       string
	GRPCAddr string
	// Role is the node's role (OpSetNodeRole only).
	Role NodeRole
	// Region is the node's region (OpSetNodeRegion only).
	Region string
}

// NodeRole is what the leader may do with a node's Raft suffrage.
type NodeRole uint8

// Node roles. The numeric values are part of the Raft log format.
const (
	// RoleMember (the default) votes once it has caught up: a non-voter
	// with this role is promoted automatically.
	RoleMember NodeRole = 0
	// RoleReplica is a read replica: a permanent non-voter, promoted only
	// on an operator's request (which sets RoleMember first).
	RoleReplica NodeRole = 1
)

func (r NodeRole) String() string {
	switch r {
	case RoleMember:
		return "member"
	case RoleReplica:
		return "replica"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Setting is one replicated cluster setting (see Settings).
type Setting struct {
	Name  string
	Value string
	// Unset removes the setting (a setting set to "" is present).
	Unset bool
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
	// commandVersion is what AppendCommand writes. DecodeCommand also reads
	// commandVersion1, the format of every entry written before
	// 2026-12-01: Raft logs and snapshots' trailing entries outlive builds.
	commandVersion  = 2
	commandVersion1 = 1
	// MaxDigestBytes bounds Item.Digest (a SHA-512 fits).
	MaxDigestBytes = 64
	// MaxTokenBytes bounds Item.Token.
	MaxTokenBytes = 64
	// MaxIDBytesLimit is the largest MaxIDBytes a namespace may configure.
	MaxIDBytesLimit = 4096
	maxNameBytes    = 128
	// MaxNodeIDBytes bounds a node ID (NodeInfo.ID): the decoder rejects a
	// command whose node op carries a longer one, so a longer ID can never
	// be recorded, retired or given an address. ValidateNodeID checks it.
	MaxNodeIDBytes = maxNameBytes
	// MaxSettingBytes bounds a cluster setting's value.
	MaxSettingBytes = 4096
	maxAddrBytes    = 256
)

// An item's head in format version 2 is len(ID)<<1 | itemExtras: one
// byte for IDs up to 63 bytes. With itemExtras, a flags byte follows the
// ID and says which of digest, own token and fence follow it.
const (
	itemExtras = 1
	itemShift  = 1

	itemDigest   = 1 << 0 // a digest follows
	itemOwnToken = 1 << 1 // a token follows: the item's differs from its op's
	itemFence    = 1 << 2 // a fence follows
	itemFlags    = itemDigest | itemOwnToken | itemFence
)

// ErrCorruptCommand is returned by DecodeCommand for bytes that are not a
// Command written by AppendCommand.
var ErrCorruptCommand = errors.New("corrupt command")

// AppendCommand appends the binary encoding of c to dst and returns it.
//
// Layout, format version 2 (integers are unsigned varints unless noted):
//
//	version(1 byte) timestamp(zigzag varint) nops
//	op*: kind(1 byte) namespace(len+bytes) duration(zigzag) token(len+bytes) nitems
//	     item*: head id-bytes [flags(1 byte) [digest(len+bytes)] [token(len+bytes)] [fence]]
//	            head = len(id)<<1 | itemExtras; flags = itemFence|itemOwnToken|itemDigest
//	     then, by kind: namespace config | node info | fence epoch | nothing
//
// An op is one client call, and its items share the call's request token:
// the op's token is its first item's, written once, and an item repeats a
// token only when its own differs (the client's Batcher merges single-ID
// calls with their own tokens into one op). A Mark of 16-byte IDs without
// digests costs 17 bytes per ID (version 1 wrote id, digest, token and
// fence for every item: 36 bytes with a 16-byte token).
func AppendCommand(dst []byte, c *Command) []byte {
	dst = append(dst, commandVersion)
	dst = binary.AppendVarint(dst, c.TimestampMs)
	dst = binary.AppendUvarint(dst, uint64(len(c.Ops)))
	for i := range c.Ops {
		op := &c.Ops[i]
		dst = append(dst, byte(op.Kind))
		dst = appendBytes(dst, []byte(op.Namespace))
		dst = binary.AppendVarint(dst, op.DurationMs)
		var token []byte
		if len(op.Items) > 0 {
			token = op.Items[0].Token
		}
		dst = appendBytes(dst, token)
		dst = binary.AppendUvarint(dst, uint64(len(op.Items)))
		for j := range op.Items {
			it := &op.Items[j]
			var flags byte
			if len(it.Digest) > 0 {
				flags |= itemDigest
			}
			if !bytes.Equal(it.Token, token) {
				flags |= itemOwnToken
			}
			if it.Fence != 0 {
				flags |= itemFence
			}
			head := uint64(len(it.ID)) << itemShift
			if flags != 0 {
				head |= itemExtras
			}
			dst = binary.AppendUvarint(dst, head)
			dst = append(dst, it.ID...)
			if flags == 0 {
				continue
			}
			dst = append(dst, flags)
			if flags&itemDigest != 0 {
				dst = appendBytes(dst, it.Digest)
			}
			if flags&itemOwnToken != 0 {
				dst = appendBytes(dst, it.Token)
			}
			if flags&itemFence != 0 {
				dst = binary.AppendUvarint(dst, it.Fence)
			}
		}
		switch op.Kind {
		case OpCreateNamespace, OpUpdateNamespace:
			dst = appendNamespace(dst, &op.Config)
		case OpSetNode, OpRemoveNode:
			dst = appendBytes(dst, []byte(op.Node.ID))
			dst = appendBytes(dst, []byte(op.Node.GRPCAddr))
		case OpSetNodeRegion:
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
		case OpRaiseFenceEpoch:
			dst = binary.AppendUvarint(dst, op.FenceEpoch)
		case OpSetNodeRole:
			dst = appendBytes(dst, []byte(op.Node.ID))
			dst = append(dst, byte(op.Node.Role))
		}
	}
	return dst
}

// EncodedOpSize bounds the bytes AppendCommand spends on op (varints
// counted at their longest). The proposer sizes entries with it.
func EncodedOpSize(op *Op) int {
	token := 0
	if len(op.Items) > 0 {
		token = len(op.Items[0].Token)
	}
	n := 1 + binary.MaxVarintLen64 + len(op.Namespace) + binary.MaxVarintLen64 + 1 + token + binary.MaxVarintLen64
	for i := range op.Items {
		it := &op.Items[i]
		n += 3 + len(it.ID) // head (a 4096-byte ID's fits in 2 bytes) and flags
		if len(it.Digest) > 0 {
			n += 1 + len(it.Digest)
		}
		if !bytes.Equal(it.Token, op.Items[0].Token) {
			n += 1 + len(it.Token)
		}
		if it.Fence != 0 {
			n += binary.MaxVarintLen64
		}
	}
	switch op.Kind {
	case OpCreateNamespace, OpUpdateNamespace:
		n += 1 + len(op.Config.Name) + 7*binary.MaxVarintLen64 + 1
	case OpSetNode, OpRemoveNode:
		n += 2 + len(op.Node.ID) + 2 + len(op.Node.GRPCAddr)
	case OpSetNodeRegion:
		n += 2 + len(op.Node.ID) + 2 + len(op.Node.GRPCAddr) + 2 + len(op.Node.Region)
	case OpSetSetting:
		n += 2 + len(op.Setting.Name) + 3 + len(op.Setting.Value) + 1
	case OpRaiseFenceEpoch:
		n += binary.MaxVarintLen64
	case OpSetNodeRole:
		n += 2 + len(op.Node.ID) + 1
	}
	return n
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

// DecodeCommand parses the bytes written by AppendCommand, in format
// version 2 or 1. Byte slices in the result alias data (items that share
// their op's token share one slice). Any malformed input returns an error
// wrapping ErrCorruptCommand; it never panics.
func DecodeCommand(data []byte) (Command, error) {
	d := decoder{buf: data}
	var c Command
	version := d.byte()
	if d.err != nil {
		return c, d.err
	}
	if version != commandVersion && version != commandVersion1 {
		return c, fmt.Errorf("%w: version %d, want %d or %d", ErrCorruptCommand, version, commandVersion, commandVersion1)
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
		if op.Kind < OpMark || op.Kind > maxOpKind {
			if d.err == nil {
				d.fail("unknown op kind %d", op.Kind)
			}
			return Command{}, d.err
		}
		op.Namespace = string(d.bytes(maxNameBytes))
		op.DurationMs = d.varint()
		if version == commandVersion1 {
			d.itemsV1(op)
		} else {
			d.items(op)
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
			op.Node.ID = string(d.bytes(MaxNodeIDBytes))
			op.Node.GRPCAddr = string(d.bytes(maxAddrBytes))
		case OpSetNodeRegion:
			op.Node.ID = string(d.bytes(MaxNodeIDBytes))
			op.Node.GRPCAddr = string(d.bytes(maxAddrBytes))
			op.Node.Region = string(d.bytes(maxNameBytes))
		case OpSetSetting:
			op.Setting.Name = string(d.bytes(maxNameBytes))
			op.Setting.Value = string(d.bytes(MaxSettingBytes))
			switch d.byte() {
			case 0:
			case 1:
				op.Setting.Unset = true
			default:
				d.fail("bad setting flag")
			}
		case OpRaiseFenceEpoch:
			op.FenceEpoch = d.uvarint()
		case OpSetNodeRole:
			op.Node.ID = string(d.bytes(MaxNodeIDBytes))
			op.Node.Role = NodeRole(d.byte())
			if d.err == nil && op.Node.Role > RoleReplica {
				d.fail("unknown node role %d", op.Node.Role)
			}
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

// items reads an op's token and items in format version 2.
func (d *decoder) items(op *Op) {
	token := d.bytes(MaxTokenBytes)
	nitems := d.count(1)
	if d.err == nil && nitems == 0 && token != nil {
		d.fail("a token without items")
	}
	if d.err != nil || nitems == 0 {
		return
	}
	op.Items = make([]Item, nitems)
	for j := range op.Items {
		it := &op.Items[j]
		head := d.uvarint()
		if d.err != nil {
			return
		}
		if head>>itemShift > MaxIDBytesLimit {
			d.fail("id length %d exceeds limit %d", head>>itemShift, MaxIDBytesLimit)
			return
		}
		it.ID = d.raw(int(head >> itemShift))
		if head&itemExtras == 0 {
			it.Token = token
			if d.err != nil {
				return
			}
			continue
		}
		flags := d.byte()
		if d.err != nil {
			return
		}
		if flags == 0 || flags&^itemFlags != 0 {
			d.fail("bad item flags %#x", flags)
			return
		}
		if j == 0 && flags&itemOwnToken != 0 {
			d.fail("first item carries its own token")
			return
		}
		if flags&itemDigest != 0 {
			if it.Digest = d.bytes(MaxDigestBytes); it.Digest == nil && d.err == nil {
				d.fail("empty digest flagged")
			}
		}
		if flags&itemOwnToken != 0 {
			it.Token = d.bytes(MaxTokenBytes)
			if d.err == nil && bytes.Equal(it.Token, token) {
				d.fail("own token equal to the op's")
			}
		} else {
			it.Token = token
		}
		if flags&itemFence != 0 {
			if it.Fence = d.uvarint(); it.Fence == 0 && d.err == nil {
				d.fail("zero fence flagged")
			}
		}
		if d.err != nil {
			return
		}
	}
}

// itemsV1 reads an op's items in format version 1: id, digest, token and
// fence for every item. The tokens of Commit, Renew and Release items are
// dropped: builds of that format applied them by fence alone, whatever
// token they carried, and apply checks a lease item's token against the
// holder's, so keeping them would change what those entries did.
func (d *decoder) itemsV1(op *Op) {
	nitems := d.count(4)
	if d.err != nil || nitems == 0 {
		return
	}
	leaseOp := op.Kind == OpCommit || op.Kind == OpRenew || op.Kind == OpRelease
	op.Items = make([]Item, nitems)
	for j := range op.Items {
		it := &op.Items[j]
		it.ID = d.bytes(MaxIDBytesLimit)
		it.Digest = d.bytes(MaxDigestBytes)
		it.Token = d.bytes(MaxTokenBytes)
		it.Fence = d.uvarint()
		if leaseOp {
			it.Token = nil
		}
	}
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

// raw reads n bytes (nil for 0).
func (d *decoder) raw(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.buf) {
		d.fail("length %d exceeds remaining %d bytes", n, len(d.buf))
		return nil
	}
	if n == 0 {
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
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
