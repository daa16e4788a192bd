package main

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dedupv1 "github.com/dedupnode/dedupnode/api/dedup/v1"
	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/diskspace"
	"github.com/dedupnode/dedupnode/internal/testcluster"
)

// What serve --help and the README promise for --min-free-disk is what a
// client sees: gRPC RESOURCE_EXHAUSTED with reason DISK_FULL, which the Go
// client decodes as client.ErrDiskFull; reads are still served.
func TestMinFreeDiskRefusalIsWhatHelpSays(t *testing.T) {
	code, help, _ := runCLI(t, context.Background(), "", "serve", "--help")
	if code != exitOK {
		t.Fatalf("serve --help: exit %d", code)
	}
	var usage string
	for _, l := range strings.Split(help, "\n") {
		if strings.Contains(l, "--min-free-disk SIZE") {
			usage = l
		}
	}
	for _, want := range []string{"RESOURCE_EXHAUSTED", "DISK_FULL", "client.ErrDiskFull"} {
		if !strings.Contains(usage, want) {
			t.Errorf("--min-free-disk help %q lacks %s", usage, want)
		}
	}

	// A node run with a threshold its disk does not meet refuses every
	// client write.
	grpcAddr := closedAddr(t)
	dataDir := t.TempDir()
	minFree := unmetMinFree(t, dataDir)
	sctx, stop := context.WithCancel(context.Background())
	done, exited := make(chan int, 1), make(chan struct{})
	var serveErr syncBuffer
	go func() {
		defer close(exited)
		done <- run(sctx, []string{"serve", "--node-id", "n1", "--data-dir", dataDir, "--bootstrap",
			"--grpc-addr", grpcAddr, "--raft-addr", closedAddr(t), "--min-free-disk", strconv.FormatUint(minFree, 10) + "B"}, strings.NewReader(""), io.Discard, &serveErr)
	}()
	t.Cleanup(func() {
		stop()
		if code := <-done; code != exitOK {
			t.Errorf("serve exited %d: %s", code, serveErr.String())
		}
	})
	c := testcluster.Client(t, []string{grpcAddr})
	testcluster.WaitFor(t, 60*time.Second, "a write refused for disk space", func() bool {
		select {
		case <-exited:
			t.Fatalf("serve exited: %s", serveErr.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Mark(ctx, "", []client.Item{{ID: []byte("x")}}, 0)
		if err == nil {
			t.Fatal("mark accepted below --min-free-disk")
		}
		return errors.Is(err, client.ErrDiskFull)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Mark(ctx, "", []client.Item{{ID: []byte("x")}}, 0)
	if e := client.AsError(err); !errors.Is(err, client.ErrDiskFull) || status.Code(err) != codes.ResourceExhausted || e.Reason != "DISK_FULL" {
		t.Fatalf("mark below --min-free-disk: %v, want client.ErrDiskFull, RESOURCE_EXHAUSTED, reason DISK_FULL", err)
	}
	// The ErrorInfo carries every figure a client reports, as decimal
	// byte counts: the threshold, the free space and where writes resume.
	var info *errdetails.ErrorInfo
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
	}
	want := map[string]string{
		dedupv1.MetaMinFreeBytes:    strconv.FormatUint(minFree, 10),
		dedupv1.MetaResumeFreeBytes: strconv.FormatUint(diskspace.ResumeAt(minFree), 10),
	}
	for k, v := range want {
		if info == nil || info.Metadata[k] != v {
			t.Errorf("DISK_FULL metadata %s: got %v, want %q", k, info, v)
		}
	}
	if free, perr := strconv.ParseUint(info.GetMetadata()[dedupv1.MetaFreeBytes], 10, 64); perr != nil || free >= minFree {
		t.Errorf("DISK_FULL metadata %s: got %v, want a byte count below %d", dedupv1.MetaFreeBytes, info, minFree)
	}
	if _, err := c.Check(ctx, "", [][]byte{[]byte("x")}, client.Linearizable); err != nil {
		t.Fatalf("check below --min-free-disk: %v, want it served", err)
	}
	code, _, errs := runCLI(t, context.Background(), "", "mark", "--addr", grpcAddr, "--timeout", "2s", "x")
	if code != exitError || !strings.Contains(errs, "write refused, nothing applied") || !strings.Contains(errs, "free space") {
		t.Fatalf("CLI mark below --min-free-disk: exit %d, stderr %q", code, errs)
	}
}

// unmetMinFree returns a --min-free-disk for a node with its data dir at
// dir that the volume does not meet now but could (serve refuses one the
// volume can never meet): halfway between the free space and the most the
// volume can have free, its resume margin included. It skips the test
// when the volume has too little used space to place one.
func unmetMinFree(t *testing.T, dir string) uint64 {
	t.Helper()
	free, _, err := diskspace.Free(dir)
	if err != nil {
		t.Fatal(err)
	}
	capacity, _, err := diskspace.CapacityNearest(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Generous room for the node's own files (cluster.OwnFootprint is
	// about 55 MiB with 32 MiB memtables).
	most := (capacity - min(capacity, 256<<20)) * 16 / 17
	if most < free+1<<30 {
		t.Skipf("the volume of %s has %d bytes free of %d: no room for a threshold above its free space that it could meet", dir, free, capacity)
	}
	return free + (most-free)/2
}
