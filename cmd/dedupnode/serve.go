package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/dedupnode/dedupnode/auth"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/internal/diskspace"
	"github.com/dedupnode/dedupnode/metrics"
	"github.com/dedupnode/dedupnode/security"
	"github.com/dedupnode/dedupnode/server"
	"github.com/dedupnode/dedupnode/storage"
)

// serveFlags are the flags of serve; each can also come from the
// environment as DEDUPNODE_<FLAG>.
// defaultBackgroundNice is serve --background-nice's default: the nice
// value RocksDB users commonly give compaction threads, measured against
// 0 (off) in docs/PERFORMANCE.md.
const defaultBackgroundNice = 10

type serveFlags struct {
	nodeID        string
	dataDir       string
	raftAddr      string
	grpcAddr      string
	grpcAdvertise string
	bootstrap     bool
	peers         string
	join          []string
	readReplica   bool
	maxClockOff   time.Duration
	raftAdvertise string
	autoCreate    bool
	maxBatch      int
	bloomExpected uint
	bloomFPRate   float64
	snapThreshold uint64
	snapInterval  time.Duration
	trailingLogs  uint64
	maxLogBytes   string
	raftLogStore  string
	logLevel      string
	logFormat     string
	tlsCert       string
	tlsKey        string
	tlsCA         string
	tlsClientCA   string
	authFile      string
	adminAddr     string
	memoryLimit   string
	minFreeDisk   string
	memtableSize  string
	maxEntryBytes string
	logStall      time.Duration
	configFile    string
	regions       regionFlags // serve_regions.go

	// reload re-reads certificates and the token file (SIGHUP); set by
	// config when there is anything to reload.
	reload func() error
	// started, if set, runs once the server is up (registers extra
	// metrics).
	started func(*server.Server)

	backgroundNice int
}

var serveFlagNames = []string{
	"node-id", "data-dir", "raft-addr", "grpc-addr", "grpc-advertise", "bootstrap", "peers", "join",
	"auto-create-namespaces", "max-batch", "bloom-expected-per-bucket", "bloom-fp-rate",
	"raft-snapshot-threshold", "raft-snapshot-interval", "raft-trailing-logs", "raft-log-max-bytes",
	"raft-log-store", "log-level", "log-format",
	"tls-cert", "tls-key", "tls-ca", "tls-client-ca", "auth-file", "admin-addr",
	"memory-limit", "min-free-disk", "fsm-memtable-size", "max-entry-bytes", "raft-log-stall-timeout",
	"background-nice",
}

// Read replica flags (docs/REGIONS.md), kept apart from the others.
var serveReplicaFlagNames = []string{"read-replica", "max-clock-offset", "raft-advertise"}

func init() { serveFlagNames = append(serveFlagNames, serveReplicaFlagNames...) }
func init() { serveFlagNames = append(serveFlagNames, regionFlagNames...) }

const serveLong = `Serve runs one dedupnode node until SIGINT or SIGTERM, then shuts down
cleanly (handing leadership to another node first when it leads).

A new node needs exactly one way to find its cluster:
  --bootstrap           form a new one-node cluster (add more with --join)
  --peers LIST          form a static cluster; give the SAME list to every
                        node: id=raft_addr=grpc_addr,... including this node
  --join ADDR[,ADDR]    join a running cluster through any member's gRPC
                        address; the node votes once it has caught up
                        (with --read-replica: never; it serves reads)
A node whose --data-dir already holds state needs none of them: it rejoins
its cluster from what it stored.

Security (see 'dedupnode certs --help' for a development CA):
  --tls-cert/--tls-key/--tls-ca   TLS for gRPC and for Raft; Raft is mutually
                        authenticated, so a node whose certificate another
                        CA signed cannot join or send Raft traffic
  --tls-client-ca FILE  clients must present a certificate signed by FILE
  --auth-file FILE      require tokens (JSON token file, reread on SIGHUP
                        together with the certificates)

Observability: --admin-addr serves Prometheus metrics at /metrics, a status
page at / and /healthz.

Every flag can also be set in the environment as DEDUPNODE_<FLAG>, upper
case with '-' as '_' (DEDUPNODE_NODE_ID, DEDUPNODE_PEERS, ...), or in a YAML
file given with --config (or DEDUPNODE_CONFIG) whose keys are the flag
names:

  node-id: n1
  data-dir: /var/lib/dedupnode
  peers: [n1=10.0.0.1:7000=10.0.0.1:7070, n2=10.0.0.2:7000=10.0.0.2:7070]
  admin-addr: 127.0.0.1:9090

Precedence, highest first: command line, environment, config file,
defaults. An unknown key in the file is an error that names it.`

