package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/cluster"
	"github.com/dedupnode/dedupnode/fsm"
)

// progressOut returns where to draw a progress bar: stderr when it is a
// terminal and not turned off, else nowhere.
func progressOut(e *env, off bool) io.Writer {
	if f, ok := e.stderr.(*os.File); ok && !off && term.IsTerminal(int(f.Fd())) {
		return f
	}
	return io.Discard
}

// newBar returns a progress bar drawn on w. Its spinner changes only when
// the bar is drawn (an Add), not on progressbar's own timer: that timer's
// goroutine reads the bar's start time without the bar's lock, a data race
// with the first Add (progressbar v3.19.1, ProgressBar.IsStarted).
func newBar(w io.Writer, total int64, desc string, bytes bool) *progressbar.ProgressBar {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetSpinnerChangeInterval(0),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200 * time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true))
	}
	return progressbar.NewOptions64(total, opts...)
}

func newPromoteCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var force bool
	cmd := &cobra.Command{
		Use:   "promote [flags] NODE_ID",
		Short: "Make a non-voter a voter now",
		Long: `Promote turns the non-voter NODE_ID into a voter at once. The leader
promotes a joined node by itself once it has caught up; use this to skip
the wait (the node still catches up as a voter, and the cluster's quorum
grows with it at once). A read replica (serve --read-replica) is never
promoted by the leader: this is the only way to make it a voter, and it
then votes and counts toward every commit like any voter.

The leader refuses (exit 1, nothing changed) a node it cannot reach at its
gRPC address or whose applied index is too far behind the commit index:
a voter that is down costs the cluster the failure it could otherwise
survive. --force promotes it anyway.`,
		Example: strings.ReplaceAll(`  dedupnode promote --addr 127.0.0.1:7070 n4`, "dedupnode ", e.progName+" "),
		Args:    cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
				var err error
				if force {
					err = c.ForcePromote(ctx, args[0])
				} else {
					err = c.Promote(ctx, args[0])
				}
				if err != nil {
					return explain(err, f, "")
				}
				return report(e.stdout, f.output, map[string]any{"promoted": args[0]}, "%s is a voter", args[0])
			})
		}),
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "promote even a node the leader cannot reach or that has not caught up")
	return cmd
}

func newBackupCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var out string
	var noProgress bool
	cmd := &cobra.Command{
		Use:   "backup --addr HOST:PORT --out FILE|-",
		Short: "Stream a consistent snapshot of the whole cluster state to a file",
		Long: `Backup asks a node for a consistent snapshot of every namespace and
record (taken after a linearizable read barrier: it holds every write
acknowledged before the command started) and writes it to --out. The file
ends with a SHA-256 of its content, checked here before the file is put in
place. 'dedupnode restore' seeds a new cluster from it.

--out - writes the backup to stdout (not a terminal) and what would be
said about it to stderr. Its SHA-256 is checked once the last byte is
out: on an error (exit 1) the output is incomplete, discard it.`,
		Example: strings.ReplaceAll(`  dedupnode backup --addr 127.0.0.1:7070 --out dedup-$(date +%F).snap
  dedupnode backup --addr 127.0.0.1:7070 --out - | gzip > dedup.snap.gz`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: the file to write the backup to, or - for stdout")
			}
			var w io.Writer
			var tmp *os.File // nil: to stdout
			said, left := e.stdout, "no file was written"
			if out == "-" {
				if so, ok := e.stdout.(*os.File); ok && term.IsTerminal(int(so.Fd())) {
					return usagef("--out -: stdout is a terminal; redirect it to a file or a pipe, or give --out FILE")
				}
				w, said, left = e.stdout, e.stderr, "nothing was written"
			} else {
				var err error
				if tmp, err = os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial*"); err != nil {
					return &opError{err: err, hint: "check that the directory of --out exists and is writable"}
				}
				defer os.Remove(tmp.Name())
				defer tmp.Close()
				w = tmp
			}
			bar := newBar(progressOut(e, noProgress), -1, "backup", true)
			f.stream = true
			ctx, gotData, stop := firstData(e.ctx, f.timeout)
			defer stop()
			c, err := f.dial(ctx, cmd)
			if err != nil {
				return streamError(e, ctx, err, f, "", "backup", false, left)
			}
			defer c.Close()
			// --timeout bounds the wait for data, not the stream: a backup
			// takes as long as it takes. The client verifies the stream's
			// checksum.
			info, err := c.Backup(ctx, io.MultiWriter(firstWrite{gotData}, w, bar))
			bar.Finish()
			if info.Bytes > 0 {
				left = "no file was written (the partial one was removed)"
				if tmp == nil {
					left = "the output is incomplete: discard it"
				}
			}
			if errors.Is(err, client.ErrBackupDamaged) {
				return &opError{err: fmt.Errorf("%w; %s", err, left), hint: "run the backup again"}
			}
			if err != nil {
				return streamError(e, ctx, err, f, "", "backup", info.Bytes > 0, left)
			}
			index, size := info.Index, info.Bytes
			if tmp != nil {
				if err := tmp.Sync(); err != nil {
					return &opError{err: err}
				}
				if err := tmp.Close(); err != nil {
					return &opError{err: err}
				}
				if err := os.Rename(tmp.Name(), out); err != nil {
					return &opError{err: err}
				}
			}
			dest := out
			if tmp == nil {
				dest = "stdout"
			}
			return report(said, f.output, map[string]any{"file": out, "bytes": size, "index": index},
				"wrote %s (%d bytes, state as of Raft index %d)", dest, size, index)
		}),
	}
	f.register(cmd)
	cmd.Flags().Lookup("timeout").Usage = fmt.Sprintf(streamTimeoutUsage, "backup")
	cmd.Flags().StringVar(&out, "out", "", "`FILE` to write (written to a temporary file first, renamed when complete and verified); - for stdout")
	cmd.Flags().BoolVar(&noProgress, "no-progress", false, "do not draw a progress bar (it is drawn only when stderr is a terminal)")
	return cmd
}

