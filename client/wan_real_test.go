package client_test

// How many requests a call from a region far from the leader sends across
// the WAN. Each one is a round trip of 100 ms or more there, so the count
// is the latency: a call that sends two costs twice its floor. The test
// counts the requests themselves (gRPC messages written on the connections
// that cross regions), not their time.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/server"
)

// wanLinks are the connections made by the dialers a test hands out: they
// replace the client's dialer, or a node's dialer to its peers, as
// `dedupnode wan-sim` routes a region's connections to another region's
// nodes through its delaying proxy. Every gRPC request message written on
// them is recorded by link (dialer and address) with its method: a unary
// call is one message, a call on an open stream (the Pipeline, the
// Batcher's transport) one message on it.
type wanLinks struct {
	mu   sync.Mutex
	sent map[wanLink][]string
	err  error // a byte stream that was not HTTP/2
}

type wanLink struct{ from, to string }

func (l wanLink) String() string { return l.from + "->" + l.to }

func newWANLinks() *wanLinks { return &wanLinks{sent: map[wanLink][]string{}} }

// dialer is side from's dialer (a client's, or a node's to its peers).
func (w *wanLinks) dialer(from string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		link := wanLink{from, addr}
		return &countedConn{Conn: c, req: newH2Requests(func(method string) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.sent[link] = append(w.sent[link], method)
		}, func(err error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.err = err
		})}, nil
	})
}

// reset forgets what was sent so far.
func (w *wanLinks) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.sent)
}

// to returns what was sent to addr since the last reset, by link.
func (w *wanLinks) to(t *testing.T, addr string) map[string][]string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatalf("reading a link: %v", w.err)
	}
	out := map[string][]string{}
	for l, v := range w.sent {
		if l.to == addr {
			out[l.String()] = slices.Clone(v)
		}
	}
	return out
}

// countedConn reads what it writes as HTTP/2 before it sends it, so that a
// request is recorded before its answer can come back.
type countedConn struct {
	net.Conn
	mu  sync.Mutex
	req *h2Requests
}

func (c *countedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.req.feed(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// h2Requests reads a gRPC client's side of an HTTP/2 connection (RFC 9113:
// the preface, then frames) and reports each request message with the
// method of its stream.
type h2Requests struct {
	buf      []byte
	preface  bool
	dec      *hpack.Decoder
	path     string // :path of the header block being decoded
	streams  map[uint32]*h2Stream
	message  func(method string)
	failed   func(error)
	broken   bool
	inHeader uint32 // stream of the header block under way (CONTINUATION)
}

type h2Stream struct {
	method string
	prefix []byte // of the message being read: gRPC's 5-byte length prefix
	left   uint32 // bytes of the current message still to come
}

func newH2Requests(message func(string), failed func(error)) *h2Requests {
	r := &h2Requests{streams: map[uint32]*h2Stream{}, message: message, failed: failed}
	r.dec = hpack.NewDecoder(1<<16, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			r.path = f.Value
		}
	})
	return r
}

const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2Continuation = 0x9

	h2EndStream  = 0x1
	h2EndHeaders = 0x4
	h2Padded     = 0x8
	h2Priority   = 0x20
)

func (r *h2Requests) fail(err error) {
	r.broken = true
	r.failed(err)
}

func (r *h2Requests) feed(b []byte) {
	if r.broken {
		return
	}
	r.buf = append(r.buf, b...)
	if !r.preface {
		const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
		if len(r.buf) < len(preface) {
			return
		}
		if string(r.buf[:len(preface)]) != preface {
			r.fail(fmt.Errorf("no HTTP/2 client preface: %q", r.buf[:len(preface)]))
			return
		}
		r.buf, r.preface = r.buf[len(preface):], true
	}
	for len(r.buf) >= 9 {
		n := int(r.buf[0])<<16 | int(r.buf[1])<<8 | int(r.buf[2])
		if len(r.buf) < 9+n {
			break
		}
		typ, flags := r.buf[3], r.buf[4]
		stream := binary.BigEndian.Uint32(r.buf[5:9]) & (1<<31 - 1)
		r.frame(typ, flags, stream, r.buf[9:9+n])
		if r.broken {
			return
		}
		r.buf = r.buf[9+n:]
	}
	r.buf = slices.Clone(r.buf)
}

