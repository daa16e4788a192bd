package main

import (
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/server"
)

// regionFlags are serve's flags for regions, leader placement and Raft
// timing (docs/REGIONS.md).
type regionFlags struct {
	region           string
	preferredRegions string
	preferHold       time.Duration
	timing           string
	heartbeat        time.Duration
	election         time.Duration
	lease            time.Duration
	commit           time.Duration
}

var regionFlagNames = []string{
	"region", "preferred-leader-regions", "preferred-leader-hold",
	"raft-timing", "raft-heartbeat-timeout", "raft-election-timeout", "raft-leader-lease-timeout", "raft-commit-timeout",
}

// raftTiming is one --raft-timing preset.
type raftTiming struct{ heartbeat, election, lease, commit time.Duration }

// raftTimings are the --raft-timing presets. lan is hashicorp/raft's
// defaults. wan is for voters a WAN round trip (up to ~250 ms) apart: a
// leader heartbeats every heartbeat/10 (300 ms), so a follower misses ten
// of them before it stands for election, and the leader steps down only
// after 1.5 s without hearing a majority; the price is a slower failover
// (a dead leader is replaced in 3–6 s plus one election round trip
// instead of 1–2 s). The commit timeout stays 50 ms: it bounds how late an
// idle follower learns the commit index, which replicas' bounded reads
// need to be short.
var raftTimings = map[string]raftTiming{
	"lan": {heartbeat: time.Second, election: time.Second, lease: 500 * time.Millisecond, commit: 50 * time.Millisecond},
	"wan": {heartbeat: 3 * time.Second, election: 3 * time.Second, lease: 1500 * time.Millisecond, commit: 50 * time.Millisecond},
}

func addRegionFlags(fs *pflag.FlagSet, r *regionFlags) {
	fs.StringVar(&r.region, "region", "", "`NAME` of the region this node runs in (e.g. eu-west); recorded in the replicated node table, shown by status and members, used by clients' --region and by --preferred-leader-regions")
	fs.StringVar(&r.preferredRegions, "preferred-leader-regions", "", "cluster setting seeded at bootstrap (`LIST` of regions, comma-separated, first preferred): a leader outside them hands leadership to a caught-up voter inside (after --preferred-leader-hold); ignored once the cluster has the setting: change it with 'dedupnode cluster-setting'")
	fs.DurationVar(&r.preferHold, "preferred-leader-hold", 10*time.Second, "how long (`DUR`) a leader outside the preferred leader regions waits, while a caught-up voter inside exists, before handing leadership over; a node that gets leadership back soon after handing it away waits up to 16 times longer, so leadership does not flap")
	fs.StringVar(&r.timing, "raft-timing", "lan", "Raft timing `PRESET`: lan (heartbeat 1s, election 1s, leader lease 500ms, commit 50ms: hashicorp/raft's defaults) or wan (3s, 3s, 1.5s, 50ms: voters a WAN round trip apart); --raft-heartbeat-timeout, --raft-election-timeout, --raft-leader-lease-timeout and --raft-commit-timeout each override one of these values")
	fs.DurationVar(&r.heartbeat, "raft-heartbeat-timeout", 0, "a follower that hears no leader for this `DUR` (randomised up to 2x) stands for election; the leader heartbeats every DUR/10 (default: from --raft-timing)")
	fs.DurationVar(&r.election, "raft-election-timeout", 0, "a candidate that wins no election within this `DUR` (randomised up to 2x) starts another; at least --raft-heartbeat-timeout (default: from --raft-timing)")
	fs.DurationVar(&r.lease, "raft-leader-lease-timeout", 0, "a leader that hears no majority for this `DUR` steps down; at most --raft-heartbeat-timeout (default: from --raft-timing)")
	fs.DurationVar(&r.commit, "raft-commit-timeout", 0, "with no new entries, the leader tells followers the commit index after this `DUR` (default: from --raft-timing)")
}

// apply checks the flags and sets them in cfg. Every invalid value or
// combination is a usage error naming the flags.
func (r *regionFlags) apply(cfg *server.Config) error {
	if err := cluster.CheckRegion(r.region); err != nil {
		return usagef("--region: %v", err)
	}
	if r.preferredRegions != "" {
		rs, err := cluster.ParseRegions(r.preferredRegions)
		if err != nil {
			return usagef("--preferred-leader-regions: %v", err)
		}
		cfg.Cluster.SeedSettings = map[string]string{cluster.SettingPreferredLeaderRegions: strings.Join(rs, ",")}
	}
	if r.preferHold < 0 {
		return usagef("--preferred-leader-hold %v: want 0 (the default, 10s) or more", r.preferHold)
	}
	cfg.Cluster.Region = r.region
	cfg.Cluster.PreferHold = r.preferHold
	t, err := r.raftTiming()
	if err != nil {
		return err
	}
	cfg.Cluster.HeartbeatTimeout, cfg.Cluster.ElectionTimeout = t.heartbeat, t.election
	cfg.Cluster.LeaderLeaseTimeout, cfg.Cluster.CommitTimeout = t.lease, t.commit
	return nil
}

// raftTiming resolves --raft-timing and the four overrides, and checks
// hashicorp/raft's constraints (raft.ValidateConfig) with the flags named.
func (r *regionFlags) raftTiming() (raftTiming, error) {
	preset := r.timing
	if preset == "" {
		preset = "lan"
	}
	t, ok := raftTimings[preset]
	if !ok {
		return t, usagef("--raft-timing %q: want lan or wan", r.timing)
	}
	for _, o := range []struct {
		name string
		v    time.Duration
		dst  *time.Duration
		min  time.Duration
	}{
		{"--raft-heartbeat-timeout", r.heartbeat, &t.heartbeat, 5 * time.Millisecond},
		{"--raft-election-timeout", r.election, &t.election, 5 * time.Millisecond},
		{"--raft-leader-lease-timeout", r.lease, &t.lease, 5 * time.Millisecond},
		{"--raft-commit-timeout", r.commit, &t.commit, time.Millisecond},
	} {
		switch {
		case o.v < 0:
			return t, usagef("%s %v: want a positive duration (0 takes --raft-timing's)", o.name, o.v)
		case o.v == 0:
		case o.v < o.min:
			return t, usagef("%s %v: want at least %v (hashicorp/raft's minimum)", o.name, o.v, o.min)
		default:
			*o.dst = o.v
		}
	}
	if t.lease > t.heartbeat {
		return t, usagef("--raft-leader-lease-timeout %v exceeds --raft-heartbeat-timeout %v (--raft-timing %s): the leader lease must not be longer than the heartbeat timeout", t.lease, t.heartbeat, preset)
	}
	if t.election < t.heartbeat {
		return t, usagef("--raft-election-timeout %v is below --raft-heartbeat-timeout %v (--raft-timing %s): the election timeout must be at least the heartbeat timeout", t.election, t.heartbeat, preset)
	}
	return t, nil
}
