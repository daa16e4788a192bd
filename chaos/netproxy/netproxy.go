// Package netproxy is a fault-injecting TCP proxy for the Raft traffic
// between dedupnode nodes running as local processes.
//
// # Placement
//
// Every node N binds its real Raft listener R_N, and the cluster's static
// peer list names a proxy address P_N for it instead (dedupnode accepts a
// peer-list address for itself that differs from the one it binds; it only
// logs a warning). So every Raft connection to N, from any peer, goes
// through N's proxy.
//
// # Knowing the sender
//
// One listener per destination cannot tell the senders apart by address:
// hashicorp/raft dials without binding a source address, so every
// connection comes from 127.0.0.1. The proxy instead reads the first RPC on
// each connection: hashicorp/raft's NetworkTransport opens every connection
// with one RPC type byte and a msgpack request whose embedded RPCHeader
// carries the sender's server ID. Connections are pooled per destination and
// never shared between senders, so the first header names the sender for
// the connection's whole life. A connection whose first bytes do not parse
// (not Raft, or a wire format we do not know) is labelled with the sender
// "?" and only destination-wide rules ("*" as sender) apply to it.
//
// # Faults
//
// Rules are per directed link (sender → receiver) and act on the bytes
// flowing that way in both kinds of connection (requests on connections the
// sender opened, responses on connections the receiver opened):
//
//   - Drop: a blackhole. Bytes are read and discarded; nothing answers. A
//     stream that lost bytes is corrupt, so it is closed when the rule is
//     lifted, and Raft reconnects. This gives full, one-way and asymmetric
//     partitions.
//   - Delay (+ Jitter): each chunk is held back, order preserved.
//   - ResetProb: each chunk closes the connection with this probability. A
//     TCP proxy cannot lose single packets (TCP would resend them); a reset
//     is the nearest honest thing: the sender loses the RPCs in flight and
//     redials.
//
// Only Raft traffic passes through the proxy. Client gRPC, and the gRPC
// between nodes (write forwarding, read index requests), go direct, so a
// "partition" here cuts consensus, as seen by nodes, while clients can still
// reach every node — the situation in which a stale leader or a minority
// must refuse to answer.
package netproxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// Any is the wildcard sender or receiver in a Rule's link.
const Any = "*"

// Unknown is the sender of a connection whose first RPC did not parse.
const Unknown = "?"

// Rule is the fault on one directed link. The zero Rule passes traffic.
type Rule struct {
	Drop      bool
	Delay     time.Duration
	Jitter    time.Duration
	ResetProb float64
}

func (r Rule) zero() bool { return r == Rule{} }

// String describes the rule for logs and fault records.
func (r Rule) String() string {
	switch {
	case r.zero():
		return "pass"
	case r.Drop:
		return "drop"
	}
	s := ""
	if r.Delay > 0 || r.Jitter > 0 {
		s = fmt.Sprintf("delay %v±%v", r.Delay, r.Jitter)
	}
	if r.ResetProb > 0 {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("reset %.1f%%", r.ResetProb*100)
	}
	return s
}

type link struct{ from, to string }

// Net is the set of proxies of one cluster and the rules between its nodes.
// All methods are safe for concurrent use.
type Net struct {
	log *slog.Logger

	mu      sync.Mutex
	proxies map[string]*proxy
	rules   map[link]Rule
	closed  bool
	stats   Stats
}

// Stats counts what the proxies saw.
type Stats struct {
	Conns      int64 // accepted connections
	Unknown    int64 // connections whose sender could not be read
	Dropped    int64 // bytes discarded by Drop rules
	Resets     int64 // connections closed by ResetProb
	Tainted    int64 // connections closed on heal because they lost bytes
	Forwarded  int64 // bytes forwarded
	DialErrors int64 // failed dials to the real listener
}

// New returns an empty Net. logger may be nil.
func New(logger *slog.Logger) *Net {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Net{log: logger, proxies: map[string]*proxy{}, rules: map[link]Rule{}}
}

// Add starts the proxy for node id, listening on listen (e.g.
// "127.0.0.1:0") and forwarding to target, the node's real Raft address.
// It returns the proxy's address, to be put in the peer list.
func (n *Net) Add(id, listen, target string) (string, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", fmt.Errorf("proxy for %s: %w", id, err)
	}
	p := &proxy{net: n, id: id, target: target, ln: ln, conns: map[*conn]struct{}{}}
	n.mu.Lock()
	if n.closed || n.proxies[id] != nil {
		n.mu.Unlock()
		ln.Close()
		return "", fmt.Errorf("proxy for %s: closed or already added", id)
	}
	n.proxies[id] = p
	n.mu.Unlock()
	p.wg.Add(1)
	go p.serve()
	return ln.Addr().String(), nil
}

// Set sets the rule for bytes flowing from → to (either may be Any). A
// zero rule removes it. Lifting a Drop closes the connections that lost
// bytes on that link.
func (n *Net) Set(from, to string, r Rule) {
	n.mu.Lock()
	old := n.rules[link{from, to}]
	if r.zero() {
		delete(n.rules, link{from, to})
	} else {
		n.rules[link{from, to}] = r
	}
	n.mu.Unlock()
	if old.Drop && !r.Drop {
		n.closeTainted()
	}
}

// Partition cuts every link between nodes of different groups, both ways.
// Nodes not named keep their links.
func (n *Net) Partition(groups ...[]string) {
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					n.Set(a, b, Rule{Drop: true})
				}
			}
		}
	}
}

// Heal removes every rule and closes the connections that lost bytes.
func (n *Net) Heal() {
	n.mu.Lock()
	n.rules = map[link]Rule{}
	n.mu.Unlock()
	n.closeTainted()
}