func (r *h2Requests) frame(typ, flags byte, stream uint32, p []byte) {
	if typ == h2Data || typ == h2Headers {
		if flags&h2Padded != 0 {
			if len(p) < 1 || int(p[0]) > len(p)-1 {
				r.fail(fmt.Errorf("bad padding in frame type %d", typ))
				return
			}
			p = p[1 : len(p)-int(p[0])]
		}
	}
	switch typ {
	case h2Headers:
		if flags&h2Priority != 0 {
			if len(p) < 5 {
				r.fail(fmt.Errorf("short HEADERS frame"))
				return
			}
			p = p[5:]
		}
		r.path, r.inHeader = "", stream
		r.headerBlock(flags, p)
	case h2Continuation:
		if stream != r.inHeader {
			r.fail(fmt.Errorf("CONTINUATION on stream %d inside stream %d's header block", stream, r.inHeader))
			return
		}
		r.headerBlock(flags, p)
	case h2Data:
		s := r.streams[stream]
		if s == nil {
			r.fail(fmt.Errorf("DATA on stream %d before its HEADERS", stream))
			return
		}
		for len(p) > 0 {
			if s.left == 0 {
				k := min(5-len(s.prefix), len(p))
				s.prefix, p = append(s.prefix, p[:k]...), p[k:]
				if len(s.prefix) < 5 {
					break
				}
				r.message(s.method)
				s.left, s.prefix = binary.BigEndian.Uint32(s.prefix[1:]), s.prefix[:0]
				continue
			}
			k := min(int(s.left), len(p))
			s.left -= uint32(k)
			p = p[k:]
		}
	}
	if typ == h2Data && flags&h2EndStream != 0 {
		delete(r.streams, stream)
	}
}

// headerBlock decodes a fragment of a header block; at its end, a stream
// not seen before is a new request.
func (r *h2Requests) headerBlock(flags byte, p []byte) {
	if _, err := r.dec.Write(p); err != nil {
		r.fail(fmt.Errorf("HPACK: %w", err))
		return
	}
	if flags&h2EndHeaders == 0 {
		return
	}
	if err := r.dec.Close(); err != nil {
		r.fail(fmt.Errorf("HPACK: %w", err))
		return
	}
	if _, ok := r.streams[r.inHeader]; !ok && flags&h2EndStream == 0 {
		r.streams[r.inHeader] = &h2Stream{method: r.path}
	}
}

// A call from a region far from the leader crosses the WAN once: a mark or
// a linearizable check sent to the leader (the way wan-sim's bench sends
// them, through a dialer that routes the connection through its proxy),
// one request on the client's link to the leader, whether a single attempt
// (MarkAt, CheckAt), a routed call, or a Batcher batch on its stream; sent
// to the region's own node instead, one request on that node's link to the
// leader (the forwarded mark, the read index). Only a client's first call
// to a node on a new connection may ask the node's Status first (the
// cluster check). The leader's region is the leader's address: whatever
// is sent to it crosses the WAN.
func TestRemoteCallsCrossTheWANOnce(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	links := newWANLinks()
	nodes, _ := startNodes(t, 3, func(cfg *server.Config) {
		cfg.DialOptions = append(cfg.DialOptions, links.dialer(cfg.Cluster.NodeID))
	})
	// What crossed says nothing about the client when an election (on
	// loaded cores) moved the leadership meanwhile: then the run is
	// repeated with fresh clients, at most 5 times.
	for try := 1; ; try++ {
		leader, term := leaderOf(t, ctx, nodes)
		errs := crossOnce(t, ctx, links, nodes, leader)
		if l, tm := leaderOf(t, ctx, nodes); l == leader && tm == term {
			for _, err := range errs {
				t.Error(err)
			}
			return
		}
		if try == 5 {
			t.Fatalf("the leadership moved during each of %d runs", try)
		}
		t.Logf("run %d: the leadership moved; again", try)
	}
}

