// Command dedupnode is the dedupnode server, local dev cluster and client
// CLI in one binary. Run `dedupnode --help` for the commands.
//
// Exit codes: 0 success, 1 operational error (a node unreachable, a request
// refused), 2 usage error (bad flags or arguments). Errors go to stderr in
// one line saying what happened and what to do.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
