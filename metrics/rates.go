package metrics

import (
	"context"
	"sort"
	"time"
)

// RateWindow is the span request rates are averaged over.
const RateWindow = time.Minute

// sampleEvery is the minimum spacing of rate samples.
const sampleEvery = time.Second

type sample struct {
	at  time.Time
	ops map[string]opTally
}

// OpRate is one operation's recent request rate.
type OpRate struct {
	Op string
	// PerSecond and ErrorsPerSecond average over Window (0 until two
	// samples at least a second apart exist).
	PerSecond, ErrorsPerSecond float64
	// Total requests since the node started.
	Total uint64
	// Window is the span actually averaged over.
	Window time.Duration
}

// Sample records the current totals for rate computation. Run calls it
// periodically; RequestRates calls it too.
func (m *Metrics) Sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sampleLocked()
}

func (m *Metrics) sampleLocked() {
	now := m.now()
	if n := len(m.rates); n > 0 && now.Sub(m.rates[n-1].at) < sampleEvery {
		return
	}
	cur := make(map[string]opTally, len(m.ops))
	for k, v := range m.ops {
		cur[k] = *v
	}
	m.rates = append(m.rates, sample{at: now, ops: cur})
	// Keep one sample older than the window, drop the rest.
	cut := 0
	for i := range m.rates {
		if now.Sub(m.rates[i].at) > RateWindow {
			cut = i
		}
	}
	m.rates = m.rates[cut:]
}

// RequestRates returns per-operation request rates over about RateWindow,
// sorted by operation.
func (m *Metrics) RequestRates() []OpRate {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.sampleLocked()
	// The oldest sample within the window (samples are in time order).
	base := m.rates[len(m.rates)-1]
	for _, s := range m.rates {
		if now.Sub(s.at) <= RateWindow {
			base = s
			break
		}
	}
	span := now.Sub(base.at)
	out := make([]OpRate, 0, len(m.ops))
	for op, t := range m.ops {
		r := OpRate{Op: op, Total: t.total, Window: span}
		if span >= sampleEvery {
			b := base.ops[op]
			r.PerSecond = float64(t.total-b.total) / span.Seconds()
			r.ErrorsPerSecond = float64(t.errors-b.errors) / span.Seconds()
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Op < out[j].Op })
	return out
}

// Run samples totals every few seconds until ctx ends, so RequestRates is
// meaningful at any time.
func (m *Metrics) Run(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		m.Sample()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
