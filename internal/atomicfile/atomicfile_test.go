package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// Write replaces a file whole, with the permissions asked for, and leaves
// no temporary file behind, on success or on failure.
func TestWriteReplacesWholeAndLeavesNoTemporaryFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Write(path, []byte("first, longer"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("second"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "second" {
		t.Fatalf("read back %q, %v; want %q", b, err, "second")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v; want 0644", fi.Mode().Perm(), err)
	}
	// A directory cannot be replaced by a file: the rename fails, and the
	// temporary file, made beside it, goes.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(sub, []byte("x"), 0o644); err == nil {
		t.Fatal("writing over a directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name() != "f" || entries[1].Name() != "sub" {
		t.Fatalf("directory holds %v, want only f and sub", entries)
	}
}