const serveExample = `  # a three-node cluster on one machine, one terminal per node
  dedupnode serve --node-id n1 --data-dir data/n1 --raft-addr 127.0.0.1:7000 --grpc-addr 127.0.0.1:7070 \
    --peers n1=127.0.0.1:7000=127.0.0.1:7070,n2=127.0.0.1:7001=127.0.0.1:7071,n3=127.0.0.1:7002=127.0.0.1:7072
  # (n2 and n3 alike, with their own --node-id, --data-dir and addresses)

  # a single node, then a second one joining it
  dedupnode serve --node-id a --data-dir data/a --bootstrap
  dedupnode serve --node-id b --data-dir data/b --raft-addr 127.0.0.1:7001 --grpc-addr 127.0.0.1:7071 --join 127.0.0.1:7070`

func newServeCmd(e *env) *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:     "serve --node-id ID --data-dir DIR [--bootstrap | --peers LIST | --join ADDR] [flags]",
		Short:   "Run a dedupnode node",
		Long:    serveLong,
		Example: strings.ReplaceAll(serveExample, "dedupnode ", e.progName+" "),
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags(), append(slices.Clip(serveFlagNames), "config")...); err != nil {
				return err
			}
			if f.configFile != "" {
				if err := applyConfigFile(cmd.Flags(), f.configFile, serveFlagNames); err != nil {
					return err
				}
			}
			cfg, logger, err := f.config(e.stderr)
			if err != nil {
				return err
			}
			if n := cfg.Cluster.FSM.Storage.BackgroundNice; n > 0 && storage.CanLowerPriority && os.Getenv("GOMAXPROCS") == "" {
				// One P more than the cores: a background thread the
				// kernel has set aside still holds its P (storage/background.go).
				procs := runtime.GOMAXPROCS(0) + 1
				runtime.GOMAXPROCS(procs)
				logger.Debug("background work at lower priority", "nice", n, "gomaxprocs", procs)
			}
			if limit, _ := parseByteSize(f.memoryLimit); limit > 0 {
				debug.SetMemoryLimit(limit) // process-wide, like GOMEMLIMIT
				logger.Info("Go memory limit set", "bytes", limit)
			}
			return serve(e.ctx, cfg, logger, f.reload, f.started)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.nodeID, "node-id", "", "this node's `ID`, unique across all time (a replaced machine gets a new ID); no ',' or '=', which separate --peers")
	fs.StringVar(&f.dataDir, "data-dir", "", "`DIR` for the Raft log, snapshots and the ID store; created if missing")
	fs.StringVar(&f.raftAddr, "raft-addr", "127.0.0.1:7000", "`HOST:PORT` for Raft traffic between nodes, as the other nodes reach it (every interface, e.g. 0.0.0.0:7000, needs --raft-advertise)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:7070", "`HOST:PORT` for clients (gRPC), as clients and other nodes reach it (every interface, e.g. 0.0.0.0:7070, needs --grpc-advertise)")
	fs.StringVar(&f.grpcAdvertise, "grpc-advertise", "", "`HOST:PORT` clients and other nodes dial for gRPC when it differs from --grpc-addr (a container's port mapping, a proxy); default --grpc-addr")
	fs.BoolVar(&f.bootstrap, "bootstrap", false, "form a new one-node cluster (only on first start)")
	fs.StringVar(&f.peers, "peers", "", "form a static cluster: `id=raft_addr=grpc_addr,...`, the same list on every node, this node included")
	fs.StringSliceVar(&f.join, "join", nil, "join a running cluster through these gRPC `ADDR`s of its members")
	fs.BoolVar(&f.autoCreate, "auto-create-namespaces", false, "create a namespace with default settings the first time a write names it (dev and tests); a check of one that does not exist is NotFound either way")
	fs.IntVar(&f.maxBatch, "max-batch", 10000, "most IDs (`N`) accepted in one request")
	fs.UintVar(&f.bloomExpected, "bloom-expected-per-bucket", 100000, "`N` IDs each expiry bucket's Bloom filter is sized for (more chain extra filters)")
	fs.Float64Var(&f.bloomFPRate, "bloom-fp-rate", 0.01, "target Bloom filter false-positive `RATE`, in (0, 0.5]")
	fs.Uint64Var(&f.snapThreshold, "raft-snapshot-threshold", 8192, "take a Raft snapshot once `N` log entries follow the last one (checked every --raft-snapshot-interval)")
	fs.DurationVar(&f.snapInterval, "raft-snapshot-interval", 2*time.Minute, "how often (`DUR`, randomised up to 2x) to check --raft-snapshot-threshold")
	fs.Uint64Var(&f.trailingLogs, "raft-trailing-logs", 10240, "Raft log entries (`N`) kept behind a snapshot, so a follower that fell behind by fewer catches up from the log, not a whole snapshot; one entry holds up to thousands of IDs under load, so lower it to bound the log's disk use")
	fs.StringVar(&f.maxLogBytes, "raft-log-max-bytes", "256MiB", "bound the Raft log at `SIZE` of entries, beside --raft-trailing-logs and --raft-snapshot-threshold in entries: a node keeps behind a snapshot only the newest entries that fit in SIZE less a step, and takes a snapshot once that truncates a step of log (SIZE/16, or a quarter of the latest snapshot when larger: a store over twice SIZE may keep SIZE/2 and a quarter of a snapshot); at least twice --max-entry-bytes (docs/OPERATIONS.md, Raft log retention)")
	fs.StringVar(&f.raftLogStore, "raft-log-store", "", "Raft log and stable store: `STORE` wal (segment files, one fsync per append, disk returned after a snapshot) or boltdb (raft-boltdb); a data dir keeps the store it was created with (docs/OPERATIONS.md to move a node) (default: the store the data dir holds, wal for a new one)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `LEVEL`: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log `FORMAT` on stderr: text or json")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "this node's certificate `FILE` (PEM); turns on TLS for gRPC and Raft (needs --tls-key and --tls-ca)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key `FILE` (PEM) of --tls-cert")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "cluster CA `FILE` (PEM): verifies other nodes on Raft (mutual TLS) and gRPC")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA `FILE` (PEM) that must have signed every gRPC client's certificate: turns on mutual TLS for clients (must also accept the node certificates, e.g. the cluster CA)")
	fs.StringVar(&f.authFile, "auth-file", "", "JSON token `FILE` mapping tokens to namespaces and rights (read, write, admin, node); every call then needs a token; reread on SIGHUP")
	fs.StringVar(&f.configFile, "config", "", "YAML `FILE` whose keys are these flags' names (node-id: n1, peers: [...], tls-cert: ...); the command line and DEDUPNODE_* variables take precedence over it; an unknown key is an error")
	fs.StringVar(&f.memoryLimit, "memory-limit", "", "soft limit (`SIZE`, e.g. 768MiB or 1GiB) on the Go runtime's memory: the garbage collector runs more often near it instead of letting the heap double (GOGC); Pebble's block cache and memtables and the mmapped Raft log are outside it; off when empty (GOMEMLIMIT still applies)")
	fs.StringVar(&f.minFreeDisk, "min-free-disk", "auto", "refuse client writes while the data dir's filesystem has less than `SIZE` free (e.g. 1GiB): they fail with gRPC RESOURCE_EXHAUSTED, ErrorInfo reason DISK_FULL (client.ErrDiskFull in the Go client), nothing written; reads are still served; \"auto\": 64MiB plus twice the ID store's size on disk, room for a snapshot and a compaction; writes resume by themselves once space is back")
	registerReplicaFlags(fs, f)
	fs.StringVar(&f.memtableSize, "fsm-memtable-size", "auto", "Pebble memtable `SIZE` of the ID store; its write-ahead log preallocates 1.1x this per file and up to 8 files exist under a burst, so a node's disk use starts near 9x this (see docs/OPERATIONS.md, Disks); \"auto\": 1/64 of the data dir's filesystem, from 2MiB to 32MiB")
	fs.IntVar(&f.backgroundNice, "background-nice", defaultBackgroundNice, "lower the CPU priority of the threads running the ID store's flushes, compactions and buffer commits by `N` nice steps (1-19; at most nice 19), so they use the CPU that calls leave free; the process then runs with GOMAXPROCS one above its cores unless GOMAXPROCS is set; 0: the node's own priority; Linux only")
	fs.StringVar(&f.maxEntryBytes, "max-entry-bytes", "16MiB", "largest Raft entry (`SIZE`); a request encoding to more is refused with RESOURCE_EXHAUSTED before anything is written, and gRPC refuses messages larger than this plus 1MiB")
	fs.DurationVar(&f.logStall, "raft-log-stall-timeout", 3*time.Second, "a Raft log write running longer than `DUR` marks the disk stalled: the node stops leading and replicating (the others elect a leader) and reports NOT_SERVING until the write returns")
	fs.StringVar(&f.adminAddr, "admin-addr", "", "`HOST:PORT` for the admin HTTP listener: /metrics (Prometheus), / (status page), /healthz; off when empty")
	addRegionFlags(fs, &f.regions)
	return cmd
}

