package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/fsm"
	"github.com/spf13/cobra"
)

// nsJSON is the --output json shape of a namespace. Durations are given
// both in milliseconds and as text.
type nsJSON struct {
	Name           string `json:"name"`
	DefaultTTL     string `json:"default_ttl"`
	DefaultTTLMs   int64  `json:"default_ttl_ms"`
	MaxTTL         string `json:"max_ttl"`
	MaxTTLMs       int64  `json:"max_ttl_ms"`
	MaxIDBytes     int    `json:"max_id_bytes"`
	Mode           string `json:"mode"`
	DefaultLease   string `json:"default_lease"`
	DefaultLeaseMs int64  `json:"default_lease_ms"`
	BucketWidthMs  int64  `json:"bucket_width_ms"`
}

func toNSJSON(n client.Namespace) nsJSON {
	return nsJSON{
		Name:       n.Name,
		DefaultTTL: fmtDuration(n.DefaultTTL), DefaultTTLMs: n.DefaultTTL.Milliseconds(),
		MaxTTL: fmtDuration(n.MaxTTL), MaxTTLMs: n.MaxTTL.Milliseconds(),
		MaxIDBytes:   n.MaxIDBytes,
		Mode:         n.Mode.String(),
		DefaultLease: fmtDuration(n.DefaultLease), DefaultLeaseMs: n.DefaultLease.Milliseconds(),
		BucketWidthMs: n.BucketWidth.Milliseconds(),
	}
}

