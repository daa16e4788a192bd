package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// TestExportImportKeepsEveryState: issue 12 input 4. Export → import into a
// fresh cluster keeps every state a record can be in, in a fixed and a
// sliding namespace: committed (with digest and request token), a live
// lease (imported as a lease until its lease expiry: a redelivery gets
// in_progress, never duplicate), an expired lease and a released lease
// (both absent: the next claim wins). The import also raises the fencing
// epoch, so tokens granted after it exceed the source's (input 5).
func TestExportImportKeepsEveryState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srcAddr := startDev(t, "--nodes", "1")
	dstAddr := startDev(t, "--nodes", "1")
	src := testcluster.Client(t, strings.Split(srcAddr, ","))
	dst := testcluster.Client(t, strings.Split(dstAddr, ","))
	for _, c := range []*client.Client{src, dst} {
		for _, mode := range []client.ExpiryMode{client.ExpiryFixed, client.ExpirySliding} {
			ns := client.Namespace{Name: "ns-" + mode.String(), DefaultTTL: time.Hour, MaxTTL: 24 * time.Hour, Mode: mode}
			if _, err := c.CreateNamespace(ctx, ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	one := func(res []client.Result, err error) client.Result {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	item := func(id, digest, token string) client.Item {
		return client.Item{ID: []byte(id), Digest: []byte(digest), RequestToken: []byte(token)}
	}

	type source struct{ committed, leased client.Record }
	srcRecs := map[string]source{}
	for _, ns := range []string{"ns-fixed", "ns-sliding"} {
		var s source
		c := one(src.Mark(ctx, ns, []client.Item{item("committed", "dig-c", "tok-c")}, 2*time.Hour))
		s.committed = *c.Record
		l := one(src.Claim(ctx, ns, []client.Item{item("leased", "dig-l", "tok-l")}, 5*time.Minute))
		if l.Code != client.CodeAcquired {
			t.Fatalf("claim: %v", l.Code)
		}
		s.leased = *l.Record
		r := one(src.Claim(ctx, ns, []client.Item{item("released", "dig-r", "tok-r")}, 5*time.Minute))
		if rel := one(src.Release(ctx, ns, []client.Lease{{ID: []byte("released"), FencingToken: r.Record.FencingToken, RequestToken: []byte("tok-r")}})); rel.Code != client.CodeOK {
			t.Fatalf("release: %v", rel.Code)
		}
		one(src.Claim(ctx, ns, []client.Item{item("lease-expired", "", "tok-e")}, time.Second))
		srcRecs[ns] = s
	}
	testcluster.WaitFor(t, 30*time.Second, "the 1 s leases to expire", func() bool {
		for _, ns := range []string{"ns-fixed", "ns-sliding"} {
			if one(src.Check(ctx, ns, [][]byte{[]byte("lease-expired")}, client.Linearizable)).Code != client.CodeNotSeen {
				return false
			}
		}
		return true
	})

	dir := t.TempDir()
	for _, ns := range []string{"ns-fixed", "ns-sliding"} {
		file := filepath.Join(dir, ns+".ndjson")
		code, _, errb := runCLI(t, ctx, "", "export", "--addr", srcAddr, "--namespace", ns, "--out", file)
		if code != 0 || !strings.Contains(errb, "exported 2 IDs of namespace "+ns) || !strings.Contains(errb, "(1 leased)") ||
			!strings.Contains(errb, "1 expired, 1 released leases") {
			t.Fatalf("export %s: exit %d: %s", ns, code, errb)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		var lines []map[string]any
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("export line %q: %v", sc.Text(), err)
			}
			lines = append(lines, m)
		}
		if len(lines) != 3 || lines[0]["dedupnode_export"] != 1.0 || lines[0]["fence_epoch"] != 0.0 {
			t.Fatalf("export of %s:\n%s", ns, data)
		}
		for _, l := range lines[1:] {
			if l["id"] == "leased" && (l["state"] != "leased" || l["expires_unix_ms"] != float64(srcRecs[ns].leased.Expires.UnixMilli()) || l["fence"] == nil) {
				t.Fatalf("leased line %v", l)
			}
			if l["id"] == "committed" && (l["state"] != "committed" || l["digest_b64"] != "ZGlnLWM=" || l["token_b64"] != "dG9rLWM=") {
				t.Fatalf("committed line %v", l)
			}
		}
		code, out, errb := runCLI(t, ctx, "", "import", "--addr", dstAddr, "--namespace", ns, file)
		if code != 0 || !strings.Contains(out, "imported 2 IDs into "+ns+": 1 new, 0 duplicate, 0 conflict, 1 leased") || !strings.Contains(out, "fencing epoch 1") {
			t.Fatalf("import %s: exit %d\n%s%s", ns, code, out, errb)
		}
	}

	// The source goes on granting fencing tokens after the export.
	var srcMax uint64
	for i := range 20 {
		r := one(src.Claim(ctx, "ns-fixed", []client.Item{{ID: fmt.Appendf(nil, "later-%d", i)}}, time.Minute))
		srcMax = max(srcMax, r.Record.FencingToken)
	}

	for _, ns := range []string{"ns-fixed", "ns-sliding"} {
		s := srcRecs[ns]
		// Committed: duplicate for another caller, with digest and token;
		// a retry of the call that recorded it still answers new.
		c := one(dst.Claim(ctx, ns, []client.Item{item("committed", "dig-c", "other")}, time.Minute))
		if c.Code != client.CodeDuplicate || c.Record.State != client.StateCommitted || string(c.Record.Digest) != "dig-c" || string(c.Record.RequestToken) != "tok-c" {
			t.Fatalf("%s: claim of the committed ID: %v %+v", ns, c.Code, c.Record)
		}
		if c.Record.Expires.Before(s.committed.Expires) || c.Record.Expires.After(s.committed.Expires.Add(2*time.Minute)) {
			t.Fatalf("%s: committed expiry %v, source %v (want no earlier, within the 1 min rounding)", ns, c.Record.Expires, s.committed.Expires)
		}
		if r := one(dst.Mark(ctx, ns, []client.Item{item("committed", "dig-other", "other")}, 0)); r.Code != client.CodeConflict {
			t.Fatalf("%s: mark with another digest: %v", ns, r.Code)
		}
		if r := one(dst.Mark(ctx, ns, []client.Item{item("committed", "dig-c", "tok-c")}, 0)); r.Code != client.CodeNew {
			t.Fatalf("%s: retry of the recording call: %v", ns, r.Code)
		}
		// Leased: in progress for a redelivery, until the source's lease
		// expiry (to the second); the holder's retried claim gets it with
		// a token above every source token.
		l := one(dst.Claim(ctx, ns, []client.Item{item("leased", "dig-l", "redelivery")}, time.Minute))
		if l.Code != client.CodeInProgress || l.Record.State != client.StateLeased || string(l.Record.Digest) != "dig-l" {
			t.Fatalf("%s: claim of the leased ID answers %v %+v, want in_progress", ns, l.Code, l.Record)
		}
		if l.Record.Expires.Before(s.leased.Expires) || l.Record.Expires.After(s.leased.Expires.Add(5*time.Second)) {
			t.Fatalf("%s: lease expiry %v, source %v", ns, l.Record.Expires, s.leased.Expires)
		}
		h := one(dst.Claim(ctx, ns, []client.Item{item("leased", "dig-l", "tok-l")}, time.Minute))
		if h.Code != client.CodeAcquired || h.Record.FencingToken <= srcMax || fsm.FenceEpochOf(h.Record.FencingToken) != 1 {
			t.Fatalf("%s: holder's retried claim: %v, token %#x, source's last %#x", ns, h.Code, h.Record.FencingToken, srcMax)
		}
		// Released and expired leases: absent, so the next claim wins.
		for _, id := range []string{"released", "lease-expired"} {
			if r := one(dst.Claim(ctx, ns, []client.Item{{ID: []byte(id)}}, time.Minute)); r.Code != client.CodeAcquired || r.Record.FencingToken <= srcMax {
				t.Fatalf("%s: claim of %s: %v", ns, id, r.Code)
			}
		}
	}
	ns, err := dst.DescribeNamespace(ctx, "ns-sliding")
	if err != nil || ns.Mode != client.ExpirySliding {
		t.Fatalf("sliding namespace: %+v %v", ns, err)
	}

	// Re-importing is harmless: the committed ID is a duplicate, the
	// lease's claim is retried with its token (no answer but its holder's
	// shows a lease's token, so import cannot tell it was imported).
	code, out, errb := runCLI(t, ctx, "", "import", "--addr", dstAddr, "--namespace", "ns-fixed", filepath.Join(dir, "ns-fixed.ndjson"))
	if code != 0 || !strings.Contains(out, "2 IDs into ns-fixed: 0 new, 1 duplicate, 0 conflict, 1 leased") || !strings.Contains(out, "fencing epoch 1") {
		t.Fatalf("second import: exit %d\n%s%s", code, out, errb)
	}
}