// newLogger builds the one slog logger threaded through the node.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	l, _, err := newLeveledLogger(w, level, format)
	return l, err
}

// newLeveledLogger is newLogger with the level variable exposed, so that
// the caller can quiet the logger later.
func newLeveledLogger(w io.Writer, level, format string) (*slog.Logger, *slog.LevelVar, error) {
	lv := &slog.LevelVar{}
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), lv, nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), lv, nil
	}
	return nil, nil, usagef("--log-format %q: want text or json", format)
}

// parseByteSize parses a size such as 1073741824, 768MiB, 1GiB or 512M
// (K, M, G and the KiB/MiB/GiB forms are all powers of 1024); "" is 0.
func parseByteSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	num := strings.TrimRightFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	unit := strings.ToUpper(strings.TrimSpace(s[len(num):]))
	mult := map[string]float64{"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
		"M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}[unit]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || v < 0 {
		return 0, fmt.Errorf("want a size such as 768MiB or 1GiB")
	}
	return int64(v * mult), nil
}

// autoMemtable sizes Pebble's memtable at 1/64 of the filesystem that will
// hold dir (its nearest existing ancestor), from 2 MiB to 32 MiB: Pebble
// preallocates every WAL file at 110% of it, so a small volume gets a
// footprint in proportion (see docs/OPERATIONS.md, Disks).
func autoMemtable(dir string) int64 {
	const lo, hi = 2 << 20, 32 << 20
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, total, err := diskspace.Free(d); err == nil {
			return min(max(int64(total/64), lo), hi)
		}
		if d == filepath.Dir(d) {
			return hi
		}
	}
}

