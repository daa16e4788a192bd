package demo

import (
	"context"
	"errors"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/internal/rabbitproc"
)

// smallConfig is a demo that exercises every path (producer retries, the
// replay, crashes, stalls) in a few seconds: short AckWait and lease, high
// crash and stall rates.
func smallConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Messages = 3000
	cfg.Consumers = 3
	cfg.Workers = 16
	cfg.CrashRate = 0.003
	cfg.StallRate = 0.005
	cfg.AckWait = time.Second
	cfg.Lease = 3 * time.Second
	cfg.Seed = 42
	cfg.Timeout = 3 * time.Minute
	cfg.Dir = t.TempDir()
	return cfg
}

func requireOK(t *testing.T, s Summary) {
	t.Helper()
	for _, c := range s.Checks {
		if !c.OK {
			t.Errorf("check %q failed: %s", c.Name, c.Detail)
		}
	}
	if !s.OK || len(s.Checks) != 3 {
		t.Fatalf("summary not ok: %+v", s)
	}
	if s.EffectsApplied != int64(s.UniqueIDs) || s.LedgerTotal != s.ExpectedTotal {
		t.Fatalf("effects %d for %d IDs, total %d of %d", s.EffectsApplied, s.UniqueIDs, s.LedgerTotal, s.ExpectedTotal)
	}
}

// Every unique event takes effect exactly once although JetStream delivers
// duplicates (producer retries, a replay) and redelivers after crashes and
// stalls.
func TestDemoEveryEventTakesEffectOnce(t *testing.T) {
	s, err := Run(context.Background(), smallConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	requireOK(t, s)
	if s.UniqueIDs != 3000 || s.Replayed != 150 || s.Published != 3000+s.ProducerRetries+150 || s.ProducerRetries == 0 {
		t.Fatalf("plan: %+v", s)
	}
	// Duplicates really reached the consumers and were suppressed; the
	// broker really redelivered.
	if s.DuplicatesSuppressed < int64(s.ProducerRetries+s.Replayed) || s.Redeliveries == 0 || s.Deliveries <= int64(s.Published) {
		t.Fatalf("duplicates %d (want >= %d), redeliveries %d, deliveries %d of %d published",
			s.DuplicatesSuppressed, s.ProducerRetries+s.Replayed, s.Redeliveries, s.Deliveries, s.Published)
	}
	if s.ConsumerCrashes == 0 || s.ConsumerStalls == 0 {
		t.Fatalf("no crash (%d) or no stall (%d) happened", s.ConsumerCrashes, s.ConsumerStalls)
	}
	t.Logf("%+v", s)
}

// The same with the leader killed abruptly and restarted again and again.
func TestDemoSurvivesLeaderKills(t *testing.T) {
	cfg := smallConfig(t)
	cfg.KillLeaderEvery = 700 * time.Millisecond
	// Every kill costs an election and the consumers' retries, and each
	// effect waits for the ledger's fsync: on a busy 2-core machine the
	// run needs more than smallConfig's bound.
	cfg.Timeout = 6 * time.Minute
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	requireOK(t, s)
	if s.LeaderKills == 0 {
		t.Fatal("no leader was killed")
	}
	t.Logf("%d leader kills, %+v", s.LeaderKills, s)
}

func TestDemoRefusesToKillNodesItDoesNotOwn(t *testing.T) {
	cfg := smallConfig(t)
	cfg.Addrs = []string{"127.0.0.1:1"}
	cfg.KillLeaderEvery = time.Second
	if _, err := Run(context.Background(), cfg); err == nil {
		t.Fatal("Run accepted --kill-leader-every with an external cluster")
	}
}

// The demo on Kafka (an in-process kfake cluster, consumers through
// kafkadedup): consumers crash (their connections cut, nothing more
// committed; the group moves their partitions after the session timeout)
// and the dedupnode leader is killed, and every event still takes effect
// exactly once.
func TestDemoOnKafka(t *testing.T) {
	cfg := smallConfig(t)
	cfg.Broker = "kafka"
	cfg.Messages = 600
	cfg.Consumers = 2
	cfg.Workers = 8
	cfg.CrashRate = 0.01
	cfg.Lease = 2 * time.Second
	cfg.KillLeaderEvery = 5 * time.Second
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	requireOK(t, s)
	if s.Broker != "kafka" || s.LeaderKills == 0 || s.ConsumerCrashes == 0 || s.Redeliveries == 0 ||
		s.DuplicatesSuppressed < int64(s.ProducerRetries+s.Replayed) {
		t.Fatalf("want a leader kill, a consumer crash, redeliveries and every republished event suppressed: %+v", s)
	}
	t.Logf("%+v", s)
}

func TestDemoUnknownBroker(t *testing.T) {
	cfg := smallConfig(t)
	cfg.Broker = "kafak"
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrUnknownBroker) {
		t.Fatalf("Run with broker %q: %v, want ErrUnknownBroker", cfg.Broker, err)
	}
}