func newRestoreCmd(e *env) *cobra.Command {
	var from, nodeID, dataDir, raftAddr, logStore, minFreeDisk string
	cmd := &cobra.Command{
		Use:   "restore --from FILE|- --node-id ID --data-dir DIR --raft-addr HOST:PORT",
		Short: "Seed a new cluster's first node from a backup (offline)",
		Long: `Restore prepares an empty --data-dir as the first node of a new cluster
holding the state of a backup: it verifies the backup's checksum, installs
it, and records a one-voter Raft configuration (this node at --raft-addr)
at the backup's Raft index, so the new cluster's log continues after it.
It prints how many records it restored (live: committed or leased) and how
many it skipped as expired (they answer as absent and their space is
reclaimed at the first writes). The new cluster's fencing epoch is one past
the backup's, so its fencing tokens exceed every token the source cluster
can still grant (docs/OPERATIONS.md, Fencing tokens).

Before writing anything it compares the free space of --data-dir's volume
with what the node will hold (the ID store and a Raft snapshot, each about
the backup's size) plus the --min-free-disk it will be served with, and
refuses at once when they do not fit. --from - reads the backup from stdin,
whose size is known up front only when redirected from a file (not a
pipe). A restore that fails (a truncated or damaged backup, a full disk)
leaves --data-dir as it was.

Then start the node with 'serve' and the same --node-id, --data-dir and
--raft-addr, and without --bootstrap, --peers or --join; start the other
nodes with 'serve --join' pointing at it. Nodes of the old cluster remain in
the node table until you 'remove' them.`,
		Example: strings.ReplaceAll(`  dedupnode restore --from dedup.snap --node-id r1 --data-dir data/r1 --raft-addr 127.0.0.1:7000
  dedupnode serve   --node-id r1 --data-dir data/r1 --raft-addr 127.0.0.1:7000 --grpc-addr 127.0.0.1:7070
  dedupnode serve   --node-id r2 --data-dir data/r2 --raft-addr 127.0.0.1:7001 --grpc-addr 127.0.0.1:7071 --join 127.0.0.1:7070`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags([]string{"from", from, "node-id", nodeID, "data-dir", dataDir, "raft-addr", raftAddr}); err != nil {
				return err
			}
			if err := checkNewNodeIDFlag("--node-id", nodeID); err != nil {
				return err
			}
			if err := checkHostPortFlag("--raft-addr", raftAddr); err != nil {
				return err
			}
			if hasState(dataDir) {
				return usagef("%s already holds a node's state: restore into a new, empty --data-dir", dataDir)
			}
			store, err := cluster.ParseLogStore(logStore)
			if err != nil || logStore == "" {
				return usagef("--raft-log-store %q: want wal or boltdb", logStore)
			}
			var minFree int64
			if minFreeDisk != "auto" && minFreeDisk != "" {
				if minFree, err = parseByteSize(minFreeDisk); err != nil || minFree <= 0 {
					return usagef("--min-free-disk %q: want a size such as 512MiB or 2GiB, or auto", minFreeDisk)
				}
			}
			in, size, err := openBackup(e, from)
			if err != nil {
				return err
			}
			defer in.Close()
			if err := cluster.SeedRoom(dataDir, size, uint64(minFree), uint64(autoMemtable(dataDir)), store); err != nil {
				return &opError{err: err}
			}
			res, err := cluster.SeedFromBackupStore(dataDir, nodeID, raftAddr, store, in, nil, time.Now())
			if err != nil {
				return &opError{err: err, hint: "check that --from is a complete backup made by 'dedupnode backup'"}
			}
			c := res.Records
			if from == "-" {
				from = "stdin"
			}
			fmt.Fprintf(e.stdout, "restored %s into %s (Raft index %d, term %d) as node %s at %s\n", from, dataDir, res.Index, res.Term, nodeID, raftAddr)
			fmt.Fprintf(e.stdout, "records: %d restored (%d committed, %d leased); skipped as expired: %d; released leases (count as absent): %d\n",
				c.Live(), c.Committed, c.Leased, c.Expired, c.Released)
			fmt.Fprintf(e.stdout, "fencing epoch %d: every fencing token of this cluster exceeds any the source cluster can grant\n", res.FenceEpoch)
			fmt.Fprintf(e.stdout, "start it with: %s serve --node-id %s --data-dir %s --raft-addr %s --raft-log-store %s --grpc-addr HOST:PORT\n", e.progName, nodeID, dataDir, raftAddr, store)
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&from, "from", "", "backup `FILE` written by 'dedupnode backup'; - for stdin")
	fs.StringVar(&nodeID, "node-id", "", "`ID` of the new cluster's first node (a new ID, not one of the old cluster's)")
	fs.StringVar(&dataDir, "data-dir", "", "empty `DIR` to seed")
	fs.StringVar(&raftAddr, "raft-addr", "", "Raft `HOST:PORT` the node will serve on, as the other nodes reach it")
	fs.StringVar(&logStore, "raft-log-store", string(cluster.DefaultLogStore), "Raft log `STORE` the node will be served with (serve --raft-log-store): wal or boltdb")
	fs.StringVar(&minFreeDisk, "min-free-disk", "auto", "free space (`SIZE`, e.g. 1GiB) the node will be served with (serve --min-free-disk): restore refuses at once unless the volume has it free beyond the ID store and the Raft snapshot it writes; \"auto\": what serve's automatic threshold will be, 64MiB plus twice the restored store")
	return cmd
}

// openBackup opens restore's --from: a file, or stdin for "-". size is
// the backup's size in bytes when known (a file, stdin redirected from
// one), else 0: a backup read from a pipe is measured only as it arrives.
func openBackup(e *env, from string) (io.ReadCloser, uint64, error) {
	var f *os.File
	if from == "-" {
		sf, ok := e.stdin.(*os.File)
		if !ok {
			return io.NopCloser(e.stdin), 0, nil
		}
		f = sf
	} else {
		var err error
		if f, err = os.Open(from); err != nil {
			return nil, 0, &opError{err: err, hint: "check --from"}
		}
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, &opError{err: err, hint: "check --from"}
	}
	var size uint64
	if fi.Mode().IsRegular() {
		size = uint64(max(fi.Size(), 0))
	}
	if from == "-" {
		return io.NopCloser(f), size, nil // stdin stays open: it is not ours
	}
	return f, size, nil
}

// checkNodeIDFlag refuses an ID fsm.ValidateNodeID refuses (the one rule
// for node IDs: the server's Join and the cluster's config check it too),
// as a usage error naming the flag.
func checkNodeIDFlag(flag, id string) error {
	var inv *fsm.InvalidError
	if err := fsm.ValidateNodeID(id); errors.As(err, &inv) {
		return usagef("%s: %s", flag, inv.Reason)
	} else if err != nil {
		return usagef("%s: %v", flag, err)
	}
	return nil
}

// checkNewNodeIDFlag is checkNodeIDFlag for the ID of a node that is not
// a member yet (serve on a data dir without state, join, restore): it
// also refuses ',' and '=', which separate the entries and fields of
// serve --peers (id=raft_addr=grpc_addr,...), so a node with such an ID
// could never be named there. Nodes made before this rule keep theirs.
func checkNewNodeIDFlag(flag, id string) error {
	if err := checkNodeIDFlag(flag, id); err != nil {
		return err
	}
	if i := strings.IndexAny(id, ",="); i >= 0 {
		return usagef("%s: %q contains %q, which separates serve --peers (id=raft_addr=grpc_addr,...): a node with this ID could never be named there; pick an ID without ',' or '='", flag, id, id[i:i+1])
	}
	return nil
}

// checkHostPortFlag is cluster.CheckHostPort (the check Join makes of a
// member's addresses) as a usage error naming the flag.
func checkHostPortFlag(flag, addr string) error {
	if err := cluster.CheckHostPort(addr); err != nil {
		return usagef("%s %v", flag, err)
	}
	return nil
}

// requireFlags refuses a command line that leaves a required flag empty,
// naming the ones missing. nameValues holds each flag's name (without
// dashes) and value, in the order the help lists them.
func requireFlags(nameValues []string) error {
	var all, missing []string
	for i := 0; i+1 < len(nameValues); i += 2 {
		all = append(all, "--"+nameValues[i])
		if nameValues[i+1] == "" {
			missing = append(missing, "--"+nameValues[i])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	list := func(s []string) string {
		if len(s) == 1 {
			return s[0]
		}
		return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return usagef("%s %s missing (%s are all required)", list(missing), verb, list(all))
}

// exportLine is one record in export/import NDJSON.
type exportLine struct {
	ID    string `json:"id,omitempty"`
	IDB64 string `json:"id_b64,omitempty"`
	// State is "committed" (the default) or "leased": a lease imports as a
	// lease until ExpiresUnixMs, never as committed.
	State string `json:"state,omitempty"`
	// FirstSeenUnixMs is informative: import records IDs anew.
	FirstSeenUnixMs int64 `json:"first_seen_unix_ms,omitempty"`
	ExpiresUnixMs   int64 `json:"expires_unix_ms,omitempty"`
	// TTL (a duration such as "90s", "24h", "7d") or TTLMs: the record's
	// time to live from the moment of import. Without either, and without
	// ExpiresUnixMs, import uses --ttl or the namespace default.
	TTL   string `json:"ttl,omitempty"`
	TTLMs int64  `json:"ttl_ms,omitempty"`
	// DigestB64 and TokenB64 (standard base64) are the payload digest and
	// the request token recorded with the ID; import keeps both, so a
	// retry of the call that recorded it answers as that call did.
	DigestB64 string `json:"digest_b64,omitempty"`
	TokenB64  string `json:"token_b64,omitempty"`
	// Fence is the source cluster's fencing token of the ID's latest claim
	// (informative: import grants new ones, in an epoch past the source's).
	Fence uint64 `json:"fence,omitempty"`
}

// exportHeader is the first line export writes. Import reads the source
// cluster's fencing epoch from it and raises the target's past it.
type exportHeader struct {
	Format     int    `json:"dedupnode_export"`
	Namespace  string `json:"namespace"`
	FenceEpoch uint64 `json:"fence_epoch"`
}

const exportFormat = 1

func newExportCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var namespace, out string
	cmd := &cobra.Command{
		Use:   "export --namespace NS [--out FILE]",
		Short: "Write the live IDs of a namespace as NDJSON",
		Long: `Export writes every live ID of a namespace (recorded, not expired, not
forgotten) as of a linearizable read barrier, one JSON object per line:
{"id": ..., "state": "committed"|"leased", "first_seen_unix_ms": ...,
"expires_unix_ms": ..., "digest_b64": ..., "token_b64": ..., "fence": ...};
IDs that are not valid UTF-8 come as "id_b64" (standard base64). A lease's
"expires_unix_ms" is its lease expiry. The first line is a header,
{"dedupnode_export": 1, "namespace": ..., "fence_epoch": N}, naming the
cluster's fencing epoch. Released leases and expired records answer as
absent and are not exported (they are counted on stderr). 'dedupnode
import' reads the same format. Needs the admin right on the namespace when
the cluster runs with tokens.`,
		Example: strings.ReplaceAll(`  dedupnode export --addr 127.0.0.1:7070 --namespace orders --out orders.ndjson`, "dedupnode ", e.progName+" "),
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			w := e.stdout
			var file *os.File
			if out != "" && out != "-" {
				var err error
				if file, err = os.Create(out); err != nil {
					return &opError{err: err, hint: "check --out"}
				}
				defer file.Close()
				w = file
			}
			bw := bufio.NewWriterSize(w, 1<<20)
			enc := json.NewEncoder(bw)
			var n, leased int
			left := "nothing was written"
			if file != nil {
				left = fmt.Sprintf("%s is incomplete: delete it", out)
			}
			f.stream = true
			ctx, gotData, stop := firstData(e.ctx, f.timeout)
			defer stop()
			c, err := f.dial(ctx, cmd)
			if err != nil {
				return streamError(e, ctx, err, f, namespace, "export", false, left)
			}
			defer c.Close()
			// The header first: import reads the source's fencing epoch
			// from it before it claims any lease.
			got := false
			begin := func(info client.ExportInfo) error {
				gotData()
				got = true
				return enc.Encode(&exportHeader{Format: exportFormat, Namespace: nsName(namespace), FenceEpoch: info.FenceEpoch})
			}
			info, err := c.ExportWithInfo(ctx, namespace, begin, func(r client.ExportedRecord) error {
				l := exportLine{FirstSeenUnixMs: r.FirstSeen.UnixMilli(), ExpiresUnixMs: r.Expires.UnixMilli(), State: r.State.String(), Fence: r.FencingToken}
				if r.State == client.StateLeased {
					leased++
				}
				if len(r.Digest) > 0 {
					l.DigestB64 = base64.StdEncoding.EncodeToString(r.Digest)
				}
				if len(r.RequestToken) > 0 {
					l.TokenB64 = base64.StdEncoding.EncodeToString(r.RequestToken)
				}
				if utf8.Valid(r.ID) {
					l.ID = string(r.ID)
				} else {
					l.IDB64 = base64.StdEncoding.EncodeToString(r.ID)
				}
				n++
				return enc.Encode(&l)
			})
			if err != nil {
				if got && file == nil {
					left = "the output is incomplete"
				}
				return streamError(e, ctx, err, f, namespace, "export", got, left)
			}
			if err := bw.Flush(); err != nil {
				return &opError{err: err}
			}
			dest := "stdout"
			if file != nil {
				if err := file.Close(); err != nil {
					return &opError{err: err}
				}
				dest = out
			}
			fmt.Fprintf(e.stderr, "exported %d IDs of namespace %s to %s (%d leased); not exported, as they answer as absent: %d expired, %d released leases\n",
				n, nsName(namespace), dest, leased, info.SkippedExpired, info.SkippedReleased)
			return nil
		}),
	}
	f.register(cmd)
	// The export is NDJSON whatever --output says: the flag does not apply.
	_ = cmd.Flags().MarkHidden("output")
	cmd.Flags().Lookup("timeout").Usage = fmt.Sprintf(streamTimeoutUsage, "export")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "`NAMESPACE` to export (default \"default\")")
	cmd.Flags().StringVar(&out, "out", "", "`FILE` to write (default stdout)")
	return cmd
}

