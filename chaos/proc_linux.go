//go:build linux

package chaos

import "syscall"

// procAttr puts a node in its own process group (a Ctrl-C in the terminal
// reaches only the runner, which then stops the nodes itself) and kills it
// if the runner dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