func printNamespaces(w io.Writer, format string, nss []client.Namespace) error {
	if format == "json" {
		for _, n := range nss {
			if err := writeJSON(w, toNSJSON(n)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTTL\tMAX TTL\tMAX ID BYTES\tMODE\tLEASE")
	for _, n := range nss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", n.Name, fmtDuration(n.DefaultTTL), fmtDuration(n.MaxTTL), n.MaxIDBytes, n.Mode, fmtDuration(n.DefaultLease))
	}
	return tw.Flush()
}

// nsSettings are the flags of namespace create and update.
type nsSettings struct {
	ttl, maxTTL, lease time.Duration
	maxIDBytes         int
	mode               string
}

func (s *nsSettings) register(cmd *cobra.Command, update bool) {
	fs := cmd.Flags()
	def := func(d string) string {
		if update {
			return "unchanged"
		}
		return d
	}
	fs.Var(durationValue{&s.ttl}, "ttl", "default TTL of records, a `DURATION` such as 5m, 24h, 7d (default "+def("24h")+")")
	fs.Var(durationValue{&s.maxTTL}, "max-ttl", "largest TTL a request may ask for, a `DURATION` (default "+def("7d")+")")
	fs.IntVar(&s.maxIDBytes, "max-id-bytes", 0, "longest ID accepted, in `BYTES` (default "+def("512")+")")
	fs.StringVar(&s.mode, "mode", "", "expiry `MODE`: fixed (duplicates never extend expiry) or sliding (each duplicate mark extends it by the TTL) (default "+def("fixed")+")")
	fs.Var(durationValue{&s.lease}, "lease", "default claim lease, a `DURATION` such as 30s (default "+def("30s")+")")
}

// namespace is the namespace name with s's settings. It refuses, as usage
// errors, a name the nodes would refuse (fsm's rule) and a setting given
// as 0 (as mark --ttl 0 is refused: omit the flag for the default).
func (s *nsSettings) namespace(cmd *cobra.Command, name string, update bool) (client.Namespace, error) {
	var inv *fsm.InvalidError
	if err := fsm.ValidateNamespaceName(name); errors.As(err, &inv) {
		return client.Namespace{}, usagef("NAME: %s", inv.Reason)
	}
	for _, flag := range []string{"ttl", "max-ttl", "lease", "max-id-bytes"} {
		if fl := cmd.Flags().Lookup(flag); fl.Changed && (fl.Value.String() == "" || fl.Value.String() == "0") {
			what := "the default"
			if update {
				what = "the current value"
			}
			return client.Namespace{}, usagef("--%s 0: omit --%s to keep %s", flag, flag, what)
		}
	}
	mode, err := client.ParseExpiryMode(s.mode)
	if err != nil {
		return client.Namespace{}, usagef("--mode: %v", err)
	}
	if s.maxIDBytes < 0 {
		return client.Namespace{}, usagef("--max-id-bytes must be positive")
	}
	return client.Namespace{Name: name, DefaultTTL: s.ttl, MaxTTL: s.maxTTL, MaxIDBytes: s.maxIDBytes, Mode: mode, DefaultLease: s.lease}, nil
}

func newNamespaceCmd(e *env) *cobra.Command {
	ex := func(s string) string { return strings.ReplaceAll(s, "dedupnode ", e.progName+" ") }
	cmd := &cobra.Command{
		Use:     "namespace",
		Aliases: []string{"ns"},
		Short:   "Create, update, describe, list and delete namespaces",
		Long: `A namespace is an independent dedup space, typically one per consumer
group, with its own default TTL, maximum TTL, ID size limit, expiry mode and
claim lease. The namespace "default" (TTL 24h) always exists and is used
when --namespace is not given. A time-window dedup (the SQS FIFO 5-minute
window) is a namespace whose TTL is the window.`,
		Example: ex(`  dedupnode namespace create payments --ttl 5m --max-ttl 1h
  dedupnode namespace create pushes --ttl 10m --mode sliding
  dedupnode namespace list
  dedupnode mark --namespace payments evt-1`),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("give a subcommand: create, update, describe, list or delete")
		},
	}

	// withClient runs fn under f.call and prints the namespaces it returns
	// (none when nil).
	withClient := func(f *clientFlags, cmd *cobra.Command, name string, fn func(ctx context.Context, c *client.Client) ([]client.Namespace, error)) error {
		return f.call(e.ctx, cmd, func(ctx context.Context, c *client.Client) error {
			nss, err := fn(ctx, c)
			if err != nil {
				if se := nsSettingError(err); se != nil {
					return se
				}
				return explainNS(err, f, name)
			}
			if nss == nil {
				return nil
			}
			return printNamespaces(e.stdout, f.output, nss)
		})
	}

	// writeNS is create's and update's RunE: the namespace named by the
	// argument with s's settings, sent with op.
	writeNS := func(f *clientFlags, s *nsSettings, update bool, op func(*client.Client, context.Context, client.Namespace) (client.Namespace, error)) func(*cobra.Command, []string) error {
		return runE(func(cmd *cobra.Command, args []string) error {
			ns, err := s.namespace(cmd, args[0], update)
			if err != nil {
				return err
			}
			return withClient(f, cmd, args[0], func(ctx context.Context, c *client.Client) ([]client.Namespace, error) {
				n, err := op(c, ctx, ns)
				if err == nil && !update {
					noteCappedDefaults(e.stderr, cmd, n)
				}
				return []client.Namespace{n}, err
			})
		})
	}

	{
		f, s := &clientFlags{}, &nsSettings{}
		c := &cobra.Command{
			Use:   "create [flags] NAME",
			Short: "Create a namespace",
			Long: `Create a namespace. NAME is 1-128 characters of A-Z a-z 0-9 . _ -,
starting with a letter or digit (another NAME is a usage error). 'serve'
answers NotFound for a namespace that was not created (unless run with
--auto-create-namespaces); 'dev' creates namespaces with default settings on
the first write to them (a check creates nothing: NotFound until then). A flag not given takes its default; 0 is not a value (omit the
flag). --lease may exceed --ttl: a lease bounds processing, and the TTL
counts from the commit; both are at most --max-ttl. A value given above
--max-ttl is refused; a default not given is capped at --max-ttl (--max-ttl
5s gives a default lease of 5s, not 30s), and a note on stderr says so.`,
			Example: ex(`  dedupnode namespace create orders --ttl 24h --max-ttl 7d --lease 30s`),
			Args:    cobra.ExactArgs(1),
			RunE:    writeNS(f, s, false, (*client.Client).CreateNamespace),
		}
		f.register(c)
		s.register(c, false)
		cmd.AddCommand(c)
	}
	{
		f, s := &clientFlags{}, &nsSettings{}
		c := &cobra.Command{
			Use:     "update [flags] NAME",
			Short:   "Change a namespace's settings (flags not given keep their value)",
			Example: ex(`  dedupnode namespace update orders --ttl 48h`),
			Args:    cobra.ExactArgs(1),
			RunE:    writeNS(f, s, true, (*client.Client).UpdateNamespace),
		}
		f.register(c)
		s.register(c, true)
		cmd.AddCommand(c)
	}
	{
		f := &clientFlags{}
		c := &cobra.Command{
			Use:     "describe [flags] NAME",
			Short:   "Show a namespace's settings",
			Example: ex(`  dedupnode namespace describe default --output json`),
			Args:    cobra.ExactArgs(1),
			RunE: runE(func(cmd *cobra.Command, args []string) error {
				return withClient(f, cmd, args[0], func(ctx context.Context, c *client.Client) ([]client.Namespace, error) {
					n, err := c.DescribeNamespace(ctx, args[0])
					return []client.Namespace{n}, err
				})
			}),
		}
		f.register(c)
		cmd.AddCommand(c)
	}
	{
		f := &clientFlags{}
		c := &cobra.Command{
			Use:     "list [flags]",
			Short:   "List every namespace",
			Example: ex(`  dedupnode namespace list`),
			Args:    cobra.NoArgs,
			RunE: runE(func(cmd *cobra.Command, _ []string) error {
				return withClient(f, cmd, "", func(ctx context.Context, c *client.Client) ([]client.Namespace, error) {
					nss, err := c.ListNamespaces(ctx)
					if nss == nil && err == nil {
						nss = []client.Namespace{}
					}
					return nss, err
				})
			}),
		}
		f.register(c)
		cmd.AddCommand(c)
	}
	{
		f := &clientFlags{}
		c := &cobra.Command{
			Use:     "delete [flags] NAME",
			Short:   "Delete a namespace and every ID recorded in it",
			Example: ex(`  dedupnode namespace delete orders`),
			Args:    cobra.ExactArgs(1),
			RunE: runE(func(cmd *cobra.Command, args []string) error {
				err := withClient(f, cmd, args[0], func(ctx context.Context, c *client.Client) ([]client.Namespace, error) {
					return nil, c.DeleteNamespace(ctx, args[0])
				})
				if err != nil {
					return err
				}
				return report(e.stdout, f.output, map[string]any{"deleted": args[0]}, "namespace %s deleted", args[0])
			}),
		}
		f.register(c)
		cmd.AddCommand(c)
	}
	return cmd
}

// noteCappedDefaults says on stderr which settings the user did not give
// came out below their usual default because the namespace's max TTL
// caps them (the default TTL of 24h and lease of 30s are at most
// --max-ttl), so that no value is narrowed silently. A value given with
// its flag is never changed: above --max-ttl it is refused.
func noteCappedDefaults(w io.Writer, cmd *cobra.Command, n client.Namespace) {
	for _, d := range []struct {
		flag, what string
		usual, got time.Duration
	}{
		{"ttl", "default TTL", time.Duration(fsm.DefaultNamespaceConfig("").DefaultTTLMs) * time.Millisecond, n.DefaultTTL},
		{"lease", "default lease", time.Duration(fsm.DefaultLeaseMs) * time.Millisecond, n.DefaultLease},
	} {
		if !cmd.Flags().Changed(d.flag) && d.got < d.usual && d.got == n.MaxTTL {
			fmt.Fprintf(w, "note: %s %s is %s, not %s: capped at its --max-ttl %s (pass --%s to choose it)\n",
				n.Name, d.what, fmtDuration(d.got), fmtDuration(d.usual), fmtDuration(n.MaxTTL), d.flag)
		}
	}
}

func explainNS(err0 error, f *clientFlags, name string) error {
	err := explain(err0, f, "")
	if oe, ok := err.(*opError); ok && name != "" && errors.Is(err0, client.ErrNamespaceNotFound) {
		oe.hint = "list namespaces with 'dedupnode namespace list' or create it with 'dedupnode namespace create " + name + "'"
		if near := f.nearNamespace(name); near != "" {
			// As mark, check and export do.
			oe.hint = fmt.Sprintf("did you mean %q? Or %s", near, oe.hint)
		}
	}
	return err
}

// nsFieldFlags tells, for each namespace setting a node may refuse, the
// flags a user sets it with and the rule it broke, in those flags' terms.
var nsFieldFlags = map[string]string{
	"default_ttl_ms":   "the default TTL (--ttl) must be at least 1ms and at most the max TTL (--max-ttl)",
	"default_lease_ms": "the default lease (--lease) must be at least 1ms and at most the max TTL (--max-ttl)",
	"max_ttl_ms":       "the max TTL (--max-ttl) must be at least 1ms and at most 366d, and not below the default TTL (--ttl) or lease (--lease)",
	"max_id_bytes":     "--max-id-bytes is out of range",
}

// nsSettingError restates a node's refusal of a namespace setting in
// terms of the flags that set it (the node names its protobuf fields,
// default_ttl_ms, in milliseconds), with the node's words at the end, as
// ttlError does for a request's TTL. It returns nil when err is something
// else.
func nsSettingError(err error) error {
	e := client.AsError(err)
	rule, ok := nsFieldFlags[e.Field]
	if e.Kind != client.ErrInvalidArgument || !ok {
		return nil
	}
	return &opError{err: fmt.Errorf("%s; nothing applied (the node refused %s: %s)", rule, e.Field, e.Violation),
		hint: "see 'dedupnode namespace describe NAME' for the current settings"}
}