// streamTimeoutUsage is the help of --timeout for the commands that stream
// (backup, export; %s names the command).
const streamTimeoutUsage = "fail when the node sends nothing for this `DURATION` (env DEDUPNODE_TIMEOUT): it bounds reaching a node and receiving the first data (connecting, finding the leader, the node's read barrier, retries), then each wait for the next chunk; not the whole %s, which takes as long as it takes while data keeps coming"

// errNoData is the cause of a streaming command's context when --timeout
// passed before the first data arrived.
var errNoData = errors.New("no data within --timeout")

// firstData bounds a streaming command's wait for its first data by d: the
// context it returns is cancelled with errNoData unless got is called
// within d. Once data flows, the client's stream idle timeout bounds each
// wait.
func firstData(ctx context.Context, d time.Duration) (_ context.Context, got func(), stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(d, func() { cancel(errNoData) })
	return ctx, func() { t.Stop() }, func() { t.Stop(); cancel(nil) }
}

// firstWrite calls got at every write (the first one counts).
type firstWrite struct{ got func() }

func (w firstWrite) Write(p []byte) (int, error) {
	w.got()
	return len(p), nil
}

// streamError explains the failure of a streaming read (what: "backup",
// "export") run under ctx (firstData): an interrupt, a node that sent no
// data within --timeout, or stopped sending mid-stream (got: some data had
// arrived), each naming the node; left says what became of the output.
func streamError(e *env, ctx context.Context, err error, f *clientFlags, namespace, what string, got bool, left string) error {
	if e.ctx.Err() != nil {
		return &opError{err: errors.New("interrupted"), hint: fmt.Sprintf("%s only reads: nothing in the cluster changed; %s; re-run it", what, left)}
	}
	node := client.AsError(err).Addr
	if node == "" {
		node = strings.Join(f.addrs, ",")
	}
	hint := fmt.Sprintf("check that node ('dedupnode status --addr %s'); try another node with --addr, or a longer --timeout if the node is only slow", node)
	switch ce := client.AsError(err); {
	case !got && errors.Is(context.Cause(ctx), errNoData) && ce.Reason != "":
		// Nodes answered, but with errors (no leader, say).
		return &opError{err: fmt.Errorf("no data within --timeout %s; the last answer, from %s: %s; %s", fmtDuration(f.timeout), node, ce.Message, left),
			hint: fmt.Sprintf("see 'dedupnode status --addr %s', or raise --timeout", strings.Join(f.addrs, ","))}
	case !got && (errors.Is(context.Cause(ctx), errNoData) || errors.Is(err, client.ErrStreamIdle)):
		return &opError{err: fmt.Errorf("no data from %s within --timeout %s: it accepts connections but does not answer (frozen, overloaded or cut off?); %s", node, fmtDuration(f.timeout), left), hint: hint}
	case errors.Is(err, client.ErrStreamIdle):
		return &opError{err: fmt.Errorf("%s stopped sending mid-stream: nothing for --timeout %s; %s", node, fmtDuration(f.timeout), left), hint: hint}
	}
	return explainIn(err, f, namespace, &progress{read: true})
}

