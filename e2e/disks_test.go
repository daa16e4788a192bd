package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
)

// Tests of issue 12's disk faults (inputs 1, 2, 3 and 7): real processes on
// real filesystems. The ones that mount need root; they skip with a
// message otherwise (CI runs as root).

// needRoot skips unless the test runs as root with the named tools.
func needRoot(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a filesystem for the data dir (CI runs as root)")
	}
	for _, tool := range append([]string{"mount", "umount"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
	}
}

func run(t *testing.T, name string, args ...string) error {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// mountTmpfs mounts a tmpfs of size bytes and unmounts it at cleanup
// (after the processes using it, which later cleanups kill first).
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := run(t, "umount", "-l", dir); err != nil {
			t.Logf("unmount: %v", err)
		}
	})
	return dir
}

// mountLoopExt4 makes an ext4 filesystem of size bytes in a file, mounts it
// through a loop device (fsfreeze needs a filesystem that can freeze;
// tmpfs cannot) and unmounts it at cleanup, thawing it first.
func mountLoopExt4(t *testing.T, size int64) string {
	t.Helper()
	base := t.TempDir()
	img, dir := filepath.Join(base, "fs.img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if err := run(t, "mkfs.ext4", "-q", "-F", img); err != nil {
		t.Skipf("cannot make an ext4 filesystem: %v", err)
	}
	if err := run(t, "mount", "-o", "loop", img, dir); err != nil {
		t.Skipf("cannot loop-mount: %v", err)
	}
	t.Cleanup(func() {
		_ = run(t, "fsfreeze", "-u", dir) // frozen if the test failed midway
		if err := run(t, "umount", dir); err != nil {
			t.Logf("unmount: %v", err)
		}
	})
	return dir
}

// dial opens a plain gRPC connection (the tests read codes and error
// details as they are on the wire).
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// errInfo returns the dedupnode ErrorInfo of a status error.
func errInfo(err error) *errdetails.ErrorInfo {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// waitUntil polls cond every 100 ms until it returns nil or within passes;
// it returns the last error.
func waitUntil(ctx context.Context, within time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", within, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func markItems(prefix string, n, size int) []*dedupv1.MarkItem {
	items := make([]*dedupv1.MarkItem, n)
	for i := range items {
		id := fmt.Sprintf("%s-%06d-", prefix, i)
		id += strings.Repeat("x", max(0, size-len(id)))
		items[i] = &dedupv1.MarkItem{Id: []byte(id)}
	}
	return items
}

func health(ctx context.Context, cc *grpc.ClientConn) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return 0, err
	}
	return r.Status, nil
}

func nodeStatus(ctx context.Context, cc *grpc.ClientConn) (*dedupv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return dedupv1.NewAdminClient(cc).Status(ctx, &dedupv1.StatusRequest{})
}

