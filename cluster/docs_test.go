package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The Disks section of docs/OPERATIONS.md names what a node keeps under
// raft/ in its data dir, with each log store: raft/wal/ (wal, the
// default), raft/raft.db (boltdb).
func TestOperationsDocNamesTheRaftFiles(t *testing.T) {
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, disks, _ := strings.Cut(string(doc), "\n## Disks\n")
	intro, _, _ := strings.Cut(strings.TrimLeft(disks, "\n"), "\n\n")
	intro = strings.Join(strings.Fields(intro), " ")
	for _, ls := range LogStores {
		dir := t.TempDir()
		cfg := testConfig(dir, true)
		cfg.LogStore = ls
		n := startNode(t, cfg)
		if err := n.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(filepath.Join(dir, "raft"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := "raft/" + e.Name()
			if e.IsDir() {
				name += "/"
			}
			if !strings.Contains(intro, "`"+name+"`") {
				t.Errorf("--raft-log-store %s keeps %s, which the Disks section of docs/OPERATIONS.md does not name: %q", ls, name, intro)
			}
		}
	}
}
