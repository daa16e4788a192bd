package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDevAdminAddr: dev --admin-addr HOST:0 gives every node an admin HTTP
// listener, prints it, and serves metrics (streaming calls counted too).
func TestDevAdminAddr(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, errb := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--base-port", "0", "--nodes", "2", "--admin-addr", "127.0.0.1:0"}, strings.NewReader(""), out, errb)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("dev exited %d: %s", code, errb.String())
			}
		case <-time.After(60 * time.Second):
			t.Error("dev did not stop within 60s of cancel")
		}
	})
	re := regexp.MustCompile(`admin (http://127\.0\.0\.1:[0-9]+/)`)
	var urls []string
	deadline := time.Now().Add(60 * time.Second)
	for len(urls) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no admin addresses printed:\n%s%s", out.String(), errb.String())
		}
		if strings.Contains(out.String(), "addrs: ") {
			for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
				urls = append(urls, m[1])
			}
			if len(urls) < 2 {
				t.Fatalf("want 2 admin addresses:\n%s", out.String())
			}
			break
		}
		select {
		case code := <-done:
			t.Fatalf("dev exited %d: %s", code, errb.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if urls[0] == urls[1] {
		t.Fatalf("nodes share an admin address: %v", urls)
	}
	addr := regexp.MustCompile(`addrs: (\S+)`).FindStringSubmatch(out.String())[1]
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	if code, _, e := runCLI(t, rctx, "", "mark", "--addr", addr, "x1"); code != 0 {
		t.Fatalf("mark: %s", e)
	}
	if code, _, e := runCLI(t, rctx, "", "export", "--addr", strings.Split(addr, ",")[0], "--namespace", "default", "--out", t.TempDir()+"/x.ndjson"); code != 0 {
		t.Fatalf("export: %s", e)
	}
	// Each node serves a call of its own, so each has requests to count
	// whichever node leads (the mark went to the leader only).
	for _, a := range strings.Split(addr, ",") {
		if code, _, e := runCLI(t, rctx, "", "status", "--addr", a); code != 0 {
			t.Fatalf("status of %s: %s", a, e)
		}
	}
	c := &http.Client{Timeout: 10 * time.Second}
	var text string
	for _, u := range urls {
		resp, err := c.Get(u + "metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "dedup_requests_total") {
			t.Fatalf("%smetrics: %d %.300s", u, resp.StatusCode, b)
		}
		text += string(b)
	}
	if !strings.Contains(text, `op="export"`) {
		t.Fatal("the streaming Export call is not counted in dedup_requests_total")
	}
}
