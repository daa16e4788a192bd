package storage

import (
	"runtime"
	"syscall"
)

// CanLowerPriority reports whether Options.BackgroundNice takes effect here.
const CanLowerPriority = true

// lowerThreadPriority locks the calling goroutine to its OS thread and
// raises that thread's nice value by by (to at most 19); the thread exits
// with the goroutine, which must therefore never unlock it. Raising a nice
// value needs no privilege; an error (none is expected) leaves the
// priority as it was.
func lowerThreadPriority(by int) {
	runtime.LockOSThread()
	tid := syscall.Gettid()
	// The raw getpriority system call answers 20 - nice (1 to 40).
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
	if err != nil {
		return
	}
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, min(20-raw+by, 19))
}
