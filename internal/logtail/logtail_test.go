package logtail

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadKeepsTheLastWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.log")
	var all strings.Builder
	for i := range 100 {
		all.WriteString(strings.Repeat("x", i%7) + "line\n")
	}
	if err := os.WriteFile(path, []byte(all.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got := Read(path, 50)
	if len(got) > 50 || len(got) == 0 {
		t.Fatalf("tail of %d bytes, want 1..50: %q", len(got), got)
	}
	if !strings.HasSuffix(all.String(), got) {
		t.Fatalf("%q is not the end of the log", got)
	}
	if !strings.HasSuffix(all.String(), "\n"+got) {
		t.Fatalf("%q starts inside a line", got)
	}
	if whole := Read(path, 1<<20); whole != all.String() {
		t.Fatalf("a log shorter than the limit comes back whole: got %d bytes, want %d", len(whole), all.Len())
	}
}

func TestReadNamesAnUnreadableLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.log")
	if got := Read(path, 100); !strings.Contains(got, path) || !strings.Contains(got, "unreadable") {
		t.Fatalf("got %q, want a note naming the missing log", got)
	}
}
