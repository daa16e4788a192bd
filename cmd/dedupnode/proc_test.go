package main

import (
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// asMainEnv, set to 1 in its environment, makes this test binary run as
// the dedupnode command itself (TestMain calls main): tests of what a
// process does with its signals, its standard streams and its exit code
// start it with startProc.
const asMainEnv = "DEDUPNODE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

// proc is the dedupnode command running as a process of its own.
type proc struct {
	cmd *exec.Cmd
	// exited is closed once the process has exited and been waited
	// for; cmd.ProcessState and waitErr are set then.
	exited  chan struct{}
	waitErr error
}

// startProc starts the dedupnode command line args as a process of its
// own (this test binary, running main), with env added to this process's
// environment and stdout and stderr as given. It dies with the test
// process; the test's cleanup kills it by its PID if it still runs.
func startProc(t *testing.T, env []string, stdout, stderr io.Writer, args ...string) *proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(append(os.Environ(), asMainEnv+"=1"), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// wait waits up to d for the process to exit and reports whether it did.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(d):
		return false
	}
}
