package cluster

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

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
