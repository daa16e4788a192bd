package demo

import (
	"errors"
	"fmt"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// NATS is an embedded NATS server with JetStream on, listening on a
// loopback port chosen by the OS.
type NATS struct {
	srv *natsserver.Server
}

// StartNATS starts an embedded NATS server with JetStream storing in dir
// and waits until it accepts connections.
func StartNATS(dir string) (*NATS, error) {
	if dir == "" {
		return nil, errors.New("embedded NATS: a store directory is required")
	}
	srv, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "dedupnode-demo",
		Host:       "127.0.0.1",
		Port:       -1, // any free port
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("embedded NATS: not ready for connections within 30s")
	}
	return &NATS{srv: srv}, nil
}

// URL is the server's client URL (nats://127.0.0.1:PORT).
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Close shuts the server down and waits until it stopped.
func (n *NATS) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}
