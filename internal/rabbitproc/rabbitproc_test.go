package rabbitproc_test

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupnode/dedupnode/internal/rabbitproc"
)

// A broker starts on its own ports, counts ready and unacknowledged
// messages, and is gone (with its port mapper) after Close.
func TestStartCountClose(t *testing.T) {
	if _, err := rabbitproc.Find(); err != nil {
		if os.Getenv(rabbitproc.RequireEnv) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if testing.Short() && os.Getenv(rabbitproc.RequireEnv) != "1" {
		t.Skip("-short: not starting a RabbitMQ broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := rabbitproc.Start(ctx, rabbitproc.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn, err := amqp.Dial(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := ch.PublishWithContext(ctx, "", "q", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := ch.Get("q", false); !ok || err != nil {
		t.Fatalf("get: %v %v", ok, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, unacked, err := s.QueueCounts(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if ready == 2 && unacked == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready %d unacked %d, want 2 and 1", ready, unacked)
		}
	}
	if _, _, err := s.QueueCounts(ctx, "nope"); err == nil {
		t.Fatal("counted a queue that does not exist")
	}
	pid := s.PID()
	conn.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("broker pid %d still there after Close: %v", pid, err)
	}
}