// Rules returns a copy of the current rules as "from->to" → rule.
func (n *Net) Rules() map[string]Rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]Rule, len(n.rules))
	for l, r := range n.rules {
		out[l.from+"->"+l.to] = r
	}
	return out
}

// Stats returns the counters so far.
func (n *Net) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Close stops every proxy and closes every connection.
func (n *Net) Close() error {
	n.mu.Lock()
	n.closed = true
	ps := n.proxies
	n.proxies = map[string]*proxy{}
	n.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
	return nil
}

// rule returns the rule for bytes from → to, most specific first.
func (n *Net) rule(from, to string) Rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range []link{{from, to}, {Any, to}, {from, Any}, {Any, Any}} {
		if r, ok := n.rules[l]; ok {
			return r
		}
	}
	return Rule{}
}

func (n *Net) count(fn func(*Stats)) {
	n.mu.Lock()
	fn(&n.stats)
	n.mu.Unlock()
}

func (n *Net) closeTainted() {
	n.mu.Lock()
	var victims []*conn
	for _, p := range n.proxies {
		p.mu.Lock()
		for c := range p.conns {
			if c.tainted.Load() {
				victims = append(victims, c)
			}
		}
		p.mu.Unlock()
	}
	n.stats.Tainted += int64(len(victims))
	n.mu.Unlock()
	for _, c := range victims {
		c.close()
	}
}

type proxy struct {
	net    *Net
	id     string
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[*conn]struct{}
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.net.count(func(s *Stats) { s.Conns++ })
		go p.handle(c)
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	cs := p.conns
	p.conns = map[*conn]struct{}{}
	p.mu.Unlock()
	for c := range cs {
		c.close()
	}
	p.wg.Wait()
}

// sniffTimeout bounds the wait for a connection's first RPC header.
const sniffTimeout = 10 * time.Second

func (p *proxy) handle(in net.Conn) {
	src, head := sniff(in)
	if src == Unknown {
		p.net.count(func(s *Stats) { s.Unknown++ })
	}
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.net.count(func(s *Stats) { s.DialErrors++ })
		in.Close()
		return
	}
	c := &conn{in: in, out: out, src: src, dst: p.id, proxy: p}
	p.mu.Lock()
	if p.conns == nil {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { c.pump(head, in, out, src, p.id); done <- struct{}{} }()
	go func() { c.pump(nil, out, in, p.id, src); done <- struct{}{} }()
	<-done
	c.close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// rpcHeader is the part of every hashicorp/raft request we read: the
// embedded RPCHeader's fields, inlined by msgpack.
type rpcHeader struct {
	ID   []byte
	Addr []byte
}

// sniff reads the first RPC of a Raft connection and returns the sender's
// server ID and every byte read so far (to be forwarded first).
func sniff(c net.Conn) (string, []byte) {
	var buf bytes.Buffer
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	defer c.SetReadDeadline(time.Time{})
	return SenderOf(io.TeeReader(c, &buf)), bufBytes(&buf)
}

func bufBytes(b *bytes.Buffer) []byte { return append([]byte(nil), b.Bytes()...) }

// SenderOf decodes the sender's server ID from the start of a Raft stream
// (one RPC type byte, then a msgpack request with an RPCHeader). It returns
// Unknown when the bytes do not parse.
func SenderOf(r io.Reader) string {
	br := bufio.NewReader(r)
	if _, err := br.ReadByte(); err != nil {
		return Unknown
	}
	var h rpcHeader
	if err := codec.NewDecoder(br, &codec.MsgpackHandle{}).Decode(&h); err != nil || len(h.ID) == 0 {
		return Unknown
	}
	return string(h.ID)
}

type conn struct {
	in, out  net.Conn
	src, dst string
	proxy    *proxy
	tainted  atomic.Bool
	once     sync.Once
}

func (c *conn) close() {
	c.once.Do(func() {
		c.in.Close()
		c.out.Close()
	})
}

type chunk struct {
	b   []byte
	due time.Time
}

// pump copies from r to w under the rule for from → to, re-read per chunk
// so that rule changes apply to open connections.
func (c *conn) pump(head []byte, r io.Reader, w io.Writer, from, to string) {
	n := c.proxy.net
	q := make(chan chunk, 256)
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := w.Write(ch.b); err != nil {
				c.close()
				for range q {
				}
				return
			}
			n.count(func(s *Stats) { s.Forwarded += int64(len(ch.b)) })
		}
	}()
	defer func() {
		close(q)
		<-wdone
	}()
	var last time.Time
	send := func(b []byte) bool {
		rule := n.rule(from, to)
		if rule.Drop {
			c.tainted.Store(true)
			n.count(func(s *Stats) { s.Dropped += int64(len(b)) })
			return true
		}
		if rule.ResetProb > 0 && rand.Float64() < rule.ResetProb {
			n.count(func(s *Stats) { s.Resets++ })
			c.close()
			return false
		}
		due := time.Now()
		if rule.Delay > 0 || rule.Jitter > 0 {
			d := rule.Delay
			if rule.Jitter > 0 {
				d += time.Duration(rand.Int64N(int64(rule.Jitter)))
			}
			due = due.Add(d)
		}
		if due.Before(last) {
			due = last // keep the stream in order
		}
		last = due
		q <- chunk{b: b, due: due}
		return true
	}
	if len(head) > 0 && !send(head) {
		return
	}
	for {
		b := make([]byte, 32<<10)
		k, err := r.Read(b)
		if k > 0 && !send(b[:k]) {
			return
		}
		if err != nil {
			return // EOF or error: handle closes both sides
		}
	}
}
