// Package testbin builds the project's commands for tests that run them as
// real processes (e2e, chaos): each command at most once per test binary,
// all with one set of build flags. The flags are fixed here so that every
// package building a command asks the build cache for the same compiled
// dependencies: a package built with other settings (CGO_ENABLED=0, or
// cmd/dedupnode's profile-guided optimisation) compiles the whole
// dependency graph again in a mode of its own, minutes on two busy cores.
// A command is linked once per test binary, not once per test: linking
// dedupnode is not cached by go build and takes seconds of CPU.
//
// A package that uses it removes the binaries at the end of its run:
//
//	func TestMain(m *testing.M) { os.Exit(testbin.Main(m)) }
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Module is the import path of the module the commands belong to.
const Module = "github.com/dedupnode/dedupnode"

var (
	mu    sync.Mutex
	dir   string
	built = map[string]*build{} // import path -> its build
)

type build struct {
	once sync.Once
	path string
	err  error
}

// Build returns the path of the command pkg (an import path in Module)
// built without -race and without profile-guided optimisation, building it
// on the first call of the test binary. It fails t if the build fails, and
// skips t with -short.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs real processes; skipped with -short")
	}
	mu.Lock()
	if dir == "" {
		d, err := os.MkdirTemp("", "dedupnode-testbin-*")
		if err != nil {
			mu.Unlock()
			t.Fatalf("testbin: %v", err)
		}
		dir = d
	}
	b, ok := built[pkg]
	if !ok {
		b = &build{}
		built[pkg] = b
	}
	d := dir
	mu.Unlock()
	b.once.Do(func() { b.path, b.err = goBuild(d, pkg) })
	if b.err != nil {
		t.Fatalf("testbin: %v", b.err)
	}
	return b.path
}

func goBuild(dir, pkg string) (string, error) {
	out := filepath.Join(dir, path.Base(pkg))
	// The go command of the toolchain that built this test binary.
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-pgo=off", "-o", out, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}

// Main runs the package's tests (m.Run), then removes the binaries Build
// made; it returns m.Run's exit code.
func Main(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
	return code
}