// minFreeFits refuses a --min-free-disk (flag as given, minFree its size,
// 0 for auto) that the data dir's volume can never have free with the node
// on it, its resume margin included: the node would start and never take a
// write. Auto is judged at an empty store, where it is lowest: beyond that
// a growing store is what the threshold is for.
func minFreeFits(dir, flag string, minFree, memtable uint64, ls cluster.LogStore) error {
	capacity, _, err := diskspace.CapacityNearest(dir)
	if err != nil {
		return nil // the node's start check reports a volume it cannot measure
	}
	own := cluster.OwnFootprint(memtable, ls)
	most := capacity - min(own, capacity)
	threshold, what := minFree, "--min-free-disk "+flag
	if minFree == 0 {
		threshold = cluster.AutoMinFreeDiskEmpty(memtable)
		what = fmt.Sprintf("--min-free-disk auto (%s with an empty store, plus twice the store)", humanBytes(threshold))
	}
	resume := diskspace.ResumeAt(threshold)
	if resume < most {
		return nil
	}
	fix := fmt.Sprintf("use a volume of at least %s", humanBytes(own+resume+1<<20))
	const mib = 1 << 20
	lo := (cluster.MinFreeDiskFloor(memtable, ls) + mib - 1) / mib * mib
	if hi := (most - min(most, 1)) * 16 / 17 / mib * mib; hi >= lo {
		fix += fmt.Sprintf(", or give a fixed --min-free-disk from %s to %s", humanBytes(lo), humanBytes(hi))
	}
	return usagef("%s cannot fit the volume of data dir %s: writes resume only once %s are free, but the volume holds %s, and the node's own files take at least %s of it, so it can never have more than %s free: the node would never take a write; %s",
		what, dir, humanBytes(resume), humanBytes(capacity), humanBytes(own), humanBytes(most), fix)
}

