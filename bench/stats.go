package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in microseconds, from 1 µs to 5 minutes, with 3
// significant digits.
const (
	histMinUs = 1
	histMaxUs = int64(5 * time.Minute / time.Microsecond)
	histSig   = 3
)

// Recorder gathers one worker's measurements. It is not safe for concurrent
// use; a run gives each worker its own and merges them at the end.
type Recorder struct {
	hist     *hdrhistogram.Histogram
	IDs      int64            // IDs whose call succeeded
	Calls    int64            // successful round trips (RPCs, pipelines, statements)
	Errors   int64            // failed calls
	Outcomes map[string]int64 // per-ID answers, e.g. NEW, DUPLICATE, SEEN
	ErrKinds map[string]int64 // failed calls by error kind
	// Unexpected counts per-ID answers that contradict the workload (a
	// DUPLICATE for a fresh ID in mark-new, SEEN in check-miss, ...).
	Unexpected int64
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{
		hist:     hdrhistogram.New(histMinUs, histMaxUs, histSig),
		Outcomes: map[string]int64{},
		ErrKinds: map[string]int64{},
	}
}

// Observe records one successful round trip that carried ids IDs.
func (r *Recorder) Observe(d time.Duration, ids int) {
	us := d.Microseconds()
	if us < histMinUs {
		us = histMinUs
	}
	if us > histMaxUs {
		us = histMaxUs
	}
	_ = r.hist.RecordValue(us) // in range by construction
	r.Calls++
	r.IDs += int64(ids)
}

// Fail records a failed call, by kind (e.g. a gRPC code or "timeout").
func (r *Recorder) Fail(kind string) {
	r.Errors++
	r.ErrKinds[kind]++
}

// Outcome counts n per-ID answers of one kind.
func (r *Recorder) Outcome(kind string, n int64) { r.Outcomes[kind] += n }

// Merge adds o's measurements into r.
func (r *Recorder) Merge(o *Recorder) {
	r.hist.Merge(o.hist)
	r.IDs += o.IDs
	r.Calls += o.Calls
	r.Errors += o.Errors
	r.Unexpected += o.Unexpected
	for k, v := range o.Outcomes {
		r.Outcomes[k] += v
	}
	for k, v := range o.ErrKinds {
		r.ErrKinds[k] += v
	}
}

// Reset forgets everything recorded (used at the end of a warm-up).
func (r *Recorder) Reset() {
	r.hist.Reset()
	r.IDs, r.Calls, r.Errors, r.Unexpected = 0, 0, 0, 0
	clear(r.Outcomes)
	clear(r.ErrKinds)
}

// Quantile returns the latency at quantile q (0..100) in milliseconds.
func (r *Recorder) Quantile(q float64) float64 {
	if r.hist.TotalCount() == 0 {
		return 0
	}
	return float64(r.hist.ValueAtQuantile(q)) / 1000
}

