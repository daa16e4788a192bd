package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/server"
)

// Read replica flags of serve (docs/REGIONS.md).
func registerReplicaFlags(fs *pflag.FlagSet, f *serveFlags) {
	fs.BoolVar(&f.readReplica, "read-replica", false, "with --join: join as a read replica, a permanent non-voter that applies the log and answers stale, bounded and linearizable checks near its callers; it never votes, never counts toward a commit and is promoted only by 'dedupnode promote'")
	fs.StringVar(&f.raftAdvertise, "raft-advertise", "", "`HOST:PORT` other nodes dial for Raft when it differs from --raft-addr (a proxy or NAT in between); default --raft-addr")
	fs.DurationVar(&f.maxClockOff, "max-clock-offset", server.DefaultMaxClockOffset, "largest difference (`DURATION`) assumed between any two nodes' clocks; a bounded check is answered locally only when the last applied leader timestamp is within --max-staleness minus this (give every node the same value)")
}

func (f *serveFlags) replicaConfig(cfg *server.Config) error {
	if f.readReplica && (f.bootstrap || f.peers != "") {
		return usagef("--read-replica goes with --join only: a replica never bootstraps a cluster (--bootstrap, --peers)")
	}
	if f.readReplica && len(f.join) == 0 && !hasState(f.dataDir) {
		return usagef("--read-replica needs --join ADDR: a read replica joins a running cluster")
	}
	if f.maxClockOff <= 0 || f.maxClockOff%time.Millisecond != 0 {
		return usagef("--max-clock-offset %v: want a positive whole number of milliseconds, e.g. 500ms", f.maxClockOff)
	}
	cfg.ReadReplica = f.readReplica
	cfg.Cluster.RaftAdvertise = f.raftAdvertise
	cfg.MaxClockOffset = f.maxClockOff
	return nil
}
