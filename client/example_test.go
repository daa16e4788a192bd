package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/dedupnode/dedupnode/client"
	"github.com/dedupnode/dedupnode/internal/devcluster"
)

// startNode starts a real one-node dedupnode cluster in this process
// (internal/devcluster, what `dedupnode dev --nodes 1` runs), with
// namespaces created on first use, and returns its gRPC address and a
// function that stops it.
func startNode() (addr string, stop func()) {
	dir, err := os.MkdirTemp("", "dedupnode-example-")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := devcluster.Start(ctx, devcluster.Config{Nodes: 1, Dir: dir, AutoCreateNamespaces: true})
	if err != nil {
		log.Fatal(err)
	}
	return c.Addrs()[0], func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.Close(ctx)
		os.RemoveAll(dir)
	}
}

// A consumer asks, per message ID, "did I already handle this?".
func Example() {
	addr, stop := startNode()
	defer stop()
	ctx := context.Background()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for range 2 { // the broker delivers the message twice
		res, err := c.Mark(ctx, "orders", []client.Item{{ID: []byte("order-456-created")}}, 24*time.Hour)
		if err != nil {
			log.Fatal(err) // retries ran out: redeliver later
		}
		if res[0].Code == client.CodeDuplicate {
			fmt.Println("order-456-created: already handled, skip")
			continue
		}
		fmt.Println("order-456-created: new, handle it")
	}
	// Output:
	// order-456-created: new, handle it
	// order-456-created: already handled, skip
}

// Process claims the ID, runs the side effect, and commits on success or
// releases on error, so a failed attempt does not make the redelivery look
// like a duplicate.
func ExampleClient_Process() {
	addr, stop := startNode()
	defer stop()
	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	charge := func(attempt int) func(context.Context) error {
		return func(ctx context.Context) error {
			if attempt == 1 {
				return errors.New("card processor timed out")
			}
			// ctx is cancelled if the lease is lost; check before the
			// effect becomes visible.
			if err := ctx.Err(); err != nil {
				return err
			}
			fmt.Printf("attempt %d: card charged\n", attempt)
			return nil
		}
	}
	for attempt := 1; attempt <= 3; attempt++ { // three deliveries of one message
		res, err := c.Process(ctx, "payments", []byte("payment-9001"), charge(attempt))
		fmt.Printf("attempt %d: %s (ran: %v)", attempt, res.Outcome, res.Ran)
		if err != nil {
			fmt.Printf(", error: %v", err)
		}
		fmt.Println()
	}
	// Output:
	// attempt 1: failed (ran: true), error: card processor timed out
	// attempt 2: card charged
	// attempt 2: processed (ran: true)
	// attempt 3: duplicate (ran: false)
}

// A Batcher turns concurrent single-ID calls from many goroutines into a
// few batched RPCs; each caller still gets its own answer.
func ExampleBatcher() {
	addr, stop := startNode()
	defer stop()
	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	b := c.NewBatcher(client.WithLinger(time.Hour), client.WithMaxBatch(100)) // leave when full
	defer b.Close()

	// 100 deliveries from 100 goroutines: 50 distinct events, each twice.
	var mu sync.Mutex
	counts := map[client.Code]int{}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Appendf(nil, "event-%d", i%50)
			res, err := b.Mark(ctx, "events", client.Item{ID: id}, time.Hour)
			if err != nil {
				log.Print(err)
				return
			}
			mu.Lock()
			counts[res.Code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	var lines []string
	for code, n := range counts {
		lines = append(lines, fmt.Sprintf("%s: %d", code, n))
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	st := b.Stats()
	fmt.Printf("%d calls in %d RPC\n", st.Calls, st.RPCs)
	// Output:
	// duplicate: 50
	// new: 50
	// 100 calls in 1 RPC
}

// Producers without IDs of their own can derive one from the body, as SQS
// FIFO's content-based deduplication does.
func ExampleContentID() {
	fmt.Printf("%s\n", client.ContentID([]byte(`{"order":456,"event":"created"}`)))
	// Output:
	// 02587500f6dce7ecb1d80cfcf4ba6ae8f57ef3d3fe71120dc49eac4ae2162f73
}

// A digest of the body travels with the ID: an ID reused for different
// content answers conflict instead of a silent duplicate.
func ExampleDigest() {
	addr, stop := startNode()
	defer stop()
	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for _, body := range []string{`{"amount":10}`, `{"amount":10}`, `{"amount":99}`} {
		res, err := c.Mark(ctx, "transfers", []client.Item{{ID: []byte("transfer-1"), Digest: client.Digest([]byte(body))}}, 0)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(body, res[0].Code)
	}
	// Output:
	// {"amount":10} new
	// {"amount":10} duplicate
	// {"amount":99} conflict
}