// walFloorNote names the part of the free-space floor that comes from the
// log store.
func walFloorNote(memtable uint64, ls cluster.LogStore) string {
	if seg := cluster.MinFreeDiskFloor(memtable, ls) - cluster.DiskReserve(memtable); seg > 0 {
		return " and one " + humanBytes(seg) + " Raft log segment"
	}
	return ""
}

// logStore is the Raft log store to open: the one --raft-log-store names,
// which must be the one the data dir holds, or, when the flag is not given,
// the one the data dir holds (DefaultLogStore for a new node), so that a
// node created before wal became the default starts after an upgrade
// without a new flag.
func (f *serveFlags) logStore() (cluster.LogStore, error) {
	if f.raftLogStore == "" {
		found, err := cluster.DetectLogStore(f.dataDir)
		if err != nil {
			return "", usagef("%v", err)
		}
		if found == "" {
			return cluster.DefaultLogStore, nil
		}
		return found, nil
	}
	ls, err := cluster.ParseLogStore(f.raftLogStore)
	if err != nil {
		return "", usagef("--raft-log-store %q: want wal or boltdb", f.raftLogStore)
	}
	if err := cluster.CheckLogStore(f.dataDir, ls); err != nil {
		return "", usagef("%v", err)
	}
	return ls, nil
}

// hasState reports whether dir already holds a node's Raft state (either
// store's log; both at once counts too, and the node refuses to start).
func hasState(dir string) bool {
	ls, err := cluster.DetectLogStore(dir)
	return err != nil || ls != ""
}

// parsePeers parses "id=raft=grpc,id=raft=grpc".
func parsePeers(s string) ([]cluster.Peer, error) {
	var out []cluster.Peer
	seen := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		parts := strings.Split(p, "=")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return nil, usagef("--peers entry %q: want id=raft_addr=grpc_addr, e.g. n1=127.0.0.1:7000=127.0.0.1:7070 (',' separates the entries and '=' the fields, so neither can be part of a node ID)", p)
		}
		if err := checkNodeIDFlag(fmt.Sprintf("--peers entry %q: node id", p), parts[0]); err != nil {
			return nil, err
		}
		// Each is an address the other nodes dial: a node listed at one
		// they cannot ("b=foo=bar") was waited for forever.
		if err := cluster.CheckHostPort(parts[1]); err != nil {
			return nil, usagef("--peers entry %q: raft_addr %v", p, err)
		}
		if err := cluster.CheckHostPort(parts[2]); err != nil {
			return nil, usagef("--peers entry %q: grpc_addr %v", p, err)
		}
		if seen[parts[0]] {
			return nil, usagef("--peers: node id %q appears twice", parts[0])
		}
		seen[parts[0]] = true
		out = append(out, cluster.Peer{ID: parts[0], RaftAddr: parts[1], GRPCAddr: parts[2]})
	}
	if len(out) == 0 {
		return nil, usagef("--peers is empty: want id=raft_addr=grpc_addr,...")
	}
	return out, nil
}

