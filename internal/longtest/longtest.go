// Package longtest says whether the long variants of the tests run: the
// long chaos runs and the stress tests' full sets of seeds. They run when
// DEDUPNODE_LONG_TESTS=1, which .ci/run sets; the README's test command
// without it runs the short variants, which cover the same code paths with
// fewer random schedules.
package longtest

import (
	"os"
	"testing"
)

// Env names the environment variable that, set to 1, runs the long
// variants.
const Env = "DEDUPNODE_LONG_TESTS"

// Enabled reports whether the long variants run.
func Enabled() bool { return os.Getenv(Env) == "1" }

// Need skips t unless the long variants run.
func Need(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skipf("a long test; %s=1 runs it (.ci/run sets it)", Env)
	}
}

// Pick returns long when the long variants run, else short.
func Pick[T any](short, long T) T {
	if Enabled() {
		return long
	}
	return short
}
