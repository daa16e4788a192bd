package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/dedupnode/dedupnode/demo"
)

const demoLong = `Demo shows the promise end to end on a real broker: every message's side
effect happens once, though the broker delivers some messages two, three or
more times.

It starts a local 3-node dedupnode cluster in this process (or uses --addr)
and a broker (--broker: NATS JetStream embedded, the default; Kafka through
an in-process Kafka cluster; or RabbitMQ: not embedded, the machine's own
rabbitmq-server, started for the run on loopback ports and stopped at the
end — on Debian or Ubuntu: apt-get install rabbitmq-server), then publishes
--messages events (account, amount) with realistic duplicates: about 5% are
published again 1-3 s later (a producer retrying after a lost publish ack)
and an older 5% range is replayed once 60% are out. Several consumer
processes handle them through client.Process (claim → apply → commit), each
applying its event to a ledger of account balances in Pebble. Consumers
really crash mid-message (their connections drop, every message they hold is
abandoned) and stall past JetStream's AckWait, so the broker really
redelivers (on Kafka a crashed consumer's partitions go to another consumer
from the last committed offset; RabbitMQ's consumer_timeout is set to
--ack-wait, so a stall makes the broker close the consumer's channel and
redeliver what it held).

The summary checks that effects applied == unique event IDs, that the ledger
total (and every account) equals the expected total, and that no event ran
twice without Process having reported that run's commit as unconfirmed. The
ledger keeps each event's ID with its effect (the second, idempotency layer:
it catches the re-run after a crash between an effect and its commit, which
no dedup store can prevent alone). Exit 0 only if every check holds.

--kill-leader-every kills the leader node abruptly (no leadership transfer)
and restarts it, again and again while the consumers run: each new leader
leads for that long once the cluster is stable again, then dies.`