// leaderOf waits until a node leads and every node knows it; it returns
// that node and its term.
func leaderOf(t *testing.T, ctx context.Context, nodes []*realNode) (*realNode, uint64) {
	t.Helper()
	for {
		var leader *realNode
		var term uint64
		agree := true
		for _, nd := range nodes {
			st, err := nd.srv.Status(ctx, &dedupv1.StatusRequest{})
			if err != nil || st.GetLeaderId() == "" || (term != 0 && st.GetTerm() != term) {
				agree = false
				break
			}
			term = st.GetTerm()
			for _, l := range nodes {
				if l.id == st.GetLeaderId() {
					leader = l
				}
			}
		}
		if agree && leader != nil {
			return leader, term
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no leader known to every node: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// crossOnce runs the calls of TestRemoteCallsCrossTheWANOnce with leader
// as the leader and returns what went wrong.
func crossOnce(t *testing.T, ctx context.Context, links *wanLinks, nodes []*realNode, leader *realNode) []error {
	var local *realNode // the caller's region's node
	for _, nd := range nodes {
		if nd != leader {
			local = nd
		}
	}
	const (
		mark      = dedupv1.Dedup_Mark_FullMethodName
		check     = dedupv1.Dedup_Check_FullMethodName
		stream    = dedupv1.Dedup_Stream_FullMethodName
		readIndex = dedupv1.Internal_ReadIndex_FullMethodName
	)
	fromClient := wanLink{"client", leader.addr}.String()
	fromLocal := wanLink{local.id, leader.addr}.String()
	var errs []error
	n := 0
	id := func() []byte { n++; return fmt.Appendf(nil, "wan-%d", n) }
	// expect runs call three times after a first one (which may open a
	// connection), and wants exactly want sent to the leader each time.
	expect := func(what string, want map[string][]string, call func() error) {
		for i := range 4 {
			links.reset()
			if err := call(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
				return
			}
			if got := links.to(t, leader.addr); i > 0 && !equalCrossed(got, want) {
				errs = append(errs, fmt.Errorf("%s, call %d: sent across the WAN %v, want %v", what, i+1, got, want))
			}
		}
	}

	// As wan-sim's bench: one attempt to the leader, through the region's
	// dialer.
	pinned := newClient(t, []string{leader.addr}, client.WithPinnedNode(), client.WithDialOptions(links.dialer("client")))
	expect("MarkAt the leader", map[string][]string{fromClient: {mark}}, func() error {
		_, err := pinned.MarkAt(ctx, leader.addr, "ns", []client.Item{{ID: id()}}, time.Minute, client.NewRequestToken())
		return err
	})
	expect("linearizable CheckAt the leader", map[string][]string{fromClient: {check}}, func() error {
		_, err := pinned.CheckAt(ctx, leader.addr, "ns", [][]byte{id()}, client.Linearizable)
		return err
	})

	// A routed client that knows its region's node and finds the leader.
	routed := newClient(t, []string{local.addr}, client.WithDialOptions(links.dialer("client")))
	expect("routed Mark", map[string][]string{fromClient: {mark}}, func() error {
		_, err := routed.Mark(ctx, "ns", []client.Item{{ID: id()}}, time.Minute)
		return err
	})
	expect("routed linearizable Check", map[string][]string{fromClient: {check}}, func() error {
		_, err := routed.Check(ctx, "ns", [][]byte{id()}, client.Linearizable)
		return err
	})
	b := routed.NewBatcher(client.WithBatchTransport(client.TransportStream))
	defer b.Close()
	expect("Batcher Mark on its stream", map[string][]string{fromClient: {stream}}, func() error {
		_, err := b.Mark(ctx, "ns", client.Item{ID: id()}, time.Minute)
		return err
	})

	// Sent to the region's own node, which forwards to the leader.
	near := newClient(t, []string{local.addr}, client.WithPinnedNode(), client.WithDialOptions(links.dialer("client")))
	expect("MarkAt the region's node", map[string][]string{fromLocal: {mark}}, func() error {
		_, err := near.MarkAt(ctx, local.addr, "ns", []client.Item{{ID: id()}}, time.Minute, client.NewRequestToken())
		return err
	})
	expect("linearizable CheckAt the region's node", map[string][]string{fromLocal: {readIndex}}, func() error {
		_, err := near.CheckAt(ctx, local.addr, "ns", [][]byte{id()}, client.Linearizable)
		return err
	})
	return errs
}

func equalCrossed(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// With a dialer of the caller's own (WithDialOptions), the client still
// knows a connection was up when a write left: a write whose reply was lost
// after the node applied it fails with ErrOutcomeUnknown, as with the
// client's dialer, not as a write that never left.
func TestOwnDialerLostReplyIsOutcomeUnknown(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	n := startSingle(t, nil)
	links := newWANLinks()
	c := newClient(t, []string{n.addr}, client.WithPinnedNode(), client.WithDialOptions(links.dialer("client")))
	if _, err := c.MarkAt(ctx, n.addr, "ns", items("first"), time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	n.faults.DropReplies(markMethod, 1)
	_, err := c.MarkAt(ctx, n.addr, "ns", items("lost"), time.Minute, client.NewRequestToken())
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("mark whose reply was lost after the apply: %v, want outcome unknown", err)
	}
}
