package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dedupnode.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigFilePrecedence: command line > environment > config file >
// defaults, lists as YAML sequences, and the resulting server config.
func TestConfigFilePrecedence(t *testing.T) {
	e := &env{ctx: context.Background(), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, progName: "dedupnode"}
	path := writeConfig(t, `
node-id: from-file
data-dir: /tmp/from-file
grpc-addr: 127.0.0.1:1111
raft-addr: 127.0.0.1:2222
peers:
  - from-file=127.0.0.1:2222=127.0.0.1:1111
  - n2=127.0.0.1:2223=127.0.0.1:1112
max-batch: 500
bloom-fp-rate: 0.02
admin-addr: 127.0.0.1:9999
`)
	t.Setenv("DEDUPNODE_MAX_BATCH", "77")
	t.Setenv("DEDUPNODE_CONFIG", path)
	cmd := newServeCmd(e)
	if err := cmd.ParseFlags([]string{"--grpc-addr", "127.0.0.1:3333"}); err != nil {
		t.Fatal(err)
	}
	fs := cmd.Flags()
	if err := applyEnv(fs, append(serveFlagNames, "config")...); err != nil {
		t.Fatal(err)
	}
	cfgPath, _ := fs.GetString("config")
	if cfgPath != path {
		t.Fatalf("DEDUPNODE_CONFIG not applied: %q", cfgPath)
	}
	if err := applyConfigFile(fs, cfgPath, serveFlagNames); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return fs.Lookup(name).Value.String() }
	for name, want := range map[string]string{
		"node-id":       "from-file",      // file over default
		"grpc-addr":     "127.0.0.1:3333", // command line over file
		"max-batch":     "77",             // environment over file
		"bloom-fp-rate": "0.02",
		"admin-addr":    "127.0.0.1:9999",
		"log-level":     "info", // default, untouched
	} {
		if got := get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := get("peers"); got != "from-file=127.0.0.1:2222=127.0.0.1:1111,n2=127.0.0.1:2223=127.0.0.1:1112" {
		t.Errorf("peers = %q", got)
	}
}

func TestConfigFileErrorsNameTheKey(t *testing.T) {
	e := &env{ctx: context.Background(), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, progName: "dedupnode"}
	for content, want := range map[string]string{
		"node-id: a\nnode_id: b\n":       `unknown key "node_id" (did you mean "node-id"?)`,
		"data-dri: x\n":                  `unknown key "data-dri" (did you mean "data-dir"?)`,
		"frobnicate: 1\n":                `unknown key "frobnicate"; known keys:`,
		"max-batch: lots\n":              `key "max-batch"`,
		"node-id: a\nnode-id: b\n":       `appears twice`,
		"config: other.yaml\n":           `unknown key "config"`,
		"peers: {a: b}\n":                `key "peers": a mapping`,
		"[1, 2]\n":                       `--config`,
		"bootstrap: true\nnode-id: n1\n": ``,
	} {
		cmd := newServeCmd(e)
		err := applyConfigFile(cmd.Flags(), writeConfig(t, content), serveFlagNames)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", content, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want it to contain %q", content, err, want)
		}
	}
	// Through the command: a usage error, exit 2, one line.
	code, _, errb := runCLI(t, context.Background(), "", "serve", "--config", writeConfig(t, "nodeid: x\n"))
	if code != exitUsage || !strings.Contains(errb, `unknown key "nodeid"`) {
		t.Errorf("serve with a bad config: exit %d, stderr %q", code, errb)
	}
	assertOneLine(t, errb)
}