func newDemoCmd(e *env) *cobra.Command {
	cfg := demo.DefaultConfig()
	var (
		output     string
		cf         clientFlags // the connection flags every cluster command shares
		noProgress bool
		logLevel   string
	)
	cmd := &cobra.Command{
		Use:   "demo [--broker nats|kafka|rabbitmq] [--messages N] [--consumers N] [--kill-leader-every DURATION] [--addr HOST:PORT,...] [--output json]",
		Short: "Run consumers of a real broker (NATS JetStream, Kafka, RabbitMQ) through dedupnode and check every effect happened once",
		Long:  demoLong,
		Example: strings.ReplaceAll(`  dedupnode demo
  dedupnode demo --messages 20000 --kill-leader-every 5s
  dedupnode demo --broker kafka --kill-leader-every 5s
  dedupnode demo --broker rabbitmq          # needs rabbitmq-server installed
  dedupnode demo --output json | jq .ok`, "dedupnode ", e.progName+" "),
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if !slices.Contains(demo.Brokers, cfg.Broker) {
				return usagef("--broker %q: want one of %s", cfg.Broker, strings.Join(demo.Brokers, ", "))
			}
			if output != "text" && output != "json" {
				return usagef("--output %q: want text or json", output)
			}
			if cfg.Messages < 1 || cfg.Consumers < 1 || cfg.Workers < 1 {
				return usagef("--messages, --consumers and --workers must be at least 1")
			}
			for _, r := range []float64{cfg.RetryRate, cfg.ReplayRate, cfg.CrashRate, cfg.StallRate} {
				if r < 0 || r > 1 {
					return usagef("rates must be between 0 and 1")
				}
			}
			if cmd.Flags().Changed("addr") {
				// The cluster at --addr: the shared connection flags and
				// their DEDUPNODE_* variables apply (not DEDUPNODE_ADDR
				// alone: without --addr the demo runs its own cluster).
				if err := cf.validateConn(cmd); err != nil {
					return err
				}
				conn, err := cf.connOptions()
				if err != nil {
					return err
				}
				if err := cf.resolve(e.ctx); err != nil {
					return err
				}
				cfg.Addrs, cfg.ClientOptions = cf.addrs, conn
				if cfg.KillLeaderEvery > 0 {
					return usagef("--kill-leader-every needs the local cluster: it cannot kill nodes of the cluster at --addr")
				}
			} else {
				for _, name := range []string{"tls-ca", "tls-cert", "tls-key", "token"} {
					if cmd.Flags().Changed(name) {
						return usagef("--%s needs --addr: the demo's own cluster runs without TLS or tokens", name)
					}
				}
			}
			logger, err := newLogger(e.stderr, logLevel, "text")
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if cmd.Flags().Changed("log-level") {
				cfg.NodeLogger = logger
			}
			if !noProgress && output == "text" {
				if f, ok := e.stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					cfg.Progress = e.stderr
				}
			}
			if output == "text" {
				where := "a local 3-node cluster in this process"
				if len(cfg.Addrs) > 0 {
					where = "the cluster at " + strings.Join(cfg.Addrs, ",")
				}
				fmt.Fprintf(e.stdout, "dedupnode demo: %d events through %s into a ledger, %d consumers × %d workers, on %s\n",
					cfg.Messages, demo.BrokerTitle(cfg.Broker), cfg.Consumers, cfg.Workers, where)
			}
			sum, err := demo.Run(e.ctx, cfg)
			if err != nil {
				if errors.Is(err, e.ctx.Err()) && e.ctx.Err() != nil {
					return &opError{err: errors.New("interrupted")}
				}
				return &opError{err: err, hint: "re-run with --log-level info to see the nodes' and consumers' logs"}
			}
			if output == "json" {
				enc := json.NewEncoder(e.stdout)
				if err := enc.Encode(sum); err != nil {
					return err
				}
			} else {
				printDemo(e, sum)
			}
			if !sum.OK {
				return &opError{err: errors.New("the checks failed (see the summary)")}
			}
			return nil
		}),
	}
	cf.registerConn(cmd)
	addr := cmd.Flags().Lookup("addr")
	addr.Usage = "use the running cluster at `HOST:PORT`[,...] instead of starting one (its namespaces need not auto-create: the demo creates its own); then --tls-*, --token and their DEDUPNODE_* variables apply"
	addr.DefValue = "[]"
	fs := cmd.Flags()
	fs.StringVar(&cfg.Broker, "broker", "nats", "`BROKER` the events go through: nats (NATS JetStream, embedded in this process), kafka (an in-process Kafka cluster) or rabbitmq (the machine's rabbitmq-server, started for the run)")
	fs.IntVar(&cfg.Messages, "messages", 100_000, "unique events to publish (`N`)")
	fs.IntVar(&cfg.Consumers, "consumers", 4, "`N` consumer processes, each with its own broker connection and dedupnode client")
	fs.IntVar(&cfg.Workers, "workers", 64, "messages (`N`) each consumer handles at once")
	fs.DurationVar(&cfg.KillLeaderEvery, "kill-leader-every", 0, "kill the leader node abruptly and restart it, again and again while consumers run: each leader leads for `DURATION` (e.g. 5s; 0 = never)")
	fs.Float64Var(&cfg.RetryRate, "retry-rate", cfg.RetryRate, "share (`0..1`) of events the producer publishes again 1-3 s later")
	fs.Float64Var(&cfg.ReplayRate, "replay-rate", cfg.ReplayRate, "size of the older range replayed, as a share (`0..1`) of --messages")
	fs.Float64Var(&cfg.CrashRate, "crash-rate", cfg.CrashRate, "chance (`0..1`) that a delivery crashes its consumer mid-message")
	fs.Float64Var(&cfg.StallRate, "stall-rate", cfg.StallRate, "chance (`0..1`) that a delivery stalls its handler past AckWait")
	fs.DurationVar(&cfg.AckWait, "ack-wait", 2*time.Second, "JetStream AckWait and RabbitMQ consumer_timeout: an unacknowledged delivery is redelivered after this `DURATION` (stalls last 1.5 × it on every broker)")
	fs.DurationVar(&cfg.Lease, "lease", 5*time.Second, "claim lease per message: a crashed consumer's messages are processed again after this `DURATION`")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "`SEED` for the events and the crashes and stalls among them (0: from the clock)")
	cfg.Timeout = 15 * time.Minute
	fs.Var(durationValue{&cfg.Timeout}, "timeout", "give up after this `DURATION`")
	fs.StringVar(&cfg.Dir, "data-dir", "", "keep the cluster's, the broker's and the ledger's data in `DIR`, new or empty: a run starts from nothing (default: a temporary folder, deleted)")
	fs.StringVarP(&output, "output", "o", "text", "output `FORMAT`: text or json (one object)")
	fs.BoolVar(&noProgress, "no-progress", false, "no progress bar (it is shown only when stderr is a terminal)")
	fs.StringVar(&logLevel, "log-level", "error", "log `LEVEL` on stderr: debug, info, warn or error; given, the local nodes log too")
	return cmd
}

