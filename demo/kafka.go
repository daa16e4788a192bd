package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupnode/dedupnode/integrations/kafkadedup"
)

// Kafka is an in-process Kafka cluster (franz-go's kfake: the Kafka
// protocol, consumer groups, offsets, on loopback ports from the OS).
type Kafka struct {
	c *kfake.Cluster
}

// KafkaSessionTimeout is the consumer group session timeout the embedded
// cluster allows at least (Kafka's own minimum is 6 s): a consumer that
// died without leaving its group is replaced that much sooner.
const KafkaSessionTimeout = 100 * time.Millisecond

// StartKafka starts a one-broker in-process Kafka cluster with topic
// holding partitions partitions (none if topic is "").
func StartKafka(topic string, partitions int32) (*Kafka, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(KafkaSessionTimeout),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, "127.0.0.1:0") })}
	if topic != "" {
		opts = append(opts, kfake.SeedTopics(partitions, topic))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded Kafka: %w", err)
	}
	return &Kafka{c: c}, nil
}

// Addrs are the brokers' addresses (seed brokers for kgo).
func (k *Kafka) Addrs() []string { return k.c.ListenAddrs() }

// Cluster is the kfake cluster, for injecting faults.
func (k *Kafka) Cluster() *kfake.Cluster { return k.c }

// Close stops the cluster.
func (k *Kafka) Close() { k.c.Close() }

// GroupLag returns, summed over topic's partitions, how many records
// group has not committed (end offset − committed offset, counting an
// uncommitted partition from 0) and how many records the topic holds.
func GroupLag(ctx context.Context, cl *kgo.Client, group, topic string) (lag, total int64, err error) {
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	if err := ends.Error(); err != nil {
		return 0, 0, err
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		err = nil // nothing committed yet
	}
	if err != nil {
		return 0, 0, err
	}
	ends.Each(func(o kadm.ListedOffset) {
		total += o.Offset
		at := int64(0)
		if c, ok := committed.Lookup(o.Topic, o.Partition); ok && c.Err == nil && c.At >= 0 {
			at = c.At
		}
		lag += o.Offset - at
	})
	return lag, total, nil
}

// KillSwitch is a kgo dialer whose Kill cuts every connection it made and
// refuses new ones: the client is as good as a killed process's (its
// group membership lingers until the session timeout; nothing more is
// committed).
type KillSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

// Dial dials like net.Dialer unless killed.
func (k *KillSwitch) Dial(ctx context.Context, network, host string) (net.Conn, error) {
	k.mu.Lock()
	dead := k.dead
	k.mu.Unlock()
	if dead {
		return nil, errors.New("killed")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		c.Close()
		return nil, errors.New("killed")
	}
	k.conns = append(k.conns, c)
	return c, nil
}

// Killed reports whether Kill was called.
func (k *KillSwitch) Killed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

// Kill closes every connection and refuses new ones.
func (k *KillSwitch) Kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		c.Close()
	}
	k.conns = nil
}

// kafkaBroker runs the demo on an embedded Kafka cluster: topic
// demo-events (partitions: 4 per consumer), consumer group "ledger", read
// through kafkadedup.
type kafkaBroker struct {
	cfg      BrokerConfig
	k        *Kafka
	producer *kgo.Client
	admin    *kgo.Client
	inflight sync.WaitGroup
	pubErr   atomic.Value

	mu        sync.Mutex
	delivered map[kgo.EpochOffset]bool // by partition in Epoch, offset: seen by some consumer
	committed map[int32]int64          // highest committed offset per partition
}

const (
	kafkaTopic = "demo-events"
	kafkaGroup = "ledger"
)

func openKafkaBroker(_ context.Context, cfg BrokerConfig) (_ Broker, err error) {
	b := &kafkaBroker{cfg: cfg, delivered: map[kgo.EpochOffset]bool{}, committed: map[int32]int64{}}
	if b.k, err = StartKafka(kafkaTopic, int32(4*cfg.Consumers)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	// The producer is not idempotent: a retried produce whose first
	// attempt was written after all writes the record twice, as Kafka
	// producers without enable.idempotence do.
	b.producer, err = kgo.NewClient(kgo.SeedBrokers(b.k.Addrs()...), kgo.DefaultProduceTopic(kafkaTopic),
		kgo.DisableIdempotentWrite(), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(8192))
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	if b.admin, err = kgo.NewClient(kgo.SeedBrokers(b.k.Addrs()...)); err != nil {
		return nil, fmt.Errorf("kafka admin client: %w", err)
	}
	return b, nil
}

func (b *kafkaBroker) Publish(ctx context.Context, body []byte) error {
	if err, _ := b.pubErr.Load().(error); err != nil {
		return err
	}
	b.inflight.Add(1)
	b.producer.Produce(ctx, &kgo.Record{Value: body}, func(_ *kgo.Record, err error) {
		defer b.inflight.Done()
		if err != nil {
			b.pubErr.CompareAndSwap(nil, err)
		}
	})
	return nil
}

func (b *kafkaBroker) Flush(ctx context.Context) error {
	if err := b.producer.Flush(ctx); err != nil {
		return err
	}
	b.inflight.Wait()
	if err, _ := b.pubErr.Load().(error); err != nil {
		return err
	}
	return nil
}

func (b *kafkaBroker) Acked() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, o := range b.committed {
		n += o
	}
	return n
}