// On RabbitMQ (a rabbitmq-server started for the run): consumer crashes
// drop TCP connections, stalls outlast consumer_timeout so the broker
// closes channels, and the leader is killed again and again; every event
// still takes effect once.
func TestDemoRabbitMQ(t *testing.T) {
	if _, err := rabbitproc.Find(); err != nil {
		if os.Getenv(rabbitproc.RequireEnv) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if testing.Short() {
		t.Skip("-short: not starting a RabbitMQ broker")
	}
	cfg := smallConfig(t)
	cfg.Broker = "rabbitmq"
	// consumer_timeout is AckWait, and closes the whole channel: give
	// handlers slowed by -race and elections room below it.
	cfg.AckWait = 2 * time.Second
	cfg.KillLeaderEvery = 3 * time.Second
	cfg.Messages = 1000
	cfg.CrashRate, cfg.StallRate = 0.005, 0.01
	s, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	requireOK(t, s)
	if s.Broker != "rabbitmq" || s.Redeliveries == 0 || s.ConsumerCrashes == 0 || s.ConsumerStalls == 0 || s.LeaderKills == 0 || s.DuplicatesSuppressed < int64(s.ProducerRetries+s.Replayed) {
		t.Fatalf("faults missing: %+v", s)
	}
	t.Logf("%+v", s)
}

// A seed fixes every draw of the fault plan: the nth run of an event draws
// the same number whichever order the runs come in, so a test with a fixed
// seed injects the same first-run crashes and stalls every time.
func TestFaultPlanDrawsAreFixedBySeedNotByOrder(t *testing.T) {
	events := []event{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	forward, backward := newFaultPlan(42, events), newFaultPlan(42, events)
	var fw, bw [][]float64
	for range 2 {
		var f, b []float64
		for i := range events {
			f = append(f, forward.roll(events[i].ID))
			b = append(b, backward.roll(events[len(events)-1-i].ID))
		}
		slices.Reverse(b)
		fw, bw = append(fw, f), append(bw, b)
	}
	if !reflect.DeepEqual(fw, bw) {
		t.Fatalf("draws depend on order: %v against %v", fw, bw)
	}
	if fw[0][0] == fw[1][0] {
		t.Fatalf("an event's second run drew its first run's number %v", fw[0][0])
	}
	if other := newFaultPlan(43, events).roll("a"); other == fw[0][0] {
		t.Fatalf("seeds 42 and 43 drew the same %v", other)
	}
	if d := forward.roll("not-planned"); d != 1 {
		t.Fatalf("an ID outside the plan drew %v, want 1 (no fault)", d)
	}
}

// A second run in the data dir of a first would find its nodes' Raft
// configuration naming the first run's ports and the first run's ledger:
// it is refused at once, before anything starts, and the data is left as
// it was.
func TestDemoRefusesADataDirOfAnEarlierRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs a demo")
	}
	cfg := smallConfig(t)
	cfg.Messages = 200
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadDir(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seed = 43
	if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrDirInUse) {
		t.Fatalf("second run in %s: %v, want ErrDirInUse", cfg.Dir, err)
	}
	after, err := os.ReadDir(cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("the refused run changed the data dir: %v, then %v", before, after)
	}
}