func nsName(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

func newImportCmd(e *env) *cobra.Command {
	f := &clientFlags{}
	var namespace string
	var ttl, granularity time.Duration
	var batch int
	var noProgress, keepEpoch bool
	cmd := &cobra.Command{
		Use:   "import --namespace NS FILE|-",
		Short: "Bulk-load IDs (one per line, or NDJSON with per-ID TTL)",
		Long: `Import marks every ID of FILE ('-' for stdin) in a namespace: the path for
teams moving a Redis or SQL dedup table to dedupnode. Each line is either
a plain ID, or a JSON object (NDJSON) with "id" (or "id_b64") and
optionally "ttl" ("90s", "24h", "7d"), "ttl_ms", or "expires_unix_ms" (as
'dedupnode export' writes: the TTL is then the time left; IDs already
expired are skipped). Other lines' TTL is --ttl, else the namespace
default. TTLs are rounded up to --ttl-granularity so IDs share requests;
an ID never expires earlier than asked. Marks are idempotent: running an
import twice is harmless (the second run reports duplicates, and live
leases as leased again: their claims are retried with their tokens).

A line is refused, never imported with another TTL, when a field is
unknown, repeated or out of range, or it gives more than one of "ttl",
"ttl_ms" and "expires_unix_ms": the error names the line and the field.
When no request went out yet, nothing is imported (exit 2); else every
line before the bad one is, and none after it (exit 1), as the error says:
fix the line and run the import again, or resume at that line.

Records of 'dedupnode export' keep their state: a "leased" record is
claimed for the time its lease has left (to the second), with its digest
and request token, so a redelivery gets in_progress until then — never
duplicate. When the file starts with export's header line, import first
raises this cluster's fencing epoch past the source's (admin right on "*"),
so every fencing token it grants afterwards exceeds the source's.`,
		Example: strings.ReplaceAll(`  redis-cli --scan --pattern 'processed:*' | sed 's/^processed://' | dedupnode import --namespace orders --ttl 7d -
  dedupnode import --addr 127.0.0.1:7070 --namespace orders orders.ndjson`, "dedupnode ", e.progName+" "),
		Args: cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if batch < 1 {
				return usagef("--batch must be at least 1")
			}
			if granularity <= 0 {
				return usagef("--ttl-granularity must be positive")
			}
			var in io.Reader = e.stdin
			var total int64 = -1
			if args[0] != "-" {
				file, err := os.Open(args[0])
				if err != nil {
					return &opError{err: err, hint: "check the file name"}
				}
				defer file.Close()
				if st, err := file.Stat(); err == nil {
					total = st.Size()
				}
				in = file
			}
			c, err := f.dial(e.ctx, cmd)
			if err != nil {
				return explain(err, f, namespace)
			}
			defer c.Close()
			// The namespace's max TTL bounds rounding (unknown when the
			// namespace does not exist yet and the cluster creates it).
			var maxTTL time.Duration
			{
				ctx, cancel := f.withTimeout(e.ctx)
				if ns, err := c.DescribeNamespace(ctx, nsName(namespace)); err == nil {
					maxTTL = ns.MaxTTL
				}
				cancel()
			}
			lim := importLimits{namespace: namespace, maxTTL: maxTTL}
			if ttl > 0 {
				if err := lim.check("ttl", "--ttl", ttl); err != nil {
					var le *importLineError
					errors.As(err, &le)
					return usagef("%s; nothing imported", le.Reason)
				}
			}
			bar := newBar(progressOut(e, noProgress), total, "import", true)
			defer bar.Finish()

			// Committed records are marked, leases claimed (each for
			// the time its lease has left), grouped by that duration.
			type groupKey struct {
				leased bool
				d      time.Duration
			}
			groups := map[groupKey][]client.Item{}
			lines := map[groupKey][]int{} // the input line of each of groups' items
			var stats struct{ read, new, dup, conflict, leased, inProgress, expired int }
			var epoch *uint64
			sent := false // an import request went out
			flush := func(k groupKey) error {
				items := groups[k]
				if len(items) == 0 {
					return nil
				}
				ctx, cancel := f.withTimeout(e.ctx)
				defer cancel()
				items, kept, err := skipImported(ctx, c, namespace, items, k.leased)
				if err != nil {
					return err
				}
				itemLines := make([]int, len(kept))
				for i, j := range kept {
					itemLines[i] = lines[k][j]
				}
				stats.dup += len(groups[k]) - len(items)
				if len(items) == 0 {
					groups[k], lines[k] = groups[k][:0:0], lines[k][:0:0]
					return nil
				}
				var res []client.Result
				sent = true
				if k.leased {
					res, err = c.Claim(ctx, namespace, items, k.d)
				} else {
					res, err = c.Mark(ctx, namespace, items, k.d)
				}
				if te := importTTLError(err, itemLines); te != nil {
					return te
				}
				if err != nil {
					return rejectedLine(err, items, itemLines)
				}
				for _, r := range res {
					switch r.Code {
					case client.CodeNew:
						stats.new++
					case client.CodeAcquired:
						stats.leased++
					case client.CodeInProgress:
						stats.inProgress++
					case client.CodeDuplicate:
						stats.dup++
					case client.CodeConflict:
						stats.conflict++
					}
				}
				groups[k], lines[k] = items[:0:0], lines[k][:0:0]
				return nil
			}
			// failed explains a failed request and says how many IDs the
			// cluster took before it (not how many were read).
			failed := func(err error) error {
				err = explain(err, f, namespace)
				var oe *opError
				if errors.As(err, &oe) {
					if done := stats.new + stats.dup + stats.conflict + stats.leased + stats.inProgress; done == 0 {
						oe.err = fmt.Errorf("%w (no ID imported)", oe.err)
					} else {
						oe.err = fmt.Errorf("%w (%d IDs imported before it; re-running the whole import is harmless)", oe.err, done)
					}
				}
				return err
			}
			// badLine refuses line n. The lines before it are all
			// imported, or (when no request was sent yet) none is: never
			// some of them, so that the error can say how far it got and
			// a re-run (IDs already in answer duplicate) or a resume at
			// line n is exact.
			badLine := func(n int, err error) error {
				msg := fmt.Sprintf("line %d: %v", n, err)
				var le *importLineError
				if errors.As(err, &le) && le.Field != "" {
					msg = fmt.Sprintf("line %d, field %s: %s", n, le.Field, le.Reason)
				}
				if !sent && epoch == nil {
					return usagef("%s; nothing imported", msg)
				}
				for k := range groups {
					if err := flush(k); err != nil {
						return failed(err)
					}
				}
				done := stats.new + stats.dup + stats.conflict + stats.leased + stats.inProgress
				resume := fmt.Sprintf("tail -n +%d %s | %s import ... -", n, args[0], e.progName)
				if args[0] == "-" {
					resume = fmt.Sprintf("feed it the input from line %d on", n)
				}
				return &opError{err: fmt.Errorf("%s; lines 1-%d are imported (%d IDs, %d skipped as expired), nothing from line %d on", msg, n-1, done, stats.expired, n),
					hint: fmt.Sprintf("fix line %d and run the same import again (IDs already in answer duplicate), or resume at line %d (%s)", n, n, resume)}
			}
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			line, records := 0, 0
			for sc.Scan() {
				line++
				bar.Add(len(sc.Bytes()) + 1)
				text := strings.TrimSpace(sc.Text())
				if text == "" {
					continue
				}
				r, err := parseImportLine(text, ttl, time.Now(), lim)
				if err != nil {
					return badLine(line, err)
				}
				if r.header != nil {
					if records > 0 || epoch != nil {
						return badLine(line, errors.New("an export header must be the file's first line"))
					}
					// Before any lease is claimed: fencing tokens of this
					// cluster must exceed the source's from here on.
					e0 := r.header.FenceEpoch
					epoch = &e0
					if !keepEpoch {
						got, err := raiseFenceEpoch(e.ctx, c, f, r.header.FenceEpoch+1)
						if err != nil {
							return err
						}
						epoch = &got
					}
					continue
				}
				records++
				if r.expired {
					stats.expired++
					continue
				}
				stats.read++
				k := groupKey{leased: r.leased, d: r.ttl}
				if !r.leased {
					k.d = roundTTL(r.ttl, granularity, cmp.Or(maxTTL, time.Duration(fsm.MaxTTLLimitMs)*time.Millisecond))
				}
				groups[k] = append(groups[k], client.Item{ID: r.id, Digest: r.digest, RequestToken: r.token})
				lines[k] = append(lines[k], line)
				if len(groups[k]) >= batch {
					if err := flush(k); err != nil {
						return failed(err)
					}
				}
			}
			if err := sc.Err(); err != nil {
				return &opError{err: fmt.Errorf("read line %d: %w", line+1, err)}
			}
			for k := range groups {
				if err := flush(k); err != nil {
					return failed(err)
				}
			}
			bar.Finish()
			fields := map[string]any{"namespace": nsName(namespace), "ids": stats.read, "new": stats.new,
				"duplicate": stats.dup, "conflict": stats.conflict, "leased": stats.leased, "in_progress": stats.inProgress,
				"skipped_expired": stats.expired}
			epochNote := ""
			if epoch != nil {
				fields["fence_epoch"] = *epoch
				epochNote = fmt.Sprintf("; fencing epoch %d", *epoch)
			}
			return report(e.stdout, f.output, fields,
				"imported %d IDs into %s: %d new, %d duplicate, %d conflict, %d leased, %d in progress; %d skipped as already expired%s",
				stats.read, nsName(namespace), stats.new, stats.dup, stats.conflict, stats.leased, stats.inProgress, stats.expired, epochNote)
		}),
	}
	f.register(cmd)
	fs := cmd.Flags()
	fs.StringVarP(&namespace, "namespace", "n", "", "`NAMESPACE` to load into (default \"default\")")
	fs.Var(durationValue{&ttl}, "ttl", "TTL `DURATION` of lines that give none (e.g. 24h, 7d); default: the namespace's default TTL")
	granularity = time.Minute
	fs.Var(durationValue{&granularity}, "ttl-granularity", "round per-ID TTLs up to a multiple of this `DURATION`, so IDs with nearby expiries share a request")
	fs.IntVar(&batch, "batch", 1000, "send at most `N` IDs per request")
	fs.BoolVar(&noProgress, "no-progress", false, "do not draw a progress bar (it is drawn only when stderr is a terminal)")
	fs.BoolVar(&keepEpoch, "keep-fence-epoch", false, "do not raise this cluster's fencing epoch past the export's (then its fencing tokens may be lower than the source cluster's)")
	return cmd
}