// Result is the outcome of one benchmark run, as printed and as JSON.
type Result struct {
	System      string  `json:"system,omitempty"`
	Workload    string  `json:"workload"`
	Variant     string  `json:"variant,omitempty"`
	Transport   string  `json:"transport,omitempty"`
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch"`
	IDSize      int     `json:"id_size"`
	Consistency string  `json:"consistency,omitempty"`
	TTLSec      float64 `json:"ttl_sec,omitempty"`
	DurationSec float64 `json:"duration_sec"`

	IDs         int64   `json:"ids"`
	Calls       int64   `json:"calls"`
	Errors      int64   `json:"errors"`
	IDsPerSec   float64 `json:"ids_per_sec"`
	CallsPerSec float64 `json:"calls_per_sec"`

	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`

	Outcomes   map[string]int64 `json:"outcomes,omitempty"`
	Unexpected int64            `json:"unexpected"`
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// Server CPU seconds spent during the measured window, summed over the
	// server processes (filled by harnesses that own the servers).
	ServerCPUSec float64 `json:"server_cpu_sec,omitempty"`
	CPUUsPerID   float64 `json:"server_cpu_us_per_id,omitempty"`
	ClientCPUSec float64 `json:"client_cpu_sec,omitempty"`
	// CPU seconds the rest of the machine used in the window (other
	// processes sharing the box): a measure of how noisy the figure is.
	OtherCPUSec float64 `json:"other_cpu_sec,omitempty"`
	// RPCs and RPCItems count, in coalesced mode (Config.Coalesce), the
	// RPCs the client's Batcher sent and the IDs they carried over the
	// whole run, warm-up included; 0 otherwise.
	RPCs          int64   `json:"rpcs,omitempty"`
	RPCItems      int64   `json:"rpc_items,omitempty"`
	Note          string  `json:"note,omitempty"`
	StartedAt     string  `json:"started_at,omitempty"`
	DuplicateRate float64 `json:"duplicate_ratio,omitempty"`
}

// Summarize fills a Result's counters and latencies from a merged recorder
// measured over elapsed.
func Summarize(res *Result, r *Recorder, elapsed time.Duration) {
	secs := elapsed.Seconds()
	res.DurationSec = round(secs, 3)
	res.IDs, res.Calls, res.Errors, res.Unexpected = r.IDs, r.Calls, r.Errors, r.Unexpected
	if secs > 0 {
		res.IDsPerSec = round(float64(r.IDs)/secs, 1)
		res.CallsPerSec = round(float64(r.Calls)/secs, 1)
	}
	if r.hist.TotalCount() > 0 {
		res.MeanMs = round(r.hist.Mean()/1000, 3)
		res.P50Ms = round(r.Quantile(50), 3)
		res.P90Ms = round(r.Quantile(90), 3)
		res.P99Ms = round(r.Quantile(99), 3)
		res.P999Ms = round(r.Quantile(99.9), 3)
		res.MaxMs = round(float64(r.hist.Max())/1000, 3)
	}
	if len(r.Outcomes) > 0 {
		res.Outcomes = map[string]int64{}
		for k, v := range r.Outcomes {
			res.Outcomes[k] = v
		}
	}
	if len(r.ErrKinds) > 0 {
		res.ErrorKinds = map[string]int64{}
		for k, v := range r.ErrKinds {
			res.ErrorKinds[k] = v
		}
	}
}

func round(v float64, digits int) float64 {
	p := 1.0
	for i := 0; i < digits; i++ {
		p *= 10
	}
	if v >= 0 {
		return float64(int64(v*p+0.5)) / p
	}
	return float64(int64(v*p-0.5)) / p
}

// WriteJSON writes res as one indented JSON object.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// WriteTable writes res as a human-readable table.
func (res *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	title := res.Workload
	if res.System != "" {
		title = res.System + " " + title
	}
	fmt.Fprintf(tw, "workload\t%s\n", title)
	fmt.Fprintf(tw, "setup\tconcurrency %d, batch %d, id size %d B", res.Concurrency, res.Batch, res.IDSize)
	if res.Consistency != "" {
		fmt.Fprintf(tw, ", %s", res.Consistency)
	}
	fmt.Fprintf(tw, "\n")
	fmt.Fprintf(tw, "measured\t%.2f s, %d IDs in %d calls, %d errors\n", res.DurationSec, res.IDs, res.Calls, res.Errors)
	fmt.Fprintf(tw, "throughput\t%s IDs/s\t%s calls/s\n", Human(res.IDsPerSec), Human(res.CallsPerSec))
	fmt.Fprintf(tw, "latency (ms)\tp50 %.3f\tp90 %.3f\tp99 %.3f\tp99.9 %.3f\tmax %.3f\n",
		res.P50Ms, res.P90Ms, res.P99Ms, res.P999Ms, res.MaxMs)
	if len(res.Outcomes) > 0 {
		fmt.Fprintf(tw, "answers\t%s\n", kv(res.Outcomes))
	}
	if res.Unexpected > 0 {
		fmt.Fprintf(tw, "unexpected\t%d answers contradict the workload\n", res.Unexpected)
	}
	if len(res.ErrorKinds) > 0 {
		fmt.Fprintf(tw, "errors\t%s\n", kv(res.ErrorKinds))
	}
	if res.CPUUsPerID > 0 {
		fmt.Fprintf(tw, "server CPU\t%.1f µs per ID\n", res.CPUUsPerID)
	}
	if res.Note != "" {
		fmt.Fprintf(tw, "note\t%s\n", res.Note)
	}
	return tw.Flush()
}

func kv(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Human formats a rate with a k/M suffix (e.g. 12.3k).
func Human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.2fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
