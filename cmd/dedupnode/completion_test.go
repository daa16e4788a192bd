package main

import (
	"context"
	"strings"
	"testing"
)

// TestShellCompletion: 'dedupnode completion SHELL' prints cobra's
// completion script for bash, zsh, fish and powershell (the command was
// switched off), and the completions every script asks the binary for
// ('dedupnode __complete ARGS...') name the commands, the flags, and the
// words a flag such as --output or --consistency takes instead of file
// names.
func TestShellCompletion(t *testing.T) {
	ctx := context.Background()
	for shell, want := range map[string]string{
		"bash":       "# bash completion V2 for dedupnode",
		"zsh":        "#compdef dedupnode",
		"fish":       "complete -c dedupnode ",
		"powershell": "Register-ArgumentCompleter -CommandName 'dedupnode'",
	} {
		code, out, errs := runCLI(t, ctx, "", "completion", shell)
		if code != exitOK || errs != "" || !strings.Contains(out, want) || !strings.Contains(out, "__complete") {
			t.Errorf("completion %s: exit %d, stderr %q, script lacks %q or the __complete call: %.200q", shell, code, errs, want, out)
		}
	}
	for args, want := range map[string]string{"tcsh": `no completion for shell "tcsh": want bash, zsh, fish or powershell`, "": "name the shell"} {
		code, out, errs := runCLI(t, ctx, "", strings.Fields("completion "+args)...)
		if code != exitUsage || out != "" || !strings.Contains(errs, want) {
			t.Errorf("completion %s: exit %d, stdout %.80q, stderr %q; want a usage error saying %q", args, code, out, errs, want)
		}
	}
	for _, c := range []struct {
		args []string
		want []string
		// directive is the last line: 4 no file names, 0 the default.
		directive string
	}{
		{[]string{"ma"}, []string{"mark\t"}, ":4"},
		{[]string{"check", "--cons"}, []string{"--consistency\t"}, ":4"},
		{[]string{"check", "--consistency", ""}, []string{"linearizable", "stale", "bounded"}, ":4"},
		{[]string{"mark", "--output", ""}, []string{"text", "json"}, ":4"},
		{[]string{"serve", "--raft-log-store", ""}, []string{"wal", "boltdb"}, ":4"},
		{[]string{"dev", "--log-level", ""}, []string{"debug", "info", "warn", "error"}, ":4"},
	} {
		code, out, errs := runCLI(t, ctx, "", append([]string{"__complete"}, c.args...)...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != exitOK || lines[len(lines)-1] != c.directive {
			t.Errorf("__complete %q: exit %d, stdout %q, stderr %q; want directive %s", c.args, code, out, errs, c.directive)
			continue
		}
		for _, w := range c.want {
			found := false
			for _, l := range lines {
				found = found || strings.HasPrefix(l+"\t", w)
			}
			if !found {
				t.Errorf("__complete %q: %q lacks %q", c.args, out, w)
			}
		}
	}
}