// skipImported drops the items already committed with the request token
// they carry: a Mark with that token would answer new again, as a retry of
// the call that recorded it, and a re-run of an import would report every
// record as new. Items without a token need no look: Mark answers
// duplicate for them. Leases are not looked up: no Check answer carries a
// lease's request token (only its holder's claim gets it), so a lease
// imported before is claimed again with its token, a retry that changes
// nothing and answers acquired.
//
// kept holds the index in items of each item returned.
func skipImported(ctx context.Context, c *client.Client, ns string, items []client.Item, leased bool) (out []client.Item, kept []int, err error) {
	var ids [][]byte
	for _, it := range items {
		if len(it.RequestToken) > 0 && !leased {
			ids = append(ids, it.ID)
		}
	}
	if len(ids) == 0 {
		kept = make([]int, len(items))
		for i := range kept {
			kept[i] = i
		}
		return items, kept, nil
	}
	// A namespace that does not exist holds nothing: every item goes on
	// to the write, which creates it on a cluster that auto-creates
	// namespaces (a check does not) and is refused NotFound elsewhere.
	res, err := c.Check(ctx, ns, ids, client.Linearizable)
	if errors.Is(err, client.ErrNamespaceNotFound) {
		res, err = nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	present := map[string]bool{}
	for _, r := range res {
		if r.Code == client.CodeSeen && r.Record != nil && r.Record.State == client.StateCommitted {
			present[string(r.ID)+"\x00"+string(r.Record.RequestToken)] = true
		}
	}
	out = items[:0:0]
	for i, it := range items {
		if len(it.RequestToken) == 0 || !present[string(it.ID)+"\x00"+string(it.RequestToken)] {
			out, kept = append(out, it), append(kept, i)
		}
	}
	return out, kept, nil
}

// rejectedLine names the input line of the item a rejected import request
// is about (the typed client.Error.Item), as the per-ID commands do; other
// errors are returned as they are.
func rejectedLine(err error, items []client.Item, itemLines []int) error {
	e := client.AsError(err)
	if e == nil || e.Kind != client.ErrInvalidArgument || e.Item < 1 || e.Item > len(items) {
		return err
	}
	i := e.Item - 1
	return &opError{err: fmt.Errorf("line %d (%s), %s: %s; its request was rejected, nothing of it applied", itemLines[i], quoteEntry(string(items[i].ID)), itemField(e), cmp.Or(e.Violation, e.Message)),
		hint: fmt.Sprintf("fix line %d and run the import again: the IDs already imported are skipped or answer duplicate", itemLines[i])}
}

// raiseFenceEpoch raises the cluster's fencing epoch to at least epoch and
// returns the epoch in force.
func raiseFenceEpoch(ctx context.Context, c *client.Client, f *clientFlags, epoch uint64) (uint64, error) {
	ctx, cancel := f.withTimeout(ctx)
	defer cancel()
	got, err := c.RaiseFenceEpoch(ctx, epoch)
	if errors.Is(err, client.ErrPermissionDenied) {
		return 0, &opError{err: fmt.Errorf("raising the fencing epoch past the export's needs the admin right on \"*\": %w (no ID imported)", err),
			hint: "use an admin token, or pass --keep-fence-epoch if nothing fences with this cluster's tokens"}
	}
	if err != nil {
		return 0, explain(err, f, "")
	}
	return got, nil
}

// importTTLError rewords a TTL (or lease) out of its namespace's range
// for import, naming the input lines of the refused request, whose items
// all share that TTL (lines are checked before they are sent: this is a
// namespace created, or its max TTL lowered, during the import); nil for
// other errors.
func importTTLError(err error, itemLines []int) error {
	e := client.AsError(err)
	if e == nil || e.Kind != client.ErrInvalidArgument || (e.Field != "ttl_ms" && e.Field != "lease_ms") || e.MaxMs == 0 || len(itemLines) == 0 {
		return nil
	}
	where := fmt.Sprintf("line %d", itemLines[0])
	if n := len(itemLines); n > 1 {
		where = fmt.Sprintf("lines %d and %d more with the same TTL", itemLines[0], n-1)
	}
	limit := fmtDuration(time.Duration(e.MaxMs) * time.Millisecond)
	if e.Namespace == "" {
		return &opError{err: fmt.Errorf("%s: the TTL (from --ttl or the line) exceeds %s, the largest max TTL a namespace can have; nothing of that request applied", where, limit),
			hint: "pass a shorter --ttl, or shorten the lines' TTLs"}
	}
	return &opError{err: fmt.Errorf("%s: the TTL (from --ttl or the line) exceeds the max TTL of namespace %s (%s); nothing of that request applied", where, e.Namespace, limit),
		hint: fmt.Sprintf("pass a shorter --ttl, or raise the limit with 'dedupnode namespace update %s --max-ttl DURATION'", e.Namespace)}
}

// importRec is one parsed import line.
type importRec struct {
	// header is set for export's header line (and nothing else is).
	header *exportHeader
	id     []byte
	// ttl is the TTL, or for a lease the lease time left (0: the default).
	ttl    time.Duration
	leased bool
	// expired: the record's expiry has passed (or is under a second away).
	expired       bool
	digest, token []byte
}

// importLineError refuses one import line: Field is the JSON field at
// fault ("" for the line as a whole), Reason why, in our words.
type importLineError struct {
	Field, Reason string
}

func (e *importLineError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return "field " + e.Field + ": " + e.Reason
}

func lineErrorf(field, format string, args ...any) error {
	return &importLineError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// importLimits are the TTL limits a line is checked against before
// anything is sent: the namespace's max TTL when known (0: unknown, then
// only the limit every namespace has, fsm.MaxTTLLimitMs).
type importLimits struct {
	namespace string
	maxTTL    time.Duration
}

// check refuses a TTL (or a lease's time left) the target cannot hold,
// naming field: never narrowed to the limit, never widened by overflow.
func (l importLimits) check(field, given string, d time.Duration) error {
	limit := time.Duration(fsm.MaxTTLLimitMs) * time.Millisecond
	if l.maxTTL > 0 && l.maxTTL < limit {
		if d > l.maxTTL {
			return lineErrorf(field, "%s gives a TTL of %s, over the max TTL of namespace %s (%s)", given, fmtDuration(d), nsName(l.namespace), fmtDuration(l.maxTTL))
		}
		return nil
	}
	if d > limit {
		return lineErrorf(field, "%s gives a TTL of %s, over %s, the largest max TTL a namespace can have", given, fmtDuration(d), fmtDuration(limit))
	}
	return nil
}

// importFields are the fields an import line may carry (exportLine's).
var importFields = []string{"id", "id_b64", "state", "first_seen_unix_ms", "expires_unix_ms", "ttl", "ttl_ms", "digest_b64", "token_b64", "fence"}

// parseImportLine parses one import line: a plain ID, an NDJSON record, or
// export's header line. A refused record line's error is an
// *importLineError naming the field. Of "ttl", "ttl_ms" and
// "expires_unix_ms" a line gives one at most; every TTL is checked against
// lim (so that nothing is sent for it).
func parseImportLine(text string, defTTL time.Duration, now time.Time, lim importLimits) (importRec, error) {
	if !strings.HasPrefix(text, "{") {
		return importRec{id: []byte(text), ttl: defTTL}, nil
	}
	if strings.Contains(text, `"dedupnode_export"`) {
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		var h exportHeader
		if err := dec.Decode(&h); err != nil {
			return importRec{}, fmt.Errorf("export header: %w", err)
		}
		if h.Format != exportFormat {
			return importRec{}, fmt.Errorf("export header: format %d, this version reads %d", h.Format, exportFormat)
		}
		if h.FenceEpoch > fsm.MaxFenceEpoch {
			return importRec{}, fmt.Errorf("export header: fence_epoch %d exceeds %d", h.FenceEpoch, uint64(fsm.MaxFenceEpoch))
		}
		return importRec{header: &h}, nil
	}
	fields, err := jsonObjectFields(text)
	if err != nil {
		return importRec{}, err
	}
	str := func(name string) (string, bool, error) {
		raw, ok := fields[name]
		if !ok {
			return "", false, nil
		}
		var v string
		if k := jsonKind(raw); k != "string" {
			return "", false, lineErrorf(name, "want a string, got %s %s", k, raw)
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return "", false, lineErrorf(name, "not a valid JSON string")
		}
		return v, true, nil
	}
	integer := func(name, unit string) (int64, bool, error) {
		raw, ok := fields[name]
		if !ok {
			return 0, false, nil
		}
		if k := jsonKind(raw); k != "number" {
			return 0, false, lineErrorf(name, "want a whole number of %s, got %s %s", unit, k, raw)
		}
		v, err := strconv.ParseInt(string(raw), 10, 64)
		var ne *strconv.NumError
		switch {
		case errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange):
			return 0, false, lineErrorf(name, "%s is out of range", raw)
		case err != nil:
			return 0, false, lineErrorf(name, "%s is not a whole number of %s", raw, unit)
		}
		return v, true, nil
	}

	var r importRec
	id, hasID, err := str("id")
	if err != nil {
		return r, err
	}
	idB64, hasIDB64, err := str("id_b64")
	if err != nil {
		return r, err
	}
	switch {
	case hasID && hasIDB64:
		return r, lineErrorf("id", `give "id" or "id_b64", not both`)
	case hasID:
		if id == "" {
			return r, lineErrorf("id", "empty: an ID is 1 byte or more")
		}
		r.id = []byte(id)
	case hasIDB64:
		b, err := base64.StdEncoding.DecodeString(idB64)
		if err != nil {
			return r, lineErrorf("id_b64", "not standard base64")
		}
		if len(b) == 0 {
			return r, lineErrorf("id_b64", "empty: an ID is 1 byte or more")
		}
		r.id = b
	default:
		return r, lineErrorf("", `missing "id" (or "id_b64")`)
	}
	state, _, err := str("state")
	if err != nil {
		return r, err
	}
	switch state {
	case "", "committed":
	case "leased":
		r.leased = true
	default:
		return r, lineErrorf("state", `%q: want "committed" or "leased" (released leases answer as absent: leave them out)`, state)
	}
	for _, b := range []struct {
		name string
		dst  *[]byte
		max  int
	}{{"digest_b64", &r.digest, fsm.MaxDigestBytes}, {"token_b64", &r.token, fsm.MaxTokenBytes}} {
		s, ok, err := str(b.name)
		if err != nil || !ok {
			if err != nil {
				return r, err
			}
			continue
		}
		v, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return r, lineErrorf(b.name, "not standard base64")
		}
		if len(v) > b.max {
			return r, lineErrorf(b.name, "%d bytes, at most %d", len(v), b.max)
		}
		*b.dst = v
	}
	// Informative fields: checked, not used.
	if _, _, err := integer("first_seen_unix_ms", "milliseconds"); err != nil {
		return r, err
	}
	if fence, ok, err := integer("fence", "fencing token"); err != nil {
		return r, err
	} else if ok && fence < 0 {
		return r, lineErrorf("fence", "%d is negative", fence)
	}

	// One source of TTL at most: two would leave one of them ignored.
	var given []string
	for _, name := range []string{"ttl", "ttl_ms", "expires_unix_ms"} {
		if _, ok := fields[name]; ok {
			given = append(given, name)
		}
	}
	if len(given) > 1 {
		return r, lineErrorf(given[1], "conflicts with %q on the same line: give one of \"ttl\", \"ttl_ms\" or \"expires_unix_ms\"", given[0])
	}
	limitMs := fsm.MaxTTLLimitMs
	r.ttl = defTTL
	if ttl, ok, err := str("ttl"); err != nil {
		return r, err
	} else if ok {
		v, err := parseDuration(ttl)
		switch {
		case err != nil:
			return r, lineErrorf("ttl", "%q is not a duration: want e.g. \"90s\", \"24h\", \"7d\"", ttl)
		case v <= 0:
			return r, lineErrorf("ttl", "%q: a TTL must be positive (leave the field out for the default)", ttl)
		case v%time.Millisecond != 0:
			return r, lineErrorf("ttl", "%q is not a whole number of milliseconds (the store counts in ms)", ttl)
		}
		if err := lim.check("ttl", strconv.Quote(ttl), v); err != nil {
			return r, err
		}
		r.ttl = v
	}
	if ms, ok, err := integer("ttl_ms", "milliseconds"); err != nil {
		return r, err
	} else if ok {
		if ms <= 0 {
			return r, lineErrorf("ttl_ms", "%d: a TTL must be positive (leave the field out for the default)", ms)
		}
		if ms > limitMs { // before converting, which could overflow
			return r, lineErrorf("ttl_ms", "%d ms is over %s, the largest max TTL a namespace can have", ms, fmtDuration(time.Duration(limitMs)*time.Millisecond))
		}
		v := time.Duration(ms) * time.Millisecond
		if err := lim.check("ttl_ms", strconv.FormatInt(ms, 10), v); err != nil {
			return r, err
		}
		r.ttl = v
	}
	if ms, ok, err := integer("expires_unix_ms", "milliseconds since 1970"); err != nil {
		return r, err
	} else if ok {
		if ms <= 0 {
			return r, lineErrorf("expires_unix_ms", "%d: want a positive Unix time in milliseconds (leave the field out for the default TTL)", ms)
		}
		left := ms - now.UnixMilli() // no overflow: both are positive int64s
		if left > limitMs {
			at := time.UnixMilli(ms).UTC().Format(time.RFC3339)
			if ms/1000 > 253402300799 { // past year 9999
				at = "past year 9999"
			}
			return r, lineErrorf("expires_unix_ms", "%d (%s) is more than %s from now, the largest max TTL a namespace can have", ms, at, fmtDuration(time.Duration(limitMs)*time.Millisecond))
		}
		r.ttl = time.UnixMilli(ms).Sub(now)
		if r.ttl < time.Second {
			r.expired = true // expired, or too close to it to matter
		} else if err := lim.check("expires_unix_ms", strconv.FormatInt(ms, 10)+" ("+time.UnixMilli(ms).UTC().Format(time.RFC3339)+")", r.ttl); err != nil {
			return r, err
		}
	}
	if r.leased && r.ttl > 0 {
		// A lease keeps its expiry, to the second (never earlier).
		r.ttl = (r.ttl + time.Second - 1) / time.Second * time.Second
	}
	return r, nil
}

