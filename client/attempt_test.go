package client

import (
	"context"
	"testing"
	"time"
)

// The automatic attempt timeout leaves room for a retry within the
// caller's deadline: a third of the time left, within 2-5 s, and all of it
// when less than MinAttemptTimeout would be left for another attempt.
func TestAutoAttemptTimeout(t *testing.T) {
	for _, tc := range []struct{ left, want time.Duration }{
		{time.Second, 0},
		{3 * time.Second, 0},
		{4 * time.Second, 2 * time.Second},
		{5 * time.Second, 2 * time.Second},
		{8 * time.Second, 8 * time.Second / 3},
		{10 * time.Second, 10 * time.Second / 3},
		{15 * time.Second, 5 * time.Second},
		{time.Hour, 5 * time.Second},
	} {
		if got := autoAttemptTimeout(tc.left); got != tc.want {
			t.Errorf("autoAttemptTimeout(%v) = %v, want %v", tc.left, got, tc.want)
		}
	}
}

func TestAttemptTimeoutOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	near := func(got, want time.Duration) bool { return got <= want && got > want-time.Second }
	for _, tc := range []struct {
		name string
		opts []Option
		op   string
		ctx  context.Context
		want time.Duration
	}{
		{"default, deadline", nil, "mark", ctx, 10 * time.Second / 3},
		{"default, no deadline", nil, "mark", context.Background(), DefaultAttemptTimeout},
		{"default, unsafe to repeat", nil, "transfer leadership", ctx, unsafeAttemptTimeout},
		{"fixed", []Option{WithAttemptTimeout(7 * time.Second)}, "mark", ctx, 7 * time.Second},
		{"none", []Option{WithAttemptTimeout(-1)}, "mark", ctx, 0},
		{"WithTimeout(0): none", []Option{WithTimeout(0)}, "mark", ctx, 0},
		{"WithTimeout(d)", []Option{WithTimeout(time.Second)}, "mark", ctx, time.Second},
		{"auto again", []Option{WithTimeout(time.Second), WithAttemptTimeout(0)}, "mark", ctx, 10 * time.Second / 3},
	} {
		o := defaultOptions()
		for _, opt := range tc.opts {
			opt(&o)
		}
		c := &Client{opts: o}
		got := c.attemptTimeout(tc.ctx, tc.op)
		if got != tc.want && !(tc.want > 0 && near(got, tc.want)) {
			t.Errorf("%s: attempt timeout %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A batch's context carries the latest of its callers' deadlines, so that
// its attempts are sized as a caller's own call's; none when a caller has
// none.
func TestBatchContextDeadline(t *testing.T) {
	early, c1 := context.WithTimeout(context.Background(), time.Second)
	defer c1()
	late, c2 := context.WithTimeout(context.Background(), time.Minute)
	defer c2()
	want, _ := late.Deadline()
	ctx, done := batchContext([]*call{{ctx: early}, {ctx: late}})
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(want) {
		t.Errorf("batch deadline %v %v, want the latest caller's %v", dl, ok, want)
	}
	done()
	ctx, done = batchContext([]*call{{ctx: early}, {ctx: context.Background()}})
	if dl, ok := ctx.Deadline(); ok {
		t.Errorf("batch deadline %v with a caller without one, want none", dl)
	}
	done()
}
