package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dedupnode/dedupnode/client"
)

// A bounded check needs a max staleness of whole milliseconds; anything
// else is refused before a byte is sent (nothing listens at the address).
func TestBoundedCheckNeedsAWholeMillisecondMaxStaleness(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	ids := [][]byte{[]byte("x")}
	for _, tc := range []struct {
		name string
		opts []client.Option
		call func(c *client.Client) error
	}{
		{"Bounded without WithMaxStaleness", nil, func(c *client.Client) error {
			_, err := c.Check(ctx, "", ids, client.Bounded)
			return err
		}},
		{"WithMaxStaleness 1.5ms", []client.Option{client.WithMaxStaleness(1500 * time.Microsecond)}, func(c *client.Client) error {
			_, err := c.Check(ctx, "", ids, client.Bounded)
			return err
		}},
		{"CheckBounded 0", nil, func(c *client.Client) error {
			_, _, err := c.CheckBounded(ctx, "", ids, 0)
			return err
		}},
		{"CheckBounded -1s", nil, func(c *client.Client) error {
			_, _, err := c.CheckBounded(ctx, "", ids, -time.Second)
			return err
		}},
	} {
		c, err := client.New(ctx, []string{"127.0.0.1:1"}, append(tc.opts, client.WithRetry(1, 0, 0))...)
		if err != nil {
			t.Fatal(err)
		}
		err = tc.call(c)
		c.Close()
		var e *client.Error
		if !errors.As(err, &e) || !errors.Is(err, client.ErrInvalidArgument) || e.Field != "max_staleness" {
			t.Errorf("%s: %v, want ErrInvalidArgument on field max_staleness", tc.name, err)
		}
	}
	if c, err := client.ParseConsistency("bounded"); err != nil || c != client.Bounded || c.String() != "bounded" {
		t.Fatalf("ParseConsistency(bounded) = %v, %v", c, err)
	}
}
