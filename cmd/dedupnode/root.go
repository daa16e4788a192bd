package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dedupnode/dedupnode/cluster"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // operational: a node unreachable, a request refused
	exitUsage = 2 // bad flags or arguments
)

// usageError marks an error as the caller's misuse of the command line.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// opError is an operational failure with an optional hint saying what to
// do about it.
type opError struct {
	err  error
	hint string
}

func (e *opError) Error() string { return e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// env holds the process's streams, so that tests can run commands in
// process.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// progName is how the user invokes us, for printed examples.
	progName string
	// args is the command line after the program name, for printing the
	// command to run again.
	args []string
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, progName: progName(), args: args}
	root := newRootCmd(e)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	if cmd == nil {
		cmd = root
	}
	name := cmd.CommandPath()
	var ue *usageError
	var oe *opError
	switch {
	case errors.As(err, &oe):
		msg := oneLine(err.Error())
		if oe.hint != "" {
			msg += "; " + oe.hint
		}
		fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		return exitError
	case errors.As(err, &ue) || !isRunError(err):
		fmt.Fprintf(stderr, "%s: %s; see '%s --help'\n", name, oneLine(err.Error()), name)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "%s: %s\n", name, oneLine(err.Error()))
		return exitError
	}
}

// runError marks errors returned from a command's RunE (as opposed to
// cobra's own parse errors, which are usage errors).
type runError struct{ err error }

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

func isRunError(err error) bool {
	var re *runError
	return errors.As(err, &re)
}

// runE adapts a command body: errors it returns are operational unless they
// are usage errors.
func runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := fn(cmd, args); err != nil {
			return &runError{err}
		}
		return nil
	}
}

// oneLine folds a multi-line message (cobra's suggestions, wrapped errors)
// into one line.
func oneLine(s string) string {
	// Cobra's "unknown command" error lists its suggestions on lines of
	// their own under "Did you mean this?": fold them into a question.
	if head, sugg, ok := strings.Cut(s, "Did you mean this?"); ok {
		if names := strings.Fields(sugg); len(names) > 0 {
			return oneLine(head) + " (did you mean " + strings.Join(names, " or ") + "?)"
		}
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return strings.Join(fields, " ")
}

func progName() string {
	p := os.Args[0]
	switch {
	case strings.Contains(p, "go-build"):
		return "go run ./cmd/dedupnode"
	case p == "" || strings.HasPrefix(filepath.Base(p), "dedupnode.test"):
		return "dedupnode"
	}
	return p // as typed: "dedupnode" from $PATH, "./dedupnode", ...
}

const rootLong = `dedupnode is a replicated message-deduplication store: consumers of
at-least-once brokers (Kafka, RabbitMQ, NATS, SQS, webhooks) ask it, per
message ID, "did I already handle this?", and the answer survives the loss
of any minority of nodes.

Start a local 3-node cluster, then mark and check IDs against it:

  dedupnode dev
  dedupnode mark  --addr 127.0.0.1:7070,127.0.0.1:7071,127.0.0.1:7072 order-1 order-2
  dedupnode check --addr 127.0.0.1:7070 order-1 order-3

Client commands read DEDUPNODE_ADDR, DEDUPNODE_NAMESPACE and the other
DEDUPNODE_<FLAG> variables for their connection and output flags (see a
command's --help); serve reads one for every flag.

Exit codes: 0 success (for mark, check, claim, ...: every ID got an answer,
whatever it is: per-ID results such as duplicate or lease_lost are in the
output), 1 operational error, 2 usage error.

Shell completion: source <(dedupnode completion bash) (or zsh, fish,
powershell; see 'dedupnode completion SHELL --help').`

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "dedupnode",
		Short:         "Replicated message-deduplication store: server, dev cluster and client",
		Long:          rootLong,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a subcommand: a usage error pointing to --help.
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q", args[0])
			}
			return usagef("no command given (try 'dedupnode dev' to start a local cluster)")
		},
	}
	root.Version = versionLine()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })

	root.AddGroup(
		&cobra.Group{ID: "server", Title: "Run a cluster:"},
		&cobra.Group{ID: "dedup", Title: "Deduplicate message IDs:"},
		&cobra.Group{ID: "admin", Title: "Administer namespaces and the cluster:"},
	)
	for _, c := range []*cobra.Command{newServeCmd(e), newDevCmd(e), newCertsCmd()} {
		c.GroupID = "server"
		root.AddCommand(c)
	}
	for _, c := range newOpCmds(e) {
		c.GroupID = "dedup"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{newStatusCmd(e), newMembersCmd(e), newNamespaceCmd(e), newJoinCmd(e), newRemoveCmd(e), newTransferLeaderCmd(e),
		newPromoteCmd(e), newBackupCmd(e), newRestoreCmd(e), newExportCmd(e), newImportCmd(e), newDigestCmd(e),
		newClusterSettingCmd(e)} {
		c.GroupID = "admin"
		root.AddCommand(c)
	}
	root.AddCommand(newVersionCmd(e))
	root.AddCommand(newChaosCmd())
	root.AddCommand(newBenchCmd())
	root.AddCommand(newWanSimCmd(e))
	root.AddCommand(newWebhookProxyCmd(e))
	root.AddCommand(newDemoCmd(e))
	// Cobra's completion command, made now rather than at Execute so
	// that a shell it has no script for is refused (it printed the help
	// and exited 0).
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(_ *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usagef("no completion for shell %q: want bash, zsh, fish or powershell", args[0])
				}
				return usagef("name the shell: bash, zsh, fish or powershell (e.g. source <(dedupnode completion bash))")
			}
		}
	}
	completeFlagValues(root)
	return root
}