func httpGet(ctx context.Context, url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// fillFile writes zeros to path until it holds n bytes or the filesystem
// is full (n < 0: until full). It returns the bytes written.
func fillFile(t *testing.T, path string, n int64) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var done int64
	for n < 0 || done < n {
		chunk := buf
		if n >= 0 && n-done < int64(len(chunk)) {
			chunk = chunk[:n-done]
		}
		w, err := f.Write(chunk)
		done += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return done
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func noPanic(t *testing.T, c *cluster) {
	t.Helper()
	for _, n := range c.nodes {
		b, _ := os.ReadFile(n.logPath)
		if i := bytes.Index(b, []byte("panic:")); i >= 0 {
			t.Errorf("%s panicked:\n%s", n.id, b[i:min(len(b), i+3000)])
		}
	}
}

// Input 1: a node whose disk fills refuses writes with RESOURCE_EXHAUSTED
// naming the path and the free bytes before the disk is full, keeps
// answering reads, reports NOT_SERVING (gRPC health, /healthz, Status,
// metrics), survives the disk filling completely without panicking, and
// accepts writes again by itself once space is back, with every
// acknowledged ID there.
func TestDiskFull_RefusesWritesThenResumes(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	fs := mountTmpfs(t, 96<<20)
	ballast := filepath.Join(fs, "ballast")

	ports := freePorts(t, 3)
	cl := &cluster{t: t, bin: bin, args: []string{"--bootstrap"}}
	n := &node{id: "n1", raft: ports[0], grpc: ports[1], dir: filepath.Join(fs, "data"), logPath: filepath.Join(t.TempDir(), "n1.log")}
	cl.nodes = []*node{n}
	// The lowest --min-free-disk serve takes with 2 MiB memtables: the
	// apply reserve (8.2 MiB) and one 16 MiB Raft log segment, rounded up.
	const minFree = 32 << 20
	cl.start(n, "--admin-addr", ports[2], "--min-free-disk", "32MiB", "--fsm-memtable-size", "2MiB")
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	cc := dial(t, n.grpc)
	dc := dedupv1.NewDedupClient(cc)

	// Leave about 12 MiB above the threshold: marks of 200 IDs × 500 B
	// (the load) then fill it.
	if free := freeBytes(t, fs); free > minFree+12<<20 {
		fillFile(t, ballast, free-(minFree+12<<20))
	}
	var acked [][]byte
	var refused error
	for i := 0; refused == nil; i++ {
		if i > 2000 {
			t.Fatalf("no write refused after %d batches (%d IDs); free %d", i, len(acked), freeBytes(t, fs))
		}
		items := markItems(fmt.Sprintf("full%04d", i), 200, 500)
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := dc.Mark(cctx, &dedupv1.MarkRequest{Items: items})
		ccancel()
		switch {
		case err == nil:
			for _, it := range items {
				acked = append(acked, it.Id)
			}
		case status.Code(err) == codes.ResourceExhausted:
			refused = err
		default:
			cl.dumpLogs()
			t.Fatalf("batch %d: %v (want success or RESOURCE_EXHAUSTED)", i, err)
		}
	}
	free := freeBytes(t, fs)
	t.Logf("refused after %d acknowledged IDs with %d bytes free: %v", len(acked), free, refused)
	info := errInfo(refused)
	if info == nil || info.Reason != "DISK_FULL" || info.Metadata["path"] != n.dir || info.Metadata["free_bytes"] == "" {
		t.Fatalf("refusal details = %v, want reason DISK_FULL with path %s and free_bytes", info, n.dir)
	}
	if msg := status.Convert(refused).Message(); !strings.Contains(msg, n.dir) || !strings.Contains(msg, "free") {
		t.Fatalf("refusal message %q names neither the path nor the free space", msg)
	}
	if free < 4<<20 {
		t.Fatalf("writes were refused only with %d bytes free: not before the disk was full", free)
	}

	// While low: NOT_SERVING everywhere it is reported, reads answered.
	checkSeen := func(ctx context.Context) error {
		for lo := 0; lo < len(acked); lo += 2000 {
			ids := acked[lo:min(lo+2000, len(acked))]
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			r, err := dc.Check(cctx, &dedupv1.CheckRequest{Ids: ids})
			ccancel()
			if err != nil {
				return err
			}
			for i, res := range r.Results {
				if res.Code != dedupv1.CheckResult_SEEN {
					return fmt.Errorf("acknowledged ID %d (%.20s...) is %v", lo+i, ids[i], res.Code)
				}
			}
		}
		return nil
	}
	if err := checkSeen(ctx); err != nil {
		t.Fatalf("reads while the disk is low: %v", err)
	}
	notServing := func(ctx context.Context) error {
		if st, err := health(ctx, cc); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			return fmt.Errorf("grpc health %v, %v", st, err)
		}
		code, body, err := httpGet(ctx, "http://"+ports[2]+"/healthz")
		if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "disk") {
			return fmt.Errorf("/healthz %d %q %v", code, body, err)
		}
		st, err := nodeStatus(ctx, cc)
		if err != nil || st.Healthy || !st.GetDisk().GetWritesRefused() || !strings.Contains(st.HealthReason, "disk") {
			return fmt.Errorf("status healthy=%v reason=%q disk=%v err=%v", st.GetHealthy(), st.GetHealthReason(), st.GetDisk(), err)
		}
		_, metrics, err := httpGet(ctx, "http://"+ports[2]+"/metrics")
		if err != nil || !strings.Contains(metrics, "dedup_disk_writes_refused 1") || !strings.Contains(metrics, "dedup_disk_free_bytes ") ||
			!strings.Contains(metrics, `dedup_disk_used_bytes{part="fsm"}`) {
			return fmt.Errorf("metrics lack dedup_disk_writes_refused 1 / dedup_disk_free_bytes / dedup_disk_used_bytes: %v", err)
		}
		return nil
	}
	// Hold the disk low while the reports are read: a Pebble compaction or
	// a recycled WAL file can hand back a few MiB after the refusal, which
	// rightly ends it (writes resume by themselves) and would race the
	// checks below on a loaded machine.
	if free := freeBytes(t, fs); free > minFree/2 {
		fillFile(t, ballast, free-minFree/2)
	}
	if err := waitUntil(ctx, 30*time.Second, notServing); err != nil {
		t.Fatalf("while the disk is low: %v", err)
	}

	// Now fill the disk completely, as another program would: the node must
	// ride it out (no panic), pausing rather than failing.
	wrote := fillFile(t, ballast, -1)
	t.Logf("filled the remaining %d bytes: %d bytes free", wrote, freeBytes(t, fs))
	if err := waitUntil(ctx, 10*time.Second, func(ctx context.Context) error {
		st, err := nodeStatus(ctx, cc)
		if err != nil || !st.GetDisk().GetApplyPaused() {
			return fmt.Errorf("status disk=%v err=%v", st.GetDisk(), err)
		}
		return nil
	}); err != nil {
		t.Fatalf("disk full: %v", err)
	}
	if _, err := dc.Mark(ctx, &dedupv1.MarkRequest{Items: markItems("whilefull", 10, 100)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("mark on a full disk: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := checkSeen(ctx); err != nil {
		t.Fatalf("reads on a full disk: %v", err)
	}

	// Space back: writes resume by themselves.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	var resumed time.Time
	start := time.Now()
	if err := waitUntil(ctx, 30*time.Second, func(ctx context.Context) error {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		_, err := dc.Mark(cctx, &dedupv1.MarkRequest{Items: markItems("after", 200, 500)})
		if err == nil {
			resumed = time.Now()
		}
		return err
	}); err != nil {
		cl.dumpLogs()
		t.Fatalf("writes after space came back: %v", err)
	}
	t.Logf("writes resumed %v after space came back", resumed.Sub(start).Round(time.Millisecond))
	if err := waitUntil(ctx, 10*time.Second, func(ctx context.Context) error {
		if st, err := health(ctx, cc); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("grpc health %v, %v", st, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := checkSeen(ctx); err != nil {
		t.Fatalf("after space came back: %v", err)
	}
	noPanic(t, cl)
}

// leaderOf asks addr's node for the leader it knows.
func leaderOf(ctx context.Context, cc *grpc.ClientConn) string {
	st, err := nodeStatus(ctx, cc)
	if err != nil {
		return ""
	}
	return st.LeaderId
}

// makeLeader transfers leadership to id (from whichever node leads).
func makeLeader(t *testing.T, ctx context.Context, c *cluster, conns map[string]*grpc.ClientConn, id string) {
	t.Helper()
	if err := waitUntil(ctx, 60*time.Second, func(ctx context.Context) error {
		lid := leaderOf(ctx, conns[c.nodes[0].id])
		if lid == id {
			st, err := nodeStatus(ctx, conns[id])
			if err == nil && st.State == "leader" && st.Healthy {
				return nil
			}
			return fmt.Errorf("%s leads but is not ready: %v", id, err)
		}
		if lid == "" {
			return errors.New("no leader")
		}
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := dedupv1.NewAdminClient(conns[lid]).TransferLeadership(tctx, &dedupv1.TransferLeadershipRequest{NodeId: id})
		return fmt.Errorf("transfer from %s to %s: %v", lid, id, err)
	}); err != nil {
		c.dumpLogs()
		t.Fatal(err)
	}
}

// Documented bound (docs/OPERATIONS.md, Disks): a leader whose log store
// stalls loses leadership within --raft-log-stall-timeout + 2 × heartbeat
// timeout + election timeout + 1 s (hashicorp/raft's defaults: 1 s each).
func stallBound(stall time.Duration) time.Duration {
	return stall + 2*time.Second + time.Second + time.Second
}

// Input 2: the leader's filesystem is frozen (fsfreeze), so its Raft log
// writes hang without an error. A new leader must be elected within the
// documented bound, writes resume on the others, every client call returns
// once its deadline has passed (none hangs on the frozen disk), and the
// frozen node catches up after the thaw without a restart.
func TestStalledLeaderDisk_NewLeaderWithinBound(t *testing.T) {
	needRoot(t, "fsfreeze", "mkfs.ext4")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	fs := mountLoopExt4(t, 96<<20)
	cl := newPeersCluster(t, bin, 3)
	n1 := cl.nodes[0]
	n1.dir = filepath.Join(fs, "n1")
	const stall = time.Second
	for _, n := range cl.nodes {
		// --min-free-disk is fixed: the auto threshold (64 MiB + 2 × the
		// store) is above what a 96 MiB ext4 has left once formatted, and
		// this test is about a stalled disk, not a full one.
		cl.start(n, "--raft-log-stall-timeout", stall.String(), "--fsm-memtable-size", "4MiB", "--min-free-disk", "32MiB")
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := run(t, "fsfreeze", "-u", fs); err != nil {
				t.Errorf("thaw: %v", err)
			}
		}
	}
	t.Cleanup(thaw) // before the processes are killed: a frozen writer cannot die
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	conns := map[string]*grpc.ClientConn{}
	for _, n := range cl.nodes {
		conns[n.id] = dial(t, n.grpc)
	}
	makeLeader(t, ctx, cl, conns, "n1")

	// Steady writes through n2 and n3 (forwarded to the leader), each call
	// with a 2 s deadline. The load waits for each call to return, up to
	// hangSlack past its deadline (generous: two loaded cores), and counts
	// the calls still running then as hung; it does not time the calls.
	const deadline = 2 * time.Second
	const hangSlack = 10 * time.Second
	type call struct {
		at   time.Duration
		err  error
		hung bool
		ids  [][]byte
	}
	start := time.Now()
	calls := make(chan call, 1000)
	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for i := 0; loadCtx.Err() == nil && i < 2000; i++ {
			cc := conns[cl.nodes[1+i%2].id]
			items := markItems(fmt.Sprintf("stall%05d", i), 20, 40)
			c := call{at: time.Since(start)}
			done := make(chan error, 1)
			go func() {
				cctx, ccancel := context.WithTimeout(loadCtx, deadline)
				defer ccancel()
				_, err := dedupv1.NewDedupClient(cc).Mark(cctx, &dedupv1.MarkRequest{Items: items})
				done <- err
			}()
			select {
			case c.err = <-done:
			case <-time.After(deadline + hangSlack):
				c.hung, c.err = true, errors.New("still running")
			}
			if c.err == nil {
				for _, it := range items {
					c.ids = append(c.ids, it.Id)
				}
			}
			calls <- c
			select {
			case <-time.After(50 * time.Millisecond):
			case <-loadCtx.Done():
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // some writes before the freeze (not a proof of anything)

	if err := run(t, "fsfreeze", "-f", fs); err != nil {
		t.Skipf("cannot freeze %s: %v", fs, err)
	}
	frozeAt := time.Since(start)
	var newLeader string
	// A healthy new leader by twice the documented bound (slack for two
	// loaded cores): without the stall detection leadership never leaves
	// n1 (its heartbeats need no disk), so the wait fails.
	within := 2 * stallBound(stall)
	err := waitUntil(ctx, within, func(ctx context.Context) error {
		for _, id := range []string{"n2", "n3"} {
			if l := leaderOf(ctx, conns[id]); l != "" && l != "n1" {
				st, err := nodeStatus(ctx, conns[l])
				if err == nil && st.State == "leader" && st.Healthy {
					newLeader = l
					return nil
				}
			}
		}
		return errors.New("n2 and n3 name no healthy leader other than n1")
	})
	elected := time.Since(start) - frozeAt
	if err != nil {
		thaw()
		cl.dumpLogs()
		t.Fatalf("after freezing n1's disk: %v", err)
	}
	t.Logf("n1's disk frozen; %s leads and is ready %v later (documented bound %v, waited up to %v)", newLeader, elected.Round(time.Millisecond), stallBound(stall), within)
	// Writes resume on the others while n1 is still frozen.
	if err := waitUntil(ctx, 20*time.Second, func(ctx context.Context) error {
		cctx, ccancel := context.WithTimeout(ctx, deadline)
		defer ccancel()
		_, err := dedupv1.NewDedupClient(conns[newLeader]).Mark(cctx, &dedupv1.MarkRequest{Items: markItems("whilefrozen", 10, 40)})
		return err
	}); err != nil {
		thaw()
		cl.dumpLogs()
		t.Fatalf("writes on %s while n1 is frozen: %v", newLeader, err)
	}
	st, err := nodeStatus(ctx, conns["n1"])
	t.Logf("n1 while frozen: healthy=%v reason=%q stalled=%v err=%v", st.GetHealthy(), st.GetHealthReason(), st.GetLogStoreStalled(), err)
	if err != nil || st.Healthy || !st.LogStoreStalled {
		t.Errorf("n1 while frozen: status %v, want NOT healthy with log_store_stalled", err)
	}
	time.Sleep(time.Second) // writes keep going while frozen (not a proof of anything)
	stopLoad()
	<-loadDone
	close(calls)
	var acked [][]byte
	hung, failed, total := 0, 0, 0
	for c := range calls {
		total++
		if c.err != nil {
			failed++
		} else {
			acked = append(acked, c.ids...)
		}
		if c.hung {
			hung++
			t.Errorf("call at %v still running %v past its %v deadline", c.at, hangSlack, deadline)
		}
	}
	t.Logf("%d calls, %d failed, %d hung, %d IDs acknowledged", total, failed, hung, len(acked))

	// Thaw: n1 catches up without a restart.
	thaw()
	var target uint64
	if st, err := nodeStatus(ctx, conns[newLeader]); err == nil {
		target = st.CommitIndex
	}
	if err := waitUntil(ctx, 60*time.Second, func(ctx context.Context) error {
		st, err := nodeStatus(ctx, conns["n1"])
		if err != nil {
			return err
		}
		if !st.Healthy || st.AppliedIndex < target || st.LogStoreStalled {
			return fmt.Errorf("n1 healthy=%v (%s) applied %d of %d stalled=%v", st.Healthy, st.HealthReason, st.AppliedIndex, target, st.LogStoreStalled)
		}
		return nil
	}); err != nil {
		cl.dumpLogs()
		t.Fatalf("n1 after the thaw: %v", err)
	}
	for lo := 0; lo < len(acked); lo += 1000 {
		ids := acked[lo:min(lo+1000, len(acked))]
		r, err := dedupv1.NewDedupClient(conns["n1"]).Check(ctx, &dedupv1.CheckRequest{Ids: ids})
		if err != nil {
			t.Fatalf("check on n1 after the thaw: %v", err)
		}
		for i, res := range r.Results {
			if res.Code != dedupv1.CheckResult_SEEN {
				t.Fatalf("acknowledged ID %s is %v on n1 after the thaw", ids[i], res.Code)
			}
		}
	}
	noPanic(t, cl)
}

// Input 7: a leadership transfer to a frozen (SIGSTOP) follower fails, and
// writes must resume within about one election timeout, not after the Raft
// transport's 10 s I/O timeout.
func TestTransferToFrozenFollower_WritesResumeWithinElectionTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs 3 processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 3)
	cl.startAll()
	lid := cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	conns := map[string]*grpc.ClientConn{}
	for _, n := range cl.nodes {
		conns[n.id] = dial(t, n.grpc)
	}
	makeLeader(t, ctx, cl, conns, lid)
	var target *node
	for _, n := range cl.nodes {
		if n.id != lid {
			target = n
			break
		}
	}
	dc := dedupv1.NewDedupClient(conns[lid])
	if _, err := dc.Mark(ctx, &dedupv1.MarkRequest{Items: markItems("before", 10, 40)}); err != nil {
		t.Fatal(err)
	}
	// Let the target catch up, so the transfer gets as far as TimeoutNow.
	if err := waitUntil(ctx, 20*time.Second, func(ctx context.Context) error {
		ls, err1 := nodeStatus(ctx, conns[lid])
		ts, err2 := nodeStatus(ctx, conns[target.id])
		if err1 != nil || err2 != nil || ts.AppliedIndex < ls.CommitIndex {
			return fmt.Errorf("target not caught up: %v %v", err1, err2)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	target.mu.Lock()
	proc := target.cmd.Process
	target.mu.Unlock()
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Signal(syscall.SIGCONT) })

	t0 := time.Now()
	tctx, tcancel := context.WithTimeout(ctx, 20*time.Second)
	_, terr := dedupv1.NewAdminClient(conns[lid]).TransferLeadership(tctx, &dedupv1.TransferLeadershipRequest{NodeId: target.id})
	tcancel()
	failedAfter := time.Since(t0)
	t.Logf("transfer to frozen %s: %v after %v", target.id, terr, failedAfter.Round(time.Millisecond))
	if terr == nil {
		t.Fatalf("transfer to a frozen node succeeded")
	}
	// Writes on the leader (or whoever leads now) must resume quickly:
	// about one election timeout (1 s) for the transfer, one more at most
	// for the bounded TimeoutNow, and slack for two loaded cores. The
	// unbounded transport took ~10 s, past this deadline.
	const resumeBy = 8 * time.Second
	rctx, rcancel := context.WithDeadline(ctx, t0.Add(resumeBy))
	defer rcancel()
	var resumed time.Duration
	if err := waitUntil(rctx, resumeBy, func(ctx context.Context) error {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		_, err := dc.Mark(cctx, &dedupv1.MarkRequest{Items: markItems(fmt.Sprintf("after%d", time.Now().UnixNano()), 10, 40)})
		if err == nil {
			resumed = time.Since(t0)
		}
		return err
	}); err != nil {
		cl.dumpLogs()
		t.Fatalf("writes not resumed within %v of the transfer to a frozen follower: %v", resumeBy, err)
	}
	t.Logf("writes resumed %v after the transfer began (%v after it failed)", resumed.Round(time.Millisecond), (resumed - failedAfter).Round(time.Millisecond))
	noPanic(t, cl)
}

// Input 3: a request larger than one Raft entry may be is refused before
// anything is proposed, with RESOURCE_EXHAUSTED naming the limit; gRPC
// refuses a message beyond the limit (plus framing) unread; the largest
// entry is a metric.
func TestOversizedRequest_RefusedBeforeProposing(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	ports := freePorts(t, 3)
	cl := &cluster{t: t, bin: bin, args: []string{"--bootstrap"}}
	n := &node{id: "n1", raft: ports[0], grpc: ports[1], dir: filepath.Join(t.TempDir(), "n1"), logPath: filepath.Join(t.TempDir(), "n1.log")}
	cl.nodes = []*node{n}
	const limit = 1 << 20
	cl.start(n, "--admin-addr", ports[2], "--max-entry-bytes", "1MiB")
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	cc := dial(t, n.grpc)
	if _, err := dedupv1.NewAdminClient(cc).CreateNamespace(ctx, &dedupv1.CreateNamespaceRequest{
		Namespace: &dedupv1.Namespace{Name: "big", MaxIdBytes: 4096}}); err != nil {
		t.Fatal(err)
	}
	dc := dedupv1.NewDedupClient(cc)
	before, err := nodeStatus(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}

	// 400 IDs of 4 KiB: 1.6 MiB, above the entry limit, below gRPC's.
	_, err = dc.Mark(ctx, &dedupv1.MarkRequest{Namespace: "big", Items: markItems("huge", 400, 4096)})
	info := errInfo(err)
	if status.Code(err) != codes.ResourceExhausted || info == nil || info.Reason != "ENTRY_TOO_LARGE" || info.Metadata["max_bytes"] != fmt.Sprint(limit) {
		t.Fatalf("mark of 400 × 4 KiB = %v (details %v), want RESOURCE_EXHAUSTED ENTRY_TOO_LARGE with max_bytes %d", err, info, limit)
	}
	if !strings.Contains(status.Convert(err).Message(), fmt.Sprint(limit)) {
		t.Fatalf("message %q does not name the limit", status.Convert(err).Message())
	}
	t.Logf("refused: %v", err)
	after, err := nodeStatus(ctx, cc)
	if err != nil || after.CommitIndex != before.CommitIndex {
		t.Fatalf("commit index %d → %d (%v): the refused request was proposed", before.CommitIndex, after.GetCommitIndex(), err)
	}
	// 3 MiB: gRPC refuses it unread.
	_, err = dc.Mark(ctx, &dedupv1.MarkRequest{Namespace: "big", Items: markItems("huger", 750, 4096)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("mark of 750 × 4 KiB = %v, want RESOURCE_EXHAUSTED from gRPC", err)
	}
	// 200 IDs of 4 KiB: 0.8 MiB, one entry within the limit.
	if _, err := dc.Mark(ctx, &dedupv1.MarkRequest{Namespace: "big", Items: markItems("fits", 200, 4096)}); err != nil {
		t.Fatalf("mark of 200 × 4 KiB: %v", err)
	}
	_, metrics, err := httpGet(ctx, "http://"+ports[2]+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var largest, lim float64
	for _, l := range strings.Split(metrics, "\n") {
		fmt.Sscanf(l, "dedup_raft_entry_max_bytes %g", &largest)
		fmt.Sscanf(l, "dedup_raft_entry_limit_bytes %g", &lim)
	}
	t.Logf("dedup_raft_entry_max_bytes %.0f, dedup_raft_entry_limit_bytes %.0f", largest, lim)
	if largest < 200*4096 || largest > limit || lim != limit {
		t.Fatalf("dedup_raft_entry_max_bytes %.0f / limit %.0f: want the 200 × 4 KiB entry (≥ %d, ≤ %d) and the limit", largest, lim, 200*4096, limit)
	}
	noPanic(t, cl)
}

// Input 1, follower side: a follower's disk fills (another writer took the
// space) while the leader keeps taking writes. The follower must not panic
// nor apply half a batch: it pauses applying or stops taking entries
// (whichever guard it meets first), reports NOT_SERVING, the others keep
// committing, and once space is freed it catches up by itself with every
// acknowledged ID.
func TestDiskFull_FollowerPausesApplyingThenCatchesUp(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildBinary(t)
	// 96 MiB: after catching up n3 may hold a new 16 MiB raft-wal segment,
	// and must still have its --min-free-disk (32 MiB) free to be healthy.
	fs := mountTmpfs(t, 96<<20)
	ballast := filepath.Join(fs, "ballast")
	cl := newPeersCluster(t, bin, 3)
	n3 := cl.nodes[2]
	n3.dir = filepath.Join(fs, "n3")
	for _, n := range cl.nodes {
		cl.start(n, "--fsm-memtable-size", "2MiB", "--min-free-disk", "32MiB")
	}
	cl.waitLeader(ctx, cl.addrs(), 60*time.Second)
	conns := map[string]*grpc.ClientConn{}
	for _, n := range cl.nodes {
		conns[n.id] = dial(t, n.grpc)
	}
	makeLeader(t, ctx, cl, conns, "n1")
	st, err := nodeStatus(ctx, conns["n3"])
	if err != nil {
		t.Fatal(err)
	}
	reserve := int64(st.GetDisk().GetReserveBytes())
	// Leave n3 4 MiB above its apply reserve, far below its write
	// threshold: only a leader refuses writes, and n1 leads.
	if free := freeBytes(t, fs); free > reserve+4<<20 {
		fillFile(t, ballast, free-(reserve+4<<20))
	}
	dc := dedupv1.NewDedupClient(conns["n1"])
	var acked [][]byte
	paused := false
	for i := 0; i < 400 && !paused; i++ {
		items := markItems(fmt.Sprintf("f%04d", i), 200, 500)
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := dc.Mark(cctx, &dedupv1.MarkRequest{Items: items})
		ccancel()
		if err != nil {
			cl.dumpLogs()
			t.Fatalf("batch %d on the leader: %v", i, err)
		}
		for _, it := range items {
			acked = append(acked, it.Id)
		}
		// Either guard may stop n3 first: applying pauses at the reserve,
		// and below the floor (reserve + one log segment) plus the entries
		// n3 refuses them, so it never applies up to the reserve. Either
		// way it falls behind; each batch here is one committed entry, so
		// 50 behind is no follower's ordinary lag.
		st3, err3 := nodeStatus(ctx, conns["n3"])
		st1, err1 := nodeStatus(ctx, conns["n1"])
		switch {
		case err3 != nil || err1 != nil:
		case st3.GetDisk().GetApplyPaused():
			paused = true
			t.Logf("n3 paused applying after %d IDs: %d bytes free, reserve %d; health %q", len(acked), st3.Disk.FreeBytes, st3.Disk.ReserveBytes, st3.HealthReason)
		case st3.AppliedIndex+50 < st1.CommitIndex:
			paused = true
			t.Logf("n3 stopped taking entries after %d IDs: applied %d of %d, %d bytes free, reserve %d", len(acked), st3.AppliedIndex, st1.CommitIndex, st3.Disk.FreeBytes, st3.Disk.ReserveBytes)
		}
	}
	if !paused {
		t.Fatalf("n3 neither paused applying nor fell behind (%d IDs, %d bytes free)", len(acked), freeBytes(t, fs))
	}
	// Now the disk fills completely: n3's Raft log appends fail too. The
	// others go on committing while n3 is paused.
	t.Logf("filled n3's remaining %d bytes", fillFile(t, ballast, -1))
	for i := 0; i < 20; i++ {
		items := markItems(fmt.Sprintf("g%04d", i), 200, 500)
		if _, err := dc.Mark(ctx, &dedupv1.MarkRequest{Items: items}); err != nil {
			cl.dumpLogs()
			t.Fatalf("writes while n3 is paused: %v", err)
		}
		for _, it := range items {
			acked = append(acked, it.Id)
		}
	}
	// gRPC health is published by the node's housekeeping loop (every
	// 200 ms), not computed per call as Status is: wait for it, while n3
	// stays paused with a full disk.
	if err := waitUntil(ctx, 30*time.Second, func(ctx context.Context) error {
		if s, err := health(ctx, conns["n3"]); err != nil || s != healthpb.HealthCheckResponse_NOT_SERVING {
			return fmt.Errorf("grpc health %v, %v", s, err)
		}
		return nil
	}); err != nil {
		cl.dumpLogs()
		t.Fatalf("n3 health while paused, want NOT_SERVING: %v", err)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	lst, err := nodeStatus(ctx, conns["n1"])
	if err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(ctx, 60*time.Second, func(ctx context.Context) error {
		st, err := nodeStatus(ctx, conns["n3"])
		if err != nil {
			return err
		}
		if !st.Healthy || st.AppliedIndex < lst.CommitIndex {
			return fmt.Errorf("n3 healthy=%v (%s) applied %d of %d", st.Healthy, st.HealthReason, st.AppliedIndex, lst.CommitIndex)
		}
		return nil
	}); err != nil {
		cl.dumpLogs()
		t.Fatalf("n3 after space came back: %v", err)
	}
	for lo := 0; lo < len(acked); lo += 2000 {
		ids := acked[lo:min(lo+2000, len(acked))]
		r, err := dedupv1.NewDedupClient(conns["n3"]).Check(ctx, &dedupv1.CheckRequest{Ids: ids, Consistency: dedupv1.Consistency_CONSISTENCY_STALE})
		if err != nil {
			t.Fatalf("stale check on n3: %v", err)
		}
		for i, res := range r.Results {
			if res.Code != dedupv1.CheckResult_SEEN {
				t.Fatalf("acknowledged ID %d is %v on n3 after it caught up", lo+i, res.Code)
			}
		}
	}
	t.Logf("n3 caught up: all %d acknowledged IDs there", len(acked))
	noPanic(t, cl)
}
