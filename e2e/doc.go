// Package e2e holds end-to-end tests: they build the dedupnode binary, run
// real `dedupnode serve` processes on loopback ports, kill them with
// SIGKILL, restart them, and drive them through the CLI and the client
// package. They are skipped with -short.
package e2e
