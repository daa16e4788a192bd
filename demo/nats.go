package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupnode/dedupnode/integrations/natsdedup"
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

// natsBroker runs the demo on an embedded NATS server: stream DEMO
// (subject demo.events, in memory) and the durable pull consumer
// "ledger", read through natsdedup.
type natsBroker struct {
	cfg    BrokerConfig
	srv    *NATS
	nc     *nats.Conn // the producer's
	js     jetstream.JetStream
	stream jetstream.Stream
	cons   jetstream.Consumer

	mu     sync.Mutex
	acked  []bool // by stream sequence
	ackedN int64
}

func openNATSBroker(ctx context.Context, cfg BrokerConfig) (_ Broker, err error) {
	b := &natsBroker{cfg: cfg, acked: make([]bool, cfg.Published+1)}
	if b.srv, err = StartNATS(cfg.Dir); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if b.nc, err = nats.Connect(b.srv.URL(), nats.Name("demo-producer")); err != nil {
		return nil, err
	}
	if b.js, err = jetstream.New(b.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return nil, err
	}
	b.stream, err = b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "DEMO", Subjects: []string{"demo.events"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	b.cons, err = b.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "ledger", AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait, MaxDeliver: -1,
		MaxAckPending: cfg.Consumers * cfg.Workers * 4,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}
	return b, nil
}

func (b *natsBroker) Publish(ctx context.Context, body []byte) error {
	for {
		_, err := b.js.PublishMsgAsync(&nats.Msg{Subject: "demo.events", Data: body})
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond) // async window full or reconnecting
	}
}

func (b *natsBroker) Flush(ctx context.Context) error {
	select {
	case <-b.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *natsBroker) Acked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ackedN
}

func (b *natsBroker) Drained(ctx context.Context, published int) (bool, error) {
	info, err := b.cons.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream >= uint64(published), nil
}

func (b *natsBroker) Close() error {
	if b.nc != nil {
		b.nc.Close()
	}
	b.srv.Close()
	return nil
}

func (b *natsBroker) NewConsumer(ctx context.Context, spec ConsumerSpec) (Consumer, error) {
	nc, err := nats.Connect(b.srv.URL(), nats.Name(spec.Name))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := js.Consumer(ctx, "DEMO", b.cons.CachedInfo().Name)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsConsumer{b: b, spec: spec, nc: nc, cons: cons}, nil
}

type natsConsumer struct {
	b    *natsBroker
	spec ConsumerSpec
	nc   *nats.Conn
	cons jetstream.Consumer
}

func (c *natsConsumer) Kill() { c.nc.Close() }

func (c *natsConsumer) Run(ctx context.Context) error {
	defer c.nc.Close()
	h, err := natsdedup.New(natsdedup.Config{
		Processor: c.spec.Processor,
		Namespace: c.spec.Namespace,
		ID:        natsdedup.JSONFieldID(c.spec.IDField),
		Handler: func(ctx context.Context, msg jetstream.Msg) error {
			return c.spec.Handler(ctx, msg.Data())
		},
		RetryDelay:      c.spec.RetryDelay,
		InProgressDelay: c.spec.InProgressDelay,
		ProcessOptions:  c.spec.ProcessOptions,
		Observe:         c.observe,
		Context:         ctx,
	})
	if err != nil {
		return err
	}
	return h.Consume(ctx, c.cons, c.spec.Workers, jetstream.PullMaxMessages(2*c.spec.Workers))
}

func (c *natsConsumer) observe(msg jetstream.Msg, res natsdedup.Result) {
	md, err := msg.Metadata()
	c.spec.Observe(Delivery{
		ID: res.ID, Outcome: res.Outcome, Ran: res.Ran, Err: res.Err,
		Redelivered: err == nil && md.NumDelivered > 1,
	})
	if res.Action == natsdedup.ActionAck && res.AckErr == nil && err == nil {
		b := c.b
		b.mu.Lock()
		if s := md.Sequence.Stream; s < uint64(len(b.acked)) && !b.acked[s] {
			b.acked[s] = true
			b.ackedN++
		}
		b.mu.Unlock()
	}
}
