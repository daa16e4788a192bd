package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a Go CPU profile of this process to path until the
// returned stop function runs (as 'go test -cpuprofile' does); read it with
// 'go tool pprof PATH'. An empty path profiles nothing.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, &opError{err: fmt.Errorf("--cpu-profile: %w", err), hint: "pass a file path you can write to"}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpu-profile: write %s: %w", path, err)
		}
		return nil
	}, nil
}
