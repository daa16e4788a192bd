package cluster

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestHCLogAdapter_RoutesWarnAndAboveIntoSlog(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), hclog.Warn, nil)
	l.Debug("chatter")
	l.Info("entering follower state")
	l.Named("raft").With("peer", "n2").Warn("heartbeat failed", "err", "timeout")
	l.Error("boom")
	l.StandardLogger(nil).Print("[ERR] from std logger")
	out := buf.String()
	for _, want := range []string{"heartbeat failed", "raft_logger=raft", "peer=n2", "err=timeout", "boom", "from std logger"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"chatter", "entering follower state"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output has %q below WARN:\n%s", unwanted, out)
		}
	}
	if l.IsInfo() || !l.IsWarn() {
		t.Fatal("level predicates")
	}
}

func TestHCLogAdapter_ConnectionsCutByShutdownAreDebug(t *testing.T) {
	var buf bytes.Buffer
	var stopping atomic.Bool
	l := newHCLogger(slog.New(slog.NewTextHandler(&buf, nil)), hclog.Warn, &stopping)
	l.Error("failed to decode incoming command", "error", errors.New("read tcp 127.0.0.1:7000->127.0.0.1:46404: use of closed network connection"))
	l.Error("failed to decode incoming command", "error", "read tcp 127.0.0.1:7000->127.0.0.1:1: read: connection reset by peer")
	l.Error("failed to appendEntries to", "peer", "n2", "error", io.EOF)
	if out := buf.String(); strings.Contains(out, "use of closed") || !strings.Contains(out, "connection reset by peer") || !strings.Contains(out, "appendEntries") {
		t.Fatalf("before shutdown: a connection this node closed is DEBUG, a peer's reset or EOF is not:\n%s", out)
	}
	buf.Reset()
	stopping.Store(true)
	l.Error("failed to decode incoming command", "error", "read: connection reset by peer")
	l.Warn("failed to heartbeat to", "peer", "n3", "error", io.EOF)
	l.Error("failed to take snapshot", "error", errors.New("disk full"))
	if out := buf.String(); strings.Contains(out, "reset") || strings.Contains(out, "heartbeat") || !strings.Contains(out, "disk full") {
		t.Fatalf("while stopping: connection noise is DEBUG, other errors are not:\n%s", out)
	}
}

// raft's once-per-round-trip warnings are logged once per second per
// message, the next line saying how many were dropped; other messages
// are not limited. A leader walking back a follower's nextIndex logged
// 80,000 "appendEntries rejected, sending older logs" in 37 s.
func TestHCLogAdapter_RepeatedRaftWarningsOncePerSecond(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLogger(slog.New(slog.NewTextHandler(&buf, nil)), hclog.Warn, nil)
	clock := time.Unix(1_800_000_000, 0)
	l.(*hclogAdapter).repeats.now = func() time.Time { return clock }
	peer := l.Named("raft").With("peer", "n6") // copies share the limiter
	for i := range 10_000 {
		peer.Warn("appendEntries rejected, sending older logs", "next", 234_331-i)
		l.Warn("failed to get previous log", "previous-index", 234_330-i)
	}
	l.Error("failed to take snapshot", "error", "disk full")
	l.Error("failed to take snapshot", "error", "disk full")
	if got := strings.Count(buf.String(), "sending older logs"); got != 1 {
		t.Fatalf("%d lines of a warning repeated 10,000 times within a second, want 1:\n%.2000s", got, buf.String())
	}
	if got := strings.Count(buf.String(), "failed to get previous log"); got != 1 {
		t.Fatalf("%d lines of the follower's warning, want 1", got)
	}
	if got := strings.Count(buf.String(), "failed to take snapshot"); got != 2 {
		t.Fatalf("%d lines of a message not in the list, want both", got)
	}
	buf.Reset()
	clock = clock.Add(time.Second)
	peer.Warn("appendEntries rejected, sending older logs", "next", 1)
	if out := buf.String(); !strings.Contains(out, "repeated=9999") || !strings.Contains(out, "peer=n6") {
		t.Fatalf("a second later: %q, want the line with repeated=9999", out)
	}
}
