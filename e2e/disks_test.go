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
	fs := mountTmpfs(t, 64<<20)
	ballast := filepath.Join(fs, "ballast")

	ports := freePorts(t, 3)
	cl := &cluster{t: t, bin: bin, args: []string{"--bootstrap"}}
	n := &node{id: "n1", raft: ports[0], grpc: ports[1], dir: filepath.Join(fs, "data"), logPath: filepath.Join(t.TempDir(), "n1.log")}
	cl.nodes = []*node{n}
	const minFree = 16 << 20
	cl.start(n, "--admin-addr", ports[2], "--min-free-disk", "16MiB", "--fsm-memtable-size", "2MiB")
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
	if err := waitUntil(ctx, 10*time.Second, notServing); err != nil {
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
