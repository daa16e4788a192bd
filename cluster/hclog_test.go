package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestHCLogAdapter_RoutesWarnAndAboveIntoSlog(t *testing.T) {
	var buf bytes.Buffer
	l := newHCLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), hclog.Warn)
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
