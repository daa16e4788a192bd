package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/server"
)

// regionConfig parses args (and DEDUPNODE_* and a config file) into the
// region flags and applies them.
func regionConfig(t *testing.T, file string, args ...string) (server.Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	var r regionFlags
	addRegionFlags(fs, &r)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs, regionFlagNames...); err != nil {
		t.Fatal(err)
	}
	if file != "" {
		if err := applyConfigFile(fs, writeConfig(t, file), regionFlagNames); err != nil {
			t.Fatal(err)
		}
	}
	var cfg server.Config
	err := r.apply(&cfg)
	return cfg, err
}

func TestServe_RaftTimingPresetsAndOverrides(t *testing.T) {
	timing := func(c server.Config) [4]time.Duration {
		return [4]time.Duration{c.Cluster.HeartbeatTimeout, c.Cluster.ElectionTimeout, c.Cluster.LeaderLeaseTimeout, c.Cluster.CommitTimeout}
	}
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want [4]time.Duration
	}{
		{"default is lan", "", nil, nil, [4]time.Duration{time.Second, time.Second, 500 * time.Millisecond, 50 * time.Millisecond}},
		{"wan", "", nil, []string{"--raft-timing", "wan"}, [4]time.Duration{3 * time.Second, 3 * time.Second, 1500 * time.Millisecond, 50 * time.Millisecond}},
		{"override one", "", nil, []string{"--raft-timing", "wan", "--raft-commit-timeout", "20ms"}, [4]time.Duration{3 * time.Second, 3 * time.Second, 1500 * time.Millisecond, 20 * time.Millisecond}},
		{"env", "", map[string]string{"DEDUPNODE_RAFT_TIMING": "wan", "DEDUPNODE_RAFT_ELECTION_TIMEOUT": "5s"}, nil, [4]time.Duration{3 * time.Second, 5 * time.Second, 1500 * time.Millisecond, 50 * time.Millisecond}},
		{"file", "raft-timing: wan\nraft-heartbeat-timeout: 2s\n", nil, []string{"--raft-leader-lease-timeout", "1s"}, [4]time.Duration{2 * time.Second, 3 * time.Second, time.Second, 50 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := regionConfig(t, tc.file, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got := timing(cfg); got != tc.want {
				t.Fatalf("heartbeat, election, lease, commit = %v, want %v", got, tc.want)
			}
		})
	}
}

// Invalid timing combinations are usage errors naming the flags involved,
// through the whole command (nothing starts).
func TestServe_RaftTimingInvalidIsUsageError(t *testing.T) {
	dir := t.TempDir()
	base := []string{"serve", "--node-id", "n1", "--data-dir", dir, "--bootstrap"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--raft-leader-lease-timeout", "2s"}, []string{"--raft-leader-lease-timeout 2s", "--raft-heartbeat-timeout 1s"}},
		{[]string{"--raft-timing", "wan", "--raft-heartbeat-timeout", "1s"}, []string{"--raft-leader-lease-timeout 1.5s", "--raft-heartbeat-timeout 1s", "--raft-timing wan"}},
		{[]string{"--raft-election-timeout", "500ms"}, []string{"--raft-election-timeout 500ms", "--raft-heartbeat-timeout 1s"}},
		{[]string{"--raft-heartbeat-timeout", "1ms"}, []string{"--raft-heartbeat-timeout 1ms", "at least 5ms"}},
		{[]string{"--raft-commit-timeout", "-1s"}, []string{"--raft-commit-timeout -1s"}},
		{[]string{"--raft-timing", "moon"}, []string{`--raft-timing "moon"`, "lan or wan"}},
		{[]string{"--region", "eu west"}, []string{"--region", `"eu west"`}},
		{[]string{"--preferred-leader-regions", "us,e/u"}, []string{"--preferred-leader-regions", `"e/u"`}},
	} {
		code, out, errs := runCLI(t, context.Background(), "", append(base, tc.args...)...)
		if code != exitUsage || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, want a usage error; stderr %q", tc.args, code, out, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Fatalf("%v: stderr %q lacks %q", tc.args, errs, w)
			}
		}
	}
}

func TestServe_RegionFlags(t *testing.T) {
	cfg, err := regionConfig(t, "", "--region", "eu-west", "--preferred-leader-regions", " us-east, eu-west,us-east", "--preferred-leader-hold", "3s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster.Region != "eu-west" || cfg.Cluster.PreferHold != 3*time.Second {
		t.Fatalf("region %q, hold %v", cfg.Cluster.Region, cfg.Cluster.PreferHold)
	}
	if got := cfg.Cluster.SeedSettings[cluster.SettingPreferredLeaderRegions]; got != "us-east,eu-west" {
		t.Fatalf("seeded preferred regions %q, want us-east,eu-west", got)
	}
	if cfg, _ = regionConfig(t, ""); cfg.Cluster.SeedSettings != nil {
		t.Fatalf("no --preferred-leader-regions must seed nothing, got %v", cfg.Cluster.SeedSettings)
	}
}

func TestWanSim_BadFlagsAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"wan-sim", "--us-eu", "-1ms"}, {"wan-sim", "--duration", "0s"}} {
		code, _, errs := runCLI(t, context.Background(), "", args...)
		if code != exitUsage || !strings.Contains(errs, args[1]) {
			t.Fatalf("%v: exit %d, stderr %q; want a usage error naming %s", args, code, errs, args[1])
		}
	}
}

// The --raft-timing help names the flags that override its values: help
// lists flags sorted by name, so "the flags below" pointed at the wrong
// ones.
func TestRaftTimingHelpNamesItsOverrides(t *testing.T) {
	code, out, errs := runCLI(t, context.Background(), "", "serve", "--help")
	if code != exitOK {
		t.Fatalf("serve --help: exit %d: %s", code, errs)
	}
	var usage string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "--raft-timing PRESET") {
			usage = l
		}
	}
	if usage == "" || strings.Contains(usage, "below") || strings.Contains(usage, "above") {
		t.Fatalf("--raft-timing help %q: want it without a position", usage)
	}
	for _, name := range []string{"raft-heartbeat-timeout", "raft-election-timeout", "raft-leader-lease-timeout", "raft-commit-timeout"} {
		if !strings.Contains(usage, "--"+name) {
			t.Errorf("--raft-timing help %q does not name --%s", usage, name)
		}
	}
}