// jsonObjectFields splits one JSON object into its fields, refusing what
// would otherwise be silently dropped or overridden: unknown fields, a
// field given twice, anything after the object.
func jsonObjectFields(text string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	bad := func(err error) error {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return lineErrorf("", "not valid JSON (at byte %d)", se.Offset)
		}
		return lineErrorf("", "not valid JSON (it ends too early)")
	}
	if tok, err := dec.Token(); err != nil {
		return nil, bad(err)
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, lineErrorf("", "a line starting with { must be one JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, bad(err)
		}
		if !slices.Contains(importFields, name) {
			hint := ""
			if near := nearest(name, importFields); near != "" {
				hint = fmt.Sprintf(" (did you mean %q?)", near)
			}
			return nil, lineErrorf(name, "unknown field%s; known: %s", hint, strings.Join(importFields, ", "))
		}
		if _, dup := fields[name]; dup {
			return nil, lineErrorf(name, "given twice")
		}
		if jsonKind(raw) == "null" {
			continue // as if absent, as before
		}
		fields[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing }
		return nil, bad(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, lineErrorf("", "more than one JSON value on the line")
	}
	return fields, nil
}

// jsonKind names the kind of one JSON value.
func jsonKind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// nearest returns the candidate within two edits of s (or equal but for
// case), "" if none.
func nearest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if strings.EqualFold(s, c) {
			return c
		}
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// roundTTL rounds d up to a multiple of granularity, but not past maxTTL
// (when known, > 0) unless d itself is past it.
func roundTTL(d, granularity, maxTTL time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	r := (d + granularity - 1) / granularity * granularity
	if maxTTL > 0 && r > maxTTL && d <= maxTTL {
		return maxTTL
	}
	return r
}
