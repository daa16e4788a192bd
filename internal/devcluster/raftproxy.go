package devcluster

import (
	"io"
	"net"
	"sync"
	"time"
)

// raftProxy forwards TCP to a node's Raft listener; pause drops every
// connection and refuses new ones until resume (Cluster.Cut, Heal).
type raftProxy struct {
	ln     net.Listener
	target string
	once   sync.Once
	wg     sync.WaitGroup

	mu     sync.Mutex
	paused bool
	conns  map[net.Conn]struct{}
}

func newRaftProxy(target string) (*raftProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &raftProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *raftProxy) addr() string { return p.ln.Addr().String() }

func (p *raftProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.paused {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil { // the node is down: as if it refused
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
		p.mu.Unlock()
	}
}

func (p *raftProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *raftProxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for c := range p.conns {
		c.Close()
	}
}

func (p *raftProxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

// close stops the proxy and waits for its goroutines. Safe to call twice.
func (p *raftProxy) close() {
	p.once.Do(func() {
		p.ln.Close()
		p.pause()
		p.wg.Wait()
	})
}
