package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/chaos"
)

// Flags of chaos runs across regions (docs/REGIONS.md), kept apart.
func registerChaosRegionFlags(fs *pflag.FlagSet, cfg *chaos.Config) {
	fs.IntVar(&cfg.Replicas, "replicas", 0, "process mode: `N` read replicas (r1..rN) joining with --read-replica")
	fs.IntVar(&cfg.Regions, "regions", 0, "process mode: group the nodes into `K` regions (voter n_i and replica r_i in region ((i-1) mod K)+1) and add the region faults")
	fs.DurationVar(&cfg.WANDelay, "wan-delay", 0, "process mode with --regions: `DURATION` added one way on every Raft link between regions")
	fs.DurationVar(&cfg.Workload.MaxStaleness, "max-staleness", 0, "turn a third of the linearizable checks into bounded ones with this max staleness (`DURATION`; default 2s with --replicas)")
	fs.DurationVar(&cfg.ProbeDeadline, "probe-deadline", 2*time.Second, "deadline (`DURATION`) of each check on a cut-off region's replicas")
}

func chaosRegionFlagsValid(cfg *chaos.Config) error {
	switch {
	case cfg.Replicas < 0:
		return usagef("--replicas %d: want 0 or more", cfg.Replicas)
	case cfg.Regions < 0 || cfg.Regions == 1:
		return usagef("--regions %d: want 2 or more (or leave it out)", cfg.Regions)
	case cfg.WANDelay < 0 || (cfg.WANDelay > 0 && cfg.Regions < 2):
		return usagef("--wan-delay %v: needs --regions 2 or more and a positive delay", cfg.WANDelay)
	case cfg.Workload.MaxStaleness < 0 || cfg.Workload.MaxStaleness%time.Millisecond != 0:
		return usagef("--max-staleness %v: want a positive whole number of milliseconds", cfg.Workload.MaxStaleness)
	case cfg.ProbeDeadline <= 0:
		return usagef("--probe-deadline %v: want a positive duration", cfg.ProbeDeadline)
	case cfg.Mode == chaos.ModeDocker && (cfg.Replicas > 0 || cfg.Regions > 0):
		return usagef("--replicas and --regions run in --mode process only")
	}
	return nil
}
