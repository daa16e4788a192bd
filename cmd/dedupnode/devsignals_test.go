package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDevDeletesItsTempDirWhenItsOutputOrTerminalGoes: a 'dedupnode dev'
// process without --data-dir deletes its temporary data dir and exits
// by itself (not killed by a signal) when it is stopped while the reader
// of its output is gone, as after Ctrl-C on 'dedupnode dev 2>&1 | tee log'
// (SIGINT, then a write to the closed pipe: SIGPIPE killed it), when its
// terminal goes away (SIGHUP killed it), and when the reader of its
// stdout is gone before it prints ('dedupnode dev | head -1').
func TestDevDeletesItsTempDirWhenItsOutputOrTerminalGoes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dev clusters")
	}
	for _, c := range []struct {
		name string
		// closeFirst: the pipe's reader is gone before dev prints.
		closeFirst bool
		// closeAfter: the reader is gone once dev printed its addresses.
		closeAfter bool
		sig        syscall.Signal // sent once dev printed its addresses
	}{
		{name: "SIGINT after the reader of stdout and stderr died", closeAfter: true, sig: syscall.SIGINT},
		{name: "SIGHUP", sig: syscall.SIGHUP},
		{name: "stdout closed before dev prints", closeFirst: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmp := t.TempDir()
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			p := startProc(t, []string{"TMPDIR=" + tmp}, w, w, "dev", "--base-port", "0", "--nodes", "1")
			w.Close()
			if c.closeFirst {
				r.Close()
			} else {
				// The temporary dir exists and dev listens once it
				// printed its addresses.
				printed := make(chan string, 1)
				go func() {
					sc := bufio.NewScanner(r)
					for sc.Scan() {
						if strings.HasPrefix(sc.Text(), "addrs: ") {
							printed <- sc.Text()
							break
						}
					}
					if c.closeAfter {
						r.Close()
						return
					}
					_, _ = io.Copy(io.Discard, r)
				}()
				select {
				case <-printed:
				case <-p.exited:
					t.Fatalf("dev exited before printing its addresses: %v", p.waitErr)
				case <-time.After(90 * time.Second):
					t.Fatal("dev printed no addresses within 90s")
				}
				if err := p.cmd.Process.Signal(c.sig); err != nil {
					t.Fatal(err)
				}
			}
			if !p.wait(90 * time.Second) {
				t.Fatal("dev did not exit within 90s")
			}
			if ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
				t.Errorf("dev was killed by %v (%v)", ws.Signal(), p.waitErr)
			}
			left, _ := filepath.Glob(filepath.Join(tmp, "dedupnode-dev-*"))
			if len(left) != 0 {
				t.Fatalf("dev left its temporary data dir behind: %v", left)
			}
		})
	}
}

// TestDevSurvivesASIGPIPEFromElsewhere: a SIGPIPE that is not about its
// own output (the kernel sends one for a write to a socket whose peer
// went away, say a client killed mid-call) does not stop 'dedupnode dev':
// it still answers, and stops cleanly on SIGINT.
func TestDevSurvivesASIGPIPEFromElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dev cluster")
	}
	tmp := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p := startProc(t, []string{"TMPDIR=" + tmp}, w, w, "dev", "--base-port", "0", "--nodes", "1")
	w.Close()
	defer r.Close()
	addrs := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "addrs: "); ok {
				addrs <- a
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrs:
	case <-p.exited:
		t.Fatalf("dev exited before printing its addresses: %v", p.waitErr)
	case <-time.After(90 * time.Second):
		t.Fatal("dev printed no addresses within 90s")
	}
	if err := p.cmd.Process.Signal(syscall.SIGPIPE); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if code, out, errs := runCLI(t, ctx, "", "mark", "--addr", addr, "after-sigpipe"); code != 0 || !strings.HasPrefix(out, "after-sigpipe\tnew") {
		t.Fatalf("mark after a SIGPIPE: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	select {
	case <-p.exited:
		t.Fatalf("dev exited after a SIGPIPE: %v", p.waitErr)
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !p.wait(90 * time.Second) {
		t.Fatal("dev did not exit within 90s of SIGINT")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "dedupnode-dev-*")); len(left) != 0 {
		t.Fatalf("dev left its temporary data dir behind: %v", left)
	}
}