func (b *kafkaBroker) Drained(ctx context.Context, published int) (bool, error) {
	lag, total, err := GroupLag(ctx, b.admin, kafkaGroup, kafkaTopic)
	if err != nil {
		return false, err
	}
	return lag == 0 && total >= int64(published), nil
}

func (b *kafkaBroker) Close() error {
	if b.producer != nil {
		b.producer.Close()
	}
	if b.admin != nil {
		b.admin.Close()
	}
	b.k.Close()
	return nil
}

func (b *kafkaBroker) NewConsumer(_ context.Context, spec ConsumerSpec) (Consumer, error) {
	c := &kafkaConsumer{b: b, spec: spec, kill: &KillSwitch{}}
	d, err := kafkadedup.New(kafkadedup.Config{
		Processor: spec.Processor,
		Namespace: spec.Namespace,
		ID:        kafkadedup.IDSources{JSONField: spec.IDField, NoContent: true}.Func(),
		Handler: func(ctx context.Context, rec *kgo.Record) error {
			return spec.Handler(ctx, rec.Value)
		},
		Workers:         spec.Workers,
		RetryDelay:      spec.RetryDelay,
		InProgressDelay: spec.InProgressDelay,
		CommitInterval:  500 * time.Millisecond,
		ProcessOptions:  spec.ProcessOptions,
		Observe:         c.observe,
		OnCommit:        b.onCommit,
		Logger:          b.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	c.d = d
	c.cl, err = kgo.NewClient(append(d.ClientOpts(),
		kgo.SeedBrokers(b.k.Addrs()...),
		kgo.ClientID(spec.Name),
		kgo.ConsumerGroup(kafkaGroup),
		kgo.ConsumeTopics(kafkaTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// A crashed consumer's partitions move after the session timeout;
		// a rebalance waits for the members (a killed one never answers)
		// at most the rebalance timeout (Kafka's default is a minute).
		kgo.SessionTimeout(2*time.Second),
		kgo.RebalanceTimeout(3*time.Second),
		kgo.HeartbeatInterval(200*time.Millisecond),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.Dialer(c.kill.Dial),
		// A killed client gives up at once instead of retrying its dead
		// connections (it leaves the group only by session timeout).
		kgo.RetryTimeout(5*time.Second),
	)...)
	if err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	return c, nil
}

type kafkaConsumer struct {
	b    *kafkaBroker
	spec ConsumerSpec
	d    *kafkadedup.Consumer
	cl   *kgo.Client
	kill *KillSwitch
}

func (c *kafkaConsumer) Kill() { c.kill.Kill() }

func (c *kafkaConsumer) Run(ctx context.Context) error {
	err := c.d.Run(ctx, c.cl)
	if c.kill.Killed() {
		// A killed process does not leave its group (its partitions move
		// after the session timeout): close without waiting to leave.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_ = c.cl.LeaveGroupContext(cctx)
	}
	c.cl.Close()
	return err
}

func (c *kafkaConsumer) observe(rec *kgo.Record, r kafkadedup.Result) {
	pos := kgo.EpochOffset{Epoch: rec.Partition, Offset: rec.Offset}
	redelivered := false
	if r.Attempt == 1 { // later attempts are retries in place, not deliveries
		c.b.mu.Lock()
		redelivered = c.b.delivered[pos]
		c.b.delivered[pos] = true
		c.b.mu.Unlock()
	}
	c.spec.Observe(Delivery{ID: r.ID, Outcome: r.Outcome, Ran: r.Ran, Redelivered: redelivered, Err: r.Err})
}

func (b *kafkaBroker) onCommit(recs []*kgo.Record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range recs {
		b.committed[r.Partition] = max(b.committed[r.Partition], r.Offset+1)
	}
}