// flagValues are the words the flags of these names take, whichever
// command they belong to, offered by shell completion ('dedupnode
// completion SHELL'), which otherwise offers file names.
var flagValues = map[string][]string{
	"output":         {"text", "json"},
	"consistency":    {"linearizable", "stale", "bounded"},
	"log-level":      {"debug", "info", "warn", "error"},
	"log-format":     {"text", "json"},
	"raft-log-store": {string(cluster.LogStoreWAL), string(cluster.LogStoreBoltDB)},
}

// completeFlagValues registers flagValues' completions on c and every
// command under it.
func completeFlagValues(c *cobra.Command) {
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if words, ok := flagValues[f.Name]; ok {
			// Fails only for a flag c does not have or one registered
			// twice: neither happens in a walk of c's own flags.
			if err := c.RegisterFlagCompletionFunc(f.Name, cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp)); err != nil {
				panic(err)
			}
		}
	})
	for _, sub := range c.Commands() {
		completeFlagValues(sub)
	}
}

// applyEnv sets each flag of fs that was not given on the command line from
// the environment variable DEDUPNODE_<FLAG> (upper case, '-' → '_'), when
// set. Flags take precedence over the environment.
func applyEnv(fs *pflag.FlagSet, names ...string) error {
	var errs []error
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || f.Changed {
			continue
		}
		key := envKey(name)
		v, ok := os.LookupEnv(key)
		if !ok {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, usagef("%s=%q: %v", key, v, err))
			continue
		}
		f.Changed = true
		_ = fs.SetAnnotation(name, envAnnotation, []string{key}) // name exists: Lookup found it
	}
	return errors.Join(errs...)
}

// envAnnotation marks a flag whose value applyEnv took from the
// environment; its value is the variable's name.
const envAnnotation = "dedupnode-env"

// flagValue names flag name of fs with value, as a usage error quotes it:
// `--addr "x"` when it was given on the command line (or is the default),
// `DEDUPNODE_ADDR="x"` when applyEnv took it from the environment.
func flagValue(fs *pflag.FlagSet, name string, value any) string {
	if f := fs.Lookup(name); f != nil {
		if key := f.Annotations[envAnnotation]; len(key) == 1 {
			return fmt.Sprintf("%s=%q", key[0], fmt.Sprint(value))
		}
	}
	return fmt.Sprintf("--%s %q", name, fmt.Sprint(value))
}

// flagName is flagValue without the value: "--addr" or "DEDUPNODE_ADDR".
func flagName(fs *pflag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		if key := f.Annotations[envAnnotation]; len(key) == 1 {
			return key[0]
		}
	}
	return "--" + name
}

func envKey(flag string) string {
	return "DEDUPNODE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}
