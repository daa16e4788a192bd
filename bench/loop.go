package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tally collects the per-ID answers of one operation.
type Tally struct {
	m          map[string]int64
	unexpected int64
}

// Add counts n answers of one kind (e.g. "NEW").
func (t *Tally) Add(kind string, n int64) {
	if t.m == nil {
		t.m = map[string]int64{}
	}
	t.m[kind] += n
}

// Unexpected counts n answers that contradict the workload.
func (t *Tally) Unexpected(n int64) { t.unexpected += n }

func (t *Tally) reset() {
	clear(t.m)
	t.unexpected = 0
}

// Op performs one unit of load for n IDs (one call, one pipeline, one
// statement, or a short sequence such as claim+commit) and returns how many
// IDs it handled and how many round trips it made. It records per-ID answers
// into t. It must return promptly once ctx is done.
type Op func(ctx context.Context, n int, t *Tally) (ids, calls int, err error)

// Spec bounds and shapes a load loop. Exactly one of Duration and Count is
// used; with neither, Duration defaults to 10 s. Whatever is set, the loop
// never runs longer than MaxTime.
type Spec struct {
	Label       string
	Concurrency int           // workers; default 50
	Batch       int           // IDs per op; default 16
	Duration    time.Duration // measured time
	Count       int64         // IDs to measure (instead of Duration)
	Warmup      time.Duration // load before measuring, not recorded
	MaxTime     time.Duration // hard limit for the whole loop; default Warmup+Duration+30s, or 10 min with Count
	// MaxErrors stops the loop early after this many failed ops in total;
	// 0 means 1000 plus one per ten successful ops (see errorLimit).
	MaxErrors int64
	Progress  io.Writer // progress bar destination (stderr); nil for none
	// OnMeasure is called when the measured window opens (true) and closes
	// (false); harnesses sample server CPU there.
	OnMeasure func(start bool)
	// ErrKind classifies an error; default: gRPC code name, "timeout", or "error".
	ErrKind func(error) string
}

func (s *Spec) defaults() {
	if s.Concurrency <= 0 {
		s.Concurrency = 50
	}
	if s.Batch <= 0 {
		s.Batch = 16
	}
	if s.Count <= 0 && s.Duration <= 0 {
		s.Duration = 10 * time.Second
	}
	if s.MaxTime <= 0 {
		if s.Count > 0 {
			s.MaxTime = s.Warmup + 10*time.Minute
		} else {
			s.MaxTime = s.Warmup + s.Duration + 30*time.Second
		}
	}
	if s.ErrKind == nil {
		s.ErrKind = ErrKind
	}
}

// ErrKind names an error for the error table: a gRPC status code, "timeout"
// or "canceled" for context errors, else "error".
func ErrKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return st.Code().String()
	}
	return "error"
}

// LoopResult is what a load loop measured.
type LoopResult struct {
	Rec        *Recorder
	Elapsed    time.Duration // measured window
	FirstError string        // text of the first failure, if any
	Stopped    string        // why the loop ended early ("" when it ran its course)
}

