package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupnode/dedupnode/internal/testcluster"
	"github.com/dedupnode/dedupnode/server"
)

// lostReplies makes a real node apply client writes and then lose their
// replies (answering Unavailable instead) while on: the client sees an
// applied write whose outcome it cannot know. Every reply a client gets
// otherwise is the real server's.
type lostReplies struct {
	mu sync.Mutex
	on map[string]bool // full gRPC method -> drop its replies
}

func (l *lostReplies) set(method string, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on[method] = on
}

func (l *lostReplies) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	l.mu.Lock()
	drop := l.on[info.FullMethod]
	l.mu.Unlock()
	resp, err := h(ctx, req)
	if drop {
		return nil, status.Errorf(codes.Unavailable, "test fault: reply lost after handling (handler error: %v)", err)
	}
	return resp, err
}

// startNode starts one real node (Raft, Pebble, gRPC on a loopback port
// from :0) that creates namespaces on first use, and returns its gRPC
// address and its reply dropper.
func startNode(t *testing.T) (string, *lostReplies) {
	t.Helper()
	l := &lostReplies{on: map[string]bool{}}
	srvs, _ := testcluster.Start(t, 1, func(_ int, cfg *server.Config) {
		cfg.AutoCreateNamespaces = true
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainUnaryInterceptor(l.intercept))
	})
	return srvs[0].GRPCAddr(), l
}

// IDs holding a tab or a newline would break the tab-separated lines: the
// text output quotes them (as strconv.Quote does) and only them, every
// command that prints IDs alike; JSON keeps every ID, invalid UTF-8 too.
func TestTextOutputQuotesAmbiguousIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node")
	}
	addr, _ := startNode(t)
	ctx := context.Background()
	ids := []string{"a\tb", "line1\nline2", `"quoted"`, "plain id", "caf\u00e9", "bad\xffutf8"}
	want := []string{`"a\tb"`, `"line1\nline2"`, `"\"quoted\""`, "plain id", "caf\u00e9", `"bad\xffutf8"`}
	for _, cmd := range [][]string{{"mark"}, {"check"}, {"claim"}, {"forget"}} {
		args := append(append(cmd, "--addr", addr, "-n", "quoting"), ids...)
		code, out, errs := runCLI(t, ctx, "", args...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", cmd[0], code, errs)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != len(ids) {
			t.Fatalf("%s printed %d lines for %d IDs: %q", cmd[0], len(lines), len(ids), out)
		}
		for i, l := range lines {
			f := strings.Split(l, "\t")
			if f[0] != want[i] {
				t.Errorf("%s: ID field %q, want %q (line %q)", cmd[0], f[0], want[i], l)
			}
			if got, err := strconv.Unquote(f[0]); err == nil && got != ids[i] {
				t.Errorf("%s: %q unquotes to %q, want %q", cmd[0], f[0], got, ids[i])
			}
		}
	}
	// Leases: commit, renew and release print the ID alike.
	code, out, errs := runCLI(t, ctx, "", "claim", "--addr", addr, "-n", "quoting", "--output", "json", "x\ty")
	var cl struct {
		Lease string `json:"lease"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &cl) != nil || cl.Lease == "" {
		t.Fatalf("claim: exit %d %q %s", code, out, errs)
	}
	for _, cmd := range []string{"renew", "commit", "release"} {
		code, out, errs := runCLI(t, ctx, "", cmd, "--addr", addr, "-n", "quoting", "x\ty="+cl.Lease)
		if code != exitOK || !strings.HasPrefix(out, `"x\ty"`+"\t") || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: exit %d, out %q, err %s; want one line starting with the quoted ID", cmd, code, out, errs)
		}
	}

	code, out, errs = runCLI(t, ctx, "", append([]string{"check", "--addr", addr, "-n", "quoting", "--output", "json"}, ids...)...)
	if code != exitOK {
		t.Fatalf("check json: exit %d: %s", code, errs)
	}
	for i, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var j struct {
			ID    string `json:"id"`
			IDB64 string `json:"id_b64"`
		}
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		got := j.ID
		if j.IDB64 != "" {
			b, err := base64.StdEncoding.DecodeString(j.IDB64)
			if err != nil || j.ID != "" {
				t.Fatalf("line %q: id_b64 %v, with id %q", l, err, j.ID)
			}
			got = string(b)
		}
		if got != ids[i] {
			t.Errorf("json line %q gives ID %q, want %q", l, got, ids[i])
		}
	}
}
