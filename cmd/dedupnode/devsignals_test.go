package main

import (
	"bufio"
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
			cmd := dedupnodeCmd(t, []string{"TMPDIR=" + tmp}, "dev", "--base-port", "0", "--nodes", "1")
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = w, w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
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
				case err := <-exited:
					t.Fatalf("dev exited before printing its addresses: %v", err)
				case <-time.After(90 * time.Second):
					t.Fatal("dev printed no addresses within 90s")
				}
				if err := cmd.Process.Signal(c.sig); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-exited:
				if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() {
					t.Errorf("dev was killed by %v (%v)", ws.Signal(), err)
				}
			case <-time.After(90 * time.Second):
				t.Fatal("dev did not exit within 90s")
			}
			left, _ := filepath.Glob(filepath.Join(tmp, "dedupnode-dev-*"))
			if len(left) != 0 {
				t.Fatalf("dev left its temporary data dir behind: %v", left)
			}
		})
	}
}