func (f *serveFlags) config(logOut io.Writer) (server.Config, *slog.Logger, error) {
	var cfg server.Config
	if f.nodeID == "" {
		return cfg, nil, usagef("--node-id is required: a name for this node, unique across all time (e.g. --node-id n1)")
	}
	if err := checkNodeIDFlag("--node-id", f.nodeID); err != nil {
		return cfg, nil, err
	}
	if f.dataDir == "" {
		return cfg, nil, usagef("--data-dir is required: where this node keeps its data (e.g. --data-dir data/%s)", f.nodeID)
	}
	// A data dir with state keeps the ID it was made with, even one from
	// before the rule on separators.
	if !hasState(f.dataDir) {
		if err := checkNewNodeIDFlag("--node-id", f.nodeID); err != nil {
			return cfg, nil, err
		}
	}
	modes := 0
	if f.bootstrap {
		modes++
	}
	if f.peers != "" {
		modes++
	}
	if len(f.join) > 0 {
		modes++
	}
	if modes > 1 {
		return cfg, nil, usagef("give only one of --bootstrap, --peers and --join")
	}
	if modes == 0 && !hasState(f.dataDir) {
		return cfg, nil, usagef("%s holds no state yet: give one of --bootstrap (new cluster), --peers LIST (static cluster) or --join ADDR (join a running one)", f.dataDir)
	}
	if err := f.checkAddrs(); err != nil {
		return cfg, nil, err
	}
	if f.maxBatch < 1 {
		return cfg, nil, usagef("--max-batch must be at least 1")
	}
	logStore, err := f.logStore()
	if err != nil {
		return cfg, nil, err
	}
	if f.snapThreshold == 0 {
		return cfg, nil, usagef("--raft-snapshot-threshold 0: want at least 1 log entry, e.g. 8192")
	}
	if f.trailingLogs == 0 {
		return cfg, nil, usagef("--raft-trailing-logs 0: want at least 1 log entry, e.g. 10240")
	}
	if f.snapInterval < time.Second {
		return cfg, nil, usagef("--raft-snapshot-interval %v: want at least 1s, e.g. 2m", f.snapInterval)
	}
	if f.bloomFPRate <= 0 || f.bloomFPRate > 0.5 {
		return cfg, nil, usagef("--bloom-fp-rate %v: want a rate in (0, 0.5], e.g. 0.01", f.bloomFPRate)
	}
	if f.bloomExpected < 1 {
		return cfg, nil, usagef("--bloom-expected-per-bucket must be at least 1")
	}
	if _, err := parseByteSize(f.memoryLimit); err != nil {
		return cfg, nil, usagef("--memory-limit %q: %v", f.memoryLimit, err)
	}
	var minFree int64
	if f.minFreeDisk != "auto" && f.minFreeDisk != "" {
		if minFree, err = parseByteSize(f.minFreeDisk); err != nil || minFree <= 0 {
			return cfg, nil, usagef("--min-free-disk %q: want a size such as 512MiB or 2GiB, or auto", f.minFreeDisk)
		}
	}
	var memtable int64
	if f.memtableSize == "auto" || f.memtableSize == "" {
		memtable = autoMemtable(f.dataDir)
	} else if memtable, err = parseByteSize(f.memtableSize); err != nil || memtable < 1<<20 || memtable > 4<<30 {
		return cfg, nil, usagef("--fsm-memtable-size %q: want a size from 1MiB to 4GiB, e.g. 32MiB, or auto", f.memtableSize)
	}
	if floor := cluster.MinFreeDiskFloor(uint64(memtable), logStore); minFree > 0 && uint64(minFree) < floor {
		return cfg, nil, usagef("--min-free-disk %s is below the %s a node needs to go on applying and logging with --fsm-memtable-size %s and --raft-log-store %s (the apply reserve%s): raise it or lower the memtable size",
			f.minFreeDisk, humanBytes(floor), f.memtableSize, logStore, walFloorNote(uint64(memtable), logStore))
	}
	if err := minFreeFits(f.dataDir, f.minFreeDisk, uint64(minFree), uint64(memtable), logStore); err != nil {
		return cfg, nil, err
	}
	maxEntry := int64(cluster.DefaultMaxEntryBytes)
	if f.maxEntryBytes != "" {
		maxEntry, err = parseByteSize(f.maxEntryBytes)
	}
	if err != nil || maxEntry < 64<<10 || maxEntry > 1<<30 {
		return cfg, nil, usagef("--max-entry-bytes %q: want a size from 64KiB to 1GiB, e.g. 16MiB", f.maxEntryBytes)
	}
	maxLog := int64(cluster.DefaultMaxLogBytes)
	if f.maxLogBytes != "" {
		maxLog, err = parseByteSize(f.maxLogBytes)
	}
	if err != nil || maxLog < 2*maxEntry {
		return cfg, nil, usagef("--raft-log-max-bytes %q: want a size of at least twice --max-entry-bytes (%s), e.g. 256MiB", f.maxLogBytes, humanBytes(uint64(2*maxEntry)))
	}
	if f.logStall != 0 && f.logStall < 100*time.Millisecond {
		return cfg, nil, usagef("--raft-log-stall-timeout %v: want at least 100ms, e.g. 3s", f.logStall)
	}
	logger, err := newLogger(logOut, f.logLevel, f.logFormat)
	if err != nil {
		return cfg, nil, err
	}
	// Another node's data dir is the first thing to say: whatever else is
	// wrong with the flags (a --peers list without this node), the node
	// would not start as this one.
	if recorded, err := cluster.RecordedNodeID(f.dataDir); err == nil && recorded != "" && recorded != f.nodeID {
		return cfg, nil, &opError{err: &cluster.NodeIDMismatchError{DataDir: f.dataDir, Recorded: recorded, Given: f.nodeID, Evidence: "recorded at first start"}}
	}
	if (f.bootstrap || f.peers != "") && hasState(f.dataDir) {
		// Raft ignores a bootstrap over existing state: the node restarts
		// as the member its data dir records. Say so, so that nobody
		// believes a new cluster was formed.
		mode := "--bootstrap"
		if f.peers != "" {
			mode = "--peers"
		}
		logger.Warn(fmt.Sprintf("%s already holds a cluster's state: %s is ignored and the node restarts as the member recorded there; for a new cluster use a fresh --data-dir, and leave %s out on restarts", f.dataDir, mode, mode))
	}
	var peers []cluster.Peer
	if f.peers != "" {
		if peers, err = parsePeers(f.peers); err != nil {
			return cfg, nil, err
		}
		self := false
		for _, p := range peers {
			self = self || p.ID == f.nodeID
		}
		if !self {
			return cfg, nil, usagef("--peers must include this node (--node-id %s)", f.nodeID)
		}
	}
	cfg = server.Config{
		Cluster: cluster.Config{
			NodeID:    f.nodeID,
			DataDir:   f.dataDir,
			RaftAddr:  f.raftAddr,
			GRPCAddr:  f.grpcAdvertised(),
			Bootstrap: f.bootstrap,
			Peers:     peers,
			Logger:    logger,
			LogStore:  logStore,
		},
		ListenAddr:           f.grpcAddr,
		AutoCreateNamespaces: f.autoCreate,
		MaxBatch:             f.maxBatch,
		Join:                 f.join,
	}
	if err := f.replicaConfig(&cfg); err != nil {
		return cfg, nil, err
	}
	cfg.Cluster.FSM.Bloom.ExpectedPerBucket = f.bloomExpected
	cfg.Cluster.FSM.Bloom.FPRate = f.bloomFPRate
	cfg.Cluster.SnapshotThreshold = f.snapThreshold
	cfg.Cluster.SnapshotInterval = f.snapInterval
	cfg.Cluster.TrailingLogs = f.trailingLogs
	cfg.Cluster.MinFreeDisk = uint64(minFree)
	cfg.Cluster.FSM.Storage.MemTableBytes = uint64(memtable)
	if f.backgroundNice < 0 || f.backgroundNice > 19 {
		return cfg, nil, usagef("--background-nice %d: want 0 (off) to 19", f.backgroundNice)
	}
	cfg.Cluster.FSM.Storage.BackgroundNice = f.backgroundNice
	cfg.Cluster.MaxEntryBytes = int(maxEntry)
	cfg.Cluster.MaxLogBytes = uint64(maxLog)
	cfg.Cluster.LogStallTimeout = f.logStall
	cfg.AdminAddr = f.adminAddr
	cfg.Version = versionString()
	if err := f.regions.apply(&cfg); err != nil {
		return cfg, nil, err
	}
	if err := f.security(&cfg, logger); err != nil {
		return cfg, nil, err
	}
	return cfg, logger, nil
}

