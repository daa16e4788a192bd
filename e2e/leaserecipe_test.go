package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// readmeRecipe returns the README tour's claim and commit command lines
// (without the prompt and the trailing comment), as a user copies them.
func readmeRecipe(t *testing.T) (claim, commit string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	f, err := os.Open(filepath.Join(filepath.Dir(filepath.Dir(file)), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "$ ")
		if !ok {
			continue
		}
		if i := strings.Index(line, "  #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case strings.HasPrefix(line, "lease=$(./dedupnode claim "):
			claim = line
		case strings.HasPrefix(line, "./dedupnode commit ") && strings.Contains(line, "$lease"):
			commit = line
		}
	}
	if claim == "" || commit == "" {
		t.Fatalf("README.md: the tour's claim (%q) and commit (%q) lines are not found", claim, commit)
	}
	return claim, commit
}

// sh runs script with /bin/sh, ./dedupnode being bin and DEDUPNODE_ADDR
// addr, as a user in another terminal would; it returns the exit code,
// stdout and stderr.
func sh(t *testing.T, bin, addr, script string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(script, "./dedupnode", bin))
	cmd.Env = append(os.Environ(), "DEDUPNODE_ADDR="+addr)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("sh -c %q: %v", script, err)
	return 0, "", ""
}

// The README's claim → commit recipe is safe when copied: a second
// consumer that runs it while the first holds the ID gets no lease from
// its claim and a usage error from its commit (exit 2, nothing sent),
// instead of committing the first's lease; the first then commits.
func TestREADMELeaseRecipeIsSafeForASecondConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds the binary and runs a process")
	}
	claim, commit := readmeRecipe(t)
	bin := buildBinary(t)
	cl := newPeersCluster(t, bin, 1)
	cl.args = []string{"--bootstrap"}
	cl.startAll()
	addr := cl.nodes[0].grpc
	cl.waitLeader(context.Background(), cl.addrs(), 60*time.Second)

	// The first consumer claims, and keeps its lease.
	code, first, errs := sh(t, bin, addr, claim+"\n"+`printf %s "$lease"`)
	if code != 0 || first == "" || !strings.Contains(first, ".") {
		t.Fatalf("first consumer's claim: exit %d, lease %q, %s", code, first, errs)
	}
	// The second runs the whole recipe meanwhile.
	code, out, errs := sh(t, bin, addr, claim+"\n"+commit)
	if code != 2 || out != "" || !strings.Contains(errs, "no LEASE") {
		t.Fatalf("second consumer's recipe: exit %d, stdout %q, stderr %q; want a usage error from commit", code, out, errs)
	}
	// The first commits its own.
	code, out, errs = sh(t, bin, addr, "lease='"+first+"'\n"+commit)
	if code != 0 || !strings.HasPrefix(out, "job-1\tok\t") {
		t.Fatalf("first consumer's commit: exit %d, %q, %s; want ok", code, out, errs)
	}
	code, out, _ = sh(t, bin, addr, "./dedupnode claim job-1")
	if code != 0 || !strings.HasPrefix(out, "job-1\tduplicate") {
		t.Fatalf("claim after the first's commit: exit %d, %q; want duplicate", code, out)
	}
}
