package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupnode/dedupnode/integrations/amqpdedup"
	"github.com/dedupnode/dedupnode/internal/rabbitproc"
)

// rabbitQueue is the demo's queue: classic, transient (the broker lives
// for one run).
const rabbitQueue = "demo-events"

// rabbitSeqHeader carries each published message's sequence number (1..),
// so that acknowledgements can be counted per message.
const rabbitSeqHeader = "x-demo-seq"

// rabbitBroker runs the demo on a RabbitMQ server started for the run
// (rabbitproc: its own node, ports and data directory; stopped by PID at
// the end), read through amqpdedup. The broker's consumer_timeout is
// AckWait: a handler stalled past it gets its channel closed by the
// broker, and every delivery unacknowledged on that channel comes again
// (flagged Redelivered), like JetStream's AckWait redeliveries.
type rabbitBroker struct {
	cfg  BrokerConfig
	srv  *rabbitproc.Server
	conn *amqp.Connection // the producer's
	ch   *amqp.Channel    // confirm mode

	pubMu   sync.Mutex
	seq     int64
	pending []*amqp.DeferredConfirmation

	mu     sync.Mutex
	acked  []bool // by sequence number
	ackedN int64
}

// maxUnconfirmed bounds the publishes awaiting the broker's confirm.
const maxUnconfirmed = 4096

func openRabbitBroker(ctx context.Context, cfg BrokerConfig) (_ Broker, err error) {
	if _, err := rabbitproc.Find(); err != nil {
		return nil, fmt.Errorf("--broker rabbitmq: %w", err)
	}
	b := &rabbitBroker{cfg: cfg, acked: make([]bool, cfg.Published+1)}
	start := time.Now()
	b.srv, err = rabbitproc.Start(ctx, rabbitproc.Config{Dir: cfg.Dir, ConsumerTimeout: cfg.AckWait, TickInterval: max(cfg.AckWait/10, 100*time.Millisecond)})
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("RabbitMQ started", "pid", b.srv.PID(), "url", b.srv.URL(), "after", time.Since(start).Round(time.Millisecond), "log", b.srv.LogPath())
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if b.conn, err = amqp.DialConfig(b.srv.URL(), amqp.Config{Properties: amqp.Table{"connection_name": "demo-producer"}}); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	if b.ch, err = b.conn.Channel(); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	if err = b.ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	if _, err = b.ch.QueueDeclare(rabbitQueue, false, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: declare %s: %w", rabbitQueue, err)
	}
	return b, nil
}

func (b *rabbitBroker) Publish(ctx context.Context, body []byte) error {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	if len(b.pending) >= maxUnconfirmed {
		if err := b.waitConfirms(ctx); err != nil {
			return err
		}
	}
	b.seq++
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, "", rabbitQueue, false, false, amqp.Publishing{
		Headers: amqp.Table{rabbitSeqHeader: b.seq}, Body: body, DeliveryMode: amqp.Transient,
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: publish: %w", err)
	}
	b.pending = append(b.pending, dc)
	return nil
}

// waitConfirms waits for every pending confirm; pubMu held.
func (b *rabbitBroker) waitConfirms(ctx context.Context) error {
	for _, dc := range b.pending {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("rabbitmq: publish confirm: %w", err)
		}
		if !ok {
			return errors.New("rabbitmq: the broker refused a published message (nack)")
		}
	}
	b.pending = b.pending[:0]
	return nil
}

func (b *rabbitBroker) Flush(ctx context.Context) error {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	return b.waitConfirms(ctx)
}

func (b *rabbitBroker) Acked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ackedN
}

// Drained: every message acknowledged once at least, none ready, and (the
// broker's own count, asked last because it is slow) none unacknowledged:
// an ack that raced a channel close may have been lost, and its message
// is then on its way again.
func (b *rabbitBroker) Drained(ctx context.Context, published int) (bool, error) {
	if b.Acked() < int64(published) {
		return false, nil
	}
	q, err := b.ch.QueueDeclarePassive(rabbitQueue, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("rabbitmq: inspect %s: %w", rabbitQueue, err)
	}
	if q.Messages > 0 {
		return false, nil
	}
	ready, unacked, err := b.srv.QueueCounts(ctx, rabbitQueue)
	if err != nil {
		return false, err
	}
	return ready == 0 && unacked == 0, nil
}

func (b *rabbitBroker) Close() error {
	if b.conn != nil {
		b.conn.Close()
	}
	return b.srv.Close()
}

func (b *rabbitBroker) NewConsumer(ctx context.Context, spec ConsumerSpec) (Consumer, error) {
	c := &rabbitConsumer{b: b, spec: spec}
	dial := amqp.DefaultDial(10 * time.Second)
	conn, err := amqp.DialConfig(b.srv.URL(), amqp.Config{
		Properties: amqp.Table{"connection_name": spec.Name},
		Dial: func(network, addr string) (net.Conn, error) {
			nc, err := dial(network, addr)
			if err == nil {
				c.mu.Lock()
				c.sock = nc
				c.mu.Unlock()
			}
			return nc, err
		},
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	c.conn = conn
	if c.ch, err = conn.Channel(); err == nil {
		// Prefetch no more than the workers take: a delivery waiting in
		// the client's buffer ages toward consumer_timeout too.
		err = c.ch.Qos(spec.Workers, 0, false)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rabbitmq: channel: %w", err)
	}
	return c, nil
}

type rabbitConsumer struct {
	b    *rabbitBroker
	spec ConsumerSpec
	conn *amqp.Connection
	ch   *amqp.Channel

	mu   sync.Mutex
	sock net.Conn
}

// Kill closes the TCP connection under the AMQP one, as a dying process's
// would close: no connection.close, no more acks; the broker requeues
// everything it had delivered to this consumer.
func (c *rabbitConsumer) Kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sock != nil {
		c.sock.Close()
	}
}

func (c *rabbitConsumer) Run(ctx context.Context) error {
	defer c.conn.Close()
	// A delivery held for a delayed requeue counts against the broker's
	// consumer_timeout (AckWait): hold it well within.
	hold := max(c.b.cfg.AckWait/4, 50*time.Millisecond)
	h, err := amqpdedup.New(amqpdedup.Config{
		Processor: c.spec.Processor,
		Namespace: c.spec.Namespace,
		ID:        amqpdedup.JSONFieldID(c.spec.IDField),
		Handler: func(ctx context.Context, d *amqp.Delivery) error {
			return c.spec.Handler(ctx, d.Body)
		},
		RetryDelay:      min(c.spec.RetryDelay, hold),
		InProgressDelay: min(c.spec.InProgressDelay, hold),
		ProcessOptions:  c.spec.ProcessOptions,
		Observe:         c.observe,
		Context:         ctx,
	})
	if err != nil {
		return err
	}
	return h.Consume(ctx, c.ch, rabbitQueue, c.spec.Workers)
}

func (c *rabbitConsumer) observe(d *amqp.Delivery, res amqpdedup.Result) {
	c.spec.Observe(Delivery{ID: res.ID, Outcome: res.Outcome, Ran: res.Ran, Err: res.Err, Redelivered: d.Redelivered})
	if res.Action != amqpdedup.ActionAck || res.AckErr != nil {
		return
	}
	seq, ok := d.Headers[rabbitSeqHeader].(int64)
	if !ok {
		return
	}
	b := c.b
	b.mu.Lock()
	if seq > 0 && seq < int64(len(b.acked)) && !b.acked[seq] {
		b.acked[seq] = true
		b.ackedN++
	}
	b.mu.Unlock()
}