// RunLoop runs newOp(i) in Concurrency workers until the spec's bound and
// returns the merged measurements of the measured window. Ops that complete
// inside the window count; the rest (warm-up, in flight at the end) do not.
func RunLoop(ctx context.Context, spec Spec, newOp func(worker int) (Op, error)) (*LoopResult, error) {
	spec.defaults()
	ops := make([]Op, spec.Concurrency)
	for i := range ops {
		op, err := newOp(i)
		if err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		ops[i] = op
	}

	ctx, cancel := context.WithTimeout(ctx, spec.MaxTime)
	defer cancel()
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()

	var (
		startNs  atomic.Int64 // window start, unix ns; 0 before
		endNs    atomic.Int64 // window end; 0 while open
		lastDone atomic.Int64 // latest op completion inside the window (count mode)
		issued   atomic.Int64 // IDs handed out inside the window (count mode)
		measured atomic.Int64 // IDs completed inside the window (progress)
		failed   atomic.Int64 // failed ops, all phases (error limit)
		okOps    atomic.Int64
		firstErr atomic.Pointer[string]
		stopWhy  atomic.Pointer[string]
	)
	countMode := spec.Count > 0
	var start time.Time
	openWindow := func() {
		start = time.Now()
		startNs.Store(start.UnixNano())
		if spec.OnMeasure != nil {
			spec.OnMeasure(true)
		}
	}
	if spec.Warmup <= 0 {
		openWindow() // before the workers start, so every op counts
	}
	recs := make([]*Recorder, spec.Concurrency)
	var wg sync.WaitGroup
	for w := 0; w < spec.Concurrency; w++ {
		recs[w] = NewRecorder()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rec := recs[w]
			var tally Tally
			backoff := time.Duration(0)
			for workCtx.Err() == nil {
				n := spec.Batch
				inWindow := startNs.Load() != 0
				if countMode && inWindow {
					after := issued.Add(int64(n))
					before := after - int64(n)
					if before >= spec.Count {
						return
					}
					if after > spec.Count {
						n = int(spec.Count - before)
					}
				}
				tally.reset()
				t0 := time.Now()
				ids, calls, err := ops[w](workCtx, n, &tally)
				t1 := time.Now()
				s, e := startNs.Load(), endNs.Load()
				counted := s != 0 && t1.UnixNano() >= s && (e == 0 || t1.UnixNano() <= e)
				if countMode {
					// every op that took a ticket counts, however late
					counted = inWindow
				}
				if err != nil {
					if workCtx.Err() != nil {
						return // stopped mid-call: not a failure of the system
					}
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					nf := failed.Add(1)
					if counted {
						rec.Fail(spec.ErrKind(err))
					}
					if limit := errorLimit(spec.MaxErrors, okOps.Load()); nf > limit {
						why := fmt.Sprintf("stopped after %d errors", nf)
						stopWhy.CompareAndSwap(nil, &why)
						stopWork()
						return
					}
					// back off a little so a down server is not spun on
					backoff = min(max(2*backoff, time.Millisecond), 100*time.Millisecond)
					select {
					case <-workCtx.Done():
					case <-time.After(backoff):
					}
					continue
				}
				backoff = 0
				okOps.Add(1)
				if !counted {
					continue
				}
				d := t1.Sub(t0)
				rec.hist.RecordValue(clampUs(d))
				rec.Calls += int64(calls)
				rec.IDs += int64(ids)
				rec.Unexpected += tally.unexpected
				for k, v := range tally.m {
					rec.Outcomes[k] += v
				}
				measured.Add(int64(ids))
				if countMode {
					for {
						prev := lastDone.Load()
						if t1.UnixNano() <= prev || lastDone.CompareAndSwap(prev, t1.UnixNano()) {
							break
						}
					}
				}
			}
		}(w)
	}

	// Progress bar, updated by a ticker: workers only bump counters.
	var bar *progressbar.ProgressBar
	total := time.Duration(0)
	if spec.Progress != nil {
		max := spec.Count
		if !countMode {
			total = spec.Warmup + spec.Duration
			max = int64(total / (100 * time.Millisecond))
		}
		bar = progressbar.NewOptions64(max,
			progressbar.OptionSetWriter(spec.Progress),
			progressbar.OptionSetDescription(spec.Label),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetPredictTime(countMode),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetRenderBlankState(true),
		)
	}
	loopStart := time.Now()
	updateBar := func() {
		if bar == nil {
			return
		}
		rate := 0.0
		if s := startNs.Load(); s != 0 {
			if el := time.Since(time.Unix(0, s)).Seconds(); el > 0 {
				rate = float64(measured.Load()) / el
			}
		}
		phase := "warm-up"
		if startNs.Load() != 0 {
			phase = Human(rate) + " IDs/s"
		}
		bar.Describe(fmt.Sprintf("%s %s", spec.Label, phase))
		if countMode {
			_ = bar.Set64(measured.Load())
		} else {
			_ = bar.Set64(int64(time.Since(loopStart) / (100 * time.Millisecond)))
		}
	}

	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()

	wait := func(d time.Duration) bool { // false if the loop ended first
		tm := time.NewTimer(d)
		defer tm.Stop()
		for {
			select {
			case <-tm.C:
				return true
			case <-allDone:
				return false
			case <-ctx.Done():
				return false
			case <-tick.C:
				updateBar()
			}
		}
	}

	early := false
	if spec.Warmup > 0 {
		early = !wait(spec.Warmup)
		openWindow()
	}
	var end time.Time
	if countMode {
		// ends when every ticket is done, or at MaxTime
		if !early {
			wait(spec.MaxTime)
		}
		if ctx.Err() != nil && ctx.Err() != context.Canceled {
			why := "hit the time limit before the count"
			stopWhy.CompareAndSwap(nil, &why)
		}
		stopWork()
		<-allDone
		end = time.Unix(0, lastDone.Load())
		if lastDone.Load() == 0 {
			end = time.Now()
		}
	} else {
		if !early {
			wait(spec.Duration)
		}
		end = time.Now()
		endNs.Store(end.UnixNano())
		stopWork()
		<-allDone
	}
	if spec.OnMeasure != nil {
		spec.OnMeasure(false)
	}
	if bar != nil {
		updateBar()
		_ = bar.Finish()
		fmt.Fprintln(spec.Progress)
	}

	merged := NewRecorder()
	for _, r := range recs {
		merged.Merge(r)
	}
	out := &LoopResult{Rec: merged, Elapsed: end.Sub(start)}
	if p := firstErr.Load(); p != nil {
		out.FirstError = *p
	}
	if p := stopWhy.Load(); p != nil {
		out.Stopped = *p
	}
	if out.Stopped == "" && ctx.Err() == context.Canceled {
		out.Stopped = "interrupted"
	}
	if out.Elapsed <= 0 {
		out.Elapsed = time.Nanosecond
	}
	return out, nil
}

// errorLimit is the number of failed ops after which a loop gives up: the
// configured limit, or 1000 plus one in ten successful ops.
func errorLimit(configured, ok int64) int64 {
	if configured > 0 {
		return configured
	}
	return 1000 + ok/10
}

func clampUs(d time.Duration) int64 {
	us := d.Microseconds()
	if us < histMinUs {
		return histMinUs
	}
	if us > histMaxUs {
		return histMaxUs
	}
	return us
}
