package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dedupnode/dedupnode/security"
)

const certsLong = `Create a development certificate authority and certificates for every
node and one client, using only the Go standard library:

  DIR/ca.crt, DIR/ca.key        the CA (reused if both already exist, so
                                nodes can be added later: run certs again
                                with the new --nodes only)
  DIR/<node>.crt, DIR/<node>.key  one per --nodes name: server and client
                                certificate for gRPC and Raft; SANs are the
                                node name, localhost, 127.0.0.1, ::1 and --hosts
  DIR/client.crt, DIR/client.key  a client-only certificate (cannot act as a
                                node, even though the same CA signed it);
                                kept if both exist when nodes are added

Keys are ECDSA P-256, written with mode 0600. Keep ca.key off the nodes.

Then run each node with TLS everywhere (mutual TLS for clients and Raft):

  dedupnode serve --node-id n1 --tls-cert DIR/n1.crt --tls-key DIR/n1.key \
      --tls-ca DIR/ca.crt --tls-client-ca DIR/ca.crt ...
  dedupnode status --addr 127.0.0.1:7070 --tls-ca DIR/ca.crt \
      --tls-cert DIR/client.crt --tls-key DIR/client.key`

func newCertsCmd() *cobra.Command {
	var (
		out      string
		nodes    []string
		hosts    []string
		client   string
		noClient bool
		force    bool
		validity time.Duration
	)
	cmd := &cobra.Command{
		Use:   "certs --out DIR --nodes n1,n2,n3",
		Short: "Create a development CA and node/client certificates for TLS",
		Long:  certsLong,
		Example: `  dedupnode certs --out certs --nodes n1,n2,n3
  dedupnode certs --out certs --nodes n4 --hosts 10.0.0.4,n4.internal   # add a node later (same CA)
  dedupnode certs --out certs --nodes n1,n2,n3 --no-client --force      # renew the node certificates`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: the directory to write the certificates to")
			}
			var names []string
			for _, n := range nodes {
				if n = strings.TrimSpace(n); n != "" {
					names = append(names, n)
				}
			}
			if len(names) == 0 && noClient {
				return usagef("nothing to do: give --nodes, or drop --no-client")
			}
			if validity < 0 {
				return usagef("--validity must be positive")
			}
			// Adding nodes to an existing DIR keeps its client
			// certificate, as it keeps the CA (--force replaces it).
			keptClient := false
			if !noClient && !force && len(names) > 0 && !cmd.Flags().Changed("client-name") &&
				fileExists(filepath.Join(out, "client.crt")) && fileExists(filepath.Join(out, "client.key")) {
				noClient, keptClient = true, true
			}
			written, err := security.WriteDevPKI(out, security.DevPKIOptions{
				Nodes:    names,
				Hosts:    hosts,
				Client:   client,
				NoClient: noClient,
				Force:    force,
				Validity: validity,
			})
			w := cmd.OutOrStdout()
			for _, p := range written {
				fmt.Fprintln(w, "wrote", p)
			}
			if err != nil {
				return &opError{err: err}
			}
			if len(written) == 0 {
				return nil
			}
			ca := filepath.Join(out, "ca.crt")
			fmt.Fprintf(w, "\nserve with:   --tls-cert %s --tls-key %s --tls-ca %s --tls-client-ca %s\n",
				filepath.Join(out, "<node>.crt"), filepath.Join(out, "<node>.key"), ca, ca)
			if keptClient {
				fmt.Fprintf(w, "kept %s and %s (--force replaces them)\n", filepath.Join(out, "client.crt"), filepath.Join(out, "client.key"))
			}
			if !noClient || keptClient {
				fmt.Fprintf(w, "clients use:  --tls-ca %s --tls-cert %s --tls-key %s\n",
					ca, filepath.Join(out, "client.crt"), filepath.Join(out, "client.key"))
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&out, "out", "", "`DIR`ectory to write into (created with mode 0700 if missing)")
	fs.StringSliceVar(&nodes, "nodes", nil, "comma-separated node `NAMES`; each gets NAME.crt and NAME.key, with NAME as a DNS SAN")
	fs.StringSliceVar(&hosts, "hosts", nil, "extra `SANS` (DNS names or IP addresses) added to every node certificate, for nodes reached by another address than their name, localhost or 127.0.0.1")
	fs.StringVar(&client, "client-name", "client", "common `NAME` of the client certificate (files are always client.crt and client.key)")
	fs.BoolVar(&noClient, "no-client", false, "do not create client.crt and client.key")
	fs.BoolVar(&force, "force", false, "overwrite existing node and client files (the CA is always reused when present)")
	validity = security.DefaultCertValidity
	fs.Var(durationValue{&validity}, "validity", "validity `DURATION` of the node and client certificates (capped at the CA's expiry)")
	return cmd
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