func printDemo(e *env, s demo.Summary) {
	w := e.stdout
	n := func(v int64) string { return groupDigits(v) }
	fmt.Fprintf(w, "\n  published               %9s   %s unique + %s producer retries 1-3 s later + %s replayed\n",
		n(int64(s.Published)), n(int64(s.UniqueIDs)), n(int64(s.ProducerRetries)), n(int64(s.Replayed)))
	fmt.Fprintf(w, "  deliveries              %9s   %s of them redeliveries\n", n(s.Deliveries), n(s.Redeliveries))
	fmt.Fprintf(w, "  duplicates suppressed   %9s   already processed: acked, handler not run\n", n(s.DuplicatesSuppressed))
	fmt.Fprintf(w, "  deferred, in progress   %9s   another consumer held the claim: tried again later\n", n(s.InProgressDeferred))
	fmt.Fprintf(w, "  consumer crashes        %9s   stalls past AckWait: %s, handler runs abandoned or failed: %s\n", n(s.ConsumerCrashes), n(s.ConsumerStalls), n(s.HandlerFailures))
	if s.LeaderKills > 0 || s.Unavailable > 0 {
		fmt.Fprintf(w, "  leader kills            %9s   deliveries retried while no leader answered: %s\n", n(s.LeaderKills), n(s.Unavailable))
	}
	fmt.Fprintf(w, "  effects applied         %9s   to %d accounts\n", n(s.EffectsApplied), s.Accounts)
	fmt.Fprintf(w, "  ledger total            %9s   expected %s\n", n(s.LedgerTotal), n(s.ExpectedTotal))
	fmt.Fprintf(w, "  re-runs refused by ledger %7s   commits unconfirmed (crash between effect and commit): %s\n", n(int64(s.LedgerRepeatsRefused)), n(s.CommitUnconfirmed))
	fmt.Fprintf(w, "  time                    %8.1fs   %s messages/s overall; 99%% acked after %.1fs (%s messages/s)\n",
		s.Seconds, n(int64(s.MessagesPerSecond)), s.SecondsTo99, n(int64(s.MessagesPerSecondTo99)))
	fmt.Fprintf(w, "  consumers               %9d   × %d workers each; broker: %s; cluster: %s\n\n", s.Consumers, s.Workers, demo.BrokerTitle(s.Broker), s.Cluster)
	for _, c := range s.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s: %s\n", mark, c.Name, c.Detail)
	}
	if s.OK {
		fmt.Fprintln(w, "ok")
	} else {
		fmt.Fprintln(w, "FAILED")
	}
}

// groupDigits prints v with thousands separators: 100000 → "100,000".
func groupDigits(v int64) string {
	s := fmt.Sprint(v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