// security sets up TLS (gRPC, node-to-node gRPC and Raft) and access
// control from the flags, and f.reload for SIGHUP.
func (f *serveFlags) security(cfg *server.Config, logger *slog.Logger) error {
	var reloads []func() error
	tlsOn := f.tlsCert != "" || f.tlsKey != ""
	switch {
	case tlsOn && (f.tlsCert == "" || f.tlsKey == ""):
		return usagef("--tls-cert and --tls-key go together")
	case tlsOn && f.tlsCA == "":
		return usagef("--tls-cert needs --tls-ca, the CA that signed the other nodes' certificates (Raft traffic is mutually authenticated)")
	case !tlsOn && (f.tlsCA != "" || f.tlsClientCA != ""):
		return usagef("--tls-ca and --tls-client-ca need --tls-cert and --tls-key")
	}
	if tlsOn {
		kp, err := security.LoadKeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return usagef("%v", err)
		}
		if leaf := kp.Certificate().Leaf; !security.IsNodeCertificate(leaf) {
			return usagef("--tls-cert %s (%q) is a client-only certificate and cannot serve; give the node's certificate (is a client's DEDUPNODE_TLS_CERT set in this shell?)", f.tlsCert, leaf.Subject.CommonName)
		}
		reloads = append(reloads, kp.Reload)
		f.started = func(srv *server.Server) {
			srv.Metrics().Registry().MustRegister(metrics.CertExpiry("node", func() time.Time { return kp.Certificate().Leaf.NotAfter }))
		}
		srvTLS, err := security.ServerTLS(kp, f.tlsClientCA, f.tlsCA)
		if err != nil {
			return usagef("%v", err)
		}
		peerTLS, err := security.ClientTLS(f.tlsCA, kp, "")
		if err != nil {
			return usagef("%v", err)
		}
		rsrv, rcli, err := security.RaftTLS(kp, f.tlsCA)
		if err != nil {
			return usagef("%v", err)
		}
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.Creds(credentials.NewTLS(srvTLS)))
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(credentials.NewTLS(peerTLS)))
		cfg.Cluster.WrapRaftStream = func(inner raft.StreamLayer) raft.StreamLayer {
			return security.WrapStreamLayer(inner, rsrv, rcli)
		}
	}
	if f.authFile != "" {
		store, err := auth.Load(f.authFile)
		if err != nil {
			return usagef("--auth-file: %v", err)
		}
		reloads = append(reloads, store.Reload)
		a := &auth.Authorizer{Tokens: store, TrustNodeCertificates: tlsOn, Logger: logger.With("component", "auth")}
		if tlsOn {
			if a.NodeRoots, err = security.LoadCertPool(f.tlsCA); err != nil {
				return usagef("%v", err)
			}
		}
		// As a call interceptor it also checks every call carried on a
		// Dedup.Stream, not only unary calls.
		cfg.CallInterceptors = append(cfg.CallInterceptors, a.UnaryServerInterceptor())
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.ChainStreamInterceptor(a.StreamServerInterceptor()))
		if tok := store.NodeToken(); tok != "" {
			cfg.DialOptions = append(cfg.DialOptions, grpc.WithPerRPCCredentials(auth.TokenCredentials(tok)))
		} else if !tlsOn {
			return usagef("--auth-file %s has no clear-text token with the \"node\" right, and without TLS nodes have no other way to recognise each other: add one (the same file on every node), or turn on TLS", f.authFile)
		}
	}
	if len(reloads) > 0 {
		f.reload = func() error {
			var errs []error
			for _, r := range reloads {
				errs = append(errs, r())
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// serve runs one node until ctx ends, then shuts it down within 30 s. On
// SIGHUP it calls reload (when set): certificates and tokens are reread,
// and on error the ones in force stay.
func serve(ctx context.Context, cfg server.Config, logger *slog.Logger, reload func() error, started func(*server.Server)) error {
	srv, err := server.Start(ctx, cfg)
	if err != nil {
		hint := "check that the addresses are free and the data dir is writable and not used by another process"
		var idErr *cluster.NodeIDMismatchError
		var roomErr *diskspace.RoomError
		if errors.As(err, &idErr) || errors.As(err, &roomErr) {
			hint = "" // the error says what to do
		}
		return &opError{err: fmt.Errorf("start node %s: %w", cfg.Cluster.NodeID, err), hint: hint}
	}
	if started != nil {
		started(srv)
	}
	logger.Info("dedupnode serving", "node", cfg.Cluster.NodeID, "grpc_addr", srv.GRPCAddr(), "raft_addr", srv.RaftAddr(),
		"admin_addr", srv.AdminAddr(), "data_dir", cfg.Cluster.DataDir)
	hup := make(chan os.Signal, 1)
	if reload != nil {
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	for ctx.Err() == nil {
		select {
		case <-hup:
			if err := reload(); err != nil {
				logger.Error("reload on SIGHUP failed; the previous certificates and tokens stay in force", "err", err)
			} else {
				logger.Info("reloaded certificates and tokens on SIGHUP")
			}
		case <-ctx.Done():
		}
	}
	logger.Info("dedupnode shutting down", "node", cfg.Cluster.NodeID)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Close(sctx); err != nil {
		return &opError{err: fmt.Errorf("shut down node %s: %w", cfg.Cluster.NodeID, err), hint: "the data is safe; restart the node to recover"}
	}
	return nil
}
