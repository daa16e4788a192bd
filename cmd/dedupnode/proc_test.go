package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// asMainEnv, set to 1 in its environment, makes this test binary run as
// the dedupnode command itself (TestMain calls main): tests of what a
// process does with its signals, its standard streams and its exit code
// start it with dedupnodeCmd.
const asMainEnv = "DEDUPNODE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

// dedupnodeCmd is the dedupnode command line args as a process of its
// own (this test binary, running main), with env added to this
// process's environment. It dies with the test process; the test's
// cleanup kills it by its PID if it still runs.
func dedupnodeCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(append(os.Environ(), asMainEnv+"=1"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd
}
